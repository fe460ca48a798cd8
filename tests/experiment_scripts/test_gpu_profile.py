"""The GPU check's profile and microbenchmarks (experiments/gpu_profile.py,
experiments/gpu_microbench.py, experiments/gpu_check.sh), exercised on the CPU: a GPU is lent
for minutes, so every step must already have run here.

* the profile runs every step on a small MSLR-like set and writes its record, tables and
  traces; its phases add up to no more than the round; ``--render`` makes docs/gpu_check.md;
* a step that raises or overruns its cap is logged and skipped, and the next one still runs;
* the microbenchmark kernels compile for an H100 (sm_90) with no GPU, and run under Triton's
  interpreter (a subprocess: the variable must be set before triton is imported);
* the shell script parses.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "experiments"))


def test_gpu_profile_smoke_run_on_the_cpu(tmp_path):
    import gpu_profile

    record = gpu_profile.main(["--device", "cpu", "--queries", "16", "--features", "4", "--out", str(tmp_path),
                               "--repeats", "2"])
    assert all(step["ok"] for step in record["steps"].values()), record["steps"]
    assert set(record["steps"]) == {"warm-up (2 rounds)", "memory per round", "phases", "kernels (default)",
                                    "lambda variants", "kernels (quantized)", "round with k=None",
                                    "round as a CUDA graph"}
    graph = record["graph"]  # on the CPU no graph: both runs eager, the same trees
    assert graph["same_trees"] and graph["eager_ms"] > 0 and graph["graph_ms"] > 0
    phases = record["phases"]
    assert {"lambdas", "tree (levels and leaves)", "train scores", "eval set: scores + metric",
            "host copy (the sync)"} <= set(phases)
    assert sum(v for k, v in phases.items() if not k.startswith("round")) <= phases["round (wall, phases synced)"]
    assert set(record["lambda_variants"]) == {"planned (the round's path)", "planned, k=None", "planned, torch path",
                                              "public lambda_gradients (validates, plans)"}
    kernels = record["kernels_default"]["kernels"]
    assert kernels and abs(sum(r["pct"] for r in kernels) - 100.0) < 1.0 or len(kernels) == 40
    for name in ("gpu_run.json", "profile.txt", "trace_default.json.gz", "trace_quantized.json.gz"):
        assert (tmp_path / name).stat().st_size > 0, name
    saved = json.loads((tmp_path / "gpu_run.json").read_text())
    assert saved["data"] == record["data"]
    page = gpu_profile.render(saved)
    assert page.startswith("# GPU check") and "phases (ms per round" in page and "lambda pass variants" in page


def test_gpu_profile_a_failing_or_slow_step_is_logged_and_the_next_runs(capsys):
    import gpu_profile

    record = {}
    run = gpu_profile.Run(30.0, record)

    def broken():
        raise RuntimeError("CUDA error: an illegal memory access\nsecond line")

    def slow():
        time.sleep(5)

    assert run.step("broken", 10, broken) is None
    t0 = time.monotonic()
    assert run.step("slow", 0.3, slow) is None
    assert time.monotonic() - t0 < 3
    assert run.step("fine", 10, lambda: 42) == 42
    assert record["steps"]["broken"] == {"ok": False, "error": "RuntimeError: CUDA error: an illegal memory access",
                                         "s": record["steps"]["broken"]["s"]}
    assert record["steps"]["slow"]["error"].startswith("StepTimeout")
    assert record["steps"]["fine"]["ok"]
    late = gpu_profile.Run(0.0, {})
    assert late.step("late", 10, lambda: 1) is None and late.record["steps"]["late"]["error"].startswith("skipped")


def test_gpu_microbench_kernels_compile_for_sm90():
    pytest.importorskip("triton")
    import gpu_microbench
    from triton.compiler import ASTSource

    import triton
    from rankkit.kernels.triton.aot import H100

    cases = [(gpu_microbench._reduce_kernel, {"out_ptr": out, "idx_ptr": "*i64", "N": "i32"},
              {"BLOCK": 1024, "CTA": cta}) for out in ("*i32", "*i64") for cta in (False, True)]
    cases += [(gpu_microbench._empty_kernel, {"n_ptr": "*i32", "out_ptr": "*i32"}, {}),
              (gpu_microbench._block_histogram_kernel, {"codes_ptr": "*i32", "out_ptr": "*i32", "N": "i32"},
               {"BINS": 256, "BLOCK": 1024}),
              (gpu_microbench._dot_histogram_kernel, {"codes_ptr": "*u8", "g_ptr": "*i8", "h_ptr": "*i8",
                                                      "out_ptr": "*i32", "N": "i32"}, {"BLOCK_N": 256})]
    for fn, types, constexprs in cases:
        signature = {a: types.get(a, "constexpr") for a in fn.arg_names}
        compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs), target=H100)
        ptx = compiled.asm["ptx"]
        if fn is gpu_microbench._dot_histogram_kernel:  # the tile product on the tensor cores (int8)
            assert "mma" in ptx and ".s8" in ptx
        if fn is gpu_microbench._reduce_kernel:  # relaxed reductions, at the scope asked for
            assert "red." in ptx and ".relaxed." in ptx and "fence." not in ptx
            assert (".cta." in ptx) == constexprs["CTA"]


def test_gpu_microbench_runs_under_the_interpreter(tmp_path):
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k not in ("RANKKIT_TRITON",)}
    env.update(TRITON_INTERPRET="1", PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""))
    path = tmp_path / "micro.json"
    done = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "gpu_microbench.py"), "--device", "cpu",
                           "--small", "--json", str(path)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(path.read_text())
    assert all(r["sums_right"] for r in record["dot_histogram"])  # the privatised sums are exact
    for name in ("copy", "atomics", "histogram_kernel", "empty_grid", "tl_histogram", "dot_histogram"):
        rows = record[name] if isinstance(record[name], list) else [record[name]]
        assert rows and all("error" not in r for r in rows), (name, rows)
    assert len(record["atomics"]) == 2 * 3 * 2  # u32/u64 x cells x scope
    # without a GPU the shared-memory histogram's first contact refuses it: said, not hidden
    assert "first-contact check refused" in record["smem_histogram"]["error"]


def test_gpu_check_script_parses():
    done = subprocess.run(["bash", "-n", os.path.join(ROOT, "experiments", "gpu_check.sh")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
