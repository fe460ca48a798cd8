"""Drop-in rankers for scripts written for LightGBM or XGBoost: change the import, train rankkit.

    import rankkit.compat as lgb                     # was: import lightgbm as lgb
    model = lgb.LGBMRanker(n_estimators=500, num_leaves=31, learning_rate=0.05)
    model.fit(X, y, group=group, eval_set=[(X_val, y_val)], eval_group=[group_val], eval_at=[10],
              callbacks=[lgb.early_stopping(50), lgb.log_evaluation(100)])
    scores = model.predict(X_test)

    import rankkit.compat as xgb                     # was: import xgboost as xgb
    model = xgb.XGBRanker(n_estimators=500, max_depth=6, early_stopping_rounds=50)
    model.fit(X, y, qid=qid, eval_set=[(X_val, y_val)], eval_qid=[qid_val])

:class:`LGBMRanker` and :class:`XGBRanker` take their library's constructor, ``fit`` and
``predict`` arguments and give its fitted attributes (``best_iteration_``, ``best_score_``,
``evals_result_``, ``feature_importances_``, ...) with the same types and meaning; they train
:class:`rankkit.boosting.LambdaMART` (``booster_``). Every parameter either maps to a LambdaMART
setting (the table in docs/compat.md, from :data:`LGBM_PARAMETERS` and :data:`XGB_PARAMETERS`)
or, where rankkit has no equivalent, is accepted only at the library's default and otherwise
refused with one line naming the nearest rankkit setting: none is silently ignored.

What differs, by design: the trees are oblivious (every node of a level splits on one feature
and threshold), so ``num_leaves`` becomes the depth that holds that many leaves; ``subsample``
draws queries, not rows. The models are rankkit's, not copies of the library's (on MQ2008 the
two score alike: docs/compat.md).

The callbacks (:func:`early_stopping`, :func:`log_evaluation`, :func:`record_evaluation`) are
LightGBM's; LightGBM's and XGBoost's own callback objects work too (their early stopping is
read from its settings, any other callback is called each round with a
:class:`CallbackEnv`, LightGBM's record of a round).
"""
from __future__ import annotations

import inspect
import math
import sys
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import numpy as np
import torch
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from rankkit.boosting._inputs import FeatureMatrix, query_sizes, vector
from rankkit.boosting.booster import LambdaMART, ranker_tags
from rankkit.boosting.ensemble import ObliviousEnsemble  # noqa: F401 -- also for tests and users
from rankkit.boosting.objectives import make_metric
from rankkit.infra.checks import check_int
from rankkit.infra.threads import threads

__all__ = ["LGBMRanker", "XGBRanker", "early_stopping", "log_evaluation", "record_evaluation",
           "EarlyStopException", "CallbackEnv", "LGBM_PARAMETERS", "XGB_PARAMETERS"]

#: The deepest oblivious tree rankkit grows (BoosterConfig.depth's range).
MAX_DEPTH = 12


# -- callbacks, as LightGBM spells them ----------------------------------------------------------
class CallbackEnv(NamedTuple):
    """What a LightGBM callback receives after each round (``lightgbm.callback.CallbackEnv``)."""

    model: Any
    params: dict
    iteration: int
    begin_iteration: int
    end_iteration: int
    evaluation_result_list: list


class EarlyStopException(Exception):
    """Raised by a callback to stop training (LightGBM's), with the 0-based best iteration."""

    def __init__(self, best_iteration: int, best_score: list):
        super().__init__()
        self.best_iteration = best_iteration
        self.best_score = best_score


@dataclass
class _EarlyStopping:
    """LightGBM's early stopping rule: each (eval set, metric) pair keeps its best; the first
    pair of a validation set (the training set never counts) that has not improved by more than
    ``min_delta`` for ``stopping_rounds`` rounds stops the fit at its best round; at the last
    round, the first validation pair's best decides."""

    stopping_rounds: int
    first_metric_only: bool = False
    verbose: bool = True
    min_delta: float = 0.0
    best: list = field(default_factory=list)

    def __post_init__(self):
        if not isinstance(self.stopping_rounds, int) or isinstance(self.stopping_rounds, bool) \
                or self.stopping_rounds < 1:
            raise ValueError(f"`stopping_rounds` has to be an integer >= 1, got {self.stopping_rounds!r}")

    def __call__(self, env: CallbackEnv) -> None:
        results = env.evaluation_result_list
        if not self.best:
            if not any(r[0] != "training" for r in results):
                raise ValueError("For early stopping, at least one dataset and eval metric is required for "
                                 "evaluation: pass an eval_set other than the training data")
            self.best = [(-math.inf if r[3] else math.inf, -1, results) for r in results]
        first_metric = results[0][1]
        for i, (data, metric, value, higher) in enumerate(results):
            best, at, _ = self.best[i]
            if (value > best + self.min_delta) if higher else (value < best - self.min_delta):
                self.best[i] = (value, env.iteration, results)
            if data == "training" or (self.first_metric_only and metric != first_metric):
                continue
            best, at, at_results = self.best[i]
            if env.iteration - at >= self.stopping_rounds or env.iteration == env.end_iteration - 1:
                if self.verbose:
                    why = "Early stopping" if env.iteration - at >= self.stopping_rounds else \
                        "Did not meet early stopping"
                    print(f"{why}, best iteration is:\n[{at + 1}]\t" + _format(at_results), file=sys.stderr)
                raise EarlyStopException(at, at_results)


def early_stopping(stopping_rounds: int, first_metric_only: bool = False, verbose: bool = True,
                   min_delta: float = 0.0) -> _EarlyStopping:
    """LightGBM's ``lightgbm.early_stopping``: stop when no validation metric has improved for
    ``stopping_rounds`` rounds, and keep the trees up to the best one."""
    return _EarlyStopping(stopping_rounds, first_metric_only, verbose, min_delta)


def log_evaluation(period: int = 1, show_stdv: bool = True) -> Callable[[CallbackEnv], None]:
    """LightGBM's ``lightgbm.log_evaluation``: print the eval results every ``period`` rounds."""
    def log(env: CallbackEnv) -> None:
        if period > 0 and env.evaluation_result_list and (env.iteration + 1) % period == 0:
            print(f"[{env.iteration + 1}]\t" + _format(env.evaluation_result_list), file=sys.stderr)
    log.period = period
    return log


def record_evaluation(eval_result: dict) -> Callable[[CallbackEnv], None]:
    """LightGBM's ``lightgbm.record_evaluation``: fill ``eval_result`` as ``evals_result_``."""
    if not isinstance(eval_result, dict):
        raise TypeError("eval_result should be a dictionary")
    eval_result.clear()

    def record(env: CallbackEnv) -> None:
        for data, metric, value, _ in env.evaluation_result_list:
            eval_result.setdefault(data, OrderedDict()).setdefault(metric, []).append(value)
    return record


def _format(results: list) -> str:
    return "\t".join(f"{data}'s {metric}: {value:g}" for data, metric, value, _ in results)


# -- the parameter tables ------------------------------------------------------------------------
@dataclass(frozen=True)
class Parameter:
    """One library parameter: where it goes in rankkit, or why it has no equivalent.

    ``maps`` names the LambdaMART setting (or the compat class's own behaviour) it sets;
    ``accepts`` lists the only values taken where rankkit has no equivalent (the library's
    defaults), ``nearest`` the rankkit setting named when any other value is refused.
    """

    default: Any
    maps: str
    accepts: tuple = ()
    nearest: str = ""

    @property
    def refused_otherwise(self) -> bool:
        return bool(self.accepts)


