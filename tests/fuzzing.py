"""What the loader fuzz tests share: the settings, a folder, the artefacts of every format and the
mutations (flips, cuts, inserts, deletes) of their bytes."""
from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from test_memory_limits import mutate  # noqa: F401 -- flips, cuts, inserts, deletes (never "digit" here)
from torch import nn

from rankkit.boosting import LambdaMART
from rankkit.data import make_synthetic
from rankkit.export import export_program, export_torchscript

FUZZ = settings(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow],
                max_examples=80)


class Linear(nn.Module):
    def __init__(self):
        super().__init__()
        self.n_features = 3
        self.layer = nn.Linear(3, 1)

    def forward(self, x):
        return self.layer(x).squeeze(-1)


@functools.lru_cache(maxsize=None)
def artefacts() -> dict[str, bytes]:
    torch.manual_seed(0)
    ds = make_synthetic(8, 6, 3, seed=0)
    booster = LambdaMART(n_estimators=2, depth=2).fit(ds)
    with tempfile.TemporaryDirectory() as d:
        export_torchscript(Linear(), os.path.join(d, "m.pt"))
        export_program(Linear(), os.path.join(d, "m.pt2"))
        booster.save(os.path.join(d, "m.safetensors"))
        return {ext: Path(d, "m" + ext).read_bytes() for ext in (".pt", ".pt2", ".safetensors")}


mutation = st.lists(st.tuples(st.sampled_from(["flip", "cut", "insert", "delete"]), st.floats(0, 1),
                              st.binary(min_size=1, max_size=4)), min_size=1, max_size=3)
