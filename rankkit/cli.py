"""The ``rankkit`` command.

``rankkit info [DATA]`` prints a dataset summary. User mistakes (a missing file, a bad
line) end in one clear line on stderr and exit status 2, never a stack trace.
"""
from __future__ import annotations

import argparse
import json
import sys


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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rankkit", description="Learning to rank: RankNet, LambdaRank, LambdaMART.")
    sub = p.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="summarise a dataset (queries, documents, features, labels)")
    info.add_argument("data", nargs="?", default="mq2008",
                      help="'mq2008' (bundled, default) or a LETOR/SVMlight file (.txt, .gz, .bz2)")
    info.add_argument("--fold", type=int, default=1, choices=range(1, 6), help="MQ2008 fold (default 1)")
    info.add_argument("--json", action="store_true", help="print JSON instead of text")
    info.set_defaults(func=cmd_info)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, OSError) as e:
        print(f"rankkit {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
