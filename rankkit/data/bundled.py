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
    if fold not in range(1, 6):
        raise ValueError(f"`fold` has to be one of 1..5, got {fold!r}")
    parts = [(fold - 1 + i) % 5 + 1 for i in range(5)]
    name = f"mq2008/fold{fold}"
    train = concat([_partition(p) for p in parts[:3]], source=f"{name}/train")
    vali = concat([_partition(parts[3])], source=f"{name}/vali")
    test = concat([_partition(parts[4])], source=f"{name}/test")
    return train, vali, test
