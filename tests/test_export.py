"""Export takes any trained object -- a LightningModule, a fitted LambdaMART, an ensemble, a
plain scorer -- to TorchScript, torch.export and ONNX, and every artefact scores like the eager
model (ONNX through ONNX Runtime, within 1e-5)."""
from __future__ import annotations

import pytest
import torch

from rankkit.boosting import LambdaMART
from rankkit.data import make_synthetic
from rankkit.export import export_onnx, export_program, export_torchscript, load_scorer, unwrap
from rankkit.neural import LambdaRank, MLPScorer

EXPORTERS = {"pt": export_torchscript, "pt2": export_program, "onnx": export_onnx}


@pytest.fixture(scope="module")
def trained():
    data = make_synthetic(30, 10, 6, seed=0)
    booster = LambdaMART(n_estimators=8, depth=3, min_data_in_leaf=3).fit(data)
    torch.manual_seed(0)
    neural = LambdaRank(n_features=6, hidden=[16, 8], ema_decay=0.5)
    neural.fit_preprocessor(data.features)
    scorer = MLPScorer(6, (8,))
    scorer.preprocess.fit(data.features)
    return {"lambdamart": booster, "ensemble": booster.ensemble_, "lightning": neural.eval(),
            "scorer": scorer.eval()}, data


@pytest.mark.parametrize("ext", list(EXPORTERS))
@pytest.mark.parametrize("kind", ["lambdamart", "ensemble", "lightning", "scorer"])
def test_every_trained_object_exports_and_scores_like_the_eager_model(trained, tmp_path, kind, ext):
    if ext == "onnx":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnxscript")
    models, data = trained
    model = models[kind]
    path = EXPORTERS[ext](model, tmp_path / f"m.{ext}")
    x = torch.cat([data.features, data.features[:3] * 100, torch.full((2, 6), float("nan"))])
    with torch.no_grad():
        eager = unwrap(model)(x).reshape(-1)
        served = load_scorer(path, trust_torchscript=True)(x)
    assert served.shape == (len(x),)
    torch.testing.assert_close(served, eager, rtol=1e-5, atol=1e-5)


def test_unwrap_uses_the_serving_scorer_and_refuses_other_objects(trained):
    models, _ = trained
    assert unwrap(models["lambdamart"]) is models["lambdamart"].ensemble_
    assert unwrap(models["lightning"]) is models["lightning"].averaged.module  # the weight average serves
    with pytest.raises(ValueError, match="`model` has to be an nn.Module"):
        unwrap("scorer.pt")
    with pytest.raises(Exception, match="not fitted|NotFitted"):
        export_torchscript(LambdaMART(), "never.pt")
