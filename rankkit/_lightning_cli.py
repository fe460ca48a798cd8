"""rankkit's LightningCLI: how ``rankkit fit|validate|test|predict`` and ``rankkit compare``
configure a model from its YAML, in one place (imported by both, so neither imports the other).

Configs are package data (``rankkit/configs/*.yaml``): ``--config lambdarank`` names one, a path
still works. ``n_features`` flows from the datamodule into the model by ``link_arguments``.
"""
from __future__ import annotations

import importlib
import os
import warnings
from pathlib import Path
from typing import Any

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
MODEL_CLASSES = {
    "RankNet": "rankkit.neural.module.RankNet",
    "LambdaRank": "rankkit.neural.module.LambdaRank",
    "LambdaMARTModule": "rankkit.boosting.module.LambdaMARTModule",
}


def config_names() -> list[str]:
    """The configs shipped with rankkit, by name (``lambdarank`` for ``configs/lambdarank.yaml``)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def resolve_config_arg(value: str) -> str:
    """``--config NAME`` -> the packaged ``configs/NAME.yaml``; a path is returned as it is."""
    if value.endswith((".yaml", ".yml")) or os.sep in value or "/" in value:
        return value
    path = CONFIG_DIR / f"{value}.yaml"
    if not path.is_file():
        raise ValueError(f"`--config`: no packaged config {value!r} (choose from {config_names()} or "
                         f"give a .yaml path)")
    return str(path)


def resolve_config_args(argv: list[str]) -> list[str]:
    """``argv`` with every ``--config NAME`` turned into the packaged file's path (and every YAML
    that jsonargparse will load limited in size and aliases: :mod:`rankkit._yaml`)."""
    from rankkit import _yaml

    _yaml.install()
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a == "--config" and i + 1 < len(argv):
            out += [a, resolve_config_arg(argv[i + 1])]
            i += 2
            continue
        if a.startswith("--config="):
            a = "--config=" + resolve_config_arg(a.split("=", 1)[1])
        out.append(a)
        i += 1
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


def check_run_config(config) -> None:
    """The parsed config of ``rankkit fit|validate|test`` (``--ckpt_path X``, ``--ckpt_path=X``
    and ``ckpt_path:`` in a YAML file all arrive here): a checkpoint to resume or evaluate has to
    be a local, readable Lightning checkpoint, and Lightning reads it with ``weights_only=True``
    whatever the config says (so nothing in it is unpickled)."""
    from rankkit._checkpoint import check_checkpoint

    ckpt_path = config.get("ckpt_path")
    if ckpt_path is not None:  # refuses URLs, unreadable files, classes, sizes: now, in one line
        check_checkpoint(ckpt_path, need_scorer=False)
    if "weights_only" in config:
        config["weights_only"] = True


def lightning_cli(args: list[str] | None, *, run: bool = True):
    """Build rankkit's LightningCLI on ``args`` (with a subcommand of :data:`LIGHTNING_COMMANDS`
    when ``run``); ``args`` None reads ``sys.argv``."""
    import pytorch_lightning as pl
    from pytorch_lightning.cli import LightningCLI

    from rankkit.data.datamodule import RankingDataModule

    for path in MODEL_CLASSES.values():  # imported so `--model=LambdaRank` resolves
        resolve_model_class(path)

    class RankkitCLI(LightningCLI):
        def add_arguments_to_parser(self, parser) -> None:
            parser.link_arguments("data.n_features", "model.init_args.n_features", apply_on="instantiate")

        def _parse_ckpt_path(self) -> None:
            # LightningCLI reads `ckpt_path`'s hyper-parameters (and `_class_path`) into the
            # model's config: checked first, as `load_checkpoint` checks them.
            if self.config.get("subcommand"):
                check_run_config(self.config[self.config.subcommand])
            super()._parse_ckpt_path()

        @staticmethod
        def subcommands() -> dict[str, set[str]]:
            # `rankkit predict` is rankkit's own command (any artefact, any input file).
            return {k: v for k, v in LightningCLI.subcommands().items() if k in LIGHTNING_COMMANDS}

    parser_kwargs: dict[str, Any] = {"exit_on_error": False}  # errors raise: main prints one line
    if run:
        parser_kwargs.update({name: {"exit_on_error": False} for name in LIGHTNING_COMMANDS})
    from rankkit import _yaml

    _yaml.install()
    if args is not None:
        args = resolve_config_args(list(args))
    with warnings.catch_warnings():
        # LightningCLI warns whenever `args` is given while sys.argv holds anything (pytest, compare).
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
        return RankkitCLI(pl.LightningModule, RankingDataModule, subclass_mode_model=True, args=args, run=run,
                          save_config_kwargs={"overwrite": True}, parser_kwargs=parser_kwargs)
