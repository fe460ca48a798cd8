"""The flat Triton lambda pass (rankkit.kernels.triton.flat_lambdas) under Triton's interpreter
(a subprocess: ``TRITON_INTERPRET=1`` must be set before triton is imported), against a float64
double loop over the pairs written here (Burges, "From RankNet to LambdaRank to LambdaMART: An
Overview", 2010; LightGBM's per-query normalisation) and the compiled CPU pass; and the Triton
backend's choice of it in a boosting round.

The queries are long-tailed (1 to 140 documents: several length buckets, several column tiles,
queries shorter than k), with tied scores and tied labels; every k from 1 to 32 that the kernel
takes is represented, RankNet and NDCG, normalised or not, weighted or not, float64 and float32.
"""
from __future__ import annotations

import math

import pytest
import torch
from kernels.triton import ROOT, interpreted_json

pytest.importorskip("triton")

SIZES = [1, 2, 3, 17, 40, 5, 140, 9, 1, 33, 129, 16]
# (k, weighting, normalize, weighted): every option at k = 10 (the shipped config's), the rest
# at the cutoffs' edges (1: one row; 32: the widest K_PAD; 3: queries shorter than k).
CASES = ([(10, w, n, x) for w in ("ranknet", "ndcg") for n in (False, True) for x in (False, True)]
         + [(k, w, False, False) for k in (1, 32) for w in ("ranknet", "ndcg")] + [(3, "ndcg", True, True)])
SINGLE = {(10, "ndcg", True, True), (10, "ranknet", False, False)}  # also run in float32
SIGMA = 1.5


def _data():
    g = torch.Generator().manual_seed(0)
    n = sum(SIZES)
    labels = torch.randint(0, 5, (n,), generator=g).double()
    scores = torch.randn(n, generator=g, dtype=torch.float64)
    scores[5:12] = 0.25  # tied scores, some with tied labels
    scores[200:260] = torch.randint(0, 3, (60,), generator=g).double()
    weights = torch.rand(n, generator=g, dtype=torch.float64) + 0.5
    return scores, labels, weights


def double_loop(scores, labels, weights, k, weighting, normalize):
    """(grad, hess) [N] float64 by the definition, one query and one pair at a time."""
    grad, hess = [0.0] * len(scores), [0.0] * len(scores)
    start = 0
    for n in SIZES:
        docs = list(range(start, start + n))
        start += n
        ranked = sorted(docs, key=lambda i: (-float(scores[i]), float(labels[i]), i))
        cut = min(k, n)
        ideal = sorted((float(labels[i]) for i in docs), reverse=True)
        idcg = sum((2.0 ** y - 1.0) / math.log2(2 + r) for r, y in enumerate(ideal[:cut]))
        gain = {i: ((2.0 ** float(labels[i]) - 1.0) / idcg if idcg > 0 else 0.0) for i in docs}
        disc = [1.0 / math.log2(2 + r) if r < cut else 0.0 for r in range(n)]
        terms, total = [], 0.0
        for a in range(cut):
            for b in range(a + 1, n):
                i, j = ranked[a], ranked[b]
                if labels[i] == labels[j]:
                    continue
                hi, lo = (i, j) if labels[i] > labels[j] else (j, i)
                dz = 1.0 if weighting == "ranknet" else abs(gain[i] - gain[j]) * abs(disc[a] - disc[b])
                rho = 1.0 / (1.0 + math.exp(SIGMA * (float(scores[hi]) - float(scores[lo]))))
                total += dz * rho
                omega = 0.5 * (float(weights[i]) + float(weights[j])) if weights is not None else 1.0
                terms.append((hi, lo, omega * dz * rho, omega * dz * rho * (1.0 - rho)))
        factor = 1.0
        if normalize and total > 0:
            s = 2.0 * SIGMA * total
            factor = math.log2(1.0 + s) / s
        for hi, lo, lam, h in terms:
            grad[hi] -= SIGMA * lam * factor
            grad[lo] += SIGMA * lam * factor
            hess[hi] += SIGMA ** 2 * h * factor
            hess[lo] += SIGMA ** 2 * h * factor
    return torch.tensor(grad, dtype=torch.float64), torch.tensor(hess, dtype=torch.float64)


