"""The Triton tree kernels (:mod:`rankkit.kernels.triton.tree`, :mod:`rankkit.kernels.triton.backend`)
against the torch reference, under Triton's interpreter (``TRITON_INTERPRET=1`` on CPU
tensors, in one subprocess per module so that the variable is set before triton is imported).

* The fused levels (:func:`rankkit.kernels.triton.tree.grow_levels_triton`: histograms of the smaller
  children, then one launch a level that finishes their rows, makes the siblings, scans the
  splits and picks the level's, then routing) grow the torch path's levels
  (``ObliviousTreeGrower._levels_torch``): the same leaves, features and codes, for float and
  quantized gradients, int32 and int64 cells, with and without split noise, and a level that
  stops;
* the score update (leaf given, or routed from the codes) equals ``scores + leaf_values[leaf_of]``;
* the fixed-point leaf sums equal the reference's bit for bit (rounding half to even);
* the Triton backend's float histograms are 64-bit fixed point: permuting the documents gives
  the same tree bit for bit (float64 atomics would not, shown on a fixture);
* a boosting run with an eval set on the Triton backend (``RANKKIT_TRITON=force``: the route a
  CUDA device takes, here on CPU tensors under the interpreter) runs the Triton lambdas,
  histograms, split scan, pick, routing and siblings, and grows the torch reference run's
  trees: bit for bit with ``quantized_grad`` (int32 histogram cells), features, codes and
  leaves within float32 rounding of the lambdas otherwise.
"""
from __future__ import annotations


import pytest
import torch
from kernels.triton import interpreted_json

pytest.importorskip("triton")


