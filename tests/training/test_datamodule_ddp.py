"""Sharding of the query batches across ranks and what DDP reduces.

In-process tests build each rank's :class:`QueryBatchSampler` with an explicit rank and world
size. The two multi-process tests run 2 CPU processes on gloo in a subprocess: a plain
``torch.distributed`` one under ``torchrun`` (the datamodule reads the rank from
``torch.distributed``), and a Lightning ``Trainer(devices=2, strategy="ddp")`` one whose logged
val NDCG@10 is checked against a single-process evaluation of the weights it ends with.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from rankkit.data import make_synthetic
from rankkit.training.datamodule import QueryBatchSampler, RankingDataModule
from rankkit.metrics import ndcg, ranking_metrics
from rankkit.neural import LambdaRank
from rankkit.scorers import FeaturePreprocessor

# The data every multi-process script builds too (the scripts import nothing from this file).
DATA = "make_synthetic(61, (2, 16), 5, seed=4)"


def _run(args: list[str], timeout: float = 120) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]


def _parts(dataset, world: int, *, max_docs: int, train: bool, epoch: int = 0, seed: int = 0):
    """Every rank's batches for one epoch, as lists of query indices."""
    parts = []
    for rank in range(world):
        sampler = QueryBatchSampler(dataset, max_docs, shuffle=train, seed=seed, num_replicas=world, rank=rank,
                                    even=train)
        sampler.set_epoch(epoch)
        parts.append([b.tolist() for b in sampler])
        assert len(parts[-1]) == len(sampler)
    return parts


