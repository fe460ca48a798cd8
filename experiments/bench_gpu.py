"""The first thing to run on a GPU: the LambdaMART round at MSLR-WEB30K size, every kernel's
route, side-by-side times and an identity check against the CPU reference.

    python experiments/bench_gpu.py                        # on a CUDA machine: measure, print
    python experiments/bench_gpu.py --json results/gpu.json --write   # + JSON and docs/benchmarks.md
    python experiments/bench_gpu.py --device cpu --queries 40 --features 8 --rounds 3
                                                           # smoke run of the same code on a CPU

Without a CUDA device (and without ``--device cpu``) it prints what it would measure and exits.

What it measures, in one run on one device:

* **Data like MSLR-WEB30K**: ``--queries`` queries (31,531) whose lengths follow a log-normal
  long tail up to 1,251 (3.77 M documents at full size; the lengths of
  :func:`experiments.gpu_report.mslr_lengths`), ``--features`` (136) heavy-tailed features --
  a third mostly zero (a hot bin holding 60–95 % of the documents), a third integer counts,
  a third log-normal -- and labels 0..4 skewed low from a noisy latent score. An eval set of a
  tenth of the queries.
* **Routes**: which backend each kernel of the round took (the Triton kernels launched in a
  round are counted by name; a kernel with no Triton launch ran on the torch path).
* **Times** (wall, around ``torch.cuda.synchronize()``, median over rounds after a warm-up):
  the real round (``BoostingEngine.update``: lambdas, tree, leaves, score updates, eval
  metric) with an eval set, default and quantized; the lambda pass alone on the Triton and on
  the torch path, side by side; a whole ``LambdaMART.fit``. Peak memory of a round.
* **Identity**: the device's trees against the CPU reference's on a subset (same splits,
  leaves within float32 rounding of the lambdas), and with ``quantized_grad`` the Triton
  route against the torch route on the same device, bit for bit (the quantization's
  stochastic rounding draws from the device's generator, so CPU and GPU draw differently).
* A JSON record: device, driver, CUDA, torch and Triton versions, the command, every figure.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import NamedTuple

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpu_report import mslr_lengths  # noqa: E402



class Data(NamedTuple):
    features: torch.Tensor  # [N, F] float32
    labels: torch.Tensor    # [N] float32
    sizes: torch.Tensor     # [Q] long

PLAN = """bench_gpu.py: no CUDA device here, so nothing was measured. On a GPU it would:
  1. build an MSLR-like set: {queries:,} queries (log-normal lengths up to 1,251), {features}
     heavy-tailed features (hot bins), labels 0..4, and an eval set of a tenth of the queries;
  2. print the route of every kernel of a LambdaMART round (Triton launches counted by name);
  3. time {rounds} rounds of BoostingEngine.update (depth {depth}, eval set), default and
     quantized_grad; the lambda pass on the Triton and the torch path side by side; a whole
     LambdaMART.fit; peak memory;
  4. check the device's trees against the CPU reference (same splits; quantized: the Triton
     route against the torch route bit for bit);
  5. write a JSON record (device, driver, CUDA, torch, Triton versions, every figure).
