"""RankNet and LambdaRank as LightningModules holding a scorer.

The two differ only in the weighting they pass to the shared lambda kernel: RankNet uses
|ΔZ| = 1, LambdaRank |ΔNDCG@k| (or |ΔMAP|, |ΔERR|) of swapping the pair in the current
ranking (Burges, "From RankNet to LambdaRank to LambdaMART: An Overview", 2010).
"""
from __future__ import annotations

import copy
import inspect
import math
import warnings
from typing import Any

import pytorch_lightning as pl
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from rankkit.custom import GradientObjective, RecordedName, check_spec, fresh, is_custom, qualified_name, torch_loss
from rankkit.data.dataset import PaddedBatch
from rankkit.infra import checks as _checks
from rankkit.infra import quiet as _quiet
from rankkit.infra.params import check_all, declared, with_args
from rankkit.infra.checkpoint import class_path, guard_trainer_restore, guarded_load_from_checkpoint, record_class
from rankkit.lambdas import lambda_gradients
from rankkit.losses import LISTWISE, OBJECTIVES
from rankkit.metrics import ranking_metrics
from rankkit.neural.config import KERNEL_OPTIONS as NEURAL_KERNEL_OPTIONS, OPTIMIZERS, NeuralConfig
from rankkit.neural.debias import NEURAL_AUTO, NEURAL_UNBIASED, DebiasingRace, DualLearning, PositionBias
from rankkit.neural.loss import LambdaLoss, _denominator, lambda_loss
from rankkit.scorers import FeaturePreprocessor, MLPScorer, TransformerScorer, is_list_aware, score_lists
from rankkit.unbiased import PositionIds, PropensityEstimator

# Unbiased training: the click biases are re-estimated after every batch from the position-bucketed
# pair costs of the recent batches, an exponentially decayed sum (this factor per batch, a memory
# of about ten batches), so that one small batch cannot swing them.
BIAS_COST_DECAY = 0.9

#: Objective arguments a ``loss_options`` dict may not set: the batch and what the module supplies
#: itself (the per-document weights, a query plan, the seeded generator of XE-NDCG and ListMLE,
#: the unbiased pair weights).
LOSS_OPTIONS_RESERVED = ("mask", "weights", "plan", "generator", "weighting", "return_loss", "groups",
                         "pair_weights")
#: The pairwise kernel's settings that are hyper-parameters of the module itself.
PAIRWISE_OWN = ("sigma", "k", "normalize")


_LOSS_WARNED = [False]


def objective_alias(params: dict) -> dict:
    """``params`` with ``objective`` and ``loss`` both set to the one objective given: ``loss=``
    is the old spelling (a FutureWarning, once per process); both given and different is refused."""
    objective, loss = params.get("objective"), params.get("loss")
    if objective is not None and loss is not None and objective is not loss and \
            qualified_name(objective) != qualified_name(loss):
        raise ValueError(f"`loss` is the old spelling of `objective`: give one, got objective={objective!r} and "
                         f"loss={loss!r}")
    if loss is not None and objective is None and not _LOSS_WARNED[0]:
        _LOSS_WARNED[0] = True
        warnings.warn("`loss=` is now `objective=`, as LambdaMART spells it; `loss` will be removed in a later "
                      "release", FutureWarning, stacklevel=4)
    chosen = objective if objective is not None else loss
    return {**params, "objective": chosen, "loss": chosen}


