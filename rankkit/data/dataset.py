"""The in-memory ranking dataset: flat features, labels and query offsets.

Notation: N documents, Q queries, L padded list length, F features.
Each query's documents are contiguous; ``offsets[q]:offsets[q + 1]`` is query q.
"""
from __future__ import annotations

import os
import tokenize
import zipfile
from dataclasses import dataclass
from typing import Iterator, NamedTuple, Sequence

import numpy as np
import torch

from rankkit.infra.checks import (check_int, check_sizes, check_tensor, check_tensors, describe, labels_condition,
                                   offsets_conditions, to_device)
from rankkit.infra.io import atomic_write


class PaddedBatch(NamedTuple):
    """Whole queries padded to a common length.

    Attributes:
        features: [Q, L, F] float32, zero on padding.
        labels: [Q, L] float32, zero on padding.
        mask: [Q, L] bool, True on real documents.
        query_index: [Q] long, each row's query index in the source dataset (None when the
            batch was built by hand).
        position: [Q, L] long, each document's 0-based displayed rank (click logs), zero on
            padding; None when the dataset has no positions.
    """

    features: torch.Tensor
    labels: torch.Tensor
    mask: torch.Tensor
    query_index: torch.Tensor | None = None
    position: torch.Tensor | None = None

    def to(self, device) -> "PaddedBatch":
        return type(self)(*(None if t is None else t.to(device) for t in self))  # a subclass stays one


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
    rows = torch.repeat_interleave(torch.arange(len(sizes), device=sizes.device), sizes)
    starts = torch.cumsum(sizes, 0) - sizes
    cols = torch.arange(int(sizes.sum()), device=sizes.device) - starts[rows]
    return rows, cols


