"""Boosting speed: ms per round of depth-6 trees for rankkit and LightGBM (XGBoost, CatBoost when
installed), side by side in one run, with each library's peak memory.

The data is the MSLR-shaped synthetic set (``rankkit.data.make_synthetic``): by default 10k
queries x 120 documents x 136 features = 1.2M rows. Each library runs in its own subprocess
(so its peak resident memory is its own) on the same data, with the same thread count.

    python experiments/bench_boosting.py --write
    python experiments/bench_boosting.py --queries 1000 --rounds 3     # a quick look

rankkit's round is split into the lambda kernel (``rankkit.lambdas.lambda_gradients``, not
part of this package) and the tree (histograms, split search, leaf values, score update).
``--write`` replaces the ``bench_boosting`` section of docs/benchmarks.md.
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
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

LIBRARIES = ("rankkit", "lightgbm", "xgboost", "catboost")


class _Memory:
    """Peak resident memory above the level after the data was made (sampled every 20 ms)."""

    def __init__(self):
        self.base = self.peak = _rss_mib()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, _rss_mib())

    def extra_mib(self) -> float:
        self._stop.set()
        self._thread.join()
        return max(self.peak, _rss_mib()) - self.base


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


_MEMORY: _Memory | None = None


def _data(args):
    global _MEMORY
    import gc

    from rankkit.data import make_synthetic

    data = make_synthetic(args.queries, args.docs, args.features, seed=0)
    gc.collect()
    _MEMORY = _Memory()
    return data


def _peak_mib() -> float:
    return _MEMORY.extra_mib()


def bench_rankkit(args) -> dict:
    import torch

    from rankkit.boosting.binning import QuantileBinner
    from rankkit.boosting.booster import _valid_codes
    from rankkit.boosting.objectives import QueryLayout, make_objective
    from rankkit.boosting.tree import ObliviousTreeGrower, TreeParams

    torch.set_num_threads(args.threads)
    data = _data(args)
    device = torch.device(args.device)
    t0 = time.perf_counter()
    binner = QuantileBinner().fit(data.features)
    used = binner.used_features_
    codes = binner.transform(data.features)[:, used].to(device)
    grower = ObliviousTreeGrower(codes, _valid_codes(binner)[used], TreeParams(depth=args.depth))
    layout = QueryLayout(data.labels, data.sizes, None, device)
    setup = time.perf_counter() - t0
    objective = make_objective("lambdarank", weighting="ndcg", k=args.k)
    scores = torch.zeros(data.n_docs, dtype=torch.float64, device=device)
    lam, tree_t, exact_t = [], [], []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        grad, hess = objective.gradients(scores, layout)
        _sync(device)
        t1 = time.perf_counter()
        tree = grower.grow(grad, hess)
        _sync(device)
        t2 = time.perf_counter()
        if args.exact_newton:  # the extra kernel pass of exact_newton (pairs inside a leaf left out)
            objective.gradients(scores, layout, groups=tree.leaf_index)
            _sync(device)
            exact_t.append(time.perf_counter() - t2)
        scores += tree.leaf_values[tree.leaf_index]
        lam.append(t1 - t0)
        tree_t.append(t2 - t1)
    lam_ms, tree_ms = 1e3 * statistics.median(lam), 1e3 * statistics.median(tree_t)
    exact_ms = 1e3 * statistics.median(exact_t) if exact_t else 0.0
    out = {"ms_per_round": lam_ms + tree_ms + exact_ms, "lambda_ms": lam_ms, "tree_ms": tree_ms,
           "exact_newton_ms": exact_ms, "setup_s": setup, "peak_mib": _peak_mib()}
    if device.type == "cuda":
        out["gpu_peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return out


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def bench_lightgbm(args) -> dict:
    import lightgbm as lgb

    data = _data(args)
    x, y = data.features.numpy(), data.labels.numpy()
    params = {"objective": "lambdarank", "max_depth": args.depth, "num_leaves": 2 ** args.depth,
              "learning_rate": 0.1, "num_threads": args.threads, "max_bin": 255, "min_data_in_leaf": 20,
              "verbosity": -1, "lambdarank_truncation_level": args.k or 10_000, "deterministic": True}
    t0 = time.perf_counter()
    ds = lgb.Dataset(x, y, group=data.sizes.numpy(), params={"max_bin": 255}).construct()
    setup = time.perf_counter() - t0
    stamps = []
    lgb.train(params, ds, num_boost_round=args.rounds + 1,
              callbacks=[lambda env: stamps.append(time.perf_counter())])
    return {"ms_per_round": 1e3 * statistics.median(b - a for a, b in zip(stamps, stamps[1:])),
            "setup_s": setup, "peak_mib": _peak_mib()}


def bench_xgboost(args) -> dict:
    import xgboost as xgb

    data = _data(args)
    qid = data.doc_query_index().numpy()
    t0 = time.perf_counter()
    dm = xgb.DMatrix(data.features.numpy(), data.labels.numpy(), qid=qid)
    setup = time.perf_counter() - t0
    stamps = []

    class Stamp(xgb.callback.TrainingCallback):
        def after_iteration(self, model, epoch, evals_log):
            stamps.append(time.perf_counter())
            return False

    xgb.train({"objective": "rank:ndcg", "tree_method": "hist", "max_depth": args.depth, "eta": 0.1,
               "nthread": args.threads, "max_bin": 256}, dm, num_boost_round=args.rounds + 1,
              callbacks=[Stamp()])
    return {"ms_per_round": 1e3 * statistics.median(b - a for a, b in zip(stamps, stamps[1:])),
            "setup_s": setup, "peak_mib": _peak_mib()}


def bench_catboost(args) -> dict:
    import catboost as cb

    data = _data(args)
    pool = cb.Pool(data.features.numpy(), data.labels.numpy(), group_id=data.doc_query_index().numpy())
    times = {}
    for rounds in (1, args.rounds + 1):
        t0 = time.perf_counter()
        cb.CatBoost({"loss_function": "YetiRank", "depth": args.depth, "iterations": rounds,
                     "learning_rate": 0.1, "thread_count": args.threads, "border_count": 254,
                     "verbose": False}).fit(pool)
        times[rounds] = time.perf_counter() - t0
    return {"ms_per_round": 1e3 * (times[args.rounds + 1] - times[1]) / args.rounds,
            "setup_s": times[1], "peak_mib": _peak_mib()}


def run_one(name: str, argv: list[str]) -> dict | None:
    """Run one library's benchmark in a fresh interpreter; None if it is not installed."""
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--only", name, *argv],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        if "ModuleNotFoundError" in proc.stderr:
            return None
        raise RuntimeError(f"{name} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


LOAD_AT_START = os.getloadavg()[0]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=10_000)
    ap.add_argument("--docs", type=int, default=120)
    ap.add_argument("--features", type=int, default=136)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds (the median is reported)")
    ap.add_argument("--k", type=int, default=None, help="lambdarank truncation (None: all pairs)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="rankkit's device (cpu or cuda)")
    ap.add_argument("--libraries", default=",".join(LIBRARIES))
    ap.add_argument("--exact-newton", action="store_true",
                    help="rankkit also runs exact_newton's extra lambda-kernel pass (timed separately)")
    ap.add_argument("--only", help=argparse.SUPPRESS)
    ap.add_argument("--write", action="store_true", help="write the docs/benchmarks.md section")
    args = ap.parse_args(argv)
    if args.only:
        print(json.dumps(globals()[f"bench_{args.only}"](args)))
        return
    passthrough = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--write"]
    results = {}
    for name in args.libraries.split(","):
        r = run_one(name, passthrough)
        if r is None:
            print(f"{name}: not installed, skipped", flush=True)
            continue
        results[name] = r
        print(f"{name}: {r}", flush=True)
    lgb_ms = results.get("lightgbm", {}).get("ms_per_round")
    lines = ["| library | ms per round | vs LightGBM | setup (s) | peak memory over the data (MiB) |", "|---|---|---|---|---|"]
    for name, r in results.items():
        ratio = f"{r['ms_per_round'] / lgb_ms:.2f}x" if lgb_ms else "-"
        label = name
        if name == "rankkit":
            label = (f"rankkit ({args.device}; lambda kernel {r['lambda_ms']:.0f} ms + tree "
                     f"{r['tree_ms']:.0f} ms" + (f" + exact_newton pass {r['exact_newton_ms']:.0f} ms"
                                                  if r.get("exact_newton_ms") else "") + ")")
        lines.append(f"| {label} | {r['ms_per_round']:.0f} | {ratio} | {r['setup_s']:.1f} | {r['peak_mib']:.0f} |")
    n = args.queries * args.docs
    body = (f"## Boosting speed: ms per round, depth {args.depth}\n\n"
            f"{datetime.date.today()}. Command: `python experiments/bench_boosting.py --write`"
            f" ({platform.machine()}, {os.cpu_count()} cores, load average {LOAD_AT_START:.1f} at the start, {args.threads} threads"
            f" per library).\n\nSynthetic MSLR-shaped set: {args.queries} queries x {args.docs} docs x "
            f"{args.features} features = {n:,} rows; lambdarank NDCG weighting, truncation "
            f"{args.k or 'none'}; median of {args.rounds} rounds; each library in its own process. Memory: "
            f"peak resident set above the process's level once the data was generated (so it counts the "
            f"library's binned copy and working memory, not the float32 source matrix).\n\n"
            + "\n".join(lines) + "\n")
    print(body)
    if args.write:
        from _report import write_section

        write_section("bench_boosting", body)


if __name__ == "__main__":
    main()
