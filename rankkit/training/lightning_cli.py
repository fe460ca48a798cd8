"""rankkit's LightningCLI: how ``rankkit fit|validate|test``, ``rankkit compare`` and ``rankkit tune``
configure a model from its YAML, in one place (imported by each, so none imports another).

Configs are package data (``rankkit/configs/*.yaml``): ``--config lambdarank`` names one, a path
still works. ``n_features`` flows from the datamodule into the model by ``link_arguments``.
This module imports Lightning; :mod:`rankkit.training.run_config` holds what needs no Lightning.
"""
from __future__ import annotations

import contextlib
import os
import sys
import warnings
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.cli import LightningCLI, SaveConfigCallback

from rankkit.boosting.config import KERNEL_OPTIONS as BOOSTER_KERNEL_OPTIONS, BoosterConfig
from rankkit.custom import is_custom
from rankkit.neural.config import KERNEL_OPTIONS as NEURAL_KERNEL_OPTIONS, NeuralConfig
from rankkit.infra import yaml as _yaml
from rankkit.infra.io import atomic_write, check_outputs
from rankkit.infra.progress import FitProgress
from rankkit.infra.quiet import verbose_scope
from rankkit.training.datamodule import RankingDataModule
from rankkit.training.run_config import (
    ARGUMENT_HELP,
    LIGHTNING_COMMANDS,
    MODEL_CLASSES,
    PARSER_SETTINGS,
    QUIET_WARNINGS,
    check_run_config,
    config_paths,
    descriptions,
    quiet_lightning_logs,
    resolve_config_args,
    resolve_model_class,
    use_recorded_data,
    without_validation,
)


class SaveConfig(SaveConfigCallback):
    """Lightning's copy of the run's config into the log folder, refused (before training)
    when it would land on one of the configs it was read from (``config_files``), and written
    atomically; not written without a logger (``--trainer.logger=false``: the "log folder" is
    then the root folder, the current one by default, and a ``config.yaml`` there is the user's)."""

    def __init__(self, *args, config_files: list[str] = (), **kwargs):
        super().__init__(*args, **kwargs)
        self.config_files = list(config_files)

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.already_saved or not self.save_to_log_dir:
            return super().setup(trainer, pl_module, stage)
        if trainer.logger is None:  # --trainer.logger=false: no log folder of the run's own to record it in
            self.already_saved = True  # (its "log dir" is the root folder, whose config.yaml is the user's)
            return None
        target = os.path.join(trainer.log_dir, self.config_filename)
        if trainer.is_global_zero:
            check_outputs({"--trainer.default_root_dir": target},
                          {"--config": self.config_files}, with_sidecars=False)
            atomic_write(target, lambda tmp: self.parser.save(self.config, tmp, skip_none=False,
                                                              overwrite=True, multifile=self.multifile),
                         suffix=".yaml")
            self.save_config(trainer, pl_module, stage)
            self.already_saved = True
        self.already_saved = trainer.strategy.broadcast(self.already_saved)


