"""rankkit.boosting.module: a resumed fit with sampling grows the trees of a straight run."""
from __future__ import annotations

import torch

from rankkit.data import make_synthetic


def test_a_resumed_lambdamart_module_with_sampling_grows_the_straight_runs_trees(tmp_path):
    """2 + 2 epochs from a checkpoint grew other trees than 4 straight (subsample 0.8): round m's
    draws now depend on (seed, m) alone."""
    import pytorch_lightning as pl

    from rankkit.boosting import LambdaMARTModule
    from rankkit.training.datamodule import RankingDataModule

    train, val = make_synthetic(40, (3, 20), 6, seed=0), make_synthetic(10, (3, 20), 6, seed=1)

    def fit(epochs, root, ckpt=None):
        pl.seed_everything(0, verbose=False)
        module = LambdaMARTModule(depth=3, min_data_in_leaf=3, subsample=0.8, colsample=0.7,
                                  bagging_temperature=1.0, random_strength=0.5, objective="xendcg")
        pl.Trainer(max_epochs=epochs, accelerator="cpu", logger=False, enable_progress_bar=False,
                   enable_model_summary=False, num_sanity_val_steps=0,
                   callbacks=[pl.callbacks.ModelCheckpoint(dirpath=root, save_last=True)]).fit(
            module, datamodule=RankingDataModule.from_datasets(train, val, max_docs=256), ckpt_path=ckpt)
        return module.scorer

    straight = fit(4, tmp_path / "a")
    fit(2, tmp_path / "b")
    resumed = fit(4, tmp_path / "b", str(tmp_path / "b" / "last.ckpt"))
    assert straight.n_trees == resumed.n_trees == 4
    assert torch.equal(straight.features, resumed.features)
    assert torch.equal(straight.thresholds, resumed.thresholds)
    torch.testing.assert_close(straight.leaf_values, resumed.leaf_values, atol=1e-6, rtol=0)
