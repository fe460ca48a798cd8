"""Where a LambdaMART round's time goes on a GPU: the profile the GPU check brings back.

    python experiments/gpu_profile.py --out results/gpu_check --budget 140     # on a GPU
    python experiments/gpu_profile.py --device cpu --queries 30 --features 6 --out /tmp/p   # here
    python experiments/gpu_profile.py --render results/gpu_check/gpu_run.json  # docs/gpu_check.md

On the bench's MSLR-WEB30K-like data (experiments/bench_gpu.py ``mslr_like``, the seed of the
44.3 ms measurement), a depth-6 engine with an eval set, two warm-up rounds, then in order, each
step with min(its cap, the time left) and a failing step logged and skipped
(../shared/design/gpu-round.md §4):

1. **memory per round**: ``memory_allocated`` before and after 5 rounds (peak RSS on a CPU);
2. **phases**: 3 rounds with a device synchronisation around each phase of the round (the lambda
   pass, the tree's levels and leaves, the training and eval scores' updates, the one host copy):
   wall ms per phase per round, no library edits (the wrappers sit on the engine's objects);
3. **kernels**: ``torch.profiler`` over 3 rounds: every kernel with its calls per round, ms per
   round, mean µs and share of the round; the six histogram launches of a tree by level; the
   GPU's busy time against the rounds' wall time (the idle gaps); the top host ops; a chrome
   trace (gzipped);
4. the same kernel table for 2 rounds with ``quantized_grad``;
5. **lambda variants**, 10 repetitions each: the round's planned path, the public
   ``lambda_gradients`` (validates and plans on every call: what bench_gpu's 9.2 ms timed),
   ``k=None`` and the torch path;
6. a 2-round engine with ``k=None`` (every pair on both sides).

Writes ``gpu_run.json`` (every number, device, versions), ``profile.txt`` (the tables) and
``trace.json.gz`` into ``--out``, and prints the tables. ``--render`` turns a ``gpu_run.json``
into the markdown of docs/gpu_check.md.
"""
from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import resource
import shutil
import signal
import statistics
import sys
import tempfile
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_gpu import environment, median_seconds, mslr_like, subset, triton_launches  # noqa: E402


class StepTimeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise StepTimeout in the block after ``seconds`` (main thread, POSIX)."""
    def expire(signum, frame):
        raise StepTimeout(f"over its {seconds:.0f} s")
    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class Run:
    """The deadline and the record: each step gets min(its cap, the time left)."""

    def __init__(self, budget: float, record: dict):
        self.end = time.monotonic() + budget
        self.record = record
        record.setdefault("steps", {})

    def step(self, name: str, cap: float, fn):
        left = self.end - time.monotonic()
        if left < 1.0:
            self.record["steps"][name] = {"ok": False, "error": "skipped: no time left"}
            print(f"[{name}] skipped: no time left", flush=True)
            return None
        t0 = time.monotonic()
        try:
            with time_limit(min(cap, left)):
                out = fn()
            self.record["steps"][name] = {"ok": True, "s": round(time.monotonic() - t0, 2)}
            print(f"[{name}] done in {time.monotonic() - t0:.1f} s", flush=True)
            return out
        except Exception as e:  # noqa: BLE001 - logged and skipped: the other steps still count
            first = (str(e).strip().splitlines() or [""])[0]
            self.record["steps"][name] = {"ok": False, "error": f"{type(e).__name__}: {first}"[:400],
                                          "s": round(time.monotonic() - t0, 2)}
            print(f"[{name}] FAILED: {type(e).__name__}: {first}", flush=True)
            traceback.print_exc(limit=6)
            return None


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def engine_for(train, valid, device, graph: str = "0", **options):
    from rankkit.boosting.engine import BoosterConfig, BoostingEngine

    config = BoosterConfig(**{"depth": 6, "learning_rate": 0.1, "min_data_in_leaf": 20, "k": 10, **options})
    # Eager rounds (no CUDA graph) unless ``graph`` is "1": the profile times the round's phases,
    # whose Python a replay skips; graph_rounds times the round both ways.
    os.environ["RANKKIT_CUDA_GRAPH"] = graph
    try:
        engine = BoostingEngine(train.features, train.labels, train.sizes, config, device=device)
    finally:
        os.environ.pop("RANKKIT_CUDA_GRAPH")
    engine.add_eval_set(valid.features, valid.labels, valid.sizes)
    return engine


def memory_per_round(engine, device, rounds: int = 5) -> dict:
    sync(device)
    if device.type == "cuda":
        before = torch.cuda.memory_allocated()
        for _ in range(rounds):
            engine.update()
        sync(device)
        after = torch.cuda.memory_allocated()
        return {"unit": "device bytes allocated", "before": before, "after": after,
                "per_round": (after - before) / rounds}
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    for _ in range(rounds):
        engine.update()
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"unit": "peak RSS bytes (CPU)", "before": before, "after": after, "per_round": (after - before) / rounds}


# The phases of a round: (name, the object holding the method, its attribute).
def _phase_targets(engine):
    from rankkit.boosting import engine as engine_module

    return [("lambdas", engine.objective, "gradients"), ("tree (levels and leaves)", engine.backend, "grow"),
            ("train scores", engine.backend, "add_tree"),
            ("eval set: scores + metric", engine.backend, "score_eval_set"),
            ("host copy (the sync)", engine_module, "_round_on_host")]


@contextlib.contextmanager
def phases(engine, device):
    """Wrap each phase with a sync before and after and a record_function; yields {phase: [s]}."""
    times: dict[str, list[float]] = {}
    patched = []
    depth = [0]
    for name, owner, attr in _phase_targets(engine):
        original = getattr(owner, attr)

        def wrapped(*a, _f=original, _name=name, **k):
            if depth[0]:  # a phase inside another (score_eval_set calls add_tree): the outer counts
                return _f(*a, **k)
            depth[0] += 1
            sync(device)
            t0 = time.perf_counter()
            try:
                with torch.profiler.record_function(f"phase: {_name}"):
                    return _f(*a, **k)
            finally:
                sync(device)
                times.setdefault(_name, []).append(time.perf_counter() - t0)
                depth[0] -= 1
        patched.append((owner, attr, owner.__dict__.get(attr) if hasattr(owner, "__dict__") else None))
        setattr(owner, attr, wrapped)
    try:
        yield times
    finally:
        for owner, attr, before in patched:
            if before is None:
                delattr(owner, attr)
            else:
                setattr(owner, attr, before)


def phase_table(engine, device, rounds: int = 3) -> dict:
    with phases(engine, device) as times:
        sync(device)
        t0 = time.perf_counter()
        for _ in range(rounds):
            engine.update()
        sync(device)
        wall = time.perf_counter() - t0
    out = {name: 1e3 * sum(ts) / rounds for name, ts in times.items()}
    out["round (wall, phases synced)"] = 1e3 * wall / rounds
    return out


def _device_time(evt) -> float:
    """An event's own device time in µs (the attribute's name moved between torch releases)."""
    for attr in ("self_device_time_total", "self_cuda_time_total"):
        value = getattr(evt, attr, None)
        if value is not None:
            return float(value)
    return 0.0


def kernel_profile(engine, device, rounds: int, out_dir: str | None, name: str) -> dict:
    """torch.profiler over ``rounds`` rounds: the per-kernel table, histogram levels, busy/wall."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with triton_launches() as launched:
        sync(device)
        t0 = time.perf_counter()
        with profile(activities=activities, record_shapes=False) as prof:
            for _ in range(rounds):
                engine.update()
            sync(device)
        wall = time.perf_counter() - t0
    on_device = device.type == "cuda"
    averages = prof.key_averages()
    kernels = []
    for evt in averages:
        t = _device_time(evt) if on_device else float(evt.self_cpu_time_total)
        if t <= 0 or (on_device and str(getattr(evt, "device_type", "")).endswith("CPU")):
            continue
        kernels.append({"name": evt.key[:90], "calls_per_round": evt.count / rounds,
                        "ms_per_round": t / 1e3 / rounds, "mean_us": t / max(evt.count, 1)})
    kernels.sort(key=lambda r: -r["ms_per_round"])
    busy = sum(r["ms_per_round"] for r in kernels)
    for r in kernels:
        r["pct"] = 100.0 * r["ms_per_round"] / busy if busy else 0.0
    # The histogram launches in start order, grouped into the levels of each tree.
    levels: dict[int, list[float]] = {}
    hist = sorted((e for e in prof.events() if "_histogram_kernel" in e.name
                   and (not on_device or _device_time(e) > 0)), key=lambda e: e.time_range.start)
    per_tree = len(hist) // rounds if rounds else 0
    for i, e in enumerate(hist):
        level = i % per_tree if per_tree else 0
        levels.setdefault(level, []).append((_device_time(e) if on_device else e.cpu_time_total) / 1e3)
    host = sorted(((e.key, e.self_cpu_time_total / 1e3 / rounds, e.count / rounds) for e in averages),
                  key=lambda r: -r[1])[:15]
    if out_dir:
        with tempfile.TemporaryDirectory() as tmp:
            raw = os.path.join(tmp, "trace.json")
            prof.export_chrome_trace(raw)
            with open(raw, "rb") as src, gzip.open(os.path.join(out_dir, f"trace_{name}.json.gz"), "wb") as dst:
                shutil.copyfileobj(src, dst)
    return {"rounds": rounds, "wall_ms_per_round": 1e3 * wall / rounds, "busy_ms_per_round": busy,
            "idle_ms_per_round": 1e3 * wall / rounds - busy if on_device else None,
            "launches_per_round": {k: v / rounds for k, v in launched.items()},
            "kernels": kernels[:40], "histogram_levels_ms": {str(k): statistics.mean(v) for k, v in levels.items()},
            "host_ops": [{"name": k[:90], "ms_per_round": ms, "calls_per_round": c} for k, ms, c in host],
            "table": averages.table(sort_by="self_cuda_time_total" if on_device else "self_cpu_time_total",
                                    row_limit=40, max_name_column_width=60)}


