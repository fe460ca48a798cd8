"""Which rankkit LightningModule a checkpoint holds, and loading it without trusting the file.

Every rankkit LightningModule writes its class path into the checkpoint
(:func:`record_class`); :func:`load_checkpoint` reads it back and builds that class, and only
rankkit's own trainable classes. The file is read with ``weights_only=True`` (tensors and plain
containers: nothing is unpickled), and nothing in it names code to run:

* the class is one of :data:`TRAINABLE`, chosen by name; Lightning's ``_instantiator`` and
  ``_class_path`` records in the hyper-parameters are ignored (Lightning's own
  ``load_from_checkpoint`` would import and call them);
* the hyper-parameters must be arguments of that class's ``__init__`` and plain values (numbers,
  strings, short lists of them, short flat dicts of them such as ``loss_options``): a dict
  naming a ``class_path`` is refused, so the file cannot choose a scorer class; a scorer of your
  own is passed in code (``scorer=``);
* every size is checked before anything is allocated: the sizes in :data:`LIMITS`, then the
  model is built on the ``meta`` device (no memory) and each of its tensors must have the shape
  of the file's tensor of the same name; only then is it built for real. So loading allocates
  what the file holds, plus what the limits allow.

A checkpoint path is a local file: a URL (``http://``, ``s3://``, fsspec's ``simplecache::``)
is refused by :func:`check_local_path`, which the CLI applies to ``ckpt_path`` in any spelling.
"""
from __future__ import annotations

import importlib
import inspect
import os
import re

CLASS_KEY = "rankkit_class"

# The classes a checkpoint may name (their import paths; loaded on demand).
TRAINABLE = ("rankkit.neural.module.RankNet", "rankkit.neural.module.LambdaRank",
             "rankkit.neural.module.NeuralRanker", "rankkit.boosting.module.LambdaMARTModule")
# The modules whose scorers the LightningModules build from their hyper-parameters: a checkpoint
# recording one of them loads without `scorer=` (the record is compared, never imported).
OWN_SCORERS = ("rankkit.scorers.", "rankkit.neural.scorer.")  # and their former module, in older checkpoints

#: The largest value of each size hyper-parameter a checkpoint may declare (``hidden``: of each
#: layer's width). Feature counts share the LETOR reader's limit.
LIMITS = {"n_features": 1_000_000, "hidden": 1 << 16, "n_positions": 1024}


class RecordedName(str):
    """A custom objective's name as read from a model file or checkpoint: text that is never
    imported. To train with it again, name it in the call or config you run
    (``set_params(objective="pkg.mod.fn")``, ``--model.init_args.objective=...``), so that the
    code that runs is the code you chose, not the file's."""


#: The hyper-parameters that name code (a custom objective or loss): every loader hands them to
#: the model as :class:`RecordedName`, which training refuses to import.
RECORDED_NAMES = ("objective", "loss")


def recorded_names(hparams: dict) -> dict:
    """The custom objectives named among ``hparams``' ``RECORDED_NAMES``, as :class:`RecordedName`:
    a dotted path or a description (``pkg.mod.fn``, ``rankkit.custom.TorchLoss<...>``); a
    built-in's plain name ("lambdarank") names no code and stays as it is."""
    return {key: RecordedName(value) for key in RECORDED_NAMES
            if isinstance(value := hparams.get(key), str) and ("." in value or "<" in value)}
#: The longest list a hyper-parameter may hold (``hidden``: the number of layers).
MAX_LIST = 64
_REMOTE = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://|::")


def class_path(obj) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def record_class(checkpoint: dict, module) -> None:
    """Store the module's class path in ``checkpoint`` (an ``on_save_checkpoint`` hook's dict)."""
    checkpoint[CLASS_KEY] = class_path(module)


