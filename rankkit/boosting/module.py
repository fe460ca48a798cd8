"""LambdaMART as a LightningModule: each epoch grows one tree.

The module drives the same :class:`~rankkit.boosting.engine.BoostingEngine` as the
scikit-learn estimator, so ``Trainer.fit`` and ``LambdaMART.fit`` grow the same trees. It takes
its training data from its DataLoader: a boosting round needs the whole training set at once,
so the module asks for it (``train_batching = "dataset"``) and
:class:`~rankkit.training.datamodule.RankingDataModule` then yields the training
:class:`~rankkit.data.dataset.RankingDataset` as the one item of every epoch (nothing is
padded). Validation scores padded batches with the ensemble and logs the same metrics as the
neural modules (``val/ndcg@1``, ``@3``, ``@5``, ``@10`` and ``val/map``), so Lightning's
EarlyStopping and ModelCheckpoint on ``val/ndcg@10`` work as usual.

Trees are Newton steps, not gradient steps, so the module has no real optimizer:
``configure_optimizers`` returns a :class:`RoundCounter`, an optimizer whose ``step`` does
nothing, and each round steps it once, which is what moves ``global_step`` (the counter
ModelCheckpoint and loggers key on). (Returning None would do the same through Lightning's
placeholder, with a warning on every fit.)
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any, Callable

import pytorch_lightning as pl
import torch

from rankkit.infra import checks as _checks, quiet as _quiet, threads as _threads
from rankkit.infra.params import check_all, declared, hyperparameter, with_args
from rankkit.infra.checkpoint import guard_trainer_restore, guarded_load_from_checkpoint, record_class
from rankkit.boosting.config import BoosterConfig
from rankkit.boosting.engine import BoostingEngine
from rankkit.boosting.ensemble import ObliviousEnsemble
from rankkit.clicks.metrics import ClickLikelihood
from rankkit.custom import qualified_name
from rankkit.data.dataset import PaddedBatch, RankingDataset
from rankkit.metrics import ranking_metrics
from rankkit.clicks.propensity import PositionIds

class RoundCounter(torch.optim.Optimizer):
    """The optimizer of a module whose parameters are set by something else (the boosting
    engine): ``step`` only calls the closure; Lightning counts each call as a training step.
    It holds one empty placeholder tensor (an optimizer needs a parameter) and no state, so its
    ``state_dict`` is empty, as that of the placeholder checkpoints written before it was."""

    def __init__(self):
        super().__init__([torch.zeros(0)], {})

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            with torch.enable_grad():
                return closure()
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        return None

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state_dict: dict) -> None:
        return None


@dataclass(frozen=True)
class ModuleOptions:
    """The module's hyper-parameters beyond the run's (:class:`BoosterConfig`)."""

    n_features: int | None = hyperparameter(None, """
        the feature count the training data must have (linked from the datamodule by
        ``rankkit fit``), None to take the data's.""", check=partial(_checks.check_int, none=True))


if TYPE_CHECKING:  # Python callers may pass a custom objective itself, which a type checker should accept ...
    ModuleObjective = str | Callable[..., Any]
else:  # ... while the command line reads the annotation: text only, imported when training starts
    ModuleObjective = str


#: The module's hyper-parameters: the run's that a Lightning fit uses, and its own. A config names
#: ``objective`` as text (a custom objective's "package.module.function", imported when training
#: starts): the command line parses it as a string, never as a class to build.
PARAMS = [replace(p, annotation=str) if p.name == "objective" else p
          for p in declared(BoosterConfig) if p.module] + declared(ModuleOptions)


