"""rankkit.lambdas.ranking: the one tie rule of every ranking (each fast path against three stable sorts
and a loop), the ideal DCG against a float64 loop, and gains and discounts that never overflow."""
import math
from math import log2

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rankkit.lambdas.ranking import (_packed_order, _reference_rank_order, discounts, gain_shift, gain_values,
                                     ideal_dcg, rank_order)


def test_gains_over_the_top_grade_never_overflow_and_keep_their_ratios():
    labels = torch.tensor([[0.0, 3.0, 1000.0, 999.0], [2.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[True] * 4, [True, True, True, False]])
    shift = gain_shift(labels, mask)
    assert shift.tolist() == [1000.0, 2.0] and gain_shift(labels, mask, "linear") is None
    g = gain_values(labels, shift=shift)
    assert torch.isfinite(g).all() and g[0, 2] == 1.0 and g[0, 3] == 0.5
    assert g[1, :2].tolist() == [3 / 4, 1 / 4]  # (2^y − 1) / 2^2
    assert gain_values(labels[1:], "linear").tolist() == [[2.0, 1.0, 0.0, 0.0]]
    assert torch.isinf(gain_values(labels.float())[0, 2])  # the raw gain of grade 1000 in float32
    with pytest.raises(ValueError, match="`gain` has to be one of"):
        gain_values(labels, "log")


def test_discounts_are_one_over_log2_of_the_rank_plus_one():
    assert discounts(5, dtype=torch.float64).tolist() == [1 / log2(r + 1) for r in range(1, 6)]


@pytest.mark.parametrize("k", [None, 1, 3, 50])
@pytest.mark.parametrize("gain", ["exp", "linear"])
@pytest.mark.parametrize("grades", ["integer", "fractional", "large"])
def test_ideal_dcg_counting_and_sorting_paths_match_loop(k, gain, grades):
    """The counting path (integer grades 0..31) and the sort path both equal a float64 loop."""
    rng = np.random.default_rng(7)
    labels = rng.integers(0, 5, size=(12, 30)).astype(float)
    if grades == "fractional":
        labels = labels * 0.5  # not all integers: the sort path
    elif grades == "large":
        labels[:, 0] = 40.0  # above the counted range: the sort path
    mask = rng.random((12, 30)) > 0.3
    mask[3] = False  # an empty query
    want = []
    for row, keep in zip(labels, mask):
        ideal = sorted(row[keep], reverse=True)[:k]
        want.append(sum((2.0 ** y - 1 if gain == "exp" else y) / log2(r + 2)
                        for r, y in enumerate(ideal)))
    y = torch.tensor(labels)
    y[~torch.tensor(mask)] = -1.0  # garbage under the padding must not count
    got = ideal_dcg(y, torch.tensor(mask), k=k, gain=gain)
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    got32 = ideal_dcg(y.float(), torch.tensor(mask), k=k, gain=gain)
    torch.testing.assert_close(got32.double(), torch.tensor(want, dtype=torch.float64),
                               rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------------
# The one tie rule: every fast path of rank_order against the three stable sorts and a loop.
# --------------------------------------------------------------------------------------------

def _loop_rank_order(scores, labels, mask):
    """Real documents by (score descending, label ascending, index), then padding by index."""
    out = []
    for s, y, m in zip(scores.tolist(), labels.tolist(), mask.tolist()):
        real = sorted((i for i in range(len(s)) if m[i]), key=lambda i: (-s[i], y[i], i))
        out.append(real + [i for i in range(len(s)) if not m[i]])
    return out


@settings(max_examples=150, deadline=None)
@given(n_q=st.integers(1, 4), n_d=st.integers(1, 12), data=st.data(),
       score_dtype=st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]),
       label_kind=st.sampled_from(["float32", "float64", "int64", "bool", "halves"]))
def test_rank_order_fast_paths_equal_the_three_sort_reference(n_q, n_d, data, score_dtype,
                                                              label_kind):
    cells = n_q * n_d
    values = data.draw(st.lists(st.sampled_from([-1.5, -0.0, 0.0, 0.5, 1.0, 3e30, -1e-30,
                                                 math.inf, -math.inf]) | st.floats(-3, 3),
                                min_size=cells, max_size=cells))
    grades = data.draw(st.lists(st.integers(0, 4), min_size=cells, max_size=cells))
    keep = data.draw(st.lists(st.booleans(), min_size=cells, max_size=cells))
    scores = torch.tensor(values, dtype=torch.float64).view(n_q, n_d).to(score_dtype)
    labels = torch.tensor(grades).view(n_q, n_d)
    labels = {"float32": labels.float(), "float64": labels.double(), "int64": labels,
              "bool": labels > 1, "halves": labels.float() * 0.5}[label_kind]
    mask = torch.tensor(keep).view(n_q, n_d)
    got = rank_order(scores, labels, mask)
    assert got.tolist() == _reference_rank_order(scores, labels, mask).tolist()
    assert got.tolist() == _loop_rank_order(scores.double(), labels.double(), mask)


def test_one_sort_tie_order_equals_rank_order():
    gen = torch.Generator().manual_seed(5)
    for trial in range(60):
        n = int(torch.randint(1, 30, (1,), generator=gen))
        scale = (1.0, 0.5, 1e-30, 3e30)[trial % 4]
        scores = torch.randint(-3, 4, (5, n), generator=gen).float() * scale
        scores[:, ::3] *= -0.0  # −0 and +0 tie
        labels = torch.randint(0, 5, (5, n), generator=gen).float() * (0.5 if trial % 5 == 0 else 1.0)
        mask = torch.rand(5, n, generator=gen) < 0.8 if trial % 2 else torch.ones(5, n, dtype=torch.bool)
        want, got = rank_order(scores.double(), labels, mask), _packed_order(scores, labels, mask)
        for q in range(5):
            real = int(mask[q].sum())
            assert got[q, :real].tolist() == want[q, :real].tolist()  # real documents first, same order
