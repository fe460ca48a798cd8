"""rankkit.neural.optim: the optimiser and the schedule each `scheduler` setting builds."""
import math
from types import SimpleNamespace

import pytest
import torch

from rankkit.neural.optim import WarmupCosine, optimizers


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
