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


def test_a_custom_objective_drops_the_configs_kernel_options_and_refuses_the_command_lines():
    """Issue 51: a custom objective on the packaged lambdamart config (k: 10, normalize: true) was
    refused in jsonargparse's Union noise unless the user also reset the kernel's options."""
    from rankkit.training.lightning_cli import clear_kernel_options

    args = {"objective": "mypkg.losses.listnet", "k": 10, "normalize": True, "sigma": 1.0, "depth": 6}
    assert clear_kernel_options(args, ["--model.init_args.depth=4"]) == ["k=10", "normalize=True"]
    assert args == {"objective": "mypkg.losses.listnet", "k": None, "normalize": False, "sigma": 1.0, "depth": 6}
    with pytest.raises(ValueError, match=r"`--model.init_args.k=5` configures the built-in lambda kernel; the "
                                         r"custom objective mypkg.losses.listnet takes its own"):
        clear_kernel_options({"objective": "mypkg.losses.listnet", "k": 5}, ["--model.init_args.k=5"])
    neural = {"loss": "mypkg.losses.listnet", "k": 10, "sigma": 2.0}
    assert clear_kernel_options(neural, []) == ["k=10", "sigma=2.0"] and neural["k"] is None
    builtin = {"objective": "lambdarank", "k": 10, "normalize": True}
    assert clear_kernel_options(builtin, []) == [] and builtin["k"] == 10
    # issue 52: a neural ranker's `objective=` (the new spelling of `loss=`) clears the neural kernel's options
    spelled = {"objective": "mypkg.losses.listnet", "k": 10, "sigma": 2.0, "loss": None}
    assert clear_kernel_options(spelled, [], neural=True) == ["k=10", "sigma=2.0"] and spelled["sigma"] == 1.0


def test_rankkit_fit_takes_a_custom_objective_from_the_current_folder(tmp_path, monkeypatch, capsys):
    """The installed `rankkit` command runs without the current folder on sys.path; a config's
    `mypkg.losses.fn` resolves from it as `python -m` would, and the error names where it looked."""
    import sys

    from tests.test_cli import write_letor

    package = tmp_path / "rk_user_losses"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "losses.py").write_text(
        "import torch\n\n\ndef listnet(scores, labels, mask):\n"
        "    s = scores.masked_fill(~mask, -1e9)\n    t = labels.masked_fill(~mask, -1e9)\n"
        "    return -(torch.softmax(t, -1) * torch.log_softmax(s, -1)).masked_fill(~mask, 0).sum(-1)\n")
    for seed, name in enumerate(("train.txt", "vali.txt", "test.txt")):
        write_letor(tmp_path / name, seed)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path), ".")])
    base = ["fit", "--config", "lambdamart", f"--data.data={tmp_path}", "--trainer.max_epochs=1",
            f"--trainer.default_root_dir={tmp_path / 'run'}", "--model.init_args.min_data_in_leaf=5", "--quiet"]
    try:
        assert main([*base, "--model.init_args.objective=rk_user_losses.losses.listnet"]) == 0
        err = capsys.readouterr().err
        assert "the config's k=10, normalize=True (the built-in kernel's) do not apply and are left out" in err
        assert main([*base, "--model.init_args.objective=rk_user_losses.nosuch.fn"]) == 2
        err = capsys.readouterr().err
        assert f"No module named 'rk_user_losses.nosuch'; looked for 'rk_user_losses.nosuch' on sys.path and in " \
               f"the current folder {tmp_path}" in err
    finally:
        for name in [m for m in sys.modules if m.startswith("rk_user_losses")]:
            del sys.modules[name]
