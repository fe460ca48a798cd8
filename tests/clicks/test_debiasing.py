"""What each ``unbiased`` setting does to training (rankkit.clicks.debiasing), for the neural rankers
(``"position"``, ``"dla"``, ``"ips"`` and their ``"auto"`` race) and for LambdaMART (``"position"``,
``"ips"``, position ids), each against a slow path written here: the lambda kernel at shifted
scores, a float64 loop of the Dual Learning losses and of the position-bias step, the click
criterion recomputed, regression-EM on the aggregated log."""
from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from rankkit.boosting import LambdaMART
from rankkit.boosting.engine import BoosterConfig, BoostingEngine
from rankkit.clicks.metrics import ClickLikelihood
from rankkit.clicks.propensity import FixedPropensities, RegressionEM, ips_propensities
from rankkit.data import make_synthetic
from rankkit.data.clicks import PositionBasedModel, simulate_clicks
from rankkit.data.dataset import PaddedBatch
from rankkit.training.datamodule import RankingDataModule
from rankkit.lambdas import lambda_gradients
from rankkit.neural import LambdaRank
from rankkit.examples.losses import squared_pairwise_hinge
from rankkit.clicks.debiasing import (DualLearning, PositionBias, checkpoint_entries, make_debiasing,
                                      restore_entries)
from rankkit.clicks.race import NEURAL_BLENDS, NEURAL_CANDIDATES
from rankkit.objective import objective_spec

P = 6


@pytest.fixture(scope="module")
def logs():
    """(source, training log, validation log): PBM η = 1 clicks on lists shown in random order."""
    data = make_synthetic(80, (4, 12), 5, seed=0)
    scores = torch.rand(data.n_docs, generator=torch.Generator().manual_seed(0))
    model = PositionBasedModel(eta=1.0, max_label=4)
    train = simulate_clicks(data, scores, model=model, sessions_per_query=6, k=P, seed=0, drop_unclicked=True)
    vali = simulate_clicks(data, scores, model=model, sessions_per_query=6, k=P, seed=1, drop_unclicked=True)
    return data, train, vali


def test_position_bias_trains_on_shifted_scores(logs):
    _, train, _ = logs
    torch.manual_seed(0)
    module = LambdaRank(n_features=5, hidden=[8], dropout=0.0, k=4, reduction="sum", unbiased="position",
                        n_positions=P)
    with torch.no_grad():
        module.position_bias.bias.copy_(torch.linspace(1.0, -1.0, P))
    batch = train.sessions.padded(torch.arange(30))
    scores = module.scorer(batch.features).detach().double().requires_grad_(True)
    loss = module.objective(scores, batch)
    grad, bias_grad = torch.autograd.grad(loss, [scores, module.position_bias.bias])
    shifted = scores.detach() + torch.linspace(1.0, -1.0, P).double()[batch.position.clamp(max=P - 1)]
    expected, _ = lambda_gradients(shifted, batch.labels.double(), mask=batch.mask, weighting="ndcg", k=4)
    torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-7)
    by_position = torch.zeros(P, dtype=torch.float64)
    for q in range(batch.mask.shape[0]):
        for i in range(batch.mask.shape[1]):
            if batch.mask[q, i]:
                by_position[min(int(batch.position[q, i]), P - 1)] += expected[q, i]
    torch.testing.assert_close(bias_grad.double(), by_position, rtol=1e-4, atol=1e-6)
    # evaluation and export leave the bias out
    torch.testing.assert_close(module(batch.features), module.scorer(batch.features))


def _ips_weights_loop(theta, clip, batch):
    """Each pair's weight of inverse propensity weighting, by a loop: 1 / θ of the clicked
    document's position (at most ``clip``), for the kernel's (upper, lower) factors."""
    upper = torch.zeros(batch.mask.shape, dtype=torch.float64)
    for q in range(batch.mask.shape[0]):
        for i in range(batch.mask.shape[1]):
            if batch.mask[q, i]:
                upper[q, i] = min(float(theta[0]) / float(theta[min(int(batch.position[q, i]), P - 1)]), clip)
    return upper, batch.mask.double()


def test_ips_weighs_pairs_by_the_training_logs_regression_em(logs, tmp_path):
    """``unbiased="ips"``: regression-EM on the whole training log when Trainer.fit starts (the
    same θ̂ as LambdaMART(unbiased="ips") with the same seed), then every batch's pairs weighed by
    min(1/θ̂, clip) (the lambda kernel with those weights, built by a loop); the θ̂ survive a
    checkpoint; a plain loop must read the log first."""
    data, train, vali = logs
    pl.seed_everything(3, verbose=False)
    module = LambdaRank(n_features=5, hidden=[8], dropout=0.0, k=4, reduction="sum", unbiased="ips", n_positions=P,
                        propensity_clip=4.0)
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path)
    trainer.fit(module, datamodule=RankingDataModule.from_datasets(train.sessions, vali.sessions, None, max_docs=512))
    s = train.sessions
    theta = ips_propensities(s.features, s.labels, s.sizes, s.position, n_positions=P, seed=3)
    torch.testing.assert_close(module.propensities["clicked"], theta / theta[0], rtol=0, atol=0)
    booster = LambdaMART(n_estimators=1, unbiased="ips", n_positions=P, seed=3).fit(
        s.features, s.labels, group=s.sizes, position=s.position)
    np_theta = torch.as_tensor(booster.propensities_["clicked"])
    torch.testing.assert_close(np_theta, theta / theta[0])
    assert float((1 / theta).max()) > 4.0  # the clip binds somewhere
    batch = s.padded(torch.arange(30))
    scores = module.scorer(batch.features).detach().double().requires_grad_(True)
    (grad,) = torch.autograd.grad(module.objective(scores, batch), scores)
    expected, _ = lambda_gradients(scores.detach(), batch.labels.double(), mask=batch.mask, weighting="ndcg", k=4,
                                   pair_weights=_ips_weights_loop(theta, 4.0, batch))
    torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-7)
    path = tmp_path / "ips.ckpt"
    trainer.save_checkpoint(path)
    restored = LambdaRank.load_from_checkpoint(path)
    torch.testing.assert_close(restored.propensities["clicked"], module.propensities["clicked"], rtol=0, atol=0)
    fresh = LambdaRank(n_features=5, hidden=[8], unbiased="ips", n_positions=P)
    with pytest.raises(ValueError, match=r"call `module.read_click_log\(train_set\)`"):
        fresh.objective(fresh.scorer(batch.features), batch)
    torch.manual_seed(3)  # 1-based ids, read through the training log's ids: the same propensities
    fresh.read_click_log(dataclasses.replace(s, position=s.position + 1))
    torch.testing.assert_close(fresh.propensities["clicked"], module.propensities["clicked"], rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"`unbiased='ips'` debiases pairs"):
        LambdaRank(n_features=5, unbiased="ips", objective="softmax")


