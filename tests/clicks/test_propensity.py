"""rankkit.clicks.propensity: the propensity estimators of unbiased learning to rank, checked against a
simulated log with known examination (recovery), explicit loops over pairs and the kernel's own
pair weights. (Moved from tests/data/test_clicks.py, which keeps the click simulator's tests.)"""
from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch

from rankkit.data import make_synthetic, pad
from rankkit.data.clicks import PositionBasedModel, simulate_clicks
from rankkit.clicks.propensity import (PropensityEstimator, debiased_pair_loss, pair_costs, position_pair_costs,
                                      propensity_step)


# -- propensity estimation -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def randomized_log():
    """PBM η = 1 clicks on lists shown in random order (documents exchangeable across positions)."""
    data = make_synthetic(2000, 10, 3, seed=0)
    scores = torch.rand(data.n_docs, generator=torch.Generator().manual_seed(0))
    log = simulate_clicks(data, scores, model=PositionBasedModel(eta=1.0, max_label=4),
                          sessions_per_query=25, k=10, seed=0)
    batch, positions = log.padded()
    truth, _ = pad(data.labels[log.doc_index], log.sessions.sizes)
    return truth, batch.labels, positions, batch.mask


def test_propensity_recovery(randomized_log):
    # Scores fixed to the true labels, biases iterated to the fixed point with p = 0. With the
    # shown order random, C[a, b] factorises as θ_a w_b and t⁺_r / t⁺_0 = θ_r / θ_0 = 1 / (r + 1).
    scores, clicks, positions, mask = randomized_log
    est = PropensityEstimator(10, p=0.0, weighting="ranknet")
    est.update(scores, clicks, positions, mask, iterations=100)
    ratio = est.t_plus / est.t_plus[0]
    true = 1.0 / torch.arange(1, 11, dtype=torch.float64)
    assert torch.all((ratio[:6] / true[:6] - 1).abs() < 0.10), ratio
    # p = 1 (the authors' default) shrinks the estimate towards 1
    est_p1 = PropensityEstimator(10, p=1.0, weighting="ranknet").update(scores, clicks, positions, mask,
                                                                        iterations=100)
    assert bool(((ratio[1:] < est_p1.t_plus[1:]) & (est_p1.t_plus[1:] < 1)).all())
    # the paper's |ΔNDCG| weighting: same ordering, biased a few per cent low (see the report)
    ndcg = PropensityEstimator(10, p=0.0).update(scores, clicks, positions, mask, iterations=100).t_plus
    assert bool((ndcg[1:] < ndcg[:-1]).all()) and torch.all((ndcg[:4] / true[:4] - 1).abs() < 0.2)


def reference_position_costs(scores, clicks, positions, mask, n_positions, sigma, k):
    """float64 per-session double loop: |ΔNDCG@k| on clicks, ranks by descending score."""
    out = np.zeros((n_positions, n_positions))
    for q in range(scores.shape[0]):
        idx = [i for i in range(scores.shape[1]) if mask[q, i]]
        s = {i: float(scores[q, i]) for i in idx}
        order = sorted(idx, key=lambda i: -s[i])
        rank = {i: r for r, i in enumerate(order)}
        disc = {i: (1 / math.log2(rank[i] + 2) if k is None or rank[i] < k else 0.0) for i in idx}
        n_clicked = sum(int(clicks[q, i]) for i in idx)
        top = n_clicked if k is None else min(n_clicked, k)
        idcg = sum(1 / math.log2(t + 2) for t in range(top))
        for i in idx:
            for j in idx:
                if clicks[q, i] == 1 and clicks[q, j] == 0:
                    delta = abs(disc[i] - disc[j]) / idcg
                    cost = delta * math.log(1 + math.exp(-sigma * (s[i] - s[j])))
                    a = min(int(positions[q, i]), n_positions - 1)
                    b = min(int(positions[q, j]), n_positions - 1)
                    out[a, b] += cost
    return torch.from_numpy(out)


