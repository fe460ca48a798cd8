/* rankkit's compiled lambda pass: the booster's pairwise (grad, hess) over the flat query
   layout, for the RankNet and |ΔNDCG@k| weightings (rankkit/kernels/cpu.py:lambdas).

   The same pair formula as the torch reference (rankkit/lambdas.py:_accumulate_block; Burges,
   "From RankNet to LambdaRank to LambdaMART: An Overview", MSR-TR-2010-82, 2010), in float64:
   each query is ranked by its current scores (descending, equal scores: lower label first, then
   document order), and for positions a < b with a < cutoff and W = sign(y_a - y_b)|ΔZ_ab| != 0,
   X = 1 + e^{σ(s_a - s_b)}, u = |W| / X:

       acc_g[a] += ω (min(W, 0) + u),  acc_g[b] -= the same,  acc_h[a], acc_h[b] += ω (u - u / X),

   with ω = (w_a + w_b) / 2 (1 without weights), times the click-log pair weight u_hi l_lo (the
   higher label's upper factor times the lower label's lower factor: Unbiased LambdaMART's
   1 / (t⁺ t⁻), or inverse propensities) where those factors are given; grad = -σ acc_g, hess =
   σ² acc_h, times LightGBM's log2(1 + S) / S per query with ``normalize`` (S = 2σ Σ|min(W, 0) +
   u|, before ω).
   Built into the extension rankkit.kernels._cpu with _cpu.c (setup.py).

   Determinism: one thread owns a query and adds its pairs in one fixed order (a, then b), so
   the result does not depend on the number of threads; no atomics. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* Queries whose scores (times σ) span at most this much take the pair exponential as the
   product e^{z_a} e^{-z_b}, z = σ s - centre (no exp per pair, no overflow); others exp(σ(s_a -
   s_b)) per pair, which may be +inf (then u = 0). The torch reference makes the same choice. */
#define EXP_SPAN 64.0

typedef struct {
    double s;   /* score (σ not applied) */
    double y;   /* label */
    int64_t i;  /* flat position */
} ranked_doc;

/* Descending score (NaN above +inf, as torch.sort), then ascending label, then position. */
static int by_rank(const void *pa, const void *pb) {
    const ranked_doc *a = (const ranked_doc *) pa, *b = (const ranked_doc *) pb;
    int na = isnan(a->s), nb = isnan(b->s);
    if (na != nb) return na ? -1 : 1;
    if (!na) {
        if (a->s > b->s) return -1;
        if (a->s < b->s) return 1;
    }
    if (a->y < b->y) return -1;
    if (a->y > b->y) return 1;
    return (a->i > b->i) - (a->i < b->i);
}

/* Queries up to this long are sorted by insertion (inline comparisons, no calls: most of the
   booster's queries are short, and the previous round's ranking, where the sort starts, is
   nearly sorted); longer ones by qsort. Both give the one order of by_rank. 128 against 64:
   1.2M documents in 120-document queries 97 -> 88 ms a pass; MQ2008 level. */
#define INSERTION_MAX 128

static void rank_docs(ranked_doc *docs, int64_t n) {
    if (n > INSERTION_MAX) {
        qsort(docs, (size_t) n, sizeof(ranked_doc), by_rank);
        return;
    }
    for (int64_t j = 1; j < n; ++j) {
        ranked_doc d = docs[j];
        int64_t p = j;
        while (p > 0 && by_rank(&d, &docs[p - 1]) < 0) {
            docs[p] = docs[p - 1];
            --p;
        }
        docs[p] = d;
    }
}

