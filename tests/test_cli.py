"""The `rankkit` command: LightningCLI fit/test/predict for every model, export, compare, errors."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from rankkit.cli import EXPORT_SUFFIXES, main
from rankkit.compare import best_round, parse_folds
from rankkit.data import make_synthetic
from rankkit.export import load_scorer

CONFIGS = Path(__file__).resolve().parents[1] / "rankkit" / "configs"
MODELS = ("ranknet", "lambdarank", "lambdamart")


def write_letor(path: Path, seed: int) -> None:
    ds = make_synthetic(24, 12, 5, seed=seed)
    lines = []
    for q in range(ds.n_queries):
        for i in range(int(ds.offsets[q]), int(ds.offsets[q + 1])):
            feats = " ".join(f"{j + 1}:{float(v):.5g}" for j, v in enumerate(ds.features[i]))
            lines.append(f"{int(ds.labels[i])} qid:{q + 1} {feats}")
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def letor(tmp_path_factory) -> Path:
    """A tiny LETOR folder (train/vali/test, 24 queries x 12 documents x 5 features each)."""
    folder = tmp_path_factory.mktemp("letor")
    for seed, name in enumerate(("train.txt", "vali.txt", "test.txt")):
        write_letor(folder / name, seed)
    return folder


def quick(letor: Path, root: Path, epochs: int = 2) -> list[str]:
    return [f"--data.data={letor}", f"--trainer.max_epochs={epochs}", f"--trainer.default_root_dir={root}",
            "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
            "--model.init_args.min_data_in_leaf=5"]


# -- help and user mistakes -------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["fit", "test", "export", "compare", "info"])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    assert "--" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["fit", "validate", "test"])
def test_lightning_commands_say_what_they_do_and_what_ckpt_path_takes(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert ("--config NAME takes a config shipped with rankkit (compare, lambdamart, lambdamart_clicks, "
            "lambdarank") in out
    assert "--verbose (or RANKKIT_VERBOSE=1)" in out
    assert "A file path only: Lightning's 'best', 'last', 'hpc', 'registry' and URLs are not taken" in out
    assert "make sure you never run on your" not in out  # Lightning's sentence cut in half
    if command != "fit":
        assert "the data it was trained on" in out and "--verbose {true,false}" not in out


def test_info_has_a_description(capsys):
    with pytest.raises(SystemExit):
        main(["info", "--help"])
    assert "Summarise a dataset" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [
    ["fit"],
    ["fit", "--trainer.max_epochs=2"],
    ["fit", "--config", "no/such.yaml"],
    ["fit", "--config", str(CONFIGS / "ranknet.yaml"), "--trainer.max_epochz=3"],
    ["fit", "--config", str(CONFIGS / "ranknet.yaml"), "--data.fold=x"],
    ["export", "no/such.ckpt"],
    ["compare", "--folds", "0-9"],
    ["compare", "--models", "nosuchmodel"],
    ["compare", "--seeds", "0"],
    ["bogus"],
])
def test_user_mistakes_are_one_line_and_exit_2(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rankkit") and "error:" in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_a_quiet_fit_shows_its_progress_in_a_log_and_quiet_hides_it(letor, tmp_path, capsys):
    config = str(CONFIGS / "lambdamart.yaml")
    args = [*quick(letor, tmp_path, epochs=12)]
    assert main(["fit", "--config", config, *args]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("rankkit fit: ") and "/12 tree" in line]
    assert len(lines) == 2 and lines[0].startswith("rankkit fit: 1/12 trees, val/ndcg@10 ")  # the first at once
    assert lines[1].startswith("rankkit fit: 10/12 trees, val/ndcg@10 ")
    assert "best" in lines[1] and "at epoch=" in lines[1]
    assert "rankkit fit: 12 trees done, best val/ndcg@10" in err  # the end, when the last line was earlier
    assert main(["fit", "--quiet", "--config", config, *args]) == 0
    captured = capsys.readouterr()
    assert "trees, val/ndcg@10" not in captured.err and "rankkit fit: 12 trees; checkpoint" in captured.out


def test_the_help_says_how_to_see_a_configs_values_and_that_way_shows_them(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    assert "`--config NAME --print_config` prints every value" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit) as info:
        main(["fit", "--config", "lambdarank", "--print_config"])
    out = capsys.readouterr().out
    assert info.value.code == 0
    # the config's values (the classes' defaults are max_docs 4096 and k null), the model's arguments too
    assert "  max_docs: 512\n" in out and "    k: 10\n" in out and "class_path: rankkit.neural.LambdaRank" in out


def test_fit_without_a_config_names_the_flag(capsys):
    assert main(["fit"]) == 2
    err = capsys.readouterr().err
    assert ("needs a model and its data: --config NAME (shipped: compare, lambdamart, lambdamart_clicks, "
            "lambdarank") in err
    assert "fit.model" not in err


@pytest.mark.parametrize("fmt, name", [("export", "x.pt"), ("torchscript", "x.pt2"), ("onnx", "x.pt"),
                                       ("torchscript", "x.bin")])
def test_export_refuses_a_format_its_extension_disagrees_with_before_writing(tmp_path, fmt, name, capsys):
    from rankkit.cli import export_model

    model = tmp_path / "model.safetensors"
    from rankkit import LambdaMART

    LambdaMART(n_estimators=2, depth=2, min_data_in_leaf=5).fit(make_synthetic(10, 8, 5, seed=0)).save(model)
    out = tmp_path / name
    assert main(["export", str(model), "--format", fmt, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "`--output`" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
    # A failed check removes the artefact: make the reloaded scorer disagree with the eager model.
    import rankkit.export as export

    real = export.load_scorer
    try:
        export.load_scorer = lambda path, **kw: (lambda x: real(path, **kw)(x) + 1.0)
        with pytest.raises(ValueError, match="differs from the eager model"):
            export_model(str(model), str(tmp_path / "ok.pt"), "torchscript")
        # a reload that fails outright: one line from the command (round 4: a 17-line RuntimeError)
        export.load_scorer = lambda path, **kw: (_ for _ in ()).throw(RuntimeError("bad archive\nmore lines"))
        assert main(["export", str(model), "-o", str(tmp_path / "ok.pt")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.endswith("the exported scorer failed its reload check (RuntimeError: bad archive); "
                            f"{tmp_path / 'ok.pt'} removed") and len(err.splitlines()) == 1, err
    finally:
        export.load_scorer = real
    assert not (tmp_path / "ok.pt").exists()
    # an exported scorer given to export (round 4: a traceback)
    assert main(["export", str(tmp_path / "x.pt2"), "-o", str(tmp_path / "y.pt")]) == 2
    assert "is an exported scorer already" in capsys.readouterr().err
    assert export_model(str(model), str(tmp_path / "ok.pt"), "torchscript")["max_abs_diff"] < 1e-4


def test_a_failed_compare_leaves_no_empty_folders(tmp_path, capsys):
    letor = tmp_path / "letor"
    letor.mkdir()
    for seed, name in enumerate(("train.txt", "test.txt")):  # no vali file: compare refuses the fold
        write_letor(letor / name, seed)
    out = tmp_path / "out"
    assert main(["compare", "--data", str(letor), "--max_epochs", "1", "--out", str(out),
                 "--models", "lambdamart"]) == 2
    assert "--val_fraction 0.1 holds out" in capsys.readouterr().err
    assert not out.exists()


def test_export_rejects_a_file_that_is_not_a_checkpoint(tmp_path, capsys):
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"not a checkpoint")
    assert main(["export", str(bad)]) == 2
    assert "not a readable Lightning checkpoint" in capsys.readouterr().err


def test_configs_start_with_the_command_that_runs_them():
    for path in CONFIGS.glob("*.yaml"):  # a search space (NAME.space.yaml) starts with `rankkit tune --config NAME`
        first = path.read_text().splitlines()[0]
        name = path.stem.removesuffix(".space")
        assert first.startswith("# rankkit tune " if name != path.stem else "# rankkit ") \
            and f"--config {name} " in first, path


# -- fit -> test -> predict -> export, for each model ------------------------------------------------
def _test_ndcg(table: str) -> float:
    """test/ndcg@10 from Lightning's table of test metrics."""
    return float(re.search(r"test/ndcg@10\s*\S\s*([0-9.]+)", table).group(1))


