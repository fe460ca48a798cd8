"""Learning to rank from simulated clicks (issue 20): naive, debiased and oracle rankers.

    python experiments/unbiased.py --data mq2008,synthetic --etas 0.5,1,2 --write

For each data set and each position-bias strength η, the protocol of Joachims et al. (WSDM
2017), Ai et al. (SIGIR 2018) and Hu et al. (WWW 2019):

1. a production LambdaMART trained on 1 % of the training queries orders every training query;
2. the top 10 are shown ``--sessions`` times per query to a position-based user (examination
   θ_r = (1/(r+1))^η, click noise ε₋ = 0.1, ε₊ = 1); sessions without a click are dropped;
3. rankers are trained on the click log (sessions as queries, clicks as labels, the displayed
   ``position`` carried by ``ClickLog.sessions``) and scored by NDCG@10 on the test queries'
   TRUE labels:

   * naive: the clicks taken as labels (rankkit LambdaMART, rankkit LambdaRank, LightGBM and
     XGBoost lambdarank);
   * debiased: rankkit ``LambdaMART(unbiased=True)`` and ``LambdaRank(unbiased=True)`` (Unbiased
     LambdaMART's pairwise debiasing, Hu et al. 2019, biases learned jointly with the ranker),
     LightGBM's position-aware lambdarank (``position=``, LightGBM >= 4.1) and XGBoost's
     ``lambdarank_unbiased`` (documents of a session sorted by displayed position, as its
     position model reads positions from the order inside a query);
   * oracle: the same rankkit models on the true labels of the training queries (the skyline);
   * production: the 1 % ranker itself (the floor).

Every setting is fixed a priori (nothing is chosen on test): the boosters run ``--rounds``
rounds of depth ``--depth`` at learning rate 0.1; LambdaRank uses configs/lambdarank.yaml's
tuned settings (MLP [64, 32], dropout 0.1, Adam lr 1e-3, weight decay 1e-5, k = 10, summed
loss, 512 documents per batch) and keeps the epoch with the best vali NDCG@10 on true labels
(``--epochs`` over the true-label train set, ``--log-epochs`` over a click log). The
propensities use p = ``--bias-p`` (0: the unregularised closed form, whose fixed point is the
examination ratio θ_r / θ_0 on exchangeable data; see rankkit/unbiased.py) and 10 positions.
XGBoost keeps its defaults for the bias (``lambdarank_bias_norm`` 2) and pairs the top 10.

Prints the table and the learned click biases t⁺ against the true θ_r / θ_0; ``--write`` puts
the section "Learning from clicks (issue 20)" into docs/benchmarks.md and the plot into
docs/img/unbiased.png.
"""
from __future__ import annotations

import argparse
import copy
import math
import os
import sys
import time

import numpy as np
import torch

from rankkit.boosting import LambdaMART
from rankkit.data import load_mq2008, make_synthetic, pad
from rankkit.data.clicks import (
    PositionBasedModel,
    production_ranker,
    production_scores,
    simulate_clicks,
)
from rankkit.metrics import ndcg
from rankkit.neural import LambdaRank

K_SHOWN = 10
DATE = "2026-11-24"
METHODS = ("LambdaMART naive", "LambdaMART debiased", "LambdaMART oracle",
           "LambdaRank naive", "LambdaRank debiased", "LambdaRank oracle",
           "LightGBM naive", "LightGBM position", "XGBoost naive", "XGBoost unbiased", "production")


def load(name: str, fold: int, seed: int):
    """(train, vali, test, top label) of a data set."""
    if name == "mq2008":
        return (*load_mq2008(fold), 2.0)
    if name == "synthetic":
        data = make_synthetic(1500, (10, 60), 30, seed=seed)
        perm = torch.randperm(data.n_queries, generator=torch.Generator().manual_seed(seed))
        cuts = (int(0.6 * data.n_queries), int(0.8 * data.n_queries))
        parts = (perm[: cuts[0]], perm[cuts[0]: cuts[1]], perm[cuts[1]:])
        return (*(data.subset(p.sort().values) for p in parts), 4.0)
    raise ValueError(f"`--data` has to name mq2008 or synthetic, got {name!r}")


def test_ndcg(scores, data) -> float:
    """Mean NDCG@10 of flat scores [N] on the true labels of ``data``."""
    s, mask = pad(torch.as_tensor(np.asarray(scores), dtype=torch.float32), data.sizes)
    y, _ = pad(data.labels, data.sizes)
    return float(ndcg(s, y, mask=mask, k=10).mean())


