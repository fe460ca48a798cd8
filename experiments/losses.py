"""Every ranking loss on MQ2008, neural and trees side by side (issue 19).

Each name of :data:`rankkit.losses.OBJECTIVES` trains both sides with their tuned settings:

* neural: ``LambdaRank(loss=<name>)`` with the rest of configs/lambdarank.yaml, trained by
  ``Trainer.fit`` through ``mq2008_neural.run_one`` (best epoch on vali NDCG@10 kept);
* trees: ``LambdaMART(objective=<name>)`` with ``mq2008_lambdamart.SETTINGS`` (depth 6, lr 0.1,
  k 10, normalize, at most 2000 trees, early stopping patience 50 on vali NDCG@10).

Selection uses vali only; the test sets are scored once, with the kept model. Reported per loss
and side: test NDCG@10 (exp gain, a query with nothing relevant scores 1) mean and std over the
runs, mean vali NDCG@10, training seconds per run.

    python experiments/losses.py --small                       # 1 fold, 1 seed, a few epochs/trees
    python experiments/losses.py --folds 1-5 --seeds 3 --runs results/losses_runs.jsonl --write

``--runs FILE`` appends every finished run to FILE (JSON lines) and skips the runs already there,
so the two sides can run as two processes on the same file and a last ``--write`` call gathers
them. ``--write`` replaces the ``losses`` section of docs/benchmarks.md and docs/img/losses.png.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import tempfile
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mq2008_lambdamart  # noqa: E402
import mq2008_neural  # noqa: E402
from _report import command_line, write_section  # noqa: E402

from rankkit.boosting import LambdaMART
from rankkit.data.bundled import load_mq2008
from rankkit.losses import LISTWISE, OBJECTIVES

SIDES = ("neural", "trees")
REFERENCE = "ndcg"  # LambdaRank's weighting and LambdaMART's default: the Δ column's baseline
DATE = "2026-11-24"
MACHINE = "2 CPU cores, shared with other jobs (times are inflated)"
IMAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "img", "losses.png")
# What the full run of 2026-11-24 showed, quoted in the docs section (not written with --small).
FINDINGS = (
    "Reading the table (selection on vali; the Δ column pairs each run with the `ndcg` run of the same "
    "fold and seed, ± its standard error, which removes the fold-to-fold spread that dominates the sd "
    "column). **Neural:** the label-difference weightings `arp1` and `arp2`/`labeldiff` and `ranknet` "
    "(all three with the config's k 10) tie for the best vali, about +0.004 ± 0.0015 over `ndcg` "
    "(LambdaRank's own weighting, for which configs/lambdarank.yaml was tuned), and `labeldiff` has the "
    "best test mean (0.7825). **Trees:** nothing beats the default `ndcg` beyond noise (best vali `arp1`, "
    "+0.0015 ± 0.0035); `ranknet`, `map`, `arp2`, `softmax` and `xendcg` tie on test (0.783-0.784); the "
    "LambdaLoss NDCG variants (`ndcg_loss1/2/2pp`) and `err` are below `ndcg` on trees' vali "
    "(−0.005 to −0.007). `arp2` and `labeldiff` are one weighting under two names (|y_i − y_j|), so their "
    "rows agree to the last digit. **Failures:** `listmle` does not learn on either side (vali 0.70-0.71, "
    "−0.086 from `ndcg`; neural runs stop 8 epochs after their first epoch, which stays the best): "
    "`listmle_loss` orders equal labels by document index unless given a `generator`, and neither "
    "LambdaRank nor LambdaMART passes one, so on MQ2008, where most documents are label 0, it is fitted "
    "to the file order (a one-off check, LambdaMART with a seeded generator patched in for `listmle`: "
    "fold 1 vali 0.672 → 0.786, fold 2 0.752 → 0.817). `approx_ndcg` learns on trees but falls short "
    "(vali −0.024 ± 0.004 from `ndcg`, test 0.771) with twice the rounds (114 against 56) and 5x the time "
    "per run (its O(L²) gradient): the positive hessian surrogate (an upper bound of the exact "
    "diagonal) makes each Newton step conservative; on the neural side, where only the gradient is "
    "used, it is close to the others (test 0.7773, vali −0.005).")
# --small: enough to check that every piece runs, not to rank anything.
SMALL = dict(folds=[1], seeds=1, max_epochs=2, max_trees=5)


#: The second data set (issue 26): LightGBM's lambdarank example, a sample of the Yahoo! Learning to
#: Rank Challenge (Chapelle and Chang, "Yahoo! Learning to Rank Challenge Overview", 2011):
#: rank.train and rank.test with .query sidecars, 300 features, labels 0-4, no vali file.
YAHOO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "lightgbm-lambdarank")
if not os.path.isdir(YAHOO):
    YAHOO = "/work/shared/data/lightgbm-lambdarank"
VALI_SHARE = 0.25


def load(data: str, fold: int):
    """``(train, vali, test)``: MQ2008's fold, or for ``yahoo`` the sample's train split into train
    and a vali of ``VALI_SHARE`` of its queries drawn with seed ``fold`` (each "fold" a different
    split; the test file is the same for all)."""
    if data == "mq2008":
        return load_mq2008(fold)
    from rankkit.data import read_svmlight

    full = read_svmlight(os.path.join(YAHOO, "rank.train"))
    test = read_svmlight(os.path.join(YAHOO, "rank.test"), n_features=full.n_features)
    order = torch.randperm(full.n_queries, generator=torch.Generator().manual_seed(fold))
    n_vali = round(VALI_SHARE * full.n_queries)
    return full.subset(order[n_vali:].sort().values), full.subset(order[:n_vali].sort().values), test


def run_neural(loss: str, fold: int, seed: int, workdir: str, max_epochs: int, data: str = "mq2008") -> dict:
    """LambdaRank with configs/lambdarank.yaml and ``loss=<name>`` on one fold and seed."""
    r = mq2008_neural.run_one("LambdaRank", fold, seed, workdir, max_epochs, {"loss": loss},
                              data=None if data == "mq2008" else load(data, fold))
    return {"side": "neural", "loss": loss, "fold": fold, "seed": seed, "test": r["ndcg@10"],
            "vali": r["best_val_ndcg@10"], "seconds": r["train_seconds"], "steps": r["epochs"]}


def run_trees(loss: str, fold: int, max_trees: int, patience: int, data: str = "mq2008") -> dict:
    """LambdaMART with the tuned settings and ``objective=<name>`` on one fold (deterministic).

    ``model.score`` is the mean test NDCG@10 with exp gain and empty queries scored 1.
    """
    train, vali, test = load(data, fold)
    settings = {**mq2008_lambdamart.SETTINGS, "objective": loss}
    t0 = time.perf_counter()
    model = LambdaMART(n_estimators=max_trees, early_stopping_rounds=patience, eval_metric="ndcg@10",
                       seed=0, **settings).fit(train, eval_set=[vali])
    seconds = time.perf_counter() - t0
    return {"side": "trees", "loss": loss, "fold": fold, "seed": 0,
            "test": model.score(test), "vali": model.best_score_,
            "seconds": seconds, "steps": model.best_iteration_ + 1}


def _key(run: dict) -> tuple:
    return run["side"], run["loss"], run["fold"], run["seed"]


def _load_runs(path: str | None) -> dict[tuple, dict]:
    if not path or not os.path.exists(path):
        return {}
    with open(path) as f:
        return {_key(r): r for r in map(json.loads, filter(str.strip, f))}


def _append_run(path: str, run: dict) -> None:
    # One write on an O_APPEND descriptor: two processes can share the file line by line.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(run) + "\n").encode())
    finally:
        os.close(fd)


def summarize(runs: list[dict], losses: list[str], sides: list[str]) -> list[dict]:
    """One row per (loss, side): test NDCG@10 mean and std over the runs, vali mean, s/run, and
    ``vali_delta`` ± ``vali_delta_se``: the mean paired difference in vali NDCG@10 from the same
    fold and seed trained with :data:`REFERENCE` (None where that loss was not run)."""
    by = {_key(r): r for r in runs}
    rows = []
    for loss in losses:
        for side in sides:
            mine = [r for r in runs if r["loss"] == loss and r["side"] == side]
            if not mine:
                continue
            test = [r["test"] for r in mine]
            pairs = [(r, by.get((side, REFERENCE, r["fold"], r["seed"]))) for r in mine]
            delta = [r["vali"] - ref["vali"] for r, ref in pairs if ref is not None]
            rows.append({"loss": loss, "side": side, "runs": len(mine),
                         "test": statistics.mean(test),
                         "test_sd": statistics.stdev(test) if len(test) > 1 else 0.0,
                         "vali": statistics.mean(r["vali"] for r in mine),
                         "vali_delta": statistics.mean(delta) if delta else None,
                         "vali_delta_se": (statistics.stdev(delta) / math.sqrt(len(delta))
                                           if len(delta) > 1 else 0.0),
                         "seconds": statistics.mean(r["seconds"] for r in mine),
                         "steps": statistics.mean(r["steps"] for r in mine)})
    return rows


def table(rows: list[dict], losses: list[str], sides: list[str]) -> str:
    """Markdown: a row per loss; for each side test ± sd, vali (the best in bold), the paired vali
    difference from :data:`REFERENCE`, epochs run / best round and s/run."""
    step = {"neural": "epochs run", "trees": "best round"}
    head = "| loss | kind |" + "".join(f" {s} test NDCG@10 | {s} vali | {s} Δ vali vs {REFERENCE} | "
                                      f"{s} {step[s]} | {s} s/run |" for s in sides)
    lines = [head, "|---|---|" + "---:|" * (5 * len(sides))]
    by = {(r["loss"], r["side"]): r for r in rows}
    best = {s: max((r["vali"] for r in rows if r["side"] == s), default=None) for s in sides}
    for loss in losses:
        cells = [loss, "listwise" if loss in LISTWISE else "pairwise"]
        for s in sides:
            r = by.get((loss, s))
            if r is None:
                cells += [""] * 5
                continue
            vali = f"{r['vali']:.4f}"
            delta = "" if r["vali_delta"] is None else f"{r['vali_delta']:+.4f} ± {r['vali_delta_se']:.4f}"
            cells += [f"{r['test']:.4f} ± {r['test_sd']:.4f}", f"**{vali}**" if r["vali"] == best[s] else vali,
                      delta, f"{r['steps']:.0f}", f"{r['seconds']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], losses: list[str], sides: list[str], path: str, name: str = "MQ2008") -> None:
    """Test NDCG@10 per loss, one bar per side, error bars = std over the runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = {(r["loss"], r["side"]): r for r in rows}
    width = 0.8 / len(sides)
    fig, ax = plt.subplots(figsize=(11, 4.2))
    for i, side in enumerate(sides):
        xs = [j for j, loss in enumerate(losses) if (loss, side) in by]
        mine = [by[(losses[j], side)] for j in xs]
        ax.bar([x + (i - (len(sides) - 1) / 2) * width for x in xs], [r["test"] for r in mine], width,
               yerr=[r["test_sd"] for r in mine], capsize=2, label=side)
    values = [r["test"] - r["test_sd"] for r in rows] or [0.0]
    ax.set_ylim(max(0.0, min(values) - 0.02), min(1.0, max(r["test"] + r["test_sd"] for r in rows) + 0.01))
    ax.set_xticks(range(len(losses)), losses, rotation=35, ha="right")
    ax.set_ylabel("test NDCG@10 (mean ± std over runs)")
    ax.set_title(f"Every loss on {name}: neural (LambdaRank MLP) vs trees (LambdaMART)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--small", action="store_true",
                   help=f"a check that it runs: fold 1, seed 0, {SMALL['max_epochs']} epochs, "
                        f"{SMALL['max_trees']} trees")
    p.add_argument("--folds", default="1-5", help='e.g. "1-5" or "1,3"')
    p.add_argument("--seeds", type=int, default=3, help="neural seeds 0..N-1 per fold (trees are deterministic)")
    p.add_argument("--losses", default=",".join(OBJECTIVES), help="comma-separated names of OBJECTIVES")
    p.add_argument("--side", choices=("neural", "trees", "both"), default="both")
    p.add_argument("--max-epochs", type=int, default=mq2008_neural.MAX_EPOCHS)
    p.add_argument("--max-trees", type=int, default=2000)
    p.add_argument("--patience", type=int, default=50, help="trees: rounds without a better vali NDCG@10")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a shared box)")
    p.add_argument("--data", choices=("mq2008", "yahoo"), default="mq2008",
                   help="yahoo: LightGBM's Yahoo! LTR sample (../shared/data), vali carved from train per fold")
    p.add_argument("--runs", default=None, help="JSON-lines file: append each run, skip runs already in it")
    p.add_argument("--write", action="store_true",
                   help="write the docs/benchmarks.md section and docs/img/losses.png")
    p.add_argument("--plot", default=None, help="where to save the plot without --write")
    args = p.parse_args(argv)
    losses = [name.strip() for name in args.losses.split(",") if name.strip()]
    unknown = [name for name in losses if name not in OBJECTIVES]
    if unknown:
        p.error(f"--losses: unknown {unknown}; choose from {list(OBJECTIVES)}")
    sides = list(SIDES) if args.side == "both" else [args.side]
    folds = mq2008_neural.parse_range(args.folds)
    seeds, max_epochs, max_trees = args.seeds, args.max_epochs, args.max_trees
    if args.small:
        folds, seeds, max_epochs, max_trees = SMALL["folds"], SMALL["seeds"], SMALL["max_epochs"], SMALL["max_trees"]
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)

    done = _load_runs(args.runs)
    runs = []
    # Trees first (the shorter side), then seed-major: a run cut short still holds every loss and
    # fold for its first seeds.
    order = sorted(sides, key=lambda side: side != "trees")
    plan = [(side, loss, fold, seed) for side in order for seed in range(seeds if side == "neural" else 1)
            for loss in losses for fold in folds]
    with tempfile.TemporaryDirectory() as work:
        for side, loss, fold, seed in plan:
            run = done.get((side, loss, fold, seed))
            if run is None:
                if side == "neural":
                    run = run_neural(loss, fold, seed, work, max_epochs, args.data)
                else:
                    run = run_trees(loss, fold, max_trees, args.patience, args.data)
                if args.runs:
                    _append_run(args.runs, run)
                print(json.dumps(run), flush=True)
            runs.append(run)
    rows = summarize(runs, losses, sides)
    md = table(rows, losses, sides)
    print(md)
    name = {"mq2008": "MQ2008", "yahoo": "the Yahoo! LTR sample"}[args.data]
    image = IMAGE if args.data == "mq2008" else IMAGE.replace("losses.png", f"losses_{args.data}.png")
    if args.plot or args.write:
        plot(rows, losses, sides, args.plot or image, name)
    if args.write:
        cmd = command_line(__file__, argv)
        gathered = (" (`--runs` keeps every finished run: the training ran as the same command without "
                    "`--write`, this call gathered it)") if args.runs else ""
        protocol = (
            f"Every name of `rankkit.losses.OBJECTIVES` trains both sides with their tuned settings, "
            f"nothing else changed: **neural** is `LambdaRank(loss=<name>)` with configs/lambdarank.yaml "
            f"(MLP [64, 32], Adam lr 1e-3, k 10, reduction sum, at most {max_epochs} epochs, patience "
            f"{mq2008_neural.PATIENCE}; {len(folds)} fold(s) × {seeds} seed(s) = {len(folds) * seeds} runs per "
            f"loss); **trees** is `LambdaMART(objective=<name>)` with the settings of the LambdaMART section "
            f"(depth 6, lr 0.1, k 10, normalize, l2 1, min_data_in_leaf 20, at most {max_trees} trees, "
            f"patience {args.patience}; {len(folds)} fold(s), deterministic). `k` and `normalize` only act "
            f"on the pairwise weightings; the listwise losses ignore them (so neural `ranknet` here is "
            f"RankNet truncated at k 10 in LambdaRank's config, not configs/ranknet.yaml). Model selection "
            f"on vali NDCG@10 only (best epoch / best round kept; the best vali per side in bold); test "
            f"NDCG@10 with exp gain, a query with nothing relevant scores 1, mean ± std over the runs "
            f"(folds and seeds together, so the spread is mostly the folds'). Δ vali: the mean paired "
            f"difference from the `{REFERENCE}` run of the same fold and seed ± its standard error. Epochs "
            f"run: neural epochs trained (the best one + patience, or the cap); best round: the trees kept "
            f"by early stopping; s/run: training wall time, mean over the runs. Training time in all: "
            + ", ".join(f"{side} {sum(r['seconds'] for r in runs if r['side'] == side) / 60:.1f} min"
                        for side in sides)
            + " (data loading and test scoring not counted).")
        if args.data == "mq2008":
            body = (f"## Every loss on MQ2008 (issue 19)\n\n"
                    f"{DATE}, {MACHINE}, torch {torch.__version__}, {args.threads} torch thread(s). "
                    f"Command: `{cmd}`{gathered}.\n\n{protocol}\n\n{md}\n\n![losses](img/losses.png)\n"
                    + ("" if args.small else f"\n{FINDINGS}\n"))
            write_section("losses", body)
        else:
            carve = (f"The sample has no vali file: each \"fold\" f draws {VALI_SHARE:.0%} of rank.train's "
                     f"queries with seed f as vali and trains on the rest; rank.test is the test set of every "
                     f"fold (so the sd column is the split's and the seed's spread, not the test set's).")
            body = (f"## Every loss on the Yahoo! LTR sample (issue 26)\n\n"
                    f"{datetime.date.today().isoformat()}, {MACHINE}, torch {torch.__version__}, "
                    f"{args.threads} torch thread(s). Command: `{cmd}`{gathered}.\n\n{carve} "
                    f"{protocol.replace('MQ2008', name)}\n\n{md}\n\n"
                    f"![losses on {name}](img/{os.path.basename(image)})\n")
            write_section(f"losses_{args.data}", body)
    return rows


if __name__ == "__main__":
    main()
