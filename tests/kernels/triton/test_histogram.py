"""rankkit.kernels.triton.histogram, checked without a GPU: under Triton's interpreter the level
histogram equals the torch reference :func:`rankkit.boosting.tree.build_histograms` (with the
reference's left-out node, and gathered through the partition), exactly for integer cells; packed
sums unpack at the int32 bounds; hot cells are filled from the node totals; ahead of time for sm_90
its atomics are relaxed reductions and it compiles with one feature or one document.

Every test name contains "triton" (``pytest -k triton``).
"""
from __future__ import annotations

import pytest
import torch
from kernels.triton import compile_ones

triton = pytest.importorskip("triton")


def test_triton_histogram_interpreted_equals_torch_reference_with_left_out_node(interpreted_kernels):
    # The torch path leaves the larger children out as node K; the kernel must skip them (before
    # the fix it wrote them into the next feature's node 0, out of bounds for the last feature).
    from rankkit.boosting.tree import build_histograms

    data = interpreted_kernels["histogram"]
    codes, node = torch.tensor(data["codes"], dtype=torch.uint8), torch.tensor(data["node"])
    n_nodes = int(node.max())
    assert int((node == n_nodes).sum()) > 0
    ref = build_histograms(codes, node.long(), torch.tensor(data["g"]).long(),
                           torch.tensor(data["h"]).long(), n_nodes)
    for dtype in ("torch.int32", "torch.int64"):
        assert torch.equal(torch.tensor(data[dtype], dtype=torch.int64), ref)
    ref = build_histograms(codes, node.long(), torch.tensor(data["gf"], dtype=torch.float64),
                           torch.tensor(data["hf"], dtype=torch.float64), n_nodes)
    torch.testing.assert_close(torch.tensor(data["float64"], dtype=torch.float64), ref,
                               rtol=1e-13, atol=1e-13)  # the buffer was zeroed, then filled


def test_triton_histogram_gathered_through_the_partition_equals_the_reference(interpreted_kernels):
    # A level's smaller children read through smaller_first's partition: the same integer cells
    # as the reference's sweep over every document with the left-out node K masked.
    from rankkit.boosting.tree import build_histograms

    data = interpreted_kernels["histogram"]
    codes, node = torch.tensor(data["codes"], dtype=torch.uint8), torch.tensor(data["node"])
    n_nodes = int(node.max())
    order = torch.tensor(data["order"])
    kept = int((node < n_nodes).sum())
    # The partition: a permutation, every kept document first, each slot's documents in order.
    assert sorted(order.tolist()) == list(range(len(node)))
    assert bool((node[order[:kept]] < n_nodes).all()) and bool((node[order[kept:]] == n_nodes).all())
    assert torch.equal(node[order], node.sort(stable=True).values)
    for k in range(n_nodes + 1):
        docs = order[node[order] == k]
        assert torch.equal(docs, docs.sort().values)
    ref = build_histograms(codes, node.long(), torch.tensor(data["g"]).long(),
                           torch.tensor(data["h"]).long(), n_nodes)
    assert torch.equal(torch.tensor(data["gathered"], dtype=torch.int64), ref)
    # `n_rows` bounds what is read: one entry fewer, one document fewer in the counts.
    short = torch.tensor(data["gathered_short"], dtype=torch.int64)
    assert int(short[2, 0].sum()) == int(ref[2, 0].sum()) - 1 == kept - 1  # feature 0's counts


def test_triton_packed_sums_unpack_exactly_at_the_int32_bounds(interpreted_kernels):
    # int32 cells take g and h as one 64-bit add h * 2^32 + g; any |G|, |H| < 2^31 unpacks exactly.
    top = 2 ** 31 - 1
    assert interpreted_kernels["finish_unpacked"] == [[-top, top, 0, -1, 5, -7], [top, -top, top, 0, 0, 3], [1] * 6]


def test_triton_hot_cells_are_filled_from_the_node_totals(interpreted_kernels):
    # total − the row's other cells, per channel and node (totals [3, K] = [[10, 20], [60, 70], [3, 5]]).
    assert interpreted_kernels["finish_filled"] == [[10 - 4, 20 - 5], [60 - 6, 70 - 7], [3 - 1, 5 - 2]]


def test_triton_quantize_round_trips_within_half_a_step():
    from rankkit.kernels.triton.histogram import quantize

    values = torch.linspace(-3.0, 2.0, 101, dtype=torch.float64)
    q, scale = quantize(values, bits=16)
    assert q.dtype == torch.int32 and int(q.abs().max()) == 2 ** 15 - 1
    assert float((q / scale - values).abs().max()) <= 0.5 / scale


def test_triton_histogram_rejects_float_gradients_in_integer_cells():
    from rankkit.kernels.triton.histogram import level_histogram_triton

    codes = torch.zeros(2, 4, dtype=torch.uint8)
    with pytest.raises(ValueError, match="`dtype`"):
        level_histogram_triton(codes, torch.zeros(4, dtype=torch.int32), torch.zeros(4),
                               torch.zeros(4), 1, dtype=torch.int32)
    with pytest.raises(ValueError, match="`out`"):
        level_histogram_triton(codes, torch.zeros(4, dtype=torch.int32), torch.zeros(4),
                               torch.zeros(4), 1, out=torch.zeros(3, 2, 2, 256))


@pytest.mark.parametrize("name", ["histogram_i32", "histogram_fp64", "histogram_i64_fixed"])
def test_triton_histogram_atomics_are_relaxed_reductions(first_contact, name):
    # The default semantics (acq_rel) orders every add with a GPU-wide fence; the histogram is
    # read only after the kernel, so relaxed adds (plain reductions, "red") suffice.
    info = first_contact[name]
    assert info["atomics"] and all(a.startswith("red.") and ".relaxed." in a for a in info["atomics"])
    assert info["fences"] == 0


def test_triton_histogram_compiles_with_one_feature_or_one_document(tmp_path_factory):
    # Before the fix `n_feat.to(tl.int64)` / `N.to(...)` failed to compile when the launcher
    # made the argument the constant 1 ("'int' object has no attribute 'to'").
    done = compile_ones(tmp_path_factory, ["histogram_i32"])
    assert {arg for _, arg, _ in done} == {"N", "n_rows", "n_feat", "n_nodes"}
    assert all(regs for _, _, regs in done)