def _no(default, nearest: str, *also) -> Parameter:
    return Parameter(default, "", (default,) + also, nearest)


#: LightGBM's LGBMRanker constructor parameters, and what each becomes.
LGBM_PARAMETERS: dict[str, Parameter] = {
    "boosting_type": _no("gbdt", "rankkit boosts gradient trees only (`LambdaMART`)"),
    "num_leaves": Parameter(31, "`depth` = ceil(log2(num_leaves)), the oblivious depth that holds that many leaves"),
    "max_depth": Parameter(-1, "`depth` = min(max_depth, the depth of num_leaves); <= 0: no limit"),
    "learning_rate": Parameter(0.1, "`learning_rate`"),
    "n_estimators": Parameter(100, "`n_estimators`"),
    "subsample_for_bin": _no(200000, "rankkit's binning samples 200,000 rows (`QuantileBinner(sample=)`)"),
    "objective": Parameter(None, "`objective`: None/'lambdarank' -> 'lambdarank', 'rank_xendcg' -> 'xendcg', "
                                 "a callable -> a custom objective (LightGBM's signature)"),
    "class_weight": _no(None, "`sample_weight` in fit (ranking has no classes)"),
    "min_split_gain": _no(0.0, "`min_sum_hessian` or `l2` (rankkit has no minimum split gain)"),
    "min_child_weight": Parameter(1e-3, "`min_sum_hessian`"),
    "min_child_samples": Parameter(20, "`min_data_in_leaf`"),
    "subsample": Parameter(1.0, "`subsample` when subsample_freq = 1 (queries drawn per tree, not rows)"),
    "subsample_freq": Parameter(0, "0: no bagging (subsample is then unused, as in LightGBM); 1: every tree"),
    "colsample_bytree": Parameter(1.0, "`colsample`"),
    "reg_alpha": _no(0.0, "`l2` (rankkit has no L1 penalty)"),
    "reg_lambda": Parameter(0.0, "`l2`"),
    "random_state": Parameter(None, "`random_state` (an int; None: seed 0)"),
    "n_jobs": Parameter(None, "`n_jobs`"),
    "importance_type": Parameter("split", "`feature_importances_`: 'split' (counts) or 'gain' (total gain)"),
    # LightGBM parameters passed as keyword arguments (**kwargs)
    "lambdarank_truncation_level": Parameter(30, "`k`"),
    "lambdarank_norm": Parameter(True, "`normalize`"),
    "sigmoid": Parameter(1.0, "`sigma`"),
    "label_gain": Parameter(None, "`gain`: None or 2^i - 1 -> 'exp', i -> 'linear'"),
    "max_bin": Parameter(255, "`max_bins` (at most 255; rankkit's bins include the missing-value bin)"),
    "use_quantized_grad": Parameter(False, "`quantized_grad`"),
    "num_grad_quant_bins": Parameter(4, "`num_grad_quant_bins`"),
    "early_stopping_round": Parameter(None, "an early_stopping callback with these rounds"),
    "first_metric_only": Parameter(False, "the early_stopping callback's `first_metric_only`"),
    "early_stopping_min_delta": Parameter(0.0, "the early_stopping callback's `min_delta`"),
    "metric": Parameter(None, "the eval metrics: 'ndcg', 'map' (at each of eval_at) or '' / 'None'"),
    "eval_at": Parameter(None, "fit's `eval_at`"),
    "verbosity": Parameter(None, "`verbose` = 1 (a progress bar) when > 1, else 0"),
    "device_type": Parameter("cpu", "`device`: 'cpu' or 'cuda' / 'gpu' -> 'cuda'"),
    "lambdarank_position_bias_regularization": Parameter(0.0, "`position_bias_regularization`"),
    "deterministic": Parameter(False, "nothing to do: a rankkit fit is deterministic for a seed"),
    "force_col_wise": Parameter(False, "nothing to do: rankkit has one histogram layout"),
    "force_row_wise": Parameter(False, "nothing to do: rankkit has one histogram layout"),
    "feature_pre_filter": Parameter(True, "nothing to do: rankkit drops constant features itself"),
    "min_data_in_bin": _no(3, "`max_bins`"),
    "max_cat_to_onehot": _no(4, "encode categories as numbers (rankkit has no categorical splits)"),
    "categorical_feature": _no(None, "encode categories as numbers (rankkit has no categorical splits)", "auto"),
    "extra_trees": _no(False, "`random_strength`"),
    "path_smooth": _no(0.0, "`l2`"),
    "max_delta_step": _no(0.0, "`learning_rate`"),
    "bagging_seed": _no(3, "`random_state` (one seed)"),
    "feature_fraction_seed": _no(2, "`random_state` (one seed)"),
    "feature_fraction_bynode": _no(1.0, "`colsample` (per tree)"),
    "linear_tree": _no(False, "`depth` (rankkit's leaves are constants)"),
    "monotone_constraints": _no(None, "none: rankkit has no monotone constraints"),
    "interaction_constraints": _no(None, "none: rankkit has no interaction constraints"),
    "lambdarank_target": _no("ndcg", "`objective`"),
}

#: LightGBM's aliases (its Parameters page) of the names above.
LGBM_ALIASES = {
    **dict.fromkeys(("num_iteration", "num_iterations", "n_iter", "num_tree", "num_trees", "num_round",
                     "num_rounds", "nrounds", "num_boost_round", "max_iter"), "n_estimators"),
    **dict.fromkeys(("shrinkage_rate", "eta"), "learning_rate"),
    **dict.fromkeys(("num_leaf", "max_leaves", "max_leaf", "max_leaf_nodes"), "num_leaves"),
    **dict.fromkeys(("min_data_in_leaf", "min_data_per_leaf", "min_data", "min_samples_leaf"), "min_child_samples"),
    **dict.fromkeys(("min_sum_hessian_in_leaf", "min_sum_hessian_per_leaf", "min_sum_hessian",
                     "min_hessian"), "min_child_weight"),
    **dict.fromkeys(("bagging_fraction", "sub_row", "bagging", "bagging_fraction"), "subsample"),
    **dict.fromkeys(("bagging_freq",), "subsample_freq"),
    **dict.fromkeys(("feature_fraction", "sub_feature", "colsample_bytree"), "colsample_bytree"),
    **dict.fromkeys(("lambda_l1", "l1_regularization"), "reg_alpha"),
    **dict.fromkeys(("lambda_l2", "l2_regularization", "lambda"), "reg_lambda"),
    **dict.fromkeys(("min_gain_to_split",), "min_split_gain"),
    **dict.fromkeys(("seed", "random_seed"), "random_state"),
    **dict.fromkeys(("num_threads", "num_thread", "nthread", "nthreads"), "n_jobs"),
    **dict.fromkeys(("verbose",), "verbosity"),
    **dict.fromkeys(("boosting", "boost"), "boosting_type"),
    **dict.fromkeys(("objective_type", "app", "application", "loss"), "objective"),
    **dict.fromkeys(("max_bins",), "max_bin"),
    **dict.fromkeys(("early_stopping_rounds", "early_stopping", "n_iter_no_change"), "early_stopping_round"),
    **dict.fromkeys(("metrics", "metric_types"), "metric"),
    **dict.fromkeys(("ndcg_eval_at", "ndcg_at", "map_eval_at", "map_at"), "eval_at"),
    **dict.fromkeys(("device",), "device_type"),
    **dict.fromkeys(("cat_feature", "categorical_column", "cat_column", "categorical_features"),
                    "categorical_feature"),
}

