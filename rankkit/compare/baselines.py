"""The third-party baselines of ``rankkit compare``: LightGBM, XGBoost and CatBoost on the same
folds, with their library defaults, the same vali NDCG@10 code and the same early-stopping rule."""
from __future__ import annotations

import functools
import time
from typing import Callable

import torch

BASELINES = ("lightgbm", "xgboost", "catboost", "catboost-lambdamart")


def best_round(curve: list[float], patience: int) -> tuple[int, int]:
    """Lightning's EarlyStopping + ModelCheckpoint rule on a vali curve: (best index, rounds run).

    >>> best_round([0.5, 0.7, 0.6, 0.7, 0.6], patience=2)
    (1, 4)
    """
    best, best_i, wait = -float("inf"), 0, 0
    for i, v in enumerate(curve):
        if v > best:
            best, best_i, wait = v, i, 0
        else:
            wait += 1
            if wait >= patience:
                return best_i, i + 1
    return best_i, len(curve)


def _lightgbm(train, vali, test, *, seed, rounds, patience, val_eval):
    import lightgbm as lgb

    curve: list[float] = []

    def feval(preds, _):
        curve.append(val_eval.ndcg10(preds))
        return "ndcg@10", curve[-1], True

    dtrain = lgb.Dataset(train.features.numpy(), train.labels.numpy(), group=train.sizes.numpy())
    dvali = lgb.Dataset(vali.features.numpy(), vali.labels.numpy(), group=vali.sizes.numpy(), reference=dtrain)
    params = {"objective": "lambdarank", "metric": "None", "seed": seed, "deterministic": True,
              "verbosity": -1}
    booster = lgb.train(params, dtrain, num_boost_round=rounds, valid_sets=[dvali], feval=feval,
                        callbacks=[lgb.early_stopping(patience, first_metric_only=True, verbose=False)])
    best = booster.best_iteration or len(curve)
    return booster.predict(test.features.numpy(), num_iteration=best), curve, best


def _xgboost(train, vali, test, *, seed, rounds, patience, val_eval):
    import xgboost as xgb

    curve: list[float] = []

    def metric(preds, _):
        curve.append(val_eval.ndcg10(preds))
        return "ndcg@10", curve[-1]

    def matrix(d):
        return xgb.DMatrix(d.features.numpy(), d.labels.numpy(), qid=d.doc_query_index().numpy())

    booster = xgb.train({"objective": "rank:ndcg", "seed": seed, "disable_default_eval_metric": 1},
                        matrix(train), num_boost_round=rounds, evals=[(matrix(vali), "vali")],
                        custom_metric=metric, maximize=True, early_stopping_rounds=patience,
                        verbose_eval=False)
    best = booster.best_iteration + 1
    return booster.predict(matrix(test), iteration_range=(0, best)), curve, best


def _catboost(train, vali, test, *, seed, rounds, patience, val_eval, loss="YetiRank"):
    # CatBoost's Python metrics do not see query groups: grow the full cap, then apply the same
    # stopping rule to the staged vali predictions (its train time covers all `rounds` trees).
    from catboost import CatBoostRanker, Pool

    model = CatBoostRanker(loss_function=loss, iterations=rounds, random_seed=seed, verbose=False)
    model.fit(Pool(train.features.numpy(), train.labels.numpy(), group_id=train.doc_query_index().numpy()))
    curve = [val_eval.ndcg10(p) for p in model.staged_predict(vali.features.numpy(), eval_period=1)]
    best_i, ran = best_round(curve, patience)
    return model.predict(test.features.numpy(), ntree_end=best_i + 1), curve[:ran], best_i + 1


BASELINE_FNS: dict[str, Callable] = {"lightgbm": _lightgbm, "xgboost": _xgboost, "catboost": _catboost,
                                     "catboost-lambdamart": functools.partial(_catboost, loss="LambdaMart")}
BASELINE_LABELS = {"lightgbm": "LightGBM lambdarank", "xgboost": "XGBoost rank:ndcg",
                   "catboost": "CatBoost YetiRank", "catboost-lambdamart": "CatBoost LambdaMart"}
BASELINE_PACKAGES = {name: name.split("-")[0] for name in BASELINES}


def train_baseline(name: str, train, vali, test_eval, *, seed: int, rounds: int, patience: int,
                   val_eval) -> dict:
    """Train baseline ``name``; its test metrics by ``test_eval`` (a protocol.Evaluator)."""
    t0 = time.perf_counter()
    scores, curve, best = BASELINE_FNS[name](train, vali, test_eval.dataset, seed=seed, rounds=rounds,
                                             patience=patience, val_eval=val_eval)
    seconds = time.perf_counter() - t0
    # `best` is the number of trees kept (LightGBM's best_iteration); recorded as the 0-based index.
    return {"train_seconds": seconds, "epochs": len(curve), "best_epoch": int(best) - 1, "val_curve": curve,
            "export_path": None, "export_bytes": None, **test_eval.metrics(torch.as_tensor(scores))}
