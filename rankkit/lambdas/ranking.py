"""Ranking primitives shared by the metrics and the lambda kernel (imports only torch).

Notation: Q queries, L list length (padded), F features. Every function takes padded
``[Q, L]`` tensors and a bool ``mask`` that is True on real documents.

These are the single place where rankkit decides:

* the gain of a label: ``2**rel - 1`` ("exp", the default, as LightGBM/XGBoost) or ``rel``
  ("linear", as scikit-learn and torchmetrics);
* the discount of a 0-based rank position ``r``: ``1 / log2(r + 2)``;
* how ties in scores are ordered: **worst case** -- among documents with equal scores, the
  lower label is ranked first, so a constant scorer never looks better than it is. Padding
  always ranks after every real document.
"""
from __future__ import annotations

import torch

GAINS = ("exp", "linear")


def gain_values(labels: torch.Tensor, gain: str = "exp", *,
                shift: torch.Tensor | None = None) -> torch.Tensor:
    """Gain of each label, optionally divided by 2^shift per query.

    NDCG and ERR do not change when a query's gains are scaled, so they take the gains over
    the query's largest exp gain: with ``shift`` the query's top label (:func:`gain_shift`),
    ``(2^y − 1) / 2^shift = 2^(y − shift) − 2^(−shift)`` lies in [0, 1) and never overflows,
    whatever the grade (2^128 is already inf in float32, 2^1024 in float64). Labels below the
    top by more than the dtype's exponent range get 0, as they weigh nothing next to it.

    Args:
        labels: [Q, L] non-negative relevance labels (any dtype).
        gain: "exp" for ``2**rel - 1`` or "linear" for ``rel``.
        shift: [Q] exponents (exp gain only; the linear gain ignores it), or None for the raw
            gains.
    Returns:
        [Q, L] float tensor (float64 for float64 labels, else float32).

    >>> gain_values(torch.tensor([[0., 1., 2.]]))
    tensor([[0., 1., 3.]])
    >>> gain_values(torch.tensor([[0., 999., 1000.]]), shift=torch.tensor([1000.]))  # 2^-1, 2^0
    tensor([[0.0000, 0.5000, 1.0000]])
    """
    dtype = labels.dtype if labels.is_floating_point() else torch.float32
    rel = labels.to(dtype)
    if gain == "exp":
        if shift is None:
            return torch.exp2(rel) - 1.0
        shift = shift.to(dtype)[:, None]
        return torch.exp2(rel - shift) - torch.exp2(-shift)
    if gain == "linear":
        return rel
    raise ValueError(f"`gain` has to be one of {GAINS}, got {gain!r}")


def gain_shift(labels: torch.Tensor, mask: torch.Tensor, gain: str = "exp") -> torch.Tensor | None:
    """[Q] the top real label of each query (0 for an empty query) for the exp gain, the
    ``shift`` that :func:`gain_values` and :func:`ideal_dcg` divide by; None for "linear"."""
    if gain != "exp":
        return None
    dtype = labels.dtype if labels.is_floating_point() else torch.float32
    if labels.shape[1] == 0:
        return torch.zeros(labels.shape[0], dtype=dtype, device=labels.device)
    return labels.to(dtype).masked_fill(~mask, 0).amax(dim=1).clamp(min=0)


