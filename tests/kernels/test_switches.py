"""rankkit.kernels.switches: the RANKKIT_* switches read by one rule, and when Triton takes a device."""
import importlib.util

import pytest
import torch

from rankkit.kernels import switches as sw


@pytest.mark.parametrize("raw, expected", [("", "auto"), (" AUTO ", "auto"), ("0", "off"), ("No", "off"),
                                           ("false", "off"), ("1", "on"), ("YES", "on"), ("on", "on")])
def test_every_switch_reads_the_same_spellings(raw, expected):
    for name, field in [("RANKKIT_CPU_KERNEL", "cpu_kernel"), ("RANKKIT_CPU_LAMBDAS", "cpu_lambdas"),
                        ("RANKKIT_TRITON", "triton"), ("RANKKIT_BACKEND", "backend")]:
        assert getattr(sw.read_switches({name: raw}), field) == expected


def test_a_switch_takes_its_own_extra_values_only():
    assert sw.read_switches({"RANKKIT_BACKEND": "Triton"}).backend == "triton"
    assert sw.read_switches({"RANKKIT_TRITON": "force"}).triton == "force"
    with pytest.raises(ValueError, match=r"RANKKIT_CPU_KERNEL='force': expected one of auto, 0/off, 1/on$"):
        sw.read_switches({"RANKKIT_CPU_KERNEL": "force"})
    with pytest.raises(ValueError, match=r"RANKKIT_BACKEND='gpu'.*torch, cpu, triton"):
        sw.read_switches({"RANKKIT_BACKEND": "gpu"})


def test_the_library_override_is_a_path_or_none():
    assert sw.library_override({}) is None and sw.library_override({"RANKKIT_CPU_LIBRARY": ""}) is None
    assert sw.library_override({"RANKKIT_CPU_LIBRARY": "/tmp/x.so"}) == "/tmp/x.so"


def test_read_switches_reads_the_environment_now(monkeypatch):
    monkeypatch.setenv("RANKKIT_CPU_LAMBDAS", "off")
    assert sw.read_switches().cpu_lambdas == "off"
    monkeypatch.setenv("RANKKIT_CPU_LAMBDAS", "on")
    assert sw.read_switches().cpu_lambdas == "on"


def test_triton_takes_a_cuda_device_of_a_cuda_build_only(monkeypatch):
    has_triton = importlib.util.find_spec("triton") is not None
    off, auto = sw.Switches(triton="off"), sw.Switches()
    assert not sw.triton_takes("cuda", off) and not sw.triton_takes("cpu", auto)
    monkeypatch.setattr(torch.version, "cuda", None)  # the simulated device's case: cuda on a CPU build
    assert not sw.triton_takes("cuda", auto)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    assert sw.triton_takes("cuda", auto) == has_triton


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_forcing_triton_onto_the_cpu_needs_the_interpreter(monkeypatch):
    force = sw.Switches(triton="force")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert sw.triton_takes("cpu", force)
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="RANKKIT_TRITON=force on cpu tensors needs Triton's interpreter"):
        sw.triton_takes("cpu", force)
