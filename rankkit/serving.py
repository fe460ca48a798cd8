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

from rankkit.boosting import LambdaMART
from rankkit.data.dataset import pad
from rankkit.data.svmlight import MAX_FEATURES, iter_svmlight, svmlight_width
from rankkit.export import HasScorer, is_list_aware, load_scorer, unwrap
from rankkit.infra.checkpoint import load_checkpoint
from rankkit.infra.io import atomic_write

SCORER_SUFFIXES = (".pt", ".pt2", ".onnx", ".jit")
_CHUNK = 1 << 16


def load_model(path: str | os.PathLike, *, trust_torchscript: bool = False):
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
        return load_checkpoint(path)
    if path.endswith(SCORER_SUFFIXES):
        scorer = load_scorer(path, trust_torchscript=trust_torchscript)
        if isinstance(scorer, torch.fx.GraphModule):  # a .pt2: its width is its input's static shape
            scorer.n_features = _program_width(scorer)
        return scorer
    with open(path, "rb") as f:
        head = f.read(8)
    if len(head) == 8 and int.from_bytes(head, "little") < os.path.getsize(path):  # a safetensors header

        return LambdaMART.load(path)
    raise ValueError(f"{path}: not a rankkit model (a .ckpt checkpoint, a LambdaMART model file or a "
                     f".pt/.pt2/.onnx scorer)")


def _program_width(program: torch.fx.GraphModule) -> int | None:
    """F of a ``torch.export`` program's [N, F] (or list-aware [Q, L, F]) input, when static
    (else None)."""
    for node in program.graph.nodes:
        if node.op == "placeholder":
            shape = getattr(node.meta.get("val"), "shape", None)
            if shape is not None and len(shape) in (2, 3) and isinstance(shape[-1], int):
                return int(shape[-1])
    return None


