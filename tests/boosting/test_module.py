"""rankkit.boosting.module: LambdaMARTModule trained by Trainer.fit grows the estimator's trees and
refuses the same bad parameters."""
from __future__ import annotations

import pytest
import torch

from rankkit.boosting import LambdaMART, ObliviousEnsemble

from .conftest import small_set

pytestmark = pytest.mark.usefixtures("one_thread")  # every test here on one thread


# -- Lightning -------------------------------------------------------------------------------------
def test_lambdamart_module_trains_with_trainer_fit(tmp_path):
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint

    from rankkit.boosting import LambdaMARTModule
    from rankkit.training.datamodule import RankingDataModule

    train, vali = small_set(0, n_queries=40), small_set(1, n_queries=20)
    dm = RankingDataModule.from_datasets(train, vali, vali, max_docs=256)
    module = LambdaMARTModule(depth=3, learning_rate=0.3, min_data_in_leaf=3, subsample=0.8,
                              random_strength=0.5)
    checkpoint = ModelCheckpoint(dirpath=tmp_path, monitor="val/ndcg@10", mode="max")
    trainer = pl.Trainer(max_epochs=4, logger=False, enable_progress_bar=True,
                         callbacks=[EarlyStopping("val/ndcg@10", mode="max", patience=10), checkpoint],
                         enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(module, datamodule=dm)
    assert module.scorer.n_trees == 4 and trainer.global_step == 4
    for key in ("val/ndcg@1", "val/ndcg@3", "val/ndcg@5", "val/ndcg@10", "val/map"):
        assert key in trainer.callback_metrics
    restored = LambdaMARTModule.load_from_checkpoint(checkpoint.best_model_path)
    assert restored.scorer.n_trees == int(checkpoint.best_model_path.split("epoch=")[1][0]) + 1
    x = vali.features
    best = restored.scorer.n_trees
    expected = ObliviousEnsemble(x.shape[1], module.scorer.features[:best],
                                 module.scorer.thresholds[:best], module.scorer.leaf_values[:best],
                                 float(module.scorer.bias))(x)
    assert torch.equal(restored(x), expected)


def test_lambdamart_module_random_strength_is_seeded(tmp_path):
    import pytorch_lightning as pl

    from rankkit.boosting import LambdaMARTModule
    from rankkit.training.datamodule import RankingDataModule

    train, vali = small_set(0, n_queries=30), small_set(1, n_queries=10)

    def fit(**kw):
        dm = RankingDataModule.from_datasets(train, vali, vali, max_docs=256)
        module = LambdaMARTModule(depth=3, min_data_in_leaf=3, **kw)
        pl.Trainer(max_epochs=3, logger=False, enable_progress_bar=False,
                   enable_checkpointing=False, enable_model_summary=False,
                   default_root_dir=tmp_path).fit(module, datamodule=dm)
        return module.scorer

    a, b = fit(random_strength=2.0, seed=4), fit(random_strength=2.0, seed=4)
    assert torch.equal(a.features, b.features) and torch.equal(a.leaf_values, b.leaf_values)
    assert not torch.equal(a.features, fit(seed=4).features)
    with pytest.raises(ValueError, match="random_strength"):
        LambdaMARTModule(random_strength=-0.1)


@pytest.mark.parametrize("exact_newton", [False, True])
def test_lambdamart_module_grows_the_estimators_trees(tmp_path, exact_newton):
    # Trainer.fit and LambdaMART.fit share the sampler, the round and the seeding of the
    # generator, so with row and feature sampling on they grow the same trees.
    import pytorch_lightning as pl

    from rankkit.boosting import LambdaMARTModule
    from rankkit.training.datamodule import RankingDataModule

    train, vali = small_set(0, n_queries=40), small_set(1, n_queries=10)
    kw = dict(depth=3, learning_rate=0.3, min_data_in_leaf=3, k=5, normalize=True, subsample=0.7,
              colsample=0.5, bagging_temperature=1.0, exact_newton=exact_newton, seed=3)
    module = LambdaMARTModule(**kw)
    pl.Trainer(max_epochs=5, logger=False, enable_progress_bar=False,
               enable_checkpointing=False, enable_model_summary=False,
               default_root_dir=tmp_path).fit(module, datamodule=RankingDataModule.from_datasets(
                   train, vali, vali, max_docs=256))
    estimator = LambdaMART(n_estimators=5, **kw).fit(train).ensemble_
    for name in ("features", "thresholds", "leaf_values"):
        assert torch.equal(getattr(module.scorer, name), getattr(estimator, name)), name
    assert torch.equal(module.scorer(vali.features), estimator(vali.features))


@pytest.mark.parametrize("bad", [dict(learning_rate=0.0), dict(l2=-1.0), dict(subsample=1.5),
                                 dict(colsample=0.0), dict(max_bins=2), dict(min_data_in_leaf=0),
                                 dict(depth=13), dict(k=0), dict(sigma=-1.0), dict(objective="mse"),
                                 dict(bagging_temperature=float("inf")), dict(min_sum_hessian=float("nan")),
                                 dict(exact_newton=1), dict(objective="pointwise", exact_newton=True)])
def test_estimator_and_module_reject_the_same_bad_parameters(bad):
    from rankkit.boosting import LambdaMARTModule

    name = next(iter(bad))
    with pytest.raises(ValueError, match=name):
        LambdaMART(n_estimators=1, **bad).fit(small_set(n_queries=4))
    with pytest.raises(ValueError, match=name):
        LambdaMARTModule(**bad)


def test_a_click_trained_module_logs_how_well_it_explains_its_validation_clicks(tmp_path):
    """Trained on a click log, the module logs val/click_likelihood: the ClickLikelihood of the
    validation clicks (their positions read through the training log's ids) on its trees."""
    import pytorch_lightning as pl

    from rankkit.boosting import LambdaMARTModule
    from rankkit.clicks.metrics import ClickLikelihood
    from rankkit.data.svmlight import read_svmlight
    from rankkit.training.datamodule import RankingDataModule
    from tests.training.test_datamodule import _click_log

    def fit(folder, **kw):
        model = LambdaMARTModule(depth=3, min_data_in_leaf=5, **kw)
        trainer = pl.Trainer(max_epochs=3, logger=False, enable_progress_bar=False, enable_model_summary=False,
                             enable_checkpointing=False, default_root_dir=tmp_path)
        trainer.fit(model, datamodule=RankingDataModule(str(folder), click_log=True))
        return model, trainer.callback_metrics

    folder = _click_log(tmp_path / "log")
    model, logged = fit(folder, unbiased="ips")
    val = read_svmlight(str(folder / "vali.txt"), position_file=str(folder / "vali.txt.position"))
    criterion = ClickLikelihood(val.features, val.labels.double(), val.sizes, val.position.long(), n_positions=10)
    expected = criterion(lambda f: model.scorer(f).double())
    assert float(logged["val/click_likelihood"]) == pytest.approx(expected, abs=1e-6)  # logged as float32
    shifted, logged_shifted = fit(_click_log(tmp_path / "log1", shift=1), unbiased="ips")  # 1-based ids
    assert float(logged_shifted["val/click_likelihood"]) == float(logged["val/click_likelihood"])
    _, naive = fit(folder)  # not trained on clicks: no click criterion
    assert "val/click_likelihood" not in naive and "val/ndcg@10" in naive


def test_a_lightning_fit_of_the_module_is_governed_like_the_estimators(tmp_path, monkeypatch):
    """Issue 53: the module's rounds give threads up on a busy machine too; the count is back
    after the fit."""
    import pytorch_lightning as pl

    import rankkit.infra.threads as T
    from rankkit.boosting import LambdaMARTModule
    from rankkit.training.datamodule import RankingDataModule

    ticks = []
    monkeypatch.setattr(T.ThreadGovernor, "tick", lambda self: (ticks.append(self), torch.set_num_threads(1)))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        trainer = pl.Trainer(max_epochs=3, logger=False, enable_progress_bar=False, enable_model_summary=False,
                             enable_checkpointing=False, default_root_dir=tmp_path)
        trainer.fit(LambdaMARTModule(depth=2, min_data_in_leaf=3),
                    datamodule=RankingDataModule.from_datasets(small_set(0), small_set(1)))
        assert len(ticks) == 3 and len({id(g) for g in ticks}) == 1  # one governor, ticked each round
        assert torch.get_num_threads() == 2  # restored
        T.tick()
        assert len(ticks) == 3  # ended with the fit
    finally:
        torch.set_num_threads(before)
