"""Gradient-boosted oblivious trees (LambdaMART) on the shared lambda kernel, CPU or CUDA.

``binning`` (quantile codes), ``tree`` (histograms, split search, Newton leaves), ``ensemble``
(the exported nn.Module), ``objectives`` (kernel gradients, metrics), ``booster`` (the
scikit-learn estimator) and ``module`` (the LightningModule). Never imports ``rankkit.neural``.
"""
from typing import TYPE_CHECKING

from rankkit.boosting.binning import QuantileBinner
from rankkit.boosting.booster import LambdaMART
from rankkit.boosting.ensemble import ObliviousEnsemble

if TYPE_CHECKING:  # a type checker sees the class __getattr__ loads on first use
    from rankkit.boosting.module import LambdaMARTModule

__all__ = ["LambdaMART", "LambdaMARTModule", "ObliviousEnsemble", "QuantileBinner"]


def __getattr__(name: str):
    if name == "LambdaMARTModule":  # Lightning loads only when the module is asked for
        from rankkit.boosting.module import LambdaMARTModule

        return LambdaMARTModule
    raise AttributeError(f"module 'rankkit.boosting' has no attribute {name!r}")
