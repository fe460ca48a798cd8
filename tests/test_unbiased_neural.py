"""Unbiased neural rankers: RankNet / LambdaRank with ``unbiased=True`` on click logs.

The module's training gradient on a batch is checked against the lambda kernel in float64 with
the estimator's pair weights (LambdaRank) and against a per-pair double loop (RankNet); a short
Lightning fit on a simulated log learns click biases that fall with the displayed position.
"""
from __future__ import annotations

import math

import pytorch_lightning as pl
import pytest
import torch

from rankkit.data import make_synthetic
from rankkit.data.clicks import PositionBasedModel, simulate_clicks
from rankkit.data.datamodule import RankingDataModule
from rankkit.lambdas import lambda_gradients
from rankkit.neural import LambdaRank, RankNet
from rankkit.unbiased import PropensityEstimator

N_POSITIONS = 6


@pytest.fixture(scope="module")
def click_log():
    """PBM η = 1 clicks on the top 6 of lists shown in random order."""
    data = make_synthetic(60, (4, 12), 5, seed=0)
    scores = torch.rand(data.n_docs, generator=torch.Generator().manual_seed(0))
    log = simulate_clicks(data, scores, model=PositionBasedModel(eta=1.0, max_label=4), sessions_per_query=4,
                          k=N_POSITIONS, seed=0, drop_unclicked=True)
    return data, log


def batch_gradient(module, batch):
    """The module's training gradient in the scores [Q, L] of one batch, and those scores."""
    scores = module.scorer(batch.features).detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(module.objective(scores, batch), scores)
    return scores.detach(), grad


def test_lambdarank_gradient_is_the_debiased_kernel(click_log):
    _, log = click_log
    torch.manual_seed(0)
    module = LambdaRank(n_features=5, hidden=[8], dropout=0.0, log1p=False, standardize=False, k=4,
                        reduction="sum", unbiased=True, n_positions=N_POSITIONS)
    batch = log.sessions.padded()
    scores, grad = batch_gradient(module, batch)
    est = PropensityEstimator(N_POSITIONS, p=1.0, k=4).update(scores.double(), batch.labels.double(),
                                                               batch.position, batch.mask)
    torch.testing.assert_close(module.propensities["clicked"], est.t_plus)
    torch.testing.assert_close(module.propensities["unclicked"], est.t_minus)
    assert not torch.equal(est.t_plus, torch.ones(N_POSITIONS, dtype=torch.float64))  # the weights matter
    upper, lower = est.pair_factors(batch.position, batch.mask, dtype=torch.float64)
    expected, _ = lambda_gradients(scores.double(), batch.labels.double(), mask=batch.mask, weighting="ndcg",
                                   k=4, pair_weights=(upper, lower))
    torch.testing.assert_close(grad.double(), expected, rtol=1e-4, atol=1e-6)


def test_ranknet_gradient_against_pair_loop(click_log):
    _, log = click_log
    torch.manual_seed(1)
    module = RankNet(n_features=5, hidden=[8], dropout=0.0, log1p=False, standardize=False, sigma=2.0,
                     reduction="sum", unbiased=True, bias_p=0.0, n_positions=N_POSITIONS)
    batch = log.sessions.padded(torch.arange(40))
    scores, grad = batch_gradient(module, batch)
    est = PropensityEstimator(N_POSITIONS, p=0.0, sigma=2.0, weighting="ranknet")
    est.update(scores.double(), batch.labels.double(), batch.position, batch.mask)
    t_plus, t_minus = est.t_plus.tolist(), est.t_minus.tolist()
    expected = torch.zeros(scores.shape, dtype=torch.float64)
    for q in range(scores.shape[0]):
        for i in range(scores.shape[1]):
            for j in range(scores.shape[1]):
                if batch.mask[q, i] and batch.mask[q, j] and batch.labels[q, i] > batch.labels[q, j]:
                    a = min(int(batch.position[q, i]), N_POSITIONS - 1)
                    b = min(int(batch.position[q, j]), N_POSITIONS - 1)
                    rho = 1.0 / (1.0 + math.exp(2.0 * (float(scores[q, i]) - float(scores[q, j]))))
                    lam = -2.0 * rho / (t_plus[a] * t_minus[b])
                    expected[q, i] += lam
                    expected[q, j] -= lam
    torch.testing.assert_close(grad.double(), expected, rtol=1e-4, atol=1e-6)


def test_short_fit_learns_falling_propensities(tmp_path):
    data = make_synthetic(200, (4, 12), 5, seed=0)
    scores = torch.rand(data.n_docs, generator=torch.Generator().manual_seed(0))
    log = simulate_clicks(data, scores, model=PositionBasedModel(eta=1.0, max_label=4), sessions_per_query=10,
                          k=N_POSITIONS, seed=0, drop_unclicked=True)
    pl.seed_everything(0, verbose=False)
    dm = RankingDataModule.from_datasets(log.sessions, data, None, max_docs=1024)
    module = LambdaRank(n_features=5, hidden=[16], lr=1e-2, unbiased=True, bias_p=0.0, n_positions=N_POSITIONS)
    trainer = pl.Trainer(max_epochs=3, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path)
    trainer.fit(module, datamodule=dm)
    t_plus = module.propensities["clicked"]
    assert t_plus[0] == 1.0
    # true ratios 1, 1/2, 1/3, ..., 1/6; with |ΔNDCG| weights and p = 0 the estimate runs low, and
    # three epochs on 2000 sessions leave the deeper positions noisy (across seeds: 0.7-1.3 x truth)
    assert 1.0 > float(t_plus[1]) > float(t_plus[2]) > float(t_plus[5]), t_plus
    assert 0.25 < float(t_plus[1]) < 0.75, t_plus
    # the biases survive a checkpoint
    path = tmp_path / "unbiased.ckpt"
    trainer.save_checkpoint(path)
    restored = LambdaRank.load_from_checkpoint(path)
    torch.testing.assert_close(restored.propensities["clicked"], t_plus)


def test_unbiased_needs_positions_and_pairs(click_log):
    data, _ = click_log
    module = LambdaRank(n_features=5, hidden=[8], unbiased=True)
    batch = data.padded(torch.arange(3))
    with pytest.raises(ValueError, match="`unbiased=True` needs the documents' displayed positions"):
        module.objective(module.scorer(batch.features), batch)
    with pytest.raises(ValueError, match="`unbiased` debiases pairs"):
        LambdaRank(n_features=5, loss="softmax", unbiased=True)
    with pytest.raises(ValueError, match="`bias_p`"):
        RankNet(n_features=5, unbiased=True, bias_p=-1.0)
    assert LambdaRank(n_features=5).propensities is None
