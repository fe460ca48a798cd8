"""Boosting speed: ms per round of depth-6 trees for rankkit and LightGBM (XGBoost, CatBoost when
installed), side by side in one run, with each library's peak memory.

The data is the MSLR-shaped synthetic set (``rankkit.data.make_synthetic``): by default 10k
queries x 120 documents x 136 features = 1.2M rows. Each library runs in its own subprocess
(so its peak resident memory is its own) on the same data, with the same thread count.

    python experiments/bench_boosting.py --write
    python experiments/bench_boosting.py --queries 1000 --rounds 3     # a quick look
    python experiments/bench_boosting.py --mode fit --rounds 30 --write # whole fit, binning included
    python experiments/bench_boosting.py --mode fit --libraries rankkit,rankkit_quantized,lightgbm --rounds 30
    python experiments/bench_boosting.py --mode scaling --write         # ms per round by rows, threads
    python experiments/bench_boosting.py --mode mq2008 --write          # MQ2008 5-fold training time
    python experiments/bench_boosting.py --mode round_mq2008 --threads 1 --write  # four boosters, ms/round

rankkit's round is split into the lambda pass (the objective's gradients on the grower's
backend, as a fit runs them: the compiled pass on the CPU, Triton on a GPU) and the tree (histograms, split search, leaf values, score update).
``--write`` replaces the ``bench_boosting`` section of docs/benchmarks.md (``--mode fit``,
``scaling``, ``mq2008``: the ``bench_boosting_fit``, ``_scaling`` and ``_mq2008`` sections).
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

    if args.shape == "heavy":
        data = heavy_tailed(args.queries * args.docs, args.features)
    else:
        data = make_synthetic(args.queries, args.docs, args.features, seed=0)
    gc.collect()
    _MEMORY = _Memory()
    return data


def heavy_tailed(n_rows: int, n_features: int):
    """About ``n_rows`` documents in queries of log-uniform length 5..1000 (a long tail of long
    queries, mean ~190), every second feature made heavy-tailed (sign(z)·(e^{2|z|} − 1), z standardised)."""
    import dataclasses

    import torch

    from rankkit.data import make_synthetic

    data = make_synthetic(max(1, round(n_rows / 188)), (5, 1000), n_features, seed=0)
    x = data.features.clone()
    z = (x[:, ::2] - x[:, ::2].mean(0)) / x[:, ::2].std(0).clamp_min(1e-6)
    x[:, ::2] = torch.sign(z) * torch.expm1(2 * z.abs().clamp(max=20))  # at most ~2e17: finite in float32
    return dataclasses.replace(data, features=x)


def _peak_mib() -> float:
    return _MEMORY.extra_mib()


def bench_rankkit(args) -> dict:
    import torch

    from rankkit.boosting.binning import QuantileBinner
    from rankkit.boosting.engine import valid_codes as _valid_codes
    from rankkit.boosting.objectives import QueryLayout, make_objective
    from rankkit.objective import objective_spec
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
    objective = make_objective(objective_spec("lambdarank", weighting="ndcg", k=args.k))
    scores = torch.zeros(data.n_docs, dtype=torch.float64, device=device)
    lam, tree_t, exact_t = [], [], []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        grad, hess = objective.gradients(scores, layout, backend=grower.backend)  # the pass a fit runs
        _sync(device)
        t1 = time.perf_counter()
        tree = grower.grow(grad, hess)
        _sync(device)
        t2 = time.perf_counter()
        if args.exact_newton:  # the extra kernel pass of exact_newton (pairs inside a leaf left out)
            objective.gradients(scores, layout, groups=tree.leaf_index, backend=grower.backend)
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


def _quantized(args) -> dict:
    """rankkit's ``quantized_grad`` setting of the run (``--quantized``: on, with ``--quant-bins`` levels)."""
    return {"quantized_grad": bool(args.quantized), "num_grad_quant_bins": args.quant_bins}


