"""The kernels' ``RANKKIT_*`` switches, read by one rule (see :mod:`rankkit.kernels.backends`
for what each does). Imports nothing of rankkit: every module may read it (the lambda kernel asks
:func:`triton_takes` here).
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Mapping

import torch

BACKENDS = ("torch", "cpu", "triton")

_OFF = ("0", "false", "no", "off")
_ON = ("1", "true", "yes", "on")


def _switch(environ: Mapping[str, str], name: str, extra: tuple[str, ...] = ()) -> str:
    """The value of switch ``name``: "auto", "off", "on" or one of ``extra``."""
    raw = environ.get(name, "")
    value = raw.strip().lower()
    if value in ("", "auto"):
        return "auto"
    if value in _OFF:
        return "off"
    if value in _ON:
        return "on"
    if value in extra:
        return value
    allowed = ", ".join(("auto", "0/off", "1/on", *extra))
    raise ValueError(f"environment variable {name}={raw!r}: expected one of {allowed}")


@dataclass(frozen=True)
class Switches:
    """The kernels' ``RANKKIT_*`` switches, parsed (see the module docstring)."""

    backend: str = "auto"
    cpu_kernel: str = "auto"
    cpu_lambdas: str = "auto"
    triton: str = "auto"
    cuda_histogram: str = "auto"
    cuda_graph: str = "auto"


def read_switches(environ: Mapping[str, str] | None = None) -> Switches:
    """Every ``RANKKIT_*`` switch of the kernels, read now from ``environ`` (default
    ``os.environ``) by one rule.

    >>> s = read_switches({"RANKKIT_TRITON": "Force", "RANKKIT_CPU_LAMBDAS": "0"})
    >>> s.triton, s.cpu_lambdas, s.backend, s.cuda_graph
    ('force', 'off', 'auto', 'auto')
    """
    env = os.environ if environ is None else environ
    return Switches(backend=_switch(env, "RANKKIT_BACKEND", BACKENDS),
                    cpu_kernel=_switch(env, "RANKKIT_CPU_KERNEL"),
                    cpu_lambdas=_switch(env, "RANKKIT_CPU_LAMBDAS"),
                    triton=_switch(env, "RANKKIT_TRITON", ("force",)),
                    cuda_histogram=_switch(env, "RANKKIT_CUDA_HISTOGRAM"),
                    cuda_graph=_switch(env, "RANKKIT_CUDA_GRAPH"))


def library_override(environ: Mapping[str, str] | None = None) -> str | None:
    """``RANKKIT_CPU_LIBRARY``: the path of another build of the compiled CPU kernels to load
    instead of the installed one (the tests' AddressSanitizer build), or None. Read once, when
    :mod:`rankkit.kernels.cpu` is imported."""
    env = os.environ if environ is None else environ
    return env.get("RANKKIT_CPU_LIBRARY") or None


def triton_takes(device: torch.device | str, switches: Switches | None = None) -> bool:
    """Whether the Triton kernels run on ``device``: Triton importable, not switched off, and a
    CUDA device of a CUDA build of torch (the tests' simulated device reports cuda on a CPU build
    and is not taken) or any device with ``RANKKIT_TRITON=force``."""
    s = read_switches() if switches is None else switches
    if s.triton == "off" or importlib.util.find_spec("triton") is None:
        return False
    device = torch.device(device)
    cuda = device.type == "cuda" and torch.version.cuda is not None
    if s.triton == "force" and not cuda and os.environ.get("TRITON_INTERPRET") != "1":
        # forced onto tensors no GPU holds: only Triton's interpreter runs them (else Triton's own
        # "0 active drivers" RuntimeError, deep in the first launch)
        raise ValueError(f"RANKKIT_TRITON=force on {device.type} tensors needs Triton's interpreter: set "
                         f"TRITON_INTERPRET=1 (before triton is imported), or train on a CUDA device")
    return s.triton == "force" or cuda


def cuda_histogram_takes(device: torch.device | str, switches: Switches | None = None) -> bool:
    """Whether the level histograms of integer gradients on ``device`` try the shared-memory CUDA
    kernel (:mod:`rankkit.kernels.shared_histogram`): only when ``RANKKIT_CUDA_HISTOGRAM=1`` (it has
    not run on a GPU yet: "auto" means off until it has been measured there), on a CUDA device of
    a CUDA build of torch."""
    s = read_switches() if switches is None else switches
    device = torch.device(device)
    return s.cuda_histogram == "on" and device.type == "cuda" and torch.version.cuda is not None
