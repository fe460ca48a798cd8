"""Deprecated: the names of ``rankkit.click_metric`` moved to :mod:`rankkit.clicks` (2026-12-05).

``rankkit.clicks.metrics`` holds the criteria (``ClickLikelihood``, ``SessionClickMetric``, ...),
``rankkit.clicks.log`` the sessions, ``rankkit.clicks.propensity`` ``ips_propensities`` and
``rankkit.clicks.race`` ``SuccessiveHalving``. Importing this module warns once
(``FutureWarning``); it will be removed in 2027.
"""
import warnings

from rankkit.clicks.log import SessionLog, aggregate, distinct_rows, session_log
from rankkit.clicks.metrics import (CLICK_MODELS, ClickLikelihood, SessionClickMetric, cascade_relevance,
                                    explained_clicks, multiple_click_ratio)
from rankkit.clicks.propensity import ips_propensities
from rankkit.clicks.race import SuccessiveHalving

__all__ = ["CLICK_MODELS", "ClickLikelihood", "SessionClickMetric", "SessionLog", "SuccessiveHalving", "aggregate",
           "cascade_relevance", "distinct_rows", "explained_clicks", "ips_propensities", "multiple_click_ratio",
           "session_log"]

warnings.warn("`rankkit.click_metric` moved to `rankkit.clicks` (`rankkit.clicks.metrics`, `.log`, `.propensity` "
              "and `.race`); this name will be removed in 2027", FutureWarning, stacklevel=2)
