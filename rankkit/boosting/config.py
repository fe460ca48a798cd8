"""The booster's hyper-parameters, declared once: default, range and docstring.

:class:`BoosterConfig` is the declaration. :class:`rankkit.boosting.LambdaMART` (the
scikit-learn estimator), :class:`rankkit.boosting.LambdaMARTModule` (the LightningModule), the
``rankkit fit`` command line (LightningCLI reads the module's signature and docstring) and
``configs/lambdamart.yaml`` (checked against it by the tests) all derive from it; see
:mod:`rankkit.infra.params`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from functools import partial
from typing import Any

from rankkit.boosting.binning import MAX_BINS
from rankkit.boosting.objectives import OBJECTIVES, make_metric
from rankkit.boosting.tree import TreeParams
from rankkit.clicks.propensity import check_clip
from rankkit.custom import HESSIANS, check_spec, is_custom
from rankkit.infra import checks as _checks
from rankkit.infra.params import check_all, hyperparameter
from rankkit.objective import ObjectiveSpec
from rankkit.objective import objective_spec as _spec

# The debiasing of click data (see ``unbiased``): none, Unbiased LambdaMART's learned pair biases,
# LightGBM's additive position bias, inverse propensities by regression-EM, or the choice among
# them on a validation click log.
UNBIASED = (False, True, "position", "ips", "auto")

_int = _checks.check_int
_number = _checks.check_number


def _positive(value, name):
    return _number(value, name, low=0, low_open=True)


def _non_negative(value, name):
    return _number(value, name, low=0)


def _fraction(value, name):
    return _number(value, name, low=0, high=1, low_open=True)


#: The built-in lambda kernel's options: a custom objective takes its own, and refuses these.
KERNEL_OPTIONS = ("k", "sigma", "gain", "normalize")


@dataclass(frozen=True)
class BoosterConfig:
    """Every hyper-parameter of a boosting run (the declaration the front ends derive from)."""

    objective: Any = hyperparameter("lambdarank", """
        ``"lambdarank"`` (|ΔZ| of ``weighting``, truncation ``k``), ``"ranknet"``,
        ``"pointwise"`` (squared error on the labels), any other name of
        :data:`rankkit.losses.OBJECTIVES` (``"softmax"``, ``"xendcg"``, ...), or a custom
        objective (:mod:`rankkit.custom`): a differentiable torch loss
        ``loss(scores, labels, mask) -> [Q]`` over padded queries, a LightGBM/XGBoost style
        ``f(y_true, y_pred[, weight][, group]) -> (grad, hess)`` on numpy arrays, or the text
        ``"package.module.function"`` naming one (imported when training starts). A saved model
        or checkpoint records a custom objective's qualified name as text, never the code.""")
    hessian: str = hyperparameter("exact", """
        the Newton weights of a custom torch loss: ``"exact"`` (the diagonal of its Hessian by
        forward-over-reverse autograd), ``"gauss-newton"`` (a :class:`rankkit.custom.ProbabilityLoss`)
        or ``"constant"`` (first-order boosting). Built-in objectives have their own (leave it at
        ``"exact"``).""")
    depth: int = hyperparameter(6, "D, levels of every oblivious tree (2^D leaves).",
                                check=partial(_int, low=1, high=12))
    learning_rate: float = hyperparameter(0.1, "η, the shrinkage of each leaf.", check=_positive)
    l2: float = hyperparameter(1.0, "λ, the L2 penalty added to every hessian sum.", check=_non_negative)
    min_data_in_leaf: int = hyperparameter(20, "no split leaves a non-empty child with fewer documents.",
                                           check=partial(_int, low=1))
    min_sum_hessian: float = hyperparameter(1e-3, """
        nor with a smaller hessian sum; a leaf whose ΣH + λ is below it gets 0.""", check=_non_negative)
    weighting: str = hyperparameter("ndcg", """
        |ΔZ| of ``objective="lambdarank"``: ``"ndcg"``, ``"map"``, ``"err"``, ``"ranknet"``
        (:func:`rankkit.lambdas.lambda_gradients`).""")
    k: int | None = hyperparameter(None, "the truncation of the lambda kernel (None: every pair).",
                                   check=_checks.check_k)
    sigma: float = hyperparameter(1.0, "σ of the logistic of the lambda kernel.", check=_positive)
    gain: str = hyperparameter("exp", "the NDCG gain: ``\"exp\"`` (2^rel − 1) or ``\"linear\"`` (rel).",
                               check=_checks.check_gain)
    normalize: bool = hyperparameter(False, "LightGBM's per-query lambda normalisation.",
                                     check=_checks.check_bool)
    subsample: float = hyperparameter(1.0, "fraction of queries drawn (without replacement) for each tree.",
                                      check=_fraction)
    colsample: float = hyperparameter(1.0, "fraction of the (non-constant) features drawn for each tree.",
                                      check=_fraction)
    bagging_temperature: float = hyperparameter(0.0, """
        CatBoost's Bayesian bootstrap, per query: each tree multiplies the gradients and
        hessians of every query by its own weight ``(-log U)^T``, U uniform on (0, 1] (mean 1 at
        T = 1; 0 turns it off, larger T bags harder). Combines with ``subsample``.""", check=_non_negative)
    random_strength: float = hyperparameter(0.0, """
        CatBoost's split-score noise: each level of each tree picks the split that maximises
        score + N(0, sd²) over the allowed candidates, sd = random_strength × Σg²/Σh (the score a
        split on pure noise gains) × m/(1 + m), m = N e^{−trees × η}, so the noise fades as the
        model grows (see :func:`rankkit.boosting.engine.random_strength_sd`). 0 (the default)
        turns it off.""", check=_non_negative)
    exact_newton: bool = hyperparameter(False, """
        the leaves' Newton steps use the exact second derivative of the pairwise loss in the
        leaf value: pairs whose two documents fall in the same leaf move together and leave
        that leaf's ΣH (Tunys, "LambdaMART Demystified", 2015, appendix, shows that the usual ΣH
        is exact only when no leaf holds two documents of one query). The split search is
        unchanged; one more pass of the lambda kernel per round. Off by default (Burges' and
        LightGBM's ΣH).""", check=_checks.check_bool)
    quantized_grad: bool = hyperparameter(False, """
        search the splits on histograms of gradients and hessians rounded stochastically to
        small integers (LightGBM 4's ``use_quantized_grad``): integer sums, exact and
        independent of thread count and summation order; on the CPU each document's (g, h, 1)
        is one 64-bit add to a packed cell, faster on large sets (1.2M rows: 8.1 s against 9.0
        a 30-round fit) and slower on small ones (MQ2008: 2.36 against 1.99 ms a round: the
        rounding and the packed cells' unpacking per node); the leaf values still use the
        full-precision sums. Off by default (see docs/benchmarks.md for its effect on MQ2008
        and its speed).""", check=_checks.check_bool)
    num_grad_quant_bins: int = hyperparameter(4, """
        B, the integer levels of the quantized gradients (g in −B/2..B/2, hessians in 0..B).""",
        check=partial(_int, low=2, high=256))
    max_bins: int = hyperparameter(MAX_BINS, "codes per feature, including the missing-value bin (<= 255).",
                                   check=partial(_int, low=3, high=MAX_BINS))
    eval_metric: str = hyperparameter("ndcg@10", """
        ``"ndcg@k"``, ``"ndcg"``, ``"map@k"`` or ``"map"`` for ``eval_set``.""",
        check=lambda value, name: make_metric(value), module=False)
    early_stopping_rounds: int | None = hyperparameter(None, """
        stop when the metric on the **last** eval set has not improved for this many rounds,
        and keep the trees up to the best round; None to run all (the Lightning module:
        Lightning's EarlyStopping).""", check=partial(_int, low=1, none=True), module=False)
    early_stopping_window: int = hyperparameter(1, """
        w: early stopping and the best round read the last eval set's metric as a trailing mean
        over w rounds, so that one lucky round on a small validation set is not the one kept;
        the best round is the centre of the best window (the window's rounds counted up to the
        current one), and the patience counts from its end. 1 (default): the raw metric,
        LightGBM's and XGBoost's rule (the Lightning module:
        :class:`rankkit.training.callbacks.SmoothedMetric`).""",
        check=partial(_int, low=1), module=False)
    seed: int = hyperparameter(0, """
        seeds the binning sample and the row/feature subsampling; the same seed and data give
        the same model.""", check=partial(_int, low=0))
    unbiased: bool | str = hyperparameter(False, """
        learning from clicks: ``y`` are clicks (0/1), a query is a session, and ``fit`` takes
        each document's displayed ``position``. One of:

        * False: clicks as labels (naive);
        * True: Unbiased LambdaMART (Hu, Wang, Peng, Li, "Unbiased LambdaMART: An Unbiased
          Pairwise Learning-to-Rank Algorithm", WWW 2019): position biases of clicked (t⁺) and
          unclicked (t⁻) positions estimated jointly with the trees (every round, at the current
          scores), each pair (clicked i, unclicked j) weighing 1 / (t⁺(pos_i) t⁻(pos_j)) (see
          :mod:`rankkit.clicks.propensity`);
        * ``"position"``: an additive position bias b learned jointly with the trees, as
          LightGBM's ``Dataset(position=...)``: the lambdas are taken at s + b[pos], and b takes
          a Newton step per round; ``predict`` leaves it out;
        * ``"ips"``: examination probabilities θ̂ by regression-EM on the training log (Wang,
          Golbandi, Bendersky, Metzler, Najork, "Position Bias Estimation for Unbiased Learning
          to Rank in Personal Search", WSDM 2018; its impressions aggregated per document and
          position, documents told apart by their features), then each pair (clicked i,
          unclicked j) weighs min(θ̂₀/θ̂(pos_i), ``propensity_clip``);
        * ``"auto"``: the choice among naive, Unbiased LambdaMART at p = 1, ``"position"``,
          ``"ips"`` (``TREE_CANDIDATES``) and ``"position+ips"``, the mean of those two's scores
          (``TREE_BLENDS``; a winning blend grows both to their own stops, and the model holds
          both halves' trees; ``best_score_`` is then None and ``evals_result_`` holds each
          part's curve as ``"position valid_0"``, ...), inside this one ``fit``, by how well
          each explains a **validation click log** (the first ``eval_set``, its sessions from
          ``eval_qid`` / ``eval_group``, and ``eval_position``) once every position has its own click offset
          (:class:`rankkit.clicks.metrics.ClickLikelihood`, which assumes no click model). No true
          label is read. The candidates race by successive halving: all grow a third of
          ``n_estimators``, the best two two thirds, the best one the rest (the rounds of
          (C + 3) / 3 fits for the C = 4 runs: 2.33, and up to 3 when the blend reaches the second
          stage beside a run outside it). Each candidate
          stops early as a plain fit does and is scored at the trees it keeps; with
          ``early_stopping_rounds`` = E the stages end at E/3 and 2E/3 rounds (rounded up) when
          that is fewer
          (:func:`rankkit.clicks.race.race_rounds`). ``unbiased_choice_`` says which won,
          ``unbiased_scores_`` what each scored at its last stage (and which stage that was).

        The pairwise choices (True, ``"ips"``, ``"auto"``) need a pairwise objective.
        ``LambdaMARTModule`` (``rankkit fit``) trains False, True, ``"position"`` or ``"ips"`` on
        the training click log's positions (``RankingDataModule(click_log=True)``); the race
        is ``LambdaMART``'s.""",
        check=lambda value, name: _checks.check_setting(value, UNBIASED, name))
    bias_p: float = hyperparameter(1.0, """
        p, the exponent of the propensities' regularisation with ``unbiased=True`` (the update
        takes the 1/(p + 1)-th power; 0 is unregularised).""", check=_non_negative)
    n_positions: int = hyperparameter(10, """
        distinct displayed positions with their own propensity or bias. ``position`` holds ids as
        LightGBM reads them (0- or 1-based, sparse: :class:`rankkit.clicks.propensity.PositionIds`); more
        distinct ids than this are refused unless ``pool_positions``.""",
        check=partial(_int, low=1, high=4096))  # rankkit.clicks.propensity.MAX_POSITIONS
    pool_positions: bool = hyperparameter(False, """
        let the position ids from the ``n_positions``-th on (in increasing order) share the last
        propensity or bias, instead of refusing a log with more distinct ids.""",
        check=_checks.check_bool)
    position_bias_regularization: float = hyperparameter(0.0, """
        λ ≥ 0, the L2 penalty of ``unbiased="position"``'s bias (LightGBM's
        ``lambdarank_position_bias_regularization``).""", check=_non_negative)
    propensity_clip: float | str | None = hyperparameter("auto", """
        the bound on θ̂₀/θ̂ of ``unbiased="ips"`` (≥ 1; None: none); ``"auto"``: 3 √r, r the
        largest θ̂₀/θ̂ at a position the training log has a click at
        (:func:`rankkit.clicks.propensity.auto_clip`: about 10 at examination 1/rank, 30 at 1/rank²,
        no clip below r = 9).""", check=check_clip)

    @classmethod
    def from_params(cls, params: dict) -> BoosterConfig:
        """The config of the names in ``params`` that it knows (others are ignored), checked."""
        names = {f.name for f in fields(cls)}
        config = cls(**{k: v for k, v in params.items() if k in names})
        config.check()
        return config

    def check(self) -> None:
        """Raise ValueError naming the first hyper-parameter out of its range, then the first
        combination that cannot work together."""
        custom = is_custom(self.objective)
        if custom:
            check_spec(self.objective, "objective", OBJECTIVES)
        else:
            _checks.check_choice(self.objective, OBJECTIVES, "objective")
        _checks.check_choice(self.hessian, HESSIANS, "hessian")
        if not custom and self.hessian != "exact":
            raise ValueError(f"`hessian` applies to custom objectives (a callable loss); objective="
                             f"{self.objective!r} has its own hessian, got hessian={self.hessian!r}")
        if custom:  # the ranking options configure the built-in kernel: a custom loss would drop them
            for option in KERNEL_OPTIONS:
                if getattr(self, option) != getattr(BoosterConfig, option):
                    raise ValueError(f"`{option}` configures the built-in lambda kernel; a custom objective takes its "
                                     f"own (set it in the loss), got {option}={getattr(self, option)!r}")
        if custom and (self.exact_newton or self.unbiased):
            raise ValueError(f"`{'exact_newton' if self.exact_newton else 'unbiased'}` needs a built-in pairwise "
                             f"objective (it reweighs the lambda kernel's pairs), not a custom one")
        check_all(self)
        if self.objective != "lambdarank" and self.weighting != BoosterConfig.weighting:
            # Only "lambdarank" reads `weighting`; any other objective would drop it silently.
            raise ValueError(f"`weighting` applies to objective='lambdarank' only; objective="
                             f"{self.objective!r} has its own weighting, got weighting={self.weighting!r}")
        if self.exact_newton and self.objective == "pointwise":
            raise ValueError("`exact_newton` applies to the pairwise objectives; the pointwise "
                             "objective's Newton steps are exact already")
        if self.unbiased in (True, "ips", "auto") and not custom and not self.objective_spec.pairwise:
            raise ValueError(f"`unbiased={self.unbiased!r}` debiases pairs: it needs a pairwise objective, "
                             f"got {self.objective_spec.name!r}")
        if not custom:  # a custom objective is imported and checked when training starts, not here
            self.objective_spec  # noqa: B018 -- the spec's own check of the names

    @property
    def objective_spec(self) -> ObjectiveSpec:
        """The objective and its options as one frozen value (what the engine builds its gradients from)."""
        return _spec(self.objective, weighting=self.weighting, sigma=self.sigma, k=self.k,
                     normalize=self.normalize, gain=self.gain, hessian=self.hessian)

    @property
    def tree(self) -> TreeParams:
        return TreeParams(self.depth, self.learning_rate, self.l2, self.min_data_in_leaf, self.min_sum_hessian,
                          self.quantized_grad, self.num_grad_quant_bins)

    def as_dict(self) -> dict:
        return asdict(self)
