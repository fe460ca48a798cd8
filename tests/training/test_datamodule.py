"""RankingDataModule's data parts: LETOR Fold roots, train/test folders without a
validation file and the ``val_fraction`` hold-out, and a training run without the loader
warnings Lightning used to print."""
from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from rankkit.data import load_mq2008, make_synthetic
from rankkit.training.datamodule import RankingDataModule, hold_out
from rankkit.neural import LambdaRank

SHARED = "/work/shared/data"
LIGHTGBM_EXAMPLE = os.path.join(SHARED, "lightgbm-lambdarank")


def _letor(qids: list[int], docs: int, fold: int) -> str:
    """LETOR lines: ``docs`` documents for each qid, label and 3 features telling the fold apart."""
    lines = []
    for q in qids:
        for d in range(docs):
            lines.append(f"{(q + d) % 3} qid:{q} 1:{fold} 2:{q}.{d} 3:{d} # fold {fold} doc {d}")
    return "\n".join(lines) + "\n"


@pytest.fixture
def letor_root(tmp_path):
    """Fold1..Fold3, each with train (4 queries), vali (2) and test (2) files of 3 documents."""
    for fold in (1, 2, 3):
        d = tmp_path / f"Fold{fold}"
        d.mkdir()
        base = 100 * fold
        (d / "train.txt").write_text(_letor([base + i for i in range(4)], 3, fold))
        (d / "vali.txt").write_text(_letor([base + 10, base + 11], 3, fold))
        (d / "test.txt").write_text(_letor([base + 20, base + 21], 3, fold))
    return tmp_path


@pytest.mark.parametrize("fold", [1, 2, 3])
def test_fold_root_reads_the_chosen_fold(letor_root, fold):
    dm = RankingDataModule(str(letor_root), fold=fold)
    dm.setup()
    for split, qids in ((dm.train_set, range(4)), (dm.val_set, (10, 11)), (dm.test_set, (20, 21))):
        assert split.qids.tolist() == [100 * fold + q for q in qids]
        assert torch.all(split.features[:, 0] == fold)
        assert split.n_docs == 3 * len(qids)
    assert dm.train_set.source.endswith(os.path.join(f"Fold{fold}", "train.txt"))


def test_fold_is_checked_against_the_folds_there(letor_root, tmp_path_factory):
    with pytest.raises(ValueError, match=r"`fold` has to be one of \[1, 2, 3\] .* got 4"):
        RankingDataModule(str(letor_root), fold=4).setup()
    flat = tmp_path_factory.mktemp("flat")
    (flat / "train.txt").write_text(_letor([1, 2], 3, 1))
    with pytest.raises(ValueError, match="`fold` has to be 1 for .* got 2"):
        RankingDataModule(str(flat), fold=2).setup()
    with pytest.raises(ValueError, match="`fold` has to be an integer >= 1, got 0"):
        RankingDataModule(str(letor_root), fold=0)


def test_val_fraction_is_checked():
    for bad in (-0.1, 1.0, float("nan"), "0.1"):
        with pytest.raises(ValueError, match="`val_fraction` has to be a finite number in \\[0, 1\\)"):
            RankingDataModule("mq2008", val_fraction=bad)


def test_a_validation_file_wins_over_val_fraction(letor_root):
    dm = RankingDataModule(str(letor_root), fold=2, val_fraction=0.5)
    dm.setup()
    assert dm.train_set.n_queries == 4 and dm.val_set.qids.tolist() == [210, 211]


def test_hold_out_takes_whole_queries_seeded():
    ds = make_synthetic(50, (1, 9), 3, seed=2)
    rest, held = hold_out(ds, 0.1, seed=7)
    assert held.n_queries == 5 and rest.n_queries == 45
    assert sorted(rest.qids.tolist() + held.qids.tolist()) == list(range(50))
    # whole queries, in the dataset's order, documents unchanged
    assert torch.equal(held.sizes, ds.sizes[held.qids]) and held.qids.tolist() == sorted(held.qids.tolist())
    assert torch.equal(held.features, ds.subset(held.qids).features)
    assert hold_out(ds, 0.1, seed=7)[1].qids.tolist() == held.qids.tolist()
    assert hold_out(ds, 0.1, seed=8)[1].qids.tolist() != held.qids.tolist()
    assert hold_out(ds, 0.001, seed=0)[1].n_queries == 1  # at least one query
    with pytest.raises(ValueError, match="none would be left"):
        hold_out(make_synthetic(2, 3, 2), 0.9)


