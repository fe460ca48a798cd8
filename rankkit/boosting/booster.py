"""LambdaMART: gradient-boosted oblivious trees on lambda gradients, as a scikit-learn estimator.

Notation: N documents, Q queries, F features, T trees, D depth.

The estimator validates its input and drives one :class:`~rankkit.boosting.engine.BoostingEngine`
(the rounds, the eval sets and early stopping live there, shared with
:class:`rankkit.boosting.LambdaMARTModule`). F_0 is a constant (0 for the ranking objectives,
the label mean for the pointwise one) plus the optional per-document ``init_score`` -- the
scores of a base model, as in Burges' algorithm (Burges, "From RankNet to LambdaRank to
LambdaMART: An Overview", 2010). With the pointwise objective, depth 1 and η = 1, this is
MART's textbook example: F_0 = 42/17 ≈ 2.471, leaves −1.027 and +1.154.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, fields, replace
from functools import partial, wraps
from typing import Any, Sequence

import numpy as np
import torch
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from rankkit.boosting._inputs import FeatureMatrix, query_sizes, vector
from rankkit.boosting.config import BoosterConfig
from rankkit.boosting.engine import BoostingEngine
from rankkit.boosting.ensemble import ObliviousEnsemble, averaged
from rankkit.clicks.metrics import ClickLikelihood
from rankkit.clicks.propensity import PositionIds
from rankkit.clicks.race import TREE_BLENDS, TREE_CANDIDATES, SuccessiveHalving, race_rounds
from rankkit.custom import RecordedName, is_custom, qualified_name
from rankkit.data.dataset import RankingDataset, pad
from rankkit.infra import checks as _checks
from rankkit.infra.io import atomic_write
from rankkit.infra.params import check_all, declared, hyperparameter, with_args
from rankkit.infra.threads import resolve_n_jobs, threads
from rankkit.metrics import ndcg

_FORMAT = "rankkit.LambdaMART/1"

# scikit-learn's estimator checks that LambdaMART cannot pass, and why (pass it as
# ``check_estimator(LambdaMART(), expected_failed_checks=SKLEARN_EXPECTED_FAILED_CHECKS)``). Each
# calls ``fit(X, y)`` with no query information, which a ranker refuses (XGBoost's rule: it
# would otherwise guess that every document belongs to one query). tests/boosting/test_booster_sklearn.py runs
# every one of them on a subclass that makes ``fit(X, y)`` one query, and they all pass there.
_NEEDS_QUERIES = "calls fit(X, y) without qid or group, which LambdaMART refuses (a ranker needs its queries)"
SKLEARN_EXPECTED_FAILED_CHECKS: dict[str, str] = {name: _NEEDS_QUERIES for name in (
    "check_all_zero_sample_weights_error",
    "check_dict_unchanged",
    "check_dont_overwrite_parameters",
    "check_dtype_object",
    "check_estimator_sparse_array",
    "check_estimator_sparse_matrix",
    "check_estimator_sparse_tag",
    "check_estimators_dtypes",
    "check_estimators_fit_returns_self",
    "check_estimators_overwrite_params",
    "check_estimators_pickle",
    "check_f_contiguous_array_estimator",
    "check_fit2d_1feature",
    "check_fit2d_1sample",
    "check_fit2d_predict1d",
    "check_fit_check_is_fitted",
    "check_fit_idempotent",
    "check_fit_score_takes_y",
    "check_methods_sample_order_invariance",
    "check_methods_subset_invariance",
    "check_n_features_in",
    "check_n_features_in_after_fitting",
    "check_pipeline_consistency",
    "check_positive_only_tag_during_fit",
    "check_readonly_memmap_input",
    "check_sample_weight_equivalence_on_dense_data",
    "check_sample_weight_equivalence_on_sparse_data",
    "check_sample_weights_list",
    "check_sample_weights_not_an_array",
    "check_sample_weights_not_overwritten",
    "check_sample_weights_pandas_series",
    "check_sample_weights_shape",
)}


@dataclass(frozen=True)
class EstimatorOptions:
    """The estimator's hyper-parameters beyond the run's (:class:`BoosterConfig`)."""

    n_estimators: int = hyperparameter(100, "the maximum number of rounds (trees).",
                                       check=partial(_checks.check_int, low=1), module=False)
    device: str = hyperparameter("cpu", "where the trees are grown (``\"cpu\"``, ``\"cuda\"``).", module=False)
    verbose: int = hyperparameter(0, "> 0 shows a tqdm progress bar over the rounds with the eval metrics "
                                     "(0: silent).", check=partial(_checks.check_int, low=0), module=False)
    n_jobs: int | None = hyperparameter(None, """
        threads of ``fit`` and ``predict`` (scikit-learn's spelling): None keeps torch's setting
        (``torch.get_num_threads()``) and gives threads up while other processes keep them
        waiting for a core (:class:`rankkit.infra.threads.ThreadGovernor`; the model does not
        depend on the count), -1 every available core, -k all but k - 1 (both kept fixed); the
        previous count is restored afterwards (:func:`rankkit.infra.threads.threads`).""",
        check=lambda value, name: resolve_n_jobs(value, name), module=False)
    random_state: int | None = hyperparameter(None, """
        scikit-learn's spelling of ``seed``: an integer >= 0 is the seed (None: ``seed`` decides).
        Give one of the two; both, different, is refused.""",
        check=partial(_checks.check_int, low=0, none=True), module=False)


#: LambdaMART's hyper-parameters, in the order of its signature and docstring.
PARAMS = declared(BoosterConfig)[:1] + declared(EstimatorOptions)[:1] + declared(BoosterConfig)[1:] + \
    declared(EstimatorOptions)[1:]


def _on_threads(method):
    """Run an estimator method on ``self.n_jobs`` threads (see :func:`rankkit.infra.threads.threads`)."""
    @wraps(method)
    def run(self, *args, **kwargs):
        with threads(self.n_jobs):
            return method(self, *args, **kwargs)
    return run


#: The most features a model file may declare (the LETOR reader's MAX_FEATURES): scoring pads
#: every input to this width, so a file cannot make a scorer allocate more.
MAX_MODEL_FEATURES = 1_000_000


class LambdaMART(BaseEstimator):
    """Gradient-boosted oblivious trees for ranking (LambdaMART), CPU or CUDA.

    Args:
        {params}

    Attributes (after :meth:`fit`; learned state ends in ``_``):
        ensemble_: the :class:`ObliviousEnsemble` (raw features [N, F] -> scores [N]).
        n_features_in_: F.
        feature_names_in_: [F] the column names of a DataFrame ``X`` (absent otherwise).
        best_iteration_: 0-based index of the best round (the model keeps best_iteration_ + 1
            trees); the last round without an eval set. For the blend ``unbiased="auto"`` may
            keep, the trees of both parts it holds, minus 1.
        best_score_: the best eval metric, or None.
        evals_result_: ``{"valid_0": {"ndcg@10": [...]}, ...}``, one value per round.
        backend_: the kernels that grew the trees, chosen once per fit by
            :func:`rankkit.kernels.backends.choose`: ``"cpu"`` (compiled), ``"triton"`` or ``"torch"``.
        feature_importances_: [F] numpy, the total split gain per feature, normalised to sum 1.
        propensities_: with ``unbiased=True`` or ``"ips"``, ``{"clicked": t⁺ [n_positions],
            "unclicked": t⁻ [n_positions]}`` (numpy, position 0 = 1), the position biases (with
            ``"ips"``: θ̂ and ones).
        propensity_clip_: with ``"ips"``, the bound on θ̂₀/θ̂ the fit applied (a float; the one
            ``propensity_clip="auto"`` chose from the training log), or None for no bound.
        position_bias_: with ``unbiased="position"``, the learned additive bias [n_positions]
            (numpy) of the scores at each position.
        position_ids_: with ``unbiased`` set, the distinct position ids of ``fit``'s
            ``position`` in increasing order (numpy int64); the i-th has the i-th propensity or
            bias (:class:`rankkit.clicks.propensity.PositionIds`).
        unbiased_choice_: with ``unbiased="auto"``, the debiasing chosen (``"naive"``,
            ``"pairwise p=1"``, ``"position"``, ``"ips"`` or the blend ``"position+ips"``);
            ``unbiased_scores_``: ``{candidate: {"score": the validation log's click
            log-likelihood per row, "stage": 1 or 2, "trees": the trees scored}}`` at the last
            stage each candidate reached (compare scores of one stage only).
        feature_importance_gain_, feature_importance_split_: [F] numpy, total gain and number
            of splits per feature.

    >>> from rankkit.data import make_synthetic
    >>> train = make_synthetic(20, 10, 5, seed=0)
    >>> model = LambdaMART(n_estimators=5, depth=2, min_data_in_leaf=5).fit(train)
    >>> model.predict(train).shape
    (200,)
    """

    # Written out, as scikit-learn's estimators are: the parameters of BoosterConfig and
    # EstimatorOptions in PARAMS's order (tests/infra/test_params.py compares them), stored
    # as given; fit checks them.
    def __init__(self, objective: Any = "lambdarank", *, n_estimators: int = 100, hessian: str = "exact",
                 depth: int = 6, learning_rate: float = 0.1, l2: float = 1.0, min_data_in_leaf: int = 20,
                 min_sum_hessian: float = 0.001, weighting: str = "ndcg", k: int | None = None, sigma: float = 1.0,
                 gain: str = "exp", normalize: bool = False, subsample: float = 1.0, colsample: float = 1.0,
                 bagging_temperature: float = 0.0, random_strength: float = 0.0, exact_newton: bool = False,
                 quantized_grad: bool = False, num_grad_quant_bins: int = 4, max_bins: int = 255,
                 eval_metric: str = "ndcg@10", early_stopping_rounds: int | None = None, early_stopping_window: int = 1,
                 seed: int = 0, unbiased: bool | str = False, bias_p: float = 1.0, n_positions: int = 10,
                 pool_positions: bool = False, position_bias_regularization: float = 0.0,
                 propensity_clip: float | str | None = "auto", device: str = "cpu", verbose: int = 0,
                 n_jobs: int | None = None, random_state: int | None = None) -> None:
        self.objective = objective
        self.n_estimators = n_estimators
        self.hessian = hessian
        self.depth = depth
        self.learning_rate = learning_rate
        self.l2 = l2
        self.min_data_in_leaf = min_data_in_leaf
        self.min_sum_hessian = min_sum_hessian
        self.weighting = weighting
        self.k = k
        self.sigma = sigma
        self.gain = gain
        self.normalize = normalize
        self.subsample = subsample
        self.colsample = colsample
        self.bagging_temperature = bagging_temperature
        self.random_strength = random_strength
        self.exact_newton = exact_newton
        self.quantized_grad = quantized_grad
        self.num_grad_quant_bins = num_grad_quant_bins
        self.max_bins = max_bins
        self.eval_metric = eval_metric
        self.early_stopping_rounds = early_stopping_rounds
        self.early_stopping_window = early_stopping_window
        self.seed = seed
        self.unbiased = unbiased
        self.bias_p = bias_p
        self.n_positions = n_positions
        self.pool_positions = pool_positions
        self.position_bias_regularization = position_bias_regularization
        self.propensity_clip = propensity_clip
        self.device = device
        self.verbose = verbose
        self.n_jobs = n_jobs
        self.random_state = random_state


    # -- fitting ------------------------------------------------------------------------------
    @_on_threads
    def fit(self, X, y=None, *, qid=None, group=None, sample_weight=None, init_score=None, position=None,
            eval_set: Sequence | None = None, eval_qid: Sequence | None = None,
            eval_group: Sequence | None = None, eval_init_score: Sequence | None = None,
            eval_position: Sequence | None = None) -> "LambdaMART":
        """Grow the trees.

        Args:
            X: [N, F] features: numpy, torch, a pandas DataFrame (its column names are kept in
                ``feature_names_in_`` and checked by :meth:`predict`) or a scipy sparse matrix;
                NaN is a missing value. Or a :class:`RankingDataset` (then ``y``, ``qid`` and
                ``group`` stay None).
            y: [N] non-negative relevance labels.
            qid: [N] query id of each document, of any hashable kind (ints, strings); a
                query's documents must be contiguous.
            group: [Q] documents per query (LightGBM's ``group``), the alternative to ``qid``.
                One of the two is required (XGBoost's rule).
            sample_weight: [N] non-negative per-document weights (the kernel weights a pair by
                the mean of its two documents' weights; the squared error by the weight).
            init_score: [N] F_0 per document, e.g. a base model's scores; pass the same
                scores to :meth:`predict` (``init_score=``).
            position: [N] the 0-based position each document was displayed at (click logs),
                for ``unbiased``.
            eval_set: a list of :class:`RankingDataset` or ``(X, y)`` tuples, scored with
                ``eval_metric`` after every round; a tuple's queries come from ``eval_qid[i]``
                or ``eval_group[i]`` (or a third tuple element, its qid).
            eval_qid, eval_group: lists of the eval sets' qid / group (None for a dataset).
            eval_init_score: a list of [N_i] initial scores for the eval sets (or None).
            eval_position: a list of [N_i] displayed positions of the eval sets (or None): with
                ``unbiased="auto"``, the first eval set is a validation click log and needs them.
        Returns:
            self.
        """
        config = self._config()
        device = _checks.check_device(self.device)
        matrix, labels, sizes = _as_ranking_data(X, y, qid, group, "X")
        n = matrix.n_rows
        weights = None if sample_weight is None else vector(sample_weight, n, "sample_weight", kind="weight")
        init = None if init_score is None else vector(init_score, n, "init_score", kind="double")
        positions, ids = _position_ids(position, n, config)
        evals = [_eval_item(item, i, eval_qid, eval_group, matrix.n_features)
                 for i, item in enumerate(eval_set or [])]
        if config.early_stopping_rounds is not None and not evals:  # as LightGBM and XGBoost
            raise ValueError(f"`early_stopping_rounds={config.early_stopping_rounds}` needs an `eval_set` "
                             f"to watch; pass eval_set=[...] or early_stopping_rounds=None")
        _check_eval_positions(eval_position, evals)
        e_inits = [None if eval_init_score is None or eval_init_score[i] is None else
                   vector(eval_init_score[i], len(el), f"eval_init_score[{i}]", kind="double")
                   for i, (_, el, _) in enumerate(evals)]

        def engine_for(cfg: BoosterConfig, bins_of: BoostingEngine | None = None) -> BoostingEngine:
            engine = BoostingEngine(matrix, labels, sizes, cfg, weights=weights, init_score=init,
                                    device=device, positions=positions, bins_of=bins_of)
            for (ef, el, es), e_init in zip(evals, e_inits):
                engine.add_eval_set(ef, el, es, init_score=e_init)
            return engine

        for attr in ("unbiased_choice_", "unbiased_scores_", "propensities_", "propensity_clip_", "position_bias_",
                     "position_ids_"):
            if hasattr(self, attr):
                delattr(self, attr)
        if ids is not None:
            self.position_ids_ = ids.ids.numpy().copy()
        engines = self._race(config, engine_for, evals, eval_position, ids) if config.unbiased == "auto" \
            else {"": engine_for(config)}
        for engine in engines.values():  # a blend's parts each grow to their own stop
            self._boost(engine, config)
        self._finish(engines, config, matrix)
        return self

    def _boost(self, engine: BoostingEngine, config: BoosterConfig) -> None:
        """Grow ``engine``'s trees up to ``n_estimators`` (or early stopping)."""
        self.backend_ = engine.backend.name
        if self.verbose:
            print(f"LambdaMART: {engine.backend.name} backend on {engine.device}", file=sys.stderr)
        bar = _progress_bar(self.verbose, self.n_estimators)
        if bar is not None:
            bar.update(len(engine.trees))
        while len(engine.trees) < self.n_estimators and not engine.should_stop:
            engine.update()
            if bar is not None:
                bar.update(1)
                if engine.eval_sets:
                    bar.set_postfix({e.name: round(engine.history[e.name][config.eval_metric][-1], 5)
                                     for e in engine.eval_sets})
            if self._after_round(engine):
                break
        if bar is not None:
            bar.close()

    def _after_round(self, engine: BoostingEngine) -> bool:
        """Called after every round of :meth:`_boost`; True stops the fit there. The drop-in
        front ends of :mod:`rankkit.compat` watch the rounds here (their metrics, callbacks
        and early stopping rules); LambdaMART's own early stopping lives in the engine."""
        return False

    def _kept_trees(self, engine: BoostingEngine, config: BoosterConfig) -> int:
        """How many of the grown trees the model keeps: up to the best round with early stopping."""
        early = config.early_stopping_rounds is not None and engine.eval_sets
        return engine.best_round + 1 if early else len(engine.trees)

    def _race(self, config: BoosterConfig, engine_for, evals, eval_position, ids: PositionIds
              ) -> dict[str, BoostingEngine]:
        """``unbiased="auto"``: the candidates' successive-halving race on the validation click
        log (see ``unbiased``); returns the winner's engines by candidate name (two for a blend
        of :data:`TREE_BLENDS`), their trees grown so far.

        Every candidate stops early as a plain fit would (``early_stopping_rounds`` on the
        eval sets), and is scored at the trees it would keep (a blend at its parts' kept
        trees, averaged). With early stopping the stages end at a third and two thirds of
        ``early_stopping_rounds`` (or of ``n_estimators``, whichever is fewer): a stage ends
        when its candidates reach its rounds or have stopped. A run is dropped once no candidate
        still racing needs it."""
        if not evals or eval_position is None or len(eval_position) == 0 or eval_position[0] is None:
            raise ValueError("`unbiased='auto'` chooses on a validation click log: pass eval_set=[(X_val, "
                             "clicks_val)] with eval_qid (or eval_group) and eval_position=[position_val]")
        features, clicks, sizes = evals[0]
        position = ids.index(_positions(eval_position[0], features.n_rows, "eval_position[0]"), "eval_position[0]")
        metric = ClickLikelihood(features.dense(), clicks, sizes, position, n_positions=config.n_positions)
        engines, first = {}, None
        for name, options in TREE_CANDIDATES.items():  # binned once: the candidates share the codes
            engines[name] = engine_for(replace(config, **options), bins_of=first)
            first = first or engines[name]
        first = None
        race = SuccessiveHalving(TREE_CANDIDATES, blends=TREE_BLENDS)
        parts = race.parts

        def advance(name: str, rounds: int) -> None:
            needed = race.needed()
            for out in [n for n in engines if n not in needed]:  # a cut run's scores and
                del engines[out]                                  # buffers go (a GPU's too)
            for p in parts(name):
                while len(engines[p].trees) < rounds and not engines[p].should_stop:
                    engines[p].update()

        def score(name: str) -> tuple[float, dict]:
            kept = [self._kept_trees(engines[p], config) for p in parts(name)]
            return metric(averaged([engines[p].to_ensemble(k) for p, k in zip(parts(name), kept)])), \
                {"trees": sum(kept)}

        def report(stage: int, rounds: int, ranked: list[str]) -> None:
            if self.verbose:  # the race takes several naive fits: say each stage as it ends
                scores = ", ".join(f"{name} {race.scores_[name]['score']:.5f} ({race.scores_[name]['trees']} trees)"
                                   for name in ranked)
                outcome = f"{race.choice_} wins" if race.over else f"{', '.join(race.alive)} go on"
                print(f"LambdaMART unbiased='auto' stage {stage}: up to {rounds} trees each, validation "
                      f"click log-likelihood {scores}; {outcome}", file=sys.stderr)

        race.run(race_rounds(self.n_estimators, config.early_stopping_rounds), advance, score, report)
        self.unbiased_scores_ = race.scores_
        self.unbiased_choice_ = race.choice_
        return {p: engines[p] for p in parts(race.choice_)}

    def _finish(self, runs: dict[str, BoostingEngine], config: BoosterConfig, matrix: FeatureMatrix) -> None:
        """The fitted attributes of the trained engines ``runs`` (by candidate name): one run, or
        the parts of a blend (the mean of their scores, one ensemble; their histories under
        their names)."""
        engines = list(runs.values())
        kept = [self._kept_trees(engine, config) for engine in engines]
        try:  # the model kept passes what `load` checks: no score of it is inf in float32
            ensemble = averaged([engine.to_ensemble(n) for engine, n in zip(engines, kept)]).validate()
        except ValueError as e:
            hint = f"; lower `learning_rate` (got {config.learning_rate!r})" if "leaf_values" in str(e) else ""
            raise ValueError(f"the trained model cannot score in float32 ({e}){hint}") from None
        engine = engines[0]
        self.binner_ = engine.binner  # the parts of a blend share the bins
        self.n_features_in_ = matrix.n_features
        if matrix.names is not None:
            self.feature_names_in_ = matrix.names
        elif hasattr(self, "feature_names_in_"):
            del self.feature_names_in_
        self.best_iteration_ = sum(kept) - 1
        self.ensemble_ = ensemble
        if len(engines) == 1:
            self.best_score_ = engine.best_score if engine.eval_sets else None
            self.evals_result_ = engine.history
        else:  # no one round is best for a blend: each part's curve, e.g. "position valid_0"
            self.best_score_ = None
            self.evals_result_ = {f"{part} {name}": curves for part, e in runs.items()
                                  for name, curves in e.history.items()}
        importances = [e.importances(n) for e, n in zip(engines, kept)]
        self._set_importance(sum(g for g, _ in importances) / len(engines), sum(s for _, s in importances))
        for e in engines:  # propensities_, propensity_clip_, position_bias_ (a blend's parts set different ones)
            for name, value in e.debiasing.fitted().items():
                setattr(self, name, value)

    def _config(self) -> BoosterConfig:
        params = self.get_params()
        options = EstimatorOptions(**{f.name: params.pop(f.name) for f in fields(EstimatorOptions)})
        check_all(options)
        if options.random_state is not None:
            if params["seed"] not in (BoosterConfig.seed, options.random_state):
                raise ValueError(f"`random_state` and `seed` are one setting: got random_state="
                                 f"{options.random_state!r} and seed={params['seed']!r}; give one")
            params["seed"] = options.random_state
        return BoosterConfig.from_params(params)

    def _set_importance(self, gain: np.ndarray, split: np.ndarray) -> None:
        self.feature_importance_gain_ = gain
        self.feature_importance_split_ = split
        total = gain.sum()
        self.feature_importances_ = gain / total if total > 0 else gain.copy()

    # -- inference ----------------------------------------------------------------------------
    @_on_threads
    def predict(self, X, *, init_score=None) -> np.ndarray:
        """Scores [N] (numpy float32) of features [N, F] (any form :meth:`fit` takes) or a
        :class:`RankingDataset`."""
        check_is_fitted(self, "ensemble_")
        out = self._scores(FeatureMatrix(X.features if isinstance(X, RankingDataset) else X, "X"))
        if init_score is not None:
            out = out + vector(init_score, len(out), "init_score")
        return out.numpy()

    def _scores(self, matrix: FeatureMatrix, ensemble: ObliviousEnsemble | None = None) -> torch.Tensor:
        """Scores [N] float32 of checked features by ``ensemble`` (default: the fitted one; the
        drop-in front ends pass a range of its trees), one chunk at a time."""
        self._check_features(matrix)
        model = self.ensemble_ if ensemble is None else ensemble
        with torch.no_grad():
            return torch.cat([model(chunk) for chunk in matrix.chunks()])

    def serving_scorer(self) -> ObliviousEnsemble:
        """The fitted ensemble (raw features [N, F] -> scores [N]): what the exporters write."""
        check_is_fitted(self, "ensemble_")
        return self.ensemble_

    @_on_threads
    def score(self, X, y=None, *, qid=None, group=None) -> float:
        """Mean NDCG@10 (exp gain, a query with nothing relevant scores 1) of the predictions,
        so that ``GridSearchCV`` and ``cross_val_score`` (with ``GroupKFold``) work."""
        check_is_fitted(self, "ensemble_")
        matrix, labels, sizes = _as_ranking_data(X, y, qid, group, "X")
        s, mask = pad(self._scores(matrix), sizes)
        return float(ndcg(s, pad(labels, sizes)[0], mask=mask, k=10).double().mean())

    def _check_features(self, matrix: FeatureMatrix) -> None:
        if matrix.n_features != self.n_features_in_:
            raise ValueError(f"X has {matrix.n_features} features, but {type(self).__name__} is expecting "
                             f"{self.n_features_in_} features as input")
        fitted = getattr(self, "feature_names_in_", None)
        if fitted is not None and matrix.names is not None and list(matrix.names) != list(fitted):
            i = next(j for j, (a, b) in enumerate(zip(matrix.names, fitted)) if a != b)
            raise ValueError(f"`X`'s feature names differ from those seen in fit: column {i} is "
                             f"{matrix.names[i]!r}, the model expects {fitted[i]!r}")

    def __sklearn_tags__(self):
        return ranker_tags(super().__sklearn_tags__())

    # -- persistence --------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Write the model to a safetensors file, atomically (temporary file, then rename).

        The file holds the ensemble's tensors and, as JSON metadata, the hyperparameters,
        ``best_iteration_``, ``best_score_``, ``evals_result_``, the feature names, the
        importances, ``unbiased_choice_`` and ``position_ids_``. Nothing in it is ever unpickled.
        """
        from safetensors.torch import save

        check_is_fitted(self, "ensemble_")
        e = self.ensemble_
        tensors = {"features": e.features, "thresholds": e.thresholds, "leaf_values": e.leaf_values,
                   "bias": e.bias.reshape(1),
                   "importance_gain": torch.from_numpy(self.feature_importance_gain_).double(),
                   "importance_split": torch.from_numpy(self.feature_importance_split_).long()}
        names = getattr(self, "feature_names_in_", None)
        params = self.get_params()
        params["objective"] = qualified_name(params["objective"])  # text: a file never holds code
        meta = {"format": _FORMAT, "params": params, "n_features_in": self.n_features_in_,
                "best_iteration": self.best_iteration_, "best_score": self.best_score_,
                "evals_result": self.evals_result_,
                "feature_names": None if names is None else [str(n) for n in names],
                "unbiased_choice": getattr(self, "unbiased_choice_", None),
                "position_ids": getattr(self, "position_ids_", np.zeros(0, np.int64)).tolist() or None}
        data = save({k: v.contiguous().cpu() for k, v in tensors.items()},
                    metadata={"rankkit": json.dumps(meta)})

        def write(tmp: str) -> None:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())

        atomic_write(path, write)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "LambdaMART":
        """Read a model written by :meth:`save`; never unpickles anything.

        Raises:
            FileNotFoundError: no file at ``path``.
            ValueError: the file is truncated, corrupt or not a rankkit LambdaMART model, or
                its trees do not fit its feature count (naming the file).
        """
        from safetensors import safe_open

        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no such model file: {path}")
        try:
            with safe_open(path, framework="pt") as f:
                meta = json.loads((f.metadata() or {})["rankkit"])
                tensors = {k: f.get_tensor(k) for k in f.keys()}
            if meta.get("format") != _FORMAT:
                raise ValueError(f"unknown format {meta.get('format')!r}")
            params = dict(meta["params"])
            if isinstance(params.get("objective"), str) and is_custom(params["objective"]):
                params["objective"] = RecordedName(params["objective"])  # text: never imported by a refit
            model = cls(**params)
            model._config()
            model.n_features_in_ = int(meta["n_features_in"])
            if not 1 <= model.n_features_in_ <= MAX_MODEL_FEATURES:  # before anything N x F exists
                raise ValueError(f"the model declares n_features_in = {model.n_features_in_}, beyond the "
                                 f"limit 1..{MAX_MODEL_FEATURES} (rankkit.boosting.booster.MAX_MODEL_FEATURES)")
            model.best_iteration_ = meta["best_iteration"]
            model.best_score_ = meta["best_score"]
            model.evals_result_ = meta["evals_result"]
            if meta.get("feature_names") is not None:
                model.feature_names_in_ = np.asarray(meta["feature_names"], dtype=object)
            if meta.get("unbiased_choice") is not None:
                model.unbiased_choice_ = str(meta["unbiased_choice"])
            if meta.get("position_ids") is not None:
                ids = meta["position_ids"]
                if not isinstance(ids, list) or not all(type(v) is int for v in ids):
                    raise ValueError("`position_ids` has to be a list of integers")
                model.position_ids_ = np.asarray(ids, dtype=np.int64)
            model.ensemble_ = ObliviousEnsemble(model.n_features_in_, tensors["features"],
                                                tensors["thresholds"], tensors["leaf_values"],
                                                float(tensors["bias"][0])).validate()
            model._set_importance(tensors["importance_gain"].numpy(), tensors["importance_split"].numpy())
        except Exception as e:  # any failure to parse means the file is not a usable model
            raise ValueError(f"{path}: not a valid rankkit LambdaMART model file "
                             f"(truncated, corrupt or edited?): {type(e).__name__}: {e}") from None
        return model


def ranker_tags(tags):
    """scikit-learn's tags of a ranker: NaN and sparse inputs taken, ``y`` required."""
    tags.input_tags.allow_nan = True
    tags.input_tags.sparse = True
    tags.target_tags.required = True
    return tags


# -- helpers: validation at the boundary, then plain tensors --------------------------------------
def _as_ranking_data(X, y, qid, group, name: str) -> tuple[FeatureMatrix, torch.Tensor, torch.Tensor]:
    """(features, labels [N] float32, sizes [Q] long) from either input form."""
    if isinstance(X, RankingDataset):
        if y is not None or qid is not None or group is not None:
            raise ValueError(f"`{name}` is a RankingDataset: leave `y`, `qid` and `group` as None")
        return FeatureMatrix(X.features, name), X.labels, X.sizes
    matrix = FeatureMatrix(X, name)
    if y is None:
        raise ValueError("`y` is required when `X` is not a RankingDataset: LambdaMART requires y to be "
                         "passed, but the target y is None")
    labels = vector(y, matrix.n_rows, "y", kind="label")
    return matrix, labels, query_sizes(qid, group, matrix.n_rows)


def _positions(position, n: int, name: str) -> torch.Tensor:
    """[n] long position ids (any integers: :class:`rankkit.clicks.propensity.PositionIds` maps them), checked."""
    positions = vector(position, n, name, kind="double")
    fractional = positions != positions.round()
    if bool(fractional.any()):
        i = int(fractional.nonzero()[0])
        raise ValueError(f"`{name}` has to hold integer position ids (displayed ranks), got "
                         f"{float(positions[i])!r} at index {i}")
    return positions.long()


def _position_ids(position, n: int, config: BoosterConfig) -> tuple[torch.Tensor | None, PositionIds | None]:
    """(dense positions [n], their ids) of ``fit``'s ``position`` when ``config`` debiases; the
    checked ids and None otherwise (a naive fit reads no position)."""
    if position is None:
        if config.unbiased:
            raise ValueError(f"`unbiased={config.unbiased!r}` needs the documents' displayed positions (`position=`)")
        return None, None
    positions = _positions(position, n, "position")
    if not config.unbiased:
        return positions, None
    ids, dense = PositionIds.dense(positions, "position", n_positions=config.n_positions, pool=config.pool_positions)
    return dense, ids


def _check_eval_positions(eval_position, evals: list) -> None:
    """Every given ``eval_position[i]`` is checked as ``position`` is, whether or not the debiasing
    reads it (round 4: accepted unchecked when unused)."""
    if eval_position is None:
        return
    if len(eval_position) > len(evals):
        raise ValueError(f"`eval_position` holds {len(eval_position)} entries for {len(evals)} eval sets")
    for i, position in enumerate(eval_position):
        if position is not None:
            _positions(position, evals[i][0].n_rows, f"eval_position[{i}]")


def _eval_item(item, i: int, eval_qid, eval_group, n_feat: int):
    qid = None if eval_qid is None else eval_qid[i]
    group = None if eval_group is None else eval_group[i]
    if isinstance(item, RankingDataset):
        matrix, labels, sizes = _as_ranking_data(item, None, None, None, f"eval_set[{i}]")
    elif isinstance(item, (tuple, list)) and len(item) in (2, 3):
        if len(item) == 3:
            qid = item[2] if qid is None else qid
        matrix = FeatureMatrix(item[0], f"eval_set[{i}]")
        labels = vector(item[1], matrix.n_rows, f"eval_set[{i}] y", kind="label")
        sizes = query_sizes(qid, group, matrix.n_rows, qid_name=f"eval_qid[{i}]",
                            group_name=f"eval_group[{i}]")
    else:
        raise ValueError(f"`eval_set[{i}]` has to be a RankingDataset or an (X, y) tuple")
    if matrix.n_features != n_feat:
        raise ValueError(f"`eval_set[{i}]` has {matrix.n_features} features, the training data {n_feat}")
    return matrix, labels, sizes


def _progress_bar(verbose: int, total: int):
    """A tqdm bar over the rounds when ``verbose`` is set (and tqdm is installed)."""
    if not verbose:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="LambdaMART", unit="tree", mininterval=max(0.1, float(verbose) / 10))


LambdaMART.__doc__ = with_args(LambdaMART.__doc__, PARAMS)
