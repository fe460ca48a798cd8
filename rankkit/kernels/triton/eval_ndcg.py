"""An eval set's part of a boosting round in one Triton kernel: the new tree added to its scores
and its NDCG@k, one program per query on the flat layout (../shared/design/gpu-round.md, S4).

The torch path takes a score-update kernel and about fifteen ops around a segmented sort of the
padded [Q, L] scores; here each program routes its query's documents through the tree's levels
(codes feature-major [F, N]), adds the leaf values to the scores in place, selects the top k of
the new scores in registers (their float32 values, as the torch metric ranks them; equal scores:
lower label first, the worst case, as :func:`rankkit.metrics.planned_ndcg`) and writes
DCG@k / IDCG@k from each document's gain over its query's ideal DCG, computed once per data set
(:func:`rankkit.boosting.objectives.flat_ndcg_inputs`); a query with nothing relevant scores
``empty``. The mean is one more program's sum of the per-query values in a fixed order
(:func:`_mean_kernel`): the same bits every run.

Notation: N documents, Q queries, F features, D levels, k the cutoff.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from rankkit.infra.checks import check_tensor

from rankkit.kernels.triton.flat_lambdas import _query, _select_top, check_flat, warps_for
from rankkit.kernels.workspace import workspace_or_fresh


@triton.jit
def _eval_ndcg_kernel(scores_ptr, codes_ptr, feats_ptr, cuts_ptr, values_ptr, y_ptr, gain_ptr, offsets_ptr,
                      queries_ptr, out_ptr, N, k, empty,
                      DEPTH: tl.constexpr, BLOCK: tl.constexpr, K_PAD: tl.constexpr):
    """Query ``queries[program]``: scores += the tree's leaf values, then its NDCG@k into out[q]."""
    start, n, j, real = _query(offsets_ptr, queries_ptr, BLOCK)
    leaf = tl.zeros([BLOCK], dtype=tl.int64)
    for d in tl.static_range(DEPTH):
        f = tl.load(feats_ptr + d)
        c = tl.load(cuts_ptr + d)
        code = tl.load(codes_ptr + f * N + start + j, mask=real, other=0).to(tl.int64)
        leaf += (code > c).to(tl.int64) << d
    s = tl.load(scores_ptr + start + j, mask=real, other=0.0) + tl.load(values_ptr + leaf, mask=real, other=0.0)
    tl.store(scores_ptr + start + j, s, mask=real)
    y = tl.load(y_ptr + start + j, mask=real, other=0.0)
    kk = tl.minimum(k, n)
    sel = _select_top(s.to(tl.float32), y, real, kk, BLOCK, K_PAD)
    r = tl.arange(0, K_PAD)
    rows = r < kk
    gain = tl.load(gain_ptr + start + sel, mask=rows, other=0.0)
    dcg = tl.sum(tl.where(rows, gain / tl.log2(r.to(tl.float64) + 2.0), 0.0), 0)
    top = tl.max(tl.load(gain_ptr + start + j, mask=real, other=0.0), 0)  # 0: nothing relevant
    tl.store(out_ptr + tl.load(queries_ptr + tl.program_id(0)), tl.where(top > 0.0, dcg, empty))


@triton.jit
def _mean_kernel(values_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """out[0] = the mean of values [n] (0 when n is 0), one program summing BLOCK lanes in order."""
    acc = tl.zeros([BLOCK], dtype=tl.float64)
    for c0 in range(0, n, BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        acc += tl.load(values_ptr + c, mask=c < n, other=0.0)
    tl.store(out_ptr, tl.sum(acc, 0) / tl.maximum(n, 1).to(tl.float64))


def eval_ndcg_triton(scores: torch.Tensor, codes_t: torch.Tensor, features: torch.Tensor, cuts: torch.Tensor,
                     values: torch.Tensor, *, labels: torch.Tensor, gains: torch.Tensor, offsets: torch.Tensor,
                     buckets: list[tuple[int, torch.Tensor]], cutoff: int, empty: float = 1.0,
                     workspace=None) -> torch.Tensor:
    """Add a tree to ``scores`` in place and return the mean NDCG@cutoff (a 0-dim float64 tensor
    on the device; no host sync): one launch per length bucket and one for the mean.

    Args:
        scores: [N] float64 eval scores (updated in place).
        codes_t: [F, N] uint8, the eval set's codes feature-major.
        features, cuts: [D] int64, the tree's feature (a row of ``codes_t``) and code per level.
        values: [2^D] float64 leaf values.
        labels, gains: [N] float64: the labels and each document's gain over its query's ideal
            DCG@cutoff.
        offsets: [Q + 1] int64 on the device; buckets: :func:`~rankkit.kernels.triton.flat_lambdas.length_buckets`.
        cutoff: k, 1 to :data:`~rankkit.kernels.triton.flat_lambdas.TOPK_MAX`.
        empty: the NDCG of a query with nothing relevant.
        workspace: a :class:`~rankkit.kernels.workspace.Workspace` (or scope) that keeps
            the per-query values and the mean from call to call (the mean is then valid until
            the next call); None: new tensors.
    """
    if scores.dtype != torch.float64 or not scores.is_contiguous():
        raise ValueError("`scores` must be contiguous float64 (updated in place)")
    check_flat(scores, offsets, cutoff, labels=labels, gains=gains)
    check_tensor(codes_t, "codes_t", ndim=2, kind="int")
    if codes_t.shape[1] != scores.shape[0]:
        raise ValueError(f"`codes_t` has to be [F, {scores.shape[0]}] (feature-major), got {tuple(codes_t.shape)}")
    n_queries = offsets.shape[0] - 1
    ws = workspace_or_fresh(workspace)
    per_query = ws.empty("per_query", max(n_queries, 1), torch.float64, scores.device)
    k_pad = max(16, triton.next_power_of_2(cutoff))
    feats = features.to(torch.int64).contiguous()
    cut = cuts.to(torch.int64).contiguous()
    for block, queries in buckets:
        _eval_ndcg_kernel[(queries.shape[0],)](
            scores, codes_t, feats, cut, values.to(torch.float64).contiguous(), labels, gains, offsets, queries,
            per_query, scores.shape[0], cutoff, float(empty), DEPTH=int(feats.shape[0]), BLOCK=block, K_PAD=k_pad,
            num_warps=warps_for(block))
    mean = ws.empty("mean", (), torch.float64, scores.device)
    _mean_kernel[(1,)](per_query, mean, n_queries, BLOCK=1024)
    return mean
