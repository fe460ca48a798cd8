"""Data layer: reading files, the bad-input policy, padding/bucketing, caches, DataModule, fetch."""
from __future__ import annotations

import bz2
import gzip
import hashlib
import http.server
import io
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from rankkit.data import (RankingDataset, concat, fetch_letor_zip, load_mq2008, make_synthetic, pad,
                          read_svmlight)
from rankkit.data import fetch as fetch_mod
from rankkit.training.datamodule import RankingDataModule

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
needs_shared = pytest.mark.skipif(not SHARED.exists(), reason="../shared/data not present")


def write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


GOOD = """2 qid:1 1:0.5 2:1.0 # doc a
0 qid:1 1:0.1 2:0.2 # doc b
1 qid:2 1:0.3 3:0.7 # doc c
0 qid:2 2:0.9
0 qid:2 1:1 2:2 3:3
"""


# -- reading ------------------------------------------------------------------------------
@needs_shared
def test_mq2008_fold1_train_counts():
    ds = read_svmlight(SHARED / "MQ2008" / "Fold1" / "train.txt.gz")
    assert (ds.n_queries, ds.n_docs, ds.n_features) == (471, 9630, 46)
    assert ds.summary()["labels"] == {0: 7820, 1: 1223, 2: 587}


@needs_shared
def test_lightgbm_sample_with_query_sidecar():
    d = SHARED / "lightgbm-lambdarank"
    ds = read_svmlight(d / "rank.train", query_file=d / "rank.train.query")
    assert (ds.n_queries, ds.n_docs) == (201, 3005)
    assert ds.sizes.min() == 1 and ds.sizes.max() == 27
    # the sidecar is found on its own too
    assert read_svmlight(d / "rank.train").n_queries == 201


@needs_shared
@pytest.mark.parametrize("fold", [1, 3])
def test_bundled_folds_equal_the_shared_files(fold):
    ours = load_mq2008(fold)
    for split, mine in zip(("train", "vali", "test"), ours):
        ref = read_svmlight(SHARED / "MQ2008" / f"Fold{fold}" / f"{split}.txt.gz")
        assert torch.equal(mine.features, ref.features)
        assert torch.equal(mine.labels, ref.labels)
        assert torch.equal(mine.offsets, ref.offsets)
        assert torch.equal(mine.qids, ref.qids)


def test_small_file_grouping_comments_and_sparse(tmp_path):
    ds = read_svmlight(write(tmp_path, "a.txt", GOOD), with_comments=True)
    assert ds.n_queries == 2 and ds.n_features == 3
    assert ds.qids.tolist() == [1, 2] and ds.offsets.tolist() == [0, 2, 5]
    assert ds.comments == ["doc a", "doc b", "doc c", "", ""]
    assert ds.features[2].tolist() == pytest.approx([0.3, 0.0, 0.7])
    assert ds.labels.tolist() == [2, 0, 1, 0, 0]


@pytest.mark.parametrize("opener,ext", [(gzip.open, ".gz"), (bz2.open, ".bz2")])
def test_compressed(tmp_path, opener, ext):
    p = tmp_path / ("a.txt" + ext)
    with opener(p, "wt") as f:
        f.write(GOOD)
    plain = read_svmlight(write(tmp_path, "plain.txt", GOOD))
    assert torch.equal(read_svmlight(p).features, plain.features)


# -- the bad-input policy -------------------------------------------------------------------
def test_malformed_line_names_file_and_line(tmp_path):
    text = GOOD.replace("0 qid:2 2:0.9", "0 qid:2 2:zzz")
    p = write(tmp_path, "bad.txt", text)
    with pytest.raises(ValueError, match=r"bad\.txt:4: malformed line"):
        read_svmlight(p)


def test_inf_is_an_error_nan_is_missing(tmp_path):
    with pytest.raises(ValueError, match=r"inf\.txt:3: infinite"):
        read_svmlight(write(tmp_path, "inf.txt", GOOD.replace("1:0.3", "1:inf")))
    ds = read_svmlight(write(tmp_path, "nan.txt", GOOD.replace("1:0.3", "1:nan")))
    assert torch.isnan(ds.features[2, 0]) and not torch.isnan(ds.features[[0, 1, 3, 4]]).any()


@pytest.mark.parametrize("label", ["-1", "1.5"])
def test_bad_labels(tmp_path, label):
    p = write(tmp_path, "lab.txt", GOOD.replace("1 qid:2 1:0.3", f"{label} qid:2 1:0.3"))
    with pytest.raises(ValueError, match=r"lab\.txt:3: label must be a non-negative integer"):
        read_svmlight(p)


def test_interleaved_qid(tmp_path):
    p = write(tmp_path, "il.txt", GOOD + "1 qid:1 1:0.4\n")
    with pytest.raises(ValueError, match=r"il\.txt:6: qid 1 appears again"):
        read_svmlight(p)


def test_empty_file(tmp_path):
    with pytest.raises(ValueError, match="no documents"):
        read_svmlight(write(tmp_path, "empty.txt", ""))


