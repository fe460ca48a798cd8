"""Triton kernels of an oblivious tree's levels (the rows finished, the siblings, the split scan
and the pick in one launch; routing), the leaf sums, and the score update.

They follow the torch reference of :class:`rankkit.boosting.tree.ObliviousTreeGrower`
(``_levels_torch``, :func:`~rankkit.boosting.tree.split_scores`,
:func:`~rankkit.boosting.tree.leaf_of`) decision for decision, with every decision a device
tensor (no host sync), and :func:`grow_levels_triton` composes them into the same levels:

* :func:`_level_kernel`, one launch a level, one program per feature: for every node its row
  of the level histogram, finished in registers (the packed (Σg, Σh) of int32 cells unpacked,
  the elided hot code filled in from the node totals) and, below the root, the larger child of
  each pair made as parent − smaller child (the subtraction trick; the histogram kernel adds
  only the smaller children); then the cumulative (G, H, count) over the codes (integer scans
  for quantized histograms, scaled once), the Newton score of both children summed over the
  nodes, the min-data / min-hessian masks, the optional noise (CatBoost's
  ``random_strength``), and the feature's best code (first maximum). The program that finishes
  last (a counter with acquire-release semantics, as CUDA's "last block" reductions) picks the
  level's (feature, code) as the first maximum over the features (:func:`_pick_level`), the
  gain, the "stopped" flag (no allowed split: this and the later levels send everything left,
  code 255), and which child of each node is the smaller, with its totals;
* :func:`_route_kernel`: each document's node gains its bit, and its slot in the children's
  histogram (the smaller child of its parent, or the left-out node K);
* the smaller children's documents (at most half of them) compacted by the routing (integer
  cells: one add per tile reserves its places), or partitioned by slot
  (:func:`~rankkit.kernels.triton.histogram.smaller_first`, one stable sort of int16 keys:
  float cells and the shared-memory histogram), so that the children's histogram reads only
  them, as XGBoost's and LightGBM's GPU histograms read only the node being built;
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
from rankkit.kernels.switches import cuda_histogram_takes
from rankkit.kernels.triton.histogram import level_histogram_raw, smaller_first
from rankkit.kernels.workspace import workspace_or_fresh

N_CODES = 256


@triton.jit
def _raw_row(raw_ptr, pack_ptr, hot_ptr, totals_ptr, f, k, n_feat, n_nodes, c,
             PACK: tl.constexpr, ELIDE: tl.constexpr):
    """Row (f, k) of a histogram [3, F, K, 256] as the histogram kernel left it, finished in
    registers (in the cells' dtype): with PACK, (Σg, Σh) unpacked from pack [F, K, 256]
    (H · 2^32 + G: G the low 32 bits read as signed, H the rest); with ELIDE, the feature's hot
    cell = the node's total (totals [3, K]) − the row's other cells (0 so far)."""
    cell = raw_ptr.dtype.element_ty
    plane = tl.cast(n_feat, tl.int64) * n_nodes * 256
    row = (f.to(tl.int64) * n_nodes + k) * 256 + c
    if PACK:
        packed = tl.load(pack_ptr + row)
        g = (packed << 32) >> 32
        h = (packed - g) >> 32
    else:
        g = tl.load(raw_ptr + row)
        h = tl.load(raw_ptr + plane + row)
    n = tl.load(raw_ptr + 2 * plane + row)
    if ELIDE:
        hot = tl.load(hot_ptr + f).to(tl.int32)
        g = g.to(tl.int64)
        h = h.to(tl.int64)
        n = n.to(tl.int64)
        g = tl.where(c == hot, tl.load(totals_ptr + k) - tl.sum(g, 0), g)
        h = tl.where(c == hot, tl.load(totals_ptr + n_nodes + k) - tl.sum(h, 0), h)
        n = tl.where(c == hot, tl.load(totals_ptr + 2 * n_nodes + k) - tl.sum(n, 0), n)
    return g.to(cell), h.to(cell), n.to(cell)


@triton.jit
def _newton_step(g_sum, h_sum, sg, sh, neg_lr, l2, min_hess):
    """A leaf's γ = −η ΣG / (ΣH + λ), 0 where ΣH + λ < max(min_sum_hessian, 1e-300), from its
    fixed-point sums (int64) and their scales 2^−S: the operations of
    :func:`rankkit.kernels.torch_ref.newton_leaf_values` on the sums as
    ``TritonBackend.leaf_values`` took them (× 2^−S is exact, so a fused multiply-add rounds
    as the two operations do)."""
    d = h_sum.to(tl.float64) * sh + l2
    step = neg_lr * (g_sum.to(tl.float64) * sg) / tl.maximum(d, 1e-300, propagate_nan=tl.PropagateNan.ALL)
    return tl.where(d < tl.maximum(min_hess, 1e-300), 0.0, step)


@triton.jit
def _pick_level(best_ptr, code_ptr, hist_ptr, feats_ptr, cuts_ptr, gains_ptr, stopped_ptr, small_ptr,
                totals_ptr, leaf_ptr, scale_ptr, level, n_feat, n_nodes, neg_lr, l2, min_hess,
                HAS_NOISE: tl.constexpr, BLOCK_F: tl.constexpr, LAST: tl.constexpr, TOTALS: tl.constexpr,
                LEAVES: tl.constexpr):
    """The level's split from the per-feature bests, and the smaller child of each node
    (``small_ptr[k]``: 1 when the right child is the smaller, ties right); with TOTALS also each
    smaller child's (ΣG, ΣH, count) into totals [3, K] int64 (integer cells), what its
    histogram's elided hot cells are filled from. At the LAST level with LEAVES (integer cells of
    fixed-point gradients, ``scale_ptr`` their 2^−S), each leaf's Newton step into leaf [0, 2K]
    float64 (:func:`_newton_step`) from its (ΣG, ΣH): node k's cut of the chosen feature's row,
    left into leaf k, right into leaf K + k (everything left when the level stopped); and the
    round's update into leaf [1]: the same values, or zeros if any is not finite (the engine's
    guard, :meth:`rankkit.kernels.backends.Backend.update_values`). Run by the level's last
    program: what the other programs wrote is read past the SM's L1 (``.cg``)."""
    f = tl.arange(0, BLOCK_F)
    in_f = f < n_feat
    clean = tl.load(best_ptr + f, mask=in_f, other=-float("inf"), cache_modifier=".cg")
    top = tl.max(clean, 0)
    stopped = ((level > 0) & (tl.load(stopped_ptr) != 0)) | ~(top > 0.0)  # (not zeroed before level 0)
    if HAS_NOISE:
        noisy = tl.load(best_ptr + n_feat + f, mask=in_f, other=-float("inf"), cache_modifier=".cg")
        pick = tl.argmax(noisy, 0, tie_break_left=True)
        code = tl.sum(tl.where(f == pick, tl.load(code_ptr + n_feat + f, mask=in_f, other=0, cache_modifier=".cg"),
                               0), 0)
        gain = tl.sum(tl.where(f == pick, tl.load(best_ptr + 2 * n_feat + f, mask=in_f, other=0.0,
                                                  cache_modifier=".cg"), 0.0), 0)
    else:
        pick = tl.argmax(clean, 0, tie_break_left=True)
        code = tl.sum(tl.where(f == pick, tl.load(code_ptr + f, mask=in_f, other=0, cache_modifier=".cg"), 0), 0)
        gain = top
    code = tl.where(stopped, 255, code)
    tl.store(feats_ptr + level, pick.to(tl.int64))
    tl.store(cuts_ptr + level, code.to(tl.int64))
    tl.store(gains_ptr + level, tl.where(stopped, 0.0, gain))
    tl.store(stopped_ptr, stopped.to(tl.int8))
    c = tl.arange(0, 256)
    plane = tl.cast(n_feat, tl.int64) * n_nodes * 256
    if LAST and LEAVES:
        sg = tl.load(scale_ptr)
        sh = tl.load(scale_ptr + 1)
        bad = 0
        for k in range(n_nodes):
            row = (pick.to(tl.int64) * n_nodes + k) * 256 + c
            cells_g = tl.load(hist_ptr + row, cache_modifier=".cg").to(tl.int64)
            cells_h = tl.load(hist_ptr + plane + row, cache_modifier=".cg").to(tl.int64)
            left_g = tl.sum(tl.where(c <= code, cells_g, 0), 0)
            left_h = tl.sum(tl.where(c <= code, cells_h, 0), 0)
            for side in tl.static_range(2):
                if side == 0:
                    step = _newton_step(left_g, left_h, sg, sh, neg_lr, l2, min_hess)
                else:
                    step = _newton_step(tl.sum(cells_g, 0) - left_g, tl.sum(cells_h, 0) - left_h, sg, sh, neg_lr,
                                        l2, min_hess)
                tl.store(leaf_ptr + side * n_nodes + k, step)
                tl.store(leaf_ptr + 2 * n_nodes + side * n_nodes + k, step)  # the update: these values ...
                bad += (tl.abs(step) < float("inf")) == 0
        if bad > 0:  # ... or zeros where any is not finite (NaN included)
            for k in range(2 * n_nodes):
                tl.store(leaf_ptr + 2 * n_nodes + k, 0.0)
    if not LAST:
        for k in range(n_nodes):
            row = (pick.to(tl.int64) * n_nodes + k) * 256 + c
            counts = tl.load(hist_ptr + 2 * plane + row, cache_modifier=".cg")
            left = tl.sum(tl.where(c <= code, counts, 0), 0)
            total = tl.sum(counts, 0)
            small_right = total - left <= left
            tl.store(small_ptr + k, small_right.to(tl.int8))
            if TOTALS:
                for ch in tl.static_range(3):
                    cells = tl.load(hist_ptr + ch * plane + row, cache_modifier=".cg").to(tl.int64)
                    part = tl.sum(tl.where(c <= code, cells, 0), 0)
                    tl.store(totals_ptr + ch * n_nodes + k, tl.where(small_right, tl.sum(cells, 0) - part, part))