def test_dla_losses_against_a_float64_loop():
    g = torch.Generator().manual_seed(2)
    scores = torch.randn(3, 5, generator=g, dtype=torch.float64)
    clicks = torch.tensor([[0, 1, 0, 1, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.float64)
    position = torch.tensor([[0, 1, 2, 3, 4], [2, 0, 1, 4, 3], [0, 1, 2, 3, 4]])
    mask = torch.tensor([[True] * 5, [True] * 4 + [False], [True] * 5])
    dla = DualLearning(4, clip=3.0)
    with torch.no_grad():
        dla.logits.copy_(torch.tensor([0.5, -0.3, -1.0, -2.5]))
    got = dla.loss(scores, clicks, position, mask)
    phi = [0.5, -0.3, -1.0, -2.5]
    rank_num = exam_num = weight_rank = weight_exam = 0.0
    for q in range(3):
        docs = [i for i in range(5) if mask[q, i]]
        top = min(docs, key=lambda i: int(position[q, i]))
        s = [float(scores[q, i]) for i in docs]
        f = [phi[min(int(position[q, i]), 3)] for i in docs]
        log_s = [v - math.log(sum(math.exp(x) for x in s)) for v in s]
        log_f = [v - math.log(sum(math.exp(x) for x in f)) for v in f]
        for n, i in enumerate(docs):
            c = float(clicks[q, i])
            w = min(math.exp(phi[0] - f[n]), 3.0)
            v = min(math.exp(float(scores[q, top]) - s[n]), 3.0)
            rank_num -= c * w * log_s[n]
            exam_num -= c * v * log_f[n]
            weight_rank += c * w
            weight_exam += c * v
    assert float(got) == pytest.approx(rank_num / weight_rank + exam_num / weight_exam, rel=1e-6)
    assert torch.allclose(dla.propensities, torch.exp(torch.tensor(phi, dtype=torch.float64) - 0.5))


def test_race_halves_and_keeps_the_leader(logs):
    data, train, vali = logs
    torch.manual_seed(0)
    module = LambdaRank(n_features=5, hidden=[8], lr=1e-2, unbiased="auto", n_positions=P)
    module.fit_preprocessor(data.features)
    module.read_click_log(train.sessions)  # a plain loop: the ips candidate's propensities
    opt = module.configure_optimizers()
    alive = []
    for epoch in range(3):
        for batch in train.sessions.iter_batches(64, shuffle=True, generator=torch.Generator().manual_seed(epoch)):
            opt.zero_grad()
            module.race.loss(batch).backward()
            opt.step()
        leader = module.validate_race(vali.sessions.iter_batches(256), epoch, 3)
        alive.append(list(module.race.alive))
    assert [len(a) for a in alive] == [2, 1, 1]
    assert leader == module.unbiased_choice_ == alive[-1][0] and leader in NEURAL_CANDIDATES
    winner = module.race.candidates[leader]
    for a, b in zip(module.scorer.state_dict().values(), winner.scorer.state_dict().values()):
        assert torch.equal(a, b)
    # the criterion, recomputed from the features
    criterion = ClickLikelihood(vali.sessions.features, vali.clicks, vali.sessions.sizes, vali.position, n_positions=P)
    winner.eval()
    assert module.race.scores_[leader] == pytest.approx(criterion(lambda x: winner.scorer(x)), abs=1e-6)


def test_race_in_a_lightning_fit_and_a_checkpoint(logs, tmp_path):
    data, train, vali = logs
    pl.seed_everything(0, verbose=False)
    dm = RankingDataModule.from_datasets(train.sessions, vali.sessions, None, max_docs=512)
    module = LambdaRank(n_features=5, hidden=[8], lr=1e-2, unbiased="auto", n_positions=P)
    trainer = pl.Trainer(max_epochs=3, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path)
    trainer.fit(module, datamodule=dm)
    assert module.unbiased_choice_ in {**NEURAL_CANDIDATES, **NEURAL_BLENDS}
    assert module.race.alive == [module.unbiased_choice_]
    path = tmp_path / "auto.ckpt"
    trainer.save_checkpoint(path)
    restored = LambdaRank.load_from_checkpoint(path)
    assert restored.unbiased_choice_ == module.unbiased_choice_
    x = data.features[:20]
    module.eval()
    restored.eval()
    torch.testing.assert_close(restored(x), module(x))


def _favour(race, name: str, by: float = 100.0) -> None:
    """Make candidate ``name`` win ``race``: its recorded scores raised by ``by`` (the others' and
    the scores' computation left as they are)."""
    record = race.schedule.record
    race.schedule.record = lambda n, score, **info: record(n, score + (by if n == name else 0.0), **info)


def test_a_neural_blend_races_on_its_parts_and_serves_their_mean(logs, tmp_path):
    """A blend of NEURAL_BLENDS is scored by the mean of its two networks' scores (the
    criterion, recomputed from the features, of that mean); while it races both networks train,
    and once it has won only they do; the module then serves the mean of both (eager, a
    checkpoint reloaded by Lightning and by rankkit, TorchScript and torch.export)."""
    from rankkit.export import export_program, export_torchscript
    from rankkit.infra.checkpoint import load_checkpoint

    data, train, vali = logs
    blend, (first, second) = next(iter(NEURAL_BLENDS.items()))
    pl.seed_everything(0, verbose=False)
    dm = RankingDataModule.from_datasets(train.sessions, vali.sessions, None, max_docs=512)
    module = LambdaRank(n_features=5, hidden=[8], lr=1e-2, unbiased="auto", n_positions=P)
    assert blend in module.race.alive and module.race.runs == list(NEURAL_CANDIDATES)
    _favour(module.race, blend)
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path)
    trainer.fit(module, datamodule=dm)
    race = module.race
    assert module.unbiased_choice_ == blend and race.alive == [blend] and race.runs == [first, second]
    parts = [race.candidates[name].scorer.eval() for name in (first, second)]
    x = data.features[:30]
    module.eval()
    with torch.no_grad():
        torch.testing.assert_close(module(x), (parts[0](x) + parts[1](x)) / 2)
    criterion = ClickLikelihood(vali.sessions.features, vali.clicks, vali.sessions.sizes, vali.position, n_positions=P)
    assert race.scores_[blend] - 100.0 == pytest.approx(
        criterion(lambda f: (parts[0](f) + parts[1](f)) / 2), abs=1e-6)
    # once the blend has won, its two networks train and no other
    batch = train.sessions.padded(torch.arange(20))
    module.zero_grad()
    race.loss(batch).backward()
    for name, candidate in race.candidates.items():
        grads = [p.grad for p in candidate.scorer.parameters()]
        assert all(g is not None for g in grads) == (name in (first, second)), name
    # a checkpoint holds the blend: Lightning's and rankkit's loaders rebuild the mean
    path = tmp_path / "blend.ckpt"
    trainer.save_checkpoint(path)
    from rankkit.infra.checkpoint import read_checkpoint
    assert read_checkpoint(path)["rankkit"]["scorer_class"] == "rankkit.scorers.MLPScorer"  # the networks' class
    for restored in (LambdaRank.load_from_checkpoint(path), load_checkpoint(path)):
        assert restored.unbiased_choice_ == blend
        torch.testing.assert_close(restored.eval()(x), module(x))
    # and exports as one scorer
    eager = module(x)
    scripted = torch.jit.load(export_torchscript(module, tmp_path / "blend.pt"))
    torch.testing.assert_close(scripted(x), eager)
    program = torch.export.load(export_program(module, tmp_path / "blend.pt2")).module()
    torch.testing.assert_close(program(x), eager)


class _OwnScorer(torch.nn.Module):
    """A scorer of the user's (not rankkit's): a checkpoint may not build it."""

    def __init__(self, n_features: int = 5):
        super().__init__()
        self.n_features = n_features
        self.lin = torch.nn.Linear(n_features, 1)

    def forward(self, x):
        return self.lin(x).squeeze(-1)


def test_a_blend_of_the_users_scorer_loads_from_its_checkpoint_given_a_fresh_one(logs, tmp_path):
    """A race over the user's own scorer that a blend won records that scorer's class, so
    loading asks for a fresh instance (and builds the blend's mean of two from it)."""
    from rankkit.infra.checkpoint import load_checkpoint

    data, train, vali = logs
    blend = next(iter(NEURAL_BLENDS))
    pl.seed_everything(0, verbose=False)
    module = LambdaRank(n_features=5, scorer=_OwnScorer(), lr=1e-2, unbiased="auto", n_positions=P)
    _favour(module.race, blend)
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path)
    trainer.fit(module, datamodule=RankingDataModule.from_datasets(train.sessions, vali.sessions, None, max_docs=512))
    path = tmp_path / "own.ckpt"
    trainer.save_checkpoint(path)
    with pytest.raises(ValueError, match=r"_OwnScorer'.*pass scorer=<a fresh instance>"):
        load_checkpoint(path)
    restored = load_checkpoint(path, scorer=_OwnScorer())
    assert restored.unbiased_choice_ == blend
    torch.testing.assert_close(restored(data.features[:10]), module.eval()(data.features[:10]))


