"""Reading and scoring large LETOR files (issue 26): time and peak memory, side by side.

Generates dense 46-feature LETOR files of 1M and 4M lines in /tmp (heavy-tailed values written as
``%.6g``, so some with exponents; query lengths long-tailed from 1 to 1000), then, each in a fresh
process so that its peak RSS is its own:

* ``rankkit.data.read_svmlight`` on both files (the streaming block reader: the linearity check);
* scikit-learn's ``load_svmlight_file`` (``query_id=True``, a CSR matrix, not dense) on the 1M file;
* LightGBM's ``Dataset(file).construct()`` on the same lines written LightGBM's way (no ``qid:``,
  a ``.query`` sidecar: LightGBM's parser refuses ``qid:``); this also bins the features;
* ``rankkit predict MODEL --input FILE -o OUT`` (the CLI, streaming) on the 1M file, with a
  LambdaMART model (20 trees of depth 6) trained on the first 5k lines.

Peak memory is the process's high-water RSS (``VmHWM``); "over imports" subtracts the RSS the process had after
its imports, before reading, and is compared with the bytes of the arrays returned
(features [N, 46] float32 + labels). Run:

    nice python experiments/bench_io.py --write           # 1M and 4M lines (a few GB in /tmp)
    python experiments/bench_io.py --lines 20000 --big 0  # a quick check
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import command_line, write_section  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
F = 46


def generate(path: str, n_lines: int, seed: int = 0, lightgbm_path: str | None = None) -> None:
    """A dense LETOR file of ``n_lines`` lines (and optionally the same lines in LightGBM's layout)."""
    rng = np.random.default_rng(seed)
    templates = 4096  # distinct feature rows, reused: the parser's work does not depend on repeats
    values = rng.lognormal(0.0, 2.5, (templates, F)) * rng.choice([1.0, 1.0, 1.0, -1.0], (templates, F))
    values[rng.random((templates, F)) < 0.2] = 0.0
    bodies = [" ".join(f"{j + 1}:{v:.6g}" for j, v in enumerate(row)) for row in values]
    sizes = np.minimum(np.ceil(rng.pareto(0.9, n_lines) + 1), 1000).astype(np.int64)
    sizes = sizes[np.cumsum(sizes) <= n_lines]
    sizes = np.append(sizes, n_lines - sizes.sum()) if sizes.sum() < n_lines else sizes
    qid = np.repeat(np.arange(len(sizes)), sizes)
    labels = rng.integers(0, 5, n_lines)
    pick = rng.integers(0, templates, n_lines)
    out = open(path, "w")
    lgb = open(lightgbm_path, "w") if lightgbm_path else None
    step = 100_000
    for start in range(0, n_lines, step):
        rows = range(start, min(start + step, n_lines))
        out.write("".join(f"{labels[r]} qid:{qid[r]} {bodies[pick[r]]}\n" for r in rows))
        if lgb:
            lgb.write("".join(f"{labels[r]} {bodies[pick[r]]}\n" for r in rows))
    out.close()
    if lgb:
        lgb.close()
        with open(lightgbm_path + ".query", "w") as f:
            f.write("\n".join(map(str, sizes[sizes > 0].tolist())) + "\n")


# VmHWM, not ru_maxrss: Linux keeps a parent's ru_maxrss across fork and exec.
MEASURE = """
import json, sys, time
sys.path.insert(0, {root!r})
def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
{imports}
base = hwm()
t0 = time.perf_counter()
{work}
seconds = time.perf_counter() - t0
peak = hwm()
print("RESULT " + json.dumps(dict(seconds=seconds, peak=peak, base=base, arrays=arrays, n=n)))
"""

TASKS = {
    "rankkit read_svmlight": (
        "import numpy, torch\nfrom rankkit.data import read_svmlight",
        "ds = read_svmlight({path!r})\narrays = ds.features.numel() * 4 + ds.labels.numel() * 4\nn = ds.n_docs"),
    "scikit-learn load_svmlight_file (CSR)": (
        "import numpy\nfrom sklearn.datasets import load_svmlight_file",
        "X, y, q = load_svmlight_file({path!r}, query_id=True, dtype=numpy.float32)\n"
        "arrays = X.data.nbytes + X.indices.nbytes + X.indptr.nbytes + y.nbytes + q.nbytes\nn = X.shape[0]"),
    "LightGBM Dataset(file).construct() (parse + bin)": (
        "import lightgbm",
        "d = lightgbm.Dataset({lgb_path!r}, params=dict(verbose=-1, num_threads=2)).construct()\n"
        "arrays = 0\nn = d.num_data()"),
    "rankkit predict (CLI, streaming)": (
        "from rankkit.cli import main",
        "rc = main(['predict', {model!r}, '--input', {path!r}, '-o', {out!r}])\nassert rc == 0\n"
        "arrays = 0\nn = sum(1 for _ in open({out!r}))"),
}


def measure(task: str, **paths) -> dict:
    imports, work = TASKS[task]
    code = MEASURE.format(root=ROOT, imports=imports, work=work.format(**paths))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": ROOT})
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not line:
        return {"task": task, "error": (proc.stderr.strip().splitlines() or ["?"])[-1][:200]}
    return {"task": task, **json.loads(line[0][7:])}


def train_model(path: str, model: str) -> None:
    from rankkit.boosting import LambdaMART
    from rankkit.data import read_svmlight

    head = path + ".head"
    with open(path) as src, open(head, "w") as dst:
        for i, line in enumerate(src):
            if i >= 5_000:
                break
            dst.write(line)
    data = read_svmlight(head)
    LambdaMART(n_estimators=20, depth=6, seed=0).fit(data).save(model)
    os.unlink(head)


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lines", type=int, default=1_000_000)
    p.add_argument("--big", type=int, default=4_000_000, help="the second, larger file (0: none)")
    p.add_argument("--dir", default="/tmp/rankkit_bench_io")
    p.add_argument("--skip", default="", help="comma-separated task names to skip (substrings)")
    p.add_argument("--write", action="store_true", help="write the docs/benchmarks.md section")
    p.add_argument("--results", default=None,
                   help="JSON-lines file: append each measurement; --write tabulates every row in it")
    p.add_argument("--gather", action="store_true", help="measure nothing: tabulate --results")
    args = p.parse_args(argv)
    if args.gather:
        with open(args.results) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        return publish(rows, args, argv)
    os.makedirs(args.dir, exist_ok=True)
    sizes = [args.lines] + ([args.big] if args.big else [])
    model = os.path.join(args.dir, "model.lmart")
    rows = []
    for n in sizes:
        path = os.path.join(args.dir, f"letor_{n}.txt")
        lgb_path = (os.path.join(args.dir, f"lightgbm_{n}.txt")
                    if n == args.lines and "LightGBM" not in args.skip else None)
        if not os.path.exists(path) or (lgb_path and not os.path.exists(lgb_path)):
            t0 = time.perf_counter()
            generate(path, n, lightgbm_path=lgb_path)
            print(f"generated {path} ({os.path.getsize(path) / 2**20:.0f} MiB) in {time.perf_counter() - t0:.0f} s",
                  flush=True)
        if not os.path.exists(model):
            train_model(path, model)
        out = os.path.join(args.dir, "scores.tsv")
        for task in TASKS:
            if any(s and s in task for s in args.skip.split(",")):
                continue
            if n != args.lines and task != "rankkit read_svmlight":
                continue  # the other tasks on the first file only
            r = measure(task, path=path, lgb_path=lgb_path, model=model, out=out)
            r.update(lines=n, mib=os.path.getsize(path) / 2**20)
            print(json.dumps(r), flush=True)
            rows.append(r)
            if args.results:
                with open(args.results, "a") as f:
                    f.write(json.dumps(r) + "\n")
    if args.results and args.write:
        with open(args.results) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    return publish(rows, args, argv)


def publish(rows: list[dict], args, argv) -> list[dict]:
    """Print the table; with ``--write``, put it in docs/benchmarks.md."""
    md = table(rows)
    print(md)
    if args.write:
        reads = {r["lines"]: r["seconds"] for r in rows if r["task"] == "rankkit read_svmlight" and "seconds" in r}
        small, big = min(reads, default=0), max(reads, default=0)
        ratio = (f" Reading {big:,} lines took {reads[big] / reads[small]:.2f}x the time of "
                 f"{small:,} (linear: {big / small:.0f}x)." if len(reads) >= 2 else "")
        cmd = command_line(__file__, argv)
        body = (f"## Reading and scoring large LETOR files (issue 26)\n\n"
                f"{datetime.date.today().isoformat()}, {platform.processor() or platform.machine()}, 2 CPU cores "
                f"shared with other jobs (load average about 7-10 during the run, so every time here is "
                f"inflated, the ratios between rows of one run less so). Command: `{cmd}`. Dense 46-feature "
                f"LETOR files (values `%.6g` of a heavy-tailed lognormal, 20% zeros; query lengths "
                f"long-tailed, 1 to 1000), each task in a fresh process. Peak RSS is the process's "
                f"high-water RSS (`VmHWM`); \"over imports\" subtracts its RSS after the imports; arrays are the "
                f"returned features + labels (scikit-learn: its CSR arrays).{ratio}\n\n{md}\n")
        write_section("bench_io", body)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| task | lines | file MiB | seconds | peak RSS MiB | over imports MiB | arrays MiB | "
             "over imports / arrays |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['task']} | {r['lines']:,} | {r['mib']:.0f} | failed: {r['error']} | | | | |")
            continue
        over = (r["peak"] - r["base"]) / 2**20
        arrays = r["arrays"] / 2**20
        lines.append(f"| {r['task']} | {r['lines']:,} | {r['mib']:.0f} | {r['seconds']:.1f} | "
                     f"{r['peak'] / 2**20:.0f} | {over:.0f} | {arrays:.0f} | "
                     + (f"{over / arrays:.2f} |" if arrays else "|"))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
