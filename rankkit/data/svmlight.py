"""Read LETOR / SVMlight ranking files into a :class:`RankingDataset`.

Parsing is scikit-learn's ``load_svmlight_file`` (qid, comments, sparse lines, .gz/.bz2).
This module adds what a ranking user needs on top: query grouping (``qid:`` or a LightGBM
``.query`` sidecar), per-line error messages, and a policy for every kind of bad input.

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
=====================================  ======================================================
"""
from __future__ import annotations

import bz2
import gzip
import io
import os

import numpy as np
import torch

from rankkit.data.dataset import RankingDataset

_CHUNK_LINES = 5000


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
        except ValueError:
            pass
        for i, line in enumerate(chunk):
            try:
                _parse(io.BytesIO(line.encode()), n_features=n_features, zero_based=zero_based)
            except ValueError as e:
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


def read_query_file(path: str) -> np.ndarray:
    """Group sizes from a LightGBM ``.query`` file (one positive integer per line)."""
    sizes = []
    with open(path, "rt") as f:
        for i, line in enumerate(f, 1):
            text = line.strip()
            if not text:
                continue
            try:
                n = int(text)
            except ValueError:
                raise ValueError(f"{path}:{i}: expected a group size, got {text!r}") from None
            if n <= 0:
                raise ValueError(f"{path}:{i}: group size must be positive, got {n}")
            sizes.append(n)
    return np.asarray(sizes, dtype=np.int64)


def read_svmlight(path: str | os.PathLike, *, query_file: str | os.PathLike | None = None,
                  n_features: int | None = None, zero_based: bool = False,
                  with_comments: bool = False) -> RankingDataset:
    """Read a LETOR/SVMlight ranking file.

    Args:
        path: text file, optionally ``.gz`` or ``.bz2`` compressed. Lines are
            ``<label> [qid:<q>] <index>:<value> ... [# comment]``.
        query_file: LightGBM-style group sizes, one per line. When None, ``<path>.query``
            is used if it exists; otherwise the ``qid:`` fields group the documents.
        n_features: F, for files that must line up with another (the train set's F);
            defaults to the largest feature index in the file.
        zero_based: whether feature indices start at 0 (SVMlight and LETOR start at 1).
        with_comments: keep the text after ``#`` of each line (e.g. LETOR's docid).
    Returns:
        A :class:`RankingDataset` with features [N, F] float32. See the module docstring for
        the bad-input policy.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    if n_features is not None and n_features < 1:
        raise ValueError(f"`n_features` has to be a positive integer, got {n_features}")
    try:
        X, y, qid = _parse(path, n_features=None, zero_based=zero_based)
    except ValueError as e:
        line_no, line, why = _locate_bad_line(path, zero_based, None)
        if line_no:
            raise ValueError(f"{path}:{line_no}: malformed line ({why}): {line[:120]!r}") from None
        raise ValueError(f"{path}: {e}") from None
    if X.shape[0] == 0:
        raise ValueError(f"{path}: the file holds no documents")
    if n_features is not None:
        if X.shape[1] > n_features:
            raise ValueError(f"{path}: has {X.shape[1]} features, more than the expected "
                             f"n_features={n_features} (train and test files must share features)")
    dense = np.asarray(X.todense(), dtype=np.float64)
    if n_features is not None and dense.shape[1] < n_features:
        dense = np.pad(dense, ((0, 0), (0, n_features - dense.shape[1])))

    line_numbers = None

    def where(row: int) -> str:
        nonlocal line_numbers
        if line_numbers is None:
            line_numbers = _data_line_numbers(path)
        return f"{path}:{line_numbers[row]}" if row < len(line_numbers) else path

    bad = np.flatnonzero(np.isinf(dense).any(axis=1))
    if len(bad):
        raise ValueError(f"{where(bad[0])}: infinite feature value (NaN is accepted as missing; inf is not)")
    bad = np.flatnonzero(~np.isfinite(y) | (y < 0) | (y != np.round(y)))
    if len(bad):
        raise ValueError(f"{where(bad[0])}: label must be a non-negative integer, got {y[bad[0]]!r}")

    if query_file is None and os.path.exists(path + ".query"):
        query_file = path + ".query"
    if query_file is not None:
        sizes = read_query_file(os.fspath(query_file))
        if sizes.sum() != len(y):
            raise ValueError(f"{query_file}: group sizes sum to {int(sizes.sum())}, "
                             f"but {path} holds {len(y)} documents")
        qids = np.arange(len(sizes), dtype=np.int64)
    else:
        if len(qid) == 0 or (qid == 0).all() and not _has_qid_field(path):
            raise ValueError(f"{path}: no 'qid:' fields and no .query file; cannot group documents")
        change = np.flatnonzero(qid[1:] != qid[:-1]) + 1
        starts = np.concatenate([[0], change])
        qids = qid[starts].astype(np.int64)
        uniq, first = np.unique(qids, return_index=True)
        if len(uniq) != len(qids):
            seen = set()
            for s, q in zip(starts, qids):
                if q in seen:
                    raise ValueError(f"{where(s)}: qid {q} appears again after other queries; "
                                     f"each query's lines must be contiguous")
                seen.add(q)
        sizes = np.diff(np.concatenate([starts, [len(qid)]]))
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    comments = _read_comments(path) if with_comments else None
    return RankingDataset(torch.from_numpy(dense.astype(np.float32)), torch.from_numpy(y.astype(np.float32)),
                          torch.from_numpy(offsets), torch.from_numpy(qids), comments, path)


def _has_qid_field(path: str) -> bool:
    with _open_text(path) as f:
        for line in f:
            if "qid:" in line.split("#", 1)[0]:
                return True
            if line.strip():
                return False
    return False
