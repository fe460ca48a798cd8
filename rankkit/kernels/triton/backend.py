"""The Triton backend of the booster's kernels (:mod:`rankkit.kernels`), one signature per
kernel, as the torch reference's (:mod:`rankkit.kernels.torch_ref`).

The round on this backend (every decision a device tensor, no host sync inside the tree)::

    lambdas (one launch per length bucket) ─► fixed point (2: float gradients) ─►
    root histogram (1) ─► per level: rows finished + siblings + split scan + pick (1) ─►
               route + slots + the smaller children compacted (1) ─► their histogram (1) ─►
    leaves (cut by the last level's pick; quantized: 1) ─► score update (1) ─►
    each eval set's update and NDCG@k (one per length bucket)

The levels are :func:`rankkit.kernels.triton.tree.grow_levels_triton`, which
:class:`~rankkit.kernels.backends.TritonBackend` calls directly, as it calls the flat lambda
pass, the fixed point (:mod:`rankkit.kernels.triton.fixed`) and the eval kernel; the functions
here are the two single kernels it also calls with the torch reference's signatures (the
leaves' exact sums, the score update).

Where it runs is decided once per fit by :func:`rankkit.kernels.backends.choose`: Triton importable and
the tensors on a CUDA device of a CUDA build of torch; ``RANKKIT_TRITON=0`` turns it off, and
``RANKKIT_TRITON=force`` also takes CPU tensors, which Triton's interpreter runs
(``TRITON_INTERPRET=1``, set before triton is imported: how the tests prove these kernels
against the torch reference on a machine without a GPU).
"""
from __future__ import annotations


def exact_leaf_sums(node, grad, hess, n_leaves):
    """[2, n_leaves] fixed-point leaf sums, bit for bit the torch reference's (one process)."""
    from rankkit.kernels.triton.tree import exact_leaf_sums_triton

    return exact_leaf_sums_triton(node, grad, hess, n_leaves)


def score_update(scores, leaf_values, *, leaf=None, codes_t=None, features=None, cuts=None):
    """``scores += leaf_values[leaf]`` in place, the leaf given or routed from the codes."""
    from rankkit.kernels.triton.tree import score_update_triton

    return score_update_triton(scores, leaf_values, leaf=leaf, codes_t=codes_t, features=features,
                               cuts=cuts)
