"""Scorers: ``nn.Module``s mapping raw features [..., F] to scores [...].

Feature preprocessing belongs to the scorer, so an exported scorer takes raw features.
LETOR features are heavy-tailed; :class:`FeaturePreprocessor` offers a signed ``log1p`` and a
standardisation fitted on the training set. A second scorer (for example listwise
self-attention over a query's documents) can sit beside :class:`MLPScorer` with the same
``forward(features) -> scores`` contract.
"""
from __future__ import annotations

import torch
from torch import nn

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh, "silu": nn.SiLU, "elu": nn.ELU}
NORMS = ("none", "layer")


class FeaturePreprocessor(nn.Module):
    """Raw features [..., F] -> model inputs [..., F].

    In order: missing values (NaN) become 0; optionally ``sign(x) * log1p(|x|)``; optionally
    ``(x - mean) / std`` with mean/std from :meth:`fit` (features with std 0 keep std 1);
    finally NaN left by nothing else is impossible, and values are clipped to ``±clip`` so a
    wild feature in serving cannot blow up the network.
    """

    def __init__(self, n_features: int, *, log1p: bool = True, standardize: bool = True, clip: float = 10.0):
        super().__init__()
        self.n_features = n_features
        self.log1p = log1p
        self.standardize = standardize
        self.clip = clip
        self.register_buffer("mean", torch.zeros(n_features))
        self.register_buffer("std", torch.ones(n_features))
        self.register_buffer("fitted", torch.zeros((), dtype=torch.bool))

    @property
    def is_fitted(self) -> bool:
        """Whether :meth:`fit` (or :meth:`fit_stream`) has set the statistics."""
        return bool(self.fitted) or not self.standardize

    def _transform(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)
        if self.log1p:
            x = torch.sign(x) * torch.log1p(torch.abs(x))
        return x

    @torch.no_grad()
    def fit(self, features: torch.Tensor) -> "FeaturePreprocessor":
        """Fit mean and std on training features [N, F]."""
        if features.shape[-1] != self.n_features:
            raise ValueError(f"expected {self.n_features} features, got {features.shape[-1]}")
        x = self._transform(features.reshape(-1, self.n_features).double())
        self._set(x.mean(0), x.std(0))
        return self

    def _set(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        self.mean.copy_(mean.float())
        std = std.float()
        self.std.copy_(torch.where(std > 1e-12, std, torch.ones_like(std)))
        self.fitted.fill_(True)

    @torch.no_grad()
    def fit_stream(self, batches, *, reduce=lambda t: t) -> "FeaturePreprocessor":
        """:meth:`fit` on the rows of a stream of feature batches, ``batches()`` yielding [n, F]
        tensors, in two passes (mean, then the centred sum of squares, as ``fit``); ``reduce``
        sums a tensor across processes (the identity in one)."""
        n = None
        total = None
        for x in batches():
            x = self._transform(x.reshape(-1, self.n_features).double())
            total = x.sum(0) if total is None else total + x.sum(0)
            n = x.shape[0] if n is None else n + x.shape[0]
        if total is None:
            raise ValueError("the training loader yielded no documents to fit the feature preprocessing on")
        stats = reduce(torch.cat([total, total.new_tensor([n])]))
        count = stats[-1]
        mean = stats[:-1] / count
        squares = torch.zeros_like(mean)
        for x in batches():
            x = self._transform(x.reshape(-1, self.n_features).double())
            squares += (x - mean).square().sum(0)
        squares = reduce(squares)
        self._set(mean, (squares / (count - 1).clamp_min(1)).sqrt())
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._transform(x)
        if self.standardize:
            x = (x - self.mean) / self.std
        return x.clamp(-self.clip, self.clip)


class MLPScorer(nn.Module):
    """A multilayer perceptron scorer: features [..., F] -> scores [...].

    Args:
        n_features: F.
        hidden: hidden layer sizes, e.g. ``(128, 64)``.
        activation: one of ``relu``, ``gelu``, ``tanh``, ``silu``, ``elu``.
        dropout: dropout after each hidden layer.
        norm: ``"layer"`` (LayerNorm after each hidden layer) or ``"none"``. BatchNorm is not
            offered: padded batches would leak padding into its statistics.
        log1p, standardize: see :class:`FeaturePreprocessor`.

    >>> scorer = MLPScorer(4, hidden=(8,))
    >>> scorer(torch.randn(2, 3, 4)).shape
    torch.Size([2, 3])
    """

    def __init__(self, n_features: int, hidden: tuple[int, ...] | list[int] = (128, 64), *,
                 activation: str = "relu", dropout: float = 0.0, norm: str = "none",
                 log1p: bool = True, standardize: bool = True):
        super().__init__()
        from rankkit import _checks

        _checks.check_int(n_features, "n_features", low=1)
        for i, h in enumerate(hidden):
            if isinstance(h, bool) or not isinstance(h, int) or h < 1:
                raise ValueError(f"`hidden` has to hold positive layer sizes, got {h!r} at [{i}]")
        if activation not in ACTIVATIONS:
            raise ValueError(f"`activation` has to be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        if norm not in NORMS:
            raise ValueError(f"`norm` has to be one of {NORMS}, got {norm!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"`dropout` has to be in [0, 1), got {dropout}")
        self.n_features = n_features
        self.preprocess = FeaturePreprocessor(n_features, log1p=log1p, standardize=standardize)
        layers: list[nn.Module] = []
        width = n_features
        for h in hidden:
            layers.append(nn.Linear(width, h))
            if norm == "layer":
                layers.append(nn.LayerNorm(h))
            layers.append(ACTIVATIONS[activation]())
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            width = h
        layers.append(nn.Linear(width, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """features [..., F] -> scores [...]."""
        return self.net(self.preprocess(features)).squeeze(-1)
