"""The bar of issue 46's counted target (S5): a second round of the Triton backend's default
depth-6 round with an eval set, counted under Triton's interpreter as experiments/gpu_report.py
counts it for docs/gpu.md (Triton launches + the torch ops dispatched outside the kernels, up to
the round's one device-to-host copy), is at most 30 launches and 1 sync, and allocates nothing
(every output that holds memory no input holds counts); the quantized round keeps its one sync.
The count can fail: a round with the old per-level kernels counted 125, and 31 allocations
before the fit's workspace.
"""
from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("triton")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "experiments"))


def test_triton_round_is_at_most_30_launches_one_sync_and_no_allocation(tmp_path):
    from gpu_report import counted_launches, triton_launches

    counts = triton_launches(str(tmp_path))
    syncs = {label: sum(v for k, v in c.items() if k.startswith("sync:")) for label, c in counts.items()}
    assert counted_launches(counts["default"]) <= 30, counts["default"]
    assert syncs == {"default": 1, "quantized": 1}, counts
    assert counts["default"].get("sync:copy (device to host)") == 1  # the one sync is the host copy
    assert not {k: v for k, v in counts["default"].items() if k.startswith("alloc:")}, counts["default"]
    # The count sees the round's kernels: one level kernel and one routing a level.
    assert counts["default"]["triton:_level_kernel"] == counts["default"]["triton:_route_kernel"] == 6