def test_a_race_resumed_while_a_blend_leads_ends_as_the_uninterrupted_one(logs, tmp_path):
    """A fit stopped after epoch 1 of 3 with a blend leading (its checkpoint's scorer the mean of
    two networks), then resumed from that checkpoint, ends with the uninterrupted fit's choice,
    standing and weights."""
    data, train, vali = logs
    blend = next(iter(NEURAL_BLENDS))

    class StopAfterFirst(pl.Callback):
        def on_train_epoch_end(self, trainer, module):
            trainer.should_stop = True

    def run(root, ckpt_path=None, stop=False):
        pl.seed_everything(3, verbose=False)
        module = LambdaRank(n_features=5, hidden=[8], lr=1e-2, unbiased="auto", n_positions=P)
        _favour(module.race, blend)
        callbacks = [pl.callbacks.ModelCheckpoint(dirpath=root, save_last=True), *([StopAfterFirst()] if stop else [])]
        trainer = pl.Trainer(max_epochs=3, accelerator="cpu", logger=False, enable_progress_bar=False,
                             enable_model_summary=False, default_root_dir=root, callbacks=callbacks)
        trainer.fit(module, datamodule=RankingDataModule.from_datasets(train.sessions, vali.sessions, None,
                                                                       max_docs=512, seed=5), ckpt_path=ckpt_path)
        return module

    whole = run(tmp_path / "whole")
    first = run(tmp_path / "part", stop=True)
    assert first.unbiased_choice_ == blend and first.race.alive[0] == blend and len(first.race.alive) == 2
    resumed = run(tmp_path / "part", ckpt_path=str(tmp_path / "part" / "last.ckpt"))
    assert resumed.unbiased_choice_ == whole.unbiased_choice_ == blend
    assert resumed.race.scores_ == whole.race.scores_
    for (name, a), (_, b) in zip(whole.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name


def test_a_race_led_by_a_blend_then_a_network_reshapes_the_scorer(logs):
    """The leader may change kind between validations (a blend after the first, one network
    after the second): ``module.scorer`` takes each leader's shape and weights."""
    data, train, vali = logs
    torch.manual_seed(0)
    module = LambdaRank(n_features=5, hidden=[8], lr=1e-2, unbiased="auto", n_positions=P)
    module.fit_preprocessor(data.features)
    module.read_click_log(train.sessions)
    blend, (first, second) = next(iter(NEURAL_BLENDS.items()))
    _favour(module.race, blend)
    _favour(module.race, first, by=50.0)  # second after the first stage
    x = data.features[:10]
    assert module.validate_race(vali.sessions.iter_batches(256), 0, 3) == blend
    assert module.race.alive == [blend, first] and module.race.runs == [first, second]
    module.eval()
    with torch.no_grad():
        torch.testing.assert_close(module(x), (module.race.candidates[first].scorer.eval()(x)
                                               + module.race.candidates[second].scorer.eval()(x)) / 2)
    _favour(module.race, first, by=1000.0)
    assert module.validate_race(vali.sessions.iter_batches(256), 1, 3) == first
    assert module.race.alive == [first] and module.race.runs == [first]
    assert not isinstance(module.scorer, type(module.race.leader_scorer(blend)))
    with torch.no_grad():
        torch.testing.assert_close(module.eval()(x), module.race.candidates[first].scorer.eval()(x))


def test_the_neural_race_ends_its_stages_within_the_early_stopping_patience(logs, tmp_path):
    """With an EarlyStopping callback the stages end at a third and two thirds of its patience
    (in epochs: validations times check_val_every_n_epoch) when that is sooner than a third and
    two thirds of max_epochs, so a fit that stops early does not race every network to its stop."""
    from rankkit.clicks.race import epoch_stage_ends, trainer_patience

    assert epoch_stage_ends(6) == (2, 4) and epoch_stage_ends(3) == (1, 2) and epoch_stage_ends(1) == (1, 1)
    assert epoch_stage_ends(100, 6) == (2, 4) and epoch_stage_ends(6, 30) == (2, 4)
    assert epoch_stage_ends(100, 1) == (1, 1)
    quiet = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                 default_root_dir=tmp_path, accelerator="cpu")
    stop = pl.callbacks.EarlyStopping
    assert trainer_patience(pl.Trainer(max_epochs=6, **quiet)) is None
    assert trainer_patience(pl.Trainer(max_epochs=6, check_val_every_n_epoch=2, callbacks=[
        stop(monitor="val/explained_clicks", mode="max", patience=7), stop(monitor="val/ndcg@10", patience=4)],
        **quiet)) == 8
    assert trainer_patience(pl.Trainer(max_epochs=6, check_val_every_n_epoch=2, callbacks=[
        stop(monitor="val/explained_clicks", mode="max", patience=5, check_on_train_epoch_end=True)],
        **quiet)) == 5  # counted in training epochs
    assert trainer_patience(pl.Trainer(max_epochs=6, val_check_interval=0.25, callbacks=[
        stop(monitor="val/explained_clicks", mode="max", patience=6)], **quiet)) == 2  # four validations an epoch
    # once fitting, as Lightning validates: every val_check_batch of the epoch's batches
    every_batches = SimpleNamespace(early_stopping_callbacks=[stop(monitor="x", patience=5)], check_val_every_n_epoch=1,
                                    val_check_interval=0.25, num_training_batches=10, val_check_batch=2)
    assert trainer_patience(every_batches) == 1  # five validations an epoch (10 batches, one every 2)
    every_batches.val_check_interval, every_batches.val_check_batch = 3, 3
    assert trainer_patience(every_batches) == 2  # three an epoch (an int interval: batches)

    data, train, vali = logs

    class Alive(pl.Callback):
        def __init__(self):
            self.seen = []

        def on_validation_end(self, trainer, module):
            if not trainer.sanity_checking:
                self.seen.append(len(module.race.alive))

    for callbacks, expected in (([], [7, 2, 2, 1]), ([stop(monitor="val/explained_clicks", mode="max", patience=3)],
                                                        [2, 1, 1, 1])):
        pl.seed_everything(0, verbose=False)
        alive = Alive()
        module = LambdaRank(n_features=5, hidden=[8], lr=1e-2, unbiased="auto", n_positions=P)
        pl.Trainer(max_epochs=6, callbacks=[alive, *callbacks], **quiet).fit(
            module, datamodule=RankingDataModule.from_datasets(train.sessions, vali.sessions, None, max_docs=512))
        assert alive.seen[:4] == expected


