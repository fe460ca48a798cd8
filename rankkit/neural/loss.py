"""The lambda-injecting loss: a ``torch.autograd.Function`` around the shared lambda kernel.

Forward returns the (normalised) pairwise loss, Burges (2010) eq. for RankNet's cost
weighted by |ΔZ|:

    C = Σ_q Σ_{(i,j): y_i > y_j} |ΔZ_ij| log(1 + exp(−σ (s_i − s_j)))

so that users can log it. Backward does not differentiate that expression: it returns the
kernel's lambdas (``grad``), which for LambdaRank carry |ΔNDCG| (or |ΔMAP|, |ΔERR|) recomputed
from the current ranking -- the "lambda trick" of Burges et al. For ``weighting="ranknet"``
the two coincide, which the tests check against ``torch.autograd``.

Normalisation (``reduction``):

* ``"query"`` (default): C / Q, with Q the number of queries in the batch that hold at least
  one document. A batch's gradient then does not grow with the number of queries in it.
* ``"pair"``: C / P, with P the number of pairs with y_i > y_j (before truncation).
* ``"sum"``: C itself. Over an epoch every query then counts the same, whatever batch it
  lands in; with ``"query"`` a query in a batch of many short queries counts less than one in
  a batch of a few long ones (length-bucketed batches of ``max_docs`` documents). On MQ2008
  ``"sum"`` scored clearly higher on vali (docs/benchmarks.md), and the configs use it.
"""
from __future__ import annotations

import torch

from rankkit.lambdas import lambda_gradients

REDUCTIONS = ("query", "pair", "sum")


def _denominator(labels: torch.Tensor, mask: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "sum":
        return torch.ones((), dtype=torch.float64, device=labels.device)
    if reduction == "query":
        return mask.any(dim=1).sum().clamp_min(1).to(torch.float64)
    # Pairs with y_i > y_j among real documents, from per-query label counts n_c:
    # (n² − Σ_c n_c²) / 2. Truncation is not taken into account.
    lab = labels.long().clamp_min(0)
    width = int(lab[mask].max()) + 1 if bool(mask.any()) else 1
    rows = torch.arange(labels.shape[0], device=labels.device).unsqueeze(1).expand_as(lab)
    counts = torch.zeros(labels.shape[0] * width, dtype=torch.float64, device=labels.device)
    counts.index_add_(0, (rows * width + lab)[mask], torch.ones(int(mask.sum()), dtype=torch.float64,
                                                                  device=labels.device))
    n = mask.sum(dim=1).to(torch.float64)
    pairs = (n.pow(2) - counts.view(-1, width).pow(2).sum(dim=1)) / 2
    return pairs.sum().clamp_min(1)


class LambdaLoss(torch.autograd.Function):
    """``LambdaLoss.apply(scores, labels, mask, options)`` -> scalar loss.

    ``options`` is a dict of keyword arguments for :func:`rankkit.lambdas.lambda_gradients`
    plus ``reduction``. Labels, mask and options get no gradient.
    """

    @staticmethod
    def forward(ctx, scores, labels, mask, options):
        opts = dict(options)
        reduction = opts.pop("reduction", "query")
        grad, _, loss = lambda_gradients(scores.detach(), labels, mask=mask, return_loss=True, **opts)
        denom = _denominator(labels, mask, reduction).to(scores.dtype)
        ctx.save_for_backward(grad / denom)
        return loss.sum() / denom

    @staticmethod
    def backward(ctx, grad_output):
        (grad,) = ctx.saved_tensors
        return grad * grad_output, None, None, None


def lambda_loss(scores: torch.Tensor, labels: torch.Tensor, *, mask: torch.Tensor | None = None,
                weighting: str = "ranknet", sigma: float = 1.0, k: int | None = None,
                reduction: str = "query", **kernel_options) -> torch.Tensor:
    """Pairwise loss whose backward injects the kernel's lambdas.

    Args:
        scores: [Q, L] scores from a scorer (requires grad).
        labels: [Q, L] relevance labels.
        mask: [Q, L] bool, True on real documents (default: all True).
        weighting: ``"ranknet"`` (|ΔZ| = 1), ``"ndcg"``, ``"map"`` or ``"err"``.
        sigma: σ of the logistic.
        k: truncation level (see :func:`rankkit.lambdas.lambda_gradients`).
        reduction: ``"query"``, ``"pair"`` or ``"sum"`` (see module docstring).
        **kernel_options: passed to the kernel (``gain``, ``normalize``, ``weights``, ...).
    Returns:
        A scalar tensor.

    >>> s = torch.tensor([[0.0, 1.0]], requires_grad=True)
    >>> loss = lambda_loss(s, torch.tensor([[1.0, 0.0]]))
    >>> round(loss.item(), 4)  # log(1 + e^1)
    1.3133
    >>> loss.backward(); s.grad  # ∓ 1 / (1 + e^{-1})
    tensor([[-0.7311,  0.7311]])
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"`reduction` has to be one of {REDUCTIONS}, got {reduction!r}")
    if scores.ndim != 2 or labels.shape != scores.shape:
        raise ValueError(f"scores and labels must both be [Q, L], got {tuple(scores.shape)} and {tuple(labels.shape)}")
    if mask is None:
        mask = torch.ones_like(scores, dtype=torch.bool)
    options = dict(weighting=weighting, sigma=sigma, k=k, reduction=reduction, **kernel_options)
    return LambdaLoss.apply(scores, labels, mask, options)