def check_loss_options(options, name: str) -> dict[str, Any]:
    """``options`` (None or a dict of plain values) checked against the objective ``name`` of
    :data:`rankkit.losses.OBJECTIVES`: every key one of its keyword arguments, every value
    accepted by it (it is called once on a two-document query). Returns a copy; ValueError naming
    the first bad key otherwise."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise ValueError(f"`loss_options` has to be a dict of the objective's options, got {_checks.describe(options)}")
    pairwise = name not in LISTWISE
    target = lambda_gradients if pairwise else OBJECTIVES[name]
    takes = {p.name for p in inspect.signature(target).parameters.values() if p.kind is p.KEYWORD_ONLY}
    if name == "ndcg_loss2pp":
        takes.add("mu")
    allowed = sorted(takes - set(LOSS_OPTIONS_RESERVED) - (set(PAIRWISE_OWN) if pairwise else set()))
    for key, value in options.items():
        if pairwise and key in PAIRWISE_OWN:
            raise ValueError(f"`loss_options`: {key!r} of the pairwise objective {name!r} is the module's own "
                             f"hyper-parameter: set `{key}=` instead")
        if key not in allowed:
            raise ValueError(f"`loss_options`: {key!r} is not an option of the objective {name!r}; it takes "
                             f"{allowed}")
        if not (value is None or isinstance(value, (bool, int, float, str))):
            raise ValueError(f"`loss_options`: {key!r} has to be a plain value (a number, string, bool or "
                             f"null), got {_checks.describe(value)}")
    probe = torch.tensor([[0.5, -0.5]], dtype=torch.float64, device="cpu")  # cpu: also under a meta device
    try:
        OBJECTIVES[name](probe, torch.tensor([[1.0, 0.0]], dtype=torch.float64, device="cpu"), **options)
    except (ValueError, TypeError) as e:
        raise ValueError(f"`loss_options` {options!r} of the objective {name!r}: {e}") from None
    return dict(options)




def default_scorer(n_features: int | None, *, architecture: str, hidden, activation: str, dropout: float,
                   norm: str, log1p: bool, standardize: bool, heads: int, layers: int,
                   latent_cross: bool) -> nn.Module:
    """The scorer a :class:`NeuralRanker` builds when none is passed in: an
    :class:`~rankkit.scorers.MLPScorer` or a :class:`~rankkit.scorers.TransformerScorer`."""
    if n_features is None:
        raise ValueError("pass `n_features` (for the default MLP scorer) or `scorer` (an nn.Module)")
    n = _checks.check_int(n_features, "n_features")
    if architecture == "transformer":
        return TransformerScorer(n, tuple(hidden), heads=heads, layers=layers, activation=activation,
                                 dropout=dropout, latent_cross=latent_cross, log1p=log1p, standardize=standardize)
    return MLPScorer(n, tuple(hidden), activation=activation, dropout=dropout, norm=norm, log1p=log1p,
                     standardize=standardize)


def _set_noise(scorer: nn.Module, noise: float) -> None:
    """DASALC's training noise σ on every FeaturePreprocessor of ``scorer``."""
    preprocessors = [m for m in scorer.modules() if isinstance(m, FeaturePreprocessor)]
    if not preprocessors:
        raise ValueError(f"`noise` is added by the scorer's FeaturePreprocessor, and the scorer "
                         f"{type(scorer).__name__} has none")
    for pre in preprocessors:
        pre.noise = float(noise)