def test_a_race_saved_before_the_ips_candidate_loads_as_it_was(logs, tmp_path, monkeypatch):
    """A checkpoint of the four-candidate race (before 2026-11-28) loads: the race keeps the
    candidates whose weights the file holds, and its standing (plain scores) reads as before."""
    from rankkit.clicks import race as race_module

    data, train, vali = logs
    pl.seed_everything(0, verbose=False)
    monkeypatch.setattr(race_module, "NEURAL_CANDIDATES", {k: v for k, v in NEURAL_CANDIDATES.items() if k != "ips"})
    module = LambdaRank(n_features=5, hidden=[8], lr=1e-2, unbiased="auto", n_positions=P)
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path)
    trainer.fit(module, datamodule=RankingDataModule.from_datasets(train.sessions, vali.sessions, None, max_docs=512))
    path = tmp_path / "old.ckpt"
    trainer.save_checkpoint(path)
    monkeypatch.undo()
    restored = LambdaRank.load_from_checkpoint(path)
    assert list(restored.race.candidates) == [k for k in NEURAL_CANDIDATES if k != "ips"]
    assert restored.unbiased_choice_ == module.unbiased_choice_
    torch.testing.assert_close(restored.eval()(data.features[:20]), module.eval()(data.features[:20]))


def test_the_race_without_the_training_log_leaves_ips_out_and_keeps_each_candidates_biases(logs):
    """A plain loop that never read the training log races without the ips candidate (one
    warning); the race's state carries each live candidate's biases; a later read of no log
    (Trainer.fit without a datamodule) keeps the earlier reading."""
    data, train, vali = logs
    module = LambdaRank(n_features=5, hidden=[8], unbiased="auto", n_positions=P)
    batch = train.sessions.padded(torch.arange(20))
    with pytest.warns(UserWarning, match=r"races without its 'ips' candidate"):
        module.race.loss(batch).backward()
    assert "ips" not in module.race.alive and len(module.race.alive) == len(NEURAL_CANDIDATES) - 1
    assert not any("ips" in NEURAL_BLENDS.get(name, ()) for name in module.race.alive)  # nor its blends
    read = LambdaRank(n_features=5, hidden=[8], unbiased="auto", n_positions=P)
    shifted = dataclasses.replace(train.sessions, position=train.sessions.position + 1)
    read.read_click_log(shifted)
    read.read_click_log(None)
    ips = read.race.candidates["ips"].debiasing
    assert ips.estimated and read.debiasing.position_ids is not None
    with pytest.raises(ValueError, match=r"holds position id 0 .* never showed \(its ids: 1, 2"):
        read.race.loss(batch)  # the unshifted log's positions are not this reading's ids
    read.race.loss(shifted.padded(torch.arange(20)))  # no warning: every candidate races
    state = read.race.state()
    assert set(state["debiasing"]) == {"pairwise p=0", "ips"}
    fresh = LambdaRank(n_features=5, hidden=[8], unbiased="auto", n_positions=P)
    fresh.race.load_state(state)
    torch.testing.assert_close(fresh.race.candidates["ips"].propensities["clicked"], ips.propensities()["clicked"])
    with pytest.raises(ValueError, match=r"the training set has no `position`"):
        LambdaRank(n_features=5, unbiased="ips").read_click_log(data)


def test_click_modes_refuse_what_they_cannot_do(logs):
    data, _, _ = logs
    with pytest.raises(ValueError, match=r"`unbiased` has to be one of"):
        LambdaRank(n_features=5, unbiased="propensity")
    with pytest.raises(ValueError, match=r"`unbiased='auto'` races copies of the scorer; it takes no ema_decay"):
        LambdaRank(n_features=5, unbiased="auto", ema_decay=0.9)
    with pytest.raises(ValueError, match=r"`unbiased='dla'` trains by its own softmax cross-entropies"):
        LambdaRank(n_features=5, unbiased="dla", loss="softmax")
    module = LambdaRank(n_features=5, unbiased="position", n_positions=P)
    batch = data.padded(torch.arange(3))
    with pytest.raises(ValueError, match=r"`unbiased='position'` needs the documents' displayed positions"):
        module.objective(module.scorer(batch.features), batch)
    auto = LambdaRank(n_features=5, unbiased="auto", n_positions=P)
    with pytest.raises(ValueError, match=r"the validation batch has no `position`"):
        auto.validate_race([batch], 0, 3)


def test_the_click_config_fits_on_clicks_and_tests_on_labels(tmp_path, capsys):
    """experiments/lambdarank_clicks.yaml: `unbiased: auto` through `rankkit fit` on simulated
    MQ2008 clicks (data.clicks), then `rankkit test` on the true labels."""
    from pathlib import Path

    from rankkit.cli import main

    config = str(Path(__file__).resolve().parents[2] / "experiments" / "lambdarank_clicks.yaml")
    quick = [f"--trainer.default_root_dir={tmp_path}", "--trainer.enable_progress_bar=false",
             "--data.clicks={model: pbm, eta: 1.0, sessions: 3, k: 10}"]
    assert main(["fit", "--config", config, *quick, "--trainer.max_epochs=2"]) == 0
    ckpt = sorted(tmp_path.rglob("*.ckpt"))[-1]
    restored = LambdaRank.load_from_checkpoint(ckpt)
    assert restored.unbiased_choice_ in {**NEURAL_CANDIDATES, **NEURAL_BLENDS}
    assert main(["test", "--config", config, *quick, f"--ckpt_path={ckpt}", "--trainer.logger=false"]) == 0
    assert "test/ndcg@10" in capsys.readouterr().out