@pytest.mark.parametrize("model", MODELS)
def test_fit_test_predict_export(model, letor, tmp_path, capsys):
    config = str(CONFIGS / f"{model}.yaml")
    args = quick(letor, tmp_path)[: None if model == "lambdamart" else -1]
    assert main(["fit", "--config", config, *args]) == 0
    ckpt = next(tmp_path.rglob("*.ckpt"))
    assert main(["test", "--config", config, *args, f"--ckpt_path={ckpt}", "--trainer.logger=false"]) == 0
    with_config = _test_ndcg(capsys.readouterr().out)
    # Without --config the checkpoint gives the model and its data, and scoring leaves no logger folder.
    scoring = tmp_path / "scoring"
    assert main(["test", f"--ckpt_path={ckpt}", f"--trainer.default_root_dir={scoring}"]) == 0
    captured = capsys.readouterr()
    assert _test_ndcg(captured.out) == with_config
    assert f"scored the test set of {letor} fold 1, the data the checkpoint was trained on" in captured.err
    assert not (scoring / "lightning_logs").exists()
    predictions = tmp_path / "predictions.tsv"
    assert main(["predict", str(ckpt), "--input", str(letor / "test.txt"), "-o", str(predictions)]) == 0
    rows = [line.split("\t") for line in predictions.read_text().splitlines()]
    assert len(rows) == 24 * 12 and all(len(r) == 3 for r in rows)
    out = tmp_path / "scorer.pt"
    assert main(["export", str(ckpt), "-o", str(out)]) == 0
    scorer = load_scorer(out, trust_torchscript=True)
    assert scorer(torch.rand(7, 5)).shape == (7,)
    # The predictions join back to a file-order run of the exported scorer. predict streams the
    # file in blocks, so a float32 matmul may round its last bit differently from one batch.
    from rankkit.data.svmlight import read_svmlight

    x = read_svmlight(letor / "test.txt").features
    with torch.no_grad():
        torch.testing.assert_close(torch.tensor([float(r[2]) for r in rows], dtype=torch.float32), scorer(x),
                                   rtol=1e-6, atol=1e-6)
    assert [int(r[1]) for r in rows[:12]] == list(range(12)) and rows[12][:2] == ["2", "0"]


