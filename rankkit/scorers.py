"""Scorers: ``nn.Module``s mapping raw features to scores, in one of two kinds.

* **Pointwise** (the default): ``forward(features [..., F]) -> scores [...]``, one document at a
  time (:class:`MLPScorer`, the booster's tree ensemble, any user module).
* **List-aware**: a module whose class sets ``list_aware = True`` takes a padded batch of whole
  queries, ``forward(features [Q, L, F], mask [Q, L]) -> scores [Q, L]``, and may score each
  document in the context of its query's others (:class:`TransformerScorer`). It must give a
  real document the same score whatever padding sits beside it (padding rows may hold any
  values; their scores are ignored).

A pointwise scorer is the special case that ignores the mask; :func:`score_lists` calls either
kind on a padded batch, and the training modules, export and serving all go through it.

Feature preprocessing belongs to the scorer, so an exported scorer takes raw features.
LETOR features are heavy-tailed; :class:`FeaturePreprocessor` offers a signed ``log1p`` and a
standardisation fitted on the training set, and (training only) Gaussian noise on the
standardised features; :class:`PiecewiseLinearEncoder` codes each feature by its place among the
training values' quantiles instead.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from rankkit.infra import checks as _checks


def is_list_aware(scorer) -> bool:
    """Whether ``scorer`` takes ``(features [Q, L, F], mask [Q, L])`` (its ``list_aware``)."""
    return bool(getattr(scorer, "list_aware", False))


def score_lists(scorer, features: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Scores [Q, L] of a padded batch with either kind of scorer, zero on padding.

    Args:
        scorer: a pointwise or list-aware scorer (see the module docstring).
        features: [Q, L, F] raw features.
        mask: [Q, L] bool, True on real documents (None: all real).
    Raises:
        ValueError: the scorer's output is not [Q, L], or it refuses the call; the message
            says which contract it has to follow.

    >>> score_lists(MLPScorer(3, (4,)), torch.zeros(2, 5, 3), torch.ones(2, 5, dtype=torch.bool)).shape
    torch.Size([2, 5])
    """
    if mask is None:
        mask = torch.ones(features.shape[:-1], dtype=torch.bool, device=features.device)
    kind = "list-aware" if is_list_aware(scorer) else "pointwise"
    try:
        scores = scorer(features, mask) if kind == "list-aware" else scorer(features)
    except TypeError as e:
        raise ValueError(f"the scorer {type(scorer).__name__} does not fit the {kind} contract: "
                         f"{_CONTRACT} ({e})") from e
    if not isinstance(scores, torch.Tensor) or scores.shape != mask.shape:
        shape = tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__
        raise ValueError(f"the scorer {type(scorer).__name__} ({kind}) returned {shape} for features "
                         f"{tuple(features.shape)}, not scores {tuple(mask.shape)}: {_CONTRACT}")
    return scores.masked_fill(~mask, 0.0)


_CONTRACT = ("a scorer maps features [..., F] to scores [...] (pointwise), or, with the class "
             "attribute `list_aware = True`, (features [Q, L, F], mask [Q, L]) to scores [Q, L]")

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh, "silu": nn.SiLU, "elu": nn.ELU}
NORMS = ("none", "layer")


def missing_as_zero(x: torch.Tensor) -> torch.Tensor:
    """Missing values (NaN, ±inf) as 0: how every input stage reads them."""
    return torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)