def test_click_debiasing_reads_position_ids_weighs_pairs_and_keeps_its_state():
    ndcg = objective_spec(None, weighting="ndcg")
    with pytest.raises(ValueError, match="needs a pairwise objective"):
        make_debiasing(True, objective_spec("softmax"), bias_p=1.0, n_positions=5)
    off = make_debiasing(False, ndcg, bias_p=1.0, n_positions=5)
    assert off.propensity is None and off.state() is None and off.propensities() is None
    assert checkpoint_entries(off, None) == {}
    on = make_debiasing(True, ndcg, bias_p=1.0, n_positions=5)
    train = SimpleNamespace(position=torch.tensor([1, 2, 3, 1, 2]))  # 1-based ids
    on.read_positions(train)
    batch = PaddedBatch(features=torch.zeros(1, 3, 1), labels=torch.tensor([[1.0, 0.0, 0.0]]),
                        mask=torch.tensor([[True, True, False]]), position=torch.tensor([[1, 2, 9]]))
    mapped = on.map(batch)
    assert mapped.position.tolist() == [[0, 1, 0]]  # dense ids; padding 0
    upper, lower = on.pair_weights(torch.tensor([[0.5, 0.1, 0.0]]), mapped)
    assert upper.shape == lower.shape == (1, 3) and bool(torch.isfinite(upper).all())
    entries = checkpoint_entries(on, None)
    assert set(entries) == {"propensities"}
    other = make_debiasing(True, ndcg, bias_p=1.0, n_positions=5)
    restore_entries(other, None, entries)
    assert torch.equal(other.propensities()["clicked"], on.propensities()["clicked"])
    assert torch.equal(other.costs, on.costs)
    with pytest.raises(ValueError, match="needs the documents' displayed positions"):
        on.positions(batch._replace(position=None))


@pytest.mark.parametrize("unbiased, objective, ema, match", [
    ("dla", "softmax", 0.0, r"`unbiased='dla'` trains by its own softmax cross-entropies; leave `objective` None"),
    ("auto", None, 0.5, r"`unbiased='auto'` races copies of the scorer; it takes no ema_decay"),
    ("auto", "squared_pairwise_hinge", 0.0, r"it takes no custom loss"),
    ("auto", "ndcg", 0.0, r"`unbiased='auto'` races the debiasings of the built-in `weighting`"),
])
def test_dla_and_auto_refuse_what_they_cannot_train(unbiased, objective, ema, match):
    spec = objective_spec(squared_pairwise_hinge if objective == "squared_pairwise_hinge" else objective)
    with pytest.raises(ValueError, match=match):
        make_debiasing(unbiased, spec, bias_p=1.0, n_positions=5, ema_decay=ema)
    make_debiasing(unbiased, objective_spec(None, weighting="ndcg"), bias_p=1.0, n_positions=5)  # the built-in: fine


def test_each_setting_gets_its_position_model_and_a_decay_free_parameter_group():
    scorer = torch.nn.Linear(3, 1)
    for unbiased, kind in ((False, None), (True, None), ("position", PositionBias), ("dla", DualLearning)):
        d = make_debiasing(unbiased, objective_spec(None, weighting="ndcg"), bias_p=1.0, n_positions=4)
        models = [m for m in (d.position_bias, d.dla) if m is not None]
        assert [type(m) for m in models] == ([] if kind is None else [kind])
        groups = d.parameter_groups(scorer)
        assert groups[0] == {"params": list(scorer.parameters())}
        if kind is None:
            assert len(groups) == 1
        else:
            assert groups[1]["weight_decay"] == 0.0 and groups[1]["params"] == list(models[0].parameters())


# -- LambdaMART ------------------------------------------------------------------------------------
def test_position_bias_step_matches_a_float64_loop(pbm_logs):
    train, _ = pbm_logs
    config = BoosterConfig(depth=2, min_data_in_leaf=5, unbiased="position", n_positions=6,
                           position_bias_regularization=0.3, learning_rate=0.2)
    engine = BoostingEngine(train.sessions.features, train.clicks.float(), train.sessions.sizes, config,
                            positions=train.position)
    engine.update()
    engine.update()  # the second round's gradients are taken at s + b
    b1 = engine.debiasing.bias.clone()
    assert b1.dtype == torch.float64
    adjusted = engine.scores + b1[train.position.long().clamp(max=5)]
    grad, hess = engine.objective.gradients(adjusted, engine.layout, backend=engine.backend)
    engine.update()
    expected = b1.clone()
    g = [0.0] * 6
    h = [0.0] * 6
    n = [0] * 6
    for i in range(len(grad)):
        p = min(int(train.position[i]), 5)
        g[p] += float(grad[i])
        h[p] += float(hess[i])
        n[p] += 1
    for p in range(6):
        step = (-g[p] - 0.3 * n[p] * float(b1[p])) / (abs(h[p] + 0.3 * n[p]) + 1e-3)
        expected[p] = float(b1[p]) + 0.2 * step
    assert torch.allclose(engine.debiasing.bias, expected, rtol=1e-9, atol=1e-12)


def test_position_model_explains_clicks_by_position():
    """Clicks that depend on the position only, and a feature that leaks the position: the naive
    model ranks by the leak alone; the position model puts much of it in the bias (not all: the
    leak and the position are collinear, so either explains the clicks)."""
    g = torch.Generator().manual_seed(0)
    sessions, k = 300, 6
    position = torch.arange(k).repeat(sessions)
    x = torch.cat([position[:, None].float() + 0.1 * torch.randn(sessions * k, 1, generator=g),
                   torch.randn(sessions * k, 2, generator=g)], 1)
    clicks = (torch.rand(sessions * k, generator=g) < 0.6 / (1.0 + position)).float()
    group = [k] * sessions
    kw = dict(n_estimators=30, depth=2, min_data_in_leaf=10, learning_rate=0.2, n_positions=k)
    naive = LambdaMART(**kw).fit(x, clicks, group=group)
    model = LambdaMART(unbiased="position", **kw).fit(x, clicks, group=group, position=position)
    def gap(m):  # mean score at position 0 minus at position 4
        p = torch.from_numpy(m.predict(x))
        return float(p[position == 0].mean() - p[position == 4].mean())

    assert gap(naive) > 2.0
    assert gap(model) < 0.6 * gap(naive)
    assert np.all(np.diff(model.position_bias_) < 0)  # higher positions, more clicks
    assert not hasattr(naive, "position_bias_")


