"""The click-log metrics (rankkit.clicks.metrics), each against a slow path written here: the click
likelihood against scikit-learn's logistic regression, the cascade estimates against counting."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rankkit.clicks.log import session_log
from rankkit.clicks.metrics import ClickLikelihood, SessionClickMetric, cascade_relevance, multiple_click_ratio
from rankkit.data import make_synthetic
from rankkit.data.clicks import (
    PositionBasedModel,
    simulate_clicks,
)

PBM = PositionBasedModel(eta=1.0, epsilon_plus=1.0, epsilon_minus=0.1, max_label=4.0)


def test_cascade_relevance_counts_examined_rows_when_nothing_was_dropped():
    x = torch.eye(3).repeat(4, 1)  # 4 sessions of the same 3 documents at positions 0, 1, 2
    clicks = torch.tensor([0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1], dtype=torch.float64)
    log = session_log(x, clicks, [3, 3, 3, 3], torch.arange(3).repeat(4))
    # examined: rows at or above the last click (all rows of a session without one)
    examined = {0: 4, 1: 3, 2: 2}
    clicked = {0: 1, 1: 1, 2: 1}
    got = cascade_relevance(log)
    for d in range(3):
        doc = int(log.doc[d])
        assert got[doc].item() == pytest.approx(clicked[d] / examined[d])


def test_multiple_clicks_tell_a_cascade_from_a_position_based_log(pbm_logs, cascade_logs):
    _, pbm = pbm_logs
    _, cascade = cascade_logs
    for log, expected in ((pbm, "pbm"), (cascade, "cascade")):
        metric = SessionClickMetric(log.sessions.features, log.clicks, log.sessions.sizes, log.position,
                                    n_positions=8, em={"iterations": 5})
        assert metric.click_model_ == expected, metric.ratio_
    session = session_log(cascade.sessions.features, cascade.clicks, cascade.sessions.sizes, cascade.position)
    assert multiple_click_ratio(session, torch.full((len(session.doc),), 0.3)) == 0.0


def test_click_likelihood_matches_logistic_regression(pbm_logs):
    from sklearn.linear_model import LogisticRegression

    _, vali = pbm_logs
    x, clicks, sizes, position = vali.sessions.features, vali.clicks, vali.sessions.sizes, vali.position
    metric = ClickLikelihood(x, clicks, sizes, position, n_positions=5)
    w = torch.tensor([1.0, -0.5, 0.2, 0.0, 0.3, 0.1])
    ours = metric(lambda f: f @ w)
    # slow path: the centred, scaled score and one-hot positions, no intercept, no penalty
    s = (x @ w).double()
    session = torch.repeat_interleave(torch.arange(len(sizes)), sizes)
    z = s.clone()
    for i in range(len(sizes)):
        z[session == i] -= s[session == i].mean()
    z /= z.std()
    onehot = torch.nn.functional.one_hot(position.clamp(max=4), 5).double()
    design = torch.cat([z[:, None], onehot], 1).numpy()
    lr = LogisticRegression(C=np.inf, fit_intercept=False, tol=1e-12, max_iter=10_000).fit(design, clicks.numpy())
    assert lr.coef_[0, 0] > 0  # inside the slope's range (a >= 0)
    p = lr.predict_proba(design)[:, 1]
    y = clicks.numpy()
    reference = float(np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))
    assert ours == pytest.approx(reference, abs=1e-6)


def test_click_likelihood_prefers_the_relevance_order():
    data = make_synthetic(40, (8, 12), 4, seed=1)
    scores = torch.randn(data.n_docs, generator=torch.Generator().manual_seed(1))
    log = simulate_clicks(data, scores, model=PBM, sessions_per_query=30, k=8, seed=2, drop_unclicked=True)
    metric = ClickLikelihood(log.sessions.features, log.clicks, log.sessions.sizes, log.position, n_positions=8)
    relevance = dict(zip(map(tuple, data.features.tolist()), data.labels.tolist()))

    def oracle(f):
        return torch.tensor([relevance[tuple(r)] for r in f.tolist()])

    assert metric(oracle) > metric(lambda f: -oracle(f)) + 0.01
    assert metric(oracle) > metric(lambda f: torch.zeros(len(f))) + 0.005


def test_a_ranker_that_explains_nothing_scores_the_positions_alone(pbm_logs):
    """The slope's floor (0) is at a = −∞ of its softplus, which L-BFGS only approaches (here to
    within 2e-12). A ranker that explains nothing scores the positions' likelihood exactly,
    computed here by a loop over rows from each position's click rate."""
    _, vali = pbm_logs
    x, clicks, sizes, position = vali.sessions.features, vali.clicks, vali.sessions.sizes, vali.position
    metric = ClickLikelihood(x, clicks, sizes, position, n_positions=5)
    bucket = position.clamp(max=4)
    rate = {b: float(clicks[bucket == b].double().mean()) for b in range(5) if bool((bucket == b).any())}
    floor = sum(math.log(rate[int(b)]) if c else math.log(1 - rate[int(b)])
                for b, c in zip(bucket.tolist(), clicks.tolist())) / len(clicks)
    w = torch.tensor([1.0, -0.5, 0.2, 0.0, 0.3, 0.1])
    assert metric(lambda f: -(f @ w)) == pytest.approx(floor, abs=1e-12)  # anti-ordered: the floor
    assert metric(lambda f: torch.zeros(len(f))) == pytest.approx(floor, abs=1e-12)
    assert metric(lambda f: f @ w) > floor + 1e-3  # an informative ranker is above it
