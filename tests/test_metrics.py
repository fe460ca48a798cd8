"""Tests for rankkit.metrics against independent references.

References: a plain float64 per-query Python loop written here (exp-gain NDCG, ERR, AP, RR,
precision, with the worst-case tie rule implemented as a sort key), scikit-learn's `ndcg_score`,
torchmetrics' retrieval metrics (linear-gain NDCG, MAP, MRR, precision and their
`empty_target_action`), and LightGBM's own `ndcg@k` / `map@k` evals.
"""
from __future__ import annotations

import math
from math import log2

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rankkit import metrics as M

# --------------------------------------------------------------------------------------------
# Test data: padded batches with random lengths, all-zero queries, garbage under the padding.
# --------------------------------------------------------------------------------------------


def random_queries(seed: int, n_queries: int = 40, max_len: int = 25, max_label: int = 4, *,
                   ties: bool = False, min_len: int = 1, positive: bool = False):
    """A list of (scores, labels) per query, as Python lists of floats / ints.

    Distinct scores unless ``ties``; every 5th query has all-zero labels.
    """
    rng = np.random.default_rng(seed)
    queries = []
    for q in range(n_queries):
        n = int(rng.integers(min_len, max_len + 1))
        if ties:
            scores = rng.integers(0, 3, size=n).astype(float)
        else:
            # Distinct and well separated: a permutation of a grid, so no library's tie rule
            # matters.
            scores = (rng.permutation(n) + 1.0) / n
        if not positive:
            scores = scores * 4.0 - 2.0
        labels = rng.integers(0, max_label + 1, size=n)
        if q % 5 == 0:
            labels[:] = 0
        queries.append((scores.tolist(), labels.tolist()))
    return queries


def pad(queries, *, dtype=torch.float64, extra: int = 2):
    """Padded [Q, L] scores, labels, mask, with NaN scores and -1 labels under the padding."""
    width = max(len(s) for s, _ in queries) + extra
    scores = torch.full((len(queries), width), math.nan, dtype=dtype)
    labels = torch.full((len(queries), width), -1, dtype=torch.long)
    mask = torch.zeros((len(queries), width), dtype=torch.bool)
    for q, (s, y) in enumerate(queries):
        scores[q, : len(s)] = torch.tensor(s, dtype=dtype)
        labels[q, : len(y)] = torch.tensor(y)
        mask[q, : len(s)] = True
    return scores, labels, mask


# --------------------------------------------------------------------------------------------
# The slow reference: one query at a time, plain Python floats.
# --------------------------------------------------------------------------------------------


def ref_ranked(scores, labels):
    """Labels in ranked order: descending score, ties broken lowest label first (worst case)."""
    return [y for _, y in sorted(zip(scores, labels), key=lambda t: (-t[0], t[1]))]


def ref_dcg(ranked, k, gain):
    g = (lambda r: 2.0 ** r - 1.0) if gain == "exp" else float
    return sum(g(r) / log2(i + 2) for i, r in enumerate(ranked[:k]))


def ref_ndcg(scores, labels, k, gain, empty):
    ideal = ref_dcg(sorted(labels, reverse=True), k, gain)
    if ideal == 0:
        return empty
    return ref_dcg(ref_ranked(scores, labels), k, gain) / ideal


def ref_ap(scores, labels, k, empty):
    n_rel = sum(y > 0 for y in labels)
    if n_rel == 0:
        return empty
    hits, total = 0, 0.0
    for i, y in enumerate(ref_ranked(scores, labels)[:k]):
        if y > 0:
            hits += 1
            total += hits / (i + 1)
    return total / (n_rel if k is None else min(n_rel, k))


def ref_rr(scores, labels, k, empty):
    if not any(y > 0 for y in labels):
        return empty
    for i, y in enumerate(ref_ranked(scores, labels)[:k]):
        if y > 0:
            return 1.0 / (i + 1)
    return 0.0


def ref_precision(scores, labels, k, empty):
    if not any(y > 0 for y in labels):
        return empty
    hits = sum(y > 0 for y in ref_ranked(scores, labels)[:k])
    return hits / (len(labels) if k is None else k)


