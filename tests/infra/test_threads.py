"""rankkit.infra.threads: n_jobs as scikit-learn spells it, set for one block and restored."""
import os

import pytest
import torch

from rankkit.infra.threads import ThreadGovernor, available_cores, resolve_n_jobs, schedstat, threads, tick


def test_n_jobs_follows_scikit_learns_rule():
    cores = available_cores()
    assert resolve_n_jobs(None) is None
    assert resolve_n_jobs(3) == 3
    assert resolve_n_jobs(-1) == cores
    assert resolve_n_jobs(-2) == max(1, cores - 1)
    assert resolve_n_jobs(-10_000) == 1
    if hasattr(os, "sched_getaffinity"):
        assert cores == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("bad", [0, 1.5, "2", True])
def test_a_bad_n_jobs_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="`n_jobs`"):
        resolve_n_jobs(bad)


def test_threads_sets_the_count_for_the_block_and_restores_it():
    before = torch.get_num_threads()
    other = 1 if before != 1 else 2
    with threads(other):
        assert torch.get_num_threads() == other
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), threads(other):
        raise RuntimeError("a failing block restores the count too")
    assert torch.get_num_threads() == before
    with threads(None):
        assert torch.get_num_threads() == before


class Machine:
    """A fake clock and schedstat: each look advances the clock by ``step`` seconds, during which
    the process's threads ran ``run`` and waited ``wait`` (a share of that time)."""

    def __init__(self, step=0.5):
        self.now, self.step, self.ran, self.waited, self.busy = 0.0, step, 0, 0, False

    def clock(self):
        self.now += self.step
        return self.now

    def read(self):
        share = 0.5 if self.busy else 0.01
        self.ran += int(1e9 * (1 - share))
        self.waited += int(1e9 * share)
        return self.ran, self.waited


def governor(machine, top=4, **kw):
    counts = []
    g = ThreadGovernor(top=top, clock=machine.clock, read=machine.read, set_threads=counts.append, **kw)
    return g, counts


def test_the_governor_gives_threads_up_while_busy_and_tries_them_back_with_a_growing_back_off():
    m = Machine()
    g, counts = governor(m, probe=2.0)
    for _ in range(10):  # quiet: nothing changes
        g.tick()
    assert counts == [] and g.n == 4
    m.busy = True
    for _ in range(3):
        g.tick()
    assert counts == [3, 2, 1]  # one thread per look, down to 1 ...
    for _ in range(5):
        g.tick()
    assert g.n == 1  # ... and never below
    m.busy = False
    times = []
    while g.n < 4:
        g.tick()
        times.append(m.now)
    assert counts[3:] == [2, 3, 4]
    # Each thread tried back while the machine is still busy is given up again at the next look,
    # and the next try waits twice as long: 1, 2, 4, 8 s.
    m = Machine(step=0.25)
    g, counts = governor(m, top=2, probe=1.0)
    m.busy = True
    g.tick()
    ups = []
    while len(ups) < 4:
        g.tick()
        if counts[-1] == 2:
            ups.append(m.now)
    gaps = [b - a for a, b in zip(ups, ups[1:])]
    assert [round(x) for x in gaps] == [2, 4, 8] and set(counts) == {1, 2}
    m.busy = False  # calm at the full count: the back-off is forgotten
    for _ in range(3):
        g.tick()
    assert g.n == 2 and g.backoff == 1.0


def test_without_schedstat_or_with_one_thread_the_governor_does_nothing():
    m = Machine()
    g, counts = governor(m, top=4)
    g.read = lambda: None
    for _ in range(5):
        g.tick()
    g, counts2 = governor(m, top=1)
    m.busy = True
    for _ in range(5):
        g.tick()
    assert counts == counts2 == []


def test_only_the_default_n_jobs_is_governed_and_the_count_is_restored(monkeypatch):
    import rankkit.infra.threads as T

    before = torch.get_num_threads()
    seen = []
    monkeypatch.setattr(T.ThreadGovernor, "tick", lambda self: (seen.append(self), torch.set_num_threads(1)))
    with threads(1):
        tick()
    assert seen == []  # an explicit n_jobs is kept
    torch.set_num_threads(2)
    try:
        with threads(None):
            tick()
            assert torch.get_num_threads() == 1
        assert len(seen) == 1 and torch.get_num_threads() == 2  # restored
        tick()
        assert len(seen) == 1  # outside a block: nothing
    finally:
        torch.set_num_threads(before)


def test_a_fit_whose_threads_change_every_round_grows_the_same_model():
    # The kernels give each document to the same thread whatever the count: the governor's
    # choice cannot change the model.
    import rankkit.infra.threads as T
    from rankkit.boosting import LambdaMART
    from rankkit.data import make_synthetic

    data = make_synthetic(60, (2, 40), 12, seed=3)
    kw = dict(n_estimators=6, depth=4, min_data_in_leaf=3)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        fixed = LambdaMART(n_jobs=2, **kw).fit(data)
        counts = []

        def flip(self):
            counts.append(1 + len(counts) % 2)
            torch.set_num_threads(counts[-1])

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(T.ThreadGovernor, "tick", flip)
            varied = LambdaMART(**kw).fit(data)
    finally:
        torch.set_num_threads(before)
    assert counts == [1, 2, 1, 2, 1, 2]
    for a, b in ((fixed.ensemble_.features, varied.ensemble_.features),
                 (fixed.ensemble_.thresholds, varied.ensemble_.thresholds),
                 (fixed.ensemble_.leaf_values, varied.ensemble_.leaf_values)):
        assert torch.equal(a, b)


def test_schedstat_reads_this_process():
    got = schedstat()
    if got is None:
        pytest.skip("no /proc/self/task/*/schedstat here")
    sum(range(200_000))
    later = schedstat()
    assert later[0] >= got[0] > 0 and later[1] >= got[1] >= 0
