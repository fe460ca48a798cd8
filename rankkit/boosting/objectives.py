"""Per-document (grad, hess) of the booster's objectives, and its evaluation metrics.

Notation: N documents, Q queries, L padded list length.

The ranking objectives take their gradients from the one shared kernel,
:func:`rankkit.lambdas.lambda_gradients`: the booster only moves scores between the flat
[N] layout of the trees and the padded [Q, L] layout of the kernel, with an index computed
once per data set (:class:`QueryLayout`). The pointwise objective is MART's squared error
(Friedman, "Greedy Function Approximation: A Gradient Boosting Machine", 2001):
``C = ½ w (s − y)²``, grad ``w (s − y)``, hess ``w``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from rankkit.custom import NumpyObjective, TorchLoss, as_objective, fresh, qualified_name
from rankkit.data.dataset import padded_layout
from rankkit.lambdas import WEIGHTINGS, planned_lambda_gradients
from rankkit.lambdas.plan import QueryPlan
from rankkit.lambdas.weightings import _ndcg_plan_terms
from rankkit.losses import objective_gradients
from rankkit.metrics import planned_average_precision, planned_ndcg
from rankkit.objective import NAMES, ObjectiveSpec


class QueryLayout:
    """The flat [N] <-> padded [Q, L] map of one data set, built once.

    Args:
        labels: [N] float labels.
        sizes: [Q] documents per query (each query's documents contiguous).
        weights: [N] per-document weights or None.
        device: where the padded tensors live.
    """

    def __init__(self, labels: torch.Tensor, sizes: torch.Tensor, weights: torch.Tensor | None = None,
                 device: torch.device | str = "cpu"):
        rows, cols = padded_layout(sizes)
        # The flat layout's query bounds [Q + 1], for the compiled lambda pass.
        self.offsets = torch.cat([sizes.new_zeros(1), sizes.cumsum(0)]).long().cpu()
        length = int(sizes.max()) if len(sizes) else 0
        self.rows, self.cols = rows.to(device), cols.to(device)
        self.shape = (len(sizes), length)
        # Position of each document in the flattened [Q * L]; None when that is the identity
        # (every query has L documents), so that pad and flat are views.
        self.index = None if len(rows) == len(sizes) * length else self.rows * length + self.cols
        self.mask = torch.zeros(self.shape, dtype=torch.bool, device=device)
        self.mask[self.rows, self.cols] = True
        self.labels = self.pad(labels.to(device, torch.float32)).clone()  # never a view of the input
        self.weights = None if weights is None else self.pad(weights.to(device, torch.float32)).clone()
        # Everything the lambda kernel and the metrics keep about these queries, validated and
        # computed once (not every round).
        self.plan = QueryPlan(self.labels, self.mask, weights=self.weights)

    def pad(self, values: torch.Tensor) -> torch.Tensor:
        """[N] -> [Q, L], zero on padding."""
        if self.index is None:
            return values.reshape(self.shape)
        out = torch.zeros(self.shape, dtype=values.dtype, device=values.device)
        out.view(-1).index_copy_(0, self.index, values)
        return out

    def flat(self, values: torch.Tensor) -> torch.Tensor:
        """[Q, L] -> [N]."""
        if self.index is None:
            return values.reshape(-1)
        return values.reshape(-1).index_select(0, self.index)


class RankingObjective:
    """Gradients of a named ranking objective from :func:`rankkit.losses.objective_gradients`,
    the one gradient layer the neural rankers use too.

    Args:
        spec: the objective (:class:`rankkit.objective.ObjectiveSpec`): ``spec.name`` is a key of
            :data:`rankkit.losses.OBJECTIVES`, a pairwise weighting of the lambda kernel
            ("ranknet", "ndcg", "map", "err", the LambdaLoss family) or a listwise loss, and
            ``spec.kernel_options()`` the kernel's options (pairwise objectives only).
        seed: seeds the listwise losses that draw random numbers (XE-NDCG's γ, ListMLE's order
            among equal labels: without it ListMLE learns the documents' file order), once per fit.
        quantized_grad: compute in float64 and round the (grad, hess) to float32 values, so that a
            document's gradients do not depend on which other queries share the kernel call (the
            kernel's float32 sums follow its block plan): what makes data-parallel trees equal
            to one process's (the booster's ``quantized_grad``).
        propensity: an :class:`rankkit.clicks.propensity.PropensityEstimator` and the documents'
            displayed positions [N] (long), for Unbiased LambdaMART: every round first updates
            the propensities at the current scores, then weighs each pair (clicked i,
            unclicked j) by 1 / (t⁺(pos_i) t⁻(pos_j)) through the kernel's ``pair_weights``.
    """

    def __init__(self, spec: ObjectiveSpec, *, seed: int = 0, propensity=None, quantized_grad: bool = False):
        self.spec = spec
        self.name = spec.name
        self.pairwise = spec.pairwise
        self.weighting = WEIGHTINGS.get(self.name)
        self.options = spec.kernel_options()
        if self.name in ("xendcg", "listmle"):  # XE-NDCG's γ; ListMLE's random order among equal labels
            self.options["generator"] = torch.Generator().manual_seed(seed)
        self.propensity = propensity
        self.quantized_grad = quantized_grad

    def init_score(self, labels: torch.Tensor, weights: torch.Tensor | None, reduce=None) -> float:
        return 0.0  # a constant shift changes no ranking

    def gradients(self, scores: torch.Tensor, layout: QueryLayout, groups: torch.Tensor | None = None, *,
                  backend=None) -> tuple[torch.Tensor, torch.Tensor]:
        """scores [N] -> (grad, hess), each [N] float64, from the fit's ``backend``
        (:class:`rankkit.kernels.backends.Backend`; None: the torch path). ``groups`` [N] (e.g.
        leaf indices): leave out the pairs inside a group (see ``lambda_gradients``), on the
        torch path."""
        if groups is None and backend is not None:
            return backend.lambdas(self, scores, layout)
        return self.torch_gradients(scores, layout, groups=groups)

    def torch_gradients(self, scores: torch.Tensor, layout: QueryLayout, groups: torch.Tensor | None = None,
                        *, triton: bool | None = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(grad, hess) [N] float64 on the padded queries by the planned torch kernel (the
        reference), or its fused Triton version where ``triton`` and the options allow."""
        padded = layout.pad(scores.to(torch.float64 if self.quantized_grad else torch.float32))
        options = dict(self.options)
        if groups is not None:
            options["groups"] = layout.pad(groups)
        if self.propensity is not None:  # once per round (the exact-Newton pass reuses the round's factors)
            options["pair_weights"] = self._pair_weights(padded, layout, update=groups is None)
        if self.pairwise:  # the planned kernel, without the loss nobody reads
            grad, hess = planned_lambda_gradients(padded, layout.plan, weighting=self.weighting, triton=triton,
                                                  **options)
        else:
            grad, hess, _ = objective_gradients(self.name, padded, layout.labels, mask=layout.mask,
                                                weights=layout.weights, plan=layout.plan, **options)
        if self.quantized_grad:
            grad, hess = grad.float(), hess.float()
        return layout.flat(grad).double(), layout.flat(hess).double()

    def _pair_weights(self, padded: torch.Tensor, layout: QueryLayout, *, update: bool = True):
        """The click log's pair weights (upper, lower) [Q, L] at the ``padded`` scores, the
        propensities first updated at them (Unbiased LambdaMART's once-per-round step)."""
        estimator, positions = self.propensity
        pos = layout.pad(positions)
        if update:
            estimator.update(padded, layout.labels, pos, layout.mask)
        return estimator.pair_factors(pos, layout.mask)

    def flat_pair_factors(self, scores: torch.Tensor, layout: QueryLayout, *, costs: torch.Tensor | None = None):
        """The compiled pass's ``pair_factors`` (flat float64 [N] each) of this round, or None
        without a click-log debiasing: the torch path's factors, the biases first updated at the
        same padded scores, or by ``costs`` (the round's [P, P] pair costs of
        :meth:`flat_cost_inputs`, computed by the caller) where given."""
        if self.propensity is None:
            return None
        if costs is None:
            padded = layout.pad(scores.to(torch.float64 if self.quantized_grad else torch.float32))
            return tuple(layout.flat(t).double().contiguous() for t in self._pair_weights(padded, layout))
        estimator, positions = self.propensity
        upper, lower = estimator.add_costs(costs).step().pair_factors(positions[None])
        return upper[0].double().contiguous(), lower[0].double().contiguous()

    def flat_cost_inputs(self, layout: QueryLayout) -> dict | None:
        """The arguments of the compiled pair-cost pass (:func:`rankkit.kernels.cpu.position_costs`)
        that updates Unbiased LambdaMART's biases each round, built once per data set; None where
        the round's biases do not come from pair costs (no click log, or fixed propensities)."""
        if self.propensity is None or not self.propensity[0].learns:
            return None
        estimator, positions = self.propensity
        n_docs = layout.shape[1]
        cutoff = n_docs if estimator.k is None else min(estimator.k, n_docs)
        inputs = flat_ndcg_inputs(layout, self.options["k"], self.options["gain"])
        bucket = layout.plan.cached(("compiled_buckets", estimator.n_positions),
                                    lambda: positions.clamp(0, estimator.n_positions - 1).long().contiguous())
        return dict(clicks=inputs["labels"], bucket=bucket, offsets=layout.offsets, n_positions=estimator.n_positions,
                    cutoff=cutoff, max_len=n_docs, sigma=estimator.sigma, ndcg=estimator.weighting == "ndcg",
                    float32_scores=not self.quantized_grad, order=inputs["order"])

    def flat_lambda_inputs(self, layout: QueryLayout, *, pair_factors: bool = False) -> dict | None:
        """The arguments of the compiled lambda pass (:func:`rankkit.kernels.cpu.lambdas`) on
        ``layout``'s flat queries, built once per data set; None where that pass does not
        compute this objective (weightings other than RankNet and NDCG; propensity weights,
        unless the caller passes :meth:`flat_pair_factors` each round: ``pair_factors``).

        The pass computes the torch path's numbers in float64 (from the scores' float32 values
        unless ``quantized_grad``) and rounds them to float32 values: with ``quantized_grad``
        the same bits as the torch path; otherwise within float32
        roundings of it, which can decide a near-tie split differently from a GPU's."""
        if not self.pairwise or (self.propensity is not None and not pair_factors) or \
                self.weighting not in (WEIGHTINGS["ranknet"], WEIGHTINGS["ndcg"]):
            return None
        o = self.options
        inputs = flat_ndcg_inputs(layout, o["k"], o["gain"])
        if self.weighting is not WEIGHTINGS["ndcg"]:
            inputs["gains"] = None  # RankNet: |ΔZ| = 1
        half_w = None
        if layout.weights is not None:
            half_w = layout.plan.cached(("compiled_half_weights",),
                                        lambda: layout.flat(layout.weights.double() * 0.5).contiguous())
        return dict(inputs, sigma=o["sigma"], normalize=o["normalize"], half_weights=half_w,
                    float32_scores=not self.quantized_grad, float32_out=True)


@dataclass(frozen=True)
class SquaredError:
    """Pointwise regression on the labels (plain MART)."""

    def init_score(self, labels: torch.Tensor, weights: torch.Tensor | None, reduce=None) -> float:
        """The weighted label mean (over every rank's documents, through ``reduce``)."""
        w = torch.ones_like(labels, dtype=torch.float64) if weights is None else weights.double()
        sums = torch.stack([(w * labels.double()).sum(), w.sum()])
        if reduce is not None:
            sums = reduce(sums)
        return float(sums[0] / sums[1].clamp_min(1e-300))

    def gradients(self, scores: torch.Tensor, layout: QueryLayout, *, backend=None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        y = layout.flat(layout.labels).double()
        w = torch.ones_like(y) if layout.weights is None else layout.flat(layout.weights).double()
        return w * (scores.double() - y), w


class CustomObjective:
    """A user's objective (:mod:`rankkit.custom`) on the booster's flat scores: a torch loss
    differentiated by autograd (grad and the diagonal Hessian of ``hessian``) on the padded
    queries, or a LightGBM-style numpy callable on the flat arrays.

    Args:
        objective: a callable, a :mod:`rankkit.custom` wrapper, or ``package.module.function``
            (imported here, when training starts).
        hessian: ``"exact"``, ``"gauss-newton"`` or ``"constant"`` (torch losses).
    """

    def __init__(self, objective, hessian: str = "exact"):
        self.loss = fresh(as_objective(objective, hessian))  # the user's object is not changed by a fit
        self.name = _custom_name(objective)

    def init_score(self, labels: torch.Tensor, weights: torch.Tensor | None, reduce=None) -> float:
        return 0.0

    def gradients(self, scores: torch.Tensor, layout: QueryLayout, groups: torch.Tensor | None = None, *,
                  backend=None) -> tuple[torch.Tensor, torch.Tensor]:
        """scores [N] -> (grad, hess) [N] float64 (any backend: the user's code runs on torch)."""
        if isinstance(self.loss, NumpyObjective):
            sizes = (layout.offsets[1:] - layout.offsets[:-1])
            weights = None if layout.weights is None else layout.flat(layout.weights)
            return self.loss.flat_gradients(layout.flat(layout.labels), scores, sizes, weights)
        options = {"with_loss": False} if isinstance(self.loss, TorchLoss) else {}  # the booster reads no loss
        grad, hess, _ = self.loss.gradients(layout.pad(scores.double()), layout.labels, layout.mask,
                                            weights=layout.weights, **options)  # TorchLoss or GradientObjective
        return layout.flat(grad), layout.flat(hess)


def _custom_name(objective) -> str:
    return qualified_name(objective)


def make_objective(spec: ObjectiveSpec, *, custom_loss=None, propensity=None, seed: int = 0,
                   quantized_grad: bool = False) -> RankingObjective | SquaredError | CustomObjective:
    """The booster's gradients of ``spec`` (:func:`rankkit.objective.objective_spec`): a
    :class:`RankingObjective` of ``spec.name``, the squared error of ``"pointwise"`` (which
    ignores the ranking options), or a custom loss, ``custom_loss`` itself (None: import
    ``spec.objective`` by name), as a :class:`CustomObjective` with the Hessian ``spec.hessian``.
    ``propensity``, ``seed`` and ``quantized_grad`` are the fit's (:class:`RankingObjective`)."""
    if spec.custom:
        return CustomObjective(spec.objective if custom_loss is None else custom_loss, spec.hessian)
    if spec.objective == "pointwise":
        return SquaredError()
    return RankingObjective(spec, propensity=propensity, seed=seed, quantized_grad=quantized_grad)


def make_metric(name: str, *, reduce=None) -> Callable[[torch.Tensor, QueryLayout], torch.Tensor]:
    """``"ndcg@k"``, ``"ndcg"``, ``"map@k"`` or ``"map"`` as ``(scores [N], layout) -> mean``,
    the mean a float64 0-dim tensor on the scores' device (no host synchronisation: the engine
    copies it with the round's tree).

    NDCG uses the exp gain; queries with nothing to find count as 1 (``empty=1.0``, as
    LightGBM and the MQ2008 anchors). The metric runs on the layout's
    :class:`~rankkit.lambdas.plan.QueryPlan` (ideal DCG computed once). ``reduce`` (data-parallel):
    the mean over every rank's queries, from all-reduced sums.
    """
    base, _, cut = name.partition("@")
    if base not in ("ndcg", "map") or (cut and not cut.isdigit()) or cut == "0":
        raise ValueError(f"`eval_metric` has to look like 'ndcg@10', 'ndcg', 'map@10' or 'map', got {name!r}")
    k = int(cut) if cut else None
    fn = planned_ndcg if base == "ndcg" else planned_average_precision

    def metric(scores: torch.Tensor, layout: QueryLayout) -> torch.Tensor:
        values = fn(layout.pad(scores.to(torch.float32)), layout.plan, k=k, empty=1.0)
        if reduce is None:
            return values.double().mean()
        sums = reduce(torch.stack([values.double().sum(), torch.full((), float(len(values)), dtype=torch.float64,
                                                                       device=values.device)]))
        return sums[0] / sums[1]

    # What a backend needs to compute this metric its own way (Backend.eval_metric): its kind,
    # cutoff, gain, empty value, reduction point (data-parallel: the sums cross the ranks) and
    # the flat inputs of a layout.
    metric.kind, metric.k, metric.gain, metric.empty, metric.reduce = base, k, "exp", 1.0, reduce
    metric.flat_inputs = lambda layout: flat_ndcg_inputs(layout, k, "exp")
    return metric


def flat_ndcg_inputs(layout: QueryLayout, k: int | None, gain: str = "exp") -> dict:
    """The flat queries of ``layout`` as the compiled lambda pass and NDCG read them
    (:func:`rankkit.kernels.cpu.lambdas`, :func:`rankkit.kernels.cpu.ndcg_mean`), built once per
    data set (cached on its plan): labels and each document's gain over its query's ideal
    DCG@cutoff [N] float64, the query bounds, the cutoff, the longest query, and the buffer of
    the last ranking each call's sort starts from."""
    n_docs = layout.shape[1]
    cutoff = n_docs if k is None else min(k, n_docs)

    def make():  # what does not change during a fit, flat and in float64
        plan = layout.plan
        labels = plan.labels.detach().double().masked_fill(~plan.mask, 0.0)
        (g,), _ = _ndcg_plan_terms(labels, plan.mask, cutoff, gain, None)
        order = torch.arange(int(layout.offsets[-1]), dtype=torch.int64)
        return layout.flat(labels).contiguous(), layout.flat(g).contiguous(), order

    labels, gains, order = layout.plan.cached(("compiled_ndcg", cutoff, gain), make)
    return dict(labels=labels, gains=gains, offsets=layout.offsets, cutoff=cutoff, max_len=n_docs, order=order)


#: Every objective the booster takes (:data:`rankkit.objective.NAMES`).
OBJECTIVES = NAMES