def test_missing_file_and_missing_grouping(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_svmlight(tmp_path / "nope.txt")
    with pytest.raises(ValueError, match="no 'qid:'"):
        read_svmlight(write(tmp_path, "noq.txt", "1 1:0.5\n0 1:0.2\n"))


def test_query_file_mismatch(tmp_path):
    p = write(tmp_path, "r.txt", "1 1:0.5\n0 1:0.2\n2 1:0.1\n")
    write(tmp_path, "sizes", "2\n2\n")
    with pytest.raises(ValueError, match="sum to 4"):
        read_svmlight(p, query_file=tmp_path / "sizes")
    write(tmp_path, "sizes2", "2\n1\n")
    ds = read_svmlight(p, query_file=tmp_path / "sizes2")
    assert ds.sizes.tolist() == [2, 1]  # a one-document query is kept


def test_feature_count_alignment(tmp_path):
    p = write(tmp_path, "a.txt", GOOD)
    assert read_svmlight(p, n_features=5).n_features == 5  # fewer: zero-padded
    with pytest.raises(ValueError, match="more than the expected n_features=2"):
        read_svmlight(p, n_features=2)


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


# -- synthetic --------------------------------------------------------------------------------
def test_synthetic_is_mslr_shaped_and_seeded():
    a = make_synthetic(300, 50, 20, seed=1)
    b = make_synthetic(300, 50, 20, seed=1)
    assert torch.equal(a.features, b.features) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.labels, make_synthetic(300, 50, 20, seed=2).labels)
    share = torch.bincount(a.labels.long(), minlength=5).float() / a.n_docs
    assert a.labels.min() == 0 and a.labels.max() == 4
    assert share[0] > 0.4 and share[0] > share[1] > share[2] > share[4]
    # the labels are learnable: the informative features correlate with them
    corr = np.corrcoef(a.features[:, 1].numpy(), a.labels.numpy())[0, 1]
    assert abs(corr) > 0.05 or abs(np.corrcoef(a.features[:, 0].numpy(), a.labels.numpy())[0, 1]) > 0.05


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


# -- fetch --------------------------------------------------------------------------------------
@pytest.fixture
def http_zip(tmp_path):
    """A local HTTP server (loopback only) serving a LETOR-style zip."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for split in ("train", "vali", "test"):
            z.writestr(f"Fold1/{split}.txt", GOOD)
    payload = buf.getvalue()

    class Handler(http.server.BaseHTTPRequestHandler):
        hits = 0

        def do_GET(self):  # noqa: N802
            Handler.hits += 1
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/data.zip", hashlib.sha256(payload).hexdigest(), Handler
    server.shutdown()


def test_fetch_downloads_verifies_and_caches(tmp_path, http_zip, monkeypatch):
    url, digest, handler = http_zip
    monkeypatch.setitem(fetch_mod.REMOTES, "toy", fetch_mod.Remote(url, "toy.zip", digest, 3))
    root = tmp_path / "cache"
    train, vali, test = fetch_letor_zip("toy", 1, root=root)
    assert train.n_queries == 2 and test.n_docs == 5
    assert handler.hits == 1
    again = fetch_letor_zip("toy", 1, root=root)  # from the .npz cache, no download
    assert torch.equal(again[0].features, train.features) and handler.hits == 1


def test_fetch_checksum_mismatch_leaves_nothing(tmp_path, http_zip, monkeypatch):
    url, digest, _ = http_zip
    monkeypatch.setitem(fetch_mod.REMOTES, "toy", fetch_mod.Remote(url, "toy.zip", "0" * 64, 3))
    with pytest.raises(ValueError, match="checksum mismatch"):
        fetch_letor_zip("toy", 1, root=tmp_path)
    assert list((tmp_path / "toy").iterdir()) == []
    with pytest.raises(ValueError, match="no published checksum"):
        fetch_letor_zip("mslr-web30k", 1, root=tmp_path)


# -- CLI ----------------------------------------------------------------------------------------
def test_cli_info(capsys, tmp_path):
    from rankkit.cli import main

    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "train: 471 queries, 9630 documents, 46 features" in out
    assert main(["info", str(tmp_path / "missing.txt")]) == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_dataset_from_cuda_tensors_stays_on_cuda(small):
    cuda = RankingDataset(small.features.cuda(), small.labels.cuda(), small.offsets.cuda(), small.qids.cuda())
    batch = cuda.padded()
    assert {t.device.type for t in batch} == {"cuda"}
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


def test_reader_refuses_a_huge_index_before_allocating(tmp_path):
    import tracemalloc

    p = write(tmp_path, "huge.txt", GOOD + "0 qid:9 2000000000:1\n")
    tracemalloc.start()
    with pytest.raises(ValueError, match=r"huge\.txt:6: feature index 2000000000 .*MAX_FEATURES"):
        read_svmlight(p)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 50 * 2**20
    # n_features= lifts MAX_FEATURES; the dense size is still bounded by MAX_VALUES
    with pytest.raises(ValueError, match=r"huge\.txt: 6 documents x 2000000001 features .*MAX_VALUES"):
        read_svmlight(p, n_features=2_000_000_001)
