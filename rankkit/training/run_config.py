"""What a run's config says, read without Lightning: the packaged configs, the model classes,
the checks of a checkpoint given to a run, and the quiet logging of a run (rankkit's
LightningCLI, :mod:`rankkit.training.lightning_cli`, and the light ``rankkit`` command share it).

Configs are package data (``rankkit/configs/*.yaml``): ``--config lambdarank`` names one, a path
still works. ``n_features`` flows from the datamodule into the model by ``link_arguments``.
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
from pathlib import Path

from rankkit.infra.checkpoint import check_checkpoint

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"  # package data
MODEL_CLASSES = {
    "RankNet": "rankkit.neural.module.RankNet",
    "LambdaRank": "rankkit.neural.module.LambdaRank",
    "LambdaMARTModule": "rankkit.boosting.module.LambdaMARTModule",
}


def config_names() -> list[str]:
    """The configs shipped with rankkit, by name (``lambdarank`` for ``configs/lambdarank.yaml``)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml") if not p.stem.endswith(".space"))


def resolve_config_arg(value: str) -> str:
    """``--config NAME`` -> the packaged ``configs/NAME.yaml``; a path is returned as it is."""
    if value.endswith((".yaml", ".yml")) or os.sep in value or "/" in value:
        return value
    path = CONFIG_DIR / f"{value}.yaml"
    if value not in config_names():  # a search space (NAME.space.yaml) is not a config
        raise ValueError(f"`--config`: no packaged config {value!r} (choose from {config_names()} or "
                         f"give a .yaml path)")
    return str(path)


# Every parser of every command takes options spelt in full: no abbreviations (argparse would
# take `--con FILE` for `--config FILE`, a spelling no check of the outputs would know).
PARSER_SETTINGS = {"allow_abbrev": False}
# Every spelling of the config flag: LightningCLI's `-c` alias and `--config`.
CONFIG_FLAGS = ("-c", "--config")


def _config_flag(arg: str) -> tuple[str, str | None] | None:
    """(flag, value or None) when ``arg`` is the config flag in any spelling (``-c FILE``,
    ``-cFILE``, ``--config FILE``, ``--config=FILE``), else None."""
    flag, eq, value = arg.partition("=")
    if flag in CONFIG_FLAGS:
        return flag, (value if eq else None)
    if arg.startswith("-c") and not arg.startswith("--") and len(arg) > 2:
        return "-c", arg[2:]
    return None


def resolve_config_args(argv: list[str]) -> list[str]:
    """``argv`` with every ``--config NAME`` (in any spelling) turned into the packaged file's path."""
    out, i = [], 0
    while i < len(argv):
        found = _config_flag(argv[i])
        if found is not None and found[1] is None and i + 1 < len(argv):
            out += [argv[i], resolve_config_arg(argv[i + 1])]
            i += 2
            continue
        if found is not None and found[1] is not None:
            out.append("--config=" + resolve_config_arg(found[1]))
        else:
            out.append(argv[i])
        i += 1
    return out


def config_paths(argv: list[str]) -> list[str]:
    """The config files named by the config flag in ``argv``, in any spelling (``-c FILE``,
    ``--config FILE``, ``--config=FILE``, ``--conf FILE``...): the files a run must never write over."""
    out = []
    for i, arg in enumerate(argv):
        found = _config_flag(arg)
        if found is None:
            continue
        if found[1] is not None:
            out.append(found[1])
        elif i + 1 < len(argv):
            out.append(argv[i + 1])
    return out


def resolve_model_class(class_path: str) -> type:
    """A config's ``model.class_path`` (a class name of rankkit's, or an import path) -> the
    LightningModule class (the config is the user's: naming code there is running it)."""
    import pytorch_lightning as pl

    full = MODEL_CLASSES.get(class_path, class_path)
    module, _, name = full.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name) if module else None
    except (ImportError, AttributeError):
        cls = None
    if not (isinstance(cls, type) and issubclass(cls, pl.LightningModule)):
        raise ValueError(f"`model.class_path` has to name a LightningModule, e.g. one of {sorted(MODEL_CLASSES)}, "
                         f"got {class_path!r}")
    return cls


