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
