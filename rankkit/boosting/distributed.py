"""Data-parallel LambdaMART on ``torch.distributed`` (gloo on CPUs, NCCL on GPUs).

Notation: W ranks, N documents in all, n_r on rank r (a shard of whole queries), F features.

Every rank holds a shard of whole queries, in order: rank 0 the first queries, rank 1 the next,
and so on (``shard_queries`` cuts one data set that way). Each rank computes the lambdas of its
own queries (a query never crosses ranks), and the :class:`~rankkit.boosting.engine.BoostingEngine`
of every rank grows the same tree because:

* the **quantile borders** are fitted on the same rows on every rank: the row sample a single
  process would draw from all N documents (``QuantileBinner``'s seeded permutation), each rank
  contributing the sampled rows it holds (:func:`gather_sample`);
* every **histogram and leaf sum** passes through the engine's one reduction point, which is an
  all-reduce (:class:`AllReduce`); with ``quantized_grad=True`` the histograms are integers and
  the leaf sums fixed-point integers, so the sums, and hence the trees, are bit-identical to a
  single-process fit on all the data. The quantization's scale is an all-reduced maximum and
  its stochastic rounding draws, on every rank, the numbers a single process draws for the
  same documents;
* the **eval metric** (mean over the eval queries of every rank) is all-reduced, so early
  stopping stops every rank at the same round.

Without ``quantized_grad`` the histograms are float64 sums added in another order than in one
process: the trees then agree up to float64 rounding (the same splits in practice; leaf values
within ~1e-15 relatively), not bit for bit. Row subsampling, the Bayesian bootstrap and
split-score noise are not data-parallel yet (``fit`` says so).
"""
from __future__ import annotations

import torch

from rankkit.data.dataset import RankingDataset, shard_queries


def world() -> tuple[int, int]:
    """(rank, world size) of the default process group, (0, 1) without one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def shard(dataset: RankingDataset, rank: int | None = None, world_size: int | None = None) -> RankingDataset:
    """``rank``'s shard of whole queries of ``dataset`` (this process's, by default)."""
    if rank is None or world_size is None:
        rank, world_size = world()
    return dataset.subset(list(shard_queries(dataset.n_queries, rank, world_size)))


class AllReduce:
    """The engine's reduction point across ranks: a sum (``__call__``) and a maximum (``max``),
    plus this rank's place among all documents (``offset``, ``total``) for the draws that must
    be those of one process."""

    def __init__(self, n_local: int):
        import torch.distributed as dist

        self.dist = dist
        self.rank, self.world_size = world()
        counts = torch.zeros(self.world_size, dtype=torch.long)
        counts[self.rank] = n_local
        dist.all_reduce(counts)
        self.counts = counts
        self.offset = int(counts[: self.rank].sum())
        self.total = int(counts.sum())

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        t = t.contiguous()
        self.dist.all_reduce(t, op=self.dist.ReduceOp.SUM)
        return t

    def max(self, t: torch.Tensor) -> torch.Tensor:
        t = t.contiguous()
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return t


def gather_sample(rows_of, reduce: AllReduce, n_features: int, sample: int, seed: int) -> torch.Tensor:
    """The binning sample of one process on all N documents, assembled from every rank.

    ``rows_of(index)`` returns this rank's rows ``index`` (local indices) as [n, F] float32. A
    single process fits its borders on all rows when N <= ``sample``, else on the rows
    ``randperm(N, seed)[:sample]``; each rank contributes the sampled rows it holds, and the
    gathered sample (in global document order) is the same on every rank.
    """
    lo, hi = reduce.offset, reduce.offset + int(reduce.counts[reduce.rank])
    if reduce.total <= sample:
        mine = torch.arange(lo, hi)
    else:
        g = torch.Generator().manual_seed(seed)
        chosen = torch.randperm(reduce.total, generator=g)[:sample]
        mine = chosen[(chosen >= lo) & (chosen < hi)].sort().values
    local = rows_of(mine - lo).to(torch.float32)
    counts = torch.zeros(reduce.world_size, dtype=torch.long)
    counts[reduce.rank] = len(mine)
    reduce(counts)
    width = int(counts.max())
    padded = torch.zeros(width, n_features, dtype=torch.float32)
    padded[: len(mine)] = local
    gathered = [torch.empty_like(padded) for _ in range(reduce.world_size)]
    reduce.dist.all_gather(gathered, padded)
    return torch.cat([part[: int(c)] for part, c in zip(gathered, counts)])
