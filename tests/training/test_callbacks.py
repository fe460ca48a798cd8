"""rankkit.training.callbacks: a validation curve read as a trailing mean, for checkpoints and
early stopping; checked against the same rule written as a loop over a noisy curve."""
from __future__ import annotations

import math

import pytest
import pytorch_lightning as pl
import torch

from rankkit.training.callbacks import SmoothedMetric

CURVE = [0.50, 0.52, 0.70, 0.51, 0.53, 0.60, 0.61, 0.62, 0.61, 0.60, 0.55, 0.50, 0.50, 0.49, 0.48, 0.47]


class Scripted(pl.LightningModule):
    """Logs ``val/ndcg@10`` = CURVE[epoch]: a noisy curve with one lucky epoch (2)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def training_step(self, batch, batch_idx):
        return (self.w * batch[0]).sum()

    def validation_step(self, batch, batch_idx):
        self.log("val/ndcg@10", CURVE[self.current_epoch], on_epoch=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(2, 1)), batch_size=2)

    val_dataloader = train_dataloader


EPOCHS = len(CURVE)


def fit(tmp_path, callbacks, epochs=EPOCHS):
    checkpoint = [c for c in callbacks if isinstance(c, pl.callbacks.ModelCheckpoint)]
    trainer = pl.Trainer(max_epochs=epochs, callbacks=callbacks, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=tmp_path)
    trainer.fit(Scripted())
    return trainer, checkpoint[0] if checkpoint else None


def slow_choice(curve, window, patience):
    """(best epoch, epochs run): the window's last epoch, as a checkpoint keeps it."""
    best, best_epoch = -math.inf, -1
    for t in range(len(curve)):
        recent = curve[max(0, t - window + 1):t + 1]
        mean = sum(recent) / len(recent)
        if mean > best:
            best, best_epoch = mean, t
        if t - best_epoch >= patience:
            return best_epoch, t + 1
    return best_epoch, len(curve)


@pytest.mark.parametrize("window", [1, 3, 5])
def test_checkpoints_and_early_stopping_read_the_trailing_mean(tmp_path, window):
    key = f"val/ndcg@10@mean{window}"
    trainer, checkpoint = fit(tmp_path, [
        SmoothedMetric("val/ndcg@10", window),
        pl.callbacks.EarlyStopping(monitor=key, mode="max", patience=4),
        pl.callbacks.ModelCheckpoint(monitor=key, mode="max", filename="best-{epoch}", dirpath=tmp_path / "ck")])
    best, ran = slow_choice(CURVE, window, 4)
    assert checkpoint.best_model_path.endswith(f"best-epoch={best}.ckpt")
    assert trainer.current_epoch == ran
    recent = CURVE[max(0, best - window + 1):best + 1]
    assert float(checkpoint.best_model_score) == pytest.approx(sum(recent) / len(recent), abs=1e-6)  # logged as float32
    assert (best == 2) == (window == 1)  # the lucky epoch is kept only without a window


def test_it_has_to_come_before_the_early_stopping_that_watches_it(tmp_path):
    with pytest.raises(ValueError, match="has to come before the EarlyStopping"):
        fit(tmp_path, [pl.callbacks.EarlyStopping(monitor="val/ndcg@10@mean3", mode="max"),
                       SmoothedMetric("val/ndcg@10", 3)], epochs=2)


def test_bad_settings_and_a_missing_metric_are_one_line(tmp_path):
    with pytest.raises(ValueError, match="`window`"):
        SmoothedMetric(window=0)
    with pytest.raises(ValueError, match="`monitor`"):
        SmoothedMetric(monitor="")
    with pytest.raises(ValueError, match="no metric 'val/map'"):
        fit(tmp_path, [SmoothedMetric("val/map", 2)], epochs=1)


def test_a_resumed_fit_continues_the_same_mean():
    a = SmoothedMetric(window=3)
    a.values = [0.1, 0.2]
    b = SmoothedMetric(window=3)
    b.load_state_dict(a.state_dict())
    assert b.values == [0.1, 0.2] and b.state_key == "SmoothedMetric[val/ndcg@10@mean3]"
