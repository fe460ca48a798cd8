"""The booster's kernels, one seam for its backends, and the choice of backend.

A boosting round is a plan (built once per data set: queries, padding, ideal DCG) and a handful of
kernels::

    plan ──► lambdas (grad, hess) ──► tree: root histogram ─► per level: split scan + argmax
         ──► routing ─► smaller children's histograms (larger = parent − smaller)) ──► leaves
         ──► score update ──► eval metric

:mod:`rankkit.kernels.backends` is the seam: one :class:`~rankkit.kernels.backends.Backend`
object per fit, chosen by :func:`~rankkit.kernels.backends.choose` from the device and the
request (every ``RANKKIT_*`` switch of the kernels is read there, by one rule), runs the
round's steps. Its implementations:

* ``"torch"`` -- :mod:`rankkit.kernels.torch_ref`: plain torch ops on any device, no host
  sync; the reference every other backend is tested against.
* ``"cpu"`` -- :mod:`rankkit.kernels.cpu`: C with OpenMP (``_cpu.c``, ``_lambdas.c``), built
  at install by setup.py and called through ctypes; a round is three calls into C (the lambda
  pass, the whole tree with its leaves, each eval set's update).
* ``"triton"`` -- :mod:`rankkit.kernels.triton`: the GPU kernels (lambdas, level histograms,
  one launch a level for the rows' finishing, the siblings, the split scan and the pick, routing,
  score update; no host sync inside a tree), the
  default for CUDA tensors when Triton is importable; proven under Triton's interpreter
  (``RANKKIT_TRITON=force`` with ``TRITON_INTERPRET=1`` runs them on CPU tensors).

See docs/design.md for the picture of a round and how to add a backend.
"""
from __future__ import annotations

from rankkit.kernels import backends, cpu, torch_ref
from rankkit.kernels.backends import BACKENDS, Backend, choose, read_switches

__all__ = ["BACKENDS", "Backend", "backends", "choose", "cpu", "read_switches", "torch_ref"]
