"""rankkit.tune and `rankkit tune`: Optuna studies over a config, on vali only."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")

from rankkit import tune as tuning  # noqa: E402
from rankkit.training.run_config import config_names  # noqa: E402
from rankkit.cli import main  # noqa: E402
from tests.test_cli import write_letor  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[1] / "rankkit" / "configs"
#: the study of one fit a trial, no refits (the defaults score every fold, 2 seeds, and confirm)
QUICK = dict(folds=None, trial_seeds=1, confirm=0, margin=0.0)
QUICK_FLAGS = ["--folds", "none", "--trial_seeds", "1", "--confirm", "0", "--margin", "0"]


def quick_study(*args, **kw):
    """:func:`rankkit.tune.tune` with :data:`QUICK` unless ``kw`` says otherwise."""
    return tuning.tune(*args, **{**QUICK, **kw})


@pytest.fixture
def data(tmp_path) -> Path:
    """train and vali files, and a test file that fails if anything reads it."""
    folder = tmp_path / "letor"
    folder.mkdir()
    write_letor(folder / "train.txt", 0)
    write_letor(folder / "vali.txt", 1)
    (folder / "test.txt").write_text("this is not a LETOR line: a study must never read the test split\n")
    return folder


#: the trainer's checkpoint of the best val/ndcg@10, as every packaged config keeps one
CHECKPOINT = """  callbacks:
    - class_path: pytorch_lightning.callbacks.ModelCheckpoint
      init_args: {monitor: val/ndcg@10, mode: max, filename: "best-{epoch}"}
"""
SMALL_NEURAL = """
seed_everything: 0
model:
  class_path: rankkit.neural.LambdaRank
  init_args: {hidden: [8], dropout: 0.1, lr: 0.01, weighting: ndcg, k: 10, reduction: sum}
data: {data: DATA, max_docs: 64}
trainer:
  max_epochs: 4
  log_every_n_steps: 1
