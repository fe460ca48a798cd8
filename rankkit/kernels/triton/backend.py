"""The Triton backend of the booster's kernels (:mod:`rankkit.kernels`), one signature per
kernel, as the torch reference's (:mod:`rankkit.kernels.torch_ref`).

The round on this backend (every decision a device tensor, no host sync inside the tree)::

    lambdas (one launch per length bucket) ─► root histogram (1) ─►
    per level: split scan (1) ─► pick (1) ─► route + slots (1) ─► partition (sort) ─►
               smaller children (1) ─► finish (1) ─► siblings (1) ─► leaves (1) ─►
               score update (1) ─► each eval set's update and NDCG@k (one per length bucket)

The levels are :func:`rankkit.kernels.triton.tree.grow_levels_triton`, which
:class:`~rankkit.kernels.backends.TritonBackend` calls directly, as it calls the flat lambda
pass and the eval kernel; the functions here are the padded lambda pass (the neural loss) and
the single kernels with the torch reference's signatures.

Where it runs is decided once per fit by :func:`rankkit.kernels.backends.choose`: Triton importable and
the tensors on a CUDA device of a CUDA build of torch; ``RANKKIT_TRITON=0`` turns it off, and
``RANKKIT_TRITON=force`` also takes CPU tensors, which Triton's interpreter runs
(``TRITON_INTERPRET=1``, set before triton is imported: how the tests prove these kernels
against the torch reference on a machine without a GPU).
"""
from __future__ import annotations

import torch

KERNELS = ("lambdas", "level_histogram", "split_scan", "route", "exact_leaf_sums", "score_update")


def lambdas(scores, labels, *, mask=None, weighting="ndcg", sigma=1.0, k=None, gain="exp",
            weights=None, return_loss=False):
    """(grad, hess[, loss]) of padded queries: :func:`rankkit.kernels.triton.lambdas.lambda_gradients_triton`."""
    from rankkit.kernels.triton.lambdas import lambda_gradients_triton

    return lambda_gradients_triton(scores, labels, mask=mask, weighting=weighting, sigma=sigma, k=k,
                                   gain=gain, weights=weights, return_loss=return_loss)


def level_histogram(codes_t, node, grad, hess, n_nodes, *, dtype=None, out=None):
    """[3, F, K, 256] histograms: :func:`rankkit.kernels.triton.histogram.level_histogram_triton`."""
    from rankkit.kernels.triton.histogram import level_histogram_triton

    return level_histogram_triton(codes_t, node, grad, hess, n_nodes, dtype=dtype, out=out)


def split_scan(hist, valid_codes, params, noise, stopped, *, scale=None):
    """One level's split (feature, code, gain, stopped) as 0-dim device tensors, as the torch
    reference's ``split_scan`` (first maximum; the noisy choice records the noise-free gain;
    a level without a positive gain stops this and every later level). ``hist`` may be the
    integer histograms with their ``scale`` (exact scans) or float64 ones."""
    from rankkit.kernels.triton.tree import _pick_kernel, split_scan_triton

    import triton

    n_feat = hist.shape[1]
    best, code = split_scan_triton(hist, valid_codes, l2=params.l2,
                                   min_data_in_leaf=params.min_data_in_leaf,
                                   min_sum_hessian=params.min_sum_hessian, scale=scale, noise=noise)
    device = hist.device
    feats = torch.zeros(1, dtype=torch.int64, device=device)
    cuts = torch.zeros(1, dtype=torch.int64, device=device)
    gains = torch.zeros(1, dtype=torch.float64, device=device)
    flag = stopped.to(torch.int8).reshape(1).clone()
    _pick_kernel[(1,)](best, code, hist, feats, cuts, gains, flag, flag, flag, 0, n_feat, hist.shape[2],
                       HAS_NOISE=noise is not None, BLOCK_F=max(16, triton.next_power_of_2(max(n_feat, 1))),
                       LAST=True, TOTALS=False)
    return feats[0], cuts[0], gains[0], flag[0] != 0


def route(codes_t, f, c, node, n_nodes):
    """``node += [codes_t[f] > c] · K`` in place (f, c 0-dim tensors); returns node."""
    from rankkit.kernels.triton.tree import _route_kernel

    import triton

    n = node.shape[0]
    if n:
        _route_kernel[(triton.cdiv(n, 256),)](codes_t.contiguous(), node, node, node,
                                              f.reshape(1).to(torch.int64), c.reshape(1).to(torch.int64),
                                              0, n, n_nodes, WITH_SLOT=False, BLOCK_N=256)
    return node


def exact_leaf_sums(node, grad, hess, n_leaves):
    """[2, n_leaves] fixed-point leaf sums, bit for bit the torch reference's (one process)."""
    from rankkit.kernels.triton.tree import exact_leaf_sums_triton

    return exact_leaf_sums_triton(node, grad, hess, n_leaves)


def score_update(scores, leaf_values, *, leaf=None, codes_t=None, features=None, cuts=None):
    """``scores += leaf_values[leaf]`` in place, the leaf given or routed from the codes."""
    from rankkit.kernels.triton.tree import score_update_triton

    return score_update_triton(scores, leaf_values, leaf=leaf, codes_t=codes_t, features=features,
                               cuts=cuts)
