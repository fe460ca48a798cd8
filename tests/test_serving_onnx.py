"""rankkit.serving: an ONNX scorer zero-pads a narrower file as every format does."""
from __future__ import annotations

import numpy as np
import pytest

from rankkit.cli import main
from rankkit.data import make_synthetic


def test_an_onnx_scorer_zero_pads_a_narrower_file_as_every_format(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    from rankkit import LambdaMART

    data = make_synthetic(20, 8, 6, seed=1)
    model = LambdaMART(n_estimators=3, depth=2, min_data_in_leaf=2).fit(data)
    model.save(tmp_path / "m.safetensors")
    assert main(["export", str(tmp_path / "m.safetensors"), "--format", "onnx", "-o", str(tmp_path / "m.onnx")]) == 0
    (tmp_path / "t.txt").write_text("1 qid:7 1:0.5 2:0.1\n0 qid:7 1:0.2 3:1.5\n2 qid:9 5:3.0\n")  # 5 of 6 columns
    out = tmp_path / "scores.tsv"
    assert main(["predict", str(tmp_path / "m.onnx"), "--input", str(tmp_path / "t.txt"), "-o", str(out)]) == 0, \
        capsys.readouterr().err
    x = np.array([[0.5, 0.1, 0, 0, 0, 0], [0.2, 0, 1.5, 0, 0, 0], [0, 0, 0, 0, 3.0, 0]], dtype=np.float32)
    scores = [float(line.split("\t")[2]) for line in out.read_text().splitlines()]
    np.testing.assert_allclose(scores, model.predict(x), rtol=1e-6, atol=1e-6)


def test_an_onnx_graph_that_can_loop_without_end_is_refused(tmp_path):
    # Round 4: a 356-byte ONNX graph with a Loop never ended.
    pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    from rankkit.export import load_scorer

    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, [])])
    nodes = [helper.make_node("Constant", [], ["forever"], value=helper.make_tensor("t", TensorProto.BOOL, [], [1])),
             helper.make_node("Loop", ["", "forever"], [], body=body, name="spin"),
             helper.make_node("ReduceSum", ["features", "axes"], ["scores"], keepdims=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N"])],
                              initializer=[helper.make_tensor("axes", TensorProto.INT64, [1], [1])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "loop.onnx")
    with pytest.raises(ValueError, match=r"loop\.onnx: not a loadable rankkit scorer file: its graph holds the Loop "
                                         r"operator \(spin\), which can run without end"):
        load_scorer(tmp_path / "loop.onnx")