class RankkitCLI(LightningCLI):
    """LightningCLI with rankkit's rules: ``n_features`` linked from the data, a checkpoint's
    recorded settings checked before use, one line after a quiet fit, trainer mistakes as
    ValueError, and only the subcommands of :data:`LIGHTNING_COMMANDS`.

    Args:
        argv: the command line the run was given (what a validate/test compares with the
            checkpoint's recorded data); quiet: one summary line after ``fit``.
    """

    def __init__(self, *args, argv: list[str], quiet: bool, **kwargs):
        self.argv, self.quiet, self.scored_line = argv, quiet, None
        super().__init__(*args, **kwargs)

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.n_features", "model.init_args.n_features", apply_on="instantiate")

    def _parse_ckpt_path(self) -> None:
        # LightningCLI reads `ckpt_path`'s hyper-parameters (and `_class_path`) into the
        # model's config: checked first, as `load_checkpoint` checks them.
        sub = self.config.get("subcommand")
        if sub:
            checkpoint = check_run_config(self.config[sub])  # read once, checked
            ckpt_path = self.config[sub].get("ckpt_path")
            if checkpoint is not None:
                refuse_recorded_code(self.config[sub], ckpt_path, checkpoint)
            if sub in ("validate", "test") and checkpoint is not None:
                self.scored_line = use_recorded_data(sub, self.config[sub], ckpt_path, self.argv, checkpoint)
        super()._parse_ckpt_path()

    def before_instantiate_classes(self) -> None:
        sub = self.config.get("subcommand")
        model = (self.config[sub] if sub else self.config).get("model")
        init_args = model.get("init_args") if hasattr(model, "get") else None
        if init_args is not None:
            dropped = clear_kernel_options(init_args, self.argv, neural=".neural." in str(model.get("class_path", "")))
            if dropped:
                print(f"rankkit {sub or 'fit'}: the custom objective takes its own options: the config's "
                      f"{', '.join(dropped)} (the built-in kernel's) do not apply and are left out", file=sys.stderr)

    def _say_what_was_scored(self) -> None:
        if self.scored_line is not None and self.trainer.is_global_zero:
            print(self.scored_line, file=sys.stderr)

    after_validate = after_test = _say_what_was_scored

    def before_fit(self) -> None:
        without_validation(self.trainer, self.datamodule)

    def _run_subcommand(self, subcommand: str) -> None:
        # A fit that fails leaves no logger folder of its own behind (config.yaml, hparams.yaml),
        # unless it holds a checkpoint: a failure after a saved epoch loses nothing.
        new = new_folder(self.trainer.log_dir) if subcommand == "fit" and self.trainer.logger is not None else None
        try:
            super()._run_subcommand(subcommand)
        except BaseException:
            if new is not None and self.trainer.is_global_zero:
                remove_if_no_checkpoint(new)
            raise

    def after_fit(self) -> None:
        if not self.quiet or not self.trainer.is_global_zero:
            return
        cb = self.trainer.checkpoint_callback
        path = getattr(cb, "best_model_path", "") or "none (no ModelCheckpoint)"
        score = getattr(cb, "best_model_score", None)
        metric = f", {cb.monitor} {float(score):.4f}" if score is not None and cb.monitor else ""
        unit = "trees" if getattr(self.model, "train_batching", None) == "dataset" else "epochs"
        choice = getattr(self.model, "unbiased_choice_", None)  # unbiased="auto": say what won
        chosen = f"; unbiased='auto' chose {choice}" if choice is not None else ""
        print(f"rankkit fit: {self.trainer.current_epoch} {unit}; checkpoint {path}{metric}{chosen}")

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


#: The built-in lambda kernel's options of each parameter that can name a custom objective: a
#: custom one refuses them (it takes its own), so a config's values are dropped for it.
KERNEL_OPTIONS = {"objective": (BoosterConfig, BOOSTER_KERNEL_OPTIONS), "loss": (NeuralConfig, NEURAL_KERNEL_OPTIONS)}


def clear_kernel_options(init_args, argv: list[str], neural: bool = False) -> list[str]:
    """With a custom ``objective`` (a neural ranker's too, or its old spelling ``loss``) in the
    model's ``init_args`` (a jsonargparse Namespace or dict), set the built-in kernel's options
    that a config file gave (the packaged ``lambdamart`` config's ``k: 10``, ``normalize: true``)
    back to their defaults, and return them as ``name=value`` texts; one given on the command
    line (``argv``) is the user's own contradiction: one ValueError naming it."""
    dropped = []
    for key in ("objective", "loss"):
        config, options = KERNEL_OPTIONS["loss" if neural else key]
        value = init_args.get(key) if hasattr(init_args, "get") else None
        if not (isinstance(value, str) and is_custom(value)):
            continue
        for option in options:
            default, current = getattr(config, option), init_args.get(option, getattr(config, option))
            if current == default:
                continue
            flag = f"--model.init_args.{option}"
            if any(a == flag or a.startswith(flag + "=") for a in argv):
                raise ValueError(f"`{flag}={current}` configures the built-in lambda kernel; the custom {key} "
                                 f"{value} takes its own options (set them in the loss): leave {flag} out")
            init_args[option] = default
            dropped.append(f"{option}={current!r}")
    return dropped


def refuse_recorded_code(config, ckpt_path: str, checkpoint: dict) -> None:
    """A checkpoint's recorded custom loss or objective (``pkg.mod.fn``) is text: Lightning would
    put it into the model's arguments, and the run would import the file's choice of code. It is
    used only when the config or command line being run names the same one; otherwise one line."""
    recorded = checkpoint.get("hyper_parameters") or {}
    init_args = ((config.get("model") or {}).get("init_args") or {}) if hasattr(config, "get") else {}
    named = {init_args.get(key) for key in ("loss", "objective")}  # a neural ranker's two spellings of one setting
    for key in ("loss", "objective"):
        value = recorded.get(key) if isinstance(recorded, dict) else None
        if isinstance(value, str) and is_custom(value) and value not in named:
            raise ValueError(f"{ckpt_path}: the checkpoint records the custom {key} {value!r} (text, never imported "
                             f"from a file); name it in the config or command you run "
                             f"(--model.init_args.{key}={value}) to use it, or train from scratch")


