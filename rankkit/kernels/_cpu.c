/* rankkit's compiled CPU kernels: histograms, split scan, routing, leaves and binning of the
   LambdaMART booster, called through ctypes on torch tensors' memory (rankkit/kernels/cpu.py).

   Built at install by setup.py (the extension rankkit.kernels._cpu, with OpenMP where the
   compiler has it); where it is not built, rankkit runs the torch reference backend
   (rankkit/kernels/torch_ref.py), which grows the same trees. */
#ifdef RANKKIT_PYTHON_MODULE
#define PY_SSIZE_T_CLEAN
#include <Python.h>  /* first, as Python asks */
#endif
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

/* 1 when any of x[0..n) is +inf or -inf (NaN is not), else 0: the input check's one pass over a
   dense float32 matrix, on every thread (torch.isinf over 1.2M x 136 took 0.19 s); where it
   says 1 the caller runs the torch check, which names the first bad position. */
int rankkit_any_inf(const float *restrict x, int64_t n, int n_threads) {
    int found = 0;
    #pragma omp parallel for num_threads(n_threads) schedule(static) reduction(|:found) if (n >= 65536)
    for (int64_t i = 0; i < n; ++i) found |= fabsf(x[i]) == INFINITY;
    return found;
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

/* ---------------------------------------------------------------------------------------------
   The fused tree grower: one call for the root, one per level, one for the leaves.

   The n documents (positions 0..n-1 of the round's sample; position i is row rows[i] of codes,
   or row i when rows is NULL) are kept partitioned by node: order[seg[2p] .. seg[2p] + seg[2p+1])
   lists node p's positions in increasing order. A level's split partitions each node's segment
   in place, stably (left child first), so a child's documents are again in document order:
   its histogram adds them in the same order as the torch reference's index_add_, and the sums
   are the same bits. Only the smaller child of each pair is read; the larger is parent - smaller
   (the subtraction trick), as in the reference.

   Histograms are [3, n_feat, K, 256] (G, H, count) of OUT: double, or int64 for int32 quantized
   gradients (exact sums, added through packed cells: rk_pack_q). The split scan reads them
   times scale[0], scale[1] (NULL: 1), as the reference's dequantize.
   --------------------------------------------------------------------------------------------- */

/* The documents' values: float gradients as (g, h) pairs; quantized ones packed into one int64
   (rk_pack_q, below). When the code rows a tree reads do not fit in the cache (RK_FAR bytes and
   more, rankkit/kernels/cpu.py), the values travel with their positions: the partition moves
   vals[k] with order[k], so a node's documents read their values in order from one array, and
   rows are fetched RK_AHEAD positions ahead at both ends of the block's columns (1.2M x 136:
   16.9 s -> 13.1 s a 30-round fit). Below that the values stay in document order, read through
   order[k], with one fetch 8 positions ahead (MQ2008's 0.4 MB: 2.52 -> 2.37 ms a round that way). */
typedef struct { double g, h; } rk_gh;
#define RK_AHEAD 16

/* Document i's row added to the block's cells with its values X, feature j's code CODE (c[col[j]]
   through the column list, or c[lo + j] for a block whose columns are lo, lo + 1, ... in order). */
#define RK_ADD_D(X, CODE)                                                                                \
    do {                                                                                                 \
        const uint8_t *restrict c = codes + (rows ? rows[i] : i) * n_cols;                               \
        const rk_gh x = (X);                                                                             \
        for (int64_t j = 0; j < fb; ++j) {                                                               \
            double *cell = acc + 3 * (256 * j + (CODE));                                                 \
            cell[0] += x.g; cell[1] += x.h;                                                              \
            if (with_count) cell[2] += 1;                                                                \
        }                                                                                                \
    } while (0)

/* Positions k0..k1 of order, each document's row fetched AHEAD positions ahead (at lo, and at hi
   too when FAR), its values X (v[k] by position, v[i] by document) added with RK_ADD_D(X, CODE).
   One loop per case, so that the compiler keeps each free of the others' tests. */
#define RK_SUMS_LOOP(AHEAD, FAR, X, CODE)                                                                \
    for (int64_t k = k0; k < k1; ++k) {                                                                  \
        if (k + (AHEAD) < k1) {                                                                          \
            const uint8_t *ahead = codes + (rows ? rows[order[k + (AHEAD)]] : order[k + (AHEAD)]) * n_cols;  \
            PREFETCH(ahead + lo);                                                                        \
            if (FAR) PREFETCH(ahead + hi);                                                               \
        }                                                                                                \
        const int64_t i = order[k];                                                                      \
        RK_ADD_D(X, CODE);                                                                               \
    }

/* Whether a block's columns are lo, lo + 1, ..., lo + fb - 1 in that order (every block without
   a feature sample, and an in-order run of sampled features): then its codes are read straight
   from the row, without the column list (1.2M x 136: 233 -> 199 ms a tree; MQ2008: 2.26 -> 1.98
   ms a round). */
static inline int rk_run(const int64_t *col, int64_t fb, int64_t lo) {
    for (int64_t j = 0; j < fb; ++j)
        if (col[j] != lo + j) return 0;
    return 1;
}

/* The thread-private cells of one feature block, summed over the positions k0..k1 of order
   (values v by position when positional, else by document): (grad, hess, count) side by side,
   [fb, 256, 3] doubles. The block's columns col[0..fb) lie within lo..hi. `nb` and `pack` are
   the quantized variant's. */
static void rk_node_sums_d(const uint8_t *restrict codes, int64_t n_cols, const int64_t *restrict rows,
                           const int64_t *restrict order, int64_t k0, int64_t k1, const rk_gh *restrict v,
                           int positional, const int64_t *restrict col, int64_t fb, int64_t lo, int64_t hi,
                           const int64_t *restrict nb, const int64_t *restrict pack, double *restrict acc,
                           int with_count) {
    (void) nb; (void) pack;
    const int run = rk_run(col, fb, lo);
    if (positional && run) RK_SUMS_LOOP(RK_AHEAD, 1, v[k], c[lo + j])
    else if (positional) RK_SUMS_LOOP(RK_AHEAD, 1, v[k], c[col[j]])
    else if (run) RK_SUMS_LOOP(8, 0, v[i], c[lo + j])
    else RK_SUMS_LOOP(8, 0, v[i], c[col[j]])
}

/* Quantized gradients in narrow cells. Each document's integer (g, h, 1) is packed into one
   int64 (rk_pack_q: g in the top 22 bits, signed, h - h_min in the next 22, the count in the low
   20), so a histogram cell is one 64-bit add instead of three (LightGBM 4 packs its quantized
   g and h the same way; Shi et al., "Quantized Training of Gradient Boosting Decision Trees",
   NeurIPS 2022). The fields of a sum stay apart while a cell holds fewer than `chunk` documents
   (rk_pack_chunk: count < 2^20, Σ(h - h_min) < 2^22, |Σg| < 2^21), so the documents are added in
   chunks of that many and each chunk's narrow cells are unpacked into the wide int64
   (G, H, count) cells. Integer sums are exact: the same sums as the three adds, bit for bit. */
#define RK_Q_COUNT_BITS 20
#define RK_Q_H_BITS 22
#define RK_Q_G_SHIFT (RK_Q_COUNT_BITS + RK_Q_H_BITS)
static inline int64_t rk_pack_q(int32_t g, int32_t h, int64_t h_min) {
    return (int64_t) g * ((int64_t) 1 << RK_Q_G_SHIFT) + (h - h_min) * ((int64_t) 1 << RK_Q_COUNT_BITS) + 1;
}

/* The documents a narrow cell may sum: 0 when one document's |g| or h - h_min does not fit. */
static int64_t rk_pack_chunk(int64_t g_abs, int64_t h_span) {
    const int64_t g_room = ((int64_t) 1 << (63 - RK_Q_G_SHIFT)) - 1, h_room = ((int64_t) 1 << RK_Q_H_BITS) - 1;
    int64_t chunk = ((int64_t) 1 << RK_Q_COUNT_BITS) - 1;
    if (g_abs > 0 && g_room / g_abs < chunk) chunk = g_room / g_abs;
    if (h_span > 0 && h_room / h_span < chunk) chunk = h_room / h_span;
    return chunk;
}

/* pack = {chunk, h_min}; v the packed values (rk_pack_q), by position when positional; acc
   [fb, 256, 3] int64 wide cells, followed by the narrow cells [fb, 256]; nb the block's codes
   per feature. */
static void rk_node_sums_q(const uint8_t *restrict codes, int64_t n_cols, const int64_t *restrict rows,
                           const int64_t *restrict order, int64_t k0, int64_t k1, const int64_t *restrict v,
                           int positional, const int64_t *restrict col, int64_t fb, int64_t lo, int64_t hi,
                           const int64_t *restrict nb, const int64_t *restrict pack, int64_t *restrict acc,
                           int with_count) {
    const int64_t chunk = pack[0], h_min = pack[1], ahead_n = positional ? RK_AHEAD : 8;
    const int run = rk_run(col, fb, lo);
    int64_t *restrict narrow = acc + 3 * 256 * fb;
    const int64_t low_mask = ((int64_t) 1 << RK_Q_G_SHIFT) - 1, count_mask = ((int64_t) 1 << RK_Q_COUNT_BITS) - 1;
    for (int64_t c0 = k0; c0 < k1; c0 += chunk) {
        const int64_t c1 = k1 - c0 > chunk ? c0 + chunk : k1;
        for (int64_t j = 0; j < fb; ++j) memset(narrow + 256 * j, 0, sizeof(int64_t) * (size_t) (nb ? nb[j] : 256));
        for (int64_t k = c0; k < c1; ++k) {
            if (k + ahead_n < k1) {
                const uint8_t *ahead = codes + (rows ? rows[order[k + ahead_n]] : order[k + ahead_n]) * n_cols;
                PREFETCH(ahead + lo);
                if (positional) PREFETCH(ahead + hi);
            }
            const int64_t i = order[k], x = v[positional ? k : i];
            const uint8_t *restrict c = codes + (rows ? rows[i] : i) * n_cols;
            if (run) {
                const uint8_t *restrict cr = c + lo;
                for (int64_t j = 0; j < fb; ++j) narrow[256 * j + cr[j]] += x;
            } else {
                for (int64_t j = 0; j < fb; ++j) narrow[256 * j + c[col[j]]] += x;
            }
        }
        for (int64_t j = 0; j < fb; ++j) {
            const int64_t n_b = nb ? nb[j] : 256;
            for (int64_t b = 0; b < n_b; ++b) {
                const int64_t cell = narrow[256 * j + b];
                if (!cell) continue;  /* no document: a sum of >= 1 documents has count >= 1 */
                const int64_t low = cell & low_mask, count = low & count_mask;
                int64_t *x = acc + 3 * (256 * j + b);
                x[0] += (cell - low) / ((int64_t) 1 << RK_Q_G_SHIFT);  /* exact: cell - low is a multiple */
                x[1] += (low >> RK_Q_COUNT_BITS) + count * h_min;
                if (with_count) x[2] += count;
            }
        }
    }
}

/* A block's cells a [256][3] (interleaved G, H, count) into the planar channels G, H, C of one
   (feature, node), and -- with the parent's channels P (planes `pstride` apart) -- the sibling's
   L = P - (G, H, C) (planes `lstride` apart), in one pass; restrict pointers so that the
   compiler vectorises (the same subtractions, so the same bits). */
#define RANKKIT_CELLS(COPY, SPLIT, OUT)                                                                  \
static inline void COPY(const OUT *restrict a, OUT *restrict G, OUT *restrict H, OUT *restrict C, int nb,  \
                        int with_count) {                                                                \
    for (int b = 0; b < nb; ++b) { G[b] = a[3 * b]; H[b] = a[3 * b + 1]; }                              \
    if (with_count) for (int b = 0; b < nb; ++b) C[b] = a[3 * b + 2];                                   \
}                                                                                                        \
static inline void SPLIT(const OUT *restrict a, OUT *restrict G, OUT *restrict H, OUT *restrict C,       \
                         const OUT *restrict P, int64_t pstride, OUT *restrict L, int64_t lstride, int nb) { \
    const OUT *restrict PG = P, *restrict PH = P + pstride, *restrict PC = P + 2 * pstride;             \
    OUT *restrict LG = L, *restrict LH = L + lstride, *restrict LC = L + 2 * lstride;                   \
    for (int b = 0; b < nb; ++b) {                                                                       \
        const OUT g = a[3 * b], h = a[3 * b + 1], c = a[3 * b + 2];                                      \
        G[b] = g; H[b] = h; C[b] = c;                                                                    \
        LG[b] = PG[b] - g; LH[b] = PH[b] - h; LC[b] = PC[b] - c;                                         \
    }                                                                                                    \
}
RANKKIT_CELLS(rk_cells_copy_d, rk_cells_split_d, double)
RANKKIT_CELLS(rk_cells_copy_q, rk_cells_split_q, int64_t)

/* Histograms of the nodes `small[0..n_small)` into out [3, n_feat, n_out, 256] at slot
   small[s] (and, with parent [3, n_feat, n_par, 256], parent[:, :, s] - that into slot
   large[s]). Feature blocks are shared out between the threads; each cell is summed by one
   thread in document order, so the bits do not depend on the thread count. */
/* Features per block of a histogram pass: 3 doubles x 256 codes x 36 features = 216 KiB of
   cells, inside a core's L2 (measured on 300k x 136 and MQ2008: 36 beat 4, 8 and 16). A block
   keeps its columns in `int64_t col[64]`: at most 64. */
#ifndef RK_BLOCK
#define RK_BLOCK 36
#endif
_Static_assert(RK_BLOCK >= 1 && RK_BLOCK <= 64, "RK_BLOCK: a block's columns live in col[64]");
#define RANKKIT_NODE_HISTOGRAMS(NAME, SUMS, COPY, SPLIT, VAL, OUT, EXTRA)                                             \
static int NAME(const uint8_t *restrict codes, int64_t n_cols, const int64_t *restrict rows,             \
                const int64_t *restrict features, int64_t n_feat, const int64_t *restrict order,         \
                const int64_t *restrict seg, const VAL *restrict vals, int positional, const int64_t *pack, \
                const int64_t *small, const int64_t *large, int64_t n_small, const OUT *restrict parent, \
                int64_t n_par, OUT *restrict out, int64_t n_out, const int64_t *nbins, int with_count,   \
                int n_threads) {                                                                         \
    if (n_threads < 1) n_threads = 1;                                                                    \
    int64_t n_blocks = (n_feat + RK_BLOCK - 1) / RK_BLOCK;                                               \
    n_blocks = n_threads * ((n_blocks + n_threads - 1) / n_threads);                                     \
    if (n_blocks > n_feat) n_blocks = n_feat;                                                            \
    if (n_blocks < 1) return 0;                                                                          \
    const int64_t fb_max = (n_feat + n_blocks - 1) / n_blocks;                                           \
    const int64_t plane = n_feat * n_out * 256, pplane = n_feat * n_par * 256;                           \
    int failed = 0;                                                                                      \
    _Pragma("omp parallel num_threads(n_threads)")                                                       \
    {                                                                                                    \
        OUT *acc = (OUT *) malloc(sizeof(OUT) * (3 + EXTRA) * 256 * (size_t) fb_max);                    \
        int64_t col[64];                                                                                 \
        if (!acc) {                                                                                      \
            _Pragma("omp atomic write")                                                                  \
            failed = 1;                                                                                  \
        }                                                                                                \
        _Pragma("omp for schedule(dynamic, 1)")                                                          \
        for (int64_t blk = 0; blk < n_blocks; ++blk) {                                                   \
            const int64_t f0 = n_feat * blk / n_blocks, fb = n_feat * (blk + 1) / n_blocks - f0;         \
            if (!acc || fb <= 0) continue;                                                               \
            int64_t lo = INT64_MAX, hi = 0;                                                              \
            for (int64_t j = 0; j < fb; ++j) {                                                           \
                col[j] = features ? features[f0 + j] : f0 + j;                                           \
                if (col[j] < lo) lo = col[j];                                                            \
                if (col[j] > hi) hi = col[j];                                                            \
            }                                                                                            \
            for (int64_t s = 0; s < n_small; ++s) {                                                      \
                const int64_t d = small[s], k0 = seg[2 * d], k1 = k0 + seg[2 * d + 1];                   \
                for (int64_t j = 0; j < fb; ++j)  /* only the codes that occur: the rest stay 0 */       \
                    memset(acc + 3 * 256 * j, 0, sizeof(OUT) * 3 * (size_t) (nbins ? nbins[f0 + j] : 256)); \
                SUMS(codes, n_cols, rows, order, k0, k1, vals, positional, col, fb, lo, hi,                  \
                     nbins ? nbins + f0 : NULL, pack, acc, with_count);                                  \
                for (int64_t j = 0; j < fb; ++j) {                                                       \
                    const int nb = (int) (nbins ? nbins[f0 + j] : 256);                                  \
                    OUT *G = out + ((f0 + j) * n_out + d) * 256;                                         \
                    if (parent)                                                                          \
                        SPLIT(acc + 3 * 256 * j, G, G + plane, G + 2 * plane,                            \
                              parent + ((f0 + j) * n_par + s) * 256, pplane,                             \
                              out + ((f0 + j) * n_out + large[s]) * 256, plane, nb);                     \
                    else                                                                                 \
                        COPY(acc + 3 * 256 * j, G, G + plane, G + 2 * plane, nb, with_count);            \
                }                                                                                        \
            }                                                                                            \
        }                                                                                                \
        free(acc);                                                                                       \
    }                                                                                                    \
    return failed ? -1 : 0;                                                                              \
}
RANKKIT_NODE_HISTOGRAMS(rk_node_histograms_d, rk_node_sums_d, rk_cells_copy_d, rk_cells_split_d, rk_gh, double, 0)
RANKKIT_NODE_HISTOGRAMS(rk_node_histograms_q, rk_node_sums_q, rk_cells_copy_q, rk_cells_split_q, int64_t, int64_t, 1)

/* The root: order = 0..n-1, one segment, and its histograms [3, n_feat, 1, 256] into out.
   with_count 0 leaves the count channel of out as it is (the caller knows it). vals: the
   documents' values (position = document at the root): packed int64 (rk_pack_q) with pack =
   {chunk, h_min} and out int64 when quantized (pack not NULL), else rk_gh and out double.
   Returns 0, or -1 when out of memory. */
static int rk_tree_root(const uint8_t *codes, int64_t n_cols, const int64_t *rows, int64_t n,
                        const int64_t *features, int64_t n_feat, const void *vals, int positional,
                        const int64_t *pack, int64_t *order, int64_t *seg, int64_t *node, void *out, int with_count,
                        int n_threads) {
    for (int64_t i = 0; i < n; ++i) { order[i] = i; node[i] = 0; }
    seg[0] = 0; seg[1] = n;
    const int64_t zero = 0;
    if (pack)
        return rk_node_histograms_q(codes, n_cols, rows, features, n_feat, order, seg, (const int64_t *) vals,
                                    positional, pack, &zero, NULL, 1, NULL, 0, (int64_t *) out, 1, NULL, with_count,
                                    n_threads);
    return rk_node_histograms_d(codes, n_cols, rows, features, n_feat, order, seg, (const rk_gh *) vals,
                                positional, NULL, &zero, NULL, 1, NULL, 0, (double *) out, 1, NULL, with_count,
                                n_threads);
}

/* The split scan of one level, fused with its argmax: gains[f, c] as torch_ref.split_scores
   (per node GL^2/(HL+l2) + GR^2/(HR+l2) - G^2/(H+l2), the node's totals from the same prefix
   sums, so a cut that moves nobody gains exactly 0; summed over the K nodes in node order; -inf
   where c is not valid[f, c] or a non-empty child of some node has fewer than min_data
   documents, or a hessian sum below min_hess when min_hess > 0). Returns the flat index of
   the first maximum of gains (a NaN counts as the maximum, as in torch.argmax), and in
   *best_gain its gain. With noise [n_feat, 256] (NULL: none) the index returned in *noisy is the
   first maximum of gains + noise instead. hist [3, n_feat, K, 256]: double, or int64 when
   quantized, read times scale[0] (G) and scale[1] (H). */
/* One node's contribution to a feature's split scores: sum[b] += the node's gain at cut b, and
   bad[b] set where a non-empty child would keep too few documents or too little hessian. Written
   without branches so that the compiler vectorises it (the same operations per element as the
   scalar loop, so the same bits). */
static inline void rk_node_gain(double *restrict sum, double *restrict bad, const double *restrict gl,
                                const double *restrict hl, const double *restrict nl, double tg, double th,
                                double tc, int nb, double l2, double min_data, double min_hess, double tiny) {
    if (tc == 0.0) return;  /* an empty node adds 0 to every score and blocks nothing */
    double dn = th + l2;
    dn = dn < tiny ? tiny : dn;
    const double own = tg * tg / dn;  /* the node's own score, from this feature's totals */
    const double mh = min_hess > 0 ? min_hess : -INFINITY;  /* no hessian rule: nothing is below -inf */
    for (int b = 0; b < nb; ++b) {
        const double gr = tg - gl[b], hr = th - hl[b], nr = tc - nl[b];
        double dl = hl[b] + l2, dr = hr + l2;
        dl = dl < tiny ? tiny : dl;
        dr = dr < tiny ? tiny : dr;
        sum[b] += (gl[b] * gl[b] / dl + gr * gr / dr) - own;
        /* the number of rules this cut breaks in this node (0 to 4), as a double: counts of
           doubles vectorise where 64-bit integer masks do not (SSE2) */
        const double l = nl[b] > 0 ? 1.0 : 0.0, r = nr > 0 ? 1.0 : 0.0;
        bad[b] += ((nl[b] < min_data ? l : 0.0) + (nr < min_data ? r : 0.0))
                + ((hl[b] < mh ? l : 0.0) + (hr < mh ? r : 0.0));
    }
}

/* Nodes whose prefix sums are taken together: their dependency chains interleave (a prefix sum
   is one chain of dependent additions per node; four of them keep the adder busy). */
#define RK_SCAN_NODES 4

int64_t rankkit_split_scan(const void *hist_v, int quantized, const double *scale, int64_t n_feat,
                           int64_t n_nodes, const int64_t *nbins, const uint8_t *restrict valid, double l2,
                           double min_data,
                           double min_hess, double tiny, const double *restrict noise,
                           double *restrict gains, double *best_gain, int64_t *noisy, int n_threads) {
    const int64_t plane = n_feat * n_nodes * 256;
    const double sg = scale ? scale[0] : 1.0, sh = scale ? scale[1] : 1.0;
    static const int64_t zeros[256];  /* the cells of a node past the last one (int64 0 == double 0.0) */
    #pragma omp parallel for num_threads(n_threads) schedule(static)
    for (int64_t f = 0; f < n_feat; ++f) {
        double sum[256], bad[256], gl[RK_SCAN_NODES][256], hl[RK_SCAN_NODES][256], nl[RK_SCAN_NODES][256];
        const int nb = (int) (nbins ? nbins[f] : 256);  /* codes >= nb are empty: not read */
        for (int b = 0; b < nb; ++b) { sum[b] = 0.0; bad[b] = 0.0; }
        for (int64_t k0 = 0; k0 < n_nodes; k0 += RK_SCAN_NODES) {
            const int m = (int) (n_nodes - k0 < RK_SCAN_NODES ? n_nodes - k0 : RK_SCAN_NODES);
            double tg[RK_SCAN_NODES] = {0}, th[RK_SCAN_NODES] = {0}, tc[RK_SCAN_NODES] = {0};
            if (quantized) {
                const int64_t *G[RK_SCAN_NODES], *H[RK_SCAN_NODES], *C[RK_SCAN_NODES];
                for (int j = 0; j < RK_SCAN_NODES; ++j) {
                    const int64_t at = (f * n_nodes + k0 + j) * 256;
                    G[j] = j < m ? (const int64_t *) hist_v + at : zeros;
                    H[j] = j < m ? G[j] + plane : zeros;
                    C[j] = j < m ? H[j] + plane : zeros;
                }
                for (int b = 0; b < nb; ++b)
                    for (int j = 0; j < RK_SCAN_NODES; ++j) {
                        tg[j] += (double) G[j][b] * sg; th[j] += (double) H[j][b] * sh; tc[j] += (double) C[j][b];
                        gl[j][b] = tg[j]; hl[j][b] = th[j]; nl[j][b] = tc[j];
                    }
            } else {
                const double *G[RK_SCAN_NODES], *H[RK_SCAN_NODES], *C[RK_SCAN_NODES];
                for (int j = 0; j < RK_SCAN_NODES; ++j) {
                    const int64_t at = (f * n_nodes + k0 + j) * 256;
                    G[j] = j < m ? (const double *) hist_v + at : (const double *) zeros;
                    H[j] = j < m ? G[j] + plane : (const double *) zeros;
                    C[j] = j < m ? H[j] + plane : (const double *) zeros;
                }
                for (int b = 0; b < nb; ++b)
                    for (int j = 0; j < RK_SCAN_NODES; ++j) {
                        tg[j] += G[j][b]; th[j] += H[j][b]; tc[j] += C[j][b];
                        gl[j][b] = tg[j]; hl[j][b] = th[j]; nl[j][b] = tc[j];
                    }
            }
            for (int j = 0; j < m; ++j)  /* in node order: the sums' order is the reference's */
                rk_node_gain(sum, bad, gl[j], hl[j], nl[j], tg[j], th[j], tc[j], nb, l2, min_data, min_hess, tiny);
        }
        double *out = gains + f * 256;
        for (int b = 0; b < nb; ++b)
            out[b] = (valid[f * 256 + b] && bad[b] == 0.0) ? sum[b] : -INFINITY;
        for (int b = nb; b < 256; ++b) out[b] = -INFINITY;  /* the caller keeps every valid code < nb */
    }
    int64_t best = 0, best_noisy = 0;
    double top = gains[0], top_noisy = noise ? gains[0] + noise[0] : 0.0;
    for (int64_t j = 1; j < n_feat * 256; ++j) {
        const double v = gains[j];
        if (!isnan(top) && (v > top || isnan(v))) { top = v; best = j; }
        if (noise) {
            const double w = v + noise[j];
            if (!isnan(top_noisy) && (w > top_noisy || isnan(w))) { top_noisy = w; best_noisy = j; }
        }
    }
    *best_gain = top;
    *noisy = noise ? best_noisy : best;
    return best;
}

/* One level's split (feature column f_col of codes, threshold cut: right when code > cut) of
   the K = n_nodes nodes: each node p's segment is partitioned stably into p (left) and p + K
   (right), node[i] += K for the documents that go right, and unless last, the children's
   histograms [3, n_feat, 2K, 256] are written to out from the parents' hist [3, n_feat, K, 256]:
   the smaller child of each pair summed (the right one when it has no more documents than the
   left, as the reference), the other one parent - smaller. tmp [n] is scratch. */
/* The partition of one node's segment s..s+len, stably, with its values (VAL) moved along
   (positional values), each row's split code fetched RK_AHEAD positions ahead (1.2M x 136:
   241 -> 229 ms a tree). */
#define RK_PARTITION(VAL)                                                                                \
    do {                                                                                                 \
        VAL *restrict v = (VAL *) vals, *restrict vt = (VAL *) vtmp;                                     \
        for (int64_t k = s; k < s + len; ++k) {                                                          \
            if (k + RK_AHEAD < s + len)                                                                  \
                PREFETCH(codes + (rows ? rows[order[k + RK_AHEAD]] : order[k + RK_AHEAD]) * n_cols + f_col); \
            const int64_t i = order[k];                                                                  \
            const VAL x = v[k];                                                                          \
            if (codes[(rows ? rows[i] : i) * n_cols + f_col] > cut) {                                    \
                tmp[s + nr] = i; vt[s + nr] = x; ++nr; node[i] += n_nodes;                               \
            } else {                                                                                     \
                order[s + nl] = i; v[s + nl] = x; ++nl;                                                  \
            }                                                                                            \
        }                                                                                                \
        memcpy(v + s + nl, vt + s, sizeof(VAL) * (size_t) nr);                                           \
    } while (0)

static int rk_tree_split(const uint8_t *codes, int64_t n_cols, const int64_t *rows, const int64_t *features,
                         int64_t n_feat, int64_t f_col, int64_t cut, int64_t n_nodes, void *vals, void *vtmp,
                         int positional, const int64_t *pack, int64_t *order, int64_t *tmp, int64_t *seg,
                         int64_t *node, const void *hist, void *out, const int64_t *nbins, int last,
                         int n_threads) {
    #pragma omp parallel for num_threads(n_threads) schedule(dynamic, 1)
    for (int64_t p = 0; p < n_nodes; ++p) {
        const int64_t s = seg[2 * p], len = seg[2 * p + 1];
        int64_t nl = 0, nr = 0;
        if (!positional) {
            for (int64_t k = s; k < s + len; ++k) {
                const int64_t i = order[k];
                if (codes[(rows ? rows[i] : i) * n_cols + f_col] > cut) { tmp[s + nr++] = i; node[i] += n_nodes; }
                else order[s + nl++] = i;
            }
        } else if (pack) {
            RK_PARTITION(int64_t);
        } else {
            RK_PARTITION(rk_gh);
        }
        memcpy(order + s + nl, tmp + s, sizeof(int64_t) * (size_t) nr);
        seg[2 * p + 1] = nl;
        seg[2 * (p + n_nodes)] = s + nl;
        seg[2 * (p + n_nodes) + 1] = nr;
    }
    if (last) return 0;
    int64_t *small = (int64_t *) malloc(sizeof(int64_t) * 2 * (size_t) n_nodes);
    if (!small) return -1;
    int64_t *large = small + n_nodes;
    for (int64_t p = 0; p < n_nodes; ++p) {
        const int right_small = seg[2 * (p + n_nodes) + 1] <= seg[2 * p + 1];
        small[p] = right_small ? p + n_nodes : p;
        large[p] = right_small ? p : p + n_nodes;
    }
    int status;
    if (pack)
        status = rk_node_histograms_q(codes, n_cols, rows, features, n_feat, order, seg, (const int64_t *) vals,
                                      positional, pack, small, large, n_nodes, (const int64_t *) hist, n_nodes,
                                      (int64_t *) out,
                                      2 * n_nodes, nbins, 1, n_threads);
    else
        status = rk_node_histograms_d(codes, n_cols, rows, features, n_feat, order, seg, (const rk_gh *) vals,
                                      positional, NULL, small, large, n_nodes, (const double *) hist, n_nodes,
                                      (double *) out,
                                      2 * n_nodes, nbins, 1, n_threads);
    free(small);
    return status;
}

int64_t rankkit_tree_leaves(const int64_t *restrict node, const double *restrict g, const double *restrict h,
                            int64_t n, int64_t n_leaves, double lr, double l2, double min_hess,
                            double *restrict sums, double *restrict values);

/* A whole tree in one call: the root's histograms, then per level the split scan (with that
   level's noise) and the split with the children's histograms, then the leaves. The levels are
   the reference's: a level whose best gain is not positive sends everything left (cut 255), and
   it and every later level record the best feature of the unchanged histograms.

   hist_a, hist_b: two [3, n_feat, 2^(D-1), 256] buffers (root in hist_a; with_count 0: its
   count channel holds the root's counts already). root_counts (NULL: not wanted) receives the
   root's count channel [n_feat, 256]. noise: [D, n_feat, 256] or NULL. Outputs feats, cuts
   [D] int64 and gains [D] double; node [n] each document's leaf; with lg (double, NULL: skip
   the leaves) sums [2, 2^D] and values [2^D] as rankkit_tree_leaves. vals [n]: the documents'
   values (rk_gh, or packed int64 with pack), moved with their positions when positional;
   vtmp: as much scratch.
   Returns 0, or -1 when out of memory. */
static int rk_tree_grow(const uint8_t *codes, int64_t n_cols, const int64_t *rows, int64_t n,
                        const int64_t *features, int64_t n_feat, void *vals, void *vtmp, int positional,
                        const int64_t *pack,
                        const double *scale, int64_t *order, int64_t *tmp, int64_t *seg, int64_t *node,
                        void *hist_a, void *hist_b, const int64_t *nbins, const uint8_t *valid, double l2,
                        double min_data, double min_hess, double tiny, const double *noise, double *gains_buf,
                        int64_t depth, int with_count, void *root_counts, int64_t *feats, int64_t *cuts,
                        double *gains, const double *lg, const double *lh, double lr, double *sums,
                        double *values, int n_threads) {
    const int quantized = pack != NULL;
    const size_t cell = quantized ? sizeof(int64_t) : sizeof(double);
    const int64_t plane = n_feat * 256;
    int status = rk_tree_root(codes, n_cols, rows, n, features, n_feat, vals, positional, pack, order, seg, node,
                              hist_a, with_count, n_threads);
    if (status != 0) return status;
    if (root_counts) memcpy(root_counts, (char *) hist_a + 2 * plane * cell, (size_t) plane * cell);
    for (int64_t k = 0; k < depth; ++k) { feats[k] = 0; cuts[k] = 255; gains[k] = 0.0; }
    void *bufs[2] = {hist_a, hist_b};
    double best_gain = 0.0;
    int64_t noisy = 0;
    for (int64_t level = 0; level < depth; ++level) {
        const int64_t n_nodes = (int64_t) 1 << level;
        void *hist = bufs[level % 2], *out = bufs[(level + 1) % 2];
        const double *lvl_noise = noise ? noise + level * plane : NULL;
        rankkit_split_scan(hist, quantized, scale, n_feat, n_nodes, nbins, valid, l2, min_data, min_hess, tiny,
                           lvl_noise, gains_buf, &best_gain, &noisy, n_threads);
        if (!(best_gain > 0.0)) {
            for (int64_t rest = level; rest < depth; ++rest) {
                rankkit_split_scan(hist, quantized, scale, n_feat, n_nodes, nbins, valid, l2, min_data, min_hess,
                                   tiny, noise ? noise + rest * plane : NULL, gains_buf, &best_gain, &noisy,
                                   n_threads);
                feats[rest] = noisy / 256;
            }
            break;
        }
        const int64_t f = noisy / 256, c = noisy % 256;
        feats[level] = f; cuts[level] = c; gains[level] = gains_buf[noisy];
        status = rk_tree_split(codes, n_cols, rows, features, n_feat, features ? features[f] : f, c, n_nodes,
                               vals, vtmp, positional, pack, order, tmp, seg, node, hist, out, nbins,
                               (int) (level + 1 == depth), n_threads);
        if (status != 0) return status;
    }
    if (lg) rankkit_tree_leaves(node, lg, lh, n, (int64_t) 1 << depth, lr, l2, min_hess, sums, values);
    return 0;
}

/* rk_tree_grow from the documents' gradients: g, h [n] double, or int32 quantized (quantized 1;
   read times scale), laid out here in vals ([n] rk_gh, or [n] int64 packed when quantized).
   vtmp: as large as vals, and the values travel with their positions (the positional layout,
   for rows beyond the cache: rankkit/kernels/cpu.py's RK_FAR decides), or NULL: they stay in
   document order. chunk_cap > 0 caps the documents a packed cell sums before it is unpacked (the
   tests: many chunks on small data). Returns 0, -1 when out of memory, or -2 when a quantized
   |g| reaches 2^21 or max(h, 0) - min(h, 0) reaches 2^22 (the packed cells' fields). */
int rankkit_tree_grow(const uint8_t *codes, int64_t n_cols, const int64_t *rows, int64_t n,
                      const int64_t *features, int64_t n_feat, const void *g, const void *h, int quantized,
                      const double *scale, int64_t *order, int64_t *tmp, int64_t *seg, int64_t *node,
                      void *vals, void *vtmp, void *hist_a, void *hist_b, const int64_t *nbins,
                      const uint8_t *valid, double l2, double min_data, double min_hess, double tiny,
                      const double *noise, double *gains_buf, int64_t depth, int with_count, void *root_counts,
                      int64_t *feats, int64_t *cuts, double *gains, const double *lg, const double *lh, double lr,
                      double *sums, double *values, int64_t chunk_cap, int n_threads) {
    int64_t pack[2] = {0, 0};
    if (quantized) {
        const int32_t *gq = (const int32_t *) g, *hq = (const int32_t *) h;
        int64_t g_abs = 0, h_lo = 0, h_hi = 0;
        for (int64_t i = 0; i < n; ++i) {
            const int64_t a = gq[i] < 0 ? -(int64_t) gq[i] : gq[i];
            if (a > g_abs) g_abs = a;
            if (hq[i] < h_lo) h_lo = hq[i];
            if (hq[i] > h_hi) h_hi = hq[i];
        }
        if (g_abs >= ((int64_t) 1 << (63 - RK_Q_G_SHIFT)) || h_hi - h_lo >= ((int64_t) 1 << RK_Q_H_BITS)) return -2;
        pack[0] = rk_pack_chunk(g_abs, h_hi - h_lo);
        if (chunk_cap > 0 && chunk_cap < pack[0]) pack[0] = chunk_cap;
        pack[1] = h_lo;
        int64_t *v = (int64_t *) vals;
        #pragma omp parallel for num_threads(n_threads) schedule(static) if (n >= 65536)
        for (int64_t i = 0; i < n; ++i) v[i] = rk_pack_q(gq[i], hq[i], h_lo);
    } else {
        const double *gd = (const double *) g, *hd = (const double *) h;
        rk_gh *v = (rk_gh *) vals;
        #pragma omp parallel for num_threads(n_threads) schedule(static) if (n >= 65536)
        for (int64_t i = 0; i < n; ++i) { v[i].g = gd[i]; v[i].h = hd[i]; }
    }
    const int positional = vtmp != NULL;
    return rk_tree_grow(codes, n_cols, rows, n, features, n_feat, vals, vtmp, positional, quantized ? pack : NULL,
                        scale, order, tmp, seg, node, hist_a, hist_b, nbins, valid, l2, min_data, min_hess, tiny, noise,
                        gains_buf, depth, with_count, root_counts, feats, cuts, gains, lg, lh, lr, sums, values,
                        n_threads);
}

/* scores[i] += values[leaf_i] for the n rows of codes [n, n_cols] (row-major), leaf_i =
   sum_k [codes[i, feats[k]] > cuts[k]] 2^k: a tree added to an eval set's scores in one pass. */
void rankkit_add_tree(const uint8_t *restrict codes, int64_t n_cols, int64_t n, const int64_t *restrict feats,
                      const int64_t *restrict cuts, int64_t depth, const double *restrict values,
                      double *restrict scores, int n_threads) {
    #pragma omp parallel for num_threads(n_threads) schedule(static) if (n >= 65536)
    for (int64_t i = 0; i < n; ++i) {
        const uint8_t *c = codes + i * n_cols;
        int64_t leaf = 0;
        for (int64_t k = 0; k < depth; ++k) leaf |= (int64_t) (c[feats[k]] > cuts[k]) << k;
        scores[i] += values[leaf];
    }
}

/* The leaves: sums [2, n_leaves] (G, H per leaf, each summed in document order, as the
   reference's index_add_) of the n documents' g, h (double) at their leaf node[i], and the
   Newton steps values[j] = -lr * G / (H + l2), 0 where H + l2 < max(min_hess, 1e-300).
   Returns the first leaf whose value is not finite, or -1. */
/* floor(x) as int32; INT32_MIN where that is not a number in range (as torch's conversion of
   NaN on x86). */
static inline int32_t rk_floor_i32(double x) {
    const double r = floor(x);
    return (r >= -2147483648.0 && r <= 2147483647.0) ? (int32_t) r : INT32_MIN;
}

/* torch_ref.quantize_gradients in one pass, its draws u [2, n] given (torch.rand from the
   round's generator): the scales s_g = max|g| / (B / 2), s_h = max|h| / B (1 where that is not
   positive, a NaN included), then g_q = floor(g / s_g + u[0]), h_q = floor(h / s_h + u[1]), the
   same operations in the same order, so the same integers. scale [2] receives (s_g, s_h). */
void rankkit_quantize(const double *restrict g, const double *restrict h, const double *restrict u, int64_t n,
                      int64_t n_bins, int32_t *restrict gq, int32_t *restrict hq, double *restrict scale) {
    double top_g = 0.0, top_h = 0.0;
    int nan_g = 0, nan_h = 0;
    for (int64_t i = 0; i < n; ++i) {
        const double a = fabs(g[i]), b = fabs(h[i]);
        nan_g |= isnan(a); nan_h |= isnan(b);
        if (a > top_g) top_g = a;
        if (b > top_h) top_h = b;
    }
    top_g = nan_g ? NAN : top_g / ((double) n_bins / 2.0);
    top_h = nan_h ? NAN : top_h / (double) n_bins;
    const double sg = top_g > 0.0 ? top_g : 1.0, sh = top_h > 0.0 ? top_h : 1.0;
    scale[0] = sg;
    scale[1] = sh;
    for (int64_t i = 0; i < n; ++i) {
        gq[i] = rk_floor_i32(g[i] / sg + u[i]);
        hq[i] = rk_floor_i32(h[i] / sh + u[n + i]);
    }
}

/* The Newton steps values[j] = -lr * G / (H + l2) of the leaf sums [2, n_leaves], 0 where
   H + l2 < max(min_hess, 1e-300); the first leaf whose value is not finite, or -1. */
static int64_t rk_newton(int64_t n_leaves, double lr, double l2, double min_hess, const double *restrict sums,
                         double *restrict values) {
    const double floor_ = min_hess > 1e-300 ? min_hess : 1e-300;
    int64_t bad = -1;
    for (int64_t j = 0; j < n_leaves; ++j) {
        const double d = sums[n_leaves + j] + l2;
        /* a NaN sum gives a NaN value (as the reference), which the engine reports */
        values[j] = d < floor_ ? 0.0 : -lr * sums[j] / ((d > 1e-300 || isnan(d)) ? d : 1e-300);
        if (bad < 0 && !isfinite(values[j])) bad = j;
    }
    return bad;
}

int64_t rankkit_tree_leaves(const int64_t *restrict node, const double *restrict g, const double *restrict h,
                            int64_t n, int64_t n_leaves, double lr, double l2, double min_hess,
                            double *restrict sums, double *restrict values) {
    for (int64_t j = 0; j < 2 * n_leaves; ++j) sums[j] = 0.0;
    for (int64_t i = 0; i < n; ++i) { sums[node[i]] += g[i]; sums[n_leaves + node[i]] += h[i]; }
    return rk_newton(n_leaves, lr, l2, min_hess, sums, values);
}

/* x * factor rounded to the nearest integer, ties to even (torch.round), as int64; INT64_MIN
   where that is not a number in range (as torch's conversion of NaN on x86). */
static inline int64_t rk_fixed(double x, double factor) {
    const double r = nearbyint(x * factor);
    return (r > -9.2e18 && r < 9.2e18) ? (int64_t) r : INT64_MIN;
}

/* The leaves of a quantized round (torch_ref.exact_leaf_sums, then newton_leaf_values): each
   document's g and h as int64 multiples of 1 / factor[0], 1 / factor[1] (the caller's
   torch_ref.fixed_point_factor: no sum overflows), summed per leaf exactly, in any order, then
   sums [2, n_leaves] = the integer sums / factor and the Newton steps. isums [2, n_leaves] is
   scratch. Returns the first leaf whose value is not finite, or -1. */
int64_t rankkit_fixed_leaves(const int64_t *restrict node, const double *restrict g, const double *restrict h,
                             int64_t n, int64_t n_leaves, const double *restrict factor, double lr, double l2,
                             double min_hess, uint64_t *restrict isums, double *restrict sums,
                             double *restrict values) {
    /* summed as uint64_t, which wraps (defined), then read as int64: the same integers as the
       reference's int64 sums; only a NaN or infinite gradient (INT64_MIN terms) can wrap, and
       then the leaves are NaN on both paths */
    for (int64_t j = 0; j < 2 * n_leaves; ++j) isums[j] = 0;
    const double fg = factor[0], fh = factor[1];
    for (int64_t i = 0; i < n; ++i) {
        isums[node[i]] += (uint64_t) rk_fixed(g[i], fg);
        isums[n_leaves + node[i]] += (uint64_t) rk_fixed(h[i], fh);
    }
    for (int64_t j = 0; j < n_leaves; ++j) {
        sums[j] = (double) (int64_t) isums[j] / fg;
        sums[n_leaves + j] = (double) (int64_t) isums[n_leaves + j] / fh;
    }
    return rk_newton(n_leaves, lr, l2, min_hess, sums, values);
}

#ifdef RANKKIT_PYTHON_MODULE
/* Built by setup.py as the extension module rankkit.kernels._cpu: an empty module whose file
   rankkit.kernels.cpu loads with ctypes (the functions above take raw pointers, so neither the
   build nor the module needs torch's headers). */
static struct PyModuleDef rankkit_cpu_module = {
    PyModuleDef_HEAD_INIT, "_cpu", "rankkit's compiled CPU kernels (called through ctypes).", -1, NULL,
};
PyMODINIT_FUNC PyInit__cpu(void) { return PyModule_Create(&rankkit_cpu_module); }
#endif
