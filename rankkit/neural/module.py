"""RankNet and LambdaRank as LightningModules holding a scorer.

The two differ only in the weighting they pass to the shared lambda kernel: RankNet uses
|ΔZ| = 1, LambdaRank |ΔNDCG@k| (or |ΔMAP|, |ΔERR|) of swapping the pair in the current
ranking (Burges, "From RankNet to LambdaRank to LambdaMART: An Overview", 2010).
"""
from __future__ import annotations

import inspect
from typing import Any

import pytorch_lightning as pl
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel

from rankkit.data.dataset import PaddedBatch
from rankkit.infra import checks as _checks
from rankkit.infra import quiet as _quiet
from rankkit.infra.params import check_all, declared, with_args
from rankkit.infra.checkpoint import (class_path, guard_trainer_restore, guarded_load_from_checkpoint, record_class,
                                      restore_rng, rng_state)
from rankkit.metrics import ranking_metrics
from rankkit.neural.config import NeuralConfig, Objective
from rankkit.clicks.debiasing import (NEURAL_UNBIASED, checkpoint_entries, make_debiasing, read_click_log,
                                      restore_entries)
from rankkit.clicks.race import DebiasingRace
from rankkit.neural.objective import (check_objective_settings, neural_objective, objective_alias, record_objective,
                                      spelling)