Run it with --device cpu (and small --queries / --features) to exercise the same code here."""


def mslr_like(queries: int, features: int, seed: int) -> Data:
    """An MSLR-shaped synthetic set (see the module docstring)."""
    rng = np.random.default_rng(seed)
    full = mslr_lengths(seed)
    sizes = full[rng.permutation(len(full))[:queries]] if queries <= len(full) else \
        rng.choice(full, queries)
    n = int(sizes.sum())
    latent = rng.normal(size=n)
    x = np.empty((n, features), dtype=np.float32)
    for f in range(features):
        kind = f % 3
        signal = latent * (0.8 if f < max(1, features // 4) else 0.0)
        if kind == 0:  # mostly zero: a hot bin
            hot = rng.random(n) < rng.uniform(0.6, 0.95)
            x[:, f] = np.where(hot, 0.0, np.exp(rng.normal(size=n) + signal))
        elif kind == 1:  # integer counts
            x[:, f] = rng.poisson(np.exp(0.5 * signal + rng.normal(0.5, 1.0)))
        else:  # log-normal, long tail
            x[:, f] = np.exp(1.5 * rng.normal(size=n) + signal)
    score = latent + rng.normal(scale=0.7, size=n)
    labels = np.digitize(score, np.quantile(score, [0.5, 0.8, 0.93, 0.98])).astype(np.float32)
    return Data(torch.from_numpy(x), torch.from_numpy(labels), torch.from_numpy(sizes))


def subset(data: Data, queries: slice) -> Data:
    starts = torch.cat([torch.zeros(1, dtype=torch.long), data.sizes.cumsum(0)])
    q0, q1 = queries.start, min(queries.stop, len(data.sizes))
    a, b = int(starts[q0]), int(starts[q1])
    return Data(data.features[a:b], data.labels[a:b], data.sizes[q0:q1])


@contextlib.contextmanager
def triton_launches():
    """Count the Triton kernels launched inside the block, by name (real GPU or interpreter)."""
    counts = collections.Counter()
    patched = []
    try:
        import triton.runtime.jit as jit

        patched.append((jit.JITFunction, "run", jit.JITFunction.run))
        import triton.runtime.interpreter as interp

        patched.append((interp.InterpretedFunction, "run", interp.InterpretedFunction.run))
    except ImportError:
        pass
    for owner, name, run in patched:
        def counted(self, *a, _run=run, **k):
            counts[getattr(self, "__name__", None) or self.fn.__name__] += 1
            return _run(self, *a, **k)
        setattr(owner, name, counted)
    try:
        yield counts
    finally:
        for owner, name, run in patched:
            setattr(owner, name, run)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def median_seconds(fn, device, repeats: int) -> float:
    """The median wall time of ``fn()`` over ``repeats`` calls, the device synchronised around each."""
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _config(args, **extra):
    from rankkit.boosting.engine import BoosterConfig

    return BoosterConfig(depth=args.depth, learning_rate=0.1, min_data_in_leaf=20, k=10, **extra)


def time_rounds(train, valid, config, device, rounds):
    """Median seconds per BoostingEngine.update with an eval set, the trees, peak MiB."""
    from rankkit.boosting.engine import BoostingEngine

    engine = BoostingEngine(train.features, train.labels, train.sizes, config, device=device)
    engine.add_eval_set(valid.features, valid.labels, valid.sizes)
    engine.update()  # warm-up: compiles, allocator
    times = []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for _ in range(rounds):
        _sync(device)
        t0 = time.perf_counter()
        engine.update()
        _sync(device)
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None
    return statistics.median(times), engine, peak


def routes(train, valid, config, device) -> dict:
    """{kernel of the round: route} from the Triton launches of one round."""
    from rankkit.boosting.engine import BoostingEngine

    engine = BoostingEngine(train.features, train.labels, train.sizes, config, device=device)
    engine.add_eval_set(valid.features, valid.labels, valid.sizes)
    with triton_launches() as launched:
        engine.update()
    which = lambda *names: "triton (" + ", ".join(f"{n} ×{launched[n]}" for n in names if launched[n]) + ")" \
        if any(launched[n] for n in names) else "torch"
    return {"lambdas": which("_flat_lambda_kernel", "_rank_kernel", "_lambda_kernel"),
            "level histogram": which("_histogram_kernel"),
            "levels (rows finished, siblings, split scan, pick)": which("_level_kernel"),
            "routing": which("_route_kernel"),
            "leaf sums": which("_exact_leaf_sums_kernel"),
            "score update": which("_score_update_kernel"),
            "eval set (update and NDCG@k)": which("_eval_ndcg_kernel"),
            "all Triton launches": dict(launched)}


def lambda_pass(train, device, repeats, route):
    """(median seconds, Triton kernels launched) of one lambda pass over the training queries
    with ``RANKKIT_TRITON=route``."""
    from rankkit.boosting.objectives import QueryLayout
    from rankkit.lambdas import lambda_gradients

    layout = QueryLayout(train.labels, train.sizes, None, device)
    scores = layout.pad(torch.randn(len(train.labels), generator=torch.Generator().manual_seed(0)).to(device))
    old = os.environ.get("RANKKIT_TRITON")
    os.environ["RANKKIT_TRITON"] = route
    try:
        fn = lambda: lambda_gradients(scores, layout.labels, mask=layout.mask, weighting="ndcg", k=10)
        with triton_launches() as launched:
            fn()
        seconds = median_seconds(fn, device, repeats)
    finally:
        if old is None:
            os.environ.pop("RANKKIT_TRITON", None)
        else:
            os.environ["RANKKIT_TRITON"] = old
    return seconds, dict(launched)


def trees_of(engine):
    return [(t.features.cpu(), t.codes.cpu(), t.leaf_values.cpu()) for t in engine.trees]


def identity(train, valid, args, device) -> dict:
    """The device's trees against the CPU reference's, and (quantized) Triton vs torch route."""
    small_train, small_valid = subset(train, slice(0, args.check_queries)), valid
    out = {}
    _, ref, _ = time_rounds(small_train, small_valid, _config(args), torch.device("cpu"), args.check_rounds)
    _, got, _ = time_rounds(small_train, small_valid, _config(args), device, args.check_rounds)
    same_splits = all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
                      for a, b in zip(trees_of(ref), trees_of(got)))
    worst = max(float(((a[2] - b[2]).abs() / b[2].abs().clamp_min(1e-12)).max())
                for a, b in zip(trees_of(got), trees_of(ref)))
    out["device_vs_cpu"] = {"same_splits": same_splits, "max_rel_leaf_diff": worst}
    runs = {}
    before = os.environ.get("RANKKIT_TRITON")
    try:
        for route in ("0", "auto"):
            os.environ["RANKKIT_TRITON"] = route
            _, runs[route], _ = time_rounds(small_train, small_valid, _config(args, quantized_grad=True),
                                            device, args.check_rounds)
    finally:
        if before is None:
            os.environ.pop("RANKKIT_TRITON", None)
        else:
            os.environ["RANKKIT_TRITON"] = before
    out["quantized_triton_vs_torch_bitwise"] = all(
        all(torch.equal(x, y) for x, y in zip(a, b)) for a, b in zip(trees_of(runs["auto"]), trees_of(runs["0"])))
    return out


def environment(device) -> dict:
    import importlib.util

    env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
           "torch": torch.__version__, "cuda_runtime": torch.version.cuda,
           "python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
           "triton": None, "device": str(device), "device_name": None, "driver": None}
    if importlib.util.find_spec("triton") is not None:
        import triton

        env["triton"] = triton.__version__
    if device.type == "cuda":
        env["device_name"] = torch.cuda.get_device_name(device)
        props = torch.cuda.get_device_properties(device)
        env["device_memory_gib"] = round(props.total_memory / 2**30, 1)
        env["sm"] = f"{props.major}{props.minor}"
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True, timeout=20).stdout.strip() or None
    return env


def gpu_baselines(train, valid, args) -> dict:
    """Seconds of XGBoost's (``device="cuda"``, hist) and LightGBM's (``device_type="cuda"``)
    GPU lambdarank on the same data, ``--fit-rounds`` rounds of depth ``--depth`` with the eval
    set, data set building included (as rankkit's fit includes binning); None where the library
    or its GPU build is missing."""
    out = {}
    x, y, g = train.features.numpy(), train.labels.numpy(), train.sizes.numpy()
    xv, yv, gv = valid.features.numpy(), valid.labels.numpy(), valid.sizes.numpy()
    try:
        import xgboost as xgb

        t0 = time.perf_counter()
        dt, dv = xgb.DMatrix(x, y, group=g), xgb.DMatrix(xv, yv, group=gv)
        xgb.train({"objective": "rank:ndcg", "max_depth": args.depth, "eta": 0.1, "device": "cuda",
                   "tree_method": "hist", "eval_metric": "ndcg@10"}, dt, num_boost_round=args.fit_rounds,
                  evals=[(dv, "vali")], verbose_eval=False)
        out["XGBoost"] = time.perf_counter() - t0
    except Exception:  # noqa: BLE001 - not installed, or a CPU-only build: recorded as missing
        out["XGBoost"] = None
    try:
        import lightgbm as lgb

        t0 = time.perf_counter()
        ds = lgb.Dataset(x, y, group=g)
        dv = lgb.Dataset(xv, yv, group=gv, reference=ds)
        lgb.train({"objective": "lambdarank", "max_depth": args.depth, "num_leaves": 2 ** args.depth,
                   "learning_rate": 0.1, "device_type": "cuda", "metric": "ndcg", "eval_at": [10],
                   "verbosity": -1}, ds, num_boost_round=args.fit_rounds, valid_sets=[dv])
        out["LightGBM"] = time.perf_counter() - t0
    except Exception:  # noqa: BLE001 - not installed, or built without CUDA
        out["LightGBM"] = None
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="cuda (default when present) or cpu (a smoke run)")
    ap.add_argument("--queries", type=int, default=31_531)
    ap.add_argument("--features", type=int, default=136)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--fit-rounds", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=10, help="lambda pass repeats")
    ap.add_argument("--check-queries", type=int, default=2_000)
    ap.add_argument("--check-rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the JSON record here")
    ap.add_argument("--write", action="store_true", help="put the table in docs/benchmarks.md")
    args = ap.parse_args(argv)
    if args.device is None and not torch.cuda.is_available():
        print(PLAN.format(**vars(args)))
        return None
    device = torch.device(args.device or "cuda")
    record = {"environment": environment(device), "args": vars(args)}
    data = mslr_like(args.queries + max(1, args.queries // 10), args.features, args.seed)
    train, valid = subset(data, slice(0, args.queries)), subset(data, slice(args.queries, len(data.sizes)))
    record["data"] = {"train_docs": int(train.sizes.sum()), "train_queries": len(train.sizes),
                      "valid_docs": int(valid.sizes.sum()), "max_length": int(train.sizes.max()),
                      "features": args.features}
    print(json.dumps(record["environment"]), flush=True)
    print(f"data: {record['data']}", flush=True)

    record["routes"] = {}
    for name, config in (("default", _config(args)), ("quantized", _config(args, quantized_grad=True))):
        record["routes"][name] = routes(train, valid, config, device)
        print(f"routes ({name}):", flush=True)
        for kernel, route in record["routes"][name].items():
            print(f"  {kernel:24s} {route}", flush=True)

    rows = []
    for name, label, config, graph in (
            ("default", "default", _config(args), "0"),
            ("default_graph", "default, as a CUDA graph (RANKKIT_CUDA_GRAPH=1)", _config(args), "1"),
            ("quantized_grad", "quantized_grad", _config(args, quantized_grad=True), "0")):
        os.environ["RANKKIT_CUDA_GRAPH"] = graph  # read when the engine's backend is made
        try:
            seconds, engine, peak = time_rounds(train, valid, config, device, args.rounds)
        finally:
            os.environ.pop("RANKKIT_CUDA_GRAPH")
        record[f"round_{name}_graph"] = repr(engine.round_state.get("graph"))
        record[f"round_{name}_ms"], record[f"round_{name}_peak_mib"] = seconds * 1e3, peak
        rows.append(f"| round, depth {args.depth}, eval set, {label} | {seconds * 1e3:,.2f} | "
                    f"{'–' if peak is None else f'{peak:,.0f}'} |")
        print(rows[-1], flush=True)
    for route in ("auto", "0"):
        seconds, launched = lambda_pass(train, device, args.repeats, route)
        took = "triton" if launched else "torch"
        record[f"lambda_{'auto' if route == 'auto' else 'torch'}_ms"] = seconds * 1e3
        record[f"lambda_{'auto' if route == 'auto' else 'torch'}_route"] = took
        rows.append(f"| lambda pass, NDCG@10, RANKKIT_TRITON={route} (ran: {took}) | {seconds * 1e3:,.2f} | – |")
        print(rows[-1], flush=True)
    from rankkit.boosting import LambdaMART

    model = LambdaMART(n_estimators=args.fit_rounds, depth=args.depth, k=10, device=str(device))
    _sync(device)
    t0 = time.perf_counter()
    model.fit(train.features, train.labels, group=train.sizes, eval_set=[(valid.features, valid.labels)],
              eval_group=[valid.sizes])
    _sync(device)
    record["fit_s"] = time.perf_counter() - t0
    rows.append(f"| LambdaMART.fit, {args.fit_rounds} rounds incl. binning, eval set | "
                f"{record['fit_s'] * 1e3:,.0f} | – |")
    print(rows[-1], flush=True)
    for name, seconds in gpu_baselines(train, valid, args).items():
        record[f"{name}_fit_s"] = seconds
        took = "not installed or no GPU build" if seconds is None else f"{seconds * 1e3:,.0f}"
        rows.append(f"| {name} GPU, {args.fit_rounds} rounds incl. its data set, eval set | {took} | – |")
        print(rows[-1], flush=True)
    record["identity"] = identity(train, valid, args, device)
    print(f"identity: {record['identity']}", flush=True)

    env = record["environment"]
    body = "\n".join([
        "## GPU: the LambdaMART round at MSLR-WEB30K size (experiments/bench_gpu.py)",
        "",
        f"{env['date']}, {env['device_name'] or env['device']}, driver {env['driver']}, CUDA "
        f"{env['cuda_runtime']}, torch {env['torch']}, triton {env['triton']}. Command: "
        f"`{env['command']}`. {record['data']['train_docs']:,} training documents in "
        f"{record['data']['train_queries']:,} queries (longest {record['data']['max_length']}), "
        f"{args.features} features; median of {args.rounds} rounds after a warm-up.",
        "",
        "| what | ms | peak MiB |",
        "|---|---:|---:|",
        *rows,
        "",
        "Routes (default round): " + "; ".join(f"{k}: {v}" for k, v in record["routes"]["default"].items()
                                               if k != "all Triton launches"),
        "",
        f"Identity: {record['identity']}",
    ])
    print(body)
    if args.json:
        from rankkit.infra.io import atomic_write

        def write(tmp):
            with open(tmp, "w") as f:
                json.dump(record, f, indent=1, default=str)
        atomic_write(args.json, write)
    if args.write:
        from _report import write_section

        write_section("bench_gpu", body)
    return record


if __name__ == "__main__":
    main()
