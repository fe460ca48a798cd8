r"""Choosing a debiasing without true labels: a validation click log of sessions, scored.

Two criteria: :class:`ClickLikelihood`, how well a ranker's scores explain the clicks once each
position has its own offset (no click model assumed; what ``LambdaMART(unbiased="auto")``
maximises), and :class:`SessionClickMetric`, a counterfactual NDCG, described next.

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
  inverse-propensity click rate (:func:`rankkit.unbiased.ips_relevance`, 1/θ̂ clipped).
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

import torch
import torch.nn.functional as F

from rankkit.infra.checks import (
    check_choice,
    check_int,
    check_k,
    check_number,
    check_sizes,
    check_tensor,
    check_tensors,
)
from rankkit.unbiased import EM_SETTINGS, ClickLogMetric, RegressionEM, counterfactual_ndcg, ranker_scores

__all__ = ["CLICK_MODELS", "ClickLikelihood", "SessionClickMetric", "SessionLog", "aggregate", "cascade_relevance",
           "SuccessiveHalving", "distinct_rows", "explained_clicks", "ips_propensities", "multiple_click_ratio",
           "session_log"]

CLICK_MODELS = ("auto", "pbm", "cascade")



@dataclass(eq=False)
class SessionLog:
    """A click log of sessions, one row per shown document. N rows, D distinct documents.

    Attributes:
        features: [D, F] the distinct documents' features.
        doc: [N] long, each row's document (a row of ``features``).
        session: [N] long, each row's session 0..S-1.
        query: [D] long, each document's query (sessions sharing a document are one query).
        position: [N] long, 0-based displayed positions.
        clicks: [N] float64 0/1.
    """

    features: torch.Tensor
    doc: torch.Tensor
    session: torch.Tensor
    query: torch.Tensor
    position: torch.Tensor
    clicks: torch.Tensor

    def examined(self) -> torch.Tensor:
        """[N] bool: rows at or above their session's last click (every row of a session
        without a click): what a cascade user surely examined."""
        n_sessions = int(self.session.max()) + 1 if len(self.session) else 0
        clicked_at = torch.where(self.clicks > 0, self.position, torch.full_like(self.position, -1))
        last = torch.full((n_sessions,), -1, dtype=torch.long).scatter_reduce(0, self.session, clicked_at, "amax")
        last = torch.where(last < 0, torch.full_like(last, torch.iinfo(torch.long).max), last)
        return self.position <= last[self.session]


def session_log(features, clicks, sizes, position, *,
                names: tuple[str, str, str] = ("eval_set X", "eval_set clicks", "eval_position")) -> SessionLog:
    """A :class:`SessionLog` of flat rows: features [N, F], clicks [N] 0/1, sizes [S] rows per
    session (contiguous), position [N] 0-based ranks; ``names``: the three arguments' names in
    error messages."""
    x_name, clicks_name, position_name = names
    features = torch.as_tensor(features)
    check_tensor(features, x_name, ndim=2, kind="float")
    n = features.shape[0]
    clicks = torch.as_tensor(clicks).double().reshape(-1)
    position = torch.as_tensor(position).reshape(-1)
    check_tensor(clicks, clicks_name, shape=(n,))
    check_tensor(position, position_name, shape=(n,))
    check_tensors((clicks_name, clicks, (clicks != 0) & (clicks != 1), "0 or 1 (clicks)"),
                  (position_name, position, (position < 0) | (position != position.round()),
                   "whole numbers >= 0"))
    sizes = check_sizes(torch.as_tensor(sizes), n, "sizes").long()
    session = torch.repeat_interleave(torch.arange(len(sizes)), sizes)
    # a NaN never equals itself: give missing values one code so that equal rows stay equal
    keyed = torch.nan_to_num(features.double(), nan=-1.2345e300)
    distinct, doc = distinct_rows(keyed)
    first = torch.full((len(distinct),), n, dtype=torch.long).scatter_reduce(0, doc, torch.arange(n), "amin")
    return SessionLog(features[first].float(), doc, session, _components(doc, session, len(distinct)),
                      position.long(), clicks)


def distinct_rows(rows: torch.Tensor, multipliers: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.unique(rows, dim=0, return_inverse=True)`` of float rows [N, F] without NaN (the
    distinct rows in lexicographic order, and each row's index among them), with the row sort
    done on one representative per distinct row: a click log shows each document in many
    sessions, and sorting all N rows took a tenth of a race. Rows are grouped by a hash of their
    bits (``multipliers`` [F] int64, odd; fixed by default), every row is compared with its
    group's first (a collision falls back to the full sort), then the representatives are sorted
    (equal rows in two groups meet there)."""
    if multipliers is None:
        multipliers = torch.randint(1, 2**62, (rows.shape[1],), generator=torch.Generator().manual_seed(0)) * 2 + 1
    bits = (rows.double() + 0.0).contiguous().view(torch.int64)  # + 0.0: −0 and +0 in one group
    keys, group = torch.unique((bits * multipliers).sum(1), return_inverse=True)  # int64 products wrap
    first = torch.full((len(keys),), rows.shape[0], dtype=torch.long).scatter_reduce(
        0, group, torch.arange(rows.shape[0]), "amin")
    if not bool((rows == rows[first][group]).all()):  # two distinct rows share a hash
        return torch.unique(rows, dim=0, return_inverse=True)
    distinct, of_group = torch.unique(rows[first], dim=0, return_inverse=True)
    return distinct, of_group[group]


