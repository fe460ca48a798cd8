"""Quantized gradients (``quantized_grad``): stochastic rounding, integer histograms, trees.

LightGBM 4's ``use_quantized_grad`` (Shi et al., "Quantized Training of Gradient Boosting
Decision Trees", NeurIPS 2022): grad and hess are rounded stochastically to integers in
−B/2..B/2 and 0..B, the histograms sum integers (exact, so independent of thread count and
summation order), the split search reads them times the round's scales, and the leaves take
the full-precision sums. Each fast path is checked against an independent slow one: the
compiled and torch-ops integer histograms against a per-feature ``index_add_``, CPU against the
simulated CUDA device, one thread against two.
"""
from __future__ import annotations

import pytest
import torch
from simcuda import from_sim, simcuda

from rankkit.boosting import LambdaMART
from rankkit.boosting.tree import (
    ObliviousTreeGrower,
    TreeParams,
    build_histograms,
    leaf_sums,
    newton_leaf_values,
    quantize_gradients,
)
from rankkit.data import make_synthetic
from rankkit.kernels import cpu as _cpu_kernel

needs_kernel = pytest.mark.skipif(not _cpu_kernel.available(), reason="no C compiler: no compiled kernel")


def _problem(n=3000, n_feat=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 40, (n, n_feat), generator=g, dtype=torch.uint8)
    grad = torch.randn(n, generator=g, dtype=torch.float64)
    hess = torch.rand(n, generator=g, dtype=torch.float64) + 0.05
    valid = torch.zeros(n_feat, 256, dtype=torch.bool)
    valid[:, :39] = True
    return codes, grad, hess, valid


def _reference(codes_t, node, g_q, h_q, n_nodes):
    """[3, F, K, 256] int64 by one integer index_add_ per feature and channel."""
    n_feat = codes_t.shape[0]
    out = torch.zeros(3, n_feat, n_nodes * 256, dtype=torch.int64)
    for f in range(n_feat):
        cell = node * 256 + codes_t[f].long()
        for c, values in enumerate((g_q.long(), h_q.long(), torch.ones_like(node))):
            out[c, f].index_add_(0, cell, values)
    return out.view(3, n_feat, n_nodes, 256)


def test_stochastic_rounding_is_unbiased_and_in_range():
    g = torch.Generator().manual_seed(1)
    grad = torch.randn(200, generator=g, dtype=torch.float64)
    hess = torch.rand(200, generator=g, dtype=torch.float64)
    repeats = 4000
    g_q, h_q, scale = quantize_gradients(grad.repeat(repeats), hess.repeat(repeats), 4, g)
    assert g_q.dtype == h_q.dtype == torch.int32
    assert int(g_q.abs().max()) <= 2 and int(h_q.min()) >= 0 and int(h_q.max()) <= 4
    # The scales: max|g| / (B/2), max|h| / B.
    torch.testing.assert_close(scale, torch.stack([grad.abs().max() / 2, hess.max() / 4]))
    mean_g = g_q.view(repeats, -1).double().mean(0) * scale[0]
    mean_h = h_q.view(repeats, -1).double().mean(0) * scale[1]
    # A rounding's error is at most one step; its mean over R draws is within ~ step / (2 √R).
    tol_g, tol_h = 5 * float(scale[0]) / (2 * repeats ** 0.5), 5 * float(scale[1]) / (2 * repeats ** 0.5)
    assert float((mean_g - grad).abs().max()) < tol_g
    assert float((mean_h - hess).abs().max()) < tol_h
    # The same generator state gives the same rounding (a seed gives the same model).
    again = quantize_gradients(grad, hess, 4, torch.Generator().manual_seed(7))
    assert torch.equal(again[0], quantize_gradients(grad, hess, 4, torch.Generator().manual_seed(7))[0])


