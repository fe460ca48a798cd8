"""Which training-recipe options does a study pick, on more than one data set?

    python experiments/tune_recipe.py --write        # MQ2008 Fold1 and the Yahoo sample, 30 trials each

For each data set, two Optuna studies of the LambdaRank MLP (`rankkit tune`, seed 0, the same
trial budget): one over the shipped search space (rankkit/configs/lambdarank.space.yaml) and one
over that space plus the recipe options (the lr schedule with warm-up, gradient clipping, weight
averaging). Reported: the untuned config's vali NDCG@10 (trial 0), each study's best, what the
recipe study chose and the fANOVA importance of each recipe option. Vali only: no test split is
read. The Yahoo sample (../shared/data/lightgbm-lambdarank, no vali file) holds out 20 % of its
train queries (seed 0) as vali, as experiments/neural_parity.py does.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import command_line, write_section  # noqa: E402

from rankkit.tune import _importance, load_space, space_path, tune  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
YAHOO = ROOT.parent / "shared" / "data" / "lightgbm-lambdarank"
RECIPE = {
    "model.init_args.scheduler": {"choices": ["none", "cosine", "warmup_cosine"]},
    "trainer.gradient_clip_val": {"choices": [None, 1.0, 10.0]},
    "model.init_args.ema_decay": {"choices": [0.0, 0.9, 0.99]},
}
DATA = {"mq2008": {"data.data": "mq2008", "data.fold": 1},
        "yahoo": {"data.data": str(YAHOO), "data.val_fraction": 0.2, "data.val_seed": 0}}


def recipe_space(out: Path) -> Path:
    shipped = yaml.safe_load(space_path(ROOT / "rankkit" / "configs" / "lambdarank.yaml").read_text())
    path = out / "lambdarank.recipe.space.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({**shipped, **RECIPE}, sort_keys=False, default_flow_style=None))
    load_space(path)  # checked
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=30)
    p.add_argument("--data", default="mq2008,yahoo")
    p.add_argument("--out", default="results/tune_recipe")
    p.add_argument("--write", action="store_true", help="write the docs/benchmarks.md section")
    args = p.parse_args(argv)
    out = Path(args.out)
    spaces = {"shipped": None, "shipped + recipe": recipe_space(out)}
    rows = []
    for name in args.data.split(","):
        if name == "yahoo" and not YAHOO.is_dir():
            print(f"skipping yahoo: {YAHOO} is absent")
            continue
        for label, space in spaces.items():
            t0 = time.perf_counter()
            r = tune("lambdarank", space=space, n_trials=args.trials, seed=0, overrides=DATA[name],
                     folds=None, trial_seeds=1, confirm=0, margin=0.0,  # the one-fit study measured here
                     out=out / f"{name}-{'recipe' if space else 'shipped'}", log=lambda line: None)
            seconds = time.perf_counter() - t0
            trials = r.study.trials
            untuned = next(t.value for t in trials if t.user_attrs.get("untuned"))
            pruned = sum(t.state.name == "PRUNED" for t in trials)
            importance = _importance(r.study)
            chose = {k.rsplit(".", 1)[-1]: r.best_values[k] for k in RECIPE if k in r.best_values}
            rows.append((name, label, untuned, r.best_value, len(trials), pruned, seconds, chose,
                         {k.rsplit(".", 1)[-1]: v for k, v in importance.items() if k in RECIPE}))
            print(rows[-1], flush=True)
    lines = ["| data | space | untuned vali | best vali | trials (pruned) | s | recipe chosen | recipe importance |",
             "|---|---|---:|---:|---:|---:|---|---|"]
    for name, label, untuned, best, n, pruned, seconds, chose, imp in rows:
        lines.append(f"| {name} | {label} | {untuned:.4f} | {best:.4f} | {n} ({pruned}) | {seconds:.0f} | "
                     + (", ".join(f"{k}={v}" for k, v in chose.items()) or "–") + " | "
                     + (", ".join(f"{k} {v:.2f}" for k, v in imp.items()) or "–") + " |")
    command = command_line(__file__, argv)
    body = (f"## Tuning: does the training recipe matter? (LambdaRank MLP)\n\n{datetime.date.today()}, "
            f"{platform.machine()}, {os.cpu_count()} CPUs. Command: `{command.strip()}`.\n\n"
            f"Vali NDCG@10 (exp gain, empty = 1) of Optuna studies of {args.trials} trials each (TPE seed 0, "
            f"median pruning), MQ2008 Fold1 and the Yahoo sample (20 % of its train queries as vali); "
            f"the recipe options: {', '.join(RECIPE)}. Importance: fANOVA over the completed trials.\n\n"
            + "\n".join(lines) + "\n")
    print(body)
    if args.write:
        write_section("tune_recipe", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
