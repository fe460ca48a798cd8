"""rankkit.data.svmlight fuzzed: whatever bytes come in (generated lines, mutated text, random bytes,
damaged archives), the answer is a valid result or ValueError."""
from __future__ import annotations

import bz2
import gzip
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rankkit.data import RankingDataset, read_svmlight

FUZZ = settings(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow],
                max_examples=80)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


# -- the reader ----------------------------------------------------------------------------------
LABELS = ["0", "1", "2", "4", "-1", "0.5", "nan", "inf", "1e30", "abc", "", "16777217"]


QIDS = ["qid:1", "qid:2", "qid:3", "qid:0", "qid:-4", "qid:x", "qid:", "", "qid:99999999999999999999"]


INDICES = ["1", "2", "3", "7", "0", "-1", "1.5", "a", "", "2000000000"]


VALUES = ["0.5", "0", "-2", "nan", "inf", "-inf", "1e39", "1e400", "x", "", "3e-45"]


line = st.builds(
    lambda label, qid, feats, comment: " ".join(filter(None, [label, qid, *feats])) + comment,
    st.sampled_from(LABELS), st.sampled_from(QIDS),
    st.lists(st.builds(lambda i, v, sep: f"{i}{sep}{v}", st.sampled_from(INDICES), st.sampled_from(VALUES),
                       st.sampled_from([":", ":", ":", "::", " "])), max_size=4),
    st.sampled_from(["", "", " # doc", "#", " # qid:9 1:inf"]))


GOOD = "2 qid:1 1:0.5 2:1.0\n0 qid:1 1:0.1 2:0.2\n1 qid:2 1:0.3 3:0.7\n0 qid:2 2:0.9\n"


def assert_read_or_refused(path: Path) -> None:
    try:
        ds = read_svmlight(path)
    except ValueError:
        return
    assert isinstance(ds, RankingDataset)
    assert ds.n_docs > 0 and ds.features.dtype == torch.float32
    assert not torch.isinf(ds.features).any()
    assert torch.isfinite(ds.labels).all() and (ds.labels >= 0).all()
    assert ds.offsets[-1] == ds.n_docs


@FUZZ
@given(lines=st.lists(line, min_size=0, max_size=6), ending=st.sampled_from(["\n", "\r\n"]))
def test_reader_on_generated_lines(folder, lines, ending):
    path = folder / "lines.txt"
    path.write_text(ending.join(lines))
    assert_read_or_refused(path)


@FUZZ
@given(cut=st.integers(0, len(GOOD)), insert=st.text(max_size=8), drop=st.integers(0, 4))
def test_reader_on_mutated_text(folder, cut, insert, drop):
    path = folder / "mutated.txt"
    path.write_bytes((GOOD[:cut] + insert + GOOD[cut + drop:]).encode("utf-8", "surrogatepass"))
    assert_read_or_refused(path)


@FUZZ
@given(data=st.binary(max_size=300), ext=st.sampled_from([".txt", ".gz", ".bz2"]))
def test_reader_on_random_bytes(folder, data, ext):
    path = folder / f"random{ext}"
    path.write_bytes(data)
    assert_read_or_refused(path)


@FUZZ
@given(cut=st.integers(0, 200), flip=st.integers(0, 400), ext=st.sampled_from([".gz", ".bz2"]))
def test_reader_on_damaged_compressed_files(folder, cut, flip, ext):
    packed = (gzip.compress if ext == ".gz" else bz2.compress)(GOOD.encode())
    data = bytearray(packed[:len(packed) - cut % len(packed)])
    if data:
        data[flip % len(data)] ^= 0x55
    path = folder / f"damaged.txt{ext}"
    path.write_bytes(bytes(data))
    assert_read_or_refused(path)
