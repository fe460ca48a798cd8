"""What the click tests share: synthetic click logs shown by a weak production ranker."""
from __future__ import annotations

import pytest

from rankkit.data import make_synthetic
from rankkit.data.clicks import CascadeModel, PositionBasedModel, simulate_clicks
from rankkit.training.clicks import production_ranker, production_scores


def click_logs(model, *, queries: int = 60, seed: int = 0):
    """(training log, validation log) of ``model`` on a synthetic set, shown by a weak ranker."""
    data = make_synthetic(queries, (8, 20), 6, seed=seed)
    prod = production_ranker(data, fraction=0.1, n_estimators=5, depth=2, min_data_in_leaf=5, seed=seed)
    scores = production_scores(prod, data)
    train = simulate_clicks(data, scores, model=model, sessions_per_query=20, k=8, seed=seed, drop_unclicked=True)
    vali = simulate_clicks(data, scores, model=model, sessions_per_query=20, k=8, seed=seed + 1,
                           drop_unclicked=True)
    return train, vali


PBM = PositionBasedModel(eta=1.0, epsilon_plus=1.0, epsilon_minus=0.1, max_label=4.0)
CASCADE = CascadeModel(stop=1.0, epsilon_plus=1.0, epsilon_minus=0.1, max_label=4.0)


@pytest.fixture(scope="module")
def pbm_logs():
    return click_logs(PBM)


@pytest.fixture(scope="module")
def cascade_logs():
    return click_logs(CASCADE)
