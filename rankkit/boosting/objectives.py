"""Per-document (grad, hess) of the booster's objectives, and its evaluation metrics.

Notation: N documents, Q queries, L padded list length.

The ranking objectives take their gradients from the one shared kernel,
:func:`rankkit.lambdas.lambda_gradients`: the booster only moves scores between the flat
[N] layout of the trees and the padded [Q, L] layout of the kernel, with an index computed
once per data set (:class:`QueryLayout`). The pointwise objective is MART's squared error
(Friedman, "Greedy Function Approximation: A Gradient Boosting Machine", 2001):
``C = ½ w (s − y)²``, grad ``w (s − y)``, hess ``w``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from rankkit.data.dataset import padded_layout

OBJECTIVES = ("lambdarank", "ranknet", "pointwise")


class QueryLayout:
    """The flat [N] <-> padded [Q, L] map of one data set, built once.

    Args:
        labels: [N] float labels.
        sizes: [Q] documents per query (each query's documents contiguous).
        weights: [N] per-document weights or None.
        device: where the padded tensors live.
    """

    def __init__(self, labels: torch.Tensor, sizes: torch.Tensor, weights: torch.Tensor | None = None,
                 device: torch.device | str = "cpu"):
        rows, cols = padded_layout(sizes)
        length = int(sizes.max()) if len(sizes) else 0
        self.rows, self.cols = rows.to(device), cols.to(device)
        self.shape = (len(sizes), length)
        # Position of each document in the flattened [Q * L]; None when that is the identity
        # (every query has L documents), so that pad and flat are views.
        self.index = None if len(rows) == len(sizes) * length else self.rows * length + self.cols
        self.mask = torch.zeros(self.shape, dtype=torch.bool, device=device)
        self.mask[self.rows, self.cols] = True
        self.labels = self.pad(labels.to(device, torch.float32)).clone()  # never a view of the input
        self.weights = None if weights is None else self.pad(weights.to(device, torch.float32)).clone()

    def pad(self, values: torch.Tensor) -> torch.Tensor:
        """[N] -> [Q, L], zero on padding."""
        if self.index is None:
            return values.reshape(self.shape)
        out = torch.zeros(self.shape, dtype=values.dtype, device=values.device)
        out.view(-1).index_copy_(0, self.index, values)
        return out

    def flat(self, values: torch.Tensor) -> torch.Tensor:
        """[Q, L] -> [N]."""
        if self.index is None:
            return values.reshape(-1)
        return values.reshape(-1).index_select(0, self.index)


@dataclass(frozen=True)
class RankingObjective:
    """Gradients from the shared lambda kernel; every field is passed through to it."""

    weighting: str = "ndcg"
    k: int | None = None
    sigma: float = 1.0
    gain: str = "exp"
    normalize: bool = False

    def init_score(self, labels: torch.Tensor, weights: torch.Tensor | None) -> float:
        return 0.0  # a constant shift changes no ranking

    def gradients(self, scores: torch.Tensor, layout: QueryLayout,
                  groups: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """scores [N] -> (grad, hess), each [N] float64; ``groups`` [N] (e.g. leaf indices):
        leave out the pairs inside a group (see ``lambda_gradients``)."""
        from rankkit.lambdas import lambda_gradients

        grad, hess = lambda_gradients(layout.pad(scores.to(torch.float32)), layout.labels,
                                      mask=layout.mask, weighting=self.weighting, sigma=self.sigma,
                                      k=self.k, gain=self.gain, normalize=self.normalize,
                                      weights=layout.weights,
                                      groups=None if groups is None else layout.pad(groups))
        return layout.flat(grad).double(), layout.flat(hess).double()


@dataclass(frozen=True)
class SquaredError:
    """Pointwise regression on the labels (plain MART)."""

    def init_score(self, labels: torch.Tensor, weights: torch.Tensor | None) -> float:
        w = torch.ones_like(labels, dtype=torch.float64) if weights is None else weights.double()
        return float((w * labels.double()).sum() / w.sum().clamp_min(1e-300))

    def gradients(self, scores: torch.Tensor, layout: QueryLayout) -> tuple[torch.Tensor, torch.Tensor]:
        y = layout.flat(layout.labels).double()
        w = torch.ones_like(y) if layout.weights is None else layout.flat(layout.weights).double()
        return w * (scores.double() - y), w


def make_objective(name: str, **options) -> RankingObjective | SquaredError:
    """The one place where objective names become behaviour.

    ``"lambdarank"`` uses the kernel's metric weighting (``weighting`` "ndcg", "map" or "err",
    truncation ``k``); ``"ranknet"`` the kernel's RankNet weighting (|ΔZ| = 1); ``"pointwise"``
    the squared error, which ignores the ranking options.
    """
    if name == "lambdarank":
        return RankingObjective(**options)
    if name == "ranknet":
        return RankingObjective(**{**options, "weighting": "ranknet"})
    if name == "pointwise":
        return SquaredError()
    raise ValueError(f"`objective` has to be one of {OBJECTIVES}, got {name!r}")


def make_metric(name: str) -> Callable[[torch.Tensor, QueryLayout], float]:
    """``"ndcg@k"``, ``"ndcg"``, ``"map@k"`` or ``"map"`` as ``(scores [N], layout) -> mean``.

    NDCG uses the exp gain; queries with nothing to find count as 1 (``empty=1.0``, as
    LightGBM and the MQ2008 anchors).
    """
    from rankkit.metrics import average_precision, ndcg

    base, _, cut = name.partition("@")
    if base not in ("ndcg", "map") or (cut and not cut.isdigit()) or cut == "0":
        raise ValueError(f"`eval_metric` has to look like 'ndcg@10', 'ndcg', 'map@10' or 'map', got {name!r}")
    k = int(cut) if cut else None
    fn = ndcg if base == "ndcg" else average_precision

    def metric(scores: torch.Tensor, layout: QueryLayout) -> float:
        values = fn(layout.pad(scores.to(torch.float32)), layout.labels, mask=layout.mask, k=k, empty=1.0)
        return float(values.double().mean())

    return metric
