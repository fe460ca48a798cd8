"""rankkit.boosting.booster: options that would be silently wrong are refused (early stopping without
an eval set, a weighting with another objective)."""
from __future__ import annotations

import pytest

from rankkit.boosting import LambdaMART
from rankkit.data import make_synthetic


# -- wrong with exit 0 -----------------------------------------------------------------------------
def test_early_stopping_without_an_eval_set_is_refused():
    """``early_stopping_rounds`` with nothing to watch was ignored (all rounds ran)."""
    with pytest.raises(ValueError, match=r"`early_stopping_rounds=3` needs an `eval_set`"):
        LambdaMART(n_estimators=4, early_stopping_rounds=3).fit(make_synthetic(6, 8, 3, seed=0))


@pytest.mark.parametrize("objective", ["softmax", "listmle", "pointwise", "ranknet"])
def test_booster_weighting_with_another_objective_is_refused(objective):
    """``objective="softmax", weighting="map"`` trained softmax and dropped the weighting."""
    with pytest.raises(ValueError, match=r"`weighting` applies to objective='lambdarank' only"):
        LambdaMART(objective, weighting="map", n_estimators=2).fit(make_synthetic(6, 8, 3, seed=0))
