"""Progress of a quiet ``rankkit fit``: a one-line bar in a terminal, a line every few epochs in a log.

``rankkit fit`` hides Lightning's own progress bar, model summary and tips unless ``--verbose``;
without some sign of life a LambdaMART fit printed nothing for 45 s. :class:`FitProgress` writes
to stderr after every validation (or training epoch without one):

* in a terminal (stderr is a TTY), one line rewritten in place: epochs (or trees) done of the
  maximum, the metric the checkpoint is kept by (the ModelCheckpoint's ``monitor``; validation
  NDCG@10 without one) and its best so far, at ``epoch=E``: the 0-based index
  Lightning's checkpoint names use (``best-epoch=E.ckpt``) with the count it means (E + 1 trees
  for LambdaMART), seconds elapsed;
* otherwise (a log file, CI), one full line after the first epoch (tree), then every ``every``
  epochs and whenever ``seconds`` have passed since the last one, and at the end, with the same
  fields: a log is never silent for longer than ``seconds`` plus one epoch.

``--quiet`` turns it off; ``fit`` still ends with its one summary line.
"""
from __future__ import annotations

import math
import sys
import time

import pytorch_lightning as pl

MONITOR = "val/ndcg@10"


class FitProgress(pl.Callback):
    """Epoch progress and the monitored metric on ``stream`` (stderr), as a bar or as log lines.

    Args:
        every: in a log, a line every this many epochs (trees).
        seconds: ... and at least every this many seconds.
        stream: where to write (default stderr); a TTY gets the one-line bar.
    """

    def __init__(self, every: int = 10, seconds: float = 30.0, stream=None):
        self.every, self.seconds = every, seconds
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.best = -math.inf
        self.best_epoch = None
        self.started = self.last = 0.0
        self.unit = "epoch"
        self.monitor, self.sign = MONITOR, 1.0  # the checkpoint's metric and direction (on_fit_start)
        self.reported = None  # the epoch of the last line written (logs)

    def on_fit_start(self, trainer, pl_module) -> None:
        self.started = self.last = time.perf_counter()
        self.unit = "tree" if getattr(pl_module, "train_batching", None) == "dataset" else "epoch"
        # The metric the run keeps its checkpoint by (val/explained_clicks for unbiased="auto"):
        # "best ... at epoch=E" names the epoch of the checkpoint, not of another metric's best.
        cb = getattr(trainer, "checkpoint_callback", None)
        self.monitor = getattr(cb, "monitor", None) or MONITOR
        self.sign = -1.0 if getattr(cb, "mode", "max") == "min" and cb.monitor else 1.0
        self.best, self.best_epoch = -math.inf, None

    def _line(self, trainer, value) -> str:
        done = trainer.current_epoch + 1
        total = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else None
        parts = [f"rankkit fit: {done}" + (f"/{total}" if total else "") + f" {self.unit}s"]
        if value is not None:
            parts.append(f"{self.monitor} {value:.4f}; best {self.sign * self.best:.4f} at {self._at(self.best_epoch)}")
        parts.append(f"{time.perf_counter() - self.started:.0f} s")
        return ", ".join(parts)

    def _at(self, epoch: int) -> str:
        """``epoch=E`` (0-based, as Lightning's checkpoint names) and the count it means."""
        return f"epoch={epoch} ({epoch + 1} {self.unit}{'s' if epoch else ''})"

    def _report(self, trainer, final: bool = False) -> None:
        if not trainer.is_global_zero or trainer.sanity_checking:
            return
        metric = trainer.callback_metrics.get(self.monitor)
        value = None if metric is None else float(metric)
        if value is not None and self.sign * value > self.best:
            self.best, self.best_epoch = self.sign * value, trainer.current_epoch
        now = time.perf_counter()
        if self.tty:
            end = "\n" if final else ""
            self.stream.write("\r" + self._line(trainer, value).ljust(100) + end)
            self.stream.flush()
        elif final or self.reported is None or (trainer.current_epoch + 1) % self.every == 0 \
                or now - self.last >= self.seconds:
            self.stream.write(self._line(trainer, value) + "\n")
            self.stream.flush()
            self.last, self.reported = now, trainer.current_epoch

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self._report(trainer)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if not trainer.val_dataloaders or trainer.limit_val_batches == 0:  # no validation: report here
            self._report(trainer)

    def on_fit_end(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
        elif self.reported != trainer.current_epoch - 1 and self.best_epoch is not None:
            done = trainer.current_epoch
            self.stream.write(f"rankkit fit: {done} {self.unit}{'s' if done != 1 else ''} done, best "
                              f"{self.monitor} {self.sign * self.best:.4f} at {self._at(self.best_epoch)}\n")
            self.stream.flush()
