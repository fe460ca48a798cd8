"""Fused Triton lambda kernel: RankNet / LambdaRank (NDCG) grad, hess and (optionally) the
pair loss, with no pair buffers.

The maths is that of :func:`rankkit.lambdas.lambda_gradients` (Burges, "From RankNet to
LambdaRank to LambdaMART: An Overview", MSR-TR-2010-82, 2010). For a pair with y_i > y_j::

    ρ_ij = 1 / (1 + exp(σ (s_i − s_j)))
    grad_i += −σ |ΔZ_ij| ρ_ij,   grad_j −= −σ |ΔZ_ij| ρ_ij
    hess_i, hess_j += σ² |ΔZ_ij| ρ_ij (1 − ρ_ij)
    loss_q += |ΔZ_ij| log(1 + exp(−σ (s_i − s_j)))

with |ΔZ| = 1 ("ranknet") or |ΔNDCG@k| = |G_i − G_j| |D(r_i) − D(r_j)| ("ndcg"),
G = (2^y − 1) / IDCG@k (or y / IDCG@k, linear gain), D(r) = 1 / log2(2 + r) for r < k, else 0,
and r the 0-based rank under the current scores (ties in score: lower label first, then
index order -- :func:`rankkit.lambdas.ranking.rank_order`). Only pairs with min(r_i, r_j) < k take
part (truncation).

Two launches, both without [Q, L, L] temporaries:

1. :func:`_rank_kernel`, one program per query: the rank of every real document, the
   inverse permutation ``order`` (rank → document), the number of real documents and
   1 / IDCG@k, by counting (for each document, the documents ranked before it; the ideal rank
   likewise by label) over column tiles -- no sort. Its loops stop at the query's last real
   document (``bound``), so a short query in a long padded batch costs its own length.
2. :func:`_lambda_kernel`, one program per (query, tile of BLOCK_R rank positions): the rows
   are documents in rank order, so the truncation skips work instead of masking it -- a row
   at rank ≥ k visits only the k columns of the top, a row above k every column: O(k·n) per
   query of n documents instead of O(L²). Row tiles past the query's n real documents do no
   work at all (length-aware: the padded tiles cost a launch slot, nothing else). Each pair
   is evaluated by both of its documents' programs (no atomics: every output is written once
   and the result is deterministic); the loss takes each pair once, from its higher-label
   side, as one partial sum per program, added up on the host side of the kernel.

Notation: Q queries, L padded list length, n a query's real documents.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

WEIGHTING_CODES = {"ranknet": 0, "ndcg": 1}
# Cutoffs up to this take the top-k selection (k passes over the query) instead of ranking every
# document by counting (n passes' worth of comparisons).
TOPK_MAX = 32
GAIN_CODES = {"exp": 0, "linear": 1}


@triton.jit
def _rank_kernel(s_ptr, y_ptr, m_ptr, bound_ptr, rank_ptr, order_ptr, n_ptr, inv_idcg_ptr, L, k,
                 GAIN: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Ranks [Q, L] (int32, L on padding), order [Q, L] (the document at each rank < n),
    n [Q] (int32) and 1 / IDCG@k [Q] of one query per program."""
    q = tl.program_id(0)
    base = q.to(tl.int64) * L
    bound = tl.load(bound_ptr + q)  # last real document + 1
    # Accumulated per lane in the scores' dtype (a scalar 0.0 would start as fp32 and break
    # the float64 compile: "loop-carried variable has initial type fp32").
    idcg = tl.zeros([BLOCK_R], dtype=s_ptr.dtype.element_ty)
    n_real = tl.zeros([BLOCK_R], dtype=tl.int32)
    for r0 in range(0, bound, BLOCK_R):
        i = r0 + tl.arange(0, BLOCK_R)
        in_i = i < bound
        s_i = tl.load(s_ptr + base + i, mask=in_i, other=0.0)
        y_i = tl.load(y_ptr + base + i, mask=in_i, other=0.0)
        m_i = (tl.load(m_ptr + base + i, mask=in_i, other=0) != 0) & in_i
        rank = tl.zeros([BLOCK_R], dtype=tl.int32)
        ideal = tl.zeros([BLOCK_R], dtype=tl.int32)
        for c0 in range(0, bound, BLOCK_C):
            j = c0 + tl.arange(0, BLOCK_C)
            in_j = j < bound
            s_j = tl.load(s_ptr + base + j, mask=in_j, other=0.0)
            y_j = tl.load(y_ptr + base + j, mask=in_j, other=0.0)
            m_j = (tl.load(m_ptr + base + j, mask=in_j, other=0) != 0) & in_j
            sj, si = s_j[None, :], s_i[:, None]
            yj, yi = y_j[None, :], y_i[:, None]
            earlier = j[None, :] < i[:, None]
            before = (sj > si) | ((sj == si) & ((yj < yi) | ((yj == yi) & earlier)))
            ideal_before = (yj > yi) | ((yj == yi) & earlier)
            rank += tl.sum((before & m_j[None, :]).to(tl.int32), axis=1)
            ideal += tl.sum((ideal_before & m_j[None, :]).to(tl.int32), axis=1)
        if GAIN == 0:
            g_i = tl.exp2(y_i) - 1.0
        else:
            g_i = y_i
        disc = 1.0 / tl.log2(ideal.to(s_i.dtype) + 2.0)
        idcg += tl.where(m_i & (ideal < k), g_i * disc, 0.0)
        n_real += m_i.to(tl.int32)
        tl.store(rank_ptr + base + i, tl.where(m_i, rank, L), mask=in_i)
        tl.store(order_ptr + base + rank, i, mask=m_i)
    total = tl.sum(idcg, axis=0)
    tl.store(inv_idcg_ptr + q, tl.where(total > 0.0, 1.0 / total, 0.0))
    tl.store(n_ptr + q, tl.sum(n_real, axis=0))


