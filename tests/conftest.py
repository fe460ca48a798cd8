"""Fixtures shared across the test folders."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A folder for one module's generated files (the fuzz tests' mutated artefacts)."""
    return tmp_path_factory.mktemp("fuzz")
