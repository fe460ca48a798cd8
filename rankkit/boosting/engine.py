"""The boosting engine: one object that owns a LambdaMART training run, round by round.

Notation: N documents, Q queries, F features, T trees, D depth.

:class:`BoostingEngine` holds the binned training data, its query layout, the current scores
F_m, the eval sets and the early-stopping state, and offers :meth:`BoostingEngine.update` (one
round, returning its :class:`~rankkit.boosting.tree.Tree`) and
:meth:`BoostingEngine.to_ensemble`. The scikit-learn estimator
(:class:`rankkit.boosting.LambdaMART`) and the LightningModule
(:class:`rankkit.boosting.LambdaMARTModule`) only drive it (as XGBoost's ``train`` and its
scikit-learn wrapper drive one ``Booster``).

Each round m (Burges, "From RankNet to LambdaRank to LambdaMART: An Overview", 2010; Tunys,
"LambdaMART Demystified", 2015):

1. (grad, hess) of the objective at the scores F_{m−1} (the lambda kernel,
   :func:`rankkit.lambdas.lambda_gradients`, or the squared error's);
2. grow one oblivious tree of depth D on (grad, hess) (:mod:`rankkit.boosting.tree`), on the
   round's sample of queries and features;
3. set each leaf to the Newton step γ = −η ΣG / (ΣH + λ), and F_m = F_{m−1} + tree.

**Every sum that crosses documents** -- each level's histograms and the leaf sums -- passes
through :attr:`BoostingEngine.reduce`, the identity in one process; a data-parallel run
replaces it by an all-reduce, and nothing else changes.
"""
from __future__ import annotations

import functools
import math
from typing import Callable

import numpy as np
import torch

from rankkit.boosting import distributed as dp
from rankkit.boosting._inputs import FeatureMatrix
from rankkit.boosting.binning import QuantileBinner
from rankkit.boosting.config import BoosterConfig
from rankkit.boosting.ensemble import ObliviousEnsemble
from rankkit.boosting.objectives import QueryLayout, make_metric, make_objective
from rankkit.boosting.tree import (
    N_CODES,
    ObliviousTreeGrower,
    Reduce,
    Tree,
    check_leaf_values,
    exact_leaf_sums,
    identity_reduce,
    leaf_sums,
    newton_leaf_values,
)
from rankkit.custom import NonFiniteGradient
from rankkit.infra import threads
from rankkit.infra.transfer import upload
from rankkit.kernels.backends import Backend, RoundState, cat_float64, choose
from rankkit.clicks.debiasing import make_debiasing


# Offsets the seed of the device generator from the host generator's.
_DEVICE_STREAM = 1 << 40


class _EvalSet:
    """One eval set: its codes (in the backend's layout, for routing), layout and running scores."""

    def __init__(self, name: str, codes: torch.Tensor, layout: QueryLayout, scores: torch.Tensor):
        self.name, self.codes, self.layout, self.scores = name, codes, layout, scores


def _all_reduce(config: BoosterConfig, n_docs: int) -> dp.AllReduce:
    """The all-reduce of a data-parallel run, after refusing the options it cannot shard yet."""
    bad = [name for name, on in (("subsample", config.subsample < 1), ("bagging_temperature",
           config.bagging_temperature > 0), ("random_strength", config.random_strength > 0)) if on]
    if bad:
        raise ValueError(f"`{bad[0]}` is not data-parallel yet: train on several processes without it")
    return dp.AllReduce(n_docs)


