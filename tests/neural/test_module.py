"""RankNet / LambdaRank: the lambda-injecting Function, scorers, Lightning training, export."""
from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import pytorch_lightning as pl
import torch

from rankkit.data import make_synthetic
from rankkit.training.datamodule import RankingDataModule
from rankkit.export import export_program, export_torchscript, load_scorer
from rankkit.metrics import ndcg
from rankkit.neural import LambdaRank, MLPScorer, RankNet


# -- scorers ------------------------------------------------------------------------------------------
def test_preprocessor_standardises_and_handles_nan():
    x = torch.randn(200, 3) * torch.tensor([1.0, 100.0, 0.0]) + 5
    scorer = MLPScorer(3, (4,), log1p=False)
    scorer.preprocess.fit(x)
    z = scorer.preprocess(x)
    torch.testing.assert_close(z[:, :2].mean(0), torch.zeros(2), atol=1e-4, rtol=0)
    torch.testing.assert_close(z[:, :2].std(0), torch.ones(2), atol=1e-2, rtol=0)
    assert (z[:, 2] == 0).all()  # constant feature: std kept at 1, centred
    assert torch.isfinite(scorer(torch.tensor([[float("nan"), 1e30, -1e30]]))).all()
    signed = MLPScorer(1, (2,), standardize=False).preprocess(torch.tensor([[-(math.e - 1)], [math.e - 1]]))
    torch.testing.assert_close(signed, torch.tensor([[-1.0], [1.0]]))


def test_scorer_validates():
    with pytest.raises(ValueError, match="activation"):
        MLPScorer(3, activation="swish")
    with pytest.raises(ValueError, match="norm"):
        MLPScorer(3, norm="batch")


# -- Lightning ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_data():
    full = make_synthetic(120, (5, 30), 10, seed=0)
    return full.subset(range(80)), full.subset(range(80, 100)), full.subset(range(100, 120))


def make_trainer(tmp_path, epochs, **kw):
    return pl.Trainer(max_epochs=epochs, accelerator="cpu", logger=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=tmp_path, deterministic=True, **kw)


def test_end_to_end_training_improves_and_early_stops(tmp_path, tiny_data):
    train, val, test = tiny_data
    pl.seed_everything(0, verbose=False)
    dm = RankingDataModule.from_datasets(train, val, test, max_docs=256)
    model = LambdaRank(n_features=train.n_features, hidden=[32], lr=1e-2, k=10)
    ckpt = pl.callbacks.ModelCheckpoint(monitor="val/ndcg@10", mode="max", dirpath=tmp_path)
    stop = pl.callbacks.EarlyStopping(monitor="val/ndcg@10", mode="max", patience=3)
    trainer = make_trainer(tmp_path, 8, callbacks=[ckpt, stop], enable_checkpointing=True)
    batch = test.padded()
    trainer.fit(model, datamodule=dm)  # fits the scorer's preprocessing on the training loader
    assert model.hparams.n_features == 10
    model.eval()
    with torch.no_grad():
        after = ndcg(model(batch.features), batch.labels, mask=batch.mask, k=10).mean()
    random_score = ndcg(torch.randn(batch.labels.shape), batch.labels, mask=batch.mask, k=10).mean()
    assert after > random_score + 0.05
    result = trainer.test(model, datamodule=dm, verbose=False)[0]
    assert set(result) >= {"test/ndcg@1", "test/ndcg@3", "test/ndcg@5", "test/ndcg@10", "test/map"}
    assert abs(result["test/ndcg@10"] - float(after)) < 1e-4
    best = LambdaRank.load_from_checkpoint(ckpt.best_model_path)
    assert best.hparams.weighting == "ndcg" and best.scorer is not None


