"""The comparison protocol: every model on the same folds, seeds, metrics and model selection.

Each model is configured by its YAML under ``configs/`` exactly as ``rankkit fit --config``
would configure it (the same LightningCLI), trained by ``Trainer.fit`` with the config's
EarlyStopping and ModelCheckpoint on vali NDCG@10, and the best checkpoint is scored on the
test set with :mod:`rankkit.metrics` (exp gain, a query with nothing relevant scores 1 for
NDCG and MAP; ERR@10 uses the data set's top label). The best model is exported as TorchScript,
reloaded and checked against its eager scores on the test features.

With ``baselines``, LightGBM (lambdarank), XGBoost (rank:ndcg) and CatBoost (YetiRank, and
LambdaMart: CatBoost's oblivious trees on lambda gradients, the closest relative of rankkit's
booster), where installed, train on the same folds with their library defaults, the round cap and
patience of the LambdaMART config compared (the packaged one's when none is), and early stopping on the
same vali NDCG@10 code.

Writes ``OUT/metrics.json``, ``OUT/table.md``, ``OUT/val_ndcg10.png``, ``OUT/test_ndcg.png``
and ``OUT/scorers/<model>-fold<f>-seed<s>.pt``.

A model may be an ensemble of configs (a YAML file ``ensemble: [a.yaml, b.yaml, ...]``, paths
beside it; ``rankkit tune --top_k K`` writes one of its K best trials): each fold and seed trains
every member and tests the mean of their best scorers (:class:`rankkit.neural.MeanEnsemble`), one
row ``<model>-top<K>``, exported and verified as one scorer.
"""
from __future__ import annotations

import contextlib
import datetime
import importlib.util
import json
import logging
import math
import os
import platform
import re
import statistics
import sys
import tempfile
import time
import warnings
from functools import partial
from pathlib import Path
from typing import Callable

import torch
import yaml

from rankkit.compare import baselines as third_party
from rankkit.compare.plots import plot
from rankkit.data.dataset import RankingDataset, pad
from rankkit.export import export_torchscript, load_scorer, unwrap
from rankkit.infra import yaml as _yaml
from rankkit.infra.io import atomic_write, check_outputs, first_repeat
from rankkit.infra.quiet import verbose, verbose_scope
from rankkit.metrics import average_precision, err, ndcg
from rankkit.neural import MeanEnsemble
from rankkit.serving import as_scorer, score_queries
from rankkit.training.datamodule import RankingDataModule, available_folds, data_folds, parse_folds
from rankkit.training.lightning_cli import best_checkpoint, lightning_cli
from rankkit.training.run_config import CONFIG_DIR, quiet_lightning_logs, resolve_model_class
from rankkit.tune import tune as run_study

MODELS = ("ranknet", "lambdarank", "lambdamart")
KS = (1, 3, 5, 10)
METRICS = tuple(f"ndcg@{k}" for k in KS) + ("map", "err@10")
# Round cap and patience of a config whose trainer does not say (see baseline_protocol for the
# baselines').
DEFAULT_ROUNDS, DEFAULT_PATIENCE = 300, 30


# -- inputs ---------------------------------------------------------------------------------------
def resolve_config(model: str) -> Path:
    """A model name (``lambdarank``) -> ``configs/lambdarank.yaml``, or a YAML path as given."""
    path = Path(model)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise FileNotFoundError(f"no such model config: {model}")
        return path
    path = CONFIG_DIR / f"{model}.yaml"
    if not path.is_file():
        raise ValueError(f"unknown model {model!r}: give one of {MODELS} or a config .yaml path")
    return path


def model_class(config: dict) -> type:
    """The LightningModule class a config trains (its ``model.class_path``, resolved)."""
    return resolve_model_class(config.get("model", {}).get("class_path", ""))


def model_label(config: dict) -> str:
    """The row name of the table: the model's ``label`` (``LambdaRank``, ``LambdaMART``)."""
    cls = model_class(config)
    return getattr(cls, "label", cls.__name__)


def model_kind(config: dict) -> str:
    """``"trees"`` when the model trains on the whole data set per epoch (one tree), else ``"neural"``."""
    return "trees" if getattr(model_class(config), "train_batching", "padded") == "dataset" else "neural"


def baseline_protocol(configs: list[dict]) -> tuple[int, int]:
    """The baselines' (round cap, patience): a LambdaMART config's among ``configs``, else the
    packaged ``lambdamart.yaml``'s, so a baseline gets the same rounds whatever neural models
    it is compared with."""
    trees = [c for c in configs if model_kind(c) == "trees"]
    if not trees:
        trees = [_yaml.safe_load(_yaml.read_text(CONFIG_DIR / "lambdamart.yaml"), "lambdamart.yaml")]
    return early_stopping_of(trees[-1])


