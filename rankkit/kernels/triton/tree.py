"""Triton kernels of an oblivious tree's levels: split scan with argmax, routing, children
histograms, and the score update.

They follow the torch reference of :class:`rankkit.boosting.tree.ObliviousTreeGrower`
(``_levels_torch``, :func:`~rankkit.boosting.tree.split_scores`,
:func:`~rankkit.boosting.tree.leaf_of`) decision for decision, with every decision a device
tensor (no host sync), and :func:`grow_levels_triton` composes them into the same levels:

* :func:`_split_kernel`, one program per feature: for every node the cumulative (G, H, count)
  over the codes (integer scans for quantized histograms, scaled once), the Newton score of
  both children summed over the nodes, the min-data / min-hessian masks, the optional noise
  (CatBoost's ``random_strength``), and the feature's best code (first maximum);
* :func:`_pick_kernel`, one program: the level's (feature, code) as the first maximum over
  the features, the gain, the "stopped" flag (no allowed split: this and the later levels
  send everything left, code 255), and which child of each node is the smaller;
* :func:`_route_kernel`: each document's node gains its bit, and its slot in the children's
  histogram (the smaller child of its parent, or the left-out node K);
* the documents partitioned by slot (:func:`~rankkit.kernels.triton.histogram.smaller_first`,
  one stable sort of int16 keys), so that the children's histogram reads only the smaller
  children's documents (at most half of them) through the partition, as XGBoost's and
  LightGBM's GPU histograms read only the node being built;
* :func:`_siblings_kernel`: the larger child of each pair as parent − smaller child (the
  subtraction trick), written straight into the next level's [3, F, 2K, 256] layout;
* :func:`_score_update_kernel`: a tree's leaf value added to each document's score, the leaf
  found from the codes (eval sets) or given (training set).

The score is that of the reference (Tunys, "LambdaMART Demystified", 2015; the oblivious
trees of CatBoost, Prokhorenkova et al., "CatBoost: unbiased boosting with categorical
features", NeurIPS 2018)::

    score(f, c) = Σ_nodes [ G_L² / (H_L + λ) + G_R² / (H_R + λ) − G² / (H + λ) ]

with each node's G, H taken from the same prefix sums as G_L, H_L (a cut that moves no
document gains exactly 0) and the nodes summed in node order, as the reference.

Notation: N documents, F features, K nodes of the level, D depth, 256 codes.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from rankkit.kernels.torch_ref import TINY
from rankkit.kernels.triton.histogram import level_histogram_triton, smaller_first

N_CODES = 256


@triton.jit
def _split_kernel(hist_ptr, valid_ptr, scale_ptr, noise_ptr, best_ptr, code_ptr, n_feat, n_nodes,
                  l2, min_data, min_hess, tiny,
                  QUANT: tl.constexpr, HAS_NOISE: tl.constexpr):
    """Per feature f: best_ptr[0, f] the best noise-free score, [1, f] the best noisy score,
    [2, f] the noise-free score at the noisy best; code_ptr[0, f], [1, f] their codes."""
    f = tl.program_id(0)
    c = tl.arange(0, 256)
    plane = tl.cast(n_feat, tl.int64) * n_nodes * 256
    gain = tl.zeros([256], dtype=tl.float64)
    bad = tl.zeros([256], dtype=tl.int1)
    last = c == 255
    if QUANT:
        sg = tl.load(scale_ptr)
        sh = tl.load(scale_ptr + 1)
    for k in range(n_nodes):
        row = (f.to(tl.int64) * n_nodes + k) * 256 + c
        if QUANT:  # integer scans are exact; scaled once
            gl = tl.cumsum(tl.load(hist_ptr + row), 0).to(tl.float64) * sg
            hl = tl.cumsum(tl.load(hist_ptr + plane + row), 0).to(tl.float64) * sh
        else:
            gl = tl.cumsum(tl.load(hist_ptr + row).to(tl.float64), 0)
            hl = tl.cumsum(tl.load(hist_ptr + plane + row).to(tl.float64), 0)
        nl = tl.cumsum(tl.load(hist_ptr + 2 * plane + row).to(tl.float64), 0)
        # The node's totals from the same prefix sums: a cut that moves no document gains 0.
        gt = tl.sum(tl.where(last, gl, 0.0), 0)
        ht = tl.sum(tl.where(last, hl, 0.0), 0)
        nt = tl.sum(tl.where(last, nl, 0.0), 0)
        gr, hr, nr = gt - gl, ht - hl, nt - nl
        node = gt * gt / tl.maximum(ht + l2, tiny)
        # Summed over the nodes in node order (the reference's fixed order).
        gain += gl * gl / tl.maximum(hl + l2, tiny) + gr * gr / tl.maximum(hr + l2, tiny) - node
        bad |= ((nl > 0) & (nl < min_data)) | ((nr > 0) & (nr < min_data))
        bad |= ((nl > 0) & (hl < min_hess)) | ((nr > 0) & (hr < min_hess))
    valid = tl.load(valid_ptr + f.to(tl.int64) * 256 + c) != 0
    score = tl.where(valid & ~bad, gain, -float("inf"))
    best = tl.argmax(score, 0, tie_break_left=True)
    tl.store(best_ptr + f, tl.max(score, 0))
    tl.store(code_ptr + f, best.to(tl.int32))
    if HAS_NOISE:
        noisy = score + tl.load(noise_ptr + f.to(tl.int64) * 256 + c)
        pick = tl.argmax(noisy, 0, tie_break_left=True)
        tl.store(best_ptr + n_feat + f, tl.max(noisy, 0))
        tl.store(best_ptr + 2 * n_feat + f, tl.sum(tl.where(c == pick, score, 0.0), 0))
        tl.store(code_ptr + n_feat + f, pick.to(tl.int32))


@triton.jit
def _pick_kernel(best_ptr, code_ptr, hist_ptr, feats_ptr, cuts_ptr, gains_ptr, stopped_ptr,
                 small_ptr, totals_ptr, level, n_feat, n_nodes,
                 HAS_NOISE: tl.constexpr, BLOCK_F: tl.constexpr, LAST: tl.constexpr, TOTALS: tl.constexpr):
    """The level's split from the per-feature bests (one program), and the smaller child of
    each node (``small_ptr[k]``: 1 when the right child is the smaller, ties right); with
    TOTALS also each smaller child's (ΣG, ΣH, count) into totals [3, K] int64 (integer cells),
    what its histogram's elided hot cells are filled from."""
    f = tl.arange(0, BLOCK_F)
    in_f = f < n_feat
    clean = tl.load(best_ptr + f, mask=in_f, other=-float("inf"))
    top = tl.max(clean, 0)
    stopped = (tl.load(stopped_ptr) != 0) | ~(top > 0.0)
    if HAS_NOISE:
        noisy = tl.load(best_ptr + n_feat + f, mask=in_f, other=-float("inf"))
        pick = tl.argmax(noisy, 0, tie_break_left=True)
        code = tl.sum(tl.where(f == pick, tl.load(code_ptr + n_feat + f, mask=in_f, other=0), 0), 0)
        gain = tl.sum(tl.where(f == pick, tl.load(best_ptr + 2 * n_feat + f, mask=in_f, other=0.0), 0.0), 0)
    else:
        pick = tl.argmax(clean, 0, tie_break_left=True)
        code = tl.sum(tl.where(f == pick, tl.load(code_ptr + f, mask=in_f, other=0), 0), 0)
        gain = top
    code = tl.where(stopped, 255, code)
    tl.store(feats_ptr + level, pick.to(tl.int64))
    tl.store(cuts_ptr + level, code.to(tl.int64))
    tl.store(gains_ptr + level, tl.where(stopped, 0.0, gain))
    tl.store(stopped_ptr, stopped.to(tl.int8))
    if not LAST:
        c = tl.arange(0, 256)
        plane = tl.cast(n_feat, tl.int64) * n_nodes * 256
        for k in range(n_nodes):
            row = (pick.to(tl.int64) * n_nodes + k) * 256 + c
            counts = tl.load(hist_ptr + 2 * plane + row)
            left = tl.sum(tl.where(c <= code, counts, 0), 0)
            total = tl.sum(counts, 0)
            small_right = total - left <= left
            tl.store(small_ptr + k, small_right.to(tl.int8))
            if TOTALS:
                for ch in tl.static_range(3):
                    cells = tl.load(hist_ptr + ch * plane + row).to(tl.int64)
                    part = tl.sum(tl.where(c <= code, cells, 0), 0)
                    tl.store(totals_ptr + ch * n_nodes + k, tl.where(small_right, tl.sum(cells, 0) - part, part))


