"""Read LETOR / SVMlight ranking files into a :class:`RankingDataset`.

The reader streams: the file (plain, ``.gz`` or ``.bz2``) is read in blocks of whole lines, each
block is parsed by numpy on its bytes (tokens found by byte class, numbers by ``np.fromstring``)
and written straight into the final float32 array, so time and memory grow linearly with the
file (no Python object per line, no list of per-block arrays). A block the vectorised parser
does not accept in full is parsed again line by line by a plain Python parser
(:func:`_parse_line`), which is the definition of the format and names the first bad line.
:func:`iter_svmlight` gives the same parse block by block, for scoring files larger than memory.

Lines are ``<label> [qid:<q>] <index>:<value> ... [# comment]``; documents are grouped by their
``qid:`` fields or by a LightGBM ``.query`` sidecar (group sizes, one per line); a
``position_file`` sidecar gives a click log's displayed positions (one 0-based integer per line).

Bad-input policy (each case has a test):

=====================================  ======================================================
input                                  what happens
=====================================  ======================================================
malformed line (a number Python would  ``ValueError`` naming the file and the 1-based line
not write: ``1_000``, ``0x10``, ``1e``;
an index that is not a plain integer;
indices not increasing; ``qid:`` not
an integer, e.g. ``qid:nan``)
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
``.query`` sizes that disagree with    ``ValueError`` naming the sidecar, the first group that
the file's own ``qid:`` fields         differs and its line (a stale sidecar never wins)
query with one document                kept: it contributes no pairs (zero lambdas) and
                                       counts in metrics by the ``empty=`` convention
different feature counts               pass ``n_features=`` (e.g. the train set's); a file
                                       with more features than that raises ``ValueError``,
                                       fewer are zero-padded (sparse format omits zeros)
feature index above ``MAX_FEATURES``   ``ValueError`` naming the line, before any N x F array
(10^6) without ``n_features=``         exists (``n_features=`` lifts the limit)
N x F above ``MAX_VALUES`` (2^32)      ``ValueError`` naming the file (16 GiB as float32)
N x F x 4 bytes above 64 times a       ``ValueError`` naming the file (at least 1 GiB is
.gz/.bz2 file's size on disk           allowed; ``DENSE_PER_FILE_BYTE``): a decompression bomb
value beyond float32 (``1e39``)        ``ValueError`` naming the line
label above ``MAX_LABEL`` (2^24)       ``ValueError`` naming the line (not exact in float32)
a line without ``qid:`` when others    ``ValueError`` naming the line
have one
a line longer than ``MAX_LINE_BYTES``  ``ValueError`` naming the line
truncated or corrupt ``.gz``/``.bz2``  ``ValueError`` naming the file
unreadable file (a directory, no       ``ValueError`` naming the file; a missing file is
permission)                            ``FileNotFoundError``
qid beyond int64                       ``ValueError`` naming the line (malformed)
=====================================  ======================================================
"""
from __future__ import annotations

import bz2
import gzip
import os
import stat
import re
import zlib
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from rankkit.infra.checks import check_bool, check_int
from rankkit.data.dataset import RankingDataset

#: The largest feature index read without ``n_features=`` (a corrupt ``2000000000:1`` would
#: otherwise allocate N x 2e9 floats).
MAX_FEATURES = 1_000_000
#: The most feature values (N x F) one file may expand to: 2^32 float32 values, 16 GiB.
MAX_VALUES = 2**32
#: The largest label: integers up to 2^24 are exact in float32.
MAX_LABEL = 2**24
#: The longest line (bytes): a million features at 256 bytes each.
MAX_LINE_BYTES = 2**28
_FLOAT32_MAX = float(np.finfo(np.float32).max)
#: Bytes read per block; a block is cut after its last newline.
_BLOCK_BYTES = 1 << 20
_INT64_MAX = 2**63 - 1


# -- the format, one line at a time (the definition; the fast path must agree with it) -------------
_FLOAT = re.compile(rb"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf|infinity|nan)",
                    re.IGNORECASE)
_INDEX = re.compile(rb"[0-9]+")
_QID = re.compile(rb"[+-]?[0-9]+")


class _LineError(ValueError):
    """A bad line; ``malformed`` when it does not follow the grammar at all."""

    def __init__(self, why: str, malformed: bool = True):
        super().__init__(why)
        self.malformed = malformed


