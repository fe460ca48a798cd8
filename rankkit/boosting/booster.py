"""LambdaMART: gradient-boosted oblivious trees on lambda gradients, as a scikit-learn estimator.

Notation: N documents, Q queries, F features, T trees, D depth.

Each round m (Burges 2010; Tunys, "LambdaMART Demystified", papers/000):

1. (grad, hess) = ``rankkit.lambdas.lambda_gradients`` at the scores F_{m−1} (or the squared
   error's for the pointwise objective);
2. grow one oblivious tree of depth D on (grad, hess) (:mod:`rankkit.boosting.tree`);
3. set each leaf to the Newton step γ = −η ΣG / (ΣH + λ) and update F_m = F_{m−1} + tree.

F_0 is a constant (0 for the ranking objectives, the label mean for the pointwise one) plus the
optional per-document ``init_score`` -- the scores of a base model, as in Burges' algorithm
(papers/002). With the pointwise objective, depth 1 and η = 1, this is the MART worked example
of papers/004: F_0 = 42/17 ≈ 2.471, leaves −1.027 and +1.154.
"""
from __future__ import annotations

import json
import math
import os
from typing import Callable, Sequence

import numpy as np
import torch
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from rankkit._io import atomic_write
from rankkit.boosting.binning import MAX_BINS, QuantileBinner
from rankkit.boosting.ensemble import ObliviousEnsemble
from rankkit.boosting.objectives import OBJECTIVES, QueryLayout, make_metric, make_objective
from rankkit.boosting.tree import (N_CODES, ObliviousTreeGrower, Tree, TreeParams, leaf_of, leaf_sums,
                                   newton_leaf_values)
from rankkit.data.dataset import RankingDataset

_FORMAT = "rankkit.LambdaMART/1"


