r"""Unbiased LambdaMART's position biases, estimated jointly with the ranker from clicks.

Hu, Wang, Peng, Li, "Unbiased LambdaMART: An Unbiased Pairwise Learning-to-Rank Algorithm",
WWW 2019. A click log's pairs are (i, j) with i clicked and j not, in the same session. The
click of i is discounted by the *click bias* t⁺ of its displayed position and the non-click of
j by the *unclick bias* t⁻ of its position: the pair's cost is C_ij / (t⁺_{pos i} t⁻_{pos j}),
with the LambdaMART cost on the clicks as labels (gain 2^c − 1, ranks by the current scores)::

    C_ij = |ΔNDCG_ij| log(1 + exp(−σ (s_i − s_j)))

The paper minimises, over the ranker f and the biases, with t⁺_0 = t⁻_0 = 1 (0-based positions),

    Σ_sessions Σ_(i,j) C_ij / (t⁺_{pos i} t⁻_{pos j}) + ‖t⁺‖_p^p + ‖t⁻‖_p^p.

Setting the derivative in t⁺_a to zero gives Σ_b C[a, b] / t⁻_b = p (t⁺_a)^{p+1}, where
C[a, b] sums C_ij over pairs with i at position a and j at position b. Dividing by the same at
position 0 removes the constant, which is the update implemented here (the paper's closed
forms for the positive and negative biases, with exponent 1/(p + 1))::

    t⁺_a = ( Σ_b C[a, b] / t⁻_b  /  Σ_b C[0, b] / t⁻_b )^{1/(p+1)}
    t⁻_b = ( Σ_a C[a, b] / t⁺_a  /  Σ_a C[a, 0] / t⁺_a )^{1/(p+1)}

both from the previous t⁺, t⁻ (a simultaneous update, as the authors' LightGBM code does once
per boosting round). ``p`` is the regularisation norm: p = 1 (exponent ½) is the authors'
released default (their ``eta = 0.5`` is 1/(p+1)); p → 0 (exponent 1) is the unregularised
limit, under which t⁺ is the inverse-loss share of each position. With the scores fixed, the
update is a Sinkhorn-type scaling of C and repeated steps converge; with p = 0 and documents
that are exchangeable across positions (C[a, b] ∝ θ_a w_b), t⁺_a / t⁺_0 = θ_a / θ_0, the
examination ratio of a position-based model (the recovery test in tests/test_clicks.py).

Positions at or beyond ``n_positions − 1`` share the last bucket (the authors'
``position_bins``). A bucket that received no pair keeps its previous bias.

The pairs are built explicitly per session as a [Q, K, K] tensor over the shown top-K, in
chunks of about 2^20 pairs: fine for K up to ~50 (a display page), wasteful for long lists.

How the biases reach a model: :meth:`PropensityEstimator.pair_factors` gives per-document
factors ``(upper, lower) = (1 / t⁺(pos), 1 / t⁻(pos))``, [Q, L] each, so that the pair (i, j)
with y_i > y_j weighs ``upper_i · lower_j``: the lambda kernel's ``pair_weights``.
:func:`debiased_pair_loss` is the same weighted cost written out in plain torch (a reference
and a loss for small neural models).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from rankkit._checks import (
    check_choice,
    check_int,
    check_k,
    check_number,
    check_tensor,
    check_tensors,
    finite_condition,
    to_device,
    weights_condition,
)
from rankkit._ranking import discounts, ideal_dcg, ranks

__all__ = ["PAIR_WEIGHTINGS", "PropensityEstimator", "debiased_pair_loss", "pair_costs",
           "position_pair_costs", "propensity_step"]

PAIR_WEIGHTINGS = ("ndcg", "ranknet")

# Pairs materialised at once by the explicit [Q, K, K] computation.
_CHUNK_PAIRS = 1 << 20


def _check_clicks(scores, clicks, positions, mask, *, need_positions: bool = True):
    """Shapes, kinds and values of a click batch; returns (clicks bool, positions, mask)."""
    check_tensor(scores, "scores", ndim=2, kind="float")
    device = scores.device
    clicks = to_device(check_tensor(clicks, "clicks", shape=scores.shape), device)
    if mask is None:
        mask = torch.ones(scores.shape, dtype=torch.bool, device=device)
    else:
        mask = to_device(check_tensor(mask, "mask", shape=scores.shape, kind="bool"), device)
    conditions = [finite_condition(scores.detach(), mask, "scores"),
                  ("clicks", clicks, ~((clicks == 0) | (clicks == 1)) & mask, "0 or 1 on real documents")]
    if need_positions:
        positions = to_device(check_tensor(positions, "positions", shape=scores.shape, kind="int"), device)
        conditions.append(("positions", positions, (positions < 0) & mask, "non-negative on real documents"))
    check_tensors(*conditions)
    return clicks == 1, positions, mask


def _pair_costs(scores, clicked, mask, sigma, weighting, k):
    # [Q, L, L]: C_ij for i clicked and j not (both real), zero elsewhere; |ΔZ| is a constant.
    real_clicked = clicked & mask
    pairs = real_clicked[:, :, None] & (mask & ~clicked)[:, None, :]
    diff = scores[:, :, None] - scores[:, None, :]
    cost = F.softplus(-sigma * diff)
    if weighting == "ndcg":
        with torch.no_grad():
            labels = real_clicked.to(scores.dtype)
            r = ranks(scores.detach(), labels, mask)
            d = discounts(scores.shape[1], dtype=scores.dtype, device=scores.device)[r]
            if k is not None:
                d = torch.where(r < k, d, 0.0)
            idcg = ideal_dcg(labels, mask, k=k)
            inv = torch.where(idcg > 0, 1.0 / idcg.clamp(min=torch.finfo(idcg.dtype).tiny), 0.0)
            # gain 2^c − 1 is 1 for the clicked i and 0 for the unclicked j
            delta = (d[:, :, None] - d[:, None, :]).abs() * inv[:, None, None]
        cost = cost * delta
    return torch.where(pairs, cost, 0.0)


def pair_costs(scores, clicks, *, mask=None, sigma: float = 1.0, weighting: str = "ndcg",
               k: int | None = None) -> torch.Tensor:
    """Every session's clicked-over-unclicked pair costs, written out.

    C_ij = |ΔZ_ij| log(1 + exp(−σ(s_i − s_j))) for i clicked and j not clicked, with |ΔZ| the
    |ΔNDCG@k| of swapping i and j in the ranking by ``scores`` on the clicks as labels
    (``"ndcg"``) or 1 (``"ranknet"``).

    Args:
        scores: [Q, L] float scores of the shown documents.
        clicks: [Q, L] 0/1 clicks.
        mask: [Q, L] bool, True on real documents; None means all True.
    Returns:
        [Q, L, L] in the scores' dtype, zero where (i, j) is not a clicked/unclicked pair.

    >>> c = pair_costs(torch.zeros(1, 2), torch.tensor([[0., 1.]]), weighting="ranknet")
    >>> c  # the one pair (1, 0): log(1 + e^0) = log 2
    tensor([[[0.0000, 0.0000],
             [0.6931, 0.0000]]])
    """
    clicked, _, mask = _check_clicks(scores, clicks, None, mask, need_positions=False)
    sigma = check_number(sigma, "sigma", low=0.0, low_open=True)
    weighting = check_choice(weighting, PAIR_WEIGHTINGS, "weighting")
    return _pair_costs(scores, clicked, mask, sigma, weighting, check_k(k))


def _position_pair_costs(scores, clicked, positions, mask, n_positions, sigma, weighting, k):
    n_q, length = scores.shape
    total = torch.zeros(n_positions * n_positions, dtype=torch.float64, device=scores.device)
    bucket = positions.clamp(max=n_positions - 1).long()
    step = max(1, _CHUNK_PAIRS // max(1, length * length))
    for q0 in range(0, n_q, step):
        sl = slice(q0, q0 + step)
        cost = _pair_costs(scores[sl].detach().double(), clicked[sl], mask[sl], sigma, weighting, k)
        key = bucket[sl, :, None] * n_positions + bucket[sl, None, :]
        total.index_add_(0, key.reshape(-1), cost.reshape(-1))
    return total.view(n_positions, n_positions)


def position_pair_costs(scores, clicks, positions, *, mask=None, n_positions: int = 10,
                        sigma: float = 1.0, weighting: str = "ndcg", k: int | None = None) -> torch.Tensor:
    """The pair costs of :func:`pair_costs` summed by (position of i, position of j).

    Args:
        scores: [Q, L] float scores of the shown documents.
        clicks: [Q, L] 0/1 clicks.
        positions: [Q, L] integer 0-based displayed ranks; ranks from ``n_positions − 1`` on
            share the last bucket.
        mask: [Q, L] bool, True on real documents; None means all True.
    Returns:
        [n_positions, n_positions] float64 C with C[a, b] = Σ C_ij over pairs with the clicked
        i at position a and the unclicked j at position b.

    >>> c = position_pair_costs(torch.zeros(1, 2), torch.tensor([[0., 1.]]), torch.tensor([[0, 1]]),
    ...                         n_positions=2, weighting="ranknet")
    >>> c  # clicked at position 1 over unclicked at 0: log 2
    tensor([[0.0000, 0.0000],
            [0.6931, 0.0000]], dtype=torch.float64)
    """
    clicked, positions, mask = _check_clicks(scores, clicks, positions, mask)
    n_positions = check_int(n_positions, "n_positions")
    sigma = check_number(sigma, "sigma", low=0.0, low_open=True)
    weighting = check_choice(weighting, PAIR_WEIGHTINGS, "weighting")
    return _position_pair_costs(scores, clicked, positions, mask, n_positions, sigma, weighting, check_k(k))


def propensity_step(costs: torch.Tensor, t_plus: torch.Tensor, t_minus: torch.Tensor, *,
                    p: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """One simultaneous update of the click and unclick biases (the module's closed forms).

    Args:
        costs: [P, P] position-bucketed pair costs C (:func:`position_pair_costs`).
        t_plus: [P] current click biases, t_minus: [P] current unclick biases (positive).
        p: the regularisation norm, ≥ 0; the exponent is 1 / (p + 1).
    Returns:
        (t_plus, t_minus), each [P] with entry 0 equal to 1; a position without pairs keeps its
        value, and without pairs at position 0 nothing changes.

    >>> costs = torch.tensor([[0., 2.], [1., 0.]], dtype=torch.float64)
    >>> propensity_step(costs, torch.ones(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64), p=0)
    (tensor([1.0000, 0.5000], dtype=torch.float64), tensor([1., 2.], dtype=torch.float64))
    """
    exponent = 1.0 / (check_number(p, "p", low=0.0) + 1.0)
    plus_mass = costs @ (1.0 / t_minus)
    minus_mass = costs.t() @ (1.0 / t_plus)

    def scaled(mass, old):
        if not bool(mass[0] > 0):
            return old.clone()
        return torch.where(mass > 0, (mass / mass[0]) ** exponent, old)

    return scaled(plus_mass, t_plus), scaled(minus_mass, t_minus)


def debiased_pair_loss(scores, clicks, *, upper, lower, mask=None, sigma: float = 1.0,
                       weighting: str = "ndcg", k: int | None = None) -> torch.Tensor:
    """Σ over clicked/unclicked pairs of upper_i · lower_j · C_ij, per session (differentiable).

    The explicit form of what the lambda kernel computes with ``pair_weights=(upper, lower)``
    and the clicks as labels; its gradient in ``scores`` is the debiased lambda.

    Args:
        scores: [Q, L] float scores; clicks: [Q, L] 0/1; upper, lower: [Q, L] non-negative
            factors (:meth:`PropensityEstimator.pair_factors`); mask: [Q, L] bool or None.
    Returns:
        [Q] loss in the scores' dtype.

    >>> s, c = torch.zeros(1, 2), torch.tensor([[0., 1.]])
    >>> debiased_pair_loss(s, c, upper=torch.tensor([[1., 0.5]]), lower=torch.tensor([[0.5, 1.]]),
    ...                    weighting="ranknet")  # 0.5 · 0.5 · log 2
    tensor([0.1733])
    """
    clicked, _, mask = _check_clicks(scores, clicks, None, mask, need_positions=False)
    upper = to_device(check_tensor(upper, "upper", shape=scores.shape, kind="float"), scores.device)
    lower = to_device(check_tensor(lower, "lower", shape=scores.shape, kind="float"), scores.device)
    check_tensors(weights_condition(upper, mask, "upper"), weights_condition(lower, mask, "lower"))
    sigma = check_number(sigma, "sigma", low=0.0, low_open=True)
    weighting = check_choice(weighting, PAIR_WEIGHTINGS, "weighting")
    cost = _pair_costs(scores, clicked, mask, sigma, weighting, check_k(k))
    weight = upper.to(scores.dtype)[:, :, None] * lower.to(scores.dtype)[:, None, :]
    return (cost * weight).sum((1, 2))


class PropensityEstimator:
    """Click and unclick position biases t⁺, t⁻ of Unbiased LambdaMART (see the module).

    Use: once per boosting round (or epoch), :meth:`update` with the current scores of the
    click log's sessions (or :meth:`accumulate` batch by batch, then :meth:`step`), then weigh
    the next round's pairs by :meth:`pair_factors`.

    Args:
        n_positions: P, the position buckets (positions ≥ P − 1 share the last one).
        p: regularisation norm ≥ 0 (exponent 1 / (p + 1)); 1 is the authors' default,
            0 the unregularised estimate.
        sigma, weighting, k: the pair cost's σ, |ΔZ| ("ndcg" as the paper, or "ranknet") and
            NDCG cutoff.

    Attributes:
        t_plus: [P] float64 click biases, t_plus[0] == 1 (the learned propensity ratios).
        t_minus: [P] float64 unclick biases, t_minus[0] == 1.
        costs: [P, P] float64 pair costs accumulated since the last step.

    >>> est = PropensityEstimator(2, p=0, weighting="ranknet")
    >>> _ = est.update(torch.zeros(2, 2), torch.tensor([[1., 0.], [0., 1.]]), torch.tensor([[0, 1], [0, 1]]))
    >>> est.t_plus.tolist(), est.t_minus.tolist()
    ([1.0, 1.0], [1.0, 1.0])
    """

    def __init__(self, n_positions: int = 10, *, p: float = 1.0, sigma: float = 1.0,
                 weighting: str = "ndcg", k: int | None = None):
        self.n_positions = check_int(n_positions, "n_positions")
        self.p = check_number(p, "p", low=0.0)
        self.sigma = check_number(sigma, "sigma", low=0.0, low_open=True)
        self.weighting = check_choice(weighting, PAIR_WEIGHTINGS, "weighting")
        self.k = check_k(k)
        self.t_plus = torch.ones(self.n_positions, dtype=torch.float64)
        self.t_minus = torch.ones(self.n_positions, dtype=torch.float64)
        self.costs = torch.zeros(self.n_positions, self.n_positions, dtype=torch.float64)

    def __repr__(self) -> str:
        return (f"PropensityEstimator(n_positions={self.n_positions}, p={self.p:g}, "
                f"t_plus={[round(v, 4) for v in self.t_plus.tolist()]})")

    def accumulate(self, scores, clicks, positions, mask=None) -> PropensityEstimator:
        """Add a batch's position-bucketed pair costs (scores [Q, L], clicks, positions, mask)."""
        clicked, positions, mask = _check_clicks(scores, clicks, positions, mask)
        costs = _position_pair_costs(scores, clicked, positions, mask, self.n_positions, self.sigma,
                                     self.weighting, self.k)
        self.costs += costs.cpu()
        return self

    def step(self, iterations: int = 1) -> PropensityEstimator:
        """Apply the closed-form update ``iterations`` times to the accumulated costs, then clear them.

        More than one iteration solves for the biases with the scores held fixed.
        """
        iterations = check_int(iterations, "iterations")
        for _ in range(iterations):
            self.t_plus, self.t_minus = propensity_step(self.costs, self.t_plus, self.t_minus, p=self.p)
        self.costs.zero_()
        return self

    def update(self, scores, clicks, positions, mask=None, *, iterations: int = 1) -> PropensityEstimator:
        """:meth:`accumulate` one batch, then :meth:`step`.

        Args:
            scores: [Q, L] float current scores of the shown documents.
            clicks: [Q, L] 0/1 clicks.
            positions: [Q, L] integer 0-based displayed ranks.
            mask: [Q, L] bool, True on real documents; None means all True.
            iterations: closed-form updates with these scores fixed.
        """
        return self.accumulate(scores, clicks, positions, mask).step(iterations)

    def pair_factors(self, positions, mask=None, *, dtype: torch.dtype = torch.float32
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-document factors for the kernel's ``pair_weights``.

        Args:
            positions: [Q, L] integer 0-based displayed ranks.
            mask: [Q, L] bool, True on real documents; None means all True.
        Returns:
            (upper, lower), each [Q, L] in ``dtype`` on the positions' device: 1 / t⁺ and
            1 / t⁻ of each document's position bucket, zero on padding. The pair (i, j) with
            i clicked and j not weighs upper_i · lower_j.
        """
        check_tensor(positions, "positions", ndim=2, kind="int")
        if mask is None:
            mask = torch.ones(positions.shape, dtype=torch.bool, device=positions.device)
        else:
            mask = to_device(check_tensor(mask, "mask", shape=positions.shape, kind="bool"), positions.device)
        check_tensors(("positions", positions, (positions < 0) & mask, "non-negative on real documents"))
        bucket = positions.clamp(0, self.n_positions - 1).long()
        inv_plus = (1.0 / self.t_plus).to(positions.device, dtype)
        inv_minus = (1.0 / self.t_minus).to(positions.device, dtype)
        return inv_plus[bucket].masked_fill(~mask, 0.0), inv_minus[bucket].masked_fill(~mask, 0.0)