def _parse_line(tokens: list[bytes], zero_based: bool, width_limit: int, limit_why: str):
    """``(label, qid or None, [index], [value])`` of one data line's whitespace-split tokens
    (comment removed); raises :class:`_LineError`. ``width_limit``: the most features allowed."""
    label_text = tokens[0]
    if not _FLOAT.fullmatch(label_text):
        raise _LineError(f"label {label_text.decode('utf-8', 'replace')!r} is not a number")
    rest = tokens[1:]
    qid = None
    if rest and rest[0].startswith(b"qid:"):
        text = rest[0][4:]
        if not _QID.fullmatch(text) or abs(int(text)) > _INT64_MAX:
            raise _LineError(f"qid {text.decode('utf-8', 'replace')!r} is not an integer in the int64 range")
        qid = int(text)
        rest = rest[1:]
    indices, values = [], []
    low = 0 if zero_based else 1
    for token in rest:
        index_text, sep, value_text = token.partition(b":")
        if not sep or not _INDEX.fullmatch(index_text) or not _FLOAT.fullmatch(value_text):
            raise _LineError(f"{token.decode('utf-8', 'replace')!r} is not <index>:<value>")
        index = int(index_text)
        if index < low:
            raise _LineError(f"feature index {index} (indices start at {low})")
        if indices and index <= indices[-1]:
            raise _LineError(f"feature index {index} after {indices[-1]} (indices must increase)")
        indices.append(index)
        values.append(float(value_text))
    for index in indices:
        width = index + 1 - low
        if width > width_limit:
            raise _LineError(f"feature index {index} gives {width} features, {limit_why}", malformed=False)
    for v in values:
        if v in (np.inf, -np.inf):
            raise _LineError("infinite feature value (NaN is accepted as missing; inf is not)", malformed=False)
    for v in values:
        if abs(v) > _FLOAT32_MAX:
            raise _LineError(f"feature value {v!r} overflows float32 (largest {_FLOAT32_MAX:.4g})", malformed=False)
    label = float(label_text)
    if not (0 <= label <= MAX_LABEL and label == int(label)):  # NaN and inf fail the range test
        raise _LineError(f"label must be a non-negative integer (at most MAX_LABEL = {MAX_LABEL}), "
                         f"got {label!r}", malformed=False)
    return label, qid, indices, values


@dataclass
class _Block:
    """The data lines of one block of whole lines."""
    lines: np.ndarray    # [n] int64, 1-based line number in the file
    labels: np.ndarray   # [n] float64
    qids: np.ndarray     # [n] int64 (0 where the line has none)
    has_qid: np.ndarray  # [n] bool
    rows: np.ndarray     # [nnz] int64, row within the block
    cols: np.ndarray     # [nnz] int64, 0-based column
    values: np.ndarray   # [nnz] float64
    comments: list[str] | None

    @property
    def n(self) -> int:
        return len(self.lines)

    def width(self) -> int:
        return int(self.cols.max()) + 1 if len(self.cols) else 0


def _comments(block: bytes, line_index: np.ndarray) -> list[str]:
    lines = block.split(b"\n")
    out = []
    for i in line_index.tolist():
        _, sep, comment = lines[i].partition(b"#")
        out.append(comment.decode("utf-8", "replace").strip() if sep else "")
    return out


def _parse_slow(block: bytes, first_line: int, zero_based: bool, width_limit: int, limit_why: str,
                path: str, with_comments: bool) -> _Block:
    """Parse a block line by line with :func:`_parse_line`; the first bad line raises."""
    lines, labels, qids, has_qid, rows, cols, values, line_index = [], [], [], [], [], [], [], []
    low = 0 if zero_based else 1
    for i, line in enumerate(block.split(b"\n")[:-1]):
        tokens = line.split(b"#", 1)[0].split()
        if not tokens:
            continue
        try:
            label, qid, indices, vals = _parse_line(tokens, zero_based, width_limit, limit_why)
        except _LineError as e:
            where = f"{path}:{first_line + i}"
            if e.malformed:
                text = line.decode("utf-8", "replace").rstrip("\r")
                raise ValueError(f"{where}: malformed line ({e}): {text[:120]!r}") from None
            raise ValueError(f"{where}: {e}") from None
        row = len(lines)
        lines.append(first_line + i)
        line_index.append(i)
        labels.append(label)
        qids.append(0 if qid is None else qid)
        has_qid.append(qid is not None)
        rows.extend([row] * len(indices))
        cols.extend(index - low for index in indices)
        values.extend(vals)
    return _Block(np.asarray(lines, dtype=np.int64), np.asarray(labels, dtype=np.float64),
                  np.asarray(qids, dtype=np.int64), np.asarray(has_qid, dtype=bool),
                  np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64),
                  np.asarray(values, dtype=np.float64),
                  _comments(block, np.asarray(line_index, dtype=np.int64)) if with_comments else None)


