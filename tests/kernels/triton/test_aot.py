"""rankkit.kernels.triton.aot: every shipped kernel compiles ahead of time for an H100 (sm_90)
with no GPU, with no register spills and no local memory, and with each integer argument the
constant 1 (the figures are in docs/gpu.md, from ``experiments/gpu_report.py``).

Every test name contains "triton" (``pytest -k triton``).
"""
from __future__ import annotations

import pytest
from kernels.triton import compile_named, compile_ones

triton = pytest.importorskip("triton")


def test_triton_aot_lists_each_kernels_integer_arguments():
    from rankkit.kernels.triton.aot import KERNELS, int_args

    assert set(int_args("histogram_i32")) == {"N", "n_rows", "n_feat", "n_nodes"}
    assert all(isinstance(int_args(name), (list, tuple)) for name in KERNELS)


@pytest.mark.slow
def test_triton_every_kernel_compiles_with_each_int_argument_equal_to_one(tmp_path_factory):
    from rankkit.kernels.triton.aot import KERNELS

    names = [n for n in KERNELS if not n.endswith("_fp64") or n.startswith(("topk", "rank"))]
    done = compile_ones(tmp_path_factory, names)
    assert {name for name, _, _ in done} == set(names)


@pytest.mark.slow
def test_triton_every_kernel_compiles_for_sm90_without_spills(tmp_path_factory):
    from rankkit.kernels.triton.aot import KERNELS

    compiled = compile_named(tmp_path_factory, list(KERNELS))
    for name, info in compiled.items():
        print(info)
        assert info["registers"] and info["registers"] <= 255, name
        assert info["spill_stores"] == 0 and info["spill_loads"] == 0, name
        assert info["local_bytes"] == 0 and info["stack_bytes"] == 0, name
        assert info["shared_bytes"] <= 48 * 1024, name
        # The kernels whose last program reads what the others wrote order it for a real GPU.
        assert info["last_program"] is (True if name.startswith(("level_", "fixed_scale")) else None), name
    assert {n.rsplit("_", 1)[-1] for n in compiled if n.startswith(("rank", "lambda"))} == {"fp32", "fp64"}
