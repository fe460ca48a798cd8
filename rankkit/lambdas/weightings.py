"""The weightings of the lambda kernel: how much a pair counts (the |ΔZ| of LambdaRank).

A :class:`Weighting` gives per-document terms, computed once per query in rank order, and a
pair rule that combines the terms of the two documents of a pair elementwise; the kernel
(:func:`rankkit.lambdas.lambda_gradients`) does the rest. :data:`WEIGHTINGS` is the one place
where weighting names become behaviour.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from rankkit.lambdas.ranking import discounts, gain_shift, gain_values, ideal_dcg

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
        plan_terms: None, or ``(labels, mask, k, gain, max_err_label, grades=None) ->
            (per_document, per_position)`` (``grades``: the plan's ``QueryPlan.grades``): the
            part of the terms that does not depend on the ranking, computed once per data set
            (:class:`rankkit.lambdas.plan.QueryPlan`) from ``labels`` and ``mask`` in document
            order. ``per_document`` are [Q, L] terms that the kernel puts into rank order each
            call, ``per_position`` [1, L] terms it passes as they are;
            ``doc_terms`` then gets both as ``constants=(ranked per_document, per_position)``.
    """

    doc_terms: Callable[..., Terms]
    signed_delta: Callable[[Terms, Terms, torch.Tensor], torch.Tensor]
    tie_weight: float
    plan_terms: Callable[..., tuple[Terms, Terms]] | None = None


def _ranknet_terms(labels, mask, k, gain, max_err_label) -> Terms:
    return (labels,)


def _ranknet_delta(rows: Terms, cols: Terms, out: torch.Tensor) -> torch.Tensor:
    return torch.sub(rows[0], cols[0], out=out).sign_()


def _ndcg_plan_terms(labels, mask, k, gain, max_err_label, grades=None) -> tuple[Terms, Terms]:
    # NDCG@k = Σ_p G_p D_p with G the gain over the ideal DCG@k and D the discount (0 from k on).
    # Gains and ideal DCG are both over the query's top gain 2^ymax: no grade overflows. Both
    # are the same whatever the order of the documents: G is computed once per data set.
    shift = gain_shift(labels, mask, gain)
    idcg = ideal_dcg(labels, mask, k=k, gain=gain, shift=shift, grades=grades)
    scale = torch.where(idcg > 0, 1.0 / idcg.clamp(min=torch.finfo(idcg.dtype).tiny), 0.0)
    g = (gain_values(labels, gain, shift=shift) * scale[:, None]).masked_fill(~mask, 0.0)
    d = discounts(labels.shape[1], dtype=labels.dtype, device=labels.device)
    d = torch.where(torch.arange(labels.shape[1], device=labels.device) < k, d, 0.0)
    return (g,), (d[None, :],)


def _ndcg_terms(labels, mask, k, gain, max_err_label, constants=None) -> Terms:
    (g,), (d,) = constants or _ndcg_plan_terms(labels, mask, k, gain, max_err_label)
    return g, d


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
    # (Chapelle, Metzler, Zhang, Grinspan, "Expected Reciprocal Rank for Graded Relevance",
    # CIKM 2009). Swapping positions a < b (a < k) changes only the terms from a on:
    #     −ΔERR = P_a (R_a − R_b) (1/(a+1) − Z_{a+1} + Q_ab [b<k] (Z_b − 1/(b+1))),
    # with Z_p = Σ_{p<=p'<k} R_p' Π_{p<=q<p'} (1 − R_q) / (p'+1) the ERR of the list from p on
    # (Z_p = 0 from k on) and Q_ab = Π_{a<q<b} (1 − R_q) = exp(L_b − L_{a+1}), L_p the sum of
    # log(1 − R_q) over q < p. Every part lies in [0, 1]: nothing is divided by 1 − R, which is
    # 2^−y_max for a top grade (a prefix-sum form divides by it, and loses every digit once
    # 2^y_max exceeds the dtype's precision). The terms are built in float64: R and 1 − R from
    # 2^(y − y_max) and 2^−y_max, Z by its backward recurrence Z_p = R_p/(p+1) + (1 − R_p) Z_{p+1}.
    dtype = labels.dtype
    y = labels.double()
    n = y.shape[1]
    pos = torch.arange(n, dtype=torch.float64, device=y.device)
    top, floor = torch.exp2(y - max_err_label), 2.0 ** -max_err_label
    r = (top - floor).masked_fill(~mask, 0.0)
    go_on = ((1.0 - top) + floor).masked_fill(~mask, 1.0)
    log_go_on = torch.log(go_on)
    after = log_go_on.cumsum(1)  # L_{p+1}
    before = after - log_go_on  # L_p
    z = torch.zeros(y.shape[0], min(k, n) + 1, dtype=torch.float64, device=y.device)
    for p in range(min(k, n) - 1, -1, -1):
        z[:, p] = r[:, p] / (p + 1.0) + go_on[:, p] * z[:, p + 1]
    z = torch.cat([z, z.new_zeros(y.shape[0], n - min(k, n))], dim=1)  # [Q, n + 1], 0 from k on
    row = 1.0 / (pos + 1.0) - z[:, 1:]  # 1/(a+1) − Z_{a+1}
    col = torch.where(pos < k, z[:, :n] - 1.0 / (pos + 1.0), 0.0)  # [b<k] (Z_b − 1/(b+1))
    terms = (r, torch.exp(before), row, after, col, before)
    return tuple(t.to(dtype) for t in terms)


