"""Hyper-parameter search on Optuna: ``rankkit tune`` and :func:`tune`.

A study trains one config (any model: RankNet, LambdaRank, LambdaMART) with each trial's values,
each fit a full ``rankkit fit`` on a train split with model selection on its vali split, and
maximises the best vali value of the metric the module logs (``val/ndcg@10``): by default the
mean over every fold of the data (MQ2008's five) and two seeds, and the best trial replaces the
config only if it wins again on refits with fresh seeds (``confirm``; see :func:`tune`). What it
changes is a **search space** in YAML beside the config (``lambdarank.yaml`` ->
``lambdarank.space.yaml``; every packaged config ships one)::

    model.init_args.lr: {float: [1.0e-4, 1.0e-2], log: true}
    model.init_args.dropout: {float: [0.0, 0.3]}
    model.init_args.depth: {int: [4, 8]}
    model.init_args.hidden: {choices: [[64, 32], [128, 64]]}

each key a dotted path into the config, each value one of ``float: [low, high]``, ``int: [low,
high]`` (with ``log: true`` and ``step:`` as Optuna's ``suggest_float`` / ``suggest_int``) or
``choices: [...]`` (any YAML values, lists too). The config's own value of every key has to lie in
the space: the study's first trial is the config as it is (enqueued), so the best trial is never
below the untuned config on vali.

* **Pruning**: every epoch (a tree for LambdaMART) reports the vali value to Optuna; a trial below
  the median of the earlier trials at the same epoch stops (``MedianPruner``: not in the first 5
  trials or the first 5 epochs), as LightGBM users prune with Optuna's callbacks.
* **Budget**: ``n_trials`` is the study's total (a resumed study runs what is left) and
  ``timeout`` the seconds this call may start trials in; TPE (Bergstra et al., "Algorithms for
  Hyper-Parameter Optimization", NeurIPS 2011) draws the values, seeded.
* **Storage**: a local SQLite file (``OUT/study.db``); the same command again resumes the study,
  with new draws (the sampler is seeded by ``seed`` and the trials the study holds). A trial an
  interrupted run left running is marked failed, not counted, and its values run again.
* **Outputs** in ``OUT``: ``best.yaml`` (the config with the best values, which ``rankkit fit
  --config`` and ``rankkit compare --models`` take unchanged), ``trials.md`` and ``trials.json``
  (every trial: state, value, best epoch, seconds, values; ``trials.md`` adds each parameter's
  fANOVA importance), ``history.png`` (Optuna's optimisation history, with matplotlib); with
  ``top_k`` K > 1, ``top/1.yaml`` ... ``top/K.yaml`` (the K best trials' configs) and
  ``ensemble.yaml`` naming them, which ``rankkit compare --models`` trains as one averaged scorer.
* **Confirmation** (``confirm`` N): the best trial and the untuned config refitted with N fresh
  seeds, the best kept only if it wins again, query by query on vali, beyond ``margin`` standard
  errors (:func:`confirm_trial`); a study's best value is the largest of many noisy ones.
* **Never the test split**: trials fit and validate only; the data module reads the test split on
  first use, which a study never makes.
"""
from __future__ import annotations

import copy
import datetime
import json
import math
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rankkit.infra import yaml as _yaml
from rankkit.infra.io import atomic_write, check_outputs
from rankkit.training.run_config import quiet_lightning_logs, resolve_config_arg, resolve_model_class

__all__ = ["Param", "TuneResult", "apply_values", "load_space", "parse_overrides", "space_path", "tune"]

METRIC = "val/ndcg@10"
CONFIRM = 3  #: the default ``confirm``: fresh seeds the best trial is refitted with


@dataclass(frozen=True)
class Param:
    """One dimension of a search space: ``kind`` is ``float``, ``int`` or ``choices``."""

    name: str
    kind: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple = ()

    def suggest(self, trial) -> Any:
        if self.kind == "float":
            return trial.suggest_float(self.name, self.low, self.high, log=self.log, step=self.step)
        if self.kind == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        # Optuna's categorical values are scalars: lists and mappings travel as their JSON text.
        picked = trial.suggest_categorical(self.name, [_encode(c) for c in self.choices])
        return _decode(picked)

    def encode(self, value: Any) -> Any:
        """``value`` as this parameter's Optuna value (for enqueuing the untuned config)."""
        return _encode(value) if self.kind == "choices" else value

    def contains(self, value: Any) -> bool:
        if self.kind == "choices":
            return _encode(value) in [_encode(c) for c in self.choices]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.kind == "int" and value != int(value):
            return False
        return self.low <= value <= self.high


def _encode(value: Any) -> Any:
    return value if value is None or isinstance(value, (bool, int, float, str)) else json.dumps(value)


def _decode(value: Any) -> Any:
    if isinstance(value, str) and value[:1] in "[{":
        return json.loads(value)
    return value


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{what} has to be a finite number, got {value!r}")
    return value


def load_space(path: str | os.PathLike) -> dict[str, Param]:
    """Read and check a search-space YAML file (see the module's text for its form)."""
    path = Path(path)
    raw = _yaml.safe_load(_yaml.read_text(path), str(path))
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"{path}: a search space is a mapping of config keys to ranges, got {type(raw).__name__}")
    space = {}
    for name, spec in raw.items():
        where = f"{path}: `{name}`"
        if not isinstance(name, str) or not name.replace("_", "").replace(".", "").replace("-", "").isalnum():
            raise ValueError(f"{where}: a key is a dotted config path such as model.init_args.lr")
        if not isinstance(spec, dict):
            raise ValueError(f"{where}: give {{float: [low, high]}}, {{int: [low, high]}} or {{choices: [...]}}")
        kinds = [k for k in ("float", "int", "choices") if k in spec]
        unknown = set(spec) - {"float", "int", "choices", "log", "step"}
        if len(kinds) != 1 or unknown:
            raise ValueError(f"{where}: exactly one of float, int, choices (and log, step), got {sorted(spec)}")
        kind = kinds[0]
        if kind == "choices":
            choices = spec["choices"]
            if not isinstance(choices, list) or not choices:
                raise ValueError(f"{where}: choices has to be a non-empty list")
            space[name] = Param(name, "choices", choices=tuple(choices))
            continue
        bounds = spec[kind]
        if not isinstance(bounds, list) or len(bounds) != 2:
            raise ValueError(f"{where}: {kind} takes [low, high], got {bounds!r}")
        low, high = (_number(b, f"{where}: {kind} bound") for b in bounds)
        log = spec.get("log", False)
        if not isinstance(log, bool):
            raise ValueError(f"{where}: log has to be true or false, got {log!r}")
        if not low < high or (log and low <= 0):
            raise ValueError(f"{where}: needs low < high{' and low > 0 with log' if log else ''}, got {bounds}")
        step = spec.get("step")
        if step is not None and (_number(step, f"{where}: step") <= 0 or log):
            raise ValueError(f"{where}: step has to be positive and cannot go with log")
        if kind == "int" and (low != int(low) or high != int(high)):
            raise ValueError(f"{where}: int bounds have to be whole numbers, got {bounds}")
        space[name] = Param(name, kind, low, high, log, step)
    return space


