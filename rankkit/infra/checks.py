"""Boundary checks: the one place where rankkit validates what a user passes in.

Every public entry point (the metrics, the lambda kernel, the losses, the datasets and readers,
the estimator, the LightningModules) checks its arguments here, with one wording: the message
names the argument, says what it has to be, and for a tensor gives the first bad position::

    ValueError: `labels` has to be finite and non-negative on real documents, got nan at [3, 7]

Private helpers trust their input. The tensor checks cost one host synchronisation for all of
a call's conditions together (:func:`check_tensors`), so that a CUDA caller pays once.
"""
from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Sequence

import torch

GAINS = ("exp", "linear")


# -- scalars -------------------------------------------------------------------------------------
def _is_int(v) -> bool:
    return isinstance(v, Integral) and not isinstance(v, bool)


def _is_real(v) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool)


def check_k(k, name: str = "k") -> int | None:
    """A cutoff: a positive integer or None.

    >>> check_k(2.5)
    Traceback (most recent call last):
    ...
    ValueError: `k` has to be a positive integer or None, got 2.5
    """
    if k is None:
        return None
    if not _is_int(k) or k < 1:
        raise ValueError(f"`{name}` has to be a positive integer or None, got {k!r}")
    return int(k)


def check_gain(gain, name: str = "gain") -> str:
    """An NDCG gain: ``"exp"`` (2^rel − 1) or ``"linear"`` (rel)."""
    if not isinstance(gain, str) or gain not in GAINS:
        raise ValueError(f"`{name}` has to be one of {GAINS}, got {gain!r}")
    return gain


def check_choice(value, choices: Sequence, name: str):
    """One of ``choices``."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"`{name}` has to be one of {tuple(choices)}, got {value!r}")
    return value


def check_int(value, name: str, *, low: int = 1, high: int | None = None, none: bool = False) -> int | None:
    """An integer in [low, high] (or None when ``none``)."""
    if none and value is None:
        return None
    if not _is_int(value) or value < low or (high is not None and value > high):
        span = f">= {low}" if high is None else f"in {low}..{high}"
        raise ValueError(f"`{name}` has to be an integer {span}{' or None' if none else ''}, got {value!r}")
    return int(value)


def check_number(value, name: str, *, low: float = -math.inf, high: float = math.inf,
                 low_open: bool = False, high_open: bool = False) -> float:
    """A finite real number in the interval (low, high) with the given open/closed ends."""
    ok = _is_real(value) and math.isfinite(value) and (
        (low < value) if low_open else (low <= value)) and ((value < high) if high_open else (value <= high))
    if not ok:
        lo = ("(" if low_open else "[") + (f"{low:g}" if math.isfinite(low) else "-inf")
        hi = (f"{high:g}" if math.isfinite(high) else "inf") + (")" if high_open else "]")
        raise ValueError(f"`{name}` has to be a finite number in {lo}, {hi}, got {value!r}")
    return float(value)


def check_bool(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"`{name}` has to be True or False, got {value!r}")
    return value


def check_setting(value, choices: Sequence, name: str):
    """One of ``choices``, a mix of booleans and strings: a bool or a str, never 0 or 1 standing
    in for False or True.

    >>> check_setting(1, (False, True, "auto"), "unbiased")
    Traceback (most recent call last):
    ...
    ValueError: `unbiased` has to be one of (False, True, 'auto'), got 1
    """
    if isinstance(value, (bool, str)) and value in choices:
        return value
    raise ValueError(f"`{name}` has to be one of {tuple(choices)}, got {value!r}")


def check_device(device, name: str = "device") -> torch.device:
    """A torch device that exists here: ``"cuda"`` without CUDA is a one-line error."""
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"`{name}` has to be a torch device such as 'cpu' or 'cuda', got {device!r}") from None
    if d.type == "meta":
        raise ValueError(f"`{name}` is {device!r}, a device that holds no data; use 'cpu' or 'cuda'")
    if d.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"`{name}` is {device!r}, but CUDA is not available on this machine "
                         f"(torch {torch.__version__}); use 'cpu'")
    return d


# -- tensors -------------------------------------------------------------------------------------
def describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return f"a {type(x).__name__}"


def check_tensor(x, name: str, *, shape: tuple | None = None, ndim: int | None = None,
                 kind: str | None = None) -> torch.Tensor:
    """A tensor of the given shape (or rank) and kind (``"float"``, ``"bool"``, ``"int"``)."""
    ok = isinstance(x, torch.Tensor)
    if ok and shape is not None:
        ok = tuple(x.shape) == tuple(shape)
    if ok and ndim is not None:
        ok = x.ndim == ndim
    if ok and kind == "float":
        ok = x.is_floating_point()
    elif ok and kind == "bool":
        ok = x.dtype == torch.bool
    elif ok and kind == "int":
        ok = not (x.is_floating_point() or x.is_complex() or x.dtype == torch.bool)
    if not ok:
        want = (f"a {kind} tensor" if kind else "a tensor") + (
            f" of shape {tuple(shape)}" if shape is not None else f" with {ndim} dimensions" if ndim else "")
        raise ValueError(f"`{name}` has to be {want}, got {describe(x)}")
    return x


def to_device(x: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """``x`` on ``device``: the scores' device decides, every other input follows it."""
    return x if x is None or x.device == device else x.to(device)


