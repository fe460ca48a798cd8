r"""What each ``unbiased`` setting does to training: one object per setting, for both model families.

:func:`make_debiasing` builds the object of a setting (:class:`Debiasing` and its subclasses);
the booster's engine and every neural ranker hold one and ask it (docs/design.md, "Click data in
the round"). The neural rankers' position models, trained with the scorer, are described next.

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

``unbiased="auto"`` (:class:`rankkit.clicks.race.DebiasingRace`) trains naive, Unbiased LambdaRank at p = 0,
``"position"``, ``"dla"`` and ``"ips"`` side by side on the same batches inside one fit, each a copy of the
scorer with its own position model, and keeps the one whose scores best explain the validation
click log (:func:`rankkit.clicks.metrics.explained_clicks`, no true label read), by successive
halving over the epochs: all train the first third of the epochs, the best two the second, the
best one the rest ((C + 3) / 3 = 2.67 times the batches of one fit for C = 5 candidates).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from rankkit.clicks.propensity import (FixedPropensities, PositionIds, PropensityEstimator, clicked_positions,
                                       ips_propensities)
from rankkit.clicks.race import DebiasingRace
from rankkit.data.dataset import PaddedBatch
from rankkit.infra import checks as _checks
from rankkit.objective import ObjectiveSpec

__all__ = ["FAMILY_SETTINGS", "NEURAL_UNBIASED", "Debiasing", "DualLearning", "DualLearningDebiasing",
           "InversePropensities", "LearnedBiases", "PositionBias", "PositionScores", "RaceFront", "make_debiasing"]

# Unbiased training: the click biases are re-estimated after every batch from the position-bucketed
# pair costs of the recent batches, an exponentially decayed sum (this factor per batch, a memory
# of about ten batches), so that one small batch cannot swing them.
BIAS_COST_DECAY = 0.9

#: The ``unbiased`` settings each family takes ("dla" trains a propensity model by gradient:
#: the neural rankers only).
FAMILY_SETTINGS = {"trees": (False, True, "position", "ips", "auto"),
                   "neural": (False, True, "position", "dla", "ips", "auto")}
#: The ``unbiased`` settings of the neural rankers.
NEURAL_UNBIASED = FAMILY_SETTINGS["neural"]


class MappedBatch(PaddedBatch):
    """A :class:`PaddedBatch` whose positions went through the training log's ids
    (:meth:`Debiasing.map`): dense indices, never mapped again (``to`` keeps the type)."""

    __slots__ = ()


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
    total = weights.sum()  # ≥ 0; 0 only where every weight is, and so the sum: 0 (no host sync)
    return -(weights * log_p).sum() / total.clamp(min=torch.finfo(total.dtype).tiny)


class Debiasing:
    """What one ``unbiased`` setting does to training, for the booster's engine and for the neural
    rankers alike; this base class is naive training (``unbiased=False``), which changes nothing.
    :func:`make_debiasing` builds the object of a setting; each subclass overrides what its
    setting changes:

    * the scores the training loss sees (:meth:`scores`: an additive position bias);
    * the weight of each pair of the lambda kernel (:meth:`pair_propensity` for the booster's
      objective, :meth:`pair_weights` for a neural batch);
    * what it learns after each step (:meth:`after_round`, the booster's Newton step), or the
      whole loss (:meth:`loss`, the Dual Learning Algorithm);
    * what it reads from the whole training log before the first step (:meth:`start` for the
      booster, :meth:`read_positions` for a neural ranker);
    * what a fitted model reports of it (:meth:`propensities`; :meth:`fitted` gives LambdaMART's
      attributes) and what a checkpoint keeps (:meth:`state`).

    Every setting reads displayed positions as LightGBM does: the ids of the training data
    (:class:`rankkit.clicks.propensity.PositionIds`), through which every later position goes.

    Args:
        spec: the objective (:class:`rankkit.objective.ObjectiveSpec`): debiasing pairs needs a
            pairwise one.
        n_positions: the position buckets of the biases (deeper positions share the last).
        bias_p: Unbiased LambdaMART's regularisation norm (``unbiased=True``).
        propensity_clip: ``"ips"``'s bound on each pair weight θ̂₀/θ̂: a number ≥ 1, ``"auto"``
            (:func:`rankkit.clicks.propensity.auto_clip` of the training log's θ̂) or None (none).
        position_lr: the learning rate of the position models that train with a neural scorer
            (``"position"``, ``"dla"``; None: the optimiser's own).
    """

    setting: bool | str = False
    #: the modules a neural ranker registers as its own (their parameters train with the scorer)
    position_bias: nn.Module | None = None
    dla: nn.Module | None = None

    def __init__(self, spec: ObjectiveSpec, *, n_positions: int = 10, bias_p: float = 1.0,
                 propensity_clip: float | str | None = 10.0, position_lr: float | None = None):
        self.spec, self.n_positions, self.bias_p, self.clip = spec, n_positions, bias_p, propensity_clip
        self.position_lr = position_lr
        self.propensity: PropensityEstimator | None = None
        self.costs: torch.Tensor | None = None
        self.position_ids: PositionIds | None = None
        self.training_positions: torch.Tensor | None = None  # the booster's [N] dense positions

    def __repr__(self) -> str:
        return f"{type(self).__name__}(unbiased={self.setting!r}, n_positions={self.n_positions})"

    # -- the booster ---------------------------------------------------------------------------
    def start(self, features: Callable[[], torch.Tensor], labels: torch.Tensor, sizes: torch.Tensor,
              positions: torch.Tensor | None, *, device: torch.device, data_parallel: bool, seed: int) -> None:
        """At a booster fit's start, before the objective is built: the training log's rows
        (``features()`` gives them [N, F], built only by a setting that reads them; ``labels`` the
        clicks; ``sizes`` [S] rows per session; ``positions`` [N] dense 0-based, which every
        setting but naive training needs)."""
        if self.setting is False:
            return
        if positions is None:
            raise ValueError(f"`unbiased={self.setting!r}` needs the documents' displayed positions (`position=`)")
        self.training_positions = positions.to(device).long()

    def pair_propensity(self) -> tuple[PropensityEstimator, torch.Tensor] | None:
        """What the booster's objective weighs pairs by: (estimator, positions [N]), or None."""
        return None

    def scores(self, scores: torch.Tensor) -> torch.Tensor:
        """The scores the booster's lambdas are taken at (flat [N])."""
        return scores

    def after_round(self, grad: torch.Tensor, hess: torch.Tensor, *, learning_rate: float,
                    regularization: float) -> None:
        """After a booster round's gradients: what the setting learns from them."""

    # -- the neural rankers ----------------------------------------------------------------------
    @property
    def estimated(self) -> bool:
        """False only where propensities must first be read from the training log (``"ips"``)."""
        return True

    def loss(self, objective, scores: torch.Tensor, batch: PaddedBatch) -> torch.Tensor:
        """The training loss of a batch by ``objective``
        (:class:`rankkit.neural.objective.NeuralObjective`); a custom loss is taken as it is."""
        if objective.spec.custom:
            return objective(scores, batch)
        return self._loss(objective, scores, batch)

    def _loss(self, objective, scores: torch.Tensor, batch: PaddedBatch) -> torch.Tensor:
        return objective(scores, batch, pair_weights=None)

    def parameter_groups(self, scorer: nn.Module) -> list[dict]:
        """The optimiser's parameter groups: the scorer's, and the position model's without weight
        decay (nothing should pull it towards "no bias") at ``position_lr`` when one is given."""
        params = [{"params": list(scorer.parameters())}]
        position_models = [m for m in (self.position_bias, self.dla) if m is not None]
        if position_models:
            group = {"params": [p for m in position_models for p in m.parameters()], "weight_decay": 0.0}
            params.append(group if self.position_lr is None else {**group, "lr": self.position_lr})
        return params

    def positions(self, batch: PaddedBatch) -> torch.Tensor:
        """The batch's displayed positions [Q, L] as dense indices, which every debiasing setting
        needs: as :meth:`map` left them (``Trainer.fit`` maps each batch on the host before its
        transfer), else mapped here (a plain loop; on a GPU that waits for the device, unless the
        training log's ids are 0, 1, 2, ... themselves)."""
        if batch.position is None:
            raise ValueError(f"`unbiased={self.setting!r}` needs the documents' displayed positions: the "
                             f"training batch has no `position` (train on a dataset with `position=`, e.g. "
                             f"ClickLog.sessions)")
        return self.dense(batch).position

    def dense(self, batch: PaddedBatch) -> PaddedBatch:
        """``batch`` with dense positions: :meth:`map`'s, except that a batch already mapped, or
        of a training log whose ids are 0, 1, 2, ... themselves, is returned as it is (no lookup,
        which on a GPU would wait for the device)."""
        ids = self.position_ids
        return batch if ids is None or ids.identity else self.map(batch)

    def read_positions(self, train_set) -> torch.Tensor | None:
        """At a neural fit's start: the position ids of the training data (more distinct ids than
        ``n_positions`` are refused), which every batch's positions go through (:meth:`map`);
        returns the training data's dense positions (None without them). ``train_set`` None (a
        fit without a datamodule) keeps what an earlier call read."""
        if train_set is None:  # a fit without a datamodule: the last reading stands (read_click_log)
            return None
        self.position_ids = dense = None
        if self.setting and getattr(train_set, "position", None) is not None:
            self.position_ids, dense = PositionIds.dense(train_set.position, "the training data's position",
                                                         n_positions=self.n_positions)
        return dense

    def map(self, batch):
        """``batch`` with its positions read through the training data's ids, as a
        :class:`MappedBatch` (which is returned as it is)."""
        ids = self.position_ids
        if ids is None or not isinstance(batch, PaddedBatch) or batch.position is None or isinstance(
                batch, MappedBatch):
            return batch
        position = torch.zeros_like(batch.position)
        position[batch.mask] = ids.index(batch.position[batch.mask], "a batch's position")
        return MappedBatch(*batch._replace(position=position))

    # -- what a fitted model reports, what a checkpoint keeps ------------------------------------
    def propensities(self) -> dict[str, torch.Tensor] | None:
        """``{"clicked": t⁺ [n_positions], "unclicked": t⁻ [n_positions]}`` (float64, position 0 =
        1): the position biases the setting learned or read (see each setting); None here."""
        if self.propensity is None:
            return None
        return {"clicked": self.propensity.t_plus.clone(), "unclicked": self.propensity.t_minus.clone()}

    def fitted(self) -> dict:
        """What a fitted LambdaMART reports of the setting, as numpy: ``propensities_`` (the
        estimator's t⁺, t⁻) and ``position_bias_`` (``"position"``) where there are such."""
        biases = self.propensities()
        return {} if biases is None else {"propensities_": {k: v.numpy().copy() for k, v in biases.items()}}

    def state(self) -> dict | None:
        """The estimator's biases and decayed costs, for a checkpoint (None without an estimator)."""
        if self.propensity is None:
            return None
        return {"clicked": self.propensity.t_plus.clone(), "unclicked": self.propensity.t_minus.clone(),
                "costs": self.costs.clone()}

    def load_state(self, state: dict) -> None:
        if self.propensity is not None:
            self.propensity.t_plus = state["clicked"].clone()
            self.propensity.t_minus = state["unclicked"].clone()
            self.costs = state["costs"].clone()


class LearnedBiases(Debiasing):
    """``unbiased=True``: Unbiased LambdaMART (Hu, Wang, Peng, Li, WWW 2019) and its neural
    counterpart. Each pair (clicked i, unclicked j) weighs 1 / (t⁺(pos i) t⁻(pos j)), with the
    biases re-estimated from the pairs' costs at the current scores
    (:class:`rankkit.clicks.propensity.PropensityEstimator`): once per round for the booster (the
    objective asks :meth:`pair_propensity`), after every batch for a neural ranker, from the
    exponentially decayed costs of the recent batches (:data:`BIAS_COST_DECAY`)."""

    setting = True

    def __init__(self, spec: ObjectiveSpec, **kwargs):
        super().__init__(spec, **kwargs)
        self.propensity = PropensityEstimator(self.n_positions, p=self.bias_p, sigma=spec.sigma, k=spec.k,
                                              weighting=spec.click_weighting)
        self.costs = self.propensity.costs.clone()

    def start(self, features, labels, sizes, positions, **kwargs) -> None:
        super().start(features, labels, sizes, positions, **kwargs)
        # the labels are clicks: checked here, once (the compiled cost pass reads them unchecked)
        _checks.check_tensors(("y", labels, (labels != 0) & (labels != 1), "0 or 1 (clicks)"))

    def pair_propensity(self):
        return self.propensity, self.training_positions

    def _loss(self, objective, scores, batch):
        return objective(scores, batch, pair_weights=self.pair_weights(scores, batch))

    def pair_weights(self, scores: torch.Tensor, batch: PaddedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Update t⁺, t⁻ from the batch's detached scores [Q, L]; return its (upper, lower) [Q, L]."""
        position = self.positions(batch)
        est = self.propensity
        est.accumulate(scores.detach(), batch.labels, position, batch.mask)
        self.costs = BIAS_COST_DECAY * self.costs + est.costs
        est.costs = self.costs.clone()
        est.step()
        return est.pair_factors(position, batch.mask, dtype=scores.dtype)


class InversePropensities(LearnedBiases):
    """``unbiased="ips"``: pairs weighed by fixed inverse propensities min(θ̂₀/θ̂(pos),
    ``propensity_clip``), θ̂ estimated once by regression-EM on the whole training log
    (:func:`rankkit.clicks.propensity.ips_propensities`) before the first step; reported as
    ``"clicked"`` θ̂/θ̂₀ (and ones)."""

    setting = "ips"

    def __init__(self, spec: ObjectiveSpec, **kwargs):
        Debiasing.__init__(self, spec, **kwargs)  # no estimator until the training log is read

    def start(self, features, labels, sizes, positions, *, seed: int, **kwargs) -> None:
        Debiasing.start(self, features, labels, sizes, positions, seed=seed, **kwargs)
        self.read_log(features(), labels.cpu(), sizes, positions.cpu(), seed=seed)

    @property
    def estimated(self) -> bool:
        return self.propensity is not None

    def read_positions(self, train_set) -> torch.Tensor | None:
        """The position ids, then θ̂ by regression-EM on the whole training log (seeded by torch's
        initial seed, which ``seed_everything`` sets)."""
        dense = super().read_positions(train_set)
        if train_set is not None:
            self.read_log(train_set.features, train_set.labels, train_set.sizes, dense,
                          seed=torch.initial_seed() % 2**31,
                          names=("the training data's features", "the training data's clicks",
                                 "the training data's position"))
        return dense

    def read_log(self, features, clicks: torch.Tensor, sizes: torch.Tensor, positions: torch.Tensor | None, *,
                 seed: int, names: tuple[str, str, str] = ("X", "y", "position")) -> None:
        """θ̂ of the training log (flat rows, ``positions`` dense 0-based) by regression-EM."""
        if positions is None:
            raise ValueError("`unbiased='ips'` estimates its propensities from the training log's displayed "
                             "positions: the training set has no `position` (train on a click log's sessions)")
        theta = ips_propensities(features, clicks, sizes, positions, n_positions=self.n_positions, seed=seed,
                                 names=names)
        # "auto" over the positions with a click: only their weights are applied
        self.propensity = FixedPropensities(theta, clip=self.clip,
                                            used=clicked_positions(clicks, positions, self.n_positions))
        self.costs = self.propensity.costs.clone()

    def _loss(self, objective, scores, batch):
        if not self.estimated:
            raise ValueError("`unbiased='ips'` estimates its propensities on the whole training log before the "
                             "first batch: train with a datamodule that has a `train_set` (RankingDataModule), or "
                             "call `module.read_click_log(train_set)` first in a plain loop")
        return super()._loss(objective, scores, batch)

    def fitted(self) -> dict:
        """The base's, and ``propensity_clip_``: the clip applied (``"auto"``'s number, or None)."""
        return {**super().fitted(), "propensity_clip_": self.propensity.clip}

    def state(self) -> dict | None:
        """The base's, and the clip the training log gave (a number where ``"auto"`` chose it)."""
        state = super().state()
        return None if state is None else {**state, "clip": self.propensity.clip}

    def load_state(self, state: dict) -> None:
        # the propensities the training log gave (t⁺ = θ̂ / θ̂₀, t⁻ = 1), and their clip (a
        # checkpoint saved before 2026-12-05 has none: the setting's own, which was a number then)
        with torch.device("cpu"):  # host tensors, also where a checkpoint's check builds on "meta"
            self.propensity = FixedPropensities(state["clicked"].cpu(), clip=state.get("clip", self.clip))
        super().load_state(state)


class PositionScores(Debiasing):
    """``unbiased="position"``: LightGBM's ``Dataset(position=...)``. The training scores take an
    additive bias per displayed position, s + b[pos] (:class:`PositionBias`); evaluation and
    export leave it out. The booster learns b by one Newton step per round on the round's
    gradients (:meth:`after_round`, in float64); a neural ranker learns it with the scorer, by the
    same optimiser."""

    setting = "position"

    def __init__(self, spec: ObjectiveSpec, **kwargs):
        super().__init__(spec, **kwargs)
        self.position_bias = PositionBias(self.n_positions)
        self.bucket: torch.Tensor | None = None

    @property
    def bias(self) -> torch.Tensor:
        """[n_positions] the learned biases (detached)."""
        return self.position_bias.bias.detach()

    def start(self, features, labels, sizes, positions, *, device, data_parallel: bool, **kwargs) -> None:
        super().start(features, labels, sizes, positions, device=device, data_parallel=data_parallel, **kwargs)
        if data_parallel:
            raise ValueError("`unbiased='position'` is not data-parallel yet: train on one process")
        self.position_bias = self.position_bias.to(device, torch.float64).requires_grad_(False)
        self.bucket = _bucket(self.training_positions, self.n_positions)

    def scores(self, scores: torch.Tensor) -> torch.Tensor:
        return scores + self.bias[self.bucket]

    def fitted(self) -> dict:
        return {"position_bias_": self.bias.cpu().numpy().copy()}

    def after_round(self, grad, hess, *, learning_rate: float, regularization: float) -> None:
        """One Newton step of b: with the round's gradients g, h of the adjusted scores s + b[pos]
        and λ the regularisation, b_p += η (−Σ_p g − λ n_p b_p) / (Σ_p h + λ n_p + 0.001), the sums
        over the documents shown at position p."""
        b = self.bias
        g = torch.zeros_like(b).index_add_(0, self.bucket, grad.to(b.dtype))
        h = torch.zeros_like(b).index_add_(0, self.bucket, hess.to(b.dtype))
        n = torch.zeros_like(b).index_add_(0, self.bucket, torch.ones_like(grad, dtype=b.dtype))
        b += learning_rate * (-g - regularization * n * b) / (h + regularization * n).abs().add(1e-3)

    def _loss(self, objective, scores, batch):
        return objective(self.position_bias(scores, self.positions(batch)), batch, pair_weights=None)


class DualLearningDebiasing(Debiasing):
    """``unbiased="dla"`` (neural rankers only): the Dual Learning Algorithm's propensity model
    and the ranker trained together by their weighted cross-entropies (:class:`DualLearning`);
    reported as ``"clicked"`` exp(φ_k − φ_0) (and ones)."""

    setting = "dla"

    def __init__(self, spec: ObjectiveSpec, **kwargs):
        super().__init__(spec, **kwargs)
        self.dla = DualLearning(self.n_positions)

    def start(self, *args, **kwargs) -> None:
        raise ValueError("`unbiased='dla'` trains a propensity model by gradient: the neural rankers take it, "
                         "LambdaMART does not")

    def _loss(self, objective, scores, batch):
        return self.dla.loss(scores, batch.labels, self.positions(batch), batch.mask)

    def propensities(self) -> dict[str, torch.Tensor]:
        dla = self.dla
        return {"clicked": dla.propensities, "unclicked": torch.ones(dla.n_positions, dtype=torch.float64)}


class RaceFront(Debiasing):
    """``unbiased="auto"`` on the module that holds the race: it trains nothing itself (each
    candidate holds its own debiasing, :class:`rankkit.clicks.race.DebiasingRace`), and reads the
    training data's position ids as every setting does."""

    setting = "auto"

    def start(self, *args, **kwargs) -> None:
        raise ValueError("`unbiased='auto'` is a choice among fits: LambdaMART.fit makes it, the engine "
                         "trains one of False, True, 'position' or 'ips'")


_SETTINGS = {False: Debiasing, True: LearnedBiases, "position": PositionScores, "ips": InversePropensities,
             "dla": DualLearningDebiasing, "auto": RaceFront}


def make_debiasing(unbiased, spec: ObjectiveSpec, *, family: str = "neural", n_positions: int = 10,
                   bias_p: float = 1.0, propensity_clip: float | str | None = 10.0, ema_decay: float = 0.0,
                   position_lr: float | None = None, name: str = "objective") -> Debiasing:
    """The object of the ``unbiased`` setting (one of ``FAMILY_SETTINGS[family]``; ``family`` is
    ``"trees"`` for the booster's engine, ``"neural"`` for the neural rankers), checked against the
    objective: debiasing pairs (True, "ips") needs a pairwise ``spec``; for the neural rankers,
    "dla" and "auto" need the built-in lambda loss, and "auto" no weight average (``ema_decay``);
    ``name`` is how the user spelt the objective (``"objective"``, or the old ``"loss"``)."""
    _checks.check_choice(family, tuple(FAMILY_SETTINGS), "family")
    unbiased = _checks.check_setting(unbiased, FAMILY_SETTINGS[family], "unbiased")
    if family == "neural":
        _check_choice(unbiased, spec, ema_decay, name)
    if unbiased in (True, "ips"):
        _checks.check_number(bias_p, "bias_p", low=0)
        _checks.check_int(n_positions, "n_positions")
        if not spec.pairwise:
            raise ValueError(f"`unbiased={unbiased!r}` debiases pairs: it needs a pairwise objective, got "
                             f"{spec.name!r}")
    return _SETTINGS[unbiased](spec, n_positions=n_positions, bias_p=bias_p, propensity_clip=propensity_clip,
                               position_lr=position_lr)


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


def checkpoint_entries(debiasing: Debiasing, race: DebiasingRace | None) -> dict:
    """What a checkpoint's ``rankkit`` dict keeps of a module's debiasing: the estimator's biases
    and costs (``"propensities"``) and the race's standing (``"race"``), where there are such."""
    entries = {}
    state = debiasing.state()
    if state is not None:
        entries["propensities"] = state
    if race is not None:
        entries["race"] = race.state()
    return entries


def restore_entries(debiasing: Debiasing, race: DebiasingRace | None, state: dict,
                    state_dict: dict | None = None) -> None:
    """Load what :func:`checkpoint_entries` kept in a checkpoint's ``rankkit`` dict ``state``; a
    race keeps only the candidates whose weights the checkpoint's ``state_dict`` holds."""
    if "propensities" in state:
        debiasing.load_state(state["propensities"])
    if race is not None and state_dict is not None:
        race.keep_saved(state_dict)
    if "race" in state and race is not None:
        race.load_state(state["race"])


def read_click_log(debiasing: Debiasing, race: DebiasingRace | None, train_set) -> None:
    """What a fit on a click log reads from its whole training set (a :class:`RankingDataset`
    with ``position``) before the first batch: the position ids every batch's positions go
    through, and with ``unbiased="ips"`` (or the ``"auto"`` race's ips candidate) the
    propensities by regression-EM (:meth:`Debiasing.read_positions`)."""
    debiasing.read_positions(train_set)
    for candidate in () if race is None else race.candidates.values():
        candidate.debiasing.read_positions(train_set)
