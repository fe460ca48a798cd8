"""The plots of ``rankkit compare``: vali NDCG@10 curves and test NDCG@k bars."""
from __future__ import annotations

import statistics
from pathlib import Path

from rankkit.infra.io import atomic_write


def plot(runs: list[dict], out: Path, ks: tuple[int, ...] = (1, 3, 5, 10)) -> list[Path]:
    """``val_ndcg10.png`` (vali NDCG@10 per epoch or tree, one panel per model) and
    ``test_ndcg.png`` (test NDCG@k per model, mean ± std)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in runs))
    fig, axes = plt.subplots(1, len(models), figsize=(4 * len(models), 3.2), squeeze=False)
    for ax, model in zip(axes[0], models):
        mine = [r for r in runs if r["model"] == model]
        for r in mine:
            xs = range(1, len(r["val_curve"]) + 1)
            ax.plot(xs, r["val_curve"], lw=1, alpha=0.8, label=f"fold {r['fold']} seed {r['seed']}")
            if r["val_curve"]:
                ax.plot(r["best_epoch"] + 1, r["val_curve"][r["best_epoch"]], "o", ms=4, color="k")
        ax.set_title(model)
        ax.set_xlabel("epoch" if mine[0].get("kind") == "neural" else "trees")
        ax.grid(alpha=0.3)
        if len(mine) <= 6:
            ax.legend(fontsize=7)
    axes[0][0].set_ylabel("vali NDCG@10")
    fig.tight_layout()
    curves = out / "val_ndcg10.png"
    atomic_write(curves, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))  # never a half-written plot
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(3.2 + 1.2 * len(models), 3.4))
    width = 0.8 / len(models)
    for i, model in enumerate(models):
        mine = [r for r in runs if r["model"] == model]
        means = [statistics.mean(r[f"ndcg@{k}"] for r in mine) for k in ks]
        stds = [statistics.stdev(r[f"ndcg@{k}"] for r in mine) if len(mine) > 1 else 0.0 for k in ks]
        ax.bar([j + i * width for j in range(len(ks))], means, width, yerr=stds, capsize=2, label=model)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(ks))], [f"NDCG@{k}" for k in ks])
    lows = [r[f"ndcg@{k}"] for r in runs for k in ks]
    ax.set_ylim(max(0.0, min(lows) - 0.05), min(1.0, max(lows) + 0.05))
    ax.set_ylabel("test")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))  # beside the bars
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    bars = out / "test_ndcg.png"
    atomic_write(bars, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    plt.close(fig)
    return [curves, bars]
