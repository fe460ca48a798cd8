"""Simulated click logs: graded data shown by a production ranker to simulated users.

The protocol of unbiased learning-to-rank studies (Joachims, Swaminathan, Schnabel, "Unbiased
Learning-to-Rank with Biased Feedback", WSDM 2017; Ai, Bi, Luo, Guo, Croft, "Unbiased Learning
to Rank with Unbiased Propensity Estimation", SIGIR 2018; Hu, Wang, Peng, Li, "Unbiased
LambdaMART: An Unbiased Pairwise Learning-to-Rank Algorithm", WWW 2019):

1. a *production ranker* is trained on a small share (1 %) of the training queries with their
   true labels (:func:`rankkit.training.clicks.production_ranker`);
2. it orders every query's documents, and the top ``k`` are shown;
3. each query is shown ``sessions_per_query`` times, and a click model decides in every session
   which shown documents are clicked (:func:`simulate_clicks`).

A document of label y is *attractive* (would be clicked once examined) with probability::

    ρ(y) = ε₋ + (ε₊ − ε₋) (2^y − 1) / (2^ymax − 1)

so an irrelevant document (y = 0) is clicked by noise with ε₋ and a perfect one with ε₊; with
ε₊ = 1 this is the relevance probability of Ai et al. 2018, ε₋ + (1 − ε₋)(2^y − 1)/(2^ymax − 1).

Two click models decide what is examined (r is the 0-based displayed rank):

* :class:`PositionBasedModel`: rank r is examined with θ_r = (1 / (r + 1))^η, independently of
  everything else, so P(click at r) = θ_r ρ(y_r) (Joachims et al. 2017; η = 0 is no bias).
* :class:`CascadeModel`: the user scans down from rank 0 and clicks an examined document with
  ρ(y); after a click she stops with probability ``stop`` (``stop=1``: the classic cascade, at
  most one click). So P(click at r) = ρ(y_r) Π_{r' < r} (1 − stop · ρ(y_r')).

The output is a :class:`ClickLog`: a :class:`RankingDataset` whose "queries" are sessions
(features of the shown documents in displayed order, labels = clicks 0/1, ``position`` each
row's displayed rank, so that its padded batches carry it to the unbiased rankers), plus the
session → query map and the shown document's index in the source dataset.
A session is a query for every rankkit model, for LightGBM (``group`` = session
sizes, ``position`` = the positions) and for :class:`rankkit.clicks.propensity.PropensityEstimator`.
:meth:`ClickLog.aggregate` gives the compact alternative: counts per (document, position).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from rankkit.infra.checks import check_bool, check_int, check_number, check_tensors, describe
from rankkit.data.dataset import PaddedBatch, RankingDataset, pad

__all__ = [
    "CascadeModel",
    "ClickCounts",
    "ClickLog",
    "PositionBasedModel",
    "attractiveness",
    "shown_lists",
    "simulate_clicks",
]

# Sessions sampled at once, in units of shown slots (sessions × k): bounds the temporaries.
_CHUNK_SLOTS = 1 << 22


def attractiveness(labels: torch.Tensor, *, epsilon_plus: float = 1.0, epsilon_minus: float = 0.1,
                   max_label: float = 4.0) -> torch.Tensor:
    """Click probability of an examined document: ρ(y) = ε₋ + (ε₊ − ε₋)(2^y − 1)/(2^ymax − 1).

    Args:
        labels: [...] graded labels in 0..``max_label``.
    Returns:
        [...] float64 probabilities.

    >>> attractiveness(torch.tensor([0., 1., 2.]), epsilon_minus=0.1, max_label=2)
    tensor([0.1000, 0.4000, 1.0000], dtype=torch.float64)
    """
    scale = 2.0 ** max_label - 1.0
    grade = (torch.exp2(labels.double()) - 1.0) / scale if scale > 0 else torch.zeros_like(labels, dtype=torch.float64)
    return epsilon_minus + (epsilon_plus - epsilon_minus) * grade


@dataclass(frozen=True, kw_only=True)
class _ClickModel:
    """What both click models share: the click noise and the label scale (see the module)."""

    epsilon_plus: float = 1.0
    epsilon_minus: float = 0.1
    max_label: float | None = None

    def __post_init__(self):
        check_number(self.epsilon_plus, "epsilon_plus", low=0.0, high=1.0)
        check_number(self.epsilon_minus, "epsilon_minus", low=0.0, high=self.epsilon_plus)
        if self.max_label is not None:
            check_number(self.max_label, "max_label", low=0.0, low_open=True)

    def relevance(self, labels: torch.Tensor, max_label: float) -> torch.Tensor:
        """ρ(y) of labels [...] (float64), with ``self.max_label`` when set, else ``max_label``."""
        top = self.max_label if self.max_label is not None else max_label
        return attractiveness(labels, epsilon_plus=self.epsilon_plus, epsilon_minus=self.epsilon_minus,
                              max_label=top)


@dataclass(frozen=True, kw_only=True)
class PositionBasedModel(_ClickModel):
    """Position-based model: P(click at rank r) = (1 / (r + 1))^η · ρ(y_r).

    >>> PositionBasedModel(eta=1.0).examination(3)
    tensor([1.0000, 0.5000, 0.3333], dtype=torch.float64)
    """

    eta: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        check_number(self.eta, "eta", low=0.0)

    def examination(self, k: int) -> torch.Tensor:
        """θ_r = (1 / (r + 1))^η for r = 0..k-1, shape [k] float64."""
        return (1.0 / torch.arange(1, k + 1, dtype=torch.float64)) ** self.eta

    def click_rates(self, relevance: torch.Tensor) -> torch.Tensor:
        """Exact P(click) of ρ [S, K] (float64) in displayed order: θ_r ρ_r, shape [S, K]."""
        return relevance * self.examination(relevance.shape[-1])

    def sample(self, relevance: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Clicks [S, K] bool of sessions with attractiveness ρ [S, K] (0 on padding)."""
        u = torch.rand(relevance.shape, generator=generator, dtype=torch.float64)
        return u < self.click_rates(relevance)


