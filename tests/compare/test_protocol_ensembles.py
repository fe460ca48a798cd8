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


def _member(folder: Path, name: str, depth: int) -> Path:
    """The packaged LambdaMART config with another depth and small leaves, as ``folder/name``."""
    text = (CONFIGS / "lambdamart.yaml").read_text()
    text = text.replace("depth: 6 ", f"depth: {depth} ").replace("min_data_in_leaf: 20", "min_data_in_leaf: 5")
    (folder / name).write_text(text)
    return folder / name


def test_an_ensemble_of_configs_is_one_row_scoring_the_mean_of_its_members(letor, tmp_path):
    folder = tmp_path / "study"
    (folder / "top").mkdir(parents=True)
    a, b = _member(folder / "top", "1.yaml", 2), _member(folder / "top", "2.yaml", 3)
    (folder / "ensemble.yaml").write_text("ensemble: [top/1.yaml, top/2.yaml]\n")
    result = compare(data=str(letor), models=[str(folder / "ensemble.yaml"), str(a), str(b)], out=str(tmp_path / "r"),
                     max_epochs=3, log=lambda _: None)
    runs = {r["model"]: r for r in result["runs"]}
    assert set(runs) == {"LambdaMART-top2", "LambdaMART", "LambdaMART-2"}
    assert runs["LambdaMART-top2"]["kind"] == "trees" and runs["LambdaMART-top2"]["export_max_abs_diff"] <= 1e-4
    from rankkit.data.svmlight import read_svmlight

    data = read_svmlight(letor / "test.txt")

    def scores(run):
        return score_queries(as_scorer(load_scorer(run["export_path"], trust_torchscript=True)), data.features,
                             data.sizes)

    # the members trained alone, with the same seed, are the ensemble's members: it scores their mean
    mean = (scores(runs["LambdaMART"]) + scores(runs["LambdaMART-2"])) / 2
    torch.testing.assert_close(scores(runs["LambdaMART-top2"]), mean, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("text, match", [
    ("ensemble: []\n", r"`ensemble` has to be a non-empty list of model config paths"),
    ("ensemble: top/1.yaml\n", r"`ensemble` has to be a non-empty list"),
    ("ensemble: [top/9.yaml]\n", r"`ensemble`\[0\] 'top/9.yaml' is not a YAML file beside it"),
    ("ensemble: [top/1.yaml, ./top/1.yaml]\n", r"`ensemble`\[1\] './top/1.yaml' is named twice"),
    ("ensemble: [ensemble.yaml]\n", r"ensemble.yaml: not a model config"),  # no nesting
])
def test_a_bad_ensemble_file_is_one_line_before_anything_trains(letor, tmp_path, text, match):
    (tmp_path / "top").mkdir()
    _member(tmp_path / "top", "1.yaml", 2)
    (tmp_path / "ensemble.yaml").write_text(text)
    with pytest.raises(ValueError, match=match):
        compare(data=str(letor), models=[str(tmp_path / "ensemble.yaml")], out=str(tmp_path / "r"))
    assert not (tmp_path / "r").exists()


def test_nested_tuning_refuses_an_ensemble_of_configs(letor, tmp_path, capsys):
    (tmp_path / "top").mkdir()
    _member(tmp_path / "top", "1.yaml", 2)
    (tmp_path / "ensemble.yaml").write_text("ensemble: [top/1.yaml]\n")
    assert main(["compare", "--data", str(letor), "--models", str(tmp_path / "ensemble.yaml"), "--tune", "2",
                 "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert "is an ensemble of configs; nested tuning tunes one model config" in err and len(err.splitlines()) == 1


def test_a_row_name_taken_by_an_ensemble_is_refused_not_replaced(letor, tmp_path):
    (tmp_path / "ens" / "top").mkdir(parents=True)
    _member(tmp_path / "ens" / "top", "1.yaml", 2)
    _member(tmp_path / "ens" / "top", "2.yaml", 3)
    (tmp_path / "ens" / "ensemble.yaml").write_text("ensemble: [top/1.yaml, top/2.yaml]\n")
    (tmp_path / "x").mkdir()
    clash = _member(tmp_path / "x", "top2.yaml", 4)  # a second LambdaMART config, named by its file: LambdaMART-top2
    with pytest.raises(ValueError, match=r"would be the row 'LambdaMART-top2', which .*ensemble\.yaml already is"):
        compare(data=str(letor), models=["lambdamart", str(tmp_path / "ens" / "ensemble.yaml"), str(clash)],
                out=str(tmp_path / "r"))
