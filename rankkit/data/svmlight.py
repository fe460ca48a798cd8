"""Read LETOR / SVMlight ranking files into a :class:`RankingDataset`.

Parsing is scikit-learn's ``load_svmlight_file`` (qid, comments, sparse lines, .gz/.bz2).
This module adds what a ranking user needs on top: query grouping (``qid:`` or a LightGBM
``.query`` sidecar), displayed positions for click logs (a ``position_file`` sidecar, one 0-based
integer per line), per-line error messages, and a policy for every kind of bad input.

Bad-input policy (each case has a test):

=====================================  ======================================================
input                                  what happens
=====================================  ======================================================
malformed line                         ``ValueError`` naming the file and the 1-based line
empty file (no documents)              ``ValueError`` naming the file
``inf`` feature value                  ``ValueError`` naming the file and line
``nan`` feature value                  kept as a *missing value* (as LightGBM/XGBoost do):
                                       the booster bins it on its own, neural scorers
                                       impute 0 after preprocessing
negative, non-integer or non-finite    ``ValueError`` naming the file and line
label
interleaved qid (a query's lines not   ``ValueError`` naming the line where the qid comes
contiguous)                            back (LightGBM and XGBoost also require contiguity)
no ``qid:`` and no ``.query`` file     ``ValueError``
``.query`` sizes not summing to N      ``ValueError``
query with one document                kept: it contributes no pairs (zero lambdas) and
                                       counts in metrics by the ``empty=`` convention
different feature counts               pass ``n_features=`` (e.g. the train set's); a file
                                       with more features than that raises ``ValueError``,
                                       fewer are zero-padded (sparse format omits zeros)
feature index above ``MAX_FEATURES``   ``ValueError`` naming the line, before any N x F array
(10^6) without ``n_features=``         exists (``n_features=`` lifts the limit)
N x F above ``MAX_VALUES`` (2^32)      ``ValueError`` naming the file (16 GiB as float32)
value beyond float32 (``1e39``)        ``ValueError`` naming the line
label above ``MAX_LABEL`` (2^24)       ``ValueError`` naming the line (not exact in float32)
a line without ``qid:`` when others    ``ValueError`` naming the line
have one
truncated or corrupt ``.gz``/``.bz2``  ``ValueError`` naming the file
unreadable file (a directory, no       ``ValueError`` naming the file; a missing file is
permission)                            ``FileNotFoundError``
qid beyond int64                       ``ValueError`` naming the line (malformed)
=====================================  ======================================================
"""
from __future__ import annotations

import bz2
import gzip
import io
import os
import zlib

import numpy as np
import torch

from rankkit._checks import check_bool, check_int
from rankkit.data.dataset import RankingDataset

_CHUNK_LINES = 5000
#: The largest feature index read without ``n_features=`` (a corrupt ``2000000000:1`` would
#: otherwise allocate N x 2e9 floats).
MAX_FEATURES = 1_000_000
#: The most feature values (N x F) one file may expand to: 2^32 float32 values, 16 GiB.
MAX_VALUES = 2**32
#: The largest label: integers up to 2^24 are exact in float32.
MAX_LABEL = 2**24
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _open_text(path: str):
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    if path.endswith(".bz2"):
        return bz2.open(path, "rt", encoding="utf-8", errors="replace")
    return open(path, "rt", encoding="utf-8", errors="replace")


def _parse(source, *, n_features, zero_based):
    from sklearn.datasets import load_svmlight_file

    return load_svmlight_file(source, n_features=n_features, query_id=True, zero_based=zero_based,
                              dtype=np.float64)


def _locate_bad_line(path: str, zero_based: bool, n_features: int | None) -> tuple[int, str, str]:
    """Find the first line the library rejects: parse chunks, then lines of the bad chunk."""
    with _open_text(path) as f:
        lines = f.readlines()
    for start in range(0, len(lines), _CHUNK_LINES):
        chunk = lines[start:start + _CHUNK_LINES]
        try:
            _parse(io.BytesIO("".join(chunk).encode()), n_features=n_features, zero_based=zero_based)
            continue
        except (ValueError, OverflowError):
            pass
        for i, line in enumerate(chunk):
            try:
                _parse(io.BytesIO(line.encode()), n_features=n_features, zero_based=zero_based)
            except (ValueError, OverflowError) as e:
                return start + i + 1, line.rstrip("\n"), str(e)
    return 0, "", ""


