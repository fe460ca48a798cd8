"""rankkit.lambdas.weightings: each weighting's pair rule is the drop in its metric when the two
documents swap, checked against rankkit.metrics scoring both rankings (float64)."""
import pytest
import torch

from rankkit.lambdas.weightings import WEIGHTINGS, ndcg_loss2pp
from rankkit.metrics import average_precision, err, ndcg


def _pair_matrix(name, labels, mask, k):
    """W [L, L] from the weighting's terms and pair rule, query-major, for one query in rank order."""
    w = WEIGHTINGS[name]
    terms = w.doc_terms(labels, mask, k, "exp", 4.0)
    rows = tuple(t[:, :, None] for t in terms)
    cols = tuple(t[:, None, :] for t in terms)
    n = labels.shape[1]
    return w.signed_delta(rows, cols, torch.empty(1, n, n, dtype=labels.dtype))[0]


METRICS = {"ndcg": lambda s, y, m, k: ndcg(s, y, mask=m, k=k, empty=0.0),
           "map": lambda s, y, m, k: average_precision(s, y, mask=m, k=k, empty=0.0),
           "err": lambda s, y, m, k: err(s, y, mask=m, k=k, max_label=4.0)}


@pytest.mark.parametrize("name", ["ndcg", "map", "err"])
@pytest.mark.parametrize("k", [None, 3])
@pytest.mark.parametrize("seed", range(4))
def test_the_pair_rule_is_the_metrics_drop_when_the_pair_swaps(name, k, seed):
    g = torch.Generator().manual_seed(seed)
    n, real = 9, 7  # two padding slots at the end
    labels = torch.randint(0, 5, (1, n), generator=g).double()
    labels[0, real:] = 0
    mask = torch.arange(n)[None, :] < real
    scores = (n - torch.arange(n)).double()[None, :]  # the current ranking: position order
    metric = METRICS[name]
    before = metric(scores, labels, mask, k)
    w = _pair_matrix(name, labels, mask, n if k is None else k)
    for a in range(real if k is None else k):  # the kernel visits the rows a < k only (plan_blocks)
        for b in range(a + 1, real):
            swapped = scores.clone()
            swapped[0, a], swapped[0, b] = scores[0, b], scores[0, a]
            drop = float(before - metric(swapped, labels, mask, k))
            assert float(w[a, b]) == pytest.approx(drop, abs=1e-12), (a, b)


def test_ranknet_counts_every_pair_once_by_its_label_order():
    labels = torch.tensor([[2.0, 0.0, 2.0, 1.0]], dtype=torch.float64)
    w = _pair_matrix("ranknet", labels, torch.ones(1, 4, dtype=torch.bool), 4)
    assert torch.equal(w, torch.sign(labels[0][:, None] - labels[0][None, :]))
    assert WEIGHTINGS["ranknet"].tie_weight == 1.0 and WEIGHTINGS["ndcg"].tie_weight == 0.0


@pytest.mark.parametrize("name, weight", [("arp1", lambda ya, yb: ya if ya > yb else (-yb if yb > ya else 0.0)),
                                          ("arp2", lambda ya, yb: ya - yb), ("labeldiff", lambda ya, yb: ya - yb)])
def test_the_label_weightings_are_their_formulas(name, weight):
    labels = torch.tensor([[3.0, 1.0, 1.0, 0.0, 2.0]], dtype=torch.float64)
    w = _pair_matrix(name, labels, torch.ones(1, 5, dtype=torch.bool), 5)
    y = labels[0].tolist()
    for a in range(5):
        for b in range(a + 1, 5):
            assert float(w[a, b]) == pytest.approx(weight(y[a], y[b]))


def test_ndcg_loss2pp_with_mu_0_is_the_ndcg_rule_of_neighbouring_swaps_in_size():
    # (ρ_ij + μ δ_ij)|G_i − G_j| with μ = 0 weighs a pair by its gain gap times the discount gap.
    labels = torch.tensor([[3.0, 0.0, 2.0, 1.0]], dtype=torch.float64)
    mask = torch.ones(1, 4, dtype=torch.bool)
    w = ndcg_loss2pp(0.0)
    terms = w.doc_terms(labels, mask, 4, "exp", 4.0)
    rows, cols = tuple(t[:, :, None] for t in terms), tuple(t[:, None, :] for t in terms)
    zero_mu = w.signed_delta(rows, cols, torch.empty(1, 4, 4, dtype=torch.float64))[0]
    more_mu = ndcg_loss2pp(10.0).signed_delta(rows, cols, torch.empty(1, 4, 4, dtype=torch.float64))[0]
    upper = torch.triu(torch.ones(4, 4, dtype=torch.bool), 1)
    assert (zero_mu.abs() <= more_mu.abs() + 1e-15)[upper].all() and not torch.equal(zero_mu, more_mu)
    assert torch.equal(torch.sign(zero_mu)[upper], torch.sign(labels[0][:, None] - labels[0][None, :])[upper])