class FeaturePreprocessor(nn.Module):
    """Raw features [..., F] -> model inputs [..., F].

    In order: missing values (NaN) become 0; optionally ``sign(x) * log1p(|x|)``; optionally
    ``(x - mean) / std`` with mean/std from :meth:`fit` (features with std 0 keep std 1);
    finally NaN left by nothing else is impossible, and values are clipped to ``±clip`` so a
    wild feature in serving cannot blow up the network.

    ``noise`` σ > 0 adds N(0, σ²) to every transformed feature in training mode only (the data
    augmentation of DASALC: Qin, Yan, Zhuang, Tay, Pasumarthi, Wang, Bendersky, Najork, "Are
    Neural Rankers still Outperformed by Gradient Boosted Decision Trees?", ICLR 2021); in eval
    mode, and so in every export, the transform is deterministic.
    """

    def __init__(self, n_features: int, *, log1p: bool = True, standardize: bool = True, clip: float = 10.0,
                 noise: float = 0.0):
        super().__init__()
        self.n_features = n_features
        self.log1p = log1p
        self.standardize = standardize
        self.clip = clip
        self.noise = float(noise)
        self.register_buffer("mean", torch.zeros(n_features))
        self.register_buffer("std", torch.ones(n_features))
        self.register_buffer("fitted", torch.zeros((), dtype=torch.bool))

    @property
    def is_fitted(self) -> bool:
        """Whether :meth:`fit` (or :meth:`fit_stream`) has set the statistics."""
        return bool(self.fitted) or not self.standardize

    def _transform(self, x: torch.Tensor) -> torch.Tensor:
        x = missing_as_zero(x)
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
        n = 0
        total = None
        for x in batches():
            x = self._transform(x.reshape(-1, self.n_features).double())
            total = x.sum(0) if total is None else total + x.sum(0)
            n += x.shape[0]
        if total is None:  # no rows here: this process still joins the reductions
            total = self.mean.new_zeros(self.n_features, dtype=torch.float64)
        stats = reduce(torch.cat([total, total.new_tensor([n])]))
        count = stats[-1]
        if float(count) == 0:
            raise ValueError("the training loader yielded no documents to fit the feature preprocessing on")
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
        if self.training and self.noise > 0:
            x = x + self.noise * torch.randn_like(x)
        return x.clamp(-self.clip, self.clip)


