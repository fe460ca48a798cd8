"""No `rankkit` command destroys an input, and a failed write is one line, exit 2, no temp file.

An output path that is an input (by path, through a symbolic link, as a
hard link, or an input's `.query` sidecar) is refused before anything is written; a full disk
(ENOSPC), a file-size limit (EFBIG), a folder that cannot be written (EACCES) or a file where a
folder should be (ENOTDIR) ends in one line on stderr and exit status 2, with no temporary
file left behind.
"""
from __future__ import annotations

import errno
import hashlib
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rankkit.infra.io import atomic_write, check_outputs
from rankkit.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_cli import CONFIGS, write_letor  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run(argv, capsys) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip()
    return code, err


def assert_one_line(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("rankkit") and "error:" in err, err
    for n in needles:
        assert n in err, err


def temps(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.startswith(".") or p.name.endswith(".tmp")]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """A folder with train.txt, test.txt, a LightGBM-style rank.test + rank.test.query, and a
    fitted LambdaMART model file m.safetensors (5 features)."""
    from rankkit.boosting import LambdaMART
    from rankkit.data.svmlight import read_svmlight

    d = tmp_path_factory.mktemp("guard")
    write_letor(d / "train.txt", 0)
    write_letor(d / "test.txt", 1)
    test = read_svmlight(d / "test.txt")
    (d / "rank.test").write_text("".join(line.split(" ", 2)[0] + " " + line.split(" ", 2)[2] + "\n"
                                         for line in (d / "test.txt").read_text().splitlines()))
    (d / "rank.test.query").write_text("".join(f"{int(s)}\n" for s in test.sizes))
    train = read_svmlight(d / "train.txt")
    model = LambdaMART(n_estimators=3, depth=2, min_data_in_leaf=5)
    model.fit(train.features.numpy(), train.labels.numpy(), group=train.sizes.numpy())
    model.save(d / "m.safetensors")
    return d


@pytest.fixture
def work(files, tmp_path) -> Path:
    """A fresh copy of ``files`` per test (a test that fails must not spoil the next one)."""
    for p in files.iterdir():
        (tmp_path / p.name).write_bytes(p.read_bytes())
    return tmp_path


# -- the output guard ------------------------------------------------------------------------------
def test_predict_refuses_its_input_by_path_symlink_and_hardlink(work, capsys):
    before = digest(work / "test.txt")
    os.symlink(work / "test.txt", work / "link.txt")
    os.link(work / "test.txt", work / "hard.txt")
    os.symlink(work / "test.txt", work / "out-link.tsv")
    model = work / "m.safetensors"
    for inp, out in [("test.txt", "test.txt"), ("link.txt", "test.txt"), ("test.txt", "link.txt"),
                     ("hard.txt", "test.txt"), ("test.txt", "hard.txt"), ("test.txt", "out-link.tsv")]:
        code, err = run(["predict", model, "--input", work / inp, "-o", work / out], capsys)
        assert_one_line(code, err, "`--output`", "is the input `--input`", "never writes over its inputs")
    assert digest(work / "test.txt") == before
    assert os.path.islink(work / "out-link.tsv") and os.path.islink(work / "link.txt")


def test_predict_refuses_the_model_and_the_query_sidecar(work, capsys):
    model, query = work / "m.safetensors", work / "rank.test.query"
    before = (digest(model), digest(query))
    code, err = run(["predict", model, "--input", work / "rank.test", "-o", model], capsys)
    assert_one_line(code, err, "is the input `model`")
    code, err = run(["predict", model, "--input", work / "rank.test", "-o", query], capsys)
    assert_one_line(code, err, "the sidecar of the input `--input`")
    code, err = run(["predict", model, "--input", work / "rank.test", "--query-file", query, "-o", query], capsys)
    assert_one_line(code, err, "`--query-file`")
    assert (digest(model), digest(query)) == before
    # ... and the same command with a fresh output works.
    assert run(["predict", model, "--input", work / "rank.test", "-o", work / "p.tsv"], capsys)[0] == 0
    assert len((work / "p.tsv").read_text().splitlines()) == 24 * 12


def test_export_refuses_its_model(work, capsys):
    model = work / "m.safetensors"
    before = digest(model)
    for fmt in ("torchscript", "export"):
        code, err = run(["export", model, "--format", fmt, "-o", model], capsys)
        assert_one_line(code, err, "`--output`", "is the input `model`")
    os.symlink(model, work / "alias.pt")
    code, err = run(["export", model, "-o", work / "alias.pt"], capsys)
    assert_one_line(code, err, "is the input `model`")
    assert digest(model) == before


def test_export_refuses_a_checkpoint_as_its_own_output(work, tmp_path, capsys):
    args = [f"--data.data={work}", "--trainer.max_epochs=1", f"--trainer.default_root_dir={tmp_path / 'run'}",
            "--trainer.logger=false", "--model.init_args.min_data_in_leaf=5", "--data.val_fraction=0.25"]
    assert main(["fit", "--config", "lambdamart", *args]) == 0
    capsys.readouterr()  # fit's own progress and summary lines
    ckpt = next((tmp_path / "run").rglob("*.ckpt"))
    before = digest(ckpt)
    code, err = run(["export", ckpt, "-o", ckpt], capsys)
    assert_one_line(code, err, "is the input `model`")
    assert digest(ckpt) == before


@pytest.mark.parametrize("argv", [["fit", "--config", "lambdamart", "--con", "FILE"],
                                  ["fit", "--config", "lambdamart", "--co", "FILE"],
                                  ["validate", "--conf", "FILE"],
                                  ["predict", "FILE", "--inp", "FILE"], ["export", "FILE", "--form", "onnx"],
                                  ["compare", "--fold", "1"], ["tune", "--conf", "FILE"], ["info", "--js"]])
def test_no_command_takes_an_abbreviated_option(tmp_path, capsys, argv):
    # argparse's abbreviations (`--con FILE` for `--config FILE`) are a spelling no output check
    # knows: every parser of every command refuses them (run_config.PARSER_SETTINGS), in one line.
    config = tmp_path / "config.yaml"
    config.write_text((CONFIGS / "lambdamart.yaml").read_text())
    before = digest(config)
    code, err = run([str(config) if a == "FILE" else a for a in argv], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert any(why in err for why in ("unrecognized arguments", "the following arguments are required",
                                      "needs a model and its data")), err
    assert digest(config) == before and sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


@pytest.mark.parametrize("spelling", ["--config", "-c"])
def test_fit_refuses_to_rewrite_its_own_config(work, tmp_path, capsys, spelling):
    # `-c` (LightningCLI's alias) rewrote the config: the guard knew `--config` only
    runs = tmp_path / "runs"
    runs.mkdir()
    config = runs / "config.yaml"
    config.write_text((CONFIGS / "lambdamart.yaml").read_text())
    before = digest(config)
    logger = ["--trainer.logger=CSVLogger", f"--trainer.logger.init_args.save_dir={runs}",  # its log folder: runs/
              "--trainer.logger.init_args.name=", "--trainer.logger.init_args.version="]
    code, err = run(["fit", spelling, config, f"--trainer.default_root_dir={runs}", *logger,
                     f"--data.data={work}", "--trainer.max_epochs=1", "--model.init_args.min_data_in_leaf=5",
                     "--data.val_fraction=0.25"], capsys)
    assert_one_line(code, err, "--trainer.default_root_dir", "is the input `--config`")
    assert digest(config) == before
    assert not list(runs.rglob("*.ckpt"))  # refused before training


def test_fit_without_a_logger_leaves_a_config_in_its_root_folder_alone(work, tmp_path, capsys, monkeypatch):
    # Round 4: `fit --trainer.logger=false` wrote its config over any config.yaml in the root
    # folder (the current folder by default): without a logger there is no log folder to record it in.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.yaml").write_text("mine: true\n")
    code, err = run(["fit", "--config", CONFIGS / "lambdamart.yaml", "--trainer.logger=false", f"--data.data={work}",
                     "--trainer.max_epochs=1", "--model.init_args.min_data_in_leaf=5", "--data.val_fraction=0.25",
                     "--quiet"], capsys)
    assert code == 0, err
    assert (tmp_path / "config.yaml").read_text() == "mine: true\n"
    assert list(tmp_path.rglob("*.ckpt"))  # the run trained and kept its checkpoint


def test_compare_refuses_an_output_that_is_an_input(work, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(work / "train.txt", out / "metrics.json")  # compare would write through it
    (work / "vali.txt").write_bytes((work / "test.txt").read_bytes())
    before = digest(work / "train.txt")
    code, err = run(["compare", "--data", work, "--models", "lambdamart", "--max_epochs", "1", "--out", out], capsys)
    assert_one_line(code, err, "`--out`", "is the input `--data`")
    assert digest(work / "train.txt") == before


def test_output_is_a_folder_or_under_a_file(work, capsys):
    model = work / "m.safetensors"
    code, err = run(["predict", model, "--input", work / "test.txt", "-o", work / "test.txt" / "p.tsv"], capsys)
    assert_one_line(code, err, "is a file, not a folder")
    code, err = run(["predict", model, "--input", work / "test.txt", "-o", work], capsys)
    assert_one_line(code, err, "is a folder")
    code, err = run(["export", model, "-o", work / "test.txt" / "m.pt"], capsys)
    assert_one_line(code, err, "is a file, not a folder")
    assert temps(work) == []


def test_a_named_pipe_is_written_into_not_replaced(work, capsys):
    fifo = work / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    assert run(["predict", work / "m.safetensors", "--input", work / "test.txt", "-o", fifo], capsys)[0] == 0
    reader.join(10)
    assert len(got[0].splitlines()) == 24 * 12
    assert not fifo.is_file() and fifo.exists()  # still a pipe, not a regular file renamed over it


@pytest.mark.parametrize("target", ["/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"])
def test_an_open_descriptor_is_appended_through_not_renamed_over(work, target):
    """``rankkit predict M --input t.txt -o /dev/stdout >> log.txt`` renamed a temporary file over
    log.txt (the path resolves to it): its old content was lost. Now the scores go through the
    descriptor, which the shell opened for appending."""
    import subprocess
    import sys

    log = work / "log.txt"
    log.write_text("earlier line\n")
    with open(log, "a") as out:
        done = subprocess.run([sys.executable, "-m", "rankkit.cli", "predict", str(work / "m.safetensors"),
                               "--input", str(work / "test.txt"), "-o", target], stdout=out,
                              stderr=subprocess.PIPE, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = log.read_text().splitlines()
    assert lines[0] == "earlier line" and len(lines) == 1 + 24 * 12
    assert temps(work) == []


def test_check_outputs_directly(tmp_path):
    a = tmp_path / "a.txt"
    a.write_text("x")
    check_outputs({"-o": tmp_path / "b.txt"}, {"--input": a})  # a new file: fine
    check_outputs({"-o": "-"}, {"--input": a})  # stdout: fine
    with pytest.raises(ValueError, match="is the input `--input`"):
        check_outputs({"-o": tmp_path / "x" / ".." / "a.txt"}, {"--input": a})
    with pytest.raises(ValueError, match="is the input `--input`"):
        check_outputs({"-o": [tmp_path / "c", a]}, {"--input": [tmp_path / "d", a]})


# -- failed writes: one line, exit 2, nothing left behind --------------------------------------------
@pytest.mark.parametrize("code_", [errno.ENOSPC, errno.EFBIG, errno.EACCES])
@pytest.mark.parametrize("command", ["predict", "export"])
def test_a_failed_write_is_one_line_and_leaves_no_temp(work, capsys, monkeypatch, command, code_):
    out = work / ("p.tsv" if command == "predict" else "m.pt")
    out.write_text("old")

    def fail(src, dst):
        raise OSError(code_, os.strerror(code_))

    monkeypatch.setattr(os, "replace", fail)
    argv = (["predict", work / "m.safetensors", "--input", work / "test.txt", "-o", out] if command == "predict"
            else ["export", work / "m.safetensors", "-o", out])
    code, err = run(argv, capsys)
    assert_one_line(code, err, os.strerror(code_), str(out))
    assert out.read_text() == "old" and temps(work) == []


def test_a_full_device_is_one_line(work, capsys):
    if not os.path.exists("/dev/full") or os.path.isfile("/dev/full"):
        pytest.skip("no /dev/full")
    code, err = run(["predict", work / "m.safetensors", "--input", work / "test.txt", "-o", "/dev/full"], capsys)
    assert_one_line(code, err, "/dev/full", "No space left on device")
    assert not os.path.isfile("/dev/full")


def _limited(argv: list[str], cwd: Path, limit: int = 2000) -> subprocess.CompletedProcess:
    """Run ``rankkit ARGV`` under a file-size limit (RLIMIT_FSIZE): a longer write fails with EFBIG."""
    def preexec():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "rankkit.cli", *argv], cwd=cwd, env=env, preexec_fn=preexec,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["torchscript", "export"])
def test_export_past_a_file_size_limit_is_one_line_not_an_abort(work, fmt):
    # torch's archive writer aborts the process (SIGABRT) when a write fails; rankkit
    # serialises into memory and writes from Python.
    out = "m.pt" if fmt == "torchscript" else "m.pt2"
    r = _limited(["export", "m.safetensors", "--format", fmt, "-o", out], work)
    err = r.stderr.strip()
    assert r.returncode == 2, err[-2000:]
    assert len(err.splitlines()) == 1 and "File too large" in err and out in err, err
    assert temps(work) == [] and not (work / out).exists()


def test_stale_temp_after_sigkill_does_not_break_the_next_write(tmp_path):
    target = tmp_path / "out.txt"
    code = ("import sys, time; sys.path.insert(0, %r)\n"
            "from rankkit.infra.io import atomic_write\n"
            "def w(tmp):\n    open(tmp, 'w').write('half'); print('writing', flush=True); time.sleep(60)\n"
            "atomic_write(%r, w)\n" % (str(ROOT), str(target)))
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "writing"
    p.send_signal(signal.SIGKILL)
    p.wait(10)
    stale = [n for n in os.listdir(tmp_path) if n != "out.txt"]
    assert len(stale) == 1 and not target.exists()  # SIGKILL cannot clean up ...
    atomic_write(target, lambda tmp: Path(tmp).write_text("whole"))
    assert os.listdir(tmp_path) == ["out.txt"] and target.read_text() == "whole"  # ... the next write does


def test_a_running_writer_s_temp_is_left_alone(tmp_path):
    target = tmp_path / "out.txt"
    mine = tmp_path / f".out.txt.{os.getppid()}.rkabcdef.tmp"  # a live process's temp (our parent)
    mine.write_text("busy")
    time.sleep(0.01)
    atomic_write(target, lambda tmp: Path(tmp).write_text("x"))
    assert mine.exists()


@pytest.mark.slow
def test_fit_past_a_file_size_limit_is_one_line(work, tmp_path):
    # 5000 bytes: the config copy (about 2.5 KB) fits, the LambdaMART checkpoint does not.
    r = _limited(["fit", "--config", "lambdamart", f"--data.data={work}", "--trainer.max_epochs=2",
                  f"--trainer.default_root_dir={tmp_path / 'run'}", "--model.init_args.min_data_in_leaf=5",
                  "--data.val_fraction=0.25"], work, limit=5000)
    err = r.stderr.strip()
    assert r.returncode == 2, err[-2000:]
    lines = [line for line in err.splitlines() if not re.match(r"rankkit fit: \d+/\d+ trees, ", line)]  # progress
    assert len(lines) == 1 and "File too large" in err and "default_root_dir" in err, err
    assert not list((tmp_path / "run").rglob("*.ckpt")) and not list((tmp_path / "run").rglob(".*tmp"))


def test_memory_error_is_one_line(work, capsys, monkeypatch):
    import rankkit.serving

    def huge(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(rankkit.serving, "predict_file", huge)
    code, err = run(["predict", work / "m.safetensors", "--input", work / "test.txt"], capsys)
    assert_one_line(code, err, "out of memory")


def test_fit_still_copies_its_config_atomically_with_normal_permissions(work, tmp_path, capsys):
    old = os.umask(0o022)
    try:
        assert main(["fit", "--config", "lambdamart", f"--data.data={work}", "--trainer.max_epochs=1",
                     f"--trainer.default_root_dir={tmp_path}",
                     "--model.init_args.min_data_in_leaf=5", "--data.val_fraction=0.25"]) == 0
    finally:
        os.umask(old)
    copy = tmp_path / "lightning_logs" / "version_0" / "config.yaml"  # the logger's folder (none without one)
    assert "LambdaMARTModule" in copy.read_text() and (copy.stat().st_mode & 0o777) == 0o644
    assert temps(tmp_path) == []


def test_a_checkpoints_recorded_custom_loss_is_never_imported(work, tmp_path, capsys):
    # Round 4: a checkpoint recording a custom loss by name made a resumed `fit --ckpt_path` import
    # that module and train with it instead of the config's objective.
    import torch

    code, err = run(["fit", "--config", "lambdamart", f"--data.data={work}", "--trainer.max_epochs=1",
                     f"--trainer.default_root_dir={tmp_path / 'run'}", "--model.init_args.min_data_in_leaf=5",
                     "--data.val_fraction=0.25", "--quiet"], capsys)
    assert code == 0, err
    ckpt = torch.load(next((tmp_path / "run").rglob("*.ckpt")), weights_only=True)
    ckpt["hyper_parameters"] = {**ckpt["hyper_parameters"], "objective": "planted_module.loss", "k": None,
                                "normalize": False}
    edited = tmp_path / "edited.ckpt"
    torch.save(ckpt, edited)
    for argv in (["fit", "--config", "lambdamart", f"--data.data={work}", "--trainer.max_epochs=2",
                  f"--trainer.default_root_dir={tmp_path / 'run2'}", "--data.val_fraction=0.25",
                  f"--ckpt_path={edited}"],
                 ["test", f"--ckpt_path={edited}", f"--data.data={work}"]):
        code, err = run(argv, capsys)
        assert_one_line(code, err, "records the custom objective 'planted_module.loss' (text, never imported",
                        "--model.init_args.objective=planted_module.loss")
    assert "planted_module" not in sys.modules
