"""The in-memory ranking dataset: flat features, labels and query offsets.

Notation: N documents, Q queries, L padded list length, F features.
Each query's documents are contiguous; ``offsets[q]:offsets[q + 1]`` is query q.
"""
from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from typing import Iterator, NamedTuple, Sequence

import numpy as np
import torch

from rankkit._io import atomic_write


class PaddedBatch(NamedTuple):
    """Whole queries padded to a common length.

    Attributes:
        features: [Q, L, F] float32, zero on padding.
        labels: [Q, L] float32, zero on padding.
        mask: [Q, L] bool, True on real documents.
        query_index: [Q] long, each row's query index in the source dataset.
    """

    features: torch.Tensor
    labels: torch.Tensor
    mask: torch.Tensor
    query_index: torch.Tensor

    def to(self, device) -> "PaddedBatch":
        return PaddedBatch(*(t.to(device) for t in self))


def padded_layout(sizes: torch.Tensor, length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Row/column of every flat document in a [Q, L] layout.

    Args:
        sizes: [Q] number of documents of each query.
        length: L, at least ``sizes.max()``; defaults to it.
    Returns:
        (rows, cols), each [N] long: document n goes to ``[rows[n], cols[n]]``.

    >>> padded_layout(torch.tensor([2, 1]))
    (tensor([0, 0, 1]), tensor([0, 1, 0]))
    """
    sizes = sizes.long()
    rows = torch.repeat_interleave(torch.arange(len(sizes)), sizes)
    starts = torch.cumsum(sizes, 0) - sizes
    cols = torch.arange(int(sizes.sum())) - starts[rows]
    return rows, cols


def pad(values: torch.Tensor, sizes: torch.Tensor, *, length: int | None = None,
        fill: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad flat per-document values [N, ...] into [Q, L, ...] plus a [Q, L] bool mask."""
    length = int(sizes.max()) if length is None and len(sizes) else (length or 0)
    rows, cols = padded_layout(sizes)
    out = values.new_full((len(sizes), length, *values.shape[1:]), fill)
    out[rows, cols] = values
    mask = torch.zeros(len(sizes), length, dtype=torch.bool)
    mask[rows, cols] = True
    return out, mask


@dataclass(eq=False)
class RankingDataset:
    """Query-grouped learning-to-rank data.

    Attributes:
        features: [N, F] float32.
        labels: [N] float32 relevance labels (non-negative integers stored as floats).
        offsets: [Q + 1] int64, ``offsets[0] == 0`` and ``offsets[-1] == N``.
        qids: [Q] int64, the original query ids.
        comments: optional list of N strings (the text after ``#`` on each line).
        source: where the data came from (a path or a name), used in error messages.
    """

    features: torch.Tensor
    labels: torch.Tensor
    offsets: torch.Tensor
    qids: torch.Tensor
    comments: list[str] | None = None
    source: str = "<memory>"

    def __post_init__(self):
        self.features = torch.as_tensor(self.features, dtype=torch.float32)
        self.labels = torch.as_tensor(self.labels, dtype=torch.float32)
        self.offsets = torch.as_tensor(self.offsets, dtype=torch.int64)
        self.qids = torch.as_tensor(self.qids, dtype=torch.int64)
        n = self.features.shape[0]
        if self.features.ndim != 2:
            raise ValueError(f"{self.source}: features must be [N, F], got shape {tuple(self.features.shape)}")
        if self.labels.shape != (n,):
            raise ValueError(f"{self.source}: labels must be [N={n}], got shape {tuple(self.labels.shape)}")
        if (self.offsets.ndim != 1 or len(self.offsets) < 1 or int(self.offsets[0]) != 0
                or int(self.offsets[-1]) != n or bool((self.offsets.diff() < 0).any())):
            raise ValueError(f"{self.source}: offsets must rise from 0 to N={n}")
        if len(self.qids) != len(self.offsets) - 1:
            raise ValueError(f"{self.source}: {len(self.qids)} qids for {len(self.offsets) - 1} queries")
        if self.comments is not None and len(self.comments) != n:
            raise ValueError(f"{self.source}: {len(self.comments)} comments for {n} documents")

    # -- sizes ---------------------------------------------------------------------------
    @property
    def n_docs(self) -> int:
        return self.features.shape[0]

    @property
    def n_queries(self) -> int:
        return len(self.offsets) - 1

    @property
    def n_features(self) -> int:
        return self.features.shape[1]

    @property
    def sizes(self) -> torch.Tensor:
        """[Q] documents per query."""
        return self.offsets.diff()

    def __len__(self) -> int:
        return self.n_queries

    def __repr__(self) -> str:
        return (f"RankingDataset({self.n_queries} queries, {self.n_docs} docs, "
                f"{self.n_features} features, source={self.source!r})")

    def summary(self) -> dict:
        """Queries, documents, features, list lengths and the label histogram."""
        sizes = self.sizes
        values, counts = torch.unique(self.labels, return_counts=True)
        per_query_max = torch.segment_reduce(self.labels, "max", lengths=sizes) if self.n_queries else self.labels
        return {
            "source": self.source,
            "queries": self.n_queries,
            "documents": self.n_docs,
            "features": self.n_features,
            "docs_per_query": {"min": int(sizes.min()) if len(sizes) else 0,
                               "max": int(sizes.max()) if len(sizes) else 0,
                               "mean": round(float(sizes.float().mean()), 2) if len(sizes) else 0.0},
            "labels": {_label_key(v): int(c) for v, c in zip(values.tolist(), counts.tolist())},
            "queries_without_relevant_docs": int((per_query_max <= 0).sum()),
        }

    # -- subsetting ----------------------------------------------------------------------
    def doc_query_index(self) -> torch.Tensor:
        """[N] long: the query index of every document."""
        return torch.repeat_interleave(torch.arange(self.n_queries), self.sizes)

    def subset(self, queries: Sequence[int] | torch.Tensor) -> "RankingDataset":
        """A new dataset holding the given queries (by index, in the given order)."""
        q = torch.as_tensor(queries, dtype=torch.int64).reshape(-1)
        if len(q) and (int(q.min()) < -self.n_queries or int(q.max()) >= self.n_queries):
            raise IndexError(f"query index out of range for {self.n_queries} queries")
        q = q % max(self.n_queries, 1)
        sizes = self.sizes[q]
        starts = self.offsets[q]
        rows, cols = padded_layout(sizes)
        docs = starts[rows] + cols
        comments = [self.comments[i] for i in docs.tolist()] if self.comments is not None else None
        return RankingDataset(self.features[docs], self.labels[docs],
                              torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(sizes, 0)]),
                              self.qids[q], comments, self.source)

    # -- padding -------------------------------------------------------------------------
    def padded(self, queries: Sequence[int] | torch.Tensor | None = None) -> PaddedBatch:
        """The given queries (all by default) as one padded batch of length max size."""
        q = (torch.arange(self.n_queries) if queries is None
             else torch.as_tensor(queries, dtype=torch.int64).reshape(-1))
        sizes = self.sizes[q]
        rows, cols = padded_layout(sizes)
        docs = self.offsets[q][rows] + cols
        length = int(sizes.max()) if len(q) else 0
        feats = torch.zeros(len(q), length, self.n_features)
        labels = torch.zeros(len(q), length)
        mask = torch.zeros(len(q), length, dtype=torch.bool)
        feats[rows, cols] = self.features[docs]
        labels[rows, cols] = self.labels[docs]
        mask[rows, cols] = True
        return PaddedBatch(feats, labels, mask, q)

    def bucket_batches(self, max_docs: int = 4096, *, shuffle: bool = False,
                       generator: torch.Generator | None = None,
                       max_waste: float = 0.1) -> list[torch.Tensor]:
        """Split the queries into batches of similar length.

        Queries are sorted by size (ties broken at random when shuffling) and cut into
        consecutive groups whose padded size ``len(group) * max(size)`` stays at most
        ``max_docs`` (a query longer than ``max_docs`` gets a batch of its own), and whose
        padding share stays at most ``max_waste`` unless the group is a single query.
        With ``shuffle`` the batch order is random too.

        Returns:
            A list of [B] long tensors of query indices.
        """
        if max_docs < 1:
            raise ValueError(f"`max_docs` has to be a positive integer, got {max_docs}")
        sizes = self.sizes
        if shuffle:
            perm = torch.randperm(self.n_queries, generator=generator)
            order = perm[torch.sort(sizes[perm], stable=True).indices]
        else:
            order = torch.sort(sizes, stable=True).indices
        batches, start, total = [], 0, 0
        s = sizes[order].tolist()
        for i in range(len(order)):
            # s is ascending: adding query i makes the group's padded size (i + 1 - start) * s[i].
            slots = (i + 1 - start) * s[i]
            if i > start and (slots > max_docs or total + s[i] < (1.0 - max_waste) * slots):
                batches.append(order[start:i])
                start, total = i, 0
            total += s[i]
        if len(order):
            batches.append(order[start:])
        if shuffle:
            batches = [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]
        return batches

    def iter_batches(self, max_docs: int = 4096, *, shuffle: bool = False,
                     generator: torch.Generator | None = None) -> Iterator[PaddedBatch]:
        """Padded batches of whole queries, bucketed by length (see :meth:`bucket_batches`)."""
        for q in self.bucket_batches(max_docs, shuffle=shuffle, generator=generator):
            yield self.padded(q)

    def padding_waste(self, max_docs: int = 4096) -> float:
        """Fraction of padded slots that hold no document under :meth:`bucket_batches`."""
        sizes = self.sizes
        slots = sum(len(b) * int(sizes[b].max()) for b in self.bucket_batches(max_docs))
        return 1.0 - self.n_docs / slots if slots else 0.0

    # -- binary cache --------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Write an uncompressed ``.npz`` cache atomically (temp file, then rename)."""
        path = os.fspath(path)
        arrays = {"features": self.features.numpy(), "labels": self.labels.numpy(),
                  "offsets": self.offsets.numpy(), "qids": self.qids.numpy(),
                  "source": np.array(self.source)}
        if self.comments is not None:
            arrays["comments"] = np.array(self.comments, dtype=np.str_)
        def write(tmp: str) -> None:
            with open(tmp, "wb") as f:  # a file object: np.savez would add ".npz" to a name
                np.savez(f, **arrays)

        atomic_write(path, write)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "RankingDataset":
        """Read a cache written by :meth:`save` (never unpickles: ``allow_pickle=False``)."""
        path = os.fspath(path)
        try:
            with np.load(path, allow_pickle=False) as z:
                comments = z["comments"].tolist() if "comments" in z.files else None
                return cls(torch.from_numpy(z["features"].copy()), torch.from_numpy(z["labels"].copy()),
                           torch.from_numpy(z["offsets"].copy()), torch.from_numpy(z["qids"].copy()),
                           comments, str(z["source"]) if "source" in z.files else path)
        except (zipfile.BadZipFile, KeyError, ValueError, EOFError, OSError) as e:
            if isinstance(e, FileNotFoundError):
                raise
            raise ValueError(f"{path}: not a valid rankkit dataset cache ({e})") from e


def _label_key(v: float):
    return int(v) if float(v).is_integer() else v


def concat(datasets: Sequence[RankingDataset], source: str | None = None) -> RankingDataset:
    """Concatenate datasets query-wise (all must have the same feature count)."""
    f = {d.n_features for d in datasets}
    if len(f) > 1:
        raise ValueError(f"cannot concatenate datasets with different feature counts {sorted(f)}")
    sizes = torch.cat([d.sizes for d in datasets])
    comments = None
    if all(d.comments is not None for d in datasets):
        comments = [c for d in datasets for c in d.comments]
    return RankingDataset(torch.cat([d.features for d in datasets]), torch.cat([d.labels for d in datasets]),
                          torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(sizes, 0)]),
                          torch.cat([d.qids for d in datasets]), comments,
                          source or "+".join(d.source for d in datasets))
