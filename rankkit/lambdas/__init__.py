"""The lambda kernel: RankNet / LambdaRank gradients and Newton terms for padded queries.

Every rankkit model gets its gradients here -- RankNet and LambdaRank through an
``autograd.Function`` whose backward returns ``grad``, LambdaMART through Newton leaf values
``sum(grad) / sum(hess)``. The pairwise formula is written once, in :func:`_accumulate_block`.

The kernel is this package: this module (the public entry points and the pair loop),
:mod:`~rankkit.lambdas.plan` (what a data set's queries need once: order, blocks, ideal DCG),
:mod:`~rankkit.lambdas.blocks` (the block plan of the pair loop), :mod:`~rankkit.lambdas.weightings`
(|ΔZ| of each weighting: NDCG, MAP, ERR, the LambdaLoss family) and :mod:`~rankkit.lambdas.ranking`
(gains, discounts, rank order with worst-case ties). Its compiled and Triton versions are the
booster's backends (:mod:`rankkit.kernels`).

Notation: Q queries, L padded list length. For a query, s are the scores, y the labels and
σ = ``sigma``. For a pair with y_i > y_j (Burges, "From RankNet to LambdaRank to LambdaMART:
An Overview", Microsoft Research MSR-TR-2010-82, 2010, §2 and §4)::

    ρ_ij = 1 / (1 + exp(σ (s_i − s_j)))
    C_ij = |ΔZ_ij| log(1 + exp(−σ (s_i − s_j)))          (the pair's cost)
    λ_ij = ∂C_ij/∂s_i = −σ |ΔZ_ij| ρ_ij = −∂C_ij/∂s_j
    w_ij = ∂²C_ij/∂s_i² = σ² |ΔZ_ij| ρ_ij (1 − ρ_ij)

and ``grad_i = Σ_{j:(i,j)} λ_ij − Σ_{j:(j,i)} λ_ji``, ``hess_i = Σ_j w_ij`` over every pair
that contains i. So ``grad`` is ∂C/∂s for C = Σ_pairs C_ij: a descent step on the scores
follows **−grad** (Burges' λ_i has the opposite sign), and ``hess`` ≥ 0.

|ΔZ_ij| is the weighting: 1 for RankNet, or the size of the change in NDCG@k, AP@k or ERR@k
when documents i and j swap places in the ranking by the current scores (LambdaRank). The
ranking uses :func:`rankkit.lambdas.ranking.rank_order` (worst-case ties: among equal scores the
lower label ranks first), and NDCG uses its gains, discounts and ideal DCG, so the kernel
and the metrics agree on every convention.

How the work is laid out (see :func:`lambda_gradients`): each query is sorted by its current
rank, so a pair is (a, b) with positions a < b and only the upper triangle is visited;
queries are sorted by length and processed in chunks of similar length, and long queries in
blocks of rows and columns, so that no more than about ``workspace_bytes`` of pair
temporaries exist at once. With a truncation ``k`` only the rows a < k are visited: O(Q·k·L).
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

from rankkit.infra import checks as _checks
from rankkit.infra.transfer import upload
from rankkit.kernels.switches import triton_takes
from rankkit.lambdas.blocks import BUFFERS_PER_PAIR, CPU_BLOCK_PAIRS, Layout
from rankkit.lambdas.plan import QueryPlan
from rankkit.lambdas.ranking import rank_order
from rankkit.lambdas.weightings import WEIGHTINGS, Weighting

__all__ = ["Weighting", "WEIGHTINGS", "lambda_gradients", "planned_lambda_gradients"]

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
    pair_weights: tuple[torch.Tensor, torch.Tensor] | None = None,
    workspace_bytes: int = 2**28,
    return_loss: bool = False,
):
    r"""Pairwise lambda gradients and Newton terms of a padded batch of queries.

    For every pair of real documents of a query with y_i > y_j (Burges, "From RankNet to
    LambdaRank to LambdaMART: An Overview", MSR-TR-2010-82, 2010):
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
            R = (2^y − 1) / 2^max_err_label); and the LambdaLoss weightings (Wang, Li,
            Golbandi, Bendersky, Najork, "The LambdaLoss Framework for Ranking Metric
            Optimization", CIKM 2018), with G_i = gain(y_i) / ideal DCG@k, 1/D_i the discount
            of i's current rank r_i (0 beyond k) and δ_ij = 1/log2(1 + n) − 1/log2(2 + n),
            n = |r_i − r_j|: "ndcg_loss1" (G_i/D_i, i the pair's higher label), "ndcg_loss2"
            (δ_ij |G_i − G_j|), "ndcg_loss2pp" ((|1/D_i − 1/D_j| + μ δ_ij) |G_i − G_j|, μ = 10;
            ``rankkit.lambdas.weightings.ndcg_loss2pp(mu)`` for another μ), "arp1" (y_i),
            "arp2" and "labeldiff" (|y_i − y_j|, ARP-Loss2 and Rax's ``labeldiff``). ARP-Loss1
            in the paper also sums the pairs against label order, which push the scores the
            wrong way; here, as every weighting, it takes the pairs with y_i > y_j only. The Δ are
            those of swapping i and j in the
            ranking by the current scores (ties in score: lower label first), so the
            weighting and :mod:`rankkit.metrics` share conventions. Queries whose metric is
            undefined (ideal DCG = 0, no relevant document) give zeros. Any grade works
            exactly, in float32 too: the NDCG gains are taken over the query's top gain and the
            ERR terms never divide by 1 − R (see :mod:`rankkit.lambdas.weightings`).
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
            the loss in that leaf's value (Tunys, "LambdaMART
            Demystified", Czech Technical University, 2015, appendix); the boosters use it
            for ``exact_newton``.
        pair_weights: (upper, lower), two [Q, L] non-negative tensors, or None. The pair
            (i, j) with y_i > y_j weighs upper_i · lower_j in grad, hess and loss, times the
            mean of ``weights`` when both are given; like ``weights``, not in the ``normalize``
            factor. This is the pair weight of position-debiased training (Hu, Wang, Peng, Li,
            "Unbiased LambdaMART: An Unbiased Pairwise Learning-to-Rank Algorithm", WWW 2019:
            upper = 1 / t⁺ at the clicked document's position, lower = 1 / t⁻ at the other's).
            A tie pair (``tie_term``) takes the higher-ranked document as i.
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
    conditions: list = []  # checked in the plan's one copy to the host
    scores, labels, mask, weights, groups, pair_weights, fn = _check(
        scores, labels, mask=mask, weighting=weighting, sigma=sigma, k=k, gain=gain, weights=weights,
        max_err_label=max_err_label, workspace_bytes=workspace_bytes, groups=groups, pair_weights=pair_weights,
        defer=conditions)
    plan = QueryPlan(labels, mask, weights=weights, check=False, conditions=conditions)
    return planned_lambda_gradients(scores, plan, weighting=fn, sigma=sigma, k=k, gain=gain,
                                    tie_term=tie_term, normalize=normalize,
                                    max_err_label=max_err_label, groups=groups,
                                    pair_weights=pair_weights, workspace_bytes=workspace_bytes,
                                    return_loss=return_loss)


def planned_lambda_gradients(
    scores: torch.Tensor,
    plan: QueryPlan,
    *,
    weighting: Weighting,
    sigma: float = 1.0,
    k: int | None = None,
    gain: str = "exp",
    tie_term: bool = False,
    normalize: bool = False,
    max_err_label: float | None = None,
    groups: torch.Tensor | None = None,
    pair_weights: tuple[torch.Tensor, torch.Tensor] | None = None,
    workspace_bytes: int = 2**28,
    return_loss: bool = False,
    triton: bool | None = None,
):
    """:func:`lambda_gradients` of ``scores`` [Q, L] on the queries of ``plan``
    (:class:`rankkit.lambdas.plan.QueryPlan`: labels, mask and weights), for a caller that scores the
    same queries many times (the boosters). Trusts its arguments: the plan validated the labels
    once, the caller the options; ``weighting`` is a :class:`Weighting`. Everything that does
    not depend on the scores (query order, blocks, ideal DCG, ...) comes from the plan, so a
    call makes no host synchronisation on a GPU. The loss only with ``return_loss``.
    ``triton``: take the fused Triton kernel where it computes these options (True), never
    (False), or where the kernels' switches take the scores' device (None, the default:
    :func:`rankkit.kernels.switches.triton_takes`); the booster's backend decides it."""
    fn = weighting
    if _triton_route(scores, plan, fn, tie_term, normalize, groups, pair_weights, triton):
        from rankkit.kernels.triton.lambdas import lambda_gradients_triton

        name = next(n for n, w in WEIGHTINGS.items() if w is fn)
        return lambda_gradients_triton(scores, plan.labels, mask=plan.mask, weighting=name, sigma=sigma,
                                       k=k, gain=gain, weights=plan.weights, return_loss=return_loss)
    n_queries, n_docs = scores.shape
    dtype = torch.float64 if scores.dtype == torch.float64 else torch.float32
    cutoff = n_docs if k is None else min(k, n_docs)
    if fn is WEIGHTINGS["err"] and max_err_label is None:
        max_err_label = plan.max_label
    ranked = _Ranked.of(scores, plan, fn, dtype=dtype, sigma=sigma, cutoff=cutoff, gain=gain,
                        max_err_label=max_err_label, groups=groups, pair_weights=pair_weights)
    # acc[0] = −grad / σ and acc[1] = hess / σ², in (length order, rank order).
    acc = torch.zeros(2, n_queries, n_docs, dtype=dtype, device=scores.device)
    loss = torch.zeros(n_queries, dtype=dtype, device=scores.device) if return_loss else None
    abs_sum = torch.zeros(n_queries, dtype=dtype, device=scores.device) if normalize else None
    _accumulate_pairs(ranked, plan, acc, loss, abs_sum, cutoff=cutoff, workspace_bytes=workspace_bytes,
                      signed_delta=fn.signed_delta, tie_weight=fn.tie_weight if tie_term else 0.0)
    acc[0].mul_(-sigma)
    acc[1].mul_(sigma * sigma)
    if normalize:
        abs_sum.mul_(2.0 * sigma)
        factor = torch.where(abs_sum > 0, torch.log2(1.0 + abs_sum) / abs_sum.clamp(
            min=torch.finfo(dtype).tiny), 1.0)
        acc.mul_(factor[:, None])
        if loss is not None:
            loss.mul_(factor)
    return _to_caller_layout(acc, loss, ranked.order, plan.qperm, scores.dtype)


@dataclass(frozen=True, kw_only=True)
class _Ranked:
    """A call's per-document inputs in (length order, rank order), the layout of the pair loop:
    σ-scaled scores ``s``, labels ``y``, mask ``m``, the weighting's ``terms``, and the optional
    pair weights (``half_w``, ``group``, ``upper_lower``); ``order`` maps back."""

    order: torch.Tensor
    s: torch.Tensor
    y: torch.Tensor
    m: torch.Tensor
    lengths: torch.Tensor
    terms: tuple
    half_w: torch.Tensor | None
    group: torch.Tensor | None
    upper_lower: list

    @classmethod
    def of(cls, scores, plan, fn, *, dtype, sigma, cutoff, gain, max_err_label, groups, pair_weights):
        # Queries in order of length (qperm None: they already are), then each query's documents
        # in order of rank (padding last).
        y, m, lengths, half_w = plan.sorted_batch(dtype)
        s = plan.to_plan_order(scores.detach().to(dtype))
        if not plan.full:
            s = s.masked_fill(~m, 0.0)
        # On the CPU the fastest tie-breaking sort; elsewhere one that never syncs (same order).
        order = rank_order(s, y, m, sync=scores.device.type == "cpu",
                           label_key=plan.label_key(plan_order=True) if dtype == torch.float32 else None)
        s, y, m = s.gather(1, order), y.gather(1, order), plan.ranked_mask(plan_order=True)
        if sigma != 1.0:
            s = s * sigma
        constants = plan.weighting_constants(fn, dtype, cutoff, gain, max_err_label)
        if constants is None:
            terms = fn.doc_terms(y, m, cutoff, gain, max_err_label)
        else:
            per_doc, per_position = constants
            terms = fn.doc_terms(y, m, cutoff, gain, max_err_label,
                                 constants=(tuple(t.gather(1, order) for t in per_doc), per_position))
        if half_w is not None:
            half_w = half_w.gather(1, order)
        group = None if groups is None else plan.to_plan_order(groups).gather(1, order).to(dtype)
        upper_lower = [plan.to_plan_order(t.detach().to(dtype)).gather(1, order).masked_fill_(~m, 0.0)
                       for t in pair_weights or ()]
        return cls(order=order, s=s, y=y, m=m, lengths=lengths, terms=terms, half_w=half_w, group=group,
                   upper_lower=upper_lower)


def _to_caller_layout(acc, loss, order, qperm, dtype) -> tuple:
    """(grad, hess[, loss]) from (length order, rank order) back to the caller's layout: one
    scatter per output."""
    n_docs = acc.shape[2]
    if qperm is None:
        place = lambda t: torch.empty_like(t).scatter_(1, order, t)
    else:
        index = (qperm[:, None] * n_docs + order).view(-1)
        place = lambda t: torch.empty_like(t).view(-1).index_copy_(0, index, t.reshape(-1)
                                                                   ).view(t.shape)
    out = [place(acc[0]).to(dtype), place(acc[1]).to(dtype)]
    if loss is not None:
        out.append(loss.to(dtype) if qperm is None else torch.empty_like(loss).index_copy_(0, qperm, loss).to(dtype))
    return tuple(out)


class _Pass:
    """What every block of one call shares: the per-document tensors ``per_doc`` and where the
    optional ones sit in it (``slot``), the reused ``work`` buffers, the b > a mask ``upper``,
    the sigmoid's form per block (``n_wide``, and off the CPU ``block_wide`` and ``direct``),
    the weighting's ``signed_delta`` and ``tie_weight``."""

    def __init__(self, ranked: _Ranked, plan, blocks, *, cutoff, cap, with_loss, signed_delta, tie_weight):
        s, dtype, device = ranked.s, ranked.s.dtype, ranked.s.device
        n_queries = s.shape[0]
        self.signed_delta, self.tie_weight, self.n_terms = signed_delta, tie_weight, len(ranked.terms)
        biggest = max((q1 - q0) * (r1 - r0) * (c1 - c0) for q0, q1, _, (r0, r1), (c0, c1), _ in blocks)
        # Reused buffers: [0] W, then ∂C/∂s_a / (−σ); [1] |W|, then the Newton term / σ²;
        # [2] 1/ρ's 1 + e^{−d}; [3] loss terms; [4] pair weights.
        self.work = torch.empty(3 + with_loss + (ranked.half_w is not None or bool(ranked.upper_lower)),
                                biggest, dtype=dtype, device=device)
        # Pairs (a, b) need b > a: upper[i, j] = j >= i, sliced for the blocks whose columns
        # overlap their rows (see _accumulate_block).
        tall = max((r1 - r0 for _, _, _, (r0, r1), (c0, _), _ in blocks if c0 < r1), default=0)
        self.upper = plan.cached(("upper", tall, dtype),
                                 lambda: torch.ones(tall, tall, dtype=dtype, device=device).triu_())
        # Per-document factors of the pair sigmoid: e^{z_a} e^{−z_b} = e^{σ(s_a − s_b)} with
        # z = σ s − centre, for the queries whose scores span at most _EXP_SPAN.
        last = s.gather(1, plan.cached("last", lambda: (ranked.lengths - 1).clamp(min=0)[:, None]))[:, 0]
        spread, centre = s[:, 0] - last, (s[:, 0] + last) * 0.5
        z = (s - centre[:, None]).clamp_(-_EXP_SPAN / 2 - 1, _EXP_SPAN / 2 + 1)
        exp_pos, exp_neg = torch.exp(z), torch.exp(z.neg_())
        wide = ~(spread <= _EXP_SPAN)  # NaN counts as wide
        self.direct = self.block_wide = None
        if device.type == "cpu":
            self.n_wide = [0] + wide.cumsum(0).tolist()
        else:
            # Asking the host which blocks hold a wide query would sync: each block computes
            # both forms and keeps one by a flag on the device (the CPU's choice, so the same
            # numbers), all blocks' flags in one indexing.
            self.n_wide = [0] * (n_queries + 1)
            cum = torch.cat([wide.new_zeros(1, dtype=torch.long), wide.cumsum(0)])
            q0s, q1s = plan.cached(("block_queries", cutoff, cap), lambda: upload(
                device, torch.tensor([b[0] for b in blocks]), torch.tensor([b[1] for b in blocks])))
            self.block_wide = cum[q1s] > cum[q0s]
            self.direct = torch.empty(biggest, dtype=dtype, device=device)
        self.per_doc = [s, exp_pos, exp_neg, *ranked.terms]
        upper_lower = ranked.upper_lower
        self.slot = {}  # where the optional per-document tensors sit in per_doc (None: absent)
        for name, t in (("half_w", ranked.half_w), ("group", ranked.group),
                        ("upper", upper_lower[0] if upper_lower else None),
                        ("lower", upper_lower[1] if upper_lower else None)):
            self.slot[name] = None if t is None else len(self.per_doc)
            if t is not None:
                self.per_doc.append(t)
        if not plan.full:
            self.per_doc.append(ranked.m.to(dtype))
        self.one = plan.cached(("one", dtype), lambda: torch.ones(1, 1, 1, dtype=dtype, device=device))

    def both(self, name, rows, cols):
        """(row view, column view) of the optional per-document tensor ``name``, or None."""
        return None if self.slot[name] is None else (rows[self.slot[name]], cols[self.slot[name]])


class _Block:
    """One block of pairs: positions a in rows [r0, r1), b in columns [c0, c1) of queries
    [q0, q1), as views into the pass's tensors (see :func:`_accumulate_block`)."""

    def __init__(self, p: _Pass, i, block, lay: Layout, loss, abs_sum):
        q0, q1, shortest, (r0, r1), (c0, c1), q_minor = block
        rows, cols = lay.cut(q0, q1, r0, r1, c0, c1)
        n_terms = p.n_terms
        width = min(r1, c1) - c0  # columns that overlap the rows: there b > a is needed
        self.s_a, self.s_b = rows[0], cols[0]
        self.exps = None if p.n_wide[q1] > p.n_wide[q0] else (
            rows[1], cols[2], p.one if q_minor else lay.ones[..., :c1 - c0],
            None if p.direct is None else (p.block_wide[i], p.direct))
        self.rows, self.cols = tuple(rows[3:3 + n_terms]), tuple(cols[3:3 + n_terms])
        self.tri = lay.tri(p.upper[:r1 - r0, c0 - r0 - 1:c0 - r0 - 1 + width]) if width > 0 else None
        self.pad = None if shortest >= c1 else cols[-1]
        self.half_w, self.group = p.both("half_w", rows, cols), p.both("group", rows, cols)
        self.upper_lower = None if p.slot["upper"] is None else p.both("upper", rows, cols) + p.both(
            "lower", rows, cols)
        self.layout, self.size = lay, (q1 - q0, r1 - r0, c1 - c0)
        self.acc_rows, self.acc_cols = lay.acc_rows(q0, q1, r0, r1), lay.acc_rows(q0, q1, c0, c1)
        self.loss = None if loss is None else loss[q0:q1]
        self.abs_sum = None if abs_sum is None else abs_sum[q0:q1]


def _accumulate_pairs(ranked: _Ranked, plan, acc, loss, abs_sum, *, cutoff, workspace_bytes,
                      signed_delta, tie_weight) -> None:
    """Add every pair of the plan's blocks to ``acc`` (and ``loss``, ``abs_sum``). Blocks in the
    query-minor layout accumulate into its [2, L, Q] transpose (see :class:`Layout`)."""
    device = ranked.s.device
    cap = max(1, workspace_bytes // (BUFFERS_PER_PAIR * acc.element_size()))
    cpu = device.type == "cpu"
    if cpu:
        cap = min(cap, CPU_BLOCK_PAIRS)
    blocks = plan.blocks(cutoff, cap, cpu)
    if not blocks:
        return
    p = _Pass(ranked, plan, blocks, cutoff=cutoff, cap=cap, with_loss=loss is not None, signed_delta=signed_delta,
              tie_weight=tie_weight)
    layouts, acc_t = {}, None
    for i, block in enumerate(blocks):
        q_minor = block[5]
        lay = layouts.get(q_minor)
        if lay is None:
            lay = layouts[q_minor] = Layout(q_minor, p.per_doc, acc)
            if q_minor:
                acc_t = lay.acc
        _accumulate_block(_Block(p, i, block, lay, loss, abs_sum), p)
    if acc_t is not None:
        acc.add_(acc_t.transpose(1, 2))


# Grades the fused Triton kernel takes: it forms 2^y in the scores' dtype (float32 overflows at 128).
_TRITON_MAX_GRADE = 64


def _triton_route(scores, plan, fn, tie_term, normalize, groups, pair_weights, triton) -> bool:
    """Whether this call runs the fused Triton kernel (:mod:`rankkit.kernels.triton.lambdas`):
    where ``triton`` asks for it (None: where :func:`rankkit.kernels.switches.triton_takes` the
    scores' device, i.e. a CUDA device with Triton installed unless ``RANKKIT_TRITON=0``; CPU
    tensors too with ``RANKKIT_TRITON=force``), for the RankNet and NDCG weightings without the
    options it lacks (``tie_term``, ``normalize``, ``groups``, ``pair_weights``; the loss is one
    of its outputs) and grades below 64; everything else runs the torch path (the reference and
    the fallback)."""
    if triton is None:
        triton = triton_takes(scores.device)
    if not triton or importlib.util.find_spec("triton") is None:
        return False
    if fn not in (WEIGHTINGS["ranknet"], WEIGHTINGS["ndcg"]) or tie_term or normalize:
        return False
    if groups is not None or pair_weights is not None:
        return False
    return plan.max_label < _TRITON_MAX_GRADE


def _accumulate_block(b: _Block, p: _Pass) -> None:
    """Add one block of pairs (positions a in rows, b in cols) to the outputs.

    The pair formula lives here and nowhere else. With W = sign(y_a − y_b)|ΔZ|, the pair
    oriented from higher to lower label has x = sign(W) σ(s_b − s_a), ρ = sigmoid(x),
    ∂C/∂s_a = −σ W ρ = −∂C/∂s_b, ∂²C/∂s² = σ² |W| ρ (1 − ρ) and C = |W| softplus(x).
    Positions are in rank order, so d = σ(s_b − s_a) <= 0 for every real pair, and with
    X = 1 + e^{−d} >= 2, p = sigmoid(d) = 1/X <= ½: ρ = p when W > 0 and 1 − p when W < 0,
    which gives, with no orientation pass and no cancellation,

        u = |W| / X = |W| p,   W ρ = min(W, 0) + u,   |W| ρ (1 − ρ) = u − u / X,
        C = |W| softplus(d) + min(W, 0) d,   softplus(d) = −log(1 − p) = −log1p(−1/X).

    ``exps`` (e^{z_a}, e^{−z_b}, 1, choice) with z = σ s − centre give X = 1 + e^{z_a} e^{−z_b}
    in one multiply-add (the exponentials are bounded, so X is finite); None: X = 1 + exp(σ(s_a −
    s_b)), which may be +inf (then u = 0). ``choice`` (off the CPU; else None) is (a 0-dim
    bool flag, a buffer): when the flag is set the second form replaces the first, so that
    the device takes the CPU's choice without asking the host for it. An equal-label pair (tie term, weight T) is
    oriented a over b: W = T, minus T/2 in W ρ and in min(W, 0) (so C gains −T d / 2).
    ``half_w`` and ``group`` (g_a, g_b) weight the pairs: (w_a + w_b)/2, times 0 when g_a = g_b;
    ``upper_lower`` (u_a, u_b, l_a, l_b) times u_a l_b when W >= 0 (a is the pair's higher
    label, or a tie oriented a over b) and u_b l_a when W < 0;
    ``abs_sum`` (the normalisation) is taken before that weight. ``layout`` (a
    :class:`rankkit.lambdas.blocks.Layout`) says how the block of ``size`` (q, r, c) pairs lies in
    the pass's ``work``; ``acc_rows`` and ``acc_cols`` are [2, ...] views of −grad / σ and hess / σ² at
    the rows and the columns (the caller applies the factors σ and σ²).
    """
    shape = b.layout.shape(*b.size)
    n = b.size[0] * b.size[1] * b.size[2]
    pair = p.work[:2, :n].view(2, *shape)
    w, a = pair[0], pair[1]
    x = p.work[2, :n].view(shape)
    ties, product = _signed_weights(b, p, w, a)
    _one_plus_exp(b, x, n, shape)
    low = w.clamp_(max=0.0)  # min(W, 0)
    if ties is not None:
        low.sub_(ties, alpha=0.5)
    omega = None if b.half_w is None else torch.add(b.half_w[0], b.half_w[1], out=p.work[-1, :n].view(shape))
    if b.group is not None:  # a pair inside a group weighs 0 (after abs_sum, which omega skips)
        keep = torch.ne(b.group[0], b.group[1]).to(w.dtype)
        omega = keep if omega is None else omega.mul_(keep)
    if product is not None:
        omega = product if omega is None else omega.mul_(product)
    each = b.layout.pair_dims
    if b.loss is not None:
        cost = p.work[3, :n].view(shape)
        torch.sub(b.s_b, b.s_a, out=cost).mul_(low)  # min(W, 0) d
        if omega is not None:
            cost.mul_(omega)
        b.loss.add_(cost.sum(each))
        # −|W| softplus(d) = |W| log1p(−p); the clamp only keeps masked pairs (p > ½) finite.
        torch.reciprocal(x, out=cost).neg_().clamp_(min=-0.5).log1p_().mul_(a)
        if omega is not None:
            cost.mul_(omega)
        b.loss.sub_(cost.sum(each))
    u = a.div_(x)  # |W| p
    g = low.add_(u)  # W ρ: ∂C/∂s_a = −σ W ρ
    if b.abs_sum is not None:
        b.abs_sum.add_(g.abs().sum(each))  # |λ_ab| / σ
    u.addcdiv_(u, x, value=-1.0)  # |W| p (1 − p)
    if omega is not None:
        pair.mul_(omega)
    per_col = pair.sum(1 + b.layout.col_dim)
    b.acc_rows.add_(pair.sum(1 + b.layout.row_dim))
    b.acc_cols[0].sub_(per_col[0])
    b.acc_cols[1].add_(per_col[1])


def _signed_weights(b: _Block, p: _Pass, w, a):
    """W = sign(y_a − y_b)|ΔZ| into ``w`` (b > a and real documents only, plus the tie term),
    |W| into ``a``; returns (the tie weights or None, the pair weights u l or None)."""
    p.signed_delta(b.rows, b.cols, w)
    if b.tri is not None:
        w[b.tri[0]].mul_(b.tri[1])
    if b.pad is not None:
        w.mul_(b.pad)
    ties = None
    if p.tie_weight:
        ties = (w == 0).to(w.dtype)
        if b.tri is not None:
            ties[b.tri[0]].mul_(b.tri[1])
        if b.pad is not None:
            ties.mul_(b.pad)
        ties.mul_(p.tie_weight)
        w.add_(ties)
    torch.abs(w, out=a)
    product = None
    if b.upper_lower is not None:  # taken while W still has its sign
        u_a, u_b, l_a, l_b = b.upper_lower
        product = torch.where(w >= 0, u_a * l_b, u_b * l_a)
    return ties, product


def _one_plus_exp(b: _Block, x, n, shape) -> None:
    """X = 1 + e^{σ(s_a − s_b)} into ``x``, from the per-document exponentials where the block
    allows (see :func:`_accumulate_block`)."""
    if b.exps is not None:
        torch.addcmul(b.exps[2], b.exps[0], b.exps[1], out=x)
        if b.exps[3] is not None:  # (the block holds a wide query: a 0-dim flag, a buffer)
            flag, buffer = b.exps[3]
            d = torch.sub(b.s_a, b.s_b, out=buffer[:n].view(shape)).exp_().add_(1.0)
            torch.where(flag, d, x, out=x)
    else:
        torch.sub(b.s_a, b.s_b, out=x).exp_().add_(1.0)


def _check(scores, labels, *, mask, weighting, sigma, k, gain, weights, max_err_label, workspace_bytes, groups,
           pair_weights, defer: list):
    """Validate the public arguments once; return (scores, labels, mask, weights, groups,
    pair_weights) on the scores' device, mask all True for None, and the weighting to use. The
    tensors' values are checked by the conditions put in ``defer`` (the plan's copy checks them)."""
    if isinstance(weighting, Weighting):
        fn = weighting
    else:
        fn = WEIGHTINGS[_checks.check_choice(weighting, WEIGHTINGS, "weighting")]
    _checks.check_number(sigma, "sigma", low=0.0, low_open=True)
    _checks.check_k(k)
    _checks.check_gain(gain)
    _checks.check_int(workspace_bytes, "workspace_bytes", low=1)
    if max_err_label is not None:
        _checks.check_number(max_err_label, "max_err_label", low=0.0)
    if groups is not None:
        _checks.check_tensor(groups, "groups", shape=scores.shape if isinstance(
            scores, torch.Tensor) else None, kind="int")

    if pair_weights is not None:
        if not isinstance(pair_weights, (tuple, list)) or len(pair_weights) != 2:
            raise ValueError(f"`pair_weights` has to be a pair (upper, lower) of [Q, L] tensors, "
                             f"got {_checks.describe(pair_weights)}")
        for t in pair_weights:
            _checks.check_tensor(t, "pair_weights", shape=scores.shape if isinstance(
                scores, torch.Tensor) else None)
    moved = []

    def extra(labels, mask):
        conditions = []
        for t in pair_weights or ():
            moved.append(_checks.to_device(t, labels.device))
            conditions.append(_checks.weights_condition(moved[-1], mask, "pair_weights"))
        if groups is not None:
            g = _checks.to_device(groups, labels.device)
            conditions.append(("groups", g, (g.abs() >= 2**24) & mask,
                               "ids below 2^24 in absolute value on real documents"))
        if max_err_label is not None and fn is WEIGHTINGS["err"]:
            conditions.append(("labels", labels, (labels > max_err_label) & mask,
                               f"at most `max_err_label` ({max_err_label:g}) on real documents"))
        return conditions

    scores, labels, mask, weights = _checks.check_batch(scores, labels, mask, weights=weights, extra=extra,
                                                        defer=defer)
    return (scores, labels, mask, weights, _checks.to_device(groups, scores.device),
            tuple(moved) or None, fn)
