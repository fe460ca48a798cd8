"""NeuralNDCG: against an explicit float64 reference (full-matrix Sinkhorn, per-element loops) and
its autograd, its limit (τ → 0 gives 1 − NDCG@k), padding, chunking, L = 1000, and training."""
from __future__ import annotations

import math

import pytest
import torch

from rankkit.losses import LISTWISE, OBJECTIVES, _query_chunks, neural_ndcg_loss
from rankkit.metrics import ndcg
from rankkit.neural import lambda_loss


def batch(seed=0, q=4, length=7):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(q, length, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 4, (q, length), generator=g).double()
    lengths = torch.randint(1, length + 1, (q,), generator=g)
    lengths[0] = length
    mask = torch.arange(length) < lengths[:, None]
    mask[2] = mask[2].flip(0)  # padding first
    mask[3, 1::3] = False  # padding between real documents
    labels[1] = 0.0  # a query with nothing relevant: loss 0, no gradient
    return scores, labels, mask


def reference(scores, labels, mask, *, temperature, k, iterations, gain="exp"):
    """Per-query loss [Q] of NeuralNDCG written element by element (float64, autograd-able): the
    NeuralSort matrix by loops, full-matrix Sinkhorn (columns, then rows), unshifted gains."""
    losses = []
    for q in range(scores.shape[0]):
        idx = mask[q].nonzero()[:, 0]
        n = len(idx)
        s = scores[q, idx]
        y = [float(v) for v in labels[q, idx]]
        g = [(2 ** v - 1) if gain == "exp" else v for v in y]
        cut = n if k is None else min(k, n)
        idcg = sum(x / math.log2(r + 2) for r, x in enumerate(sorted(g, reverse=True)[:cut]))
        if idcg == 0:
            losses.append(scores.sum() * 0.0)
            continue
        rows = []
        for r in range(1, n + 1):
            logits = torch.stack([((n + 1 - 2 * r) * s[j] - sum((s[j] - s[m]).abs() for m in range(n)))
                                  / temperature for j in range(n)])
            rows.append(torch.exp(logits - logits.max()) / torch.exp(logits - logits.max()).sum())
        p = torch.stack(rows)
        for _ in range(iterations):
            p = p / p.sum(0, keepdim=True)
            p = p / p.sum(1, keepdim=True)
        gains = torch.tensor(g, dtype=torch.float64)
        dcg = sum((p[r] * gains).sum() / math.log2(r + 2) for r in range(cut))
        losses.append(1.0 - dcg / idcg)
    return torch.stack(losses)


@pytest.mark.parametrize("temperature, k, iterations, gain", [(1.0, None, 50, "exp"), (0.3, 3, 20, "exp"),
                                                            (2.0, 5, 0, "linear"), (0.5, 1, 5, "exp")])
