"""rankkit.infra.checks: the one gate for query sizes and offsets, and a test that discovers every
route to it (trust round 4: a class closed where its reproduction entered stayed open by another
route; a new public function taking sizes must reach the gate or say here why it need not)."""
from __future__ import annotations

import ast
import collections
from pathlib import Path

import pytest
import torch

from rankkit.infra.checks import check_sizes, check_tensors, offsets_conditions

ROOT = Path(__file__).resolve().parents[2] / "rankkit"

#: Parameters that carry query sizes or offsets into a function.
SIZE_ARGS = {"sizes", "offsets", "group", "qid", "eval_group", "eval_qid"}
#: The gates: every public route taking sizes reaches one of them.
GATES = {"check_sizes", "offsets_conditions", "query_sizes", "_check_offsets", "check_flat"}
#: Public functions that take sizes only from a caller that has checked them, and why.
INTERNAL = {
    "NumpyObjective.flat_gradients": "called by the booster with its QueryLayout's checked sizes",
    "length_buckets": "called by flat_lambdas_triton and eval_ndcg_triton after check_flat",
    "padded_layout": "called by pad and RankingDataset.padded, which check the sizes first",
    "sample_round": "the engine's round, on its QueryLayout's checked sizes",
    "grow_round": "the engine's round, on its QueryLayout's checked sizes",
    "bayesian_bootstrap_weights": "the engine's round, on its QueryLayout's checked sizes",
}


def _routes() -> tuple[list[tuple[str, str]], dict[str, set[str]]]:
    """(every public function or method of rankkit taking a SIZE_ARGS parameter, as (file,
    qualified name)), and the name-based call graph (a class's name calls its __init__)."""
    calls: dict[str, set[str]] = collections.defaultdict(set)
    routes = []
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name in ("__init__", "__post_init__"):
                        calls[node.name].add(item.name + "@" + node.name)
        _collect(tree, [], path, calls, routes)
    return routes, calls


def _collect(node, stack, path, calls, routes) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.ClassDef):
            _collect(child, stack + [child.name], path, calls, routes)
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            key = child.name + "@" + stack[-1] if child.name in ("__init__", "__post_init__") and stack else child.name
            for sub in ast.walk(child):
                if isinstance(sub, ast.Call):
                    f = sub.func
                    calls[key].add(f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "")
            a = child.args
            names = {x.arg for x in a.args + a.kwonlyargs + a.posonlyargs}
            public = (not child.name.startswith("_") or child.name == "__init__") and \
                not any(s.startswith("_") for s in stack)
            if names & SIZE_ARGS and public:
                routes.append((str(path.relative_to(ROOT.parent)), ".".join(stack + [child.name])))
            _collect(child, stack + [child.name], path, calls, routes)


def _reaches_a_gate(start: str, calls: dict[str, set[str]]) -> bool:
    seen, frontier = {start}, {start}
    while frontier:
        if any(c in GATES for n in frontier for c in calls.get(n, ())):
            return True
        frontier = {c for n in frontier for c in calls.get(n, ())} - seen
        seen |= frontier
    return False


def test_every_public_route_taking_sizes_reaches_the_gate():
    routes, calls = _routes()
    assert len(routes) >= 20, routes  # the scan sees the routes (LambdaMART.fit, pad, the kernels, ...)
    names = {name for _, name in routes}
    assert {"LambdaMART.fit", "pad", "session_log", "score_queries", "LGBMRanker.fit", "lambdas"} <= names
    open_routes = []
    for file, name in routes:
        short = name.split(".")[-1]
        key = f"{short}@{name.split('.')[-2]}" if short == "__init__" else short
        if short in GATES or name in INTERNAL or short in INTERNAL or _reaches_a_gate(key, calls):
            continue
        open_routes.append(f"{file}:{name}")
    assert open_routes == [], f"public routes taking sizes that reach no gate: {open_routes}"
    assert set(INTERNAL) <= names | {n.split(".")[-1] for n in names}  # no stale exemption


@pytest.mark.parametrize("sizes, match", [
    ([2**62, -(2**62) + 4], r"a size in 0\.\.4"),  # the sum would wrap to 4: each size is bounded first
    ([2, 1], "has to sum to 4"),
    ([5, -1], r"a size in 0\.\.4"),
])
def test_check_sizes_bounds_every_size_before_summing(sizes, match):
    with pytest.raises(ValueError, match=match):
        check_sizes(torch.tensor(sizes), 4)
    assert check_sizes(torch.tensor([4, 0]), 4).tolist() == [4, 0]


def test_offsets_conditions_catch_wrapping_offsets():
    with pytest.raises(ValueError, match=r"in 0\.\.N = 64"):  # round 4: the differences wrapped
        check_tensors(*offsets_conditions(torch.tensor([0, 2**63 - 1, -2, 64]), 64))
    with pytest.raises(ValueError, match="non-decreasing"):
        check_tensors(*offsets_conditions(torch.tensor([0, 40, 20, 64]), 64))
    check_tensors(*offsets_conditions(torch.tensor([0, 20, 20, 64]), 64))
