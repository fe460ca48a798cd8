"""Data-parallel LambdaMART: ms per round on 1 process x 2 threads against 2 processes x 1 thread
(gloo, ``torchrun``), the bytes each rank sends per round, the all-reduce's share of the round,
and a communication model for W GPUs on NCCL (modelled, not measured).

Notation: N documents, F features, D depth, W ranks, K nodes at a level.

The data is experiments/bench_boosting.py's MSLR-shaped synthetic set (by default 10k queries x
120 documents x 136 features = 1.2M rows). Each configuration runs in its own process group:
one plain process for "1 x 2 threads", ``python -m torch.distributed.run --standalone
--nproc_per_node 2`` for "2 x 1 thread"; every rank builds the same data and keeps its shard of
whole queries (``rankkit.boosting.distributed.shard``), as in tests/boosting/test_distributed.py.

The traffic is counted by wrapping ``torch.distributed.all_reduce`` and ``all_gather`` in the
rank's process (the engine builds its own ``AllReduce``, which calls them at every use): the
bytes of the tensor each rank contributes (``numel * element_size``) and the wall time spent
inside the call. That time is the transfer *plus* the wait for the slower rank; to split the
two, the last round's calls are replayed after a barrier (same shapes, same order, no compute
in between): the replay is the transfer alone.

    python experiments/bench_distributed.py --write
    python experiments/bench_distributed.py --queries 1000 --rounds 2      # a quick look

``--write`` replaces the ``bench_distributed`` section of docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

LOAD_AT_START = os.getloadavg()


class Traffic:
    """Counts what this rank sends through ``torch.distributed`` collectives, and the time in them.

    ``calls`` keeps (op, shape, dtype) of every call since the last :meth:`reset`, for a replay.
    """

    def __init__(self, dist):
        self.dist = dist
        self.real = {"all_reduce": dist.all_reduce, "all_gather": dist.all_gather}
        dist.all_reduce = self._all_reduce
        dist.all_gather = self._all_gather
        self.reset()

    def reset(self) -> None:
        self.bytes, self.seconds, self.calls = 0, 0.0, []

    def _count(self, op: str, t, call):
        self.bytes += t.numel() * t.element_size()
        self.calls.append((op, tuple(t.shape), t.dtype))
        t0 = time.perf_counter()
        out = call()
        self.seconds += time.perf_counter() - t0
        return out

    def _all_reduce(self, tensor, *args, **kwargs):
        return self._count("all_reduce", tensor, lambda: self.real["all_reduce"](tensor, *args, **kwargs))

    def _all_gather(self, tensor_list, tensor, *args, **kwargs):
        return self._count("all_gather", tensor,
                           lambda: self.real["all_gather"](tensor_list, tensor, *args, **kwargs))

    def replay(self, calls, repeats: int = 5) -> float:
        """Median seconds of ``calls`` (all_reduce only) run back to back after a barrier."""
        import torch

        tensors = [torch.zeros(shape, dtype=dtype) for op, shape, dtype in calls if op == "all_reduce"]
        times = []
        for _ in range(repeats):
            self.dist.barrier()
            t0 = time.perf_counter()
            for t in tensors:
                self.real["all_reduce"](t)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)


def worker(args) -> None:
    """One rank (or the one process): build the engine, time ``--rounds`` rounds after a warm-up."""
    import torch
    import torch.distributed as dist

    from rankkit.boosting.distributed import shard
    from rankkit.boosting.engine import BoosterConfig, BoostingEngine
    from rankkit.data import make_synthetic

    torch.set_num_threads(args.threads)
    parallel = "LOCAL_RANK" in os.environ  # started by torch.distributed.run
    if parallel:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if parallel else 0
    data = make_synthetic(args.queries, args.docs, args.features, seed=0)
    if parallel:
        data = shard(data)
    traffic = Traffic(dist)
    t0 = time.perf_counter()
    engine = BoostingEngine(data.features, data.labels, data.sizes,
                            BoosterConfig(depth=args.depth, quantized_grad=args.quantized))
    setup_s, setup_bytes = time.perf_counter() - t0, traffic.bytes
    lambda_s = []
    gradients = engine.objective.gradients

    def timed_gradients(*a, **kw):
        t = time.perf_counter()
        out = gradients(*a, **kw)
        lambda_s.append(time.perf_counter() - t)
        return out

    engine.objective.gradients = timed_gradients
    rounds = []
    for _ in range(args.rounds + 1):  # the first is the warm-up
        traffic.reset()
        lambda_s.clear()
        t, cpu = time.perf_counter(), time.process_time()
        engine.update()
        rounds.append({"s": time.perf_counter() - t, "cpu_s": time.process_time() - cpu, "lambda_s": sum(lambda_s),
                       "bytes": traffic.bytes, "comm_s": traffic.seconds, "n_calls": len(traffic.calls)})
    timed = rounds[1:]
    out = {"rank": rank, "docs": data.n_docs, "setup_s": setup_s, "setup_bytes": setup_bytes,
           "used_features": len(engine.used), "rounds": timed,
           "ms": 1e3 * statistics.median(r["s"] for r in timed),
           "cpu_ms": 1e3 * statistics.median(r["cpu_s"] for r in timed),
           "lambda_ms": 1e3 * statistics.median(r["lambda_s"] for r in timed),
           "comm_ms": 1e3 * statistics.median(r["comm_s"] for r in timed),
           "bytes": statistics.median(r["bytes"] for r in timed),
           "calls": [(op, list(shape), str(dtype)) for op, shape, dtype in traffic.calls]}
    if parallel:
        out["replay_ms"] = 1e3 * traffic.replay(traffic.calls)
        dist.destroy_process_group()
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)


def run_config(args, processes: int, threads: int, quantized: bool) -> list[dict]:
    """One configuration in fresh processes; the per-rank results."""
    out = tempfile.mkdtemp(prefix="bench_distributed_")
    script = [os.path.abspath(__file__), "--worker", "--out", out, "--threads", str(threads),
              "--queries", str(args.queries), "--docs", str(args.docs), "--features", str(args.features),
              "--depth", str(args.depth), "--rounds", str(args.rounds)] + (["--quantized"] if quantized else [])
    if processes == 1:
        cmd = [sys.executable, *script]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
               str(processes), *script]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{cmd} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    results = []
    for rank in range(processes):
        with open(os.path.join(out, f"rank{rank}.json")) as f:
            results.append(json.load(f))
    return results


# -- the communication model (NCCL, modelled, not measured) ---------------------------------------

NVLINK_GBS = 450.0  # H100 SXM NVLink 4, per direction
IB_GBS = 50.0       # InfiniBand NDR, 400 Gb/s per GPU
HBM_GBS = 3350.0    # H100 SXM HBM3: the floor of one histogram pass over the codes
HOP_US = 5.0        # assumed latency of one ring step


def round_bytes(n_features: int, depth: int, value_bytes: int = 8) -> int:
    """Bytes all-reduced per round: the root's histograms [3, F, 1, 256], then at each level
    below it only the smaller children [3, F, K, 256] (K = 1, 2, .., 2^(D-2)), so Σ K = 2^(D-1);
    plus the leaf sums [2, 2^D] (the two quantization maxima, 32 bytes, are left out)."""
    return 3 * n_features * 256 * (1 << (depth - 1)) * value_bytes + 2 * (1 << depth) * 8


def ring_steps(w: int, per_node: int = 8) -> int:
    """Sequential steps of one all-reduce: a ring inside the node (2(W-1) for W <= 8), then a ring
    across the nodes (NCCL's hierarchical all-reduce: 2 (nodes - 1) more)."""
    inside = min(w, per_node)
    return 2 * (inside - 1) + 2 * (max(1, w // per_node) - 1)


def model_table(args) -> str:
    f, d = args.features, args.depth
    mb = round_bytes(f, d) / 1e6
    lines = ["| docs | W GPUs | link | histogram MB per round | per-GPU traffic (2(W-1)/W) MB | all-reduce ms/round "
             "(bandwidth) | + ring latency ms | compute floor ms/round | comm share at most | comm s per 1000 rounds |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    calls = d + 1  # one all-reduce per level (the root, then D-1 smaller-children sets) + leaf sums
    for docs in (3_800_000, 38_000_000, 380_000_000):
        for w, link, gbs in ((2, "NVLink", NVLINK_GBS), (8, "NVLink", NVLINK_GBS), (16, "IB NDR", IB_GBS),
                             (64, "IB NDR", IB_GBS), (256, "IB NDR", IB_GBS)):
            moved = 2 * (w - 1) / w * round_bytes(f, d)
            bw_ms = 1e3 * moved / (gbs * 1e9)
            lat_ms = calls * ring_steps(w) * HOP_US / 1e3
            floor_ms = 1e3 * d * (docs / w) * f / (HBM_GBS * 1e9)  # each level reads the shard's codes once
            share = (bw_ms + lat_ms) / (bw_ms + lat_ms + floor_ms)
            lines.append(f"| {docs / 1e6:g}M | {w} | {link} | {mb:.1f} | {moved / 1e6:.1f} | {bw_ms:.2f} | "
                         f"{lat_ms:.2f} | {floor_ms:.2f} | {100 * share:.0f}% | {(bw_ms + lat_ms):.1f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=10_000)
    ap.add_argument("--docs", type=int, default=120)
    ap.add_argument("--features", type=int, default=136)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds after one warm-up (the median is reported)")
    ap.add_argument("--threads", type=int, default=2, help=argparse.SUPPRESS)
    ap.add_argument("--quantized", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--write", action="store_true", help="write the docs/benchmarks.md section")
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        return
    rows = []
    for quantized in (False, True):
        for processes, threads in ((1, 2), (2, 1), (1, 1)):
            ranks = run_config(args, processes, threads, quantized)
            rows.append((processes, threads, quantized, ranks))
            print(processes, threads, quantized, [{k: v for k, v in r.items() if k not in ("calls", "rounds")}
                                                  for r in ranks], flush=True)
    print(json.dumps(rows[-1][3][0]["calls"]))
    measured = ["| quantized_grad | processes x threads | ms per round (rank 0) | CPU ms of rank 0 | "
                "lambda kernel ms | vs 1 x 2 | MB sent per round per rank | all-reduce ms (rank 0 / rank 1) | share of round | "
                "replayed all-reduce ms | setup s (binning) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    base = {}
    for processes, threads, quantized, ranks in rows:
        r0 = ranks[0]
        if (processes, threads) == (1, 2):
            base[quantized] = r0["ms"]
        comm = " / ".join(f"{r['comm_ms']:.0f}" for r in ranks) if processes > 1 else "-"
        share = f"{100 * r0['comm_ms'] / r0['ms']:.0f}%" if processes > 1 else "-"
        replay = f"{r0['replay_ms']:.0f}" if processes > 1 else "-"
        mb = f"{r0['bytes'] / 1e6:.2f}" if processes > 1 else "-"
        measured.append(f"| {quantized} | {processes} x {threads} | {r0['ms']:.0f} | {r0['cpu_ms']:.0f} | {r0['lambda_ms']:.0f} | "
                        f"{r0['ms'] / base[quantized]:.2f}x | {mb} | {comm} | {share} | {replay} | "
                        f"{r0['setup_s']:.1f} |")
    dp = rows[1][3][0]
    n = args.queries * args.docs
    cmd = " ".join(["python experiments/bench_distributed.py", *(argv if argv is not None else sys.argv[1:])])
    import rankkit

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    source = os.path.dirname(os.path.dirname(os.path.abspath(rankkit.__file__)))
    if source != os.path.dirname(os.path.dirname(os.path.abspath(__file__))):
        cmd = f"PYTHONPATH={source} {cmd}"  # a clean export of a commit, not the working tree
        if os.path.exists(os.path.join(source, "COMMIT")):
            commit = open(os.path.join(source, "COMMIT")).read().strip()
    body = (
        "## Data-parallel LambdaMART (issue 17)\n\n"
        f"2026-11-24, {platform.machine()}, {os.cpu_count()} CPU cores shared with other agents' jobs (load average "
        f"{LOAD_AT_START[0]:.1f} / {LOAD_AT_START[1]:.1f} / {LOAD_AT_START[2]:.1f} over 1 / 5 / 15 min at the start: "
        f"the cores were oversubscribed, so absolute times are inflated and noisy). rankkit at commit "
        f"{commit}. Command: `{cmd}`.\n\n"
        f"### Measured: 1 process x 2 threads against 2 processes x 1 thread (gloo)\n\n"
        f"Synthetic MSLR-shaped set (experiments/bench_boosting.py's): {args.queries} queries x {args.docs} docs x "
        f"{args.features} features = {n:,} rows ({dp['used_features']} features binned); depth {args.depth}, "
        f"lambdarank NDCG, no truncation, no eval set; median of {args.rounds} rounds after a warm-up round. "
        "2 x 1 runs under `python -m torch.distributed.run --standalone --nproc_per_node 2`, each rank with "
        "its shard of whole queries. *MB sent* counts the tensors this rank passes to "
        "`torch.distributed.all_reduce` (monkeypatched in the benchmark's process). *all-reduce ms* is the wall "
        "time inside those calls: the transfer plus the wait for the other rank; *replayed* runs the last round's "
        f"{len(dp['calls'])} all-reduces again back to back after a "
        "barrier: the transfer alone (loopback TCP through gloo). *CPU ms*: the process's CPU time in the round "
        "(all its threads); well below the wall time, it waited (for the other rank or for a core).\n\n"
        + "\n".join(measured) + "\n\n"
        f"Per round and rank: {round_bytes(dp['used_features'], args.depth) / 1e6:.2f} MB expected from the shapes "
        f"(3 x {dp['used_features']} features x 256 codes x 2^(D-1) = {1 << (args.depth - 1)} nodes x 8 bytes, plus "
        "the leaf sums); quantized histograms are int64, so they move as many bytes as the float64 ones.\n\n"
        "### Modelled, not measured: W GPUs on NCCL\n\n"
        f"Per round the engine all-reduces the root's histograms [3, F, 1, 256] and, at each of the D-1 levels "
        "below, only the smaller child of every pair [3, F, K, 256] (the sibling is the parent minus it, on "
        "every rank): Σ K = 2^(D-1) node histograms per round, "
        f"{round_bytes(args.features, args.depth) / 1e6:.1f} MB at F = {args.features}, D = {args.depth}, 8-byte "
        "values, **whatever the number of documents**. A ring all-reduce moves 2(W-1)/W of that per GPU; "
        f"bandwidth {NVLINK_GBS:.0f} GB/s per direction for NVLink (H100 SXM, W <= 8 in one node) and "
        f"{IB_GBS:.0f} GB/s for InfiniBand NDR (400 Gb/s, one NIC per GPU, W > 8); ring latency "
        f"{args.depth + 1} calls x (2(min(W, 8)-1) + 2(W/8-1)) steps (a ring in each 8-GPU node, then one "
        f"across the nodes) x {HOP_US:.0f} us per step (assumed). *Compute floor*: one read of the shard's uint8 codes per level "
        f"(D x N/W x F bytes) at {HBM_GBS:.0f} GB/s HBM3, a lower bound of a GPU round (the scatter-adds, "
        "lambdas and split search come on top), so *comm share* is an upper bound. MSLR-WEB30K is 3.8M docs "
        "x 136 features; 380M docs is 100 times that. int32 quantized histograms would halve the MB columns.\n\n"
        + model_table(args) + "\n")
    print(body)
    if args.write:
        from _report import write_section

        write_section("bench_distributed", body)


if __name__ == "__main__":
    main()