def test_test_and_validate_score_the_data_the_checkpoint_was_trained_on(tmp_path, capsys):
    """The README's sequence, fit on fold 2 then test with the config (fold: 1): fold 2's test set
    is scored, not fold 1's (whose test set is fold 2's vali set)."""
    from rankkit.infra.checkpoint import load_checkpoint
    from rankkit.data.svmlight import read_svmlight
    from rankkit.metrics import ndcg

    root = tmp_path / "letor"
    for fold in (1, 2):
        (root / f"Fold{fold}").mkdir(parents=True)
        for i, name in enumerate(("train.txt", "vali.txt", "test.txt")):
            write_letor(root / f"Fold{fold}" / name, 10 * fold + i)
    config = str(CONFIGS / "lambdamart.yaml")
    args = [f"--data.data={root}", "--trainer.max_epochs=3", f"--trainer.default_root_dir={tmp_path / 'run'}",
            "--model.init_args.min_data_in_leaf=5"]
    assert main(["fit", "--config", config, *args, "--data.fold=2"]) == 0
    ckpt = next((tmp_path / "run").rglob("*.ckpt"))
    capsys.readouterr()

    def expected(fold: int) -> float:
        model = load_checkpoint(ckpt)
        batch = read_svmlight(root / f"Fold{fold}" / "test.txt").padded()
        with torch.no_grad():
            return float(ndcg(model(batch.features), batch.labels, mask=batch.mask, k=10, empty=1.0).mean())

    def tested(*extra: str) -> tuple[float, str]:
        assert main(["test", "--config", config, *args, f"--ckpt_path={ckpt}", "--trainer.logger=false",
                     *extra]) == 0
        out, err = capsys.readouterr()
        value = next(float(line.split()[-1]) for line in out.splitlines() if "test/ndcg@10" in line)
        return value, err

    value, err = tested()
    assert "fold 2, the data the checkpoint was trained on" in err and "fold=2 (config: 1)" in err
    assert abs(value - expected(2)) < 1e-6 and abs(expected(2) - expected(1)) > 1e-3
    value, err = tested("--data.fold=1")  # an explicit flag wins, and says so
    assert "as given: --data.fold=1 (trained with 2)" in err and abs(value - expected(1)) < 1e-6
    assert main(["validate", "--config", config, *args, f"--ckpt_path={ckpt}", "--trainer.logger=false"]) == 0
    assert "validation set of" in capsys.readouterr().err


