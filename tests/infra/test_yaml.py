"""rankkit.infra.yaml: YAML limited in size and in nodes with aliases expanded, in every command."""
from __future__ import annotations

import pytest


# -- YAML: limited in size and in nodes with aliases expanded -------------------------------------
def _bomb(levels: int = 10, width: int = 9) -> str:
    """A "billion laughs" YAML: ``width ** levels`` scalars in about 40 bytes per level."""
    names = [f"l{i}" for i in range(levels)]
    text = f"{names[0]}: &{names[0]} [{', '.join(['x'] * width)}]\n"
    for prev, name in zip(names, names[1:]):
        text += f"{name}: &{name} [{', '.join([f'*{prev}'] * width)}]\n"
    return text + f"model: *{names[-1]}\n"


@pytest.mark.parametrize("argv", [["fit", "--config", "{bomb}"], ["compare", "--config", "{bomb}"],
                                  ["compare", "--models", "lambdamart,{bomb}"]])
def test_yaml_alias_bomb_is_refused_by_every_command(tmp_path, argv, capsys):
    """A 476-byte alias bomb given to ``fit --config``, ``compare --config`` or ``compare
    --models`` grew to 3-4 GB and hung."""
    from rankkit.cli import main

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_bomb())
    assert len(bomb.read_bytes()) < 600
    assert main([a.format(bomb=bomb) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "more than 100000 YAML nodes with aliases expanded" in err


def test_yaml_limits():
    from rankkit.infra import yaml as _yaml

    _yaml.check_yaml(_bomb(levels=5, width=6))  # about 2 x 6^5 = 15552 scalars: within the limit
    with pytest.raises(_yaml.YAMLLimitError, match=r"s.yaml: more than 100000 YAML nodes"):
        _yaml.check_yaml(_bomb(levels=6, width=9), "s.yaml")
    with pytest.raises(ValueError, match=r"big.yaml: 1048577 characters of YAML, more than"):
        _yaml.safe_load("#" * (_yaml.MAX_BYTES + 1), "big.yaml")
    with pytest.raises(_yaml.YAMLLimitError, match="more than 100000|nested more than"):  # a cycle: bounded too
        _yaml.check_yaml("a: &a [*a, *a]\n")
    assert _yaml.safe_load("a: &x [1, 2]\nb: *x\n") == {"a": [1, 2], "b": [1, 2]}
    # one large anchored string aliased many times: few nodes, gigabytes once expanded
    wide = "a: &s " + "x" * 900_000 + "\nb: [" + ", ".join(["*s"] * 20) + "]\n"
    with pytest.raises(_yaml.YAMLLimitError, match=r"w.yaml: more than 8388608 characters of YAML values"):
        _yaml.check_yaml(wide, "w.yaml")
    _yaml.check_yaml("a: &s " + "x" * 900_000 + "\nb: [*s, *s]\n")  # 2.7M characters: within
    # nesting: flow and block, refused before PyYAML's recursive reader overflows the stack
    block = "".join("  " * i + f"k{i}:\n" for i in range(300)) + " " * 600 + "v: 1\n"
    for deep in ("a: " + "[" * 5000 + "]" * 5000, block):
        with pytest.raises(_yaml.YAMLLimitError, match="nested"):
            _yaml.check_yaml(deep, "deep.yaml")
    _yaml.check_yaml("".join("  " * i + f"k{i}:\n" for i in range(50)) + "  " * 50 + "v: 1\n")  # 51 levels


def test_compare_installs_the_yaml_limits_in_a_fresh_process(tmp_path):
    """``rankkit compare --config`` never installed the limits: run alone (not after a ``fit`` in
    the same process, as the test above), a 378-byte bomb reached 3.4 GB."""
    import subprocess
    import sys

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_bomb())
    done = subprocess.run([sys.executable, "-m", "rankkit.cli", "compare", "--config", str(bomb)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "more than 100000 YAML nodes with aliases expanded" in done.stderr, done.stderr
