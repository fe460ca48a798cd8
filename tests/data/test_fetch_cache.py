"""rankkit.data.fetch: no cache from another source is used, no user's archive is deleted."""
from __future__ import annotations

import pytest
import torch

from rankkit.data import make_synthetic


# -- fetch: no cache from another source, no user's archive deleted ---------------------------------
@pytest.fixture
def toy_remote(tmp_path, monkeypatch):
    """A LETOR zip served from a file:// URL (no network), registered as remote "toy"."""
    import hashlib
    import zipfile

    from rankkit.data import fetch as fetch_mod

    archive = tmp_path / "served.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for split in ("train", "vali", "test"):
            z.writestr(f"Fold1/{split}.txt", "2 qid:1 1:0.5 2:1\n0 qid:1 1:0.1\n1 qid:2 3:0.7\n0 qid:2 2:0.9\n")
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    monkeypatch.setitem(fetch_mod.REMOTES, "toy", fetch_mod.Remote(archive.as_uri(), "toy.zip", digest, 3))
    return digest


def test_fetch_never_deletes_a_users_archive(tmp_path, toy_remote):
    """``fetch_letor_zip(..., sha256=<wrong>)`` deleted the user's downloaded archive first."""
    from rankkit.data import fetch_letor_zip

    root = tmp_path / "cache"
    (root / "toy").mkdir(parents=True)
    mine = root / "toy" / "toy.zip"
    mine.write_bytes(b"the user's own archive")
    with pytest.raises(ValueError, match=r"toy.zip exists but its sha256 is .* rankkit does not replace it"):
        fetch_letor_zip("toy", 1, root=root, sha256="1" * 64)
    assert mine.read_bytes() == b"the user's own archive"
    with pytest.raises(ValueError, match=r"`sha256` has to be 64 lowercase hex digits"):
        fetch_letor_zip("toy", 1, root=root, sha256="not-a-digest")


def test_fetch_refuses_a_cache_from_another_source(tmp_path, toy_remote):
    """A cached ``.npz`` of another archive (or put there by hand) was returned without a check."""
    from rankkit.data import fetch_letor_zip

    root = tmp_path / "cache"
    train, _, _ = fetch_letor_zip("toy", 1, root=root)
    again, _, _ = fetch_letor_zip("toy", 1, root=root)  # its own cache: used
    assert torch.equal(again.features, train.features)
    other = make_synthetic(2, 3, 3, seed=1)
    other.save(root / "toy" / "fold1_train.npz")  # another source's data under the cache's name
    with pytest.raises(ValueError, match=r"fold1_train.npz: this cache holds .* not 'toy/fold1/train sha256="):
        fetch_letor_zip("toy", 1, root=root)
    with pytest.raises(ValueError, match=r"holds 'toy/fold1/vali sha256=[0-9a-f]+', not 'toy/fold1/vali sha256=2"):
        (root / "toy" / "fold1_train.npz").unlink()
        (root / "toy" / "toy.zip").unlink()
        fetch_letor_zip("toy", 1, root=root, sha256="2" * 64)  # another archive's digest
