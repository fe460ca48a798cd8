"""A click log as sessions: one row per shown document, the distinct documents and their queries.

Every click-log computation starts here: the propensity estimators aggregate it per (document,
position) (:func:`aggregate`), and the validation criteria score rankers on its distinct
documents. Documents are identified by their feature rows (two rows with equal features are one
document to any ranker), and queries are the groups of sessions that share documents (connected
components of the document–session graph).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from rankkit.infra.checks import check_sizes, check_tensor, check_tensors

__all__ = ["SessionLog", "aggregate", "distinct_rows", "session_log"]


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
