"""Hyper-parameters declared once: a dataclass field with its default, range and docstring, from
which every front end derives its ``__init__`` and its documentation.

A declaration is a dataclass whose fields are made by :func:`hyperparameter`. :func:`make_init`
turns a list of them into an ``__init__`` with a real signature (what scikit-learn's
``get_params``, Lightning's ``save_hyperparameters`` and LightningCLI's parser read), as
:mod:`dataclasses` writes one; :func:`args_section` writes the ``Args:`` section of a front
end's docstring from the same fields.

>>> from dataclasses import dataclass
>>> @dataclass
... class Config:
...     depth: int = hyperparameter(6, "levels of every tree.", check=lambda v, name: None)
>>> class Model:
...     __init__ = make_init(declared(Config), lambda self, params: vars(self).update(params), "Model")
>>> Model(depth=3).depth
3
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


def make_init(params: list[Hyperparameter], body: Callable[[Any, dict], None], qualname: str, *,
              positional: int = 0, owner: type | None = None) -> Callable:
    """``__init__(self, p_0, ..., *, p_n=default_n, ...)`` calling ``body(self, {name: value})``.

    The first ``positional`` parameters may be given by position, the rest by keyword only.
    The function carries the declared defaults and annotations, so ``inspect.signature`` (and
    whatever reads it) sees every parameter. With ``owner`` (the class, once it exists) the
    function's frame holds ``__class__`` as a method's does, so that Lightning's
    ``save_hyperparameters(frame=...)`` reads the parameters from it.
    """
    names = [p.name for p in params]
    if len(set(names)) != len(names) or not all(n.isidentifier() for n in names):
        raise ValueError(f"hyper-parameter names have to be distinct identifiers, got {names}")
    head = [f"{n}=__defaults[{n!r}]" for n in names]
    if len(names) > positional:
        head.insert(positional, "*")
    # A list or dict default is copied for each call, so that no instance shares (and mutates) it.
    copies = "".join(f"        if {p.name} is __defaults[{p.name!r}]: {p.name} = type({p.name})({p.name})\n"
                     for p in params if isinstance(p.default, (list, dict)))
    source = (f"def __factory(__class__):\n"
              f"    def __init__(self, {', '.join(head)}):\n"
              f"        __class__  # a method's cell (see above)\n"
              + copies +
              f"        __body(self, {{{', '.join(f'{n!r}: {n}' for n in names)}}})\n"
              f"    return __init__\n")
    namespace = {"__defaults": {p.name: p.default for p in params}, "__body": body}
    exec(source, namespace)  # noqa: S102 -- a signature built from the declared names, as dataclasses do
    init = namespace["__factory"](owner)
    init.__qualname__ = f"{qualname}.__init__"
    init.__module__ = owner.__module__ if owner is not None else getattr(body, "__module__", None)
    init.__annotations__ = {p.name: p.annotation for p in params}
    return init


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

