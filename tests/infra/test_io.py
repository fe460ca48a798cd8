"""rankkit.infra.io: an output that names an open descriptor is recognised by what it means, not how
it is spelt, and written through, never renamed over."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from rankkit.infra.io import _stream_fd, atomic_write

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc (Linux)")


@pytest.mark.parametrize("spelling", ["/dev/stdout", "/dev//stdout", "/dev/./stdout", "//dev/stdout",
                                      "/proc/self/fd//1", "/dev/fd/1", "/dev/../dev/stdout", "///proc/self/fd/1"])
def test_every_spelling_of_stdout_is_descriptor_1(spelling):
    assert _stream_fd(spelling) == 1


def test_a_link_to_a_descriptor_and_a_relative_spelling(tmp_path, monkeypatch):
    (tmp_path / "out.tsv").symlink_to("/dev/stderr")
    (tmp_path / "hop").symlink_to(tmp_path / "out.tsv")  # a chain of links through /dev/stderr
    assert _stream_fd(str(tmp_path / "out.tsv")) == 2 and _stream_fd(str(tmp_path / "hop")) == 2
    monkeypatch.chdir(tmp_path)
    assert _stream_fd("../" * len(tmp_path.parts) + "dev/stdout") == 1
    assert _stream_fd("plain.tsv") is None and _stream_fd(str(tmp_path / "new" / "x.tsv")) is None


def test_any_spelling_of_an_open_descriptor_appends_through_it(tmp_path):
    log = tmp_path / "log.txt"
    log.write_text("earlier line\n")
    with open(log, "a") as f:
        fd = f.fileno()
        for spelling in (f"/proc/self/fd//{fd}", f"/dev/./fd/{fd}", f"//dev/fd/{fd}"):
            atomic_write(spelling, lambda tmp, s=spelling: open(tmp, "w").write(f"via {s}\n"))
    lines = log.read_text().splitlines()
    assert lines[0] == "earlier line" and len(lines) == 4  # appended, never renamed over
    assert log.is_file() and not log.is_symlink()


# -- every write goes through atomic_write (a route-discovering test, trust round 4) ---------------
#: Writes that need no atomic rename, and why: (file, enclosing function).
UNATOMIC_WRITES = {
    ("rankkit/tune.py", "_fit"): "a trial's (or a refit's) scratch config in its own temporary folder",
    ("rankkit/kernels/triton/aot.py", "compile_kernel"): "compiled artefacts (PTX, cubin) into a folder the "
                                                          "developer names, never beside a user's file",
    ("rankkit/data/fetch.py", "download"): "streams into a mkstemp file beside the target, renamed over it only "
                                           "once the checksum matches (atomic_write's rule, by hand: a stream)",
    ("rankkit/data/fetch.py", "fetch_letor_zip"): "members are extracted into a TemporaryDirectory, and "
                                                  "the datasets cached from them atomically (RankingDataset.save)",
}
_WRITERS = {"write_text", "write_bytes", "savefig", "savez", "savez_compressed", "save"}


def _call_name(call) -> str:
    return getattr(call.func, "id", getattr(call.func, "attr", ""))


def _writes(call) -> bool:
    """Whether a call writes a file: open()/fdopen() with a w/a/x mode, write_text/write_bytes,
    savefig, np.savez, torch.save/np.save."""
    name = _call_name(call)
    if name in ("open", "fdopen"):
        mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
        return isinstance(mode, __import__("ast").Constant) and bool(set(str(mode.value)) & set("wax"))
    if name == "save":
        return getattr(getattr(call.func, "value", None), "id", "") in ("torch", "np")
    return name in _WRITERS


def _write_sites():
    """(file, enclosing top-level function or method, line) of every call in rankkit that writes a
    file, unless that function hands its writes to atomic_write (the write(tmp) callbacks)."""
    import ast

    root = Path(__file__).resolve().parents[2]
    sites = []
    for path in sorted((root / "rankkit").rglob("*.py")):
        rel = str(path.relative_to(root))
        if rel == "rankkit/infra/io.py":  # the gate itself
            continue
        tree = ast.parse(path.read_text())
        functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)] + [
            m for c in tree.body if isinstance(c, ast.ClassDef) for m in c.body if isinstance(m, ast.FunctionDef)]
        for fn in functions:
            calls = [c for c in ast.walk(fn) if isinstance(c, ast.Call)]
            if {_call_name(c) for c in calls} & {"atomic_write", "_atomic_write"}:
                continue
            sites += [(rel, fn.name, c.lineno) for c in calls if _writes(c)]
    return sites


def test_every_file_rankkit_writes_goes_through_atomic_write():
    sites = _write_sites()
    unexplained = [f"{f}:{line} ({fn})" for f, fn, line in sites if (f, fn) not in UNATOMIC_WRITES]
    assert unexplained == [], f"writes outside atomic_write: {unexplained}"
    assert {(f, fn) for f, fn, _ in sites} == set(UNATOMIC_WRITES)  # no stale exemption


#: Every function of rankkit that opens a file to read it, and what bounds what it reads (a
#: route-discovering test: a new reader fails until it is named here with its bound).
READERS = {
    ("rankkit/infra/yaml.py", "read_text"): "MAX_YAML_BYTES; every config, space, override and study file",
    ("rankkit/infra/io.py", "_umask"): "/proc/self/status, the kernel's own few lines, until `Umask:`",
    ("rankkit/infra/threads.py", "schedstat"): "/proc/self/task/*/schedstat, 256 bytes each (the kernel's one line)",
    ("rankkit/infra/io.py", "_write_to_fd"): "copies back rankkit's own temporary file, in 1 MiB blocks",
    ("rankkit/data/svmlight.py", "_open_binary"): "read in blocks of _BLOCK_BYTES, lines of at most MAX_LINE_BYTES",
    ("rankkit/data/svmlight.py", "_count_lines"): "blocks of _BLOCK_BYTES, a count only",
    ("rankkit/data/svmlight.py", "_read_integers"): "sidecar lines of at most _MAX_SIDECAR_LINE",
    ("rankkit/data/fetch.py", "sha256_of"): "blocks of 1 MiB into a hash",
    ("rankkit/export.py", "_read_scorer_bytes"): "a regular file of at most MAX_SCORER_BYTES",
    ("rankkit/serving.py", "load_model"): "8 bytes (a safetensors header's length)",
}


def _read_sites():
    """(file, enclosing function) of every open() in a read mode and every read_text() in rankkit."""
    import ast

    root = Path(__file__).resolve().parents[2]
    sites = set()
    for path in sorted((root / "rankkit").rglob("*.py")):
        rel = str(path.relative_to(root))
        tree = ast.parse(path.read_text())
        functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
        for fn in functions:
            for c in ast.walk(fn):
                if not isinstance(c, ast.Call) or c in _nested_calls(fn):
                    continue
                name = _call_name(c)
                gate = isinstance(c.func, ast.Attribute) and getattr(c.func.value, "id", "") == "_yaml"
                if name == "read_text" and not gate or name == "open" and isinstance(c.func, ast.Name) \
                        and not _writes(c):
                    sites.add((rel, fn.name))
    return sites


def _nested_calls(fn) -> set:
    """The calls inside functions nested in ``fn`` (they belong to the nested function)."""
    import ast

    return {c for inner in ast.walk(fn) if inner is not fn and isinstance(inner, (ast.FunctionDef, ast.Lambda))
            for c in ast.walk(inner) if isinstance(c, ast.Call)}


def test_every_reader_of_a_file_is_bounded():
    sites = _read_sites()
    assert sites - set(READERS) == set(), f"readers without a named bound: {sorted(sites - set(READERS))}"
    assert set(READERS) <= sites  # no stale entry


def test_first_repeat_finds_a_file_named_again_by_any_spelling_or_link(tmp_path):
    from rankkit.infra.io import first_repeat

    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("a")
    b.write_text("b")
    (tmp_path / "link.yaml").symlink_to(a)
    os.link(b, tmp_path / "hard.yaml")
    assert first_repeat([a, b]) is None and first_repeat([]) is None
    assert first_repeat([a, b, tmp_path / "sub" / ".." / "a.yaml"]) == 2  # the same path spelt otherwise
    assert first_repeat([b, tmp_path / "link.yaml", a]) == 2  # a symbolic link, then its target
    assert first_repeat([tmp_path / "hard.yaml", a, b]) == 2  # a hard link: the same inode