# -- compare ------------------------------------------------------------------------------------------
def test_parse_folds_and_best_round():
    assert parse_folds("1-5") == [1, 2, 3, 4, 5]
    assert best_round([0.1, 0.2, 0.2, 0.15, 0.3], patience=2) == (1, 4)


@pytest.mark.slow
def test_compare_writes_table_plots_and_verified_exports(letor, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["compare", "--data", str(letor), "--max_epochs", "2", "--out", str(out),
                 "--baselines"]) == 0
    printed = capsys.readouterr().out
    for name in ("RankNet", "LambdaRank", "LambdaMART", "| NDCG@1 |"):
        assert name in printed
    result = json.loads((out / "metrics.json").read_text())
    rankkit_runs = [r for r in result["runs"] if r["export_path"]]
    assert {r["model"] for r in rankkit_runs} == {"RankNet", "LambdaRank", "LambdaMART"}
    for r in result["runs"]:
        assert 0 <= r["ndcg@10"] <= 1 and 1 <= len(r["val_curve"]) <= 2
        # One counting convention (README, Conventions): the 0-based index of the first best
        # epoch or tree, for rankkit's models and the baselines alike.
        curve = r["val_curve"]
        assert r["best_epoch"] == curve.index(max(curve)), r
    for r in rankkit_runs:
        assert r["export_max_abs_diff"] <= 1e-4 and Path(r["export_path"]).stat().st_size == r["export_bytes"]
    assert (out / "table.md").read_text().count("\n| ") >= 3
    assert (out / "val_ndcg10.png").stat().st_size > 0 and (out / "test_ndcg.png").stat().st_size > 0


def test_the_baselines_protocol_does_not_depend_on_the_neural_models_beside_them():
    from rankkit.compare.protocol import baseline_protocol

    def config(name):
        import yaml

        return yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())

    shipped = baseline_protocol([config("lambdamart")])
    assert shipped == (2000, 50)
    assert baseline_protocol([config("lambdarank")]) == baseline_protocol([config("transformer")]) == shipped
    mine = config("lambdamart")
    mine["trainer"]["max_epochs"] = 300
    assert baseline_protocol([config("ranknet"), mine]) == (300, 50)  # a LambdaMART config compared sets it


