"""LambdaMART as a LightningModule: each epoch grows one tree, with manual optimisation.

The module holds the growing :class:`ObliviousEnsemble` as ``self.ensemble`` (what
:func:`rankkit.export.unwrap` exports) and the training state (binned codes, scores) outside
the state dict. The first training step of an epoch computes (grad, hess) with the shared
lambda kernel at the current scores and grows one tree on the **whole** training set (the
batch itself is not used; pass ``limit_train_batches=1`` to the Trainer to skip loading the
others). Validation scores the padded batches with the ensemble and logs the same metrics as
the neural modules (``val/ndcg@1``, ``@3``, ``@5``, ``@10`` and ``val/map``), so Lightning's
EarlyStopping and ModelCheckpoint on ``val/ndcg@10`` work as usual.
"""
from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch

from rankkit.boosting.binning import MAX_BINS, QuantileBinner
from rankkit.boosting.booster import _valid_codes, check_params, grow_round, sample_round
from rankkit.boosting.ensemble import ObliviousEnsemble
from rankkit.boosting.objectives import QueryLayout, make_objective
from rankkit.boosting.tree import N_CODES, ObliviousTreeGrower, TreeParams
from rankkit.data.dataset import PaddedBatch, RankingDataset
from rankkit.metrics import ranking_metrics


