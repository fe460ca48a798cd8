"""A simulated CUDA device for the test suite: run ``device="cuda"`` code paths on a CPU-only
machine, raise where real CUDA would, and count what a GPU would be asked to do.

A :class:`SimTensor` is a ``torch.Tensor`` wrapper subclass that says it lives on ``cuda:0``;
it holds a real CPU tensor and computes on it in ``__torch_dispatch__`` (below autograd, so
``backward`` works unchanged). The rules it enforces are CUDA's:

* an op that mixes a simulated-CUDA tensor with a CPU tensor of one or more dimensions raises
  ``RuntimeError: Expected all tensors to be on the same device`` (0-dim CPU tensors are
  scalars, allowed as on CUDA; ``copy_`` and advanced indexing accept CPU operands, as on CUDA);
* ``.numpy()`` raises CUDA's ``TypeError``; ``.cpu()`` / ``.to("cpu")`` / ``.tolist()`` copy
  to the host (counted as a device-to-host copy and a host synchronisation).

Why the C++ tensor says ``meta``: a wrapper made with ``device="cuda"`` is fine until autograd
records it -- ``torch::autograd::InputMetadata`` then asks the CUDA device guard for the
current stream, and a CPU-only build of torch *aborts the process* ("PyTorch is not linked with
support for cuda devices", also raised by the device guards of ``__getitem__``, ``item()`` and
``nonzero``). So the C++ ``TensorImpl`` is a ``meta`` tensor (whose guard is a no-op, as for
torch's own FakeTensor), and the Python ``device`` / ``is_cuda`` report ``cuda:0``. Factories
that C++ code makes "on the device of ``self``" arrive as ``device=meta`` and become simulated
tensors too.

What is counted (:class:`Counts`):

* ``syncs``: host synchronisations -- ``aten._local_scalar_dense`` (``.item()``, ``bool()``,
  ``int()``, ``float()``), device-to-host copies (``.cpu()``, ``.tolist()``, printing), ops
  whose output size depends on the data (``nonzero``, boolean indexing, ``masked_select``,
  ``unique``), which on CUDA wait for the device to learn the size, and blocking host-to-device
  copies (``.to("cuda")``, ``torch.tensor(..., device="cuda")``, a CPU operand of ``copy_`` or
  of indexing): CUDA copies from pageable memory synchronously. Only a ``non_blocking=True``
  copy from pinned memory (``Tensor.pin_memory()``, simulated here) is not a sync;
* ``launches``: every dispatched aten op that computes on simulated tensors (one CUDA kernel
  per aten op is the eager-mode rule of thumb; composite ops are counted as the aten ops torch
  decomposes them into); ``views`` (metadata only, no kernel) and ``allocs`` (``empty*``) are
  counted apart;
* ``h2d`` / ``h2d_bytes`` and ``d2h`` / ``d2h_bytes``: copies between host and device.

:func:`simcuda` is the context manager (and :func:`simcuda_fixture` the pytest fixture) that
turns factory calls with ``device="cuda"`` (``torch.zeros``, ``arange``, ``tensor``,
``randn``, ``randperm``, ``*_like``, ``Tensor.new_*``, ...), ``Tensor.to("cuda")`` and
``Tensor.cuda()`` into simulated tensors, makes ``torch.cuda.is_available()`` True and
``torch.Generator(device="cuda")`` a CPU generator (so random draws equal the CPU ones for the
same seed -- a real CUDA generator draws other numbers) that reports ``cuda``. As on CUDA, a
random op on the simulated device with a CPU generator raises, and so does a CPU op with a
simulated CUDA generator. ``Tensor.pin_memory()`` (which a CPU-only torch refuses) returns a
copy that ``is_pinned()``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import traceback
from collections import Counter

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["Counts", "SimTensor", "simcuda", "simcuda_fixture", "to_sim", "from_sim"]

CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")
aten = torch.ops.aten

# Ops that may take CPU tensors beside CUDA ones on a real GPU (the CPU operand is copied).
_CPU_OPERANDS_OK = {
    aten.copy_.default,
    aten._to_copy.default,
    aten.index.Tensor,
    aten.index_put.default,
    aten.index_put_.default,
    aten._index_put_impl_.default,
}
# Ops whose output size depends on the data: CUDA syncs to learn it.
_DATA_DEPENDENT = {
    aten.nonzero.default,
    aten.masked_select.default,
    aten._unique2.default,
    aten.unique_dim.default,
    aten.unique_consecutive.default,
    aten.unique_dim_consecutive.default,
}
_ALLOCS = {
    aten.empty.memory_format,
    aten.empty_like.default,
    aten.empty_strided.default,
    aten.new_empty.default,
    aten.new_empty_strided.default,
}


@dataclasses.dataclass
class Counts:
    """What the simulated GPU was asked to do since the last :meth:`reset`.

    Attributes:
        syncs: host synchronisations (see the module docstring).
        launches: aten ops computing on simulated tensors (kernel launches).
        views: view ops (no kernel).
        allocs: ``empty*`` allocations (no kernel).
        h2d, h2d_bytes: host-to-device copies and their bytes.
        d2h, d2h_bytes: device-to-host copies and their bytes.
        bytes_moved: the memory traffic of the launches under the model "a kernel reads each
            tensor operand once and writes each output once" (operand and output bytes).
        elements: output elements of the launches (about the FLOPs of elementwise work).
        ops: launches per aten op name.
        sync_sites: syncs per call site, "folder/file.py:line" of the innermost frame outside
            torch and this module (where each sync comes from).
    """

    syncs: int = 0
    launches: int = 0
    views: int = 0
    allocs: int = 0
    h2d: int = 0
    h2d_bytes: int = 0
    d2h: int = 0
    d2h_bytes: int = 0
    bytes_moved: int = 0
    elements: int = 0
    ops: Counter = dataclasses.field(default_factory=Counter)
    sync_sites: Counter = dataclasses.field(default_factory=Counter)

    def reset(self) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, Counter() if f.name in ("ops", "sync_sites") else 0)

    def snapshot(self) -> dict:
        """The scalar counts as a dict (for reports and docs)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in ("ops", "sync_sites")}

    def sync(self) -> None:
        """Count one host synchronisation and where it came from."""
        self.syncs += 1
        for frame in reversed(traceback.extract_stack()[:-1]):
            name = frame.filename
            if "/torch/" not in name and not name.endswith("simcuda.py"):
                self.sync_sites[f"{'/'.join(name.split('/')[-2:])}:{frame.lineno}"] += 1
                break

    def d2h_copy(self, t: torch.Tensor) -> None:
        self.d2h += 1
        self.d2h_bytes += _nbytes(t)
        self.sync()

    def h2d_copy(self, t: torch.Tensor, blocking: bool = True) -> None:
        """Count a host-to-device copy; a blocking one (any but a ``non_blocking`` copy from
        pinned memory) is also a host synchronisation."""
        self.h2d += 1
        self.h2d_bytes += _nbytes(t)
        if blocking:
            self.sync()

    def launch(self, name: str) -> None:
        self.launches += 1
        self.ops[name] += 1