def space_path(config_path: str | os.PathLike) -> Path:
    """The search space beside a config: ``lambdarank.yaml`` -> ``lambdarank.space.yaml``."""
    p = Path(config_path)
    return p.with_name(p.name[: -len(p.suffix)] + ".space" + p.suffix)


def _get(config: dict, dotted: str) -> Any:
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def apply_values(config: dict, values: dict[str, Any]) -> dict:
    """A copy of ``config`` with each dotted key of ``values`` set (``model.init_args.lr``)."""
    out = copy.deepcopy(config)
    for dotted, value in values.items():
        parts = dotted.split(".")
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"`{dotted}`: {part} is not a mapping in the config")
        node[parts[-1]] = value
    return out


def _class_defaults(config: dict) -> dict[str, Any]:
    """The defaults of what a config leaves out: the model class's (``model.init_args.*``),
    Lightning's ``Trainer``'s (``trainer.*``) and the data module's (``data.*``)."""
    import inspect

    import pytorch_lightning as pl

    from rankkit.training.datamodule import RankingDataModule

    def defaults(cls, prefix):
        params = inspect.signature(cls.__init__).parameters
        return {f"{prefix}.{n}": p.default for n, p in params.items() if p.default is not inspect.Parameter.empty}

    class_path = (config.get("model") or {}).get("class_path")
    model = defaults(resolve_model_class(class_path), "model.init_args") if class_path else {}
    return {**defaults(pl.Trainer, "trainer"), **defaults(RankingDataModule, "data"), **model}


def untuned_values(config: dict, space: dict[str, Param], source: str) -> dict[str, Any]:
    """The config's own value of every key in ``space`` (the model's default where the config is
    silent); a ``ValueError`` when one lies outside the space."""
    defaults = _class_defaults(config)
    values = {}
    for name, param in space.items():
        try:
            value = _get(config, name)
        except KeyError:
            if name not in defaults:
                raise ValueError(f"{source}: the search space's `{name}` is not in the config nor a parameter "
                                 f"of its model") from None
            value = defaults[name]
        if not param.contains(value):
            raise ValueError(f"{source}: the config's {name} = {value!r} lies outside the search space "
                             f"({_describe(param)}); widen the space so the untuned config is its first trial")
        values[name] = value
    return values


def _describe(p: Param) -> str:
    if p.kind == "choices":
        return f"choices {list(p.choices)}"
    return f"{p.kind} [{p.low}, {p.high}]{' log' if p.log else ''}"


@dataclass
class TuneResult:
    """What :func:`tune` found: the study, the chosen trial's values and value (the best trial's,
    unless ``margin`` kept the untuned config), and its files."""

    study: Any
    best_values: dict[str, Any]
    best_value: float
    best_config: Path
    out: Path
    metric: str = METRIC  #: the vali metric the study maximised
    ensemble_config: Path | None = None  #: with ``top_k`` > 1: OUT/ensemble.yaml
    trial: int | None = None  #: the chosen trial's number (``best.yaml``'s)
    #: with ``confirm``: the refits' record (:func:`confirm_trial`), None when there was nothing to confirm
    confirmation: dict | None = None

    @property
    def kept_untuned(self) -> bool:
        """Whether ``margin`` (or ``confirm``) kept the untuned config although a trial scored higher on vali."""
        return self.trial is not None and self.trial != self.study.best_trial.number


def parse_overrides(argv: list[str]) -> dict[str, Any]:
    """``["--data.fold=2", "--trainer.max_epochs", "5"]`` -> ``{"data.fold": 2, "trainer.max_epochs": 5}``
    (values read as YAML, as ``rankkit fit`` reads them, with the same limits)."""
    out, i = {}, 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--") or len(arg) < 3:
            raise ValueError(f"`overrides`: expected --key=value or --key value at position {i}, got {arg!r}")
        if "=" in arg:
            key, text = arg[2:].split("=", 1)
            i += 1
        elif i + 1 < len(argv):
            key, text = arg[2:], argv[i + 1]
            i += 2
        else:
            raise ValueError(f"`overrides`: {arg} at position {i} has no value")
        out[key] = _yaml.safe_load(text, f"--{key}")  # the limits of every YAML rankkit reads
    return out


def _trial(config: dict, values: dict, *, trial, metric: str, workdir: str, report: bool = True) -> tuple[float, int]:
    """One fit of ``config`` with ``values``; (best vali value, its 0-based epoch). ``report``: the
    fit's curve goes to the trial (pruning, the trial's epochs); a trial's later seeds do not."""
    import optuna
    import pytorch_lightning as pl

    curve: list[float] = []
    pruned = []

    class Report(pl.Callback):
        def on_validation_end(self, trainer, pl_module):
            if trainer.sanity_checking:
                return
            if metric not in trainer.callback_metrics:
                raise ValueError(f"`metric`: the model logged no {metric!r} (it logs "
                                 f"{sorted(k for k in trainer.callback_metrics if k.startswith('val'))})")
            curve.append(float(trainer.callback_metrics[metric]))
            if not report:
                return
            trial.report(max(curve), step=len(curve) - 1)
            if trial.should_prune():
                pruned.append(len(curve) - 1)
                trainer.should_stop = True

    _fit(config, values, workdir=workdir, callbacks=[Report()])
    if not curve:
        raise ValueError("the trial logged no validation value: the config needs a vali split "
                         "(a vali file, or --data.val_fraction)")
    best = max(range(len(curve)), key=curve.__getitem__)
    if report:
        trial.set_user_attr("best_epoch", best)
        trial.set_user_attr("epochs", len(curve))
    if pruned:
        raise optuna.TrialPruned(f"pruned at epoch {pruned[0]}")
    return curve[best], best


