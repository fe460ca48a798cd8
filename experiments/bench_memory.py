"""Peak memory against rounds: does a LambdaMART fit hold memory per round? rankkit beside LightGBM.

    python experiments/bench_memory.py                       # 300k documents, 50 and 400 rounds
    python experiments/bench_memory.py --write               # + the table in docs/benchmarks.md
    python experiments/bench_memory.py --queries 40 --rounds 5 20   # a quick run

Each (library, rounds) is its own process (a fresh peak): it builds the same MSLR-like data
(experiments/bench_gpu.py ``mslr_like``: long-tailed query lengths, 136 heavy-tailed features),
fits depth-6 LambdaMART with NDCG@10 for exactly that many rounds (no eval set, no early
stopping), and reports its peak resident memory (``ru_maxrss``). The data and binning cost the
same at every round count, so the growth between two round counts is what the rounds hold.
Before rankkit's fix every kept tree held its [N] int64 leaf index: 8 bytes per document per
round (about 0.8 GB over 350 rounds here).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _child(library: str, rounds: int, queries: int, features: int, threads: int) -> dict:
    import numpy as np
    import torch
    from bench_gpu import mslr_like

    torch.set_num_threads(threads)
    data = mslr_like(queries, features, 0)
    t0 = time.perf_counter()
    if library == "rankkit":
        from rankkit.boosting import LambdaMART

        LambdaMART(n_estimators=rounds, depth=6, k=10, learning_rate=0.1, seed=0).fit(
            data.features, data.labels, group=data.sizes)
    else:
        import lightgbm as lgb

        ds = lgb.Dataset(data.features.numpy(), data.labels.numpy(), group=data.sizes.numpy())
        lgb.train({"objective": "lambdarank", "max_depth": 6, "num_leaves": 64, "learning_rate": 0.1,
                   "lambdarank_truncation_level": 10, "num_threads": threads, "verbosity": -1, "seed": 0},
                  ds, num_boost_round=rounds)
    return {"library": library, "rounds": rounds, "seconds": time.perf_counter() - t0,
            "docs": int(data.sizes.sum()), "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "numpy": np.__version__}


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=2_500, help="2,500 MSLR-like queries: about 300k documents")
    ap.add_argument("--features", type=int, default=136)
    ap.add_argument("--rounds", type=int, nargs=2, default=[50, 400])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--libraries", nargs="+", default=["rankkit", "lightgbm"])
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child[0], int(args.child[1]), args.queries, args.features, args.threads)))
        return []
    rows = []
    for library in args.libraries:
        for rounds in args.rounds:
            cmd = [sys.executable, os.path.abspath(__file__), "--child", library, str(rounds), "--queries",
                   str(args.queries), "--features", str(args.features), "--threads", str(args.threads)]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                rows.append({"library": library, "rounds": rounds, "error": done.stderr.strip().splitlines()[-1:]})
            else:
                rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(rows[-1], flush=True)
    lo, hi = args.rounds
    lines = ["| library | peak MiB, %d rounds | peak MiB, %d rounds | growth MiB | growth per round, bytes per document |"
             % (lo, hi), "|---|---:|---:|---:|---:|"]
    for library in args.libraries:
        a, b = (next(r for r in rows if r["library"] == library and r["rounds"] == n) for n in (lo, hi))
        if "error" in a or "error" in b:
            lines.append(f"| {library} | failed: {a.get('error') or b.get('error')} | | | |")
            continue
        growth = b["peak_mib"] - a["peak_mib"]
        per_doc = growth * 2**20 / (hi - lo) / b["docs"]
        lines.append(f"| {library} | {a['peak_mib']:,.0f} | {b['peak_mib']:,.0f} | {growth:+,.0f} | {per_doc:+.2f} |")
    from _report import command_line

    docs = rows[0].get("docs", "?")
    body = "\n".join([
        "## Memory against rounds (LambdaMART fit, peak resident memory)",
        "",
        f"{time.strftime('%Y-%m-%d')}, {platform.machine()} with {os.cpu_count()} cores, {args.threads} threads. "
        f"Command: `{command_line(__file__, argv)}`. MSLR-like data: {docs:,} documents in {args.queries:,} "
        f"queries, {args.features} features; depth 6, NDCG@10, no eval set; each fit in its own process. "
        "The growth is what the rounds hold (the data and the binning are the same at both counts).",
        "",
        *lines,
    ])
    print(body)
    if args.write:
        from _report import write_section

        write_section("bench_memory", body)
    return rows


if __name__ == "__main__":
    main()
