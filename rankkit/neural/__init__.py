"""Neural rankers: the lambda-injecting loss and the RankNet/LambdaRank LightningModules (their click
debiasings live in :mod:`rankkit.clicks`, shared with LambdaMART). The scorers they train are the
plain `nn.Module`s of :mod:`rankkit.scorers` (re-exported here)."""
from rankkit.neural.loss import LambdaLoss, lambda_loss
from rankkit.neural.module import LambdaRank, NeuralRanker, RankNet
from rankkit.scorers import (FeaturePreprocessor, MeanEnsemble, MLPScorer, PiecewiseLinearEncoder, TransformerScorer,
                             is_list_aware, score_lists)

__all__ = ["FeaturePreprocessor", "LambdaLoss", "LambdaRank", "MLPScorer", "MeanEnsemble", "NeuralRanker",
           "PiecewiseLinearEncoder", "RankNet", "TransformerScorer", "is_list_aware", "lambda_loss", "score_lists"]
