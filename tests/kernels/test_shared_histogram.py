"""rankkit.kernels.shared_histogram (S3), checked without a GPU: the CUDA C compiles for sm_90
through NVRTC without spills; its Triton twin equals the torch reference under Triton's
interpreter (gathered through the partition, with tiles over many slots, hot cells elided, int32
and int64 cells, int32 quantized and 64-bit fixed-point gradients), and the Triton levels grown
through it (the twin standing in) are the reference's; the first-contact check keeps a kernel that
agrees with the twin and falls back with one warning otherwise; the switch is off unless asked
for."""
from __future__ import annotations

import ctypes
import json
import warnings

import pytest
import torch
from kernels.triton import interpreted_json

from rankkit.kernels import shared_histogram as sh
from rankkit.kernels.switches import cuda_histogram_takes, read_switches

TWIN_SCRIPT = r"""
import json, sys, torch
from rankkit.kernels.shared_histogram import SLOTS, first_contact_sample, private_histogram_twin
from rankkit.kernels.torch_ref import build_histograms

s = first_contact_sample("cpu", seed=3, n=1500)  # the interpreter's time grows with the programs
codes, node, g, h, k = s["codes_t"], s["node"], s["g"], s["h"], s["n_nodes"]
out = {}
def reference(g, h, node, hot=None):
    ref = build_histograms(codes, node.long(), g.long(), h.long(), k)
    if hot is not None:
        for f, c in enumerate(hot.tolist()):
            ref[:, f, :, c] = 0
    return ref
wide = (g.to(torch.int64) << 28, h.to(torch.int64) << 28)
tile = 64
slots = node[s["order"][: s["n_rows"]]].long()
starts = slots[::tile]
ends = slots[tile - 1::tile]
out["tiles_over_many_slots"] = int((ends[: len(starts)] - starts[: len(ends)] >= SLOTS).sum())
for cells, (gg, hh) in (("int32", (g, h)), ("int64", (g, h)), ("int64 fixed point", wide)):
    dtype = torch.int32 if cells == "int32" else torch.int64
    ref = reference(gg, hh, node)
    for name, extra, want in (("gathered", dict(order=s["order"], n_rows=s["n_rows"]), ref),
                              ("elided", dict(order=s["order"], n_rows=s["n_rows"], hot=s["hot"]),
                               reference(gg, hh, node, s["hot"])),
                              ("plain int64 nodes", {}, ref)):
        n = node if extra else node.long()
        got = private_histogram_twin(codes, n, gg, hh, k, torch.zeros(ref.shape, dtype=dtype), tile=tile, **extra)
        out[f"{cells} {name}"] = bool(torch.equal(got.long(), want.to(dtype).long()))
# level_histogram_triton's branch to the shared-memory kernel (the twin standing in for it), with
# the hot cells filled in afterwards from the node totals: the reference's full cells
from rankkit.kernels import shared_histogram
from rankkit.kernels.triton import histogram
histogram.cuda_histogram_takes = lambda device: True
shared_histogram.shared_histogram_for = lambda device: private_histogram_twin
kept = node < k
totals = torch.stack([torch.zeros(k, dtype=torch.int64).index_add_(0, node[kept].long(), v[kept].long())
                      for v in (g, h, torch.ones_like(g))])
full = histogram.level_histogram_triton(codes, node, g, h, k, dtype=torch.int64, order=s["order"],
                                        n_rows=s["n_rows"], hot=s["hot"], totals=totals)
out["level_histogram_triton through the shared kernel"] = bool(torch.equal(full, reference(g, h, node)))
root = torch.zeros(len(node), dtype=torch.int64)
got = private_histogram_twin(codes, root, g, h, 1, torch.zeros(3, codes.shape[0], 1, 256, dtype=torch.int64))
out["root"] = bool(torch.equal(got, build_histograms(codes, root, g.long(), h.long(), 1)))
# The levels through the shared kernel (the twin standing in): the partition sorted by slot, as its
# tiles want, and each level's kernel clearing all three channels of the next level's cells (the
# kernel adds g and h unpacked, even into int32 cells): the torch reference's levels.
from rankkit.boosting.tree import ObliviousTreeGrower, TreeParams, quantize_gradients
from rankkit.kernels.triton import tree as triton_tree
triton_tree.cuda_histogram_takes = lambda device: True
gen = torch.Generator().manual_seed(5)
codes2 = torch.randint(0, 12, (300, 4), generator=gen, dtype=torch.uint8)
codes2[torch.rand(300, generator=gen) < 0.8, 0] = 3  # a hot code
valid2 = torch.zeros(4, 256, dtype=torch.bool)
valid2[:, 1:12] = True
grad2, hess2 = torch.randn(300, generator=gen, dtype=torch.float64), torch.rand(300, generator=gen, dtype=torch.float64)
p = TreeParams(depth=3, min_data_in_leaf=5, quantized_grad=True)
grower = ObliviousTreeGrower(codes2, valid2, p, backend="torch")
gq, hq, scale = quantize_gradients(grad2, hess2 + 0.1, 4, torch.Generator().manual_seed(0))
ref = grower.backend.grow_levels(grower, gq, hq, scale, valid2, None, None, None)
for cells in ("int32", "int64"):
    got = triton_tree.grow_levels_triton(grower.codes, gq.to(torch.int32), hq.to(torch.int32), scale, valid2, depth=3,
                                         l2=p.l2, min_data_in_leaf=5, min_sum_hessian=p.min_sum_hessian,
                                         hist_dtype=getattr(torch, cells), hot=histogram.hot_codes(grower.codes))
    out[f"levels through the shared kernel, {cells} cells"] = all(torch.equal(a.long(), b.long())
                                                                  for a, b in zip(ref[:3], got[:3]))
out["levels split"] = 255 not in ref[2].tolist()
json.dump(out, open(sys.argv[-1], "w"))
"""


