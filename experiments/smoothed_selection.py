"""Model selection on a smoothed validation curve for the neural rankers, on MQ2008's 5 folds.

The shipped LambdaRank config (rankkit/configs/lambdarank.yaml: its model, data and trainer
settings, seed 0) trains on each fold's train split. Early stopping (patience 8) and the
checkpoint watch vali NDCG@10 as logged (window 1), or its trailing mean over w epochs
(``rankkit.training.callbacks.SmoothedMetric``). The kept checkpoint is tested once on the fold's
test split: NDCG@10, exp gain 2^rel − 1, a query with nothing relevant scoring 1.

    python experiments/smoothed_selection.py --windows 1 3 5 --write
"""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import tempfile

import pytorch_lightning as pl
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import command_line, write_section  # noqa: E402

from rankkit.infra import yaml as _yaml

from rankkit.neural import LambdaRank
from rankkit.training.callbacks import SmoothedMetric
from rankkit.training.datamodule import RankingDataModule
from rankkit.training.run_config import CONFIG_DIR, quiet_lightning_logs


def run(fold: int, window: int, config: dict, workdir: str) -> dict:
    pl.seed_everything(config["seed_everything"], verbose=False)
    model = LambdaRank(**{k: v for k, v in config["model"]["init_args"].items() if k != "n_features"}, n_features=46)
    data = RankingDataModule(**{**config["data"], "fold": fold})
    key = "val/ndcg@10" if window == 1 else f"val/ndcg@10@mean{window}"
    callbacks = ([] if window == 1 else [SmoothedMetric("val/ndcg@10", window)]) + [
        pl.callbacks.EarlyStopping(monitor=key, mode="max", patience=8),
        pl.callbacks.ModelCheckpoint(monitor=key, mode="max", dirpath=workdir, filename=f"f{fold}w{window}-{{epoch}}")]
    trainer = pl.Trainer(max_epochs=config["trainer"]["max_epochs"], callbacks=callbacks, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                         log_every_n_steps=1, default_root_dir=workdir)
    with quiet_lightning_logs():
        trainer.fit(model, datamodule=data)
        test = trainer.test(model, datamodule=data, ckpt_path="best", verbose=False)[0]
    best = callbacks[-1].best_model_path
    return {"fold": fold, "window": window, "test": float(test["test/ndcg@10"]),
            "epoch": int(best.rsplit("epoch=", 1)[1].split(".")[0]), "epochs": trainer.current_epoch}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, nargs="+", default=[1, 3, 5])
    ap.add_argument("--folds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    ap.add_argument("--write", action="store_true", help="replace the smoothed_selection section of docs/benchmarks.md")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    config = _yaml.safe_load(_yaml.read_text(CONFIG_DIR / "lambdarank.yaml"), "lambdarank.yaml")
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for fold in args.folds:
            for window in args.windows:
                rows.append(run(fold, window, config, workdir))
                print(rows[-1], flush=True)
    lines = [f"Measured {datetime.date.today()}, 1 torch thread, command: `{command_line(__file__, argv)}`.", "",
             "| window | test NDCG@10 per fold | mean | kept epoch per fold |", "|---:|---|---:|---|"]
    for window in args.windows:
        mine = [r for r in rows if r["window"] == window]
        tests = " ".join(f"{r['test']:.4f}" for r in mine)
        epochs = " ".join(str(r["epoch"]) for r in mine)
        lines.append(f"| {window} | {tests} | {statistics.mean(r['test'] for r in mine):.4f} | {epochs} |")
    body = "\n".join(lines)
    print(body)
    if args.write:
        write_section("smoothed_selection", body)


if __name__ == "__main__":
    main()
