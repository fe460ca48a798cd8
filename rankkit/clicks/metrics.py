r"""Click-log metrics: scoring a ranker on a validation click log, without true labels.

Three criteria: :class:`ClickLikelihood`, how well a ranker's scores explain the clicks once each
position has its own offset (no click model assumed; what ``LambdaMART(unbiased="auto")``
maximises), :class:`SessionClickMetric`, a counterfactual NDCG described next, and
:class:`ClickLogMetric`, the same NDCG on a log already aggregated per (document, position).

A click log reaches a ranker the way it reaches LightGBM's ``position=``: one row per shown
document and session, the session as the query (``group`` or ``qid``), the row's click as its
label and its displayed ``position``. :class:`SessionClickMetric` turns such a log (of queries
the rankers were not trained on) into a metric any ranker can be scored by: a counterfactual
NDCG@k (linear gain) of the logged documents against relevance estimated from the clicks.

The relevance estimates depend on how users click, and the log does not say. Two click models
are fitted to it and the data decide between them:

* **position-based** (Richardson, Dominowska, Ragno 2007; Joachims, Swaminathan, Schnabel,
  "Unbiased Learning-to-Rank with Biased Feedback", WSDM 2017): a document at position k is
  examined with θ_k whatever was clicked above it. The propensities θ̂ come from regression-EM
  (Wang, Golbandi, Bendersky, Metzler, Najork, "Position Bias Estimation for Unbiased Learning
  to Rank in Personal Search", WSDM 2018) on the log, and each document's relevance is its
  inverse-propensity click rate (:func:`ips_relevance`, 1/θ̂ clipped).
* **cascade** (Craswell, Zoeter, Taylor, Ramsey, "An Experimental Comparison of Click
  Position-Bias Models", WSDM 2008; with several clicks, the dependent click model of Guo, Liu,
  Wang, "Efficient Multiple-Click Models in Web Search", WSDM 2009): the user scans down and
  examines every document down to the last click. A document's relevance is its click rate over
  the sessions that examined it (:func:`cascade_relevance`).

The choice between them (:func:`multiple_click_ratio`): the position-based model makes the
clicks of a session independent given what was shown, a cascade makes a click end (or, with
several clicks, shorten) the scan. Of the sessions with a click, the share with two or more is
compared with the share the fitted position-based model predicts for the same sessions; below
a fifth of it (``cascade_ratio``), the log is a cascade's. A deterministic production ranker shows
each document at one position, so a test of position dependence per document has nothing to
compare; this one uses whole sessions. It is a heuristic, measured in docs/benchmarks.md
("Learning from clicks"): simulated position-based logs give ratios near 1, cascades 0.

Documents are identified by their feature rows (two rows with equal features are one document
to any ranker), and queries are the groups of sessions that share documents (connected
components).
"""
from __future__ import annotations

from dataclasses import dataclass

from collections.abc import Callable

import torch
import torch.nn.functional as F

from rankkit.clicks.log import SessionLog, aggregate, session_log
from rankkit.clicks.propensity import EM_SETTINGS, RegressionEM, check_counts
from rankkit.data.dataset import pad
from rankkit.infra.checks import check_choice, check_int, check_k, check_number, check_tensor, check_tensors
from rankkit.metrics import ndcg

__all__ = ["CLICK_MODELS", "ClickLikelihood", "ClickLogMetric", "SessionClickMetric", "cascade_relevance",
           "centred_scores", "counterfactual_ndcg", "explained_clicks", "ips_relevance", "maximised",
           "multiple_click_ratio", "ranker_scores"]

CLICK_MODELS = ("auto", "pbm", "cascade")