class LambdaMART(BaseEstimator):
    """Gradient-boosted oblivious trees for ranking (LambdaMART), CPU or CUDA.

    Args:
        objective: ``"lambdarank"`` (|ΔZ| of ``weighting``, truncation ``k``), ``"ranknet"``
            or ``"pointwise"`` (squared error on the labels).
        n_estimators: the maximum number of rounds (trees).
        depth: D, levels of every oblivious tree (2^D leaves).
        learning_rate: η, the shrinkage of each leaf.
        l2: λ, the L2 penalty added to every hessian sum.
        min_data_in_leaf: no split leaves a non-empty child with fewer documents.
        min_sum_hessian: nor with a smaller hessian sum; a leaf whose ΣH + λ is below it gets 0.
        weighting, k, sigma, gain, normalize: passed to the lambda kernel
            (:func:`rankkit.lambdas.lambda_gradients`).
        subsample: fraction of queries drawn (without replacement) for each tree.
        bagging_temperature: CatBoost's Bayesian bootstrap, per query: each tree multiplies the
            gradients and hessians of every query by its own weight ``(-log U)^T``, U uniform
            on (0, 1] (mean 1 at T = 1; 0 turns it off, larger T bags harder). Combines with
            ``subsample``.
        random_strength: CatBoost's split-score noise: each level of each tree picks the split
            that maximises score + N(0, sd²) over the allowed candidates, sd = random_strength ×
            Σg²/Σh (the score a split on pure noise gains) × m/(1 + m), m = N e^{−trees × η},
            so the noise fades as the model grows (see :func:`random_strength_sd`). 0 (the
            default) turns it off.
        colsample: fraction of the (non-constant) features drawn for each tree.
        exact_newton: the leaves' Newton steps use the exact second derivative of the pairwise
            loss in the leaf value: pairs whose two documents fall in the same leaf move
            together and leave that leaf's ΣH (Tunys, papers/000, appendix, shows that the
            usual ΣH is exact only when no leaf holds two documents of one query). The split
            search is unchanged; one more pass of the lambda kernel per round. Off by default
            (Burges' and LightGBM's ΣH).
        max_bins: codes per feature, including the missing-value bin (<= 255).
        eval_metric: ``"ndcg@k"``, ``"ndcg"``, ``"map@k"`` or ``"map"`` for ``eval_set``.
        early_stopping_rounds: stop when the metric on the **last** eval set has not improved
            for this many rounds, and keep the trees up to the best round; None to run all.
        seed: seeds the binning sample and the row/feature subsampling; the same seed and
            data give the same model.
        device: where the trees are grown (``"cpu"``, ``"cuda"``).
        verbose: print the eval metrics every this many rounds (0: silent).

    Attributes (after :meth:`fit`; learned state ends in ``_``):
        ensemble_: the :class:`ObliviousEnsemble` (raw features [N, F] -> scores [N]).
        n_features_in_: F.
        best_iteration_: 0-based index of the best round (the model keeps best_iteration_ + 1
            trees); the last round without an eval set.
        best_score_: the best eval metric, or None.
        evals_result_: ``{"valid_0": {"ndcg@10": [...]}, ...}``, one value per round.
        feature_importances_: [F] numpy, the total split gain per feature, normalised to sum 1.
        feature_importance_gain_, feature_importance_split_: [F] numpy, total gain and number
            of splits per feature.

    >>> from rankkit.data import make_synthetic
    >>> train = make_synthetic(20, 10, 5, seed=0)
    >>> model = LambdaMART(n_estimators=5, depth=2, min_data_in_leaf=5).fit(train)
    >>> model.predict(train).shape
    torch.Size([200])
    """

    def __init__(self, objective: str = "lambdarank", *, n_estimators: int = 100, depth: int = 6,
                 learning_rate: float = 0.1, l2: float = 1.0, min_data_in_leaf: int = 20,
                 min_sum_hessian: float = 1e-3, weighting: str = "ndcg", k: int | None = None,
                 sigma: float = 1.0, gain: str = "exp", normalize: bool = False,
                 subsample: float = 1.0, colsample: float = 1.0, bagging_temperature: float = 0.0,
                 random_strength: float = 0.0, exact_newton: bool = False,
                 max_bins: int = MAX_BINS, eval_metric: str = "ndcg@10", early_stopping_rounds: int | None = None,
                 seed: int = 0, device: str = "cpu", verbose: int = 0):
        self.objective = objective
        self.n_estimators = n_estimators
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
        self.max_bins = max_bins
        self.eval_metric = eval_metric
        self.early_stopping_rounds = early_stopping_rounds
        self.seed = seed
        self.device = device
        self.verbose = verbose

    # -- fitting ------------------------------------------------------------------------------
    def fit(self, X, y=None, *, qid=None, group=None, sample_weight=None, init_score=None,
            eval_set: Sequence | None = None, eval_init_score: Sequence | None = None) -> "LambdaMART":
        """Grow the trees.

        Args:
            X: [N, F] features (tensor or array), or a :class:`RankingDataset` (then ``y``,
                ``qid`` and ``group`` must be None).
            y: [N] relevance labels.
            qid: [N] query id of each document; a query's documents must be contiguous.
            group: [Q] documents per query (LightGBM's ``group``), the alternative to ``qid``.
                With neither, all documents form one query.
            sample_weight: [N] non-negative per-document weights (the kernel weights a pair by
                the mean of its two documents' weights; the squared error by the weight).
            init_score: [N] F_0 per document, e.g. a base model's scores; pass the same
                scores to :meth:`predict` (``init_score=``).
            eval_set: a list of :class:`RankingDataset` or ``(X, y)`` / ``(X, y, qid)`` tuples,
                scored with ``eval_metric`` after every round.
            eval_init_score: a list of [N_i] initial scores for the eval sets (or None).
        Returns:
            self.
        """
        self._validate_params()
        device = torch.device(self.device)
        features, labels, sizes = _as_ranking_data(X, y, qid, group, "X")
        n, n_feat = features.shape
        weights = None if sample_weight is None else _vector(sample_weight, n, "sample_weight")
        if weights is not None and bool((weights < 0).any()):
            raise ValueError("`sample_weight` has to be non-negative")
        init = None if init_score is None else _vector(init_score, n, "init_score").double()

        objective = make_objective(self.objective, weighting=self.weighting, k=self.k,
                                   sigma=self.sigma, gain=self.gain, normalize=self.normalize)
        metric = make_metric(self.eval_metric)
        params = TreeParams(self.depth, self.learning_rate, self.l2, self.min_data_in_leaf,
                            self.min_sum_hessian)
        binner = QuantileBinner(self.max_bins, seed=self.seed).fit(features)
        used = binner.used_features_
        codes = binner.transform(features)[:, used].to(device)
        valid = _valid_codes(binner)[used]
        grower = ObliviousTreeGrower(codes, valid, params)
        layout = QueryLayout(labels, sizes, weights, device)
        bias = objective.init_score(labels, weights)
        scores = torch.full((n,), bias, dtype=torch.float64, device=device)
        if init is not None:
            scores += init.to(device)

        evals = []
        for i, item in enumerate(eval_set or []):
            ef, el, es = _eval_item(item, n_feat, i)
            e_scores = torch.full((len(el),), bias, dtype=torch.float64, device=device)
            if eval_init_score is not None and eval_init_score[i] is not None:
                e_scores += _vector(eval_init_score[i], len(el), f"eval_init_score[{i}]").double().to(device)
            e_codes_t = binner.transform(ef)[:, used].to(device).t().contiguous()
            evals.append((f"valid_{i}", e_codes_t, QueryLayout(el, es, None, device), e_scores))

        gen = torch.Generator().manual_seed(self.seed)
        n_used = len(used)
        trees, history = [], {name: {self.eval_metric: []} for name, *_ in evals}
        best_score, best_round = -math.inf, -1
        leaf_hessian = None
        if self.exact_newton:
            def leaf_hessian(leaf: torch.Tensor) -> torch.Tensor:
                return objective.gradients(scores, layout, groups=leaf)[1]
        for m in range(self.n_estimators):
            grad, hess = objective.gradients(scores, layout)
            rows, features_sel = sample_round(gen, sizes, n_used, self.subsample, self.colsample, device)
            tree = grow_round(grower, grad, hess, rows=rows, features=features_sel, sizes=sizes,
                              generator=gen, bagging_temperature=self.bagging_temperature,
                              random_strength=self.random_strength,
                              model_length=m * self.learning_rate, leaf_hessian=leaf_hessian)
            scores += tree.leaf_values[tree.leaf_index]
            trees.append(tree)
            for name, e_codes_t, e_layout, e_scores in evals:
                e_scores += tree.leaf_values[leaf_of(e_codes_t, tree.features, tree.codes)]
                history[name][self.eval_metric].append(metric(e_scores, e_layout))
            if evals:
                value = history[evals[-1][0]][self.eval_metric][-1]
                if value > best_score:
                    best_score, best_round = value, m
                if self.verbose and (m % self.verbose == 0):
                    print(f"[{m}] " + "  ".join(f"{k}:{v[self.eval_metric][-1]:.5f}" for k, v in history.items()))
                if self.early_stopping_rounds is not None and m - best_round >= self.early_stopping_rounds:
                    break
        if not evals:
            best_round, best_score = len(trees) - 1, None
        kept = trees[: best_round + 1] if self.early_stopping_rounds is not None else trees

        self.binner_ = binner
        self.n_features_in_ = n_feat
        self.best_iteration_ = best_round if self.early_stopping_rounds is not None else len(trees) - 1
        self.best_score_ = best_score
        self.evals_result_ = history
        self._set_model(kept, used, binner.thresholds(), bias)
        return self

    def _set_model(self, trees, used, thresholds, bias) -> None:
        d = self.depth
        t = len(trees)
        feats = torch.zeros(t, d, dtype=torch.long)
        thr = torch.full((t, d), math.inf, dtype=torch.float32)
        leaves = torch.zeros(t, 1 << d, dtype=torch.float32)
        gain = np.zeros(self.n_features_in_)
        split = np.zeros(self.n_features_in_, dtype=np.int64)
        for i, tree in enumerate(trees):
            f_raw = used[tree.features.cpu()]
            c = tree.codes.cpu()
            split_level = c < N_CODES - 1
            feats[i] = f_raw
            thr[i] = torch.where(split_level, thresholds[f_raw, c.clamp(max=thresholds.shape[1] - 1)],
                                 torch.tensor(math.inf))
            leaves[i] = tree.leaf_values.cpu().float()
            np.add.at(gain, f_raw[split_level].numpy(), tree.gains.cpu()[split_level].numpy())
            np.add.at(split, f_raw[split_level].numpy(), 1)
        self.ensemble_ = ObliviousEnsemble(self.n_features_in_, feats, thr, leaves, bias)
        self._set_importance(gain, split)

    def _set_importance(self, gain: np.ndarray, split: np.ndarray) -> None:
        self.feature_importance_gain_ = gain
        self.feature_importance_split_ = split
        total = gain.sum()
        self.feature_importances_ = gain / total if total > 0 else gain.copy()

    def _validate_params(self) -> None:
        check_params(**self.get_params())

    # -- inference ----------------------------------------------------------------------------
    def predict(self, X, *, init_score=None) -> torch.Tensor:
        """Scores [N] (float32, CPU) of features [N, F] or a :class:`RankingDataset`."""
        check_is_fitted(self, "ensemble_")
        features = X.features if isinstance(X, RankingDataset) else _matrix(X, "X")
        if features.shape[1] != self.n_features_in_:
            raise ValueError(f"`X` has {features.shape[1]} features, but the model was fitted "
                             f"with {self.n_features_in_}")
        with torch.no_grad():
            out = torch.cat([self.ensemble_(chunk) for chunk in features.split(1 << 16)]) \
                if len(features) else torch.zeros(0)
        if init_score is not None:
            out = out + _vector(init_score, len(out), "init_score").float()
        return out

    # -- persistence --------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Write the model to a safetensors file, atomically (temporary file, then rename).

        The file holds the ensemble's tensors and, as JSON metadata, the hyperparameters,
        ``best_iteration_``, ``best_score_``, ``evals_result_`` and the importances.
        """
        from safetensors.torch import save

        check_is_fitted(self, "ensemble_")
        e = self.ensemble_
        tensors = {"features": e.features, "thresholds": e.thresholds, "leaf_values": e.leaf_values,
                   "bias": e.bias.reshape(1),
                   "importance_gain": torch.from_numpy(self.feature_importance_gain_).double(),
                   "importance_split": torch.from_numpy(self.feature_importance_split_).long()}
        meta = {"format": _FORMAT, "params": self.get_params(), "n_features_in": self.n_features_in_,
                "best_iteration": self.best_iteration_, "best_score": self.best_score_,
                "evals_result": self.evals_result_}
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
            ValueError: the file is truncated, corrupt or not a rankkit LambdaMART model.
        """
        from safetensors.torch import load

        path = os.fspath(path)
        with open(path, "rb") as f:
            data = f.read()
        try:
            tensors = load(data)
            meta = json.loads(_safetensors_metadata(data)["rankkit"])
            if meta.get("format") != _FORMAT:
                raise ValueError(f"unknown format {meta.get('format')!r}")
            model = cls(**meta["params"])
            model.n_features_in_ = int(meta["n_features_in"])
            model.best_iteration_ = meta["best_iteration"]
            model.best_score_ = meta["best_score"]
            model.evals_result_ = meta["evals_result"]
            model.ensemble_ = ObliviousEnsemble(model.n_features_in_, tensors["features"],
                                                tensors["thresholds"], tensors["leaf_values"],
                                                float(tensors["bias"][0]))
            model._set_importance(tensors["importance_gain"].numpy(), tensors["importance_split"].numpy())
        except Exception as e:  # any failure to parse means the file is not a usable model
            raise ValueError(f"{path}: not a valid rankkit LambdaMART model file "
                             f"(truncated or corrupt?): {type(e).__name__}: {e}") from e
        return model