from rankkit.neural.optim import optimizers, restart_average, weight_average
from rankkit.scorers import fit_preprocessors, is_list_aware, neural_scorer, score_lists


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
                 standardize: bool = True, encoding: str = "standard", bins: int = 16, weighting: str = "ranknet",
                 k: int | None = None, sigma: float = 1.0, normalize: bool = False, reduction: str = "query",
                 optimizer: str = "adam", lr: float = 0.001, weight_decay: float = 0.0, scheduler: str = "none",
                 ema_decay: float = 0.0,
                 scorer: nn.Module | None = None, objective: Objective = None, loss: Objective = None,
                 unbiased: bool | str = False, bias_p: float = 1.0, n_positions: int = 10,
                 propensity_clip: float | str | None = 10.0, position_lr: float | None = 1e-2,
                 architecture: str = "mlp", heads: int = 4, layers: int = 2,
                 latent_cross: bool = True, noise: float = 0.0, loss_options: dict[str, Any] | None = None) -> None:
        __class__  # noqa: B018 -- the cell Lightning reads
        self._init(locals())

    def _init(self, params: dict) -> None:
        super().__init__()
        params = {p.name: params[p.name] for p in PARAMS}
        name = spelling(params)
        o = NeuralConfig(**objective_alias(params))
        settings = dict(choices=self.weighting_choices, name=name,
                        default_weighting=inspect.signature(type(self).__init__).parameters["weighting"].default)
        check_objective_settings(o, **settings)  # the objective first, then the ranges
        check_all(o)
        self.training_objective = neural_objective(o, **settings)  # and its options
        unbiased = _checks.check_setting(o.unbiased, NEURAL_UNBIASED, "unbiased")
        self.debiasing = make_debiasing(unbiased, self.training_objective.spec, bias_p=o.bias_p,
                                        n_positions=o.n_positions, ema_decay=o.ema_decay,
                                        propensity_clip=o.propensity_clip, position_lr=o.position_lr, name=name)
        self.position_bias, self.dla = self.debiasing.position_bias, self.debiasing.dla  # registered here
        scorer = neural_scorer(o)
        self.save_hyperparameters(ignore=["scorer"], frame=inspect.currentframe().f_back)  # __init__'s
        record_objective(self, self.training_objective.spec)
        self.scorer = scorer
        recorded = getattr(scorer, "n_features", None)
        self.n_features: int | None = recorded if isinstance(recorded, int) else o.n_features
        self.averaged: AveragedModel | None = weight_average(scorer, o.ema_decay)
        self.val_metrics = ranking_metrics(prefix="val/")
        self.test_metrics = ranking_metrics(prefix="test/")
        self.race = DebiasingRace.of(self, scorer, o.n_positions) if unbiased == "auto" else None
        if self.race is not None:  # the leader's copy, to serve: only the race's candidates train (and DDP
            scorer.requires_grad_(False)  # reduces only parameters that do)

    @property
    def propensity(self):
        """``unbiased=True``: the click-bias estimator
        (:class:`rankkit.clicks.propensity.PropensityEstimator`); "ips": its
        :class:`~rankkit.clicks.propensity.FixedPropensities` once the training log is read; else None."""
        return self.debiasing.propensity

    @property
    def propensities(self) -> dict[str, torch.Tensor] | None:
        """The learned position biases (:meth:`rankkit.clicks.debiasing.Debiasing.propensities`)."""
        return self.debiasing.propensities()

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

    def on_train_start(self) -> None:
        # Two passes over the training documents (every rank's shard; the sums are reduced across
        # ranks), the same statistics as FeaturePreprocessor.fit on the whole training set.
        loader = self.trainer.train_dataloader
        if fit_preprocessors(self._scorers(), lambda: (b.features[b.mask].to(self.device) for b in loader),
                             reduce=lambda t: self.trainer.strategy.reduce(t, reduce_op="sum")):
            restart_average(self.averaged, self.scorer)

    def fit_preprocessor(self, features: torch.Tensor) -> None:
        """Fit the scorer's feature preprocessing on training features [N, F] (plain PyTorch use)."""
        fit_preprocessors(self._scorers(), features, refit=True)
        restart_average(self.averaged, self.scorer)

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        if self.averaged is not None:
            self.averaged.update_parameters(self.scorer)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Resuming must be exact: keep the RNG states (dropout) of the CPU and of every GPU.
        record_class(checkpoint, self)
        # The class a loader builds the scorer from: with unbiased="auto" the networks' (a blend's
        # MeanEnsemble is rebuilt from them, DebiasingRace.shape_scorer).
        networks = self.scorer if self.race is None else next(iter(self.race.candidates.values())).scorer
        checkpoint["rankkit"] = {**rng_state(), "scorer_class": class_path(networks), "n_features": self.n_features,
                                 **checkpoint_entries(self.debiasing, self.race)}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("rankkit", {})
        restore_rng(state)
        if "position_lr" not in (checkpoint.get("hyper_parameters") or {}):
            self._position_lr_of_old_checkpoints()
        if isinstance(state.get("n_features"), int):
            self.n_features = state["n_features"]
        restore_entries(self.debiasing, self.race, state, checkpoint.get("state_dict"))
        if self.race is not None:  # a blend led: the scorer is the mean of two networks
            self.race.shape_scorer(self)

    def _position_lr_of_old_checkpoints(self) -> None:
        """A checkpoint saved before ``position_lr`` (2026-12-06) trained its position models at
        ``lr``: it goes on doing so (None), here and in the race's candidates."""
        for module in [self, *([] if self.race is None else self.race.candidates.values())]:
            module.hparams.position_lr = None
            module.debiasing.position_lr = None

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
        """The training loss of a batch (:meth:`rankkit.clicks.debiasing.Debiasing.loss`)."""
        return self.debiasing.loss(self.training_objective, scores, batch)

    def training_step(self, batch: PaddedBatch, batch_idx: int) -> torch.Tensor:
        if self.n_features is None:
            self.n_features = int(batch.features.shape[-1])
        loss = (self.race.loss(batch) if self.race is not None
                else self.objective(score_lists(self.scorer, batch.features, batch.mask), batch))
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
        if self.race is not None:
            self.race.end_validation(self)

    def validate_race(self, batches, epoch: int, epochs: int, patience: int | None = None) -> str:
        """``unbiased="auto"`` in a plain loop: score the candidates on validation click-log ``batches``
        after 0-based ``epoch`` of ``epochs``, drop the stage's losers (stages end sooner when the loop
        stops early after ``patience`` epochs without improvement); returns the leader, now in ``scorer``."""
        if self.race is None:
            raise ValueError("validate_race applies to unbiased='auto'")
        return self.race.validate(self, batches, epoch, epochs, patience)

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
        self.read_click_log(getattr(getattr(self._trainer, "datamodule", None), "train_set", None))

    def read_click_log(self, train_set) -> None:
        """:func:`rankkit.clicks.debiasing.read_click_log` (``Trainer.fit`` does it; a plain loop calls it once)."""
        read_click_log(self.debiasing, self.race, train_set)

    def on_before_batch_transfer(self, batch, dataloader_idx: int):
        # on the host, before the batch goes to the device: on a GPU the mapping would wait for it
        return self.debiasing.map(batch)

    def setup(self, stage: str) -> None:
        _quiet.hold(self)  # Lightning's noise that a rankkit fit causes (rankkit.infra.quiet)
        guard_trainer_restore(self)  # a ckpt_path given to the Trainer is checked before it is read

    def teardown(self, stage: str) -> None:
        _quiet.release(self)

    def parameter_groups(self) -> list[dict]:
        """The optimiser's parameter groups (:meth:`rankkit.clicks.debiasing.Debiasing.parameter_groups`)."""
        return self.debiasing.parameter_groups(self.scorer)

    def configure_optimizers(self):
        params = self.parameter_groups() if self.race is None else self.race.parameter_groups()
        return optimizers(params, self.hparams, self._trainer)


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
                 standardize: bool = True, encoding: str = "standard", bins: int = 16, weighting: str = "ndcg",
                 k: int | None = None, sigma: float = 1.0, normalize: bool = False, reduction: str = "query",
                 optimizer: str = "adam", lr: float = 0.001, weight_decay: float = 0.0, scheduler: str = "none",
                 ema_decay: float = 0.0,
                 scorer: nn.Module | None = None, objective: Objective = None, loss: Objective = None,
                 unbiased: bool | str = False, bias_p: float = 1.0, n_positions: int = 10,
                 propensity_clip: float | str | None = 10.0, position_lr: float | None = 1e-2,
                 architecture: str = "mlp", heads: int = 4, layers: int = 2,
                 latent_cross: bool = True, noise: float = 0.0, loss_options: dict[str, Any] | None = None) -> None:
        __class__  # noqa: B018 -- the cell Lightning reads
        self._init(locals())


#: The modules' hyper-parameters, in the order of their signatures.
PARAMS = declared(NeuralConfig)
for _cls in (NeuralRanker, RankNet, LambdaRank):
    _cls.__doc__ = with_args(_cls.__doc__, PARAMS)
