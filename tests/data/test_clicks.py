"""Click simulation (rankkit.data.clicks) and Unbiased LambdaMART's biases (rankkit.unbiased).

Click rates are checked against each model's closed form within 4.5 binomial standard errors
of the summed clicks; the position-bucketed pair costs, the bias update, the pair factors and
the debiased loss against float64 loops written here independently.
"""
from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch

from rankkit.data import PaddedBatch, RankingDataset, concat, make_synthetic, pad
from rankkit.training.clicks import production_ranker, production_scores
from rankkit.data.clicks import (
    CascadeModel,
    PositionBasedModel,
    shown_lists,
    simulate_clicks,
)
from rankkit.unbiased import (
    PropensityEstimator,
    debiased_pair_loss,
    pair_costs,
    position_pair_costs,
    propensity_step,
)

Z = 4.5  # standard errors allowed between an empirical click count and its expectation


@pytest.fixture(scope="module")
def graded():
    return make_synthetic(400, (3, 15), 4, seed=0)


def rho(y, eps_plus, eps_minus, y_max):
    return eps_minus + (eps_plus - eps_minus) * (2.0 ** y - 1) / (2.0 ** y_max - 1)


def check_rates(log, expected_rate, k):
    """Empirical clicks per position against Σ expected rates, within Z binomial SEs."""
    for r in range(k):
        at = log.position == r
        p = expected_rate[at]
        observed = float(log.clicks[at].sum())
        se = math.sqrt(float((p * (1 - p)).sum()))
        assert abs(observed - float(p.sum())) <= Z * se + 1e-9, (r, observed, float(p.sum()), se)


# -- the simulator -------------------------------------------------------------------------------
def test_log_layout(graded):
    scores = torch.randn(graded.n_docs, generator=torch.Generator().manual_seed(0))
    log = simulate_clicks(graded, scores, sessions_per_query=3, k=5, seed=1)
    sizes = graded.sizes.clamp(max=5)
    assert log.n_sessions == 3 * graded.n_queries
    assert torch.equal(log.session_query, torch.arange(graded.n_queries).repeat_interleave(3))
    assert torch.equal(log.sessions.sizes, sizes.repeat_interleave(3))
    assert torch.equal(log.sessions.features, graded.features[log.doc_index])
    # each session shows its query's documents by descending score, positions 0..n-1
    for s in range(0, log.n_sessions, 97):
        lo, hi = int(log.sessions.offsets[s]), int(log.sessions.offsets[s + 1])
        q = int(log.session_query[s])
        a, b = int(graded.offsets[q]), int(graded.offsets[q + 1])
        top = (torch.argsort(scores[a:b], descending=True, stable=True)[: hi - lo] + a)
        assert torch.equal(log.doc_index[lo:hi], top)
        assert log.position[lo:hi].tolist() == list(range(hi - lo))
    batch, positions = log.padded(torch.tensor([0, 5]))
    assert torch.equal(positions[batch.mask], torch.cat([torch.arange(int(sizes[0])), torch.arange(int(sizes[1]))]))
    counts = log.aggregate()
    assert int(counts.impressions.sum()) == log.sessions.n_docs
    assert int(counts.clicks.sum()) == int(log.clicks.sum())
    assert torch.equal(counts.query_index, graded.doc_query_index()[counts.doc_index])
    again = simulate_clicks(graded, scores, sessions_per_query=3, k=5, seed=1)
    assert torch.equal(again.clicks, log.clicks)
    kept = simulate_clicks(graded, scores, sessions_per_query=3, k=5, seed=1, drop_unclicked=True)
    per_session = torch.segment_reduce(kept.clicks, "max", lengths=kept.sessions.sizes)
    assert bool((per_session == 1).all()) and kept.n_sessions < log.n_sessions


