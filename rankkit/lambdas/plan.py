"""The plan of a padded batch of queries: everything about its labels that a fit computes once.

Notation: Q queries, L padded list length.

A boosting run scores the same queries hundreds of times, with new scores and nothing else
new. :class:`QueryPlan` holds what does not change between those calls -- the validated labels,
mask and weights, the queries in order of length, the lambda kernel's block plan, each
weighting's per-query constants (the ideal DCG@k and the gains over it) and the metrics' ideal
DCG -- so that a round only ranks the new scores and does the pair arithmetic. The lambda
kernel (:func:`rankkit.lambdas.planned_lambda_gradients`) and the metrics
(:func:`rankkit.metrics.planned_ndcg`, :func:`rankkit.metrics.planned_average_precision`)
take a plan; their public functions build one per call.

Everything is computed on first use and cached by the options it depends on (the compute
dtype, the cutoff, the gain, ...). Building a plan costs one host synchronisation (the
query lengths, the top label, whether the labels are integer grades and the validation's
verdicts, in one copy); off the CPU its first lambda pass for a cutoff copies the kernel's
block bounds to the device from pinned memory, without waiting; using it again costs none.
"""
from __future__ import annotations

import contextlib
import contextvars

import torch

from rankkit.infra import checks as _checks
from rankkit.lambdas.blocks import plan_blocks
from rankkit.lambdas.ranking import countable, discounts, gain_shift, gain_values, ideal_dcg, label_key

__all__ = ["QueryPlan", "shared_plan", "shared_plan_of"]