def test_loss_and_gradient_match_the_explicit_reference(temperature, k, iterations, gain):
    scores, labels, mask = batch()
    grad, hess, loss = neural_ndcg_loss(scores, labels, mask=mask, temperature=temperature, k=k,
                                        sinkhorn_iterations=iterations, gain=gain)
    leaf = scores.clone().requires_grad_(True)
    expected = reference(leaf, labels, mask, temperature=temperature, k=k, iterations=iterations, gain=gain)
    (expected_grad,) = torch.autograd.grad(expected.sum(), leaf)
    torch.testing.assert_close(loss, expected.detach(), rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(grad, expected_grad.masked_fill(~mask, 0.0), rtol=1e-7, atol=1e-10)
    assert bool((hess >= 0).all()) and bool((hess[~mask] == 0).all()) and bool((grad[~mask] == 0).all())
    assert float(loss[1]) == 0.0 and bool((grad[1] == 0).all())


@pytest.mark.parametrize("k", [None, 1, 3])
@pytest.mark.parametrize("iterations", [0, 30])
def test_temperature_to_zero_gives_ndcg(k, iterations):
    scores, labels, mask = batch(seed=3, q=6, length=9)
    scores = torch.argsort(torch.rand(scores.shape, generator=torch.Generator().manual_seed(1))).double()  # distinct
    _, _, loss = neural_ndcg_loss(scores, labels, mask=mask, temperature=1e-3, k=k, sinkhorn_iterations=iterations)
    torch.testing.assert_close(1.0 - loss, ndcg(scores, labels, mask=mask, k=k), rtol=0, atol=1e-9)
    _, _, warm = neural_ndcg_loss(scores, labels, mask=mask, temperature=5.0, k=k, sinkhorn_iterations=iterations)
    assert float((warm - loss).abs().max()) > 1e-3  # the limit is a limit, not the value everywhere


def test_padding_and_chunking_change_nothing():
    scores, labels, mask = batch(seed=5)
    full = neural_ndcg_loss(scores, labels, mask=mask)
    wide = lambda t, fill: torch.cat([t, torch.full((t.shape[0], 3), fill, dtype=t.dtype)], 1)  # noqa: E731
    padded = neural_ndcg_loss(wide(scores, 1e3), wide(labels, 2.0), mask=wide(mask, False))
    one_query_chunks = neural_ndcg_loss(scores, labels, mask=mask, workspace=1)
    for a, b in zip(full, one_query_chunks):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    for a, b in zip(full, padded):
        torch.testing.assert_close(a, b[:, : scores.shape[1]] if a.dim() == 2 else b, rtol=1e-12, atol=1e-14)


def test_a_thousand_documents_run_in_bounded_chunks():
    assert _query_chunks(8, 1000, 2**22) == [(0, 4), (4, 8)]
    assert _query_chunks(2, 5000, 2**22) == [(0, 1), (1, 2)]  # a query at least
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 1000, generator=g)
    labels = torch.randint(0, 3, (2, 1000), generator=g).float()
    grad, hess, loss = neural_ndcg_loss(scores, labels, sinkhorn_iterations=10)
    assert grad.dtype == torch.float32 and bool(torch.isfinite(grad).all()) and bool((loss > 0).all())
    assert bool((loss < 1).all())


