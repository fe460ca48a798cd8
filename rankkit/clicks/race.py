r"""The race of ``unbiased="auto"``: one successive-halving schedule for the trees and the neural rankers.

Debiasing a click log has several answers (naive training, Unbiased LambdaMART's learned biases,
an additive position bias, inverse propensities, the Dual Learning Algorithm), and which one
helps depends on the log. ``unbiased="auto"`` trains candidates side by side and keeps the one
whose scores best explain a validation click log (:class:`rankkit.clicks.metrics.ClickLikelihood`,
no true label read), by successive halving: every candidate trains the first stage, the best two
the second, the best one the rest.

* :class:`SuccessiveHalving` is the schedule both families share: it records scores, cuts
  after each stage and names the leader. :meth:`SuccessiveHalving.run` drives a race whose
  candidates advance on demand (the trees: :data:`TREE_CANDIDATES`, stages at
  :func:`race_rounds`).
* :class:`DebiasingRace` is the neural rankers' race (:data:`NEURAL_CANDIDATES`): Lightning
  drives the epochs, so the candidates train side by side on the same batches and the race is
  asked at each validation's end (stages at :func:`epoch_stage_ends`).

The two candidate lists differ where measurement said so (docs/benchmarks.md, "Learning from
clicks"): Unbiased LambdaMART at p = 1 for the trees and at p = 0 for the neural rankers, and DLA,
whose propensity model is trained by gradient with the ranker, for the neural rankers only. Both
families also race the mean of two runs' scores (:data:`TREE_BLENDS`, :data:`NEURAL_BLENDS`), which
costs nothing while its parts race anyway: a winning tree blend is one ensemble of both runs' trees,
a winning neural blend a :class:`rankkit.scorers.MeanEnsemble` of both networks.
"""
from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable, Iterable

import torch
from torch import nn

from rankkit.clicks.metrics import explained_clicks
from rankkit.data.dataset import PaddedBatch
from rankkit.infra import checks as _checks
from rankkit.lambdas.plan import shared_plan
from rankkit.scorers import MeanEnsemble, score_lists

__all__ = ["NEURAL_BLENDS", "NEURAL_CANDIDATES", "TREE_BLENDS", "TREE_CANDIDATES", "DebiasingRace", "SuccessiveHalving",
           "epoch_stage_ends", "race_rounds", "trainer_patience"]

#: ``LambdaMART(unbiased="auto")``'s candidates, as changes to the booster's config. Unbiased
#: LambdaMART at p = 0 is left out: below naive training at strong position bias
#: (docs/benchmarks.md, "Learning from clicks": 0.68 against naive's 0.70 at η = 2).
TREE_CANDIDATES = {"naive": {"unbiased": False}, "pairwise p=1": {"unbiased": True, "bias_p": 1.0},
                   "position": {"unbiased": "position"}, "ips": {"unbiased": "ips"}}
#: ``LambdaMART(unbiased="auto")``'s candidates that average the scores of two of
#: :data:`TREE_CANDIDATES`' runs (:func:`rankkit.boosting.ensemble.averaged`): they race on the
#: runs their parts grow anyway, and a winning blend grows both to their own early stops. The
#: additive position bias and the inverse propensities go wrong in different places: on the
#: unbiased grid's logs of three data sets their average was above each alone in 11 of 12 cells
#: and above LightGBM's ``position=`` in all 12 (docs/benchmarks.md, "Which click criterion picks
#: the race's winner").
TREE_BLENDS = {"position+ips": ("position", "ips")}
#: The neural rankers' candidates: (unbiased, bias_p) of each.
NEURAL_CANDIDATES = {"naive": (False, 1.0), "pairwise p=0": (True, 0.0), "position": ("position", 1.0),
                     "dla": ("dla", 1.0), "ips": ("ips", 1.0)}
