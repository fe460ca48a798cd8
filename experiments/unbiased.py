"""Learning to rank from simulated clicks (issue 28): naive, debiased and oracle rankers.

    python experiments/unbiased.py --write

For each data set, fold, seed and click model (the protocol of Joachims et al., WSDM 2017; Ai et
al., SIGIR 2018; Hu et al., WWW 2019):

1. a production LambdaMART trained on 1 % of the training queries orders every training and
   validation query;
2. the top 10 are shown ``--sessions`` times per query to a simulated user: position-based
   (examination θ_r = (1/(r+1))^η, η in ``--etas``) or cascade (``--cascade``: scan down, click
   with the attractiveness, stop after a click); attractiveness ε₋ + (1 − ε₋)(2^y − 1)/(2^ymax − 1),
   ε₋ = 0.1; sessions without a click are dropped. The training log trains the rankers; a
   second log, on the VALIDATION queries, is the only thing model selection sees;
3. test NDCG@10 on the test queries' TRUE labels (gain 2^y − 1, log2 discount, a query whose
   labels are all 0 counts 1 as in LightGBM).

Model selection without true labels (the click-log validation split,
:class:`rankkit.clicks.metrics.ClickLogMetric`): regression-EM (Wang et al., WSDM 2018) fitted on the
validation log alone gives the propensities θ̂, the validation clicks become inverse-propensity
relevance estimates (1/θ̂ clipped at ``--clip``), and a candidate's score is its counterfactual
NDCG@10 (linear gain) on the validation documents. It chooses:

* LambdaMART debiased: the bias norm p of Unbiased LambdaMART (Hu et al. 2019, ``unbiased=True``)
  among ``--p-grid``, or no debiasing at all (p = ∞, the exponent 1/(p + 1) → 0 makes every bias
  1: the naive model), so the method can fall back when the log cannot help;
* neural debiased: among LambdaRank naive, LambdaRank ``unbiased=True`` at each p of the grid,
  and regression-EM's relevance model; every neural candidate keeps its best validation epoch
  (EM iteration) by the same metric, the oracle LambdaRank too.

Rows: naive (clicks as labels), the debiased rows above and each candidate, oracle (true
training labels), LightGBM lambdarank naive and with ``position=`` (its position-bias
regularisation at the default), XGBoost ``rank:ndcg`` naive and with ``lambdarank_unbiased``
(documents of a session in displayed order), production (the 1 % ranker). Every run's numbers go
to ``--out`` (JSON lines, one per fold × seed × click model); the table is the mean over the runs
present, so an interrupted grid still reports what ran (and says how many runs each cell has).
"""
from __future__ import annotations

import argparse
import copy
import datetime
import json
import math
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import command_line, publish_image, write_section  # noqa: E402

from rankkit.boosting import LambdaMART  # noqa: E402
from rankkit.data import load_mq2008, make_synthetic, pad  # noqa: E402
from rankkit.training.clicks import production_ranker, production_scores
from rankkit.data.clicks import (
    CascadeModel,
    PositionBasedModel,
    simulate_clicks,
)
from rankkit.metrics import ndcg
from rankkit.neural import LambdaRank
from rankkit.clicks.metrics import ClickLogMetric
from rankkit.clicks.propensity import FixedPropensities, RegressionEM, clicked_positions

K_SHOWN = 10
LAMBDAMART = ("LambdaMART naive", "LambdaMART debiased (selected)", "LambdaMART oracle")
NEURAL = ("LambdaRank naive", "neural debiased (selected)", "LambdaRank oracle")
RIVALS = ("LightGBM naive", "LightGBM position", "XGBoost naive", "XGBoost unbiased", "production")


def load(name: str, fold: int):
    """(train, vali, test, top label) of a data set; the synthetic set's split is drawn per fold, and
    the Yahoo! LTR sample's (LightGBM's lambdarank example: vali = 25 % of its training queries,
    its own test file)."""
    if name == "mq2008":
        return (*load_mq2008(fold), 2.0)
    if name == "synthetic":
        data = make_synthetic(600, (10, 40), 30, seed=100 + fold)
        perm = torch.randperm(data.n_queries, generator=torch.Generator().manual_seed(fold))
        cuts = (int(0.6 * data.n_queries), int(0.8 * data.n_queries))
        parts = (perm[: cuts[0]], perm[cuts[0]: cuts[1]], perm[cuts[1]:])
        return (*(data.subset(p.sort().values) for p in parts), 4.0)
    if name == "yahoo":  # the sample's 201 training queries split 75/25 per fold (as experiments/losses.py)
        from losses import load as load_yahoo

        return (*load_yahoo("yahoo", fold), 4.0)
    raise ValueError(f"`--data` has to name mq2008, synthetic or yahoo, got {name!r}")


def test_ndcg(scores, data) -> float:
    """Mean NDCG@10 (gain 2^y − 1; all-zero queries count 1) of flat scores [N] on the true labels."""
    s, mask = pad(torch.as_tensor(np.asarray(scores), dtype=torch.float32), data.sizes)
    y, _ = pad(data.labels, data.sizes)
    return float(ndcg(s, y, mask=mask, k=10).mean())


