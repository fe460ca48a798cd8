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

from rankkit.data import make_synthetic, pad
from rankkit.data.clicks import PositionBasedModel, attractiveness, simulate_clicks
from rankkit.training.datamodule import RankingDataModule
from rankkit.lambdas import lambda_gradients
from rankkit.metrics import ndcg
from rankkit.neural import LambdaRank, RankNet
from rankkit.clicks.metrics import ClickLogMetric, counterfactual_ndcg, ips_relevance
from rankkit.clicks.propensity import PropensityEstimator, RegressionEM, click_log_likelihood, em_step

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
    with pytest.raises(ValueError, match="`unbiased=True` debiases pairs"):
        LambdaRank(n_features=5, loss="softmax", unbiased=True)
    with pytest.raises(ValueError, match="`bias_p`"):
        RankNet(n_features=5, unbiased=True, bias_p=-1.0)
    assert LambdaRank(n_features=5).propensities is None


# -- regression-EM (Wang et al., WSDM 2018) and the click-log validation metric --------------------
def test_em_step_against_impression_loop():
    # rows are (document, position) with counts; the reference walks every single impression in
    # float64 with the posterior written out from Bayes' rule
    gen = torch.Generator().manual_seed(0)
    m, p = 30, 4
    impressions = torch.randint(1, 6, (m,), generator=gen)
    clicks = (torch.rand(m, generator=gen) * (impressions + 1)).floor().clamp(max=impressions).long()
    position = torch.randint(0, p + 2, (m,), generator=gen)  # deeper than P - 1: the last bucket
    theta = torch.tensor([0.9, 0.6, 0.4, 0.3], dtype=torch.float64)
    gamma = torch.rand(m, generator=gen, dtype=torch.float64) * 0.9 + 0.05
    new_theta, target = em_step(clicks, impressions, position, theta, gamma)
    seen, shown = [0.0] * p, [0.0] * p
    for r in range(m):
        k = min(int(position[r]), p - 1)
        t, g = float(theta[k]), float(gamma[r])
        relevant = 0.0
        for n in range(int(impressions[r])):
            if n < int(clicks[r]):
                examined_post, relevant_post = 1.0, 1.0
            else:
                no_click = (1 - t) * (1 - g) + t * (1 - g) + (1 - t) * g
                examined_post, relevant_post = t * (1 - g) / no_click, (1 - t) * g / no_click
            seen[k] += examined_post
            shown[k] += 1.0
            relevant += relevant_post
        assert abs(float(target[r]) - relevant / int(impressions[r])) < 1e-9, r
    torch.testing.assert_close(new_theta, torch.tensor([s / n for s, n in zip(seen, shown)], dtype=torch.float64))


def free_em(clicks, impressions, position, doc, n_docs, iterations):
    """Classic EM of the position-based model with a free γ per document (closed-form M-step)."""
    theta = torch.full((int(position.max()) + 1,), 0.5, dtype=torch.float64)
    gamma_doc = torch.full((n_docs,), 0.5, dtype=torch.float64)
    likelihood = []
    for _ in range(iterations):
        theta, target = em_step(clicks, impressions, position, theta, gamma_doc[doc])
        relevant = torch.zeros(n_docs, dtype=torch.float64).index_add_(0, doc, target * impressions)
        gamma_doc = relevant / torch.zeros(n_docs, dtype=torch.float64).index_add_(0, doc, impressions.double())
        likelihood.append(float(click_log_likelihood(clicks, impressions, position, theta, gamma_doc[doc])))
    return theta, gamma_doc, likelihood


