"""rankkit.boosting.tree: the histogram split search against brute force, histograms against direct
sums, the compiled kernels against torch, split noise."""
from __future__ import annotations

import math

import pytest
import torch

from rankkit.boosting import LambdaMART, QuantileBinner
from rankkit.boosting.engine import valid_codes as _valid_codes
from rankkit.boosting.tree import ObliviousTreeGrower, TreeParams, build_histograms, leaf_of, split_scores
from rankkit.data import make_synthetic
from rankkit.kernels import cpu as _cpu_kernel

pytestmark = pytest.mark.usefixtures("one_thread")  # every test here on one thread


# -- the histogram split search against a brute-force loop -----------------------------------------
def brute_force_tree(x, thresholds, valid, grad, hess, params):
    """Greedy oblivious tree by a loop over every (feature, threshold) on raw features."""
    n = len(grad)
    node = torch.zeros(n, dtype=torch.long)
    chosen = []
    for level in range(params.depth):
        k = 1 << level
        best = (-math.inf, None, None)
        for f in range(x.shape[1]):
            for c in torch.nonzero(valid[f]).view(-1).tolist():
                right = x[:, f] > thresholds[f, c]
                gain, ok = 0.0, True
                for j in range(k):
                    in_node = node == j
                    parts = [in_node & ~right, in_node & right]
                    g_node, h_node = grad[in_node].sum(), hess[in_node].sum()
                    gain -= float(g_node**2 / max(h_node + params.l2, 1e-12))
                    for part in parts:
                        cnt = int(part.sum())
                        g_, h_ = grad[part].sum(), hess[part].sum()
                        if cnt and (cnt < params.min_data_in_leaf or h_ < params.min_sum_hessian):
                            ok = False
                        gain += float(g_**2 / max(h_ + params.l2, 1e-12))
                if ok and gain > best[0] + 1e-9:
                    best = (gain, f, c)
        if best[1] is None or not best[0] > 0:
            break
        chosen.append(best)
        node = node + (x[:, best[1]] > thresholds[best[1], best[2]]).long() * k
    leaves = torch.zeros(1 << params.depth, dtype=torch.float64)
    for j in range(1 << params.depth):
        g_, h_ = grad[node == j].sum(), hess[node == j].sum()
        if h_ + params.l2 >= params.min_sum_hessian:
            leaves[j] = -params.learning_rate * g_ / (h_ + params.l2)
    return chosen, leaves


@pytest.mark.parametrize("min_data", [1, 15])
def test_histogram_split_search_equals_brute_force(min_data, histogram_path):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(400, 5, generator=g)
    x[::9, 3] = float("nan")
    x[:, 4] = torch.randint(0, 4, (400,), generator=g).float()
    grad = torch.randn(400, generator=g, dtype=torch.float64)
    hess = torch.rand(400, generator=g, dtype=torch.float64) + 0.1
    binner = QuantileBinner(max_bins=12).fit(x)
    valid = _valid_codes(binner)
    params = TreeParams(depth=3, learning_rate=0.5, l2=0.7, min_data_in_leaf=min_data)
    tree = ObliviousTreeGrower(binner.transform(x), valid, params).grow(grad, hess)
    chosen, leaves = brute_force_tree(x, binner.thresholds(), valid, grad, hess, params)
    assert len(chosen) == 3
    for level, (gain, f, c) in enumerate(chosen):
        assert (int(tree.features[level]), int(tree.codes[level])) == (f, c)
        assert float(tree.gains[level]) == pytest.approx(gain, rel=1e-9)
    torch.testing.assert_close(tree.leaf_values, leaves)


