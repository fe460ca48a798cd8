"""Quiet by default in the Python API: a Trainer.fit of a rankkit module on a rankkit
datamodule, and the LambdaMART estimator, raise none of the warnings rankkit's own code paths
used to cause; RANKKIT_VERBOSE=1 lets them through; the filters a fit adds are gone after it."""
from __future__ import annotations

import warnings

import pytest
import torch

pl = pytest.importorskip("pytorch_lightning")

from pytorch_lightning.loggers import CSVLogger  # noqa: E402

from rankkit.boosting import LambdaMART, LambdaMARTModule  # noqa: E402
from rankkit.training.datamodule import RankingDataModule  # noqa: E402
from rankkit.data.synthetic import make_synthetic  # noqa: E402
from rankkit.neural.module import LambdaRank, RankNet  # noqa: E402

# What a fit of rankkit's modules printed on main before this change.
NOISE = ("logging interval", "LeafSpec", "configure_optimizers")


def _data():
    return make_synthetic(20, 8, 5, seed=0), make_synthetic(10, 8, 5, seed=1)


MODELS = {
    "ranknet": lambda: RankNet(n_features=5, hidden=[8]),
    "lambdarank": lambda: LambdaRank(n_features=5, hidden=[8]),
    "lambdamart": lambda: LambdaMARTModule(depth=2, min_data_in_leaf=1),
}


def _forget_lightnings_warnings():
    """Lightning shows some warnings once a process (its ``WarningCache``s): forget them, so that
    what a first fit shows a user is seen whatever ran before in this process."""
    from pytorch_lightning.trainer.connectors import data_connector

    data_connector.warning_cache.clear()


def _fit(name, tmp_path, **trainer):
    train, val = _data()
    dm = RankingDataModule.from_datasets(train, val)
    model = MODELS[name]()
    # A logger (the default Trainer has one): Lightning's logging-interval check needs it.
    trainer = pl.Trainer(max_epochs=2, enable_progress_bar=False, enable_model_summary=False,
                         logger=CSVLogger(tmp_path), default_root_dir=tmp_path, **trainer)
    _forget_lightnings_warnings()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # every warning, however often it was shown before
        trainer.fit(model, datamodule=dm)
    return model, trainer, [f"{w.category.__name__}: {w.message}" for w in caught]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_trainer_fit_of_a_rankkit_module_raises_no_warnings(name, tmp_path, monkeypatch, capfd):
    monkeypatch.delenv("RANKKIT_VERBOSE", raising=False)
    before = list(warnings.filters)
    _, trainer, caught = _fit(name, tmp_path)
    assert trainer.global_step == (2 if name == "lambdamart" else trainer.global_step) > 0
    assert caught == []
    err = capfd.readouterr().err
    assert not [n for n in NOISE if n in err], err
    assert warnings.filters == before  # nothing left behind in the user's process


@pytest.mark.parametrize("how", ["env", "scope"])
@pytest.mark.parametrize("name", ["ranknet", "lambdamart"])
def test_rankkit_verbose_lets_lightnings_warnings_through(name, how, tmp_path, monkeypatch):
    from rankkit.infra.quiet import verbose_scope

    if how == "env":
        monkeypatch.setenv("RANKKIT_VERBOSE", "1")
    else:  # what `rankkit fit --verbose` and compare(verbose=True) enter
        monkeypatch.delenv("RANKKIT_VERBOSE", raising=False)
    with verbose_scope() if how == "scope" else warnings.catch_warnings():
        _, _, caught = _fit(name, tmp_path)
    assert any("logging interval" in c for c in caught), caught


def test_a_failed_fit_takes_its_filters_out(tmp_path, monkeypatch):
    monkeypatch.delenv("RANKKIT_VERBOSE", raising=False)

    class Broken(RankNet):
        def training_step(self, batch, batch_idx):
            raise RuntimeError("boom")

    train, val = _data()
    before = list(warnings.filters)
    trainer = pl.Trainer(max_epochs=1, enable_progress_bar=False, enable_model_summary=False, logger=False,
                         default_root_dir=tmp_path)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(Broken(n_features=5, hidden=[8]), datamodule=RankingDataModule.from_datasets(train, val))
    assert warnings.filters == before


