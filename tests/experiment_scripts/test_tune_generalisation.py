"""experiments/tune_generalisation.py's nesting: the inner folds a study tunes on hold exactly the
queries the outer split trains and validates on (never one of its test queries), each inner
vali is one part, disjoint from its training queries, and the parts cover the queries once."""
from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "experiments"))


def _qids(path) -> set[str]:
    return {line.split()[1] for line in open(path) if line.strip()}


def test_mq2008_inner_folds_never_hold_an_outer_test_query(tmp_path):
    from tune_generalisation import outer_splits

    from rankkit.data.bundled import load_mq2008

    splits = outer_splits("mq2008", tmp_path)
    assert [label for label, _, _ in splits] == [f"fold {k}" for k in range(1, 6)]
    for k, (_, settings, inner) in enumerate(splits, start=1):
        train, vali, test = load_mq2008(k)
        outer_fit = {f"qid:{int(q)}" for q in (*train.qids.tolist(), *vali.qids.tolist())}
        outer_test = {f"qid:{int(q)}" for q in test.qids.tolist()}
        assert settings == {"data": "mq2008", "folds": str(k)}
        valis = []
        for i in range(1, 5):
            t, v = _qids(inner / f"Fold{i}" / "train.txt"), _qids(inner / f"Fold{i}" / "vali.txt")
            assert not t & v and t | v == outer_fit and not (t | v) & outer_test
            valis.append(v)
        assert set().union(*valis) == outer_fit and sum(map(len, valis)) == len(outer_fit)


def test_a_train_test_folder_is_cut_into_five_query_parts(tmp_path):
    from tune_generalisation import outer_splits

    data = tmp_path / "data"
    data.mkdir()
    sizes = [3, 1, 4, 2, 5, 2, 3, 1, 2, 2, 4]
    lines = [f"{(q + d) % 3} 1:{q}.{d} 2:{d}" for q, n in enumerate(sizes) for d in range(n)]
    (data / "rank.train").write_text("\n".join(lines) + "\n")
    (data / "rank.train.query").write_text("\n".join(map(str, sizes)) + "\n")
    (_, settings, inner), = outer_splits(str(data), tmp_path / "work")
    assert settings == {"data": str(data), "folds": "1"}
    seen = []
    for i in range(1, 6):
        vali = (inner / f"Fold{i}" / "vali.txt").read_text().splitlines()
        train = (inner / f"Fold{i}" / "train.txt").read_text().splitlines()
        assert sorted(vali + train) == sorted(lines)  # every document once, in one of the two
        counts = [int(v) for v in (inner / f"Fold{i}" / "vali.txt.query").read_text().split()]
        assert sum(counts) == len(vali)
        seen += vali
    assert sorted(seen) == sorted(lines)
