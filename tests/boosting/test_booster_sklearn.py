"""The LambdaMART estimator's contract for users of scikit-learn, LightGBM and XGBoost: inputs
(numpy, torch, pandas, scipy sparse; any hashable qid, or group), outputs (numpy), ``score``,
model selection with GroupKFold, and scikit-learn's own estimator checks."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from rankkit.boosting import LambdaMART
from rankkit.boosting.booster import SKLEARN_EXPECTED_FAILED_CHECKS
from rankkit.data import make_synthetic

KW = dict(n_estimators=4, depth=3, min_data_in_leaf=3)


@pytest.fixture(scope="module")
def data():
    d = make_synthetic(30, 10, 5, seed=0)
    qid = torch.repeat_interleave(d.qids, d.sizes).numpy()
    return d.features.numpy(), d.labels.numpy(), qid, d


def test_predict_returns_numpy_float32(data):
    x, y, qid, _ = data
    pred = LambdaMART(**KW).fit(x, y, qid=qid).predict(x)
    assert isinstance(pred, np.ndarray) and pred.dtype == np.float32 and pred.shape == (len(y),)


def test_string_qids_torch_pandas_and_sparse_inputs_give_the_same_model(data):
    pd = pytest.importorskip("pandas")
    sparse = pytest.importorskip("scipy.sparse")
    x, y, qid, _ = data
    base = LambdaMART(**KW).fit(x, y, qid=qid).predict(x)
    names = np.asarray([f"q-{q}" for q in qid], dtype=object)
    frame = pd.DataFrame(x, columns=[f"f{i}" for i in range(x.shape[1])])
    csr = sparse.csr_matrix(np.where(np.abs(x) > 0.5, x, 0.0))
    dense_of_csr = csr.toarray()
    np.testing.assert_array_equal(LambdaMART(**KW).fit(x, y, qid=names).predict(x), base)
    np.testing.assert_array_equal(LambdaMART(**KW).fit(torch.from_numpy(x), torch.from_numpy(y),
                                                       qid=torch.from_numpy(qid)).predict(x), base)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # pandas input must not trigger torch warnings
        model = LambdaMART(**KW).fit(frame, pd.Series(y), qid=pd.Series(names))
        np.testing.assert_array_equal(model.predict(frame), base)
    assert list(model.feature_names_in_) == list(frame.columns)
    with pytest.raises(ValueError, match="feature names differ.*column 0 is 'f4', the model expects 'f0'"):
        model.predict(frame[list(frame.columns[::-1])])  # swapped columns
    from_csr = LambdaMART(**KW).fit(csr, y, qid=qid)
    np.testing.assert_array_equal(from_csr.predict(csr), LambdaMART(**KW).fit(dense_of_csr, y, qid=qid)
                                  .predict(dense_of_csr))
    np.testing.assert_array_equal(from_csr.predict(csr.tocsc()), from_csr.predict(dense_of_csr))


def test_queries_are_required_and_must_be_contiguous(data):
    x, y, qid, _ = data
    with pytest.raises(ValueError, match="`qid` or `group` is required"):
        LambdaMART(**KW).fit(x, y)
    with pytest.raises(ValueError, match=r"contiguous.*query 'b' comes back at position 2"):
        LambdaMART(**KW).fit(x[:3], y[:3], qid=["b", "a", "b"])
    with pytest.raises(ValueError, match="eval_qid\\[0\\]` or `eval_group\\[0\\]` is required"):
        LambdaMART(**KW).fit(x, y, qid=qid, eval_set=[(x, y)])


def test_eval_qid_and_eval_group_score_the_same_eval_set(data):
    x, y, qid, d = data
    a = LambdaMART(**KW).fit(x, y, qid=qid, eval_set=[(x, y)], eval_qid=[qid])
    b = LambdaMART(**KW).fit(x, y, qid=qid, eval_set=[(x, y)], eval_group=[d.sizes.numpy()])
    c = LambdaMART(**KW).fit(x, y, qid=qid, eval_set=[d])
    assert a.evals_result_ == b.evals_result_ == c.evals_result_
    assert len(a.evals_result_["valid_0"]["ndcg@10"]) == KW["n_estimators"]


def test_score_is_mean_ndcg_at_10_and_model_selection_works(data):
    from sklearn.model_selection import GridSearchCV, GroupKFold, cross_val_score

    from rankkit.data.dataset import pad
    from rankkit.metrics import ndcg

    x, y, qid, d = data
    model = LambdaMART(**KW).fit(x, y, qid=qid)
    s, mask = pad(torch.from_numpy(model.predict(x)), d.sizes)
    expected = float(ndcg(s, pad(d.labels, d.sizes)[0], mask=mask, k=10).double().mean())
    assert model.score(x, y, qid=qid) == pytest.approx(expected)
    import sklearn

    cv = GroupKFold(n_splits=3)
    # scikit-learn's metadata routing hands each fold its documents' qids, in fit and in score.
    with sklearn.config_context(enable_metadata_routing=True):
        ranker = LambdaMART(**KW).set_fit_request(qid=True).set_score_request(qid=True)
        scores = cross_val_score(ranker, x, y, cv=cv, params={"qid": qid, "groups": qid})
        search = GridSearchCV(ranker, {"depth": [2, 3]}, cv=cv).fit(x, y, qid=qid, groups=qid)
    assert scores.shape == (3,) and np.all((scores >= 0) & (scores <= 1))
    assert search.best_params_["depth"] in (2, 3) and 0 <= search.best_score_ <= 1


class _OneQueryPerFit(LambdaMART):
    """scikit-learn's checks call fit(X, y): this test-only subclass makes that one query, so
    the rest of the contract (cloning, params, n_features_in_, pickling, idempotence, ...) is
    checked; LambdaMART itself refuses fit(X, y) (see SKLEARN_EXPECTED_FAILED_CHECKS)."""

    def fit(self, X, y=None, **kw):
        if kw.get("qid") is None and kw.get("group") is None and y is not None and np.shape(X)[0]:
            kw["group"] = [np.shape(X)[0]]
        return super().fit(X, y, **kw)

    def score(self, X, y=None, **kw):
        if kw.get("qid") is None and kw.get("group") is None:
            kw["group"] = [np.shape(X)[0]]
        return super().score(X, y, **kw)


@pytest.mark.slow
def test_scikit_learn_estimator_checks():
    from sklearn.utils.estimator_checks import check_estimator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # The contract, with fit(X, y) as one query: every check passes.
        results = check_estimator(_OneQueryPerFit(n_estimators=3, depth=2, min_data_in_leaf=1), on_fail=None)
        failed = [r["check_name"] for r in results if r["status"] == "failed"]
        assert failed == []
        # LambdaMART itself: exactly the declared checks fail (each needs fit(X, y) without queries).
        results = check_estimator(LambdaMART(n_estimators=3, depth=2, min_data_in_leaf=1), on_fail=None,
                                  expected_failed_checks=SKLEARN_EXPECTED_FAILED_CHECKS)
    failed = {r["check_name"] for r in results if r["status"] == "failed"}
    assert failed == set()
    xfailed = {r["check_name"] for r in results if r["status"] == "xfail"}
    assert xfailed == set(SKLEARN_EXPECTED_FAILED_CHECKS)