def _err_delta(rows: Terms, cols: Terms, out: torch.Tensor) -> torch.Tensor:
    r_a, p_a, c_a, l_a, _, _ = rows
    r_b, _, _, _, z_b, l_b = cols
    # exp(L_b − L_{a+1}) <= 1 for b > a; the clamp keeps the pairs b <= a, masked later, finite.
    torch.sub(l_b, l_a, out=out).clamp_(max=0.0).exp_().mul_(z_b).add_(c_a)
    return out.mul_(r_a - r_b).mul_(p_a)


# -- The LambdaLoss weightings ------------------------------------------------------------------
# Wang, Li, Golbandi, Bendersky, Najork, "The LambdaLoss Framework for Ranking Metric
# Optimization", CIKM 2018. Each is a pair weight in C_ij = weight_ij log(1 + e^{−σ(s_i − s_j)})
# over the pairs with y_i > y_j, the ranks r_i = position + 1 taken from the current scores. In
# the paper's notation G_i = gain(y_i) / ideal DCG@k and 1/D_i = 1/log2(1 + r_i) (0 for r_i > k,
# as the "ndcg" weighting), δ_ij = |1/D_{|r_i − r_j|} − 1/D_{|r_i − r_j| + 1}|, untruncated.

def _lambdaloss_terms(labels, mask, k, gain, max_err_label, constants=None) -> Terms:
    g, d = _ndcg_terms(labels, mask, k, gain, max_err_label, constants)
    pos = torch.arange(labels.shape[1], dtype=labels.dtype, device=labels.device)[None, :]
    return g, d, pos, g * d, labels


def _delta_ij(rows: Terms, cols: Terms) -> torch.Tensor:
    """δ of the pairs: 1/log2(n + 1) − 1/log2(n + 2) with n = r_j − r_i (>= 1 for b > a; the
    clamp keeps the pairs b <= a, masked later, finite)."""
    n = (cols[2] - rows[2]).clamp_(min=1.0)
    return torch.log2(n + 1.0).reciprocal_().sub_(torch.log2(n + 2.0).reciprocal_())


def _higher_one(key_a, key_b, h_a, h_b, out: torch.Tensor) -> torch.Tensor:
    """[key_a > key_b] h_a − [key_b > key_a] h_b, written into ``out``."""
    order = torch.sub(key_a, key_b, out=out).sign_()
    above, below = order.clamp(min=0.0), order.clamp(max=0.0)
    return torch.mul(above, h_a, out=out).addcmul_(below, h_b)


def _ndcg_loss1_delta(rows: Terms, cols: Terms, out: torch.Tensor) -> torch.Tensor:
    # weight G_i/D_i of the pair's higher label i: with the signs, [G_a > G_b] h_a − [G_b > G_a] h_b.
    return _higher_one(rows[0], cols[0], rows[3], cols[3], out)