LIGHTNING_COMMANDS = ("fit", "validate", "test")


def descriptions() -> dict[str, str]:
    """What ``rankkit fit|validate|test --help`` says the command does (Lightning's own first
    docstring lines say nothing about configs and stop mid-sentence)."""
    names = ", ".join(config_names())
    common = (f" --config NAME takes a config shipped with rankkit ({names}) from any folder, or a .yaml path; "
              f"--data.KEY=VALUE, --model.init_args.KEY=VALUE and --trainer.KEY=VALUE override it (the "
              f"defaults listed below are the classes'; `--config NAME --print_config` prints every value the "
              f"config sets, the model's arguments included). Quiet "
              f"unless --verbose (or RANKKIT_VERBOSE=1): then Lightning's progress bar, model summary, tips "
              f"and warnings show too. fit shows its progress (a bar in a terminal, a line every 10 epochs "
              f"or trees in a log, with vali NDCG@10) unless --quiet.")
    return {
        "fit": "Train the config's model (RankNet, LambdaRank or LambdaMARTModule) on its data with "
               "Trainer.fit, keeping the checkpoint of the best epoch (or tree) on vali NDCG@10, and end "
               "with one line naming it." + common,
        "validate": "Score a trained checkpoint (--ckpt_path FILE) on the validation set of the data it was "
                    "trained on: the fold, folder and batching recorded in the checkpoint, unless given "
                    "as --data.KEY; one line says which data was scored. No --config is needed: the "
                    "checkpoint holds the model; no lightning_logs folder is written unless "
                    "--trainer.logger=true." + common,
        "test": "Score a trained checkpoint (--ckpt_path FILE) on the test set of the data it was trained "
                "on: the fold, folder and batching recorded in the checkpoint, unless given as --data.KEY; "
                "one line says which data was scored, then Lightning's table of test metrics. No --config "
                "is needed: the checkpoint holds the model; no lightning_logs folder is written unless "
                "--trainer.logger=true." + common,
    }


#: Help of the Lightning method arguments whose own text does not hold for rankkit.
ARGUMENT_HELP = {
    "ckpt_path": "a local .ckpt file written by `rankkit fit` (fit: resume training from it; validate, test: "
                 "the model to score). A file path only: Lightning's 'best', 'last', 'hpc', 'registry' and "
                 "URLs are not taken. It is checked before it is read.",
    "weights_only": "ignored: rankkit always loads checkpoints with weights_only=True (nothing in the file is "
                    "unpickled).",
}


def check_run_config(config) -> dict | None:
    """The parsed config of ``rankkit fit|validate|test`` (``--ckpt_path X``, ``--ckpt_path=X``
    and ``ckpt_path:`` in a YAML file all arrive here): a checkpoint to resume or evaluate has to
    be a local, readable Lightning checkpoint, and Lightning reads it with ``weights_only=True``
    whatever the config says (so nothing in it is unpickled)."""
    ckpt_path = config.get("ckpt_path")
    checkpoint = None
    if ckpt_path is not None:  # refuses URLs, unreadable files, classes, sizes: now, in one line
        checkpoint = check_checkpoint(ckpt_path, need_scorer=False)[0]
    if "weights_only" in config:
        config["weights_only"] = True
    return checkpoint


#: The data settings a checkpoint's datamodule records that decide which documents are scored.
DATA_SETTINGS = ("data", "fold", "max_docs", "seed", "val_fraction", "val_seed")


def explicit_data_flags(argv: list[str]) -> set[str]:
    """The ``--data.KEY`` settings given on the command line (``--data.fold 2``, ``--data.fold=2``)."""
    keys = set()
    for arg in argv:
        if arg.startswith("--data."):
            keys.add(arg[len("--data."):].partition("=")[0])
    return keys