def ref_err(scores, labels, k, max_label):
    reach, total = 1.0, 0.0
    for i, y in enumerate(ref_ranked(scores, labels)[:k]):
        stop = (2.0 ** y - 1.0) / 2.0 ** max_label
        total += reach * stop / (i + 1)
        reach *= 1.0 - stop
    return total


def as_tensor(values):
    return torch.tensor([math.nan if v == "skip" else v for v in values], dtype=torch.float64)


# --------------------------------------------------------------------------------------------
# Against the float64 loop.
# --------------------------------------------------------------------------------------------

KS = [None, 1, 3, 10, 100]


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("k", KS)
def test_ndcg_and_dcg_match_loop(k, ties):
    queries = random_queries(1, ties=ties)
    scores, labels, mask = pad(queries)
    for gain in ("exp", "linear"):
        for empty in (1.0, 0.0, "skip"):
            expected = as_tensor([ref_ndcg(s, y, k, gain, empty) for s, y in queries])
            got = M.ndcg(scores, labels, mask=mask, k=k, gain=gain, empty=empty)
            torch.testing.assert_close(got, expected, equal_nan=True)
        expected = as_tensor([ref_dcg(ref_ranked(s, y), k, gain) for s, y in queries])
        torch.testing.assert_close(M.dcg(scores, labels, mask=mask, k=k, gain=gain), expected)


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("k", KS)
def test_map_mrr_precision_match_loop(k, ties):
    queries = random_queries(2, ties=ties)
    scores, labels, mask = pad(queries)
    for empty in (1.0, 0.0, "skip"):
        for fn, ref in [(M.average_precision, ref_ap), (M.mrr, ref_rr),
                        (M.precision, ref_precision)]:
            expected = as_tensor([ref(s, y, k, empty) for s, y in queries])
            got = fn(scores, labels, mask=mask, k=k, empty=empty)
            torch.testing.assert_close(got, expected, equal_nan=True, msg=fn.__name__)


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("max_label", [4, 6.5])
def test_err_matches_loop(k, ties, max_label):
    queries = random_queries(3, ties=ties)
    scores, labels, mask = pad(queries)
    expected = as_tensor([ref_err(s, y, k, max_label) for s, y in queries])
    torch.testing.assert_close(M.err(scores, labels, mask=mask, k=k, max_label=max_label),
                               expected)


def test_relevance_threshold():
    # Relevant means label > threshold: with threshold 1, only the label-2 document counts.
    scores = torch.tensor([[4.0, 3.0, 2.0, 1.0]])
    labels = torch.tensor([[1, 0, 2, 1]])
    assert M.mrr(scores, labels, threshold=1).item() == pytest.approx(1 / 3)
    assert M.precision(scores, labels, k=3, threshold=1).item() == pytest.approx(1 / 3)
    assert M.average_precision(scores, labels, threshold=1).item() == pytest.approx(1 / 3)
    assert M.average_precision(scores, labels).item() == pytest.approx((1 / 1 + 2 / 3 + 3 / 4) / 3)


# --------------------------------------------------------------------------------------------
# The worked example, by hand.
# --------------------------------------------------------------------------------------------

SCORES5 = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0]], dtype=torch.float64)
IDEAL5 = 1 + 1 / log2(3) + 1 / log2(4)  # three relevant documents at ranks 1, 2, 3


@pytest.mark.parametrize("gain", ["exp", "linear"])  # binary labels: both gains agree
def test_worked_example(gain):
    def ndcg5(ranked_labels):
        return M.ndcg(SCORES5, torch.tensor([ranked_labels]), k=5, gain=gain).item()

    base = ndcg5([0, 1, 0, 1, 1])
    assert base == pytest.approx((1 / log2(3) + 1 / log2(5) + 1 / log2(6)) / IDEAL5)
    assert base == pytest.approx(0.680, abs=5e-4)

    # Swapping ranks 1 and 2 moves a relevant document from rank 2 to rank 1.
    gain_12 = ndcg5([1, 0, 0, 1, 1]) - base
    assert gain_12 == pytest.approx((1 - 1 / log2(3)) / IDEAL5)
    assert gain_12 == pytest.approx(0.173, abs=5e-4)

    # Swapping ranks 3 and 4 moves a relevant document from rank 4 to rank 3.
    gain_34 = ndcg5([0, 1, 1, 0, 1]) - base
    assert gain_34 == pytest.approx((1 / log2(4) - 1 / log2(5)) / IDEAL5)
    assert gain_34 == pytest.approx(0.032, abs=1e-3)  # 0.0325: "about 0.032"


