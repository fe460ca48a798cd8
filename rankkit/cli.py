"""The ``rankkit`` command.

* ``rankkit fit|validate|test|predict --config configs/lambdarank.yaml [--data.fold=2 ...]``:
  Lightning's own :class:`~pytorch_lightning.cli.LightningCLI`, for any of the three models
  (the config's ``model.class_path`` picks RankNet, LambdaRank or LambdaMARTModule).
* ``rankkit export CKPT --format torchscript|export -o scorer.pt``: a checkpoint to a
  features -> scores artefact, checked against the eager model.
* ``rankkit compare --config configs/compare.yaml`` (or ``--data mq2008 --folds 1-5 --seeds 3``):
  see :mod:`rankkit.compare`.
* ``rankkit tune --config lambdarank [--n_trials 30 --data.fold=2 ...]``: an Optuna study on
  vali; see :mod:`rankkit.tune`.
* ``rankkit info [DATA]``: a dataset summary.

User mistakes (a missing file, a bad option or value) end in one line on stderr and exit
status 2, never a stack trace; set ``RANKKIT_DEBUG=1`` to see the trace.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from typing import Any

from rankkit.infra.checkpoint import CLASS_KEY, TRAINABLE, read_checkpoint
from rankkit.infra.io import check_outputs, first_repeat
from rankkit.infra.quiet import verbose as env_verbose
from rankkit.training.run_config import PARSER_SETTINGS, _config_flag, config_names
from rankkit.tune import parse_overrides, tune

COMMANDS = {
    "fit": "train a model (LightningCLI: --config NAME|FILE.yaml, overrides like --data.fold=2; "
           "shows its progress, everything with --verbose, nothing but its last line with --quiet)",
    "validate": "score a checkpoint on the validation set of the data it was trained on (--ckpt_path=FILE; "
                "the checkpoint holds the model and its data, --config may add trainer settings)",
    "test": "score a checkpoint on the test set of the data it was trained on (--ckpt_path=FILE; the "
            "checkpoint holds the model and its data, --config may add trainer settings)",
}
EXPORT_FORMATS = ("torchscript", "export", "onnx")
# The user-facing errors: anything else is a bug and keeps its stack trace. OSError covers a
# full disk (ENOSPC), a file-size limit (EFBIG), a folder that is not writable (EACCES) and a
# file where a folder should be (ENOTDIR); MemoryError an input too large for the machine.
USER_ERRORS = (ValueError, OSError, KeyError, EOFError, UnicodeDecodeError, MemoryError)
# Lightning's own "you configured it wrong" exception, matched by name (no import at start-up).
USER_ERROR_NAMES = ("MisconfigurationException",)


class UsageError(Exception):
    """A mistake on the command line, reported as one line."""


# -- fit / validate / test: LightningCLI ---------------------------------------------------------
def run_lightning(argv: list[str] | None) -> int:
    """``rankkit fit|validate|test``: ``argv`` None reads ``sys.argv``."""
    args = list(sys.argv[1:] if argv is None else argv)
    verbose = "--verbose" in args or env_verbose()
    quiet = "--quiet" in args
    if verbose and quiet:
        raise UsageError("give --verbose or --quiet, not both")
    args = [a for a in args if a not in ("--verbose", "--quiet")]
    helping = any(a in ("-h", "--help") for a in args)
    configured = any(_config_flag(a) or a.split("=")[0] == "--model" for a in args[1:])
    ckpt_path = _ckpt_path(args)
    if args and args[0] in ("validate", "test") and not helping and not configured and ckpt_path is not None:
        # The checkpoint holds the model (its class and arguments) and the data it was trained on.
        args.append(f"--model={checkpoint_class(ckpt_path)}")
        configured = True
    if args and not helping and not configured:
        raise UsageError(f"`rankkit {args[0]}` needs a model and its data: --config NAME (shipped: "
                         f"{', '.join(config_names())}) or --config FILE.yaml, or --model CLASS "
                         f"(`rankkit {args[0]} --help` lists the options)")
    if args and args[0] in ("validate", "test") and not any(a.startswith("--ckpt_path") for a in args) \
            and not any(a in ("-h", "--help") for a in args):
        raise UsageError(f"`rankkit {args[0]}` evaluates a trained model: pass --ckpt_path=PATH/TO/best.ckpt "
                         f"(written by `rankkit fit`)")
    for a in args:  # a checkpoint to resume or evaluate: checked here, so a bad one is one line
        if a.startswith("--ckpt_path="):
            read_checkpoint(a.split("=", 1)[1])
    from rankkit.training.lightning_cli import lightning_cli  # Lightning: only when a run starts

    lightning_cli(args, verbose=verbose, progress=bool(args) and args[0] == "fit" and not quiet)
    return 0


def _ckpt_path(args: list[str]) -> str | None:
    """The ``--ckpt_path`` of a command line (``--ckpt_path=X`` or ``--ckpt_path X``), or None."""
    for i, a in enumerate(args):
        if a.startswith("--ckpt_path="):
            return a.split("=", 1)[1]
        if a == "--ckpt_path" and i + 1 < len(args):
            return args[i + 1]
    return None


def checkpoint_class(path: str) -> str:
    """The rankkit LightningModule class a checkpoint was written by (its import path, one of
    :data:`rankkit.infra.checkpoint.TRAINABLE`; read as text, checked, never imported from the file)."""
    name = read_checkpoint(path).get(CLASS_KEY)
    if name not in TRAINABLE:
        raise ValueError(f"{path}: not a rankkit model checkpoint (it names no rankkit model class); pass "
                         f"--config NAME for the model and its data")
    return name


# -- predict --------------------------------------------------------------------------------------
def cmd_predict(args: argparse.Namespace) -> int:
    from rankkit.serving import predict_file

    check_outputs({"--output": args.output},
                  {"model": args.model, "--input": args.input, "--query-file": args.query_file})
    try:
        n = predict_file(args.model, args.input, None if args.output in (None, "-") else args.output,
                         query_file=args.query_file, trust_torchscript=args.trust_torchscript)
    except Exception as e:
        if type(e).__module__.startswith("onnxruntime"):  # e.g. a file of another width
            import re

            m = re.search(r"index: 1 Got: (\d+) Expected: (\d+)", str(e))
            why = f"it has {m.group(1)} features, the model takes {m.group(2)}" if m else _one_line(e)
            raise ValueError(f"`--input` {args.input} does not fit the ONNX model {args.model}: {why}") from None
        raise
    if args.output not in (None, "-"):
        print(f"wrote {n} scores (qid, doc, score; input order) to {args.output}", file=sys.stderr)
    return 0


# -- export ---------------------------------------------------------------------------------------
def export_model(model_path: str | list[str], output: str, fmt: str = "torchscript") -> dict[str, Any]:
    """Export the trained model at ``model_path`` (a checkpoint or a LambdaMART model file) to
    ``output`` and check the artefact against the eager model. Several paths export one scorer,
    the mean of their scores (:class:`rankkit.scorers.MeanEnsemble`: seeds or configs averaged,
    as ``rankkit compare`` ensembles them).

    Returns ``{"path", "bytes", "max_abs_diff", "n_features", "model"}``.
    """
    import torch

    from rankkit.export import EXPORTERS, load_scorer, serving_module

    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"`--format` has to be one of {EXPORT_FORMATS}, got {fmt!r}")
    check_export_suffix(output, fmt)
    model = _exported_model([model_path] if isinstance(model_path, (str, os.PathLike)) else list(model_path))
    EXPORTERS[fmt](model, output)
    try:  # the artefact is kept only once it reloads and scores as the eager model does
        eager = serving_module(model)
        inputs = _check_inputs(eager)
        try:
            with torch.no_grad():
                served = torch.as_tensor(load_scorer(output, trust_torchscript=True)(*inputs))  # just written
                diff = float((served - eager(*inputs)).abs().max())
        except Exception as e:  # noqa: BLE001 -- any failure to reload or score is the check failing
            raise ValueError(f"the exported scorer failed its reload check ({type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''}); {output} removed") from None
        if not diff <= 1e-4:
            raise ValueError(f"the exported scorer differs from the eager model by {diff:.3g}; {output} removed")
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(output)
        raise
    return {"path": output, "bytes": os.path.getsize(output), "max_abs_diff": diff,
            "n_features": eager.n_features, "model": type(model).__name__}


def _check_inputs(eager) -> tuple:
    """What the reload check scores: 64 documents [64, F] for a pointwise scorer; for a
    list-aware one (its exported program takes a padded batch), 4 queries of up to 16
    documents [4, 16, F] with their mask, some padded."""
    import torch

    from rankkit.export import is_list_aware

    g = torch.Generator().manual_seed(0)
    if not is_list_aware(eager):
        return (torch.randn(64, eager.n_features, generator=g).abs() * 3,)
    x = torch.randn(4, 16, eager.n_features, generator=g).abs() * 3
    return x, torch.arange(16) < torch.tensor([16, 9, 1, 12])[:, None]


def _exported_model(paths: list[str]):
    """The trained model of one path, or the :class:`rankkit.scorers.MeanEnsemble` of several's
    serving scorers (every one taking the first's feature count; ValueError naming the first that
    does not)."""
    from rankkit.export import serving_module
    from rankkit.scorers import MeanEnsemble
    from rankkit.serving import load_model

    if not paths:
        raise ValueError("`model`: give at least one trained model")
    for path in paths:
        if os.fspath(path).endswith(tuple(EXPORT_SUFFIXES.values())):
            raise ValueError(f"`model` {path} is an exported scorer already; export takes what training wrote "
                             f"(a .ckpt checkpoint or a LambdaMART model file)")
    if len(paths) == 1:
        return load_model(paths[0])
    twice = first_repeat(paths)
    if twice is not None:
        raise ValueError(f"`model` names {paths[twice]} twice: an ensemble averages different models")
    scorers = [serving_module(load_model(p)) for p in paths]
    for path, scorer in zip(paths[1:], scorers[1:]):
        if scorer.n_features != scorers[0].n_features:
            raise ValueError(f"`model`: {path} takes {scorer.n_features} features and {paths[0]} "
                             f"{scorers[0].n_features}; an ensemble averages scorers of one feature count")
    return MeanEnsemble(scorers).eval()


#: The file name ending each export format is read back by (``load_scorer`` and servers go by it).
EXPORT_SUFFIXES = {"torchscript": ".pt", "export": ".pt2", "onnx": ".onnx"}


def check_export_suffix(output: str, fmt: str) -> None:
    """Refuse, before anything is written, an output whose extension names another format (a
    ``torch.export`` program in ``x.pt`` would be read back as TorchScript and fail)."""
    suffix = os.path.splitext(str(output))[1].lower()
    owner = next((f for f, s in EXPORT_SUFFIXES.items() if s == suffix), None)
    if owner is not None and owner != fmt:
        raise ValueError(f"`--output` {output} ends in {suffix}, the extension of --format {owner}, but "
                         f"--format is {fmt}: name it {os.path.splitext(str(output))[0]}{EXPORT_SUFFIXES[fmt]} "
                         f"or choose --format {owner}")
    if owner is None:
        raise ValueError(f"`--output` {output}: an export with --format {fmt} has to end in {EXPORT_SUFFIXES[fmt]} "
                         f"(how it is read back)")


def cmd_export(args: argparse.Namespace) -> int:
    suffix = EXPORT_SUFFIXES[args.format]
    models = list(args.model)
    if len(models) > 1 and not args.output:
        raise UsageError("several models export one averaged scorer: name it with -o/--output")
    out = args.output or os.path.splitext(models[0])[0] + suffix

    check_outputs({"--output" if args.output else "the default output": out}, {"model": models})
    r = export_model(models if len(models) > 1 else models[0], out, args.format)
    what = r["model"] if len(models) == 1 else f"the mean of {len(models)} models"
    print(f"{what} -> {r['path']} ({r['bytes'] / 1024:.1f} KiB, {r['n_features']} features; "
          f"reloaded, max |exported - eager| = {r['max_abs_diff']:.2g})")
    return 0


# -- compare --------------------------------------------------------------------------------------
def cmd_compare(args: argparse.Namespace) -> int:
    from rankkit.compare.command import compare_from_args

    return compare_from_args(args.rest)


# -- tune -----------------------------------------------------------------------------------------
TUNE_OVERRIDES = ("--model.", "--data.", "--trainer.", "--seed_everything")


def tune_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="rankkit tune",
                description="Search a config's hyper-parameters with Optuna: each trial fits the config on the "
                            "train split with the trial's values and scores its best epoch on the vali split "
                            "(never the test split); bad trials are pruned on their vali curve. Writes OUT/"
                            "best.yaml (for `rankkit fit --config` and `rankkit compare --models`), "
                            "OUT/trials.md, OUT/trials.json and OUT/history.png; the study lives in "
                            "OUT/study.db, so the same command resumes it. Settings such as --data.fold=2 "
                            "apply to every trial.")
    p.add_argument("--config", required=True,
                   help="a packaged config (lambdarank, ranknet, transformer, lambdamart) or a YAML path")
    p.add_argument("--space", default=None,
                   help="the search-space YAML (default: beside the config, NAME.space.yaml)")
    p.add_argument("--n_trials", "--n-trials", type=int, default=30,
                   help="the study's total number of trials, the untuned config first (default 30)")
    p.add_argument("--timeout", type=float, default=None, help="seconds in which to start new trials")
    p.add_argument("--seed", type=int, default=0, help="seeds the sampler and every trial (default 0)")
    p.add_argument("--out", default=None,
                   help="output folder (default results/tune/NAME; NAME-DATA-foldF for data other than MQ2008 "
                        "fold 1); a study there is resumed only for the data and metric it was run with")
    p.add_argument("--storage", default=None, help="an Optuna storage URL (default sqlite:///OUT/study.db)")
    p.add_argument("--study_name", "--study-name", default=None, help="the study's name (default NAME)")
    p.add_argument("--metric", default=None,
                   help="the logged vali metric to maximise (default: what the config's ModelCheckpoint monitors, "
                        "else val/ndcg@10)")
    p.add_argument("--trial_seeds", "--trial-seeds", type=int, default=2,
                   help="score each trial by the mean of N seeds' best vali (default 2; 1 for the quick study)")
    p.add_argument("--folds", default="auto",
                   help="score each trial by the mean best vali over these folds, e.g. 1-5 or 1,3 (as lgb.cv; "
                        "N folds x --trial_seeds fits per trial); default auto: every fold of data with several "
                        "(MQ2008, a LETOR root) unless --data.fold is given; none: the config's one fold")
    p.add_argument("--confirm", type=int, default=None,
                   help="after the study, refit its best trial and the untuned config with N fresh seeds and keep the "
                        "best only if it beats the untuned config there, query by query on vali, by more than "
                        "--margin standard errors (default 3 where the study maximises val/ndcg@10, else 0; 0: no "
                        "refits)")
    p.add_argument("--margin", type=float, default=1.0,
                   help="the standard errors the best trial has to win by (default 1): on --confirm's refits, or with "
                        "--confirm 0 on the study's own paired fits (--folds, --trial_seeds); 0: the best mean wins. "
                        "The quick study of one fit a trial: --folds none --trial_seeds 1 --confirm 0 --margin 0")
    p.add_argument("--top_k", "--top-k", type=int, default=1,
                   help="also write the K best trials' configs (OUT/top/) and OUT/ensemble.yaml naming them, "
                        "which `rankkit compare --models` trains as one averaged scorer (default 1: best.yaml only)")
    p.add_argument("--pruner", default="median", choices=("median", "none"),
                   help="median: stop a trial below the median of earlier trials at the same epoch")
    p.add_argument("--quiet", action="store_true", help="print only the last line")
    return p


def cmd_tune(argv: list[str]) -> int:
    args, rest = tune_parser().parse_known_args(argv)

    try:
        overrides = parse_overrides(rest)
    except ValueError as e:
        raise UsageError(f"unrecognized arguments: {' '.join(rest)} ({e})") from None
    bad = [k for k in overrides if not f"--{k}".startswith(TUNE_OVERRIDES)]
    if bad:
        raise UsageError(f"unrecognized arguments: --{bad[0]} (settings for every trial start with "
                         f"{', '.join(TUNE_OVERRIDES)})")
    try:
        import optuna  # noqa: F401  (rankkit.tune imports it when a study starts)
    except ImportError as e:
        raise UsageError(f"`rankkit tune` needs Optuna ({e}): pip install 'rankkit[tune]'") from None

    result = tune(args.config, space=args.space, n_trials=args.n_trials, timeout=args.timeout, seed=args.seed,
                  out=args.out, storage=args.storage, study_name=args.study_name, overrides=overrides,
                  metric=args.metric, pruner=args.pruner, trial_seeds=args.trial_seeds, folds=args.folds,
                  top_k=args.top_k, margin=args.margin, confirm=args.confirm, command="rankkit tune " + " ".join(argv),
                  log=(lambda line: None) if args.quiet else print)
    why = "not confirmed on refits" if result.confirmation else "within the margin"
    chosen = (f"kept the untuned config (trial {result.trial}, {result.metric} {result.best_value:.4f} on vali; the "
              f"best trial {result.study.best_trial.number} scored {result.study.best_value:.4f}, {why})"
              if result.kept_untuned else f"best {result.metric} {result.best_value:.4f} on vali")  # --margin's choice
    print(f"{chosen}: {result.best_config} (trials: {result.out / 'trials.md'})")
    if result.ensemble_config is not None:
        print(f"the best trials as an ensemble: rankkit compare --models {result.ensemble_config}")
    return 0


# -- info -----------------------------------------------------------------------------------------
def _load_for_info(data: str, fold: int):
    if data == "mq2008":
        from rankkit.data.bundled import load_mq2008

        return dict(zip(("train", "vali", "test"), load_mq2008(fold)))
    if os.path.isdir(data):  # a folder of train/vali/test files, or a LETOR root's fold
        from rankkit.training.datamodule import RankingDataModule

        dm = RankingDataModule(data=data, fold=fold)
        dm.setup()
        return {name: ds for name, ds in (("train", dm.train_set), ("vali", dm.val_set), ("test", dm.test_set))
                if ds is not None}
    from rankkit.data.svmlight import read_svmlight

    return {data: read_svmlight(data)}


def _format_summary(name: str, s: dict) -> str:
    dpq = s["docs_per_query"]
    labels = ", ".join(f"{k}: {v}" for k, v in s["labels"].items())
    return (f"{name}: {s['queries']} queries, {s['documents']} documents, {s['features']} features\n"
            f"  docs per query: min {dpq['min']}, mean {dpq['mean']}, max {dpq['max']}\n"
            f"  labels: {labels}\n"
            f"  queries with no relevant document: {s['queries_without_relevant_docs']}")


def cmd_info(args: argparse.Namespace) -> int:
    sets = _load_for_info(args.data, args.fold)
    summaries = {name: ds.summary() for name, ds in sets.items()}
    if args.json:
        print(json.dumps(summaries, indent=2))
    else:
        title = f"MQ2008 fold {args.fold} (bundled)" if args.data == "mq2008" else args.data
        if args.data != "mq2008" and os.path.isdir(args.data):
            from rankkit.training.datamodule import available_folds

            title += f" fold {args.fold}" if available_folds(args.data) else ""
        print(title)
        for name, s in summaries.items():
            print(_format_summary(name, s))
    return 0


# -- the command ----------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{**PARSER_SETTINGS, **kwargs})

    def error(self, message: str):
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="rankkit", description="Learning to rank: RankNet, LambdaRank, LambdaMART.",
                epilog="`rankkit COMMAND --help` describes each command.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    for name, text in COMMANDS.items():
        sub.add_parser(name, help=text, add_help=False)
    predict = sub.add_parser("predict", help="score a LETOR/SVMlight file with any trained model",
                             description="Score every document of a LETOR/SVMlight file with a trained "
                                         "model (a checkpoint, a LambdaMART model file or an exported "
                                         "scorer); one line per document, in input order: "
                                         "qid<TAB>doc<TAB>score, doc being the 0-based position of the "
                                         "document within its query in the file.")
    predict.add_argument("model", help="a .ckpt, a LambdaMART .safetensors file, or a .pt/.pt2/.onnx scorer")
    predict.add_argument("--input", required=True, help="a LETOR/SVMlight file (.txt, .gz, .bz2)")
    predict.add_argument("--query-file", "--query_file", default=None,
                         help="a LightGBM .query sidecar (default: FILE.query when it exists)")
    predict.add_argument("-o", "--output", default=None, help="output file ('-' or none: stdout)")
    predict.add_argument("--trust-torchscript", "--trust_torchscript", action="store_true",
                         help="load a TorchScript .pt scorer: loading one runs code from the file, so it is "
                              "refused unless you trust its source (.pt2, .onnx, .ckpt and LambdaMART files "
                              "load without running anything)")
    predict.set_defaults(func=cmd_predict)
    export = sub.add_parser("export", help="export a trained model as a TorchScript / torch.export / ONNX scorer",
                            description="Export a trained model as a plain features [N, F] -> scores [N] "
                                        "module, reload it and check it against the eager model.")
    export.add_argument("model", nargs="+",
                        help="a checkpoint written by `rankkit fit` or a LambdaMART model file; several (seeds, "
                             "or the configs of `rankkit tune --top_k`) export the mean of their scores as one "
                             "scorer (needs -o)")
    export.add_argument("--format", default="torchscript", choices=EXPORT_FORMATS,
                        help="torchscript (torch.jit.load), export (torch.export, .pt2) or onnx")
    export.add_argument("-o", "--output", default=None,
                        help="output file (default: MODEL with .pt/.pt2/.onnx; required for several models)")
    export.set_defaults(func=cmd_export)
    compare = sub.add_parser("compare", add_help=False,
                             help="train every model on every fold and seed; table, plots, exports")
    compare.set_defaults(func=cmd_compare)
    sub.add_parser("tune", add_help=False, help="search a config's hyper-parameters with Optuna on vali; "
                                                 "writes the best config")
    info = sub.add_parser("info", help="summarise a dataset (queries, documents, features, labels)",
                          description="Summarise a dataset: queries, documents, features, the label "
                                      "distribution and query lengths of each split, and the checks its "
                                      "files pass; MQ2008 (bundled) by default.")
    info.add_argument("data", nargs="?", default="mq2008",
                      help="'mq2008' (bundled, default), a LETOR/SVMlight file (.txt, .gz, .bz2), a folder "
                           "of train/vali/test files or a LETOR root of Fold1..FoldN folders")
    info.add_argument("--fold", type=int, default=1,
                      help="the fold of MQ2008 (1..5) or of a LETOR root (Fold1..FoldN); default 1")
    info.add_argument("--json", action="store_true", help="print JSON instead of text")
    info.set_defaults(func=cmd_info)
    return p


def _is_user_error(e: BaseException) -> bool:
    return isinstance(e, (UsageError, argparse.ArgumentError, *USER_ERRORS)) or \
        any(c.__name__ in USER_ERROR_NAMES for c in type(e).__mro__)


def _one_line(e: BaseException) -> str:
    if isinstance(e, MemoryError):
        return f"out of memory ({e})" if str(e) else "out of memory"
    if isinstance(e, OSError) and e.strerror and type(e) is OSError:  # ENOSPC, EFBIG, ...: "PATH: reason"
        return f"{e.filename}: {e.strerror}" if e.filename else e.strerror
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 300 else text[:297] + "..."


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Python is, as Ctrl-C raises KeyboardInterrupt: every layer that
    cleans up after an interrupt (Lightning's graceful shutdown, Optuna marking the trial
    failed, the atomic writes removing their temporary files) does so for SIGTERM too."""


