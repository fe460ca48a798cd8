"""The compiled CPU kernels' seam fuzzed: random shapes, samples, options and query sizes
through every entry point, each result checked against the torch reference.

These tests also run under AddressSanitizer (tests/kernels/test_cpu_asan.py builds the C files with
``-fsanitize=address`` and runs this file and the kernel tests on that build), so an
out-of-bounds read or write anywhere behind the seam fails the suite, not only a wrong number.
"""
from __future__ import annotations

import pytest
import torch

from rankkit.boosting.objectives import QueryLayout, make_objective
from rankkit.objective import objective_spec
from rankkit.boosting.tree import ObliviousTreeGrower, TreeParams
from rankkit.kernels import backends, cpu, torch_ref

needs_cpu = pytest.mark.skipif(not cpu.available(), reason="the compiled CPU kernels are not built")


def _draw(seed: int):
    """A random tree problem: heavy-tailed codes with repeated values, ragged sizes."""
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 600, (1,), generator=g))
    n_feat = int(torch.randint(1, 50, (1,), generator=g))
    top = torch.randint(1, 256, (n_feat,), generator=g)
    codes = (torch.rand(n, n_feat, generator=g).pow(3) * top).long().clamp(max=255).to(torch.uint8)
    valid = torch.rand(n_feat, 256, generator=g) < 0.8
    grad = torch.randn(n, generator=g, dtype=torch.float64)
    hess = torch.rand(n, generator=g, dtype=torch.float64)
    depth = int(torch.randint(1, 8, (1,), generator=g))
    min_data = int(torch.randint(1, 30, (1,), generator=g))
    return g, codes, valid, grad, hess, TreeParams(depth=depth, min_data_in_leaf=min_data,
                                                    quantized_grad=bool(seed % 3 == 0))


