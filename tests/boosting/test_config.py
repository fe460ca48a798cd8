"""rankkit.boosting.config: each hyper-parameter declared once, and every front end derived from it."""
import inspect
from dataclasses import dataclass

import pytest
import sklearn
import yaml

from rankkit.boosting import LambdaMART, LambdaMARTModule
from rankkit.boosting.booster import EstimatorOptions
from rankkit.boosting.config import BoosterConfig
from rankkit.data import make_synthetic
from rankkit.infra.params import declared
from rankkit.training.run_config import CONFIG_DIR


def _signature(cls) -> dict:
    return {name: p.default for name, p in inspect.signature(cls).parameters.items()}


def test_the_estimator_takes_every_declared_parameter_with_its_default():
    expected = {p.name: p.default for p in declared(BoosterConfig) + declared(EstimatorOptions)}
    assert _signature(LambdaMART) == expected
    assert LambdaMART().get_params() == expected
    assert list(inspect.signature(LambdaMART).parameters)[0] == "objective"  # LambdaMART("ranknet")


def test_the_module_takes_the_declared_parameters_a_lightning_fit_uses():
    run = {p.name: p.default for p in declared(BoosterConfig) if p.module}
    assert _signature(LambdaMARTModule) == {**run, "n_features": None}
    # the estimator's eval set and early stopping are Lightning's (callbacks: EarlyStopping and
    # rankkit.training.callbacks.SmoothedMetric); the click options
    # are the module's too (issue 49: `rankkit fit` on a click log), all but the race ("auto")
    assert set(_signature(LambdaMART)) - set(run) == {
        "n_estimators", "device", "verbose", "eval_metric", "early_stopping_rounds", "early_stopping_window", "n_jobs",
        "random_state"}
    assert {"unbiased", "n_positions", "pool_positions", "propensity_clip"} <= set(run)
    assert LambdaMARTModule(depth=3).config == BoosterConfig(depth=3)


@pytest.mark.parametrize("cls", [LambdaMART, LambdaMARTModule])
def test_each_parameter_is_documented_once_from_its_declaration(cls):
    doc = inspect.getdoc(cls)
    for name in inspect.signature(cls).parameters:
        assert doc.count(f"\n    {name}: ") == 1, name
    depth = next(p for p in declared(BoosterConfig) if p.name == "depth")
    assert f"    depth: {depth.doc}" in doc


@pytest.mark.parametrize("name, value", [("depth", 0), ("learning_rate", 0.0), ("subsample", 1.5),
                                         ("max_bins", 2), ("n_positions", 0), ("propensity_clip", 0.5)])
def test_the_declared_range_is_checked_by_both_front_ends(name, value):
    with pytest.raises(ValueError, match=f"`{name}`"):
        BoosterConfig.from_params({name: value})
    with pytest.raises(ValueError, match=f"`{name}`"):
        LambdaMART(**{name: value})._config()
    if name in _signature(LambdaMARTModule):
        with pytest.raises(ValueError, match=f"`{name}`"):
            LambdaMARTModule(**{name: value})


def test_the_estimator_options_are_checked():
    with pytest.raises(ValueError, match="`n_estimators`"):
        LambdaMART(n_estimators=0)._config()
    with pytest.raises(ValueError, match="`n_features`"):
        LambdaMARTModule(n_features=0)


def test_get_params_set_params_and_clone_round_trip():
    model = LambdaMART("ranknet", depth=3, k=5)
    assert model.set_params(depth=4) is model and model.depth == 4
    copy = sklearn.base.clone(model)
    assert copy.get_params() == model.get_params() and copy is not model
    assert repr(model) == "LambdaMART(depth=4, k=5, objective='ranknet')"


def test_the_packaged_config_and_search_space_name_declared_parameters():
    config = yaml.safe_load((CONFIG_DIR / "lambdamart.yaml").read_text())["model"]["init_args"]
    assert set(config) <= set(_signature(LambdaMARTModule))
    BoosterConfig.from_params(config)  # every value in its declared range
    space = yaml.safe_load((CONFIG_DIR / "lambdamart.space.yaml").read_text())
    assert {key.removeprefix("model.init_args.") for key in space} <= set(_signature(LambdaMARTModule))


