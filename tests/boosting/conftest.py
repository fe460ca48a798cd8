"""What the booster's tests share: small synthetic sets, a fitted model, both histogram paths, one thread."""
from __future__ import annotations

import pytest
import torch

from rankkit.boosting import LambdaMART
from rankkit.data import make_synthetic
from rankkit.data.dataset import RankingDataset
from rankkit.kernels import cpu as _cpu_kernel


def small_set(seed=0, n_queries=30, docs=12, n_features=6) -> RankingDataset:
    return make_synthetic(n_queries, docs, n_features, seed=seed)


@pytest.fixture(scope="module")
def fitted():
    train = small_set()
    x = train.features.clone()
    x[::5, 1] = float("nan")
    data = RankingDataset(x, train.labels, train.offsets, train.qids)
    return LambdaMART(n_estimators=6, depth=3, min_data_in_leaf=3).fit(data, eval_set=[data]), x


@pytest.fixture(params=["kernel", "torch"])
def histogram_path(request, monkeypatch):
    """Run a test with the compiled CPU histogram kernel and with the torch-ops histograms."""
    if request.param == "torch":
        monkeypatch.setenv("RANKKIT_CPU_KERNEL", "0")
    elif not _cpu_kernel.available():
        pytest.skip("no C compiler: the compiled histogram kernel is unavailable")
    return request.param


@pytest.fixture(scope="module")
def one_thread():
    # The test machines are shared (2 cores): one thread is faster there than two fighting.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
