"""rankkit.compat: a script written for lightgbm.LGBMRanker or xgboost.XGBRanker runs with the
import changed. Checked against the real libraries (where installed): the same attributes with the
same types, shapes and counting rules, on the same script; and every parameter maps or is refused."""
from __future__ import annotations

import inspect
import math
import re
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.base import clone

import rankkit.compat as rc
from rankkit.boosting import LambdaMART
from rankkit.data import make_synthetic

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    train, vali = make_synthetic(30, 20, 6, seed=0), make_synthetic(10, 20, 6, seed=1)
    x, y = train.features.numpy().astype(np.float64), train.labels.numpy()
    xv, yv = vali.features.numpy().astype(np.float64), vali.labels.numpy()
    del rng
    return x, y, train.sizes.numpy(), xv, yv, vali.sizes.numpy()


def _lgbm_script(lgb, data):
    """A LightGBM ranking script as its docs write one (LGBMRanker, group, eval_set, eval_at,
    callbacks, predict with num_iteration); ``lgb`` is the module the import gave."""
    x, y, g, xv, yv, gv = data
    model = lgb.LGBMRanker(n_estimators=40, num_leaves=15, learning_rate=0.1, min_child_samples=5,
                           colsample_bytree=0.9, reg_lambda=1.0, random_state=7, n_jobs=1, verbose=-1)
    record = {}
    model.fit(x, y, group=g, eval_set=[(x, y), (xv, yv)], eval_group=[g, gv], eval_at=[3, 10],
              callbacks=[lgb.early_stopping(5, verbose=False), lgb.record_evaluation(record)])
    return model, record, model.predict(xv, num_iteration=model.best_iteration_)


def _xgb_script(xgb, data):
    x, y, g, xv, yv, gv = data
    qid, qv = np.repeat(np.arange(len(g)), g), np.repeat(np.arange(len(gv)), gv)
    model = xgb.XGBRanker(n_estimators=40, max_depth=4, learning_rate=0.1, tree_method="hist",
                          objective="rank:ndcg", lambdarank_pair_method="topk", lambdarank_num_pair_per_sample=8,
                          early_stopping_rounds=5, eval_metric=["ndcg@3", "ndcg@10"], random_state=7, n_jobs=1)
    model.fit(x, y, qid=qid, eval_set=[(x, y), (xv, yv)], eval_qid=[qid, qv], verbose=False)
    return model, model.predict(xv), model.predict(xv, iteration_range=(0, model.best_iteration + 1))


def _shape(value):
    """A value's type and shape, nested (what a script can rely on), list lengths left out."""
    if isinstance(value, dict):
        return (dict, {k: _shape(v) for k, v in value.items()})
    if isinstance(value, list):
        return (list, _shape(value[0]) if value else None)  # lengths: the rounds each library ran
    if isinstance(value, np.ndarray):
        return (np.ndarray, value.shape, value.dtype.kind)
    if isinstance(value, (float, np.floating)):
        return float
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int
    return type(value)


def test_a_lightgbm_script_runs_with_the_import_changed(data):
    lgb = pytest.importorskip("lightgbm")
    real, real_record, real_pred = _lgbm_script(lgb, data)
    ours, our_record, our_pred = _lgbm_script(rc, data)
    for name in ("best_score_", "feature_importances_", "n_features_in_", "n_features_", "objective_"):
        assert _shape(getattr(ours, name)) == _shape(getattr(real, name)), name
    for name in ("best_iteration_", "n_estimators_", "n_iter_"):
        assert isinstance(getattr(ours, name), int) and isinstance(getattr(real, name), int), name
    # The counting rules: 1-based best iteration, the model keeps that many trees, evals for every round.
    for model in (real, ours):
        assert model.n_estimators_ == model.n_iter_ == model.best_iteration_
        rounds = {len(v) for d in model.evals_result_.values() for v in d.values()}
        assert len(rounds) == 1 and rounds.pop() > model.best_iteration_
        assert list(model.evals_result_) == ["training", "valid_1"]
        assert list(model.evals_result_["valid_1"]) == ["ndcg@3", "ndcg@10"]
        for data_name, metrics in model.best_score_.items():
            for metric, value in metrics.items():
                assert value == model.evals_result_[data_name][metric][model.best_iteration_ - 1]
    assert {k: list(v) for k, v in our_record.items()} == {k: list(v) for k, v in real_record.items()}
    assert our_pred.shape == real_pred.shape
    assert ours.feature_importances_.sum() == ours.booster_.feature_importance_split_.sum()


