"""Tests of the lambda kernel against independent slow references (Burges, "From RankNet to
LambdaRank to LambdaMART: An Overview", MSR-TR-2010-82, 2010)."""
from __future__ import annotations

import math
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rankkit.lambdas import WEIGHTINGS, lambda_gradients

WEIGHTING_NAMES = ("ranknet", "ndcg", "map", "err")


# ---------------------------------------------------------------------------------------------
# The reference: a plain float64 double loop over pairs, with its own metrics.
# ---------------------------------------------------------------------------------------------

def _ref_metric(ranked, weighting, k, gain, max_label):
    """NDCG@k, AP@k or ERR@k of a list of labels in ranked order."""
    cut = len(ranked) if k is None else min(k, len(ranked))
    if weighting == "ndcg":
        g = (lambda y: 2.0 ** y - 1.0) if gain == "exp" else (lambda y: float(y))
        dcg = sum(g(y) / math.log2(p + 2) for p, y in enumerate(ranked[:cut]))
        ideal = sum(g(y) / math.log2(p + 2) for p, y in enumerate(sorted(ranked, reverse=True)[:cut]))
        return dcg / ideal if ideal > 0 else 0.0
    if weighting == "map":
        n_rel = sum(1 for y in ranked if y > 0)
        norm = min(n_rel, cut)
        if norm == 0:
            return 0.0
        hits, total = 0, 0.0
        for p, y in enumerate(ranked[:cut]):
            if y > 0:
                hits += 1
                total += hits / (p + 1)
        return total / norm
    if weighting == "err":
        err, not_stopped = 0.0, 1.0
        for p, y in enumerate(ranked[:cut]):
            r = (2.0 ** y - 1.0) / 2.0 ** max_label
            err += not_stopped * r / (p + 1)
            not_stopped *= 1.0 - r
        return err
    raise AssertionError(weighting)


def reference(scores, labels, mask=None, *, weighting="ranknet", sigma=1.0, k=None, gain="exp",
              tie_term=False, normalize=False, weights=None, max_err_label=None, groups=None):
    """(grad, hess, loss) by looping over every pair of every query, in float64. A pair of one
    group (``groups``) only counts in the normalisation factor."""
    s, y = scores.double().tolist(), labels.double().tolist()
    m = torch.ones_like(scores, dtype=torch.bool).tolist() if mask is None else mask.tolist()
    w = None if weights is None else weights.double().tolist()
    if max_err_label is None:
        max_err_label = max((y[q][i] for q in range(len(y)) for i in range(len(y[q])) if m[q][i]),
                            default=0.0)
    n_q, n_d = scores.shape
    grad = [[0.0] * n_d for _ in range(n_q)]
    hess = [[0.0] * n_d for _ in range(n_q)]
    loss = [0.0] * n_q
    for q in range(n_q):
        docs = [i for i in range(n_d) if m[q][i]]
        # Rank by descending score; equal scores: lower label first (worst case).
        ranked = sorted(docs, key=lambda i: (-s[q][i], y[q][i]))
        pos = {i: p for p, i in enumerate(ranked)}
        base = None if weighting == "ranknet" else _ref_metric([y[q][i] for i in ranked], weighting, k, gain,
                                                               max_err_label)
        abs_lambda = 0.0
        for i in docs:
            for j in docs:
                if i >= j or (k is not None and min(pos[i], pos[j]) >= k):
                    continue
                if y[q][i] == y[q][j] and not tie_term:
                    continue
                swapped = list(ranked)
                swapped[pos[i]], swapped[pos[j]] = j, i
                delta = 1.0 if weighting == "ranknet" else abs(
                    _ref_metric([y[q][d] for d in swapped], weighting, k, gain, max_err_label) - base)
                pair_w = 1.0 if w is None else (w[q][i] + w[q][j]) / 2
                if y[q][i] == y[q][j]:  # RankNet's P̄ = 1/2 tie term
                    hi, lo = i, j
                    d = s[q][hi] - s[q][lo]
                    rho = 1.0 / (1.0 + math.exp(sigma * d))
                    lam = sigma * delta * (0.5 - rho)
                    cost = delta * (0.5 * sigma * d + math.log1p(math.exp(-sigma * d)))
                else:
                    hi, lo = (i, j) if y[q][i] > y[q][j] else (j, i)
                    d = s[q][hi] - s[q][lo]
                    rho = 1.0 / (1.0 + math.exp(sigma * d))
                    lam = -sigma * delta * rho
                    cost = delta * math.log1p(math.exp(-sigma * d))
                abs_lambda += 2 * abs(lam)
                if groups is not None and int(groups[q, i]) == int(groups[q, j]):
                    continue
                grad[q][hi] += pair_w * lam
                grad[q][lo] -= pair_w * lam
                h = sigma ** 2 * delta * rho * (1.0 - rho)
                hess[q][hi] += pair_w * h
                hess[q][lo] += pair_w * h
                loss[q] += pair_w * cost
        if normalize and abs_lambda > 0:
            factor = math.log2(1 + abs_lambda) / abs_lambda
            grad[q] = [g * factor for g in grad[q]]
            hess[q] = [h * factor for h in hess[q]]
            loss[q] *= factor
    return (torch.tensor(grad, dtype=torch.float64), torch.tensor(hess, dtype=torch.float64),
            torch.tensor(loss, dtype=torch.float64))


