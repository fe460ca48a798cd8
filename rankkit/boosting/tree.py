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
minus it (the subtraction trick). The levels and the leaves are grown by the fit's backend
(:mod:`rankkit.kernels.backends`: the compiled CPU kernels, a whole tree in one call; the
Triton kernels on a GPU; the torch reference anywhere), which all grow the same trees. Every
sum that crosses documents -- the histograms and the leaf sums -- goes through one ``reduce``
function, the identity by default, so a data-parallel version can all-reduce there.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from rankkit.kernels.backends import Backend, choose
from rankkit.kernels.torch_ref import (_CHUNK_ROWS, N_CODES, Reduce, build_histograms,  # noqa: F401
                                       dequantize, exact_leaf_sums, identity_reduce, leaf_of, leaf_sums,
                                       newton_leaf_values, quantize_gradients, split_scores)


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
        leaf_index: [N] long, the leaf of every document of the training set, or None in the
            trees a :class:`~rankkit.boosting.engine.BoostingEngine` keeps (a kept tree holds
            what prediction and export need, nothing per document).
    """

    features: torch.Tensor
    codes: torch.Tensor
    leaf_values: torch.Tensor
    gains: torch.Tensor
    leaf_index: torch.Tensor | None


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
    """Grows oblivious trees on a fixed binned training set, on one backend.

    The grower does what every backend shares (the round's row and feature sample, the
    quantization of the gradients, the split noise) and hands the tree to its backend
    (:class:`rankkit.kernels.backends.Backend`), which grows every level and the leaves.

    Args:
        codes: [N, F] uint8 codes of the training documents (on the backend's device).
        valid_codes: [F, 256] bool, the thresholds each feature allows (see the binner).
        params: the tree hyperparameters.
        backend: the backend, or its name (None: :func:`rankkit.kernels.backends.choose` for
            the codes' device).
        reduce: the reduction point of every document sum.
        shard: data-parallel: the AllReduce that knows this rank's documents.
    """

    def __init__(self, codes: torch.Tensor, valid_codes: torch.Tensor, params: TreeParams, *,
                 backend: Backend | str | None = None, reduce: Reduce = identity_reduce, shard=None):
        self.backend = backend if isinstance(backend, Backend) else choose(codes.device, backend)
        self.codes = self.backend.codes_layout(codes)  # only the backend's layout is kept
        self.state = self.backend.prepare(self.codes, valid_codes, params.depth)
        self.valid_codes = valid_codes.to(codes.device)
        self.params = params
        self.reduce = reduce
        self.shard = shard

    def grow(self, grad: torch.Tensor, hess: torch.Tensor, *, rows: torch.Tensor | None = None,
             features: torch.Tensor | None = None, noise_sd: float | torch.Tensor = 0.0,
             generator: torch.Generator | None = None) -> Tree:
        """One tree fitted to grad/hess [N] (float64) on ``rows`` and ``features``. On the
        Triton backend its tensors are the fit's buffers, which the next ``grow`` overwrites
        (copy what must outlive it; ``BoostingEngine.update`` returns a host copy).

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
            hg, hh, scale = self.backend.quantize(g, h, p.num_grad_quant_bins, generator, shard=self.shard)
        # The noise of every level is drawn at once, before the levels (so a tree that stops
        # early draws as much as one that does not, on every backend).
        noise = None
        if noisy:
            noise = torch.randn((p.depth, *valid.shape), generator=generator, dtype=torch.float64,
                                device=grad.device).mul_(noise_sd)
        node, feats, cuts, gains, values = self.backend.grow(self, hg, hh, scale, valid, rows, features, noise,
                                                             leaf_g=g, leaf_h=h)
        feats_raw = feats if features is None else features[feats]
        # The training documents' leaves: Σ_k bit_k · 2^k, built level by level; with a row
        # sample, every document routed through the tree.
        leaf_index = node if rows is None else self.backend.leaves_of(self.codes, feats_raw, cuts)
        return Tree(feats_raw, cuts, values, gains, leaf_index)
