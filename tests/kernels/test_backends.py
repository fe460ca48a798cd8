"""The tree kernels' backends against the torch reference (rankkit.kernels).

Every backend must grow the reference backend's trees: the same features and thresholds at every
level, and the same leaf values (bit for bit with quantized gradients, where every sum is an
integer; within 1e-9 relative otherwise -- the compiled backend adds in the reference's order,
so in practice they are equal too).
"""
from __future__ import annotations

import importlib.util

import pytest
import torch

from simcuda import from_sim, simcuda

from rankkit.boosting import LambdaMART
from rankkit.boosting.tree import ObliviousTreeGrower, TreeParams
from rankkit.data import make_synthetic
from rankkit.kernels import backends, cpu, torch_ref

needs_cpu = pytest.mark.skipif(not cpu.available(), reason="the compiled CPU kernels are not built")


def _problem(n=4000, n_feat=9, seed=0, heavy=False):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 40, (n, n_feat), generator=g, dtype=torch.uint8)
    codes[:, 2] = (codes[:, 2] % 3).to(torch.uint8)  # a feature with few codes (many ties)
    valid = torch.zeros(n_feat, 256, dtype=torch.bool)
    valid[:, :39] = True
    valid[2, 2:] = False  # codes 0..2: thresholds 0 and 1
    grad = torch.randn(n, generator=g, dtype=torch.float64)
    grad += 0.8 * (codes[:, 0].double() > 20) - 0.5 * (codes[:, 3].double() < 7)  # signal to split on
    if heavy:
        grad *= torch.empty(n, dtype=torch.float64).exponential_(generator=g) ** 3
    hess = torch.rand(n, generator=g, dtype=torch.float64) + 0.05
    return codes, valid, grad, hess


def _assert_same_tree(a, b, exact):
    assert torch.equal(a.features, b.features) and torch.equal(a.codes, b.codes)
    assert torch.equal(a.leaf_index, b.leaf_index)
    if exact:
        assert torch.equal(a.leaf_values, b.leaf_values)
    else:
        torch.testing.assert_close(a.leaf_values, b.leaf_values, rtol=1e-9, atol=0)
    torch.testing.assert_close(a.gains, b.gains, rtol=1e-12, atol=1e-12)


CASES = [
    dict(),
    dict(min_data_in_leaf=200),                      # masks cut candidates
    dict(min_data_in_leaf=1, min_sum_hessian=5.0),   # the min-hessian mask
    dict(l2=0.0, depth=7),                           # empty children, deeper than the data supports
    dict(min_data_in_leaf=2100, depth=5),            # no split allowed: a stopped tree
    dict(quantized_grad=True, num_grad_quant_bins=16),
]


# The fused grower's two layouts (cpu.RK_FAR): the gradients moved with the documents' positions
# (with packed quantized cells unpacked every 7 documents: many chunk boundaries), or left in
# document order. Either way the reference's trees.
LAYOUTS = {"positional": dict(RK_FAR=0, PACKED_CHUNK_CAP=7), "document": dict(RK_FAR=2 ** 62, PACKED_CHUNK_CAP=0)}


