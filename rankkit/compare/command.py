"""The ``rankkit compare`` command: its parser (``--config compare.yaml`` plus overrides) and run."""
from __future__ import annotations

from pathlib import Path

from rankkit.compare.protocol import MODELS, compare
from rankkit.infra import yaml as _yaml
from rankkit.infra.quiet import verbose
from rankkit.training.run_config import PARSER_SETTINGS, resolve_config_args


def build_compare_parser():
    """The ``rankkit compare`` parser (jsonargparse: ``--config compare.yaml`` plus overrides)."""
    from jsonargparse import ActionConfigFile, ArgumentParser

    _yaml.install()  # the YAML limits for --config and every value jsonargparse parses
    p = ArgumentParser(prog="rankkit compare", exit_on_error=False, **PARSER_SETTINGS,
                       description="Train RankNet, LambdaRank and LambdaMART (and optionally LightGBM, "
                                   "XGBoost, CatBoost) on the same folds and seeds; write metrics.json, "
                                   "a Markdown table, PNG plots and verified TorchScript scorers.")
    p.add_argument("--config", action=ActionConfigFile, help="a YAML with any of the options below")
    p.add_argument("--data", type=str, default="mq2008",
                   help="'mq2008' (bundled), a folder of train/vali/test LETOR files, or a LETOR root of "
                        "Fold1..FoldN folders (MSLR-WEB, MQ2007/8, OHSUMED, Istella)")
    p.add_argument("--folds", type=str, default="1", help="folds of MQ2008 or of the root: '1-5', '1,3' or '2'")
    p.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1 per fold")
    p.add_argument("--models", type=str | list[str], default=list(MODELS),
                   help="model names (ranknet, lambdarank, lambdamart: configs/<name>.yaml), config "
                        "paths, or ensemble files (`rankkit tune --top_k K` writes OUT/ensemble.yaml), comma-separated")
    p.add_argument("--baselines", action="store_true", help="add LightGBM/XGBoost/CatBoost rows where installed")
    p.add_argument("--out", type=str | None, default=None, help="output folder (default results/compare-<time>)")
    p.add_argument("--max_epochs", "--max-epochs", type=int | None, default=None,
                   help="cap every model's epochs / trees and the baselines' rounds (quick runs)")
    p.add_argument("--val_fraction", "--val-fraction", type=float, default=0.0,
                   help="data without a vali file: hold out this fraction of the training queries (the same "
                        "for every model and seed) for model selection")
    p.add_argument("--verbose", action="store_true",
                   help="show Lightning's info lines and warnings (or RANKKIT_VERBOSE=1)")
    p.add_argument("--tune", type=int, default=0,
                   help="nested tuning: an Optuna study of N trials per model and fold on that fold's train/vali "
                        "(rankkit tune, the model's search space), then the seeds train the best config and are "
                        "tested once; 0 (default) trains the configs as they are")
    p.add_argument("--tune_seeds", "--tune-seeds", type=int, default=1,
                   help="with --tune: score each trial by the mean of N seeds' fits (steadier, N× the time)")
    p.add_argument("--tune_confirm", "--tune-confirm", type=int, default=0,
                   help="with --tune: refit each study's best trial and the untuned config with N fresh seeds and "
                        "keep the best only if it wins there (rankkit tune --confirm; default 0: no refits)")
    p.add_argument("--tune_margin", "--tune-margin", type=float, default=0.0,
                   help="with --tune: rankkit tune --margin (standard errors the best trial must win by)")
    p.add_argument("--ensemble", action="store_true",
                   help="with --seeds N > 1: also each model's N seeds averaged into one exported scorer per fold")
    return p


def compare_from_args(argv: list[str]) -> int:
    """``rankkit compare ...``: parse, run, print the table and where everything went."""
    args = build_compare_parser().parse_args(resolve_config_args(argv))
    kwargs = {k: v for k, v in args.as_dict().items() if k not in ("config", "__path__")}
    if not kwargs.get("verbose"):
        kwargs["verbose"] = verbose()  # RANKKIT_VERBOSE=1, as --verbose
    result = compare(**kwargs)
    print()
    print(result["table"])
    print(f"\nwrote {result['out']}/: metrics.json, table.md, {''.join(Path(p).name + ', ' for p in result['plots'])}"
          f"scorers/ (each reloaded and checked against its eager scores); wall {result['wall_seconds']:.0f} s")
    return 0
