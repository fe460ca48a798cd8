"""rankkit.boosting.objectives: every named objective grows the Newton leaves of its gradients;
Unbiased LambdaMART's pair weights."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rankkit.boosting import LambdaMART

from .conftest import small_set

pytestmark = pytest.mark.usefixtures("one_thread")  # every test here on one thread


# -- every named objective, and Unbiased LambdaMART -------------------------------------------------
def _first_round_leaves(train, leaf, grad, hess, lr, l2):
    g = torch.zeros(int(leaf.max()) + 1, dtype=torch.float64).index_add_(0, leaf, grad.double())
    h = torch.zeros_like(g).index_add_(0, leaf, hess.double())
    return -lr * g / (h + l2)


def _leaf_of_raw(ensemble, x):
    return sum((x[:, int(f)] > t).long() << k for k, (f, t) in enumerate(zip(ensemble.features[0],
                                                                              ensemble.thresholds[0])))


@pytest.mark.parametrize("objective", ["softmax", "xendcg", "listmle", "approx_ndcg", "ndcg_loss2pp", "arp1",
                                       "ranknet"])
def test_every_named_objective_grows_newton_leaves_of_its_gradients(objective):
    # The booster's first tree: leaves −η ΣG / (ΣH + λ) of the registry's (grad, hess) at F_0 = 0.
    from rankkit.losses import objective_gradients

    train = small_set(4, n_queries=12, docs=10, n_features=4)
    lr, l2 = 0.5, 0.3
    model = LambdaMART(objective, n_estimators=1, depth=2, learning_rate=lr, l2=l2, min_data_in_leaf=2,
                       min_sum_hessian=0.0, seed=3).fit(train)
    batch = train.padded()
    options = {"generator": torch.Generator().manual_seed(3)} if objective in ("xendcg", "listmle") else {}
    grad, hess, _ = objective_gradients(objective, torch.zeros(batch.labels.shape), batch.labels,
                                        mask=batch.mask, **options)
    leaf = _leaf_of_raw(model.ensemble_, train.features)
    expected = _first_round_leaves(train, leaf, grad[batch.mask], hess[batch.mask], lr, l2)
    got = model.ensemble_.leaf_values[0][: len(expected)].double()
    used = torch.bincount(leaf, minlength=len(expected)) > 0
    torch.testing.assert_close(got[used], expected[used], rtol=1e-4, atol=1e-6)


def test_unbiased_lambdamart_weighs_pairs_by_the_estimated_propensities():
    # Round 1 by hand: the propensities updated at F_0 = 0 from the click log, then the kernel's
    # pair weights 1/(t+(pos_i) t-(pos_j)), then Newton leaves. The booster must do the same.
    from rankkit.losses import objective_gradients
    from rankkit.clicks.propensity import PropensityEstimator

    g = torch.Generator().manual_seed(0)
    sizes = torch.full((40,), 8)
    x = torch.randn(320, 4, generator=g)
    position = torch.arange(8).repeat(40)
    clicks = (torch.rand(320, generator=g) < 0.6 / (position + 1.0) + 0.2 * (x[:, 0] > 0)).float()
    lr, l2 = 0.5, 0.3
    model = LambdaMART(n_estimators=1, depth=2, learning_rate=lr, l2=l2, min_data_in_leaf=2, min_sum_hessian=0.0,
                       unbiased=True, n_positions=8, bias_p=1.0).fit(x, clicks, group=sizes, position=position)
    est = PropensityEstimator(8, p=1.0)
    zeros, y, pos = torch.zeros(40, 8), clicks.view(40, 8), position.view(40, 8)
    mask = torch.ones(40, 8, dtype=torch.bool)
    est.update(zeros, y, pos, mask)
    np.testing.assert_allclose(model.propensities_["clicked"], est.t_plus.numpy())
    np.testing.assert_allclose(model.propensities_["unclicked"], est.t_minus.numpy())
    assert model.propensities_["clicked"][0] == 1.0 and model.propensities_["clicked"][3] < 1.0
    grad, hess, _ = objective_gradients("ndcg", zeros, y, mask=mask, pair_weights=est.pair_factors(pos, mask))
    leaf = _leaf_of_raw(model.ensemble_, x)
    expected = _first_round_leaves(None, leaf, grad.view(-1), hess.view(-1), lr, l2)
    used = torch.bincount(leaf, minlength=len(expected)) > 0
    torch.testing.assert_close(model.ensemble_.leaf_values[0][: len(expected)].double()[used], expected[used],
                               rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="position"):
        LambdaMART(n_estimators=1, unbiased=True).fit(x, clicks, group=sizes)
    with pytest.raises(ValueError, match="unbiased"):
        LambdaMART("softmax", n_estimators=1, unbiased=True).fit(x, clicks, group=sizes, position=position)