def test_em_fixed_point_is_the_maximum_likelihood():
    # 3 documents each shown at all 3 positions: θ / θ_0 is identified; EM must climb the click
    # likelihood monotonically and land where a direct maximiser (L-BFGS on logits) lands
    true_theta = torch.tensor([1.0, 0.5, 0.25], dtype=torch.float64)
    true_gamma = torch.tensor([0.8, 0.4, 0.15], dtype=torch.float64)
    doc = torch.arange(3).repeat_interleave(3)
    position = torch.arange(3).repeat(3)
    impressions = torch.tensor([400, 300, 500, 350, 450, 250, 600, 200, 400], dtype=torch.float64)
    clicks = (impressions * true_theta[position] * true_gamma[doc]).round() + torch.tensor(
        [3., -2, 1, 0, 2, -1, -3, 1, 0])  # off the exact expectation
    theta, gamma, likelihood = free_em(clicks, impressions, position, doc, 3, 3000)
    assert all(b >= a - 1e-12 for a, b in zip(likelihood, likelihood[1:])), "EM decreased the likelihood"

    logits = torch.zeros(6, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([logits], max_iter=500, tolerance_grad=1e-12, tolerance_change=1e-15,
                            line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        q = torch.sigmoid(logits[:3])[position] * torch.sigmoid(logits[3:])[doc]
        loss = -(clicks * q.log() + (impressions - clicks) * torch.log1p(-q)).sum() / impressions.sum()
        loss.backward()
        return loss

    for _ in range(5):
        opt.step(closure)
    direct_theta = torch.sigmoid(logits[:3]).detach()
    best = -float(closure().detach())
    assert likelihood[-1] >= best - 1e-7, (likelihood[-1], best)
    torch.testing.assert_close(theta / theta[0], direct_theta / direct_theta[0], rtol=2e-3, atol=1e-4)
    assert torch.all((theta / theta[0] - true_theta).abs() < 0.08), theta / theta[0]


@pytest.fixture(scope="module")
def randomized_pbm_log():
    """PBM η = 1 on lists shown in random order (so position and relevance are independent)."""
    data = make_synthetic(400, (10, 20), 5, seed=1)
    scores = torch.rand(data.n_docs, generator=torch.Generator().manual_seed(1))
    log = simulate_clicks(data, scores, model=PositionBasedModel(eta=1.0, max_label=4), sessions_per_query=50,
                          k=N_POSITIONS, seed=1)
    return data, log


def test_regression_em_recovers_propensities(randomized_pbm_log):
    data, log = randomized_pbm_log
    counts = log.aggregate()
    model = RegressionEM(N_POSITIONS, hidden=(16,), iterations=25, epochs=2, lr=1e-2, seed=0)
    model.fit(data.features[counts.doc_index], counts.clicks, counts.position, impressions=counts.impressions)
    true = 1.0 / torch.arange(1, N_POSITIONS + 1, dtype=torch.float64)
    assert torch.all((model.propensities_ / true - 1).abs() < 0.15), model.propensities_
    assert model.history_[-1] > model.history_[0]
    # the relevance model ranks: NDCG@10 on the true labels well above a random order
    s, mask = pad(model.predict(data.features), data.sizes)
    y, _ = pad(data.labels, data.sizes)
    r, _ = pad(torch.rand(data.n_docs, generator=torch.Generator().manual_seed(2)), data.sizes)
    assert float(ndcg(s, y, mask=mask, k=10).mean()) > float(ndcg(r, y, mask=mask, k=10).mean()) + 0.1
    # a seed gives the same model twice
    again = RegressionEM(N_POSITIONS, hidden=(16,), iterations=2, seed=3)
    twice = RegressionEM(N_POSITIONS, hidden=(16,), iterations=2, seed=3)
    x = data.features[counts.doc_index]
    for est in (again, twice):
        est.fit(x, counts.clicks, counts.position, impressions=counts.impressions)
    assert torch.equal(again.predict(x), twice.predict(x)) and torch.equal(again.theta_, twice.theta_)


def test_ips_relevance_and_counterfactual_ndcg(randomized_pbm_log):
    data, log = randomized_pbm_log
    counts = log.aggregate()
    true_theta = 1.0 / torch.arange(1, N_POSITIONS + 1, dtype=torch.float64)
    docs, rel = ips_relevance(counts.doc_index, counts.clicks, counts.impressions, counts.position, true_theta)
    # reference loop: Σ c / θ over a document's rows, over its impressions
    num, den = {}, {}
    for d, c, n, k in zip(counts.doc_index.tolist(), counts.clicks.tolist(), counts.impressions.tolist(),
                          counts.position.tolist()):
        num[d] = num.get(d, 0.0) + c / float(true_theta[k])
        den[d] = den.get(d, 0.0) + n
    torch.testing.assert_close(rel, torch.tensor([num[d] / den[d] for d in docs.tolist()], dtype=torch.float64))
    # unbiased for ρ(y): the mean estimate per label matches the attractiveness within noise
    truth = attractiveness(data.labels[docs], max_label=4)
    for label in range(5):
        at = data.labels[docs] == label
        if int(at.sum()) > 30:
            assert abs(float(rel[at].mean() - truth[at].mean())) < 0.05, label
    # clipping bounds the inverse propensities
    _, clipped = ips_relevance(counts.doc_index, counts.clicks, counts.impressions, counts.position, true_theta,
                               clip=2.0)
    assert bool((clipped <= rel + 1e-12).all()) and float(clipped.max()) <= 2.0
    # the metric orders rankings as NDCG against ρ(y) does: labels beat noise, noise beats reversed labels
    query = data.doc_query_index()[docs]
    y = data.labels[docs]
    good = counterfactual_ndcg(y.double(), query, rel)
    noise = counterfactual_ndcg(torch.rand(len(docs), generator=torch.Generator().manual_seed(0)).double(), query, rel)
    bad = counterfactual_ndcg(-y.double(), query, rel)
    assert good > noise + 0.05 > bad + 0.1, (good, noise, bad)
    # without the propensities (all 1) the estimate is the click rate, which favours the top
    # positions: the production order (here random) then scores above noise
    shown_first = -counts.position.double()
    first_docs = torch.unique(counts.doc_index, return_inverse=True)[1]
    order_score = torch.zeros(len(docs), dtype=torch.float64)
    order_score[first_docs] = shown_first  # every session of a query shows one list: one position per document
    _, naive = ips_relevance(counts.doc_index, counts.clicks, counts.impressions, counts.position,
                             torch.ones(N_POSITIONS, dtype=torch.float64))
    assert counterfactual_ndcg(order_score, query, naive) > counterfactual_ndcg(order_score, query, rel) + 0.05


def test_em_bad_input():
    with pytest.raises(ValueError, match=r"`clicks`.*\[1\]"):
        em_step(torch.tensor([1., 3.]), torch.tensor([2., 2.]), torch.tensor([0, 1]), torch.ones(2),
                torch.full((2,), 0.5))
    with pytest.raises(ValueError, match=r"`impressions`.*\[0\]"):
        RegressionEM(2).fit(torch.zeros(2, 1), torch.zeros(2), torch.tensor([0, 1]), impressions=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="`position`"):
        ips_relevance(torch.tensor([0]), torch.tensor([0]), torch.tensor([1]), torch.tensor([-1]), torch.ones(2))
    with pytest.raises(ValueError, match="`propensities`"):
        ips_relevance(torch.tensor([0]), torch.tensor([0]), torch.tensor([1]), torch.tensor([0]), torch.zeros(2))
    with pytest.raises(RuntimeError, match="not fitted"):
        RegressionEM(2).predict(torch.zeros(1, 1))


def test_click_log_metric_with_estimated_propensities(randomized_pbm_log):
    # the metric with propensities estimated by regression-EM on the log agrees with the metric
    # given the true ones, and both rank a labels-ordered ranker above noise and noise above reversed
    data, log = randomized_pbm_log
    counts = log.aggregate()
    true_theta = 1.0 / torch.arange(1, N_POSITIONS + 1, dtype=torch.float64)
    known = ClickLogMetric(counts, data.features, propensities=true_theta, n_positions=N_POSITIONS)
    estimated = ClickLogMetric(counts, data.features, n_positions=N_POSITIONS,
                               em={"hidden": (16,), "iterations": 15, "epochs": 2, "lr": 1e-2})
    # 15 EM iterations: not yet at the fixed point, the deep ratios still run ~15 % low
    assert torch.all((estimated.propensities / true_theta - 1).abs() < 0.25), estimated.propensities
    labels = dict(zip(map(tuple, data.features.tolist()), data.labels.tolist()))

    def by_label(x):
        return torch.tensor([labels[tuple(row)] for row in x.tolist()])

    def noise(x):
        return torch.rand(len(x), generator=torch.Generator().manual_seed(0))

    rankers = (by_label, noise, lambda x: -by_label(x))
    scores_known = [known(r) for r in rankers]
    scores_est = [estimated(r) for r in rankers]
    assert scores_known[0] > scores_known[1] + 0.05 > scores_known[2] + 0.1, scores_known
    assert all(abs(a - b) < 0.02 for a, b in zip(scores_known, scores_est)), (scores_known, scores_est)
    # a ranker object with predict is accepted like a function
    assert known(type("R", (), {"predict": staticmethod(by_label)})()) == scores_known[0]
    with pytest.raises(ValueError, match=r"`counts.doc_index`"):
        ClickLogMetric(counts, data.features[:5], propensities=true_theta)


@pytest.mark.parametrize("unbiased", [True, "position"])
def test_position_ids_of_any_numbering_train_the_same_neural_ranker(tmp_path, unbiased):
    """Issue 49, the neural side: the training log's position ids (0- or 1-based, sparse) map
    every batch's positions (validation included) to the same dense indices."""
    data = make_synthetic(60, (4, 12), 5, seed=1)
    scores = torch.rand(data.n_docs, generator=torch.Generator().manual_seed(1))
    model = PositionBasedModel(eta=1.0, max_label=4)
    train, vali = (simulate_clicks(data, scores, model=model, sessions_per_query=5, k=6, seed=seed,
                                   drop_unclicked=True).sessions for seed in (0, 1))
    weights = []
    for shift in (lambda p: p, lambda p: p + 1, lambda p: 10 * p + 3):
        logs = [type(d)(d.features, d.labels, d.offsets, d.qids, None, d.source, shift(d.position))
                for d in (train, vali)]
        pl.seed_everything(0, verbose=False)
        module = LambdaRank(n_features=5, hidden=[8], lr=1e-2, unbiased=unbiased, n_positions=6)
        trainer = pl.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_progress_bar=False,
                             enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path)
        trainer.fit(module, datamodule=RankingDataModule.from_datasets(*logs, max_docs=256))
        weights.append(module.state_dict())
    for other in weights[1:]:
        for name, value in weights[0].items():
            torch.testing.assert_close(other[name], value, rtol=0, atol=0, msg=name)
    module = LambdaRank(n_features=5, hidden=[8], unbiased=unbiased, n_positions=4)
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path)
    with pytest.raises(ValueError, match=r"the training data's position` holds 6 distinct position ids \(0\.\.5\), "
                                         r"more than n_positions=4"):
        trainer.fit(module, datamodule=RankingDataModule.from_datasets(train, vali, max_docs=256))