def ips_propensities(features, clicks, sizes, position, *, n_positions: int, seed: int = 0,
                     names: tuple[str, str, str] = ("X", "y", "position")) -> torch.Tensor:
    """[n_positions] examination probabilities θ̂ of a training click log (flat rows: features
    [N, F], clicks [N] 0/1, sizes [S] rows per session, position [N] dense 0-based) by
    regression-EM (Wang, Golbandi, Bendersky, Metzler, Najork, "Position Bias Estimation for
    Unbiased Learning to Rank in Personal Search", WSDM 2018; :class:`RegressionEM` with
    :data:`rankkit.unbiased.EM_SETTINGS`), fitted on the impressions aggregated per (document,
    position): a document shown in many sessions is one row (:func:`session_log`). The
    propensities of ``unbiased="ips"``, for the booster and the neural rankers alike."""
    log = session_log(features, clicks, sizes, position, names=names)
    doc, bucket, shown, clicked = aggregate(log, n_positions)
    em = RegressionEM(n_positions, **EM_SETTINGS, seed=seed)
    em.fit(log.features[doc].nan_to_num(0.0), clicked, bucket, impressions=shown)
    return em.propensities_


def _components(doc: torch.Tensor, session: torch.Tensor, n_docs: int) -> torch.Tensor:
    """[D] the query of each document: connected components of the document–session graph,
    numbered 0.. in order of their first session (label propagation of the smallest session)."""
    n_sessions = int(session.max()) + 1 if len(session) else 0
    label = torch.arange(n_sessions)
    while True:
        of_doc = torch.full((n_docs,), n_sessions, dtype=torch.long).scatter_reduce(0, doc, label[session], "amin")
        new = label.clone().scatter_reduce(0, session, of_doc[doc], "amin")
        new = new[new]  # jump: a label points at a session whose own label may be smaller
        if torch.equal(new, label):
            break
        label = new
    return torch.unique(of_doc, return_inverse=True)[1]


def aggregate(log: SessionLog, n_positions: int, rows: torch.Tensor | None = None):
    """(doc, bucket, impressions, clicks), each [M]: the log's rows (all, or the bool ``rows``)
    summed per (document, position bucket), bucket = min(position, n_positions − 1)."""
    rows = torch.ones(len(log.doc), dtype=torch.bool) if rows is None else rows
    bucket = log.position[rows].clamp(max=n_positions - 1)
    key = log.doc[rows] * n_positions + bucket
    keys, inverse = torch.unique(key, return_inverse=True)
    impressions = torch.zeros(len(keys), dtype=torch.float64).index_add_(0, inverse, torch.ones(len(key)).double())
    clicks = torch.zeros(len(keys), dtype=torch.float64).index_add_(0, inverse, log.clicks[rows])
    return keys // n_positions, keys % n_positions, impressions, clicks


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
        em: keyword arguments of the :class:`rankkit.unbiased.RegressionEM` that estimates θ̂;
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