@triton.jit
def _route_kernel(codes_ptr, node_ptr, slot_ptr, small_ptr, feats_ptr, cuts_ptr, level, N,
                  n_nodes, WITH_SLOT: tl.constexpr, BLOCK_N: tl.constexpr):
    """node += [code_f > c] · K for the level's (f, c); with WITH_SLOT also each document's
    slot in the smaller-children histogram (its parent, or K to leave it out)."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    inside = n < N
    f = tl.load(feats_ptr + level)
    c = tl.load(cuts_ptr + level)
    code = tl.load(codes_ptr + f * N + n, mask=inside, other=0).to(tl.int64)
    parent = tl.load(node_ptr + n, mask=inside, other=0)
    right = code > c
    tl.store(node_ptr + n, parent + right.to(parent.dtype) * n_nodes, mask=inside)
    if WITH_SLOT:
        small_right = tl.load(small_ptr + parent, mask=inside, other=0) != 0
        slot = tl.where(right == small_right, parent, n_nodes)
        tl.store(slot_ptr + n, slot.to(slot_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _siblings_kernel(hist_ptr, small_hist_ptr, small_ptr, out_ptr, total, n_nodes,
                     BLOCK: tl.constexpr):
    """out [3, F, 2K, 256] from the parents hist [3, F, K, 256] and their smaller children."""
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = idx < total
    code = idx % 256
    k = (idx // 256) % n_nodes
    rest = idx // (256 * n_nodes)  # channel · F + feature
    parent = tl.load(hist_ptr + idx, mask=inside, other=0)
    small = tl.load(small_hist_ptr + idx, mask=inside, other=0)
    large = parent - small
    small_right = tl.load(small_ptr + k, mask=inside, other=0) != 0
    left_at = (rest * 2 * n_nodes + k) * 256 + code
    right_at = left_at + n_nodes * 256
    tl.store(out_ptr + left_at, tl.where(small_right, large, small), mask=inside)
    tl.store(out_ptr + right_at, tl.where(small_right, small, large), mask=inside)


@triton.jit
def _score_update_kernel(scores_ptr, leaf_values_ptr, leaf_ptr, codes_ptr, feats_ptr, cuts_ptr, N,
                         DEPTH: tl.constexpr, FROM_CODES: tl.constexpr, BLOCK_N: tl.constexpr):
    """scores[n] += leaf_values[leaf(n)], the leaf given or routed from the codes [F, N]."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    inside = n < N
    if FROM_CODES:
        leaf = tl.zeros([BLOCK_N], dtype=tl.int64)
        for d in tl.static_range(DEPTH):
            f = tl.load(feats_ptr + d)
            c = tl.load(cuts_ptr + d)
            code = tl.load(codes_ptr + f * N + n, mask=inside, other=0).to(tl.int64)
            leaf += (code > c).to(tl.int64) << d
    else:
        leaf = tl.load(leaf_ptr + n, mask=inside, other=0)
    value = tl.load(leaf_values_ptr + leaf, mask=inside, other=0.0)
    score = tl.load(scores_ptr + n, mask=inside, other=0.0)
    tl.store(scores_ptr + n, score + value.to(score.dtype), mask=inside)