def test_graded_example_by_hand():
    labels = torch.tensor([[2, 0, 1]])
    scores = torch.tensor([[1.0, 3.0, 2.0]])  # ranked labels: 0, 1, 2
    exp_dcg = 0 / log2(2) + 1 / log2(3) + 3 / log2(4)
    assert M.dcg(scores, labels).item() == pytest.approx(exp_dcg)
    assert M.ndcg(scores, labels).item() == pytest.approx(exp_dcg / (3 + 1 / log2(3)))
    lin_dcg = 1 / log2(3) + 2 / log2(4)
    assert M.ndcg(scores, labels, gain="linear").item() == pytest.approx(
        lin_dcg / (2 + 1 / log2(3)))
    assert M.ndcg(scores, labels, k=1).item() == 0.0
    # ERR with max_label 2: stop probabilities 0, 1/4, 3/4 at ranks 1, 2, 3.
    assert M.err(scores, labels, max_label=2).item() == pytest.approx(
        (1 / 4) / 2 + (1 - 1 / 4) * (3 / 4) / 3)
    assert M.average_precision(scores, labels).item() == pytest.approx((1 / 2 + 2 / 3) / 2)
    assert M.average_precision(scores, labels, k=2).item() == pytest.approx((1 / 2) / 2)
    assert M.mrr(scores, labels).item() == pytest.approx(1 / 2)
    assert M.precision(scores, labels, k=2).item() == pytest.approx(1 / 2)
    assert M.precision(scores, labels, k=5).item() == pytest.approx(2 / 5)  # divisor is k
    assert M.precision(scores, labels).item() == pytest.approx(2 / 3)


# --------------------------------------------------------------------------------------------
# Ties, empty queries, padding, dtypes.
# --------------------------------------------------------------------------------------------

def test_ties_rank_lowest_label_first():
    labels = torch.tensor([[2, 0, 1]])
    constant = torch.zeros(1, 3)
    worst = 1 / log2(3) + 3 / log2(4)  # ranked labels 0, 1, 2
    assert M.dcg(constant, labels).item() == pytest.approx(worst)
    assert M.mrr(constant, labels).item() == pytest.approx(1 / 2)
    # A partial tie: the two documents scored 1 tie; the label-0 one goes first.
    scores = torch.tensor([[1.0, 1.0, 0.0]])
    labels = torch.tensor([[1, 0, 2]])
    assert M.dcg(scores, labels).item() == pytest.approx(1 / log2(3) + 3 / log2(4))
    # The order of the tied documents in the input does not matter.
    for perm in ([1, 0, 2], [2, 1, 0], [0, 2, 1]):
        assert M.dcg(scores[:, perm], labels[:, perm]).item() == pytest.approx(
            M.dcg(scores, labels).item())


def test_empty_conventions():
    scores = torch.tensor([[0.3, 0.2, 0.1], [0.3, 0.2, 0.1], [0.3, 0.2, 0.1]])
    labels = torch.tensor([[0, 0, 0], [0, 1, 0], [5, 5, 5]])
    mask = torch.tensor([[True, True, True], [True, True, True], [False, False, False]])
    # Query 0: all labels 0. Query 2: no real document. Query 1 is ordinary.
    for fn in (M.ndcg, M.average_precision, M.mrr, M.precision):
        q1 = fn(scores, labels, mask=mask)[1].item()
        assert fn(scores, labels, mask=mask, empty=1.0).tolist() == [1.0, q1, 1.0]
        assert fn(scores, labels, mask=mask, empty=0.0).tolist() == [0.0, q1, 0.0]
        skipped = fn(scores, labels, mask=mask, empty="skip")
        assert torch.isnan(skipped[[0, 2]]).all() and skipped[1].item() == q1
        assert torch.nanmean(skipped).item() == q1
    # DCG and ERR are plain sums: 0 for those queries.
    assert M.dcg(scores, labels, mask=mask)[[0, 2]].tolist() == [0.0, 0.0]
    assert M.err(scores, labels, mask=mask)[[0, 2]].tolist() == [0.0, 0.0]


