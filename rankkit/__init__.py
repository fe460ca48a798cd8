"""rankkit: learning to rank in PyTorch -- RankNet, LambdaRank and LambdaMART on one lambda kernel.

Heavy submodules (Lightning, the booster) load on first use, so ``import rankkit`` stays fast.
"""
from __future__ import annotations

import importlib

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
    "PropensityEstimator": "rankkit.unbiased",
    "simulate_clicks": "rankkit.data.clicks",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rankkit' has no attribute {name!r}")


def __dir__():
    return __all__
