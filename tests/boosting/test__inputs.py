"""rankkit.boosting._inputs: every kind of X gives the same float32 rows, and query sizes from qid or group."""
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import torch

from rankkit.boosting._inputs import FeatureMatrix, InputTypeError, query_sizes, vector


def _data(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((37, 5)).astype(np.float32)
    x[rng.random(x.shape) < 0.4] = 0.0
    x[3, 1] = np.nan
    return x


@pytest.mark.parametrize("kind", ["numpy", "torch", "pandas", "csr", "csc", "coo"])
def test_every_kind_of_matrix_gives_the_same_rows_chunks_and_selections(kind):
    x = _data()
    given = {"numpy": lambda: x, "torch": lambda: torch.from_numpy(x.copy()),
             "pandas": lambda: pd.DataFrame(x, columns=list("abcde")),
             "csr": lambda: sp.csr_matrix(x), "csc": lambda: sp.csc_matrix(x), "coo": lambda: sp.coo_matrix(x)}[kind]()
    m = FeatureMatrix(given)
    assert (m.n_rows, m.n_features) == (37, 5)
    expected = torch.from_numpy(x)
    assert torch.equal(m.dense().nan_to_num(7.0), expected.nan_to_num(7.0))
    chunks = list(m.chunks(size=8))
    assert [len(c) for c in chunks] == [8, 8, 8, 8, 5]
    assert torch.equal(torch.cat(chunks).nan_to_num(7.0), expected.nan_to_num(7.0))
    index = torch.tensor([36, 0, 3, 3])
    assert torch.equal(m.rows(index).nan_to_num(7.0), expected[index].nan_to_num(7.0))
    assert (m.names is not None) == (kind == "pandas")
    if kind == "pandas":
        assert m.names.tolist() == list("abcde")


@pytest.mark.parametrize("given, match", [
    (np.array([[1.0, np.inf]]), r"`X` has to be finite or NaN"),
    (sp.csr_matrix(np.array([[0.0, 1.0], [-np.inf, 0.0]])), r"at \[1, 0\]"),
    (np.zeros(3), r"\[N, F\] matrix"),
    (np.zeros((0, 3)), "0 sample"),
    (np.zeros((3, 0)), "0 feature"),
    (np.array([[1 + 2j]]), "real-valued"),
    (torch.ones(2, 2, dtype=torch.bool), "real-valued"),
])
def test_bad_matrices_are_refused_with_the_argument_and_the_place(given, match):
    with pytest.raises(ValueError, match=match):
        FeatureMatrix(given)


def test_text_is_refused_as_both_a_value_and_a_type_error():
    with pytest.raises(InputTypeError, match="numeric") as info:
        FeatureMatrix([["a", "b"]], name="X_val")
    assert isinstance(info.value, TypeError) and "`X_val`" in str(info.value)


def test_vectors_are_checked_by_kind():
    assert vector([1, 2, 3], 3, "y").dtype == torch.float32
    assert vector(np.array([0.1, 0.2]), 2, "s", kind="double").tolist() == [0.1, 0.2]
    with pytest.raises(ValueError, match=r"`y` has to have shape \[3\]"):
        vector([1, 2], 3, "y")
    with pytest.raises(ValueError, match="`y`.*non-negative.*-1"):
        vector([0, -1, 2], 3, "y", kind="label")
    with pytest.raises(ValueError, match="`init_score`"):
        vector([0.0, np.nan], 2, "init_score")
    read_only = np.ones(4)
    read_only.flags.writeable = False
    assert vector(read_only, 4, "w", kind="weight").sum() == 4
    # bool labels are clicks, 0 and 1, from numpy and torch alike; a bool weight or score is refused
    clicks = np.array([True, False, True])
    from_numpy, from_torch = vector(clicks, 3, "y", kind="label"), vector(torch.as_tensor(clicks), 3, "y", kind="label")
    assert from_numpy.tolist() == from_torch.tolist() == [1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="`w` has to be real-valued, got torch.bool"):
        vector(torch.as_tensor(clicks), 3, "w", kind="weight")


def _sizes_by_loop(qid):
    sizes = []
    for i, q in enumerate(qid):
        if i and q == qid[i - 1]:
            sizes[-1] += 1
        else:
            sizes.append(1)
    return sizes


@pytest.mark.parametrize("qid", [[5, 5, 1, 1, 1, 9], ["b", "a", "a", 3, 3.5, 3.5], np.array([2.0, 2.0, 7.0])])
def test_query_sizes_from_ids_follow_the_runs_and_from_group_are_checked(qid):
    sizes = query_sizes(qid, None, len(qid))
    assert sizes.tolist() == _sizes_by_loop(list(qid))
    assert query_sizes(None, sizes.numpy(), len(qid)).tolist() == sizes.tolist()


@pytest.mark.parametrize("qid, group, match", [
    ([1, 2, 1], None, "contiguous.*query 1 comes back at position 2 after position 0"),
    ([1.0, float("nan"), 2.0], None, r"nan at \[1\]"),
    ([1, 1], None, r"shape \[3\]"),
    (None, [1, 1], "sum to the number of documents N=3"),
    (None, [2, 0, 1], "positive"),
    (None, [1.5, 1.5], "integer sizes"),
    (None, [2 ** 62, 2 ** 62, 2 ** 63 - 2 ** 62 * 2 + 3], "at most the number of documents"),
    ([1, 1, 1], [3], "either `qid` or `group`"),
    (None, None, "is required"),
])
def test_bad_queries_are_refused(qid, group, match):
    with pytest.raises(ValueError, match=match):
        query_sizes(qid, group, 3)