def early_stopping_of(config: dict) -> tuple[int, int]:
    """(max epochs or trees, EarlyStopping patience) of a model config."""
    trainer = config.get("trainer", {})
    patience = DEFAULT_PATIENCE
    for cb in trainer.get("callbacks", []) or []:
        if cb.get("class_path", "").endswith("EarlyStopping"):
            patience = int(cb.get("init_args", {}).get("patience", patience))
    return int(trainer.get("max_epochs", DEFAULT_ROUNDS)), patience


# -- evaluation: one metric code for every row ----------------------------------------------------
class Evaluator:
    """Test metrics and vali NDCG@10 of flat scores [N] on one dataset, with :mod:`rankkit.metrics`."""

    def __init__(self, dataset: RankingDataset, max_label: float):
        self.dataset = dataset
        self.max_label = max_label
        self.labels, self.mask = pad(dataset.labels, dataset.sizes)

    def _pad(self, scores) -> torch.Tensor:
        return pad(torch.as_tensor(scores, dtype=torch.float64).reshape(-1), self.dataset.sizes)[0]

    def per_query(self, scores: torch.Tensor) -> dict[str, torch.Tensor]:
        s, y, m = self._pad(scores), self.labels.double(), self.mask
        out = {f"ndcg@{k}": ndcg(s, y, mask=m, k=k) for k in KS}
        out["map"] = average_precision(s, y, mask=m)
        out["err@10"] = err(s, y, mask=m, k=10, max_label=self.max_label)
        return out

    def metrics(self, scores: torch.Tensor) -> dict[str, float]:
        return {name: float(v.mean()) for name, v in self.per_query(scores).items()}

    def ndcg10(self, scores) -> float:
        """Mean NDCG@10: the model-selection metric, the one the neural modules log as val/ndcg@10."""
        return float(ndcg(self._pad(scores), self.labels.double(), mask=self.mask, k=10).mean())


# -- the rankkit models ---------------------------------------------------------------------------
def _verbose(flag: bool | None) -> bool:
    return verbose(flag)


def _loud():
    return verbose_scope()


def _quiet():
    """Lightning's info lines and warnings off while compare prints its own progress."""
    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    stack.enter_context(quiet_lightning_logs(logging.ERROR))
    return stack


def train_model(config_path: Path, *, data: str, fold: int, seed: int, workdir: str, scorer_path: Path,
                val_fraction: float = 0.0, test_eval: Evaluator, max_epochs: int | None = None,
                keep: list | None = None) -> dict:
    """Train one config on one fold and seed; test its best checkpoint; export and verify it.
    ``keep``: a list to append the best model's serving scorer to (for a seed ensemble)."""
    import pytorch_lightning as pl

    config = _yaml.safe_load(_yaml.read_text(config_path), str(config_path))
    args = ["--config", str(config_path), f"--data.data={data}", f"--data.fold={fold}",
            f"--data.seed={seed}", f"--data.val_fraction={val_fraction}", "--data.val_seed=0",
            f"--seed_everything={seed}", "--trainer.logger=false",
            "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
            f"--trainer.default_root_dir={workdir}"]
    if "seed" in (config.get("model", {}).get("init_args") or {}):
        args.append(f"--model.init_args.seed={seed}")
    if max_epochs is not None:
        args.append(f"--trainer.max_epochs={min(max_epochs, early_stopping_of(config)[0])}")
    cli = lightning_cli(args, run=False)
    curve: list[float] = []

    class ValCurve(pl.Callback):
        def on_validation_end(self, trainer, pl_module):
            if not trainer.sanity_checking and "val/ndcg@10" in trainer.callback_metrics:
                curve.append(float(trainer.callback_metrics["val/ndcg@10"]))

    cli.trainer.callbacks.append(ValCurve())
    t0 = time.perf_counter()
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    seconds = time.perf_counter() - t0
    model, best_path = best_checkpoint(cli)
    eager, diff = _export_verified(model, scorer_path, test_eval)  # either kind of scorer, query by query
    if best_path:
        os.unlink(best_path)
    if keep is not None:
        keep.append(unwrap(model))
    # The 0-based index of the first best epoch or tree, as ModelCheckpoint's names and best_iteration_.
    best_epoch = max(range(len(curve)), key=curve.__getitem__) if curve else 0
    return {"train_seconds": seconds, "epochs": len(curve), "best_epoch": best_epoch, "val_curve": curve,
            "export_path": str(scorer_path), "export_bytes": scorer_path.stat().st_size,
            "export_max_abs_diff": diff, **test_eval.metrics(eager)}


