"""Shrinkage study: LambdaMART with learning rates 1.0, 0.5, 0.1 and 0.01 on MQ2008.

As in the "LambdaMART Demystified" slides (Tunys, "LambdaMART Demystified", 2015): train and vali NDCG@10 against
the number of trees for each shrinkage η -- a large η fits the training set fastest and peaks
early on vali, a small one needs many more trees -- plus how the lambdas |λ_i| evolve over the
rounds for each relevance label: the booster's scores after m trees go through
:func:`rankkit.lambdas.lambda_gradients` (the kernel the booster itself trains on), and we
plot the median and quartiles of |λ_i| by label.

    python experiments/shrinkage.py --fold 1 --trees 500 --write

writes results/shrinkage/{shrinkage.png, lambdas.png, shrinkage.json}; ``--write`` replaces
the ``shrinkage`` section of docs/benchmarks.md. Every other setting is that of
configs/lambdamart.yaml.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import command_line, publish_image, write_section  # noqa: E402

from rankkit.boosting import LambdaMART, ObliviousEnsemble
from rankkit.data.bundled import load_mq2008
from rankkit.lambdas import lambda_gradients

ROOT = Path(__file__).resolve().parents[1]
LEARNING_RATES = (1.0, 0.5, 0.1, 0.01)
BOOSTER_ARGS = ("objective", "depth", "l2", "min_data_in_leaf", "weighting", "k", "sigma", "gain", "normalize",
                "subsample", "colsample")


def tuned_booster_settings() -> dict:
    """The LambdaMART settings of configs/lambdamart.yaml that the estimator shares."""
    config = yaml.safe_load((ROOT / "configs" / "lambdamart.yaml").read_text())
    init = config["model"]["init_args"]
    return {k: init[k] for k in BOOSTER_ARGS if k in init}


def lambda_rounds(n_trees: int, points: int = 16) -> list[int]:
    """Rounds (trees grown) at which the |λ| are taken: 0 and a geometric spread up to n_trees.

    >>> lambda_rounds(100, points=5)
    [0, 1, 3, 10, 32, 100]
    """
    grid = {round(n_trees ** (i / (points - 1))) for i in range(points)}
    return [0] + sorted(g for g in grid if 1 <= g <= n_trees)


def first_trees(e: ObliviousEnsemble, m: int) -> ObliviousEnsemble:
    """The ensemble of the first m trees (the booster's model after round m)."""
    return ObliviousEnsemble(e.n_features, e.features[:m], e.thresholds[:m], e.leaf_values[:m], float(e.bias))


def lambdas_by_label(ensemble: ObliviousEnsemble, train, rounds: list[int], settings: dict) -> dict:
    """Quartiles of |λ_i| per relevance label after each round in ``rounds``."""
    batch = train.padded()
    labels, mask = batch.labels.double(), batch.mask
    grades = sorted({int(v) for v in train.labels.unique()})
    out = {str(g): {"q25": [], "median": [], "q75": [], "mean": []} for g in grades}
    for m in rounds:
        with torch.no_grad():
            scores = first_trees(ensemble, m)(batch.features.reshape(-1, train.n_features)).double()
        grad, _ = lambda_gradients(scores.reshape(labels.shape), labels, mask=mask,
                                   weighting=settings.get("weighting", "ndcg"), k=settings.get("k"))
        size = grad.abs()
        for g in grades:
            v = size[mask & (labels == g)]
            q = torch.quantile(v, torch.tensor([0.25, 0.5, 0.75], dtype=v.dtype))
            for name, value in zip(("q25", "median", "q75"), q.tolist()):
                out[str(g)][name].append(value)
            out[str(g)]["mean"].append(float(v.mean()))
    return out


def run(fold: int, n_trees: int, learning_rates=LEARNING_RATES, seed: int = 0) -> dict:
    train, vali, test = load_mq2008(fold)
    settings = tuned_booster_settings()
    rounds = lambda_rounds(n_trees)
    result = {"fold": fold, "trees": n_trees, "settings": settings, "lambda_rounds": rounds, "runs": {}}
    for lr in learning_rates:
        t0 = time.perf_counter()
        model = LambdaMART(**settings, learning_rate=lr, n_estimators=n_trees, seed=seed,
                           eval_metric="ndcg@10").fit(train, eval_set=[train, vali, test])
        seconds = time.perf_counter() - t0
        curves = {name: model.evals_result_[key]["ndcg@10"]
                  for name, key in zip(("train", "vali", "test"), ("valid_0", "valid_1", "valid_2"))}
        best = max(range(len(curves["vali"])), key=curves["vali"].__getitem__)
        result["runs"][str(lr)] = {
            "seconds": seconds, "curves": curves, "best_vali_round": best + 1,
            "best_vali_ndcg@10": curves["vali"][best], "test_ndcg@10_at_best": curves["test"][best],
            "lambdas": lambdas_by_label(model.ensemble_, train, rounds, settings),
        }
        print(f"η = {lr}: {seconds:.0f} s, best vali NDCG@10 {curves['vali'][best]:.4f} at tree {best + 1}, "
              f"test there {curves['test'][best]:.4f}, train at the end {curves['train'][-1]:.4f}", flush=True)
    return result


def plot(result: dict, out: Path) -> list[Path]:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    runs = result["runs"]
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (lr, r) in enumerate(runs.items()):
        color = f"C{i}"
        xs = range(1, len(r["curves"]["train"]) + 1)
        ax.plot(xs, r["curves"]["train"], color=color, ls="--", lw=1)
        ax.plot(xs, r["curves"]["vali"], color=color, lw=1.5, label=f"η = {lr}")
        ax.plot(r["best_vali_round"], r["best_vali_ndcg@10"], "o", color=color, ms=4)
    ax.set_xscale("log")
    ax.set_xlabel("trees")
    ax.set_ylabel("NDCG@10 (dashed: train, solid: vali)")
    ax.set_title(f"LambdaMART shrinkage, MQ2008 fold {result['fold']}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    curves = out / "shrinkage.png"
    fig.savefig(curves, dpi=120)
    plt.close(fig)

    rounds = result["lambda_rounds"]
    xs = [max(m, 0.5) for m in rounds]  # round 0 (no tree yet) drawn at 0.5 on the log axis
    fig, axes = plt.subplots(1, len(runs), figsize=(3.4 * len(runs), 3.2), sharey=True, squeeze=False)
    for ax, (lr, r) in zip(axes[0], runs.items()):
        for j, (label, q) in enumerate(r["lambdas"].items()):
            ax.plot(xs, q["median"], color=f"C{j}", label=f"label {label}")
            ax.fill_between(xs, q["q25"], q["q75"], color=f"C{j}", alpha=0.2)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_yscale("symlog", linthresh=1e-4)
        ax.set_title(f"η = {lr}")
        ax.set_xlabel("trees")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("|λ_i| (median, quartiles)")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    lambdas = out / "lambdas.png"
    fig.savefig(lambdas, dpi=120)
    plt.close(fig)
    return [curves, lambdas]


def table(result: dict) -> str:
    lines = ["| η | best vali NDCG@10 | at tree | test NDCG@10 there | train NDCG@10 at the end | seconds |",
             "|---:|---:|---:|---:|---:|---:|"]
    for lr, r in result["runs"].items():
        lines.append(f"| {lr} | {r['best_vali_ndcg@10']:.4f} | {r['best_vali_round']} | "
                     f"{r['test_ndcg@10_at_best']:.4f} | {r['curves']['train'][-1]:.4f} | {r['seconds']:.0f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fold", type=int, default=1, choices=range(1, 6))
    p.add_argument("--trees", type=int, default=500, help="trees per learning rate (no early stopping)")
    p.add_argument("--out", default=str(ROOT / "results" / "shrinkage"))
    p.add_argument("--write", action="store_true", help="write the table to docs/benchmarks.md")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = run(args.fold, args.trees)
    (out / "shrinkage.json").write_text(json.dumps(result, indent=1))
    plots = plot(result, out)
    md = table(result)
    print(md)
    print("wrote", ", ".join(str(x) for x in [out / "shrinkage.json", *plots]))
    if args.write:
        cmd = command_line(__file__, argv)
        body = (f"## LambdaMART shrinkage (MQ2008 fold {args.fold})\n\n"
                f"{datetime.date.today()}, CPU ({platform.processor() or platform.machine()}, "
                f"{torch.get_num_threads()} threads), torch {torch.__version__}. Command: `{cmd}`\n\n"
                f"{args.trees} trees per learning rate, no early stopping; the other settings are those of "
                f"configs/lambdamart.yaml. NDCG@10 with exp gain, empty queries = 1.\n\n{md}\n\n"
                f"Train and vali NDCG@10 against trees:\n\n{publish_image(plots[0], 'shrinkage.png')}\n\n"
                f"|λ| by relevance label over training:\n\n"
                f"{publish_image(plots[1], 'shrinkage_lambdas.png')}\n")
        write_section("shrinkage", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
