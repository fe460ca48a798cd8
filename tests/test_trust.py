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
    trust = ["--trust-torchscript"] if suffix == ".pt" else []  # loading a .pt runs its code
    assert main(["predict", str(tmp_path / f"m{suffix}"), "--input", str(data), "-o", str(out), *trust]) == 0
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
    from rankkit.infra.checkpoint import load_checkpoint
    from rankkit.neural import RankNet

    path = _checkpoint(tmp_path, ranknet)
    ours = load_checkpoint(path)
    theirs = RankNet.load_from_checkpoint(path, map_location="cpu", weights_only=True).eval()
    x = torch.rand(9, 5)
    assert not ours.training and ours.hparams.hidden == [8, 4]
    torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=0)


def test_checkpoint_instantiator_is_never_imported(tmp_path, ranknet, capsys):
    """The file's ``_instantiator`` (a function Lightning would import and call) is ignored."""
    from rankkit.infra.checkpoint import load_checkpoint

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
    ({"rankkit": {"torch_rng": torch.zeros(3)}}, r"does not match RankNet: (RuntimeError|TypeError)"),
    ({"rankkit": {"torch_rng": "x"}}, r"does not match RankNet: (RuntimeError|TypeError)"),
])
def test_checkpoint_cannot_choose_code_or_sizes(tmp_path, ranknet, edit, match):
    """A 40 GB ``torch.nn.Linear`` or a 3.9 GB ``hidden`` was built from the file before."""
    from rankkit.infra.checkpoint import load_checkpoint

    path = _checkpoint(tmp_path, ranknet, **edit)
    with pytest.raises(ValueError, match=match):
        load_checkpoint(path)


def test_checkpoint_with_own_scorer_passed_in_code(tmp_path):
    from torch import nn

    from rankkit.infra.checkpoint import load_checkpoint
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
    from rankkit.infra.checkpoint import load_checkpoint
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
                                     {"norm": "layer", "hidden": [6]},
                                     {"architecture": "transformer", "hidden": [8], "heads": 2, "layers": 1}])
def test_load_checkpoint_every_module_option(tmp_path, options):
    """The meta-device shape check builds every variant (EMA copy, propensities, layer norm)."""
    from rankkit.infra.checkpoint import load_checkpoint
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
    from rankkit.infra import yaml as _yaml

    _yaml.check_yaml(_bomb(levels=5, width=6))  # about 2 x 6^5 = 15552 scalars: within the limit
    with pytest.raises(_yaml.YAMLLimitError, match=r"s.yaml: more than 100000 YAML nodes"):
        _yaml.check_yaml(_bomb(levels=6, width=9), "s.yaml")
    with pytest.raises(ValueError, match=r"big.yaml: 1048577 characters of YAML, more than"):
        _yaml.safe_load("#" * (_yaml.MAX_BYTES + 1), "big.yaml")
    with pytest.raises(_yaml.YAMLLimitError, match="more than 100000|nested more than"):  # a cycle: bounded too
        _yaml.check_yaml("a: &a [*a, *a]\n")
    assert _yaml.safe_load("a: &x [1, 2]\nb: *x\n") == {"a": [1, 2], "b": [1, 2]}
    # one large anchored string aliased many times: few nodes, gigabytes once expanded
    wide = "a: &s " + "x" * 900_000 + "\nb: [" + ", ".join(["*s"] * 20) + "]\n"
    with pytest.raises(_yaml.YAMLLimitError, match=r"w.yaml: more than 8388608 characters of YAML values"):
        _yaml.check_yaml(wide, "w.yaml")
    _yaml.check_yaml("a: &s " + "x" * 900_000 + "\nb: [*s, *s]\n")  # 2.7M characters: within
    # nesting: flow and block, refused before PyYAML's recursive reader overflows the stack
    block = "".join("  " * i + f"k{i}:\n" for i in range(300)) + " " * 600 + "v: 1\n"
    for deep in ("a: " + "[" * 5000 + "]" * 5000, block):
        with pytest.raises(_yaml.YAMLLimitError, match="nested"):
            _yaml.check_yaml(deep, "deep.yaml")
    _yaml.check_yaml("".join("  " * i + f"k{i}:\n" for i in range(50)) + "  " * 50 + "v: 1\n")  # 51 levels


