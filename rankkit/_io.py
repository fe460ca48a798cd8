"""Atomic file writes: every file rankkit writes appears whole or not at all."""
from __future__ import annotations

import os
import tempfile
from typing import Callable


def _umask() -> int:
    """The process umask: from /proc on Linux; elsewhere ``os.umask``, which can only be read by
    setting it (it is set back at once)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, write: Callable[[str], None], *, suffix: str = ".tmp") -> str:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then rename it over ``path``.

    The rename is atomic on POSIX and Windows, so a reader, or a crash half-way, never sees a
    partial file. If ``write`` raises (an exception or a KeyboardInterrupt), the old ``path`` is
    left as it was and the temporary file is removed. Creates the directory.

    The new file gets the permissions of a file created with ``open(path, "w")``:
    ``0o666 & ~umask`` (0644 under the usual umask 022), not the 0600 of ``mkstemp``.
    ``suffix`` ends the temporary file's name (some writers look at the extension).

    Returns ``path`` as a string.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, suffix=suffix)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