def use_recorded_data(subcommand: str, config, ckpt_path: str, argv: list[str], checkpoint: dict) -> str | None:
    """``rankkit validate|test --ckpt_path X``: score the data the checkpoint was trained on.

    The checkpoint's datamodule settings (:data:`DATA_SETTINGS`: data set, fold, batching, the
    ``val_fraction`` split) replace the config's, except those given as ``--data.KEY`` on the
    command line; a config file's values are defaults (the packaged configs say ``fold: 1``, and a
    model trained on fold 2 would otherwise be tested on fold 1, whose test set is its vali set).
    Returns the line that says which data was scored, printed after the run (None without
    recorded settings)."""
    recorded = checkpoint.get("datamodule_hyper_parameters")
    data = config.get("data")
    if not isinstance(recorded, dict) or data is None:
        return None
    explicit = explicit_data_flags(argv)
    overridden, taken = [], []
    for key in DATA_SETTINGS:
        if key not in recorded or key not in data:
            continue
        value = recorded[key]
        if not (value is None or isinstance(value, (str, int, float))) or isinstance(value, bool):
            raise ValueError(f"{ckpt_path}: the recorded data setting `{key}` has to be a plain value, got "
                             f"{type(value).__name__}")
        if key in explicit:
            if data[key] != value:
                overridden.append(f"--data.{key}={data[key]!r} (trained with {value!r})")
        elif data[key] != value:
            taken.append(f"{key}={value!r} (config: {data[key]!r})")
            data[key] = value
    split = "test" if subcommand == "test" else "validation"
    where = f"{data['data']} fold {data['fold']}" if "fold" in data else str(data.get("data"))
    if overridden:
        return (f"rankkit {subcommand}: scored the {split} set of {where}, as given: {', '.join(overridden)}; "
                f"not the data the checkpoint was trained on")
    line = f"rankkit {subcommand}: scored the {split} set of {where}, the data the checkpoint was trained on"
    if taken:
        line += f" (from the checkpoint: {', '.join(taken)})"
    return line + "; --data.KEY=VALUE on the command line overrides it"


def without_validation(trainer, datamodule) -> bool:
    """When ``datamodule`` has no validation set (a folder with train and test files only and no
    ``val_fraction``), set ``trainer`` up to train without one, as the README promises: no
    validation loop, no EarlyStopping on a validation metric (training runs ``max_epochs``),
    and ModelCheckpoint keeps the last epoch. Says so on stderr; returns whether it did."""
    from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint

    from rankkit.training.datamodule import RankingDataModule

    if not isinstance(datamodule, RankingDataModule):
        return False
    datamodule.setup("fit")
    if datamodule.val_set is not None:
        return False
    trainer.limit_val_batches = 0
    trainer.num_sanity_val_steps = 0
    stopped = [cb for cb in trainer.callbacks if isinstance(cb, EarlyStopping) and cb.monitor.startswith("val")]
    trainer.callbacks = [cb for cb in trainer.callbacks if cb not in stopped]
    for cb in trainer.callbacks:
        if isinstance(cb, ModelCheckpoint) and (cb.monitor or "").startswith("val"):
            cb.monitor = None  # keeps the last epoch (save_top_k=1)
            if cb.filename and cb.filename.startswith("best"):  # nothing was selected: not "best"
                cb.filename = "last" + cb.filename[len("best"):]
    print(f"rankkit: {datamodule.hparams.data} has no validation file: training {trainer.max_epochs} epochs "
          f"without {'early stopping and ' if stopped else ''}model selection (the last epoch is kept); "
          f"--data.val_fraction=0.1 holds out training queries instead", file=sys.stderr)
    return True


# Where the noise a user did not ask for comes from: Lightning's tips and banners (INFO logs),
# its internal deprecations and hints (warnings), torch's deprecations (warnings).
QUIET_LOGGERS = ("pytorch_lightning", "lightning_fabric", "lightning.pytorch", "lightning.fabric")
QUIET_WARNINGS = r"(pytorch_lightning|lightning_fabric|lightning|torch|jsonargparse)(\.|$)"


@contextlib.contextmanager
def quiet_lightning_logs(level: int = logging.WARNING):
    """Lightning's loggers (:data:`QUIET_LOGGERS`) at ``level`` inside the block: its tips,
    banners and info lines ("`Trainer.fit` stopped ...") off."""
    loggers = [logging.getLogger(name) for name in QUIET_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(level)
    try:
        yield
    finally:
        for logger, old in zip(loggers, levels):
            logger.setLevel(old)