# The counters of the active simulations, innermost last; outside any, counts are dropped.
_ACTIVE: list[Counts] = []


def _counts() -> Counts:
    return _ACTIVE[-1] if _ACTIVE else Counts()


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _on_sim_device(device) -> bool:
    """A ``device=`` value that means the simulated GPU: cuda (Python side) or meta (C++ side)."""
    if device is None:
        return False
    if isinstance(device, int) and not isinstance(device, bool):  # .to(0), .cuda(0)
        return True
    try:
        return torch.device(device).type in ("cuda", "meta")
    except (RuntimeError, TypeError):
        return False


class SimTensor(torch.Tensor):
    """A tensor that says it lives on ``cuda:0`` and computes on the CPU tensor it holds.

    Attributes:
        data_cpu: the CPU tensor (same shape, strides and dtype) that holds the values.
    """

    data_cpu: torch.Tensor
    __slots__ = ("data_cpu",)
    # No torch-function wrapping: every op reaches __torch_dispatch__ with plain semantics.
    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, data: torch.Tensor):
        assert type(data) is torch.Tensor and data.device.type == "cpu", (type(data), data.device)
        r = torch.Tensor._make_wrapper_subclass(
            cls, data.shape, strides=data.stride(), storage_offset=data.storage_offset(),
            dtype=data.dtype, layout=data.layout, device="meta", requires_grad=False)
        r.data_cpu = data
        return r

    @property
    def device(self) -> torch.device:
        return CUDA

    @property
    def is_cuda(self) -> bool:
        return True

    @property
    def is_meta(self) -> bool:
        return False

    def get_device(self) -> int:
        return 0

    def __repr__(self, *, tensor_contents=None) -> str:
        # Printing a CUDA tensor copies it to the host: one D2H copy, one sync.
        _counts().d2h_copy(self.data_cpu)
        text = repr(self.data_cpu.detach())
        return text[:-1] + ", device='cuda:0')"

    def __format__(self, spec: str) -> str:
        if self.dim() == 0:
            return self.item().__format__(spec)
        return repr(self)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        c = _counts()
        if func is aten._local_scalar_dense.default:
            c.d2h_copy(args[0].data_cpu)
            return args[0].data_cpu.item()
        if func is aten._to_copy.default and kwargs.get("device") is not None and \
                not _on_sim_device(kwargs["device"]):
            out = func(args[0].data_cpu, **kwargs)  # device to host: a real CPU tensor
            c.d2h_copy(out)
            return out
        if func is aten.copy_.default and not isinstance(args[0], SimTensor):
            args[0].copy_(args[1].data_cpu)  # host_tensor.copy_(device_tensor)
            c.d2h_copy(args[0])
            return args[0]

        flat, _ = tree_flatten((args, kwargs))
        sims = {id(t.data_cpu): t for t in flat if isinstance(t, SimTensor)}
        host = [t for t in flat if isinstance(t, torch.Tensor) and not isinstance(t, SimTensor)
                and t.ndim > 0]
        if host:
            if func not in _CPU_OPERANDS_OK or any(t.device.type == "meta" for t in host):
                raise RuntimeError(
                    f"Expected all tensors to be on the same device, but found at least two "
                    f"devices, cuda:0 and {host[0].device}! (when checking arguments for {func})")
            # CUDA copies the CPU operand to the device first: asynchronously only for copy_
            # with non_blocking=True from pinned memory.
            asynchronous = func is aten.copy_.default and bool(
                args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
            for t in host:
                c.h2d_copy(t, blocking=not (asynchronous and _pinned(t)))

        def unwrap(t):
            return t.data_cpu if isinstance(t, SimTensor) else t

        kw = {k: (CPU if k == "device" and _on_sim_device(v) else v) for k, v in kwargs.items()}
        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kw))

        if func in _ALLOCS:
            c.allocs += 1
        elif func.is_view or func in (aten.detach.default, aten.alias.default):
            c.views += 1
        else:
            c.launch(func.__name__)
            outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            c.bytes_moved += sum(_nbytes(t.data_cpu if isinstance(t, SimTensor) else t)
                                 for t in flat if isinstance(t, torch.Tensor))
            c.bytes_moved += sum(_nbytes(t) for t in outs)
            c.elements += sum(t.numel() for t in outs)
        if func in _DATA_DEPENDENT or (func is aten.index.Tensor and any(
                i is not None and i.dtype == torch.bool for i in args[1])):
            c.sync()

        def wrap(t):
            if isinstance(t, torch.Tensor) and not isinstance(t, SimTensor):
                known = sims.get(id(t))  # in-place and out= ops return their argument
                return known if known is not None else SimTensor(t)
            return t

        return tree_map(wrap, out)


