"""rankkit.boosting.config: each hyper-parameter declared once, and every front end derived from it."""
import inspect
from dataclasses import dataclass, fields

import pytest
import sklearn
import yaml

from rankkit.boosting import LambdaMART, LambdaMARTModule
from rankkit.boosting.booster import EstimatorOptions
from rankkit.boosting.config import BoosterConfig
from rankkit.boosting.module import ModuleOptions
from rankkit.infra.params import declared, hyperparameter, make_init
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
    # the estimator's eval set, early stopping and click options are Lightning's (callbacks) or not offered
    assert set(_signature(LambdaMART)) - set(run) == {
        "n_estimators", "device", "verbose", "eval_metric", "early_stopping_rounds", "unbiased", "bias_p",
        "n_positions", "position_bias_regularization", "propensity_clip"}
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


def test_every_field_of_a_declaration_is_declared():
    for options in (BoosterConfig, EstimatorOptions, ModuleOptions):
        assert all("doc" in f.metadata for f in fields(options))

    @dataclass
    class Undeclared:
        depth: int = 6

    with pytest.raises(TypeError, match="Undeclared.depth"):
        declared(Undeclared)


def test_make_init_refuses_a_name_twice():
    @dataclass
    class Twice:
        depth: int = hyperparameter(6, "levels.")

    with pytest.raises(ValueError, match="distinct"):
        make_init(declared(Twice) * 2, lambda self, params: None, "Twice")
