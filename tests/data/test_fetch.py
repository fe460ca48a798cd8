"""rankkit.data.fetch: downloads verified by checksum and cached; a mismatch leaves nothing."""
from __future__ import annotations

import hashlib
import http.server
import io
import threading
import zipfile

import pytest
import torch
from samples import GOOD

from rankkit.data import fetch as fetch_mod
from rankkit.data import fetch_letor_zip


# -- fetch --------------------------------------------------------------------------------------
@pytest.fixture
def http_zip(tmp_path):
    """A local HTTP server (loopback only) serving a LETOR-style zip."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for split in ("train", "vali", "test"):
            z.writestr(f"Fold1/{split}.txt", GOOD)
    payload = buf.getvalue()

    class Handler(http.server.BaseHTTPRequestHandler):
        hits = 0

        def do_GET(self):  # noqa: N802
            Handler.hits += 1
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/data.zip", hashlib.sha256(payload).hexdigest(), Handler
    server.shutdown()


def test_fetch_downloads_verifies_and_caches(tmp_path, http_zip, monkeypatch):
    url, digest, handler = http_zip
    monkeypatch.setitem(fetch_mod.REMOTES, "toy", fetch_mod.Remote(url, "toy.zip", digest, 3))
    root = tmp_path / "cache"
    train, vali, test = fetch_letor_zip("toy", 1, root=root)
    assert train.n_queries == 2 and test.n_docs == 5
    assert handler.hits == 1
    again = fetch_letor_zip("toy", 1, root=root)  # from the .npz cache, no download
    assert torch.equal(again[0].features, train.features) and handler.hits == 1


def test_fetch_checksum_mismatch_leaves_nothing(tmp_path, http_zip, monkeypatch):
    url, digest, _ = http_zip
    monkeypatch.setitem(fetch_mod.REMOTES, "toy", fetch_mod.Remote(url, "toy.zip", "0" * 64, 3))
    with pytest.raises(ValueError, match="checksum mismatch"):
        fetch_letor_zip("toy", 1, root=tmp_path)
    assert list((tmp_path / "toy").iterdir()) == []
    with pytest.raises(ValueError, match="no published checksum"):
        fetch_letor_zip("mslr-web30k", 1, root=tmp_path)
