"""rankkit.compare.plots: the two PNGs of `rankkit compare`, written whole, from the runs' records."""
import pytest

from rankkit.compare.plots import plot

pytest.importorskip("matplotlib")


def _runs():
    runs = []
    for model, kind, base in [("RankNet", "neural", 0.6), ("LambdaMART", "trees", 0.7)]:
        for fold, seed in [(1, 0), (1, 1), (2, 0)]:
            curve = [base + 0.01 * i * (-1) ** i for i in range(6)]
            runs.append({"model": model, "kind": kind, "fold": fold, "seed": seed, "val_curve": curve,
                         "best_epoch": max(range(6), key=curve.__getitem__),
                         **{f"ndcg@{k}": base + 0.01 * k + 0.001 * seed for k in (1, 3, 5, 10)}})
    return runs


def test_the_plots_are_whole_pngs_and_nothing_else_is_left(tmp_path):
    paths = plot(_runs(), tmp_path)
    assert [p.name for p in paths] == ["val_ndcg10.png", "test_ndcg.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["test_ndcg.png", "val_ndcg10.png"]  # no temporaries
    for p in paths:
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[-8:-4] == b"IEND" and len(data) > 5000


def test_one_run_per_model_and_an_empty_curve_still_plot(tmp_path):
    runs = [r for r in _runs() if r["seed"] == 0 and r["fold"] == 1]
    runs[0] = {**runs[0], "val_curve": [], "best_epoch": 0}
    assert all(p.exists() for p in plot(runs, tmp_path, ks=(10,)))


def test_a_failed_save_leaves_the_previous_plot(tmp_path, monkeypatch):
    plot(_runs(), tmp_path)
    before = (tmp_path / "val_ndcg10.png").read_bytes()
    import matplotlib.figure

    def broken(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", broken)
    with pytest.raises(OSError, match="disk full"):
        plot(_runs(), tmp_path)
    assert (tmp_path / "val_ndcg10.png").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["test_ndcg.png", "val_ndcg10.png"]
