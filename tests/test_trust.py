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


# -- checkpoints: nothing is unpickled, no class or size is the file's choice ---------------------
def _checkpoint(tmp_path: Path, module, name: str = "m.ckpt", **edits) -> Path:
    """A checkpoint as Lightning writes it (state_dict, hyper_parameters, the hooks' records)."""
    ckpt = {"state_dict": module.state_dict(), "pytorch-lightning_version": "2.6.0",
            "hyper_parameters": {"_class_path": f"rankkit.neural.{type(module).__name__}", **dict(module.hparams),
                                 "_instantiator": "pytorch_lightning.cli.instantiate_module"}}
    module.on_save_checkpoint(ckpt)
    for key, value in edits.items():
        if key in ("state_dict", "hyper_parameters"):
            ckpt[key] = {**ckpt[key], **value}
        else:
            ckpt[key] = value
    path = tmp_path / name
    torch.save(ckpt, path)
    return path


@pytest.fixture
def ranknet():
    from rankkit.neural import RankNet

    torch.manual_seed(0)
    return RankNet(n_features=5, hidden=[8, 4])


def test_load_checkpoint_equals_lightning(tmp_path, ranknet):
    """rankkit builds the module itself; it scores as Lightning's own loader's module does."""
    from rankkit._checkpoint import load_checkpoint
    from rankkit.neural import RankNet

    path = _checkpoint(tmp_path, ranknet)
    ours = load_checkpoint(path)
    theirs = RankNet.load_from_checkpoint(path, map_location="cpu", weights_only=True).eval()
    x = torch.rand(9, 5)
    assert not ours.training and ours.hparams.hidden == [8, 4]
    torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=0)


def test_checkpoint_instantiator_is_never_imported(tmp_path, ranknet, capsys):
    """The file's ``_instantiator`` (a function Lightning would import and call) is ignored."""
    from rankkit._checkpoint import load_checkpoint

    path = _checkpoint(tmp_path, ranknet, hyper_parameters={"_instantiator": "builtins.print"})
    load_checkpoint(path)
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("edit,match", [
    ({"hyper_parameters": {"n_features": {"class_path": "torch.nn.Linear",
                                          "init_args": {"in_features": 100000, "out_features": 100000}}}},
     r"hyper-parameter `n_features` has to be a plain value, got a class_path"),
    ({"hyper_parameters": {"hidden": [30000, 30000]}},
     r"does not match the RankNet its hyper-parameters describe: tensor 'scorer.net.0.bias' is \(8,\) "
     r"in the file, \(30000,\) in the model"),
    ({"hyper_parameters": {"n_features": 10**12}}, r"`n_features` = 1000000000000 is beyond the limit 1000000"),
    ({"hyper_parameters": {"hidden": [8] * 1000}}, r"`hidden` holds 1000 values, more than 64"),
    ({"hyper_parameters": {"unbiased": True, "n_positions": 10**6}}, r"`n_positions` = 1000000 is beyond"),
    ({"hyper_parameters": {"os_system": "ls"}}, r"hyper-parameter 'os_system' is not an argument of RankNet"),
    ({"rankkit_class": "torch.nn.Linear"}, r"names no rankkit model class: 'torch.nn.Linear'"),
    ({"hyper_parameters": {"_class_path": "os.system"}}, r"`_class_path` 'os.system' is not its rankkit class"),
    ({"rankkit": {"scorer_class": "my.Scorer"}}, r"trained with the scorer 'my.Scorer'.*pass scorer="),
    ({"state_dict": {"scorer.net.0.weight": torch.zeros(8, 6)}}, r"tensor 'scorer.net.0.weight' is \(8, 6\)"),
])
def test_checkpoint_cannot_choose_code_or_sizes(tmp_path, ranknet, edit, match):
    """A 40 GB ``torch.nn.Linear`` or a 3.9 GB ``hidden`` was built from the file before."""
    from rankkit._checkpoint import load_checkpoint

    path = _checkpoint(tmp_path, ranknet, **edit)
    with pytest.raises(ValueError, match=match):
        load_checkpoint(path)


def test_checkpoint_with_own_scorer_passed_in_code(tmp_path):
    from torch import nn

    from rankkit._checkpoint import load_checkpoint
    from rankkit.neural import NeuralRanker

    module = NeuralRanker(scorer=nn.Sequential(nn.Linear(3, 1), nn.Flatten(0)))
    path = _checkpoint(tmp_path, module)
    with pytest.raises(ValueError, match=r"scorer 'torch.nn.modules.container.Sequential'"):
        load_checkpoint(path)
    loaded = load_checkpoint(path, scorer=nn.Sequential(nn.Linear(3, 1), nn.Flatten(0)))
    x = torch.rand(4, 3)
    torch.testing.assert_close(loaded(x), module.eval()(x))


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/x.ckpt", "https://h/x.ckpt", "s3://b/x.ckpt",
                                 "simplecache::http://127.0.0.1:9/x.ckpt", "file::/tmp/x.ckpt"])
