"""Triton level histogram: (ΣG, ΣH, count) per (feature, node, code) of one tree level.

The layout is that of :func:`rankkit.boosting.tree.build_histograms`, the torch reference:
``hist[c, f, node, code]`` for channel c = 0 (Σg), 1 (Σh), 2 (count), and a document whose
node is outside 0..K−1 (the reference's "left out" node K, used to sum only the smaller child
of each split) adds nothing -- it is masked before the atomics, never written out of bounds.

Gradients may be quantized integers (Shi et al., "Quantized Training of Gradient Boosting
Decision Trees", NeurIPS 2022; :func:`rankkit.kernels.torch_ref.quantize_gradients`): their sums
are integer atomics, exact and independent of the order in which the atomics land, into int32
cells (the caller bounds N · max|g_q| < 2^31; g and h then travel as one 64-bit add
h · 2^32 + g, unpacked exactly afterwards: two atomics per entry instead of three, as LightGBM's
CUDA histograms pack both into one word) or int64 cells. Float gradients go into float32 /
float64 cells (float atomics: the last bits depend on the order).

Two more ways to send fewer atomics, both exact in integer cells: a level's children
histogram reads only the smaller children's documents, through a partition by slot
(:func:`smaller_first`); and each feature's most frequent code (:func:`hot_codes`, found once per
fit) is left out and filled in from the node totals (``hot=``, ``totals=``).

Every atomic is *relaxed*: the histogram is read only after the kernel ends, so no ordering
between the adds is needed, and a relaxed add compiles to a fire-and-forget reduction
(``red.global.add``) instead of an acquire-release atomic with a fence around it.

One program per tile of BLOCK_N documents: it reads the tile's nodes and values once and
loops over the features, reading each feature's codes as one coalesced row of the
feature-major ``codes_t`` [F, N].

Notation: N documents, F features, K nodes of the level, 256 codes.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from rankkit.kernels import shared_histogram
from rankkit.kernels.torch_ref import hot_codes, smaller_first  # noqa: F401 -- the partition and hot codes, here too
from rankkit.kernels.switches import cuda_histogram_takes

N_CODES = 256
_CELL_DTYPES = (torch.int32, torch.int64, torch.float32, torch.float64)


@triton.jit
def _histogram_kernel(codes_ptr, node_ptr, g_ptr, h_ptr, out_ptr, order_ptr, hot_ptr, pack_ptr, count_ptr, N, n_rows,
                      n_feat, n_nodes, BLOCK_N: tl.constexpr, GATHER: tl.constexpr, ELIDE: tl.constexpr,
                      PACK: tl.constexpr, COUNTED: tl.constexpr):
    """Add one tile of documents, every feature, into out [3, F, K, 256]: the documents
    ``tile`` of 0..N−1, or with GATHER the documents ``order[tile]`` of the first ``n_rows``
    entries of ``order`` (a level's smaller children, partitioned to the front). With ELIDE a
    document adds nothing to its feature's hot code ``hot[f]`` (filled in afterwards from the
    node totals). With PACK (int32 cells) g and h go as one 64-bit add h · 2^32 + g into
    pack [F, K, 256] (two atomics per entry instead of three; unpacked afterwards). With
    COUNTED only the first count[0] entries of ``order`` (at most ``n_rows``) are read."""
    cell = out_ptr.dtype.element_ty
    pos = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    inside = pos < n_rows
    if COUNTED:
        inside &= pos < tl.load(count_ptr)
    if GATHER:
        n = tl.load(order_ptr + pos, mask=inside, other=0).to(tl.int64)
    else:
        n = pos.to(tl.int64)
    node = tl.load(node_ptr + n, mask=inside, other=0).to(tl.int64)
    keep = inside & (node >= 0) & (node < n_nodes)  # the left-out node K adds nothing
    g = tl.load(g_ptr + n, mask=keep, other=0).to(cell)
    h = tl.load(h_ptr + n, mask=keep, other=0).to(cell)
    one = tl.full([BLOCK_N], 1, cell)
    plane = tl.cast(n_feat, tl.int64) * n_nodes * 256  # one channel: F · K · 256 cells
    for f in range(n_feat):
        code = tl.load(codes_ptr + f * tl.cast(N, tl.int64) + n, mask=keep, other=0).to(tl.int64)
        add = keep
        if ELIDE:
            add = keep & (code != tl.load(hot_ptr + f).to(tl.int64))
        slot = (f * n_nodes + node) * 256 + code
        if PACK:
            tl.atomic_add(pack_ptr + slot, (h.to(tl.int64) << 32) + g.to(tl.int64), mask=add, sem="relaxed")
        else:
            tl.atomic_add(out_ptr + slot, g, mask=add, sem="relaxed")
            tl.atomic_add(out_ptr + plane + slot, h, mask=add, sem="relaxed")
        tl.atomic_add(out_ptr + 2 * plane + slot, one, mask=add, sem="relaxed")


@triton.jit
def _finish_kernel(out_ptr, pack_ptr, hot_ptr, totals_ptr, n_feat, n_nodes,
                   PACK: tl.constexpr, ELIDE: tl.constexpr):
    """One (feature, node) row of out [3, F, K, 256] after the adds: with PACK, (Σg, Σh) from the
    packed sums H · 2^32 + G (|G|, |H| < 2^31: G the low 32 bits read as signed, H the rest);
    with ELIDE, the feature's hot cell = the node's total − the row's other cells (0 so far)."""
    pid = tl.program_id(0)
    k = pid % n_nodes
    c = tl.arange(0, 256)
    cell = out_ptr.dtype.element_ty
    plane = tl.cast(n_feat, tl.int64) * n_nodes * 256
    row = pid.to(tl.int64) * 256 + c
    if PACK:
        packed = tl.load(pack_ptr + row)
        g = (packed << 32) >> 32
        h = (packed - g) >> 32
    if ELIDE:
        hot = tl.load(hot_ptr + pid // n_nodes).to(tl.int32)
    for ch in tl.static_range(3):
        if PACK and ch == 0:
            cells = g
        elif PACK and ch == 1:
            cells = h
        else:
            cells = tl.load(out_ptr + ch * plane + row).to(tl.int64)
        if ELIDE:
            total = tl.load(totals_ptr + ch * n_nodes + k)
            cells = tl.where(c == hot, total - tl.sum(cells, 0), cells)
        tl.store(out_ptr + ch * plane + row, cells.to(cell))


def quantize(values: torch.Tensor, bits: int = 16) -> tuple[torch.Tensor, float]:
    """Round ``values`` [N] to int32 in [−(2^(b−1) − 1), 2^(b−1) − 1]; returns (q, scale) with
    values ≈ q / scale."""
    top = float(values.abs().max()) if values.numel() else 0.0
    scale = (2 ** (bits - 1) - 1) / top if top > 0 else 1.0
    return torch.round(values * scale).to(torch.int32), scale


def level_histogram_triton(codes_t: torch.Tensor, node: torch.Tensor, grad: torch.Tensor,
                           hess: torch.Tensor, n_nodes: int, *, dtype: torch.dtype | None = None,
                           out: torch.Tensor | None = None, block_n: int = 256,
                           order: torch.Tensor | None = None, n_rows: int | None = None,
                           hot: torch.Tensor | None = None, totals: torch.Tensor | None = None) -> torch.Tensor:
    """Histograms of a level, as :func:`rankkit.boosting.tree.build_histograms` (one launch).

    Args:
        codes_t: [F, N] uint8 codes, feature-major.
        node: [N] int32 or int64, each document's node; a node outside 0..n_nodes−1 (the
            reference's left-out node ``n_nodes``) is skipped.
        grad, hess: [N] float32 / float64, or int32 / int64 quantized gradients and hessians.
        n_nodes: K.
        dtype: the cells' dtype (int32, int64, float32, float64); None: int64 for integer
            inputs, else grad's dtype.
        out: a preallocated [3, F, K, 256] buffer of that dtype to zero and fill (a captured
            round reuses it), or None.
        block_n: documents per program.
        order: [N] long, a permutation of the documents whose first ``n_rows`` entries hold
            every document of nodes 0..K−1 (a partition, :func:`smaller_first`), or None: the
            kernel then reads only those ``n_rows`` documents (the codes of the others are
            never fetched), instead of sweeping all N and masking the left-out ones.
        n_rows: the entries of ``order`` to read (N when None); without ``order``, N.
        hot: [F] int64, a code per feature whose cells are not added document by document but
            filled in at the end as the node's total minus the feature's other cells (hot-bin
            elision: a feature with 90 % of its documents in one bin sends a tenth of the
            atomics, and none to the one hot address); integer cells only (exact); None: every
            document adds to every feature.
        totals: [3, K] (ΣG, ΣH, count) of each node's documents, in any integer dtype: the
            totals the hot cells are filled from (required with ``hot``).
    Returns:
        [3, F, K, 256]: channel 0 Σg, 1 Σh, 2 the document count.
    """
    if hot is not None and (totals is None or tuple(totals.shape) != (3, n_nodes)):
        raise ValueError(f"`hot`: hot-bin elision needs integer cells and `totals` [3, {n_nodes}]")
    out, packed = level_histogram_raw(codes_t, node, grad, hess, n_nodes, dtype=dtype, out=out, block_n=block_n,
                                      order=order, n_rows=n_rows, hot=hot)
    n_feat, n = codes_t.shape
    rows = n if order is None or n_rows is None else min(int(n_rows), n)
    if (packed is not None or hot is not None) and rows and out.numel():  # one launch: unpack, fill the hot cells
        any_ = out if packed is None else packed
        _finish_kernel[(n_feat * n_nodes,)](out, any_, any_ if hot is None else hot.contiguous(),
                                            any_ if hot is None else totals.to(torch.int64).contiguous(),
                                            n_feat, n_nodes, PACK=packed is not None, ELIDE=hot is not None)
    return out


def level_histogram_raw(codes_t: torch.Tensor, node: torch.Tensor, grad: torch.Tensor, hess: torch.Tensor,
                        n_nodes: int, *, dtype: torch.dtype | None = None, out: torch.Tensor | None = None,
                        block_n: int = 256, order: torch.Tensor | None = None, n_rows: int | None = None,
                        hot: torch.Tensor | None = None, packed: torch.Tensor | None = None,
                        zeroed: bool = False, count: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The adds of :func:`level_histogram_triton` without its finishing launch: (out, packed),
    ``packed`` [F, K, 256] int64 the packed (Σg, Σh) of int32 cells of integer gradients (then
    ``out`` holds only the counts), else None; with ``hot`` the hot cells are still 0. The levels
    (:func:`rankkit.kernels.triton.tree.grow_levels_triton`) finish the rows as they scan them,
    and zero the next level's ``out`` and ``packed`` as they go: with
    ``zeroed`` both are given already zero (no launch to clear them). ``count``: [1] int32 on
    the device, how many of ``order``'s first ``n_rows`` entries to read (the routing's
    compaction), or None: all of them."""
    n_feat, n = codes_t.shape
    if dtype is None:
        dtype = grad.dtype if grad.dtype.is_floating_point else torch.int64
    if dtype not in _CELL_DTYPES:
        raise ValueError(f"`dtype` must be one of {_CELL_DTYPES}, got {dtype}")
    if grad.dtype.is_floating_point and not dtype.is_floating_point:
        raise ValueError("`dtype`: float gradients need float cells (quantize them first)")
    if hot is not None and dtype.is_floating_point:
        raise ValueError("`hot`: hot-bin elision needs integer cells")
    shape = (3, n_feat, n_nodes, N_CODES)
    if out is None:
        out = torch.zeros(shape, dtype=dtype, device=codes_t.device)
    else:
        if tuple(out.shape) != shape or out.dtype != dtype or not out.is_contiguous():
            raise ValueError(f"`out` must be a contiguous {shape} {dtype} tensor, got "
                             f"{tuple(out.shape)} {out.dtype}")
        if not zeroed:
            out.zero_()
    # int32 cells of integer gradients (the caller bounds every sum below 2^31): g and h packed.
    pack = dtype == torch.int32 and not grad.dtype.is_floating_point
    if not pack:
        packed = None
    elif packed is None:
        packed = torch.zeros(n_feat * n_nodes * N_CODES, dtype=torch.int64, device=out.device)
    elif not zeroed:
        packed.zero_()
    rows = n if order is None or n_rows is None else min(int(n_rows), n)
    if rows == 0 or n_feat == 0 or n_nodes == 0:
        return out, packed
    kernel = None if count is not None else _shared_kernel(codes_t, node, grad, hess, dtype)
    if kernel is not None:  # S3: shared-memory cells, one global atomic per non-empty cell and block
        kernel(codes_t, node, grad, hess, n_nodes, out, order=order, n_rows=n_rows, hot=hot)
        return out, None
    elide = hot is not None
    _histogram_kernel[(triton.cdiv(rows, block_n),)](
        codes_t.contiguous(), node.contiguous(), grad.contiguous(), hess.contiguous(), out,
        node if order is None else order.contiguous(), hot.contiguous() if elide else node,
        out if packed is None else packed, node if count is None else count, n, rows, n_feat, n_nodes,
        BLOCK_N=block_n, GATHER=order is not None, ELIDE=elide, PACK=pack, COUNTED=count is not None)
    return out, packed


def _shared_kernel(codes_t, node, grad, hess, dtype):
    """The shared-memory histogram (:mod:`rankkit.kernels.shared_histogram`) where it takes this
    call (``RANKKIT_CUDA_HISTOGRAM=1``, a CUDA device, int16 or int64 nodes, and int32 quantized
    gradients into int32 or int64 cells or 64-bit fixed-point ones into int64 cells) and passed its
    first-contact check on the device; else None."""
    if not cuda_histogram_takes(codes_t.device) or grad.dtype != hess.dtype:
        return None
    if node.dtype not in (torch.int16, torch.int64):
        return None
    if (grad.dtype, dtype) not in ((torch.int32, torch.int32), (torch.int32, torch.int64), (torch.int64, torch.int64)):
        return None
    return shared_histogram.shared_histogram_for(codes_t.device)
