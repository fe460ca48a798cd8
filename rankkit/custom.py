"""Custom ranking objectives: any differentiable PyTorch loss trains trees and neural rankers.

A custom objective is written once, as plain torch code over padded queries::

    def my_loss(scores, labels, mask):      # [Q, L] float, [Q, L], [Q, L] bool
        ...                                 # differentiable in `scores`
        return per_query_loss               # [Q] (or a scalar: their sum)

and trains ``LambdaMART(objective=my_loss)`` (gradients by autograd, the Newton leaves from the
exact diagonal of the Hessian) as well as ``RankNet(objective=my_loss)`` / ``LambdaRank(objective=my_loss)``
(plain autograd). Padding (``mask`` False) must not change the loss: rankkit checks that on the
first call and raises a ``ValueError`` if it does. Queries must not interact (the loss of a query
reads only its own row): the Hessian's diagonal is computed for many queries at once on that
assumption.

The Hessian (``hessian=``, for the trees):

* ``"exact"`` (default): the diagonal of ∂²(Σ loss)/∂s², one Hessian-vector product H e_j per
  position j of a query, each e_j one-hot at position j of every query at once, batched as
  reverse-over-reverse products: ``torch.func.vmap`` over ``torch.autograd.grad`` of the
  gradient's graph (on MQ2008 2-3x faster than ``torch.func``'s forward-over-reverse
  ``jvp(grad)``, and 15-25 % faster than autograd's own ``is_grads_batched``, whose older vmap
  has no batching rule for ``masked_fill`` or the softmax's backward and runs them one tangent
  at a time; the same numbers). Queries are grouped by length, each group padded to its longest
  query; the groups are chosen once per fit to spend the least (a chunk's and a product's fixed
  cost, :data:`CHUNK_COST`, against the work the padding adds). A chunk holds as many of a
  group's queries as keep the loss's largest intermediate tensor (measured once per width)
  within ``workspace`` entries, and a batched product as many tangents as keep it there too.
  A loss that cannot be batched (``vmap``: ``.item()`` or numpy in a custom backward) falls
  back to one product per position (slower, same numbers). The cost is L backward passes of the
  loss per query: about the loss's own cost for a listwise O(L) loss, L times it for a pairwise
  O(L²) loss (docs/benchmarks.md, "custom_speed"; declare a pairwise loss with :func:`pairwise`).
* ``"gauss-newton"``: for a loss given as Bernoulli or categorical log-likelihoods
  (:class:`ProbabilityLoss`): the generalised Gauss–Newton diagonal Σ_k w_k p_k (1 − p_k)
  (∂z_k/∂s_i)² of logits z (Schraudolph, "Fast Curvature Matrix-Vector Products for
  Second-Order Gradient Descent", Neural Computation 2002), which is never negative and, for
  logits linear in the scores (RankNet's s_i − s_j), equals the exact diagonal.
* ``"constant"``: every real document's hessian is 1 (first-order boosting: a leaf moves by
  −η Σg / (n + λ)).

A diagonal entry that is negative or not finite is replaced by a positive surrogate, as the
built-in listwise losses do where their exact diagonal has no sign (``approx_ndcg_loss`` takes
an upper bound, ``neural_ndcg_loss`` |grad| / τ): here its absolute value where it is finite and
the largest finite |h| of its query (or its |grad| if there is none) where it is not. A
non-finite gradient is an error naming the query (and, in the booster, the round).

rankkit's own closed form, ``fn(scores, labels, *, mask, weights, ...) -> (grad, hess, loss)`` (every
function of :data:`rankkit.losses.OBJECTIVES`, e.g. ``softmax_loss``), is taken as it is
(:class:`GradientObjective`, recognised by its keyword-only ``mask``).

The migration path: a LightGBM/XGBoost scikit-learn style callable
``objective(y_true, y_pred[, weight][, group]) -> (grad, hess)`` on flat numpy arrays runs
unchanged (:class:`NumpyObjective`). It is recognised by its first two parameters being named
``y_true`` and ``y_pred`` (LightGBM's and XGBoost's names), or wrapped explicitly.
"""
from __future__ import annotations

import importlib
import inspect
import math
import os
import re
import sys
from typing import Callable, NamedTuple

import torch

from rankkit.infra import checks as _checks
from rankkit.infra.checkpoint import RecordedName

__all__ = ["TorchLoss", "ProbabilityLoss", "PairwiseLoss", "pairwise", "GradientObjective", "NumpyObjective",
           "as_objective", "qualified_name", "HESSIANS", "is_custom"]

HESSIANS = ("exact", "gauss-newton", "constant")
#: Entries of the loss's largest intermediate tensor per batched evaluation (the queries of a
#: chunk, times its tangents in a product): bounds the memory of the exact Hessian's products.
#: 2^18 is 1/16 of the built-in listwise losses' ``workspace`` (2^22), chosen because the
#: products' temporaries then stay in cache (MQ2008 Fold1, one thread: a pairwise loss's
#: gradients 0.7 s vs 1.1 s at 2^22).
WORKSPACE = 2**18
#: Entries a batched product aims at, within ``workspace``: a listwise loss's [tangents, q, W]
#: products of 2^17 float64 entries (1 MiB) run from cache (MQ2008 Fold1, one thread,
#: 2026-11-28: rounds of a listwise softmax 1.84x the built-in's at 2^17 against 2.0-2.1x at
#: 2^16 and 2^18). A product holds at least one tangent of a chunk's queries, so a pairwise
#: loss's [q, W, W] products stay as large as ``workspace`` allows (faster for it).
PRODUCT_ENTRIES = 2**17
#: A chunk's (and a batched product's) fixed cost in the length groups' plan, in units of their
#: work (queries x tangents x the loss's largest intermediate per query): on MQ2008 Fold1 at one
#: thread a product of a listwise loss cost about 0.6 ms plus 22 ns a unit with autograd's own
#: batching (2026-11-28), so about 2^15 units; 2^11 to 2^17 gave the same times within noise.
CHUNK_COST = 2**15

_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")


class NonFiniteGradient(ValueError):
    """A custom objective returned a non-finite gradient (``query`` is the first bad query)."""

    def __init__(self, message: str, query: int):
        super().__init__(message)
        self.query = query


def qualified_name(fn) -> str:
    """``module.qualname`` of a callable (or of a wrapper's callable): what checkpoints and model
    files record as text instead of the code."""
    if isinstance(fn, str):
        return str(fn)  # a RecordedName too: hyper-parameters hold plain text
    if isinstance(fn, (TorchLoss, GradientObjective, NumpyObjective)):
        inner = qualified_name(fn.fn)
        plain = type(fn) is TorchLoss and fn.hessian == "exact" or type(fn) is NumpyObjective or \
            type(fn) is GradientObjective and not fn.options or type(fn) is PairwiseLoss and _is_declared(fn)
        # A wrapper with settings is recorded as a description (loads; to train again, pass it).
        return inner if plain else f"rankkit.custom.{type(fn).__name__}<{inner}>"
    module = getattr(fn, "__module__", None) or type(fn).__module__
    name = getattr(fn, "__qualname__", None)
    if name is None:  # an instance with __call__, a functools.partial: recorded as a description
        return f"{type(fn).__module__}.{type(fn).__qualname__}<instance>"
    return f"{module}.{name}"


_RECORDED = re.compile(r"^[A-Za-z_<][\w<>.]*\.[A-Za-z_<][\w<>.]*$")


def is_recorded_name(value) -> bool:
    """A custom objective's name as a model file or checkpoint records it (``module.qualname``,
    ``<locals>`` and ``<lambda>`` included): accepted when loading, imported only to train."""
    return isinstance(value, str) and len(value) <= 500 and bool(_RECORDED.match(value))


def is_dotted_path(value) -> bool:
    """A text that names an importable callable, ``package.module.function``."""
    return isinstance(value, str) and bool(_DOTTED.match(value))


