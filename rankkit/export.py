"""Export any features -> scores ``nn.Module`` for serving without rankkit.

The artefact always takes raw features [N, F] float32 and returns scores [N]: preprocessing
lives inside the scorer, and the training machinery (autograd Function, LightningModule)
never reaches the file.

* :func:`export_torchscript` writes a TorchScript file: ``torch.jit.load(path)`` serves it.
* :func:`export_program` writes a ``torch.export`` program (``.pt2``), the successor of
  TorchScript upstream: ``torch.export.load(path).module()`` serves it.

Both write atomically (a temporary file renamed into place).
"""
from __future__ import annotations

import os
from typing import Callable

import torch
from torch import nn

from rankkit._io import atomic_write as _atomic_write


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


def unwrap(model: nn.Module) -> nn.Module:
    """The plain scorer inside a LightningModule (its weight-averaged ``averaged_scorer``, else its
    ``scorer`` or ``ensemble``) or the module itself."""
    for name in ("averaged_scorer", "scorer", "ensemble"):
        inner = getattr(model, name, None)
        if isinstance(inner, nn.Module):
            return inner
    return model


def _n_features(scorer: nn.Module, n_features: int | None) -> int:
    n = n_features if n_features is not None else getattr(scorer, "n_features", None)
    if not isinstance(n, int) or n < 1:
        raise ValueError("cannot tell the scorer's feature count: pass n_features=")
    return n


def serving_module(model: nn.Module, *, n_features: int | None = None) -> ServingScorer:
    """The eval-mode, CPU, float32 serving wrapper of ``model``'s scorer."""
    import copy

    scorer = copy.deepcopy(unwrap(model)).to("cpu").float().eval()
    return ServingScorer(scorer, _n_features(scorer, n_features)).eval()


def export_torchscript(model: nn.Module, path: str | os.PathLike, *, n_features: int | None = None) -> str:
    """Write a TorchScript scorer (features [N, F] -> scores [N]) to ``path``.

    The module is scripted (so the feature-count check and any data-dependent control flow
    survive); a module TorchScript cannot compile is traced instead.
    """
    module = serving_module(model, n_features=n_features)
    try:
        compiled = torch.jit.script(module)
    except Exception:  # noqa: BLE001 - fall back to tracing what the compiler rejects
        example = torch.zeros(2, module.n_features)
        compiled = torch.jit.trace(module, example, check_trace=False)
    return _atomic_write(path, lambda tmp: torch.jit.save(compiled, tmp))


def export_program(model: nn.Module, path: str | os.PathLike, *, n_features: int | None = None) -> str:
    """Write a ``torch.export`` program (``.pt2``) with a dynamic batch dimension."""
    module = serving_module(model, n_features=n_features)
    example = torch.randn(4, module.n_features)
    batch = torch.export.Dim("batch", min=1)
    program = torch.export.export(module, (example,), dynamic_shapes=({0: batch},))
    return _atomic_write(path, lambda tmp: torch.export.save(program, tmp))


def load_scorer(path: str | os.PathLike) -> Callable[[torch.Tensor], torch.Tensor]:
    """Load either artefact as a callable features [N, F] -> scores [N]."""
    path = os.fspath(path)
    if path.endswith(".pt2"):
        return torch.export.load(path).module()
    return torch.jit.load(path, map_location="cpu")
