"""rankkit.compare.baselines: the third-party rows share the vali NDCG@10 code and the stopping rule."""
import importlib.util

import numpy as np
import pytest
import torch

from rankkit.compare.baselines import BASELINE_FNS, BASELINE_LABELS, BASELINE_PACKAGES, BASELINES, best_round, \
    train_baseline
from rankkit.compare.protocol import Evaluator
from rankkit.data import make_synthetic


def _early_stopping_loop(curve, patience):
    """Lightning's EarlyStopping (strictly better resets the wait) and ModelCheckpoint (first best)."""
    best_i = 0
    for i in range(len(curve)):
        if curve[i] > curve[best_i]:
            best_i = i
        if i - best_i >= patience:
            return best_i, i + 1
    return best_i, len(curve)


@pytest.mark.parametrize("seed", range(30))
def test_best_round_is_the_early_stopping_rule(seed):
    rng = np.random.default_rng(seed)
    curve = np.round(rng.random(rng.integers(1, 40)), 1).tolist()  # ties on purpose
    patience = int(rng.integers(1, 6))
    assert best_round(curve, patience) == _early_stopping_loop(curve, patience)


def test_every_baseline_has_a_function_a_label_and_a_package():
    assert set(BASELINE_FNS) == set(BASELINE_LABELS) == set(BASELINE_PACKAGES) == set(BASELINES)


@pytest.mark.parametrize("name", ["lightgbm", "xgboost", "catboost"])
def test_a_baseline_row_is_scored_by_the_protocols_evaluator(name):
    if importlib.util.find_spec(BASELINE_PACKAGES[name]) is None:
        pytest.skip(f"{name} is not installed")
    train, vali, test = (make_synthetic(30, 12, 6, seed=s) for s in (0, 1, 2))
    max_label = float(train.labels.max())
    test_eval, val_eval = Evaluator(test, max_label), Evaluator(vali, max_label)
    row = train_baseline(name, train, vali, test_eval, seed=0, rounds=25, patience=3, val_eval=val_eval)
    assert 1 <= row["epochs"] <= 25 and len(row["val_curve"]) == row["epochs"]
    assert 0 <= row["best_epoch"] < row["epochs"]
    assert row["val_curve"][row["best_epoch"]] == max(row["val_curve"][:row["best_epoch"] + 1])
    assert set(test_eval.metrics(torch.zeros(test.n_docs))) <= set(row)
    assert 0.0 <= row["ndcg@10"] <= 1.0 and row["train_seconds"] > 0