def _fit(config: dict, values: dict, *, workdir: str, callbacks: list | None = None):
    """``rankkit fit`` of ``config`` with ``values`` in ``workdir`` (no logger, no progress bar):
    the LightningCLI, its trainer fitted."""
    from rankkit.training.lightning_cli import lightning_cli

    path = Path(workdir) / "trial.yaml"
    path.write_text(_yaml_dump(apply_values(config, values)))
    args = ["--config", str(path), "--trainer.logger=false", "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false", f"--trainer.default_root_dir={workdir}"]
    cli = lightning_cli(args, run=False, verbose=False)
    cli.trainer.callbacks.extend(callbacks or [])
    with quiet_lightning_logs():
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return cli


def vali_per_query(config: dict, values: dict, *, workdir: str):
    """Per-query NDCG@10 [Q] (float64; exp gain, a query with nothing relevant scores 1, as
    ``val/ndcg@10``) on the vali split of one fit of ``config`` with ``values``, scored by the
    checkpoint its ``ModelCheckpoint`` kept (the epoch or tree of the best ``val/ndcg@10``):
    reloaded, scored query by query through :func:`rankkit.serving.score_queries` and
    :func:`rankkit.metrics.ndcg`, not read from what the module logged."""
    from rankkit.data.dataset import pad
    from rankkit.metrics import ndcg
    from rankkit.serving import as_scorer, score_queries

    from rankkit.training.lightning_cli import best_checkpoint

    cli = _fit(config, values, workdir=workdir)
    checkpoint = cli.trainer.checkpoint_callback
    if checkpoint is None or checkpoint.monitor != METRIC or not checkpoint.best_model_path:
        raise ValueError(f"`confirm` scores the checkpoint of the best {METRIC}: the config needs a ModelCheckpoint "
                         f"monitoring {METRIC} (every packaged config has one)")
    model, _ = best_checkpoint(cli)
    vali = cli.datamodule.val_set
    scores = score_queries(as_scorer(model), vali.features, vali.sizes)
    s, mask = pad(scores.double(), vali.sizes)
    return ndcg(s, pad(vali.labels.double(), vali.sizes)[0], mask=mask, k=10)


def _seeded(config: dict, seed: int) -> dict[str, int]:
    """The settings that make a fit of ``config`` another seed's: ``seed_everything`` and, where
    the config has them, the model's and the data module's own seeds (as ``rankkit compare``)."""
    defaults = _class_defaults(config)
    out = {"seed_everything": seed}
    for key in ("model.init_args.seed", "data.seed"):
        try:
            _get(config, key)
        except KeyError:
            if key not in defaults:
                continue
        out[key] = seed
    return out


def _yaml_dump(config: dict) -> str:
    import yaml

    return yaml.safe_dump(config, sort_keys=False, default_flow_style=None)


def tune(config: str | os.PathLike, *, space: str | os.PathLike | None = None, n_trials: int = 30,
         timeout: float | None = None, seed: int = 0, out: str | os.PathLike | None = None,
         storage: str | None = None, study_name: str | None = None,
         overrides: dict[str, Any] | list[str] | None = None,
         metric: str | None = None, pruner: Any = "median", trial_seeds: int = 2,
         folds: str | list[int] | None = "auto", top_k: int = 1, margin: float = 1.0, confirm: int | None = None,
         verbose: bool = False, command: str = "",
         log: Callable[[str], None] = print) -> TuneResult:
    """Run (or resume) an Optuna study over ``config`` (a packaged name such as ``"lambdarank"`` or
    a YAML path) and write its best config; see the module's text.

    ``metric``: the logged vali metric to maximise; None: the one the config's
    ``ModelCheckpoint`` monitors (``val/click_likelihood`` in ``lambdamart_clicks``), else
    ``val/ndcg@10``.
    ``overrides``: settings for every trial, recorded in the best config too: dotted keys
    (``{"data.fold": 2}``) or command-line flags as ``rankkit fit`` takes them (``["--data.fold=2"]``).
    ``seed`` seeds the sampler and is every trial's ``seed_everything``.
    ``pruner``: ``"median"``, ``"none"`` or any Optuna pruner.

    The defaults are the study that generalised in the nested measurements (docs/tuning.md,
    "Confirmed on refits"): every fold, two seeds a fit, the best trial confirmed on three fresh
    seeds beyond one standard error. ``folds=None, trial_seeds=1, confirm=0, margin=0`` is the
    quick study of one fit a trial (about a tenth of the time).
    ``trial_seeds`` (2): score a trial by the mean best vali value of that many fits, seeds
    ``seed``, ``seed + 1``, ... (the first seed's curve decides pruning).
    ``folds`` (``"auto"``: every fold of the config's data when it has several and ``overrides``
    set no ``data.fold``, else its one fold; ``"1-5"``, ``"1,3"``, a list; None or ``"none"``: the
    config's fold): score a trial by the mean best vali value over these folds (``data.fold``), each
    with ``trial_seeds`` seeds, as ``lgb.cv`` scores a setting; the first fold's first seed decides
    pruning, so trials are pruned on like curves; the trial's per-fold values and their spread are
    recorded. ``top_k`` > 1: also write the configs of the K best completed trials
    (``OUT/top/1.yaml`` ... best first) and ``OUT/ensemble.yaml`` naming them, which ``rankkit
    compare --models`` trains as one averaged scorer. ``confirm`` N > 0 (None: 3 where the study
    maximises ``val/ndcg@10`` and the config keeps its model by it, else 0): after the study,
    refit its best trial and the untuned config with N fresh seeds (on each of ``folds``) and keep
    the best trial only if it beats the untuned config there, query by query on vali, by more than
    ``margin`` (1) standard errors (:func:`confirm_trial`). With ``confirm`` 0, ``margin`` > 0
    weighs the study's own fits instead: with several a trial (``folds``, ``trial_seeds``) the
    untuned config is kept unless the best trial beats it by more than ``margin`` standard errors
    of their paired differences, fit by fit (the one-standard-error rule; 0: the best mean wins, as
    a study of one fit always does); :func:`chosen_trial`. ``log`` takes a line per trial.
    """
    import optuna

    _check_options(n_trials=n_trials, seed=seed, trial_seeds=trial_seeds, pruner=pruner, timeout=timeout, top_k=top_k,
                   margin=margin, confirm=0 if confirm is None else confirm)
    config_path = Path(resolve_config_arg(str(config)))
    base = _yaml.safe_load(_yaml.read_text(config_path), str(config_path))
    if not isinstance(base, dict) or "model" not in base:
        raise ValueError(f"{config_path}: not a rankkit model config (no `model:`)")
    if isinstance(overrides, (list, tuple)):
        overrides = parse_overrides(list(overrides))
    base = apply_values(base, {**_seeded(base, seed), **(overrides or {})})
    folds = _checked_folds(folds, base, fold_given="data.fold" in (overrides or {}))
    metric = metric if metric is not None else _monitored(base)
    confirm = _confirm_setting(confirm, base, metric, config_path)
    space_file = Path(space) if space is not None else space_path(config_path)
    if not space_file.is_file():
        raise ValueError(f"`space`: no search space {space_file} (write one beside the config, see "
                         f"rankkit/configs/*.space.yaml)")
    params = load_space(space_file)
    start = untuned_values(base, params, str(config_path))
    name = config_path.name[: -len(config_path.suffix)]
    data, suffix = _data_settings(base, folds)
    out = Path(out) if out is not None else Path("results") / "tune" / (name + suffix)
    # Before anything is written: none of the study's files may be the config or space it reads.
    check_outputs({"--out": [out / f for f in (*OUTPUT_FILES, *_top_files(top_k))]},
                  {"--config": config_path, "--space": space_file}, with_sidecars=False)
    out.mkdir(parents=True, exist_ok=True)
    storage = storage or f"sqlite:///{(out / 'study.db').resolve()}"
    if not verbose:
        optuna.logging.set_verbosity(optuna.logging.ERROR)  # a failed trial is our one line, not its traceback
    study = _open_study(study_name or name + suffix, storage, seed, pruner, data, metric,
                        scoring=dict(seed=seed, seed_everything=base.get("seed_everything"), trial_seeds=trial_seeds))
    if not study.trials:
        study.enqueue_trial({k: params[k].encode(v) for k, v in start.items()}, user_attrs={"untuned": True})
    _rerun_interrupted(study, log)
    study.sampler = _sampler(seed, len(study.trials))
    finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    left = n_trials - len(study.get_trials(deepcopy=False, states=finished))
    if left > 0:
        objective = _objective(base, params, seed=seed, trial_seeds=trial_seeds, metric=metric, log=log, folds=folds)
        study.optimize(objective, n_trials=left, timeout=timeout, catch=(Exception,), gc_after_trial=True,
                       callbacks=[_progress(n_trials, metric, log)])
    else:
        _say_done(study, n_trials, metric, log)
    best, why, confirmation = _choose(study, base, seed=seed, trial_seeds=trial_seeds, folds=folds, confirm=confirm,
                                      margin=margin, log=log)
    best_values = {k: _decode(v) for k, v in best.params.items()}
    _check_trial_values(best.number, best_values, params, storage)
    best_config = out / "best.yaml"
    header = _header(study, best, why, best_config=best_config, storage=storage,
                     sources=f"{config_path.name}\n# with {space_file.name}", metric=metric,
                     scored_by=_scored_by(trial_seeds, folds), command=command)
    _write_outputs(study, out, metric, best_config, header + _yaml_dump(apply_values(base, best_values)))
    ensemble = _write_ensemble(study, out, base, params, top_k, storage, metric, log=log, best=best)
    return TuneResult(study, best_values, best.value, best_config, out, metric, ensemble, best.number, confirmation)