#: XGBoost's XGBRanker constructor parameters (None: XGBoost's default), and what each becomes.
XGB_PARAMETERS: dict[str, Parameter] = {
    "objective": Parameter("rank:ndcg", "`objective`: 'rank:ndcg' -> 'lambdarank', 'rank:map' -> 'lambdarank' "
                                        "with weighting 'map', 'rank:pairwise' -> 'ranknet', a callable -> a custom "
                                        "objective"),
    "n_estimators": Parameter(None, "`n_estimators` (None: 100)"),
    "max_depth": Parameter(None, "`depth` (None: 6; 0: refused, rankkit trees have a depth)"),
    "max_leaves": Parameter(None, "`depth` <= ceil(log2(max_leaves)) (None or 0: no limit)"),
    "max_bin": Parameter(None, "`max_bins` = min(max_bin, 255) (None: 256, so 255)"),
    "grow_policy": _no(None, "`depth` (oblivious trees grow level by level)", "depthwise"),
    "learning_rate": Parameter(None, "`learning_rate` (None: 0.3)"),
    "verbosity": Parameter(None, "`verbose` = 1 (a progress bar) when >= 2, else 0"),
    "booster": _no(None, "`LambdaMART` (gradient trees only)", "gbtree"),
    "tree_method": _no(None, "rankkit's histograms are XGBoost's 'hist'", "hist", "auto"),
    "n_jobs": Parameter(None, "`n_jobs`"),
    "gamma": _no(None, "`min_sum_hessian` or `l2` (rankkit has no minimum split loss)", 0, 0.0),
    "min_child_weight": Parameter(None, "`min_sum_hessian` (None: 1)"),
    "max_delta_step": _no(None, "`learning_rate`", 0, 0.0),
    "subsample": Parameter(None, "`subsample` (queries drawn per tree, not rows; None: 1)"),
    "sampling_method": _no(None, "`subsample`", "uniform"),
    "colsample_bytree": Parameter(None, "`colsample` (None: 1)"),
    "colsample_bylevel": _no(None, "`colsample` (per tree)", 1, 1.0),
    "colsample_bynode": _no(None, "`colsample` (per tree)", 1, 1.0),
    "reg_alpha": _no(None, "`l2` (rankkit has no L1 penalty)", 0, 0.0),
    "reg_lambda": Parameter(None, "`l2` (None: 1)"),
    "scale_pos_weight": _no(None, "`sample_weight` in fit", 1, 1.0),
    "base_score": _no(None, "fit's `base_margin` (a per-document initial score)"),
    "random_state": Parameter(None, "`random_state` (an int; None: seed 0)"),
    "missing": Parameter(float("nan"), "NaN only: rankkit reads NaN as missing"),
    "num_parallel_tree": _no(None, "`n_estimators` (one tree per round)", 1),
    "monotone_constraints": _no(None, "none: rankkit has no monotone constraints"),
    "interaction_constraints": _no(None, "none: rankkit has no interaction constraints"),
    "importance_type": Parameter(None, "`feature_importances_`: 'gain' (None; mean gain per split), "
                                       "'total_gain' or 'weight' (split counts), normalised to sum 1"),
    "device": Parameter(None, "`device`: None/'cpu' -> 'cpu', 'cuda'/'gpu' -> 'cuda'"),
    "validate_parameters": Parameter(None, "nothing to do: rankkit always validates"),
    "enable_categorical": _no(False, "encode categories as numbers (rankkit has no categorical splits)"),
    "feature_types": _no(None, "encode categories as numbers (rankkit has no categorical splits)"),
    "feature_weights": _no(None, "`colsample` (uniform)"),
    "max_cat_to_onehot": _no(None, "encode categories as numbers (rankkit has no categorical splits)"),
    "max_cat_threshold": _no(None, "encode categories as numbers (rankkit has no categorical splits)"),
    "multi_strategy": _no(None, "one output per document", "one_output_per_tree"),
    "eval_metric": Parameter(None, "the eval metrics: 'ndcg', 'ndcg@k', 'map', 'map@k', a list of them or a "
                                   "callable (None: ndcg@k of the truncation)"),
    "early_stopping_rounds": Parameter(None, "early stopping on the last metric of the last eval set"),
    "callbacks": Parameter(None, "XGBoost's EarlyStopping is read; other callbacks are called each round"),
    # XGBoost parameters passed as keyword arguments (**kwargs)
    "lambdarank_pair_method": _no(None, "`k` (rankkit's pairs are every pair or the top-k truncation)", "topk"),
    "lambdarank_num_pair_per_sample": Parameter(None, "`k`, the truncation (None: 32)"),
    "ndcg_exp_gain": Parameter(None, "`gain`: True/None -> 'exp', False -> 'linear'"),
    "lambdarank_normalization": _no(None, "`normalize` (LightGBM's normalisation, not XGBoost's)", True),
    "lambdarank_score_normalization": _no(None, "`normalize`", True),
    "lambdarank_unbiased": _no(None, "`unbiased` with the positions in fit (LambdaMART)", False),
    "lambdarank_bias_norm": _no(None, "`bias_p` (LambdaMART(unbiased=True))"),
}

XGB_ALIASES = {"eta": "learning_rate", "seed": "random_state", "nthread": "n_jobs", "lambda": "reg_lambda",
               "alpha": "reg_alpha", "min_split_loss": "gamma", "num_boost_round": "n_estimators"}


def _refuse_unknown(name: str, known, library: str) -> None:
    import difflib

    near = difflib.get_close_matches(name, list(known), n=1)
    hint = f" (did you mean `{near[0]}`?)" if near else ""
    raise ValueError(f"`{name}` is not a {library} parameter rankkit knows{hint}; docs/compat.md lists every "
                     f"parameter and the LambdaMART setting it maps to")


def _canonical(params: dict, table: dict, aliases: dict, library: str) -> dict:
    """``params`` under their canonical names, every name known, no two spellings disagreeing."""
    out, spelled = {}, {}
    for name, value in params.items():
        canonical = aliases.get(name, name)
        if canonical not in table:
            _refuse_unknown(name, list(table) + list(aliases), library)
        if canonical in out and not _same(out[canonical], value):
            default = table[canonical].default
            if _same(out[canonical], default):  # an alias given beside the named argument at its default
                out[canonical], spelled[canonical] = value, name
                continue
            if not _same(value, default):
                raise ValueError(f"`{name}={value!r}` and `{spelled[canonical]}={out[canonical]!r}` are one "
                                 f"{library} parameter; give one")
            continue
        out[canonical], spelled[canonical] = value, name
    for name, value in out.items():
        p = table[name]
        if p.refused_otherwise and not any(_same(value, a) for a in p.accepts):
            raise ValueError(f"`{spelled[name]}={value!r}` has no rankkit equivalent (only {p.accepts[0]!r} is "
                             f"accepted); nearest: {p.nearest}")
    return out