""" + CHECKPOINT
SMALL_SPACE = """
model.init_args.lr: {float: [0.001, 0.05], log: true}
model.init_args.hidden: {choices: [[8], [16, 8]]}
model.init_args.dropout: {float: [0.0, 0.3]}
"""


@pytest.fixture
def config(tmp_path, data) -> Path:
    path = tmp_path / "small.yaml"
    path.write_text(SMALL_NEURAL.replace("DATA", str(data)))
    (tmp_path / "small.space.yaml").write_text(SMALL_SPACE)
    return path


def test_every_packaged_config_ships_a_space_holding_its_own_values():
    names = config_names()
    assert "lambdarank.space" not in names and "compare" in names
    for name in (n for n in names if n != "compare"):
        config = tuning._yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
        space = tuning.load_space(tuning.space_path(CONFIGS / f"{name}.yaml"))
        assert len(space) >= 4, name
        values = tuning.untuned_values(config, space, name)  # raises when one lies outside
        assert set(values) == set(space)


@pytest.mark.parametrize("text, match", [
    ("[1, 2]", "a mapping of config keys"),
    ("model.init_args.lr: 0.1", "give {float"),
    ("model.init_args.lr: {float: [0.1]}", r"takes \[low, high\]"),
    ("model.init_args.lr: {float: [0.1, 0.01]}", "low < high"),
    ("model.init_args.lr: {float: [0, 0.1], log: true}", "low > 0 with log"),
    ("model.init_args.lr: {float: [0.1, .nan]}", "finite number"),
    ("model.init_args.lr: {float: [0.1, 1], int: [1, 2]}", "exactly one of"),
    ("model.init_args.depth: {int: [1.5, 4]}", "whole numbers"),
    ("model.init_args.hidden: {choices: []}", "non-empty list"),
    ("model.init_args.lr: {float: [0.1, 1], step: -1}", "step has to be positive"),
    ("'model init': {float: [0.1, 1]}", "dotted config path"),
])
def test_a_bad_space_names_its_key(tmp_path, text, match):
    path = tmp_path / "bad.space.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        tuning.load_space(path)


def test_the_untuned_config_must_lie_in_the_space():
    space = {"model.init_args.lr": tuning.Param("model.init_args.lr", "float", 0.01, 0.1)}
    config = {"model": {"class_path": "rankkit.neural.LambdaRank", "init_args": {"lr": 0.001}}}
    with pytest.raises(ValueError, match=r"lr = 0.001 lies outside the search space \(float \[0.01, 0.1\]\)"):
        tuning.untuned_values(config, space, "c.yaml")
    # a key the config leaves out takes the model's default (LambdaRank's dropout 0.1)
    drop = {"model.init_args.dropout": tuning.Param("model.init_args.dropout", "float", 0.0, 0.5)}
    assert tuning.untuned_values(config, drop, "c.yaml") == {"model.init_args.dropout": 0.1}
    with pytest.raises(ValueError, match="not in the config nor a parameter"):
        tuning.untuned_values(config, {"model.init_args.nope": drop["model.init_args.dropout"]}, "c.yaml")


def test_overrides_parse_as_fit_takes_them():
    assert tuning.parse_overrides(["--data.fold=2", "--trainer.max_epochs", "5", "--model.init_args.hidden=[8, 4]"]) \
        == {"data.fold": 2, "trainer.max_epochs": 5, "model.init_args.hidden": [8, 4]}
    with pytest.raises(ValueError, match="position 1"):
        tuning.parse_overrides(["--data.fold=2", "fold"])
    assert tuning.apply_values({"a": {"b": 1}}, {"a.b": 2, "a.c.d": 3}) == {"a": {"b": 2, "c": {"d": 3}}}


@pytest.mark.slow
def test_a_tiny_study_end_to_end_resumes_and_its_config_refits(tmp_path, config, data, capsys):
    out = tmp_path / "study"
    result = quick_study(config, n_trials=2, out=out, seed=0)
    trials = json.loads((out / "trials.json").read_text())
    assert [t["state"] for t in trials] == ["complete", "complete"]
    untuned = trials[0]
    assert untuned["untuned"] and untuned["params"] == {"model.init_args.lr": 0.01, "model.init_args.hidden": [8],
                                                        "model.init_args.dropout": 0.1}
    assert result.best_value == max(t["value"] for t in trials) >= untuned["value"]
    for name in ("best.yaml", "trials.md", "history.png", "study.db"):
        assert (out / name).stat().st_size > 0, name
    assert "| 0 (untuned) | complete |" in (out / "trials.md").read_text()
    # the written config refits to the best trial's vali value (same seed, same data, CPU)
    capsys.readouterr()
    assert main(["fit", "--config", str(result.best_config), f"--trainer.default_root_dir={tmp_path / 'refit'}",
                 "--quiet"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert float(re.search(r"val/ndcg@10 ([0-9.]+)", line).group(1)) == pytest.approx(result.best_value, abs=5e-5)
    # the same command again resumes the study: one more trial to reach 3, the first two kept
    again = quick_study(config, n_trials=3, out=out, seed=0)
    rows = json.loads((out / "trials.json").read_text())
    assert len(rows) == 3 and rows[:2] == trials and again.best_value >= result.best_value
    # the test split was never read: reading it fails
    ckpt = next((tmp_path / "refit").rglob("best-*.ckpt"))
    assert main(["test", "--config", str(result.best_config), f"--ckpt_path={ckpt}",
                 f"--trainer.default_root_dir={tmp_path / 't'}"]) == 2
    assert "test.txt" in capsys.readouterr().err


class PruneAfterFirstEpoch(optuna.pruners.BasePruner):
    """Prunes every trial but the first at its second epoch."""

    def prune(self, study, trial) -> bool:
        return trial.number > 0 and trial.last_step is not None and trial.last_step >= 1


@pytest.mark.slow
def test_pruning_stops_a_trial_on_its_vali_curve(tmp_path, config):
    out = tmp_path / "study"
    quick_study(config, n_trials=3, out=out, pruner=PruneAfterFirstEpoch())
    rows = json.loads((out / "trials.json").read_text())
    assert [r["state"] for r in rows] == ["complete", "pruned", "pruned"]
    assert rows[0]["epochs"] == 4 and all(r["epochs"] == 2 for r in rows[1:])  # stopped, not run out


@pytest.mark.slow
def test_lambdamart_tunes_through_the_same_command(tmp_path, data, capsys):
    out = tmp_path / "trees"
    argv = ["tune", "--config", "lambdamart", "--n_trials", "2", "--out", str(out), f"--data.data={data}",
            "--trainer.max_epochs=3", "--model.init_args.min_data_in_leaf=5", "--quiet"]
    assert main(argv) == 0
    assert "best val/ndcg@10" in capsys.readouterr().out
    best = tuning._yaml.safe_load((out / "best.yaml").read_text())
    assert best["model"]["class_path"] == "rankkit.boosting.LambdaMARTModule"
    assert best["trainer"]["max_epochs"] == 3 and best["data"]["data"] == str(data)  # the overrides are kept


@pytest.mark.parametrize("argv, match", [
    (["tune", "--config", "lambdarank", "stray"], "unrecognized arguments"),
    (["tune", "--config", "lambdarank", "--optimizer.lr=1"], "settings for every trial start with"),
    (["tune", "--config", "nope"], "no packaged config 'nope'"),
    (["tune", "--config", "lambdarank", "--space", "/nonexistent.yaml"], "no search space"),
    (["tune", "--config", "lambdarank", "--n_trials", "0"], "n_trials"),
    (["tune", "--config", "lambdarank", "--pruner", "hyperband"], "invalid choice"),
])
def test_tune_mistakes_are_one_line(argv, match, capsys, tmp_path):
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(match, err), err


@pytest.mark.slow
def test_compare_tunes_each_fold_on_its_own_vali_then_tests_once(tmp_path, data, capsys):
    write_letor(data / "test.txt", 0)  # compare tests once, after the study (labels within train's)
    out = tmp_path / "cmp"
    assert main(["compare", "--data", str(data), "--models", "lambdarank", "--tune", "2", "--seeds", "2",
                 "--max_epochs", "2", "--out", str(out)]) == 0
    result = json.loads((out / "metrics.json").read_text())
    runs = result["runs"]
    assert result["tune"] == 2 and [r["seed"] for r in runs] == [0, 1]
    best = out / "tune" / "lambdarank-fold1" / "best.yaml"
    assert all(r["config"] == str(best) and r["tune_seconds"] > 0 for r in runs)  # both seeds train the study's best
    assert tuning._yaml.safe_load(best.read_text())["data"]["data"] == str(data)
    assert len(json.loads((best.parent / "trials.json").read_text())) == 2
    assert "tune s per fold" in (out / "table.md").read_text() and "Nested tuning" in (out / "table.md").read_text()


def test_a_space_may_name_trainer_and_data_settings_the_config_leaves_out():
    config = {"model": {"class_path": "rankkit.neural.LambdaRank", "init_args": {}}}
    space = {"trainer.gradient_clip_val": tuning.Param("trainer.gradient_clip_val", "choices", choices=(None, 1.0)),
             "data.max_docs": tuning.Param("data.max_docs", "choices", choices=(512, 4096)),
             "model.init_args.scheduler": tuning.Param("model.init_args.scheduler", "choices",
                                                       choices=("none", "warmup_cosine"))}
    assert tuning.untuned_values(config, space, "c.yaml") == {
        "trainer.gradient_clip_val": None, "data.max_docs": 4096, "model.init_args.scheduler": "none"}


@pytest.mark.slow
def test_trial_seeds_score_a_trial_by_the_mean_of_its_seeds_fits(tmp_path, config, capsys):
    result = quick_study(config, n_trials=1, out=tmp_path / "s", trial_seeds=2)
    row = json.loads((tmp_path / "s" / "trials.json").read_text())[0]
    assert "mean of 2 seeds" in result.best_config.read_text()
    got = []
    for seed in (0, 1):  # each seed's fit of the written config, refitted by `rankkit fit`
        capsys.readouterr()
        assert main(["fit", "--config", str(result.best_config), f"--seed_everything={seed}", f"--data.seed={seed}",
                     f"--trainer.default_root_dir={tmp_path / str(seed)}", "--quiet"]) == 0
        got.append(float(re.search(r"val/ndcg@10 ([0-9.]+)", capsys.readouterr().out).group(1)))
    assert got[0] != got[1]  # two different fits, averaged
    assert result.best_value == pytest.approx(sum(got) / 2, abs=5e-5) and result.best_value == row["value"]


def test_a_trial_says_it_started_before_its_first_fit(monkeypatch):
    # A trial can take a minute: its start line comes before any fit runs (no silent wait).
    optuna = pytest.importorskip("optuna")
    lines, seen_at_fit = [], []

    def slow_fit(config, values, *, trial, metric, workdir, report=True):
        seen_at_fit.append(list(lines))
        return 0.5, 0

    monkeypatch.setattr(tuning, "_trial", slow_fit)
    params = {"model.init_args.lr": tuning.Param("model.init_args.lr", "float", 1e-4, 1e-2, log=True),
              "model.init_args.hidden": tuning.Param("model.init_args.hidden", "choices", choices=([8], [16, 8]))}
    objective = tuning._objective({}, params, seed=0, trial_seeds=2, metric="val/ndcg@10", log=lines.append)
    trial = optuna.trial.FixedTrial({"model.init_args.lr": 0.001, "model.init_args.hidden": "[16, 8]"}, number=4)
    assert objective(trial) == 0.5
    assert seen_at_fit[0] == ["trial 4 started: lr=0.001, hidden=[16, 8]"] and len(seen_at_fit) == 2


def test_a_study_is_keyed_by_its_data_and_refuses_another():
    # Round 4: `tune --data.fold=2` after a fold-1 study reused it and wrote a best.yaml saying fold 2.
    optuna = pytest.importorskip("optuna")
    assert tuning._data_settings({"data": {"data": "mq2008", "fold": 1}})[1] == "-mq2008-fold1"
    assert tuning._data_settings({"data": {"data": "mq2008"}}, [1, 2, 3, 4, 5])[1] == ""  # the default study
    assert tuning._data_settings({"data": {"data": "mq2008"}}, [1, 2])[1] == "-mq2008-folds1-2"
    assert tuning._data_settings({"data": {"data": "mq2008", "fold": 2}})[1] == "-mq2008-fold2"
    assert tuning._data_settings({"data": {"data": "/x/My Data", "fold": 3}})[1] == "-My_Data-fold3"
    study = optuna.create_study(direction="maximize")
    fold1 = {"data": "mq2008", "fold": 1}
    tuning._check_study(study, fold1, "val/ndcg@10", "memory")
    study.add_trial(optuna.trial.create_trial(value=0.5))
    tuning._check_study(study, dict(fold1), "val/ndcg@10", "memory")  # the same settings resume
    with pytest.raises(ValueError, match=r"was run on data \{'data': 'mq2008', 'fold': 1\} .* asks for data "
                                         r"\{'data': 'mq2008', 'fold': 2\}"):
        tuning._check_study(study, {"data": "mq2008", "fold": 2}, "val/ndcg@10", "memory")
    with pytest.raises(ValueError, match="scored by val/ndcg@10; this run asks for .* scored by val/map"):
        tuning._check_study(study, fold1, "val/map", "memory")
    with pytest.raises(ValueError, match="minimises its objective"):
        tuning._check_study(optuna.create_study(direction="minimize"), fold1, "val/ndcg@10", "memory")


def test_a_trials_values_are_checked_against_the_search_space():
    # Round 4: a crafted study.db put `ckpt_path:` and callbacks into the best.yaml that tune writes.
    params = {"model.init_args.lr": tuning.Param("model.init_args.lr", "float", 1e-4, 1e-2, log=True),
              "model.init_args.hidden": tuning.Param("model.init_args.hidden", "choices", choices=([8], [16, 8]))}
    tuning._check_trial_values(3, {"model.init_args.lr": 1e-3, "model.init_args.hidden": [8]}, params, "db")
    with pytest.raises(ValueError, match=r"trial 3 sets 'ckpt_path', which the search space does not hold"):
        tuning._check_trial_values(3, {"ckpt_path": "/tmp/x.ckpt"}, params, "db")
    with pytest.raises(ValueError, match=r"trial 3 sets model\.init_args\.lr=5\.0, outside the search space"):
        tuning._check_trial_values(3, {"model.init_args.lr": 5.0}, params, "db")
    with pytest.raises(ValueError, match=r"model\.init_args\.hidden=\[4096, 4096\], outside"):
        tuning._check_trial_values(3, {"model.init_args.hidden": [4096, 4096]}, params, "db")


def test_a_failing_trial_is_one_line_and_the_study_goes_on(tmp_path, monkeypatch):
    # Round 4: one failing trial aborted the whole study with Optuna's logged traceback.
    pytest.importorskip("optuna")
    calls = []

    def flaky(config, values, *, trial, metric, workdir, report=True):
        calls.append(trial.number)
        if trial.number == 0:
            raise ValueError("boom\nsecond line")
        return 0.5, 3

    monkeypatch.setattr(tuning, "_trial", flaky)
    lines = []
    result = quick_study("lambdarank", out=tmp_path / "out", n_trials=2, log=lines.append)
    assert calls == [0, 1] and result.best_value == 0.5
    assert any(line.startswith("trial 0 fail (ValueError: boom): ") for line in lines), lines
    monkeypatch.setattr(tuning, "_trial", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("always")))
    with pytest.raises(ValueError, match=r"every trial was pruned or failed\); the last failure \(trial \d+\): "
                                         r"RuntimeError: always"):
        quick_study("lambdarank", out=tmp_path / "other", n_trials=2, log=lines.append)


def test_a_corrupt_study_file_is_one_line(tmp_path):
    pytest.importorskip("optuna")
    (tmp_path / "study.db").write_bytes(b"SQLite format 3\x00" + b"\xff" * 5000)
    with pytest.raises(ValueError, match=r"study\.db: not a readable Optuna study \(DatabaseError: .*pass another "
                                         r"--out"):
        quick_study("lambdarank", out=tmp_path, n_trials=1)


def _quick_trials(monkeypatch, calls):
    """Trials that take no time: each scores its learning rate (a study's values, recorded)."""
    def quick(config, values, *, trial, metric, workdir, report=True):
        calls.append(dict(values))
        return float(values["model.init_args.lr"]), 1

    monkeypatch.setattr(tuning, "_trial", quick)


def test_a_resumed_study_never_repeats_a_trial(tmp_path, monkeypatch):
    # Round 5: re-running an 8-trial study with --n_trials 11 ran trials 8 and 9 with exactly the
    # values of trials 1 and 2 (the reseeded sampler replayed its random start-up draws).
    calls = []
    _quick_trials(monkeypatch, calls)
    out = tmp_path / "out"
    quick_study("lambdarank", out=out, n_trials=4, log=lambda line: None)
    first = [json.dumps(c, sort_keys=True) for c in calls]
    quick_study("lambdarank", out=out, n_trials=8, log=lambda line: None)
    every = [json.dumps(c, sort_keys=True) for c in calls]
    assert len(every) == 8 and every[:4] == first
    assert len(set(every)) == 8, "a resumed trial repeated an earlier one's values"
    # A new study with the same seed draws as before (the seed alone decides a fresh study).
    calls.clear()
    quick_study("lambdarank", out=tmp_path / "again", n_trials=4, log=lambda line: None)
    assert [json.dumps(c, sort_keys=True) for c in calls] == first


def test_a_study_resumes_only_with_the_seeds_its_trials_were_scored_by(tmp_path, monkeypatch):
    # A study run with --seed 0 resumed with --seed 1 (or another --trial_seeds) mixed trials scored
    # by other fits, and --margin then paired fits of different seeds.
    _quick_trials(monkeypatch, [])
    out = tmp_path / "out"
    quick_study("lambdarank", out=out, n_trials=2, log=lambda line: None)
    for kw, said in ((dict(seed=1), r"seed 1 \(fits seeded from 1\), 1 seed"),
                     (dict(trial_seeds=2), r"seed 0 \(fits seeded from 0\), 2 seed"),
                     (dict(overrides={"seed_everything": 5}), r"seed 0 \(fits seeded from 5\), 1 seed")):
        with pytest.raises(ValueError, match=r"scored its trials with seed 0 \(fits seeded from 0\), 1 seed\(s\) a "
                                             r"trial; this run asks for " + said):
            quick_study("lambdarank", out=out, n_trials=3, log=lambda line: None, **kw)
    lines = []
    quick_study("lambdarank", out=out, n_trials=2, log=lines.append)  # the same settings resume
    assert any("2 of 2 trials done" in line for line in lines), lines
    # a study from before the seeds were recorded resumes, and records them
    storage = f"sqlite:///{(out / 'study.db').resolve()}"
    study = optuna.load_study(study_name="lambdarank-mq2008-fold1", storage=storage)
    study._storage.set_study_user_attr(study._study_id, "rankkit_scoring", None)
    quick_study("lambdarank", out=out, n_trials=3, seed=1, log=lambda line: None)
    assert optuna.load_study(study_name="lambdarank-mq2008-fold1", storage=storage).user_attrs["rankkit_scoring"] == \
        {"seed": 1, "seed_everything": 1, "trial_seeds": 1}


def test_an_interrupted_trial_is_marked_failed_and_runs_again_and_a_finished_study_says_so(tmp_path, monkeypatch):
    calls = []
    _quick_trials(monkeypatch, calls)
    out = tmp_path / "out"
    quick_study("lambdarank", out=out, n_trials=2, log=lambda line: None)
    storage = f"sqlite:///{(out / 'study.db').resolve()}"
    study = optuna.load_study(study_name="lambdarank-mq2008-fold1", storage=storage)
    stuck = study.ask()  # a trial a killed process left running, with the values it had drawn
    stuck.suggest_float("model.init_args.lr", 1e-4, 1e-2, log=True)
    left_over = dict(stuck.params)
    lines = []
    quick_study("lambdarank", out=out, n_trials=3, log=lines.append)
    assert any(f"trial {stuck.number} was interrupted" in line for line in lines), lines
    rows = json.loads((out / "trials.json").read_text())
    assert [r["state"] for r in rows] == ["complete", "complete", "fail", "complete"]
    assert calls[-1]["model.init_args.lr"] == left_over["model.init_args.lr"]  # run again, with its values
    lines.clear()
    quick_study("lambdarank", out=out, n_trials=3, log=lines.append)
    assert lines[0].startswith("3 of 3 trials done; best val/ndcg@10 ") and len(calls) == 3, lines


def test_a_study_across_folds_scores_a_trial_by_the_mean_of_its_folds_and_seeds(tmp_path, monkeypatch):
    seen = []

    def per_fold(config, values, *, trial, metric, workdir, report=True):
        fold, seed = config["data"]["fold"], config["seed_everything"]
        seen.append((trial.number, fold, seed, report))
        return 0.5 + 0.01 * fold + 0.001 * seed, 1

    monkeypatch.setattr(tuning, "_trial", per_fold)
    out = tmp_path / "out"
    result = quick_study("lambdarank", out=out, n_trials=2, folds="2-4", trial_seeds=2, log=lambda line: None)
    runs = [(f, s, r) for t, f, s, r in seen if t == 0]
    assert runs == [(2, 0, True), (2, 1, False), (3, 0, False), (3, 1, False), (4, 0, False), (4, 1, False)]
    rows = json.loads((out / "trials.json").read_text())
    assert rows[0]["value"] == pytest.approx(0.5 + 0.03 + 0.0005)  # the mean of 3 folds x 2 seeds
    assert rows[0]["fold_values"] == pytest.approx({"2": 0.5205, "3": 0.5305, "4": 0.5405})
    assert rows[0]["spread"] > 0 and " ± " in (out / "trials.md").read_text()
    assert "(mean of 3 folds x 2 seeds)" in result.best_config.read_text()
    # the study is named and keyed by its folds: other folds are another study, never a resume
    assert result.study.study_name == "lambdarank-mq2008-folds2-4"
    assert result.study.user_attrs["rankkit_data"]["folds"] == "2,3,4"
    other = quick_study("lambdarank", out=out, n_trials=1, folds="1,2", log=lambda line: None)
    assert other.study.study_name == "lambdarank-mq2008-folds1-2" and len(other.study.trials) == 1
    # every MQ2008 fold is the default study: its folder is the config's name alone
    assert tuning._data_settings({"data": {"data": "mq2008", "fold": 1}}, [1, 2, 3, 4, 5])[1] == ""


@pytest.mark.parametrize("folds, match", [("0-2", "`folds`"), ("a-b", "`folds`"), ([], "`folds` names no fold"),
                                          ("1,x", "`folds`")])
def test_bad_folds_are_one_line(folds, match, tmp_path, monkeypatch):
    monkeypatch.setattr(tuning, "_objective", lambda *a, **k: pytest.fail("a trial ran"))
    with pytest.raises(ValueError, match=match):
        quick_study("lambdarank", folds=folds, n_trials=1, out=tmp_path / "out")


def test_folds_the_data_lacks_are_refused_before_the_first_trial(tmp_path, monkeypatch):
    # Round 5: folds="1-9" on MQ2008 trained folds 1-5 (40 s), then failed at fold 6 with "the
    # study has no completed trial". The folds are checked against the data first.
    monkeypatch.setattr(tuning, "_objective", lambda *a, **k: pytest.fail("a trial ran"))
    with pytest.raises(ValueError, match=r"`folds` has to name folds in 1\.\.5, got '1-9'"):
        quick_study("lambdarank", folds="1-9", n_trials=1, out=tmp_path / "out")
    root = tmp_path / "root"
    for n in (1, 2):
        (root / f"Fold{n}").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"`folds` has to name folds in \[1, 2\], got '1-3'"):
        quick_study("lambdarank", folds="1-3", n_trials=1, out=tmp_path / "out2",
                    overrides={"data.data": str(root)})