@triton.jit
def _scan_row(row_g, row_h, row_n, sg, sh, l2, min_data, min_hess, tiny, QUANT: tl.constexpr):
    """One node's row [256] of (G, H, count) scanned over the codes: (the Newton score of the
    split after each code, where it breaks min-data / min-hessian), the cumulative sums integer
    for quantized histograms (exact), scaled once."""
    c = tl.arange(0, 256)
    last = c == 255
    if QUANT:
        gl = tl.cumsum(row_g, 0).to(tl.float64) * sg
        hl = tl.cumsum(row_h, 0).to(tl.float64) * sh
    else:
        gl = tl.cumsum(row_g.to(tl.float64), 0)
        hl = tl.cumsum(row_h.to(tl.float64), 0)
    nl = tl.cumsum(row_n.to(tl.float64), 0)
    # The node's totals from the same prefix sums: a cut that moves no document gains 0.
    gt = tl.sum(tl.where(last, gl, 0.0), 0)
    ht = tl.sum(tl.where(last, hl, 0.0), 0)
    nt = tl.sum(tl.where(last, nl, 0.0), 0)
    gr, hr, nr = gt - gl, ht - hl, nt - nl
    node = gt * gt / tl.maximum(ht + l2, tiny)
    gain = gl * gl / tl.maximum(hl + l2, tiny) + gr * gr / tl.maximum(hr + l2, tiny) - node
    bad = ((nl > 0) & (nl < min_data)) | ((nr > 0) & (nr < min_data))
    bad |= ((nl > 0) & (hl < min_hess)) | ((nr > 0) & (hr < min_hess))
    return gain, bad


