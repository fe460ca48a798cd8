"""The round's tree and eval metrics as one float64 buffer, for its one device-to-host copy.

The round ends with one copy to the host: each level's feature, code and gain, the eval sets'
metrics and the leaf values (:func:`rankkit.boosting.engine._round_on_host`). In torch that is
a cast per integer part and a concatenation, each a new tensor; here it is one launch into a
buffer kept for the fit.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from rankkit.kernels.workspace import workspace_or_fresh

#: The parts one launch packs (the tree's four and up to four eval sets' metrics).
MAX_PARTS = 8
BLOCK = 256


@triton.jit
def _part(out_ptr, base, x_ptr, n, BLOCK: tl.constexpr):
    """out[base : base + n] = x[:n] as float64; the next part's base."""
    for i in range(0, n, BLOCK):
        offs = i + tl.arange(0, BLOCK)
        keep = offs < n
        tl.store(out_ptr + base + offs, tl.load(x_ptr + offs, mask=keep).to(tl.float64), mask=keep)
    return base + n


@triton.jit
def _pack_kernel(out_ptr, p0, n0, p1, n1, p2, n2, p3, n3, p4, n4, p5, n5, p6, n6, p7, n7, BLOCK: tl.constexpr):
    """One program: the parts (n_i = 0: none) one after another, each cast to float64."""
    base = _part(out_ptr, 0, p0, n0, BLOCK)
    base = _part(out_ptr, base, p1, n1, BLOCK)
    base = _part(out_ptr, base, p2, n2, BLOCK)
    base = _part(out_ptr, base, p3, n3, BLOCK)
    base = _part(out_ptr, base, p4, n4, BLOCK)
    base = _part(out_ptr, base, p5, n5, BLOCK)
    base = _part(out_ptr, base, p6, n6, BLOCK)
    _part(out_ptr, base, p7, n7, BLOCK)


def pack_float64(parts: list[torch.Tensor], workspace=None) -> torch.Tensor:
    """``torch.cat([p.double().reshape(-1) for p in parts])`` in one launch (at most
    :data:`MAX_PARTS` parts, each contiguous, on one device), into the workspace's buffer
    (valid until the next call; None: a new tensor)."""
    if not parts or len(parts) > MAX_PARTS:
        raise ValueError(f"`parts`: 1 to {MAX_PARTS} tensors, got {len(parts)}")
    device = parts[0].device
    for i, p in enumerate(parts):
        if not isinstance(p, torch.Tensor) or p.device != device or not p.is_contiguous():
            raise ValueError(f"`parts[{i}]` has to be a contiguous tensor on {device} (as parts[0]), got "
                             f"{type(p).__name__ if not isinstance(p, torch.Tensor) else p.device}"
                             f"{'' if not isinstance(p, torch.Tensor) or p.is_contiguous() else ', not contiguous'}")
    out = workspace_or_fresh(workspace).empty("packed", sum(p.numel() for p in parts), torch.float64, device)
    args = []
    for i in range(MAX_PARTS):
        args += [parts[i], parts[i].numel()] if i < len(parts) else [out, 0]
    _pack_kernel[(1,)](out, *args, BLOCK=BLOCK)
    return out