def test_the_twin_equals_the_torch_reference_under_the_interpreter(tmp_path_factory):
    pytest.importorskip("triton")
    out = interpreted_json(tmp_path_factory, TWIN_SCRIPT)
    assert out.pop("tiles_over_many_slots") > 0  # the path past the privatised slots is taken
    assert out and all(out.values()), out


def test_the_cuda_source_compiles_for_sm_90_without_spills():
    pytest.importorskip("cuda.core")
    cubin, report = sh.compile_cubin("sm_90")
    assert cubin[:4] == b"\x7fELF"
    assert set(report) == set(sh.KERNELS.values())
    for name, r in report.items():
        wide = name.endswith("_i64_i64")
        cell = 8 if wide else 4
        per_block = sh.FEATURES_64 if wide else sh.FEATURES
        assert r["spill_stores"] == r["spill_loads"] == 0, (name, r)
        assert r["registers"] <= 64, (name, r)  # full occupancy of 256-thread blocks
        assert r["smem"] == sh.SLOTS * per_block * 3 * 256 * cell <= 48 * 1024, (name, r)


def test_ptxas_report_reads_each_kernel():
    text = ("ptxas info    : Compiling entry function 'a' for 'sm_90'\nptxas info    : Function properties for a\n"
            "ptxas         .     0 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n"
            "ptxas info    : Used 40 registers, used 1 barriers, 24576 bytes smem\n"
            "ptxas info    : Function properties for b\n"
            "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
            "ptxas info    : Used 9 registers, used 1 barriers\n")
    assert sh.ptxas_report(text) == {"a": dict(spill_stores=8, spill_loads=4, registers=40, smem=24576),
                                     "b": dict(spill_stores=0, spill_loads=0, registers=9, smem=0)}


