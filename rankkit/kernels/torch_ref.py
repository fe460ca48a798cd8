"""The torch reference backend: every tree kernel in plain torch ops, on any device.

It is the oracle the other backends are tested against (the compiled CPU backend,
:mod:`rankkit.kernels.cpu`, and the Triton kernels of :mod:`rankkit.kernels.triton`), and the path of
a GPU without Triton and of a CPU without the compiled kernels. Every decision stays a device
tensor (argmax, ``torch.where``), so a tree costs no host sync.

Notation: N documents, F features, K = 2^level nodes of a level, 256 codes per feature.
The kernels of one tree level:

* :func:`build_histograms` -- (ΣG, ΣH, count) per (feature, node, code);
* :func:`split_scan` -- every candidate's gain (:func:`split_scores`) and its argmax, with the
  split noise and the min-data / min-hessian masks;
* :func:`route` -- send the documents down the chosen split;
* :func:`leaf_sums` / :func:`exact_leaf_sums` and :func:`newton_leaf_values` -- the leaves.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

N_CODES = 256
# Rows added per chunk: bounds the int64 index and value buffers to F * _CHUNK_ROWS * 8 bytes each.
_CHUNK_ROWS = 1 << 16
TINY = 1e-12  # floor of a hessian sum in a split gain's denominator (every backend's)

Reduce = Callable[[torch.Tensor], torch.Tensor]


def identity_reduce(t: torch.Tensor) -> torch.Tensor:
    """The default reduction point: a single process already holds every sum."""
    return t


def build_histograms(codes_t: torch.Tensor, node: torch.Tensor, grad: torch.Tensor,
                     hess: torch.Tensor, n_nodes: int, *, reduce: Reduce = identity_reduce,
                     chunk_rows: int = _CHUNK_ROWS) -> torch.Tensor:
    """Histograms of (G, H, count) per (feature, node, code).

    One 1-D ``index_add_`` per channel over the flattened (feature, node, code) cells: on CUDA
    it is deterministic under ``torch.use_deterministic_algorithms(True)`` (a 2-D
    ``scatter_add_`` is not), and on integer (quantized) gradients it is exact.

    Args:
        codes_t: [F, n] uint8 codes, feature-major (one row per feature).
        node: [n] long, each document's node in 0..n_nodes-1, or n_nodes to leave it out.
        grad, hess: [n] float64, or int64 quantized gradients.
        n_nodes: K.
        reduce: the reduction point applied to the finished sums.
    Returns:
        [3, F, K, 256] of grad's dtype: channel 0 ΣG, 1 ΣH, 2 the document count.

    >>> codes_t = torch.tensor([[0, 1, 1]], dtype=torch.uint8)
    >>> h = build_histograms(codes_t, torch.tensor([0, 0, 1]), torch.tensor([1., 2., 4.]).double(),
    ...                      torch.ones(3, dtype=torch.float64), 2)
    >>> h[0, 0, :, :2]  # ΣG of node 0 (codes 0, 1) and node 1
    tensor([[1., 2.],
            [0., 4.]], dtype=torch.float64)
    """
    n_feat, n = codes_t.shape
    width = (n_nodes + 1) * N_CODES  # one more node: the documents left out
    out = torch.zeros(3, n_feat * width, dtype=grad.dtype, device=codes_t.device)
    step = max(1, min(chunk_rows, n))
    feature_base = torch.arange(n_feat, device=codes_t.device)[:, None] * width
    for start in range(0, n, step):  # row chunks bound memory; each chunk is one vectorised pass
        stop = min(n, start + step)
        idx = (codes_t[:, start:stop].long() + node[start:stop] * N_CODES + feature_base).view(-1)
        for channel, values in enumerate((grad[start:stop], hess[start:stop])):
            out[channel].index_add_(0, idx, values.repeat(n_feat))
        out[2].index_add_(0, idx, torch.ones(1, dtype=grad.dtype, device=grad.device).expand(idx.shape[0]))
    hist = out.view(3, n_feat, n_nodes + 1, N_CODES)[:, :, :n_nodes]
    return reduce(hist.contiguous())


def split_scores(hist: torch.Tensor, valid_codes: torch.Tensor, params) -> torch.Tensor:
    """The gain of every (feature, threshold) candidate at one level.

    Per node k the gain of the cut is G_L² / (H_L + λ) + G_R² / (H_R + λ) − G² / (H + λ), with
    the node's totals G, H taken from the same prefix sums as G_L, H_L (so a cut that moves no
    document gains exactly 0 and is never taken, instead of a rounding residue); the gains are
    summed over the K nodes in node order (a cumulative sum: one fixed order, which the
    compiled backend follows).

    Args:
        hist: [3, F, K, 256] (G, H, count) histograms of the level's nodes.
        valid_codes: [F, 256] bool, thresholds c that can separate values of the feature.
        params: λ, min_data_in_leaf, min_sum_hessian.
    Returns:
        [F, 256] float64; −inf where the split is not allowed (a non-empty child too small,
        or an invalid threshold).
    """
    lam = params.l2
    left = hist.cumsum(-1)                    # codes <= c go left
    right = left[..., -1:] - left
    gl, hl, nl = left.unbind(0)
    gr, hr, nr = right.unbind(0)
    # G² / (H + λ); an empty child has G = H = 0 and scores 0 even when λ = 0.
    node = (gl[..., -1:].square() / (hl[..., -1:] + lam).clamp_(min=TINY))
    gain = (gl.square() / (hl + lam).clamp_(min=TINY)).add_(gr.square() / (hr + lam).clamp_(min=TINY)).sub_(node)
    gain = gain.cumsum(1)[:, -1]
    bad = ((nl > 0) & (nl < params.min_data_in_leaf)) | ((nr > 0) & (nr < params.min_data_in_leaf))
    if params.min_sum_hessian > 0:
        bad |= ((nl > 0) & (hl < params.min_sum_hessian)) | ((nr > 0) & (hr < params.min_sum_hessian))
    allowed = valid_codes & ~bad.any(1)
    return torch.where(allowed, gain, -torch.inf)


def quantize_gradients(grad: torch.Tensor, hess: torch.Tensor, n_bins: int,
                       generator: torch.Generator | None = None, *, shard=None
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stochastic rounding of grad and hess to small integers (LightGBM 4's ``use_quantized_grad``;
    Shi et al., "Quantized Training of Gradient Boosting Decision Trees", NeurIPS 2022).

    With the scales s_g = max|g| / (B/2) and s_h = max|h| / B of this round::

        g_q = ⌊g / s_g + u⌋,  h_q = ⌊h / s_h + u'⌋,  u, u' ~ U[0, 1) independent

    so g_q ∈ [−B/2, B/2], h_q ∈ [0, B] (h ≥ 0) and E[g_q · s_g] = g: the rounding is unbiased,
    and the sums of a histogram cell are unbiased too. The draws come from ``generator`` on
    grad's device; the scales stay on the device (no host sync).

    Args:
        grad, hess: [n] float64.
        n_bins: B.
        shard: data-parallel (a :class:`rankkit.boosting.distributed.AllReduce`): the scales are
            the maxima over every rank, and this rank's documents take the draws one process
            would give them (documents ``offset .. offset + n`` of ``total``).
    Returns:
        (g_q, h_q, scale): [n] int32 each and [2] float64 (s_g, s_h), grad ≈ g_q · s_g.

    >>> g_q, h_q, scale = quantize_gradients(torch.tensor([-1.0, 0.5, 1.0]).double(),
    ...                                      torch.ones(3, dtype=torch.float64), 4)
    >>> g_q[[0, 2]].tolist(), h_q.tolist(), scale.tolist()  # the extremes are exact
    ([-2, 2], [4, 4, 4], [0.5, 0.25])
    """
    n = grad.shape[0]
    if n == 0:
        empty = torch.zeros(0, dtype=torch.int32, device=grad.device)
        return empty, empty, torch.ones(2, dtype=torch.float64, device=grad.device)
    top = torch.stack([grad.abs().max() / (n_bins / 2), hess.abs().max() / n_bins]).double()
    if shard is not None:
        top = shard.max(top)
    scale = torch.where(top > 0, top, torch.ones_like(top))
    if shard is None:
        u = torch.rand(2, n, generator=generator, dtype=torch.float64, device=grad.device)
    else:
        u = torch.rand(2, shard.total, generator=generator, dtype=torch.float64, device=grad.device)
        u = u[:, shard.offset: shard.offset + n]
    g_q = torch.floor(grad / scale[0] + u[0]).to(torch.int32)
    h_q = torch.floor(hess / scale[1] + u[1]).to(torch.int32)
    return g_q, h_q, scale