def _confirm_setting(confirm: int | None, base: dict, metric: str, config_path: Path) -> int:
    """``confirm`` as the study runs it: None (the default) is :data:`CONFIRM` where the refits can be
    scored query by query (the study maximises ``val/ndcg@10`` and the config keeps its checkpoint
    by it), else 0; a number asked for where they cannot is refused before the first trial."""
    if confirm is None:
        return CONFIRM if metric == METRIC and _checkpoint_monitor(base) == METRIC else 0
    if confirm and metric != METRIC:
        raise ValueError(f"`confirm` compares the refits' {METRIC} query by query; this study maximises {metric}: "
                         f"leave out confirm (--confirm)")
    if confirm and _checkpoint_monitor(base) != METRIC:
        raise ValueError(f"`confirm` scores each refit's checkpoint of the best {METRIC}: {config_path.name} needs a "
                         f"ModelCheckpoint monitoring {METRIC} (every packaged config has one)")
    return confirm


def _choose(study, base: dict, *, seed: int, trial_seeds: int, folds: list[int] | None, confirm: int, margin: float,
            log: Callable[[str], None]) -> tuple[Any, str, dict | None]:
    """The trial a finished study writes, why (logged) and the refits' record: with ``confirm``,
    :func:`confirm_trial` on seeds after the study's; else :func:`chosen_trial`. A study without a
    completed trial is refused, with its last failure."""
    import optuna

    if not any(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials):
        failed = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
        last = f"; the last failure (trial {failed[-1].number}): {failed[-1].user_attrs.get('error', '?')}" \
            if failed else ""
        raise ValueError(f"the study has no completed trial (every trial was pruned or failed){last}")
    if confirm:
        fresh = list(range(seed + trial_seeds, seed + trial_seeds + confirm))
        best, why, confirmation = confirm_trial(study, _refit_scorer(base), seeds=fresh, folds=folds, margin=margin,
                                                log=log)
    else:
        (best, why), confirmation = chosen_trial(study, margin), None
    if why:
        log(why)
    return best, why, confirmation


def _header(study, best, why: str, *, best_config: Path, storage: str, sources: str, metric: str, scored_by: str,
            command: str) -> str:
    """best.yaml's comment lines: the command that refits it, the study and trial it came from,
    why that trial (:func:`chosen_trial`), and when and by what it was written."""
    return (f"# rankkit fit --config {best_config}\n#\n# The chosen trial ({best.number}) of the Optuna study "
            f"{study.study_name!r} ({storage}) over {sources}: {metric} {best.value:.4f} on vali{scored_by} at "
            f"epoch {best.user_attrs.get('best_epoch', '?')} (0-based); the untuned config scored "
            f"{_untuned_value(study):s}." + (f"\n# {why}" if why else "") + f"\n# Written {datetime.date.today()}"
            + (f" by `{command}`" if command else "") + ". Test data was not read.\n")


def _write_outputs(study, out: Path, metric: str, best_config: Path, text: str) -> None:
    """best.yaml (``text``), trials.md, trials.json and history.png, each written atomically."""
    atomic_write(best_config, lambda tmp: Path(tmp).write_text(text))
    _write_trials(study, out, metric)
    _plot(study, out)


