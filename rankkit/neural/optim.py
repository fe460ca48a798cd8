"""The neural rankers' optimiser and learning-rate schedule, from their hyper-parameters
(``optimizer``, ``lr``, ``weight_decay``, ``scheduler``), and the weight average (``ema_decay``)."""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from rankkit.neural.config import OPTIMIZERS


def optimizers(params: list[dict], hparams, trainer=None):
    """What ``configure_optimizers`` returns for parameter groups ``params``: the optimiser, and
    with a ``scheduler`` the Lightning scheduler config (``trainer`` sizes the cosine schedules;
    None, outside a fit: one epoch, or 10^6 steps)."""
    h = hparams
    opt = OPTIMIZERS[h.optimizer](params, lr=h.lr, weight_decay=h.weight_decay)
    if h.scheduler == "cosine":
        t_max = max(1, trainer.max_epochs or 1) if trainer is not None else 1
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.CosineAnnealingLR(opt, t_max)}
    if h.scheduler == "plateau":
        sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max", factor=0.5, patience=2)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "monitor": "val/ndcg@10"}}
    if h.scheduler == "warmup_cosine":
        steps = trainer.estimated_stepping_batches if trainer is not None else 1
        sched = torch.optim.lr_scheduler.LambdaLR(opt, WarmupCosine(int(steps) if math.isfinite(steps) else 10**6))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
    return opt


def weight_average(scorer: nn.Module, decay: float) -> AveragedModel | None:
    """The exponential moving average of ``scorer``'s weights (and buffers) with ``decay`` (the
    module's ``ema_decay``; None for 0), which serves and exports in the scorer's place."""
    if decay <= 0:
        return None
    averaged = AveragedModel(scorer, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True)
    averaged.requires_grad_(False)
    return averaged


def restart_average(averaged: AveragedModel | None, scorer: nn.Module) -> None:
    """Start the average again from ``scorer``'s weights (the weights training starts from)."""
    if averaged is not None:
        averaged.n_averaged.zero_()
        averaged.update_parameters(scorer)


class WarmupCosine:
    """The lr factor of step t of ``total``: (t + 1) / w over the first w = max(1, total / 20)
    steps, then ½ (1 + cos(π (t − w) / (total − w))), reaching 0 at the last step.

    >>> f = WarmupCosine(100)
    >>> [round(f(t), 3) for t in (0, 4, 5, 52, 99)]
    [0.2, 1.0, 1.0, 0.5, 0.0]
    """

    def __init__(self, total: int):
        self.total, self.warm = max(2, total), max(1, total // 20)

    def __call__(self, step: int) -> float:
        if step < self.warm:
            return (step + 1) / self.warm
        span = max(1, self.total - 1 - self.warm)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - self.warm) / span)))
