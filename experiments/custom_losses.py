"""Custom ranking losses (rankkit.custom) on MQ2008: quality, speed per round, memory at L = 1000.

Three parts, each a section of docs/benchmarks.md (``--write``):

* ``custom_quality``: LambdaMART with the three worked examples of docs/custom_losses.md
  (``rankkit.examples.losses``: a squared pairwise hinge, a label-smoothed listwise softmax, a
  softmax plus a pointwise term) beside the built-in objectives ``lambdarank`` (the tuned default),
  ``ranknet`` and ``softmax``, over the five folds: depth 6, lr 0.1, l2 1, min_data_in_leaf 20, at
  most 2000 trees, early stopping (patience 50) on vali NDCG@10, test NDCG@10 (exp gain, a query
  with nothing relevant scores 1) of the kept trees. The hand-written RankNet loss runs on Fold1
  beside the built-in ``ranknet`` (the issue's check: within 0.002).
* ``custom_speed``: seconds per boosting round on MQ2008 Fold1 (depth 6, one thread, medians of
  ``--repeats`` fits of ``--rounds`` rounds each), built-in against custom.
* ``custom_memory``: the peak resident memory that one call of the gradients adds (sampled every
  0.5 ms from /proc/self/statm) by the first call (a custom loss's checks included) and by a later
  one (after ``malloc_trim``, so that freed memory is not reused unseen), at Q = 2 queries of L = 1000 documents,
  each in a fresh process: the custom exact Hessian of a pairwise and a listwise loss against the
  built-in listwise losses with their default workspace.

    python experiments/custom_losses.py --small                  # Fold1, few trees: a smoke run
    python experiments/custom_losses.py --part speed --write
    python experiments/custom_losses.py --part memory --write
    python experiments/custom_losses.py --part quality --write   # about an hour on 2 cores
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import write_section  # noqa: E402

from rankkit.boosting import LambdaMART
from rankkit.custom import ProbabilityLoss
from rankkit.data.bundled import load_mq2008
from rankkit.examples import losses as examples

GUIDE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "custom_losses.md")
SETTINGS = dict(depth=6, learning_rate=0.1, l2=1.0, min_data_in_leaf=20)
#: The built-in default as tuned (configs/lambdamart.yaml): |ΔNDCG| weighting, k 10, normalised.
TUNED_DEFAULT = dict(objective="lambdarank", k=10, normalize=True)
MODELS = {
    "lambdarank (built-in, tuned)": TUNED_DEFAULT,
    "ranknet (built-in)": dict(objective="ranknet"),
    "softmax (built-in)": dict(objective="softmax"),
    "squared_pairwise_hinge (custom)": dict(objective=examples.squared_pairwise_hinge),
    "smoothed_softmax (custom)": dict(objective=examples.smoothed_softmax),
    "softmax_plus_pointwise (custom)": dict(objective=examples.softmax_plus_pointwise),
}


def ranknet_pairs(scores, labels, mask):
    """RankNet as Bernoulli events on the pairs (for the Gauss–Newton Hessian)."""
    pairs = (labels[:, :, None] > labels[:, None, :]) & mask[:, :, None] & mask[:, None, :]
    logits = (scores[:, :, None] - scores[:, None, :]).flatten(1)
    return logits, torch.ones_like(logits), pairs.flatten(1).to(logits.dtype)


def fit(fold_data, spec: dict, max_trees: int, patience: int) -> dict:
    train, vali, test = fold_data
    t0 = time.perf_counter()
    model = LambdaMART(n_estimators=max_trees, early_stopping_rounds=patience, eval_metric="ndcg@10",
                       **SETTINGS, **spec).fit(train, eval_set=[vali])
    seconds = time.perf_counter() - t0
    return {"vali": model.best_score_, "test": model.score(test), "trees": model.best_iteration_ + 1,
            "rounds": len(model.evals_result_["valid_0"]["ndcg@10"]), "seconds": seconds}


def quality(folds, max_trees: int, patience: int, runs_path: str | None) -> str:
    done = {}
    if runs_path and os.path.exists(runs_path):
        for line in open(runs_path):
            r = json.loads(line)
            done[(r["model"], r["fold"])] = r
    rows = dict(done)
    jobs = [(name, fold) for fold in folds for name in MODELS]
    jobs += [("ranknet (custom, by hand)", 1)] if 1 in folds else []
    for name, fold in jobs:
        if (name, fold) in rows:
            continue
        spec = MODELS.get(name, dict(objective=examples.ranknet))
        r = {"model": name, "fold": fold, **fit(load_mq2008(fold), spec, max_trees, patience)}
        print(f"{name:34s} fold {fold}: vali {r['vali']:.4f} test {r['test']:.4f} trees {r['trees']} "
              f"({r['seconds']:.0f} s)", flush=True)
        rows[(name, fold)] = r
        if runs_path:
            with open(runs_path, "a") as f:
                f.write(json.dumps(r) + "\n")
    lines = ["| objective | test NDCG@10 per fold | mean test | mean vali | trees (mean) | s per fit (mean) |",
             "|---|---|---:|---:|---:|---:|"]
    for name in list(MODELS) + ["ranknet (custom, by hand)"]:
        rs = [rows[(name, f)] for f in folds if (name, f) in rows]
        if not rs:
            continue
        per_fold = " ".join(f"{r['test']:.4f}" for r in rs)
        lines.append(f"| {name} | {per_fold} | "
                     f"{statistics.mean(r['test'] for r in rs):.4f} | {statistics.mean(r['vali'] for r in rs):.4f} | "
                     f"{statistics.mean(r['trees'] for r in rs):.0f} | {statistics.mean(r['seconds'] for r in rs):.0f} |")
    return "\n".join(lines)


def speed(rounds: int, repeats: int) -> str:
    train, _, _ = load_mq2008(1)
    cases = {
        "ranknet (built-in)": dict(objective="ranknet"),
        "ranknet (custom, exact Hessian)": dict(objective=examples.ranknet),
        "ranknet (custom, Gauss-Newton)": dict(objective=ProbabilityLoss(ranknet_pairs)),
        "ranknet (custom, constant Hessian)": dict(objective=examples.ranknet, hessian="constant"),
        "softmax (built-in)": dict(objective="softmax"),
        "softmax (custom, exact Hessian)": dict(objective=examples.smoothed_softmax),
        "softmax_plus_pointwise (custom, exact)": dict(objective=examples.softmax_plus_pointwise),
        "squared_pairwise_hinge (custom, exact)": dict(objective=examples.squared_pairwise_hinge),
        "ranknet (declared pairwise, exact)": dict(objective=examples.declared_ranknet),
        "squared_pairwise_hinge (declared pairwise, exact)": dict(objective=examples.declared_squared_hinge),
        "label_gap_logistic (declared pairwise, exact)": dict(objective=examples.label_gap_logistic),
    }
    times = {name: [] for name in cases}
    models = {}
    for _ in range(repeats):  # interleaved, so that drift of a shared machine hits every case alike
        for name, spec in cases.items():
            LambdaMART(n_estimators=1, **SETTINGS, **spec).fit(train)  # warm-up (first-call checks)
            t0 = time.perf_counter()
            models[name] = LambdaMART(n_estimators=rounds, **SETTINGS, **spec).fit(train)
            times[name].append((time.perf_counter() - t0) / rounds)
    base = {"ranknet": statistics.median(times["ranknet (built-in)"]),
            "softmax": statistics.median(times["softmax (built-in)"])}
    lines = ["| objective | ms per round (median) | × its built-in |", "|---|---:|---:|"]
    for name in cases:
        ms = statistics.median(times[name])
        ref = base["softmax"] if "softmax" in name else base["ranknet"]
        lines.append(f"| {name} | {1000 * ms:.1f} | {ms / ref:.2f} |")
    lines += ["", _same_trees(models["ranknet (built-in)"], models["ranknet (declared pairwise, exact)"], rounds)]
    return "\n".join(lines)


def _same_trees(builtin, declared, rounds: int) -> str:
    """One line: whether the declared RankNet grew the built-in's trees (splits equal, leaves' gap)."""
    a, b = builtin.ensemble_, declared.ensemble_
    same = torch.equal(a.features, b.features) and torch.equal(a.thresholds, b.thresholds)
    gap = float((a.leaf_values.double() - b.leaf_values.double()).abs().max())
    return (f"The declared RankNet against the built-in `ranknet`, {rounds} trees: splits "
            f"{'identical' if same else 'DIFFERENT'}, leaf values within {gap:.1e} (stored as "
            f"{str(a.leaf_values.dtype).replace('torch.', '')}).")


MEMORY_PROBE = r"""
import os, sys, threading, time, torch
torch.set_num_threads(1)
from rankkit.losses import objective_gradients
from rankkit.custom import TorchLoss
from rankkit.examples import losses as examples
page = os.sysconf("SC_PAGE_SIZE")

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page

