"""S3 of the GPU round (../shared/design/gpu-round.md): a level's integer histograms privatised in
shared memory, in CUDA C compiled at first use through NVRTC (``cuda.core``, the ``gpu`` extra),
with a Triton twin of the same algorithm as its reference.

Triton has no shared-memory atomics, so the Triton level histogram
(:func:`rankkit.kernels.triton.histogram.level_histogram_triton`) sends three global atomics per
(document, feature). Here one block of threads takes a tile of ``TILE`` positions of the
documents' partition by slot (:func:`~rankkit.kernels.torch_ref.smaller_first`: a level's
smaller children first, each slot's documents together) and ``FEATURES`` features, adds each
document's (g, h, 1) into shared cells for the tile's first ``SLOTS`` slots (int32 cells for
int32 quantized gradients, 64-bit ones for the default round's 64-bit fixed point; a slot past
those, in a tile spanning many small slots, goes straight to the global cells), and flushes every
non-zero cell once with one global atomic (int32 or int64 cells, as the caller's). As every fast GPU
booster does (XGBoost's ``gpu_hist``, LightGBM's CUDA trees, CatBoost): most adds land in shared
memory, and hot bins no longer serialise on one global address. Integer sums are exact, so the
result is the torch reference's bits whatever order the atomics land in: trees stay identical run
to run. A tile's int32 cells hold TILE · max|g_q| < 2^31 (TILE = 4096, |g_q| < 2^15: 2^27).

Status (2026-11-28): compiled for sm_90 on a machine without a GPU (NVRTC; registers, spills and
shared memory read from ptxas' report, tests/kernels/test_shared_histogram.py); the twin equals
the torch reference under Triton's interpreter. **It has not run on a GPU.** It is therefore
opt-in (``RANKKIT_CUDA_HISTOGRAM=1``), and on first contact with a device it is checked against
the twin and the torch reference on a small sample: a mismatch or an error falls back to the
Triton histogram with one warning. experiments/gpu_microbench.py times it beside the global
atomics when a GPU is lent.
"""
from __future__ import annotations

import ctypes
import functools
import re
import warnings

import torch

from rankkit.kernels.torch_ref import build_histograms, hot_codes, smaller_first

#: Positions of the partition per block, features per block, slots privatised per tile, threads.
TILE = 4096
FEATURES = 4
SLOTS = 2
THREADS = 256
N_CODES = 256

#: Features per block where the cells are 64-bit (fixed-point float gradients): the same 24 KiB.
FEATURES_64 = 2

