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

from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch

from rankkit.boosting import _cpu_kernel

N_CODES = 256
# Rows scattered per chunk: bounds the int64 index buffer to F * _CHUNK_ROWS * 8 bytes.
_CHUNK_ROWS = 1 << 18

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
    """

    depth: int = 6
    learning_rate: float = 0.1
    l2: float = 1.0
    min_data_in_leaf: int = 20
    min_sum_hessian: float = 1e-3


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


def _scatter(idx: torch.Tensor, grad: torch.Tensor, hess: torch.Tensor, out: torch.Tensor) -> None:
    """Add (grad, hess, 1) of the documents of ``idx`` [F, n] into ``out`` [3, F, width]."""
    n_feat = idx.shape[0]
    if idx.device.type == "cpu":
        # One pass for both sums: G + iH in complex128 (measured 1.5x faster than two passes).
        gh = torch.complex(grad, hess).expand(n_feat, -1)
        acc = torch.zeros(out.shape[1:], dtype=torch.complex128)
        acc.scatter_add_(1, idx, gh)
        out[0] += acc.real
        out[1] += acc.imag
    else:
        out[0].scatter_add_(1, idx, grad.expand(n_feat, -1))
        out[1].scatter_add_(1, idx, hess.expand(n_feat, -1))
    out[2].scatter_add_(1, idx, torch.ones_like(grad).expand(n_feat, -1))


def build_histograms(codes_t: torch.Tensor, node: torch.Tensor, grad: torch.Tensor,
                     hess: torch.Tensor, n_nodes: int, *, reduce: Reduce = identity_reduce,
                     chunk_rows: int = _CHUNK_ROWS) -> torch.Tensor:
    """Histograms of (G, H, count) per (feature, node, code).

    Args:
        codes_t: [F, n] uint8 codes, feature-major (one row per feature).
        node: [n] long, each document's node in 0..n_nodes-1.
        grad, hess: [n] float64.
        n_nodes: K.
        reduce: the reduction point applied to the finished sums.
    Returns:
        [3, F, K, 256] float64: channel 0 ΣG, 1 ΣH, 2 the document count.

    >>> codes_t = torch.tensor([[0, 1, 1]], dtype=torch.uint8)
    >>> h = build_histograms(codes_t, torch.tensor([0, 0, 1]), torch.tensor([1., 2., 4.]).double(),
    ...                      torch.ones(3, dtype=torch.float64), 2)
    >>> h[0, 0, :, :2]  # ΣG of node 0 (codes 0, 1) and node 1
    tensor([[1., 2.],
            [0., 4.]], dtype=torch.float64)
    """
    n_feat, n = codes_t.shape
    out = torch.zeros(3, n_feat, n_nodes * N_CODES, dtype=torch.float64, device=codes_t.device)
    step = max(1, min(chunk_rows, n))
    buf = torch.empty(n_feat, step, dtype=torch.int64, device=codes_t.device)
    offset = node * N_CODES
    for start in range(0, n, step):  # row chunks bound memory; each chunk is one vectorised pass
        stop = min(n, start + step)
        idx = buf[:, : stop - start]
        idx.copy_(codes_t[:, start:stop]).add_(offset[start:stop])
        _scatter(idx, grad[start:stop], hess[start:stop], out)
    return reduce(out.view(3, n_feat, n_nodes, N_CODES))


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


class ObliviousTreeGrower:
    """Grows oblivious trees on a fixed binned training set.

    Args:
        codes: [N, F] uint8 codes of the training documents (CPU or CUDA).
        valid_codes: [F, 256] bool, the thresholds each feature allows (see the binner).
        params: the tree hyperparameters.
        reduce: the reduction point of every document sum.
    """

    def __init__(self, codes: torch.Tensor, valid_codes: torch.Tensor, params: TreeParams, *,
                 reduce: Reduce = identity_reduce):
        # The compiled CPU kernel reads the row-major codes [N, F] (a document's codes are one
        # row); the torch ops (and CUDA) a feature-major copy [F, N]. Only one of them is kept.
        self.kernel = codes.device.type == "cpu" and _cpu_kernel.available()
        if self.kernel:
            self.codes = codes.contiguous()
        else:
            self.codes_t = codes.t().contiguous()
        self.valid_codes = valid_codes.to(codes.device)
        self._root_counts: torch.Tensor | None = None  # [F, 1, 256], the kernel path's cache
        self.params = params
        self.reduce = reduce

    def grow(self, grad: torch.Tensor, hess: torch.Tensor, *, rows: torch.Tensor | None = None,
             features: torch.Tensor | None = None, noise_sd: float = 0.0,
             generator: torch.Generator | None = None) -> Tree:
        """One tree fitted to grad/hess [N] (float64) on ``rows`` and ``features``.

        Args:
            grad, hess: [N] per-document first and second derivatives (zero weight = 0).
            rows: [n] long, the sampled documents (all when None).
            features: [F'] long, the sampled features (all when None).
            noise_sd: with ``generator``, the split of each level maximises the score plus
                independent N(0, noise_sd²) noise per allowed candidate (CatBoost's
                ``random_strength``); a level still splits only if its best noise-free score
                is positive. The recorded gain is the noise-free one.
        """
        p = self.params
        device = grad.device
        valid = self.valid_codes if features is None else self.valid_codes.index_select(0, features)
        g = grad if rows is None else grad.index_select(0, rows)
        h = hess if rows is None else hess.index_select(0, rows)
        n = g.shape[0]
        # Three steps differ between the compiled kernel and torch ops: the histograms of all
        # documents (one node), routing the documents down a level's split (node += bit · K),
        # and the children's histograms after that: only the smaller child of each pair is
        # summed, its sibling is parent − child (the subtraction trick).
        if self.kernel:
            # The kernel reads the sampled rows and features of the codes in place (no copies).
            codes = self.codes
            raw = torch.arange(codes.shape[1]) if features is None else features

            def root_histograms() -> torch.Tensor:
                # Without row sampling the root's counts are the same for every tree: count once.
                known = None
                if rows is None and self._root_counts is not None:
                    known = self._root_counts if features is None else self._root_counts.index_select(0, features)
                hist = _cpu_kernel.cpu_histograms(codes, rows, features, node, g, h, 1, counts=known)
                if rows is None and features is None and self._root_counts is None:
                    self._root_counts = hist[2].clone()
                return self.reduce(hist)

            def route(f: int, c: int, n_nodes: int) -> None:
                _cpu_kernel.cpu_route(codes, rows, raw[f: f + 1], torch.tensor([c]), torch.tensor([n_nodes]), node)

            def children(hist: torch.Tensor, small_is_right: torch.Tensor) -> torch.Tensor:
                if self.reduce is identity_reduce:  # the kernel subtracts in place
                    return _cpu_kernel.cpu_children(codes, rows, features, node, g, h, hist, small_is_right)
                # The smaller child of each parent p goes to slot p; the others are skipped.
                n_nodes = hist.shape[2]
                slot = _cpu_kernel.small_child_slots(small_is_right)[0]
                small = self.reduce(_cpu_kernel.cpu_histograms(codes, rows, features, node, g, h, 2 * n_nodes,
                                                               slot, n_nodes))
                return _siblings(hist, small, small_is_right)
        else:
            codes_all = self.codes_t if features is None else self.codes_t.index_select(0, features)
            codes_t = codes_all if rows is None else codes_all.index_select(1, rows)

            def root_histograms() -> torch.Tensor:
                return build_histograms(codes_t, node, g, h, 1, reduce=self.reduce)

            def route(f: int, c: int, n_nodes: int) -> None:
                node.add_((codes_t[f] > c).long() * n_nodes)

            def children(hist: torch.Tensor, small_is_right: torch.Tensor) -> torch.Tensor:
                n_nodes = hist.shape[2]
                bit = node >= n_nodes
                parent = node - bit.long() * n_nodes
                sel = torch.nonzero(bit == small_is_right[parent]).view(-1)
                small = build_histograms(codes_t.index_select(1, sel), parent.index_select(0, sel),
                                         g.index_select(0, sel), h.index_select(0, sel), n_nodes,
                                         reduce=self.reduce)
                return _siblings(hist, small, small_is_right)
        score = _kernel_split_scores if self.kernel else split_scores
        node = torch.zeros(n, dtype=torch.long, device=device)
        depth = p.depth
        feats = torch.zeros(depth, dtype=torch.long, device=device)
        cuts = torch.full((depth,), N_CODES - 1, dtype=torch.long, device=device)
        gains = torch.zeros(depth, dtype=torch.float64, device=device)

        hist = root_histograms()
        for level in range(depth):
            n_nodes = 1 << level
            scores = score(hist, valid, p)
            best = int(torch.argmax(scores))  # first maximum: lowest (feature, code)
            if not float(scores.view(-1)[best]) > 0.0:
                break  # no allowed split: the remaining levels send everything left
            if noise_sd > 0.0:  # −inf (not allowed) stays −inf
                noise = torch.randn(scores.shape, generator=generator, dtype=scores.dtype)
                best = int(torch.argmax(scores + noise.to(device).mul_(noise_sd)))
            f, c = divmod(best, N_CODES)
            feats[level], cuts[level], gains[level] = f, c, scores[f, c]
            route(f, c, n_nodes)
            if level + 1 == depth:
                break
            # Children of the next level: sum only the smaller child of each pair (the
            # subtraction trick).
            left_count = hist[2, f, :, : c + 1].sum(-1)
            right_count = hist[2, f, :, c + 1:].sum(-1)
            small_is_right = right_count <= left_count  # [K]
            hist = children(hist, small_is_right)

        n_leaves = 1 << depth
        values = newton_leaf_values(leaf_sums(node, g, h, n_leaves, reduce=self.reduce), p)
        feats_raw = feats if features is None else features[feats]
        if rows is None:
            leaf_index = node  # the training documents' leaves: Σ_k bit_k · 2^k, built level by level
        elif self.kernel:
            leaf_index = _cpu_kernel.cpu_route(self.codes, None, feats_raw, cuts, 1 << torch.arange(depth),
                                               torch.zeros(self.codes.shape[0], dtype=torch.long))
        else:
            leaf_index = leaf_of(self.codes_t, feats_raw, cuts)
        return Tree(feats_raw, cuts, values, gains, leaf_index)


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