def _ndcg_loss2_delta(rows: Terms, cols: Terms, out: torch.Tensor) -> torch.Tensor:
    # weight δ_ij |G_i − G_j|; G is monotone in the label, so sign(y_a − y_b) |ΔG| = G_a − G_b.
    return torch.sub(rows[0], cols[0], out=out).mul_(_delta_ij(rows, cols))


def ndcg_loss2pp(mu: float = 10.0) -> Weighting:
    """The NDCG-Loss2++ weighting with its μ >= 0: (ρ_ij + μ δ_ij) |G_i − G_j|, with
    ρ_ij = |1/D_i − 1/D_j| LambdaRank's discount change (so ``mu=0`` is the "ndcg" weighting)
    and δ_ij NDCG-Loss2's. ``WEIGHTINGS["ndcg_loss2pp"]`` is ``ndcg_loss2pp(10.0)`` (the
    default of allRank's implementation); the paper tunes μ.

    >>> w = ndcg_loss2pp(0.5)
    >>> w.tie_weight
    0.0
    """
    if isinstance(mu, bool) or not isinstance(mu, (int, float)) or not 0 <= mu < float("inf"):
        raise ValueError(f"`mu` has to be a finite number in [0, inf), got {mu!r}")
    mu = float(mu)

    def delta(rows: Terms, cols: Terms, out: torch.Tensor) -> torch.Tensor:
        spread = _delta_ij(rows, cols).mul_(mu).add_(rows[1]).sub_(cols[1])
        return torch.sub(rows[0], cols[0], out=out).mul_(spread)

    return Weighting(_lambdaloss_terms, delta, tie_weight=0.0, plan_terms=_ndcg_plan_terms)


def _arp1_delta(rows: Terms, cols: Terms, out: torch.Tensor) -> torch.Tensor:
    # weight y_i, the pair's higher label: [y_a > y_b] y_a − [y_b > y_a] y_b.
    return _higher_one(rows[4], cols[4], rows[4], cols[4], out)


def _labeldiff_delta(rows: Terms, cols: Terms, out: torch.Tensor) -> torch.Tensor:
    # weight |y_i − y_j|, signed: y_a − y_b.
    return torch.sub(rows[4], cols[4], out=out)


# The one place where weighting names become behaviour.
WEIGHTINGS: dict[str, Weighting] = {
    "ranknet": Weighting(_ranknet_terms, _ranknet_delta, tie_weight=1.0),
    "ndcg": Weighting(_ndcg_terms, _ndcg_delta, tie_weight=0.0, plan_terms=_ndcg_plan_terms),
    "map": Weighting(_map_terms, _map_delta, tie_weight=0.0),
    "err": Weighting(_err_terms, _err_delta, tie_weight=0.0),
    # LambdaLoss (Wang et al. 2018): NDCG-Loss1 (G_i/D_i), NDCG-Loss2 (δ_ij |G_i − G_j|),
    # NDCG-Loss2++ ((ρ_ij + μ δ_ij) |G_i − G_j|, μ = 10; other μ: ndcg_loss2pp(mu)), ARP-Loss1
    # (y_i) and ARP-Loss2 (|y_i − y_j|), which is also Rax's "labeldiff" lambda weight.
    "ndcg_loss1": Weighting(_lambdaloss_terms, _ndcg_loss1_delta, tie_weight=0.0,
                        plan_terms=_ndcg_plan_terms),
    "ndcg_loss2": Weighting(_lambdaloss_terms, _ndcg_loss2_delta, tie_weight=0.0,
                        plan_terms=_ndcg_plan_terms),
    "ndcg_loss2pp": ndcg_loss2pp(10.0),
    "arp1": Weighting(_lambdaloss_terms, _arp1_delta, tie_weight=0.0,
                        plan_terms=_ndcg_plan_terms),
    "arp2": Weighting(_lambdaloss_terms, _labeldiff_delta, tie_weight=0.0,
                        plan_terms=_ndcg_plan_terms),
    "labeldiff": Weighting(_lambdaloss_terms, _labeldiff_delta, tie_weight=0.0,
                        plan_terms=_ndcg_plan_terms),
}