def lambda_variants(engine, device, repeats: int) -> dict:
    """ms per call of the lambda pass: the round's planned path, the public API, k=None, torch."""
    from rankkit.boosting.objectives import make_objective
    from rankkit.objective import objective_spec
    from rankkit.kernels.backends import TorchBackend
    from rankkit.lambdas import lambda_gradients

    layout, scores = engine.layout, engine.scores
    padded = layout.pad(scores)
    k_none = make_objective(objective_spec("lambdarank", weighting="ndcg", k=None, sigma=1.0, gain="exp",
                                           normalize=False), seed=0, quantized_grad=False)
    variants = {
        "planned (the round's path)": lambda: engine.objective.gradients(scores, layout, backend=engine.backend),
        "public lambda_gradients (validates, plans)": lambda: lambda_gradients(
            padded, layout.labels, mask=layout.mask, weighting="ndcg", k=10),
        "planned, k=None": lambda: k_none.gradients(scores, layout, backend=engine.backend),
        "planned, torch path": lambda: engine.objective.gradients(scores, layout, backend=TorchBackend(device)),
    }
    out = {}
    for name, fn in variants.items():
        fn()  # warm-up
        out[name] = 1e3 * median_seconds(fn, device, repeats)
    return out


def graph_rounds(train, valid, device, rounds: int = 8) -> dict:
    """ms per round (median) eager and as a CUDA graph (``RANKKIT_CUDA_GRAPH=1``), each after two
    rounds (the graph's first eager, its second the capture), and whether both grew the same
    trees."""
    out, grown = {}, {}
    for mode, switch in (("eager", "0"), ("graph", "1")):
        engine = engine_for(train, valid, device, graph=switch)
        trees = [engine.update() for _ in range(2)]
        times = []
        for _ in range(rounds):
            sync(device)
            t0 = time.perf_counter()
            trees.append(engine.update())
            sync(device)
            times.append(time.perf_counter() - t0)
        out[f"{mode}_ms"] = 1e3 * statistics.median(times)
        grown[mode] = [(t.features.tolist(), t.codes.tolist(), t.leaf_values.tolist()) for t in trees]
        out[f"{mode}_state"] = repr(engine.round_state.get("graph"))
    out["same_trees"] = grown["eager"] == grown["graph"]
    return out


def round_k_none(train, valid, device) -> dict:
    engine = engine_for(train, valid, device, k=None)
    engine.update()
    sync(device)
    t0 = time.perf_counter()
    engine.update()
    sync(device)
    return {"round_ms": 1e3 * (time.perf_counter() - t0)}


def tables(record: dict) -> str:
    """The profile as text, the kernel table last (the reply keeps the last 12,000 characters)."""
    lines = [f"== profile on {record['environment'].get('device_name') or record['environment']['device']}"
             f" ({record['environment']['date']}), data {record.get('data')}"]
    for name, step in record["steps"].items():
        lines.append(f"  step {name}: {'ok' if step['ok'] else step['error']} ({step.get('s', 0)} s)")
    if record.get("memory"):
        m = record["memory"]
        lines.append(f"memory per round: {m['per_round'] / 2**20:+.2f} MiB ({m['unit']})")
    if record.get("phases"):
        lines.append("phases (ms per round, a sync around each):")
        lines += [f"  {k:34s} {v:9.3f}" for k, v in record["phases"].items()]
    if record.get("lambda_variants"):
        lines.append("lambda pass variants (ms per call):")
        lines += [f"  {k:44s} {v:9.3f}" for k, v in record["lambda_variants"].items()]
    if record.get("k_none"):
        lines.append(f"engine round with k=None: {record['k_none']['round_ms']:.2f} ms")
    if record.get("graph"):
        g = record["graph"]
        lines.append(f"round eager {g['eager_ms']:.3f} ms, as a CUDA graph {g['graph_ms']:.3f} ms "
                     f"(RANKKIT_CUDA_GRAPH=1; same trees: {g['same_trees']}; {g['graph_state']})")
    for name in ("quantized", "default"):
        prof = record.get(f"kernels_{name}")
        if not prof:
            continue
        lines.append(f"kernels, {name} round: wall {prof['wall_ms_per_round']:.3f} ms, busy "
                     f"{prof['busy_ms_per_round']:.3f} ms per round; Triton launches per round "
                     f"{sum(prof['launches_per_round'].values()):.0f}")
        lines.append("  histogram by level (ms): " + ", ".join(
            f"L{k} {v:.3f}" for k, v in prof["histogram_levels_ms"].items()))
        lines.append(f"  {'kernel':60s} {'calls':>6s} {'ms/round':>9s} {'mean us':>9s} {'%':>6s}")
        lines += [f"  {r['name'][:60]:60s} {r['calls_per_round']:6.1f} {r['ms_per_round']:9.3f} "
                  f"{r['mean_us']:9.1f} {r['pct']:6.1f}" for r in prof["kernels"][:25]]
    return "\n".join(lines)


