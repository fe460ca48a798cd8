"""Fuzzing the file headers under a memory limit: no file makes rankkit allocate past its limits.

Mutated and random bytes go into every loader that reads sizes from a file -- Lightning
checkpoints (:func:`rankkit.infra.checkpoint.load_checkpoint`, including damaged pickles inside an
archive whose checksums are right), ``.npz`` dataset caches (:meth:`RankingDataset.load`),
LETOR files with huge feature indices and LambdaMART model files -- and YAML configs into
:func:`rankkit.infra.yaml.safe_load`. The fuzz runs in a child process whose address space is
capped (``resource.setrlimit(RLIMIT_AS)``) at what it uses after start-up plus
:data:`HEADROOM`: a file that asked for gigabytes would end in ``MemoryError`` or a failed
allocation there, which fails the test, instead of exhausting the machine. Each answer must be
a valid result or ``ValueError``/``FileNotFoundError``.
"""
from __future__ import annotations

import io
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

HEADROOM = 1 << 30  # 1 GiB above the child's start-up address space
FUZZ_FUNCTIONS = ("fuzz_checkpoint_bytes", "fuzz_checkpoint_members", "fuzz_npz_bytes", "fuzz_npz_headers",
                  "fuzz_letor_indices", "fuzz_safetensors_header", "fuzz_yaml")


def test_fuzz_headers_under_a_memory_limit():
    if not sys.platform.startswith("linux"):
        pytest.skip("RLIMIT_AS and /proc/self/status: Linux")
    root = Path(__file__).resolve().parents[1]
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import test_memory_limits as t; t.run_limited()")
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert done.stdout.split() == [f"ok:{name}" for name in FUZZ_FUNCTIONS]


# -- the child ----------------------------------------------------------------------------------------
def run_limited() -> None:
    """Import everything, cap the address space, then run every fuzz function."""
    import resource

    import pytorch_lightning  # noqa: F401 - imported before the cap: its size is not a file's doing
    import torch  # noqa: F401

    import rankkit.neural  # noqa: F401

    with open("/proc/self/status") as f:
        vm = int(f.read().split("VmSize:")[1].split()[0]) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (vm + HEADROOM, vm + HEADROOM))
    try:  # the cap is in force: 2 GiB cannot be had
        torch.empty(2 * HEADROOM, dtype=torch.uint8)
    except RuntimeError:
        pass
    else:
        raise AssertionError("RLIMIT_AS did not limit the child's memory")
    for name in FUZZ_FUNCTIONS:
        globals()[name]()
        print(f"ok:{name}", flush=True)


def _strategies():
    from hypothesis import HealthCheck, settings
    from hypothesis import strategies as st

    fuzz = settings(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck),
                    max_examples=40, database=None)
    mutation = st.lists(st.tuples(st.sampled_from(["flip", "cut", "insert", "delete", "digit"]), st.floats(0, 1),
                                  st.binary(min_size=1, max_size=4)), min_size=1, max_size=3)
    return fuzz, st, mutation


def mutate(data: bytes, mutations) -> bytes:
    """``data`` with bytes flipped, cut, inserted, deleted, or a digit turned into nines (sizes)."""
    out = bytearray(data)
    for op, where, payload in mutations:
        i = min(int(where * len(out)), max(len(out) - 1, 0))
        if op == "flip" and out:
            out[i] ^= payload[0] or 1
        elif op == "cut":
            del out[i:]
        elif op == "insert":
            out[i:i] = payload
        elif op == "delete":
            del out[i:i + len(payload)]
        elif op == "digit":
            j = next((k for k in range(i, len(out)) if 48 <= out[k] <= 57), None)
            if j is not None:
                out[j:j + 1] = b"9" * (1 + payload[0] % 12)
    return bytes(out)


def _refused_or_valid(load, path) -> None:
    try:
        load(path)
    except (ValueError, FileNotFoundError):
        pass


def _members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return {info.filename: z.read(info) for info in z.infolist()}


def _pack(files: dict[str, bytes], compression=zipfile.ZIP_STORED) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=compression) as z:
        for name, data in files.items():
            z.writestr(name, data)
    return out.getvalue()


def _checkpoint_bytes() -> bytes:
    import torch

    from rankkit.neural import RankNet

    torch.manual_seed(0)
    module = RankNet(n_features=4, hidden=[6])
    ckpt = {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams)}
    module.on_save_checkpoint(ckpt)
    buf = io.BytesIO()
    torch.save(ckpt, buf)
    return buf.getvalue()


def _npz_bytes() -> bytes:
    from rankkit.data import make_synthetic

    with tempfile.TemporaryDirectory() as d:
        make_synthetic(3, 4, 2, seed=0).save(os.path.join(d, "c.npz"))
        return Path(d, "c.npz").read_bytes()


