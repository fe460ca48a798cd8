"""experiments/bench_gpu.py, the script a GPU owner runs first, exercised on the CPU: its
MSLR-like data (long-tailed lengths, hot bins), the route report, the timed rounds with an
eval set, the fit, the identity check and the JSON record all run end to end on a tiny
problem, and without a device (and no ``--device``) it prints its plan and measures nothing."""
from __future__ import annotations

import json
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "experiments"))


def test_bench_gpu_data_is_mslr_like():
    from bench_gpu import mslr_like

    data = mslr_like(400, 6, seed=0)
    assert int(data.sizes.sum()) == data.features.shape[0] == data.labels.shape[0]
    assert int(data.sizes.max()) > 5 * float(data.sizes.float().median())  # a long tail
    zero_share = (data.features[:, 0] == 0).float().mean()
    assert 0.5 < float(zero_share) < 0.97  # a hot bin
    assert set(data.labels.unique().tolist()) == {0.0, 1.0, 2.0, 3.0, 4.0}
    assert float((data.labels == 0).float().mean()) > 0.4  # skewed low


def test_bench_gpu_without_a_device_prints_its_plan(capsys, monkeypatch):
    import bench_gpu

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench_gpu.main([]) is None
    assert "nothing was measured" in capsys.readouterr().out


@pytest.mark.slow
def test_bench_gpu_smoke_run_on_the_cpu(tmp_path, capsys):
    import bench_gpu

    path = tmp_path / "gpu.json"
    record = bench_gpu.main(["--device", "cpu", "--queries", "12", "--features", "4", "--depth", "3",
                             "--rounds", "1", "--fit-rounds", "2", "--repeats", "1",
                             "--check-queries", "8", "--check-rounds", "2", "--json", str(path)])
    saved = json.loads(path.read_text())
    assert saved["environment"]["torch"] == torch.__version__ and "triton" in saved["environment"]
    assert saved["routes"]["default"]["lambdas"] == "torch"  # CPU tensors: no Triton route
    assert record["identity"]["device_vs_cpu"]["same_splits"]
    assert record["identity"]["quantized_triton_vs_torch_bitwise"]
    assert record["round_default_ms"] > 0 and record["fit_s"] > 0
    assert "| round, depth 3, eval set, default |" in capsys.readouterr().out