def test_an_xgboost_script_runs_with_the_import_changed(data):
    xgb = pytest.importorskip("xgboost")
    real, real_pred, real_best = _xgb_script(xgb, data)
    ours, our_pred, our_best = _xgb_script(rc, data)
    assert _shape(ours.evals_result()) == _shape(real.evals_result())
    assert list(ours.evals_result()) == ["validation_0", "validation_1"]
    for name in ("best_iteration", "best_score", "feature_importances_", "n_features_in_"):
        assert _shape(getattr(ours, name)) == _shape(getattr(real, name)), name
    assert ours.feature_importances_.dtype == real.feature_importances_.dtype == np.float32
    assert math.isclose(float(ours.feature_importances_.sum()), 1.0, rel_tol=1e-5)
    for model, pred, best in ((real, real_pred, real_best), (ours, our_pred, our_best)):
        history = model.evals_result()["validation_1"]["ndcg@10"]
        assert model.best_score == max(history[:model.best_iteration + 1])
        assert len(history) == model.best_iteration + 6  # stopped 5 rounds after the best
        np.testing.assert_array_equal(pred, best)  # predict uses the trees up to the best by default
    assert ours.n_estimators_ == len(ours.evals_result()["validation_1"]["ndcg@10"])  # every tree kept


def test_the_constructors_take_every_parameter_of_the_libraries():
    for name, cls, table in (("lightgbm", rc.LGBMRanker, rc.LGBM_PARAMETERS),
                             ("xgboost", rc.XGBRanker, rc.XGB_PARAMETERS)):
        ours = rc.LGBMRanker().get_params() if name == "lightgbm" else rc.XGBRanker().get_params()
        assert set(ours) <= set(table), set(ours) - set(table)
        library = pytest.importorskip(name)
        real = (library.LGBMRanker if name == "lightgbm" else library.XGBRanker)().get_params()
        assert set(real) <= set(ours), set(real) - set(ours)
        for key, value in real.items():  # and their defaults
            assert rc._same(ours[key], value) or (key == "missing" and math.isnan(ours[key])), key
        del cls


def test_the_compat_page_holds_the_parameter_tables_of_the_code():
    # docs/compat.md's two tables are parameter_rows of the tables the code maps by, row for row.
    text = (ROOT / "docs" / "compat.md").read_text()
    for table in (rc.LGBM_PARAMETERS, rc.XGB_PARAMETERS):
        assert rc.parameter_rows(table) in text


def test_the_mapping_sets_the_rankkit_settings(data):
    x, y, g, *_ = data
    model = rc.LGBMRanker(num_leaves=63, max_depth=4, n_estimators=3, reg_lambda=2.0, min_child_samples=7,
                          lambdarank_truncation_level=12, sigmoid=2.0, seed=5, num_threads=1,
                          verbose=-1).fit(x, y, group=g)
    params = model.booster_.get_params()
    assert (params["depth"], params["l2"], params["min_data_in_leaf"], params["k"], params["sigma"],
            params["random_state"], params["n_jobs"], params["normalize"]) == (4, 2.0, 7, 12, 2.0, 5, 1, True)
    assert rc.LGBMRanker(num_leaves=63, n_estimators=2).fit(x, y, group=g).booster_.depth == 6
    assert rc.LGBMRanker(subsample=0.5, n_estimators=2).fit(x, y, group=g).booster_.subsample == 1.0  # freq 0: unused
    assert rc.LGBMRanker(subsample=0.5, subsample_freq=1, n_estimators=2).fit(x, y, group=g).booster_.subsample == 0.5
    xgb = rc.XGBRanker(n_estimators=2, objective="rank:pairwise").fit(x, y, group=g).get_booster().get_params()
    assert (xgb["depth"], xgb["learning_rate"], xgb["l2"], xgb["min_sum_hessian"], xgb["objective"]) == \
        (6, 0.3, 1.0, 1.0, "ranknet")