_INTERPRETED = r"""
import json, os, sys
assert os.environ.get("TRITON_INTERPRET") == "1"
os.environ["RANKKIT_CPU_KERNEL"] = "0"  # the reference is the torch path
import warnings
warnings.simplefilter("ignore")
import torch
from rankkit.kernels.triton import backend
from rankkit.kernels.triton.tree import grow_levels_triton
from rankkit.boosting.tree import ObliviousTreeGrower, TreeParams, quantize_gradients, leaf_of

out = {}
gen = torch.Generator().manual_seed(3)
n, F, depth = 240, 4, 3
codes = torch.randint(0, 12, (n, F), generator=gen, dtype=torch.uint8)
codes[:, 3] = codes[:, 1]  # a duplicated feature: exact ties between features
valid = torch.zeros(F, 256, dtype=torch.bool)
valid[:, 1:12] = True
grad = torch.randn(n, generator=gen, dtype=torch.float64)
hess = torch.rand(n, generator=gen, dtype=torch.float64) + 0.1
cases = {"float": (False, False, 5, None), "float_noise": (False, True, 5, None),
         "quant": (True, False, 5, torch.int64), "quant_int32_noise": (True, True, 5, torch.int32),
         "stops": (False, False, 241, None)}
for name, (quant, noisy, min_data, cells) in cases.items():
    p = TreeParams(depth=depth, min_data_in_leaf=min_data, quantized_grad=quant)
    grower = ObliviousTreeGrower(codes, valid, p, backend="torch")
    g, h, scale = grad, hess, None
    if quant:
        g, h, scale = quantize_gradients(grad, hess, 4, torch.Generator().manual_seed(0))
    noise = (torch.randn(depth, F, 256, generator=gen, dtype=torch.float64) * 20.0) if noisy else None
    ref = grower.backend.grow_levels(grower, g, h, scale, valid, None, None, noise)
    got = grow_levels_triton(grower.codes, g, h, scale, valid, depth=depth, l2=p.l2,
                             min_data_in_leaf=min_data, min_sum_hessian=p.min_sum_hessian,
                             noise=noise, hist_dtype=cells, block_n=64)
    out[name] = {"ref": [t.tolist() for t in ref], "got": [t.tolist() for t in got]}

# Hot-bin elision (integer cells): features 0 and 2 with 85 % of the documents in one code; the
# hot cells filled in from the node totals give the reference's levels exactly.
from rankkit.kernels.triton.histogram import hot_codes
skewed = codes.clone()
skewed[torch.rand(n, generator=gen) < 0.85, 0] = 5
skewed[torch.rand(n, generator=gen) < 0.85, 2] = 1
for name, (noisy, cells) in {"elided_int64": (False, torch.int64), "elided_int32_noise": (True, torch.int32)}.items():
    p = TreeParams(depth=depth, min_data_in_leaf=5, quantized_grad=True)
    grower = ObliviousTreeGrower(skewed, valid, p, backend="torch")
    g, h, scale = quantize_gradients(grad, hess, 4, torch.Generator().manual_seed(0))
    noise = (torch.randn(depth, F, 256, generator=gen, dtype=torch.float64) * 20.0) if noisy else None
    ref = grower.backend.grow_levels(grower, g, h, scale, valid, None, None, noise)
    hot = hot_codes(grower.codes)
    got = grow_levels_triton(grower.codes, g, h, scale, valid, depth=depth, l2=p.l2, min_data_in_leaf=5,
                             min_sum_hessian=p.min_sum_hessian, noise=noise, hist_dtype=cells, block_n=64, hot=hot)
    out[name] = {"ref": [t.tolist() for t in ref], "got": [t.tolist() for t in got], "hot": hot.tolist()}

# The score update, routed from the codes and given the leaf.
codes_t = codes.t().contiguous()
feats, cuts = torch.tensor([2, 0, 1]), torch.tensor([4, 255, 7])
values = torch.randn(8, generator=gen, dtype=torch.float64)
start = torch.randn(n, generator=gen, dtype=torch.float64)
routed = backend.score_update(start.clone(), values, codes_t=codes_t, features=feats, cuts=cuts)
leaf = leaf_of(codes_t, feats, cuts)
given = backend.score_update(start.clone().float(), values, leaf=leaf)
out["update"] = {"routed": routed.tolist(), "given": given.tolist(),
                 "ref": (start + values[leaf]).tolist()}

# Fixed-point leaf sums, with values that land exactly on .5 after scaling (half to even).
import math
from rankkit.kernels.triton.tree import exact_leaf_sums_triton
from rankkit.kernels.torch_ref import exact_leaf_sums
leaf8 = torch.randint(0, 8, (n,), generator=gen)
shift = math.floor(62 - math.log2(n) - math.log2(4.0))
ties = (torch.randint(-50, 50, (n,), generator=gen).double() + 0.5) * 2.0 ** -shift
ties[0] = 4.0
out["leaf_sums"] = {
    "random": [exact_leaf_sums_triton(leaf8, grad.float().double(), hess, 8).tolist(),
               exact_leaf_sums(leaf8, grad.float().double(), hess, 8).tolist()],
    "ties": [exact_leaf_sums_triton(leaf8, ties, hess, 8).tolist(),
             exact_leaf_sums(leaf8, ties, hess, 8).tolist()],
    # 15 programs of 16 documents: the partial sums of several programs, then their sum.
    "programs": [exact_leaf_sums_triton(leaf8, grad, hess, 8, block_n=16).tolist(),
                 exact_leaf_sums(leaf8, grad, hess, 8).tolist()]}

# The quantized round's leaves in three launches (the factors, the partial sums, one program for the
# Newton steps and the guarded update): the reference's, bit for bit; a NaN hessian gives NaN leaves
# and no update.
from rankkit.kernels.torch_ref import newton_leaf_values as _newton
from rankkit.kernels.triton.fixed import FixedPoint
from rankkit.kernels.triton.tree import exact_leaf_values_triton
fixed = FixedPoint(torch.device("cpu"))
p8 = TreeParams(depth=3, min_data_in_leaf=5, learning_rate=0.3, l2=0.7)
hess_nan = hess.clone()
hess_nan[3] = float("nan")
leaf_values = {}
leaf_cases = {"random": (grad.float().double(), hess), "ties": (ties, hess), "nan_hess": (grad, hess_nan)}
for name, (gg, hh) in leaf_cases.items():
    got = exact_leaf_values_triton(leaf8, gg, hh, 8, factors=fixed.factors(gg, hh), learning_rate=p8.learning_rate,
                                   l2=p8.l2, min_sum_hessian=p8.min_sum_hessian)
    leaf_values[name] = {"got": got.tolist(), "ref": _newton(exact_leaf_sums(leaf8, gg, hh, 8), p8).tolist()}
out["leaf_values"] = leaf_values

# Deterministic float histograms: the Triton backend's tree on float gradients is the same bits
# when the documents come in another order (64-bit fixed-point atomics); float64 cells are not
# (a fixture whose sums depend on the order of the additions).
from rankkit.kernels.triton.histogram import level_histogram_triton
from rankkit.kernels.backends import fixed_point
os.environ["RANKKIT_TRITON"] = "force"
perm = torch.randperm(n, generator=gen)
order_back = torch.argsort(perm)
res = []
for order in (torch.arange(n), perm):
    grower = ObliviousTreeGrower(codes[order], valid, TreeParams(depth=depth, min_data_in_leaf=5), backend="triton")
    t = grower.grow(grad[order], hess[order])
    leaf = t.leaf_index if order is not perm else t.leaf_index[order_back]
    res.append([t.features.tolist(), t.codes.tolist(), t.gains.tolist(), t.leaf_values.tolist(), leaf.tolist()])
out["permuted_tree"] = res
big = torch.tensor([1.0, 1e16, -1e16, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64)  # 0 forward, 1 reversed
one_code = torch.zeros(1, 8, dtype=torch.uint8)
node0 = torch.zeros(8, dtype=torch.int64)
ones = torch.ones(8, dtype=torch.float64)
flipped = torch.arange(8).flip(0)
sums = []
for order in (torch.arange(8), flipped):
    float_cells = level_histogram_triton(one_code[:, order], node0, big[order], ones, 1, block_n=1)
    g_q, h_q, sc = fixed_point(big[order], ones)
    fixed_cells = level_histogram_triton(one_code[:, order], node0, g_q, h_q, 1, dtype=torch.int64, block_n=1)
    sums.append([float(float_cells[0, 0, 0, 0]), int(fixed_cells[0, 0, 0, 0])])
out["permuted_sums"] = sums

# The Triton backend's float round takes its leaves' sums from the last level's pick (cut from
# the histogram rows); they must be the fixed-point leaf sums over the documents, bit for bit:
# elided hot codes, a row sample, split noise, a tree that stops, a deeper one.
from rankkit.kernels import torch_ref
from rankkit.kernels.torch_ref import exact_leaf_sums, newton_leaf_values
sample = torch.randperm(n, generator=gen)[:170]
cut = {}
for name, (min_data, rows, depth_, noise_sd) in {"plain": (5, None, 3, 0.0), "rows": (5, sample, 3, 0.0),
                                                 "noise": (5, None, 3, 20.0), "stops": (241, None, 2, 0.0),
                                                 "deep": (2, None, 5, 0.0)}.items():
    p = TreeParams(depth=depth_, min_data_in_leaf=min_data)
    grower = ObliviousTreeGrower(skewed, valid, p, backend="triton")
    t = grower.grow(grad, hess, rows=rows, noise_sd=noise_sd, generator=torch.Generator().manual_seed(1))
    docs = torch.arange(n) if rows is None else rows
    ref = newton_leaf_values(exact_leaf_sums(t.leaf_index[docs], grad[docs], hess[docs], 1 << depth_), p)
    cut[name] = {"got": t.leaf_values.tolist(), "ref": ref.tolist(), "codes": t.codes.tolist(),
                 "backend": grower.backend.name, "hot": grower.state is not None}
out["cut_leaves"] = cut
# The round's update the pick guarded beside the values: the values, or zeros when one is NaN
# (a NaN gradient makes the fixed point's scale NaN), handed to the engine with no launch.
guarded = {}
for name, (channel, bad) in {"finite": (0, None), "nan": (0, float("nan")), "nan_hess": (1, float("nan")),
                             "inf_hess": (1, float("inf"))}.items():
    p = TreeParams(depth=3, min_data_in_leaf=5)
    grower = ObliviousTreeGrower(skewed, valid, p, backend="triton")
    values = [grad.clone(), hess.clone()]
    if bad is not None:
        values[channel][7] = bad
    t = grower.grow(*values)
    update = grower.backend.update_values(t.leaf_values)
    reference = super(type(grower.backend), grower.backend).update_values(t.leaf_values)
    torch_values = ObliviousTreeGrower(skewed, valid, p, backend="torch").grow(*values).leaf_values
    guarded[name] = {"values": t.leaf_values.tolist(), "update": update.tolist(), "reference": reference.tolist(),
                     "torch_nan": torch.isnan(torch_values).tolist(),
                     "made": update.data_ptr() == t.leaf_values.data_ptr() + 8 * t.leaf_values.numel()}
out["guarded"] = guarded
# Deeper than the pick cuts (512 leaves): the backend's levels, then the reference's leaves.
p = TreeParams(depth=9, min_data_in_leaf=1)
grower = ObliviousTreeGrower(skewed, valid, p, backend="triton")
t = grower.grow(grad, hess)
ref = newton_leaf_values(torch_ref.leaf_sums(t.leaf_index, grad, hess, 1 << 9), p)
out["deep9"] = {"got": t.leaf_values.tolist(), "ref": ref.tolist(), "codes": t.codes.tolist()}
os.environ.pop("RANKKIT_TRITON")

# A boosting run on the Triton kernels (the real route: RANKKIT_TRITON=force, the compiled CPU
# kernels off) against the torch reference run (RANKKIT_TRITON=0).
from rankkit.boosting.engine import BoostingEngine, BoosterConfig
from rankkit.data import make_synthetic
import inspect
import triton.runtime.interpreter as interp

calls, grids = {}, {}
run = interp.InterpretedFunction.run
def counted(self, *a, **k):
    calls[self.fn.__name__] = calls.get(self.fn.__name__, 0) + 1
    if self.fn.__name__ == "_histogram_kernel":  # (programs, documents per program, N, rows read)
        grid = k["grid"](k) if callable(k["grid"]) else k["grid"]
        names = list(inspect.signature(self.fn).parameters)
        grids.setdefault("histogram", []).append([grid[0], k["BLOCK_N"], int(a[names.index("N")]),
                                                  int(a[names.index("n_rows")])])
    return run(self, *a, **k)
interp.InterpretedFunction.run = counted

data = make_synthetic(12, (2, 25), 5, seed=1)
valid = make_synthetic(4, (2, 25), 5, seed=2)
backends = {}
for quant in (True, False):
    runs = {}
    for route in ("0", "force"):
        os.environ["RANKKIT_TRITON"] = route
        config = BoosterConfig(depth=3, min_data_in_leaf=3, k=5, quantized_grad=quant,
                               random_strength=0.5, seed=4)
        engine = BoostingEngine(data.features, data.labels, data.sizes, config)
        engine.add_eval_set(valid.features, valid.labels, valid.sizes)
        backends[route] = engine.backend.name == "triton"
        trees = [engine.update() for _ in range(3)]
        runs[route] = [[t.features.tolist(), t.codes.tolist(), t.leaf_values.tolist()] for t in trees]
        runs[route + "/history"] = engine.history
    out[f"fit/{quant}"] = runs
out["backends"] = backends
out["calls"] = calls
out["grids"] = grids
with open(sys.argv[1], "w") as f:
    json.dump(out, f)
"""


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    return interpreted_json(tmp_path_factory, _INTERPRETED)


