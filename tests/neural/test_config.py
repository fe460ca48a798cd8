"""rankkit.neural.config: each neural hyper-parameter declared once, every module derived from it."""
import inspect

import pytest
import yaml

from rankkit.infra.params import check_all, declared
from rankkit.neural import LambdaRank, NeuralRanker, RankNet
from rankkit.neural.config import NeuralConfig
from rankkit.training.run_config import CONFIG_DIR


def _defaults(cls) -> dict:
    return {name: p.default for name, p in inspect.signature(cls).parameters.items()}


# The defaults as they were before the declaration: a changed default fails here.
DEFAULTS = dict(n_features=None, hidden=[128, 64], activation="relu", dropout=0.1, norm="none", log1p=True,
                standardize=True, encoding="standard", bins=16,  # 2026-12-06: the piecewise encoding (issue 50)
                weighting="ranknet", k=None, sigma=1.0, normalize=False, reduction="query",
                optimizer="adam", lr=1e-3, weight_decay=0.0, scheduler="none", ema_decay=0.0, scorer=None,
                objective=None, loss=None, unbiased=False, bias_p=1.0, n_positions=10, propensity_clip=10.0,
                position_lr=1e-2,  # 2026-12-06: the position models at their own rate (issue 49)
                architecture="mlp", heads=4,
                layers=2, latent_cross=True, noise=0.0, loss_options=None)


def test_the_defaults_are_pinned():
    assert _defaults(NeuralRanker) == DEFAULTS
    assert LambdaRank(46).hparams["hidden"] == [128, 64]
    a, b = LambdaRank(46), LambdaRank(46)
    a.hparams["hidden"].append(1)  # each instance its own list
    assert b.hparams["hidden"] == [128, 64] and _defaults(LambdaRank)["hidden"] == [128, 64]


def test_the_modules_take_every_declared_parameter_and_differ_only_in_the_weighting():
    declared_defaults = {p.name: p.default for p in declared(NeuralConfig)}
    assert _defaults(NeuralRanker) == declared_defaults
    assert _defaults(RankNet) == {**declared_defaults, "weighting": "ranknet"}
    assert _defaults(LambdaRank) == {**declared_defaults, "weighting": "ndcg"}
    assert list(_defaults(LambdaRank))[0] == "n_features"  # LambdaRank(46)
    assert LambdaRank(46).hparams["weighting"] == "ndcg" and RankNet(46).hparams["weighting"] == "ranknet"


@pytest.mark.parametrize("cls", [NeuralRanker, RankNet, LambdaRank])
def test_each_parameter_is_documented_once_from_its_declaration(cls):
    doc = inspect.getdoc(cls)
    for name in inspect.signature(cls).parameters:
        assert doc.count(f"\n    {name}: ") == 1, name


@pytest.mark.parametrize("name, value", [("sigma", 0.0), ("lr", -1.0), ("optimizer", "adagrad"),
                                         ("ema_decay", 1.0), ("architecture", "cnn"), ("noise", -0.1)])
def test_the_declared_range_is_checked(name, value):
    with pytest.raises(ValueError, match=f"`{name}`"):
        LambdaRank(46, **{name: value})


@pytest.mark.parametrize("name", ["ranknet", "lambdarank", "transformer"])
def test_the_packaged_configs_and_spaces_name_declared_parameters_in_range(name):
    config = yaml.safe_load((CONFIG_DIR / f"{name}.yaml").read_text())["model"]["init_args"]
    assert set(config) <= set(_defaults(NeuralRanker))
    check_all(NeuralConfig(**config))
    space = yaml.safe_load((CONFIG_DIR / f"{name}.space.yaml").read_text())
    model_keys = {k.removeprefix("model.init_args.") for k in space if k.startswith("model.")}
    assert model_keys <= set(_defaults(NeuralRanker))


def test_objective_is_the_neural_rankers_spelling_and_loss_the_old_one_warns_once(monkeypatch):
    import warnings

    import rankkit.neural.objective as objective

    monkeypatch.setattr(objective, "_LOSS_WARNED", [False])
    new = LambdaRank(5, objective="softmax")
    assert new.hparams["objective"] == new.hparams["loss"] == "softmax"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = LambdaRank(5, loss="softmax")
        LambdaRank(5, loss="listmle")
    warned = [str(w.message) for w in caught if w.category is FutureWarning]
    assert len(warned) == 1 and warned[0].startswith("`loss=` is now `objective=`")  # once per process
    assert old.hparams["objective"] == old.hparams["loss"] == "softmax"
    with pytest.raises(ValueError, match="`loss` is the old spelling of `objective`: give one"):
        LambdaRank(5, objective="softmax", loss="listmle")
    # a checkpoint records both names with one value, and loads without a warning or a refusal
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monkeypatch.setattr(objective, "_LOSS_WARNED", [False])
        LambdaRank(5, **{k: new.hparams[k] for k in ("objective", "loss")})
    assert not [w for w in caught if w.category is FutureWarning]
