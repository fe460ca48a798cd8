"""Shared by the Triton tests: run a script in a fresh interpreter (``TRITON_INTERPRET`` must be
set before triton is imported, so each interpreted check is a subprocess); the cases, the batch,
the float64 double loop and the scripts that test_lambdas.py, test_histogram.py and test_aot.py
share (one interpreted run per session: conftest.py)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def run_script(code: str, *args: str, interpret: bool) -> None:
    """Run ``code`` with ``args`` from the repository root (rankkit importable), under Triton's
    interpreter when ``interpret``; RANKKIT_TRITON is left for the script to set."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "RANKKIT_TRITON")}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
        # Every kernel buffer starts as a value no kernel writes: a read before a write shows.
        env["RANKKIT_POISON_WORKSPACE"] = os.environ.get("POISON", "1")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def interpreted_json(tmp_path_factory, code: str, *args: str) -> dict:
    """What ``code`` (interpreted) wrote as JSON to the path it gets as its last argument."""
    path = tmp_path_factory.mktemp("interpreted") / "out.json"
    run_script(code, *args, str(path), interpret=True)
    return json.loads(path.read_text())


LAMBDA_CASES = {
    "ranknet": dict(weighting="ranknet"),
    "ranknet_k5_sigma2": dict(weighting="ranknet", k=5, sigma=2.0),
    "ranknet_weights": dict(weighting="ranknet", weights=True),
    "ndcg": dict(weighting="ndcg"),
    "ndcg_k5": dict(weighting="ndcg", k=5),
    "ndcg_k1": dict(weighting="ndcg", k=1),
    "ndcg_k33": dict(weighting="ndcg", k=33),  # above TOPK_MAX: every rank, by counting
    "ndcg_linear_k3_weights": dict(weighting="ndcg", gain="linear", k=3, weights=True),
}


def _batch(dtype=torch.float64):
    """3 queries of up to 37 documents (35 with two holes, 20, 1), ties in score, labels 0..4."""
    g = torch.Generator().manual_seed(0)
    n_queries, n_docs = 3, 37
    scores = torch.randn(n_queries, n_docs, generator=g, dtype=dtype)
    scores[:, :4] = scores[:, 4:8]
    labels = torch.randint(0, 5, (n_queries, n_docs), generator=g).to(dtype)
    mask = torch.arange(n_docs)[None, :] < torch.tensor([[37], [20], [1]])
    mask[0, [3, 11]] = False  # holes: real documents need not come first
    weights = torch.rand(n_queries, n_docs, generator=g, dtype=dtype) + 0.5
    return scores, labels, mask, weights


def _double_loop(scores, labels, mask, *, weighting, sigma=1.0, k=None, gain="exp",
                 weights=None):
    """float64 grad, hess and loss from a plain loop over the pairs of each query."""
    grad = torch.zeros(scores.shape, dtype=torch.float64)
    hess = torch.zeros(scores.shape, dtype=torch.float64)
    loss = torch.zeros(scores.shape[0], dtype=torch.float64)
    for q in range(scores.shape[0]):
        docs = [i for i in range(scores.shape[1]) if mask[q, i]]
        s = {i: float(scores[q, i]) for i in docs}
        y = {i: float(labels[q, i]) for i in docs}
        # Rank: descending score, ties lower label first, then index order.
        ranked = sorted(docs, key=lambda i: (-s[i], y[i], i))
        rank = {i: r for r, i in enumerate(ranked)}
        cut = len(docs) if k is None else k
        g = (lambda v: 2.0 ** v - 1.0) if gain == "exp" else (lambda v: v)
        ideal = sorted((y[i] for i in docs), reverse=True)
        idcg = sum(g(v) / math.log2(p + 2) for p, v in enumerate(ideal[:cut]))
        disc = lambda r, cut=cut: 1.0 / math.log2(r + 2) if r < cut else 0.0
        for i in docs:
            for j in docs:
                if y[i] <= y[j] or min(rank[i], rank[j]) >= cut:
                    continue
                if weighting == "ranknet":
                    dz = 1.0
                else:
                    dz = abs(g(y[i]) - g(y[j])) * abs(disc(rank[i]) - disc(rank[j]))
                    dz = dz / idcg if idcg > 0 else 0.0
                if weights is not None:
                    dz *= 0.5 * (float(weights[q, i]) + float(weights[q, j]))
                rho = 1.0 / (1.0 + math.exp(sigma * (s[i] - s[j])))
                lam = -sigma * dz * rho
                grad[q, i] += lam
                grad[q, j] -= lam
                w = sigma * sigma * dz * rho * (1.0 - rho)
                hess[q, i] += w
                hess[q, j] += w
                loss[q] += dz * math.log1p(math.exp(-sigma * (s[i] - s[j])))
    return grad, hess, loss


