"""Neural rankers: scorers, the lambda-injecting loss, and the RankNet/LambdaRank LightningModules."""
from rankkit.neural.loss import LambdaLoss, lambda_loss
from rankkit.neural.module import LambdaRank, NeuralRanker, RankNet
from rankkit.neural.scorer import FeaturePreprocessor, MLPScorer

__all__ = ["FeaturePreprocessor", "LambdaLoss", "LambdaRank", "MLPScorer", "NeuralRanker", "RankNet", "lambda_loss"]