@pytest.mark.parametrize("eta", [0.5, 1.0, 2.0])
def test_pbm_click_rates(graded, eta):
    model = PositionBasedModel(eta=eta, epsilon_plus=0.9, epsilon_minus=0.1, max_label=4)
    scores = torch.randn(graded.n_docs, generator=torch.Generator().manual_seed(2))
    log = simulate_clicks(graded, scores, model=model, sessions_per_query=200, k=10, seed=3)
    y = graded.labels[log.doc_index].double()
    expected = (1.0 / (log.position + 1.0)) ** eta * rho(y, 0.9, 0.1, 4)
    check_rates(log, expected, 10)
    # the model's own closed form agrees with the arithmetic above
    docs, shown = shown_lists(graded, scores, 10)
    closed = model.click_rates(model.relevance(graded.labels[docs], 4).masked_fill(~shown, 0))
    assert torch.allclose(closed[shown], (1.0 / (torch.arange(docs.shape[1]) + 1.0) ** eta
                                          * rho(graded.labels[docs].double(), 0.9, 0.1, 4))[shown])


@pytest.mark.parametrize("stop", [1.0, 0.5])
def test_cascade_click_rates(graded, stop):
    model = CascadeModel(stop=stop, epsilon_minus=0.05, max_label=4)
    scores = torch.randn(graded.n_docs, generator=torch.Generator().manual_seed(4))
    log = simulate_clicks(graded, scores, model=model, sessions_per_query=200, k=8, seed=5)
    # closed form per query list: ρ_r Π_{r'<r} (1 − stop ρ_r'), written as a loop
    docs, shown = shown_lists(graded, scores, 8)
    rate_of_slot = torch.zeros(docs.shape, dtype=torch.float64)
    for q in range(docs.shape[0]):
        reach = 1.0
        for r in range(int(shown[q].sum())):
            p = rho(float(graded.labels[docs[q, r]]), 1.0, 0.05, 4)
            rate_of_slot[q, r] = p * reach
            reach *= 1.0 - stop * p
    expected = rate_of_slot[log.session_query[log.sessions.doc_query_index()], log.position]
    check_rates(log, expected, 8)
    if stop == 1.0:
        per_session = torch.segment_reduce(log.clicks, "sum", lengths=log.sessions.sizes)
        assert float(per_session.max()) == 1.0  # the classic cascade clicks at most once


def test_production_ranker(graded):
    ranker = production_ranker(graded, fraction=0.05, n_estimators=5, depth=3, min_data_in_leaf=5)
    scores = production_scores(ranker, graded)
    assert scores.shape == (graded.n_docs,) and scores.dtype == torch.float32
    assert bool(torch.isfinite(scores).all()) and float(scores.std()) > 0
    log = simulate_clicks(graded, scores, sessions_per_query=2)
    assert log.n_sessions == 2 * graded.n_queries


# -- propensity estimation -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def randomized_log():
    """PBM η = 1 clicks on lists shown in random order (documents exchangeable across positions)."""
    data = make_synthetic(2000, 10, 3, seed=0)
    scores = torch.rand(data.n_docs, generator=torch.Generator().manual_seed(0))
    log = simulate_clicks(data, scores, model=PositionBasedModel(eta=1.0, max_label=4),
                          sessions_per_query=25, k=10, seed=0)
    batch, positions = log.padded()
    truth, _ = pad(data.labels[log.doc_index], log.sessions.sizes)
    return truth, batch.labels, positions, batch.mask


def test_propensity_recovery(randomized_log):
    # Scores fixed to the true labels, biases iterated to the fixed point with p = 0. With the
    # shown order random, C[a, b] factorises as θ_a w_b and t⁺_r / t⁺_0 = θ_r / θ_0 = 1 / (r + 1).
    scores, clicks, positions, mask = randomized_log
    est = PropensityEstimator(10, p=0.0, weighting="ranknet")
    est.update(scores, clicks, positions, mask, iterations=100)
    ratio = est.t_plus / est.t_plus[0]
    true = 1.0 / torch.arange(1, 11, dtype=torch.float64)
    assert torch.all((ratio[:6] / true[:6] - 1).abs() < 0.10), ratio
    # p = 1 (the authors' default) shrinks the estimate towards 1
    est_p1 = PropensityEstimator(10, p=1.0, weighting="ranknet").update(scores, clicks, positions, mask,
                                                                        iterations=100)
    assert bool(((ratio[1:] < est_p1.t_plus[1:]) & (est_p1.t_plus[1:] < 1)).all())
    # the paper's |ΔNDCG| weighting: same ordering, biased a few per cent low (see the report)
    ndcg = PropensityEstimator(10, p=0.0).update(scores, clicks, positions, mask, iterations=100).t_plus
    assert bool((ndcg[1:] < ndcg[:-1]).all()) and torch.all((ndcg[:4] / true[:4] - 1).abs() < 0.2)


