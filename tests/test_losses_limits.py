"""rankkit.losses at the float32 limits: ListMLE's hessian."""
from __future__ import annotations

import torch


def test_listmle_hessian_at_the_float32_limit():
    """At scores ±3e38 the float32 Hessian was inf - inf = NaN; now it matches float64."""
    from rankkit.losses import listmle_loss

    s = torch.tensor([[3e38, -3e38, 0.0, 1.0]])
    y = torch.tensor([[0.0, 2.0, 1.0, 1.0]])
    grad, hess, _ = listmle_loss(s, y)
    grad64, hess64, _ = listmle_loss(s.double(), y.double())
    assert torch.isfinite(grad).all() and torch.isfinite(hess).all()
    torch.testing.assert_close(grad, grad64.float())
    torch.testing.assert_close(hess, hess64.float())
    # an ordinary batch: float32 in, the same as float64 in (the float64 inside changes nothing else)
    s = torch.randn(3, 6, generator=torch.Generator().manual_seed(0))
    y = torch.randint(0, 3, (3, 6), generator=torch.Generator().manual_seed(1)).float()
    for a, b in zip(listmle_loss(s, y), listmle_loss(s.double(), y.double())):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b.float())