@dataclass(frozen=True, kw_only=True)
class CascadeModel(_ClickModel):
    """Cascade model: scan down, click with ρ(y), stop after a click with ``stop``.

    P(click at r) = ρ_r Π_{r' < r} (1 − stop · ρ_r'); ``stop=1`` is the classic cascade.

    >>> CascadeModel(stop=1.0).click_rates(torch.tensor([[0.5, 0.5, 1.0]], dtype=torch.float64))
    tensor([[0.5000, 0.2500, 0.2500]], dtype=torch.float64)
    """

    stop: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        check_number(self.stop, "stop", low=0.0, high=1.0)

    def click_rates(self, relevance: torch.Tensor) -> torch.Tensor:
        """Exact P(click) of ρ [S, K] (float64) in displayed order, shape [S, K]."""
        go_on = torch.cumprod(1.0 - self.stop * relevance, dim=-1)
        reached = torch.cat([torch.ones_like(go_on[..., :1]), go_on[..., :-1]], dim=-1)
        return relevance * reached

    def sample(self, relevance: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Clicks [S, K] bool of sessions with attractiveness ρ [S, K] (0 on padding)."""
        attracted = torch.rand(relevance.shape, generator=generator, dtype=torch.float64) < relevance
        stops = torch.rand(relevance.shape, generator=generator, dtype=torch.float64) < self.stop
        halted = (attracted & stops).long().cumsum(-1)
        examined = (halted - (attracted & stops).long()) == 0  # no stop strictly above r
        return attracted & examined


ClickModel = PositionBasedModel | CascadeModel


class ClickCounts(NamedTuple):
    """A click log aggregated per (document, displayed position); M distinct pairs.

    Attributes:
        doc_index: [M] long, the document's index in the source dataset.
        query_index: [M] long, its query's index in the source dataset.
        position: [M] long, the 0-based displayed rank.
        impressions: [M] long, sessions that showed the document at that position.
        clicks: [M] long, how many of them clicked it.
    """

    doc_index: torch.Tensor
    query_index: torch.Tensor
    position: torch.Tensor
    impressions: torch.Tensor
    clicks: torch.Tensor


@dataclass(eq=False)
class ClickLog:
    """Simulated sessions as a ranking dataset. S sessions, N shown documents in all.

    Attributes:
        sessions: a :class:`RankingDataset` with one "query" per session, its rows the shown
            documents in displayed order: features [N, F] copied from the source, labels [N]
            the clicks (0.0 / 1.0), qids [S] the session numbers 0..S-1, position [N] long
            each row's 0-based displayed rank.
        session_query: [S] long, each session's query index in the source dataset.
        doc_index: [N] long, each row's document index in the source dataset (so the true
            label of a row is ``source.labels[doc_index]``).
    """

    sessions: RankingDataset
    session_query: torch.Tensor
    doc_index: torch.Tensor
    model: ClickModel | None = field(default=None, repr=False)

    @property
    def n_sessions(self) -> int:
        return self.sessions.n_queries

    @property
    def position(self) -> torch.Tensor:
        """[N] long, each row's 0-based displayed rank (the sessions' ``position``)."""
        return self.sessions.position

    @property
    def clicks(self) -> torch.Tensor:
        """[N] float clicks (the sessions' labels)."""
        return self.sessions.labels

    def padded(self, sessions=None) -> tuple[PaddedBatch, torch.Tensor]:
        """The given sessions (all by default) padded, plus their positions [S, K] (long, 0 on
        padding; the same tensor as the batch's ``position``)."""
        batch = self.sessions.padded(sessions)
        return batch, batch.position

    def click_rate_by_position(self, k: int | None = None) -> torch.Tensor:
        """Empirical click-through rate of each displayed position, shape [k] float64."""
        k = int(self.position.max()) + 1 if k is None else k
        shown = torch.bincount(self.position, minlength=k)[:k].double()
        clicked = torch.bincount(self.position, weights=self.clicks.double(), minlength=k)[:k]
        return clicked / shown.clamp(min=1)

    def aggregate(self) -> ClickCounts:
        """Impressions and clicks per (document, position), sorted by document then position."""
        k = int(self.position.max()) + 1 if len(self.position) else 1
        key = self.doc_index * k + self.position
        keys, inverse = torch.unique(key, return_inverse=True)
        impressions = torch.bincount(inverse, minlength=len(keys))
        clicks = torch.bincount(inverse, weights=self.clicks.double(), minlength=len(keys)).round().long()
        query = torch.zeros(len(keys), dtype=torch.long)
        query[inverse] = self.session_query[self.sessions.doc_query_index()]
        return ClickCounts(keys // k, query, keys % k, impressions, clicks)


def shown_lists(dataset: RankingDataset, scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-k of every query by descending score (stable: ties keep the dataset's order).

    Returns:
        (docs, mask): docs [Q, K] long flat document indices in displayed order (0 on padding),
        mask [Q, K] bool, K = min(k, longest query).
    """
    sizes = dataset.sizes
    padded, mask = pad(scores.double(), sizes, fill=-torch.inf)
    order = torch.sort(padded, dim=1, descending=True, stable=True).indices[:, :k]
    shown = mask.gather(1, order)
    docs = torch.where(shown, dataset.offsets[:-1, None] + order, 0)
    return docs, shown


def simulate_clicks(dataset: RankingDataset, scores, *, model: ClickModel | None = None,
                    sessions_per_query: int = 10, k: int = 10, seed: int = 0,
                    drop_unclicked: bool = False) -> ClickLog:
    """Sessions of every query's top-k under a click model (see the module docstring).

    Every session of a query shows the same list (the production ranking); the sampling is
    vectorised over sessions, in chunks of queries (about 4M shown slots at once).

    Args:
        dataset: graded data (labels 0..ymax), Q queries, N documents.
        scores: [N] production-ranker scores (tensor or array), finite.
        model: a :class:`PositionBasedModel` (the default, η = 1) or :class:`CascadeModel`.
            Its ``max_label`` defaults to the dataset's largest label: pass the scale's top
            label (2 for MQ2008, 4 for MSLR) so that subsets get the same probabilities.
        sessions_per_query: sessions simulated for every query.
        k: documents shown per session (fewer when a query has fewer).
        seed: seeds the generator; the same seed gives the same log.
        drop_unclicked: leave out sessions without a click (they carry no pair).
    Returns:
        A :class:`ClickLog`.

    >>> from rankkit.data import make_synthetic
    >>> data = make_synthetic(4, 6, 3, seed=0)
    >>> log = simulate_clicks(data, -torch.arange(24.0), sessions_per_query=5, k=3)
    >>> log.n_sessions, log.sessions.n_docs, log.position[:4].tolist()
    (20, 60, [0, 1, 2, 0])
    """
    if not isinstance(dataset, RankingDataset):
        raise ValueError(f"`dataset` has to be a RankingDataset, got {describe(dataset)}")
    model = PositionBasedModel() if model is None else model
    if not isinstance(model, (PositionBasedModel, CascadeModel)):
        raise ValueError(f"`model` has to be a PositionBasedModel or a CascadeModel, got {describe(model)}")
    sessions_per_query = check_int(sessions_per_query, "sessions_per_query")
    k = check_int(k, "k")
    seed = check_int(seed, "seed", low=0)
    check_bool(drop_unclicked, "drop_unclicked")
    scores = torch.as_tensor(np.asarray(scores) if not isinstance(scores, torch.Tensor) else scores)
    if scores.shape != (dataset.n_docs,) or not scores.is_floating_point():
        raise ValueError(f"`scores` has to be a float tensor of shape ({dataset.n_docs},), got {describe(scores)}")
    top = float(dataset.labels.max()) if dataset.n_docs else 0.0
    max_label = model.max_label if model.max_label is not None else max(top, 1.0)
    check_tensors(("scores", scores, ~torch.isfinite(scores), "finite"),
                  ("labels", dataset.labels, (dataset.labels < 0) | (dataset.labels > max_label),
                   f"in 0..{max_label:g} (`max_label` of the click model)"))

    docs, shown = shown_lists(dataset, scores, k)
    relevance = model.relevance(dataset.labels[docs], max_label).masked_fill(~shown, 0.0)
    generator = torch.Generator().manual_seed(seed)
    width = docs.shape[1]
    step = max(1, _CHUNK_SLOTS // max(1, sessions_per_query * width))
    parts_docs, parts_clicks, parts_query = [], [], []
    for q0 in range(0, dataset.n_queries, step):
        q = torch.arange(q0, min(q0 + step, dataset.n_queries))
        rel = relevance[q].repeat_interleave(sessions_per_query, dim=0)
        clicks = model.sample(rel, generator)
        query = q.repeat_interleave(sessions_per_query)
        if drop_unclicked:
            keep = clicks.any(1)
            clicks, query = clicks[keep], query[keep]
        parts_clicks.append(clicks)
        parts_query.append(query)
        parts_docs.append(docs[query])
    clicks = torch.cat(parts_clicks) if parts_clicks else torch.zeros(0, width, dtype=torch.bool)
    session_query = torch.cat(parts_query) if parts_query else torch.zeros(0, dtype=torch.long)
    session_docs = torch.cat(parts_docs) if parts_docs else torch.zeros(0, width, dtype=torch.long)
    real = shown[session_query]
    sizes = real.sum(1)
    doc_index = session_docs[real]
    position = torch.arange(width).expand_as(real)[real]
    sessions = RankingDataset(dataset.features[doc_index], clicks[real].float(),
                              torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(sizes, 0)]),
                              torch.arange(len(sizes)), None, f"clicks({dataset.source})", position)
    return ClickLog(sessions, session_query, doc_index, model)
