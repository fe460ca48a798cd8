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


# -- the estimator and the module refuse the same settings ----------------------------------------
#: Where the two front ends differ on purpose: the race lives in LambdaMART.fit only.
MODULE_ONLY_REFUSALS = {(("unbiased", "auto"),)}


def _refusal(build):
    try:
        build()
    except ValueError as e:
        return str(e)
    return None


def _bad_values(p):
    """Values around and beyond the declared range of one parameter, of each plain kind."""
    values = [-1, 0, 1, 2, 10**9, -0.5, 0.5, 1.5, "x", "", None, True, [1]]
    if isinstance(p.default, bool):
        values += [False]
    return values


def test_every_setting_the_estimator_refuses_the_module_refuses_in_the_same_words():
    """Issue 52: every combination rule lives in BoosterConfig.check, so each front end refuses
    the same things. Found from the declaration: every module parameter with a spread of values,
    and the combination rules, through LambdaMART's config and LambdaMARTModule's constructor."""
    from rankkit.boosting import LambdaMARTModule
    from rankkit.boosting.config import BoosterConfig
    from rankkit.examples.losses import ranknet
    from rankkit.infra.params import declared

    cases = [((p.name, v),) for p in declared(BoosterConfig) if p.module for v in _bad_values(p)]
    cases += [(("objective", "softmax"), ("weighting", "map")), (("objective", "ranknet"), ("hessian", "constant")),
              (("objective", ranknet), ("k", 3)), (("objective", ranknet), ("normalize", True)),
              (("objective", "softmax"), ("exact_newton", True)), (("unbiased", True), ("objective", "softmax")),
              (("quantized_grad", True), ("num_grad_quant_bins", 3)), (("unbiased", "ips"), ("propensity_clip", 0.5))]
    refused = mismatched = 0
    for case in cases:
        kw = dict(case)
        estimator = _refusal(lambda kw=kw: LambdaMART(**kw)._config())
        module = _refusal(lambda kw=kw: LambdaMARTModule(**kw))
        if repr(case) in {repr(c) for c in MODULE_ONLY_REFUSALS}:
            assert estimator is None and module is not None
            continue
        refused += estimator is not None
        if estimator != module:
            mismatched += 1
            print(f"{kw}: estimator {estimator!r}, module {module!r}")
    assert mismatched == 0
    assert refused > 60  # the spread reaches every range: the comparison can fail
