"""rankkit.training.clicks: the protocol's production ranker and the click logs a fit trains on."""
import pytest
import torch

from rankkit.data import make_synthetic
from rankkit.data.clicks import simulate_clicks
from rankkit.training import clicks as tc


@pytest.fixture(scope="module")
def graded():
    return make_synthetic(400, (3, 15), 4, seed=0)


def test_production_ranker(graded):
    ranker = tc.production_ranker(graded, fraction=0.05, n_estimators=5, depth=3, min_data_in_leaf=5)
    scores = tc.production_scores(ranker, graded)
    assert scores.shape == (graded.n_docs,) and scores.dtype == torch.float32
    assert bool(torch.isfinite(scores).all()) and float(scores.std()) > 0
    log = simulate_clicks(graded, scores, sessions_per_query=2)
    assert log.n_sessions == 2 * graded.n_queries


def test_the_production_ranker_sees_its_fraction_of_the_queries_drawn_by_its_seed(graded, monkeypatch):
    seen = []
    fit = tc.LambdaMART.fit
    monkeypatch.setattr(tc.LambdaMART, "fit", lambda self, data, *a, **k: seen.append(data) or fit(self, data))
    for seed in (0, 0, 1):
        tc.production_ranker(graded, fraction=0.05, n_estimators=2, depth=2, min_data_in_leaf=2, seed=seed)
    tc.production_ranker(graded, fraction=1e-9, n_estimators=2, depth=2, min_data_in_leaf=1)
    assert [d.n_queries for d in seen] == [20, 20, 20, 1]
    assert torch.equal(seen[0].qids, seen[1].qids) and not torch.equal(seen[0].qids, seen[2].qids)
    assert bool((seen[0].qids[1:] > seen[0].qids[:-1]).all())  # in the data's order


def test_click_split_gives_session_logs_with_positions_and_keeps_the_test_labels(graded):
    train, val = graded.subset(torch.arange(300)), graded.subset(torch.arange(300, 400))
    log, val_log = tc.click_split(train, val, sessions=3, k=5, fraction=0.1, seed=0)
    for sessions, source in ((log, train), (val_log, val)):
        assert sessions.position is not None and int(sessions.sizes.max()) <= 5
        assert set(sessions.labels.unique().tolist()) <= {0.0, 1.0}
        clicked = torch.segment_reduce(sessions.labels, "sum", lengths=sessions.sizes)
        assert bool((clicked >= 1).all())  # sessions without a click are dropped
        starts = sessions.offsets[:-1].repeat_interleave(sessions.sizes)
        assert torch.equal(sessions.position, torch.arange(sessions.n_docs) - starts)  # shown top to bottom
        assert sessions.n_queries <= 3 * source.n_queries
    again, _ = tc.click_split(train, None, sessions=3, k=5, fraction=0.1, seed=0)
    assert torch.equal(again.labels, log.labels)  # the seed decides the log
    assert tc.click_split(train, None, sessions=3, k=5, fraction=0.1)[1] is None


@pytest.mark.parametrize("options, match", [({"model": "dbn"}, "clicks.model"), ({"eta": -1.0}, "clicks.eta"),
                                            ({"sessions": 0.5}, "clicks.sessions"),
                                            ({"sessions": 2**26}, "MAX_LOG_ROWS")])
def test_bad_click_options_are_refused_before_anything_is_drawn(graded, options, match):
    with pytest.raises(ValueError, match=match):
        tc.click_split(graded, None, **options)
