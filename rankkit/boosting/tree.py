"""Growing one oblivious regression tree from per-document gradients and hessians.

Notation: N documents, F features (the binned ones), B = 256 codes per feature, D depth,
K = 2^level nodes at a level.

An oblivious (symmetric) tree tests one (feature, threshold) pair per level for every node of
that level, so a document's leaf is ``Σ_k [code_{f_k} > c_k] · 2^k`` (CatBoost's trees). The
split at each level maximises the summed Newton score over the children of all K nodes::

    score(f, c) = Σ_nodes [ G_L² / (H_L + λ) + G_R² / (H_R + λ) ]

with G, H the sums of grad and hess of the documents in each child, and every leaf gets one
Newton step ``γ = −η ΣG / (ΣH + λ)`` (Tunys, "LambdaMART Demystified", 2015: the
gradient-boosting algorithm with the Newton leaf step; for the squared error this is the
mean residual of the leaf, as in Friedman's MART, 2001).

Split candidates come from histograms of (G, H, count) over (feature, node, code), built by
one scatter-add pass per level over the documents (no Python loop over documents, nodes or
features; documents are only cut into row chunks to bound memory). From the second level on
only the smaller child of each pair is scattered and its sibling is the parent minus it
(the subtraction trick). On the CPU the histograms come from a small compiled kernel when a C
compiler is available (:mod:`rankkit.boosting._cpu_kernel`; the same sums in the same order),
else from torch scatter-adds. Every sum that crosses documents -- the histograms and the leaf
sums -- goes through one ``reduce`` function, the identity by default, so a data-parallel
version can all-reduce there.
"""
from __future__ import annotations

import math

from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch

from rankkit.boosting import _cpu_kernel

N_CODES = 256
# Rows added per chunk: bounds the int64 index and value buffers to F * _CHUNK_ROWS * 8 bytes each.
_CHUNK_ROWS = 1 << 16

Reduce = Callable[[torch.Tensor], torch.Tensor]
_TINY = 1e-12  # floor of a hessian sum in a denominator


def identity_reduce(t: torch.Tensor) -> torch.Tensor:
    """The default reduction point: a single process already holds every sum."""
    return t


@dataclass(frozen=True)
class TreeParams:
    """The hyperparameters of one tree (validated by the estimator).

    Attributes:
        depth: D, levels of the oblivious tree (2^D leaves).
        learning_rate: η, the shrinkage of every leaf value.
        l2: λ, added to every hessian sum.
        min_data_in_leaf: a split is allowed only if every non-empty child of every node
            keeps at least this many documents.
        min_sum_hessian: likewise for the hessian sum of every non-empty child; a leaf whose
            ΣH + λ is below it gets the value 0 (the min-hessian guard).
        quantized_grad: search the splits on histograms of quantized gradients (see
            :func:`quantize_gradients`); the leaf values still use the full-precision sums.
        num_grad_quant_bins: B, the quantization levels of the gradients (and hessians).
    """

    depth: int = 6
    learning_rate: float = 0.1
    l2: float = 1.0
    min_data_in_leaf: int = 20
    min_sum_hessian: float = 1e-3
    quantized_grad: bool = False
    num_grad_quant_bins: int = 4


class Tree(NamedTuple):
    """One grown tree.

    Attributes:
        features: [D] long, the (binned-matrix) feature tested at each level.
        codes: [D] long, the code threshold c of each level (a document goes right when
            its code is > c); a level that found no valid split has c = 255 (never right).
        leaf_values: [2^D] float64, shrunk Newton steps (0 on empty leaves).
        gains: [D] float64, the score gain of each level's split (0 for an unsplit level).
        leaf_index: [N] long, the leaf of every document of the training set.
    """

    features: torch.Tensor
    codes: torch.Tensor
    leaf_values: torch.Tensor
    gains: torch.Tensor
    leaf_index: torch.Tensor


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


