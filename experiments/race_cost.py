"""What ``LambdaMART(unbiased="auto")`` costs beside a naive fit, both with early stopping (issue 49).

    python experiments/race_cost.py --write

For each MQ2008 fold and position-bias strength η: a production LambdaMART trained on 1 % of the
training queries orders every training and validation query, the top 10 are shown 40 times per
query to a position-based user (examination (1/(r+1))^η, attractiveness ε₋ + (1 − ε₋)(2^y − 1)/3,
ε₋ = 0.1; sessions without a click dropped). Then, in this one process, one after the other:

* naive: ``LambdaMART`` on the training log (clicks as labels), the validation log as its eval
  set, ``early_stopping_rounds`` = ``--stop``;
* auto: ``LambdaMART(unbiased="auto")`` with the same settings and the validation log's positions;
* the candidate auto chose, fitted alone with the same settings (what the race adds to it; a blend's
  two parts, one after the other).

Each fit is timed ``--repeats`` times; the table gives the medians, their ratio, the trees each
kept, the rounds the race grew over all its candidates and the test NDCG@10 on true labels
(gain 2^y − 1, discount 1/log2(1 + rank), a query without relevant documents counts 1).

``--neural`` does the same for ``LambdaRank(unbiased="auto")`` (MLP [32], Adam 1e-3, batches of
8192 documents) in ``Trainer.fit`` with an EarlyStopping callback of ``--patience`` validations and
at most ``--epochs`` epochs: naive LambdaRank stopping on the validation log's NDCG@10 of clicks,
auto stopping on its leader's explained clicks, and auto with the stages at a third and two thirds
of the epochs whatever the patience (the rule before 2026-12-06). Its table counts network-epochs
(the networks trained in each epoch, summed) beside the seconds of one fit each.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import command_line, write_section  # noqa: E402

from rankkit.boosting import LambdaMART  # noqa: E402
from rankkit.boosting import booster as booster_module  # noqa: E402
from rankkit.clicks.race import TREE_BLENDS, TREE_CANDIDATES  # noqa: E402
from rankkit.boosting.engine import BoostingEngine  # noqa: E402
from rankkit.data import load_mq2008, pad  # noqa: E402
from rankkit.data.clicks import PositionBasedModel, simulate_clicks  # noqa: E402
from rankkit.metrics import ndcg  # noqa: E402
from rankkit.training.clicks import production_ranker, production_scores  # noqa: E402


def logs(fold: int, eta: float, sessions: int):
    """(training log, validation log, test set) of MQ2008 ``fold`` under examination η."""
    train, vali, test = load_mq2008(fold)
    prod = production_ranker(train, fraction=0.01, n_estimators=50, depth=3, min_data_in_leaf=5, seed=fold)
    model = PositionBasedModel(eta=eta, epsilon_plus=1.0, epsilon_minus=0.1, max_label=2.0)
    log = simulate_clicks(train, production_scores(prod, train), model=model, sessions_per_query=sessions, k=10,
                          seed=fold, drop_unclicked=True)
    vlog = simulate_clicks(vali, production_scores(prod, vali), model=model, sessions_per_query=sessions, k=10,
                           seed=fold + 1000, drop_unclicked=True)
    return log, vlog, test


def test_ndcg(model, test) -> float:
    s, mask = pad(torch.as_tensor(model.predict(test.features.numpy())), test.sizes)
    y, _ = pad(test.labels, test.sizes)
    return float(ndcg(s, y, mask=mask, k=10).mean())


def timed(make, repeats: int):
    """(median seconds, the last fitted model, rounds grown by the last fit)."""
    seconds, grown = [], []
    update = BoostingEngine.update

    def counting(engine):
        grown.append(1)
        return update(engine)

    BoostingEngine.update = counting
    try:
        for _ in range(repeats):
            grown.clear()
            start = time.perf_counter()
            model = make()
            seconds.append(time.perf_counter() - start)
    finally:
        BoostingEngine.update = update
    return statistics.median(seconds), model, len(grown)


def run(fold: int, eta: float, args) -> dict:
    log, vlog, test = logs(fold, eta, args.sessions)
    kw = dict(n_estimators=args.rounds, early_stopping_rounds=args.stop, depth=6, learning_rate=0.1, seed=0,
              n_jobs=args.threads)
    x, clicks, sizes = log.sessions.features, log.clicks, log.sessions.sizes
    fit = dict(eval_set=[(vlog.sessions.features, vlog.clicks)], eval_group=[vlog.sessions.sizes])
    naive_s, naive, naive_rounds = timed(lambda: LambdaMART(**kw).fit(x, clicks, group=sizes, **fit), args.repeats)
    auto_s, auto, auto_rounds = timed(lambda: LambdaMART(unbiased="auto", **kw).fit(
        x, clicks, group=sizes, position=log.position, eval_position=[vlog.position], **fit), args.repeats)
    alone_s = 0.0  # the chosen candidate fitted alone: a blend's two parts, one after the other
    for part in TREE_BLENDS.get(auto.unbiased_choice_, (auto.unbiased_choice_,)):
        options = TREE_CANDIDATES[part]
        alone_s += timed(lambda o=options: LambdaMART(**{**kw, **o}).fit(x, clicks, group=sizes, position=log.position,
                                                                          **fit), args.repeats)[0]
    row = dict(fold=fold, eta=eta, naive_s=naive_s, auto_s=auto_s, alone_s=alone_s, naive_trees=naive.best_iteration_ + 1,
               naive_rounds=naive_rounds, auto_trees=auto.best_iteration_ + 1, auto_rounds=auto_rounds,
               choice=auto.unbiased_choice_, naive_ndcg=test_ndcg(naive, test), auto_ndcg=test_ndcg(auto, test))
    print(row, file=sys.stderr, flush=True)
    return row


def neural_fit(log, vlog, test, args, unbiased) -> dict:
    """One ``Trainer.fit`` of LambdaRank on the click logs with early stopping: seconds, epochs,
    network-epochs, the race's choice and test NDCG@10."""
    import pytorch_lightning as pl

    from rankkit.neural import LambdaRank
    from rankkit.training.datamodule import RankingDataModule

    class Count(pl.Callback):
        def __init__(self):
            self.networks = []

        def on_train_epoch_start(self, trainer, module):  # before the validation that may cut
            self.networks.append(1 if module.race is None else len(module.race.runs))

    pl.seed_everything(0, verbose=False)
    module = LambdaRank(n_features=log.sessions.n_features, hidden=[32], dropout=0.1, lr=1e-3, weight_decay=1e-5,
                        k=10, reduction="sum", unbiased=unbiased, n_positions=10)
    monitor = "val/explained_clicks" if unbiased == "auto" else "val/ndcg@10"
    count = Count()
    trainer = pl.Trainer(max_epochs=args.epochs, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False,
                         callbacks=[count, pl.callbacks.EarlyStopping(monitor=monitor, mode="max",
                                                                      patience=args.patience)])
    start = time.perf_counter()
    trainer.fit(module, datamodule=RankingDataModule.from_datasets(log.sessions, vlog.sessions, None, max_docs=8192))
    seconds = time.perf_counter() - start
    module.eval()
    with torch.no_grad():
        scores, mask = pad(module(test.features), test.sizes)
    y, _ = pad(test.labels, test.sizes)
    return dict(seconds=seconds, epochs=len(count.networks), networks=sum(count.networks),
                choice=getattr(module, "unbiased_choice_", None), ndcg=float(ndcg(scores, y, mask=mask, k=10).mean()))


