"""The booster's kernels, one signature per backend, and the choice of backend.

A boosting round is a plan (built once per data set: queries, padding, ideal DCG) and a handful of
kernels::

    plan ──► lambdas (grad, hess) ──► tree: root histogram ─► per level: split scan + argmax
         ──► routing ─► smaller children's histograms (larger = parent − smaller)) ──► leaves
         ──► score update ──► eval metric

Backends:

* ``"torch"`` -- :mod:`rankkit.kernels.torch_ref`: plain torch ops on any device, no host
  sync; the reference every other backend is tested against.
* ``"cpu"`` -- :mod:`rankkit.kernels.cpu`: C with OpenMP (``_cpu.c``), built at install by
  setup.py and called through ctypes; a depth-D tree in D + 2 calls.
* ``"triton"`` -- :mod:`rankkit._triton.backend`: the GPU kernels (lambdas, level
  histograms, split scan with argmax, routing, siblings, score update; a tree's levels in
  5 launches per level, no host sync), the default for CUDA tensors when Triton is
  importable; proven under Triton's interpreter (``RANKKIT_TRITON=force`` with
  ``TRITON_INTERPRET=1`` runs them on CPU tensors).

The lambda pass and the eval metric take the per-data-set plan; they live with it
(:mod:`rankkit.lambdas`, :mod:`rankkit.metrics`). On CPU tensors the booster's RankNet and NDCG
objectives can take the compiled lambda pass instead (:func:`rankkit.kernels.cpu.lambdas`,
``_lambdas.c``): by default where it gives the torch path's bits (``quantized_grad=True``),
for float32 gradients too with ``RANKKIT_CPU_LAMBDAS=1``; ``RANKKIT_CPU_LAMBDAS=0`` or
``RANKKIT_CPU_KERNEL=0`` switch it off (:func:`rankkit.kernels.cpu.lambdas_mode`).
See docs/design.md for how to add a kernel.
"""
from __future__ import annotations

import torch

from rankkit.kernels import cpu, torch_ref

BACKENDS = ("torch", "cpu", "triton")


def tree_backend(device: torch.device | str, requested: str | None = None) -> str:
    """The backend that grows trees on ``device``: ``requested`` when given (checked), else
    ``"cpu"`` for CPU tensors when the compiled kernels are built (and not switched off by
    ``RANKKIT_CPU_KERNEL=0``), else ``"triton"`` where the Triton kernels take the device
    (CUDA with Triton importable, not switched off by ``RANKKIT_TRITON=0``; any device with
    ``RANKKIT_TRITON=force``), else ``"torch"``.

    >>> tree_backend("cpu", "torch")
    'torch'
    """
    from rankkit._triton import backend as triton_backend

    device = torch.device(device)
    if requested is not None:
        if requested not in BACKENDS:
            raise ValueError(f"tree backend must be one of {BACKENDS}, got {requested!r}")
        if requested == "triton" and not triton_backend.enabled_on(device):
            raise ValueError("tree backend 'triton' needs Triton and CUDA tensors (or "
                             "RANKKIT_TRITON=force with TRITON_INTERPRET=1)")
        if requested == "cpu" and (device.type != "cpu" or not cpu.available()):
            raise ValueError("tree backend 'cpu' needs CPU tensors and the compiled kernels "
                             "(built by `pip install -e .` or `python setup.py build_ext --inplace`)")
        return requested
    if device.type == "cpu" and cpu.available():
        return "cpu"
    return "triton" if triton_backend.enabled_on(device) else "torch"


__all__ = ["BACKENDS", "cpu", "torch_ref", "tree_backend"]
