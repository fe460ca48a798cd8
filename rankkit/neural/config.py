"""The neural rankers' hyper-parameters, declared once: default, range and docstring.

:class:`NeuralConfig` is the declaration. :class:`rankkit.neural.NeuralRanker`, ``RankNet`` and
``LambdaRank`` (which differ in the default ``weighting`` and the weightings they accept), the
``rankkit fit`` command line (LightningCLI reads their signatures and docstrings) and the packaged
configs (checked against it by the tests) derive from it; see :mod:`rankkit.infra.params`. Ranges
that depend on another option (``weighting`` on the class, ``loss_options`` on the objective, the
click options on ``unbiased``) are checked by the module.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

import torch
from torch import nn

from rankkit.clicks.propensity import check_clip
from rankkit.infra import checks as _checks
from rankkit.infra.params import hyperparameter
from rankkit.neural.loss import REDUCTIONS
from rankkit.scorers import ENCODINGS

OPTIMIZERS = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}
SCHEDULERS = ("none", "cosine", "plateau", "warmup_cosine")
ARCHITECTURES = ("mlp", "transformer")


if TYPE_CHECKING:  # Python callers pass a custom loss itself, which a type checker should accept ...
    Objective = str | Callable[..., Any] | None
else:  # ... while the command line (LightningCLI reads the annotation) takes text only, imported to train
    Objective = Optional[str]


def _choice(choices):
    return lambda value, name: _checks.check_choice(value, choices, name)


def _number(**bounds):
    return lambda value, name: _checks.check_number(value, name, **bounds)


def _optional(check):
    return lambda value, name: None if value is None else check(value, name)


#: The built-in lambda kernel's options: a custom loss takes its own, and refuses these.
KERNEL_OPTIONS = ("k", "sigma", "normalize")


@dataclass(frozen=True)
class NeuralConfig:
    """Every hyper-parameter of a neural ranker (the declaration the modules derive from)."""

    n_features: int | None = hyperparameter(None, """
        F, for the default scorer (linked from the datamodule by ``rankkit fit``); ignored when
        ``scorer`` is given.""")
    hidden: list[int] = hyperparameter([128, 64], """
        the default scorer's hidden widths (the MLP's layers; the transformer's per-document
        tower).""")
    activation: str = hyperparameter("relu", "the default scorer's activation (``relu``, ``gelu``, ``tanh``, "
                                             "``silu``, ``elu``).")
    dropout: float = hyperparameter(0.1, "the default scorer's dropout after each hidden layer.")
    norm: str = hyperparameter("none", "the MLP's ``\"layer\"`` normalisation after each hidden layer, or "
                                       "``\"none\"``.")
    log1p: bool = hyperparameter(True, """
        the default scorer's feature preprocessing: sign(x) log(1 + |x|) on heavy-tailed features
        (:class:`~rankkit.scorers.FeaturePreprocessor`; the ``"standard"`` encoding only).""")
    standardize: bool = hyperparameter(True, "the preprocessing's per-feature standardisation, fitted on the "
                                             "training documents (the ``\"standard\"`` encoding only).")
    encoding: str = hyperparameter("standard", """
        the default scorer's input stage: ``"standard"`` (``log1p`` and ``standardize``) or
        ``"piecewise"``: each feature coded by its place among ``bins`` quantiles of the training
        documents, then a per-feature linear map to 8 values (the PLE-Q embedding of Gorishniy,
        Rubachev, Babenko, NeurIPS 2022; :class:`~rankkit.scorers.PiecewiseLinearEncoder`), fitted
        when training starts and exported with the scorer.""", check=_choice(ENCODINGS))
    bins: int = hyperparameter(16, "the ``\"piecewise\"`` encoding's quantile bins a feature.",
                               check=lambda value, name: _checks.check_int(value, name, low=2))
    weighting: str = hyperparameter("ranknet", """
        |ΔZ| of the lambda loss: ``"ranknet"`` (RankNet), ``"ndcg"``, ``"map"`` or ``"err"``
        (LambdaRank).""")
    k: int | None = hyperparameter(None, """
        truncation level of the kernel (None: all pairs). A listwise loss's own truncation
        (NeuralNDCG's ``k``) goes in ``loss_options``.""", check=_checks.check_k)
    sigma: float = hyperparameter(1.0, "σ of the logistic.", check=_number(low=0, low_open=True))
    normalize: bool = hyperparameter(False, "LightGBM's per-query lambda normalisation.")
    reduction: str = hyperparameter("query", "loss normalisation, see :mod:`rankkit.neural.loss`.",
                                    check=_choice(REDUCTIONS))
    optimizer: str = hyperparameter("adam", "``\"adam\"``, ``\"adamw\"`` or ``\"sgd\"``.",
                                    check=_choice(sorted(OPTIMIZERS)))
    lr: float = hyperparameter(1e-3, "the optimizer's learning rate.", check=_number(low=0, low_open=True))
    weight_decay: float = hyperparameter(0.0, "the optimizer's weight decay.", check=_number(low=0))
    scheduler: str = hyperparameter("none", """
        ``"none"``, ``"cosine"`` (over ``max_epochs``), ``"plateau"`` (halve the lr when val
        NDCG@10 stalls) or ``"warmup_cosine"`` (per optimizer step: a linear warm-up over the
        first 5 % of the fit's steps, then a cosine decay to 0 at the last, as transformer
        rankers are trained; Lightning's ``estimated_stepping_batches``).""", check=_choice(SCHEDULERS))
    ema_decay: float = hyperparameter(0.0, """
        d > 0 keeps an exponential moving average of the scorer's weights, θ̄ ← d θ̄ + (1 − d) θ
        after every training batch (Polyak averaging, torch's ``AveragedModel`` with
        ``get_ema_multi_avg_fn``), in ``averaged``; validation, test, predict, ``forward`` and
        export then use the average. 0 (the default) turns it off.""",
        check=_number(low=0, high=1, high_open=True))
    scorer: nn.Module | None = hyperparameter(None, """
        any scorer ``nn.Module`` (a ``class_path`` in YAML): pointwise, features [..., F] ->
        scores [...], or list-aware, ``list_aware = True`` and (features [Q, L, F], mask [Q, L])
        -> scores [Q, L] (see :mod:`rankkit.scorers`). Feature preprocessing belongs inside it
        (it is exported with it); a :class:`~rankkit.scorers.FeaturePreprocessor` in it that is
        not yet fitted is fitted on the training DataLoader's documents when training starts.
        None builds the ``architecture``'s scorer from ``n_features`` and the options above.""")
    objective: Objective = hyperparameter(None, """
        the training objective, as ``LambdaMART(objective=...)`` names it: see ``loss``, its old
        spelling, for what it takes. None: the lambda kernel with ``weighting``.""")
    loss: Objective = hyperparameter(None, """
        the old spelling of ``objective`` (warns once; giving both, different, is refused):
        any objective of :data:`rankkit.losses.OBJECTIVES` by name, e.g. a LambdaLoss weighting
        (``"ndcg_loss2pp"``) or a listwise loss (``"softmax"``, ``"xendcg"``, ``"listmle"``,
        ``"approx_ndcg"``); it replaces ``weighting`` (``sigma``, ``k`` and ``normalize`` apply to
        the pairwise ones). The same names train LambdaMART (``LambdaMART(objective=...)``). Or
        a custom loss (:mod:`rankkit.custom`): a differentiable ``loss(scores, labels, mask) ->
        [Q]`` (a callable, or in a config ``package.module.function``, imported when training
        starts), trained by plain autograd and normalised by ``reduction``; the same callable
        trains LambdaMART. Checkpoints record its qualified name as text.""")
    unbiased: bool | str = hyperparameter(False, """
        learn from clicks: the labels are 0/1 clicks and every training batch carries the
        documents' displayed ``position`` (a dataset with ``position``, e.g.
        ``ClickLog.sessions``). True: Unbiased LambdaRank / RankNet (the pairwise debiasing of
        Hu, Wang, Peng, Li, "Unbiased LambdaMART", WWW 2019, as ``LambdaMART(unbiased=True)``):
        each training batch first updates the click/unclick biases t⁺, t⁻
        (:class:`rankkit.clicks.propensity.PropensityEstimator`) from its detached scores (one
        closed-form step on the decayed sum of the recent batches' pair costs), then weighs each
        pair (clicked i, unclicked j) by 1 / (t⁺(pos_i) t⁻(pos_j)); needs a pairwise objective;
        the biases are :attr:`propensities` and are checkpointed. ``"position"``: an additive
        per-position bias of the training scores learned with the scorer
        (:class:`rankkit.clicks.debiasing.PositionBias`, LightGBM's ``position=``; left out of
        evaluation and export). ``"dla"``: the Dual Learning Algorithm (Ai, Bi, Luo, Guo,
        Croft, "Unbiased Learning to Rank with Unbiased Propensity Estimation", SIGIR 2018;
        :class:`rankkit.clicks.debiasing.DualLearning`). ``"ips"``: inverse propensity weighting
        as ``LambdaMART(unbiased="ips")``: examination probabilities θ̂ by regression-EM on the
        whole training log at the fit's start (:func:`rankkit.clicks.propensity.ips_propensities`),
        then fixed; the pair (clicked i, unclicked j) weighs min(θ̂₀/θ̂(pos_i),
        ``propensity_clip``); needs a pairwise objective. ``"auto"``: naive, True at p = 0,
        ``"position"``, ``"dla"`` and ``"ips"`` trained side by side inside one fit, with the means of two
        of their scores (``"pairwise p=0+ips"``, ``"dla+ips"``: :data:`rankkit.clicks.race.NEURAL_BLENDS`,
        served as a :class:`rankkit.scorers.MeanEnsemble` if one wins), the one whose scores best
        explain the **validation click log** kept by successive halving over the epochs (stages at
        thirds of ``max_epochs``, or of an EarlyStopping callback's patience when sooner;
        :class:`rankkit.clicks.race.DebiasingRace`); ``unbiased_choice_`` names it, and the module's
        own scorer (a ``scorer`` given included) only serves the leader's weights: it is frozen, the
        candidates' copies train. Needs ``max_epochs``.""")
    bias_p: float = hyperparameter(1.0, "p ≥ 0, the biases' regularisation norm (the update's exponent is "
                                        "1/(p + 1)).")
    n_positions: int = hyperparameter(10, "positions with their own bias; deeper positions share the last.")
    propensity_clip: Union[float, str, None] = hyperparameter(10.0, """
        the bound on θ̂₀/θ̂ of ``unbiased="ips"`` (≥ 1; None: none); ``"auto"``: 3 √r, r the largest
        θ̂₀/θ̂ at a clicked position of the training log (:func:`rankkit.clicks.propensity.auto_clip`, LambdaMART's
        default; on the click grid's η = 1 and 2 logs it moved LambdaRank by −0.006 to +0.002,
        docs/benchmarks.md "the ips clip", so 10 stays the default here).""", check=check_clip)
    position_lr: Optional[float] = hyperparameter(1e-2, """
        the learning rate of the position models that train with the scorer (``unbiased="position"``'s
        biases, ``"dla"``'s examination logits; no weight decay; None: ``lr``). Their few
        parameters have to move by log-ratios of several units within a few epochs, which the
        scorer's 1e-3 does not allow: on the click grid's logs (3 epochs) DLA at 1e-3 stayed
        near naive training (docs/research.md, "Round 6").""", check=_optional(_number(low=0, low_open=True)))
    architecture: str = hyperparameter("mlp", """
        the default scorer: ``"mlp"`` (:class:`~rankkit.scorers.MLPScorer` from ``hidden``,
        ``activation``, ``dropout``, ``norm``, ``log1p``, ``standardize``) or ``"transformer"``
        (:class:`~rankkit.scorers.TransformerScorer`: the per-document tower ``hidden``,
        ``layers`` self-attention blocks of ``heads`` heads over the query's documents, the
        DASALC ``latent_cross``).""", check=_choice(ARCHITECTURES))
    heads: int = hyperparameter(4, "the transformer's attention heads.")
    layers: int = hyperparameter(2, "the transformer's self-attention blocks.")
    latent_cross: bool = hyperparameter(True, "the transformer's DASALC latent cross (Qin et al., ICLR 2021).")
    noise: float = hyperparameter(0.0, """
        σ ≥ 0 of the Gaussian noise added to the preprocessed features in training (DASALC's data
        augmentation; Qin, Yan, Zhuang, Tay, Pasumarthi, Wang, Bendersky, Najork, "Are Neural
        Rankers still Outperformed by Gradient Boosted Decision Trees?", ICLR 2021): set on every
        :class:`~rankkit.scorers.FeaturePreprocessor` in the scorer (an error when it has none).
        Evaluation and export never add it.""", check=_number(low=0))
    loss_options: dict[str, Any] | None = hyperparameter(None, """
        keyword options of the objective (``loss``, or the ``weighting``'s lambda kernel), as a
        dict of plain values, e.g. ``{"temperature": 0.5, "k": 10}`` for ``loss="neural_ndcg"``,
        ``{"gain": "linear"}``, ``{"mu": 10.0}`` for ``"ndcg_loss2pp"``. Each key has to be a
        keyword argument of that objective in :mod:`rankkit.losses` (``LOSS_OPTIONS_RESERVED``
        excepted: the batch and the module's own ``sigma``, ``k``, ``normalize``), else a
        ValueError names the key and the options the objective takes; the values are checked by
        calling the objective once on a two-document query. Saved in the hyper-parameters and
        checkpoints.""")
