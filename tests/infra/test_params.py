"""rankkit.infra.params: the declaration each front end's written __init__ is held to, and the Args
section it derives."""
import importlib.util
import inspect
import pathlib
import re
import subprocess
import sys
import typing
from dataclasses import dataclass

import numpy as np
import pytest

import rankkit

from rankkit.boosting.booster import PARAMS as ESTIMATOR_PARAMS, LambdaMART
from rankkit.boosting.module import PARAMS as MODULE_PARAMS, LambdaMARTModule
from rankkit.infra.params import args_section, declared, hyperparameter, with_args
from rankkit.neural.module import PARAMS as NEURAL_PARAMS, LambdaRank, NeuralRanker, RankNet


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


Model.__doc__ = with_args(Model.__doc__, declared(Config))


def _declared_signature(params, positional=1, **defaults):
    """What a front end's written ``__init__`` must be: the declaration in order, the first
    ``positional`` by position or keyword, the rest keyword-only."""
    kinds = ["POSITIONAL_OR_KEYWORD"] * positional + ["KEYWORD_ONLY"] * (len(params) - positional)
    return [(p.name, kind, defaults.get(p.name, p.default), p.annotation) for p, kind in zip(params, kinds)]


def _written_signature(cls):
    hints = typing.get_type_hints(cls.__init__)
    return [(p.name, p.kind.name, p.default, hints[p.name])
            for p in list(inspect.signature(cls.__init__).parameters.values())[1:]]


FRONT_ENDS = {"LambdaMART": (LambdaMART, ESTIMATOR_PARAMS, {}),
              "LambdaMARTModule": (LambdaMARTModule, MODULE_PARAMS, {}),
              "NeuralRanker": (NeuralRanker, NEURAL_PARAMS, {}),
              "RankNet": (RankNet, NEURAL_PARAMS, {"weighting": "ranknet"}),
              "LambdaRank": (LambdaRank, NEURAL_PARAMS, {"weighting": "ndcg"})}


@pytest.mark.parametrize("front_end", FRONT_ENDS)
def test_the_written_init_is_the_declaration(front_end):
    cls, params, defaults = FRONT_ENDS[front_end]
    assert _written_signature(cls) == _declared_signature(params, **defaults)
    doc = cls.__doc__
    assert all(doc.count(f"\n        {p.name}: ") == 1 for p in params), "an Args entry missing or twice"


def test_the_comparison_sees_a_changed_default_a_reordering_and_a_missing_parameter():
    written = _written_signature(LambdaMART)
    assert written != _declared_signature(ESTIMATOR_PARAMS, depth=5)
    assert written != _declared_signature(ESTIMATOR_PARAMS[1:2] + ESTIMATOR_PARAMS[:1] + ESTIMATOR_PARAMS[2:])
    assert written != _declared_signature(ESTIMATOR_PARAMS[:-1])
    assert written != _declared_signature(ESTIMATOR_PARAMS, positional=2)


def test_the_estimator_stores_every_parameter_as_given():
    values = {p.name: object() for p in ESTIMATOR_PARAMS}
    model = LambdaMART(**values)
    assert all(getattr(model, name) is value for name, value in values.items())
    assert LambdaMART().get_params() == {p.name: p.default for p in ESTIMATOR_PARAMS}


def test_a_module_keeps_no_shared_default_list_in_its_hyperparameters():
    first = RankNet(n_features=3)
    first.hparams.hidden.append(7)
    assert RankNet(n_features=3).hparams.hidden == [128, 64] == inspect.signature(RankNet).parameters["hidden"].default


def _front_ends_file():
    path = pathlib.Path(__file__).parents[1] / "typecheck" / "front_ends.py"
    spec = importlib.util.spec_from_file_location("front_ends", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_what_mypy_accepts_constructs_and_what_it_flags_is_refused_at_run_time():
    # The run-time twin of `make lint`'s mypy pass over tests/typecheck/front_ends.py.
    calls = _front_ends_file()
    assert len(calls.accepted()) == 9
    for refused in calls.REFUSED:
        with pytest.raises(TypeError):
            refused()
    with pytest.raises(ValueError, match="depth"):
        calls.MISTYPED[0]().fit(np.zeros((4, 2)), np.zeros(4), group=[4])
    with pytest.raises(ValueError, match=r"`k`"):
        calls.MISTYPED[1]()


def test_rankkit_writes_no_code_at_run_time():
    root = pathlib.Path(rankkit.__file__).parent
    offenders = [str(path.relative_to(root)) for path in root.rglob("*.py")
                 if re.search(r"(?<![.\w])(exec|eval)\(", path.read_text())]
    assert offenders == []


def test_the_docstring_lists_each_parameter_once():
    expected = "    objective: what to minimise.\n    depth: levels of every tree,\n        each a split.\n"
    assert args_section(declared(Config)) == expected
    assert "        objective: what to minimise.\n        depth: levels of every tree,\n" in Model.__doc__
    assert with_args(None, declared(Config)) is None


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