def test_registered_and_trains_through_the_lambda_loss():
    assert "neural_ndcg" in LISTWISE and OBJECTIVES["neural_ndcg"] is neural_ndcg_loss
    scores, labels, mask = batch(seed=2)
    leaf = scores.clone().requires_grad_(True)
    value = lambda_loss(leaf, labels, mask=mask, loss="neural_ndcg", reduction="sum")
    value.backward()
    expected = reference(scores.clone().requires_grad_(True), labels, mask, temperature=1.0, k=None, iterations=50)
    torch.testing.assert_close(value.detach(), expected.sum().detach(), rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(leaf.grad, neural_ndcg_loss(scores, labels, mask=mask)[0])
    # a descent step lowers the loss
    step = scores - 0.5 * leaf.grad
    assert float(neural_ndcg_loss(step, labels, mask=mask)[2].sum()) < float(value)


def test_validates():
    scores, labels, mask = batch()
    with pytest.raises(ValueError, match="temperature"):
        neural_ndcg_loss(scores, labels, temperature=0.0)
    with pytest.raises(ValueError, match="sinkhorn_iterations"):
        neural_ndcg_loss(scores, labels, sinkhorn_iterations=-1)


def test_the_booster_takes_it_with_its_positive_surrogate_hessian():
    from rankkit.boosting import LambdaMART
    from rankkit.data import make_synthetic

    data = make_synthetic(40, (4, 12), 5, seed=0)
    model = LambdaMART(objective="neural_ndcg", n_estimators=15, depth=3, min_data_in_leaf=3,
                       learning_rate=0.3).fit(data)
    batch = data.padded()
    scores = torch.as_tensor(model.predict(data)).float()
    from rankkit.data.dataset import pad

    trained = ndcg(pad(scores, data.sizes)[0], batch.labels, mask=batch.mask, k=10).mean()
    untrained = ndcg(torch.zeros_like(batch.labels), batch.labels, mask=batch.mask, k=10).mean()
    assert trained > untrained + 0.05


# -- loss_options: the listwise loss's own options through the neural modules --------------------
def _module_gradient(model, scores, labels, mask):
    from rankkit.data.dataset import PaddedBatch

    s = scores.clone().requires_grad_(True)
    model.objective(s, PaddedBatch(features=torch.zeros(*scores.shape, 1), labels=labels, mask=mask)).backward()
    return s.grad


def test_loss_options_reach_the_listwise_loss():
    from rankkit.neural import LambdaRank

    scores, labels, mask = batch(seed=5)
    plain = LambdaRank(n_features=1, loss="neural_ndcg", reduction="sum")
    tuned = LambdaRank(n_features=1, loss="neural_ndcg", reduction="sum",
                       loss_options={"temperature": 0.3, "k": 3, "sinkhorn_iterations": 20})
    expected = neural_ndcg_loss(scores, labels, mask=mask, temperature=0.3, k=3, sinkhorn_iterations=20)[0]
    torch.testing.assert_close(_module_gradient(tuned, scores, labels, mask), expected)
    torch.testing.assert_close(_module_gradient(plain, scores, labels, mask),
                               neural_ndcg_loss(scores, labels, mask=mask)[0])
    assert not torch.allclose(expected, neural_ndcg_loss(scores, labels, mask=mask)[0])  # the option matters
    # and the explicit float64 reference agrees with what the module trains on
    leaf = scores.clone().requires_grad_(True)
    (ref,) = torch.autograd.grad(reference(leaf, labels, mask, temperature=0.3, k=3, iterations=20).sum(), leaf)
    torch.testing.assert_close(expected, ref.masked_fill(~mask, 0.0), rtol=1e-7, atol=1e-10)
    # a pairwise weighting takes its kernel's options the same way
    linear = LambdaRank(n_features=1, weighting="ndcg", reduction="sum", loss_options={"gain": "linear"})
    exp = LambdaRank(n_features=1, weighting="ndcg", reduction="sum")
    g_lin = _module_gradient(linear, scores.float(), labels.float(), mask)
    torch.testing.assert_close(g_lin, lambda_loss_grad(scores.float(), labels.float(), mask, gain="linear"))
    assert not torch.allclose(g_lin, _module_gradient(exp, scores.float(), labels.float(), mask))


def lambda_loss_grad(scores, labels, mask, **options):
    from rankkit.losses import objective_gradients

    return objective_gradients("ndcg", scores, labels, mask=mask, **options)[0]


def test_loss_options_are_validated_naming_the_key():
    from rankkit.neural import LambdaRank, RankNet

    with pytest.raises(ValueError, match="'temprature' is not an option of the objective 'neural_ndcg'.*temperature"):
        LambdaRank(n_features=1, loss="neural_ndcg", loss_options={"temprature": 0.5})
    with pytest.raises(ValueError, match="loss_options.*temperature"):
        LambdaRank(n_features=1, loss="neural_ndcg", loss_options={"temperature": -1.0})
    with pytest.raises(ValueError, match="'k' of the pairwise objective 'ndcg' is the module's own.*`k=`"):
        LambdaRank(n_features=1, loss_options={"k": 3})
    with pytest.raises(ValueError, match="'generator' is not an option"):
        LambdaRank(n_features=1, loss="xendcg", loss_options={"generator": 1})
    with pytest.raises(ValueError, match="'mu' is not an option of the objective 'ranknet'"):
        RankNet(n_features=1, loss_options={"mu": 2.0})
    with pytest.raises(ValueError, match="'gain' has to be a plain value"):
        LambdaRank(n_features=1, loss="neural_ndcg", loss_options={"gain": ["exp"]})
    with pytest.raises(ValueError, match="`loss_options` has to be a dict"):
        LambdaRank(n_features=1, loss="neural_ndcg", loss_options=[("k", 3)])
    RankNet(n_features=1, loss="ndcg_loss2pp", loss_options={"mu": 5.0})


def test_loss_options_are_kept_in_checkpoints_and_read_from_yaml(tmp_path):
    import pytorch_lightning as pl
    from jsonargparse import ArgumentParser

    from rankkit.infra.checkpoint import load_checkpoint
    from rankkit.data import make_synthetic
    from rankkit.training.datamodule import RankingDataModule
    from rankkit.neural import LambdaRank

    options = {"temperature": 0.5, "k": 5, "sinkhorn_iterations": 5}
    parser = ArgumentParser()
    parser.add_class_arguments(LambdaRank, "model")
    cfg = parser.parse_string("model:\n  n_features: 4\n  hidden: [8]\n  loss: neural_ndcg\n"
                              "  loss_options: {temperature: 0.5, k: 5, sinkhorn_iterations: 5}\n")
    model = parser.instantiate(cfg).model
    assert model.hparams.loss_options == options
    data = make_synthetic(12, (3, 8), 4, seed=0)
    pl.seed_everything(0, verbose=False)
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path)
    trainer.fit(model, datamodule=RankingDataModule.from_datasets(data, data, max_docs=64))
    path = tmp_path / "m.ckpt"
    trainer.save_checkpoint(path)
    for loaded in (load_checkpoint(path), LambdaRank.load_from_checkpoint(path)):
        assert loaded.hparams.loss_options == options
    bad = torch.load(path, weights_only=True)
    bad["hyper_parameters"]["loss_options"] = {"temperature": [0.5] * 3}
    torch.save(bad, tmp_path / "bad.ckpt")
    with pytest.raises(ValueError, match="`loss_options` has to map names to plain values"):
        load_checkpoint(tmp_path / "bad.ckpt")
    bad["hyper_parameters"]["loss_options"] = {"class_path": "os.system"}
    torch.save(bad, tmp_path / "bad.ckpt")
    with pytest.raises(ValueError, match="class_path"):
        load_checkpoint(tmp_path / "bad.ckpt")


