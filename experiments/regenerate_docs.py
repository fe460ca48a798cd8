"""Regenerate the generated sections of README.md and docs/*.md (``make docs``).

    python experiments/regenerate_docs.py --list               # each section: file, command, how
    python experiments/regenerate_docs.py padding_waste demo   # rerun those sections' commands
    python experiments/regenerate_docs.py --all                # every runnable one (hours on 2 cores)

A generated section is the text between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->``; it
quotes the command that wrote it (``Command: `...```, else the first quoted command), and that is
the command run here, so what the page says and what regenerates it cannot drift apart. How each
section is regenerated:

* ``writes``: the quoted command ends in ``--write`` and puts the section back itself (the
  interpreter running this script replaces a leading ``python``; environment assignments in front,
  left from one machine's paths, are dropped);
* ``demo``: README's demo table, from ``rankkit compare --config compare`` (what ``make demo``
  runs), with the date, the machine and the wall time;
* ``gpu``: needs a CUDA device (``bash experiments/gpu_check.sh`` on a lent GPU machine);
* ``by hand``: a reading of other sections (README's advice on losses) or a table assembled
  from several runs (``Commands:``, a before/after pair): it quotes its commands, which are rerun
  and the section rewritten by hand.

The test ``tests/test_readme.py`` fails when a section names no command or a script that is gone.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from rankkit.infra.io import atomic_write

ROOT = Path(__file__).resolve().parents[1]
SECTION = re.compile(r"<!-- ([a-z0-9_-]+):start -->(.*?)<!-- \1:end -->", flags=re.S)
QUOTED = re.compile(r"`((?:[A-Z_]+=\S+ )*(?:python3?|rankkit|make|bash)\b[^`]*)`")


class Section(NamedTuple):
    name: str
    path: Path
    command: str
    how: str  # writes | demo | gpu | by hand


def _command(body: str) -> str:
    stated = re.search(r"\bcommand: `([^`]*)`", body, flags=re.I)
    if stated:
        return stated.group(1)
    quoted = QUOTED.findall(body)
    return quoted[0] if quoted else ""


def _how(name: str, command: str, body: str) -> str:
    if name == "demo":
        return "demo"
    if "gpu_check.sh" in command or "bench_gpu.py" in command:
        return "gpu"
    if re.search(r"\bcommand: `", body, flags=re.I) and " --write " in f" {command} ":
        return "writes"
    return "by hand"


def sections(root: Path = ROOT) -> list[Section]:
    """Every generated section of README.md and docs/*.md, in page order."""
    found = []
    for path in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for m in SECTION.finditer(path.read_text()):
            command = _command(m.group(2))
            found.append(Section(m.group(1), path, command, _how(m.group(1), command, m.group(2))))
    return found


def runnable(command: str) -> list[str]:
    """The argv of a quoted ``writes`` command: environment assignments dropped, ``python`` this
    interpreter. Refuses a command with a placeholder (``<JSON>``)."""
    argv = shlex.split(command)
    while argv and re.fullmatch(r"[A-Z_]+=\S*", argv[0]):
        argv.pop(0)
    if any("<" in a and ">" in a for a in argv):
        raise ValueError(f"command {command!r} holds a placeholder; it cannot be rerun as written")
    if argv and argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return argv


def _demo_table(out: Path, wall: float) -> str:
    table = (out / "table.md").read_text().strip()
    table = table[table.index("| model |"):]  # the protocol sentence above it is said here instead
    import torch

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"What `rankkit compare --config compare` (the main job of `make demo`) printed on "
            f"{datetime.date.today()}\n({os.cpu_count()} CPU cores, load {load:.0f}; torch {torch.__version__}; "
            f"the whole run took {wall:.0f} s).\nMQ2008 Fold1, seed 0, test metrics of the epoch or tree with the "
            f"best vali NDCG@10; exp gain, a\nquery with nothing relevant scores 1 in NDCG and MAP. The metrics "
            f"repeat to the digit on any machine\n(same seed, CPU); `train s` is wall time at the load above, so "
            f"compare rows with each other, not with\nyour machine; `export KiB` is the size of the TorchScript "
            f"file written:\n\n{table}\n")


def regenerate_demo(readme: Path = ROOT / "README.md") -> None:
    """Run the demo's compare into a temporary folder and put its table into README's section
    (the prose after the table is kept)."""
    rankkit = Path(sys.executable).with_name("rankkit")
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        subprocess.run([str(rankkit), "compare", "--config", "compare", "--out", tmp], check=True, cwd=ROOT)
        head = _demo_table(Path(tmp), time.perf_counter() - t0)
    text = readme.read_text()
    start = text.index("<!-- demo:start -->\n") + len("<!-- demo:start -->\n")
    table_end = text.index("\n\n", text.index("| model |", start))
    rewritten = text[:start] + head + text[table_end + 1:]
    atomic_write(readme, lambda tmp: Path(tmp).write_text(rewritten))


def regenerate(section: Section) -> str:
    """Rerun one section; returns what was done."""
    if section.how == "demo":
        regenerate_demo()
        return "rewritten"
    if section.how == "gpu":
        import torch

        if not torch.cuda.is_available():
            return "skipped: needs a CUDA device (bash experiments/gpu_check.sh on a GPU machine)"
        subprocess.run(["bash", "experiments/gpu_check.sh"], check=True, cwd=ROOT)
        return "rewritten"
    if section.how == "by hand":
        return f"skipped: assembled by hand; rerun what it quotes ({section.command or 'no command'})"
    subprocess.run(runnable(section.command), check=True, cwd=ROOT)
    return "rewritten"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="sections to regenerate (see --list)")
    ap.add_argument("--all", action="store_true", help="every runnable section (hours on 2 cores)")
    ap.add_argument("--list", action="store_true", help="list the sections, their commands and how each is rerun")
    ap.add_argument("--json", action="store_true", help="with --list: as JSON")
    args = ap.parse_args(argv)
    found = sections()
    if args.list or not (args.names or args.all):
        rows = [{"section": s.name, "file": str(s.path.relative_to(ROOT)), "how": s.how, "command": s.command}
                for s in found]
        if args.json:
            print(json.dumps(rows, indent=1))
        else:
            for r in rows:
                print(f"{r['section']:<28} {r['file']:<22} {r['how']:<8} {r['command']}")
        return 0
    known = {s.name for s in found}
    unknown = [n for n in args.names if n not in known]
    if unknown:
        ap.error(f"no generated section named {', '.join(unknown)} (see --list)")
    chosen = found if args.all else [s for s in found if s.name in args.names]
    done: dict[str, str] = {}
    for s in chosen:
        key = s.command if s.how == "writes" else s.name
        if key in done:  # one run of a script writes all of its sections
            continue
        print(f"== {s.name} ({s.path.name}): {s.command}", flush=True)
        done[key] = regenerate(s)
        print(f"   {done[key]}", flush=True)
    print(f"{platform.node()}: {len(done)} command(s) run or skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
