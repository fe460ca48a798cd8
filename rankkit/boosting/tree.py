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

Split candidates come from histograms of (G, H, count) over (feature, node, code); from the
second level on only the smaller child of each pair is summed and its sibling is the parent
minus it (the subtraction trick). The kernels come from a backend (:mod:`rankkit.kernels`):
the compiled CPU kernels when they are built and the codes are on the CPU (a depth-D tree in
D + 2 calls, the documents kept partitioned by node), else the torch reference
(:mod:`rankkit.kernels.torch_ref`, on any device, no host sync). Both grow the same trees.
Every sum that crosses documents -- the histograms and the leaf sums -- goes through one
``reduce`` function, the identity by default, so a data-parallel version can all-reduce there
(it takes the unfused kernels).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from rankkit.kernels import cpu as _cpu
from rankkit.kernels import tree_backend
from rankkit.kernels import torch_ref
from rankkit.kernels.torch_ref import (_CHUNK_ROWS, _TINY, N_CODES, Reduce, build_histograms,  # noqa: F401
                                       dequantize, exact_leaf_sums, identity_reduce, leaf_of, leaf_sums,
                                       newton_leaf_values, split_scores)


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


def check_leaf_values(values: torch.Tensor, round_index: int) -> None:
    """Raise ValueError naming the round and the first bad leaf when a leaf value [2^D] (host
    tensor) is NaN, infinite, or beyond float32's range (the model stores float32): such a
    tree would turn every score it touches into inf or NaN without a word."""
    top = torch.finfo(torch.float32).max
    bad = ~(values.abs() <= top)  # NaN compares False
    if bool(bad.any()):
        leaf = int(torch.nonzero(bad)[0])
        raise ValueError(f"boosting round {round_index + 1}: leaf {leaf} of the new tree is {float(values[leaf])} "
                         f"(not a finite float32): the gradients, hessians or learning_rate overflowed; check "
                         f"the labels, weights, init_score and learning_rate")


