"""The lambda-injecting loss: a ``torch.autograd.Function`` around the shared objectives.

Any objective of :data:`rankkit.losses.OBJECTIVES` (the lambda kernel's pairwise weightings and
the listwise losses) gives the loss and its gradient; the booster uses the same functions.

Forward returns the (normalised) pairwise loss, Burges (2010) eq. for RankNet's cost
weighted by |ΔZ|:

    C = Σ_q Σ_{(i,j): y_i > y_j} |ΔZ_ij| log(1 + exp(−σ (s_i − s_j)))

so that users can log it. Backward does not differentiate that expression: it returns the
kernel's lambdas (``grad``), which for LambdaRank carry |ΔNDCG| (or |ΔMAP|, |ΔERR|) recomputed
from the current ranking -- the "lambda trick" of Burges et al. For ``weighting="ranknet"``
the two coincide, which the tests check against ``torch.autograd``; so they do for every
listwise loss (``loss="softmax"``, ``"xendcg"``, ``"listmle"``, ``"approx_ndcg"``), whose
closed-form gradients are those of the loss itself.

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

import inspect

import torch

from rankkit.infra import checks as _checks
from rankkit.losses import LISTWISE, OBJECTIVES

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

    ``options`` is a dict with ``objective`` (a name in :data:`rankkit.losses.OBJECTIVES`,
    default "ranknet", or a callable of that form: :class:`rankkit.custom.GradientObjective`),
    ``reduction``, and the objective's keyword arguments. Labels, mask and
    options get no gradient.
    """

    @staticmethod
    def forward(ctx, scores, labels, mask, options):
        opts = dict(options)
        reduction = opts.pop("reduction", "query")
        objective = opts.pop("objective", "ranknet")
        objective = OBJECTIVES[objective] if isinstance(objective, str) else objective  # or a closed-form callable
        grad, _, loss = objective(scores.detach(), labels, mask=mask, **opts)
        denom = _denominator(labels, mask, reduction).to(scores.dtype)
        ctx.save_for_backward(grad / denom)
        return loss.sum() / denom

    @staticmethod
    def backward(ctx, grad_output):
        (grad,) = ctx.saved_tensors
        return grad * grad_output, None, None, None


def lambda_loss(scores: torch.Tensor, labels: torch.Tensor, *, mask: torch.Tensor | None = None,
                weighting: str | None = None, loss: str | None = None, sigma: float = 1.0,
                k: int | None = None, reduction: str = "query", **options) -> torch.Tensor:
    """A ranking loss whose backward injects the objective's closed-form gradient.

    Args:
        scores: [Q, L] scores from a scorer (requires grad).
        labels: [Q, L] relevance labels.
        mask: [Q, L] bool, True on real documents (default: all True).
        weighting: a pairwise weighting of the lambda kernel, ``"ranknet"`` (|ΔZ| = 1, the
            default), ``"ndcg"``, ``"map"``, ``"err"`` or a LambdaLoss one; the same as
            ``loss=`` with that name.
        loss: any name in :data:`rankkit.losses.OBJECTIVES`: a pairwise weighting or a
            listwise loss (``"softmax"``, ``"xendcg"``, ``"listmle"``, ``"approx_ndcg"``).
            Give ``weighting`` or ``loss``, not both.
        sigma: σ of the logistic (pairwise objectives only).
        k: truncation level (the pairwise objectives, see
            :func:`rankkit.lambdas.lambda_gradients`, and NeuralNDCG's NDCG@k).
        reduction: ``"query"``, ``"pair"`` or ``"sum"`` (see module docstring).
        **options: passed to the objective (``gain``, ``normalize``, ``weights``, ``mu``,
            ``temperature``, ``generator``, ...).
    Returns:
        A scalar tensor.

    >>> s = torch.tensor([[0.0, 1.0]], requires_grad=True)
    >>> loss = lambda_loss(s, torch.tensor([[1.0, 0.0]]))
    >>> round(loss.item(), 4)  # log(1 + e^1)
    1.3133
    >>> loss.backward(); s.grad  # ∓ 1 / (1 + e^{-1})
    tensor([[-0.7311,  0.7311]])
    """
    _checks.check_choice(reduction, REDUCTIONS, "reduction")
    if weighting is not None and loss is not None:
        raise ValueError(f"give `weighting` or `loss`, not both (got {weighting!r} and {loss!r})")
    name = _checks.check_choice(loss if loss is not None else weighting or "ranknet",
                                OBJECTIVES, "loss" if loss is not None else "weighting")
    _checks.check_tensor(scores, "scores", ndim=2, kind="float")
    _checks.check_tensor(labels, "labels", shape=scores.shape)
    if mask is None:
        mask = torch.ones_like(scores, dtype=torch.bool)
    if name in LISTWISE:
        takes_k = "k" in inspect.signature(OBJECTIVES[name]).parameters  # NeuralNDCG's NDCG@k
        if sigma != 1.0 or (k is not None and not takes_k):
            raise ValueError(f"`sigma` and `k` apply to the pairwise objectives (and `k` to 'neural_ndcg'), "
                             f"not to {name!r}")
        if k is not None:
            options["k"] = k
    else:
        options = dict(sigma=sigma, k=k, **options)
    return LambdaLoss.apply(scores, labels, mask, dict(objective=name, reduction=reduction, **options))
