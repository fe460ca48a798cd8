"""Block planning for the lambda kernel: which pairs of which queries go together, and how a
block of pairs lies in memory.

The kernel (:func:`rankkit.lambdas.lambda_gradients`) visits, for each query sorted by its
current rank, the pairs (a, b) with positions a < b. :func:`plan_blocks` groups queries of
similar length and cuts long ones into row and column blocks of at most about ``cap`` pairs;
:class:`Layout` holds the per-document views that feed a block, query-major or query-minor.
Nothing here knows the pair formula.
"""
from __future__ import annotations

import bisect
import math

import torch

# Bytes of pair temporaries per pair, in units of the compute dtype's item size: the kernel
# keeps at most about this many [q, r, c] buffers alive at once (measured in the benchmark).
BUFFERS_PER_PAIR = 8
# On CPU, blocks of at most this many pairs (measured: fewer, larger blocks are faster as long
# as they stay in the last-level cache).
CPU_BLOCK_PAIRS = 1 << 20
# The fixed cost of a block on CPU (Python and dispatch of its ~25 tensor operations), in
# pairs' worth of arithmetic: plan_blocks trades it against the triangle waste of row blocks.
CPU_BLOCK_COST = 40_000
# On CPU, chunks of at least this many queries use the query-minor layout (see Layout).
CPU_QUERY_MINOR = 16