# -- helpers: validation at the boundary, then plain tensors --------------------------------------
def _safetensors_metadata(data: bytes) -> dict[str, str]:
    header_len = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + header_len])
    return header.get("__metadata__", {})


def _matrix(x, name: str) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x).to("cpu", torch.float32)
    if t.ndim != 2:
        raise ValueError(f"`{name}` must be a [N, F] matrix, got shape {tuple(t.shape)}")
    return t


def _vector(x, n: int, name: str) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x).to("cpu")
    if t.shape != (n,):
        raise ValueError(f"`{name}` must have shape [{n}], got {tuple(t.shape)}")
    return t.to(torch.float32) if not t.is_floating_point() else t


def _as_ranking_data(X, y, qid, group, name: str):
    """(features [N, F] float32, labels [N] float32, sizes [Q] long) from either input form."""
    if isinstance(X, RankingDataset):
        if y is not None or qid is not None or group is not None:
            raise ValueError(f"`{name}` is a RankingDataset: leave `y`, `qid` and `group` as None")
        return X.features, X.labels, X.sizes
    features = _matrix(X, name)
    n = features.shape[0]
    if y is None:
        raise ValueError("`y` is required when `X` is not a RankingDataset")
    labels = _vector(y, n, "y").float()
    if qid is not None and group is not None:
        raise ValueError("pass either `qid` or `group`, not both")
    if qid is not None:
        q = _vector(qid, n, "qid").long()
        starts = torch.ones(n, dtype=torch.bool)
        starts[1:] = q[1:] != q[:-1]
        if len(torch.unique(q)) != int(starts.sum()):
            raise ValueError("`qid`: each query's documents must be contiguous (sort by qid)")
        sizes = torch.diff(torch.cat([torch.nonzero(starts).view(-1), torch.tensor([n])]))
    elif group is not None:
        sizes = torch.as_tensor(np.asarray(group)).long().view(-1)
        if bool((sizes < 1).any()) or int(sizes.sum()) != n:
            raise ValueError(f"`group` must hold positive sizes summing to N={n}, got sum {int(sizes.sum())}")
    else:
        sizes = torch.tensor([n])
    return features, labels, sizes


