"""rankkit.boosting.engine: exact Newton leaves, CUDA against CPU, the Bayesian bootstrap and split-
score noise, seeded."""
from __future__ import annotations

import pytest
import torch

from rankkit.boosting import LambdaMART, QuantileBinner
from rankkit.boosting.engine import valid_codes as _valid_codes
from rankkit.boosting.tree import ObliviousTreeGrower, TreeParams

from .conftest import small_set

pytestmark = pytest.mark.usefixtures("one_thread")  # every test here on one thread


@pytest.mark.parametrize("exact", [True, False])
def test_exact_newton_leaves_are_autograd_newton_steps_of_the_pair_loss(exact):
    # RankNet (|ΔZ| = 1): the loss of the first round as a function of the leaf values γ is
    # C(γ) = Σ_{y_i > y_j} log(1 + exp(−σ(s_i + γ_l(i) − s_j − γ_l(j)))), at s = 0. Its
    # exact Newton step per leaf is −η ∂C/∂γ / (∂²C/∂γ² + λ), computed here by autograd. The
    # diagonal ΣH of Burges' algorithm counts the pairs inside a leaf as well, and differs.
    train = small_set(3, n_queries=6, docs=10, n_features=4)
    lr, l2, sigma = 0.7, 0.5, 1.3
    model = LambdaMART("ranknet", n_estimators=1, depth=2, learning_rate=lr, l2=l2, sigma=sigma,
                       min_data_in_leaf=2, min_sum_hessian=0.0, exact_newton=exact).fit(train)
    e = model.ensemble_  # leaf = Σ_k [x_{f_k} > t_k] 2^k on the raw features
    leaf = sum((train.features[:, int(f)] > t).long() << k
               for k, (f, t) in enumerate(zip(e.features[0], e.thresholds[0])))
    labels = train.labels.double()

    def loss(gamma):
        total = gamma.new_zeros(())
        for q in range(train.n_queries):
            lo, hi = int(train.offsets[q]), int(train.offsets[q + 1])
            y, f = labels[lo:hi], gamma[leaf[lo:hi]]
            better = y[:, None] > y[None, :]
            total = total + torch.nn.functional.softplus(-sigma * (f[:, None] - f[None, :]))[better].sum()
        return total

    gamma = torch.zeros(4, dtype=torch.float64)
    g = torch.autograd.functional.jacobian(loss, gamma)
    h = torch.autograd.functional.hessian(loss, gamma).diagonal()
    expected = -lr * g / (h + l2)
    got = e.leaf_values[0]
    assert int((torch.bincount(leaf, minlength=4) > 0).sum()) >= 3
    if exact:
        torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-7)
    else:
        assert not torch.allclose(got.double(), expected, rtol=1e-3)


# -- CUDA (when a GPU is lent) --------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_grows_the_same_trees_as_cpu():
    train = small_set(n_queries=60)
    kw = dict(n_estimators=5, depth=4, min_data_in_leaf=3)
    cpu = LambdaMART(**kw).fit(train).ensemble_
    gpu = LambdaMART(device="cuda", **kw).fit(train).ensemble_
    assert torch.equal(cpu.features, gpu.features.cpu())
    assert torch.equal(cpu.thresholds, gpu.thresholds.cpu())
    torch.testing.assert_close(cpu.leaf_values, gpu.leaf_values.cpu(), rtol=1e-4, atol=1e-6)


# -- Bayesian bootstrap (bagging_temperature) -------------------------------------------------------
def test_bayesian_bootstrap_weights_per_query():
    from rankkit.boosting.engine import bayesian_bootstrap_weights

    sizes = torch.tensor([3, 1, 4])
    w = bayesian_bootstrap_weights(sizes, 1.0, torch.Generator().manual_seed(0))
    assert w.shape == (8,) and bool((w >= 0).all())
    assert len(set(w[:3].tolist())) == 1 and len(set(w[4:].tolist())) == 1
    ones = bayesian_bootstrap_weights(sizes, 0.0, torch.Generator().manual_seed(0))
    assert torch.equal(ones, torch.ones(8, dtype=torch.float64))
    many = bayesian_bootstrap_weights(torch.ones(20000, dtype=torch.long), 1.0, torch.Generator().manual_seed(1))
    assert abs(float(many.mean()) - 1.0) < 0.05  # Exp(1): mean 1


