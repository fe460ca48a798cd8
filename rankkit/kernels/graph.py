"""The boosting round as a CUDA graph: captured once, replayed every round after (S5 of
../shared/design/gpu-round.md).

A default round of the Triton backend is about thirty kernel launches and no host
synchronisation until its one copy to the host (docs/gpu.md counts them). Each launch costs the
host microseconds of Python and driver work, and the GPU idles between small kernels: on the
2026-11-28 H200 profile the gaps were 6.8 ms of a 29 ms round. A CUDA graph records the launches
once; a replay is one call, and the GPU runs the kernels back to back.

What a round must hold to be replayed (the engine says so, ``static``): the same launches with
the same arguments every round. Every buffer is the fit's (no allocation after the first round:
:mod:`rankkit.kernels.workspace`), nothing synchronises with the host, and no host-side draw or
per-round Python value reaches a kernel. The round's Python runs only at the capture; its results
(the same tensors every round) are handed back after each replay.

The rounds: the first ``warmup`` eagerly (Triton compiles, the workspace allocates, the lambda
pass's inputs are copied to the device once), then one capture and its replay, then replays. A
capture that fails gives one warning and eager rounds from then on. Opt-in
(``RANKKIT_CUDA_GRAPH=1``) until a GPU run has measured it faster and equal
(experiments/bench_gpu.py times the round both ways, tests/kernels/test_graph.py compares the
trees on a CUDA machine).
"""
from __future__ import annotations

import warnings
from typing import Any, Callable

import torch


def cuda_graph(step: Callable[[], Any], device: torch.device) -> tuple[Callable[[], None], Any]:
    """``step`` captured as a CUDA graph on a side stream: (its replay, what ``step`` returned)."""
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    # thread_local: another thread's CUDA calls (a data loader's) may go on during the capture.
    with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
        result = step()
    torch.cuda.current_stream(device).wait_stream(stream)
    return graph.replay, result


class RoundGraph:
    """Run the rounds of a fit: eagerly for the first ``warmup``, then as one captured graph.

    Args:
        device: the round's device.
        warmup: the eager rounds before the capture (at least 1: the first round allocates).
        capture: ``(step, device) -> (replay, result)``, :func:`cuda_graph` by default (the tests
            give one that records the Triton launches under the interpreter).

    Attributes:
        rounds, replays: the rounds run since the round's shape (``key``) last changed, and how
            many of them were replays.
        failed: why the capture failed (then every round is eager), or None.
    """

    def __init__(self, device: torch.device | str, *, warmup: int = 1,
                 capture: Callable[[Callable[[], Any], torch.device], tuple[Callable[[], None], Any]] | None = None):
        self.device = torch.device(device)
        self.warmup = max(1, int(warmup))
        self.capture = cuda_graph if capture is None else capture
        self.rounds = self.replays = 0
        self.failed: str | None = None
        self._captured: tuple[Callable[[], None], Any] | None = None
        self._key: Any = None

    def __repr__(self) -> str:
        return f"RoundGraph({self.device}, rounds={self.rounds}, replays={self.replays}, failed={self.failed!r})"

    def __call__(self, step: Callable[[], Any], key: Any = None) -> Any:
        """What ``step`` returns, its device work done (by ``step`` itself, or by a replay).
        ``key``: the round's shape; a new key drops the graph and starts again (eager rounds,
        then a capture)."""
        if key != self._key:
            self._key, self._captured, self.rounds, self.replays = key, None, 0, 0
        self.rounds += 1
        if self.failed is not None or self.rounds <= self.warmup:
            return step()
        if self._captured is None:
            try:
                self._captured = self.capture(step, self.device)
            except Exception as e:  # noqa: BLE001 -- a sync or an allocation the graph cannot take
                self.failed = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
                warnings.warn(f"RANKKIT_CUDA_GRAPH: the boosting round could not be captured as a CUDA graph "
                              f"({self.failed}); the rounds run eagerly", RuntimeWarning, stacklevel=3)
                return step()  # nothing ran on the device during the capture
        replay, result = self._captured
        replay()
        self.replays += 1
        return result
