"""rankkit.compare.command: `rankkit compare` parses the packaged config plus overrides into exactly
the keyword arguments of rankkit.compare.protocol.compare, and prints its table."""
import inspect

import pytest

from rankkit.compare import command
from rankkit.compare.protocol import compare

pytest.importorskip("jsonargparse")


def _run(monkeypatch, argv):
    seen = {}

    def fake(**kwargs):
        seen.update(kwargs)
        return {"table": "| the table |", "out": "results/x", "plots": ["results/x/a.png"], "wall_seconds": 1.0}

    monkeypatch.setattr(command, "compare", fake)
    assert command.compare_from_args(argv) == 0
    return seen


def test_every_option_is_a_parameter_of_compare(monkeypatch):
    seen = _run(monkeypatch, [])
    assert set(seen) <= set(inspect.signature(compare).parameters)
    assert seen["data"] == "mq2008" and seen["folds"] == "1" and seen["seeds"] == 1


def test_the_packaged_config_and_overrides_and_spellings(monkeypatch, capsys):
    seen = _run(monkeypatch, ["--config", "compare", "--seeds", "3", "--max-epochs", "2", "--folds", "1-5",
                              "--models", "ranknet,lambdamart"])
    assert (seen["seeds"], seen["max_epochs"], seen["folds"]) == (3, 2, "1-5")
    assert seen["models"] in ("ranknet,lambdamart", ["ranknet,lambdamart"], ["ranknet", "lambdamart"])
    out = capsys.readouterr().out
    assert "| the table |" in out and "wrote results/x/: metrics.json, table.md, a.png, scorers/" in out


def test_an_unknown_option_is_refused_by_name(monkeypatch):
    with pytest.raises(Exception, match="no_such_option"):
        _run(monkeypatch, ["--no_such_option", "1"])
    with pytest.raises(Exception, match="seeds"):
        _run(monkeypatch, ["--seeds", "many"])


def test_rankkit_verbose_turns_on_verbose_as_the_flag_does(monkeypatch):
    monkeypatch.setenv("RANKKIT_VERBOSE", "1")
    assert _run(monkeypatch, [])["verbose"] is True
    monkeypatch.delenv("RANKKIT_VERBOSE")
    assert not _run(monkeypatch, [])["verbose"]
    assert _run(monkeypatch, ["--verbose"])["verbose"] is True
