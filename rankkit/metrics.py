"""Per-query ranking metrics on padded ``[Q, L]`` batches, and torchmetrics wrappers for logging.

Notation: Q queries, L list length (padded). Every metric takes two positional tensors,
``scores`` and ``labels``, both ``[Q, L]``, and keyword-only options:

* ``mask``: ``[Q, L]`` bool, True on real documents (default: all True). Scores and labels
  under padding are ignored, whatever their value.
* ``k``: the cutoff, a positive int, or None for the whole list.

Each returns a ``[Q]`` tensor with one value per query; average it yourself, or log it with the
:class:`torchmetrics.Metric` wrappers at the bottom of this module (:class:`NDCG`, :class:`MAP`,
:class:`MRR`, :class:`ERR`, :class:`Precision`, and :func:`ranking_metrics` for a standard set).

Conventions (see ``docs/metrics.md`` for how they compare with LightGBM, XGBoost, torchmetrics
and scikit-learn):

* ranking and ties: documents are sorted by descending score; among equal scores the **lower
  label is ranked first** (worst case, :func:`rankkit.lambdas.ranking.rank_order`), so a constant
  scorer never looks better than it is and the result does not depend on document order;
* gain ``2**rel - 1`` ("exp", default) or ``rel`` ("linear"); discount ``1 / log2(rank + 1)``
  for 1-based ranks;
* a document is *relevant* (for MAP, MRR, precision) when ``label > threshold``, default 0;
* ``empty``: the value given to a query with nothing to find -- ideal DCG = 0 for NDCG, no
  relevant document for MAP, MRR and precision. ``1.0`` (default, as LightGBM and XGBoost),
  ``0.0`` (as scikit-learn and torchmetrics' functional API), or ``"skip"``, which returns NaN
  for those queries: reduce with ``torch.nanmean``, as the wrappers do.
"""
from __future__ import annotations

import math

import torch
# torchmetrics is needed only by the logging wrappers at the bottom of this module.
from torchmetrics import Metric, MetricCollection

from rankkit.infra.checks import check_batch, check_gain, check_k, check_number
from rankkit.lambdas.plan import QueryPlan
from rankkit.lambdas.ranking import discounts, gain_values, rank_order

__all__ = [
    "dcg",
    "ndcg",
    "average_precision",
    "mrr",
    "err",
    "precision",
    "NDCG",
    "MAP",
    "MRR",
    "ERR",
    "Precision",
    "ranking_metrics",
    "planned_ndcg",
    "planned_average_precision",
]

SKIP = "skip"


# --------------------------------------------------------------------------------------------
# Validation: once, at the public boundary. The private helpers below trust their input.
# --------------------------------------------------------------------------------------------

def _check_empty(empty) -> float | str:
    if isinstance(empty, str) and empty == SKIP:
        return SKIP
    if isinstance(empty, str):
        raise ValueError(f"`empty` has to be a finite number in [0, 1] (usually 1.0 or 0.0) or "
                         f"'skip', got {empty!r}")
    return check_number(empty, "empty", low=0.0, high=1.0)


def _check_threshold(threshold) -> float:
    return check_number(threshold, "threshold", low=0.0)


def _check_max_label(max_label) -> float:
    return check_number(max_label, "max_label", low=0.0, low_open=True)


def _check_batch(scores, labels, mask, *, max_label: float | None = None):
    """Validate a padded batch (:func:`rankkit.infra.checks.check_batch`, one host
    synchronisation); return (scores, labels, mask) on the scores' device, padding zeroed.

    Both come back as float64 when ``scores`` are float64 and as float32 otherwise: every metric
    is computed in that dtype.
    """
    def at_most(labels, mask):
        if max_label is None:
            return []
        return [("labels", labels, (labels > max_label) & mask,
                 f"at most `max_label`={max_label:g} on real documents")]

    scores, labels, mask, _ = check_batch(scores, labels, mask, extra=at_most)
    dtype = torch.float64 if scores.dtype == torch.float64 else torch.float32
    scores = scores.detach().to(dtype)
    labels = labels.detach().to(dtype)
    return scores.masked_fill(~mask, 0.0), labels.masked_fill(~mask, 0.0), mask


# --------------------------------------------------------------------------------------------
# Private helpers (trusted input).
# --------------------------------------------------------------------------------------------

