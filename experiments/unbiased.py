"""Learning to rank from simulated clicks (issue 20): naive vs oracle vs position-aware rankers.

    python experiments/unbiased.py --data mq2008,synthetic --etas 0.5,1,2 --sessions 50 --rounds 100

For each data set and each position-bias strength η, the protocol of Joachims et al. (WSDM
2017), Ai et al. (SIGIR 2018) and Hu et al. (WWW 2019):

1. a production LambdaMART trained on 1 % of the training queries orders every training query;
2. the top 10 are shown ``--sessions`` times per query to a position-based user (examination
   (1/(r+1))^η, click noise ε₋ = 0.1, ε₊ = 1); sessions without a click are dropped;
3. rankers are trained on the click log and scored by NDCG@10 on the test queries' true labels:

   * oracle: rankkit LambdaMART on the true labels of the training queries (the skyline);
   * production: the 1 % ranker itself (the floor);
   * naive: rankkit LambdaMART with the clicks as labels, sessions as queries;
   * lightgbm naive / lightgbm position: LightGBM lambdarank on the same log, without and with
     ``position=`` (LightGBM >= 4.1 learns position factors jointly with the trees);
   * unbiased: Unbiased LambdaMART -- THE HOOK below, waiting for the booster's ``pair_weights``.

The learned click biases t⁺ of rankkit's estimator (scores fixed to the oracle's, p = 0) are
printed beside the true examination probabilities. Prints tables; writes nothing.
"""
from __future__ import annotations

import argparse
import math
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
from rankkit.unbiased import PropensityEstimator

K_SHOWN = 10


def load(name: str, fold: int, seed: int):
    """(train, test, top label) of a data set."""
    if name == "mq2008":
        train, _, test = load_mq2008(fold)
        return train, test, 2.0
    if name == "synthetic":
        data = make_synthetic(1500, (10, 60), 30, seed=seed)
        perm = torch.randperm(data.n_queries, generator=torch.Generator().manual_seed(seed))
        cut = int(0.8 * data.n_queries)
        return data.subset(perm[:cut].sort().values), data.subset(perm[cut:].sort().values), 4.0
    raise ValueError(f"`--data` has to name mq2008 or synthetic, got {name!r}")


def test_ndcg(scores, test) -> float:
    s, mask = pad(torch.as_tensor(np.asarray(scores), dtype=torch.float32), test.sizes)
    y, _ = pad(test.labels, test.sizes)
    return float(ndcg(s, y, mask=mask, k=10).mean())


def booster(args) -> LambdaMART:
    return LambdaMART(n_estimators=args.rounds, depth=args.depth, learning_rate=0.1, seed=args.seed)


def train_lightgbm(log, args, *, position: bool):
    import lightgbm as lgb

    x = log.sessions.features.numpy()
    train = lgb.Dataset(x, label=log.clicks.numpy(), group=log.sessions.sizes.numpy(),
                        position=log.position.numpy() if position else None)
    params = {"objective": "lambdarank", "num_leaves": 2 ** args.depth, "learning_rate": 0.1,
              "min_data_in_leaf": 20, "verbosity": -1, "seed": args.seed, "num_threads": args.threads}
    return lgb.train(params, train, num_boost_round=args.rounds)


# ------------------------------------------------------------------------------------------------
# HOOK (Unbiased LambdaMART): the booster learns from the log with every pair (i clicked, j not)
# weighted by 1 / (t⁺(pos i) t⁻(pos j)), the biases re-estimated after each round from the
# current scores. What it needs from the booster, once the kernel has
# ``pair_weights=(upper, lower)``: per round,
#     estimator.update(scores [S, K], clicks [S, K], positions [S, K], mask)   # t⁺, t⁻
#     upper, lower = estimator.pair_factors(positions, mask)                  # [S, K] each
#     grad, hess = lambda_gradients(scores, clicks, ..., pair_weights=(upper, lower))
# i.e. a per-round callback (or an objective object) that can see the padded scores and set the
# pair weights. Until it exists this returns None and the table prints "n/a".
def train_unbiased(log, args):
    return None
# ------------------------------------------------------------------------------------------------


def estimated_biases(log, scores_of_rows, n_positions: int) -> torch.Tensor:
    """t⁺ of rankkit's estimator with the scores fixed (p = 0, the paper's |ΔNDCG| weights)."""
    batch, positions = log.padded()
    scores, _ = pad(torch.as_tensor(np.asarray(scores_of_rows), dtype=torch.float32), log.sessions.sizes)
    est = PropensityEstimator(n_positions, p=0.0)
    return est.update(scores, batch.labels, positions, batch.mask, iterations=50).t_plus


def run(name: str, args) -> list[tuple]:
    train, test, top = load(name, args.fold, args.seed)
    t0 = time.perf_counter()
    prod = production_ranker(train, fraction=0.01, n_estimators=50, depth=3, min_data_in_leaf=5, seed=args.seed)
    prod_scores = production_scores(prod, train)
    oracle = booster(args).fit(train)
    rows = [(name, "-", "oracle (true labels)", test_ndcg(oracle.predict(test), test), "-"),
            (name, "-", "production (1 % of queries)", test_ndcg(prod.predict(test), test), "-")]
    print(f"{name}: {train.n_queries} train / {test.n_queries} test queries, production + oracle in "
          f"{time.perf_counter() - t0:.1f}s", file=sys.stderr)
    for eta in args.etas:
        model = PositionBasedModel(eta=eta, epsilon_plus=1.0, epsilon_minus=0.1, max_label=top)
        log = simulate_clicks(train, prod_scores, model=model, sessions_per_query=args.sessions, k=K_SHOWN,
                              seed=args.seed, drop_unclicked=True)
        size = f"{log.n_sessions} sessions"
        naive = booster(args).fit(log.sessions.features, log.clicks, group=log.sessions.sizes)
        rows.append((name, eta, "naive (clicks as labels)", test_ndcg(naive.predict(test.features), test), size))
        x_test = test.features.numpy()
        for position in (False, True):
            lgbm = train_lightgbm(log, args, position=position)
            rows.append((name, eta, f"lightgbm lambdarank{' + position' if position else ''}",
                         test_ndcg(lgbm.predict(x_test), test), size))
        unbiased = train_unbiased(log, args)
        rows.append((name, eta, "unbiased lambdamart (hook)",
                     test_ndcg(unbiased.predict(test.features), test) if unbiased is not None else float("nan"),
                     size))
        t_plus = estimated_biases(log, oracle.predict(log.sessions.features), K_SHOWN)
        truth = model.examination(K_SHOWN)
        print(f"{name} eta={eta}: click rate by position (sessions with a click) "
              f"{[round(v, 3) for v in log.click_rate_by_position(K_SHOWN).tolist()]}\n"
              f"    t+ estimated (oracle scores fixed) {[round(v, 3) for v in t_plus.tolist()]}\n"
              f"    true (1/(r+1))^eta                 {[round(v, 3) for v in truth.tolist()]}")
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="mq2008,synthetic")
    p.add_argument("--etas", default="0.5,1,2")
    p.add_argument("--sessions", type=int, default=50, help="sessions per training query")
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--fold", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    args.etas = [float(v) for v in args.etas.split(",")]
    torch.set_num_threads(args.threads)
    rows = [row for name in args.data.split(",") for row in run(name, args)]
    print("\n| data | η | ranker | test NDCG@10 | log |\n|---|---|---|---|---|")
    for name, eta, ranker, value, size in rows:
        print(f"| {name} | {eta} | {ranker} | {'n/a' if math.isnan(value) else f'{value:.4f}'} | {size} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