def _same(a, b) -> bool:
    """Whether two parameter values are the same setting (True is not 1; NaN is NaN)."""
    if a is b:
        return True
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b)
    except (TypeError, ValueError):  # arrays and other values without one truth value
        return False


def _depth_of_leaves(leaves, name: str) -> int:
    depth = max(1, math.ceil(math.log2(check_int(leaves, name, low=2))))
    if depth > MAX_DEPTH:
        raise ValueError(f"`{name}={leaves}` needs depth {depth}; rankkit's oblivious trees go to depth "
                         f"{MAX_DEPTH} ({1 << MAX_DEPTH} leaves): use at most {1 << MAX_DEPTH}")
    return depth


def _device(value, name: str) -> str:
    text = "cpu" if value is None else str(value).lower()
    if text == "cpu":
        return "cpu"
    if text in ("gpu", "cuda") or text.startswith("cuda:"):
        return "cuda" if text == "gpu" else text
    raise ValueError(f"`{name}` has to be 'cpu', 'cuda' or 'gpu', got {value!r}")


def _verbose(value) -> int:
    return 0 if value is None else int(value > 1)


# -- the settings of each library, in rankkit's terms --------------------------------------------
_XENDCG = ("rank_xendcg", "xendcg", "xe_ndcg", "xe_ndcg_mart", "xendcg_mart")
_LGBM_METRICS = {"ndcg": "ndcg", "lambdarank": "ndcg", "rank_xendcg": "ndcg", "xendcg": "ndcg",
                 "map": "map", "mean_average_precision": "map"}


@dataclass
class _Plan:
    """A compat front end's fit, in rankkit's terms: the LambdaMART settings and the rules the
    front end keeps itself (metrics, early stopping, importances)."""

    booster: dict
    metrics: list
    stoppers: list
    importance_type: str
    verbose: bool = False


def _lgbm_plan(params: dict, fit_eval_metric, fit_eval_at) -> _Plan:
    given = _canonical(params, LGBM_PARAMETERS, LGBM_ALIASES, "LightGBM")
    p = {name: q.default for name, q in LGBM_PARAMETERS.items()} | given
    depth = _depth_of_leaves(p["num_leaves"], "num_leaves")
    if p["max_depth"] is not None and p["max_depth"] > 0:
        depth = min(depth, check_int(p["max_depth"], "max_depth"))
    booster = dict(depth=depth, learning_rate=p["learning_rate"], n_estimators=p["n_estimators"],
                   min_sum_hessian=p["min_child_weight"], min_data_in_leaf=p["min_child_samples"],
                   subsample=p["subsample"] if check_int(p["subsample_freq"], "subsample_freq", low=0) else 1.0,
                   colsample=p["colsample_bytree"], l2=p["reg_lambda"],
                   random_state=p["random_state"], n_jobs=p["n_jobs"],
                   max_bins=_max_bins(p["max_bin"], "max_bin", 255), quantized_grad=p["use_quantized_grad"],
                   num_grad_quant_bins=p["num_grad_quant_bins"], verbose=_verbose(p["verbosity"]),
                   device=_device(p["device_type"], "device_type"),
                   position_bias_regularization=p["lambdarank_position_bias_regularization"])
    if p["subsample_freq"] > 1:
        raise ValueError(f"`subsample_freq={p['subsample_freq']}`: rankkit draws a new sample for every tree; "
                         f"use subsample_freq=1 (nearest: `subsample`)")
    booster |= _lgbm_objective(p, given)
    if p["importance_type"] not in ("split", "gain"):
        raise ValueError(f"`importance_type` has to be 'split' or 'gain', got {p['importance_type']!r}")
    eval_at = p["eval_at"] if p["eval_at"] is not None else fit_eval_at
    metrics = _lgbm_metrics(p["metric"], fit_eval_metric, eval_at)
    stoppers = []
    if p["early_stopping_round"] is not None and p["early_stopping_round"] > 0:
        stoppers.append(early_stopping(check_int(p["early_stopping_round"], "early_stopping_round"),
                                       bool(p["first_metric_only"]), p["verbosity"] is None or p["verbosity"] > 0,
                                       float(p["early_stopping_min_delta"])))
    return _Plan(booster, metrics, stoppers, p["importance_type"])


def _lgbm_objective(p: dict, given: dict) -> dict:
    objective = p["objective"]
    pairwise = ("lambdarank_truncation_level", "lambdarank_norm", "sigmoid", "label_gain")
    if callable(objective) or objective in _XENDCG or objective in ("regression", "l2", "mse"):
        for name in pairwise:
            if name in given and not _same(given[name], LGBM_PARAMETERS[name].default):
                raise ValueError(f"`{name}` configures objective='lambdarank'; objective={objective!r} does not "
                                 f"read it")
        if callable(objective):
            return {"objective": objective}
        return {"objective": "xendcg" if objective in _XENDCG else "pointwise"}
    if objective not in (None, "lambdarank"):
        raise ValueError(f"`objective={objective!r}`: LGBMRanker here takes 'lambdarank', 'rank_xendcg', "
                         f"'regression' or a callable (nearest: LambdaMART's `objective`)")
    return dict(objective="lambdarank", k=check_int(p["lambdarank_truncation_level"], "lambdarank_truncation_level"),
                normalize=bool(p["lambdarank_norm"]), sigma=p["sigmoid"], gain=_gain(p["label_gain"]))


def _gain(label_gain) -> str:
    if label_gain is None:
        return "exp"
    values = [float(v) for v in label_gain]
    if values == [2.0 ** i - 1 for i in range(len(values))]:
        return "exp"
    if values == [float(i) for i in range(len(values))]:
        return "linear"
    raise ValueError("`label_gain` has to be 2^i - 1 (LightGBM's default; rankkit gain='exp') or i "
                     "(gain='linear'): rankkit has these two gains")


def _lgbm_metrics(metric, fit_eval_metric, eval_at) -> list:
    names = [] if metric is None else [metric] if isinstance(metric, str) or callable(metric) else list(metric)
    extra = [] if fit_eval_metric is None else \
        [fit_eval_metric] if isinstance(fit_eval_metric, str) or callable(fit_eval_metric) else list(fit_eval_metric)
    if metric is None:
        names = ["ndcg"]
    out, seen = [], set()
    for name in names + extra:
        if callable(name):
            out.append(_CustomMetric(name, "lightgbm"))
            continue
        if name in ("", "None", "na", "null", "custom"):
            continue
        if name not in _LGBM_METRICS:
            raise ValueError(f"`metric={name!r}`: rankkit computes 'ndcg' and 'map' (at each of eval_at) or a "
                             f"callable eval_metric")
        base = _LGBM_METRICS[name]
        for k in eval_at:
            label = f"{base}@{check_int(k, 'eval_at')}"
            if label not in seen:
                seen.add(label)
                out.append(_BuiltinMetric(label))
    return out


