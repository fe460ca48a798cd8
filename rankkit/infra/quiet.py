"""Quiet by default: the Lightning and torch messages rankkit's own code paths would cause.

rankkit never installs a warnings filter at import (that would change the user's whole
process). Instead:

- rankkit removes the causes it owns (``LambdaMARTModule`` steps a no-op optimizer of its own
  instead of returning None from ``configure_optimizers``);
- for the three messages a fit of a rankkit module raises that the user cannot act on, the
  module's ``setup`` hook adds a narrow filter and its ``teardown`` (or the datamodule's
  ``on_exception``) takes it out again (:func:`hold` / :func:`release`): Lightning's
  "The number of training batches (n) is smaller than the logging interval" (rankkit's modules
  log every training metric ``on_epoch`` too, so no epoch goes unlogged; a LambdaMART epoch is
  one boosting round, always one batch); "You have overridden `on_before_batch_transfer` in
  `LightningModule` but have passed in a `LightningDataModule`" (the neural rankers map each
  batch's displayed positions there, and a datamodule is how they are meant to be fitted);
  and Lightning 2.6's own ``LeafSpec`` FutureWarning under torch >= 2.10 (raised by
  Lightning's ``CombinedLoader`` for any DataLoader; the datamodule hides this one alone, for
  any module);
- the ``LambdaMART`` estimator builds no Trainer and raises nothing (its ``verbose`` is a
  progress bar); ``rankkit.compare`` wraps its internal Trainers in its own quiet scope.

A Trainer the user builds keeps its settings: its banners, tips and model summary are the
user's to switch off (``enable_model_summary=False``, ``logger=False``).

``RANKKIT_VERBOSE=1`` in the environment (or ``verbose=True`` where a function takes it) lets
every message through.
"""
from __future__ import annotations

import contextlib
import os
import warnings
from typing import Iterator

#: (message regex, category name, module regex, whether only a rankkit module's fit hides it)
#: of each message a rankkit fit hides; the datamodule hides the others for any module.
FIT_NOISE: tuple[tuple[str, str, str, bool], ...] = (
    (r"The number of training batches \(\d+\) is smaller than the logging interval",
     "PossibleUserWarning", r"pytorch_lightning|lightning\.pytorch", True),
    (r"You have overridden `on_before_batch_transfer` in `LightningModule` but have passed in a "
     r"`LightningDataModule`", "UserWarning", r"pytorch_lightning|lightning", True),
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", "FutureWarning", r"pytorch_lightning|lightning", False),
)


_LOUD = 0  # > 0 inside verbose_scope()


def verbose(flag: bool | None = None) -> bool:
    """``flag`` when given, else True inside :func:`verbose_scope`, else whether
    ``RANKKIT_VERBOSE`` is set to something other than ``""``, ``0``, ``false``, ``no`` or
    ``off``."""
    if flag is not None:
        return bool(flag)
    if _LOUD:
        return True
    return os.environ.get("RANKKIT_VERBOSE", "").strip().lower() not in ("", "0", "false", "no", "off")


@contextlib.contextmanager
def verbose_scope() -> Iterator[None]:
    """Everything through while inside (``rankkit fit --verbose``, ``compare(verbose=True)``)."""
    global _LOUD
    _LOUD += 1
    try:
        yield
    finally:
        _LOUD -= 1


def _category(name: str) -> type[Warning]:
    if name == "UserWarning":
        return UserWarning
    if name == "PossibleUserWarning":
        try:
            from pytorch_lightning.utilities.warnings import PossibleUserWarning
        except ImportError:  # pragma: no cover - Lightning is a dependency
            return UserWarning
        return PossibleUserWarning
    return FutureWarning


def hold(owner: object, *, module: bool = True) -> None:
    """Hide :data:`FIT_NOISE` until :func:`release` (``owner``'s setup hook; nothing when
    verbose). Calling it again first releases what ``owner`` held. ``module=False`` (the
    datamodule, which any module may be fitted with) leaves the messages only a rankkit
    module's fit hides alone: a user's own module may log ``on_step`` only or override
    ``on_before_batch_transfer``, and then the hint is meant for them."""
    release(owner)
    if verbose():
        return
    added = []
    for message, category, where, module_only in FIT_NOISE:
        if module_only and not module:
            continue
        warnings.filterwarnings("ignore", message=message, category=_category(category), module=where)
        added.append(warnings.filters[0])
    owner.__dict__["_rankkit_quiet"] = added


def release(owner: object) -> None:
    """Take out the filters ``owner`` added in :func:`hold` (its teardown / on_exception hook);
    filters anybody else added stay."""
    added = owner.__dict__.pop("_rankkit_quiet", None)
    if not added:
        return
    for entry in added:
        if entry in warnings.filters:
            warnings.filters.remove(entry)
    mutated = getattr(warnings, "_filters_mutated", None)  # drops the once/default caches
    if mutated is not None:
        mutated()
