"""Export any features -> scores ``nn.Module`` for serving without rankkit.

The artefact always takes raw features [N, F] float32 and returns scores [N]: preprocessing
lives inside the scorer, and the training machinery (autograd Function, LightningModule)
never reaches the file.

* :func:`export_torchscript` writes a TorchScript file: ``torch.jit.load(path)`` serves it.
* :func:`export_program` writes a ``torch.export`` program (``.pt2``), the successor of
  TorchScript upstream: ``torch.export.load(path).module()`` serves it.
* :func:`export_onnx` writes an ONNX model (``.onnx``): ONNX Runtime (or any ONNX runtime)
  serves it, with input ``features`` [N, F] and output ``scores`` [N].

Each takes any trained object: a plain features -> scores ``nn.Module``, a rankkit
LightningModule or a fitted :class:`rankkit.boosting.LambdaMART` (both expose
``serving_scorer()``). All write atomically (a temporary file renamed into place).

**List-aware scorers** (``list_aware = True``, see :mod:`rankkit.scorers`) score a
document beside the others of its query, so their artefacts take whole queries instead:

* TorchScript: ``scorer(features [L, F])`` -> scores [L] for one query (any L), or
  ``scorer(features [Q, L, F], mask [Q, L])`` -> scores [Q, L] (zero on padding) for a padded
  batch;
* ``torch.export`` and ONNX: the padded batch form, inputs ``features`` [Q, L, F] float32 and
  ``mask`` [Q, L] bool, both Q and L dynamic (one query is Q = 1 with an all-True mask).

:func:`load_scorer` marks such an artefact ``list_aware`` so that serving scores it query by
query (:func:`rankkit.serving.score_queries`).
"""
from __future__ import annotations

import io
import json
import logging
import math
import os
import stat
import re
import zipfile
import zlib
from typing import Callable, Optional, Protocol, runtime_checkable

import torch
from torch import nn

from rankkit.infra.io import atomic_write as _atomic_write
from rankkit.infra.io import via_memory
from rankkit.scorers import is_list_aware


class ServingScorer(nn.Module):
    """Wraps a scorer: features [N, F] -> scores [N], checking F."""

    def __init__(self, scorer: nn.Module, n_features: int):
        super().__init__()
        self.scorer = scorer
        self.n_features = n_features

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if features.dim() != 2 or features.shape[1] != self.n_features:
            raise ValueError("expected features of shape [N, " + str(self.n_features) + "]")
        return self.scorer(features.to(torch.float32)).reshape(-1)