def random_batch(seed, n_q=4, n_d=8, dtype=torch.float64):
    """Scores with ties (rounded), labels 0..3 with ties, padding holding garbage."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.round(torch.randn(n_q, n_d, generator=gen, dtype=dtype) * 2) / 2
    labels = torch.randint(0, 4, (n_q, n_d), generator=gen).to(dtype)
    lengths = torch.tensor([n_d, n_d - 2, 1, 0, 3, 5])[:n_q]
    mask = torch.arange(n_d)[None, :] < lengths[:, None]
    mask = mask.gather(1, torch.argsort(torch.rand(n_q, n_d, generator=gen), dim=1))
    scores = scores.masked_fill(~mask, 1e6)
    labels = labels.masked_fill(~mask, 7.0)
    weights = torch.rand(n_q, n_d, generator=gen, dtype=dtype) * 2
    return scores, labels, mask, weights


def assert_matches(actual, expected):
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a.double(), e, rtol=1e-5, atol=1e-10)


OPTION_SETS = [
    dict(),
    dict(tie_term=True),
    dict(normalize=True),
    dict(use_weights=True),
    dict(tie_term=True, normalize=True, use_weights=True, sigma=0.7),
    dict(use_groups=True),
    dict(use_groups=True, tie_term=True, normalize=True, use_weights=True),
]


@pytest.mark.parametrize("options", OPTION_SETS, ids=lambda o: "-".join(o) or "plain")
@pytest.mark.parametrize("k", [None, 1, 3])
@pytest.mark.parametrize("weighting", WEIGHTING_NAMES)
def test_matches_double_loop_reference(weighting, k, options):
    options = dict(options)
    scores, labels, mask, weights = random_batch(seed=WEIGHTING_NAMES.index(weighting) * 10 + (k or 0), n_q=6)
    if options.pop("use_weights", False):
        options["weights"] = weights
    if options.pop("use_groups", False):
        options["groups"] = torch.randint(0, 3, scores.shape, generator=torch.Generator().manual_seed(5))
    got = lambda_gradients(scores, labels, mask=mask, weighting=weighting, k=k, return_loss=True,
                           **options)
    assert_matches(got, reference(scores, labels, mask, weighting=weighting, k=k, **options))


@pytest.mark.parametrize("weighting", ["ranknet", "ndcg"])
def test_groups_in_many_query_chunks_and_small_blocks_match_reference(weighting):
    # 40 queries take the query-minor block layout; a small workspace splits them into row blocks.
    gen = torch.Generator().manual_seed(11)
    scores = torch.randn(40, 24, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 3, (40, 24), generator=gen).double()
    mask = torch.arange(24)[None, :] < torch.randint(1, 25, (40, 1), generator=gen)
    groups = torch.randint(0, 4, (40, 24), generator=gen)
    expected = reference(scores, labels, mask, weighting=weighting, k=5, normalize=True, groups=groups)
    for workspace in (2**28, 2**12):
        got = lambda_gradients(scores, labels, mask=mask, weighting=weighting, k=5, normalize=True,
                               groups=groups, return_loss=True, workspace_bytes=workspace)
        assert_matches(got, expected)
    # The leaves' sums: grad is that of all pairs, hess loses the pairs inside a group.
    full = lambda_gradients(scores, labels, mask=mask, weighting=weighting, k=5, normalize=True)
    by_group = lambda t: torch.zeros(40, 4, dtype=t.dtype).scatter_add_(1, groups, t * mask)
    torch.testing.assert_close(by_group(got[0]), by_group(full[0]))
    assert bool((by_group(got[1]) <= by_group(full[1]) + 1e-12).all())


@pytest.mark.parametrize("gain", ["exp", "linear"])
def test_ndcg_gain_and_err_label_scale(gain):
    scores, labels, mask, _ = random_batch(seed=3)
    got = lambda_gradients(scores, labels, mask=mask, weighting="ndcg", gain=gain, k=4,
                           return_loss=True)
    assert_matches(got, reference(scores, labels, mask, weighting="ndcg", gain=gain, k=4))
    got = lambda_gradients(scores, labels, mask=mask, weighting="err", max_err_label=4,
                           return_loss=True)
    assert_matches(got, reference(scores, labels, mask, weighting="err", max_err_label=4))


def test_float32_matches_reference():
    scores, labels, mask, weights = random_batch(seed=11, dtype=torch.float32)
    grad, hess, loss = lambda_gradients(scores, labels, mask=mask, weighting="ndcg", weights=weights,
                                        return_loss=True)
    assert grad.dtype == hess.dtype == loss.dtype == torch.float32
    ref = reference(scores, labels, mask, weighting="ndcg", weights=weights)
    for a, e in zip((grad, hess, loss), ref):
        torch.testing.assert_close(a.double(), e, rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# RankNet against torch.autograd of the explicit loss.
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("tie_term", [False, True])
def test_ranknet_grad_is_autograd_of_the_explicit_loss(tie_term):
    scores, labels, mask, _ = random_batch(seed=5)
    scores = (scores + 0.1 * torch.randn(scores.shape, dtype=scores.dtype)).requires_grad_(True)
    sigma = 1.5
    d = scores[:, :, None] - scores[:, None, :]
    both = mask[:, :, None] & mask[:, None, :]
    better = (labels[:, :, None] > labels[:, None, :]) & both
    cost = torch.nn.functional.softplus(-sigma * d) * better
    if tie_term:
        tie = (labels[:, :, None] == labels[:, None, :]) & both
        tie = tie & torch.ones_like(tie).triu(1)  # each unordered pair once
        cost = cost + (0.5 * sigma * d + torch.nn.functional.softplus(-sigma * d)) * tie
    explicit = cost.sum((1, 2))
    (expected,) = torch.autograd.grad(explicit.sum(), scores)
    grad, _, loss = lambda_gradients(scores, labels, mask=mask, sigma=sigma, tie_term=tie_term,
                                     return_loss=True)
    torch.testing.assert_close(grad, expected.masked_fill(~mask, 0.0), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(loss, explicit.detach(), rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# A hand-checked example.
# ---------------------------------------------------------------------------------------------

def test_three_documents_by_hand():
    # Labels [2, 1, 0], scores [0, 1, 0]. The current ranking is doc1 (score 1), then the tie
    # at score 0 broken worst case (lower label first): doc2, then doc0.
    scores = torch.tensor([[0.0, 1.0, 0.0]], dtype=torch.float64)
    labels = torch.tensor([[2.0, 1.0, 0.0]], dtype=torch.float64)
    e = math.e
    rho01 = 1 / (1 + math.exp(0.0 - 1.0))  # pair (0, 1): s0 − s1 = −1
    rho02 = 1 / (1 + math.exp(0.0))  # pair (0, 2): s0 − s2 = 0
    rho12 = 1 / (1 + math.exp(1.0))  # pair (1, 2): s1 − s2 = 1
    assert rho12 == pytest.approx(1 / (1 + e))

    grad, hess = lambda_gradients(scores, labels, weighting="ranknet")
    expected_grad = [-rho01 - rho02, rho01 - rho12, rho02 + rho12]
    expected_hess = [e / (1 + e) ** 2 + 1 / 4, 2 * e / (1 + e) ** 2, 1 / 4 + e / (1 + e) ** 2]
    torch.testing.assert_close(grad, torch.tensor([expected_grad], dtype=torch.float64))
    torch.testing.assert_close(hess, torch.tensor([expected_hess], dtype=torch.float64))

    # NDCG: doc1 at position 0, doc2 at 1, doc0 at 2; gains 3, 1, 0 for docs 0, 1, 2.
    idcg = 3 + 1 / math.log2(3)
    d01 = (3 - 1) * (1 - 1 / 2) / idcg  # positions 2 and 0
    d02 = (3 - 0) * (1 / math.log2(3) - 1 / 2) / idcg  # positions 2 and 1
    d12 = (1 - 0) * (1 - 1 / math.log2(3)) / idcg  # positions 0 and 1
    grad, hess = lambda_gradients(scores, labels, weighting="ndcg")
    expected_grad = [-d01 * rho01 - d02 * rho02, d01 * rho01 - d12 * rho12,
                     d02 * rho02 + d12 * rho12]
    torch.testing.assert_close(grad, torch.tensor([expected_grad], dtype=torch.float64))

    # MAP (relevant: docs 0 and 1): AP = (1/1 + 2/3) / 2 = 5/6. Swapping doc0 and doc2 gives
    # (1/1 + 2/2) / 2 = 1, swapping doc1 and doc2 gives (1/2 + 2/3) / 2 = 7/12; doc0 and doc1
    # are both relevant, so their pair weighs 0.
    m02 = 1 - 5 / 6
    m12 = 5 / 6 - 7 / 12
    grad, _ = lambda_gradients(scores, labels, weighting="map")
    expected_grad = [-m02 * rho02, -m12 * rho12, m02 * rho02 + m12 * rho12]
    torch.testing.assert_close(grad, torch.tensor([expected_grad], dtype=torch.float64))


# ---------------------------------------------------------------------------------------------
# Properties.
# ---------------------------------------------------------------------------------------------

@st.composite
def batches(draw, max_q=3, max_l=7):
    n_q = draw(st.integers(1, max_q))
    n_d = draw(st.integers(1, max_l))
    cells = n_q * n_d
    scores = draw(st.lists(st.sampled_from([-2.0, -0.5, 0.0, 0.5, 1.0, 3.0]) | st.floats(-5, 5),
                           min_size=cells, max_size=cells))
    labels = draw(st.lists(st.integers(0, 3), min_size=cells, max_size=cells))
    mask = draw(st.lists(st.booleans(), min_size=cells, max_size=cells))
    return (torch.tensor(scores, dtype=torch.float64).view(n_q, n_d),
            torch.tensor(labels, dtype=torch.float64).view(n_q, n_d),
            torch.tensor(mask).view(n_q, n_d))


options = st.fixed_dictionaries({
    "weighting": st.sampled_from(WEIGHTING_NAMES),
    "k": st.none() | st.integers(1, 8),
    "tie_term": st.booleans(),
    "normalize": st.booleans(),
    "sigma": st.sampled_from([0.5, 1.0, 2.0]),
})


@settings(max_examples=60, deadline=None)
@given(batches(), options, st.integers(1, 4))
def test_padding_changes_nothing(batch, opts, extra):
    scores, labels, mask = batch
    grad, hess, loss = lambda_gradients(scores, labels, mask=mask, return_loss=True, **opts)
    # Add padding columns (with garbage, even NaN) and a fully padded query.
    n_q, n_d = scores.shape
    pad_s = torch.full((n_q, extra), float("nan"), dtype=scores.dtype)
    pad_y = torch.full((n_q, extra), 9.0, dtype=scores.dtype)
    s2 = torch.cat([torch.cat([pad_s, scores], 1), torch.randn(1, n_d + extra, dtype=scores.dtype)])
    y2 = torch.cat([torch.cat([pad_y, labels], 1), torch.ones(1, n_d + extra, dtype=scores.dtype)])
    m2 = torch.cat([torch.cat([torch.zeros(n_q, extra, dtype=torch.bool), mask], 1),
                    torch.zeros(1, n_d + extra, dtype=torch.bool)])
    if opts["weighting"] == "err":
        opts = dict(opts, max_err_label=3)  # the batch maximum would see the padded 9s' absence
        grad, hess, loss = lambda_gradients(scores, labels, mask=mask, return_loss=True, **opts)
    g2, h2, l2 = lambda_gradients(s2, y2, mask=m2, return_loss=True, **opts)
    torch.testing.assert_close(g2[:n_q, extra:], grad)
    torch.testing.assert_close(h2[:n_q, extra:], hess)
    torch.testing.assert_close(l2[:n_q], loss)
    assert not g2[:n_q, :extra].any() and not h2[:n_q, :extra].any()
    assert not g2[n_q:].any() and not h2[n_q:].any() and not l2[n_q:].any()


@settings(max_examples=60, deadline=None)
@given(batches(), options, st.randoms(use_true_random=False))
def test_permuting_documents_permutes_outputs(batch, opts, rnd):
    scores, labels, mask = batch
    perm = torch.stack([torch.tensor(rnd.sample(range(scores.shape[1]), scores.shape[1]))
                        for _ in range(scores.shape[0])])
    out = lambda_gradients(scores, labels, mask=mask, **opts)
    out_p = lambda_gradients(scores.gather(1, perm), labels.gather(1, perm), mask=mask.gather(1, perm),
                             **opts)
    # Documents with the same score and label are interchangeable: where the ranking puts
    # each of them is arbitrary, so compare the sums over such groups.
    same = ((scores[:, :, None] == scores[:, None, :]) & (labels[:, :, None] == labels[:, None, :])
            & mask[:, :, None] & mask[:, None, :]).to(scores.dtype)
    for a, b in zip(out, out_p):
        grouped = (same @ a[:, :, None])[:, :, 0]
        grouped_p = (same.gather(1, perm[:, :, None].expand_as(same)).gather(2, perm[:, None, :].expand_as(same))
                     @ b[:, :, None])[:, :, 0]
        torch.testing.assert_close(grouped_p, grouped.gather(1, perm))


@settings(max_examples=60, deadline=None)
@given(batches(), options)
def test_grad_sums_to_zero_and_hess_is_non_negative(batch, opts):
    scores, labels, mask = batch
    grad, hess = lambda_gradients(scores, labels, mask=mask, **opts)
    torch.testing.assert_close(grad.sum(1), torch.zeros(len(grad), dtype=grad.dtype), atol=1e-12,
                               rtol=0)
    assert (hess >= 0).all()
    assert not grad.masked_select(~mask).any() and not hess.masked_select(~mask).any()


@settings(max_examples=40, deadline=None)
@given(batches(), options, st.integers(0, 3))
def test_all_equal_labels_give_zeros(batch, opts, label):
    scores, _, mask = batch
    labels = torch.full_like(scores, float(label))
    opts = dict(opts, tie_term=False)
    grad, hess = lambda_gradients(scores, labels, mask=mask, **opts)
    assert not grad.any() and not hess.any()


@settings(max_examples=40, deadline=None)
@given(batches(), options, st.floats(0.1, 10))
def test_a_constant_query_weight_scales_linearly(batch, opts, w):
    scores, labels, mask = batch
    weights = torch.full_like(scores, w)
    plain = lambda_gradients(scores, labels, mask=mask, return_loss=True, **opts)
    weighted = lambda_gradients(scores, labels, mask=mask, weights=weights, return_loss=True, **opts)
    for a, b in zip(plain, weighted):
        torch.testing.assert_close(b, w * a)


def test_weighting_passed_as_a_value():
    scores, labels, mask, _ = random_batch(seed=2)
    by_name = lambda_gradients(scores, labels, mask=mask, weighting="ndcg", k=3)
    by_value = lambda_gradients(scores, labels, mask=mask, weighting=WEIGHTINGS["ndcg"], k=3)
    for a, b in zip(by_name, by_value):
        torch.testing.assert_close(a, b)


# ---------------------------------------------------------------------------------------------
# Numerics and edge cases.
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("weighting", WEIGHTING_NAMES)
def test_huge_score_gaps_stay_finite(weighting, dtype):
    # Doc 0 (label 1) far above doc 1 (label 0): right by 1e4. Docs 2, 3 wrong by 1e4.
    scores = torch.tensor([[1e4, -1e4, 0.0, 0.0], [-1e4, 1e4, -1e4, 1e4]], dtype=dtype)
    labels = torch.tensor([[1.0, 0.0, 1.0, 1.0], [1.0, 0.0, 2.0, 2.0]], dtype=dtype)
    mask = torch.tensor([[True, True, False, False], [True, True, True, True]])
    for tie_term in (False, True):
        grad, hess, loss = lambda_gradients(scores, labels, mask=mask, weighting=weighting,
                                            tie_term=tie_term, normalize=True, return_loss=True)
        assert torch.isfinite(grad).all() and torch.isfinite(hess).all()
        assert torch.isfinite(loss).all()
    grad, hess, loss = lambda_gradients(scores, labels, mask=mask, return_loss=True)
    assert not grad[0].any() and loss[0] == 0  # right by 2e4: nothing to learn
    # Query 1, RankNet pairs: 0>1 wrong by 2e4 (λ = −1, cost 2e4), 2>0 and 3>1 level (λ = −1/2,
    # cost log 2), 3>0 right by 2e4 (0), 2>1 wrong by 2e4 (λ = −1, cost 2e4).
    expected = torch.tensor([-1 + 1 / 2, 1 + 1 + 1 / 2, -1 / 2 - 1, -1 / 2], dtype=dtype)
    torch.testing.assert_close(grad[1], expected)
    assert loss[1].item() == pytest.approx(2e4 + 2e4 + 2 * math.log(2), rel=1e-6)


def test_huge_gap_loss_values():
    scores = torch.tensor([[-1e4, 1e4]], dtype=torch.float32)
    labels = torch.tensor([[1.0, 0.0]])
    grad, hess, loss = lambda_gradients(scores, labels, return_loss=True)
    assert grad.tolist() == [[-1.0, 1.0]] and hess.tolist() == [[0.0, 0.0]]
    assert loss.item() == pytest.approx(2e4)
    grad, hess, loss = lambda_gradients(-scores, labels, return_loss=True, tie_term=True)
    assert grad.tolist() == [[0.0, 0.0]] and loss.item() == 0.0
    grad, hess, loss = lambda_gradients(scores, torch.zeros(1, 2), return_loss=True, tie_term=True)
    assert grad.tolist() == [[-0.5, 0.5]] and loss.item() == pytest.approx(1e4)  # ½σ|d|


@pytest.mark.parametrize("weighting", WEIGHTING_NAMES)
def test_empty_single_and_zero_ideal_queries_give_zeros(weighting):
    scores = torch.randn(4, 5)
    labels = torch.tensor([[1.0, 2, 0, 1, 3], [2.0, 0, 0, 0, 0], [0.0, 0, 0, 0, 0], [3.0, 1, 0, 2, 1]])
    mask = torch.tensor([[False] * 5, [True] + [False] * 4, [True] * 5, [True] * 5])
    grad, hess, loss = lambda_gradients(scores, labels, mask=mask, weighting=weighting,
                                        normalize=True, return_loss=True)
    assert torch.isfinite(grad).all() and torch.isfinite(hess).all()
    # All-masked query, single-document query, query without any relevant document.
    assert not grad[:3].any() and not hess[:3].any() and not loss[:3].any()
    assert grad[3].abs().sum() > 0


def test_empty_batch():
    grad, hess, loss = lambda_gradients(torch.zeros(0, 3), torch.zeros(0, 3), return_loss=True)
    assert grad.shape == hess.shape == (0, 3) and loss.shape == (0,)


def test_scores_requiring_grad_are_detached_and_dtype_is_kept():
    scores = torch.randn(2, 4, requires_grad=True)
    grad, hess = lambda_gradients(scores, torch.tensor([[1, 0, 2, 1], [0, 0, 1, 3]]))
    assert not grad.requires_grad and grad.dtype == torch.float32


# ---------------------------------------------------------------------------------------------
# Memory: blocking never changes the answer; long lists run.
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [None, 5])
@pytest.mark.parametrize("weighting", WEIGHTING_NAMES)
def test_workspace_size_does_not_change_the_result(weighting, k):
    gen = torch.Generator().manual_seed(7)
    n_q, n_d = 9, 70
    scores = torch.randn(n_q, n_d, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 5, (n_q, n_d), generator=gen).double()
    lengths = torch.tensor([70, 1, 3, 40, 2, 69, 17, 0, 33])
    mask = torch.arange(n_d)[None, :] < lengths[:, None]
    big = lambda_gradients(scores, labels, mask=mask, weighting=weighting, k=k, return_loss=True,
                           normalize=True)
    for workspace in (1, 1000, 20_000):  # 1 byte: one pair per block
        small = lambda_gradients(scores[:4], labels[:4], mask=mask[:4], weighting=weighting, k=k,
                                 return_loss=True, normalize=True, workspace_bytes=workspace)
        for a, b in zip(small, big):
            torch.testing.assert_close(a, b[:4])
        if workspace > 1:
            small = lambda_gradients(scores, labels, mask=mask, weighting=weighting, k=k,
                                     return_loss=True, normalize=True, workspace_bytes=workspace)
            for a, b in zip(small, big):
                torch.testing.assert_close(a, b)


def test_ten_thousand_documents_with_truncation():
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(1, 10_000, generator=gen)
    labels = torch.randint(0, 5, (1, 10_000), generator=gen).float()
    start = time.perf_counter()
    grad, hess = lambda_gradients(scores, labels, weighting="ndcg", k=10)
    assert time.perf_counter() - start < 2.0
    assert torch.isfinite(grad).all() and (hess >= 0).all()
    assert abs(grad.sum().item()) < 1e-4
    # Only pairs with a document in the top 10 exist: the other documents are each in at most
    # 10 pairs, and the top 10 get a gradient.
    top = torch.argsort(scores[0], descending=True)[:10]
    assert (grad[0, top] != 0).any()


@pytest.mark.slow
def test_ten_thousand_documents_untruncated_matches_blocks():
    gen = torch.Generator().manual_seed(1)
    scores = torch.randn(1, 10_000, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 5, (1, 10_000), generator=gen).double()
    grad, hess = lambda_gradients(scores, labels, weighting="ranknet")
    # Closed form for RankNet, per document against all others, for every 20th document.
    s, y = scores[0], labels[0]
    rows = torch.arange(0, 10_000, 20)
    d = s[rows, None] - s[None, :]
    better = (y[rows, None] > y[None, :]).double()
    worse = (y[rows, None] < y[None, :]).double()
    expected = (-torch.sigmoid(-d) * better + torch.sigmoid(d) * worse).sum(1)
    torch.testing.assert_close(grad[0, rows], expected)
    assert abs(grad.sum().item()) < 1e-8 and (hess > 0).all()


# ---------------------------------------------------------------------------------------------
# Validation and devices.
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    (dict(weighting="dcg"), "`weighting`"),
    (dict(k=0), "`k`"),
    (dict(k=2.5), "`k`"),
    (dict(sigma=0.0), "`sigma`"),
    (dict(gain="log"), "`gain`"),
    (dict(mask=torch.ones(2, 3)), "`mask`"),
    (dict(weights=-torch.ones(2, 3)), "`weights`"),
    (dict(workspace_bytes=0), "`workspace_bytes`"),
    (dict(weighting="err", max_err_label=1), "`max_err_label`"),
    (dict(groups=torch.zeros(2, 3)), "`groups`"),
    (dict(groups=torch.zeros(3, 2, dtype=torch.long)), "`groups`"),
    (dict(groups=torch.full((2, 3), 2**24)), "`groups`"),
])
def test_invalid_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        lambda_gradients(torch.zeros(2, 3), torch.tensor([[0.0, 1, 2], [0, 0, 1]]), **kwargs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("weighting", WEIGHTING_NAMES)
def test_cuda_matches_cpu(weighting):
    scores, labels, mask, weights = random_batch(seed=13, n_q=6)
    opts = dict(mask=mask, weighting=weighting, k=3, tie_term=True, normalize=True,
                weights=weights, return_loss=True)
    cpu = lambda_gradients(scores, labels, **opts)
    cuda_opts = {key: v.cuda() if isinstance(v, torch.Tensor) else v for key, v in opts.items()}
    cuda = lambda_gradients(scores.cuda(), labels.cuda(), **cuda_opts)
    for a, b in zip(cpu, cuda):
        assert b.is_cuda
        torch.testing.assert_close(b.cpu(), a)


@pytest.mark.parametrize("weighting", WEIGHTING_NAMES)
@pytest.mark.parametrize("seed", range(4))
def test_float32_ties_match_reference(weighting, seed):
    # float32 scores with ties between different labels take the one-sort (score, −label) key.
    scores, labels, mask, _ = random_batch(seed=100 + seed, n_q=6, n_d=12, dtype=torch.float32)
    got = lambda_gradients(scores, labels, mask=mask, weighting=weighting, k=5, return_loss=True)
    ref = reference(scores.double(), labels.double(), mask, weighting=weighting, k=5)
    for a, e in zip(got, ref):
        torch.testing.assert_close(a.double(), e, rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# Any integer grade, exactly (NDCG and ERR against exact rational metrics).
# ---------------------------------------------------------------------------------------------

def _exact_metric(ranked, weighting, k, max_label):
    """NDCG@k (exp gain) or ERR@k of integer labels in ranked order, as an exact Fraction."""
    from fractions import Fraction

    cut = len(ranked) if k is None else min(k, len(ranked))
    if weighting == "ndcg":
        # Discounts are irrational: keep them as floats, but the gains exact (2^1000 − 1 and 1
        # differ by 1000 binary digits), and the ratio taken last.
        disc = [Fraction(1 / math.log2(p + 2)) for p in range(cut)]
        dcg = sum(((2 ** y - 1) * disc[p] for p, y in enumerate(ranked[:cut])), Fraction(0))
        ideal = sum(((2 ** y - 1) * disc[p] for p, y in enumerate(sorted(ranked, reverse=True)[:cut])),
                    Fraction(0))
        return dcg / ideal if ideal else Fraction(0)
    total, go_on = Fraction(0), Fraction(1)
    for p, y in enumerate(ranked[:cut]):
        r = Fraction(2 ** y - 1, 2 ** max_label)
        total += go_on * r / (p + 1)
        go_on *= 1 - r
    return total


def exact_reference(scores, labels, *, weighting, k=None, normalize=False, max_label=None):
    """(grad, hess) of every query by a double loop over pairs, with |ΔZ| from exact metrics."""
    n_q, n_d = scores.shape
    grad = torch.zeros(n_q, n_d, dtype=torch.float64)
    hess = torch.zeros(n_q, n_d, dtype=torch.float64)
    for q in range(n_q):
        s, y = scores[q].double().tolist(), [int(v) for v in labels[q].tolist()]
        ranked = sorted(range(n_d), key=lambda i: (-s[i], y[i], i))
        pos = {i: p for p, i in enumerate(ranked)}
        base = _exact_metric([y[i] for i in ranked], weighting, k, max_label)
        total = 0.0
        for i in range(n_d):
            for j in range(n_d):
                if y[i] <= y[j] or (k is not None and min(pos[i], pos[j]) >= k):
                    continue
                swapped = list(ranked)
                swapped[pos[i]], swapped[pos[j]] = j, i
                delta = float(abs(_exact_metric([y[d] for d in swapped], weighting, k, max_label) - base))
                rho = 1.0 / (1.0 + math.exp(s[i] - s[j]))
                grad[q, i] -= delta * rho
                grad[q, j] += delta * rho
                hess[q, i] += delta * rho * (1 - rho)
                hess[q, j] += delta * rho * (1 - rho)
                total += 2 * delta * rho
        if normalize and total > 0:
            grad[q] *= math.log2(1 + total) / total
            hess[q] *= math.log2(1 + total) / total
    return grad, hess


HIGH_GRADES = [
    torch.tensor([[0, 500, 1000, 0, 500, 1000], [1000, 1000, 999, 0, 1, 998]]),
    torch.randperm(41, generator=torch.Generator().manual_seed(0))[None, :].repeat(2, 1),  # 0..40
    torch.tensor([[25, 0, 24, 25, 3, 1]]),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("k", [None, 3])
@pytest.mark.parametrize("weighting", ["ndcg", "err"])
@pytest.mark.parametrize("case", range(len(HIGH_GRADES)))
def test_any_integer_grade_matches_exact_metrics(case, weighting, k, normalize, dtype):
    labels = HIGH_GRADES[case]
    gen = torch.Generator().manual_seed(case)
    scores = torch.randn(labels.shape, generator=gen, dtype=torch.float64)
    top = int(labels.max())
    grad, hess = lambda_gradients(scores.to(dtype), labels.to(dtype), weighting=weighting, k=k,
                                  normalize=normalize, max_err_label=top)
    want_g, want_h = exact_reference(scores.to(dtype), labels, weighting=weighting, k=k,
                                     normalize=normalize, max_label=top)
    assert torch.isfinite(grad).all() and torch.isfinite(hess).all()
    tol = dict(rtol=1e-4, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(grad.double(), want_g, **tol)
    torch.testing.assert_close(hess.double(), want_h, **tol)


@pytest.mark.parametrize("weighting", WEIGHTING_NAMES)
@pytest.mark.parametrize("label", [0, 1, 4, 1000])
def test_a_query_of_equal_labels_gives_zero_lambdas(weighting, label):
    scores = torch.randn(2, 6, generator=torch.Generator().manual_seed(label))
    labels = torch.full((2, 6), float(label))
    grad, hess, loss = lambda_gradients(scores, labels, weighting=weighting, normalize=True,
                                        return_loss=True)
    assert not grad.any() and not hess.any() and not loss.any()


@pytest.mark.parametrize("field, value, match", [
    ("scores", math.nan, r"`scores` has to be finite on real documents, got nan at \[1, 2\]"),
    ("scores", -math.inf, r"`scores` has to be finite .* got -inf at \[1, 2\]"),
    ("labels", math.nan, r"`labels` has to be finite and non-negative .* got nan at \[1, 2\]"),
    ("labels", math.inf, r"`labels` has to be finite .* got inf at \[1, 2\]"),
    ("labels", -1.0, r"`labels` has to be finite and non-negative .* got -1.0 at \[1, 2\]"),
    ("weights", math.nan, r"`weights` has to be finite and non-negative .* got nan at \[1, 2\]"),
    ("weights", math.inf, r"`weights` has to be finite .* got inf at \[1, 2\]"),
    ("weights", -0.5, r"`weights` has to be .* got -0.5 at \[1, 2\]"),
])
def test_bad_values_on_real_documents_are_named_with_their_position(field, value, match):
    batch = {"scores": torch.zeros(2, 4), "labels": torch.ones(2, 4), "weights": torch.ones(2, 4)}
    batch[field][1, 2] = value
    batch[field][0, 3] = value  # under the padding: ignored
    mask = torch.tensor([[True, True, True, False], [True] * 4])
    with pytest.raises(ValueError, match=match):
        lambda_gradients(batch["scores"], batch["labels"], mask=mask, weights=batch["weights"])
    batch[field][1, 2] = 1.0
    lambda_gradients(batch["scores"], batch["labels"], mask=mask, weights=batch["weights"])
