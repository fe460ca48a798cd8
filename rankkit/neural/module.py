"""RankNet and LambdaRank as LightningModules holding a scorer.

The two differ only in the weighting they pass to the shared lambda kernel: RankNet uses
|ΔZ| = 1, LambdaRank |ΔNDCG@k| (or |ΔMAP|, |ΔERR|) of swapping the pair in the current
ranking (Burges 2010, "From RankNet to LambdaRank to LambdaMART").
"""
from __future__ import annotations

import copy
from typing import Any

import pytorch_lightning as pl
import torch

from rankkit.data.dataset import PaddedBatch
from rankkit.metrics import ranking_metrics
from rankkit.neural.loss import REDUCTIONS, lambda_loss
from rankkit.neural.scorer import MLPScorer

OPTIMIZERS = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}
SCHEDULERS = ("none", "cosine", "plateau")


class NeuralRanker(pl.LightningModule):
    """A scorer trained with the lambda loss.

    Args:
        n_features: F; when None it is read from the datamodule's training set in ``setup``.
        hidden, activation, dropout, norm, log1p, standardize: the :class:`MLPScorer`.
        weighting: ``"ranknet"``, ``"ndcg"``, ``"map"`` or ``"err"``.
        k: truncation level of the kernel (None: all pairs).
        sigma: σ of the logistic.
        normalize: LightGBM's per-query lambda normalisation.
        reduction: loss normalisation, see :mod:`rankkit.neural.loss`.
        optimizer: ``"adam"``, ``"adamw"`` or ``"sgd"``; lr, weight_decay its settings.
        scheduler: ``"none"``, ``"cosine"`` (over ``max_epochs``) or ``"plateau"``
            (halve the lr when val NDCG@10 stalls).
        ema_decay: d > 0 keeps an exponential moving average of the scorer's weights,
            θ̄ ← d θ̄ + (1 − d) θ after every training batch (Polyak averaging), in
            ``averaged_scorer``; validation, test, predict, ``forward`` and export then use the
            average. 0 (the default) turns it off.
    """

    weighting_choices: tuple[str, ...] = ("ranknet", "ndcg", "map", "err")

    def __init__(self, n_features: int | None = None, hidden: list[int] = [128, 64],  # noqa: B006
                 activation: str = "relu", dropout: float = 0.1, norm: str = "none",
                 log1p: bool = True, standardize: bool = True, weighting: str = "ranknet",
                 k: int | None = None, sigma: float = 1.0, normalize: bool = False,
                 reduction: str = "query", optimizer: str = "adam", lr: float = 1e-3,
                 weight_decay: float = 0.0, scheduler: str = "none", ema_decay: float = 0.0):
        super().__init__()
        if weighting not in self.weighting_choices:
            raise ValueError(f"`weighting` has to be one of {self.weighting_choices}, got {weighting!r}")
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"`optimizer` has to be one of {sorted(OPTIMIZERS)}, got {optimizer!r}")
        if scheduler not in SCHEDULERS:
            raise ValueError(f"`scheduler` has to be one of {SCHEDULERS}, got {scheduler!r}")
        if reduction not in REDUCTIONS:
            raise ValueError(f"`reduction` has to be one of {REDUCTIONS}, got {reduction!r}")
        if k is not None and k < 1:
            raise ValueError(f"`k` has to be a positive integer or None, got {k}")
        if isinstance(ema_decay, bool) or not isinstance(ema_decay, (int, float)) or not 0 <= ema_decay < 1:
            raise ValueError(f"`ema_decay` has to be in [0, 1), got {ema_decay!r}")
        self.save_hyperparameters()
        self.scorer: MLPScorer | None = None
        self.averaged_scorer: MLPScorer | None = None
        self._preprocessor_fitted = False
        if n_features is not None:
            self._build(n_features)
        self.val_metrics = ranking_metrics(prefix="val/")
        self.test_metrics = ranking_metrics(prefix="test/")

    def _build(self, n_features: int) -> None:
        h = self.hparams
        self.scorer = MLPScorer(n_features, tuple(h.hidden), activation=h.activation, dropout=h.dropout,
                                norm=h.norm, log1p=h.log1p, standardize=h.standardize)
        if h.get("ema_decay", 0.0) > 0:
            self.averaged_scorer = copy.deepcopy(self.scorer).requires_grad_(False)

    @property
    def inference_scorer(self) -> MLPScorer:
        """The scorer that evaluates and exports: the weight average when ``ema_decay`` > 0."""
        return self.averaged_scorer if self.averaged_scorer is not None else self.scorer

    # -- set-up ---------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        train = getattr(dm, "train_set", None)
        if self.scorer is None:
            if dm is None:
                raise ValueError("`n_features` is None and there is no datamodule to read it from")
            dm.setup(stage)
            self.hparams.n_features = dm.n_features
            self._build(dm.n_features)
            train = dm.train_set
        if stage == "fit" and not self._preprocessor_fitted and train is not None and self.current_epoch == 0:
            self.fit_preprocessor(train.features)

    def fit_preprocessor(self, features: torch.Tensor) -> None:
        """Fit the scorer's standardisation on training features [N, F]."""
        self.scorer.preprocess.fit(features.to(self.scorer.preprocess.mean.device))
        if self.averaged_scorer is not None:  # the average starts from the initial weights
            self.averaged_scorer.load_state_dict(self.scorer.state_dict())
        self._preprocessor_fitted = True

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        if self.averaged_scorer is None:
            return
        d = self.hparams.ema_decay
        with torch.no_grad():
            for avg, p in zip(self.averaged_scorer.parameters(), self.scorer.parameters()):
                avg.lerp_(p, 1.0 - d)
            for avg, b in zip(self.averaged_scorer.buffers(), self.scorer.buffers()):
                avg.copy_(b)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Resuming must be exact: keep the RNG state (dropout) and that the scaler was fitted.
        checkpoint["rankkit"] = {"torch_rng": torch.get_rng_state(), "preprocessor_fitted": True}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("rankkit", {})
        if self.scorer is None:
            self._build(checkpoint["hyper_parameters"]["n_features"])
        self._preprocessor_fitted = bool(state.get("preprocessor_fitted", False))
        if "torch_rng" in state:
            torch.set_rng_state(state["torch_rng"])

    # -- the model ------------------------------------------------------------------------
    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """features [..., F] -> scores [...] (inference only)."""
        return self.inference_scorer(features)

    def loss(self, scores: torch.Tensor, batch: PaddedBatch) -> torch.Tensor:
        h = self.hparams
        return lambda_loss(scores, batch.labels, mask=batch.mask, weighting=h.weighting, sigma=h.sigma,
                           k=h.k, normalize=h.normalize, reduction=h.reduction)

    def training_step(self, batch: PaddedBatch, batch_idx: int) -> torch.Tensor:
        scores = self.scorer(batch.features)
        loss = self.loss(scores, batch)
        self.log("train/loss", loss, prog_bar=True, on_step=True, on_epoch=True, batch_size=len(batch.labels))
        return loss

    def _evaluate(self, batch: PaddedBatch, metrics) -> None:
        scores = self.inference_scorer(batch.features)
        metrics.update(scores, batch.labels, batch.mask)
        self.log_dict(metrics, on_step=False, on_epoch=True, prog_bar=False, batch_size=len(batch.labels))

    def validation_step(self, batch: PaddedBatch, batch_idx: int) -> None:
        self._evaluate(batch, self.val_metrics)

    def test_step(self, batch: PaddedBatch, batch_idx: int) -> None:
        self._evaluate(batch, self.test_metrics)

    def predict_step(self, batch: PaddedBatch, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        """Scores of the real documents of the batch, flat [N_batch] in (query, position) order."""
        return self.inference_scorer(batch.features)[batch.mask]

    def configure_optimizers(self):
        h = self.hparams
        opt = OPTIMIZERS[h.optimizer](self.scorer.parameters(), lr=h.lr, weight_decay=h.weight_decay)
        if h.scheduler == "cosine":
            t_max = max(1, self.trainer.max_epochs or 1) if self._trainer is not None else 1
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.CosineAnnealingLR(opt, t_max)}
        if h.scheduler == "plateau":
            sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max", factor=0.5, patience=2)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "monitor": "val/ndcg@10"}}
        return opt