# The interpreter runs in one subprocess for the whole session (conftest.py): it writes the kernels' outputs
# (as lists) to a JSON file that the tests below compare with their references.
INTERPRETED = r"""
import json, os, sys
assert os.environ.get("TRITON_INTERPRET") == "1"
import torch
sys.path.insert(0, os.path.join(sys.argv[1], "tests"))
from kernels.triton import LAMBDA_CASES, _batch
from rankkit.kernels.triton.lambdas import lambda_gradients_triton
from rankkit.kernels.triton.histogram import level_histogram_triton, quantize
out = {}
scores, labels, mask, weights = _batch()
for name, case in LAMBDA_CASES.items():
    case = dict(case)
    if case.pop("weights", False):
        case["weights"] = weights
    for dtype in (torch.float64, torch.float32):
        kw = dict(case)
        if "weights" in kw:
            kw["weights"] = kw["weights"].to(dtype)
        grad, hess, loss = lambda_gradients_triton(scores.to(dtype), labels, mask=mask,
                                                   return_loss=True, block_r=8, block_c=16,
                                                   topk_block=16, **kw)
        out[f"lambda/{name}/{dtype}"] = [grad.double().tolist(), hess.double().tolist(),
                                         loss.double().tolist()]
g = torch.Generator().manual_seed(1)
n, n_feat, n_nodes = 300, 3, 4
codes = torch.randint(0, 256, (n_feat, n), generator=g, dtype=torch.uint8)
# Nodes 0..K: K is the torch path's left-out node (only the smaller children are summed).
node = torch.randint(0, n_nodes + 1, (n,), generator=g, dtype=torch.int32)
gq, _ = quantize(torch.randn(n, generator=g, dtype=torch.float64))
hq, _ = quantize(torch.rand(n, generator=g, dtype=torch.float64))
gf = torch.randn(n, generator=g, dtype=torch.float64)
hf = torch.rand(n, generator=g, dtype=torch.float64)
out["histogram"] = {"codes": codes.tolist(), "node": node.tolist(), "g": gq.tolist(),
                    "h": hq.tolist(), "gf": gf.tolist(), "hf": hf.tolist()}
for dtype in (torch.int32, torch.int64):
    hist = level_histogram_triton(codes, node, gq, hq, n_nodes, dtype=dtype, block_n=128)
    out["histogram"][str(dtype)] = hist.tolist()
buffer = torch.full((3, n_feat, n_nodes, 256), 7.0, dtype=torch.float64)
hist = level_histogram_triton(codes, node.long(), gf, hf, n_nodes, out=buffer, block_n=128)
assert hist is buffer
out["histogram"]["float64"] = hist.tolist()
# The finishing kernel: packed (g, h) sums at the int32 bounds unpacked, then a hot cell filled.
from rankkit.kernels.triton.histogram import _finish_kernel
top = 2 ** 31 - 1
pg = torch.tensor([-top, top, 0, -1, 5, -7])
ph = torch.tensor([top, -top, top, 0, 0, 3])
packed = torch.zeros(256, dtype=torch.int64)
packed[:6] = ph * 2 ** 32 + pg
finished = torch.zeros(3, 1, 1, 256, dtype=torch.int32)
finished[2, 0, 0, :6] = 1
_finish_kernel[(1,)](finished, packed, packed, packed, 1, 1, PACK=True, ELIDE=False)
out["finish_unpacked"] = finished[:, 0, 0, :6].tolist()
filled = torch.zeros(3, 1, 2, 256, dtype=torch.int64)
filled[:, 0, :, 3] = torch.tensor([[4, 5], [6, 7], [1, 2]])  # one code's cells, hot code 9 elided
_finish_kernel[(2,)](filled, filled, torch.tensor([9]), torch.tensor([10, 20, 60, 70, 3, 5]), 1, 2,
                     PACK=False, ELIDE=True)
out["finish_filled"] = filled[:, 0, :, 9].tolist()
# Gathered through the partition: the documents of nodes 0..K-1 first, read through `order`.
from rankkit.kernels.triton.histogram import smaller_first
slot = node.to(torch.int16)
order = smaller_first(slot)
kept = int((node < n_nodes).sum())
out["histogram"]["order"] = order.tolist()
for name, rows in (("gathered", kept), ("gathered_short", kept - 1)):
    hist = level_histogram_triton(codes, slot, gq, hq, n_nodes, dtype=torch.int64, block_n=64,
                                  order=order, n_rows=rows)
    out["histogram"][name] = hist.tolist()
# rankkit.lambdas.lambda_gradients routes to the fused kernel (forced here on CPU tensors).
import rankkit.kernels.triton.lambdas as fused
calls = []
kernel = fused.lambda_gradients_triton
fused.lambda_gradients_triton = lambda *a, **k: (calls.append(1), kernel(*a, **k))[1]
os.environ["RANKKIT_TRITON"] = "force"
from rankkit.lambdas import lambda_gradients
grad, hess = lambda_gradients(scores.double(), labels, mask=mask, weighting="ndcg", k=5)
out["dispatch"] = {"calls": len(calls), "grad": grad.tolist(), "hess": hess.tolist()}
lambda_gradients(scores.double(), labels, mask=mask, weighting="ndcg", k=5, normalize=True)
lambda_gradients(scores.double(), labels, mask=mask, weighting="map")
out["dispatch"]["after_fallbacks"] = len(calls)
with open(sys.argv[2], "w") as f:
    json.dump(out, f)
"""

