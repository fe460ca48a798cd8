"""An optional compiled CPU kernel for the booster's histograms (the torch-ops path is the reference).

Building (feature, node, code) histograms with torch ops on the CPU spends most of its time
making the int64 scatter index (8 bytes for every one-byte code) and in three scatter passes.
This kernel reads the one-byte codes directly from the row-major [N, F] code matrix: it buckets
the documents by output node (a stable counting sort), cuts the features into blocks shared out
between the threads, and for each block and node walks the node's documents in order, adding
(grad, hess, 1) of each document to the cells ``[feature, code]`` of the block, which stay in
the core's cache (block × 256 × 3 doubles). A document's row is read once per block, and a
document is read only when its node is asked for (the subtraction trick's smaller children are
picked by a node -> slot map, with no index or gradient gathers on the Python side). A second
function routes documents down a split (``node += [code > c] * 2^level``), so the grower never
needs the feature-major copy of the codes.

It is plain C with OpenMP, compiled on first use by the system C compiler (``cc``, about a
second) into ``~/.cache/rankkit`` (``RANKKIT_CACHE`` overrides) and called through ctypes on the
tensors' memory. Importing rankkit never compiles anything. When there is no compiler or the
build fails, or ``RANKKIT_CPU_KERNEL=0`` is set, the booster uses the torch-ops histograms,
which give the same sums up to float summation order (``tests/test_boosting.py`` checks the
two against each other and against a brute-force loop).

Determinism: each (feature, node, code) cell is summed by one thread in document order, so the
result does not depend on the number of threads (or feature blocks) at all.
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
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__GNUC__)
#define PREFETCH(p) __builtin_prefetch(p)
#else
#define PREFETCH(p) ((void) 0)
#endif

#ifdef _OPENMP
#define THREAD_IDS(t, n_t) do { t = omp_get_thread_num(); n_t = omp_get_num_threads(); } while (0)
#else
#define THREAD_IDS(t, n_t) do { } while (0)
#endif

/* The histogram builder, written once for two cell types by a macro: VAL is the type of the
   per-document (grad, hess) pair, ACC of the block's cells, OUT of the output histograms.
   rankkit_histograms: double, double, double. rankkit_histograms_q (quantized gradients):
   int32, int32, int64 -- 12 bytes a cell instead of 24, and integer sums, which are exact, so
   the result does not depend on the order of the additions at all (the caller keeps every
   slot's |sum| below 2^31: documents x the largest |quantized value|). */
#define RANKKIT_HISTOGRAMS(NAME, VAL, ACC, OUT)                                                          \
static void NAME##_accumulate(const uint8_t *restrict codes, const int64_t *restrict at,                 \
                              const VAL *restrict gh, int64_t k0, int64_t k1,                            \
                              const int64_t *restrict cols, int64_t f0, int64_t fb, int64_t lo,          \
                              int64_t hi, ACC *restrict acc, const int with_count) {                     \
    for (int64_t k = k0; k < k1; ++k) {                                                                  \
        if (k + 8 < k1) {  /* the rows of a deep node are sparse: fetch them early */                    \
            const uint8_t *ahead = codes + at[k + 8];                                                    \
            for (int64_t o = lo; o < hi; o += 64) PREFETCH(ahead + o);                                   \
            PREFETCH(ahead + hi);                                                                        \
        }                                                                                                \
        const uint8_t *restrict c = codes + at[k];                                                       \
        const VAL g = gh[2 * k], h = gh[2 * k + 1];                                                      \
        for (int64_t j = 0; j < fb; ++j) {  /* the compiler unswitches the invariant tests */            \
            ACC *x = acc + 3 * (256 * j + (cols ? c[cols[j]] : c[f0 + j]));                             \
            x[0] += g; x[1] += h;                                                                        \
            if (with_count) x[2] += 1;                                                                   \
        }                                                                                                \
    }                                                                                                    \
}                                                                                                        \
                                                                                                         \
int NAME(const uint8_t *restrict codes, int64_t n_cols, const int64_t *restrict rows,                    \
         int64_t n, const int64_t *restrict features, int64_t n_feat,                                    \
         const int64_t *restrict node, const int64_t *restrict slot, int64_t n_slots,                    \
         const VAL *restrict grad, const VAL *restrict hess,                                             \
         const OUT *restrict parent, const int64_t *restrict dest, int64_t n_out,                        \
         OUT *restrict out, int n_threads, int64_t n_blocks, int with_count) {                           \
    if (n_feat <= 0 || n_slots <= 0) return 0;                                                           \
    if (n_threads < 1) n_threads = 1;                                                                    \
    if (n_blocks < 1) n_blocks = 1;                                                                      \
    if (n_blocks > n_feat) n_blocks = n_feat;                                                            \
    const int64_t plane = n_feat * n_out * 256, pplane = n_feat * n_slots * 256;                         \
    int64_t *start = (int64_t *) malloc(sizeof(int64_t) * (size_t) (n_slots + 1));                      \
    int64_t *count = (int64_t *) calloc((size_t) (n_threads * n_slots), sizeof(int64_t));               \
    int64_t *at = (int64_t *) malloc(sizeof(int64_t) * (size_t) (n > 0 ? n : 1));                       \
    VAL *gh = (VAL *) malloc(sizeof(VAL) * 2 * (size_t) (n > 0 ? n : 1));                               \
    if (!start || !count || !at || !gh) { free(start); free(count); free(at); free(gh); return -1; }     \
    /* The bucketing, in parallel: each thread counts then places a fixed range of documents. */         \
    _Pragma("omp parallel num_threads(n_threads)")                                                       \
    {                                                                                                    \
        int t = 0, n_t = 1;                                                                              \
        THREAD_IDS(t, n_t);                                                                              \
        const int64_t i0 = n * t / n_t, i1 = n * (t + 1) / n_t;                                          \
        int64_t *mine = count + (int64_t) t * n_slots;                                                   \
        for (int64_t i = i0; i < i1; ++i) {                                                              \
            const int64_t s = slot ? slot[node[i]] : node[i];                                            \
            if (s >= 0) ++mine[s];                                                                       \
        }                                                                                                \
        _Pragma("omp barrier")                                                                           \
        _Pragma("omp single")                                                                            \
        {                                                                                                \
            int64_t pos = 0;                                                                             \
            for (int64_t s = 0; s < n_slots; ++s) {                                                      \
                start[s] = pos;                                                                          \
                for (int u = 0; u < n_t; ++u) {                                                          \
                    const int64_t c = count[(int64_t) u * n_slots + s];                                  \
                    count[(int64_t) u * n_slots + s] = pos;                                              \
                    pos += c;                                                                            \
                }                                                                                        \
            }                                                                                            \
            start[n_slots] = pos;                                                                        \
        }                                                                                                \
        for (int64_t i = i0; i < i1; ++i) {                                                              \
            const int64_t s = slot ? slot[node[i]] : node[i];                                            \
            if (s >= 0) {                                                                                \
                const int64_t k = mine[s]++;                                                             \
                at[k] = (rows ? rows[i] : i) * n_cols;                                                   \
                gh[2 * k] = grad[i];                                                                     \
                gh[2 * k + 1] = hess[i];                                                                 \
            }                                                                                            \
        }                                                                                                \
    }                                                                                                    \
    const int64_t fb_max = (n_feat + n_blocks - 1) / n_blocks;                                           \
    int failed = 0;                                                                                      \
    _Pragma("omp parallel num_threads(n_threads)")                                                       \
    {                                                                                                    \
        /* The block's cells: (grad, hess, count) side by side, [fb, 256, 3]. */                         \
        ACC *acc = (ACC *) malloc(sizeof(ACC) * 3 * 256 * (size_t) fb_max);                              \
        int64_t *col = (int64_t *) malloc(sizeof(int64_t) * (size_t) fb_max);                            \
        if (!acc || !col) {                                                                              \
            _Pragma("omp atomic write")                                                                  \
            failed = 1;                                                                                  \
        }                                                                                                \
        _Pragma("omp for schedule(static)")                                                              \
        for (int64_t blk = 0; blk < n_blocks; ++blk) {                                                   \
            const int64_t f0 = n_feat * blk / n_blocks, fb = n_feat * (blk + 1) / n_blocks - f0;         \
            if (!acc || !col || fb <= 0) continue;                                                       \
            for (int64_t j = 0; j < fb; ++j) col[j] = features ? features[f0 + j] : f0 + j;              \
            int64_t lo = col[0], hi = col[0];                                                            \
            for (int64_t j = 1; j < fb; ++j) {                                                           \
                if (col[j] < lo) lo = col[j];                                                            \
                if (col[j] > hi) hi = col[j];                                                            \
            }                                                                                            \
            for (int64_t s = 0; s < n_slots; ++s) {                                                      \
                memset(acc, 0, sizeof(ACC) * 3 * 256 * (size_t) fb);                                     \
                NAME##_accumulate(codes, at, gh, start[s], start[s + 1], features ? col : NULL, f0, fb,  \
                                  lo, hi, acc, with_count);                                              \
                const int64_t d = dest ? dest[s] : s;                                                    \
                for (int64_t j = 0; j < fb; ++j) {                                                       \
                    const ACC *a = acc + 3 * 256 * j;                                                    \
                    OUT *G = out + ((f0 + j) * n_out + d) * 256, *H = G + plane, *C = H + plane;         \
                    for (int64_t b = 0; b < 256; ++b) { G[b] = a[3 * b]; H[b] = a[3 * b + 1]; }          \
                    if (with_count) for (int64_t b = 0; b < 256; ++b) C[b] = a[3 * b + 2];               \
                    if (parent) {                                                                        \
                        const OUT *PG = parent + ((f0 + j) * n_slots + s) * 256, *PH = PG + pplane,      \
                                  *PC = PH + pplane;                                                     \
                        G = out + ((f0 + j) * n_out + dest[n_slots + s]) * 256; H = G + plane;           \
                        C = H + plane;                                                                   \
                        for (int64_t b = 0; b < 256; ++b) {                                              \
                            G[b] = PG[b] - a[3 * b]; H[b] = PH[b] - a[3 * b + 1];                        \
                            C[b] = PC[b] - a[3 * b + 2];                                                 \
                        }                                                                                \
                    }                                                                                    \
                }                                                                                        \
            }                                                                                            \
        }                                                                                                \
        free(acc);                                                                                       \
        free(col);                                                                                       \
    }                                                                                                    \
    free(start);                                                                                         \
    free(count);                                                                                         \
    free(at);                                                                                            \
    free(gh);                                                                                            \
    return failed ? -1 : 0;                                                                              \
}

/* Histograms of (grad, hess, 1) per (feature, slot, code).
   codes [N_all, n_cols] uint8, one row per document; rows [n] int64, the rows of codes of the
   n documents (NULL: 0..n-1); features [n_feat] int64, the columns of codes (NULL: 0..n_feat-1);
   node [n] int64; slot [n_nodes] int64, the slot (0..n_slots-1) of each node's documents or -1
   to skip them (NULL: slot = node, all nodes < n_slots); grad, hess [n].
   out [3, n_feat, n_out, 256] gets slot s's sums at out slot s (dest NULL, n_out = n_slots), or
   at dest[s] and, with parent [3, n_feat, n_slots, 256], parent[s] - sums at dest[n_slots + s]
   (the subtraction trick's sibling).
   The documents are bucketed by slot (a stable counting sort: document order within a slot)
   with their code row, grad and hess copied in that order; the features are cut into n_blocks
   blocks shared out between the threads, and for each block and slot one thread walks the
   slot's documents in order, adding each document to the block's cells (a few hundred KiB that
   stay in the core's cache). So every cell is summed by one thread in document order: the
   result does not depend on the number of threads or blocks. Returns 0, or -1 when out of
   memory. with_count 0: the count channel of out is left as it is (the caller knows the counts,
   e.g. those of the root, which do not change between trees). */
RANKKIT_HISTOGRAMS(rankkit_histograms, double, double, double)
RANKKIT_HISTOGRAMS(rankkit_histograms_q, int32_t, int32_t, int64_t)

/* The gain of every (feature, threshold c) split of one level, as tree.split_scores: with the
   left child the codes <= c of each node (prefix sums over the codes, in code order) and the
   right child the rest (node total - left), gains[f, c] = sum over the K nodes, in node order,
   of GL^2 / max(HL + l2, tiny) + GR^2 / max(HR + l2, tiny), minus parent_score; -inf where c is
   not valid[f, c] or some node has a non-empty child with fewer than min_data documents (or a
   hessian sum below min_hess, when min_hess > 0). hist [3, n_feat, K, 256] (G, H, count). */
void rankkit_split_scores(const double *restrict hist, int64_t n_feat, int64_t n_nodes,
                          const uint8_t *restrict valid, double l2, double min_data, double min_hess,
                          double parent_score, double tiny, double *restrict gains, int n_threads) {
    const int64_t plane = n_feat * n_nodes * 256;
    #pragma omp parallel for num_threads(n_threads) schedule(static)
    for (int64_t f = 0; f < n_feat; ++f) {
        double sum[256];
        uint8_t bad[256];
        for (int b = 0; b < 256; ++b) { sum[b] = 0.0; bad[b] = 0; }
        double gl[256], hl[256], nl[256];
        for (int64_t k = 0; k < n_nodes; ++k) {
            const double *G = hist + (f * n_nodes + k) * 256, *H = G + plane, *C = H + plane;
            double tg = 0.0, th = 0.0, tc = 0.0;
            for (int b = 0; b < 256; ++b) {  /* the prefix sums: sequential */
                tg += G[b]; th += H[b]; tc += C[b];
                gl[b] = tg; hl[b] = th; nl[b] = tc;
            }
            if (tc == 0.0) continue;  /* an empty node adds 0 to every score and blocks nothing */
            for (int b = 0; b < 256; ++b) {  /* the scores: independent per code (vectorised) */
                const double gr = tg - gl[b], hr = th - hl[b], nr = tc - nl[b];
                double dl = hl[b] + l2, dr = hr + l2;
                dl = dl < tiny ? tiny : dl;
                dr = dr < tiny ? tiny : dr;
                sum[b] += gl[b] * gl[b] / dl + gr * gr / dr;
                const int small = (nl[b] > 0 && nl[b] < min_data) | (nr > 0 && nr < min_data);
                const int light = min_hess > 0 && ((nl[b] > 0 && hl[b] < min_hess) | (nr > 0 && hr < min_hess));
                bad[b] |= (uint8_t) (small | light);
            }
        }
        double *out = gains + f * 256;
        for (int b = 0; b < 256; ++b)
            out[b] = (valid[f * 256 + b] && !bad[b]) ? sum[b] - parent_score : -INFINITY;
    }
}

/* Quantile codes of raw features, one pass: x [n, n_feat] float32 row-major, borders
   [n_feat, 256] float32 ascending, padded with +inf, out [n, n_feat] uint8: 0 for NaN and -inf,
   else 1 + #{j : borders[f, j] < x}, as binning.QuantileBinner.transform. The count is a
   branchless binary search of 8 fixed steps over the 256 padded borders (no mispredicted
   branches; the searches of a row's features are independent, so they overlap), and the rows
   are shared out between the threads. */
void rankkit_bin(const float *restrict x, int64_t n, int64_t n_feat, const float *restrict borders,
                 uint8_t *restrict out, int n_threads) {
    #pragma omp parallel for num_threads(n_threads) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
        const float *row = x + i * n_feat;
        uint8_t *code = out + i * n_feat;
        for (int64_t f = 0; f < n_feat; ++f) {
            const float v = row[f];
            const float *b = borders + f * 256;
            int lo = 0;  /* #{j < lo : b[j] < v} = lo, kept while halving the step */
            for (int step = 128; step > 0; step >>= 1) lo += (b[lo + step - 1] < v) ? step : 0;
            code[f] = (isnan(v) || v == -INFINITY) ? 0 : (uint8_t) (1 + lo);
        }
    }
}

/* node[i] += sum_k [codes[rows[i], feats[k]] > cuts[k]] * weights[k] for i < n (rows NULL: row
   i): one level's split (depth 1, weight 2^level) or a whole tree's leaves. */
void rankkit_route(const uint8_t *restrict codes, int64_t n_cols, const int64_t *restrict rows,
                   int64_t n, const int64_t *restrict feats, const int64_t *restrict cuts,
                   const int64_t *restrict weights, int64_t depth, int64_t *restrict node,
                   int n_threads) {
    #pragma omp parallel for num_threads(n_threads) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
        const uint8_t *c = codes + (rows ? rows[i] : i) * n_cols;
        int64_t add = 0;
        for (int64_t k = 0; k < depth; ++k) add += c[feats[k]] > cuts[k] ? weights[k] : 0;
        node[i] += add;
    }
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
    p, i64, cint = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    dll.rankkit_histograms.argtypes = [p, i64, p, i64, p, i64, p, p, i64, p, p, p, p, i64, p, cint, i64, cint]
    dll.rankkit_histograms.restype = cint
    dll.rankkit_histograms_q.argtypes = dll.rankkit_histograms.argtypes
    dll.rankkit_histograms_q.restype = cint
    dll.rankkit_route.argtypes = [p, i64, p, i64, p, p, p, i64, p, cint]
    dll.rankkit_route.restype = None
    dll.rankkit_bin.argtypes = [p, i64, i64, p, p, cint]
    dll.rankkit_bin.restype = None
    dbl = ctypes.c_double
    dll.rankkit_split_scores.argtypes = [p, i64, i64, p, dbl, dbl, dbl, dbl, dbl, p, cint]
    dll.rankkit_split_scores.restype = None
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


# At most this many features per block: 3 doubles x 256 codes x 36 features = 216 KiB of cells,
# inside a core's L2 cache; fewer blocks read the rows fewer times (on 1.2M x 136 features, 4
# blocks of 34 were a little faster than 3 of 46 and than 8 of 17).
_MAX_BLOCK = 36


def _dll() -> ctypes.CDLL:
    """The loaded kernel; an error when it is unavailable (the callers check :func:`available`)."""
    if not available():
        raise RuntimeError("the compiled CPU histogram kernel is not available")
    return _state["dll"]  # type: ignore[return-value]


def small_child_slots(small_is_right: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For the K parents p split into nodes p and p + K: (slot, small, large), where ``small``
    and ``large`` [K] are the smaller and the larger child of each parent and ``slot`` [2K]
    maps the smaller child to p and every other node to −1 (left out)."""
    k = small_is_right.shape[0]
    parents = torch.arange(k)
    small = parents + k * small_is_right.long()
    slot = torch.full((2 * k,), -1, dtype=torch.long)
    slot[small] = parents
    return slot, small, parents + k * (~small_is_right).long()