class RankNet(NeuralRanker):
    """RankNet: the lambda loss with |ΔZ| = 1 (Burges 2010, section 2)."""

    weighting_choices = ("ranknet",)

    def __init__(self, n_features: int | None = None, hidden: list[int] = [128, 64],  # noqa: B006
                 activation: str = "relu", dropout: float = 0.1, norm: str = "none",
                 log1p: bool = True, standardize: bool = True, weighting: str = "ranknet",
                 k: int | None = None, sigma: float = 1.0, normalize: bool = False,
                 reduction: str = "query", optimizer: str = "adam", lr: float = 1e-3,
                 weight_decay: float = 0.0, scheduler: str = "none", ema_decay: float = 0.0):
        super().__init__(n_features, hidden, activation, dropout, norm, log1p, standardize, weighting, k,
                         sigma, normalize, reduction, optimizer, lr, weight_decay, scheduler, ema_decay)


class LambdaRank(NeuralRanker):
    """LambdaRank: lambdas weighted by |ΔNDCG@k| (or MAP, ERR) of each swap (Burges 2010, section 4)."""

    weighting_choices = ("ndcg", "map", "err")

    def __init__(self, n_features: int | None = None, hidden: list[int] = [128, 64],  # noqa: B006
                 activation: str = "relu", dropout: float = 0.1, norm: str = "none",
                 log1p: bool = True, standardize: bool = True, weighting: str = "ndcg",
                 k: int | None = None, sigma: float = 1.0, normalize: bool = False,
                 reduction: str = "query", optimizer: str = "adam", lr: float = 1e-3,
                 weight_decay: float = 0.0, scheduler: str = "none", ema_decay: float = 0.0):
        super().__init__(n_features, hidden, activation, dropout, norm, log1p, standardize, weighting, k,
                         sigma, normalize, reduction, optimizer, lr, weight_decay, scheduler, ema_decay)
