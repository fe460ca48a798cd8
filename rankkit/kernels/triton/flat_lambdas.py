"""The booster's lambda pass on the flat layout, in Triton: one program per query, no padding.

The round's pairwise (grad, hess) for the RankNet and |ΔNDCG@k| weightings with a cutoff
k ≤ :data:`TOPK_MAX` (Burges, "From RankNet to LambdaRank to LambdaMART: An Overview",
MSR-TR-2010-82, 2010), the same numbers as the compiled CPU pass
(:func:`rankkit.kernels.cpu.lambdas`) and the torch reference, on the flat [N] arrays with the
query bounds ``offsets`` (LightGBM's and XGBoost's layout), where the padded kernel
(:mod:`rankkit.kernels.triton.lambdas`) runs a [Q, L] grid that is 90 % idle at MSLR's lengths
(../shared/design/gpu-round.md §1.3, S1):

* **length buckets**: the queries are grouped by the power of two that holds them (16 … 2^12),
  once per data set; one launch per non-empty bucket, one program per query, whose documents
  sit in registers (a short query pays for its own length only);
* **top-k selection in registers**: the k first documents of the current ranking (descending
  score; equal scores: lower label first, then document order), k passes of three block
  reductions over the query held in registers -- no sort, no [Q, L] order buffer;
* **each pair once**: a pair takes part when one document is in the top k (NDCG@k's ΔZ is 0
  when both are below it), and is evaluated once, by the row of its higher-ranked document;
  the row side accumulates in registers, the column side is written per column tile, and the
  rows' sums are added at the end by the same program (no atomics: deterministic);
* **the plan's constants**: each document's gain over its query's ideal DCG@k, computed once
  per data set (:func:`rankkit.boosting.objectives.flat_ndcg_inputs`), never per round;
* LightGBM's per-query normalisation (``normalize``: log2(1 + S) / S, S = 2σ Σ|λ|), which the
  shipped LambdaMART config uses, in the same program.

For a pair oriented from higher to lower label (sgn = sign(y_i − y_j)), with
x = −σ sgn (s_i − s_j), ρ = sigmoid(x) and |ΔZ| (1 for RankNet, else |G_i − G_j| |D(r_i) −
D(r_j)| with D(r) = 1 / log2(2 + r) for r < k, 0 beyond): grad_i −= sgn σ |ΔZ| ρ, grad_j += the
same, hess_i, hess_j += σ² |ΔZ| ρ (1 − ρ); a weighted pair takes |ΔZ| times the mean of its two
weights.

Notation: N documents, Q queries, n a query's documents, k the cutoff.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from rankkit.infra.checks import check_tensor
from rankkit.kernels.workspace import workspace_or_fresh

# Cutoffs up to this take the flat kernel (k selection passes in registers).
TOPK_MAX = 32
# Queries up to this long; a data set with a longer one takes the padded kernel.
MAX_BLOCK = 1 << 12
MIN_BLOCK = 16
# Column tile of the pair loop (a [K_PAD, BLOCK_C] tile per step).
BLOCK_C = 128


@triton.jit
def _query(offsets_ptr, queries_ptr, BLOCK: tl.constexpr):
    """This program's query: (its first flat position, its length n, the lanes 0..BLOCK−1 and
    which of them hold a document)."""
    q = tl.load(queries_ptr + tl.program_id(0)).to(tl.int64)
    start = tl.load(offsets_ptr + q)
    n = (tl.load(offsets_ptr + q + 1) - start).to(tl.int32)
    j = tl.arange(0, BLOCK)
    return start, n, j, j < n


@triton.jit
def _select_top(s, y, real, kk, BLOCK: tl.constexpr, K_PAD: tl.constexpr):
    """[K_PAD] int32: the documents at ranks 0 … kk − 1 of the query held in registers
    (descending score; equal scores: lower label, then lower index), 0 beyond kk."""
    j = tl.arange(0, BLOCK)
    t_idx = tl.arange(0, K_PAD)
    sel = tl.full([K_PAD], 0, tl.int32)
    free = real
    for r in range(0, kk):
        top = tl.max(tl.where(free, s, float("-inf")), 0)
        cand = free & (s == top)
        low = tl.min(tl.where(cand, y, float("inf")), 0)
        cand = cand & (y == low)
        first = tl.min(tl.where(cand, j, BLOCK), 0)
        sel = tl.where(t_idx == r, first, sel)
        free = free & (j != first)
    return sel


@triton.jit
def _column_tile(s_ptr, y_ptr, gain_ptr, w_ptr, grad_ptr, hess_ptr, start, c0, n, k, sigma,
                 sel, rows, s_r, y_r, g_r, d_r, w_r,
                 WEIGHTING: tl.constexpr, HAS_WEIGHTS: tl.constexpr, BLOCK_C: tl.constexpr, K_PAD: tl.constexpr):
    """The pairs of the top rows with the columns c0 … c0 + BLOCK_C ranked after them: the
    columns' sums are written, the rows' (grad, hess, Σ|ΔZ|ρ) returned."""
    t_idx = tl.arange(0, K_PAD)
    c = c0 + tl.arange(0, BLOCK_C)
    in_c = c < n
    y_c = tl.load(y_ptr + start + c, mask=in_c, other=0.0)
    s_c = tl.load(s_ptr + start + c, mask=in_c, other=0.0).to(y_c.dtype)
    # The column's rank where it is in the top k, else K_PAD (after every row).
    b = tl.min(tl.where((sel[:, None] == c[None, :]) & rows[:, None], t_idx[:, None], K_PAD), 0)
    sgn = tl.where(y_r[:, None] > y_c[None, :], 1.0, tl.where(y_r[:, None] < y_c[None, :], -1.0, 0.0))
    live = rows[:, None] & in_c[None, :] & (b[None, :] > t_idx[:, None]) & (sgn != 0.0)
    if WEIGHTING == 0:
        dz = tl.where(live, 1.0, 0.0)
    else:
        g_c = tl.load(gain_ptr + start + c, mask=in_c, other=0.0)
        d_c = tl.where(b < k, 1.0 / tl.log2(b.to(s_r.dtype) + 2.0), 0.0)
        dz = tl.where(live, tl.abs(g_r[:, None] - g_c[None, :]) * tl.abs(d_r[:, None] - d_c[None, :]), 0.0)
    # ρ = sigmoid(x) with e = e^{−|x|} (no overflow): 1/(1+e) if x >= 0 else e/(1+e).
    x = -sigma * sgn * (s_r[:, None] - s_c[None, :])
    e = tl.exp(-tl.abs(x))
    inv = 1.0 / (1.0 + e)
    rho = tl.where(x >= 0.0, inv, e * inv)
    plain = tl.sum(dz * rho, 1)  # before the weights: LightGBM's normalisation sums these
    if HAS_WEIGHTS:
        w_c = tl.load(w_ptr + start + c, mask=in_c, other=0.0)
        dz = dz * (0.5 * (w_r[:, None] + w_c[None, :]))
    lam = sgn * sigma * dz * rho
    h = sigma * sigma * dz * (e * inv * inv)
    tl.store(grad_ptr + start + c, tl.sum(lam, 0), mask=in_c)
    tl.store(hess_ptr + start + c, tl.sum(h, 0), mask=in_c)
    return -tl.sum(lam, 1), tl.sum(h, 1), plain


@triton.jit
def _scale_query(grad_ptr, hess_ptr, start, n, factor, BLOCK_C: tl.constexpr, ROUND32: tl.constexpr):
    """grad, hess of one query times ``factor`` (rounded to float32 values with ``ROUND32``)."""
    for c0 in range(0, n, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        in_c = c < n
        grad = tl.load(grad_ptr + start + c, mask=in_c, other=0.0).to(factor.dtype) * factor
        hess = tl.load(hess_ptr + start + c, mask=in_c, other=0.0).to(factor.dtype) * factor
        if ROUND32:
            grad, hess = grad.to(tl.float32).to(factor.dtype), hess.to(tl.float32).to(factor.dtype)
        tl.store(grad_ptr + start + c, grad, mask=in_c)
        tl.store(hess_ptr + start + c, hess, mask=in_c)


@triton.jit
def _flat_lambda_kernel(s_ptr, y_ptr, gain_ptr, w_ptr, offsets_ptr, queries_ptr, grad_ptr, hess_ptr,
                        k, sigma,
                        WEIGHTING: tl.constexpr, HAS_WEIGHTS: tl.constexpr, NORMALIZE: tl.constexpr,
                        BLOCK: tl.constexpr, BLOCK_C: tl.constexpr, K_PAD: tl.constexpr,
                        ROUND32: tl.constexpr):
    """grad, hess of the documents of query ``queries[program]`` (at most BLOCK of them), in the
    labels' dtype: float64 scores over float32 labels are rounded as they are read, and float64
    grad / hess hold float32 values (each read back as float32: the same arithmetic). With
    ``ROUND32`` the finished float64 values are rounded to float32 values (``quantized_grad``'s
    float64 pass, as ``.float().double()`` after it)."""
    start, n, j, real = _query(offsets_ptr, queries_ptr, BLOCK)
    y = tl.load(y_ptr + start + j, mask=real, other=0.0)
    s = tl.load(s_ptr + start + j, mask=real, other=0.0).to(y.dtype)
    kk = tl.minimum(k, n)
    sel = _select_top(s, y, real, kk, BLOCK, K_PAD)
    t_idx = tl.arange(0, K_PAD)
    rows = t_idx < kk
    y_r = tl.load(y_ptr + start + sel, mask=rows, other=0.0)
    s_r = tl.load(s_ptr + start + sel, mask=rows, other=0.0).to(y_r.dtype)
    g_r = tl.load(gain_ptr + start + sel, mask=rows, other=0.0) if WEIGHTING == 1 else s_r
    w_r = tl.load(w_ptr + start + sel, mask=rows, other=0.0) if HAS_WEIGHTS else s_r
    d_r = 1.0 / tl.log2(t_idx.to(s_r.dtype) + 2.0)  # every row ranks below k
    row_g = tl.zeros([K_PAD], dtype=s_r.dtype)
    row_h = tl.zeros([K_PAD], dtype=s_r.dtype)
    abs_sum = tl.zeros([K_PAD], dtype=s_r.dtype)
    for c0 in range(0, n, BLOCK_C):
        dg, dh, da = _column_tile(s_ptr, y_ptr, gain_ptr, w_ptr, grad_ptr, hess_ptr, start, c0, n, k, sigma,
                                  sel, rows, s_r, y_r, g_r, d_r, w_r, WEIGHTING, HAS_WEIGHTS, BLOCK_C, K_PAD)
        row_g += dg
        row_h += dh
        abs_sum += da
    tl.debug_barrier()  # the column sums are written: the rows add theirs
    tl.store(grad_ptr + start + sel, tl.load(grad_ptr + start + sel, mask=rows, other=0.0).to(row_g.dtype) + row_g,
             mask=rows)
    tl.store(hess_ptr + start + sel, tl.load(hess_ptr + start + sel, mask=rows, other=0.0).to(row_h.dtype) + row_h,
             mask=rows)
    if NORMALIZE:  # LightGBM's log2(1 + S) / S, S = 2σ Σ|λ| over the query's pairs (unweighted)
        total = 2.0 * sigma * tl.sum(abs_sum, 0)
        factor = tl.where(total > 0.0, tl.log2(1.0 + total) / tl.where(total > 0.0, total, 1.0), 1.0)
        tl.debug_barrier()
        _scale_query(grad_ptr, hess_ptr, start, n, factor, BLOCK_C, ROUND32)
    elif ROUND32:
        tl.debug_barrier()
        _scale_query(grad_ptr, hess_ptr, start, n, tl.full([], 1.0, y_r.dtype), BLOCK_C, ROUND32)


def warps_for(block: int) -> int:
    """Warps of a program holding ``block`` documents (8 for wide queries: up to 16 documents
    per thread in each of the query's register vectors, within 255 registers and no spills on
    sm_90 in float64; 16 warps would cap a thread at 128 registers and spill)."""
    return 4 if block <= 256 else 8


def length_buckets(offsets: torch.Tensor, device: torch.device | str) -> list[tuple[int, torch.Tensor]]:
    """[(BLOCK, query ids int32 on ``device``)]: the queries grouped by the power of two that
    holds their length (at least :data:`MIN_BLOCK`), built once per data set from the host
    ``offsets`` [Q + 1]; empty buckets left out.

    >>> [(b, q.tolist()) for b, q in length_buckets(torch.tensor([0, 3, 40, 41]), "cpu")]
    [(16, [0, 2]), (64, [1])]
    """
    sizes = (offsets[1:] - offsets[:-1]).cpu()
    if len(sizes) and int(sizes.max()) > MAX_BLOCK:
        raise ValueError(f"a query of {int(sizes.max())} documents: the flat kernel takes at most {MAX_BLOCK}")
    width = torch.clamp(sizes, min=1).double().log2().ceil().long().clamp(min=MIN_BLOCK.bit_length() - 1)
    out = []
    for power in width.unique().tolist():
        ids = torch.nonzero(width == power).flatten().to(torch.int32)
        out.append((1 << power, ids.to(device)))
    return out


def check_flat(scores: torch.Tensor, offsets: torch.Tensor, cutoff: int, **same: torch.Tensor | None) -> None:
    """The flat kernels' inputs, without a host sync: ``scores`` [N] float32 or float64,
    ``offsets`` [Q + 1] int64, a cutoff in 1..:data:`TOPK_MAX`, and every tensor of ``same``
    (None: absent) [N] in the scores' dtype. The error names the argument."""
    check_tensor(scores, "scores", ndim=1, kind="float")
    check_tensor(offsets, "offsets", ndim=1, kind="int")
    if offsets.dtype != torch.int64 or offsets.shape[0] < 1:
        raise ValueError(f"`offsets` has to be int64 [Q + 1], got a {offsets.dtype} tensor of shape "
                         f"{tuple(offsets.shape)}")
    if not 1 <= cutoff <= TOPK_MAX:
        raise ValueError(f"`cutoff` must be in 1..{TOPK_MAX}, got {cutoff}")
    for name, t in same.items():
        if t is not None:
            check_tensor(t, name, shape=tuple(scores.shape), kind="float")
            if t.dtype != scores.dtype:
                raise ValueError(f"`{name}` has to be {scores.dtype} as `scores`, got {t.dtype}")


