"""The eval set's fused tree update and NDCG@k in Triton (rankkit.kernels.triton.eval_ndcg), under
Triton's interpreter (a subprocess: ``TRITON_INTERPRET=1`` before triton is imported), against
the compiled CPU pass (``rankkit.kernels.cpu.ndcg_mean`` with the same tree: update and metric in
one C call) and the torch metric (``rankkit.metrics.planned_ndcg``) on long-tailed queries with
tied scores, queries with nothing relevant (empty = 1 and 0) and cutoffs 1, 5, 10 and 32.
"""
from __future__ import annotations


import pytest
import torch
from kernels.triton import interpreted_json

pytest.importorskip("triton")


_INTERPRETED = r"""
import json, os, sys
assert os.environ.get("TRITON_INTERPRET") == "1"
import torch
from rankkit.boosting.objectives import QueryLayout, flat_ndcg_inputs
from rankkit.kernels import cpu
from rankkit.kernels.triton.eval_ndcg import eval_ndcg_triton
from rankkit.kernels.triton.flat_lambdas import length_buckets
from rankkit.metrics import planned_ndcg
g = torch.Generator().manual_seed(0)
sizes = torch.tensor([1, 4, 17, 3, 70, 2, 140, 9, 33])
n = int(sizes.sum())
labels = torch.randint(0, 4, (n,), generator=g).float()
labels[1:5] = 0  # a query with nothing relevant
scores = torch.randn(n, generator=g, dtype=torch.float64)
scores[30:60] = 0.5  # ties
codes = torch.randint(0, 8, (n, 5), generator=g, dtype=torch.uint8)
features, cuts = torch.tensor([3, 0, 4]), torch.tensor([2, 5, 255])
values = torch.randn(8, generator=g, dtype=torch.float64)
layout = QueryLayout(labels, sizes)
out = []
for k in (1, 5, 10, 32):
    for empty in (1.0, 0.0):
        inputs = flat_ndcg_inputs(layout, k, "exp")
        got_scores = scores.clone()
        got = eval_ndcg_triton(got_scores, codes.t().contiguous(), features, cuts, values, labels=inputs["labels"],
                               gains=inputs["gains"], offsets=inputs["offsets"],
                               buckets=length_buckets(inputs["offsets"], "cpu"), cutoff=inputs["cutoff"], empty=empty)
        ref_scores = scores.clone()
        ref = cpu.ndcg_mean(ref_scores, inputs["labels"], inputs["gains"], inputs["offsets"], cutoff=inputs["cutoff"],
                            max_len=inputs["max_len"], empty=empty, tree=(values, codes, features, cuts))
        torch_metric = planned_ndcg(layout.pad(ref_scores.float()), layout.plan, k=k, empty=empty).double().mean()
        out.append({"k": k, "empty": empty, "got": float(got), "cpu": float(ref), "torch": float(torch_metric),
                    "same_scores": bool(torch.equal(got_scores, ref_scores)),
                    "moved": bool(not torch.equal(got_scores, scores))})
with open(sys.argv[1], "w") as f:
    json.dump(out, f)
"""


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    return interpreted_json(tmp_path_factory, _INTERPRETED)


def test_triton_eval_ndcg_equals_the_compiled_and_the_torch_metric(interpreted):
    assert len(interpreted) == 8
    for row in interpreted:
        assert row["same_scores"] and row["moved"], row  # the tree was added, as the C pass adds it
        assert abs(row["got"] - row["cpu"]) < 1e-12, row
        assert abs(row["got"] - row["torch"]) < 1e-6, row  # the torch metric sums in float32
    by = {(r["k"], r["empty"]): r["got"] for r in interpreted}
    assert by[(10, 1.0)] > by[(10, 0.0)]  # the empty query counts as asked
    assert len({by[(k, 1.0)] for k in (1, 5, 10, 32)}) == 4  # the cutoff matters on this fixture


def test_triton_eval_ndcg_refuses_what_it_cannot_compute():
    from rankkit.kernels.triton.eval_ndcg import eval_ndcg_triton

    x = torch.zeros(3, dtype=torch.float64)
    codes, tree = torch.zeros(1, 3, dtype=torch.uint8), torch.zeros(1, dtype=torch.long)
    offsets = torch.tensor([0, 3])
    with pytest.raises(ValueError, match="`cutoff`"):
        eval_ndcg_triton(x, codes, tree, tree, x[:2], labels=x, gains=x, offsets=offsets, buckets=[], cutoff=0)
    with pytest.raises(ValueError, match="`scores`"):
        eval_ndcg_triton(x.float(), codes, tree, tree, x[:2], labels=x, gains=x, offsets=offsets, buckets=[],
                         cutoff=3)
    with pytest.raises(ValueError, match="`gains`"):
        eval_ndcg_triton(x, codes, tree, tree, x[:2], labels=x, gains=x[:2], offsets=offsets, buckets=[], cutoff=3)
    with pytest.raises(ValueError, match="`codes_t`"):
        eval_ndcg_triton(x, codes.t(), tree, tree, x[:2], labels=x, gains=x, offsets=offsets, buckets=[], cutoff=3)
