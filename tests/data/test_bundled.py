"""rankkit.data.bundled: the packaged MQ2008 folds equal the shared files."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rankkit.data import load_mq2008, read_svmlight

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"


needs_shared = pytest.mark.skipif(not SHARED.exists(), reason="../shared/data not present")


@needs_shared
@pytest.mark.parametrize("fold", [1, 3])
def test_bundled_folds_equal_the_shared_files(fold):
    ours = load_mq2008(fold)
    for split, mine in zip(("train", "vali", "test"), ours):
        ref = read_svmlight(SHARED / "MQ2008" / f"Fold{fold}" / f"{split}.txt.gz")
        assert torch.equal(mine.features, ref.features)
        assert torch.equal(mine.labels, ref.labels)
        assert torch.equal(mine.offsets, ref.offsets)
        assert torch.equal(mine.qids, ref.qids)
