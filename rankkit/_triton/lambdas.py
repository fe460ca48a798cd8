"""Fused Triton lambda kernel: RankNet / LambdaRank (NDCG) grad and hess with no pair buffers.

The maths is that of :func:`rankkit.lambdas.lambda_gradients` (Burges, "From RankNet to
LambdaRank to LambdaMART: An Overview", MSR-TR-2010-82, 2010). For a pair with y_i > y_j::

    ρ_ij = 1 / (1 + exp(σ (s_i − s_j)))
    grad_i += −σ |ΔZ_ij| ρ_ij,   grad_j −= −σ |ΔZ_ij| ρ_ij
    hess_i, hess_j += σ² |ΔZ_ij| ρ_ij (1 − ρ_ij)

with |ΔZ| = 1 ("ranknet") or |ΔNDCG@k| = |G_i − G_j| |D(r_i) − D(r_j)| ("ndcg"),
G = (2^y − 1) / IDCG@k (or y / IDCG@k, linear gain), D(r) = 1 / log2(2 + r) for r < k, else 0,
and r the 0-based rank under the current scores (ties in score: lower label first, then
index order, padding last -- :func:`rankkit._ranking.rank_order`). Only pairs with
min(r_i, r_j) < k take part (truncation).

Two launches, both without [Q, L, L] temporaries:

1. :func:`_rank_kernel`, one program per query: the rank of every document and 1 / IDCG@k, by
   counting (for each document, the documents ranked before it; the ideal rank likewise by
   label) over column tiles -- O(L²) comparisons, no sort.
2. :func:`_lambda_kernel`, one program per (query, tile of BLOCK_R rows): the rows' grad and
   hess accumulate in registers while the program loops over tiles of BLOCK_C columns. Each
   pair is evaluated by both of its documents' programs (twice the arithmetic of a triangle,
   but no atomics: the result is deterministic and every output is written once).

Notation: Q queries, L padded list length.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

WEIGHTING_CODES = {"ranknet": 0, "ndcg": 1}
GAIN_CODES = {"exp": 0, "linear": 1}


@triton.jit
def _rank_kernel(s_ptr, y_ptr, m_ptr, rank_ptr, inv_idcg_ptr, L, k,
                 GAIN: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Ranks [Q, L] (int32, L on padding) and 1 / IDCG@k [Q] of one query per program."""
    q = tl.program_id(0)
    base = q.to(tl.int64) * L
    idcg = 0.0
    for r0 in range(0, L, BLOCK_R):
        i = r0 + tl.arange(0, BLOCK_R)
        in_i = i < L
        s_i = tl.load(s_ptr + base + i, mask=in_i, other=0.0)
        y_i = tl.load(y_ptr + base + i, mask=in_i, other=0.0)
        m_i = tl.load(m_ptr + base + i, mask=in_i, other=0) != 0
        rank = tl.zeros([BLOCK_R], dtype=tl.int32)
        ideal = tl.zeros([BLOCK_R], dtype=tl.int32)
        for c0 in range(0, L, BLOCK_C):
            j = c0 + tl.arange(0, BLOCK_C)
            in_j = j < L
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
        disc = 1.0 / tl.log2(ideal.to(y_i.dtype) + 2.0)
        idcg += tl.sum(tl.where(m_i & in_i & (ideal < k), g_i * disc, 0.0), axis=0)
        tl.store(rank_ptr + base + i, tl.where(m_i, rank, L), mask=in_i)
    tl.store(inv_idcg_ptr + q, tl.where(idcg > 0.0, 1.0 / idcg, 0.0))