def fit_rankkit(args) -> dict:
    """The whole ``LambdaMART.fit`` (binning included) of ``--rounds`` rounds."""
    import torch

    from rankkit.boosting import LambdaMART

    torch.set_num_threads(args.threads)
    data = _data(args)
    t0 = time.perf_counter()
    LambdaMART(n_estimators=args.rounds, depth=args.depth, k=args.k, **_quantized(args)).fit(data)
    return {"fit_s": time.perf_counter() - t0, "peak_mib": _peak_mib()}


def fit_rankkit_quantized(args) -> dict:
    """``fit_rankkit`` with ``quantized_grad=True`` (``--quant-bins`` levels): the packed integer histograms."""
    args.quantized = True
    return fit_rankkit(args)


def fit_lightgbm(args) -> dict:
    """``lgb.Dataset`` construction (LightGBM's binning) and ``lgb.train`` of ``--rounds`` rounds."""
    import lightgbm as lgb

    data = _data(args)
    x, y = data.features.numpy(), data.labels.numpy()
    params = {"objective": "lambdarank", "max_depth": args.depth, "num_leaves": 2 ** args.depth,
              "learning_rate": 0.1, "num_threads": args.threads, "max_bin": 255, "min_data_in_leaf": 20,
              "verbosity": -1, "lambdarank_truncation_level": args.k or 10_000, "deterministic": True}
    t0 = time.perf_counter()
    ds = lgb.Dataset(x, y, group=data.sizes.numpy(), params={"max_bin": 255, "num_threads": args.threads})
    lgb.train(params, ds, num_boost_round=args.rounds)
    return {"fit_s": time.perf_counter() - t0, "peak_mib": _peak_mib()}


def mq2008_rankkit(args) -> dict:
    """Per-fold fit seconds of experiments/mq2008_lambdamart.py's protocol (its tuned settings)."""
    import torch

    from mq2008_lambdamart import SETTINGS

    from rankkit.boosting import LambdaMART
    from rankkit.data.bundled import load_mq2008

    torch.set_num_threads(args.threads)
    out = {}
    for fold in range(1, 6):
        train, vali, _ = load_mq2008(fold)
        t0 = time.perf_counter()
        model = LambdaMART(n_estimators=2000, early_stopping_rounds=50, eval_metric="ndcg@10",
                           **SETTINGS).fit(train, eval_set=[vali])
        out[fold] = (time.perf_counter() - t0, len(model.evals_result_["valid_0"]["ndcg@10"]))
    return out


def mq2008_lightgbm(args) -> dict:
    """The same protocol in LightGBM: lambdarank, NDCG@10 truncation, early stopping 50 on vali."""
    import lightgbm as lgb

    from rankkit.data.bundled import load_mq2008

    params = {"objective": "lambdarank", "max_depth": 6, "num_leaves": 64, "learning_rate": 0.1,
              "lambda_l2": 1.0, "min_data_in_leaf": 20, "lambdarank_truncation_level": 10,
              "metric": "ndcg", "eval_at": [10], "num_threads": args.threads, "verbosity": -1,
              "deterministic": True}
    out = {}
    for fold in range(1, 6):
        train, vali, _ = load_mq2008(fold)
        t0 = time.perf_counter()
        ds = lgb.Dataset(train.features.numpy(), train.labels.numpy(), group=train.sizes.numpy())
        dv = lgb.Dataset(vali.features.numpy(), vali.labels.numpy(), group=vali.sizes.numpy(), reference=ds)
        rounds = []  # every round trained (current_iteration() is the best one after early stopping)
        lgb.train(params, ds, num_boost_round=2000, valid_sets=[dv],
                  callbacks=[lgb.early_stopping(50, verbose=False), lambda env, r=rounds: r.append(env.iteration)])
        out[fold] = (time.perf_counter() - t0, len(rounds))
    return out