def reference_position_costs(scores, clicks, positions, mask, n_positions, sigma, k):
    """float64 per-session double loop: |ΔNDCG@k| on clicks, ranks by descending score."""
    out = np.zeros((n_positions, n_positions))
    for q in range(scores.shape[0]):
        idx = [i for i in range(scores.shape[1]) if mask[q, i]]
        s = {i: float(scores[q, i]) for i in idx}
        order = sorted(idx, key=lambda i: -s[i])
        rank = {i: r for r, i in enumerate(order)}
        disc = {i: (1 / math.log2(rank[i] + 2) if k is None or rank[i] < k else 0.0) for i in idx}
        n_clicked = sum(int(clicks[q, i]) for i in idx)
        top = n_clicked if k is None else min(n_clicked, k)
        idcg = sum(1 / math.log2(t + 2) for t in range(top))
        for i in idx:
            for j in idx:
                if clicks[q, i] == 1 and clicks[q, j] == 0:
                    delta = abs(disc[i] - disc[j]) / idcg
                    cost = delta * math.log(1 + math.exp(-sigma * (s[i] - s[j])))
                    a = min(int(positions[q, i]), n_positions - 1)
                    b = min(int(positions[q, j]), n_positions - 1)
                    out[a, b] += cost
    return torch.from_numpy(out)


@pytest.mark.parametrize("k", [None, 3])
def test_position_pair_costs_against_loop(k):
    g = torch.Generator().manual_seed(7)
    scores = torch.randn(6, 7, generator=g)
    clicks = (torch.rand(6, 7, generator=g) < 0.4).float()
    mask = torch.arange(7) < torch.tensor([7, 5, 1, 6, 3, 7])[:, None]
    positions = torch.randperm(7, generator=g).repeat(6, 1)
    got = position_pair_costs(scores, clicks, positions, mask=mask, n_positions=5, sigma=1.5, k=k)
    want = reference_position_costs(scores, clicks, positions, mask, 5, 1.5, k)
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-9)
    # the clicked/unclicked pairs alone give the dense [Q, L, L] costs' sums to the bit
    dense = pair_costs(scores.double(), clicks, mask=mask, sigma=1.5, k=k)
    bucket = positions.clamp(max=4)
    key = (bucket[:, :, None] * 5 + bucket[:, None, :]).reshape(-1)
    binned = torch.zeros(25, dtype=torch.float64).index_add_(0, key, dense.reshape(-1))
    assert torch.equal(got, binned.view(5, 5))