def new_folder(path: str | None) -> str | None:
    """The top-most folder of ``path`` that does not exist yet (``lightning_logs`` of
    ``lightning_logs/version_0`` in a fresh folder), or None when ``path`` exists."""
    top = None
    while path and not os.path.exists(path):
        top, path = path, os.path.dirname(path)
    return top


def remove_if_no_checkpoint(folder: str) -> bool:
    """Remove ``folder`` (a failed run's log folder) unless a ``.ckpt`` file lies anywhere in it;
    returns whether it did."""
    import shutil

    if not os.path.isdir(folder):
        return False
    for _, _, files in os.walk(folder):
        if any(name.endswith(".ckpt") for name in files):
            return False
    shutil.rmtree(folder, ignore_errors=True)
    return True


def best_checkpoint(cli) -> tuple[pl.LightningModule, str]:
    """(the model of a fitted ``cli`` as its ``ModelCheckpoint`` kept it -- the best epoch or tree --
    reloaded on the CPU in eval mode, the checkpoint's path); without a checkpoint, the model as
    fitted and "" (``rankkit compare`` tests it, ``rankkit tune --confirm`` scores its vali split)."""
    callback = cli.trainer.checkpoint_callback
    path = callback.best_model_path if callback is not None else ""
    model = type(cli.model).load_from_checkpoint(path, map_location="cpu", weights_only=True) if path else cli.model
    return model.to("cpu").eval(), path


def lightning_cli(args: list[str] | None, *, run: bool = True, verbose: bool = True, progress: bool = False):
    """Build rankkit's LightningCLI on ``args`` (with a subcommand of :data:`LIGHTNING_COMMANDS`
    when ``run``); ``args`` None reads ``sys.argv``.

    ``verbose=False`` (``rankkit fit`` without ``--verbose``) is quiet: no Lightning progress bar, no
    model summary, no Lightning tips, banners or info lines, no warnings raised inside
    Lightning or torch (rankkit's own warnings still show); ``fit`` ends with one line naming
    the checkpoint it kept; ``progress`` adds rankkit's own progress (a one-line bar in a terminal,
    a line every 10 epochs in a log: :class:`rankkit.infra.progress.FitProgress`). Options given in the
    config or on the command line (``--trainer.enable_progress_bar=true``) still win."""
    for path in MODEL_CLASSES.values():  # imported so `--model=LambdaRank` resolves
        resolve_model_class(path)
    _yaml.install()
    if args is not None:
        args = resolve_config_args(list(args))
    argv = sys.argv[1:] if args is None else args
    parser_kwargs: dict[str, Any] = {"exit_on_error": False, **PARSER_SETTINGS}  # errors raise: one line
    if run:
        parser_kwargs.update({name: {"exit_on_error": False, "description": text, **PARSER_SETTINGS}
                              for name, text in descriptions().items()})
    trainer_defaults = {} if verbose else {"enable_progress_bar": False, "enable_model_summary": False}
    if argv and argv[0] in ("validate", "test"):  # scoring leaves no lightning_logs/version_N (--trainer.logger=true)
        trainer_defaults["logger"] = False
    if progress and not verbose:  # a quiet fit still shows its progress (rankkit.infra.progress), unless --quiet
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
                              run=run, save_config_callback=SaveConfig,
                              save_config_kwargs={"overwrite": True, "config_files": config_paths(argv)},
                              trainer_defaults=trainer_defaults, parser_kwargs=parser_kwargs,
                              argv=argv, quiet=not verbose)
        except OSError as e:
            if e.filename is not None or e.errno is None or type(e) is not OSError:
                raise
            # Lightning's checkpoint and log writers (fsspec) drop the path from ENOSPC / EFBIG.
            raise OSError(e.errno, f"{e.strerror or os.strerror(e.errno)} (while writing the run's checkpoints "
                                   f"or logs; --trainer.default_root_dir chooses where)") from e
