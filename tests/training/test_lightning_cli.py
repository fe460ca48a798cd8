"""rankkit.training.lightning_cli: a failed fit leaves no log folder of its own behind, unless it
holds a checkpoint; the fit's last line."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from rankkit.cli import main
from rankkit.training.lightning_cli import RankkitCLI, new_folder, remove_if_no_checkpoint
from tests.test_cli import CONFIGS, quick, write_letor


def test_new_folder_is_the_top_most_folder_a_run_would_create(tmp_path):
    assert new_folder(str(tmp_path / "lightning_logs" / "version_0")) == str(tmp_path / "lightning_logs")
    (tmp_path / "lightning_logs").mkdir()
    assert new_folder(str(tmp_path / "lightning_logs" / "version_0")) == str(tmp_path / "lightning_logs" / "version_0")
    assert new_folder(str(tmp_path)) is None


def test_a_folder_holding_a_checkpoint_is_kept(tmp_path):
    kept = tmp_path / "a"
    (kept / "checkpoints").mkdir(parents=True)
    (kept / "checkpoints" / "best-epoch=3.ckpt").write_bytes(b"x")
    gone = tmp_path / "b"
    gone.mkdir()
    (gone / "config.yaml").write_text("x: 1\n")
    assert not remove_if_no_checkpoint(str(kept)) and kept.exists()
    assert remove_if_no_checkpoint(str(gone)) and not gone.exists()


def test_a_failed_fit_removes_only_the_log_folder_it_created(tmp_path, capsys):
    data = tmp_path / "letor"
    data.mkdir()
    for seed, name in enumerate(("train.txt", "vali.txt", "test.txt")):
        write_letor(data / name, seed)
    root = tmp_path / "run"
    (root / "lightning_logs" / "version_0").mkdir(parents=True)  # an earlier run's folder stays
    args = ["fit", "--config", str(CONFIGS / "lambdamart.yaml"), *quick(data, root, epochs=3),
            "--model.init_args.learning_rate=1e300"]  # overflows in round 1: a failure after setup
    assert main(args) == 2  # a user error: one line, exit status 2
    assert "not a finite float32" in capsys.readouterr().err
    assert sorted(p.name for p in (root / "lightning_logs").iterdir()) == ["version_0"]


@pytest.mark.parametrize("choice", [None, "dla"])
def test_the_fit_line_says_which_debiasing_the_race_chose(capsys, choice):
    """A quiet fit's last line names the winner of a neural ``unbiased="auto"`` race (issue 49:
    `rankkit fit` never said which debiasing won)."""
    cli = RankkitCLI.__new__(RankkitCLI)
    cb = SimpleNamespace(best_model_path="/tmp/x.ckpt", best_model_score=0.5, monitor="val/ndcg@10")
    cli.quiet = True
    cli.trainer = SimpleNamespace(is_global_zero=True, checkpoint_callback=cb, current_epoch=4)
    cli.model = SimpleNamespace(unbiased_choice_=choice)
    cli.after_fit()
    out = capsys.readouterr().out.strip()
    assert out.startswith("rankkit fit: 4 epochs; checkpoint /tmp/x.ckpt, val/ndcg@10 0.5000")
    assert out.endswith("; unbiased='auto' chose dla") == (choice is not None)
