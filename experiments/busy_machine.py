"""A fit beside one other busy process: rankkit's slowdown against LightGBM's, in one run.

Each fit runs in its own process (the library imported fresh, its default threads): a
LambdaMART fit on MQ2008 Fold1 (bundled), 100 rounds of depth 6, lr 0.1, vali as the eval set
scored every round, no early stopping; LightGBM's LGBMRanker with 64 leaves, max_depth 6 and
the same settings. "quiet" runs alone; "busy" runs beside one process that spins a core
(``python -c "while True: pass"``), started a second before. The slowdown is busy / quiet
of each library's median over ``--repeats`` fits, conditions and libraries interleaved.

rankkit is run at its default ``n_jobs=None`` (the thread governor,
``rankkit.infra.threads.ThreadGovernor``) and at ``n_jobs`` = every core, which keeps the count
fixed (the behaviour before the governor).

    python experiments/busy_machine.py --repeats 5 --write
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import command_line, write_section  # noqa: E402

RANKKIT = r"""
import sys, time
from rankkit.boosting import LambdaMART
from rankkit.data.bundled import load_mq2008
train, vali, _ = load_mq2008(1)
n_jobs = None if sys.argv[1] == "default" else int(sys.argv[1])
t = time.perf_counter()
LambdaMART(n_estimators=100, depth=6, learning_rate=0.1, min_data_in_leaf=20, n_jobs=n_jobs).fit(
    train, eval_set=[vali])
print(time.perf_counter() - t)
"""
LIGHTGBM = r"""
import time, warnings
import lightgbm as lgb
from rankkit.data.bundled import load_mq2008
warnings.filterwarnings("ignore")
train, vali, _ = load_mq2008(1)
arrays = [(d.features.numpy(), d.labels.numpy(), d.sizes.numpy()) for d in (train, vali)]
(x, y, g), (xv, yv, gv) = arrays
t = time.perf_counter()
lgb.LGBMRanker(n_estimators=100, num_leaves=64, max_depth=6, learning_rate=0.1, min_child_samples=20,
               verbose=-1).fit(x, y, group=g, eval_set=[(xv, yv)], eval_group=[gv], eval_at=[10])
print(time.perf_counter() - t)
"""


def fit_seconds(code: str, *args: str) -> float:
    out = subprocess.run([sys.executable, "-c", code, *args], check=True, capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def measure(repeats: int, cores: int) -> dict[tuple[str, str], list[float]]:
    cases = {"rankkit (n_jobs=None, governed)": (RANKKIT, "default"),
             f"rankkit (n_jobs={cores}, fixed)": (RANKKIT, str(cores)),
             "LightGBM (default threads)": (LIGHTGBM,)}
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(repeats):
        for condition in ("quiet", "busy"):
            spinner = None
            if condition == "busy":
                spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
                time.sleep(1.0)
            try:
                for name, (code, *args) in cases.items():
                    times.setdefault((name, condition), []).append(fit_seconds(code, *args))
            finally:
                if spinner is not None:
                    spinner.kill()
                    spinner.wait()
    return times


def table(times: dict, repeats: int, cores: int) -> str:
    names = list(dict.fromkeys(name for name, _ in times))
    lines = [f"Measured {datetime.date.today()}, {platform.machine()} {cores} cores, {repeats} fits per cell "
             f"(median), command: `{command_line(__file__)}`.", "",
             "| library | quiet s | beside one busy process s | slowdown | all quiet fits | all busy fits |",
             "|---|---:|---:|---:|---|---|"]
    for name in names:
        quiet, busy = statistics.median(times[(name, "quiet")]), statistics.median(times[(name, "busy")])
        fmt = lambda xs: ", ".join(f"{x:.2f}" for x in xs)  # noqa: E731
        lines.append(f"| {name} | {quiet:.2f} | {busy:.2f} | {busy / quiet:.2f}x | {fmt(times[(name, 'quiet')])} | "
                     f"{fmt(times[(name, 'busy')])} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--write", action="store_true", help="replace the busy_machine section of docs/benchmarks.md")
    args = ap.parse_args(argv)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    body = table(measure(args.repeats, cores), args.repeats, cores)
    print(body)
    if args.write:
        write_section("busy_machine", body)


if __name__ == "__main__":
    main()
