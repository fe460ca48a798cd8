"""An MSLR-shaped synthetic ranking set for benchmarks at scale.

MSLR-WEB30K has about 31.5k queries x 120 documents x 136 features with labels 0-4 heavily
skewed to 0 (roughly 51% / 32% / 13% / 2% / 1%). :func:`make_synthetic` reproduces that
shape: labels come from a hidden nonlinear score plus noise, cut at per-query quantiles
chosen to match that skew, and features are heavy-tailed like web features.
"""
from __future__ import annotations

import torch

from rankkit.data.dataset import RankingDataset

# Cumulative label shares of MSLR-WEB30K (rounded), used as the cut points of the latent score.
_LABEL_CDF = (0.52, 0.84, 0.97, 0.99)


def make_synthetic(n_queries: int, docs_per_query: int | tuple[int, int], n_features: int, *,
                   seed: int = 0, informative: int | None = None, noise: float = 0.5) -> RankingDataset:
    """Generate a query-grouped dataset.

    Args:
        n_queries: Q.
        docs_per_query: a fixed list length, or an inclusive ``(low, high)`` range from which
            each query's length is drawn log-uniformly (e.g. ``(1, 1000)``).
        n_features: F.
        seed: the generator seed; the same seed gives the same data.
        informative: how many features carry signal (default: a third of F, at least 1).
        noise: standard deviation of the label noise, relative to the latent score's.
    Returns:
        A :class:`RankingDataset` with labels in 0..4.

    >>> ds = make_synthetic(3, 5, 4, seed=1)
    >>> ds.n_queries, ds.n_docs, ds.n_features
    (3, 15, 4)
    """
    if n_queries < 1 or n_features < 1:
        raise ValueError("`n_queries` and `n_features` have to be positive integers")
    g = torch.Generator().manual_seed(seed)
    if isinstance(docs_per_query, int):
        if docs_per_query < 1:
            raise ValueError(f"`docs_per_query` has to be positive, got {docs_per_query}")
        sizes = torch.full((n_queries,), docs_per_query, dtype=torch.int64)
    else:
        low, high = docs_per_query
        if not 1 <= low <= high:
            raise ValueError(f"`docs_per_query` range must satisfy 1 <= low <= high, got {docs_per_query}")
        u = torch.rand(n_queries, generator=g, dtype=torch.float64)
        sizes = torch.exp(torch.log(torch.tensor(float(low))) +
                          u * (torch.log(torch.tensor(high + 1.0)) - torch.log(torch.tensor(float(low)))))
        sizes = sizes.floor().clamp(low, high).long()
    n = int(sizes.sum())
    informative = max(1, n_features // 3) if informative is None else informative
    # Heavy-tailed features: exp of a Gaussian with a per-query shift (query-level effects).
    query_of = torch.repeat_interleave(torch.arange(n_queries), sizes)
    shift = torch.randn(n_queries, n_features, generator=g)[query_of] * 0.5
    z = torch.randn(n, n_features, generator=g) + shift
    features = torch.where(torch.arange(n_features) % 2 == 0, torch.expm1(z.abs()) * z.sign(), z)
    # Hidden nonlinear score on the informative features (standardised within each query so the
    # label skew holds per query as in web data).
    w = torch.randn(informative, generator=g)
    v = torch.randn(informative, generator=g)
    zi = z[:, :informative]
    latent = zi @ w + 0.5 * torch.tanh(zi) @ v + 0.3 * zi[:, 0] * zi[:, min(1, informative - 1)]
    latent = latent + noise * latent.std() * torch.randn(n, generator=g)
    mean = torch.zeros(n_queries).index_add_(0, query_of, latent) / sizes
    centred = latent - mean[query_of]
    var = torch.zeros(n_queries).index_add_(0, query_of, centred**2) / sizes
    latent = centred / var.clamp_min(1e-12).sqrt()[query_of]
    cuts = torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor(_LABEL_CDF))
    labels = torch.bucketize(latent, cuts).float()
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(sizes, 0)])
    return RankingDataset(features.float(), labels, offsets, torch.arange(n_queries), None,
                          f"synthetic(q={n_queries}, l={docs_per_query}, f={n_features}, seed={seed})")