@needs_cpu
@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
@pytest.mark.parametrize("sample", ["all", "rows+features", "noise"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_cpu_backend_grows_the_reference_trees(case, sample, layout, monkeypatch):
    for name, value in LAYOUTS[layout].items():
        monkeypatch.setattr(cpu, name, value)
    codes, valid, grad, hess = _problem(heavy="quantized_grad" not in case)
    params = TreeParams(**{"depth": 5, "min_data_in_leaf": 20, **case})
    kw = {}
    if sample == "rows+features":
        g = torch.Generator().manual_seed(4)
        kw = dict(rows=torch.randperm(4000, generator=g)[:2500].sort().values, features=torch.tensor([0, 2, 3, 5, 8]))
    fast_grower = ObliviousTreeGrower(codes, valid, params, backend="cpu")
    slow_grower = ObliviousTreeGrower(codes, valid, params, backend="torch")
    for tree_no in range(2):  # the second tree reuses the fused backend's buffers and root counts
        extra = {}
        if sample == "noise" or params.quantized_grad:
            extra = dict(noise_sd=0.5 if sample == "noise" else 0.0)
        fast = fast_grower.grow(grad, hess, **kw, **extra,
                                generator=torch.Generator().manual_seed(tree_no) if extra else None)
        slow = slow_grower.grow(grad, hess, **kw, **extra,
                                generator=torch.Generator().manual_seed(tree_no) if extra else None)
        _assert_same_tree(fast, slow, exact=params.quantized_grad)
        grad = grad.flip(0)
    if case.get("min_data_in_leaf") == 2100:
        assert bool((slow.codes == 255).all())  # the check covers a stopped tree


@needs_cpu
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_packed_quantized_cells_take_negative_hessians_and_wide_levels(layout, monkeypatch):
    # The packed cells hold h - min(h, 0): negative quantized hessians (a custom objective's) sum
    # exactly; and B = 256 (|g| up to 128, h up to 256) with a cap crosses chunk boundaries.
    for name, value in LAYOUTS[layout].items():
        monkeypatch.setattr(cpu, name, value)
    codes, valid, grad, hess = _problem(n=5000, n_feat=7, seed=3)
    hess = hess - 0.3  # about a quarter negative
    for bins in (4, 256):
        params = TreeParams(depth=4, min_data_in_leaf=5, quantized_grad=True, num_grad_quant_bins=bins)
        fast = ObliviousTreeGrower(codes, valid, params, backend="cpu").grow(
            grad, hess, generator=torch.Generator().manual_seed(bins))
        slow = ObliviousTreeGrower(codes, valid, params, backend="torch").grow(
            grad, hess, generator=torch.Generator().manual_seed(bins))
        _assert_same_tree(fast, slow, exact=True)
        assert bool((fast.codes != 255).any())  # it split


@needs_cpu
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_packed_cells_unpack_before_their_fields_overflow(layout, monkeypatch):
    # 60,000 documents on two codes per feature with B = 256: a cell sums ~30,000 documents of
    # g near 100 and h = 256, beyond the packed fields (|Σg| < 2^21, Σh < 2^22) unless the chunk
    # bound (rk_pack_chunk, about 16,000 documents here) unpacks in time. No cap in this test.
    monkeypatch.setattr(cpu, "RK_FAR", LAYOUTS[layout]["RK_FAR"])
    g = torch.Generator().manual_seed(7)
    n = 60_000
    codes = torch.randint(0, 2, (n, 3), generator=g, dtype=torch.uint8)
    valid = torch.zeros(3, 256, dtype=torch.bool)
    valid[:, 0] = True
    grad = 1.0 + (codes[:, 0] == 1).double() + 0.5 * (codes[:, 1] == 1).double()
    hess = torch.ones(n, dtype=torch.float64)
    params = TreeParams(depth=3, min_data_in_leaf=5, quantized_grad=True, num_grad_quant_bins=256)
    fast, slow = (ObliviousTreeGrower(codes, valid, params, backend=name).grow(
        grad, hess, generator=torch.Generator().manual_seed(1)) for name in ("cpu", "torch"))
    _assert_same_tree(fast, slow, exact=True)
    assert bool((fast.codes != 255).any())


@needs_cpu
@pytest.mark.parametrize("n", [0, 1, 7, 5000])
def test_compiled_fixed_point_leaves_are_the_reference_leaves(n):
    # cpu.fixed_leaves (the quantized round's leaves in C) against torch_ref.exact_leaf_sums then
    # newton_leaf_values, bit for bit: heavy-tailed g, hessians with zeros, empty leaves.
    g = torch.Generator().manual_seed(n)
    grad = torch.randn(n, generator=g, dtype=torch.float64) * torch.rand(n, generator=g, dtype=torch.float64) ** -2
    hess = torch.rand(n, generator=g, dtype=torch.float64).round(decimals=1)
    node = torch.randint(0, 12, (n,), generator=g)  # leaves 12..15 stay empty
    params = TreeParams(depth=4, l2=0.5, min_sum_hessian=0.3, learning_rate=0.2)
    want = torch_ref.newton_leaf_values(torch_ref.exact_leaf_sums(node, grad, hess, 16), params)
    got = cpu.fixed_leaves(node, grad, hess, 16, params)
    assert torch.equal(got, want)
    assert n < 5000 or bool((want != 0).sum() > 6)


@needs_cpu
def test_compiled_fixed_point_leaves_round_ties_to_even():
    # Gradients of exactly half a fixed-point unit: torch.round sends each to 0 (ties to even), so
    # leaf 1 sums to 0; rounding half away from zero would give it 2 units, a different leaf value.
    factor = float(torch_ref.fixed_point_factor(torch.tensor([1.0, 1.0], dtype=torch.float64), 4)[0])
    grad = torch.tensor([1.0, 0.5 / factor, 0.5 / factor, 0.0], dtype=torch.float64)
    hess = torch.ones(4, dtype=torch.float64)
    node = torch.tensor([0, 1, 1, 2])
    params = TreeParams(depth=2, l2=0.0, learning_rate=1.0)
    want = torch_ref.newton_leaf_values(torch_ref.exact_leaf_sums(node, grad, hess, 4), params)
    assert float(want[1]) == 0.0  # the ties went to even
    assert torch.equal(cpu.fixed_leaves(node, grad, hess, 4, params), want)


@needs_cpu
def test_compiled_fixed_point_leaves_of_a_nan_gradient_are_nan_as_the_reference():
    grad = torch.ones(10, dtype=torch.float64)
    grad[3] = float("nan")
    node = torch.zeros(10, dtype=torch.long)
    params = TreeParams(depth=2)
    want = torch_ref.newton_leaf_values(torch_ref.exact_leaf_sums(node, grad, torch.ones(10).double(), 4), params)
    got = cpu.fixed_leaves(node, grad, torch.ones(10).double(), 4, params)
    assert torch.equal(got.isnan(), want.isnan()) and bool(got[0].isnan())


@needs_cpu
@pytest.mark.parametrize("bins", [2, 3, 4, 16, 256])
def test_compiled_quantization_is_the_reference_quantization(bins):
    # cpu.quantize (the CPU backend's rounding, in C) against torch_ref.quantize_gradients with the
    # same generator: the same integers and scales, including all-zero gradients (scale 1),
    # negative hessians, and a NaN (scale 1, the NaN's integer as torch converts it).
    g = torch.Generator().manual_seed(bins)
    grad = torch.randn(3000, generator=g, dtype=torch.float64) ** 3
    hess = torch.rand(3000, generator=g, dtype=torch.float64) - 0.2
    nan = grad.clone()
    nan[17] = float("nan")
    for gr, he in ((grad, hess), (torch.zeros(3000, dtype=torch.float64), hess), (nan, hess.abs()),
                   (grad[:1], hess[:1]), (grad.float(), hess.float())):
        want = torch_ref.quantize_gradients(gr, he, bins, torch.Generator().manual_seed(9))
        got = cpu.quantize(gr, he, bins, torch.Generator().manual_seed(9))
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and torch.equal(a, b)
        if gr is grad:  # a case that can fail: the extremes reached
            top = int(want[0].abs().max())  # ⌊B/2 + u⌋ at the largest |g|: B/2 itself when B is even
            assert bins // 2 <= top <= -(-bins // 2) and int(want[1].max()) == bins


@needs_cpu
def test_the_compiled_infinity_check():
    x = torch.randn(70_000, 3)  # above the threshold where it takes every thread
    x[5, 1] = float("nan")  # missing, not infinite
    x[:2, 0] = 3e38
    assert not cpu.any_inf(x)
    for where, value in (((0, 0), float("inf")), ((69_999, 2), float("-inf")), ((35_000, 1), float("inf"))):
        y = x.clone()
        y[where] = value
        assert cpu.any_inf(y)
    assert cpu.any_inf(torch.tensor([[float("-inf")]])) and not cpu.any_inf(torch.zeros(0, 4))


@needs_cpu
def test_quantized_values_beyond_the_packed_cells_are_refused():
    codes, valid, grad, hess = _problem(n=50, n_feat=4)
    kernels = cpu.TreeKernels(codes.contiguous(), 2, valid)
    params = TreeParams(depth=2, min_data_in_leaf=1)
    scale = torch.ones(2, dtype=torch.float64)
    g = torch.zeros(50, dtype=torch.int32)
    for g_q, h_q in ((g + 2 ** 21, g), (g, g + 2 ** 22)):
        with pytest.raises(ValueError, match="out of the packed histogram cells' range"):
            kernels.grow(g_q, h_q, scale, valid, None, None, None, params)
    kernels.grow(g + 2 ** 21 - 1, g + 2 ** 22 - 1, scale, valid, None, None, None, params)  # the largest that fit


@needs_cpu
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("features", [[2, 3, 4, 5], [3, 2, 4, 5], [5, 4, 3, 2], [0, 1, 2, 4]])
@pytest.mark.parametrize("quantized", [False, True])
def test_feature_samples_in_and_out_of_column_order(layout, features, quantized, monkeypatch):
    # A block whose columns are lo, lo + 1, ... in order reads its codes straight from the row;
    # any other sample (permuted, even when contiguous, or with a gap) goes through the column
    # list. Both must grow the reference's trees.
    for name, value in LAYOUTS[layout].items():
        monkeypatch.setattr(cpu, name, value)
    codes, valid, grad, hess = _problem(n=3000, n_feat=7, seed=5)
    params = TreeParams(depth=4, min_data_in_leaf=10, quantized_grad=quantized)
    kw = dict(features=torch.tensor(features), generator=torch.Generator().manual_seed(3) if quantized else None)
    fast = ObliviousTreeGrower(codes, valid, params, backend="cpu").grow(grad, hess, **kw)
    kw["generator"] = torch.Generator().manual_seed(3) if quantized else None
    slow = ObliviousTreeGrower(codes, valid, params, backend="torch").grow(grad, hess, **kw)
    _assert_same_tree(fast, slow, exact=quantized)


@needs_cpu
def test_cpu_backend_does_not_depend_on_the_thread_count():
    codes, valid, grad, hess = _problem(n=6000, n_feat=80, heavy=True)  # 80 features: several blocks
    params = TreeParams(depth=6, min_data_in_leaf=10)
    threads = torch.get_num_threads()
    trees = []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            trees.append(ObliviousTreeGrower(codes, valid, params, backend="cpu").grow(grad, hess))
    finally:
        torch.set_num_threads(threads)
    for t in trees[1:]:
        _assert_same_tree(t, trees[0], exact=True)


@needs_cpu
def test_fused_levels_write_the_reference_partition_and_histograms():
    # After a split the documents stay partitioned by node in document order, and the
    # children's histograms are the reference's (the smaller summed, the larger by subtraction).
    codes, valid, grad, hess = _problem(n=3000, n_feat=5)
    params = TreeParams(depth=3, min_data_in_leaf=5)
    kernels = cpu.TreeKernels(codes.contiguous(), params.depth, valid)
    node, feats, cuts, gains, values = kernels.grow(grad, hess, None, valid, None, None, None, params,
                                                    leaf_g=grad, leaf_h=hess)
    root = kernels.root_counts(None, None, False)
    codes_t = codes.t().contiguous()
    want = torch_ref.leaf_sums(node, grad, hess, 8)
    torch.testing.assert_close(values, torch_ref.newton_leaf_values(want, params), rtol=0, atol=0)
    torch.testing.assert_close(root, torch_ref.build_histograms(codes_t, torch.zeros(3000, dtype=torch.long),
                                                                grad, hess, 1)[2], rtol=0, atol=0)
    order, seg = kernels._buffers[("order", torch.int64)], kernels._buffers[("seg", torch.int64)]
    for leaf in range(8):
        start, length = int(seg[2 * leaf]), int(seg[2 * leaf + 1])
        assert torch.equal(order[start:start + length], torch.nonzero(node == leaf).view(-1))
    assert torch.equal(node, torch_ref.leaf_of(codes_t, feats, cuts))


def test_reference_backend_on_the_simulated_device_grows_the_cpu_trees(monkeypatch):
    # The tree backends: both sides take the torch lambda pass (the compiled one agrees with it to
    # a float32 rounding, tests/kernels/test_cpu_lambdas.py).
    monkeypatch.setenv("RANKKIT_CPU_LAMBDAS", "0")
    train = make_synthetic(30, (5, 40), 8, seed=2)
    kwargs = dict(n_estimators=4, depth=4, min_data_in_leaf=5, subsample=0.8, colsample=0.7, seed=1)
    want = LambdaMART(**kwargs).fit(train).ensemble_.state_dict()
    with simcuda():
        got = LambdaMART(device="cuda", **kwargs).fit(train).ensemble_.state_dict()
    for name, value in want.items():  # the ensemble stores float32: equal to one float32 ulp
        torch.testing.assert_close(from_sim(got[name]), value, rtol=3e-7, atol=1e-9, msg=name)


def test_backend_choice(monkeypatch):
    assert backends.choose("cpu", "torch").name == "torch"
    with pytest.raises(ValueError, match="`backend`"):
        backends.choose("cpu", "numba")
    monkeypatch.setenv("RANKKIT_CPU_KERNEL", "0")
    assert backends.choose("cpu").name == "torch" and not cpu.available()
    with pytest.raises(ValueError, match="compiled kernels"):
        backends.choose("cpu", "cpu")
    monkeypatch.setenv("RANKKIT_CPU_KERNEL", "1")
    monkeypatch.setenv("RANKKIT_BACKEND", "torch")
    assert backends.choose("cpu").name == "torch"
    assert backends.choose("cpu", "cpu").name == ("cpu" if cpu.built() else "torch") or not cpu.built()


def test_the_compiled_kernels_are_an_installed_extension_not_a_runtime_build():
    # The C source is built by setup.py into rankkit.kernels._cpu; nothing is compiled or cached
    # at run time (no subprocess, no ~/.cache/rankkit).
    import rankkit.kernels.cpu as module

    source = open(module.__file__, encoding="utf-8").read()
    assert "subprocess" not in source and ".cache" not in source
    spec = importlib.util.find_spec("rankkit.kernels._cpu")
    assert (spec is not None) == (cpu._DLL is not None)


def test_non_finite_leaves_raise_naming_the_round():
    from rankkit.boosting.engine import BoosterConfig, BoostingEngine

    train = make_synthetic(20, 10, 5, seed=0)
    with pytest.raises(ValueError, match=r"boosting round 1: leaf \d+ of the new tree is .*not a finite float32"):
        LambdaMART(n_estimators=3, depth=2, min_data_in_leaf=5, learning_rate=1e300).fit(train)
    engine = BoostingEngine(train.features, train.labels, train.sizes, BoosterConfig(depth=2, min_data_in_leaf=5))
    engine.update()
    engine.update()
    gradients = engine.objective.gradients

    def nan_gradients(*args, **kwargs):
        grad, hess = gradients(*args, **kwargs)[:2]
        return grad * float("nan"), hess

    engine.objective.gradients = nan_gradients
    before = engine.scores.clone()
    with pytest.raises(ValueError, match="boosting round 3: leaf 0 of the new tree is nan"):
        engine.update()
    assert torch.equal(engine.scores, before) and len(engine.trees) == 2  # nothing was written
    engine.objective.gradients = lambda *a, **k: tuple(t * float("nan") for t in gradients(*a, **k)[:2])
    with pytest.raises(ValueError, match="boosting round 3: leaf 0 of the new tree is nan"):
        engine.update()  # a NaN hessian too: not the min-hessian guard's silent 0


@pytest.mark.parametrize("n_nodes", [1, 5, 32])
def test_a_cut_that_moves_no_document_gains_exactly_zero(n_nodes):
    # Codes >= 100 are empty in every node: cutting there leaves every right child empty, so
    # the gain is exactly 0 (not a rounding residue that could win a level).
    g = torch.Generator().manual_seed(n_nodes)
    hist = torch.rand(3, 4, n_nodes, 256, generator=g, dtype=torch.float64)
    hist[0] -= 0.5
    hist[2] = (hist[2] * 5).floor() + 1
    hist[:, :, :, 100:] = 0
    valid = torch.ones(4, 256, dtype=torch.bool)
    params = TreeParams(l2=0.3, min_data_in_leaf=0, min_sum_hessian=0.0)
    want = torch_ref.split_scores(hist, valid, params)
    assert bool((want[:, 99:] == 0).all()) and bool((want[:, :99] != 0).all())
    if cpu.available():
        got = cpu.split_scan(hist, valid, params)[0]
        assert torch.equal(got, want)  # the same terms in the same order: the same bits


@pytest.mark.slow
@needs_cpu
def test_cpu_backend_grows_the_reference_trees_on_mq2008(monkeypatch):
    # Fold 5's 13th tree once split a level on a cut that moved no document (a rounding
    # residue of a gain); the reference and the compiled scan must agree on such cuts too.
    from rankkit.data.bundled import load_mq2008

    train, vali, _ = load_mq2008(5)
    # The tree kernels alone: both runs take the torch lambda pass (the compiled one is tested
    # against it in test_cpu_lambdas.py; in float32 they agree to a float32 rounding).
    monkeypatch.setenv("RANKKIT_CPU_LAMBDAS", "0")
    kwargs = dict(n_estimators=15, depth=6, learning_rate=0.1, l2=1.0, min_data_in_leaf=20, k=10, normalize=True)
    fast = LambdaMART(**kwargs).fit(train, eval_set=[vali])
    monkeypatch.setenv("RANKKIT_CPU_KERNEL", "0")
    slow = LambdaMART(**kwargs).fit(train, eval_set=[vali])
    for name, value in slow.ensemble_.state_dict().items():
        assert torch.equal(fast.ensemble_.state_dict()[name], value), name
    # The eval metric: the compiled NDCG sums in float64, the torch one in float32.
    fast_h, slow_h = fast.evals_result_["valid_0"]["ndcg@10"], slow.evals_result_["valid_0"]["ndcg@10"]
    assert len(fast_h) == len(slow_h) and max(abs(a - b) for a, b in zip(fast_h, slow_h)) < 1e-6