def test_checkpoint_url_refused_by_the_api(url):
    from rankkit._checkpoint import load_checkpoint
    from rankkit.serving import load_model

    with pytest.raises(ValueError, match=r"`ckpt_path` has to be a local checkpoint file"):
        load_checkpoint(url)
    with pytest.raises((ValueError, FileNotFoundError)):
        load_model(url)


@pytest.mark.parametrize("spelling", ["space", "equals", "yaml"])
def test_ckpt_path_url_refused_by_the_cli_in_any_spelling(tmp_path, spelling, capsys):
    """``--ckpt_path URL`` (a space, not ``=``) and ``ckpt_path:`` in a YAML reached Lightning's
    loader, which unpickles a remote file with ``weights_only=False``."""
    from rankkit.cli import main

    url = "http://127.0.0.1:9/x.ckpt"
    args = {"space": ["--ckpt_path", url], "equals": [f"--ckpt_path={url}"]}.get(spelling)
    if args is None:
        (tmp_path / "c.yaml").write_text(f"ckpt_path: {url}\n")
        args = ["--config", str(tmp_path / "c.yaml")]
    command = "fit" if spelling == "yaml" else "test"  # a YAML `ckpt_path:` resumes a fit
    assert main([command, "--config", "ranknet", *args, "--data.data=nope", "--trainer.logger=false"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "rankkit does not load checkpoints from URLs" in err


def test_cli_checkpoint_with_a_pickle_is_never_unpickled(tmp_path, capsys):
    """A local checkpoint carrying a pickled payload: refused, even with ``--weights_only=false``."""
    import pickle

    from rankkit.cli import main

    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "x": Payload()}, path, pickle_module=pickle)
    argv = ["test", "--config", "ranknet", "--ckpt_path", str(path), "--data.data=nope", "--trainer.logger=false"]
    assert main(argv) == 2
    assert main([*argv, "--weights_only=false"]) == 2
    assert not marker.exists()
    assert "not a readable Lightning checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize("options", [{"ema_decay": 0.5}, {"unbiased": True, "n_positions": 4},
                                     {"norm": "layer", "hidden": [6]}])
def test_load_checkpoint_every_module_option(tmp_path, options):
    """The meta-device shape check builds every variant (EMA copy, propensities, layer norm)."""
    from rankkit._checkpoint import load_checkpoint
    from rankkit.neural import LambdaRank

    torch.manual_seed(1)
    module = LambdaRank(n_features=5, **options)
    path = _checkpoint(tmp_path, module)
    x = torch.rand(6, 5)
    torch.testing.assert_close(load_checkpoint(path)(x), module.eval()(x))


# -- YAML: limited in size and in nodes with aliases expanded -------------------------------------
def _bomb(levels: int = 10, width: int = 9) -> str:
    """A "billion laughs" YAML: ``width ** levels`` scalars in about 40 bytes per level."""
    names = [f"l{i}" for i in range(levels)]
    text = f"{names[0]}: &{names[0]} [{', '.join(['x'] * width)}]\n"
    for prev, name in zip(names, names[1:]):
        text += f"{name}: &{name} [{', '.join([f'*{prev}'] * width)}]\n"
    return text + f"model: *{names[-1]}\n"


@pytest.mark.parametrize("argv", [["fit", "--config", "{bomb}"], ["compare", "--config", "{bomb}"],
                                  ["compare", "--models", "lambdamart,{bomb}"]])
def test_yaml_alias_bomb_is_refused_by_every_command(tmp_path, argv, capsys):
    """A 476-byte alias bomb given to ``fit --config``, ``compare --config`` or ``compare
    --models`` grew to 3-4 GB and hung."""
    from rankkit.cli import main

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_bomb())
    assert len(bomb.read_bytes()) < 600
    assert main([a.format(bomb=bomb) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "more than 100000 YAML nodes with aliases expanded" in err


def test_yaml_limits():
    from rankkit import _yaml

    _yaml.check_yaml(_bomb(levels=5, width=6))  # about 2 x 6^5 = 15552 scalars: within the limit
    with pytest.raises(_yaml.YAMLLimitError, match=r"s.yaml: more than 100000 YAML nodes"):
        _yaml.check_yaml(_bomb(levels=6, width=9), "s.yaml")
    with pytest.raises(ValueError, match=r"big.yaml: 1048577 characters of YAML, more than"):
        _yaml.safe_load("#" * (_yaml.MAX_BYTES + 1), "big.yaml")
    with pytest.raises(_yaml.YAMLLimitError, match="more than 100000"):  # a cycle: bounded too
        _yaml.check_yaml("a: &a [*a, *a]\n")
    assert _yaml.safe_load("a: &x [1, 2]\nb: *x\n") == {"a": [1, 2], "b": [1, 2]}