class ListServingScorer(nn.Module):
    """Wraps a list-aware scorer: one query [L, F] -> [L], or [Q, L, F] + mask [Q, L] -> [Q, L]."""

    def __init__(self, scorer: nn.Module, n_features: int):
        super().__init__()
        self.scorer = scorer
        self.n_features = n_features
        self.list_aware = True

    def forward(self, features: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        if features.dim() == 2 and features.shape[1] == self.n_features:
            one = features.to(torch.float32).unsqueeze(0)
            return self.scorer(one, torch.ones(one.shape[:2], dtype=torch.bool, device=one.device))[0]
        if features.dim() != 3 or features.shape[2] != self.n_features:
            raise ValueError("expected features of shape [L, " + str(self.n_features) + "] or [Q, L, "
                             + str(self.n_features) + "]")
        if mask is None:
            mask = torch.ones(features.shape[:2], dtype=torch.bool, device=features.device)
        elif mask.dim() != 2 or mask.shape[0] != features.shape[0] or mask.shape[1] != features.shape[1]:
            raise ValueError("expected a mask of shape [Q, L] beside features [Q, L, F]")
        mask = mask.to(torch.bool)
        return self.scorer(features.to(torch.float32), mask).masked_fill(~mask, 0.0)


@runtime_checkable
class HasScorer(Protocol):
    """A trained object that says which module serves it: rankkit's LightningModules (the
    weight average when they keep one) and the fitted LambdaMART estimator."""

    def serving_scorer(self) -> nn.Module: ...


def unwrap(model) -> nn.Module:
    """The features -> scores module of ``model``: its ``serving_scorer()`` (see
    :class:`HasScorer`), or ``model`` itself when it is a plain ``nn.Module``."""
    if isinstance(model, HasScorer):
        return model.serving_scorer()
    if isinstance(model, nn.Module):
        return model
    raise ValueError(f"`model` has to be an nn.Module, a rankkit LightningModule or a fitted LambdaMART, "
                     f"got {type(model).__name__}")


def _n_features(scorer: nn.Module, n_features: int | None, model=None) -> int:
    """``n_features``, else the scorer's ``n_features``, else the one the trained object
    recorded (a rankkit LightningModule remembers the width of the data it trained on)."""
    n = n_features
    for source in (scorer, model):
        if n is None:
            n = getattr(source, "n_features", None)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError("cannot tell the scorer's feature count: pass n_features=")
    return n


def serving_module(model: nn.Module, *, n_features: int | None = None) -> ServingScorer | ListServingScorer:
    """The eval-mode, CPU, float32 serving wrapper of ``model``'s scorer (a
    :class:`ListServingScorer` for a list-aware one)."""
    import copy

    scorer = copy.deepcopy(unwrap(model)).to("cpu").float().eval()
    wrapper = ListServingScorer if is_list_aware(scorer) else ServingScorer
    return wrapper(scorer, _n_features(scorer, n_features, model)).eval()


def _example(module) -> tuple[tuple[torch.Tensor, ...], tuple[dict, ...]]:
    """Example inputs and dynamic shapes for torch.export: [N, F] (pointwise) or [Q, L, F] +
    mask [Q, L] with some padding (list-aware)."""
    if isinstance(module, ListServingScorer):
        mask = torch.tensor([[True] * 5, [True, True, True, False, False], [True] * 4 + [False]])
        queries, docs = torch.export.Dim("queries", min=1), torch.export.Dim("docs", min=1)
        return ((torch.randn(3, 5, module.n_features), mask),
                ({0: queries, 1: docs}, {0: queries, 1: docs}))
    return (torch.randn(4, module.n_features),), ({0: torch.export.Dim("batch", min=1)},)


def export_torchscript(model: nn.Module, path: str | os.PathLike, *, n_features: int | None = None) -> str:
    """Write a TorchScript scorer (features [N, F] -> scores [N]) to ``path``.

    The module is scripted (so the feature-count check and any data-dependent control flow
    survive); a module TorchScript cannot compile is traced instead.
    """
    module = serving_module(model, n_features=n_features)
    try:
        compiled = torch.jit.script(module)
    except Exception:  # noqa: BLE001 - fall back to tracing what the compiler rejects
        if isinstance(module, ListServingScorer):
            raise
        example = torch.zeros(2, module.n_features)
        compiled = torch.jit.trace(module, example, check_trace=False)
    return _atomic_write(path, via_memory(lambda f: torch.jit.save(compiled, f)))  # via memory: no C++ abort on ENOSPC


def export_program(model: nn.Module, path: str | os.PathLike, *, n_features: int | None = None) -> str:
    """Write a ``torch.export`` program (``.pt2``) with a dynamic batch dimension."""
    module = serving_module(model, n_features=n_features)
    example, dynamic = _example(module)
    program = torch.export.export(module, example, dynamic_shapes=dynamic)

    return _atomic_write(path, via_memory(lambda f: torch.export.save(program, f)))  # no C++ abort on ENOSPC


def export_onnx(model, path: str | os.PathLike, *, n_features: int | None = None) -> str:
    """Write an ONNX model (input ``features`` [N, F] float32, output ``scores`` [N]) with a
    dynamic batch dimension, exported through ``torch.export`` (``torch.onnx.export(...,
    dynamo=True)``; needs the ``onnx`` and ``onnxscript`` packages)."""
    import logging
    import warnings

    module = serving_module(model, n_features=n_features)
    example, dynamic = _example(module)
    names = ["features", "mask"][:len(example)]
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)  # the exporter's notes (e.g. on torchvision's operators)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(module, example, input_names=names, output_names=["scores"],
                                    dynamic_shapes=dynamic, dynamo=True, verbose=False)
    logger.setLevel(level)
    return _atomic_write(path, lambda tmp: program.save(tmp))


