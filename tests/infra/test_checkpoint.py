"""rankkit.infra.checkpoint: nothing is unpickled, no class or size is the file's choice, the same
model as Lightning's loader, and every entry point (API, CLI, Lightning's loader, a Trainer's
ckpt_path) is guarded."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch


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

    from rankkit.boosting import LambdaMARTModule
    from rankkit.infra.checkpoint import load_checkpoint
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
    # Derived buffers are rebuilt, never read (round 4: an edited `powers` was an IndexError when scoring).
    edited = {k: v.clone() for k, v in ckpt["state_dict"].items()}
    edited["scorer.powers"] = torch.tensor([1 << 40, -7])
    torch.save({**ckpt, "state_dict": edited}, tmp_path / "powers.ckpt")
    loaded = load_checkpoint(tmp_path / "powers.ckpt")
    assert loaded.scorer.powers.tolist() == [1, 2]
    x = torch.rand(5, loaded.scorer.n_features)
    torch.testing.assert_close(loaded.scorer(x), load_checkpoint(good).scorer(x))


def test_a_recorded_custom_loss_is_text_on_every_loading_route(tmp_path, ranknet):
    """Round 4's last route: ``load_checkpoint(path)`` (or Lightning's ``load_from_checkpoint``)
    then ``Trainer.fit`` in Python imported the loss the checkpoint names. Every loader now hands
    it over as a RecordedName: the model loads and scores, and training refuses to import it."""
    import sys

    import pytorch_lightning as pl

    from rankkit.boosting import LambdaMARTModule
    from rankkit.infra.checkpoint import RecordedName, load_checkpoint
    from rankkit.neural import RankNet
    from rankkit.training.datamodule import RankingDataModule

    trees = LambdaMARTModule(depth=2, min_data_in_leaf=5)
    trainer = pl.Trainer(max_epochs=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path, accelerator="cpu", devices=1, enable_checkpointing=False)
    data = RankingDataModule("mq2008", max_docs=128)
    trainer.fit(trees, datamodule=data)
    trainer.save_checkpoint(tmp_path / "trees.ckpt")
    planted = {"objective": "planted_module.loss", "k": None, "normalize": False}
    ckpt = torch.load(tmp_path / "trees.ckpt", weights_only=True)
    torch.save({**ckpt, "hyper_parameters": {**ckpt["hyper_parameters"], **planted}}, tmp_path / "t.ckpt")
    nets = _checkpoint(tmp_path, ranknet, "n.ckpt", hyper_parameters={"loss": "planted_module.loss"})
    trees_file = tmp_path / "t.ckpt"
    cases = [("load_checkpoint", load_checkpoint, trees_file), ("load_checkpoint", load_checkpoint, nets),
             ("LambdaMARTModule.load_from_checkpoint", LambdaMARTModule.load_from_checkpoint, trees_file),
             ("RankNet.load_from_checkpoint", RankNet.load_from_checkpoint, nets)]
    for route, load, file in cases:
        model = load(file)
        trees_model = isinstance(model, LambdaMARTModule)
        name = model.config.objective if trees_model else model.training_objective.custom_loss
        assert isinstance(name, RecordedName) and name == "planted_module.loss", route
        assert not isinstance(model.hparams["objective" if trees_model else "loss"], RecordedName), route
        fit = pl.Trainer(max_epochs=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path, accelerator="cpu", devices=1, enable_checkpointing=False)
        with pytest.raises(ValueError, match=r"'planted_module\.loss' was read from a model file"):
            fit.fit(model, datamodule=RankingDataModule("mq2008", max_docs=128) if trees_model else _tiny_data())
    assert "planted_module" not in sys.modules
    # a built-in's name is no code: left as it is
    from rankkit.infra.checkpoint import recorded_names
    assert recorded_names({"objective": "lambdarank", "loss": "rankkit.custom.TorchLoss<x.y>"}) == {
        "loss": "rankkit.custom.TorchLoss<x.y>"}


def _tiny_data():
    from rankkit.data import make_synthetic
    from rankkit.training.datamodule import RankingDataModule

    return RankingDataModule.from_datasets(make_synthetic(8, 6, 5, seed=0), make_synthetic(4, 6, 5, seed=1),
                                           max_docs=64)


# -- every loader: nothing is ever unpickled (a route-discovering test, trust round 4) -------------
#: The only places that deserialise a file, and their guard.
LOADERS = {
    ("rankkit/infra/checkpoint.py", "load"): "torch.load(weights_only=True): checkpoints",
    ("rankkit/data/dataset.py", "load"): "np.load(allow_pickle=False): dataset caches",
}


def _deserialising_calls():
    """(file, called function, line, its keywords) of every torch.load / np.load / pickle / marshal /
    yaml.load / yaml.unsafe_load call in rankkit."""
    import ast

    root = Path(__file__).resolve().parents[2]
    found = []
    for path in sorted((root / "rankkit").rglob("*.py")):
        rel = str(path.relative_to(root))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
                assert not {"pickle", "cloudpickle", "dill", "marshal", "shelve", "joblib"} & set(names), (rel, names)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = getattr(node.func.value, "id", "")
                if (owner, node.func.attr) in (("torch", "load"), ("np", "load"), ("yaml", "load"),
                                               ("yaml", "unsafe_load"), ("yaml", "full_load")):
                    found.append((rel, f"{owner}.{node.func.attr}", node.lineno,
                                  {k.arg: getattr(k.value, "value", None) for k in node.keywords}))
    return found


def test_no_file_is_ever_unpickled_on_any_loading_route():
    calls = _deserialising_calls()
    assert {(f, name.split(".")[1]) for f, name, _, _ in calls} == set(LOADERS), calls  # no new route
    for file, name, line, keywords in calls:
        if name == "torch.load":
            assert keywords.get("weights_only") is True, f"{file}:{line}"
        elif name == "np.load":
            assert keywords.get("allow_pickle") is False, f"{file}:{line}"
        else:
            raise AssertionError(f"{file}:{line}: {name} may build objects; use yaml.safe_load (rankkit.infra.yaml)")


def test_the_rng_state_round_trips_and_a_missing_one_is_left_alone():
    from rankkit.infra.checkpoint import restore_rng, rng_state

    state = rng_state()
    first = torch.rand(3)
    restore_rng(state)
    assert torch.equal(torch.rand(3), first)  # the same draws again
    before = torch.get_rng_state()
    restore_rng({})
    assert torch.equal(torch.get_rng_state(), before)
