"""Quantile binning of raw features into uint8 codes for histogram split search.

Notation: N documents, F features, M borders per feature (padded).

A feature with borders b_0 < b_1 < ... < b_{m-1} (float32 values taken from the data) maps a
value x to the code::

    code(x) = 0                          if x is NaN or x == -inf   (the missing bin)
    code(x) = 1 + #{j : b_j < x}         otherwise                  (1 .. m + 1)

so the tree test "code > c" is exactly the raw test "x > t_c" with the threshold
``t_0 = -inf`` and ``t_c = b_{c-1}`` for c >= 1. That is how the exported ensemble can take raw
float features: the binning is folded into the thresholds.

Missing-value policy: NaN (and -inf) get a bin of their own, code 0, that ranks below every
number. A split therefore always sends NaN to the left ("not greater than the threshold"), which
is also what IEEE ``NaN > t`` gives on raw features at predict time, and the split search can
isolate the missing values (threshold -inf) when that pays.

Borders are data values: when a feature has at most ``max_bins - 1`` distinct finite values
every distinct value but the largest is a border (each value its own bin, as LightGBM does for
low-cardinality features); otherwise the borders are the distinct values at evenly spaced
quantiles of a row sample. A feature with no border and no missing value is constant and is
dropped from the split search.
"""
from __future__ import annotations

import numpy as np
import torch

from rankkit.kernels import cpu as _cpu

MAX_BINS = 255


class QuantileBinner:
    """Quantile borders per feature, fitted on the training features.

    Args:
        max_bins: the number of codes per feature including the missing bin, 3..255.
        sample: at most this many rows are used to place the quantiles (all rows when fewer).
        seed: seeds the row sample.

    Attributes (after :meth:`fit`):
        borders_: [F, M] float32 borders, padded with +inf.
        n_borders_: [F] long, the number of real borders of each feature.
        has_missing_: [F] bool, whether the training data had NaN/-inf in the feature.
        used_features_: [F'] long, the features kept for the split search (not constant).

    >>> binner = QuantileBinner().fit(torch.tensor([[1.0, 5.0], [2.0, 5.0], [float("nan"), 5.0]]))
    >>> binner.transform(torch.tensor([[0.5, 5.0], [1.5, 5.0], [3.0, 5.0], [float("nan"), 5.0]]))
    tensor([[1, 1],
            [2, 1],
            [2, 1],
            [0, 1]], dtype=torch.uint8)
    >>> binner.used_features_  # the second feature is constant
    tensor([0])
    """

    def __init__(self, max_bins: int = MAX_BINS, *, sample: int = 200_000, seed: int = 0):
        if not isinstance(max_bins, int) or not 3 <= max_bins <= MAX_BINS:
            raise ValueError(f"`max_bins` has to be an integer in 3..{MAX_BINS}, got {max_bins!r}")
        self.max_bins = max_bins
        self.sample = sample
        self.seed = seed

    def fit(self, features: torch.Tensor) -> "QuantileBinner":
        """Place the borders from features [N, F] (float)."""
        x = features.detach().to("cpu", torch.float32)
        if x.shape[0] > self.sample:
            g = torch.Generator().manual_seed(self.seed)
            x = x[torch.randperm(x.shape[0], generator=g)[: self.sample]]
        missing = torch.isnan(x) | (x == -torch.inf)
        max_borders = self.max_bins - 2
        # One sort of every column (NaN sorts last, -inf first), then cheap per-feature slicing
        # (fit-time only: F iterations of O(sample) numpy work, no per-row Python work).
        columns = np.sort(x.t().contiguous().numpy(), axis=1)
        n_missing = missing.sum(0).tolist()
        n_low = (x == -torch.inf).sum(0).tolist()
        borders = []
        for f in range(x.shape[1]):
            values = columns[f, n_low[f]: columns.shape[1] - (n_missing[f] - n_low[f])]
            if len(values) == 0:
                borders.append(torch.zeros(0))
                continue
            distinct = values[np.r_[True, values[1:] != values[:-1]]]
            if len(distinct) <= max_borders + 1:
                b = distinct[:-1]
            else:
                pos = (np.arange(1, max_borders + 1) * len(values)) // (max_borders + 1)
                b = np.unique(values[pos])
                b = b[b < distinct[-1]]  # the largest value is never a border
            borders.append(torch.from_numpy(np.ascontiguousarray(b)))
        width = max((len(b) for b in borders), default=0)
        self.borders_ = torch.full((x.shape[1], max(width, 1)), torch.inf)
        for f, b in enumerate(borders):
            self.borders_[f, : len(b)] = b
        self.n_borders_ = torch.tensor([len(b) for b in borders], dtype=torch.long)
        self.has_missing_ = missing.any(0)
        self.used_features_ = torch.nonzero((self.n_borders_ > 0) | self.has_missing_).view(-1)
        return self

    @property
    def n_features(self) -> int:
        return self.borders_.shape[0]

    def transform(self, features: torch.Tensor, *, chunk_rows: int = 1 << 16) -> torch.Tensor:
        """Codes [N, F] uint8 of raw features [N, F] (any device; the borders follow it).

        On the CPU one compiled pass (a binary search per value, rows shared out between the
        threads) when the kernel is available. Otherwise rows are coded by ``searchsorted`` in
        chunks of ``chunk_rows``, so the int64 search result never holds more than
        ``F * chunk_rows`` entries (the codes themselves are one byte each).
        """
        x = features if features.dtype == torch.float32 else features.to(torch.float32)
        if x.device.type == "cpu" and _cpu.available():
            return _cpu.bin_codes(x, self.borders_)
        borders = self.borders_.to(x.device)
        n = x.shape[0]
        out = torch.empty(x.shape[1], n, dtype=torch.uint8, device=x.device)  # [F, N]
        for start in range(0, n, chunk_rows):
            xt = x[start:start + chunk_rows].t().contiguous()
            codes = torch.searchsorted(borders, xt, right=False).add_(1)
            codes.masked_fill_(torch.isnan(xt) | (xt == -torch.inf), 0)
            out[:, start:start + chunk_rows] = codes
        return out.t()

    def thresholds(self) -> torch.Tensor:
        """[F, M + 1] float32: the raw threshold ``t_c`` of the test ``code > c``."""
        lead = torch.full((self.n_features, 1), -torch.inf)
        return torch.cat([lead, self.borders_], dim=1)
