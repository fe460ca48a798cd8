"""Ranking losses written as plain PyTorch, the examples of docs/custom_losses.md.

Each is a custom objective (:mod:`rankkit.custom`): ``loss(scores, labels, mask) -> [Q]`` over
padded queries (scores [Q, L], labels [Q, L], mask [Q, L] bool, True on real documents), and
trains both families unchanged::

    LambdaMART(objective=squared_pairwise_hinge)              # trees: grad and exact Hessian by autograd
    LambdaRank(n_features=46, objective=squared_pairwise_hinge)  # a neural ranker: plain autograd

or from a config: ``objective: rankkit.examples.losses.squared_pairwise_hinge``. Every one
ignores padding (rankkit checks that on the first call).

The last three are declared pair by pair (:func:`rankkit.custom.pairwise`): one loss per pair of
``diff`` = s_i − s_j, rankkit forming the pairs; their exact Hessian costs O(pairs), where the same
loss written over [Q, L] pays L Hessian-vector products per query.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from rankkit.custom import pairwise


def _pairs(labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[Q, L, L] bool: real pairs (i, j) with y_i > y_j."""
    return (labels[:, :, None] > labels[:, None, :]) & mask[:, :, None] & mask[:, None, :]


def ranknet(scores: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """RankNet's loss, Σ_{y_i > y_j} log(1 + exp(−(s_i − s_j))) per query (Burges et al., "Learning
    to Rank using Gradient Descent", ICML 2005): the built-in ``"ranknet"`` objective (σ = 1)
    written by hand, whose gradient and exact Hessian equal the built-in's."""
    diff = scores[:, :, None] - scores[:, None, :]
    return (F.softplus(-diff) * _pairs(labels, mask)).sum((1, 2))


def squared_pairwise_hinge(scores: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor,
                           margin: float = 1.0) -> torch.Tensor:
    """Σ_{y_i > y_j} max(0, margin − (s_i − s_j))² per query, over the number of such pairs: the
    squared hinge of a ranking SVM (Joachims, "Optimizing Search Engines using Clickthrough
    Data", KDD 2002, with the L2 loss), whose Hessian (2 per active pair) exists where the plain
    hinge's is zero."""
    pairs = _pairs(labels, mask)
    diff = scores[:, :, None] - scores[:, None, :]
    violation = torch.clamp(margin - diff, min=0.0) ** 2
    return (violation * pairs).sum((1, 2)) / pairs.sum((1, 2)).clamp(min=1)


def smoothed_softmax(scores: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor,
                     smoothing: float = 0.1) -> torch.Tensor:
    """Softmax cross-entropy (ListNet's top-one loss; Cao et al., "Learning to Rank: From
    Pairwise Approach to Listwise Approach", ICML 2007) against the label distribution y / Σy
    smoothed towards uniform: t = (1 − ε) y / Σy + ε / n over the query's n documents (label
    smoothing, Szegedy et al., "Rethinking the Inception Architecture for Computer Vision",
    CVPR 2016). A query with nothing relevant has no target and costs 0."""
    log_p = torch.log_softmax(scores.masked_fill(~mask, float("-inf")), dim=1).masked_fill(~mask, 0.0)
    y = labels.masked_fill(~mask, 0.0)
    total = y.sum(1, keepdim=True)
    n = mask.sum(1, keepdim=True).clamp(min=1).to(scores.dtype)
    target = (1 - smoothing) * y / total.clamp(min=1e-30) + smoothing * mask.to(scores.dtype) / n
    return -(target * log_p).sum(1) * (total[:, 0] > 0)


def softmax_plus_pointwise(scores: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor,
                           alpha: float = 0.1) -> torch.Tensor:
    """A listwise and a pointwise term: the softmax cross-entropy (as :func:`smoothed_softmax`
    without smoothing) plus α · mean (s − y)² over the query's documents, which keeps the
    scores on the labels' scale (calibrated enough to threshold) while the listwise term
    orders them (Yan et al., "Scale Calibration of Deep Ranking Models", KDD 2022, mix such
    terms)."""
    listwise = smoothed_softmax(scores, labels, mask, smoothing=0.0)
    squared = ((scores - labels) ** 2).masked_fill(~mask, 0.0).sum(1) / mask.sum(1).clamp(min=1)
    return listwise + alpha * squared


@pairwise
def declared_ranknet(diff: torch.Tensor, label_i: torch.Tensor, label_j: torch.Tensor) -> torch.Tensor:
    """:func:`ranknet` declared pair by pair: log(1 + exp(−(s_i − s_j))) for each pair with
    y_i > y_j; the same gradient and Hessian as the built-in ``"ranknet"``, at about its speed."""
    return F.softplus(-diff)


@pairwise(reduction="mean")
def declared_squared_hinge(diff: torch.Tensor, label_i: torch.Tensor, label_j: torch.Tensor) -> torch.Tensor:
    """:func:`squared_pairwise_hinge` declared pair by pair: max(0, 1 − (s_i − s_j))² for each pair
    with y_i > y_j, a query's mean over its pairs (``reduction="mean"``)."""
    return torch.clamp(1.0 - diff, min=0.0) ** 2


@pairwise
def label_gap_logistic(diff: torch.Tensor, label_i: torch.Tensor, label_j: torch.Tensor) -> torch.Tensor:
    """The logistic pair loss weighted by the pair's gain gap, (2^y_i − 2^y_j) log(1 + exp(−(s_i −
    s_j))): a pair of a perfect and a bad document counts more than two neighbouring grades (the
    weight LambdaLoss's "RankNet with gain differences" uses; Wang et al., "The LambdaLoss
    Framework for Ranking Metric Optimization", CIKM 2018)."""
    return (torch.pow(2.0, label_i) - torch.pow(2.0, label_j)) * F.softplus(-diff)
