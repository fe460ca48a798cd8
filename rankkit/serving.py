"""Scoring files with any trained model: predictions that join back to the input.

:func:`load_model` opens every artefact rankkit writes -- a Lightning checkpoint (``.ckpt``),
a LambdaMART model file (``LambdaMART.save``, safetensors) or an exported scorer (``.pt``
TorchScript, ``.pt2`` ``torch.export``, ``.onnx``) -- and :func:`predict_file` scores a
LETOR/SVMlight file with it, writing one line per document **in input order**::

    qid<TAB>doc<TAB>score

where ``doc`` is the document's 0-based position within its query in the file, so the scores
join back to the input on (qid, doc) or simply line by line. ``rankkit predict`` is this
function on the command line.
"""
from __future__ import annotations

import os
import sys
from typing import Callable

import torch

SCORER_SUFFIXES = (".pt", ".pt2", ".onnx", ".jit")
_CHUNK = 1 << 16


def load_model(path: str | os.PathLike):
    """The trained object at ``path``: a LightningModule (``.ckpt``), a fitted
    :class:`rankkit.boosting.LambdaMART` (a safetensors model file) or a loaded scorer
    (``.pt``/``.pt2``/``.onnx``, a callable features [N, F] -> scores [N]).

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: the file is none of those (naming the file).
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such model file")
    if path.endswith(".ckpt"):
        from rankkit._checkpoint import load_checkpoint

        return load_checkpoint(path)
    if path.endswith(SCORER_SUFFIXES):
        from rankkit.export import load_scorer

        return load_scorer(path)
    with open(path, "rb") as f:
        head = f.read(8)
    if len(head) == 8 and int.from_bytes(head, "little") < os.path.getsize(path):  # a safetensors header
        from rankkit.boosting import LambdaMART

        return LambdaMART.load(path)
    raise ValueError(f"{path}: not a rankkit model (a .ckpt checkpoint, a LambdaMART model file or a "
                     f".pt/.pt2/.onnx scorer)")


def as_scorer(model) -> Callable[[torch.Tensor], torch.Tensor]:
    """A callable features [N, F] -> scores [N] float32 for any object :func:`load_model` returns
    (or any trained model: a LightningModule, a fitted LambdaMART, an ``nn.Module``)."""
    from torch import nn

    from rankkit.export import HasScorer, unwrap

    if isinstance(model, (HasScorer, nn.Module)):
        module = unwrap(model).to("cpu").eval()

        def score(x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                return module(x).reshape(-1).float()

        return score
    if callable(model):
        return lambda x: torch.as_tensor(model(x)).reshape(-1).float()
    raise ValueError(f"`model` has to be a trained rankkit model or a scorer, got {type(model).__name__}")


def predict_file(model, input: str | os.PathLike, output: str | os.PathLike | None = None, *,
                 query_file: str | os.PathLike | None = None) -> int:
    """Score every document of the LETOR/SVMlight file ``input`` and write ``qid<TAB>doc<TAB>score``
    lines in input order to ``output`` (atomically), or to stdout when ``output`` is None.

    The file is streamed (:func:`rankkit.data.svmlight.iter_svmlight`): blocks of whole lines
    are read, scored and written in turn, so memory does not grow with the file. Every rankkit
    scorer maps features [N, F] to scores [N] document by document, so a query cut across two
    blocks gets the scores it would get whole. The checks that need the whole file (a qid that
    comes back, a ``.query`` sidecar that does not fit) raise after the last block; the output
    file is then never created (stdout has had the earlier lines).

    Args:
        model: a path (see :func:`load_model`) or a trained object.
        input: a LETOR/SVMlight file (``.gz``/``.bz2`` too), with ``qid:`` fields or a
            LightGBM ``.query`` sidecar (``query_file``, default ``input + ".query"``).
        output: the output file; None (or ``"-"``) prints to stdout.
    Returns:
        The number of documents scored.
    """
    from rankkit.data.svmlight import iter_svmlight, svmlight_width

    if isinstance(model, (str, os.PathLike)):
        model = load_model(model)
    scorer = as_scorer(model)
    n_features = _expected_features(model)
    if n_features is None:  # as read_svmlight without n_features=: the file's widest index
        n_features = max(svmlight_width(input), 1)

    def write_scores(f) -> int:
        n = 0
        for chunk in iter_svmlight(input, n_features=n_features, query_file=query_file):
            scores = torch.cat([scorer(x) for x in chunk.features.split(_CHUNK)])
            f.write("".join(f"{q}\t{d}\t{s:.9g}\n"  # float32 round-trips
                            for q, d, s in zip(chunk.qids.tolist(), chunk.docs.tolist(), scores.tolist())))
            n += len(scores)
        return n

    if output is None or os.fspath(output) == "-":
        return write_scores(sys.stdout)
    from rankkit._io import atomic_write

    written = []

    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            written.append(write_scores(f))

    atomic_write(output, write)
    return written[0]


def _expected_features(model) -> int | None:
    """The feature count the model takes (so a file with fewer columns pads with zeros), if known."""
    from rankkit.export import HasScorer, unwrap

    try:
        inner = unwrap(model) if isinstance(model, HasScorer) else model
    except ValueError:
        return None
    n = getattr(inner, "n_features", None)
    return n if isinstance(n, int) else None