def test_compare_installs_the_yaml_limits_in_a_fresh_process(tmp_path):
    """``rankkit compare --config`` never installed the limits: run alone (not after a ``fit`` in
    the same process, as the test above), a 378-byte bomb reached 3.4 GB."""
    import subprocess
    import sys

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_bomb())
    done = subprocess.run([sys.executable, "-m", "rankkit.cli", "compare", "--config", str(bomb)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "more than 100000 YAML nodes with aliases expanded" in done.stderr, done.stderr


# -- .npz caches: headers checked before numpy allocates --------------------------------------------
def _npz(path: Path, members: dict[str, bytes], compression=0) -> Path:
    import zipfile

    with zipfile.ZipFile(path, "w", compression=compression) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def _npy_header(shape, descr="<f4") -> bytes:
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


@pytest.mark.parametrize("members,match", [
    ({"features.npy": _npy_header((2**40,)) + b"\0" * 16},
     r"declares 4398046511104 bytes of data, the member holds 16"),
    ({"features.npy": _npy_header((2**20, 2**20)) + b"\0" * 4}, r"declares 4398046511104 bytes"),
    ({"features.npy": _npy_header((2,), "|O") + b"\0" * 16}, r"holds Python objects"),
    ({"evil.pkl": b"cos\nsystem\n"}, r"member 'evil.pkl' is not a .npy array"),
])
def test_npz_header_limits(tmp_path, members, match):
    """A header claiming 4 TiB gave a MemoryError traceback (numpy allocates from the header)."""
    from rankkit.data import RankingDataset

    path = _npz(tmp_path / "c.npz", members)
    with pytest.raises(ValueError, match=match):
        RankingDataset.load(path)


def test_npz_compressed_member_claiming_too_much(tmp_path):
    import zipfile

    from rankkit.data import RankingDataset

    data = _npy_header((2**30,)) + b"\0" * 4096  # deflates to a few bytes; declares 4 GiB
    path = _npz(tmp_path / "c.npz", {"features.npy": data}, compression=zipfile.ZIP_DEFLATED)
    with pytest.raises(ValueError, match=r"declares 4294967296 bytes of data, the member holds 4096"):
        RankingDataset.load(path)
    ds = make_synthetic(3, 4, 2, seed=0)
    ds.save(tmp_path / "ok.npz")  # rankkit's own cache passes the checks
    assert torch.equal(RankingDataset.load(tmp_path / "ok.npz").features, ds.features)


# -- fetch: no cache from another source, no user's archive deleted ---------------------------------
@pytest.fixture
def toy_remote(tmp_path, monkeypatch):
    """A LETOR zip served from a file:// URL (no network), registered as remote "toy"."""
    import hashlib
    import zipfile

    from rankkit.data import fetch as fetch_mod

    archive = tmp_path / "served.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for split in ("train", "vali", "test"):
            z.writestr(f"Fold1/{split}.txt", "2 qid:1 1:0.5 2:1\n0 qid:1 1:0.1\n1 qid:2 3:0.7\n0 qid:2 2:0.9\n")
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    monkeypatch.setitem(fetch_mod.REMOTES, "toy", fetch_mod.Remote(archive.as_uri(), "toy.zip", digest, 3))
    return digest


def test_fetch_never_deletes_a_users_archive(tmp_path, toy_remote):
    """``fetch_letor_zip(..., sha256=<wrong>)`` deleted the user's downloaded archive first."""
    from rankkit.data import fetch_letor_zip

    root = tmp_path / "cache"
    (root / "toy").mkdir(parents=True)
    mine = root / "toy" / "toy.zip"
    mine.write_bytes(b"the user's own archive")
    with pytest.raises(ValueError, match=r"toy.zip exists but its sha256 is .* rankkit does not replace it"):
        fetch_letor_zip("toy", 1, root=root, sha256="1" * 64)
    assert mine.read_bytes() == b"the user's own archive"
    with pytest.raises(ValueError, match=r"`sha256` has to be 64 lowercase hex digits"):
        fetch_letor_zip("toy", 1, root=root, sha256="not-a-digest")


def test_fetch_refuses_a_cache_from_another_source(tmp_path, toy_remote):
    """A cached ``.npz`` of another archive (or put there by hand) was returned without a check."""
    from rankkit.data import fetch_letor_zip

    root = tmp_path / "cache"
    train, _, _ = fetch_letor_zip("toy", 1, root=root)
    again, _, _ = fetch_letor_zip("toy", 1, root=root)  # its own cache: used
    assert torch.equal(again.features, train.features)
    other = make_synthetic(2, 3, 3, seed=1)
    other.save(root / "toy" / "fold1_train.npz")  # another source's data under the cache's name
    with pytest.raises(ValueError, match=r"fold1_train.npz: this cache holds .* not 'toy/fold1/train sha256="):
        fetch_letor_zip("toy", 1, root=root)
    with pytest.raises(ValueError, match=r"holds 'toy/fold1/vali sha256=[0-9a-f]+', not 'toy/fold1/vali sha256=2"):
        (root / "toy" / "fold1_train.npz").unlink()
        (root / "toy" / "toy.zip").unlink()
        fetch_letor_zip("toy", 1, root=root, sha256="2" * 64)  # another archive's digest


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


def test_lightning_api_load_from_checkpoint_is_guarded(tmp_path, ranknet):
    """``RankNet.load_from_checkpoint(URL)`` went to Lightning's loader (``weights_only=False``
    for a URL); the Python API route has the same checks as ``load_checkpoint``."""
    from rankkit.neural import RankNet

    with pytest.raises(ValueError, match="rankkit does not load checkpoints from URLs"):
        RankNet.load_from_checkpoint("http://127.0.0.1:9/x.ckpt")
    path = _checkpoint(tmp_path, ranknet)
    with pytest.raises(ValueError, match="weights_only=False"):
        RankNet.load_from_checkpoint(path, weights_only=False)
    x = torch.rand(3, 5)
    torch.testing.assert_close(RankNet.load_from_checkpoint(path).eval()(x), ranknet.eval()(x))
    big = _checkpoint(tmp_path, ranknet, "big.ckpt", hyper_parameters={"hidden": [30000, 30000]})
    with pytest.raises(ValueError, match="does not match the RankNet"):
        RankNet.load_from_checkpoint(big)


class _Plant:
    """Unpickling this creates ``marker`` (a stand-in for any code a pickle can run)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("module", ["RankNet", "LambdaMARTModule"])
def test_a_trainers_ckpt_path_is_checked_before_lightning_reads_it(tmp_path, module):
    """``pl.Trainer().test(RankNet(...), datamodule=..., ckpt_path=URL)`` fetched and unpickled the
    file (``weights_only=False``); a local checkpoint carrying a pickle ran it. rankkit's modules
    now make the Trainer check the path and read the file with ``weights_only=True`` first."""
    import pytorch_lightning as pl

    import rankkit
    from rankkit.training.datamodule import RankingDataModule

    dm = RankingDataModule("mq2008", max_docs=128)
    model = rankkit.RankNet(n_features=46) if module == "RankNet" else rankkit.LambdaMARTModule(depth=2)
    trainer = pl.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, accelerator="cpu", devices=1)
    with pytest.raises(ValueError, match=r"`ckpt_path` has to be a local checkpoint file"):
        trainer.test(model, datamodule=dm, ckpt_path="http://127.0.0.1:9/x.ckpt")
    marker = tmp_path / "planted"
    torch.save({"state_dict": {}, "payload": _Plant(marker)}, tmp_path / "evil.ckpt")
    assert not marker.exists()
    with pytest.raises(ValueError, match=r"evil\.ckpt: not a readable Lightning checkpoint"):
        trainer.test(model, datamodule=dm, ckpt_path=str(tmp_path / "evil.ckpt"))
    assert not marker.exists()  # the pickle never ran


def test_checkpoint_values_are_checked_when_loaded(tmp_path, ranknet):
    """A RankNet checkpoint with a NaN weight, and a LambdaMART one with a NaN leaf, a NaN
    threshold or an infinite bias, loaded and scored NaN/inf with exit status 0."""
    from rankkit.infra.checkpoint import load_checkpoint

    name = next(k for k, v in ranknet.state_dict().items() if v.is_floating_point() and v.dim() == 2)
    weights = ranknet.state_dict()[name].clone()
    weights[1, 2] = float("nan")
    with pytest.raises(ValueError, match=rf"bad\.ckpt: `{name}` holds nan at \[1, 2\]"):
        load_checkpoint(_checkpoint(tmp_path, ranknet, "bad.ckpt", state_dict={name: weights}))
    assert load_checkpoint(_checkpoint(tmp_path, ranknet)) is not None  # the unedited file loads


def test_a_lambdamart_checkpoint_with_bad_trees_is_refused(tmp_path):
    import pytorch_lightning as pl

    from rankkit.infra.checkpoint import load_checkpoint
    from rankkit.boosting import LambdaMARTModule
    from rankkit.training.datamodule import RankingDataModule

    module = LambdaMARTModule(depth=2, min_data_in_leaf=5)
    trainer = pl.Trainer(max_epochs=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path, accelerator="cpu", devices=1)
    trainer.fit(module, datamodule=RankingDataModule("mq2008", max_docs=128))
    good = tmp_path / "good.ckpt"
    trainer.save_checkpoint(good)
    assert load_checkpoint(good).scorer.n_trees == 2
    ckpt = torch.load(good, weights_only=True)
    for key, index, value, message in (("leaf_values", (0, 1), float("nan"), r"`scorer\.leaf_values` holds nan"),
                                       ("thresholds", (1, 0), float("nan"), r"`scorer\.thresholds` holds nan"),
                                       ("bias", (), float("inf"), r"`scorer\.bias` holds inf"),
                                       ("leaf_values", (slice(None), slice(None)), 3e38,
                                        r"sum to .* beyond float32's range")):
        edited = {k: v.clone() for k, v in ckpt["state_dict"].items()}
        edited[f"scorer.{key}"][index] = value
        path = tmp_path / f"bad-{key}.ckpt"
        torch.save({**ckpt, "state_dict": edited}, path)
        with pytest.raises(ValueError, match=message):
            load_checkpoint(path)