def test_the_neural_rankers_map_batch_positions_on_the_host_before_the_transfer():
    # Mapped after the transfer, a GPU batch's positions went to the host for the ids' lookup and
    # back, through boolean indexing: several waits for the device a batch. Lightning's
    # on_before_batch_transfer runs on the host batch; the device then gets dense positions.
    from rankkit.neural.module import NeuralRanker

    assert NeuralRanker.on_after_batch_transfer is pl.LightningModule.on_after_batch_transfer
    data = make_synthetic(30, (4, 8), 5, seed=2)
    scores = torch.rand(data.n_docs, generator=torch.Generator().manual_seed(2))
    log = simulate_clicks(data, scores, model=PositionBasedModel(eta=1.0, max_label=4), sessions_per_query=3, k=5,
                          seed=0, drop_unclicked=True).sessions
    one_based = type(log)(log.features, log.labels, log.offsets, log.qids, None, log.source, log.position + 1)
    module = LambdaRank(n_features=5, hidden=[8], unbiased=True, n_positions=5)
    module.read_click_log(one_based)
    batch = next(one_based.iter_batches(64))
    mapped = module.on_before_batch_transfer(batch, 0)
    assert torch.equal(mapped.position[batch.mask], batch.position[batch.mask] - 1)
    assert mapped.position.device.type == "cpu"


