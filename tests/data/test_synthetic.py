"""rankkit.data.synthetic: MSLR-shaped and seeded."""
from __future__ import annotations

import numpy as np
import torch

from rankkit.data import make_synthetic


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