def _pinned(t: torch.Tensor) -> bool:
    """Whether the CPU tensor ``t`` came from the simulated ``pin_memory()``."""
    return bool(getattr(t, "_simcuda_pinned", False))


def _check_generator(generator, cuda: bool) -> None:
    """Raise as CUDA does when a random op's generator is on the other device."""
    if generator is None:
        return
    on_cuda = bool(getattr(generator, "_simcuda", False))
    if on_cuda != cuda:
        want, found = ("cuda", "cpu") if cuda else ("cpu", "cuda")
        raise RuntimeError(f"Expected a '{want}' device type for generator but found '{found}'")


class _FactoryDispatch(TorchDispatchMode):
    """aten factories asked for the simulated device with no tensor argument (``device=cuda``
    from a C++ decomposition, or ``meta``: "the device of a SimTensor" seen from C++) are made
    on the CPU and wrapped."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _on_sim_device(kwargs.get("device")):
            flat, _ = tree_flatten((args, kwargs))
            if not any(isinstance(t, SimTensor) for t in flat):
                out = func(*args, **{**kwargs, "device": CPU})
                c = _counts()
                if func in _ALLOCS:
                    c.allocs += 1
                else:
                    c.launch(func.__name__)
                return tree_map(lambda t: SimTensor(t) if type(t) is torch.Tensor else t, out)
        return func(*args, **kwargs)


def to_sim(t: torch.Tensor, non_blocking: bool = False) -> SimTensor:
    """A simulated-CUDA copy of the CPU tensor ``t`` (one host-to-device copy, counted; a sync
    unless ``non_blocking`` and ``t`` is pinned)."""
    _counts().h2d_copy(t, blocking=not (non_blocking and _pinned(t)))
    return SimTensor(t.detach().clone())


def from_sim(t: torch.Tensor) -> torch.Tensor:
    """The values of ``t`` as a CPU tensor, counting nothing (for test assertions)."""
    t = t.detach()
    return t.data_cpu.clone() if isinstance(t, SimTensor) else t


# Factories whose values come from the host (a copy) rather than from a device kernel.
_FROM_HOST = {torch.tensor, torch.as_tensor, torch.asarray, torch.Tensor.new_tensor}
_EMPTY = {torch.empty, torch.empty_like, torch.empty_strided, torch.Tensor.new_empty}


class _SimFunctionMode(TorchFunctionMode):
    """CUDA factory calls, ``.to("cuda")``, ``.cuda()``, ``.cpu()``, ``.tolist()`` and
    ``.numpy()`` under the simulation."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self_ = args[0] if args else None
        if func in (torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu) and isinstance(
                self_, torch.Tensor):
            return _move(func, self_, args[1:], kwargs)
        if func is torch.Tensor.pin_memory and not isinstance(self_, SimTensor):
            pinned = self_.clone()
            pinned._simcuda_pinned = True
            return pinned
        if func is torch.Tensor.is_pinned and not isinstance(self_, SimTensor):
            return _pinned(self_)
        if isinstance(self_, SimTensor):
            if func is torch.Tensor.tolist:
                return _to_host(self_).tolist()
            if func in (torch.Tensor.numpy, torch.Tensor.__array__):
                raise TypeError("can't convert cuda:0 device type tensor to numpy. Use "
                                "Tensor.cpu() to copy the tensor to host memory first.")
        factory = "device" in kwargs and _on_sim_device(kwargs["device"])
        if kwargs.get("generator") is not None:  # (below this level torch passes a new Python object)
            _check_generator(kwargs["generator"], cuda=factory or any(
                isinstance(t, SimTensor) for t in tree_flatten((args, kwargs))[0]))
        if factory:
            return _factory(func, args, kwargs)
        return func(*args, **kwargs)


