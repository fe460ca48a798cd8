"""RankNet and LambdaRank on MQ2008: 5 folds x N seeds, model selection on vali NDCG@10.

Protocol (the same as the LightGBM/CatBoost anchors in docs/benchmarks.md): train on the
fold's train set, keep the epoch with the best vali NDCG@10 (EarlyStopping + ModelCheckpoint),
report test NDCG@k with exp gain (2^rel - 1) and empty queries (ideal DCG = 0) scored 1.

    python experiments/mq2008_neural.py --folds 1-5 --seeds 3 --write

``--write`` replaces the ``mq2008_neural`` section of docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings

import pytorch_lightning as pl
import torch
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import command_line, write_section  # noqa: E402

from rankkit.compare import early_stopping_of
from rankkit.data.bundled import load_mq2008
from rankkit.training.datamodule import RankingDataModule
from rankkit.metrics import average_precision, ndcg
from rankkit.neural import LambdaRank, RankNet

CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs")


def _config(name: str) -> dict:
    with open(os.path.join(CONFIGS, f"{name}.yaml")) as f:
        return yaml.safe_load(f)


def _model_args(name: str) -> dict:
    return {k: v for k, v in _config(name)["model"]["init_args"].items() if k != "n_features"}


# The tuned settings (chosen on vali NDCG@10 of folds 1-2 only) live in configs/<model>.yaml,
# shared with `rankkit fit` and `rankkit compare`.
SETTINGS = {
    "RankNet": dict(cls=RankNet, kwargs=_model_args("ranknet"), max_docs=_config("ranknet")["data"]["max_docs"]),
    "LambdaRank": dict(cls=LambdaRank, kwargs=_model_args("lambdarank"),
                       max_docs=_config("lambdarank")["data"]["max_docs"]),
}
# --tune: each model's grid around its configs/ settings (seed 0, every fold, vali NDCG@10 only).
GRID = {
    "RankNet": dict(max_docs=[512, 2048], lr=[1e-3, 3e-4], hidden=[[64, 32], [128, 64]]),
    "LambdaRank": dict(max_docs=[512, 2048], lr=[1e-3, 3e-4], hidden=[[64, 32], [128, 64]], k=[None, 10]),
}
MAX_EPOCHS, PATIENCE = early_stopping_of(_config("ranknet"))


def parse_range(text: str) -> list[int]:
    if "-" in text:
        a, b = text.split("-")
        return list(range(int(a), int(b) + 1))
    return [int(x) for x in text.split(",")]


def run_one(name: str, fold: int, seed: int, workdir: str, max_epochs: int = MAX_EPOCHS,
            overrides: dict | None = None, data: tuple | None = None) -> dict:
    """Train ``name`` (its configs/ settings, updated by ``overrides``) on one fold and seed
    (``data``: another ``(train, vali, test)`` than MQ2008's fold)."""
    train, vali, test = data if data is not None else load_mq2008(fold)
    pl.seed_everything(seed, verbose=False)
    spec = SETTINGS[name]
    kwargs = {**spec["kwargs"], **(overrides or {})}
    max_docs = kwargs.pop("max_docs", spec["max_docs"])
    patience = kwargs.pop("patience", PATIENCE)
    model = spec["cls"](n_features=train.n_features, **kwargs)
    dm = RankingDataModule.from_datasets(train, vali, test, max_docs=max_docs, seed=seed)
    ckpt = pl.callbacks.ModelCheckpoint(monitor="val/ndcg@10", mode="max", dirpath=workdir,
                                        filename=f"{name}-f{fold}-s{seed}")
    stop = pl.callbacks.EarlyStopping(monitor="val/ndcg@10", mode="max", patience=patience)
    trainer = pl.Trainer(max_epochs=max_epochs, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[ckpt, stop], default_root_dir=workdir)
    t0 = time.perf_counter()
    trainer.fit(model, datamodule=dm)
    wall = time.perf_counter() - t0
    best = spec["cls"].load_from_checkpoint(ckpt.best_model_path).eval()
    batch = test.padded()
    with torch.no_grad():
        s = best(batch.features)
    out = {"model": name, "fold": fold, "seed": seed, "epochs": trainer.current_epoch,
           "best_val_ndcg@10": float(ckpt.best_model_score), "train_seconds": wall}
    for k in (1, 3, 5, 10):
        out[f"ndcg@{k}"] = float(ndcg(s, batch.labels, mask=batch.mask, k=k).mean())
    out["map"] = float(average_precision(s, batch.labels, mask=batch.mask).mean())
    os.unlink(ckpt.best_model_path)
    return out


def mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


def table(rows: list[dict], folds: list[int]) -> str:
    models = list(dict.fromkeys(r["model"] for r in rows))
    lines = ["| model | " + " | ".join(f"fold {f}" for f in folds) + " | mean of folds | NDCG@1 | NDCG@3 | "
             "MAP | s/fold (train) |",
             "|---|" + "---|" * (len(folds) + 5)]
    for m in models:
        mine = [r for r in rows if r["model"] == m]
        per_fold = []
        cells = []
        for f in folds:
            v = [r["ndcg@10"] for r in mine if r["fold"] == f]
            per_fold.append(statistics.mean(v))
            cells.append(mean_std(v))
        lines.append(f"| {m} | " + " | ".join(cells) + f" | **{statistics.mean(per_fold):.4f}** | "
                     f"{statistics.mean(r['ndcg@1'] for r in mine):.4f} | "
                     f"{statistics.mean(r['ndcg@3'] for r in mine):.4f} | "
                     f"{statistics.mean(r['map'] for r in mine):.4f} | "
                     f"{statistics.mean(r['train_seconds'] for r in mine):.1f} |")
    return "\n".join(lines)


def literature_check(rows: list[dict], folds: list[int]) -> str:
    out = []
    for k in (1, 3):
        wins = 0
        for f in folds:
            lr = statistics.mean(r[f"ndcg@{k}"] for r in rows if r["model"] == "LambdaRank" and r["fold"] == f)
            rn = statistics.mean(r[f"ndcg@{k}"] for r in rows if r["model"] == "RankNet" and r["fold"] == f)
            wins += lr > rn
        out.append(f"LambdaRank beats RankNet on test NDCG@{k} in {wins} of {len(folds)} folds")
    return "; ".join(out) + "."


def tune(args, folds: list[int], argv) -> int:
    """Every grid point on every fold with seeds 0..tune_seeds-1; the best mean vali NDCG@10 wins."""
    import itertools

    lines, dump = [], []
    with tempfile.TemporaryDirectory() as work:
        for name in args.models.split(","):
            grid = json.loads(args.grid) if args.grid else GRID[name]
            results = []
            for values in itertools.product(*grid.values()):
                point = {**args.overrides, **dict(zip(grid, values))}
                runs = [run_one(name, fold, seed, work, args.max_epochs, point)
                        for fold in folds for seed in range(args.tune_seeds)]
                vali = statistics.mean(r["best_val_ndcg@10"] for r in runs)
                test = statistics.mean(r["ndcg@10"] for r in runs)  # printed, never used to select
                results.append((vali, test, point))
                dump.append({"model": name, "setting": point, "runs": runs})
                per_fold = " ".join(
                    f"{statistics.mean(r['best_val_ndcg@10'] for r in runs if r['fold'] == f):.4f}/"
                    f"{statistics.mean(r['ndcg@10'] for r in runs if r['fold'] == f):.4f}" for f in folds)
                print(f"{name} {point}: vali {vali:.4f} test {test:.4f} (per fold vali/test {per_fold})",
                      flush=True)
                if args.json:
                    with open(args.json, "w") as f:
                        json.dump(dump, f, indent=1)
            results.sort(key=lambda t: -t[0])
            lines.append(f"**{name}** (grid {grid}):\n\n| rank | setting | mean vali NDCG@10 | mean test NDCG@10 |\n"
                         "|---:|---|---:|---:|")
            lines += [f"| {i + 1} | `{p}` | {v:.4f} | {t:.4f} |" for i, (v, t, p) in enumerate(results)]
            lines.append("")
    md = "\n".join(lines)
    print(md)
    if args.write:
        cmd = command_line(__file__, argv)
        body = (f"## MQ2008: neural model selection\n\n{datetime.date.today()}, CPU "
                f"({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads). "
                f"Command: `{cmd}`\n\nSeeds 0-{args.tune_seeds - 1}, folds {folds}, each setting ranked by its "
                f"mean **vali** "
                f"NDCG@10 (the test column is shown, not used). Settings not in the grid are those of "
                f"configs/<model>.yaml; the winners are the configs' defaults.\n\n{md}\n")
        write_section("mq2008_neural_tune", body)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--folds", default="1-5")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--models", default="RankNet,LambdaRank")
    p.add_argument("--max-epochs", type=int, default=MAX_EPOCHS)
    p.add_argument("--write", action="store_true", help="write the table to docs/benchmarks.md")
    p.add_argument("--json", default=None, help="also dump every run as JSON here")
    p.add_argument("--tune", action="store_true",
                   help="grid-search each model on mean vali NDCG@10 (seed 0); test is only reported")
    p.add_argument("--grid", default=None,
                   help='with --tune: a JSON grid instead of GRID, e.g. \'{"lr": [1e-3, 3e-4]}\'')
    p.add_argument("--tune-seeds", type=int, default=1, help="with --tune: seeds per grid point")
    p.add_argument("--set", default=None,
                   help='a JSON dict of overrides of the configs/ settings (also "max_docs", "patience")')
    p.add_argument("--threads", type=int, default=max(1, os.cpu_count() or 1), help="torch threads")
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    args.overrides = json.loads(args.set) if args.set else {}
    folds = parse_range(args.folds)
    if args.tune:
        return tune(args, folds, argv)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for fold in folds:
            for name in args.models.split(","):
                for seed in range(args.seeds):
                    r = run_one(name, fold, seed, work, args.max_epochs, args.overrides)
                    rows.append(r)
                    print(json.dumps(r), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    md = table(rows, folds)
    check = literature_check(rows, folds) if {"RankNet", "LambdaRank"} <= {r["model"] for r in rows} else ""
    print(md)
    print(check)
    if args.write:
        cmd = command_line(__file__, argv)
        body = (f"## MQ2008: RankNet and LambdaRank\n\n"
                f"{datetime.date.today()}, CPU ({platform.processor() or platform.machine()}, "
                f"{torch.get_num_threads()} threads), torch {torch.__version__}. Command: `{cmd}`\n\n"
                f"Test NDCG@10 (exp gain, empty = 1), mean ± std over {args.seeds} seeds per fold; model "
                f"selection on vali NDCG@10 (max {args.max_epochs} epochs, patience {PATIENCE}). "
                f"NDCG@1/3 and MAP are means over folds and seeds; s/fold is the training wall time of one "
                f"run.\n\n{md}\n\n{check}\n")
        write_section("mq2008_neural", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