class LambdaMARTModule(pl.LightningModule):
    """Boosted oblivious trees trained by ``Trainer.fit``, one tree per epoch.

    Args: as :class:`rankkit.boosting.LambdaMART` (the epochs play ``n_estimators``, and
        Lightning's EarlyStopping plays ``early_stopping_rounds``). The training set is the
        datamodule's ``train_set`` (a :class:`RankingDataset`).
    """

    def __init__(self, objective: str = "lambdarank", depth: int = 6, learning_rate: float = 0.1,
                 l2: float = 1.0, min_data_in_leaf: int = 20, min_sum_hessian: float = 1e-3,
                 weighting: str = "ndcg", k: int | None = None, sigma: float = 1.0,
                 gain: str = "exp", normalize: bool = False, subsample: float = 1.0,
                 colsample: float = 1.0, max_bins: int = MAX_BINS, seed: int = 0,
                 bagging_temperature: float = 0.0, random_strength: float = 0.0,
                 exact_newton: bool = False):
        super().__init__()
        check_params(objective=objective, depth=depth, learning_rate=learning_rate, l2=l2,
                     min_data_in_leaf=min_data_in_leaf, min_sum_hessian=min_sum_hessian, k=k,
                     sigma=sigma, subsample=subsample, colsample=colsample, max_bins=max_bins,
                     bagging_temperature=bagging_temperature, random_strength=random_strength,
                     exact_newton=exact_newton)
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.objective = make_objective(objective, weighting=weighting, k=k, sigma=sigma,
                                        gain=gain, normalize=normalize)
        self.params = TreeParams(depth, learning_rate, l2, min_data_in_leaf, min_sum_hessian)
        self.ensemble: ObliviousEnsemble | None = None
        self.val_metrics = ranking_metrics(prefix="val/")
        self.test_metrics = ranking_metrics(prefix="test/")
        self._state: dict[str, Any] | None = None
        # Lightning counts ``global_step`` (which ModelCheckpoint and loggers key on) in optimizer
        # steps; the trees need none, so a step of this empty parameter marks each round.
        self._round_marker = torch.nn.Parameter(torch.zeros(0))

    def _empty_ensemble(self, n_features: int, n_trees: int = 0, bias: float = 0.0) -> ObliviousEnsemble:
        d = self.params.depth
        return ObliviousEnsemble(n_features, torch.zeros(n_trees, d, dtype=torch.long),
                                 torch.full((n_trees, d), torch.inf), torch.zeros(n_trees, 1 << d), bias)

    # -- set-up: bin the training set once ------------------------------------------------------
    def on_fit_start(self) -> None:
        dm = self.trainer.datamodule
        train: RankingDataset | None = getattr(dm, "train_set", None)
        if train is None:
            raise ValueError("LambdaMARTModule needs a datamodule with a `train_set` RankingDataset")
        h = self.hparams
        binner = QuantileBinner(h.max_bins, seed=h.seed).fit(train.features)
        used = binner.used_features_
        codes = binner.transform(train.features)[:, used].to(self.device)
        layout = QueryLayout(train.labels, train.sizes, None, self.device)
        bias = self.objective.init_score(train.labels, None)
        if self.ensemble is None or self.ensemble.n_trees == 0:
            self.ensemble = self._empty_ensemble(train.n_features, 0, bias).to(self.device)
        # Resumed from a checkpoint: the scores of the trees already grown.
        with torch.no_grad():
            scores = self.ensemble(train.features.to(self.device)).double()
        self._state = {
            "grower": ObliviousTreeGrower(codes, _valid_codes(binner)[used], self.params),
            "layout": layout, "scores": scores, "used": used.to(self.device),
            "thresholds": binner.thresholds().to(self.device), "sizes": train.sizes,
            "generator": torch.Generator().manual_seed(h.seed + 100_003 * self.current_epoch),
        }

    # -- one round per epoch ---------------------------------------------------------------------
    def training_step(self, batch: PaddedBatch, batch_idx: int) -> None:
        if batch_idx != 0:
            return None
        s = self._state
        grad, hess = self.objective.gradients(s["scores"], s["layout"])
        h = self.hparams
        rows, features = sample_round(s["generator"], s["sizes"], len(s["used"]), h.subsample, h.colsample,
                                      self.device)
        tree = grow_round(s["grower"], grad, hess, rows=rows, features=features, sizes=s["sizes"],
                          generator=s["generator"], bagging_temperature=h.bagging_temperature,
                          random_strength=h.random_strength,
                          model_length=self.ensemble.n_trees * h.learning_rate,
                          leaf_hessian=self._leaf_hessian if h.exact_newton else None)
        s["scores"] += tree.leaf_values[tree.leaf_index]
        self._append(tree, s)
        self.optimizers().step()  # counts the round as a step (global_step)
        self.log("train/gain", float(tree.gains.sum()), prog_bar=True, on_step=False, on_epoch=True,
                 batch_size=1)
        return None

    def _leaf_hessian(self, leaf: torch.Tensor) -> torch.Tensor:
        s = self._state
        return self.objective.gradients(s["scores"], s["layout"], groups=leaf)[1]

    def _append(self, tree, s) -> None:
        e = self.ensemble
        f_raw = s["used"][tree.features]
        split = tree.codes < N_CODES - 1
        thr = s["thresholds"]
        t = torch.where(split, thr[f_raw, tree.codes.clamp(max=thr.shape[1] - 1)], torch.inf)
        new = ObliviousEnsemble(e.n_features, torch.cat([e.features, f_raw[None]]),
                                torch.cat([e.thresholds, t[None].float()]),
                                torch.cat([e.leaf_values, tree.leaf_values[None].float()]),
                                float(e.bias))
        self.ensemble = new.to(self.device)

    def configure_optimizers(self):
        # A no-op optimizer (lr 0 on an empty parameter): the trees are grown by Newton steps.
        return torch.optim.SGD([self._round_marker], lr=0.0)

    # -- inference and evaluation -----------------------------------------------------------------
    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """features [..., F] -> scores [...] (inference only)."""
        return self.ensemble(features.reshape(-1, features.shape[-1])).reshape(features.shape[:-1])

    def _evaluate(self, batch: PaddedBatch, metrics) -> None:
        scores = self(batch.features)
        metrics.update(scores, batch.labels, batch.mask)
        self.log_dict(metrics, on_step=False, on_epoch=True, batch_size=len(batch.labels))

    def validation_step(self, batch: PaddedBatch, batch_idx: int) -> None:
        self._evaluate(batch, self.val_metrics)

    def test_step(self, batch: PaddedBatch, batch_idx: int) -> None:
        self._evaluate(batch, self.test_metrics)

    def predict_step(self, batch: PaddedBatch, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        """Scores of the real documents of the batch, flat in (query, position) order."""
        return self(batch.features)[batch.mask]

    # -- checkpoints: the ensemble's buffers change shape every epoch --------------------------------
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint["state_dict"]
        feats = state["ensemble.features"]
        n_features = int(checkpoint.get("rankkit_n_features", 0)) or None
        self.ensemble = self._empty_ensemble(n_features or 1, feats.shape[0])
        self.ensemble.n_features = n_features or self.ensemble.n_features

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["rankkit_n_features"] = self.ensemble.n_features if self.ensemble is not None else 0