def test_a_study_maximises_what_the_config_keeps_its_model_by(tmp_path, monkeypatch):
    # lambdamart_clicks keeps its checkpoint by val/click_likelihood: so does its study, unasked.
    seen = []

    def quick(config, values, *, trial, metric, workdir, report=True):
        seen.append(metric)
        return 0.5, 1

    monkeypatch.setattr(tuning, "_trial", quick)
    result = quick_study("lambdamart_clicks", out=tmp_path / "clicks", n_trials=1, log=lambda line: None)
    assert seen == ["val/click_likelihood"] and result.metric == "val/click_likelihood"
    assert "val/click_likelihood 0.5000 on vali" in result.best_config.read_text()
    assert quick_study("lambdamart", out=tmp_path / "plain", n_trials=1, log=lambda line: None).metric == "val/ndcg@10"
    assert quick_study("lambdamart", out=tmp_path / "asked", n_trials=1, metric="val/map",
                       log=lambda line: None).metric == "val/map"


def test_top_k_writes_the_k_best_trials_and_an_ensemble_compare_takes(tmp_path, monkeypatch, capsys):
    calls = []
    _quick_trials(monkeypatch, calls)  # a trial's value is its learning rate
    out = tmp_path / "out"
    lines = []
    result = quick_study("lambdarank", out=out, n_trials=5, top_k=3, log=lines.append)
    assert result.ensemble_config == out / "ensemble.yaml"
    best_lrs = sorted((c["model.init_args.lr"] for c in calls), reverse=True)[:3]
    names = tuning._yaml.safe_load(result.ensemble_config.read_text())["ensemble"]
    assert names == ["top/1.yaml", "top/2.yaml", "top/3.yaml"]
    written = [tuning._yaml.safe_load((out / n).read_text()) for n in names]
    assert [w["model"]["init_args"]["lr"] for w in written] == best_lrs  # best first
    assert written[0] == tuning._yaml.safe_load((out / "best.yaml").read_text())  # rank 1 is best.yaml
    # compare reads it as one row of three LambdaRank configs
    from rankkit.compare.protocol import _model_configs

    (label, (path, cfg)), = _model_configs([str(result.ensemble_config)]).items()
    assert label == "LambdaRank-top3" and [p.name for p, _ in cfg["ensemble"]] == ["1.yaml", "2.yaml", "3.yaml"]
    # more than the study completed: fewer members, said in one line
    more = quick_study("lambdarank", out=out, n_trials=5, top_k=9, log=lines.append)
    assert len(tuning._yaml.safe_load(more.ensemble_config.read_text())["ensemble"]) == 5
    assert any("top_k 9: the study has 5 completed trial(s)" in line for line in lines)
    assert quick_study("lambdarank", out=tmp_path / "one", n_trials=1).ensemble_config is None  # top_k 1: none
    assert not (tmp_path / "one" / "ensemble.yaml").exists()
    assert main(["tune", "--config", "lambdarank", "--n_trials", "5", "--top_k", "2", "--out", str(out),
                 "--quiet", *QUICK_FLAGS]) == 0
    assert f"rankkit compare --models {out / 'ensemble.yaml'}" in capsys.readouterr().out
    assert sorted(p.name for p in (out / "top").iterdir()) == ["1.yaml", "2.yaml"]  # the earlier 3..5 removed
    quick_study("lambdarank", out=out, n_trials=5, log=lines.append)  # no top_k: no stale ensemble left behind
    assert not (out / "ensemble.yaml").exists() and not (out / "top").exists() and (out / "best.yaml").exists()
    with pytest.raises(ValueError, match="`top_k`"):
        quick_study("lambdarank", out=out, n_trials=5, top_k=0)