def _data_line_numbers(path: str) -> np.ndarray:
    """1-based file line number of every data line (blank and comment-only lines are skipped)."""
    numbers = []
    with _open_text(path) as f:
        for i, line in enumerate(f, 1):
            body = line.split("#", 1)[0].strip()
            if body:
                numbers.append(i)
    return np.asarray(numbers, dtype=np.int64)


def _read_comments(path: str) -> list[str]:
    out = []
    with _open_text(path) as f:
        for line in f:
            body, sep, comment = line.partition("#")
            if body.strip():
                out.append(comment.strip() if sep else "")
    return out


def _read_integers(path: str, what: str, rule: str, low: int) -> np.ndarray:
    """One integer >= ``low`` per non-blank line of a sidecar file, naming the line of a bad one."""
    values = []
    with open(path, "rt") as f:
        for i, line in enumerate(f, 1):
            text = line.strip()
            if not text:
                continue
            try:
                v = int(text)
            except ValueError:
                raise ValueError(f"{path}:{i}: expected {what}, got {text!r}") from None
            if v < low:
                raise ValueError(f"{path}:{i}: {rule}, got {v}")
            values.append(v)
    return np.asarray(values, dtype=np.int64)


def read_query_file(path: str) -> np.ndarray:
    """Group sizes from a LightGBM ``.query`` file (one positive integer per line)."""
    return _read_integers(path, "a group size", "group size must be positive", 1)


def read_position_file(path: str) -> np.ndarray:
    """Displayed positions from a sidecar file: one non-negative integer (0-based rank) per line,
    one line per document of the data file (LightGBM's ``.position`` file, 0-based)."""
    return _read_integers(path, "a position (a non-negative integer)", "position must be non-negative", 0)