_INTERPRETED = r"""
import json, os, sys
assert os.environ.get("TRITON_INTERPRET") == "1"
sys.path.insert(0, os.path.join(sys.argv[1], "tests"))
import torch
from kernels.triton.test_flat_lambdas import CASES, SIGMA, SINGLE, SIZES, _data
from rankkit.boosting.objectives import QueryLayout, flat_ndcg_inputs
from rankkit.kernels import cpu
from rankkit.kernels.triton.flat_lambdas import flat_lambdas_triton, length_buckets
scores, labels, weights = _data()
layout = QueryLayout(labels.float(), torch.tensor(SIZES))
out = {"cases": {}}
for k, weighting, normalize, weighted in CASES:
    inputs = flat_ndcg_inputs(layout, k, "exp")
    buckets = length_buckets(inputs["offsets"], "cpu")
    w = weights if weighted else None
    row = {}
    for dtype in (torch.float64, torch.float32) if (k, weighting, normalize, weighted) in SINGLE else (torch.float64,):
        gains = inputs["gains"].to(dtype) if weighting == "ndcg" else None
        got = flat_lambdas_triton(scores.to(dtype), inputs["labels"].to(dtype), inputs["offsets"], buckets,
                                  gains=gains, cutoff=inputs["cutoff"], sigma=SIGMA, normalize=normalize,
                                  weights=None if w is None else w.to(dtype))
        row[str(dtype)] = [t.double().tolist() for t in got]
        if dtype == torch.float64:  # quantized_grad's pass: the float64 results as float32 values, in the kernel
            rounded = flat_lambdas_triton(scores.to(dtype), inputs["labels"].to(dtype), inputs["offsets"], buckets,
                                          gains=gains, cutoff=inputs["cutoff"], sigma=SIGMA, normalize=normalize,
                                          weights=None if w is None else w.to(dtype), round32=True)
            row["round32"] = [[t.tolist() for t in rounded], [t.float().double().tolist() for t in got]]
        if dtype == torch.float32:  # float64 scores over float32 labels, float64 out: no cast launched
            mixed = flat_lambdas_triton(scores.double(), inputs["labels"].to(dtype), inputs["offsets"], buckets,
                                        gains=gains, cutoff=inputs["cutoff"], sigma=SIGMA, normalize=normalize,
                                        weights=None if w is None else w.to(dtype), out_dtype=torch.float64)
            row["mixed"] = [[t.dtype == torch.float64 for t in mixed], [t.tolist() for t in mixed]]
            # Scores equal in float32 but not in float64 rank as float32 ties (labels, then order).
            tied = scores.double().clone()
            tied[1::2] = tied[0::2][:len(tied[1::2])] + 1e-12
            both = [flat_lambdas_triton(s, inputs["labels"].to(dtype), inputs["offsets"], buckets, gains=gains,
                                        cutoff=inputs["cutoff"], sigma=SIGMA, normalize=normalize,
                                        weights=None if w is None else w.to(dtype), out_dtype=torch.float64)
                    for s in (tied, tied.float())]
            row["tied"] = [[t.tolist() for t in pair] for pair in both]
    ref = cpu.lambdas(scores, inputs["labels"], inputs["offsets"],
                      gains=inputs["gains"] if weighting == "ndcg" else None, cutoff=inputs["cutoff"],
                      max_len=inputs["max_len"], sigma=SIGMA, normalize=normalize,
                      half_weights=None if w is None else (0.5 * w).contiguous(), float32_scores=False,
                      float32_out=False)
    row["cpu"] = [t.tolist() for t in ref]
    out["cases"][repr((k, weighting, normalize, weighted))] = row
out["buckets"] = [(b, q.tolist()) for b, q in length_buckets(layout.offsets, "cpu")]

# The backend's choice, counted by kernel: the flat kernel for k <= 32, the padded ones beyond.
import triton.runtime.interpreter as interp
calls = {}
run = interp.InterpretedFunction.run
def counted(self, *a, **k):
    calls[self.fn.__name__] = calls.get(self.fn.__name__, 0) + 1
    return run(self, *a, **k)
interp.InterpretedFunction.run = counted
os.environ["RANKKIT_TRITON"] = "force"
os.environ["RANKKIT_CPU_KERNEL"] = "0"
from rankkit.boosting.objectives import make_objective
from rankkit.objective import objective_spec
from rankkit.kernels.backends import TorchBackend, choose
backend = choose("cpu")
routes = {}
for name, k, normalize in (("ndcg_k10_normalize", 10, True), ("ndcg_no_k", None, False),
                           ("ranknet_k5", 5, False)):
    weighting = "ranknet" if name.startswith("ranknet") else "ndcg"
    objective = make_objective(objective_spec("lambdarank", weighting=weighting, k=k, sigma=SIGMA, gain="exp",
                                              normalize=normalize), seed=0, quantized_grad=True)
    calls.clear()
    got = objective.gradients(scores, layout, backend=backend)
    ref = objective.gradients(scores, layout, backend=TorchBackend("cpu"))
    routes[name] = {"calls": dict(calls), "got": [t.tolist() for t in got], "ref": [t.tolist() for t in ref]}
out["backend"] = backend.name
out["routes"] = routes
with open(sys.argv[2], "w") as f:
    json.dump(out, f)
"""


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    return interpreted_json(tmp_path_factory, _INTERPRETED, ROOT)