def test_histograms_match_direct_sums_and_subtraction():
    g = torch.Generator().manual_seed(2)
    codes_t = torch.randint(0, 256, (3, 1000), generator=g, dtype=torch.uint8)
    node = torch.randint(0, 4, (1000,), generator=g)
    grad = torch.randn(1000, generator=g, dtype=torch.float64)
    hess = torch.rand(1000, generator=g, dtype=torch.float64)
    hist = build_histograms(codes_t, node, grad, hess, 4, chunk_rows=300)  # chunks sum up
    f, j, b = 1, 2, int(codes_t[1, 5])
    sel = (codes_t[f] == b) & (node == j)
    assert float(hist[0, f, j, b]) == pytest.approx(float(grad[sel].sum()))
    assert float(hist[1, f, j, b]) == pytest.approx(float(hess[sel].sum()))
    assert float(hist[2, f, j, b]) == int(sel.sum())
    assert torch.allclose(hist[2].sum((-1, -2)), torch.full((3,), 1000.0, dtype=torch.float64))


def test_compiled_histograms_equal_torch_histograms():
    if not _cpu_kernel.available():
        pytest.skip("no C compiler: the compiled histogram kernel is unavailable")
    g = torch.Generator().manual_seed(3)
    codes_t = torch.randint(0, 256, (6, 5000), generator=g, dtype=torch.uint8)
    codes = codes_t.t().contiguous()  # the kernel reads one row per document
    grad = torch.randn(5000, generator=g, dtype=torch.float64)
    hess = torch.rand(5000, generator=g, dtype=torch.float64)
    rows = torch.randperm(5000, generator=g)[:1700].sort().values
    feats = torch.tensor([4, 0, 5])
    node = torch.randint(0, 8, (1700,), generator=g)
    fast = _cpu_kernel.histograms(codes, rows, feats, node, grad[rows], hess[rows], 8)
    slow = build_histograms(codes_t[feats][:, rows].contiguous(), node, grad[rows], hess[rows], 8)
    torch.testing.assert_close(fast, slow, rtol=1e-12, atol=1e-12)
    # A node -> slot map: nodes 1 and 6 to slots 1 and 0, the others left out.
    slot = torch.tensor([-1, 1, -1, -1, -1, -1, 0, -1])
    mapped = _cpu_kernel.histograms(codes, rows, feats, node, grad[rows], hess[rows], 8, slot, 2)
    torch.testing.assert_close(mapped, fast[:, :, [6, 1]], rtol=0, atol=0)
    # The children after a split: the smaller child summed, its sibling parent - child.
    parent_of = node % 4
    parent = _cpu_kernel.histograms(codes, rows, feats, parent_of, grad[rows], hess[rows], 4)
    small_is_right = torch.tensor([True, False, False, True])
    kids = _cpu_kernel.children(codes, rows, feats, node, grad[rows], hess[rows], parent, small_is_right)
    for p in range(4):
        small, large = (p + 4, p) if small_is_right[p] else (p, p + 4)
        torch.testing.assert_close(kids[:, :, small], fast[:, :, small], rtol=0, atol=0)
        torch.testing.assert_close(kids[:, :, large], parent[:, :, p] - fast[:, :, small], rtol=0, atol=0)
    node_all = torch.randint(0, 2, (5000,), generator=g)
    threads = torch.get_num_threads()
    try:
        for n in (1, 2, 3):  # each cell is summed by one thread in document order: same bits
            torch.set_num_threads(n)
            fast = _cpu_kernel.histograms(codes, None, None, node_all, grad, hess, 2)
            torch.testing.assert_close(fast, build_histograms(codes_t, node_all, grad, hess, 2), rtol=0, atol=0)
    finally:
        torch.set_num_threads(threads)


