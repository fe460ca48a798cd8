"""experiments/neural_blends.py end to end on a small synthetic set: every network trains with
nobody dropped, and the report replays successive halving over the recorded epochs."""
from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "experiments"))


@pytest.mark.slow
def test_the_blends_script_trains_every_network_and_replays_the_race(monkeypatch):
    import neural_blends
    import unbiased

    from rankkit.clicks.race import NEURAL_BLENDS, NEURAL_CANDIDATES
    from rankkit.data import make_synthetic

    def small(name, fold):
        data = make_synthetic(40, (6, 14), 8, seed=fold)
        return data.subset(range(0, 24)), data.subset(range(24, 32)), data.subset(range(32, 40)), 4.0

    monkeypatch.setattr(unbiased, "load", small)
    records = list(neural_blends.run("synthetic", 1, 0, [1.0], done=set()))
    assert len(records) == 1 and len(records[0]["epochs"]) == neural_blends.EPOCHS
    pairs = len(NEURAL_CANDIDATES) * (len(NEURAL_CANDIDATES) - 1) // 2
    for epoch in records[0]["epochs"]:
        assert set(epoch["criterion"]) == set(epoch["test"]) and len(epoch["test"]) == len(NEURAL_CANDIDATES) + pairs
    winner, test, cost = neural_blends.replay(records[0], list(NEURAL_CANDIDATES) + list(NEURAL_BLENDS))
    assert test == records[0]["epochs"][-1]["test"][winner] and cost >= 8
    assert "| synthetic | PBM η=1 |" in neural_blends.table(records, held_out_from=3)