def _export_verified(model, scorer_path: Path, test_eval: Evaluator) -> tuple[torch.Tensor, float]:
    """Eager test scores [N] of ``model`` (either kind of scorer), after exporting it as
    TorchScript to ``scorer_path`` and checking the reloaded file gives the same scores."""
    features, sizes = test_eval.dataset.features, test_eval.dataset.sizes
    eager = score_queries(as_scorer(model), features, sizes)
    export_torchscript(model, scorer_path)
    with torch.no_grad():
        exported = score_queries(as_scorer(load_scorer(scorer_path, trust_torchscript=True)), features, sizes)  # ours
    diff = float((exported - eager).abs().max())
    if not diff <= 1e-4 * (1.0 + float(eager.abs().max())):
        raise RuntimeError(f"the exported scorer {scorer_path} differs from the eager model by {diff:.3g}")
    return eager, diff


def ensemble_model(members: list, runs: list[dict], *, scorer_path: Path, test_eval: Evaluator) -> dict:
    """The seed ensemble of one model on one fold: the mean score of its seeds' best scorers
    (:class:`rankkit.neural.MeanEnsemble`), tested, exported as one TorchScript scorer and
    verified. ``runs`` are the members' rows (for the time and epoch columns)."""
    ensemble = MeanEnsemble(members).eval()
    eager, diff = _export_verified(ensemble, scorer_path, test_eval)
    return {"train_seconds": sum(r["train_seconds"] for r in runs),
            "epochs": statistics.mean(r["epochs"] for r in runs),
            "best_epoch": statistics.mean(r["best_epoch"] for r in runs), "val_curve": [],
            "export_path": str(scorer_path), "export_bytes": scorer_path.stat().st_size,
            "export_max_abs_diff": diff, **test_eval.metrics(eager)}


def train_ensemble(members: list[tuple[Path, dict]], *, workdir: str, scorer_path: Path, test_eval: Evaluator,
                   keep: list | None = None, **fit) -> dict:
    """An ensemble of configs on one fold and seed: each member trained as :func:`train_model`
    does (its export checked into ``workdir``), their best scorers averaged
    (:class:`rankkit.neural.MeanEnsemble`), tested, exported to ``scorer_path`` and verified.
    ``keep``: a list to append the averaged scorer to (for a seed ensemble)."""
    scorers: list = []
    rows = [train_model(path, workdir=os.path.join(workdir, str(i)), test_eval=test_eval, keep=scorers,
                        scorer_path=Path(workdir) / f"member{i}.pt", **fit) for i, (path, _) in enumerate(members)]
    if keep is not None:
        keep.append(MeanEnsemble(scorers).eval())
    return ensemble_model(scorers, rows, scorer_path=scorer_path, test_eval=test_eval)


# -- reporting ------------------------------------------------------------------------------------
def _mean_std(values: list[float], fmt: str = "{:.4f}") -> str:
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(statistics.mean(values))} ± {fmt.format(statistics.stdev(values))}"


