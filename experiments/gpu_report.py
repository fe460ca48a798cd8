"""Generate docs/gpu.md from what can be known without a GPU, so that the page cannot go stale.

    python experiments/gpu_report.py            # prints the page
    python experiments/gpu_report.py --write    # and writes docs/gpu.md (atomically)

Three sources, each labelled on the page:

1. **Counted** on the simulated CUDA device (``tests/simcuda.py``): launches, host syncs and
   host-device copies of one boosting round (depth 6, one eval set) at two data sizes, with
   the default options and with every randomised option, and of a neural LambdaRank step.
   The simulation runs the torch path (Triton needs a real GPU or its interpreter).
2. **Counted** under Triton's interpreter (a subprocess with ``TRITON_INTERPRET=1``): the
   Triton kernels launched by one depth-6 tree on the Triton backend and by one lambda pass.
3. **Compiled** for an H100 (sm_90) with the ``ptxas`` / ``cuobjdump`` that Triton ships
   (:mod:`rankkit.kernels.triton.aot`): registers, spills, shared memory and atomics of every kernel
   configuration the trainers launch, in float32 and float64; occupancy from those
   figures by the CUDA occupancy rules (**modelled**).
4. **Modelled** H100 times at MSLR-WEB30K size (a roofline with the constants stated on the
   page): the lambda pass over an MSLR-like length distribution, and a depth-6 round.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import math
import os
import subprocess
import sys

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "gpu.md")

# H100 SXM constants of the model (public spec sheet figures; see the page).
SMS, CLOCK = 132, 1.755e9            # SMs, sustained boost clock (Hz)
FP32_LANES, INT_LANES, SFU_LANES = 128, 64, 16  # per SM per clock
HBM = 3.35e12                         # bytes/s
# Global relaxed reductions/s for the histogram's access pattern: read off the one measured round
# (44.3 ms on an H200, 2026-11-26: the 3.5-5.4 G reductions of its histograms took about 36-39 ms;
# ../shared/design/gpu-round.md §1.2). Inferred, not measured directly: experiments/gpu_microbench.py
# measures it on the next GPU. (The model assumed 1e12 before that run.)
ATOMICS = 1.2e11
LAUNCH, SYNC = 4e-6, 10e-6            # s per eager launch / host sync (graph replay: ~1 µs)
MSLR_QUERIES, MSLR_DOCS, MSLR_FEATURES = 31_531, 3_771_125, 136


# -- 1. the simulated device ---------------------------------------------------------------
def simulated_counts() -> list[dict]:
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from simcuda import simcuda

    from rankkit.boosting.engine import BoosterConfig, BoostingEngine
    from rankkit.data import make_synthetic

    every = dict(subsample=0.8, colsample=0.8, bagging_temperature=1.0, random_strength=0.5,
                 quantized_grad=True)
    rows = []
    for queries in (20, 200):
        for label, options in (("default", {}), ("every option", every)):
            data = make_synthetic(queries, (1, 60), 20, seed=0)
            valid = make_synthetic(max(4, queries // 4), (1, 60), 20, seed=1)
            with simcuda() as counts:
                engine = BoostingEngine(data.features, data.labels, data.sizes,
                                        BoosterConfig(depth=6, min_data_in_leaf=3, **options),
                                        device="cuda")
                engine.add_eval_set(valid.features, valid.labels, valid.sizes)
                engine.update()
                counts.reset()
                engine.update()
                snap = counts.snapshot()
            rows.append({"what": f"boosting round, depth 6 + eval set, {label}",
                         "docs": int(data.sizes.sum()), **snap})
    from rankkit.lambdas import lambda_gradients

    g = torch.Generator().manual_seed(0)
    scores = torch.randn(64, 120, generator=g)
    labels = torch.randint(0, 5, (64, 120), generator=g).float()
    with simcuda() as counts:
        s, y = scores.cuda().requires_grad_(), labels.cuda()
        counts.reset()  # the batch's own copy to the device is the data loader's, not the step's
        grad, hess, loss = lambda_gradients(s.detach(), y, weighting="ndcg", k=10, return_loss=True)
        snap = counts.snapshot()
    rows.append({"what": "neural LambdaRank step's lambdas (64 × 120, NDCG@10, loss)",
                 "docs": 64 * 120, **snap})
    return rows


# -- 2. Triton launches under the interpreter ---------------------------------------------
_LAUNCHES = r"""
import json, os, sys, collections
os.environ["RANKKIT_TRITON"] = "force"      # the route a CUDA device takes ...
os.environ["RANKKIT_CPU_KERNEL"] = "0"      # ... here on CPU tensors, under the interpreter
import warnings
warnings.simplefilter("ignore")
import torch
from torch.utils._python_dispatch import TorchDispatchMode
import torch.utils._pytree as pytree
import triton.runtime.interpreter as interp

counts = collections.Counter()
inside = [0]
run = interp.InterpretedFunction.run
def counted(self, *a, **k):
    counts["triton:" + self.fn.__name__] += 1
    inside[0] += 1
    try:
        return run(self, *a, **k)
    finally:
        inside[0] -= 1
