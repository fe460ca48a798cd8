"""rankkit.unbiased, a deprecated name of rankkit.clicks: its import warns and gives the very objects
of their new homes."""
from __future__ import annotations

import importlib
import sys

import pytest


def check(old: str) -> None:
    """Import ``old`` afresh: one FutureWarning, and every name the very object of its new home."""
    sys.modules.pop(old, None)
    with pytest.warns(FutureWarning, match=rf"`{old}` moved to `rankkit.clicks`"):
        module = importlib.import_module(old)
    clicks = [importlib.import_module(f"rankkit.clicks.{name}")
              for name in ("log", "propensity", "metrics", "race", "debiasing")]
    for name in module.__all__:
        homes = [m for m in clicks if getattr(m, name, None) is not None]
        assert homes and all(getattr(m, name) is getattr(module, name) for m in homes), name


def test_the_old_module_warns_and_gives_the_new_objects():
    check("rankkit.unbiased")