def _check_codes(codes: torch.Tensor) -> None:
    assert codes.dtype == torch.uint8 and codes.dim() == 2 and codes.is_contiguous() and codes.device.type == "cpu"


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def cpu_histograms(codes: torch.Tensor, rows: torch.Tensor | None, features: torch.Tensor | None,
                   node: torch.Tensor, grad: torch.Tensor, hess: torch.Tensor, n_nodes: int,
                   slot: torch.Tensor | None = None, n_slots: int | None = None, *,
                   counts: torch.Tensor | None = None) -> torch.Tensor:
    """[3, F, S, 256] float64 (int64 for int32 grad/hess) histograms (ΣG, ΣH, count) of the
    documents ``rows``.

    Args:
        codes: [N_all, F_all] uint8, contiguous, one row per document.
        rows: [n] int64, the documents (rows of ``codes``); None: all N_all, in order.
        features: [F] int64, the columns of ``codes`` to histogram; None: all F_all.
        node: [n] int64 in 0..n_nodes-1; grad, hess: [n] float64, or int32 quantized
            gradients (then the histograms are int64 and exact; the caller keeps each slot's
            |sum| below 2^31).
        slot: [n_nodes] int64, the output slot (0..n_slots-1) of each node's documents, or -1
            to leave them out; None: slot = node (S = n_nodes).
        counts: [F, S, 256], the count channel when the caller already knows it (then
            the kernel adds only grad and hess, about 12% faster); None: counted.
    """
    if slot is None:
        n_slots = n_nodes
    assert n_slots is not None and (slot is None or slot.shape[0] == n_nodes)
    return _histograms(codes, rows, features, node, grad, hess, slot, n_slots, None, None, n_slots, counts)


