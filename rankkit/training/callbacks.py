"""Model selection that does not chase one epoch: a validation metric read as a trailing mean.

On a small validation set (MQ2008 has about 157 queries a fold) one epoch's NDCG@10 moves by
more than the differences between settings, and a checkpoint or early stopping that watches it
keeps whichever epoch was lucky. :class:`SmoothedMetric` adds the trailing mean of a logged
metric over the last ``window`` epochs as a metric of its own, ``"<monitor>@mean<window>"``,
for ``ModelCheckpoint`` and ``EarlyStopping`` to watch::

    callbacks:
      - class_path: rankkit.training.callbacks.SmoothedMetric
        init_args: {monitor: val/ndcg@10, window: 3}
      - class_path: pytorch_lightning.callbacks.EarlyStopping
        init_args: {monitor: val/ndcg@10@mean3, mode: max, patience: 8}
      - class_path: pytorch_lightning.callbacks.ModelCheckpoint
        init_args: {monitor: val/ndcg@10@mean3, mode: max, filename: "best-{epoch}"}

The checkpoint kept is the last epoch of the best window (a checkpoint cannot wait for the
epochs after it); :class:`rankkit.boosting.LambdaMART`'s ``early_stopping_window`` keeps the
window's centre, since every tree is at hand.
"""
from __future__ import annotations

import math

import pytorch_lightning as pl
import torch

from rankkit.infra.checks import check_int


class SmoothedMetric(pl.Callback):
    """Log the trailing mean of ``monitor`` over the last ``window`` validation epochs (fewer at
    the start) as ``name`` (default ``f"{monitor}@mean{window}"``), where checkpoints and early
    stopping read metrics. List it before any ``EarlyStopping`` that watches it (checked when
    the fit starts; ``ModelCheckpoint`` always runs last)."""

    def __init__(self, monitor: str = "val/ndcg@10", window: int = 3, name: str | None = None):
        if not isinstance(monitor, str) or not monitor:
            raise ValueError(f"`monitor` has to be a metric's name, got {monitor!r}")
        self.monitor = monitor
        self.window = check_int(window, "window", low=1)
        self.name = name or f"{monitor}@mean{self.window}"
        self.values: list[float] = []

    @property
    def state_key(self) -> str:
        return f"SmoothedMetric[{self.name}]"

    def state_dict(self) -> dict:
        return {"values": list(self.values)}

    def load_state_dict(self, state_dict: dict) -> None:  # a resumed fit continues the same mean
        self.values = [float(v) for v in state_dict.get("values", [])]

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        mine = trainer.callbacks.index(self)
        for i, callback in enumerate(trainer.callbacks[:mine]):
            if isinstance(callback, pl.callbacks.EarlyStopping) and callback.monitor == self.name:
                raise ValueError(f"SmoothedMetric({self.name!r}) has to come before the EarlyStopping that watches "
                                 f"it (trainer callback {i} comes first): list it earlier in `trainer.callbacks`")

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        value = trainer.callback_metrics.get(self.monitor)
        if value is None:
            raise ValueError(f"SmoothedMetric: no metric {self.monitor!r} was logged (logged: "
                             f"{sorted(trainer.callback_metrics)})")
        self.values.append(float(value))
        recent = self.values[-self.window:]
        mean = math.fsum(recent) / len(recent)
        trainer.callback_metrics[self.name] = torch.tensor(mean, dtype=torch.float64)
        if trainer.logger is not None:
            trainer.logger.log_metrics({self.name: mean}, step=trainer.global_step)
