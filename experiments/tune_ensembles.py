"""Does a study's top-K ensemble generalise better than its best trial? MQ2008's folds (or other data).

For each fold: ``rankkit tune`` of the config with its packaged search space (N trials, seed 0, on
the fold's train and vali splits, ``--top_k K``), then ``rankkit compare`` on the fold's test split
of three rows: the shipped config, the study's ``best.yaml`` and its ``ensemble.yaml`` (the K best
trials, their scores averaged by ``MeanEnsemble``). Test NDCG@10 (exp gain 2^rel − 1, discount
1/log2(1 + rank), a query with nothing relevant scoring 1), per fold and the mean.

    python experiments/tune_ensembles.py --config lambdamart --trials 20 --top_k 3 --write
"""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import command_line, write_section  # noqa: E402

from rankkit.compare.protocol import compare
from rankkit.tune import tune


def one_fold(config: str, fold: int, *, trials: int, top_k: int, seeds: int, workdir: Path, data: str = "mq2008",
             val_fraction: float = 0.0) -> dict:
    """The study of one fold and the three rows' test NDCG@10 (mean over ``seeds``)."""
    t0 = time.perf_counter()
    overrides = {"data.data": data, "data.fold": fold, "data.val_fraction": val_fraction, "data.val_seed": 0}
    study = tune(config, n_trials=trials, top_k=top_k, seed=0, out=workdir / f"tune-fold{fold}",
                 overrides=overrides, folds=None, trial_seeds=1, confirm=0, margin=0.0,  # the study measured here
                 log=lambda line: None)
    tuned = time.perf_counter() - t0
    result = compare(data=data, folds=str(fold), seeds=seeds, out=str(workdir / f"compare-fold{fold}"),
                     val_fraction=val_fraction, log=lambda line: None,
                     models=[config, str(study.best_config), str(study.ensemble_config)])
    rows: dict[str, list[float]] = {}
    for r in result["runs"]:
        rows.setdefault(r["model"], []).append(r["ndcg@10"])
    shipped, best, ensemble = list(rows)
    return {"fold": fold, "vali": study.best_value, "tune_s": tuned,
            "shipped": statistics.mean(rows[shipped]), "best": statistics.mean(rows[best]),
            "ensemble": statistics.mean(rows[ensemble]), "labels": (shipped, best, ensemble)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="lambdamart")
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--top_k", type=int, default=3)
    ap.add_argument("--seeds", type=int, default=1, help="seeds per compare row (trees: the same model each seed)")
    ap.add_argument("--folds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    ap.add_argument("--data", default="mq2008", help="mq2008 (bundled), or a LETOR folder or root as compare takes")
    ap.add_argument("--val_fraction", type=float, default=0.0,
                    help="data without a vali file: this fraction of the training queries (seed 0) is vali")
    ap.add_argument("--write", action="store_true", help="replace this config's section of docs/benchmarks.md")
    args = ap.parse_args(argv)
    if args.top_k < 2:
        ap.error("--top_k has to be at least 2 (an ensemble of the best trials)")
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for fold in args.folds:
            rows.append(one_fold(args.config, fold, trials=args.trials, top_k=args.top_k, seeds=args.seeds,
                                 workdir=Path(workdir), data=args.data, val_fraction=args.val_fraction))
            print(rows[-1], flush=True)
    lines = [f"Measured {datetime.date.today()}, 1 torch thread, command: `{command_line(__file__, argv)}`.", "",
             f"| row | test NDCG@10 per fold ({' '.join(str(f) for f in args.folds)}) | mean |", "|---|---|---:|"]
    names = {"shipped": f"shipped `{args.config}`", "best": "the study's best trial (`best.yaml`)",
             "ensemble": f"its {args.top_k} best trials averaged (`ensemble.yaml`)"}
    for key, name in names.items():
        values = [r[key] for r in rows]
        lines.append(f"| {name} | {' '.join(f'{v:.4f}' for v in values)} | {statistics.mean(values):.4f} |")
    vali = [r["vali"] for r in rows]
    lines.append(f"| (the best trial's vali NDCG@10) | {' '.join(f'{v:.4f}' for v in vali)} | "
                 f"{statistics.mean(vali):.4f} |")
    body = "\n".join(lines)
    print(body)
    if args.write:
        data = "" if args.data == "mq2008" else "_" + Path(args.data).name.replace("-", "_")
        write_section(f"tune_ensembles_{args.config}{data}", body)


if __name__ == "__main__":
    main()