@pytest.mark.parametrize("kind", ["right", "wrong", "broken"])
def test_first_contact_keeps_an_agreeing_kernel_and_falls_back_with_one_warning(monkeypatch, kind):
    class Fake:
        def __init__(self, device):
            if kind == "broken":
                raise RuntimeError("NVRTC_ERROR_COMPILATION")

        def __call__(self, *args, **kwargs):
            out = sh._reference(*args, **kwargs)
            if kind == "wrong":
                out[0, 0, 0, 3] += 1
            return out

    monkeypatch.setattr(sh, "PrivateHistogram", Fake)
    monkeypatch.setattr(sh, "private_histogram_twin", sh._reference)
    monkeypatch.setattr(sh, "_CHOSEN", {})
    device = torch.device("cpu")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        first = sh.shared_histogram_for(device)
        again = sh.shared_histogram_for(device)
    assert again is first  # decided once per device
    if kind == "right":
        assert isinstance(first, Fake) and not seen
    else:
        assert first is None and len(seen) == 1
        message = str(seen[0].message)
        assert "Triton histogram runs instead" in message
        assert ("differ from the Triton twin" if kind == "wrong" else "NVRTC_ERROR_COMPILATION") in message


def test_the_switch_is_off_unless_asked_for_and_only_integer_cuda_calls_take_it(monkeypatch):
    assert read_switches({}).cuda_histogram == "auto"
    on = read_switches({"RANKKIT_CUDA_HISTOGRAM": "1"})
    assert on.cuda_histogram == "on"
    assert not cuda_histogram_takes("cuda", read_switches({}))  # auto is off until measured on a GPU
    assert not cuda_histogram_takes("cpu", on)
    assert cuda_histogram_takes("cuda", on) == (torch.version.cuda is not None)
    pytest.importorskip("triton")
    from rankkit.kernels.triton import histogram

    monkeypatch.setattr(histogram, "cuda_histogram_takes", lambda device: True)
    monkeypatch.setattr(sh, "shared_histogram_for", lambda device: "kernel")
    codes, i16, i64 = torch.zeros(2, 4, dtype=torch.uint8), torch.zeros(4, dtype=torch.int16), torch.zeros(4).long()
    i32, f64 = torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.float64)
    assert histogram._shared_kernel(codes, i16, i32, i32, torch.int32) == "kernel"
    assert histogram._shared_kernel(codes, i64, i32, i32, torch.int64) == "kernel"
    assert histogram._shared_kernel(codes, i16, i64, i64, torch.int64) == "kernel"
    assert histogram._shared_kernel(codes, i16, i64, i64, torch.int32) is None  # 64-bit sums into int32
    assert histogram._shared_kernel(codes, i16, f64, f64, torch.float64) is None  # float atomics: Triton
    assert histogram._shared_kernel(codes, i32, i32, i32, torch.int64) is None  # int32 nodes: no kernel
    assert json.dumps(sorted(sh.KERNELS.values()))  # six kernels, named by their dtypes


def test_the_launch_arguments_are_what_cuda_core_passes():
    """Pointers as plain ints (cuda.core refuses ctypes.c_void_p), sizes as ctypes integers, and the
    index tensors converted to the widths the kernel reads; checked with cuda.core's own argument
    packer, which needs no GPU."""
    pytest.importorskip("cuda.core")
    from cuda.core._kernel_arg_handler import ParamHolder

    codes = torch.zeros(3, 10, dtype=torch.uint8)
    node, g = torch.zeros(10, dtype=torch.int16), torch.zeros(10, dtype=torch.int32)
    out = torch.zeros(3, 3, 1, 256, dtype=torch.int64)
    held, args = sh.launch_args(codes, node, g, g, 1, out, order=torch.arange(10, dtype=torch.int32), rows=10,
                                hot=torch.zeros(3, dtype=torch.int32))
    ParamHolder(args)  # raises TypeError on an argument type cuda.core does not pass
    assert len(args) == 13 and args[0] == codes.data_ptr() and args[-1] == out.data_ptr()
    assert held[4].dtype == torch.int64 and held[5].dtype == torch.int64  # order and hot, as read
    with pytest.raises(TypeError):
        ParamHolder([ctypes.c_void_p(args[0])])  # what the first version passed
    with pytest.raises(ValueError, match="uint8"):
        sh.launch_args(codes.long(), node, g, g, 1, out, order=None, rows=10, hot=None)
