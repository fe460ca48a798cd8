"""Writing files safely: every file rankkit writes appears whole or not at all
(:func:`atomic_write`), and no command writes over one of its own inputs (:func:`check_outputs`)."""
from __future__ import annotations

import io
import os
import re
import shutil
import stat
import sys
import tempfile
from typing import BinaryIO, Callable, Iterable, Mapping

# The temporary file of an atomic write: ".<target name>.<pid>.rk<random><suffix>" beside the
# target, so a write killed half-way (SIGKILL, power loss) leaves a file that the next write
# of the same target recognises and removes once its process is gone.
_TMP_TAG = ".rk"


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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # someone else's process (or a number we cannot ask about): leave its file
    return True


def _remove_stale_temps(directory: str, name: str) -> None:
    """Remove the temporary files of earlier atomic writes of ``directory/name`` whose process
    no longer runs (a writer killed by SIGKILL cannot clean up after itself). Only our own
    regular files are touched."""
    pattern = re.compile(re.escape(f".{name}.") + r"(\d+)" + re.escape(_TMP_TAG) + r"[A-Za-z0-9_]+.*\Z")
    try:
        entries = os.listdir(directory)
    except OSError:
        return
    for entry in entries:
        m = pattern.match(entry)
        if not m or int(m.group(1)) == os.getpid() or _pid_alive(int(m.group(1))):
            continue
        path = os.path.join(directory, entry)
        try:
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid():
                os.unlink(path)
        except OSError:
            pass