def test_zero_length_lists():
    scores, labels = torch.zeros(2, 0), torch.zeros(2, 0, dtype=torch.long)
    assert M.ndcg(scores, labels).tolist() == [1.0, 1.0]
    assert M.mrr(scores, labels, empty=0.0).tolist() == [0.0, 0.0]
    assert M.err(scores, labels).tolist() == [0.0, 0.0]
    assert M.ndcg(torch.zeros(0, 3), torch.zeros(0, 3)).shape == (0,)


def test_padding_is_ignored_and_dtype_follows_scores():
    queries = random_queries(4, n_queries=10)
    s64, y, m = pad(queries, extra=0)
    s64b, yb, mb = pad(queries, extra=7)  # more padding, NaN scores, -1 labels under it
    for fn in (M.ndcg, M.dcg, M.average_precision, M.mrr, M.precision, M.err):
        torch.testing.assert_close(fn(s64b, yb, mask=mb, k=5), fn(s64, y, mask=m, k=5))
        assert fn(s64, y, mask=m).dtype == torch.float64
        assert fn(s64.float(), y, mask=m).dtype == torch.float32
        assert fn(s64.half(), y, mask=m).dtype == torch.float32


def test_float_and_bool_labels():
    scores = torch.tensor([[3.0, 2.0, 1.0]])
    assert M.ndcg(scores, torch.tensor([[0.0, 1.0, 1.0]])).item() == pytest.approx(
        M.ndcg(scores, torch.tensor([[False, True, True]])).item())


# --------------------------------------------------------------------------------------------
# Validation at the public boundary.
# --------------------------------------------------------------------------------------------

S = torch.tensor([[0.5, 0.2, 0.1]])
Y = torch.tensor([[1, 0, 2]])