def as_scorer(model) -> Callable[[torch.Tensor], torch.Tensor]:
    """A callable features [N, F] -> scores [N] float32 for any object :func:`load_model` returns
    (or any trained model: a LightningModule, a fitted LambdaMART, an ``nn.Module``).

    For a list-aware model (see :mod:`rankkit.scorers`) the callable instead takes a
    padded batch ``(features [Q, L, F], mask [Q, L])`` -> scores [Q, L] and carries
    ``list_aware = True``; :func:`score_queries` drives either kind over a flat file."""
    from torch import nn

    if isinstance(model, torch.fx.GraphModule):
        # A `torch.export` program (``load_scorer`` of a ``.pt2``): its mode is fixed in the
        # graph when it was exported (in eval mode), and it refuses `.train()`/`.eval()`.
        module = model
    elif isinstance(model, (HasScorer, nn.Module)):
        module = unwrap(model).to("cpu").eval()
    else:
        module = None
    if module is not None:
        if is_list_aware(module):  # (features [Q, L, F], mask [Q, L]) -> [Q, L]
            def score_lists(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
                with torch.no_grad():
                    return module(x, mask).float().masked_fill(~mask, 0.0)

            score_lists.list_aware = True
            return score_lists

        def score(x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                return module(x).reshape(-1).float()

        return score
    if callable(model) and is_list_aware(model):
        def score_loaded(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return torch.as_tensor(model(x, mask)).float()

        score_loaded.list_aware = True
        return score_loaded
    if callable(model):
        return lambda x: torch.as_tensor(model(x)).reshape(-1).float()
    raise ValueError(f"`model` has to be a trained rankkit model or a scorer, got {type(model).__name__}")


def score_queries(scorer, features: torch.Tensor, sizes: torch.Tensor | None, *, chunk: int = _CHUNK) -> torch.Tensor:
    """Flat scores [N] of flat features [N, F] grouped in queries of ``sizes`` [Q], by any
    callable of :func:`as_scorer`: a pointwise one in chunks of documents, a list-aware one on
    padded batches of whole queries (about ``chunk`` padded entries each; a longer query alone).
    A pointwise scorer needs no ``sizes`` (None).

    Raises:
        ValueError: ``sizes`` do not add up to the N documents (or are None for a list-aware scorer).
    """
    list_aware = is_list_aware(scorer)
    if sizes is None and list_aware:
        raise ValueError("`sizes` is required: a list-aware scorer scores whole queries")
    if sizes is not None and int(sizes.sum()) != len(features):
        raise ValueError(f"`sizes` add up to {int(sizes.sum())} documents, but `features` holds {len(features)}")
    if not len(features):
        return torch.zeros(0)
    if not list_aware:
        return _finite(torch.cat([_count(scorer(part).reshape(-1).float(), len(part))
                                  for part in features.split(chunk)]))
    sizes = sizes.long()
    lengths = sizes.tolist()
    offsets = torch.cat([sizes.new_zeros(1), sizes.cumsum(0)]).tolist()
    out, start = [], 0
    while start < len(lengths):
        stop, longest = start + 1, lengths[start]
        while stop < len(lengths) and max(longest, lengths[stop]) * (stop + 1 - start) <= chunk:
            longest = max(longest, lengths[stop])
            stop += 1
        padded, mask = pad(features[offsets[start]:offsets[stop]], sizes[start:stop])
        scores = scorer(padded, mask)
        if tuple(scores.shape) != tuple(mask.shape):
            raise ValueError(f"the model returned scores of shape {tuple(scores.shape)} for a batch of "
                             f"{tuple(mask.shape)} documents: a list-aware scorer gives one per document")
        out.append(scores[mask].float())
        start = stop
    return _finite(torch.cat(out))


def _count(scores: torch.Tensor, n: int) -> torch.Tensor:
    """``scores``, one per document of a block of ``n``, or a ValueError (written misaligned otherwise)."""
    if len(scores) != n:
        raise ValueError(f"the model returned {len(scores)} scores for {n} documents: a scorer gives one "
                         f"score per document")
    return scores


class NonFiniteScore(ValueError):
    """A scorer gave a NaN or infinite score (``index``: the first such document of the call)."""

    def __init__(self, index: int, value: float, where: str | None = None):
        self.index, self.value = index, value
        super().__init__(f"the model scored {where or f'document {index}'} as {value}: a non-finite score "
                         f"(NaN or inf weights in the model, or features beyond its range); nothing was written")


def _finite(scores: torch.Tensor) -> torch.Tensor:
    """``scores``, every one finite, or :class:`NonFiniteScore` naming the first that is not (a
    model file with NaN weights scores everything NaN: refused, never written)."""
    bad = ~torch.isfinite(scores)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise NonFiniteScore(i, float(scores[i]))
    return scores


def predict_file(model, input: str | os.PathLike, output: str | os.PathLike | None = None, *,
                 query_file: str | os.PathLike | None = None, trust_torchscript: bool = False) -> int:
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
        trust_torchscript: load a TorchScript ``model`` path (loading one runs its code; see
            :func:`rankkit.export.load_scorer`).
    Returns:
        The number of documents scored.
    """
    if isinstance(model, (str, os.PathLike)):
        model = load_model(model, trust_torchscript=trust_torchscript)
    scorer = as_scorer(model)
    n_features = _expected_features(model)
    if n_features is None:  # as read_svmlight without n_features=: the file's widest index
        n_features = max(svmlight_width(input), 1)

    list_aware = is_list_aware(scorer)

    def emit(f, features, qids, docs) -> int:
        if not len(qids):
            return 0
        sizes = torch.unique_consecutive(qids, return_counts=True)[1] if list_aware else None
        try:
            scores = score_queries(scorer, features, sizes)
        except NonFiniteScore as e:
            raise NonFiniteScore(e.index, e.value, f"qid {int(qids[e.index])} document {int(docs[e.index])} "
                                                   f"(0-based within its query)") from None
        f.write("".join(f"{q}\t{d}\t{s:.9g}\n"  # float32 round-trips
                        for q, d, s in zip(qids.tolist(), docs.tolist(), scores.tolist())))
        return len(scores)

    def write_scores(f) -> int:
        n, pending = 0, None
        for chunk in iter_svmlight(input, n_features=n_features, query_file=query_file):
            parts = (chunk.features, chunk.qids, chunk.docs)
            if list_aware:
                # Chunks are whole lines, not whole queries: the last query of a chunk waits for
                # the next one, so a list-aware scorer always sees complete lists. (A pointwise
                # scorer takes each chunk as it is: the exported scorer's batches, and bits.)
                if pending is not None:
                    parts = tuple(torch.cat([a, b]) for a, b in zip(pending, parts))
                qids = parts[1]
                last = qids != qids[-1] if len(qids) else qids.bool()
                cut = int(last.nonzero().max()) + 1 if bool(last.any()) else 0
                parts, pending = tuple(t[:cut] for t in parts), tuple(t[cut:] for t in parts)
            n += emit(f, *parts)
        if pending is not None:
            n += emit(f, *pending)
        return n

    if output is None or os.fspath(output) == "-":
        return write_scores(sys.stdout)

    written = []

    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            written.append(write_scores(f))

    atomic_write(output, write)
    return written[0]


def _expected_features(model) -> int | None:
    """The feature count the model takes (so a file with fewer columns pads with zeros), if known."""
    try:
        inner = unwrap(model) if isinstance(model, HasScorer) else model
    except ValueError:
        return None
    for source in (inner, model):  # a LightningModule records the width it trained on
        n = getattr(source, "n_features", None)
        if isinstance(n, int) and not isinstance(n, bool):
            if not 1 <= n <= MAX_FEATURES:  # every row is padded to it: a file cannot choose its size
                raise ValueError(f"the model declares {n} input features, beyond the limit 1..{MAX_FEATURES} "
                                 f"(rankkit.data.svmlight.MAX_FEATURES, the reader's)")
            return n
    return None
