"""rankkit.data.svmlight on real and small files: counts, query sidecars, grouping, compression, and
the bad-input policy (the file and line of the first bad value)."""
from __future__ import annotations

import bz2
import gzip
from pathlib import Path

import pytest
import torch
from samples import GOOD

from rankkit.data import read_svmlight

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"


needs_shared = pytest.mark.skipif(not SHARED.exists(), reason="../shared/data not present")


def write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


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