def _ranked(scores, labels, mask):
    """Labels and mask in rank order (worst-case ties, padding last), each [Q, L]."""
    order = rank_order(scores, labels, mask)
    return labels.gather(1, order), mask.gather(1, order)


def _in_top_k(n: int, k: int | None, device) -> torch.Tensor:
    """[L] bool, True on the first ``k`` rank positions (all when k is None)."""
    positions = torch.arange(n, device=device)
    return positions < (n if k is None else k)


def _fill_empty(values: torch.Tensor, is_empty: torch.Tensor, empty: float | str) -> torch.Tensor:
    fill = math.nan if empty == SKIP else empty
    return torch.where(is_empty, torch.full_like(values, fill), values)


def _dcg(scores, labels, mask, k, gain, shift=None):
    """DCG@k of each query, over 2^shift (see :func:`rankkit.lambdas.ranking.gain_values`)."""
    ranked, real = _ranked(scores, labels, mask)
    g = gain_values(ranked, gain, shift=shift).masked_fill(~real, 0.0)
    d = discounts(g.shape[1], dtype=g.dtype, device=g.device)
    return (g * d * _in_top_k(g.shape[1], k, g.device)).sum(dim=1)


def _relevance_hits(scores, labels, mask, k, threshold):
    """Relevance of each rank position ``[Q, L]`` (float 0/1), its top-k cut, and R per query."""
    ranked, real = _ranked(scores, labels, mask)
    rel = ((ranked > threshold) & real).to(scores.dtype)
    return rel, rel * _in_top_k(rel.shape[1], k, rel.device), rel.sum(dim=1)


# --------------------------------------------------------------------------------------------
# Public metrics.
# --------------------------------------------------------------------------------------------

def dcg(scores: torch.Tensor, labels: torch.Tensor, *, mask: torch.Tensor | None = None,
        k: int | None = None, gain: str = "exp") -> torch.Tensor:
    """Discounted cumulative gain at ``k`` of each query.

    ``DCG@k = sum_{r=1..min(k, n)} gain(rel_r) / log2(r + 1)``, where ``rel_r`` is the label of
    the document ranked r-th by score (worst-case ties).

    Args:
        scores: [Q, L] float scores; entries where ``mask`` is False are ignored.
        labels: [Q, L] non-negative relevance labels.
        mask: [Q, L] bool, True on real documents (default: all True).
        k: cutoff, a positive int, or None for the whole list.
        gain: "exp" for ``2**rel - 1`` or "linear" for ``rel``.
    Returns:
        [Q] DCG@k (0 for a query with no relevant document); float64 for float64 ``scores``,
        else float32 (inf when a gain 2^rel − 1 exceeds float32, from rel = 128 on; NDCG and
        ERR have no such limit).

    >>> dcg(torch.tensor([[3., 2., 1.]]), torch.tensor([[1, 2, 0]]))  # 1 + 3 / log2(3)
    tensor([2.8928])
    """
    k = check_k(k)
    gain = check_gain(gain)
    scores, labels, mask = _check_batch(scores, labels, mask)
    # The gains in float64, exact up to grade 1023; a float32 result is inf above 2^128.
    return _dcg(scores, labels.double(), mask, k, gain).to(scores.dtype)


def ndcg(scores: torch.Tensor, labels: torch.Tensor, *, mask: torch.Tensor | None = None,
         k: int | None = None, gain: str = "exp", empty: float | str = 1.0) -> torch.Tensor:
    """Normalised DCG at ``k`` of each query: ``DCG@k / ideal DCG@k``.

    The ideal DCG@k is the DCG@k of the labels sorted in descending order.

    Args:
        scores: [Q, L] float scores; entries where ``mask`` is False are ignored.
        labels: [Q, L] non-negative relevance labels.
        mask: [Q, L] bool, True on real documents (default: all True).
        k: cutoff, a positive int, or None for the whole list.
        gain: "exp" for ``2**rel - 1`` or "linear" for ``rel``.
        empty: the value for a query whose ideal DCG is 0 (all labels 0, or no real document):
            1.0 (default, as LightGBM/XGBoost), 0.0 (as scikit-learn/torchmetrics), or "skip"
            for NaN -- average with ``torch.nanmean``.
    Returns:
        [Q] NDCG@k in [0, 1]; float64 for float64 ``scores``, else float32.

    The worked example: ranked labels ``[0, 1, 0, 1, 1]`` (binary, so either gain) give
    ``(1/log2(3) + 1/log2(5) + 1/log2(6)) / (1 + 1/log2(3) + 1/log2(4))``:

    >>> scores = torch.tensor([[5., 4., 3., 2., 1.]])
    >>> ndcg(scores, torch.tensor([[0, 1, 0, 1, 1]]), k=5)
    tensor([0.6797])
    >>> ndcg(scores, torch.tensor([[0, 0, 0, 0, 0]]), empty="skip")
    tensor([nan])
    """
    k = check_k(k)
    gain = check_gain(gain)
    empty = _check_empty(empty)
    scores, labels, mask = _check_batch(scores, labels, mask)
    return planned_ndcg(scores, QueryPlan(labels, mask, check=False), k=k, gain=gain, empty=empty)


