"""``rankkit compare``: RankNet, LambdaRank and LambdaMART (and optionally LightGBM, XGBoost and
CatBoost) on the same folds, seeds, metric code and model selection.

An application built on the library, in its own package: ``protocol`` (training, evaluation,
reporting), ``baselines`` (the third-party wrappers), ``plots`` and ``command`` (the parser).
It never imports :mod:`rankkit.cli`.
"""
from rankkit.compare.baselines import BASELINES, best_round
from rankkit.compare.protocol import MODELS, Evaluator, compare, early_stopping_of, parse_folds

__all__ = ["BASELINES", "MODELS", "Evaluator", "best_round", "compare", "early_stopping_of", "parse_folds"]