def summarize(runs: list[dict]) -> dict[str, dict[str, dict[str, float]]]:
    """``{model: {metric: {"mean", "std", "n"}}}`` over folds and seeds."""
    out: dict = {}
    for model in dict.fromkeys(r["model"] for r in runs):
        mine = [r for r in runs if r["model"] == model]
        out[model] = {}
        for key in (*METRICS, "train_seconds", "epochs", "best_epoch", "export_bytes"):
            values = [r[key] for r in mine if r.get(key) is not None]
            if values:
                out[model][key] = {"mean": statistics.mean(values),
                                   "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                                   "n": len(values)}
    return out


def markdown_table(runs: list[dict]) -> str:
    """NDCG@1/3/5/10, MAP and ERR@10 as mean ± std over folds × seeds, train time, export size."""
    tuned = any("tune_seconds" in r for r in runs)
    head = ["model", "NDCG@1", "NDCG@3", "NDCG@5", "NDCG@10", "MAP", "ERR@10", "train s",
            "epochs / trees (best index)", "export KiB", *(["tune s per fold"] if tuned else [])]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for model in dict.fromkeys(r["model"] for r in runs):
        mine = [r for r in runs if r["model"] == model]
        cells = [_mean_std([r[m] for r in mine]) for m in METRICS]
        cells.append(_mean_std([r["train_seconds"] for r in mine], "{:.1f}"))
        cells.append(f"{statistics.mean(r['epochs'] for r in mine):.0f} "
                     f"({statistics.mean(r['best_epoch'] for r in mine):.0f})")
        sizes = [r["export_bytes"] for r in mine if r["export_bytes"] is not None]
        cells.append(f"{statistics.mean(sizes) / 1024:.1f}" if sizes else "–")
        if tuned:  # one study per fold, whatever the seeds
            studies = {r["fold"]: r["tune_seconds"] for r in mine if "tune_seconds" in r}
            cells.append(f"{statistics.mean(studies.values()):.0f}" if studies else "–")
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fold_table(runs: list[dict], metric: str = "ndcg@10") -> str:
    """Test ``metric`` per model and fold (mean over seeds), and the mean ± std over the folds'
    runs: how much of the spread is the data split."""
    folds = list(dict.fromkeys(r["fold"] for r in runs))
    head = ["model", *(f"fold {f}" for f in folds), "all"]
    lines = [f"Test {metric.upper()} per fold:", "", "| " + " | ".join(head) + " |",
             "|---|" + "---:|" * (len(head) - 1)]
    for model in dict.fromkeys(r["model"] for r in runs):
        mine = [r for r in runs if r["model"] == model]
        cells = [_mean_std([r[metric] for r in mine if r["fold"] == f]) if any(r["fold"] == f for r in mine)
                 else "–" for f in folds]
        lines.append(f"| {model} | " + " | ".join(cells) + f" | {_mean_std([r[metric] for r in mine])} |")
    return "\n".join(lines)


# -- the run --------------------------------------------------------------------------------------
def load_fold(data: str, fold: int, val_fraction: float = 0.0) -> tuple[RankingDataset, RankingDataset,
                                                                      RankingDataset]:
    dm = RankingDataModule(data=data, fold=fold, val_fraction=val_fraction, val_seed=0)
    dm.setup()
    if dm.test_set is None:
        raise ValueError(f"{data}: compare needs a test file (test.txt or rank.test)")
    if dm.val_set is None:
        raise ValueError(f"{data}: compare selects models on a validation file (vali.txt or rank.vali); "
                         f"--val_fraction 0.1 holds out training queries instead")
    return dm.train_set, dm.val_set, dm.test_set


def compare(*, data: str = "mq2008", folds: str | int = "1", seeds: int = 1,
            models: list[str] | str = MODELS, baselines: bool = False, out: str | None = None,
            max_epochs: int | None = None, log: Callable[[str], None] = print, verbose: bool | None = None,
            ensemble: bool = False, val_fraction: float = 0.0, tune: int = 0, tune_seeds: int = 1,
            tune_confirm: int = 0, tune_margin: float = 0.0) -> dict:
    """Run the comparison and write ``out``; returns the content of ``metrics.json``.

    Args:
        data: ``"mq2008"`` (bundled) or a folder of train/vali/test LETOR files.
        folds: ``"1-5"``, ``"1,3"`` or ``2``: MQ2008's folds, or a LETOR root's ``Fold<n>``
            folders (a plain folder is one fold).
        seeds: seeds 0..seeds-1 per fold.
        models: model names (``ranknet``, ``lambdarank``, ``lambdamart``), config paths, or
            ensemble files (``ensemble:`` a list of configs, as ``rankkit tune --top_k`` writes).
        baselines: also train LightGBM, XGBoost and CatBoost (YetiRank and LambdaMart) where
            installed.
        out: the output folder (default ``results/compare-<time>``).
        max_epochs: cap every model's epochs (trees) and the baselines' rounds (quick runs).
        verbose: let Lightning's info lines and warnings through (quiet by default); None
            reads the environment variable ``RANKKIT_VERBOSE`` (``1`` to see everything).
        ensemble: with ``seeds`` > 1, also average each rankkit model's seeds on every fold into
            one scorer (:class:`rankkit.neural.MeanEnsemble`, the mean of the seeds' scores; the
            seed ensembling of Qin et al.'s DASALC, ICLR 2021): a row ``<model> ×<seeds>`` per
            fold, tested with the same metric code and exported as one verified TorchScript
            scorer ``scorers/<model>-fold<f>-ensemble.pt``. Its time column is the members' sum.
        val_fraction: for data without a validation file, hold out this fraction of the training
            queries (the same queries for every model and seed) for model selection.
        tune: nested tuning: before a fold's seeds, an Optuna study of ``tune`` trials per rankkit
            model on that fold's train and vali splits (:func:`rankkit.tune.tune` with the config's
            search space, seed 0), whose best config the seeds then train and test once. The
            studies land in ``out/tune/<model>-fold<f>/``; their wall time is each run's
            ``tune_seconds`` and a column of the table. 0 trains the configs as they are.
        tune_seeds: with ``tune``, score each trial by the mean of that many seeds' fits.
        tune_confirm: with ``tune``, refit each study's best trial and the untuned config with
            that many fresh seeds and keep the best only if it wins there (``rankkit tune
            --confirm``); 0: no refits.
        tune_margin: with ``tune``, the standard errors the best trial has to win by (``rankkit
            tune --margin``).
    """
    if isinstance(models, str):
        models = [m.strip() for m in models.split(",") if m.strip()]
    fold_list = _check_run(data=data, folds=folds, seeds=seeds, models=models, baselines=baselines,
                           ensemble=ensemble, max_epochs=max_epochs, tune=tune, tune_seeds=tune_seeds,
                           tune_confirm=tune_confirm, tune_margin=tune_margin)
    tuning = {"trials": tune, "trial_seeds": tune_seeds, "confirm": tune_confirm, "margin": tune_margin}
    configs = _model_configs(models)
    for path, cfg in configs.values() if tune else ():
        if "ensemble" in cfg:
            raise ValueError(f"`tune`: {path} is an ensemble of configs; nested tuning tunes one model config "
                             f"(tune each with rankkit tune, or leave out --tune)")
    rounds, patience = baseline_protocol(model_configs_of(configs))
    if max_epochs is not None:
        rounds = min(rounds, max_epochs)
    chosen = []
    if baselines:
        for name in third_party.BASELINES:
            if importlib.util.find_spec(third_party.BASELINE_PACKAGES[name]) is None:
                log(f"baseline {name}: not installed, skipped (pip install 'rankkit[baselines]', or "
                    f"make test EXTRAS=dev,notebooks,baselines, installs LightGBM, XGBoost and CatBoost)")
            else:
                chosen.append(name)
    out_dir = Path(out or f"results/compare-{datetime.datetime.now():%Y%m%d-%H%M%S}")
    _check_outputs(out_dir, list(configs), fold_list, seeds, ensemble,
                   inputs={"--data": _data_files(data), "--models": _config_files(configs)})
    created = [p for p in (out_dir, out_dir / "scorers") if not p.exists()]
    (out_dir / "scorers").mkdir(parents=True, exist_ok=True)
    try:
        return _compare_run(data=data, configs=configs, chosen=chosen, fold_list=fold_list, seeds=seeds,
                            out_dir=out_dir, val_fraction=val_fraction, max_epochs=max_epochs, ensemble=ensemble,
                            rounds=rounds, patience=patience, verbose=verbose, log=log, tuning=tuning)
    except BaseException:
        for folder in reversed(created):  # a failed run leaves no empty folders behind
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty
        raise


def _check_run(*, data, folds, seeds, models, baselines, ensemble, max_epochs, tune, tune_seeds, tune_confirm=0,
               tune_margin=0.0) -> list[int]:
    """The folds to run, after refusing every bad argument of :func:`compare`."""
    if not models and not baselines:
        raise ValueError("`models` is empty and `baselines` is off: nothing to compare")
    fold_list = parse_folds(folds, data_folds(data))  # data_folds refuses a `data` that is no folder
    if not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"`seeds` has to be a positive integer, got {seeds!r}")
    if ensemble and seeds < 2:
        raise ValueError(f"`ensemble` averages several seeds' scorers: it needs `seeds` >= 2, got {seeds!r}")
    if max_epochs is not None and max_epochs < 1:
        raise ValueError(f"`max_epochs` has to be a positive integer or None, got {max_epochs!r}")
    if isinstance(tune, bool) or not isinstance(tune, int) or tune < 0:
        raise ValueError(f"`tune` has to be a whole number of trials (0: no tuning), got {tune!r}")
    if isinstance(tune_seeds, bool) or not isinstance(tune_seeds, int) or tune_seeds < 1:
        raise ValueError(f"`tune_seeds` has to be a positive whole number, got {tune_seeds!r}")
    if isinstance(tune_confirm, bool) or not isinstance(tune_confirm, int) or tune_confirm < 0:
        raise ValueError(f"`tune_confirm` has to be a whole number of seeds (0: no refits), got {tune_confirm!r}")
    if isinstance(tune_margin, bool) or not isinstance(tune_margin, (int, float)) or not 0 <= tune_margin < math.inf:
        raise ValueError(f"`tune_margin` has to be a number of standard errors >= 0, got {tune_margin!r}")
    return fold_list


