"""What a ranker minimises, as one frozen value both model families hold.

:func:`objective_spec` is the one factory: LambdaMART's ``objective`` (``"lambdarank"``, a name
of :data:`rankkit.losses.OBJECTIVES`, ``"pointwise"`` or a custom loss) and the neural rankers'
(None, a name, or a custom loss) with the kernel's options become an :class:`ObjectiveSpec`. The
booster turns it into gradients (:func:`rankkit.boosting.objectives.make_objective`), the neural
rankers into a batch's loss (:class:`rankkit.neural.objective.NeuralObjective`); each family
checks its own hyper-parameters first (their ranges and combination rules) and builds the spec
after. "``lambdarank`` (or no objective) means the lambda loss of ``weighting``" is written once,
here: :attr:`ObjectiveSpec.name`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rankkit.custom import is_custom, qualified_name
from rankkit.losses import LISTWISE
from rankkit.losses import OBJECTIVES as LOSSES

#: The objectives that mean "the lambda loss of ``weighting``": LambdaMART's default, and the
#: neural rankers' (no objective given).
WEIGHTED = (None, "lambdarank")
#: Every built-in objective name: ``"lambdarank"`` (with ``weighting``), ``"pointwise"`` and every
#: name of :data:`rankkit.losses.OBJECTIVES`.
NAMES = ("lambdarank", "pointwise", *LOSSES)


@dataclass(frozen=True)
class ObjectiveSpec:
    """An objective and its options, checked.

    Attributes:
        objective: as given: None or ``"lambdarank"`` (the lambda loss of ``weighting``), a name
            of :data:`rankkit.losses.OBJECTIVES` that replaces it, ``"pointwise"`` (the booster's
            squared error), or the qualified name of a custom loss (text: what checkpoints and
            model files record).
        weighting: the |ΔZ| of the lambda loss (a name of :data:`rankkit.lambdas.WEIGHTINGS`).
        sigma, k, normalize, gain: the pairwise lambda kernel's options.
        reduction: how a batch's per-query losses are combined (the neural rankers).
        hessian: the diagonal Hessian of a custom loss on the booster (``"exact"``,
            ``"gauss-newton"``, ``"constant"``).
        options: a built-in objective's further options (``loss_options``) as sorted
            (key, value) pairs.
        custom: whether ``objective`` is a custom loss (trained by autograd, or its own gradients).
    """

    objective: str | None = None
    weighting: str = "ndcg"
    sigma: float = 1.0
    k: int | None = None
    normalize: bool = False
    gain: str = "exp"
    reduction: str = "query"
    hessian: str = "exact"
    options: tuple[tuple[str, Any], ...] = ()
    custom: bool = False

    @property
    def name(self) -> str:
        """What the kernel computes: ``weighting`` for :data:`WEIGHTED`, else ``objective``."""
        return self.weighting if self.objective in WEIGHTED else self.objective  # type: ignore[return-value]

    @property
    def pairwise(self) -> bool:
        """Whether the shared pairwise lambda kernel computes it (and reads ``sigma``, ``k``,
        ``normalize``, ``gain``)."""
        return not self.custom and self.name != "pointwise" and self.name not in LISTWISE

    @property
    def click_weighting(self) -> str:
        """The pair weighting a click-bias estimator (:class:`rankkit.clicks.propensity.PropensityEstimator`)
        uses for this objective: RankNet's |ΔZ| = 1 for ``"ranknet"``, |ΔNDCG| for the others."""
        return "ranknet" if self.name == "ranknet" else "ndcg"

    def kernel_options(self) -> dict[str, Any]:
        """The pairwise kernel's keyword options (none for the other objectives)."""
        return dict(k=self.k, sigma=self.sigma, gain=self.gain, normalize=self.normalize) if self.pairwise else {}


def objective_spec(objective=None, *, weighting: str = "ndcg", sigma: float = 1.0, k: int | None = None,
                   normalize: bool = False, gain: str = "exp", reduction: str = "query", hessian: str = "exact",
                   options: dict[str, Any] | None = None) -> ObjectiveSpec:
    """The :class:`ObjectiveSpec` of ``objective`` with these options: a custom loss (a callable,
    a :mod:`rankkit.custom` wrapper or ``package.module.function``) is recorded by its qualified
    name; a built-in one must name a known objective (ValueError naming ``weighting`` or
    ``objective`` otherwise: the model classes check their own choices first, with their own
    wording)."""
    custom = objective is not None and is_custom(objective)
    spec = ObjectiveSpec(qualified_name(objective) if custom else objective, weighting, sigma, k, normalize, gain,
                         reduction, hessian, tuple(sorted((options or {}).items())), custom)
    if not custom and objective != "pointwise":
        name = spec.name
        if not isinstance(name, str) or name not in LOSSES:  # a list or dict is unhashable: one line too
            if objective in WEIGHTED:
                raise ValueError(f"`weighting` has to be one of {tuple(LOSSES)}, got {weighting!r}")
            raise ValueError(f"`objective` has to be one of {NAMES}, got {objective!r}")
    return spec
