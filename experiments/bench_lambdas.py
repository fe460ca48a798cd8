"""Benchmark the lambda kernel against a plain autograd pairwise loss (B × L × L, as allRank).

    python experiments/bench_lambdas.py            # print the table
    python experiments/bench_lambdas.py --write    # and put it in docs/benchmarks.md

Both sides compute the LambdaRank (|ΔNDCG|-weighted RankNet) gradient of the same padded
batch, in float32: rankkit's :func:`rankkit.lambdas.lambda_gradients` (grad and hess, and
once more with the per-query loss), and the "straightforward" way -- sort by score, build the
[B, L, L] score differences and |ΔNDCG| weights, sum the weighted softplus and call
``torch.autograd.grad`` (loss and grad; autograd gives no Newton term). Throughput counts
every unordered pair of documents of a query, B·L(L−1)/2, per second (best of several runs).
On CPU the timing process runs torch on one thread and counts its CPU time
(``time.process_time``), because the project's 2-core machine is shared with other jobs and
wall time there measures the queue; on CUDA it is wall time. Kernel and baseline are timed
alternately in the same process, so their ratio holds on a busy machine; absolute rates less so.

Peak memory is the growth of the peak resident set size (``ru_maxrss``) during one call, in a
fresh subprocess per method and size, after both were warmed up on a tiny batch: it includes
the inputs' copies and the outputs, not only the pair temporaries.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

from rankkit.lambdas.ranking import discounts, gain_values, ideal_dcg
from rankkit.lambdas import lambda_gradients

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks.md"
START, END = "<!-- bench_lambdas:start -->", "<!-- bench_lambdas:end -->"
# (list length L, queries B): about a million pairs per batch, one query at L = 10,000.
SIZES = [(20, 5_000), (120, 150), (1000, 2), (10_000, 1)]


def autograd_baseline(scores, labels, mask, sigma=1.0):
    """LambdaRank grad by autograd over the full [B, L, L] pair tensor (allRank-style)."""
    s = scores.detach().requires_grad_(True)
    order = torch.sort(scores.detach().masked_fill(~mask, -float("inf")), dim=1,
                       descending=True).indices
    s_sorted, y, m = s.gather(1, order), labels.gather(1, order), mask.gather(1, order)
    diff = s_sorted[:, :, None] - s_sorted[:, None, :]
    pairs = (y[:, :, None] > y[:, None, :]) & m[:, :, None] & m[:, None, :]
    idcg = ideal_dcg(labels, mask)
    g = gain_values(y).masked_fill(~m, 0.0) / idcg.clamp(min=1e-12)[:, None]
    d = discounts(y.shape[1], device=y.device)
    weight = (g[:, :, None] - g[:, None, :]).abs() * (d[:, None] - d[None, :]).abs() * pairs
    loss = (torch.nn.functional.softplus(-sigma * diff) * weight).sum()
    (grad,) = torch.autograd.grad(loss, s)
    return grad, loss


METHODS = {
    "kernel": lambda s, y, m: lambda_gradients(s, y, mask=m, weighting="ndcg"),
    "kernel+loss": lambda s, y, m: lambda_gradients(s, y, mask=m, weighting="ndcg",
                                                    return_loss=True),
    "kernel k=10": lambda s, y, m: lambda_gradients(s, y, mask=m, weighting="ndcg", k=10),
    "autograd": autograd_baseline,
}


def make_batch(length, queries, device):
    gen = torch.Generator().manual_seed(length)
    scores = torch.randn(queries, length, generator=gen)
    labels = torch.randint(0, 5, (queries, length), generator=gen).float()
    mask = torch.ones(queries, length, dtype=torch.bool)
    return scores.to(device), labels.to(device), mask.to(device)


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def time_methods(length, queries, device, names, repeats):
    """Best wall time of each method, alternating methods within each repeat."""
    if device == "cpu":
        torch.set_num_threads(1)
    clock = time.process_time if device == "cpu" else time.perf_counter
    s, y, m = make_batch(length, queries, device)
    best = {name: float("inf") for name in names}
    for name in names:  # warm-up
        METHODS[name](s, y, m)
    for _ in range(repeats):
        for name in names:
            _sync(device)
            start = clock()
            METHODS[name](s, y, m)
            _sync(device)
            best[name] = min(best[name], clock() - start)
    return best


def peak_memory(length, queries, device, name):
    """Growth of peak memory (bytes) during one call, measured in this fresh process."""
    tiny = make_batch(8, 2, device)
    for method in METHODS.values():  # load every code path before measuring
        method(*tiny)
    s, y, m = make_batch(length, queries, device)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        METHODS[name](s, y, m)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    METHODS[name](s, y, m)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024


def _child(args):
    """Entry point of the measuring subprocesses: print one JSON line."""
    if args.child == "time":
        result = time_methods(args.length, args.queries, args.device, args.names.split(","),
                              args.repeats)
    else:
        result = peak_memory(args.length, args.queries, args.device, args.names)
    print(json.dumps(result))


def _run_child(*argv):
    out = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True,
                         cwd=ROOT, check=False)
    if out.returncode != 0:
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def _fmt_rate(pairs, seconds):
    return f"{pairs / seconds / 1e6:,.1f}" if seconds else "n/a"


def _fmt_mib(n):
    return "n/a" if n is None else f"{n / 2**20:,.0f}"


def run(device):
    rows = []
    for length, queries in SIZES:
        names = ["kernel", "kernel+loss", "autograd"] + (["kernel k=10"] if length >= 1000 else [])
        repeats = 2 if length >= 10_000 else 5
        times = _run_child("--child", "time", "--device", device, "--length", str(length),
                           "--queries", str(queries), "--names", ",".join(names),
                           "--repeats", str(repeats))
        mem = {name: _run_child("--child", "memory", "--device", device, "--length", str(length),
                                "--queries", str(queries), "--names", name)
               for name in ("kernel", "autograd")}
        pairs = queries * length * (length - 1) // 2
        t = times or {}
        kernel, base = t.get("kernel"), t.get("autograd")
        row = (f"| {length:,} | {queries:,} | {pairs:,} | {_fmt_rate(pairs, kernel)} | "
               f"{_fmt_rate(pairs, t.get('kernel+loss'))} | {_fmt_rate(pairs, base)} | "
               f"{base / kernel:.1f}× / {base / t['kernel+loss']:.1f}× | "
               if kernel and base else f"| {length:,} | {queries:,} | {pairs:,} | failed | | | | ")
        row += f"{_fmt_mib(mem['kernel'])} | {_fmt_mib(mem['autograd'])} | "
        row += (f"{t['kernel k=10'] * 1e3:,.1f} ms |" if "kernel k=10" in t else "– |")
        print(row, flush=True)
        rows.append(row)
    return rows


def table(device, rows):
    where = (f"CPU ({_cpu_model()}; timed on 1 thread, CPU time)" if device == "cpu"
             else f"{torch.cuda.get_device_name()} (wall time)")
    head = [
        f"**{where}**, torch {torch.__version__}, float32, NDCG weighting, labels uniform in 0..4.",
        "",
        "| L | queries | pairs | kernel Mpairs/s | kernel+loss Mpairs/s | autograd Mpairs/s "
        "| speed-up (grad+hess / +loss) | kernel peak MiB | autograd peak MiB | kernel k=10 |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    return "\n".join(head + rows)


def _cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def write(section_body):
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    section = f"{START}\n{section_body}\n{END}"
    if START in text and END in text:
        text = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: section, text,
                      flags=re.S)
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    parser.add_argument("--devices", default=None,
                        help="comma-separated devices to measure (default: cpu, and cuda if present)")
    parser.add_argument("--child", choices=["time", "memory"], help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu", help=argparse.SUPPRESS)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--queries", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--names", help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return _child(args)

    devices = (args.devices.split(",") if args.devices else
               ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
    tables = [table(device, run(device)) for device in devices]
    body = "\n\n".join([
        "## Lambda kernel",
        f"{datetime.date.today().isoformat()}. Command: `python experiments/bench_lambdas.py --write` "
        f"(load average {os.getloadavg()[0]:.1f} when it started; compare the ratios, measured side "
        f"by side, more than the absolute rates).",
        *tables,
        "Pairs are all unordered document pairs, B·L(L−1)/2. *kernel* is "
        "`lambda_gradients(..., weighting=\"ndcg\")` (grad and hess); *kernel+loss* adds "
        "`return_loss=True`; *autograd* sorts by score, builds the [B, L, L] differences and "
        "|ΔNDCG| weights, and calls `torch.autograd.grad` on the weighted softplus (loss and "
        "grad, no hess). *peak MiB* is the growth of the process's peak RSS (CPU) or of "
        "`torch.cuda.max_memory_allocated` during one call, in a fresh process; the kernel's "
        "pair workspace alone is bounded by `workspace_bytes` (256 MiB by default; on CPU it "
        "works in blocks of at most 2^20 pairs, about 4 MiB per float32 buffer). *kernel k=10* is the wall "
        "time with truncation at 10 (O(B·k·L)).",
    ])
    print(body)
    if args.write:
        write(body)
        print(f"wrote {DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
