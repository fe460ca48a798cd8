"""The trained booster as a plain features -> scores ``nn.Module``.

Notation: N documents, F raw features, T trees, D depth.

Each oblivious tree tests raw feature ``features[t, k]`` against ``thresholds[t, k]`` at level
k, and a document lands in leaf ``Σ_k [x_{f_k} > b_k] · 2^k``; the score is
``bias + Σ_t leaf_values[t, leaf_t]``. The thresholds are raw float values (the binning is
folded into them, see :mod:`rankkit.boosting.binning`), so the module needs no binner and
exports on its own. A NaN feature value never passes ``x > b``: it goes left, as NaN and -inf
do in training (the missing bin ranks below every number).
"""
from __future__ import annotations

import torch
from torch import nn

from rankkit.infra.checks import check_int, check_number, check_tensor, check_tensors, finite_condition

# Trees scored per step of forward: bounds the [N, chunk, D] temporaries.
_TREE_CHUNK = 64


class ObliviousEnsemble(nn.Module):
    """Sum of oblivious trees on raw features.

    Args:
        n_features: F, the raw feature count the model expects.
        features: [T, D] long, the feature of each level of each tree.
        thresholds: [T, D] float32, the raw threshold of each level (+inf: never right).
        leaf_values: [T, 2^D] float32.
        bias: F_0, the constant initial score.

    >>> m = ObliviousEnsemble(2, torch.tensor([[1]]), torch.tensor([[0.5]]),
    ...                       torch.tensor([[-1.0, 1.0]]), bias=2.0)
    >>> m(torch.tensor([[9.0, 0.0], [9.0, 1.0], [9.0, float("nan")]]))
    tensor([1., 3., 1.])
    """

    def __init__(self, n_features: int, features: torch.Tensor, thresholds: torch.Tensor,
                 leaf_values: torch.Tensor, bias: float = 0.0):
        super().__init__()
        n_features = check_int(n_features, "n_features")
        check_tensor(features, "features", ndim=2, kind="int")
        check_tensor(thresholds, "thresholds", shape=features.shape, kind="float")
        depth = features.shape[1]
        check_tensor(leaf_values, "leaf_values", shape=(features.shape[0], 1 << depth), kind="float")
        if isinstance(bias, torch.Tensor):
            check_tensor(bias, "bias", shape=(), kind="float")
        else:
            check_number(bias, "bias")
        device = features.device
        self.n_features = n_features
        self.depth = int(depth)
        self.tree_chunk = _TREE_CHUNK
        self.register_buffer("features", features.to(torch.long))
        self.register_buffer("thresholds", thresholds.to(device, torch.float32))
        self.register_buffer("leaf_values", leaf_values.to(device, torch.float32))
        self.register_buffer("bias", torch.as_tensor(bias, dtype=torch.float32, device=device).clone())
        self.register_buffer("powers", 2 ** torch.arange(depth, dtype=torch.long, device=device))

    def validate(self) -> "ObliviousEnsemble":
        """Check the values (the constructor checks only shapes and kinds, at no host sync).

        Feature indices lie in [0, F); thresholds are never NaN (+inf is "never right", -inf
        "every number right, missing values left": the split training makes between the missing
        bin and the rest); leaf values and the bias are finite, and so is their largest sum (a
        score) in float32. Call it on a model read from a file; every model LambdaMART keeps
        passes it.
        Raises ValueError naming the buffer and the first bad position; returns ``self``.

        >>> ObliviousEnsemble(2, torch.tensor([[2]]), torch.tensor([[0.5]]),
        ...                   torch.tensor([[-1.0, 1.0]])).validate()
        Traceback (most recent call last):
        ...
        ValueError: `features` has to be feature indices in [0, 2), got 2 at [0, 0]
        """
        check_tensors(
            ("features", self.features, (self.features < 0) | (self.features >= self.n_features),
             f"feature indices in [0, {self.n_features})"),
            ("thresholds", self.thresholds, torch.isnan(self.thresholds), "a number or ±inf, not NaN"),
            finite_condition(self.leaf_values, None, "leaf_values"),
            finite_condition(self.bias.reshape(1), None, "bias"),
        )
        # Each leaf finite is not enough: a score is the bias plus one leaf per tree, in float32.
        top = float(self.leaf_values.double().abs().amax(dim=1).sum()) if self.n_trees else 0.0
        top += abs(float(self.bias))
        if top > torch.finfo(torch.float32).max:
            raise ValueError(f"`leaf_values`: the largest leaves of the trees and the bias sum to {top:.3g}, "
                             f"beyond float32's range: a document's score would be inf")
        return self

    @property
    def n_trees(self) -> int:
        return self.features.shape[0]

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # `powers` (2^k per level) is derived from the depth: rebuilt, never read from a file (an
        # edited one indexed past the leaves: an IndexError deep in scoring). Checkpoints hold it,
        # so the key stays and its value is replaced by the module's own.
        key = prefix + "powers"
        if key in state_dict:
            state_dict[key] = self.powers.clone()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, F] float -> scores [N] float32."""
        if x.dim() != 2 or x.shape[1] != self.n_features:
            raise ValueError("expected features of shape [N, " + str(self.n_features) + "]")
        x = x.to(torch.float32)
        n = x.shape[0]
        n_leaves = self.leaf_values.shape[1]
        out = self.bias.expand(n).clone()
        for start in range(0, self.features.shape[0], self.tree_chunk):
            f = self.features[start:start + self.tree_chunk]       # [t, D]
            t = f.shape[0]
            xs = x.index_select(1, f.reshape(-1)).view(n, t, self.depth)
            leaf = ((xs > self.thresholds[start:start + t]).long() * self.powers).sum(-1)  # [N, t]
            flat = leaf + torch.arange(t, device=x.device) * n_leaves
            out = out + self.leaf_values[start:start + t].reshape(-1)[flat].sum(-1)
        return out


def averaged(parts: list[ObliviousEnsemble]) -> ObliviousEnsemble:
    """One ensemble scoring the mean of ``parts``' scores: their trees one after another, each
    leaf value divided by the number of parts, and the mean bias (the blend that
    ``LambdaMART(unbiased="auto")`` may keep, :data:`rankkit.clicks.race.TREE_BLENDS`). One part
    is returned as it is. The parts need the same feature count and depth.

    >>> a = ObliviousEnsemble(1, torch.tensor([[0]]), torch.tensor([[0.5]]), torch.tensor([[0.0, 2.0]]), bias=1.0)
    >>> b = ObliviousEnsemble(1, torch.tensor([[0]]), torch.tensor([[1.5]]), torch.tensor([[0.0, 4.0]]), bias=3.0)
    >>> averaged([a, b])(torch.tensor([[1.0], [2.0]]))  # ((1 + 2) + (3 + 0)) / 2, ((1 + 2) + (3 + 4)) / 2
    tensor([3., 5.])
    """
    if len(parts) == 0:
        raise ValueError("`parts`: at least one ObliviousEnsemble to average, got none")
    for i, part in enumerate(parts):
        if not isinstance(part, ObliviousEnsemble):
            raise ValueError(f"`parts[{i}]` has to be an ObliviousEnsemble, got {type(part).__name__}")
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    for i, part in enumerate(parts):
        if part.n_features != first.n_features or part.depth != first.depth:
            raise ValueError(f"`parts[{i}]` has {part.n_features} features and depth {part.depth}, "
                             f"parts[0] {first.n_features} and {first.depth}: only like ensembles average")
    share = 1.0 / len(parts)
    return ObliviousEnsemble(first.n_features, torch.cat([p.features for p in parts]),
                             torch.cat([p.thresholds for p in parts]),
                             torch.cat([p.leaf_values * share for p in parts]),
                             torch.stack([p.bias for p in parts]).mean())
