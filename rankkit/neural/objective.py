"""What a neural ranker minimises, built once from its hyper-parameters.

:func:`neural_objective` checks the objective settings of :class:`rankkit.neural.NeuralRanker`
(``objective`` (``loss`` is its old spelling), ``weighting``, ``sigma``, ``k``, ``normalize``,
``reduction``, ``loss_options``) and builds a :class:`NeuralObjective`: one frozen value,
:class:`rankkit.objective.ObjectiveSpec` (the booster holds the same kind), and the call that
turns a batch's scores into the training loss (the shared lambda kernel through
:func:`rankkit.neural.loss.lambda_loss`, or a custom loss by plain autograd). The module adds
only the debiasing (pair weights, position models) around it.
"""
from __future__ import annotations

import copy
import dataclasses
import inspect
import warnings
from typing import Any

import torch

from rankkit.custom import GradientObjective, RecordedName, check_spec, fresh, is_custom, qualified_name, torch_loss
from rankkit.data.dataset import PaddedBatch
from rankkit.infra import checks as _checks
from rankkit.lambdas import lambda_gradients
from rankkit.lambdas.plan import shared_plan_of
from rankkit.losses import LISTWISE, OBJECTIVES
from rankkit.neural.config import KERNEL_OPTIONS
from rankkit.neural.loss import LambdaLoss, _denominator, lambda_loss
from rankkit.objective import ObjectiveSpec, objective_spec

#: Objective arguments a ``loss_options`` dict may not set: the batch and what the module supplies
#: itself (the per-document weights, a query plan, the seeded generator of XE-NDCG and ListMLE,
#: the unbiased pair weights).
LOSS_OPTIONS_RESERVED = ("mask", "weights", "plan", "generator", "weighting", "return_loss", "groups",
                         "pair_weights")
#: The pairwise kernel's settings that are hyper-parameters of the module itself.
PAIRWISE_OWN = ("sigma", "k", "normalize")


_LOSS_WARNED = [False]


def objective_alias(params: dict) -> dict:
    """``params`` with ``objective`` and ``loss`` both set to the one objective given: ``loss=``
    is the old spelling (a FutureWarning, once per process); both given and different is refused."""
    objective, loss = params.get("objective"), params.get("loss")
    if objective is not None and loss is not None and objective is not loss and \
            qualified_name(objective) != qualified_name(loss):
        raise ValueError(f"`loss` is the old spelling of `objective`: give one, got objective={objective!r} and "
                         f"loss={loss!r}")
    if loss is not None and objective is None and not _LOSS_WARNED[0]:
        _LOSS_WARNED[0] = True
        warnings.warn("`loss=` is now `objective=`, as LambdaMART spells it; `loss` will be removed in a later "
                      "release", FutureWarning, stacklevel=4)
    chosen = objective if objective is not None else loss
    return {**params, "objective": chosen, "loss": chosen}


def spelling(params: dict) -> str:
    """How the user named the objective: ``"loss"`` when only the old spelling was given."""
    return "loss" if params.get("objective") is None and params.get("loss") is not None else "objective"


