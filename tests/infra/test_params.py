"""rankkit.infra.params: the __init__ and the Args section a declaration derives."""
import inspect
import subprocess
import sys
from dataclasses import dataclass

import pytest

from rankkit.infra.params import args_section, declared, hyperparameter, make_init, with_args


@dataclass
class Config:
    objective: str = hyperparameter("lambdarank", "what to minimise.")
    depth: int = hyperparameter(6, """
        levels of every tree,
        each a split.""")


class Model:
    """A model.

    Args:
        {params}
    """


Model.__init__ = make_init(declared(Config), lambda self, params: vars(self).update(params), "Model",
                           positional=1, owner=Model)
Model.__doc__ = with_args(Model.__doc__, declared(Config))


def test_the_init_has_the_declared_signature_and_stores_every_value():
    signature = inspect.signature(Model)
    assert [(p.name, p.kind.name, p.default, p.annotation) for p in signature.parameters.values()] == [
        ("objective", "POSITIONAL_OR_KEYWORD", "lambdarank", str), ("depth", "KEYWORD_ONLY", 6, int)]
    assert vars(Model("ranknet", depth=3)) == {"objective": "ranknet", "depth": 3}
    with pytest.raises(TypeError):
        Model("ranknet", 3)
    assert Model.__init__.__module__ == __name__ and Model.__init__.__qualname__ == "Model.__init__"


def test_the_docstring_lists_each_parameter_once():
    expected = "    objective: what to minimise.\n    depth: levels of every tree,\n        each a split.\n"
    assert args_section(declared(Config)) == expected
    assert "        objective: what to minimise.\n        depth: levels of every tree,\n" in Model.__doc__
    assert with_args(None, declared(Config)) is None


def test_make_init_refuses_a_name_twice():
    with pytest.raises(ValueError, match="distinct"):
        make_init(declared(Config) * 2, lambda self, params: None, "Twice")


def test_the_modules_import_without_docstrings():
    # python -OO strips every docstring: the derived Args sections must not need them.
    code = "import rankkit.boosting, rankkit.neural; print(rankkit.boosting.LambdaMART.__doc__)"
    out = subprocess.run([sys.executable, "-OO", "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "None", out.stderr[-2000:]