case = sys.argv[1]
g = torch.Generator().manual_seed(0)
s = torch.randn(2, 1000, generator=g, dtype=torch.float64)
y = torch.randint(0, 3, (2, 1000), generator=g).double()
m = torch.ones(2, 1000, dtype=torch.bool)
loss = {"pairwise": TorchLoss(examples.squared_pairwise_hinge), "listwise": TorchLoss(examples.smoothed_softmax)}.get(case)
run = (lambda: loss.gradients(s, y, m)) if loss is not None else (lambda: objective_gradients(case, s, y, mask=m))
if sys.argv[2] == "later":  # a later call: the first call's checks done, freed memory returned to the system
    run()
    import ctypes, gc
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
peak, done = [0], [False]
def sample():
    while not done[0]:
        peak[0] = max(peak[0], rss())
        time.sleep(0.0005)
before = rss()
t = threading.Thread(target=sample)
t.start()
run()
done[0] = True
t.join()
print((max(peak[0], rss()) - before) / 2**20)
"""


def memory() -> str:
    cases = [("squared_pairwise_hinge (custom, exact Hessian)", "pairwise"),
             ("smoothed_softmax (custom, exact Hessian)", "listwise"),
             ("approx_ndcg (built-in, workspace 2^22)", "approx_ndcg"),
             ("neural_ndcg (built-in, workspace 2^22)", "neural_ndcg"),
             ("ranknet (built-in kernel)", "ranknet")]
    lines = ["| gradients of | peak memory added, first call (MiB) | a later call (MiB) |", "|---|---:|---:|"]
    for name, case in cases:
        cells = []
        for which in ("first", "later"):
            out = subprocess.run([sys.executable, "-c", MEMORY_PROBE, case, which], capture_output=True, text=True,
                                 check=True)
            cells.append(f"{float(out.stdout.split()[-1]):.0f}")
        lines.append(f"| {name} | {' | '.join(cells)} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("quality", "speed", "memory", "all"), default="all")
    ap.add_argument("--small", action="store_true", help="Fold1, 30 trees, 2 speed rounds: a smoke run")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--runs", default=None, help="quality: append finished fits here (JSON lines), skip those there")
    ap.add_argument("--write", action="store_true", help="write the docs/benchmarks.md sections")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    stamp = (f"{datetime.date.today()}, {platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}, "
             f"one thread")
    parts = ("quality", "speed", "memory") if args.part == "all" else (args.part,)
    for part in parts:
        if part == "quality":
            folds = [1] if args.small else [1, 2, 3, 4, 5]
            body = quality(folds, 30 if args.small else 2000, 5 if args.small else 50, args.runs)
            command = "python experiments/custom_losses.py --part quality --runs results/custom_runs.jsonl --write"
        elif part == "speed":
            body = speed(2 if args.small else args.rounds, 1 if args.small else args.repeats)
            command = f"python experiments/custom_losses.py --part speed --rounds {args.rounds} --repeats {args.repeats} --write"
        else:
            body = memory()
            command = "python experiments/custom_losses.py --part memory --write"
        print(body, flush=True)
        if args.write and not args.small:
            write_section(f"custom_{part}", f"Measured {stamp}; command: `{command}`.\n\n{body}")
            if part == "quality":  # the page of the worked examples shows the same table
                write_section("custom_quality", f"Measured {stamp}; command: `{command}`.\n\n{body}", GUIDE)


if __name__ == "__main__":
    main()
