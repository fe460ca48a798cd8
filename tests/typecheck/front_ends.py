"""What a type checker sees of rankkit's front ends (``make lint`` runs mypy on this file).

Every call below is checked against the written ``__init__``s. The refused calls carry an
``ignore`` that mypy must use: with ``warn_unused_ignores`` an ignore it does not need is an
error, so the lint fails the day a signature stops flagging them. tests/infra/test_params.py runs
both functions: the accepted calls construct, each refused one raises TypeError.
"""
import rankkit
from rankkit.boosting import LambdaMART, LambdaMARTModule
from rankkit.neural import LambdaRank, NeuralRanker, RankNet


def accepted() -> list[object]:
    return [LambdaMART(depth=3),
            LambdaMART("ranknet", n_estimators=10, k=None, unbiased="position", n_jobs=-1),
            LambdaMARTModule(depth=3, learning_rate=0.05),
            RankNet(n_features=46, hidden=[64, 32]),
            LambdaRank(n_features=46, weighting="err", k=10),
            NeuralRanker(46, architecture="transformer", objective="softmax"),
            rankkit.LambdaMART(depth=3),
            rankkit.LambdaMARTModule(depth=3),
            rankkit.RankNet(n_features=46)]


REFUSED = [
    lambda: LambdaMART(dept=3),  # type: ignore[call-arg]
    lambda: LambdaMART("lambdarank", 100),  # type: ignore[call-arg]
    lambda: LambdaMARTModule(n_estimators=10),  # type: ignore[call-arg]
    lambda: RankNet(hiden=[64]),  # type: ignore[call-arg]
    lambda: NeuralRanker(46, [64]),  # type: ignore[call-arg]
    lambda: rankkit.LambdaMART(dept=3),  # type: ignore[call-arg]
    lambda: rankkit.LambdaRank(hiden=[64]),  # type: ignore[call-arg]
]
#: Wrong types mypy flags; at run time the front end's own check refuses them (at fit or build).
MISTYPED = [
    lambda: LambdaMART(depth="3"),  # type: ignore[arg-type]
    lambda: LambdaRank(n_features=46, k="10"),  # type: ignore[arg-type]
]


def _hinge(scores, labels, mask):
    return scores.sum(1)


def accepted_custom_objectives() -> list[object]:
    """A custom objective passed itself (the README's and docs/custom_losses.md's use)."""
    return [LambdaMART(objective=_hinge), LambdaMARTModule(objective=_hinge),
            LambdaRank(n_features=46, objective=_hinge), RankNet(n_features=46, loss=_hinge)]