def fuzz_checkpoint_bytes() -> None:
    from hypothesis import given

    from rankkit.infra.checkpoint import load_checkpoint

    fuzz, st, mutation = _strategies()
    valid = _checkpoint_bytes()
    folder = Path(tempfile.mkdtemp())

    @fuzz
    @given(mutations=mutation)
    def run(mutations):
        path = folder / "m.ckpt"
        path.write_bytes(mutate(valid, mutations))
        _refused_or_valid(load_checkpoint, path)

    run()


def fuzz_checkpoint_members() -> None:
    """Damaged pickles, sizes and records inside an archive whose checksums are right."""
    from hypothesis import given

    from rankkit.infra.checkpoint import load_checkpoint

    fuzz, st, mutation = _strategies()
    files = _members(_checkpoint_bytes())
    names = sorted(files)
    folder = Path(tempfile.mkdtemp())

    @fuzz
    @given(member=st.sampled_from(names), mutations=mutation)
    def run(member, mutations):
        path = folder / "m.ckpt"
        path.write_bytes(_pack({n: mutate(d, mutations) if n == member else d for n, d in files.items()}))
        _refused_or_valid(load_checkpoint, path)

    run()


def fuzz_npz_bytes() -> None:
    from hypothesis import given

    from rankkit.data import RankingDataset

    fuzz, st, mutation = _strategies()
    valid = _npz_bytes()
    folder = Path(tempfile.mkdtemp())

    @fuzz
    @given(mutations=mutation)
    def run(mutations):
        path = folder / "c.npz"
        path.write_bytes(mutate(valid, mutations))
        _refused_or_valid(RankingDataset.load, path)

    run()


def fuzz_npz_headers() -> None:
    """Damaged .npy headers (shapes of nines) inside a well-formed zip, stored or deflated."""
    from hypothesis import given

    from rankkit.data import RankingDataset

    fuzz, st, mutation = _strategies()
    files = _members(_npz_bytes())
    names = sorted(files)
    folder = Path(tempfile.mkdtemp())

    @fuzz
    @given(member=st.sampled_from(names), mutations=mutation, deflate=st.booleans())
    def run(member, mutations, deflate):
        path = folder / "c.npz"
        packed = {n: mutate(d[:128], mutations) + d[128:] if n == member else d for n, d in files.items()}
        path.write_bytes(_pack(packed, zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED))
        _refused_or_valid(RankingDataset.load, path)

    run()


def fuzz_letor_indices() -> None:
    from hypothesis import given

    from rankkit.data import read_svmlight

    fuzz, st, mutation = _strategies()
    folder = Path(tempfile.mkdtemp())
    valid = b"2 qid:1 1:0.5 2:1.0\n0 qid:1 1:0.1 999999:0.2\n1 qid:2 3:0.7\n"

    @fuzz
    @given(mutations=mutation, n_features=st.sampled_from([None, 3, 10**6]))
    def run(mutations, n_features):
        path = folder / "f.txt"
        path.write_bytes(mutate(valid, mutations))
        _refused_or_valid(lambda p: read_svmlight(p, n_features=n_features), path)

    run()


def fuzz_safetensors_header() -> None:
    """LambdaMART model files with damaged JSON headers (offsets, shapes, n_features_in)."""
    from hypothesis import given

    from rankkit.boosting import LambdaMART
    from rankkit.data import make_synthetic

    fuzz, st, mutation = _strategies()
    folder = Path(tempfile.mkdtemp())
    LambdaMART(n_estimators=2, depth=2).fit(make_synthetic(8, 6, 3, seed=0)).save(folder / "ok.safetensors")
    valid = (folder / "ok.safetensors").read_bytes()
    head = 8 + int.from_bytes(valid[:8], "little")

    @fuzz
    @given(mutations=mutation)
    def run(mutations):
        path = folder / "m.safetensors"
        header = mutate(valid[8:head], mutations)
        path.write_bytes(len(header).to_bytes(8, "little") + header + valid[head:])
        _refused_or_valid(LambdaMART.load, path)

    run()


def fuzz_yaml() -> None:
    from hypothesis import given

    from rankkit.infra import yaml as _yaml

    fuzz, st, mutation = _strategies()
    valid = (Path(__file__).resolve().parents[1] / "rankkit" / "configs" / "lambdarank.yaml").read_text()
    bomb = "a: &a [x, x, x]\n" + "".join(f"{c}: &{c} [*{p}, *{p}, *{p}]\n" for p, c in zip("abcdefghijklm",
                                                                                        "bcdefghijklmn"))

    @fuzz
    @given(base=st.sampled_from([valid, bomb]), mutations=mutation)
    def run(base, mutations):
        text = mutate(base.encode(), mutations).decode("utf-8", "replace")
        try:
            _yaml.safe_load(text, "fuzz.yaml")
        except (ValueError, __import__("yaml").YAMLError):
            pass

    run()
