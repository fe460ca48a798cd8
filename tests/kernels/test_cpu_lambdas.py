"""The compiled lambda pass (rankkit/kernels/_lambdas.c through rankkit.kernels.cpu.lambdas).

Checked against an independent float64 double loop (ranking, the pair formula and |ΔNDCG@k|
by swapping two documents and recomputing NDCG@k) and against the torch planned path
(rankkit.lambdas), which stays the reference and the fallback: within 1e-9 relative in
float64, and bit for bit after the booster's rounding to float32 values with ``exact``. The
booster grows the same trees with it as without it.
"""
from __future__ import annotations

import math

import pytest
import torch

from rankkit.boosting import LambdaMART
from rankkit.boosting.objectives import QueryLayout, make_objective
from rankkit.objective import objective_spec
from rankkit.data import make_synthetic
from rankkit.kernels import backends, cpu
from rankkit.lambdas import lambda_gradients
from rankkit.clicks.propensity import FixedPropensities, PropensityEstimator, position_pair_costs

needs_cpu = pytest.mark.skipif(not cpu.available(), reason="the compiled CPU kernels are not built")
pytestmark = needs_cpu


def _loop_reference(scores, labels, sizes, *, weighting, k, sigma, normalize, weights, factors=None,
                    cut_pairs=True, metric_k=None):
    """float64 (grad, hess) [N] by a plain double loop over each query's pairs."""
    grad = [0.0] * len(scores)
    hess = [0.0] * len(scores)
    start = 0
    for n in sizes:
        idx = list(range(start, start + n))
        start += n
        # rank: descending score, equal scores lower label first, then document order
        ranked = sorted(idx, key=lambda i: (-scores[i], labels[i], i))
        pos = {i: p for p, i in enumerate(ranked)}
        cut = n if k is None else k
        metric_cut = cut if metric_k is None else metric_k

        def dcg(order, cut=metric_cut):
            return sum((2.0 ** labels[i] - 1.0) / math.log2(p + 2.0) for p, i in enumerate(order) if p < cut)

        ideal = dcg(sorted(idx, key=lambda i: -labels[i]))
        pairs = []
        for i in idx:
            for j in idx:
                if labels[i] <= labels[j] or (cut_pairs and min(pos[i], pos[j]) >= cut):
                    continue
                if weighting == "ranknet":
                    dz = 1.0
                else:
                    swapped = list(ranked)
                    swapped[pos[i]], swapped[pos[j]] = j, i
                    dz = abs(dcg(swapped) - dcg(ranked)) / ideal if ideal > 0 else 0.0
                rho = 1.0 / (1.0 + math.exp(sigma * (scores[i] - scores[j])))
                pairs.append((i, j, -sigma * dz * rho, sigma * sigma * dz * rho * (1.0 - rho)))
        total = sum(2.0 * abs(lam) for _, _, lam, _ in pairs)
        factor = math.log2(1.0 + total) / total if normalize and total > 0 else 1.0
        for i, j, lam, h in pairs:
            omega = 1.0 if weights is None else 0.5 * (weights[i] + weights[j])
            if factors is not None:  # a click log's pair weight: upper of the higher label, lower of the other
                omega *= factors[0][i] * factors[1][j]
            grad[i] += factor * omega * lam
            grad[j] -= factor * omega * lam
            hess[i] += factor * omega * h
            hess[j] += factor * omega * h
    return torch.tensor(grad, dtype=torch.float64), torch.tensor(hess, dtype=torch.float64)


def _data(seed, sizes, ties=True):
    g = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    labels = torch.randint(0, 4, (n,), generator=g).double()
    scores = torch.randn(n, generator=g, dtype=torch.float64) * 2
    if ties:  # many equal scores, and equal labels among them
        scores = scores.round()
    return scores, labels


def _compiled(scores, labels, sizes, *, weighting, k, sigma=1.0, normalize=False, weights=None, factors=None):
    """The C kernel in float64 throughout (no float32 rounding)."""
    layout = QueryLayout(labels.float(), torch.tensor(sizes), None if weights is None else weights.float())
    n_docs = layout.shape[1]
    cutoff = n_docs if k is None else min(k, n_docs)
    gains = None
    if weighting == "ndcg":
        from rankkit.lambdas.weightings import _ndcg_plan_terms

        padded = layout.pad(labels)
        (g,), _ = _ndcg_plan_terms(padded, layout.mask, cutoff, "exp", None)
        gains = layout.flat(g).contiguous()
    half_w = None if weights is None else (weights.double() * 0.5).contiguous()
    return cpu.lambdas(scores.contiguous(), labels.contiguous(), layout.offsets, gains=gains, cutoff=cutoff,
                       max_len=n_docs, sigma=sigma, normalize=normalize, half_weights=half_w,
                       pair_factors=factors, float32_scores=False, float32_out=False)


