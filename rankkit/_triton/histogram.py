"""Triton level histogram of quantized gradients: (ΣG, ΣH, count) per (feature, node, code).

Gradients and hessians are quantized to integers first (Shi et al., "Quantized Training of
Gradient Boosting Decision Trees", NeurIPS 2022): g_q = round(g · S_g) with
S_g = (2^(b−1) − 1) / max|g| (hessians likewise), so that the sums are integers accumulated
with integer atomics -- exact and independent of the order in which the atomics land, unlike
float atomics. The histogram is ``hist[c, f, node, code]`` for channel c = 0 (Σg_q),
1 (Σh_q), 2 (count), as :func:`rankkit.boosting.tree.build_histograms` lays out its float sums.

One program per (tile of BLOCK_N documents, feature): it reads the tile's uint8 codes of the
feature (feature-major ``codes_t`` [F, N], coalesced), their nodes and quantized values, and
adds them into the global histogram with 64-bit integer atomics.

Notation: N documents, F features, K nodes of the level, 256 codes.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

N_CODES = 256


@triton.jit
def _histogram_kernel(codes_ptr, node_ptr, g_ptr, h_ptr, out_ptr, N, n_nodes,
                      BLOCK_N: tl.constexpr):
    """Add one tile of documents of one feature into out [3, F, K, 256] (int64)."""
    f = tl.program_id(1)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    inside = n < N
    code = tl.load(codes_ptr + f.to(tl.int64) * N + n, mask=inside, other=0).to(tl.int64)
    node = tl.load(node_ptr + n, mask=inside, other=0).to(tl.int64)
    g = tl.load(g_ptr + n, mask=inside, other=0).to(tl.int64)
    h = tl.load(h_ptr + n, mask=inside, other=0).to(tl.int64)
    plane = tl.num_programs(1).to(tl.int64) * n_nodes * 256  # one channel: F · K · 256
    slot = (f.to(tl.int64) * n_nodes + node) * 256 + code
    tl.atomic_add(out_ptr + slot, g, mask=inside)
    tl.atomic_add(out_ptr + plane + slot, h, mask=inside)
    tl.atomic_add(out_ptr + 2 * plane + slot, tl.full([BLOCK_N], 1, tl.int64), mask=inside)


def quantize(values: torch.Tensor, bits: int = 16) -> tuple[torch.Tensor, float]:
    """Round ``values`` [N] to int32 in [−(2^(b−1) − 1), 2^(b−1) − 1]; returns (q, scale) with
    values ≈ q / scale."""
    top = float(values.abs().max()) if values.numel() else 0.0
    scale = (2 ** (bits - 1) - 1) / top if top > 0 else 1.0
    return torch.round(values * scale).to(torch.int32), scale


def level_histogram_triton(codes_t: torch.Tensor, node: torch.Tensor, grad_q: torch.Tensor,
                           hess_q: torch.Tensor, n_nodes: int, *,
                           block_n: int = 256) -> torch.Tensor:
    """Integer histograms of a level.

    Args:
        codes_t: [F, N] uint8 codes, feature-major.
        node: [N] int32 or int64, each document's node in 0..n_nodes−1.
        grad_q, hess_q: [N] int32 quantized gradients and hessians (see :func:`quantize`).
        n_nodes: K.
        block_n: documents per program.
    Returns:
        [3, F, K, 256] int64: channel 0 Σg_q, 1 Σh_q, 2 the document count.
    """
    n_feat, n = codes_t.shape
    out = torch.zeros(3, n_feat, n_nodes, N_CODES, dtype=torch.int64, device=codes_t.device)
    if n == 0 or n_feat == 0:
        return out
    grid = (triton.cdiv(n, block_n), n_feat)
    _histogram_kernel[grid](codes_t.contiguous(), node.contiguous(), grad_q.contiguous(),
                            hess_q.contiguous(), out, n, n_nodes, BLOCK_N=block_n)
    return out