@triton.jit
def _zero_row(raw_ptr, pack_ptr, row, plane, PACK: tl.constexpr):
    """Clear row ``row`` of a histogram [3, F, K, 256] before its adds, and with PACK its packed
    (Σg, Σh) too (all three channels even then: the shared-memory histogram, where it takes
    the call, adds into them unpacked)."""
    zero = tl.zeros(row.shape, dtype=raw_ptr.dtype.element_ty)
    tl.store(raw_ptr + row, zero)
    tl.store(raw_ptr + plane + row, zero)
    tl.store(raw_ptr + 2 * plane + row, zero)
    if PACK:
        tl.store(pack_ptr + row, tl.zeros(row.shape, dtype=tl.int64))


@triton.jit
def _level_kernel(hist_ptr, raw_ptr, pack_ptr, parent_ptr, prev_small_ptr, prev_totals_ptr, hot_ptr, valid_ptr,
                  next_raw_ptr, next_pack_ptr, scale_ptr, noise_ptr, best_ptr, code_ptr, counter_ptr, feats_ptr,
                  cuts_ptr, gains_ptr, stopped_ptr, small_ptr, totals_ptr, leaf_ptr, level, n_feat, n_nodes, l2,
                  min_data, min_hess, tiny, neg_lr, CHILDREN: tl.constexpr, PACK: tl.constexpr, ELIDE: tl.constexpr,
                  QUANT: tl.constexpr, HAS_NOISE: tl.constexpr, LAST: tl.constexpr, TOTALS: tl.constexpr,
                  LEAVES: tl.constexpr, ZERO_PACK: tl.constexpr, BLOCK_F: tl.constexpr):
    """One level in one launch, one program per feature f, for every node of the level in node
    order:

    1. the node's row of the level histogram hist [3, F, K, 256]: the root's (CHILDREN false)
       is raw [3, F, K, 256] as the histogram kernel left it, finished (:func:`_raw_row`); a
       child's (CHILDREN) is its parent's row of parent [3, F, K/2, 256] if it is the larger
       child, less the smaller child's finished row of raw [3, F, K/2, 256] (hot cells from
       prev_totals, which child is smaller from prev_small: the subtraction trick), else the
       smaller child's row; written to hist (the next level's parents, or at the LAST level
       with LEAVES the rows the leaves' sums are cut from); and unless LAST the same rows of
       next_raw (the next level's histogram, [3, F, K, 256]) and next_pack ([F, K, 256] int64,
       with ZERO_PACK: the next level's histogram packs, whatever this level's did) zeroed, so
       that no launch clears them;
    2. the split scan over the codes: the cumulative (G, H, count) (integer scans for quantized
       histograms, scaled once), the Newton score of both children summed over the nodes in node
       order, the min-data / min-hessian masks, the optional noise (CatBoost's
       ``random_strength``), and the feature's best code (first maximum): best_ptr[0, f] the
       best noise-free score, [1, f] the best noisy score, [2, f] the noise-free score at the
       noisy best; code_ptr[0, f], [1, f] their codes;
    3. the last program to finish (a counter of the tree's finished programs, after a barrier,
       with acquire-release semantics) picks the level's split (:func:`_pick_level`), and at the
       LAST level with LEAVES the leaves' values (``neg_lr`` = −learning rate).
    """
    f = tl.program_id(0)
    c = tl.arange(0, 256)
    plane = tl.cast(n_feat, tl.int64) * n_nodes * 256
    half = tl.maximum(n_nodes // 2, 1)
    parent_plane = tl.cast(n_feat, tl.int64) * half * 256
    gain = tl.zeros([256], dtype=tl.float64)
    bad = tl.zeros([256], dtype=tl.int1)
    sg = tl.load(scale_ptr) if QUANT else 1.0
    sh = tl.load(scale_ptr + 1) if QUANT else 1.0
    for j in range(n_nodes):
        if CHILDREN:
            right = j >= half  # a level's node j: child of parent j mod K/2, the right one from K/2 on
            k = j - right * half
            small_g, small_h, small_n = _raw_row(raw_ptr, pack_ptr, hot_ptr, prev_totals_ptr, f, k, n_feat, half, c,
                                                 PACK, ELIDE)
            at = (f.to(tl.int64) * half + k) * 256 + c
            take_small = right == (tl.load(prev_small_ptr + k) != 0)
            row_g = tl.where(take_small, small_g, tl.load(parent_ptr + at) - small_g)
            row_h = tl.where(take_small, small_h, tl.load(parent_ptr + parent_plane + at) - small_h)
            row_n = tl.where(take_small, small_n, tl.load(parent_ptr + 2 * parent_plane + at) - small_n)
        else:
            row_g, row_h, row_n = _raw_row(raw_ptr, pack_ptr, hot_ptr, prev_totals_ptr, f, j, n_feat, n_nodes, c,
                                           PACK, ELIDE)
        row = (f.to(tl.int64) * n_nodes + j) * 256 + c
        if not LAST or LEAVES:
            tl.store(hist_ptr + row, row_g)
            tl.store(hist_ptr + plane + row, row_h)
            tl.store(hist_ptr + 2 * plane + row, row_n)
        if not LAST:
            _zero_row(next_raw_ptr, next_pack_ptr, row, plane, ZERO_PACK)
        # Summed over the nodes in node order (the reference's fixed order).
        node_gain, node_bad = _scan_row(row_g, row_h, row_n, sg, sh, l2, min_data, min_hess, tiny, QUANT)
        gain += node_gain
        bad |= node_bad
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
    # Every thread's stores before the barrier, then one release-acquire add to the tree's count
    # of finished programs (zeroed once per tree): the program that takes it to the end of this
    # level's share is the last, and sees what every other program wrote.
    tl.debug_barrier()
    done = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu")
    if done == (level + 1) * n_feat - 1:
        _pick_level(best_ptr, code_ptr, hist_ptr, feats_ptr, cuts_ptr, gains_ptr, stopped_ptr, small_ptr,
                    totals_ptr, leaf_ptr, scale_ptr, level, n_feat, n_nodes, neg_lr, l2, min_hess, HAS_NOISE,
                    BLOCK_F, LAST, TOTALS, LEAVES)


@triton.jit
def _route_kernel(codes_ptr, node_ptr, slot_ptr, small_ptr, feats_ptr, cuts_ptr, order_ptr, count_ptr, level, N,
                  n_nodes, WITH_SLOT: tl.constexpr, COMPACT: tl.constexpr, BLOCK_N: tl.constexpr):
    """node += [code_f > c] · K for the level's (f, c); with WITH_SLOT also each document's
    slot in the smaller-children histogram (its parent, or K to leave it out); with COMPACT
    also the smaller children's documents written to order [N] at the places one add to
    count [1] reserves for the tile (the partition without a sort: in no fixed order on a GPU,
    which integer cells do not see; in document order under the interpreter)."""
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
        if COMPACT:
            take = (inside & (right == small_right)).to(tl.int32)
            base = tl.atomic_add(count_ptr, tl.sum(take, 0), sem="relaxed", scope="gpu")
            at = base + tl.cumsum(take, 0) - take
            tl.store(order_ptr + at, n.to(tl.int64), mask=take != 0)


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
    part = _leaf_partials(node, grad, hess, factor, n_leaves, block_n, workspace_or_fresh(None))
    return part.sum(0).double() / factor[:, None]


def _leaf_partials(node, grad, hess, factor, n_leaves: int, block_n: int, ws) -> torch.Tensor:
    """[programs, 2, n_leaves] int64: each program's fixed-point (Σg, Σh) per leaf over its run of
    documents (:func:`_exact_leaf_sums_kernel`, ``factor`` [≥ 2] the 2^S), at most
    :data:`LEAF_SUM_PROGRAMS` programs; at least one document."""
    n = node.shape[0]
    programs = min(LEAF_SUM_PROGRAMS, triton.cdiv(n, block_n))
    per_program = triton.cdiv(triton.cdiv(n, programs), block_n) * block_n
    programs = triton.cdiv(n, per_program)
    part = ws.empty("part", (programs, 2, n_leaves), torch.int64, grad.device)
    _exact_leaf_sums_kernel[(programs,)](node.contiguous(), grad.contiguous(), hess.contiguous(), factor, part, n,
                                         per_program, N_LEAVES=n_leaves, BLOCK_N=block_n)
    return part


@triton.jit
def _leaf_values_kernel(part_ptr, factor_ptr, out_ptr, programs, neg_lr, l2, min_hess, N_LEAVES: tl.constexpr):
    """One program: the leaves' fixed-point sums (part [programs, 2, N_LEAVES] int64, summed over
    the programs: exact), their Newton steps (:func:`_newton_step`, the scales 2^−S from factor
    [4]) into out [0], and the round's update into out [1]: the steps, or zeros if one is not
    finite."""
    leaves = tl.arange(0, N_LEAVES)
    g = tl.zeros([N_LEAVES], dtype=tl.int64)
    h = tl.zeros([N_LEAVES], dtype=tl.int64)
    for p in range(programs):
        g += tl.load(part_ptr + p * 2 * N_LEAVES + leaves)
        h += tl.load(part_ptr + p * 2 * N_LEAVES + N_LEAVES + leaves)
    step = _newton_step(g, h, tl.load(factor_ptr + 2), tl.load(factor_ptr + 3), neg_lr, l2, min_hess)
    tl.store(out_ptr + leaves, step)
    bad = tl.sum((~(tl.abs(step) < float("inf"))).to(tl.int32), 0)
    tl.store(out_ptr + N_LEAVES + leaves, tl.where(bad > 0, 0.0, step))


def exact_leaf_values_triton(node: torch.Tensor, grad: torch.Tensor, hess: torch.Tensor, n_leaves: int, *,
                             factors: torch.Tensor, learning_rate: float, l2: float,
                             min_sum_hessian: float, workspace=None) -> torch.Tensor:
    """[2, n_leaves] float64: the leaves' Newton steps from their fixed-point sums, bit for bit
    ``newton_leaf_values(exact_leaf_sums(node, grad, hess))`` of the torch reference (one
    process), and the round's update (the steps, or zeros if one is not finite), in two launches
    after ``factors`` ([4], :meth:`~rankkit.kernels.triton.fixed.FixedPoint.factors` of grad and
    hess): the programs' partial sums, then one program for the rest. ``n_leaves`` a power of two
    at most :data:`MAX_FUSED_LEAVES`, at least one document. ``workspace``: the
    :class:`~rankkit.kernels.workspace.Workspace` (or scope) that keeps the buffers, the
    result included (valid until the next call); None: new tensors."""
    if n_leaves > MAX_FUSED_LEAVES or n_leaves & (n_leaves - 1) or node.shape[0] == 0:
        raise ValueError(f"`n_leaves` must be a power of two <= {MAX_FUSED_LEAVES} (got {n_leaves}), over documents")
    ws = workspace_or_fresh(workspace)
    part = _leaf_partials(node, grad, hess, factors, n_leaves, max(16, 4096 // n_leaves), ws)
    out = ws.empty("leaves", (2, n_leaves), torch.float64, grad.device)
    _leaf_values_kernel[(1,)](part, factors, out, part.shape[0], -float(learning_rate), float(l2),
                              float(min_sum_hessian), N_LEAVES=n_leaves)
    return out


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


def _scratch(ws, n: int, n_feat: int, depth: int, device: torch.device, *, elide: bool,
             counters: torch.Tensor, compact: bool) -> tuple:
    """The levels' scratch, none of it zeroed (each entry written before it is
    read): each document's slot in the smaller-children histogram (its parent, or K: left out;
    int16 keys for the partition, depth <= 12: K <= 2,048), the stopped flag, the count of
    finished programs and each level's count of compacted documents, which child of each node
    is the smaller and its (ΣG, ΣH, count) (two of each, a level's kernel reading the previous
    level's while its pick writes its own; a level of K nodes reads its first 3K totals as
    [3, K]; None without ``elide``), each feature's best scores and codes, and the compacted
    documents of the next level's smaller children (empty without ``compact``)."""
    widest = max(1, 1 << (depth - 1))
    return (ws.empty("slot", n, torch.int16, device), ws.empty("stopped", 1, torch.int8, device), counters,
            ws.empty("small", (2, widest), torch.int8, device),
            ws.empty("totals", (2, 3 * widest), torch.int64, device) if elide else None,
            ws.empty("best", (3, n_feat), torch.float64, device),
            ws.empty("code", (2, n_feat), torch.int32, device),
            ws.empty("order", n if compact else 0, torch.int64, device))


def _root_totals(g: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """[3] int64 (Σg, Σh, n) of integer gradients: the root's totals, which level 0 reads as the
    previous level's smaller children's."""
    return torch.stack([g.sum(dtype=torch.int64), h.sum(dtype=torch.int64),
                        torch.full((), g.shape[0], dtype=torch.int64, device=g.device)])


def grow_levels_triton(codes_t: torch.Tensor, g: torch.Tensor, h: torch.Tensor,
                       scale: torch.Tensor | None, valid: torch.Tensor, *, depth: int, l2: float,
                       min_data_in_leaf: int, min_sum_hessian: float,
                       noise: torch.Tensor | None = None, hist_dtype: torch.dtype | None = None,
                       block_n: int = 256, hot: torch.Tensor | None = None, leaves: float | None = None,
                       root: torch.Tensor | None = None, cleared: dict | None = None, workspace=None):
    """The levels of one oblivious tree, as the reference's ``_levels_torch``, in 3 launches
    per level (the smaller children's histogram, :func:`_level_kernel`, the routing, which
    compacts the next level's smaller children; with float cells or the shared-memory histogram
    a stable sort partitions them instead) and no host sync.

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
        leaves: a learning rate: also each leaf's Newton step from its (ΣG, ΣH) of the
            fixed-point g and h (``scale`` their 2^−S), cut from the last level's histogram rows
            by its pick (integer cells: exact, with no pass over the documents); None: not.
        root: [3] int64 (Σg, Σh, n) of the integer g and h, where the caller has them
            (:class:`~rankkit.kernels.triton.fixed.FixedPoint`), or None: summed here when
            ``hot`` needs them.
        cleared: buffers a kernel before the levels zeroed (FixedPoint's), so that no launch
            clears them here: "node" [n] int64, "counters" [1 + D] int32, "cells" [3, F, 1, 256]
            (the root histogram, ``hist_dtype``) and, for int32 cells of integer gradients,
            "pack" [F · 256] int64 (the root's packed sums); None: zeroed here.
        workspace: a :class:`~rankkit.kernels.workspace.Workspace` (or scope) whose
            buffers the levels use and return (valid until the next call: a fit's rounds then
            allocate nothing after the first); None: new tensors.
    Returns:
        (node [n] int64, feats [D] int64, cuts [D] int64, gains [D] float64): each document's
        leaf, and each level's feature (an index into ``codes_t``), code and gain; with
        ``leaves`` also the leaves' values and the round's update [2, 2^D] float64 (the values,
        or zeros if any is not finite).
    """
    device = g.device
    n_feat, n = codes_t.shape
    if hist_dtype is None:
        hist_dtype = torch.int64 if scale is not None else torch.float64
    if leaves is not None and (hist_dtype.is_floating_point or scale is None):
        raise ValueError("`leaves`: the leaves' sums are cut from integer cells of fixed-point gradients")
    if n_feat == 0:  # nothing to split on: every level stops (code 255), as the reference's
        if leaves is not None:
            raise ValueError("`leaves`: a tree with no feature has no level to cut its leaves from")
        return _unsplit(g, h, depth)
    codes_t = codes_t.contiguous()
    ws = workspace_or_fresh(workspace)
    cleared = _first_buffers(ws, n, n_feat, depth, hist_dtype, device) if cleared is None else cleared
    node = cleared["node"]
    feats, cuts, gains, leaf_values = _outputs(ws, depth, leaves is not None, device)
    valid = valid.to(torch.uint8).contiguous()
    noise = None if noise is None else noise.to(torch.float64).contiguous()
    hot = None if hist_dtype.is_floating_point else hot  # float cells: a filled-in cell would round otherwise
    # Integer sums do not depend on the order; the shared-memory histogram's tiles want slots grouped.
    compact = not hist_dtype.is_floating_point and not cuda_histogram_takes(device)
    slot, stopped, counter, small, totals, best, code, order = _scratch(
        ws, n, n_feat, depth, device, elide=hot is not None, counters=cleared["counters"], compact=compact)
    root = _root_totals(g, h) if hot is not None and root is None else root
    pack = hist_dtype == torch.int32 and not g.dtype.is_floating_point
    raw, packed = level_histogram_raw(codes_t, node, g, h, 1, dtype=hist_dtype, block_n=block_n, hot=hot,
                                      out=cleared["cells"], packed=cleared.get("pack"),
                                      zeroed=cleared.get("zeroed", True))
    hist = raw
    scale_arg = best if scale is None else scale.to(torch.float64).contiguous()
    for level in range(depth):
        n_nodes = 1 << level
        last = level + 1 == depth
        mine, before = level % 2, (level + 1) % 2
        out, next_raw, next_pack = _level_buffers(ws.scope(level), raw, n_nodes, last=last, leaves=leaves is not None,
                                                  pack=pack)
        _level_kernel[(n_feat,)](
            out, raw, raw if packed is None else packed, hist, small[before],
            counter if totals is None else root if level == 0 else totals[before], counter if hot is None else hot,
            valid, next_raw, next_pack, scale_arg, best if noise is None else noise[level], best, code, counter, feats,
            cuts, gains, stopped, small[mine], counter if totals is None else totals[mine], leaf_values, level,
            n_feat, n_nodes, float(l2),
            float(min_data_in_leaf), float(min_sum_hessian), TINY, -float(leaves or 0.0), CHILDREN=level > 0,
            PACK=packed is not None, ELIDE=hot is not None, QUANT=not hist_dtype.is_floating_point,
            HAS_NOISE=noise is not None, LAST=last, TOTALS=totals is not None, LEAVES=leaves is not None,
            ZERO_PACK=pack,
            BLOCK_F=max(16, triton.next_power_of_2(n_feat)), num_warps=4)
        count = counter[1 + level:2 + level]  # the level's compaction (zeroed with the counter)
        _route_kernel[(triton.cdiv(max(n, 1), block_n),)](
            codes_t, node, slot, small[mine], feats, cuts, order if compact else slot, count, level, n, n_nodes,
            WITH_SLOT=not last, COMPACT=compact and not last, BLOCK_N=block_n)
        if last:
            break
        hist = out
        # The smaller children's documents (at most n // 2) only; the next level's kernel finishes it.
        raw, packed = level_histogram_raw(codes_t, slot, g, h, n_nodes, dtype=hist_dtype, out=next_raw,
                                          block_n=block_n, order=order if compact else smaller_first(slot),
                                          n_rows=n // 2, hot=hot, packed=next_pack if pack else None, zeroed=True,
                                          count=count if compact else None)
    return (node, feats, cuts, gains, leaf_values) if leaves is not None else (node, feats, cuts, gains)


def _outputs(ws, depth: int, leaves: bool, device: torch.device) -> tuple:
    """(feats, cuts [D] int64, gains [D] float64, the leaves and the update [2, 2^D] float64, or
    gains without ``leaves``), written by each level's pick (its last program) before they are
    read: not zeroed."""
    feats, cuts = ws.empty("feats_cuts", (2, depth), torch.int64, device)
    gains = ws.empty("gains", depth, torch.float64, device)
    return feats, cuts, gains, ws.empty("leaves", (2, 1 << depth), torch.float64, device) if leaves else gains


def _first_buffers(ws, n: int, n_feat: int, depth: int, hist_dtype: torch.dtype, device: torch.device) -> dict:
    """What the levels accumulate into from their first launch, where no kernel before them
    cleared it: the documents' nodes and the levels' counters zeroed here, the root's cells and
    packed sums by its histogram (``zeroed`` False)."""
    return {"node": ws.empty("node", n, torch.int64, device).zero_(),
            "counters": ws.empty("counters", 1 + depth, torch.int32, device).zero_(),
            "cells": ws.empty("cells", (3, n_feat, 1, N_CODES), hist_dtype, device),
            "pack": ws.empty("root_pack", n_feat * N_CODES, torch.int64, device), "zeroed": False}


def _level_buffers(ws, raw: torch.Tensor, n_nodes: int, *, last: bool, leaves: bool, pack: bool) -> tuple:
    """(out, next_raw, next_pack) of a level of ``n_nodes`` nodes, none zeroed: its histogram
    [3, F, K, 256] as its kernel writes it (``raw`` where none is written: the last level,
    unless its leaves are cut from it), and the next level's histogram (the smaller children
    of this level's nodes) and packed sums, which this level's kernel zeroes (``raw`` at the
    last level, unused)."""
    shape = (3, raw.shape[1], n_nodes, N_CODES)
    out = raw if last and not leaves else ws.empty("hist", shape, raw.dtype, raw.device)
    next_raw = raw if last else ws.empty("next", shape, raw.dtype, raw.device)
    next_pack = ws.empty("next_pack", raw.shape[1] * n_nodes * N_CODES, torch.int64, raw.device) \
        if pack and not last else next_raw
    return out, next_raw, next_pack


def _unsplit(g: torch.Tensor, h: torch.Tensor, depth: int) -> tuple:
    """:func:`grow_levels_triton`'s levels for a tree with no feature: every level stopped (code
    255), every document in leaf 0."""
    device = g.device
    return (torch.zeros(g.shape[0], dtype=torch.int64, device=device),
            torch.zeros(depth, dtype=torch.int64, device=device),
            torch.full((depth,), N_CODES - 1, dtype=torch.int64, device=device),
            torch.zeros(depth, dtype=torch.float64, device=device))