def _check_options(*, n_trials, seed, trial_seeds, pruner, timeout, top_k=1, margin=0.0, confirm=0) -> None:
    import optuna

    from rankkit.infra.checks import check_choice, check_int  # torch: not at `rankkit --help`

    check_int(n_trials, "n_trials", low=1)
    check_int(seed, "seed", low=0)
    check_int(trial_seeds, "trial_seeds", low=1)
    check_int(top_k, "top_k", low=1)
    check_int(confirm, "confirm", low=0)
    if not isinstance(pruner, optuna.pruners.BasePruner):
        check_choice(pruner, ("median", "none"), "pruner")
    if _number(margin, "`margin`") < 0:
        raise ValueError(f"`margin` has to be a number of standard errors >= 0, got {margin!r}")
    if timeout is not None:
        _number(timeout, "`timeout`")
        if timeout <= 0:
            raise ValueError(f"`timeout` has to be positive seconds, got {timeout!r}")


#: What a study writes into its folder (and, with ``top_k`` > 1, ``ensemble.yaml`` and ``top/<r>.yaml``).
OUTPUT_FILES = ("best.yaml", "trials.md", "trials.json", "history.png", "study.db")


def _top_files(top_k: int) -> list[str]:
    return [] if top_k <= 1 else ["ensemble.yaml", *(f"top/{r}.yaml" for r in range(1, top_k + 1))]


def _write_ensemble(study, out: Path, base: dict, params: dict, top_k: int, storage: str, metric: str, *,
                    log: Callable[[str], None], best) -> Path | None:
    """With ``top_k`` > 1: ``OUT/top/<r>.yaml``, the configs of the ``top_k`` best completed trials
    (the chosen trial ``best`` first, as ``best.yaml``, then by value, ties by trial number; fewer,
    said in one line, when the study has fewer), and ``OUT/ensemble.yaml`` naming them (``rankkit
    compare --models OUT/ensemble.yaml`` averages their scorers). Files an earlier run wrote for
    more trials, or for an ensemble this run does not ask for, are removed: what is in OUT
    always matches the study."""
    import optuna

    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    ranked = [best] + sorted((t for t in done if t.number != best.number), key=lambda t: (-t.value, t.number))
    ranked = ranked[:top_k] if top_k > 1 else []
    if top_k > 1 and len(ranked) < top_k:
        log(f"top_k {top_k}: the study has {len(ranked)} completed trial(s), so the ensemble has {len(ranked)}")
    _remove_stale(out, len(ranked))
    if not ranked:
        return None
    (out / "top").mkdir(exist_ok=True)
    names = []
    for rank, t in enumerate(ranked, 1):
        values = {k: _decode(v) for k, v in t.params.items()}
        _check_trial_values(t.number, values, params, storage)
        text = (f"# rankkit fit --config {out / 'top' / f'{rank}.yaml'}\n# Trial {t.number} of the study "
                f"{study.study_name!r}, rank {rank}: {metric} {t.value:.4f} on vali.\n"
                + _yaml_dump(apply_values(base, values)))
        atomic_write(out / "top" / f"{rank}.yaml", lambda tmp, text=text: Path(tmp).write_text(text))
        names.append(f"top/{rank}.yaml")
    path = out / "ensemble.yaml"
    text = (f"# rankkit compare --models {path}\n# The {len(names)} best trials of the study {study.study_name!r} "
            f"({metric} on vali); compare trains each and tests the mean of their scores as one scorer.\n"
            + _yaml_dump({"ensemble": names}))
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))
    return path


def _remove_stale(out: Path, kept: int) -> None:
    """Remove ``OUT/top/<r>.yaml`` for r > ``kept`` (and ``OUT/ensemble.yaml``, and an emptied
    ``OUT/top``, when ``kept`` is 0): what an earlier run with a larger ``top_k`` wrote."""
    top = out / "top"
    if top.is_dir():
        for path in top.glob("*.yaml"):
            if path.stem.isdigit() and int(path.stem) > kept:
                path.unlink()
        if kept == 0 and not any(top.iterdir()):
            top.rmdir()
    if kept == 0 and (out / "ensemble.yaml").is_file():
        (out / "ensemble.yaml").unlink()


def _data_settings(base: dict, folds: list[int] | None = None) -> tuple[dict, str]:
    """The data settings a study depends on (``data``, ``fold``, ``val_fraction``, ``val_seed``,
    ``max_docs`` of the config after its overrides; ``folds`` in place of ``fold`` for a study
    across folds) and the suffix of its default name and folder: none for the packaged default
    (every MQ2008 fold, what a study of a packaged config scores by default), else ``-DATA-foldF``
    (``-DATA-folds1-5``)."""
    data = base.get("data") if isinstance(base.get("data"), dict) else {}
    settings = {k: data.get(k) for k in ("data", "fold", "val_fraction", "val_seed", "max_docs") if k in data}
    if folds is not None:
        settings.pop("fold", None)
        settings["folds"] = ",".join(map(str, folds))
    source, fold = str(settings.get("data", "mq2008")), settings.get("fold", 1)
    slug = "".join(c if c.isalnum() or c in "-_" else "_" for c in Path(source).name or source)
    if folds is not None:
        if source == "mq2008" and folds == [1, 2, 3, 4, 5]:
            return settings, ""
        span = f"{folds[0]}-{folds[-1]}" if folds == list(range(folds[0], folds[-1] + 1)) else "_".join(map(str, folds))
        return settings, f"-{slug}-folds{span}"
    return settings, f"-{slug}-fold{fold}"


def _checked_folds(folds, base: dict, *, fold_given: bool = False) -> list[int] | None:
    """``folds`` (``"1-5"``, ``"1,3"`` or a list) read as ``rankkit compare`` reads them, each a
    fold the config's data has (checked before the first trial trains), sorted; None (or
    ``"none"``) stays None: the config's one fold. ``"auto"``: every fold of the data when it has
    several (MQ2008, a LETOR root of Fold1..FoldN) and no ``data.fold`` was given (``fold_given``),
    else None."""
    if folds is None or folds == "none":
        return None
    from rankkit.training.datamodule import data_folds, parse_folds

    data = base.get("data") if isinstance(base.get("data"), dict) else {}
    available = data_folds(str(data.get("data", "mq2008")))
    if folds == "auto":
        return None if fold_given or len(available) < 2 else sorted(available)
    return sorted(parse_folds(folds, available))