@triton.jit
def _lambda_kernel(s_ptr, y_ptr, m_ptr, rank_ptr, inv_idcg_ptr, w_ptr, grad_ptr, hess_ptr,
                   L, k, sigma,
                   WEIGHTING: tl.constexpr, GAIN: tl.constexpr, HAS_WEIGHTS: tl.constexpr,
                   BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """grad and hess of BLOCK_R rows of one query, looping over column tiles."""
    q = tl.program_id(0)
    i = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    base = q.to(tl.int64) * L
    in_i = i < L
    s_i = tl.load(s_ptr + base + i, mask=in_i, other=0.0)
    y_i = tl.load(y_ptr + base + i, mask=in_i, other=0.0)
    m_i = (tl.load(m_ptr + base + i, mask=in_i, other=0) != 0) & in_i
    r_i = tl.load(rank_ptr + base + i, mask=in_i, other=0)
    inv_idcg = tl.load(inv_idcg_ptr + q)
    if GAIN == 0:
        g_i = (tl.exp2(y_i) - 1.0) * inv_idcg
    else:
        g_i = y_i * inv_idcg
    d_i = tl.where(r_i < k, 1.0 / tl.log2(r_i.to(s_i.dtype) + 2.0), 0.0)
    if HAS_WEIGHTS:
        w_i = tl.load(w_ptr + base + i, mask=in_i, other=0.0)
    grad = tl.zeros([BLOCK_R], dtype=s_i.dtype)
    hess = tl.zeros([BLOCK_R], dtype=s_i.dtype)
    for c0 in range(0, L, BLOCK_C):
        j = c0 + tl.arange(0, BLOCK_C)
        in_j = j < L
        s_j = tl.load(s_ptr + base + j, mask=in_j, other=0.0)
        y_j = tl.load(y_ptr + base + j, mask=in_j, other=0.0)
        m_j = (tl.load(m_ptr + base + j, mask=in_j, other=0) != 0) & in_j
        r_j = tl.load(rank_ptr + base + j, mask=in_j, other=0)
        sgn = tl.where(y_i[:, None] > y_j[None, :], 1.0, tl.where(y_i[:, None] < y_j[None, :], -1.0, 0.0))
        top = tl.minimum(r_i[:, None], r_j[None, :]) < k
        live = m_i[:, None] & m_j[None, :] & top & (sgn != 0.0)
        if WEIGHTING == 0:
            dz = tl.where(live, 1.0, 0.0)
        else:
            if GAIN == 0:
                g_j = (tl.exp2(y_j) - 1.0) * inv_idcg
            else:
                g_j = y_j * inv_idcg
            d_j = tl.where(r_j < k, 1.0 / tl.log2(r_j.to(s_i.dtype) + 2.0), 0.0)
            dz = tl.where(live, tl.abs(g_i[:, None] - g_j[None, :]) * tl.abs(d_i[:, None] - d_j[None, :]), 0.0)
        if HAS_WEIGHTS:
            w_j = tl.load(w_ptr + base + j, mask=in_j, other=0.0)
            dz = dz * (0.5 * (w_i[:, None] + w_j[None, :]))
        # ρ = sigmoid(x), x = −σ sgn (s_i − s_j); with t = e^{−|x|} (no overflow):
        # ρ = 1/(1+t) if x >= 0 else t/(1+t), and ρ(1 − ρ) = t / (1 + t)².
        x = -sigma * sgn * (s_i[:, None] - s_j[None, :])
        t = tl.exp(-tl.abs(x))
        inv = 1.0 / (1.0 + t)
        rho = tl.where(x >= 0.0, inv, t * inv)
        grad += tl.sum(-sgn * sigma * dz * rho, axis=1)
        hess += tl.sum(sigma * sigma * dz * (t * inv * inv), axis=1)
    tl.store(grad_ptr + base + i, grad, mask=in_i)
    tl.store(hess_ptr + base + i, hess, mask=in_i)


def lambda_gradients_triton(scores: torch.Tensor, labels: torch.Tensor, *,
                            mask: torch.Tensor | None = None, weighting: str = "ranknet",
                            sigma: float = 1.0, k: int | None = None, gain: str = "exp",
                            weights: torch.Tensor | None = None, block_r: int = 32,
                            block_c: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused kernel's (grad, hess); the same values as :func:`rankkit.lambdas.lambda_gradients`
    for ``weighting`` "ranknet" or "ndcg" (no ``normalize``, ``tie_term``, ``groups``, loss).

    Args:
        scores: [Q, L] float32 or float64 scores (CUDA, or CPU under ``TRITON_INTERPRET=1``).
        labels: [Q, L] relevance labels (converted to the dtype of ``scores``).
        mask: [Q, L] bool, True on real documents; None means all True.
        weighting: "ranknet" or "ndcg".
        sigma: σ > 0.
        k: truncation / NDCG cutoff, None for the whole list.
        gain: "exp" (2^y − 1) or "linear" (y).
        weights: [Q, L] per-document weights (a pair weighs their mean), or None.
        block_r, block_c: the row and column tile sizes (powers of two).
    Returns:
        (grad, hess), each [Q, L] in the dtype of ``scores``, zero on padding.
    """
    if weighting not in WEIGHTING_CODES:
        raise ValueError(f"`weighting` must be one of {tuple(WEIGHTING_CODES)}, got {weighting!r}")
    if gain not in GAIN_CODES:
        raise ValueError(f"`gain` must be one of {tuple(GAIN_CODES)}, got {gain!r}")
    n_queries, n_docs = scores.shape
    s = scores.detach().contiguous()
    y = labels.detach().to(s.dtype).contiguous()
    m = (torch.ones_like(s, dtype=torch.uint8) if mask is None else mask.to(torch.uint8)).contiguous()
    w = s if weights is None else weights.detach().to(s.dtype).contiguous()
    cutoff = n_docs if k is None else min(k, n_docs)
    rank = torch.empty(n_queries, n_docs, dtype=torch.int32, device=s.device)
    inv_idcg = torch.empty(n_queries, dtype=s.dtype, device=s.device)
    grad, hess = torch.empty_like(s), torch.empty_like(s)
    if n_queries == 0 or n_docs == 0:
        return grad, hess
    _rank_kernel[(n_queries,)](s, y, m, rank, inv_idcg, n_docs, cutoff, GAIN=GAIN_CODES[gain],
                               BLOCK_R=block_r, BLOCK_C=block_c)
    grid = (n_queries, triton.cdiv(n_docs, block_r))
    _lambda_kernel[grid](s, y, m, rank, inv_idcg, w, grad, hess, n_docs, cutoff, float(sigma),
                         WEIGHTING=WEIGHTING_CODES[weighting], GAIN=GAIN_CODES[gain],
                         HAS_WEIGHTS=weights is not None, BLOCK_R=block_r, BLOCK_C=block_c)
    return grad, hess