def test_the_compat_model_is_the_lambdamart_it_maps_to(data):
    # The same settings through LambdaMART give the same trees: the front end adds nothing to the fit.
    x, y, g, xv, yv, gv = data
    ours = rc.LGBMRanker(n_estimators=6, num_leaves=8, min_child_samples=5, random_state=3).fit(x, y, group=g)
    direct = LambdaMART(n_estimators=6, depth=3, l2=0.0, min_data_in_leaf=5, k=30, normalize=True, seed=3,
                        min_sum_hessian=1e-3).fit(x, y, group=g)
    np.testing.assert_array_equal(ours.predict(xv), direct.predict(xv))


@pytest.mark.parametrize("cls, kwargs, needle", [
    (rc.LGBMRanker, dict(reg_alpha=0.5), "`reg_alpha=0.5` has no rankkit equivalent"),
    (rc.LGBMRanker, dict(min_split_gain=0.1), "nearest: `min_sum_hessian`"),
    (rc.LGBMRanker, dict(boosting_type="dart"), "`boosting_type='dart'`"),
    (rc.LGBMRanker, dict(num_leaves=100000), "depth 17"),
    (rc.LGBMRanker, dict(num_leaf=7, num_leaves=15), "one LightGBM parameter"),
    (rc.LGBMRanker, dict(lambdarank_truncaton_level=5), "did you mean `lambdarank_truncation_level`"),
    (rc.LGBMRanker, dict(objective="rank_xendcg", lambdarank_truncation_level=5), "does not read it"),
    (rc.LGBMRanker, dict(label_gain=[0, 1, 3, 5]), "`label_gain`"),
    (rc.LGBMRanker, dict(subsample=0.5, subsample_freq=3), "subsample_freq=3"),
    (rc.LGBMRanker, dict(metric="auc"), "`metric='auc'`"),
    (rc.LGBMRanker, dict(max_bin=511), "`max_bin=511`"),
    (rc.LGBMRanker, dict(random_state=np.random.RandomState(0)), "`random_state` has to be an integer"),
    (rc.XGBRanker, dict(gamma=1.0), "`gamma=1.0` has no rankkit equivalent"),
    (rc.XGBRanker, dict(objective="rank:foo"), "`objective='rank:foo'`"),
    (rc.XGBRanker, dict(lambdarank_pair_method="mean"), "`lambdarank_pair_method='mean'`"),
    (rc.XGBRanker, dict(missing=0.0), "`missing=0.0`"),
    (rc.XGBRanker, dict(importance_type="cover"), "`importance_type='cover'`"),
    (rc.XGBRanker, dict(grow_policy="lossguide"), "`grow_policy='lossguide'`"),
    (rc.XGBRanker, dict(tree_method="exact"), "`tree_method='exact'`"),
    (rc.XGBRanker, dict(nthred=2), "did you mean `nthread`"),
])
def test_a_parameter_without_an_equivalent_is_refused_in_one_line(data, cls, kwargs, needle):
    x, y, g, *_ = data
    with pytest.raises(ValueError) as info:
        cls(n_estimators=2, **kwargs).fit(x, y, group=g)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_defaults_of_refused_parameters_are_accepted(data):
    # Spelling out a library default rankkit has no setting for is accepted and changes nothing:
    # the same LambdaMART settings, the same trees as without it.
    x, y, g, xv, *_ = data
    for cls, defaults in ((rc.LGBMRanker, dict(reg_alpha=0.0, min_split_gain=0.0, boosting_type="gbdt",
                                               deterministic=True, force_col_wise=True)),
                          (rc.XGBRanker, dict(gamma=0, reg_alpha=0.0, tree_method="hist", booster="gbtree",
                                              grow_policy="depthwise", lambdarank_pair_method="topk"))):
        spelled = cls(n_estimators=2, **defaults).fit(x, y, group=g)
        plain = cls(n_estimators=2).fit(x, y, group=g)
        assert spelled.booster_.get_params() == plain.booster_.get_params(), cls
        np.testing.assert_array_equal(spelled.predict(xv), plain.predict(xv))


