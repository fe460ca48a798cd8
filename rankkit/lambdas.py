"""The lambda kernel: RankNet / LambdaRank gradients and Newton terms for padded queries.

Every rankkit model gets its gradients here -- RankNet and LambdaRank through an
``autograd.Function`` whose backward returns ``grad``, LambdaMART through Newton leaf values
``sum(grad) / sum(hess)``. The pairwise formula is written once, in :func:`_accumulate_block`.

Notation: Q queries, L padded list length. For a query, s are the scores, y the labels and
σ = ``sigma``. For a pair with y_i > y_j (Burges 2010, papers/001 §2 and §4; papers/003)::

    ρ_ij = 1 / (1 + exp(σ (s_i − s_j)))
    C_ij = |ΔZ_ij| log(1 + exp(−σ (s_i − s_j)))          (the pair's cost)
    λ_ij = ∂C_ij/∂s_i = −σ |ΔZ_ij| ρ_ij = −∂C_ij/∂s_j
    w_ij = ∂²C_ij/∂s_i² = σ² |ΔZ_ij| ρ_ij (1 − ρ_ij)

and ``grad_i = Σ_{j:(i,j)} λ_ij − Σ_{j:(j,i)} λ_ji``, ``hess_i = Σ_j w_ij`` over every pair
that contains i. So ``grad`` is ∂C/∂s for C = Σ_pairs C_ij: a descent step on the scores
follows **−grad** (Burges' λ_i has the opposite sign), and ``hess`` ≥ 0.

|ΔZ_ij| is the weighting: 1 for RankNet, or the size of the change in NDCG@k, AP@k or ERR@k
when documents i and j swap places in the ranking by the current scores (LambdaRank). The
ranking uses :func:`rankkit._ranking.rank_order` (worst-case ties: among equal scores the
lower label ranks first), and NDCG uses its gains, discounts and ideal DCG, so the kernel
and the metrics agree on every convention.

How the work is laid out (see :func:`lambda_gradients`): each query is sorted by its current
rank, so a pair is (a, b) with positions a < b and only the upper triangle is visited;
queries are sorted by length and processed in chunks of similar length, and long queries in
blocks of rows and columns, so that no more than about ``workspace_bytes`` of pair
temporaries exist at once. With a truncation ``k`` only the rows a < k are visited: O(Q·k·L).
"""
from __future__ import annotations

import bisect
import math
from typing import Callable, NamedTuple

import torch

from rankkit._ranking import GAINS, discounts, gain_values, ideal_dcg, rank_order

__all__ = ["Weighting", "WEIGHTINGS", "lambda_gradients"]

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

# Bytes of pair temporaries per pair, in units of the compute dtype's item size: the kernel
# keeps at most about this many [q, r, c] buffers alive at once (measured in the benchmark).
_BUFFERS_PER_PAIR = 8
# On CPU, blocks of at most this many pairs (measured: fewer, larger blocks are faster as long
# as they stay in the last-level cache).
_CPU_BLOCK_PAIRS = 1 << 20
# The fixed cost of a block on CPU (Python and dispatch of its ~25 tensor operations), in
# pairs' worth of arithmetic: _blocks trades it against the triangle waste of row blocks.
_CPU_BLOCK_COST = 40_000
# On CPU, chunks of at least this many queries use the query-minor layout (see _Layout).
_CPU_QUERY_MINOR = 16
# Queries whose scores (times σ) span at most this much get the pair sigmoid as a product of
# per-document exponentials, e^{±(σ s − centre)} ∈ [e^-33, e^33], which cannot overflow;
# wider queries use torch.sigmoid of the difference. Both are the same ρ up to rounding.
_EXP_SPAN = 64.0


