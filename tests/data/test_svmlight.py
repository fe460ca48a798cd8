"""The streaming LETOR/SVMlight reader against an independent slow parser.

``reference`` below is a plain, per-line, dictionary-based reader written for this test (not the
module's code): every file the fast reader accepts must give exactly its arrays, on generated
files (sparse and dense lines, comments, blank lines, CRLF, exponents, ``nan``, block boundaries
inside lines) and on the real MQ2008 and Yahoo sample files. The numpy block parser
(``_parse_fast``) is also checked against the module's own per-line parser (``_parse_slow``) on
generated good and bad lines: it must agree or step aside (return None), never accept a line the
per-line parser refuses.
"""
from __future__ import annotations

import gzip
import os
import random
import re
import tracemalloc
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rankkit.data import svmlight
from rankkit.data.svmlight import iter_svmlight, read_svmlight, svmlight_width

CANDIDATES = [Path(__file__).resolve().parents[3] / "shared" / "data", Path("/work/shared/data")]
SHARED = next((p for p in CANDIDATES if p.exists()), None)
needs_shared = pytest.mark.skipif(SHARED is None, reason="../shared/data not present")

NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|[+-]?(inf|infinity|nan)", re.IGNORECASE)


def reference(text: str, sizes: list[int] | None = None):
    """(features [N, F] float32, labels, offsets, qids) by the simplest possible reading."""
    docs = []
    for raw in text.split("\n"):
        body = raw.split("#")[0].split()
        if not body:
            continue
        label, rest = body[0], body[1:]
        assert NUMBER.fullmatch(label)
        qid = None
        if rest and rest[0].startswith("qid:"):
            qid = int(rest[0][4:])
            rest = rest[1:]
        feats = {}
        for tok in rest:
            i, v = tok.split(":")
            assert i.isdigit() and NUMBER.fullmatch(v)
            feats[int(i)] = float(v)
        docs.append((float(label), qid, feats))
    width = max((max(f) for _, _, f in docs if f), default=0)
    x = np.zeros((len(docs), width), dtype=np.float32)
    for r, (_, _, f) in enumerate(docs):
        for i, v in f.items():
            x[r, i - 1] = np.float32(v)
    labels = np.array([d[0] for d in docs], dtype=np.float32)
    if sizes is None:
        qids, sizes = [], []
        for _, q, _ in docs:
            if qids and qids[-1] == q:
                sizes[-1] += 1
            else:
                qids.append(q)
                sizes.append(1)
    else:
        qids = list(range(len(sizes)))
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return x, labels, offsets, np.array(qids, dtype=np.int64)


def assert_same_as_reference(ds, ref) -> None:
    x, labels, offsets, qids = ref
    assert ds.features.shape == x.shape
    np.testing.assert_array_equal(ds.features.numpy(), x)  # NaN == NaN here
    np.testing.assert_array_equal(ds.labels.numpy(), labels)
    np.testing.assert_array_equal(ds.offsets.numpy(), offsets)
    np.testing.assert_array_equal(ds.qids.numpy(), qids)


def value_text(rng: random.Random) -> str:
    kind = rng.random()
    v = rng.lognormvariate(0, 3) * rng.choice([1, -1])
    if kind < 0.5:
        return f"{v:.6f}"
    if kind < 0.6:
        return f"{v:.6e}"
    if kind < 0.7:
        return str(rng.randint(0, 10**6))
    if kind < 0.75:
        return rng.choice(["nan", "NaN", "-0", ".5", "5.", "+1.25", "1E-3", "3e-45"])
    return repr(v)  # up to 17 significant digits: the float64 -> float32 double rounding path


def letor_text(rng: random.Random, n_queries: int, width: int, dense: bool, comments: bool,
               crlf: bool = False, with_qid: bool = True) -> str:
    lines = []
    for q in range(n_queries):
        qid = rng.randint(0, 10**12) * 7 + q  # distinct, large
        for _ in range(min(int(rng.paretovariate(1.2)), 60)):
            idx = list(range(1, width + 1)) if dense else sorted(rng.sample(range(1, width + 1), rng.randint(0, width)))
            parts = [str(rng.randint(0, 4))] + ([f"qid:{qid}"] if with_qid else [])
            parts += [f"{i}:{value_text(rng)}" for i in idx]
            sep = rng.choice([" ", " ", "\t", "  "])
            line = sep.join(parts)
            if comments and rng.random() < 0.5:
                line += f" #docid = GX{rng.randint(0, 999)} inc = 1 # more: 1:2"
            lines.append(line)
        if rng.random() < 0.1:
            lines.append(rng.choice(["", "   ", "# a comment line"]))
    return ("\r\n" if crlf else "\n").join(lines) + rng.choice(["\n", ""])