def check_loss_options(options, name: str) -> dict[str, Any]:
    """``options`` (None or a dict of plain values) checked against the objective ``name`` of
    :data:`rankkit.losses.OBJECTIVES`: every key one of its keyword arguments, every value
    accepted by it (it is called once on a two-document query). Returns a copy; ValueError naming
    the first bad key otherwise."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise ValueError(f"`loss_options` has to be a dict of the objective's options, got {_checks.describe(options)}")
    pairwise = name not in LISTWISE
    target = lambda_gradients if pairwise else OBJECTIVES[name]
    takes = {p.name for p in inspect.signature(target).parameters.values() if p.kind is p.KEYWORD_ONLY}
    if name == "ndcg_loss2pp":
        takes.add("mu")
    allowed = sorted(takes - set(LOSS_OPTIONS_RESERVED) - (set(PAIRWISE_OWN) if pairwise else set()))
    for key, value in options.items():
        if pairwise and key in PAIRWISE_OWN:
            raise ValueError(f"`loss_options`: {key!r} of the pairwise objective {name!r} is the module's own "
                             f"hyper-parameter: set `{key}=` instead")
        if key not in allowed:
            raise ValueError(f"`loss_options`: {key!r} is not an option of the objective {name!r}; it takes "
                             f"{allowed}")
        if not (value is None or isinstance(value, (bool, int, float, str))):
            raise ValueError(f"`loss_options`: {key!r} has to be a plain value (a number, string, bool or "
                             f"null), got {_checks.describe(value)}")
    probe = torch.tensor([[0.5, -0.5]], dtype=torch.float64, device="cpu")  # cpu: also under a meta device
    try:
        OBJECTIVES[name](probe, torch.tensor([[1.0, 0.0]], dtype=torch.float64, device="cpu"), **options)
    except (ValueError, TypeError) as e:
        raise ValueError(f"`loss_options` {options!r} of the objective {name!r}: {e}") from None
    return dict(options)


def check_objective(weighting, loss, custom: bool, unbiased, loss_options, *, choices: tuple[str, ...],
                    default_weighting: str, name: str = "objective") -> None:
    """``weighting`` one of ``choices`` (the class's), and ``loss`` (when given) a known or custom
    objective that replaces it (``weighting`` left at the class's ``default_weighting``); errors
    name the argument as the user spelt it, ``name`` (``"objective"``, or the old ``"loss"``)."""
    _checks.check_choice(weighting, choices, "weighting")
    if loss is None:
        return
    if custom:
        check_spec(loss, name, tuple(OBJECTIVES))
        if unbiased or loss_options:
            raise ValueError(f"`{'unbiased' if unbiased else 'loss_options'}` applies to the built-in "
                             f"objectives; a custom loss takes its options itself")
    else:
        _checks.check_choice(loss, tuple(OBJECTIVES), name)
    if weighting != default_weighting:  # the objective replaces `weighting`: say so rather than drop it
        raise ValueError(f"`weighting` is not used when `{name}` is given ({name}={loss!r} has its own "
                         f"weighting); leave weighting at {default_weighting!r}, got {weighting!r}")


class NeuralObjective:
    """The training loss of a batch: the objective ``spec.name`` (``spec.objective`` when given,
    else ``spec.weighting``'s lambda loss), with optional per-pair weights (the click debiasing's).

    Args:
        spec: the checked settings.
        custom_loss: the custom loss itself (a callable, or a name recorded by a checkpoint), or
            None to import ``spec.objective`` by name on the first batch.
    """

    def __init__(self, spec: ObjectiveSpec, custom_loss=None):
        self.spec = spec
        self.custom_loss = custom_loss
        self._wrapped = None  # the custom loss, imported and wrapped on the first batch
        self._generator: torch.Generator | None = None  # XE-NDCG's γ, ListMLE's ties

    def __call__(self, scores: torch.Tensor, batch: PaddedBatch, pair_weights=None) -> torch.Tensor:
        s = self.spec
        if s.custom:
            return self._custom(scores, batch)
        debias = {} if pair_weights is None else {"pair_weights": pair_weights}
        options = dict(sigma=s.sigma, k=s.k, normalize=s.normalize) if s.pairwise else {}
        if s.name in ("xendcg", "listmle"):  # XE-NDCG's γ, ListMLE's order among equal labels
            if self._generator is None:  # seeded by seed_everything
                self._generator = torch.Generator().manual_seed(int(torch.initial_seed()) % 2**63)
            options["generator"] = self._generator
        if "max_err_label" not in s.options:  # (which the planned kernel would not check the labels against)
            plan = shared_plan_of(batch.labels, batch.mask, scores, pair_weights)
            if plan is not None:
                options["plan"] = plan
        return lambda_loss(scores, batch.labels, mask=batch.mask, loss=s.name, reduction=s.reduction, **options,
                           **dict(s.options), **debias)

    def _custom(self, scores: torch.Tensor, batch: PaddedBatch) -> torch.Tensor:
        """A custom loss by plain autograd: Σ of its per-query losses over ``reduction``'s
        denominator (the built-in loss's normalisation). Imported (a config's
        ``package.module.function``) and checked for padding on the first batch."""
        if self._wrapped is None:
            self._wrapped = fresh(torch_loss(self.custom_loss if self.custom_loss is not None else self.spec.objective,
                                             "loss"))
        loss, mask, reduction = self._wrapped, batch.mask, self.spec.reduction
        if isinstance(loss, GradientObjective):  # a closed form: its gradient injected, as the built-ins'
            return LambdaLoss.apply(scores, batch.labels, mask, dict(objective=loss, reduction=reduction))
        loss.check(scores.detach(), batch.labels, mask)
        total = loss.total(scores.masked_fill(~mask, 0.0), batch.labels.to(scores.dtype).masked_fill(~mask, 0.0), mask)
        if not bool(torch.isfinite(total)):
            raise ValueError(f"the loss {self.spec.objective} is not finite on this batch ({float(total)})")
        return total / _denominator(batch.labels, mask, reduction).to(total.dtype)


def check_objective_settings(o, *, choices: tuple[str, ...], default_weighting: str, name: str = "objective") -> bool:
    """:func:`check_objective` of ``o``'s settings, and a custom loss refusing the built-in
    kernel's options (they would be dropped silently, as LambdaMART refuses them); returns
    whether the objective is custom. The module runs it before its range checks, and
    :func:`neural_objective` again (it is cheap and pure)."""
    custom = o.loss is not None and is_custom(o.loss)
    check_objective(o.weighting, o.loss, custom, o.unbiased, o.loss_options, choices=choices,
                    default_weighting=default_weighting, name=name)
    if custom:
        for option in KERNEL_OPTIONS:
            if getattr(o, option) != getattr(type(o), option):
                raise ValueError(f"`{option}` configures the built-in lambda kernel; a custom loss takes its own "
                                 f"(set it in the loss), got {option}={getattr(o, option)!r}")
    return custom


def neural_objective(o, *, choices: tuple[str, ...], default_weighting: str, name: str = "objective"
                     ) -> NeuralObjective:
    """The objective of a :class:`rankkit.neural.config.NeuralConfig` ``o`` (``objective`` and
    ``loss`` already one value), checked; ``choices`` and ``default_weighting`` are the class's,
    ``name`` the spelling the user gave (:func:`spelling`)."""
    custom = check_objective_settings(o, choices=choices, default_weighting=default_weighting, name=name)
    spec = objective_spec(o.loss, weighting=o.weighting, sigma=o.sigma, k=o.k, normalize=o.normalize,
                          reduction=o.reduction)
    if not custom:  # the options of what the kernel computes: `objective`, else `weighting`
        spec = dataclasses.replace(spec, options=tuple(sorted(check_loss_options(o.loss_options, spec.name).items())))
    # A loss read from a checkpoint (RecordedName) is kept as such: training refuses to import it.
    kept = custom and (not isinstance(o.loss, str) or isinstance(o.loss, RecordedName))
    return NeuralObjective(spec, o.loss if kept else None)


def record_objective(module, spec: ObjectiveSpec) -> None:
    """After Lightning's ``save_hyperparameters``: the hyper-parameters (and the loggers' copy)
    hold the objective as ``spec.objective`` under both names (a checkpoint loads either way), a
    custom loss by its qualified name as text (a checkpoint holds no code; loading one never
    imports it); ``hidden`` and ``loss_options`` are the module's own copies, not the signature's
    default list, which every call shares."""
    for key in ("hidden", "loss_options"):
        module.hparams[key] = copy.deepcopy(module.hparams[key])
    for key in ("objective", "loss"):
        module.hparams[key] = module._hparams_initial[key] = spec.objective
