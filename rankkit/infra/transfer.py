"""Host-to-device copies that do not block the host."""
from __future__ import annotations

import torch


def upload(device: torch.device | str, *tensors: torch.Tensor) -> list[torch.Tensor]:
    """The host tensors ``tensors`` (1-D, one dtype) on ``device``. To a GPU in one copy that
    does not block the host: packed into pinned memory and copied with ``non_blocking=True``
    (a copy from pageable memory would wait for the device: a host synchronisation). Torch's
    pinned-memory allocator keeps the staging buffer until the copy has run."""
    device = torch.device(device)
    if device.type == "cpu":
        return list(tensors)
    packed = torch.cat(tensors).pin_memory().to(device, non_blocking=True)
    return list(packed.split([len(t) for t in tensors]))