# -- the rankers -----------------------------------------------------------------------------------
def booster(args, **kw) -> LambdaMART:
    return LambdaMART(n_estimators=args.rounds, depth=args.depth, learning_rate=0.1, seed=args.seed, **kw)


def train_unbiased(log, args) -> LambdaMART:
    """Unbiased LambdaMART on the click log: the booster re-estimates t⁺, t⁻ every round."""
    model = booster(args, unbiased=True, bias_p=args.bias_p, n_positions=K_SHOWN)
    return model.fit(log.sessions.features, log.clicks, group=log.sessions.sizes, position=log.position)


def train_lambdarank(train, vali, args, *, unbiased: bool, epochs: int) -> LambdaRank:
    """LambdaRank (configs/lambdarank.yaml's settings) in a plain loop; the best vali epoch is kept."""
    torch.manual_seed(args.seed)
    module = LambdaRank(n_features=train.n_features, hidden=[64, 32], dropout=0.1, lr=1e-3, weight_decay=1e-5,
                        k=10, reduction="sum", unbiased=unbiased, bias_p=args.bias_p, n_positions=K_SHOWN)
    module.fit_preprocessor(train.features)
    opt = module.configure_optimizers()
    generator = torch.Generator().manual_seed(args.seed)
    best, best_state = -1.0, None
    for _ in range(epochs):
        module.train()
        for batch in train.iter_batches(512, shuffle=True, generator=generator):
            loss = module.objective(module.scorer(batch.features), batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
        module.eval()
        with torch.no_grad():
            score = test_ndcg(module(vali.features), vali)
        if score > best:
            best, best_state = score, (copy.deepcopy(module.scorer.state_dict()),
                                       None if module.propensity is None else module.propensities)
    module.scorer.load_state_dict(best_state[0])
    module.best_propensities = best_state[1]
    return module.eval()


def train_lightgbm(log, args, *, position: bool):
    import lightgbm as lgb

    x = log.sessions.features.numpy()
    train = lgb.Dataset(x, label=log.clicks.numpy(), group=log.sessions.sizes.numpy(),
                        position=log.position.numpy() if position else None)
    params = {"objective": "lambdarank", "num_leaves": 2 ** args.depth, "learning_rate": 0.1,
              "min_data_in_leaf": 20, "verbosity": -1, "seed": args.seed, "num_threads": args.threads}
    return lgb.train(params, train, num_boost_round=args.rounds)


def train_xgboost(log, args, *, unbiased: bool):
    """XGBoost's lambdarank (``rank:ndcg``, top-10 pairs), with ``lambdarank_unbiased`` or not.

    Its position model reads each document's position from its order inside the query, so the
    rows must be sorted by position within a session: ``ClickLog.sessions`` stores every session
    in displayed order already (checked here).
    """
    import xgboost as xgb

    starts = log.sessions.offsets[:-1].repeat_interleave(log.sessions.sizes)
    if not torch.equal(log.position, torch.arange(log.sessions.n_docs) - starts):
        raise AssertionError("sessions are not in displayed order")
    qid = log.sessions.doc_query_index().numpy()
    train = xgb.DMatrix(log.sessions.features.numpy(), label=log.clicks.numpy(), qid=qid)
    params = {"objective": "rank:ndcg", "lambdarank_pair_method": "topk", "lambdarank_num_pair_per_sample": K_SHOWN,
              "lambdarank_unbiased": unbiased, "eta": 0.1, "max_depth": args.depth, "tree_method": "hist",
              "min_child_weight": 1e-3, "seed": args.seed, "nthread": args.threads}
    return xgb.train(params, train, num_boost_round=args.rounds)


# -- one data set ----------------------------------------------------------------------------------
def run(name: str, fold: int, args) -> tuple[dict, dict]:
    """NDCG@10 per (η, method) and learned t⁺ per (η, model kind) on one data set and fold."""
    import xgboost as xgb

    train, vali, test, top = load(name, fold, args.seed)
    t0 = time.perf_counter()
    prod = production_ranker(train, fraction=0.01, n_estimators=50, depth=3, min_data_in_leaf=5, seed=args.seed)
    prod_scores = production_scores(prod, train)
    fixed = {"LambdaMART oracle": test_ndcg(booster(args).fit(train).predict(test), test),
             "LambdaRank oracle": test_ndcg(train_lambdarank(train, vali, args, unbiased=False,
                                                             epochs=args.epochs)(test.features).detach(), test),
             "production": test_ndcg(prod.predict(test), test)}
    print(f"{name} fold {fold}: {train.n_queries} train / {test.n_queries} test queries, oracles in "
          f"{time.perf_counter() - t0:.0f}s", file=sys.stderr)
    results, biases = {}, {}
    x_test = test.features.numpy()
    for eta in args.etas:
        t0 = time.perf_counter()
        model = PositionBasedModel(eta=eta, epsilon_plus=1.0, epsilon_minus=0.1, max_label=top)
        log = simulate_clicks(train, prod_scores, model=model, sessions_per_query=args.sessions, k=K_SHOWN,
                              seed=args.seed, drop_unclicked=True)
        row = dict(fixed)
        row["LambdaMART naive"] = test_ndcg(
            booster(args).fit(log.sessions.features, log.clicks, group=log.sessions.sizes).predict(test), test)
        unbiased = train_unbiased(log, args)
        row["LambdaMART debiased"] = test_ndcg(unbiased.predict(test), test)
        for debias in (False, True):
            net = train_lambdarank(log.sessions, vali, args, unbiased=debias, epochs=args.log_epochs)
            row[f"LambdaRank {'debiased' if debias else 'naive'}"] = test_ndcg(net(test.features).detach(), test)
        for position in (False, True):
            row[f"LightGBM {'position' if position else 'naive'}"] = test_ndcg(
                train_lightgbm(log, args, position=position).predict(x_test), test)
        for debias in (False, True):
            row[f"XGBoost {'unbiased' if debias else 'naive'}"] = test_ndcg(
                train_xgboost(log, args, unbiased=debias).predict(xgb.DMatrix(x_test)), test)
        results[eta] = row
        biases[eta] = {"true": (model.examination(K_SHOWN) / model.examination(K_SHOWN)[0]).tolist(),
                       "LambdaMART": unbiased.propensities_["clicked"].tolist(),
                       "LambdaRank": net.best_propensities["clicked"].tolist()}
        print(f"{name} fold {fold} eta={eta}: {log.n_sessions} sessions, {time.perf_counter() - t0:.0f}s\n"
              + "".join(f"    {k:<22}{v:.4f}\n" for k, v in row.items())
              + "".join(f"    t+ {k:<11}{[round(v, 3) for v in b]}\n" for k, b in biases[eta].items()),
              file=sys.stderr)
    return results, biases


def mean_over_folds(per_fold: list[dict]) -> dict:
    return {eta: {m: float(np.mean([f[eta][m] for f in per_fold])) for m in per_fold[0][eta]}
            for eta in per_fold[0]}


# -- report ----------------------------------------------------------------------------------------
def table(results: dict) -> str:
    head = "| data | η | " + " | ".join(METHODS) + " |\n|---|---:|" + "---:|" * len(METHODS) + "\n"
    lines = [f"| {name} | {eta:g} | " + " | ".join(f"{row[m]:.4f}" for m in METHODS) + " |"
             for name, by_eta in results.items() for eta, row in by_eta.items()]
    return head + "\n".join(lines)


def targets(results: dict) -> list[str]:
    """At η = 1: debiased − naive ≥ 0.01, half the naive→oracle gap closed, level with LightGBM/XGBoost."""
    out = []
    for name, by_eta in results.items():
        row = by_eta.get(1.0)
        if row is None:
            continue
        rivals = max(row["LightGBM position"], row["XGBoost unbiased"])
        for kind in ("LambdaMART", "LambdaRank"):
            naive, debiased, oracle = (row[f"{kind} {m}"] for m in ("naive", "debiased", "oracle"))
            gain, gap = debiased - naive, oracle - naive
            share = gain / gap if gap > 0 else math.nan
            out.append(f"{name}, {kind}: debiased − naive = {gain:+.4f} ({'met' if gain >= 0.01 else 'missed'}); "
                       f"gap closed {share:.0%} of {gap:+.4f} ({'met' if share >= 0.5 else 'missed'}); "
                       f"vs best of LightGBM/XGBoost debiasing {debiased - rivals:+.4f} "
                       f"({'met' if debiased >= rivals else 'missed'})")
    return out


def plot(results: dict, biases: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, axes = plt.subplots(len(names), 2, figsize=(12, 4.2 * len(names)), squeeze=False)
    styles = {"naive": ":", "debiased": "-", "oracle": "--", "position": "-", "unbiased": "-"}
    for i, name in enumerate(names):
        ax = axes[i, 0]
        etas = sorted(results[name])
        for m in METHODS[:-1]:
            ax.plot(etas, [results[name][e][m] for e in etas], styles[m.split()[1]], marker="o", label=m)
        ax.set(title=f"{name}: test NDCG@10 (true labels)", xlabel="η (examination (1/(r+1))^η)",
               ylabel="NDCG@10", xticks=etas)
        ax.legend(fontsize=7, ncol=2)
        ax = axes[i, 1]
        for j, eta in enumerate(etas):
            b = biases[name][eta]
            ranks = np.arange(1, K_SHOWN + 1)
            color = f"C{j}"
            ax.plot(ranks, b["true"], "-", color=color, label=f"true θ_r/θ_0, η={eta:g}")
            ax.plot(ranks, b["LambdaMART"], "o--", color=color, label=f"LambdaMART t⁺, η={eta:g}")
            ax.plot(ranks, b["LambdaRank"], "x:", color=color, label=f"LambdaRank t⁺, η={eta:g}")
        ax.set(title=f"{name}: learned click bias t⁺ vs true", xlabel="displayed rank", ylabel="t⁺ (rank 1 = 1)",
               yscale="log")
        ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write(results: dict, biases: dict, args, command: str) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _report import publish_image, write_section

    tmp = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "results")
    os.makedirs(tmp, exist_ok=True)
    png = os.path.join(tmp, "unbiased.png")
    plot(results, biases, png)
    image = publish_image(png, "unbiased.png")
    bias_lines = "\n".join(
        f"| {name} | {eta:g} | " + " | ".join(", ".join(f"{v:.2f}" for v in b[k][:6]) for k in
                                               ("true", "LambdaMART", "LambdaRank")) + " |"
        for name, by_eta in biases.items() for eta, b in by_eta.items())
    body = f"""## Learning from clicks (issue 20)

{DATE}, 2 shared CPU cores (x86_64, {args.threads} threads). Command: `{command}`

Simulated click logs (experiments/unbiased.py): a production LambdaMART trained on 1 % of the training queries
ranks every training query, its top 10 are shown {args.sessions} times per query to a position-based user
(examination (1/(r+1))^η, ε₋ = 0.1, ε₊ = 1), sessions without a click are dropped. Test NDCG@10 on the **true**
labels; folds {args.folds} of MQ2008 (mean) and a synthetic set (1500 queries of 10-60 documents, 30 features,
60/20/20 split). naive: clicks as labels; debiased: rankkit `unbiased=True` (Unbiased LambdaMART's pairwise
debiasing, p = {args.bias_p:g}, 10 positions), LightGBM `position=`, XGBoost `lambdarank_unbiased`; oracle: true
labels. Boosters: {args.rounds} rounds, depth {args.depth}, learning rate 0.1; LambdaRank: configs/lambdarank.yaml
settings, best vali epoch of {args.epochs} (true labels) or {args.log_epochs} (click log). Settings fixed a
priori; nothing was chosen on test.

{table(results)}

{image}

Learned click biases t⁺ at ranks 1-6 (MQ2008: fold {args.folds[0]}) against the truth θ_r / θ_0:

| data | η | true | LambdaMART t⁺ | LambdaRank t⁺ |
|---|---:|---|---|---|
{bias_lines}

Targets at η = 1 (debiased ≥ naive + 0.01; at least half the naive → oracle gap closed; level with LightGBM's and
XGBoost's debiasing):

""" + "\n".join(f"* {t}" for t in targets(results)) + "\n"
    write_section("unbiased", body)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="mq2008,synthetic")
    p.add_argument("--etas", default="0.5,1,2")
    p.add_argument("--folds", default="1", help="MQ2008 folds, e.g. 1 or 1-5")
    p.add_argument("--sessions", type=int, default=50, help="sessions per training query")
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--epochs", type=int, default=40, help="LambdaRank epochs on true labels")
    p.add_argument("--log-epochs", type=int, default=4, help="LambdaRank epochs over a click log")
    p.add_argument("--bias-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--write", action="store_true", help="write docs/benchmarks.md and docs/img/unbiased.png")
    args = p.parse_args(argv)
    command = "python experiments/unbiased.py " + " ".join(argv if argv is not None else sys.argv[1:])
    args.etas = [float(v) for v in args.etas.split(",")]
    lo, _, hi = args.folds.partition("-")
    args.folds = list(range(int(lo), int(hi or lo) + 1))
    torch.set_num_threads(args.threads)
    results, biases = {}, {}
    for name in args.data.split(","):
        runs = [run(name, fold, args) for fold in (args.folds if name == "mq2008" else [1])]
        results[name] = mean_over_folds([r[0] for r in runs])
        biases[name] = runs[0][1]
    print(table(results))
    print("\n".join(targets(results)))
    if args.write:
        write(results, biases, args, command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
