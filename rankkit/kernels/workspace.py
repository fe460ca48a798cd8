"""A fit's device buffers, kept from round to round: no allocation after the first round.

Every kernel of the Triton round writes into buffers it is given. :class:`Workspace` hands them
out by name and keeps them, so that the second round of a fit finds the first round's buffers
(the same tensors while their shapes stay: S5 of ../shared/design/gpu-round.md, and what a
CUDA graph's replay needs). None is zeroed: every kernel writes each entry before it is read,
and the buffers a round accumulates into are cleared by the round's own kernels on their way
(:class:`~rankkit.kernels.triton.fixed.FixedPoint`, each level's kernel for the next level).

``RANKKIT_POISON_WORKSPACE=1`` fills every new buffer with a value no kernel writes (NaN, −1 or
all bits set), so that the tests show that nothing reads an entry before writing it (torch's
fresh CPU memory is often zeros, which would hide such a read).
"""
from __future__ import annotations

import math
import os

import torch


class Workspace:
    """Buffers by name: :meth:`empty` gives the same tensor every call with the same name while
    its shape, dtype and device stay. A buffer only grows: a name asked for with fewer entries
    (a round's row sample, which changes its document count every round) gets a view of the
    memory it holds, and new memory (a quarter more than asked) only when it needs more, or
    another dtype or device.

    Args:
        keep: False: every call allocates (a function called without a workspace).
    """

    def __init__(self, *, keep: bool = True):
        self.keep = keep
        self.buffers: dict = {}  # name -> the tensor last handed out
        self.bases: dict = {}  # name -> the flat memory behind it
        self.allocations = 0
        self.poison = os.environ.get("RANKKIT_POISON_WORKSPACE", "") == "1"

    def __repr__(self) -> str:
        return f"Workspace({len(self.buffers)} buffers, {self.allocations} allocations)"

    def empty(self, name, shape, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
        """The buffer ``name`` (any hashable) of ``shape``, not zeroed."""
        shape = tuple(int(d) for d in (shape if isinstance(shape, (tuple, list, torch.Size)) else (shape,)))
        device = torch.device(device)
        kept = self.buffers.get(name) if self.keep else None
        if kept is not None and tuple(kept.shape) == shape and kept.dtype == dtype and kept.device == device:
            return kept
        numel = math.prod(shape)
        base = self.bases.get(name) if self.keep else None
        if base is None or base.dtype != dtype or base.device != device or base.numel() < numel:
            # Growing: a quarter more, so that a row sample's next larger round fits.
            grown = base is not None and base.dtype == dtype and base.device == device
            base = torch.empty(max(numel + (numel // 4 if grown else 0), 1), dtype=dtype, device=device)
            self.allocations += 1
            if self.poison:
                base.fill_(True if dtype == torch.bool else float("nan") if dtype.is_floating_point else -1)
        out = base[:numel].view(shape)
        if self.keep:
            self.buffers[name], self.bases[name] = out, base
        return out

    def scope(self, *prefix) -> "Scope":
        """This workspace's buffers under ``prefix`` (one caller's names apart from another's)."""
        return Scope(self, prefix)


class Scope:
    """A :class:`Workspace`'s buffers whose names start with ``prefix``."""

    def __init__(self, workspace: Workspace, prefix: tuple):
        self.workspace, self.prefix = workspace, prefix

    def empty(self, name, shape, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
        return self.workspace.empty((*self.prefix, name), shape, dtype, device)

    def scope(self, *prefix) -> "Scope":
        return Scope(self.workspace, (*self.prefix, *prefix))


def workspace_or_fresh(workspace: "Workspace | Scope | None") -> "Workspace | Scope":
    """``workspace``, or one that allocates every buffer afresh (a call outside a fit)."""
    return Workspace(keep=False) if workspace is None else workspace
