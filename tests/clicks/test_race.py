"""``unbiased="auto"``'s race (rankkit.clicks.race) as LambdaMART runs it: the winner against a plain fit
of the same candidate, the stages, early stopping inside them, and the schedule itself."""
from __future__ import annotations


import numpy as np
import pytest

from rankkit.boosting import LambdaMART
from rankkit.boosting import booster as booster_module, engine as engine_module
from rankkit.boosting.engine import fit_binner, transform
from rankkit.clicks.race import TREE_BLENDS, TREE_CANDIDATES, race_rounds
from rankkit.boosting.engine import BoostingEngine
from rankkit.clicks.race import SuccessiveHalving


def _auto_fit(pbm_logs, **kw):
    """``LambdaMART(unbiased="auto", **kw)`` fitted on the training log, choosing on the
    validation log; and the training log's (x, y, group, position)."""
    train, vali = pbm_logs
    x, y, group, position = train.sessions.features, train.clicks, train.sessions.sizes, train.position
    model = LambdaMART(unbiased="auto", **kw).fit(
        x, y, group=group, position=position, eval_set=[(vali.sessions.features, vali.clicks)],
        eval_group=[vali.sessions.sizes], eval_position=[vali.position])
    return model, (x, y, group, position)


def test_auto_keeps_the_winner_as_a_plain_fit_would(pbm_logs, tmp_path):
    kw = dict(n_estimators=6, depth=2, min_data_in_leaf=5, n_positions=8, seed=3)
    model, (x, y, group, position) = _auto_fit(pbm_logs, **kw)
    vali = pbm_logs[1]
    assert set(model.unbiased_scores_) == set(TREE_CANDIDATES) | set(TREE_BLENDS)
    stages = {c: v["stage"] for c, v in model.unbiased_scores_.items()}
    finalists = [c for c, stage in stages.items() if stage == 2]
    assert sorted(stages.values()) == [1, 1, 1, 2, 2] and model.unbiased_choice_ in finalists
    other = next(c for c in finalists if c != model.unbiased_choice_)
    assert model.unbiased_scores_[model.unbiased_choice_]["score"] >= model.unbiased_scores_[other]["score"]
    for name, entry in model.unbiased_scores_.items():  # a blend is scored at both parts' trees
        assert entry["trees"] == (2 if name in TREE_BLENDS else 1) * 2 * entry["stage"]
    parts = TREE_BLENDS.get(model.unbiased_choice_, (model.unbiased_choice_,))
    plain = [LambdaMART(**TREE_CANDIDATES[p], **{**kw, "seed": 3}).fit(
        x, y, group=group, position=position, eval_set=[(vali.sessions.features, vali.clicks)],
        eval_group=[vali.sessions.sizes]) for p in parts]
    np.testing.assert_allclose(model.predict(x), sum(m.predict(x) for m in plain) / len(plain), rtol=1e-6, atol=1e-6)
    assert model.best_iteration_ == 6 * len(parts) - 1
    path = tmp_path / "auto.safetensors"
    model.save(path)
    loaded = LambdaMART.load(path)
    assert loaded.unbiased_choice_ == model.unbiased_choice_ and loaded.unbiased == "auto"
    np.testing.assert_array_equal(loaded.predict(x), model.predict(x))
    # refitting with another mode leaves no stale choice behind
    model.set_params(unbiased=False).fit(x, y, group=group)
    assert not hasattr(model, "unbiased_choice_")