#: The neural rankers' candidates that average the scores of two of :data:`NEURAL_CANDIDATES`'
#: networks: they race on networks that train anyway while their parts race, a network trains
#: while any live candidate needs it, and a winning blend serves as the
#: :class:`rankkit.scorers.MeanEnsemble` of both. Chosen on the unbiased grid's logs (MQ2008 and
#: synthetic, PBM η = 1 and 2, 15 runs a cell): the race's winner minus the five networks' race's,
#: test NDCG@10, was +0.0022, +0.0026, +0.0061, +0.0037 on the seeds that chose them and +0.0006,
#: +0.0007, +0.0037, +0.0031 on three more, for 8.2-9.0 network-epochs against 8
#: (docs/benchmarks.md, "Which blends the neural race holds").
NEURAL_BLENDS = {"pairwise p=0+ips": ("pairwise p=0", "ips"), "dla+ips": ("dla", "ips")}


def race_rounds(n_estimators: int, early_stopping_rounds: int | None) -> tuple[int, int]:
    """The rounds at which the trees' two stages end: a third and two thirds of
    ``n_estimators``, or, with early stopping after E rounds, a third and two thirds of E when
    fewer. The race then adds to its winner's own fit about 4E/3 rounds (the first stage's four
    runs and the second stage's runner-up; a little more where a blend and a run outside it meet
    in the second stage), while a naive early-stopped fit grows at least
    E + 1: the whole race stays within about 3x a naive fit where the winner alone trains about
    as long as naive (MQ2008, five folds, η = 1 and 2: the same winner as stages of E and 2E in
    8 of 10 logs, a better one in the other 2; docs/benchmarks.md, "what the race costs")."""
    first, second = n_estimators // 3, 2 * n_estimators // 3
    if early_stopping_rounds is not None:
        first = min(first, -(-early_stopping_rounds // 3))
        second = min(second, -(-2 * early_stopping_rounds // 3))
    return max(first, 1), max(second, 1)


def epoch_stage_ends(epochs: int, patience: int | None = None) -> tuple[int, int]:
    """The epochs (1-based counts) after which the neural rankers' two stages end: a third and
    two thirds of ``epochs``, rounded up (both may end at once), or with early stopping after
    ``patience`` epochs without improvement, a third and two thirds of the patience when fewer,
    as the trees' :func:`race_rounds`: the first stage trains five networks for P/3 epochs and the
    second at most four for P/3 more, so the race adds about 4P/3 to 7P/3 network-epochs to its
    winner's own, where a fit that stops early would otherwise race every network to its stop
    (docs/benchmarks.md, "what the neural race costs")."""
    epochs = _checks.check_int(epochs, "epochs", low=1)
    patience = _checks.check_int(patience, "patience", low=1, none=True)
    first, second = math.ceil(epochs / 3), math.ceil(2 * epochs / 3)
    if patience is not None:
        first = min(first, math.ceil(patience / 3))
        second = min(second, math.ceil(2 * patience / 3))
    return max(first, 1), max(second, 1)


def trainer_patience(trainer) -> int | None:
    """The fewest epochs without improvement after which a Lightning ``trainer``'s early
    stopping callbacks stop the fit, or None without one. A callback checked at each training
    epoch's end counts epochs; one checked after validation counts validations, one every
    ``check_val_every_n_epoch`` epochs, or once every ``val_check_batch`` of the epoch's
    ``num_training_batches`` (Lightning's reading of ``val_check_interval``; before the fit, ``1 /
    val_check_interval`` an epoch for a fraction)."""
    out = []
    for callback in getattr(trainer, "early_stopping_callbacks", None) or []:
        patience = int(callback.patience)
        if not getattr(callback, "_check_on_train_epoch_end", False):
            every = getattr(trainer, "check_val_every_n_epoch", None) or 1
            interval = getattr(trainer, "val_check_interval", 1.0)
            batches = getattr(trainer, "num_training_batches", math.inf)
            check = getattr(trainer, "val_check_batch", None)  # batches between validations, once fitting
            if isinstance(check, (int, float)) and math.isfinite(check) and check >= 1 and math.isfinite(batches):
                per_epoch = max(1, int(batches) // int(check))
            elif isinstance(interval, float) and 0 < interval < 1:  # before the fit: as the fraction says
                per_epoch = 1 / interval
            else:
                per_epoch = 1
            patience = max(1, math.ceil(patience * every / per_epoch))
        out.append(patience)
    return min(out) if out else None


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_ranks(local: torch.Tensor) -> torch.Tensor:
    """``local`` [R, n] (this rank's n columns) joined along its columns with every rank's, in
    rank order, the same on every rank; ``local`` itself outside torch.distributed or with one
    process. On the host; NCCL's collectives go through the current GPU."""
    import torch.distributed as dist

    if not _distributed():
        return local
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    count = torch.tensor([local.shape[1]], device=device)
    counts = [torch.empty_like(count) for _ in range(dist.get_world_size())]
    dist.all_gather(counts, count)
    widths = [int(c) for c in torch.cat(counts).cpu()]
    padded = torch.zeros(local.shape[0], max(widths), dtype=local.dtype, device=device)
    padded[:, :local.shape[1]] = local.to(device)
    parts = [torch.empty_like(padded) for _ in widths]
    dist.all_gather(parts, padded)
    return torch.cat([part[:, :width] for part, width in zip(parts, widths)], 1).cpu()


class SuccessiveHalving:
    """The race of ``unbiased="auto"``, one for the trees and the neural rankers: named candidates
    are scored on a validation click log (:class:`rankkit.clicks.metrics.ClickLikelihood`), and
    at the end of each stage only the best ``keep[stage]`` go on (by default the best two after
    the first stage, the best one after the second); the winner is the best of the last stage.
    Equal scores keep the order the candidates had (the order given, then the last ranking).

    The family decides what a stage is and what it costs: ``LambdaMART`` grows every live
    candidate to the stage's rounds (:meth:`run`, :func:`race_rounds`), the neural rankers train
    them side by side for a third of the epochs (:class:`DebiasingRace`).

    Args:
        names: the candidates, in the order that breaks ties.
        keep: how many go on after each stage (non-increasing, the last 1).
        blends: ``{name: (part, part)}``, more candidates after ``names``, each scored on the
            runs of two of them (:data:`TREE_BLENDS`, :data:`NEURAL_BLENDS`): :meth:`parts` names
            a candidate's runs, :meth:`needed` the runs the live candidates need.

    Attributes:
        alive: the candidates still racing, best first after :meth:`rank`.
        scores_: ``{name: {"score": float, "stage": int, ...}}``, each candidate's last score, the
            1-based stage it was scored in (0 where a state saved before 2026-11-28 did not say)
            and what :meth:`record` was told beside it.
        stage: the stages ended so far.
        choice_: the leader after the last :meth:`rank` (the winner once every stage ended).

    >>> race = SuccessiveHalving(["a", "b", "c"])
    >>> for name, value in (("a", 0.1), ("b", 0.3), ("c", 0.2)):
    ...     race.record(name, value)
    >>> race.rank(stage_over=True), race.alive
    ('b', ['b', 'c'])
    """

    def __init__(self, names, keep: tuple[int, ...] = (2, 1), blends: dict | None = None):
        self.blends = {name: tuple(parts) for name, parts in (blends or {}).items()}
        self.alive = [*names, *self.blends]
        self.keep = tuple(keep)
        self.scores_: dict[str, dict] = {}
        self.stage = 0
        self.choice_: str | None = None

    def parts(self, name: str) -> tuple[str, ...]:
        """The runs whose mean scores candidate ``name``: its own, or a blend's two."""
        return self.blends.get(name, (name,))

    def needed(self) -> set[str]:
        """The runs the live candidates need: theirs, and both of a live blend's."""
        return {part for name in self.alive for part in self.parts(name)}

    @property
    def over(self) -> bool:
        """True once every stage ended (one candidate is left)."""
        return self.stage >= len(self.keep)

    def record(self, name: str, score: float, **info) -> None:
        """Candidate ``name``'s ``score`` (higher is better) in the current stage, with ``info``."""
        self.scores_[name] = {"score": float(score), "stage": min(self.stage, len(self.keep) - 1) + 1, **info}

    def rank(self, *, stage_over: bool) -> str:
        """Order the live candidates by their last scores and, when ``stage_over``, keep the
        stage's best; returns the leader (``choice_``)."""
        self.alive = sorted(self.alive, key=lambda name: -self.scores_[name]["score"])
        if stage_over and not self.over:
            self.alive = self.alive[:self.keep[self.stage]]
            self.stage += 1
        self.choice_ = self.alive[0]
        return self.choice_

    def state(self) -> dict:
        return {"alive": list(self.alive), "scores": {k: dict(v) for k, v in self.scores_.items()},
                "stage": self.stage, "choice": self.choice_}

    def load_state(self, state: dict) -> None:
        self.alive = list(state["alive"])
        self.scores_ = {k: dict(v) if isinstance(v, dict) else {"score": float(v), "stage": 0}
                        for k, v in state["scores"].items()}  # before 2026-11-28: plain scores
        self.stage = int(state.get("stage", sum(len(self.alive) <= k for k in self.keep)))
        self.choice_ = state["choice"]

    def run(self, stage_ends: Iterable[int], advance: Callable[[str, int], None],
            score: Callable[[str], tuple[float, dict]],
            report: Callable[[int, int, list[str]], None] | None = None) -> str:
        """Drive every stage at once where the candidates advance on demand: at each end ``e`` of
        ``stage_ends``, ``advance(name, e)`` each live candidate, record its ``score(name)``
        (the score and what to keep beside it), and cut; ``report(stage, e, ranked)`` hears each
        stage's outcome with the candidates best first (before the cut). Returns the winner."""
        for end in stage_ends:
            for name in self.alive:
                advance(name, end)
                value, info = score(name)
                self.record(name, value, **info)
            ranked = sorted(self.alive, key=lambda name: -self.scores_[name]["score"])
            self.rank(stage_over=True)
            if report is not None:
                report(self.stage, end, ranked)
        return self.rank(stage_over=False)


class DebiasingRace(nn.Module):
    """The candidates of ``unbiased="auto"`` and their race (see the module).

    Args:
        candidates: ``{name: NeuralRanker}``, each with its own scorer and ``unbiased`` setting;
            only their :meth:`objective`, ``scorer`` and parameter groups are used.
        n_positions: the position offsets of the validation criterion.
        blends: ``{name: (part, part)}``, candidates scored by the mean of two networks' scores
            (:data:`NEURAL_BLENDS`); those whose parts are not both in ``candidates`` are left out.

    Attributes:
        schedule: the race's successive halving (:class:`SuccessiveHalving`,
            the trees' too); alive: the candidates still racing (networks and blends); runs: the
            networks still training, those alive and the parts of a live blend; scores_: ``{name:
            explained clicks}`` at the last epoch each was validated; choice_: the leader after the
            last validation (the winner once the race is over); leader_batches_: its (scores,
            labels, mask) of each batch of that validation.
    """

    def __init__(self, candidates: dict, n_positions: int, blends: dict | None = None):
        super().__init__()
        self.candidates = nn.ModuleDict(candidates)
        self.n_positions = n_positions
        self.schedule = SuccessiveHalving(candidates, blends=self._playable(blends or {}))
        self.leader_batches_: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.discard()

    @property
    def alive(self) -> list[str]:
        return self.schedule.alive

    def _playable(self, blends: dict) -> dict:
        """The blends whose two networks are both candidates."""
        return {name: parts for name, parts in blends.items() if all(part in self.candidates for part in parts)}

    @property
    def blends(self) -> dict[str, tuple[str, ...]]:
        return self.schedule.blends

    @property
    def runs(self) -> list[str]:
        """The networks that still train: each live candidate's, a blend's two."""
        needed = self.schedule.needed()
        return [name for name in self.candidates if name in needed]

    def parts(self, name: str) -> tuple[str, ...]:
        """The networks whose mean scores candidate ``name``: its own, or a blend's two."""
        return self.schedule.parts(name)

    @property
    def scores_(self) -> dict[str, float]:
        return {name: entry["score"] for name, entry in self.schedule.scores_.items()}

    @property
    def choice_(self) -> str | None:
        return self.schedule.choice_

    def discard(self) -> None:
        """Forget the validation batches collected so far (e.g. Lightning's sanity check)."""
        self._scores: dict[str, list[torch.Tensor]] = {name: [] for name in self.runs}
        self._batches: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def _leave(self, name: str) -> None:
        """Candidate network ``name`` and the blends holding it leave the race."""
        gone = {name} | {blend for blend, parts in self.blends.items() if name in parts}
        self.schedule.alive = [other for other in self.schedule.alive if other not in gone]
        self._scores.pop(name, None)

    def loss(self, batch: PaddedBatch) -> torch.Tensor:
        """The sum of the training losses of the networks that still train on ``batch`` (their
        parameters are disjoint, so each gets its own gradient). Without the training log read
        (:meth:`rankkit.neural.module.NeuralRanker.read_click_log`), the ``"ips"`` candidate,
        which needs it, leaves the race with its blends, with one warning."""
        ips = self.candidates["ips"].debiasing if "ips" in self.candidates else None
        if ips is not None and not ips.estimated and "ips" in self.runs:
            warnings.warn("`unbiased='auto'` races without its 'ips' candidate: it estimates propensities on the "
                          "whole training log, which was not read (train with a datamodule that has a `train_set`, "
                          "or call `module.read_click_log(train_set)` before a plain loop)", stacklevel=2)
            self._leave("ips")
        runs = self.runs
        batch = self._mapped(batch)  # positions through the ids once, for every candidate
        with shared_plan(batch.labels, batch.mask):  # the labels validated and planned once for all
            loss = sum(self.candidates[name].objective(score_lists(self.candidates[name].scorer, batch.features,
                                                                   batch.mask), batch) for name in runs)
        if _distributed():  # DDP reduces every parameter's gradient: the dropped networks' are zero
            loss = loss + sum(p.reshape(-1)[:0].sum() for name, child in self.candidates.items() if name not in runs
                              for p in child.parameters() if p.requires_grad)  # (an empty sum: finite whatever p holds)
        return loss

    def _mapped(self, batch: PaddedBatch) -> PaddedBatch:
        """``batch`` with its positions through the training log's ids (which every candidate that
        debiases read alike; :meth:`rankkit.clicks.debiasing.Debiasing.dense`): a plain loop's
        batch once, not once per candidate."""
        reader = next((c.debiasing for c in self.candidates.values() if c.debiasing.position_ids is not None), None)
        return batch if reader is None else reader.dense(batch)

    def parameter_groups(self) -> list[dict]:
        return [group for child in self.candidates.values() for group in child.parameter_groups()]

    @torch.no_grad()
    def collect(self, batch: PaddedBatch) -> None:
        """Keep the training networks' scores (in eval mode) of a validation batch of a click
        log, on the batch's device (copied to the host once, by :meth:`end_epoch`)."""
        if batch.position is None:
            raise ValueError("`unbiased='auto'` chooses on a validation click log: the validation batch has no "
                             "`position` (validate on a click log's sessions, e.g. ClickLog.sessions)")
        for name in self.runs:
            scorer = self.candidates[name].scorer
            was = scorer.training
            scorer.eval()  # scored as they will serve (no dropout), whoever calls
            self._scores.setdefault(name, []).append(score_lists(scorer, batch.features, batch.mask))
            scorer.train(was)
        self._batches.append((batch.labels, batch.mask, batch.position))

    def _batch_scores(self, name: str) -> list[torch.Tensor]:
        """Candidate ``name``'s scores of each collected batch: its network's, or a blend's mean."""
        parts = [self._scores[part] for part in self.parts(name)]
        if len(parts) == 1:
            return parts[0]
        return [torch.stack(batch).mean(0) for batch in zip(*parts)]

    def end_epoch(self, epoch: int, epochs: int, patience: int | None = None) -> str:
        """Score the live candidates on the collected validation log, drop the losers of this
        epoch's stage (0-based ``epoch`` of ``epochs``; stages end at :func:`epoch_stage_ends`,
        earlier with early stopping after ``patience`` epochs) and return the leader; its batches'
        (scores, labels, mask) stay in ``leader_batches_`` for the usual validation metrics."""
        ends = epoch_stage_ends(epochs, patience)  # the settings checked before anything is scored
        # Under torch.distributed each rank holds its shard of the validation log (a rank may hold
        # none): every rank scores the whole log (the shards in rank order), so that all choose the
        # same leader, and all refuse together when no rank saw a batch.
        seen = int(all_ranks(torch.tensor([[len(self._batches)]])).sum())
        if not seen:
            raise ValueError("`unbiased='auto'`: no validation batch was seen this epoch; pass a validation "
                             "click log")
        masks = [mask.cpu() for _, mask, _ in self._batches]

        def joined(parts: list[torch.Tensor]) -> torch.Tensor:  # float64 (the criterion's), empty without batches
            return torch.cat(parts).double() if parts else torch.zeros(0, dtype=torch.float64)

        clicks = joined([labels.cpu()[mask] for (labels, _, _), mask in zip(self._batches, masks)])
        bucket = joined([position.cpu()[mask] for (_, _, position), mask in zip(self._batches, masks)])
        per_session = joined([mask.sum(1) for mask in masks])
        rows = torch.stack([joined([scores.cpu()[mask] for scores, mask in zip(self._batch_scores(name), masks)])
                            for name in self.alive])
        clicks, bucket = all_ranks(torch.stack([clicks, bucket]))
        rows, per_session = all_ranks(rows), all_ranks(per_session[None])[0].long()
        session = torch.repeat_interleave(torch.arange(len(per_session)), per_session)
        for name, row in zip(self.alive, rows):
            self.schedule.record(name, explained_clicks(row, clicks, session,
                                                        bucket.long().clamp(0, self.n_positions - 1), self.n_positions),
                                 epoch=epoch)
        self.schedule.rank(stage_over=False)
        while not self.schedule.over and epoch + 1 >= ends[self.schedule.stage]:
            self.schedule.rank(stage_over=True)
        choice = self.schedule.choice_
        self.leader_batches_ = [(scores, labels, mask) for scores, (labels, mask, _)
                                in zip(self._batch_scores(choice), self._batches)]
        self.discard()
        return choice

    def state(self) -> dict:
        """The schedule's standing and each training network's click-bias state (its estimator's
        biases, or the propensities ``"ips"`` read from the training log)."""
        debiasing = {name: self.candidates[name].debiasing.state() for name in self.runs}
        return {**self.schedule.state(), "debiasing": {k: v for k, v in debiasing.items() if v is not None}}

    def load_state(self, state: dict) -> None:
        self.schedule.load_state(state)
        for name, entry in state.get("debiasing", {}).items():
            if name in self.candidates:
                self.candidates[name].debiasing.load_state(entry)
        self.discard()

    def keep_saved(self, state_dict: dict) -> None:
        """Drop the candidates a checkpoint's ``state_dict`` has no weights of, and the blends of
        those: a race saved before a candidate joined :data:`NEURAL_CANDIDATES` (``"ips"``,
        2026-11-28) loads as the race it was."""
        missing = [name for name in self.candidates
                   if not any(key.startswith(f"race.candidates.{name}.") for key in state_dict)]
        if missing and len(missing) < len(self.candidates):
            for name in missing:
                del self.candidates[name]
                self._leave(name)
            self.schedule.blends = self._playable(self.blends)

    @classmethod
    def of(cls, module, scorer: nn.Module, n_positions: int) -> "DebiasingRace":
        """``unbiased="auto"``'s candidates for ``module``: copies of it, one per debiasing of
        :data:`NEURAL_CANDIDATES`, with the same settings and a copy of ``scorer`` each, and the
        blends of :data:`NEURAL_BLENDS`."""
        h = module.hparams
        same = {name: h[name] for name in (
            "hidden", "activation", "dropout", "norm", "log1p", "standardize", "weighting", "k", "sigma",
            "normalize", "reduction", "optimizer", "lr", "weight_decay", "scheduler", "loss", "n_positions",
            "propensity_clip", "position_lr", "loss_options")}
        return cls({name: type(module)(module.n_features, scorer=copy.deepcopy(scorer), unbiased=mode, bias_p=p,
                                       **same)
                    for name, (mode, p) in NEURAL_CANDIDATES.items()}, n_positions, NEURAL_BLENDS)

    def validate(self, module, batches, epoch: int, epochs: int, patience: int | None = None) -> str:
        """In a plain PyTorch loop: score the candidates on validation click-log ``batches`` after
        0-based ``epoch`` of ``epochs`` (the loop stopping early after ``patience`` epochs
        without improvement, if it does), drop the stage's losers, copy the leader into
        ``module.scorer`` and return its name."""
        for batch in batches:  # positions through the training log's ids, as Trainer.fit's hook maps them
            self.collect(self._mapped(batch))
        return self._lead(module, self.end_epoch(epoch, epochs, patience))

    def leader_scorer(self, name: str) -> nn.Module:
        """A new scorer of candidate ``name``'s shape: a copy of its network, or for a blend the
        :class:`rankkit.scorers.MeanEnsemble` of copies of its two."""
        copies = [copy.deepcopy(self.candidates[part].scorer) for part in self.parts(name)]
        return copies[0] if len(copies) == 1 else MeanEnsemble(copies)

    def shape_scorer(self, module, name: str | None = None) -> nn.Module | None:
        """Give ``module.scorer`` the shape of candidate ``name``'s scorer (the leader's by
        default): a blend's :class:`rankkit.scorers.MeanEnsemble`, or one network after a blend
        led, so that a checkpoint's weights load into it. ``module.scorer`` may then be a new
        object (a scorer passed to the module's constructor no longer follows it: read
        ``module.scorer``). Returns that candidate's scorer (a new copy), or None before any
        validation."""
        name = self.choice_ if name is None else name
        if name is None:
            return None
        leader = self.leader_scorer(name).requires_grad_(False)  # a copy to serve; the candidates train
        if module.scorer.state_dict().keys() != leader.state_dict().keys():
            module.scorer = leader
        return leader

    def _lead(self, module, name: str) -> str:
        """Put candidate ``name``'s weights in ``module.scorer`` (for a blend, its two networks
        averaged); return the name."""
        leader = self.shape_scorer(module, name)
        if leader is not None and module.scorer is not leader:
            module.scorer.load_state_dict(leader.state_dict())
        return name

    def end_validation(self, module) -> None:
        """At a Lightning validation epoch's end: decide the stage (ended earlier where an
        EarlyStopping callback would stop the fit sooner, :func:`trainer_patience`), copy the
        leader into ``module.scorer`` and log the leader's validation metrics and explained clicks."""
        trainer = module.trainer
        if trainer.sanity_checking:
            self.discard()
            return
        if trainer.max_epochs is None or trainer.max_epochs < 1:
            raise ValueError("`unbiased='auto'` schedules its race over the epochs: give the Trainer max_epochs")
        leader = self._lead(module, self.end_epoch(module.current_epoch, trainer.max_epochs,
                                                   trainer_patience(trainer)))
        for scores, labels, mask in self.leader_batches_:
            module.val_metrics.update(scores, labels, mask)
        for name, metric in module.val_metrics.items():
            module.log(name, metric.compute(), prog_bar=name.endswith("/ndcg@10"))
        module.val_metrics.reset()
        module.log("val/explained_clicks", self.scores_[leader], prog_bar=True)
