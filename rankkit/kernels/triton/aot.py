"""Ahead-of-time compilation of the Triton kernels for an H100 (sm_90), with no GPU.

``triton.compile`` lowers a kernel to PTX and a cubin for a named target; the register count,
spills and shared memory then come from the tools that Triton ships in its package
(``triton/backends/nvidia/bin/``: ``ptxas -v`` on the PTX, ``cuobjdump
--dump-resource-usage`` on the cubin). (``CompiledKernel.n_regs``
and ``n_spills`` are filled in only when the cubin is loaded on a device.)
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from rankkit.kernels.triton.eval_ndcg import _eval_ndcg_kernel, _mean_kernel
from rankkit.kernels.triton.fixed import BLOCK as FIXED_BLOCK
from rankkit.kernels.triton.fixed import _quantize_round_kernel, _quantize_scale_kernel, _round_kernel, _scale_kernel
from rankkit.kernels.triton.flat_lambdas import MAX_BLOCK, _flat_lambda_kernel, warps_for
from rankkit.kernels.triton.histogram import _finish_kernel, _histogram_kernel
from rankkit.kernels.triton.lambdas import _lambda_kernel, _rank_kernel, _topk_kernel
from rankkit.kernels.triton.pack import BLOCK as PACK_BLOCK
from rankkit.kernels.triton.pack import _pack_kernel
from rankkit.kernels.triton.tree import (_exact_leaf_sums_kernel, _leaf_values_kernel, _level_kernel, _route_kernel,
                                         _score_update_kernel)

H100 = GPUTarget("cuda", 90, 32)
FLOATS = {"fp32": "*fp32", "fp64": "*fp64"}
# The warps a kernel is launched with where that is not 4 (filled in by the configurations).
WARPS: dict[str, int] = {}


def _signature(fn, types: dict, constexprs: dict) -> dict:
    """Every argument of ``fn`` typed: ``types`` for the runtime ones, "constexpr" for the rest."""
    names = fn.arg_names
    missing = [a for a in names if a not in types and a not in constexprs]
    if missing:
        raise KeyError(f"{fn.__name__}: no type for {missing}")
    return {a: types.get(a, "constexpr") for a in names}


def _histogram_configs() -> dict:
    """The level histogram's configurations: (cells, gradients) as the trainers launch them --
    quantized int32 into int32 or int64 cells, float gradients as 64-bit fixed point into int64
    cells (the Triton backend's default), float cells -- each reading every document in order
    (the root) or gathered through the partition (a level's smaller children, their node the
    int16 slot the routing wrote)."""
    out = {}
    for name, cell, values in (("i32", "i32", "*i32"), ("i64", "i64", "*i32"), ("i64_fixed", "i64", "*i64"),
                               ("fp32", "fp32", "*fp32"), ("fp64", "fp64", "*fp64")):
        elide = not cell.startswith("fp")  # integer cells elide the hot codes
        for gather, node in ((False, "*i64"), (True, "*i16")):
            types = {"codes_ptr": "*u8", "node_ptr": node, "g_ptr": values, "h_ptr": values,
                     "out_ptr": f"*{cell}", "order_ptr": "*i64", "hot_ptr": "*i64", "pack_ptr": "*i64",
                     "count_ptr": "*i32", "N": "i32", "n_rows": "i32", "n_feat": "i32", "n_nodes": "i32"}
            # integer cells read the routing's compaction (its count on the device); float cells the sort
            ce = {"BLOCK_N": 256, "GATHER": gather, "ELIDE": elide, "PACK": cell == "i32", "COUNTED": gather and elide}
            out[f"histogram_{name}" + ("_gather" if gather else "")] = (
                _histogram_kernel, _signature(_histogram_kernel, types, ce), ce)
    return out


def _flat_lambda_configs() -> dict:
    """The flat lambda kernel in float32 and float64 at the narrowest, a middle and the widest
    length bucket, NDCG@10 normalised and weighted (the heaviest variant) and RankNet; float64 at
    the widest with its results rounded to float32 values (``quantized_grad``'s pass)."""
    out = {}
    for short, ptr in FLOATS.items():
        types = {"s_ptr": ptr, "y_ptr": ptr, "gain_ptr": ptr, "w_ptr": ptr, "offsets_ptr": "*i64",
                 "queries_ptr": "*i32", "grad_ptr": ptr, "hess_ptr": ptr, "k": "i32", "sigma": "fp32"}
        for block in (16, 2048, MAX_BLOCK):
            for name, weighting, extra in (("ndcg", 1, True), ("ranknet", 0, False)):
                ce = {"WEIGHTING": weighting, "HAS_WEIGHTS": extra, "NORMALIZE": extra, "BLOCK": block,
                      "BLOCK_C": min(block, 128), "K_PAD": 16, "ROUND32": short == "fp64" and block == MAX_BLOCK}
                out[f"flat_lambda_{name}_{block}_{short}"] = (
                    _flat_lambda_kernel, _signature(_flat_lambda_kernel, types, ce), ce)
                WARPS[f"flat_lambda_{name}_{block}_{short}"] = warps_for(block)
    ce = {"BLOCK": 1024}
    out["eval_mean"] = (_mean_kernel, _signature(_mean_kernel, {"values_ptr": "*fp64", "out_ptr": "*fp64", "n": "i32"},
                                                 ce), ce)
    # The booster's float32 lambdas read from its float64 scores and written as float64 (no cast).
    types = {"s_ptr": "*fp64", "y_ptr": "*fp32", "gain_ptr": "*fp32", "w_ptr": "*fp32", "offsets_ptr": "*i64",
             "queries_ptr": "*i32", "grad_ptr": "*fp64", "hess_ptr": "*fp64", "k": "i32", "sigma": "fp32"}
    ce = {"WEIGHTING": 1, "HAS_WEIGHTS": True, "NORMALIZE": True, "BLOCK": MAX_BLOCK, "BLOCK_C": 128, "K_PAD": 16,
          "ROUND32": False}
    out["flat_lambda_ndcg_mixed"] = (_flat_lambda_kernel, _signature(_flat_lambda_kernel, types, ce), ce)
    WARPS["flat_lambda_ndcg_mixed"] = warps_for(MAX_BLOCK)
    types = {"scores_ptr": "*fp64", "codes_ptr": "*u8", "feats_ptr": "*i64", "cuts_ptr": "*i64",
             "values_ptr": "*fp64", "y_ptr": "*fp64", "gain_ptr": "*fp64", "offsets_ptr": "*i64",
             "queries_ptr": "*i32", "out_ptr": "*fp64", "N": "i32", "k": "i32", "empty": "fp64"}
    for block in (16, 2048, MAX_BLOCK):
        ce = {"DEPTH": 6, "BLOCK": block, "K_PAD": 16}
        out[f"eval_ndcg_{block}"] = (_eval_ndcg_kernel, _signature(_eval_ndcg_kernel, types, ce), ce)
        WARPS[f"eval_ndcg_{block}"] = warps_for(block)
    return out


def _level_configs() -> dict:
    """The level kernel as the Triton backend launches it: packed int32 cells of quantized
    gradients and int64 cells of 64-bit fixed-point ones, both with hot codes elided, at the root
    and at a children level, with and without split noise, and the default round's last level
    (the leaves' sums cut); float64 cells (no elision) as the reference's tests launch it."""
    out = {}
    for cell, pack, elide in (("i32", True, True), ("i64", False, True), ("fp64", False, False)):
        types = {"hist_ptr": f"*{cell}", "raw_ptr": f"*{cell}", "pack_ptr": "*i64", "parent_ptr": f"*{cell}",
                 "prev_small_ptr": "*i8", "prev_totals_ptr": "*i64", "hot_ptr": "*i64", "valid_ptr": "*u8",
                 "next_raw_ptr": f"*{cell}", "next_pack_ptr": "*i64", "leaf_ptr": "*fp64",
                 "scale_ptr": "*fp64", "noise_ptr": "*fp64", "best_ptr": "*fp64", "code_ptr": "*i32",
                 "counter_ptr": "*i32", "feats_ptr": "*i64", "cuts_ptr": "*i64", "gains_ptr": "*fp64",
                 "stopped_ptr": "*i8", "small_ptr": "*i8", "totals_ptr": "*i64", "level": "i32", "n_feat": "i32",
                 "n_nodes": "i32", "l2": "fp64", "min_data": "fp64", "min_hess": "fp64", "tiny": "fp64",
                 "neg_lr": "fp64"}
        for children in (False, True):
            for noise in (False, True):
                ce = {"CHILDREN": children, "PACK": pack, "ELIDE": elide, "QUANT": cell != "fp64",
                      "HAS_NOISE": noise, "LAST": False, "TOTALS": elide, "LEAVES": False, "ZERO_PACK": pack,
                      "BLOCK_F": 256}
                name = f"level_{cell}" + ("_children" if children else "_root") + ("_noise" if noise else "")
                out[name] = (_level_kernel, _signature(_level_kernel, types, ce), ce)
        if cell != "fp64":  # the last level: the default round's pick cuts the leaves, the quantized one's not
            ce = {"CHILDREN": True, "PACK": pack, "ELIDE": True, "QUANT": True, "HAS_NOISE": False, "LAST": True,
                  "TOTALS": True, "LEAVES": cell == "i64", "ZERO_PACK": False, "BLOCK_F": 256}
            out[f"level_{cell}_last" + ("_leaves" if cell == "i64" else "")] = (
                _level_kernel, _signature(_level_kernel, types, ce), ce)
    return out


def _fixed_configs() -> dict:
    """The round's gradients as integers (:mod:`rankkit.kernels.triton.fixed`): the fixed point's and
    ``quantized_grad``'s scales (the last program's) and roundings."""
    out = {}
    types = {"g_ptr": "*fp64", "h_ptr": "*fp64", "part_ptr": "*fp64", "counter_ptr": "*i32", "factor_ptr": "*fp64",
             "root_ptr": "*i64", "clear_ptr": "*i32", "N": "i32", "per_program": "i32", "programs": "i32",
             "top_shift": "fp64", "n_clear": "i32"}
    ce = {"BLOCK": FIXED_BLOCK, "BLOCK_P": 1024}
    out["fixed_scale"] = (_scale_kernel, _signature(_scale_kernel, types, ce), ce)
    types = {"g_ptr": "*fp64", "h_ptr": "*fp64", "factor_ptr": "*fp64", "gq_ptr": "*i64", "hq_ptr": "*i64",
             "root_ptr": "*i64", "node_ptr": "*i64", "cells_ptr": "*i64", "N": "i32", "n_cells": "i32"}
    ce = {"BLOCK": FIXED_BLOCK}
    out["fixed_round"] = (_round_kernel, _signature(_round_kernel, types, ce), ce)
    types = {"g_ptr": "*fp64", "h_ptr": "*fp64", "part_ptr": "*fp64", "counter_ptr": "*i32", "scale_ptr": "*fp64",
             "root_ptr": "*i64", "clear_ptr": "*i32", "N": "i32", "per_program": "i32", "programs": "i32",
             "half_bins": "fp64", "bins": "fp64", "n_clear": "i32"}
    ce = {"BLOCK": FIXED_BLOCK, "BLOCK_P": 1024}
    out["fixed_scale_quantized"] = (_quantize_scale_kernel, _signature(_quantize_scale_kernel, types, ce), ce)
    types = {"g_ptr": "*fp64", "h_ptr": "*fp64", "u_ptr": "*fp64", "scale_ptr": "*fp64", "gq_ptr": "*i32",
             "hq_ptr": "*i32", "root_ptr": "*i64", "node_ptr": "*i64", "cells_ptr": "*i32", "pack_ptr": "*i64",
             "N": "i32", "n_node": "i32", "n_cells": "i32", "n_pack": "i32"}
    ce = {"BLOCK": FIXED_BLOCK}
    out["fixed_round_quantized"] = (_quantize_round_kernel, _signature(_quantize_round_kernel, types, ce), ce)
    return out


def _configs() -> dict:
    """kernel name -> (kernel, signature, constexprs), every configuration the trainers launch,
    in float32 and float64 where the scores' dtype reaches the kernel."""
    out = {}
    for short, ptr in FLOATS.items():
        rank_types = {"s_ptr": ptr, "y_ptr": ptr, "m_ptr": "*u8", "bound_ptr": "*i32",
                      "rank_ptr": "*i32", "order_ptr": "*i32", "n_ptr": "*i32",
                      "inv_idcg_ptr": ptr, "L": "i32", "k": "i32"}
        ce = {"GAIN": 0, "BLOCK_R": 32, "BLOCK_C": 64}
        out[f"rank_{short}"] = (_rank_kernel, _signature(_rank_kernel, rank_types, ce), ce)
        topk_types = {a: t for a, t in rank_types.items() if a != "rank_ptr"}
        ce = {"GAIN": 0, "BLOCK": 256}
        out[f"topk_{short}"] = (_topk_kernel, _signature(_topk_kernel, topk_types, ce), ce)
        lam_types = {"s_ptr": ptr, "y_ptr": ptr, "order_ptr": "*i32", "n_ptr": "*i32",
                     "inv_idcg_ptr": ptr, "w_ptr": ptr, "grad_ptr": ptr, "hess_ptr": ptr,
                     "loss_ptr": ptr, "L": "i32", "k": "i32", "sigma": "fp32", "n_tiles": "i32"}
        for name, weighting, loss in (("lambda_ndcg", 1, False), ("lambda_ndcg_loss", 1, True),
                                      ("lambda_ranknet", 0, False)):
            ce = {"WEIGHTING": weighting, "GAIN": 0, "HAS_WEIGHTS": False, "WITH_LOSS": loss,
                  "BLOCK_R": 16, "BLOCK_C": 32, "BLOCK_K": 16}
            out[f"{name}_{short}"] = (_lambda_kernel, _signature(_lambda_kernel, lam_types, ce), ce)
    out.update(_histogram_configs())
    for cell in ("i32", "i64"):
        types = {"out_ptr": f"*{cell}", "pack_ptr": "*i64", "hot_ptr": "*i64", "totals_ptr": "*i64",
                 "n_feat": "i32", "n_nodes": "i32"}
        ce = {"PACK": cell == "i32", "ELIDE": True}
        out[f"finish_{cell}"] = (_finish_kernel, _signature(_finish_kernel, types, ce), ce)
    out.update(_flat_lambda_configs())
    out.update(_level_configs())
    types = {"codes_ptr": "*u8", "node_ptr": "*i64", "slot_ptr": "*i16", "small_ptr": "*i8",
             "feats_ptr": "*i64", "cuts_ptr": "*i64", "order_ptr": "*i64", "count_ptr": "*i32", "level": "i32",
             "N": "i32", "n_nodes": "i32"}
    for compact in (False, True):
        ce = {"WITH_SLOT": True, "COMPACT": compact, "BLOCK_N": 256}
        out["route" + ("_compact" if compact else "")] = (_route_kernel, _signature(_route_kernel, types, ce), ce)
    types = {"node_ptr": "*i64", "g_ptr": "*fp64", "h_ptr": "*fp64", "factor_ptr": "*fp64",
             "part_ptr": "*i64", "N": "i32", "per_program": "i32"}
    ce = {"N_LEAVES": 64, "BLOCK_N": 64}
    out["exact_leaf_sums"] = (_exact_leaf_sums_kernel, _signature(_exact_leaf_sums_kernel, types, ce), ce)
    types = {"part_ptr": "*i64", "factor_ptr": "*fp64", "out_ptr": "*fp64", "programs": "i32", "neg_lr": "fp64",
             "l2": "fp64", "min_hess": "fp64"}
    ce = {"N_LEAVES": 64}
    out["leaf_values"] = (_leaf_values_kernel, _signature(_leaf_values_kernel, types, ce), ce)
    out.update(_fixed_configs())
    for short, ptr in FLOATS.items():
        types = {"scores_ptr": ptr, "leaf_values_ptr": "*fp64", "leaf_ptr": "*i64",
                 "codes_ptr": "*u8", "feats_ptr": "*i64", "cuts_ptr": "*i64", "N": "i32"}
        ce = {"DEPTH": 6, "FROM_CODES": True, "BLOCK_N": 1024}
        out[f"score_update_{short}"] = (_score_update_kernel,
                                        _signature(_score_update_kernel, types, ce), ce)
    # The round's tree for the host copy: features and codes (int64), gains, a metric, the leaves.
    types = {"out_ptr": "*fp64", "p0": "*i64", "p1": "*i64", "p2": "*fp64", "p3": "*fp64", "p4": "*fp64",
             "p5": "*fp64", "p6": "*fp64", "p7": "*fp64", **{f"n{i}": "i32" for i in range(8)}}
    ce = {"BLOCK": PACK_BLOCK}
    out["pack"] = (_pack_kernel, _signature(_pack_kernel, types, ce), ce)
    return out


KERNELS = _configs()


def _tool(name: str) -> str:
    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"triton {triton.__version__} ships no {name} at {path}")
    return path


def ptxas_path() -> str:
    """The ptxas that Triton ships and that reads its PTX.

    Triton 3.9 ships two: ``ptxas`` (CUDA 12.9, PTX ISA up to 8.8) and ``ptxas-blackwell``
    (CUDA 13.4); the PTX it emits is ``.version 9.4``, which only the second assembles.
    """
    try:
        return _tool("ptxas-blackwell")
    except FileNotFoundError:
        return _tool("ptxas")


def int_args(name: str) -> list[str]:
    """The integer arguments of a shipped kernel: at run time Triton compiles a variant with
    each one that equals 1 made a constant, so each must compile that way too."""
    return [a for a, t in KERNELS[name][1].items() if t in ("i32", "i64")]


def compile_kernel(name: str, target: GPUTarget = H100, num_warps: int | None = None, ones: tuple = ()) -> dict:
    """Compile one shipped kernel for ``target``; return its resource use.

    ``ones``: integer arguments compiled as the constant 1.

    Returns:
        {"name", "registers", "spill_stores", "spill_loads" (bytes, from ``ptxas -v`` on the
        PTX), "local_bytes", "stack_bytes", "shared_bytes" (from ``cuobjdump
        --dump-resource-usage`` of Triton's own cubin), "triton_shared_bytes" (Triton's
        allocation, ``metadata.shared``), "num_warps"}.
    """
    fn, signature, constexprs = KERNELS[name]
    num_warps = WARPS.get(name, 4) if num_warps is None else num_warps
    if ones:  # the arguments equal to 1, specialised as constants (as the launcher does)
        signature = {a: ("constexpr" if a in ones else t) for a, t in signature.items()}
        constexprs = dict(constexprs, **{a: 1 for a in ones})
    compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                              target=target, options={"num_warps": num_warps})
    arch = f"sm_{target.arch}a" if target.arch >= 90 else f"sm_{target.arch}"
    with tempfile.TemporaryDirectory() as tmp:
        ptx, cubin = os.path.join(tmp, "kernel.ptx"), os.path.join(tmp, "kernel.cubin")
        with open(ptx, "w") as f:
            f.write(compiled.asm["ptx"])
        with open(cubin, "wb") as f:
            f.write(compiled.asm["cubin"])
        assembled = subprocess.run([ptxas_path(), "-v", f"--gpu-name={arch}", ptx, "-o",
                                    os.path.join(tmp, "again.cubin")],
                                   capture_output=True, text=True, check=True)
        usage = subprocess.run([_tool("cuobjdump"), "--dump-resource-usage", cubin],
                               capture_output=True, text=True, check=True).stdout
    info = assembled.stderr + assembled.stdout

    def grab(pattern, text):
        found = re.search(pattern, text)
        return int(found.group(1)) if found else None

    return {
        "name": name,
        "registers": grab(r"REG:(\d+)", usage),
        "ptxas_registers": grab(r"Used (\d+) registers", info),
        "spill_stores": grab(r"(\d+) bytes spill stores", info),
        "spill_loads": grab(r"(\d+) bytes spill loads", info),
        "local_bytes": grab(r"LOCAL:(\d+)", usage),
        "stack_bytes": grab(r"STACK:(\d+)", usage),
        "shared_bytes": grab(r"SHARED:(\d+)", usage),
        "triton_shared_bytes": int(compiled.metadata.shared),
        "num_warps": compiled.metadata.num_warps,
        # The distinct atomic instructions of the PTX, e.g. "red.global.add.s32" (relaxed,
        # fire-and-forget) or "atom.global.acq_rel.gpu.add.u64" (ordered, fenced).
        "atomics": sorted(set(re.findall(r"\b((?:atom|red)\.[\w.]+)", compiled.asm["ptx"]))),
        "fences": len(re.findall(r"\bfence\.", compiled.asm["ptx"])),
        "last_program": last_program_ordered(compiled.asm["ptx"]),
    }


def last_program_ordered(ptx: str) -> bool | None:
    """Whether a kernel that lets its last program read what the others wrote orders it as the
    PTX memory model needs (as CUDA's grid-wide reductions do): a CTA barrier after the
    program's last store and before its one acquire-release add, a barrier after that add (its
    result shared with the CTA's threads), and the reads after it past L1 (``ld.global.cg``).
    None for a kernel with no acquire-release add (the interpreter, which runs the programs in
    turn, cannot show this)."""
    atom = ptx.find("atom.global.gpu.acq_rel.add")
    if atom < 0:
        return None
    before, read = ptx[:atom], ptx.find("ld.global.cg", atom)
    return before.rfind("bar.sync") > before.rfind("st.global") and read > 0 and "bar.sync" in ptx[atom:read]


if __name__ == "__main__":
    for kernel in KERNELS:
        print(compile_kernel(kernel))