# -- one process, every rank's sampler built by hand -------------------------------------------
@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("n_queries,max_docs", [(61, 48), (61, 2000), (7, 64), (5, 1)])
def test_training_parts_are_disjoint_cover_every_query_and_have_equal_counts(world, n_queries, max_docs):
    ds = make_synthetic(n_queries, (2, 16), 3, seed=1)
    parts = _parts(ds, world, max_docs=max_docs, train=True, epoch=2)
    assert len({len(p) for p in parts}) == 1  # the same number of steps on every rank
    seen = [q for p in parts for b in p for q in b]
    assert sorted(set(seen)) == list(range(n_queries))
    whole = ds.bucket_batches(max_docs)
    if n_queries >= world * -(-len(whole) // world):
        # enough queries to halve batches up to a multiple of the world size: nothing repeats
        assert sorted(seen) == list(range(n_queries))
    else:
        # every batch is a single query: the first ones repeat, as DistributedSampler pads
        assert all(len(b) == 1 for p in parts for b in p)
        assert len(seen) == world * -(-n_queries // world)
    sizes = ds.sizes
    assert all(len(b) * int(sizes[b].max()) <= max(max_docs, int(sizes[b].max())) for p in parts for b in p)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("n_queries,max_docs", [(61, 48), (7, 64), (5, 1), (2, 64)])
def test_evaluation_parts_count_every_query_exactly_once(world, n_queries, max_docs):
    ds = make_synthetic(n_queries, (2, 16), 3, seed=1)
    parts = _parts(ds, world, max_docs=max_docs, train=False)
    seen = [q for p in parts for b in p for q in b]
    assert sorted(seen) == list(range(n_queries))
    # every rank runs at least one batch (an empty one when there are fewer queries than
    # ranks), so every rank joins the metrics' all-reduce
    assert all(len(p) >= 1 for p in parts)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_one_rank_is_the_single_process_plan_and_epochs_reshuffle():
    ds = make_synthetic(61, (2, 16), 3, seed=1)
    g = torch.Generator().manual_seed(5 * 100_003 + 3)
    expected = [b.tolist() for b in ds.bucket_batches(48, shuffle=True, generator=g)]
    assert _parts(ds, 1, max_docs=48, train=True, epoch=3, seed=5) == [expected]
    assert _parts(ds, 2, max_docs=48, train=True, epoch=3, seed=5) == _parts(ds, 2, max_docs=48, train=True,
                                                                           epoch=3, seed=5)
    assert _parts(ds, 2, max_docs=48, train=True, epoch=3, seed=5) != _parts(ds, 2, max_docs=48, train=True,
                                                                           epoch=4, seed=5)


def test_datamodule_takes_rank_and_world_size_from_the_trainer():
    class Trainer:  # what the datamodule reads of a Lightning trainer
        global_rank, world_size, current_epoch, lightning_module = 1, 2, 0, None

    ds = make_synthetic(61, (2, 16), 3, seed=1)
    dm = RankingDataModule.from_datasets(ds, ds, max_docs=48)
    dm.trainer = Trainer()
    ours = [b.query_index.tolist() for b in dm.train_dataloader()]
    assert ours == _parts(ds, 2, max_docs=48, train=True)[1]
    assert [b.query_index.tolist() for b in dm.val_dataloader()] == _parts(ds, 2, max_docs=48, train=False)[1]


# -- 2 processes, plain torch.distributed --------------------------------------------------------
TORCHRUN_SCRIPT = f"""
import json, sys
import torch
import torch.distributed as dist
from rankkit.data import make_synthetic
from rankkit.training.datamodule import RankingDataModule
from rankkit.scorers import FeaturePreprocessor, PiecewiseLinearEncoder

dist.init_process_group("gloo")
data = {DATA}
dm = RankingDataModule.from_datasets(data.subset(range(45)), data.subset(range(45, 61)), max_docs=40, seed=7)
loader = dm.train_dataloader()
epochs = []
for epoch in range(3):
    loader.sampler.set_epoch(epoch)
    epochs.append([b.query_index.tolist() for b in loader])
val = [b.query_index.tolist() for b in dm.val_dataloader()]
reduce = lambda t: (dist.all_reduce(t), t)[1]
pre = FeaturePreprocessor(5).fit_stream(lambda: (b.features[b.mask] for b in loader), reduce=reduce)
ple = PiecewiseLinearEncoder(5, bins=4).fit_stream(lambda: (b.features[b.mask] for b in loader), reduce=reduce)
local = PiecewiseLinearEncoder(5, bins=4).fit(torch.cat([b.features[b.mask] for b in loader]))
out = {{"rank": dist.get_rank(), "world": dist.get_world_size(), "len": len(loader), "epochs": epochs,
       "val": val, "mean": pre.mean.tolist(), "std": pre.std.tolist(), "edges": ple.edges.tolist(),
       "local_edges": local.edges.tolist(), "rows": sum(int(b.mask.sum()) for b in loader)}}
with open(f"{{sys.argv[1]}}/rank{{dist.get_rank()}}.json", "w") as f:
    json.dump(out, f)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_torchrun_two_processes_shard_the_queries(tmp_path):
    script = tmp_path / "shard.py"
    script.write_text(TORCHRUN_SCRIPT)
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
          str(script), str(tmp_path)])
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["world"] == 2 for r in ranks)
    for epoch in range(3):
        a, b = ([q for batch in r["epochs"][epoch] for q in batch] for r in ranks)
        assert len(ranks[0]["epochs"][epoch]) == len(ranks[1]["epochs"][epoch]) == ranks[0]["len"] == ranks[1]["len"]
        assert not set(a) & set(b)  # disjoint
        assert sorted(a + b) == list(range(45))  # together every training query, once
        assert abs(len(a) - len(b)) < 45 // 2  # each rank has a share, not everything
    assert ranks[0]["epochs"][0] != ranks[0]["epochs"][1] != ranks[0]["epochs"][2]  # reshuffled per epoch
    val = [q for r in ranks for batch in r["val"] for q in batch]
    assert sorted(val) == list(range(16))
    # the feature statistics reduced over the shards are those of the whole training set
    data = make_synthetic(61, (2, 16), 5, seed=4)
    whole = FeaturePreprocessor(5).fit(data.subset(range(45)).features)
    for r in ranks:
        torch.testing.assert_close(torch.tensor(r["mean"], dtype=whole.mean.dtype), whole.mean, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(torch.tensor(r["std"], dtype=whole.std.dtype), whole.std, rtol=1e-6, atol=1e-6)
    # the piecewise encoding's edges: each rank places them on its shard, and both hold their mean
    # weighted by the shards' documents
    edges, local = ([torch.tensor(r[key]) for r in ranks] for key in ("edges", "local_edges"))
    rows = [r["rows"] for r in ranks]
    assert not torch.equal(local[0], local[1]) and rows[0] != rows[1]
    assert sum(rows) == data.subset(range(45)).n_docs
    torch.testing.assert_close(edges[0], edges[1], rtol=0, atol=0)
    torch.testing.assert_close(edges[0], (local[0] * rows[0] + local[1] * rows[1]) / sum(rows))


# -- 2 processes, Lightning DDP ------------------------------------------------------------------
DDP_SCRIPT = f"""
import os
import sys
import pytorch_lightning as pl
import torch
from rankkit.data import make_synthetic
from rankkit.training.datamodule import RankingDataModule
from rankkit.neural import LambdaRank


class Seen(pl.Callback):
    def __init__(self):
        self.queries = []

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.queries.append(batch.query_index.tolist())


if __name__ == "__main__":
    out = sys.argv[1]
    pl.seed_everything(0, verbose=False)
    data = {DATA}
    dm = RankingDataModule.from_datasets(data.subset(range(40)), data.subset(range(40, 61)),
                                         data.subset([60]), max_docs=40, seed=3)
    model = LambdaRank(n_features=5, hidden=[8], dropout=0.0, lr=1e-2)
    seen = Seen()
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         log_every_n_steps=1, callbacks=[seen])
    trainer.fit(model, datamodule=dm)
    val = trainer.callback_metrics["val/ndcg@10"].item()
    test = trainer.test(model, datamodule=dm, verbose=False)[0]["test/ndcg@10"]
    torch.save({{"state": model.state_dict(), "val": val, "test": test, "steps": trainer.global_step,
                "seen": seen.queries}}, f"{{out}}/rank{{trainer.global_rank}}.pt")
    # Both ranks' files are written; leave without C++ static destructors, where a live gloo
    # thread now and then aborts the exit ("terminate called without an active exception").
    trainer.strategy.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
"""


@pytest.mark.slow
def test_lightning_ddp_logs_the_single_process_val_ndcg_of_its_weights(tmp_path):
    script = tmp_path / "ddp.py"
    script.write_text(textwrap.dedent(DDP_SCRIPT))
    _run([sys.executable, str(script), str(tmp_path)])
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    # the same number of optimiser steps on both ranks, and DDP kept their weights equal
    assert ranks[0]["steps"] == ranks[1]["steps"]
    for name, value in ranks[0]["state"].items():
        assert torch.equal(value, ranks[1]["state"][name]), name
    # each rank trained on its own queries: disjoint, all 40 in each epoch (2 epochs)
    per_epoch = len(ranks[0]["seen"]) // 2
    for epoch in range(2):
        a, b = ([q for batch in r["seen"][epoch * per_epoch:(epoch + 1) * per_epoch] for q in batch] for r in ranks)
        assert not set(a) & set(b) and sorted(a + b) == list(range(40))
    # the preprocessing fitted from the two shards is the whole training set's
    data = make_synthetic(61, (2, 16), 5, seed=4)
    whole = FeaturePreprocessor(5).fit(data.subset(range(40)).features)
    torch.testing.assert_close(ranks[0]["state"]["scorer.preprocess.mean"], whole.mean, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ranks[0]["state"]["scorer.preprocess.std"], whole.std, rtol=1e-6, atol=1e-6)

    # Single process, the same final weights: the metric over the val loader (one rank, its own
    # batching), and NDCG@10 over the whole val set padded as one batch.
    model = LambdaRank(n_features=5, hidden=[8], dropout=0.0)
    model.load_state_dict(ranks[0]["state"])
    model.eval()
    val = data.subset(range(40, 61))
    metrics = ranking_metrics(prefix="val/")
    with torch.no_grad():
        for batch in RankingDataModule.from_datasets(None, val, max_docs=40).val_dataloader():
            metrics.update(model(batch.features), batch.labels, batch.mask)
        whole_batch = val.padded()
        direct = ndcg(model(whole_batch.features), whole_batch.labels, mask=whole_batch.mask, k=10)
        last = data.padded([60])
        test = ndcg(model(last.features), last.labels, mask=last.mask, k=10)
    single = metrics.compute()["val/ndcg@10"].item()
    # equal up to the order of the float64 sum of the per-query values
    assert ranks[0]["val"] == pytest.approx(single, rel=0, abs=1e-12)
    assert ranks[0]["val"] == pytest.approx(direct.double().mean().item(), rel=0, abs=1e-6)
    # the one-query test set: rank 1 ran one empty batch, and the query counted once
    assert ranks[0]["test"] == pytest.approx(test.item(), rel=0, abs=1e-6)


# -- 2 processes, Lightning DDP, unbiased="auto" -------------------------------------------------
AUTO_SCRIPT = """
import os
import sys
import pytorch_lightning as pl
import torch
from rankkit.data import make_synthetic
from rankkit.data.clicks import PositionBasedModel, simulate_clicks
from rankkit.training.datamodule import RankingDataModule
from rankkit.neural import LambdaRank


if __name__ == "__main__":
    out = sys.argv[1]
    data = make_synthetic(80, (4, 12), 5, seed=0)
    scores = torch.rand(data.n_docs, generator=torch.Generator().manual_seed(0))
    model = PositionBasedModel(eta=1.0, max_label=4)
    train = simulate_clicks(data, scores, model=model, sessions_per_query=6, k=6, seed=0, drop_unclicked=True)
    vali = simulate_clicks(data, scores, model=model, sessions_per_query=6, k=6, seed=1, drop_unclicked=True)
    pl.seed_everything(0, verbose=False)
    dm = RankingDataModule.from_datasets(train.sessions, vali.sessions, None, max_docs=256, seed=3)
    module = LambdaRank(n_features=5, hidden=[8], lr=1e-2, unbiased="auto", n_positions=6)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=3, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=dm)
    torch.save({"state": module.state_dict(), "choice": module.unbiased_choice_, "alive": module.race.alive,
                "scores": module.race.scores_}, f"{out}/auto{trainer.global_rank}.pt")
    trainer.strategy.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
