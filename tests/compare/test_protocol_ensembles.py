"""`rankkit compare` with a list-aware model and seed ensembling: each seed's and the ensemble's
scorer exported, reloaded and checked; the ensemble is the mean of the seeds' scores."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rankkit.cli import main
from rankkit.compare.protocol import compare
from rankkit.export import load_scorer
from rankkit.serving import as_scorer, score_queries
from test_cli import write_letor

CONFIGS = Path(__file__).resolve().parents[2] / "rankkit" / "configs"


@pytest.fixture(scope="module")
def letor(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("letor")
    for seed, name in enumerate(("train.txt", "vali.txt", "test.txt")):
        write_letor(folder / name, seed)
    return folder


def test_compare_trains_exports_and_ensembles_a_list_aware_model(letor, tmp_path):
    out = tmp_path / "run"
    result = compare(data=str(letor), seeds=2, models=["transformer"], out=str(out), max_epochs=1,
                     ensemble=True, log=lambda _: None)
    runs = {(r["model"], r["seed"]): r for r in result["runs"]}
    assert set(runs) == {("LambdaRank", 0), ("LambdaRank", 1), ("LambdaRank ×2", "ensemble")}
    test = [line for line in (letor / "test.txt").read_text().splitlines()]
    from rankkit.data.svmlight import read_svmlight

    data = read_svmlight(letor / "test.txt")
    assert len(test) == data.n_docs

    def scores(run):
        served = load_scorer(run["export_path"], trust_torchscript=True)
        return score_queries(as_scorer(served), data.features, data.sizes)

    mean = (scores(runs["LambdaRank", 0]) + scores(runs["LambdaRank", 1])) / 2
    torch.testing.assert_close(scores(runs["LambdaRank ×2", "ensemble"]), mean, rtol=1e-5, atol=1e-6)
    assert runs["LambdaRank ×2", "ensemble"]["export_max_abs_diff"] <= 1e-4
    assert "LambdaRank ×2" in json.loads((out / "metrics.json").read_text())["summary"]


def test_compare_refuses_an_ensemble_of_one_seed(letor, tmp_path, capsys):
    with pytest.raises(ValueError, match="`ensemble` averages several seeds"):
        compare(data=str(letor), seeds=1, ensemble=True, out=str(tmp_path / "x"))
    assert main(["compare", "--data", str(letor), "--ensemble", "--out", str(tmp_path / "y")]) == 2
    assert "`ensemble` averages several seeds" in capsys.readouterr().err