@needs_cpu
@pytest.mark.parametrize("seed", range(24))
def test_random_trees_equal_the_reference(seed):
    g, codes, valid, grad, hess, params = _draw(seed)
    n, n_feat = codes.shape
    kw = {}
    if seed % 2:
        rows = torch.randperm(n, generator=g)[: max(1, n // 2)].sort().values
        feats = torch.randperm(n_feat, generator=g)[: max(1, n_feat // 2)].sort().values
        kw = dict(rows=rows, features=feats)
    noise = dict(noise_sd=0.3) if seed % 4 == 1 else {}
    trees = []
    for name in ("cpu", "torch"):
        grower = ObliviousTreeGrower(codes, valid, params, backend=name)
        for _ in range(2):  # the second tree reuses the buffers and the root counts
            tree = grower.grow(grad, hess, generator=torch.Generator().manual_seed(seed), **kw, **noise)
        trees.append(tree)
    fast, slow = trees
    assert torch.equal(fast.features.cpu(), slow.features.cpu()) and torch.equal(fast.codes, slow.codes)
    assert torch.equal(fast.leaf_index, slow.leaf_index)
    torch.testing.assert_close(fast.leaf_values, slow.leaf_values, rtol=0, atol=0)


@needs_cpu
@pytest.mark.parametrize("seed", range(8))
def test_random_eval_updates_equal_the_reference(seed):
    g, codes, _, _, _, params = _draw(seed)
    depth, n_feat = params.depth, codes.shape[1]
    feats = torch.randint(0, n_feat, (depth,), generator=g)
    cuts = torch.randint(0, 256, (depth,), generator=g)
    values = torch.randn(1 << depth, generator=g, dtype=torch.float64)
    start = torch.randn(codes.shape[0], generator=g, dtype=torch.float64)
    got = cpu.add_tree(start.clone(), values, codes.contiguous(), feats, cuts)
    want = start + values[torch_ref.leaf_of(codes.t().contiguous(), feats, cuts)]
    assert torch.equal(got, want)
    # the eval set's round in one call: the same update, then the metric of the updated scores
    sizes = torch.tensor([codes.shape[0]])
    layout = QueryLayout(torch.randint(0, 3, (codes.shape[0],), generator=g).float(), sizes)
    from rankkit.boosting.objectives import flat_ndcg_inputs

    fused = start.clone()
    value = cpu.ndcg_mean(fused, tree=(values, codes.contiguous(), feats, cuts), **flat_ndcg_inputs(layout, 10))
    assert torch.equal(fused, want) and value == cpu.ndcg_mean(want.clone(), **flat_ndcg_inputs(layout, 10))
    with pytest.raises(ValueError, match="feature index"):
        cpu.add_tree(start.clone(), values, codes.contiguous(), feats + n_feat, cuts)


def random_queries(g, *, max_queries, power, longest, grades, step, spread):
    """Long-tailed query sizes (rand^power × longest, at least 1), integer labels below ``grades``
    and scores N(0, 1) × spread rounded to multiples of ``step`` (ties), from generator ``g``."""
    sizes = (torch.rand(int(torch.randint(1, max_queries, (1,), generator=g)), generator=g).pow(power)
             * longest).long() + 1
    n = int(sizes.sum())
    labels = torch.randint(0, grades, (n,), generator=g).float()
    scores = (torch.randn(n, generator=g, dtype=torch.float64) * (spread / step)).round() * step
    return sizes, labels, scores


@needs_cpu
@pytest.mark.parametrize("seed", range(12))
def test_random_query_sizes_take_the_compiled_lambdas(seed):
    g = torch.Generator().manual_seed(100 + seed)
    # Long-tailed sizes, 1 to ~300 documents, as MSLR's (scaled down); many ties.
    sizes, labels, scores = random_queries(g, max_queries=40, power=4, longest=300, grades=5, step=1.0, spread=3)
    layout = QueryLayout(labels, sizes)
    obj = make_objective(objective_spec("lambdarank", weighting="ndcg", k=int(torch.randint(1, 20, (1,), generator=g))),
                         quantized_grad=True)
    fast = obj.gradients(scores, layout, backend=backends.choose("cpu", "cpu"))
    slow = obj.gradients(scores, layout, backend=backends.choose("cpu", "torch"))
    assert torch.equal(fast[0], slow[0]) and torch.equal(fast[1], slow[1])


@needs_cpu
def test_bad_sizes_are_refused_before_the_c_call():
    codes = torch.zeros(10, 3, dtype=torch.uint8)
    valid = torch.ones(3, 256, dtype=torch.bool)
    kernels = cpu.TreeKernels(codes, 2, valid)
    g = torch.zeros(10, dtype=torch.float64)
    params = TreeParams(depth=2)
    with pytest.raises(ValueError, match="rows"):
        kernels.grow(g[:4], g[:4], None, valid, torch.tensor([0, 1, 2, 10]), None, None, params)
    with pytest.raises(ValueError, match="features"):
        kernels.grow(g, g, None, valid[:1], None, torch.tensor([3]), None, params)
    with pytest.raises(ValueError, match="gradients"):
        kernels.grow(g[:9], g[:9], None, valid, None, None, None, params)
    with pytest.raises(ValueError, match="offsets"):
        cpu.lambdas(g, g, torch.tensor([0, 12, 10]), gains=None, cutoff=10, max_len=12)
    with pytest.raises(ValueError, match="offsets"):
        cpu.lambdas(g, g, torch.tensor([0, 5, 10]), gains=None, cutoff=4, max_len=4)


def _ndcg_loop(scores, labels, sizes, k):
    """NDCG@k per query by a plain loop: float32 scores, worst case among ties (lower label
    first), exp gain, a query with nothing relevant scores 1; the mean over queries."""
    import math

    values, start = [], 0
    for n in sizes:
        s = [float(torch.tensor(x, dtype=torch.float32)) for x in scores[start:start + n]]
        y = labels[start:start + n]
        start += n
        ranked = sorted(range(n), key=lambda i: (-s[i], y[i]))
        ideal = sorted(y, reverse=True)
        cut = n if k is None else min(k, n)
        idcg = sum((2 ** ideal[r] - 1) / math.log2(r + 2) for r in range(cut))
        dcg = sum((2 ** y[ranked[r]] - 1) / math.log2(r + 2) for r in range(cut))
        values.append(1.0 if idcg == 0 else dcg / idcg)
    return sum(values) / len(values)


@needs_cpu
@pytest.mark.parametrize("seed", range(10))
def test_compiled_ndcg_equals_a_double_loop_and_the_torch_metric(seed):
    from rankkit.boosting.objectives import flat_ndcg_inputs, make_metric

    g = torch.Generator().manual_seed(300 + seed)
    sizes, labels, scores = random_queries(g, max_queries=30, power=3, longest=120, grades=3, step=0.25, spread=0.5)
    labels[: int(sizes[0])] = 0.0  # a query with nothing relevant
    k = [None, 1, 3, 10][seed % 4]
    layout = QueryLayout(labels, sizes)
    metric = make_metric("ndcg" if k is None else f"ndcg@{k}")
    got = backends.choose("cpu", "cpu").eval_metric(metric, scores, layout)
    again = cpu.ndcg_mean(scores, **flat_ndcg_inputs(layout, k))  # from the last ranking: same value
    want = _ndcg_loop(scores.tolist(), labels.tolist(), sizes.tolist(), k)
    assert abs(got - want) < 1e-12 and got == again
    assert abs(got - float(metric(scores, layout))) < 1e-6  # the torch metric sums in float32
    assert 0.0 < got < 1.0  # the check covers a non-trivial ranking
