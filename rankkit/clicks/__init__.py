"""Learning from clicks: every piece of click handling, for the booster and the neural rankers.

* :mod:`rankkit.clicks.log`: a click log as sessions, its distinct documents and queries;
* :mod:`rankkit.clicks.propensity`: position bias: Unbiased LambdaMART's learned biases,
  regression-EM's propensities, position ids read as LightGBM reads them;
* :mod:`rankkit.clicks.debiasing`: what each ``unbiased`` setting does to training, one object
  per setting (:func:`~rankkit.clicks.debiasing.make_debiasing`), asked by the booster's engine
  and by the neural rankers alike;
* :mod:`rankkit.clicks.race`: ``unbiased="auto"``, one successive-halving race for both families;
* :mod:`rankkit.clicks.metrics`: scoring a ranker on a validation click log without true labels.

The click simulator that makes logs from labelled data lives with the data
(:mod:`rankkit.data.clicks`).
"""
from rankkit.clicks.metrics import ClickLikelihood, ClickLogMetric, SessionClickMetric
from rankkit.clicks.propensity import FixedPropensities, PositionIds, PropensityEstimator, RegressionEM

__all__ = ["ClickLikelihood", "ClickLogMetric", "FixedPropensities", "PositionIds", "PropensityEstimator",
           "RegressionEM", "SessionClickMetric"]