@pytest.mark.parametrize("k", [None, 3])
def test_position_pair_costs_against_loop(k):
    g = torch.Generator().manual_seed(7)
    scores = torch.randn(6, 7, generator=g)
    clicks = (torch.rand(6, 7, generator=g) < 0.4).float()
    mask = torch.arange(7) < torch.tensor([7, 5, 1, 6, 3, 7])[:, None]
    positions = torch.randperm(7, generator=g).repeat(6, 1)
    got = position_pair_costs(scores, clicks, positions, mask=mask, n_positions=5, sigma=1.5, k=k)
    want = reference_position_costs(scores, clicks, positions, mask, 5, 1.5, k)
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-9)
    # the clicked/unclicked pairs alone give the dense [Q, L, L] costs' sums to the bit
    dense = pair_costs(scores.double(), clicks, mask=mask, sigma=1.5, k=k)
    bucket = positions.clamp(max=4)
    key = (bucket[:, :, None] * 5 + bucket[:, None, :]).reshape(-1)
    binned = torch.zeros(25, dtype=torch.float64).index_add_(0, key, dense.reshape(-1))
    assert torch.equal(got, binned.view(5, 5))


def test_propensity_step_and_factors():
    g = torch.Generator().manual_seed(8)
    costs = torch.rand(4, 4, generator=g, dtype=torch.float64)
    costs[2] = 0.0  # nobody clicked at position 2: its click bias stays
    t_plus = torch.tensor([1.0, 0.7, 0.4, 0.3], dtype=torch.float64)
    t_minus = torch.tensor([1.0, 1.1, 1.3, 0.9], dtype=torch.float64)
    new_plus, new_minus = propensity_step(costs, t_plus, t_minus, p=2.0)
    for a in range(4):
        mass = sum(costs[a, b] / t_minus[b] for b in range(4))
        base = sum(costs[0, b] / t_minus[b] for b in range(4))
        assert math.isclose(new_plus[a], (mass / base) ** (1 / 3) if mass > 0 else t_plus[a], rel_tol=1e-12)
        mass = sum(costs[b, a] / t_plus[b] for b in range(4))
        base = sum(costs[b, 0] / t_plus[b] for b in range(4))
        assert math.isclose(new_minus[a], (mass / base) ** (1 / 3), rel_tol=1e-12)

    est = PropensityEstimator(4)
    est.t_plus, est.t_minus = new_plus, new_minus
    positions = torch.tensor([[0, 1, 2, 3, 9], [3, 2, 1, 0, 0]])
    mask = torch.tensor([[True] * 5, [True] * 4 + [False]])
    upper, lower = est.pair_factors(positions, mask, dtype=torch.float64)
    clicks = torch.tensor([[1, 0, 1, 0, 0], [0, 1, 0, 1, 0]]).float()
    scores = torch.randn(2, 5, generator=g, dtype=torch.float64, requires_grad=True)
    loss = debiased_pair_loss(scores, clicks, upper=upper, lower=lower, mask=mask, sigma=0.8)
    full = pair_costs(scores.detach(), clicks, mask=mask, sigma=0.8)
    for q in range(2):
        want = 0.0
        for i in range(5):
            for j in range(5):
                if not (mask[q, i] and mask[q, j] and clicks[q, i] == 1 and clicks[q, j] == 0):
                    continue
                w = 1 / (float(new_plus[min(int(positions[q, i]), 3)]) * float(new_minus[min(int(positions[q, j]), 3)]))
                assert math.isclose(float(upper[q, i] * lower[q, j]), w, rel_tol=1e-12)
                want += w * float(full[q, i, j])
        assert math.isclose(float(loss[q].detach()), want, rel_tol=1e-12)
    assert float(upper[1, 4]) == 0.0 and float(lower[1, 4]) == 0.0  # padding
    loss.sum().backward()
    assert torch.allclose(scores.grad.sum(1), torch.zeros(2, dtype=torch.float64), atol=1e-12)
    # clipping: each inverse bias is min(1/t, clip), element by element
    clipped = PropensityEstimator(4, clip=1.5)
    clipped.t_plus, clipped.t_minus = new_plus, new_minus
    c_upper, c_lower = clipped.pair_factors(positions, mask, dtype=torch.float64)
    for q in range(2):
        for i in range(5):
            if mask[q, i]:
                b = min(int(positions[q, i]), 3)
                assert float(c_upper[q, i]) == min(1 / float(new_plus[b]), 1.5)
                assert float(c_lower[q, i]) == min(1 / float(new_minus[b]), 1.5)
    assert float(c_upper.max()) == 1.5 < float(upper.max())  # the bound binds here
    with pytest.raises(ValueError, match="`clip`"):
        PropensityEstimator(4, clip=0.5)