SIZES = [1, 5, 8, 3, 12, 2, 7, 1, 4]


@pytest.mark.parametrize("weighting", ["ranknet", "ndcg"])
@pytest.mark.parametrize("k", [None, 1, 3, 50])
@pytest.mark.parametrize("normalize", [False, True])
def test_compiled_lambdas_match_the_double_loop(weighting, k, normalize):
    scores, labels = _data(1, SIZES)
    g = torch.Generator().manual_seed(2)
    weights = torch.rand(len(scores), generator=g, dtype=torch.float64) + 0.1
    factors = tuple(torch.rand(len(scores), generator=g, dtype=torch.float64) * 3 for _ in range(2))
    for w, f in ((None, None), (weights, None), (None, factors), (weights, factors)):
        want = _loop_reference(scores.tolist(), labels.tolist(), SIZES, weighting=weighting, k=k, sigma=1.5,
                               normalize=normalize, weights=None if w is None else w.tolist(),
                               factors=None if f is None else [t.tolist() for t in f])
        got = _compiled(scores, labels, SIZES, weighting=weighting, k=k, sigma=1.5, normalize=normalize, weights=w,
                        factors=f)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
        assert got[1].abs().sum() > 0  # a test that can fail


@pytest.mark.parametrize("weighting", ["ranknet", "ndcg"])
@pytest.mark.parametrize("k", [None, 1, 10])
def test_the_vectorised_pairs_are_the_general_loop_bit_for_bit(weighting, k):
    # Without weights the common case runs a branch-free row loop (pair_row, vectorised); unit
    # weights (omega = 1/2 + 1/2) and unit pair factors send the same pairs through the general
    # loop, where multiplying by 1.0 is exact: the float64 results must be the same bits.
    sizes = [1, 30, 2, 17, 9, 64, 90, 3]
    scores, labels = _data(5, sizes, ties=False)
    ones = torch.ones(len(scores), dtype=torch.float64)
    for normalize in (False, True):
        common = dict(weighting=weighting, k=k, sigma=1.3, normalize=normalize)
        fast = _compiled(scores, labels, sizes, **common)
        for general in (_compiled(scores, labels, sizes, weights=ones, **common),
                        _compiled(scores, labels, sizes, factors=(ones, ones), **common)):
            assert torch.equal(fast[0], general[0]) and torch.equal(fast[1], general[1])
        assert fast[1].abs().sum() > 0


def test_pairs_of_equal_labels_add_nothing_whatever_the_scores():
    # The vectorised rows add a W = 0 pair's exact zeros only for scores within the exponential's
    # span; NaN or infinite scores take the general loop, which skips such pairs: a query whose
    # labels are all equal still gets zeros, and a NaN does not reach its equal-labelled partner.
    for scores, labels in (([float("nan"), 0.5, 0.1], [1.0, 1.0, 1.0]), ([1e308, 1e308, 0.0], [1.0, 1.0, 1.0]),
                           ([float("inf"), 2.0], [0.0, 0.0])):
        for weighting in ("ranknet", "ndcg"):
            grad, hess = _compiled(torch.tensor(scores, dtype=torch.float64), torch.tensor(labels, dtype=torch.float64),
                                   [len(scores)], weighting=weighting, k=None, sigma=4.0)
            assert torch.equal(grad, torch.zeros(len(scores))) and torch.equal(hess, torch.zeros(len(scores)))


def _padded(scores, labels, sizes):
    layout = QueryLayout(labels.float(), torch.tensor(sizes))
    return layout, layout.pad(scores), layout.pad(labels)