def test_a_blend_that_wins_grows_both_parts_to_their_own_stops(pbm_logs, monkeypatch, tmp_path):
    """The blend "position+ips" (forced to win by a criterion that counts trees) is the mean of
    plain early-stopped fits of its parts, one ensemble holding both parts' trees; its history is
    each part's, its best score None, and it saves and loads as any model."""
    class MostTrees:
        def __init__(self, *args, **kwargs):
            pass

        def __call__(self, ensemble):
            return float(len(ensemble.features))

    monkeypatch.setattr(booster_module, "ClickLikelihood", MostTrees)
    train, vali = pbm_logs
    x, y, group, position = train.sessions.features, train.clicks, train.sessions.sizes, train.position
    kw = dict(n_estimators=40, early_stopping_rounds=3, depth=2, min_data_in_leaf=5, n_positions=8, seed=3,
              learning_rate=0.5)
    fit = dict(eval_set=[(vali.sessions.features, vali.clicks)], eval_group=[vali.sessions.sizes])
    model = LambdaMART(unbiased="auto", **kw).fit(x, y, group=group, position=position,
                                                  eval_position=[vali.position], **fit)
    assert model.unbiased_choice_ == "position+ips"
    parts = [LambdaMART(**TREE_CANDIDATES[p], **kw).fit(x, y, group=group, position=position, **fit)
             for p in TREE_BLENDS["position+ips"]]
    assert all(p.best_iteration_ + 1 < len(p.evals_result_["valid_0"]["ndcg@10"]) for p in parts)  # both stopped
    np.testing.assert_allclose(model.predict(x), (parts[0].predict(x) + parts[1].predict(x)) / 2, rtol=1e-5,
                               atol=1e-6)
    assert len(model.ensemble_.features) == model.best_iteration_ + 1 == sum(p.best_iteration_ + 1 for p in parts)
    assert model.best_score_ is None
    assert model.evals_result_ == {"position valid_0": parts[0].evals_result_["valid_0"],
                                   "ips valid_0": parts[1].evals_result_["valid_0"]}
    np.testing.assert_array_equal(model.position_bias_, parts[0].position_bias_)
    np.testing.assert_array_equal(model.propensities_["clicked"], parts[1].propensities_["clicked"])
    np.testing.assert_allclose(model.feature_importance_split_, parts[0].feature_importance_split_
                               + parts[1].feature_importance_split_)
    path = tmp_path / "blend.safetensors"
    model.save(path)
    loaded = LambdaMART.load(path)
    np.testing.assert_array_equal(loaded.predict(x), model.predict(x))
    assert loaded.unbiased_choice_ == "position+ips"


def test_a_live_blend_grows_its_parts_after_they_are_cut(pbm_logs, monkeypatch):
    """A race whose second stage keeps the blend and naive (a schedule that ranks by a fixed
    order): the blend's parts, cut themselves, still grow to the second stage's end for it, and
    the blend that wins is the mean of the parts' plain fits."""
    order = ["position+ips", "naive", "pairwise p=1", "position", "ips"]

    class FixedOrder(SuccessiveHalving):
        def rank(self, *, stage_over: bool) -> str:
            self.alive = sorted(self.alive, key=order.index)
            if stage_over and not self.over:
                self.alive = self.alive[:self.keep[self.stage]]
                self.stage += 1
            self.choice_ = self.alive[0]
            return self.choice_

    monkeypatch.setattr(booster_module, "SuccessiveHalving", FixedOrder)
    kw = dict(n_estimators=6, depth=2, min_data_in_leaf=5, n_positions=8, seed=3)
    model, (x, y, group, position) = _auto_fit(pbm_logs, **kw)
    scores = model.unbiased_scores_
    assert model.unbiased_choice_ == "position+ips" and scores["naive"]["stage"] == 2
    assert scores["position"]["stage"] == scores["ips"]["stage"] == 1
    assert scores["position+ips"] == {**scores["position+ips"], "stage": 2, "trees": 4 + 4}  # stage 2 ends at 4
    plain = [LambdaMART(**TREE_CANDIDATES[p], **kw).fit(x, y, group=group, position=position)
             for p in TREE_BLENDS["position+ips"]]
    np.testing.assert_allclose(model.predict(x), (plain[0].predict(x) + plain[1].predict(x)) / 2, rtol=1e-5,
                               atol=1e-6)


def test_auto_says_each_stage_of_its_race_under_verbose(pbm_logs, capsys):
    train, vali = pbm_logs
    x, y, group, position = train.sessions.features, train.clicks, train.sessions.sizes, train.position
    model = LambdaMART(unbiased="auto", n_estimators=6, depth=2, min_data_in_leaf=5, n_positions=8, verbose=1).fit(
        x, y, group=group, position=position, eval_set=[(vali.sessions.features, vali.clicks)],
        eval_group=[vali.sessions.sizes], eval_position=[vali.position])
    stages = [line for line in capsys.readouterr().err.splitlines() if "unbiased='auto'" in line]
    assert len(stages) == 2 and stages[0].startswith("LambdaMART unbiased='auto' stage 1: up to 2 trees each")
    assert stages[1].startswith("LambdaMART unbiased='auto' stage 2: up to 4 trees each")
    assert stages[1].endswith(f"{model.unbiased_choice_} wins") and stages[0].count(",") >= 4
    assert stages[0].endswith(" go on")


