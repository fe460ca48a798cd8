"""Deprecated: the names of ``rankkit.unbiased`` moved to :mod:`rankkit.clicks` (2026-12-05).

``rankkit.clicks.propensity`` holds the estimators (``PropensityEstimator``, ``RegressionEM``, ...)
and ``rankkit.clicks.metrics`` the click-log metrics (``ClickLogMetric``, ``counterfactual_ndcg``,
...). Importing this module warns once (``FutureWarning``); it will be removed in 2027.
"""
import warnings

from rankkit.clicks.metrics import ClickLogMetric, counterfactual_ndcg, ips_relevance, ranker_scores
from rankkit.clicks.propensity import (EM_SETTINGS, PAIR_WEIGHTINGS, FixedPropensities, PositionIds,
                                       PropensityEstimator, RegressionEM, click_log_likelihood, debiased_pair_loss,
                                       em_posteriors, em_step, pair_costs, position_pair_costs, propensity_step)

__all__ = ["EM_SETTINGS", "PAIR_WEIGHTINGS", "ClickLogMetric", "FixedPropensities", "PositionIds",
           "PropensityEstimator", "RegressionEM", "click_log_likelihood", "counterfactual_ndcg", "debiased_pair_loss",
           "em_posteriors", "em_step", "ips_relevance", "pair_costs", "position_pair_costs", "propensity_step",
           "ranker_scores"]

warnings.warn("`rankkit.unbiased` moved to `rankkit.clicks` (`rankkit.clicks.propensity` and "
              "`rankkit.clicks.metrics`); this name will be removed in 2027", FutureWarning, stacklevel=2)
