"""Which study generalises: one fold, several folds, or several folds x seeds? (issue 50)

Nested, so that no test query is ever tuned on. For each outer split, the queries it may train
on are cut into K inner folds (each part the vali split once, the others its training split):

* MQ2008: the outer split is a LETOR fold k (train, vali, test); the four partitions that are
  not its test split are the inner parts (LETOR's folds rotate five partitions; fold j's test
  file is one of them), so K = 4.
* a folder of ``train``/``test`` files (the Yahoo! LTR sample with ``.query`` files): the
  training file's queries are cut into K = 5 parts at random (seed 0); the outer split is the
  folder itself, its vali split ``--val_fraction`` of the training queries (seed 0), as
  ``rankkit compare`` makes it.

Three studies of ``--trials`` trials of the config and its packaged search space (seed 0) then
run on the inner folds: **one fold** (inner fold 1, the usual single-fold study), **folds**
(``--folds 1-K``: a trial scored by the mean of the K best vali values, as ``lgb.cv``), and
**folds x seeds** (the same with ``--trial_seeds 2``). ``rankkit compare`` trains the shipped
config and each study's ``best.yaml`` on the outer split's train/vali and scores its test split.
Test NDCG@10: exp gain 2^rel - 1, discount 1/log2(1 + rank), a query with nothing relevant
scores 1.

    python experiments/tune_generalisation.py --data mq2008 --trials 15 --write
    python experiments/tune_generalisation.py --data ../shared/data/lightgbm-lambdarank --trials 15 --write
"""
from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import command_line, write_section  # noqa: E402

from rankkit.compare.protocol import compare  # noqa: E402
from rankkit.data.bundled import mq2008_partition_path  # noqa: E402
from rankkit.tune import tune  # noqa: E402

MODES = {"one fold": dict(folds=None, trial_seeds=1), "folds": dict(folds="all", trial_seeds=1),
         "folds x seeds": dict(folds="all", trial_seeds=2),
         # the same study, its config chosen by the one-standard-error rule (`rankkit tune --margin 1`):
         # the untuned config unless the best trial beats it beyond one standard error of the paired fits
         "folds x seeds, 1 SE": dict(folds="all", trial_seeds=2, margin=1.0, study="folds x seeds"),
         # the same study, its best trial refitted with 3 fresh seeds on every inner fold beside the
         # untuned config and kept only if it wins by more than one standard error over the inner
         # folds' vali queries (`rankkit tune --confirm 3 --margin 1`)
         "folds x seeds, confirmed": dict(folds="all", trial_seeds=2, margin=1.0, confirm=3, study="folds x seeds")}


def _queries(path: Path) -> list[list[str]]:
    """The lines of a LETOR file (gzipped or not) grouped by query: by ``qid:`` or by its
    ``.query`` sidecar."""
    lines = (gzip.open(path, "rt") if path.suffix == ".gz" else path.open()).read().splitlines()
    sidecar = Path(str(path) + ".query")
    if sidecar.exists():
        groups, at = [], 0
        for n in (int(v) for v in sidecar.read_text().split()):
            groups.append(lines[at:at + n])
            at += n
        return groups
    groups, last = [], None
    for line in lines:
        qid = line.split()[1]
        if qid != last:
            groups.append([])
            last = qid
        groups[-1].append(line)
    return groups


