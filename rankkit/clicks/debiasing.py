r"""How a neural ranker learns from clicks: the position models trained with it.

A click log is a ranking dataset with one query per session, the clicks (0/1) as labels and the
documents' displayed ``position``. Besides Unbiased LambdaRank's pair weights
(:class:`rankkit.clicks.propensity.PropensityEstimator`, ``unbiased=True``), a
:class:`~rankkit.neural.module.NeuralRanker` can learn the position's effect jointly:

* :class:`PositionBias` (``unbiased="position"``): the scores of training take an additive
  bias per position, s + b[pos], learned by the same optimiser (the neural counterpart of
  LightGBM's ``Dataset(position=...)`` and of ``LambdaMART(unbiased="position")``). Evaluation
  and export leave it out: the ranker alone is what serves.
* :class:`DualLearning` (``unbiased="dla"``): the Dual Learning Algorithm of Ai, Bi, Luo, Guo,
  Croft, "Unbiased Learning to Rank with Unbiased Propensity Estimation", SIGIR 2018. A
  propensity model (one logit φ_k per position) and the ranker are trained together, each by a
  softmax cross-entropy on the clicks, weighted by the other's inverse estimate::

      ranker:     CE(softmax(s),  c · w),  w_i = min(exp(φ_0 − φ_{pos i}), clip)
      propensity: CE(softmax(φ),  c · v),  v_i = min(exp(s_top − s_i), clip)

  with s_top the score of the session's document shown highest; both weights are detached, and
  each cross-entropy's target is the weighted clicks normalised to sum 1 (summed over
  sessions and divided by the total weight, as the authors' code). The propensity estimate of
  position k is exp(φ_k − φ_0).

``unbiased="ips"`` weighs the pairs by fixed inverse propensities, estimated by regression-EM on
the whole training log when the fit starts (:func:`rankkit.clicks.propensity.ips_propensities`, as
``LambdaMART(unbiased="ips")``).

``unbiased="auto"`` (:class:`DebiasingRace`) trains naive, Unbiased LambdaRank at p = 0,
``"position"``, ``"dla"`` and ``"ips"`` side by side on the same batches inside one fit, each a copy of the
scorer with its own position model, and keeps the one whose scores best explain the validation
click log (:func:`rankkit.clicks.metrics.explained_clicks`, no true label read), by successive
halving over the epochs: all train the first third of the epochs, the best two the second, the
best one the rest ((C + 3) / 3 = 2.67 times the batches of one fit for C = 5 candidates).
"""
from __future__ import annotations


import torch
from torch import nn

from rankkit.clicks.propensity import FixedPropensities, PositionIds, PropensityEstimator, ips_propensities
from rankkit.clicks.race import DebiasingRace
from rankkit.data.dataset import PaddedBatch
from rankkit.infra import checks as _checks
from rankkit.objective import ObjectiveSpec

__all__ = ["NEURAL_UNBIASED", "ClickDebiasing", "DualLearning", "PositionBias"]

# Unbiased training: the click biases are re-estimated after every batch from the position-bucketed
# pair costs of the recent batches, an exponentially decayed sum (this factor per batch, a memory
# of about ten batches), so that one small batch cannot swing them.
BIAS_COST_DECAY = 0.9

#: The ``unbiased`` settings of the neural rankers.
NEURAL_UNBIASED = (False, True, "position", "dla", "ips", "auto")


def _bucket(position: torch.Tensor, n_positions: int) -> torch.Tensor:
    return position.long().clamp(0, n_positions - 1)