class NeuralRanker(pl.LightningModule):
    """A scorer trained with the lambda loss.

    Args:
        {params}

    A checkpoint of a module with a scorer of your own loads with
    ``LambdaRank.load_from_checkpoint(path, scorer=MyNet(...))``.

    The module remembers the feature count F it trained on (:attr:`n_features`, kept in
    checkpoints), so export and ``rankkit predict`` need no ``n_features`` for a scorer that
    does not record its own.
    """

    weighting_choices: tuple[str, ...] = ("ranknet", "ndcg", "map", "err")
    #: Lightning's loader behind rankkit's checks (a local file, weights_only, allow-listed sizes).
    load_from_checkpoint = classmethod(guarded_load_from_checkpoint)

    # Written out: PARAMS in order (tests/infra/test_params.py compares them); LambdaRank's differs
    # in `weighting` only. Lightning's save_hyperparameters reads them from this frame, which names
    # its class by the cell below.
    def __init__(self, n_features: int | None = None, *,
                 hidden: list[int] = [128, 64],  # noqa: B006 -- never mutated; hparams hold a copy
                 activation: str = "relu", dropout: float = 0.1, norm: str = "none", log1p: bool = True,
                 standardize: bool = True, weighting: str = "ranknet", k: int | None = None, sigma: float = 1.0,
                 normalize: bool = False,
                 reduction: str = "query", optimizer: str = "adam", lr: float = 0.001, weight_decay: float = 0.0,
                 scheduler: str = "none", ema_decay: float = 0.0, scorer: nn.Module | None = None,
                 objective: str | None = None, loss: str | None = None, unbiased: bool | str = False,
                 bias_p: float = 1.0, n_positions: int = 10, architecture: str = "mlp", heads: int = 4, layers: int = 2,
                 latent_cross: bool = True, noise: float = 0.0, loss_options: dict[str, Any] | None = None) -> None:
        __class__  # noqa: B018 -- the cell Lightning reads
        self._init(locals())

    def _init(self, params: dict) -> None:
        super().__init__()
        params = objective_alias({p.name: params[p.name] for p in PARAMS})
        o = NeuralConfig(**params)
        custom = o.loss is not None and is_custom(o.loss)
        self._check_objective(o.weighting, o.loss, custom, o.unbiased, o.loss_options)
        if custom:  # the kernel's options would be dropped silently: refused, as LambdaMART does
            for option in NEURAL_KERNEL_OPTIONS:
                if getattr(o, option) != getattr(NeuralConfig, option):
                    raise ValueError(f"`{option}` configures the built-in lambda kernel; a custom loss takes its own "
                                     f"(set it in the loss), got {option}={getattr(o, option)!r}")
        check_all(o)
        if not custom:  # the options are recorded as given (None stays None)
            check_loss_options(o.loss_options, o.loss if o.loss is not None else o.weighting)
        unbiased = _checks.check_setting(o.unbiased, NEURAL_UNBIASED, "unbiased")
        self.propensity = self._propensity_estimator(unbiased, o.bias_p, o.n_positions, o.weighting, o.loss,
                                                     o.sigma, o.k)
        self._bias_costs = None if self.propensity is None else self.propensity.costs.clone()
        self.position_bias = PositionBias(o.n_positions) if unbiased == "position" else None
        if unbiased == "dla" and o.loss is not None:
            raise ValueError(f"`unbiased='dla'` trains by its own softmax cross-entropies; leave `loss` None, "
                             f"got loss={o.loss!r}")
        self.dla = DualLearning(o.n_positions) if unbiased == "dla" else None
        scorer = o.scorer
        if scorer is None:
            scorer = default_scorer(o.n_features, architecture=o.architecture, hidden=o.hidden,
                                    activation=o.activation, dropout=o.dropout, norm=o.norm, log1p=o.log1p,
                                    standardize=o.standardize, heads=o.heads, layers=o.layers,
                                    latent_cross=o.latent_cross)
        elif not isinstance(scorer, nn.Module):
            raise ValueError(f"`scorer` has to be an nn.Module, got {_checks.describe(scorer)}")
        if o.noise > 0:
            _set_noise(scorer, o.noise)
        self.save_hyperparameters(ignore=["scorer"], frame=inspect.currentframe().f_back)  # __init__'s
        for key in ("hidden", "loss_options"):  # not the signature's default list, which every call shares
            self.hparams[key] = copy.deepcopy(self.hparams[key])
        # A custom loss is trained by plain autograd; the hyper-parameters and checkpoints record
        # its qualified name as text (a checkpoint holds no code; loading one never imports it).
        # A loss read from a checkpoint (RecordedName) is kept as such: training refuses to import it.
        self._custom_loss = o.loss if custom and (not isinstance(o.loss, str) or isinstance(o.loss, RecordedName)) \
            else None
        recorded = qualified_name(o.loss) if custom else o.loss
        for key in ("objective", "loss"):  # one value under both names (a checkpoint loads either way)
            self.hparams[key] = self._hparams_initial[key] = recorded  # what loggers write out
        self.scorer = scorer
        recorded = getattr(scorer, "n_features", None)
        self.n_features: int | None = recorded if isinstance(recorded, int) else o.n_features
        self.averaged: AveragedModel | None = None
        if o.ema_decay > 0:
            self.averaged = AveragedModel(scorer, multi_avg_fn=get_ema_multi_avg_fn(o.ema_decay), use_buffers=True)
            self.averaged.requires_grad_(False)
        self.val_metrics = ranking_metrics(prefix="val/")
        self.test_metrics = ranking_metrics(prefix="test/")
        self.race: DebiasingRace | None = None
        if unbiased == "auto":
            if o.ema_decay > 0 or custom:
                raise ValueError(f"`unbiased='auto'` races copies of the scorer; it takes no "
                                 f"{'ema_decay' if o.ema_decay > 0 else 'custom loss'}")
            self.race = self._debiasing_race(scorer, o.n_positions)

    def _check_objective(self, weighting, loss, custom, unbiased, loss_options) -> None:
        """``weighting`` one of the class's, and ``loss`` (when given) a known or custom objective
        that replaces it."""
        _checks.check_choice(weighting, self.weighting_choices, "weighting")
        if loss is None:
            return
        if custom:
            check_spec(loss, "loss", tuple(OBJECTIVES))
            if unbiased or loss_options:
                raise ValueError(f"`{'unbiased' if unbiased else 'loss_options'}` applies to the built-in "
                                 f"objectives; a custom loss takes its options itself")
        else:
            _checks.check_choice(loss, tuple(OBJECTIVES), "loss")
        default = inspect.signature(type(self).__init__).parameters["weighting"].default
        if weighting != default:  # `loss` replaces `weighting`: say so rather than drop it
            raise ValueError(f"`weighting` is not used when `loss` is given (loss={loss!r} has its own "
                             f"weighting); leave weighting at {default!r}, got {weighting!r}")

    def _debiasing_race(self, scorer: nn.Module, n_positions: int) -> DebiasingRace:
        """``unbiased="auto"``: copies of this module, one per debiasing of ``NEURAL_AUTO``, with
        the same settings and a copy of the scorer each."""
        h = self.hparams
        same = {name: h[name] for name in (
            "hidden", "activation", "dropout", "norm", "log1p", "standardize", "weighting", "k", "sigma",
            "normalize", "reduction", "optimizer", "lr", "weight_decay", "scheduler", "loss", "n_positions",
            "loss_options")}
        return DebiasingRace({name: type(self)(self.n_features, scorer=copy.deepcopy(scorer), unbiased=mode,
                                               bias_p=p, **same)
                              for name, (mode, p) in NEURAL_AUTO.items()}, n_positions)

    @staticmethod
    def _propensity_estimator(unbiased, bias_p, n_positions, weighting, loss, sigma, k):
        """The click-bias estimator of ``unbiased`` (None without it)."""
        if unbiased is not True:
            return None
        _checks.check_number(bias_p, "bias_p", low=0)
        _checks.check_int(n_positions, "n_positions")
        name = loss if loss is not None else weighting
        if name in LISTWISE:
            raise ValueError(f"`unbiased` debiases pairs: it needs a pairwise objective, got loss={name!r}")
        return PropensityEstimator(n_positions, p=bias_p, sigma=sigma, k=k,
                                   weighting="ranknet" if name == "ranknet" else "ndcg")

    @property
    def propensities(self) -> dict[str, torch.Tensor] | None:
        """With ``unbiased=True``: ``{"clicked": t⁺ [n_positions], "unclicked": t⁻ [n_positions]}``
        (float64, position 0 = 1), the learned position biases; with ``"dla"``, the propensity
        model's exp(φ_k − φ_0) as ``"clicked"`` (and ones); None otherwise."""
        if self.dla is not None:
            ones = torch.ones(self.dla.n_positions, dtype=torch.float64)
            return {"clicked": self.dla.propensities, "unclicked": ones}
        if self.propensity is None:
            return None
        return {"clicked": self.propensity.t_plus.clone(), "unclicked": self.propensity.t_minus.clone()}

    def serving_scorer(self) -> nn.Module:
        """The scorer that evaluates and exports: the weight average when ``ema_decay`` > 0."""
        return self.averaged.module if self.averaged is not None else self.scorer

    @property
    def averaged_scorer(self) -> nn.Module | None:
        return None if self.averaged is None else self.averaged.module

    # -- set-up: the scorer's preprocessing, from the training loader -----------------------------
    def _scorers(self) -> list[nn.Module]:
        """The scorer, and with ``unbiased="auto"`` each candidate's."""
        race = [] if self.race is None else [c.scorer for c in self.race.candidates.values()]
        return [self.scorer, *race]

    def _preprocessors(self) -> list[FeaturePreprocessor]:
        return [m for scorer in self._scorers() for m in scorer.modules()
                if isinstance(m, FeaturePreprocessor) and not m.is_fitted]

    def on_train_start(self) -> None:
        todo = self._preprocessors()
        if not todo:
            return
        # Two passes over the training documents (every rank's shard; the sums are reduced across
        # ranks), the same statistics as FeaturePreprocessor.fit on the whole training set.
        loader = self.trainer.train_dataloader
        reduce = lambda t: self.trainer.strategy.reduce(t, reduce_op="sum")  # noqa: E731
        for pre in todo:
            pre.fit_stream(lambda: (b.features[b.mask].to(self.device) for b in loader), reduce=reduce)
        if self.averaged is not None:
            self.averaged.n_averaged.zero_()
            self.averaged.update_parameters(self.scorer)  # the average starts from the initial weights

    def fit_preprocessor(self, features: torch.Tensor) -> None:
        """Fit the scorer's feature preprocessing on training features [N, F] (plain PyTorch use)."""
        for pre in [m for scorer in self._scorers() for m in scorer.modules() if isinstance(m, FeaturePreprocessor)]:
            pre.fit(features)
        if self.averaged is not None:
            self.averaged.n_averaged.zero_()
            self.averaged.update_parameters(self.scorer)

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        if self.averaged is not None:
            self.averaged.update_parameters(self.scorer)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Resuming must be exact: keep the RNG states (dropout) of the CPU and of every GPU.
        record_class(checkpoint, self)
        state = {"torch_rng": torch.get_rng_state(), "scorer_class": class_path(self.scorer),
                 "n_features": self.n_features}
        if torch.cuda.is_available():
            state["cuda_rng"] = torch.cuda.get_rng_state_all()
        if self.propensity is not None:
            state["propensities"] = {**self.propensities, "costs": self._bias_costs.clone()}
        if self.race is not None:
            state["race"] = self.race.state()
        checkpoint["rankkit"] = state

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("rankkit", {})
        if "torch_rng" in state:
            torch.set_rng_state(state["torch_rng"])
        if isinstance(state.get("n_features"), int):
            self.n_features = state["n_features"]
        if "cuda_rng" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        if "propensities" in state and self.propensity is not None:
            self.propensity.t_plus = state["propensities"]["clicked"].clone()
            self.propensity.t_minus = state["propensities"]["unclicked"].clone()
            self._bias_costs = state["propensities"]["costs"].clone()
        if "race" in state and self.race is not None:
            self.race.load_state(state["race"])

    # -- the model ------------------------------------------------------------------------
    def forward(self, features: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Scores (inference only): features [..., F] -> [...] for a pointwise scorer (``mask``
        ignored); for a list-aware one, a padded batch [Q, L, F] with ``mask`` [Q, L] (None: all
        real) -> [Q, L], zero on padding, or one query [L, F] -> [L]."""
        scorer = self.serving_scorer()
        if not is_list_aware(scorer):
            return scorer(features)
        if features.dim() == 2:
            return score_lists(scorer, features.unsqueeze(0))[0]
        return score_lists(scorer, features, mask)

    def objective(self, scores: torch.Tensor, batch: PaddedBatch) -> torch.Tensor:
        """The training loss of a batch: ``loss`` when given, else the ``weighting``'s lambda loss;
        with ``unbiased``, its pairs weighed by the click biases updated on this batch."""
        h = self.hparams
        if h.get("loss") is not None and is_custom(h.loss):
            return self._custom_objective(scores, batch)
        if self.dla is not None:
            return self.dla.loss(scores, batch.labels, self._positions(batch), batch.mask)
        if self.position_bias is not None:
            scores = self.position_bias(scores, self._positions(batch))
        debias = {} if self.propensity is None else {"pair_weights": self._pair_weights(scores, batch)}
        own = dict(h.get("loss_options") or {})
        if h.get("loss") is not None:
            options = {} if h.loss in LISTWISE else dict(sigma=h.sigma, k=h.k, normalize=h.normalize)
            if h.loss in ("xendcg", "listmle"):  # XE-NDCG's γ, ListMLE's order among equal labels
                if getattr(self, "_loss_generator", None) is None:  # seeded by seed_everything
                    self._loss_generator = torch.Generator().manual_seed(int(torch.initial_seed()) % 2**63)
                options["generator"] = self._loss_generator
            return lambda_loss(scores, batch.labels, mask=batch.mask, loss=h.loss, reduction=h.reduction,
                               **options, **own, **debias)
        return lambda_loss(scores, batch.labels, mask=batch.mask, weighting=h.weighting, sigma=h.sigma,
                           k=h.k, normalize=h.normalize, reduction=h.reduction, **own, **debias)

    def _custom_objective(self, scores: torch.Tensor, batch: PaddedBatch) -> torch.Tensor:
        """A custom loss by plain autograd: Σ of its per-query losses over ``reduction``'s
        denominator (the built-in loss's normalisation). Imported (a config's
        ``package.module.function``) and checked for padding on the first batch."""
        loss = getattr(self, "_custom_wrapped", None)
        if loss is None:
            loss = fresh(torch_loss(self._custom_loss if self._custom_loss is not None else self.hparams.loss, "loss"))
            self._custom_wrapped = loss
        mask = batch.mask
        if isinstance(loss, GradientObjective):  # a closed form: its gradient injected, as the built-ins'
            return LambdaLoss.apply(scores, batch.labels, mask, dict(objective=loss, reduction=self.hparams.reduction))
        loss.check(scores.detach(), batch.labels, mask)
        total = loss.total(scores.masked_fill(~mask, 0.0), batch.labels.to(scores.dtype).masked_fill(~mask, 0.0), mask)
        if not bool(torch.isfinite(total)):
            raise ValueError(f"the loss {self.hparams.loss} is not finite on this batch ({float(total)})")
        return total / _denominator(batch.labels, mask, self.hparams.reduction).to(total.dtype)

    def _positions(self, batch: PaddedBatch) -> torch.Tensor:
        """The batch's displayed positions [Q, L], which every ``unbiased`` setting needs."""
        if batch.position is None:
            raise ValueError(f"`unbiased={self.hparams.unbiased!r}` needs the documents' displayed positions: the "
                             f"training batch has no `position` (train on a dataset with `position=`, e.g. "
                             f"ClickLog.sessions)")
        return batch.position

    def _pair_weights(self, scores: torch.Tensor, batch: PaddedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Update t⁺, t⁻ from the batch's detached scores [Q, L]; return its (upper, lower) [Q, L]."""
        self._positions(batch)
        est = self.propensity
        est.accumulate(scores.detach(), batch.labels, batch.position, batch.mask)
        self._bias_costs = BIAS_COST_DECAY * self._bias_costs + est.costs
        est.costs = self._bias_costs.clone()
        est.step()
        return self.propensity.pair_factors(batch.position, batch.mask, dtype=scores.dtype)

    def training_step(self, batch: PaddedBatch, batch_idx: int) -> torch.Tensor:
        if self.n_features is None:
            self.n_features = int(batch.features.shape[-1])
        if self.race is not None:
            loss = self.race.loss(batch)
        else:
            loss = self.objective(score_lists(self.scorer, batch.features, batch.mask), batch)
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True, batch_size=len(batch.labels),
                 sync_dist=True)
        return loss

    def _evaluate(self, batch: PaddedBatch, metrics) -> None:
        metrics.update(self(batch.features, batch.mask), batch.labels, batch.mask)
        for name, metric in metrics.items():  # NDCG@10, the selection metric, on the progress bar
            self.log(name, metric, on_step=False, on_epoch=True, prog_bar=name.endswith("/ndcg@10"),
                     batch_size=len(batch.labels))

    def validation_step(self, batch: PaddedBatch, batch_idx: int) -> None:
        if self.race is not None:  # the metrics are those of the epoch's leader, at the epoch's end
            self.race.collect(batch)
            return
        self._evaluate(batch, self.val_metrics)

    def on_validation_epoch_end(self) -> None:
        if self.race is None:
            return
        if self.trainer.sanity_checking:
            self.race.discard()
            return
        epochs = self.trainer.max_epochs
        if epochs is None or epochs < 1:
            raise ValueError("`unbiased='auto'` schedules its race over the epochs: give the Trainer max_epochs")
        leader = self._take_leader(self.race.end_epoch(self.current_epoch, epochs))
        for scores, labels, mask in self.race.leader_batches_:
            self.val_metrics.update(scores, labels, mask)
        for name, metric in self.val_metrics.items():
            self.log(name, metric.compute(), prog_bar=name.endswith("/ndcg@10"))
        self.val_metrics.reset()
        self.log("val/explained_clicks", self.race.scores_[leader], prog_bar=True)

    def validate_race(self, batches, epoch: int, epochs: int) -> str:
        """With ``unbiased="auto"`` in a plain PyTorch loop: score the candidates on validation
        click-log ``batches`` (PaddedBatch with ``position``) after 0-based ``epoch`` of ``epochs``,
        drop the stage's losers, copy the leader into ``scorer`` and return its name."""
        if self.race is None:
            raise ValueError("validate_race applies to unbiased='auto'")
        for batch in batches:
            self.race.collect(batch)
        return self._take_leader(self.race.end_epoch(epoch, epochs))

    def _take_leader(self, name: str) -> str:
        self.scorer.load_state_dict(self.race.candidates[name].scorer.state_dict())
        return name

    @property
    def unbiased_choice_(self) -> str | None:
        """With ``unbiased="auto"``: the candidate the race keeps (the leader until it ends)."""
        return None if self.race is None else self.race.choice_

    def test_step(self, batch: PaddedBatch, batch_idx: int) -> None:
        self._evaluate(batch, self.test_metrics)

    def predict_step(self, batch: PaddedBatch, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        """Scores of the real documents of the batch, flat [N_batch] in (query, position) order."""
        return self(batch.features, batch.mask)[batch.mask]

    def on_fit_start(self) -> None:
        """With ``unbiased`` and a data module whose training set has positions: its position ids
        (:class:`rankkit.unbiased.PositionIds`, LightGBM's reading: 0- or 1-based or sparse ids
        train the same model), which every batch's positions go through
        (:meth:`on_after_batch_transfer`); more distinct ids than ``n_positions`` are refused."""
        self._position_ids = None
        train = getattr(getattr(self._trainer, "datamodule", None), "train_set", None)
        if self.hparams.unbiased and getattr(train, "position", None) is not None:
            self._position_ids = PositionIds.of(train.position, "the training data's position",
                                                n_positions=self.hparams.n_positions)

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        ids = getattr(self, "_position_ids", None)
        if ids is None or not isinstance(batch, PaddedBatch) or batch.position is None:
            return batch
        position = torch.zeros_like(batch.position)
        position[batch.mask] = ids.index(batch.position[batch.mask], "a batch's position")
        return batch._replace(position=position)

    def setup(self, stage: str) -> None:
        _quiet.hold(self)  # Lightning's noise that a rankkit fit causes (rankkit.infra.quiet)
        guard_trainer_restore(self)  # a ckpt_path given to the Trainer is checked before it is read

    def teardown(self, stage: str) -> None:
        _quiet.release(self)

    def parameter_groups(self) -> list[dict]:
        """The optimiser's parameter groups: the scorer's, and the position model's without weight
        decay (nothing should pull it towards "no bias")."""
        params = [{"params": list(self.scorer.parameters())}]
        position_models = [m for m in (self.position_bias, self.dla) if m is not None]
        if position_models:
            params.append({"params": [p for m in position_models for p in m.parameters()], "weight_decay": 0.0})
        return params

    def configure_optimizers(self):
        h = self.hparams
        params = self.parameter_groups() if self.race is None else self.race.parameter_groups()
        opt = OPTIMIZERS[h.optimizer](params, lr=h.lr, weight_decay=h.weight_decay)
        if h.scheduler == "cosine":
            t_max = max(1, self.trainer.max_epochs or 1) if self._trainer is not None else 1
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.CosineAnnealingLR(opt, t_max)}
        if h.scheduler == "plateau":
            sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max", factor=0.5, patience=2)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "monitor": "val/ndcg@10"}}
        if h.scheduler == "warmup_cosine":
            steps = self.trainer.estimated_stepping_batches if self._trainer is not None else 1
            sched = torch.optim.lr_scheduler.LambdaLR(opt, WarmupCosine(int(steps) if math.isfinite(steps) else 10**6))
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
        return opt


class WarmupCosine:
    """The lr factor of step t of ``total``: (t + 1) / w over the first w = max(1, total / 20)
    steps, then ½ (1 + cos(π (t − w) / (total − w))), reaching 0 at the last step.

    >>> f = WarmupCosine(100)
    >>> [round(f(t), 3) for t in (0, 4, 5, 52, 99)]
    [0.2, 1.0, 1.0, 0.5, 0.0]
    """

    def __init__(self, total: int):
        self.total, self.warm = max(2, total), max(1, total // 20)

    def __call__(self, step: int) -> float:
        if step < self.warm:
            return (step + 1) / self.warm
        span = max(1, self.total - 1 - self.warm)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - self.warm) / span)))