def planned_ndcg(scores: torch.Tensor, plan: QueryPlan, *, k: int | None = None, gain: str = "exp",
                 empty: float | str = 1.0) -> torch.Tensor:
    """:func:`ndcg` of ``scores`` [Q, L] on the queries of ``plan``
    (:class:`rankkit.lambdas.plan.QueryPlan`), for a caller that scores the same queries many times
    (the boosters' eval sets). Trusts its arguments. The gains over the query's top gain, the
    discounts and the ideal DCG@k come from the plan (computed once); a call ranks the scores,
    gathers the gains and sums, with no host synchronisation.

    Returns:
        [Q] NDCG@k; float64 for float64 ``scores``, else float32.
    """
    dtype = torch.float64 if scores.dtype == torch.float64 else torch.float32
    labels, mask = plan.metric_batch(dtype)
    gains, d, top_k, ideal, is_empty = plan.ndcg_constants(dtype, k, gain)
    s = scores.detach().to(dtype)
    if not plan.full:
        s = s.masked_fill(~mask, 0.0)
    # DCG and ideal DCG over the query's top gain: exact for any grade, no overflow.
    order = rank_order(s, labels, mask, sync=s.device.type == "cpu",
                       label_key=plan.label_key(plan_order=False) if dtype == torch.float32 else None)
    g = gains.gather(1, order)
    if not plan.full:
        g = g.masked_fill(~plan.ranked_mask(plan_order=False), 0.0)
    values = (g * d * top_k).sum(dim=1) / ideal
    return _fill_empty(values, is_empty, empty)


def average_precision(scores: torch.Tensor, labels: torch.Tensor, *,
                      mask: torch.Tensor | None = None, k: int | None = None,
                      threshold: float = 0.0, empty: float | str = 1.0) -> torch.Tensor:
    """Average precision at ``k`` of each query; its mean over queries is MAP@k.

    ``AP@k = sum_{r <= k, r relevant} P@r / min(R, k)``, where ``P@r`` is the fraction of
    relevant documents in the top r and R the number of relevant documents in the query, so a
    perfect ranking scores 1 at every k (LightGBM's ``map@k``). With ``k=None`` this is the
    textbook AP, ``sum_{r relevant} P@r / R``.

    Args:
        scores: [Q, L] float scores; entries where ``mask`` is False are ignored.
        labels: [Q, L] non-negative relevance labels.
        mask: [Q, L] bool, True on real documents (default: all True).
        k: cutoff, a positive int, or None for the whole list.
        threshold: a document is relevant when ``label > threshold`` (default 0).
        empty: the value for a query with no relevant document: 1.0 (default), 0.0 or "skip"
            for NaN.
    Returns:
        [Q] AP@k in [0, 1]; float64 for float64 ``scores``, else float32.

    >>> scores = torch.tensor([[5., 4., 3., 2., 1.]])
    >>> average_precision(scores, torch.tensor([[0, 1, 0, 1, 1]]))  # (1/2 + 2/4 + 3/5) / 3
    tensor([0.5333])
    """
    k = check_k(k)
    threshold = _check_threshold(threshold)
    empty = _check_empty(empty)
    scores, labels, mask = _check_batch(scores, labels, mask)
    return planned_average_precision(scores, QueryPlan(labels, mask, check=False), k=k,
                                     threshold=threshold, empty=empty)


