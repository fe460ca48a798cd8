"""Click simulation (rankkit.data.clicks) and Unbiased LambdaMART's biases (rankkit.clicks.propensity).

Click rates are checked against each model's closed form within 4.5 binomial standard errors
of the summed clicks; the position-bucketed pair costs, the bias update, the pair factors and
the debiased loss against float64 loops written here independently.
"""
from __future__ import annotations

import math

import pytest
import torch

from rankkit.data import PaddedBatch, RankingDataset, concat, make_synthetic
from rankkit.training.clicks import production_ranker
from rankkit.data.clicks import (
    CascadeModel,
    PositionBasedModel,
    shown_lists,
    simulate_clicks,
)
from rankkit.clicks.propensity import PropensityEstimator, debiased_pair_loss

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
