"""rankkit.boosting.binning: quantile codes agree with the raw thresholds."""
from __future__ import annotations

import pytest
import torch

from rankkit.boosting import QuantileBinner
from rankkit.boosting.engine import valid_codes as _valid_codes

pytestmark = pytest.mark.usefixtures("one_thread")  # every test here on one thread


# -- binning -----------------------------------------------------------------------------------
def test_binning_codes_agree_with_raw_thresholds():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(500, 4, generator=g)
    x[:, 1] = torch.randint(0, 3, (500,), generator=g).float()  # 3 distinct values
    x[::7, 2] = float("nan")
    x[:, 3] = 5.0  # constant
    binner = QuantileBinner(max_bins=16).fit(x)
    codes = binner.transform(x)
    assert codes.dtype == torch.uint8 and codes.shape == x.shape
    assert int(codes.max()) < 16
    assert binner.used_features_.tolist() == [0, 1, 2]
    assert binner.n_borders_[1] == 2  # each of the 3 values its own bin
    assert bool((codes[::7, 2] == 0).all())  # NaN: the missing bin
    thresholds = binner.thresholds()
    valid = _valid_codes(binner)
    for f in range(3):
        for c in torch.nonzero(valid[f]).view(-1).tolist():
            assert torch.equal(codes[:, f].long() > c, x[:, f] > thresholds[f, c])