def _paired_trials(monkeypatch, delta: float, amp: float):
    """Trials scored fit by fit: the untuned config 0.5 on every fit, every other trial 0.5 + delta
    with ±amp alternating over its fits (fold-major), so the paired differences are delta ± amp."""
    def fit(config, values, *, trial, metric, workdir, report=True):
        if trial.number == 0:
            return 0.5, 1
        k = 2 * (config["data"]["fold"] - 1) + config["seed_everything"]
        return 0.5 + delta + amp * (-1) ** k, 1

    monkeypatch.setattr(tuning, "_trial", fit)


def _chosen_lr(out):
    import yaml

    return yaml.safe_load((out / "best.yaml").read_text())["model"]["init_args"]["lr"]


@pytest.mark.parametrize("delta, amp, margin, kept", [(0.01, 0.05, 1.0, True), (0.05, 0.01, 1.0, False),
                                                      (0.01, 0.05, 0.0, False), (0.01, 0.05, 0.3, False)])
def test_a_study_of_several_fits_keeps_the_untuned_config_unless_beaten_beyond_its_noise(
        tmp_path, monkeypatch, delta, amp, margin, kept):
    # The one-standard-error rule on the paired differences (same fold, same seed), against a
    # plain-Python computation from what trials.json records.
    _paired_trials(monkeypatch, delta, amp)
    out, lines = tmp_path / "out", []
    result = quick_study("lambdarank", out=out, n_trials=3, folds="1-2", trial_seeds=2, margin=margin,
                         log=lines.append)
    rows = json.loads((out / "trials.json").read_text())
    untuned, best = rows[0], max(rows[1:], key=lambda r: (r["value"], -r["trial"]))
    diffs = [a - b for a, b in zip(best["run_values"], untuned["run_values"])]
    assert len(diffs) == 4
    mean = sum(diffs) / 4
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 3) / 2
    assert (mean <= margin * se) == kept
    chosen = untuned if kept else best
    assert _chosen_lr(out) == pytest.approx(chosen["params"]["model.init_args.lr"])
    assert result.best_value == pytest.approx(chosen["value"])
    assert result.trial == chosen["trial"] and result.kept_untuned == kept
    text = (out / "best.yaml").read_text()
    if kept:
        assert "the untuned config (trial 0) is kept" in text and any("is kept" in line for line in lines)
    elif margin:
        assert "beats the untuned config by" in text
    else:
        assert "untuned config (trial 0) is kept" not in text


