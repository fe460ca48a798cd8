"""Padding waste of length-bucketed batches: MQ2008 and a 1-to-1000-documents synthetic set.

    python experiments/padding_waste.py --write

Waste = 1 - documents / padded slots, over all batches of one epoch. "one batch" pads every
query to the longest; "bucketed" is RankingDataset.bucket_batches(max_docs) (sort by length,
cut at max_docs padded slots or 10% waste).
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from _report import write_section  # noqa: E402

from rankkit.data import load_mq2008, make_synthetic  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--write", action="store_true")
    args = p.parse_args(argv)
    train, _, _ = load_mq2008(1)
    sets = {"MQ2008 Fold1 train (471 queries, 5-121 docs)": train,
            "synthetic, 2000 queries, 1-1000 docs (log-uniform)": make_synthetic(2000, (1, 1000), 4, seed=0)}
    lines = ["| data | one batch | bucketed, max_docs=1024 | 4096 | 16384 | batches at 4096 |",
             "|---|---|---|---|---|---|"]
    for name, ds in sets.items():
        naive = 1 - ds.n_docs / (ds.n_queries * int(ds.sizes.max()))
        cells = [f"{ds.padding_waste(m):.1%}" for m in (1024, 4096, 16384)]
        lines.append(f"| {name} | {naive:.1%} | " + " | ".join(cells) + f" | {len(ds.bucket_batches(4096))} |")
    md = "\n".join(lines)
    print(md)
    if args.write:
        body = (f"## Padding waste of query batches\n\n{datetime.date.today()}. Command: "
                f"`python experiments/padding_waste.py --write`\n\n"
                "Share of padded slots holding no document, over one epoch of batches.\n\n" + md + "\n")
        write_section("padding_waste", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