@pytest.mark.parametrize("case", CASES, ids=[f"k{k}-{w}-norm{n}-w{x}" for k, w, n, x in CASES])
def test_triton_flat_lambdas_equal_the_float64_double_loop(interpreted, case):
    k, weighting, normalize, weighted = case
    row = interpreted["cases"][repr(case)]
    scores, labels, weights = _data()
    want = double_loop(scores, labels, weights if weighted else None, k, weighting, normalize)
    got = [torch.tensor(t, dtype=torch.float64) for t in row["torch.float64"]]
    cpu = [torch.tensor(t, dtype=torch.float64) for t in row["cpu"]]
    for g, c, w in zip(got, cpu, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(g, c, rtol=1e-12, atol=1e-13)  # the compiled CPU pass too
        assert float(w.abs().sum()) > 0  # the case has pairs
    assert abs(float(got[0].sum())) < 1e-9  # λ sums to zero over each query's pairs
    assert row["round32"][0] == row["round32"][1]  # round32: .float().double() of the float64 run, bit for bit
    assert row["round32"][0] != row["torch.float64"]
    if case in SINGLE:
        single = [torch.tensor(t, dtype=torch.float64) for t in row["torch.float32"]]
        for s, w in zip(single, want):
            torch.testing.assert_close(s, w, rtol=2e-4, atol=2e-6)
        # Read from float64 scores and written to float64: the float32 run's values, bit for bit.
        assert row["mixed"][0] == [True, True] and row["mixed"][1] == row["torch.float32"]
        assert row["tied"][0] == row["tied"][1]  # rounded as read: float32 ties, as the float32 run


def test_triton_flat_lambdas_buckets_hold_every_query_once(interpreted):
    buckets = interpreted["buckets"]
    assert [b for b, _ in buckets] == [16, 32, 64, 256]
    ids = sorted(q for _, qs in buckets for q in qs)
    assert ids == list(range(len(SIZES)))
    for block, queries in buckets:
        assert all(block // 2 < max(SIZES[q], 16) <= block or block == 16 for q in queries)


def test_triton_backend_takes_the_flat_kernel_where_it_applies(interpreted):
    assert interpreted["backend"] == "triton"
    routes = interpreted["routes"]
    for name in ("ndcg_k10_normalize", "ranknet_k5"):  # normalize included (the shipped config's)
        calls = routes[name]["calls"]
        buckets = len(interpreted["buckets"])  # one launch per length bucket
        assert calls.get("_flat_lambda_kernel", 0) == buckets and "_lambda_kernel" not in calls, (name, calls)
    # No cutoff on queries of up to 140 documents: every rank is needed, the padded kernels run.
    calls = routes["ndcg_no_k"]["calls"]
    assert "_flat_lambda_kernel" not in calls and calls.get("_lambda_kernel", 0) == 1, calls
    for route in routes.values():
        # quantized_grad: float64 lambdas rounded to float32 values, as the torch path's.
        for got, ref in zip(route["got"], route["ref"]):
            torch.testing.assert_close(torch.tensor(got, dtype=torch.float64), torch.tensor(ref, dtype=torch.float64),
                                       rtol=1e-6, atol=1e-9)


def test_triton_flat_lambdas_refuse_what_they_cannot_compute():
    from rankkit.kernels.triton.flat_lambdas import MAX_BLOCK, flat_lambdas_triton, length_buckets

    with pytest.raises(ValueError, match="at most"):
        length_buckets(torch.tensor([0, MAX_BLOCK + 1]), "cpu")
    x, offsets = torch.zeros(3), torch.tensor([0, 3])
    with pytest.raises(ValueError, match="`cutoff`"):
        flat_lambdas_triton(x, x, offsets, [], gains=None, cutoff=33)
    # Every argument checked at the boundary, by name (no host sync: shapes and dtypes only).
    bad = [("scores", dict(scores=x[None])), ("labels", dict(labels=torch.zeros(4))),
           ("labels", dict(labels=torch.zeros(3, dtype=torch.float64))), ("gains", dict(gains=torch.zeros(2))),
           ("weights", dict(weights=torch.zeros(3, dtype=torch.int64))),
           ("offsets", dict(offsets=torch.tensor([0, 3], dtype=torch.int32))), ("offsets", dict(offsets=x))]
    for name, change in bad:
        args = dict(scores=x, labels=x, offsets=offsets, buckets=[], gains=None, cutoff=3, **{"weights": None})
        args.update(change)
        with pytest.raises(ValueError, match=f"`{name}`"):
            flat_lambdas_triton(args.pop("scores"), args.pop("labels"), args.pop("offsets"), args.pop("buckets"),
                                **args)
