"""The fit's buffers (rankkit.kernels.workspace): a name gives the same tensor while its shape,
dtype and device stay, a new one (kept in its place) when they change; scopes keep callers'
names apart; a workspace that does not keep allocates every time; RANKKIT_POISON_WORKSPACE=1
fills each new buffer with a value no kernel writes (what the interpreted Triton tests run
with, so that a read before a write shows)."""
from __future__ import annotations

import torch

from rankkit.kernels.workspace import Workspace, workspace_or_fresh


def test_a_name_gives_the_same_buffer_while_its_shape_dtype_and_device_stay():
    ws = Workspace()
    a = ws.empty("a", (3, 4), torch.float64, "cpu")
    assert ws.empty("a", (3, 4), torch.float64, "cpu") is a
    assert ws.empty("a", [3, 4], torch.float64, torch.device("cpu")) is a  # a list, a device object
    assert ws.allocations == 1
    b = ws.empty("a", (4, 3), torch.float64, "cpu")  # another shape, as many entries: the same memory
    assert b is not a and ws.empty("a", (4, 3), torch.float64, "cpu") is b and b.data_ptr() == a.data_ptr()
    small = ws.empty("a", (5,), torch.float64, "cpu")  # fewer entries (a row sample): a view, no allocation
    assert small.shape == (5,) and small.data_ptr() == a.data_ptr() and ws.allocations == 1
    big = ws.empty("a", (13,), torch.float64, "cpu")  # more: new memory with a quarter to spare, kept
    assert big.data_ptr() != a.data_ptr() and ws.allocations == 2 and ws.bases["a"].numel() == 16
    assert ws.empty("a", (16,), torch.float64, "cpu").data_ptr() == big.data_ptr() and ws.allocations == 2
    c = ws.empty("a", (4, 3), torch.int32, "cpu")  # another dtype
    assert c.dtype == torch.int32 and ws.allocations == 3
    assert ws.empty("n", 5, torch.int64, "cpu").shape == (5,)  # an int shape
    assert ws.empty("scalar", (), torch.float64, "cpu").shape == ()
    assert ws.empty("none", (0, 3), torch.float64, "cpu").shape == (0, 3)
    assert ws.allocations == 6


def test_scopes_keep_names_apart_and_share_the_store():
    ws = Workspace()
    one, two = ws.scope("eval", 1), ws.scope("eval", 2)
    x = one.empty("mean", (), torch.float64, "cpu")
    assert two.empty("mean", (), torch.float64, "cpu") is not x
    assert ws.scope("eval", 1).empty("mean", (), torch.float64, "cpu") is x
    assert one.scope("level").empty("mean", (), torch.float64, "cpu") is not x
    assert ws.buffers[("eval", 1, "mean")] is x
    assert ws.empty(("eval", 1, "mean"), (), torch.float64, "cpu") is x


def test_without_a_workspace_every_call_allocates():
    fresh = workspace_or_fresh(None)
    assert fresh.empty("a", 3, torch.float64, "cpu") is not fresh.empty("a", 3, torch.float64, "cpu")
    ws = Workspace()
    assert workspace_or_fresh(ws) is ws


def test_poisoned_buffers_hold_what_no_kernel_writes(monkeypatch):
    monkeypatch.setenv("RANKKIT_POISON_WORKSPACE", "1")
    ws = Workspace()
    assert torch.isnan(ws.empty("f", 4, torch.float64, "cpu")).all()
    assert (ws.empty("i", 4, torch.int64, "cpu") == -1).all()
    assert (ws.empty("u", 4, torch.uint8, "cpu") == 255).all()
    assert ws.empty("b", 4, torch.bool, "cpu").all()
    monkeypatch.setenv("RANKKIT_POISON_WORKSPACE", "0")
    assert not Workspace().poison