def _model_configs(models: list[str]) -> dict[str, tuple[Path, dict]]:
    """{row label: (config path, config)} of ``models`` (names or paths); a second config of the
    same model gets its own row, named by its file. An ensemble file (``ensemble:`` a list of
    model configs, as ``rankkit tune --top_k`` writes) is one row, ``<model>-top<K>``, its config
    ``{"ensemble": [(member path, member config), ...]}``."""
    configs: dict[str, tuple[Path, dict]] = {}
    for m in models:
        path = resolve_config(m)
        cfg = _read_config(path, ensemble_ok=True)
        if "ensemble" in cfg:
            cfg = {"ensemble": [(p, _read_config(p)) for p in ensemble_members(path, cfg)]}
        label = row_label(cfg)
        for other_path, other_cfg in configs.values():
            if os.path.realpath(other_path) == os.path.realpath(path):
                raise ValueError(f"`models` names the config {path} twice ({m!r})")
            if row_label(other_cfg) == label and path.stem == other_path.stem:
                raise ValueError(f"`models`: {other_path} and {path} both train {label} from a config named "
                                 f"{path.stem!r}; rename one (the table names a second config of a model by its file)")
        if label in configs:  # a second config of the same model: its own row, named by its file
            label = f"{label}-{path.stem}"
        if label in configs:  # that name is another row's (an ensemble's `<model>-top<K>`, say)
            raise ValueError(f"`models`: {path} would be the row {label!r}, which {configs[label][0]} already is; "
                             f"rename one")
        configs[label] = (path, cfg)
    return configs


