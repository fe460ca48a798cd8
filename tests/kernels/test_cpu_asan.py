"""The compiled CPU kernels under AddressSanitizer.

Builds rankkit/kernels/_cpu.c and _lambdas.c with ``-fsanitize=address`` (and OpenMP, as the
installed build) into a temporary library, and runs the kernel tests and the seam's fuzz
(tests/kernels/test_backends.py, test_cpu_lambdas.py, test_cpu_fuzz.py, tests/boosting/test_tree_quantized.py) in a
subprocess that loads that build (``RANKKIT_CPU_LIBRARY``) with the sanitizer's runtime
preloaded. Any out-of-bounds access, use after free or double free in the C code aborts the
subprocess with AddressSanitizer's report, which this test prints. Skipped where gcc or its
libasan is missing.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCES = [os.path.join(ROOT, "rankkit", "kernels", name) for name in ("_cpu.c", "_lambdas.c")]


def _gcc_file(name: str) -> str | None:
    path = subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else None


def _libasan() -> str | None:
    """The sanitizer's runtime to preload, with libstdc++ (without it, a C++ exception thrown by
    a library loaded later -- matplotlib's ft2font at import -- trips an ASan CHECK)."""
    if shutil.which("gcc") is None:
        return None
    asan, cxx = _gcc_file("libasan.so"), _gcc_file("libstdc++.so.6")
    return None if asan is None else " ".join(p for p in (asan, cxx) if p)


@pytest.fixture(scope="module")
def asan_build(tmp_path_factory):
    runtime = _libasan()
    if runtime is None:
        pytest.skip("gcc with AddressSanitizer (libasan) is not installed")
    out = str(tmp_path_factory.mktemp("asan") / "_cpu_asan.so")
    cmd = ["gcc", "-shared", "-fPIC", "-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address", "-fopenmp",
           *SOURCES, "-o", out, "-lm"]
    build = subprocess.run(cmd, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    return runtime, out


def test_kernels_and_the_seam_fuzz_run_clean_under_asan(asan_build):
    runtime, library = asan_build
    env = dict(os.environ, LD_PRELOAD=runtime, RANKKIT_CPU_LIBRARY=library,
               ASAN_OPTIONS="detect_leaks=0")
    probe = ("import rankkit.kernels.cpu as c, sys; "
             f"sys.exit(0 if c.available() and c._DLL._name == {library!r} else 3)")
    assert subprocess.run([sys.executable, "-c", probe], env=env, cwd=ROOT).returncode == 0, \
        "the sanitized build was not the one loaded"
    tests = [os.path.join("tests", f) for f in ("kernels/test_backends.py", "kernels/test_cpu_lambdas.py",
                                                 "kernels/test_cpu_fuzz.py", "boosting/test_tree_quantized.py")]
    run = subprocess.run([sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-x", "-p", "no:cacheprovider",
                          "-m", "not slow", *tests], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=1200)
    report = run.stdout[-4000:] + run.stderr[-8000:]
    assert "AddressSanitizer" not in run.stderr, report
    assert run.returncode == 0, report
    assert " passed" in run.stdout, report  # the tests ran (none skipped for want of the kernels)


def test_the_asan_run_can_fail(asan_build, tmp_path):
    # The check itself: one byte written past a buffer, in a library built the same way, is
    # reported by the sanitizer and fails the process.
    runtime, _ = asan_build
    src, lib = tmp_path / "oob.c", tmp_path / "oob.so"
    src.write_text("#include <stdlib.h>\n"
                   "void oob(int n) { volatile char *p = malloc(n); p[n] = 1; free((void *) p); }\n")
    cmd = ["gcc", "-shared", "-fPIC", "-O1", "-fsanitize=address", str(src), "-o", str(lib)]
    assert subprocess.run(cmd, capture_output=True).returncode == 0
    env = dict(os.environ, LD_PRELOAD=runtime, ASAN_OPTIONS="detect_leaks=0")
    run = subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(lib)!r}).oob(8)"], env=env,
                         capture_output=True, text=True)
    assert run.returncode != 0 and "heap-buffer-overflow" in run.stderr