@pytest.mark.skipif(not os.path.isdir(LIGHTGBM_EXAMPLE), reason="no shared data on this machine")
def test_lightgbm_example_has_no_validation_set_unless_val_fraction():
    dm = RankingDataModule(LIGHTGBM_EXAMPLE)
    dm.setup()
    # rank.train / rank.test with .query sidecars (201 and 50 queries), and no vali
    assert dm.train_set.n_queries == 201 and dm.test_set.n_queries == 50 and dm.val_set is None
    whole = dm.train_set
    with pytest.raises(ValueError, match="no validation file"):
        dm.val_dataloader()

    dm = RankingDataModule(LIGHTGBM_EXAMPLE, val_fraction=0.1, seed=3)
    dm.setup()
    assert dm.val_set.n_queries == round(0.1 * 201) and dm.train_set.n_queries == 201 - 20
    assert dm.train_set.n_docs + dm.val_set.n_docs == whole.n_docs
    assert "held out" in dm.val_set.source
    # the held-out queries are the first training queries' whole documents, not a mix
    expected_train, expected_val = hold_out(whole, 0.1, seed=3)
    assert torch.equal(dm.val_set.features, expected_val.features)
    assert torch.equal(dm.train_set.labels, expected_train.labels)
    assert sum(int(b.mask.sum()) for b in dm.val_dataloader()) == dm.val_set.n_docs


@pytest.mark.skipif(not os.path.isdir(os.path.join(SHARED, "MQ2008")), reason="no shared data on this machine")
def test_letor_mq2008_fold_root_matches_the_bundled_fold():
    dm = RankingDataModule(os.path.join(SHARED, "MQ2008"), fold=1)
    dm.setup()
    train, _, test = load_mq2008(1)
    for ours, bundled in ((dm.train_set, train), (dm.test_set, test)):
        assert torch.equal(ours.qids, bundled.qids) and torch.equal(ours.labels, bundled.labels)
        assert torch.equal(ours.features, bundled.features)


def test_training_prints_no_loader_warnings(tmp_path):
    ds = make_synthetic(30, (2, 12), 4, seed=0)
    dm = RankingDataModule.from_datasets(ds.subset(range(20)), ds.subset(range(20, 30)), max_docs=48)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                         log_every_n_steps=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(LambdaRank(n_features=4, hidden=[4]), datamodule=dm)
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "IterableDataset" in m or "__len__" in m], messages
    assert not [m for m in messages if "log_every_n_steps" in m], messages


def test_load_from_checkpoint_goes_through_the_checkpoint_loader(tmp_path):
    # Round 4: Lightning's own loader fetched a URL and unpickled it, and honoured weights_only=False.
    import pytorch_lightning as pl

    path = tmp_path / "x.ckpt"
    base = {"state_dict": {}, "pytorch-lightning_version": pl.__version__}
    torch.save({**base, "datamodule_hyper_parameters": {"data": "mq2008", "fold": 2, "max_docs": 512}}, path)
    assert RankingDataModule.load_from_checkpoint(path).hparams.fold == 2
    with pytest.raises(ValueError, match="rankkit does not load checkpoints from URLs"):
        RankingDataModule.load_from_checkpoint("https://example.com/x.ckpt")
    with pytest.raises(ValueError, match="`weights_only=False` would unpickle the file"):
        RankingDataModule.load_from_checkpoint(path, weights_only=False)
    torch.save({**base, "datamodule_hyper_parameters": {"data": {"class_path": "os.system"}}}, path)
    with pytest.raises(ValueError, match="hyper-parameter `data` has to be a plain value, got a class_path"):
        RankingDataModule.load_from_checkpoint(path)


def test_empty_click_options_simulate_clicks_with_the_defaults():
    # Round 4: `clicks: {}` trained on the labels (an empty dict read as "no clicks"), exit 0.
    dm = RankingDataModule("mq2008", clicks={"sessions": 2})
    dm.setup("fit")
    plain = RankingDataModule("mq2008")
    plain.setup("fit")
    empty = RankingDataModule("mq2008", clicks={})
    empty.setup("fit")
    assert plain.train_set.position is None and bool((plain.train_set.labels > 1).any())
    for clicked in (dm, empty):
        assert clicked.train_set.position is not None
        assert set(clicked.train_set.labels.unique().tolist()) <= {0.0, 1.0}


# -- your own click log (issue 49) ----------------------------------------------------------------
def _click_log(folder, shift: int = 0, seed: int = 0):
    """A click-log folder: train/vali sessions of 8 shown documents with click labels and
    ``.position`` sidecars (positions + ``shift``), a labelled test file; clicks fall with the
    position and rise with feature 1."""
    from rankkit.data.clicks import PositionBasedModel, simulate_clicks

    folder.mkdir(exist_ok=True)
    for i, name in enumerate(("train.txt", "vali.txt", "test.txt")):
        data = make_synthetic(30, 12, 5, seed=seed + i)
        if name == "test.txt":
            rows = [(float(y), q, x) for q in range(data.n_queries)
                    for y, x in zip(data.labels[data.offsets[q]:data.offsets[q + 1]],
                                    data.features[data.offsets[q]:data.offsets[q + 1]])]
            positions = None
        else:
            log = simulate_clicks(data, data.features[:, 0], model=PositionBasedModel(eta=1.0, max_label=4.0),
                                  sessions_per_query=4, k=8, seed=seed + i)
            s = log.sessions
            rows = [(float(s.labels[j]), q, s.features[j]) for q in range(s.n_queries)
                    for j in range(int(s.offsets[q]), int(s.offsets[q + 1]))]
            positions = (log.position + shift).tolist()
        (folder / name).write_text("".join(f"{y:g} qid:{q + 1} " + " ".join(f"{k + 1}:{float(v):.6g}" for k, v in
                                                                           enumerate(x)) + "\n" for y, q, x in rows))
        if positions is not None:
            (folder / f"{name}.position").write_text("".join(f"{p}\n" for p in positions))
    return folder


