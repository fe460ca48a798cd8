"""rankkit.data.dataset's .npz caches: headers checked before numpy allocates."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from rankkit.data import make_synthetic


# -- .npz caches: headers checked before numpy allocates --------------------------------------------
def _npz(path: Path, members: dict[str, bytes], compression=0) -> Path:
    import zipfile

    with zipfile.ZipFile(path, "w", compression=compression) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def _npy_header(shape, descr="<f4") -> bytes:
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


@pytest.mark.parametrize("members,match", [
    ({"features.npy": _npy_header((2**40,)) + b"\0" * 16},
     r"declares 4398046511104 bytes of data, the member holds 16"),
    ({"features.npy": _npy_header((2**20, 2**20)) + b"\0" * 4}, r"declares 4398046511104 bytes"),
    ({"features.npy": _npy_header((2,), "|O") + b"\0" * 16}, r"holds Python objects"),
    ({"evil.pkl": b"cos\nsystem\n"}, r"member 'evil.pkl' is not a .npy array"),
])
def test_npz_header_limits(tmp_path, members, match):
    """A header claiming 4 TiB gave a MemoryError traceback (numpy allocates from the header)."""
    from rankkit.data import RankingDataset

    path = _npz(tmp_path / "c.npz", members)
    with pytest.raises(ValueError, match=match):
        RankingDataset.load(path)


def test_npz_compressed_member_claiming_too_much(tmp_path):
    import zipfile

    from rankkit.data import RankingDataset

    data = _npy_header((2**30,)) + b"\0" * 4096  # deflates to a few bytes; declares 4 GiB
    path = _npz(tmp_path / "c.npz", {"features.npy": data}, compression=zipfile.ZIP_DEFLATED)
    with pytest.raises(ValueError, match=r"declares 4294967296 bytes of data, the member holds 4096"):
        RankingDataset.load(path)
    ds = make_synthetic(3, 4, 2, seed=0)
    ds.save(tmp_path / "ok.npz")  # rankkit's own cache passes the checks
    assert torch.equal(RankingDataset.load(tmp_path / "ok.npz").features, ds.features)