def _read_config(path: Path, *, ensemble_ok: bool = False) -> dict:
    """The model config at ``path`` (or, where ``ensemble_ok``, an ensemble file), read and checked."""
    try:
        cfg = _yaml.safe_load(_yaml.read_text(path), str(path)) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not a readable YAML model config ({' '.join(str(e).split())})") from None
    if ensemble_ok and isinstance(cfg, dict) and "ensemble" in cfg and "model" not in cfg:
        return cfg
    if not isinstance(cfg, dict) or not isinstance(cfg.get("model"), dict):
        raise ValueError(f"{path}: not a model config (no `model:` section with a class_path)")
    return cfg


def ensemble_members(path: Path, cfg: dict) -> list[Path]:
    """The member configs an ensemble file ``path`` names (``ensemble:``, paths relative to its
    folder): a non-empty list of distinct existing YAML files; ValueError naming the first bad one."""
    names = cfg.get("ensemble")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{path}: `ensemble` has to be a non-empty list of model config paths, got {names!r}")
    members = [path.parent / name for name in names]
    for i, (name, member) in enumerate(zip(names, members)):
        if not member.is_file() or member.suffix not in (".yaml", ".yml"):
            raise ValueError(f"{path}: `ensemble`[{i}] {name!r} is not a YAML file beside it ({member})")
        if first_repeat(members[:i + 1]) == i:
            raise ValueError(f"{path}: `ensemble`[{i}] {name!r} is named twice")
    return members


def row_label(cfg: dict) -> str:
    """The table's row for a config: its model's label, or for an ensemble its members' label(s)
    and their count (``LambdaMART-top3``)."""
    if "ensemble" not in cfg:
        return model_label(cfg)
    labels = dict.fromkeys(model_label(c) for _, c in cfg["ensemble"])
    return f"{'+'.join(labels)}-top{len(cfg['ensemble'])}"


def row_kind(cfg: dict) -> str:
    """``model_kind`` of a config, or of an ensemble's members (``"mixed"`` when they differ)."""
    kinds = {model_kind(c) for _, c in cfg["ensemble"]} if "ensemble" in cfg else {model_kind(cfg)}
    return kinds.pop() if len(kinds) == 1 else "mixed"


def model_configs_of(configs: dict[str, tuple[Path, dict]]) -> list[dict]:
    """Every model config the rows train (an ensemble's members each)."""
    return [c for _, cfg in configs.values() for c in ([m for _, m in cfg["ensemble"]] if "ensemble" in cfg
                                                         else [cfg])]


def _tuned(path: Path, label: str, *, data: str, fold: int, val_fraction: float, max_epochs: int | None,
           tuning: dict, out_dir: Path, log) -> tuple[Path, float]:
    """The nested study of one model on one fold (``tuning``: its trials, trial_seeds, confirm and
    margin): (its chosen config, the study's wall seconds)."""
    overrides = {"data.data": data, "data.fold": fold, "data.val_fraction": val_fraction, "data.val_seed": 0}
    if max_epochs is not None:
        overrides["trainer.max_epochs"] = max_epochs
    t0 = time.perf_counter()
    result = run_study(path, n_trials=tuning["trials"], seed=0, out=out_dir / "tune" / f"{label.lower()}-fold{fold}",
                       overrides=overrides, folds=None, trial_seeds=tuning["trial_seeds"], confirm=tuning["confirm"],
                       margin=tuning["margin"], log=lambda line: None)  # the fold's own split: nested, never its test
    seconds = time.perf_counter() - t0
    kept = f", the untuned config kept over trial {result.study.best_trial.number}" if result.kept_untuned else ""
    log(f"{label:<20} fold {fold}: tuned, {tuning['trials']} trials in {seconds:.0f} s, vali NDCG@10 "
        f"{result.best_value:.4f}{kept}: {result.best_config}")
    return result.best_config, seconds