def _eval_item(item, n_feat: int, i: int):
    if isinstance(item, RankingDataset):
        f, l, s = item.features, item.labels, item.sizes
    elif isinstance(item, (tuple, list)) and len(item) in (2, 3):
        f, l, s = _as_ranking_data(item[0], item[1], item[2] if len(item) == 3 else None, None,
                                   f"eval_set[{i}]")
    else:
        raise ValueError(f"`eval_set[{i}]` must be a RankingDataset or an (X, y[, qid]) tuple")
    if f.shape[1] != n_feat:
        raise ValueError(f"`eval_set[{i}]` has {f.shape[1]} features, the training data {n_feat}")
    return f, l, s


def _valid_codes(binner: QuantileBinner) -> torch.Tensor:
    """[F, 256] bool: thresholds c = 1..n_borders, and c = 0 when the feature has missing values."""
    c = torch.arange(N_CODES)[None, :]
    valid = (c >= 1) & (c <= binner.n_borders_[:, None])
    return valid | ((c == 0) & binner.has_missing_[:, None])


def check_params(**values) -> None:
    """Raise ValueError for a booster hyperparameter out of its range. Checks the names it knows
    among ``values`` (those of :class:`LambdaMART`); shared by :class:`LambdaMART` and
    :class:`rankkit.boosting.LambdaMARTModule`."""
    def positive_int(name, allow_none=False):
        if name not in values or (allow_none and values[name] is None):
            return
        v = values[name]
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"`{name}` has to be a positive integer{' or None' if allow_none else ''}, got {v!r}")

    def number(name, low, high, what, low_open=False, high_open=True):
        if name not in values:
            return
        v = values[name]
        ok = (not isinstance(v, bool) and isinstance(v, (int, float, np.floating, np.integer))
              and (low < v if low_open else low <= v) and (v < high if high_open else v <= high))
        if not ok:
            raise ValueError(f"`{name}` has to be {what}, got {v!r}")

    if "objective" in values and values["objective"] not in OBJECTIVES:
        raise ValueError(f"`objective` has to be one of {OBJECTIVES}, got {values['objective']!r}")
    for name in ("n_estimators", "depth", "min_data_in_leaf"):
        positive_int(name)
    for name in ("k", "early_stopping_rounds"):
        positive_int(name, allow_none=True)
    if values.get("depth", 1) > 12:
        raise ValueError(f"`depth` has to be at most 12, got {values['depth']}")
    number("learning_rate", 0, math.inf, "a positive number", low_open=True)
    number("sigma", 0, math.inf, "a positive number", low_open=True)
    for name in ("l2", "min_sum_hessian", "bagging_temperature", "random_strength"):
        number(name, 0, math.inf, "a non-negative number")
    for name in ("subsample", "colsample"):
        number(name, 0, 1, "in (0, 1]", low_open=True, high_open=False)
    if "exact_newton" in values:
        if not isinstance(values["exact_newton"], bool):
            raise ValueError(f"`exact_newton` has to be a bool, got {values['exact_newton']!r}")
        if values["exact_newton"] and values.get("objective") == "pointwise":
            raise ValueError("`exact_newton` applies to the pairwise objectives; the pointwise "
                             "objective's Newton steps are exact already")
    if "max_bins" in values:
        v = values["max_bins"]
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 3 <= v <= MAX_BINS:
            raise ValueError(f"`max_bins` has to be an integer in 3..{MAX_BINS}, got {v!r}")