def round_mq2008(name: str, args) -> dict:
    """ms per round of one library on MQ2008 Fold1: 200 depth-6 rounds (64 leaves for the
    leaf-wise ones), lr 0.1, NDCG@10 truncation, vali as the one eval set scored every round, no
    early stopping; best of ``--repeats`` fits (binning and data set building not counted:
    rankkit's rounds are ``BoostingEngine.update`` calls, the engine built before)."""
    import torch

    from rankkit.data.bundled import load_mq2008

    torch.set_num_threads(args.threads)
    train, vali, _ = load_mq2008(1)
    x, y, g = train.features.numpy(), train.labels.numpy(), train.sizes.numpy()
    xv, yv, gv = vali.features.numpy(), vali.labels.numpy(), vali.sizes.numpy()
    n = 200
    times = []
    for _ in range(args.repeats):
        if name == "rankkit":
            from mq2008_lambdamart import SETTINGS

            from rankkit.boosting.engine import BoosterConfig, BoostingEngine

            engine = BoostingEngine(train.features, train.labels, train.sizes,
                                    BoosterConfig(eval_metric="ndcg@10", **{**SETTINGS, **_quantized(args)}))
            engine.add_eval_set(vali.features, vali.labels, vali.sizes)
            t0 = time.perf_counter()
            for _ in range(n):
                engine.update()
            info = engine.backend.name
        elif name == "lightgbm":
            import lightgbm as lgb

            params = {"objective": "lambdarank", "max_depth": 6, "num_leaves": 64, "learning_rate": 0.1,
                      "lambda_l2": 1.0, "min_data_in_leaf": 20, "lambdarank_truncation_level": 10,
                      "metric": "ndcg", "eval_at": [10], "num_threads": args.threads, "verbosity": -1}
            ds = lgb.Dataset(x, y, group=g, params={"verbosity": -1}).construct()
            dv = lgb.Dataset(xv, yv, group=gv, reference=ds).construct()
            t0 = time.perf_counter()
            lgb.train(params, ds, num_boost_round=n, valid_sets=[dv])
            info = lgb.__version__
        elif name == "xgboost":
            import xgboost as xgb

            dt, dv = xgb.DMatrix(x, y, group=g), xgb.DMatrix(xv, yv, group=gv)
            params = {"objective": "rank:ndcg", "max_depth": 6, "eta": 0.1, "lambda": 1.0, "eval_metric": "ndcg@10",
                      "nthread": args.threads, "tree_method": "hist", "lambdarank_num_pair_per_sample": 10}
            t0 = time.perf_counter()
            xgb.train(params, dt, num_boost_round=n, evals=[(dv, "vali")], verbose_eval=False)
            info = xgb.__version__
        else:
            import catboost as cb
            import numpy as np

            pool, pv = cb.Pool(x, y, group_id=np.repeat(np.arange(len(g)), g)), \
                cb.Pool(xv, yv, group_id=np.repeat(np.arange(len(gv)), gv))
            t0 = time.perf_counter()
            cb.CatBoost({"loss_function": "LambdaMart:metric=NDCG;top=10", "depth": 6, "learning_rate": 0.1,
                         "iterations": n, "thread_count": args.threads, "verbose": False,
                         "eval_metric": "NDCG:top=10"}).fit(pool, eval_set=pv)
            info = cb.__version__
        times.append(time.perf_counter() - t0)
    return {"ms_per_round": 1e3 * min(times) / n, "all": [1e3 * t / n for t in times], "info": info}


def main_round_mq2008(args, passthrough) -> None:
    """Four boosters' ms per round on MQ2008 Fold1, side by side in one run."""
    lines = ["| library | ms per round (best of %d) | all fits | vs LightGBM | version / backend |" % args.repeats,
             "|---|---:|---|---:|---|"]
    results = {}
    for name in args.libraries.split(","):
        r = run_one(name, passthrough)
        if r is None:
            continue
        results[name] = r
        print(name, r, flush=True)
    base = results.get("lightgbm", {}).get("ms_per_round")
    for name, r in results.items():
        ratio = f"{r['ms_per_round'] / base:.2f}x" if base else "-"
        lines.append(f"| {name} | {r['ms_per_round']:.2f} | {', '.join(f'{v:.2f}' for v in r['all'])} | {ratio} | "
                     f"{r['info']} |")
    cmd = " ".join(["python experiments/bench_boosting.py", *passthrough, "--write"])
    body = (f"## Boosting: ms per round on MQ2008 Fold1, four boosters ({args.threads} thread(s))\n\n"
            f"{_machine(args)}, {args.threads} thread(s). Command: `{cmd}`.\n\n200 rounds of depth 6 (LightGBM: "
            f"64 leaves, max_depth 6; CatBoost LambdaMart top 10, oblivious), lr 0.1, NDCG@10, vali as the one eval "
            f"set scored every round, no early stopping; each library in its own process, best of the fits. rankkit "
            f"with experiments/mq2008_lambdamart.py's settings.\n\n" + "\n".join(lines) + "\n")
    _write(args, f"bench_boosting_round_mq2008_t{args.threads}", body)