@contextlib.contextmanager
def _signals(received: list[int]):
    """SIGINT and SIGTERM raise :class:`KeyboardInterrupt` / :class:`Terminated` while a command
    runs, and are recorded in ``received`` (Lightning turns an interrupt into ``sys.exit(1)``);
    the previous handlers come back afterwards. Only in the main thread (where Python runs
    signal handlers)."""
    import signal
    import threading

    def handler(signum, frame):
        received.append(signum)
        raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _stopped(where: str, signum: int) -> int:
    """The one line and the exit status of a command stopped by a signal (128 + its number, what a
    shell reports): nothing half-written stays, every output is written atomically."""
    import signal

    print(f"{where}: {'terminated' if signum == signal.SIGTERM else 'interrupted'}", file=sys.stderr)
    return 128 + signum


def main(argv: list[str] | None = None) -> int:
    received: list[int] = []
    args = sys.argv[1:] if argv is None else list(argv)
    command = args[0] if args else None
    where = f"rankkit {command}" if command and not command.startswith("-") else "rankkit"
    with _signals(received):
        try:
            return _main(argv)
        except KeyboardInterrupt as e:
            return _stopped(where, 15 if isinstance(e, Terminated) else 2)
        except SystemExit as e:  # Lightning's exit after an interrupt it handled itself
            if received and e.code not in (0, None):
                return _stopped(where, received[-1])
            raise


def _main(argv: list[str] | None = None) -> int:
    from_sys = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv else None
    try:
        if command in COMMANDS:
            return run_lightning(None if from_sys else argv)
        parser = build_parser()
        if command == "compare":
            args = argparse.Namespace(command=command, func=cmd_compare, rest=argv[1:])
        elif command == "tune":
            return cmd_tune(argv[1:])
        else:
            args = parser.parse_args(argv)
        return args.func(args)
    except BrokenPipeError:
        # The reader went away (`rankkit predict ... | head`): stop quietly, as `cat` does.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 141  # 128 + SIGPIPE, what a shell reports for a writer killed by the closed pipe
    except Exception as e:
        if os.environ.get("RANKKIT_DEBUG") or not _is_user_error(e):
            raise
        where = f"rankkit {command}" if command and not command.startswith("-") else "rankkit"
        print(f"{where}: error: {_one_line(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