/* On x86-64 Linux with gcc and glibc, pair_row is also compiled for AVX2 (twice the divisions
   per instruction) and the loader picks the version the CPU runs (an ifunc, which musl lacks);
   the same IEEE operations, so the same bits, on every CPU. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && defined(__GLIBC__)
#define RK_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define RK_CLONES
#endif

/* Row a's pairs (a, b) in the common case (no weights, narrow scores), the m documents b below a
   given from b = a + 1 on (labels y, gains g, discounts disc, e^{-z} f): each pair's lam and h
   into lt[b], ht[b] and onto acc_g[b], acc_h[b], in a loop with neither a branch nor a
   reduction, so that the compiler vectorises it (gcc if-converts the comparisons only under
   -fno-trapping-math, setup.py's flag, which changes no value; the two divisions a pair are the
   pass's cost: 1.2M documents in 120-document queries, 116 -> 62 ms a pass with the next change,
   45 with the AVX2 clone); the caller sums lt, ht into row a in b order. Pairs with W = 0 are not skipped (a
   third of them, unpredictably: the branch cost more than the pair): with narrow scores X is
   finite and >= 1, so u = 0 / X = 0 and such a pair adds exact zeros. The same operations per
   pair as the general loop of query_lambdas, so the same bits. ranknet: W = sign(y_a - y_b),
   else the |ΔNDCG| W = (g_a - g_b)(disc_a - disc_b). */
RK_CLONES static void pair_row(int ranknet, double ya, double gain_a, double disc_a, double ea, int64_t m,
                     const double *restrict y, const double *restrict g, const double *restrict disc,
                     const double *restrict f, double *restrict lt, double *restrict ht, double *restrict acc_g,
                     double *restrict acc_h) {
    if (ranknet) {
        for (int64_t b = 0; b < m; ++b) {
            const double W = (ya > y[b] ? 1.0 : 0.0) - (ya < y[b] ? 1.0 : 0.0);
            const double X = 1.0 + ea * f[b];
            const double u = fabs(W) / X;
            const double lam = (W < 0.0 ? W : 0.0) + u, h = u - u / X;
            lt[b] = lam; ht[b] = h;
            acc_g[b] -= lam; acc_h[b] += h;
        }
    } else {
        for (int64_t b = 0; b < m; ++b) {
            const double W = (gain_a - g[b]) * (disc_a - disc[b]);
            const double X = 1.0 + ea * f[b];
            const double u = fabs(W) / X;
            const double lam = (W < 0.0 ? W : 0.0) + u, h = u - u / X;
            lt[b] = lam; ht[b] = h;
            acc_g[b] -= lam; acc_h[b] += h;
        }
    }
}