def _xgb_plan(params: dict) -> _Plan:
    given = _canonical(params, XGB_PARAMETERS, XGB_ALIASES, "XGBoost")
    p = {name: q.default for name, q in XGB_PARAMETERS.items()} | given
    depth = 6 if p["max_depth"] is None else check_int(p["max_depth"], "max_depth", high=MAX_DEPTH)
    if p["max_leaves"]:
        depth = min(depth, _depth_of_leaves(p["max_leaves"], "max_leaves"))
    missing = p["missing"]
    if not (isinstance(missing, float) and math.isnan(missing)):
        raise ValueError(f"`missing={missing!r}`: rankkit reads NaN as missing; replace that value by NaN in X")
    k = 32 if p["lambdarank_num_pair_per_sample"] is None else \
        check_int(p["lambdarank_num_pair_per_sample"], "lambdarank_num_pair_per_sample")
    booster = dict(depth=depth, learning_rate=_or(p["learning_rate"], 0.3), n_estimators=_or(p["n_estimators"], 100),
                   min_sum_hessian=_or(p["min_child_weight"], 1.0), min_data_in_leaf=1,
                   subsample=_or(p["subsample"], 1.0), colsample=_or(p["colsample_bytree"], 1.0),
                   l2=_or(p["reg_lambda"], 1.0), random_state=p["random_state"],
                   n_jobs=p["n_jobs"], max_bins=_max_bins(_or(p["max_bin"], 256), "max_bin", 256),
                   verbose=_verbose(p["verbosity"]), device=_device(p["device"], "device"))
    booster |= _xgb_objective(p["objective"], k, p["ndcg_exp_gain"])
    importance = _or(p["importance_type"], "gain")
    if importance not in ("gain", "total_gain", "weight"):
        raise ValueError(f"`importance_type={importance!r}`: rankkit records 'gain', 'total_gain' and 'weight' "
                         f"(split counts), not covers")
    metrics = _xgb_metrics(p["eval_metric"], k)
    stoppers = [] if p["early_stopping_rounds"] is None else \
        [_XGBEarlyStopping(check_int(p["early_stopping_rounds"], "early_stopping_rounds"))]
    return _Plan(booster, metrics, stoppers, importance)


def _xgb_objective(objective, k: int, exp_gain) -> dict:
    gain = "exp" if exp_gain in (None, True) else "linear"
    if callable(objective):
        return {"objective": objective}
    if objective == "rank:ndcg":
        return dict(objective="lambdarank", weighting="ndcg", k=k, gain=gain)
    if objective == "rank:map":
        return dict(objective="lambdarank", weighting="map", k=k)
    if objective == "rank:pairwise":
        return dict(objective="ranknet")
    raise ValueError(f"`objective={objective!r}`: XGBRanker here takes 'rank:ndcg', 'rank:map', "
                     f"'rank:pairwise' or a callable (nearest: LambdaMART's `objective`)")


def _xgb_metrics(eval_metric, k: int) -> list:
    if eval_metric is None:
        return [_BuiltinMetric(f"ndcg@{k}")]
    names = [eval_metric] if isinstance(eval_metric, str) or callable(eval_metric) else list(eval_metric)
    out = []
    for name in names:
        if callable(name):
            out.append(_CustomMetric(name, "xgboost"))
            continue
        base, _, cut = str(name).partition("@")
        if base not in ("ndcg", "map") or (cut and not cut.isdigit()):
            raise ValueError(f"`eval_metric={name!r}`: rankkit computes 'ndcg', 'ndcg@k', 'map', 'map@k' or a "
                             f"callable")
        out.append(_BuiltinMetric(str(name)))
    return out


def _or(value, default):
    return default if value is None else value


def _max_bins(value, name: str, library_max: int) -> int:
    value = check_int(value, name, low=3)
    if value > library_max:
        raise ValueError(f"`{name}={value}`: rankkit bins a feature into at most 255 codes (the missing-value "
                         f"bin included; `max_bins`)")
    return min(value, 255)


# -- the metrics and the rounds ------------------------------------------------------------------
class _BuiltinMetric:
    """``ndcg@k`` / ``map@k`` / ``ndcg`` / ``map`` by rankkit's metric (exp gain; a query with
    nothing relevant scores 1, as LightGBM's and XGBoost's default)."""

    def __init__(self, name: str):
        self.name = name
        self.fn = make_metric(name)

    def __call__(self, scores: torch.Tensor, layout) -> list:
        return [(self.name, float(self.fn(scores, layout)), True)]