def lambda_gradients(
    scores: torch.Tensor,
    labels: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    weighting: str | Weighting = "ranknet",
    sigma: float = 1.0,
    k: int | None = None,
    gain: str = "exp",
    tie_term: bool = False,
    normalize: bool = False,
    weights: torch.Tensor | None = None,
    max_err_label: float | None = None,
    groups: torch.Tensor | None = None,
    workspace_bytes: int = 2**28,
    return_loss: bool = False,
):
    r"""Pairwise lambda gradients and Newton terms of a padded batch of queries.

    For every pair of real documents of a query with y_i > y_j (Burges 2010; papers/001 and 003):
    ρ_ij = 1 / (1 + exp(σ(s_i − s_j))), the cost C_ij = |ΔZ_ij| log(1 + exp(−σ(s_i − s_j))),
    λ_ij = −σ |ΔZ_ij| ρ_ij added to grad_i and subtracted from grad_j, and
    σ² |ΔZ_ij| ρ_ij (1 − ρ_ij) added to hess_i and hess_j. ``grad`` is therefore ∂C/∂s:
    **a descent step on the scores follows −grad**.

    Args:
        scores: [Q, L] float scores; entries where ``mask`` is False are ignored.
        labels: [Q, L] non-negative relevance labels.
        mask: [Q, L] bool, True on real documents; None means all True.
        weighting: |ΔZ_ij|, a name in :data:`WEIGHTINGS` or a :class:`Weighting`:
            "ranknet" (1), "ndcg" (|ΔNDCG@k|, with ``gain``), "map" (|ΔAP@k|, relevant means
            label > 0, normalised by min(#relevant, k)), "err" (|ΔERR@k|, with
            R = (2^y − 1) / 2^max_err_label). The Δ are those of swapping i and j in the
            ranking by the current scores (ties in score: lower label first), so the
            weighting and :mod:`rankkit.metrics` share conventions. Queries whose metric is
            undefined (ideal DCG = 0, no relevant document) give zeros.
        sigma: σ > 0, the steepness of the pairwise logistic.
        k: truncation and cutoff, None for the whole list. Only pairs in which at least one
            document ranks in the current top k take part (LightGBM's
            ``lambdarank_truncation_level``), and the metric weightings use the metric @k,
            normalised by the ideal DCG@k (or min(#relevant, k), ERR@k). That is exactly
            |ΔNDCG@k|, so a pair with both documents below k would weigh 0 anyway: the two
            roles of k agree. (LightGBM also normalises by the ideal DCG@k but keeps the
            untruncated discount of the lower document; rankkit uses the metric's.)
        gain: NDCG gain, "exp" (2^y − 1) or "linear" (y); other weightings ignore it.
        tie_term: also use pairs with equal labels, with RankNet's target P̄ = ½:
            C_ij = |ΔZ| (½ σ(s_i − s_j) + log(1 + exp(−σ(s_i − s_j)))), each unordered pair
            once, with |ΔZ| = 1 for "ranknet". For the metric weightings swapping equal labels
            changes nothing, |ΔZ| = 0, so the option has no effect there.
        normalize: multiply each query's grad, hess and loss by LightGBM's
            log2(1 + Σ|λ|) / Σ|λ|, where Σ|λ| = Σ_pairs 2|λ_ij| is taken before the document
            ``weights`` (so a constant weight still scales the query linearly). The factor is
            treated as a constant of the scores (as LightGBM does). LightGBM additionally
            divides each |ΔNDCG| by 0.01 + |s_i − s_j| under its ``lambdarank_norm``; rankkit
            does not.
        weights: [Q, L] non-negative per-document weights, or None. A pair is weighted by the
            mean of its two documents' weights, so a query whose documents all weigh w
            contributes exactly w times its unweighted grad, hess and loss, and each query's
            grad still sums to zero.
        max_err_label: the top label of the scale for "err" (4 for MSLR-WEB); None uses the
            largest real label in the whole batch, so that a query's ERR weights then depend on
            the other queries of the batch (and on how the data is batched): pass the scale's
            top label whenever it is known.
        groups: [Q, L] integer group ids (|id| < 2^24), or None. A pair of documents of the
            same group is left out of grad, hess and loss, but still counts in the
            ``normalize`` factor, which stays that of the whole query. With a tree's leaf
            indices as groups, the summed hess of a leaf is the exact second derivative of
            the loss in that leaf's value (Tunys, papers/000, appendix); the boosters use it
            for ``exact_newton``.
        workspace_bytes: cap on the pair temporaries, in bytes (about
            8 × item size per pair at once); the work is split into blocks to fit.
        return_loss: also return C per query.
    Returns:
        (grad, hess), each [Q, L] in the dtype of ``scores``, zero on padding; with
        ``return_loss`` also loss [Q], Σ of C_ij over the query's pairs.

    Example: two documents with equal scores, the first one relevant.

    >>> grad, hess = lambda_gradients(torch.tensor([[0.0, 0.0]]), torch.tensor([[1.0, 0.0]]))
    >>> grad  # −σ ρ and +σ ρ with ρ = 1/(1 + e^0) = 1/2
    tensor([[-0.5000,  0.5000]])
    >>> hess  # σ² ρ (1 − ρ)
    tensor([[0.2500, 0.2500]])
    """
    fn = _check(scores, labels, mask, weighting, sigma, k, gain, weights, max_err_label,
                workspace_bytes, groups)
    n_queries, n_docs = scores.shape
    device = scores.device
    dtype = torch.float64 if scores.dtype == torch.float64 else torch.float32
    if mask is None:
        mask = torch.ones(scores.shape, dtype=torch.bool, device=device)
    cutoff = n_docs if k is None else min(k, n_docs)
    if fn is WEIGHTINGS["err"] and max_err_label is None:
        max_err_label = float(labels[mask].max()) if mask.any() else 0.0

    # Queries in order of length (qperm None: they already are), then each query's documents
    # in order of rank (padding last).
    lengths = mask.sum(1)
    qperm = None
    if bool((lengths[1:] < lengths[:-1]).any()):
        lengths, qperm = torch.sort(lengths, stable=True)
    full = n_queries == 0 or int(lengths[0]) == n_docs  # no padding at all
    s, y, m = scores.detach().to(dtype), labels.detach().to(dtype), mask
    if qperm is not None:
        s, y, m = s[qperm], y[qperm], m[qperm]
    if not full:
        s, y = s.masked_fill(~m, 0.0), y.masked_fill(~m, 0.0)
    order = _rank_order(s, y, m, full)
    s, y, m = s.gather(1, order), y.gather(1, order), m.gather(1, order)
    if sigma != 1.0:
        s = s * sigma
    terms = fn.doc_terms(y, m, cutoff, gain, max_err_label)
    half_w = None if weights is None else weights.detach().to(dtype)
    if half_w is not None:
        half_w = (half_w if qperm is None else half_w[qperm]).gather(1, order).mul(0.5)
        half_w.masked_fill_(~m, 0.0)
    group = None
    if groups is not None:
        group = groups.to(device)
        group = (group if qperm is None else group[qperm]).gather(1, order).to(dtype)

    # acc[0] = −grad / σ and acc[1] = hess / σ², in (length order, rank order). Blocks in the
    # query-minor layout accumulate into acc_t, its [2, L, Q] transpose (see _Layout).
    acc = torch.zeros(2, n_queries, n_docs, dtype=dtype, device=device)
    loss = torch.zeros(n_queries, dtype=dtype, device=device) if return_loss else None
    abs_sum = torch.zeros(n_queries, dtype=dtype, device=device) if normalize else None
    tie_weight = fn.tie_weight if tie_term else 0.0

    cap = max(1, workspace_bytes // (_BUFFERS_PER_PAIR * acc.element_size()))
    cpu = device.type == "cpu"
    if cpu:
        cap = min(cap, _CPU_BLOCK_PAIRS)
    blocks = list(_blocks(lengths, cutoff, cap, cpu))
    acc_t = None
    if blocks:
        biggest = max((q1 - q0) * (r1 - r0) * (c1 - c0)
                      for q0, q1, _, (r0, r1), (c0, c1), _ in blocks)
        # Reused buffers: [0] W, then ∂C/∂s_a / (−σ); [1] |W|, then the Newton term / σ²;
        # [2] 1/ρ's 1 + e^{−d}; [3] loss terms; [4] pair weights.
        work = torch.empty(3 + return_loss + (weights is not None), biggest, dtype=dtype,
                           device=device)
        # Pairs (a, b) need b > a: upper[i, j] = j >= i, sliced for the blocks whose columns
        # overlap their rows (see _accumulate_block).
        tall = max((r1 - r0 for _, _, _, (r0, r1), (c0, _), _ in blocks if c0 < r1), default=0)
        upper = torch.ones(tall, tall, dtype=dtype, device=device).triu_()
        # Per-document factors of the pair sigmoid: e^{z_a} e^{−z_b} = e^{σ(s_a − s_b)} with
        # z = σ s − centre, for the queries whose scores span at most _EXP_SPAN.
        last = s.gather(1, (lengths - 1).clamp(min=0)[:, None])[:, 0]
        spread, centre = s[:, 0] - last, (s[:, 0] + last) * 0.5
        z = (s - centre[:, None]).clamp_(-_EXP_SPAN / 2 - 1, _EXP_SPAN / 2 + 1)
        exp_pos, exp_neg = torch.exp(z), torch.exp(z.neg_())
        n_wide = [0] + (~(spread <= _EXP_SPAN)).cumsum(0).tolist()  # NaN counts as wide
        per_doc = [s, exp_pos, exp_neg, *terms]
        if half_w is not None:
            per_doc.append(half_w)
        if group is not None:
            per_doc.append(group)
        if not full:
            per_doc.append(m.to(dtype))
        layouts = {}
        one = torch.ones(1, 1, 1, dtype=dtype, device=device)
    for q0, q1, shortest, (r0, r1), (c0, c1), q_minor in blocks:
        lay = layouts.get(q_minor)
        if lay is None:
            lay = layouts[q_minor] = _Layout(q_minor, per_doc, acc)
            if q_minor:
                acc_t = lay.acc
        row_views, col_views = lay.cut(q0, q1, r0, r1, c0, c1)
        s_a, e_a = row_views[0], row_views[1]
        s_b, f_b = col_views[0], col_views[2]
        n_terms = len(terms)
        extra = 3 + n_terms + (half_w is not None)  # the index of the group term
        width = min(r1, c1) - c0  # columns that overlap the rows: there b > a is needed
        _accumulate_block(
            s_a, s_b, None if n_wide[q1] > n_wide[q0] else (e_a, f_b, one if q_minor else
                                                            lay.ones[..., :c1 - c0]),
            tuple(row_views[3:3 + n_terms]), tuple(col_views[3:3 + n_terms]),
            lay.tri(upper[:r1 - r0, c0 - r0 - 1:c0 - r0 - 1 + width]) if width > 0 else None,
            None if shortest >= c1 else col_views[-1],
            fn.signed_delta, tie_weight,
            None if half_w is None else (row_views[3 + n_terms], col_views[3 + n_terms]),
            None if group is None else (row_views[extra], col_views[extra]),
            work, lay, (q1 - q0, r1 - r0, c1 - c0), lay.acc_rows(q0, q1, r0, r1),
            lay.acc_rows(q0, q1, c0, c1),
            None if loss is None else loss[q0:q1],
            None if abs_sum is None else abs_sum[q0:q1],
        )
    if acc_t is not None:
        acc.add_(acc_t.transpose(1, 2))

    acc[0].mul_(-sigma)
    acc[1].mul_(sigma * sigma)
    if normalize:
        abs_sum.mul_(2.0 * sigma)
        factor = torch.where(abs_sum > 0, torch.log2(1.0 + abs_sum) / abs_sum.clamp(
            min=torch.finfo(dtype).tiny), 1.0)
        acc.mul_(factor[:, None])
        if loss is not None:
            loss.mul_(factor)

    # Back from (length order, rank order) to the caller's layout: one scatter per output.
    if qperm is None:
        place = lambda t: torch.empty_like(t).scatter_(1, order, t)
    else:
        index = (qperm[:, None] * n_docs + order).view(-1)
        place = lambda t: torch.empty_like(t).view(-1).index_copy_(0, index, t.reshape(-1)
                                                                   ).view(t.shape)
    out = [place(acc[0]).to(scores.dtype), place(acc[1]).to(scores.dtype)]
    if loss is not None:
        out.append(loss.to(scores.dtype) if qperm is None else
                   torch.empty_like(loss).index_copy_(0, qperm, loss).to(scores.dtype))
    return tuple(out)


class _Layout:
    """How a block of pairs is laid out in memory, and the per-document views that feed it.

    Query-major (``q_minor`` False): a block is [q, r, c], documents a along dim 1 and b along
    the contiguous dim 2; the per-document terms enter as [q, r, 1] and [q, 1, c]. Query-minor:
    [r, c, q], with the queries contiguous, terms [r, 1, q] and [1, c, q] (position-only terms
    [r, 1, 1] and [1, c, 1]). Query-minor keeps every operand of the pair arithmetic
    contiguous in the inner dimension and makes both pair sums reductions over outer
    dimensions, which is much faster on CPU for chunks of many queries; query-major serves
    chunks of a few long queries. Positions-first layouts accumulate into ``acc`` [2, L, Q].
    """

    def __init__(self, q_minor, per_doc, acc):
        self.q_minor = q_minor
        _, n_queries, n_docs = acc.shape
        self.shared = [t.shape[0] == 1 for t in per_doc]  # position-only terms
        if q_minor:
            tt = [t.t().contiguous() for t in per_doc]
            self.rows = [t[:, None, :] for t in tt]
            self.cols = [t[None, :, :] for t in tt]
            self.acc = acc.new_zeros(2, n_docs, n_queries)
            self.ones = None
            self.pair_dims = (0, 1)  # dims of a block that belong to one query
            self.row_dim, self.col_dim = 1, 0  # summed over for per-row / per-column totals
        else:
            self.rows = [t[:, :, None] for t in per_doc]
            self.cols = [t[:, None, :] for t in per_doc]
            self.acc = acc
            self.ones = acc.new_ones(1, 1, n_docs)
            self.pair_dims = (1, 2)
            self.row_dim, self.col_dim = 2, 1

    def shape(self, q, r, c):
        return (r, c, q) if self.q_minor else (q, r, c)

    def cut(self, q0, q1, r0, r1, c0, c1):
        """Row and column views of every per-document tensor for one block."""
        qs, rs, cs, every = slice(q0, q1), slice(r0, r1), slice(c0, c1), slice(None)
        if self.q_minor:
            ri, ri1, ci, ci1 = (rs, every, qs), (rs,), (every, cs, qs), (every, cs)
        else:
            ri, ri1, ci, ci1 = (qs, rs), (every, rs), (qs, every, cs), (every, every, cs)
        rows = [t[ri1 if one else ri] for t, one in zip(self.rows, self.shared)]
        cols = [t[ci1 if one else ci] for t, one in zip(self.cols, self.shared)]
        return rows, cols

    def tri(self, upper):
        """(index of the overlapping columns in a block, the b > a mask there)."""
        width = upper.shape[1]
        if self.q_minor:
            return (slice(None), slice(0, width)), upper[:, :, None]
        return (slice(None), slice(None), slice(0, width)), upper

    def acc_rows(self, q0, q1, p0, p1):
        """[2, ...] view of the accumulator at positions [p0, p1) of queries [q0, q1)."""
        return self.acc[:, p0:p1, q0:q1] if self.q_minor else self.acc[:, q0:q1, p0:p1]


def _accumulate_block(s_a, s_b, exps, rows, cols, tri, pad, signed_delta, tie_weight, half_w,
                      group, work, layout, size, acc_rows, acc_cols, loss, abs_sum):
    """Add one block of pairs (positions a in rows, b in cols) to the outputs.

    The pair formula lives here and nowhere else. With W = sign(y_a − y_b)|ΔZ|, the pair
    oriented from higher to lower label has x = sign(W) σ(s_b − s_a), ρ = sigmoid(x),
    ∂C/∂s_a = −σ W ρ = −∂C/∂s_b, ∂²C/∂s² = σ² |W| ρ (1 − ρ) and C = |W| softplus(x).
    Positions are in rank order, so d = σ(s_b − s_a) <= 0 for every real pair, and with
    X = 1 + e^{−d} >= 2, p = sigmoid(d) = 1/X <= ½: ρ = p when W > 0 and 1 − p when W < 0,
    which gives, with no orientation pass and no cancellation,

        u = |W| / X = |W| p,   W ρ = min(W, 0) + u,   |W| ρ (1 − ρ) = u − u / X,
        C = |W| softplus(d) + min(W, 0) d,   softplus(d) = −log(1 − p) = −log1p(−1/X).

    ``exps`` (e^{z_a}, e^{−z_b}, 1) with z = σ s − centre give X = 1 + e^{z_a} e^{−z_b} in one
    multiply-add (the exponentials are bounded, so X is finite); None: X = 1 + exp(σ(s_a −
    s_b)), which may be +inf (then u = 0). An equal-label pair (tie term, weight T) is
    oriented a over b: W = T, minus T/2 in W ρ and in min(W, 0) (so C gains −T d / 2).
    ``half_w`` and ``group`` (g_a, g_b) weight the pairs: (w_a + w_b)/2, times 0 when g_a = g_b;
    ``abs_sum`` (the normalisation) is taken before that weight. ``layout`` (a :class:`_Layout`) says how the block of ``size`` (q, r, c) pairs lies in
    ``work``; ``acc_rows`` and ``acc_cols`` are [2, ...] views of −grad / σ and hess / σ² at
    the rows and the columns (the caller applies the factors σ and σ²).
    """
    shape = layout.shape(*size)
    n = size[0] * size[1] * size[2]
    pair = work[:2, :n].view(2, *shape)
    w, a = pair[0], pair[1]
    x = work[2, :n].view(shape)
    signed_delta(rows, cols, w)
    if tri is not None:
        w[tri[0]].mul_(tri[1])
    if pad is not None:
        w.mul_(pad)
    ties = None
    if tie_weight:
        ties = (w == 0).to(w.dtype)
        if tri is not None:
            ties[tri[0]].mul_(tri[1])
        if pad is not None:
            ties.mul_(pad)
        ties.mul_(tie_weight)
        w.add_(ties)
    torch.abs(w, out=a)
    if exps is not None:
        torch.addcmul(exps[2], exps[0], exps[1], out=x)
    else:
        torch.sub(s_a, s_b, out=x).exp_().add_(1.0)
    low = w.clamp_(max=0.0)  # min(W, 0)
    if ties is not None:
        low.sub_(ties, alpha=0.5)
    omega = None if half_w is None else torch.add(half_w[0], half_w[1],
                                                  out=work[-1, :n].view(shape))
    if group is not None:  # a pair inside a group weighs 0 (after abs_sum, which omega skips)
        keep = torch.ne(group[0], group[1]).to(w.dtype)
        omega = keep if omega is None else omega.mul_(keep)
    each = layout.pair_dims
    if loss is not None:
        cost = work[3, :n].view(shape)
        torch.sub(s_b, s_a, out=cost).mul_(low)  # min(W, 0) d
        if omega is not None:
            cost.mul_(omega)
        loss.add_(cost.sum(each))
        # −|W| softplus(d) = |W| log1p(−p); the clamp only keeps masked pairs (p > ½) finite.
        torch.reciprocal(x, out=cost).neg_().clamp_(min=-0.5).log1p_().mul_(a)
        if omega is not None:
            cost.mul_(omega)
        loss.sub_(cost.sum(each))
    u = a.div_(x)  # |W| p
    g = low.add_(u)  # W ρ: ∂C/∂s_a = −σ W ρ
    if abs_sum is not None:
        abs_sum.add_(g.abs().sum(each))  # |λ_ab| / σ
    u.addcdiv_(u, x, value=-1.0)  # |W| p (1 − p)
    if omega is not None:
        pair.mul_(omega)
    per_col = pair.sum(1 + layout.col_dim)
    acc_rows.add_(pair.sum(1 + layout.row_dim))
    acc_cols[0].sub_(per_col[0])
    acc_cols[1].add_(per_col[1])


def _rank_order(scores: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor,
                full: bool = False) -> torch.Tensor:
    """:func:`rankkit._ranking.rank_order` on the real documents, with one sort instead of three.

    float32 scores and labels (the booster's and most neural batches): one sort of a packed
    (score, −label) key (:func:`_tied_rank_order`). Otherwise one stable sort by score, which
    already gives rank_order's order of the real documents unless two real documents with
    different labels tie in score (then the worst-case rule decides). Non-finite scores, and
    such ties outside float32, defer to rank_order itself. ``full``: the mask is all True.
    """
    finite = torch.isfinite(scores) if full else torch.isfinite(scores) | ~mask
    if not bool(finite.all()):
        return rank_order(scores, labels, mask)
    if scores.dtype == torch.float32 and labels.dtype == torch.float32:
        # One sort of a packed key: about as fast as the float sort alone, and boosting's
        # scores tie all the time (documents that share every leaf so far).
        return _tied_rank_order(scores, labels, mask, full)
    values, order = torch.sort(scores if full else scores.masked_fill(~mask, -math.inf), dim=1,
                               descending=True, stable=True)
    tied = values[:, 1:] == values[:, :-1]
    if bool(tied.any()):
        real, ranked = mask.gather(1, order), labels.gather(1, order)
        if bool((tied & real[:, 1:] & (ranked[:, 1:] != ranked[:, :-1])).any()):
            return rank_order(scores, labels, mask)
    return order


def _float_key(x: torch.Tensor) -> torch.Tensor:
    """int64 keys in the order of the float32 values ``x`` (−0 and +0 equal; no NaN)."""
    bits = (x + 0.0).view(torch.int32)  # + 0.0 turns −0 into +0
    return (bits ^ ((bits >> 31) & 0x7FFFFFFF)).long()


def _tied_rank_order(scores: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor,
                     full: bool) -> torch.Tensor:
    """rank_order's order with one sort, for float32 scores and labels (all finite on real
    documents): a stable descending sort of the key (score, −label) packed in 64 bits, the
    score's order-preserving 32-bit key above the label's reversed one. Equal (score, label)
    keep their index order, as in rank_order's chain of stable sorts; padding scores −inf last."""
    s = scores if full else scores.masked_fill(~mask, -math.inf)
    y = labels if full else labels.masked_fill(~mask, 0.0)
    key = (_float_key(s) << 32) | (0x7FFFFFFF - _float_key(y))
    return torch.sort(key, dim=1, descending=True, stable=True).indices


def _blocks(lengths: torch.Tensor, cutoff: int, cap: int, cpu: bool = True):
    """Yield (q0, q1, shortest length, (r0, r1), (c0, c1), q_minor) blocks of at most about
    ``cap`` pairs.

    ``lengths`` [Q] is sorted ascending. Queries are grouped in length buckets (powers of
    √2) so a short query never pays for the longest one; within a bucket, consecutive
    queries form chunks, and each chunk is cut into row blocks (positions a < cutoff) and
    column blocks (positions b > a). ``q_minor``: lay the block out with the queries as the
    contiguous dimension (see :class:`_Layout`), done on CPU for chunks of many queries.

    Each row block also visits the pairs b <= a of its own rows, a triangle that more row
    blocks make smaller, at the price of a fixed cost per block (on CPU, that of about
    _CPU_BLOCK_COST pairs). On CPU the height of the row blocks minimises the sum of the two.
    """
    lens = lengths.tolist()
    start = bisect.bisect_left(lens, 2)  # shorter queries have no pairs
    if start == len(lens):
        return
    if lens[start] == lens[-1]:  # one length: one bucket
        counts = [len(lens) - start]
    else:
        buckets = torch.ceil(2.0 * torch.log2(lengths[start:].double())).long()
        counts = torch.unique_consecutive(buckets, return_counts=True)[1].tolist()
    for count in counts:
        stop = start + count
        n_max = lens[stop - 1]
        if cpu:
            n_rows = min(cutoff, n_max - 1)
            per_query = n_rows * (2 * n_max - n_rows - 1) // 2  # pairs (a, b), a < n_rows
            # A chunk of q queries cut into row blocks of height h costs about
            # _CPU_BLOCK_COST · n_rows / h + q (pairs + n_rows h / 2): best h = √(2 cost / q).
            q = max(1, min(count, cap // max(1, per_query)))
            rb = round(math.sqrt(2 * _CPU_BLOCK_COST / q))
            rb = max(1, min(n_rows, rb, cap // (n_max - 1)))
            rb = math.ceil(n_rows / math.ceil(n_rows / rb))  # even heights
            area = rb * (n_max - 1)  # pairs per query in a row block
        else:
            n_rows = min(cutoff, n_max)
            # Few, whole-width row blocks for short lists; ~8 for long ones so that the
            # lower triangle (b <= a) is mostly skipped.
            rb = n_rows if n_rows <= 32 else max(16, math.ceil(n_rows / 8))
            rb = max(1, min(rb, cap // n_max))
            area = rb * n_max
        cb = min(n_max, max(1, cap // rb))
        qc = max(1, cap // (rb * cb))
        qc = math.ceil(count / math.ceil(count / qc))  # chunks of even size
        q_minor = cpu and qc >= _CPU_QUERY_MINOR
        for q0 in range(start, stop, qc):
            q1 = min(q0 + qc, stop)
            n = lens[q1 - 1]
            n_rows = min(cutoff, n - 1)  # the last position has no pair below it
            r0 = 0
            while r0 < n_rows:
                # Lower row blocks are narrower, so taller for the same area.
                r1 = min(n_rows, r0 + max(rb, area // (n - r0 - 1)))
                for c0 in range(r0 + 1, n, cb):
                    yield q0, q1, lens[q0], (r0, r1), (c0, min(c0 + cb, n)), q_minor
                r0 = r1
        start = stop


def _check(scores, labels, mask, weighting, sigma, k, gain, weights, max_err_label,
           workspace_bytes, groups=None) -> Weighting:
    """Validate the public arguments once; return the weighting to use."""
    if not isinstance(scores, torch.Tensor) or scores.ndim != 2 or not scores.is_floating_point():
        raise ValueError(f"`scores` must be a [Q, L] float tensor, got {_describe(scores)}")
    if not isinstance(labels, torch.Tensor) or labels.shape != scores.shape:
        raise ValueError(f"`labels` must be a tensor of the shape of `scores` {tuple(scores.shape)},"
                         f" got {_describe(labels)}")
    if mask is not None and (not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool
                             or mask.shape != scores.shape):
        raise ValueError(f"`mask` must be a bool tensor of shape {tuple(scores.shape)}, "
                         f"got {_describe(mask)}")
    if weights is not None:
        if not isinstance(weights, torch.Tensor) or weights.shape != scores.shape:
            raise ValueError(f"`weights` must be a tensor of shape {tuple(scores.shape)}, "
                             f"got {_describe(weights)}")
        negative = weights < 0 if mask is None else (weights < 0) & mask
        if bool(negative.any()):
            raise ValueError("`weights` must be non-negative on real documents")
    if groups is not None:
        if (not isinstance(groups, torch.Tensor) or groups.shape != scores.shape
                or groups.is_floating_point() or groups.is_complex() or groups.dtype == torch.bool):
            raise ValueError(f"`groups` must be an integer tensor of shape {tuple(scores.shape)}, "
                             f"got {_describe(groups)}")
        if groups.numel() and int(groups.abs().max()) >= 2**24:
            raise ValueError("`groups` ids must be below 2^24 in absolute value")
    if isinstance(weighting, Weighting):
        fn = weighting
    elif isinstance(weighting, str) and weighting in WEIGHTINGS:
        fn = WEIGHTINGS[weighting]
    else:
        raise ValueError(f"`weighting` must be one of {tuple(WEIGHTINGS)} or a Weighting, "
                         f"got {weighting!r}")
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not (
            0 < sigma < math.inf):
        raise ValueError(f"`sigma` has to be a positive finite number, got {sigma!r}")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise ValueError(f"`k` has to be a positive integer or None, got {k!r}")
    if gain not in GAINS:
        raise ValueError(f"`gain` must be one of {GAINS}, got {gain!r}")
    if isinstance(workspace_bytes, bool) or not isinstance(workspace_bytes, int) or (
            workspace_bytes < 1):
        raise ValueError(f"`workspace_bytes` has to be a positive integer, got {workspace_bytes!r}")
    if max_err_label is not None:
        if isinstance(max_err_label, bool) or not isinstance(max_err_label, (int, float)) or not (
                0 <= max_err_label < math.inf):
            raise ValueError(f"`max_err_label` has to be a non-negative number or None, "
                             f"got {max_err_label!r}")
        if fn is WEIGHTINGS["err"]:
            real = labels if mask is None else labels[mask]
            if real.numel() and float(real.max()) > max_err_label:
                raise ValueError(f"`max_err_label` ({max_err_label}) is below the largest "
                                 f"label ({float(real.max())})")
    return fn


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return repr(type(x).__name__)
