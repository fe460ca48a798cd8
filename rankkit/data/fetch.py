"""Download public LTR sets into a local cache, verifying checksums.

The archive is streamed to a temporary file in the cache folder, its SHA-256 is checked,
and only then is it renamed into place, so an interrupted or corrupted download never
leaves a file that looks complete. Parsed folds are cached as ``.npz`` next to it.

The cache folder is ``$RANKKIT_DATA`` or ``~/.cache/rankkit``.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import urllib.request
import zipfile
from dataclasses import dataclass

from rankkit.data.dataset import RankingDataset
from rankkit.data.svmlight import read_svmlight


@dataclass(frozen=True)
class Remote:
    """A downloadable archive: its URL, file name and SHA-256 (None when not published)."""

    url: str
    filename: str
    sha256: str | None
    n_features: int


REMOTES = {
    "mslr-web10k": Remote("https://api.onedrive.com/v1.0/shares/s!AtsMfWUz5l8nbOIoJ6Ks0bEMp78/root/content",
                          "MSLR-WEB10K.zip",
                          "2902142ea33f18c59414f654212de5063033b707d5c3939556124b1120d3a0ba", 136),
    # No checksum of the 30k archive is published with it: pass sha256= yourself.
    "mslr-web30k": Remote("https://api.onedrive.com/v1.0/shares/s!AtsMfWUz5l8nbXGPBlwD1rnFdBY/root/content",
                          "MSLR-WEB30K.zip", None, 136),
}


def cache_dir(path: str | os.PathLike | None = None) -> str:
    d = os.fspath(path) if path is not None else os.environ.get(
        "RANKKIT_DATA", os.path.join(os.path.expanduser("~"), ".cache", "rankkit"))
    os.makedirs(d, exist_ok=True)
    return d


def sha256_of(path: str, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def download(url: str, dest: str, *, sha256: str, timeout: float = 60.0) -> str:
    """Download ``url`` to ``dest`` unless a file with the right SHA-256 is already there.

    A file already at ``dest`` with another SHA-256 is left as it is (it may be the user's own
    download, of another version): fetch never deletes or replaces a file it did not write.

    Raises:
        ValueError: the downloaded bytes do not match ``sha256`` (nothing is left behind), or a
            file with another SHA-256 is already at ``dest``.
    """
    if os.path.exists(dest):
        got = sha256_of(dest)
        if got == sha256:
            return dest
        raise ValueError(f"{dest} exists but its sha256 is {got}, not the expected {sha256}: rankkit does not "
                         f"replace it; move it away to download again, or pass sha256= of that archive")
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(dest)), suffix=".part")
    h = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as resp:
            for block in iter(lambda: resp.read(1 << 20), b""):
                h.update(block)
                out.write(block)
        if h.hexdigest() != sha256:
            raise ValueError(f"checksum mismatch for {url}: expected sha256 {sha256}, got {h.hexdigest()}")
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dest


def fetch_letor_zip(name: str, fold: int = 1, *, root: str | os.PathLike | None = None,
                    url: str | None = None, sha256: str | None = None,
                    ) -> tuple[RankingDataset, RankingDataset, RankingDataset]:
    """Download (once) a LETOR-style zip with ``FoldN/{train,vali,test}.txt`` and load a fold.

    Args:
        name: a key of :data:`REMOTES` (``"mslr-web10k"``, ``"mslr-web30k"``).
        fold: 1..5.
        root: cache folder (see module docstring).
        url, sha256: override the registry (a mirror, or the 30k checksum).
    Returns:
        ``(train, vali, test)``; parsed folds are cached as ``.npz`` for the next call.
    """
    if name not in REMOTES:
        raise ValueError(f"`name` has to be one of {sorted(REMOTES)}, got {name!r}")
    if fold not in range(1, 6):
        raise ValueError(f"`fold` has to be one of 1..5, got {fold!r}")
    remote = REMOTES[name]
    digest = sha256 or remote.sha256
    if digest is None:
        raise ValueError(f"no published checksum for {name}: pass sha256=<the archive's SHA-256>")
    if not (isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
        raise ValueError(f"`sha256` has to be 64 lowercase hex digits, got {digest!r}")
    base = os.path.join(cache_dir(root), name)
    os.makedirs(base, exist_ok=True)
    splits = ("train", "vali", "test")
    cached = [os.path.join(base, f"fold{fold}_{s}.npz") for s in splits]
    # Each cache names the archive it was parsed from (its SHA-256): a cache from another
    # source (another archive, or a file put there by hand) is refused, never used silently.
    sources = [f"{name}/fold{fold}/{s} sha256={digest}" for s in splits]
    found = [_cached(p, source) for p, source in zip(cached, sources)]
    if all(ds is not None for ds in found):
        return tuple(found)  # type: ignore[return-value]
    archive = download(url or remote.url, os.path.join(base, remote.filename), sha256=digest)
    out = []
    with zipfile.ZipFile(archive) as z, tempfile.TemporaryDirectory(dir=base) as tmp:
        members = {os.path.normpath(m): m for m in z.namelist()}
        for s, cache, source in zip(splits, cached, sources):
            key = next((m for m in members if m.endswith(os.path.join(f"Fold{fold}", f"{s}.txt"))), None)
            if key is None:
                raise ValueError(f"{archive}: no Fold{fold}/{s}.txt inside")
            target = os.path.join(tmp, f"{s}.txt")
            with z.open(members[key]) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            ds = read_svmlight(target, n_features=remote.n_features)
            ds.source = source
            ds.save(cache)
            out.append(ds)
    return tuple(out)  # type: ignore[return-value]


def _cached(path: str, source: str) -> RankingDataset | None:
    """The dataset cached at ``path`` (None when there is none), if it was parsed from ``source``.

    Raises:
        ValueError: the file holds another source's data (or is not a dataset cache).
    """
    if not os.path.exists(path):
        return None
    ds = RankingDataset.load(path)
    if ds.source != source:
        raise ValueError(f"{path}: this cache holds {ds.source!r}, not {source!r} (another archive or another "
                         f"source); rankkit does not use or replace it: move it away to parse the archive again")
    return ds


def fetch_mslr_web10k(fold: int = 1, **kwargs) -> tuple[RankingDataset, RankingDataset, RankingDataset]:
    """MSLR-WEB10K fold ``fold`` (10k queries, 136 features, labels 0-4). See :func:`fetch_letor_zip`."""
    return fetch_letor_zip("mslr-web10k", fold, **kwargs)


def fetch_mslr_web30k(fold: int = 1, **kwargs) -> tuple[RankingDataset, RankingDataset, RankingDataset]:
    """MSLR-WEB30K fold ``fold`` (31.5k queries, 136 features). Needs ``sha256=``. See :func:`fetch_letor_zip`."""
    return fetch_letor_zip("mslr-web30k", fold, **kwargs)