def _checkpoint_monitor(config: dict) -> str | None:
    """The metric the config's ``ModelCheckpoint`` monitors (what ``rankkit fit`` keeps the model
    by), or None without one."""
    callbacks = (config.get("trainer") or {}).get("callbacks") or []
    for callback in callbacks if isinstance(callbacks, list) else []:
        if isinstance(callback, dict) and str(callback.get("class_path", "")).endswith("ModelCheckpoint"):
            monitor = (callback.get("init_args") or {}).get("monitor")
            if isinstance(monitor, str) and monitor:
                return monitor
    return None


def _monitored(config: dict) -> str:
    """The metric the config's ``ModelCheckpoint`` monitors, or :data:`METRIC`."""
    return _checkpoint_monitor(config) or METRIC


def _scored_by(trial_seeds: int, folds: list[int] | None) -> str:
    parts = ([f"{len(folds)} folds"] if folds else []) + ([f"{trial_seeds} seeds"] if trial_seeds > 1 else [])
    return f" (mean of {' x '.join(parts)})" if parts else ""


def _open_study(name: str, storage: str, seed: int, pruner, data: dict, metric: str, *, scoring: dict):
    """The study (created, or loaded to resume and checked against ``data``, ``metric`` and
    ``scoring``)."""
    try:
        study = _study(name, storage, seed, pruner)
    except Exception as e:  # noqa: BLE001 -- a file that is no Optuna study: one line, whatever the driver raises
        text = str(e).strip().splitlines()
        raise ValueError(f"{storage}: not a readable Optuna study ({type(e).__name__}: {text[0] if text else ''}); "
                         f"pass another --out (or --storage) for a new study") from None
    _check_study(study, data, metric, storage, scoring=scoring)
    return study


def _check_scoring(study, scoring: dict, storage: str) -> None:
    """A study resumed only with the seeds its trials were scored by (``--seed``, a
    ``--seed_everything=`` override, ``--trial_seeds``; ``rankkit compare --tune_seeds``): its
    trials' values and ``run_values`` compare like with like (``--margin`` pairs them fit by fit).
    Recorded when first seen, so a study from before rankkit recorded them takes the seeds of the
    run that first resumes it."""
    recorded = study.user_attrs.get("rankkit_scoring")
    if recorded is None:
        study.set_user_attr("rankkit_scoring", scoring)
    elif recorded != scoring:
        def said(s: dict) -> str:
            return (f"seed {s.get('seed')} (fits seeded from {s.get('seed_everything')}), {s.get('trial_seeds')} "
                    f"seed(s) a trial")

        raise ValueError(f"the study {study.study_name!r} in {storage} scored its trials with {said(recorded)}; this "
                         f"run asks for {said(scoring)}: pass another --out (a new study) or the settings it was "
                         f"run with (--seed, --trial_seeds; rankkit compare --tune_seeds)")


def _check_study(study, data: dict, metric: str, storage: str, *, scoring: dict | None = None) -> None:
    """A study resumed only for what it was run on: the same data settings and metric, maximised
    (recorded in the study when it is created), and with ``scoring`` the same seeds
    (:func:`_check_scoring`); a mismatch is refused in one line."""
    import optuna

    if study.direction != optuna.study.StudyDirection.MAXIMIZE:
        raise ValueError(f"the study {study.study_name!r} in {storage} minimises its objective; rankkit's "
                         f"studies maximise {metric}: pass another --out or study name")
    recorded = study.user_attrs.get("rankkit_data"), study.user_attrs.get("rankkit_metric")
    now = ({k: _plain(v) for k, v in data.items()}, metric)
    if recorded == (None, None):  # a new study (or one from before rankkit recorded them)
        study.set_user_attr("rankkit_data", now[0])
        study.set_user_attr("rankkit_metric", metric)
    elif recorded != now:
        raise ValueError(f"the study {study.study_name!r} in {storage} was run on data {recorded[0]} scored by "
                         f"{recorded[1]}; this run asks for data {now[0]} scored by {now[1]}: pass another "
                         f"--out (a new study) or the settings it was run with")
    if scoring is not None:
        _check_scoring(study, scoring, storage)


def _check_trial_values(number: int, values: dict, params: dict, storage: str) -> None:
    """A trial's values, as the study file holds them, are those of the search space: its keys and
    within its ranges (a crafted ``study.db`` could otherwise put any key -- ``ckpt_path``,
    ``trainer.callbacks`` -- into the best.yaml that ``fit`` runs)."""
    for key, value in values.items():
        if key not in params:
            raise ValueError(f"the study in {storage}: trial {number} sets {key!r}, which the search space does not "
                             f"hold (a study file from elsewhere?); pass another --out for a new study")
        if not params[key].contains(value):
            raise ValueError(f"the study in {storage}: trial {number} sets {key}={value!r}, outside the search "
                             f"space ({_describe(params[key])})")


def _plain(value: Any) -> Any:
    """A value as JSON keeps it (what Optuna's user attributes hold)."""
    return value if isinstance(value, (int, float, str, bool)) or value is None else str(value)


def _study(name: str, storage: str, seed: int, pruner):
    """The study (created, or loaded to resume): TPE seeded, median pruning unless told otherwise."""
    import optuna

    return optuna.create_study(
        study_name=name, storage=storage, direction="maximize", load_if_exists=True,
        sampler=optuna.samplers.TPESampler(seed=seed),
        pruner=pruner if isinstance(pruner, optuna.pruners.BasePruner)
        else optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=5) if pruner == "median"
        else optuna.pruners.NopPruner())


def _sampler(seed: int, history: int):
    """TPE seeded by ``seed`` and by the number of trials the study already holds: a new study
    draws as ``TPESampler(seed=seed)`` always did, and a resumed one continues with draws of its
    own (reseeded with ``seed`` alone, the random start-up trials would replay the first run's
    values; TPE itself reads the history from the study)."""
    import optuna

    return optuna.samplers.TPESampler(seed=seed if history == 0 else (seed * 1_000_003 + history) % 2**32)


def _rerun_interrupted(study, log: Callable[[str], None]) -> None:
    """Trials left running by an interrupted study (Ctrl-C, a killed process) are marked failed,
    so that they do not count towards ``n_trials``, and their values are queued to run again.
    (rankkit's studies run in one process: a running trial in the file at the start is one that
    will never finish.)"""
    import optuna

    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        study.tell(t.number, state=optuna.trial.TrialState.FAIL)
        if t.params:
            study.enqueue_trial(dict(t.params), user_attrs={k: v for k, v in t.user_attrs.items() if k == "untuned"})
        log(f"trial {t.number} was interrupted: marked failed, its values queued to run again")


