"""rankkit.neural.optim: the optimiser and the schedule each `scheduler` setting builds."""
import math
from types import SimpleNamespace

import pytest
import torch

from rankkit.neural.optim import WarmupCosine, optimizers, restart_average, weight_average


def _hparams(**kw):
    return SimpleNamespace(**{"optimizer": "adam", "lr": 0.01, "weight_decay": 0.1, "scheduler": "none", **kw})


@pytest.mark.parametrize("total", [1, 2, 19, 20, 100, 1001])
def test_warmup_cosine_is_its_formula(total):
    f = WarmupCosine(total)
    warm = max(1, total // 20)
    span = max(1, max(2, total) - 1 - warm)
    for t in range(max(2, total)):
        want = (t + 1) / warm if t < warm else 0.5 * (1 + math.cos(math.pi * min(1.0, (t - warm) / span)))
        assert f(t) == pytest.approx(want, abs=1e-15)
    assert f(max(2, total) - 1) == pytest.approx(0.0, abs=1e-15) or total <= 2


def test_each_setting_builds_its_optimiser_and_schedule():
    params = [{"params": [torch.nn.Parameter(torch.zeros(2))]},
              {"params": [torch.nn.Parameter(torch.zeros(1))], "weight_decay": 0.0}]
    opt = optimizers(params, _hparams(optimizer="adamw"))
    assert isinstance(opt, torch.optim.AdamW) and [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    cosine = optimizers(params, _hparams(scheduler="cosine"), SimpleNamespace(max_epochs=7))
    assert isinstance(cosine["lr_scheduler"], torch.optim.lr_scheduler.CosineAnnealingLR)
    assert cosine["lr_scheduler"].T_max == 7
    plateau = optimizers(params, _hparams(scheduler="plateau"))["lr_scheduler"]
    assert plateau["monitor"] == "val/ndcg@10" and plateau["scheduler"].mode == "max"
    warm = optimizers(params, _hparams(scheduler="warmup_cosine", lr=1.0),
                      SimpleNamespace(estimated_stepping_batches=float("inf")))["lr_scheduler"]
    assert warm["interval"] == "step" and warm["scheduler"].lr_lambdas[0].total == 10**6
    assert optimizers(params, _hparams(scheduler="cosine"))["lr_scheduler"].T_max == 1  # no trainer: one epoch


def test_the_weight_average_is_the_ema_of_the_weights_and_restarts_from_the_scorer():
    scorer = torch.nn.Linear(2, 1)
    assert weight_average(scorer, 0.0) is None
    restart_average(None, scorer)  # no average: nothing to do
    averaged = weight_average(scorer, 0.9)
    assert not any(p.requires_grad for p in averaged.parameters())
    start = scorer.weight.detach().clone()
    averaged.update_parameters(scorer)  # the first update copies
    with torch.no_grad():
        scorer.weight.add_(1.0)
    averaged.update_parameters(scorer)
    torch.testing.assert_close(averaged.module.weight, 0.9 * start + 0.1 * (start + 1.0))  # EMA by hand
    restart_average(averaged, scorer)
    assert int(averaged.n_averaged) == 1 and torch.equal(averaged.module.weight, scorer.weight.detach())