def neural_run(fold: int, eta: float, args) -> dict:
    from rankkit.clicks import race as race_module

    log, vlog, test = logs(fold, eta, args.sessions)
    row = dict(fold=fold, eta=eta, naive=neural_fit(log, vlog, test, args, False),
               auto=neural_fit(log, vlog, test, args, "auto"))
    patience = race_module.trainer_patience
    race_module.trainer_patience = lambda trainer: None  # the stages of the rule before 2026-12-06
    try:
        row["before"] = neural_fit(log, vlog, test, args, "auto")
    finally:
        race_module.trainer_patience = patience
    print(row, file=sys.stderr, flush=True)
    return row


def neural_table(rows: list[dict]) -> str:
    lines = ["| fold | η | naive: epochs, s | auto: epochs, network-epochs, s | auto / naive (network-epochs, s) "
             "| stages at epochs/3 (before): network-epochs, s | its / naive | choice (before) "
             "| test NDCG@10 naive | auto | before |",
             "|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r in rows:
        n, a, b = r["naive"], r["auto"], r["before"]
        lines.append(f"| {r['fold']} | {r['eta']:g} | {n['epochs']}, {n['seconds']:.1f} | {a['epochs']}, "
                     f"{a['networks']}, {a['seconds']:.1f} | {a['networks'] / n['networks']:.2f}×, "
                     f"{a['seconds'] / n['seconds']:.2f}× | {b['networks']}, {b['seconds']:.1f} | "
                     f"{b['networks'] / n['networks']:.2f}×, {b['seconds'] / n['seconds']:.2f}× | {a['choice']} "
                     f"({b['choice']}) | {n['ndcg']:.4f} | {a['ndcg']:.4f} | {b['ndcg']:.4f} |")
    for key, label in (("auto", "auto"), ("before", "before")):
        epochs = [r[key]["networks"] / r["naive"]["networks"] for r in rows]
        seconds = [r[key]["seconds"] / r["naive"]["seconds"] for r in rows]
        lines.append(f"\n{label} / naive over {len(rows)} logs: network-epochs median {statistics.median(epochs):.2f}×, "
                     f"largest {max(epochs):.2f}×; seconds median {statistics.median(seconds):.2f}×, largest "
                     f"{max(seconds):.2f}×; test NDCG@10 mean {statistics.mean(r[key]['ndcg'] for r in rows):.4f} "
                     f"(naive {statistics.mean(r['naive']['ndcg'] for r in rows):.4f}).")
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    lines = ["| fold | η | naive s | auto s | auto / naive | choice alone s | auto / choice alone "
             "| naive rounds (kept) | race rounds (kept) | choice | test NDCG@10 naive | auto |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['fold']} | {r['eta']:g} | {r['naive_s']:.2f} | {r['auto_s']:.2f} | "
                     f"{r['auto_s'] / r['naive_s']:.2f}× | {r['alone_s']:.2f} | {r['auto_s'] / r['alone_s']:.2f}× | "
                     f"{r['naive_rounds']} ({r['naive_trees']}) | "
                     f"{r['auto_rounds']} ({r['auto_trees']}) | {r['choice']} | {r['naive_ndcg']:.4f} | "
                     f"{r['auto_ndcg']:.4f} |")
    ratios = [r["auto_s"] / r["naive_s"] for r in rows]
    lines.append("")
    alone = [r["auto_s"] / r["alone_s"] for r in rows]
    lines.append(f"auto / naive time: median {statistics.median(ratios):.2f}×, largest {max(ratios):.2f}× "
                 f"over {len(rows)} runs; auto / a plain fit of the candidate it chose: median "
                 f"{statistics.median(alone):.2f}×, largest {max(alone):.2f}×; rounds grown: median "
                 f"{statistics.median(r['auto_rounds'] / r['naive_rounds'] for r in rows):.2f}×.")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--folds", default="1,2,3")
    p.add_argument("--etas", default="1,2")
    p.add_argument("--sessions", type=int, default=40)
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--stop", type=int, default=30, help="early_stopping_rounds")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--stage-ends", default=None, metavar="A,B",
                   help="end the race's stages at A·E and B·E rounds (E = --stop; with --neural, epochs and "
                        "E = --patience) instead of the library's rule (E/3 and 2E/3 since 2026-12-05; '1,2' is the "
                        "trees' rule before)")
    p.add_argument("--write", action="store_true", help="write the table to docs/benchmarks.md")
    p.add_argument("--neural", action="store_true", help="LambdaRank(unbiased='auto') in Trainer.fit instead")
    p.add_argument("--epochs", type=int, default=60, help="--neural: max_epochs")
    p.add_argument("--patience", type=int, default=6, help="--neural: EarlyStopping's patience")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    np.random.seed(0)
    a, b = (float(v) for v in args.stage_ends.split(",")) if args.stage_ends else (None, None)
    if args.neural:
        torch.set_num_threads(args.threads)
        if args.stage_ends:  # stages at A·P and B·P epochs (P = --patience), within a third and two of the epochs
            from rankkit.clicks import race as race_module

            race_module.epoch_stage_ends = lambda n, p=None: (
                max(1, min(math.ceil(n / 3), math.ceil(a * p) if p else n)),
                max(1, min(math.ceil(2 * n / 3), math.ceil(b * p) if p else n)))
        one_log, tabulate, section, title = neural_run, neural_table, "race_cost_neural", "what the neural race costs"
        protocol = (f"one fit of each, one after the other in one process). MQ2008 folds, the click logs of the trees' "
                    f"table above; LambdaRank MLP [32], Adam 1e-3, `Trainer.fit` with EarlyStopping (patience "
                    f"{args.patience} validations, one an epoch) and at most {args.epochs} epochs: naive on the "
                    f"validation log's NDCG@10 of clicks, auto on its leader's explained clicks.")
    else:
        if args.stage_ends:
            booster_module.race_rounds = lambda n, e: (max(1, min(n // 3, math.ceil(a * e))),
                                                       max(1, min(2 * n // 3, math.ceil(b * e))))
        one_log, tabulate, section, title = run, table, "race_cost", "what the race costs"
        protocol = (f"each time the median of {args.repeats} fits in one process, one after the other). MQ2008 folds, "
                    f"position-based clicks on the top 10 of a 1 % production ranker, 40 sessions per query; both fits "
                    f"stop early on the validation click log ({args.stop} rounds), at most {args.rounds} trees, "
                    f"depth 6.")
    rows = [one_log(int(f), float(e), args) for f in args.folds.split(",") for e in args.etas.split(",")]
    body = (f"## Learning from clicks: {title} (issue 49)\n\nCommand: `{command_line(__file__, argv)}` "
            f"({time.strftime('%Y-%m-%d')}, {args.threads} thread(s), {protocol} NDCG@10 on the test folds' true "
            f"labels, gain 2^y − 1, discount 1/log2(1 + rank).\n\n{tabulate(rows)}")
    print(body)
    if args.write:
        write_section(section, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
