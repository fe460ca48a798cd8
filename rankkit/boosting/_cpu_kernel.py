"""An optional compiled CPU kernel for the booster's histograms (the torch-ops path is the reference).

Building (feature, node, code) histograms with torch ops on the CPU spends most of its time
making the int64 scatter index (8 bytes for every one-byte code) and in three scatter passes.
This kernel reads the one-byte codes directly: for each feature (features are shared out
between threads), it walks the documents in order and adds (grad, hess, 1) to the cell
``[node, code]`` of that feature's histogram, which stays in the core's cache
(K × 256 × 3 doubles). No document-sized temporary is made.

It is plain C with OpenMP, compiled on first use by the system C compiler (``cc``, about a
second) into ``~/.cache/rankkit`` (``RANKKIT_CACHE`` overrides) and called through ctypes on the
tensors' memory. Importing rankkit never compiles anything. When there is no compiler or the
build fails, or ``RANKKIT_CPU_KERNEL=0`` is set, the booster uses the torch-ops histograms,
which give the same sums up to float summation order (``tests/test_boosting.py`` checks the
two against each other and against a brute-force loop).

Determinism: each (feature) histogram is summed by one thread in document order, so the result
does not depend on the number of threads at all.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import torch

_SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* codes_t [F_all, N] uint8 (one row per feature), rows [n] int64 (columns of codes_t, or NULL
   for 0..n-1), features [F] int64, node [n] int64 in [0, K), grad/hess [n] double
   -> out [3, F, K, 256] double, overwritten. Returns 0, or -1 when out of memory. */
int rankkit_histograms(const uint8_t *codes_t, int64_t n_docs, const int64_t *rows, int64_t n,
                       const int64_t *features, int64_t n_feat, const int64_t *node,
                       const double *grad, const double *hess, int64_t n_nodes, double *out,
                       int n_threads) {
    const int64_t cells = n_nodes * 256, plane = n_feat * cells;
    int failed = 0;
    #pragma omp parallel num_threads(n_threads)
    {
        /* One feature's (grad, hess, count) cells side by side: one cache line per document. */
        double *acc = (double *) malloc(sizeof(double) * 3 * cells);
        if (!acc) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(dynamic, 1)
        for (int64_t j = 0; j < n_feat; ++j) {
            if (!acc) continue;
            const uint8_t *code = codes_t + features[j] * n_docs;
            memset(acc, 0, sizeof(double) * 3 * cells);
            if (rows) {
                for (int64_t i = 0; i < n; ++i) {
                    double *x = acc + 3 * (node[i] * 256 + code[rows[i]]);
                    x[0] += grad[i]; x[1] += hess[i]; x[2] += 1.0;
                }
            } else {
                for (int64_t i = 0; i < n; ++i) {
                    double *x = acc + 3 * (node[i] * 256 + code[i]);
                    x[0] += grad[i]; x[1] += hess[i]; x[2] += 1.0;
                }
            }
            double *G = out + j * cells, *H = G + plane, *C = H + plane;
            for (int64_t c = 0; c < cells; ++c) {
                G[c] = acc[3 * c]; H[c] = acc[3 * c + 1]; C[c] = acc[3 * c + 2];
            }
        }
        free(acc);
    }
    return failed ? -1 : 0;
}
"""

_lock = threading.Lock()
_state: dict[str, object] = {}


def enabled() -> bool:
    """False when ``RANKKIT_CPU_KERNEL=0`` asks for the torch-ops histograms."""
    return os.environ.get("RANKKIT_CPU_KERNEL", "1").lower() not in ("0", "false", "no", "off")


def _build() -> ctypes.CDLL:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        raise RuntimeError("no C compiler (cc, gcc or clang) on PATH")
    digest = hashlib.sha256((_SOURCE + compiler).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("RANKKIT_CACHE", Path.home() / ".cache" / "rankkit"))
    lib = cache / f"histograms-{digest}.so"
    if not lib.exists():
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            src, out = Path(tmp) / "histograms.c", Path(tmp) / "histograms.so"
            src.write_text(_SOURCE)
            cmd = [compiler, "-O3", "-fopenmp", "-fPIC", "-shared", str(src), "-o", str(out)]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"`{' '.join(cmd)}` failed: {done.stderr.strip()[:300]}")
            os.replace(out, lib)  # atomic: a concurrent build finds a whole file or none
    dll = ctypes.CDLL(str(lib))
    fn = dll.rankkit_histograms
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    fn.argtypes = [p, i64, p, i64, p, i64, p, p, p, i64, p, ctypes.c_int]
    fn.restype = ctypes.c_int
    return dll


def available() -> bool:
    """Whether the compiled kernel is (or can be) loaded; builds it on first call."""
    if not enabled():
        return False
    with _lock:
        if "dll" not in _state:
            try:
                _state["dll"] = _build()
            except Exception as e:  # noqa: BLE001 - no compiler, no OpenMP, read-only home: fall back
                _state["dll"] = None
                warnings.warn(f"rankkit: the compiled CPU histogram kernel is unavailable ({e}); using "
                              f"torch ops (slower, same results). RANKKIT_CPU_KERNEL=0 silences this.",
                              RuntimeWarning, stacklevel=2)
        return _state["dll"] is not None


def cpu_histograms(codes_t: torch.Tensor, rows: torch.Tensor | None, features: torch.Tensor,
                   node: torch.Tensor, grad: torch.Tensor, hess: torch.Tensor, n_nodes: int) -> torch.Tensor:
    """[3, F, K, 256] float64 histograms (ΣG, ΣH, count) of the documents ``rows``.

    Args:
        codes_t: [F_all, N] uint8, contiguous, one row per feature.
        rows: [n] int64, the documents (columns of ``codes_t``); None: all N, in order.
        features: [F] int64, the rows of ``codes_t`` to histogram.
        node: [n] int64 in 0..n_nodes-1; grad, hess: [n] float64.
    """
    if not available():
        raise RuntimeError("the compiled CPU histogram kernel is not available")
    assert codes_t.dtype == torch.uint8 and codes_t.is_contiguous() and codes_t.device.type == "cpu"
    n = node.shape[0] if rows is None else rows.shape[0]
    assert rows is not None or n == codes_t.shape[1]
    keep = [t.contiguous() for t in (features.long(), node.long(), grad.double(), hess.double())]
    rows_c = None if rows is None else rows.long().contiguous()
    out = torch.empty(3, keep[0].shape[0], n_nodes, 256, dtype=torch.float64)
    status = _state["dll"].rankkit_histograms(  # type: ignore[union-attr]
        codes_t.data_ptr(), codes_t.shape[1], None if rows_c is None else rows_c.data_ptr(), n,
        keep[0].data_ptr(), keep[0].shape[0], keep[1].data_ptr(), keep[2].data_ptr(), keep[3].data_ptr(),
        n_nodes, out.data_ptr(), max(1, torch.get_num_threads()))
    if status != 0:
        raise MemoryError("the CPU histogram kernel could not allocate its per-thread buffer")
    return out
