"""`rankkit predict` and `rankkit info` on interrupts, endless files and pipes: one line, no partial
output, one read."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rankkit.cli import main
from rankkit.data import make_synthetic


def test_ctrl_c_during_predict_is_one_line_and_leaves_no_output(tmp_path, capsys, monkeypatch):
    from rankkit import LambdaMART

    data = make_synthetic(6, 5, 3, seed=0)
    LambdaMART(n_estimators=2, depth=2, min_data_in_leaf=2).fit(data).save(tmp_path / "m.safetensors")
    lines = [f"{int(data.labels[i])} qid:{1 + i // 5} " + " ".join(f"{j + 1}:{float(v):.4g}" for j, v in
                                                                  enumerate(data.features[i])) for i in range(30)]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    import rankkit.serving as serving

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(serving, "predict_file", interrupted)
    out = tmp_path / "scores.tsv"
    assert main(["predict", str(tmp_path / "m.safetensors"), "--input", str(tmp_path / "in.txt"),
                 "-o", str(out)]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "rankkit predict: interrupted" and not out.exists()


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_info_on_dev_zero_ends_with_one_line(capsys):
    assert main(["info", "/dev/zero"]) == 2
    assert "/dev/zero:1: line longer than MAX_LINE_BYTES" in capsys.readouterr().err


def test_info_and_the_reader_read_a_pipe_once(tmp_path):
    """A pipe is not counted first (that would consume it): its documents are all read."""
    text = "1 qid:1 1:0.5 2:1\n0 qid:1 1:0.1\n2 qid:2 2:3\n"
    out = subprocess.run([sys.executable, "-m", "rankkit.cli", "info", "/dev/stdin", "--json"], input=text,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)["/dev/stdin"]
    assert summary["queries"] == 2 and summary["documents"] == 3 and summary["features"] == 2


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigterm_and_sigint_end_a_fit_with_one_line_and_the_shells_status(tmp_path):
    # Round 4: SIGTERM ended `fit` with exit 0 and no message, Ctrl-C with exit 1 (Lightning's).
    import signal

    from tests.test_cli import CONFIGS, write_letor

    for seed, name in enumerate(("train.txt", "vali.txt", "test.txt")):
        write_letor(tmp_path / name, seed)
    runs = {}
    for sig in (signal.SIGTERM, signal.SIGINT):  # both at once: one wait
        runs[sig] = subprocess.Popen(
            [sys.executable, "-m", "rankkit.cli", "fit", "--config", str(CONFIGS / "lambdarank.yaml"),
             f"--data.data={tmp_path}", "--trainer.max_epochs=100000", "--trainer.callbacks=[]",
             f"--trainer.default_root_dir={tmp_path / f'run{int(sig)}'}"], stderr=subprocess.PIPE, text=True)
    for sig, proc in runs.items():
        for line in proc.stderr:  # the first progress line comes after the first epoch
            if line.startswith("rankkit fit: 1/"):
                break
        proc.send_signal(sig)
        rest = proc.stderr.read()
        assert proc.wait(timeout=120) == 128 + int(sig)
        assert rest.strip().splitlines()[-1] == ("rankkit fit: terminated" if sig == signal.SIGTERM
                                                 else "rankkit fit: interrupted"), rest
        assert "Traceback" not in rest
