"""Threads as scikit-learn spells them: ``n_jobs``, and threads that give way on a busy machine.

rankkit's CPU kernels (the compiled histograms, splits and lambdas, and torch's own operators)
run on ``torch.get_num_threads()`` threads. :func:`threads` sets that count for one call and
puts the previous one back, so an estimator's ``n_jobs`` never leaks into the rest of the
program.

With the default ``n_jobs=None`` the count also gives way while other processes keep this
one's threads waiting for a core (:class:`ThreadGovernor`, ticked once a boosting round by
:func:`tick`). OpenMP's threads meet at a barrier after every parallel loop; the runtime torch
ships (libgomp) spins there, and a thread that shares its core with another busy process is
descheduled for whole time slices while the others wait for it: on 2 cores beside one busy
process a LambdaMART fit on MQ2008 took 4× its quiet time on 2 threads, 1.6× on one. The
kernels give every document to the same thread whatever the count (a feature's histogram is
summed by one thread in document order), so the model does not depend on the count chosen.

>>> resolve_n_jobs(None) is None
True
>>> resolve_n_jobs(2)
2
"""
from __future__ import annotations

import contextlib
import contextvars
import math
import os
import time
from typing import Callable, Iterator

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
    """Run the block on :func:`resolve_n_jobs` ``(n_jobs)`` threads, then restore the previous
    count. With ``n_jobs=None`` the block's boosting rounds (:func:`tick`) may run on fewer
    threads while the machine is busy (:class:`ThreadGovernor`)."""
    n = resolve_n_jobs(n_jobs, name)
    previous = torch.get_num_threads()
    if n is not None and n != previous:
        torch.set_num_threads(n)
    token = _GOVERNOR.set(ThreadGovernor() if n is None and previous > 1 else None)
    try:
        yield
    finally:
        _GOVERNOR.reset(token)
        if torch.get_num_threads() != previous:
            torch.set_num_threads(previous)


_GOVERNOR: contextvars.ContextVar = contextvars.ContextVar("rankkit_thread_governor", default=None)


def tick() -> None:
    """Called once a boosting round: lets the governor of the enclosing :func:`threads` block
    (if any) look at the machine and change the thread count."""
    governor = _GOVERNOR.get()
    if governor is not None:
        governor.tick()


def schedstat() -> tuple[int, int] | None:
    """(nanoseconds on a CPU, nanoseconds runnable but waiting for one) summed over this
    process's threads (Linux's ``/proc/self/task/*/schedstat``); None where there is none."""
    run = wait = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/schedstat", "rb") as f:
                fields = f.read(256).split()  # the kernel's one line of three numbers
            run, wait = run + int(fields[0]), wait + int(fields[1])
        except (OSError, ValueError, IndexError):  # a thread that ended meanwhile
            continue
    return run, wait


class ThreadGovernor:
    """Fewer threads while the machine is busy, and back when it is not.

    Every ``check`` seconds (at a round's start) it reads how long this process's threads ran
    and how long they waited, runnable, for a core (:func:`schedstat`). When more than
    ``contended`` of their time was waiting, another process holds a core they need: one thread
    is given up (down to 1). A thread is tried back after ``probe`` seconds, then after twice as
    long each time the machine proves still busy (up to a minute); a calm look at the full count
    forgets the back-off. Quiet, the waiting share stays near 0 and nothing changes.

    >>> looks = iter([(0, 0), (10, 90)])  # (ns running, ns waiting) at two rounds 1 s apart
    >>> g = ThreadGovernor(top=2, clock=iter([0.0, 1.0]).__next__, read=looks.__next__, set_threads=lambda n: None)
    >>> g.tick(); g.tick(); g.n    # 90 % of the time waiting: one thread given up
    1
    """

    def __init__(self, *, top: int | None = None, check: float = 0.1, contended: float = 0.15, probe: float = 2.0,
                 clock: Callable[[], float] = time.monotonic, read: Callable[[], tuple[int, int] | None] = schedstat,
                 set_threads: Callable[[int], None] = torch.set_num_threads):
        self.top = torch.get_num_threads() if top is None else top
        self.n = self.top
        self.check, self.contended, self.probe = check, contended, probe
        self.clock, self.read, self.set_threads = clock, read, set_threads
        self.last: float | None = None
        self.base: tuple[int, int] | None = None
        self.backoff, self.probe_at = probe, math.inf
        self.changes: list[tuple[float, int]] = []  # (time, count): what it did, for benchmarks and tests

    def tick(self) -> None:
        if self.top <= 1:
            return
        now = self.clock()
        if self.last is None:  # the first round: the baseline
            self.base, self.last = self.read(), now
            if self.base is None:
                self.top = 1  # no schedstat here: never changes anything
            return
        if now - self.last < self.check:
            return
        current = self.read()
        if current is None:
            return
        run, wait = max(0, current[0] - self.base[0]), max(0, current[1] - self.base[1])
        self.base, self.last = current, now
        share = wait / (run + wait) if run + wait > 0 else 0.0
        if share > self.contended and self.n > 1:
            self._set(self.n - 1, now)
            self.probe_at, self.backoff = now + self.backoff, min(2 * self.backoff, 60.0)
        elif self.n < self.top and now >= self.probe_at:
            self._set(self.n + 1, now)
            self.probe_at = math.inf if self.n == self.top else now + self.backoff
        elif self.n == self.top and share < self.contended / 3:
            self.backoff = self.probe

    def _set(self, n: int, now: float) -> None:
        self.n = n
        self.set_threads(n)
        self.changes.append((now, n))
