"""Shared by the Triton tests: run a script in a fresh interpreter (``TRITON_INTERPRET`` must be
set before triton is imported, so each interpreted check is a subprocess)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def run_script(code: str, *args: str, interpret: bool) -> None:
    """Run ``code`` with ``args`` from the repository root (rankkit importable), under Triton's
    interpreter when ``interpret``; RANKKIT_TRITON is left for the script to set."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "RANKKIT_TRITON")}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def interpreted_json(tmp_path_factory, code: str, *args: str) -> dict:
    """What ``code`` (interpreted) wrote as JSON to the path it gets as its last argument."""
    path = tmp_path_factory.mktemp("interpreted") / "out.json"
    run_script(code, *args, str(path), interpret=True)
    return json.loads(path.read_text())