# -- the rankers -----------------------------------------------------------------------------------
def booster(args, **kw) -> LambdaMART:
    return LambdaMART(n_estimators=args.rounds, depth=args.depth, learning_rate=0.1, seed=args.seed, **kw)


def boost_predict(model):
    return lambda x: model.predict(x)


def train_lambdarank(train, metric, args, *, unbiased: bool, p: float, epochs: int, propensities=None, **options):
    """LambdaRank in a plain loop; the epoch with the best click-log validation metric is kept.
    ``options``: more of LambdaRank's settings (e.g. ``propensity_clip``). ``propensities``: with
    ``unbiased="ips"``, θ [K_SHOWN] to weigh the pairs by instead of regression-EM's estimate
    (the click model's true examination: the estimator's ceiling)."""
    torch.manual_seed(args.seed)
    module = LambdaRank(n_features=train.n_features, hidden=[32], dropout=0.1, lr=1e-3, weight_decay=1e-5,
                        k=10, reduction="sum", unbiased=unbiased, bias_p=p, n_positions=K_SHOWN, **options)
    module.fit_preprocessor(train.features)
    module.read_click_log(train)  # the position ids; "ips": its propensities
    if propensities is not None:  # indexed by displayed rank: the log's position ids must be 0..K-1 themselves
        debiasing = module.debiasing
        assert torch.equal(debiasing.position_ids.ids.cpu(), torch.arange(K_SHOWN)), debiasing.position_ids
        debiasing.propensity = FixedPropensities(propensities, clip=debiasing.clip,
                                                 used=clicked_positions(train.labels, train.position, K_SHOWN))
        debiasing.costs = debiasing.propensity.costs.clone()
    opt = module.configure_optimizers()
    generator = torch.Generator().manual_seed(args.seed)
    best, best_state = -math.inf, None
    for _ in range(epochs):
        module.train()
        for batch in train.iter_batches(512, shuffle=True, generator=generator):
            loss = module.objective(module.scorer(batch.features), batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
        module.eval()
        score = metric(lambda x: module(x))
        if score > best:
            best, best_state = score, (copy.deepcopy(module.scorer.state_dict()),
                                       None if module.propensity is None else module.propensities["clicked"])
    module.scorer.load_state_dict(best_state[0])
    module.best_propensities = best_state[1]
    module.eval()
    return (lambda x: module(x).detach()), best, module


def train_lambdarank_auto(train, vali, args, *, epochs: int):
    """``LambdaRank(unbiased="auto")`` in a plain loop: the race's candidates train on the same
    batches, and after every epoch ``validate_race`` scores them on the validation click log."""
    torch.manual_seed(args.seed)
    module = LambdaRank(n_features=train.n_features, hidden=[32], dropout=0.1, lr=1e-3, weight_decay=1e-5,
                        k=10, reduction="sum", unbiased="auto", n_positions=K_SHOWN)
    module.fit_preprocessor(train.features)
    module.read_click_log(train)
    opt = module.configure_optimizers()
    generator = torch.Generator().manual_seed(args.seed)
    for epoch in range(epochs):
        module.train()
        for batch in train.iter_batches(512, shuffle=True, generator=generator):
            loss = module.race.loss(batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
        module.validate_race(vali.iter_batches(2048), epoch, epochs)
    module.eval()
    return (lambda x: module(x).detach()), module.unbiased_choice_


def train_oracle(train, test, metrics: dict, args, *, epochs: int) -> dict:
    """LambdaRank on the true labels; per click metric, the test NDCG@10 of the epoch it prefers."""
    torch.manual_seed(args.seed)
    module = LambdaRank(n_features=train.n_features, hidden=[32], dropout=0.1, lr=1e-3, weight_decay=1e-5,
                        k=10, reduction="sum")
    module.fit_preprocessor(train.features)
    opt = module.configure_optimizers()
    generator = torch.Generator().manual_seed(args.seed)
    best = {label: (-math.inf, math.nan) for label in metrics}
    for _ in range(epochs):
        module.train()
        for batch in train.iter_batches(512, shuffle=True, generator=generator):
            loss = module.objective(module.scorer(batch.features), batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
        module.eval()
        with torch.no_grad():
            on_test = test_ndcg(module(test.features), test)
        for label, metric in metrics.items():
            score = metric(lambda x: module(x))
            if score > best[label][0]:
                best[label] = (score, on_test)
    return {label: b[1] for label, b in best.items()}


def train_regression_em(train, log, metric, args):
    """Regression-EM on the training log's (document, position) counts; best validation iteration kept."""
    counts = log.aggregate()
    kept = {"score": -math.inf}

    def keep(model, iteration):
        score = metric(model.predict)
        if score > kept["score"]:
            kept.update(score=score, state=copy.deepcopy(model.scorer_.state_dict()), theta=model.propensities_.clone())

    model = RegressionEM(K_SHOWN, hidden=(32,), iterations=args.em_iterations, lr=1e-2, seed=args.seed)
    model.fit(train.features[counts.doc_index], counts.clicks, counts.position, impressions=counts.impressions,
              callback=keep)
    model.scorer_.load_state_dict(kept["state"])
    return model.predict, kept["score"], kept["theta"]


def train_lightgbm(log, args, *, position: bool):
    import lightgbm as lgb

    x = log.sessions.features.numpy()
    train = lgb.Dataset(x, label=log.clicks.numpy(), group=log.sessions.sizes.numpy(),
                        position=log.position.numpy() if position else None)
    params = {"objective": "lambdarank", "num_leaves": 2 ** args.depth, "learning_rate": 0.1,
              "min_data_in_leaf": 20, "verbosity": -1, "seed": args.seed, "num_threads": args.threads}
    return lgb.train(params, train, num_boost_round=args.rounds)


def train_xgboost(log, args, *, unbiased: bool):
    """XGBoost's lambdarank (``rank:ndcg``, top-10 pairs), with ``lambdarank_unbiased`` or not.

    Its position model reads each document's position from its order inside the query, so the
    rows must be sorted by position within a session: ``ClickLog.sessions`` stores every session
    in displayed order already (checked here).
    """
    import xgboost as xgb

    starts = log.sessions.offsets[:-1].repeat_interleave(log.sessions.sizes)
    if not torch.equal(log.position, torch.arange(log.sessions.n_docs) - starts):
        raise AssertionError("sessions are not in displayed order")
    qid = log.sessions.doc_query_index().numpy()
    train = xgb.DMatrix(log.sessions.features.numpy(), label=log.clicks.numpy(), qid=qid)
    params = {"objective": "rank:ndcg", "lambdarank_pair_method": "topk", "lambdarank_num_pair_per_sample": K_SHOWN,
              "lambdarank_unbiased": unbiased, "eta": 0.1, "max_depth": args.depth, "tree_method": "hist",
              "min_child_weight": 1e-3, "seed": args.seed, "nthread": args.threads}
    return xgb.train(params, train, num_boost_round=args.rounds)


# -- one run: data set × fold × seed × click model -------------------------------------------------
def click_models(args, top):
    out = [(f"PBM η={eta:g}", PositionBasedModel(eta=eta, epsilon_plus=1.0, epsilon_minus=0.1, max_label=top))
           for eta in args.etas]
    if args.cascade:
        out.append(("cascade", CascadeModel(stop=1.0, epsilon_plus=1.0, epsilon_minus=0.1, max_label=top)))
    return out


def click_logs(train, vali, prod_train, prod_vali, model, sessions: int, seed: int):
    """(training log, validation log): ``model``'s clicks on the production ranker's top
    :data:`K_SHOWN` of every training and validation query, ``sessions`` a query, sessions
    without a click dropped; seeded by ``seed`` (the validation log by ``seed`` + 1000)."""
    log = simulate_clicks(train, prod_train, model=model, sessions_per_query=sessions, k=K_SHOWN, seed=seed,
                          drop_unclicked=True)
    vlog = simulate_clicks(vali, prod_vali, model=model, sessions_per_query=sessions, k=K_SHOWN, seed=seed + 1000,
                           drop_unclicked=True)
    return log, vlog


def run(name: str, fold: int, seed: int, args, done: set):
    """Yields one record per click model of (data set, fold, seed) not in ``done``."""
    import xgboost as xgb

    args.seed = seed
    todo = [(label, model) for label, model in click_models(args, 4.0) if (name, fold, seed, label) not in done]
    if not todo:
        return
    train, vali, test, top = load(name, fold)
    t0 = time.perf_counter()
    prod = production_ranker(train, fraction=0.01, n_estimators=50, depth=3, min_data_in_leaf=5, seed=seed)
    prod_train, prod_vali = production_scores(prod, train), production_scores(prod, vali)
    oracle_mart = test_ndcg(booster(args).fit(train).predict(test), test)
    production = test_ndcg(prod.predict(test), test)
    x_test = test.features.numpy()
    logs, vlog_of = {}, {}
    for label, model in click_models(args, top):
        if (name, fold, seed, label) in done:
            continue
        log, vlog = click_logs(train, vali, prod_train, prod_vali, model, args.sessions, seed)
        metric = ClickLogMetric(vlog.aggregate(), vali.features, n_positions=K_SHOWN, clip=args.clip,
                                em={"hidden": (16,), "iterations": args.em_iterations, "lr": 1e-2, "seed": seed})
        logs[label] = (model, log, metric)
        vlog_of[label] = vlog
    # the neural oracle: as many documents seen as a click-log fit, its epoch chosen by each click metric
    epochs = math.ceil(args.log_epochs * np.mean([log.sessions.n_docs for _, log, _ in logs.values()]) / train.n_docs)
    if args.neural:
        oracle_neural = train_oracle(train, test, {label: m for label, (_, _, m) in logs.items()}, args,
                                     epochs=epochs)
    print(f"{name} fold {fold} seed {seed}: oracles in {time.perf_counter() - t0:.0f}s ({epochs} neural epochs)",
          file=sys.stderr, flush=True)
    for label, (model, log, metric) in logs.items():
        t0 = time.perf_counter()
        test_rows, vali_rows, chosen, biases = {"production": production, "LambdaMART oracle": oracle_mart}, {}, {}, {}
        fit_seconds = {}
        if args.trees:
            # LambdaMART: naive = p ∞, debiased at each p, the best on the click-log vali
            t_fit = time.perf_counter()
            naive = booster(args).fit(log.sessions.features, log.clicks, group=log.sessions.sizes)
            fit_seconds["naive"] = time.perf_counter() - t_fit
            candidates = {"naive": naive}
            for p in args.p_grid:
                candidates[f"p={p:g}"] = booster(args, unbiased=True, bias_p=p, n_positions=K_SHOWN).fit(
                    log.sessions.features, log.clicks, group=log.sessions.sizes, position=log.position)
                biases[f"LambdaMART p={p:g}"] = candidates[f"p={p:g}"].propensities_["clicked"].tolist()
            for key, m in candidates.items():
                test_rows[f"LambdaMART {key}"] = test_ndcg(m.predict(test), test)
                vali_rows[f"LambdaMART {key}"] = metric(boost_predict(m))
            best = max(candidates, key=lambda key: vali_rows[f"LambdaMART {key}"])
            test_rows["LambdaMART debiased (selected)"] = test_rows[f"LambdaMART {best}"]
            chosen["LambdaMART"] = best
            # the estimator's own choices: LightGBM's position model, IPS by regression-EM, and the race
            for mode in ("position", "ips"):
                t_fit = time.perf_counter()
                m = booster(args, unbiased=mode, n_positions=K_SHOWN).fit(
                    log.sessions.features, log.clicks, group=log.sessions.sizes, position=log.position)
                fit_seconds[mode] = time.perf_counter() - t_fit
                test_rows[f"LambdaMART {mode}"] = test_ndcg(m.predict(test), test)
            t_fit = time.perf_counter()
            auto = booster(args, unbiased="auto", n_positions=K_SHOWN).fit(
                log.sessions.features, log.clicks, group=log.sessions.sizes, position=log.position,
                eval_set=[(vlog_of[label].sessions.features, vlog_of[label].clicks)],
                eval_group=[vlog_of[label].sessions.sizes], eval_position=[vlog_of[label].position])
            fit_seconds["auto"] = time.perf_counter() - t_fit
            test_rows["LambdaMART auto"] = test_ndcg(auto.predict(test), test)
            chosen["LambdaMART auto"] = auto.unbiased_choice_
        if args.neural:  # LambdaRank naive / unbiased at each p, regression-EM; oracle tuned the same way
            neural = {}
            for key, unbiased, p in [("naive", False, 0.0)] + [(f"p={p:g}", True, p) for p in args.neural_p_grid]:
                t_fit = time.perf_counter()
                f, score, module = train_lambdarank(log.sessions, metric, args, unbiased=unbiased, p=p,
                                                    epochs=args.log_epochs)
                fit_seconds[f"LambdaRank {key}"] = time.perf_counter() - t_fit
                neural[f"LambdaRank {key}"] = (f, score)
                if unbiased:
                    biases[f"LambdaRank {key}"] = module.best_propensities.tolist()
            f, score, theta = train_regression_em(train, log, metric, args)
            neural["regression-EM"] = (f, score)
            biases["regression-EM"] = theta.tolist()
            biases["vali EM (metric)"] = metric.propensities.tolist()
            for key, (f, score) in neural.items():
                test_rows[key] = test_ndcg(f(test.features), test)
                vali_rows[key] = score
            best = max(neural, key=lambda key: neural[key][1])
            test_rows["neural debiased (selected)"] = test_rows[best]
            chosen["neural"] = best
            test_rows["LambdaRank oracle"] = oracle_neural[label]
            # the module's own choices: the joint position bias, DLA, and the race
            for mode in ("position", "dla", "ips"):
                t_fit = time.perf_counter()
                f, _, module = train_lambdarank(log.sessions, metric, args, unbiased=mode, p=1.0,
                                                epochs=args.log_epochs)
                fit_seconds[f"LambdaRank {mode}"] = time.perf_counter() - t_fit
                test_rows[f"LambdaRank {mode}"] = test_ndcg(f(test.features), test)
            t_fit = time.perf_counter()
            f, choice = train_lambdarank_auto(log.sessions, vlog_of[label].sessions, args, epochs=args.log_epochs)
            fit_seconds["LambdaRank auto"] = time.perf_counter() - t_fit
            test_rows["LambdaRank auto"] = test_ndcg(f(test.features), test)
            chosen["LambdaRank auto"] = choice
        if args.trees:
            # LightGBM / XGBoost, fixed settings
            for position in (False, True):
                test_rows[f"LightGBM {'position' if position else 'naive'}"] = test_ndcg(
                    train_lightgbm(log, args, position=position).predict(x_test), test)
            for debias in (False, True):
                test_rows[f"XGBoost {'unbiased' if debias else 'naive'}"] = test_ndcg(
                    train_xgboost(log, args, unbiased=debias).predict(xgb.DMatrix(x_test)), test)
        if isinstance(model, PositionBasedModel):
            biases["true"] = (model.examination(K_SHOWN) / model.examination(K_SHOWN)[0]).tolist()
        record = {"data": name, "fold": fold, "seed": seed, "click": label, "date": datetime.date.today().isoformat(),
                  "sessions": log.n_sessions,
                  "test": test_rows, "vali": vali_rows, "chosen": chosen, "biases": biases,
                  "fit_seconds": {k: round(v, 2) for k, v in fit_seconds.items()},
                  "seconds": round(time.perf_counter() - t0, 1)}
        print(f"{name} fold {fold} seed {seed} {label}: {record['seconds']}s, chosen {chosen}, "
              + ", ".join(f"{k} {v:.4f}" for k, v in test_rows.items()), file=sys.stderr, flush=True)
        yield record


# -- report ----------------------------------------------------------------------------------------
def rows_of(p_grid, neural_p_grid) -> list[str]:
    ps = [f"p={p:g}" for p in p_grid]
    return (["LambdaMART naive"] + [f"LambdaMART {p}" for p in ps]
            + ["LambdaMART position", "LambdaMART ips", "LambdaMART auto", "LambdaMART debiased (selected)",
               "LambdaMART oracle"]
            + ["LambdaRank naive"] + [f"LambdaRank p={p:g}" for p in neural_p_grid]
            + ["regression-EM", "LambdaRank position", "LambdaRank dla", "LambdaRank ips", "LambdaRank auto",
               "neural debiased (selected)", "LambdaRank oracle"] + list(RIVALS))


def grid_arguments(p: argparse.ArgumentParser, *, data: str = "mq2008,synthetic", etas: str = "0.5,1,2") -> None:
    """The options of the click grid that every script on its logs takes (experiments/click_criteria.py,
    ips_clip.py): data sets, click models, folds, seeds, the log's sessions and the boosters' size."""
    p.add_argument("--data", default=data)
    p.add_argument("--etas", default=etas, help="position-based models' η")
    p.add_argument("--no-cascade", dest="cascade", action="store_false", help="leave out the cascade model")
    p.add_argument("--folds", default="1-5", help="folds, e.g. 1 or 1-5")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--sessions", type=int, default=40, help="sessions per query")
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--depth", type=int, default=4)


def fold_range(folds: str) -> list[int]:
    """``"1-5"`` -> [1, 2, 3, 4, 5]; ``"2"`` -> [2]."""
    lo, _, hi = folds.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def run_keys(records) -> set:
    """The (data, fold, seed, click model) of each run: what a resumed grid does not run again."""
    return {(r["data"], r["fold"], r["seed"], r["click"]) for r in records}


def load_records(paths: list[str]) -> list[dict]:
    """The runs of every file in ``paths``, merged per (data, fold, seed, click model): a run
    of the trees and a run of the neural rankers on the same log make one record."""
    merged: dict = {}
    for path in paths:
        if not os.path.exists(path):
            continue
        for line in open(path):
            r = json.loads(line)
            key = (r["data"], r["fold"], r["seed"], r["click"])
            if key not in merged:
                merged[key] = r
                continue
            into = merged[key]
            for field in ("test", "vali", "chosen", "biases", "fit_seconds"):
                into.setdefault(field, {}).update(r.get(field, {}))
            into["seconds"] = into.get("seconds", 0) + r.get("seconds", 0)
    return list(merged.values())


def summarise(records: list[dict]) -> dict:
    """{data: {click: {"n": runs, method: (mean, standard error, runs)}}} over the runs present."""
    out: dict = {}
    for r in records:
        out.setdefault(r["data"], {}).setdefault(r["click"], []).append(r)
    summary = {}
    for name, by_click in out.items():
        summary[name] = {}
        for click, runs in by_click.items():
            cell = {"n": len(runs), "chosen": {}, "cost": {}}
            methods = dict.fromkeys(m for run in runs for m in run["test"])
            for method in methods:
                v = np.array([run["test"][method] for run in runs if method in run["test"]])
                se = float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else math.nan
                cell[method] = (float(v.mean()), se, len(v))
            for kind in ("LambdaMART auto", "LambdaRank auto", "LambdaMART", "neural"):
                picks = [run["chosen"][kind] for run in runs if kind in run.get("chosen", {})]
                if picks:
                    cell["chosen"][kind] = {k: picks.count(k) for k in sorted(set(picks))}
            for kind, auto, naive in (("LambdaMART", "auto", "naive"),
                                      ("LambdaRank", "LambdaRank auto", "LambdaRank naive")):
                ratios = [run["fit_seconds"][auto] / run["fit_seconds"][naive] for run in runs
                          if auto in run.get("fit_seconds", {}) and naive in run.get("fit_seconds", {})]
                if ratios:
                    cell["cost"][kind] = float(np.median(ratios))
            summary[name][click] = cell
    return summary


def click_order(clicks) -> list[str]:
    return sorted(clicks, key=lambda c: (c == "cascade", float(c.split("=")[1]) if "=" in c else 0.0))


def table(summary: dict, p_grid, neural_p_grid) -> str:
    out = []
    for name, by_click in summary.items():
        clicks = click_order(by_click)
        out.append(f"**{name}** (test NDCG@10 on true labels, mean ± standard error over runs; runs: "
                   + ", ".join(f"{c} {by_click[c]['n']}" for c in clicks) + ")\n")
        out.append("| method | " + " | ".join(clicks) + " |\n|---|" + "---:|" * len(clicks))
        for method in rows_of(p_grid, neural_p_grid):
            if not any(method in by_click[c] for c in clicks):
                continue
            cells = []
            for c in clicks:
                mean, se, n = by_click[c].get(method, (math.nan, math.nan, 0))
                runs = "" if n == by_click[c]["n"] else f" ({n} runs)"
                cells.append((f"{mean:.4f} ± {se:.4f}" if not math.isnan(se) else f"{mean:.4f}") + runs)
            bold = "**" if "selected" in method else ""
            out.append(f"| {bold}{method}{bold} | " + " | ".join(cells) + " |")
        for kind in ("LambdaMART auto", "LambdaRank auto", "LambdaMART", "neural"):
            if any(kind in by_click[c]["chosen"] for c in clicks):
                label = (f"{kind} chose" if kind.endswith("auto") else
                         f"chosen on click vali by the counterfactual NDCG ({kind})")
                out.append(f"| {label} | " + " | ".join(", ".join(
                    f"{k} ×{v}" for k, v in by_click[c]["chosen"].get(kind, {}).items()) for c in clicks) + " |")
        for kind in ("LambdaMART", "LambdaRank"):
            if any(kind in by_click[c]["cost"] for c in clicks):
                out.append(f"| {kind} auto's fit time / naive's (median) | " + " | ".join(
                    f"{by_click[c]['cost'][kind]:.1f}×" if kind in by_click[c]["cost"] else "" for c in clicks) + " |")
        out.append("")
    return "\n".join(out)


def targets(summary: dict) -> list[str]:
    """At PBM η = 1 and 2: selected ≥ naive + 0.01 and ≥ half the naive → oracle gap; never below naive."""
    out = []
    pairs = (("LambdaMART auto", "LambdaMART naive", "LambdaMART auto", "LambdaMART oracle"),
             ("LambdaRank auto", "LambdaRank naive", "LambdaRank auto", "LambdaRank oracle"),
             ("LambdaMART", "LambdaMART naive", "LambdaMART debiased (selected)", "LambdaMART oracle"),
             ("neural", "LambdaRank naive", "neural debiased (selected)", "LambdaRank oracle"))
    for name, by_click in summary.items():
        for click in click_order(by_click):
            cell = by_click[click]
            for auto_key in ("LambdaMART auto", "LambdaRank auto"):
                if auto_key in cell and "LightGBM position" in cell:
                    auto, lgb = cell[auto_key][0], cell["LightGBM position"][0]
                    out.append(f"{name}, {click}, {auto_key} − LightGBM position = {auto - lgb:+.4f} "
                               f"(≥ 0 {'met' if auto >= lgb else 'MISSED'}; {cell[auto_key][2]} runs)")
            for kind, naive_key, sel_key, oracle_key in pairs:
                if sel_key not in cell or naive_key not in cell or oracle_key not in cell:
                    continue
                naive, sel, oracle = cell[naive_key][0], cell[sel_key][0], cell[oracle_key][0]
                gain, gap = sel - naive, oracle - naive
                share = gain / gap if gap > 0 else math.nan
                strict = click in ("PBM η=1", "PBM η=2")
                verdict = (f"≥ +0.01 {'met' if gain >= 0.01 else 'MISSED'}; ≥ 50 % "
                           f"{'met' if share >= 0.5 else 'MISSED'}; " if strict else "")
                out.append(f"{name}, {click}, {kind}: selected − naive = {gain:+.4f}, gap closed {share:.0%} of "
                           f"{gap:+.4f} ({verdict}never below naive {'met' if gain >= 0 else 'MISSED'}; "
                           f"{cell[sel_key][2]} runs)")
    return out


def mean_biases(records: list[dict]) -> dict:
    """{data: {click: {curve: mean [K]}}} over the PBM runs."""
    acc: dict = {}
    for r in records:
        if "true" not in r["biases"]:
            continue
        for curve, values in r["biases"].items():
            acc.setdefault(r["data"], {}).setdefault(r["click"], {}).setdefault(curve, []).append(values)
    return {n: {c: {k: np.mean(v, axis=0).tolist() for k, v in by.items()} for c, by in bc.items()}
            for n, bc in acc.items()}


def plot(summary: dict, biases: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(biases)
    fig, axes = plt.subplots(1, max(1, len(names)), figsize=(7 * max(1, len(names)), 4.6), squeeze=False)
    styles = {"true": "-", "LambdaMART p=0": "o--", "LambdaMART p=1": "s--", "LambdaRank p=0": "x:",
              "LambdaRank p=1": "+:", "regression-EM": "d-.", "vali EM (metric)": "^-."}
    for i, name in enumerate(names):
        ax = axes[0, i]
        for j, click in enumerate(click_order(biases[name])):
            for curve, values in biases[name][click].items():
                ax.plot(np.arange(1, len(values) + 1), values, styles.get(curve, "-"), color=f"C{j}",
                        label=f"{curve}, {click}", alpha=1.0 if curve == "true" else 0.75)
        ax.set(title=f"{name}: learned propensity vs truth θ_r/θ_1 (mean over runs)", xlabel="displayed rank",
               ylabel="propensity relative to rank 1", yscale="log")
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def bias_table(biases: dict) -> str:
    lines = ["| data | click | curve | ranks 1-10 |", "|---|---|---|---|"]
    for name, by_click in biases.items():
        for click in click_order(by_click):
            for curve, values in by_click[click].items():
                lines.append(f"| {name} | {click} | {curve} | " + ", ".join(f"{v:.2f}" for v in values) + " |")
    return "\n".join(lines)


def write(records: list[dict], args, command: str) -> None:
    summary, biases = summarise(records), mean_biases(records)
    tmp = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "results")
    os.makedirs(tmp, exist_ok=True)
    png = os.path.join(tmp, f"{args.section}.png")
    plot(summary, biases, png)
    image = publish_image(png, f"{args.section}.png")
    seconds = sum(r["seconds"] for r in records)
    grid = sorted({(r["data"], r["fold"], r["seed"]) for r in records})
    body = f"""## {args.title}

{args.date or max((r["date"] for r in records if "date" in r), default=datetime.date.today().isoformat())}, 2 shared CPU cores (x86_64, {args.threads} thread), {seconds / 60:.0f} min of runs. Command: `{command}`
(results in `{"`, `".join(args.paths)}`, one JSON line per run; `--report-only --write` rebuilds this section from them).

Protocol (experiments/unbiased.py's docstring): production LambdaMART on 1 % of the training queries; its top 10
shown {args.sessions} times per query; clicks from a position-based model (examination (1/(r+1))^η) or a cascade
(stop after the first click), attractiveness 0.1 + 0.9 (2^y − 1)/(2^ymax − 1); sessions without a click dropped.
**Test metric**: NDCG@10 on the test queries' true labels, gain 2^y − 1, log2 discount, all-zero queries count 1
(LightGBM's convention). **Model selection uses no true label**: a second click log on the validation queries,
propensities from regression-EM on that log alone, inverse-propensity relevance (1/θ̂ clipped at {args.clip:g}),
counterfactual NDCG@10 of each candidate (linear gain). LambdaMART debiased = the best of naive (p = ∞) and
Unbiased LambdaMART at p ∈ {{{", ".join(f"{p:g}" for p in args.p_grid)}}}; neural debiased = the best of
LambdaRank naive, unbiased LambdaRank at p ∈ {{{", ".join(f"{p:g}" for p in args.neural_p_grid)}}} and regression-EM
(Wang et al. 2018) — each neural candidate and the LambdaRank oracle keep their best epoch by the same click metric. Boosters (rankkit, LightGBM, XGBoost):
{args.rounds} rounds, depth {args.depth}, learning rate 0.1; LambdaRank MLP [32], Adam 1e-3 (the position models of
`"position"` and `"dla"` at `position_lr`'s default, 1e-2, since 2026-12-06: at 1e-3 they hardly moved), {args.log_epochs}
epochs over a click log, and over the true labels as many epochs as see the same number of documents; regression-EM MLP [32], {args.em_iterations} iterations.
**LambdaMART auto** is `LambdaMART(unbiased="auto")`, one `fit` given the training log and the
validation click log (`eval_set`, `eval_group`, `eval_position`): it races naive, Unbiased LambdaMART p = 1,
`unbiased="position"` (an additive position bias learned with the trees, as LightGBM's `position=`) and
`unbiased="ips"` (regression-EM propensities on the training log, θ̂₀/θ̂ clipped by `propensity_clip`'s default: a
fixed 10 until 2026-12-05, since then `"auto"`, 3 √r with r the log's largest θ̂₀/θ̂ at a clicked position), and since
2026-12-05 the mean of the last two's scores (`"position+ips"`, `TREE_BLENDS`), by successive halving, and
keeps the candidate whose scores best explain the validation clicks once each position has its own offset
(`rankkit.clicks.metrics.ClickLikelihood`, which assumes no click model). **LambdaRank auto** is
`LambdaRank(unbiased="auto")` in the same loop as the other LambdaRank rows: naive, unbiased p = 0,
`"position"`, `"dla"` (the Dual Learning Algorithm) and `"ips"` (regression-EM propensities on the training log,
1/θ̂ clipped at 10; added 2026-11-28) trained side by side, and since 2026-12-06 the means of two networks' scores
`"pairwise p=0+ips"` and `"dla+ips"` (`NEURAL_BLENDS`, raced on networks that train anyway), the race decided after epochs 1 and 2
by the same criterion (`validate_race`); "LambdaRank position", "LambdaRank dla" and "LambdaRank ips" keep their
best epoch by the counterfactual NDCG as the other LambdaRank rows. "LambdaMART debiased (selected)" and "neural debiased
(selected)" are the previous round's procedure (the counterfactual NDCG above, among naive, the p grid and
regression-EM), kept for comparison. Fit times are wall-clock seconds of the auto fit over the naive fit of the
same family in the same run (2 shared cores; the neural naive fit includes its per-epoch click metric).
The results files' JSON lines are merged per (data, fold, seed, click model): the trees and the neural rankers
may come from separate processes of this script (`--no-neural`, `--no-trees`) on the same logs, which the same
seeds draw.
Data: MQ2008 folds; synthetic = 600 queries of 10-40 documents, 30 features, a fresh 60/20/20 split per fold;
yahoo = LightGBM's Yahoo! LTR sample (201 training queries, 300 features, grades 0-4), a fresh 75/25
train/vali split of its training queries per fold, its 50 test queries.
Runs present: {len(grid)} (data, fold, seed) triples: {", ".join(f"{d}/f{f}/s{s}" for d, f, s in grid)}.

{table(summary, args.p_grid, args.neural_p_grid)}

Targets (issues 28 and 38; "selected" and "auto" against the same family's naive and oracle, and auto against
LightGBM's `position=`):

""" + "\n".join(f"* {t}" for t in targets(summary)) + f"""

{image}

Learned propensities against the truth (mean over runs; LambdaMART/LambdaRank: the click bias t⁺; regression-EM:
θ̂_r / θ̂_1 on the training log; "vali EM": the validation metric's propensities):

{bias_table(biases)}
"""
    write_section(args.section, body)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    grid_arguments(p)
    p.add_argument("--log-epochs", type=int, default=3, help="LambdaRank epochs over a click log")
    p.add_argument("--em-iterations", type=int, default=15)
    p.add_argument("--p-grid", default="0,1", help="Unbiased LambdaMART / LambdaRank bias norms to choose from")
    p.add_argument("--neural-p-grid", default="0", help="the same for unbiased LambdaRank")
    p.add_argument("--clip", type=float, default=50.0, help="the validation metric's clip of 1/θ̂")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-neural", dest="neural", action="store_false",
                   help="leave out the neural rankers (LambdaRank, regression-EM)")
    p.add_argument("--no-trees", dest="trees", action="store_false",
                   help="leave out the boosters (rankkit's LambdaMART candidates, LightGBM, XGBoost)")
    p.add_argument("--minutes", type=float, default=math.inf, help="start no new run after this many minutes")
    p.add_argument("--out", default="results/unbiased.jsonl",
                   help="JSON lines of the runs; new runs are appended to the first of a comma-separated list, "
                        "and the report merges them all")
    p.add_argument("--report-only", action="store_true", help="tabulate --out without running")
    p.add_argument("--write", action="store_true", help="write docs/benchmarks.md and docs/img/SECTION.png")
    p.add_argument("--date", default=None,
                   help="the date the runs were made (default: the newest a record holds, else today)")
    p.add_argument("--title", default="Learning from clicks", help="the section's title")
    p.add_argument("--section", default="unbiased",
                   help="the docs/benchmarks.md section (and docs/img/SECTION.png) --write replaces")
    args = p.parse_args(argv)
    command = command_line(__file__, argv)
    args.etas = [float(v) for v in args.etas.split(",")]
    args.p_grid = [float(v) for v in args.p_grid.split(",")]
    args.neural_p_grid = [float(v) for v in args.neural_p_grid.split(",")]
    folds = fold_range(args.folds)
    seeds = [int(v) for v in args.seeds.split(",")]
    torch.set_num_threads(args.threads)
    paths = args.paths = args.out.split(",")
    args.out = paths[0]  # new runs go to the first file; the report merges all of them
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    records = [json.loads(line) for line in open(args.out)] if os.path.exists(args.out) else []
    if not args.report_only:
        done = run_keys(records)
        start = time.perf_counter()
        for seed in seeds:
            for fold in folds:
                for name in args.data.split(","):
                    if (time.perf_counter() - start) / 60 > args.minutes:
                        break
                    for record in run(name, fold, seed, args, done):
                        records.append(record)
                        with open(args.out, "a") as f:  # appended run by run: an interrupted grid keeps its runs
                            f.write(json.dumps(record) + "\n")
    records = [r for r in load_records(paths) if r["data"] in args.data.split(",")]
    if not records:  # never replace a table by an empty one (the result files are not in git)
        print(f"no runs in {', '.join(paths)}: nothing to tabulate (run the grid first)", file=sys.stderr)
        return 2
    summary = summarise(records)
    print(table(summary, args.p_grid, args.neural_p_grid))
    print("\n".join(targets(summary)))
    if args.write:
        write(records, args, command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
