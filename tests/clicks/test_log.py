"""The click log as sessions (rankkit.clicks.log): its queries against a union-find, missing
values as one document, the distinct rows against torch.unique."""
from __future__ import annotations

import math

import numpy as np
import torch

from rankkit.clicks.log import distinct_rows, session_log


def test_session_log_queries_match_a_union_find():
    g = torch.Generator().manual_seed(3)
    docs = torch.randn(12, 3, generator=g)
    rows = torch.randint(0, 12, (40,), generator=g)
    sizes = torch.tensor([4, 3, 5, 2, 6, 4, 3, 5, 4, 4])
    log = session_log(docs[rows], torch.zeros(40), sizes, torch.zeros(40, dtype=torch.long))
    parent = list(range(12))

    def find(i):
        while parent[i] != i:
            i = parent[i]
        return i

    session = np.repeat(np.arange(len(sizes)), sizes.numpy())
    for s in range(len(sizes)):
        members = rows[torch.from_numpy(session == s)].tolist()
        for d in members[1:]:
            parent[find(d)] = find(members[0])
    # the same partition of the shown documents (numbering aside)
    key = {tuple(v.tolist()): i for i, v in enumerate(docs)}
    truth = [find(key[tuple(f.tolist())]) for f in log.features]
    ours = log.query.tolist()
    assert len(set(zip(truth, ours))) == len(set(truth)) == len(set(ours))
    assert torch.equal(log.features[log.doc], docs[rows])


def test_missing_values_are_one_document():
    x = torch.tensor([[1.0, math.nan], [1.0, math.nan], [2.0, 0.0]])
    log = session_log(x, torch.zeros(3), [3], torch.arange(3))
    assert log.doc.tolist()[0] == log.doc.tolist()[1] != log.doc.tolist()[2]


def test_distinct_rows_equal_torch_unique_even_when_hashes_collide():
    """The hashed grouping gives torch.unique(dim=0)'s rows and inverse exactly: repeated rows,
    −0 beside +0, a constant column; and with every hash equal (a collision) the full sort."""
    g = torch.Generator().manual_seed(1)
    half = torch.randn(150, 7, generator=g, dtype=torch.float64).round(decimals=1)
    half[:, 3] = 0.0
    half[:, 5] = 0.0
    twin = half.clone()
    twin[:, 5] = -0.0  # equal to its +0 row
    base = torch.cat([half, twin])
    rows = base[torch.randint(0, 300, (5000,), generator=g)]
    want = torch.unique(rows, dim=0, return_inverse=True)
    for multipliers in (None, torch.zeros(7, dtype=torch.long), torch.tensor([1, 0, 0, 0, 0, 0, 0])):
        got = distinct_rows(rows, multipliers)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert len(want[0]) == 150  # −0 and +0 rows are one