class PositionBias(nn.Module):
    """An additive score bias per displayed position, b [P] (positions ≥ P − 1 share the last).

    >>> bias = PositionBias(3)
    >>> with torch.no_grad():
    ...     _ = bias.bias.copy_(torch.tensor([1.0, 0.5, 0.0]))
    >>> bias(torch.zeros(1, 4), torch.tensor([[0, 1, 2, 7]])).tolist()
    [[1.0, 0.5, 0.0, 0.0]]
    """

    def __init__(self, n_positions: int):
        super().__init__()
        self.n_positions = _checks.check_int(n_positions, "n_positions", high=4096)
        self.bias = nn.Parameter(torch.zeros(self.n_positions))

    def forward(self, scores: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """scores [Q, L] + b[position] [Q, L]."""
        return scores + self.bias.to(scores.dtype)[_bucket(position, self.n_positions)]


class DualLearning(nn.Module):
    """The Dual Learning Algorithm's propensity model and its two losses (see the module).

    Args:
        n_positions: P, positions with their own logit (deeper ones share the last).
        clip: the bound on both inverse weights (≥ 1).

    >>> dla = DualLearning(3)
    >>> loss = dla.loss(torch.zeros(2, 3, requires_grad=True), torch.tensor([[1., 0, 0], [0, 1., 0]]),
    ...                 torch.tensor([[0, 1, 2], [0, 1, 2]]), torch.ones(2, 3, dtype=torch.bool))
    >>> round(float(loss), 4)  # two uniform softmaxes over three documents: 2 log 3
    2.1972
    """

    def __init__(self, n_positions: int, *, clip: float = 10.0):
        super().__init__()
        self.n_positions = _checks.check_int(n_positions, "n_positions", high=4096)
        self.clip = _checks.check_number(clip, "clip", low=1.0)
        self.logits = nn.Parameter(torch.zeros(self.n_positions))

    @property
    def propensities(self) -> torch.Tensor:
        """[P] float64 exp(φ_k − φ_0): the examination of position k relative to position 0."""
        phi = self.logits.detach().double()
        return torch.exp(phi - phi[0])

    def loss(self, scores: torch.Tensor, clicks: torch.Tensor, position: torch.Tensor,
             mask: torch.Tensor) -> torch.Tensor:
        """The ranker's and the propensity model's weighted cross-entropies, summed (a scalar).

        Args:
            scores: [Q, L] the ranker's scores; clicks: [Q, L] 0/1; position: [Q, L] displayed
                ranks; mask: [Q, L] bool, True on real documents.
        """
        phi = self.logits.to(scores.dtype)[_bucket(position, self.n_positions)]
        clicks = clicks.to(scores.dtype).masked_fill(~mask, 0.0)
        with torch.no_grad():
            w = torch.exp(self.logits[0].to(scores.dtype) - phi).clamp(max=self.clip)
            top = position.masked_fill(~mask, torch.iinfo(torch.long).max).argmin(dim=1, keepdim=True)
            s_top = scores.detach().gather(1, top)
            v = torch.exp((s_top - scores.detach()).clamp(max=80.0)).clamp(max=self.clip)
        return _weighted_softmax_ce(scores, clicks * w, mask) + _weighted_softmax_ce(phi, clicks * v, mask)


def _weighted_softmax_ce(logits: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ_q CE(softmax(logits_q), weights_q / Σ weights_q) Σ weights_q / Σ weights: the authors'
    normalisation (a session without a click adds nothing)."""
    log_p = torch.log_softmax(logits.masked_fill(~mask, float("-inf")), dim=1).masked_fill(~mask, 0.0)
    total = weights.sum()
    if float(total) <= 0:
        return logits.sum() * 0.0
    return -(weights * log_p).sum() / total



class ClickDebiasing:
    """What every ``unbiased`` setting adds to a neural ranker's objective: the click-bias
    estimator of Unbiased LambdaRank (``True``: :class:`rankkit.clicks.propensity.PropensityEstimator`,
    re-estimated after every batch from the decayed pair costs of the recent batches), the
    position models (``"position"``: :class:`PositionBias`; ``"dla"``: :class:`DualLearning`, which
    the module registers as its own sub-modules), and the training data's position ids
    (:class:`rankkit.clicks.propensity.PositionIds`, LightGBM's reading: 0- or 1-based or sparse ids train
    the same model).

    Args:
        unbiased: the checked setting (False, True, "position", "dla", "ips" or "auto").
        spec: the module's objective (:class:`rankkit.objective.ObjectiveSpec`): debiasing pairs
            needs a pairwise one; "dla" and "auto" need the built-in lambda loss of ``weighting``.
        bias_p, n_positions: the estimator's and position models' (``n_positions`` ≥ 1).
        ema_decay: the module's weight average ("auto" races copies of the scorer: none).
        propensity_clip: ``"ips"``'s bound on each pair weight θ̂₀/θ̂ (None: none).
        name: how the user spelt the objective (``"objective"``, or the old ``"loss"``).
    """

    def __init__(self, unbiased, spec: ObjectiveSpec, *, bias_p: float, n_positions: int, ema_decay: float = 0.0,
                 propensity_clip: float | None = 10.0, name: str = "objective"):
        self.unbiased, self.n_positions = unbiased, n_positions
        self.propensity: PropensityEstimator | None = None
        self.clip = propensity_clip
        _check_choice(unbiased, spec, ema_decay, name)
        if unbiased in (True, "ips"):
            _checks.check_number(bias_p, "bias_p", low=0)
            _checks.check_int(n_positions, "n_positions")
            if not spec.pairwise:
                raise ValueError(f"`unbiased={unbiased!r}` debiases pairs: it needs a pairwise objective, got "
                                 f"{spec.name!r}")
        if unbiased is True:
            self.propensity = PropensityEstimator(n_positions, p=bias_p, sigma=spec.sigma, k=spec.k,
                                                  weighting=spec.click_weighting)
        self.costs = None if self.propensity is None else self.propensity.costs.clone()
        self.position_ids: PositionIds | None = None
        self.position_bias = PositionBias(n_positions) if unbiased == "position" else None
        self.dla = DualLearning(n_positions) if unbiased == "dla" else None

    @property
    def estimated(self) -> bool:
        """False only for ``"ips"`` before its training log was read (its propensities come from it)."""
        return self.unbiased != "ips" or self.propensity is not None

    def loss(self, objective, scores: torch.Tensor, batch: PaddedBatch) -> torch.Tensor:
        """The training loss of a batch by ``objective``
        (:class:`rankkit.neural.objective.NeuralObjective`): its pairs weighed by the click biases
        updated on this batch, the scores adjusted by the position model, or DLA's own loss."""
        if objective.spec.custom:
            return objective(scores, batch)
        if self.dla is not None:
            return self.dla.loss(scores, batch.labels, self.positions(batch), batch.mask)
        if self.position_bias is not None:
            scores = self.position_bias(scores, self.positions(batch))
        if not self.estimated:
            raise ValueError("`unbiased='ips'` estimates its propensities on the whole training log before the "
                             "first batch: train with a datamodule that has a `train_set` (RankingDataModule), or "
                             "call `module.read_click_log(train_set)` first in a plain loop")
        weights = None if self.propensity is None else self.pair_weights(scores, batch)
        return objective(scores, batch, pair_weights=weights)

    def parameter_groups(self, scorer: nn.Module) -> list[dict]:
        """The optimiser's parameter groups: the scorer's, and the position model's without weight
        decay (nothing should pull it towards "no bias")."""
        params = [{"params": list(scorer.parameters())}]
        position_models = [m for m in (self.position_bias, self.dla) if m is not None]
        if position_models:
            params.append({"params": [p for m in position_models for p in m.parameters()], "weight_decay": 0.0})
        return params

    def positions(self, batch: PaddedBatch) -> torch.Tensor:
        """The batch's displayed positions [Q, L], which every ``unbiased`` setting needs."""
        if batch.position is None:
            raise ValueError(f"`unbiased={self.unbiased!r}` needs the documents' displayed positions: the "
                             f"training batch has no `position` (train on a dataset with `position=`, e.g. "
                             f"ClickLog.sessions)")
        return batch.position

    def pair_weights(self, scores: torch.Tensor, batch: PaddedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Update t⁺, t⁻ from the batch's detached scores [Q, L]; return its (upper, lower) [Q, L]."""
        self.positions(batch)
        est = self.propensity
        est.accumulate(scores.detach(), batch.labels, batch.position, batch.mask)
        self.costs = BIAS_COST_DECAY * self.costs + est.costs
        est.costs = self.costs.clone()
        est.step()
        return est.pair_factors(batch.position, batch.mask, dtype=scores.dtype)

    def read_positions(self, train_set) -> None:
        """At a fit's start: the position ids of the training data (more distinct ids than
        ``n_positions`` are refused), which every batch's positions go through (:meth:`map`);
        with ``"ips"``, the propensities by regression-EM on the whole training log (seeded by
        torch's initial seed, which ``seed_everything`` sets). ``train_set`` None (a fit
        without a datamodule) keeps what an earlier call read."""
        if train_set is None:  # a fit without a datamodule: the last reading stands (read_click_log)
            return
        self.position_ids = dense = None
        if self.unbiased and getattr(train_set, "position", None) is not None:
            self.position_ids, dense = PositionIds.dense(train_set.position, "the training data's position",
                                                         n_positions=self.n_positions)
        if self.unbiased == "ips" and dense is None:
            raise ValueError("`unbiased='ips'` estimates its propensities from the training log's displayed "
                             "positions: the training set has no `position` (train on a click log's sessions)")
        if self.unbiased == "ips":
            theta = ips_propensities(train_set.features, train_set.labels, train_set.sizes, dense,
                                     n_positions=self.n_positions, seed=torch.initial_seed() % 2**31,
                                     names=("the training data's features", "the training data's clicks",
                                            "the training data's position"))
            self.propensity = FixedPropensities(theta, clip=self.clip)
            self.costs = self.propensity.costs.clone()

    def map(self, batch):
        """``batch`` with its positions read through the training data's ids."""
        ids = self.position_ids
        if ids is None or not isinstance(batch, PaddedBatch) or batch.position is None:
            return batch
        position = torch.zeros_like(batch.position)
        position[batch.mask] = ids.index(batch.position[batch.mask], "a batch's position")
        return batch._replace(position=position)

    def propensities(self) -> dict[str, torch.Tensor] | None:
        """With ``unbiased=True``: ``{"clicked": t⁺ [n_positions], "unclicked": t⁻ [n_positions]}``
        (float64, position 0 = 1), the learned position biases; with ``"ips"``, θ̂_k/θ̂₀ as
        ``"clicked"`` (and ones) once the training log is read; with ``"dla"``, the propensity
        model's exp(φ_k − φ_0) as ``"clicked"`` (and ones); None otherwise."""
        dla = self.dla
        if dla is not None:
            return {"clicked": dla.propensities, "unclicked": torch.ones(dla.n_positions, dtype=torch.float64)}
        if self.propensity is None:
            return None
        return {"clicked": self.propensity.t_plus.clone(), "unclicked": self.propensity.t_minus.clone()}

    def state(self) -> dict | None:
        """The estimator's biases and decayed costs, for a checkpoint (None without it: ``"ips"``
        has it once it has read its training log)."""
        if self.propensity is None:
            return None
        return {"clicked": self.propensity.t_plus.clone(), "unclicked": self.propensity.t_minus.clone(),
                "costs": self.costs.clone()}

    def load_state(self, state: dict) -> None:
        if self.unbiased == "ips":  # the propensities the training log gave (t⁺ = θ̂ / θ̂₀, t⁻ = 1)
            with torch.device("cpu"):  # host tensors, also where a checkpoint's check builds on "meta"
                self.propensity = FixedPropensities(state["clicked"].cpu(), clip=self.clip)
        if self.propensity is not None:
            self.propensity.t_plus = state["clicked"].clone()
            self.propensity.t_minus = state["unclicked"].clone()
            self.costs = state["costs"].clone()


def _check_choice(unbiased, spec: ObjectiveSpec, ema_decay: float, name: str) -> None:
    """"dla" and "auto" train the built-in lambda loss of ``weighting`` (DLA by its own softmax
    cross-entropies, "auto" races it), and "auto" races copies of the scorer without a weight
    average: one line naming the first setting that contradicts that."""
    if unbiased == "dla" and spec.objective is not None:
        raise ValueError(f"`unbiased='dla'` trains by its own softmax cross-entropies; leave `{name}` None, "
                         f"got {name}={spec.objective!r}")
    if unbiased != "auto":
        return
    if ema_decay > 0 or spec.custom:
        raise ValueError(f"`unbiased='auto'` races copies of the scorer; it takes no "
                         f"{'ema_decay' if ema_decay > 0 else 'custom loss'}")
    if spec.objective is not None:  # its dla candidate trains by its own cross-entropies
        raise ValueError(f"`unbiased='auto'` races the debiasings of the built-in `weighting` (one of them, "
                         f"dla, trains by its own softmax cross-entropies); leave `{name}` None, got "
                         f"{name}={spec.objective!r}")


def checkpoint_entries(debiasing: ClickDebiasing, race: DebiasingRace | None) -> dict:
    """What a checkpoint's ``rankkit`` dict keeps of a module's debiasing: the estimator's biases
    and costs (``"propensities"``) and the race's standing (``"race"``), where there are such."""
    entries = {}
    state = debiasing.state()
    if state is not None:
        entries["propensities"] = state
    if race is not None:
        entries["race"] = race.state()
    return entries


def restore_entries(debiasing: ClickDebiasing, race: DebiasingRace | None, state: dict,
                    state_dict: dict | None = None) -> None:
    """Load what :func:`checkpoint_entries` kept in a checkpoint's ``rankkit`` dict ``state``; a
    race keeps only the candidates whose weights the checkpoint's ``state_dict`` holds."""
    if "propensities" in state:
        debiasing.load_state(state["propensities"])
    if race is not None and state_dict is not None:
        race.keep_saved(state_dict)
    if "race" in state and race is not None:
        race.load_state(state["race"])


def read_click_log(debiasing: ClickDebiasing, race: DebiasingRace | None, train_set) -> None:
    """What a fit on a click log reads from its whole training set (a :class:`RankingDataset`
    with ``position``) before the first batch: the position ids every batch's positions go
    through, and with ``unbiased="ips"`` (or the ``"auto"`` race's ips candidate) the
    propensities by regression-EM (:meth:`ClickDebiasing.read_positions`)."""
    debiasing.read_positions(train_set)
    for candidate in () if race is None else race.candidates.values():
        candidate.debiasing.read_positions(train_set)
