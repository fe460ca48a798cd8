"""The public API: every name in rankkit.__all__ resolves, and importing rankkit stays light."""
import subprocess
import sys

import rankkit


def test_every_public_name_resolves():
    for name in rankkit.__all__:
        assert getattr(rankkit, name) is not None, name


def test_import_is_lazy():
    code = "import sys, rankkit; print('pytorch_lightning' in sys.modules, 'triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def _import_graph() -> dict[str, set[str]]:
    """rankkit's modules and the rankkit modules each imports (at any depth in the file)."""
    import ast
    from pathlib import Path

    root = Path(rankkit.__file__).resolve().parent
    names = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in names.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                # `from package import module` depends on the module (and runs the package's
                # __init__, which is its parent's business, not an edge of this file).
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in names else base for a in node.names]
            else:
                continue
            edges |= {t for t in targets if t in names and t != name}
        graph[name] = edges
    return graph


def test_the_import_graph_has_no_cycle():
    graph = _import_graph()
    assert "rankkit.boosting.engine" in graph and "rankkit.cli" in graph  # the walk found the package
    state: dict[str, int] = {}

    def visit(node, stack):
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack + [node, nxt]))
            if nxt not in state:
                visit(nxt, stack + [node])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])


def test_the_import_cycle_check_can_fail(monkeypatch):
    # The check itself: a graph with a cycle is reported.
    graph = _import_graph()
    graph["rankkit.cli"] = graph["rankkit.cli"] | {"rankkit.compare.protocol"}
    graph["rankkit.compare.protocol"] = graph["rankkit.compare.protocol"] | {"rankkit.cli"}
    monkeypatch.setattr(sys.modules[__name__], "_import_graph", lambda: graph)
    import pytest

    with pytest.raises(AssertionError, match="import cycle"):
        test_the_import_graph_has_no_cycle()


def test_neural_and_boosting_never_import_each_other():
    graph = _import_graph()
    for a, b in (("rankkit.neural", "rankkit.boosting"), ("rankkit.boosting", "rankkit.neural")):
        for name, edges in graph.items():
            if name.startswith(a):
                assert not any(e.startswith(b) for e in edges), (name, edges)
