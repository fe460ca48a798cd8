"""Trust, round 3 (issue 35), the cases this file pins: each a one-line error or the right result."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch

from rankkit.cli import main
from rankkit.data import make_synthetic
from rankkit.data.dataset import MAX_DEFLATE_RATIO, RankingDataset


def test_a_cache_with_complex_labels_is_refused_not_truncated(tmp_path):
    make_synthetic(5, 4, 3).save(tmp_path / "c.npz")
    arrays = dict(np.load(tmp_path / "c.npz"))
    arrays["labels"] = arrays["labels"].astype(np.complex64) + 1j
    np.savez(tmp_path / "x.npz", **arrays)
    with pytest.raises(ValueError, match="labels.npy' holds complex64 values"):
        RankingDataset.load(tmp_path / "x.npz")


def test_a_compressed_cache_cannot_ask_for_more_than_a_small_multiple_of_its_file(tmp_path):
    make_synthetic(5, 4, 3).save(tmp_path / "c.npz")
    arrays = dict(np.load(tmp_path / "c.npz"))
    arrays["features"] = np.zeros((2_000_000, 46), np.float32)  # 368 MB of zeros in a few hundred KB
    np.savez_compressed(tmp_path / "bomb.npz", **arrays)
    assert (tmp_path / "bomb.npz").stat().st_size * MAX_DEFLATE_RATIO < 368_000_000
    with pytest.raises(ValueError, match="MAX_DEFLATE_RATIO"):
        RankingDataset.load(tmp_path / "bomb.npz")
    arrays["features"] = np.random.default_rng(0).random((2000, 46), dtype=np.float32)  # real data compresses little
    arrays["labels"] = np.zeros(2000, np.float32)
    arrays["offsets"] = np.array([0, 2000])
    arrays["qids"] = np.array([1])
    arrays.pop("comments", None)
    arrays.pop("position", None)
    np.savez_compressed(tmp_path / "fine.npz", **arrays)
    assert RankingDataset.load(tmp_path / "fine.npz").n_docs == 2000


def test_deeply_nested_json_in_a_pt2_is_one_line(tmp_path):
    from rankkit.export import export_program, load_scorer
    from rankkit.neural import MLPScorer

    path = tmp_path / "s.pt2"
    export_program(MLPScorer(4, (3,)).eval(), path, n_features=4)
    with zipfile.ZipFile(path) as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    name = next(n for n in members if n.endswith(".json"))
    members[name] = b'{"config": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    bad = tmp_path / "nested.pt2"
    with zipfile.ZipFile(bad, "w", zipfile.ZIP_STORED) as z:
        for n, data in members.items():
            z.writestr(n, data)
    with pytest.raises(ValueError) as e:
        load_scorer(bad)
    assert "nested.pt2" in str(e.value) and "\n" not in str(e.value)


def test_a_pt2_torch_refuses_says_one_line_without_torchs_log(tmp_path, capfd):
    from rankkit.export import export_program, load_scorer
    from rankkit.neural import MLPScorer

    path = tmp_path / "s.pt2"
    export_program(MLPScorer(4, (3,)).eval(), path, n_features=4)
    with zipfile.ZipFile(path) as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    name = next(n for n in members if n.endswith("models/model.json"))
    import json

    program = json.loads(members[name])
    program["schema_version"] = {"major": 99, "minor": 0}  # torch logs a traceback, then refuses it
    members[name] = json.dumps(program).encode()
    bad = tmp_path / "refused.pt2"
    with zipfile.ZipFile(bad, "w", zipfile.ZIP_STORED) as z:
        for n, data in members.items():
            z.writestr(n, data)
    capfd.readouterr()
    with pytest.raises(ValueError, match=r"refused.pt2.*SerializeError: Serialized schema version"):
        load_scorer(bad)
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_ctrl_c_during_predict_is_one_line_and_leaves_no_output(tmp_path, capsys, monkeypatch):
    from rankkit import LambdaMART

    data = make_synthetic(6, 5, 3, seed=0)
    LambdaMART(n_estimators=2, depth=2, min_data_in_leaf=2).fit(data).save(tmp_path / "m.safetensors")
    lines = [f"{int(data.labels[i])} qid:{1 + i // 5} " + " ".join(f"{j + 1}:{float(v):.4g}" for j, v in
                                                                  enumerate(data.features[i])) for i in range(30)]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    import rankkit.serving as serving

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(serving, "predict_file", interrupted)
    out = tmp_path / "scores.tsv"
    assert main(["predict", str(tmp_path / "m.safetensors"), "--input", str(tmp_path / "in.txt"),
                 "-o", str(out)]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "rankkit predict: interrupted" and not out.exists()


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_info_on_dev_zero_ends_with_one_line(capsys):
    assert main(["info", "/dev/zero"]) == 2
    assert "/dev/zero:1: line longer than MAX_LINE_BYTES" in capsys.readouterr().err


def test_info_and_the_reader_read_a_pipe_once(tmp_path):
    """A pipe is not counted first (that would consume it): its documents are all read."""
    text = "1 qid:1 1:0.5 2:1\n0 qid:1 1:0.1\n2 qid:2 2:3\n"
    out = subprocess.run([sys.executable, "-m", "rankkit.cli", "info", "/dev/stdin", "--json"], input=text,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)["/dev/stdin"]
    assert summary["queries"] == 2 and summary["documents"] == 3 and summary["features"] == 2


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


def test_a_resumed_lambdamart_module_with_sampling_grows_the_straight_runs_trees(tmp_path):
    """2 + 2 epochs from a checkpoint grew other trees than 4 straight (subsample 0.8): round m's
    draws now depend on (seed, m) alone."""
    import pytorch_lightning as pl

    from rankkit.boosting import LambdaMARTModule
    from rankkit.training.datamodule import RankingDataModule

    train, val = make_synthetic(40, (3, 20), 6, seed=0), make_synthetic(10, (3, 20), 6, seed=1)

    def fit(epochs, root, ckpt=None):
        pl.seed_everything(0, verbose=False)
        module = LambdaMARTModule(depth=3, min_data_in_leaf=3, subsample=0.8, colsample=0.7,
                                  bagging_temperature=1.0, random_strength=0.5, objective="xendcg")
        pl.Trainer(max_epochs=epochs, accelerator="cpu", logger=False, enable_progress_bar=False,
                   enable_model_summary=False, num_sanity_val_steps=0,
                   callbacks=[pl.callbacks.ModelCheckpoint(dirpath=root, save_last=True)]).fit(
            module, datamodule=RankingDataModule.from_datasets(train, val, max_docs=256), ckpt_path=ckpt)
        return module.scorer

    straight = fit(4, tmp_path / "a")
    fit(2, tmp_path / "b")
    resumed = fit(4, tmp_path / "b", str(tmp_path / "b" / "last.ckpt"))
    assert straight.n_trees == resumed.n_trees == 4
    assert torch.equal(straight.features, resumed.features)
    assert torch.equal(straight.thresholds, resumed.thresholds)
    torch.testing.assert_close(straight.leaf_values, resumed.leaf_values, atol=1e-6, rtol=0)


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