def test_propensity_step_and_factors():
    g = torch.Generator().manual_seed(8)
    costs = torch.rand(4, 4, generator=g, dtype=torch.float64)
    costs[2] = 0.0  # nobody clicked at position 2: its click bias stays
    t_plus = torch.tensor([1.0, 0.7, 0.4, 0.3], dtype=torch.float64)
    t_minus = torch.tensor([1.0, 1.1, 1.3, 0.9], dtype=torch.float64)
    new_plus, new_minus = propensity_step(costs, t_plus, t_minus, p=2.0)
    for a in range(4):
        mass = sum(costs[a, b] / t_minus[b] for b in range(4))
        base = sum(costs[0, b] / t_minus[b] for b in range(4))
        assert math.isclose(new_plus[a], (mass / base) ** (1 / 3) if mass > 0 else t_plus[a], rel_tol=1e-12)
        mass = sum(costs[b, a] / t_plus[b] for b in range(4))
        base = sum(costs[b, 0] / t_plus[b] for b in range(4))
        assert math.isclose(new_minus[a], (mass / base) ** (1 / 3), rel_tol=1e-12)

    est = PropensityEstimator(4)
    est.t_plus, est.t_minus = new_plus, new_minus
    positions = torch.tensor([[0, 1, 2, 3, 9], [3, 2, 1, 0, 0]])
    mask = torch.tensor([[True] * 5, [True] * 4 + [False]])
    upper, lower = est.pair_factors(positions, mask, dtype=torch.float64)
    clicks = torch.tensor([[1, 0, 1, 0, 0], [0, 1, 0, 1, 0]]).float()
    scores = torch.randn(2, 5, generator=g, dtype=torch.float64, requires_grad=True)
    loss = debiased_pair_loss(scores, clicks, upper=upper, lower=lower, mask=mask, sigma=0.8)
    full = pair_costs(scores.detach(), clicks, mask=mask, sigma=0.8)
    for q in range(2):
        want = 0.0
        for i in range(5):
            for j in range(5):
                if not (mask[q, i] and mask[q, j] and clicks[q, i] == 1 and clicks[q, j] == 0):
                    continue
                w = 1 / (float(new_plus[min(int(positions[q, i]), 3)]) * float(new_minus[min(int(positions[q, j]), 3)]))
                assert math.isclose(float(upper[q, i] * lower[q, j]), w, rel_tol=1e-12)
                want += w * float(full[q, i, j])
        assert math.isclose(float(loss[q].detach()), want, rel_tol=1e-12)
    assert float(upper[1, 4]) == 0.0 and float(lower[1, 4]) == 0.0  # padding
    loss.sum().backward()
    assert torch.allclose(scores.grad.sum(1), torch.zeros(2, dtype=torch.float64), atol=1e-12)
    # clipping: each inverse bias is min(1/t, clip), element by element
    clipped = PropensityEstimator(4, clip=1.5)
    clipped.t_plus, clipped.t_minus = new_plus, new_minus
    c_upper, c_lower = clipped.pair_factors(positions, mask, dtype=torch.float64)
    for q in range(2):
        for i in range(5):
            if mask[q, i]:
                b = min(int(positions[q, i]), 3)
                assert float(c_upper[q, i]) == min(1 / float(new_plus[b]), 1.5)
                assert float(c_lower[q, i]) == min(1 / float(new_minus[b]), 1.5)
    assert float(c_upper.max()) == 1.5 < float(upper.max())  # the bound binds here
    with pytest.raises(ValueError, match="`clip`"):
        PropensityEstimator(4, clip=0.5)


def test_kernel_pair_weights_match_explicit_loss():
    from rankkit.lambdas import lambda_gradients

    if "pair_weights" not in inspect.signature(lambda_gradients).parameters:
        pytest.skip("the lambda kernel has no `pair_weights` yet")
    g = torch.Generator().manual_seed(9)
    scores = torch.randn(3, 6, generator=g, dtype=torch.float64, requires_grad=True)
    clicks = (torch.rand(3, 6, generator=g) < 0.4).double()
    positions = torch.arange(6).repeat(3, 1)
    est = PropensityEstimator(6)
    est.t_plus = 1.0 / torch.arange(1, 7, dtype=torch.float64)
    est.t_minus = torch.linspace(1.0, 0.6, 6, dtype=torch.float64)
    upper, lower = est.pair_factors(positions, dtype=torch.float64)
    loss = debiased_pair_loss(scores, clicks, upper=upper, lower=lower)
    loss.sum().backward()
    grad, _, kernel_loss = lambda_gradients(scores.detach(), clicks, weighting="ndcg",
                                            pair_weights=(upper, lower), return_loss=True)
    assert torch.allclose(kernel_loss, loss.detach(), rtol=1e-9)
    assert torch.allclose(grad, scores.grad, rtol=1e-9, atol=1e-12)


# -- positions as data ---------------------------------------------------------------------------
def test_positions_travel_with_the_dataset(graded, tmp_path):
    log = simulate_clicks(graded, torch.zeros(graded.n_docs), sessions_per_query=2, k=4, seed=0)
    sessions = log.sessions
    starts = sessions.offsets[:-1].repeat_interleave(sessions.sizes)
    assert torch.equal(sessions.position, torch.arange(sessions.n_docs) - starts)  # displayed order
    picked = torch.tensor([5, 0, 3])
    sub = sessions.subset(picked)
    assert torch.equal(sub.position, torch.cat([sessions.position[sessions.offsets[q]:sessions.offsets[q + 1]]
                                                for q in picked.tolist()]))
    batch = sessions.padded(picked)
    assert batch.position.dtype == torch.int64
    assert torch.equal(batch.position[batch.mask], sub.position)
    assert not batch.position[~batch.mask].any()  # zero on padding
    sessions.save(tmp_path / "log.npz")
    assert torch.equal(RankingDataset.load(tmp_path / "log.npz").position, sessions.position)
    both = concat([sub, sub])
    assert torch.equal(both.position, torch.cat([sub.position, sub.position]))
    assert concat([sub, graded.subset([0])]).position is None  # kept only when every part has them
    assert graded.padded([0]).position is None