@pytest.mark.parametrize("fmt", ["torchscript", "export", "onnx"])
def test_export_of_several_models_is_one_scorer_of_their_mean(tmp_path, fmt, capsys):
    from rankkit import LambdaMART

    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
    data = make_synthetic(12, 8, 5, seed=0)
    paths, models = [], []
    for seed in range(3):
        model = LambdaMART(n_estimators=4, depth=2, min_data_in_leaf=5, subsample=0.7, seed=seed).fit(data)
        models.append(model)
        paths.append(str(tmp_path / f"m{seed}.safetensors"))
        model.save(paths[-1])
    out = tmp_path / f"mean{EXPORT_SUFFIXES[fmt]}"
    assert main(["export", *paths, "--format", fmt, "-o", str(out)]) == 0
    assert "the mean of 3 models" in capsys.readouterr().out
    x = data.features[:50]
    mean = sum(torch.as_tensor(m.predict(x), dtype=torch.float32) for m in models) / 3
    served = load_scorer(str(out), trust_torchscript=True)(x)
    torch.testing.assert_close(torch.as_tensor(served, dtype=torch.float32), mean, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(mean, torch.as_tensor(models[0].predict(x), dtype=torch.float32))  # seeds differ


def test_export_of_several_models_refuses_what_it_cannot_average_in_one_line(tmp_path, capsys):
    from rankkit import LambdaMART

    paths = []
    for n_features in (5, 5, 6):
        path = str(tmp_path / f"m{len(paths)}.safetensors")
        data = make_synthetic(10, 8, n_features, seed=0)
        LambdaMART(n_estimators=2, depth=2, min_data_in_leaf=5).fit(data).save(path)
        paths.append(path)
    assert main(["export", paths[0], paths[1]]) == 2  # no -o: which file would it be?
    err = capsys.readouterr().err.strip()
    assert "several models export one averaged scorer: name it with -o/--output" in err and len(err.splitlines()) == 1
    assert main(["export", *paths, "-o", str(tmp_path / "mean.pt")]) == 2
    err = capsys.readouterr().err.strip()
    assert f"`model`: {paths[2]} takes 6 features and {paths[0]} 5" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "mean.pt").exists()
    assert main(["export", paths[0], paths[1], paths[0], "-o", str(tmp_path / "mean.pt")]) == 2
    err = capsys.readouterr().err.strip()
    assert f"`model` names {paths[0]} twice" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("fmt", ["torchscript", "export", "onnx"])
def test_a_list_aware_model_alone_or_beside_trees_exports_in_every_format(tmp_path, fmt):
    # Round 6: the reload check fed flat [64, F] features, which a list-aware torch.export program
    # refuses, so `rankkit export --format export` of the transformer failed its own check.
    import pytorch_lightning as pl

    from rankkit import LambdaMART
    from rankkit.cli import export_model
    from rankkit.export import serving_module
    from rankkit.neural import LambdaRank
    from rankkit.serving import load_model

    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
    trainer = pl.Trainer(max_epochs=0, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.strategy.connect(LambdaRank(5, architecture="transformer", hidden=[16], heads=2, layers=1))
    trainer.save_checkpoint(tmp_path / "t.ckpt")
    LambdaMART(n_estimators=3, depth=2, min_data_in_leaf=2).fit(make_synthetic(12, 6, 5, seed=1)).save(
        tmp_path / "m.safetensors")
    x = torch.rand(3, 7, 5) * 3
    mask = torch.arange(7) < torch.tensor([7, 4, 1])[:, None]
    for models, name in (([tmp_path / "t.ckpt"], "one"), ([tmp_path / "t.ckpt", tmp_path / "m.safetensors"], "two")):
        out = tmp_path / f"{name}{EXPORT_SUFFIXES[fmt]}"
        r = export_model([str(m) for m in models] if len(models) > 1 else str(models[0]), str(out), fmt)
        assert r["max_abs_diff"] <= 1e-4
        eagers = [serving_module(load_model(str(m))) for m in models]
        with torch.no_grad():
            scores = [eagers[0](x, mask)] + [e(x.reshape(-1, 5)).reshape(3, 7) for e in eagers[1:]]  # trees: rows
            want = sum(scores) / len(models)
            got = torch.as_tensor(load_scorer(str(out), trust_torchscript=True)(x, mask))
        torch.testing.assert_close(got[mask], want[mask], rtol=1e-5, atol=1e-5)