@pytest.mark.parametrize("weighting", ["ranknet", "ndcg"])
@pytest.mark.parametrize("k", [None, 1, 4, 1000])
def test_compiled_lambdas_match_the_torch_path_in_float64(weighting, k):
    sizes = [1, 30, 2, 17, 9, 9, 64, 90]  # up to 64 sorted by insertion, longer by qsort
    scores, labels = _data(3, sizes)
    labels[30:32] = 2.0  # a query of two equal labels
    scores[1:31] *= 40.0  # scores spanning more than 64: the pair exponential per pair
    layout, s, y = _padded(scores, labels, sizes)
    for normalize in (False, True):
        want = lambda_gradients(s, y, mask=layout.mask, weighting=weighting, k=k, sigma=0.7, normalize=normalize)
        got = _compiled(scores, labels, sizes, weighting=weighting, k=k, sigma=0.7, normalize=normalize)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, layout.flat(b), rtol=1e-9, atol=1e-13)


def test_single_documents_and_equal_labels_give_zeros():
    sizes = [1, 4, 1, 3]
    scores = torch.tensor([0.3, 1.0, 1.0, -2.0, 0.5, 7.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    labels = torch.tensor([2.0, 1.0, 1.0, 1.0, 1.0, 3.0, 0.0, 2.0, 1.0], dtype=torch.float64)
    for weighting in ("ranknet", "ndcg"):
        grad, hess = _compiled(scores, labels, sizes, weighting=weighting, k=None)
        assert torch.equal(grad[:6], torch.zeros(6)) and torch.equal(hess[:6], torch.zeros(6))
        assert hess[6:].min() > 0  # the last query has pairs


def _objective_pair(monkeypatch, scores, layout, quantized_grad=False, **options):
    obj = make_objective(objective_spec("lambdarank", **options), quantized_grad=quantized_grad)
    assert obj.flat_lambda_inputs(layout) is not None
    fast = obj.gradients(scores, layout, backend=backends.choose("cpu", "cpu"))
    slow = obj.gradients(scores, layout, backend=backends.choose("cpu", "torch"))
    return fast, slow


@pytest.mark.parametrize("weighting", ["ranknet", "ndcg"])
@pytest.mark.parametrize("k", [None, 1, 10])
def test_the_booster_objective_takes_the_compiled_kernel(monkeypatch, weighting, k):
    sizes = [1, 40, 3, 17, 1, 25]
    scores, labels = _data(4, sizes)
    weights = torch.rand(len(scores), generator=torch.Generator().manual_seed(5)) + 0.5
    for w in (None, weights):
        layout = QueryLayout(labels.float(), torch.tensor(sizes), w)
        for normalize in (False, True):
            options = dict(weighting=weighting, k=k, sigma=1.2, normalize=normalize)
            # exact (quantized_grad): float64 on both sides, rounded to float32 values: the same bits
            fast, slow = _objective_pair(monkeypatch, scores, layout, quantized_grad=True, **options)
            assert torch.equal(fast[0], slow[0]) and torch.equal(fast[1], slow[1])
            # float32: the torch path computes in float32; the kernel's float64 result rounded
            fast, slow = _objective_pair(monkeypatch, scores, layout, **options)
            scale = slow[0].abs().max()
            torch.testing.assert_close(fast[0], slow[0], rtol=0, atol=2e-6 * float(scale))
            torch.testing.assert_close(fast[1], slow[1], rtol=0, atol=2e-6 * float(slow[1].abs().max()))
            assert torch.equal(fast[0].float().double(), fast[0])  # float32 values


@pytest.mark.parametrize("estimator", ["fixed", "unbiased"])
def test_click_log_pair_weights_take_the_compiled_kernel(estimator):
    """Unbiased LambdaMART's and inverse propensities' pair weights in the compiled pass give the
    torch path's gradients, and the estimator's per-round update sees the same scores (its pair
    costs summed in C, in the torch path's order: the biases agree to rounding, an ulp apart
    where the two softplus implementations differ)."""
    sizes = [1, 10, 7, 10, 3, 10]
    scores, labels = _data(8, sizes, ties=False)
    clicks = (labels > 1).float()
    positions = torch.cat([torch.arange(n) for n in sizes])
    layout = QueryLayout(clicks, torch.tensor(sizes), None)
    theta = torch.tensor([1.0, 0.7, 0.5, 0.4, 0.3, 0.25, 0.2, 0.18, 0.15, 0.12], dtype=torch.float64)

    def objective(quantized):
        est = FixedPropensities(theta, clip=5.0) if estimator == "fixed" else PropensityEstimator(10, p=1.0)
        return make_objective(objective_spec("lambdarank", weighting="ndcg", k=5), quantized_grad=quantized,
                              propensity=(est, positions)), est

    for quantized in (True, False):
        runs = []
        for name in ("cpu", "torch"):
            obj, est = objective(quantized)
            for _ in range(3):  # the propensities move between rounds
                grad, hess = obj.gradients(scores, layout, backend=backends.choose("cpu", name))
            runs.append((grad, hess, est.t_plus.clone()))
        (fast_g, fast_h, fast_t), (slow_g, slow_h, slow_t) = runs
        torch.testing.assert_close(fast_t, slow_t, rtol=1e-13, atol=0)
        assert estimator == "fixed" or not torch.allclose(fast_t, torch.ones_like(fast_t))
        if quantized:  # float64 on both sides, rounded to float32 values (the float32 factors too): the same bits
            assert torch.equal(fast_g, slow_g) and torch.equal(fast_h, slow_h)
        else:
            torch.testing.assert_close(fast_g, slow_g, rtol=0, atol=2e-6 * float(slow_g.abs().max()))
            torch.testing.assert_close(fast_h, slow_h, rtol=0, atol=2e-6 * float(slow_h.abs().max()))
        plain = make_objective(objective_spec("lambdarank", weighting="ndcg", k=5), quantized_grad=quantized)
        assert not torch.allclose(plain.gradients(scores, layout, backend=backends.choose("cpu", "cpu"))[0], fast_g)


def _loop_position_costs(scores, clicks, sizes, bucket, *, n_positions, k, sigma, ndcg):
    """float64 [P, P] pair costs of Unbiased LambdaMART by a plain loop over each session's
    (clicked, unclicked) pairs: |ΔNDCG@k| of the clicks by swapping the two and recomputing."""
    total = [[0.0] * n_positions for _ in range(n_positions)]
    start = 0
    for n in sizes:
        idx = list(range(start, start + n))
        start += n
        ranked = sorted(idx, key=lambda i: (-scores[i], clicks[i], i))
        cut = n if k is None else k

        def dcg(order, cut=cut):
            return sum(clicks[i] / math.log2(p + 2.0) for p, i in enumerate(order) if p < cut)

        ideal = dcg(sorted(idx, key=lambda i: -clicks[i]))
        for i in idx:
            for j in idx:
                if clicks[i] != 1.0 or clicks[j] != 0.0:
                    continue
                weight = 1.0
                if ndcg:
                    swapped = list(ranked)
                    a, b = ranked.index(i), ranked.index(j)
                    swapped[a], swapped[b] = j, i
                    weight = abs(dcg(swapped) - dcg(ranked)) / ideal if ideal > 0 else 0.0
                total[bucket[i]][bucket[j]] += weight * math.log1p(math.exp(-sigma * (scores[i] - scores[j])))
    return torch.tensor(total, dtype=torch.float64)


@pytest.mark.parametrize("ndcg", [True, False])
@pytest.mark.parametrize("k", [None, 1, 3])
def test_compiled_position_costs_match_the_double_loop_and_the_torch_path(ndcg, k):
    """Unbiased LambdaMART's per-round pair costs (kernels.cpu.position_costs) against a float64
    double loop and rankkit.clicks.propensity.position_pair_costs (the torch path), with tied scores,
    sessions without clicks or with only clicks, positions beyond the last bucket, and both sorts."""
    sizes = [1, 5, 8, 3, 12, 2, 7, 1, 4, 70]
    scores, labels = _data(4, sizes)
    clicks = (labels > 1).double()
    clicks[5:13] = 0.0  # a session without a click
    clicks[13:16] = 1.0  # one with clicks only
    positions = torch.cat([torch.arange(n) for n in sizes])
    bucket = positions.clamp(max=5)
    layout = QueryLayout(clicks.float(), torch.tensor(sizes))
    cutoff = layout.shape[1] if k is None else k
    got = cpu.position_costs(scores, clicks, bucket, layout.offsets, n_positions=6, cutoff=cutoff,
                             max_len=layout.shape[1], sigma=1.5, ndcg=ndcg, float32_scores=False)
    want = _loop_position_costs(scores.tolist(), clicks.tolist(), sizes, bucket.tolist(), n_positions=6, k=k,
                                sigma=1.5, ndcg=ndcg)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-13)
    assert want.sum() > 0 and (want > 0).sum() > 5  # a test that can fail
    torch_path = position_pair_costs(layout.pad(scores), layout.pad(clicks), layout.pad(positions), mask=layout.mask,
                                     n_positions=6, sigma=1.5, weighting="ndcg" if ndcg else "ranknet", k=k)
    torch.testing.assert_close(got, torch_path, rtol=1e-13, atol=0)


def test_compiled_position_costs_rank_float32_scores_and_leave_the_ranking():
    sizes = [6, 70, 3]
    scores, labels = _data(5, sizes, ties=False)
    clicks = (labels > 1).double()
    layout = QueryLayout(clicks.float(), torch.tensor(sizes))
    bucket = torch.cat([torch.arange(n) for n in sizes]).clamp(max=9)
    args = dict(n_positions=10, cutoff=10, max_len=layout.shape[1])
    rounded = cpu.position_costs(scores.float().double(), clicks, bucket, layout.offsets, float32_scores=False, **args)
    order = torch.arange(len(scores))
    got = cpu.position_costs(scores, clicks, bucket, layout.offsets, order=order, **args)
    assert torch.equal(got, rounded)
    lambdas_order = torch.arange(len(scores))  # the lambda pass's ranking of the same scores and labels
    cpu.lambdas(scores, clicks, layout.offsets, gains=None, cutoff=10, max_len=layout.shape[1], order=lambdas_order)
    assert torch.equal(order, lambdas_order)
    with pytest.raises(ValueError, match="bucket"):
        cpu.position_costs(scores, clicks, bucket + 1, layout.offsets, **args)


def test_the_truncated_pass_is_exact():
    """With NDCG@k a pair whose two documents both rank below k has ΔNDCG@k = 0: the pass that
    visits only pairs with a document in the top k equals a double loop over every pair."""
    scores, labels = _data(9, SIZES, ties=False)
    for k in (1, 3, 10):
        every_pair = _loop_reference(scores.tolist(), labels.tolist(), SIZES, weighting="ndcg", k=None, sigma=1.0,
                                     normalize=False, weights=None, cut_pairs=False, metric_k=k)
        got = _compiled(scores, labels, SIZES, weighting="ndcg", k=k)
        for a, b in zip(got, every_pair):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_other_options_fall_back_to_the_torch_path(monkeypatch):
    layout = QueryLayout(torch.tensor([1.0, 0.0, 2.0, 0.0]), torch.tensor([2, 2]))
    for name in ("map", "err", "ndcg_loss2pp"):
        assert make_objective(objective_spec("lambdarank", weighting=name)).flat_lambda_inputs(layout) is None
    assert make_objective(objective_spec("softmax")).flat_lambda_inputs(layout) is None
    # the compiled pass takes RankNet and NDCG, float32 and exact gradients alike
    for obj in (make_objective(objective_spec("lambdarank", weighting="ndcg")),
                make_objective(objective_spec("ranknet"), quantized_grad=True)):
        assert obj.flat_lambda_inputs(layout) is not None
    # RANKKIT_CPU_LAMBDAS=0: the compiled trees, the torch lambda pass (the calls are counted)
    calls = []
    monkeypatch.setattr(cpu, "lambdas", lambda *a, **k: calls.append(1))
    obj, scores = make_objective(objective_spec("ranknet")), torch.zeros(4, dtype=torch.float64)
    monkeypatch.setenv("RANKKIT_CPU_LAMBDAS", "0")
    obj.gradients(scores, layout, backend=backends.choose("cpu", "cpu"))
    assert calls == []
    monkeypatch.setenv("RANKKIT_CPU_LAMBDAS", "1")
    obj.gradients(scores, layout, backend=backends.choose("cpu", "cpu"))
    assert calls == [1]


def test_the_result_does_not_depend_on_the_thread_count():
    sizes = [int(x) for x in torch.randint(1, 60, (80,), generator=torch.Generator().manual_seed(6))]
    scores, labels = _data(7, sizes, ties=False)
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            results.append(_compiled(scores, labels, sizes, weighting="ndcg", k=10, normalize=True))
    finally:
        torch.set_num_threads(before)
    for got in results[1:]:
        assert torch.equal(got[0], results[0][0]) and torch.equal(got[1], results[0][1])


@pytest.mark.parametrize("case", [dict(), dict(k=5, normalize=True), dict(weighting="ranknet")])
def test_the_booster_grows_the_same_trees(monkeypatch, case):
    train = make_synthetic(40, (1, 60), 8, seed=3)
    kwargs = dict(n_estimators=6, depth=4, min_data_in_leaf=5, seed=1, **case)
    # Quantized gradients (exact): the same gradient bits, so the same trees bit for bit.
    fast = LambdaMART(quantized_grad=True, **kwargs).fit(train).ensemble_.state_dict()
    monkeypatch.setenv("RANKKIT_CPU_LAMBDAS", "0")
    slow = LambdaMART(quantized_grad=True, **kwargs).fit(train).ensemble_.state_dict()
    for name, value in slow.items():
        assert torch.equal(fast[name], value), name
    # float32 gradients: the torch path computes them in float32, the compiled pass (the
    # default, RANKKIT_CPU_LAMBDAS unset) in float64 rounded to float32: on a fixture without
    # near-ties the same splits, leaf values equal to float32 rounding.
    slow = LambdaMART(**kwargs).fit(train).ensemble_.state_dict()
    monkeypatch.delenv("RANKKIT_CPU_LAMBDAS")
    fast = LambdaMART(**kwargs).fit(train).ensemble_.state_dict()
    for name, value in slow.items():
        if value.is_floating_point():
            torch.testing.assert_close(fast[name], value, rtol=1e-5, atol=1e-7, msg=name)
        else:
            assert torch.equal(fast[name], value), name


def test_the_start_order_changes_nothing_and_becomes_the_ranking():
    sizes = [3, 70, 1, 12, 40]  # both sorts (insertion up to 64 documents, qsort beyond)
    scores, labels = _data(8, sizes)
    layout = QueryLayout(labels.float(), torch.tensor(sizes))
    args = dict(gains=None, cutoff=layout.shape[1], max_len=layout.shape[1], normalize=True)
    want = cpu.lambdas(scores, labels, layout.offsets, **args)
    g = torch.Generator().manual_seed(9)
    order = torch.cat([int(layout.offsets[q]) + torch.randperm(n, generator=g) for q, n in enumerate(sizes)])
    for _ in range(2):  # a shuffled start, then the ranking the first call left
        got = cpu.lambdas(scores, labels, layout.offsets, order=order, **args)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    for q, n in enumerate(sizes):  # descending float32 score, equal scores lower label first
        seg = order[int(layout.offsets[q]):int(layout.offsets[q]) + n]
        key = [(-float(scores[i].float()), float(labels[i]), int(i)) for i in seg]
        assert key == sorted(key)
    # the objective keeps one such buffer per data set: a second layout's first call equals it
    obj = make_objective(objective_spec("lambdarank", weighting="ndcg", k=5))
    first = obj.gradients(scores, layout)
    obj.gradients(scores.flip(0), layout)
    again = obj.gradients(scores, layout)
    fresh = obj.gradients(scores, QueryLayout(labels.float(), torch.tensor(sizes)))
    assert torch.equal(first[0], again[0]) and torch.equal(again[0], fresh[0]) and torch.equal(again[1], fresh[1])


def test_offsets_are_checked_once_while_unchanged_and_again_once_changed():
    """The booster passes the same offsets every round: the C calls check them on the first
    call and again whenever the tensor changes in place (its version) or is another tensor."""
    scores = torch.randn(7, dtype=torch.float64)
    labels = torch.tensor([2.0, 0.0, 1.0, 1.0, 0.0, 2.0, 0.0], dtype=torch.float64)
    offsets = torch.tensor([0, 3, 7])
    args = dict(gains=None, cutoff=4, max_len=4)
    first = cpu.lambdas(scores, labels, offsets, **args)
    again = cpu.lambdas(scores, labels, offsets, **args)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    offsets[1] = -2  # changed in place: checked again, and refused
    with pytest.raises(ValueError, match="offsets"):
        cpu.lambdas(scores, labels, offsets, **args)
    with pytest.raises(ValueError, match="offsets"):
        cpu.ndcg_mean(scores, labels, torch.ones(7, dtype=torch.float64), offsets, cutoff=4, max_len=4)
    good = torch.tensor([0, 3, 7])
    cpu.lambdas(scores, labels, good, **args)
    with pytest.raises(ValueError, match="offsets"):  # checked before, now with a shorter max_len
        cpu.lambdas(scores, labels, good, gains=None, cutoff=3, max_len=3)