def test_padded_batch_without_positions():
    features, labels, mask = torch.zeros(1, 2, 3), torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool)
    batch = PaddedBatch(features, labels, mask).to("cpu")
    assert batch.query_index is None and batch.position is None
    assert torch.equal(batch.features, features)


def test_position_sidecar(tmp_path):
    from rankkit.data import read_svmlight

    data = tmp_path / "log.txt"
    data.write_text("1 qid:1 1:0.5\n0 qid:1 1:0.1\n0 qid:2 1:0.3\n")
    (tmp_path / "log.position").write_text("0\n1\n0\n")
    log = read_svmlight(data, position_file=tmp_path / "log.position")
    assert log.position.tolist() == [0, 1, 0]
    assert read_svmlight(data).position is None  # never looked up implicitly
    (tmp_path / "bad.position").write_text("0\n-1\n0\n")
    with pytest.raises(ValueError, match=r"bad.position:2: position must be non-negative, got -1"):
        read_svmlight(data, position_file=tmp_path / "bad.position")
    (tmp_path / "short.position").write_text("0\n1\n")
    with pytest.raises(ValueError, match=r"short.position: 2 positions, but .* holds 3 documents"):
        read_svmlight(data, position_file=tmp_path / "short.position")


def test_bad_positions():
    args = (torch.zeros(3, 1), torch.zeros(3), [0, 3], [0])
    with pytest.raises(ValueError, match=r"`position` has to be a non-negative integer, got -2 at \[1\]"):
        RankingDataset(*args, position=torch.tensor([0, -2, 1]))
    with pytest.raises(ValueError, match=r"`position` has to be a int tensor of shape \(3,\)"):
        RankingDataset(*args, position=torch.tensor([0.0, 1.0, 2.0]))
    with pytest.raises(ValueError, match=r"`position` has to be a int tensor of shape \(3,\)"):
        RankingDataset(*args, position=torch.tensor([0, 1]))


# -- bad input -----------------------------------------------------------------------------------
def test_bad_input(graded):
    scores = torch.zeros(graded.n_docs)
    est = PropensityEstimator()
    zeros, long = torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.long)
    nan_scores = torch.full((graded.n_docs,), math.nan)
    cases = [
        (lambda: simulate_clicks(graded, torch.zeros(3)), "`scores`"),
        (lambda: simulate_clicks(graded, nan_scores), r"`scores` has to be finite, got nan at \[0\]"),
        (lambda: simulate_clicks(graded, scores, sessions_per_query=0), "`sessions_per_query`"),
        (lambda: simulate_clicks(graded, scores, k=0), "`k`"),
        (lambda: simulate_clicks(graded, scores, model="pbm"), "`model`"),
        (lambda: simulate_clicks(graded, scores, model=PositionBasedModel(max_label=1)),
         r"`labels` has to be in 0\.\.1"),
        (lambda: PositionBasedModel(eta=-1.0), "`eta`"),
        (lambda: PositionBasedModel(epsilon_plus=0.2, epsilon_minus=0.5), "`epsilon_minus`"),
        (lambda: CascadeModel(stop=1.5), "`stop`"),
        (lambda: production_ranker(graded, fraction=0.0), "`fraction`"),
        (lambda: PropensityEstimator(0), "`n_positions`"),
        (lambda: PropensityEstimator(p=-1.0), "`p`"),
        (lambda: PropensityEstimator(weighting="map"), "`weighting`"),
        (lambda: est.update(zeros, torch.tensor([[0., 2., 1.], [0., 0., 0.]]), long),
         r"`clicks` has to be 0 or 1 .* at \[0, 1\]"),
        (lambda: est.update(zeros, zeros, torch.tensor([[0, 1, 2], [0, -1, 2]])), r"`positions` .* at \[1, 1\]"),
        (lambda: est.update(zeros, zeros, zeros), "`positions`"),
        (lambda: est.pair_factors(long, torch.ones(2, 2, dtype=torch.bool)), "`mask`"),
        (lambda: debiased_pair_loss(zeros, zeros, upper=-torch.ones(2, 3), lower=torch.ones(2, 3)),
         r"`upper` .* at \[0, 0\]"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