def ips_relevance(doc_index, clicks, impressions, position, propensities, *, clip: float | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse-propensity estimates of each document's relevance from a click log.

    r̂_d = Σ_m c_m / θ_{k_m} / Σ_m n_m over the rows m of document d: unbiased for the document's
    click probability at position 0 under the position-based model (Joachims, Swaminathan,
    Schnabel, "Unbiased Learning-to-Rank with Biased Feedback", WSDM 2017). ``clip`` bounds the
    inverse propensities 1/θ at ``clip`` (the clipped estimator of the same paper).

    Args:
        doc_index: [M] document ids of the rows; clicks, impressions, position: [M] counts and
            0-based positions; propensities: [P] θ by position (positions ≥ P − 1 share the last).
    Returns:
        (docs, relevance): [D] sorted distinct document ids and [D] float64 estimates.

    >>> ips_relevance(torch.tensor([7, 7, 3]), torch.tensor([1, 1, 0]), torch.tensor([2, 2, 1]),
    ...               torch.tensor([0, 1, 0]), torch.tensor([1.0, 0.5]))
    (tensor([3, 7]), tensor([0.0000, 0.7500], dtype=torch.float64))
    """
    propensities = check_tensor(torch.as_tensor(propensities), "propensities", ndim=1, kind="float").double()
    check_tensors(("propensities", propensities, ~(propensities > 0) | ~torch.isfinite(propensities), "positive"))
    clicks, impressions, bucket = check_counts(clicks, impressions, position, len(propensities))
    doc_index = check_tensor(torch.as_tensor(doc_index), "doc_index", shape=clicks.shape, kind="int")
    inverse = 1.0 / propensities
    if clip is not None:
        inverse = inverse.clamp(max=check_number(clip, "clip", low=1.0))
    docs, rows = torch.unique(doc_index, return_inverse=True)
    weighted = torch.zeros(len(docs), dtype=torch.float64).index_add_(0, rows, clicks * inverse[bucket])
    shown = torch.zeros(len(docs), dtype=torch.float64).index_add_(0, rows, impressions)
    return docs, weighted / shown


def counterfactual_ndcg(scores, query_index, relevance, *, k: int | None = 10) -> float:
    """Mean NDCG@k (linear gain) of ``scores`` against click-estimated relevance, per query.

    The click-log validation metric: with ``relevance`` from :func:`ips_relevance` it estimates,
    without true labels, the NDCG of a ranking of the logged documents. Queries whose
    estimated relevance is all zero count 1 (as LightGBM's NDCG).

    Args:
        scores: [D] a model's scores of the documents; query_index: [D] their query ids;
        relevance: [D] non-negative estimated relevance.
    Returns:
        The mean over queries (float).
    """
    scores = check_tensor(torch.as_tensor(scores), "scores", ndim=1, kind="float")
    query_index = check_tensor(torch.as_tensor(query_index), "query_index", shape=scores.shape, kind="int")
    relevance = check_tensor(torch.as_tensor(relevance), "relevance", shape=scores.shape, kind="float")
    check_tensors(("relevance", relevance, ~(relevance >= 0) | ~torch.isfinite(relevance), "non-negative"),
                  ("scores", scores, ~torch.isfinite(scores), "finite"))
    order = torch.argsort(query_index, stable=True)
    _, sizes = torch.unique_consecutive(query_index[order], return_counts=True)
    s, mask = pad(scores[order].double(), sizes)
    y, _ = pad(relevance[order].double(), sizes)
    return float(ndcg(s, y, mask=mask, k=k, gain="linear").mean())


class ClickLogMetric:
    """A validation metric from a click log alone: counterfactual NDCG@k of any ranker.

    For model selection where true labels are unavailable (the choice of Unbiased LambdaMART's
    ``bias_p``, of naive against debiased training, of a neural epoch): the propensities θ̂ of
    the validation log come from :class:`RegressionEM` fitted on that log (or are given), the
    clicks become inverse-propensity relevance estimates (:func:`ips_relevance`, 1/θ̂ clipped at
    ``clip``), and a ranker scores its counterfactual NDCG@k over the logged documents
    (:func:`counterfactual_ndcg`). Use a log of queries the rankers were not trained on.

    Args:
        counts: the validation log aggregated per (document, position)
            (:meth:`rankkit.data.clicks.ClickLog.aggregate`).
        features: [N, F] features of the source dataset the counts' ``doc_index`` points into.
        propensities: [P] θ by position, or None to estimate them by regression-EM.
        n_positions, clip, k: position buckets, the clip of 1/θ̂ (None: no clip), NDCG cutoff.
        em: keyword arguments of the :class:`RegressionEM` that estimates θ̂.

    Attributes:
        propensities: [P] float64 θ̂ / θ̂_0 used; relevance: [D] the estimates of the D logged
            documents; features: [D, F] their features; query: [D] their query ids.

    >>> from rankkit.data import make_synthetic
    >>> from rankkit.data.clicks import simulate_clicks
    >>> data = make_synthetic(20, 8, 3, seed=0)
    >>> log = simulate_clicks(data, torch.rand(data.n_docs, generator=torch.Generator().manual_seed(0)),
    ...                       sessions_per_query=20, k=5)
    >>> metric = ClickLogMetric(log.aggregate(), data.features, propensities=1 / torch.arange(1., 6.))
    >>> 0.0 <= metric(lambda x: x[:, 0]) <= 1.0
    True
    """

    def __init__(self, counts, features, *, propensities=None, n_positions: int = 10, clip: float | None = None,
                 k: int | None = 10, em: dict | None = None):
        features = torch.as_tensor(features)
        check_tensor(features, "features", ndim=2, kind="float")
        doc_index = check_tensor(torch.as_tensor(counts.doc_index), "counts.doc_index", ndim=1, kind="int")
        check_tensors(("counts.doc_index", doc_index, (doc_index < 0) | (doc_index >= features.shape[0]),
                       f"in 0..{features.shape[0] - 1} (rows of `features`)"))
        self.k = check_k(k)
        if propensities is None:
            model = RegressionEM(n_positions, **(em or {}))
            model.fit(features[doc_index], counts.clicks, counts.position, impressions=counts.impressions)
            propensities = model.propensities_
        propensities = torch.as_tensor(propensities).double()
        self.propensities = propensities / propensities[0]
        docs, self.relevance = ips_relevance(doc_index, counts.clicks, counts.impressions, counts.position,
                                             self.propensities, clip=clip)
        first = torch.zeros(len(docs), dtype=torch.long)
        first[torch.unique(doc_index, return_inverse=True)[1]] = torch.as_tensor(counts.query_index).long()
        self.query = first
        self.features = features[docs]

    def __repr__(self) -> str:
        return (f"ClickLogMetric({len(self.relevance)} documents, "
                f"propensities={[round(v, 3) for v in self.propensities.tolist()]})")

    def __call__(self, ranker) -> float:
        """Counterfactual NDCG@k of ``ranker``: a callable features [D, F] -> scores [D], or an
        object with such a ``predict``."""
        return counterfactual_ndcg(ranker_scores(ranker, self.features), self.query, self.relevance, k=self.k)


def ranker_scores(ranker, features: torch.Tensor) -> torch.Tensor:
    """Scores [D] float64 of ``features`` [D, F] by ``ranker``: a callable, or an object with a
    ``predict`` (numpy or torch output), without gradients."""
    predict = getattr(ranker, "predict", ranker)
    with torch.no_grad():
        scores = predict(features)
    return torch.as_tensor(scores.numpy() if hasattr(scores, "numpy") else scores).double().reshape(-1)


def multiple_click_ratio(log: SessionLog, click_probability: torch.Tensor) -> float:
    """Observed / expected number of sessions with two or more clicks among those with one or
    more, the expectation under independent clicks of probability ``click_probability`` [N]
    (the fitted position-based model's θ_k γ(x) of each row); 1.0 when nothing is expected."""
    n_sessions = int(log.session.max()) + 1 if len(log.session) else 0
    q = click_probability.double().clamp(1e-9, 1 - 1e-9)
    log_none = torch.zeros(n_sessions, dtype=torch.float64).index_add_(0, log.session, torch.log1p(-q))
    odds = torch.zeros(n_sessions, dtype=torch.float64).index_add_(0, log.session, q / (1 - q))
    none = log_none.exp()
    one = none * odds
    n_clicks = torch.zeros(n_sessions, dtype=torch.float64).index_add_(0, log.session, log.clicks)
    some = n_clicks > 0
    expected = float((1 - one[some] / (1 - none[some]).clamp(min=1e-12)).clamp(0, 1).sum())
    observed = float((n_clicks[some] >= 2).sum())
    return observed / expected if expected > 0 else 1.0


def cascade_relevance(log: SessionLog) -> torch.Tensor:
    """[D] float64 click rates of the documents when examined, under a cascade: every row at or
    above its session's last click was examined (rows below it are left out: the user may have
    stopped there).

    A log whose sessions without a click were dropped overstates the rates of the documents
    shown last (examined there only when clicked). The drop cannot be undone from the log
    alone: with each document always at one position, the click pattern of a kept session
    has fewer degrees of freedom than the rates to recover.
    """
    rows = log.examined()
    n_docs = len(log.features)
    shown = torch.zeros(n_docs, dtype=torch.float64).index_add_(0, log.doc[rows], torch.ones_like(log.clicks[rows]))
    clicked = torch.zeros(n_docs, dtype=torch.float64).index_add_(0, log.doc[rows], log.clicks[rows])
    return clicked / shown.clamp(min=1)


class SessionClickMetric:
    """Counterfactual NDCG@k of any ranker on a click log of sessions (see the module).

    Args:
        features: [N, F] the shown rows' features; clicks: [N] 0/1; sizes: [S] rows per session
            (contiguous); position: [N] 0-based displayed ranks.
        click_model: ``"auto"`` (the log decides, :func:`multiple_click_ratio`), ``"pbm"`` or
            ``"cascade"``.
        n_positions: position buckets of the propensities (deeper positions share the last).
        clip: the bound on 1/θ̂ of the position-based estimates.
        k: the NDCG cutoff; cascade_ratio: the threshold of ``"auto"``.
        em: keyword arguments of the :class:`rankkit.clicks.propensity.RegressionEM` that estimates θ̂;
        seed: its seed.

    Attributes:
        click_model_: ``"pbm"`` or ``"cascade"``, the model the estimates use.
        ratio_: with ``"auto"``, :func:`multiple_click_ratio` of the log under the fitted
            position-based model (below ``cascade_ratio``: cascade).
        propensities: [P] the θ̂ of the position-based model (ones for ``"cascade"``).
        relevance, features, query: [D] estimates, [D, F] features and [D] queries of the
            logged documents.

    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.randn(4, 3, generator=g).repeat(20, 1)   # 20 sessions showing the same 4 documents
    >>> clicks = (torch.rand(80, generator=g) < 0.3).double()
    >>> metric = SessionClickMetric(x, clicks, torch.full((20,), 4), torch.arange(4).repeat(20), n_positions=4)
    >>> metric.click_model_ in ("pbm", "cascade"), len(metric.relevance)
    (True, 4)
    """

    def __init__(self, features, clicks, sizes, position, *, click_model: str = "auto", n_positions: int = 10,
                 clip: float | None = 50.0, k: int | None = 10, cascade_ratio: float = 0.2, em: dict | None = None,
                 seed: int = 0):
        check_choice(click_model, CLICK_MODELS, "click_model")
        n_positions = check_int(n_positions, "n_positions", low=1, high=4096)
        clip = None if clip is None else check_number(clip, "clip", low=1.0)
        cascade_ratio = check_number(cascade_ratio, "cascade_ratio", low=0.0)
        self.k = check_k(k)
        log = session_log(features, clicks, sizes, position)
        self.ratio_ = None
        self.propensities = torch.ones(n_positions, dtype=torch.float64)
        if click_model != "cascade":
            doc, bucket, shown, clicked = aggregate(log, n_positions)
            em_model = RegressionEM(n_positions, **{**EM_SETTINGS, "seed": seed,
                                                    **(em or {})})
            em_model.fit(log.features[doc], clicked, bucket, impressions=shown)
            self.propensities = em_model.propensities_
            if click_model == "auto":
                q = em_model.theta_[log.position.clamp(max=n_positions - 1)] * em_model.relevance(log.features)[log.doc]
                self.ratio_ = multiple_click_ratio(log, q)
                click_model = "cascade" if self.ratio_ < cascade_ratio else "pbm"
        self.click_model_ = click_model
        self.features, self.query = log.features, log.query
        if click_model == "cascade":
            self.relevance = cascade_relevance(log)
        else:
            pbm = ClickLogMetric(_Counts(doc, log.query[doc], bucket, shown, clicked), log.features,
                                 propensities=self.propensities, n_positions=n_positions, clip=clip, k=k)
            self.relevance, self.features, self.query = pbm.relevance, pbm.features, pbm.query

    def __repr__(self) -> str:
        return f"SessionClickMetric({len(self.relevance)} documents, click_model={self.click_model_!r})"

    def __call__(self, ranker) -> float:
        """Counterfactual NDCG@k of ``ranker``: a callable features [D, F] -> scores [D], or an
        object with such a ``predict``."""
        return counterfactual_ndcg(ranker_scores(ranker, self.features), self.query, self.relevance, k=self.k)


@dataclass
class _Counts:
    """The fields of :class:`rankkit.data.clicks.ClickCounts` that ClickLogMetric reads."""

    doc_index: torch.Tensor
    query_index: torch.Tensor
    position: torch.Tensor
    impressions: torch.Tensor
    clicks: torch.Tensor


class ClickLikelihood:
    """How well a ranker's scores explain a validation click log: the criterion of
    ``LambdaMART(unbiased="auto")``.

    A logistic click model with one free offset per displayed position, P(click) = sigmoid(a z
    + b_pos) with a ≥ 0, is fitted to the log by maximum likelihood (L-BFGS; 1 + P parameters
    on every row), z being the ranker's score centred within its session and scaled to unit
    variance over the log. A ranker whose scores run against the clicks gets a = 0: it
    explains nothing beyond the positions. The score is the fitted model's mean log-likelihood per row (higher is
    better). The position offsets absorb however examination falls with the position, so the
    criterion assumes no click model (position-based, cascade or other), and a ranker wins by
    predicting which of the documents shown at the same position are clicked. The counterfactual
    NDCG of :class:`SessionClickMetric` instead weighs clicks by inverse propensities, which
    favours the candidates trained with the same weights (docs/benchmarks.md, "Learning from
    clicks", measures both).

    Args:
        features: [N, F] the shown rows; clicks: [N] 0/1; sizes: [S] rows per session
            (contiguous); position: [N] 0-based displayed ranks; n_positions: P, position
            offsets (deeper positions share the last).

    >>> x = torch.randn(40, 2, generator=torch.Generator().manual_seed(0))
    >>> clicks = (x[:, 0] > 0.5).double()
    >>> metric = ClickLikelihood(x, clicks, torch.full((10,), 4), torch.arange(4).repeat(10), n_positions=4)
    >>> metric(lambda f: f[:, 0]) > metric(lambda f: -f[:, 0])
    True
    """

    def __init__(self, features, clicks, sizes, position, *, n_positions: int = 10):
        n_positions = check_int(n_positions, "n_positions", low=1, high=4096)
        log = session_log(features, clicks, sizes, position)
        self.features, self.doc, self.session, self.clicks = log.features, log.doc, log.session, log.clicks
        self.bucket = log.position.clamp(max=n_positions - 1)
        self.n_positions = n_positions

    def __repr__(self) -> str:
        return f"ClickLikelihood({len(self.clicks)} rows, {len(self.features)} documents)"

    def __call__(self, ranker) -> float:
        """Mean log-likelihood per row of the fitted click model on ``ranker``'s scores: a callable
        features [D, F] -> scores [D], or an object with such a ``predict``."""
        scores = ranker_scores(ranker, self.features)
        return explained_clicks(scores[self.doc], self.clicks, self.session, self.bucket, self.n_positions)


def explained_clicks(scores, clicks, session, bucket, n_positions: int) -> float:
    """:class:`ClickLikelihood` on row scores: the mean log-likelihood per row of sigmoid(a z +
    b_pos), a ≥ 0, fitted by L-BFGS; z the scores centred per session and scaled to unit
    variance.

    Args:
        scores, clicks: [N] a ranker's scores of the shown rows and their 0/1 clicks.
        session: [N] long, each row's session 0..S-1; bucket: [N] long, its position bucket
            in 0..n_positions − 1.
    """
    clicks = torch.as_tensor(clicks).double().reshape(-1)
    z = centred_scores(scores, session)
    a = torch.zeros(1, dtype=torch.float64, requires_grad=True)  # the slope is softplus(a) >= 0
    b = torch.zeros(n_positions, dtype=torch.float64, requires_grad=True)
    fitted = maximised([a, b], lambda: F.binary_cross_entropy_with_logits(F.softplus(a) * z + b[bucket], clicks))
    # The slope's floor, 0 (the positions alone), lies at a = −∞ of the softplus, which L-BFGS
    # only approaches (to about 1e-12). Its likelihood in closed form (each bucket's click rate)
    # is the exact score of a ranker that explains nothing.
    return max(fitted, _positions_only(clicks, bucket, n_positions))


def centred_scores(scores, session: torch.Tensor) -> torch.Tensor:
    """[N] float64 scores minus their session's mean, over their standard deviation on the log
    (what :func:`explained_clicks` reads: a ranker's offsets and scale do not count)."""
    s = torch.as_tensor(scores).double().reshape(-1)
    n_sessions = int(session.max()) + 1 if len(session) else 0
    total = torch.zeros(n_sessions, dtype=torch.float64).index_add_(0, session, s)
    count = torch.zeros(n_sessions, dtype=torch.float64).index_add_(0, session, torch.ones_like(s))
    z = s - (total / count.clamp(min=1))[session]
    return z / z.std().clamp(min=1e-12) if len(z) > 1 else z


def maximised(params: list[torch.Tensor], loss: Callable[[], torch.Tensor]) -> float:
    """−``loss()`` at its minimum over ``params`` by L-BFGS (strong Wolfe line search, up to 200
    iterations): the fitted log-likelihood of a click model whose negative mean is ``loss``."""
    opt = torch.optim.LBFGS(params, max_iter=200, tolerance_grad=1e-10, tolerance_change=1e-14,
                            line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        value = loss()
        value.backward()
        return value

    opt.step(closure)
    with torch.no_grad():
        return -float(loss())


def _positions_only(clicks: torch.Tensor, bucket: torch.Tensor, n_positions: int) -> float:
    """Mean log-likelihood per row of the best click model with one probability per position
    bucket (its click rate): the slope-0 end of :func:`explained_clicks`."""
    shown = torch.zeros(n_positions, dtype=torch.float64).index_add_(0, bucket, torch.ones_like(clicks))
    clicked = torch.zeros(n_positions, dtype=torch.float64).index_add_(0, bucket, clicks)
    rate = clicked / shown.clamp(min=1)
    ll = torch.xlogy(clicked, rate) + torch.xlogy(shown - clicked, 1 - rate)
    return float(ll.sum() / max(1, len(clicks)))
