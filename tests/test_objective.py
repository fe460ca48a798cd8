"""rankkit.objective: the one frozen objective both model families hold, built by one factory."""
import dataclasses

import pytest

from rankkit.boosting.config import BoosterConfig
from rankkit.boosting.objectives import CustomObjective, RankingObjective, SquaredError, make_objective
from rankkit.examples.losses import squared_pairwise_hinge
from rankkit.losses import LISTWISE, OBJECTIVES
from rankkit.neural import LambdaRank, RankNet
from rankkit.objective import NAMES, ObjectiveSpec, objective_spec


@pytest.mark.parametrize("objective", [None, "lambdarank"])
@pytest.mark.parametrize("weighting", ["ranknet", "ndcg", "map", "err"])
def test_lambdarank_and_no_objective_mean_the_lambda_loss_of_the_weighting(objective, weighting):
    spec = objective_spec(objective, weighting=weighting, k=5)
    assert spec.name == weighting and spec.pairwise
    assert spec.click_weighting == ("ranknet" if weighting == "ranknet" else "ndcg")
    assert spec.kernel_options() == dict(k=5, sigma=1.0, gain="exp", normalize=False)


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_a_named_objective_replaces_the_weighting(name):
    spec = objective_spec(name, weighting="map", k=3)
    assert spec.name == name
    assert spec.pairwise == (name not in LISTWISE)
    assert spec.kernel_options() == ({} if name in LISTWISE else dict(k=3, sigma=1.0, gain="exp", normalize=False))


def test_pointwise_and_custom_objectives_take_no_kernel_options():
    assert not objective_spec("pointwise").pairwise and objective_spec("pointwise").kernel_options() == {}
    custom = objective_spec(squared_pairwise_hinge, hessian="gauss-newton")
    assert custom.custom and not custom.pairwise and custom.hessian == "gauss-newton"
    assert custom.objective == "rankkit.examples.losses.squared_pairwise_hinge"  # text, as checkpoints record it


def test_the_spec_is_frozen_hashable_and_compared_by_value():
    a = objective_spec("lambdarank", weighting="ndcg", options={"b": 1, "a": 2})
    assert a.options == (("a", 2), ("b", 1))
    assert a == objective_spec("lambdarank", weighting="ndcg", options={"a": 2, "b": 1}) and hash(a) == hash(
        objective_spec("lambdarank", weighting="ndcg", options={"a": 2, "b": 1}))
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.k = 3  # type: ignore[misc]
    assert ObjectiveSpec() == objective_spec()  # the defaults: the lambda loss of NDCG


@pytest.mark.parametrize("objective, weighting, match", [
    ("lambdarank", "dcg", r"`weighting` has to be one of"),
    (None, ["ndcg"], r"`weighting` has to be one of"),  # unhashable: one line, not a TypeError
    ("mse", "ndcg", r"`objective` has to be one of \('lambdarank', 'pointwise'"),
])
def test_an_unknown_name_is_one_line_naming_its_argument(objective, weighting, match):
    with pytest.raises(ValueError, match=match):
        objective_spec(objective, weighting=weighting)


def test_the_booster_builds_its_gradients_from_the_spec():
    assert NAMES == ("lambdarank", "pointwise", *OBJECTIVES)
    ranking = make_objective(objective_spec("lambdarank", weighting="ndcg", k=7, sigma=2.0))
    assert isinstance(ranking, RankingObjective) and ranking.name == "ndcg"
    assert ranking.options == dict(k=7, sigma=2.0, gain="exp", normalize=False)
    assert isinstance(make_objective(objective_spec("pointwise")), SquaredError)
    custom = make_objective(objective_spec(squared_pairwise_hinge), custom_loss=squared_pairwise_hinge)
    assert isinstance(custom, CustomObjective) and custom.loss.fn is squared_pairwise_hinge


def test_both_families_hold_the_same_spec_for_the_same_settings():
    booster = BoosterConfig(objective="lambdarank", weighting="ndcg", k=10, sigma=2.0).objective_spec
    neural = LambdaRank(3, weighting="ndcg", k=10, sigma=2.0).training_objective.spec
    assert (booster.name, booster.kernel_options()) == (neural.name, neural.kernel_options())
    assert (booster.objective, neural.objective) == ("lambdarank", None)
    softmax = BoosterConfig(objective="softmax").objective_spec
    assert softmax.name == RankNet(3, objective="softmax").training_objective.spec.name == "softmax"
