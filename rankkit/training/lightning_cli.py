"""rankkit's LightningCLI: how ``rankkit fit|validate|test|predict`` and ``rankkit compare``
configure a model from its YAML, in one place (imported by both, so neither imports the other).

Configs are package data (``rankkit/configs/*.yaml``): ``--config lambdarank`` names one, a path
still works. ``n_features`` flows from the datamodule into the model by ``link_arguments``.
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from rankkit.infra import yaml as _yaml
from rankkit.infra.checkpoint import check_checkpoint
from rankkit.infra.io import atomic_write, check_outputs
from rankkit.infra.quiet import verbose_scope

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


# Every spelling argparse accepts for the config flag: LightningCLI's `-c` alias and the
# unambiguous abbreviations of `--config`.
CONFIG_FLAGS = ("-c", "--conf", "--confi", "--config")


def _config_flag(arg: str) -> tuple[str, str | None] | None:
    """(flag, value or None) when ``arg`` is the config flag in any spelling (``-c FILE``,
    ``-cFILE``, ``--config FILE``, ``--config=FILE``, ``--conf=FILE``), else None."""
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
              f"defaults listed below are the classes'; `--config NAME --help` lists the config's). Quiet "
              f"unless --verbose (or RANKKIT_VERBOSE=1): then Lightning's progress bar, model summary, tips "
              f"and warnings show too. fit shows its progress (a bar in a terminal, a line every 10 epochs "
              f"or trees in a log, with vali NDCG@10) unless --quiet.")
    return {
        "fit": "Train the config's model (RankNet, LambdaRank or LambdaMARTModule) on its data with "
               "Trainer.fit, keeping the checkpoint of the best epoch (or tree) on vali NDCG@10, and end "
               "with one line naming it." + common,
        "validate": "Score a trained checkpoint (--ckpt_path FILE) on the validation set of the data it was "
                    "trained on: the fold, folder and batching recorded in the checkpoint, unless given "
                    "as --data.KEY; one line says which data was scored." + common,
        "test": "Score a trained checkpoint (--ckpt_path FILE) on the test set of the data it was trained "
                "on: the fold, folder and batching recorded in the checkpoint, unless given as --data.KEY; "
                "one line says which data was scored, then Lightning's table of test metrics." + common,
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


def lightning_cli(args: list[str] | None, *, run: bool = True, verbose: bool = True, progress: bool = False):
    """Build rankkit's LightningCLI on ``args`` (with a subcommand of :data:`LIGHTNING_COMMANDS`
    when ``run``); ``args`` None reads ``sys.argv``.

    ``verbose=False`` (``rankkit fit`` without ``--verbose``) is quiet: no Lightning progress bar, no
    model summary, no Lightning tips, banners or info lines, no warnings raised inside
    Lightning or torch (rankkit's own warnings still show); ``fit`` ends with one line naming
    the checkpoint it kept; ``progress`` adds rankkit's own progress (a one-line bar in a terminal,
    a line every 10 epochs in a log: :class:`rankkit.infra.progress.FitProgress`). Options given in the
    config or on the command line (``--trainer.enable_progress_bar=true``) still win."""
    import pytorch_lightning as pl
    from pytorch_lightning.cli import LightningCLI, SaveConfigCallback

    from rankkit.training.datamodule import RankingDataModule

    for path in MODEL_CLASSES.values():  # imported so `--model=LambdaRank` resolves
        resolve_model_class(path)

    _yaml.install()
    if args is not None:
        args = resolve_config_args(list(args))
    config_files = config_paths(sys.argv[1:] if args is None else args)

    class SaveConfig(SaveConfigCallback):
        """Lightning's copy of the run's config into the log folder, refused (before training)
        when it would land on one of the configs it was read from, and written atomically."""

        def setup(self, trainer, pl_module, stage: str) -> None:
            if self.already_saved or not self.save_to_log_dir:
                return super().setup(trainer, pl_module, stage)
            target = os.path.join(trainer.log_dir, self.config_filename)
            if trainer.is_global_zero:
                check_outputs({"--trainer.default_root_dir": target},
                              {"--config": config_files}, with_sidecars=False)
                atomic_write(target, lambda tmp: self.parser.save(self.config, tmp, skip_none=False,
                                                                  overwrite=True, multifile=self.multifile),
                             suffix=".yaml")
                self.save_config(trainer, pl_module, stage)
                self.already_saved = True
            self.already_saved = trainer.strategy.broadcast(self.already_saved)

    class RankkitCLI(LightningCLI):
        def add_arguments_to_parser(self, parser) -> None:
            parser.link_arguments("data.n_features", "model.init_args.n_features", apply_on="instantiate")

        def _parse_ckpt_path(self) -> None:
            # LightningCLI reads `ckpt_path`'s hyper-parameters (and `_class_path`) into the
            # model's config: checked first, as `load_checkpoint` checks them.
            sub = self.config.get("subcommand")
            if sub:
                checkpoint = check_run_config(self.config[sub])  # read once, checked
                ckpt_path = self.config[sub].get("ckpt_path")
                if sub in ("validate", "test") and checkpoint is not None:
                    self.scored_line = use_recorded_data(sub, self.config[sub], ckpt_path,
                                                         sys.argv[1:] if args is None else args, checkpoint)
            super()._parse_ckpt_path()

        def _say_what_was_scored(self) -> None:
            line = getattr(self, "scored_line", None)
            if line is not None and self.trainer.is_global_zero:
                print(line, file=sys.stderr)

        after_validate = after_test = _say_what_was_scored

        def before_fit(self) -> None:
            without_validation(self.trainer, self.datamodule)

        def after_fit(self) -> None:
            if verbose or not self.trainer.is_global_zero:
                return
            cb = self.trainer.checkpoint_callback
            path = getattr(cb, "best_model_path", "") or "none (no ModelCheckpoint)"
            score = getattr(cb, "best_model_score", None)
            metric = f", {cb.monitor} {float(score):.4f}" if score is not None and cb.monitor else ""
            print(f"rankkit fit: {self.trainer.current_epoch} epochs; checkpoint {path}{metric}")

        def instantiate_trainer(self, **kwargs):
            # A bad trainer option (accelerator=gpu without a GPU, max_epochs=-5, devices=x) is the
            # user's mistake: one ValueError naming the trainer, not Lightning's traceback.
            try:
                return super().instantiate_trainer(**kwargs)
            except (ValueError, TypeError, RuntimeError) as e:
                raise ValueError(f"`--trainer` options: {e}") from None
            except Exception as e:
                if type(e).__name__ != "MisconfigurationException":
                    raise
                raise ValueError(f"`--trainer` options: {e}") from None

        @staticmethod
        def subcommands() -> dict[str, set[str]]:
            # `rankkit predict` is rankkit's own command (any artefact, any input file). Lightning's
            # `verbose` of validate/test (print the metrics table) is always on: `--verbose` is
            # rankkit's (everything Lightning says).
            return {k: v | ({"verbose"} if k in ("validate", "test") else set())
                    for k, v in LightningCLI.subcommands().items() if k in LIGHTNING_COMMANDS}

        def _prepare_subcommand_parser(self, klass, subcommand: str, **kwargs):
            parser = super()._prepare_subcommand_parser(klass, subcommand, **kwargs)
            for action in parser._actions:
                if action.dest in ARGUMENT_HELP:
                    action.help = ARGUMENT_HELP[action.dest]
            for group in parser._action_groups:  # Lightning's docstring, cut mid-sentence, as a title
                if group.title and group.title.startswith(("Runs the full", "Perform one evaluation")):
                    group.title = f"Trainer.{subcommand} arguments"
            return parser

    parser_kwargs: dict[str, Any] = {"exit_on_error": False}  # errors raise: main prints one line
    if run:
        parser_kwargs.update({name: {"exit_on_error": False, "description": text}
                              for name, text in descriptions().items()})
    trainer_defaults = {} if verbose else {"enable_progress_bar": False, "enable_model_summary": False}
    if progress and not verbose:  # a quiet fit still shows its progress (rankkit.infra.progress), unless --quiet
        from rankkit.infra.progress import FitProgress

        trainer_defaults["callbacks"] = [FitProgress()]
    with warnings.catch_warnings(), contextlib.ExitStack() as stack:
        # LightningCLI warns whenever `args` is given while sys.argv holds anything (pytest, compare).
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
        if verbose:  # rankkit's modules then filter nothing either (rankkit.infra.quiet)

            stack.enter_context(verbose_scope())
        else:
            warnings.filterwarnings("ignore", module=QUIET_WARNINGS)
            stack.enter_context(quiet_lightning_logs())
        try:
            return RankkitCLI(pl.LightningModule, RankingDataModule, subclass_mode_model=True, args=args,
                              run=run, save_config_callback=SaveConfig, save_config_kwargs={"overwrite": True},
                              trainer_defaults=trainer_defaults, parser_kwargs=parser_kwargs)
        except OSError as e:
            if e.filename is not None or e.errno is None or type(e) is not OSError:
                raise
            # Lightning's checkpoint and log writers (fsspec) drop the path from ENOSPC / EFBIG.
            raise OSError(e.errno, f"{e.strerror or os.strerror(e.errno)} (while writing the run's checkpoints "
                                   f"or logs; --trainer.default_root_dir chooses where)") from e