"""


@pytest.mark.slow
def test_the_click_race_under_ddp_scores_the_whole_validation_log_on_every_rank(tmp_path):
    """LambdaRank(unbiased="auto") under Lightning's plain "ddp" on 2 processes: it trains (the
    dropped networks and the served copy do not leave DDP with parameters it cannot reduce),
    every rank scores the candidates on the whole validation click log (each holds a shard)
    and so keeps the same winner, and its recorded score is the single-process criterion of
    the final weights on the whole log."""
    from rankkit.clicks.metrics import ClickLikelihood
    from rankkit.clicks.race import NEURAL_BLENDS
    from rankkit.data.clicks import PositionBasedModel, simulate_clicks

    script = tmp_path / "auto.py"
    script.write_text(textwrap.dedent(AUTO_SCRIPT))
    _run([sys.executable, str(script), str(tmp_path)], timeout=240)
    ranks = [torch.load(tmp_path / f"auto{r}.pt", weights_only=True) for r in range(2)]
    assert ranks[0]["choice"] == ranks[1]["choice"] and ranks[0]["alive"] == ranks[1]["alive"]
    assert ranks[0]["scores"] == ranks[1]["scores"]
    for name, value in ranks[0]["state"].items():
        assert torch.equal(value, ranks[1]["state"][name]), name
    data = make_synthetic(80, (4, 12), 5, seed=0)
    scores = torch.rand(data.n_docs, generator=torch.Generator().manual_seed(0))
    vali = simulate_clicks(data, scores, model=PositionBasedModel(eta=1.0, max_label=4), sessions_per_query=6, k=6,
                           seed=1, drop_unclicked=True)
    module = LambdaRank(n_features=5, hidden=[8], unbiased="auto", n_positions=6)
    module.race.schedule.choice_ = ranks[0]["choice"]  # the served scorer's shape, as a checkpoint's load gives it
    module.race.shape_scorer(module)
    module.load_state_dict(ranks[0]["state"])
    module.eval()
    choice = ranks[0]["choice"]
    networks = [module.race.candidates[name].scorer.eval() for name in NEURAL_BLENDS.get(choice, (choice,))]
    criterion = ClickLikelihood(vali.sessions.features, vali.clicks, vali.sessions.sizes, vali.position, n_positions=6)
    with torch.no_grad():
        whole = criterion(lambda x: sum(net(x) for net in networks) / len(networks))
    assert ranks[0]["scores"][choice] == pytest.approx(whole, abs=1e-6)
