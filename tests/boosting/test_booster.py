"""rankkit.boosting.booster: MART's worked example, every objective learns, early stopping, init
scores, weights, importances, missing values, the estimator contract, save and load."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from rankkit.boosting import LambdaMART
from rankkit.data import load_mq2008

from .conftest import small_set

pytestmark = pytest.mark.usefixtures("one_thread")  # every test here on one thread


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


def smoothed_choice(curve, window, patience):
    """The slow path: trailing means over ``window`` rounds, the best window's centre, and where
    the patience counted from its end stops the run."""
    best, best_end, best_round = -math.inf, -1, -1
    for t in range(len(curve)):
        lo = max(0, t - window + 1)
        mean = sum(curve[lo:t + 1]) / (t + 1 - lo)
        if mean > best:
            best, best_end, best_round = mean, t, (lo + t) // 2
        if t - best_end >= patience:
            return best_round, t + 1
    return best_round, len(curve)


@pytest.mark.parametrize("window", [1, 3, 6])
def test_early_stopping_on_a_trailing_mean_keeps_the_best_windows_centre(window):
    train, vali = small_set(0), small_set(1)
    full = LambdaMART(n_estimators=40, depth=4, learning_rate=1.0, min_data_in_leaf=2).fit(train, eval_set=[vali])
    curve = full.evals_result_["valid_0"]["ndcg@10"]
    model = LambdaMART(n_estimators=40, depth=4, learning_rate=1.0, min_data_in_leaf=2, early_stopping_rounds=4,
                       early_stopping_window=window).fit(train, eval_set=[vali])
    best_round, grown = smoothed_choice(curve, window, 4)
    assert model.best_iteration_ == best_round and model.ensemble_.n_trees == best_round + 1
    assert model.evals_result_["valid_0"]["ndcg@10"] == curve[:grown]
    assert model.best_score_ == curve[best_round]


def test_a_lucky_round_on_a_noisy_curve_is_not_kept_with_a_window():
    from rankkit.boosting.config import BoosterConfig
    from rankkit.boosting.engine import BoostingEngine

    curve = [0.50, 0.52, 0.70, 0.51, 0.53, 0.60, 0.61, 0.62, 0.61, 0.60, 0.55, 0.50, 0.50]  # a spike at 2
    picks = {}
    for window in (1, 3, 5):
        engine = object.__new__(BoostingEngine)
        engine.config = BoosterConfig(early_stopping_window=window)
        engine.best_score, engine.best_round = -math.inf, -1
        engine.best_smoothed, engine.best_end = -math.inf, -1
        for t in range(len(curve)):
            engine._track_best(curve[:t + 1])
        picks[window] = engine.best_round
        assert (engine.best_round, engine.best_end) == (smoothed_choice(curve, window, 99)[0], engine.best_end)
    assert picks == {1: 2, 3: 7, 5: 7}  # the spike, then the plateau's centre


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


def test_random_state_is_seed_and_n_jobs_sets_the_threads_of_one_call(monkeypatch):
    d = small_set()
    kw = dict(n_estimators=4, depth=3, min_data_in_leaf=3, subsample=0.5, colsample=0.5)
    by_seed = LambdaMART(**kw, seed=7).fit(d).predict(d)
    np.testing.assert_array_equal(LambdaMART(**kw, random_state=7).fit(d).predict(d), by_seed)
    assert not np.array_equal(LambdaMART(**kw, random_state=8).fit(d).predict(d), by_seed)
    with pytest.raises(ValueError, match="`random_state` and `seed` are one setting"):
        LambdaMART(**kw, seed=1, random_state=2).fit(d)
    seen = []
    set_threads = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: (seen.append(n), set_threads(n)))
    before = torch.get_num_threads()
    model = LambdaMART(**kw, n_jobs=1).fit(d)
    model.predict(d)
    assert torch.get_num_threads() == before
    if before != 1:  # each call ran on 1 thread and gave the count back
        assert seen == [1, before, 1, before]


def test_a_model_splitting_missing_from_present_values_saves_and_loads(tmp_path):
    # Round 4: such a split has threshold -inf, which `validate` (and so `load`) refused.
    d = small_set()
    x = d.features.clone()
    x[::2, 0] = float("nan")  # missing values that tell the label apart: the first split takes them
    y = torch.where(torch.isnan(x[:, 0]), d.labels.clamp(max=1), d.labels.clamp(min=2))
    model = LambdaMART(n_estimators=3, depth=2, min_data_in_leaf=3).fit(x, y, group=d.sizes)
    assert bool((model.ensemble_.thresholds == -torch.inf).any())
    model.save(tmp_path / "m.safetensors")
    np.testing.assert_array_equal(LambdaMART.load(tmp_path / "m.safetensors").predict(x), model.predict(x))


def test_a_loaded_models_custom_objective_is_text_a_refit_does_not_import(tmp_path):
    # Round 4: LambdaMART.load(...) then fit() imported the module the file named.
    from rankkit.custom import RecordedName

    d = small_set()
    model = LambdaMART("rankkit.examples.losses.ranknet", n_estimators=2, depth=2, min_data_in_leaf=3).fit(d)
    model.save(tmp_path / "m.safetensors")
    loaded = LambdaMART.load(tmp_path / "m.safetensors")
    assert isinstance(loaded.objective, RecordedName)
    np.testing.assert_array_equal(loaded.predict(d), model.predict(d))  # loading and scoring need no code
    with pytest.raises(ValueError, match=r"was read from a model file, which records a custom objective as text "
                                         r"only: to train again, name it yourself"):
        loaded.fit(d)
    refit = loaded.set_params(objective="rankkit.examples.losses.ranknet").fit(d)  # named by the user: trains
    np.testing.assert_array_equal(refit.predict(d), model.predict(d))