class _CustomMetric:
    """A user's eval metric: LightGBM's ``f(y_true, y_pred[, weight[, group]]) -> (name, value,
    is_higher_better)`` (or a list of them), or XGBoost's scikit-learn style ``f(y_true, y_pred)
    -> value`` (named by the function, lower is better)."""

    def __init__(self, fn: Callable, library: str):
        self.fn, self.library = fn, library
        try:
            self.argc = len(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            self.argc = 2

    def __call__(self, scores: torch.Tensor, layout) -> list:
        pred = scores.detach().cpu().numpy().astype(np.float64)
        labels = layout.flat(layout.labels).cpu().numpy().astype(np.float64)  # the set's own, in its order
        sizes = layout.offsets.diff().numpy()
        if self.library == "xgboost":
            return [(getattr(self.fn, "__name__", "custom"), float(self.fn(labels, pred)), False)]
        args = (labels, pred, None, sizes)[:max(2, min(self.argc, 4))]
        out = self.fn(*args)
        rows = out if isinstance(out, list) else [out]
        if not all(isinstance(r, tuple) and len(r) == 3 for r in rows):
            raise ValueError(f"eval_metric {getattr(self.fn, '__name__', self.fn)!r} has to return (name, value, "
                             f"is_higher_better) or a list of them (LightGBM's rule), got {out!r}")
        return [(str(n), float(v), bool(h)) for n, v, h in rows]


@dataclass
class _XGBEarlyStopping:
    """XGBoost's early stopping: the last metric (or ``metric_name``) of the last eval set (or
    ``data_name``) has not improved by more than ``min_delta`` for ``rounds`` rounds."""

    rounds: int
    metric_name: str | None = None
    data_name: str | None = None
    maximize: bool | None = None
    save_best: bool = False
    min_delta: float = 0.0
    best: tuple | None = None

    def __call__(self, env: CallbackEnv) -> None:
        rows = [r for r in env.evaluation_result_list
                if (self.data_name is None or r[0] == self.data_name)]
        if not rows:
            raise ValueError("Must have at least 1 validation dataset for early stopping.")
        data = rows[-1][0] if self.data_name is None else self.data_name
        rows = [r for r in rows if r[0] == data and (self.metric_name is None or r[1] == self.metric_name)]
        if not rows:
            raise ValueError(f"early stopping: no metric {self.metric_name!r} on {data!r}")
        _, metric, value, higher = rows[-1]
        higher = higher if self.maximize is None else self.maximize
        if self.best is None or ((value - self.min_delta > self.best[0]) if higher
                                 else (value + self.min_delta < self.best[0])):
            self.best = (value, env.iteration)
        if env.iteration - self.best[1] >= self.rounds:
            raise EarlyStopException(self.best[1], [(data, metric, self.best[0], higher)])


def _from_library_callback(cb):
    """A LightGBM or XGBoost callback object as one of ours (early stopping is read from its
    settings; any other callable is called as it is)."""
    if hasattr(cb, "stopping_rounds"):  # lightgbm.early_stopping(...)
        return early_stopping(cb.stopping_rounds, getattr(cb, "first_metric_only", False),
                              getattr(cb, "verbose", True), getattr(cb, "min_delta", 0.0))
    if hasattr(cb, "rounds") and hasattr(cb, "save_best"):  # xgboost.callback.EarlyStopping(...)
        return _XGBEarlyStopping(cb.rounds, getattr(cb, "metric_name", None), getattr(cb, "data", None),
                                 getattr(cb, "maximize", None), bool(cb.save_best), getattr(cb, "min_delta", 0.0))
    if hasattr(cb, "after_iteration"):  # another xgboost.callback.TrainingCallback
        return _XGBCallback(cb)
    if callable(cb):
        return cb
    raise TypeError(f"`callbacks` has to hold callables (LightGBM) or TrainingCallback objects (XGBoost), got {cb!r}")


class _XGBCallback:
    """An XGBoost ``TrainingCallback``: ``after_iteration(model, epoch, evals_log)`` each round,
    True stops the fit there."""

    def __init__(self, cb):
        self.cb = cb

    def __call__(self, env: CallbackEnv) -> None:
        if self.cb.after_iteration(env.model, env.iteration, env.model.evals_result_):
            raise EarlyStopException(env.iteration, env.evaluation_result_list)


class _Rounds:
    """After each round: every watched set scored with every metric, the callbacks run, and
    whether to stop. ``watched``: (name, None for the training data or the index of the
    booster's eval set)."""

    def __init__(self, model, watched: list, metrics: list, callbacks: list, n_estimators: int):
        self.model, self.watched, self.metrics = model, watched, metrics
        self.callbacks, self.n_estimators = callbacks, n_estimators
        self.history: dict = OrderedDict((name, OrderedDict()) for name, *_ in watched)
        self.last: list = []
        self.stop: EarlyStopException | None = None
        self.stopped_by = None

    def __call__(self, engine) -> bool:
        results = []
        for name, source in self.watched:
            e = None if source is None else engine.eval_sets[source]
            scores, layout = (engine.scores, engine.layout) if e is None else (e.scores, e.layout)
            for metric in self.metrics:
                for metric_name, value, higher in metric(scores, layout):
                    results.append((name, metric_name, value, higher))
                    self.history[name].setdefault(metric_name, []).append(value)
        self.last = results
        env = CallbackEnv(self.model, self.model.get_params(), len(engine.trees) - 1, 0, self.n_estimators, results)
        for cb in self.callbacks:
            try:
                cb(env)
            except Exception as e:  # LightGBM's or ours: stop at its best iteration
                if type(e).__name__ != "EarlyStopException" or not hasattr(e, "best_iteration"):
                    raise
                self.stop, self.stopped_by = e, cb
                return True
        return False


class _Watched(LambdaMART):
    """LambdaMART whose rounds a compat front end watches (``rounds_``) and whose kept trees it
    chooses (``keep_``: a callable of the rounds grown)."""

    def _after_round(self, engine) -> bool:
        return self.rounds_(engine)

    def _kept_trees(self, engine, config) -> int:
        return self.keep_(len(engine.trees))


# -- the estimators ------------------------------------------------------------------------------
class _CompatRanker(BaseEstimator):
    """What both front ends share: the library's ``**kwargs`` in ``get_params``, the training
    through a watched LambdaMART, and predictions over a range of trees."""

    _library = ""

    def get_params(self, deep: bool = True) -> dict:
        params = super().get_params(deep=deep)
        params.update(getattr(self, "_other_params", {}))
        return params

    def set_params(self, **params) -> "_CompatRanker":
        named = set(super().get_params(deep=False))
        for name, value in params.items():
            setattr(self, name, value)
            if name not in named:
                self._other_params[name] = value
        return self

    def _plan(self, **fit_settings) -> _Plan:
        raise NotImplementedError

    def _train(self, plan: _Plan, data: tuple, evals: list, callbacks: list, keep) -> None:
        """Fit a watched LambdaMART. ``data``: (X, y, fit keyword arguments); ``evals``: (name, X, y,
        qid/group keyword, init score) per eval set, X None for the training data itself."""
        X, y, fit_kwargs = data
        booster = _Watched(**plan.booster)
        # The watched sets are the booster's own (its training scores and eval sets): their
        # features, labels and queries are converted once, by LambdaMART.fit.
        watched, eval_set, eval_qid, eval_group, eval_init = [], [], [], [], []
        for name, ex, ey, queries, init in evals:
            watched.append((name, None if ex is None else len(eval_set)))
            if ex is not None:
                eval_set.append((ex, ey))
                eval_qid.append(queries.get("qid"))
                eval_group.append(queries.get("group"))
                eval_init.append(init)
        rounds = _Rounds(self, watched, plan.metrics if watched else [],
                         plan.stoppers + [_from_library_callback(cb) for cb in callbacks or []],
                         booster.n_estimators)
        booster.rounds_, booster.keep_ = rounds, lambda grown: keep(rounds, grown)
        self.evals_result_ = rounds.history  # filled round by round: what a callback reads
        booster.fit(X, y, **fit_kwargs, eval_set=eval_set or None,
                    eval_qid=eval_qid if any(q is not None for q in eval_qid) else None,
                    eval_group=eval_group if any(g is not None for g in eval_group) else None,
                    eval_init_score=eval_init if any(v is not None for v in eval_init) else None)
        del booster.rounds_, booster.keep_
        self.booster_, self.rounds_ = booster, rounds
        self.evals_result_ = rounds.history
        self.n_features_in_ = booster.n_features_in_
        if hasattr(booster, "feature_names_in_"):
            self.feature_names_in_ = booster.feature_names_in_
        elif hasattr(self, "feature_names_in_"):
            del self.feature_names_in_

    def _predict_range(self, X, start: int, stop: int) -> np.ndarray:
        """Scores [N] (numpy float32) of trees ``start`` .. ``stop`` - 1 (and the constant F_0)."""
        e = self.booster_.ensemble_
        part = ObliviousEnsemble(e.n_features, e.features[start:stop], e.thresholds[start:stop],
                                 e.leaf_values[start:stop], float(e.bias))
        with threads(self.booster_.n_jobs):
            return self.booster_._scores(FeatureMatrix(X, "X"), part).numpy()

    @property
    def n_estimators_(self) -> int:
        """The trees in the model."""
        check_is_fitted(self, "booster_")
        return int(self.booster_.ensemble_.n_trees)

    def __sklearn_tags__(self):
        return ranker_tags(super().__sklearn_tags__())


def _eval_name(names, i: int, default: str) -> str:
    return default if names is None else str(names[i])


class LGBMRanker(_CompatRanker):
    """``lightgbm.LGBMRanker``'s interface on rankkit's LambdaMART.

    Takes LightGBM's constructor arguments (and its parameters and their aliases as keyword
    arguments): :data:`LGBM_PARAMETERS` says what each becomes. The defaults are LightGBM's:
    31 leaves (depth 5), η 0.1, 100 trees, ``reg_lambda`` 0, truncation 30, LightGBM's lambda
    normalisation, NDCG@1..5 on every eval set.

    Attributes (after :meth:`fit`, as LightGBM's): ``best_iteration_`` (1-based, 0 without
    early stopping), ``best_score_`` (``{set: {metric: value}}``), ``evals_result_``,
    ``feature_importances_`` (``importance_type``), ``n_estimators_``, ``n_iter_``,
    ``n_features_in_``, ``n_features_``, ``feature_name_``, ``objective_``; ``booster_`` is the
    rankkit :class:`~rankkit.boosting.LambdaMART` (``save``, export), not a ``lightgbm.Booster``.
    """

    _library = "LightGBM"

    def __init__(self, *, boosting_type="gbdt", num_leaves=31, max_depth=-1, learning_rate=0.1, n_estimators=100,
                 subsample_for_bin=200000, objective=None, class_weight=None, min_split_gain=0.0,
                 min_child_weight=1e-3, min_child_samples=20, subsample=1.0, subsample_freq=0, colsample_bytree=1.0,
                 reg_alpha=0.0, reg_lambda=0.0, random_state=None, n_jobs=None, importance_type="split", **kwargs):
        self.boosting_type, self.num_leaves, self.max_depth = boosting_type, num_leaves, max_depth
        self.learning_rate, self.n_estimators, self.subsample_for_bin = learning_rate, n_estimators, subsample_for_bin
        self.objective, self.class_weight, self.min_split_gain = objective, class_weight, min_split_gain
        self.min_child_weight, self.min_child_samples = min_child_weight, min_child_samples
        self.subsample, self.subsample_freq, self.colsample_bytree = subsample, subsample_freq, colsample_bytree
        self.reg_alpha, self.reg_lambda, self.random_state = reg_alpha, reg_lambda, random_state
        self.n_jobs, self.importance_type = n_jobs, importance_type
        self._other_params = dict(kwargs)
        for name, value in kwargs.items():
            setattr(self, name, value)

    def fit(self, X, y, sample_weight=None, init_score=None, group=None, eval_set=None, eval_names=None,
            eval_sample_weight=None, eval_init_score=None, eval_group=None, eval_metric=None,
            eval_at=(1, 2, 3, 4, 5), feature_name="auto", categorical_feature="auto", callbacks=None,
            init_model=None, *, eval_X=None, eval_y=None) -> "LGBMRanker":
        """LightGBM's ``LGBMRanker.fit``: ``group`` is required; an eval set that *is* ``(X, y)``
        is scored as ``"training"`` (and never decides early stopping)."""
        for name, value in (("eval_sample_weight", eval_sample_weight), ("init_model", init_model)):
            if value is not None:
                raise ValueError(f"`{name}` has no rankkit equivalent (rankkit's eval metrics are unweighted; "
                                 f"to continue a model, pass its scores as init_score)")
        if not (categorical_feature == "auto" or (isinstance(categorical_feature, (list, tuple))
                                                  and not categorical_feature)):
            raise ValueError("`categorical_feature`: rankkit has no categorical splits; encode categories as "
                             "numbers")
        if group is None:
            raise ValueError("Should set group for ranking task")
        if eval_X is not None:
            eval_set = list(zip(*(eval_X, eval_y))) if isinstance(eval_X, tuple) else [(eval_X, eval_y)]
        plan = _lgbm_plan(self.get_params(), eval_metric, eval_at)
        evals = []
        for i, (ex, ey) in enumerate(eval_set or []):
            if ex is X and ey is y:
                evals.append(("training", None, None, {}, None))
                continue
            if eval_group is None or len(eval_group) <= i or eval_group[i] is None:
                raise ValueError("Should set group for all eval datasets for ranking task; "
                                 "if you use dict, the index should start from 0")
            init = None if eval_init_score is None else eval_init_score[i]
            evals.append((_eval_name(eval_names, i, f"valid_{i}"), ex, ey, {"group": eval_group[i]}, init))
        fit_kwargs = {"group": group, "sample_weight": sample_weight, "init_score": init_score}
        self._train(plan, (X, y, fit_kwargs), evals, callbacks, _lgbm_keep)
        rounds = self.rounds_
        stopped = rounds.stop is not None and isinstance(rounds.stopped_by, _EarlyStopping)
        self.best_iteration_ = rounds.stop.best_iteration + 1 if stopped else 0
        best = rounds.stop.best_score if stopped else rounds.last
        self.best_score_ = defaultdict(OrderedDict)
        for data, metric, value, _ in best:
            self.best_score_[data][metric] = value
        self.importance_type_ = plan.importance_type
        n = self.n_features_in_
        self.feature_name_ = [str(c) for c in getattr(self, "feature_names_in_", [])] or \
            (list(feature_name) if feature_name != "auto" else [f"Column_{i}" for i in range(n)])
        self.objective_ = plan.booster["objective"]
        return self

    def predict(self, X, raw_score=False, start_iteration=0, num_iteration=None, pred_leaf=False,
                pred_contrib=False, validate_features=False, **kwargs) -> np.ndarray:
        """LightGBM's ``predict``: the scores of trees ``start_iteration`` .. ``start_iteration +
        num_iteration`` (None or <= 0: to the last kept tree)."""
        check_is_fitted(self, "booster_")
        if pred_leaf or pred_contrib:
            raise ValueError(f"`{'pred_leaf' if pred_leaf else 'pred_contrib'}=True`: rankkit predicts scores "
                             f"only (nearest: `booster_.ensemble_`, the trees as tensors)")
        if kwargs:
            _refuse_unknown(next(iter(kwargs)), ["raw_score", "start_iteration", "num_iteration"], "predict")
        n = self.n_estimators_
        start = check_int(start_iteration, "start_iteration", low=0)
        stop = n if num_iteration is None or num_iteration <= 0 else \
            min(n, start + check_int(num_iteration, "num_iteration"))
        return self._predict_range(X, min(start, n), stop)

    @property
    def n_iter_(self) -> int:
        return self.n_estimators_

    @property
    def n_features_(self) -> int:
        check_is_fitted(self, "booster_")
        return self.n_features_in_

    @property
    def feature_importances_(self) -> np.ndarray:
        """[F] split counts (int32, ``importance_type="split"``) or total gains (float64, ``"gain"``)."""
        check_is_fitted(self, "booster_")
        if self.importance_type_ == "gain":
            return self.booster_.feature_importance_gain_.astype(np.float64)
        return self.booster_.feature_importance_split_.astype(np.int32)


def _lgbm_keep(rounds: _Rounds, grown: int) -> int:
    """LightGBM keeps the trees up to the early-stopping best iteration, else all."""
    if rounds.stop is not None and isinstance(rounds.stopped_by, _EarlyStopping):
        return rounds.stop.best_iteration + 1
    return grown


class XGBRanker(_CompatRanker):
    """``xgboost.XGBRanker``'s interface on rankkit's LambdaMART.

    Takes XGBoost's constructor arguments (None means XGBoost's default; its ranking parameters
    as keyword arguments): :data:`XGB_PARAMETERS` says what each becomes. The defaults are
    XGBoost's: depth 6, η 0.3, 100 trees, ``reg_lambda`` 1, ``min_child_weight`` 1, truncation
    32, NDCG@32 on every eval set.

    Attributes (after :meth:`fit`, as XGBoost's): ``best_iteration`` (0-based) and
    ``best_score`` with early stopping (AttributeError otherwise), :meth:`evals_result`,
    ``feature_importances_`` (normalised, float32), ``n_features_in_``, :meth:`get_booster` (the
    rankkit :class:`~rankkit.boosting.LambdaMART`). Every grown tree is kept; :meth:`predict`
    uses those up to the best iteration unless ``iteration_range`` says otherwise.
    """

    _library = "XGBoost"

    def __init__(self, *, objective="rank:ndcg", n_estimators=None, max_depth=None, max_leaves=None, max_bin=None,
                 grow_policy=None, learning_rate=None, verbosity=None, booster=None, tree_method=None, n_jobs=None,
                 gamma=None, min_child_weight=None, max_delta_step=None, subsample=None, sampling_method=None,
                 colsample_bytree=None, colsample_bylevel=None, colsample_bynode=None, reg_alpha=None,
                 reg_lambda=None, scale_pos_weight=None, base_score=None, random_state=None, missing=float("nan"),
                 num_parallel_tree=None, monotone_constraints=None, interaction_constraints=None,
                 importance_type=None, device=None, validate_parameters=None, enable_categorical=False,
                 feature_types=None, feature_weights=None, max_cat_to_onehot=None, max_cat_threshold=None,
                 multi_strategy=None, eval_metric=None, early_stopping_rounds=None, callbacks=None, **kwargs):
        values = dict(locals())
        for name in ("self", "kwargs", "__class__"):
            values.pop(name, None)
        for name, value in values.items():
            setattr(self, name, value)
        self._other_params = dict(kwargs)
        for name, value in kwargs.items():
            setattr(self, name, value)

    def fit(self, X, y, *, group=None, qid=None, sample_weight=None, base_margin=None, eval_set=None,
            eval_group=None, eval_qid=None, verbose=False, xgb_model=None, sample_weight_eval_set=None,
            base_margin_eval_set=None, feature_weights=None) -> "XGBRanker":
        """XGBoost's ``XGBRanker.fit``: ``qid`` or ``group``; ``sample_weight`` holds one weight per
        query (XGBoost's ranking rule); ``verbose`` prints the eval results (every ``verbose``
        rounds when an int)."""
        for name, value in (("xgb_model", xgb_model), ("sample_weight_eval_set", sample_weight_eval_set),
                            ("feature_weights", feature_weights)):
            if value is not None:
                raise ValueError(f"`{name}` has no rankkit equivalent (to continue a model, pass its scores as "
                                 f"base_margin; rankkit's eval metrics are unweighted; features are drawn uniformly)")
        if (group is None) == (qid is None):
            raise ValueError("Either `group` or `qid` is required for ranking task (one of the two)")
        plan = _xgb_plan(self.get_params())
        sizes = query_sizes(qid, group, np.shape(y)[0])
        weights = None if sample_weight is None else _per_query(sample_weight, sizes, "sample_weight")
        evals = []
        for i, (ex, ey) in enumerate(eval_set or []):
            queries = {"qid": eval_qid[i]} if eval_qid is not None and eval_qid[i] is not None else \
                {"group": eval_group[i]} if eval_group is not None and eval_group[i] is not None else None
            if queries is None:
                raise ValueError(f"`eval_set[{i}]` needs its queries: pass eval_qid or eval_group")
            init = None if base_margin_eval_set is None else base_margin_eval_set[i]
            evals.append((f"validation_{i}", ex, ey, queries, init))
        callbacks = list(self.callbacks or [])
        if verbose:  # the log first: a round a callback stops at is printed too
            callbacks.insert(0, log_evaluation(1 if verbose is True else int(verbose)))
        if plan.stoppers and not evals:
            raise ValueError("Must have at least 1 validation dataset for early stopping.")
        fit_kwargs = {"qid": qid, "group": group, "sample_weight": weights, "init_score": base_margin}
        self._train(plan, (X, y, fit_kwargs), evals, callbacks, _xgb_keep)
        rounds = self.rounds_
        if rounds.stop is not None and isinstance(rounds.stopped_by, _XGBEarlyStopping):
            self.best_iteration_, self.best_score_ = rounds.stop.best_iteration, float(rounds.stop.best_score[-1][2])
        else:
            for name in ("best_iteration_", "best_score_"):
                if hasattr(self, name):
                    delattr(self, name)
        self.importance_type_ = plan.importance_type
        return self

    def predict(self, X, *, output_margin=False, validate_features=True, base_margin=None,
                iteration_range=None) -> np.ndarray:
        """XGBoost's ``predict``: the trees of ``iteration_range`` (None: up to the best iteration
        with early stopping, else all), plus ``base_margin``."""
        check_is_fitted(self, "booster_")
        n = self.n_estimators_
        if iteration_range is None or tuple(iteration_range) == (0, 0):
            start, stop = 0, getattr(self, "best_iteration_", n - 1) + 1
        else:
            start, stop = (check_int(v, "iteration_range", low=0) for v in iteration_range)
            if stop > n or start > stop:
                raise ValueError(f"`iteration_range={tuple(iteration_range)}` has to lie in 0..{n} (the model's "
                                 f"trees), start <= stop")
        out = self._predict_range(X, start, stop)
        if base_margin is not None:
            out = out + vector(base_margin, len(out), "base_margin").numpy()
        return out

    @property
    def best_iteration(self) -> int:
        if not hasattr(self, "best_iteration_"):
            raise AttributeError("`best_iteration` is only defined when early stopping is used.")
        return self.best_iteration_

    @property
    def best_score(self) -> float:
        if not hasattr(self, "best_score_"):
            raise AttributeError("`best_score` is only defined when early stopping is used.")
        return self.best_score_

    def evals_result(self) -> dict:
        """``{"validation_0": {"ndcg@32": [...]}, ...}``, one value per round."""
        check_is_fitted(self, "booster_")
        return {name: dict(metrics) for name, metrics in self.evals_result_.items()}

    def get_booster(self) -> LambdaMART:
        """The rankkit model (not an ``xgboost.Booster``): ``save``, export, ``ensemble_``."""
        check_is_fitted(self, "booster_")
        return self.booster_

    @property
    def feature_importances_(self) -> np.ndarray:
        """[F] float32, normalised to sum 1: mean gain per split (``"gain"``), total gain or split counts."""
        check_is_fitted(self, "booster_")
        gain, split = self.booster_.feature_importance_gain_, self.booster_.feature_importance_split_
        kind = self.importance_type_
        values = split.astype(np.float64) if kind == "weight" else gain if kind == "total_gain" else \
            np.divide(gain, split, out=np.zeros_like(gain, dtype=np.float64), where=split > 0)
        total = values.sum()
        return (values / total if total > 0 else values).astype(np.float32)


def _xgb_keep(rounds: _Rounds, grown: int) -> int:
    """XGBoost keeps every tree, or up to the best with ``EarlyStopping(save_best=True)``."""
    stopper = rounds.stopped_by
    if rounds.stop is not None and isinstance(stopper, _XGBEarlyStopping) and stopper.save_best:
        return rounds.stop.best_iteration + 1
    return grown


def _per_query(weights, sizes: torch.Tensor, name: str) -> np.ndarray:
    """Per-document weights from XGBoost's one weight per query."""
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    if len(w) != len(sizes):
        raise ValueError(f"`{name}` has {len(w)} values; XGBoost's ranking weights are one per query "
                         f"({len(sizes)} queries)")
    return np.repeat(w, sizes.numpy())


def parameter_rows(table: dict[str, Parameter]) -> str:
    """The Markdown rows of a parameter table (docs/compat.md holds them; a test keeps them equal)."""
    rows = []
    for name, p in table.items():
        default = "nan" if isinstance(p.default, float) and math.isnan(p.default) else repr(p.default)
        accepted = ", ".join(f"`{a!r}`" for a in p.accepts)
        what = p.maps if not p.refused_otherwise else \
            f"no equivalent: only {accepted} accepted; any other value is refused, naming {p.nearest}"
        rows.append(f"| `{name}` | `{default}` | {what} |")
    return "\n".join(rows)