interp.InterpretedFunction.run = counted
FREE = ("view", "_unsafe_view", "alias", "as_strided", "expand", "t", "transpose", "permute",
        "unsqueeze", "squeeze", "select", "slice", "detach", "empty", "empty_strided", "empty_like",
        "lift_fresh", "_reshape_alias", "reshape", "unbind", "split", "split_with_sizes", "resize_")
SYNCS = ("_local_scalar_dense", "_to_copy_host", "nonzero")
def storages(tree):
    return {t.untyped_storage().data_ptr() for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)}
# The round's one device-to-host copy: its device side (the packing) counted as a GPU runs it,
# the copy as one launch and one sync; what follows it (the host tree's check and record) runs on
# the host on a GPU and is not counted.
import rankkit.boosting.engine as engine_module
host = [False]
copy_to_host = engine_module._round_on_host
def on_host(tree, values, packed):
    counts["torch:copy (device to host)"] += 1
    counts["sync:copy (device to host)"] += 1
    host[0] = True
    return copy_to_host(tree, values, packed)
engine_module._round_on_host = on_host
class Ops(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        out = func(*args, **(kwargs or {}))
        if not inside[0] and not host[0]:
            if name in ("_local_scalar_dense", "nonzero"):
                counts["sync:" + name] += 1
            elif name not in FREE:
                counts["torch:" + name] += 1
            # An allocation: an output holding memory that no input holds (a view, an in-place
            # or out= op returns an input's storage).
            given = storages((args, kwargs))
            for t in pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() and \
                        t.untyped_storage().data_ptr() not in given:
                    counts["alloc:" + name] += 1
        return out

from rankkit.boosting.engine import BoostingEngine, BoosterConfig
from rankkit.data import make_synthetic
out = {}
for label, quant in (("default", False), ("quantized", True)):
    data = make_synthetic(30, (2, 40), 8, seed=0)
    valid = make_synthetic(8, (2, 40), 8, seed=1)
    engine = BoostingEngine(data.features, data.labels, data.sizes,
                            BoosterConfig(depth=6, min_data_in_leaf=2, k=10, quantized_grad=quant))
    engine.add_eval_set(valid.features, valid.labels, valid.sizes)
    assert engine.backend.name == "triton"
    engine.update()
    counts.clear()
    host[0] = False
    with Ops():
        engine.update()
    out[label] = dict(counts)
json.dump(out, open(sys.argv[1], "w"))
"""


def triton_launches(tmp: str) -> dict:
    path = os.path.join(tmp, "launches.json")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run([sys.executable, "-c", _LAUNCHES, path], cwd=ROOT, env=env, check=True,
                   capture_output=True, text=True)
    return json.load(open(path))


# -- 3. the sm_90 compile report -----------------------------------------------------------
def occupancy(registers: int, shared: int, warps: int) -> float:
    """Resident warps / 64 on an sm_90 SM (modelled by the CUDA occupancy rules: 65,536
    registers in units of 256 per warp, 228 KB of shared memory with 1 KB reserved per block,
    at most 32 blocks and 64 warps)."""
    per_warp = math.ceil(registers * 32 / 256) * 256
    by_regs = 65536 // (per_warp * warps) if per_warp else 32
    by_shared = (228 * 1024) // (shared + 1024)
    blocks = min(by_regs, by_shared, 64 // warps, 32)
    return blocks * warps / 64


def compile_report() -> list[dict]:
    from rankkit.kernels.triton.aot import KERNELS, compile_kernel

    out = []
    for name in KERNELS:
        info = compile_kernel(name)
        info["occupancy"] = occupancy(info["registers"], info["shared_bytes"], info["num_warps"])
        out.append(info)
    return out


# -- 4. the roofline model -----------------------------------------------------------------
def mslr_lengths(seed: int = 0) -> np.ndarray:
    """A modelled MSLR-WEB30K length distribution: 31,531 log-normal lengths (σ = 0.75),
    clipped to 1..1,251 and scaled to 3.77 M documents (MSLR's counts; its exact per-query
    lengths are not in this repository)."""
    rng = np.random.default_rng(seed)
    raw = rng.lognormal(0.0, 0.75, MSLR_QUERIES)
    n = np.clip(np.round(raw * MSLR_DOCS / raw.sum()), 1, 1251).astype(np.int64)
    return n


def flat_lambda_model(n: np.ndarray, k: int = 10) -> dict:
    """Pair evaluations and modelled time of the flat Triton lambda pass
    (:mod:`rankkit.kernels.triton.flat_lambdas`): one program per query, k selection passes over
    the query held in registers, each pair with a document in the top k evaluated once."""
    kk = np.minimum(k, n)
    evals = int((kk * n - kk * (kk + 1) // 2).sum())
    block = np.maximum(16, 2 ** np.ceil(np.log2(np.maximum(n, 1))))
    # A selection pass: three block reductions over the program's documents, ~600 cycles of
    # latency at 8 resident programs per SM (8 warps, up to 248 registers in float64).
    t_select = float((kk * 600).sum()) / (SMS * 8) / CLOCK
    tiles = int((kk * -(-block.astype(np.int64) // 128) * 128).sum())  # [K_PAD, 128] tile elements
    t_pairs = max(tiles * 32 / (SMS * CLOCK * FP32_LANES), evals * 2 / (SMS * CLOCK * SFU_LANES))
    t_mem = float(n.sum()) * 40 / HBM  # scores, labels, gains read; grad, hess written, re-read
    buckets = len(np.unique(block))
    return {"evals": evals, "t_select": t_select, "t_pairs": t_pairs, "t_mem": t_mem, "launches": buckets,
            "total": t_select + t_pairs + t_mem + buckets * LAUNCH}


def lambda_model(n: np.ndarray, k: int = 10, block_r: int = 16, block_c: int = 32,
                 loss: bool = False) -> dict:
    """Pair evaluations and modelled time of the Triton lambda pass (ranks + lambdas)."""
    block_k = min(block_c, max(16, 1 << (k - 1).bit_length()))
    tiles = -(-n // block_r)
    evals = 0
    for length, t in zip(n.tolist(), tiles.tolist()):
        top_tiles = min(t, -(-k // block_r))  # tiles holding a rank < k visit every column
        evals += block_r * (top_tiles * (-(-length // block_c) * block_c)
                            + (t - top_tiles) * (-(-min(k, length) // block_k) * block_k))
    rank_cmp = int(((-(-n // 32) * 32) * (-(-n // 64) * 64)).sum())  # the counting kernel (k > 32)
    padded_old = MSLR_QUERIES * int(n.max()) ** 2  # the old kernel: every pair of the padded max length
    # The top-k kernel (k <= 32): 2 min(k, n) selection passes (ranking, ideal DCG) and 2 more
    # (count, placing the rest), each over the query in steps of 256 documents.
    steps = -(-n // 256)
    passes = 2 * np.minimum(k, n) + 2
    topk_elems = int((passes * steps * 256).sum())
    # Per pair evaluation: ~32 fp32 instructions and 2 MUFU (exp, rcp; a third, log, with the loss); per
    # selection element ~15 instructions; per rank comparison ~10 integer ones (modelled, from
    # the kernels' source). A selection step is latency-bound: ~600 cycles (a load and three
    # block reductions), with 16 programs (4 warps each) resident per SM at 40 registers.
    mufu = 3 if loss else 2
    t_lambda = max(evals * 32 / (SMS * CLOCK * FP32_LANES), evals * mufu / (SMS * CLOCK * SFU_LANES))
    t_topk = max(topk_elems * 15 / (SMS * CLOCK * FP32_LANES),
                 float((passes * steps).sum()) * 600 / (SMS * 16) / CLOCK)
    t_rank = rank_cmp * 10 / (SMS * CLOCK * INT_LANES)
    t_mem = n.sum() * 40 / HBM
    return {"evals": evals, "rank_cmp": rank_cmp, "old_evals": padded_old, "t_lambda": t_lambda,
            "t_rank": t_rank, "topk_elems": topk_elems, "t_topk": t_topk, "t_mem": t_mem,
            "total": t_lambda + t_topk + t_mem + 3 * LAUNCH}


def counted_launches(counts: dict) -> int:
    """Launches of one round as counted under the interpreter: Triton kernels plus the torch ops
    dispatched outside them (each one launch on a GPU)."""
    return sum(v for k, v in counts.items() if k.startswith(("triton:", "torch:")))


def hot_share(queries: int = 3_000, seed: int = 0) -> float:
    """The share of (document, feature) entries in their feature's most frequent code, on the
    GPU bench's MSLR-like data (experiments/bench_gpu.py ``mslr_like``, 255 bins): what hot-bin
    elision leaves out of the histograms' atomics (counted on that synthetic data)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_gpu import mslr_like

    from rankkit.boosting.binning import QuantileBinner

    data = mslr_like(queries, MSLR_FEATURES, seed)
    codes = QuantileBinner(255, seed=0).fit(data.features).transform(data.features).long()
    top = torch.stack([torch.bincount(codes[:, j], minlength=256).max() for j in range(codes.shape[1])])
    return float(top.sum()) / codes.numel()


def round_model(lam: dict, depth: int = 6, n: int = MSLR_DOCS, f: int = MSLR_FEATURES,
                launches: int | None = None, elided: float = 0.0) -> dict:
    """Modelled depth-6 round on the Triton backend: the root histogram reads every document's
    codes; each later level partitions the documents by slot (a stable sort of int16 keys, about
    two passes of 10 bytes a document) and reads only the smaller children's documents (at most
    half) through the partition; each added document costs 3 relaxed atomics per feature; the
    level kernel (rows finished, siblings, split scan, pick) and the routing are small; leaves and
    the updates are a few passes over N."""
    hist_bytes = n * (f + 16) + (depth - 1) * (n * 0.5 * (f + 26) + n * 20)
    # smaller child ≤ half of each level's documents; the hot codes' entries elided
    atomics = 3 * f * n * (1 + (depth - 1) * 0.5) * (1.0 - elided)
    route_bytes = depth * n * 25 + 3 * n * 16
    t_hist = hist_bytes / HBM + atomics / ATOMICS
    if launches is None:  # no count given: a floor from the kernels alone (lambdas, the root
        # histogram, the level kernel and the routing a level, a sort and a histogram below the
        # root, the leaf sums and the two score updates)
        launches = 3 + 1 + 2 * depth + 2 * (depth - 1) + 3
    t = lam["total"] + t_hist + route_bytes / HBM
    return {"hist_bytes": hist_bytes, "atomics": atomics, "elided": elided, "t_hist_mem": hist_bytes / HBM,
            "t_atomics": atomics / ATOMICS, "route_bytes": route_bytes, "launches": launches,
            "eager": t + launches * LAUNCH + SYNC, "graph": t + launches * 1e-6 + SYNC}


# -- the page ------------------------------------------------------------------------------
def render(sim: list[dict], launches: dict, compiled: list[dict], lam: dict, rnd: dict,
           lengths: np.ndarray, lam_loss: dict, flat: dict) -> str:
    import triton

    still = " and ".join(
        f"{sum(v for k, v in c.items() if k.startswith('triton:'))} Triton launches + "
        f"{sum(v for k, v in c.items() if k.startswith('torch:'))} torch ops ({label})"
        for label, c in launches.items())

    ms = lambda s: f"{s * 1e3:.3f} ms"
    lines = [
        "# The GPU path, proven without a GPU",
        "",
        "<!-- Generated by experiments/gpu_report.py; edit that script, not this page. -->",
        f"Generated {datetime.date.today()} by `python experiments/gpu_report.py --write` "
        f"(torch {torch.__version__}, triton {triton.__version__}), on a machine with no GPU: "
        "every figure below is **counted** (simulated device, Triton interpreter), "
        "**compiled** (sm_90, no device) or **modelled** (roofline), and says which. What a GPU "
        "measured is in docs/gpu_check.md (regenerated by each `bash experiments/gpu_check.sh`) "
        "and in the last section here.",
        "",
        "## Where the Triton kernels run",
        "",
        "`rankkit.kernels.backends.TritonBackend` runs the booster's round on the Triton kernels of "
        "`rankkit/kernels/triton/`: the flat lambda pass (`flat_lambdas`; the padded `lambdas` for "
        "the neural loss and k > 32), every level of a tree fused (`tree.grow_levels_triton`: "
        "the smaller children's histogram, then one launch a level that finishes its rows, makes "
        "the larger children by subtraction, scans the splits and picks the level's, then the "
        "routing), the fixed-point leaf sums, the score "
        "updates and each eval set's update and NDCG@k (`eval_ndcg`). "
        "They run when the tensors are on a CUDA device of a CUDA build of torch and Triton is "
        "importable (`RANKKIT_TRITON=0` turns them off; `RANKKIT_TRITON=force` runs them on CPU "
        "tensors under `TRITON_INTERPRET=1`, which is how the tests prove them). "
        "`rankkit.kernels.backends.choose` picks `\"triton\"` for such tensors, so "
        "`LambdaMART(device=\"cuda\")` grows its trees with `grow_levels_triton` and updates the "
        "training and eval scores with `score_update`; `rankkit.lambdas` routes RankNet / NDCG "
        "lambdas (the loss included) to the Triton kernels, for the booster and the neural "
        "loss alike. Tests: `tests/kernels/triton/test_lambdas.py`, `test_histogram.py` and `test_aot.py` (lambdas, histogram, sm_90 compiles), "
        "`tests/kernels/triton/test_tree.py` (the fused levels grow the torch path's levels; a boosting "
        "run on the Triton lambdas and levels grows the reference trees, bit for bit with "
        "`quantized_grad`), `tests/kernels/triton/test_backend_first_contact.py` (device generators).",
        "",
        "## First contact (each fixed with a test that failed before)",
        "",
        "* `_rank_kernel` compiles for float64 scores (the booster passes float64 with "
        "`quantized_grad`): its ideal-DCG accumulator was an fp32 scalar re-assigned fp64.",
        "* The histogram kernel skips the torch path's left-out node (`node == n_nodes`) instead "
        "of writing it into the next feature's cells (out of bounds for the last feature).",
        "* Every histogram atomic is relaxed: `red.global.gpu.relaxed.add`, no fence (the "
        "default acq_rel semantics fenced each one).",
        "* Triton compiles an integer argument equal to 1 as a constant (one feature, one "
        "document, the root's single node): the histogram, split and pick kernels then failed "
        "to compile (`n_feat.to(...)` on a Python int); every kernel is now compiled with each "
        "integer argument equal to 1 (`aot.compile_kernel(ones=...)`).",
        "* A random draw with a generator of the other device raises on the simulated device as "
        "on CUDA; XE-NDCG drew γ with the booster's host generator into CUDA scores (a GPU "
        "raises) and now draws where its generator lives.",
        "",
        "## Counted on the simulated device (torch path)",
        "",
        "The simulated device runs on a CPU build of torch, where the Triton route is never "
        "taken: these are the torch reference backend's counts. Second round of a run (steady "
        "state); launches = dispatched aten ops on device tensors; "
        "syncs = `.item()`, D2H copies, data-dependent shapes and blocking H2D copies as the "
        "simulator counts them.",
        "",
        "| what | documents | launches | syncs | H2D copies | D2H copies |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in sim:
        lines.append(f"| {row['what']} | {row['docs']:,} | {row['launches']} | {row['syncs']} | "
                     f"{row['h2d']} | {row['d2h']} |")
    lines += ["", "## Counted under Triton's interpreter (the Triton backend's round)", "",
              "A second round of `BoostingEngine.update` (depth 6, k = 10, one eval set) on the "
              "route a CUDA device takes (`RANKKIT_TRITON=force`, CPU tensors under "
              "`TRITON_INTERPRET=1`): Triton launches counted by kernel, the other device work "
              "as the aten ops dispatched outside the kernels (each one launch on a GPU), up to "
              "and including the round's one device-to-host copy (the packing, then the copy: one "
              "launch and one sync); what follows the copy (the host tree's check and record) runs "
              "on the host on a GPU and is not counted. Allocations: the outputs of those ops that hold "
              "memory none of their inputs holds (a view, an in-place or `out=` op returns an "
              "input's); the Triton kernels write into buffers they are given.", "",
              "| round | Triton launches | torch ops | syncs | allocations | Triton kernels |",
              "|---|---:|---:|---:|---:|---|"]
    for label, counts in launches.items():
        tri = {k[7:]: v for k, v in counts.items() if k.startswith("triton:")}
        ops = sum(v for k, v in counts.items() if k.startswith("torch:"))
        syncs = sum(v for k, v in counts.items() if k.startswith("sync:"))
        allocs = sum(v for k, v in counts.items() if k.startswith("alloc:"))
        lines.append(f"| {label} | {sum(tri.values())} | {ops} | {syncs} | {allocs} | "
                     + ", ".join(f"`{k}` × {v}" for k, v in sorted(tri.items())) + " |")
    top_ops = collections.Counter({k[6:]: v for k, v in launches["default"].items() if k.startswith("torch:")})
    lines += ["", "The torch ops of the default round, most frequent first: "
              + ", ".join(f"`{k}` × {v}" for k, v in top_ops.most_common(12)) + ".", ""]
    lines += [
        "## Compiled for sm_90 (H100), every configuration the trainers launch",
        "",
        "`triton.compile(ASTSource(...), target=GPUTarget(\"cuda\", 90, 32))`, then `ptxas -v` on "
        "the PTX and `cuobjdump --dump-resource-usage` on the cubin. Occupancy is **modelled** "
        "from registers, shared memory and warps by the CUDA occupancy rules.",
        "",
        "| kernel | registers | spills (B) | stack (B) | shared (B) | warps | occupancy (modelled) | atomics |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for k in compiled:
        spills = (k["spill_stores"] or 0) + (k["spill_loads"] or 0)
        lines.append(f"| `{k['name']}` | {k['registers']} | {spills} | {k['stack_bytes']} | "
                     f"{k['shared_bytes']} | {k['num_warps']} | {k['occupancy']:.0%} | "
                     f"{', '.join(k['atomics']) or '–'} |")
    no_spill = all((k["spill_stores"] or 0) == 0 and (k["stack_bytes"] or 0) == 0 for k in compiled)
    lines += [
        "",
        f"No spills in any configuration: **{'yes' if no_spill else 'NO'}**. The lambda tiles are "
        "16 rows × 32 columns with 4 warps (32 × 64 spilled in float64 and used 221–255 "
        "registers).",
        "",
        "## Modelled H100 time at MSLR-WEB30K size (modelled, not measured)",
        "",
        f"Constants: {SMS} SMs at {CLOCK / 1e9:.3f} GHz; per SM and clock {FP32_LANES} fp32, "
        f"{INT_LANES} integer and {SFU_LANES} special-function lanes; HBM {HBM / 1e12:.2f} TB/s; "
        f"{ATOMICS:.1e} relaxed global reductions/s (inferred from the one measured round, 44.3 ms on "
        "an H200, whose histograms took about 36–39 ms of it; not yet measured directly: "
        "`experiments/gpu_microbench.py` does on the next GPU); "
        f"{LAUNCH * 1e6:.0f} µs per eager launch, ~1 µs in a CUDA graph; {SYNC * 1e6:.0f} µs per "
        "sync. Per pair evaluation ~32 fp32 instructions and 2 special-function ones (3 with the "
        "loss); per top-k selection element ~15 instructions, a selection step ~600 cycles of "
        "latency with 16 programs resident per SM; per rank "
        "comparison ~10 integer ones (counted from the kernels' source, not from SASS).",
        "",
        f"Lengths: a modelled MSLR-like distribution ({len(lengths):,} queries, "
        f"{int(lengths.sum()):,} documents, lengths {int(lengths.min())}–{int(lengths.max())}, "
        f"median {int(np.median(lengths))}; MSLR's own per-query lengths are not in this "
        "repository). NDCG@10, float32.",
        "",
        "| quantity | value |",
        "|---|---:|",
        f"| pair evaluations, **flat** Triton lambda kernel (the booster's, k ≤ 32: each pair with a document in the top k once) | {flat['evals']:,} |",
        f"| flat kernel: top-k selection in registers / pair tiles / memory, {flat['launches']} length buckets | {ms(flat['t_select'])} / {ms(flat['t_pairs'])} / {ms(flat['t_mem'])} |",
        f"| **lambda pass, flat kernel (modelled)**, target ≤ 0.5 ms | **{ms(flat['total'])}** |",
        f"| pair evaluations, padded Triton lambda kernel (the neural loss; the booster's k > 32; both sides of each pair) | {lam['evals']:,} |",
        f"| pair evaluations of the old kernel (every pair of the padded maximum length, both sides) | {lam['old_evals']:,} |",
        f"| top-k selection elements (k = 10: 2k + 2 passes per query) | {lam['topk_elems']:,} |",
        f"| lambda kernel | {ms(lam['t_lambda'])} |",
        f"| top-k kernel (ranks and ideal DCG@10) | {ms(lam['t_topk'])} |",
        f"| (the counting rank kernel, used for k > 32 or no k: {lam['rank_cmp']:,} comparisons) | {ms(lam['t_rank'])} |",
        f"| lambda pass memory traffic | {ms(lam['t_mem'])} |",
        f"| lambda pass, padded kernels (modelled), grad and hess | {ms(lam['total'])} |",
        f"| lambda pass with the loss as well (the neural loss; the booster no longer asks for it) | {ms(lam_loss['total'])} |",
        f"| histogram traffic, depth 6 × 136 features (root: all documents; later levels: the partition and the smaller children's documents only) | {rnd['hist_bytes'] / 1e9:.2f} GB → {ms(rnd['t_hist_mem'])} |",
        f"| histogram atomics (root + smaller children; the hot codes' {rnd['elided']:.0%} of the entries elided, counted on the bench's MSLR-like data) | {rnd['atomics'] / 1e9:.2f} G → {ms(rnd['t_atomics'])} |",
        f"| launches per round (counted under the interpreter: Triton kernels + torch ops) | {rnd['launches']} |",
        f"| **depth-6 round (modelled), eager launches**, target ≤ 5 ms | **{ms(rnd['eager'])}** |",
        f"| **depth-6 round (modelled), launches replayed from a CUDA graph** | **{ms(rnd['graph'])}** |",
        "",
        "Reading the model: with the atomic rate the measured round implies, the round is the "
        "histogram atomics. S1 (the flat lambda pass), S2 (the partitioned histograms: no masked "
        "sweeps over all codes) and hot-bin elision (each feature's most frequent code filled in "
        "from the node totals: fewer atomics, and none on the hottest addresses, whose "
        "serialisation the rate above folds in, so the model likely overstates what is left) "
        "are built and proven on the CPU. The next step the model says matters is privatising "
        "the rest (S3, ../shared/design/gpu-round.md): shared-memory integer histograms in CUDA C "
        "through NVRTC, built on 2026-11-28 and not yet run on a GPU (below), or the int8 "
        "tensor-core tile histogram the GPU check measures beside the global atomics.",
        "",
        "## Deterministic histograms (the backend-seam issue)",
        "",
        "The Triton backend turns float gradients into 64-bit fixed-point integers each round "
        "(`rankkit.kernels.backends.fixed_point`: a per-round scale 2^-S from the gradients' range, "
        "S the largest shift with n max|g| 2^S <= 2^62), so its histograms and leaf sums are integer "
        "atomics, the same bits in any order: a seed grows the same trees run after run on one GPU. "
        "`tests/kernels/triton/test_tree.py` shows it under the interpreter (permuted documents, the same "
        "tree bit for bit; float64 cells give another sum on a fixture).",
        "",
        "## Measured, and not done",
        "",
        "* **Measured once** (2026-11-26, NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0; "
        "`bash experiments/gpu_check.sh`, the table in docs/benchmarks.md): the depth-6 round with "
        "an eval set at MSLR-WEB30K size took **44.3 ms** (quantized 48.6 ms); the public lambda "
        "pass 9.2 ms; 50 rounds with binning 5.2 s; the device's trees had the CPU's splits. "
        "That was before S1 and S2 (below): the next bullet's profile came after them.",
        '* **Profiled** (2026-11-28, NVIDIA H200, torch 2.11.0+cu130, Triton 3.6.0; `bash '
        'experiments/gpu_check.sh`, docs/gpu_check.md), after S1, S2, hot-bin elision and the fused eval'
        ' kernel: the round in **43.4 ms** wall (27.5 ms of kernels), quantized **29.0 ms** (22.2 ms of '
        'kernels), 53 Triton launches a round; the lambda pass 1.3 ms (was 9.2; modelled 0.25: still 5× '
        'off); `_histogram_kernel` 16.6–22.9 ms a round (75–83 %), its root level 7.7–10.6 ms; '
        '`_exact_leaf_sums_kernel` 2.1 ms; device memory +0.00 MiB per round. The modelled 29 ms round '
        "of this page matches the quantized round, not the default one: the float histograms' atomics "
        'cost more than modelled.',
        "* **Built since, proven without a GPU**: S1, the booster's lambda pass on the flat "
        "layout (`rankkit/kernels/triton/flat_lambdas.py`, tests/kernels/triton/test_flat_lambdas.py: "
        "a float64 double loop and the compiled CPU pass); S2, each level's children histogram "
        "reading only the smaller children's documents through a partition by slot "
        "(`rankkit.kernels.triton.histogram.smaller_first`; tests/kernels/triton/test_tree.py counts "
        "the documents each histogram launch reads); hot-bin elision on integer histograms (each "
        "feature's most frequent code, found once per fit, filled in from the node totals: "
        "`rankkit.kernels.triton.histogram.hot_codes`, the same trees bit for bit; the totals come "
        "from the pick kernel, the fill from one finishing kernel); quantized histograms sending g "
        "and h as one 64-bit add (two atomics per entry instead of three); S4's eval set update and "
        "NDCG@k in one kernel (`rankkit/kernels/triton/eval_ndcg.py`, equal to the compiled CPU "
        "metric) and its two-stage leaf sums (no atomics); device memory flat in the rounds (the engine "
        "keeps host trees without their [N] leaf index; tests/boosting/test_engine_syncs.py counts the "
        "live device bytes).",
        "* **The GPU check is a profile**: `bash experiments/gpu_check.sh` (at most 8 minutes) runs "
        "the microbenchmarks (`experiments/gpu_microbench.py`), a `torch.profiler` profile of the "
        "round with phases, per-kernel and per-level tables and memory per round "
        "(`experiments/gpu_profile.py`), then the suite in tiers with every failure's id written as "
        "it happens; `python experiments/gpu_profile.py --render` regenerates docs/gpu_check.md.",
        '* **S3 built, not yet run on a GPU** (2026-11-28; `rankkit/kernels/shared_histogram.py`, '
        "tests/kernels/test_shared_histogram.py): a level's integer histograms privatised in shared "
        'memory. One block of 256 threads takes 4,096 positions of the partition by slot and 4 '
        "features (2 with 64-bit cells), adds each document's (g, h, 1) into int32 (or 64-bit) shared "
        "cells for the tile's first two slots (later slots of a tile over many small ones go straight "
        'to the global cells), and flushes each non-empty cell with one global atomic. Six kernels '
        "cover the round's dtypes: int16 slots or int64 root nodes; int32 quantized gradients into "
        "int32 or int64 cells, or the default round's 64-bit fixed point into int64 cells. "
        '**Compiled** for sm_90 through NVRTC on a machine without a GPU (`cuda.core`, now in the '
        '`gpu` extra): 36–40 registers, no spills, 24 KiB of shared memory per block (modelled '
        'occupancy: 6–7 resident blocks of 256 threads per SM, the register file being the limit: 64 '
        'K registers / (36–40 × 256)). **Its Triton twin** (the same privatised algorithm, a [tile, '
        '256] comparison per slot, one atomic per non-empty cell) equals the torch reference under '
        'the interpreter for every dtype, gathered, elided, plain and with tiles over many slots. '
        "**Opt-in**: `RANKKIT_CUDA_HISTOGRAM=1` routes `level_histogram_triton`'s integer calls to "
        'it, after a first-contact check on the device against the twin and the torch reference '
        '(three dtype pairs, gathered, elided and plain); a mismatch or any error gives one warning '
        "and the Triton histogram. The `gpu` extra's cuda-bindings and NVRTC are CUDA 13's (a CUDA "
        '12 driver needs their 12.x builds). Not '
        "measured: its speed. The GPU check's microbenchmarks time it beside `_histogram_kernel` at K "
        '= 1 and 16 with the cells compared (`smem_histogram` in experiments/gpu_microbench.py); make '
        'it the default when that run shows it faster and equal.',
        "* **S4's level kernel** (2026-12-05; `rankkit.kernels.triton.tree._level_kernel`): the "
        "histogram rows' finishing (the packed cells unpacked, the hot codes filled in), the "
        "siblings (parent − smaller child), the split scan and the pick in one launch a level, one "
        "program per feature; the program that finishes last (an acquire-release counter after a "
        "barrier, as CUDA's last-block reductions; its reads bypass L1) picks the level's split. "
        "The levels are the torch reference's under the interpreter (tests/kernels/triton/test_tree.py); "
        "compiled for sm_90 with 70–96 registers and no spills. 17 fewer launches a depth-6 round "
        "(41 → 24 Triton launches). The float round's leaves: the last level's pick cuts each "
        "leaf's fixed-point (ΣG, ΣH) from the chosen feature's rows, the same integers as the "
        "fixed-point leaf sums (whose kernel read node, g and h of every document: 2.1 ms a round "
        "in the 2026-11-28 profile), bit for bit under the interpreter; the next level's "
        "histogram is zeroed by the level kernel, the buffers its pick writes are not cleared. "
        "Not measured on a GPU.",
        "* **S5, the float gradients' fixed point in two launches** (2026-12-05; "
        "`rankkit/kernels/triton/fixed.py`, tests/kernels/triton/test_fixed.py): each program's "
        "largest |g|, |h|, the shift taken by the last program (as the level kernel's pick), then "
        "the rounding (half to even) with the root's sums added by integer atomics: the torch "
        "reference's integers and scale bit for bit (ties, zeros, powers of two, the clamp, NaN), "
        "its buffers kept for the fit. With the leaves (and the round's update, zeroed if a leaf is "
        "not finite: `Backend.update_values`) written by the last pick, and the round counted "
        "only up to its one device-to-host copy (what follows runs on the host on a GPU), the "
        "default round is 43 launches and 1 sync under the interpreter (125 and 2 in the "
        "morning's count).",
        "* **S2's partition without a sort** (2026-12-05): for integer cells the routing compacts "
        "the smaller children's documents itself (one add per tile reserves its places; the "
        "histogram reads the count the adds left on the device), in no fixed order on a GPU, which "
        "integer sums do not see; float cells, and the shared-memory histogram (whose tiles want "
        "documents grouped by slot), keep the stable sort. The default round: 38 launches and 1 "
        "sync under the interpreter (the five sorts gone; on a GPU each was several CUB launches).",
        "* **No launch clears a buffer** (2026-12-05): the fixed point's two kernels clear the "
        "tree's first buffers on their way (the documents' nodes, the levels' counters, the root "
        "histogram), each level's kernel the next level's histogram; the thresholds' uint8 copy is "
        "kept while the grower's tensor is the same; the flat lambda kernel reads the booster's "
        "float64 scores as float32 and writes its float32 results as float64 (no casts), and the "
        "eval set's mean is one program's fixed-order sum. The default round: **30 launches and 1 "
        "sync** under the interpreter, the issue's counted target (≤ 30, ≤ 1). A review found a NaN hessian reaching the leaves as huge finite "
        "steps (a maximum that dropped NaN) and trees deeper than 8 levels leaving the fixed-point "
        "sums' bits; both mended, with tests, and the compile test now checks in the PTX that the "
        "last-program kernels put a barrier after their stores and reads past L1 after their "
        "acquire-release add.",
        "* **No allocation after the first round** (2026-12-05): every buffer of the Triton round "
        "(the lambdas, the fixed point, the levels' scratch and histograms, the leaves, each eval "
        "set's metric) comes from one `rankkit.kernels.workspace.Workspace` per fit and is the same tensor every round (a "
        "row sample, whose document count changes every round, gets views of memory that only grows); the "
        "round's tree and metrics are packed for the host copy by one kernel into the fit's "
        "buffer (`triton.pack`, was two casts and a `cat`). `BoostingEngine.update` returns the "
        "host copy of the tree (its leaf index stays on the device until the next round). The "
        "interpreted tests start every buffer as NaN or −1 (`RANKKIT_POISON_WORKSPACE=1`), so a "
        "read before a write shows (a sabotage, the quantized round's node index not zeroed, fails "
        "three tests). The count now takes every op's new memory as an allocation (it counted "
        "factory calls only, and missed the casts and the concatenation).",
        "* **The round as a CUDA graph** (2026-12-05, `rankkit/kernels/graph.py`): a static round "
        "(one process, nothing drawn on the host: no row or feature sample, bootstrap, split noise "
        "or `quantized_grad`, no debiasing or exact Newton, a built-in objective that draws "
        "nothing) runs its first round eagerly, then is captured once (`torch.cuda.graph` on a "
        "side stream) and replayed every round after; the round's Python runs only at the "
        "capture (`Backend.run_round`, the seam's fourteenth method, the graph kept per engine; "
        "a capture that fails warns once and runs eagerly; an eval set added later is a new "
        "shape, captured again). **Opt-in**, `RANKKIT_CUDA_GRAPH=1`, until a GPU run has "
        "measured it faster and equal. Proven under the "
        "interpreter by a stand-in capture that records the round's Triton launches without "
        "running them (refusing any torch op, as a capture refuses a sync) and replays exactly "
        "those: five rounds grow the eager run's trees, scores and eval history bit for bit "
        "(tests/kernels/test_graph.py; replaying all but the first launch fails it). **Not run on "
        "a GPU**: the CUDA test there is guarded to a CUDA device, and experiments/bench_gpu.py "
        "now times the default round with and without it.",
        "* The quantized round's lambda pass rounds its float64 results to float32 values in the "
        "kernel (`flat_lambdas_triton(round32=True)`, bit for bit `.float().double()` of them; "
        "was four casts, each a launch and an allocation), and its stochastic rounding's kernels "
        "clear the tree's first buffers on their way (the nodes, the counters, the root's int32 "
        "cells and packed sums, in the previous quantized tree's shape; were four launches): the "
        "quantized round 32 launches, 1 sync, no allocation (2026-12-05).",
        "* Not done: the split search parallel over (feature, node) (a level's kernel has one "
        "program per feature: about 63 node iterations over six levels, modelled at 1–2 µs each, "
        "roughly 0.1 ms of a round; splitting the nodes would change the gains' summation order "
        "and the parity with the reference, splitting the codes would not); the quantized round's "
        f"`torch.rand`, which keeps it out of the graph: the rounds are {still} under the "
        "interpreter (the table above).",
        "* The padded lambda kernels still serve the neural loss and the booster's k > 32 or no k "
        "(that rank kernel counts in O(n²)); the public `lambda_gradients` validates and plans on "
        "every call, in one host sync since 2026-12-06 (its checks ride in the plan's copy to the "
        "host; the kernel's block bounds go to the device from pinned memory without a wait).",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="write docs/gpu.md")
    args = ap.parse_args(argv)
    import tempfile

    from rankkit.infra.io import atomic_write

    sim = simulated_counts()
    with tempfile.TemporaryDirectory() as tmp:
        launches = triton_launches(tmp)
    compiled = compile_report()
    lengths = mslr_lengths()
    lam = lambda_model(lengths)
    flat = flat_lambda_model(lengths)
    # The modelled round launches what the interpreter counted (Triton kernels + torch ops), so that
    # the counted and the modelled figures on the page agree (tests/experiment_scripts/test_bench_gpu.py checks it).
    page = render(sim, launches, compiled, lam, round_model(flat, launches=counted_launches(launches["default"]),
                                                            elided=hot_share()),
                  lengths, lambda_model(lengths, loss=True), flat)
    print(page)
    if args.write:
        def write(tmp):
            with open(tmp, "w") as f:
                f.write(page)
        atomic_write(DOC, write)


if __name__ == "__main__":
    main()
