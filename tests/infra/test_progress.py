"""rankkit.infra.progress: a quiet fit's progress, as one rewritten line in a terminal and as lines in a log."""
import io
from types import SimpleNamespace

import pytest
import torch

from rankkit.infra import progress


def test_a_log_gets_its_first_line_after_the_first_epoch_then_every_10_or_30_seconds(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: clock[0])
    stream = io.StringIO()
    bar = progress.FitProgress(stream=stream)
    trainer = SimpleNamespace(current_epoch=0, max_epochs=100, is_global_zero=True, sanity_checking=False,
                              callback_metrics={"val/ndcg@10": torch.tensor(0.5)})
    bar.on_fit_start(trainer, SimpleNamespace(train_batching="query"))
    written = []
    for epoch, seconds in enumerate([20.0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 31, 1]):  # a slow first epoch
        clock[0] += seconds
        trainer.current_epoch = epoch
        bar.on_validation_epoch_end(trainer, None)
        written.append(len(stream.getvalue().splitlines()))
    # epoch 0 at once (not after 10 epochs), epoch 9 (every 10), epoch 11 (31 s after the last line)
    assert written == [1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 3]
    assert stream.getvalue().splitlines()[0].startswith("rankkit fit: 1/100 epochs, val/ndcg@10 0.5000")


def test_the_progress_bar_rewrites_one_line_in_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = Terminal()
    bar = progress.FitProgress(stream=stream)
    module = SimpleNamespace(train_batching="dataset")
    trainer = SimpleNamespace(current_epoch=0, max_epochs=3, is_global_zero=True, sanity_checking=False,
                              callback_metrics={"val/ndcg@10": torch.tensor(0.5)})
    bar.on_fit_start(trainer, module)
    for epoch, value in enumerate((0.5, 0.7, 0.6)):
        trainer.current_epoch, trainer.callback_metrics = epoch, {"val/ndcg@10": torch.tensor(value)}
        bar.on_validation_epoch_end(trainer, module)
    bar.on_fit_end(trainer, module)
    text = stream.getvalue()
    assert text.count("\r") == 3 and text.count("\n") == 1
    assert "3/3 trees, val/ndcg@10 0.6000; best 0.7000 at epoch=1 (2 trees)" in text


@pytest.mark.parametrize("mode", ["max", "min"])
def test_the_progress_line_names_the_best_epoch_of_the_checkpoints_metric(mode):
    """Trust round 4: with unbiased="auto" the checkpoint is kept by val/explained_clicks, but the
    progress line's "best ... at epoch=E" was val/ndcg@10's best epoch, another epoch."""
    stream = io.StringIO()
    bar = progress.FitProgress(stream=stream, every=1)
    cb = SimpleNamespace(monitor="val/explained_clicks", mode=mode)
    trainer = SimpleNamespace(current_epoch=0, max_epochs=3, is_global_zero=True, sanity_checking=False,
                              checkpoint_callback=cb, callback_metrics={})
    bar.on_fit_start(trainer, SimpleNamespace(train_batching="query"))
    for epoch, (ndcg, clicks) in enumerate(((0.9, -0.5), (0.5, -0.3), (0.6, -0.4))):
        trainer.current_epoch = epoch
        trainer.callback_metrics = {"val/ndcg@10": torch.tensor(ndcg), "val/explained_clicks": torch.tensor(clicks)}
        bar.on_validation_epoch_end(trainer, None)
    last = stream.getvalue().splitlines()[-1]
    best, epoch = (-0.3, 1) if mode == "max" else (-0.5, 0)
    assert f"val/explained_clicks -0.4000; best {best:.4f} at epoch={epoch}" in last, last


def test_a_log_ends_with_the_best_epoch_and_other_ranks_write_nothing():
    stream = io.StringIO()
    bar = progress.FitProgress(stream=stream, every=10, seconds=1e9)
    trainer = SimpleNamespace(current_epoch=0, max_epochs=None, is_global_zero=True, sanity_checking=False,
                              callback_metrics={})
    bar.on_fit_start(trainer, SimpleNamespace(train_batching="dataset"))
    for epoch, value in enumerate((0.5, 0.8, 0.7, 0.6)):
        trainer.current_epoch, trainer.callback_metrics = epoch, {"val/ndcg@10": torch.tensor(value)}
        bar.on_validation_epoch_end(trainer, None)
    trainer.current_epoch = 4  # Lightning's count after the last epoch
    bar.on_fit_end(trainer, None)
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("rankkit fit: 1 trees, val/ndcg@10 0.5000") and len(lines) == 2
    assert lines[1] == "rankkit fit: 4 trees done, best val/ndcg@10 0.8000 at epoch=1 (2 trees)"
    quiet = io.StringIO()
    other = progress.FitProgress(stream=quiet)
    trainer.is_global_zero = False
    other.on_fit_start(trainer, None)
    other.on_validation_epoch_end(trainer, None)
    other.on_fit_end(trainer, None)
    assert quiet.getvalue() == ""