class QueryPlan:
    """What a padded batch of queries keeps from one call to the next.

    Args:
        labels: [Q, L] non-negative relevance labels.
        mask: [Q, L] bool, True on real documents; None means all True.
        weights: [Q, L] non-negative per-document weights, or None.
        check: validate the arguments (labels and weights finite and non-negative on real
            documents), naming the first bad position. False: the caller has (the public
            kernel and metrics validate their arguments before they build a plan).
        conditions: more conditions of :func:`rankkit.infra.checks.check_tensors` (a caller's
            own, e.g. the scores'), checked first. All of them are checked in the plan's one
            copy to the host, which raises before the plan is made.

    Attributes:
        labels, mask, weights: the batch as given (mask all True for None), on the labels'
            device.
        max_label: the largest real label (0 for no real document), a host float.
        lengths: [Q] real documents per query in plan order (ascending), on the host.
        device_lengths: the same on the labels' device.
        grades: the largest label when every real label is an integer grade 0..31 (the ideal
            DCG counts them instead of sorting), else None.
        qperm: [Q] long on the device, the plan order of the queries (sorted by length,
            stable), or None when the queries are in that order already.
        full: no query has padding.

    >>> plan = QueryPlan(torch.tensor([[1.0, 0.0, 2.0], [1.0, 0.0, 0.0]]),
    ...                  mask=torch.tensor([[True, True, True], [True, True, False]]))
    >>> plan.lengths.tolist(), plan.qperm.tolist(), plan.full, plan.max_label
    ([2, 3], [1, 0], False, 2.0)
    """

    def __init__(self, labels: torch.Tensor, mask: torch.Tensor | None = None, *,
                 weights: torch.Tensor | None = None, check: bool = True, conditions: list | tuple = ()):
        conditions = list(conditions)
        if check:
            labels = _checks.as_grades(_checks.check_tensor(labels, "labels", ndim=2))
            device = labels.device
            if mask is not None:
                mask = _checks.to_device(_checks.check_tensor(mask, "mask", shape=labels.shape,
                                                              kind="bool"), device)
            conditions.append(_checks.labels_condition(labels, mask))
            if weights is not None:
                weights = _checks.to_device(_checks.check_tensor(weights, "weights", shape=labels.shape),
                                            device)
                conditions.append(_checks.weights_condition(weights, mask))
        if mask is None:
            mask = torch.ones(labels.shape, dtype=torch.bool, device=labels.device)
        self.labels, self.mask, self.weights = labels, mask, weights
        self.shape = tuple(labels.shape)
        self.device = labels.device
        n_queries, n_docs = self.shape
        # The one host synchronisation: the query lengths, the top label, whether the labels are
        # integer grades (the ideal DCG counts them) and the checks' verdicts, in one copy.
        grade = labels.detach().masked_fill(~mask, 0)
        top = grade.amax(1).double() if n_docs else torch.zeros(n_queries, dtype=torch.float64, device=self.device)
        counted = countable(grade).all(1)
        device_lengths = mask.sum(1)
        host = (_checks.checked_copy(torch.stack([device_lengths.double(), top, counted.double()]), *conditions)
                if n_queries else torch.zeros(3, 0))
        lengths = host[0].long()
        self.max_label = float(host[1].max()) if n_queries else 0.0
        self.grades = int(self.max_label) if n_queries and n_docs and bool(host[2].all()) else None
        self.qperm = None
        if bool((lengths[1:] < lengths[:-1]).any()):
            # Sorted on both sides: a stable sort's order is the same on the device, which so
            # gets its lengths and the permutation without a copy from the host.
            lengths = torch.sort(lengths, stable=True).values
            device_lengths, self.qperm = torch.sort(device_lengths, stable=True)
        self.lengths, self.device_lengths = lengths, device_lengths
        self.full = n_queries == 0 or int(lengths[0]) == n_docs
        self._cache: dict = {}

    def cached(self, key, make):
        """The value stored under ``key``, made by ``make()`` on first use."""
        value = self._cache.get(key)
        if value is None:
            value = self._cache[key] = make()
        return value

    # -- the lambda kernel's view: queries in plan order ----------------------------------------
    def to_plan_order(self, t: torch.Tensor) -> torch.Tensor:
        """[Q, ...] -> the same rows in plan order (a no-op when the queries are in it)."""
        return t if self.qperm is None else t[self.qperm]

    def sorted_batch(self, dtype: torch.dtype):
        """(labels, mask, lengths on the device, weights / 2 or None), in plan order, labels and
        half weights in ``dtype`` and zero on padding."""
        def make():
            m = self.to_plan_order(self.mask)
            y = self.to_plan_order(self.labels.detach().to(dtype))
            half_w = None
            if self.weights is not None:
                half_w = self.to_plan_order(self.weights.detach().to(dtype)).mul(0.5)
            if not self.full:
                y = y.masked_fill(~m, 0.0)
                half_w = None if half_w is None else half_w.masked_fill(~m, 0.0)
            return y, m, self.device_lengths, half_w
        return self.cached(("sorted", dtype), make)

    def ranked_mask(self, plan_order: bool) -> torch.Tensor:
        """[Q, L] bool: the mask in rank order (padding ranks last, so the first ``length``
        positions of a query are real), queries in plan order or in the caller's."""
        def make():
            n = self.shape[1]
            lengths = self.device_lengths if plan_order else self.mask.sum(1)
            return torch.arange(n, device=self.device)[None, :] < lengths[:, None]
        return self.cached(("ranked_mask", plan_order), make)

    def label_key(self, plan_order: bool) -> torch.Tensor:
        """:func:`rankkit.lambdas.ranking.label_key` of the labels (zero on padding), queries in plan
        order or in the caller's: the labels' half of the packed sort key of ``rank_order``."""
        def make():
            labels = self.labels.detach().float().masked_fill(~self.mask, 0.0)
            return label_key(self.to_plan_order(labels) if plan_order else labels)
        return self.cached(("label_key", plan_order), make)

    def blocks(self, cutoff: int, cap: int, cpu: bool) -> list:
        """The kernel's blocks (:func:`rankkit.lambdas.blocks.plan_blocks`) for this cutoff and cap."""
        return self.cached(("blocks", cutoff, cap, cpu),
                            lambda: list(plan_blocks(self.lengths, cutoff, cap, cpu)))

    def weighting_constants(self, weighting, dtype: torch.dtype, cutoff: int, gain: str,
                            max_err_label: float | None):
        """``weighting.plan_terms`` of the batch in plan order (per-document terms [Q, L] in
        document order, per-position terms [1, L]), or None for a weighting without them."""
        if weighting.plan_terms is None:
            return None

        def make():
            y, m, _, _ = self.sorted_batch(dtype)
            return weighting.plan_terms(y, m, cutoff, gain, max_err_label, grades=self.grades)
        return self.cached(("terms", id(weighting), dtype, cutoff, gain, max_err_label), make)

    # -- the metrics' view: queries in the caller's order --------------------------------------
    def metric_batch(self, dtype: torch.dtype):
        """(labels in ``dtype``, zero on padding, mask), in the caller's query order."""
        return self.cached(("metric", dtype), lambda: (
            self.labels.detach().to(dtype).masked_fill(~self.mask, 0.0), self.mask))

    def ndcg_constants(self, dtype: torch.dtype, k: int | None, gain: str):
        """(gains over the query's top gain [Q, L], discounts in the top k [L], ideal DCG@k [Q]
        (1 where it is 0), the queries whose ideal DCG@k is 0 [Q]) for NDCG@k."""
        def make():
            labels, mask = self.metric_batch(dtype)
            shift = gain_shift(labels, mask, gain)
            ideal = ideal_dcg(labels, mask, k=k, gain=gain, shift=shift, grades=self.grades)
            n = labels.shape[1]
            top_k = torch.arange(n, device=self.device) < (n if k is None else k)
            is_empty = ideal <= 0
            return (gain_values(labels, gain, shift=shift), discounts(n, dtype=dtype, device=self.device),
                    top_k, torch.where(is_empty, 1.0, ideal), is_empty)
        return self.cached(("ndcg", dtype, k, gain), make)

    def relevance(self, dtype: torch.dtype, threshold: float):
        """(relevant documents [Q, L] bool, their number per query [Q] in ``dtype``)."""
        def make():
            labels, mask = self.metric_batch(dtype)
            rel = (labels > threshold) & mask
            return rel, rel.to(dtype).sum(dim=1)
        return self.cached(("relevance", dtype, threshold), make)


