"""The estimator's input layer: what users pass to ``fit``/``predict``, checked once, as tensors.

Notation: N documents, F features, Q queries.

Accepted, as from scikit-learn, LightGBM and XGBoost:

* ``X``: a numpy array, a torch tensor, a pandas DataFrame (its column names are the feature
  names) or a scipy sparse matrix (CSR/CSC/COO; densified one chunk of rows at a time);
* ``y``, ``sample_weight``, ``init_score``: [N] array-likes;
* the queries: ``qid`` ([N] ids of any hashable kind, each query's documents contiguous) or
  ``group`` ([Q] sizes); one of them is required (XGBoost's rule: a ranker never guesses
  that every document belongs to one query).

Features: NaN is a missing value (it has a bin of its own); ±inf is an error.
"""
from __future__ import annotations

import numpy as np
import torch

from rankkit.infra import checks as _checks
from rankkit.kernels import cpu as _cpu

_CHUNK = 1 << 16  # rows densified at once


class InputTypeError(ValueError, TypeError):
    """Input of a kind that is not numbers (a ValueError like every bad input, and a TypeError
    as scikit-learn raises for these)."""


class FeatureMatrix:
    """Features [N, F] as float32 tensors, chunk by chunk (a sparse matrix is never densified whole).

    Attributes:
        n_rows, n_features: N and F.
        names: the feature names (a DataFrame's columns) or None.
    """

    def __init__(self, x, name: str = "X"):
        self.name = name
        self.names = None
        self._sparse = None
        self._dense: torch.Tensor | None = None
        if hasattr(x, "columns") and hasattr(x, "to_numpy"):  # a pandas DataFrame
            self.names = np.asarray([str(c) for c in x.columns], dtype=object)
            x = x.to_numpy(dtype=np.float32, na_value=np.nan)
        if hasattr(x, "tocsr") and hasattr(x, "nnz"):  # a scipy sparse matrix
            self._sparse = x.tocsr()
            self.n_rows, self.n_features = self._sparse.shape
            bad = np.isinf(self._sparse.data)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                row = int(np.searchsorted(self._sparse.indptr, i, side="right") - 1)
                raise ValueError(f"`{name}` has to be finite or NaN (missing), got {self._sparse.data[i]!r} "
                                 f"at [{row}, {int(self._sparse.indices[i])}]")
        else:
            if isinstance(x, torch.Tensor):
                t = x.detach()
            else:
                if np.iscomplexobj(x):
                    raise ValueError(f"`{name}` has to be real-valued: Complex data not supported")
                try:
                    t = torch.from_numpy(_writable(np.asarray(x, dtype=np.float32)))
                except (TypeError, ValueError) as e:
                    raise InputTypeError(f"`{name}` has to be a numeric [N, F] matrix: {e}") from None
            if t.ndim != 2:
                raise ValueError(f"`{name}` has to be a [N, F] matrix, got shape {tuple(t.shape)}. Reshape your "
                                 f"data: X.reshape(-1, 1) for one feature, X.reshape(1, -1) for one document")
            if t.is_complex() or t.dtype == torch.bool:
                raise ValueError(f"`{name}` has to be a real-valued [N, F] matrix, got {t.dtype}")
            t = t.to("cpu", torch.float32)
            # The compiled pass first (all threads, no mask); the torch check where it finds an
            # infinity (or cannot run): that one names the first bad position.
            if not (t.is_contiguous() and _cpu.available() and not _cpu.any_inf(t)):
                _checks.check_tensors((name, t, torch.isinf(t), "finite or NaN (missing)"))
            self._dense = t
            self.n_rows, self.n_features = t.shape
        if self.n_rows == 0:
            raise ValueError(f"`{name}` has 0 sample(s) (shape=(0, {self.n_features})) while a minimum of 1 is "
                             f"required.")
        if self.n_features == 0:
            raise ValueError(f"`{name}` has 0 feature(s) (shape=({self.n_rows}, 0)) while a minimum of 1 is required.")

    def dense(self) -> torch.Tensor:
        """All rows at once [N, F] (a sparse matrix is densified here: use :meth:`chunks`)."""
        if self._dense is not None:
            return self._dense
        return torch.cat(list(self.chunks()))

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """The rows ``index`` [n] as a dense [n, F] float32 tensor."""
        if self._dense is not None:
            return self._dense.index_select(0, index)
        part = self._sparse[index.numpy()]
        return torch.from_numpy(np.asarray(part.todense(), dtype=np.float32))

    def chunks(self, size: int = _CHUNK):
        """Dense [≤ size, F] float32 chunks of rows, in order."""
        for start in range(0, self.n_rows, size):
            if self._dense is not None:
                yield self._dense[start:start + size]
            else:
                part = self._sparse[start:start + size]
                yield torch.from_numpy(np.asarray(part.todense(), dtype=np.float32))