def test_a_click_log_folder_reads_its_position_sidecars(tmp_path):
    folder = _click_log(tmp_path / "log")
    dm = RankingDataModule(str(folder), click_log=True)
    dm.setup()
    sidecar = [int(line) for line in (folder / "train.txt.position").read_text().split()]
    assert dm.train_set.position.tolist() == sidecar and dm.val_set.position is not None
    assert set(dm.train_set.labels.unique().tolist()) <= {0.0, 1.0} and dm.test_set.position is None
    plain = RankingDataModule(str(folder))  # without click_log, no sidecar is read
    plain.setup()
    assert plain.train_set.position is None
    (folder / "vali.txt.position").unlink()
    with pytest.raises(ValueError, match=r"`click_log=True`: .*vali\.txt\.position is missing"):
        RankingDataModule(str(folder), click_log=True).setup()
    for bad, message in ((dict(data="mq2008", click_log=True), "pass data=FOLDER"),
                         (dict(data=str(folder), click_log=True, clicks={}), "give one of the two")):
        with pytest.raises(ValueError, match=f"`click_log=True` reads your own click log.*{message}"):
            RankingDataModule(**bad)


def test_rankkit_fit_trains_lambdamart_on_a_click_log_with_any_position_ids(tmp_path, capsys):
    """`rankkit fit` on a user's click log: 0- and 1-based position sidecars train the same trees
    (LightGBM's reading of positions); 'auto' and a log without positions get one line each."""
    from rankkit.cli import main
    from rankkit.infra.checkpoint import load_checkpoint

    trees = []
    for shift in (0, 1):
        folder = _click_log(tmp_path / f"log{shift}", shift=shift)
        root = tmp_path / f"run{shift}"
        assert main(["fit", "--config", "lambdamart_clicks", f"--data.data={folder}", "--trainer.max_epochs=3",
                     f"--trainer.default_root_dir={root}", "--model.init_args.min_data_in_leaf=5", "--quiet"]) == 0, \
            capsys.readouterr().err
        trees.append(load_checkpoint(next(root.rglob("*.ckpt"))).scorer)
    for name, value in trees[0].state_dict().items():
        assert torch.equal(value, trees[1].state_dict()[name]), name
    naive = tmp_path / "naive"
    assert main(["fit", "--config", "lambdamart", f"--data.data={tmp_path / 'log0'}", "--data.click_log=true",
                 "--trainer.max_epochs=3", f"--trainer.default_root_dir={naive}",
                 "--model.init_args.min_data_in_leaf=5", "--quiet"]) == 0
    assert not torch.equal(load_checkpoint(next(naive.rglob("*.ckpt"))).scorer.leaf_values, trees[0].leaf_values)
    config = load_checkpoint(next((tmp_path / "run0").rglob("*.ckpt"))).config
    assert config.unbiased == "ips" and config.n_positions == 10
    capsys.readouterr()
    for extra, message in ((["--data.click_log=true", "--model.init_args.unbiased=auto"],
                            "`unbiased='auto'` races its candidates inside LambdaMART.fit"),
                           (["--model.init_args.unbiased=true"], "the training data has no positions")):
        code = main(["fit", "--config", "lambdamart", f"--data.data={tmp_path / 'log0'}", "--trainer.max_epochs=1",
                     f"--trainer.default_root_dir={tmp_path / 'bad'}", "--quiet", *extra])
        err = capsys.readouterr().err
        assert code == 2 and message in err and "Traceback" not in err, err


def test_folds_are_read_one_way_against_the_folds_the_data_has(tmp_path):
    from rankkit.training.datamodule import data_folds, parse_folds

    assert data_folds("mq2008") == [1, 2, 3, 4, 5] and data_folds(str(tmp_path)) == [1]
    for n in (1, 2, 4):
        (tmp_path / f"fold{n}").mkdir()
    assert data_folds(str(tmp_path)) == [1, 2, 4]
    with pytest.raises(ValueError, match="`data` must be 'mq2008' or a folder"):
        data_folds(str(tmp_path / "missing"))
    assert parse_folds("1-5") == [1, 2, 3, 4, 5] and parse_folds("5,1") == [5, 1] and parse_folds(3) == [3]
    assert parse_folds([4, 1], [1, 2, 4]) == [4, 1] and parse_folds(np.array([2, 3])) == [2, 3]
    assert parse_folds(np.int64(2)) == [2]
    for text, match in [("1-6", r"in 1\.\.5, got '1-6'"), ("0-2", "in 1..5"), ("1,1", "names a fold twice"),
                        ("a", "has to look like"), ([], "names no fold"), ([1.5], "has to look like"),
                        (True, "has to look like"), ([True], "has to look like"),
                        ("2-4", r"in \[1, 2, 4\]")]:
        with pytest.raises(ValueError, match=match):
            parse_folds(text, [1, 2, 4] if text == "2-4" else range(1, 6))
