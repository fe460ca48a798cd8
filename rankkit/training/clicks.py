"""Click logs to train on: a production LambdaMART ranks the queries, simulated users click.

The training side of :mod:`rankkit.data.clicks` (which holds the click models and the
simulation, and imports no model): it trains the protocol's production ranker, so it sits above
the booster, and ``RankingDataModule(clicks=...)`` calls :func:`click_split`.
"""
from __future__ import annotations

import numpy as np
import torch

from rankkit.boosting import LambdaMART
from rankkit.data.clicks import CascadeModel, PositionBasedModel, simulate_clicks
from rankkit.data.dataset import RankingDataset
from rankkit.infra.checks import check_choice, check_int, check_number, describe

__all__ = ["CLICK_OPTIONS", "click_split", "production_ranker", "production_scores"]


def production_ranker(train: RankingDataset, *, fraction: float = 0.01, seed: int = 0,
                      n_estimators: int = 50, depth: int = 4, **params):
    """The production ranker of the protocol: LambdaMART trained on ``fraction`` of the queries.

    The queries are drawn at random (at least one). ``params`` go to
    :class:`rankkit.boosting.LambdaMART` (e.g. ``min_data_in_leaf`` for tiny subsets).

    Returns:
        The fitted estimator; :func:`production_scores` scores a dataset with it.
    """
    if not isinstance(train, RankingDataset):
        raise ValueError(f"`train` has to be a RankingDataset, got {describe(train)}")
    fraction = check_number(fraction, "fraction", low=0.0, high=1.0, low_open=True)
    seed = check_int(seed, "seed", low=0)
    n = max(1, round(fraction * train.n_queries))
    queries = torch.randperm(train.n_queries, generator=torch.Generator().manual_seed(seed))[:n]
    model = LambdaMART(n_estimators=n_estimators, depth=depth, seed=seed, **params)
    return model.fit(train.subset(queries.sort().values))


def production_scores(ranker, dataset: RankingDataset) -> torch.Tensor:
    """Scores [N] (float32) of ``dataset`` by a fitted ranker's public ``predict``."""
    return torch.as_tensor(np.asarray(ranker.predict(dataset)), dtype=torch.float32)


#: The keys of a click-log protocol (:func:`click_split`, ``RankingDataModule(clicks=...)``).
CLICK_OPTIONS = ("model", "eta", "sessions", "k", "fraction", "max_label")


#: The most rows a simulated click log may hold (queries x sessions x shown documents), checked
#: before any is drawn: 2^26 rows of 136 float32 features are 36 GB; MSLR-WEB30K's default log
#: (31,531 queries x 40 sessions x 10) is 12.6 M rows.
MAX_LOG_ROWS = 2**26


def click_split(train: RankingDataset, val: RankingDataset | None, *, model: str = "pbm", eta: float = 1.0,
                sessions: int = 40, k: int = 10, fraction: float = 0.01, max_label: float | None = None,
                seed: int = 0) -> tuple[RankingDataset, RankingDataset | None]:
    """Click logs in place of a labelled training and validation split: the protocol of
    experiments/unbiased.py, as data a ranker trains on.

    A production LambdaMART trained on ``fraction`` of the training queries (50 trees of depth
    3) ranks every training and validation query; its top ``k`` is shown ``sessions`` times per
    query to a simulated user (``model``: ``"pbm"``, position-based with examination
    (1/(r+1))^``eta``, or ``"cascade"``, stop after a click; attractiveness 0.1 + 0.9 (2^y − 1) /
    (2^ymax − 1)); sessions without a click are dropped. The training and the validation logs
    use different seeds; the test split keeps its true labels.

    Returns:
        (training sessions, validation sessions or None): :class:`RankingDataset` of one query
        per session, clicks as labels, with ``position``.
    """
    check_choice(model, ("pbm", "cascade"), "clicks.model")
    sessions, k = check_int(sessions, "clicks.sessions"), check_int(k, "clicks.k")
    for data in (train, val):  # every simulated row is allocated: bounded before anything is drawn
        rows = 0 if data is None else data.n_queries * sessions * k
        if rows > MAX_LOG_ROWS:
            raise ValueError(f"`clicks.sessions` = {sessions} x `clicks.k` = {k} over {data.n_queries} queries is a "
                             f"log of {rows} rows, more than MAX_LOG_ROWS = {MAX_LOG_ROWS} "
                             f"(rankkit.training.clicks); lower `sessions`")
    top = max_label if max_label is not None else float(train.labels.max()) if train.n_docs else 1.0
    click_model = (PositionBasedModel(eta=check_number(eta, "clicks.eta", low=0.0), epsilon_plus=1.0,
                                      epsilon_minus=0.1, max_label=top)
                   if model == "pbm" else CascadeModel(stop=1.0, epsilon_plus=1.0, epsilon_minus=0.1, max_label=top))
    prod = production_ranker(train, fraction=fraction, n_estimators=50, depth=3, min_data_in_leaf=5, seed=seed)
    logs = []
    for i, data in enumerate((train, val)):
        if data is None:
            logs.append(None)
            continue
        log = simulate_clicks(data, production_scores(prod, data), model=click_model,
                              sessions_per_query=sessions, k=k,
                              seed=seed + 1000 * i, drop_unclicked=True)
        logs.append(log.sessions)
    return logs[0], logs[1]
