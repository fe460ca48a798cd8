"""Neural rankers against LambdaMART on MQ2008 (5 folds x seeds) and LightGBM's Yahoo sample.

Issue 27's experiment. Every setting below trains on the train set, keeps the epoch (tree) with
the best vali NDCG@10, and is scored on test with the same metric code as ``rankkit compare``
(:class:`rankkit.compare.protocol.Evaluator`: NDCG@10 with the exponential gain 2^rel − 1, a
query with nothing relevant scores 1). Model selection uses vali only: the "selected" row of
each data set is the neural setting with the best mean vali NDCG@10, whatever its test score.
Each neural setting also gets a seed ensemble (the mean score of its seeds' scorers, one
:class:`rankkit.neural.MeanEnsemble`: ``rankkit compare --ensemble``), one per fold.

The Yahoo sample (``../shared/data/lightgbm-lambdarank``: rank.train 201 queries, rank.test 50,
no vali) gets a fixed vali split: 20 % of the train queries drawn with seed 0.

    nice python experiments/neural_parity.py --folds 1-5 --seeds 3 --max-epochs 30 --write

Results go to ``results/neural_parity.json`` after every run (a rerun skips the runs already
there, so an interrupted run resumes); ``--write`` puts the table into docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import command_line, write_section  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
# ../shared/data beside the checkout (a worktree one level deeper finds it one level up).
YAHOO = next((p for p in (os.path.join(ROOT, *[".."] * up, "shared", "data", "lightgbm-lambdarank") for up in (1, 2))
              if os.path.isdir(p)), os.path.join(ROOT, "..", "shared", "data", "lightgbm-lambdarank"))
RESULTS = os.path.join(ROOT, "results", "neural_parity.json")

# LambdaMART: the shipped config (configs/lambdamart.yaml) and the best of issue 27's grid.
TREES = {
    "LambdaMART (shipped: depth 6, lr 0.1)": dict(learning_rate=0.1),
    "LambdaMART (depth 6, lr 0.05)": dict(learning_rate=0.05),
}
MLP = dict(hidden=[64, 32], dropout=0.1, lr=1e-3, weight_decay=1e-5, weighting="ndcg", k=10, reduction="sum")
TRANSFORMER = dict(MLP, architecture="transformer", hidden=[64], heads=4, layers=2, latent_cross=True)
NEURAL = {
    "LambdaRank MLP (standard encoding)": MLP,
    "LambdaRank MLP + noise 0.1": dict(MLP, noise=0.1),
    "Transformer LambdaRank": TRANSFORMER,
    "Transformer LambdaRank + noise 0.1": dict(TRANSFORMER, noise=0.1),
    "Transformer softmax + noise 0.1": dict(TRANSFORMER, noise=0.1, loss="softmax", k=None, weighting="ndcg"),
    "Transformer NeuralNDCG + noise 0.1": dict(TRANSFORMER, noise=0.1, loss="neural_ndcg", k=None),
    "LambdaRank MLP (piecewise encoding)": dict(MLP, encoding="piecewise"),
    "Transformer LambdaRank (piecewise encoding)": dict(TRANSFORMER, encoding="piecewise"),
    "Transformer NeuralNDCG (piecewise encoding)": dict(TRANSFORMER, encoding="piecewise", loss="neural_ndcg", k=None),
}
MAX_DOCS, PATIENCE = 512, 8


def datasets(name: str, fold: int):
    if name == "mq2008":
        from rankkit.data.bundled import load_mq2008

        return load_mq2008(fold)
    from rankkit.data.svmlight import read_svmlight

    train = read_svmlight(os.path.join(YAHOO, "rank.train"))
    test = read_svmlight(os.path.join(YAHOO, "rank.test"), n_features=train.n_features)
    order = torch.randperm(train.n_queries, generator=torch.Generator().manual_seed(0))
    n_val = train.n_queries // 5
    return train.subset(order[n_val:].sort().values), train.subset(order[:n_val].sort().values), test


def run_trees(options: dict, train, vali, test_eval, val_eval) -> dict:
    from rankkit.boosting import LambdaMART

    t0 = time.perf_counter()
    model = LambdaMART(weighting="ndcg", k=10, depth=6, l2=1.0, min_data_in_leaf=20, normalize=True,
                       n_estimators=2000, early_stopping_rounds=50, seed=0, **options)
    model.fit(train, eval_set=[vali])
    seconds = time.perf_counter() - t0
    scorer = model.ensemble_
    with torch.no_grad():
        test_scores = scorer(test_eval.dataset.features).reshape(-1)
        val_scores = scorer(val_eval.dataset.features).reshape(-1)
    return {"val_ndcg@10": val_eval.ndcg10(val_scores), "test_ndcg@10": test_eval.ndcg10(test_scores),
            "seconds": seconds, "best": model.best_iteration_ + 1}, None


def run_neural(options: dict, train, vali, test_eval, val_eval, seed: int, max_epochs: int, workdir: str):
    import pytorch_lightning as pl

    from rankkit.training.datamodule import RankingDataModule
    from rankkit.neural import LambdaRank
    from rankkit.serving import as_scorer, score_queries

    pl.seed_everything(seed, verbose=False)
    model = LambdaRank(n_features=train.n_features, **options)
    ckpt = pl.callbacks.ModelCheckpoint(monitor="val/ndcg@10", mode="max", dirpath=workdir)
    stop = pl.callbacks.EarlyStopping(monitor="val/ndcg@10", mode="max", patience=PATIENCE)
    trainer = pl.Trainer(max_epochs=max_epochs, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[ckpt, stop], default_root_dir=workdir,
                         deterministic=True)
    t0 = time.perf_counter()
    trainer.fit(model, datamodule=RankingDataModule.from_datasets(train, vali, max_docs=MAX_DOCS, seed=seed))
    seconds = time.perf_counter() - t0
    best = LambdaRank.load_from_checkpoint(ckpt.best_model_path, map_location="cpu", weights_only=True).eval()
    os.unlink(ckpt.best_model_path)
    scorer = best.serving_scorer()
    score = as_scorer(scorer)
    val_scores = score_queries(score, val_eval.dataset.features, val_eval.dataset.sizes)
    test_scores = score_queries(score, test_eval.dataset.features, test_eval.dataset.sizes)
    return {"val_ndcg@10": val_eval.ndcg10(val_scores), "test_ndcg@10": test_eval.ndcg10(test_scores),
            "seconds": seconds, "best": int(re.search(r"epoch=(\d+)", ckpt.best_model_path).group(1)) + 1,
            "epochs": trainer.current_epoch}, scorer


def ensemble_row(scorers, test_eval, val_eval) -> dict:
    from rankkit.neural import MeanEnsemble
    from rankkit.serving import as_scorer, score_queries

    score = as_scorer(MeanEnsemble(scorers).eval())
    return {"val_ndcg@10": val_eval.ndcg10(score_queries(score, val_eval.dataset.features, val_eval.dataset.sizes)),
            "test_ndcg@10": test_eval.ndcg10(score_queries(score, test_eval.dataset.features,
                                                           test_eval.dataset.sizes))}


def epoch_times(repeats: int = 3) -> dict:
    """Seconds of one training epoch (MQ2008 fold 1, batches of 512 documents) of the MLP and the
    transformer LambdaRank, measured alternately ``repeats`` times; the median of each."""
    import pytorch_lightning as pl

    from rankkit.data.bundled import load_mq2008
    from rankkit.training.datamodule import RankingDataModule
    from rankkit.neural import LambdaRank

    train, vali, _ = load_mq2008(1)
    times: dict = {"LambdaRank MLP (standard encoding)": [], "Transformer LambdaRank + noise 0.1": []}
    for _ in range(repeats):
        for name in times:
            pl.seed_everything(0, verbose=False)
            model = LambdaRank(n_features=train.n_features, **NEURAL[name])
            model.fit_preprocessor(train.features)
            trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_progress_bar=False,
                                 enable_model_summary=False, enable_checkpointing=False, limit_val_batches=0)
            dm = RankingDataModule.from_datasets(train, vali, max_docs=MAX_DOCS)
            t0 = time.perf_counter()
            trainer.fit(model, datamodule=dm)
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(v) for name, v in times.items()}


def load_results(path: str = RESULTS) -> dict:
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return {"runs": []}


def save_results(results: dict, path: str = RESULTS) -> None:
    from rankkit.infra.io import atomic_write

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            json.dump(results, f, indent=1)

    atomic_write(path, write)


def merged(paths: list[str]) -> dict:
    """The runs and commands of several results files (runs split over processes) in one."""
    out: dict = {"runs": [], "commands": []}
    seen = set()
    for path in paths:
        part = load_results(path)
        for r in part["runs"]:
            key = (r["data"], r["fold"], r["seed"], r["setting"])
            if key not in seen:
                seen.add(key)
                out["runs"].append(r)
        out["commands"] += part.get("commands", [])
        for key in ("environment", "epoch_seconds"):
            if part.get(key) and not out.get(key):
                out[key] = part[key]
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="mq2008,yahoo")
    p.add_argument("--folds", default="1-5")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--max-epochs", type=int, default=30)
    p.add_argument("--settings", default="", help="comma-separated substrings of the setting names to run")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--write", action="store_true", help="write the table into docs/benchmarks.md")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--epoch-time", action="store_true", help="time one epoch of the MLP and the transformer")
    p.add_argument("--results", default=RESULTS, help="the results file of this process")
    p.add_argument("--merge", default="", help="comma-separated further results files for the report")
    p.add_argument("--section", default="neural_parity", help="the docs/benchmarks.md section to write")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    import logging

    for name in ("pytorch_lightning", "lightning.pytorch", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    from rankkit.compare.protocol import Evaluator, parse_folds

    results = load_results(args.results)
    if args.epoch_time:
        results["epoch_seconds"] = epoch_times()
        results.setdefault("commands", []).append({"command": command_line(__file__, argv, prefix="nice python"),
                                                   "date": datetime.date.today().isoformat()})
        save_results(results, args.results)
        print(results["epoch_seconds"])
        return
    done = {(r["data"], r["fold"], r["seed"], r["setting"]) for r in results["runs"]}
    wanted = [s.strip() for s in args.settings.split(",") if s.strip()]
    chosen = lambda name: not wanted or any(w in name for w in wanted)  # noqa: E731
    command = command_line(__file__, argv, prefix="nice python")
    if not args.report_only:
        results.setdefault("commands", []).append({"command": command, "date": datetime.date.today().isoformat()})
        # Setting by setting (each over every fold and seed), so that a run cut short leaves whole
        # comparisons rather than every setting on a few folds.
        cache: dict = {}

        def fold_data(data, fold):
            if (data, fold) not in cache:
                train, vali, test = datasets(data, fold)
                max_label = max(1.0, float(train.labels.max()))
                cache[data, fold] = (train, vali, Evaluator(test, max_label), Evaluator(vali, max_label))
            return cache[data, fold]

        for data in args.data.split(","):
            folds = parse_folds(args.folds) if data == "mq2008" else [1]
            for name in [n for n in (*TREES, *NEURAL) if chosen(n)]:
                for fold in folds:
                    train, vali, test_eval, val_eval = fold_data(data, fold)
                    if name in TREES:
                        if (data, fold, 0, name) not in done:
                            row, _ = run_trees(TREES[name], train, vali, test_eval, val_eval)
                            results["runs"].append({"data": data, "fold": fold, "seed": 0, "setting": name, **row})
                            save_results(results, args.results)
                            print(f"{data} fold {fold} {name}: {row}", flush=True)
                        continue
                    scorers = []
                    for seed in range(args.seeds):
                        if (data, fold, seed, name) in done:
                            continue
                        with tempfile.TemporaryDirectory() as work:
                            row, scorer = run_neural(NEURAL[name], train, vali, test_eval, val_eval, seed,
                                                     args.max_epochs, work)
                        scorers.append(scorer)
                        results["runs"].append({"data": data, "fold": fold, "seed": seed, "setting": name, **row})
                        save_results(results, args.results)
                        print(f"{data} fold {fold} seed {seed} {name}: {row}", flush=True)
                    if len(scorers) == args.seeds > 1 and (data, fold, "ensemble", name) not in done:
                        row = ensemble_row(scorers, test_eval, val_eval)
                        results["runs"].append({"data": data, "fold": fold, "seed": "ensemble",
                                                "setting": name, **row})
                        save_results(results, args.results)
                        print(f"{data} fold {fold} ensemble {name}: {row}", flush=True)
        results["environment"] = {"python": platform.python_version(), "torch": torch.__version__,
                                  "cpus": os.cpu_count(), "threads": torch.get_num_threads()}
        save_results(results, args.results)
    if args.merge:
        results = merged([args.results, *[m for m in args.merge.split(",") if m]])
    report = markdown(results, encoding=args.section != "neural_parity")
    print(report)
    if args.write:
        write_section(args.section, report)


def _cell(values: list[float]) -> str:
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


ENCODING_NOTE = (
    "The \"piecewise encoding\" settings code each feature by its place among 16 quantiles of the training "
    "documents (`encoding=\"piecewise\"`, rankkit.scorers.PiecewiseLinearEncoder), what configs/lambdarank.yaml "
    "and configs/transformer.yaml ship since 2026-12-06; \"standard encoding\" is the signed log1p and "
    "standardisation they shipped before (the transformer with noise σ = 0.1). 40 epochs at most (the configs'). "
    "The Yahoo sample has 50 test queries: a difference of 0.01 there is within one seed's spread.")
OLD_NOTE = (
    "Not covered (2026-11-26, the session's time ran out; the first runs at load ≈ 16 on 2 cores): "
    "LambdaMART depth 6 / lr 0.05 (issue 27's earlier figure: 0.7880), the transformer without noise "
    "and with softmax on MQ2008, and the NeuralNDCG transformer on MQ2008 (started; one NeuralNDCG "
    "run of 50 Sinkhorn rounds per batch took 368 s against about 120 s for the LambdaRank transformer; its one "
    "finished run, fold 1 seed 0: vali 0.7767, test 0.8071, against LambdaMART fold 1 test 0.8141). The epoch cap "
    "was 20 (the configs say 40). The Yahoo sample has 50 test queries: its differences of 0.01 "
    "are within one seed's spread. Settings tried are exactly the rows above.")


def markdown(results: dict, *, encoding: bool = False) -> str:
    runs = results["runs"]
    commands = "; ".join(f"`{c['command']}` ({c['date']})" for c in results.get("commands", []))
    env = results.get("environment", {})
    title = ("## The piecewise-linear encoding: neural rankers against LambdaMART (issue 50)" if encoding
             else "## Neural rankers against LambdaMART (issue 27)")
    lines = [title, "",
             f"Command(s): {commands}. CPU, {env.get('threads', '?')} torch threads on a machine shared "
             f"with other jobs (times are indicative only), torch {env.get('torch', '?')}.", "",
             "NDCG@10 with the exponential gain 2^rel − 1 (queries with nothing relevant score 1), the "
             "metric code of `rankkit compare`; mean ± std over folds × seeds (MQ2008) or seeds (Yahoo "
             "sample). Every setting keeps its epoch / tree count with the best vali NDCG@10 "
             "(neural: early stopping patience 8 within the epoch cap; LambdaMART: 50 rounds, up to "
             "2000 trees, deterministic, so one run per fold). \"ensemble\" rows average the seeds' "
             "scorers (one MeanEnsemble per fold). The **selected** neural setting is the one with the "
             "best mean vali NDCG@10; its test score is the one to compare.", ""]
    epoch = results.get("epoch_seconds")
    if epoch:
        mlp, tr = epoch["LambdaRank MLP (standard encoding)"], epoch["Transformer LambdaRank + noise 0.1"]
        lines += [f"One training epoch on MQ2008 fold 1 (`--epoch-time`: median of 3, alternating, 2 torch "
                  f"threads, one Trainer.fit of one epoch each, start-up included, at load ≈ 16 on 2 cores): "
                  f"MLP {mlp:.2f} s, transformer {tr:.2f} s, ratio {tr / mlp:.2f}× (target ≤ 3×: not shown met). "
                  f"Not a clean measurement: in the runs above (1 thread) a whole transformer run of about 14 "
                  f"epochs took about 120 s; rerun on a quiet machine.", ""]
    for data in dict.fromkeys(r["data"] for r in runs):
        mine = [r for r in runs if r["data"] == data]
        lines += [f"### {data}", "", "| setting | runs | vali NDCG@10 | test NDCG@10 | train s / run | best epoch / trees |",
                  "|---|---:|---:|---:|---:|---:|"]
        rows = {}
        for name in dict.fromkeys(r["setting"] for r in mine):
            for kind in ("single", "ensemble"):
                sel = [r for r in mine if r["setting"] == name and (r["seed"] == "ensemble") == (kind == "ensemble")]
                if not sel:
                    continue
                label = name if kind == "single" else f"{name}, seed ensemble"
                val = [r["val_ndcg@10"] for r in sel]
                rows[label] = (name in TREES, statistics.mean(val))
                secs = [r["seconds"] for r in sel if "seconds" in r]
                best = [r["best"] for r in sel if "best" in r]
                lines.append(f"| {label} | {len(sel)} | {_cell(val)} | {_cell([r['test_ndcg@10'] for r in sel])} | "
                             f"{statistics.mean(secs):.1f} | {statistics.mean(best):.0f} |" if secs else
                             f"| {label} | {len(sel)} | {_cell(val)} | {_cell([r['test_ndcg@10'] for r in sel])} | – | – |")
        neural = {k: v for k, (is_tree, v) in rows.items() if not is_tree}
        trees = {k: v for k, (is_tree, v) in rows.items() if is_tree}
        if neural and trees:
            pick, best_tree = max(neural, key=neural.get), max(trees, key=trees.get)
            test = {label: statistics.mean(r["test_ndcg@10"] for r in mine if r["setting"] == label.split(", seed")[0]
                                           and (r["seed"] == "ensemble") == label.endswith("ensemble"))
                    for label in (pick, best_tree)}
            verdict = "meets" if test[pick] >= test[best_tree] else "misses"
            lines += ["", f"Selected on vali: **{pick}** (test {test[pick]:.4f}) against the vali-best "
                          f"LambdaMART **{best_tree}** (test {test[best_tree]:.4f}): the neural side "
                          f"**{verdict}** the target (≥ LambdaMART), by {test[pick] - test[best_tree]:+.4f}."]
        lines.append("")
    lines += [ENCODING_NOTE if encoding else OLD_NOTE, ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