def test_kernel_pair_weights_match_explicit_loss():
    from rankkit.lambdas import lambda_gradients

    if "pair_weights" not in inspect.signature(lambda_gradients).parameters:
        pytest.skip("the lambda kernel has no `pair_weights` yet")
    g = torch.Generator().manual_seed(9)
    scores = torch.randn(3, 6, generator=g, dtype=torch.float64, requires_grad=True)
    clicks = (torch.rand(3, 6, generator=g) < 0.4).double()
    positions = torch.arange(6).repeat(3, 1)
    est = PropensityEstimator(6)
    est.t_plus = 1.0 / torch.arange(1, 7, dtype=torch.float64)
    est.t_minus = torch.linspace(1.0, 0.6, 6, dtype=torch.float64)
    upper, lower = est.pair_factors(positions, dtype=torch.float64)
    loss = debiased_pair_loss(scores, clicks, upper=upper, lower=lower)
    loss.sum().backward()
    grad, _, kernel_loss = lambda_gradients(scores.detach(), clicks, weighting="ndcg",
                                            pair_weights=(upper, lower), return_loss=True)
    assert torch.allclose(kernel_loss, loss.detach(), rtol=1e-9)
    assert torch.allclose(grad, scores.grad, rtol=1e-9, atol=1e-12)


def test_auto_clip_is_three_root_the_largest_inverse_propensity():
    """auto_clip by hand (3 √r, r = max θ_0/θ ≥ 1), FixedPropensities(clip="auto") clipping there,
    and the booster's "ips" taking it by default from its training log's propensities."""
    from rankkit.boosting.config import BoosterConfig
    from rankkit.clicks.debiasing import make_debiasing
    from rankkit.clicks.propensity import FixedPropensities, auto_clip, ips_propensities

    theta = torch.tensor([0.8, 0.4, 0.1, 0.02, 0.05])
    assert auto_clip(theta) == pytest.approx(3 * math.sqrt(0.8 / 0.02))
    assert auto_clip(torch.tensor([0.5, 0.9, 0.7])) == 3.0  # θ_0 not the largest: r is at least 1
    assert auto_clip(torch.tensor([1.0, 1 / 9])) == pytest.approx(9.0)  # r = 9: the clip is r itself
    est = FixedPropensities(theta, clip="auto")
    assert est.clip == pytest.approx(6 * math.sqrt(10))
    upper, _ = est.pair_factors(torch.arange(5)[None])
    torch.testing.assert_close(upper[0], torch.tensor([1.0, 2.0, 8.0, 6 * math.sqrt(10), 16.0]))
    g = torch.Generator().manual_seed(0)
    x, clicks = torch.randn(60, 3, generator=g), (torch.rand(60, generator=g) < 0.3).float()
    sizes, positions = torch.full((6,), 10), torch.arange(10).repeat(6)
    ips = make_debiasing("ips", BoosterConfig().objective_spec, family="trees",
                         propensity_clip=BoosterConfig().propensity_clip)
    ips.start(lambda: x, clicks, sizes, positions, device=torch.device("cpu"), data_parallel=False, seed=0)
    theta = ips_propensities(x, clicks, sizes, positions, n_positions=10, seed=0)
    clicked = torch.zeros(10, dtype=torch.bool)
    clicked[positions[clicks > 0]] = True
    assert not clicked.all()  # this log leaves positions without a click: they must not set the clip
    assert ips.pair_propensity()[0].clip == pytest.approx(3 * float((theta[0] / theta)[clicked].max()) ** 0.5)
    assert ips.pair_propensity()[0].clip < auto_clip(theta) / 10
    with pytest.raises(ValueError, match="at least one position"):
        auto_clip(torch.ones(0))
    assert auto_clip(torch.tensor([1.0, 0.5]), used=torch.tensor([True, False])) == 3.0