def _writable(a: np.ndarray) -> np.ndarray:
    """``a``, copied when numpy marks it read-only (a pandas column, a memmap): torch warns on those."""
    return a if a.flags.writeable else a.copy()


def vector(x, n: int, name: str, *, kind: str = "float") -> torch.Tensor:
    """An [n] vector as a CPU tensor (float32, or float64 for ``kind="double"``), finite;
    ``kind="label"``/``"weight"`` also non-negative."""
    try:
        t = x.detach().cpu() if isinstance(x, torch.Tensor) else torch.from_numpy(
            _writable(np.asarray(x, dtype=np.float64)))
    except (TypeError, ValueError) as e:
        raise ValueError(f"`{name}` has to be a numeric vector: {e}") from None
    if tuple(t.shape) != (n,):
        raise ValueError(f"`{name}` has to have shape [{n}], got {tuple(t.shape)}")
    if (t.dtype == torch.bool and kind != "label") or t.is_complex():  # bool labels: clicks, 0 / 1 (as numpy's)
        raise ValueError(f"`{name}` has to be real-valued, got {t.dtype}")
    t = t.to(torch.float64)
    if kind in ("label", "weight"):
        _checks.check_tensors((name, t, ~(torch.isfinite(t) & (t >= 0)), "finite and non-negative"))
    else:
        _checks.check_tensors(_checks.finite_condition(t, None, name))
    return t if kind == "double" else t.to(torch.float32)


def query_sizes(qid, group, n: int, *, qid_name: str = "qid", group_name: str = "group") -> torch.Tensor:
    """[Q] documents per query from ``qid`` ([N] ids of any hashable kind, each query's
    documents contiguous) or ``group`` ([Q] positive sizes summing to N).

    >>> query_sizes(["a", "a", "b", 7, 7, 7], None, 6).tolist()
    [2, 1, 3]
    """
    if qid is not None and group is not None:
        raise ValueError(f"pass either `{qid_name}` or `{group_name}`, not both")
    if qid is None and group is None:
        raise ValueError(f"`{qid_name}` or `{group_name}` is required: a ranker needs to know which "
                         f"documents form a query (pass group=[N] for one query)")
    if qid is not None:
        q = qid.detach().cpu().numpy() if isinstance(qid, torch.Tensor) else np.asarray(qid, dtype=object)
        if q.shape != (n,):
            raise ValueError(f"`{qid_name}` has to have shape [{n}], got {q.shape}")
        if q.dtype == object:
            q = np.asarray([v.item() if hasattr(v, "item") else v for v in q], dtype=object)
        # NaN differs from itself: every NaN would start a one-document query of its own
        if q.dtype.kind == "f":
            nan = np.isnan(q)
        elif q.dtype == object:
            nan = np.fromiter((isinstance(v, float) and v != v for v in q), dtype=bool, count=len(q))
        else:
            nan = np.zeros(len(q), dtype=bool)
        if nan.any():
            raise ValueError(f"`{qid_name}` has to hold query ids, got nan at [{int(np.flatnonzero(nan)[0])}]")
        starts = np.ones(n, dtype=bool)
        if n:
            starts[1:] = q[1:] != q[:-1]
        first = np.flatnonzero(starts)
        seen: dict = {}
        for i in first.tolist():
            key = q[i]
            if key in seen:
                raise ValueError(f"`{qid_name}`: each query's documents have to be contiguous (sort by "
                                 f"qid), but query {key!r} comes back at position {i} after position "
                                 f"{seen[key]}")
            seen[key] = i
        return torch.from_numpy(np.diff(np.append(first, n))).long()
    sizes = torch.as_tensor(np.asarray(group)).reshape(-1)
    if sizes.is_floating_point() and bool((sizes != sizes.round()).any()):
        raise ValueError(f"`{group_name}` has to hold integer sizes")
    sizes = sizes.long()
    _checks.check_tensors((group_name, sizes, sizes < 1, "positive"))
    # Checked before summing: sizes near 2^63 would wrap the int64 sum around to N.
    _checks.check_tensors((group_name, sizes, sizes > n, f"at most the number of documents N={n}"))
    if int(sizes.sum()) != n:
        raise ValueError(f"`{group_name}` has to sum to the number of documents N={n}, got {int(sizes.sum())}")
    return sizes