def exact_leaf_sums(node: torch.Tensor, grad: torch.Tensor, hess: torch.Tensor, n_leaves: int, *,
                    reduce: Reduce = identity_reduce, shard=None) -> torch.Tensor:
    """[2, n_leaves] float64 ΣG and ΣH per leaf, summed as fixed-point integers, so the sums do
    not depend on the order of the documents, the threads or the ranks (bit-identical across
    them). Each value is rounded to a multiple of 2^−S, S the largest shift with
    N · max|x| · 2^S < 2^62 (N and max over every rank with ``shard``): about 1e−13 relative
    per document at N = 10^6, far below float32 leaves."""
    values = torch.stack([grad, hess]).double()
    top = values.abs().amax(dim=1) if values.shape[1] else values.new_zeros(2)
    total = node.shape[0]
    if shard is not None:
        top, total = shard.max(top), shard.total
    fixed, factor = to_fixed_point(values, top, total)
    out = torch.zeros(2, n_leaves, dtype=torch.int64, device=grad.device).index_add_(1, node, fixed)
    return reduce(out).double() / factor[:, None]


def to_fixed_point(values: torch.Tensor, top: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of ``values`` [C, n] float64 as int64 multiples of 2^−S, S per row the largest shift
    with ``total`` · ``top`` · 2^S < 2^62 (``top`` [C] the largest |value| of each row, ``total``
    the number of values any sum adds), so no such sum overflows and every sum is exact, in any
    order (no host sync). Returns (fixed [C, n] int64, factor [C] float64 = 2^S)."""
    factor = fixed_point_factor(top, total)
    return torch.round(values * factor[:, None]).to(torch.int64), factor


def fixed_point_factor(top: torch.Tensor, total: int) -> torch.Tensor:
    """[C] float64 2^S of :func:`to_fixed_point` (the compiled leaves take it from here, so that
    both paths round with the same factor)."""
    shift = torch.floor(62.0 - math.log2(max(total, 1)) - torch.log2(top.clamp_min(1e-280))).clamp(max=900.0)
    return torch.exp2(shift)


def leaf_sums(node: torch.Tensor, grad: torch.Tensor, hess: torch.Tensor, n_leaves: int, *,
              reduce: Reduce = identity_reduce) -> torch.Tensor:
    """[2, n_leaves] float64: ΣG and ΣH of each leaf (through the reduction point)."""
    out = torch.zeros(2, n_leaves, dtype=torch.float64, device=grad.device)
    out[0].index_add_(0, node, grad)
    out[1].index_add_(0, node, hess)
    return reduce(out)


def newton_leaf_values(sums: torch.Tensor, params) -> torch.Tensor:
    """γ = −η ΣG / (ΣH + λ) per leaf, 0 where ΣH + λ < min_sum_hessian (Tunys, "LambdaMART Demystified", 2015)."""
    d = sums[1] + params.l2
    guard = d < max(params.min_sum_hessian, 1e-300)  # NaN compares False: a NaN sum stays NaN, to be reported
    return torch.where(guard, 0.0, -params.learning_rate * sums[0] / d.clamp_min(1e-300))


def dequantize(hist: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """[3, F, K, 256] float64 (ΣG, ΣH, count) of integer histograms, ΣG and ΣH times their scale [2]."""
    factor = torch.cat([scale, torch.ones(1, dtype=scale.dtype, device=scale.device)])
    return hist.double() * factor[:, None, None, None]


def siblings(hist: torch.Tensor, small: torch.Tensor, small_is_right: torch.Tensor) -> torch.Tensor:
    """[3, F, 2K, 256]: the children (node p + K·bit) of the parents' histograms ``hist``
    [3, F, K, 256], given the smaller child of each pair, ``small`` [3, F, K, 256]."""
    large = hist - small
    sr = small_is_right[None, None, :, None]
    return torch.cat([torch.where(sr, large, small), torch.where(sr, small, large)], dim=2)


def leaf_of(codes_t: torch.Tensor, features: torch.Tensor, cuts: torch.Tensor) -> torch.Tensor:
    """[N] leaf index ``Σ_k [code_{f_k} > c_k] · 2^k`` of codes_t [F, N] under one tree."""
    bits = codes_t.index_select(0, features) > cuts[:, None]
    weights = (1 << torch.arange(len(features), device=codes_t.device))[:, None]
    return (bits.long() * weights).sum(0)


def split_scan(hist: torch.Tensor, valid_codes: torch.Tensor, params, noise: torch.Tensor | None,
               stopped: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One level's split: (feature, code, gain, stopped), 0-dim device tensors (no sync).

    The candidate of largest gain (:func:`split_scores`; the first maximum: lowest feature,
    then code), or with ``noise`` [F, 256] of largest gain + noise; the recorded gain is the
    noise-free one. ``stopped`` becomes True at the first level whose best gain is not
    positive, and from then on the code is 255 (everything goes left) and the gain 0.

    Args:
        hist: [3, F, K, 256] float64 histograms (dequantized).
        valid_codes: [F, 256] bool.
        stopped: 0-dim bool, whether an earlier level stopped.
    """
    scores = split_scores(hist, valid_codes, params).view(-1)
    best = torch.argmax(scores)
    stopped = stopped | ~(scores.index_select(0, best.view(1))[0] > 0.0)  # a tensor index: no sync
    if noise is not None:  # −inf (not allowed) stays −inf
        best = torch.argmax(scores + noise.reshape(-1))
    f = best // N_CODES
    c = torch.where(stopped, N_CODES - 1, best % N_CODES)
    gain = torch.where(stopped, 0.0, scores.index_select(0, best.view(1))[0])
    return f, c, gain, stopped


def route(codes_t: torch.Tensor, f: torch.Tensor, c: torch.Tensor, node: torch.Tensor, n_nodes: int) -> torch.Tensor:
    """``node += [codes_t[f] > c] · K`` in place (codes_t [F, n], f and c 0-dim tensors); returns node."""
    right = codes_t.index_select(0, f.view(1))[0] > c
    return node.add_(right.long() * n_nodes)


def grow_levels(codes_t: torch.Tensor, g: torch.Tensor, h: torch.Tensor, scale: torch.Tensor | None,
                valid: torch.Tensor, params, noise: torch.Tensor | None, *,
                reduce: Reduce = identity_reduce) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every level of one oblivious tree, each decision a device tensor (no host sync).

    Args:
        codes_t: [F, n] uint8, the round's features and documents, feature-major.
        g, h: [n] float64, or int64 quantized gradients read times ``scale`` [2].
        valid: [F, 256] bool; noise: [D, F, 256] float64 split noise or None.
        params: depth, l2, min_data_in_leaf, min_sum_hessian.
        reduce: the reduction point of every histogram.
    Returns:
        (node [n] long, each document's leaf; features [D]; codes [D], 255 for a level that
        did not split; gains [D] float64).
    """
    device, n, depth = g.device, g.shape[0], params.depth
    code_range = torch.arange(N_CODES, device=device)
    node = torch.zeros(n, dtype=torch.long, device=device)
    feats = torch.zeros(depth, dtype=torch.long, device=device)
    cuts = torch.full((depth,), N_CODES - 1, dtype=torch.long, device=device)
    gains = torch.zeros(depth, dtype=torch.float64, device=device)
    stopped = torch.zeros((), dtype=torch.bool, device=device)
    hist = build_histograms(codes_t, node, g, h, 1, reduce=reduce)
    for level in range(depth):
        n_nodes = 1 << level
        # A level without an allowed split, and every level after it, sends everything left
        # (code 255); its children's histograms are then its own (an empty right).
        f, c, gain, stopped = split_scan(hist if scale is None else dequantize(hist, scale), valid, params,
                                         None if noise is None else noise[level], stopped)
        feats[level], cuts[level], gains[level] = f, c, gain
        route(codes_t, f, c, node, n_nodes)
        if level + 1 == depth:
            break
        # Children: sum only the smaller child of each pair (the subtraction trick); the other
        # documents go to a node that is left out, so no row selection (no sync).
        counts = hist[2].index_select(0, f.view(1))[0]  # [K, 256]
        left_count = (counts * (code_range <= c)).sum(-1)
        small_is_right = counts.sum(-1) - left_count <= left_count  # [K]
        bit = node >= n_nodes
        parent = node - bit.long() * n_nodes
        slot = torch.where(bit == small_is_right[parent], parent, n_nodes)
        small = build_histograms(codes_t, slot, g, h, n_nodes, reduce=reduce)
        hist = siblings(hist, small, small_is_right)
    return node, feats, cuts, gains


# -- shared by the GPU histograms (Triton and shared-memory CUDA): pure torch, no sync ---------------------
def hot_codes(codes_t: torch.Tensor) -> torch.Tensor:
    """[F] int64: each feature's most frequent code in ``codes_t`` [F, N] (the first on ties),
    on its device, in three ops and no sync. Made once per fit: the codes do not change."""
    n_feat = codes_t.shape[0]
    if codes_t.shape[1] == 0:
        return torch.zeros(n_feat, dtype=torch.int64, device=codes_t.device)
    base = torch.arange(n_feat, device=codes_t.device)[:, None] * N_CODES
    counts = torch.zeros(n_feat * N_CODES, dtype=torch.int64, device=codes_t.device)
    counts.index_add_(0, (codes_t.long() + base).reshape(-1), torch.ones(codes_t.numel(), dtype=torch.int64,
                                                                          device=codes_t.device))
    return counts.view(n_feat, N_CODES).argmax(1)


def smaller_first(slot: torch.Tensor) -> torch.Tensor:
    """[N] long: the documents partitioned by their slot (stable), so that the documents of the
    level's smaller children (slots 0..K−1, each its parent) come first, grouped by parent in
    document order, and the left-out documents (slot K) last. One stable sort of narrow keys
    (a single radix pass on a GPU for ``int16`` slots); no host sync, no data-dependent shape.

    The smaller child of a parent holds at most half its documents, so the first ⌊N / 2⌋
    entries hold all of them: a level's histogram reads at most half the documents.

    >>> smaller_first(torch.tensor([2, 0, 2, 1, 0], dtype=torch.int16)).tolist()
    [1, 4, 3, 0, 2]
    """
    return torch.sort(slot, stable=True).indices