def test_pair_factors_follow_the_biases_whatever_changes_them():
    # The inverse biases are kept on the positions' device between batches; any change of the
    # biases (in place, replaced, a step) or of the clip, dtype or device gives fresh factors.
    est = PropensityEstimator(4, p=0.0, weighting="ranknet")
    positions = torch.tensor([[0, 1, 2, 3]])

    def want(e, dtype=torch.float32):
        inv_plus, inv_minus = 1.0 / e.t_plus, 1.0 / e.t_minus
        if e.clip is not None:
            inv_plus, inv_minus = inv_plus.clamp(max=e.clip), inv_minus.clamp(max=e.clip)
        return inv_plus.to(dtype)[None], inv_minus.to(dtype)[None]

    def check(dtype=torch.float32):
        got = est.pair_factors(positions, dtype=dtype)
        for a, b in zip(got, want(est, dtype)):
            assert a.dtype == dtype and torch.equal(a, b)

    check()
    est.t_plus[2] = 0.25          # in place
    check()
    est.t_minus = torch.tensor([1.0, 0.5, 0.5, 0.1], dtype=torch.float64)  # replaced
    check()
    est.clip = 3.0                # clipped
    check()
    check(torch.float64)
    est.update(torch.tensor([[0.0, 1.0, 0.5, 0.2]]), torch.tensor([[0.0, 1.0, 0.0, 1.0]]), positions)  # a step
    check()
    est.t_plus.data[1] = 0.5      # past autograd's version counter
    check()
    est.t_minus.numpy()[3] = 0.2
    check()
    with torch.inference_mode():  # biases made where tensors keep no version counter
        est.t_plus = torch.tensor([1.0, 0.3, 0.2, 0.1], dtype=torch.float64)
    check()


def test_pair_factors_reach_a_gpu_in_one_copy_that_does_not_wait():
    # Unbiased LambdaMART's biases change every step, so their inverse goes to the device every
    # step: one copy from pinned memory (no host sync; the positions' check is the step's one).
    from simcuda import from_sim, simcuda

    est = PropensityEstimator(4, p=0.0, weighting="ranknet", clip=5.0)
    est.t_plus = torch.tensor([1.0, 0.5, 0.1, 0.05], dtype=torch.float64)
    positions = torch.tensor([[0, 1, 2, 3], [3, 2, 1, 0]])
    cpu = est.pair_factors(positions)
    with simcuda() as counts:
        on_device = positions.cuda()
        for _ in range(2):
            counts.reset()
            got = est.pair_factors(on_device)
            assert counts.h2d == 1 and counts.syncs == 1, dict(counts.sync_sites)  # the positions' check
            for a, b in zip(got, cpu):
                assert torch.equal(from_sim(a), b)
            est.t_plus[2] = 0.25  # a step's new biases: the next call copies again
            cpu = est.pair_factors(positions)


@pytest.mark.parametrize("weighting, k", [("ndcg", 5), ("ranknet", None)])
def test_position_pair_costs_on_a_gpu_take_every_pair_without_asking_the_host(weighting, k):
    # Off the CPU the costs are summed over every pair with the others weighing 0 (finding the
    # pairs would wait for the device): the CPU's numbers up to float64 rounding, in one sync
    # (the batch's check), with long sessions, padding and tied scores.
    from simcuda import from_sim, simcuda

    g = torch.Generator().manual_seed(5)
    scores = torch.randn(40, 12, generator=g, dtype=torch.float64).round(decimals=1)  # ties
    clicks = (torch.rand(40, 12, generator=g) < 0.3).double()
    positions = torch.randint(0, 15, (40, 12), generator=g)
    mask = torch.arange(12)[None, :] < torch.randint(1, 13, (40, 1), generator=g)
    cpu = position_pair_costs(scores, clicks, positions, mask=mask, n_positions=8, weighting=weighting, k=k)
    assert cpu.sum() > 0
    with simcuda() as counts:
        args = [t.cuda() for t in (scores, clicks, positions, mask)]
        counts.reset()
        got = position_pair_costs(*args[:3], mask=args[3], n_positions=8, weighting=weighting, k=k)
        assert counts.syncs == 1, dict(counts.sync_sites)
    torch.testing.assert_close(from_sim(got), cpu, rtol=1e-12, atol=1e-12)
