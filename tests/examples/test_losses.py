"""rankkit.examples.losses: each worked example is the formula its docstring states (a float64 loop
over the documents and pairs of each query), ignores padding, and each declared loss equals its
listwise twin."""
import math

import pytest
import torch

from rankkit.examples import losses as L


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(4, 7, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 4, (4, 7), generator=g).double()
    mask = torch.ones(4, 7, dtype=torch.bool)
    mask[1, 5:] = False
    mask[2, 2:] = False
    labels[3] = 0.0  # nothing relevant
    return scores, labels, mask


def _softplus(x):
    return math.log1p(math.exp(-abs(x))) + max(x, 0.0)


def _loop(scores, labels, mask, per_query):
    out = []
    for s, y, m in zip(scores.tolist(), labels.tolist(), mask.tolist()):
        real = [i for i in range(len(s)) if m[i]]
        out.append(per_query([s[i] for i in real], [y[i] for i in real]))
    return torch.tensor(out, dtype=torch.float64)


def _pairs(y):
    return [(i, j) for i in range(len(y)) for j in range(len(y)) if y[i] > y[j]]


def _ranknet(s, y):
    return sum(_softplus(-(s[i] - s[j])) for i, j in _pairs(y))


def _hinge(s, y):
    p = _pairs(y)
    return sum(max(0.0, 1.0 - (s[i] - s[j])) ** 2 for i, j in p) / max(1, len(p))


def _smoothed_softmax(s, y, eps=0.1):
    total = sum(y)
    if total == 0:
        return 0.0
    log_norm = math.log(sum(math.exp(v) for v in s))
    return -sum(((1 - eps) * y[i] / total + eps / len(s)) * (s[i] - log_norm) for i in range(len(s)))


def _plus_pointwise(s, y, alpha=0.1):
    return _smoothed_softmax(s, y, 0.0) + alpha * sum((a - b) ** 2 for a, b in zip(s, y)) / len(s)


def _gain_gap(s, y):
    return sum((2 ** y[i] - 2 ** y[j]) * _softplus(-(s[i] - s[j])) for i, j in _pairs(y))


LISTWISE = {"ranknet": _ranknet, "squared_pairwise_hinge": _hinge, "smoothed_softmax": _smoothed_softmax,
            "softmax_plus_pointwise": _plus_pointwise}


@pytest.mark.parametrize("name", LISTWISE)
def test_each_listwise_example_is_its_formula_and_ignores_padding(name):
    scores, labels, mask = _batch()
    got = getattr(L, name)(scores, labels, mask)
    torch.testing.assert_close(got, _loop(scores, labels, mask, LISTWISE[name]), rtol=1e-12, atol=1e-12)
    garbage = scores.masked_fill(~mask, 1e3), labels.masked_fill(~mask, 3.0)
    torch.testing.assert_close(getattr(L, name)(*garbage, mask), got, rtol=0, atol=0)


@pytest.mark.parametrize("declared, formula", [(L.declared_ranknet, _ranknet), (L.declared_squared_hinge, _hinge),
                                               (L.label_gap_logistic, _gain_gap)])
def test_each_declared_example_is_its_formula(declared, formula):
    scores, labels, mask = _batch(seed=1)
    got = declared.per_query(scores, labels, mask)
    torch.testing.assert_close(got, _loop(scores, labels, mask, formula), rtol=1e-12, atol=1e-12)


def test_the_declared_twins_train_with_the_listwise_gradients():
    scores, labels, mask = _batch(seed=2)
    for declared, listwise in ((L.declared_ranknet, L.ranknet), (L.declared_squared_hinge, L.squared_pairwise_hinge)):
        leaf = scores.clone().requires_grad_(True)
        listwise(leaf, labels, mask).sum().backward()
        grad = declared.gradients(scores, labels, mask)[0]
        torch.testing.assert_close(grad.masked_fill(~mask, 0.0), leaf.grad.masked_fill(~mask, 0.0),
                                   rtol=1e-12, atol=1e-12)