@pytest.mark.parametrize("use_kernel", [pytest.param(True, marks=needs_kernel), False])
def test_integer_histograms_are_exact(use_kernel):
    codes, grad, hess, _ = _problem()
    g_q, h_q, _ = quantize_gradients(grad, hess, 16, torch.Generator().manual_seed(2))
    node = torch.randint(0, 4, (codes.shape[0],), generator=torch.Generator().manual_seed(3))
    codes_t = codes.t().contiguous()
    want = _reference(codes_t, node, g_q, h_q, 4)
    if use_kernel:
        threads = torch.get_num_threads()
        try:
            for n in (1, 2):
                torch.set_num_threads(n)
                got = _cpu_kernel.histograms(codes, None, None, node, g_q, h_q, 4)
                assert got.dtype == torch.int64 and torch.equal(got, want)
        finally:
            torch.set_num_threads(threads)
        # The subtraction trick in integers: the larger child is exactly parent − smaller.
        parent = _cpu_kernel.histograms(codes, None, None, node % 2, g_q, h_q, 2)
        kids = _cpu_kernel.children(codes, None, None, node, g_q, h_q, parent, torch.tensor([True, False]))
        assert torch.equal(kids, want)
    else:
        got = build_histograms(codes_t, node, g_q.long(), h_q.long(), 4, chunk_rows=700)
        assert got.dtype == torch.int64 and torch.equal(got, want)


def test_exactly_representable_gradients_grow_the_unquantized_tree():
    # grad in {−2..2} with max |g| = 2 and B = 4: scale 1, so the rounding is exact; hess ≡ 1
    # (scale 1/4) likewise. The quantized split search then sees the float sums exactly.
    codes, _, _, valid = _problem(seed=4)
    g = torch.Generator().manual_seed(5)
    grad = torch.randint(-2, 3, (codes.shape[0],), generator=g).double()
    grad[0] = 2.0
    hess = torch.ones_like(grad)
    plain = TreeParams(depth=4, min_data_in_leaf=10)
    quant = TreeParams(depth=4, min_data_in_leaf=10, quantized_grad=True, num_grad_quant_bins=4)
    for use_kernel in ((True, False) if _cpu_kernel.available() else (False,)):
        a = ObliviousTreeGrower(codes, valid, plain, backend="cpu" if use_kernel else "torch").grow(grad, hess)
        b = ObliviousTreeGrower(codes, valid, quant, backend="cpu" if use_kernel else "torch").grow(
            grad, hess, generator=torch.Generator().manual_seed(0))
        for x, y in zip(a, b):
            assert torch.equal(x, y)


def test_leaves_take_the_full_precision_sums():
    codes, grad, hess, valid = _problem(seed=6)
    params = TreeParams(depth=3, min_data_in_leaf=10, quantized_grad=True)
    tree = ObliviousTreeGrower(codes, valid, params).grow(grad, hess, generator=torch.Generator().manual_seed(1))
    # Full precision: the float64 sums, to the fixed-point rounding of exact_leaf_sums.
    want = newton_leaf_values(leaf_sums(tree.leaf_index, grad, hess, 8), params)
    torch.testing.assert_close(tree.leaf_values, want, rtol=1e-11, atol=1e-14)


def test_exact_leaf_sums_do_not_depend_on_the_order_of_the_documents():
    from rankkit.boosting.tree import exact_leaf_sums

    g = torch.Generator().manual_seed(2)
    grad = torch.randn(5000, generator=g, dtype=torch.float64) * torch.logspace(-6, 3, 5000, dtype=torch.float64)
    hess = torch.rand(5000, generator=g, dtype=torch.float64)
    node = torch.randint(0, 8, (5000,), generator=g)
    perm = torch.randperm(5000, generator=g)
    a = exact_leaf_sums(node, grad, hess, 8)
    assert torch.equal(a, exact_leaf_sums(node[perm], grad[perm], hess[perm], 8))  # bit for bit
    halves = exact_leaf_sums(node[:2500], grad[:2500], hess[:2500], 8)
    torch.testing.assert_close(a, leaf_sums(node, grad, hess, 8), rtol=1e-12, atol=1e-12)
    assert not torch.equal(halves, a)  # the check can fail


def _fit(device="cpu", **options):
    data = make_synthetic(10, 20, 6, seed=4)
    model = LambdaMART(n_estimators=4, depth=3, min_data_in_leaf=3, learning_rate=0.3, quantized_grad=True,
                       num_grad_quant_bins=8, device=device, **options)
    return model.fit(data).ensemble_.state_dict()


