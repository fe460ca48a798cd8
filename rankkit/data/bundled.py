"""Bundled data: LETOR 4.0 MQ2008 ships inside the package.

The five partitions S1..S5 are stored gzipped (about 1.8 MB). The folds are the fixed
combinations given in the dataset's readme (Qin & Liu, "Introducing LETOR 4.0 Datasets",
arXiv:1306.2597): fold f trains on three consecutive partitions, validates on the next and
tests on the one after, cyclically:

======  ===============  =====  =====
fold    train            vali   test
======  ===============  =====  =====
1       S1 + S2 + S3     S4     S5
2       S2 + S3 + S4     S5     S1
3       S3 + S4 + S5     S1     S2
4       S4 + S5 + S1     S2     S3
5       S5 + S1 + S2     S3     S4
======  ===============  =====  =====

MQ2008 has 46 features, labels 0-2, and 784 queries; 220 queries have no relevant
document, so the NDCG ``empty=`` convention matters (see docs/metrics.md).
"""
from __future__ import annotations

import functools
import os

from rankkit.data.dataset import RankingDataset, concat
from rankkit.data.svmlight import read_svmlight

_HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bundled")
MQ2008_FEATURES = 46


def mq2008_partition_path(part: int) -> str:
    """Path of the bundled partition S1..S5."""
    if part not in range(1, 6):
        raise ValueError(f"`part` has to be one of 1..5, got {part!r}")
    return os.path.join(_HERE, f"mq2008_S{part}.txt.gz")


@functools.lru_cache(maxsize=5)
def _partition(part: int) -> RankingDataset:
    return read_svmlight(mq2008_partition_path(part), n_features=MQ2008_FEATURES, with_comments=True)


def load_mq2008(fold: int = 1) -> tuple[RankingDataset, RankingDataset, RankingDataset]:
    """The bundled MQ2008 fold as ``(train, vali, test)``.

    >>> train, vali, test = load_mq2008(1)
    >>> train.n_queries, train.n_docs, train.n_features
    (471, 9630, 46)
    """
    return mq2008_split(fold, "train"), mq2008_split(fold, "vali"), mq2008_split(fold, "test")


def mq2008_split(fold: int, split: str) -> RankingDataset:
    """One split (``"train"``, ``"vali"`` or ``"test"``) of the bundled MQ2008 fold; reads only
    the partitions that split is made of (LETOR's rotation: train S_f..S_f+2, vali S_f+3, test S_f+4).

    >>> mq2008_split(2, "vali").source
    'mq2008/fold2/vali'
    """
    if fold not in range(1, 6):
        raise ValueError(f"`fold` has to be one of 1..5, got {fold!r}")
    parts = [(fold - 1 + i) % 5 + 1 for i in range(5)]
    chosen = {"train": parts[:3], "vali": parts[3:4], "test": parts[4:]}
    if split not in chosen:
        raise ValueError(f"`split` has to be one of {sorted(chosen)}, got {split!r}")
    return concat([_partition(p) for p in chosen[split]], source=f"mq2008/fold{fold}/{split}")
