"""The Triton kernels of rankkit.kernels.triton, checked without a GPU.

1. Under Triton's interpreter (``TRITON_INTERPRET=1`` on CPU tensors, in a subprocess so that
   the variable is set before triton is imported and no other test module is affected): the
   fused lambda kernel (grad, hess and loss) equals :func:`rankkit.lambdas.lambda_gradients`
   in float64 and a float64 per-pair double loop written here (Burges, "From RankNet to
   LambdaRank to LambdaMART: An Overview", MSR-TR-2010-82, 2010), on float64 and float32
   scores and a mask with holes; the level histogram equals the torch reference
   :func:`rankkit.boosting.tree.build_histograms`, with the reference's left-out node, exactly
   for integer cells.
2. Ahead of time for an H100 (sm_90), the first-contact checks: the rank and lambda kernels
   compile for float64 scores (the trainers pass them), the histogram's atomics are relaxed
   reductions with no fence, and (slow) every shipped kernel compiles with no register spills
   and no local memory (the figures are in docs/gpu.md, from ``experiments/gpu_report.py``).

Every test name contains "triton" (``pytest -k triton``).
"""
from __future__ import annotations

import json
import math

import pytest
import torch
from kernels.triton import ROOT, interpreted_json, run_script

triton = pytest.importorskip("triton")


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


# The interpreter runs in one subprocess for the whole module: it writes the kernels' outputs
# (as lists) to a JSON file that the tests below compare with their references.
_INTERPRETED = r"""
import json, os, sys
assert os.environ.get("TRITON_INTERPRET") == "1"
import torch
sys.path.insert(0, os.path.join(sys.argv[1], "tests"))
from kernels.triton.test_triton import LAMBDA_CASES, _batch
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

_AOT = r"""
import json, sys
from rankkit.kernels.triton.aot import compile_kernel
json.dump([compile_kernel(name) for name in sys.argv[2:]], open(sys.argv[1], "w"))
"""

# Every integer argument of the named kernels compiled as the constant 1, one at a time (Triton
# specialises an int argument equal to 1: one feature, one document, the root's single node).
_ONES = r"""
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


def _compile(tmp_path_factory, names):
    path = tmp_path_factory.mktemp("triton") / "aot.json"
    run_script(_AOT, str(path), *names, interpret=False)
    return {k["name"]: k for k in json.loads(path.read_text())}


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    return interpreted_json(tmp_path_factory, _INTERPRETED, ROOT)


@pytest.fixture(scope="module")
def first_contact(tmp_path_factory):
    return _compile(tmp_path_factory, FIRST_CONTACT)