def _write(folder: Path, name: str, groups: list[list[str]]) -> None:
    """A LETOR file of ``groups``; its ``.query`` sidecar where the lines carry no ``qid:``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("".join(line + "\n" for group in groups for line in group))
    if groups and "qid:" not in groups[0][0]:
        (folder / (name + ".query")).write_text("".join(f"{len(group)}\n" for group in groups))


def inner_folds(parts: list[list[list[str]]], root: Path) -> Path:
    """``root/Fold1..K``: fold i validates on part i and trains on the others (its test file is
    a copy of its vali file: a study never reads it)."""
    for i, part in enumerate(parts, start=1):
        train = [g for j, other in enumerate(parts, start=1) if j != i for g in other]
        for name, groups in (("train.txt", train), ("vali.txt", part), ("test.txt", part)):
            _write(root / f"Fold{i}", name, groups)
    return root


def outer_splits(data: str, workdir: Path) -> list[tuple[str, dict, Path]]:
    """(label, compare's settings for the outer split, the inner folds' root) of each outer split."""
    if data == "mq2008":  # fold k tests on partition S(k + 3) % 5 + 1 (rankkit.data.bundled)
        parts = {p: _queries(Path(mq2008_partition_path(p))) for p in range(1, 6)}
        return [(f"fold {k}", dict(data="mq2008", folds=str(k)),
                 inner_folds([parts[p] for p in range(1, 6) if p != (k + 3) % 5 + 1], workdir / f"inner-{k}"))
                for k in range(1, 6)]
    train = _queries(Path(data) / "rank.train")
    order = list(range(len(train)))
    random.Random(0).shuffle(order)
    parts = [[train[q] for q in sorted(order[i::5])] for i in range(5)]
    return [("test file", dict(data=data, folds="1"), inner_folds(parts, workdir / "inner"))]


def one_split(config: str, label: str, settings: dict, inner: Path, *, trials: int, val_fraction: float,
              workdir: Path, modes: list[str], test_seeds: int = 1) -> dict:
    row = {"split": label}
    best = {}
    k = len(list(inner.glob("Fold*")))
    for mode in modes:
        options = MODES[mode]
        t0 = time.perf_counter()
        folds = None if options["folds"] is None else f"1-{k}"
        study_mode = options.get("study", mode)  # a mode that chooses differently in another mode's study
        study = tune(config, n_trials=trials, seed=0, out=workdir / f"tune-{label}-{study_mode}".replace(" ", "_"),
                     overrides={"data.data": str(inner), "data.fold": 1}, folds=folds,
                     trial_seeds=options["trial_seeds"], margin=options.get("margin", 0.0),
                     confirm=options.get("confirm", 0), log=lambda line: None)
        row[f"{mode} s"] = time.perf_counter() - t0
        row[f"{mode} vali"] = study.best_value
        named = Path(study.best_config).with_name(mode.replace(" ", "_").replace(",", "") + ".yaml")  # compare names rows by file
        shutil.copyfile(study.best_config, named)
        best[mode] = str(named)
    result = compare(**settings, seeds=test_seeds, out=str(workdir / f"compare-{label}".replace(" ", "_")),
                     val_fraction=val_fraction if settings["data"] != "mq2008" else 0.0, log=lambda line: None,
                     models=[config, *best.values()])
    scores: dict[str, list[float]] = {}
    for r in result["runs"]:
        scores.setdefault(r["model"], []).append(r["ndcg@10"])
    for name, values in zip(["shipped", *best], scores.values()):  # compare's rows come in the models' order
        row[name] = statistics.mean(values)
    row["labels"] = list(scores)
    return row


def table(rows: list[dict]) -> str:
    modes = [m for m in MODES if all(m in r for r in rows)]
    names = ["shipped", *modes]
    lines = ["| outer split | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for r in rows:
        lines.append(f"| {r['split']} | " + " | ".join(f"{r[n]:.4f}" for n in names) + " |")
    if len(rows) > 1:
        lines.append("| **mean** | " + " | ".join(f"**{statistics.mean(r[n] for r in rows):.4f}**" for n in names)
                     + " |")
    lines.append("")
    studies = [m for m in modes if "study" not in MODES[m]]  # a mode that reuses another's study adds no time
    lines.append("Study time (s, mean per outer split): " + ", ".join(
        f"{m} {statistics.mean(r[f'{m} s'] for r in rows):.0f}" for m in studies) + "; the chosen trial's vali "
        "NDCG@10: " + ", ".join(f"{m} {statistics.mean(r[f'{m} vali'] for r in rows):.4f}" for m in modes) + "."
        + "".join(_refit_time(m, rows) for m in modes if MODES[m].get("confirm")))
    return "\n".join(lines)


def _refit_time(mode: str, rows: list[dict]) -> str:
    """The refits' time of a ``confirm`` mode, over the outer splits where the best trial was not the
    shipped config (elsewhere nothing is refitted)."""
    ran = [r[f"{mode} s"] for r in rows if r[f"{mode} s"] >= 1.0]
    if not ran:
        return f" `{mode}` refitted nothing: every study's best trial was the shipped config."
    return (f" The refits of `{mode}` took {statistics.mean(ran):.0f} s on each of the {len(ran)} outer split(s) "
            f"of {len(rows)} whose best trial was not the shipped config.")


def _modes(text: str) -> list[str]:
    """``--modes``: known names, each rule's study mode among or before them."""
    names = [m.strip() for m in text.split(";" if ";" in text else ",")]
    # "folds x seeds, 1 SE" holds a comma: join a bare "1 SE" back onto the mode before it
    joined: list[str] = []
    for name in names:
        if name == "1 SE" and joined:
            joined[-1] += ", 1 SE"
        elif name:
            joined.append(name)
    for name in joined:
        if name not in MODES:
            raise SystemExit(f"--modes: unknown mode {name!r} (known: {'; '.join(MODES)})")
        study = MODES[name].get("study")
        if study is not None and study not in joined[:joined.index(name)]:
            raise SystemExit(f"--modes: {name!r} chooses in the study of {study!r}: name that mode before it")
    return joined


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="lambdamart")
    ap.add_argument("--trials", type=int, default=15)
    ap.add_argument("--data", default="mq2008", help="mq2008, or a folder of rank.train/rank.test (.query files)")
    ap.add_argument("--val_fraction", type=float, default=0.2, help="the outer vali split of a folder without one")
    ap.add_argument("--rows", default=None, help="append each outer split's row to this JSON-lines file")
    ap.add_argument("--report-only", action="store_true", help="tabulate --rows (several runs' rows) without running")
    ap.add_argument("--outer", default=None, help="MQ2008: the outer folds to run, e.g. 1,2 (default: all five)")
    ap.add_argument("--write", action="store_true", help="replace this data set's section of docs/benchmarks.md")
    ap.add_argument("--modes", default=",".join(MODES), help=f"the studies to run, of: {'; '.join(MODES)} "
                    "(separated by commas; a rule's mode needs its study's mode before it)")
    ap.add_argument("--section", default=None, help="the docs/benchmarks.md section --write replaces")
    ap.add_argument("--test-seeds", type=int, default=1, help="seeds that train each chosen config on the outer "
                    "split (its test value is their mean; 1 for deterministic trees, more for neural rankers)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    modes = _modes(args.modes)
    if args.report_only:  # rows of several files (--rows a,b) of the same splits merge, mode by mode
        merged: dict[str, dict] = {}
        for path in args.rows.split(","):
            for line in Path(path).read_text().splitlines():
                if line.strip():
                    row = json.loads(line)
                    merged.setdefault(row["split"], {}).update(row)
        rows = [merged[k] for k in sorted(merged)]
    with tempfile.TemporaryDirectory() as tmp:
        wanted = None if args.outer is None else {f"fold {k}" for k in args.outer.split(",")}
        for label, settings, inner in [] if args.report_only else outer_splits(args.data, Path(tmp)):
            if wanted is not None and label not in wanted:
                continue
            rows.append(one_split(args.config, label, settings, inner, trials=args.trials,
                                  val_fraction=args.val_fraction, workdir=Path(tmp), modes=modes,
                                  test_seeds=args.test_seeds))
            print(rows[-1], flush=True)
            if args.rows:
                with open(args.rows, "a") as f:
                    f.write(json.dumps(rows[-1]) + "\n")
    body = (f"Measured {datetime.date.today()}, 1 torch thread, {args.trials} trials a study, command: "
            f"`{command_line(__file__, argv)}`. Test NDCG@10 of the shipped `{args.config}` config and of each "
            f"study's chosen trial (its best; in a `1 SE` column, the untuned config unless the best beats it by "
            f"more than one standard error of their paired fits: `rankkit tune --margin 1`; in a `confirmed` "
            f"column, the untuned config unless the best trial, refitted with 3 fresh seeds on every inner fold, "
            f"beats it by more than one standard error over the inner folds' vali queries: `rankkit tune --confirm 3 "
            f"--margin 1`), trained on the outer "
            f"split as `rankkit compare` trains"
            + (f", the mean of {args.test_seeds} seeds" if args.test_seeds > 1 else "")
            + (f" (rows in `{args.rows}`, appended by runs of this script with `--rows`; `--report-only` "
               f"tabulates them)" if args.rows else "") + f":\n\n{table(rows)}")
    print(body)
    if args.write:
        name = "mq2008" if args.data == "mq2008" else Path(args.data).name.replace("-", "_")
        # a section per study size: 10 trials (the first readings) keep theirs
        write_section(args.section or f"tune_generalisation_{args.config}_{name}"
                      + (f"_t{args.trials}" if args.trials != 10 else ""), body)


if __name__ == "__main__":
    main()