@pytest.mark.parametrize("call, error, message", [
    (lambda: M.ndcg(S, Y, k=0), ValueError, r"`k` has to be a positive integer or None, got 0"),
    (lambda: M.ndcg(S, Y, k=-2), ValueError, r"`k` .* got -2"),
    (lambda: M.mrr(S, Y, k=2.5), ValueError, r"`k` .* got 2.5"),
    (lambda: M.precision(S, Y, k=True), ValueError, r"`k` .* got True"),
    (lambda: M.ndcg(S, Y[:, :2]), ValueError, r"`labels` has to be a tensor of shape "
                                              r"\(1, 3\), got a torch.int64 tensor of shape \(1, 2\)"),
    (lambda: M.ndcg(S[0], Y[0]), ValueError, r"`scores` has to be a float tensor with 2 "
                                             r"dimensions, got .* shape \(3,\)"),
    (lambda: M.ndcg(Y, Y), ValueError, r"`scores` has to be a float tensor .* got a torch.int64"),
    (lambda: M.ndcg(S, [[1, 0, 2]]), ValueError, r"`labels` has to be a tensor .* got a list"),
    (lambda: M.ndcg(S, Y, mask=torch.ones(1, 3)), ValueError,
     r"`mask` has to be a bool tensor .* got a torch.float32"),
    (lambda: M.ndcg(S, Y, mask=torch.ones(1, 2, dtype=torch.bool)), ValueError,
     r"`mask` has to be a bool tensor of shape \(1, 3\), got .* shape \(1, 2\)"),
    (lambda: M.ndcg(S, torch.tensor([[1, -1, 2]])), ValueError,
     r"`labels` has to be finite and non-negative on real documents, got -1 at \[0, 1\]"),
    (lambda: M.ndcg(S, torch.tensor([[1.0, math.nan, 2.0]])), ValueError,
     r"`labels` has to be finite and non-negative .* got nan at \[0, 1\]"),
    (lambda: M.ndcg(S, torch.tensor([[1.0, math.inf, 2.0]])), ValueError,
     r"`labels` has to be finite .* got inf at \[0, 1\]"),
    (lambda: M.ndcg(torch.tensor([[0.5, math.nan, 0.1]]), Y), ValueError,
     r"`scores` has to be finite on real documents, got nan at \[0, 1\]"),
    (lambda: M.dcg(torch.tensor([[0.5, 0.1, -math.inf]]), Y), ValueError,
     r"`scores` has to be finite .* got -inf at \[0, 2\]"),
    (lambda: M.ndcg(S, Y, gain="log"), ValueError, r"`gain` has to be one of \('exp', 'linear'\), "
                                                   r"got 'log'"),
    (lambda: M.ndcg(S, Y, empty="nan"), ValueError, r"`empty` has to be .* got 'nan'"),
    (lambda: M.average_precision(S, Y, empty=2), ValueError, r"`empty` has to be .* got 2"),
    (lambda: M.mrr(S, Y, threshold=-1), ValueError, r"`threshold` has to be .* got -1"),
    (lambda: M.err(S, Y, max_label=1), ValueError,
     r"`labels` has to be at most `max_label`=1 on real documents, got 2 at \[0, 2\]"),
    (lambda: M.err(S, Y, max_label=0), ValueError, r"`max_label` has to be a finite number in \(0, inf\]"),
    (lambda: M.NDCG(k=0), ValueError, r"`k` has to be a positive integer or None, got 0"),
    (lambda: M.NDCG(empty="none"), ValueError, r"`empty` has to be"),
    (lambda: M.ERR(max_label=-4), ValueError, r"`max_label` has to be"),
    (lambda: M.ndcg(S, Y, k=2.5), ValueError, r"`k` has to be a positive integer or None, got 2.5"),
])
def test_validation_messages(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_garbage_under_padding_is_accepted():
    scores = torch.tensor([[0.5, 0.2, math.nan]])
    labels = torch.tensor([[1, 0, -1]])
    mask = torch.tensor([[True, True, False]])
    assert M.ndcg(scores, labels, mask=mask).item() == 1.0
    assert M.err(scores, torch.tensor([[1, 0, 99]]), mask=mask).item() == pytest.approx(1 / 16)


# --------------------------------------------------------------------------------------------
# scikit-learn and torchmetrics (linear gain, distinct scores, empty = 0 as theirs).
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [None, 1, 3, 10])
def test_ndcg_matches_sklearn(k):
    from sklearn.metrics import ndcg_score

    queries = random_queries(5, min_len=2)  # sklearn refuses single-document lists
    scores, labels, mask = pad(queries)
    # scikit-learn scores a query with all-zero labels as 0 (scikit-learn issue #29521):
    # rankkit's empty=0.0.
    expected = torch.tensor([ndcg_score([y], [s], k=k) for s, y in queries], dtype=torch.float64)
    got = M.ndcg(scores, labels, mask=mask, k=k, gain="linear", empty=0.0)
    assert (expected == 0).any()  # the all-zero queries are in the comparison
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("k", [None, 1, 3, 10])
def test_ndcg_matches_torchmetrics_functional(k):
    from torchmetrics.functional.retrieval import retrieval_normalized_dcg

    queries = random_queries(6)
    scores, labels, mask = pad(queries)
    expected = torch.stack([
        retrieval_normalized_dcg(torch.tensor(s), torch.tensor(y), top_k=k).double()
        for s, y in queries])
    got = M.ndcg(scores, labels, mask=mask, k=k, gain="linear", empty=0.0)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)  # torchmetrics: float32


TM_EMPTY = {"pos": 1.0, "neg": 0.0, "skip": "skip"}


@pytest.mark.parametrize("action", sorted(TM_EMPTY))
@pytest.mark.parametrize("k", [None, 2, 5])
def test_empty_conventions_match_torchmetrics_classes(action, k):
    import torchmetrics.retrieval as R

    # torchmetrics' MAP/MRR/precision count a document as retrieved only when its score > 0:
    # use positive scores.
    queries = random_queries(7, positive=True)
    scores, labels, mask = pad(queries)
    preds = torch.tensor([v for s, _ in queries for v in s])
    target = torch.tensor([v for _, y in queries for v in y])
    indexes = torch.tensor([q for q, (s, _) in enumerate(queries) for _ in s])
    empty = TM_EMPTY[action]
    pairs = [
        (R.RetrievalNormalizedDCG(top_k=k, empty_target_action=action), target,
         M.ndcg(scores, labels, mask=mask, k=k, gain="linear", empty=empty)),
        (R.RetrievalMRR(top_k=k, empty_target_action=action), target > 0,
         M.mrr(scores, labels, mask=mask, k=k, empty=empty)),
        (R.RetrievalPrecision(top_k=k, empty_target_action=action), target > 0,
         M.precision(scores, labels, mask=mask, k=k, empty=empty)),
    ]
    if k is None:  # torchmetrics' AP@k divides by the hits in the top k; equal when k is None
        pairs.append((R.RetrievalMAP(empty_target_action=action), target > 0,
                      M.average_precision(scores, labels, mask=mask, empty=empty)))
    for metric, tm_target, ours in pairs:
        expected = metric(preds, tm_target, indexes=indexes).double()
        torch.testing.assert_close(torch.nanmean(ours), expected, rtol=1e-5, atol=1e-6,
                                   msg=type(metric).__name__)