@triton.jit
def _exact_leaf_sums_kernel(node_ptr, g_ptr, h_ptr, factor_ptr, part_ptr, N, per_program,
                            N_LEAVES: tl.constexpr, BLOCK_N: tl.constexpr):
    """part[program] [2, N_LEAVES] int64 = Σ round(g · f_g), Σ round(h · f_h) per leaf over the
    program's ``per_program`` documents, tile by tile in registers (one-hot reductions), written
    once: no atomics (the first stage of two; the partials are summed afterwards). Rounding is
    half to even, as ``torch.round``."""
    pid = tl.program_id(0)
    start = pid.to(tl.int64) * per_program
    stop = tl.minimum(start + per_program, N)
    leaves = tl.arange(0, N_LEAVES)
    acc_g = tl.zeros([N_LEAVES], dtype=tl.int64)
    acc_h = tl.zeros([N_LEAVES], dtype=tl.int64)
    f_g = tl.load(factor_ptr)
    f_h = tl.load(factor_ptr + 1)
    for c0 in range(start, stop, BLOCK_N):
        n = c0 + tl.arange(0, BLOCK_N)
        inside = n < stop
        leaf = tl.load(node_ptr + n, mask=inside, other=-1)
        onehot = leaf[:, None] == leaves[None, :]
        for c in tl.static_range(2):
            if c == 0:
                x = tl.load(g_ptr + n, mask=inside, other=0.0).to(tl.float64) * f_g
            else:
                x = tl.load(h_ptr + n, mask=inside, other=0.0).to(tl.float64) * f_h
            r = tl.floor(x)
            d = x - r
            odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
            fixed = (r + tl.where((d > 0.5) | ((d == 0.5) & odd), 1.0, 0.0)).to(tl.int64)
            sums = tl.sum(tl.where(onehot, fixed[:, None], 0), axis=0)
            if c == 0:
                acc_g += sums
            else:
                acc_h += sums
    base = pid.to(tl.int64) * 2 * N_LEAVES
    tl.store(part_ptr + base + leaves, acc_g)
    tl.store(part_ptr + base + N_LEAVES + leaves, acc_h)