@triton.jit
def _first_after(s_ptr, y_ptr, m_ptr, base, bound, s_p, y_p, i_p, first, BY_LABEL: tl.constexpr,
                 BLOCK: tl.constexpr):
    """The document that ranks first among those ranking after (s_p, y_p, i_p) -- every real
    document when ``first`` -- as (s, y, index, found). Ranking: higher score first, then lower
    label, then lower index (``BY_LABEL``: higher label first, then lower index)."""
    # In the scores' dtype (a loop-carried fp32 scalar would not compile for float64 scores).
    best_s = tl.full([], float("-inf"), s_p.dtype)
    best_y = tl.full([], float("inf"), s_p.dtype)
    best_i = bound
    for c0 in range(0, bound, BLOCK):
        j = c0 + tl.arange(0, BLOCK)
        in_j = j < bound
        m_j = (tl.load(m_ptr + base + j, mask=in_j, other=0) != 0) & in_j
        y_j = tl.load(y_ptr + base + j, mask=in_j, other=0.0)
        if BY_LABEL:
            s_j = y_j
            y_j = tl.zeros_like(y_j)
        else:
            s_j = tl.load(s_ptr + base + j, mask=in_j, other=0.0)
        after = (s_j < s_p) | ((s_j == s_p) & ((y_j > y_p) | ((y_j == y_p) & (j > i_p))))
        cand = m_j & (first | after)
        top_s = tl.max(tl.where(cand, s_j, -float("inf")), 0)
        cand = cand & (s_j == top_s)
        top_y = tl.min(tl.where(cand, y_j, float("inf")), 0)
        cand = cand & (y_j == top_y)
        top_i = tl.min(tl.where(cand, j, bound), 0)
        better = (top_i < bound) & ((top_s > best_s) | ((top_s == best_s) & (
            (top_y < best_y) | ((top_y == best_y) & (top_i < best_i)))))
        best_s = tl.where(better, top_s, best_s)
        best_y = tl.where(better, top_y, best_y)
        best_i = tl.where(better, top_i, best_i)
    return best_s, best_y, best_i