# -- the fast path: numpy on the block's bytes -----------------------------------------------------
_COMMENT = re.compile(rb"#[^\n]*")
_PAD = 4          # spaces after the block, so that a token's first four bytes can always be read
_MAX_DIGITS = 15  # an index or qid of more digits (not exact in float64) goes the slow way


def _digits_only(work: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> bool:
    """Whether every region ``work[lo:hi]`` is 1 to 15 ASCII digits (checked column by column
    from the right: indices are short, so this is a few 1-D gathers)."""
    width = hi - lo
    if len(width) == 0:
        return True
    if width.min() < 1 or width.max() > _MAX_DIGITS:
        return False
    for k in range(1, int(width.max()) + 1):
        at = hi[width >= k] - k
        if ((work[at] - np.uint8(48)) > 9).any():  # a byte below '0' wraps above 9
            return False
    return True


def _parse_fast(block: bytes, first_line: int, zero_based: bool, width_limit: int) -> _Block | None:
    """The block parsed by numpy, or None when any line needs a closer look (then
    :func:`_parse_slow` decides: it parses the block or names the bad line).

    Comments are cut (``re.sub``), then tokens are the runs of bytes above the space. A line's
    first token is its label, a second token starting ``qid:`` its query id, every other token
    ``<index>:<value>``; each feature and qid token must hold exactly one colon, indices and
    qids only digits (:func:`_digits_only`). With the colons and ``qid`` prefixes blanked, one
    ``np.fromstring`` call reads every number. The float grammar is enforced by counting: a
    token that is not exactly one number stops ``np.fromstring`` (``1e``, ``1.2.3``,
    ``1_000``, ``0x10``, ``infinf``, ``1-2``); ``nan(...)`` (which it accepts and Python does
    not), control characters and non-ASCII bytes go the slow way.
    """
    text = _COMMENT.sub(b"", block) if b"#" in block else block
    work = np.empty(len(text) + _PAD, dtype=np.uint8)
    work[:len(text)] = np.frombuffer(text, dtype=np.uint8)
    work[len(text):] = 32
    controls = np.count_nonzero(work < 32)
    if np.count_nonzero(work > 126) or np.count_nonzero(work == 40) or (controls and controls != (
            np.count_nonzero(work == 10) + np.count_nonzero(work == 9) + np.count_nonzero(work == 13))):
        return None
    step = np.diff((work > 32).view(np.int8), prepend=np.int8(0))
    starts = np.flatnonzero(step == 1)
    ends = np.flatnonzero(step == -1)
    if len(starts) == 0:
        return _empty_block()
    newlines = np.flatnonzero(work == 10)
    line = np.searchsorted(newlines, starts)
    is_label = np.empty(len(starts), dtype=bool)
    is_label[0] = True
    np.not_equal(line[1:], line[:-1], out=is_label[1:])
    second = np.flatnonzero(is_label[:-1] & ~is_label[1:]) + 1
    s = starts[second]
    qid_token = second[(ends[second] - s > 4) & (work[s] == 113) & (work[s + 1] == 105) & (work[s + 2] == 100)
                       & (work[s + 3] == 58)]
    is_qid = np.zeros(len(starts), dtype=bool)
    is_qid[qid_token] = True
    is_feature = ~(is_label | is_qid)
    colons = np.flatnonzero(work == 58)
    with_colon = np.flatnonzero(~is_label)  # each feature and qid token holds exactly one colon
    if len(colons) != len(with_colon) or not np.array_equal(
            np.searchsorted(starts, colons, side="right") - 1, with_colon):
        return None
    feature_colons = colons[is_feature[with_colon]]
    if not _digits_only(work, starts[is_feature], feature_colons):
        return None
    q, qe = starts[qid_token] + 4, ends[qid_token]
    signed = (work[q] == 43) | (work[q] == 45)
    if not _digits_only(work, q + signed, qe):
        return None
    work[colons] = 32
    for k in range(3):
        work[starts[qid_token] + k] = 32
    try:
        numbers = np.fromstring(work.tobytes(), dtype=np.float64, sep=" ")
    except ValueError:
        return None
    count = is_feature.astype(np.int64) + 1
    if len(numbers) != int(count.sum()):
        return None
    first = np.cumsum(count) - count
    labels = numbers[first[is_label]]
    index = numbers[first[is_feature]].astype(np.int64)
    values = numbers[first[is_feature] + 1]
    row = np.cumsum(is_label) - 1
    rows = row[is_feature]
    n = len(labels)
    qids = np.zeros(n, dtype=np.int64)
    has_qid = np.zeros(n, dtype=bool)
    qids[row[qid_token]] = numbers[first[qid_token]].astype(np.int64)
    has_qid[row[qid_token]] = True
    base = 0 if zero_based else 1
    if len(index) and ((index < base).any() or index.max() + 1 - base > width_limit
                       or not ((index[1:] > index[:-1]) | (rows[1:] != rows[:-1])).all()):
        return None
    if np.isinf(values).any() or (np.abs(np.nan_to_num(values)) > _FLOAT32_MAX).any():
        return None
    if not ((labels >= 0) & (labels == np.round(labels)) & (labels <= MAX_LABEL)).all():
        return None
    return _Block(first_line + line[is_label], labels, qids, has_qid, rows, index - base, values, None)


def _empty_block() -> _Block:
    empty = np.zeros(0, dtype=np.int64)
    return _Block(empty, np.zeros(0), empty, np.zeros(0, dtype=bool), empty, empty, np.zeros(0), [])


# -- reading the file block by block ----------------------------------------------------------------
def _open_binary(path: str):
    if path.endswith(".gz"):
        return gzip.open(path, "rb")
    if path.endswith(".bz2"):
        return bz2.open(path, "rb")
    return open(path, "rb")


def _raw_blocks(path: str) -> Iterator[tuple[int, bytes]]:
    """``(first line number, bytes)`` of blocks of whole lines, each ending with a newline. A
    line's unfinished pieces are kept in a list (joined once), so that a line without a newline
    (``/dev/zero``) costs linear time until it passes :data:`MAX_LINE_BYTES`."""
    with _open_binary(path) as f:
        first_line, pieces, pending = 1, [], 0
        while True:
            chunk = f.read(_BLOCK_BYTES)
            if not chunk:
                if pieces:
                    yield first_line, b"".join(pieces) + b"\n"
                return
            cut = chunk.rfind(b"\n") + 1
            if cut == 0:
                pending += len(chunk)
                if pending > MAX_LINE_BYTES:
                    raise ValueError(f"{path}:{first_line}: line longer than MAX_LINE_BYTES = {MAX_LINE_BYTES}")
                pieces.append(chunk)
                continue
            block = b"".join([*pieces, chunk[:cut]]) if pieces else chunk[:cut]
            yield first_line, block
            first_line += block.count(b"\n")
            pieces = [chunk[cut:]] if cut < len(chunk) else []
            pending = len(chunk) - cut


class _Scan:
    """One pass over a file: validated blocks, and the file's grouping checked across blocks.

    ``blocks()`` yields each :class:`_Block` after the per-line checks, with ``start`` (its first
    row in the file), ``group`` ([n] the query of each row: the position of its qid run, or of
    its sidecar group) and ``doc`` ([n] the row's position within its query). After the last
    block, :meth:`finish` checks what needs the whole file and returns ``(sizes, qids)``.
    """

    def __init__(self, path: str, *, n_features: int | None, zero_based: bool, with_comments: bool,
                 query_file: str | None):
        self.path = path
        self.zero_based = zero_based
        self.with_comments = with_comments
        self.width_limit = n_features if n_features is not None else MAX_FEATURES
        self.limit_why = (f"more than the expected n_features={n_features} (train and test files must "
                          f"share features)" if n_features is not None else
                          f"more than MAX_FEATURES={MAX_FEATURES}; pass n_features= to read wider files")
        self.query_file = query_file
        self.sidecar = read_query_file(query_file) if query_file is not None else None
        self.sidecar_ends = np.cumsum(self.sidecar) if self.sidecar is not None else None
        self.n = 0
        self.width = 0
        self.any_qid = False
        self.first_without_qid = 0
        self.runs = _Grow(np.int64, 3)  # (qid, first row, line) of each run of equal qids

    def blocks(self) -> Iterator[_Block]:
        for first_line, raw in _raw_blocks(self.path):
            block = _parse_fast(raw, first_line, self.zero_based, self.width_limit)
            if block is None:
                block = _parse_slow(raw, first_line, self.zero_based, self.width_limit, self.limit_why,
                                    self.path, self.with_comments)
            elif self.with_comments:
                block.comments = _comments(raw, block.lines - first_line)
            if block.n == 0:
                continue
            self._group(block)
            self.width = max(self.width, block.width())
            self.n += block.n
            yield block

    def _group(self, block: _Block) -> None:
        if not block.has_qid.all() and not self.first_without_qid:
            self.first_without_qid = int(block.lines[np.argmin(block.has_qid)])
        self.any_qid = self.any_qid or bool(block.has_qid.any())
        if self.any_qid and self.first_without_qid:
            raise ValueError(f"{self.path}:{self.first_without_qid}: no 'qid:' field, but other lines have "
                             f"one; every line needs its query's id")
        rows = self.n + np.arange(block.n)
        if self.any_qid:
            q = block.qids
            new = np.ones(block.n, dtype=bool)
            new[1:] = q[1:] != q[:-1]
            if len(self.runs) and self.runs.last()[0] == q[0]:
                new[0] = False
            self.runs.extend(np.stack([q[new], rows[new], block.lines[new]], axis=1))
            run_start = self.runs.column(1)
            block.group = np.searchsorted(run_start, rows, side="right") - 1
            block.doc = rows - run_start[block.group]
        elif self.sidecar is not None:
            block.group = np.minimum(np.searchsorted(self.sidecar_ends, rows, side="right"), len(self.sidecar) - 1)
            block.doc = rows - (self.sidecar_ends[block.group] - self.sidecar[block.group])
        else:
            raise ValueError(f"{self.path}: no 'qid:' fields and no .query file; cannot group documents")
        block.start = self.n

    def finish(self) -> tuple[np.ndarray, np.ndarray]:
        """``(sizes, qids)`` of the file's queries, after the checks that need the whole file."""
        if self.n == 0:
            raise ValueError(f"{self.path}: the file holds no documents")
        if self.any_qid:
            runs = self.runs.array()
            qids = runs[:, 0]
            _, first = np.unique(qids, return_index=True)
            if len(first) != len(qids):
                again = np.ones(len(qids), dtype=bool)
                again[first] = False
                r = int(np.argmax(again))
                raise ValueError(f"{self.path}:{runs[r, 2]}: qid {qids[r]} appears again after other queries; "
                                 f"each query's lines must be contiguous")
            sizes = np.diff(np.append(runs[:, 1], self.n))
        if self.sidecar is not None:
            total = int(self.sidecar.sum())
            if total != self.n:
                raise ValueError(f"{self.query_file}: group sizes sum to {total}, but {self.path} holds "
                                 f"{self.n} documents")
            if self.any_qid and not np.array_equal(self.sidecar, sizes):
                m = min(len(sizes), len(self.sidecar))
                g = int(np.argmax(self.sidecar[:m] != sizes[:m])) if (self.sidecar[:m] != sizes[:m]).any() else m
                g = min(g, len(sizes) - 1)
                raise ValueError(f"{self.query_file}: group sizes disagree with the qid: fields of {self.path} "
                                 f"(a stale .query file?): group {g + 1} has "
                                 f"{self.sidecar[g] if g < len(self.sidecar) else 0} documents there, but qid "
                                 f"{runs[g, 0]} from line {runs[g, 2]} has {sizes[g]}; remove the sidecar or "
                                 f"fix it")
            if not self.any_qid:
                return self.sidecar, np.arange(len(self.sidecar), dtype=np.int64)
        return sizes, qids


class _Grow:
    """A growable [n, k] array (amortised doubling, one array, no list of pieces)."""

    def __init__(self, dtype, k: int):
        self.data = np.zeros((16, k), dtype=dtype)
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def extend(self, rows: np.ndarray) -> None:
        need = self.size + len(rows)
        if need > len(self.data):
            self.data.resize((max(need, 2 * len(self.data)), self.data.shape[1]), refcheck=False)
        self.data[self.size:need] = rows
        self.size = need

    def last(self) -> np.ndarray:
        return self.data[self.size - 1]

    def column(self, j: int) -> np.ndarray:
        return self.data[:self.size, j]

    def array(self) -> np.ndarray:
        return self.data[:self.size]


def _check_path(path) -> str:
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    return path


def _sidecar(path: str, query_file) -> str | None:
    if query_file is not None:
        return os.fspath(query_file)
    return path + ".query" if os.path.exists(path + ".query") else None


def _read_errors(path: str):
    """A context turning I/O and decompression failures into a ``ValueError`` naming the file."""
    class _Errors:
        def __enter__(self):
            return self

        def __exit__(self, kind, e, tb):
            if e is None or isinstance(e, FileNotFoundError) or not isinstance(e, (EOFError, OSError, zlib.error)):
                return False
            hint = ("; a .gz or .bz2 file may be truncated or not compressed that way"
                    if path.endswith((".gz", ".bz2")) else "")
            raise ValueError(f"{path}: cannot read the file ({type(e).__name__}: {e}){hint}") from None
    return _Errors()


def _count_lines(path: str) -> int | None:
    """Lines of a plain (uncompressed) regular file, counted in reads of one block; None for
    .gz/.bz2 and for anything that is not a regular file (a pipe, /dev/stdin, a character
    device): counting would consume a pipe before the parse reads it, and never end on
    /dev/zero. Those grow their arrays as they are read."""
    if path.endswith((".gz", ".bz2")):
        return None
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
    except OSError:
        return None
    lines = 1
    with open(path, "rb") as f:
        while chunk := f.read(_BLOCK_BYTES):
            lines += chunk.count(b"\n")
    return lines


def _capacity(wanted: int, needed: int, width: int) -> int:
    """Rows to allocate: ``wanted`` (at least 1 MiB of rows), never beyond ``MAX_VALUES`` values,
    never fewer than ``needed``."""
    width = max(width, 1)
    return max(needed, min(max(wanted, 2**18 // width), MAX_VALUES // width))


#: Without ``n_features=``, the dense array may hold at most this many times the values the file
#: stores (and always 2^26 values, 256 MiB): a file of a few lines with one feature index of a
#: million would otherwise ask for gigabytes. A dense LETOR file stores about one value per cell.
DENSE_PER_STORED = 256
_DENSE_FLOOR = 2**26


def _check_dense(path: str, n: int, width: int, stored: int, block: "_Block | None") -> None:
    """ValueError when ``n`` rows x ``width`` columns is far beyond the ``stored`` values so far
    (:data:`DENSE_PER_STORED`), naming the line of the widest index when ``block`` has it."""
    if n * width <= max(_DENSE_FLOOR, DENSE_PER_STORED * stored):
        return
    where = ""
    if block is not None and len(block.cols):
        line = int(block.lines[block.rows[int(np.argmax(block.cols))]])
        where = f":{line}: feature index {width} makes"
    else:
        where = f": {width} features make"
    raise ValueError(f"{path}{where} {n} documents x {width} features = {n * width * 4 / 2**30:.1f} GiB dense "
                     f"for {stored} stored values (a stray feature index?); pass n_features= to read a wide "
                     f"sparse file")


#: A compressed file read into a dense array may ask for at most this many times its own bytes on
#: disk (and always ``_DENSE_FILE_FLOOR``): a gzipped dense LETOR file gives a few float32 bytes per
#: byte, while a 0.6 MB gzip of repeated short lines could otherwise decompress to a 17 GB array
#: within ``MAX_VALUES``. ``n_features=`` does not lift it; reading the decompressed file does.
DENSE_PER_FILE_BYTE = 64
_DENSE_FILE_FLOOR = 2**30


def _check_values(path: str, n: int, width: int) -> None:
    if n * width > MAX_VALUES:
        raise ValueError(f"{path}: {n} documents x {width} features would need "
                         f"{n * width * 4 / 2**30:.1f} GiB as float32 (more than MAX_VALUES={MAX_VALUES})")
    # Compressed files only: a plain file's text bounds what it stores (DENSE_PER_STORED), a pipe
    # has no size (MAX_VALUES bounds it).
    size = os.path.getsize(path) if path.endswith((".gz", ".bz2")) and os.path.isfile(path) else None
    if size is not None and n * width * 4 > max(_DENSE_FILE_FLOOR, DENSE_PER_FILE_BYTE * size):
        raise ValueError(f"{path}: {n} documents x {width} features would need {n * width * 4 / 2**30:.1f} GiB "
                         f"as float32 from a file of {size / 2**20:.1f} MiB, more than {DENSE_PER_FILE_BYTE} times "
                         f"its size (a decompression bomb?); decompress it to read it as it is")


# -- sidecars -----------------------------------------------------------------------------------------
#: The longest line of an integer sidecar (``.query``, ``.position``): an int64 and its blanks.
_MAX_SIDECAR_LINE = 4096


def _read_integers(path: str, what: str, rule: str, low: int) -> np.ndarray:
    """One integer >= ``low`` per non-blank line of a sidecar file, naming the line of a bad one."""
    values = []
    with open(path, "rt") as f:
        for i, line in enumerate(iter(lambda: f.readline(_MAX_SIDECAR_LINE + 1), ""), 1):
            if len(line) > _MAX_SIDECAR_LINE:  # one integer per line: a longer one (/dev/zero) ends here
                raise ValueError(f"{path}:{i}: line longer than {_MAX_SIDECAR_LINE} characters; expected {what}")
            text = line.strip()
            if not text:
                continue
            if not _QID.fullmatch(text.encode("utf-8", "replace")):
                raise ValueError(f"{path}:{i}: expected {what}, got {text!r}")
            v = int(text)
            if v < low:
                raise ValueError(f"{path}:{i}: {rule}, got {v}")
            if v > _INT64_MAX:
                raise ValueError(f"{path}:{i}: expected {what}, got {text!r} (beyond int64)")
            values.append(v)
    return np.asarray(values, dtype=np.int64)


def read_query_file(path: str) -> np.ndarray:
    """Group sizes from a LightGBM ``.query`` file (one positive integer per line). Their exact
    total (Python integers: it never wraps) has to stay below 2^62, so that every running sum
    of them fits int64; the comparison with the data file's rows comes later."""
    sizes = _read_integers(path, "a group size", "group size must be positive", 1)
    running = 0
    for i, v in enumerate(sizes.tolist()):
        running += v
        if running >= _MAX_TOTAL:
            raise ValueError(f"{path}: group sizes up to group {i + 1} already sum to {running}, more rows "
                             f"than any data file holds (a corrupt .query file?)")
    return sizes


_MAX_TOTAL = 2 ** 62


def read_position_file(path: str) -> np.ndarray:
    """Displayed positions from a sidecar file: one non-negative integer (0-based rank) per line,
    one line per document of the data file (LightGBM's ``.position`` file, 0-based)."""
    return _read_integers(path, "a position (a non-negative integer)", "position must be non-negative", 0)


# -- the public readers ------------------------------------------------------------------------------
def read_svmlight(path: str | os.PathLike, *, query_file: str | os.PathLike | None = None,
                  n_features: int | None = None, zero_based: bool = False,
                  with_comments: bool = False, position_file: str | os.PathLike | None = None) -> RankingDataset:
    """Read a LETOR/SVMlight ranking file.

    Args:
        path: text file, optionally ``.gz`` or ``.bz2`` compressed. Lines are
            ``<label> [qid:<q>] <index>:<value> ... [# comment]``.
        query_file: LightGBM-style group sizes, one per line. When None, ``<path>.query``
            is used if it exists; otherwise the ``qid:`` fields group the documents. When the
            file has ``qid:`` fields too, the two must agree (a stale sidecar is an error).
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

    Time and memory are linear in the file: blocks are parsed into one float32 array, allocated
    once for a plain file (its line count, counted first, bounds the rows) and grown in place for
    a compressed one (``ndarray.resize``, a ``realloc``), then trimmed in place.
    """
    path = _check_path(path)
    check_int(n_features, "n_features", none=True)
    check_bool(zero_based, "zero_based")
    check_bool(with_comments, "with_comments")
    with _read_errors(path):
        scan = _Scan(path, n_features=n_features, zero_based=zero_based, with_comments=with_comments,
                     query_file=_sidecar(path, query_file))
        width = n_features or 0
        # A plain file's line count bounds its rows: one np.empty allocation (its untouched tail
        # costs no memory), trimmed in place at the end. A compressed file grows by half each time.
        rows = _count_lines(path)
        if rows is not None and rows * max(width, 1) > MAX_VALUES:
            rows = None
        features = np.empty((rows if rows is not None and width else 0, width), dtype=np.float32)
        labels = np.empty(rows if rows is not None else 0, dtype=np.float32)
        comments: list[str] | None = [] if with_comments else None
        n = stored = 0
        for block in scan.blocks():
            end = n + block.n
            stored += len(block.values)
            if n_features is None and block.width() > width:
                _check_dense(path, end, block.width(), stored, block)
                width = block.width()
                _check_values(path, end, width)
            elif n_features is None:
                _check_dense(path, end, width, stored, None)
                if rows is not None and rows * width > MAX_VALUES:
                    rows = None
                capacity = rows if rows is not None else _capacity(len(features), end, width)
                wider = np.empty((max(capacity, end), width), dtype=np.float32)
                wider[:n, :features.shape[1]] = features[:n]
                wider[:n, features.shape[1]:] = 0
                features = wider
            _check_values(path, end, width)
            if end > len(features):
                features.resize((_capacity(len(features) * 3 // 2, end, width), width), refcheck=False)
            if end > len(labels):
                labels.resize(len(features), refcheck=False)
            features[n:end] = 0
            features[n + block.rows, block.cols] = block.values
            labels[n:end] = block.labels
            if comments is not None:
                comments.extend(block.comments)
            n = end
        sizes, qids = scan.finish()
        features.resize((n, width), refcheck=False)
        labels.resize(n, refcheck=False)
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    data = RankingDataset(torch.from_numpy(features), torch.from_numpy(labels), torch.from_numpy(offsets),
                          torch.from_numpy(qids.astype(np.int64)), comments, path)
    if position_file is not None:
        position_file = os.fspath(position_file)
        position = read_position_file(position_file)
        if len(position) != data.n_docs:
            raise ValueError(f"{position_file}: {len(position)} positions, "
                             f"but {path} holds {data.n_docs} documents")
        data.position = torch.from_numpy(position)
    return data


@dataclass
class Chunk:
    """A block of a LETOR file's documents in file order (see :func:`iter_svmlight`)."""
    features: torch.Tensor  # [n, F] float32
    labels: torch.Tensor    # [n] float32
    qids: torch.Tensor      # [n] int64: each document's qid (a sidecar's group number without qids)
    docs: torch.Tensor      # [n] int64: each document's position within its query


#: The most dense values (float32) one streamed chunk holds: 64 MiB.
_STREAM_VALUES = 2**24


def iter_svmlight(path: str | os.PathLike, *, n_features: int, query_file: str | os.PathLike | None = None,
                  zero_based: bool = False) -> Iterator[Chunk]:
    """Stream a LETOR/SVMlight file as :class:`Chunk` s of whole lines (a few MiB of text each),
    in file order, with every check of :func:`read_svmlight`; memory does not grow with the file.

    ``n_features`` is required (each chunk is [n, F] before the widest line is known). The checks
    that need the whole file (an interleaved qid, a ``.query`` sidecar that does not sum to the
    file's documents or disagrees with its qids, an empty file) raise after the last chunk, so a
    consumer that writes output must write it atomically and keep it only when the iterator ends
    without an error (as :func:`rankkit.serving.predict_file` does).
    """
    path = _check_path(path)
    check_int(n_features, "n_features")
    check_bool(zero_based, "zero_based")
    with _read_errors(path):
        scan = _Scan(path, n_features=n_features, zero_based=zero_based, with_comments=False,
                     query_file=_sidecar(path, query_file))
        # Rows per chunk: a block's lines, but never more than _STREAM_VALUES dense values (a model
        # declaring a million features must not make each chunk gigabytes).
        step = max(1, _STREAM_VALUES // max(n_features, 1))
        for block in scan.blocks():
            qids_all = block.qids if scan.any_qid else block.group.astype(np.int64)
            for r0 in range(0, block.n, step):
                r1 = min(block.n, r0 + step)
                lo, hi = np.searchsorted(block.rows, [r0, r1])  # entries are in line order
                dense = np.zeros((r1 - r0, n_features), dtype=np.float32)
                dense[block.rows[lo:hi] - r0, block.cols[lo:hi]] = block.values[lo:hi]
                yield Chunk(torch.from_numpy(dense), torch.from_numpy(block.labels[r0:r1].astype(np.float32)),
                            torch.from_numpy(qids_all[r0:r1]), torch.from_numpy(block.doc[r0:r1]))
        scan.finish()


def svmlight_width(path: str | os.PathLike, *, zero_based: bool = False) -> int:
    """The feature count of a LETOR/SVMlight file (its largest index), read in one streaming pass
    with every per-line check of :func:`read_svmlight` (at most ``MAX_FEATURES``)."""
    path = _check_path(path)
    with _read_errors(path):
        width = 0
        for first_line, raw in _raw_blocks(path):
            block = _parse_fast(raw, first_line, zero_based, MAX_FEATURES)
            if block is None:
                block = _parse_slow(raw, first_line, zero_based, MAX_FEATURES,
                                    f"more than MAX_FEATURES={MAX_FEATURES}; pass n_features= to read "
                                    f"wider files", path, False)
            width = max(width, block.width())
    if width == 0:
        raise ValueError(f"{path}: the file holds no features")
    return width
