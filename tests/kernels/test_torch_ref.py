"""rankkit.kernels.torch_ref: the torch reference of the tree kernels, which the compiled and
Triton backends are checked against, is itself checked here against plain Python loops over
documents, cells and candidates (the slowest, most obvious path)."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from rankkit.kernels import torch_ref


def data(n=300, n_feat=3, n_nodes=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    codes_t = torch.randint(0, 6, (n_feat, n), generator=g, dtype=torch.uint8)
    node = torch.randint(0, n_nodes + 1, (n,), generator=g)  # n_nodes: left out
    grad = torch.randn(n, generator=g, dtype=torch.float64)
    hess = torch.rand(n, generator=g, dtype=torch.float64)
    return codes_t, node, grad, hess, n_nodes


@pytest.mark.parametrize("chunk_rows", [1_000_000, 7])
def test_histograms_are_the_loop_over_documents(chunk_rows):
    codes_t, node, grad, hess, k = data()
    hist = torch_ref.build_histograms(codes_t, node, grad, hess, k, chunk_rows=chunk_rows)
    want = torch.zeros(3, codes_t.shape[0], k, 256, dtype=torch.float64)
    for i in range(codes_t.shape[1]):
        if int(node[i]) == k:
            continue
        for f in range(codes_t.shape[0]):
            c = int(codes_t[f, i])
            want[0, f, node[i], c] += grad[i]
            want[1, f, node[i], c] += hess[i]
            want[2, f, node[i], c] += 1
    torch.testing.assert_close(hist, want, rtol=0, atol=1e-12)


def test_split_scores_are_the_loop_over_candidates():
    codes_t, node, grad, hess, k = data(n=200, seed=1)
    hist = torch_ref.build_histograms(codes_t, node, grad, hess, k)
    valid = torch.ones(codes_t.shape[0], 256, dtype=torch.bool)
    valid[:, 5:] = False  # codes 0..5: thresholds 0..4 separate something
    params = SimpleNamespace(l2=1.0, min_data_in_leaf=8, min_sum_hessian=0.0)  # refuses cuts at both ends
    got = torch_ref.split_scores(hist, valid, params)
    for f in range(codes_t.shape[0]):
        for c in range(256):
            total, allowed = 0.0, bool(valid[f, c])
            for kk in range(k):
                members = [i for i in range(codes_t.shape[1]) if int(node[i]) == kk]
                left = [i for i in members if int(codes_t[f, i]) <= c]
                right = [i for i in members if int(codes_t[f, i]) > c]
                if any(0 < len(side) < params.min_data_in_leaf for side in (left, right)):
                    allowed = False

                def score(rows):
                    return sum(float(grad[i]) for i in rows) ** 2 / (sum(float(hess[i]) for i in rows) + params.l2)

                total += score(left) + score(right) - score(members)
            if allowed:
                assert math.isclose(float(got[f, c]), total, rel_tol=1e-9, abs_tol=1e-9), (f, c)
            else:
                assert float(got[f, c]) == -math.inf, (f, c)


def test_fixed_point_leaf_sums_do_not_depend_on_the_order_and_match_float_sums():
    codes_t, node, grad, hess, _ = data(n=5000, seed=2)
    leaf = node % 4
    a = torch_ref.exact_leaf_sums(leaf, grad, hess, 4)
    perm = torch.randperm(len(leaf), generator=torch.Generator().manual_seed(3))
    b = torch_ref.exact_leaf_sums(leaf[perm], grad[perm], hess[perm], 4)
    assert torch.equal(a, b)  # bit for bit in any order
    loops = torch.tensor([[math.fsum(float(v[i]) for i in range(len(leaf)) if int(leaf[i]) == j) for j in range(4)]
                          for v in (grad, hess)], dtype=torch.float64)
    torch.testing.assert_close(a, loops, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch_ref.leaf_sums(leaf, grad, hess, 4), loops, rtol=1e-12, atol=1e-12)


def test_newton_leaves_siblings_and_the_leaf_index_are_their_definitions():
    params = SimpleNamespace(l2=1.0, learning_rate=0.1, min_sum_hessian=0.5)
    sums = torch.tensor([[2.0, -1.0, 3.0], [1.0, -0.75, 0.2]], dtype=torch.float64)
    assert torch_ref.newton_leaf_values(sums, params).tolist() == [-0.1 * 2.0 / 2.0, 0.0, -0.1 * 3.0 / 1.2]
    codes_t, node, grad, hess, k = data(n=400, seed=4)
    parent = torch_ref.build_histograms(codes_t, node.clamp(max=1), grad, hess, 2)  # nodes 0, 1
    child = (node > 1).long()  # a split of each parent by a bit: children p + 2·bit
    full = torch_ref.build_histograms(codes_t, node.clamp(max=1) + 2 * child, grad, hess, 4)
    small_is_right = torch.tensor([True, False])
    small = torch.stack([full[:, :, 2], full[:, :, 1]], dim=2)  # the right child of 0, the left of 1
    torch.testing.assert_close(torch_ref.siblings(parent, small, small_is_right), full, rtol=0, atol=1e-12)
    features, cuts = torch.tensor([2, 0]), torch.tensor([3, 1], dtype=torch.uint8)
    want = [int(codes_t[2, i] > 3) + 2 * int(codes_t[0, i] > 1) for i in range(codes_t.shape[1])]
    assert torch_ref.leaf_of(codes_t, features, cuts).tolist() == want