# --------------------------------------------------------------------------------------------
# LightGBM's own evals (exp gain, empty = 1).
# --------------------------------------------------------------------------------------------

def test_ndcg_and_map_match_lightgbm():
    lgb = pytest.importorskip("lightgbm")

    queries = random_queries(8, n_queries=60, max_len=30)
    scores, labels, mask = pad(queries)
    y = np.concatenate([q[1] for q in queries])
    s = np.concatenate([q[0] for q in queries])
    sizes = [len(q[0]) for q in queries]
    x = np.random.default_rng(0).normal(size=(len(y), 3))
    # LightGBM evaluates init_score + the trees' output. With one tree and a learning rate of
    # 1e-12 the trees move no score by more than ~1e-12, far below the 1/30 spacing of the
    # scores, so the eval ranks documents by exactly our scores.
    train = lgb.Dataset(x, label=y, group=sizes)
    valid = lgb.Dataset(x, label=y, group=sizes, init_score=s, reference=train)
    eval_at = [1, 3, 5, 10, 50]
    record = {}
    lgb.train({"objective": "lambdarank", "metric": ["ndcg", "map"], "eval_at": eval_at,
               "learning_rate": 1e-12, "verbosity": -1, "num_threads": 1},
              train, num_boost_round=1, valid_sets=[valid], valid_names=["valid"],
              callbacks=[lgb.record_evaluation(record)])
    for k in eval_at:
        ours = M.ndcg(scores, labels, mask=mask, k=k).mean().item()
        assert ours == pytest.approx(record["valid"][f"ndcg@{k}"][0], rel=1e-9), k
        ours = M.average_precision(scores, labels, mask=mask, k=k).mean().item()
        assert ours == pytest.approx(record["valid"][f"map@{k}"][0], rel=1e-9), k


# --------------------------------------------------------------------------------------------
# torchmetrics wrappers.
# --------------------------------------------------------------------------------------------

WRAPPERS = [
    (M.NDCG, M.ndcg, {"k": 3}),
    (M.NDCG, M.ndcg, {"k": None, "gain": "linear", "empty": "skip"}),
    (M.MAP, M.average_precision, {"k": 5, "empty": 0.0}),
    (M.MRR, M.mrr, {"k": None, "empty": "skip"}),
    (M.Precision, M.precision, {"k": 2}),
    (M.ERR, M.err, {"k": 10, "max_label": 4}),
]


def batches(seed):
    # Three batches of different widths, as a dataloader of bucketed queries gives.
    return [pad(random_queries(seed + i, n_queries=7 + i, max_len=5 + 10 * i))
            for i in range(3)]


@pytest.mark.parametrize("cls, fn, options", WRAPPERS)
def test_wrapper_mean_over_updates(cls, fn, options):
    metric = cls(**options)
    values = []
    for scores, labels, mask in batches(10):
        metric.update(scores, labels, mask)
        values.append(fn(scores, labels, mask=mask, **options))
    expected = torch.nanmean(torch.cat(values))
    assert metric.compute().dtype == torch.float64
    torch.testing.assert_close(metric.compute(), expected)


@pytest.mark.parametrize("cls, fn, options", WRAPPERS)
def test_wrapper_states_merge_like_ddp(cls, fn, options):
    # Two "ranks" see different batches; summing their states (what DDP sync does) must give
    # the metric of one process that saw everything.
    rank0, rank1, single = cls(**options), cls(**options), cls(**options)
    for i, (scores, labels, mask) in enumerate(batches(20)):
        (rank0 if i % 2 == 0 else rank1).update(scores, labels, mask)
        single.update(scores, labels, mask)
    rank0.merge_state(rank1)
    torch.testing.assert_close(rank0.compute(), single.compute())
    torch.testing.assert_close(rank0.count, single.count)