@pytest.mark.parametrize("name", ["float", "float_noise", "quant", "quant_int32_noise", "stops", "elided_int64",
                                  "elided_int32_noise"])
def test_triton_levels_interpreted_grow_the_torch_paths_levels(interpreted, name):
    ref, got = interpreted[name]["ref"], interpreted[name]["got"]
    assert got[0] == ref[0]  # every document's leaf
    assert got[1] == ref[1] and got[2] == ref[2]  # each level's feature and code
    torch.testing.assert_close(torch.tensor(got[3]), torch.tensor(ref[3]), rtol=1e-12, atol=1e-12)
    if name == "stops":  # min_data_in_leaf above the documents: nothing splits
        assert ref[2] == [255, 255, 255] and ref[3] == [0.0, 0.0, 0.0]
    elif name in ("float", "quant"):  # every level splits (noise may pick an empty child)
        assert 255 not in ref[2] and len(set(ref[0])) == 8


def test_triton_elision_took_the_skewed_codes_as_hot(interpreted):
    assert interpreted["elided_int64"]["hot"][0] == 5 and interpreted["elided_int64"]["hot"][2] == 1


def test_triton_noise_changes_the_choice_in_the_checked_cases(interpreted):
    # The noisy cases must exercise the noisy argmax (else they would test nothing new).
    assert interpreted["float_noise"]["ref"][1:3] != interpreted["float"]["ref"][1:3]