def _params(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.parametrize("ema_decay", [0.0, 0.9])
def test_same_seed_same_model_and_exact_resume(tmp_path, tiny_data, ema_decay):
    train, val, _ = tiny_data

    def run(epochs, ckpt_path=None, root=tmp_path):
        pl.seed_everything(3, verbose=False)
        dm = RankingDataModule.from_datasets(train, val, max_docs=128, seed=5)
        model = RankNet(n_features=10, hidden=[16], dropout=0.2, lr=5e-3, ema_decay=ema_decay)
        trainer = make_trainer(root, epochs, enable_checkpointing=True,
                               callbacks=[pl.callbacks.ModelCheckpoint(dirpath=root, save_last=True)])
        trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
        return model

    a = run(3, root=tmp_path / "a")
    b = run(3, root=tmp_path / "b")
    assert torch.equal(_params(a), _params(b))
    run(1, root=tmp_path / "c")
    resumed = run(3, ckpt_path=str(tmp_path / "c" / "last.ckpt"), root=tmp_path / "c")
    assert torch.equal(_params(a), _params(resumed))


def test_weight_average_follows_the_ema_rule_and_is_what_serves(tmp_path):
    torch.manual_seed(0)
    model = LambdaRank(n_features=6, hidden=[8], dropout=0.0, ema_decay=0.75)
    model.fit_preprocessor(torch.randn(50, 6))
    start = [p.detach().clone() for p in model.scorer.parameters()]
    assert all(torch.equal(a, p) for a, p in zip(model.averaged_scorer.parameters(), start))
    with torch.no_grad():
        for p in model.scorer.parameters():
            p.add_(1.0)
    model.on_train_batch_end(None, None, 0)
    for avg, p0 in zip(model.averaged_scorer.parameters(), start):
        torch.testing.assert_close(avg, 0.75 * p0 + 0.25 * (p0 + 1.0))
    assert not any(p.requires_grad for p in model.averaged_scorer.parameters())
    assert len(model.configure_optimizers().param_groups[0]["params"]) == len(start)  # only the scorer
    model.eval()
    x = torch.randn(20, 6)
    path = export_torchscript(model, tmp_path / "avg.pt")
    with torch.no_grad():
        torch.testing.assert_close(load_scorer(path, trust_torchscript=True)(x), model(x))
        torch.testing.assert_close(model(x), model.averaged_scorer(x))
        assert not torch.allclose(model(x), model.scorer(x))
    with pytest.raises(ValueError, match="ema_decay"):
        LambdaRank(n_features=3, ema_decay=1.0)


def test_modules_validate_weighting():
    with pytest.raises(ValueError, match="weighting"):
        RankNet(n_features=3, weighting="ndcg")
    with pytest.raises(ValueError, match="weighting"):
        LambdaRank(n_features=3, weighting="ranknet")
    assert LambdaRank(n_features=3, weighting="err", k=5).hparams.k == 5


# -- export ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["torchscript", "export"])
def test_export_roundtrip(tmp_path, fmt):
    torch.manual_seed(0)
    model = LambdaRank(n_features=6, hidden=[16, 8], dropout=0.3, norm="layer")
    model.fit_preprocessor(torch.randn(100, 6) * 10)
    model.eval()
    path = tmp_path / ("scorer.pt" if fmt == "torchscript" else "scorer.pt2")
    (export_torchscript if fmt == "torchscript" else export_program)(model, path)
    served = load_scorer(path, trust_torchscript=True)
    for n in (1, 10_000):
        x = torch.randn(n, 6) * 5
        with torch.no_grad():
            torch.testing.assert_close(served(x), model(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(Exception, match=r"\[N, 6\]|6"):
        served(torch.randn(3, 5))


def test_torchscript_loads_without_rankkit(tmp_path):
    torch.manual_seed(0)
    model = RankNet(n_features=4, hidden=[8])
    path = export_torchscript(model, tmp_path / "s.pt")
    x = torch.randn(5, 4)
    expected = model.eval()(x)
    torch.save(x, tmp_path / "x.pt")
    code = ("import sys; sys.modules['rankkit'] = None\n"
            "import torch\n"
            f"m = torch.jit.load({str(path)!r})\n"
            f"x = torch.load({str(tmp_path / 'x.pt')!r}, weights_only=True)\n"
            "print(','.join(f'{v:.6f}' for v in m(x).tolist()))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": ""}).stdout
    got = torch.tensor([float(v) for v in out.strip().split(",")])
    torch.testing.assert_close(got, expected.detach(), atol=1e-5, rtol=1e-5)


class UserScorer(torch.nn.Module):
    """A scorer a user writes: its own preprocessing (rankkit's) and a bilinear layer."""

    def __init__(self, n_features: int):
        super().__init__()
        from rankkit.scorers import FeaturePreprocessor

        self.pre = FeaturePreprocessor(n_features)
        self.inner = torch.nn.Bilinear(n_features, n_features, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.pre(x)
        return self.inner(z, z).squeeze(-1)


@pytest.mark.parametrize("fmt", ["torchscript", "export"])
def test_lambdarank_trains_a_users_scorer_and_exports_it(tmp_path, tiny_data, fmt):
    train, val, _ = tiny_data
    pl.seed_everything(0, verbose=False)
    scorer = UserScorer(train.n_features)
    model = LambdaRank(scorer=scorer, lr=1e-2)
    assert model.scorer is scorer and model.hparams.n_features is None
    before = [p.detach().clone() for p in scorer.parameters()]
    trainer = make_trainer(tmp_path, 2, enable_checkpointing=True,
                           callbacks=[pl.callbacks.ModelCheckpoint(dirpath=tmp_path, save_last=True)])
    trainer.fit(model, datamodule=RankingDataModule.from_datasets(train, val, max_docs=256))
    assert all(not torch.equal(a, p) for a, p in zip(before, scorer.parameters()))  # it trained
    # The preprocessing inside the user's scorer was fitted on the training loader's documents.
    expected = _feature_stats(train.features)
    torch.testing.assert_close(scorer.pre.mean, expected[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(scorer.pre.std, expected[1], rtol=1e-4, atol=1e-5)
    path = tmp_path / ("s.pt" if fmt == "torchscript" else "s.pt2")
    (export_torchscript if fmt == "torchscript" else export_program)(model, path, n_features=train.n_features)
    x = val.features
    with torch.no_grad():
        torch.testing.assert_close(load_scorer(path, trust_torchscript=True)(x), model.eval()(x), rtol=1e-5, atol=1e-5)
    restored = LambdaRank.load_from_checkpoint(tmp_path / "last.ckpt", scorer=UserScorer(train.n_features))
    with torch.no_grad():
        torch.testing.assert_close(restored.eval()(x), model(x))


def _feature_stats(x):
    from rankkit.scorers import FeaturePreprocessor

    pre = FeaturePreprocessor(x.shape[1]).fit(x)
    return pre.mean, pre.std


def test_a_module_needs_a_scorer_or_its_feature_count():
    with pytest.raises(ValueError, match="n_features.*scorer"):
        LambdaRank()
    with pytest.raises(ValueError, match="`scorer`"):
        LambdaRank(scorer="mlp")


@pytest.mark.parametrize("loss", ["softmax", "ndcg_loss2pp"])
def test_a_named_loss_trains_the_neural_ranker_with_the_registrys_gradient(tmp_path, tiny_data, loss):
    from rankkit.losses import objective_gradients

    train, val, _ = tiny_data
    model = LambdaRank(n_features=train.n_features, hidden=[8], dropout=0.0, loss=loss, reduction="sum")
    model.fit_preprocessor(train.features)
    batch = train.padded(list(range(6)))
    scores = model.scorer(batch.features)
    model.objective(scores, batch).backward()
    grad, _, _ = objective_gradients(loss, scores.detach(), batch.labels, mask=batch.mask)
    # The scorer's last layer gets Σ grad_i ∂s_i/∂w: compare through the scores' own gradient.
    s = scores.detach().requires_grad_(True)
    model.objective(s, batch).backward()
    torch.testing.assert_close(s.grad, grad)
    pl.seed_everything(0, verbose=False)
    make_trainer(tmp_path, 1).fit(model, datamodule=RankingDataModule.from_datasets(train, val, max_docs=256))
    with pytest.raises(ValueError, match="`loss`"):
        LambdaRank(n_features=3, loss="nosuch")


def test_warmup_cosine_warms_up_then_decays_per_step(tmp_path):
    """scheduler="warmup_cosine": the lr each training step saw, against the formula
    (linear warm-up over the first 5 % of the steps, cosine to 0 at the last)."""
    train = make_synthetic(40, (3, 12), 6, seed=0)
    dm = RankingDataModule.from_datasets(train, train.subset(range(8)), max_docs=32)
    model = LambdaRank(n_features=6, hidden=[8], lr=0.01, scheduler="warmup_cosine")
    seen = []

    class Lr(pl.Callback):
        def on_train_batch_start(self, trainer, *_):
            seen.append(trainer.optimizers[0].param_groups[0]["lr"])

    trainer = pl.Trainer(max_epochs=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[Lr()], default_root_dir=tmp_path)
    trainer.fit(model, datamodule=dm)
    total = len(seen)
    warm = max(1, total // 20)
    assert total == trainer.estimated_stepping_batches and total >= 20
    for t, lr in enumerate(seen):
        want = (t + 1) / warm if t < warm else 0.5 * (1 + math.cos(math.pi * (t - warm) / (total - 1 - warm)))
        assert lr == pytest.approx(0.01 * want, rel=1e-9, abs=1e-12), t
    assert seen[-1] == pytest.approx(0.0, abs=1e-12) and max(seen) == pytest.approx(0.01)


def test_a_config_passes_the_scorer_as_a_class_path(tmp_path):
    """The model apart from its training: a YAML names the scorer module and its arguments, the
    LightningModule trains whatever it is given (the default scorer's options are then unused)."""
    from rankkit.scorers import MLPScorer
    from rankkit.training.lightning_cli import lightning_cli

    config = tmp_path / "scorer.yaml"
    config.write_text("model:\n  class_path: rankkit.neural.LambdaRank\n  init_args:\n    scorer:\n"
                      "      class_path: rankkit.scorers.MLPScorer\n"
                      "      init_args: {n_features: 46, hidden: [16], norm: layer}\n"
                      "data: {data: mq2008, fold: 1}\n")
    cli = lightning_cli(["--config", str(config), f"--trainer.default_root_dir={tmp_path}"], run=False,
                        verbose=False)
    scorer = cli.model.scorer
    assert type(scorer) is MLPScorer and scorer.n_features == 46
    assert [m.out_features for m in scorer.net if isinstance(m, torch.nn.Linear)] == [16, 1]
    assert any(isinstance(m, torch.nn.LayerNorm) for m in scorer.net)
