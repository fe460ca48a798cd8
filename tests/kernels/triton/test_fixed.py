"""The round's float gradients as 64-bit fixed point in Triton (rankkit.kernels.triton.fixed), under
Triton's interpreter (a subprocess: ``TRITON_INTERPRET=1`` before triton is imported), against the
torch reference (``rankkit.kernels.backends.fixed_point``), bit for bit: the integers, the scale
2^−S, and the root's sums, on random values over several programs' partial maxima, exact ties
after the scaling (half to even), all zeros, one document, powers of two (the shift's log2 is
exact: its floor is where a rounded log2 would differ), values near the float64 ends (the shift's
clamp at 900), no document, and a NaN (the scale NaN, as the reference's). One object serves all
the calls: its counter resets itself. On the way it clears the buffers it is given (the tree's
first: nodes, counters, the root histogram's cells, more of them than documents).
"""
from __future__ import annotations

import pytest
from kernels.triton import interpreted_json

pytest.importorskip("triton")


_INTERPRETED = r"""
import json, math, sys
import torch
from rankkit.kernels.backends import fixed_point
from rankkit.kernels.triton.fixed import BLOCK, FixedPoint
gen = torch.Generator().manual_seed(0)
f64 = dict(dtype=torch.float64)
n = 240
shift = math.floor(62 - math.log2(n) - math.log2(4.0))
ties = (torch.randint(-50, 50, (n,), generator=gen).double() + 0.5) * 2.0 ** -shift
ties[0] = 4.0
nan = torch.randn(3 * BLOCK, generator=gen, **f64)
nan[2 * BLOCK + 5] = float("nan")
cases = {
    "random": (torch.randn(5 * BLOCK + 7, generator=gen, **f64), torch.rand(5 * BLOCK + 7, generator=gen, **f64)),
    "ties": (ties, torch.ones(n, **f64)),
    "zeros": (torch.zeros(9, **f64), torch.zeros(9, **f64)),
    "one": (torch.tensor([0.3], **f64), torch.tensor([2.0], **f64)),
    "powers": (torch.tensor([4.0, -1.0, 0.5, 2.0 ** -30], **f64), torch.full((4,), 0.25, **f64)),
    "ends": (torch.randn(3000, generator=gen, **f64) * 1e300, torch.rand(3000, generator=gen, **f64) * 1e-300),
    "none": (torch.zeros(0, **f64), torch.zeros(0, **f64)),
    "nan": (nan, torch.ones(3 * BLOCK, **f64)),
}
fixed = FixedPoint(torch.device("cpu"))
out = {}
for name, (g, h) in cases.items():
    ref, got = fixed_point(g, h), fixed(g, h)
    out[name] = {"ref": [t.tolist() for t in ref], "got": [t.tolist() for t in got[:3]],
                 "root": got[3].tolist(), "sums": [int(ref[0].sum()), int(ref[1].sum()), g.shape[0]]}
# quantized_grad's stochastic rounding in three launches: the reference's draws and integers.
from rankkit.kernels.torch_ref import quantize_gradients
quantized = {}
for name, (g, h) in {"random": cases["random"], "zeros": cases["zeros"], "nan": cases["nan"]}.items():
    for bins in (4, 16):
        ref = quantize_gradients(g, h, bins, torch.Generator().manual_seed(7))
        got = fixed.quantize(g, h, bins, torch.Generator().manual_seed(7))
        quantized[f"{name} {bins}"] = {"ref": [t.tolist() for t in ref], "got": [t.tolist() for t in got[:3]],
                                       "dtypes": [str(t.dtype) for t in got], "root": got[3].tolist(),
                                       "sums": [int(ref[0].long().sum()), int(ref[1].long().sum()), g.shape[0]]}
out["quantized"] = quantized
# The tree's first buffers cleared on the way (no launch of their own clears them).
node = torch.full((5 * BLOCK + 7,), 7, dtype=torch.int64)
counters = torch.full((7,), 7, dtype=torch.int32)
cells = torch.full((3, 40, 1, 256), 7, dtype=torch.int64)  # more cells than the grid's documents
fixed(*cases["random"], node=node, counters=counters, cells=cells)
out["cleared"] = [int(node.abs().sum()), int(counters.abs().sum()), int(cells.abs().sum())]
# ... and the quantized round's: its int32 root cells and their packed sums too, the draws unchanged.
clear = {"node": torch.full((3 * BLOCK + 5,), 7, dtype=torch.int64), "counters": torch.full((7,), 7, dtype=torch.int32),
         "cells": torch.full((3, 40, 1, 256), 7, dtype=torch.int32), "pack": torch.full((40 * 256,), 7)}
g, h = cases["random"]
got = fixed.quantize(g, h, 16, torch.Generator().manual_seed(7), clear=clear)
ref = quantize_gradients(g, h, 16, torch.Generator().manual_seed(7))
out["quantized_cleared"] = {"left": [int(t.abs().sum()) for t in clear.values()],
                            "same": [got[0].tolist() == ref[0].tolist(), got[1].tolist() == ref[1].tolist()]}
with open(sys.argv[1], "w") as f:
    json.dump(out, f)
"""


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    return interpreted_json(tmp_path_factory, _INTERPRETED)


@pytest.mark.parametrize("name", ["random", "ties", "zeros", "one", "powers", "ends", "none"])
def test_triton_fixed_point_is_the_reference_bit_for_bit(interpreted, name):
    case = interpreted[name]
    assert case["got"] == case["ref"]
    assert case["root"] == case["sums"]  # (Σg_q, Σh_q, n): the root's totals


def test_triton_fixed_point_cases_reach_what_they_check(interpreted):
    assert interpreted["ends"]["ref"][2][1] == 2.0 ** -900  # the clamp
    assert all(v % 2 == 0 for v in interpreted["ties"]["ref"][0])  # every x.5 went to its even neighbour
    assert interpreted["powers"]["ref"][2][0] == 2.0 ** -(62 - 2 - 2)  # log2 4 and log2 4 exact


def test_triton_fixed_point_of_a_nan_gradient_has_a_nan_scale(interpreted):
    case = interpreted["nan"]
    assert case["got"][2][0] != case["got"][2][0] and case["ref"][2][0] != case["ref"][2][0]
    assert case["got"][2][1] == case["ref"][2][1]  # the other channel untouched


def test_triton_fixed_point_clears_the_trees_first_buffers(interpreted):
    assert interpreted["cleared"] == [0, 0, 0]


def test_triton_quantized_rounding_clears_the_trees_first_buffers(interpreted):
    cleared = interpreted["quantized_cleared"]
    assert cleared["left"] == [0, 0, 0, 0] and cleared["same"] == [True, True]


def test_triton_quantized_gradients_are_the_references_bit_for_bit(interpreted):
    for name, case in interpreted["quantized"].items():
        assert case["dtypes"] == ["torch.int32", "torch.int32", "torch.float64", "torch.int64"], name
        if name.startswith("nan"):  # the NaN document's integer is undefined on both sides: the rest and the scales
            got, ref = case["got"], case["ref"]
            keep = [i for i in range(len(ref[0])) if i != 2 * 1024 + 5]
            assert [got[0][i] for i in keep] == [ref[0][i] for i in keep] and got[1:] == ref[1:], name
            continue
        assert case["got"] == case["ref"], name
        assert case["root"] == case["sums"], name
    assert interpreted["quantized"]["zeros 4"]["ref"][2] == [1.0, 1.0]  # no gradient: the scales are 1