def test_ips_uses_regression_em_on_the_aggregated_training_log(pbm_logs):
    train, _ = pbm_logs
    x, y, group, position = train.sessions.features, train.clicks, train.sessions.sizes, train.position
    model = LambdaMART(unbiased="ips", n_estimators=3, depth=2, min_data_in_leaf=5, n_positions=8,
                       propensity_clip=5.0).fit(x, y, group=group, position=position)
    # slow path: impressions and clicks per (feature row, position) by a dictionary
    counts: dict = {}
    for row, c, p in zip(x.tolist(), y.tolist(), position.tolist()):
        key = (tuple(row), min(p, 7))
        shown, clicked = counts.get(key, (0, 0))
        counts[key] = (shown + 1, clicked + c)
    keys = sorted(counts)
    em = RegressionEM(8, hidden=(16,), iterations=15, lr=1e-2, seed=0).fit(
        torch.tensor([k[0] for k in keys]), torch.tensor([counts[k][1] for k in keys], dtype=torch.float64),
        torch.tensor([k[1] for k in keys]), impressions=torch.tensor([counts[k][0] for k in keys], dtype=torch.float64))
    np.testing.assert_allclose(model.propensities_["clicked"], em.propensities_.numpy(), rtol=1e-4)
    assert (model.propensities_["unclicked"] == 1).all()
    # seeded on its own: the caller's RNG stream is untouched, and the same seed fits the same model
    torch.manual_seed(11)
    state = torch.get_rng_state()
    again = RegressionEM(8, hidden=(16,), iterations=15, lr=1e-2, seed=0).fit(
        torch.tensor([k[0] for k in keys]), torch.tensor([counts[k][1] for k in keys], dtype=torch.float64),
        torch.tensor([k[1] for k in keys]), impressions=torch.tensor([counts[k][0] for k in keys], dtype=torch.float64))
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(again.propensities_, em.propensities_)
    seeded = []  # and no GPU's stream either (torch.manual_seed would reseed every CUDA device)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "manual_seed_all", lambda seed: seeded.append(seed))
        patch.setattr(torch.cuda, "manual_seed", lambda seed: seeded.append(seed))
        RegressionEM(8, hidden=(4,), iterations=1, seed=0).fit(torch.tensor([k[0] for k in keys]), torch.tensor(
            [counts[k][1] for k in keys], dtype=torch.float64), torch.tensor([k[1] for k in keys]),
            impressions=torch.tensor([counts[k][0] for k in keys], dtype=torch.float64))
        torch.manual_seed(0)  # the probe sees what torch.manual_seed does
    assert seeded == [0], seeded
    est = FixedPropensities(em.propensities_, clip=5.0)
    before = est.t_plus.clone()
    est.update(torch.zeros(2, 3), torch.tensor([[1.0, 0, 0], [0, 1.0, 0]]), torch.tensor([[0, 1, 2], [0, 1, 2]]))
    assert torch.equal(est.t_plus, before)
    upper, lower = est.pair_factors(torch.arange(8)[None])
    assert upper.max().item() <= 5.0 + 1e-6 and (lower == 1).all()


@pytest.mark.parametrize("unbiased", [True, "position", "ips"])
def test_position_ids_of_any_numbering_train_the_same_model(pbm_logs, unbiased):
    """LightGBM's rule: positions are ids. 0-based, 1-based and sparse (even negative) ids
    give the same model; before, 1-based ids switched the debiasing off without a word."""
    train, _ = pbm_logs
    x, y, group, position = train.sessions.features, train.clicks, train.sessions.sizes, train.position
    kw = dict(unbiased=unbiased, n_estimators=4, depth=2, min_data_in_leaf=5, n_positions=8)
    models = [LambdaMART(**kw).fit(x, y, group=group, position=p)
              for p in (position, position + 1, 5 * position - 10)]
    for model in models[1:]:
        np.testing.assert_array_equal(model.predict(x), models[0].predict(x))
    assert models[1].position_ids_.tolist() == list(range(1, 9))
    assert models[2].position_ids_.tolist() == list(range(-10, 30, 5))
    if unbiased is True:  # the biases are learned, not all 1 (what 1-based ids gave before)
        assert not np.allclose(models[1].propensities_["clicked"], 1.0)


def test_position_ids_map_the_validation_log_the_same_way(pbm_logs, tmp_path):
    train, vali = pbm_logs
    x, y, group = train.sessions.features, train.clicks, train.sessions.sizes
    kw = dict(unbiased="auto", n_estimators=3, depth=2, min_data_in_leaf=5, n_positions=8, seed=2)
    fit = dict(eval_set=[(vali.sessions.features, vali.clicks)], eval_group=[vali.sessions.sizes])
    zero = LambdaMART(**kw).fit(x, y, group=group, position=train.position, eval_position=[vali.position], **fit)
    one = LambdaMART(**kw).fit(x, y, group=group, position=train.position + 1, eval_position=[vali.position + 1],
                               **fit)
    assert one.unbiased_choice_ == zero.unbiased_choice_ and one.unbiased_scores_ == zero.unbiased_scores_
    np.testing.assert_array_equal(one.predict(x), zero.predict(x))
    one.save(tmp_path / "m.safetensors")
    assert LambdaMART.load(tmp_path / "m.safetensors").position_ids_.tolist() == list(range(1, 9))
    unseen = torch.where(vali.position == 3, 40, vali.position)
    with pytest.raises(ValueError, match=r"`eval_position\[0\]` holds position id 40 at index \d+, which the "
                                         r"training log never showed"):
        LambdaMART(**kw).fit(x, y, group=group, position=train.position, eval_position=[unseen], **fit)


def test_more_position_ids_than_n_positions_are_refused_or_pooled_on_request(pbm_logs):
    train, _ = pbm_logs
    x, y, group, position = train.sessions.features, train.clicks, train.sessions.sizes, train.position
    kw = dict(unbiased=True, n_estimators=3, depth=2, min_data_in_leaf=5, n_positions=4)
    with pytest.raises(ValueError, match=r"`position` holds 8 distinct position ids \(0..7\), more than "
                                         r"n_positions=4: pass n_positions=8 .* or pool_positions=True"):
        LambdaMART(**kw).fit(x, y, group=group, position=position)
    pooled = LambdaMART(pool_positions=True, **kw).fit(x, y, group=group, position=position + 1)
    clamped = LambdaMART(**kw).fit(x, y, group=group, position=position.clamp(max=3))
    np.testing.assert_array_equal(pooled.predict(x), clamped.predict(x))
    naive = LambdaMART(n_estimators=3, depth=2, min_data_in_leaf=5, n_positions=4)
    assert not hasattr(naive.fit(x, y, group=group, position=position), "position_ids_")  # read by no one
    with pytest.raises(ValueError, match=r"`position` has to hold integer position ids .* got 0.5 at index 2"):
        LambdaMART(**kw).fit(x, y, group=group, position=torch.tensor([0, 1, 0.5] + [0] * (len(y) - 3)))