class ObliviousTreeGrower:
    """Grows oblivious trees on a fixed binned training set.

    Args:
        codes: [N, F] uint8 codes of the training documents (CPU or CUDA).
        valid_codes: [F, 256] bool, the thresholds each feature allows (see the binner).
        params: the tree hyperparameters.
        reduce: the reduction point of every document sum.
        use_kernel: grow with the compiled CPU backend (None: the backend of
            :func:`rankkit.kernels.tree_backend` -- the compiled CPU kernels for CPU codes when
            they are built, the Triton kernels on a GPU with Triton, else the torch
            reference); False runs the torch reference backend.
    """

    def __init__(self, codes: torch.Tensor, valid_codes: torch.Tensor, params: TreeParams, *,
                 reduce: Reduce = identity_reduce, use_kernel: bool | None = None, shard=None):
        # The compiled CPU kernels read the row-major codes [N, F] (a document's codes are one
        # row); the torch ops (and CUDA) a feature-major copy [F, N]. Only one of them is kept.
        on_cpu = codes.device.type == "cpu"
        self.kernel = on_cpu and _cpu.available() if use_kernel is None else bool(use_kernel)
        self.triton = use_kernel is None and tree_backend(codes.device) == "triton"
        if self.kernel:
            assert on_cpu, "the compiled kernels read CPU codes"
            self.codes = codes.contiguous()
            self._fused = _cpu.TreeKernels(self.codes, params.depth, valid_codes)
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
        n_leaves = 1 << p.depth
        fused = self.kernel and self.reduce is identity_reduce
        if fused:
            node, feats, cuts, gains = self._levels_fused(hg, hh, scale, valid, rows, features, noise)
        elif self.triton and self.reduce is identity_reduce:
            node, feats, cuts, gains = self._levels_triton(hg, hh, scale, valid, rows, features, noise)
        else:
            grow_levels = self._levels_kernel if self.kernel else self._levels_torch
            node, feats, cuts, gains = grow_levels(hg, hh, scale, valid, rows, features, noise)
        if p.quantized_grad and self.triton and self.reduce is identity_reduce and n_leaves <= 256:
            from rankkit._triton import backend as triton_backend

            values = newton_leaf_values(triton_backend.exact_leaf_sums(node, g, h, n_leaves), p)
        elif p.quantized_grad:  # integer sums throughout: exact, the same in any order or process
            values = newton_leaf_values(exact_leaf_sums(node, g, h, n_leaves, reduce=self.reduce, shard=self.shard), p)
        elif fused:
            values = _cpu.tree_leaves(node, g, h, n_leaves, p)[0]
        else:
            values = newton_leaf_values(leaf_sums(node, g, h, n_leaves, reduce=self.reduce), p)
        feats_raw = feats if features is None else features[feats]
        if rows is None:
            leaf_index = node  # the training documents' leaves: Σ_k bit_k · 2^k, built level by level
        elif self.kernel:
            leaf_index = _cpu.route(self.codes, None, feats_raw, cuts, 1 << torch.arange(p.depth),
                                    torch.zeros(self.codes.shape[0], dtype=torch.long))
        else:
            leaf_index = leaf_of(self.codes_t, feats_raw, cuts)
        return Tree(feats_raw, cuts, values, gains, leaf_index)

    def _known_root_counts(self, rows, features, quantized: bool) -> torch.Tensor | None:
        """Without row sampling the root's counts are the same for every tree: counted once."""
        if rows is not None or self._root_counts is None:
            return None
        known = self._root_counts if features is None else self._root_counts.index_select(0, features)
        return known.to(torch.int64 if quantized else torch.float64)

    def _levels_fused(self, g, h, scale, valid, rows, features, noise):
        """The levels on the compiled CPU backend's fused kernels: one call per level."""
        known = self._known_root_counts(rows, features, scale is not None)
        node, feats, cuts, gains, root = self._fused.grow_levels(g, h, scale, valid, rows, features, noise,
                                                                 self.params, known)
        if rows is None and features is None and self._root_counts is None:
            self._root_counts = root[2].clone()
        return node, feats, cuts, gains

    def _levels_kernel(self, g, h, scale, valid, rows, features, noise):
        """The levels on the compiled CPU backend's unfused kernels, every histogram through
        the reduction point (data-parallel training)."""
        p, codes = self.params, self.codes
        n, depth = g.shape[0], p.depth
        raw = torch.arange(codes.shape[1]) if features is None else features
        node = torch.zeros(n, dtype=torch.long)
        feats = torch.zeros(depth, dtype=torch.long)
        cuts = torch.full((depth,), N_CODES - 1, dtype=torch.long)
        gains = torch.zeros(depth, dtype=torch.float64)
        known = self._known_root_counts(rows, features, scale is not None)
        hist = _cpu.histograms(codes, rows, features, node, g, h, 1, counts=known)
        if rows is None and features is None and self._root_counts is None:
            self._root_counts = hist[2].clone()
        hist = self.reduce(hist)
        for level in range(depth):
            n_nodes = 1 << level
            scores, best, noisy = _cpu.split_scan(hist, valid, p, scale, None if noise is None else noise[level])
            if not float(scores.view(-1)[best]) > 0.0:  # best: the first maximum, lowest (feature, code)
                # No allowed split: this level and the rest send everything left (code 255),
                # each recording its best feature on the unchanged histograms, as the reference.
                for rest in range(level, depth):
                    noisy = _cpu.split_scan(hist, valid, p, scale, None if noise is None else noise[rest])[2]
                    feats[rest] = noisy // N_CODES
                break
            f, c = divmod(noisy, N_CODES)
            feats[level], cuts[level], gains[level] = f, c, scores[f, c]
            _cpu.route(codes, rows, raw[f: f + 1], torch.tensor([c]), torch.tensor([n_nodes]), node)
            if level + 1 == depth:
                break
            # Children of the next level: the smaller child of each parent p goes to slot p,
            # the others are skipped; the larger is parent − smaller after the reduction.
            left_count = hist[2, f, :, : c + 1].sum(-1)
            small_is_right = hist[2, f, :, c + 1:].sum(-1) <= left_count  # [K]
            slot = _cpu.small_child_slots(small_is_right)[0]
            small = self.reduce(_cpu.histograms(codes, rows, features, node, g, h, 2 * n_nodes, slot, n_nodes))
            hist = torch_ref.siblings(hist, small, small_is_right)
        return node, feats, cuts, gains

    def _levels_triton(self, g, h, scale, valid, rows, features, noise):
        """The levels on the Triton backend (:func:`rankkit._triton.backend.grow_levels`): the
        torch reference's decisions, 5 launches per level, no host sync. Quantized gradients
        sum in int32 cells (exact: rows × num_grad_quant_bins < 2^31 is checked above)."""
        from rankkit._triton import backend as triton_backend

        codes_all = self.codes_t if features is None else self.codes_t.index_select(0, features)
        codes_t = codes_all if rows is None else codes_all.index_select(1, rows)
        return triton_backend.grow_levels(codes_t, g, h, scale, valid, self.params, noise,
                                          hist_dtype=torch.int32 if scale is not None else None)

    def _levels_torch(self, g, h, scale, valid, rows, features, noise):
        """The levels on the torch reference backend, every decision a device tensor: no host sync."""
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
            # A level without an allowed split, and every level after it, sends everything
            # left (code 255); its children's histograms are then its own (an empty right).
            f, c, gain, stopped = torch_ref.split_scan(hist if scale is None else dequantize(hist, scale), valid,
                                                       p, None if noise is None else noise[level], stopped)
            feats[level], cuts[level], gains[level] = f, c, gain
            torch_ref.route(codes_t, f, c, node, n_nodes)
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
            hist = torch_ref.siblings(hist, small, small_is_right)
        return node, feats, cuts, gains

