"""rankkit.training.datamodule: the batches of the bundled data and of a folder."""
from __future__ import annotations

import pytest
import torch
from samples import GOOD

from rankkit.data import RankingDataset, make_synthetic
from rankkit.training.datamodule import RankingDataModule


# -- dataset operations ---------------------------------------------------------------------
@pytest.fixture
def small() -> RankingDataset:
    return make_synthetic(40, (1, 30), 5, seed=3)


# -- DataModule ---------------------------------------------------------------------------------
def test_datamodule_batches(small):
    dm = RankingDataModule.from_datasets(small, small.subset(range(10)), None, max_docs=100, seed=1)
    epoch1 = [b.query_index for b in dm.train_dataloader()]
    epoch2 = [b.query_index for b in dm.train_dataloader()]
    assert torch.equal(torch.cat(epoch1).sort().values, torch.arange(small.n_queries))
    # no trainer: both calls are "epoch 0", so the same shuffle (what a resume relies on)
    assert all(torch.equal(x, y) for x, y in zip(epoch1, epoch2))
    val = list(dm.val_dataloader())
    assert sum(int(b.mask.sum()) for b in val) == small.subset(range(10)).n_docs
    assert dm.n_features == 5


def test_datamodule_bundled_and_folder(tmp_path):
    dm = RankingDataModule("mq2008", fold=2)
    dm.setup()
    assert dm.train_set.n_queries == 471 and dm.val_set.n_queries == 156
    (tmp_path / "train.txt").write_text(GOOD)
    (tmp_path / "test.txt").write_text(GOOD)
    dm = RankingDataModule(str(tmp_path))
    dm.setup()
    assert dm.train_set.n_docs == 5 and dm.val_set is None and dm.test_set.n_docs == 5
    with pytest.raises(ValueError, match="`data` must be"):
        RankingDataModule("nowhere").setup()