@pytest.mark.parametrize("seed", range(6))
def test_generated_files_equal_the_reference(tmp_path, seed):
    rng = random.Random(seed)
    text = letor_text(rng, 40, rng.choice([3, 46, 136]), dense=seed % 2 == 0, comments=seed % 3 == 0,
                      crlf=seed == 5)
    p = tmp_path / "f.txt"
    p.write_text(text)
    assert_same_as_reference(read_svmlight(p), reference(text))
    # blocks of a few hundred bytes: lines cut across blocks, many blocks, the same result
    with mock.patch.object(svmlight, "_BLOCK_BYTES", 317):
        assert_same_as_reference(read_svmlight(p), reference(text))


def test_sidecar_grouping_and_gzip_equal_the_reference(tmp_path):
    rng = random.Random(7)
    text = letor_text(rng, 30, 20, dense=False, comments=True, with_qid=False)
    n = len([line for line in text.split("\n") if line.split("#")[0].strip()])
    sizes = []
    while sum(sizes) < n:
        sizes.append(min(rng.randint(1, 9), n - sum(sizes)))
    p = tmp_path / "f.txt.gz"
    with gzip.open(p, "wt") as f:
        f.write(text)
    (tmp_path / "f.txt.gz.query").write_text("\n".join(map(str, sizes)) + "\n")
    assert_same_as_reference(read_svmlight(p), reference(text, sizes))


@needs_shared
@pytest.mark.parametrize("name", ["MQ2008/Fold1/test.txt.gz", "MQ2008/Fold2/vali.txt.gz",
                                  "lightgbm-lambdarank/rank.train", "lightgbm-lambdarank/rank.test"])
def test_real_files_equal_the_reference_and_scikit_learn(name):
    path = SHARED / name
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "rt") as f:
        text = f.read()
    sidecar = Path(str(path) + ".query")
    sizes = [int(v) for v in sidecar.read_text().split()] if sidecar.exists() else None
    ds = read_svmlight(path, with_comments=True)
    assert_same_as_reference(ds, reference(text, sizes))
    from sklearn.datasets import load_svmlight_file

    x, y = load_svmlight_file(str(path), dtype=np.float64)[:2]
    np.testing.assert_array_equal(ds.features.numpy(), x.toarray().astype(np.float32))
    np.testing.assert_array_equal(ds.labels.numpy(), y.astype(np.float32))
    if name.startswith("MQ2008"):
        assert ds.comments[0].startswith("docid = ")


# -- the numpy block parser never accepts what the per-line parser refuses -------------------------
TOKENS = ["0", "1", "2", "-1", "1.5", "nan", "inf", "1e3", "1_0", "0x10", "1e", ".", "+", "-0", "abc",
          "qid:1", "qid:2", "qid:-3", "qid:nan", "qid:1.0", "qid:1e2", "qid:", "qid:+",
          "qid:1234567890123456789", "1:0.5", "2:1e-3", "3:-2", "2:nan", "1:inf", "1:1e39", "1:1_000",
          "1:0x1", "0:1", "01:1", "1e1:1", "+1:1", "1.0:1", "1::1", ":1", "1:", "2:1:1", "999999999:1",
          "1:nan(2)", "4:3e-45", "1:1.2.3", "\x00", "é", "#", "# 1:2", "\t", "\r"]

lines = st.lists(st.lists(st.sampled_from(TOKENS), min_size=0, max_size=6).map(" ".join), min_size=1,
                 max_size=8).map(lambda ls: "\n".join(ls) + "\n")


