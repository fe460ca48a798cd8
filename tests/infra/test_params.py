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


# rankkit's modules compiled as ``python -OO`` compiles them (optimize=2: no docstrings, no
# asserts), every other module as usual: -OO itself recompiles all of torch and Lightning without
# a cache (about 20 s), and only rankkit's own docstrings are in question. Nothing is written to
# __pycache__ (the stripped code must never be cached as the normal one).
_STRIPPED_IMPORT = """
import importlib.abc, importlib.machinery, sys
sys.dont_write_bytecode = True

class Stripped(importlib.machinery.SourceFileLoader):
    def get_code(self, fullname):
        path = self.get_filename(fullname)
        return compile(self.get_data(path), path, "exec", dont_inherit=True, optimize=2)

class Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] != "rankkit":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.origin and spec.origin.endswith(".py"):
            spec.loader = Stripped(name, spec.origin)
        return spec

sys.meta_path.insert(0, Finder())
"""


def test_the_modules_import_without_docstrings():
    # python -OO strips every docstring: the derived Args sections must not need them.
    code = _STRIPPED_IMPORT + ("import rankkit.boosting, rankkit.neural, rankkit.compat\n"
                               "print(rankkit.boosting.LambdaMART.__doc__, rankkit.__doc__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "None None", out.stderr[-2000:]
