"""The weightings of the lambda kernel: how much a pair counts (the |ΔZ| of LambdaRank).

A :class:`Weighting` gives per-document terms, computed once per query in rank order, and a
pair rule that combines the terms of the two documents of a pair elementwise; the kernel
(:func:`rankkit.lambdas.lambda_gradients`) does the rest. :data:`WEIGHTINGS` is the one place
where weighting names become behaviour.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from rankkit._ranking import discounts, gain_values, ideal_dcg

Terms = tuple[torch.Tensor, ...]


class Weighting(NamedTuple):
    """How much a pair counts: the |ΔZ| of LambdaRank, as per-document terms and a pair rule.

    Attributes:
        doc_terms: ``(labels, mask, k, gain, max_err_label) -> Terms``. ``labels`` [Q, L]
            (float) and ``mask`` [Q, L] (bool) are in rank order (position 0 is the current
            top document, padding last); ``k`` is the cutoff (L when there is none). Each
            returned term is [Q, L] or [1, L] (when it depends on the position only).
        signed_delta: ``(rows, cols, out) -> W``, with ``rows`` the terms at the top positions
            a and ``cols`` those at the lower positions b > a, as views that broadcast to the
            block's pair shape (query-major [Q|1, r, 1] and [Q|1, 1, c], or query-minor
            [r, 1, Q|1] and [1, c, Q|1]: use elementwise operations only). Writes into ``out``
            and returns W = −ΔZ_ab, the drop in the metric when a and b swap, so
            W = sign(y_a − y_b) |ΔZ_ab| (Z rewards putting higher labels first).
        tie_weight: |ΔZ| of a pair with equal labels, used by ``tie_term=True``.
    """

    doc_terms: Callable[..., Terms]
    signed_delta: Callable[[Terms, Terms, torch.Tensor], torch.Tensor]
    tie_weight: float


def _ranknet_terms(labels, mask, k, gain, max_err_label) -> Terms:
    return (labels,)


def _ranknet_delta(rows: Terms, cols: Terms, out: torch.Tensor) -> torch.Tensor:
    return torch.sub(rows[0], cols[0], out=out).sign_()


def _ndcg_terms(labels, mask, k, gain, max_err_label) -> Terms:
    # NDCG@k = Σ_p G_p D_p with G the gain over the ideal DCG@k and D the discount (0 from k on).
    idcg = ideal_dcg(labels, mask, k=k, gain=gain)
    scale = torch.where(idcg > 0, 1.0 / idcg.clamp(min=torch.finfo(idcg.dtype).tiny), 0.0)
    g = (gain_values(labels, gain) * scale[:, None]).masked_fill(~mask, 0.0)
    d = discounts(labels.shape[1], dtype=labels.dtype, device=labels.device)
    d = torch.where(torch.arange(labels.shape[1], device=labels.device) < k, d, 0.0)
    return g, d[None, :]


def _ndcg_delta(rows: Terms, cols: Terms, out: torch.Tensor) -> torch.Tensor:
    # Swapping a and b changes NDCG by (G_b − G_a)(D_a − D_b).
    return torch.sub(rows[0], cols[0], out=out).mul_(rows[1] - cols[1])


def _map_terms(labels, mask, k, gain, max_err_label) -> Terms:
    # AP@k = (1 / N) Σ_{p<k} rel_p c_p / (p + 1), rel = label > 0, c the inclusive count of
    # relevant documents, N = min(#relevant, k) (as LightGBM's MAP@k). With δ = rel_b − rel_a,
    # swapping positions a < b (a < k) changes AP@k by δ (X_a + Y_b + rel_b inv_a), where
    # inv = 1/((p+1) N), H = cumsum(rel inv), X = c inv − H, and Y = H(min(b, k−1)) − [b<k] (c_b
    # + rel_b) inv_b. (Own-term change at a, at b, and ±1/(p+1) for every relevant p in between.)
    rel = ((labels > 0) & mask).to(labels.dtype)
    n = labels.shape[1]
    pos = torch.arange(n, device=labels.device)
    norm = rel.sum(1, keepdim=True).clamp(max=k)
    inv = torch.where(norm > 0, 1.0 / ((pos + 1.0) * norm.clamp(min=1.0)), 0.0)
    c = rel.cumsum(1)
    h = (rel * inv).cumsum(1)
    inside = pos < k
    h_k = torch.where(inside, h, h[:, min(k, n) - 1:min(k, n)])
    y = h_k - torch.where(inside, (c + rel) * inv, 0.0)
    return rel, c * inv - h, inv, y


def _map_delta(rows: Terms, cols: Terms, out: torch.Tensor) -> torch.Tensor:
    rel_a, x_a, inv_a, _ = rows
    rel_b, _, _, y_b = cols
    return torch.add(x_a, y_b, out=out).addcmul_(rel_b, inv_a).mul_(rel_a - rel_b)


def _err_terms(labels, mask, k, gain, max_err_label) -> Terms:
    # ERR@k = Σ_{p<k} R_p P_p / (p + 1), R = (2^y − 1) / 2^y_max, P_p = Π_{q<p} (1 − R_q)
    # (Chapelle et al. 2009). With M the inclusive prefix sum of the terms, swapping a < b
    # (a < k) changes ERR@k by (R_b − R_a) (P_a/(a+1) − (T_b − M_a) / (1 − R_a)), where
    # T_b = M_{b−1} + P_b/(b+1) for b < k and M_{k−1} otherwise. So −ΔERR = ΔR (U_a − T_b V_a).
    n = labels.shape[1]
    pos = torch.arange(n, device=labels.device)
    r = ((torch.exp2(labels) - 1.0) / 2.0 ** max_err_label).masked_fill(~mask, 0.0)
    p = torch.cumprod(torch.cat([torch.ones_like(r[:, :1]), 1.0 - r[:, :-1]], dim=1), dim=1)
    inside = pos < k
    stop = torch.where(inside, p / (pos + 1.0), 0.0)
    m = (r * stop).cumsum(1)
    t = torch.where(inside, m - r * stop + stop, m[:, min(k, n) - 1:min(k, n)])
    v = 1.0 / (1.0 - r)
    return r, p / (pos + 1.0) + m * v, v, t


def _err_delta(rows: Terms, cols: Terms, out: torch.Tensor) -> torch.Tensor:
    r_a, u_a, v_a, _ = rows
    r_b, _, _, t_b = cols
    return torch.mul(t_b, v_a, out=out).neg_().add_(u_a).mul_(r_a - r_b)


# The one place where weighting names become behaviour.
WEIGHTINGS: dict[str, Weighting] = {
    "ranknet": Weighting(_ranknet_terms, _ranknet_delta, tie_weight=1.0),
    "ndcg": Weighting(_ndcg_terms, _ndcg_delta, tie_weight=0.0),
    "map": Weighting(_map_terms, _map_delta, tie_weight=0.0),
    "err": Weighting(_err_terms, _err_delta, tie_weight=0.0),
}
