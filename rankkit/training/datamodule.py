"""A LightningDataModule that yields padded batches of whole queries, sharded across ranks.

Batching is planned once per epoch and identically on every rank: the queries are bucketed by
length (:meth:`RankingDataset.bucket_batches`, reshuffled from ``(seed, epoch)`` for training),
and each rank takes every ``world_size``-th batch of the plan, starting at its rank
(:class:`QueryBatchSampler`). See docs/distributed.md.
"""
from __future__ import annotations

import functools
import operator
import os
import re
from typing import Callable, Iterator

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from rankkit.data.bundled import mq2008_split
from rankkit.data.dataset import PaddedBatch, RankingDataset, shard_queries
from rankkit.data.svmlight import read_svmlight
from rankkit.infra import quiet as _quiet
from rankkit.infra.checkpoint import guarded_datamodule_load_from_checkpoint
from rankkit.infra.checks import check_bool, check_int, check_number
from rankkit.training.clicks import CLICK_OPTIONS, click_split


class QueryBatchSampler(DistributedSampler):
    """One rank's part of an epoch's plan of length-bucketed batches of whole queries.

    Every rank builds the same plan from ``(seed, epoch)``: the queries are bucketed by
    length (at most ``max_docs`` padded slots per batch), reshuffled when ``shuffle``. When
    the number of batches B is not a multiple of the world size W, the batches holding the
    most queries are halved until it is, so the ranks' parts are disjoint, cover every query
    once and have the same number of batches. Rank r takes batches r, r + W, r + 2W, ...

    Only when every batch already holds a single query can the count not be evened by
    halving; then

    - ``even=True`` (training: DDP needs the same number of steps on every rank) repeats the
      plan's first batches, as :class:`~torch.utils.data.DistributedSampler` pads its indices;
    - ``even=False`` (evaluation: each query must count once) leaves some ranks one batch
      short, and a rank left with none gets one empty batch (zero queries), so that it still
      takes part in the metrics' all-reduce.

    It is a :class:`~torch.utils.data.DistributedSampler` so that Lightning leaves it in
    place (no sampler of its own injected) and calls :meth:`set_epoch` at each epoch.

    Args:
        dataset: the queries to batch.
        max_docs: upper bound on ``Q * L`` of a padded batch (a longer query gets its own).
        shuffle: re-bucket and reorder the batches every epoch.
        seed: with the epoch, seeds the shuffle.
        num_replicas: W, the world size.
        rank: this process's rank in 0..W-1.
        even: give every rank the same number of batches (see above).
        epoch_fn: when given, read the epoch from it at each ``iter`` instead of taking the
            last :meth:`set_epoch` (the datamodule passes the trainer's ``current_epoch``:
            after a resume from an end-of-epoch checkpoint, Lightning 2.6 calls ``set_epoch``
            with the epoch before the one it trains).

    Yields:
        [B] long CPU tensors of query indices into ``dataset``.

    One batch of five queries, halved for two ranks:

    >>> from rankkit.data.synthetic import make_synthetic
    >>> ds = make_synthetic(5, 4, 3, seed=0)
    >>> [b.tolist() for b in QueryBatchSampler(ds, 20, shuffle=False, num_replicas=2, rank=0)]
    [[0, 1]]
    >>> [b.tolist() for b in QueryBatchSampler(ds, 20, shuffle=False, num_replicas=2, rank=1)]
    [[2, 3, 4]]
    """

    def __init__(self, dataset: RankingDataset, max_docs: int, *, shuffle: bool, seed: int = 0,
                 num_replicas: int = 1, rank: int = 0, even: bool = True,
                 epoch_fn: Callable[[], int] | None = None):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed)
        self.max_docs, self.even, self.epoch_fn = max_docs, even, epoch_fn
        # The number of batches is the same every epoch: reshuffling only breaks ties between
        # queries of equal length, so the sorted sizes, and the cuts between batches, stay put.
        n = len(self.plan(0))
        self.total_size = -(-n // num_replicas) * num_replicas if even else n
        self.num_samples = self.total_size // num_replicas if even else max(1, len(range(rank, n, num_replicas)))

    def plan(self, epoch: int) -> list[torch.Tensor]:
        """Every rank's batches for ``epoch`` (before padding), the same on every rank."""
        g = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        batches = self.dataset.bucket_batches(self.max_docs, shuffle=self.shuffle, generator=g)
        while len(batches) % self.num_replicas:
            i = max(range(len(batches)), key=lambda j: len(batches[j]))  # the first of the largest
            if len(batches[i]) < 2:
                break
            half = len(batches[i]) // 2
            batches[i:i + 1] = [batches[i][:half], batches[i][half:]]
        return batches

    def __iter__(self) -> Iterator[torch.Tensor]:
        # A generator: the epoch is read at the first batch, not when the DataLoader makes its
        # iterator (on a resume Lightning makes it before it restores the epoch counter).
        batches = self.plan(self.epoch_fn() if self.epoch_fn is not None else self.epoch)
        if self.even and batches:
            repeats = -(-self.total_size // len(batches))
            batches = (batches * repeats)[:self.total_size]
        part = batches[self.rank::self.num_replicas]
        if not part and not self.even:
            part = [torch.zeros(0, dtype=torch.int64)]
        yield from part


class _PaddedQueries(Dataset):
    """A map-style view of a dataset whose index is a batch of query indices (from
    :class:`QueryBatchSampler`) and whose item is that batch, padded."""

    def __init__(self, dataset: RankingDataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return self.dataset.n_queries

    def __getitem__(self, queries: torch.Tensor) -> PaddedBatch:
        return self.dataset.padded(queries)


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


def _fold_folder(data: str, fold: int) -> str:
    """``data/Fold<fold>`` when ``data`` is a LETOR root of Fold1..FoldN subfolders, else ``data``."""
    folds = {int(m.group(1)): name for name in os.listdir(data)
             if (m := re.fullmatch(r"fold(\d+)", name, re.IGNORECASE)) and os.path.isdir(os.path.join(data, name))}
    if not folds:
        if fold != 1:
            raise ValueError(f"`fold` has to be 1 for {data!r} (a folder without Fold1..FoldN subfolders), got {fold}")
        return data
    if fold not in folds:
        raise ValueError(f"`fold` has to be one of {sorted(folds)} for {data!r}, got {fold}")
    return os.path.join(data, folds[fold])


def available_folds(data: str) -> list[int]:
    """The fold numbers of a LETOR root (``Fold1``..``FoldN`` subfolders); [] for a plain folder.

    >>> available_folds(".")
    []
    """
    return sorted(int(m.group(1)) for name in os.listdir(data)
                  if (m := re.fullmatch(r"fold(\d+)", name, re.IGNORECASE)) and os.path.isdir(os.path.join(data, name)))


def data_folds(data: str) -> list[int]:
    """The folds ``data`` offers: MQ2008's 1..5 for ``"mq2008"``, a LETOR root's Fold numbers, [1]
    for a plain folder; ValueError for anything else (the datamodule's words)."""
    if data == "mq2008":
        return [1, 2, 3, 4, 5]
    if not os.path.isdir(data):
        raise ValueError(f"`data` must be 'mq2008' or a folder of train/vali/test files (or a LETOR root of "
                         f"Fold1..FoldN folders), got {data!r}")
    return available_folds(data) or [1]


def parse_folds(text, available: list[int] | range = range(1, 6)) -> list[int]:
    """``"1-5"``, ``"1,3"``, ``2`` or a sequence of fold numbers -> the folds in the order given,
    each one of ``available`` (:func:`data_folds`; MQ2008's 1..5 by default), none twice: the one
    reading of ``folds`` for ``rankkit compare`` and ``rankkit tune``.

    >>> parse_folds("1-3"), parse_folds("4,2"), parse_folds(5), parse_folds([2, 1], [1, 2])
    ([1, 2, 3], [4, 2], [5], [2, 1])
    """
    try:
        if isinstance(text, bool) or (not isinstance(text, str) and hasattr(text, "__iter__")
                                      and any(isinstance(f, bool) for f in text)):
            raise ValueError("a bool is no fold")
        if not isinstance(text, str) and hasattr(text, "__iter__"):  # a list, a tuple, a numpy array
            folds = [operator.index(f) for f in text]
        else:
            s = text.strip() if isinstance(text, str) else str(operator.index(text))
            if "-" in s.lstrip("-"):
                a, b = s.split("-")
                folds = list(range(int(a), int(b) + 1))
            else:
                folds = [int(x) for x in s.split(",")]
    except (ValueError, TypeError):
        raise ValueError(f"`folds` has to look like '1-5', '1,3' or '2', got {text!r}") from None
    if not folds:
        raise ValueError(f"`folds` names no fold, got {text!r}")
    if any(f not in available for f in folds):
        names = "1..5" if list(available) == list(range(1, 6)) else f"{list(available)}"
        raise ValueError(f"`folds` has to name folds in {names}, got {text!r}")
    if len(set(folds)) != len(folds):
        raise ValueError(f"`folds` names a fold twice: {text!r}")
    return folds


def hold_out(dataset: RankingDataset, fraction: float, *, seed: int = 0) -> tuple[RankingDataset, RankingDataset]:
    """Split whole queries at random into ``(rest, held_out)``, ``round(fraction * Q)`` of them
    (at least one) held out; both keep the dataset's query order.

    >>> from rankkit.data.synthetic import make_synthetic
    >>> rest, held = hold_out(make_synthetic(10, 3, 2), 0.2, seed=0)
    >>> rest.n_queries, held.n_queries, sorted(rest.qids.tolist() + held.qids.tolist()) == list(range(10))
    (8, 2, True)
    """
    q = dataset.n_queries
    n = max(1, round(fraction * q))
    if n >= q:
        raise ValueError(f"`val_fraction` {fraction} holds out {n} of the {q} training queries; none would be left")
    chosen = torch.zeros(q, dtype=torch.bool)
    chosen[torch.randperm(q, generator=torch.Generator().manual_seed(seed))[:n]] = True
    idx = torch.arange(q)
    rest, held = dataset.subset(idx[~chosen]), dataset.subset(idx[chosen])
    held.source = f"{dataset.source} (held out: {fraction:g} of the queries, seed {seed})"
    return rest, held


def _rank_and_world(trainer: pl.Trainer | None) -> tuple[int, int]:
    """(rank, world size): the trainer's when one is attached, else torch.distributed's, else (0, 1)."""
    if trainer is not None:
        return trainer.global_rank, trainer.world_size
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class RankingDataModule(pl.LightningDataModule):
    """Train/val/test ranking data for Lightning, sharded across ranks under DDP.

    Args:
        data: ``"mq2008"`` for the bundled set, or a folder holding ``train``/``vali``/``test``
            files (``train.txt``, ``.txt.gz``, ``.bz2``; LightGBM's ``rank.train``/``rank.test``
            with ``.query`` sidecars), or a LETOR root whose ``Fold1``..``FoldN`` subfolders
            hold such files.
        fold: the fold: 1..5 for MQ2008, 1..N for a LETOR root; has to be 1 for a plain folder.
        max_docs: upper bound on ``Q * L`` of a padded batch (queries are never split).
        seed: seeds the per-epoch shuffling of training batches and the ``val_fraction`` split.
        val_fraction: when the data has no validation file (LightGBM's example has only
            ``rank.train`` and ``rank.test``), hold out this fraction of the training queries
            (whole queries, drawn from ``seed``) as the validation set; 0 (the default) leaves
            such data without one. A validation file, when there is one, is always used and
            this is ignored.
        val_seed: draws the ``val_fraction`` split instead of ``seed`` (``rankkit compare`` holds
            out the same queries for every seed and model).
        clicks: train on simulated clicks instead of the labels: a dict of
            :func:`rankkit.training.clicks.click_split`'s options (``model``, ``eta``, ``sessions``,
            ``k``, ``fraction``, ``max_label``), e.g. ``{"model": "pbm", "eta": 1.0}``. The
            training and validation splits become click logs (one query per session, clicks as
            labels, with ``position``), drawn from ``seed``; the test split keeps its true labels.
            ``{}`` simulates with every default. None (the default): the labels as they are.
        click_log: the folder holds your own click log: the training and validation files'
            labels are clicks (0/1), each query is a session, and each file has a ``.position``
            sidecar beside it (``train.txt.position``: one displayed position per document and
            line, as LightGBM's ``.position`` file; ids of any numbering, see
            :class:`rankkit.clicks.propensity.PositionIds`), which becomes the datasets' ``position``
            (the unbiased rankers read it). The test file keeps true relevance labels.

    Batches: each rank gets its part of the same per-epoch plan (:class:`QueryBatchSampler`):
    disjoint, every query once, and for training the same number of batches on every rank.
    The rank and world size come from the trainer when one is attached, else from
    ``torch.distributed`` when it is initialised.
    """

    # Lightning's would fetch a URL and honour weights_only=False (unpickling the file)
    load_from_checkpoint = classmethod(guarded_datamodule_load_from_checkpoint)

    def __init__(self, data: str = "mq2008", fold: int = 1, max_docs: int = 4096, seed: int = 0,
                 val_fraction: float = 0.0, val_seed: int | None = None, clicks: dict | None = None,
                 click_log: bool = False):
        super().__init__()
        check_bool(click_log, "click_log")
        if click_log and clicks is not None:
            raise ValueError("`click_log=True` reads your own click log from a folder (files with .position "
                             "sidecars); `clicks=` simulates one from labelled data instead: give one of the two")
        if click_log and data == "mq2008":
            raise ValueError("`click_log=True` reads your own click log from a folder: pass data=FOLDER "
                             "(--data.data=FOLDER) holding train.txt with train.txt.position, vali.txt with "
                             "vali.txt.position and a labelled test.txt")
        if clicks is not None:
            if not isinstance(clicks, dict) or any(key not in CLICK_OPTIONS for key in clicks):
                bad = next((key for key in clicks if key not in CLICK_OPTIONS), None) if isinstance(clicks, dict) \
                    else clicks
                raise ValueError(f"`clicks` has to be a dict of {CLICK_OPTIONS}, got {bad!r}")
        check_int(fold, "fold")
        check_int(max_docs, "max_docs")
        check_number(val_fraction, "val_fraction", low=0, high=1, high_open=True)
        check_int(val_seed, "val_seed", low=0, none=True)
        self.save_hyperparameters()
        self.train_set: RankingDataset | None = None
        self.val_set: RankingDataset | None = None
        self.test_set: RankingDataset | None = None

    # The test split is read on first use, not by `setup`: fitting, validating and tuning
    # (`rankkit tune`) never read it; `test` and `predict` do.
    @property
    def test_set(self) -> RankingDataset | None:
        if getattr(self, "_read_test", None) is not None:
            self._test_set, self._read_test = self._read_test(), None
        return getattr(self, "_test_set", None)

    @test_set.setter
    def test_set(self, value: RankingDataset | None) -> None:
        self._test_set, self._read_test = value, None

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
        splits = (lambda: self.train_set, lambda: self.val_set, lambda: self.test_set)  # test read last, if at all
        return next(d for d in (split() for split in splits) if d is not None).n_features

    def setup(self, stage: str | None = None) -> None:
        if stage is not None and self.trainer is not None:
            _quiet.hold(self, module=False)  # Lightning's LeafSpec deprecation (rankkit.infra.quiet)
        if any(d is not None for d in (self.train_set, self.val_set, self._test_set, self._read_test)):
            return
        h = self.hparams
        if h.data == "mq2008":
            self.train_set, self.val_set = mq2008_split(h.fold, "train"), mq2008_split(h.fold, "vali")
            self._read_test = functools.partial(mq2008_split, h.fold, "test")
            self._to_clicks()
            return
        data_folds(h.data)  # a folder, or one line saying what `data` has to be
        folder = _fold_folder(h.data, h.fold)
        train = _find_split(folder, ("train.txt", "train", "rank.train"))
        if train is None:
            raise ValueError(f"{folder}: no train file (train.txt[.gz] or rank.train)")
        train_set = read_svmlight(train, position_file=self._position_file(train))
        f = train_set.n_features
        val = _find_split(folder, ("vali.txt", "valid.txt", "val.txt", "vali", "rank.vali"))
        test = _find_split(folder, ("test.txt", "test", "rank.test"))
        val_set = read_svmlight(val, n_features=f, position_file=self._position_file(val)) if val else None
        if val_set is None and h.val_fraction > 0:
            train_set, val_set = hold_out(train_set, h.val_fraction, seed=h.seed if h.get("val_seed") is None
                                          else h.val_seed)
        self.train_set, self.val_set = train_set, val_set
        self.test_set = None
        if test:
            self._read_test = functools.partial(read_svmlight, test, n_features=f)
        self._to_clicks()

    def _position_file(self, path: str) -> str | None:
        """With ``click_log``: the ``.position`` sidecar of a training or validation file."""
        if not self.hparams.get("click_log"):
            return None
        sidecar = path + ".position"
        if not os.path.isfile(sidecar):
            raise ValueError(f"`click_log=True`: {sidecar} is missing (one displayed position per document and "
                             f"line, as LightGBM's .position file)")
        return sidecar

    def _to_clicks(self) -> None:
        """With ``clicks``: the training and validation splits become simulated click logs."""
        options = self.hparams.get("clicks")
        if options is not None:  # `clicks: {}` is the simulation's defaults, not "no clicks"
            self.train_set, self.val_set = click_split(self.train_set, self.val_set, seed=self.hparams.seed,
                                                       **options)

    def teardown(self, stage: str | None = None) -> None:
        _quiet.release(self)

    def on_exception(self, exception: BaseException) -> None:
        # A failed fit calls no teardown hook: the module's filters go too (a module has no
        # on_exception hook of its own).
        _quiet.release(self)
        if self.trainer is not None and self.trainer.lightning_module is not None:
            _quiet.release(self.trainer.lightning_module)

    def _loader(self, ds: RankingDataset | None, *, train: bool, split: str = "training") -> DataLoader:
        if ds is None:
            hint = {"validation": " (vali.txt, valid.txt, val.txt or rank.vali); --data.val_fraction=0.1 "
                                  "(RankingDataModule(val_fraction=0.1)) holds out training queries instead",
                    "test": " (test.txt or rank.test)"}.get(split, "")
            raise ValueError(f"`data` {self.hparams.data!r}: no {split} file{hint}")
        rank, world = _rank_and_world(self.trainer)
        trainer = self.trainer
        epoch_fn = None if trainer is None else (lambda: trainer.current_epoch)
        sampler = QueryBatchSampler(ds, self.hparams.max_docs, shuffle=train, seed=self.hparams.seed,
                                    num_replicas=world, rank=rank, even=train, epoch_fn=epoch_fn)
        return DataLoader(_PaddedQueries(ds), sampler=sampler, batch_size=None)

    def train_dataloader(self) -> DataLoader:
        module = self.trainer.lightning_module if self.trainer is not None else None
        if getattr(module, "train_batching", "padded") == "dataset":
            # A booster's round needs every training document at once: one item per epoch, the
            # dataset itself (nothing padded); under DDP this rank's shard of whole queries, in
            # order (the data-parallel booster all-reduces its sums, see
            # rankkit.boosting.distributed).
            if self.train_set is None:
                raise ValueError("this datamodule has no training set")
            rank, world_size = _rank_and_world(self.trainer)
            part = self.train_set
            if world_size > 1:
                part = part.subset(list(shard_queries(part.n_queries, rank, world_size)))
            return DataLoader(_WholeDataset(part), batch_size=None)
        return self._loader(self.train_set, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, train=False, split="validation")

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, train=False, split="test")

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, train=False, split="test")

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        if isinstance(batch, PaddedBatch):
            return batch.to(device)
        if isinstance(batch, RankingDataset):
            return batch  # the booster bins on the CPU and moves its codes itself
        return super().transfer_batch_to_device(batch, device, dataloader_idx)
