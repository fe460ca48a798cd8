"""rankkit.infra.checkpoint: a checkpoint naming a foreign scorer cannot size a huge model."""
from __future__ import annotations

import re

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


def test_an_expanded_tensor_cannot_declare_more_than_it_stores(tmp_path, capsys):
    """Round 4: stride-0 (expanded) tensors in a 6-22 KB checkpoint passed every size check (they
    counted elements, not stored bytes) and made predict/export/test ask for 4 GB-4 TB."""
    from rankkit.cli import main
    from rankkit.infra.checkpoint import load_checkpoint
    from rankkit.neural import LambdaRank

    model = LambdaRank(n_features=5, hidden=[8], dropout=0.0)
    state = model.state_dict()
    name = next(k for k, v in state.items() if v.dim() == 2)
    state[name] = torch.ones(1, 1).expand(*state[name].shape)  # the right shape, one stored value
    path = tmp_path / "m.ckpt"
    torch.save({"state_dict": state, "hyper_parameters": dict(model.hparams),
                "rankkit_class": "rankkit.neural.module.LambdaRank", "pytorch-lightning_version": "2.6.0"}, path)
    message = rf"tensor `{name}` declares .* over 4 stored bytes \(an expanded, stride-0 tensor\)"
    with pytest.raises(ValueError, match=message):
        load_checkpoint(path)
    assert main(["export", str(path), "-o", str(tmp_path / "m.pt")]) == 2  # the command: one line
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and re.search(message, err), err
    assert not (tmp_path / "m.pt").exists()
