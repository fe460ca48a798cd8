"""The clip of inverse propensities (issue 49): fixed clips against ``propensity_clip="auto"``.

    python experiments/ips_clip.py --write

``LambdaMART(unbiased="ips")`` weighs each click by min(θ̂₀/θ̂(pos), clip), θ̂ from regression-EM on
the training log. A small clip biases the deep clicks down, a large one lets their few clicks
count a lot. This script trains ``"ips"`` at each clip of ``--clips`` (numbers, ``none``, ``auto``)
on the click logs of experiments/unbiased.py's protocol (the same production ranker, logs and test
metric, so its naive and oracle rows equal that grid's), beside naive and oracle LambdaMART.

``"auto"`` (:func:`rankkit.clicks.propensity.auto_clip`, 3 √r with r the log's largest θ̂₀/θ̂ at a clicked position) was
chosen on PBM η ∈ {0.5, 1, 2} and the cascade; η = 1.5 and 3 (``--etas``) were run after it was
fixed, as the check it had not seen. The table marks which is which.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import command_line, write_section  # noqa: E402
from unbiased import (K_SHOWN, booster, click_models, fold_range, grid_arguments, load, run_keys,  # noqa: E402
                      test_ndcg, train_lambdarank)

from rankkit.clicks.metrics import ClickLogMetric  # noqa: E402
from rankkit.clicks.propensity import auto_clip, clicked_positions, ips_propensities  # noqa: E402
from rankkit.data.clicks import PositionBasedModel, simulate_clicks  # noqa: E402
from rankkit.training.clicks import production_ranker, production_scores  # noqa: E402

#: The click models ``auto_clip`` was chosen on; the others are its held-out check.
CHOSEN_ON = ("PBM η=0.5", "PBM η=1", "PBM η=2", "cascade")


def clip_value(text: str) -> float | str | None:
    """``--clips``'s spelling of a clip: a number, ``none`` or ``auto``."""
    return None if text == "none" else "auto" if text == "auto" else float(text)


def run(name: str, fold: int, seed: int, args, done: set):
    """Yields one record per click model of (data set, fold, seed) not in ``done``."""
    args.seed = seed
    todo = [(label, model) for label, model in click_models(args, 4.0) if (name, fold, seed, label) not in done
            and (args.trees or label in args.neural_etas)]
    if not todo:
        return
    train, vali, test, top = load(name, fold)
    prod = production_ranker(train, fraction=0.01, n_estimators=50, depth=3, min_data_in_leaf=5, seed=seed)
    prod_train, prod_vali = production_scores(prod, train), production_scores(prod, vali)
    oracle = test_ndcg(booster(args).fit(train).predict(test), test) if args.trees else None
    for label, model in click_models(args, top):
        if (name, fold, seed, label) in done or not (args.trees or label in args.neural_etas):
            continue
        t0 = time.perf_counter()
        log = simulate_clicks(train, prod_train, model=model, sessions_per_query=args.sessions, k=K_SHOWN,
                              seed=seed, drop_unclicked=True)
        x, clicks, sizes, position = log.sessions.features, log.clicks, log.sessions.sizes, log.position
        test_rows = {}
        if args.trees:
            test_rows = {"naive": test_ndcg(booster(args).fit(x, clicks, group=sizes).predict(test), test),
                         "oracle": oracle}
        for clip in args.clips if args.trees else ():
            m = booster(args, unbiased="ips", n_positions=K_SHOWN, propensity_clip=clip_value(clip)).fit(
                x, clicks, group=sizes, position=position)
            test_rows[f"ips clip={clip}"] = test_ndcg(m.predict(test), test)
        if args.neural_clips and label in args.neural_etas:
            # LambdaRank("ips") as the click grid trains it: its best epoch by the validation log's
            # counterfactual NDCG (regression-EM propensities of that log, 1/θ̂ clipped at 50)
            vlog = simulate_clicks(vali, prod_vali, model=model, sessions_per_query=args.sessions, k=K_SHOWN,
                                   seed=seed + 1000, drop_unclicked=True)
            metric = ClickLogMetric(vlog.aggregate(), vali.features, n_positions=K_SHOWN, clip=50.0,
                                    em={"hidden": (16,), "iterations": 15, "lr": 1e-2, "seed": seed})
            for clip in args.neural_clips:
                scorer, _, _ = train_lambdarank(log.sessions, metric, args, unbiased="ips", p=1.0, epochs=3,
                                                propensity_clip=clip_value(clip))
                test_rows[f"LambdaRank ips clip={clip}"] = test_ndcg(scorer(test.features), test)
            if isinstance(model, PositionBasedModel):  # the ceiling: the click model's own examination
                true_theta = model.examination(K_SHOWN) / model.examination(K_SHOWN)[0]
                for clip in args.neural_true:
                    scorer, _, _ = train_lambdarank(log.sessions, metric, args, unbiased="ips", p=1.0, epochs=3,
                                                    propensity_clip=clip_value(clip), propensities=true_theta)
                    test_rows[f"LambdaRank ips true θ clip={clip}"] = test_ndcg(scorer(test.features), test)
        theta = ips_propensities(x, clicks, sizes, position, n_positions=K_SHOWN, seed=seed)
        clicked = clicked_positions(clicks, position, K_SHOWN)  # the positions whose weights apply
        yield {"data": name, "fold": fold, "seed": seed, "click": label, "test": test_rows,
               "largest_weight": float((theta[0] / theta)[clicked].max()), "auto_clip": auto_clip(theta, clicked),
               "seconds": time.perf_counter() - t0}