def test_fit_arguments_without_an_equivalent_are_refused(data):
    x, y, g, xv, yv, gv = data
    with pytest.raises(ValueError, match="Should set group"):
        rc.LGBMRanker(n_estimators=2).fit(x, y)
    with pytest.raises(ValueError, match="`init_model`"):
        rc.LGBMRanker(n_estimators=2).fit(x, y, group=g, init_model="model.txt")
    with pytest.raises(ValueError, match="categorical"):
        rc.LGBMRanker(n_estimators=2).fit(x, y, group=g, categorical_feature=[0])
    with pytest.raises(ValueError, match="group for all eval"):
        rc.LGBMRanker(n_estimators=2).fit(x, y, group=g, eval_set=[(xv, yv)])
    with pytest.raises(ValueError, match="`xgb_model`"):
        rc.XGBRanker(n_estimators=2).fit(x, y, group=g, xgb_model="m.json")
    with pytest.raises(ValueError, match="one per query"):
        rc.XGBRanker(n_estimators=2).fit(x, y, group=g, sample_weight=np.ones(len(y)))
    with pytest.raises(ValueError, match="validation dataset"):
        rc.XGBRanker(n_estimators=2, early_stopping_rounds=2).fit(x, y, group=g)
    with pytest.raises(ValueError, match="pred_leaf"):
        rc.LGBMRanker(n_estimators=2).fit(x, y, group=g).predict(x, pred_leaf=True)


def test_predict_ranges_are_the_sums_of_their_trees(data):
    x, y, g, xv, yv, gv = data
    model = rc.LGBMRanker(n_estimators=8, num_leaves=4, min_child_samples=3).fit(x, y, group=g)
    e = model.booster_.ensemble_
    # A slow path: each tree's contribution on its own (one-tree ensembles), summed by hand.
    trees = [rc.ObliviousEnsemble(e.n_features, e.features[t:t + 1], e.thresholds[t:t + 1],
                                  e.leaf_values[t:t + 1], 0.0)(torch.as_tensor(xv, dtype=torch.float32)).numpy()
             for t in range(8)]
    bias = float(e.bias)
    np.testing.assert_allclose(model.predict(xv), bias + sum(trees), atol=1e-5)
    np.testing.assert_allclose(model.predict(xv, num_iteration=3), bias + sum(trees[:3]), atol=1e-5)
    np.testing.assert_allclose(model.predict(xv, start_iteration=2, num_iteration=3), bias + sum(trees[2:5]),
                               atol=1e-5)
    xgb = rc.XGBRanker(n_estimators=8, max_depth=2).fit(x, y, group=g)
    assert xgb.predict(xv, iteration_range=(0, 0)).shape == (len(yv),)
    with pytest.raises(ValueError, match="iteration_range"):
        xgb.predict(xv, iteration_range=(0, 9))
    np.testing.assert_allclose(xgb.predict(xv, base_margin=np.ones(len(yv))), xgb.predict(xv) + 1, atol=1e-6)


def test_early_stopping_follows_lightgbm_rules():
    # The first validation (set, metric) pair that stalls stops the fit at its own best; training never counts.
    stop = rc.early_stopping(2, verbose=False)
    history = [(0.5, 0.1), (0.6, 0.3), (0.55, 0.2), (0.54, 0.4)]
    with pytest.raises(rc.EarlyStopException) as info:
        for i, (a, b) in enumerate(history):
            stop(rc.CallbackEnv(None, {}, i, 0, 100, [("training", "ndcg@1", 1.0 - i, True),
                                                      ("valid_0", "ndcg@1", a, True), ("valid_0", "ndcg@3", b, True)]))
    assert info.value.best_iteration == 1 and i == 3
    first = rc.early_stopping(2, first_metric_only=True, verbose=False)
    for i, (a, b) in enumerate(history[:3]):  # ndcg@3 stalls from round 1 on; only ndcg@1 counts here
        first(rc.CallbackEnv(None, {}, i, 0, 100, [("valid_0", "ndcg@1", a + i, True), ("valid_0", "ndcg@3", b, True)]))
    with pytest.raises(ValueError, match="at least one dataset"):
        rc.early_stopping(1)(rc.CallbackEnv(None, {}, 0, 0, 10, [("training", "ndcg@1", 1.0, True)]))