def planned_average_precision(scores: torch.Tensor, plan: QueryPlan, *, k: int | None = None,
                              threshold: float = 0.0, empty: float | str = 1.0) -> torch.Tensor:
    """:func:`average_precision` of ``scores`` [Q, L] on the queries of ``plan``
    (:class:`rankkit.lambdas.plan.QueryPlan`); trusts its arguments. The relevant documents and their
    number per query come from the plan; a call makes no host synchronisation.

    Returns:
        [Q] AP@k; float64 for float64 ``scores``, else float32.
    """
    dtype = torch.float64 if scores.dtype == torch.float64 else torch.float32
    labels, mask = plan.metric_batch(dtype)
    relevant, n_relevant = plan.relevance(dtype, threshold)
    s = scores.detach().to(dtype)
    if not plan.full:
        s = s.masked_fill(~mask, 0.0)
    order = rank_order(s, labels, mask, sync=s.device.type == "cpu",
                       label_key=plan.label_key(plan_order=False) if dtype == torch.float32 else None)
    rel = relevant.gather(1, order).to(dtype)
    rel_at_k = rel * _in_top_k(rel.shape[1], k, rel.device)
    positions = torch.arange(1, rel.shape[1] + 1, dtype=rel.dtype, device=rel.device)
    precision_at = rel.cumsum(dim=1) / positions
    denominator = n_relevant if k is None else n_relevant.clamp(max=k)
    is_empty = n_relevant == 0
    values = (precision_at * rel_at_k).sum(dim=1) / torch.where(is_empty, 1.0, denominator)
    return _fill_empty(values, is_empty, empty)


def mrr(scores: torch.Tensor, labels: torch.Tensor, *, mask: torch.Tensor | None = None,
        k: int | None = None, threshold: float = 0.0, empty: float | str = 1.0) -> torch.Tensor:
    """Reciprocal rank of the first relevant document within the top ``k`` (0 if none there).

    Its mean over queries is the mean reciprocal rank (MRR@k).

    Args:
        scores: [Q, L] float scores; entries where ``mask`` is False are ignored.
        labels: [Q, L] non-negative relevance labels.
        mask: [Q, L] bool, True on real documents (default: all True).
        k: cutoff, a positive int, or None for the whole list.
        threshold: a document is relevant when ``label > threshold`` (default 0).
        empty: the value for a query with no relevant document: 1.0 (default), 0.0 or "skip"
            for NaN.
    Returns:
        [Q] reciprocal ranks in [0, 1]; float64 for float64 ``scores``, else float32.

    >>> scores = torch.tensor([[5., 4., 3., 2., 1.]])
    >>> mrr(scores, torch.tensor([[0, 0, 1, 0, 1]]))  # 1 / 3
    tensor([0.3333])
    """
    k = check_k(k)
    threshold = _check_threshold(threshold)
    empty = _check_empty(empty)
    scores, labels, mask = _check_batch(scores, labels, mask)
    rel, rel_at_k, n_relevant = _relevance_hits(scores, labels, mask, k, threshold)
    positions = torch.arange(1, rel.shape[1] + 1, dtype=rel.dtype, device=rel.device)
    # 1 / position decreases with rank, so the largest entry is the first relevant document.
    values = (rel_at_k / positions).amax(dim=1) if rel.shape[1] else torch.zeros_like(n_relevant)
    return _fill_empty(values, n_relevant == 0, empty)


