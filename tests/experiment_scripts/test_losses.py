"""experiments/losses.py: every loss, neural and trees, on a --small MQ2008 setting."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments"))
import losses as experiment  # noqa: E402

LOSSES = ["ranknet", "softmax"]  # one pairwise weighting, one listwise loss


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    out = tmp_path_factory.mktemp("losses")
    runs = out / "runs.jsonl"
    argv = ["--small", "--losses", ",".join(LOSSES), "--runs", str(runs), "--plot", str(out / "losses.png")]
    return argv, experiment.main(argv), runs, out


def test_one_well_formed_row_per_loss_and_side(small):
    _, rows, _, _ = small
    assert sorted((r["loss"], r["side"]) for r in rows) == sorted(
        (loss, side) for loss in LOSSES for side in ("neural", "trees"))
    for r in rows:
        assert r["runs"] == 1  # --small: fold 1, seed 0
        assert 0.0 <= r["test"] <= 1.0 and 0.0 <= r["vali"] <= 1.0
        assert r["test_sd"] == 0.0
        assert r["seconds"] > 0 and r["steps"] >= 1


def test_runs_file_resumes_without_training(small, monkeypatch):
    argv, rows, runs, _ = small
    lines = [json.loads(line) for line in runs.read_text().splitlines()]
    assert len(lines) == len(LOSSES) * 2
    fail = lambda *a, **k: pytest.fail("a run already in --runs was trained again")  # noqa: E731
    monkeypatch.setattr(experiment, "run_neural", fail)
    monkeypatch.setattr(experiment, "run_trees", fail)
    assert experiment.main(argv) == rows


def test_table_and_plot(small):
    _, rows, _, out = small
    md = experiment.table(rows, LOSSES, ["neural", "trees"])
    body = md.splitlines()
    assert len(body) == 2 + len(LOSSES)
    assert body[2].startswith("| ranknet | pairwise |") and body[3].startswith("| softmax | listwise |")
    assert (out / "losses.png").stat().st_size > 0


def test_unknown_loss_is_named():
    with pytest.raises(SystemExit):
        experiment.main(["--small", "--losses", "ranknet,lambdamart_magic"])