def test_triton_score_update_interpreted_equals_leaf_of(interpreted):
    update = interpreted["update"]
    ref = torch.tensor(update["ref"], dtype=torch.float64)
    assert torch.equal(torch.tensor(update["routed"], dtype=torch.float64), ref)
    torch.testing.assert_close(torch.tensor(update["given"]), ref.float())


def test_triton_exact_leaf_sums_interpreted_equal_the_reference_bit_for_bit(interpreted):
    for name, (got, ref) in interpreted["leaf_sums"].items():
        assert got == ref, name


def test_triton_quantized_leaves_in_three_launches_are_the_reference_bit_for_bit(interpreted):
    cases = interpreted["leaf_values"]
    for name in ("random", "ties"):
        values, update = cases[name]["got"]
        assert values == cases[name]["ref"] == update, name
    values, update = cases["nan_hess"]["got"]
    assert any(v != v for v in values) and any(v != v for v in cases["nan_hess"]["ref"]) and update == [0.0] * 8


def test_triton_float_histograms_are_the_same_bits_in_any_document_order(interpreted):
    # Fixed-point cells: the permuted documents grow the same tree, bit for bit (gains, leaves).
    first, permuted = interpreted["permuted_tree"]
    assert first == permuted
    assert 255 not in first[1]  # the tree split at every level (the check covers real levels)
    # The check can fail: float64 cells give another sum in another order on this fixture,
    # integer cells the same.
    (float_a, fixed_a), (float_b, fixed_b) = interpreted["permuted_sums"]
    assert float_a != float_b and fixed_a == fixed_b