def split_scores(hist: torch.Tensor, valid_codes: torch.Tensor, params: TreeParams) -> torch.Tensor:
    """The gain of every (feature, threshold) candidate at one level.

    Args:
        hist: [3, F, K, 256] (G, H, count) histograms of the level's nodes.
        valid_codes: [F, 256] bool, thresholds c that can separate values of the feature.
        params: λ, min_data_in_leaf, min_sum_hessian.
    Returns:
        [F, 256] float64, Σ_nodes children score − Σ_nodes node score; −inf where the split
        is not allowed (a non-empty child too small, or an invalid threshold).
    """
    lam = params.l2
    left = hist.cumsum(-1)                    # codes <= c go left
    right = left[..., -1:] - left
    gl, hl, nl = left.unbind(0)
    gr, hr, nr = right.unbind(0)
    # G² / (H + λ); an empty child has G = H = 0 and scores 0 even when λ = 0.
    children = (gl.square() / (hl + lam).clamp_(min=_TINY)).add_(
        gr.square() / (hr + lam).clamp_(min=_TINY)).sum(1)
    g, h = left[0, 0, :, -1], left[1, 0, :, -1]  # every feature sees the same node totals
    gain = children - (g.square() / (h + lam).clamp(min=_TINY)).sum()
    bad = ((nl > 0) & (nl < params.min_data_in_leaf)) | ((nr > 0) & (nr < params.min_data_in_leaf))
    if params.min_sum_hessian > 0:
        bad |= ((nl > 0) & (hl < params.min_sum_hessian)) | ((nr > 0) & (hr < params.min_sum_hessian))
    allowed = valid_codes & ~bad.any(1)
    return torch.where(allowed, gain, -torch.inf)


def _kernel_split_scores(hist: torch.Tensor, valid_codes: torch.Tensor, params: TreeParams) -> torch.Tensor:
    """:func:`split_scores` by the compiled kernel: one pass over the histograms, no temporaries."""
    g, h = hist[0, 0].sum(-1), hist[1, 0].sum(-1)
    parent = float((g.square() / (h + params.l2).clamp(min=_TINY)).sum())
    return _cpu_kernel.cpu_split_scores(hist, valid_codes, params.l2, params.min_data_in_leaf,
                                        params.min_sum_hessian, parent, _TINY)


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
    shift = torch.floor(62.0 - math.log2(max(total, 1)) - torch.log2(top.clamp_min(1e-280))).clamp(max=900.0)
    factor = torch.exp2(shift)
    fixed = torch.round(values * factor[:, None]).to(torch.int64)
    out = torch.zeros(2, n_leaves, dtype=torch.int64, device=grad.device).index_add_(1, node, fixed)
    return reduce(out).double() / factor[:, None]


def leaf_sums(node: torch.Tensor, grad: torch.Tensor, hess: torch.Tensor, n_leaves: int, *,
              reduce: Reduce = identity_reduce) -> torch.Tensor:
    """[2, n_leaves] float64: ΣG and ΣH of each leaf (through the reduction point)."""
    out = torch.zeros(2, n_leaves, dtype=torch.float64, device=grad.device)
    out[0].index_add_(0, node, grad)
    out[1].index_add_(0, node, hess)
    return reduce(out)


def newton_leaf_values(sums: torch.Tensor, params: TreeParams) -> torch.Tensor:
    """γ = −η ΣG / (ΣH + λ) per leaf, 0 where ΣH + λ < min_sum_hessian (Tunys, "LambdaMART Demystified", 2015)."""
    d = sums[1] + params.l2
    keep = d >= max(params.min_sum_hessian, 1e-300)
    return torch.where(keep, -params.learning_rate * sums[0] / d.clamp_min(1e-300), 0.0)


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


