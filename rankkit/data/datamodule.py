"""A LightningDataModule that yields padded batches of whole queries."""
from __future__ import annotations

import os
from typing import Callable, Iterator

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from rankkit.data.dataset import PaddedBatch, RankingDataset
from rankkit.data.svmlight import read_svmlight


class QueryBatches(IterableDataset):
    """Length-bucketed padded batches of a dataset; one item is one whole batch.

    Training batches are re-bucketed every epoch with a generator seeded by
    ``(seed, epoch)``, so an epoch's batches are the same on every run and after a resume.
    """

    def __init__(self, dataset: RankingDataset, max_docs: int, *, shuffle: bool, seed: int = 0,
                 epoch_fn: Callable[[], int] | None = None):
        self.dataset, self.max_docs, self.shuffle, self.seed = dataset, max_docs, shuffle, seed
        self.epoch_fn = epoch_fn
        self._epoch = 0

    def _batches(self) -> list[torch.Tensor]:
        epoch = self.epoch_fn() if self.epoch_fn is not None else self._epoch
        self._epoch += 1
        g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        return self.dataset.bucket_batches(self.max_docs, shuffle=self.shuffle, generator=g)

    def __iter__(self) -> Iterator[PaddedBatch]:
        for q in self._batches():
            yield self.dataset.padded(q)

    def __len__(self) -> int:
        return len(self.dataset.bucket_batches(self.max_docs))


class _WholeDataset(Dataset):
    """A one-item dataset whose item is the whole :class:`RankingDataset`."""

    def __init__(self, dataset: RankingDataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> RankingDataset:
        return self.dataset


def _find_split(directory: str, names: tuple[str, ...]) -> str | None:
    for name in names:
        for ext in ("", ".gz", ".bz2"):
            p = os.path.join(directory, name + ext)
            if os.path.exists(p):
                return p
    return None


class RankingDataModule(pl.LightningDataModule):
    """Train/val/test ranking data for Lightning.

    Args:
        data: ``"mq2008"`` for the bundled set (with ``fold``), or a folder holding
            ``train``/``vali``/``test`` files (``.txt``, ``.txt.gz``, LightGBM's
            ``rank.train``/``rank.test`` with ``.query`` sidecars).
        fold: MQ2008 fold 1..5 (ignored for a folder).
        max_docs: upper bound on ``Q * L`` of a padded batch (queries are never split).
        seed: seeds the per-epoch shuffling of training batches.
    """

    def __init__(self, data: str = "mq2008", fold: int = 1, max_docs: int = 4096, seed: int = 0):
        super().__init__()
        self.save_hyperparameters()
        self.train_set: RankingDataset | None = None
        self.val_set: RankingDataset | None = None
        self.test_set: RankingDataset | None = None

    @classmethod
    def from_datasets(cls, train: RankingDataset | None = None, val: RankingDataset | None = None,
                      test: RankingDataset | None = None, *, max_docs: int = 4096,
                      seed: int = 0) -> "RankingDataModule":
        dm = cls(data="<memory>", max_docs=max_docs, seed=seed)
        dm.train_set, dm.val_set, dm.test_set = train, val, test
        return dm

    @property
    def n_features(self) -> int:
        self.setup()
        return next(d for d in (self.train_set, self.val_set, self.test_set) if d is not None).n_features

    def setup(self, stage: str | None = None) -> None:
        if any(d is not None for d in (self.train_set, self.val_set, self.test_set)):
            return
        data = self.hparams.data
        if data == "mq2008":
            from rankkit.data.bundled import load_mq2008

            self.train_set, self.val_set, self.test_set = load_mq2008(self.hparams.fold)
            return
        if not os.path.isdir(data):
            raise ValueError(f"`data` must be 'mq2008' or a folder of train/vali/test files, got {data!r}")
        train = _find_split(data, ("train.txt", "train", "rank.train"))
        if train is None:
            raise ValueError(f"{data}: no train file (train.txt[.gz] or rank.train)")
        self.train_set = read_svmlight(train)
        f = self.train_set.n_features
        val = _find_split(data, ("vali.txt", "valid.txt", "val.txt", "vali", "rank.vali"))
        test = _find_split(data, ("test.txt", "test", "rank.test"))
        self.val_set = read_svmlight(val, n_features=f) if val else None
        self.test_set = read_svmlight(test, n_features=f) if test else None

    def _loader(self, ds: RankingDataset | None, shuffle: bool) -> DataLoader:
        if ds is None:
            raise ValueError("this datamodule has no such split")
        epoch_fn = None
        if shuffle:
            epoch_fn = lambda: (self.trainer.current_epoch if self.trainer is not None else 0)  # noqa: E731
        return DataLoader(QueryBatches(ds, self.hparams.max_docs, shuffle=shuffle, seed=self.hparams.seed,
                                       epoch_fn=epoch_fn), batch_size=None)

    def train_dataloader(self) -> DataLoader:
        module = self.trainer.lightning_module if self.trainer is not None else None
        if getattr(module, "train_batching", "padded") == "dataset":
            # A booster's round needs every training document at once: one item per epoch, the
            # dataset itself (nothing padded).
            if self.train_set is None:
                raise ValueError("this datamodule has no training set")
            return DataLoader(_WholeDataset(self.train_set), batch_size=None)
        return self._loader(self.train_set, True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, False)

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        if isinstance(batch, PaddedBatch):
            return batch.to(device)
        if isinstance(batch, RankingDataset):
            return batch  # the booster bins on the CPU and moves its codes itself
        return super().transfer_batch_to_device(batch, device, dataloader_idx)
