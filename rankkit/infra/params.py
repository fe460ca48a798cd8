"""Hyper-parameters declared once: a dataclass field with its default, range and docstring, from
which every front end derives its documentation and against which its signature is checked.

A declaration is a dataclass whose fields are made by :func:`hyperparameter`. Each front end
writes its ``__init__`` out, as scikit-learn's estimators do, so that a reader, an IDE and a type
checker see every parameter; tests/infra/test_params.py holds each signature to the declaration
(names, order, kinds, defaults, annotations). :func:`args_section` writes the ``Args:`` section of
a front end's docstring from the same fields.

>>> from dataclasses import dataclass
>>> @dataclass
... class Config:
...     depth: int = hyperparameter(6, "levels of every tree.", check=lambda v, name: None)
>>> print(args_section(declared(Config)), end="")
    depth: levels of every tree.
"""
from __future__ import annotations

import inspect
import typing
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Callable

#: A range check: ``check(value, name)`` raises ValueError naming ``name``.
Check = Callable[[Any, str], Any]


def hyperparameter(default, doc: str, *, check: Check | None = None, module: bool = True):
    """A dataclass field declaring one hyper-parameter.

    Args:
        default: the default value (immutable).
        doc: what it does, one Google-style paragraph (the front ends' ``Args:`` entry).
        check: its range, ``check(value, name)`` (None: checked elsewhere, with the others it
            depends on).
        module: whether the Lightning module takes it too (False: the estimator only).
    """
    metadata = {"doc": inspect.cleandoc(doc), "check": check, "module": module}
    if isinstance(default, (list, dict)):  # one fresh copy per instance
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Hyperparameter:
    """One declared hyper-parameter, as the front ends read it."""

    name: str
    default: Any
    annotation: Any
    doc: str
    check: Check | None = None
    module: bool = True


def declared(config: type) -> list[Hyperparameter]:
    """The hyper-parameters a declaration dataclass declares, in field order."""
    hints = typing.get_type_hints(config)
    out = []
    for f in fields(config):
        if "doc" not in f.metadata:
            raise TypeError(f"{config.__name__}.{f.name} is not declared by hyperparameter()")
        default = f.default if f.default is not MISSING else f.default_factory()
        out.append(Hyperparameter(f.name, default, hints[f.name], f.metadata["doc"], f.metadata["check"],
                                  f.metadata["module"]))
    return out


def check_all(config) -> None:
    """Run every declared range check of a declaration instance, in field order."""
    for f in fields(config):
        if f.metadata.get("check") is not None:
            f.metadata["check"](getattr(config, f.name), f.name)


def with_args(doc: str | None, params: list[Hyperparameter]) -> str | None:
    """``doc`` with its ``{params}`` line (8 spaces in) replaced by the ``Args:`` entries of
    ``params``; None stays None (``python -OO`` strips docstrings)."""
    return None if doc is None else doc.replace("        {params}\n", args_section(params, indent=8))


def args_section(params: list[Hyperparameter], indent: int = 4) -> str:
    """The Google-style ``Args:`` entries of ``params`` (without the header), one per parameter."""
    lines = []
    for p in params:
        first, *rest = p.doc.splitlines() or [""]
        lines.append(" " * indent + f"{p.name}: {first}")
        lines += [(" " * (indent + 4) + line) if line.strip() else "" for line in rest]
    return "\n".join(lines) + "\n"