def test_known_root_counts_give_the_same_histograms_and_trees():
    if not _cpu_kernel.available():
        pytest.skip("no C compiler: the compiled histogram kernel is unavailable")
    g = torch.Generator().manual_seed(8)
    codes = torch.randint(0, 30, (2000, 5), generator=g, dtype=torch.uint8)
    grad = torch.randn(2000, generator=g, dtype=torch.float64)
    hess = torch.rand(2000, generator=g, dtype=torch.float64)
    node = torch.zeros(2000, dtype=torch.long)
    full = _cpu_kernel.histograms(codes, None, None, node, grad, hess, 1)
    fast = _cpu_kernel.histograms(codes, None, None, node, grad, hess, 1, counts=full[2].clone())
    assert torch.equal(fast, full)
    # The grower counts the root once and reuses the counts for later trees.
    valid = torch.zeros(5, 256, dtype=torch.bool)
    valid[:, :29] = True
    params = TreeParams(depth=3, min_data_in_leaf=30)
    grower = ObliviousTreeGrower(codes, valid, params)
    grower.grow(grad, hess)
    assert grower.state.root_counts(None, None, False) is not None
    grad2 = torch.randn(2000, generator=g, dtype=torch.float64)
    again = grower.grow(grad2, hess, features=torch.tensor([1, 3, 4]))
    fresh = ObliviousTreeGrower(codes, valid, params).grow(grad2, hess, features=torch.tensor([1, 3, 4]))
    for a, b in zip(again, fresh):
        assert torch.equal(a, b)


def test_compiled_routing_equals_leaf_of():
    if not _cpu_kernel.available():
        pytest.skip("no C compiler: the compiled histogram kernel is unavailable")
    g = torch.Generator().manual_seed(4)
    codes_t = torch.randint(0, 256, (7, 3000), generator=g, dtype=torch.uint8)
    feats, cuts = torch.tensor([3, 0, 6]), torch.tensor([100, 7, 255])
    leaves = _cpu_kernel.route(codes_t.t().contiguous(), None, feats, cuts, torch.tensor([1, 2, 4]),
                                   torch.zeros(3000, dtype=torch.long))
    assert torch.equal(leaves, leaf_of(codes_t, feats, cuts))
    rows = torch.tensor([5, 2999, 0, 5])
    node = torch.full((4,), 10, dtype=torch.long)
    _cpu_kernel.route(codes_t.t().contiguous(), rows, feats[:1], cuts[:1], torch.tensor([8]), node)
    assert torch.equal(node, 10 + 8 * (codes_t[3, rows] > 100).long())


def test_kernel_and_torch_paths_grow_the_same_trees(monkeypatch):
    if not _cpu_kernel.available():
        pytest.skip("no C compiler: the compiled histogram kernel is unavailable")
    train = make_synthetic(60, (5, 30), 8, seed=5)
    kwargs = dict(n_estimators=6, depth=4, subsample=0.7, colsample=0.6, seed=3, min_data_in_leaf=5)
    fast = LambdaMART(**kwargs).fit(train)
    monkeypatch.setenv("RANKKIT_CPU_KERNEL", "0")
    slow = LambdaMART(**kwargs).fit(train)
    for name, a in fast.ensemble_.state_dict().items():
        torch.testing.assert_close(a, slow.ensemble_.state_dict()[name], msg=name)


def test_reduce_hook_grows_the_same_tree(histogram_path):
    # A reduction point other than the identity takes the unfused subtraction path.
    g = torch.Generator().manual_seed(6)
    codes = torch.randint(0, 40, (3000, 5), generator=g, dtype=torch.uint8)
    valid = torch.zeros(5, 256, dtype=torch.bool)
    valid[:, :39] = True
    grad = torch.randn(3000, generator=g, dtype=torch.float64)
    hess = torch.rand(3000, generator=g, dtype=torch.float64)
    params = TreeParams(depth=4, min_data_in_leaf=10)
    rows, feats = torch.arange(0, 3000, 2), torch.tensor([4, 1, 2])
    for kw in ({}, {"rows": rows, "features": feats}):
        a = ObliviousTreeGrower(codes, valid, params).grow(grad, hess, **kw)
        b = ObliviousTreeGrower(codes, valid, params, reduce=lambda t: t.clone()).grow(grad, hess, **kw)
        for x, y in zip(a, b):
            assert torch.equal(x, y)


def test_split_scores_respect_invalid_codes():
    hist = torch.rand(3, 2, 1, 256, dtype=torch.float64)
    valid = torch.zeros(2, 256, dtype=torch.bool)
    valid[1, 7] = True
    scores = split_scores(hist, valid, TreeParams(min_data_in_leaf=0))
    assert torch.isfinite(scores).sum() == 1 and torch.isfinite(scores[1, 7])