def test_wrapper_skips_only_nan_queries():
    metric = M.NDCG(empty="skip")
    metric.update(torch.tensor([[1.0, 2.0], [1.0, 2.0]]), torch.tensor([[0, 0], [1, 0]]))
    assert metric.count.item() == 1
    assert metric.compute().item() == pytest.approx(1 / log2(3))
    with pytest.warns(UserWarning, match="before the ``update``"):
        assert math.isnan(M.NDCG(empty="skip").compute().item())  # nothing counted


def test_ranking_metrics_keep_separate_states():
    metrics = M.ranking_metrics((1, 3))
    # First batch: a perfect ranking, so ndcg@1 and ndcg@3 have equal states. torchmetrics'
    # compute groups would then share one state between them from here on.
    perfect = torch.tensor([[3.0, 2.0, 1.0]]), torch.tensor([[2, 1, 0]])
    later = torch.tensor([[3.0, 2.0, 1.0]]), torch.tensor([[0, 1, 2]])
    metrics.update(*perfect)
    metrics.update(*later)
    got = {name: value.item() for name, value in metrics.compute().items()}
    for k in (1, 3):
        expected = (1.0 + M.ndcg(*later, k=k).item()) / 2
        assert got[f"ndcg@{k}"] == pytest.approx(expected)
    assert got["map"] == pytest.approx((1.0 + M.average_precision(*later).item()) / 2)


# --------------------------------------------------------------------------------------------
# Properties.
# --------------------------------------------------------------------------------------------

@st.composite
def padded_batches(draw):
    n_queries = draw(st.integers(1, 4))
    width = draw(st.integers(1, 8))
    cells = st.tuples(st.integers(-2, 2), st.integers(0, 3), st.booleans())
    rows = draw(st.lists(st.lists(cells, min_size=width, max_size=width),
                         min_size=n_queries, max_size=n_queries))
    scores = torch.tensor([[float(c[0]) for c in row] for row in rows], dtype=torch.float64)
    labels = torch.tensor([[c[1] for c in row] for row in rows])
    mask = torch.tensor([[c[2] for c in row] for row in rows])
    return scores, labels, mask


ALL = [M.ndcg, M.dcg, M.average_precision, M.mrr, M.precision, M.err]


@settings(max_examples=60, deadline=None)
@given(batch=padded_batches(), k=st.one_of(st.none(), st.integers(1, 10)))
def test_normalised_metrics_lie_in_unit_interval(batch, k):
    scores, labels, mask = batch
    for fn in (M.ndcg, M.average_precision, M.mrr, M.precision, M.err):
        values = fn(scores, labels, mask=mask, k=k)
        assert ((values >= 0) & (values <= 1 + 1e-12)).all(), fn.__name__
    # Scoring by the labels is an ideal ranking.
    assert torch.allclose(M.ndcg(labels.double(), labels, mask=mask, k=k), torch.tensor(1.0,
                          dtype=torch.float64))


@settings(max_examples=60, deadline=None)
@given(batch=padded_batches(), k=st.one_of(st.none(), st.integers(1, 10)), seed=st.integers(0, 99))
def test_permuting_documents_changes_nothing(batch, k, seed):
    # Scores are small integers, so ties are common: the worst-case rule makes every metric
    # independent of the order of the documents, ties included.
    scores, labels, mask = batch
    perm = torch.randperm(scores.shape[1], generator=torch.Generator().manual_seed(seed))
    for fn in ALL:
        torch.testing.assert_close(fn(scores[:, perm], labels[:, perm], mask=mask[:, perm], k=k),
                                   fn(scores, labels, mask=mask, k=k), equal_nan=True)


# --------------------------------------------------------------------------------------------
# CUDA against CPU.
# --------------------------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    scores, labels, mask = pad(random_queries(9, ties=True))
    for fn in ALL:
        cpu = fn(scores, labels, mask=mask, k=5)
        gpu = fn(scores.cuda(), labels.cuda(), mask=mask.cuda(), k=5)
        assert gpu.is_cuda
        torch.testing.assert_close(gpu.cpu(), cpu)
    metric = M.NDCG(k=5).cuda()
    metric.update(scores.cuda(), labels.cuda(), mask.cuda())
    torch.testing.assert_close(metric.compute().cpu(), M.ndcg(scores, labels, mask=mask, k=5)
                               .mean())


