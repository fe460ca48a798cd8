"""rankkit.training.run_config: the config flag in every spelling, packaged names, model classes,
the data a checkpoint was trained on, and a run without a validation set."""
import logging
from types import SimpleNamespace

import pytest

from rankkit.training import run_config as rc


@pytest.mark.parametrize("argv, paths", [
    (["--config", "a.yaml"], ["a.yaml"]), (["--config=a.yaml"], ["a.yaml"]), (["-c", "a.yaml"], ["a.yaml"]),
    (["-ca.yaml"], ["a.yaml"]), (["-c=a.yaml"], ["a.yaml"]), (["--config"], []),
    (["fit", "-c", "a.yaml", "--trainer.max_epochs=2", "--config=b.yml"], ["a.yaml", "b.yml"]),
    (["--ckpt_path", "x.ckpt", "--compile"], []),
])
def test_every_spelling_of_the_config_flag_is_found(argv, paths):
    assert rc.config_paths(argv) == paths


def test_packaged_names_become_paths_and_everything_else_stays():
    assert set(rc.config_names()) >= {"compare", "lambdamart", "lambdarank"}
    assert not any(name.endswith(".space") for name in rc.config_names())
    resolved = rc.resolve_config_args(["fit", "--config", "lambdarank", "-clambdamart", "--config=my/x.yaml",
                                       "--model.k=3"])
    assert resolved == ["fit", "--config", str(rc.CONFIG_DIR / "lambdarank.yaml"),
                        "--config=" + str(rc.CONFIG_DIR / "lambdamart.yaml"), "--config=my/x.yaml", "--model.k=3"]
    assert all(p.exists() for p in (rc.CONFIG_DIR / "lambdarank.yaml", rc.CONFIG_DIR / "lambdamart.yaml"))
    with pytest.raises(ValueError, match="no packaged config 'lambdarank.space'"):
        rc.resolve_config_arg("lambdarank.space")


def test_model_classes_by_name_or_path_and_nothing_that_is_not_a_module():
    from rankkit.boosting.module import LambdaMARTModule
    from rankkit.neural import LambdaRank

    assert rc.resolve_model_class("LambdaRank") is LambdaRank
    assert rc.resolve_model_class("rankkit.boosting.module.LambdaMARTModule") is LambdaMARTModule
    for bad in ("rankkit.boosting.LambdaMART", "os.system", "no.such.Module", "Nothing"):
        with pytest.raises(ValueError, match="has to name a LightningModule"):
            rc.resolve_model_class(bad)


def _recorded(**settings):
    return {"datamodule_hyper_parameters": {"data": "mq2008", "fold": 2, "max_docs": 512, "seed": 0,
                                            "val_fraction": 0.0, "val_seed": 0, **settings}}


def test_validate_and_test_score_the_data_the_checkpoint_was_trained_on_unless_told():
    config = {"data": {"data": "mq2008", "fold": 1, "max_docs": 512, "seed": 0}}
    line = rc.use_recorded_data("test", config, "m.ckpt", [], _recorded())
    assert config["data"]["fold"] == 2
    assert line.startswith("rankkit test: scored the test set of mq2008 fold 2, the data the checkpoint was "
                           "trained on (from the checkpoint: fold=2 (config: 1))")
    config = {"data": {"data": "mq2008", "fold": 3, "max_docs": 512, "seed": 0}}
    line = rc.use_recorded_data("validate", config, "m.ckpt", ["--data.fold=3"], _recorded())
    assert config["data"]["fold"] == 3 and "as given: --data.fold=3 (trained with 2)" in line
    assert rc.use_recorded_data("test", config, "m.ckpt", [], {}) is None
    with pytest.raises(ValueError, match="m.ckpt: the recorded data setting `fold` has to be a plain value"):
        rc.use_recorded_data("test", {"data": {"fold": 1}}, "m.ckpt", [], _recorded(fold=[1]))
    assert rc.explicit_data_flags(["--data.fold", "2", "--data.seed=3", "--model.k=1"]) == {"fold", "seed"}


def test_a_run_config_reads_its_checkpoint_only_with_weights_only():
    config = {"ckpt_path": None, "weights_only": False}
    assert rc.check_run_config(config) is None and config["weights_only"] is True
    with pytest.raises(ValueError):
        rc.check_run_config({"ckpt_path": "https://example.com/model.ckpt"})


def test_lightnings_info_lines_are_quiet_inside_the_block_only():
    logger = logging.getLogger("pytorch_lightning")
    before = logger.level
    with rc.quiet_lightning_logs():
        assert all(logging.getLogger(n).level == logging.WARNING for n in rc.QUIET_LOGGERS)
    assert logger.level == before


def test_without_validation_ignores_anything_but_rankkits_datamodule():
    assert rc.without_validation(SimpleNamespace(callbacks=[]), object()) is False
