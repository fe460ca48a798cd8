"""Threads as scikit-learn spells them: ``n_jobs``.

rankkit's CPU kernels (the compiled histograms, splits and lambdas, and torch's own operators)
run on ``torch.get_num_threads()`` threads. :func:`threads` sets that count for one call and
puts the previous one back, so an estimator's ``n_jobs`` never leaks into the rest of the
program.

>>> resolve_n_jobs(None) is None
True
>>> resolve_n_jobs(2)
2
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator

import torch

from rankkit.infra.checks import check_int


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS says, else all)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def resolve_n_jobs(n_jobs, name: str = "n_jobs") -> int | None:
    """The thread count of ``n_jobs``: None leaves torch's setting as it is; a positive count
    is taken as given; -1 is every available core and -k every core but k - 1, at least one
    (scikit-learn's and joblib's rule). 0 is refused."""
    if n_jobs is None:
        return None
    n = check_int(n_jobs, name, low=-(1 << 20))
    if n == 0:
        raise ValueError(f"`{name}` has to be a positive thread count, -1 (every core) or None, got 0")
    return n if n > 0 else max(1, available_cores() + 1 + n)


@contextlib.contextmanager
def threads(n_jobs, name: str = "n_jobs") -> Iterator[None]:
    """Run the block on :func:`resolve_n_jobs` ``(n_jobs)`` threads, then restore the previous count."""
    n = resolve_n_jobs(n_jobs, name)
    previous = torch.get_num_threads()
    if n is None or n == previous:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