/* One query's pairs; every buffer holds n entries. */
static void query_lambdas(int64_t start, int64_t n, const double *restrict scores,
                          const double *restrict labels, const double *restrict gains,
                          const double *restrict disc, const double *restrict half_w,
                          const double *restrict upper, const double *restrict lower, int64_t cutoff,
                          double sigma, int weighting, int normalize, int round_scores, int round_out,
                          double *restrict grad, double *restrict hess, int64_t *restrict order,
                          ranked_doc *restrict docs, double *restrict work) {
    double *s = work, *e = work + n, *f = work + 2 * n, *g = work + 3 * n, *w = work + 4 * n;
    double *acc_g = work + 5 * n, *acc_h = work + 6 * n, *up = work + 7 * n, *lo = work + 8 * n;
    double *y = work + 9 * n, *lt = work + 10 * n, *ht = work + 11 * n;
    for (int64_t j = 0; j < n; ++j) {
        int64_t i = order ? order[start + j] : start + j;
        double v = scores[i];
        docs[j].s = round_scores ? (double) (float) v : v;
        docs[j].y = labels[i];
        docs[j].i = i;
    }
    rank_docs(docs, n);
    if (order) {
        for (int64_t p = 0; p < n; ++p) order[start + p] = docs[p].i;
    }
    for (int64_t p = 0; p < n; ++p) {
        int64_t i = docs[p].i;
        s[p] = sigma * docs[p].s;
        g[p] = gains ? gains[i] : 0.0;
        w[p] = half_w ? half_w[i] : 0.0;
        up[p] = upper ? upper[i] : 1.0;
        lo[p] = lower ? lower[i] : 1.0;
        y[p] = docs[p].y;
        acc_g[p] = 0.0;
        acc_h[p] = 0.0;
    }
    double spread = s[0] - s[n - 1], centre = 0.5 * (s[0] + s[n - 1]);
    int narrow = spread <= EXP_SPAN;  /* false for NaN */
    if (narrow) {
        for (int64_t p = 0; p < n; ++p) {
            double z = s[p] - centre;
            e[p] = exp(z);
            f[p] = exp(-z);
        }
    }
    int64_t rows = cutoff < n ? cutoff : n;
    double abs_sum = 0.0;
    if (narrow && !half_w && !upper) {
        for (int64_t a = 0; a < rows; ++a) {
            const int64_t b0 = a + 1;
            pair_row(weighting == 0, y[a], g[a], disc[a], e[a], n - b0, y + b0, g + b0, disc + b0, f + b0, lt + b0,
                     ht + b0, acc_g + b0, acc_h + b0);
            double ga = 0.0, ha = 0.0;
            for (int64_t b = a + 1; b < n; ++b) {
                abs_sum += fabs(lt[b]);
                ga += lt[b];
                ha += ht[b];
            }
            acc_g[a] += ga;
            acc_h[a] += ha;
        }
        rows = 0;  /* done: the general loop below has nothing left */
    }
    for (int64_t a = 0; a < rows; ++a) {
        double ga = 0.0, ha = 0.0;
        for (int64_t b = a + 1; b < n; ++b) {
            double W;
            if (weighting == 0) {
                W = (docs[a].y > docs[b].y) - (docs[a].y < docs[b].y);
            } else {
                W = (g[a] - g[b]) * (disc[a] - disc[b]);
            }
            if (W == 0.0) continue;  /* (X may be inf or NaN here: such a pair adds nothing) */
            double X = narrow ? 1.0 + e[a] * f[b] : 1.0 + exp(s[a] - s[b]);
            double u = fabs(W) / X;
            double lam = (W < 0.0 ? W : 0.0) + u;
            double h = u - u / X;
            abs_sum += fabs(lam);
            if (half_w) {
                double omega = w[a] + w[b];
                lam *= omega;
                h *= omega;
            }
            if (upper) {  /* W > 0: a holds the higher label */
                double pair = W > 0.0 ? up[a] * lo[b] : up[b] * lo[a];
                lam *= pair;
                h *= pair;
            }
            ga += lam;
            ha += h;
            acc_g[b] -= lam;
            acc_h[b] += h;
        }
        acc_g[a] += ga;
        acc_h[a] += ha;
    }
    double factor = 1.0;
    if (normalize) {
        abs_sum *= 2.0 * sigma;
        if (abs_sum > 0.0) factor = log2(1.0 + abs_sum) / abs_sum;
    }
    double cg = -sigma * factor, ch = sigma * sigma * factor;
    for (int64_t p = 0; p < n; ++p) {
        double gv = cg * acc_g[p], hv = ch * acc_h[p];
        if (round_out) {
            gv = (double) (float) gv;
            hv = (double) (float) hv;
        }
        grad[docs[p].i] = gv;
        hess[docs[p].i] = hv;
    }
}

/* grad, hess [N] (float64) of the queries [offsets[q], offsets[q + 1]) of the flat arrays.

   scores, labels [N]; order [N] or NULL: each query's documents (flat positions) in the order to
   start sorting from, overwritten with their rank order -- the previous call's ranking, which the
   insertion sort finishes in few moves when the scores changed little; the result does not
   depend on it (the ranking is a total order); gains [N] the NDCG gains over the query's ideal DCG@cutoff (weighting 1;
   NULL for RankNet, weighting 0); disc [max_len] the discounts, 0 from the cutoff on; half_w
   [N] half the document weights or NULL; upper, lower [N] the pair-weight factors (both or
   neither: a pair weighs upper[higher label] * lower[lower label]) or NULL. round_scores: rank and pair the float32 values of the
   scores; round_out: round grad and hess to float32 values. Returns 0, or 1 when a buffer could
   not be allocated (then grad and hess are incomplete). */
