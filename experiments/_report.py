"""Shared by the experiment scripts: replace one marked section of docs/benchmarks.md atomically."""
from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from rankkit.infra.io import atomic_write

BENCHMARKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "benchmarks.md")


def write_section(marker: str, body: str, path: str = BENCHMARKS) -> None:
    """Put ``body`` between ``<!-- marker:start -->`` and ``<!-- marker:end -->`` (appending if absent)."""
    start, end = f"<!-- {marker}:start -->", f"<!-- {marker}:end -->"
    text = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    block = f"{start}\n{body.rstrip()}\n{end}"
    if start in text and end in text:
        text = text[: text.index(start)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def command_line(script: str, argv=None, *, prefix: str = "python") -> str:
    """The command that ran ``script`` (an experiment's ``__file__``) with ``argv`` (None: this
    process's arguments), as the sections quote it: ``python experiments/NAME.py ARGS``."""
    args = argv if argv is not None else sys.argv[1:]
    return f"{prefix} experiments/{os.path.basename(script)} " + shlex.join(args)  # quoted where a shell needs it


def publish_image(src: str, name: str) -> str:
    """Copy a plot into docs/img/ (results/ is not versioned) and return its Markdown link from docs/."""
    import shutil

    img_dir = os.path.join(os.path.dirname(BENCHMARKS), "img")
    os.makedirs(img_dir, exist_ok=True)
    shutil.copyfile(src, os.path.join(img_dir, name))
    return f"![{name}](img/{name})"