def _say_done(study, n_trials: int, metric: str, log: Callable[[str], None]) -> None:
    """The line a finished study says when it is run again: its trials and its best."""
    import optuna

    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED))
    complete = [t for t in done if t.state == optuna.trial.TrialState.COMPLETE]
    best = f"; best {metric} {study.best_value:.4f} (trial {study.best_trial.number})" if complete else ""
    log(f"{len(done)} of {n_trials} trials done{best}: nothing to run (ask for more with --n_trials)")


def _objective(base: dict, params: dict, *, seed: int, trial_seeds: int, metric: str,
               log: Callable[[str], None] | None = None, folds: list[int] | None = None) -> Callable:
    """A trial's value: the mean best vali value of ``trial_seeds`` fits on each of ``folds``
    (the first one's curve reported for pruning). ``log`` gets a line as each trial starts (a
    trial can take a minute: the study is never silent until its first one ends)."""
    runs = [(fold, i) for fold in (folds or [None]) for i in range(trial_seeds)]
    def objective(trial):
        values = {k: p.suggest(trial) for k, p in params.items()}
        if log is not None:
            log(f"trial {trial.number} started: " + ", ".join(f"{k.split('.')[-1]}={_decode(v)!r}"
                                                              for k, v in values.items()))
        t0 = time.perf_counter()
        scores = []
        try:
            for n, (fold, i) in enumerate(runs):
                with tempfile.TemporaryDirectory() as workdir:
                    config = base if i == 0 else apply_values(base, _seeded(base, seed + i))
                    if fold is not None:
                        config = apply_values(config, {"data.fold": fold})
                    scores.append(_trial(config, values, trial=trial, metric=metric, workdir=workdir,
                                         report=n == 0)[0])
        except Exception as e:  # a failed trial is recorded (one line) and the study goes on
            if type(e).__name__ != "TrialPruned":
                text = str(e).strip().splitlines()
                trial.set_user_attr("error", f"{type(e).__name__}: {text[0] if text else ''}"[:500])
            raise
        finally:  # pruned trials too
            trial.set_user_attr("seconds", time.perf_counter() - t0)
        if len(scores) > 1:  # every fit's value, fold-major (chosen_trial pairs them with the untuned config's)
            trial.set_user_attr("run_values", scores)
        if trial_seeds > 1 and folds is None:
            trial.set_user_attr("seed_values", scores)
        if folds is not None:  # each fold's mean over its seeds, and the spread of every fit
            trial.set_user_attr("fold_values", {str(f): statistics.fmean(scores[j * trial_seeds:(j + 1) * trial_seeds])
                                                for j, f in enumerate(folds)})
        if len(scores) > 1:
            trial.set_user_attr("spread", statistics.stdev(scores))
        return sum(scores) / len(scores)

    return objective


def _progress(n_trials: int, metric: str, log: Callable[[str], None]) -> Callable:
    """The study callback that logs a line per finished trial."""
    import optuna

    finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)

    def progress(study, trial):
        done = len(study.get_trials(deepcopy=False, states=finished))
        state = trial.state.name.lower()
        value = f"{trial.value:.4f}" if trial.value is not None else "-"
        best = study.best_trial if any(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials) else None
        why = f" ({trial.user_attrs['error']})" if state == "fail" and "error" in trial.user_attrs else ""
        log(f"trial {trial.number} {state}{why}: {metric} {value}"
            + (f"; best {best.value:.4f} (trial {best.number})" if best else "") + f"  [{done}/{n_trials}]")

    return progress


def chosen_trial(study, margin: float = 0.0) -> tuple[Any, str]:
    """(the trial whose config a study writes, why when that is not simply its best).

    A trial scored by several fits (folds, seeds: its ``run_values``, fold-major) beats the
    untuned config only by more than ``margin`` standard errors of the paired differences
    d_r = best_r − untuned_r over its fits r (the same fold and seed): a best mean that is within
    that noise of the config the user already has is kept out (the one-standard-error rule of
    Breiman, Friedman, Olshen and Stone, "Classification and Regression Trees", 1984; Hastie,
    Tibshirani and Friedman, "The Elements of Statistical Learning", 2009, section 7.10). With
    one fit a trial, no untuned trial, or ``margin`` 0: the best trial."""
    best, untuned = study.best_trial, _untuned_trial(study)
    if margin == 0 or untuned is None or untuned.number == best.number:
        return best, ""
    ours, theirs = best.user_attrs.get("run_values"), untuned.user_attrs.get("run_values")
    if not ours or not theirs or len(ours) != len(theirs) or len(ours) < 2:
        return best, (f"--margin {margin:g} weighs nothing here: the best trial ({best.number}) and the untuned "
                      f"config do not both record two or more fits to pair (one fit a trial, or trials of an "
                      f"earlier rankkit or another --trial_seeds): the best mean wins")
    mean, se = _mean_se([a - b for a, b in zip(ours, theirs)])
    return _decide(best, untuned, mean, se, margin, f"(mean ± standard error of {len(ours)} paired fits)")


def _mean_se(diffs: list[float]) -> tuple[float, float]:
    """The mean of paired differences and its standard error (0 for a single one)."""
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else 0.0
    return statistics.fmean(diffs), se


def _decide(best, untuned, mean: float, se: float, margin: float, unit: str) -> tuple[Any, str]:
    """(the best trial if its paired lead ``mean`` over the untuned config exceeds ``margin``
    standard errors ``se``, else the untuned trial; the line that says so). ``unit`` says what
    was paired."""
    lead = f"{mean:+.4f} ± {se:.4f} {unit}"
    if mean > margin * se:
        return best, f"the best trial ({best.number}) beats the untuned config by {lead}: it is chosen"
    return untuned, (f"the untuned config (trial {untuned.number}) is kept: the best trial ({best.number}) beats it "
                     f"by {lead}, not by more than {margin:g} standard error(s) (--margin)")


def _untuned_trial(study):
    """The study's completed untuned trial (its first, or the rerun of an interrupted one), or None."""
    return next((t for t in study.trials if t.user_attrs.get("untuned") and t.value is not None
                 and t.state.name == "COMPLETE"), None)


def _refit_scorer(base: dict) -> Callable:
    """(values, seed, fold) -> per-query vali NDCG@10 of one fit of ``base`` with ``values``,
    seeded as a study's later seeds are (:func:`_seeded`), on ``data.fold`` = fold unless None."""
    def score(values: dict, seed: int, fold: int | None):
        config = apply_values(base, _seeded(base, seed))
        if fold is not None:
            config = apply_values(config, {"data.fold": fold})
        with tempfile.TemporaryDirectory() as workdir:
            return vali_per_query(config, values, workdir=workdir)

    return score


