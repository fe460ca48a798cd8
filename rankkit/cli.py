"""The ``rankkit`` command.

* ``rankkit fit|validate|test|predict --config configs/lambdarank.yaml [--data.fold=2 ...]``:
  Lightning's own :class:`~pytorch_lightning.cli.LightningCLI`, for any of the three models
  (the config's ``model.class_path`` picks RankNet, LambdaRank or LambdaMARTModule).
* ``rankkit export CKPT --format torchscript|export -o scorer.pt``: a checkpoint to a
  features -> scores artefact, checked against the eager model.
* ``rankkit compare --config configs/compare.yaml`` (or ``--data mq2008 --folds 1-5 --seeds 3``):
  see :mod:`rankkit.compare`.
* ``rankkit info [DATA]``: a dataset summary.

User mistakes (a missing file, a bad option or value) end in one line on stderr and exit
status 2, never a stack trace; set ``RANKKIT_DEBUG=1`` to see the trace.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from typing import Any

LIGHTNING_COMMANDS = {
    "fit": "train a model (LightningCLI: --config configs/<model>.yaml, overrides like --data.fold=2)",
    "validate": "evaluate a checkpoint on the validation set (--config ... --ckpt_path=...)",
    "test": "evaluate a checkpoint on the test set (--config ... --ckpt_path=...)",
    "predict": "score the test set with a checkpoint and write one score per line",
}
EXPORT_FORMATS = ("torchscript", "export")
# The user-facing errors: anything else is a bug and keeps its stack trace.
USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError,
               KeyError)


class UsageError(Exception):
    """A mistake on the command line, reported as one line."""


# -- fit / validate / test / predict: LightningCLI ----------------------------------------------
def model_classes() -> dict[str, type]:
    """The trainable LightningModules by config name (imported so ``--model=LambdaRank`` resolves)."""
    from rankkit.boosting.module import LambdaMARTModule
    from rankkit.neural import LambdaRank, RankNet

    return {"ranknet": RankNet, "lambdarank": LambdaRank, "lambdamart": LambdaMARTModule}


def lightning_cli(args: list[str] | None, *, run: bool = True):
    """Build rankkit's LightningCLI on ``args`` (with a subcommand when ``run``).

    ``rankkit compare`` calls it with ``run=False`` so each model is configured exactly as
    ``rankkit fit --config`` would configure it.
    """
    import pytorch_lightning as pl
    from pytorch_lightning.cli import LightningCLI

    from rankkit.data.datamodule import RankingDataModule

    model_classes()

    class RankkitCLI(LightningCLI):
        def predict(self, model, datamodule=None, ckpt_path=None, **kwargs):
            batches = self.trainer.predict(model, datamodule=datamodule, ckpt_path=ckpt_path, **kwargs)
            from rankkit.export import _atomic_write

            out = os.path.join(self.trainer.default_root_dir, "predictions.txt")

            def write(tmp: str) -> None:
                with open(tmp, "w") as f:
                    for scores in batches:
                        f.writelines(f"{float(s):.9g}\n" for s in scores)  # float32 round-trips

            _atomic_write(out, write)
            print(f"wrote {sum(len(b) for b in batches)} scores (test set, query order) to {out}")

    parser_kwargs: dict[str, Any] = {"exit_on_error": False}  # errors raise: main prints one line
    if run:
        parser_kwargs.update({name: {"exit_on_error": False} for name in LIGHTNING_COMMANDS})
    with warnings.catch_warnings():
        # LightningCLI warns whenever `args` is given while sys.argv holds anything (pytest, compare).
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
        return RankkitCLI(pl.LightningModule, RankingDataModule, subclass_mode_model=True, args=args, run=run,
                          save_config_kwargs={"overwrite": True}, parser_kwargs=parser_kwargs)


def run_lightning(argv: list[str] | None) -> int:
    """``rankkit fit|validate|test|predict``: ``argv`` None reads ``sys.argv``."""
    lightning_cli(argv)
    return 0


# -- export ---------------------------------------------------------------------------------------
def load_checkpoint(path: str):
    """The LightningModule in a rankkit checkpoint, in eval mode on the CPU."""
    import torch

    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such checkpoint: {path}")
    try:
        # weights_only: a checkpoint is tensors and plain containers; never unpickle code from it.
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        keys = ckpt["state_dict"].keys()
    except Exception as e:  # noqa: BLE001 - any unreadable file is the user's mistake here
        raise ValueError(f"{path} is not a Lightning checkpoint ({type(e).__name__})") from None
    classes = model_classes()
    if any(k.startswith("ensemble.") for k in keys):
        cls = classes["lambdamart"]
    elif any(k.startswith("scorer.") for k in keys):
        weighting = ckpt.get("hyper_parameters", {}).get("weighting", "ranknet")
        cls = classes["ranknet" if weighting == "ranknet" else "lambdarank"]
    else:
        raise ValueError(f"{path} holds no rankkit model (no scorer or ensemble weights)")
    return cls.load_from_checkpoint(path, map_location="cpu", weights_only=True).eval()


def export_checkpoint(ckpt: str, output: str, fmt: str = "torchscript") -> dict[str, Any]:
    """Export ``ckpt`` to ``output`` and check the artefact against the eager model.

    Returns ``{"path", "bytes", "max_abs_diff", "n_features", "model"}``.
    """
    import torch

    from rankkit.export import export_program, export_torchscript, load_scorer, serving_module

    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"`--format` has to be one of {EXPORT_FORMATS}, got {fmt!r}")
    model = load_checkpoint(ckpt)
    (export_torchscript if fmt == "torchscript" else export_program)(model, output)
    eager = serving_module(model)
    x = torch.randn(64, eager.n_features, generator=torch.Generator().manual_seed(0)).abs() * 3
    with torch.no_grad():
        diff = float((load_scorer(output)(x) - eager(x)).abs().max())
    if not diff <= 1e-4:
        raise RuntimeError(f"exported scorer differs from the eager model by {diff:.3g}")
    return {"path": output, "bytes": os.path.getsize(output), "max_abs_diff": diff,
            "n_features": eager.n_features, "model": type(model).__name__}


def cmd_export(args: argparse.Namespace) -> int:
    out = args.output or os.path.splitext(args.ckpt)[0] + (".pt" if args.format == "torchscript" else ".pt2")
    r = export_checkpoint(args.ckpt, out, args.format)
    print(f"{r['model']} -> {r['path']} ({r['bytes'] / 1024:.1f} KiB, {r['n_features']} features; "
          f"reloaded, max |exported - eager| = {r['max_abs_diff']:.2g})")
    return 0


# -- compare --------------------------------------------------------------------------------------
def cmd_compare(args: argparse.Namespace) -> int:
    from rankkit.compare import compare_from_args

    return compare_from_args(args.rest)


# -- info -----------------------------------------------------------------------------------------
def _load_for_info(data: str, fold: int):
    if data == "mq2008":
        from rankkit.data.bundled import load_mq2008

        return dict(zip(("train", "vali", "test"), load_mq2008(fold)))
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
        print(title)
        for name, s in summaries.items():
            print(_format_summary(name, s))
    return 0


# -- the command ----------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="rankkit", description="Learning to rank: RankNet, LambdaRank, LambdaMART.",
                epilog="`rankkit COMMAND --help` describes each command.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    for name, text in LIGHTNING_COMMANDS.items():
        sub.add_parser(name, help=text, add_help=False)
    export = sub.add_parser("export", help="export a checkpoint as a TorchScript / torch.export scorer",
                            description="Export a checkpoint as a plain features [N, F] -> scores [N] "
                                        "module, reload it and check it against the eager model.")
    export.add_argument("ckpt", help="a checkpoint written by `rankkit fit` or `rankkit compare`")
    export.add_argument("--format", default="torchscript", choices=EXPORT_FORMATS,
                        help="torchscript (torch.jit.load) or export (torch.export, .pt2)")
    export.add_argument("-o", "--output", default=None, help="output file (default: CKPT with .pt/.pt2)")
    export.set_defaults(func=cmd_export)
    compare = sub.add_parser("compare", add_help=False,
                             help="train every model on every fold and seed; table, plots, exports")
    compare.set_defaults(func=cmd_compare)
    info = sub.add_parser("info", help="summarise a dataset (queries, documents, features, labels)")
    info.add_argument("data", nargs="?", default="mq2008",
                      help="'mq2008' (bundled, default) or a LETOR/SVMlight file (.txt, .gz, .bz2)")
    info.add_argument("--fold", type=int, default=1, choices=range(1, 6), help="MQ2008 fold (default 1)")
    info.add_argument("--json", action="store_true", help="print JSON instead of text")
    info.set_defaults(func=cmd_info)
    return p


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def main(argv: list[str] | None = None) -> int:
    from_sys = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv else None
    try:
        if command in LIGHTNING_COMMANDS:
            return run_lightning(None if from_sys else argv)
        parser = build_parser()
        if command == "compare":
            args = argparse.Namespace(command=command, func=cmd_compare, rest=argv[1:])
        else:
            args = parser.parse_args(argv)
        return args.func(args)
    except (UsageError, argparse.ArgumentError, *USER_ERRORS) as e:
        if os.environ.get("RANKKIT_DEBUG"):
            raise
        where = f"rankkit {command}" if command and not command.startswith("-") else "rankkit"
        print(f"{where}: error: {_one_line(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
