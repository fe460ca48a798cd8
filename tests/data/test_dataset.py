"""rankkit.data.dataset: subsets, padding, length buckets, save and load, concat, validation."""
from __future__ import annotations

import pytest
import torch

from rankkit.data import RankingDataset, concat, make_synthetic, pad


# -- dataset operations ---------------------------------------------------------------------
@pytest.fixture
def small() -> RankingDataset:
    return make_synthetic(40, (1, 30), 5, seed=3)


def test_subset_and_padded(small):
    sub = small.subset([5, 2])
    assert sub.qids.tolist() == [5, 2]
    assert sub.n_docs == int(small.sizes[5] + small.sizes[2])
    b = small.padded([5, 2])
    assert b.mask.sum(1).tolist() == [int(small.sizes[5]), int(small.sizes[2])]
    s, e = int(small.offsets[2]), int(small.offsets[3])
    assert torch.equal(b.features[1, : e - s], small.features[s:e])
    assert torch.equal(b.labels[1][b.mask[1]], small.labels[s:e])
    assert (b.features[~b.mask] == 0).all()


def test_pad_roundtrip(small):
    x, mask = pad(small.labels, small.sizes)
    assert torch.equal(x[mask], small.labels)


def test_bucket_batches_cover_each_query_once(small):
    for shuffle in (False, True):
        g = torch.Generator().manual_seed(0)
        batches = small.bucket_batches(64, shuffle=shuffle, generator=g)
        allq = torch.cat(batches).sort().values
        assert torch.equal(allq, torch.arange(small.n_queries))
        for b in batches:
            assert len(b) == 1 or len(b) * int(small.sizes[b].max()) <= 64
    # the same generator seed gives the same batches
    a = small.bucket_batches(64, shuffle=True, generator=torch.Generator().manual_seed(7))
    b = small.bucket_batches(64, shuffle=True, generator=torch.Generator().manual_seed(7))
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_bucketing_keeps_padding_waste_small():
    ds = make_synthetic(500, (1, 1000), 3, seed=0)
    naive = 1 - ds.n_docs / (ds.n_queries * int(ds.sizes.max()))
    assert naive > 0.7
    assert ds.padding_waste(8192) <= 0.1


def test_save_load_roundtrip_and_corrupt(tmp_path, small):
    small.comments = [f"c{i}" for i in range(small.n_docs)]
    p = tmp_path / "c.npz"
    small.save(p)
    back = RankingDataset.load(p)
    for name in ("features", "labels", "offsets", "qids"):
        assert torch.equal(getattr(back, name), getattr(small, name))
    assert back.comments == small.comments
    data = p.read_bytes()
    (tmp_path / "bad.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="not a valid rankkit dataset cache"):
        RankingDataset.load(tmp_path / "bad.npz")


def test_concat_rejects_feature_mismatch(small):
    other = make_synthetic(3, 4, 6, seed=0)
    with pytest.raises(ValueError, match="different feature counts"):
        concat([small, other])


def test_dataset_validation():
    with pytest.raises(ValueError, match="offsets"):
        RankingDataset(torch.zeros(3, 2), torch.zeros(3), torch.tensor([0, 2]), torch.tensor([1]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_dataset_from_cuda_tensors_stays_on_cuda(small):
    cuda = RankingDataset(small.features.cuda(), small.labels.cuda(), small.offsets.cuda(), small.qids.cuda())
    batch = cuda.padded()
    assert {t.device.type for t in batch if t is not None} == {"cuda"}  # (no positions: None)
    torch.testing.assert_close(batch.features.cpu(), small.padded().features)
    assert cuda.subset([1, 0]).features.device.type == "cuda"
    assert concat([cuda, cuda]).offsets.device.type == "cuda"
    out, mask = pad(cuda.labels, cuda.sizes)
    assert out.device.type == mask.device.type == "cuda"
    assert [b.tolist() for b in cuda.bucket_batches(4)] == [b.tolist() for b in small.bucket_batches(4)]


def test_dataset_checks_name_the_argument_and_position():
    with pytest.raises(ValueError, match=r"`features` has to be finite or NaN \(missing\), got inf at \[1, 0\]"):
        RankingDataset(torch.tensor([[0.0], [float("inf")]]), torch.zeros(2), [0, 2], [1])
    with pytest.raises(ValueError, match=r"`labels` has to be finite and non-negative, got nan at \[0\]"):
        RankingDataset(torch.zeros(2, 1), torch.tensor([float("nan"), 0.0]), [0, 2], [1])