def _run_fold(fold: int, runs: list[dict], *, work, data, configs, chosen, seeds, out_dir, val_fraction, max_epochs,
              ensemble, rounds, patience, log, tuning) -> None:
    """Every run of one fold, appended to ``runs``: the (tuned) configs and the baselines for each
    seed, then each model's seed ensemble."""
    train, vali, test = load_fold(data, fold, val_fraction)
    max_label = max(1.0, float(train.labels.max()))
    test_eval, val_eval = Evaluator(test, max_label), Evaluator(vali, max_label)
    members: dict[str, list] = {label: [] for label in configs}
    fold_configs = {label: (path, 0.0) for label, (path, _) in configs.items()}
    for label, (path, _) in configs.items() if tuning["trials"] else ():
        fold_configs[label] = _tuned(path, label, data=data, fold=fold, val_fraction=val_fraction,
                                     max_epochs=max_epochs, tuning=tuning, out_dir=out_dir, log=log)
    for seed in range(seeds):
        for label, (_, cfg) in configs.items():
            path, tune_seconds = fold_configs[label]
            fit_row = partial(train_ensemble, cfg["ensemble"]) if "ensemble" in cfg else partial(train_model, path)
            r = fit_row(data=data, fold=fold, seed=seed, workdir=os.path.join(work, label), val_fraction=val_fraction,
                        scorer_path=out_dir / "scorers" / f"{label.lower()}-fold{fold}-seed{seed}.pt",
                        test_eval=test_eval, max_epochs=max_epochs, keep=members[label] if ensemble else None)
            tuned = {"tune_seconds": tune_seconds} if tuning["trials"] else {}
            runs.append({"model": label, "kind": row_kind(cfg), "config": str(path), "fold": fold, "seed": seed,
                         **r, **tuned})
            log(_progress_line(runs[-1]))
        for name in chosen:
            r = third_party.train_baseline(name, train, vali, test_eval, seed=seed, rounds=rounds,
                                           patience=patience, val_eval=val_eval)
            runs.append({"model": third_party.BASELINE_LABELS[name], "kind": "trees", "config": None,
                         "fold": fold, "seed": seed, **r})
            log(_progress_line(runs[-1]))
    for label, (path, cfg) in configs.items() if ensemble else ():
        mine = [r for r in runs if r["model"] == label and r["fold"] == fold]
        r = ensemble_model(members[label], mine, test_eval=test_eval,
                           scorer_path=out_dir / "scorers" / f"{label.lower()}-fold{fold}-ensemble.pt")
        runs.append({"model": f"{label} ×{seeds}", "kind": row_kind(cfg), "config": str(path),
                     "fold": fold, "seed": "ensemble", **r})
        log(_progress_line(runs[-1]))


def _compare_run(*, data, configs, chosen, fold_list, seeds, out_dir, val_fraction, max_epochs, ensemble, rounds,
                 patience, verbose, log, tuning: dict) -> dict:
    """The body of :func:`compare` once its arguments are checked and its output folder made."""
    import pytorch_lightning  # noqa: F401 - its import sets its loggers' levels: before _quiet()

    started = time.perf_counter()
    runs: list[dict] = []
    with tempfile.TemporaryDirectory() as work, (_loud() if _verbose(verbose) else _quiet()):
        for fold in fold_list:
            _run_fold(fold, runs, work=work, data=data, configs=configs, chosen=chosen, seeds=seeds,
                      out_dir=out_dir, val_fraction=val_fraction, max_epochs=max_epochs, ensemble=ensemble,
                      rounds=rounds, patience=patience, log=log, tuning=tuning)
    table = markdown_table(runs)
    if len(fold_list) > 1:
        table += "\n\n" + fold_table(runs)
    command = "rankkit compare " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["compare"] else None
    result = {
        "data": data, "folds": fold_list, "seeds": seeds, "max_epochs": max_epochs, "tune": tuning["trials"],
        **({"tuning": tuning} if tuning["trials"] else {}),
        "baseline_protocol": {"rounds": rounds, "patience": patience} if chosen else None,
        "command": command, "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "environment": {"python": platform.python_version(), "torch": torch.__version__,
                        "cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                        "threads": torch.get_num_threads()},
        "wall_seconds": time.perf_counter() - started,
        "summary": summarize(runs), "runs": runs,
    }
    _write_text(out_dir / "metrics.json", json.dumps(result, indent=1))
    _write_text(out_dir / "table.md", _table_doc(result, table))
    if importlib.util.find_spec("matplotlib") is None:
        log("matplotlib is not installed: no plots (pip install 'rankkit[notebooks]')")
        plots = []
    else:
        plots = plot(runs, out_dir, KS)
    result["table"] = table
    result["plots"] = [str(p) for p in plots]
    result["out"] = str(out_dir)
    return result


