"""Tests of the booster: binning, the histogram split search against brute force, MART's worked
example, the estimator contract, persistence, export and the LightningModule."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from rankkit.boosting import LambdaMART, ObliviousEnsemble, QuantileBinner
from rankkit.kernels import cpu as _cpu_kernel
from rankkit.boosting.engine import valid_codes as _valid_codes
from rankkit.boosting.tree import ObliviousTreeGrower, TreeParams, build_histograms, leaf_of, split_scores
from rankkit.data import load_mq2008, make_synthetic
from rankkit.data.dataset import RankingDataset



@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # The test machines are shared (2 cores): one thread is faster there than two fighting.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def small_set(seed=0, n_queries=30, docs=12, n_features=6) -> RankingDataset:
    return make_synthetic(n_queries, docs, n_features, seed=seed)


# -- binning -----------------------------------------------------------------------------------
def test_binning_codes_agree_with_raw_thresholds():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(500, 4, generator=g)
    x[:, 1] = torch.randint(0, 3, (500,), generator=g).float()  # 3 distinct values
    x[::7, 2] = float("nan")
    x[:, 3] = 5.0  # constant
    binner = QuantileBinner(max_bins=16).fit(x)
    codes = binner.transform(x)
    assert codes.dtype == torch.uint8 and codes.shape == x.shape
    assert int(codes.max()) < 16
    assert binner.used_features_.tolist() == [0, 1, 2]
    assert binner.n_borders_[1] == 2  # each of the 3 values its own bin
    assert bool((codes[::7, 2] == 0).all())  # NaN: the missing bin
    thresholds = binner.thresholds()
    valid = _valid_codes(binner)
    for f in range(3):
        for c in torch.nonzero(valid[f]).view(-1).tolist():
            assert torch.equal(codes[:, f].long() > c, x[:, f] > thresholds[f, c])


# -- MART's worked example (papers/004) ----------------------------------------------------------
def test_pointwise_mart_textbook_example():
    # 17 points: labels 1 x5, 2 x4, 3 x3, 4 x5; one feature separates {1, 2} from {3, 4}.
    y = torch.tensor([1.0] * 5 + [2.0] * 4 + [3.0] * 3 + [4.0] * 5)
    x = (y > 2).float()[:, None]
    model = LambdaMART("pointwise", n_estimators=1, depth=1, learning_rate=1.0, l2=0.0,
                       min_data_in_leaf=1).fit(x, y, group=[17])
    f0 = (5 * 1 + 4 * 2 + 3 * 3 + 5 * 4) / 17  # 42/17 = 2.471
    assert float(model.ensemble_.bias) == pytest.approx(f0, rel=1e-6)
    left = (5 * 1 + 4 * 2) / 9 - f0   # -1.027
    right = (3 * 3 + 5 * 4) / 8 - f0  # +1.154
    assert model.ensemble_.leaf_values[0].tolist() == pytest.approx([left, right], rel=1e-6)
    pred = model.predict(x)
    assert pred[:9].tolist() == pytest.approx([13 / 9] * 9, rel=1e-6)    # F1 = 1.444
    assert pred[9:].tolist() == pytest.approx([29 / 8] * 8, rel=1e-6)    # F1 = 3.625


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


@pytest.fixture(params=["kernel", "torch"])
def histogram_path(request, monkeypatch):
    """Run a test with the compiled CPU histogram kernel and with the torch-ops histograms."""
    if request.param == "torch":
        monkeypatch.setenv("RANKKIT_CPU_KERNEL", "0")
    elif not _cpu_kernel.available():
        pytest.skip("no C compiler: the compiled histogram kernel is unavailable")
    return request.param


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


# -- ranking objectives ----------------------------------------------------------------------------
@pytest.mark.slow
def test_training_ndcg_does_not_fall_over_first_rounds_on_mq2008():
    train, _, _ = load_mq2008(1)
    # Newton steps do not guarantee a monotone metric; over the first rounds it rises (with
    # these settings it first dips, by 1e-4, at round 6).
    model = LambdaMART(n_estimators=5, depth=4, learning_rate=0.1, k=10, eval_metric="ndcg@10")
    model.fit(train, eval_set=[train])
    curve = model.evals_result_["valid_0"]["ndcg@10"]
    assert len(curve) == 5
    assert all(b >= a - 1e-12 for a, b in zip(curve, curve[1:])), curve


@pytest.mark.parametrize("objective,weighting", [("lambdarank", "ndcg"), ("lambdarank", "map"),
                                                 ("lambdarank", "err"), ("ranknet", "ndcg"),
                                                 ("pointwise", "ndcg")])
def test_every_objective_learns(objective, weighting):
    train = small_set(n_queries=40)
    model = LambdaMART(objective, weighting=weighting, n_estimators=15, depth=3, learning_rate=0.3,
                       min_data_in_leaf=5).fit(train, eval_set=[train])
    curve = model.evals_result_["valid_0"]["ndcg@10"]
    assert curve[-1] > curve[0] - 1e-9 and max(curve) > 0.6


def test_early_stopping_keeps_the_best_round():
    train, vali = small_set(0), small_set(1)
    model = LambdaMART(n_estimators=40, depth=4, learning_rate=1.0, min_data_in_leaf=2,
                       early_stopping_rounds=3).fit(train, eval_set=[vali])
    curve = model.evals_result_["valid_0"]["ndcg@10"]
    assert model.best_iteration_ == int(np.argmax(curve))
    assert model.best_score_ == max(curve)
    assert model.ensemble_.n_trees == model.best_iteration_ + 1
    assert len(curve) <= model.best_iteration_ + 1 + 3


def test_constant_shift_of_init_score_shifts_predictions_only():
    train = small_set()
    a = LambdaMART(n_estimators=3, depth=3, min_data_in_leaf=3).fit(train)
    b = LambdaMART(n_estimators=3, depth=3, min_data_in_leaf=3).fit(
        train, init_score=torch.full((train.n_docs,), 5.0))
    pb = b.predict(train, init_score=torch.full((train.n_docs,), 5.0))
    np.testing.assert_allclose(pb, a.predict(train) + 5.0, rtol=1e-6)


def test_uniform_sample_weights_change_nothing_without_l2():
    train = small_set()
    kw = dict(n_estimators=3, depth=3, l2=0.0, min_data_in_leaf=3)
    a = LambdaMART(**kw).fit(train)
    b = LambdaMART(**kw).fit(train.features, train.labels, group=train.sizes,
                             sample_weight=torch.full((train.n_docs,), 3.0))
    np.testing.assert_allclose(a.predict(train), b.predict(train), rtol=1e-5, atol=1e-5)


def test_feature_importance_finds_the_informative_feature():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(600, 4, generator=g)
    y = (x[:, 2] > 0.3).float() + (x[:, 2] > 1.0).float()
    model = LambdaMART(n_estimators=5, depth=2, min_data_in_leaf=5).fit(x, y, group=[20] * 30)
    assert int(np.argmax(model.feature_importance_gain_)) == 2
    assert model.feature_importance_split_.sum() <= 5 * 2
    assert model.feature_importances_.sum() == pytest.approx(1.0)


def test_missing_values_go_left_like_minus_infinity():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(400, 3, generator=g)
    missing = torch.rand(400, generator=g) < 0.3
    x[missing, 0] = float("nan")
    y = missing.float() * 2  # only the missing values are relevant
    model = LambdaMART(n_estimators=3, depth=2, min_data_in_leaf=5).fit(x, y, group=[20] * 20)
    assert model.evals_result_ == {}
    pred = model.predict(x)
    assert float(pred[missing].min()) > float(pred[~missing].max())
    # The exported ensemble sends -inf left as NaN; the estimator refuses it (inf is an error).
    x_inf = x.clone()
    x_inf[missing, 0] = -math.inf
    torch.testing.assert_close(model.ensemble_(x_inf).numpy(), pred)
    with pytest.raises(ValueError, match=r"`X` has to be finite or NaN .* at \[0, 0\]"):
        model.predict(x_inf)


# -- the estimator contract ------------------------------------------------------------------------
def test_sklearn_contract():
    model = LambdaMART(n_estimators=2, depth=2)
    assert clone(model).get_params() == model.get_params()
    assert not hasattr(model, "ensemble_")
    with pytest.raises(NotFittedError):
        model.predict(torch.zeros(3, 6))
    train = small_set()
    assert model.fit(train) is model
    with pytest.raises(ValueError, match="6"):
        model.predict(torch.zeros(3, 5))
    with pytest.raises(ValueError, match="`depth`"):
        LambdaMART(depth=0).fit(train)
    with pytest.raises(ValueError, match="`objective`"):
        LambdaMART("listnet").fit(train)
    with pytest.raises(ValueError, match="contiguous"):
        LambdaMART().fit(torch.zeros(4, 2), torch.zeros(4), qid=[1, 2, 1, 2])


def test_qid_group_and_dataset_inputs_agree():
    train = small_set()
    kw = dict(n_estimators=3, depth=3, min_data_in_leaf=3)
    a = LambdaMART(**kw).fit(train).predict(train)
    qid = torch.repeat_interleave(train.qids, train.sizes)
    b = LambdaMART(**kw).fit(train.features.numpy(), train.labels.numpy(), qid=qid.numpy()).predict(
        train.features.numpy())
    c = LambdaMART(**kw).fit(train.features, train.labels, group=train.sizes.tolist()).predict(train)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(a, c)


def test_same_seed_same_model_with_subsampling():
    train = small_set(n_queries=40)
    kw = dict(n_estimators=5, depth=3, subsample=0.6, colsample=0.5, min_data_in_leaf=3)
    a = LambdaMART(seed=7, **kw).fit(train).ensemble_
    b = LambdaMART(seed=7, **kw).fit(train).ensemble_
    c = LambdaMART(seed=8, **kw).fit(train).ensemble_
    for name in ("features", "thresholds", "leaf_values"):
        assert torch.equal(getattr(a, name), getattr(b, name))
    assert not torch.equal(a.leaf_values, c.leaf_values)


# -- persistence and export ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fitted():
    train = small_set()
    x = train.features.clone()
    x[::5, 1] = float("nan")
    data = RankingDataset(x, train.labels, train.offsets, train.qids)
    return LambdaMART(n_estimators=6, depth=3, min_data_in_leaf=3).fit(data, eval_set=[data]), x


def test_save_load_predict_identical(fitted, tmp_path):
    model, x = fitted
    path = tmp_path / "model.safetensors"
    model.save(path)
    loaded = LambdaMART.load(path)
    np.testing.assert_array_equal(loaded.predict(x), model.predict(x))
    assert loaded.get_params() == model.get_params()
    assert loaded.evals_result_ == model.evals_result_
    assert loaded.best_iteration_ == model.best_iteration_
    np.testing.assert_array_equal(loaded.feature_importance_gain_, model.feature_importance_gain_)
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]  # no temporary left


def test_truncated_or_corrupt_file_gives_clear_error(fitted, tmp_path):
    model, _ = fitted
    path = tmp_path / "model.safetensors"
    model.save(path)
    data = path.read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="not a valid rankkit LambdaMART model"):
        LambdaMART.load(tmp_path / "cut.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 5 + b"not a model")
    with pytest.raises(ValueError, match="not a valid rankkit LambdaMART model"):
        LambdaMART.load(tmp_path / "junk.safetensors")
    with pytest.raises(FileNotFoundError):
        LambdaMART.load(tmp_path / "missing.safetensors")


def test_torchscript_and_torch_export_equal_eager(fitted, tmp_path):
    model, x = fitted
    eager = model.ensemble_(x)
    scripted = torch.jit.script(model.ensemble_)
    path = tmp_path / "model.pt"
    scripted.save(str(path))
    assert torch.equal(torch.jit.load(str(path))(x), eager)
    program = torch.export.export(model.ensemble_, (x,))
    assert torch.equal(program.module()(x), eager)


def test_ensemble_checks_its_buffers_and_input():
    with pytest.raises(ValueError, match="leaf_values"):
        ObliviousEnsemble(3, torch.zeros(2, 2, dtype=torch.long), torch.zeros(2, 2), torch.zeros(2, 3))
    m = ObliviousEnsemble(3, torch.zeros(0, 2, dtype=torch.long), torch.zeros(0, 2), torch.zeros(0, 4), 1.5)
    assert m(torch.zeros(4, 3)).tolist() == [1.5] * 4
    with pytest.raises(ValueError, match="N, 3"):
        m(torch.zeros(4, 2))


# -- Lightning -------------------------------------------------------------------------------------
def test_lambdamart_module_trains_with_trainer_fit(tmp_path):
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint

    from rankkit.boosting import LambdaMARTModule
    from rankkit.training.datamodule import RankingDataModule

    train, vali = small_set(0, n_queries=40), small_set(1, n_queries=20)
    dm = RankingDataModule.from_datasets(train, vali, vali, max_docs=256)
    module = LambdaMARTModule(depth=3, learning_rate=0.3, min_data_in_leaf=3, subsample=0.8,
                              random_strength=0.5)
    checkpoint = ModelCheckpoint(dirpath=tmp_path, monitor="val/ndcg@10", mode="max")
    trainer = pl.Trainer(max_epochs=4, logger=False, enable_progress_bar=True,
                         callbacks=[EarlyStopping("val/ndcg@10", mode="max", patience=10), checkpoint],
                         enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(module, datamodule=dm)
    assert module.scorer.n_trees == 4 and trainer.global_step == 4
    for key in ("val/ndcg@1", "val/ndcg@3", "val/ndcg@5", "val/ndcg@10", "val/map"):
        assert key in trainer.callback_metrics
    restored = LambdaMARTModule.load_from_checkpoint(checkpoint.best_model_path)
    assert restored.scorer.n_trees == int(checkpoint.best_model_path.split("epoch=")[1][0]) + 1
    x = vali.features
    best = restored.scorer.n_trees
    expected = ObliviousEnsemble(x.shape[1], module.scorer.features[:best],
                                 module.scorer.thresholds[:best], module.scorer.leaf_values[:best],
                                 float(module.scorer.bias))(x)
    assert torch.equal(restored(x), expected)


def test_lambdamart_module_random_strength_is_seeded(tmp_path):
    import pytorch_lightning as pl

    from rankkit.boosting import LambdaMARTModule
    from rankkit.training.datamodule import RankingDataModule

    train, vali = small_set(0, n_queries=30), small_set(1, n_queries=10)

    def fit(**kw):
        dm = RankingDataModule.from_datasets(train, vali, vali, max_docs=256)
        module = LambdaMARTModule(depth=3, min_data_in_leaf=3, **kw)
        pl.Trainer(max_epochs=3, logger=False, enable_progress_bar=False,
                   enable_checkpointing=False, enable_model_summary=False,
                   default_root_dir=tmp_path).fit(module, datamodule=dm)
        return module.scorer

    a, b = fit(random_strength=2.0, seed=4), fit(random_strength=2.0, seed=4)
    assert torch.equal(a.features, b.features) and torch.equal(a.leaf_values, b.leaf_values)
    assert not torch.equal(a.features, fit(seed=4).features)
    with pytest.raises(ValueError, match="random_strength"):
        LambdaMARTModule(random_strength=-0.1)


@pytest.mark.parametrize("exact", [True, False])
def test_exact_newton_leaves_are_autograd_newton_steps_of_the_pair_loss(exact):
    # RankNet (|ΔZ| = 1): the loss of the first round as a function of the leaf values γ is
    # C(γ) = Σ_{y_i > y_j} log(1 + exp(−σ(s_i + γ_l(i) − s_j − γ_l(j)))), at s = 0. Its
    # exact Newton step per leaf is −η ∂C/∂γ / (∂²C/∂γ² + λ), computed here by autograd. The
    # diagonal ΣH of Burges' algorithm counts the pairs inside a leaf as well, and differs.
    train = small_set(3, n_queries=6, docs=10, n_features=4)
    lr, l2, sigma = 0.7, 0.5, 1.3
    model = LambdaMART("ranknet", n_estimators=1, depth=2, learning_rate=lr, l2=l2, sigma=sigma,
                       min_data_in_leaf=2, min_sum_hessian=0.0, exact_newton=exact).fit(train)
    e = model.ensemble_  # leaf = Σ_k [x_{f_k} > t_k] 2^k on the raw features
    leaf = sum((train.features[:, int(f)] > t).long() << k
               for k, (f, t) in enumerate(zip(e.features[0], e.thresholds[0])))
    labels = train.labels.double()

    def loss(gamma):
        total = gamma.new_zeros(())
        for q in range(train.n_queries):
            lo, hi = int(train.offsets[q]), int(train.offsets[q + 1])
            y, f = labels[lo:hi], gamma[leaf[lo:hi]]
            better = y[:, None] > y[None, :]
            total = total + torch.nn.functional.softplus(-sigma * (f[:, None] - f[None, :]))[better].sum()
        return total

    gamma = torch.zeros(4, dtype=torch.float64)
    g = torch.autograd.functional.jacobian(loss, gamma)
    h = torch.autograd.functional.hessian(loss, gamma).diagonal()
    expected = -lr * g / (h + l2)
    got = e.leaf_values[0]
    assert int((torch.bincount(leaf, minlength=4) > 0).sum()) >= 3
    if exact:
        torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-7)
    else:
        assert not torch.allclose(got.double(), expected, rtol=1e-3)


@pytest.mark.parametrize("exact_newton", [False, True])
def test_lambdamart_module_grows_the_estimators_trees(tmp_path, exact_newton):
    # Trainer.fit and LambdaMART.fit share the sampler, the round and the seeding of the
    # generator, so with row and feature sampling on they grow the same trees.
    import pytorch_lightning as pl

    from rankkit.boosting import LambdaMARTModule
    from rankkit.training.datamodule import RankingDataModule

    train, vali = small_set(0, n_queries=40), small_set(1, n_queries=10)
    kw = dict(depth=3, learning_rate=0.3, min_data_in_leaf=3, k=5, normalize=True, subsample=0.7,
              colsample=0.5, bagging_temperature=1.0, exact_newton=exact_newton, seed=3)
    module = LambdaMARTModule(**kw)
    pl.Trainer(max_epochs=5, logger=False, enable_progress_bar=False,
               enable_checkpointing=False, enable_model_summary=False,
               default_root_dir=tmp_path).fit(module, datamodule=RankingDataModule.from_datasets(
                   train, vali, vali, max_docs=256))
    estimator = LambdaMART(n_estimators=5, **kw).fit(train).ensemble_
    for name in ("features", "thresholds", "leaf_values"):
        assert torch.equal(getattr(module.scorer, name), getattr(estimator, name)), name
    assert torch.equal(module.scorer(vali.features), estimator(vali.features))


@pytest.mark.parametrize("bad", [dict(learning_rate=0.0), dict(l2=-1.0), dict(subsample=1.5),
                                 dict(colsample=0.0), dict(max_bins=2), dict(min_data_in_leaf=0),
                                 dict(depth=13), dict(k=0), dict(sigma=-1.0), dict(objective="mse"),
                                 dict(bagging_temperature=float("inf")), dict(min_sum_hessian=float("nan")),
                                 dict(exact_newton=1), dict(objective="pointwise", exact_newton=True)])
def test_estimator_and_module_reject_the_same_bad_parameters(bad):
    from rankkit.boosting import LambdaMARTModule

    name = next(iter(bad))
    with pytest.raises(ValueError, match=name):
        LambdaMART(n_estimators=1, **bad).fit(small_set(n_queries=4))
    with pytest.raises(ValueError, match=name):
        LambdaMARTModule(**bad)


# -- CUDA (when a GPU is lent) --------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_grows_the_same_trees_as_cpu():
    train = small_set(n_queries=60)
    kw = dict(n_estimators=5, depth=4, min_data_in_leaf=3)
    cpu = LambdaMART(**kw).fit(train).ensemble_
    gpu = LambdaMART(device="cuda", **kw).fit(train).ensemble_
    assert torch.equal(cpu.features, gpu.features.cpu())
    assert torch.equal(cpu.thresholds, gpu.thresholds.cpu())
    torch.testing.assert_close(cpu.leaf_values, gpu.leaf_values.cpu(), rtol=1e-4, atol=1e-6)


# -- Bayesian bootstrap (bagging_temperature) -------------------------------------------------------
def test_bayesian_bootstrap_weights_per_query():
    from rankkit.boosting.engine import bayesian_bootstrap_weights

    sizes = torch.tensor([3, 1, 4])
    w = bayesian_bootstrap_weights(sizes, 1.0, torch.Generator().manual_seed(0))
    assert w.shape == (8,) and bool((w >= 0).all())
    assert len(set(w[:3].tolist())) == 1 and len(set(w[4:].tolist())) == 1
    ones = bayesian_bootstrap_weights(sizes, 0.0, torch.Generator().manual_seed(0))
    assert torch.equal(ones, torch.ones(8, dtype=torch.float64))
    many = bayesian_bootstrap_weights(torch.ones(20000, dtype=torch.long), 1.0, torch.Generator().manual_seed(1))
    assert abs(float(many.mean()) - 1.0) < 0.05  # Exp(1): mean 1


def test_exact_leaf_hessian_takes_the_round_weights_and_rows():
    # grow_round's exact-Newton leaves: ΣG and the leaf_hessian's ΣH over the sampled rows, both
    # under the same Bayesian bootstrap weights as the tree.
    from rankkit.boosting.engine import bayesian_bootstrap_weights, grow_round

    train = small_set(2, n_queries=12)
    binner = QuantileBinner().fit(train.features)
    codes = binner.transform(train.features)[:, binner.used_features_]
    params = TreeParams(depth=2, learning_rate=0.5, l2=0.3, min_data_in_leaf=2, min_sum_hessian=0.0)
    grower = ObliviousTreeGrower(codes, _valid_codes(binner)[binner.used_features_], params)
    gen = torch.Generator().manual_seed(0)
    grad = torch.randn(train.n_docs, generator=gen, dtype=torch.float64)
    hess = torch.rand(train.n_docs, generator=gen, dtype=torch.float64) + 0.5
    exact = torch.rand(train.n_docs, generator=gen, dtype=torch.float64) * 0.4  # a stand-in ΣH
    rows = torch.arange(train.n_docs)[train.doc_query_index() % 3 != 0]
    tree = grow_round(grower, grad, hess, rows=rows, features=None, sizes=train.sizes,
                      generator=torch.Generator().manual_seed(5), bagging_temperature=1.0,
                      random_strength=0.0, model_length=0.0, leaf_hessian=lambda leaf: exact)
    w = bayesian_bootstrap_weights(train.sizes, 1.0, torch.Generator().manual_seed(5))
    leaf = tree.leaf_index[rows]
    g = torch.zeros(4, dtype=torch.float64).index_add_(0, leaf, (w * grad)[rows])
    h = torch.zeros(4, dtype=torch.float64).index_add_(0, leaf, (w * exact)[rows])
    torch.testing.assert_close(tree.leaf_values, -0.5 * g / (h + 0.3))


def test_bagging_temperature_is_seeded_and_changes_the_trees():
    train = small_set(n_queries=40)
    kw = dict(n_estimators=5, depth=3, min_data_in_leaf=3)
    a = LambdaMART(seed=7, bagging_temperature=1.0, **kw).fit(train).ensemble_
    b = LambdaMART(seed=7, bagging_temperature=1.0, **kw).fit(train).ensemble_
    plain = LambdaMART(seed=7, **kw).fit(train).ensemble_
    assert torch.equal(a.leaf_values, b.leaf_values)
    assert not torch.equal(a.leaf_values, plain.leaf_values)
    with pytest.raises(ValueError, match="bagging_temperature"):
        LambdaMART(bagging_temperature=-1.0).fit(train)


# -- split-score noise (random_strength) ---------------------------------------------------------------
def test_random_strength_is_seeded_and_keeps_noise_free_gains(histogram_path):
    train = small_set(n_queries=40)
    kw = dict(n_estimators=5, depth=3, min_data_in_leaf=3)
    a = LambdaMART(seed=7, random_strength=1.0, **kw).fit(train)
    b = LambdaMART(seed=7, random_strength=1.0, **kw).fit(train)
    c = LambdaMART(seed=8, random_strength=1.0, **kw).fit(train)
    plain = LambdaMART(seed=7, **kw).fit(train)
    assert torch.equal(a.ensemble_.leaf_values, b.ensemble_.leaf_values)
    assert torch.equal(a.ensemble_.features, b.ensemble_.features)
    assert not torch.equal(a.ensemble_.features, plain.ensemble_.features)
    # Another seed, other splits (3 features: the features alone may coincide, the cut points not).
    assert not torch.equal(a.ensemble_.thresholds, c.ensemble_.thresholds)
    with pytest.raises(ValueError, match="random_strength"):
        LambdaMART(random_strength=-1.0).fit(train)


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


# -- every named objective, and Unbiased LambdaMART -------------------------------------------------
def _first_round_leaves(train, leaf, grad, hess, lr, l2):
    g = torch.zeros(int(leaf.max()) + 1, dtype=torch.float64).index_add_(0, leaf, grad.double())
    h = torch.zeros_like(g).index_add_(0, leaf, hess.double())
    return -lr * g / (h + l2)


def _leaf_of_raw(ensemble, x):
    return sum((x[:, int(f)] > t).long() << k for k, (f, t) in enumerate(zip(ensemble.features[0],
                                                                              ensemble.thresholds[0])))


@pytest.mark.parametrize("objective", ["softmax", "xendcg", "listmle", "approx_ndcg", "ndcg_loss2pp", "arp1",
                                       "ranknet"])
def test_every_named_objective_grows_newton_leaves_of_its_gradients(objective):
    # The booster's first tree: leaves −η ΣG / (ΣH + λ) of the registry's (grad, hess) at F_0 = 0.
    from rankkit.losses import objective_gradients

    train = small_set(4, n_queries=12, docs=10, n_features=4)
    lr, l2 = 0.5, 0.3
    model = LambdaMART(objective, n_estimators=1, depth=2, learning_rate=lr, l2=l2, min_data_in_leaf=2,
                       min_sum_hessian=0.0, seed=3).fit(train)
    batch = train.padded()
    options = {"generator": torch.Generator().manual_seed(3)} if objective in ("xendcg", "listmle") else {}
    grad, hess, _ = objective_gradients(objective, torch.zeros(batch.labels.shape), batch.labels,
                                        mask=batch.mask, **options)
    leaf = _leaf_of_raw(model.ensemble_, train.features)
    expected = _first_round_leaves(train, leaf, grad[batch.mask], hess[batch.mask], lr, l2)
    got = model.ensemble_.leaf_values[0][: len(expected)].double()
    used = torch.bincount(leaf, minlength=len(expected)) > 0
    torch.testing.assert_close(got[used], expected[used], rtol=1e-4, atol=1e-6)


def test_unbiased_lambdamart_weighs_pairs_by_the_estimated_propensities():
    # Round 1 by hand: the propensities updated at F_0 = 0 from the click log, then the kernel's
    # pair weights 1/(t+(pos_i) t-(pos_j)), then Newton leaves. The booster must do the same.
    from rankkit.losses import objective_gradients
    from rankkit.unbiased import PropensityEstimator

    g = torch.Generator().manual_seed(0)
    sizes = torch.full((40,), 8)
    x = torch.randn(320, 4, generator=g)
    position = torch.arange(8).repeat(40)
    clicks = (torch.rand(320, generator=g) < 0.6 / (position + 1.0) + 0.2 * (x[:, 0] > 0)).float()
    lr, l2 = 0.5, 0.3
    model = LambdaMART(n_estimators=1, depth=2, learning_rate=lr, l2=l2, min_data_in_leaf=2, min_sum_hessian=0.0,
                       unbiased=True, n_positions=8, bias_p=1.0).fit(x, clicks, group=sizes, position=position)
    est = PropensityEstimator(8, p=1.0)
    zeros, y, pos = torch.zeros(40, 8), clicks.view(40, 8), position.view(40, 8)
    mask = torch.ones(40, 8, dtype=torch.bool)
    est.update(zeros, y, pos, mask)
    np.testing.assert_allclose(model.propensities_["clicked"], est.t_plus.numpy())
    np.testing.assert_allclose(model.propensities_["unclicked"], est.t_minus.numpy())
    assert model.propensities_["clicked"][0] == 1.0 and model.propensities_["clicked"][3] < 1.0
    grad, hess, _ = objective_gradients("ndcg", zeros, y, mask=mask, pair_weights=est.pair_factors(pos, mask))
    leaf = _leaf_of_raw(model.ensemble_, x)
    expected = _first_round_leaves(None, leaf, grad.view(-1), hess.view(-1), lr, l2)
    used = torch.bincount(leaf, minlength=len(expected)) > 0
    torch.testing.assert_close(model.ensemble_.leaf_values[0][: len(expected)].double()[used], expected[used],
                               rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="position"):
        LambdaMART(n_estimators=1, unbiased=True).fit(x, clicks, group=sizes)
    with pytest.raises(ValueError, match="unbiased"):
        LambdaMART("softmax", n_estimators=1, unbiased=True).fit(x, clicks, group=sizes, position=position)
