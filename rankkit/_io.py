"""Atomic file writes: every file rankkit writes appears whole or not at all."""
from __future__ import annotations

import os
import tempfile
from typing import Callable


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> str:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then rename it over ``path``.

    The rename is atomic on POSIX and Windows, so a reader, or a crash half-way, never sees a
    partial file; the temporary file is removed whatever happens. Creates the directory.
    Returns ``path`` as a string.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