# Programs of the first stage of the leaf sums (each a contiguous run of documents).
LEAF_SUM_PROGRAMS = 512


# Leaves up to this count take the one-hot tile reduction (a [BLOCK_N, leaves] tile of 4,096
# cells); deeper trees keep the reference's index_add.
MAX_FUSED_LEAVES = 256


def exact_leaf_sums_triton(node: torch.Tensor, grad: torch.Tensor, hess: torch.Tensor,
                           n_leaves: int, *, block_n: int | None = None) -> torch.Tensor:
    """[2, n_leaves] float64 ΣG and ΣH per leaf as fixed-point integers: bit for bit
    :func:`rankkit.kernels.torch_ref.exact_leaf_sums` (one process), in two stages after the
    scale (the same torch ops as the reference, so the same factor): at most
    :data:`LEAF_SUM_PROGRAMS` programs each write their partial sums (no atomics: the old
    kernel sent every tile's sums to the same 2 · n_leaves addresses), then one sum. ``n_leaves`` at most
    :data:`MAX_FUSED_LEAVES`, a power of two."""
    if n_leaves > MAX_FUSED_LEAVES or n_leaves & (n_leaves - 1):
        raise ValueError(f"`n_leaves` must be a power of two <= {MAX_FUSED_LEAVES}, got {n_leaves}")
    block_n = block_n or max(16, 4096 // n_leaves)
    import math

    n = node.shape[0]
    top = torch.stack([grad.abs().max(), hess.abs().max()]).double() if n else \
        torch.zeros(2, dtype=torch.float64, device=grad.device)
    shift = torch.floor(62.0 - math.log2(max(n, 1)) - torch.log2(top.clamp_min(1e-280))).clamp(max=900.0)
    factor = torch.exp2(shift)
    if not n:
        return torch.zeros(2, n_leaves, dtype=torch.float64, device=grad.device)
    # Two stages, no atomics: each program's partial sums, then one sum over the programs.
    programs = min(LEAF_SUM_PROGRAMS, triton.cdiv(n, block_n))
    per_program = triton.cdiv(triton.cdiv(n, programs), block_n) * block_n
    programs = triton.cdiv(n, per_program)
    part = torch.empty(programs, 2, n_leaves, dtype=torch.int64, device=grad.device)
    _exact_leaf_sums_kernel[(programs,)](
        node.contiguous(), grad.contiguous(), hess.contiguous(), factor, part, n, per_program,
        N_LEAVES=n_leaves, BLOCK_N=block_n)
    return part.sum(0).double() / factor[:, None]


def split_scan_triton(hist: torch.Tensor, valid: torch.Tensor, *, l2: float, min_data_in_leaf: int,
                      min_sum_hessian: float, scale: torch.Tensor | None = None,
                      noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-feature best of one level's split scores (one launch).

    Args:
        hist: [3, F, K, 256] (G, H, count): float64, or int32 / int64 quantized sums.
        valid: [F, 256] bool, the thresholds each feature allows.
        l2, min_data_in_leaf, min_sum_hessian: λ and the child guards of
            :func:`rankkit.boosting.tree.split_scores`.
        scale: [2] float64 (s_g, s_h) of quantized histograms, None for float ones.
        noise: [F, 256] float64 added to the allowed scores for the choice, or None.
    Returns:
        (best [3, F] float64, code [2, F] int32): the best noise-free score per feature and its
        code; with ``noise`` also the best noisy score, the noise-free score at that choice
        and its code (rows 1, 2 of best and 1 of code).
    """
    _, n_feat, n_nodes, _ = hist.shape
    quant = not hist.dtype.is_floating_point
    if quant and scale is None:
        raise ValueError("`scale`: integer histograms need their (s_g, s_h)")
    best = torch.empty(3, n_feat, dtype=torch.float64, device=hist.device)
    code = torch.empty(2, n_feat, dtype=torch.int32, device=hist.device)
    if n_feat == 0:
        return best, code
    dummy = best
    if valid.dtype != torch.uint8:  # (grow_levels_triton converts once per tree)
        valid = valid.to(torch.uint8)
    _split_kernel[(n_feat,)](hist.contiguous(), valid.contiguous(),
                             dummy if scale is None else scale.to(torch.float64).contiguous(),
                             dummy if noise is None else noise.to(torch.float64).contiguous(),
                             best, code, n_feat, n_nodes, float(l2), float(min_data_in_leaf),
                             float(min_sum_hessian), TINY, QUANT=quant, HAS_NOISE=noise is not None,
                             num_warps=4)
    return best, code


def score_update_triton(scores: torch.Tensor, leaf_values: torch.Tensor, *,
                        leaf: torch.Tensor | None = None, codes_t: torch.Tensor | None = None,
                        features: torch.Tensor | None = None, cuts: torch.Tensor | None = None,
                        block_n: int = 1024) -> torch.Tensor:
    """``scores += leaf_values[leaf]`` in place (one launch); the leaf is ``leaf`` [N], or found
    from ``codes_t`` [F, N] and the tree's ``features`` / ``cuts`` [D] (as
    :func:`rankkit.boosting.tree.leaf_of`). Returns ``scores``."""
    n = scores.shape[0]
    if n == 0:
        return scores
    from_codes = leaf is None
    if from_codes and (codes_t is None or features is None or cuts is None):
        raise ValueError("`leaf`, or `codes_t`, `features` and `cuts`, must be given")
    depth = 0 if features is None else int(features.shape[0])
    if not scores.is_contiguous():
        raise ValueError("`scores` must be contiguous (it is updated in place)")
    any_ = scores
    _score_update_kernel[(triton.cdiv(n, block_n),)](
        scores, leaf_values.contiguous(), any_ if leaf is None else leaf.contiguous(),
        any_ if codes_t is None else codes_t.contiguous(),
        any_ if features is None else features.to(torch.int64).contiguous(),
        any_ if cuts is None else cuts.to(torch.int64).contiguous(), n,
        DEPTH=depth, FROM_CODES=from_codes, BLOCK_N=block_n)
    return scores


def grow_levels_triton(codes_t: torch.Tensor, g: torch.Tensor, h: torch.Tensor,
                       scale: torch.Tensor | None, valid: torch.Tensor, *, depth: int, l2: float,
                       min_data_in_leaf: int, min_sum_hessian: float,
                       noise: torch.Tensor | None = None, hist_dtype: torch.dtype | None = None,
                       block_n: int = 256, hot: torch.Tensor | None = None):
    """The levels of one oblivious tree, as the reference's ``_levels_torch``, in
    5–6 launches per level and no host sync.

    Args:
        codes_t: [F, n] uint8, the round's features and documents, feature-major.
        g, h: [n] float64 gradients and hessians, or int32 quantized ones with ``scale``.
        scale: [2] float64 (s_g, s_h) of quantized gradients, or None.
        valid: [F, 256] bool thresholds.
        depth, l2, min_data_in_leaf, min_sum_hessian: the tree's parameters.
        noise: [D, F, 256] float64 split noise, or None.
        hist_dtype: the histogram cells (None: int64 for quantized, float64 otherwise; int32
            halves the atomics' traffic when n · max|g_q| < 2^31).
        hot: [F] int64, each feature's most frequent code
            (:func:`~rankkit.kernels.triton.histogram.hot_codes`), whose cells integer histograms
            fill in from the node totals instead of adding document by document (the root's from
            three sums, a level's smaller children's from the parent's histogram at the level's
            split); None: no elision.
    Returns:
        (node [n] int64, feats [D] int64, cuts [D] int64, gains [D] float64): each document's
        leaf, and each level's feature (an index into ``codes_t``), code and gain.
    """
    device = g.device
    n_feat, n = codes_t.shape
    quant = scale is not None
    if hist_dtype is None:
        hist_dtype = torch.int64 if quant else torch.float64
    codes_t = codes_t.contiguous()
    node = torch.zeros(n, dtype=torch.int64, device=device)
    # Each document's slot in the smaller-children histogram (its parent, or K: left out), as
    # narrow keys for the partition (depth <= 12: K <= 2,048).
    slot = torch.empty(n, dtype=torch.int16, device=device)
    feats = torch.zeros(depth, dtype=torch.int64, device=device)
    cuts = torch.full((depth,), N_CODES - 1, dtype=torch.int64, device=device)
    gains = torch.zeros(depth, dtype=torch.float64, device=device)
    stopped = torch.zeros(1, dtype=torch.int8, device=device)
    small = torch.zeros(max(1, 1 << (depth - 1)), dtype=torch.int8, device=device)
    valid = valid.to(torch.uint8).contiguous()
    if noise is not None:
        noise = noise.to(torch.float64).contiguous()
    if hot is not None and hist_dtype.is_floating_point:
        hot = None  # float cells: the filled-in cell would round differently from the sums
    totals = None
    if hot is not None:  # the root's (ΣG, ΣH, count); each level's smaller children's from _pick_kernel
        # Flat: a level of K nodes reads its first 3K entries as [3, K].
        totals = torch.empty(3 * max(1, 1 << (depth - 1)), dtype=torch.int64, device=device)
        totals[:3] = torch.stack([g.sum(dtype=torch.int64), h.sum(dtype=torch.int64),
                                  torch.full((), n, dtype=torch.int64, device=device)])
    hist = level_histogram_triton(codes_t, node, g, h, 1, dtype=hist_dtype, block_n=block_n, hot=hot,
                                  totals=None if totals is None else totals[:3].view(3, 1))
    block_f = max(16, triton.next_power_of_2(max(n_feat, 1)))
    for level in range(depth):
        n_nodes = 1 << level
        last = level + 1 == depth
        best, code = split_scan_triton(hist, valid, l2=l2, min_data_in_leaf=min_data_in_leaf,
                                       min_sum_hessian=min_sum_hessian, scale=scale,
                                       noise=None if noise is None else noise[level])
        _pick_kernel[(1,)](best, code, hist, feats, cuts, gains, stopped, small,
                           stopped if totals is None else totals, level, n_feat, n_nodes,
                           HAS_NOISE=noise is not None, BLOCK_F=block_f, LAST=last, TOTALS=totals is not None)
        _route_kernel[(triton.cdiv(max(n, 1), block_n),)](
            codes_t, node, slot, small, feats, cuts, level, n, n_nodes, WITH_SLOT=not last,
            BLOCK_N=block_n)
        if last:
            break
        # Documents partitioned by slot, the smaller children first: the histogram reads only
        # those (at most n // 2 documents), never the larger children's codes.
        small_hist = level_histogram_triton(codes_t, slot, g, h, n_nodes, dtype=hist_dtype,
                                            block_n=block_n, order=smaller_first(slot), n_rows=n // 2,
                                            hot=hot, totals=None if totals is None else
                                            totals[:3 * n_nodes].view(3, n_nodes))
        children = torch.empty(3, n_feat, 2 * n_nodes, N_CODES, dtype=hist.dtype, device=device)
        total = hist.numel()
        _siblings_kernel[(triton.cdiv(total, 1024),)](hist, small_hist, small, children, total,
                                                      n_nodes, BLOCK=1024)
        hist = children
    return node, feats, cuts, gains
