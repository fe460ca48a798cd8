r"""Position bias from clicks: what each displayed position does to the chance of a click.

Two estimators. :class:`PropensityEstimator` learns Unbiased LambdaMART's click and unclick
biases jointly with the ranker (``unbiased=True``, described next); :class:`RegressionEM`
estimates examination probabilities from a log once, before training (``unbiased="ips"``, by
:func:`ips_propensities`, and the click-log metrics); :class:`FixedPropensities` holds such
fixed ones where the estimator's pair factors are asked for. :class:`PositionIds` reads displayed
positions as LightGBM does (any integer ids, mapped to dense buckets).

**Unbiased LambdaMART.** Hu, Wang, Peng, Li, "Unbiased LambdaMART: An Unbiased Pairwise Learning-to-Rank Algorithm",
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
examination ratio of a position-based model (the recovery test in tests/data/test_clicks.py).

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

import functools

import torch
import torch.nn.functional as F

from rankkit.clicks.log import aggregate, session_log
from rankkit.infra.checks import (
    batch_mask,
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
from rankkit.infra.transfer import upload
from rankkit.lambdas.ranking import discounts, ideal_dcg, ranks
from rankkit.scorers import MLPScorer

__all__ = ["AUTO_CLIP_FACTOR", "EM_SETTINGS", "PAIR_WEIGHTINGS", "FixedPropensities", "PositionIds",
           "PropensityEstimator", "RegressionEM", "auto_clip", "check_clip", "click_log_likelihood",
           "clicked_positions", "debiased_pair_loss", "em_posteriors", "em_step", "ips_propensities", "pair_costs",
           "position_pair_costs", "propensity_step"]

PAIR_WEIGHTINGS = ("ndcg", "ranknet")

# Pairs materialised at once by the explicit [Q, K, K] computation.
_CHUNK_PAIRS = 1 << 20


def _check_clicks(scores, clicks, positions, mask, *, need_positions: bool = True):
    """Shapes, kinds and values of a click batch; returns (clicks bool, positions, mask)."""
    check_tensor(scores, "scores", ndim=2, kind="float")
    device = scores.device
    clicks = to_device(check_tensor(clicks, "clicks", shape=scores.shape), device)
    mask = batch_mask(mask, scores)
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
    if weighting == "ndcg":  # gain 2^c − 1 is 1 for the clicked i and 0 for the unclicked j
        d, inv = _pair_discounts(scores.detach(), real_clicked, mask, k)
        cost = cost * ((d[:, :, None] - d[:, None, :]).abs() * inv[:, None, None])
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


#: The most position buckets (the estimator keeps a [P, P] float64 table: 128 MiB at 4096).
MAX_POSITIONS = 4096


class PositionIds:
    """A click log's displayed positions as LightGBM reads ``position``: integer *ids*, any
    numbering (0- or 1-based, sparse like 0, 5, 10, ..., even negative), ranked by value.

    The distinct ids of the training log, sorted, become the dense positions 0, 1, ... that the
    debiasings index (the smallest id is the top slot, the one whose bias is 1), so a log and the
    same log with every position + 1 train the same model. Later calls (an eval set's positions)
    map through the same ids; an id the training log never showed is refused, naming it.

    More distinct ids than ``n_positions`` are refused unless ``pool`` is set: then the ids from
    the ``n_positions``-th on share the last bias (with any id past the largest one seen).

    >>> ids = PositionIds.of(torch.tensor([1, 2, 3, 1, 2]), "position", n_positions=10)
    >>> ids.ids.tolist(), ids.index(torch.tensor([3, 1]), "eval_position[0]").tolist()
    ([1, 2, 3], [2, 0])
    """

    def __init__(self, ids: torch.Tensor, n_positions: int, pool: bool):
        self.ids = ids
        self.n_positions = n_positions
        self.pool = pool

    @functools.cached_property
    def identity(self) -> bool:
        """Whether the ids are 0, 1, 2, ... themselves (each known id is its own dense index)."""
        return bool(torch.equal(self.ids, torch.arange(len(self.ids), dtype=self.ids.dtype)))

    @classmethod
    def of(cls, position: torch.Tensor, name: str, *, n_positions: int, pool: bool = False) -> PositionIds:
        """The ids of a training log's [N] integer ``position`` (named ``name`` in errors)."""
        n_positions = check_int(n_positions, "n_positions", low=1, high=MAX_POSITIONS)
        ids = torch.unique(position.long().cpu())
        if len(ids) > n_positions and not pool:
            raise ValueError(f"`{name}` holds {len(ids)} distinct position ids ({int(ids[0])}..{int(ids[-1])}), "
                             f"more than n_positions={n_positions}: pass n_positions={len(ids)} to give each its "
                             f"own bias, or pool_positions=True to let the ids beyond the first "
                             f"{n_positions - 1} share the last one")
        return cls(ids, n_positions, pool)

    @classmethod
    def dense(cls, position: torch.Tensor, name: str, *, n_positions: int,
              pool: bool = False) -> tuple[PositionIds, torch.Tensor]:
        """(the ids of a training log's ``position``, its positions as dense indices)."""
        ids = cls.of(position, name, n_positions=n_positions, pool=pool)
        return ids, ids.index(position, name)

    def index(self, position: torch.Tensor, name: str) -> torch.Tensor:
        """[N] long dense positions 0..n_positions − 1 of the ids ``position`` (same device)."""
        flat = position.long().cpu()
        at = torch.searchsorted(self.ids, flat).clamp(max=len(self.ids) - 1) if len(self.ids) else flat
        known = self.ids[at] == flat if len(self.ids) else torch.zeros_like(flat, dtype=torch.bool)
        beyond = flat > self.ids[-1] if self.pool and len(self.ids) else torch.zeros_like(known)
        bad = ~(known | beyond)
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            raise ValueError(f"`{name}` holds position id {int(flat[i])} at index {i}, which the training log "
                             f"never showed (its ids: {_ids_text(self.ids)})")
        dense = torch.where(beyond, len(self.ids) - 1, at).clamp(max=self.n_positions - 1)
        return dense.to(position.device)


def _ids_text(ids: torch.Tensor) -> str:
    values = ids.tolist()
    return ", ".join(map(str, values)) if len(values) <= 12 else f"{len(values)} ids from {values[0]} to {values[-1]}"


def _position_pair_costs(scores, clicked, positions, mask, n_positions, sigma, weighting, k):
    # On the CPU only the (clicked, unclicked) pairs are evaluated: a session showing L documents
    # with c clicks has c (L − c) of them among its L² (about a tenth at one click in ten). Each
    # pair's cost is :func:`_pair_costs`' number, added in the same (row-major) order. Off the CPU
    # every pair of a chunk is evaluated and the others weigh 0: finding the pairs (``nonzero``)
    # would wait for the device; the sums then differ from the CPU's in float64 rounding only.
    total = torch.zeros(n_positions * n_positions, dtype=torch.float64, device=scores.device)
    bucket = positions.clamp(max=n_positions - 1).long()
    s = scores.detach().double()
    real_clicked = clicked & mask
    unclicked = mask & ~clicked
    d = inv = None
    if weighting == "ndcg":
        d, inv = _pair_discounts(s, real_clicked, mask, k)
    step = max(1, _CHUNK_PAIRS // max(1, s.shape[1] * s.shape[1]))
    for q0 in range(0, s.shape[0], step):
        if s.device.type != "cpu":
            _add_dense_pair_costs(total, s[q0:q0 + step], real_clicked[q0:q0 + step], unclicked[q0:q0 + step],
                                  bucket[q0:q0 + step], n_positions, sigma,
                                  None if d is None else (d[q0:q0 + step], inv[q0:q0 + step]))
            continue
        q, a, b = (real_clicked[q0:q0 + step, :, None] & unclicked[q0:q0 + step, None, :]).nonzero(as_tuple=True)
        q = q + q0
        cost = F.softplus(-sigma * (s[q, a] - s[q, b]))
        if weighting == "ndcg":
            cost = cost * ((d[q, a] - d[q, b]).abs() * inv[q])
        total.index_add_(0, bucket[q, a] * n_positions + bucket[q, b], cost)
    return total.view(n_positions, n_positions)


def _add_dense_pair_costs(total, s, real_clicked, unclicked, bucket, n_positions, sigma, discounts) -> None:
    """Add a chunk's pair costs [q, L, L] to ``total`` [P²] by (bucket of i, bucket of j), every
    pair evaluated and those that are not (clicked i, unclicked j) weighing 0 (no host sync)."""
    cost = F.softplus(-sigma * (s[:, :, None] - s[:, None, :]))
    if discounts is not None:
        d, inv = discounts
        cost = cost * ((d[:, :, None] - d[:, None, :]).abs() * inv[:, None, None])
    cost = torch.where(real_clicked[:, :, None] & unclicked[:, None, :], cost, 0.0)
    total.index_add_(0, (bucket[:, :, None] * n_positions + bucket[:, None, :]).reshape(-1), cost.reshape(-1))


def _pair_discounts(scores, real_clicked, mask, k):
    """(the discount of each document's current rank, 0 from ``k`` on [Q, L]; 1 / the ideal DCG@k
    of the clicks [Q], 0 where that is 0): |ΔNDCG| of a clicked/unclicked pair is |d_i − d_j| inv."""
    with torch.no_grad():
        labels = real_clicked.to(scores.dtype)
        r = ranks(scores, labels, mask)
        d = discounts(scores.shape[1], dtype=scores.dtype, device=scores.device)[r]
        if k is not None:
            d = torch.where(r < k, d, 0.0)
        idcg = ideal_dcg(labels, mask, k=k, grades=1)  # clicks: grades 0 and 1 (no host sync)
        return d, torch.where(idcg > 0, 1.0 / idcg.clamp(min=torch.finfo(idcg.dtype).tiny), 0.0)


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
        clip: bound on each inverse bias 1/t⁺, 1/t⁻ in :meth:`pair_factors` (≥ 1; None: no
            bound), so a pair weighs at most clip²: the propensity clipping of Joachims,
            Swaminathan, Schnabel (WSDM 2017), against the variance of deep, rarely clicked
            positions. The biases themselves are not clipped.

    Attributes:
        t_plus: [P] float64 click biases, t_plus[0] == 1 (the learned propensity ratios).
        t_minus: [P] float64 unclick biases, t_minus[0] == 1.
        costs: [P, P] float64 pair costs accumulated since the last step.
        learns: True: :meth:`step` updates the biases from the accumulated costs (False for
            :class:`FixedPropensities`).

    >>> est = PropensityEstimator(2, p=0, weighting="ranknet")
    >>> _ = est.update(torch.zeros(2, 2), torch.tensor([[1., 0.], [0., 1.]]), torch.tensor([[0, 1], [0, 1]]))
    >>> est.t_plus.tolist(), est.t_minus.tolist()
    ([1.0, 1.0], [1.0, 1.0])
    """

    learns = True

    def __init__(self, n_positions: int = 10, *, p: float = 1.0, sigma: float = 1.0,
                 weighting: str = "ndcg", k: int | None = None, clip: float | None = None):
        # a [P, P] table of pair costs is kept: 4096 positions (128 MiB) is far past any click log
        self.n_positions = check_int(n_positions, "n_positions", low=1, high=MAX_POSITIONS)
        self.clip = None if clip is None else check_number(clip, "clip", low=1.0)
        self.p = check_number(p, "p", low=0.0)
        self.sigma = check_number(sigma, "sigma", low=0.0, low_open=True)
        self.weighting = check_choice(weighting, PAIR_WEIGHTINGS, "weighting")
        self.k = check_k(k)
        # host tensors, whatever the default device (a checkpoint loads its module on "meta")
        self.t_plus = torch.ones(self.n_positions, dtype=torch.float64, device="cpu")
        self.t_minus = torch.ones(self.n_positions, dtype=torch.float64, device="cpu")
        self.costs = torch.zeros(self.n_positions, self.n_positions, dtype=torch.float64, device="cpu")

    def __repr__(self) -> str:
        return (f"PropensityEstimator(n_positions={self.n_positions}, p={self.p:g}, "
                f"t_plus={[round(v, 4) for v in self.t_plus.tolist()]})")

    def accumulate(self, scores, clicks, positions, mask=None) -> PropensityEstimator:
        """Add a batch's position-bucketed pair costs (scores [Q, L], clicks, positions, mask)."""
        clicked, positions, mask = _check_clicks(scores, clicks, positions, mask)
        return self.add_costs(_position_pair_costs(scores, clicked, positions, mask, self.n_positions, self.sigma,
                                                   self.weighting, self.k))

    def add_costs(self, costs: torch.Tensor) -> PropensityEstimator:
        """Add [P, P] position-bucketed pair costs computed elsewhere (the compiled pass,
        :func:`rankkit.kernels.cpu.position_costs`)."""
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
            1 / t⁻ of each document's position bucket (at most ``clip``), zero on padding. The pair (i, j) with
            i clicked and j not weighs upper_i · lower_j.
        """
        check_tensor(positions, "positions", ndim=2, kind="int")
        if mask is None:
            mask = torch.ones(positions.shape, dtype=torch.bool, device=positions.device)
        else:
            mask = to_device(check_tensor(mask, "mask", shape=positions.shape, kind="bool"), positions.device)
        check_tensors(("positions", positions, (positions < 0) & mask, "non-negative on real documents"))
        bucket = positions.clamp(0, self.n_positions - 1).long()
        inv_plus, inv_minus = self._inverse_biases(positions.device, dtype)
        return inv_plus[bucket].masked_fill(~mask, 0.0), inv_minus[bucket].masked_fill(~mask, 0.0)

    def _inverse_biases(self, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(1 / t⁺, 1 / t⁻), clipped, on ``device`` in ``dtype``: copied from the host once per
        value of the biases (from pinned memory, without waiting for the device), not once per
        batch. The biases live on the host: their values are compared with the last copy's (P
        numbers; whatever wrote them, in place, through ``.data`` or numpy, or replaced them)."""
        key = (self.clip, device, dtype)
        cached = self.__dict__.get("_inverse")
        if (cached is not None and cached[0] == key and torch.equal(cached[1], self.t_plus)
                and torch.equal(cached[2], self.t_minus)):
            return cached[3]
        inv_plus, inv_minus = 1.0 / self.t_plus, 1.0 / self.t_minus
        if self.clip is not None:
            inv_plus, inv_minus = inv_plus.clamp(max=self.clip), inv_minus.clamp(max=self.clip)
        value = tuple(upload(device, inv_plus.to(dtype), inv_minus.to(dtype)))  # one copy that does not wait
        self._inverse = (key, self.t_plus.clone(), self.t_minus.clone(), value)
        return value



class FixedPropensities(PropensityEstimator):
    """Propensities given rather than learned: the inverse-propensity weighting of pairs.

    The pair (clicked i, unclicked j) weighs min(θ_0 / θ_{pos i}, clip): the click of i is
    divided by its position's examination probability (Joachims, Swaminathan, Schnabel,
    "Unbiased Learning-to-Rank with Biased Feedback", WSDM 2017; with ``clip``, their clipped
    estimator). θ comes from elsewhere, e.g. :class:`RegressionEM` on the training log; the
    updates of :class:`PropensityEstimator` do nothing here, so it plugs into the same place.

    Args:
        propensities: [P] positive θ by position (positions ≥ P − 1 share the last).
        clip: bound on θ_0/θ (≥ 1), ``"auto"`` (:func:`auto_clip` of ``propensities`` over the
            positions ``used``, all by default), or None (none). ``est.clip`` holds the number used.
        used: [P] bool, the positions whose weights are applied (:func:`clicked_positions`).

    >>> est = FixedPropensities(torch.tensor([1.0, 0.5, 0.01]), clip=10)
    >>> est.pair_factors(torch.tensor([[0, 1, 2]]))[0].tolist()
    [[1.0, 2.0, 10.0]]
    >>> round(FixedPropensities(torch.tensor([1.0, 0.5, 0.01]), clip="auto").clip, 4)  # 3 √100
    30.0
    """

    learns = False

    def __init__(self, propensities, *, clip: float | str | None = None, used=None):
        theta = _positive(propensities)
        if check_clip(clip) == "auto":
            clip = auto_clip(theta, used)
        super().__init__(len(theta), clip=clip)
        self.t_plus = theta / theta[0]

    def __repr__(self) -> str:
        return f"FixedPropensities(t_plus={[round(v, 4) for v in self.t_plus.tolist()]}, clip={self.clip})"

    def accumulate(self, scores, clicks, positions, mask=None) -> FixedPropensities:
        """Nothing to learn: the propensities stay as given."""
        return self

    def step(self, iterations: int = 1) -> FixedPropensities:
        """Nothing to learn: the propensities stay as given."""
        return self


def _positive(propensities) -> torch.Tensor:
    """[P] float64 propensities, checked positive and finite."""
    theta = check_tensor(torch.as_tensor(propensities), "propensities", ndim=1, kind="float").double()
    check_tensors(("propensities", theta, ~(theta > 0) | ~torch.isfinite(theta), "positive and finite"))
    return theta


def clicked_positions(clicks, positions, n_positions: int) -> torch.Tensor:
    """[n_positions] bool: the position buckets (positions ≥ n_positions − 1 share the last) where
    a log of flat rows (``clicks`` [N] 0/1, ``positions`` [N] dense 0-based) has a click: the
    positions whose inverse propensities a weighting applies."""
    n_positions = check_int(n_positions, "n_positions", low=1, high=MAX_POSITIONS)
    clicks = check_tensor(torch.as_tensor(clicks).reshape(-1).cpu(), "clicks")
    positions = check_tensor(torch.as_tensor(positions).reshape(-1).cpu(), "positions", shape=clicks.shape,
                             kind="int")
    check_tensors(("positions", positions, positions < 0, "non-negative"))
    used = torch.zeros(n_positions, dtype=torch.bool)
    used[positions.long().clamp(max=n_positions - 1)[clicks > 0]] = True
    return used


def check_clip(value, name: str = "clip"):
    """A clip of inverse propensities: a number ≥ 1, ``"auto"`` (:func:`auto_clip`) or None."""
    if isinstance(value, str):
        if value != "auto":
            raise ValueError(f"`{name}` has to be a number >= 1, 'auto' or None, got {value!r}")
        return value
    return None if value is None else check_number(value, name, low=1.0)


#: :func:`auto_clip`'s factor: the clip is this times √(the largest θ_0/θ).
AUTO_CLIP_FACTOR = 3.0


def auto_clip(propensities, used=None) -> float:
    """The clip of inverse propensities ``"auto"`` picks for a log: c = 3 √r, r the largest
    θ_0/θ_k over its positions (at least 1), or over the positions ``used`` ([P] bool: those
    with a click in the log, whose weights are the only ones applied; a position never shown
    or never clicked keeps regression-EM's start or falls towards 0, and would set the clip
    for all the others).

    A clip trades bias (a click at a deep position counts less than it should) against variance
    (the few clicks there count a lot; Joachims, Swaminathan, Schnabel, WSDM 2017, and Strehl,
    Langford, Li, Kakade, "Learning from Logged Implicit Exploration Data", NIPS 2010, bound the
    weights for that reason). No fixed clip suits every log: with weak position bias no weight
    comes near any clip, and at r ≈ 10 (examination 1/rank) a clip of 10 beat 30 on the
    synthetic logs, while at r ≈ 100 (1/rank²) 30 beat 10 by 0.010 and 0.035 NDCG@10 on MQ2008
    and the synthetic set (docs/benchmarks.md, "the ips clip"). The clip grows with the square
    root of the log's range: about 10 at r = 10, 30 at r = 100, and never clips a log whose
    weights stay below 9. A rule fitted on that grid, it was then checked on examination
    (1/rank)^1.5 and ^3, which it had not seen, where it beat the fixed 10 on both data sets.
    It is not the best fixed clip everywhere, by margins mostly within one standard error: a
    fixed 100 beat it in 3 of the 4 held-out cells, and the fixed 10 in 3 of the 6 cells it was
    chosen on (the synthetic set at 1/rank and both cascades).

    >>> round(auto_clip(torch.tensor([1.0, 0.5, 0.25, 0.01])), 4)
    30.0
    """
    theta = _positive(propensities)
    if len(theta) == 0:
        raise ValueError("`propensities` has to hold at least one position, got none")
    ratio = theta[0] / theta
    if used is not None:
        used = check_tensor(torch.as_tensor(used), "used", shape=theta.shape, kind="bool")
        ratio = ratio[used]
    largest = float(ratio.max()) if len(ratio) else 1.0
    return AUTO_CLIP_FACTOR * min(max(1.0, largest), 1e300) ** 0.5


# -- regression-EM: position bias and relevance by expectation-maximisation ------------------------
#
# Wang, Golbandi, Bendersky, Metzler, Najork, "Position Bias Estimation for Unbiased Learning to
# Rank in Personal Search", WSDM 2018. The position-based model: a document shown at position k
# is examined with θ_k and, independently, relevant with γ; it is clicked iff both. Rows are
# (document, position) pairs of a click log with n impressions and c clicks (ClickLog.aggregate,
# or one row per session and document with n = 1). Given θ and γ, the E-step's posteriors of an
# impression without a click are
#
#     P(E = 1, R = 0 | C = 0) = θ_k (1 − γ) / (1 − θ_k γ),   P(E = 0, R = 1 | C = 0) = (1 − θ_k) γ / (1 − θ_k γ)
#
# (a click means E = R = 1). The M-step sets θ_k to the expected examined share of position k's
# impressions (closed form) and fits γ(x) = sigmoid(f(x)) by weighted cross-entropy against the
# expected relevant share of each row: the "regression" of regression-EM. The paper samples hard
# labels from the posterior and fits GBDT; here f is a neural scorer and the targets are the
# posteriors themselves (the expected complete-data log-likelihood, whose gradient the sampled
# labels only estimate). With a free γ per document instead of f, the step is the classic EM of
# the position-based model, whose fixed point maximises the click likelihood (tests/data/test_clicks.py
# checks it against direct maximisation).

_PROB_EPS = 1e-6

#: The regression-EM that estimates a click log's propensities for model choice and for
#: ``LambdaMART(unbiased="ips")``: a small MLP, few iterations (the propensities settle early).
EM_SETTINGS = {"hidden": (16,), "iterations": 15, "lr": 1e-2}


def check_counts(clicks, impressions, position, n_positions=None):
    """Flat [M] click counts, impressions (float64) and positions (long), checked."""
    clicks = torch.as_tensor(clicks)
    check_tensor(clicks, "clicks", ndim=1)
    m = clicks.shape[0]
    impressions = torch.ones(m, dtype=torch.float64) if impressions is None else torch.as_tensor(impressions)
    check_tensor(impressions, "impressions", shape=(m,))
    position = torch.as_tensor(position)
    check_tensor(position, "position", shape=(m,), kind="int")
    clicks, impressions = clicks.double(), impressions.double()
    conditions = [("impressions", impressions, ~torch.isfinite(impressions) | (impressions <= 0), "positive"),
                  ("clicks", clicks, ~torch.isfinite(clicks) | (clicks < 0) | (clicks > impressions)
                   | (clicks != clicks.round()), "whole numbers in 0..impressions"),
                  ("position", position, position < 0, "non-negative")]
    check_tensors(*conditions)
    bucket = position.long() if n_positions is None else position.long().clamp(max=n_positions - 1)
    return clicks, impressions, bucket


def em_posteriors(clicks, impressions, theta, gamma) -> tuple[torch.Tensor, torch.Tensor]:
    """The E-step: expected examined and relevant impressions of each row (float64).

    Args:
        clicks, impressions: [M] counts of each (document, position) row.
        theta: [M] examination probability of each row's position; gamma: [M] relevance
            probability of each row's document; both are clamped into [1e-6, 1 − 1e-6].
    Returns:
        (examined, relevant), each [M]: c + (n − c) P(E = 1 | C = 0) and c + (n − c) P(R = 1 | C = 0).

    >>> em_posteriors(torch.tensor([1.]), torch.tensor([3.]), torch.tensor([0.5]), torch.tensor([0.5]))
    (tensor([1.6667], dtype=torch.float64), tensor([1.6667], dtype=torch.float64))
    """
    theta = theta.double().clamp(_PROB_EPS, 1 - _PROB_EPS)
    gamma = gamma.double().clamp(_PROB_EPS, 1 - _PROB_EPS)
    unclicked = impressions.double() - clicks.double()
    none = 1.0 - theta * gamma
    examined = clicks + unclicked * theta * (1.0 - gamma) / none
    relevant = clicks + unclicked * (1.0 - theta) * gamma / none
    return examined, relevant


def em_step(clicks, impressions, position, theta, gamma) -> tuple[torch.Tensor, torch.Tensor]:
    """One EM step of the position-based model on aggregated rows.

    Args:
        clicks: [M] clicks of each (document, position) row; impressions: [M] its impressions
            (None: 1 each, one row per shown document and session).
        position: [M] 0-based displayed positions; theta: [P] current examination probabilities
            (positions ≥ P − 1 share the last); gamma: [M] current relevance of each row's document.
    Returns:
        (theta, target): [P] the M-step's θ (a position without impressions keeps its value) and
        [M] the relevance target of each row, its expected relevant share of impressions.

    >>> theta, target = em_step(torch.tensor([1., 0.]), torch.tensor([2., 2.]), torch.tensor([0, 1]),
    ...                         torch.tensor([1., 0.5]), torch.tensor([0.5, 0.5]))
    >>> [round(v, 4) for v in theta.tolist()], [round(v, 4) for v in target.tolist()]
    ([1.0, 0.3333], [0.5, 0.3333])
    """
    theta = check_tensor(theta, "theta", ndim=1, kind="float").double()
    clicks, impressions, bucket = check_counts(clicks, impressions, position, len(theta))
    gamma = check_tensor(gamma, "gamma", shape=clicks.shape, kind="float")
    return _em_step(clicks, impressions, bucket, theta, gamma)


def _em_step(clicks, impressions, bucket, theta, gamma) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`em_step` on checked counts (``bucket``: positions mapped to θ's entries)."""
    examined, relevant = em_posteriors(clicks, impressions, theta[bucket], gamma)
    shown = torch.zeros_like(theta).index_add_(0, bucket, impressions)
    seen = torch.zeros_like(theta).index_add_(0, bucket, examined)
    new_theta = torch.where(shown > 0, seen / shown.clamp(min=1e-300), theta)
    return new_theta.clamp(_PROB_EPS, 1.0), relevant / impressions


def click_log_likelihood(clicks, impressions, position, theta, gamma) -> torch.Tensor:
    """Mean log-likelihood per impression of the clicks under the position-based model θ, γ.

    Σ [c log(θ_k γ) + (n − c) log(1 − θ_k γ)] / Σ n, float64 (the quantity EM increases).
    """
    theta = check_tensor(theta, "theta", ndim=1, kind="float").double()
    clicks, impressions, bucket = check_counts(clicks, impressions, position, len(theta))
    return _log_likelihood(clicks, impressions, bucket, theta, gamma)


def _log_likelihood(clicks, impressions, bucket, theta, gamma) -> torch.Tensor:
    """:func:`click_log_likelihood` on checked counts."""
    q = (theta[bucket] * gamma.double()).clamp(_PROB_EPS, 1 - _PROB_EPS)
    return (clicks * q.log() + (impressions - clicks) * torch.log1p(-q)).sum() / impressions.sum()


class RegressionEM:
    """Regression-EM (Wang et al., WSDM 2018): a neural relevance model and the position bias
    learned together from clicks by EM (see the comment above :func:`em_posteriors`).

    The relevance model γ(x) = sigmoid(f(x)) is an :class:`rankkit.scorers.MLPScorer`;
    f ranks documents (:meth:`predict`). Each of ``iterations`` EM iterations runs the E-step with
    the current θ and f, sets θ in closed form, then takes ``epochs`` passes of Adam over the rows
    on the weighted cross-entropy against the relevance targets (weights = impressions).

    Args:
        n_positions: P, positions with their own θ (deeper ones share the last).
        hidden, dropout: the MLP's hidden sizes and dropout.
        iterations, epochs: EM iterations, and Adam passes per M-step.
        lr, weight_decay, batch_size: Adam's step, L2 and rows per step.
        seed: seeds the initial weights and the shuffling; the same seed gives the same model.

    Attributes (after :meth:`fit`):
        theta_: [P] float64 examination probabilities; ``propensities_``: θ / θ_0.
        scorer_: the fitted MLPScorer; ``history_``: mean click log-likelihood per iteration.

    >>> x = torch.randn(40, 3, generator=torch.Generator().manual_seed(0))
    >>> model = RegressionEM(3, hidden=(4,), iterations=2).fit(x, (x[:, 0] > 0).double(), torch.arange(40) % 3)
    >>> model.theta_.shape, model.predict(x).shape
    (torch.Size([3]), torch.Size([40]))
    """

    def __init__(self, n_positions: int = 10, *, hidden: tuple[int, ...] = (32,), dropout: float = 0.0,
                 iterations: int = 20, epochs: int = 1, lr: float = 3e-3, weight_decay: float = 1e-5,
                 batch_size: int = 1024, seed: int = 0):
        # a [P, P] table of pair costs is kept: 4096 positions (128 MiB) is far past any click log
        self.n_positions = check_int(n_positions, "n_positions", low=1, high=MAX_POSITIONS)
        self.hidden = tuple(hidden)
        self.dropout = check_number(dropout, "dropout", low=0.0, high=1.0, high_open=True)
        self.iterations = check_int(iterations, "iterations")
        self.epochs = check_int(epochs, "epochs")
        self.lr = check_number(lr, "lr", low=0.0, low_open=True)
        self.weight_decay = check_number(weight_decay, "weight_decay", low=0.0)
        self.batch_size = check_int(batch_size, "batch_size")
        self.seed = check_int(seed, "seed", low=0)

    def __repr__(self) -> str:
        return (f"RegressionEM(n_positions={self.n_positions}, hidden={self.hidden}, "
                f"iterations={self.iterations}, epochs={self.epochs})")

    @property
    def propensities_(self) -> torch.Tensor:
        """[P] float64 θ_k / θ_0, the learned examination ratios (position 0 = 1)."""
        return self.theta_ / self.theta_[0]

    def fit(self, X, clicks, position, *, impressions=None, callback=None) -> RegressionEM:
        """Fit on rows of (features, clicks, position[, impressions]).

        Args:
            X: [M, F] features of each row's document.
            clicks: [M] clicks (0/1 per session row, or counts with ``impressions``).
            position: [M] 0-based displayed positions.
            impressions: [M] impressions of each row (None: 1 each).
            callback: called as ``callback(self, iteration)`` after every EM iteration (e.g. to
                keep the iteration that scores best on a click-log validation split).
        """
        X = torch.as_tensor(X)
        check_tensor(X, "X", ndim=2, kind="float")
        clicks, impressions, bucket = check_counts(clicks, impressions, position, self.n_positions)
        if clicks.shape[0] != X.shape[0]:
            raise ValueError(f"`clicks` has to have one entry per row of `X` ({X.shape[0]}), got {clicks.shape[0]}")
        check_tensors(("X", X, ~torch.isfinite(X).all(1)[:, None].expand_as(X), "finite"))
        # Seeded on its own: the caller's RNG stream is left as it was (a resumed fit that reads its
        # training log again then draws the dropout the uninterrupted fit drew).
        with torch.random.fork_rng(devices=[]):  # the CPU's stream, where the EM runs; no GPU's is touched
            torch.default_generator.manual_seed(self.seed)
            return self._fit(X.float(), clicks, impressions, bucket, callback)

    def _fit(self, X, clicks, impressions, bucket, callback) -> RegressionEM:
        generator = torch.Generator().manual_seed(self.seed)
        self.scorer_ = MLPScorer(X.shape[1], hidden=list(self.hidden), dropout=self.dropout)
        self.scorer_.preprocess.fit(X)
        opt = torch.optim.Adam(self.scorer_.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        # start: θ from the click-through rate by position, γ from the rows' click rates
        shown = torch.zeros(self.n_positions, dtype=torch.float64).index_add_(0, bucket, impressions)
        clicked = torch.zeros(self.n_positions, dtype=torch.float64).index_add_(0, bucket, clicks)
        ctr = torch.where(shown > 0, clicked / shown.clamp(min=1e-300), 0.0)
        self.theta_ = (ctr / ctr[0] if ctr[0] > 0 else torch.ones_like(ctr)).clamp(0.01, 1.0)
        gamma = (clicks / impressions / self.theta_[bucket]).clamp(0.01, 0.99)
        weight = (impressions / impressions.mean()).float()
        self.history_ = []
        for iteration in range(self.iterations):
            # the counts were checked once above: the EM loop takes the unchecked steps
            self.theta_, target = _em_step(clicks, impressions, bucket, self.theta_, gamma)
            target = target.float()
            self.scorer_.train()
            for _ in range(self.epochs):
                for rows in torch.randperm(len(X), generator=generator).split(self.batch_size):
                    logits = self.scorer_(X[rows])
                    loss = (F.binary_cross_entropy_with_logits(logits, target[rows], reduction="none")
                            * weight[rows]).mean()
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
            self.scorer_.eval()
            gamma = self.relevance(X)
            self.history_.append(float(_log_likelihood(clicks, impressions, bucket, self.theta_, gamma)))
            if callback is not None:
                callback(self, iteration)
        return self

    @torch.no_grad()
    def predict(self, X) -> torch.Tensor:
        """Ranking scores f(x) [M] (float32, the relevance logits) of features [M, F]."""
        if not hasattr(self, "scorer_"):
            raise RuntimeError("RegressionEM is not fitted: call fit first")
        X = torch.as_tensor(X)
        check_tensor(X, "X", ndim=2, kind="float")
        self.scorer_.eval()
        return self.scorer_(X.float())

    def relevance(self, X) -> torch.Tensor:
        """γ(x) = sigmoid(f(x)) [M] float64, the relevance probabilities."""
        return torch.sigmoid(self.predict(X).double())


def ips_propensities(features, clicks, sizes, position, *, n_positions: int, seed: int = 0,
                     names: tuple[str, str, str] = ("X", "y", "position")) -> torch.Tensor:
    """[n_positions] examination probabilities θ̂ of a training click log (flat rows: features
    [N, F], clicks [N] 0/1, sizes [S] rows per session, position [N] dense 0-based) by
    regression-EM (Wang, Golbandi, Bendersky, Metzler, Najork, "Position Bias Estimation for
    Unbiased Learning to Rank in Personal Search", WSDM 2018; :class:`RegressionEM` with
    :data:`EM_SETTINGS`), fitted on the impressions aggregated per (document,
    position): a document shown in many sessions is one row (:func:`rankkit.clicks.log.session_log`). The
    propensities of ``unbiased="ips"``, for the booster and the neural rankers alike."""
    log = session_log(features, clicks, sizes, position, names=names)
    doc, bucket, shown, clicked = aggregate(log, n_positions)
    em = RegressionEM(n_positions, **EM_SETTINGS, seed=seed)
    em.fit(log.features[doc].nan_to_num(0.0), clicked, bucket, impressions=shown)
    return em.propensities_