class PiecewiseLinearEncoder(nn.Module):
    """Raw features [..., F] -> embeddings [..., F · dim]: each feature's piecewise-linear
    encoding over quantile bins, then a per-feature linear map to ``dim`` values and a ReLU.

    The PLE-Q encoding of Gorishniy, Rubachev, Babenko, "On Embeddings for Numerical Features in
    Tabular Deep Learning" (NeurIPS 2022): with the feature's bin edges e_0 ≤ e_1 ≤ ... ≤ e_T (the
    0, 1/T, ..., 1 quantiles of the training documents), bin t reads
    clamp((x − e_{t−1}) / (e_t − e_{t−1}), 0, 1), so x is coded by where it falls among the
    training values, as a tree's split sees it; a bin of width 0 (a repeated value, a feature
    with fewer than T + 1 distinct values) reads 0. Unlike the paper, whose first and last bins
    are open (a value beyond the training range goes on growing), every bin is clamped: a value
    beyond the range codes as the range's end, as it would for a tree, so a wild value in
    serving cannot blow up the network. Missing values (NaN, ±inf) read as 0 first, as in
    :class:`FeaturePreprocessor`. The edges are buffers, fitted by :meth:`fit` or
    :meth:`fit_stream` (the neural rankers fit them on the training documents when training
    starts, as the preprocessor's statistics), so an exported scorer carries them. Before it is
    fitted the edges are T even steps of [0, 1] (where LETOR's query-normalised features lie),
    so an unfitted encoder still passes its inputs on (Lightning's sanity check validates before
    training starts).

    >>> encoder = PiecewiseLinearEncoder(2, bins=4, dim=3).fit(torch.rand(100, 2))
    >>> encoder(torch.rand(5, 7, 2)).shape
    torch.Size([5, 7, 6])
    """

    def __init__(self, n_features: int, *, bins: int = 16, dim: int = 8, sample: int = 100_000):
        super().__init__()
        self.n_features = _checks.check_int(n_features, "n_features", low=1)
        self.bins = _checks.check_int(bins, "bins", low=2, high=1024)
        self.dim = _checks.check_int(dim, "dim", low=1)
        self.sample = _checks.check_int(sample, "sample", low=2)
        self.register_buffer("edges", torch.linspace(0, 1, bins + 1).repeat(n_features, 1))
        self.register_buffer("fitted", torch.zeros((), dtype=torch.bool))
        self.weight = nn.Parameter(torch.randn(n_features, bins, dim) / math.sqrt(bins))
        self.bias = nn.Parameter(torch.zeros(n_features, dim))

    @property
    def out_features(self) -> int:
        return self.n_features * self.dim

    @property
    def is_fitted(self) -> bool:
        """Whether :meth:`fit` (or :meth:`fit_stream`) has placed the edges."""
        return bool(self.fitted)

    def _quantiles(self, x: torch.Tensor) -> torch.Tensor:
        """[F, T + 1] float64: the 0, 1/T, ..., 1 quantiles of rows x [n, F] (linear interpolation,
        as numpy's default), a block of features at a time."""
        x = missing_as_zero(x.reshape(-1, self.n_features).double())
        if x.shape[0] == 0:
            raise ValueError("no training documents to fit the piecewise-linear encoding on")
        at = torch.linspace(0, 1, self.bins + 1, dtype=torch.float64) * (x.shape[0] - 1)
        low = at.floor().long()
        high = (low + 1).clamp_max(x.shape[0] - 1)
        frac = (at - low).unsqueeze(1)
        out = []
        for start in range(0, self.n_features, 64):
            column = x[:, start:start + 64].sort(dim=0).values
            out.append(column[low] + frac * (column[high] - column[low]))
        return torch.cat(out, dim=1).t()

    def _set(self, edges: torch.Tensor) -> None:
        self.edges.copy_(torch.cummax(edges, dim=1).values.to(self.edges.dtype))
        self.fitted.fill_(True)

    @torch.no_grad()
    def fit(self, features: torch.Tensor) -> "PiecewiseLinearEncoder":
        """Place the edges on training features [N, F] (at most ``sample`` rows, evenly strided)."""
        x = self._rows(features)
        stride = max(1, math.ceil(x.shape[0] / self.sample))
        self._set(self._quantiles(x[::stride].cpu()))
        return self

    @torch.no_grad()
    def fit_stream(self, batches, *, reduce=lambda t: t) -> "PiecewiseLinearEncoder":
        """:meth:`fit` on a stream of feature batches, ``batches()`` yielding [n, F] tensors, in two
        passes (the row count, then every stride-th row). ``reduce`` sums a tensor across processes:
        each process places edges on its own rows and the edges are averaged, weighted by the
        processes' rows, so every process holds the same ones (the identity in one process)."""
        n = sum(self._rows(x).shape[0] for x in batches())
        stride = max(1, math.ceil(n / self.sample))
        kept, seen = [], 0
        for x in batches():
            x = self._rows(x)
            kept.append(x[(-seen) % stride::stride].cpu())
            seen += x.shape[0]
        # Each process's edges weighted by its rows; a process without rows adds nothing (and still
        # joins the reduction, so the others do not wait for it).
        edges = self._quantiles(torch.cat(kept)) if n else torch.zeros(self.n_features, self.bins + 1,
                                                                          dtype=torch.float64)
        total = reduce(torch.cat([edges.reshape(-1) * n, edges.new_full((1,), float(n))]).to(self.edges.device))
        if float(total[-1]) == 0:
            raise ValueError("the training loader yielded no documents to fit the piecewise-linear encoding on")
        self._set((total[:-1] / total[-1]).reshape(edges.shape))
        return self

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.n_features:
            raise ValueError(f"expected {self.n_features} features, got {x.shape[-1]}")
        return x.reshape(-1, self.n_features)

    def encode(self, features: torch.Tensor) -> torch.Tensor:
        """[..., F] -> [..., F, T]: the piecewise-linear codes in [0, 1]."""
        x = missing_as_zero(features).unsqueeze(-1)
        low, high = self.edges[:, :-1], self.edges[:, 1:]
        width = high - low
        live = width > 0
        code = ((x - low) / torch.where(live, width, torch.ones_like(width))).clamp(0.0, 1.0)
        return code * live.to(code.dtype)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        out = torch.einsum("...ft,ftd->...fd", self.encode(features), self.weight) + self.bias
        return torch.relu(out).flatten(-2)


ENCODINGS = ("standard", "piecewise")


def feature_encoder(n_features: int, encoding: str, *, log1p: bool, standardize: bool, noise: float = 0.0,
                    bins: int = 16) -> tuple[nn.Module, int]:
    """The input stage of a default scorer and its output width: a :class:`FeaturePreprocessor`
    (``"standard"``: signed log1p, standardisation) or a :class:`PiecewiseLinearEncoder`
    (``"piecewise"``, ``bins`` quantile bins a feature, 8 values each)."""
    if encoding == "piecewise":
        if noise > 0:
            raise ValueError(f"`noise` is added to the standard encoding's features; `encoding=\"piecewise\"` takes "
                             f"none, got noise={noise}")
        encoder = PiecewiseLinearEncoder(n_features, bins=bins)
        return encoder, encoder.out_features
    if encoding != "standard":
        raise ValueError(f"`encoding` has to be one of {ENCODINGS}, got {encoding!r}")
    return FeaturePreprocessor(n_features, log1p=log1p, standardize=standardize, noise=noise), n_features


