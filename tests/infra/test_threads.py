"""rankkit.infra.threads: n_jobs as scikit-learn spells it, set for one block and restored."""
import os

import pytest
import torch

from rankkit.infra.threads import available_cores, resolve_n_jobs, threads


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