EXPORTERS: dict[str, Callable] = {"torchscript": export_torchscript, "export": export_program,
                                  "onnx": export_onnx}


class _OnnxScorer:
    """An ONNX Runtime session as a callable features [N, F] -> scores [N] (torch tensors), or,
    for a list-aware model (inputs ``features`` and ``mask``), ``(features [Q, L, F], mask [Q, L])``
    -> scores [Q, L] and one query [L, F] -> [L], as :class:`ListServingScorer`."""

    def __init__(self, session):
        self.session = session
        self.list_aware = [i.name for i in session.get_inputs()] == ["features", "mask"]
        # The width the graph declares (its features input's last dimension), so that
        # `rankkit predict` zero-pads a narrower file as for every other format; None if symbolic.
        last = session.get_inputs()[0].shape[-1] if session.get_inputs()[0].shape else None
        self.n_features = last if isinstance(last, int) and not isinstance(last, bool) else None

    def __call__(self, features: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = features.detach().to("cpu", torch.float32)
        if not self.list_aware:
            return torch.from_numpy(self.session.run(["scores"], {"features": x.numpy()})[0])
        one = x.dim() == 2
        x = x.unsqueeze(0) if one else x
        m = torch.ones(x.shape[:2], dtype=torch.bool) if mask is None else mask.detach().to("cpu", torch.bool)
        scores = torch.from_numpy(self.session.run(["scores"], {"features": x.numpy(), "mask": m.numpy()})[0])
        return scores[0] if one else scores


# -- loading -------------------------------------------------------------------------------------
# Neither format is read by torch straight from the user's file. The file is read once into
# memory, opened with Python's zipfile (which checks every member's CRC and the local headers
# against the central directory), checked, and re-packed into a fresh in-memory archive that
# holds only the checked members; torch reads that copy. A corrupt or truncated file fails in
# zipfile, before torch's C++ reader sees a byte of it.

# A .pt2 archive (torch.export.save, torch 2.13) holds these records under one root folder.
# Everything else is refused: AOTInductor/ExecuTorch/MTIA payloads (native code), legacy ``.pt``
# weights and custom-object or opaque constants (pickles).
_PT2_RECORD = re.compile(
    r"archive_format|archive_version|byteorder|\.data/version|\.data/serialization_id"
    r"|models/model\.json|data/weights/model_weights_config\.json|data/weights/weight_\d+"
    r"|data/constants/model_constants_config\.json|data/constants/tensor_\d+"
    r"|data/sample_inputs/model\.pt|extra/[A-Za-z0-9_.-]+")
_SAMPLE_INPUTS = "data/sample_inputs/model.pt"

# Graph node targets a scorer needs: ATen/prims operators, the operator module's arithmetic and
# torch's symbolic helpers. Anything else (``torch.os.system`` resolves too) is refused.
_PT2_TARGET = re.compile(
    r"torch\.ops\.(aten|prims)\.\w+\.\w+"
    r"|_operator\.(getitem|add|sub|mul|truediv|floordiv|mod|neg|pos|abs|eq|ne|lt|le|gt|ge"
    r"|and_|or_|xor|not_|invert)"
    r"|torch\.sym_(not|float|int|max|min|ite|sum|sqrt)|math\.(ceil|floor|trunc|sqrt)")
_PT2_OPS_REFUSED = {"from_file"}  # maps a file into a tensor: reads and, shared, writes files

# Symbolic shape expressions are parsed with sympy.sympify, which evaluates Python. They may only
# use these names, symbol names such as s0, integers and arithmetic (no ``**``, no attributes).
_SYMPY_NAMES = frozenset((
    "Symbol Integer Mul Add True False positive integer nonnegative real finite oo Max Min Eq Ne Lt Le "
    "Gt Ge And Or Not Mod Abs floor ceiling FloorDiv ModularIndexing Where PythonMod CleanDiv "
    "CeilToInt FloorToInt CeilDiv LShift RShift PowByNatural FloatPow FloatTrueDiv IntTrueDiv "
    "IsNonOverlappingAndDenseIndicator TruncToFloat TruncToInt RoundToInt RoundDecimal ToFloat "
    "Identity").split())
_EXPR_TOKEN = re.compile(r"\s*(?:([A-Za-z_]\w*)|\d+(?:\.\d+)?|'([a-z]+\d+)'|[-+*/%(),]|[=!<>]=|[<>=])")
_SYMBOL_NAME = re.compile(r"[a-z]+\d+")

# The only guard code rankkit's exports carry: a list-aware scorer's mask [Q, L] has the sizes of
# its features [Q, L, F] (``L['mask'].size()[0] == L['features'].size()[0]``).
_SHAPE_GUARD = re.compile(r"L\['(features|mask)'\]\.size\(\)\[[0-2]\] == L\['(features|mask)'\]\.size\(\)\[[0-2]\]")

# A size squared (a list-aware scorer's [L, L] attention): the only power a shape may hold.
_SQUARE = re.compile(r"Pow\(Symbol\('[a-z]+\d+', positive=True, integer=True\), Integer\(2\)\)")

# A member may expand to at most this many times the file's size (a zip bomb is refused).
_MAX_EXPANSION = 64


def _refuse(path: str, why: str) -> ValueError:
    return ValueError(f"{path}: not a loadable rankkit scorer file: {why}")


def _read_members(path: str, data: bytes, *, stored_only: bool) -> tuple[str, dict[str, bytes]]:
    """(root folder, {record name: bytes}) of a torch zip archive, every member CRC-checked."""
    if not data:
        raise _refuse(path, "the file is empty")
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        infos = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError) as e:
        raise _refuse(path, f"not a zip archive ({e})") from None
    if not infos:
        raise _refuse(path, "the archive is empty")
    root = infos[0].filename.split("/", 1)[0]
    seen: set[str] = set()
    total = 0
    for info in infos:
        name = info.filename
        record = name[len(root) + 1:]
        if not name.startswith(root + "/") or not record or ".." in name.split("/") or "\\" in name:
            raise _refuse(path, f"member {name!r} lies outside the archive's folder {root!r}")
        if name.casefold() in seen:
            raise _refuse(path, f"member {name!r} appears twice")
        seen.add(name.casefold())
        if stored_only and info.compress_type != zipfile.ZIP_STORED:
            raise _refuse(path, f"member {name!r} is compressed (torch.export.save stores members)")
        total += info.file_size
    if total > _MAX_EXPANSION * len(data) + (1 << 20):
        raise _refuse(path, f"the members expand to {total} bytes from a {len(data)}-byte file")
    members = {}
    try:
        for info in infos:
            members[info.filename[len(root) + 1:]] = archive.read(info)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, RuntimeError, NotImplementedError,
            zlib.error) as e:
        raise _refuse(path, f"corrupt archive ({e})") from None
    return root, members