# -- one object per setting, asked by both families --------------------------------------------------
def test_each_setting_is_one_object_that_both_families_ask():
    """make_debiasing gives one class per setting; the booster's side of each (start, the pair
    propensity, the scores, the after-round step, the fitted attributes) is what the engine used
    to spell out, checked here by hand; "dla" and "auto" are refused by the booster in one line."""
    from rankkit.clicks.debiasing import (Debiasing, DualLearningDebiasing, InversePropensities, LearnedBiases,
                                          PositionScores, RaceFront)
    from rankkit.clicks.propensity import PropensityEstimator

    neural_spec = objective_spec(None, weighting="ndcg")
    spec = BoosterConfig().objective_spec  # the booster's own spelling (objective="lambdarank")
    kinds = {False: Debiasing, True: LearnedBiases, "position": PositionScores, "ips": InversePropensities,
             "dla": DualLearningDebiasing, "auto": RaceFront}
    for setting, kind in kinds.items():
        made = make_debiasing(setting, neural_spec, n_positions=4)
        assert type(made) is kind and made.setting == setting and type(made.setting) is type(setting)
        if setting != "dla":
            assert type(make_debiasing(setting, spec, family="trees", n_positions=4)) is kind
    with pytest.raises(ValueError, match=r"`unbiased` has to be one of \(False, True, 'position', 'ips', 'auto'\)"):
        make_debiasing("dla", spec, family="trees")
    with pytest.raises(ValueError, match="`unbiased` has to be one of"):
        make_debiasing(1, neural_spec)  # never 1 for True
    with pytest.raises(ValueError, match="`family` has to be one of"):
        make_debiasing(False, spec, family="forest")
    g = torch.Generator().manual_seed(0)
    n, sizes = 12, torch.tensor([5, 7])
    x, clicks = torch.randn(n, 3, generator=g), (torch.rand(n, generator=g) < 0.4).float()
    read = []

    def features():  # built only by a setting that reads them
        read.append(1)
        return x

    positions = torch.cat([torch.arange(5), torch.arange(7)])
    start = dict(device=torch.device("cpu"), data_parallel=False, seed=0)
    for setting in (True, "position", "ips"):  # every debiasing setting needs the positions
        with pytest.raises(ValueError, match=r"needs the documents' displayed positions \(`position=`\)"):
            make_debiasing(setting, spec, family="trees", n_positions=4).start(features, clicks, sizes, None,
                                                                               **start)
    with pytest.raises(ValueError, match="is a choice among fits"):  # the engine's own message, first
        BoostingEngine(x, clicks, sizes, BoosterConfig(unbiased="auto", n_positions=4), positions=positions)
    with pytest.raises(ValueError, match="LambdaMART does not"):
        make_debiasing("dla", neural_spec, n_positions=4).start(features, clicks, sizes, positions, **start)
    with pytest.raises(ValueError, match="not data-parallel yet"):
        make_debiasing("position", spec, family="trees", n_positions=4).start(
            features, clicks, sizes, positions, **{**start, "data_parallel": True})
    with pytest.raises(ValueError, match=r"`y` .*0 or 1 \(clicks\)"):
        make_debiasing(True, spec, family="trees", n_positions=4).start(features, clicks * 2, sizes, positions,
                                                                        **start)

    naive = make_debiasing(False, spec, family="trees")
    naive.start(features, clicks, sizes, positions, **start)
    s = torch.randn(n, dtype=torch.float64, generator=g)
    assert naive.pair_propensity() is None and naive.scores(s) is s and naive.fitted() == {}
    assert naive.training_positions is None and not read  # naive training reads neither

    learned = make_debiasing(True, spec, family="trees", n_positions=4)
    learned.start(features, clicks, sizes, positions, **start)
    estimator, pos = learned.pair_propensity()
    assert isinstance(estimator, PropensityEstimator) and torch.equal(pos, positions)
    assert set(learned.fitted()["propensities_"]) == {"clicked", "unclicked"}

    position = make_debiasing("position", spec, family="trees", n_positions=4)
    position.start(features, clicks, sizes, positions, **start)
    grad, hess = torch.randn(n, dtype=torch.float64, generator=g), torch.rand(n, dtype=torch.float64, generator=g)
    position.after_round(grad, hess, learning_rate=0.5, regularization=0.1)
    b = torch.zeros(4, dtype=torch.float64)
    for p in range(4):  # the Newton step from b = 0, by hand; positions 3..6 share bucket 3
        rows = [i for i in range(n) if min(int(positions[i]), 3) == p]
        b[p] = 0.5 * -sum(float(grad[i]) for i in rows) / (abs(sum(float(hess[i]) for i in rows) + 0.1 * len(rows))
                                                           + 1e-3)
    torch.testing.assert_close(position.bias, b)
    torch.testing.assert_close(position.scores(s), s + b[positions.clamp(max=3)])
    assert position.pair_propensity() is None
    np.testing.assert_array_equal(position.fitted()["position_bias_"], b.numpy())

    assert not read  # only "ips" reads the features
    ips = make_debiasing("ips", spec, family="trees", n_positions=4, propensity_clip=5.0)
    assert not ips.estimated
    ips.start(features, clicks, sizes, positions, **start)
    assert read == [1]
    theta = ips_propensities(x, clicks, sizes, positions, n_positions=4, seed=0)
    fixed, _ = ips.pair_propensity()
    assert isinstance(fixed, FixedPropensities) and ips.estimated
    torch.testing.assert_close(fixed.t_plus, theta / theta[0])


def test_ips_with_the_auto_clip_trains_and_keeps_its_clip_across_a_checkpoint(logs, tmp_path):
    """LambdaRank(unbiased="ips", propensity_clip="auto") end to end: the clip is auto_clip of the
    training log's θ̂ over its clicked positions, and a checkpoint restores that very number (and
    the same scores), not one recomputed from the saved ratios."""
    from rankkit.clicks.propensity import auto_clip

    data, train, vali = logs
    pl.seed_everything(0, verbose=False)
    module = LambdaRank(n_features=5, hidden=[8], lr=1e-2, unbiased="ips", n_positions=P, propensity_clip="auto")
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path)
    trainer.fit(module, datamodule=RankingDataModule.from_datasets(train.sessions, vali.sessions, None, max_docs=512))
    theta = module.propensity.t_plus
    clicked = torch.zeros(P, dtype=torch.bool)
    clicked[train.position.long().clamp(max=P - 1)[train.clicks > 0]] = True
    assert module.propensity.clip == pytest.approx(auto_clip(theta, used=clicked))
    path = tmp_path / "ips.ckpt"
    trainer.save_checkpoint(path)
    restored = LambdaRank.load_from_checkpoint(path)
    assert restored.propensity.clip == module.propensity.clip
    torch.testing.assert_close(restored.eval()(data.features[:20]), module.eval()(data.features[:20]))


def test_lambdamart_reports_the_clip_its_ips_applied(pbm_logs):
    """propensity_clip_: the number "auto" chose (auto_clip over the clicked positions of the
    training log's θ̂, which propensities_ reports), a given number as given, None as None; no
    attribute for the other settings, and a refit with another setting drops it."""
    from rankkit.clicks.propensity import auto_clip

    train, _ = pbm_logs
    x, clicks, group, position = train.sessions.features, train.clicks, train.sessions.sizes, train.position
    kw = dict(n_estimators=2, depth=2, min_data_in_leaf=5, n_positions=8)
    model = LambdaMART(unbiased="ips", **kw).fit(x, clicks, group=group, position=position)
    clicked = torch.zeros(8, dtype=torch.bool)
    clicked[position.long().clamp(max=7)[clicks > 0]] = True
    theta = torch.as_tensor(model.propensities_["clicked"])
    assert model.propensity_clip_ == pytest.approx(auto_clip(theta, used=clicked))
    for clip in (4.0, None):
        assert LambdaMART(unbiased="ips", propensity_clip=clip, **kw).fit(
            x, clicks, group=group, position=position).propensity_clip_ == clip
    model.set_params(unbiased="position").fit(x, clicks, group=group, position=position)
    assert not hasattr(model, "propensity_clip_")