def precision(scores: torch.Tensor, labels: torch.Tensor, *, mask: torch.Tensor | None = None,
              k: int | None = None, threshold: float = 0.0,
              empty: float | str = 1.0) -> torch.Tensor:
    """Precision at ``k``: the number of relevant documents in the top ``k``, divided by ``k``.

    The divisor is ``k`` even for a query with fewer than ``k`` documents (as trec_eval,
    XGBoost's ``pre@k`` and torchmetrics' default); with ``k=None`` it is the number of real
    documents in the query, so the value is the fraction of relevant documents.

    Args:
        scores: [Q, L] float scores; entries where ``mask`` is False are ignored.
        labels: [Q, L] non-negative relevance labels.
        mask: [Q, L] bool, True on real documents (default: all True).
        k: cutoff, a positive int, or None for the whole list.
        threshold: a document is relevant when ``label > threshold`` (default 0).
        empty: the value for a query with no relevant document: 1.0 (default), 0.0 or "skip"
            for NaN.
    Returns:
        [Q] precision@k in [0, 1]; float64 for float64 ``scores``, else float32.

    >>> scores = torch.tensor([[5., 4., 3., 2., 1.]])
    >>> precision(scores, torch.tensor([[0, 1, 0, 1, 1]]), k=2)  # 1 / 2
    tensor([0.5000])
    """
    k = check_k(k)
    threshold = _check_threshold(threshold)
    empty = _check_empty(empty)
    scores, labels, mask = _check_batch(scores, labels, mask)
    _, rel_at_k, n_relevant = _relevance_hits(scores, labels, mask, k, threshold)
    # With k=None, a query with no real document has no relevant one either: it is empty.
    divisor = mask.sum(dim=1).clamp(min=1).to(rel_at_k.dtype) if k is None else k
    return _fill_empty(rel_at_k.sum(dim=1) / divisor, n_relevant == 0, empty)


def err(scores: torch.Tensor, labels: torch.Tensor, *, mask: torch.Tensor | None = None,
        k: int | None = None, max_label: float = 4) -> torch.Tensor:
    """Expected reciprocal rank at ``k`` (Chapelle et al., 2009) of each query.

    A user scans down the ranking and stops at the r-th document with probability
    ``R_r = (2**rel_r - 1) / 2**max_label``; ERR is the expected reciprocal stopping rank:
    ``ERR@k = sum_{r=1..k} (1/r) * R_r * prod_{i<r} (1 - R_i)``.

    ERR is not normalised: a query with no relevant document scores 0 (there is no ``empty``),
    and even a perfect ranking scores below 1.

    Args:
        scores: [Q, L] float scores; entries where ``mask`` is False are ignored.
        labels: [Q, L] non-negative relevance labels, at most ``max_label``.
        mask: [Q, L] bool, True on real documents (default: all True).
        k: cutoff, a positive int, or None for the whole list.
        max_label: the top grade of the label scale, fixed for a data set, never taken from a
            batch: 4 (default) for MSLR-WEB and Yahoo! LTR (grades 0-4), 2 for MQ2007/MQ2008,
            1 for binary labels. Labels above it raise an error.
    Returns:
        [Q] ERR@k in [0, 1); float64 for float64 ``scores``, else float32.

    >>> scores = torch.tensor([[2., 1.]])
    >>> err(scores, torch.tensor([[1, 2]]), max_label=2)  # 1/4 + (1/2) * (3/4) * (1 - 1/4)
    tensor([0.5312])
    """
    k = check_k(k)
    max_label = _check_max_label(max_label)
    scores, labels, mask = _check_batch(scores, labels, mask, max_label=max_label)
    ranked, real = _ranked(scores, labels, mask)
    # R = (2^y − 1) / 2^max_label = 2^(y − max_label) − 2^−max_label, and 1 − R directly (not
    # as 1 − R, which rounds to 0 for a top grade above the dtype's precision).
    top = 2.0 ** (ranked - max_label)
    floor = 2.0 ** -max_label
    stop = (top - floor).masked_fill(~real, 0.0)
    go_on = ((1.0 - top) + floor).masked_fill(~real, 1.0)
    # Probability of reaching rank r: prod_{i<r} (1 - R_i), an exclusive cumulative product.
    reach = torch.cumprod(torch.cat([torch.ones_like(stop[:, :1]), go_on[:, :-1]], dim=1), dim=1)
    positions = torch.arange(1, stop.shape[1] + 1, dtype=stop.dtype, device=stop.device)
    return (stop * reach / positions * _in_top_k(stop.shape[1], k, stop.device)).sum(dim=1)


# --------------------------------------------------------------------------------------------
# torchmetrics wrappers: sum of per-query values and query count, so DDP sync is a plain sum.
# --------------------------------------------------------------------------------------------