def confirm_trial(study, score: Callable, *, seeds: list[int], folds: list[int] | None = None, margin: float = 0.0,
                  log: Callable[[str], None] | None = None) -> tuple[Any, str, dict | None]:
    """(the trial whose config the study writes, why, the refits' record).

    A study's best value is the largest of many noisy ones, so it overstates the best trial's lead
    over the untuned config (the winner's curse: its seed, or its epoch, may simply have been
    lucky). Here the best trial is made to win again on fits the choice never saw, as SMAC's
    intensification makes a challenger beat the incumbent on runs of its own (Hutter, Hoos and
    Leyton-Brown, "Sequential Model-Based Optimization for General Algorithm Configuration", LION
    2011): ``score(values, seed, fold)`` -> per-query vali NDCG@10 of one fit (:func:`vali_per_query`)
    for the best trial's and the untuned config's values with each of ``seeds`` (fresh: not the
    study's) on each of ``folds``. d_q, the best minus the untuned value of vali query q averaged
    over the seeds, is paired by query (and fold); the best trial is chosen only if mean(d) >
    ``margin`` x its standard error, else the untuned config is kept. Queries, not fits, are the
    unit: on a small vali set the queries are most of the noise, and a deterministic booster has
    no seed noise to weigh. The record (also the study's user attribute ``rankkit_confirmation``)
    is reused while the best trial, the seeds and the folds are unchanged. With no completed
    untuned trial, or the untuned config the best: the best trial, nothing refitted."""
    import torch

    best, untuned = study.best_trial, _untuned_trial(study)
    if untuned is None or untuned.number == best.number:
        return best, "", None
    key = {"best": best.number, "untuned": untuned.number, "seeds": list(seeds), "folds": folds}
    record = study.user_attrs.get("rankkit_confirmation")
    if not record or {k: record.get(k) for k in key} != key:
        if log is not None:
            log(f"confirming: trial {best.number} and the untuned config (trial {untuned.number}) refitted with seeds "
                f"{list(seeds)}" + (f" on folds {folds}" if folds else ""))
        ours, theirs = ([torch.stack([score({k: _decode(v) for k, v in t.params.items()}, s, fold)
                                      for s in seeds]).mean(0) for fold in folds or [None]] for t in (best, untuned))
        mean, se = _mean_se((torch.cat(ours) - torch.cat(theirs)).tolist())
        record = {**key, "mean": mean, "se": se, "queries": sum(len(q) for q in ours),
                  "best_value": float(torch.cat(ours).mean()), "untuned_value": float(torch.cat(theirs).mean())}
        study.set_user_attr("rankkit_confirmation", record)
    chosen, why = _decide(best, untuned, record["mean"], record["se"], margin,
                          f"on refits (mean ± standard error over {record['queries']} vali queries, {len(seeds)} fresh "
                          f"seed(s))")
    return chosen, why, record


def _untuned_value(study) -> str:
    done = [t for t in study.trials if t.user_attrs.get("untuned") and t.value is not None]  # a rerun, if interrupted
    return f"{done[0].value:.4f}" if done else "(not finished)"


def _write_trials(study, out: Path, metric: str) -> None:
    rows = []
    for t in study.trials:
        rows.append({"trial": t.number, "state": t.state.name.lower(), "value": t.value,
                     "best_epoch": t.user_attrs.get("best_epoch"), "epochs": t.user_attrs.get("epochs"),
                     "seconds": t.user_attrs.get("seconds"), "untuned": bool(t.user_attrs.get("untuned")),
                     "spread": t.user_attrs.get("spread"), "fold_values": t.user_attrs.get("fold_values"),
                     "run_values": t.user_attrs.get("run_values"),
                     "params": {k: _decode(v) for k, v in t.params.items()}})
    atomic_write(out / "trials.json", lambda tmp: Path(tmp).write_text(json.dumps(rows, indent=1)))
    keys = list(dict.fromkeys(k for r in rows for k in r["params"]))
    short = [k.rsplit(".", 1)[-1] for k in keys]
    lines = [f"| trial | state | {metric} | best epoch | epochs | s | " + " | ".join(short) + " |",
             "|---:|---|---:|---:|---:|---:|" + "---|" * len(keys)]
    for r in rows:
        value = f"{r['value']:.4f}" if r["value"] is not None else "–"
        if r["value"] is not None and r["spread"] is not None:
            value += f" ± {r['spread']:.4f}"
        seconds = f"{r['seconds']:.1f}" if r["seconds"] is not None else "–"
        label = f"{r['trial']}{' (untuned)' if r['untuned'] else ''}"
        cells = [json.dumps(r["params"].get(k)) if isinstance(r["params"].get(k), list) else
                 (f"{r['params'][k]:.3g}" if isinstance(r["params"].get(k), float) else str(r["params"].get(k, "–")))
                 for k in keys]
        lines.append(f"| {label} | {r['state']} | {value} | {r['best_epoch'] if r['best_epoch'] is not None else '–'} "
                     f"| {r['epochs'] or '–'} | {seconds} | " + " | ".join(cells) + " |")
    importance = _importance(study)
    if importance:
        lines += ["", "Which values mattered (Optuna's fANOVA importance over the completed trials, seed 0; "
                  "it sums to 1):", "", "| parameter | importance |", "|---|---:|"]
        lines += [f"| {k} | {v:.3f} |" for k, v in importance.items()]
    atomic_write(out / "trials.md", lambda tmp: Path(tmp).write_text("\n".join(lines) + "\n"))


def _importance(study) -> dict[str, float]:
    """fANOVA importances (Hutter et al., "An Efficient Approach for Assessing Hyperparameter
    Importance", ICML 2014) once the study has 3 completed trials; empty before."""
    import optuna

    completed = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if len(completed) < 3 or not completed[0].params:
        return {}
    try:
        return optuna.importance.get_param_importances(
            study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0))
    except (RuntimeError, ValueError):  # e.g. every completed trial drew the same values
        return {}


def _plot(study, out: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
        from optuna.visualization.matplotlib import plot_optimization_history
    except ImportError:
        return None
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental
        ax = plot_optimization_history(study)
    path = out / "history.png"
    atomic_write(path, lambda tmp: ax.figure.savefig(tmp, dpi=110, format="png"))
    plt.close(ax.figure)
    return path
