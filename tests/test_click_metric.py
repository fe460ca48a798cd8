"""Choosing a debiasing on a validation click log (rankkit.click_metric) and LambdaMART's
click modes: ``unbiased="position"`` (LightGBM's additive position bias), ``"ips"`` (regression-EM
propensities, fixed) and ``"auto"`` (the race).

Each fast path against a slow one written here: the position-bias step against a float64 loop
over the rows, the click likelihood against scikit-learn's logistic regression, the queries
against a union-find, the cascade estimates against counting, the race's winner against a plain
fit of the same candidate.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rankkit.boosting import LambdaMART
from rankkit.boosting import booster as booster_module, engine as engine_module
from rankkit.boosting.engine import fit_binner, transform
from rankkit.boosting.booster import AUTO_CANDIDATES, race_rounds
from rankkit.boosting.engine import BoosterConfig, BoostingEngine
from rankkit.click_metric import (
    ClickLikelihood,
    SessionClickMetric,
    SuccessiveHalving,
    cascade_relevance,
    distinct_rows,
    multiple_click_ratio,
    session_log,
)
from rankkit.data import make_synthetic
from rankkit.training.clicks import production_ranker, production_scores
from rankkit.data.clicks import (
    CascadeModel,
    PositionBasedModel,
    simulate_clicks,
)
from rankkit.unbiased import FixedPropensities, RegressionEM


def logs(model, *, queries: int = 60, seed: int = 0):
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
    return logs(PBM)


# -- the validation log ----------------------------------------------------------------------------
def test_session_log_queries_match_a_union_find():
    g = torch.Generator().manual_seed(3)
    docs = torch.randn(12, 3, generator=g)
    rows = torch.randint(0, 12, (40,), generator=g)
    sizes = torch.tensor([4, 3, 5, 2, 6, 4, 3, 5, 4, 4])
    log = session_log(docs[rows], torch.zeros(40), sizes, torch.zeros(40, dtype=torch.long))
    parent = list(range(12))

    def find(i):
        while parent[i] != i:
            i = parent[i]
        return i

    session = np.repeat(np.arange(len(sizes)), sizes.numpy())
    for s in range(len(sizes)):
        members = rows[torch.from_numpy(session == s)].tolist()
        for d in members[1:]:
            parent[find(d)] = find(members[0])
    # the same partition of the shown documents (numbering aside)
    key = {tuple(v.tolist()): i for i, v in enumerate(docs)}
    truth = [find(key[tuple(f.tolist())]) for f in log.features]
    ours = log.query.tolist()
    assert len(set(zip(truth, ours))) == len(set(truth)) == len(set(ours))
    assert torch.equal(log.features[log.doc], docs[rows])


def test_missing_values_are_one_document():
    x = torch.tensor([[1.0, math.nan], [1.0, math.nan], [2.0, 0.0]])
    log = session_log(x, torch.zeros(3), [3], torch.arange(3))
    assert log.doc.tolist()[0] == log.doc.tolist()[1] != log.doc.tolist()[2]


def test_distinct_rows_equal_torch_unique_even_when_hashes_collide():
    """The hashed grouping gives torch.unique(dim=0)'s rows and inverse exactly: repeated rows,
    −0 beside +0, a constant column; and with every hash equal (a collision) the full sort."""
    g = torch.Generator().manual_seed(1)
    half = torch.randn(150, 7, generator=g, dtype=torch.float64).round(decimals=1)
    half[:, 3] = 0.0
    half[:, 5] = 0.0
    twin = half.clone()
    twin[:, 5] = -0.0  # equal to its +0 row
    base = torch.cat([half, twin])
    rows = base[torch.randint(0, 300, (5000,), generator=g)]
    want = torch.unique(rows, dim=0, return_inverse=True)
    for multipliers in (None, torch.zeros(7, dtype=torch.long), torch.tensor([1, 0, 0, 0, 0, 0, 0])):
        got = distinct_rows(rows, multipliers)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert len(want[0]) == 150  # −0 and +0 rows are one


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


def test_multiple_clicks_tell_a_cascade_from_a_position_based_log(pbm_logs):
    _, pbm = pbm_logs
    _, cascade = logs(CASCADE)
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


# -- LambdaMART's modes ----------------------------------------------------------------------------
def test_position_bias_step_matches_a_float64_loop(pbm_logs):
    train, _ = pbm_logs
    config = BoosterConfig(depth=2, min_data_in_leaf=5, unbiased="position", n_positions=6,
                           position_bias_regularization=0.3, learning_rate=0.2)
    engine = BoostingEngine(train.sessions.features, train.clicks.float(), train.sessions.sizes, config,
                            positions=train.position)
    engine.update()
    engine.update()  # the second round's gradients are taken at s + b
    b1 = engine.position_bias.clone()
    adjusted = engine.scores + b1[engine.bucket]
    grad, hess = engine.objective.gradients(adjusted, engine.layout, backend=engine.backend)
    engine.update()
    expected = b1.clone()
    g = [0.0] * 6
    h = [0.0] * 6
    n = [0] * 6
    for i in range(len(grad)):
        p = min(int(train.position[i]), 5)
        g[p] += float(grad[i])
        h[p] += float(hess[i])
        n[p] += 1
    for p in range(6):
        step = (-g[p] - 0.3 * n[p] * float(b1[p])) / (abs(h[p] + 0.3 * n[p]) + 1e-3)
        expected[p] = float(b1[p]) + 0.2 * step
    assert torch.allclose(engine.position_bias, expected, rtol=1e-9, atol=1e-12)


def test_position_model_explains_clicks_by_position():
    """Clicks that depend on the position only, and a feature that leaks the position: the naive
    model ranks by the leak alone; the position model puts much of it in the bias (not all: the
    leak and the position are collinear, so either explains the clicks)."""
    g = torch.Generator().manual_seed(0)
    sessions, k = 300, 6
    position = torch.arange(k).repeat(sessions)
    x = torch.cat([position[:, None].float() + 0.1 * torch.randn(sessions * k, 1, generator=g),
                   torch.randn(sessions * k, 2, generator=g)], 1)
    clicks = (torch.rand(sessions * k, generator=g) < 0.6 / (1.0 + position)).float()
    group = [k] * sessions
    kw = dict(n_estimators=30, depth=2, min_data_in_leaf=10, learning_rate=0.2, n_positions=k)
    naive = LambdaMART(**kw).fit(x, clicks, group=group)
    model = LambdaMART(unbiased="position", **kw).fit(x, clicks, group=group, position=position)
    def gap(m):  # mean score at position 0 minus at position 4
        p = torch.from_numpy(m.predict(x))
        return float(p[position == 0].mean() - p[position == 4].mean())

    assert gap(naive) > 2.0
    assert gap(model) < 0.6 * gap(naive)
    assert np.all(np.diff(model.position_bias_) < 0)  # higher positions, more clicks
    assert not hasattr(naive, "position_bias_")


def test_ips_uses_regression_em_on_the_aggregated_training_log(pbm_logs):
    train, _ = pbm_logs
    x, y, group, position = train.sessions.features, train.clicks, train.sessions.sizes, train.position
    model = LambdaMART(unbiased="ips", n_estimators=3, depth=2, min_data_in_leaf=5, n_positions=8,
                       propensity_clip=5.0).fit(x, y, group=group, position=position)
    # slow path: impressions and clicks per (feature row, position) by a dictionary
    counts: dict = {}
    for row, c, p in zip(x.tolist(), y.tolist(), position.tolist()):
        key = (tuple(row), min(p, 7))
        shown, clicked = counts.get(key, (0, 0))
        counts[key] = (shown + 1, clicked + c)
    keys = sorted(counts)
    em = RegressionEM(8, hidden=(16,), iterations=15, lr=1e-2, seed=0).fit(
        torch.tensor([k[0] for k in keys]), torch.tensor([counts[k][1] for k in keys], dtype=torch.float64),
        torch.tensor([k[1] for k in keys]), impressions=torch.tensor([counts[k][0] for k in keys], dtype=torch.float64))
    np.testing.assert_allclose(model.propensities_["clicked"], em.propensities_.numpy(), rtol=1e-4)
    assert (model.propensities_["unclicked"] == 1).all()
    est = FixedPropensities(em.propensities_, clip=5.0)
    before = est.t_plus.clone()
    est.update(torch.zeros(2, 3), torch.tensor([[1.0, 0, 0], [0, 1.0, 0]]), torch.tensor([[0, 1, 2], [0, 1, 2]]))
    assert torch.equal(est.t_plus, before)
    upper, lower = est.pair_factors(torch.arange(8)[None])
    assert upper.max().item() <= 5.0 + 1e-6 and (lower == 1).all()


def test_auto_keeps_the_winner_as_a_plain_fit_would(pbm_logs, tmp_path):
    train, vali = pbm_logs
    x, y, group, position = train.sessions.features, train.clicks, train.sessions.sizes, train.position
    kw = dict(n_estimators=6, depth=2, min_data_in_leaf=5, n_positions=8, seed=3)
    model = LambdaMART(unbiased="auto", **kw).fit(
        x, y, group=group, position=position, eval_set=[(vali.sessions.features, vali.clicks)],
        eval_group=[vali.sessions.sizes], eval_position=[vali.position])
    assert model.unbiased_choice_ in AUTO_CANDIDATES
    assert set(model.unbiased_scores_) == set(AUTO_CANDIDATES)
    stages = {c: v["stage"] for c, v in model.unbiased_scores_.items()}
    finalists = [c for c, stage in stages.items() if stage == 2]
    assert sorted(stages.values()) == [1, 1, 2, 2] and model.unbiased_choice_ in finalists
    other = next(c for c in finalists if c != model.unbiased_choice_)
    assert model.unbiased_scores_[model.unbiased_choice_]["score"] >= model.unbiased_scores_[other]["score"]
    assert {v["trees"] for v in model.unbiased_scores_.values()} == {2, 4}
    plain = LambdaMART(**AUTO_CANDIDATES[model.unbiased_choice_], **{**kw, "seed": 3}).fit(
        x, y, group=group, position=position, eval_set=[(vali.sessions.features, vali.clicks)],
        eval_group=[vali.sessions.sizes])
    np.testing.assert_array_equal(model.predict(x), plain.predict(x))
    assert model.best_iteration_ == 5
    path = tmp_path / "auto.safetensors"
    model.save(path)
    loaded = LambdaMART.load(path)
    assert loaded.unbiased_choice_ == model.unbiased_choice_ and loaded.unbiased == "auto"
    np.testing.assert_array_equal(loaded.predict(x), model.predict(x))
    # refitting with another mode leaves no stale choice behind
    model.set_params(unbiased=False).fit(x, y, group=group)
    assert not hasattr(model, "unbiased_choice_")


def test_auto_says_each_stage_of_its_race_under_verbose(pbm_logs, capsys):
    train, vali = pbm_logs
    x, y, group, position = train.sessions.features, train.clicks, train.sessions.sizes, train.position
    model = LambdaMART(unbiased="auto", n_estimators=6, depth=2, min_data_in_leaf=5, n_positions=8, verbose=1).fit(
        x, y, group=group, position=position, eval_set=[(vali.sessions.features, vali.clicks)],
        eval_group=[vali.sessions.sizes], eval_position=[vali.position])
    stages = [line for line in capsys.readouterr().err.splitlines() if "unbiased='auto'" in line]
    assert len(stages) == 2 and stages[0].startswith("LambdaMART unbiased='auto' stage 1: up to 2 trees each")
    assert stages[1].startswith("LambdaMART unbiased='auto' stage 2: up to 4 trees each")
    assert stages[1].endswith(f"{model.unbiased_choice_} wins") and stages[0].count(",") >= 4
    assert stages[0].endswith(" go on")


@pytest.mark.parametrize("stages", [None, (12, 24)])
def test_the_race_stops_each_candidate_early_and_scores_its_kept_trees(pbm_logs, monkeypatch, stages):
    """With early stopping, no candidate grows past its own stopping point, the stages end at
    E and 2E rounds, and each is scored at the trees a plain fit of it keeps. With longer
    stages (12, 24), candidates stop inside them."""
    assert race_rounds(300, 2) == (2, 4) and race_rounds(6, None) == (2, 4) and race_rounds(2, None) == (1, 1)
    if stages is not None:
        monkeypatch.setattr(booster_module, "race_rounds", lambda n, e: stages)
    train, vali = pbm_logs
    x, y, group, position = train.sessions.features, train.clicks, train.sessions.sizes, train.position
    grown = []
    update = BoostingEngine.update

    def counting(engine):
        grown.append(engine.config.unbiased)
        return update(engine)

    monkeypatch.setattr(BoostingEngine, "update", counting)
    binned, transforms = [], []
    monkeypatch.setattr(engine_module, "fit_binner", lambda *a, **k: binned.append(1) or fit_binner(*a, **k))
    monkeypatch.setattr(engine_module, "transform", lambda *a, **k: transforms.append(1) or transform(*a, **k))
    kw = dict(n_estimators=300, early_stopping_rounds=2, depth=2, min_data_in_leaf=5, n_positions=8,
              learning_rate=0.5, seed=1)
    fit = dict(eval_set=[(vali.sessions.features, vali.clicks)], eval_group=[vali.sessions.sizes])
    model = LambdaMART(unbiased="auto", **kw).fit(x, y, group=group, position=position, eval_position=[vali.position],
                                                  **fit)
    raced = list(grown)
    assert binned == [1] and len(transforms) == 2  # the candidates share the bins: training set and eval set once
    assert len(raced) < 300  # the 300-round race without stopping grows 700
    stopped = 0
    for name, options in AUTO_CANDIDATES.items():
        entry = model.unbiased_scores_[name]
        # a plain fit of the candidate: to its own stop, and to the rounds of its last stage
        plain = LambdaMART(**{**kw, **options}).fit(x, y, group=group, position=position, **fit)
        end = (stages or (2, 4))[entry["stage"] - 1]
        staged = LambdaMART(**{**kw, **options, "n_estimators": end}).fit(x, y, group=group, position=position, **fit)
        stopped_at = len(plain.evals_result_["valid_0"]["ndcg@10"])
        expected = stopped_at if name == model.unbiased_choice_ else min(end, stopped_at)
        stopped += stopped_at < end
        assert raced.count(options["unbiased"]) == expected
        assert entry["trees"] == staged.best_iteration_ + 1
    assert stopped >= (2 if stages else 0)  # the stretched stages see candidates stop inside them


@pytest.mark.parametrize("unbiased", [True, "position", "ips"])
def test_position_ids_of_any_numbering_train_the_same_model(pbm_logs, unbiased):
    """LightGBM's rule: positions are ids. 0-based, 1-based and sparse (even negative) ids
    give the same model; before, 1-based ids switched the debiasing off without a word."""
    train, _ = pbm_logs
    x, y, group, position = train.sessions.features, train.clicks, train.sessions.sizes, train.position
    kw = dict(unbiased=unbiased, n_estimators=4, depth=2, min_data_in_leaf=5, n_positions=8)
    models = [LambdaMART(**kw).fit(x, y, group=group, position=p)
              for p in (position, position + 1, 5 * position - 10)]
    for model in models[1:]:
        np.testing.assert_array_equal(model.predict(x), models[0].predict(x))
    assert models[1].position_ids_.tolist() == list(range(1, 9))
    assert models[2].position_ids_.tolist() == list(range(-10, 30, 5))
    if unbiased is True:  # the biases are learned, not all 1 (what 1-based ids gave before)
        assert not np.allclose(models[1].propensities_["clicked"], 1.0)


def test_position_ids_map_the_validation_log_the_same_way(pbm_logs, tmp_path):
    train, vali = pbm_logs
    x, y, group = train.sessions.features, train.clicks, train.sessions.sizes
    kw = dict(unbiased="auto", n_estimators=3, depth=2, min_data_in_leaf=5, n_positions=8, seed=2)
    fit = dict(eval_set=[(vali.sessions.features, vali.clicks)], eval_group=[vali.sessions.sizes])
    zero = LambdaMART(**kw).fit(x, y, group=group, position=train.position, eval_position=[vali.position], **fit)
    one = LambdaMART(**kw).fit(x, y, group=group, position=train.position + 1, eval_position=[vali.position + 1],
                               **fit)
    assert one.unbiased_choice_ == zero.unbiased_choice_ and one.unbiased_scores_ == zero.unbiased_scores_
    np.testing.assert_array_equal(one.predict(x), zero.predict(x))
    one.save(tmp_path / "m.safetensors")
    assert LambdaMART.load(tmp_path / "m.safetensors").position_ids_.tolist() == list(range(1, 9))
    unseen = torch.where(vali.position == 3, 40, vali.position)
    with pytest.raises(ValueError, match=r"`eval_position\[0\]` holds position id 40 at index \d+, which the "
                                         r"training log never showed"):
        LambdaMART(**kw).fit(x, y, group=group, position=train.position, eval_position=[unseen], **fit)


def test_more_position_ids_than_n_positions_are_refused_or_pooled_on_request(pbm_logs):
    train, _ = pbm_logs
    x, y, group, position = train.sessions.features, train.clicks, train.sessions.sizes, train.position
    kw = dict(unbiased=True, n_estimators=3, depth=2, min_data_in_leaf=5, n_positions=4)
    with pytest.raises(ValueError, match=r"`position` holds 8 distinct position ids \(0..7\), more than "
                                         r"n_positions=4: pass n_positions=8 .* or pool_positions=True"):
        LambdaMART(**kw).fit(x, y, group=group, position=position)
    pooled = LambdaMART(pool_positions=True, **kw).fit(x, y, group=group, position=position + 1)
    clamped = LambdaMART(**kw).fit(x, y, group=group, position=position.clamp(max=3))
    np.testing.assert_array_equal(pooled.predict(x), clamped.predict(x))
    naive = LambdaMART(n_estimators=3, depth=2, min_data_in_leaf=5, n_positions=4)
    assert not hasattr(naive.fit(x, y, group=group, position=position), "position_ids_")  # read by no one
    with pytest.raises(ValueError, match=r"`position` has to hold integer position ids .* got 0.5 at index 2"):
        LambdaMART(**kw).fit(x, y, group=group, position=torch.tensor([0, 1, 0.5] + [0] * (len(y) - 3)))


def test_successive_halving_keeps_the_best_of_each_stage_and_reads_old_states():
    """The one race of both families: best two after stage 1, best one after stage 2, ties in
    the candidates' order, a leader between stages; a state written before the shared race
    (plain scores) loads with its stage read from the candidates left."""
    race = SuccessiveHalving(["naive", "a", "b", "c"])
    for name, value in zip(race.alive, (-0.5, -0.3, -0.3, -0.9)):
        race.record(name, value, trees=3)
    assert race.rank(stage_over=False) == "a" and race.alive == ["a", "b", "naive", "c"] and race.stage == 0
    assert race.rank(stage_over=True) == "a" and race.alive == ["a", "b"] and not race.over
    race.record("a", -0.4)
    race.record("b", -0.2)
    assert race.rank(stage_over=True) == "b" and race.alive == ["b"] and race.over
    assert race.scores_["c"] == {"score": -0.9, "stage": 1, "trees": 3} and race.scores_["b"]["stage"] == 2
    assert race.rank(stage_over=True) == "b" and race.stage == 2  # nothing after the last stage
    old = SuccessiveHalving(["naive", "a", "b", "c"])
    old.load_state({"alive": ["a", "b"], "scores": {"a": -0.3, "b": -0.4}, "choice": "a"})
    assert old.stage == 1 and old.scores_["a"]["score"] == -0.3 and old.choice_ == "a"
    again = SuccessiveHalving(["naive", "a", "b", "c"])
    again.load_state(race.state())
    assert again.state() == race.state()