def read_svmlight(path: str | os.PathLike, *, query_file: str | os.PathLike | None = None,
                  n_features: int | None = None, zero_based: bool = False,
                  with_comments: bool = False, position_file: str | os.PathLike | None = None) -> RankingDataset:
    """Read a LETOR/SVMlight ranking file.

    Args:
        path: text file, optionally ``.gz`` or ``.bz2`` compressed. Lines are
            ``<label> [qid:<q>] <index>:<value> ... [# comment]``.
        query_file: LightGBM-style group sizes, one per line. When None, ``<path>.query``
            is used if it exists; otherwise the ``qid:`` fields group the documents.
        n_features: F, for files that must line up with another (the train set's F);
            defaults to the largest feature index in the file, which may then be at most
            ``MAX_FEATURES`` (10^6): a larger index is far more likely a corrupt line than a
            real feature, and would allocate N x index floats. Pass ``n_features=`` to read
            wider files.
        zero_based: whether feature indices start at 0 (SVMlight and LETOR start at 1).
        with_comments: keep the text after ``#`` of each line (e.g. LETOR's docid).
        position_file: a click log's displayed positions, one 0-based integer per line and one
            line per document (:func:`read_position_file`); they become the dataset's
            ``position``, which the unbiased rankers read. Never looked up implicitly.
    Returns:
        A :class:`RankingDataset` with features [N, F] float32. See the module docstring for
        the bad-input policy: every refusal is a ``ValueError`` naming the file (and the line
        where there is one); a missing file is ``FileNotFoundError``.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    check_int(n_features, "n_features", none=True)
    check_bool(zero_based, "zero_based")
    check_bool(with_comments, "with_comments")
    try:
        data = _read(path, query_file, n_features, zero_based, with_comments)
        if position_file is not None:
            position_file = os.fspath(position_file)
            position = read_position_file(position_file)
            if len(position) != data.n_docs:
                raise ValueError(f"{position_file}: {len(position)} positions, "
                                 f"but {path} holds {data.n_docs} documents")
            data.position = torch.from_numpy(position)
        return data
    except (EOFError, OSError, zlib.error) as e:
        if isinstance(e, FileNotFoundError):
            raise
        hint = ("; a .gz or .bz2 file may be truncated or not compressed that way"
                if path.endswith((".gz", ".bz2")) else "")
        raise ValueError(f"{path}: cannot read the file ({type(e).__name__}: {e}){hint}") from None


def _read(path: str, query_file, n_features: int | None, zero_based: bool,
          with_comments: bool) -> RankingDataset:
    try:
        X, y, qid = _parse(path, n_features=None, zero_based=zero_based)
    except (ValueError, OverflowError) as e:
        line_no, line, why = _locate_bad_line(path, zero_based, None)
        if line_no:
            raise ValueError(f"{path}:{line_no}: malformed line ({why}): {line[:120]!r}") from None
        raise ValueError(f"{path}: {e}") from None
    n = X.shape[0]
    if n == 0:
        raise ValueError(f"{path}: the file holds no documents")

    line_numbers = None

    def where(row: int) -> str:
        nonlocal line_numbers
        if line_numbers is None:
            line_numbers = _data_line_numbers(path)
        return f"{path}:{line_numbers[row]}" if row < len(line_numbers) else path

    def row_of(position: int) -> int:  # the row of the position-th stored value of the CSR matrix
        return int(np.searchsorted(X.indptr, position, side="right")) - 1

    # The feature count is settled on the sparse matrix, before anything of size N x F exists.
    if X.nnz:
        widest = int(np.argmax(X.indices))
        index = int(X.indices[widest]) + (0 if zero_based else 1)
        limit = n_features if n_features is not None else MAX_FEATURES
        if X.shape[1] > limit:
            why = (f"more than the expected n_features={n_features} (train and test files must "
                   f"share features)" if n_features is not None else
                   f"more than MAX_FEATURES={MAX_FEATURES}; pass n_features= to read wider files")
            raise ValueError(f"{where(row_of(widest))}: feature index {index} gives {X.shape[1]} features, {why}")
    width = n_features if n_features is not None else X.shape[1]
    if n * width > MAX_VALUES:
        raise ValueError(f"{path}: {n} documents x {width} features would need "
                         f"{n * width * 4 / 2**30:.1f} GiB as float32 (more than MAX_VALUES={MAX_VALUES})")

    values = X.data
    bad = np.flatnonzero(np.isinf(values))
    if len(bad):
        raise ValueError(f"{where(row_of(bad[0]))}: infinite feature value (NaN is accepted as missing; inf is not)")
    bad = np.flatnonzero(np.abs(np.nan_to_num(values)) > _FLOAT32_MAX)
    if len(bad):
        raise ValueError(f"{where(row_of(bad[0]))}: feature value {float(values[bad[0]])!r} overflows float32 "
                         f"(largest {_FLOAT32_MAX:.4g})")
    bad = np.flatnonzero(~np.isfinite(y) | (y < 0) | (y != np.round(y)) | (y > MAX_LABEL))
    if len(bad):
        raise ValueError(f"{where(bad[0])}: label must be a non-negative integer (at most MAX_LABEL = "
                         f"{MAX_LABEL}), got {float(y[bad[0]])!r}")

    if query_file is None and os.path.exists(path + ".query"):
        query_file = path + ".query"
    if query_file is not None:
        query_file = os.fspath(query_file)
        sizes = read_query_file(query_file)
        if sizes.sum() != n:
            raise ValueError(f"{query_file}: group sizes sum to {int(sizes.sum())}, "
                             f"but {path} holds {n} documents")
        qids = np.arange(len(sizes), dtype=np.int64)
    else:
        if len(qid) == 0:
            raise ValueError(f"{path}: no 'qid:' fields and no .query file; cannot group documents")
        if len(qid) != n:  # scikit-learn returns one qid per line that has one
            line_no = _first_line_without_qid(path)
            raise ValueError(f"{path}:{line_no}: no 'qid:' field, but other lines have one; "
                             f"every line needs its query's id")
        change = np.flatnonzero(qid[1:] != qid[:-1]) + 1
        starts = np.concatenate([[0], change])
        qids = qid[starts].astype(np.int64)
        uniq = np.unique(qids)
        if len(uniq) != len(qids):
            seen = set()
            for s, q in zip(starts, qids):
                if q in seen:
                    raise ValueError(f"{where(s)}: qid {q} appears again after other queries; "
                                     f"each query's lines must be contiguous")
                seen.add(q)
        sizes = np.diff(np.concatenate([starts, [n]]))
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    comments = _read_comments(path) if with_comments else None
    dense = np.zeros((n, width), dtype=np.float32)
    rows = np.repeat(np.arange(n), np.diff(X.indptr))
    dense[rows, X.indices] = values
    return RankingDataset(torch.from_numpy(dense), torch.from_numpy(y.astype(np.float32)),
                          torch.from_numpy(offsets), torch.from_numpy(qids), comments, path)


def _first_line_without_qid(path: str) -> int:
    """1-based number of the first data line with no ``qid:`` field (0 when every line has one)."""
    with _open_text(path) as f:
        for i, line in enumerate(f, 1):
            body = line.split("#", 1)[0]
            if body.strip() and "qid:" not in body:
                return i
    return 0