def rng_state() -> dict:
    """The random number generators' states that make a resumed fit exact (dropout, noise): the
    CPU's, and every GPU's where there is one; for a checkpoint's ``rankkit`` dict."""
    import torch

    state = {"torch_rng": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda_rng"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict) -> None:
    """Set the generators :func:`rng_state` recorded in ``state`` (missing ones are left alone)."""
    import torch

    if "torch_rng" in state:
        torch.set_rng_state(state["torch_rng"])
    if "cuda_rng" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])


def _import(path: str):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def check_local_path(value, name: str = "ckpt_path") -> str:
    """``value`` as a local path, or ValueError for a URL or an fsspec chain (``http://``,
    ``s3://``, ``file::...``, ``simplecache::...``): rankkit reads checkpoints from local files
    only (Lightning would fetch a URL and unpickle it with ``weights_only=False``)."""
    path = os.fspath(value)
    if _REMOTE.search(path):
        raise ValueError(f"`{name}` has to be a local checkpoint file, got {path!r}: rankkit does not "
                         f"load checkpoints from URLs (download it and check it first)")
    return path


def read_checkpoint(path: str | os.PathLike) -> dict:
    """The checkpoint's dict, read with ``weights_only=True`` (never unpickling code).

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: ``path`` is a URL, or the file is not a readable checkpoint (naming the file).
    """
    import torch

    path = check_local_path(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such checkpoint: {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the user's mistake here
        raise ValueError(f"{path}: not a readable Lightning checkpoint (truncated or corrupt?): "
                         f"{type(e).__name__}") from None
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("state_dict"), dict) \
            or not all(isinstance(v, torch.Tensor) for v in ckpt["state_dict"].values()):
        raise ValueError(f"{path}: not a Lightning checkpoint (no state_dict of tensors)")
    for name, t in ckpt["state_dict"].items():  # sizes by stored bytes, not by declared shapes
        if t.numel() and t.numel() * t.element_size() > t.untyped_storage().nbytes():
            raise ValueError(f"{path}: tensor `{name}` declares {tuple(t.shape)} ({t.numel()} values) over "
                             f"{t.untyped_storage().nbytes()} stored bytes (an expanded, stride-0 tensor): a "
                             f"checkpoint holds each value it declares")
    n = ckpt.get("rankkit_n_features")
    if n is not None and not (isinstance(n, int) and 0 <= n <= LIMITS["n_features"]):
        raise ValueError(f"{path}: the checkpoint declares {n!r} features, more than the limit "
                         f"{LIMITS['n_features']}")
    return ckpt


def _check_value(path: str, key: str, value, depth: int = 0) -> None:
    """A plain hyper-parameter value within its limit, or ValueError naming it."""
    if value is None or isinstance(value, (bool, float, str)):
        return
    if isinstance(value, int):
        limit = LIMITS.get(key)
        if limit is not None and not 0 <= value <= limit:
            raise ValueError(f"{path}: hyper-parameter `{key}` = {value} is beyond the limit {limit} "
                             f"(rankkit.infra.checkpoint.LIMITS)")
        return
    if isinstance(value, dict) and depth == 0 and "class_path" not in value:  # loss_options
        if len(value) > MAX_LIST:
            raise ValueError(f"{path}: hyper-parameter `{key}` holds {len(value)} entries, more than {MAX_LIST}")
        for name, v in value.items():
            if not isinstance(name, str) or isinstance(v, (list, tuple, dict)):
                raise ValueError(f"{path}: hyper-parameter `{key}` has to map names to plain values, got "
                                 f"{name!r}: {type(v).__name__}")
            _check_value(path, key, v, depth + 1)
        return
    if isinstance(value, (list, tuple)) and depth == 0:
        if len(value) > MAX_LIST:
            raise ValueError(f"{path}: hyper-parameter `{key}` holds {len(value)} values, more than {MAX_LIST}")
        for v in value:
            _check_value(path, key, v, depth + 1)
        return
    what = "a class_path (a checkpoint may not choose code)" if isinstance(value, dict) \
        and "class_path" in value else type(value).__name__
    raise ValueError(f"{path}: hyper-parameter `{key}` has to be a plain value, got {what}")


def _constructor_args(path: str, cls: type, hparams) -> dict:
    if not isinstance(hparams, dict):
        raise ValueError(f"{path}: the checkpoint's hyper_parameters are not a dict")
    params = inspect.signature(cls.__init__).parameters
    kwargs = {}
    for key, value in hparams.items():
        if key in ("_instantiator", "_class_path"):  # Lightning CLI's records: never imported
            continue
        if key not in params or key in ("self", "scorer"):
            raise ValueError(f"{path}: hyper-parameter {key!r} is not an argument of {cls.__name__}")
        _check_value(path, key, value)
        kwargs[key] = value
    return {**kwargs, **recorded_names(kwargs)}


def _check_shapes(path: str, cls: type, kwargs: dict, ckpt: dict) -> None:
    """Build the model on the meta device and compare each tensor's shape with the file's."""
    import torch

    with torch.device("meta"):
        try:
            probe = cls(**kwargs)
            probe.on_load_checkpoint(ckpt)
        except ValueError as e:  # a hyper-parameter out of its range, said by the class
            raise ValueError(f"{path}: {e}") from None
        except (KeyError, RuntimeError, TypeError, AttributeError, IndexError, NotImplementedError) as e:
            raise ValueError(f"{path}: the checkpoint does not match {cls.__name__}: {type(e).__name__}: "
                             f"{' '.join(str(e).split())[:300]}") from None
    expected = {k: tuple(v.shape) for k, v in probe.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in ckpt["state_dict"].items()}
    for key in sorted(expected.keys() | got.keys()):
        if expected.get(key) != got.get(key):
            raise ValueError(f"{path}: the checkpoint does not match the {cls.__name__} its hyper-parameters "
                             f"describe: tensor {key!r} is {got.get(key, 'missing')} in the file, "
                             f"{expected.get(key, 'absent')} in the model")


#: A checkpoint whose scorer is the user's (its shapes unknown here) may still describe, by its
#: hyper-parameters, a rankkit model the CLI builds: at most this many times the values the file
#: holds, and always 2^22 (16 MiB of float32).
SIZE_PER_STORED, _SIZE_FLOOR = 4, 2**22


def _check_size(path: str, cls: type, kwargs: dict, ckpt: dict) -> None:
    """A checkpoint naming a foreign scorer class skips the shape check (its tensors are that
    scorer's), but its hyper-parameters still size the model a config may build from them: that
    model, counted on the meta device, may not hold far more values than the file does (a 6 KB
    file with ``hidden: [65536, 65536]`` would make the CLI allocate 17 GB per layer)."""
    import torch

    with torch.device("meta"):
        try:
            described = sum(p.numel() for p in cls(**kwargs).state_dict().values())
        except (ValueError, TypeError, RuntimeError) as e:
            raise ValueError(f"{path}: {e}") from None
    stored = sum(t.numel() for t in ckpt.get("state_dict", {}).values() if isinstance(t, torch.Tensor))
    if described > max(_SIZE_FLOOR, SIZE_PER_STORED * stored):
        raise ValueError(f"{path}: its hyper-parameters describe a model of {described} values, the file holds "
                         f"{stored}: more than {SIZE_PER_STORED}x what it stores "
                         f"(rankkit.infra.checkpoint.SIZE_PER_STORED)")


def check_checkpoint(path: str | os.PathLike, *, scorer=None, need_scorer: bool = True):
    """``(checkpoint dict, class, constructor kwargs)`` of a rankkit checkpoint, every check of
    :func:`load_checkpoint` done and nothing of the model allocated yet.

    ``need_scorer`` False (the CLI, whose config supplies the scorer): a checkpoint trained with a
    scorer of the user's is not refused, and its shapes are left to ``load_state_dict``; the model
    its hyper-parameters describe is still sized on the meta device (:func:`_check_size`).
    """
    path = check_local_path(path)
    ckpt = read_checkpoint(path)
    name = ckpt.get(CLASS_KEY)
    if name not in TRAINABLE:
        raise ValueError(f"{path}: not a rankkit model checkpoint (it names no rankkit model class"
                         f"{'' if name is None else ': ' + repr(name)})")
    hparams = ckpt.get("hyper_parameters", {})
    recorded = hparams.get("_class_path") if isinstance(hparams, dict) else None
    if recorded is not None and not (isinstance(recorded, str) and recorded.startswith("rankkit.")
                                     and recorded.rpartition(".")[2] == name.rpartition(".")[2]):
        raise ValueError(f"{path}: the checkpoint's `_class_path` {recorded!r} is not its rankkit class {name!r}")
    cls = _import(name)
    kwargs = _constructor_args(path, cls, hparams)
    state = ckpt.get("rankkit")
    scorer_class = state.get("scorer_class") if isinstance(state, dict) else None
    if scorer is not None:
        kwargs["scorer"] = scorer
    elif scorer_class is not None and not (isinstance(scorer_class, str) and scorer_class.startswith(OWN_SCORERS)):
        if need_scorer:
            raise ValueError(f"{path}: the model was trained with the scorer {scorer_class!r}, which a "
                             f"checkpoint may not build: pass scorer=<a fresh instance> "
                             f"(rankkit.infra.checkpoint.load_checkpoint)")
        _check_size(path, cls, kwargs, ckpt)
        return ckpt, cls, kwargs
    _check_shapes(path, cls, kwargs, ckpt)
    return ckpt, cls, kwargs


def load_checkpoint(path: str | os.PathLike, *, scorer=None):
    """The LightningModule in a rankkit checkpoint, in eval mode on the CPU.

    Args:
        path: a local ``.ckpt`` file written by a rankkit LightningModule.
        scorer: the scorer ``nn.Module`` (freshly built, any weights) when the model was trained
            with a scorer of your own; the checkpoint's weights are loaded into it.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: ``path`` is a URL; the file is not a readable checkpoint, does not name a
            rankkit model, declares a size beyond :data:`LIMITS`, names a class, or its tensors
            do not match the model its hyper-parameters describe.
    """
    path = check_local_path(path)
    ckpt, cls, kwargs = check_checkpoint(path, scorer=scorer)
    try:
        model = cls(**kwargs)
        model.on_load_checkpoint(ckpt)
        model.load_state_dict(ckpt["state_dict"], strict=True)
    except (KeyError, RuntimeError, TypeError, NotImplementedError) as e:
        raise ValueError(f"{path}: the checkpoint does not match {cls.__name__}: {type(e).__name__}: "
                         f"{' '.join(str(e).split())[:300]}") from None
    _check_loaded_values(path, model)
    return model.to("cpu").eval()


def _check_loaded_values(path: str, model) -> None:
    """Every floating tensor of the loaded model finite, and a tree ensemble's trees valid
    (:meth:`rankkit.boosting.ensemble.ObliviousEnsemble.validate`): a checkpoint with a NaN
    weight, leaf, threshold or bias would load and score NaN or inf with exit status 0."""
    import torch

    for name, value in model.state_dict().items():
        if torch.is_tensor(value) and value.is_floating_point() and value.numel():
            bad = ~torch.isfinite(value)
            if name.endswith("thresholds"):
                bad = torch.isnan(value) | (value == -torch.inf)  # +inf is "never right"
            if bool(bad.any()):
                where = ", ".join(map(str, torch.nonzero(bad)[0].tolist()))
                raise ValueError(f"{path}: `{name}` holds {float(value[bad][0])} at [{where}]: the checkpoint's "
                                 f"values are not a usable model")
    scorer = getattr(model, "scorer", None)
    if hasattr(scorer, "validate"):
        try:
            scorer.validate()
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None


def guard_trainer_restore(module) -> None:
    """Make the Trainer running ``module`` check a checkpoint before it restores one.

    Called from a rankkit module's ``setup``, which Lightning runs before it restores
    ``ckpt_path`` (``Trainer.fit/validate/test/predict(..., ckpt_path=...)``); Lightning would fetch
    a URL and unpickle the file with ``weights_only=False``. From here on that Trainer's restore
    first refuses a URL or fsspec chain and reads the file with ``weights_only=True`` as
    :func:`check_checkpoint` does (a rankkit class, its hyper-parameters checked), raising
    ValueError naming ``ckpt_path`` before anything of the file is unpickled.
    """
    trainer = getattr(module, "_trainer", None)
    connector = getattr(trainer, "_checkpoint_connector", None)
    if connector is None or getattr(connector, "_rankkit_guarded", False):
        return
    restore = connector.resume_start

    def checked_resume_start(checkpoint_path=None, *args, **kwargs):
        if checkpoint_path is not None and isinstance(checkpoint_path, (str, os.PathLike)):
            check_checkpoint(checkpoint_path, need_scorer=False)
        return restore(checkpoint_path, *args, **kwargs)

    connector.resume_start = checked_resume_start
    connector._rankkit_guarded = True


def guarded_load_from_checkpoint(cls, checkpoint_path, map_location=None, hparams_file=None, strict=None,
                                 weights_only=None, **kwargs):
    """Lightning's ``load_from_checkpoint`` for rankkit's classes, with :func:`load_checkpoint`'s
    checks first: a local file (a URL would be fetched and unpickled with ``weights_only=False``),
    read with ``weights_only=True``, its class, hyper-parameters and shapes checked
    (:func:`check_checkpoint`; ``scorer=`` in ``kwargs`` is the scorer of your own).

    Raises:
        ValueError: as :func:`check_checkpoint`, or ``weights_only=False`` (rankkit checkpoints
            need no pickle).
    """
    import pytorch_lightning as pl

    if weights_only is False:
        raise ValueError("`weights_only=False` would unpickle the file: rankkit checkpoints hold only tensors and "
                         "plain values, load them with weights_only=True")
    if isinstance(checkpoint_path, (str, os.PathLike)):
        _, _, recorded = check_checkpoint(checkpoint_path, scorer=kwargs.get("scorer"), need_scorer=False)
        # a recorded custom loss stays text: a later Trainer.fit refuses to import it
        kwargs = {**{k: v for k, v in recorded.items() if isinstance(v, RecordedName)}, **kwargs}
    return pl.LightningModule.load_from_checkpoint.__func__(cls, checkpoint_path, map_location, hparams_file,
                                                            strict, weights_only=True, **kwargs)


def guarded_datamodule_load_from_checkpoint(cls, checkpoint_path, map_location=None, hparams_file=None,
                                            weights_only=None, **kwargs):
    """Lightning's ``LightningDataModule.load_from_checkpoint`` for rankkit's data module, through
    the one checkpoint loader every model goes through: a local file only (a URL would be fetched
    and unpickled), read with ``weights_only=True`` (``weights_only=False`` is refused), and its
    recorded data settings plain values within the limits, before the module is built.
    """
    import pytorch_lightning as pl

    if weights_only is False:
        raise ValueError("`weights_only=False` would unpickle the file: rankkit checkpoints hold only tensors and "
                         "plain values, load them with weights_only=True")
    if isinstance(checkpoint_path, (str, os.PathLike)):
        path = check_local_path(checkpoint_path, "checkpoint_path")
        recorded = read_checkpoint(path).get("datamodule_hyper_parameters")
        if not isinstance(recorded, dict):
            raise ValueError(f"{path}: holds no data module settings (`datamodule_hyper_parameters`)")
        for key, value in recorded.items():
            if not isinstance(key, str):
                raise ValueError(f"{path}: a data module setting's name has to be text, got {key!r}")
            _check_value(path, key, value)
    else:
        raise ValueError(f"`checkpoint_path` has to be a local file path, got {type(checkpoint_path).__name__}")
    return pl.LightningDataModule.load_from_checkpoint.__func__(cls, checkpoint_path, map_location, hparams_file,
                                                                weights_only=True, **kwargs)

