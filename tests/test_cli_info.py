"""`rankkit info`: a data set's summary."""
from __future__ import annotations


# -- CLI ----------------------------------------------------------------------------------------
def test_cli_info(capsys, tmp_path):
    from rankkit.cli import main

    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "train: 471 queries, 9630 documents, 46 features" in out
    assert main(["info", str(tmp_path / "missing.txt")]) == 2
    assert "error" in capsys.readouterr().err
