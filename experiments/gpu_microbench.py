"""The rates the GPU round's design rests on, measured (docs/gpu.md's model, ../shared/design/gpu-round.md §4).

    python experiments/gpu_microbench.py --json results/gpu_check/microbench.json   # on a GPU
    TRITON_INTERPRET=1 python experiments/gpu_microbench.py --device cpu --small     # the same code, here

Each figure is the median of ``triton.testing.do_bench`` on a GPU (of 3 timed runs on the CPU,
where it only proves the code runs: interpreter times mean nothing):

* **copy**: device-to-device bandwidth, GB/s;
* **atomics**: relaxed integer reductions (``tl.atomic_add(..., sem="relaxed")``, 32- and 64-bit),
  one per element, into C random cells (C = 1: every add on one address; 256: one hot feature's
  bins; 104,448 and 3.3 M: a level's histogram spread) at scope ``gpu`` and ``cta``, in G adds/s;
* **histogram kernel**: rankkit's own ``_histogram_kernel`` at K = 1 on the bench's codes (hot
  bins), on uniform random codes of the same shape, and on the bench's codes with each
  feature's hot code elided (filled in from the totals, as the round does): entries (document ×
  feature) per second, which separates same-address contention from the raw rate;
* **empty grid**: a grid shaped like the padded lambda kernel's (31,531 × 79 programs) whose
  programs load one value and exit: the cost of a mostly idle launch;
* **tl.histogram**: Triton's block histogram of 256 and 4,096 bins, entries per second;
* **dot histogram**: a tile's (Σg, Σh, count) per code as one int8 tensor-core product of the
  tile's one-hot codes with its quantized gradients, flushed with one atomic per non-empty cell:
  privatisation that Triton can express without shared-memory atomics, on hot and uniform codes,
  beside one global atomic per entry (a candidate for S3; its sums checked against ``index_add_``).

* **shared-memory histogram** (design S3, ``rankkit.kernels.shared_histogram``: CUDA C through
  NVRTC): its first-contact check against the Triton twin, then the level histogram at K = 1 and
  at K = 16 gathered through the partition, beside ``_histogram_kernel`` on the same inputs
  (cells checked equal), in G entries/s; ptxas' registers, spills and shared memory.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _reduce_kernel(out_ptr, idx_ptr, N, BLOCK: tl.constexpr, CTA: tl.constexpr):
    """out[idx[n]] += 1 for every n, relaxed, at scope cta or gpu."""
    n = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = n < N
    cell = tl.load(idx_ptr + n, mask=inside, other=0)
    one = tl.full([BLOCK], 1, out_ptr.dtype.element_ty)
    if CTA:
        tl.atomic_add(out_ptr + cell, one, mask=inside, sem="relaxed", scope="cta")
    else:
        tl.atomic_add(out_ptr + cell, one, mask=inside, sem="relaxed", scope="gpu")


@triton.jit
def _empty_kernel(n_ptr, out_ptr):
    """Load one value and leave (a padded lambda program past its query's end)."""
    q = tl.program_id(0)
    n = tl.load(n_ptr + q)
    if n < 0:  # never: keeps the load
        tl.store(out_ptr + q, n)


@triton.jit
def _block_histogram_kernel(codes_ptr, out_ptr, N, BINS: tl.constexpr, BLOCK: tl.constexpr):
    """tl.histogram of one tile of codes, added to out [BINS] once per program."""
    n = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    codes = tl.load(codes_ptr + n, mask=n < N, other=0).to(tl.int32)
    hist = tl.histogram(codes, BINS)
    tl.atomic_add(out_ptr + tl.arange(0, BINS), hist, sem="relaxed")


@triton.jit
def _dot_histogram_kernel(codes_ptr, g_ptr, h_ptr, out_ptr, N, BLOCK_N: tl.constexpr):
    """A privatised tile histogram without shared-memory atomics: the tile's (Σg, Σh, count) per
    code as one int8 tensor-core product, one_hot(codes) [256, BLOCK_N] @ [g, h, 1, 0…] [BLOCK_N, 16]
    (int32 sums), then one relaxed atomic per non-empty (code, channel): a hot bin costs one add
    per tile instead of one per document (a candidate for S3 that Triton can express)."""
    n = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    inside = n < N
    code = tl.load(codes_ptr + n, mask=inside, other=0).to(tl.int32)
    bins = tl.arange(0, 256)
    onehot = ((bins[:, None] == code[None, :]) & inside[None, :]).to(tl.int8)
    col = tl.arange(0, 16)
    g = tl.load(g_ptr + n, mask=inside, other=0)
    h = tl.load(h_ptr + n, mask=inside, other=0)
    values = tl.where(col[None, :] == 0, g[:, None], tl.where(col[None, :] == 1, h[:, None],
                      tl.where(col[None, :] == 2, 1, 0))).to(tl.int8)
    sums = tl.dot(onehot, values, out_dtype=tl.int32)
    keep = (sums != 0) & (col[None, :] < 3)
    tl.atomic_add(out_ptr + bins[:, None] * 16 + col[None, :], sums, mask=keep, sem="relaxed")


def bench(fn, device) -> float:
    """Median milliseconds of ``fn``."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=10, rep=50, return_mode="median"))
    fn()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def copy_rate(device, n_bytes: int) -> dict:
    a = torch.empty(n_bytes, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    ms = bench(lambda: b.copy_(a), device)
    return {"bytes": n_bytes, "ms": ms, "GB_per_s": 2 * n_bytes / ms / 1e6}  # read + write


def atomic_rates(device, n: int, cells: list[int]) -> list[dict]:
    g = torch.Generator(device=device).manual_seed(0)
    rows = []
    for dtype, name in ((torch.int32, "u32"), (torch.int64, "u64")):
        for c in cells:
            idx = torch.randint(0, c, (n,), device=device, generator=g, dtype=torch.int64)
            out = torch.zeros(c, dtype=dtype, device=device)
            for cta in (False, True):
                grid = (triton.cdiv(n, 1024),)
                ms = bench(lambda grid=grid, out=out, idx=idx, cta=cta: _reduce_kernel[grid](
                    out, idx, n, BLOCK=1024, CTA=cta), device)
                rows.append({"dtype": name, "cells": c, "scope": "cta" if cta else "gpu", "adds": n,
                             "ms": ms, "G_adds_per_s": n / ms / 1e6})
    return rows


def histogram_rates(device, queries: int, features: int) -> list[dict]:
    """rankkit's level histogram at K = 1 on the bench's codes and on uniform codes."""
    from bench_gpu import mslr_like

    from rankkit.boosting.binning import QuantileBinner
    from rankkit.kernels.backends import fixed_point
    from rankkit.kernels.triton.histogram import hot_codes, level_histogram_triton

    data = mslr_like(queries, features, 0)
    codes = QuantileBinner(255, seed=0).fit(data.features).transform(data.features).t().contiguous().to(device)
    n = codes.shape[1]
    g = torch.Generator().manual_seed(1)
    grad, hess = torch.randn(n, generator=g, dtype=torch.float64), torch.rand(n, generator=g, dtype=torch.float64)
    gq, hq, _ = fixed_point(grad.to(device), hess.to(device))
    node = torch.zeros(n, dtype=torch.int64, device=device)
    uniform = torch.randint(0, 256, codes.shape, generator=g, dtype=torch.uint8).to(device)
    rows = []
    totals = torch.stack([gq.sum(), hq.sum(), torch.full((), n, dtype=torch.int64, device=device)])[:, None]
    for name, c, hot in (("bench codes (hot bins)", codes, None), ("uniform codes", uniform, None),
                         ("bench codes, hot codes elided", codes, hot_codes(codes))):
        out = torch.zeros(3, features, 1, 256, dtype=torch.int64, device=device)
        ms = bench(lambda c=c, out=out, hot=hot: level_histogram_triton(
            c, node, gq, hq, 1, dtype=torch.int64, out=out, hot=hot, totals=None if hot is None else totals), device)
        top = float((c == c.mode(dim=1).values[:, None]).float().mean())
        rows.append({"codes": name, "documents": n, "features": features, "ms": ms,
                     "G_entries_per_s": n * features / ms / 1e6, "mean_top_bin_share": top})
    return rows


def smem_histograms(device, queries: int, features: int) -> list[dict]:
    """The shared-memory histogram (S3) against the Triton histogram on the bench's codes: K = 1
    (the root, every document) and K = 16 (a level's smaller children through the partition)."""
    from bench_gpu import mslr_like

    from rankkit.boosting.binning import QuantileBinner
    from rankkit.kernels.backends import fixed_point
    from rankkit.kernels.shared_histogram import KERNELS, compile_cubin, shared_histogram_for
    from rankkit.kernels.triton.histogram import level_histogram_triton, quantize, smaller_first

    kernel = shared_histogram_for(device)  # compiled and checked against the twin, or None with a warning
    if kernel is None:
        raise RuntimeError("the first-contact check refused the shared-memory histogram (see the warning)")
    data = mslr_like(queries, features, 0)
    codes = QuantileBinner(255, seed=0).fit(data.features).transform(data.features).t().contiguous().to(device)
    n = codes.shape[1]
    g = torch.Generator().manual_seed(1)
    grad, hess = torch.randn(n, generator=g, dtype=torch.float64), torch.rand(n, generator=g, dtype=torch.float64)
    fixed = fixed_point(grad.to(device), hess.to(device))[:2]  # the default round's 64-bit fixed point
    quantized = (quantize(grad, 10)[0].to(device), quantize(hess, 10)[0].to(device))  # n · 2^9 < 2^31
    report = compile_cubin("sm_{}{}".format(*torch.cuda.get_device_capability(device)))[1]

    def one(kind, gq, hq, cells, k) -> dict:
        slot = (torch.randint(0, 2 * k, (n,), generator=g) % (k + 1)).to(torch.int16).to(device) if k > 1 \
            else torch.zeros(n, dtype=torch.int64, device=device)
        order = smaller_first(slot) if k > 1 else None
        n_rows = int((slot < k).sum()) if k > 1 else None
        a = torch.zeros(3, features, k, 256, dtype=cells, device=device)
        b = torch.zeros_like(a)
        ms_smem = bench(lambda: kernel(codes, slot, gq, hq, k, a.zero_(), order=order, n_rows=n_rows), device)
        ms_triton = bench(lambda: level_histogram_triton(codes, slot, gq, hq, k, dtype=cells, out=b, order=order,
                                                         n_rows=n_rows), device)
        entries = (n if n_rows is None else n_rows) * features
        return {"gradients": kind, "nodes": k, "entries": entries, "ms": ms_smem,
                "G_entries_per_s": entries / ms_smem / 1e6, "triton_ms": ms_triton,
                "triton_G_entries_per_s": entries / ms_triton / 1e6, "cells_equal": bool(torch.equal(a, b)),
                "ptxas": report.get(KERNELS[(slot.dtype, gq.dtype, cells)])}

    return [one(kind, gq, hq, cells, k)
            for kind, (gq, hq), cells in (("64-bit fixed point", fixed, torch.int64),
                                          ("int32 quantized", quantized, torch.int32))
            for k in (1, 16)]


def dot_histograms(device, n: int) -> list[dict]:
    """The int8 tensor-core tile histogram of one feature, on hot and uniform codes, against the
    same counts by one global atomic per entry (``_reduce_kernel`` into 256 cells)."""
    g = torch.Generator().manual_seed(2)
    gq = torch.randint(-127, 128, (n,), generator=g, dtype=torch.int8).to(device)
    hq = torch.randint(0, 128, (n,), generator=g, dtype=torch.int8).to(device)
    hot = torch.where(torch.rand(n, generator=g) < 0.8, 0, torch.randint(0, 256, (n,), generator=g))
    rows, grid = [], (triton.cdiv(n, 256),)
    for name, codes in (("hot (80 % in one bin)", hot), ("uniform", torch.randint(0, 256, (n,), generator=g))):
        codes8 = codes.to(torch.uint8).to(device)
        out = torch.zeros(256, 16, dtype=torch.int32, device=device)
        ms = bench(lambda codes8=codes8, out=out: _dot_histogram_kernel[grid](codes8, gq, hq, out, n, BLOCK_N=256),
                   device)
        out.zero_()
        _dot_histogram_kernel[grid](codes8, gq, hq, out, n, BLOCK_N=256)
        want = torch.stack([torch.zeros(256, dtype=torch.long).index_add_(0, codes.long(), v.cpu().long())
                            for v in (gq, hq, torch.ones(n, dtype=torch.long))], 1)
        idx, cells = codes.long().to(device), torch.zeros(256, dtype=torch.int32, device=device)
        atomic_ms = bench(lambda idx=idx, cells=cells: _reduce_kernel[(triton.cdiv(n, 1024),)](
            cells, idx, n, BLOCK=1024, CTA=False), device)
        rows.append({"codes": name, "entries": n, "ms": ms, "G_entries_per_s": n / ms / 1e6,
                     "atomic_G_entries_per_s": n / atomic_ms / 1e6,
                     "sums_right": bool(torch.equal(out[:, :3].cpu().long(), want))})
    return rows


def empty_grid(device, programs: int) -> dict:
    n = torch.zeros(programs, dtype=torch.int32, device=device)
    out = torch.empty_like(n)
    ms = bench(lambda: _empty_kernel[(programs,)](n, out), device)
    return {"programs": programs, "ms": ms, "us_per_1000_programs": ms * 1e3 / programs * 1e3}


def block_histograms(device, n: int) -> list[dict]:
    rows, block = [], 1024
    for bins in (256, 4096):
        codes = torch.randint(0, bins, (n,), device=device, dtype=torch.int32)
        out = torch.zeros(bins, dtype=torch.int32, device=device)
        grid = (triton.cdiv(n, block),)
        ms = bench(lambda grid=grid, codes=codes, out=out, bins=bins: _block_histogram_kernel[grid](
            codes, out, n, BINS=bins, BLOCK=block), device)
        rows.append({"bins": bins, "entries": n, "ms": ms, "G_entries_per_s": n / ms / 1e6})
    return rows


def run(device: torch.device, small: bool) -> dict:
    """Every microbenchmark; a failing one is recorded with its error and the rest go on."""
    sizes = dict(copy=1 << 16, adds=1 << 12, cells=[1, 256, 4096], queries=20, features=4,
                 programs=512, entries=1 << 12) if small else \
        dict(copy=1 << 30, adds=1 << 26, cells=[1, 256, 104_448, 3_342_336], queries=31_531, features=136,
             programs=31_531 * 79, entries=1 << 26)
    steps = {
        "copy": lambda: copy_rate(device, sizes["copy"]),
        "atomics": lambda: atomic_rates(device, sizes["adds"], sizes["cells"]),
        "histogram_kernel": lambda: histogram_rates(device, sizes["queries"], sizes["features"]),
        "empty_grid": lambda: empty_grid(device, sizes["programs"]),
        "tl_histogram": lambda: block_histograms(device, sizes["entries"]),
        "dot_histogram": lambda: dot_histograms(device, sizes["entries"]),
        "smem_histogram": lambda: smem_histograms(device, sizes["queries"], sizes["features"]),
    }
    record = {"device": str(device), "small": small}
    for name, fn in steps.items():
        try:
            record[name] = fn()
        except Exception as e:  # noqa: BLE001 - recorded; the other rates are still worth having
            record[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]}
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return record


def table(record: dict) -> str:
    """The microbenchmarks as text (the GPU check prints it last)."""
    lines = [f"microbenchmarks on {record['device']}" + (" (small: proves the code, times mean nothing)"
                                                          if record.get("small") else "")]

    def rows(name, fmt):
        value = record.get(name)
        if isinstance(value, dict) and "error" in value:
            lines.append(f"  {name}: {value['error']}")
        elif isinstance(value, dict):
            lines.append("  " + fmt(value))
        elif value:
            lines.extend("  " + fmt(v) for v in value)

    rows("copy", lambda r: f"copy: {r['GB_per_s']:,.0f} GB/s ({r['bytes']:,} bytes, {r['ms']:.3f} ms)")
    rows("atomics", lambda r: f"atomic {r['dtype']} scope {r['scope']:3s} into {r['cells']:>9,} cells: "
                              f"{r['G_adds_per_s']:8.2f} G adds/s")
    rows("histogram_kernel", lambda r: f"_histogram_kernel K=1, {r['codes']}: {r['G_entries_per_s']:.2f} G "
                                       f"entries/s ({r['ms']:.3f} ms; top bin {r['mean_top_bin_share']:.0%})")
    rows("empty_grid", lambda r: f"empty grid of {r['programs']:,} programs: {r['ms']:.3f} ms "
                                 f"({r['us_per_1000_programs']:.2f} us per 1,000)")
    rows("tl_histogram", lambda r: f"tl.histogram {r['bins']} bins: {r['G_entries_per_s']:.2f} G entries/s")
    rows("dot_histogram", lambda r: f"int8 tensor-core tile histogram, {r['codes']}: {r['G_entries_per_s']:.2f} G "
                                    f"entries/s (one global atomic per entry: {r['atomic_G_entries_per_s']:.2f}; "
                                    f"sums {'right' if r['sums_right'] else 'WRONG'})")
    rows("smem_histogram", lambda r: f"shared-memory histogram (S3), {r['gradients']}, K={r['nodes']}: "
                                     f"{r['G_entries_per_s']:.2f} G "
                                     f"entries/s ({r['ms']:.3f} ms) against _histogram_kernel "
                                     f"{r['triton_G_entries_per_s']:.2f} ({r['triton_ms']:.3f} ms); cells "
                                     f"{'equal' if r['cells_equal'] else 'DIFFERENT'}; ptxas {r['ptxas']}")
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="cuda (default when present) or cpu (with TRITON_INTERPRET=1)")
    ap.add_argument("--small", action="store_true", help="tiny sizes: prove the code runs")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("gpu_microbench.py: on a CPU the Triton kernels need TRITON_INTERPRET=1")
    record = run(device, args.small or device.type == "cpu")
    print(table(record))
    if args.json:
        from rankkit.infra.io import atomic_write

        def write(tmp):
            with open(tmp, "w") as f:
                json.dump(record, f, indent=1)
        atomic_write(args.json, write)
    return record


if __name__ == "__main__":
    main()