def merged(records: list[dict]) -> list[dict]:
    """One record per (data, fold, seed, click model): a tree run and a neural run (``--no-trees``)
    of the same log merge their test rows."""
    out: dict = {}
    for r in records:
        key = (r["data"], r["fold"], r["seed"], r["click"])
        if key in out:
            out[key] = {**out[key], "test": {**out[key]["test"], **r["test"]}}
        else:
            out[key] = r
    return list(out.values())


def methods(clips: list[str], neural_clips: list[str], neural_true: list[str] = ()) -> list[str]:
    return (["naive"] + [f"ips clip={c}" for c in clips] + ["oracle"]
            + [f"LambdaRank ips clip={c}" for c in neural_clips]
            + [f"LambdaRank ips true θ clip={c}" for c in neural_true])


def summarise(records: list[dict], clips: list[str], neural_clips: list[str] = (), neural_true: list[str] = ()) -> dict:
    """{data: {click: {"n": runs, method: (mean, standard error), "gap": {method: share},
    "auto_clip": median, "largest_weight": median}}}."""
    out: dict = {}
    for r in records:
        out.setdefault(r["data"], {}).setdefault(r["click"], []).append(r)
    summary: dict = {}
    for name, by_click in out.items():
        summary[name] = {}
        for click, runs in by_click.items():
            cell: dict = {"n": len(runs), "gap": {}}
            for method in methods(clips, neural_clips, neural_true):
                v = np.array([run["test"][method] for run in runs if method in run["test"]])
                if len(v):
                    cell[method] = (float(v.mean()), float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1
                                    else math.nan)
            naive, oracle = cell.get("naive", (math.nan,))[0], cell.get("oracle", (math.nan,))[0]
            for c in clips:  # the trees' gap (the neural rows have no naive or oracle here)
                key = f"ips clip={c}"
                if key in cell and oracle > naive:
                    cell["gap"][key] = (cell[key][0] - naive) / (oracle - naive)
            cell["auto_clip"] = float(np.median([run["auto_clip"] for run in runs]))
            cell["largest_weight"] = float(np.median([run["largest_weight"] for run in runs]))
            summary[name][click] = cell
    return summary


def click_order(clicks) -> list[str]:
    return sorted(clicks, key=lambda c: (c == "cascade", float(c.split("=")[1]) if "=" in c else 0.0))


def table(summary: dict, clips: list[str], neural_clips: list[str] = (), neural_true: list[str] = ()) -> str:
    out = []
    for name, by_click in summary.items():
        clicks = click_order(by_click)
        out.append(f"**{name}** (test NDCG@10 on true labels, mean ± standard error; runs: "
                   + ", ".join(f"{c} {by_click[c]['n']}" for c in clicks) + ")\n")
        out.append("| method | " + " | ".join(c + ("" if c in CHOSEN_ON else " (held out)") for c in clicks)
                   + " |\n|---|" + "---:|" * len(clicks))
        for method in methods(clips, neural_clips, neural_true):
            if not any(method in by_click[c] for c in clicks):
                continue
            cells = []
            for c in clicks:
                if method not in by_click[c]:
                    cells.append("")
                    continue
                mean, se = by_click[c][method]
                gap = by_click[c]["gap"].get(method)
                cells.append(f"{mean:.4f}" + ("" if math.isnan(se) else f" ± {se:.4f}")
                             + ("" if gap is None else f" ({100 * gap:.0f} %)"))
            bold = "**" if method == "ips clip=auto" else ""
            out.append(f"| {bold}{method}{bold} | " + " | ".join(cells) + " |")
        out.append("| largest θ̂₀/θ̂ at a clicked position (median) | " + " | ".join(
            f"{by_click[c]['largest_weight']:.1f}" for c in clicks) + " |")
        out.append("| the auto clip (median) | " + " | ".join(
            f"{by_click[c]['auto_clip']:.1f}" for c in clicks) + " |")
        out.append("")
    return "\n".join(out)


