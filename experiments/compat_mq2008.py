"""The same ranking script, written for LightGBM and for XGBoost, run with the real library and with
rankkit.compat (only the import changed), on the bundled MQ2008 folds; the table goes to docs/compat.md.

    python experiments/compat_mq2008.py --write      # all five folds; --folds 1 for one

Test NDCG@10: exp gain 2^rel - 1, discount 1/log2(1 + rank), a query with nothing relevant scores 1,
by rankkit.metrics.ndcg on every side. Each script: 1,000 rounds at most, early stopping after 50
rounds without improvement on vali, otherwise the library's defaults (and the compat class's: the
same defaults mapped to LambdaMART, docs/compat.md), one thread.
"""
from __future__ import annotations

import argparse
import importlib
import platform
import time

import numpy as np
import torch

from _report import command_line, write_section
from rankkit.data import load_mq2008
from rankkit.data.dataset import pad
from rankkit.metrics import ndcg

DOC = __file__.replace("experiments/compat_mq2008.py", "docs/compat.md")


def lgbm_script(lgb, train, vali):
    """What a LightGBM user writes (the docs' LGBMRanker with early stopping)."""
    model = lgb.LGBMRanker(n_estimators=1000, n_jobs=1, verbose=-1)
    model.fit(train[0], train[1], group=train[2], eval_set=[(vali[0], vali[1])], eval_group=[vali[2]],
              eval_at=[10], callbacks=[lgb.early_stopping(50, verbose=False)])
    return model, model.best_iteration_


def xgb_script(xgb, train, vali):
    """What an XGBoost user writes (XGBRanker with qid and early_stopping_rounds)."""
    qid, qv = (np.repeat(np.arange(len(s)), s) for s in (train[2], vali[2]))
    model = xgb.XGBRanker(n_estimators=1000, tree_method="hist", eval_metric="ndcg@10", early_stopping_rounds=50,
                          n_jobs=1)
    model.fit(train[0], train[1], qid=qid, eval_set=[(vali[0], vali[1])], eval_qid=[qv], verbose=False)
    return model, model.best_iteration + 1


def arrays(d):
    return d.features.numpy().astype(np.float64), d.labels.numpy(), d.sizes.numpy()


def test_ndcg(model, test) -> float:
    s, mask = pad(torch.as_tensor(np.asarray(model.predict(test[0]), dtype=np.float32)), torch.as_tensor(test[2]))
    return float(ndcg(s, pad(torch.as_tensor(test[1]), torch.as_tensor(test[2]))[0], mask=mask, k=10).double().mean())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--write", action="store_true", help="replace the section of docs/compat.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = {}
    for fold in args.folds:
        train, vali, test = (arrays(d) for d in load_mq2008(fold))
        for script, library in ((lgbm_script, "lightgbm"), (xgb_script, "xgboost")):
            for module in (library, "rankkit.compat"):
                start = time.perf_counter()
                model, trees = script(importlib.import_module(module), train, vali)
                seconds = time.perf_counter() - start
                key = (script.__name__, module)
                rows.setdefault(key, []).append((test_ndcg(model, test), trees, seconds))
                print(f"fold {fold} {script.__name__} {module}: test NDCG@10 {rows[key][-1][0]:.4f}, "
                      f"{trees} trees, {seconds:.1f} s", flush=True)
    lines = ["| script | import | test NDCG@10 (mean ± sd over folds) | trees kept (mean) | fit s (mean) |",
             "|---|---|---|---|---|"]
    for (script, module), values in rows.items():
        v = np.asarray(values)
        lines.append(f"| {script} | `{module}` | {v[:, 0].mean():.4f} ± {v[:, 0].std():.4f} | "
                     f"{v[:, 1].mean():.0f} | {v[:, 2].mean():.2f} |")
    versions = ", ".join(f"{m} {importlib.import_module(m).__version__}" for m in ("lightgbm", "xgboost", "torch"))
    body = (f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()} ({torch.get_num_threads()} thread), "
            f"{versions}, folds {args.folds} of the bundled MQ2008.\nCommand: `{command_line(__file__, argv)}`\n\n"
            + "\n".join(lines))
    print(body)
    if args.write:
        write_section("compat_mq2008", body, DOC)


if __name__ == "__main__":
    main()