# --------------------------------------------------------------------------------------------
# Any integer grade, exactly: against exact rational metrics.
# --------------------------------------------------------------------------------------------

def _exact_ndcg_err(scores, labels, k, max_label):
    """(NDCG@k with the exp gain, ERR@k) of one query: gains as exact integers, discounts as
    floats, the ratio taken last (2^1000 − 1 and 1 differ by a thousand binary digits)."""
    from fractions import Fraction

    ranked = [y for _, y in sorted(zip(scores, labels), key=lambda t: (-t[0], t[1]))]
    cut = len(ranked) if k is None else min(k, len(ranked))
    disc = [Fraction(1 / log2(p + 2)) for p in range(cut)]
    dcg = sum(((2 ** y - 1) * disc[p] for p, y in enumerate(ranked[:cut])), Fraction(0))
    ideal = sum(((2 ** y - 1) * disc[p] for p, y in enumerate(sorted(ranked, reverse=True)[:cut])),
                Fraction(0))
    total, go_on = Fraction(0), Fraction(1)
    for p, y in enumerate(ranked[:cut]):
        r = Fraction(2 ** y - 1, 2 ** max_label)
        total += go_on * r / (p + 1)
        go_on *= 1 - r
    return float(dcg / ideal) if ideal else 1.0, float(total)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("k", [None, 2, 5])
@pytest.mark.parametrize("grades", ["0-500-1000", "41 grades", "25 and 128"])
def test_any_integer_grade_matches_exact_metrics(grades, k, dtype):
    gen = torch.Generator().manual_seed(3)
    if grades == "0-500-1000":
        labels = torch.tensor([[0, 500, 1000, 0, 500, 1000], [1000, 999, 0, 1, 998, 500]])
    elif grades == "41 grades":
        labels = torch.stack([torch.randperm(41, generator=gen) for _ in range(3)])
    else:
        labels = torch.tensor([[25, 0, 24, 25, 3, 1], [128, 127, 0, 128, 2, 126]])
    scores = torch.randn(labels.shape, generator=gen, dtype=torch.float64).to(dtype)
    top = int(labels.max())
    want = [_exact_ndcg_err(s, y, k, top) for s, y in zip(scores.double().tolist(), labels.tolist())]
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-12)
    for y in (labels, labels.to(dtype)):
        got_ndcg = M.ndcg(scores, y, k=k)
        got_err = M.err(scores, y, k=k, max_label=top)
        torch.testing.assert_close(got_ndcg.double(), torch.tensor([w[0] for w in want],
                                                                   dtype=torch.float64), **tol)
        torch.testing.assert_close(got_err.double(), torch.tensor([w[1] for w in want],
                                                                  dtype=torch.float64), **tol)
    # DCG itself is not scale-free: exact in float64, inf in float32 from 2^128 on.
    got = M.dcg(scores.double(), labels, k=k)
    assert torch.isfinite(got).all()


@pytest.mark.parametrize("label", [0, 1, 3, 1000])
def test_a_query_of_equal_labels_has_its_documented_value(label):
    scores = torch.randn(2, 5, generator=torch.Generator().manual_seed(1))
    labels = torch.full((2, 5), label)
    # Every ranking is ideal: NDCG 1, or `empty` when every label is 0 (ideal DCG 0).
    assert M.ndcg(scores, labels, empty=0.25).tolist() == [0.25 if label == 0 else 1.0] * 2
    # ERR with every R = (2^y − 1) / 2^max_label: Σ_r R (1 − R)^(r−1) / r over 5 ranks.
    r = (2.0 ** label - 1) / 2.0 ** max(label, 1) if label < 1000 else 1.0 - 2.0 ** -1000
    want = sum(r * (1 - r) ** (p - 1) / p for p in range(1, 6))
    got = M.err(scores.double(), labels, max_label=max(label, 1))
    torch.testing.assert_close(got, torch.full((2,), want, dtype=torch.float64))