def check_tensors(*conditions: tuple[str, torch.Tensor, torch.Tensor, str]) -> None:
    """Raise ValueError for the first condition that fails, with one host synchronisation.

    Each condition is ``(name, values, bad, what)``: ``bad`` a bool tensor of the shape of
    ``values``, True where the value is not allowed; ``what`` says what it has to be. The
    message names the argument, the first bad position and its value.
    """
    conditions = tuple(c for c in conditions if c[2].numel())
    if not conditions:
        return
    flags = torch.stack([c[2].any() for c in conditions]).tolist()  # the one sync
    for (name, values, bad, what), failed in zip(conditions, flags):
        if failed:
            idx = tuple(torch.nonzero(bad)[0].tolist())
            raise ValueError(f"`{name}` has to be {what}, got {values[idx].item()!r} at "
                             f"[{', '.join(map(str, idx))}]")


def checked_copy(payload: torch.Tensor, *conditions: tuple[str, torch.Tensor, torch.Tensor, str]) -> torch.Tensor:
    """``payload`` copied to the host, with the ``conditions`` of :func:`check_tensors` checked
    in the same copy: one host synchronisation for both where a caller needs a copy anyway (a
    query plan's lengths). Raises as :func:`check_tensors` would (the same message), before
    anything reads the copy."""
    conditions = tuple(c for c in conditions if c[2].numel())
    if not conditions:
        return payload.cpu()
    flags = torch.stack([c[2].any() for c in conditions]).to(payload.dtype)
    host = torch.cat([payload.reshape(-1), flags]).cpu()  # the one sync
    if bool(host[payload.numel():].any()):
        check_tensors(*conditions)
    return host[:payload.numel()].view(payload.shape)


def check_sizes(sizes, n: int, name: str = "sizes") -> torch.Tensor:
    """[Q] query sizes: integers, each in 0..n, summing to n (the documents). Every size is
    bounded before anything is summed, so no sum can wrap around (a size of 2^63 - 1 beside a
    negative one is caught here, not in the kernel it would crash)."""
    check_tensor(sizes, name, ndim=1, kind="int")
    check_tensors((name, sizes, (sizes < 0) | (sizes > n), f"a size in 0..{n} (the documents)"))
    total = int(sizes.sum()) if len(sizes) else 0
    if total != n:
        raise ValueError(f"`{name}` has to sum to {n} (the documents), got {total}")
    return sizes


