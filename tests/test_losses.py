"""Tests of every ranking objective against independent slow references.

Pairwise: the LambdaLoss weightings (Wang, Li, Golbandi, Bendersky, Najork, "The LambdaLoss
Framework for Ranking Metric Optimization", CIKM 2018) and the product pair weights of
Unbiased LambdaMART (Hu, Wang, Peng, Li, WWW 2019) against float64 double loops of the papers'
formulas. Listwise: the closed-form gradients against torch.autograd of the explicit losses in
float64, the hessians against autograd's second derivatives (or, for ApproxNDCG, its bound).
"""
from __future__ import annotations

import math

import pytest
import torch

from rankkit.lambdas import WEIGHTINGS, lambda_gradients
from rankkit.losses import LISTWISE, OBJECTIVES, PAIRWISE, approx_ndcg_loss, objective_gradients
from rankkit.neural import lambda_loss

LAMBDALOSS = ("ndcg_loss1", "ndcg_loss2", "ndcg_loss2pp", "arp1", "arp2", "labeldiff")


def random_batch(seed, n_q=5, n_d=7, dtype=torch.float64, top=3):
    """Scores with ties, labels 0..top with ties, random padding holding garbage."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.round(torch.randn(n_q, n_d, generator=gen, dtype=dtype) * 2) / 2
    labels = torch.randint(0, top + 1, (n_q, n_d), generator=gen).to(dtype)
    lengths = torch.tensor([n_d, n_d - 2, 1, 0, 4, 3])[:n_q]
    mask = torch.arange(n_d)[None, :] < lengths[:, None]
    mask = mask.gather(1, torch.argsort(torch.rand(n_q, n_d, generator=gen), dim=1))
    return scores.masked_fill(~mask, 1e6), labels.masked_fill(~mask, 9.0), mask


# ---------------------------------------------------------------------------------------------
# Pairwise: the papers' formulas in a float64 double loop.
# ---------------------------------------------------------------------------------------------

def lambdaloss_weight(name, yi, yj, ri, rj, gi, gj, k, mu=10.0):
    """The paper's weight of the pair (i, j), y_i > y_j, at 1-based ranks r_i, r_j, with
    G = gain / ideal DCG@k."""
    inv_d = lambda r: 1.0 / math.log2(1 + r) if k is None or r <= k else 0.0
    n = abs(ri - rj)
    delta = abs(1.0 / math.log2(1 + n) - 1.0 / math.log2(2 + n))
    if name == "ndcg_loss1":
        return gi * inv_d(ri)
    if name == "ndcg_loss2":
        return delta * abs(gi - gj)
    if name == "ndcg_loss2pp":
        return (abs(inv_d(ri) - inv_d(rj)) + mu * delta) * abs(gi - gj)
    if name == "arp1":
        return yi
    return abs(yi - yj)  # arp2, labeldiff


def pair_reference(scores, labels, mask, *, weight_fn, k=None, sigma=1.0, normalize=False,
                   weights=None, pair_weights=None):
    """(grad, hess, loss) over the pairs y_i > y_j with at least one of them in the top k."""
    n_q, n_d = scores.shape
    grad = torch.zeros(n_q, n_d, dtype=torch.float64)
    hess = torch.zeros(n_q, n_d, dtype=torch.float64)
    loss = torch.zeros(n_q, dtype=torch.float64)
    for q in range(n_q):
        s, y = scores[q].double().tolist(), labels[q].double().tolist()
        docs = [i for i in range(n_d) if mask[q, i]]
        ranked = sorted(docs, key=lambda i: (-s[i], y[i], i))
        rank = {i: p + 1 for p, i in enumerate(ranked)}
        cut = len(docs) if k is None else min(k, len(docs))
        ideal = sum((2 ** v - 1) / math.log2(p + 2)
                    for p, v in enumerate(sorted((y[i] for i in docs), reverse=True)[:cut]))
        g = {i: (2 ** y[i] - 1) / ideal if ideal > 0 else 0.0 for i in docs}
        total = 0.0
        for i in docs:
            for j in docs:
                if y[i] <= y[j] or (k is not None and min(rank[i], rank[j]) > k):
                    continue
                w = weight_fn(y[i], y[j], rank[i], rank[j], g[i], g[j], k)
                rho = 1.0 / (1.0 + math.exp(sigma * (s[i] - s[j])))
                total += 2 * sigma * w * rho
                pw = 1.0 if weights is None else float(weights[q, i] + weights[q, j]) / 2
                if pair_weights is not None:
                    pw *= float(pair_weights[0][q, i] * pair_weights[1][q, j])
                grad[q, i] -= pw * sigma * w * rho
                grad[q, j] += pw * sigma * w * rho
                hess[q, i] += pw * sigma ** 2 * w * rho * (1 - rho)
                hess[q, j] += pw * sigma ** 2 * w * rho * (1 - rho)
                loss[q] += pw * w * math.log1p(math.exp(-sigma * (s[i] - s[j])))
        if normalize and total > 0:
            f = math.log2(1 + total) / total
            grad[q], hess[q], loss[q] = grad[q] * f, hess[q] * f, loss[q] * f
    return grad, hess, loss


def assert_matches(actual, expected, rtol=1e-9, atol=1e-12):
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a.double(), e, rtol=rtol, atol=atol)


@pytest.mark.parametrize("options", [{}, {"normalize": True, "sigma": 0.7}, {"use_weights": True}],
                         ids=["plain", "normalize", "weights"])
@pytest.mark.parametrize("k", [None, 3])
@pytest.mark.parametrize("name", LAMBDALOSS)
def test_lambdaloss_weightings_match_the_papers_formulas(name, k, options):
    options = dict(options)
    scores, labels, mask = random_batch(seed=LAMBDALOSS.index(name) + (k or 0))
    if options.pop("use_weights", False):
        options["weights"] = torch.rand(scores.shape, generator=torch.Generator().manual_seed(1),
                                        dtype=torch.float64)
    got = lambda_gradients(scores, labels, mask=mask, weighting=name, k=k, return_loss=True,
                           **options)
    want = pair_reference(scores, labels, mask, k=k, **options,
                          weight_fn=lambda *a: lambdaloss_weight(name, *a))
    assert_matches(got, want)


@pytest.mark.parametrize("mu", [0.0, 2.5])
def test_ndcg_loss2pp_takes_its_mu(mu):
    from rankkit.lambdas.weightings import ndcg_loss2pp

    scores, labels, mask = random_batch(seed=4)
    got = objective_gradients("ndcg_loss2pp", scores, labels, mask=mask, mu=mu, k=4)
    want = pair_reference(scores, labels, mask, k=4,
                          weight_fn=lambda *a: lambdaloss_weight("ndcg_loss2pp", *a, mu=mu))
    assert_matches(got, want)
    if mu == 0.0:  # μ = 0 is LambdaRank's |ΔNDCG@k|
        assert_matches(got, lambda_gradients(scores, labels, mask=mask, weighting="ndcg", k=4,
                                             return_loss=True))
        assert_matches(got, lambda_gradients(scores, labels, mask=mask, k=4, return_loss=True,
                                             weighting=ndcg_loss2pp(0.0)))
    with pytest.raises(ValueError, match="`mu`"):
        objective_gradients("ndcg_loss2pp", scores, labels, mask=mask, mu=-1.0)
    with pytest.raises(ValueError, match="`mu`"):
        objective_gradients("ndcg", scores, labels, mask=mask, mu=1.0)


@pytest.mark.parametrize("weighting", ["ranknet", "ndcg", "ndcg_loss2"])
@pytest.mark.parametrize("with_weights", [False, True])
def test_pair_weights_are_the_product_upper_i_lower_j(weighting, with_weights):
    scores, labels, mask = random_batch(seed=7)
    gen = torch.Generator().manual_seed(3)
    upper = torch.rand(scores.shape, generator=gen, dtype=torch.float64) * 2
    lower = torch.rand(scores.shape, generator=gen, dtype=torch.float64)
    weights = torch.rand(scores.shape, generator=gen, dtype=torch.float64) if with_weights else None
    got = lambda_gradients(scores, labels, mask=mask, weighting=weighting, k=4, normalize=True,
                           weights=weights, pair_weights=(upper, lower), return_loss=True)
    name = "ndcg_loss2" if weighting == "ndcg_loss2" else None
    if weighting == "ndcg":
        # |ΔNDCG@k| = |G_i − G_j| |1/D_i − 1/D_j|: NDCG-Loss2++ with μ = 0.
        fn = lambda *a: lambdaloss_weight("ndcg_loss2pp", *a, mu=0.0)
    elif name:
        fn = lambda *a: lambdaloss_weight(name, *a)
    else:
        fn = lambda *a: 1.0
    want = pair_reference(scores, labels, mask, k=4, normalize=True, weights=weights,
                          pair_weights=(upper, lower), weight_fn=fn)
    assert_matches(got, want)
    # Ones change nothing; the check names the argument.
    ones = torch.ones_like(scores)
    assert_matches(lambda_gradients(scores, labels, mask=mask, pair_weights=(ones, ones)),
                   lambda_gradients(scores, labels, mask=mask))
    bad = upper.clone()
    bad[0, mask[0].nonzero()[0, 0]] = -1.0
    with pytest.raises(ValueError, match="`pair_weights` has to be finite and non-negative"):
        lambda_gradients(scores, labels, mask=mask, pair_weights=(bad, lower))
    with pytest.raises(ValueError, match="`pair_weights`"):
        lambda_gradients(scores, labels, mask=mask, pair_weights=upper)


# ---------------------------------------------------------------------------------------------
# Listwise: closed forms against autograd of the explicit losses.
# ---------------------------------------------------------------------------------------------

def explicit_loss(name, s, y, mask, **options):
    """[Q] loss written plainly with autograd-able operations (small lists only)."""
    out = []
    for q in range(s.shape[0]):
        idx = mask[q].nonzero()[:, 0]
        sq, yq = s[q, idx], y[q, idx].double()
        if len(idx) == 0:
            out.append(s.sum() * 0.0)
            continue
        if name in ("softmax", "xendcg"):
            if name == "softmax":
                raw = yq if options.get("target", "label") == "label" else 2.0 ** yq - 1.0
            else:
                raw = 2.0 ** yq - options["gamma"][q, idx]
            t = raw / raw.sum() if raw.sum() > 0 else raw * 0.0
            out.append(-(t * torch.log_softmax(sq, 0)).sum())
        elif name == "listmle":
            order = torch.sort(yq, descending=True, stable=True).indices
            z = sq[order]
            out.append(sum(torch.logsumexp(z[r:], 0) - z[r] for r in range(len(z))))
        elif name == "approx_ndcg":
            alpha = 1.0 / options.get("temperature", 1.0)
            diff = sq[None, :] - sq[:, None]  # s_j − s_i
            rank = 1.0 + torch.sigmoid(alpha * diff).sum(1) - 0.5
            gains = 2.0 ** yq - 1.0
            ideal = (torch.sort(gains, descending=True).values
                     / torch.log2(torch.arange(len(idx), dtype=torch.float64) + 2.0)).sum()
            out.append(1.0 - (gains / ideal / torch.log2(1.0 + rank)).sum() if ideal > 0
                       else s.sum() * 0.0)
        elif name == "neural_ndcg":  # NeuralSort rows, 50 full-matrix Sinkhorn rounds, NDCG of P g
            n = len(idx)
            spread = (sq[:, None] - sq[None, :]).abs().sum(1)
            scale = n + 1.0 - 2.0 * torch.arange(1, n + 1, dtype=torch.float64)
            p = torch.softmax(scale[:, None] * sq[None, :] - spread[None, :], dim=1)
            for _ in range(50):
                p = p / p.sum(0, keepdim=True)
                p = p / p.sum(1, keepdim=True)
            gains = 2.0 ** yq - 1.0
            disc = 1.0 / torch.log2(torch.arange(n, dtype=torch.float64) + 2.0)
            ideal = (torch.sort(gains, descending=True).values * disc).sum()
            out.append(1.0 - (p @ gains * disc).sum() / ideal if ideal > 0 else s.sum() * 0.0)
    return torch.stack(out)


LISTWISE_OPTIONS = [
    ("softmax", {}), ("softmax", {"target": "gain"}), ("xendcg", {}), ("listmle", {}),
    ("approx_ndcg", {}), ("approx_ndcg", {"temperature": 0.3, "workspace": 7}),
]


def _options_and_reference(name, options, scores, seed=0):
    """The call's options and the explicit loss's (XE-NDCG: the same γ from one seed)."""
    if name != "xendcg":
        return dict(options), dict(options)
    gamma = torch.rand(scores.shape, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64)
    return {"generator": torch.Generator().manual_seed(seed)}, {"gamma": gamma}


@pytest.mark.parametrize("name, options", LISTWISE_OPTIONS)
def test_listwise_gradients_are_autograd_of_the_explicit_loss(name, options):
    scores, labels, mask = random_batch(seed=21)
    scores = scores + 0.1 * torch.randn(scores.shape, generator=torch.Generator().manual_seed(2),
                                        dtype=torch.float64)
    call, ref = _options_and_reference(name, options, scores)
    grad, hess, loss = OBJECTIVES[name](scores, labels, mask=mask, **call)
    ref.pop("workspace", None)
    s = scores.clone().requires_grad_(True)
    explicit = explicit_loss(name, s, labels, mask, **ref)
    (expected,) = torch.autograd.grad(explicit.sum(), s)
    torch.testing.assert_close(loss, explicit.detach(), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad, expected.masked_fill(~mask, 0.0), rtol=1e-10, atol=1e-12)
    # The diagonal of autograd's hessian: exact for the cross entropies and ListMLE; ApproxNDCG's
    # hess is a positive upper bound of it.
    full = torch.autograd.functional.hessian(
        lambda x: explicit_loss(name, x, labels, mask, **ref).sum(), scores)
    diag = full.reshape(scores.numel(), scores.numel()).diagonal().view(scores.shape)
    assert (hess >= 0).all() and not hess.masked_select(~mask).any()
    if name == "approx_ndcg":
        assert (hess >= diag - 1e-12).all()
    else:
        torch.testing.assert_close(hess, diag.masked_fill(~mask, 0.0), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", LISTWISE)
def test_listwise_weights_scale_queries_and_padding_gets_nothing(name):
    scores, labels, mask = random_batch(seed=5, dtype=torch.float32)
    gen = lambda: torch.Generator().manual_seed(0)
    extra = {"generator": gen()} if name == "xendcg" else {}
    plain = OBJECTIVES[name](scores, labels, mask=mask, **extra)
    w = torch.full_like(scores, 2.5)
    extra = {"generator": gen()} if name == "xendcg" else {}
    weighted = OBJECTIVES[name](scores, labels, mask=mask, weights=w, **extra)
    for a, b in zip(plain, weighted):
        assert a.dtype == torch.float32
        torch.testing.assert_close(b, 2.5 * a)
    # Padding gets nothing; the fully padded query (row 3) has no loss.
    for t in plain[:2]:
        assert not t.masked_select(~mask).any()
    assert plain[2][3] == 0


def test_approx_ndcg_blocks_do_not_change_the_result_and_long_lists_run():
    gen = torch.Generator().manual_seed(9)
    scores = torch.randn(2, 3000, generator=gen)
    labels = torch.randint(0, 5, (2, 3000), generator=gen).float()
    big = approx_ndcg_loss(scores, labels, workspace=2**22)
    small = approx_ndcg_loss(scores, labels, workspace=6000 * 7)  # 7 columns per block
    for a, b in zip(big, small):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    assert torch.isfinite(big[0]).all() and (big[1] >= 0).all()
    assert abs(big[0].sum().item()) < 1e-4  # the pull terms cancel: Σ_k grad_k = 0


# ---------------------------------------------------------------------------------------------
# One registry, one autograd Function.
# ---------------------------------------------------------------------------------------------

def test_registry_holds_every_weighting_and_listwise_loss():
    assert set(OBJECTIVES) == set(WEIGHTINGS) | set(LISTWISE)
    assert set(PAIRWISE) >= {"ranknet", "ndcg", "map", "err", *LAMBDALOSS}
    with pytest.raises(ValueError, match="`objective` has to be one of"):
        objective_gradients("lambdamart", torch.zeros(1, 2), torch.zeros(1, 2))


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_lambda_loss_backward_is_the_registry_gradient(name):
    scores, labels, mask = random_batch(seed=13)
    call, ref = _options_and_reference(name, {}, scores, seed=4)
    grad, _, loss = OBJECTIVES[name](scores, labels, mask=mask, **call)
    s = scores.clone().requires_grad_(True)
    call, _ = _options_and_reference(name, {}, scores, seed=4)
    value = lambda_loss(s, labels, mask=mask, loss=name, reduction="sum", **call)
    value.backward()
    torch.testing.assert_close(value.detach(), loss.sum())
    torch.testing.assert_close(s.grad, grad)
    if name in LISTWISE:  # and that is autograd of the explicit loss
        s2 = scores.clone().requires_grad_(True)
        (expected,) = torch.autograd.grad(explicit_loss(name, s2, labels, mask, **ref).sum(), s2)
        torch.testing.assert_close(s.grad, expected.masked_fill(~mask, 0.0))
    else:  # weighting= is the same as loss= for the pairwise names
        s3 = scores.clone().requires_grad_(True)
        lambda_loss(s3, labels, mask=mask, weighting=name, reduction="sum").backward()
        torch.testing.assert_close(s3.grad, s.grad)


def test_lambda_loss_rejects_conflicting_options():
    s, y = torch.zeros(1, 3), torch.tensor([[0.0, 1.0, 2.0]])
    with pytest.raises(ValueError, match="`weighting` or `loss`"):
        lambda_loss(s, y, weighting="ndcg", loss="softmax")
    with pytest.raises(ValueError, match="`sigma` and `k`"):
        lambda_loss(s, y, loss="listmle", k=3)
    with pytest.raises(ValueError, match="`loss` has to be one of"):
        lambda_loss(s, y, loss="hinge")


# ---------------------------------------------------------------------------------------------
# Properties of the new weightings (as tests/lambdas/test_lambdas.py checks the others).
# ---------------------------------------------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=40, deadline=None)
@given(n_q=st.integers(1, 3), n_d=st.integers(1, 7), data=st.data(),
       name=st.sampled_from(LAMBDALOSS), k=st.none() | st.integers(1, 8), extra=st.integers(1, 3))
def test_lambdaloss_weightings_sum_to_zero_and_ignore_padding(n_q, n_d, data, name, k, extra):
    cells = n_q * n_d
    scores = torch.tensor(data.draw(st.lists(st.sampled_from([-1.0, 0.0, 0.5]) | st.floats(-4, 4),
                                             min_size=cells, max_size=cells)),
                          dtype=torch.float64).view(n_q, n_d)
    labels = torch.tensor(data.draw(st.lists(st.integers(0, 3), min_size=cells, max_size=cells)),
                          dtype=torch.float64).view(n_q, n_d)
    mask = torch.tensor(data.draw(st.lists(st.booleans(), min_size=cells, max_size=cells))).view(n_q, n_d)
    grad, hess, loss = lambda_gradients(scores, labels, mask=mask, weighting=name, k=k,
                                        return_loss=True)
    torch.testing.assert_close(grad.sum(1), torch.zeros(n_q, dtype=torch.float64), atol=1e-12, rtol=0)
    assert (hess >= 0).all() and (loss >= 0).all()
    s2 = torch.cat([torch.full((n_q, extra), math.nan, dtype=torch.float64), scores], 1)
    y2 = torch.cat([torch.full((n_q, extra), 7.0, dtype=torch.float64), labels], 1)
    m2 = torch.cat([torch.zeros(n_q, extra, dtype=torch.bool), mask], 1)
    padded = lambda_gradients(s2, y2, mask=m2, weighting=name, k=k, return_loss=True)
    torch.testing.assert_close(padded[0][:, extra:], grad)
    torch.testing.assert_close(padded[1][:, extra:], hess)
    torch.testing.assert_close(padded[2], loss)
    equal = lambda_gradients(scores, torch.full_like(labels, 2.0), mask=mask, weighting=name, k=k)
    assert not equal[0].any() and not equal[1].any()