class BoostingEngine:
    """A LambdaMART training run: binned data, scores, eval sets, early stopping.

    Args:
        features: [N, F] float32 training features (NaN: missing).
        labels: [N] float32 relevance labels.
        sizes: [Q] documents per query (each query's documents contiguous).
        config: the hyperparameters.
        weights: [N] per-document weights, or None.
        init_score: [N] F_0 per document added to the constant bias, or None.
        device: where the trees are grown.
        start_round: the number of trees already in the model (a resumed run): the rounds are
            counted from it, and round m's random draws are seeded by (seed, m) alone
            (:meth:`_seed_round`), so that round m draws the same whatever run it is in.
        init_scores: [N] the scores of the trees already grown (a resumed run), or None.
        positions: [N] long, the 0-based position each document was displayed at (click
            data); required with ``config.unbiased``.
        reduce: the reduction point of every document sum (histograms, leaf sums); None is the
            identity (one process).
        distributed: data-parallel training across the ranks of the default process group
            (see :mod:`rankkit.boosting.distributed`): this process holds a shard of whole
            queries, and ``reduce`` becomes an all-reduce. None: when a process group of more
            than one rank is initialised.
        bins_of: an engine on the same training data (and the same eval sets, added in the same
            order), whose bin borders and codes this one reuses instead of binning again (the
            candidates of ``LambdaMART(unbiased="auto")``).
        backend: the kernels of every round (:mod:`rankkit.kernels.backends`): a
            :class:`~rankkit.kernels.backends.Backend`, "torch", "cpu" or "triton", or None to
            let :func:`~rankkit.kernels.backends.choose` pick one for ``device`` (and
            ``RANKKIT_BACKEND``). Chosen once, here; ``engine.backend.name`` says which.

    >>> from rankkit.data import make_synthetic
    >>> d = make_synthetic(20, 10, 5, seed=0)
    >>> engine = BoostingEngine(d.features, d.labels, d.sizes, BoosterConfig(depth=2, min_data_in_leaf=5))
    >>> tree = engine.update()
    >>> engine.to_ensemble().n_trees
    1
    """

    def __init__(self, features: torch.Tensor, labels: torch.Tensor, sizes: torch.Tensor,
                 config: BoosterConfig, *, weights: torch.Tensor | None = None,
                 init_score: torch.Tensor | None = None, device: torch.device | str = "cpu",
                 start_round: int = 0, init_scores: torch.Tensor | None = None,
                 reduce: Reduce | None = None, positions: torch.Tensor | None = None,
                 distributed: bool | None = None, backend: Backend | str | None = None,
                 bins_of: BoostingEngine | None = None):
        self.config = config
        self.device = torch.device(device)
        # The one choice of kernels for this fit: every step of a round asks this object.
        self.backend = backend if isinstance(backend, Backend) else choose(self.device, backend)
        self.reduce: Reduce = reduce or identity_reduce
        self.round_state = RoundState()  # what the backend keeps for this engine's rounds (a CUDA graph)
        self.parallel = None
        if distributed or (distributed is None and reduce is None and dp.world()[1] > 1):
            self.parallel = self.reduce = _all_reduce(config, len(labels))
        self.sizes = sizes.cpu()
        # What the click setting (`unbiased`) does to every round: one object asked here and there.
        self.debiasing = make_debiasing(config.unbiased, config.objective_spec, family="trees",
                                        n_positions=config.n_positions, bias_p=config.bias_p,
                                        propensity_clip=config.propensity_clip)

        @functools.cache  # built once, and only when wanted ("ips" reads it before binning)
        def matrix() -> FeatureMatrix:
            return features if isinstance(features, FeatureMatrix) else FeatureMatrix(features, "features")

        self.debiasing.start(lambda: matrix().dense(), labels, self.sizes, positions, device=self.device,
                             data_parallel=self.parallel is not None, seed=config.seed)
        self.objective = make_objective(config.objective_spec, custom_loss=config.objective, seed=config.seed,
                                        quantized_grad=config.quantized_grad,
                                        propensity=self.debiasing.pair_propensity())
        self.metric = make_metric(config.eval_metric, reduce=None if self.parallel is None else self.parallel)
        # the other engine's eval-set codes (a list of tensors, not the engine: it may be dropped)
        self._shared_eval_codes = [] if bins_of is None else [(len(e.scores), e.codes) for e in bins_of.eval_sets]
        self._bin(bins_of, matrix())
        self.layout = QueryLayout(labels, self.sizes, weights, self.device)
        self.bias = self.objective.init_score(labels, weights, reduce=self.reduce)
        self.scores = torch.full((len(labels),), self.bias, dtype=torch.float64, device=self.device)
        if init_score is not None:
            self.scores += init_score.to(self.device, torch.float64)
        if init_scores is not None:
            self.scores = init_scores.to(self.device, torch.float64).clone()
        self.generator = torch.Generator()  # seeded by (seed, round) at every round: _seed_round
        # Per-document and per-candidate draws (the quantization's rounding, the split noise)
        # come from a generator on the device, so that nothing of that size crosses to it.
        # Under the simulated CUDA device it is a CPU generator: the same draws as on the CPU; a
        # real GPU draws its own (Philox) numbers, so those two options give other, equally
        # seeded trees there.
        self.device_generator = torch.Generator(device=self.device)  # seeded at every round too
        self.n_rounds = start_round
        self.governor: threads.ThreadGovernor | None = None  # set by a Lightning module's fit
        self.trees: list[Tree] = []  # the host trees of this run, without their leaf index
        self.eval_sets: list[_EvalSet] = []
        self.history: dict[str, dict[str, list[float]]] = {}
        self.best_score, self.best_round = -math.inf, -1  # the raw metric at the round kept
        self.best_smoothed, self.best_end = -math.inf, -1  # the best window's mean and its last round
        # The model in raw-feature terms, one row per tree (see to_ensemble).
        self._raw: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.importance_gain = np.zeros(self.n_features)
        self.importance_split = np.zeros(self.n_features, dtype=np.int64)

    def _bin(self, bins_of: BoostingEngine | None, matrix: FeatureMatrix) -> None:
        """Fit the bin borders (on every rank, the borders one process would fit on all the data)
        and the tree grower on the training codes."""
        config = self.config
        self.n_features = matrix.n_features
        if bins_of is not None:  # the same data binned by another engine (the race's candidates)
            self.binner, self.used, self._thresholds, self._codes = (bins_of.binner, bins_of.used,
                                                                     bins_of._thresholds, bins_of._codes)
        else:
            if self.parallel is None:
                self.binner = fit_binner(matrix, config.max_bins, config.seed)
            else:
                binner = QuantileBinner(config.max_bins, seed=config.seed)
                self.binner = binner.fit(dp.gather_sample(matrix.rows, self.parallel, matrix.n_features,
                                                          binner.sample, config.seed))
            self.used = self.binner.used_features_
            self._thresholds = self.binner.thresholds()
            self._codes = transform(self.binner, matrix, self.used).to(self.device)
        self.grower = ObliviousTreeGrower(self._codes, valid_codes(self.binner)[self.used], config.tree,
                                          backend=self.backend, reduce=self.reduce, shard=self.parallel)

    # -- data ---------------------------------------------------------------------------------
    def add_eval_set(self, features: torch.Tensor, labels: torch.Tensor, sizes: torch.Tensor, *,
                     init_score: torch.Tensor | None = None, name: str | None = None) -> None:
        """Score an eval set with ``eval_metric`` after every round; the last one added decides
        early stopping."""
        name = name or f"valid_{len(self.eval_sets)}"
        scores = torch.full((len(labels),), self.bias, dtype=torch.float64, device=self.device)
        if init_score is not None:
            scores += init_score.to(self.device, torch.float64)
        shared = self._shared_eval_codes
        if len(shared) > len(self.eval_sets) and shared[len(self.eval_sets)][0] == len(labels):
            codes = shared[len(self.eval_sets)][1]  # the same eval set, binned by the other engine
        else:
            matrix = features if isinstance(features, FeatureMatrix) else FeatureMatrix(features, "features")
            codes = self.backend.codes_layout(transform(self.binner, matrix, self.used).to(self.device))
        self.eval_sets.append(_EvalSet(name, codes, QueryLayout(labels, sizes.cpu(), None, self.device), scores))
        self.history[name] = {self.config.eval_metric: []}

    # -- one round ----------------------------------------------------------------------------
    def update(self) -> Tree:
        """Grow one tree, add it to the scores of the training and eval sets, and score them.

        Returns the tree: its levels and leaf values on the host (as the model keeps them), and
        ``leaf_index``, each training document's leaf, where the scores live (on a GPU, a
        buffer of the fit: valid until the next round)."""
        c = self.config
        # Fewer threads while other processes hold the cores (n_jobs=None): the governor of the
        # Lightning fit that owns this engine, or of the estimator's threads() block.
        if self.governor is not None:
            self.governor.tick()
        else:
            threads.tick()
        self._seed_round()
        # A static round's shape: an eval set added later is a new round to capture.
        shape = (len(self.eval_sets),) if self._static else None
        tree, values, packed = self.backend.run_round(self._device_round, static=shape, state=self.round_state)
        # The round's one host synchronisation: the tree and the eval metrics in one copy.
        host_tree, values = _round_on_host(tree, values, packed)
        check_leaf_values(host_tree.leaf_values, self.n_rounds)
        # Only the host copy is kept, without the [N] leaf index: memory stays flat in the rounds
        # (each kept index cost 8 bytes per document per round, 30 GB over 1,000 MSLR rounds).
        self.trees.append(host_tree._replace(leaf_index=None))
        self._record(host_tree)
        for e, value in zip(self.eval_sets, values):
            self.history[e.name][c.eval_metric].append(value)
        if self.eval_sets:
            self._track_best(self.history[self.eval_sets[-1].name][c.eval_metric])
        self.n_rounds += 1
        return host_tree

    def _device_round(self) -> tuple[Tree, list[torch.Tensor], torch.Tensor | None]:
        """The round's device work: the gradients, the tree, the training and eval sets' scores
        and metrics, and the tree and metrics packed for the host copy (None: on the host
        already). On a GPU the backend may replay it as a CUDA graph (``static``)."""
        c = self.config
        scores = self.debiasing.scores(self.scores)
        try:
            grad, hess = self.objective.gradients(scores, self.layout, backend=self.backend)
        except NonFiniteGradient as e:
            raise ValueError(f"round {self.n_rounds}: {e}") from None
        self.debiasing.after_round(grad, hess, learning_rate=c.learning_rate,
                                   regularization=c.position_bias_regularization)
        self._round_scores = scores
        rows, features = sample_round(self.generator, self.sizes, len(self.used), c.subsample,
                                      c.colsample, self.device)
        tree = self._grow(grad, hess, rows, features) if len(self.used) else self._empty_tree()
        # A non-finite leaf is reported after the round's one sync (below); until then the
        # scores take a zero update in its place, so a failed round leaves them as they were.
        update = self.backend.update_values(tree.leaf_values)
        self.backend.add_tree(self.scores, update, leaf=tree.leaf_index)
        values = []
        for e in self.eval_sets:
            if len(self.used):
                values.append(self.backend.score_eval_set(self.metric, e.scores, e.layout, update, e.codes,
                                                          tree.features, tree.codes))
            else:
                values.append(self.backend.eval_metric(self.metric, e.scores, e.layout))
        return tree, values, _pack_round(tree, values, self.backend)

    @functools.cached_property
    def _static(self) -> bool:
        """Whether every round makes the same device work from the same buffers, with nothing
        drawn or decided on the host and no user code (what a CUDA graph replays): one process,
        no sampling, bootstrap, split noise, quantization, exact Newton, debiasing, a built-in
        objective that draws nothing, and a feature to split on."""
        c = self.config
        options = getattr(self.objective, "options", None)
        return (self.reduce is identity_reduce and c.subsample == 1.0 and c.colsample == 1.0
                and c.bagging_temperature == 0 and c.random_strength == 0 and not c.quantized_grad
                and not c.exact_newton and not c.unbiased and isinstance(options, dict)
                and "generator" not in options and bool(len(self.used)))

    def _track_best(self, curve: list[float]) -> None:
        """The best round so far on ``curve`` (the last eval set's metric), read as a trailing
        mean over ``early_stopping_window`` rounds: a better window moves the best round to
        its centre (its last round with a window of 1) and the patience's start to its end."""
        end = len(curve) - 1
        start = max(0, end - self.config.early_stopping_window + 1)
        value = math.fsum(curve[start:]) / (end - start + 1)
        if value > self.best_smoothed:
            self.best_smoothed, self.best_end = value, end
            self.best_round = (start + end) // 2
            self.best_score = curve[self.best_round]

    def _seed_round(self) -> None:
        """Every random draw of round m comes from generators seeded by (seed, m) alone, so that a
        run resumed at round m (``start_round``, a LambdaMARTModule checkpoint) draws what a
        straight run draws there: the rows and features sampled, the bootstrap weights, the
        split noise and quantization, XE-NDCG's and ListMLE's draws."""
        base = self.config.seed + 100_003 * self.n_rounds
        self.generator.manual_seed(base)
        self.device_generator.manual_seed(base + _DEVICE_STREAM)
        options = getattr(self.objective, "options", None)
        if isinstance(options, dict) and isinstance(options.get("generator"), torch.Generator):
            options["generator"].manual_seed(base + 2 * _DEVICE_STREAM)

    @property
    def should_stop(self) -> bool:
        """Early stopping: no improvement on the last eval set for ``early_stopping_rounds``."""
        n = self.config.early_stopping_rounds
        return bool(self.eval_sets) and n is not None and len(self.trees) - 1 - self.best_end >= n

    def _empty_tree(self) -> Tree:
        """No feature can split (every feature is constant): a tree of zeros, the documented
        result (the model stays at F_0, as LightGBM's with no usable feature)."""
        d, n = self.config.depth, len(self.scores)
        return Tree(torch.zeros(d, dtype=torch.long), torch.full((d,), N_CODES - 1, dtype=torch.long),
                    torch.zeros(1 << d, dtype=torch.float64, device=self.device),
                    torch.zeros(d, dtype=torch.float64), torch.zeros(n, dtype=torch.long, device=self.device))

    def _grow(self, grad, hess, rows, features) -> Tree:
        c = self.config
        leaf_hessian = None
        if c.exact_newton:
            def leaf_hessian(leaf: torch.Tensor) -> torch.Tensor:
                return self.objective.gradients(self._round_scores, self.layout, groups=leaf)[1]
        return grow_round(self.grower, grad, hess, rows=rows, features=features, sizes=self.sizes,
                          generator=self.generator, bagging_temperature=c.bagging_temperature,
                          random_strength=c.random_strength, model_length=self.n_rounds * c.learning_rate,
                          leaf_hessian=leaf_hessian, device_generator=self.device_generator,
                          query_of=self.layout.rows)

    def _record(self, tree: Tree) -> None:
        """The tree in raw-feature terms (feature indices, float thresholds), and importances."""
        f_raw = self.used[tree.features.cpu()] if len(self.used) else torch.zeros_like(tree.features.cpu())
        codes = tree.codes.cpu()
        split = codes < N_CODES - 1
        thr = self._thresholds
        t = torch.where(split, thr[f_raw, codes.clamp(max=thr.shape[1] - 1)], torch.tensor(math.inf))
        self._raw.append((f_raw, t.float(), tree.leaf_values.cpu().float()))
        np.add.at(self.importance_gain, f_raw[split].numpy(), tree.gains.cpu()[split].numpy())
        np.add.at(self.importance_split, f_raw[split].numpy(), 1)

    # -- the model ----------------------------------------------------------------------------
    def to_ensemble(self, n_trees: int | None = None, prefix: ObliviousEnsemble | None = None) -> ObliviousEnsemble:
        """The first ``n_trees`` trees of this run (all when None) as an exportable
        :class:`ObliviousEnsemble` on the CPU, after the trees of ``prefix`` (a resumed run)."""
        raw = self._raw[: len(self._raw) if n_trees is None else n_trees]
        d = self.config.depth
        feats = [prefix.features.cpu()] if prefix is not None else []
        thr = [prefix.thresholds.cpu()] if prefix is not None else []
        leaves = [prefix.leaf_values.cpu()] if prefix is not None else []
        feats += [f[None] for f, _, _ in raw]
        thr += [t[None] for _, t, _ in raw]
        leaves += [v[None] for _, _, v in raw]
        if not feats:
            return ObliviousEnsemble(self.n_features, torch.zeros(0, d, dtype=torch.long),
                                     torch.full((0, d), math.inf), torch.zeros(0, 1 << d), self.bias)
        return ObliviousEnsemble(self.n_features, torch.cat(feats), torch.cat(thr), torch.cat(leaves),
                                 self.bias)

    def importances(self, n_trees: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(total gain, number of splits) per raw feature [F] over the first ``n_trees`` trees."""
        if n_trees is None or n_trees == len(self._raw):
            return self.importance_gain.copy(), self.importance_split.copy()
        gain, split = np.zeros(self.n_features), np.zeros(self.n_features, dtype=np.int64)
        for tree, (f_raw, t, _) in zip(self.trees[:n_trees], self._raw[:n_trees]):
            used = torch.isfinite(t)
            np.add.at(gain, f_raw[used].numpy(), tree.gains.cpu()[used].numpy())
            np.add.at(split, f_raw[used].numpy(), 1)
        return gain, split


def fit_binner(matrix: FeatureMatrix, max_bins: int, seed: int) -> QuantileBinner:
    """The quantile borders of ``matrix``, from the same row sample as
    :meth:`QuantileBinner.fit` draws (so dense and sparse inputs bin alike)."""
    binner = QuantileBinner(max_bins, seed=seed)
    if matrix.n_rows <= binner.sample:
        return binner.fit(matrix.dense())  # at most `sample` rows, even for a sparse matrix
    g = torch.Generator().manual_seed(seed)
    return binner.fit(matrix.rows(torch.randperm(matrix.n_rows, generator=g)[: binner.sample]))


def transform(binner: QuantileBinner, matrix: FeatureMatrix, used: torch.Tensor | None = None) -> torch.Tensor:
    """Codes [N, F'] uint8 of every row of ``matrix`` in the columns ``used`` (None: all), one
    dense chunk at a time, written into one tensor (no concatenation, and no column copy when
    every feature is used)."""
    n_used = binner.n_features if used is None else used.numel()
    if used is not None and n_used == binner.n_features and bool((used == torch.arange(n_used)).all()):
        used = None
    out = torch.empty(matrix.n_rows, n_used, dtype=torch.uint8)
    start = 0
    for chunk in matrix.chunks():
        codes = binner.transform(chunk)
        out[start:start + len(codes)] = codes if used is None else codes[:, used]
        start += len(codes)
    return out


def valid_codes(binner: QuantileBinner) -> torch.Tensor:
    """[F, 256] bool: thresholds c = 1..n_borders, and c = 0 when the feature has missing values."""
    c = torch.arange(N_CODES)[None, :]
    valid = (c >= 1) & (c <= binner.n_borders_[:, None])
    return valid | ((c == 0) & binner.has_missing_[:, None])


def sample_round(generator: torch.Generator, sizes: torch.Tensor, n_features: int, subsample: float,
                 colsample: float, device: torch.device | str = "cpu"
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """One round's row and feature samples, None for "all".

    ``rows``: the documents of round(subsample · Q) queries drawn without replacement, in
    document order (a query is kept or dropped whole, so its pairs stay intact). ``features``:
    round(colsample · F) of the ``n_features`` used features, sorted. The draws are made on
    the CPU (``generator``, sizes [Q] on the CPU), so every device draws the same; only the
    per-query vectors (the kept queries, their sizes and first documents) are copied to
    ``device``, and the rows are expanded there (no per-document copy, no sync).
    """
    rows = features = None
    if subsample < 1.0:
        n_q = len(sizes)
        queries = torch.randperm(n_q, generator=generator)[: max(1, round(subsample * n_q))].sort().values
        s = sizes[queries]
        first = sizes.cumsum(0) - sizes  # each query's first document
        n_rows = int(s.sum())
        # Per query: its first document minus its first position in the sample.
        shift = first[queries] - (torch.cumsum(s, 0) - s)
        shift, s_device = upload(device, shift, s)
        q_of = torch.repeat_interleave(torch.arange(len(queries), device=device), s_device,
                                       output_size=n_rows)
        rows = shift[q_of] + torch.arange(n_rows, device=device)
    if colsample < 1.0 and n_features > 1:
        features = torch.randperm(n_features, generator=generator)[: max(1, round(colsample * n_features))]
        features = upload(device, features.sort().values)[0]
    return rows, features


def grow_round(grower: ObliviousTreeGrower, grad: torch.Tensor, hess: torch.Tensor, *,
               rows: torch.Tensor | None, features: torch.Tensor | None, sizes: torch.Tensor,
               generator: torch.Generator, bagging_temperature: float, random_strength: float,
               model_length: float,
               leaf_hessian: Callable[[torch.Tensor], torch.Tensor] | None = None,
               device_generator: torch.Generator | None = None,
               query_of: torch.Tensor | None = None) -> Tree:
    """One round's tree, with CatBoost's two randomisations when they are on: the Bayesian
    bootstrap of the queries (``bagging_temperature``) and split-score noise
    (``random_strength``, faded by ``model_length`` = trees so far × η).

    ``leaf_hessian`` (for ``exact_newton``): leaf index [N] -> per-document hess [N] without
    the pairs inside a leaf; the leaves' Newton steps then use its sums as ΣH (the split search
    keeps ``hess``).

    ``generator`` (CPU) draws the per-query weights; ``device_generator`` (on grad's device;
    None: ``generator``) the split noise and the quantization's rounding. ``query_of`` [N] long
    on grad's device, the query of each document (kept by the data set's layout), or None to
    expand the per-query weights by ``sizes``.
    """
    w = None
    if bagging_temperature > 0:
        w = bayesian_bootstrap_weights(sizes, bagging_temperature, generator, per_query=True)
        w = _query_weights(w, sizes, grad.device) if query_of is None else \
            upload(grad.device, w)[0][query_of]
        grad, hess = grad * w, hess * w
    noise_sd = _noise_sd(grad, hess, random_strength, model_length) if random_strength > 0 else 0.0
    tree = grower.grow(grad, hess, rows=rows, features=features, noise_sd=noise_sd,
                       generator=device_generator or generator)
    if leaf_hessian is None:
        return tree
    # Tunys ("LambdaMART Demystified", 2015, appendix): a pair inside one leaf does not change
    # with the leaf's value, so the exact ∂²C/∂γ² of a leaf sums only the pairs that leave it.
    # ΣG is unchanged (the pairs inside a leaf cancel in it).
    h = leaf_hessian(tree.leaf_index)
    if w is not None:
        h = h * w
    leaf, g = tree.leaf_index, grad
    if rows is not None:
        leaf, g, h = leaf.index_select(0, rows), g.index_select(0, rows), h.index_select(0, rows)
    if grower.params.quantized_grad:
        sums = exact_leaf_sums(leaf, g, h, len(tree.leaf_values), reduce=grower.reduce, shard=grower.shard)
    else:
        sums = leaf_sums(leaf, g, h, len(tree.leaf_values), reduce=grower.reduce)
    return tree._replace(leaf_values=newton_leaf_values(sums, grower.params))


def bayesian_bootstrap_weights(sizes: torch.Tensor, temperature: float, generator: torch.Generator, *,
                               per_query: bool = False) -> torch.Tensor:
    """[N] float64 per-document weights: one ``(-log U)^temperature`` per query, U in (0, 1]
    ([Q], one per query, with ``per_query``).

    CatBoost's Bayesian bootstrap at the query level (a query's documents share its weight, so
    the pairs inside a query keep their relative weights).
    """
    u = 1.0 - torch.rand(len(sizes), generator=generator, dtype=torch.float64)  # (0, 1]
    w = (-torch.log(u)).pow(temperature)
    return w if per_query else torch.repeat_interleave(w, sizes)


def _query_weights(w: torch.Tensor, sizes: torch.Tensor, device: torch.device) -> torch.Tensor:
    """[N] on ``device``: the per-query values w [Q] (CPU) repeated over each query's documents,
    expanded on the device (per-query copies that do not block the host)."""
    (w,), (sizes_device,) = upload(device, w), upload(device, sizes)
    return torch.repeat_interleave(w, sizes_device, output_size=int(sizes.sum()))


def random_strength_sd(grad: torch.Tensor, hess: torch.Tensor, strength: float, model_length: float) -> float:
    """The standard deviation of the split-score noise of one tree (``random_strength``).

    Σg² / Σh is the score a split on pure noise gains on average (for zero-mean gradients a
    child's G²/H is a χ²₁ draw of that size), so ``strength`` is in units of that. Like
    CatBoost, the noise fades as the model grows: times m / (1 + m), m = N e^{−model_length},
    with model_length = trees so far × learning rate and N the documents.
    """
    return float(_noise_sd(grad, hess, strength, model_length))


def _noise_sd(grad: torch.Tensor, hess: torch.Tensor, strength: float, model_length: float) -> torch.Tensor:
    """:func:`random_strength_sd` as a 0-dim tensor on grad's device (no sync)."""
    n = grad.numel()
    m = math.exp(min(700.0, math.log(max(n, 1)) - model_length))
    return (grad.square().sum() / hess.sum().clamp_min(1e-300)) * (strength * m / (1.0 + m))


def _pack_round(tree: Tree, values: list[torch.Tensor], backend: Backend | None = None) -> torch.Tensor | None:
    """The device side of the round's copy to the host: the tree and the 0-dim tensors
    ``values`` (the eval metrics) packed by the ``backend``
    (:meth:`~rankkit.kernels.backends.Backend.pack`); None for a tree on the CPU, unless the
    backend's buffers are the fit's (``keeps_buffers``: the next round overwrites them)."""
    if tree.leaf_values.device.type == "cpu" and not (backend is not None and backend.keeps_buffers):
        return None
    return _pack_tree(tree, values, None if backend is None else backend.pack)


def _round_on_host(tree: Tree, values: list[torch.Tensor], packed: torch.Tensor | None
                   ) -> tuple[Tree, list[float]]:
    """The tree's per-level tensors and leaf values on the CPU and the eval metrics as floats,
    from ``packed`` (:func:`_pack_round`) in one device-to-host copy, the round's one sync (a
    new tensor, on the CPU too); the document leaves stay where they are."""
    if packed is None:
        return tree, [float(v) for v in values]
    return _unpack_tree(packed.clone() if packed.device.type == "cpu" else packed.cpu(), tree, len(values))


def _pack_tree(tree: Tree, values: list[torch.Tensor], pack=None) -> torch.Tensor:
    """The tree's per-level tensors, ``values`` and its leaf values as one float64 tensor on
    their device (what :func:`_pack_round` hands :func:`_round_on_host`), by ``pack`` (None:
    the torch reference's)."""
    device = tree.leaf_values.device
    parts = [t.to(device).reshape(-1) for t in (tree.features, tree.codes, tree.gains, *values, tree.leaf_values)]
    return (pack or cat_float64)(parts)


def _unpack_tree(packed: torch.Tensor, tree: Tree, n_values: int) -> tuple[Tree, list[float]]:
    """:func:`_pack_tree`'s host copy as (the host tree, the values as floats)."""
    depth = tree.features.shape[0]
    n_leaves = packed.shape[0] - 3 * depth - n_values
    feats, codes, gains, metrics, leaves = packed.split([depth, depth, depth, n_values, n_leaves])
    return Tree(feats.long(), codes.long(), leaves, gains, tree.leaf_index), metrics.tolist()