def _check_tower(n_features, hidden, activation: str, dropout: float) -> None:
    """The arguments every scorer's per-document tower shares (MLPScorer, TransformerScorer)."""
    _checks.check_int(n_features, "n_features", low=1)
    for i, h in enumerate(hidden):
        if isinstance(h, bool) or not isinstance(h, int) or h < 1:
            raise ValueError(f"`hidden` has to hold positive layer sizes, got {h!r} at [{i}]")
    if activation not in ACTIVATIONS:
        raise ValueError(f"`activation` has to be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"`dropout` has to be in [0, 1), got {dropout}")


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
        encoding: the input stage, ``"standard"`` (:class:`FeaturePreprocessor`: ``log1p``,
            ``standardize``) or ``"piecewise"`` (:class:`PiecewiseLinearEncoder` of ``bins``
            quantile bins a feature, which ignores ``log1p`` and ``standardize``: quantiles do
            not move under monotone maps).
        bins: the piecewise encoding's bins a feature.

    >>> scorer = MLPScorer(4, hidden=(8,))
    >>> scorer(torch.randn(2, 3, 4)).shape
    torch.Size([2, 3])
    """

    def __init__(self, n_features: int, hidden: tuple[int, ...] | list[int] = (128, 64), *,
                 activation: str = "relu", dropout: float = 0.0, norm: str = "none",
                 log1p: bool = True, standardize: bool = True, encoding: str = "standard", bins: int = 16):
        super().__init__()

        _check_tower(n_features, hidden, activation, dropout)
        if norm not in NORMS:
            raise ValueError(f"`norm` has to be one of {NORMS}, got {norm!r}")
        self.n_features = n_features
        self.preprocess, width = feature_encoder(n_features, encoding, log1p=log1p, standardize=standardize,
                                                 bins=bins)
        layers: list[nn.Module] = []
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


class _SelfAttention(nn.Module):
    """One pre-LayerNorm encoder block over a query's documents: x [Q, L, d] -> [Q, L, d].

    Multi-head scaled dot-product attention (Vaswani et al., "Attention Is All You Need", 2017)
    whose keys are the query's real documents only, then a position-wise feed-forward layer, each
    with a residual connection. No positional encoding: permuting the documents permutes the
    output. A padding key gets weight exactly 0, so padding changes no real document's output.
    """

    def __init__(self, width: int, heads: int, feedforward: int, dropout: float, activation: str):
        super().__init__()
        self.heads = heads
        self.norm_attention = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.norm_feedforward = nn.LayerNorm(width)
        self.feedforward = nn.Sequential(nn.Linear(width, feedforward), ACTIVATIONS[activation](),
                                         nn.Dropout(dropout), nn.Linear(feedforward, width))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q_count, length, width = x.shape
        head_width = width // self.heads
        qkv = self.qkv(self.norm_attention(x)).reshape(q_count, length, 3, self.heads, head_width)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [Q, heads, L, d_h]
        logits = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(head_width)  # [Q, heads, L, L]
        # A large finite negative (not -inf): a query of padding only then gets uniform weights, not NaN.
        logits = logits.float().masked_fill(~mask[:, None, None, :], -1.0e30)
        weights = torch.softmax(logits, dim=-1).to(v.dtype)
        context = torch.matmul(weights, v).transpose(1, 2).reshape(q_count, length, width)
        x = x + self.dropout(self.out(context))
        return x + self.dropout(self.feedforward(self.norm_feedforward(x)))


class TransformerScorer(nn.Module):
    """A context-aware scorer: each document scored beside the others of its query.

    (features [Q, L, F], mask [Q, L]) -> scores [Q, L]; ``list_aware = True``. In order:

    1. the input stage: :class:`FeaturePreprocessor` (signed log1p, standardisation, training
       noise ``noise``) or, with ``encoding="piecewise"``, :class:`PiecewiseLinearEncoder`;
    2. a per-document tower h = MLP(x) of widths ``hidden`` (the last is the model width d);
    3. ``layers`` self-attention blocks over the query's real documents, c = Enc(h, mask)
       (Pobrotyn, Bartczak, Synowiec, Białobrzeski, Bojar, "Context-Aware Learning to Rank with
       Self-Attention", 2020), without positional encoding, so the scorer is
       permutation-equivariant over the list;
    4. with ``latent_cross`` the DASALC latent cross z = (1 + c) ⊙ h of the list context with
       the document (Qin et al., "Are Neural Rankers still Outperformed by Gradient Boosted
       Decision Trees?", ICLR 2021), else z = c;
    5. a head Linear(d, d) → activation → Linear(d, 1).

    Scores of padding positions are whatever the network gives (callers ignore them); a real
    document's score does not depend on the padding (its keys are masked out).

    Args:
        n_features: F.
        hidden: the per-document tower's widths; ``hidden[-1]`` is the attention width d and
            has to be divisible by ``heads``.
        heads: attention heads per block.
        layers: attention blocks (0: a DASALC-style tower and head without context).
        feedforward: the blocks' feed-forward width (default 2 d).
        activation, dropout: as :class:`MLPScorer`.
        latent_cross: the DASALC latent cross (above).
        log1p, standardize, noise: see :class:`FeaturePreprocessor`.
        encoding, bins: the input stage, as :class:`MLPScorer`'s (``noise`` needs ``"standard"``).

    >>> scorer = TransformerScorer(4, hidden=(8,), heads=2)
    >>> scorer(torch.randn(2, 3, 4), torch.tensor([[True, True, False], [True, True, True]])).shape
    torch.Size([2, 3])
    """

    list_aware = True

    def __init__(self, n_features: int, hidden: tuple[int, ...] | list[int] = (64,), *, heads: int = 4,
                 layers: int = 2, feedforward: int | None = None, activation: str = "relu",
                 dropout: float = 0.1, latent_cross: bool = True, log1p: bool = True,
                 standardize: bool = True, noise: float = 0.0, encoding: str = "standard", bins: int = 16):
        super().__init__()

        if not len(hidden):
            raise ValueError("`hidden` has to hold at least one width (the attention width is its last)")
        _check_tower(n_features, hidden, activation, dropout)
        _checks.check_int(heads, "heads", low=1)
        _checks.check_int(layers, "layers", low=0)
        width = hidden[-1]
        if width % heads:
            raise ValueError(f"`heads` has to divide the attention width hidden[-1] = {width}, got {heads}")
        feedforward = 2 * width if feedforward is None else _checks.check_int(feedforward, "feedforward", low=1)
        _checks.check_number(noise, "noise", low=0)
        self.n_features = n_features
        self.latent_cross = _checks.check_bool(latent_cross, "latent_cross")
        self.preprocess, previous = feature_encoder(n_features, encoding, log1p=log1p, standardize=standardize,
                                                    noise=noise, bins=bins)
        tower: list[nn.Module] = []
        for h in hidden:
            tower += [nn.Linear(previous, h), ACTIVATIONS[activation](), nn.Dropout(dropout)]
            previous = h
        self.tower = nn.Sequential(*tower)
        self.blocks = nn.ModuleList(_SelfAttention(width, heads, feedforward, dropout, activation)
                                    for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Sequential(nn.Linear(width, width), ACTIVATIONS[activation](), nn.Linear(width, 1))

    def forward(self, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """features [Q, L, F], mask [Q, L] bool -> scores [Q, L]."""
        h = self.tower(self.preprocess(features))
        context = h
        for block in self.blocks:
            context = block(context, mask)
        context = self.norm(context)
        z = (1.0 + context) * h if self.latent_cross else context
        return self.head(z).squeeze(-1)


class MeanEnsemble(nn.Module):
    """The mean score of several scorers of the same feature count: ``members`` trained with
    different seeds, say (``rankkit compare --ensemble``). List-aware when any member is; a
    pointwise member then scores the same padded batch's rows [Q·L, F] document by document,
    and the padding scores 0.

    >>> ensemble = MeanEnsemble([MLPScorer(3, (4,)), MLPScorer(3, (4,))])
    >>> ensemble(torch.zeros(5, 3)).shape
    torch.Size([5])
    """

    def __init__(self, members: list[nn.Module]):
        super().__init__()
        if not len(members):
            raise ValueError("`members` has to hold at least one scorer")
        counts = {getattr(m, "n_features", None) for m in members} - {None}
        if len(counts) > 1:
            raise ValueError(f"`members` take different feature counts: {sorted(counts)}")
        self.n_members = len(members)
        self.list_members = nn.ModuleList(m for m in members if is_list_aware(m))
        self.point_members = nn.ModuleList(m for m in members if not is_list_aware(m))
        self.list_aware = len(self.list_members) > 0
        if counts:
            self.n_features = counts.pop()

    def forward(self, features: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """features [..., F] (pointwise), or [Q, L, F] with mask [Q, L] (list-aware) -> scores."""
        if mask is None:
            mask = torch.ones(features.shape[:-1], dtype=torch.bool, device=features.device)
        total = torch.zeros(features.shape[:-1], dtype=features.dtype, device=features.device)
        for member in self.list_members:
            total = total + member(features, mask)
        flat = features.reshape(-1, features.shape[-1])  # a pointwise member scores rows [N, F]
        for member in self.point_members:
            total = total + member(flat).reshape(features.shape[:-1])
        if self.list_aware:  # padding scores 0, as a list-aware member's
            total = total.masked_fill(~mask, 0.0)
        return total / self.n_members


# -- the scorer a neural ranker builds from its hyper-parameters ------------------------------------
def default_scorer(n_features: int | None, *, architecture: str, hidden, activation: str, dropout: float,
                   norm: str, log1p: bool, standardize: bool, heads: int, layers: int,
                   latent_cross: bool, encoding: str = "standard", bins: int = 16) -> nn.Module:
    """The scorer a :class:`NeuralRanker` builds when none is passed in: an
    :class:`~rankkit.scorers.MLPScorer` or a :class:`~rankkit.scorers.TransformerScorer`."""
    if n_features is None:
        raise ValueError("pass `n_features` (for the default MLP scorer) or `scorer` (an nn.Module)")
    n = _checks.check_int(n_features, "n_features")
    if architecture == "transformer":
        return TransformerScorer(n, tuple(hidden), heads=heads, layers=layers, activation=activation,
                                 dropout=dropout, latent_cross=latent_cross, log1p=log1p, standardize=standardize,
                                 encoding=encoding, bins=bins)
    return MLPScorer(n, tuple(hidden), activation=activation, dropout=dropout, norm=norm, log1p=log1p,
                     standardize=standardize, encoding=encoding, bins=bins)


def set_noise(scorer: nn.Module, noise: float) -> None:
    """DASALC's training noise σ on every FeaturePreprocessor of ``scorer``."""
    preprocessors = [m for m in scorer.modules() if isinstance(m, FeaturePreprocessor)]
    if not preprocessors:
        raise ValueError(f"`noise` is added by the scorer's FeaturePreprocessor, and the scorer "
                         f"{type(scorer).__name__} has none (`encoding=\"piecewise\"` takes no noise)")
    for pre in preprocessors:
        pre.noise = float(noise)


def neural_scorer(o) -> nn.Module:
    """The scorer of a neural ranker's settings ``o`` (:class:`rankkit.neural.config.NeuralConfig`):
    ``o.scorer`` when given, else :func:`default_scorer` of the architecture settings; with
    ``o.noise`` its preprocessing's training noise set."""
    scorer = o.scorer
    if scorer is None:
        scorer = default_scorer(o.n_features, architecture=o.architecture, hidden=o.hidden, activation=o.activation,
                                dropout=o.dropout, norm=o.norm, log1p=o.log1p, standardize=o.standardize,
                                heads=o.heads, layers=o.layers, latent_cross=o.latent_cross, encoding=o.encoding,
                                bins=o.bins)
    elif not isinstance(scorer, nn.Module):
        raise ValueError(f"`scorer` has to be an nn.Module, got {_checks.describe(scorer)}")
    if o.noise > 0:
        set_noise(scorer, o.noise)
    return scorer


def fit_preprocessors(scorers: list[nn.Module], features, *, reduce=lambda t: t, refit: bool = False) -> bool:
    """Fit the :class:`FeaturePreprocessor` s and :class:`PiecewiseLinearEncoder` s of ``scorers``: on
    ``features`` [N, F] (a tensor), or streamed from ``features()`` (a callable giving [n, F] chunks,
    sums combined by ``reduce``).
    Only the unfitted ones unless ``refit``; returns whether any was fitted."""
    todo = [m for scorer in scorers for m in scorer.modules()
            if isinstance(m, (FeaturePreprocessor, PiecewiseLinearEncoder)) and (refit or not m.is_fitted)]
    for pre in todo:
        if callable(features):
            pre.fit_stream(features, reduce=reduce)
        else:
            pre.fit(features)
    return bool(todo)