def offsets_conditions(offsets: torch.Tensor, n: int, name: str = "offsets") -> tuple:
    """The conditions of [Q + 1] query offsets: each in 0..n (so no difference wraps), 0 first
    and n last, non-decreasing (for :func:`check_tensors`)."""
    ends = torch.zeros_like(offsets, dtype=torch.bool)
    ends[0] = True
    ends[-1] = True
    target = torch.zeros_like(offsets)
    target[-1] = n
    return ((name, offsets, (offsets < 0) | (offsets > n), f"in 0..N = {n}"),
            (name, offsets, ends & (offsets != target), f"0 first and N = {n} last"),
            (name, offsets, torch.cat([torch.zeros_like(offsets[:1], dtype=torch.bool), offsets.diff() < 0]),
             "non-decreasing"))


def labels_condition(labels: torch.Tensor, mask: torch.Tensor | None, name: str = "labels"):
    """Labels are finite and non-negative on real documents (NaN fails too)."""
    bad = ~(torch.isfinite(labels) & (labels >= 0)) if labels.is_floating_point() else labels < 0
    return (name, labels, bad if mask is None else bad & mask,
            "finite and non-negative" + (" on real documents" if mask is not None else ""))


def weights_condition(weights: torch.Tensor, mask: torch.Tensor | None, name: str = "weights"):
    """Weights are finite and non-negative on real documents."""
    bad = ~(torch.isfinite(weights) & (weights >= 0)) if weights.is_floating_point() else weights < 0
    return (name, weights, bad if mask is None else bad & mask,
            "finite and non-negative" + (" on real documents" if mask is not None else ""))


def finite_condition(values: torch.Tensor, mask: torch.Tensor | None, name: str):
    """Values are finite (no NaN, no ±inf) on real documents."""
    bad = ~torch.isfinite(values)
    return (name, values, bad if mask is None else bad & mask,
            "finite" + (" on real documents" if mask is not None else ""))


def batch_mask(mask, scores: torch.Tensor) -> torch.Tensor:
    """``mask`` checked as a bool [Q, L] tensor of the scores' shape, on their device; all True for None."""
    if mask is None:
        return torch.ones(scores.shape, dtype=torch.bool, device=scores.device)
    return to_device(check_tensor(mask, "mask", shape=scores.shape, kind="bool"), scores.device)


def as_grades(labels: torch.Tensor) -> torch.Tensor:
    """``labels`` as graded relevance: bool labels (clicks kept as a mask) as float32 0.0 / 1.0,
    anything else as it is."""
    return labels.to(torch.float32) if labels.dtype == torch.bool else labels


def check_batch(scores, labels, mask=None, *, weights=None, extra=None, scores_name: str = "scores",
                finite_scores: bool = True,
                defer: list | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A padded batch: ``scores`` [Q, L] float; ``labels``, ``mask`` (bool) and ``weights`` of
    the same shape, moved to the scores' device; labels and weights finite and non-negative on
    real documents, scores finite there, and the conditions ``extra(labels, mask)`` returns (a
    list of ``(name, values, bad, what)``): one host synchronisation for all of it. ``defer``:
    a list that receives those tensor conditions instead, for a caller that checks them in a
    host copy it makes anyway (:func:`checked_copy`); the shapes and kinds are checked here.

    Returns (scores, labels, mask, weights), ``mask`` all True when None was given; bool labels
    (clicks as a mask) as 0.0 / 1.0.
    """
    check_tensor(scores, scores_name, ndim=2, kind="float")
    device = scores.device
    labels = as_grades(to_device(check_tensor(labels, "labels", shape=scores.shape), device))
    mask = batch_mask(mask, scores)
    conditions = [labels_condition(labels, mask)]
    if finite_scores:
        conditions.insert(0, finite_condition(scores.detach(), mask, scores_name))
    if weights is not None:
        weights = to_device(check_tensor(weights, "weights", shape=scores.shape), device)
        conditions.append(weights_condition(weights, mask))
    if extra is not None:
        conditions.extend(extra(labels, mask))
    if defer is not None:
        defer.extend(conditions)
    else:
        check_tensors(*conditions)
    return scores, labels, mask, weights