# The defaults as they were before the declaration (LightGBM's and XGBoost's users read them):
# a changed default fails here, not only in a table.
DEFAULTS = dict(objective="lambdarank", n_estimators=100, hessian="exact", depth=6, learning_rate=0.1, l2=1.0,
                min_data_in_leaf=20, min_sum_hessian=1e-3, weighting="ndcg", k=None, sigma=1.0, gain="exp",
                normalize=False, subsample=1.0, colsample=1.0, bagging_temperature=0.0, random_strength=0.0,
                exact_newton=False, quantized_grad=False, num_grad_quant_bins=4, max_bins=255,
                eval_metric="ndcg@10", early_stopping_rounds=None, early_stopping_window=1, seed=0, unbiased=False,
                bias_p=1.0,
                n_positions=10, pool_positions=False, position_bias_regularization=0.0, propensity_clip="auto",
                device="cpu", verbose=0, n_jobs=None, random_state=None)


def test_the_defaults_are_pinned():
    assert _signature(LambdaMART) == DEFAULTS
    assert _signature(LambdaMARTModule) == {**{k: v for k, v in DEFAULTS.items() if k in _signature(
        LambdaMARTModule)}, "n_features": None}


def test_the_objective_is_positional_and_the_rest_keyword_only():
    assert LambdaMART("ranknet").objective == "ranknet"
    assert LambdaMARTModule("ranknet").config.objective == "ranknet"
    with pytest.raises(TypeError):
        LambdaMARTModule("ranknet", 3)


def test_the_command_line_reads_the_objective_as_text(tmp_path):
    # A config cannot make the CLI build an object for `objective`: it is text (a custom
    # objective's "package.module.function" is imported by rankkit when training starts).
    from rankkit.training.lightning_cli import lightning_cli

    assert inspect.signature(LambdaMARTModule, eval_str=True).parameters["objective"].annotation is str
    config = tmp_path / "m.yaml"
    config.write_text("model:\n  class_path: rankkit.boosting.LambdaMARTModule\n  init_args:\n"
                      "    objective: {class_path: fractions.Fraction, init_args: {numerator: 1}}\n"
                      "data: {data: mq2008}\n")
    with pytest.raises(Exception, match="Expected a <class 'str'>"):
        lightning_cli(["--config", str(config), f"--trainer.default_root_dir={tmp_path}"], run=False,
                      verbose=False)
    config.write_text(config.read_text().replace("{class_path: fractions.Fraction, init_args: {numerator: 1}}",
                                                 "lambdarank"))
    with pytest.raises(ValueError, match="'123'"):  # the text '123', not the number
        lightning_cli(["--config", str(config), "--model.init_args.objective=123",
                       f"--trainer.default_root_dir={tmp_path}"], run=False, verbose=False)


def test_an_undeclared_field_is_refused():
    @dataclass
    class Undeclared:
        depth: int = 6

    with pytest.raises(TypeError, match="Undeclared.depth"):
        declared(Undeclared)


# Settings every front end refuses, each a different rule of BoosterConfig.check (ranges and
# combinations): the estimator at fit, the Lightning module at construction, with one message.
REFUSED = [dict(objective="ranknet", weighting="map"), dict(objective="xendcg", weighting="err"),
           dict(depth=0), dict(hessian="constant"), dict(objective="pointwise", exact_newton=True),
           dict(k=0), dict(objective="no-such"), dict(max_bins=2), dict(learning_rate=0.0)]


@pytest.mark.parametrize("params", REFUSED, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_the_estimator_and_the_module_refuse_the_same_settings(params):
    with pytest.raises(ValueError) as by_estimator:
        LambdaMART(**params).fit(make_synthetic(4, 5, 3, seed=0))
    with pytest.raises(ValueError) as by_module:
        LambdaMARTModule(**params)
    assert str(by_estimator.value) == str(by_module.value)
