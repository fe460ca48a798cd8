"""rankkit: learning to rank in PyTorch -- RankNet, LambdaRank and LambdaMART on one lambda kernel.

Heavy submodules (Lightning, the booster) load on first use, so ``import rankkit`` stays fast.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_EXPORTS = {
    # data
    "RankingDataset": "rankkit.data.dataset",
    "PaddedBatch": "rankkit.data.dataset",
    "read_svmlight": "rankkit.data.svmlight",
    "load_mq2008": "rankkit.data.bundled",
    "make_synthetic": "rankkit.data.synthetic",
    "fetch_mslr_web10k": "rankkit.data.fetch",
    "fetch_mslr_web30k": "rankkit.data.fetch",
    "RankingDataModule": "rankkit.training.datamodule",
    # the lambda kernel, the losses and the metrics
    "lambda_gradients": "rankkit.lambdas",
    "objective_gradients": "rankkit.losses",
    "dcg": "rankkit.metrics",
    "ndcg": "rankkit.metrics",
    "average_precision": "rankkit.metrics",
    "mrr": "rankkit.metrics",
    "err": "rankkit.metrics",
    "precision": "rankkit.metrics",
    "NDCG": "rankkit.metrics",
    "MAP": "rankkit.metrics",
    "MRR": "rankkit.metrics",
    "ERR": "rankkit.metrics",
    "ranking_metrics": "rankkit.metrics",
    # neural rankers
    "MLPScorer": "rankkit.neural",
    "lambda_loss": "rankkit.neural",
    "RankNet": "rankkit.neural",
    "LambdaRank": "rankkit.neural",
    # gradient boosting
    "LambdaMART": "rankkit.boosting.booster",
    "LambdaMARTModule": "rankkit.boosting.module",
    "ObliviousEnsemble": "rankkit.boosting.ensemble",
    "QuantileBinner": "rankkit.boosting.binning",
    # export
    "export_torchscript": "rankkit.export",
    "export_program": "rankkit.export",
    "export_onnx": "rankkit.export",
    "load_scorer": "rankkit.export",
    # serving files, clicks
    "load_model": "rankkit.serving",
    "predict_file": "rankkit.serving",
    "PropensityEstimator": "rankkit.clicks.propensity",
    "simulate_clicks": "rankkit.data.clicks",
}

if TYPE_CHECKING:  # what a type checker and an IDE read: _EXPORTS's names (tests/test_api.py checks)
    from rankkit.data.dataset import PaddedBatch, RankingDataset
    from rankkit.data.svmlight import read_svmlight
    from rankkit.data.bundled import load_mq2008
    from rankkit.data.synthetic import make_synthetic
    from rankkit.data.fetch import fetch_mslr_web10k, fetch_mslr_web30k
    from rankkit.training.datamodule import RankingDataModule
    from rankkit.lambdas import lambda_gradients
    from rankkit.losses import objective_gradients
    from rankkit.metrics import ERR, MAP, MRR, NDCG, average_precision, dcg, err, mrr, ndcg, precision, ranking_metrics
    from rankkit.neural import LambdaRank, MLPScorer, RankNet, lambda_loss
    from rankkit.boosting.booster import LambdaMART
    from rankkit.boosting.module import LambdaMARTModule
    from rankkit.boosting.ensemble import ObliviousEnsemble
    from rankkit.boosting.binning import QuantileBinner
    from rankkit.export import export_onnx, export_program, export_torchscript, load_scorer
    from rankkit.serving import load_model, predict_file
    from rankkit.clicks.propensity import PropensityEstimator
    from rankkit.data.clicks import simulate_clicks

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rankkit' has no attribute {name!r}")


def __dir__():
    return __all__
