"""rankkit.neural.objective: a neural ranker's objective settings, checked once into one frozen value,
and the loss it computes (against a float64 loop over the pairs, and against a custom loss by hand)."""
import dataclasses
import math

import pytest
import torch

from rankkit.data.dataset import PaddedBatch
from rankkit.examples.losses import squared_pairwise_hinge
from rankkit.infra.checkpoint import RecordedName
from rankkit.neural.config import NeuralConfig
from rankkit.neural.objective import neural_objective, objective_alias, spelling
from rankkit.objective import ObjectiveSpec

CHOICES = ("ranknet", "ndcg", "map", "err")


def _objective(**settings):
    params = {"objective": None, "loss": None, **settings}
    return neural_objective(NeuralConfig(**objective_alias(params)), choices=CHOICES, default_weighting="ranknet",
                            name=spelling(params))


def _batch():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 6, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 3, (3, 6), generator=g).double()
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[1, 4:] = False
    return scores, PaddedBatch(features=torch.zeros(3, 6, 1), labels=labels, mask=mask)


def test_the_settings_are_one_frozen_value():
    spec = _objective(weighting="ndcg", k=5, sigma=2.0, loss_options={"tie_term": False}).spec
    assert spec == ObjectiveSpec(None, "ndcg", 2.0, 5, False, options=(("tie_term", False),))
    assert spec.name == "ndcg" and spec.pairwise
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.k = 3
    assert _objective(objective="softmax").spec.objective == "softmax"
    custom = _objective(objective=squared_pairwise_hinge).spec
    assert custom.custom and custom.objective == "rankkit.examples.losses.squared_pairwise_hinge"


def test_ranknet_is_the_logistic_loss_summed_over_pairs_per_query():
    scores, batch = _batch()
    objective = _objective(weighting="ranknet", reduction="query")
    want = []
    for s, y, m in zip(scores.tolist(), batch.labels.tolist(), batch.mask.tolist()):
        n = sum(m)
        want.append(sum(math.log1p(math.exp(-(s[i] - s[j]))) for i in range(n) for j in range(n) if y[i] > y[j]))
    got = objective(scores, batch)
    denominator = float(batch.mask.any(1).sum())  # reduction="query": the mean over queries
    assert float(got) == pytest.approx(sum(want) / denominator, rel=1e-12)


def test_a_custom_loss_is_its_per_query_sum_over_the_reductions_denominator():
    scores, batch = _batch()
    leaf = scores.clone().requires_grad_(True)
    got = _objective(objective=squared_pairwise_hinge, reduction="query")(leaf, batch)
    by_hand = squared_pairwise_hinge(scores, batch.labels, batch.mask).sum() / batch.mask.any(1).sum()
    assert float(got) == pytest.approx(float(by_hand), rel=1e-12)
    got.backward()
    assert leaf.grad is not None and bool(torch.isfinite(leaf.grad).all())


def test_a_recorded_name_is_never_imported():
    objective = _objective(objective=RecordedName("rankkit.examples.losses.squared_pairwise_hinge"))
    assert isinstance(objective.custom_loss, RecordedName)
    scores, batch = _batch()
    with pytest.raises(ValueError, match="read from a model file"):
        objective(scores, batch)


@pytest.mark.parametrize("settings, match", [
    ({"weighting": "dcg"}, "`weighting`"),
    ({"objective": "softmax", "weighting": "ndcg"}, "`weighting` is not used when `objective` is given"),
    ({"loss": "softmax", "weighting": "ndcg"}, "`weighting` is not used when `loss` is given"),
    ({"objective": "nosuch"}, "`objective` has to be one of"),
    ({"objective": squared_pairwise_hinge, "k": 10}, "`k` configures the built-in lambda kernel"),
    ({"objective": squared_pairwise_hinge, "loss_options": {"margin": 2.0}}, "`loss_options` applies to the built-in"),
    ({"loss_options": {"k": 3}}, "set `k=` instead"),
    ({"objective": "softmax", "loss_options": {"nope": 1}}, "'nope' is not an option of the objective 'softmax'"),
])
def test_contradictory_settings_are_refused_in_one_line(settings, match):
    with pytest.raises(ValueError, match=match):
        _objective(**settings)


def test_the_hyperparameters_record_the_objective_once_under_both_names_as_text():
    from rankkit.neural import RankNet

    model = RankNet(3, objective=squared_pairwise_hinge)
    name = "rankkit.examples.losses.squared_pairwise_hinge"
    assert model.hparams["objective"] == model.hparams["loss"] == model._hparams_initial["loss"] == name
    other = RankNet(3)
    assert other.hparams["objective"] is None and other.hparams["hidden"] == [128, 64]
    other.hparams["hidden"].append(1)  # the module's own copy, not the signature's shared default
    assert RankNet(3).hparams["hidden"] == [128, 64]