def pad(values: torch.Tensor, sizes: torch.Tensor, *, length: int | None = None,
        fill: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad flat per-document values [N, ...] into [Q, L, ...] plus a [Q, L] bool mask.

    Both live on the device of ``values`` (``sizes`` follows it).
    """
    sizes = check_sizes(sizes, values.shape[0] if values.dim() else -1).to(values.device)
    length = int(sizes.max()) if length is None and len(sizes) else (length or 0)
    rows, cols = padded_layout(sizes)
    out = values.new_full((len(sizes), length, *values.shape[1:]), fill)
    out[rows, cols] = values
    mask = torch.zeros(len(sizes), length, dtype=torch.bool, device=values.device)
    mask[rows, cols] = True
    return out, mask


@dataclass(eq=False)
class RankingDataset:
    """Query-grouped learning-to-rank data.

    Attributes:
        features: [N, F] float32, F >= 1. NaN is a *missing value* (kept; the booster bins it
            on its own); +-inf is refused.
        labels: [N] float32 relevance labels, finite and non-negative (the file reader also
            requires integers; in memory fractional grades are allowed).
        offsets: [Q + 1] int64, ``offsets[0] == 0``, non-decreasing, ``offsets[-1] == N``.
        qids: [Q] int64, the original query ids.
        comments: optional list of N strings (the text after ``#`` on each line).
        source: where the data came from (a path or a name), used in error messages.
        position: optional [N] int64, each document's 0-based displayed rank in a click log
            (non-negative integers); carried by :meth:`subset`, :meth:`padded`, :meth:`save`
            and :func:`concat`, and read by the unbiased rankers.

    Everything is checked at construction (``ValueError`` naming the argument and the first bad
    position). The tensors stay on the device of ``features`` (labels, offsets and qids follow
    it), and every method returns tensors there. A dataset with no documents (N = Q = 0, e.g.
    ``subset([])``) is allowed; one with no feature columns is not.

    >>> RankingDataset(torch.tensor([[1.0], [float("inf")]]), torch.zeros(2), [0, 2], [7])
    Traceback (most recent call last):
    ...
    ValueError: `features` has to be finite or NaN (missing), got inf at [1, 0]
    """

    features: torch.Tensor
    labels: torch.Tensor
    offsets: torch.Tensor
    qids: torch.Tensor
    comments: list[str] | None = None
    source: str = "<memory>"
    position: torch.Tensor | None = None

    def __post_init__(self):
        features = _as_tensor(self.features, "features")
        check_tensor(features, "features", ndim=2)
        if features.is_complex() or features.dtype == torch.bool:
            raise ValueError(f"`features` has to be a real-valued [N, F] tensor, got {describe(features)}")
        if features.shape[1] == 0:
            raise ValueError(f"`features` has to have at least one column (F >= 1), got {describe(features)}")
        n, device = features.shape[0], features.device
        labels = to_device(check_tensor(_as_tensor(self.labels, "labels"), "labels", shape=(n,)), device)
        offsets = to_device(check_tensor(_as_tensor(self.offsets, "offsets"), "offsets", ndim=1, kind="int"), device)
        qids = to_device(check_tensor(_as_tensor(self.qids, "qids"), "qids", ndim=1, kind="int"), device)
        if len(offsets) < 1:
            raise ValueError("`offsets` has to hold Q + 1 >= 1 entries, got an empty tensor")
        if len(qids) != len(offsets) - 1:
            raise ValueError(f"`qids` has to hold one id per query ({len(offsets) - 1}), got {len(qids)}")
        if self.comments is not None and len(self.comments) != n:
            raise ValueError(f"`comments` has to hold one string per document ({n}), got {len(self.comments)}")
        position = None
        if self.position is not None:
            position = to_device(check_tensor(_as_tensor(self.position, "position"), "position", shape=(n,),
                                              kind="int"), device)
        self.features = features.to(torch.float32)
        self.labels = labels.to(torch.float32)
        self.offsets = offsets.to(torch.int64)
        self.qids = qids.to(torch.int64)
        self.position = None if position is None else position.to(torch.int64)
        check_tensors(
            # after the float32 cast, so that a float64 value beyond float32 counts as inf
            ("features", self.features, _inf_mask(self.features), "finite or NaN (missing)"),
            labels_condition(self.labels, None),
            *offsets_conditions(self.offsets, n),
            *([("position", position, position < 0, "a non-negative integer")] if position is not None else []),
        )

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
        return torch.repeat_interleave(torch.arange(self.n_queries, device=self.offsets.device), self.sizes)

    def subset(self, queries: Sequence[int] | torch.Tensor) -> "RankingDataset":
        """A new dataset holding the given queries (by index, in the given order)."""
        q = torch.as_tensor(queries, dtype=torch.int64).reshape(-1).to(self.offsets.device)
        if len(q) and (int(q.min()) < -self.n_queries or int(q.max()) >= self.n_queries):
            raise IndexError(f"query index out of range for {self.n_queries} queries")
        q = q % max(self.n_queries, 1)
        sizes = self.sizes[q]
        starts = self.offsets[q]
        rows, cols = padded_layout(sizes)
        docs = starts[rows] + cols
        comments = [self.comments[i] for i in docs.tolist()] if self.comments is not None else None
        position = None if self.position is None else self.position[docs]
        return RankingDataset(self.features[docs], self.labels[docs], _offsets(sizes),
                              self.qids[q], comments, self.source, position)

    # -- padding -------------------------------------------------------------------------
    def padded(self, queries: Sequence[int] | torch.Tensor | None = None) -> PaddedBatch:
        """The given queries (all by default) as one padded batch of length max size.

        The batch's ``position`` is the documents' positions padded with 0 when the dataset has
        them, else None.
        """
        device = self.features.device
        q = (torch.arange(self.n_queries, device=device) if queries is None
             else torch.as_tensor(queries, dtype=torch.int64).reshape(-1).to(device))
        sizes = self.sizes[q]
        rows, cols = padded_layout(sizes)
        docs = self.offsets[q][rows] + cols
        length = int(sizes.max()) if len(q) else 0
        feats = torch.zeros(len(q), length, self.n_features, device=device)
        labels = torch.zeros(len(q), length, device=device)
        mask = torch.zeros(len(q), length, dtype=torch.bool, device=device)
        feats[rows, cols] = self.features[docs]
        labels[rows, cols] = self.labels[docs]
        mask[rows, cols] = True
        position = None
        if self.position is not None:
            position = torch.zeros(len(q), length, dtype=torch.int64, device=device)
            position[rows, cols] = self.position[docs]
        return PaddedBatch(feats, labels, mask, q, position)

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
            A list of [B] long CPU tensors of query indices (batching is host work).
        """
        check_int(max_docs, "max_docs")
        sizes = self.sizes.cpu()
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
        sizes = self.sizes.cpu()
        slots = sum(len(b) * int(sizes[b].max()) for b in self.bucket_batches(max_docs))
        return 1.0 - self.n_docs / slots if slots else 0.0

    # -- binary cache --------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Write an uncompressed ``.npz`` cache atomically (temp file, then rename)."""
        path = os.fspath(path)
        arrays = {"features": self.features.cpu().numpy(), "labels": self.labels.cpu().numpy(),
                  "offsets": self.offsets.cpu().numpy(), "qids": self.qids.cpu().numpy(),
                  "source": np.array(self.source)}
        if self.comments is not None:
            arrays["comments"] = np.array(self.comments, dtype=np.str_)
        if self.position is not None:
            arrays["position"] = self.position.cpu().numpy()

        def write(tmp: str) -> None:
            with open(tmp, "wb") as f:  # a file object: np.savez would add ".npz" to a name
                np.savez(f, **arrays)

        atomic_write(path, write)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "RankingDataset":
        """Read a cache written by :meth:`save` (never unpickles: ``allow_pickle=False``)."""
        path = os.fspath(path)
        try:
            check_npz(path)
            with np.load(path, allow_pickle=False) as z:
                comments = z["comments"].tolist() if "comments" in z.files else None
                position = torch.from_numpy(z["position"].copy()) if "position" in z.files else None
                return cls(torch.from_numpy(z["features"].copy()), torch.from_numpy(z["labels"].copy()),
                           torch.from_numpy(z["offsets"].copy()), torch.from_numpy(z["qids"].copy()),
                           comments, str(z["source"]) if "source" in z.files else path, position)
        except (zipfile.BadZipFile, KeyError, ValueError, EOFError, OSError, MemoryError) as e:
            if isinstance(e, FileNotFoundError):
                raise
            what = f"MemoryError: {e}" if isinstance(e, MemoryError) else str(e)
            raise ValueError(f"{path}: not a valid rankkit dataset cache ({what})") from e


#: The most bytes the arrays of one ``.npz`` cache may declare (that of MAX_VALUES float32 values).
MAX_CACHE_BYTES = 2**34
#: The most a compressed member may expand (its data over its compressed bytes). Deflate can reach
#: 1032x, so a 2 MB file could ask for 2 GiB; real ranking features compress 2-10x (MQ2008's
#: cache: about 3x), and rankkit's own caches are stored uncompressed (``save``). 64x bounds the
#: memory a cache can ask for by a small multiple of its file.
MAX_DEFLATE_RATIO = 64
#: The kinds of values each array of a cache may hold (numpy dtype kinds: bool, int, uint, float;
#: strings for the texts). Complex numbers would lose their imaginary part unseen.
CACHE_KINDS = {"features": "biuf", "labels": "biuf", "offsets": "iu", "qids": "biuf", "position": "biuf",
               "comments": "U", "source": "U"}


def check_npz(path: str) -> None:
    """Check every array header of the ``.npz`` at ``path`` before numpy allocates anything.

    numpy allocates each array from the shape in its header, before reading its data; a header
    claiming 4 TiB asks for 4 TiB. Here every member must be a ``.npy`` array whose header's
    byte count is exactly what the member holds, a member cannot claim more than its archive
    holds (stored) or than deflate can expand (compressed), and the arrays together stay
    within :data:`MAX_CACHE_BYTES`.

    Raises:
        ValueError: a header beyond those limits (naming the member).
        zipfile.BadZipFile, OSError: not a readable zip archive.
    """
    from numpy.lib import format as npy

    size = os.path.getsize(path)
    total = 0
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            where = f"member {info.filename!r}"
            if not info.filename.endswith(".npy"):
                raise ValueError(f"{where} is not a .npy array")
            if info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size \
                    or info.compress_size > size:
                raise ValueError(f"{where} claims {info.file_size} bytes in {info.compress_size} "
                                 f"(an archive of {size} bytes)")
            if info.file_size > MAX_DEFLATE_RATIO * info.compress_size + 4096:
                raise ValueError(f"{where} expands {info.file_size} bytes from {info.compress_size}, more than "
                                 f"MAX_DEFLATE_RATIO = {MAX_DEFLATE_RATIO} times (re-save it with "
                                 f"RankingDataset.save, which stores arrays uncompressed)")
            with z.open(info) as f:
                try:
                    version = npy.read_magic(f)
                    if version not in ((1, 0), (2, 0)):
                        raise ValueError(f".npy format version {version} (rankkit writes 1.0)")
                    read = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
                    shape, _, dtype = read(f, max_header_size=10_000)
                except (ValueError, SyntaxError, tokenize.TokenError, TypeError, OverflowError) as e:
                    raise ValueError(f"{where}: not a .npy header ({type(e).__name__}: "
                                     f"{' '.join(str(e).split())[:120]})") from None
                if dtype.hasobject:
                    raise ValueError(f"{where} holds Python objects (rankkit never unpickles)")
                kinds = CACHE_KINDS.get(info.filename[:-len(".npy")])
                if kinds is not None and dtype.kind not in kinds:
                    raise ValueError(f"{where} holds {dtype} values; a cache's {info.filename[:-4]} have to be "
                                     f"{'real numbers' if 'f' in kinds else 'integers' if 'i' in kinds else 'text'}")
                declared = int(np.prod(shape, dtype=object)) * dtype.itemsize
                if declared != info.file_size - f.tell():
                    raise ValueError(f"{where}: its header declares {declared} bytes of data, the member "
                                     f"holds {info.file_size - f.tell()}")
            total += declared
            if total > MAX_CACHE_BYTES:
                raise ValueError(f"{where}: the arrays declare more than MAX_CACHE_BYTES = {MAX_CACHE_BYTES} bytes")


def _inf_mask(features: torch.Tensor) -> torch.Tensor:
    """``torch.isinf(features)``; for a large CPU tensor, first checked in row blocks (isinf
    allocates about 1.25x the tensor), and an empty mask (nothing to report) when none is inf."""
    if features.device.type != "cpu" or features.numel() <= 2**22:
        return torch.isinf(features)
    rows = max(1, 2**20 // max(features.shape[1], 1))
    if any(bool(torch.isinf(block).any()) for block in features.split(rows)):
        return torch.isinf(features)
    return torch.zeros(0, dtype=torch.bool)


def _as_tensor(x, name: str) -> torch.Tensor:
    """``x`` as a tensor (lists and numpy arrays convert; strings and objects do not)."""
    if isinstance(x, torch.Tensor):
        return x
    try:
        return torch.as_tensor(np.asarray(x))
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"`{name}` has to be a tensor or an array of numbers, got {describe(x)}") from None


def _offsets(sizes: torch.Tensor) -> torch.Tensor:
    """[Q + 1] offsets from [Q] sizes, on the sizes' device."""
    return torch.cat([torch.zeros(1, dtype=torch.int64, device=sizes.device), torch.cumsum(sizes, 0)])


def _label_key(v: float):
    return int(v) if float(v).is_integer() else v


def concat(datasets: Sequence[RankingDataset], source: str | None = None) -> RankingDataset:
    """Concatenate datasets query-wise (all must have the same feature count).

    Comments and positions are kept when every dataset has them, dropped otherwise.
    """
    if not datasets:
        raise ValueError("`datasets` has to hold at least one dataset, got none")
    f = {d.n_features for d in datasets}
    if len(f) > 1:
        raise ValueError(f"cannot concatenate datasets with different feature counts {sorted(f)}")
    sizes = torch.cat([d.sizes for d in datasets])
    comments = None
    if all(d.comments is not None for d in datasets):
        comments = [c for d in datasets for c in d.comments]
    position = None
    if all(d.position is not None for d in datasets):
        position = torch.cat([d.position for d in datasets])
    return RankingDataset(torch.cat([d.features for d in datasets]), torch.cat([d.labels for d in datasets]),
                          _offsets(sizes),
                          torch.cat([d.qids for d in datasets]), comments,
                          source or "+".join(d.source for d in datasets), position)


def shard_queries(n_queries: int, rank: int, world_size: int) -> range:
    """The queries of ``rank`` among ``world_size`` ranks: contiguous, in order, their counts
    differing by at most one (rank 0 holds the first queries).

    >>> [list(shard_queries(5, r, 2)) for r in range(2)]
    [[0, 1, 2], [3, 4]]
    """
    per, extra = divmod(n_queries, world_size)
    start = rank * per + min(rank, extra)
    return range(start, start + per + (rank < extra))