def write(records: list[dict], args, command: str) -> None:
    summary = summarise(records, args.clips, args.neural_clips, args.neural_true)
    body = ("## Learning from clicks: the ips clip (issue 49)\n\n"
            f"{time.strftime('%Y-%m-%d')}, 2 shared CPU cores (x86_64, 1 thread). Command: `{command}` "
            f"(results in `{'`, `'.join(args.paths)}`, one JSON line per run; `--report-only --write` rebuilds "
            "this section from them; the trees ran as `python experiments/ips_clip.py --neural-clips '' --data D --out "
            "FILE`, one process per data set, and the LambdaRank rows as `--no-trees`; `python "
            "experiments/ips_clip.py --write` runs both in one process).\n\n"
            "The click logs, production ranker and test metric of experiments/unbiased.py (\"Learning from clicks\"): "
            "NDCG@10 on the test queries' true labels, gain 2^y − 1, log2 discount, all-zero queries count 1. "
            "`LambdaMART(unbiased=\"ips\")` (50 rounds, depth 4, learning rate 0.1) at each clip of θ̂₀/θ̂; "
            "in parentheses the share of the naive → oracle gap it closes. `auto` is 3 √r, r the log's largest "
            "θ̂₀/θ̂ over its clicked positions (`rankkit.clicks.propensity.auto_clip`), LambdaMART's default since 2026-12-05. It was chosen "
            "on the columns without a mark; the columns marked *held out* were run after the rule was fixed. "
            "The LambdaRank rows: `LambdaRank(unbiased=\"ips\")` as the click grid trains it (MLP [32], 3 epochs, "
            "its best epoch by the validation log's counterfactual NDCG), at the neural rankers' default clip of 10 "
            "and at `\"auto\"`.\n\n"
            + table(summary, args.clips, args.neural_clips, args.neural_true))
    write_section("ips_clip", body)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    grid_arguments(p, etas="0.5,1,1.5,2,3")
    p.add_argument("--clips", default="10,30,100,auto",
                   help="numbers, none or auto (a run already in --out is not run again: a new clip needs a new --out)")
    p.add_argument("--neural-clips", default="10,auto", help="LambdaRank's clips ('' leaves the neural rows out)")
    p.add_argument("--neural-true", default="",
                   help="clips of LambdaRank ips weighed by the click model's true examination instead of "
                        "regression-EM's (the estimator's ceiling; position-based logs only)")
    p.add_argument("--neural-etas", default="1,2", help="the η of the LambdaRank rows")
    p.add_argument("--no-trees", dest="trees", action="store_false", help="the LambdaRank rows only")
    p.add_argument("--out", default="results/ips_clip.jsonl",
                   help="JSON lines; new runs go to the first of a comma-separated list, the report reads all")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--write", action="store_true", help="write docs/benchmarks.md's section")
    args = p.parse_args(argv)
    command = command_line(__file__, argv)
    args.etas = [float(v) for v in args.etas.split(",")]
    args.clips = args.clips.split(",")
    args.neural_clips = [c for c in args.neural_clips.split(",") if c]
    args.neural_true = [c for c in args.neural_true.split(",") if c]
    args.neural_etas = [f"PBM η={float(v):g}" for v in args.neural_etas.split(",")]
    folds = fold_range(args.folds)
    paths = args.paths = args.out.split(",")
    args.out = paths[0]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    records = merged([json.loads(line) for path in paths if os.path.exists(path) for line in open(path)])
    if not args.report_only:
        rows = "ips clip=" if args.trees else "LambdaRank ips clip="  # what this run adds
        done = run_keys(r for r in records if any(k.startswith(rows) for k in r["test"]))
        with open(args.out, "a") as f:
            for seed in [int(v) for v in args.seeds.split(",")]:
                for fold in folds:
                    for name in args.data.split(","):
                        for record in run(name, fold, seed, args, done):
                            print(json.dumps(record), file=f, flush=True)
                            records = merged(records + [record])
                            print(f"{name} fold {fold} seed {seed} {record['click']}: "
                                  + ", ".join(f"{k} {v:.4f}" for k, v in record["test"].items()), file=sys.stderr)
    print(table(summarise(records, args.clips, args.neural_clips, args.neural_true), args.clips, args.neural_clips,
                args.neural_true))
    if args.write:
        write(records, args, command)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