def main_trees(args, passthrough) -> None:
    """One depth-D tree on MQ2008 Fold1 (the first round's lambdas) by each tree backend: the
    fused compiled CPU kernels, the unfused ones (a data-parallel run's path) and the torch
    reference; median wall and process CPU ms of --rounds trees after a warm-up tree."""
    import torch

    from rankkit.boosting._inputs import FeatureMatrix
    from rankkit.boosting.engine import BoosterConfig, BoostingEngine, transform
    from rankkit.boosting.tree import ObliviousTreeGrower
    from rankkit.data.bundled import load_mq2008
    from rankkit.kernels import cpu

    torch.set_num_threads(args.threads)
    train, _, _ = load_mq2008(1)
    engine = BoostingEngine(train.features, train.labels, train.sizes,
                            BoosterConfig(depth=args.depth, k=10, normalize=True))
    grad, hess = engine.objective.gradients(engine.scores, engine.layout)
    codes = transform(engine.binner, FeatureMatrix(train.features, "features"))[:, engine.used]
    valid = engine.grower.valid_codes
    variants = [("torch reference", dict(backend="torch"))]
    if cpu.available():
        variants = [("compiled, one call per tree", dict(backend="cpu")),
                    ("compiled, unfused (data-parallel path)", dict(backend="cpu", reduce=lambda t: t)), *variants]
    lines = ["| backend | wall ms per tree | CPU ms per tree |", "|---|---:|---:|"]
    for name, kw in variants:
        grower = ObliviousTreeGrower(codes, valid, engine.config.tree, **kw)
        grower.grow(grad, hess)
        wall, cpu_t = [], []
        for _ in range(args.rounds):
            t0, c0 = time.perf_counter(), time.process_time()
            grower.grow(grad, hess)
            wall.append(time.perf_counter() - t0)
            cpu_t.append(time.process_time() - c0)
        lines.append(f"| {name} | {1e3 * statistics.median(wall):.2f} | {1e3 * statistics.median(cpu_t):.2f} |")
        print(lines[-1], flush=True)
    cmd = " ".join(["python experiments/bench_boosting.py", *passthrough, "--write"])
    body = (f"## Boosting: one tree by backend (MQ2008 Fold1)\n\n{_machine(args)}, {args.threads} thread(s). "
            f"Command: `{cmd}`.\n\n9,630 documents x 40 binned features, depth {args.depth}, the first round's "
            f"lambdas; median of {args.rounds} trees after a warm-up. The three grow the same trees "
            f"(tests/kernels/test_backends.py). CPU ms is the process's CPU time (all threads): on a loaded machine "
            f"it moves less than the wall time.\n\n" + "\n".join(lines) + "\n")
    _write(args, "bench_boosting_trees", body)


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
    ap.add_argument("--mode", default="round", choices=("round", "fit", "scaling", "mq2008", "trees", "round_mq2008"),
                    help="round: ms per round (default); fit: whole fit incl. binning; scaling: ms per "
                         "round by rows and threads; mq2008: MQ2008 5-fold training time")
    ap.add_argument("--rows", default="100000,300000,1200000,3800000",
                    help="--mode scaling: the row counts (queries of --docs documents)")
    ap.add_argument("--thread-list", default="1,2", help="--mode scaling: the thread counts")
    ap.add_argument("--quantized", action="store_true", help="rankkit with quantized_grad")
    ap.add_argument("--quant-bins", type=int, default=4, help="with --quantized: num_grad_quant_bins")
    ap.add_argument("--shape", default="uniform", choices=("uniform", "heavy"),
                    help="heavy: ~queries x docs rows in log-uniform 5..1000-document queries, heavy-tailed features")
    ap.add_argument("--repeats", type=int, default=3, help="--mode round_mq2008: fits per library (best kept)")
    ap.add_argument("--only", help=argparse.SUPPRESS)
    ap.add_argument("--write", action="store_true", help="write the docs/benchmarks.md section")
    args = ap.parse_args(argv)
    if args.only and args.mode == "round_mq2008":
        print(json.dumps(round_mq2008(args.only, args)))
        return
    if args.only:
        prefix = {"round": "bench", "scaling": "bench"}.get(args.mode, args.mode)
        print(json.dumps(globals()[f"{prefix}_{args.only}"](args)))
        return
    passthrough = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--write"]
    if args.mode != "round":
        {"fit": main_fit, "scaling": main_scaling, "mq2008": main_mq2008, "trees": main_trees,
         "round_mq2008": main_round_mq2008}[args.mode](args, passthrough)
        return
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
            label = (f"rankkit ({args.device}; lambda pass {r['lambda_ms']:.0f} ms + tree "
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



def _libraries(args) -> list[str]:
    return [name for name in args.libraries.split(",") if name in ("rankkit", "rankkit_quantized", "lightgbm")]


def _machine(args) -> str:
    return (f"{datetime.date.today()}, {platform.machine()}, {os.cpu_count()} CPU cores shared with other jobs (load "
            f"average {LOAD_AT_START:.1f} at the start)")


def _write(args, marker: str, body: str) -> None:
    print(body)
    if args.write:
        from _report import write_section

        write_section(marker, body)


def main_fit(args, passthrough) -> None:
    """Whole fit, binning included, rankkit against LightGBM, each in its own process."""
    results = {}
    for name in _libraries(args):
        results[name] = run_one(name, passthrough)
        print(f"{name}: {results[name]}", flush=True)
    lgb_s = results.get("lightgbm", {}).get("fit_s")
    lines = ["| library | fit incl. binning (s) | vs LightGBM | peak memory over the data (MiB) |",
             "|---|---:|---:|---:|"]
    for name, r in results.items():
        ratio = f"{r['fit_s'] / lgb_s:.2f}x" if lgb_s else "-"
        lines.append(f"| {name} | {r['fit_s']:.1f} | {ratio} | {r['peak_mib']:.0f} |")
    n = args.queries * args.docs
    cmd = " ".join(["python experiments/bench_boosting.py", *passthrough, "--write"])
    if args.shape == "heavy":
        body = (f"## Boosting: whole fit including binning, long-tailed queries and heavy-tailed features\n\n"
                f"{_machine(args)}, {args.threads} threads per library. Command: `{cmd}`.\n\n"
                f"About {n:,} rows x {args.features} features: queries of log-uniform length 5..1000 "
                f"(experiments/bench_boosting.py's heavy_tailed), every second feature sign(z)(e^(2|z|) - 1) of its standardised value z; "
                f"{args.rounds} rounds of depth {args.depth}, lambdarank NDCG, truncation {args.k or 'none'}; each "
                f"library in its own process, one after the other (ratios from the same run). Target (issue 24): "
                f"rankkit <= 0.5x LightGBM.\n\n" + "\n".join(lines) + "\n")
        _write(args, "bench_boosting_fit_heavy", body)
        return
    body = (f"## Boosting: whole fit including binning\n\n{_machine(args)}, {args.threads} threads per "
            f"library. Command: `{cmd}`.\n\nSynthetic MSLR-shaped set, {args.queries} queries x {args.docs} "
            f"docs x {args.features} features = {n:,} rows; {args.rounds} rounds of depth {args.depth}, "
            f"lambdarank NDCG, truncation {args.k or 'none'}; each library in its own process, one after the "
            f"other (ratios from the same run); rankkit_quantized is rankkit with `quantized_grad=True`, "
            f"`num_grad_quant_bins={args.quant_bins}`. Target: rankkit <= 0.5x LightGBM.\n\n" + "\n".join(lines) + "\n")
    _write(args, "bench_boosting_fit", body)


def main_scaling(args, passthrough) -> None:
    """ms per round (median of --rounds) and peak memory by rows and threads."""
    rows = [int(r) for r in args.rows.split(",")]
    threads = [int(t) for t in args.thread_list.split(",")]
    lines = ["| rows | threads | rankkit ms/round (lambda + tree) | LightGBM ms/round | rankkit / LightGBM | "
             "rankkit peak MiB | LightGBM peak MiB |", "|---:|---:|---:|---:|---:|---:|---:|"]
    base, skip = [], False  # the passed options without the ones set per cell
    for a in passthrough:
        if skip or a.split("=")[0] in ("--rows", "--thread-list", "--queries", "--threads"):
            skip = not skip and "=" not in a
            continue
        base.append(a)
    for n in rows:
        for t in threads:
            argv = [*base, "--queries", str(max(1, n // args.docs)), "--threads", str(t)]
            r = {name: run_one(name, argv) for name in _libraries(args)}
            print(n, t, r, flush=True)
            rk, lg = r.get("rankkit"), r.get("lightgbm")
            cell = f"{rk['ms_per_round']:.0f} ({rk['lambda_ms']:.0f} + {rk['tree_ms']:.0f})" if rk else "-"
            ratio = f"{rk['ms_per_round'] / lg['ms_per_round']:.2f}x" if rk and lg else "-"
            lines.append(f"| {n:,} | {t} | {cell} | {lg['ms_per_round']:.0f} | {ratio} | "
                         f"{rk['peak_mib']:.0f} | {lg['peak_mib']:.0f} |" if lg else f"| {n:,} | {t} | {cell} | - | - | - | - |")
    cmd = " ".join(["python experiments/bench_boosting.py", *passthrough, "--write"])
    body = (f"## Boosting: ms per round by rows and threads, depth {args.depth}\n\n{_machine(args)}. Command: "
            f"`{cmd}`.\n\nSynthetic MSLR-shaped sets ({args.docs} docs per query, {args.features} features); "
            f"median of {args.rounds} rounds after the first; each library and size in its own process; peak "
            f"resident memory above the level once the data was made. Rows are the queries x {args.docs}.\n\n"
            + "\n".join(lines) + "\n")
    _write(args, "bench_boosting_scaling", body)


def main_mq2008(args, passthrough) -> None:
    """MQ2008 5-fold protocol (early stopping 50 on vali NDCG@10): training seconds per fold."""
    results = {}
    for name in _libraries(args):
        raw = run_one(name, passthrough)
        results[name] = {int(k): v for k, v in raw.items()}
        print(f"{name}: {results[name]}", flush=True)
    lines = ["| fold | rankkit fit (s) | rankkit rounds | LightGBM fit (s) | LightGBM rounds | rankkit ms/round | "
             "LightGBM ms/round |", "|---:|---:|---:|---:|---:|---:|---:|"]
    rk, lg = results.get("rankkit", {}), results.get("lightgbm", {})
    for fold in range(1, 6):
        a, b = rk.get(fold, (float("nan"), 0)), lg.get(fold, (float("nan"), 0))
        lines.append(f"| {fold} | {a[0]:.2f} | {a[1]} | {b[0]:.2f} | {b[1]} | {1e3 * a[0] / max(a[1], 1):.1f} | "
                     f"{1e3 * b[0] / max(b[1], 1):.1f} |")
    cmd = " ".join(["python experiments/bench_boosting.py", *passthrough, "--write"])
    body = (f"## Boosting: MQ2008 5-fold training time\n\n{_machine(args)}, {args.threads} thread(s). Command: "
            f"`{cmd}`.\n\nEach fold's fit with early stopping (patience 50 on vali NDCG@10, up to 2000 rounds): "
            f"rankkit with experiments/mq2008_lambdamart.py's settings, LightGBM lambdarank with the same depth, "
            f"learning rate, L2, min_data_in_leaf and truncation (64 leaves). The fits stop at different rounds, "
            f"so ms per round is the fairer column. Target: rankkit's time <= LightGBM's.\n\n"
            + "\n".join(lines) + "\n")
    _write(args, "bench_boosting_mq2008", body)


if __name__ == "__main__":
    main()
