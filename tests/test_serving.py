"""rankkit.serving: `rankkit predict` reads every format `rankkit export` writes; a model file cannot
declare sizes past the stated limit."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

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
    trust = ["--trust-torchscript"] if suffix == ".pt" else []  # loading a .pt runs its code
    assert main(["predict", str(tmp_path / f"m{suffix}"), "--input", str(data), "-o", str(out), *trust]) == 0
    rows = [line.split("\t") for line in out.read_text().splitlines()]
    x = np.array([[0.5, 0.1, 0, 0, 0], [0.2, 0, 1.5, 0, 0], [0, 0, 0, 0, 3.0]], dtype=np.float32)
    assert [(r[0], r[1]) for r in rows] == [("7", "0"), ("7", "1"), ("9", "0")]
    np.testing.assert_allclose([float(r[2]) for r in rows], lambdamart.predict(x), rtol=1e-6, atol=1e-6)


# -- model files: declared sizes within a stated limit ----------------------------------------------
def test_model_file_declaring_10_12_features(tmp_path, lambdamart, capsys):
    """``n_features_in = 10**12`` in a LambdaMART file: export asked for 256 TB (a traceback)."""
    import json

    from safetensors import safe_open
    from safetensors.torch import save_file

    from rankkit.cli import main

    lambdamart.save(tmp_path / "m.safetensors")
    with safe_open(tmp_path / "m.safetensors", framework="pt") as f:
        meta, tensors = json.loads(f.metadata()["rankkit"]), {k: f.get_tensor(k) for k in f.keys()}
    meta["n_features_in"] = 10**12
    save_file(tensors, tmp_path / "big.safetensors", metadata={"rankkit": json.dumps(meta)})
    (tmp_path / "t.txt").write_text("1 qid:1 1:0.5\n")
    for argv in (["export", str(tmp_path / "big.safetensors"), "-o", str(tmp_path / "big.pt")],
                 ["predict", str(tmp_path / "big.safetensors"), "--input", str(tmp_path / "t.txt")]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "n_features_in = 1000000000000, beyond the limit 1..1000000" in err


# -- a scorer's output is checked before anything is written (trust, round 4) ------------------------
class _NaNLinear:
    """A plain features -> scores model whose weights are NaN (as an edited model file holds)."""

    @staticmethod
    def module():
        import torch
        from torch import nn

        class Linear(nn.Module):
            def __init__(self):
                super().__init__()
                self.n_features = 3
                self.layer = nn.Linear(3, 1)
                with torch.no_grad():
                    self.layer.weight[0, 1] = float("nan")

            def forward(self, x):
                return self.layer(x).squeeze(-1)

        return Linear()


@pytest.mark.parametrize("fmt", ["pt2", "onnx"])
def test_a_model_file_with_nan_weights_is_refused_not_written(tmp_path, fmt):
    from rankkit.export import export_onnx, export_program
    from rankkit.serving import predict_file

    if fmt == "onnx":
        pytest.importorskip("onnxruntime")
    path = tmp_path / f"m.{fmt}"
    (export_onnx if fmt == "onnx" else export_program)(_NaNLinear.module(), path)
    (tmp_path / "x.txt").write_text("1 qid:7 1:0.5\n0 qid:7 1:0.1 2:0.2\n")
    with pytest.raises(ValueError, match=r"scored qid 7 document 0 \(0-based within its query\) as nan: a "
                                         r"non-finite score .*nothing was written"):
        predict_file(path, tmp_path / "x.txt", tmp_path / "s.tsv")
    assert not (tmp_path / "s.tsv").exists()


def test_a_scorer_giving_the_wrong_number_of_scores_is_refused(tmp_path):
    import torch

    from rankkit.serving import as_scorer, predict_file, score_queries

    (tmp_path / "x.txt").write_text("1 qid:1 1:0.5\n0 qid:1 1:0.1\n2 qid:2 1:0.3\n")
    short = lambda x: x[:-1, 0]  # noqa: E731 -- one score too few: the lines would be written misaligned
    with pytest.raises(ValueError, match=r"the model returned 2 scores for 3 documents"):
        predict_file(short, tmp_path / "x.txt", tmp_path / "s.tsv")
    assert not (tmp_path / "s.tsv").exists()
    with pytest.raises(ValueError, match=r"scored document 1 as inf"):
        score_queries(as_scorer(lambda x: 1 / x[:, 0]), torch.tensor([[1.0], [0.0]]), None)


def test_a_declared_width_beyond_the_readers_limit_is_refused_before_any_row(tmp_path):
    # Round 4: a .pt2/.onnx scorer's declared width padded every row to it (one row: 3.7 GiB).
    from torch import nn

    from rankkit.data.svmlight import MAX_FEATURES
    from rankkit.export import export_program
    from rankkit.serving import predict_file

    class Wide(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.n_features = width

        def forward(self, x):
            return x[:, 0]

    (tmp_path / "x.txt").write_text("1 qid:1 1:0.5\n")
    with pytest.raises(ValueError, match=r"the model declares 1000000000 input features, beyond the limit"):
        predict_file(Wide(10**9), tmp_path / "x.txt", tmp_path / "s.tsv")
    export_program(Wide(MAX_FEATURES + 1), tmp_path / "w.pt2")  # the program's static width: F + 1
    with pytest.raises(ValueError, match=rf"declares {MAX_FEATURES + 1} input features"):
        predict_file(tmp_path / "w.pt2", tmp_path / "x.txt", tmp_path / "s.tsv")
    assert not (tmp_path / "s.tsv").exists()