@pytest.mark.parametrize("unbiased", [True, "position", "ips", "dla"])
def test_a_plain_loop_reads_positions_through_the_training_logs_ids_too(unbiased):
    # Issue 49's class on the plain-loop route (read_click_log, then module.objective per batch, as
    # experiments/unbiased.py trains): 1-based and sparse ids shifted the buckets there (position 0's
    # bias unused, the last two merged), while Trainer.fit mapped them. Now both routes map once.
    from rankkit.clicks.debiasing import MappedBatch

    data = make_synthetic(40, (4, 10), 5, seed=1)
    scores = torch.rand(data.n_docs, generator=torch.Generator().manual_seed(1))
    log = simulate_clicks(data, scores, model=PositionBasedModel(eta=1.0, max_label=4), sessions_per_query=5, k=6,
                          seed=0, drop_unclicked=True).sessions
    states = []
    for shift in (lambda p: p, lambda p: p + 1, lambda p: 10 * p + 3):
        shifted = type(log)(log.features, log.labels, log.offsets, log.qids, None, log.source, shift(log.position))
        torch.manual_seed(0)
        module = LambdaRank(n_features=5, hidden=[8], lr=1e-2, unbiased=unbiased, n_positions=6)
        module.fit_preprocessor(shifted.features)
        module.read_click_log(shifted)
        opt = module.configure_optimizers()
        for batch in shifted.iter_batches(64):
            loss = module.objective(module.scorer(batch.features), batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
        states.append(module.state_dict())
    for other in states[1:]:
        for name, value in states[0].items():
            torch.testing.assert_close(other[name], value, rtol=0, atol=0, msg=name)
    # a batch mapped once (Trainer.fit's hook) is never mapped again, on any device
    mapped = module.debiasing.map(batch)
    assert isinstance(mapped, MappedBatch) and isinstance(mapped.to("cpu"), MappedBatch)
    assert module.debiasing.map(mapped) is mapped and module.debiasing.positions(mapped) is mapped.position


def test_a_plain_loops_race_reads_training_and_validation_positions_through_the_ids():
    # The same route for unbiased="auto": its candidates' batches and validate_race's validation
    # batches map through the training log's ids, so shifted ids race and choose the same.
    data = make_synthetic(40, (4, 10), 5, seed=3)
    scores = torch.rand(data.n_docs, generator=torch.Generator().manual_seed(3))
    train, vali = (simulate_clicks(data, scores, model=PositionBasedModel(eta=1.0, max_label=4), sessions_per_query=5,
                                   k=6, seed=seed, drop_unclicked=True).sessions for seed in (0, 1))
    runs = []
    for shift in (lambda p: p, lambda p: 10 * p + 3):
        logs = [type(d)(d.features, d.labels, d.offsets, d.qids, None, d.source, shift(d.position))
                for d in (train, vali)]
        torch.manual_seed(0)
        module = LambdaRank(n_features=5, hidden=[8], lr=1e-2, unbiased="auto", n_positions=6)
        module.fit_preprocessor(logs[0].features)
        module.read_click_log(logs[0])
        opt = module.configure_optimizers()
        for epoch in range(3):
            for batch in logs[0].iter_batches(64):
                loss = module.race.loss(batch)
                opt.zero_grad()
                loss.backward()
                opt.step()
            module.validate_race(logs[1].iter_batches(256), epoch, 3)
        runs.append((module.race.scores_, module.unbiased_choice_, module.scorer.state_dict()))
    (scores0, choice0, state0), (scores1, choice1, state1) = runs
    assert choice0 == choice1 and scores0 == scores1
    for name, value in state0.items():
        torch.testing.assert_close(state1[name], value, rtol=0, atol=0, msg=name)