@pytest.mark.parametrize("margin, kept", [("1", True), ("0", False)])
def test_rankkit_tune_says_when_the_margin_kept_the_untuned_config(tmp_path, monkeypatch, capsys, margin, kept):
    from rankkit.cli import main

    _paired_trials(monkeypatch, 0.01, 0.05)
    assert main(["tune", "--config", "lambdarank", "--n_trials", "3", "--folds", "1-2", "--trial_seeds", "2",
                 "--margin", margin, "--confirm", "0", "--out", str(tmp_path / "o"), "--quiet"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("kept the untuned config (trial 0") == kept, last
    assert last.startswith("best ") != kept, last


def test_a_study_of_one_fit_a_trial_takes_its_best_and_a_bad_margin_is_one_line(tmp_path, monkeypatch):
    _paired_trials(monkeypatch, 0.001, 0.0)  # one fold, one seed: no spread to weigh
    out, lines = tmp_path / "out", []
    quick_study("lambdarank", out=out, n_trials=2, margin=1.0, log=lines.append)
    rows = json.loads((out / "trials.json").read_text())
    assert rows[0]["run_values"] is None and _chosen_lr(out) == pytest.approx(rows[1]["params"]["model.init_args.lr"])
    assert any("--margin 1 weighs nothing here" in line for line in lines), lines
    for bad in (-1.0, float("nan"), "1", True):
        with pytest.raises(ValueError, match="`margin` has to be"):
            quick_study("lambdarank", out=tmp_path / "bad", n_trials=1, margin=bad)


# -- confirm: the best trial refitted with fresh seeds beside the untuned config ----------------------
def _refits(monkeypatch, lead: list[float], calls: list):
    """Quick trials (each scores its lr, trial 0 the untuned) and refits whose per-query vali
    values are 0.5 for the untuned config and 0.5 + lead[q] for any other, over the queries of
    each fold, plus ±0.01 alternating by seed (averaged out over two seeds)."""
    import torch

    _quick_trials(monkeypatch, [])
    packaged = tuning._yaml.safe_load(tuning._yaml.read_text(CONFIGS / "lambdarank.yaml"), "lambdarank.yaml")
    space = tuning.load_space(CONFIGS / "lambdarank.space.yaml")
    untuned_lr = tuning.untuned_values(packaged, space, "lambdarank.yaml")["model.init_args.lr"]

    def per_query(config, values, *, workdir):
        seed, fold = config["seed_everything"], config["data"].get("fold")
        calls.append((values["model.init_args.lr"] == untuned_lr, seed, fold))
        jitter = 0.01 * (-1) ** seed
        base = torch.full((len(lead),), 0.5, dtype=torch.float64) + jitter
        return base if values["model.init_args.lr"] == untuned_lr else base + torch.tensor(lead, dtype=torch.float64)

    monkeypatch.setattr(tuning, "vali_per_query", per_query)


@pytest.mark.parametrize("lead, margin, kept", [
    ([0.03, -0.02, 0.03, 0.0], 1.0, True),    # mean 0.01, SE 0.0122: within one SE
    ([0.03, -0.02, 0.03, 0.0], 0.0, False),   # ahead in the mean: margin 0 takes it
    ([0.02, 0.01, 0.03, 0.02], 1.0, False),   # mean 0.02, SE 0.0041: beyond one SE
    ([-0.02, 0.0, -0.01, 0.0], 0.0, True),    # behind on the refits although ahead in the study
])
def test_confirm_keeps_the_best_trial_only_if_it_wins_again_on_fresh_seeds(tmp_path, monkeypatch, lead, margin, kept):
    # The decision against a plain-Python mean and standard error of the per-query differences;
    # the refits use seeds the study did not (seed + trial_seeds onwards), both configs each seed.
    calls: list = []
    _refits(monkeypatch, lead, calls)
    out, lines = tmp_path / "out", []
    result = quick_study("lambdarank", out=out, n_trials=3, confirm=2, margin=margin, seed=4, log=lines.append)
    rows = json.loads((out / "trials.json").read_text())
    best = max(rows, key=lambda r: (r["value"], -r["trial"]))
    assert best["trial"] != 0  # the quick trials score their lr: a drawn one beats the untuned 1e-3
    mean = sum(lead) / len(lead)
    se = math.sqrt(sum((d - mean) ** 2 for d in lead) / (len(lead) - 1)) / math.sqrt(len(lead))
    assert (mean <= margin * se) == kept
    assert sorted(calls) == [(False, 5, 1), (False, 6, 1), (True, 5, 1), (True, 6, 1)]
    record = result.confirmation
    assert record["mean"] == pytest.approx(mean) and record["se"] == pytest.approx(se) and record["queries"] == 4
    assert record["seeds"] == [5, 6] and record["best"] == best["trial"] and record["untuned"] == 0
    assert result.kept_untuned == kept and result.trial == (0 if kept else best["trial"])
    assert _chosen_lr(out) == pytest.approx(rows[0 if kept else best["trial"]]["params"]["model.init_args.lr"])
    text = (out / "best.yaml").read_text()
    assert ("the untuned config (trial 0) is kept" in text) == kept and "on refits" in text
    assert any("confirming: trial" in line for line in lines)


def test_confirm_pairs_queries_fold_by_fold_and_reuses_its_record_on_a_rerun(tmp_path, monkeypatch):
    calls: list = []
    _refits(monkeypatch, [0.02, 0.01, 0.03], calls)
    out = tmp_path / "out"
    first = quick_study("lambdarank", out=out, n_trials=3, folds="1-2", trial_seeds=2, confirm=1, seed=4,
                        log=lambda line: None)
    assert sorted(calls) == [(False, 6, 1), (False, 6, 2), (True, 6, 1), (True, 6, 2)]  # seeds 4, 5 scored trials
    assert first.confirmation["queries"] == 6 and first.confirmation["folds"] == [1, 2]
    assert first.confirmation["mean"] == pytest.approx(0.02)
    calls.clear()
    again = quick_study("lambdarank", out=out, n_trials=3, folds="1-2", trial_seeds=2, confirm=1, margin=100.0,
                        seed=4, log=lambda line: None)
    assert calls == [] and again.confirmation == first.confirmation  # nothing refitted ...
    assert again.kept_untuned and not first.kept_untuned  # ... and the new margin weighs the same refits
    quick_study("lambdarank", out=out, n_trials=6, folds="1-2", trial_seeds=2, confirm=1, seed=4,
                log=lambda line: None)
    rows = json.loads((out / "trials.json").read_text())
    new_best = max(rows, key=lambda r: (r["value"], -r["trial"]))["trial"]
    assert (new_best != first.confirmation["best"]) == bool(calls)  # refitted only for a new best trial


def test_confirm_refits_nothing_when_the_untuned_config_is_best_and_bad_settings_are_one_line(tmp_path, monkeypatch):
    calls: list = []
    _refits(monkeypatch, [0.1], calls)

    def untuned_best(config, values, *, trial, metric, workdir, report=True):
        return (0.9 if trial.number == 0 else 0.1), 1

    monkeypatch.setattr(tuning, "_trial", untuned_best)
    result = quick_study("lambdarank", out=tmp_path / "o", n_trials=3, confirm=2, log=lambda line: None)
    assert calls == [] and result.confirmation is None and result.trial == 0 and not result.kept_untuned
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="`confirm`"):
            quick_study("lambdarank", out=tmp_path / "bad", n_trials=1, confirm=bad)
    with pytest.raises(ValueError, match=r"`confirm` compares the refits' val/ndcg@10 .* maximises val/loss"):
        quick_study("lambdarank", out=tmp_path / "bad", n_trials=1, confirm=1, metric="val/loss")
    bare = tmp_path / "bare.yaml"  # no ModelCheckpoint: Lightning's own keeps the last epoch, not the best
    bare.write_text((CONFIGS / "lambdarank.yaml").read_text().split("\ntrainer:")[0] + "\n")
    (tmp_path / "bare.space.yaml").write_text((CONFIGS / "lambdarank.space.yaml").read_text())
    with pytest.raises(ValueError, match=r"bare\.yaml needs a ModelCheckpoint monitoring val/ndcg@10"):
        quick_study(bare, out=tmp_path / "bad", n_trials=1, confirm=1)
    assert calls == [] and not (tmp_path / "bad").exists()  # refused before the first trial


def test_rankkit_tune_says_when_the_refits_kept_the_untuned_config(tmp_path, monkeypatch, capsys):
    _refits(monkeypatch, [-0.01, 0.0], [])
    assert main(["tune", "--config", "lambdarank", "--n_trials", "3", "--seed", "4", "--confirm", "1", "--out",
                 str(tmp_path / "o"), "--quiet"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("kept the untuned config (trial 0") and "not confirmed on refits" in last, last


SMALL_TREES = """
seed_everything: 0
model:
  class_path: rankkit.boosting.LambdaMARTModule
  init_args: {depth: 3, learning_rate: 0.3, min_data_in_leaf: 5, subsample: 0.7, seed: 0}
data: {data: DATA, max_docs: 64}
trainer:
  max_epochs: 6
  num_sanity_val_steps: 0
""" + CHECKPOINT


@pytest.mark.slow
@pytest.mark.parametrize("model", ["neural", "trees"])
def test_a_refits_per_query_vali_ndcg_is_what_the_same_fit_logged_at_its_best_epoch(tmp_path, data, model):
    # Two routes to one number: the module's own val/ndcg@10 at its best epoch, and the checkpoint
    # reloaded, scored query by query through the serving path and rankkit.metrics.
    import torch

    text = (SMALL_NEURAL if model == "neural" else SMALL_TREES).replace("DATA", str(data))
    base = tuning.apply_values(tuning._yaml.safe_load(text, "small"), tuning._seeded({"seed_everything": 0}, 3))
    logged, _ = tuning._trial(base, {}, trial=None, metric=tuning.METRIC, workdir=str(tmp_path), report=False)
    (tmp_path / "again").mkdir()
    per_query = tuning.vali_per_query(base, {}, workdir=str(tmp_path / "again"))
    assert per_query.dtype == torch.float64 and len(per_query) == 24  # write_letor's queries
    assert float(per_query.mean()) == pytest.approx(logged, abs=1e-5)
    broken = tuning._yaml.safe_load(text, "small")
    broken["trainer"]["callbacks"] = []  # Lightning's own checkpoint keeps the last epoch, not the best
    (tmp_path / "broken").mkdir()
    with pytest.raises(ValueError, match="needs a ModelCheckpoint monitoring val/ndcg@10"):
        tuning.vali_per_query(broken, {}, workdir=str(tmp_path / "broken"))


def test_the_default_study_scores_every_fold_with_two_seeds_and_confirms_on_three_more(tmp_path, monkeypatch, data):
    # The defaults are the study the nested measurements chose (docs/tuning.md, "Confirmed on
    # refits"); the CLI's are the function's.
    fits, refits = [], []
    _refits(monkeypatch, [0.05] * 4, refits)

    def fit(config, values, *, trial, metric, workdir, report=True):
        fits.append((trial.number, config["data"].get("fold"), config["seed_everything"]))
        return float(values.get("model.init_args.lr", values.get("model.init_args.learning_rate"))), 1

    monkeypatch.setattr(tuning, "_trial", fit)
    result = tuning.tune("lambdarank", out=tmp_path / "all", n_trials=3, seed=4, log=lambda line: None)
    assert result.study.study_name == "lambdarank"  # every MQ2008 fold: the default study's plain name
    assert [(f, s) for t, f, s in fits if t == 0] == [(f, s) for f in range(1, 6) for s in (4, 5)]
    assert sorted({(f, s) for _, s, f in refits}) == [(f, s) for f in range(1, 6) for s in (6, 7, 8)]
    assert result.confirmation["folds"] == [1, 2, 3, 4, 5] and not result.kept_untuned  # +0.05 on every query
    fits.clear()
    one = tuning.tune("lambdarank", out=tmp_path / "two", n_trials=1, overrides=["--data.fold=2"],
                      log=lambda line: None)
    assert one.study.study_name == "lambdarank-mq2008-fold2" and fits == [(0, 2, 0), (0, 2, 1)]  # --data.fold: one
    fits.clear()
    (tmp_path / "small.space.yaml").write_text(SMALL_SPACE)
    (tmp_path / "small.yaml").write_text(SMALL_NEURAL.replace("DATA", str(data)))
    tuning.tune(tmp_path / "small.yaml", out=tmp_path / "plain", n_trials=1, log=lambda line: None)
    assert fits == [(0, None, 0), (0, None, 1)]  # a folder of train/vali/test files has one fold: its own
    # Refits by default only where they can be scored query by query on val/ndcg@10.
    clicks = tuning.tune("lambdamart_clicks", out=tmp_path / "clicks", n_trials=3, seed=4, log=lambda line: None)
    assert clicks.metric == "val/click_likelihood" and clicks.confirmation is None
    from rankkit.cli import tune_parser

    cli = tune_parser().parse_args(["--config", "lambdarank"])
    signature = __import__("inspect").signature(tuning.tune).parameters
    for name in ("folds", "trial_seeds", "confirm", "margin"):
        assert getattr(cli, name) == signature[name].default, name