def test_a_users_own_warnings_still_show(tmp_path, monkeypatch):
    """Only rankkit's causes are hidden: a warning the user's code raises during the fit shows."""
    monkeypatch.delenv("RANKKIT_VERBOSE", raising=False)

    class Mine(pl.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            warnings.warn("the user's own warning", UserWarning, stacklevel=1)

    _, _, caught = _fit("ranknet", tmp_path, callbacks=[Mine()])
    assert caught and all("the user's own warning" in c for c in caught), caught


def test_a_users_module_on_rankkits_datamodule_keeps_the_logging_hint(tmp_path, monkeypatch):
    """The datamodule hides only Lightning's LeafSpec deprecation: a user's module that logs
    on_step only is who the logging-interval hint is for."""
    monkeypatch.delenv("RANKKIT_VERBOSE", raising=False)

    class Users(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(5, 1)

        def training_step(self, batch, batch_idx):
            loss = self.linear(batch.features).pow(2).mean()
            self.log("loss", loss, on_step=True, on_epoch=False, batch_size=len(batch.labels))
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    train, _ = _data()
    trainer = pl.Trainer(max_epochs=1, enable_progress_bar=False, enable_model_summary=False,
                         logger=CSVLogger(tmp_path), default_root_dir=tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Users(), datamodule=RankingDataModule.from_datasets(train))
    messages = [str(w.message) for w in caught]
    assert any("logging interval" in m for m in messages), messages
    assert not any("LeafSpec" in m for m in messages), messages


@pytest.mark.parametrize(("value", "expected"), [("", False), ("0", False), ("false", False), ("off", False),
                                                 ("1", True), ("yes", True), ("TRUE", True)])
def test_rankkit_verbose_values(value, expected, monkeypatch):
    from rankkit.infra.quiet import verbose

    monkeypatch.setenv("RANKKIT_VERBOSE", value)
    assert verbose() is expected
    assert verbose(True) is True and verbose(False) is False


def test_lambdamart_module_steps_its_round_counter_and_resumes(tmp_path):
    """The no-op optimizer that replaced Lightning's placeholder counts rounds as steps, keeps no
    state, and a resume from the epoch-2 checkpoint keeps its 2 trees and grows 2 more."""
    from pytorch_lightning.callbacks import ModelCheckpoint

    train, val = _data()

    def run(epochs, root, ckpt_path=None):
        module = LambdaMARTModule(depth=2, min_data_in_leaf=1, subsample=0.8, seed=3)
        trainer = pl.Trainer(max_epochs=epochs, enable_progress_bar=False, enable_model_summary=False,
                             logger=False, default_root_dir=root,
                             callbacks=[ModelCheckpoint(dirpath=root, save_last=True)])
        trainer.fit(module, datamodule=RankingDataModule.from_datasets(train, val), ckpt_path=ckpt_path)
        assert trainer.global_step == epochs
        return module

    straight = run(4, tmp_path / "a")
    run(2, tmp_path / "b")
    resumed = run(4, tmp_path / "b", ckpt_path=str(tmp_path / "b" / "last.ckpt"))
    assert resumed.scorer.n_trees == straight.scorer.n_trees == 4
    for name in ("features", "thresholds", "leaf_values"):
        assert torch.equal(getattr(resumed.scorer, name)[:2], getattr(straight.scorer, name)[:2])
    assert straight.configure_optimizers().state_dict() == {}


def test_lambdamart_estimator_is_silent(capfd, monkeypatch):
    monkeypatch.delenv("RANKKIT_VERBOSE", raising=False)
    train, val = _data()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = LambdaMART(n_estimators=3, depth=2, min_data_in_leaf=1).fit(train, eval_set=[val])
        model.predict(val.features)
    assert [str(w.message) for w in caught] == []
    out = capfd.readouterr()
    assert out.out == "" and out.err == ""


def test_importing_rankkit_installs_no_warnings_filter():
    import subprocess
    import sys

    code = ("import warnings, torch, pytorch_lightning, torchmetrics; n = len(warnings.filters); "
            "import rankkit, rankkit.boosting.module, rankkit.neural.module, rankkit.training.datamodule, "
            "rankkit.compare.protocol; "
            "print(len(warnings.filters) - n)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0", out.stdout + out.stderr