@pytest.mark.parametrize("stages", [None, (12, 24)])
def test_the_race_stops_each_candidate_early_and_scores_its_kept_trees(pbm_logs, monkeypatch, stages):
    """With early stopping, no candidate grows past its own stopping point, the stages end at
    E/3 and 2E/3 rounds (rounded up), and each is scored at the trees a plain fit of it keeps.
    With longer stages (12, 24), candidates stop inside them."""
    assert race_rounds(300, 2) == (1, 2) and race_rounds(300, 30) == (10, 20) and race_rounds(300, 31) == (11, 21)
    assert race_rounds(6, None) == (2, 4) and race_rounds(2, None) == (1, 1) and race_rounds(30, 30) == (10, 20)
    if stages is not None:
        monkeypatch.setattr(booster_module, "race_rounds", lambda n, e: stages)
    train, vali = pbm_logs
    x, y, group, position = train.sessions.features, train.clicks, train.sessions.sizes, train.position
    grown = []
    update = BoostingEngine.update

    def counting(engine):
        grown.append(engine.config.unbiased)
        return update(engine)

    monkeypatch.setattr(BoostingEngine, "update", counting)
    binned, transforms = [], []
    monkeypatch.setattr(engine_module, "fit_binner", lambda *a, **k: binned.append(1) or fit_binner(*a, **k))
    monkeypatch.setattr(engine_module, "transform", lambda *a, **k: transforms.append(1) or transform(*a, **k))
    kw = dict(n_estimators=300, early_stopping_rounds=2, depth=2, min_data_in_leaf=5, n_positions=8,
              learning_rate=0.5, seed=1)
    fit = dict(eval_set=[(vali.sessions.features, vali.clicks)], eval_group=[vali.sessions.sizes])
    model = LambdaMART(unbiased="auto", **kw).fit(x, y, group=group, position=position, eval_position=[vali.position],
                                                  **fit)
    raced = list(grown)
    assert binned == [1] and len(transforms) == 2  # the candidates share the bins: training set and eval set once
    assert len(raced) < 300  # the 300-round race without stopping grows 700
    stopped, ends, kept_at = 0, stages or race_rounds(300, 2), {}
    scores, choice = model.unbiased_scores_, model.unbiased_choice_
    for name, options in TREE_CANDIDATES.items():
        entry = scores[name]
        # a plain fit of the run: to its own stop, and to the rounds of its last stage (or of the last
        # stage of a blend holding it: a live blend grows its parts)
        plain = LambdaMART(**{**kw, **options}).fit(x, y, group=group, position=position, **fit)
        last = max([entry["stage"]] + [scores[b]["stage"] for b, parts in TREE_BLENDS.items() if name in parts])
        stopped_at = len(plain.evals_result_["valid_0"]["ndcg@10"])
        won = name == choice or name in TREE_BLENDS.get(choice, ())
        stopped += stopped_at < ends[last - 1]
        assert raced.count(options["unbiased"]) == (stopped_at if won else min(ends[last - 1], stopped_at))
        for stage in (1, 2):
            staged = LambdaMART(**{**kw, **options, "n_estimators": ends[stage - 1]}).fit(
                x, y, group=group, position=position, **fit)
            kept_at[name, stage] = staged.best_iteration_ + 1
        assert entry["trees"] == kept_at[name, entry["stage"]]
    for blend, parts in TREE_BLENDS.items():  # scored at its parts' kept trees at its own last stage
        assert scores[blend]["trees"] == sum(kept_at[p, scores[blend]["stage"]] for p in parts)
    assert stopped >= (2 if stages else 0)  # the stretched stages see candidates stop inside them