def dequantize(hist: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """[3, F, K, 256] float64 (ΣG, ΣH, count) of integer histograms, ΣG and ΣH times their scale [2]."""
    factor = torch.cat([scale, torch.ones(1, dtype=scale.dtype, device=scale.device)])
    return hist.double() * factor[:, None, None, None]


class ObliviousTreeGrower:
    """Grows oblivious trees on a fixed binned training set.

    Args:
        codes: [N, F] uint8 codes of the training documents (CPU or CUDA).
        valid_codes: [F, 256] bool, the thresholds each feature allows (see the binner).
        params: the tree hyperparameters.
        reduce: the reduction point of every document sum.
        use_kernel: grow with the compiled CPU kernel (None: when the codes are on the CPU and
            the kernel is available); False runs the torch-ops path, as on a GPU.
    """

    def __init__(self, codes: torch.Tensor, valid_codes: torch.Tensor, params: TreeParams, *,
                 reduce: Reduce = identity_reduce, use_kernel: bool | None = None, shard=None):
        # The compiled CPU kernel reads the row-major codes [N, F] (a document's codes are one
        # row); the torch ops (and CUDA) a feature-major copy [F, N]. Only one of them is kept.
        on_cpu = codes.device.type == "cpu"
        self.kernel = on_cpu and _cpu_kernel.available() if use_kernel is None else bool(use_kernel)
        if self.kernel:
            assert on_cpu, "the compiled kernel reads CPU codes"
            self.codes = codes.contiguous()
        else:
            self.codes_t = codes.t().contiguous()
        self.valid_codes = valid_codes.to(codes.device)
        self._root_counts: torch.Tensor | None = None  # [F, 1, 256], the kernel path's cache
        self.params = params
        self.reduce = reduce
        self.shard = shard  # data-parallel: the AllReduce that knows this rank's documents

    def grow(self, grad: torch.Tensor, hess: torch.Tensor, *, rows: torch.Tensor | None = None,
             features: torch.Tensor | None = None, noise_sd: float | torch.Tensor = 0.0,
             generator: torch.Generator | None = None) -> Tree:
        """One tree fitted to grad/hess [N] (float64) on ``rows`` and ``features``.

        Args:
            grad, hess: [N] per-document first and second derivatives (zero weight = 0).
            rows: [n] long, the sampled documents (all when None).
            features: [F'] long, the sampled features (all when None).
            noise_sd: with ``generator``, the split of each level maximises the score plus
                independent N(0, noise_sd²) noise per allowed candidate (CatBoost's
                ``random_strength``); a level still splits only if its best noise-free score
                is positive. The recorded gain is the noise-free one. A float or a 0-dim
                tensor on grad's device.
            generator: on grad's device; draws the split noise and the quantization's
                stochastic rounding.

        On a GPU the whole tree stays on the device: the chosen (feature, code) of each level
        is a tensor (argmax), routing and the children's histograms read it there, and nothing
        is copied to the host (no sync).
        """
        p = self.params
        valid = self.valid_codes if features is None else self.valid_codes.index_select(0, features)
        g = grad if rows is None else grad.index_select(0, rows)
        h = hess if rows is None else hess.index_select(0, rows)
        noisy = generator is not None and (torch.is_tensor(noise_sd) or noise_sd > 0.0)
        # Quantized gradients: the histograms sum the integers (exact), the split search reads
        # them times the scales; the leaves below still take the full-precision g and h.
        hg, hh, scale = g, h, None
        if p.quantized_grad:
            if g.shape[0] * p.num_grad_quant_bins >= 2 ** 31:
                raise ValueError("quantized_grad: rows x num_grad_quant_bins has to stay below 2^31")
            hg, hh, scale = quantize_gradients(g, h, p.num_grad_quant_bins, generator, shard=self.shard)
        # The noise of every level is drawn at once, before the levels (so a tree that stops
        # early draws as much as one that does not, on every path).
        noise = None
        if noisy:
            noise = torch.randn((p.depth, *valid.shape), generator=generator, dtype=torch.float64,
                                device=grad.device).mul_(noise_sd)
        grow_levels = self._levels_kernel if self.kernel else self._levels_torch
        node, feats, cuts, gains = grow_levels(hg, hh, scale, valid, rows, features, noise)
        n_leaves = 1 << p.depth
        if p.quantized_grad:  # integer sums throughout: exact, the same in any order or process
            sums = exact_leaf_sums(node, g, h, n_leaves, reduce=self.reduce, shard=self.shard)
        else:
            sums = leaf_sums(node, g, h, n_leaves, reduce=self.reduce)
        values = newton_leaf_values(sums, p)
        feats_raw = feats if features is None else features[feats]
        if rows is None:
            leaf_index = node  # the training documents' leaves: Σ_k bit_k · 2^k, built level by level
        elif self.kernel:
            leaf_index = _cpu_kernel.cpu_route(self.codes, None, feats_raw, cuts, 1 << torch.arange(p.depth),
                                               torch.zeros(self.codes.shape[0], dtype=torch.long))
        else:
            leaf_index = leaf_of(self.codes_t, feats_raw, cuts)
        return Tree(feats_raw, cuts, values, gains, leaf_index)

    def _levels_kernel(self, g, h, scale, valid, rows, features, noise):
        """The levels on the compiled CPU kernel (host tensors: reading a split costs nothing)."""
        p, codes = self.params, self.codes
        n, depth = g.shape[0], p.depth
        raw = torch.arange(codes.shape[1]) if features is None else features
        node = torch.zeros(n, dtype=torch.long)
        feats = torch.zeros(depth, dtype=torch.long)
        cuts = torch.full((depth,), N_CODES - 1, dtype=torch.long)
        gains = torch.zeros(depth, dtype=torch.float64)
        # Without row sampling the root's counts are the same for every tree: count once.
        known = None
        if rows is None and self._root_counts is not None:
            known = self._root_counts if features is None else self._root_counts.index_select(0, features)
            known = known.to(torch.int64 if scale is not None else torch.float64)
        hist = _cpu_kernel.cpu_histograms(codes, rows, features, node, g, h, 1, counts=known)
        if rows is None and features is None and self._root_counts is None:
            self._root_counts = hist[2].clone()
        hist = self.reduce(hist)
        for level in range(depth):
            n_nodes = 1 << level
            scores = _kernel_split_scores(hist if scale is None else dequantize(hist, scale), valid, p)
            best = int(torch.argmax(scores))  # first maximum: lowest (feature, code)
            if not float(scores.view(-1)[best]) > 0.0:
                break  # no allowed split: the remaining levels send everything left
            if noise is not None:  # −inf (not allowed) stays −inf
                best = int(torch.argmax(scores + noise[level]))
            f, c = divmod(best, N_CODES)
            feats[level], cuts[level], gains[level] = f, c, scores[f, c]
            _cpu_kernel.cpu_route(codes, rows, raw[f: f + 1], torch.tensor([c]), torch.tensor([n_nodes]), node)
            if level + 1 == depth:
                break
            # Children of the next level: sum only the smaller child of each pair (the
            # subtraction trick).
            left_count = hist[2, f, :, : c + 1].sum(-1)
            right_count = hist[2, f, :, c + 1:].sum(-1)
            small_is_right = right_count <= left_count  # [K]
            if self.reduce is identity_reduce:  # the kernel subtracts in place
                hist = _cpu_kernel.cpu_children(codes, rows, features, node, g, h, hist, small_is_right)
            else:  # the smaller child of each parent p goes to slot p; the others are skipped
                slot = _cpu_kernel.small_child_slots(small_is_right)[0]
                small = self.reduce(_cpu_kernel.cpu_histograms(codes, rows, features, node, g, h,
                                                               2 * n_nodes, slot, n_nodes))
                hist = _siblings(hist, small, small_is_right)
        return node, feats, cuts, gains

    def _levels_torch(self, g, h, scale, valid, rows, features, noise):
        """The levels in torch ops, every decision a device tensor: no host sync."""
        p = self.params
        device, n, depth = g.device, g.shape[0], self.params.depth
        codes_all = self.codes_t if features is None else self.codes_t.index_select(0, features)
        codes_t = codes_all if rows is None else codes_all.index_select(1, rows)
        if scale is not None:
            g, h = g.long(), h.long()  # int64 sums (index_add_ on int32 would overflow sooner)
        code_range = torch.arange(N_CODES, device=device)
        node = torch.zeros(n, dtype=torch.long, device=device)
        feats = torch.zeros(depth, dtype=torch.long, device=device)
        cuts = torch.full((depth,), N_CODES - 1, dtype=torch.long, device=device)
        gains = torch.zeros(depth, dtype=torch.float64, device=device)
        stopped = torch.zeros((), dtype=torch.bool, device=device)
        hist = build_histograms(codes_t, node, g, h, 1, reduce=self.reduce)
        for level in range(depth):
            n_nodes = 1 << level
            scores = split_scores(hist if scale is None else dequantize(hist, scale), valid, p).view(-1)
            best = torch.argmax(scores)  # first maximum: lowest (feature, code)
            # A level without an allowed split, and every level after it, sends everything
            # left (code 255); its children's histograms are then its own (an empty right).
            stopped = stopped | ~(scores.index_select(0, best.view(1))[0] > 0.0)  # a tensor index: no sync
            if noise is not None:  # −inf (not allowed) stays −inf
                best = torch.argmax(scores + noise[level].view(-1))
            f = best // N_CODES
            c = torch.where(stopped, N_CODES - 1, best % N_CODES)
            feats[level], cuts[level] = f, c
            gains[level] = torch.where(stopped, 0.0, scores.index_select(0, best.view(1))[0])
            right = codes_t.index_select(0, f.view(1))[0] > c
            node.add_(right.long() * n_nodes)
            if level + 1 == depth:
                break
            # Children: sum only the smaller child of each pair (the subtraction trick); the
            # other documents go to a node that is left out, so no row selection (no sync).
            counts = hist[2].index_select(0, f.view(1))[0]  # [K, 256]
            left_count = (counts * (code_range <= c)).sum(-1)
            small_is_right = counts.sum(-1) - left_count <= left_count  # [K]
            bit = node >= n_nodes
            parent = node - bit.long() * n_nodes
            slot = torch.where(bit == small_is_right[parent], parent, n_nodes)
            small = build_histograms(codes_t, slot, g, h, n_nodes, reduce=self.reduce)
            hist = _siblings(hist, small, small_is_right)
        return node, feats, cuts, gains


def _siblings(hist: torch.Tensor, small: torch.Tensor, small_is_right: torch.Tensor) -> torch.Tensor:
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