@triton.jit
def _topk_kernel(s_ptr, y_ptr, m_ptr, bound_ptr, order_ptr, n_ptr, inv_idcg_ptr, L, k,
                 GAIN: tl.constexpr, BLOCK: tl.constexpr):
    """The truncated ranking of one query per program, in O(k·n): order [Q, L] holds the top
    min(k, n) documents in rank order, then the other real documents in index order (their
    order does not matter: a pair with both below the top k takes no part, and a document
    below k has discount 0); n [Q] and 1 / IDCG@k [Q]. The top k come from k selection passes
    (each the first document ranking after the previous one), the ideal DCG@k likewise by label."""
    q = tl.program_id(0)
    base = q.to(tl.int64) * L
    bound = tl.load(bound_ptr + q)
    count = tl.zeros([BLOCK], dtype=tl.int32)
    for c0 in range(0, bound, BLOCK):
        j = c0 + tl.arange(0, BLOCK)
        count += ((tl.load(m_ptr + base + j, mask=j < bound, other=0) != 0) & (j < bound)).to(tl.int32)
    n = tl.sum(count, 0)
    kk = tl.minimum(k, n)
    zero = tl.full([], 0.0, s_ptr.dtype.element_ty)
    s_p, y_p, i_p = zero, zero, bound * 0
    idcg = zero
    for t in range(0, kk):
        s_p, y_p, i_p = _first_after(s_ptr, y_ptr, m_ptr, base, bound, s_p, y_p, i_p, t == 0,
                                     False, BLOCK)
        tl.store(order_ptr + base + t, i_p)
    # The other real documents, in index order, after the top k.
    placed = kk
    for c0 in range(0, bound, BLOCK):
        j = c0 + tl.arange(0, BLOCK)
        in_j = j < bound
        m_j = (tl.load(m_ptr + base + j, mask=in_j, other=0) != 0) & in_j
        s_j = tl.load(s_ptr + base + j, mask=in_j, other=0.0)
        y_j = tl.load(y_ptr + base + j, mask=in_j, other=0.0)
        after = (s_j < s_p) | ((s_j == s_p) & ((y_j > y_p) | ((y_j == y_p) & (j > i_p))))
        rest = m_j & after  # (no real document: nothing to place)
        at = placed + tl.cumsum(rest.to(tl.int32), 0) - 1
        tl.store(order_ptr + base + at, j, mask=rest)
        placed += tl.sum(rest.to(tl.int32), 0)
    # Ideal DCG@k: the k largest labels.
    l_p, i_p = zero, bound * 0
    for t in range(0, kk):
        l_p, _, i_p = _first_after(s_ptr, y_ptr, m_ptr, base, bound, l_p, zero, i_p, t == 0,
                                   True, BLOCK)
        if GAIN == 0:
            g = tl.exp2(l_p) - 1.0
        else:
            g = l_p
        idcg += g / tl.log2(zero + (t + 2))
    tl.store(inv_idcg_ptr + q, tl.where(idcg > 0.0, 1.0 / idcg, 0.0))
    tl.store(n_ptr + q, n)


@triton.jit
def _pair_tile(s_ptr, y_ptr, w_ptr, order_ptr, base, c0, stop, k, sigma, inv_idcg,
               a, in_a, s_i, y_i, g_i, d_i, w_i,
               WEIGHTING: tl.constexpr, GAIN: tl.constexpr, HAS_WEIGHTS: tl.constexpr,
               WITH_LOSS: tl.constexpr, BLOCK_C: tl.constexpr):
    """The rows' (grad, hess, loss) terms from the columns at rank positions c0 … c0 + BLOCK_C."""
    b = c0 + tl.arange(0, BLOCK_C)
    in_b = b < stop
    j = tl.load(order_ptr + base + b, mask=in_b, other=0)
    s_j = tl.load(s_ptr + base + j, mask=in_b, other=0.0)
    y_j = tl.load(y_ptr + base + j, mask=in_b, other=0.0)
    sgn = tl.where(y_i[:, None] > y_j[None, :], 1.0,
                   tl.where(y_i[:, None] < y_j[None, :], -1.0, 0.0))
    top = tl.minimum(a[:, None], b[None, :]) < k
    live = in_a[:, None] & in_b[None, :] & top & (sgn != 0.0)
    if WEIGHTING == 0:
        dz = tl.where(live, 1.0, 0.0)
    else:
        if GAIN == 0:
            g_j = (tl.exp2(y_j) - 1.0) * inv_idcg
        else:
            g_j = y_j * inv_idcg
        d_j = tl.where(b < k, 1.0 / tl.log2(b.to(s_i.dtype) + 2.0), 0.0)
        dz = tl.where(live, tl.abs(g_i[:, None] - g_j[None, :]) * tl.abs(d_i[:, None] - d_j[None, :]), 0.0)
    if HAS_WEIGHTS:
        w_j = tl.load(w_ptr + base + j, mask=in_b, other=0.0)
        dz = dz * (0.5 * (w_i[:, None] + w_j[None, :]))
    # ρ = sigmoid(x), x = −σ sgn (s_i − s_j); with t = e^{−|x|} (no overflow):
    # ρ = 1/(1+t) if x >= 0 else t/(1+t), and ρ(1 − ρ) = t / (1 + t)².
    x = -sigma * sgn * (s_i[:, None] - s_j[None, :])
    t = tl.exp(-tl.abs(x))
    inv = 1.0 / (1.0 + t)
    rho = tl.where(x >= 0.0, inv, t * inv)
    grad = tl.sum(-sgn * sigma * dz * rho, axis=1)
    hess = tl.sum(sigma * sigma * dz * (t * inv * inv), axis=1)
    if WITH_LOSS:  # softplus(x) = max(x, 0) + log(1 + e^{−|x|}), from the higher label only
        loss = tl.sum(tl.where(sgn > 0.0, dz * (tl.maximum(x, 0.0) + tl.log(1.0 + t)), 0.0), axis=1)
    else:
        loss = tl.zeros_like(grad)
    return grad, hess, loss