def _config_files(configs: dict[str, tuple[Path, dict]]) -> list[str]:
    """The config files compare reads (an ensemble file and its members)."""
    return [str(p) for path, cfg in configs.values() for p in [path, *(m for m, _ in cfg.get("ensemble", ()))]]


def _data_files(data: str) -> list[str]:
    """The files of a data folder and of its ``Fold<n>`` subfolders (what compare reads from):
    what compare must never write over."""
    if data == "mq2008" or not os.path.isdir(data):
        return []
    folds = set(available_folds(data))  # one listing, the datamodule's rule for a Fold folder
    folders = [data] + [os.path.join(data, name) for name in os.listdir(data)
                        if (m := re.fullmatch(r"fold(\d+)", name, re.IGNORECASE)) and int(m.group(1)) in folds]
    return [os.path.join(d, n) for d in folders for n in os.listdir(d) if os.path.isfile(os.path.join(d, n))]


def _check_outputs(out_dir: Path, labels: list[str], folds: list[int], seeds: int, ensemble: bool = False, *,
                   inputs: dict[str, list[str]]) -> None:
    """Refuse, before anything is trained or written, an output file of compare that is an input."""
    files = [out_dir / n for n in ("metrics.json", "table.md", "val_ndcg10.png", "test_ndcg.png")]
    files += [out_dir / "scorers" / f"{label.lower()}-fold{f}-{tag}.pt" for label in labels for f in folds
              for tag in [f"seed{s}" for s in range(seeds)] + (["ensemble"] if ensemble else [])]
    check_outputs({"--out": [str(p) for p in files]}, inputs, with_sidecars=False)


def _write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (a crash leaves the old file or the new one)."""
    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            f.write(text)

    atomic_write(path, write)


def _progress_line(r: dict) -> str:
    export = (f", exported {r['export_bytes'] / 1024:.1f} KiB (verified, max diff {r['export_max_abs_diff']:.1g})"
              if r["export_bytes"] is not None else "")
    unit = {"neural": "epochs", "trees": "trees"}.get(r["kind"], "epochs / trees")
    return (f"{r['model']:<20} fold {r['fold']} seed {r['seed']}: {r['epochs']} {unit} (best index {r['best_epoch']}), "
            f"{r['train_seconds']:.1f} s, test NDCG@10 {r['ndcg@10']:.4f}{export}")


def _chosen_by(tuning: dict) -> str:
    """How the nested study picked the config the seeds train: "best", or with ``confirm`` the
    best trial only if it beat the untuned config again on refits."""
    if not tuning.get("confirm"):
        return "best"
    return (f"chosen (the best trial if, refitted with {tuning['confirm']} fresh seed(s), it beat the untuned config "
            f"query by query on vali by more than {tuning.get('margin', 0):g} standard error(s), else the untuned)")


def _table_doc(result: dict, table: str) -> str:
    cmd = f"Command: `{result['command']}`. " if result["command"] else ""
    n = len(result["folds"]) * result["seeds"]
    return (f"{cmd}{result['data']}, folds {result['folds']}, {result['seeds']} seed(s): "
            f"mean ± std over {n} run(s). "
            + (f"Nested tuning: an Optuna study of {result['tune']} trials per model and fold on that fold's "
               f"train/vali (rankkit tune), its {_chosen_by(result.get('tuning') or {})} config trained by every "
               f"seed; its time is not in train s. " if result.get("tune") else "")
            + f"Test metrics of the epoch / tree with the best vali NDCG@10 "
            f"(exp gain; NDCG and MAP score a query with nothing relevant 1). "
            f"{result['environment']['cpus']} CPUs, torch {result['environment']['torch']}, "
            f"wall {result['wall_seconds']:.0f} s.\n\n{table}\n")