def test_early_stopping_spelled_as_a_parameter_or_a_library_callback(data):
    x, y, g, xv, yv, gv = data
    kw = dict(group=g, eval_set=[(xv, yv)], eval_group=[gv], eval_at=[5])
    by_callback = rc.LGBMRanker(n_estimators=60, num_leaves=8, learning_rate=0.5).fit(
        x, y, **kw, callbacks=[rc.early_stopping(3, verbose=False)])
    by_param = rc.LGBMRanker(n_estimators=60, num_leaves=8, learning_rate=0.5, early_stopping_round=3,
                             verbose=-1).fit(x, y, **kw)
    assert 0 < by_param.best_iteration_ == by_callback.best_iteration_ < 60
    lgb = pytest.importorskip("lightgbm")
    by_theirs = rc.LGBMRanker(n_estimators=60, num_leaves=8, learning_rate=0.5).fit(
        x, y, **kw, callbacks=[lgb.early_stopping(3, verbose=False), lgb.log_evaluation(0)])
    assert by_theirs.best_iteration_ == by_param.best_iteration_


def test_custom_eval_metrics_and_objectives(data):
    x, y, g, xv, yv, gv = data
    seen = []

    def mean_score(y_true, y_pred, weight, group):
        seen.append((len(y_true), int(np.sum(group))))
        return "mean_score", float(np.mean(y_pred)), True

    def squared(y_true, y_pred):  # LightGBM's custom objective: a numpy (grad, hess)
        return y_pred - y_true, np.ones_like(y_pred)

    model = rc.LGBMRanker(n_estimators=3, objective=squared).fit(
        x, y, group=g, eval_set=[(xv, yv)], eval_group=[gv], eval_metric=mean_score, eval_at=[2])
    assert list(model.evals_result_["valid_0"]) == ["ndcg@2", "mean_score"]
    assert seen == [(len(yv), len(yv))] * 3
    assert model.booster_.objective is squared


def test_get_params_clone_and_grid_search(data):
    x, y, g, *_ = data
    model = rc.LGBMRanker(n_estimators=3, lambdarank_truncation_level=10)
    assert model.get_params()["lambdarank_truncation_level"] == 10
    twin = clone(model).set_params(num_leaves=7, sigmoid=2.0)
    assert twin.get_params()["sigmoid"] == 2.0 and model.get_params().get("sigmoid") is None
    assert rc.XGBRanker(eta=0.2).get_params()["eta"] == 0.2
    assert set(inspect.signature(rc.LGBMRanker.fit).parameters) >= {"group", "eval_set", "eval_at", "callbacks"}


def test_xgboost_callbacks_and_verbose(data, capsys):
    x, y, g, xv, yv, gv = data
    calls = []

    class Monitor:
        def after_iteration(self, model, epoch, evals_log):
            calls.append((epoch, len(evals_log["validation_0"]["ndcg@32"])))
            return epoch == 2  # True stops the fit, as XGBoost's TrainingCallback

    model = rc.XGBRanker(n_estimators=10, callbacks=[Monitor()]).fit(
        x, y, group=g, eval_set=[(xv, yv)], eval_group=[gv], verbose=True)
    assert calls == [(0, 1), (1, 2), (2, 3)] and model.n_estimators_ == 3
    assert re.search(r"\[3\]\tvalidation_0's ndcg@32: [0-9.]+", capsys.readouterr().err)
    with pytest.raises(AttributeError, match="only defined when early stopping"):
        _ = model.best_iteration


def test_threads_are_restored(data):
    x, y, g, *_ = data
    before = torch.get_num_threads()
    rc.LGBMRanker(n_estimators=2, n_jobs=1).fit(x, y, group=g).predict(x)
    assert torch.get_num_threads() == before


def test_compat_exports():
    assert set(rc.__all__) <= set(dir(rc))
    assert isinstance(rc.LGBMRanker().get_params(), dict) and isinstance(OrderedDict(), dict)