def plan_blocks(lengths: torch.Tensor, cutoff: int, cap: int, cpu: bool = True):
    """Yield (q0, q1, shortest length, (r0, r1), (c0, c1), q_minor) blocks of at most about
    ``cap`` pairs.

    ``lengths`` [Q] is sorted ascending. Queries are grouped in length buckets (powers of
    √2) so a short query never pays for the longest one; within a bucket, consecutive
    queries form chunks, and each chunk is cut into row blocks (positions a < cutoff) and
    column blocks (positions b > a). ``q_minor``: lay the block out with the queries as the
    contiguous dimension (see :class:`Layout`), done on CPU for chunks of many queries.

    Each row block also visits the pairs b <= a of its own rows, a triangle that more row
    blocks make smaller, at the price of a fixed cost per block (on CPU, that of about
    CPU_BLOCK_COST pairs). On CPU the height of the row blocks minimises the sum of the two.
    """
    lens = lengths.tolist()
    start = bisect.bisect_left(lens, 2)  # shorter queries have no pairs
    if start == len(lens):
        return
    if lens[start] == lens[-1]:  # one length: one bucket
        counts = [len(lens) - start]
    else:
        buckets = torch.ceil(2.0 * torch.log2(lengths[start:].double())).long()
        counts = torch.unique_consecutive(buckets, return_counts=True)[1].tolist()
    for count in counts:
        stop = start + count
        n_max = lens[stop - 1]
        if cpu:
            n_rows = min(cutoff, n_max - 1)
            per_query = n_rows * (2 * n_max - n_rows - 1) // 2  # pairs (a, b), a < n_rows
            # A chunk of q queries cut into row blocks of height h costs about
            # CPU_BLOCK_COST · n_rows / h + q (pairs + n_rows h / 2): best h = √(2 cost / q).
            q = max(1, min(count, cap // max(1, per_query)))
            rb = round(math.sqrt(2 * CPU_BLOCK_COST / q))
            rb = max(1, min(n_rows, rb, cap // (n_max - 1)))
            rb = math.ceil(n_rows / math.ceil(n_rows / rb))  # even heights
            area = rb * (n_max - 1)  # pairs per query in a row block
        else:
            n_rows = min(cutoff, n_max)
            # Few, whole-width row blocks for short lists; ~8 for long ones so that the
            # lower triangle (b <= a) is mostly skipped.
            rb = n_rows if n_rows <= 32 else max(16, math.ceil(n_rows / 8))
            rb = max(1, min(rb, cap // n_max))
            area = rb * n_max
        cb = min(n_max, max(1, cap // rb))
        qc = max(1, cap // (rb * cb))
        qc = math.ceil(count / math.ceil(count / qc))  # chunks of even size
        q_minor = cpu and qc >= CPU_QUERY_MINOR
        for q0 in range(start, stop, qc):
            q1 = min(q0 + qc, stop)
            n = lens[q1 - 1]
            n_rows = min(cutoff, n - 1)  # the last position has no pair below it
            r0 = 0
            while r0 < n_rows:
                # Lower row blocks are narrower, so taller for the same area.
                r1 = min(n_rows, r0 + max(rb, area // (n - r0 - 1)))
                for c0 in range(r0 + 1, n, cb):
                    yield q0, q1, lens[q0], (r0, r1), (c0, min(c0 + cb, n)), q_minor
                r0 = r1
        start = stop


class Layout:
    """How a block of pairs is laid out in memory, and the per-document views that feed it.

    Query-major (``q_minor`` False): a block is [q, r, c], documents a along dim 1 and b along
    the contiguous dim 2; the per-document terms enter as [q, r, 1] and [q, 1, c]. Query-minor:
    [r, c, q], with the queries contiguous, terms [r, 1, q] and [1, c, q] (position-only terms
    [r, 1, 1] and [1, c, 1]). Query-minor keeps every operand of the pair arithmetic
    contiguous in the inner dimension and makes both pair sums reductions over outer
    dimensions, which is much faster on CPU for chunks of many queries; query-major serves
    chunks of a few long queries. Positions-first layouts accumulate into ``acc`` [2, L, Q].
    """

    def __init__(self, q_minor, per_doc, acc):
        self.q_minor = q_minor
        _, n_queries, n_docs = acc.shape
        self.shared = [t.shape[0] == 1 for t in per_doc]  # position-only terms
        if q_minor:
            tt = [t.t().contiguous() for t in per_doc]
            self.rows = [t[:, None, :] for t in tt]
            self.cols = [t[None, :, :] for t in tt]
            self.acc = acc.new_zeros(2, n_docs, n_queries)
            self.ones = None
            self.pair_dims = (0, 1)  # dims of a block that belong to one query
            self.row_dim, self.col_dim = 1, 0  # summed over for per-row / per-column totals
        else:
            self.rows = [t[:, :, None] for t in per_doc]
            self.cols = [t[:, None, :] for t in per_doc]
            self.acc = acc
            self.ones = acc.new_ones(1, 1, n_docs)
            self.pair_dims = (1, 2)
            self.row_dim, self.col_dim = 2, 1

    def shape(self, q, r, c):
        return (r, c, q) if self.q_minor else (q, r, c)

    def cut(self, q0, q1, r0, r1, c0, c1):
        """Row and column views of every per-document tensor for one block."""
        qs, rs, cs, every = slice(q0, q1), slice(r0, r1), slice(c0, c1), slice(None)
        if self.q_minor:
            ri, ri1, ci, ci1 = (rs, every, qs), (rs,), (every, cs, qs), (every, cs)
        else:
            ri, ri1, ci, ci1 = (qs, rs), (every, rs), (qs, every, cs), (every, every, cs)
        rows = [t[ri1 if one else ri] for t, one in zip(self.rows, self.shared)]
        cols = [t[ci1 if one else ci] for t, one in zip(self.cols, self.shared)]
        return rows, cols

    def tri(self, upper):
        """(index of the overlapping columns in a block, the b > a mask there)."""
        width = upper.shape[1]
        if self.q_minor:
            return (slice(None), slice(0, width)), upper[:, :, None]
        return (slice(None), slice(None), slice(0, width)), upper

    def acc_rows(self, q0, q1, p0, p1):
        """[2, ...] view of the accumulator at positions [p0, p1) of queries [q0, q1)."""
        return self.acc[:, p0:p1, q0:q1] if self.q_minor else self.acc[:, q0:q1, p0:p1]
