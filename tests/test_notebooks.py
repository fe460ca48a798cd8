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


@pytest.mark.parametrize("name", [pytest.param(n, marks=m) for n, m in NOTEBOOKS.items()])
def test_notebook_executes(name, tmp_path, monkeypatch):
    monkeypatch.setenv("RANKKIT_SMALL", "1")
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    # The notebooks run from the repository root; here a stand-in for it, so results/ lands in tmp_path.
    for entry in ("rankkit", "configs"):
        (tmp_path / entry).symlink_to(ROOT / entry)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