@settings(deadline=None, derandomize=True, max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(text=lines, zero_based=st.booleans())
def test_fast_parser_agrees_with_the_line_parser(text, zero_based):
    block = text.encode("utf-8")
    why = "too wide"
    try:
        slow = svmlight._parse_slow(block, 1, zero_based, 1000, why, "f.txt", False)
    except ValueError:
        slow = None
    fast = svmlight._parse_fast(block, 1, zero_based, 1000)
    if fast is None:
        return
    assert slow is not None, f"the fast parser accepted what the line parser refuses: {text!r}"
    for name in ("lines", "labels", "qids", "has_qid", "rows", "cols"):
        np.testing.assert_array_equal(getattr(fast, name), getattr(slow, name), err_msg=name)
    np.testing.assert_array_equal(fast.values, slow.values)


def test_fast_parser_takes_ordinary_blocks():
    """The fast path really runs on LETOR text (a test that it steps aside only when it must)."""
    block = b"2 qid:10 1:0.5 2:-1e-3 3:nan # c 1:2\n\n0 qid:10 1:.25 3:4\r\n1\tqid:11 2:7.\n"
    fast = svmlight._parse_fast(block, 5, False, 100)
    assert fast is not None
    assert fast.lines.tolist() == [5, 7, 8] and fast.qids.tolist() == [10, 10, 11]
    assert fast.cols.tolist() == [0, 1, 2, 0, 2, 1]


# -- the reader's once wrong-with-exit-0 cases and allocation limits --------------------------
GOOD = "2 qid:1 1:0.5 2:1.0\n0 qid:1 1:0.1 2:0.2\n1 qid:2 1:0.3 3:0.7\n"


def write(tmp_path: Path, text: str, name: str = "f.txt") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_underscore_in_a_number_is_malformed(tmp_path):
    # Python's float() reads "1_000" as 1000; no LETOR writer produces it
    with pytest.raises(ValueError, match=r"f\.txt:2: malformed line .*'1:1_000'"):
        read_svmlight(write(tmp_path, GOOD.replace("1:0.1", "1:1_000")))
    with pytest.raises(ValueError, match=r"f\.txt:3: malformed line"):
        read_svmlight(write(tmp_path, GOOD.replace("1 qid:2", "1_0 qid:2")))


@pytest.mark.parametrize("qid", ["nan", "NaN", "inf", "1.5", "1e3", ""])
def test_qid_that_is_not_an_integer_is_malformed(tmp_path, qid):
    with pytest.raises(ValueError, match=r"f\.txt:2: malformed line \(qid .* is not an integer"):
        read_svmlight(write(tmp_path, GOOD.replace("0 qid:1", f"0 qid:{qid}")))


def test_stale_query_sidecar_is_an_error(tmp_path):
    p = write(tmp_path, GOOD)
    (tmp_path / "f.txt.query").write_text("1\n2\n")  # sums to 3, but the qids say 2 + 1
    with pytest.raises(ValueError, match=r"f\.txt\.query: group sizes disagree with the qid: fields .*stale.*"
                                         r"group 1 has 1 documents there, but qid 1 from line 1 has 2"):
        read_svmlight(p)
    (tmp_path / "sizes").write_text("2\n1\n")  # an explicit sidecar that agrees is fine
    ds = read_svmlight(p, query_file=tmp_path / "sizes")
    assert ds.qids.tolist() == [1, 2] and ds.sizes.tolist() == [2, 1]
    (tmp_path / "f.txt.query").write_text("3\n")
    with pytest.raises(ValueError, match=r"group 1 has 3 documents there, but qid 1 from line 1 has 2"):
        read_svmlight(p)


def test_huge_feature_index_refused_before_allocating(tmp_path):
    p = write(tmp_path, GOOD + "0 qid:9 1:1 999999999:1\n")
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"f\.txt:4: feature index 999999999 gives 999999999 features, "
                                             r"more than MAX_FEATURES=1000000; pass n_features="):
            read_svmlight(p)
        with pytest.raises(ValueError, match=r"f\.txt: 4 documents x 2000000000 features would need .*MAX_VALUES"):
            read_svmlight(p, n_features=2_000_000_000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20


def test_overlong_line_is_refused(tmp_path):
    p = write(tmp_path, GOOD + "1 qid:3" + " 1:1" * 400 + "\n")
    with mock.patch.object(svmlight, "MAX_LINE_BYTES", 1000), mock.patch.object(svmlight, "_BLOCK_BYTES", 64):
        with pytest.raises(ValueError, match=r"f\.txt:4: line longer than MAX_LINE_BYTES"):
            read_svmlight(p)


# -- streaming ---------------------------------------------------------------------------------------
def test_iter_svmlight_chunks_rebuild_the_file(tmp_path):
    rng = random.Random(3)
    text = letor_text(rng, 50, 12, dense=False, comments=True)
    p = write(tmp_path, text)
    whole = read_svmlight(p, n_features=15)
    with mock.patch.object(svmlight, "_BLOCK_BYTES", 500):
        chunks = list(iter_svmlight(p, n_features=15))
    assert len(chunks) > 3
    np.testing.assert_array_equal(torch.cat([c.features for c in chunks]).numpy(), whole.features.numpy())
    assert torch.equal(torch.cat([c.labels for c in chunks]), whole.labels)
    doc_q = torch.repeat_interleave(whole.qids, whole.sizes)
    doc_i = torch.arange(whole.n_docs) - torch.repeat_interleave(whole.offsets[:-1], whole.sizes)
    assert torch.equal(torch.cat([c.qids for c in chunks]), doc_q)
    assert torch.equal(torch.cat([c.docs for c in chunks]), doc_i)
    assert svmlight_width(p) == reference(text)[0].shape[1]


def test_iter_svmlight_checks_the_whole_file_at_the_end(tmp_path):
    p = write(tmp_path, GOOD + "1 qid:1 1:1\n")
    it = iter_svmlight(p, n_features=3)
    next(it)  # the only block
    with pytest.raises(ValueError, match=r"f\.txt:4: qid 1 appears again"):
        next(it)


def test_reading_memory_stays_near_the_arrays(tmp_path):
    """Peak traced memory while reading is the returned arrays plus a bounded block buffer."""
    rng = np.random.default_rng(0)
    n, f = 6000, 46
    values = rng.random((n, f)).round(6)
    p = tmp_path / "big.txt"
    with open(p, "w") as out:
        for r in range(n):
            out.write(f"{r % 3} qid:{r // 50} " + " ".join(f"{j + 1}:{values[r, j]}" for j in range(f)) + "\n")
    tracemalloc.start()
    with mock.patch.object(svmlight, "_BLOCK_BYTES", 1 << 16):
        ds = read_svmlight(p)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    arrays = ds.features.numel() * 4 + ds.labels.numel() * 4
    assert ds.n_docs == n and ds.n_features == f
    np.testing.assert_array_equal(ds.features.numpy(), values.astype(np.float32))
    assert peak < 2 * arrays + 4 * 2**20, (peak, arrays)
    os.unlink(p)


# -- predict streams ---------------------------------------------------------------------------------
def score_sum(x: torch.Tensor) -> torch.Tensor:
    return torch.nan_to_num(x).sum(1)


def test_predict_file_streams_the_same_scores(tmp_path):
    from rankkit.serving import predict_file

    rng = random.Random(11)
    text = letor_text(rng, 60, 9, dense=False, comments=True)
    p = write(tmp_path, text)
    whole = read_svmlight(p)
    scores = score_sum(whole.features)
    qid = torch.repeat_interleave(whole.qids, whole.sizes).tolist()
    doc = (torch.arange(whole.n_docs) - torch.repeat_interleave(whole.offsets[:-1], whole.sizes)).tolist()
    expected = "".join(f"{q}\t{d}\t{s:.9g}\n" for q, d, s in zip(qid, doc, scores.tolist()))
    assert predict_file(score_sum, p, tmp_path / "a.tsv") == whole.n_docs
    with mock.patch.object(svmlight, "_BLOCK_BYTES", 200):
        predict_file(score_sum, p, tmp_path / "b.tsv")
    assert (tmp_path / "a.tsv").read_text() == expected == (tmp_path / "b.tsv").read_text()


def test_predict_file_writes_nothing_when_the_file_fails_at_the_end(tmp_path):
    from rankkit.serving import predict_file

    p = write(tmp_path, "".join(f"1 qid:{r // 3} 1:{r}\n" for r in range(600)) + "1 qid:1 1:1\n")
    out = tmp_path / "scores.tsv"
    out.write_text("old")
    with mock.patch.object(svmlight, "_BLOCK_BYTES", 300):
        with pytest.raises(ValueError, match=r"f\.txt:601: qid 1 appears again"):
            predict_file(score_sum, p, out)
    assert out.read_text() == "old" and sorted(os.listdir(tmp_path)) == ["f.txt", "scores.tsv"]


def test_predict_file_memory_does_not_grow_with_the_file(tmp_path):
    from rankkit.serving import predict_file

    line = "1 qid:{} " + " ".join(f"{j}:0.{j}5" for j in range(1, 47)) + "\n"
    peaks = []
    for n in (2000, 16000):
        p = tmp_path / f"f{n}.txt"
        p.write_text("".join(line.format(r // 20) for r in range(n)))
        with mock.patch.object(svmlight, "_BLOCK_BYTES", 1 << 16):
            tracemalloc.start()
            predict_file(score_sum, p, tmp_path / "out.tsv")
            peaks.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
    assert peaks[1] < peaks[0] + 2**19 and peaks[1] < 16000 * 46 * 4, peaks  # below the file's arrays


def test_large_dataset_inf_check_runs_in_blocks_and_still_names_the_position():
    from rankkit.data import RankingDataset

    x = torch.zeros(100_000, 46)  # above the size where the check goes block by block
    RankingDataset(x, torch.zeros(100_000), [0, 100_000], [1])
    x[77_777, 5] = float("-inf")
    with pytest.raises(ValueError, match=r"`features` has to be finite or NaN \(missing\), got -inf at \[77777, 5\]"):
        RankingDataset(x, torch.zeros(100_000), [0, 100_000], [1])


def test_streamed_chunks_are_bounded_by_the_model_width(tmp_path, monkeypatch):
    """A model declaring a million features made every streamed block [lines, 10^6] (70 GiB for a
    LambdaMART checkpoint of 6 KB): chunks now hold at most _STREAM_VALUES dense values, and the
    rows, labels, qids and positions are those of one unchunked pass."""
    from rankkit.data import svmlight

    lines = [f"{i % 3} qid:{i // 7} {1 + i % 5}:{i / 10} {6 + i % 3}:1.5" for i in range(50)]
    path = tmp_path / "d.txt"
    path.write_text("\n".join(lines) + "\n")
    whole = list(svmlight.iter_svmlight(path, n_features=9))
    monkeypatch.setattr(svmlight, "_STREAM_VALUES", 9 * 4)  # 4 rows per chunk
    small = list(svmlight.iter_svmlight(path, n_features=9))
    assert max(len(c.features) for c in small) == 4 and len(small) >= 13
    for name in ("features", "labels", "qids", "docs"):
        a = torch.cat([getattr(c, name) for c in whole])
        b = torch.cat([getattr(c, name) for c in small])
        assert torch.equal(a, b), name
    assert torch.equal(torch.cat([c.features for c in small]), read_svmlight(path, n_features=9).features)


def test_a_small_compressed_file_cannot_ask_for_a_huge_dense_array(tmp_path, monkeypatch):
    """Trust round 4: a 0.6 MB .gz of repeated short lines asked for about 17 GB within the
    documented limits (MAX_VALUES, DENSE_PER_STORED). A compressed file may ask for at most
    DENSE_PER_FILE_BYTE times its size (at least 1 GiB, lowered here to 1 MiB to keep the test
    small); the same text uncompressed is read, and a dense gzip well within the bound too."""
    monkeypatch.setattr(svmlight, "_DENSE_FILE_FLOOR", 2**20)
    text = "".join(f"0 qid:{1 + i // 10} 200:1\n" for i in range(20_000)).encode()  # 20k x 200 cells, 16 MB dense
    bomb = tmp_path / "bomb.txt.gz"
    bomb.write_bytes(gzip.compress(text, 9))
    assert bomb.stat().st_size * svmlight.DENSE_PER_FILE_BYTE < 20_000 * 200 * 4
    with pytest.raises(ValueError, match=r"bomb\.txt\.gz: .* documents x 200 features would need .* GiB as float32 "
                                         r"from a file of .* MiB, more than 64 times its size"):
        read_svmlight(str(bomb))
    with pytest.raises(ValueError, match="more than 64 times its size"):
        read_svmlight(str(bomb), n_features=200)  # n_features= does not lift it
    plain = tmp_path / "plain.txt"
    plain.write_bytes(text)
    assert read_svmlight(str(plain)).features.shape == (20_000, 200)
    dense = tmp_path / "dense.txt.gz"
    rows = [f"{i % 3} qid:{1 + i // 10} " + " ".join(f"{j}:{(i * j) % 97 / 97:.4f}" for j in range(1, 47))
            for i in range(3000)]
    dense.write_bytes(gzip.compress(("\n".join(rows) + "\n").encode()))
    assert read_svmlight(str(dense)).features.shape == (3000, 46)
