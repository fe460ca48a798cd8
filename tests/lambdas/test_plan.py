"""The per-data-set plan (rankkit.lambdas.plan.QueryPlan): the planned lambda kernel and metrics against
the float64 double loops, a plan reused over many score vectors against one rebuilt each time,
and the booster's planned round on the simulated device (no sync in the lambda pass or the eval
metric)."""
from __future__ import annotations

import math
import re

import pytest
import torch
from simcuda import from_sim, simcuda
from .test_lambdas import WEIGHTING_NAMES, assert_matches, random_batch, reference
from test_metrics import pad, random_queries, ref_ap, ref_ndcg

from rankkit import metrics as M
from rankkit.infra import checks as _checks
from rankkit.lambdas.plan import QueryPlan
from rankkit.lambdas.ranking import ideal_dcg
from rankkit.boosting.engine import BoosterConfig, BoostingEngine
from rankkit.data import make_synthetic
from rankkit.lambdas import WEIGHTINGS, lambda_gradients, planned_lambda_gradients


def _scores(seed, shape, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.round(torch.randn(*shape, generator=g, dtype=dtype) * 2) / 2  # with ties


@pytest.mark.parametrize("weighting", WEIGHTING_NAMES + ("ndcg_loss2", "arp1"))
@pytest.mark.parametrize("k", [None, 3])
def test_planned_kernel_matches_the_double_loop_on_every_reuse(weighting, k):
    # One plan, built once, serves four different score vectors; each result is the float64
    # double loop's for those scores (with weights, padding and queries out of length order).
    scores, labels, mask, weights = random_batch(seed=7, n_q=6)
    plan = QueryPlan(labels, mask, weights=weights)
    opts = dict(k=k, normalize=True, max_err_label=3.0 if weighting == "err" else None)
    for seed in range(4):
        s = _scores(seed, scores.shape).masked_fill(~mask, 1e6)
        got = planned_lambda_gradients(s, plan, weighting=WEIGHTINGS[weighting], return_loss=True, **opts)
        if weighting in WEIGHTING_NAMES:
            expected = reference(s, labels, mask, weighting=weighting, weights=weights, **opts)
        else:  # the LambdaLoss weightings: the public kernel (checked against its loop in test_lambdas)
            expected = lambda_gradients(s, labels, mask=mask, weighting=weighting, weights=weights,
                                        return_loss=True, **opts)
        assert_matches(got, expected)


@pytest.mark.parametrize("weighting", WEIGHTING_NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_reused_plan_gives_the_same_bits_as_a_fresh_one(weighting, dtype):
    scores, labels, mask, weights = random_batch(seed=3, n_q=6, dtype=dtype)
    plan = QueryPlan(labels, mask, weights=weights)
    for seed in range(3):
        s = _scores(seed, scores.shape, dtype)
        reused = planned_lambda_gradients(s, plan, weighting=WEIGHTINGS[weighting], k=4, return_loss=True)
        fresh = lambda_gradients(s, labels, mask=mask, weights=weights, weighting=weighting, k=4,
                                 return_loss=True)
        for a, b in zip(reused, fresh):
            assert torch.equal(a, b)
    # Without the loss: the same grad and hess, and only those two.
    grad, hess = planned_lambda_gradients(s, plan, weighting=WEIGHTINGS[weighting], k=4)
    assert torch.equal(grad, fresh[0]) and torch.equal(hess, fresh[1])


@pytest.mark.parametrize("k", [None, 1, 5])
def test_planned_metrics_match_the_loops_on_every_reuse(k):
    queries = random_queries(2)
    _, labels, mask = pad(queries)
    plan = QueryPlan(labels, mask)  # padding: label -1, score NaN
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        new = [(torch.randn(len(s), generator=g, dtype=torch.float64).tolist(), y) for s, y in queries]
        scores, _, _ = pad(new)
        for empty in (1.0, 0.0):
            ndcg = M.planned_ndcg(scores, plan, k=k, empty=empty)
            ap = M.planned_average_precision(scores, plan, k=k, empty=empty)
            want_ndcg = torch.tensor([ref_ndcg(s, y, k, "exp", empty) for s, y in new], dtype=torch.float64)
            want_ap = torch.tensor([ref_ap(s, y, k, empty) for s, y in new], dtype=torch.float64)
            torch.testing.assert_close(ndcg, want_ndcg)
            torch.testing.assert_close(ap, want_ap)
            assert torch.equal(ndcg, M.ndcg(scores, labels, mask=mask, k=k, empty=empty))


def test_plan_validates_once_naming_the_first_bad_position():
    labels = torch.tensor([[1.0, 0.0], [2.0, -1.0]])
    with pytest.raises(ValueError, match=r"labels.*\[1, 1\]"):
        QueryPlan(labels)
    # Padding may hold anything.
    plan = QueryPlan(labels, torch.tensor([[True, True], [True, False]]))
    assert plan.max_label == 2.0 and plan.lengths.tolist() == [1, 2] and plan.qperm.tolist() == [1, 0]
    with pytest.raises(ValueError, match="weights"):
        QueryPlan(labels.abs(), weights=torch.tensor([[1.0, float("nan")], [1.0, 1.0]]))


def test_booster_grads_from_the_plan_equal_the_public_kernel(monkeypatch):
    # The torch planned path (the compiled CPU lambda pass is checked against it in
    # tests/kernels/test_cpu_lambdas.py).
    monkeypatch.setenv("RANKKIT_CPU_LAMBDAS", "0")
    data = make_synthetic(12, 15, 5, seed=1)
    engine = BoostingEngine(data.features, data.labels, data.sizes,
                            BoosterConfig(depth=3, min_data_in_leaf=3, k=5, normalize=True))
    for _ in range(3):
        grad, hess = engine.objective.gradients(engine.scores, engine.layout)
        layout = engine.layout
        g, h, _ = lambda_gradients(layout.pad(engine.scores.float()), layout.labels, mask=layout.mask,
                                   weighting="ndcg", k=5, normalize=True, return_loss=True)
        assert torch.equal(grad, layout.flat(g).double()) and torch.equal(hess, layout.flat(h).double())
        engine.update()


@pytest.mark.parametrize("options", [{}, {"quantized_grad": True, "k": 5, "normalize": True}])
def test_lambda_pass_and_eval_metric_do_not_sync_on_the_device(monkeypatch, options):
    # The CPU side takes the torch path too: the same numbers as the device's, bit for bit (the
    # compiled CPU lambda pass agrees with it to a float32 rounding: tests/kernels/test_cpu_lambdas.py).
    monkeypatch.setenv("RANKKIT_CPU_LAMBDAS", "0")
    data = make_synthetic(8, 20, 6, seed=4)
    valid = make_synthetic(4, 20, 6, seed=5)
    with simcuda() as counts:
        engine = BoostingEngine(data.features, data.labels, data.sizes,
                                BoosterConfig(depth=4, min_data_in_leaf=3, **options), device="cuda")
        engine.add_eval_set(valid.features, valid.labels, valid.sizes)
        engine.update()
        counts.reset()
        grad, hess = engine.objective.gradients(engine.scores, engine.layout)
        value = engine.metric(engine.eval_sets[0].scores, engine.eval_sets[0].layout)
        assert counts.syncs == 0 and counts.h2d == 0, dict(counts.sync_sites)
        assert grad.device.type == "cuda" and value.device.type == "cuda"
    cpu = BoostingEngine(data.features, data.labels, data.sizes,
                         BoosterConfig(depth=4, min_data_in_leaf=3, **options))
    cpu.add_eval_set(valid.features, valid.labels, valid.sizes)
    cpu.update()
    want = cpu.objective.gradients(cpu.scores, cpu.layout)
    assert torch.equal(from_sim(grad), want[0]) and torch.equal(from_sim(hess), want[1])
    assert from_sim(value).item() == cpu.metric(cpu.eval_sets[0].scores, cpu.eval_sets[0].layout).item()


@pytest.mark.parametrize("options", [{}, {"exact_newton": True, "bagging_temperature": 1.0, "subsample": 0.8},
                                     {"objective": "softmax"}, {"objective": "listmle"}])
def test_nothing_is_validated_or_planned_inside_the_boosting_loop(monkeypatch, options):
    from rankkit.infra import checks as _checks
    from rankkit.lambdas import plan as _plan

    data = make_synthetic(10, 12, 5, seed=2)
    valid = make_synthetic(5, 12, 5, seed=3)
    engine = BoostingEngine(data.features, data.labels, data.sizes,
                            BoosterConfig(depth=3, min_data_in_leaf=3, k=5, **options))
    engine.add_eval_set(valid.features, valid.labels, valid.sizes)
    engine.update()
    calls = []
    monkeypatch.setattr(_checks, "check_tensors", lambda *a, **k: calls.append("check_tensors"))
    real_init = _plan.QueryPlan.__init__
    monkeypatch.setattr(_plan.QueryPlan, "__init__",
                        lambda self, *a, **k: calls.append("plan") or real_init(self, *a, **k))
    for _ in range(3):
        engine.update()
    assert calls == [] and len(engine.history["valid_0"]["ndcg@10"]) == 4


@pytest.mark.parametrize("name", ["softmax", "xendcg", "listmle", "approx_ndcg", "ndcg"])
def test_every_objective_with_the_plan_equals_it_without(name):
    from rankkit.losses import objective_gradients

    scores, labels, mask, weights = random_batch(seed=5, n_q=6, dtype=torch.float32)
    plan = QueryPlan(labels, mask, weights=weights)
    extra = lambda: {"generator": torch.Generator().manual_seed(0)} if name in ("xendcg", "listmle") else {}
    for seed in range(2):
        s = _scores(seed, scores.shape, torch.float32)
        planned = objective_gradients(name, s, labels, mask=mask, weights=weights, plan=plan, **extra())
        public = objective_gradients(name, s, labels, mask=mask, weights=weights, **extra())
        for a, b in zip(planned, public):
            assert torch.equal(a, b)


@pytest.mark.parametrize("labels, grades", [
    ([[0.0, 3.0, 1.0], [7.0, 0.0, 40.5]], 7),       # integer grades: counted, the largest
    ([[0.0, 3.0, 1.0], [2.0, 0.5, 3.0]], None),      # a fraction: sorted
    ([[0.0, 3.0, 1.0], [32.0, 0.0, 3.0]], None),     # past 31: sorted
    ([[0.0, 0.0, 0.0], [0.0, 0.0, 9.0]], 0),
])
def test_the_plan_knows_whether_the_ideal_dcg_can_count_grades(labels, grades):
    # The last document is padding: what it holds does not count.
    labels, mask = torch.tensor(labels), torch.tensor([[True, True, True], [True, True, False]])
    plan = QueryPlan(labels, mask)
    assert plan.grades == grades
    y = labels.masked_fill(~mask, 0.0)
    scores = torch.tensor([[0.5, 0.0, 1.0], [0.0, 2.0, 0.0]])
    for k in (None, 2):
        for gain in ("exp", "linear"):
            planned = M.planned_ndcg(scores, plan, k=k, gain=gain)
            assert torch.equal(planned, M.ndcg(scores, y, mask=mask, k=k, gain=gain))
            want = ideal_dcg(y, mask, k=k, gain=gain)
            assert want.tolist() == pytest.approx(ref_ideal(y, mask, k, gain))
            if grades is not None:
                assert torch.equal(ideal_dcg(y, mask, k=k, gain=gain, grades=grades), want)


def ref_ideal(labels, mask, k, gain):
    """The ideal DCG@k by a sort in plain Python (gain 2^y − 1 or y, discount 1/log2(1 + rank))."""
    out = []
    for row, real in zip(labels.tolist(), mask.tolist()):
        ys = sorted((y for y, r in zip(row, real) if r), reverse=True)[:k]
        out.append(sum(((2.0 ** y - 1) if gain == "exp" else y) / math.log2(2 + i) for i, y in enumerate(ys)))
    return out


def test_a_plan_built_and_used_on_the_device_costs_its_one_copy():
    # A fresh plan for every batch (a neural ranker's step): the lengths, the top label and the
    # grades in one device-to-host copy; the queries sorted by length on both sides (no copy of
    # the permutation or the lengths to the device), the ideal DCG by counting without asking.
    scores, labels, mask, weights = random_batch(seed=3, n_q=6)
    labels = labels.round()
    cpu = planned_lambda_gradients(scores, QueryPlan(labels, mask, weights=weights), weighting=WEIGHTINGS["ndcg"], k=5)
    with simcuda() as counts:
        s, y, m, w = (t.to("cuda") for t in (scores, labels, mask, weights))
        counts.reset()
        plan = QueryPlan(y, m, weights=w, check=False)
        assert counts.syncs == 1 and counts.h2d == 0, dict(counts.sync_sites)
        assert plan.qperm is not None and plan.grades is not None  # the batch is out of length order
        counts.reset()
        got = planned_lambda_gradients(s, plan, weighting=WEIGHTINGS["ndcg"], k=5)
        # The kernel's block bounds, one small copy to the device from pinned memory (no wait).
        assert counts.syncs == 0 and counts.h2d == 1, dict(counts.sync_sites)
        # The public kernel: its arguments checked in the plan's one copy, not in a copy of their own.
        counts.reset()
        public = lambda_gradients(s, y, mask=m, weights=w, weighting="ndcg", k=5)
        assert counts.syncs == 1, dict(counts.sync_sites)
        counts.reset()
        QueryPlan(y, m, weights=w)  # checking its own arguments: the same one copy
        assert counts.syncs == 1, dict(counts.sync_sites)
    for a, b, c in zip(got, cpu, public):
        assert torch.equal(from_sim(a), b) and torch.equal(from_sim(c), b)


@pytest.mark.parametrize("bad", ["scores", "labels", "weights", "pair_weights"])
def test_the_checks_in_the_plans_copy_raise_as_their_own_copy_did(bad):
    # The same message (the argument, the first bad position, its value) as check_tensors, on the
    # CPU and on the simulated device, the first failing condition in the arguments' order.
    scores, labels, mask, weights = random_batch(seed=4, n_q=5)
    pair = (torch.ones_like(scores), torch.ones_like(scores))
    args = dict(scores=scores, labels=labels.clone(), weights=weights.clone(), pair_weights=pair)
    target = args[bad][0] if bad == "pair_weights" else args[bad]
    target[2, 1] = float("nan") if bad == "scores" else -1.0
    mask[2, 1] = True
    expected = {"scores": "`scores` has to be finite", "labels": "`labels` has to be",
                "weights": "`weights` has to be", "pair_weights": "`pair_weights` has to be"}[bad]
    for device in ("cpu", "cuda"):
        with simcuda():
            moved = {k: tuple(t.to(device) for t in v) if k == "pair_weights" else v.to(device)
                     for k, v in args.items()}
            with pytest.raises(ValueError, match=re.escape(expected) + r".* at \[2, 1\]"):
                lambda_gradients(moved["scores"], moved["labels"], mask=mask.to(device), weights=moved["weights"],
                                 pair_weights=moved["pair_weights"], weighting="ndcg", k=5)
    with pytest.raises(ValueError, match=r"at \[2, 1\]"):
        _checks.checked_copy(torch.zeros(3), ("x", target, target < 0, "non-negative") if bad != "scores"
                             else ("x", target, target.isnan(), "a number"))


def test_bool_labels_are_clicks_as_grades_0_and_1_for_every_objective():
    # Clicks kept as a mask: the lambda kernel and every objective read True/False as 1/0, as the
    # metrics do (this used to fail inside the plan with torch's "round not implemented for Bool").
    from rankkit.losses import OBJECTIVES
    from rankkit.neural.loss import lambda_loss

    g = torch.Generator().manual_seed(7)
    scores = torch.randn(4, 6, generator=g)
    clicks = torch.rand(4, 6, generator=g) < 0.4
    mask = torch.arange(6)[None, :] < torch.tensor([[6], [4], [2], [5]])
    for weighting in WEIGHTING_NAMES:
        for a, b in zip(lambda_gradients(scores, clicks, mask=mask, weighting=weighting),
                        lambda_gradients(scores, clicks.float(), mask=mask, weighting=weighting)):
            assert torch.equal(a, b), weighting
    for name in OBJECTIVES:
        options = {"generator": torch.Generator().manual_seed(0)} if name in ("xendcg", "listmle") else {}
        got = lambda_loss(scores.clone().requires_grad_(), clicks, mask=mask, loss=name, **options)
        options = {"generator": torch.Generator().manual_seed(0)} if options else {}
        want = lambda_loss(scores.clone().requires_grad_(), clicks.float(), mask=mask, loss=name, **options)
        assert torch.equal(got.detach(), want.detach()), name
    assert QueryPlan(clicks, mask).max_label == 1.0