@triton.jit
def _lambda_kernel(s_ptr, y_ptr, order_ptr, n_ptr, inv_idcg_ptr, w_ptr, grad_ptr, hess_ptr,
                   loss_ptr, L, k, sigma, n_tiles,
                   WEIGHTING: tl.constexpr, GAIN: tl.constexpr, HAS_WEIGHTS: tl.constexpr,
                   WITH_LOSS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                   BLOCK_K: tl.constexpr):
    """grad and hess of the documents at rank positions tile·BLOCK_R … of one query (and the
    tile's partial loss), looping over the column positions that can pair with them: every
    real one in tiles of BLOCK_C for a tile that reaches into the top k, only the top k in
    tiles of BLOCK_K (≥ k, so one tile when k ≤ BLOCK_K) for the others."""
    q = tl.program_id(0)
    tile = tl.program_id(1)
    a0 = tile * BLOCK_R
    a = a0 + tl.arange(0, BLOCK_R)
    base = q.to(tl.int64) * L
    n = tl.load(n_ptr + q)
    in_a = a < n
    i = tl.load(order_ptr + base + a, mask=in_a, other=0)
    s_i = tl.load(s_ptr + base + i, mask=in_a, other=0.0)
    y_i = tl.load(y_ptr + base + i, mask=in_a, other=0.0)
    inv_idcg = tl.load(inv_idcg_ptr + q)
    if GAIN == 0:
        g_i = (tl.exp2(y_i) - 1.0) * inv_idcg
    else:
        g_i = y_i * inv_idcg
    d_i = tl.where(a < k, 1.0 / tl.log2(a.to(s_i.dtype) + 2.0), 0.0)
    if HAS_WEIGHTS:
        w_i = tl.load(w_ptr + base + i, mask=in_a, other=0.0)
    else:
        w_i = s_i
    grad = tl.zeros([BLOCK_R], dtype=s_i.dtype)
    hess = tl.zeros([BLOCK_R], dtype=s_i.dtype)
    loss = tl.zeros([BLOCK_R], dtype=s_i.dtype)
    if a0 < n:  # a tile past the last real document does nothing (length-aware)
        if a0 < k:
            for c0 in range(0, n, BLOCK_C):
                dg, dh, dl = _pair_tile(s_ptr, y_ptr, w_ptr, order_ptr, base, c0, n, k, sigma,
                                        inv_idcg, a, in_a, s_i, y_i, g_i, d_i, w_i, WEIGHTING, GAIN,
                                        HAS_WEIGHTS, WITH_LOSS, BLOCK_C)
                grad += dg
                hess += dh
                loss += dl
        else:
            top = tl.minimum(k, n)
            for c0 in range(0, top, BLOCK_K):
                dg, dh, dl = _pair_tile(s_ptr, y_ptr, w_ptr, order_ptr, base, c0, top, k, sigma,
                                        inv_idcg, a, in_a, s_i, y_i, g_i, d_i, w_i, WEIGHTING, GAIN,
                                        HAS_WEIGHTS, WITH_LOSS, BLOCK_K)
                grad += dg
                hess += dh
                loss += dl
    tl.store(grad_ptr + base + i, grad, mask=in_a)
    tl.store(hess_ptr + base + i, hess, mask=in_a)
    if WITH_LOSS:
        tl.store(loss_ptr + q.to(tl.int64) * n_tiles + tile, tl.sum(loss, axis=0))