def test_successive_halving_keeps_the_best_of_each_stage_and_reads_old_states():
    """The one race of both families: best two after stage 1, best one after stage 2, ties in
    the candidates' order, a leader between stages; a state written before the shared race
    (plain scores) loads with its stage read from the candidates left."""
    race = SuccessiveHalving(["naive", "a", "b", "c"])
    for name, value in zip(race.alive, (-0.5, -0.3, -0.3, -0.9)):
        race.record(name, value, trees=3)
    assert race.rank(stage_over=False) == "a" and race.alive == ["a", "b", "naive", "c"] and race.stage == 0
    assert race.rank(stage_over=True) == "a" and race.alive == ["a", "b"] and not race.over
    race.record("a", -0.4)
    race.record("b", -0.2)
    assert race.rank(stage_over=True) == "b" and race.alive == ["b"] and race.over
    assert race.scores_["c"] == {"score": -0.9, "stage": 1, "trees": 3} and race.scores_["b"]["stage"] == 2
    assert race.rank(stage_over=True) == "b" and race.stage == 2  # nothing after the last stage
    old = SuccessiveHalving(["naive", "a", "b", "c"])
    old.load_state({"alive": ["a", "b"], "scores": {"a": -0.3, "b": -0.4}, "choice": "a"})
    assert old.stage == 1 and old.scores_["a"]["score"] == -0.3 and old.choice_ == "a"
    again = SuccessiveHalving(["naive", "a", "b", "c"])
    again.load_state(race.state())
    assert again.state() == race.state()


def test_run_advances_scores_and_cuts_each_stage_in_order():
    """SuccessiveHalving.run, the driver LambdaMART's race uses: at each stage end every live
    candidate is advanced, then scored (what it returns beside the score is kept), the stage is
    cut, and report hears the stage, its end and the candidates best first before the cut."""
    quality = {"naive": 0.1, "a": 0.4, "b": 0.3, "c": 0.2}
    calls, reports, grown = [], [], dict.fromkeys(quality, 0)

    def advance(name, end):
        calls.append(("advance", name, end))
        grown[name] = end

    def score(name):
        calls.append(("score", name))
        return quality[name] + (0.5 if name == "b" and grown[name] >= 4 else 0.0), {"trees": grown[name]}

    race = SuccessiveHalving(list(quality))
    assert race.run((2, 4), advance, score, lambda stage, end, ranked: reports.append((stage, end, ranked))) == "b"
    assert calls[:8] == [step for name in quality for step in (("advance", name, 2), ("score", name))]
    assert calls[8:] == [("advance", "a", 4), ("score", "a"), ("advance", "b", 4), ("score", "b")]
    assert reports == [(1, 2, ["a", "b", "c", "naive"]), (2, 4, ["b", "a"])]
    assert race.over and race.choice_ == "b" and race.alive == ["b"]
    assert race.scores_["b"] == {"score": 0.8, "stage": 2, "trees": 4}
    assert race.scores_["c"] == {"score": 0.2, "stage": 1, "trees": 2}
    quiet = SuccessiveHalving(list(quality))
    assert quiet.run((2, 4), advance, score) == "b"  # no report: the same race


def test_the_race_lets_go_of_the_candidates_it_cuts(pbm_logs, monkeypatch):
    """A run no candidate still racing needs is dropped at a stage's end (its scores, gradients
    and, on a GPU, its round's buffers): during stage 2 only the engines of the two kept
    candidates are alive (their runs: a blend's two parts)."""
    import gc
    import weakref

    made, alive_in_stage_2 = [], []
    init, update = BoostingEngine.__init__, BoostingEngine.update

    def recording(engine, *a, **k):
        init(engine, *a, **k)
        made.append(weakref.ref(engine))

    def counting(engine):
        if 2 <= len(engine.trees) < 4:  # stage 2: rounds 2 to 4 (early_stopping_rounds=6: E/3, 2E/3)
            gc.collect()
            alive_in_stage_2.append(sum(ref() is not None for ref in made))
        return update(engine)

    monkeypatch.setattr(BoostingEngine, "__init__", recording)
    monkeypatch.setattr(BoostingEngine, "update", counting)
    train, vali = pbm_logs
    model = LambdaMART(unbiased="auto", n_estimators=8, early_stopping_rounds=6, depth=2, min_data_in_leaf=5,
                       n_positions=8, seed=1).fit(
        train.sessions.features, train.clicks, group=train.sessions.sizes, position=train.position,
        eval_set=[(vali.sessions.features, vali.clicks)], eval_group=[vali.sessions.sizes],
        eval_position=[vali.position])
    kept = [name for name, entry in model.unbiased_scores_.items() if entry["stage"] == 2]
    runs = {p for name in kept for p in TREE_BLENDS.get(name, (name,))}
    assert len(made) == len(TREE_CANDIDATES) > len(runs) and alive_in_stage_2 and max(alive_in_stage_2) == len(runs)
