"""rankkit.lambdas.blocks: the blocks cover every pair the kernel needs exactly once, stay near their
cap and keep queries of similar length together; a layout's views are the block's documents."""
import math

import pytest
import torch

from rankkit.lambdas.blocks import Layout, plan_blocks


def _long_tailed_lengths(n_queries, seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.exp(torch.rand(n_queries, generator=g) * math.log(400)).long()  # 1 .. 400, long-tailed
    return torch.sort(lengths).values


@pytest.mark.parametrize("cpu", [True, False])
@pytest.mark.parametrize("cutoff, cap", [(10**9, 1 << 14), (10, 1 << 12), (3, 1 << 20), (10**9, 500)])
def test_every_needed_pair_is_in_exactly_one_block(cpu, cutoff, cap):
    lengths = _long_tailed_lengths(60, seed=cap + cutoff % 97)
    covered = {}
    for q0, q1, shortest, (r0, r1), (c0, c1), q_minor in plan_blocks(lengths, cutoff, cap, cpu):
        assert shortest == lengths[q0] and q_minor in (True, False) and (q_minor is False or cpu)
        assert lengths[q1 - 1] / lengths[q0] < math.sqrt(2) + 1e-9 or lengths[q0] == lengths[q1 - 1]
        assert (q1 - q0) * (r1 - r0) * (c1 - c0) <= 4 * cap  # "at most about cap"
        for q in range(q0, q1):
            n = int(lengths[q])
            for a in range(r0, min(r1, n)):
                for b in range(max(c0, a + 1), min(c1, n)):
                    covered[q, a, b] = covered.get((q, a, b), 0) + 1
    needed = {(q, a, b) for q, n in enumerate(lengths.tolist()) for a in range(min(cutoff, n))
              for b in range(a + 1, n)}
    assert set(covered) == needed
    assert set(covered.values()) == {1}


def test_no_blocks_without_pairs():
    assert list(plan_blocks(torch.tensor([0, 1, 1]), 10, 1000)) == []
    assert list(plan_blocks(torch.tensor([], dtype=torch.long), 10, 1000)) == []


@pytest.mark.parametrize("q_minor", [False, True])
def test_a_layouts_views_are_the_blocks_documents(q_minor):
    n_queries, n_docs = 5, 9
    per_query = torch.arange(n_queries * n_docs, dtype=torch.float64).reshape(n_queries, n_docs)
    per_position = 1000 + torch.arange(n_docs, dtype=torch.float64)[None, :]  # a position-only term
    lay = Layout(q_minor, [per_query, per_position], torch.zeros(2, n_queries, n_docs, dtype=torch.float64))
    q0, q1, r0, r1, c0, c1 = 1, 4, 2, 5, 3, 8
    (rows, rows_p), (cols, cols_p) = lay.cut(q0, q1, r0, r1, c0, c1)
    # Broadcast each view to the block's shape and read it back query-major [q, r, c].
    shape = lay.shape(q1 - q0, r1 - r0, c1 - c0)
    back = (lambda t: t.expand(shape).permute(2, 0, 1)) if q_minor else (lambda t: t.expand(shape))
    q, r, c = torch.meshgrid(torch.arange(q0, q1), torch.arange(r0, r1), torch.arange(c0, c1), indexing="ij")
    assert torch.equal(back(rows), per_query[q, r]) and torch.equal(back(cols), per_query[q, c])
    assert torch.equal(back(rows_p), per_position[0, r]) and torch.equal(back(cols_p), per_position[0, c])
    lay.acc_rows(q0, q1, r0, r1).add_(1.0)
    totals = lay.acc.transpose(1, 2) if q_minor else lay.acc
    assert totals[:, q0:q1, r0:r1].eq(1).all() and totals.sum() == 2 * (q1 - q0) * (r1 - r0)