@pytest.mark.parametrize("unbiased", ["position", "dla"])
@pytest.mark.parametrize("position_lr", [1e-2, 0.3, None])
def test_the_position_models_train_at_position_lr(unbiased, position_lr):
    # Their own parameter group (no weight decay) at position_lr; None: the optimiser's lr. The
    # race's candidates inherit it.
    module = LambdaRank(n_features=5, hidden=[8], lr=2e-3, weight_decay=1e-4, unbiased=unbiased, n_positions=P,
                        position_lr=position_lr)
    groups = module.configure_optimizers().param_groups
    position_model = module.position_bias if unbiased == "position" else module.dla
    assert [p for g in groups[1:] for p in g["params"]] == list(position_model.parameters())
    assert groups[0]["lr"] == 2e-3 and groups[0]["weight_decay"] == 1e-4
    assert groups[1]["lr"] == (2e-3 if position_lr is None else position_lr) and groups[1]["weight_decay"] == 0.0
    race = LambdaRank(n_features=5, hidden=[8], unbiased="auto", n_positions=P, position_lr=position_lr).race
    assert race.candidates[unbiased].hparams.position_lr == position_lr


def test_dla_learns_the_examination_within_a_few_epochs_only_at_its_own_rate(pbm_logs):
    # PBM η = 1 on 8 shown positions: position k is examined 1/(k + 1) as often as the first. With
    # the scorer's 1e-3 the examination logits move by at most about 1e-3 a step (Adam): three epochs
    # of batches as large as the click grid's (some fifty steps) leave them where they started; at the
    # default position_lr they come down towards the curve.
    train, _ = pbm_logs

    def propensities(position_lr):
        torch.manual_seed(0)
        module = LambdaRank(n_features=6, hidden=[8], lr=1e-3, unbiased="dla", n_positions=8,
                            position_lr=position_lr)
        module.fit_preprocessor(train.sessions.features)
        module.read_click_log(train.sessions)
        opt = module.configure_optimizers()
        for epoch in range(3):
            for batch in train.sessions.iter_batches(256, shuffle=True,
                                                     generator=torch.Generator().manual_seed(epoch)):
                opt.zero_grad()
                module.objective(module.scorer(batch.features), batch).backward()
                opt.step()
        return module.propensities["clicked"]

    truth = 1.0 / torch.arange(1, 9, dtype=torch.float64)
    slow, default = propensities(None), propensities(LambdaRank(n_features=6).hparams.position_lr)
    assert (slow - 1.0).abs().max() < 0.15  # hardly moved (0.90 at the deepest, where the truth is 1/8)
    assert (default[4:] - truth[4:]).abs().mean() < 0.5 * (slow[4:] - truth[4:]).abs().mean()


def test_the_race_shares_one_plan_and_gives_the_losses_it_gave_without(logs):
    # The candidates' lambda losses of one batch share its plan (the labels validated and
    # planned once): the race's loss is bit for bit the sum of each candidate's own public call,
    # and scores that are not finite are still refused, naming the argument.
    from rankkit.lambdas import plan as plan_module
    from rankkit.neural.objective import NeuralObjective
    from rankkit.scorers import score_lists

    data, train, _ = logs

    def race_module():
        torch.manual_seed(0)
        module = LambdaRank(n_features=5, hidden=[8], dropout=0.0, unbiased="auto", n_positions=P)
        module.fit_preprocessor(data.features)
        module.read_click_log(train.sessions)
        return module

    batch = next(iter(train.sessions.iter_batches(64)))
    alone, shared_module = race_module(), race_module()
    want = sum(alone.race.candidates[name].objective(
        score_lists(alone.race.candidates[name].scorer, batch.features, batch.mask), batch)
        for name in alone.race.runs)
    plans, original = [], NeuralObjective.__call__

    def spy(self, scores, b, pair_weights=None):
        shared = plan_module._SHARED.get()
        plans.append(None if shared is None else shared[2])
        return original(self, scores, b, pair_weights)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(NeuralObjective, "__call__", spy)
        got = shared_module.race.loss(batch)
    assert torch.equal(got, want)
    assert len(plans) == 4 and plans[0] is not None and all(p is plans[0] for p in plans)  # DLA has its own loss
    assert plan_module._SHARED.get() is None  # only inside the race's step
    # What the planned losses do not check, the block does: the scores each loss is given (the
    # "position" candidate's shifted by its biases), then the networks'.
    position = shared_module.race.candidates["position"]
    with torch.no_grad():
        position.position_bias.bias.fill_(float("inf"))
    with pytest.raises(ValueError, match=r"`scores` has to be finite on real documents, got inf at \[0, 0\]"):
        shared_module.race.loss(batch)
    with torch.no_grad():
        position.position_bias.bias.zero_()
        next(shared_module.race.candidates["naive"].scorer.parameters()).fill_(float("nan"))
    with pytest.raises(ValueError, match=r"`scores` has to be finite on real documents, got nan at \[0, 0\]"):
        shared_module.race.loss(batch)


def test_a_checkpoint_from_before_position_lr_trains_its_position_models_at_lr(tmp_path):
    # Saved before 2026-12-06 (no position_lr among its hyper-parameters): its position models
    # trained at `lr`, and go on doing so after loading, by every route; a new checkpoint keeps its own.
    from rankkit.infra.checkpoint import load_checkpoint

    for unbiased in ("dla", "auto"):
        module = LambdaRank(n_features=5, hidden=[8], lr=2e-3, unbiased=unbiased, n_positions=P, position_lr=0.05)
        ckpt = {"state_dict": module.state_dict(), "pytorch-lightning_version": "2.6.0",
                "hyper_parameters": {"_class_path": "rankkit.neural.LambdaRank", **dict(module.hparams)}}
        module.on_save_checkpoint(ckpt)
        torch.save(ckpt, tmp_path / "new.ckpt")
        old = {k: v for k, v in ckpt["hyper_parameters"].items() if k != "position_lr"}
        torch.save({**ckpt, "hyper_parameters": old}, tmp_path / "old.ckpt")
        for load in (load_checkpoint, LambdaRank.load_from_checkpoint):
            for name, want in (("new.ckpt", 0.05), ("old.ckpt", None)):
                loaded = load(tmp_path / name)
                modules = [loaded] if loaded.race is None else list(loaded.race.candidates.values())
                for m in modules:
                    assert m.hparams.position_lr == want
                    groups = m.configure_optimizers().param_groups
                    if len(groups) > 1:
                        assert groups[1]["lr"] == (2e-3 if want is None else want)