AOT = r"""
import json, sys
from rankkit.kernels.triton.aot import compile_kernel
json.dump([compile_kernel(name) for name in sys.argv[2:]], open(sys.argv[1], "w"))
"""

# Every integer argument of the named kernels compiled as the constant 1, one at a time (Triton
# specialises an int argument equal to 1: one feature, one document, the root's single node).
ONES = r"""
import json, sys
from rankkit.kernels.triton.aot import compile_kernel, int_args
out = []
for name in sys.argv[2:]:
    for arg in int_args(name):
        out.append([name, arg, compile_kernel(name, ones=(arg,))["registers"]])
json.dump(out, open(sys.argv[1], "w"))
"""

# The configurations whose first compile on a GPU failed or misbehaved: float64
# scores in the rank and lambda kernels, the histogram's atomics.
FIRST_CONTACT = ["rank_fp64", "topk_fp64", "lambda_ndcg_loss_fp64", "histogram_i32", "histogram_fp64",
                 "histogram_i64_fixed"]


def compile_named(tmp_path_factory, names):
    path = tmp_path_factory.mktemp("triton") / "aot.json"
    run_script(AOT, str(path), *names, interpret=False)
    return {k["name"]: k for k in json.loads(path.read_text())}


def compile_ones(tmp_path_factory, names):
    path = tmp_path_factory.mktemp("triton") / "ones.json"
    run_script(ONES, str(path), *names, interpret=False)
    return json.loads(path.read_text())