def discounts(n: int, *, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """Position discounts ``1 / log2(r + 2)`` for 0-based ranks r = 0..n-1, shape [n].

    >>> discounts(3)
    tensor([1.0000, 0.6309, 0.5000])
    """
    return 1.0 / torch.log2(torch.arange(n, dtype=dtype, device=device) + 2.0)


def rank_order(scores: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, *,
               sync: bool = True, label_key: torch.Tensor | None = None) -> torch.Tensor:
    """Indices that sort each query by descending score (worst-case ties, padding last).

    The contract, for every dtype: real documents first, by descending score; among equal
    scores the lower label first; among equal (score, label) by index; then the padding, by
    index. NaN scores rank above +inf (as ``torch.sort``); labels are non-negative on real
    documents (the public entry points check it).

    How: float32, float16 and bfloat16 scores take one stable sort of a packed int64 key
    (score, −label, real) -- :func:`_packed_order`, about as fast as the float sort alone,
    which matters to the booster, whose scores tie all the time (documents that share every
    leaf so far). Other floating scores take one stable sort by score, and the three stable
    sorts of :func:`_reference_rank_order` only when that sort has a tie it cannot decide.

    Args:
        scores: [Q, L] scores.
        labels: [Q, L] labels (used only to break ties in score, lowest label first).
        mask: [Q, L] bool, True on real documents.
        sync: False: never ask the host whether the one-sort path decided every tie (a sync on
            a GPU); scores that the packed key cannot take go straight to the three sorts.
        label_key: [Q, L] int64, :func:`label_key` of ``labels`` (kept by a caller that ranks
            the same labels often), or None to compute it when it is needed.
    Returns:
        [Q, L] long ``order`` such that ``labels.gather(1, order)`` is the ranked list.

    >>> rank_order(torch.tensor([[1., 3., 3.]]), torch.tensor([[0, 2, 1]]), torch.tensor([[True] * 3]))
    tensor([[2, 1, 0]])
    """
    if scores.dtype in _PACKED_SCORES and (labels.dtype in _PACKED_SCORES
                                           or not labels.is_floating_point()):
        return _packed_order(scores, labels if label_key is None else None, mask, label_key)
    if scores.is_floating_point() and sync:
        return _sorted_order(scores, labels, mask)
    return _reference_rank_order(scores, labels, mask)


_PACKED_SCORES = (torch.float32, torch.float16, torch.bfloat16)


def _float_key(x: torch.Tensor) -> torch.Tensor:
    """int64 keys in [−2^31, 2^31) in the order of the float32 values ``x`` (−0 and +0 equal;
    NaN with its sign bit cleared ranks above +inf, so canonicalise NaN first)."""
    bits = (x + 0.0).view(torch.int32)  # + 0.0 turns −0 into +0
    return (bits ^ ((bits >> 31) & 0x7FFFFFFF)).long()


def label_key(labels: torch.Tensor) -> torch.Tensor:
    """[Q, L] int64: the labels' part of :func:`rank_order`'s packed sort key (a 31-bit key
    that decreases as the label grows), for labels that :func:`rank_order` packs (float32,
    float16, bfloat16 or integer)."""
    if labels.is_floating_point():
        y = _float_key(labels.float().clamp(min=0.0))
    else:
        y = labels.long().clamp(0, 0x7FFFFFFF)
    return 0x7FFFFFFF - y


def _packed_order(scores: torch.Tensor, labels: torch.Tensor | None, mask: torch.Tensor,
                  key_of_labels: torch.Tensor | None = None) -> torch.Tensor:
    """rank_order with one stable descending sort of a 63-bit key: the score's order-preserving
    32-bit key (made unsigned) in bits 31..62, the label's reversed 31-bit key below it, and −1
    for padding, below every real document. A non-negative float32 label's bits are its
    order-preserving key and fit 31 bits; integer labels are their own key."""
    s = scores.float()
    s = torch.where(torch.isnan(s), torch.nan, s)  # one NaN: all NaN scores tie, above +inf
    y = label_key(labels) if key_of_labels is None else key_of_labels
    key = ((_float_key(s) + 2**31) << 31) | y
    key = torch.where(mask, key, -1)
    return torch.sort(key, dim=1, descending=True, stable=True).indices


def _sorted_order(scores: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """rank_order by one stable sort of the scores (padding at −inf), which is already right
    unless two neighbours tie in score and differ in label or in being real; then the
    three-sort reference decides."""
    values, order = torch.sort(scores.masked_fill(~mask, -torch.inf), dim=1, descending=True,
                               stable=True)
    nan = torch.isnan(values)
    tied = (values[:, 1:] == values[:, :-1]) | (nan[:, 1:] & nan[:, :-1])
    real, ranked = mask.gather(1, order), labels.gather(1, order)
    undecided = tied & ((real[:, 1:] != real[:, :-1])
                        | (real[:, 1:] & (ranked[:, 1:] != ranked[:, :-1])))
    if bool(undecided.any()):
        return _reference_rank_order(scores, labels, mask)
    return order


def _reference_rank_order(scores: torch.Tensor, labels: torch.Tensor,
                          mask: torch.Tensor) -> torch.Tensor:
    """rank_order by three stable sorts, least significant key first: label ascending, score
    descending, real documents before padding. Padding first gets score and label 0, so that
    it keeps its index order. The slow reference for the one-sort paths."""
    scores = scores.masked_fill(~mask, 0)
    labels = labels.masked_fill(~mask, 0)
    order = torch.sort(labels, dim=1, stable=True).indices
    s = scores.gather(1, order)
    order = order.gather(1, torch.sort(s, dim=1, descending=True, stable=True).indices)
    m = mask.gather(1, order).to(torch.int8)
    return order.gather(1, torch.sort(m, dim=1, descending=True, stable=True).indices)


def ranks(scores: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """0-based rank of each document under :func:`rank_order`, shape [Q, L] (long); off the CPU
    without asking the host about ties (the same order, by the three sorts)."""
    order = rank_order(scores, labels, mask, sync=scores.device.type == "cpu")
    positions = torch.arange(scores.shape[1], device=scores.device).expand_as(order)
    return torch.empty_like(order).scatter_(1, order, positions)


# Integer grades up to this value get the ideal DCG by counting instead of sorting.
MAX_COUNTED_GRADE = 31


def countable(grade: torch.Tensor) -> torch.Tensor:
    """Elementwise: the label is an integer grade 0..:data:`MAX_COUNTED_GRADE` (the ideal DCG
    counts such grades instead of sorting; :class:`rankkit.lambdas.plan.QueryPlan` asks too)."""
    return (grade >= 0) & (grade <= MAX_COUNTED_GRADE) & (grade == grade.round())


def ideal_dcg(labels: torch.Tensor, mask: torch.Tensor, *, k: int | None = None,
              gain: str = "exp", shift: torch.Tensor | None = None, grades: int | None = None) -> torch.Tensor:
    """DCG@k of the ideal (label-sorted) ranking of each query, shape [Q], over 2^shift.

    For integer grades 0..31 (LETOR, MSLR, Yahoo) no sort is needed: the c_v documents of
    grade v fill positions [start_v, start_v + c_v) of the ideal list, start_v being the count
    of higher grades, so IDCG = Σ_v gain(v) (P[start_v + c_v] − P[start_v]) with P the prefix
    sums of the discounts. Other labels are sorted. ``shift`` ([Q], exp gain only) divides
    every gain of a query by 2^shift, as in :func:`gain_values`: NDCG takes DCG and ideal DCG
    over the same 2^shift, the query's top gain, so that no grade overflows. ``grades``: the
    largest label, from a caller that knows every real label to be an integer grade 0..31
    (:attr:`rankkit.lambdas.plan.QueryPlan.grades`; trusted, not checked: a smaller one fails
    the counting's indexing); None: checked here, at the cost of two host synchronisations on
    a GPU.

    >>> ideal_dcg(torch.tensor([[0., 2., 1.]]), torch.tensor([[True] * 3]))  # 3 + 1/log2(3)
    tensor([3.6309])
    >>> ideal_dcg(torch.tensor([[0., 2., 1.]]), torch.tensor([[True] * 3]), shift=torch.tensor([2.]))
    tensor([0.9077])
    """
    dtype = labels.dtype if labels.is_floating_point() else torch.float32
    n = labels.shape[1]
    d = discounts(n, dtype=dtype, device=labels.device)
    if k is not None:
        d = torch.where(torch.arange(n, device=labels.device) < k, d, 0.0)
    grade = labels.masked_fill(~mask, 0)  # no boolean indexing: it costs a nonzero() pass
    if grades is None:  # two host synchronisations (a plan knows: QueryPlan.grades)
        grades = int(grade.max()) if grade.numel() and bool(countable(grade).all()) else None
    if grades is not None:
        top = grades
        grade = grade.long()
        counts = torch.zeros(labels.shape[0], top + 1, dtype=torch.long, device=labels.device)
        counts.scatter_add_(1, grade, mask.long())
        end = counts.flip(1).cumsum(1).flip(1)  # documents of grade >= v
        start = end - counts
        prefix = torch.cat([d.new_zeros(1), d.cumsum(0)])
        grades = torch.arange(top + 1, dtype=dtype, device=labels.device)
        g = gain_values(grades.expand(labels.shape[0], -1), gain, shift=shift)
        return ((prefix[end] - prefix[start]) * g).sum(dim=1)
    g = gain_values(labels, gain, shift=shift).masked_fill(~mask, 0.0)
    g = torch.sort(g, dim=1, descending=True).values
    return (g * d).sum(dim=1)
