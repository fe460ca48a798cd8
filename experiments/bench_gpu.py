"""GPU figures at MSLR-WEB30K scale: the lambda kernel's full pass and one LambdaMART round.

    python experiments/bench_gpu.py                      # prints a Markdown section
    python experiments/bench_gpu.py --write              # and puts it in docs/benchmarks.md

MSLR-WEB30K has about 31.5k queries and 3.77M documents (about 120 a query). This script
builds a synthetic set of that shape (``rankkit.data.make_synthetic``, 31,531 queries x 120
documents, labels 0..4 skewed low) and times, on the GPU and on this machine's CPU in the same
run:

* one full pass of :func:`rankkit.lambdas.lambda_gradients` (NDCG weighting, grad and hess,
  no truncation and k = 10) over the padded [31531, 120] batch, float32;
* one depth-6 LambdaMART round (lambda kernel + histograms, split search, leaf values and the
  score update) on 136 features, through the same objects ``LambdaMART.fit`` uses.

GPU times are wall times around ``torch.cuda.synchronize()``, the median of several repeats
after a warm-up; CPU times likewise, with torch on every core of the machine unless
``--cpu-threads`` says otherwise. Peak GPU memory is ``torch.cuda.max_memory_allocated``
growth during the timed call. It needs a CUDA device.
"""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from rankkit.data import make_synthetic  # noqa: E402
from rankkit.lambdas import lambda_gradients  # noqa: E402


def _timed(fn, device, repeats):
    fn()  # warm-up (allocator, kernels, CPU thread pool)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _peak(fn, device):
    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def lambda_pass(data, device, repeats, k):
    from rankkit.boosting.objectives import QueryLayout

    layout = QueryLayout(data.labels, data.sizes, None, device)
    g = torch.Generator().manual_seed(0)
    scores = layout.pad(torch.randn(data.n_docs, generator=g).to(device))
    fn = lambda: lambda_gradients(scores, layout.labels, mask=layout.mask, weighting="ndcg", k=k)
    return _timed(fn, device, repeats), _peak(fn, device)


def boosting_round(data, device, repeats, depth):
    from rankkit.boosting.binning import QuantileBinner
    from rankkit.boosting.engine import valid_codes as _valid_codes
    from rankkit.boosting.objectives import QueryLayout, make_objective
    from rankkit.boosting.tree import ObliviousTreeGrower, TreeParams

    binner = QuantileBinner().fit(data.features)
    used = binner.used_features_
    codes = binner.transform(data.features)[:, used].to(device)
    grower = ObliviousTreeGrower(codes, _valid_codes(binner)[used], TreeParams(depth=depth))
    layout = QueryLayout(data.labels, data.sizes, None, device)
    objective = make_objective("lambdarank", weighting="ndcg")
    scores = torch.zeros(data.n_docs, dtype=torch.float64, device=device)
    parts = {"lambda": [], "tree": []}

    def one_round():
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        sync()
        t0 = time.perf_counter()
        grad, hess = objective.gradients(scores, layout)
        sync()
        t1 = time.perf_counter()
        tree = grower.grow(grad, hess)
        scores.add_(tree.leaf_values[tree.leaf_index])
        sync()
        parts["lambda"].append(t1 - t0)
        parts["tree"].append(time.perf_counter() - t1)

    one_round()  # warm-up
    for key in parts:
        parts[key].clear()
    for _ in range(repeats):
        one_round()
    peak = _peak(one_round, device)
    lam, tree = statistics.median(parts["lambda"][:repeats]), statistics.median(parts["tree"][:repeats])
    return lam, tree, peak


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=31_531)
    ap.add_argument("--docs", type=int, default=120)
    ap.add_argument("--features", type=int, default=136)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cpu-threads", type=int, default=os.cpu_count())
    ap.add_argument("--cpu-repeats", type=int, default=2)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_gpu.py needs a CUDA device")
    torch.set_num_threads(args.cpu_threads)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    data = make_synthetic(args.queries, args.docs, args.features, seed=0)
    n, pairs = data.n_docs, args.queries * args.docs * (args.docs - 1) // 2
    print(f"{args.queries} queries x {args.docs} docs = {n:,} documents, {pairs:,} pairs", flush=True)

    rows = []
    for k in (None, 10):
        gpu_s, gpu_mib = lambda_pass(data, cuda, args.repeats, k)
        cpu_s, _ = lambda_pass(data, cpu, args.cpu_repeats, k)
        rows.append(f"| lambda kernel, NDCG{'' if k is None else f'@{k} truncated'} (grad + hess) | "
                    f"{gpu_s * 1e3:,.1f} | {cpu_s * 1e3:,.0f} | {cpu_s / gpu_s:,.1f}x | {gpu_mib:,.0f} |")
        print(rows[-1], flush=True)
    g_lam, g_tree, g_mib = boosting_round(data, cuda, args.repeats, args.depth)
    c_lam, c_tree, _ = boosting_round(data, cpu, args.cpu_repeats, args.depth)
    rows.append(f"| LambdaMART round, depth {args.depth}, {args.features} features (lambda {g_lam * 1e3:.1f} + tree "
                f"{g_tree * 1e3:.1f} ms on GPU; {c_lam * 1e3:.0f} + {c_tree * 1e3:.0f} ms on CPU) | "
                f"{(g_lam + g_tree) * 1e3:,.1f} | {(c_lam + c_tree) * 1e3:,.0f} | "
                f"{(c_lam + c_tree) / (g_lam + g_tree):,.1f}x | {g_mib:,.0f} |")
    print(rows[-1], flush=True)

    body = "\n".join([
        "## GPU: MSLR-WEB30K-sized passes",
        "",
        f"{datetime.date.today()}, {torch.cuda.get_device_name()}, torch {torch.__version__}; CPU "
        f"column on the same machine's CPU ({os.cpu_count()} cores, torch on {args.cpu_threads} "
        f"threads), same run. Command: `python experiments/bench_gpu.py --write`",
        "",
        f"Synthetic MSLR-shaped set: {args.queries:,} queries x {args.docs} docs = {n:,} documents "
        f"({pairs:,} document pairs), {args.features} features, labels 0..4; float32 scores. Wall "
        f"times, median of {args.repeats} (GPU) / {args.cpu_repeats} (CPU) after a warm-up. GPU "
        f"memory: growth of `torch.cuda.max_memory_allocated` during one call (the data set's own "
        f"tensors excluded).",
        "",
        "| pass | GPU ms | CPU ms | GPU speed-up | GPU peak MiB |",
        "|---|---:|---:|---:|---:|",
        *rows,
    ])
    print(body)
    if args.write:
        from _report import write_section

        write_section("bench_gpu", body)


if __name__ == "__main__":
    main()