class LambdaMARTModule(pl.LightningModule):
    """Boosted oblivious trees trained by ``Trainer.fit``, one tree per epoch.

    The epochs play ``n_estimators``, Lightning's EarlyStopping plays ``early_stopping_rounds``.
    The hyper-parameters and checkpoints record a custom ``objective`` by its qualified name as
    text, so a checkpoint loads (to test, predict, export) without it.

    Args:
        {params}

    Attributes:
        scorer: the :class:`ObliviousEnsemble` grown so far (raw features [N, F] -> scores
            [N]); what evaluation and export use.
    """

    #: Tells :class:`~rankkit.training.datamodule.RankingDataModule` to yield the whole training set.
    train_batching = "dataset"
    #: The model's name in tables (``rankkit compare``).
    label = "LambdaMART"
    #: Lightning's loader behind rankkit's checks (a local file, weights_only, allow-listed sizes).
    load_from_checkpoint = classmethod(guarded_load_from_checkpoint)

    # Written out: PARAMS in order (tests/infra/test_params.py compares them). Lightning's
    # save_hyperparameters reads them from this frame, which names its class by the cell below.
    def __init__(self, objective: ModuleObjective = "lambdarank", *, hessian: str = "exact", depth: int = 6,
                 learning_rate: float = 0.1, l2: float = 1.0, min_data_in_leaf: int = 20,
                 min_sum_hessian: float = 0.001, weighting: str = "ndcg", k: int | None = None, sigma: float = 1.0,
                 gain: str = "exp", normalize: bool = False, subsample: float = 1.0, colsample: float = 1.0,
                 bagging_temperature: float = 0.0, random_strength: float = 0.0, exact_newton: bool = False,
                 quantized_grad: bool = False, num_grad_quant_bins: int = 4, max_bins: int = 255, seed: int = 0,
                 unbiased: bool | str = False, bias_p: float = 1.0, n_positions: int = 10, pool_positions: bool = False,
                 position_bias_regularization: float = 0.0, propensity_clip: float | str | None = "auto",
                 n_features: int | None = None) -> None:
        __class__  # noqa: B018 -- the cell Lightning reads
        self._init(locals())

    def _init(self, params: dict) -> None:
        super().__init__()
        params = {p.name: params[p.name] for p in PARAMS}
        check_all(ModuleOptions(n_features=params["n_features"]))
        self.config = BoosterConfig.from_params(params)
        if self.config.unbiased == "auto":
            raise ValueError("`unbiased='auto'` races its candidates inside LambdaMART.fit; LambdaMARTModule trains "
                             "one: choose True, 'position' or 'ips' (docs/benchmarks.md, 'Learning from clicks'), "
                             "or fit LambdaMART(unbiased='auto') in Python")
        self.save_hyperparameters(frame=inspect.currentframe().f_back)  # the parameters of __init__
        # A custom objective (a callable) is recorded as its qualified name: a checkpoint holds
        # text, never code, and loading one never imports it (it is imported to train only).
        self.hparams["objective"] = qualified_name(params["objective"])
        self._hparams_initial["objective"] = self.hparams["objective"]  # what loggers write out
        self.automatic_optimization = False
        self.scorer: ObliviousEnsemble | None = None
        self.val_metrics = ranking_metrics(prefix="val/")
        self.test_metrics = ranking_metrics(prefix="test/")
        self._engine: BoostingEngine | None = None
        self._engine_data: RankingDataset | None = None
        self._prefix: ObliviousEnsemble | None = None  # trees from before this fit (a resume)
        self._position_ids: PositionIds | None = None  # the training log's ids (with `unbiased`)
        self._click_criterion: ClickLikelihood | None = None  # built at the first validation of a fit
        self._threads_before: int | None = None  # torch's thread count before a governed fit
        self._governor: _threads.ThreadGovernor | None = None  # the fit's, ticked by its engine

    def serving_scorer(self) -> ObliviousEnsemble:
        """The features -> scores module that export uses."""
        if self.scorer is None:
            raise ValueError("LambdaMARTModule has no trees yet: train it (Trainer.fit) or load a checkpoint")
        return self.scorer

    # -- one round per epoch ---------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        from pytorch_lightning.strategies import DDPStrategy

        strategy = self.trainer.strategy if self._trainer is not None else None
        if stage == "fit" and isinstance(strategy, DDPStrategy):
            # Data-parallel boosting (strategy="ddp"): every rank gets its shard of whole queries
            # from the datamodule and the engine all-reduces its histograms and leaf sums
            # (rankkit.boosting.distributed). There are no gradients for DistributedDataParallel
            # to average, and it refuses a module without any, so the strategy leaves the module
            # unwrapped.
            strategy._setup_model = lambda model: model
            strategy._register_ddp_hooks = lambda: None
        _quiet.hold(self)  # the logging-interval warning is moot: one batch per epoch (rankkit.infra.quiet)
        guard_trainer_restore(self)  # a ckpt_path given to the Trainer is checked before it is read

    def teardown(self, stage: str) -> None:
        _quiet.release(self)
        self._end_threads()

    def on_fit_start(self) -> None:
        self._engine = self._engine_data = self._click_criterion = None
        self._end_threads()
        # A busy machine takes threads away from the rounds, as in LambdaMART.fit (n_jobs=None);
        # the engine ticks this fit's own governor, and the count is put back when the fit ends.
        self._threads_before = torch.get_num_threads()
        self._governor = _threads.ThreadGovernor() if self._threads_before > 1 else None

    def on_fit_end(self) -> None:
        self._end_threads()

    def _end_threads(self) -> None:
        before, self._threads_before, self._governor = self._threads_before, None, None
        if before is not None and torch.get_num_threads() != before:
            torch.set_num_threads(before)

    def training_step(self, batch: RankingDataset, batch_idx: int) -> None:
        if not isinstance(batch, RankingDataset):
            raise ValueError("LambdaMARTModule trains on the whole training set at once: its train "
                             "DataLoader has to yield a RankingDataset (RankingDataModule does, since "
                             f"the module sets train_batching='dataset'), got {type(batch).__name__}")
        if self._engine is None or self._engine_data is not batch:
            self._start(batch)
        tree = self._engine.update()
        self.scorer = self._engine.to_ensemble(prefix=self._prefix).to(self.device)
        self.optimizers().step()  # counts the round as a step (global_step)
        self.log("train/gain", float(tree.gains.sum()), prog_bar=False, on_step=False, on_epoch=True,
                 batch_size=1)

    def _start(self, train: RankingDataset) -> None:
        """Bin the training set and build the engine (again after a resume: the trees already
        in ``scorer`` give the starting scores)."""
        self._prefix = self.scorer.cpu() if self.scorer is not None and self.scorer.n_trees else None
        init_scores = None
        if self._prefix is not None:
            with torch.no_grad():
                init_scores = self._prefix(train.features).double()
        self._engine = BoostingEngine(train.features, train.labels, train.sizes, self.config,
                                      device=self.device, start_round=self.current_epoch,
                                      init_scores=init_scores, positions=self._positions(train))
        self._engine.governor = self._governor
        self._engine_data = train
        self.backend_ = self._engine.backend.name  # the kernels of this fit ("cpu", "triton", "torch")
        expected = self.hparams.n_features
        if expected is not None and expected != train.n_features:
            raise ValueError(f"`n_features` is {expected}, but the training data has {train.n_features} features")
        if self._prefix is not None and self._prefix.n_features != train.n_features:
            raise ValueError(f"the checkpoint's trees take {self._prefix.n_features} features, the "
                             f"training data has {train.n_features}")

    def _positions(self, train: RankingDataset) -> torch.Tensor | None:
        """With ``unbiased``: the training click log's positions as dense indices (their ids
        mapped as LightGBM reads them, :class:`rankkit.clicks.propensity.PositionIds`)."""
        if not self.config.unbiased:
            return None
        if train.position is None:
            raise ValueError(f"`unbiased={self.config.unbiased!r}` trains on a click log: the training data has no "
                             f"positions (RankingDataModule(click_log=True) reads each file's .position sidecar)")
        c = self.config
        ids, dense = PositionIds.dense(train.position, "the training data's position", n_positions=c.n_positions,
                                       pool=c.pool_positions)
        self.position_ids_ = ids.ids.numpy().copy()
        self._position_ids = ids
        return dense

    def configure_optimizers(self) -> RoundCounter:
        return RoundCounter()  # Newton steps: no optimizer to speak of (see the module docstring)

    # -- inference and evaluation -----------------------------------------------------------------
    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """features [..., F] -> scores [...] (inference only)."""
        scorer = self.serving_scorer()
        return scorer(features.reshape(-1, features.shape[-1])).reshape(features.shape[:-1])

    def _evaluate(self, batch: PaddedBatch, metrics) -> None:
        metrics.update(self(batch.features), batch.labels, batch.mask)
        for name, metric in metrics.items():  # NDCG@10, the selection metric, on the progress bar
            self.log(name, metric, on_step=False, on_epoch=True, prog_bar=name.endswith("/ndcg@10"),
                     batch_size=len(batch.labels))

    def validation_step(self, batch: PaddedBatch, batch_idx: int) -> None:
        if self.scorer is not None:
            self._evaluate(batch, self.val_metrics)

    def on_validation_epoch_end(self) -> None:
        """Trained on a click log (``unbiased``) with a validation click log (its ``.position``
        sidecar): log ``val/click_likelihood``, how well the trees explain the validation clicks
        with a free offset per displayed position (:class:`rankkit.clicks.metrics.ClickLikelihood`,
        ``LambdaMART(unbiased="auto")``'s criterion; higher is better). The validation clicks'
        own ``val/ndcg@10`` carries their position bias; this does not. About 0.3 s per
        validation on 60,000 shown rows: ``trainer.check_val_every_n_epoch`` thins it."""
        if self.scorer is None or self.trainer.sanity_checking:
            return
        criterion = self._click_criterion or self._build_click_criterion()
        if criterion is not None:
            scorer = self.scorer
            with torch.no_grad():
                value = criterion(lambda f: scorer(f.to(self.device)).double().cpu())
            self.log("val/click_likelihood", value, prog_bar=True)

    def _build_click_criterion(self) -> ClickLikelihood | None:
        """The validation click log as a :class:`ClickLikelihood`, its positions read through the
        training log's ids; None without ``unbiased`` or without validation positions."""
        datamodule = getattr(self.trainer, "datamodule", None)
        val = getattr(datamodule, "val_set", None)
        if not self.config.unbiased or self._position_ids is None or val is None or val.position is None:
            return None
        position = self._position_ids.index(val.position, "the validation data's position")
        self._click_criterion = ClickLikelihood(val.features, val.labels.double(), val.sizes, position,
                                                n_positions=self.config.n_positions)
        return self._click_criterion

    def test_step(self, batch: PaddedBatch, batch_idx: int) -> None:
        self._evaluate(batch, self.test_metrics)

    def predict_step(self, batch: PaddedBatch, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        """Scores of the real documents of the batch, flat in (query, position) order."""
        return self(batch.features)[batch.mask]

    # -- checkpoints: the ensemble's buffers change shape every epoch --------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        record_class(checkpoint, self)
        checkpoint["rankkit_n_features"] = self.scorer.n_features if self.scorer is not None else 0

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint["state_dict"]
        if "scorer.features" not in state:
            raise ValueError("the checkpoint holds no trees (no `scorer.*` tensors)")
        n_trees, depth = state["scorer.features"].shape
        n_features = int(checkpoint.get("rankkit_n_features", 0))
        if n_features < 1:
            raise ValueError("the checkpoint does not record the feature count (`rankkit_n_features`)")
        self.scorer = ObliviousEnsemble(n_features, torch.zeros(n_trees, depth, dtype=torch.long),
                                        torch.full((n_trees, depth), torch.inf), torch.zeros(n_trees, 1 << depth))


LambdaMARTModule.__doc__ = with_args(LambdaMARTModule.__doc__, PARAMS)