def _import_module(module_name: str):
    """``importlib.import_module``, and where the module's top package is not on ``sys.path``,
    from the current folder too, as ``python -m`` finds it: the installed ``rankkit`` command
    runs without the current folder on its path, and a config naming ``mypkg.losses.fn`` is
    meant from where the command runs."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        top = module_name.partition(".")[0]
        here = os.getcwd()
        if e.name != top or here in sys.path or "" in sys.path:
            raise
        sys.path.append(here)  # after everything else: never shadows an installed module
        try:
            return importlib.import_module(module_name)
        except ImportError:
            if here in sys.path and top not in sys.modules:
                sys.path.remove(here)
            raise


def import_callable(path: str, name: str = "objective") -> Callable:
    """Import ``package.module.function`` (a config's custom objective). Called when training
    starts, never when a checkpoint or model file is loaded; never for a :class:`RecordedName`."""
    if isinstance(path, RecordedName):
        how = f"name it yourself (set_params({name}={str(path)!r})) or pass the callable" if is_dotted_path(path) \
            else "pass the objective itself"
        raise ValueError(f"`{name}`: {str(path)!r} was read from a model file, which records a custom objective "
                         f"as text only: to train again, {how}")
    if not is_dotted_path(path):
        if is_recorded_name(path):  # "<locals>", "<lambda>", a wrapper's description: text only
            raise ValueError(f"`{name}`: cannot import {path!r}: a model file or checkpoint records a custom "
                             f"objective as text only; pass the objective itself to train again")
        raise ValueError(f"`{name}` has to be a built-in name or an importable `package.module.function`, "
                         f"got {path!r}")
    module_name, _, attr = path.rpartition(".")
    try:
        target = getattr(_import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"`{name}`: cannot import {path!r} ({type(e).__name__}: {e}; looked for "
                         f"{module_name!r} on sys.path and in the current folder {os.getcwd()}); a model loaded "
                         f"from a file records its custom objective as text only: pass the callable "
                         f"itself to train again") from None
    if not callable(target) or isinstance(target, type):
        raise ValueError(f"`{name}`: {path!r} has to name a loss function, got {_checks.describe(target)}")
    return target


def is_custom(objective) -> bool:
    """True for a custom objective: anything but a text, or a text with a dot (a dotted path;
    no built-in name has one). Other texts are built-in names, checked by their callers."""
    return not isinstance(objective, str) or "." in objective


def check_spec(objective, name: str = "objective", builtins: tuple = ()) -> None:
    """Raise ValueError unless ``objective`` is a built-in name, a dotted path or a callable
    (nothing is imported)."""
    if isinstance(objective, str):
        if objective in builtins or is_recorded_name(objective):
            return
        raise ValueError(f"`{name}` has to be one of {tuple(builtins)}, an importable `package.module.function` "
                         f"or a callable loss(scores, labels, mask), got {objective!r}")
    if not callable(objective):
        raise ValueError(f"`{name}` has to be a name or a callable loss(scores, labels, mask), got "
                         f"{_checks.describe(objective)}")


def as_objective(objective, hessian: str = "exact", name: str = "objective"):
    """A custom objective as a :class:`TorchLoss`, :class:`ProbabilityLoss` or
    :class:`NumpyObjective`: a wrapper is returned as it is (its own ``hessian`` kept unless
    ``hessian`` asks for another), a dotted path is imported, and a plain callable is a
    :class:`NumpyObjective` when its first two parameters are named ``y_true`` and ``y_pred``,
    else a :class:`TorchLoss`."""
    _checks.check_choice(hessian, HESSIANS, "hessian")
    if isinstance(objective, str):
        objective = import_callable(objective, name)
    if isinstance(objective, (NumpyObjective, GradientObjective)):
        if hessian != "exact" and isinstance(objective, GradientObjective):
            raise ValueError(f"`hessian={hessian!r}` applies to torch losses; {qualified_name(objective)} returns "
                             f"its own hessian")
        return objective
    if isinstance(objective, (TorchLoss, ProbabilityLoss)):
        return objective if hessian == "exact" or hessian == objective.hessian else objective.with_hessian(hessian)
    if not callable(objective):
        raise ValueError(f"`{name}` has to be a callable, got {_checks.describe(objective)}")
    if _looks_closed_form(objective):
        if hessian != "exact":
            raise ValueError(f"`hessian={hessian!r}` applies to torch losses; {qualified_name(objective)} returns "
                             f"its own (grad, hess, loss)")
        return GradientObjective(objective)
    if _looks_numpy(objective):
        if hessian != "exact":
            raise ValueError(f"`hessian={hessian!r}` applies to torch losses; a (y_true, y_pred, ...) objective "
                             f"returns its own hessian")
        return NumpyObjective(objective)
    if hessian == "gauss-newton":
        raise ValueError("`hessian='gauss-newton'` needs the loss given as log-likelihoods of probabilities: "
                         "wrap it in rankkit.custom.ProbabilityLoss (see its docstring)")
    return TorchLoss(objective, hessian=hessian)


def _parameter_names(fn) -> list[str]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _looks_numpy(fn) -> bool:
    return _parameter_names(fn)[:2] == ["y_true", "y_pred"]


def _looks_closed_form(fn) -> bool:
    """rankkit's own objective form, ``fn(scores, labels, *, mask, ...) -> (grad, hess, loss)``: a
    keyword-only ``mask`` (a torch loss takes it positionally)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "mask" in params and params["mask"].kind is inspect.Parameter.KEYWORD_ONLY


# -- torch losses -----------------------------------------------------------------------------------
class TorchLoss:
    """A differentiable ranking loss ``fn(scores, labels, mask) -> [Q]`` (or a scalar) as an
    objective: (grad, hess, loss) by autograd.

    Args:
        fn: the loss; see the module docstring for the contract.
        hessian: ``"exact"`` or ``"constant"`` (``"gauss-newton"`` needs a :class:`ProbabilityLoss`).
        workspace: entries of a [q, L, L] block per batched evaluation of ``fn`` for the exact
            Hessian (memory: about 8 bytes each in float64, times what ``fn`` keeps per pair).

    >>> import torch.nn.functional as F
    >>> def ranknet(scores, labels, mask):
    ...     diff = scores[:, :, None] - scores[:, None, :]
    ...     pairs = (labels[:, :, None] > labels[:, None, :]) & mask[:, :, None] & mask[:, None, :]
    ...     return (F.softplus(-diff) * pairs).sum((1, 2))
    >>> g, h, c = TorchLoss(ranknet).gradients(torch.tensor([[0.0, 0.0]], dtype=torch.float64),
    ...                                        torch.tensor([[1.0, 0.0]]))
    >>> g, h  # ∓1/2, 1/4: RankNet's lambdas and Newton weights
    (tensor([[-0.5000,  0.5000]], dtype=torch.float64), tensor([[0.2500, 0.2500]], dtype=torch.float64))
    """

    def __init__(self, fn: Callable, *, hessian: str = "exact", workspace: int = WORKSPACE):
        if not callable(fn):
            raise ValueError(f"`fn` has to be a callable loss(scores, labels, mask), got {_checks.describe(fn)}")
        self.fn = fn
        self.hessian = _checks.check_choice(hessian, self.HESSIANS, "hessian")
        self.workspace = _checks.check_int(workspace, "workspace", low=1)
        self._reset()

    #: The Hessians this kind of loss offers.
    HESSIANS = ("exact", "constant")

    def _reset(self) -> None:
        """Forget what a fit learns about the loss and its data: the first-call check, whether it
        can be batched, its length groups and measured footprints."""
        for key in ("_chunk_plan", "_prefix", "_footprints"):
            self.__dict__.pop(key, None)
        self.checked = False
        self._mode = "func"  # "batched", then "loop", once fn could not be batched (vmap)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({qualified_name(self.fn)}, hessian={self.hessian!r})"

    def __call__(self, scores, labels, mask) -> torch.Tensor:
        """The loss per query [Q] (or the scalar the loss returns), differentiable."""
        return self.per_query(scores, labels, mask)

    def with_hessian(self, hessian: str) -> "TorchLoss":
        return type(self)(self.fn, hessian=hessian, workspace=self.workspace)

    # The loss the trees and the neural rankers differentiate: per query [Q].
    def per_query(self, scores, labels, mask) -> torch.Tensor:
        out = self.fn(scores, labels, mask)
        if not isinstance(out, torch.Tensor):
            raise ValueError(f"the loss {qualified_name(self.fn)} has to return a tensor, got {_checks.describe(out)}")
        return out

    def total(self, scores, labels, mask) -> torch.Tensor:
        """Σ over queries of the loss (a scalar is taken as that sum)."""
        out = self.per_query(scores, labels, mask)
        return out if out.dim() == 0 else out.sum()

    # -- the first call's checks ------------------------------------------------------------------
    def check(self, scores: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> None:
        """On the first call: the loss returns [Q] or a scalar, is finite, depends on the scores
        differentiably, and ignores padding (its value and gradient do not move when the
        padded entries' scores and labels do); ValueError saying which otherwise."""
        if self.checked:
            return
        name = qualified_name(self.fn)
        # A few queries suffice (and bound the check's memory as a chunk's): the longest, the
        # shortest, and two between; each gets a padded column.
        if len(scores) > 4:
            lengths = mask.sum(1)
            order = torch.argsort(lengths, descending=True, stable=True)
            pick = order[torch.tensor([0, len(order) // 3, 2 * len(order) // 3, len(order) - 1])]
            scores, labels, mask = scores[pick], labels[pick], mask[pick]
        q, n = scores.shape
        s0 = scores.detach().to(torch.float64).masked_fill(~mask, 0.0)
        y0 = labels.detach().to(torch.float64).masked_fill(~mask, 0.0)
        # The batch as given, against the batch with three more padded columns holding noise: the
        # loss is evaluated at other padded widths in training (length groups), so neither the
        # padding's values nor its amount may matter (a .mean(1) over the padded row does).
        base, base_grad = self._value_and_grad(s0, y0, mask, name)
        extra = 3
        m = torch.cat([mask, mask.new_zeros(q, extra)], 1)
        s = torch.cat([s0, s0.new_zeros(q, extra)], 1)
        y = torch.cat([y0, y0.new_zeros(q, extra)], 1)
        base_grad = torch.cat([base_grad, base_grad.new_zeros(q, extra)], 1)
        if base.dim() not in (0, 1) or (base.dim() == 1 and len(base) != q):
            raise ValueError(f"the loss {name} has to return the loss per query [{q}] or a scalar, got shape "
                             f"{tuple(base.shape)}")
        if not bool(torch.isfinite(base).all()):
            bad = 0 if base.dim() == 0 else int((~torch.isfinite(base)).nonzero()[0, 0])
            raise ValueError(f"the loss {name} is not finite on the first batch (query {bad})")
        gen = torch.Generator(device=s.device).manual_seed(0)  # on the scores' device (a GPU's own draws)
        noise = torch.randn(s.shape, generator=gen, dtype=torch.float64, device=s.device) * 3.0
        fake = torch.randint(0, 3, s.shape, generator=gen, device=s.device).to(torch.float64)
        moved, moved_grad = self._value_and_grad(torch.where(m, s, noise), torch.where(m, y, fake), m, name)
        # Equal up to the loss's own rounding (its sums run over other widths): 1e-8 in float64, 1e-4
        # for a loss computed in float32. (A non-finite gradient is reported by query later.)
        tol = 1e-8 if self._dtype == torch.float64 else 1e-4
        scale = tol * (1.0 + base.abs())
        grad_moved = ((moved_grad - base_grad).abs() > tol * (1.0 + base_grad.abs())) & m & torch.isfinite(base_grad)
        if not bool(((moved - base).abs() <= scale).all()) or bool(grad_moved.any()):
            loss_moved = (moved - base).abs() > scale
            if base.dim() == 1 and bool(loss_moved.any()):
                where = int(loss_moved.nonzero()[0, 0])
            else:
                where = int(grad_moved.nonzero()[0, 0]) if bool(grad_moved.any()) else 0
            raise ValueError(f"the loss {name} depends on padded entries (mask False): query {where}'s loss or "
                             f"gradient changed when only its padding's scores and labels changed; ignore them, "
                             f"e.g. scores.masked_fill(~mask, 0.0), or mask pairs with "
                             f"mask[:, :, None] & mask[:, None, :]")
        if base.dim() == 0 and q > 1:  # a scalar has to be the sum of the queries' losses
            alone = sum(float(self._value_and_grad(s0[i:i + 1], y0[i:i + 1], mask[i:i + 1], name)[0])
                        for i in range(q))
            if abs(alone - float(base)) > (1e-8 if self._dtype == torch.float64 else 1e-4) * (1.0 + abs(float(base))):
                raise ValueError(f"the loss {name} returns a scalar that is not the sum of its queries' losses "
                                 f"({float(base):.6g} for {q} queries, {alone:.6g} one by one): return the loss "
                                 f"per query [Q] (or their sum; not a mean over queries)")
        self.checked = True

    def _value_and_grad(self, s, y, m, name):
        leaf = s.clone().requires_grad_(True)
        try:
            return self._value_and_grad_of(leaf, y, m, name)
        except (RuntimeError, TypeError, IndexError) as e:  # the user's code failed on the first batch
            raise ValueError(f"the loss {name} failed on the first batch: {type(e).__name__}: "
                             f"{' '.join(str(e).split())[:300]}") from None

    def _value_and_grad_of(self, leaf, y, m, name):
        s = leaf
        with torch.enable_grad():
            out = self.per_query(leaf, y, m)
            total = out if out.dim() == 0 else out.sum()
            if not total.requires_grad:
                raise ValueError(f"the loss {name} does not depend on `scores` differentiably (its result has no "
                                 f"gradient): compute it from the scores with torch operations")
            (grad,) = torch.autograd.grad(total, leaf, allow_unused=True)
        if grad is None:
            grad = torch.zeros_like(s)
        self._dtype = out.dtype
        return out.detach().to(torch.float64), grad.to(torch.float64)

    # -- (grad, hess, loss) -------------------------------------------------------------------------
    def gradients(self, scores: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor | None = None, *,
                  weights: torch.Tensor | None = None, hessian: str | None = None, with_loss: bool = True
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(grad, hess, loss): [Q, L], [Q, L] float64 zero on padding, and [Q] (the loss per
        query; a scalar loss gives each query's own value, computed query by query, unless
        ``with_loss`` is False: then NaN, as the booster, which reads no loss, asks). ``weights``
        [Q, L]: each query's loss, gradient and hessian are multiplied by the mean weight of its
        real documents (the built-in listwise losses' rule)."""
        hessian = self.hessian if hessian is None else hessian
        _checks.check_choice(hessian, self.HESSIANS, "hessian")
        if mask is None:
            mask = torch.ones(scores.shape, dtype=torch.bool, device=scores.device)
        if scores.shape[1] == 0 or len(scores) == 0:
            empty = torch.zeros(scores.shape, dtype=torch.float64, device=scores.device)
            return empty, empty.clone(), torch.zeros(len(scores), dtype=torch.float64, device=scores.device)
        # Real documents not first in their rows: moved there (kept, as the booster passes the same
        # mask and labels every round), and the results moved back.
        key = (mask, mask._version, labels, labels._version)
        cached = self.__dict__.get("_prefix")
        if cached is None or not _same_key(cached[0], key):
            order = _prefix_order(mask)
            moved = None if order is None else (order, torch.argsort(order, dim=1), mask.gather(1, order),
                                                labels.gather(1, order))
            cached = self._prefix = (key, moved)
        if cached[1] is not None:
            order, back, moved_mask, moved_labels = cached[1]
            gathered = self._gradients(scores.gather(1, order), moved_labels, moved_mask,
                                       None if weights is None else weights.gather(1, order), hessian, with_loss)
            return gathered[0].gather(1, back), gathered[1].gather(1, back), gathered[2]
        return self._gradients(scores, labels, mask, weights, hessian, with_loss)

    def _gradients(self, scores, labels, mask, weights, hessian, with_loss):
        """:meth:`gradients` of queries whose real documents come first in their rows."""
        s = scores.detach().to(torch.float64).masked_fill(~mask, 0.0)
        if not self.checked:
            self.check(s, labels.detach().to(torch.float64).masked_fill(~mask, 0.0), mask)
        flat = s.reshape(-1)
        grad = torch.zeros_like(flat)
        hess = torch.zeros_like(flat)
        loss = torch.zeros(len(s), dtype=torch.float64, device=s.device)
        for chunk in self._chunks_for(s, labels, mask, hessian):
            cs = flat.index_select(0, chunk.index).view(len(chunk.rows), chunk.width)
            g, h, c = self._chunk(cs, chunk.labels, chunk.mask, hessian, with_loss, chunk.lanes)
            grad.index_copy_(0, chunk.index, g.reshape(-1))
            hess.index_copy_(0, chunk.index, h.reshape(-1))
            loss.index_copy_(0, chunk.rows, c)
        grad, hess = grad.view(s.shape), hess.view(s.shape)
        _check_grad(grad, mask, qualified_name(self.fn))
        hess = positive_surrogate(hess, grad, mask)
        return _weighted(grad, hess, loss, mask, weights)

    def _chunks_for(self, s, labels, mask, hessian) -> list["_Chunk"]:
        """The chunks of one call: kept while ``mask`` and ``labels`` (the booster's, the same
        objects every round) are the ones they were planned for, unchanged (their version
        counters: a write through numpy or ``.data`` is not seen, so such a change needs a
        :func:`fresh` copy of the loss)."""
        key = (mask, mask._version, labels, labels._version, hessian, self.workspace)
        cached = self.__dict__.get("_chunk_plan")
        if cached is not None and _same_key(cached[0], key):
            return cached[1]
        y = labels.detach().to(torch.float64).masked_fill(~mask, 0.0)
        chunks = []
        width_all = s.shape[1]
        for rows, width in self._groups_for(s, y, mask, hessian):
            per_query = self._footprint(s[rows, :width], y[rows, :width], mask[rows, :width])
            _, height, lanes = self._chunk_shape(len(rows), width, per_query, hessian)
            for i in range(0, len(rows), height):
                r = rows[i:i + height]
                index = (r[:, None] * width_all + torch.arange(width, device=r.device)).reshape(-1)
                chunks.append(_Chunk(r, width, index, y[r, :width], mask[r, :width], lanes))
        self._chunk_plan = (key, chunks)
        return chunks

    def _groups_for(self, s, y, mask, hessian) -> list[tuple[torch.Tensor, int]]:
        """Queries grouped by length, (row indices, padded width), the widths chosen to spend the
        least: a chunk's fixed cost (:data:`CHUNK_COST`) against the work its padding adds, with
        the loss's footprint per query measured at the full width and at half of it."""
        lengths = mask.sum(1).cpu()
        full = s.shape[1]
        longest = torch.argsort(lengths, descending=True, stable=True)[:4].to(mask.device)
        probe = s[longest], y[longest], mask[longest]
        top = self._footprint(*probe)
        half = max(1, full // 2)
        growth = 1.0
        if half < full:
            low = self._footprint(*(t[:, :half] for t in probe))
            growth = min(3.0, max(1.0, math.log(max(top, 1) / max(low, 1)) / math.log(full / half)))
        tangents = hessian != "constant"

        def cost(queries: int, width: int) -> float:
            per_query = max(width, int(top * (width / full) ** growth))
            chunks, height, lanes = self._chunk_shape(queries, width, per_query, hessian)
            products = chunks * -(-width // lanes) if tangents else 0
            return (chunks + products) * CHUNK_COST + queries * per_query * (width if tangents else 1)

        return _planned_groups(lengths, cost, full, mask.device)

    def _chunk(self, s, y, m, hessian, with_loss=True, lanes=1):
        """(grad, hess, loss) of one chunk [q, W] of equally padded queries, ``lanes`` tangents per
        batched product."""
        leaf = s.clone().requires_grad_(True)
        with torch.enable_grad():
            out = self.per_query(leaf, y, m)
            total = out if out.dim() == 0 else out.sum()
            (grad,) = torch.autograd.grad(total, leaf, create_graph=hessian == "exact", allow_unused=True)
        if grad is None:
            grad = torch.zeros_like(s)
        if hessian == "constant":
            hess = m.to(s.dtype)
        elif hessian == "gauss-newton":
            hess = self._gauss_newton(s, y, m, lanes)
        elif not grad.requires_grad:
            raise ValueError(f"the loss {qualified_name(self.fn)}: its gradient has no autograd graph (a linear loss, "
                             f"or a custom autograd.Function without a differentiable backward), so it has no "
                             f"exact Hessian; use hessian='constant' (or 'gauss-newton' with a ProbabilityLoss)")
        else:
            hess = self._exact_diagonal(grad, leaf, lanes)
        return self._finish(s, y, m, grad.detach(), hess, out.detach(), with_loss)

    def _exact_diagonal(self, grad: torch.Tensor, leaf: torch.Tensor, lanes: int) -> torch.Tensor:
        """diag ∂²(Σ loss)/∂s² of one chunk [q, W] from its gradient's graph: W Hessian-vector
        products H e_j, e_j one-hot at position j of every query at once (queries do not
        interact), ``lanes`` of them per batched backward (reverse-over-reverse). The products
        are batched by ``torch.func.vmap`` over ``torch.autograd.grad``, whose batching rules
        cover what ranking losses use (``masked_fill``, the softmax's backward), where
        ``is_grads_batched`` (autograd's older vmap) runs them one tangent at a time; a loss that
        torch.func cannot batch falls back to ``is_grads_batched``, and one that neither can to
        one backward per position (slower; the same numbers)."""
        q, width = leaf.shape
        eye = torch.eye(width, dtype=leaf.dtype, device=leaf.device)
        diag = torch.zeros_like(leaf)

        def product(tangent):
            (column,) = torch.autograd.grad(grad, leaf, tangent, retain_graph=True, allow_unused=True)
            return torch.zeros_like(tangent) if column is None else column

        for j0 in range(0, width, lanes):
            j1 = min(width, j0 + lanes)
            tangents = eye[j0:j1, None, :].expand(j1 - j0, q, width)
            products = None
            if self._mode == "func":
                try:
                    products = torch.func.vmap(product)(tangents)
                except Exception as e:  # noqa: BLE001 -- torch.func cannot batch this loss: autograd's vmap
                    if not _is_transform_error(e):
                        raise
                    self._mode = "batched"
            if self._mode == "batched":
                try:
                    (products,) = torch.autograd.grad(grad, leaf, tangents, is_grads_batched=True,
                                                      retain_graph=True, allow_unused=True)
                except Exception as e:  # noqa: BLE001 -- the loss cannot be vmapped: one position at a time
                    if not _is_transform_error(e):
                        raise
                    self._mode = "loop"
                else:
                    products = torch.zeros_like(tangents) if products is None else products
            if self._mode != "loop":
                diag[:, j0:j1] = products.diagonal(offset=j0, dim1=0, dim2=2)
                continue
            for j in range(j0, j1):
                diag[:, j] = product(tangents[j - j0])[:, j]
        return diag.detach()

    def _finish(self, s, y, m, grad, hess, out, with_loss=True):
        if out.dim() == 1:
            loss = out
        elif with_loss:  # a scalar loss: each query's own value, one evaluation per query
            loss = self._per_query_scalar(s, y, m)
        else:
            loss = torch.full((len(s),), float("nan"), dtype=torch.float64, device=s.device)
        f64 = torch.float64  # a loss may compute (and return) float32: the booster's sums are float64
        return grad.to(f64).masked_fill(~m, 0.0), hess.to(f64).masked_fill(~m, 0.0), loss.to(f64)

    def _chunk_shape(self, queries: int, width: int, per_query: int, hessian: str) -> tuple[int, int, int]:
        """(chunks, queries per chunk, tangents per batched product) of a group of ``queries``
        queries of width W whose loss keeps ``per_query`` entries per query in its largest
        intermediate tensor. Where a query's W tangents fit in :data:`PRODUCT_ENTRIES` (a
        listwise loss): as many queries per chunk as hold that tensor within ``workspace``
        entries (as evenly as that allows), then as many tangents as keep each product within
        :data:`PRODUCT_ENTRIES`. Where they do not (a pairwise loss's [W, W] per query): one
        query per chunk and as many tangents as ``workspace`` holds, which measured faster there
        (MQ2008 Fold1: 0.98 s against 1.12 s exact, 0.96 s against 1.65 s Gauss–Newton)."""
        per_query = max(1, per_query)
        if hessian != "constant" and width * per_query > min(self.workspace, PRODUCT_ENTRIES):
            return queries, 1, max(1, min(width, self.workspace // per_query))
        chunks = -(-queries // max(1, min(queries, self.workspace // per_query)))
        height = -(-queries // chunks)
        if hessian == "constant":  # one plain evaluation per chunk
            return chunks, height, 1
        budget = min(self.workspace, PRODUCT_ENTRIES)
        return chunks, height, max(1, min(width, budget // (height * per_query)))

    def _footprint(self, s, y, m) -> int:
        """Entries per query of the largest tensor the loss keeps for its backward at width W
        (at least W), from the saved-tensor hooks of one forward on a few queries; cached."""
        width = s.shape[1]
        cache = self.__dict__.setdefault("_footprints", {})
        if width not in cache:
            probe = slice(0, min(4, len(s)))
            largest = [0]

            def pack(t):
                largest[0] = max(largest[0], t.numel())
                return t

            leaf = s[probe].clone().requires_grad_(True)
            with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                self.total(leaf, y[probe], m[probe])
            cache[width] = max(width, -(-largest[0] // max(1, leaf.shape[0])))
        return cache[width]

    def _per_query_scalar(self, s, y, m) -> torch.Tensor:
        with torch.no_grad():
            return torch.stack([self.total(s[i:i + 1], y[i:i + 1], m[i:i + 1]) for i in range(len(s))])


def _is_transform_error(e: Exception) -> bool:
    text = f"{type(e).__name__}: {e}"
    return isinstance(e, (RuntimeError, NotImplementedError)) and any(
        key in text for key in ("vmap", "functorch", "torch.func", "jvp", "forward AD", "forward-mode",
                                "data-dependent", ".item()", "inplace", "in-place", "Batching rule",
                                "BatchedTensor", "dual"))


# -- losses given as probabilities (Gauss–Newton) ---------------------------------------------------------
class ProbabilityLoss(TorchLoss):
    """A ranking loss written as log-likelihoods of probabilities, for the Gauss–Newton Hessian.

    ``fn(scores, labels, mask)`` returns ``(logits, targets)`` or ``(logits, targets, weights)``,
    each [Q, K] (K events per query, e.g. the L² pairs, or the L documents):

    * ``kind="bernoulli"``: each entry is an event of probability p = sigmoid(z) with target
      t ∈ [0, 1]; the loss is −Σ_k w_k (t_k log p_k + (1 − t_k) log(1 − p_k)) per query and the
      Gauss–Newton diagonal Σ_k w_k p_k (1 − p_k) (∂z_k/∂s_i)².
    * ``kind="categorical"``: each row is a softmax over its K logits (−inf where absent) with
      target mass t ≥ 0; the loss is −Σ_k t_k log p_k and the diagonal
      T (Σ_k p_k u_k² − (Σ_k p_k u_k)²), u = ∂z/∂s_i, T = Σ_k t_k (``weights`` unused).

    Events where ``weights`` (default 1) are 0 do not count. ``hessian="exact"`` is also
    available (the exact diagonal of the same loss).

    >>> def ranknet_pairs(scores, labels, mask):
    ...     pairs = (labels[:, :, None] > labels[:, None, :]) & mask[:, :, None] & mask[:, None, :]
    ...     logits = (scores[:, :, None] - scores[:, None, :]).flatten(1)
    ...     return logits, torch.ones_like(logits), pairs.flatten(1).to(logits.dtype)
    >>> g, h, c = ProbabilityLoss(ranknet_pairs).gradients(torch.tensor([[0.0, 0.0]], dtype=torch.float64),
    ...                                                    torch.tensor([[1.0, 0.0]]))
    >>> h  # σ(0)(1 − σ(0)) = 1/4 per document: the exact diagonal, as RankNet's logits are linear
    tensor([[0.2500, 0.2500]], dtype=torch.float64)
    """

    KINDS = ("bernoulli", "categorical")

    def __init__(self, fn: Callable, *, kind: str = "bernoulli", hessian: str = "gauss-newton",
                 workspace: int = WORKSPACE):
        if not callable(fn):
            raise ValueError(f"`fn` has to be a callable returning (logits, targets[, weights]), got "
                             f"{_checks.describe(fn)}")
        self.kind = _checks.check_choice(kind, self.KINDS, "kind")
        super().__init__(fn, hessian=hessian, workspace=workspace)

    HESSIANS = HESSIANS

    def with_hessian(self, hessian: str) -> "ProbabilityLoss":
        return type(self)(self.fn, kind=self.kind, hessian=hessian, workspace=self.workspace)

    def _events(self, scores, labels, mask):
        out = self.fn(scores, labels, mask)
        if not isinstance(out, tuple) or len(out) not in (2, 3):
            raise ValueError(f"the loss {qualified_name(self.fn)} given as probabilities has to return "
                             f"(logits, targets) or (logits, targets, weights), got {_checks.describe(out)}")
        if not all(isinstance(t, torch.Tensor) for t in out):
            raise ValueError(f"the loss {qualified_name(self.fn)} given as probabilities has to return tensors, "
                             f"got {[_checks.describe(t) for t in out]}")
        logits, targets = out[0], out[1]
        weights = out[2] if len(out) == 3 else None
        if logits.dim() != 2 or logits.shape[0] != scores.shape[0] or targets.shape != logits.shape or \
                (weights is not None and weights.shape != logits.shape):
            raise ValueError(f"the loss {qualified_name(self.fn)}: logits, targets (and weights) have to be "
                             f"[Q, K] with Q = {scores.shape[0]}, got "
                             f"{[tuple(t.shape) for t in out]}")
        return logits, targets.detach(), None if weights is None else weights.detach()

    def per_query(self, scores, labels, mask) -> torch.Tensor:
        logits, t, w = self._events(scores, labels, mask)
        if self.kind == "bernoulli":
            nll = -(t * torch.nn.functional.logsigmoid(logits) + (1 - t) * torch.nn.functional.logsigmoid(-logits))
            if w is not None:
                nll = torch.where(w != 0, nll * w, 0.0)
            return nll.sum(1)
        logp = torch.log_softmax(logits, dim=1)
        return -torch.where(t != 0, t * logp, 0.0).sum(1)

    def _gauss_newton(self, s, y, m, lanes: int) -> torch.Tensor:
        """The generalised Gauss–Newton diagonal from W forward-mode products ∂z/∂s · e_j."""
        from torch.func import jvp, vmap

        q, width = s.shape
        with torch.no_grad():
            logits, t, w = self._events(s, y, m)

        def column(tangent):
            return jvp(lambda x: self._events(x, y, m)[0], (s,), (tangent,))[1]

        eye = torch.eye(width, dtype=s.dtype, device=s.device)
        u = vmap(column, chunk_size=lanes)(eye[:, None, :].expand(width, q, width))  # [W, q, K]
        u = torch.nan_to_num(u, nan=0.0, posinf=0.0, neginf=0.0)
        if self.kind == "bernoulli":
            p = torch.sigmoid(logits)
            c = p * (1 - p) * (torch.ones_like(p) if w is None else w)
            diag = (c[None] * u * u).sum(2)  # [W, q]
        else:
            p = torch.softmax(logits, dim=1)
            total = t.sum(1)
            diag = total[None] * ((p[None] * u * u).sum(2) - (p[None] * u).sum(2) ** 2)
        return diag.transpose(0, 1).contiguous()


# -- declared pairwise losses ----------------------------------------------------------------------------
#: The pair sets a declared pairwise loss is evaluated on.
PAIRS = ("higher", "all")
#: Pairs whose indices a :class:`PairwiseLoss` keeps from one round to the next (two int64 each):
#: beyond, they are formed again in every call, one bounded chunk at a time.
PAIR_CACHE = 2**23


class PairwiseLoss(TorchLoss):
    """A ranking loss declared pair by pair: ``fn(diff, label_i, label_j) -> [P]``, one loss per
    pair, elementwise in ``diff`` = s_i − s_j (each pair's loss reads only its own entries).

    rankkit forms the pairs of every query (never padding): with ``pairs="higher"`` (default)
    each pair once, i the more relevant document (label_i > label_j), the built-in kernel's
    pairs; with ``"all"`` every ordered pair of two distinct documents. ``top_k=k`` keeps only
    the pairs with at least one document in the query's current top k by score (ties broken by
    position), as the built-in kernel's truncation does. A query's loss is the sum of its pairs'
    (``reduction="mean"``: over its number of pairs).

    The loss of a pairwise objective is L = Σ_p ℓ_p(s_i − s_j), so its gradient is ℓ_p' added to
    s_i and subtracted from s_j, and the diagonal of its Hessian Σ_p ℓ_p'' added to both
    documents: two elementwise derivatives by autograd, O(pairs), where a loss written over
    [Q, L] needs L Hessian-vector products per query (``hessian="exact"``, default; or
    ``"constant"``). The pairs are evaluated in chunks of at most ``workspace`` pairs.

    A ``weight`` keyword, when ``fn`` declares one, receives each pair's weight (the mean of its
    two documents' sample weights, the built-in kernel's rule; 1 without weights) and ``fn``
    applies it; otherwise rankkit multiplies each pair's loss by it.

    >>> import torch.nn.functional as F
    >>> ranknet = PairwiseLoss(lambda diff, label_i, label_j: F.softplus(-diff))
    >>> g, h, c = ranknet.gradients(torch.tensor([[0.0, 0.0]], dtype=torch.float64), torch.tensor([[1.0, 0.0]]))
    >>> g, h  # ∓1/2, 1/4: RankNet's lambdas and Newton weights
    (tensor([[-0.5000,  0.5000]], dtype=torch.float64), tensor([[0.2500, 0.2500]], dtype=torch.float64))
    """

    HESSIANS = ("exact", "constant")
    REDUCTIONS = ("sum", "mean")

    def __init__(self, fn: Callable, *, pairs: str = "higher", top_k: int | None = None, reduction: str = "sum",
                 hessian: str = "exact", workspace: int = 2**20):
        if not callable(fn):
            raise ValueError(f"`fn` has to be a callable loss(diff, label_i, label_j) per pair, got "
                             f"{_checks.describe(fn)}")
        self.pairs = _checks.check_choice(pairs, PAIRS, "pairs")
        self.top_k = None if top_k is None else _checks.check_int(top_k, "top_k", low=1)
        self.reduction = _checks.check_choice(reduction, self.REDUCTIONS, "reduction")
        self.takes_weight = "weight" in _keyword_names(fn)
        super().__init__(fn, hessian=hessian, workspace=workspace)

    def settings(self) -> dict:
        return dict(pairs=self.pairs, top_k=self.top_k, reduction=self.reduction, hessian=self.hessian,
                    workspace=self.workspace)

    def __repr__(self) -> str:
        given = ", ".join(f"{k}={v!r}" for k, v in self.settings().items() if k != "workspace")
        return f"PairwiseLoss({qualified_name(self.fn)}, {given})"

    def with_hessian(self, hessian: str) -> "PairwiseLoss":
        return type(self)(self.fn, **{**self.settings(), "hessian": hessian})

    def _reset(self) -> None:
        super()._reset()
        self.__dict__.pop("_plan", None)

    # -- the pairs -----------------------------------------------------------------------------------------
    def _pair_chunks(self, labels: torch.Tensor, mask: torch.Tensor) -> list[tuple[torch.Tensor, ...]]:
        """(first, second, query) of every candidate pair, flat indices into [Q, L] and the query
        index, in chunks of at most about ``workspace`` pairs; kept while ``mask`` (the
        booster's, the same object every round) is the one they were formed for."""
        cached = self.__dict__.get("_plan")
        if cached is not None and cached[0] is mask and cached[1] is labels:
            return cached[2]
        chunks, width = [], mask.shape[1]
        for rows, w in _length_groups(mask):
            height = max(1, self.workspace // (w * w))
            for r0 in range(0, len(rows), height):
                r = rows[r0:r0 + height]
                m, y = mask[r, :w], labels[r, :w]
                both = m[:, :, None] & m[:, None, :]
                keep = both & (y[:, :, None] > y[:, None, :]) if self.pairs == "higher" else \
                    both & ~torch.eye(w, dtype=torch.bool, device=m.device)
                q, a, b = keep.nonzero(as_tuple=True)
                query = r[q]
                chunks.append((query * width + a, query * width + b, query))
        chunks = _merge_chunks(chunks, self.workspace)
        if sum(len(c[0]) for c in chunks) <= PAIR_CACHE:
            self._plan = (mask, labels, chunks)
        return chunks

    def _pair_weights(self, chunk, weights, top, counts) -> torch.Tensor | None:
        """[p] the pairs' factors (the mean of the two documents' weights, the built-in kernel's
        rule; 0 outside the top k; over the query's pair count with ``counts``), or None where
        every factor is 1."""
        first, second, query = chunk
        factor = None
        if weights is not None:
            w = weights.detach().reshape(-1).to(torch.float64)
            factor = (w[first] + w[second]) * 0.5
        if top is not None:
            inside = _inside(top, first, second)
            factor = inside if factor is None else factor * inside
        if counts is not None:
            factor = 1.0 / counts[query] if factor is None else factor / counts[query]
        return factor

    def _top(self, scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
        """[Q·L] bool: the documents in their query's current top k (ties by position), or None."""
        if self.top_k is None:
            return None
        order = torch.argsort(scores.detach().masked_fill(~mask, float("-inf")), dim=1, descending=True,
                              stable=True)
        rank = torch.empty_like(order)
        rank.scatter_(1, order, torch.arange(mask.shape[1], device=mask.device).expand_as(order))
        return ((rank < self.top_k) & mask).reshape(-1)

    def _counts(self, chunks, mask, top, n_queries) -> torch.Tensor:
        """[Q] pairs per query that count (for ``reduction="mean"``)."""
        count = torch.zeros(n_queries, dtype=torch.float64, device=mask.device)
        for first, second, query in chunks:
            inside = torch.ones(len(query), dtype=torch.float64, device=mask.device) if top is None else \
                _inside(top, first, second)
            count.index_add_(0, query, inside)
        return count.clamp(min=1)

    # -- the loss, and its derivatives -----------------------------------------------------------------------
    def _evaluate(self, diff, y_i, y_j, factor) -> torch.Tensor:
        """The pairs' losses [p], each times its factor."""
        if self.takes_weight:
            weight = torch.ones_like(diff) if factor is None else factor.to(diff.dtype)
            out = self.fn(diff, y_i, y_j, weight=weight)
        else:
            out = self.fn(diff, y_i, y_j)
        if not isinstance(out, torch.Tensor) or out.shape != diff.shape:
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else _checks.describe(out)
            raise ValueError(f"the pairwise loss {qualified_name(self.fn)} has to return one loss per pair, shape "
                             f"{tuple(diff.shape)}, got {got}")
        return out if factor is None or self.takes_weight else out * factor.to(out.dtype)

    def per_query(self, scores, labels, mask) -> torch.Tensor:
        """[Q] the loss of each query, differentiable in ``scores`` (the neural rankers' path)."""
        flat_s, flat_y = scores.reshape(-1), labels.detach().reshape(-1).to(scores.dtype)
        top = self._top(scores, mask)
        chunks = self._pair_chunks(labels, mask)
        counts = self._counts(chunks, mask, top, len(scores)) if self.reduction == "mean" else None
        loss = torch.zeros(len(scores), dtype=scores.dtype, device=scores.device)
        for chunk in chunks:
            first, second, query = chunk
            factor = self._pair_weights(chunk, None, top, counts)
            ell = self._evaluate(flat_s[first] - flat_s[second], flat_y[first], flat_y[second], factor)
            loss = loss.index_add(0, query, ell.to(loss.dtype))
        return loss

    def check(self, scores: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> None:
        """On the first call: ``fn`` returns one finite loss per pair, differentiable in ``diff``,
        and is elementwise (its losses of a subset of the pairs, permuted, are the same losses
        permuted: no sum, mean or count over the pairs)."""
        if self.checked:
            return
        name = qualified_name(self.fn)
        s = scores.detach().to(torch.float64).masked_fill(~mask, 0.0)
        chunks = self._pair_chunks(labels, mask)
        if not chunks:
            return  # no pair yet: checked on a batch that has one
        first, second = chunks[0][0][:4096], chunks[0][1][:4096]
        y = labels.detach().reshape(-1).to(torch.float64)
        diff, y_i, y_j = s.reshape(-1)[first] - s.reshape(-1)[second], y[first], y[second]
        leaf = diff.clone().requires_grad_(True)
        try:
            with torch.enable_grad():
                out = self._evaluate(leaf, y_i, y_j, None)
                if not out.requires_grad:
                    raise ValueError(f"the pairwise loss {name} does not depend on `diff` differentiably (its result "
                                     f"has no gradient): compute it from `diff` with torch operations")
                (grad,) = torch.autograd.grad(out.sum(), leaf)
            if not bool(torch.isfinite(out).all()):
                bad = int((~torch.isfinite(out)).nonzero()[0, 0])
                raise ValueError(f"the pairwise loss {name} is not finite on the first batch (pair {bad}: diff "
                                 f"{float(diff[bad]):.6g}, labels {float(y_i[bad]):g} and {float(y_j[bad]):g})")
            perm = torch.flip(torch.arange(len(diff) // 2 + 1, device=diff.device), [0])
            part = self._evaluate(diff[perm], y_i[perm], y_j[perm], None).detach()
        except (RuntimeError, TypeError, IndexError) as e:
            raise ValueError(f"the pairwise loss {name} failed on the first batch: {type(e).__name__}: "
                             f"{' '.join(str(e).split())[:300]}") from None
        want = out.detach()[perm]
        tol = 1e-8 if out.dtype == torch.float64 else 1e-4
        if not bool(((part - want).abs() <= tol * (1 + want.abs())).all()):
            raise ValueError(f"the pairwise loss {name} is not elementwise: a pair's loss changed when other pairs "
                             f"were left out or reordered; return each pair's own loss (no sum, mean or count over "
                             f"the pairs: use reduction='mean' for a per-query mean)")
        self._dtype = out.dtype
        self.checked = True

    def gradients(self, scores: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor | None = None, *,
                  weights: torch.Tensor | None = None, hessian: str | None = None, with_loss: bool = True
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(grad, hess, loss) [Q, L], [Q, L], [Q] in float64: ℓ' and ℓ'' of every pair by
        elementwise autograd, added to its two documents (``with_loss`` is accepted as
        :class:`TorchLoss` takes it; the loss costs nothing more here)."""
        hessian = _checks.check_choice(self.hessian if hessian is None else hessian, self.HESSIANS, "hessian")
        if mask is None:
            mask = torch.ones(scores.shape, dtype=torch.bool, device=scores.device)
        s = scores.detach().to(torch.float64).masked_fill(~mask, 0.0)
        self.check(s, labels, mask)
        chunks = self._pair_chunks(labels, mask)  # the caller's labels and mask: the same objects every round
        top = self._top(s, mask)
        counts = self._counts(chunks, mask, top, len(s)) if self.reduction == "mean" else None
        flat_s, flat_y = s.reshape(-1), labels.detach().reshape(-1)
        grad = torch.zeros_like(flat_s)
        hess = torch.zeros_like(flat_s)
        loss = torch.zeros(len(s), dtype=torch.float64, device=s.device)
        for chunk in chunks:
            first, second, query = chunk
            factor = self._pair_weights(chunk, weights, top, counts)
            d1, d2, ell = self._derivatives(flat_s[first] - flat_s[second], flat_y[first].to(torch.float64),
                                            flat_y[second].to(torch.float64), factor, hessian)
            grad.index_add_(0, first, d1)
            grad.index_add_(0, second, -d1)
            if d2 is not None:
                hess.index_add_(0, first, d2)
                hess.index_add_(0, second, d2)
            loss.index_add_(0, query, ell)
        grad, hess = grad.view_as(s), hess.view_as(s)
        if hessian == "constant":
            hess = mask.to(torch.float64)
        _check_grad(grad, mask, qualified_name(self.fn))
        return grad, positive_surrogate(hess, grad, mask), loss

    def _derivatives(self, diff, y_i, y_j, factor, hessian):
        """(ℓ', ℓ'' or None, ℓ) of a chunk of pairs, float64, each times its factor."""
        leaf = diff.requires_grad_(True)
        with torch.enable_grad():
            ell = self._evaluate(leaf, y_i, y_j, factor)
            (d1,) = torch.autograd.grad(ell.sum(), leaf, create_graph=hessian == "exact")
            if hessian != "exact":
                return d1.detach().double(), None, ell.detach().double()
            if not d1.requires_grad:  # linear in diff: ℓ'' = 0
                return d1.detach().double(), torch.zeros_like(diff, dtype=torch.float64), ell.detach().double()
            (d2,) = torch.autograd.grad(d1.sum(), leaf, allow_unused=True)
        d2 = torch.zeros_like(diff) if d2 is None else d2
        return d1.detach().double(), d2.detach().double(), ell.detach().double()


def pairwise(fn: Callable | None = None, **settings):
    """Declare ``fn(diff, label_i, label_j) -> [P]`` a pairwise loss (:class:`PairwiseLoss`), as a
    function or a decorator, with or without settings::

        @rankkit.custom.pairwise
        def hinge(diff, label_i, label_j):
            return torch.clamp(1 - diff, min=0) ** 2

        @rankkit.custom.pairwise(top_k=10, reduction="mean")
        def logistic(diff, label_i, label_j):
            return (label_i - label_j) * F.softplus(-diff)

    A module-level declaration is recorded by its name (``mypkg.losses.hinge``), which imports
    the declaration, settings included."""
    if fn is None:
        return lambda f: PairwiseLoss(f, **settings)
    return PairwiseLoss(fn, **settings)


def _is_declared(loss: "PairwiseLoss") -> bool:
    """True when the name of ``loss.fn`` imports this declaration (a module-level ``@pairwise``),
    so that recording the name records the settings too."""
    target = sys.modules.get(getattr(loss.fn, "__module__", None) or "")
    for part in (getattr(loss.fn, "__qualname__", None) or "<none>").split("."):
        target = getattr(target, part, None)
    return isinstance(target, PairwiseLoss) and target.fn is loss.fn and target.settings() == loss.settings()


def _inside(top: torch.Tensor, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """[p] 1.0 for the pairs with a document in the top k, else 0.0."""
    return (top[first] | top[second]).to(torch.float64)


def _keyword_names(fn) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def _merge_chunks(chunks, workspace: int):
    """Consecutive small chunks joined up to ``workspace`` pairs (fewer, larger autograd calls)."""
    merged, pending, size = [], [], 0
    for chunk in chunks:
        n = len(chunk[0])
        if pending and size + n > workspace:
            merged.append(tuple(torch.cat(parts) for parts in zip(*pending)))
            pending, size = [], 0
        pending.append(chunk)
        size += n
    if pending:
        merged.append(tuple(torch.cat(parts) for parts in zip(*pending)))
    return [c for c in merged if len(c[0])]


# -- closed-form objectives (rankkit's own form) ---------------------------------------------------------
class GradientObjective:
    """An objective in rankkit's own closed form, ``fn(scores, labels, *, mask, weights, **options)
    -> (grad, hess, loss)`` on padded [Q, L] batches: every function of
    :data:`rankkit.losses.OBJECTIVES` (``softmax_loss``, ``neural_ndcg_loss``, ...), or a user's
    hand-derived one. Recognised by its keyword-only ``mask``. ``options`` are passed on each call
    (``GradientObjective(neural_ndcg_loss, temperature=0.5)``). A hessian that is negative or not
    finite gets the module's positive surrogate; a non-finite gradient is an error."""

    def __init__(self, fn: Callable, **options):
        if not callable(fn):
            raise ValueError(f"`fn` has to be a callable (scores, labels, *, mask, ...) -> (grad, hess, loss), got "
                             f"{_checks.describe(fn)}")
        self.fn, self.options, self.hessian = fn, options, "given"

    def __repr__(self) -> str:
        return f"GradientObjective({qualified_name(self.fn)})"

    def __call__(self, scores, labels, *, mask=None, weights=None, **options):
        return self.fn(scores, labels, mask=mask, weights=weights, **{**self.options, **options})

    def gradients(self, scores: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor | None = None, *,
                  weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(grad, hess, loss) in float64 ([Q, L], [Q, L], [Q]), the hessian made positive."""
        if mask is None:
            mask = torch.ones(scores.shape, dtype=torch.bool, device=scores.device)
        out = self(scores.detach().to(torch.float64), labels, mask=mask, weights=weights)
        name = qualified_name(self.fn)
        if not isinstance(out, tuple) or len(out) != 3:
            raise ValueError(f"the objective {name} has to return (grad, hess, loss), got {_checks.describe(out)}")
        grad, hess, loss = (t.detach().to(torch.float64) for t in out)
        if grad.shape != scores.shape or hess.shape != scores.shape:
            raise ValueError(f"the objective {name} returned grad {tuple(grad.shape)} and hess {tuple(hess.shape)}, "
                             f"expected {tuple(scores.shape)}")
        grad, hess = grad.masked_fill(~mask, 0.0), hess.masked_fill(~mask, 0.0)
        _check_grad(grad, mask, name)
        return grad, positive_surrogate(hess, grad, mask), loss


# -- LightGBM/XGBoost style numpy objectives -------------------------------------------------------------
class NumpyObjective:
    """A LightGBM/XGBoost scikit-learn style objective ``fn(y_true, y_pred[, weight][, group])
    -> (grad, hess)`` on flat numpy arrays, as rankkit's booster calls it.

    ``y_true`` [N] float64 labels, ``y_pred`` [N] float64 current scores (documents in input order,
    each query's documents contiguous), ``group`` [Q] int64 documents per query, ``weight`` [N]
    float64 (or None). A function that takes no ``weight`` gets its grad and hess multiplied by the
    sample weights (LightGBM's rule). Its arguments are read by name: a third parameter named
    ``group`` receives the group sizes, one named ``weight`` the weights (LightGBM's four-argument
    order is ``(y_true, y_pred, weight, group)``).
    """

    def __init__(self, fn: Callable):
        if not callable(fn):
            raise ValueError(f"`fn` has to be a callable (y_true, y_pred, ...) -> (grad, hess), got "
                             f"{_checks.describe(fn)}")
        self.fn = fn
        names = _parameter_names(fn)
        extra = names[2:]
        if any(n not in ("weight", "group") for n in extra):
            raise ValueError(f"the objective {qualified_name(fn)} takes {names}: after (y_true, y_pred) rankkit "
                             f"passes `weight` and `group`, by those names")
        self.arguments = extra
        self.hessian = "given"

    def __repr__(self) -> str:
        return f"NumpyObjective({qualified_name(self.fn)})"

    def __call__(self, *args):
        return self.fn(*args)

    def flat_gradients(self, labels, scores, sizes, weights) -> tuple[torch.Tensor, torch.Tensor]:
        """(grad, hess) [N] float64 from flat torch tensors."""
        import numpy as np

        y_true = labels.detach().cpu().double().numpy()
        y_pred = scores.detach().cpu().double().numpy().copy()
        given = {"group": sizes.detach().cpu().long().numpy(),
                 "weight": None if weights is None else weights.detach().cpu().double().numpy()}
        out = self.fn(y_true, y_pred, *[given[n] for n in self.arguments])
        name = qualified_name(self.fn)
        if not isinstance(out, tuple) or len(out) != 2:
            raise ValueError(f"the objective {name} has to return (grad, hess), got {_checks.describe(out)}")
        result = []
        for label, value in zip(("grad", "hess"), out):
            arr = np.asarray(value, dtype=np.float64).reshape(-1)
            if arr.shape != y_pred.shape:
                raise ValueError(f"the objective {name} returned {label} of shape {np.shape(value)}, expected "
                                 f"({len(y_pred)},)")
            result.append(torch.from_numpy(arr.copy()).to(scores.device))
        grad, hess = result
        if weights is not None and "weight" not in self.arguments:
            grad, hess = grad * weights.double(), hess * weights.double()
        every = torch.ones(1, len(grad), dtype=torch.bool, device=grad.device)
        _check_grad(grad[None], every, name)  # "query 0, document D": D is the flat position
        return grad, positive_surrogate(hess[None], grad[None], every)[0]


# -- shared helpers ---------------------------------------------------------------------------------------
def _length_groups(mask: torch.Tensor) -> list[tuple[torch.Tensor, int]]:
    """Queries grouped by length: (row indices, padded width) with widths powers of two (at most
    the batch's width), so that each group's padding is under half its entries."""
    lengths = mask.sum(1).cpu()
    full = mask.shape[1]
    widths = torch.where(lengths <= 1, 1, 2 ** torch.ceil(torch.log2(lengths.clamp_min(1).double())).long())
    widths = widths.clamp(max=full)
    groups = []
    for w in torch.unique(widths).tolist():
        rows = (widths == w).nonzero().flatten().to(mask.device)
        groups.append((rows, int(w)))
    return groups


def _same_key(a: tuple, b: tuple) -> bool:
    """Plan keys equal: tensors by identity, everything else by value."""
    return len(a) == len(b) and all(x is y if isinstance(x, torch.Tensor) else x == y for x, y in zip(a, b))


class _Chunk(NamedTuple):
    """Equally padded queries evaluated together: their rows, padded width, flat positions
    [q·W] in the [Q, L] batch, float64 labels and mask [q, W], and tangents per batched product."""
    rows: torch.Tensor
    width: int
    index: torch.Tensor
    labels: torch.Tensor
    mask: torch.Tensor
    lanes: int


#: Length cells the plan of :func:`_planned_groups` chooses between, at most: distinct lengths
#: beyond are pooled geometrically (a cell's lengths within 1/32 of each other, or 1/16, ...,
#: until they fit).
PLAN_CELLS = 160


def _planned_groups(lengths: torch.Tensor, cost: Callable[[int, int], float], full: int,
                    device) -> list[tuple[torch.Tensor, int]]:
    """Queries grouped by length, (row indices, padded width), each group padded to its longest
    query: of every split of the sorted lengths into consecutive groups, the one of least total
    ``cost(queries, width)`` (dynamic programming over the distinct lengths, pooled into at most
    :data:`PLAN_CELLS` cells)."""
    widths = lengths.clamp(min=1, max=full)
    values, counts = torch.unique(widths, return_counts=True)
    values, counts = values.tolist(), counts.tolist()
    steps = 32  # cells per doubling of the length, halved until the cells fit in PLAN_CELLS
    while len(values) > PLAN_CELLS and steps >= 1:  # pool: each cell keeps its longest length
        cell = torch.ceil(torch.log2(torch.tensor(values, dtype=torch.float64)) * steps).long().tolist()
        pooled: dict[int, list[int]] = {}
        for c, v, n in zip(cell, values, counts):
            entry = pooled.setdefault(c, [v, 0])
            entry[0], entry[1] = max(entry[0], v), entry[1] + n
        values, counts = [e[0] for e in pooled.values()], [e[1] for e in pooled.values()]
        steps //= 2
    m = len(values)
    prefix = [0]
    for n in counts:
        prefix.append(prefix[-1] + n)
    best, cut = [0.0] + [math.inf] * m, [0] * (m + 1)
    for j in range(1, m + 1):
        for i in range(j):
            total = best[i] + cost(prefix[j] - prefix[i], values[j - 1])
            if total < best[j]:
                best[j], cut[j] = total, i
    bounds, j = [], m
    while j > 0:
        bounds.append((cut[j], j))
        j = cut[j]
    groups = []
    for i, j in reversed(bounds):
        low = values[i - 1] if i > 0 else 0
        rows = ((widths > low) & (widths <= values[j - 1])).nonzero().flatten().to(device)
        groups.append((rows, int(values[j - 1])))
    return groups


def fresh(objective):
    """A copy of a :class:`TorchLoss` (or :class:`ProbabilityLoss`) without the state a fit keeps
    on it (the first-call check, the length groups, the measured footprints), so that fitting
    never changes the object the user passed (scikit-learn's rule for parameters) and every fit
    checks its own data; other objectives hold no state and are returned as they are."""
    if not isinstance(objective, TorchLoss):
        return objective
    copy = object.__new__(type(objective))
    copy.__dict__.update(objective.__dict__)
    copy._reset()
    return copy


def _prefix_order(mask: torch.Tensor) -> torch.Tensor | None:
    """None when every row's real documents come first (the padded layout rankkit builds); else
    the per-row order [Q, L] that moves them there (stable), so that a length group's first W
    columns hold every real document of its queries."""
    lengths = mask.sum(1, keepdim=True)
    prefix = torch.arange(mask.shape[1], device=mask.device)[None] < lengths
    if bool((prefix == mask).all()):
        return None
    return torch.argsort((~mask).to(torch.int8), dim=1, stable=True)


def _all_finite(values: torch.Tensor) -> bool:
    """Whether every entry is finite, read from their sum in the usual case (a non-finite entry
    makes the sum inf or NaN; a sum that overflows only sends the check to ``isfinite``): on
    the CPU a sum is one vectorised pass, ``isfinite(...).all()`` two slow ones (88 against
    3.5 µs on MQ2008's [471, 121])."""
    if values.numel() == 0 or math.isfinite(float(values.sum())):
        return True
    return bool(torch.isfinite(values).all())


def _check_grad(grad: torch.Tensor, mask: torch.Tensor, name: str) -> None:
    if _all_finite(grad):  # padding is 0: one pass in the usual case
        return
    bad = ~torch.isfinite(grad) & mask
    if bool(bad.any()):
        q, j = (int(v) for v in bad.nonzero()[0])
        raise NonFiniteGradient(f"the objective {name} gave a non-finite gradient ({float(grad[q, j])}) in query "
                                f"{q}, document {j}", q)


def positive_surrogate(hess: torch.Tensor, grad: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The diagonal made positive: |h| where finite; where not, the largest finite |h| of the
    query, or |grad| if the query has none."""
    if hess.device.type == "cpu" and _all_finite(hess):  # the usual case, in two passes (on a GPU: no
        return hess.abs() * mask                        # sync, the passes below); finite: x * False = 0
    finite = torch.isfinite(hess) & mask
    h = torch.where(finite, hess.abs(), 0.0)
    top = h.amax(1, keepdim=True) if h.numel() else h
    fallback = torch.where(top > 0, top.expand_as(h), grad.abs())
    return torch.where(finite, h, fallback).masked_fill(~mask, 0.0)


def _weighted(grad, hess, loss, mask, weights):
    if weights is None:
        return grad, hess, loss
    w = weights.detach().to(grad.dtype).masked_fill(~mask, 0.0)
    query_w = w.sum(1) / mask.sum(1).clamp(min=1).to(grad.dtype)
    return grad * query_w[:, None], hess * query_w[:, None], loss * query_w


def torch_loss(objective, name: str = "loss") -> "TorchLoss | GradientObjective":
    """A custom loss for the neural rankers: a :class:`TorchLoss` (a :class:`ProbabilityLoss`
    included; plain autograd) or a :class:`GradientObjective` (its gradient injected by
    :class:`rankkit.neural.loss.LambdaLoss`); a numpy objective has no autograd."""
    obj = as_objective(objective, name=name)
    if isinstance(obj, NumpyObjective):
        raise ValueError(f"`{name}`: {qualified_name(obj.fn)} is a (y_true, y_pred, ...) numpy objective, which "
                         f"gives no autograd graph to train a neural ranker; write it as loss(scores, labels, mask)")
    return obj