def assert_same_model(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(from_sim(a[key]), from_sim(b[key])), key


@pytest.mark.parametrize("path", [pytest.param("kernel", marks=needs_kernel), "torch"])
def test_quantized_trees_do_not_depend_on_the_thread_count(path, monkeypatch):
    if path == "torch":
        monkeypatch.setenv("RANKKIT_CPU_KERNEL", "0")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _fit(subsample=0.8)
        torch.set_num_threads(2)
        two = _fit(subsample=0.8)
    finally:
        torch.set_num_threads(threads)
    assert_same_model(one, two)


@pytest.mark.parametrize("options", [{}, {"subsample": 0.7, "colsample": 0.6, "bagging_temperature": 1.0,
                                          "random_strength": 1.0}], ids=["plain", "randomised"])
def test_quantized_trees_equal_on_cpu_and_the_simulated_cuda_device(options):
    cpu = _fit(**options)
    with simcuda():
        gpu = _fit("cuda", **options)
    assert_same_model(gpu, cpu)


def test_quantized_changes_the_trees_and_is_seeded():
    data = make_synthetic(10, 20, 6, seed=4)
    kw = dict(n_estimators=3, depth=3, min_data_in_leaf=3, num_grad_quant_bins=4)
    a = LambdaMART(quantized_grad=True, seed=1, **kw).fit(data).ensemble_.leaf_values
    b = LambdaMART(quantized_grad=True, seed=1, **kw).fit(data).ensemble_.leaf_values
    plain = LambdaMART(seed=1, **kw).fit(data).ensemble_.leaf_values
    assert torch.equal(a, b) and not torch.equal(a, plain)
    with pytest.raises(ValueError, match="num_grad_quant_bins"):
        LambdaMART(quantized_grad=True, num_grad_quant_bins=1).fit(data)


@pytest.mark.parametrize("quantized", [False, True])
def test_torch_path_runs_under_deterministic_algorithms(quantized):
    # The torch-ops path (the GPU's) uses only ops that have deterministic implementations
    # (1-D index_add_, no 2-D scatter_add_); on the simulated device, CPU kernels run, so this
    # checks the op choice against torch's CPU checks and that the result is unchanged.
    codes, grad, hess, valid = _problem(seed=8)
    params = TreeParams(depth=4, min_data_in_leaf=10, quantized_grad=quantized)
    free = ObliviousTreeGrower(codes, valid, params, backend="torch").grow(
        grad, hess, generator=torch.Generator().manual_seed(0))
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        strict = ObliviousTreeGrower(codes, valid, params, backend="torch").grow(
            grad, hess, generator=torch.Generator().manual_seed(0))
        with simcuda():
            device = ObliviousTreeGrower(codes.cuda(), valid, params).grow(
                grad.cuda(), hess.cuda(), generator=torch.Generator(device="cuda").manual_seed(0))
    finally:
        torch.use_deterministic_algorithms(was)
    for x, y, z in zip(free, strict, device):
        assert torch.equal(x, y) and torch.equal(x, from_sim(z))


@needs_kernel
@pytest.mark.parametrize("max_bins", [5, 40, 255])
def test_compiled_binning_equals_searchsorted(max_bins, monkeypatch):
    # Not quantization, but the other compiled pass of the same work (binning speed): the
    # branchless binary search against torch.searchsorted, with NaN, ±inf and a 4-value feature.
    from rankkit.boosting.binning import QuantileBinner

    g = torch.Generator().manual_seed(0)
    x = torch.randn(5000, 6, generator=g)
    x[::7, 2], x[::11, 3], x[::13, 4] = float("nan"), -float("inf"), float("inf")
    x[:, 5] = torch.randint(0, 4, (5000,), generator=g).float()
    binner = QuantileBinner(max_bins=max_bins).fit(x)
    fast = binner.transform(x)
    monkeypatch.setenv("RANKKIT_CPU_KERNEL", "0")
    assert torch.equal(fast, binner.transform(x))
