"""The notebooks execute from top to bottom (small settings: RANKKIT_SMALL=1)."""
from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = {
    "lambdas_as_forces.ipynb": [],
    "export_and_serve.ipynb": [pytest.mark.slow],  # boosts a few trees: about 30 s on 2 busy cores
    "compare_rankers.ipynb": [pytest.mark.slow],  # trains four models: about a minute on 2 cores
    "btl_convergence.ipynb": [],  # 10 items, two values of m, one seed: a few seconds
}


def tree_files() -> set[str]:
    """Every file of the repository outside results/ and the caches (what a run may not add)."""
    skip = {".git", ".venv", "results", ".hypothesis", ".ruff_cache", "__pycache__", ".pytest_cache",
            "catboost_info", "rankkit.egg-info", "lightning_logs"}
    out = set()
    for path in ROOT.rglob("*"):
        parts = path.relative_to(ROOT).parts
        if path.is_file() and not skip.intersection(parts):
            out.add(str(path.relative_to(ROOT)))
    return out


@pytest.mark.parametrize("name", [pytest.param(n, marks=m) for n, m in NOTEBOOKS.items()])
@pytest.mark.parametrize("where", ["notebooks", "root"])
def test_notebook_executes_from_its_folder_and_the_root(name, where, tmp_path, monkeypatch):
    """As `jupyter nbconvert --execute` runs it (the kernel in the notebook's own folder) and
    from the repository root; its outputs go to RANKKIT_RESULTS, nothing lands in the tree."""
    if where == "root" and name != "export_and_serve.ipynb":  # the one that reads a repository file
        pytest.skip("the folder-independence of the others is checked from notebooks/")
    monkeypatch.setenv("RANKKIT_SMALL", "1")
    monkeypatch.setenv("RANKKIT_RESULTS", str(tmp_path / "results"))
    before = tree_files()
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    folder = ROOT / "notebooks" if where == "notebooks" else ROOT
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(folder)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    assert tree_files() == before
    assert any((tmp_path / "results").rglob("*")) or name == "lambdas_as_forces.ipynb"


def test_the_notebooks_extra_can_execute_notebooks():
    """`pip install -e '.[notebooks]'` brings what `jupyter nbconvert --execute` needs."""
    import tomllib

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["notebooks"]
    names = {req.split(">")[0].split("=")[0].split("[")[0].strip() for req in extra}
    assert {"nbconvert", "nbclient", "ipykernel", "matplotlib"} <= names
    pytest.importorskip("nbconvert")