class RankNet(NeuralRanker):
    """RankNet: the lambda loss with |ΔZ| = 1 (Burges 2010, section 2).

    Args:
        {params}
    """

    weighting_choices = ("ranknet",)


class LambdaRank(NeuralRanker):
    """LambdaRank: lambdas weighted by |ΔNDCG@k| (or MAP, ERR) of each swap (Burges 2010, section 4).

    Args:
        {params}
    """

    weighting_choices = ("ndcg", "map", "err")

    def __init__(self, n_features: int | None = None, *,
                 hidden: list[int] = [128, 64],  # noqa: B006 -- never mutated; hparams hold a copy
                 activation: str = "relu", dropout: float = 0.1, norm: str = "none", log1p: bool = True,
                 standardize: bool = True, weighting: str = "ndcg", k: int | None = None, sigma: float = 1.0,
                 normalize: bool = False,
                 reduction: str = "query", optimizer: str = "adam", lr: float = 0.001, weight_decay: float = 0.0,
                 scheduler: str = "none", ema_decay: float = 0.0, scorer: nn.Module | None = None,
                 objective: str | None = None, loss: str | None = None, unbiased: bool | str = False,
                 bias_p: float = 1.0, n_positions: int = 10, architecture: str = "mlp", heads: int = 4, layers: int = 2,
                 latent_cross: bool = True, noise: float = 0.0, loss_options: dict[str, Any] | None = None) -> None:
        __class__  # noqa: B018 -- the cell Lightning reads
        self._init(locals())


#: The modules' hyper-parameters, in the order of their signatures.
PARAMS = declared(NeuralConfig)
for _cls in (NeuralRanker, RankNet, LambdaRank):
    _cls.__doc__ = with_args(_cls.__doc__, PARAMS)
