"""Every `rankkit` command path from a temporary directory, and the errors that used
to end in a traceback: one line on stderr and exit status 2.

Subcommands exercised here or in tests/test_cli.py: fit, validate, test, predict, export
(torchscript, export, onnx), compare (a folder, a LETOR root's folds), info.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rankkit.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_cli import write_letor  # noqa: E402
from test_cli_guard import assert_one_line, run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIRS = (ROOT / "configs", ROOT / "rankkit" / "configs")
MODELS = ("ranknet", "lambdarank", "lambdamart")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """letor/{train,vali,test}.txt, novali/{train,test}.txt, root/Fold{1,2}/{train,vali,test}.txt."""
    d = tmp_path_factory.mktemp("paths")
    for folder, names in (("letor", ("train.txt", "vali.txt", "test.txt")), ("novali", ("train.txt", "test.txt"))):
        (d / folder).mkdir()
        for seed, name in enumerate(names):
            write_letor(d / folder / name, seed)
    for fold in (1, 2):
        (d / "root" / f"Fold{fold}").mkdir(parents=True)
        for seed, name in enumerate(("train.txt", "vali.txt", "test.txt")):
            write_letor(d / "root" / f"Fold{fold}" / name, 10 * fold + seed)
    return d


def quick(data: Path, root: Path, model: str, epochs: int = 2) -> list[str]:
    args = [f"--data.data={data}", f"--trainer.max_epochs={epochs}", f"--trainer.default_root_dir={root}"]
    return args + (["--model.init_args.min_data_in_leaf=5"] if model == "lambdamart" else [])


# -- a folder without vali trains with every config -------------------------------------------
@pytest.mark.parametrize("config_dir", CONFIG_DIRS, ids=["configs", "rankkit-configs"])
@pytest.mark.parametrize("model", MODELS)
def test_a_folder_without_vali_trains_with_every_config(model, config_dir, data, tmp_path, capsys):
    config = config_dir / f"{model}.yaml"
    code = main(["fit", "--config", str(config), *quick(data / "novali", tmp_path, model)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "has no validation file" in captured.err and "val_fraction" in captured.err
    ckpt = next(tmp_path.rglob("*.ckpt"))  # the last epoch, kept without model selection
    assert "epoch=1" in ckpt.name
    assert main(["test", "--config", str(config), *quick(data / "novali", tmp_path, model),
                 f"--ckpt_path={ckpt}"]) == 0
    assert "test/ndcg@10" in capsys.readouterr().out


def test_val_fraction_without_vali_keeps_early_stopping(data, tmp_path, capsys):
    assert main(["fit", "--config", "lambdamart", *quick(data / "novali", tmp_path, "lambdamart"),
                 "--data.val_fraction=0.25"]) == 0
    captured = capsys.readouterr()
    assert "no validation file" not in captured.err and "val/ndcg@10" in captured.out


def test_validate_without_a_validation_file_is_one_line(data, tmp_path, capsys):
    assert main(["fit", "--config", "lambdamart", *quick(data / "novali", tmp_path, "lambdamart", 1)]) == 0
    ckpt = next(tmp_path.rglob("*.ckpt"))
    capsys.readouterr()
    code, err = run(["validate", "--config", "lambdamart", *quick(data / "novali", tmp_path, "lambdamart"),
                     f"--ckpt_path={ckpt}"], capsys)
    assert_one_line(code, err, "no validation file", "val_fraction")


def test_validate_and_info(data, tmp_path, capsys):
    assert main(["fit", "--config", "lambdamart", *quick(data / "letor", tmp_path, "lambdamart")]) == 0
    ckpt = next(tmp_path.rglob("*.ckpt"))
    capsys.readouterr()
    assert main(["validate", "--config", "lambdamart", *quick(data / "letor", tmp_path, "lambdamart"),
                 f"--ckpt_path={ckpt}"]) == 0
    assert "val/ndcg@10" in capsys.readouterr().out
    assert main(["info", str(data / "letor" / "test.txt"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary[str(data / "letor" / "test.txt")]["queries"] == 24


# -- compare on a LETOR root's folds ----------------------------------------------------------
def test_compare_runs_a_letor_root_s_folds(data, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["compare", "--data", str(data / "root"), "--folds", "1,2", "--models", "lambdamart",
                 "--max_epochs", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "± " in printed and "| model | fold 1 | fold 2 | all |" in printed  # per fold, mean ± std
    result = json.loads((out / "metrics.json").read_text())
    assert result["folds"] == [1, 2] and [r["fold"] for r in result["runs"]] == [1, 2]
    assert result["summary"]["LambdaMART"]["ndcg@10"]["n"] == 2
    assert "| model | fold 1 | fold 2 | all |" in (out / "table.md").read_text()
    # Each fold trained on its own files: different data, different scores.
    assert result["runs"][0]["ndcg@10"] != result["runs"][1]["ndcg@10"]
    assert sorted(p.name for p in (out / "scorers").iterdir()) == ["lambdamart-fold1-seed0.pt",
                                                                    "lambdamart-fold2-seed0.pt"]


@pytest.mark.parametrize("argv, needle", [
    (["--folds", "1-3"], "has to name folds in [1, 2]"),
    (["--folds", "1,1"], "names a fold twice"),
])
def test_compare_folds_of_a_root_are_checked(data, argv, needle, capsys):
    code, err = run(["compare", "--data", data / "root", "--models", "lambdamart", *argv], capsys)
    assert_one_line(code, err, needle)


def test_compare_folds_of_a_plain_folder(data, capsys):
    code, err = run(["compare", "--data", data / "letor", "--folds", "2", "--models", "lambdamart"], capsys)
    assert_one_line(code, err, "has to name folds in [1]")


def test_compare_same_model_twice(data, tmp_path, capsys):
    code, err = run(["compare", "--data", data / "letor", "--models", "lambdamart,lambdamart"], capsys)
    assert_one_line(code, err, "names the config", "twice")
    mine = tmp_path / "lambdamart.yaml"
    mine.write_text((ROOT / "rankkit" / "configs" / "lambdamart.yaml").read_text())
    code, err = run(["compare", "--data", data / "letor", "--models", f"lambdamart,{mine}"], capsys)
    assert_one_line(code, err, "both train LambdaMART", "rename one")
    # A second LambdaMART config under another name is its own row, not dropped.
    other = tmp_path / "deep.yaml"
    other.write_text(mine.read_text().replace("depth: 6", "depth: 2"))
    out = tmp_path / "out"
    assert main(["compare", "--data", str(data / "letor"), "--models", f"lambdamart,{other}",
                 "--max_epochs", "1", "--out", str(out)]) == 0
    result = json.loads((out / "metrics.json").read_text())
    assert [r["model"] for r in result["runs"]] == ["LambdaMART", "LambdaMART-deep"]


# -- errors that were tracebacks --------------------------------------------------------------
@pytest.mark.parametrize("option, needle", [
    ("--trainer.max_epochs=-5", "`max_epochs` must be a non-negative integer"),
    ("--trainer.devices=meta", "`devices`"),
    ("--trainer.accelerator=meta", "accelerator"),
    pytest.param("--trainer.accelerator=gpu", "gpu", marks=pytest.mark.skipif(
        torch.cuda.is_available(), reason="this machine has a GPU")),
])
def test_bad_trainer_options_are_one_line(option, needle, data, tmp_path, capsys):
    code, err = run(["fit", "--config", "ranknet", *quick(data / "letor", tmp_path, "ranknet"), option], capsys)
    assert_one_line(code, err, needle)


def test_an_onnx_scorer_given_a_file_of_another_width(data, tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    assert main(["fit", "--config", "lambdamart", *quick(data / "letor", tmp_path, "lambdamart", 1)]) == 0
    ckpt = next(tmp_path.rglob("*.ckpt"))
    onnx = tmp_path / "m.onnx"
    assert main(["export", str(ckpt), "--format", "onnx", "-o", str(onnx)]) == 0
    narrow = tmp_path / "narrow.txt"
    narrow.write_text("".join(" ".join(w for w in line.split() if not w.startswith("5:")) + "\n"
                              for line in (data / "letor" / "test.txt").read_text().splitlines()))
    capsys.readouterr()
    # Narrower: zero-padded to the graph's width, as every other format (it was refused).
    code = main(["predict", str(onnx), "--input", str(narrow), "-o", str(tmp_path / "narrow.tsv")])
    assert code == 0, capsys.readouterr().err
    wide = tmp_path / "wide.txt"
    wide.write_text("".join(line + " 9:1.0\n" for line in (data / "letor" / "test.txt").read_text().splitlines()))
    capsys.readouterr()
    code, err = run(["predict", onnx, "--input", wide], capsys)
    assert code == 2 and len(err.splitlines()) == 1 and "9" in err, err


def test_an_output_folder_under_a_file_in_fit(data, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, err = run(["fit", "--config", "lambdamart", *quick(data / "letor", blocker / "runs", "lambdamart", 1)],
                    capsys)
    assert_one_line(code, err, str(blocker))
    assert blocker.read_text() == "x"


# -- quiet by default -------------------------------------------------------------------------
NOISE = ("Tip", "litlogger", "LeafSpec", "logging interval", "GPU available", "Total params", "Epoch 0",
         "Seed set", "Warning")


def _fits(data: Path, runs: dict[str, tuple[str, ...]]) -> dict[str, subprocess.CompletedProcess]:
    """``rankkit fit --config lambdamart`` once per entry (folder: extra arguments), the
    processes side by side (each spends most of its time importing)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("PYTHONWARNINGS", None)
    procs = {root: subprocess.Popen([sys.executable, "-m", "rankkit.cli", "fit", "--config", "lambdamart",
                                     *quick(data / "letor", Path(root), "lambdamart"), *extra],
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for root, extra in runs.items()}
    done = {}
    for root, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        done[root] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return done


@pytest.mark.slow
def test_fit_is_quiet_unless_verbose(data, tmp_path):
    runs = _fits(data, {str(tmp_path / "q"): ("--quiet",), str(tmp_path / "d"): (),
                        str(tmp_path / "v"): ("--verbose",)})
    quiet, default, loud = runs.values()
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    text = quiet.stdout + quiet.stderr
    assert not [n for n in NOISE if n in text], text
    assert text.strip().splitlines() == [next(line for line in text.splitlines() if line.startswith("rankkit fit:"))]
    assert "checkpoint" in text and "val/ndcg@10" in text
    text = default.stdout + default.stderr  # rankkit's own progress lines, nothing of Lightning's
    assert default.returncode == 0 and not [n for n in NOISE if n in text], text
    assert all(line.startswith("rankkit fit:") for line in text.strip().splitlines()), text
    assert loud.returncode == 0, loud.stderr[-2000:]
    text = loud.stdout + loud.stderr
    assert "Epoch 0" in text and "LeafSpec" in text and "logging interval" in text


def test_compare_tables_each_fold(data, tmp_path, capsys):
    from rankkit.compare.protocol import fold_table

    runs = [{"model": "A", "fold": f, "seed": s, "ndcg@10": 0.1 * f + 0.01 * s} for f in (1, 2) for s in (0, 1)]
    lines = fold_table(runs).splitlines()
    assert lines[2] == "| model | fold 1 | fold 2 | all |"
    assert lines[4] == "| A | 0.1050 ± 0.0071 | 0.2050 ± 0.0071 | 0.1550 ± 0.0580 |"


def test_compare_twice_into_an_output_folder_inside_the_data_folder(data, tmp_path, capsys):
    folder = tmp_path / "letor"
    folder.mkdir()
    for p in (data / "letor").iterdir():
        (folder / p.name).write_bytes(p.read_bytes())
    for _ in range(2):  # the second run overwrites the first run's outputs, never the data
        assert main(["compare", "--data", str(folder), "--models", "lambdamart", "--max_epochs", "1",
                     "--out", str(folder / "cmp")]) == 0, capsys.readouterr().err


def test_info_on_a_folder_and_a_letor_root(data, capsys):
    assert main(["info", str(data / "root"), "--fold", "2", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert list(summary) == ["train", "vali", "test"] and summary["train"]["features"] == 5
    assert main(["info", str(data / "novali")]) == 0
    assert capsys.readouterr().out.count("queries,") == 2  # train and test
    code, err = run(["info", data / "root", "--fold", "3"], capsys)
    assert_one_line(code, err, "`fold` has to be one of [1, 2]")


@pytest.mark.slow
def test_a_closed_pipe_ends_quietly(data, tmp_path):
    # `rankkit predict ... | head`: the reader goes away; no traceback, no error line.
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    assert main(["fit", "--config", "lambdamart", *quick(data / "letor", tmp_path, "lambdamart", 1)]) == 0
    ckpt = next(tmp_path.rglob("*.ckpt"))
    p = subprocess.Popen([sys.executable, "-m", "rankkit.cli", "predict", str(ckpt), "--input",
                          str(data / "letor" / "test.txt")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    p.stdout.close()  # before the command has written anything
    err = p.stderr.read().decode()
    assert p.wait(120) == 141 and err == ""


def test_compare_on_a_folder_without_vali(data, tmp_path, capsys):
    code, err = run(["compare", "--data", data / "novali", "--models", "lambdamart", "--out", tmp_path / "x"], capsys)
    assert_one_line(code, err, "validation file", "val_fraction")
    out = tmp_path / "out"
    assert main(["compare", "--data", str(data / "novali"), "--models", "ranknet,lambdamart", "--seeds", "2",
                 "--val_fraction", "0.25", "--max_epochs", "2", "--out", str(out)]) == 0, capsys.readouterr().err
    result = json.loads((out / "metrics.json").read_text())
    assert len(result["runs"]) == 4 and all(len(r["val_curve"]) == 2 for r in result["runs"])


def test_val_seed_fixes_the_held_out_queries(data):
    from rankkit.training.datamodule import RankingDataModule

    def held(**kw):
        dm = RankingDataModule(data=str(data / "novali"), val_fraction=0.25, **kw)
        dm.setup()
        return sorted(dm.val_set.qids.tolist())

    assert held(seed=0) != held(seed=1)  # the split follows `seed` ...
    assert held(seed=0, val_seed=0) == held(seed=1, val_seed=0)  # ... unless val_seed fixes it