def _repack(root: str, members: dict[str, bytes]) -> io.BytesIO:
    """A fresh in-memory archive holding exactly ``members`` (torch reads this, not the file)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
        for name, data in members.items():
            archive.writestr(f"{root}/{name}", data)
    out.seek(0)
    return out


def _json(path: str, members: dict[str, bytes], name: str) -> dict:
    if name not in members:
        raise _refuse(path, f"no {name!r} in the archive")
    try:
        value = json.loads(members[name].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise _refuse(path, f"{name!r} is not JSON ({e})") from None
    except RecursionError:
        raise _refuse(path, f"{name!r} nests its JSON deeper than Python's recursion limit") from None
    if not isinstance(value, dict):
        raise _refuse(path, f"{name!r} is not a JSON object")
    return value


def _check_payload_config(path: str, members: dict[str, bytes], name: str, directory: str,
                          prefix: str) -> None:
    """Every weight/constant is raw tensor bytes: no ``use_pickle``, no custom objects."""
    config = _json(path, members, directory + name).get("config")
    if not isinstance(config, dict):
        raise _refuse(path, f"{name!r} has no 'config' object")
    for fqn, meta in config.items():
        if not isinstance(meta, dict) or meta.get("use_pickle") is not False:
            raise _refuse(path, f"{fqn!r} is stored as a pickle; rankkit never unpickles a scorer")
        file = meta.get("path_name")
        if not isinstance(file, str) or not re.fullmatch(prefix + r"\d+", file) or directory + file not in members:
            raise _refuse(path, f"{fqn!r} points at {file!r}, which is not a raw tensor in the archive")
        sizes = (meta.get("tensor_meta") or {}).get("sizes")
        if not isinstance(sizes, list) or not all(
                isinstance(s, dict) and type(s.get("as_int")) is int and s["as_int"] >= 0 for s in sizes):
            raise _refuse(path, f"{fqn!r} has no valid static sizes")
        if not members[directory + file] and math.prod(s["as_int"] for s in sizes):
            raise _refuse(path, f"{fqn!r} has sizes {[s['as_int'] for s in sizes]} but no data")


def _check_expr(path: str, expr) -> None:
    """A symbolic shape expression is a name, a number, or names and numbers in arithmetic."""
    if not isinstance(expr, str) or len(expr) > 500 or "**" in expr:
        raise _refuse(path, f"unsupported symbolic shape expression {str(expr)[:80]!r}")
    expr = _SQUARE.sub("Symbol('s0')", expr)  # L² of attention; no other power (sympy would evaluate it)
    pos = 0
    while pos < len(expr.rstrip()):
        token = _EXPR_TOKEN.match(expr, pos)
        if token is None or (token.group(1) and token.group(1) not in _SYMPY_NAMES
                             and not _SYMBOL_NAME.fullmatch(token.group(1))):
            raise _refuse(path, f"unsupported symbolic shape expression {expr[:80]!r}")
        pos = token.end()


def _check_program(path: str, node) -> None:
    """Walk the serialized program: node targets and shape expressions against the allowlists."""
    if isinstance(node, dict):
        target = node.get("target")
        if "inputs" in node and "outputs" in node and target is not None:
            if (not isinstance(target, str) or not _PT2_TARGET.fullmatch(target)
                    or target.startswith("torch.ops.") and target.split(".")[3] in _PT2_OPS_REFUSED):
                raise _refuse(path, f"the program calls {str(target)[:80]!r}, which a scorer does not need")
        for key, value in node.items():
            if key == "expr_str":
                _check_expr(path, value)
            else:
                _check_program(path, value)
    elif isinstance(node, list):
        for value in node:
            _check_program(path, value)


def _check_pt2(path: str, members: dict[str, bytes]) -> None:
    for name in members:
        if not _PT2_RECORD.fullmatch(name):
            raise _refuse(path, f"unexpected member {name!r} (rankkit loads torch.export programs "
                                f"with raw tensor weights only: no pickles, no compiled code)")
    if members.get("archive_format") != b"pt2":
        raise _refuse(path, "not a torch.export archive (no archive_format 'pt2')")
    _check_payload_config(path, members, "model_weights_config.json", "data/weights/", "weight_")
    _check_payload_config(path, members, "model_constants_config.json", "data/constants/", "tensor_")
    program = _json(path, members, "models/model.json")
    guards = program.get("guards_code") or []  # Python source that ``.module()`` would exec
    if not isinstance(guards, list) or not all(isinstance(g, str) and _SHAPE_GUARD.fullmatch(g) for g in guards):
        raise _refuse(path, "the program carries guard code beyond the equal input sizes of a "
                            "list-aware scorer's (features, mask)")
    for name, bounds in (program.get("range_constraints") or {}).items():
        if not isinstance(bounds, dict) or not all(
                v is None or type(v) is int for v in (bounds.get("min_val"), bounds.get("max_val"))):
            raise _refuse(path, f"range constraint {str(name)[:40]!r} is not a pair of integers")
    _check_program(path, program)


def load_scorer(path: str | os.PathLike, *, trust_torchscript: bool = False) -> Callable[[torch.Tensor], torch.Tensor]:
    """Load either artefact as a callable features [N, F] -> scores [N].

    ``.pt2`` files are read as ``torch.export`` programs, ``.onnx`` by ONNX Runtime, any other
    name as TorchScript -- **only with** ``trust_torchscript=True``: loading a TorchScript file
    runs code from it (its classes' ``__setstate__``) before the scorer is ever called, so by
    default it is refused with a ``ValueError`` that says so (``rankkit predict
    --trust-torchscript`` on the command line).

    Trust model. What ``load_scorer`` guarantees:

    * **Loading never unpickles.** A ``.pt2`` is checked member by member before torch reads
      it: a weight or constant stored as a pickle (``use_pickle``), custom-object or opaque
      constants, legacy ``.pt`` weights, AOTInductor/ExecuTorch payloads (native code),
      guard code (Python source that ``.module()`` would ``exec``), symbolic shape expressions
      beyond names, numbers and arithmetic (torch parses them with ``sympy.sympify``, which
      evaluates Python) and graph nodes that call anything but ATen/prims operators and
      arithmetic are all refused with ``ValueError``. The pickled sample inputs that every
      ``.pt2`` carries are dropped unread. A TorchScript file's ``data.pkl`` is read by
      TorchScript's own unpickler, which rebuilds tensors and TorchScript classes and cannot
      import or call Python.
    * **Bad files give one error.** An empty, truncated or corrupt file, a file that is not
      a zip archive, a member whose checksum fails, and anything torch cannot load raise
      ``ValueError`` naming the file. A missing file raises ``FileNotFoundError``.

    What it does not guarantee: a **TorchScript file is a program**. Loading it (its
    ``__setstate__`` methods) and calling the loaded scorer run the file's TorchScript code,
    which can call any operator registered in the process (including ones that read or write
    files): hence ``trust_torchscript``. Load ``.pt`` files only from sources you would run code
    from; prefer ``.pt2`` for files from elsewhere. Nor does it bound the memory or time a
    scorer takes on a given input.

    >>> load_scorer("no-such-model.pt2")
    Traceback (most recent call last):
    ...
    FileNotFoundError: no-such-model.pt2: no such file
    """
    path = os.fspath(path)
    if path.endswith(".onnx"):
        return _load_onnx(path)
    if not path.endswith(".pt2") and not trust_torchscript:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: no such file")
        raise ValueError(f"{path}: a TorchScript file is a program, and loading it runs code from the file "
                         f"(before any call); load it only from a source you would run code from, with "
                         f"load_scorer(path, trust_torchscript=True) or `rankkit predict --trust-torchscript`; "
                         f"a .pt2 or .onnx export loads without running anything")
    try:
        data = _read_scorer_bytes(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file") from None
    except OSError as e:
        raise ValueError(f"{path}: cannot read the file ({e.strerror or e})") from None
    program = path.endswith(".pt2")
    root, members = _read_members(path, data, stored_only=program)
    if program:
        _check_pt2(path, members)
        members[_SAMPLE_INPUTS] = b""  # a pickle; an empty record loads as "no example inputs"
    archive = _repack(root, members)
    # torch logs a page (a traceback) about a program it refuses before it raises "check the
    # warnings above": rankkit keeps that log off the terminal and says its last line in its one.
    captured = _CapturedLog()
    export_log = logging.getLogger("torch.export")
    saved = export_log.handlers[:], export_log.propagate
    export_log.handlers[:], export_log.propagate = [captured], False
    try:
        if program:
            exported = torch.export.load(archive)
            module = exported.module()
            if len(exported.graph_signature.user_inputs) == 2:  # (features, mask): a list-aware scorer
                module.list_aware = True
            return module
        return torch.jit.load(archive, map_location="cpu")
    except Exception as e:  # noqa: BLE001 - whatever torch raises, the file is not a usable scorer
        why = captured.last or f"{type(e).__name__}: {' '.join(str(e).split())}"
        raise _refuse(path, f"torch cannot load it ({why[:240]})") from None
    finally:
        export_log.handlers[:], export_log.propagate = saved


class _CapturedLog(logging.Handler):
    """Keeps the last line of what torch logs while loading (the error of a refused program)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.last = ""

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            text = f"{type(error).__name__}: {error}"
        lines = [line for line in text.splitlines() if line.strip()]
        if lines:
            self.last = " ".join(lines[-1].split())


#: The largest ``.pt``/``.pt2`` file :func:`load_scorer` reads (it holds the bytes to check them).
MAX_SCORER_BYTES = 2**31


def _read_scorer_bytes(path: str) -> bytes:
    """A scorer file's bytes, from a regular file of at most :data:`MAX_SCORER_BYTES` (a name
    linked to ``/dev/zero`` or a pipe would otherwise be read without end)."""
    with open(path, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{path}: not a regular file (a device, pipe or socket): a scorer is read from a file")
        if info.st_size > MAX_SCORER_BYTES:
            raise ValueError(f"{path}: {info.st_size} bytes, more than MAX_SCORER_BYTES={MAX_SCORER_BYTES}")
        return f.read(MAX_SCORER_BYTES + 1)


def _load_onnx(path: str) -> _OnnxScorer:
    """An ONNX model in ONNX Runtime (a graph of ONNX operators: nothing in it runs Python)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such file")
    try:
        import onnxruntime
    except ImportError:
        raise ValueError(f"{path}: serving an ONNX model needs onnxruntime (pip install onnxruntime)") from None
    _check_onnx_ops(path)
    try:
        return _OnnxScorer(onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"]))
    except Exception as e:  # noqa: BLE001 - whatever ONNX Runtime raises, the file is unusable
        raise _refuse(path, f"ONNX Runtime cannot load it ({type(e).__name__}: {str(e)[:200]})") from None


#: ONNX operators that repeat a subgraph a number of times the graph computes: a scorer rankkit
#: exports never holds one, and a 356-byte graph with a Loop ran without end.
UNBOUNDED_ONNX_OPS = ("Loop", "Scan")


def _check_onnx_ops(path: str) -> None:
    """Refuse an ONNX graph holding a :data:`UNBOUNDED_ONNX_OPS` operator, in any subgraph (read
    with the ``onnx`` package: protobuf, nothing runs)."""
    try:
        import onnx
    except ImportError:
        raise ValueError(f"{path}: serving an ONNX model needs the onnx package to check it (pip install onnx)") \
            from None
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as e:  # noqa: BLE001 - not a readable ONNX protobuf
        raise _refuse(path, f"not an ONNX model ({type(e).__name__})") from None
    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        for node in graph.node:
            if node.op_type in UNBOUNDED_ONNX_OPS:
                raise _refuse(path, f"its graph holds the {node.op_type} operator ({node.name or 'unnamed'}), which "
                                    f"can run without end; rankkit's scorers are straight-line graphs")
            for attr in node.attribute:
                graphs.extend([attr.g] if attr.HasField("g") else [])
                graphs.extend(attr.graphs)