def flat_lambdas_triton(scores: torch.Tensor, labels: torch.Tensor, offsets: torch.Tensor,
                        buckets: list[tuple[int, torch.Tensor]], *, gains: torch.Tensor | None, cutoff: int,
                        sigma: float = 1.0, normalize: bool = False,
                        weights: torch.Tensor | None = None,
                        out_dtype: torch.dtype | None = None, round32: bool = False,
                        workspace=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad, hess) [N] of the pairwise lambda objective over flat queries, computed in the
    labels' dtype: one launch per length bucket, no host sync.

    Args:
        scores, labels: [N] float32 or float64, labels in the scores' dtype; or float64 scores
            over float32 labels, rounded to float32 as the kernel reads them (no cast launched).
        offsets: [Q + 1] int64 on the device, the queries' bounds.
        buckets: :func:`length_buckets` of ``offsets``.
        gains: [N] each document's NDCG gain over its query's ideal DCG@cutoff, in the scores'
            dtype (the |ΔNDCG| weighting), or None (RankNet).
        cutoff: k, at most :data:`TOPK_MAX` (a query shorter than k ranks all its documents).
        sigma, normalize: the kernel's options.
        weights: [N] per-document weights (a pair weighs their mean), or None.
        out_dtype: grad's and hess's dtype (None: the labels'); float64 over float32 labels
            holds the float32 values (``.double()`` of them, with no launch).
        round32: the finished values rounded to float32 values (float64 in and out: the
            booster's ``quantized_grad`` pass, as ``.float().double()`` of its results, with no
            launch of its own).
        workspace: a :class:`~rankkit.kernels.workspace.Workspace` (or scope) that keeps
            grad and hess from call to call (they are then valid until the next call); None:
            new tensors.
    """
    if scores.dtype == torch.float64 and labels.dtype == torch.float32:  # rounded as they are read
        check_tensor(scores, "scores", ndim=1, kind="float")
        check_tensor(labels, "labels", shape=tuple(scores.shape), kind="float")
        check_flat(labels, offsets, cutoff, gains=gains, weights=weights)
    else:
        check_flat(scores, offsets, cutoff, labels=labels, gains=gains, weights=weights)
    scores, labels = scores.contiguous(), labels.contiguous()
    gains = None if gains is None else gains.contiguous()
    weights = None if weights is None else weights.contiguous()
    n = scores.shape[0]
    ws = workspace_or_fresh(workspace)
    grad = ws.empty("grad", n, labels.dtype if out_dtype is None else out_dtype, scores.device)
    hess = ws.empty("hess", n, grad.dtype, scores.device)
    k_pad = max(16, triton.next_power_of_2(cutoff))
    for block, queries in buckets:
        _flat_lambda_kernel[(queries.shape[0],)](
            scores, labels, scores if gains is None else gains, scores if weights is None else weights,
            offsets, queries, grad, hess, cutoff, float(sigma),
            WEIGHTING=0 if gains is None else 1, HAS_WEIGHTS=weights is not None, NORMALIZE=bool(normalize),
            BLOCK=block, BLOCK_C=min(block, BLOCK_C), K_PAD=k_pad, ROUND32=bool(round32), num_warps=warps_for(block))
    return grad, hess