def lambda_gradients_triton(scores: torch.Tensor, labels: torch.Tensor, *,
                            mask: torch.Tensor | None = None, weighting: str = "ranknet",
                            sigma: float = 1.0, k: int | None = None, gain: str = "exp",
                            weights: torch.Tensor | None = None, return_loss: bool = False,
                            block_r: int = 16, block_c: int = 32, topk_block: int = 256):
    """The fused kernel's (grad, hess[, loss]); the same values as
    :func:`rankkit.lambdas.lambda_gradients` for ``weighting`` "ranknet" or "ndcg" (no
    ``normalize``, ``tie_term``, ``groups``, ``pair_weights``).

    Args:
        scores: [Q, L] float32 or float64 scores (CUDA, or CPU under ``TRITON_INTERPRET=1``).
        labels: [Q, L] relevance labels (converted to the dtype of ``scores``).
        mask: [Q, L] bool, True on real documents (anywhere in the row); None means all True.
        weighting: "ranknet" or "ndcg".
        sigma: σ > 0.
        k: truncation / NDCG cutoff, None for the whole list.
        gain: "exp" (2^y − 1) or "linear" (y).
        weights: [Q, L] per-document weights (a pair weighs their mean), or None.
        return_loss: also return the loss [Q] (Σ of the pair costs of each query).
        block_r, block_c: the row and column tile sizes (powers of two). 16 × 32 with 4
            warps keeps the float64 kernel with the loss at 126 registers and no spills on
            sm_90 (32 × 64 spills in float64; see docs/gpu.md).
        topk_block: the documents per step of the top-k selection (``k`` ≤ 32).
    Returns:
        (grad, hess), each [Q, L] in the dtype of ``scores``, zero on padding; with
        ``return_loss`` also loss [Q]. No host synchronisation: 2 launches (3 with the loss,
        whose per-tile partial sums are added by one reduction).
    """
    if weighting not in WEIGHTING_CODES:
        raise ValueError(f"`weighting` must be one of {tuple(WEIGHTING_CODES)}, got {weighting!r}")
    if gain not in GAIN_CODES:
        raise ValueError(f"`gain` must be one of {tuple(GAIN_CODES)}, got {gain!r}")
    if scores.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"`scores` must be float32 or float64, got {scores.dtype}")
    n_queries, n_docs = scores.shape
    s = scores.detach().contiguous()
    y = labels.detach().to(s.dtype).contiguous()
    device = s.device
    if mask is None:
        m = torch.ones_like(s, dtype=torch.uint8)
        bound = torch.full((n_queries,), n_docs, dtype=torch.int32, device=device)
    else:
        m = mask.to(torch.uint8).contiguous()
        # The last real document + 1 of each query (the kernels' loop bound), on the device.
        position = torch.arange(1, n_docs + 1, dtype=torch.int32, device=device)
        bound = (m.to(torch.int32) * position).amax(1).to(torch.int32) if n_docs else \
            torch.zeros(n_queries, dtype=torch.int32, device=device)
    w = s if weights is None else weights.detach().to(s.dtype).contiguous()
    cutoff = n_docs if k is None else min(k, n_docs)
    grad, hess = torch.zeros_like(s), torch.zeros_like(s)
    n_tiles = triton.cdiv(n_docs, block_r) if n_docs else 0
    loss_part = torch.zeros(n_queries, max(n_tiles, 1), dtype=s.dtype, device=device)
    if n_queries == 0 or n_docs == 0:
        return (grad, hess, loss_part.sum(1)) if return_loss else (grad, hess)
    order = torch.empty(n_queries, n_docs, dtype=torch.int32, device=device)
    n_real = torch.empty(n_queries, dtype=torch.int32, device=device)
    inv_idcg = torch.empty(n_queries, dtype=s.dtype, device=device)
    if cutoff <= TOPK_MAX and cutoff < n_docs:  # k selection passes: O(k·n) per query
        _topk_kernel[(n_queries,)](s, y, m, bound, order, n_real, inv_idcg, n_docs, cutoff,
                                   GAIN=GAIN_CODES[gain], BLOCK=topk_block)
    else:  # every rank, by counting: O(n²) per query
        rank = torch.empty(n_queries, n_docs, dtype=torch.int32, device=device)
        _rank_kernel[(n_queries,)](s, y, m, bound, rank, order, n_real, inv_idcg, n_docs, cutoff,
                                   GAIN=GAIN_CODES[gain], BLOCK_R=32, BLOCK_C=64)
    _lambda_kernel[(n_queries, n_tiles)](
        s, y, order, n_real, inv_idcg, w, grad, hess, loss_part, n_docs, cutoff, float(sigma),
        n_tiles, WEIGHTING=WEIGHTING_CODES[weighting], GAIN=GAIN_CODES[gain],
        HAS_WEIGHTS=weights is not None, WITH_LOSS=bool(return_loss), BLOCK_R=block_r,
        BLOCK_C=block_c, BLOCK_K=min(block_c, max(16, triton.next_power_of_2(cutoff))))
    return (grad, hess, loss_part.sum(1)) if return_loss else (grad, hess)
