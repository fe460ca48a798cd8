"""Which click criterion picks the best of the trees' race candidates? (issue 49)

    python experiments/click_criteria.py --write

``LambdaMART(unbiased="auto")`` races naive training, Unbiased LambdaMART at p = 1,
``unbiased="position"`` and ``unbiased="ips"`` and keeps the one whose scores best explain a
validation click log (:class:`rankkit.clicks.metrics.ClickLikelihood`). On the synthetic set under
the cascade and at η = 0.5 it falls below LightGBM's ``position=`` because it picks ``ips`` where
``position`` is better. This script asks whether another criterion on the same logs would choose
better. For each data set, fold, seed and click model it makes the logs of
experiments/unbiased.py (same seeds, so the same logs), fits the four candidates alone (50 rounds,
depth 4, learning rate 0.1, as that grid) and LightGBM lambdarank with ``position=``, and scores
each candidate by:

* ``likelihood``: the race's criterion on the validation log (a logistic click model with one
  offset per position and one slope, on the scores centred per session);
* ``slopes``: the same with one slope per position;
* ``conditional logit``: each session's clicks as draws from a softmax over its shown documents
  of (slope · score + position offset), fitted the same way (the cascade's one click a session);
* ``skip-above pairs``: the fraction of (clicked, unclicked shown above it) pairs of a session
  the scores order right (Joachims, "Optimizing Search Engines using Clickthrough Data", KDD 2002);
* ``likelihood on the training log``: the race's criterion on the log the candidates trained on
  (more sessions, but in sample).

The table gives, per cell, the mean test NDCG@10 (true labels, gain 2^y − 1, log2 discount, a
query with nothing relevant counts 1) of the candidate each criterion picks, beside the best
candidate of each run (what a perfect criterion would reach), each candidate alone and LightGBM.
Runs go to ``--out`` as JSON lines (scalars only); ``--report-only`` tabulates them.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import command_line, write_section  # noqa: E402
from unbiased import (K_SHOWN, booster, click_logs, click_models, fold_range, grid_arguments, load,  # noqa: E402
                      run_keys, test_ndcg, train_lightgbm)

from rankkit.clicks.metrics import ClickLikelihood, centred_scores, explained_clicks, maximised  # noqa: E402
from rankkit.clicks.race import TREE_BLENDS, TREE_CANDIDATES  # noqa: E402
from rankkit.training.clicks import production_ranker, production_scores  # noqa: E402

CRITERIA = ("likelihood", "slopes", "conditional logit", "skip-above pairs", "likelihood on the training log")


def _rows(vlog):
    """(session [N], clicks [N] float64, position bucket [N]) of a click log's shown rows."""
    sizes = vlog.sessions.sizes
    session = torch.repeat_interleave(torch.arange(len(sizes)), sizes)
    return session, vlog.clicks.double(), vlog.position.long().clamp(max=K_SHOWN - 1)