int rankkit_lambdas(const double *scores, const double *labels, const double *gains,
                    const double *disc, const double *half_w, const double *upper,
                    const double *lower, const int64_t *offsets,
                    int64_t n_queries, int64_t max_len, int64_t cutoff, double sigma, int weighting,
                    int normalize, int round_scores, int round_out, double *grad, double *hess,
                    int64_t *order, int n_threads) {
    int failed = 0;
    if (max_len < 1) return 0;
#ifdef _OPENMP
    #pragma omp parallel num_threads(n_threads) reduction(|:failed)
#endif
    {
        ranked_doc *docs = (ranked_doc *) malloc((size_t) max_len * sizeof(ranked_doc));
        double *work = (double *) malloc((size_t) max_len * 12 * sizeof(double));
        int ok = docs != NULL && work != NULL;
        failed |= !ok;
#ifdef _OPENMP
        #pragma omp for schedule(dynamic, 8)
#endif
        for (int64_t q = 0; q < n_queries; ++q) {
            int64_t start = offsets[q], n = offsets[q + 1] - offsets[q];
            if (!ok) continue;
            if (n == 1) {
                grad[start] = 0.0;
                hess[start] = 0.0;
            } else if (n > 1) {
                query_lambdas(start, n, scores, labels, gains, disc, half_w, upper, lower, cutoff, sigma, weighting,
                              normalize, round_scores, round_out, grad, hess, order, docs, work);
            }
        }
        free(docs);
        free(work);
    }
    (void) n_threads;
    return failed;
}

/* The mean NDCG@cutoff of the queries (the booster's eval metric, rankkit.metrics.planned_ndcg
   with empty = `empty`): each query ranked by its scores rounded to float32 (as the torch
   metric, which ranks float32 scores), worst case among equal scores (lower label first: the
   same order as the lambda pass's), then sum_{r < cutoff} gains[doc_r] disc[r], gains being each
   document's gain over its query's ideal DCG@cutoff (0 where that is 0: such a query scores
   `empty`). Summed in float64 (the torch metric sums in float32: the two agree to ~1e-7).
   order: as in rankkit_lambdas, each query's previous ranking, where the sort starts (updated).
   Returns the mean in *out; 0, or 1 when out of memory. Each query's value is written to
   per_query (a buffer of n_queries) and the mean is summed in query order, so the result does
   not depend on the threads. */
int rankkit_ndcg_mean(const double *scores, const double *labels, const double *gains, const double *disc,
                      const int64_t *offsets, int64_t n_queries, int64_t max_len, int64_t cutoff,
                      double empty, int64_t *order, double *per_query, double *out, int n_threads) {
    int failed = 0;
    if (max_len < 1 || n_queries < 1) { *out = 0.0; return 0; }
#ifdef _OPENMP
    #pragma omp parallel num_threads(n_threads) reduction(|:failed) if (n_queries >= 4096)
#endif
    {
        ranked_doc *docs = (ranked_doc *) malloc((size_t) max_len * sizeof(ranked_doc));
        failed |= docs == NULL;
#ifdef _OPENMP
        #pragma omp for schedule(dynamic, 64)
#endif
        for (int64_t q = 0; q < n_queries; ++q) {
            const int64_t start = offsets[q], n = offsets[q + 1] - offsets[q];
            if (!docs) continue;
            int any = 0;
            for (int64_t j = 0; j < n; ++j) any |= gains[start + j] != 0.0;
            if (!any) { per_query[q] = empty; continue; }
            for (int64_t j = 0; j < n; ++j) {
                const int64_t i = order[start + j];
                docs[j].s = (double) (float) scores[i];
                docs[j].y = labels[i];
                docs[j].i = i;
            }
            rank_docs(docs, n);
            double v = 0.0;
            const int64_t top = n < cutoff ? n : cutoff;
            for (int64_t r = 0; r < top; ++r) v += gains[docs[r].i] * disc[r];
            for (int64_t j = 0; j < n; ++j) order[start + j] = docs[j].i;
            per_query[q] = v;
        }
        free(docs);
    }
    (void) n_threads;
    double total = 0.0;
    for (int64_t q = 0; q < n_queries; ++q) total += per_query[q];
    *out = total / (double) n_queries;
    return failed;
}

void rankkit_add_tree(const uint8_t *codes, int64_t n_cols, int64_t n, const int64_t *feats, const int64_t *cuts,
                      int64_t depth, const double *values, double *scores, int n_threads);

/* An eval set's round in one call: the new tree added to its scores (rankkit_add_tree, codes
   [n, n_cols] row-major), then its mean NDCG (rankkit_ndcg_mean). Returns as that. */
