"""Data-parallel LambdaMART: 2 processes (gloo), each with a shard of whole queries, grow the
trees of one process on all the data, bit for bit (quantized gradients: integer histograms and
fixed-point leaf sums), from the estimator and from Lightning's DDP."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from rankkit.boosting import LambdaMART
from rankkit.data import make_synthetic
from rankkit.data.dataset import shard_queries

ROOT = Path(__file__).resolve().parents[2]
KW = dict(n_estimators=6, depth=3, min_data_in_leaf=3, learning_rate=0.3, quantized_grad=True, k=5,
          normalize=True, colsample=0.8, exact_newton=True, early_stopping_rounds=3, seed=2)


def data():
    return make_synthetic(41, (3, 15), 6, seed=3), make_synthetic(13, (3, 15), 6, seed=4)


def run_ranks(script: str, tmp_path: Path) -> None:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(script))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(path),
           str(tmp_path)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_shards_are_contiguous_whole_queries():
    parts = [list(shard_queries(41, r, 3)) for r in range(3)]
    assert sum(parts, []) == list(range(41)) and [len(p) for p in parts] == [14, 14, 13]


@pytest.mark.slow
def test_two_processes_grow_the_single_process_trees(tmp_path):
    run_ranks(f"""
        import sys, torch, torch.distributed as dist
        sys.path.insert(0, {str(ROOT / "tests")!r})
        from boosting.test_distributed import KW, data
        from rankkit.boosting import LambdaMART
        from rankkit.boosting.distributed import shard
        dist.init_process_group("gloo")
        torch.set_num_threads(1)
        train, vali = data()
        model = LambdaMART(**KW).fit(shard(train), eval_set=[shard(vali)])
        model.save(f"{{sys.argv[1]}}/rank{{dist.get_rank()}}.safetensors")
        dist.destroy_process_group()
    """, tmp_path)
    train, vali = data()
    single = LambdaMART(**KW).fit(train, eval_set=[vali])
    assert single.ensemble_.n_trees >= 3
    for rank in (0, 1):
        dp = LambdaMART.load(tmp_path / f"rank{rank}.safetensors")
        for name in ("features", "thresholds", "leaf_values", "bias"):
            assert torch.equal(getattr(dp.ensemble_, name), getattr(single.ensemble_, name)), (rank, name)
        assert dp.best_iteration_ == single.best_iteration_
        torch.testing.assert_close(torch.tensor(dp.evals_result_["valid_0"]["ndcg@10"]),
                                   torch.tensor(single.evals_result_["valid_0"]["ndcg@10"]), rtol=1e-12, atol=1e-12)


@pytest.mark.slow
def test_lambdamart_module_under_lightning_ddp_grows_the_single_process_trees(tmp_path):
    kw = {k: v for k, v in KW.items() if k not in ("n_estimators", "early_stopping_rounds")}
    run_ranks(f"""
        import os, sys, torch, pytorch_lightning as pl
        sys.path.insert(0, {str(ROOT / "tests")!r})
        from boosting.test_distributed import KW, data
        from rankkit.boosting import LambdaMARTModule
        from rankkit.training.datamodule import RankingDataModule
        torch.set_num_threads(1)
        train, vali = data()
        kw = {kw!r}
        module = LambdaMARTModule(**kw)
        trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=4, logger=False,
                             enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
                             default_root_dir=sys.argv[1])
        trainer.fit(module, datamodule=RankingDataModule.from_datasets(train, vali, max_docs=256))
        e = module.scorer
        torch.save({{"features": e.features, "thresholds": e.thresholds, "leaf_values": e.leaf_values,
                    "val": float(trainer.callback_metrics["val/ndcg@10"])}},
                   f"{{sys.argv[1]}}/rank{{trainer.global_rank}}.pt")
        # both files written: exit without C++ static destructors (a live gloo thread can abort there)
        trainer.strategy.barrier()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    """, tmp_path)
    train, vali = data()
    single = LambdaMART(n_estimators=4, **kw).fit(train).ensemble_
    for rank in (0, 1):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        for name in ("features", "thresholds", "leaf_values"):
            assert torch.equal(got[name], getattr(single, name)), (rank, name)
    from rankkit.metrics import ndcg

    batch = vali.padded()
    expected = float(ndcg(single(batch.features.reshape(-1, 6)).reshape(batch.mask.shape), batch.labels,
                          mask=batch.mask, k=10).double().mean())
    assert abs(got["val"] - expected) < 1e-6  # the synced val NDCG@10 of every rank's shard