def slopes(scores, session, clicks, bucket) -> float:
    """Mean log-likelihood per row of sigmoid(a_pos z + b_pos), a_pos ≥ 0."""
    z = centred_scores(scores, session)
    a = torch.zeros(K_SHOWN, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(K_SHOWN, dtype=torch.float64, requires_grad=True)
    return maximised([a, b], lambda: F.binary_cross_entropy_with_logits(F.softplus(a[bucket]) * z + b[bucket], clicks))


def conditional_logit(scores, session, clicks, bucket) -> float:
    """Mean log-likelihood per click of each click as a softmax draw over its session's rows."""
    n = int(session.max()) + 1
    z = centred_scores(scores, session)
    a = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(K_SHOWN, dtype=torch.float64, requires_grad=True)
    per_session = torch.zeros(n, dtype=torch.float64).index_add_(0, session, clicks)

    def loss():
        u = F.softplus(a) * z + b[bucket]
        top = torch.full((n,), -torch.inf, dtype=torch.float64).scatter_reduce(0, session, u.detach(), "amax")
        lse = torch.zeros(n, dtype=torch.float64).index_add_(0, session, (u - top[session]).exp()).log() + top
        return -((clicks * u).sum() - (per_session * lse).sum()) / clicks.sum().clamp(min=1)

    return maximised([a, b], loss)


def skip_above(scores, session, clicks, bucket) -> float:
    """Fraction of (clicked, unclicked shown above it) pairs of a session ordered right (ties ½)."""
    s, c, pos, ses = scores.numpy(), clicks.numpy() > 0, bucket.numpy(), session.numpy()
    bounds = np.flatnonzero(np.diff(ses)) + 1
    right = total = 0.0
    for rows in np.split(np.arange(len(s)), bounds):
        for i in rows[c[rows]]:
            above = rows[~c[rows] & (pos[rows] < pos[i])]
            d = s[i] - s[above]
            right += (d > 0).sum() + 0.5 * (d == 0).sum()
            total += len(above)
    return right / max(total, 1.0)


class _Averaged:
    """The mean of fitted models' scores (what ``averaged`` ensembles score)."""

    def __init__(self, models):
        self.models = models

    def predict(self, x):
        return sum(np.asarray(m.predict(x), dtype=np.float64) for m in self.models) / len(self.models)


def run(name: str, fold: int, seed: int, args, done: set):
    """One record per click model of (data set, fold, seed) not in ``done``."""
    args.seed = seed
    train, vali, test, top = load(name, fold)
    prod = production_ranker(train, fraction=0.01, n_estimators=50, depth=3, min_data_in_leaf=5, seed=seed)
    prod_train, prod_vali = production_scores(prod, train), production_scores(prod, vali)
    for label, model in click_models(args, top):
        if (name, fold, seed, label) in done:
            continue
        log, vlog = click_logs(train, vali, prod_train, prod_vali, model, args.sessions, seed)
        vrows, train_metric = _rows(vlog), ClickLikelihood(log.sessions.features, log.clicks, log.sessions.sizes,
                                                           log.position, n_positions=K_SHOWN)
        record = {"data": name, "fold": fold, "seed": seed, "click": label, "candidates": {}}
        models = {}
        for candidate, options in TREE_CANDIDATES.items():
            models[candidate] = booster(args, n_positions=K_SHOWN, **options).fit(
                log.sessions.features, log.clicks, group=log.sessions.sizes, position=log.position)
        for blend, parts in TREE_BLENDS.items():  # the mean of the parts' scores, as the race keeps it
            models[blend] = _Averaged([models[p] for p in parts])
        for candidate, m in models.items():
            v = torch.as_tensor(m.predict(vlog.sessions.features.numpy()), dtype=torch.float64)
            record["candidates"][candidate] = {
                "test": test_ndcg(m.predict(test.features.numpy()), test),
                "likelihood": explained_clicks(v, vrows[1], vrows[0], vrows[2], K_SHOWN),
                "slopes": slopes(v, *vrows), "conditional logit": conditional_logit(v, *vrows),
                "skip-above pairs": skip_above(v, *vrows), "likelihood on the training log": train_metric(m)}
        record["LightGBM position"] = test_ndcg(train_lightgbm(log, args, position=True).predict(
            test.features.numpy()), test)
        yield record


def _picked(record: dict, criterion: str, names) -> float:
    """Test NDCG@10 of the candidate of ``names`` that ``criterion`` scores highest in ``record``."""
    candidates = record["candidates"]
    return candidates[max(names, key=lambda name: candidates[name][criterion])]["test"]


def table(records: list[dict]) -> str:
    cells = collections.defaultdict(list)
    for r in records:
        cells[(r["data"], r["click"])].append(r)
    names, blends = list(TREE_CANDIDATES), list(TREE_BLENDS)
    head = ["data", "clicks", "runs", *(f"picked by {c}" for c in CRITERIA), "best of the four",
            *(f"{n} alone" for n in names + blends), "picked by likelihood, the blend a candidate",
            "LightGBM position"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 3 + "---:|" * (len(head) - 3)]
    for (data, click), rs in sorted(cells.items()):
        columns = [[_picked(r, c, names) for r in rs] for c in CRITERIA]
        columns.append([max(r["candidates"][n]["test"] for n in names) for r in rs])
        columns += [[r["candidates"][n]["test"] for r in rs] for n in names + blends]
        columns.append([_picked(r, "likelihood", names + blends) for r in rs])
        columns.append([r["LightGBM position"] for r in rs])
        lines.append("| " + " | ".join([data, click, str(len(rs)), *(f"{statistics.mean(c):.4f}" for c in columns)])
                     + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    grid_arguments(p, data="synthetic,mq2008")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="results/click_criteria.jsonl",
                   help="JSON lines; new runs go to the first of a comma-separated list, the report merges all")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--write", action="store_true", help="write the table to docs/benchmarks.md")
    args = p.parse_args(argv)
    args.etas = [float(v) for v in args.etas.split(",")]
    torch.set_num_threads(args.threads)
    paths = args.out.split(",")
    os.makedirs(os.path.dirname(os.path.abspath(paths[0])), exist_ok=True)
    records = [json.loads(line) for path in paths if os.path.exists(path) for line in open(path)]
    start = time.perf_counter()
    if not args.report_only:
        done = run_keys(records)
        with open(paths[0], "a") as out:
            for name in args.data.split(","):
                for fold in fold_range(args.folds):
                    for seed in (int(v) for v in args.seeds.split(",")):
                        for record in run(name, fold, seed, args, done):
                            out.write(json.dumps(record) + "\n")
                            out.flush()
                            records.append(record)
    body = (f"## Which click criterion picks the race's winner (issue 49)\n\nCommand: `{command_line(__file__, argv)}` "
            f"({time.strftime('%Y-%m-%d')}, {args.threads} thread(s); runs in {', '.join(paths)}). The candidates of "
            f"`LambdaMART(unbiased=\"auto\")` fitted alone on the logs of experiments/unbiased.py (same seeds), "
            f"{args.rounds} rounds of depth {args.depth}; each column is the mean test NDCG@10 (true labels, gain "
            f"2^y − 1, log2 discount, a query with nothing relevant counts 1) of the candidate a criterion picks "
            f"(experiments/click_criteria.py's docstring defines them).\n\n{table(records)}")
    print(body)
    print(f"{time.perf_counter() - start:.0f} s", file=sys.stderr)
    if args.write:
        write_section("click_criteria", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
