"""rankkit.kernels.cpu: RANKKIT_CPU_LIBRARY naming something that is not a build of the kernels is
one line naming the variable (round 4: an AttributeError traceback at import)."""
from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("library", ["/nonexistent/librankkit.so", "libc"])
def test_another_library_is_refused_naming_the_variable(library, tmp_path):
    if library == "libc":
        import ctypes.util

        library = ctypes.util.find_library("c") or pytest.skip("no libc to name")
    env_code = ("import os, sys; os.environ['RANKKIT_CPU_LIBRARY'] = sys.argv[1]\n"
                "try:\n    import rankkit.kernels.cpu\nexcept ValueError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", env_code, library], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"environment variable RANKKIT_CPU_LIBRARY={library!r}: not a build of rankkit's "
                                 f"C kernels"), out.stdout
    assert out.stdout.rstrip().endswith("unset it to use the installed one")