@pytest.mark.parametrize("name", list(LAMBDA_CASES))
def test_triton_lambda_kernel_interpreted_equals_float64_references(interpreted, name):
    from rankkit.lambdas import lambda_gradients

    scores, labels, mask, weights = _batch()
    case = dict(LAMBDA_CASES[name])
    if case.pop("weights", False):
        case["weights"] = weights
    loop = _double_loop(scores, labels, mask, **case)
    kernel = lambda_gradients(scores, labels, mask=mask, return_loss=True, **case)
    got64 = [torch.tensor(t, dtype=torch.float64) for t in interpreted[f"lambda/{name}/{torch.float64}"]]
    got32 = [torch.tensor(t, dtype=torch.float64) for t in interpreted[f"lambda/{name}/{torch.float32}"]]
    assert float(loop[2][:2].min()) > 0  # the two queries with pairs have a loss
    for got, ref_loop, ref_kernel in zip(got64, loop, kernel):
        torch.testing.assert_close(got, ref_loop, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(got, ref_kernel, rtol=1e-12, atol=1e-12)
    for got in got64[:2]:
        assert torch.all(got[~mask] == 0)
    for got, ref_loop in zip(got32, loop):  # float32 arithmetic, same ranking
        torch.testing.assert_close(got, ref_loop, rtol=1e-4, atol=1e-5)


def test_triton_lambda_kernel_interpreted_sums_to_zero_per_query(interpreted):
    grad = torch.tensor(interpreted[f"lambda/ndcg_k5/{torch.float64}"][0], dtype=torch.float64)
    torch.testing.assert_close(grad.sum(1), torch.zeros(3, dtype=torch.float64), atol=1e-12, rtol=0)


def test_triton_histogram_interpreted_equals_torch_reference_with_left_out_node(interpreted):
    # The torch path leaves the larger children out as node K; the kernel must skip them (before
    # the fix it wrote them into the next feature's node 0, out of bounds for the last feature).
    from rankkit.boosting.tree import build_histograms

    data = interpreted["histogram"]
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


def test_triton_histogram_gathered_through_the_partition_equals_the_reference(interpreted):
    # A level's smaller children read through smaller_first's partition: the same integer cells
    # as the reference's sweep over every document with the left-out node K masked.
    from rankkit.boosting.tree import build_histograms

    data = interpreted["histogram"]
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


def test_triton_packed_sums_unpack_exactly_at_the_int32_bounds(interpreted):
    # int32 cells take g and h as one 64-bit add h * 2^32 + g; any |G|, |H| < 2^31 unpacks exactly.
    top = 2 ** 31 - 1
    assert interpreted["finish_unpacked"] == [[-top, top, 0, -1, 5, -7], [top, -top, top, 0, 0, 3], [1] * 6]


def test_triton_hot_cells_are_filled_from_the_node_totals(interpreted):
    # total − the row's other cells, per channel and node (totals [3, K] = [[10, 20], [60, 70], [3, 5]]).
    assert interpreted["finish_filled"] == [[10 - 4, 20 - 5], [60 - 6, 70 - 7], [3 - 1, 5 - 2]]


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


@pytest.mark.parametrize("name", ["rank_fp64", "topk_fp64", "lambda_ndcg_loss_fp64"])
def test_triton_float64_scores_compile_for_sm90(first_contact, name):
    # quantized_grad and the booster pass float64 scores; before the fix _rank_kernel did not
    # compile ("loop-carried variable idcg has initial type fp32 but is re-assigned to fp64").
    info = first_contact[name]
    print(info)
    assert info["registers"] <= 255 and info["spill_stores"] == 0 and info["stack_bytes"] == 0


@pytest.mark.parametrize("name", ["histogram_i32", "histogram_fp64", "histogram_i64_fixed"])
def test_triton_histogram_atomics_are_relaxed_reductions(first_contact, name):
    # The default semantics (acq_rel) orders every add with a GPU-wide fence; the histogram is
    # read only after the kernel, so relaxed adds (plain reductions, "red") suffice.
    info = first_contact[name]
    assert info["atomics"] and all(a.startswith("red.") and ".relaxed." in a for a in info["atomics"])
    assert info["fences"] == 0


def _compile_ones(tmp_path_factory, names):
    path = tmp_path_factory.mktemp("triton") / "ones.json"
    run_script(_ONES, str(path), *names, interpret=False)
    return json.loads(path.read_text())


def test_triton_histogram_compiles_with_one_feature_or_one_document(tmp_path_factory):
    # Before the fix `n_feat.to(tl.int64)` / `N.to(...)` failed to compile when the launcher
    # made the argument the constant 1 ("'int' object has no attribute 'to'").
    done = _compile_ones(tmp_path_factory, ["histogram_i32"])
    assert {arg for _, arg, _ in done} == {"N", "n_rows", "n_feat", "n_nodes"}
    assert all(regs for _, _, regs in done)


@pytest.mark.slow
def test_triton_every_kernel_compiles_with_each_int_argument_equal_to_one(tmp_path_factory):
    from rankkit.kernels.triton.aot import KERNELS

    names = [n for n in KERNELS if not n.endswith("_fp64") or n.startswith(("topk", "rank"))]
    done = _compile_ones(tmp_path_factory, names)
    assert {name for name, _, _ in done} == set(names)


@pytest.mark.slow
def test_triton_every_kernel_compiles_for_sm90_without_spills(tmp_path_factory):
    from rankkit.kernels.triton.aot import KERNELS

    compiled = _compile(tmp_path_factory, list(KERNELS))
    for name, info in compiled.items():
        print(info)
        assert info["registers"] and info["registers"] <= 255, name
        assert info["spill_stores"] == 0 and info["spill_loads"] == 0, name
        assert info["local_bytes"] == 0 and info["stack_bytes"] == 0, name
        assert info["shared_bytes"] <= 48 * 1024, name
    assert {n.rsplit("_", 1)[-1] for n in compiled if n.startswith(("rank", "lambda"))} == {"fp32", "fp64"}


def test_triton_is_the_default_route_of_lambda_gradients_where_it_applies(interpreted):
    # With Triton present the kernel is the default (on CUDA; forced here on CPU under the
    # interpreter) for RankNet/NDCG without the options it lacks; normalize and MAP fall back to
    # the torch path, which is also the reference the routed result equals.
    from rankkit.lambdas import lambda_gradients

    scores, labels, mask, _ = _batch()
    routed = interpreted["dispatch"]
    assert routed["calls"] == 1 and routed["after_fallbacks"] == 1
    grad, hess = lambda_gradients(scores.double(), labels, mask=mask, weighting="ndcg", k=5)
    torch.testing.assert_close(torch.tensor(routed["grad"], dtype=torch.float64), grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.tensor(routed["hess"], dtype=torch.float64), hess, rtol=1e-12, atol=1e-12)
