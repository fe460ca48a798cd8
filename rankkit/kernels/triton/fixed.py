"""The round's float gradients as 64-bit fixed point, in Triton: two launches, no host sync.

:func:`rankkit.kernels.backends.fixed_point` (the torch reference) turns the round's g and h [n]
into int64 multiples of 2^−S, S per channel the largest shift with n · max|x| · 2^S ≤ 2^62
(:func:`rankkit.kernels.torch_ref.fixed_point_factor`), so that every sum of them is exact in
any order: the GPU histograms' integer atomics give the same tree run after run. In torch that is
about fourteen launches (the largest |x|, the shift's five element-wise steps, the scaling, the
rounding and its cast). Here:

* :func:`_scale_kernel`: each program the largest |g| and |h| of its run of documents, written
  to its own slot; the program that finishes last (an acquire-release counter after a barrier,
  the count reset for the next call) takes the largest of them, the shift S as the reference
  computes it, and writes 2^S, 2^−S and the root's document count, and clears the root's sums;
* :func:`_round_kernel`: x · 2^S rounded half to even (as ``torch.round``) to int64, and each
  program's sums of its values added to the root's (ΣG, ΣH) (integer atomics: exact), which the
  first level's hot cells are filled from.

On the way the two kernels clear what the tree's first launches accumulate into or read as
zeros (the documents' nodes, the levels' counters, the root histogram's cells), so that no
launch of its own clears them (S5: ../shared/design/gpu-round.md).

A NaN gradient makes the scale NaN, as the reference's, so that the leaves it reaches are NaN and
the round says so.

``quantized_grad``'s stochastic rounding (:meth:`FixedPoint.quantize`) takes the same shape: the
scales from the programs' maxima by the last one, the reference's ``torch.rand`` draws, then the
rounding with the root's sums; and the quantized round's leaf sums take their factors from
:meth:`FixedPoint.factors` (one launch).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from rankkit.kernels.workspace import workspace_or_fresh

# Documents per program of both kernels, and at most this many programs write a partial maximum.
BLOCK = 1024
MAX_PROGRAMS = 1024


@triton.jit
def _nan_max(x):
    """The largest of ``x`` [B], NaN if any is (a reduction's maximum may drop a NaN)."""
    return tl.where(tl.sum((x != x).to(tl.int32), 0) > 0, float("nan"), tl.max(x, 0))


@triton.jit
def _partial_maxima(g_ptr, h_ptr, part_ptr, counter_ptr, N, per_program, programs, BLOCK: tl.constexpr):
    """part[pid] = (max|g|, max|h|) of documents pid · per_program … (NaN if one is), then one
    acquire-release add to the counter after a barrier: True in the program that finishes last,
    which then sees every program's maxima (read them past L1, ``.cg``)."""
    pid = tl.program_id(0)
    start = pid.to(tl.int64) * per_program
    stop = tl.minimum(start + per_program, N)
    top_g = tl.zeros([BLOCK], dtype=tl.float64)
    top_h = tl.zeros([BLOCK], dtype=tl.float64)
    for c0 in range(start, stop, BLOCK):
        n = c0 + tl.arange(0, BLOCK)
        inside = n < stop
        top_g = tl.maximum(top_g, tl.abs(tl.load(g_ptr + n, mask=inside, other=0.0)), propagate_nan=tl.PropagateNan.ALL)
        top_h = tl.maximum(top_h, tl.abs(tl.load(h_ptr + n, mask=inside, other=0.0)), propagate_nan=tl.PropagateNan.ALL)
    tl.store(part_ptr + 2 * pid, _nan_max(top_g))
    tl.store(part_ptr + 2 * pid + 1, _nan_max(top_h))
    tl.debug_barrier()
    done = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    return done == programs - 1


@triton.jit
def _last_epilogue(root_ptr, clear_ptr, counter_ptr, N, n_clear, BLOCK_P: tl.constexpr):
    """The last program's end: root[2] = N, clear [n_clear] int32 zeroed (the levels'
    counters), and the programs' counter reset for the next call."""
    p = tl.arange(0, BLOCK_P)
    tl.store(root_ptr + 2, tl.cast(N, tl.int64))
    for i0 in range(0, n_clear, BLOCK_P):
        tl.store(clear_ptr + i0 + p, tl.zeros([BLOCK_P], dtype=tl.int32), mask=i0 + p < n_clear)
    tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")


@triton.jit
def _clear_strided(ptr, n, BLOCK: tl.constexpr):
    """ptr [n] zeroed, a stride of the grid at a time (any integer dtype)."""
    for c0 in range(tl.program_id(0).to(tl.int64) * BLOCK, n, tl.num_programs(0).to(tl.int64) * BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        tl.store(ptr + c, tl.zeros([BLOCK], dtype=ptr.dtype.element_ty), mask=c < n)


@triton.jit
def _scale_kernel(g_ptr, h_ptr, part_ptr, counter_ptr, factor_ptr, root_ptr, clear_ptr, N, per_program, programs,
                  top_shift, n_clear, BLOCK: tl.constexpr, BLOCK_P: tl.constexpr):
    """part[pid] = (max|g|, max|h|) of documents pid · per_program …; the last program: factor
    [4] = (2^S_g, 2^S_h, 2^−S_g, 2^−S_h), S = min(900, ⌊top_shift − log2(max(top, 1e−280))⌋)
    (``top_shift`` = 62 − log2 n, from the host as the reference takes it), root [3] =
    (0, 0, N), and clear [n_clear] int32 zeroed (the levels' counters)."""
    if _partial_maxima(g_ptr, h_ptr, part_ptr, counter_ptr, N, per_program, programs, BLOCK):
        p = tl.arange(0, BLOCK_P)
        for ch in tl.static_range(2):
            top = _nan_max(tl.load(part_ptr + 2 * p + ch, mask=p < programs, other=0.0, cache_modifier=".cg"))
            shift = tl.minimum(tl.floor(top_shift - tl.log2(tl.maximum(top, 1e-280))), 900.0)
            shift = tl.where(top != top, top, shift)  # NaN stays NaN (the reference's clamp keeps it)
            factor = tl.exp2(shift)
            tl.store(factor_ptr + ch, factor)
            tl.store(factor_ptr + 2 + ch, 1.0 / factor)
            tl.store(root_ptr + ch, 0)
        _last_epilogue(root_ptr, clear_ptr, counter_ptr, N, n_clear, BLOCK_P)


@triton.jit
def _round_kernel(g_ptr, h_ptr, factor_ptr, gq_ptr, hq_ptr, root_ptr, node_ptr, cells_ptr, N, n_cells,
                  BLOCK: tl.constexpr):
    """g_q, h_q [N] int64 = round(x · 2^S), half to even; their sums added to root [0], [1];
    node [N] int64 and cells [n_cells] int64 (the root histogram's) zeroed, the cells a stride
    of the grid at a time."""
    n = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = n < N
    tl.store(node_ptr + n, tl.zeros([BLOCK], dtype=tl.int64), mask=inside)
    _clear_strided(cells_ptr, n_cells, BLOCK)
    for ch in tl.static_range(2):
        if ch == 0:
            x = tl.load(g_ptr + n, mask=inside, other=0.0) * tl.load(factor_ptr)
        else:
            x = tl.load(h_ptr + n, mask=inside, other=0.0) * tl.load(factor_ptr + 1)
        r = tl.floor(x)
        d = x - r
        odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
        fixed = (r + tl.where((d > 0.5) | ((d == 0.5) & odd), 1.0, 0.0)).to(tl.int64)
        fixed = tl.where(inside, fixed, 0)
        if ch == 0:
            tl.store(gq_ptr + n, fixed, mask=inside)
        else:
            tl.store(hq_ptr + n, fixed, mask=inside)
        tl.atomic_add(root_ptr + ch, tl.sum(fixed, 0), sem="relaxed")


@triton.jit
def _quantize_scale_kernel(g_ptr, h_ptr, part_ptr, counter_ptr, scale_ptr, root_ptr, clear_ptr, N, per_program,
                           programs, half_bins, bins, n_clear, BLOCK: tl.constexpr, BLOCK_P: tl.constexpr):
    """``quantized_grad``'s scales: part[pid] = (max|g|, max|h|) of the program's documents; the
    last program: scale [2] = (max|g| / (B/2), max|h| / B), 1 where not above 0 (NaN included),
    as :func:`rankkit.kernels.torch_ref.quantize_gradients`; root [3] = (0, 0, N); clear
    [n_clear] int32 zeroed (the levels' counters)."""
    if _partial_maxima(g_ptr, h_ptr, part_ptr, counter_ptr, N, per_program, programs, BLOCK):
        p = tl.arange(0, BLOCK_P)
        for ch in tl.static_range(2):
            top = _nan_max(tl.load(part_ptr + 2 * p + ch, mask=p < programs, other=0.0, cache_modifier=".cg"))
            top = top / (half_bins if ch == 0 else bins)
            tl.store(scale_ptr + ch, tl.where(top > 0.0, top, 1.0))
            tl.store(root_ptr + ch, 0)
        _last_epilogue(root_ptr, clear_ptr, counter_ptr, N, n_clear, BLOCK_P)


@triton.jit
def _quantize_round_kernel(g_ptr, h_ptr, u_ptr, scale_ptr, gq_ptr, hq_ptr, root_ptr, node_ptr, cells_ptr, pack_ptr,
                           N, n_node, n_cells, n_pack, BLOCK: tl.constexpr):
    """g_q, h_q [N] int32 = ⌊x / s + u⌋ (u [2, N] the round's draws), their sums added to root [0], [1];
    node [n_node] int64, cells [n_cells] int32 and pack [n_pack] int64 (the root histogram's cells
    and packed sums) zeroed, the cells a stride of the grid at a time."""
    n = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = n < N
    tl.store(node_ptr + n, tl.zeros([BLOCK], dtype=tl.int64), mask=n < n_node)
    _clear_strided(cells_ptr, n_cells, BLOCK)
    _clear_strided(pack_ptr, n_pack, BLOCK)
    for ch in tl.static_range(2):
        if ch == 0:
            x = tl.load(g_ptr + n, mask=inside, other=0.0) / tl.load(scale_ptr)
        else:
            x = tl.load(h_ptr + n, mask=inside, other=0.0) / tl.load(scale_ptr + 1)
        q = tl.where(inside, tl.floor(x + tl.load(u_ptr + ch * N + n, mask=inside, other=0.0)).to(tl.int32), 0)
        if ch == 0:
            tl.store(gq_ptr + n, q, mask=inside)
        else:
            tl.store(hq_ptr + n, q, mask=inside)
        tl.atomic_add(root_ptr + ch, tl.sum(q.to(tl.int64), 0), sem="relaxed")


def _grid(n: int) -> tuple[int, int]:
    """(programs, documents per program, a multiple of BLOCK) of the partial maxima over n
    documents: at most :data:`MAX_PROGRAMS`, at least one."""
    programs = max(1, min(MAX_PROGRAMS, triton.cdiv(n, BLOCK)))
    per_program = triton.cdiv(triton.cdiv(max(n, 1), programs), BLOCK) * BLOCK
    return max(1, triton.cdiv(n, per_program)), per_program


class FixedPoint:
    """:func:`rankkit.kernels.backends.fixed_point` in two launches, with the buffers of a fit
    (a counter, the partial maxima, the factors, the root's sums) allocated once; its results
    come from ``workspace`` (a :class:`~rankkit.kernels.workspace.Workspace` or scope:
    valid until the next call; None: new tensors every call)."""

    def __init__(self, device: torch.device, workspace=None):
        self.device = device
        self.workspace = workspace_or_fresh(workspace)
        self.counter = torch.zeros(1, dtype=torch.int32, device=device)
        self.part = torch.empty(2 * MAX_PROGRAMS, dtype=torch.float64, device=device)
        self.factor = torch.empty(4, dtype=torch.float64, device=device)
        self.no_counters = torch.empty(0, dtype=torch.int32, device=device)
        self.root = torch.empty(3, dtype=torch.int64, device=device)  # the root's sums where no one reads them
        self.no_cells = torch.empty(0, dtype=torch.int64, device=device)

    def quantize(self, g: torch.Tensor, h: torch.Tensor, n_bins: int, generator: torch.Generator | None, *,
                 clear: dict | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """:func:`rankkit.kernels.torch_ref.quantize_gradients` of float64 g, h [n] (one process, at
        least one document) in three launches, its draws the same (one ``torch.rand`` from
        ``generator``): (g_q, h_q [n] int32, scale [2] float64, root [3] int64 = (Σg_q, Σh_q, n)),
        bit for bit, from the workspace. ``clear``: the tree's first buffers, zeroed on the way
        ("node" int64, "counters" int32, "cells" int32, "pack" int64; contiguous), or None."""
        n, ws = g.shape[0], self.workspace
        clear = clear or {}
        node, counters = clear.get("node", self.no_cells), clear.get("counters", self.no_counters)
        cells, pack = clear.get("cells", self.no_counters), clear.get("pack", self.no_cells)
        g, h = g.contiguous(), h.contiguous()
        scale = ws.empty("quantize.scale", 2, torch.float64, g.device)
        root = ws.empty("quantize.root", 3, torch.int64, g.device)
        programs, per_program = _grid(n)
        _quantize_scale_kernel[(programs,)](g, h, self.part, self.counter, scale, root, counters, n, per_program,
                                            programs, n_bins / 2, float(n_bins), counters.numel(), BLOCK=BLOCK,
                                            BLOCK_P=max(16, triton.next_power_of_2(programs)))
        u = torch.rand(2, n, generator=generator, out=ws.empty("quantize.draws", (2, n), torch.float64, g.device))
        g_q = ws.empty("quantize.g", n, torch.int32, g.device)
        h_q = ws.empty("quantize.h", n, torch.int32, g.device)
        _quantize_round_kernel[(triton.cdiv(n, BLOCK),)](g, h, u, scale, g_q, h_q, root, node, cells, pack, n,
                                                         node.numel(), cells.numel(), pack.numel(), BLOCK=BLOCK)
        return g_q, h_q, scale, root

    def factors(self, g: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """[4] float64 (2^S_g, 2^S_h, 2^−S_g, 2^−S_h) of float64 g, h [n] in one launch: the
        reference's :func:`~rankkit.kernels.torch_ref.fixed_point_factor` of their largest |g|,
        |h| and n. This object's buffer, valid until its next call."""
        n = g.shape[0]
        g, h = g.contiguous(), h.contiguous()
        programs, per_program = _grid(n)
        _scale_kernel[(programs,)](g, h, self.part, self.counter, self.factor, self.root, self.no_counters, n,
                                   per_program, programs, 62.0 - math.log2(max(n, 1)), 0, BLOCK=BLOCK,
                                   BLOCK_P=max(16, triton.next_power_of_2(programs)))
        return self.factor

    def __call__(self, g: torch.Tensor, h: torch.Tensor, *, node: torch.Tensor | None = None,
                 counters: torch.Tensor | None = None, cells: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(g_q, h_q [n] int64, scale [2] float64 = 2^−S, root [3] int64 = (Σg_q, Σh_q, n)) of
        float64 g, h [n]: the reference's g_q, h_q and scale, bit for bit. ``scale`` is this
        object's buffer, valid until its next call (the round's). The tree's first buffers are
        zeroed on the way, so that no launch clears them: ``node`` [n] int64, ``counters`` int32
        and ``cells`` int64 (contiguous; None: none)."""
        n = g.shape[0]
        counters = self.no_counters if counters is None else counters
        cells = self.no_cells if cells is None else cells
        ws = self.workspace
        node = ws.empty("node", n, torch.int64, g.device) if node is None else node
        g, h = g.contiguous(), h.contiguous()
        g_q = ws.empty("g", n, torch.int64, g.device)
        h_q = ws.empty("h", n, torch.int64, g.device)
        root = ws.empty("root", 3, torch.int64, g.device)
        programs, per_program = _grid(n)
        _scale_kernel[(programs,)](g, h, self.part, self.counter, self.factor, root, counters, n, per_program,
                                   programs, 62.0 - math.log2(max(n, 1)), counters.numel(), BLOCK=BLOCK,
                                   BLOCK_P=max(16, triton.next_power_of_2(programs)))
        _round_kernel[(max(1, triton.cdiv(n, BLOCK)),)](g, h, self.factor, g_q, h_q, root, node, cells, n,
                                                        cells.numel(), BLOCK=BLOCK)
        return g_q, h_q, self.factor[2:], root