def cpu_children(codes: torch.Tensor, rows: torch.Tensor | None, features: torch.Tensor | None,
                 node: torch.Tensor, grad: torch.Tensor, hess: torch.Tensor, parent: torch.Tensor,
                 small_is_right: torch.Tensor) -> torch.Tensor:
    """The [3, F, 2K, 256] histograms of the children after a level's split (the subtraction trick).

    The K parents' documents were routed to node p + K·bit; only the documents of the smaller
    child p + K·small_is_right[p] are read, and its sibling is ``parent[:, :, p] − child`` (the
    same floating-point subtraction as torch's, written straight into place).

    Args:
        codes, rows, features, grad, hess: as for :func:`cpu_histograms`.
        node: [n] int64 in 0..2K-1, after the split.
        parent: [3, F, K, 256], the parents' histograms (float64, or int64 for int32 grad/hess).
        small_is_right: [K] bool.
    """
    k = parent.shape[2]
    slot, small, large = small_child_slots(small_is_right)
    dest = torch.cat([small, large])
    return _histograms(codes, rows, features, node, grad, hess, slot, k, parent, dest, 2 * k)


def _histograms(codes, rows, features, node, grad, hess, slot, n_slots, parent, dest, n_out,
                counts=None) -> torch.Tensor:
    _check_codes(codes)
    n = node.shape[0] if rows is None else rows.shape[0]
    assert rows is not None or n == codes.shape[0]
    assert node.shape[0] == grad.shape[0] == hess.shape[0] == n
    feats = None if features is None else features.long().contiguous()
    n_feat = codes.shape[1] if feats is None else feats.shape[0]
    assert parent is None or (dest is not None and parent.shape == (3, n_feat, n_slots, 256))
    keep = [None if t is None else t.long().contiguous() for t in (slot, dest, rows, node)]
    # Quantized gradients (int32) take the integer kernel: int32 cells, int64 histograms.
    quantized = grad.dtype == torch.int32
    value, hist = (torch.int32, torch.int64) if quantized else (torch.float64, torch.float64)
    grad, hess = grad.to(value).contiguous(), hess.to(value).contiguous()
    parent = None if parent is None else parent.to(hist).contiguous()
    threads = max(1, torch.get_num_threads())
    # Feature blocks: at most _MAX_BLOCK features each, a multiple of the threads (balanced).
    blocks = -(-n_feat // _MAX_BLOCK)  # ceil
    blocks = threads * -(-blocks // threads)
    out = torch.empty(3, n_feat, n_out, 256, dtype=hist)
    if counts is not None:
        assert parent is None and counts.shape == (n_feat, n_out, 256)
        out[2].copy_(counts)
    kernel = _dll().rankkit_histograms_q if quantized else _dll().rankkit_histograms
    status = kernel(
        codes.data_ptr(), codes.shape[1], _ptr(keep[2]), n, _ptr(feats), n_feat, keep[3].data_ptr(),
        _ptr(keep[0]), n_slots, grad.data_ptr(), hess.data_ptr(), _ptr(parent), _ptr(keep[1]), n_out,
        out.data_ptr(), threads, blocks, int(counts is None))
    if status != 0:
        raise MemoryError("the CPU histogram kernel could not allocate its buffers")
    return out


def cpu_route(codes: torch.Tensor, rows: torch.Tensor | None, features: torch.Tensor, cuts: torch.Tensor,
              weights: torch.Tensor, node: torch.Tensor) -> torch.Tensor:
    """``node += Σ_k [codes[rows, features[k]] > cuts[k]] · weights[k]`` in place; returns node.

    Args:
        codes: [N_all, F_all] uint8, contiguous, one row per document.
        rows: [n] int64, the documents; None: all N_all, in order.
        features, cuts, weights: [D] int64, the tests and what passing each adds.
        node: [n] int64, contiguous, updated in place.
    """
    _check_codes(codes)
    n = node.shape[0]
    assert node.dtype == torch.int64 and node.is_contiguous() and (rows is not None or n == codes.shape[0])
    assert rows is None or rows.shape[0] == n
    keep = [t.long().contiguous() for t in (features, cuts, weights)]
    rows = None if rows is None else rows.long().contiguous()
    _dll().rankkit_route(
        codes.data_ptr(), codes.shape[1], _ptr(rows), n, keep[0].data_ptr(), keep[1].data_ptr(),
        keep[2].data_ptr(), keep[0].shape[0], node.data_ptr(), max(1, torch.get_num_threads()))
    return node


def cpu_split_scores(hist: torch.Tensor, valid_codes: torch.Tensor, l2: float, min_data: float,
                     min_hess: float, parent_score: float, tiny: float) -> torch.Tensor:
    """:func:`rankkit.boosting.tree.split_scores` in one pass over the histograms.

    Args:
        hist: [3, F, K, 256] float64 (ΣG, ΣH, count) of the level's nodes.
        valid_codes: [F, 256] bool.
        parent_score: Σ_nodes G² / max(H + λ, tiny), subtracted from every gain.
    Returns:
        [F, 256] float64 gains, −inf where the split is not allowed.
    """
    hist = hist.double().contiguous()
    n_feat, n_nodes = hist.shape[1], hist.shape[2]
    assert hist.shape == (3, n_feat, n_nodes, 256) and valid_codes.shape == (n_feat, 256)
    valid = valid_codes.to(torch.uint8).contiguous()
    out = torch.empty(n_feat, 256, dtype=torch.float64)
    _dll().rankkit_split_scores(
        hist.data_ptr(), n_feat, n_nodes, valid.data_ptr(), float(l2), float(min_data), float(min_hess),
        float(parent_score), float(tiny), out.data_ptr(), max(1, torch.get_num_threads()))
    return out


def cpu_bin(x: torch.Tensor, borders: torch.Tensor) -> torch.Tensor:
    """[N, F] uint8 codes of x [N, F] (float32, CPU) under the borders [F, M] (ascending, padded
    with +inf, M <= 255; see :class:`rankkit.boosting.binning.QuantileBinner`), in one
    compiled pass."""
    n, n_feat = x.shape
    assert borders.shape[0] == n_feat and borders.shape[1] <= 255
    x = x.to(torch.float32).contiguous()
    padded = torch.full((n_feat, 256), torch.inf, dtype=torch.float32)
    padded[:, : borders.shape[1]] = borders
    out = torch.empty(n, n_feat, dtype=torch.uint8)
    _dll().rankkit_bin(x.data_ptr(), n, n_feat, padded.data_ptr(), out.data_ptr(), max(1, torch.get_num_threads()))
    return out