def sample_round(generator: torch.Generator, sizes: torch.Tensor, n_features: int, subsample: float,
                 colsample: float, device: torch.device | str = "cpu"
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """One round's row and feature samples (drawn on the CPU, returned on ``device``), None
    for "all".

    ``rows``: the documents of round(subsample · Q) queries drawn without replacement, in
    document order (a query is kept or dropped whole, so its pairs stay intact). ``features``:
    round(colsample · F) of the ``n_features`` used features, sorted. Shared by
    :class:`LambdaMART` and :class:`rankkit.boosting.LambdaMARTModule`, so that one seed draws
    the same samples in both.
    """
    rows = features = None
    if subsample < 1.0:
        n_q = len(sizes)
        queries = torch.randperm(n_q, generator=generator)[: max(1, round(subsample * n_q))].sort().values
        s = sizes[queries]
        q_of = torch.repeat_interleave(torch.arange(len(queries)), s)
        first = sizes.cumsum(0) - sizes  # each query's first document
        starts = torch.cumsum(s, 0) - s
        rows = (first[queries][q_of] + torch.arange(int(s.sum())) - starts[q_of]).to(device)
    if colsample < 1.0 and n_features > 1:
        features = torch.randperm(n_features, generator=generator)[: max(1, round(colsample * n_features))]
        features = features.sort().values.to(device)
    return rows, features


def grow_round(grower: ObliviousTreeGrower, grad: torch.Tensor, hess: torch.Tensor, *,
               rows: torch.Tensor | None, features: torch.Tensor | None, sizes: torch.Tensor,
               generator: torch.Generator, bagging_temperature: float, random_strength: float,
               model_length: float,
               leaf_hessian: Callable[[torch.Tensor], torch.Tensor] | None = None) -> Tree:
    """One round's tree, with CatBoost's two randomisations when they are on: the Bayesian
    bootstrap of the queries (``bagging_temperature``) and split-score noise
    (``random_strength``, faded by ``model_length`` = trees so far × η). Shared by
    :class:`LambdaMART` and :class:`rankkit.boosting.LambdaMARTModule`.

    ``leaf_hessian`` (for ``exact_newton``): leaf index [N] -> per-document hess [N] without
    the pairs inside a leaf; the leaves' Newton steps then use its sums as ΣH (the split search
    keeps ``hess``).
    """
    w = None
    if bagging_temperature > 0:
        w = bayesian_bootstrap_weights(sizes, bagging_temperature, generator).to(grad.device)
        grad, hess = grad * w, hess * w
    noise_sd = random_strength_sd(grad, hess, random_strength, model_length) if random_strength > 0 else 0.0
    tree = grower.grow(grad, hess, rows=rows, features=features, noise_sd=noise_sd, generator=generator)
    if leaf_hessian is None:
        return tree
    # Tunys (papers/000, appendix): a pair inside one leaf does not change with the leaf's value,
    # so the exact ∂²C/∂γ² of a leaf sums only the pairs that leave it. ΣG is unchanged (the
    # pairs inside a leaf cancel in it).
    h = leaf_hessian(tree.leaf_index)
    if w is not None:
        h = h * w
    leaf, g = tree.leaf_index, grad
    if rows is not None:
        leaf, g, h = leaf.index_select(0, rows), g.index_select(0, rows), h.index_select(0, rows)
    sums = leaf_sums(leaf, g, h, len(tree.leaf_values), reduce=grower.reduce)
    return tree._replace(leaf_values=newton_leaf_values(sums, grower.params))


def bayesian_bootstrap_weights(sizes: torch.Tensor, temperature: float, generator: torch.Generator) -> torch.Tensor:
    """[N] float64 per-document weights: one ``(-log U)^temperature`` per query, U in (0, 1].

    CatBoost's Bayesian bootstrap at the query level (a query's documents share its weight, so
    the pairs inside a query keep their relative weights).
    """
    u = 1.0 - torch.rand(len(sizes), generator=generator, dtype=torch.float64)  # (0, 1]
    w = (-torch.log(u)).pow(temperature)
    return torch.repeat_interleave(w, sizes)


def random_strength_sd(grad: torch.Tensor, hess: torch.Tensor, strength: float, model_length: float) -> float:
    """The standard deviation of the split-score noise of one tree (``random_strength``).

    Σg² / Σh is the score a split on pure noise gains on average (for zero-mean gradients a
    child's G²/H is a χ²₁ draw of that size), so ``strength`` is in units of that. Like
    CatBoost, the noise fades as the model grows: times m / (1 + m), m = N e^{−model_length},
    with model_length = trees so far × learning rate and N the documents.
    """
    n = grad.numel()
    scale = float((grad.square().sum() / hess.sum().clamp_min(1e-300)))
    m = math.exp(min(700.0, math.log(max(n, 1)) - model_length))
    return strength * scale * m / (1.0 + m)