def _factory(func, args, kwargs):
    """A factory call with ``device="cuda"``: made on the CPU and wrapped."""
    c = _counts()
    kwargs = dict(kwargs, device=CPU)
    requires_grad = kwargs.pop("requires_grad", False)
    out = func(*tree_map(lambda t: t.data_cpu if isinstance(t, SimTensor) else t, args), **kwargs)
    if not isinstance(out, torch.Tensor) or isinstance(out, SimTensor):
        return out
    if func in _FROM_HOST:
        c.h2d_copy(out)
    elif func in _EMPTY:
        c.allocs += 1
    else:
        c.launch(getattr(func, "__name__", str(func)))
    out = SimTensor(out.detach())
    return out.requires_grad_(True) if requires_grad else out


def _to_host(t: SimTensor, dtype=None) -> torch.Tensor:
    """Device to host: a real CPU tensor (one D2H copy and one sync), differentiable."""
    if t.requires_grad and torch.is_grad_enabled():
        out = _SimToCpu.apply(t)
    else:
        _counts().d2h_copy(t.data_cpu)
        out = t.data_cpu.clone()
    return out if dtype is None else out.to(dtype)


def _move(func, t, rest, kwargs):
    """``Tensor.to`` / ``.cuda()`` / ``.cpu()`` between the host and the simulated device."""
    non_blocking = bool(kwargs.get("non_blocking", False))
    if func is torch.Tensor.cpu:
        target, dtype, copy = CPU, None, False
    elif func is torch.Tensor.cuda:
        target, dtype, copy = CUDA, None, False
    else:
        target, dtype, non_blocking, _ = torch._C._nn._parse_to(*rest, **kwargs)
        copy = bool(kwargs.get("copy", False))
        if rest and isinstance(rest[0], SimTensor):
            target = CUDA
    sim = isinstance(t, SimTensor)
    if target is None or _on_sim_device(target) == sim:  # no move: a dtype change at most
        if sim and (dtype not in (None, t.dtype) or copy):
            return torch.ops.aten._to_copy.default(t, dtype=dtype or t.dtype)
        return t if sim else func(t, *rest, **kwargs)
    if sim:
        return _to_host(t, dtype)
    src = t if dtype is None else t.to(dtype)
    if src.requires_grad and torch.is_grad_enabled():
        return _ToSim.apply(src)
    return to_sim(src, non_blocking=non_blocking and _pinned(t))


