"""rankkit.infra.io: an output that names an open descriptor is recognised by what it means, not how
it is spelt, and written through, never renamed over."""
from __future__ import annotations

import os

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
