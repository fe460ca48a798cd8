"""A boosting round's lambda pass and eval metric: operations and host syncs per round on the
simulated CUDA device, and milliseconds per round on MQ2008 Fold1 (issue 24, the per-data-set
plan).

    python experiments/bench_plan.py --mode ops             # launches and syncs per round
    python experiments/bench_plan.py --mode time --rounds 100 --threads 1

``--mode ops`` runs the second round of a depth-6 run with one eval set on the simulated device
(tests/simcuda.py) and splits its counts into the tree (``BoostingEngine._grow``), the lambda
pass (``objective.gradients``), the eval metric (``engine.metric``) and the rest of the round
(all but the tree: the lambda pass, the score updates, the eval metric and the bookkeeping).
``--mode time`` times ``BoostingEngine.update`` on MQ2008 Fold1 (train, vali as the eval set)
and the lambda pass inside it (``objective.gradients``); the median round is reported, as wall
time and as the thread's CPU time (``time.thread_time``, which a shared, loaded machine inflates
much less; with ``--threads 1`` all of torch's work runs on the calling thread).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))


def _wrap(owner, name, bucket, counts=None):
    """Replace ``owner.name`` by a version that adds its time (or its simulated counts) to bucket."""
    inner = getattr(owner, name)

    def wrapped(*args, **kwargs):
        if counts is not None:
            before = dict(counts.snapshot(), sites=dict(counts.sync_sites))
            out = inner(*args, **kwargs)
            after = counts.snapshot()
            for key in ("launches", "syncs"):
                bucket[key] = bucket.get(key, 0) + after[key] - before[key]
            return out
        t0 = time.thread_time()
        out = inner(*args, **kwargs)
        bucket.append(time.thread_time() - t0)
        return out

    setattr(owner, name, wrapped)


def ops(args) -> list[dict]:
    from simcuda import simcuda

    from rankkit.boosting.engine import BoosterConfig, BoostingEngine
    from rankkit.data import make_synthetic

    rows = []
    for n_queries, docs in ((8, 20), (50, 40), (200, 100)):
        data = make_synthetic(n_queries, docs, 6, seed=4)
        valid = make_synthetic(max(4, n_queries // 2), docs, 6, seed=5)
        with simcuda() as counts:
            engine = BoostingEngine(data.features, data.labels, data.sizes,
                                    BoosterConfig(depth=6, min_data_in_leaf=3, k=args.k), device="cuda")
            engine.add_eval_set(valid.features, valid.labels, valid.sizes)
            engine.update()
            tree: dict = {}
            lam: dict = {}
            metric: dict = {}
            _wrap(engine, "_grow", tree, counts)
            _wrap(engine.objective, "gradients", lam, counts)
            _wrap(engine, "metric", metric, counts)
            counts.reset()
            engine.update()
            snap, sites = counts.snapshot(), dict(counts.sync_sites)
        rows.append({"docs": data.n_docs, "round_launches": snap["launches"], "round_syncs": snap["syncs"],
                     "tree_launches": tree["launches"], "tree_syncs": tree["syncs"],
                     "lambda_launches": lam["launches"], "lambda_syncs": lam["syncs"],
                     "metric_launches": metric["launches"], "metric_syncs": metric["syncs"],
                     "rest_launches": snap["launches"] - tree["launches"],
                     "rest_syncs": snap["syncs"] - tree["syncs"], "sync_sites": sites})
    return rows


def timing(args) -> dict:
    import torch

    from rankkit.boosting.engine import BoosterConfig, BoostingEngine
    from rankkit.data.bundled import load_mq2008

    torch.set_num_threads(args.threads)
    train, vali, _ = load_mq2008(1)
    config = BoosterConfig(depth=6, learning_rate=0.05, l2=1.0, min_data_in_leaf=20, k=10, normalize=True)
    engine = BoostingEngine(train.features, train.labels, train.sizes, config)
    engine.add_eval_set(vali.features, vali.labels, vali.sizes)
    lam: list[float] = []
    _wrap(engine.objective, "gradients", lam)
    for _ in range(5):
        engine.update()
    lam.clear()
    rounds, cpu = [], []
    for _ in range(args.rounds):
        t0, c0 = time.perf_counter(), time.thread_time()
        engine.update()
        rounds.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    return {"ms_per_round": 1e3 * statistics.median(rounds), "cpu_ms_per_round": 1e3 * statistics.median(cpu),
            "lambda_cpu_ms": 1e3 * statistics.median(lam),
            "rounds": args.rounds, "threads": args.threads,
            "final_vali": engine.history["valid_0"]["ndcg@10"][-1]}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("ops", "time"), default="ops")
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--k", type=int, default=10)
    args = ap.parse_args(argv)
    out = ops(args) if args.mode == "ops" else timing(args)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