# -- extreme scores: float64 inside --------------------------------------------------------------
@pytest.mark.parametrize("temperature", [1e-3, 1.0, 10.0])
@pytest.mark.parametrize("iterations", [0, 50])
def test_finite_at_extreme_float32_scores(temperature, iterations):
    big = 3e38
    scores = torch.tensor([[big, -big, 0.0, 1.0, 0.0], [big, big, -big, -big, 5.0],
                           [-big, big / 3, -big / 3, big, 0.0]], dtype=torch.float32)
    labels = torch.tensor([[0.0, 1.0, 2.0, 1.0, 0.0], [1.0, 0.0, 2.0, 0.0, 3.0], [2.0, 0.0, 1.0, 3.0, 0.0]])
    mask = torch.ones_like(scores, dtype=torch.bool)
    mask[0, 4] = mask[2, 4] = False
    grad, hess, loss = neural_ndcg_loss(scores, labels, mask=mask, temperature=temperature,
                                        sinkhorn_iterations=iterations)
    assert grad.dtype == hess.dtype == loss.dtype == torch.float32
    for t in (grad, hess, loss):
        assert bool(torch.isfinite(t).all())
    assert bool(((loss >= 0) & (loss <= 1)).all()) and bool((hess >= 0).all())
    # four well-separated huge scores: the relaxation is the hard sort, the loss 1 − NDCG
    torch.testing.assert_close(loss[2], 1.0 - ndcg(scores[2:], labels[2:], mask=mask[2:])[0], rtol=0, atol=1e-6)


def test_float32_scores_match_the_float64_reference():
    scores, labels, mask = batch(seed=4)
    scores32 = scores.float()
    grad, _, loss = neural_ndcg_loss(scores32, labels.float(), mask=mask, temperature=0.5, k=4,
                                     sinkhorn_iterations=20)
    leaf = scores32.double().requires_grad_(True)
    expected = reference(leaf, labels, mask, temperature=0.5, k=4, iterations=20)
    (expected_grad,) = torch.autograd.grad(expected.sum(), leaf)
    torch.testing.assert_close(loss, expected.detach().float(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad, expected_grad.masked_fill(~mask, 0.0).float(), rtol=1e-6, atol=1e-7)
