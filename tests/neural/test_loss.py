"""rankkit.neural.loss: the autograd Function that injects the objective's closed-form gradient
(LambdaLoss) against autograd of the explicit loss (gradcheck in float64), the loss's value against
a loop over pairs, the |ΔNDCG| lambdas against a loop, and its argument checks. (Moved from
tests/neural/test_module.py, which keeps the modules' tests.)"""
from __future__ import annotations

import math

import pytest
import torch

from rankkit.data import make_synthetic
from rankkit.neural import MLPScorer, lambda_loss


def random_batch(q=4, length=7, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(q, length, generator=g, dtype=dtype)
    labels = torch.randint(0, 3, (q, length), generator=g).to(dtype)
    lengths = torch.randint(2, length + 1, (q,), generator=g)
    mask = torch.arange(length) < lengths.unsqueeze(1)
    return scores, labels, mask


def reference_ndcg_lambdas(scores, labels, mask, sigma=1.0):
    """Float64 per-pair double loop: grad of the |ΔNDCG|-weighted RankNet loss (exp gain,
    full-list ideal DCG, worst-case ties), written independently of rankkit."""
    q_count, length = scores.shape
    out = torch.zeros(q_count, length, dtype=torch.float64)
    for q in range(q_count):
        n = int(mask[q].sum())
        s = [float(x) for x in scores[q, :n]]
        y = [float(x) for x in labels[q, :n]]
        order = sorted(range(n), key=lambda i: (-s[i], y[i], i))
        rank = {doc: r for r, doc in enumerate(order)}
        ideal = sorted(y, reverse=True)
        idcg = sum((2 ** v - 1) / math.log2(r + 2) for r, v in enumerate(ideal))
        if idcg == 0:
            continue
        for i in range(n):
            for j in range(n):
                if y[i] <= y[j]:
                    continue
                gain_diff = (2 ** y[i] - 1) - (2 ** y[j] - 1)
                disc_diff = 1 / math.log2(rank[i] + 2) - 1 / math.log2(rank[j] + 2)
                delta = abs(gain_diff * disc_diff) / idcg
                rho = 1 / (1 + math.exp(sigma * (s[i] - s[j])))
                out[q, i] += -sigma * delta * rho
                out[q, j] -= -sigma * delta * rho
    return out


# -- the autograd Function ------------------------------------------------------------------------
@pytest.mark.parametrize("reduction", ["sum", "query", "pair"])
def test_ranknet_backward_is_autograd_of_the_loss(reduction):
    scores, labels, mask = random_batch()
    scores.requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda s: lambda_loss(s, labels, mask=mask, weighting="ranknet", reduction=reduction), (scores,))


def test_ranknet_loss_value_is_the_explicit_loss():
    scores, labels, mask = random_batch(seed=1)
    explicit = torch.zeros((), dtype=torch.float64)
    for q in range(scores.shape[0]):
        for i in range(scores.shape[1]):
            for j in range(scores.shape[1]):
                if mask[q, i] and mask[q, j] and labels[q, i] > labels[q, j]:
                    explicit = explicit + torch.nn.functional.softplus(-(scores[q, i] - scores[q, j]))
    got = lambda_loss(scores, labels, mask=mask, weighting="ranknet", reduction="sum")
    torch.testing.assert_close(got, explicit)


def test_ndcg_backward_matches_reference_lambdas():
    scores, labels, mask = random_batch(q=5, length=9, seed=2)
    s = scores.clone().requires_grad_(True)
    lambda_loss(s, labels, mask=mask, weighting="ndcg", reduction="sum").backward()
    torch.testing.assert_close(s.grad, reference_ndcg_lambdas(scores, labels, mask), rtol=1e-5, atol=1e-9)
    # grad_output scales the injected gradient; padding gets none
    s2 = scores.clone().requires_grad_(True)
    (3.0 * lambda_loss(s2, labels, mask=mask, weighting="ndcg", reduction="sum")).backward()
    torch.testing.assert_close(s2.grad, 3.0 * s.grad)
    assert (s.grad[~mask] == 0).all()


def test_gradients_reach_every_parameter():
    torch.manual_seed(0)
    scorer = MLPScorer(5, (8, 4), norm="layer")
    x = torch.randn(3, 6, 5)
    labels = torch.randint(0, 3, (3, 6)).float()
    lambda_loss(scorer(x), labels, weighting="ndcg").backward()
    params = dict(scorer.named_parameters())
    # A pairwise loss depends on score differences only, so the output bias gets exactly the sum
    # of each query's lambdas, which is zero; every other parameter must receive a gradient.
    out_bias = list(params)[-1]
    assert out_bias.endswith("bias") and params[out_bias].grad.abs().max() < 1e-6
    for name, p in params.items():
        if name != out_bias:
            assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_padded_batch_equals_queries_one_by_one():
    torch.manual_seed(0)
    scorer = MLPScorer(4, (8,)).double()
    ds = make_synthetic(5, (3, 9), 4, seed=4)
    batch = ds.padded()
    scorer.zero_grad()
    lambda_loss(scorer(batch.features.double()), batch.labels, mask=batch.mask, weighting="ndcg",
                reduction="sum").backward()
    together = [p.grad.clone() for p in scorer.parameters()]
    scorer.zero_grad()
    for q in range(ds.n_queries):
        one = ds.padded([q])
        lambda_loss(scorer(one.features.double()), one.labels, mask=one.mask, weighting="ndcg",
                    reduction="sum").backward()
    for a, b in zip(together, scorer.parameters()):
        torch.testing.assert_close(a, b.grad)


def test_loss_validates_arguments():
    s = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="reduction"):
        lambda_loss(s, s, reduction="mean")
    with pytest.raises(ValueError, match=r"`labels` has to be a tensor of shape \(2, 3\)"):
        lambda_loss(s, torch.zeros(3))