@pytest.mark.parametrize("n_nodes", [1, 4, 32])
@pytest.mark.parametrize("min_data, min_hess, l2", [(0, 0.0, 0.0), (20, 1e-3, 1.0), (5, 0.4, 10.0)])
def test_compiled_split_scores_equal_torch_split_scores(n_nodes, min_data, min_hess, l2):
    if not _cpu_kernel.available():
        pytest.skip("no C compiler: the compiled histogram kernel is unavailable")
    g = torch.Generator().manual_seed(n_nodes + min_data)
    hist = torch.rand(3, 9, n_nodes, 256, generator=g, dtype=torch.float64)
    hist[0] -= 0.5
    hist[2] = (hist[2] * 6).floor()
    hist[:, :, :, 200:] = 0  # empty codes and, for l2 = 0, empty children
    hist[1] *= hist[2] > 0
    valid = torch.rand(9, 256, generator=g) > 0.2
    params = TreeParams(l2=l2, min_data_in_leaf=min_data, min_sum_hessian=min_hess)
    want = split_scores(hist, valid, params)
    noise = torch.randn(9, 256, generator=g, dtype=torch.float64)
    got, best, noisy = _cpu_kernel.split_scan(hist, valid, params, noise=noise)
    assert best == int(torch.argmax(want)) and noisy == int(torch.argmax(want + noise))
    allowed = torch.isfinite(want)
    assert 0 < int(allowed.sum()) < allowed.numel()
    assert torch.equal(torch.isfinite(got), allowed) and bool((got[~allowed] == -torch.inf).all())
    torch.testing.assert_close(got[allowed], want[allowed], rtol=1e-12, atol=1e-12)
    assert int(got.argmax()) == int(want.argmax())


def test_split_noise_picks_among_allowed_splits_and_records_true_gain():
    from rankkit.boosting.engine import random_strength_sd

    g = torch.Generator().manual_seed(9)
    codes = torch.randint(0, 8, (500, 4), generator=g, dtype=torch.uint8)
    valid = torch.zeros(4, 256, dtype=torch.bool)
    valid[:, :7] = True
    valid[2] = False  # feature 2 may never split
    grad = torch.randn(500, generator=g, dtype=torch.float64)
    hess = torch.rand(500, generator=g, dtype=torch.float64) + 0.5
    params = TreeParams(depth=2, min_data_in_leaf=1)
    grower = ObliviousTreeGrower(codes, valid, params)
    exact = grower.grow(grad, hess)
    picked = set()
    for seed in range(30):
        tree = grower.grow(grad, hess, noise_sd=1e6, generator=torch.Generator().manual_seed(seed))
        assert 2 not in tree.features.tolist() and bool((tree.codes < 7).all())
        # The recorded gain is the noise-free score of the chosen split.
        hist = build_histograms(codes.t().contiguous(), torch.zeros(500, dtype=torch.long), grad, hess, 1)
        want = split_scores(hist, valid, params)[tree.features[0], tree.codes[0]]
        assert float(tree.gains[0]) == pytest.approx(float(want), rel=1e-9)
        picked.add((int(tree.features[0]), int(tree.codes[0])))
    assert len(picked) > 5  # huge noise: nearly uniform over the 21 allowed splits
    same = grower.grow(grad, hess, noise_sd=1e-300, generator=torch.Generator().manual_seed(0))
    assert torch.equal(same.features, exact.features) and torch.equal(same.codes, exact.codes)
    # The noise scale: strength x sum(g^2)/sum(h), fading once trees x lr passes log(N).
    sd0 = random_strength_sd(grad, hess, 2.0, 0.0)
    assert sd0 == pytest.approx(2.0 * float(grad.square().sum() / hess.sum()) * 500 / 501, rel=1e-12)
    assert random_strength_sd(grad, hess, 2.0, 50.0) < 1e-12 * sd0