#: The batch whose plan the losses inside :func:`shared_plan` share: (labels, mask, plan, the
#: conditions the block checks at its end).
_SHARED: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("rankkit_shared_plan", default=None)


@contextlib.contextmanager
def shared_plan(labels: torch.Tensor, mask: torch.Tensor):
    """Inside this block, the losses of one batch (these ``labels`` and ``mask``, the same
    tensors) that ask :func:`shared_plan_of` share one :class:`QueryPlan`: the labels validated
    and planned once, not once per loss (on a GPU a host synchronisation each). A planned loss
    checks neither its scores nor its pair weights, so each loss hands them to
    :func:`shared_plan_of` and the block checks them all at its end, in one synchronisation,
    as the unplanned losses would have (the same messages). The race of ``unbiased="auto"``
    trains its candidates' lambda losses on one batch in such a block
    (:meth:`rankkit.clicks.race.DebiasingRace.loss`, :class:`rankkit.neural.objective.NeuralObjective`)."""
    conditions: list = []
    token = _SHARED.set((labels, mask, QueryPlan(labels, mask), conditions))
    try:
        yield
    finally:
        _SHARED.reset(token)
    _checks.check_tensors(*conditions)


def shared_plan_of(labels: torch.Tensor, mask: torch.Tensor, scores: torch.Tensor,
                   pair_weights: tuple[torch.Tensor, torch.Tensor] | None = None) -> QueryPlan | None:
    """The plan of the enclosing :func:`shared_plan` block if it is these tensors' (None
    otherwise, and nothing is kept); the block then checks ``scores`` (finite on real documents)
    and ``pair_weights`` (finite, non-negative) at its end."""
    shared = _SHARED.get()
    if shared is None or shared[0] is not labels or shared[1] is not mask:
        return None
    shared[3].append(_checks.finite_condition(scores.detach(), mask, "scores"))
    shared[3].extend(_checks.weights_condition(w.detach(), mask, "pair_weights") for w in pair_weights or ())
    return shared[2]