#: The CUDA C source: one kernel per (node, gradient, cell) dtypes: int16 slots of a level or
#: int64 nodes of the root; int32 quantized gradients into int32 shared cells, flushed into int32
#: or int64 cells, or 64-bit fixed-point gradients (the default round's) into 64-bit shared cells.
SOURCE = r"""
#define RK_TILE %(tile)d
#define RK_S %(slots)d

__device__ __forceinline__ void rk_add(int* p, long long v) { atomicAdd(p, (int) v); }
__device__ __forceinline__ void rk_add(long long* p, long long v) {
    atomicAdd((unsigned long long*) p, (unsigned long long) v);
}

#define RK_PRIVATE_HISTOGRAM(NAME, NODE, VAL, CELL, OUT, RK_FB)                                    \
extern "C" __global__ void NAME(                                                                   \
    const unsigned char* __restrict__ codes_t, const long long* __restrict__ order,                \
    const NODE* __restrict__ node, const VAL* __restrict__ g, const VAL* __restrict__ h,          \
    const long long* __restrict__ hot, long long N, long long n_rows, int n_feat, int n_nodes,     \
    int gather, int elide, OUT* __restrict__ out)                                                  \
{                                                                                                  \
    __shared__ CELL cells[RK_S][RK_FB][3][256];                                                    \
    const long long t0 = (long long) blockIdx.x * RK_TILE;                                         \
    if (t0 >= n_rows) return;                               /* uniform over the block */           \
    const long long t1 = min(t0 + (long long) RK_TILE, n_rows);                                    \
    const int f0 = blockIdx.y * RK_FB;                                                             \
    const int fb = min(RK_FB, n_feat - f0);                                                        \
    CELL* flat = &cells[0][0][0][0];                                                               \
    for (int i = threadIdx.x; i < RK_S * RK_FB * 3 * 256; i += blockDim.x) flat[i] = 0;            \
    const long long first = (long long) node[gather ? order[t0] : t0];  /* the tile's first slot */ \
    __syncthreads();                                                                               \
    const long long plane = (long long) n_feat * n_nodes * 256;                                    \
    for (long long p = t0 + threadIdx.x; p < t1; p += blockDim.x) {                                \
        const long long d = gather ? order[p] : p;                                                 \
        const long long k = (long long) node[d];                                                   \
        if (k < 0 || k >= n_nodes) continue;               /* the left-out node K */               \
        const long long gd = (long long) g[d], hd = (long long) h[d];                              \
        const long long local = k - first;                                                         \
        for (int j = 0; j < fb; ++j) {                                                             \
            const int f = f0 + j;                                                                  \
            const int c = codes_t[(long long) f * N + d];                                          \
            if (elide && c == (int) hot[f]) continue;       /* filled in from the node totals */   \
            if (local >= 0 && local < RK_S) {                                                      \
                rk_add(&cells[local][j][0][c], gd);                                                \
                rk_add(&cells[local][j][1][c], hd);                                                \
                rk_add(&cells[local][j][2][c], 1);                                                 \
            } else {                                        /* a tile over many small slots */     \
                OUT* at = out + ((long long) f * n_nodes + k) * 256 + c;                           \
                rk_add(at, gd);                                                                    \
                rk_add(at + plane, hd);                                                            \
                rk_add(at + 2 * plane, 1);                                                         \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    __syncthreads();                                                                               \
    for (int i = threadIdx.x; i < RK_S * fb * 256; i += blockDim.x) {                              \
        const int s = i / (fb * 256), j = (i / 256) %% fb, c = i %% 256;                           \
        const long long k = first + s;                                                             \
        if (k >= n_nodes) continue;                                                                \
        OUT* at = out + ((long long) (f0 + j) * n_nodes + k) * 256 + c;                            \
        for (int ch = 0; ch < 3; ++ch) {                                                           \
            const CELL v = cells[s][j][ch][c];                                                     \
            if (v != 0) rk_add(at + ch * plane, (long long) v);                                    \
        }                                                                                          \
    }                                                                                              \
}

RK_PRIVATE_HISTOGRAM(rk_private_histogram_i16_i32_i32, short, int, int, int, %(features)d)
RK_PRIVATE_HISTOGRAM(rk_private_histogram_i64_i32_i32, long long, int, int, int, %(features)d)
RK_PRIVATE_HISTOGRAM(rk_private_histogram_i16_i32_i64, short, int, int, long long, %(features)d)
RK_PRIVATE_HISTOGRAM(rk_private_histogram_i64_i32_i64, long long, int, int, long long, %(features)d)
RK_PRIVATE_HISTOGRAM(rk_private_histogram_i16_i64_i64, short, long long, long long, long long, %(features64)d)
RK_PRIVATE_HISTOGRAM(rk_private_histogram_i64_i64_i64, long long, long long, long long, long long, %(features64)d)
""" % dict(tile=TILE, features=FEATURES, features64=FEATURES_64, slots=SLOTS)

_SHORT = {torch.int16: "i16", torch.int32: "i32", torch.int64: "i64"}
#: (node, gradient, cell) dtypes -> kernel name.
KERNELS = {(node, val, out): f"rk_private_histogram_{_SHORT[node]}_{_SHORT[val]}_{_SHORT[out]}"
           for node in (torch.int16, torch.int64)
           for val, out in ((torch.int32, torch.int32), (torch.int32, torch.int64), (torch.int64, torch.int64))}


@functools.lru_cache(maxsize=4)
def compile_cubin(arch: str = "sm_90") -> tuple[bytes, dict]:
    """(cubin, report) of :data:`SOURCE` for ``arch`` through NVRTC (needs ``cuda.core``, not a
    GPU); the report is ptxas' per kernel: registers, spill stores and loads (bytes), shared
    memory (bytes)."""
    import io

    from cuda.core import Program, ProgramOptions

    log = io.StringIO()
    code = Program(SOURCE, "c++", ProgramOptions(arch=arch, ptxas_options="-v")).compile("cubin", logs=log)
    return bytes(code.code), ptxas_report(log.getvalue())


