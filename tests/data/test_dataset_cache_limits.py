"""rankkit.data.dataset's caches: complex labels refused, not truncated; a compressed cache cannot ask
for more than a small multiple of its file."""
from __future__ import annotations

import numpy as np
import pytest

from rankkit.data import make_synthetic
from rankkit.data.dataset import MAX_DEFLATE_RATIO, RankingDataset


def test_a_cache_with_complex_labels_is_refused_not_truncated(tmp_path):
    make_synthetic(5, 4, 3).save(tmp_path / "c.npz")
    arrays = dict(np.load(tmp_path / "c.npz"))
    arrays["labels"] = arrays["labels"].astype(np.complex64) + 1j
    np.savez(tmp_path / "x.npz", **arrays)
    with pytest.raises(ValueError, match="labels.npy' holds complex64 values"):
        RankingDataset.load(tmp_path / "x.npz")


def test_a_compressed_cache_cannot_ask_for_more_than_a_small_multiple_of_its_file(tmp_path):
    make_synthetic(5, 4, 3).save(tmp_path / "c.npz")
    arrays = dict(np.load(tmp_path / "c.npz"))
    arrays["features"] = np.zeros((2_000_000, 46), np.float32)  # 368 MB of zeros in a few hundred KB
    np.savez_compressed(tmp_path / "bomb.npz", **arrays)
    assert (tmp_path / "bomb.npz").stat().st_size * MAX_DEFLATE_RATIO < 368_000_000
    with pytest.raises(ValueError, match="MAX_DEFLATE_RATIO"):
        RankingDataset.load(tmp_path / "bomb.npz")
    arrays["features"] = np.random.default_rng(0).random((2000, 46), dtype=np.float32)  # real data compresses little
    arrays["labels"] = np.zeros(2000, np.float32)
    arrays["offsets"] = np.array([0, 2000])
    arrays["qids"] = np.array([1])
    arrays.pop("comments", None)
    arrays.pop("position", None)
    np.savez_compressed(tmp_path / "fine.npz", **arrays)
    assert RankingDataset.load(tmp_path / "fine.npz").n_docs == 2000