class SuccessiveHalving:
    """The race of ``unbiased="auto"``, one for the trees and the neural rankers: named candidates
    are scored on a validation click log (:class:`ClickLikelihood`, :func:`explained_clicks`), and
    at the end of each stage only the best ``keep[stage]`` go on (by default the best two after
    the first stage, the best one after the second); the winner is the best of the last stage.
    Equal scores keep the order the candidates had (the order given, then the last ranking).

    The family decides what a stage is and what it costs: ``LambdaMART`` grows every live
    candidate to the stage's rounds (:func:`rankkit.boosting.booster.race_rounds`), the neural
    rankers train them side by side for a third of the epochs
    (:class:`rankkit.neural.debias.DebiasingRace`).

    Args:
        names: the candidates, in the order that breaks ties.
        keep: how many go on after each stage (non-increasing, the last 1).

    Attributes:
        alive: the candidates still racing, best first after :meth:`rank`.
        scores_: ``{name: {"score": float, "stage": int, ...}}``, each candidate's last score, the
            1-based stage it was scored in (0 where a state saved before 2026-11-28 did not say)
            and what :meth:`record` was told beside it.
        stage: the stages ended so far.
        choice_: the leader after the last :meth:`rank` (the winner once every stage ended).

    >>> race = SuccessiveHalving(["a", "b", "c"])
    >>> for name, value in (("a", 0.1), ("b", 0.3), ("c", 0.2)):
    ...     race.record(name, value)
    >>> race.rank(stage_over=True), race.alive
    ('b', ['b', 'c'])
    """

    def __init__(self, names, keep: tuple[int, ...] = (2, 1)):
        self.alive = list(names)
        self.keep = tuple(keep)
        self.scores_: dict[str, dict] = {}
        self.stage = 0
        self.choice_: str | None = None

    @property
    def over(self) -> bool:
        """True once every stage ended (one candidate is left)."""
        return self.stage >= len(self.keep)

    def record(self, name: str, score: float, **info) -> None:
        """Candidate ``name``'s ``score`` (higher is better) in the current stage, with ``info``."""
        self.scores_[name] = {"score": float(score), "stage": min(self.stage, len(self.keep) - 1) + 1, **info}

    def rank(self, *, stage_over: bool) -> str:
        """Order the live candidates by their last scores and, when ``stage_over``, keep the
        stage's best; returns the leader (``choice_``)."""
        self.alive = sorted(self.alive, key=lambda name: -self.scores_[name]["score"])
        if stage_over and not self.over:
            self.alive = self.alive[:self.keep[self.stage]]
            self.stage += 1
        self.choice_ = self.alive[0]
        return self.choice_

    def state(self) -> dict:
        return {"alive": list(self.alive), "scores": {k: dict(v) for k, v in self.scores_.items()},
                "stage": self.stage, "choice": self.choice_}

    def load_state(self, state: dict) -> None:
        self.alive = list(state["alive"])
        self.scores_ = {k: dict(v) if isinstance(v, dict) else {"score": float(v), "stage": 0}
                        for k, v in state["scores"].items()}  # before 2026-11-28: plain scores
        self.stage = int(state.get("stage", sum(len(self.alive) <= k for k in self.keep)))
        self.choice_ = state["choice"]


def explained_clicks(scores, clicks, session, bucket, n_positions: int) -> float:
    """:class:`ClickLikelihood` on row scores: the mean log-likelihood per row of sigmoid(a z +
    b_pos), a ≥ 0, fitted by L-BFGS; z the scores centred per session and scaled to unit
    variance.

    Args:
        scores, clicks: [N] a ranker's scores of the shown rows and their 0/1 clicks.
        session: [N] long, each row's session 0..S-1; bucket: [N] long, its position bucket
            in 0..n_positions − 1.
    """
    s = torch.as_tensor(scores).double().reshape(-1)
    clicks = torch.as_tensor(clicks).double().reshape(-1)
    n_sessions = int(session.max()) + 1 if len(session) else 0
    total = torch.zeros(n_sessions, dtype=torch.float64).index_add_(0, session, s)
    count = torch.zeros(n_sessions, dtype=torch.float64).index_add_(0, session, torch.ones_like(s))
    z = s - (total / count.clamp(min=1))[session]
    z = z / z.std().clamp(min=1e-12) if len(z) > 1 else z
    a = torch.zeros(1, dtype=torch.float64, requires_grad=True)  # the slope is softplus(a) >= 0
    b = torch.zeros(n_positions, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([a, b], max_iter=200, tolerance_grad=1e-10, tolerance_change=1e-14,
                            line_search_fn="strong_wolfe")

    def loss():
        return F.binary_cross_entropy_with_logits(F.softplus(a) * z + b[bucket], clicks)

    def closure():
        opt.zero_grad()
        value = loss()
        value.backward()
        return value

    opt.step(closure)
    with torch.no_grad():
        fitted = -float(loss())
    # The slope's floor, 0 (the positions alone), lies at a = −∞ of the softplus, which L-BFGS
    # only approaches (to about 1e-12). Its likelihood in closed form (each bucket's click rate)
    # is the exact score of a ranker that explains nothing.
    return max(fitted, _positions_only(clicks, bucket, n_positions))


def _positions_only(clicks: torch.Tensor, bucket: torch.Tensor, n_positions: int) -> float:
    """Mean log-likelihood per row of the best click model with one probability per position
    bucket (its click rate): the slope-0 end of :func:`explained_clicks`."""
    shown = torch.zeros(n_positions, dtype=torch.float64).index_add_(0, bucket, torch.ones_like(clicks))
    clicked = torch.zeros(n_positions, dtype=torch.float64).index_add_(0, bucket, clicks)
    rate = clicked / shown.clamp(min=1)
    ll = torch.xlogy(clicked, rate) + torch.xlogy(shown - clicked, 1 - rate)
    return float(ll.sum() / max(1, len(clicks)))