int rankkit_eval_ndcg(const uint8_t *codes, int64_t n_cols, const int64_t *feats, const int64_t *cuts, int64_t depth,
                      const double *values, double *scores, const double *labels, const double *gains,
                      const double *disc, const int64_t *offsets, int64_t n_queries, int64_t max_len,
                      int64_t cutoff, double empty, int64_t *order, double *per_query, double *out, int n_threads) {
    rankkit_add_tree(codes, n_cols, offsets[n_queries], feats, cuts, depth, values, scores, n_threads);
    return rankkit_ndcg_mean(scores, labels, gains, disc, offsets, n_queries, max_len, cutoff, empty, order,
                             per_query, out, n_threads);
}

/* Unbiased LambdaMART's position-bucketed pair costs (rankkit.clicks.propensity.position_pair_costs on
   the flat layout; Hu, Wang, Peng, Li, "Unbiased LambdaMART", WWW 2019): for every clicked i and
   unclicked j of a query (clicks [N] 0/1),

       total[bucket_i * n_positions + bucket_j] += softplus(-σ (s_i - s_j)) |d_i - d_j| / IDCG

   (weighting 1; weighting 0, RankNet: the softplus alone), d the discount of each document's rank
   among its query's scores (the lambda pass's order, clicks as labels; disc: 0 from the cutoff on)
   and IDCG the query's ideal DCG of its clicks at the cutoff (pairs of a query without one count
   0). Pairs are visited in document order, i then j, one query after another, on one thread:
   the torch path's order of additions, so the sums do not depend on the threads. order: as in
   rankkit_lambdas (updated; the same ranking the lambda pass then starts from). round_scores:
   rank and pair the float32 values of the scores. Returns 0, or 1 when out of memory. */
int rankkit_position_costs(const double *scores, const double *clicks, const int64_t *bucket,
                           const double *disc, const int64_t *offsets, int64_t n_queries, int64_t max_len,
                           int64_t n_positions, double sigma, int weighting, int round_scores,
                           int64_t *order, double *total) {
    if (max_len < 1) return 0;
    ranked_doc *docs = (ranked_doc *) malloc((size_t) max_len * sizeof(ranked_doc));
    double *d = (double *) malloc((size_t) max_len * sizeof(double));
    if (docs == NULL || d == NULL) {
        free(docs);
        free(d);
        return 1;
    }
    for (int64_t q = 0; q < n_queries; ++q) {
        const int64_t start = offsets[q], n = offsets[q + 1] - offsets[q];
        int64_t n_clicked = 0;
        for (int64_t j = 0; j < n; ++j) n_clicked += clicks[start + j] != 0.0;
        if (n_clicked == 0 || n_clicked == n) continue;  /* no clicked/unclicked pair */
        double inv = 1.0;
        if (weighting) {
            for (int64_t j = 0; j < n; ++j) {
                const int64_t i = order[start + j];
                docs[j].s = round_scores ? (double) (float) scores[i] : scores[i];
                docs[j].y = clicks[i];
                docs[j].i = i;
            }
            rank_docs(docs, n);
            for (int64_t r = 0; r < n; ++r) {
                order[start + r] = docs[r].i;
                d[docs[r].i - start] = disc[r];
            }
            double idcg = 0.0;
            for (int64_t r = 0; r < n_clicked; ++r) idcg += disc[r];
            if (!(idcg > 0.0)) continue;
            inv = 1.0 / idcg;
        }
        for (int64_t a = 0; a < n; ++a) {
            if (clicks[start + a] == 0.0) continue;
            const double sa = round_scores ? (double) (float) scores[start + a] : scores[start + a];
            double *row = total + bucket[start + a] * n_positions;
            for (int64_t b = 0; b < n; ++b) {
                if (clicks[start + b] != 0.0) continue;
                double dz = 1.0;
                if (weighting) {
                    dz = fabs(d[a] - d[b]);
                    if (dz == 0.0) continue;  /* adds +0: both below the cutoff */
                }
                const double sb = round_scores ? (double) (float) scores[start + b] : scores[start + b];
                const double x = -sigma * (sa - sb);
                const double cost = x > 20.0 ? x : log1p(exp(x));  /* torch's softplus */
                row[bucket[start + b]] += weighting ? cost * (dz * inv) : cost;
            }
        }
    }
    free(docs);
    free(d);
    return 0;
}
