"""rankkit.infra.checkpoint: a checkpoint naming a foreign scorer cannot size a huge model."""
from __future__ import annotations

import pytest
import torch


def test_a_checkpoint_naming_a_foreign_scorer_cannot_size_a_huge_model(tmp_path, capsys):
    """Its shapes are the user's scorer's (not checked), but the model its hyper-parameters
    describe is counted on the meta device: `hidden: [65536, 65536]` in a 6 KB file was 17 GB."""
    from rankkit.infra.checkpoint import check_checkpoint
    from rankkit.neural import LambdaRank

    model = LambdaRank(n_features=5, hidden=[8], dropout=0.0)
    path = tmp_path / "m.ckpt"
    checkpoint = {"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams),
                  "rankkit_class": "rankkit.neural.module.LambdaRank",
                  "rankkit": {"scorer_class": "mypkg.MyScorer", "n_features": 5},
                  "pytorch-lightning_version": "2.6.0"}
    torch.save(checkpoint, path)
    check_checkpoint(path, need_scorer=False)  # a modest model: the user's scorer is trusted to fit
    checkpoint["hyper_parameters"]["hidden"] = [65536, 65536]
    torch.save(checkpoint, path)
    with pytest.raises(ValueError, match="describe a model of 4295.* values, the file holds"):
        check_checkpoint(path, need_scorer=False)