def test_triton_leaves_cut_from_the_last_level_are_the_fixed_point_leaf_sums(interpreted):
    cut = interpreted["cut_leaves"]
    for name, case in cut.items():
        assert case["backend"] == "triton" and case["hot"], name
        assert case["got"] == case["ref"], name  # bit for bit
    assert cut["stops"]["codes"] == [255, 255] and sum(v != 0 for v in cut["stops"]["got"]) == 1
    assert 255 not in cut["deep"]["codes"] and len(set(cut["deep"]["got"])) > 8  # real leaves
    assert cut["noise"]["codes"] != cut["plain"]["codes"]


def test_triton_update_guarded_by_the_pick_is_the_engines_guard(interpreted):
    guarded = interpreted["guarded"]
    assert all(case["made"] for case in guarded.values())  # the pick's buffer, not the reference's ops
    finite = guarded["finite"]
    assert finite["update"] == finite["values"] == finite["reference"]
    # A NaN gradient or hessian: a NaN leaf as on the torch path (so the round reports it; the
    # fixed point's NaN scale reaches every leaf, the float sums only the document's), and no
    # update. An infinite hessian: NaN leaves here too (the fixed point has no finite scale for
    # it), where the torch path's float sums give its leaf a step of 0.
    for name in ("nan", "nan_hess", "inf_hess"):
        case = guarded[name]
        assert any(v != v for v in case["values"]) and any(case["torch_nan"]) == (name != "inf_hess"), name
        assert case["update"] == case["reference"] == [0.0] * 8, name


def test_triton_trees_deeper_than_the_pick_cuts_take_the_reference_leaves(interpreted):
    deep = interpreted["deep9"]
    assert deep["got"] == deep["ref"] and 255 not in deep["codes"]


def test_triton_boosting_run_grows_the_reference_trees(interpreted):
    # The round's kernels ran on Triton: lambdas, histograms, the levels (rows finished, siblings,
    # split scan and pick in one launch), routing.
    assert interpreted["backends"] == {"0": False, "force": True}
    calls = interpreted["calls"]
    # The lambdas: the flat kernel (k = 5), one launch per length bucket, the padded ones never.
    assert calls.get("_topk_kernel", 0) == calls.get("_lambda_kernel", 0) == 0, calls
    for kernel in ("_flat_lambda_kernel", "_histogram_kernel", "_route_kernel", "_score_update_kernel"):
        assert calls.get(kernel, 0) >= 6, (kernel, calls)
    # One launch a level (6 depth-3 trees), and no separate finishing of the histograms.
    assert calls.get("_level_kernel", 0) == 3 * 6 and calls.get("_finish_kernel", 0) == 0, calls
    # The quantized trees' fixed-point leaf sums pass over the documents; the float trees' are
    # cut from their last level's rows.
    assert calls.get("_exact_leaf_sums_kernel", 0) == 3
    # Each depth-3 tree: the root histogram reads every document, the two children's
    # histograms only the partition's first N // 2 entries (the smaller children).
    grids = interpreted["grids"]["histogram"]
    assert len(grids) == 3 * 6
    for i, (programs, block, n, rows) in enumerate(grids):
        assert rows == (n if i % 3 == 0 else n // 2), grids
        assert programs == -(-rows // block), grids
    exact = interpreted["fit/True"]
    assert exact["force"] == exact["0"]  # quantized: bit for bit, eval history included
    # The eval NDCG@10 (the Triton route's fused update and metric sums in float64, as the
    # compiled CPU metric; the torch metric in float32): within float32 rounding.
    got, ref = (exact[f"{r}/history"]["valid_0"]["ndcg@10"] for r in ("force", "0"))
    torch.testing.assert_close(torch.tensor(got, dtype=torch.float64), torch.tensor(ref, dtype=torch.float64),
                               rtol=0, atol=1e-6)
    assert calls.get("_eval_ndcg_kernel", 0) >= 6 and calls.get("_score_update_kernel", 0) >= 6
    runs = interpreted["fit/False"]
    assert len(runs["force"]) == 3
    for got, ref in zip(runs["force"], runs["0"]):
        assert got[:2] == ref[:2]
        torch.testing.assert_close(torch.tensor(got[2]), torch.tensor(ref[2]), rtol=1e-5, atol=1e-7)