def test_exact_leaf_hessian_takes_the_round_weights_and_rows():
    # grow_round's exact-Newton leaves: ΣG and the leaf_hessian's ΣH over the sampled rows, both
    # under the same Bayesian bootstrap weights as the tree.
    from rankkit.boosting.engine import bayesian_bootstrap_weights, grow_round

    train = small_set(2, n_queries=12)
    binner = QuantileBinner().fit(train.features)
    codes = binner.transform(train.features)[:, binner.used_features_]
    params = TreeParams(depth=2, learning_rate=0.5, l2=0.3, min_data_in_leaf=2, min_sum_hessian=0.0)
    grower = ObliviousTreeGrower(codes, _valid_codes(binner)[binner.used_features_], params)
    gen = torch.Generator().manual_seed(0)
    grad = torch.randn(train.n_docs, generator=gen, dtype=torch.float64)
    hess = torch.rand(train.n_docs, generator=gen, dtype=torch.float64) + 0.5
    exact = torch.rand(train.n_docs, generator=gen, dtype=torch.float64) * 0.4  # a stand-in ΣH
    rows = torch.arange(train.n_docs)[train.doc_query_index() % 3 != 0]
    tree = grow_round(grower, grad, hess, rows=rows, features=None, sizes=train.sizes,
                      generator=torch.Generator().manual_seed(5), bagging_temperature=1.0,
                      random_strength=0.0, model_length=0.0, leaf_hessian=lambda leaf: exact)
    w = bayesian_bootstrap_weights(train.sizes, 1.0, torch.Generator().manual_seed(5))
    leaf = tree.leaf_index[rows]
    g = torch.zeros(4, dtype=torch.float64).index_add_(0, leaf, (w * grad)[rows])
    h = torch.zeros(4, dtype=torch.float64).index_add_(0, leaf, (w * exact)[rows])
    torch.testing.assert_close(tree.leaf_values, -0.5 * g / (h + 0.3))


def test_bagging_temperature_is_seeded_and_changes_the_trees():
    train = small_set(n_queries=40)
    kw = dict(n_estimators=5, depth=3, min_data_in_leaf=3)
    a = LambdaMART(seed=7, bagging_temperature=1.0, **kw).fit(train).ensemble_
    b = LambdaMART(seed=7, bagging_temperature=1.0, **kw).fit(train).ensemble_
    plain = LambdaMART(seed=7, **kw).fit(train).ensemble_
    assert torch.equal(a.leaf_values, b.leaf_values)
    assert not torch.equal(a.leaf_values, plain.leaf_values)
    with pytest.raises(ValueError, match="bagging_temperature"):
        LambdaMART(bagging_temperature=-1.0).fit(train)


# -- split-score noise (random_strength) ---------------------------------------------------------------
def test_random_strength_is_seeded_and_keeps_noise_free_gains(histogram_path):
    train = small_set(n_queries=40)
    kw = dict(n_estimators=5, depth=3, min_data_in_leaf=3)
    a = LambdaMART(seed=7, random_strength=1.0, **kw).fit(train)
    b = LambdaMART(seed=7, random_strength=1.0, **kw).fit(train)
    c = LambdaMART(seed=8, random_strength=1.0, **kw).fit(train)
    plain = LambdaMART(seed=7, **kw).fit(train)
    assert torch.equal(a.ensemble_.leaf_values, b.ensemble_.leaf_values)
    assert torch.equal(a.ensemble_.features, b.ensemble_.features)
    assert not torch.equal(a.ensemble_.features, plain.ensemble_.features)
    # Another seed, other splits (3 features: the features alone may coincide, the cut points not).
    assert not torch.equal(a.ensemble_.thresholds, c.ensemble_.thresholds)
    with pytest.raises(ValueError, match="random_strength"):
        LambdaMART(random_strength=-1.0).fit(train)