def ptxas_report(text: str) -> dict:
    """{kernel: {"registers", "spill_stores", "spill_loads", "smem"}} from ptxas' ``-v`` lines."""
    report: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        m = re.search(r"Function properties for (\w+)", line)
        if m:
            current = report.setdefault(m.group(1), {})
            continue
        if current is None:
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            current["spill_stores"], current["spill_loads"] = int(m.group(1)), int(m.group(2))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            current["registers"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            current["smem"] = int(s.group(1)) if s else 0
    return report


# -- the Triton twin ----------------------------------------------------------------------------------
def _twin():
    import triton
    import triton.language as tl

    @triton.jit
    def _private_histogram_kernel(codes_ptr, order_ptr, node_ptr, g_ptr, h_ptr, hot_ptr, out_ptr, N, n_rows,
                                  n_feat, n_nodes, TILE_: tl.constexpr, SLOTS_: tl.constexpr,
                                  GATHER: tl.constexpr, ELIDE: tl.constexpr):
        """One (tile, feature): the tile's documents summed per code for its first SLOTS_ slots
        (a [TILE_, 256] comparison, the twin of the CUDA block's shared cells), flushed with
        one atomic per non-zero cell; documents of later slots added one by one."""
        cell = out_ptr.dtype.element_ty
        t = tl.program_id(0)
        f = tl.program_id(1).to(tl.int64)
        pos = t.to(tl.int64) * TILE_ + tl.arange(0, TILE_)
        inside = pos < n_rows
        if GATHER:
            d = tl.load(order_ptr + pos, mask=inside, other=0).to(tl.int64)
            first = tl.load(node_ptr + tl.load(order_ptr + t.to(tl.int64) * TILE_)).to(tl.int64)
        else:
            d = pos
            first = tl.load(node_ptr + t.to(tl.int64) * TILE_).to(tl.int64)
        k = tl.load(node_ptr + d, mask=inside, other=-1).to(tl.int64)
        keep = inside & (k >= 0) & (k < n_nodes)
        g = tl.load(g_ptr + d, mask=keep, other=0).to(tl.int64)
        h = tl.load(h_ptr + d, mask=keep, other=0).to(tl.int64)
        c = tl.load(codes_ptr + f * N + d, mask=keep, other=0).to(tl.int64)
        if ELIDE:
            keep = keep & (c != tl.load(hot_ptr + f).to(tl.int64))
        plane = tl.cast(n_feat, tl.int64) * n_nodes * 256
        codes = tl.arange(0, 256).to(tl.int64)
        for s in tl.static_range(SLOTS_):
            hit = (c[:, None] == codes[None, :]) & (keep & (k == first + s))[:, None]
            sg = tl.sum(tl.where(hit, g[:, None], 0), 0)
            sh = tl.sum(tl.where(hit, h[:, None], 0), 0)
            sc = tl.sum(hit.to(tl.int64), 0)
            at = (f * n_nodes + first + s) * 256 + codes
            flush = (sc != 0) & ((codes * 0 + first + s) < n_nodes)
            tl.atomic_add(out_ptr + at, sg.to(cell), mask=flush, sem="relaxed")
            tl.atomic_add(out_ptr + plane + at, sh.to(cell), mask=flush, sem="relaxed")
            tl.atomic_add(out_ptr + 2 * plane + at, sc.to(cell), mask=flush, sem="relaxed")
        rest = keep & ((k < first) | (k >= first + SLOTS_))  # unsorted (plain) tiles too
        at = (f * n_nodes + k) * 256 + c
        tl.atomic_add(out_ptr + at, g.to(cell), mask=rest, sem="relaxed")
        tl.atomic_add(out_ptr + plane + at, h.to(cell), mask=rest, sem="relaxed")
        tl.atomic_add(out_ptr + 2 * plane + at, tl.full([TILE_], 1, cell), mask=rest, sem="relaxed")

    return _private_histogram_kernel


_TWIN = None


def private_histogram_twin(codes_t: torch.Tensor, node: torch.Tensor, g: torch.Tensor, h: torch.Tensor,
                           n_nodes: int, out: torch.Tensor, *, order: torch.Tensor | None = None,
                           n_rows: int | None = None, hot: torch.Tensor | None = None, tile: int = 128,
                           slots: int = SLOTS) -> torch.Tensor:
    """The Triton twin of the CUDA kernel: adds the level's (Σg, Σh, count) into ``out`` [3, F,
    K, 256] int64 (zeroed by the caller), the inputs as
    :func:`~rankkit.kernels.triton.histogram.level_histogram_triton`'s (integer g and h; with
    ``hot`` the hot cells are left for the caller to fill from the node totals). ``tile``: the
    documents per program (a power of two; the CUDA kernel's is :data:`TILE`)."""
    import triton

    global _TWIN
    if _TWIN is None:
        _TWIN = _twin()
    n_feat, n = codes_t.shape
    rows = n if order is None or n_rows is None else min(int(n_rows), n)
    if rows == 0 or n_feat == 0 or n_nodes == 0:
        return out
    _TWIN[(triton.cdiv(rows, tile), n_feat)](
        codes_t.contiguous(), node if order is None else order.contiguous(), node.contiguous(), g.contiguous(),
        h.contiguous(), node if hot is None else hot.contiguous(), out, n, rows, n_feat, n_nodes,
        TILE_=tile, SLOTS_=slots, GATHER=order is not None, ELIDE=hot is not None)
    return out


# -- the CUDA kernel, launched through cuda.core ----------------------------------------------------------
class PrivateHistogram:
    """The compiled kernels on one CUDA device, launched on torch's current stream."""

    def __init__(self, device: torch.device):
        from cuda.core import Device, ObjectCode

        major, minor = torch.cuda.get_device_capability(device)
        self.device = Device(device.index if device.index is not None else torch.cuda.current_device())
        self.device.set_current()
        cubin, self.report = compile_cubin(f"sm_{major}{minor}")
        module = ObjectCode.from_cubin(cubin)
        self.kernels = {key: module.get_kernel(name) for key, name in KERNELS.items()}

    def __call__(self, codes_t, node, g, h, n_nodes, out, *, order=None, n_rows=None, hot=None) -> torch.Tensor:
        from cuda.core import LaunchConfig, launch

        n_feat, n = codes_t.shape
        rows = n if order is None or n_rows is None else min(int(n_rows), n)
        if rows == 0 or n_feat == 0 or n_nodes == 0:
            return out
        key = (node.dtype, g.dtype, out.dtype)
        if key not in self.kernels or h.dtype != g.dtype:
            raise ValueError(f"the shared-memory histogram takes the dtypes {sorted(KERNELS.values())}, got "
                             f"{key} (h {h.dtype})")
        per_block = FEATURES_64 if g.dtype == torch.int64 else FEATURES
        grid = ((rows + TILE - 1) // TILE, (n_feat + per_block - 1) // per_block)
        held, args = launch_args(codes_t, node, g, h, n_nodes, out, order=order, rows=rows, hot=hot)
        stream = self.device.create_stream(_StreamHandle(torch.cuda.current_stream(out.device)))
        launch(stream, LaunchConfig(grid=grid, block=THREADS), self.kernels[key], *args)
        del held  # queued: torch's caching allocator keeps the memory for the stream
        return out


def launch_args(codes_t, node, g, h, n_nodes, out, *, order, rows, hot) -> tuple[list, list]:
    """(the tensors to hold until the launch is queued, the kernel's arguments): pointers as plain
    ints, which cuda.core passes as ``void*`` (it refuses ``ctypes.c_void_p``), the sizes as
    ctypes integers of the kernel's widths; ``order`` and ``hot`` as int64 and the codes as uint8,
    as the kernel reads them."""
    if codes_t.dtype != torch.uint8:
        raise ValueError(f"`codes_t` must be uint8 codes, got {codes_t.dtype}")
    n_feat, n = codes_t.shape
    codes, nodes, gg, hh = codes_t.contiguous(), node.contiguous(), g.contiguous(), h.contiguous()
    ords = order.to(torch.int64).contiguous() if order is not None else nodes
    hots = hot.to(torch.int64).contiguous() if hot is not None else nodes
    held = [codes, nodes, gg, hh, ords, hots, out]
    args = [codes.data_ptr(), ords.data_ptr(), nodes.data_ptr(), gg.data_ptr(), hh.data_ptr(), hots.data_ptr(),
            ctypes.c_longlong(n), ctypes.c_longlong(rows), ctypes.c_int(n_feat), ctypes.c_int(n_nodes),
            ctypes.c_int(int(order is not None)), ctypes.c_int(int(hot is not None)), out.data_ptr()]
    return held, args


class _StreamHandle:
    """torch's stream as the ``__cuda_stream__`` protocol cuda.core reads."""

    def __init__(self, stream):
        self.stream = stream

    def __cuda_stream__(self):
        return (0, self.stream.cuda_stream)


_CHOSEN: dict = {}


def shared_histogram_for(device: torch.device):
    """The checked kernel for ``device``, or None (then the Triton histogram runs): compiled and
    checked against the twin on a small sample at first contact; a mismatch, or any error on the
    way (no ``cuda.core``, no NVRTC, a failed launch), gives one warning and None for the rest of
    the process."""
    key = (device.type, device.index)
    if key not in _CHOSEN:
        try:
            kernel = PrivateHistogram(device)
            reason = first_contact_mismatch(kernel, device)
        except Exception as e:  # noqa: BLE001 -- any failure of the optional path: the Triton histogram
            kernel, reason = None, f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
        if reason is not None:
            warnings.warn(f"RANKKIT_CUDA_HISTOGRAM: the shared-memory histogram is not used on {device} ({reason}); "
                          f"the Triton histogram runs instead", RuntimeWarning, stacklevel=2)
            kernel = None
        _CHOSEN[key] = kernel
    return _CHOSEN[key]


def first_contact_sample(device, seed: int = 0, n: int = 9000) -> dict:
    """A small level on ``device``: ``n`` documents (9,000: two tiles and a bit), 6 features, 5 nodes and the
    left-out node, skewed codes (hot bins), quantized gradients of both signs, a partition by
    slot with tiny slots (so that tiles span more than two slots) and each feature's hot code."""
    gen = torch.Generator().manual_seed(seed)
    n_feat, n_nodes = 6, 5
    codes_t = torch.where(torch.rand(n_feat, n, generator=gen) < 0.6, 7,
                          torch.randint(0, 256, (n_feat, n), generator=gen)).to(torch.uint8)
    node = torch.multinomial(torch.tensor([0.01, 0.3, 0.003, 0.3, 0.08, 0.3]), n, replacement=True,
                             generator=gen).to(torch.int16)
    g = torch.randint(-(2 ** 15) + 1, 2 ** 15, (n,), generator=gen, dtype=torch.int32)
    h = torch.randint(0, 2 ** 15, (n,), generator=gen, dtype=torch.int32)
    sample = dict(codes_t=codes_t, node=node, g=g, h=h, n_nodes=n_nodes, order=smaller_first(node),
                  n_rows=int((node < n_nodes).sum()), hot=hot_codes(codes_t))
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in sample.items()}


def _reference(codes_t, node, g, h, n_nodes, out, *, order=None, n_rows=None, hot=None) -> torch.Tensor:
    """The torch reference (:func:`rankkit.kernels.torch_ref.build_histograms`) of the same call:
    only the documents ``order[:n_rows]`` count, and hot cells are left at 0."""
    keep = torch.zeros(len(node), dtype=torch.bool, device=node.device)
    keep[order[:n_rows] if order is not None else torch.arange(len(node), device=node.device)] = True
    ref = build_histograms(codes_t, torch.where(keep, node.long(), n_nodes), g.long(), h.long(), n_nodes)
    if hot is not None:
        ref.scatter_(3, hot.long().view(1, -1, 1, 1).expand(3, -1, n_nodes, 1), 0)
    return out.copy_(ref.to(out.dtype))


def first_contact_mismatch(kernel, device) -> str | None:
    """None when ``kernel`` gives the twin's cells, and the torch reference's, on the sample
    (gathered, elided and plain; int32 quantized gradients into int32 and int64 cells, 64-bit
    fixed-point ones into int64 cells), else what differed."""
    s = first_contact_sample(device)
    wide = (s["g"].to(torch.int64) << 28, s["h"].to(torch.int64) << 28)  # fixed point: far above 2^32
    for cells, (g, h) in ((torch.int32, (s["g"], s["h"])), (torch.int64, (s["g"], s["h"])), (torch.int64, wide)):
        shape = (3, s["codes_t"].shape[0], s["n_nodes"], N_CODES)
        for name, extra in (("gathered", dict(order=s["order"], n_rows=s["n_rows"])),
                            ("gathered, hot cells elided", dict(order=s["order"], n_rows=s["n_rows"], hot=s["hot"])),
                            ("plain", {})):
            args = (s["codes_t"], s["node"] if extra else s["node"].to(torch.int64), g, h, s["n_nodes"])
            got = kernel(*args, torch.zeros(shape, dtype=cells, device=device), **extra)
            for what, make in (("the Triton twin", private_histogram_twin), ("the torch reference", _reference)):
                want = make(*args, torch.zeros(shape, dtype=cells, device=device), **extra)
                if not torch.equal(got, want):
                    return (f"{name}, {g.dtype} gradients into {cells} cells: {int((got != want).sum())} of "
                            f"{got.numel()} cells differ from {what}")
    return None