class _QueryMean(Metric):
    """Mean of a per-query metric over every query seen by ``update``; skipped queries (NaN)
    are left out of both the sum and the count."""

    is_differentiable = False
    higher_is_better = True
    full_state_update = False
    _fn = None  # the per-query metric; set by each subclass

    def __init__(self, *, k: int | None, options: dict, **kwargs) -> None:
        super().__init__(**kwargs)
        self.k = check_k(k)
        self._options = options
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64),
                       dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, scores: torch.Tensor, labels: torch.Tensor,
               mask: torch.Tensor | None = None) -> None:
        """Add a padded batch: ``scores`` and ``labels`` [Q, L], optional bool ``mask`` [Q, L]."""
        values = type(self)._fn(scores, labels, mask=mask, k=self.k, **self._options)
        kept = ~torch.isnan(values)
        self.total += values[kept].sum(dtype=torch.float64)
        self.count += kept.sum()

    def compute(self) -> torch.Tensor:
        """Mean over queries (float64); NaN if no query was counted."""
        return self.total / self.count


class NDCG(_QueryMean):
    """Mean NDCG@k over queries; the options are those of :func:`ndcg`.

    >>> metric = NDCG(k=5)
    >>> metric.update(torch.tensor([[5., 4., 3., 2., 1.]]), torch.tensor([[0, 1, 0, 1, 1]]))
    >>> metric.update(torch.tensor([[1., 2.]]), torch.tensor([[0, 0]]))  # empty: counts as 1
    >>> round(metric.compute().item(), 4)  # (0.6797 + 1) / 2
    0.8399
    """

    _fn = staticmethod(ndcg)

    def __init__(self, *, k: int | None = None, gain: str = "exp", empty: float | str = 1.0,
                 **kwargs) -> None:
        super().__init__(k=k, options={"gain": check_gain(gain), "empty": _check_empty(empty)},
                         **kwargs)


class MAP(_QueryMean):
    """Mean average precision at k; the options are those of :func:`average_precision`."""

    _fn = staticmethod(average_precision)

    def __init__(self, *, k: int | None = None, threshold: float = 0.0,
                 empty: float | str = 1.0, **kwargs) -> None:
        super().__init__(k=k, options={"threshold": _check_threshold(threshold),
                                       "empty": _check_empty(empty)}, **kwargs)


class MRR(_QueryMean):
    """Mean reciprocal rank at k; the options are those of :func:`mrr`."""

    _fn = staticmethod(mrr)

    def __init__(self, *, k: int | None = None, threshold: float = 0.0,
                 empty: float | str = 1.0, **kwargs) -> None:
        super().__init__(k=k, options={"threshold": _check_threshold(threshold),
                                       "empty": _check_empty(empty)}, **kwargs)


class Precision(_QueryMean):
    """Mean precision at k; the options are those of :func:`precision`."""

    _fn = staticmethod(precision)

    def __init__(self, *, k: int | None = None, threshold: float = 0.0,
                 empty: float | str = 1.0, **kwargs) -> None:
        super().__init__(k=k, options={"threshold": _check_threshold(threshold),
                                       "empty": _check_empty(empty)}, **kwargs)


class ERR(_QueryMean):
    """Mean expected reciprocal rank at k; the options are those of :func:`err`."""

    _fn = staticmethod(err)

    def __init__(self, *, k: int | None = None, max_label: float = 4, **kwargs) -> None:
        super().__init__(k=k, options={"max_label": _check_max_label(max_label)}, **kwargs)


def ranking_metrics(ks: tuple[int, ...] = (1, 3, 5, 10), *, gain: str = "exp",
                    empty: float | str = 1.0, prefix: str | None = None) -> MetricCollection:
    """The standard set: ``ndcg@k`` for each k in ``ks``, and ``map`` (whole list).

    Every metric keeps its own state (``compute_groups=False``): torchmetrics would otherwise
    merge metrics whose states happen to be equal after the first batch.

    >>> metrics = ranking_metrics((1, 5), prefix="val/")
    >>> metrics.update(torch.tensor([[5., 4., 3., 2., 1.]]), torch.tensor([[0, 1, 0, 1, 1]]))
    >>> {name: round(value.item(), 4) for name, value in metrics.compute().items()}
    {'val/map': 0.5333, 'val/ndcg@1': 0.0, 'val/ndcg@5': 0.6797}
    """
    metrics = {f"ndcg@{k}": NDCG(k=k, gain=gain, empty=empty) for k in ks}
    metrics["map"] = MAP(empty=empty)
    return MetricCollection(metrics, prefix=prefix, compute_groups=False)
