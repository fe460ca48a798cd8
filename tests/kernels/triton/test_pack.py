"""The round's tree and metrics packed for the host copy in one launch
(rankkit.kernels.triton.pack), under Triton's interpreter, against the torch reference
(``rankkit.kernels.backends.cat_float64``: casts and a concatenation), bit for bit: int64 levels,
float64 gains, 0-dim metrics, parts longer than a block, one element, all eight parts; the
workspace's buffer is the same tensor call after call; bad parts are refused."""
from __future__ import annotations

import pytest
from kernels.triton import interpreted_json

pytest.importorskip("triton")

_INTERPRETED = r"""
import json, sys
import torch
from rankkit.kernels.backends import cat_float64
from rankkit.kernels.triton.pack import BLOCK, pack_float64
from rankkit.kernels.workspace import Workspace
gen = torch.Generator().manual_seed(0)
f64 = dict(dtype=torch.float64)
cases = {
    "tree": [torch.tensor([3, 0, 7]), torch.tensor([12, 255, 4]), torch.randn(3, generator=gen, **f64),
             torch.tensor(0.75, **f64), torch.randn(2, 8, generator=gen, **f64)],
    "long": [torch.randint(-2**40, 2**40, (BLOCK + 37,), generator=gen),
             torch.randn(2 * BLOCK + 1, generator=gen, **f64)],
    "one": [torch.tensor([5])],
    "eight": [torch.randn(i + 1, generator=gen, **f64) if i % 2 else torch.arange(i + 1) for i in range(8)],
    "float32": [torch.randn(5, generator=gen), torch.tensor([1.0 / 3.0], dtype=torch.float32)],
}
out = {}
ws = Workspace()
for name, parts in cases.items():
    got = pack_float64(parts, workspace=ws.scope(name))
    again = pack_float64(parts, workspace=ws.scope(name))
    out[name] = {"got": got.tolist(), "ref": cat_float64(parts).tolist(), "same": again.data_ptr() == got.data_ptr()}
errors = {}
for name, parts in {"none": [], "nine": [torch.ones(1)] * 9, "strided": [torch.ones(4, 2).t()]}.items():
    try:
        pack_float64(parts)
    except ValueError as e:
        errors[name] = str(e)
out["errors"] = errors
json.dump(out, open(sys.argv[1], "w"))
"""


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    return interpreted_json(tmp_path_factory, _INTERPRETED)


@pytest.mark.parametrize("name", ["tree", "long", "one", "eight", "float32"])
def test_packed_parts_are_the_casts_and_concatenation_bit_for_bit(interpreted, name):
    case = interpreted[name]
    assert case["got"] == case["ref"]
    assert case["same"]  # the workspace's buffer, call after call


def test_bad_parts_are_refused(interpreted):
    errors = interpreted["errors"]
    assert set(errors) == {"none", "nine", "strided"}
    assert "1 to 8 tensors, got 0" in errors["none"] and "got 9" in errors["nine"]
    assert "`parts[0]` has to be a contiguous tensor on cpu" in errors["strided"]
    assert errors["strided"].endswith("not contiguous")
