"""Trust, round 2 (issue 30): nothing in a file runs code, exhausts memory or is silently wrong.

Each test here failed on the code before its fix; docs/reliability.md ("Trust, round 2") lists
them as rows of the bad-input table.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from rankkit.boosting import LambdaMART
from rankkit.data import make_synthetic


@pytest.fixture(scope="module")
def lambdamart():
    return LambdaMART(n_estimators=3, depth=2, min_data_in_leaf=2).fit(make_synthetic(20, 8, 5, seed=0))


# -- rankkit predict works for every format rankkit export writes ----------------------------------
@pytest.mark.parametrize("fmt,suffix", [("torchscript", ".pt"), ("export", ".pt2"), ("onnx", ".onnx")])
def test_predict_every_exported_format(tmp_path: Path, lambdamart, fmt, suffix):
    """``rankkit predict scorer.pt2`` failed ("Calling eval() is not supported yet"); a file with
    fewer columns than the model is zero-padded for every format."""
    pytest.importorskip("onnxruntime") if fmt == "onnx" else None
    from rankkit.cli import main

    lambdamart.save(tmp_path / "m.safetensors")
    assert main(["export", str(tmp_path / "m.safetensors"), "--format", fmt, "-o", str(tmp_path / f"m{suffix}")]) == 0
    data = tmp_path / "t.txt"
    data.write_text("1 qid:7 1:0.5 2:0.1\n0 qid:7 1:0.2 3:1.5\n2 qid:9 5:3.0\n")
    out = tmp_path / "scores.tsv"
    assert main(["predict", str(tmp_path / f"m{suffix}"), "--input", str(data), "-o", str(out)]) == 0
    rows = [line.split("\t") for line in out.read_text().splitlines()]
    x = np.array([[0.5, 0.1, 0, 0, 0], [0.2, 0, 1.5, 0, 0], [0, 0, 0, 0, 3.0]], dtype=np.float32)
    assert [(r[0], r[1]) for r in rows] == [("7", "0"), ("7", "1"), ("9", "0")]
    np.testing.assert_allclose([float(r[2]) for r in rows], lambdamart.predict(x), rtol=1e-6, atol=1e-6)


# -- wrong with exit 0 -----------------------------------------------------------------------------
def test_early_stopping_without_an_eval_set_is_refused():
    """``early_stopping_rounds`` with nothing to watch was ignored (all rounds ran)."""
    with pytest.raises(ValueError, match=r"`early_stopping_rounds=3` needs an `eval_set`"):
        LambdaMART(n_estimators=4, early_stopping_rounds=3).fit(make_synthetic(6, 8, 3, seed=0))


@pytest.mark.parametrize("objective", ["softmax", "listmle", "pointwise", "ranknet"])
def test_booster_weighting_with_another_objective_is_refused(objective):
    """``objective="softmax", weighting="map"`` trained softmax and dropped the weighting."""
    with pytest.raises(ValueError, match=r"`weighting` applies to objective='lambdarank' only"):
        LambdaMART(objective, weighting="map", n_estimators=2).fit(make_synthetic(6, 8, 3, seed=0))


@pytest.mark.parametrize("cls_name,loss", [("LambdaRank", "softmax"), ("NeuralRanker", "listmle"),
                                           ("NeuralRanker", "ndcg_loss2pp")])
def test_neural_weighting_with_a_loss_is_refused(cls_name, loss):
    """``LambdaRank(loss="softmax", weighting="map")`` trained softmax and dropped the weighting;
    the class's default weighting with a loss stays accepted."""
    import rankkit.neural.module as m

    cls = getattr(m, cls_name)
    with pytest.raises(ValueError, match=r"`weighting` is not used when `loss` is given"):
        cls(n_features=3, loss=loss, weighting="map")
    cls(n_features=3, loss=loss)


def test_listmle_hessian_at_the_float32_limit():
    """At scores ±3e38 the float32 Hessian was inf - inf = NaN; now it matches float64."""
    from rankkit.losses import listmle_loss

    s = torch.tensor([[3e38, -3e38, 0.0, 1.0]])
    y = torch.tensor([[0.0, 2.0, 1.0, 1.0]])
    grad, hess, _ = listmle_loss(s, y)
    grad64, hess64, _ = listmle_loss(s.double(), y.double())
    assert torch.isfinite(grad).all() and torch.isfinite(hess).all()
    torch.testing.assert_close(grad, grad64.float())
    torch.testing.assert_close(hess, hess64.float())
    # an ordinary batch: float32 in, the same as float64 in (the float64 inside changes nothing else)
    s = torch.randn(3, 6, generator=torch.Generator().manual_seed(0))
    y = torch.randint(0, 3, (3, 6), generator=torch.Generator().manual_seed(1)).float()
    for a, b in zip(listmle_loss(s, y), listmle_loss(s.double(), y.double())):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b.float())
