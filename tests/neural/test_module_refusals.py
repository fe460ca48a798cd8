"""rankkit.neural.module: a weighting with a loss is refused, not dropped."""
from __future__ import annotations

import pytest


@pytest.mark.parametrize("cls_name,loss", [("LambdaRank", "softmax"), ("NeuralRanker", "listmle"),
                                           ("NeuralRanker", "ndcg_loss2pp")])
def test_neural_weighting_with_a_loss_is_refused(cls_name, loss):
    """``LambdaRank(loss="softmax", weighting="map")`` trained softmax and dropped the weighting;
    the class's default weighting with a loss stays accepted."""
    import rankkit.neural.module as m

    cls = getattr(m, cls_name)
    with pytest.raises(ValueError, match=r"`weighting` is not used when `loss` is given"):
        cls(n_features=3, loss=loss, weighting="map")
    cls(n_features=3, loss=loss)