def render(record: dict) -> str:
    """docs/gpu_check.md from a gpu_run.json."""
    env = record["environment"]
    head = [
        "# GPU check",
        "",
        f"Measured {env['date']} on {env.get('device_name') or env['device']} (driver {env.get('driver')}, "
        f"CUDA {env.get('cuda_runtime')}, torch {env['torch']}, triton {env.get('triton')}) by "
        "`bash experiments/gpu_check.sh` (its profile step: `experiments/gpu_profile.py`). Every figure "
        "below is measured on that device; none is modelled.",
        "",
        "```",
        tables(record),
        "```",
    ]
    if record.get("microbench"):
        from gpu_microbench import table

        head += ["", "```", table(record["microbench"]), "```"]
    if record.get("tests"):
        head += ["", "## Tests on the device", "", "```", record["tests"], "```"]
    return "\n".join(head) + "\n"


def main(argv=None) -> dict | None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="cuda (default when present) or cpu (proves the script)")
    ap.add_argument("--queries", type=int, default=31_531)
    ap.add_argument("--features", type=int, default=136)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget", type=float, default=140.0, help="seconds for every step together")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", default=None, help="folder for gpu_run.json, profile.txt, trace_*.json.gz")
    ap.add_argument("--render", default=None, metavar="GPU_RUN_JSON", help="print docs/gpu_check.md from a record")
    args = ap.parse_args(argv)
    if args.render:
        with open(args.render) as f:
            print(render(json.load(f)), end="")
        return None
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    record = {"environment": environment(device), "args": vars(args)}
    run = Run(args.budget, record)
    data = mslr_like(args.queries + max(1, args.queries // 10), args.features, args.seed)
    train, valid = subset(data, slice(0, args.queries)), subset(data, slice(args.queries, len(data.sizes)))
    record["data"] = {"train_docs": int(train.sizes.sum()), "queries": len(train.sizes),
                      "valid_docs": int(valid.sizes.sum()), "features": args.features}
    if args.out:
        os.makedirs(args.out, exist_ok=True)

    def warm():
        engine = engine_for(train, valid, device)
        engine.update(), engine.update()
        return engine

    engine = run.step("warm-up (2 rounds)", 60, warm)
    if engine is not None:
        record["memory"] = run.step("memory per round", 25, lambda: memory_per_round(engine, device))
        record["phases"] = run.step("phases", 20, lambda: phase_table(engine, device))
        record["kernels_default"] = run.step("kernels (default)", 30, lambda: kernel_profile(
            engine, device, 3, args.out, "default"))
        record["lambda_variants"] = run.step("lambda variants", 20, lambda: lambda_variants(
            engine, device, args.repeats))
        del engine

    def quantized():
        q = engine_for(train, valid, device, quantized_grad=True)
        q.update()
        return kernel_profile(q, device, 2, args.out, "quantized")

    record["kernels_quantized"] = run.step("kernels (quantized)", 30, quantized)
    record["k_none"] = run.step("round with k=None", 20, lambda: round_k_none(train, valid, device))
    record["graph"] = run.step("round as a CUDA graph", 30, lambda: graph_rounds(train, valid, device))
    text = tables(record)
    print(text, flush=True)
    if args.out:
        from rankkit.infra.io import atomic_write

        def dump(path, text_or_record):
            def write(tmp):
                with open(tmp, "w") as f:
                    if isinstance(text_or_record, str):
                        f.write(text_or_record)
                    else:
                        json.dump(text_or_record, f, indent=1, default=str)
            atomic_write(os.path.join(args.out, path), write)
        dump("gpu_run.json", record)
        full = text + "\n\n" + "\n\n".join(record[k]["table"] for k in ("kernels_default", "kernels_quantized")
                                          if record.get(k))
        dump("profile.txt", full)
    return record


if __name__ == "__main__":
    main()
