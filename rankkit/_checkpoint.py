"""Which rankkit LightningModule a checkpoint holds: recorded when saved, read when loaded.

Every rankkit LightningModule writes its class path into the checkpoint
(:func:`record_class`); :func:`load_checkpoint` reads it back and loads that class, and only
rankkit's own trainable classes: a checkpoint never names code to import, and it is read with
``weights_only=True``, so it never unpickles anything.
"""
from __future__ import annotations

import importlib
import os

CLASS_KEY = "rankkit_class"

# The classes a checkpoint may name (their import paths; loaded on demand).
TRAINABLE = ("rankkit.neural.module.RankNet", "rankkit.neural.module.LambdaRank",
             "rankkit.neural.module.NeuralRanker", "rankkit.boosting.module.LambdaMARTModule")


def class_path(obj) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def record_class(checkpoint: dict, module) -> None:
    """Store the module's class path in ``checkpoint`` (an ``on_save_checkpoint`` hook's dict)."""
    checkpoint[CLASS_KEY] = class_path(module)


def _import(path: str):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def read_checkpoint(path: str | os.PathLike) -> dict:
    """The checkpoint's dict, read with ``weights_only=True`` (never unpickling code).

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: the file is not a readable checkpoint (naming the file).
    """
    import torch

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such checkpoint: {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the user's mistake here
        raise ValueError(f"{path}: not a readable Lightning checkpoint (truncated or corrupt?): "
                         f"{type(e).__name__}") from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise ValueError(f"{path}: not a Lightning checkpoint (no state_dict)")
    return ckpt


def load_checkpoint(path: str | os.PathLike):
    """The LightningModule in a rankkit checkpoint, in eval mode on the CPU.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: the file is not a readable checkpoint, or it does not name a rankkit model.
    """
    path = os.fspath(path)
    ckpt = read_checkpoint(path)
    name = ckpt.get(CLASS_KEY)
    if name not in TRAINABLE:
        raise ValueError(f"{path}: not a rankkit model checkpoint (it names no rankkit model class"
                         f"{'' if name is None else ': ' + repr(name)})")
    try:
        return _import(name).load_from_checkpoint(path, map_location="cpu", weights_only=True).eval()
    except (KeyError, RuntimeError, TypeError) as e:
        raise ValueError(f"{path}: the checkpoint does not match {name}: {type(e).__name__}: {e}") from None
