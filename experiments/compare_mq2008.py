"""The comparison behind README and docs/benchmarks.md: all models, MQ2008, 5 folds x 3 seeds.

    python experiments/compare_mq2008.py --folds 1-5 --seeds 3 --baselines --write

is ``rankkit compare`` (same engine, same configs/) plus ``--write``, which replaces the
``compare`` section of docs/benchmarks.md with the table and links the plots in
results/mq2008/. The tuned rows (``rankkit compare --tune``: an Optuna study per model and fold
on that fold's vali, then every seed trains the best config and is tested once):

    python experiments/compare_mq2008.py --models lambdarank,lambdamart --tune 30 --baselines \
        --out results/mq2008-tuned --section compare_tuned --write

and the same on LightGBM's Yahoo! LTR sample (no vali file: 20 % of the train queries, seed 0):

    python experiments/compare_mq2008.py --data ../shared/data/lightgbm-lambdarank --val-fraction 0.2 \
        --folds 1 --models lambdarank,lambdamart --tune 30 --baselines --out results/yahoo-tuned \
        --section compare_tuned_yahoo --write
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import command_line, publish_image, write_section  # noqa: E402

from rankkit.compare import compare


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--folds", default="1-5")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--baselines", action="store_true")
    p.add_argument("--out", default="results/mq2008")
    p.add_argument("--models", default="ranknet,lambdarank,lambdamart", help="configs, comma-separated")
    p.add_argument("--tune", type=int, default=0, help="nested tuning: Optuna trials per model and fold")
    p.add_argument("--tune-seeds", type=int, default=1, help="with --tune: seeds a trial is scored by")
    p.add_argument("--tune-confirm", type=int, default=0,
                   help="with --tune: refit the best trial and the untuned config with N fresh seeds (rankkit tune --confirm)")
    p.add_argument("--tune-margin", type=float, default=0.0, help="with --tune: rankkit tune --margin")
    p.add_argument("--section", default="compare", help="the docs/benchmarks.md section to write")
    p.add_argument("--data", default="mq2008", help="mq2008, or a folder (LightGBM's Yahoo sample)")
    p.add_argument("--val-fraction", type=float, default=0.0, help="vali carved from train when there is no vali file")
    p.add_argument("--ensemble", action="store_true", help="also each model's seeds averaged (rankkit compare --ensemble)")
    p.add_argument("--title", default="", help="the section's title (default: '<data>: every model')")
    p.add_argument("--write", action="store_true", help="write the table to docs/benchmarks.md")
    args = p.parse_args(argv)
    result = compare(data=args.data, folds=args.folds, seeds=args.seeds, baselines=args.baselines, out=args.out,
                     models=args.models, tune=args.tune, val_fraction=args.val_fraction, ensemble=args.ensemble,
                     tune_seeds=args.tune_seeds, tune_confirm=args.tune_confirm, tune_margin=args.tune_margin)
    print(result["table"])
    if args.write:
        cmd = command_line(__file__, argv)
        table_doc = open(os.path.join(result["out"], "table.md")).read()
        protocol = result["baseline_protocol"]
        baselines = (f" Baselines: library defaults, at most {protocol['rounds']} rounds, stopped after "
                     f"{protocol['patience']} rounds without a better vali NDCG@10 computed by rankkit.metrics "
                     f"(CatBoost grows every round and the rule is applied to its staged vali predictions, so its "
                     f"train time covers all {protocol['rounds']} trees)."
                     if protocol else "")
        name = "MQ2008" if args.data == "mq2008" else f"{os.path.basename(os.path.normpath(args.data))} (Yahoo! LTR sample)"
        title = args.title or (f"{name}: every model" if not args.tune else
                               f"{name}: tuned models (Optuna, {args.tune} trials per model and fold)")
        trained = "its configs/<model>.yaml" if not args.tune else \
            (f"the {'chosen' if args.tune_confirm else 'best'} config of its fold's study (`rankkit tune` on that "
             f"fold's train/vali, the config's search space, seed 0; the study's first trial is the shipped config"
             + (f"; its best trial kept only if, refitted with {args.tune_confirm} fresh seeds, it beat the shipped "
                f"config query by query on vali by more than {args.tune_margin:g} standard error(s)"
                if args.tune_confirm else "") + ")")
        prefix = "mq2008" if args.section == "compare" else (f"mq2008_{args.section}" if args.data == "mq2008" else args.section)
        body = (f"## {title}\n\n{datetime.date.today()}. Command: `{cmd}`\n\n{table_doc}\n"
                f"Each rankkit model is trained with {trained}.{baselines}\n\n"
                f"{publish_image(os.path.join(result['out'], 'val_ndcg10.png'), prefix + '_val_ndcg10.png')}\n\n"
                f"{publish_image(os.path.join(result['out'], 'test_ndcg.png'), prefix + '_test_ndcg.png')}\n")
        write_section(args.section, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
