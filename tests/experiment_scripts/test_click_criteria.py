"""experiments/click_criteria.py's criteria on logs small enough to check by hand."""
from __future__ import annotations

import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "experiments"))


def _log():
    # two sessions of three rows shown at positions 0, 1, 2: the first clicked at position 2, the
    # second at positions 0 and 2
    session = torch.tensor([0, 0, 0, 1, 1, 1])
    clicks = torch.tensor([0.0, 0.0, 1.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    bucket = torch.tensor([0, 1, 2, 0, 1, 2])
    return session, clicks, bucket


def test_skip_above_counts_clicked_rows_against_the_unclicked_shown_above_them():
    from click_criteria import skip_above

    session, clicks, bucket = _log()
    # pairs: (row 2 > row 0), (row 2 > row 1), (row 5 > row 4); row 3 has nothing unclicked above
    right = torch.tensor([0.0, 1.0, 2.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    assert skip_above(right, session, clicks, bucket) == 1.0
    assert skip_above(-right, session, clicks, bucket) == 0.0
    assert skip_above(torch.zeros(6, dtype=torch.float64), session, clicks, bucket) == 0.5
    mixed = torch.tensor([3.0, 1.0, 2.0, 0.0, 5.0, 1.0], dtype=torch.float64)  # right on 1 of 3 pairs
    assert abs(skip_above(mixed, session, clicks, bucket) - 1 / 3) < 1e-12


def test_the_fitted_criteria_prefer_scores_that_follow_the_clicks():
    from click_criteria import conditional_logit, slopes

    g = torch.Generator().manual_seed(0)
    n = 400
    session = torch.arange(n).repeat_interleave(5)
    bucket = torch.arange(5).repeat(n)
    relevance = torch.randn(5 * n, generator=g, dtype=torch.float64)
    clicks = (torch.rand(5 * n, generator=g, dtype=torch.float64) < torch.sigmoid(2 * relevance - bucket)).double()
    for criterion in (slopes, conditional_logit):
        good = criterion(relevance, session, clicks, bucket)
        noise = criterion(torch.randn(5 * n, generator=g, dtype=torch.float64), session, clicks, bucket)
        assert good > noise + 0.05, criterion.__name__


def test_the_table_reports_what_each_criterion_picks():
    from click_criteria import CRITERIA, table

    def candidate(test, score):
        return {"test": test, **{c: score for c in CRITERIA}}

    record = {"data": "d", "click": "c", "LightGBM position": 0.5,
              "candidates": {"naive": candidate(0.1, 1.0), "pairwise p=1": candidate(0.2, 0.0),
                             "position": candidate(0.3, 0.0), "ips": candidate(0.4, 0.0)}}
    record["candidates"]["position+ips"] = candidate(0.35, 2.0)
    row = table([record]).splitlines()[2].split(" | ")
    assert row[3:3 + len(CRITERIA)] == ["0.1000"] * len(CRITERIA)  # each criterion picked naive
    assert row[3 + len(CRITERIA)] == "0.4000" and row[-1] == "0.5000 |"  # the best of the four, LightGBM
    assert row[-3] == "0.3500" and row[-2] == "0.3500"  # the blend alone, and picked once it races