def atomic_write(path: str | os.PathLike, write: Callable[[str], None], *, suffix: str = ".tmp") -> str:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then rename it over ``path``.

    The rename is atomic on POSIX and Windows, so a reader, or a crash half-way, never sees a
    partial file. If ``write`` raises (an exception, a full disk, a KeyboardInterrupt), the old
    ``path`` is left as it was and the temporary file is removed; a temporary file left by a
    writer that was killed outright (SIGKILL) is removed by the next write of the same path.
    Creates the directory. When ``path`` is a symbolic link, the file it points to is replaced
    (the link stays a link). When it is an existing special file (``/dev/null``, a named pipe),
    ``write`` writes straight into it: renaming over it would replace the device. When it names
    an open descriptor (``/dev/stdout``, ``/dev/stderr``, ``/dev/fd/N``, ``/proc/self/fd/N``),
    the bytes go through that descriptor, whatever it is open on (``-o /dev/stdout >> log.txt``
    appends to log.txt, never renames over it).

    The new file gets the permissions of a file created with ``open(path, "w")``:
    ``0o666 & ~umask`` (0644 under the usual umask 022), not the 0600 of ``mkstemp``.
    ``suffix`` ends the temporary file's name (some writers look at the extension).

    Returns ``path`` as a string.
    """
    path = os.fspath(path)
    fd = _stream_fd(path)
    if fd is not None:  # /dev/stdout and friends: into the open file, never renamed over it
        return _write_to_fd(path, fd, write, suffix)
    target = os.path.realpath(path) if os.path.islink(path) else os.path.abspath(path)
    directory, name = os.path.split(target)
    _check_parents(directory, path)
    if os.path.exists(target) and not os.path.isfile(target):
        if os.path.isdir(target):
            raise IsADirectoryError(f"{path}: is a folder; cannot write a file there")
        try:
            write(target)
        except OSError as e:
            if e.errno is None or e.filename not in (None, target):
                raise
            raise type(e)(e.errno, e.strerror or os.strerror(e.errno), path) from e
        return path
    os.makedirs(directory, exist_ok=True)
    _remove_stale_temps(directory, name)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.{os.getpid()}{_TMP_TAG}", suffix=suffix)
    try:
        os.close(fd)
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except OSError as e:
        if e.errno is None or e.filename not in (None, tmp):
            raise
        raise type(e)(e.errno, e.strerror or os.strerror(e.errno), path) from e  # the user's path, not tmp
    finally:
        if os.path.lexists(tmp):
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return path


_STREAMS = {"/dev/stdout": 1, "/dev/stderr": 2}
_FD_PATH = re.compile(r"/(?:dev/fd|proc/(?:self|thread-self|\d+)/fd)/(\d+)")


def _stream_fd(path: str) -> int | None:
    """The file descriptor that ``path`` names (``/dev/stdout``, ``/dev/stderr``, ``/dev/fd/N``,
    ``/proc/self/fd/N``, ``/proc/<this pid>/fd/N``), or None. Such a path resolves to whatever
    the descriptor is open on -- a regular file after ``>> log.txt`` -- and reopening it would
    truncate that file; rankkit writes through the descriptor instead.

    Recognised by what the path means, not how it is spelt: any spelling (``//dev/stdout``,
    ``/dev/./stdout``, ``/proc/self/fd//1``, a relative path), a folder on the way that is a
    link (``/dev/fd`` is one), and a chain of links that passes through such a name."""
    current = path
    for _ in range(40):  # the kernel's own limit on a chain of links
        for spelling in (_normal(current), _normal(os.path.join(os.path.realpath(os.path.dirname(current) or "."),
                                                                 os.path.basename(current)))):
            fd = _named_fd(spelling)
            if fd is not None:
                return fd
        try:
            link = os.readlink(current)
        except OSError:  # not a link (or one we may not read: another process's descriptor)
            return None
        current = link if os.path.isabs(link) else os.path.join(os.path.dirname(current), link)
    return None


def _normal(path: str) -> str:
    """``path`` absolute, with ``.``, ``..`` and repeated slashes (a leading ``//`` too) folded."""
    return "/" + os.path.abspath(path).lstrip("/")


def _named_fd(path: str) -> int | None:
    """The descriptor of one normalised spelling, or None."""
    if path in _STREAMS:
        return _STREAMS[path]
    m = _FD_PATH.fullmatch(path)
    if m is None:
        return None
    pid = path.split("/")[2]
    if pid.isdigit() and int(pid) != os.getpid():
        return None  # another process's descriptor: not ours to write through
    return int(m.group(1))


def _write_to_fd(path: str, fd: int, write: Callable[[str], None], suffix: str) -> str:
    """``write`` into a private temporary file, then its bytes appended through ``fd`` (a dup of
    it: the descriptor's own mode, O_APPEND included, is kept; nothing is truncated)."""
    tmp_fd, tmp = tempfile.mkstemp(prefix=".rankkit-stream-", suffix=suffix)
    os.close(tmp_fd)
    try:
        write(tmp)
        for stream in (sys.stdout, sys.stderr):  # what Python holds for the descriptor goes first
            if stream is not None and not stream.closed:
                stream.flush()
        with open(tmp, "rb") as src, os.fdopen(os.dup(fd), "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except OSError as e:
        if e.errno is None or e.filename not in (None, tmp):
            raise
        raise type(e)(e.errno, e.strerror or os.strerror(e.errno), path) from e
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    return path


def via_memory(save: Callable[[BinaryIO], None]) -> Callable[[str], None]:
    """A ``write`` for :func:`atomic_write` that serialises into memory, then writes the bytes
    from Python. torch's archive writer (``torch.jit.save``, ``torch.export.save``) aborts the
    whole process when the disk is full or a file-size limit is hit; from Python the same
    failure is an ``OSError`` that :func:`atomic_write` cleans up after."""
    def write(tmp: str) -> None:
        buffer = io.BytesIO()
        save(buffer)
        with open(tmp, "wb") as f:
            f.write(buffer.getbuffer())

    return write


def _check_parents(directory: str, path: str) -> None:
    """A clear error when a folder on the way to ``path`` is a regular file (else ENOTDIR)."""
    d = directory
    while d and not os.path.exists(d):
        parent = os.path.dirname(d)
        if parent == d:
            return
        d = parent
    if d and not os.path.isdir(d):
        raise NotADirectoryError(f"{path}: cannot write it: {d} is a file, not a folder")


# -- the output guard -----------------------------------------------------------------------------
def sidecars(path: str | os.PathLike) -> list[str]:
    """The files read implicitly with a data file: LightGBM's ``<path>.query`` group sizes."""
    return [os.fspath(path) + ".query"]


def _same(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` name one file: the same path once symbolic links are resolved, or
    (both existing) the same device and inode, which also catches hard links."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        sa, sb = os.stat(a), os.stat(b)
    except (OSError, ValueError):
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def first_repeat(paths: Iterable[str | os.PathLike]) -> int | None:
    """The index of the first of ``paths`` that names a file an earlier one names (:func:`_same`:
    the same path once links are resolved, or the same inode), or None."""
    seen: list[str] = []
    for i, path in enumerate(paths):
        if any(_same(os.fspath(path), other) for other in seen):
            return i
        seen.append(os.fspath(path))
    return None


def check_outputs(outputs: Mapping[str, str | os.PathLike | Iterable | None],
                  inputs: Mapping[str, str | os.PathLike | Iterable | None], *,
                  with_sidecars: bool = True) -> None:
    """Refuse, before anything is written, an output that would destroy an input.

    Args:
        outputs: ``{argument name: path or paths}`` of the files a command is about to write
            (None and ``"-"``, stdout, are skipped).
        inputs: ``{argument name: path or paths}`` of the files it reads.
        with_sidecars: also protect each input's sidecars (:func:`sidecars`).

    Raises:
        ValueError: naming both arguments when an output is an input, or an input's sidecar,
            by path, through a symbolic link or as a hard link (same device and inode).
        IsADirectoryError: when an output is an existing folder.
        NotADirectoryError: when a folder on an output's path is a regular file.
    """
    def paths(value) -> list[str]:
        if value is None:
            return []
        if isinstance(value, (str, os.PathLike)):
            return [] if os.fspath(value) == "-" else [os.fspath(value)]
        return [p for v in value for p in paths(v)]

    protected = [(f"the input `{name}`", p) for name, value in inputs.items() for p in paths(value)]
    if with_sidecars:  # after the inputs themselves: an input named twice is reported as the input
        protected += [(f"the sidecar of the input `{name}`", s) for name, value in inputs.items()
                      for p in paths(value) for s in sidecars(p) if os.path.exists(s)]
    for out_name, value in outputs.items():
        for out in paths(value):
            if os.path.isdir(out):
                raise IsADirectoryError(f"`{out_name}` {out}: is a folder; give a file path")
            _check_parents(os.path.dirname(os.path.abspath(out)), out)
            for what, p in protected:
                if _same(out, p):
                    how = "" if os.path.abspath(out) == os.path.abspath(p) else f" ({p})"
                    raise ValueError(f"`{out_name}` {out} is {what}{how}: rankkit never writes over its "
                                     f"inputs; choose another output path")