class _SimToCpu(torch.autograd.Function):
    """Device-to-host copy that keeps autograd."""

    @staticmethod
    def forward(ctx, t):
        _counts().d2h_copy(t.data_cpu)
        return t.data_cpu.clone()

    @staticmethod
    def backward(ctx, g):
        return to_sim(g)


class _ToSim(torch.autograd.Function):
    """Host-to-device copy that keeps autograd (gradients flow back to the host tensor)."""

    @staticmethod
    def forward(ctx, t):
        return to_sim(t)

    @staticmethod
    def backward(ctx, g):
        return _to_host(g)


class _SimGenerator(torch.Generator):
    """``torch.Generator(device=...)`` under the simulation: a CPU generator, which for
    ``device="cuda"`` says it is on ``cuda:0`` and draws only for simulated tensors."""

    def __new__(cls, device="cpu"):
        return super().__new__(cls, "cpu")

    def __init__(self, device="cpu"):
        # torch.Generator is set up in __new__; remember the device asked for.
        self._simcuda = _on_sim_device(device)

    @property
    def device(self) -> torch.device:
        return CUDA if self._simcuda else CPU


@contextlib.contextmanager
def simcuda():
    """Simulate one CUDA device inside the block; yields the :class:`Counts` of the block.

    >>> with simcuda() as counts:
    ...     x = torch.ones(3, device="cuda")
    ...     total = float(x.sum())
    >>> x.device, total, counts.syncs, counts.launches
    (device(type='cuda', index=0), 3.0, 1, 2)
    """
    counts = Counts()
    patched = {
        (torch.cuda, "is_available"): lambda: True,
        (torch.cuda, "device_count"): lambda: 1,
        (torch.cuda, "current_device"): lambda: 0,
        (torch.cuda, "synchronize"): lambda device=None: counts.sync(),
        (torch, "Generator"): _SimGenerator,
        # A CPU build of torch: on a machine with a real GPU, code that asks whether CUDA kernels
        # can run (Triton's route) must not send the simulated device's CPU tensors to them.
        (torch.version, "cuda"): None,
    }
    saved = {key: getattr(*key) for key in patched}
    _ACTIVE.append(counts)
    try:
        for (owner, name), value in patched.items():
            setattr(owner, name, value)
        with _SimFunctionMode(), _FactoryDispatch():
            yield counts
    finally:
        for (owner, name), value in saved.items():
            setattr(owner, name, value)
        _ACTIVE.pop()


def simcuda_fixture():
    """The pytest fixture body: ``simcuda_counts = pytest.fixture(simcuda_fixture)``."""
    with simcuda() as counts:
        yield counts
