"""The seam between the booster and its kernels: one :class:`Backend` object per fit.

A boosting round asks its backend for five things, and nothing else in the booster knows which
backend runs them::

    lambdas(objective, scores, layout) ─► grow(tree, g, h, ...) (every level and the leaves)
        ─► add_tree(scores, values, leaf) ─► add_tree(eval scores, values, codes, features, cuts)
        ─► the eval metric (torch, on the plan)

Three backends implement it (all in this folder):

* :class:`TorchBackend` ("torch"): plain torch ops on any device (:mod:`rankkit.kernels.torch_ref`),
  no host sync; the reference every other backend is tested against.
* :class:`CpuBackend` ("cpu"): the compiled C kernels (:mod:`rankkit.kernels.cpu`): the lambda
  pass in one call, a whole tree with its leaves in one call, each eval set's update in one.
* :class:`TritonBackend` ("triton"): the Triton kernels (:mod:`rankkit.kernels.triton`) on a
  CUDA device, or on CPU tensors under Triton's interpreter with ``RANKKIT_TRITON=force``.

:func:`choose` picks one from the device and the request; :func:`read_switches` reads every
``RANKKIT_*`` switch of the kernels (:mod:`rankkit.kernels.switches`), in one place, with one
parsing rule:

===================== ========================================================================
``RANKKIT_BACKEND``     ``auto`` (default), ``torch``, ``cpu`` or ``triton``: the backend to use
``RANKKIT_CPU_KERNEL``  ``off`` never takes the compiled CPU kernels (tree nor lambdas)
``RANKKIT_CPU_LAMBDAS`` ``off`` keeps the compiled backend's trees but runs the torch lambda pass
``RANKKIT_TRITON``      ``off`` never takes the Triton kernels (trees nor lambdas); ``force``
                        takes them for CPU tensors too (with ``TRITON_INTERPRET=1``: the tests)
``RANKKIT_CPU_LIBRARY`` a path: load that build of the C kernels instead of the installed one
                        (the tests' AddressSanitizer build; read once, at import)
===================== ========================================================================

The rule: unset or empty is ``auto``; ``0``/``false``/``no``/``off`` is ``off``;
``1``/``true``/``yes``/``on`` is ``on`` (the same as ``auto`` where there is nothing more to
allow); anything else a switch does not take is a ValueError naming the variable.

To add a backend: subclass :class:`Backend`, implement :meth:`Backend.grow` (and whichever of
the other steps it does faster than the torch defaults), and add it to :func:`choose`. The
identity tests (tests/kernels/test_backends.py) then grow every fixture's trees on it against the torch
backend's.
"""
from __future__ import annotations

import math
import weakref

import torch

from rankkit.kernels import cpu, torch_ref
from rankkit.kernels.switches import BACKENDS, Switches, read_switches, triton_takes
from rankkit.kernels.torch_ref import N_CODES, identity_reduce
from rankkit.kernels.graph import RoundGraph
from rankkit.kernels.workspace import Workspace
from rankkit.kernels.triton import backend as triton_backend


def cpu_takes(device: torch.device | str, switches: Switches | None = None) -> bool:
    """Whether the compiled CPU kernels run on ``device``: CPU tensors, the kernels built, and
    not switched off by ``RANKKIT_CPU_KERNEL=0``."""
    s = read_switches() if switches is None else switches
    return torch.device(device).type == "cpu" and cpu.built() and s.cpu_kernel != "off"



def choose(device: torch.device | str, requested: str | None = None,
           switches: Switches | None = None) -> "Backend":
    """The backend of one fit on ``device``.

    ``requested`` (else ``RANKKIT_BACKEND``, else automatic): "torch", "cpu" or "triton",
    checked against the device. Automatic: Triton with ``RANKKIT_TRITON=force``; else the
    compiled CPU kernels for CPU tensors when they are built; else Triton where it takes the
    device (CUDA); else torch.

    >>> choose("cpu", "torch").name
    'torch'
    """
    s = read_switches() if switches is None else switches
    device = torch.device(device)
    name = requested if requested is not None else (None if s.backend == "auto" else s.backend)
    if name is not None:
        if name not in BACKENDS:
            raise ValueError(f"`backend` has to be one of {BACKENDS} or None, got {name!r}")
        if name == "triton" and not triton_takes(device, s):
            raise ValueError("backend 'triton' needs Triton and CUDA tensors (or RANKKIT_TRITON=force "
                             "with TRITON_INTERPRET=1 for CPU tensors), and RANKKIT_TRITON not off")
        if name == "cpu" and not cpu_takes(device, s):
            raise ValueError("backend 'cpu' needs CPU tensors and the compiled kernels (built by "
                             "`pip install -e .` or `python setup.py build_ext --inplace`), and "
                             "RANKKIT_CPU_KERNEL not off")
    elif s.triton == "force" and triton_takes(device, s):
        name = "triton"  # force means force, whatever else is built
    elif cpu_takes(device, s):
        name = "cpu"
    else:
        name = "triton" if triton_takes(device, s) else "torch"
    return {"torch": TorchBackend, "cpu": CpuBackend, "triton": TritonBackend}[name](device, s)


class RoundState(dict):
    """What a backend keeps for one engine's rounds (:meth:`Backend.run_round`): a dict that a
    backend can hold a weak reference to."""


def cat_float64(parts: list[torch.Tensor]) -> torch.Tensor:
    """The tensors ``parts``, flattened, cast to float64 and concatenated."""
    return torch.cat([p.to(torch.float64).reshape(-1) for p in parts])


class Backend:
    """The steps of one boosting round on one device (the torch implementation by default).

    A backend is chosen once per fit (:func:`choose`) and passed down. Its fourteen methods, by who
    calls them:

    * the objective: :meth:`lambdas` (the round's gradients);
    * the engine: :meth:`codes_layout` (each eval set's codes, once), :meth:`update_values`
      (what the round adds: the leaf values, or zeros if one is not finite), :meth:`add_tree`
      (the training scores), :meth:`score_eval_set` (each eval set's update and metric, every
      round), :meth:`eval_metric` (a metric with no tree to add), :meth:`pack` (the round's
      tree and metrics in one tensor, for its one device-to-host copy) and :meth:`run_round`
      (the round's device work, once per round: a CUDA graph's replay on the Triton backend);
    * the grower: :meth:`prepare` (once per fit), :meth:`quantize` (every tree, with
      ``quantized_grad``) and :meth:`grow` (every tree), which is :meth:`grow_levels` then
      :meth:`leaf_values`; :meth:`leaves_of` routes documents (a row sample's left-out rows,
      the eval sets).

    A new backend overrides what it runs faster and inherits the torch reference for the rest
    (docs/design.md, "The seam", has the table of who runs what).

    Attributes:
        name: "torch", "cpu" or "triton".
        device: the device of every tensor it is given.
        switches: the parsed switches it was chosen under.
    """

    name = "torch"
    #: Whether what a round returns on the device lives in buffers the next round reuses.
    keeps_buffers = False

    def __init__(self, device: torch.device | str = "cpu", switches: Switches | None = None):
        self.device = torch.device(device)
        self.switches = read_switches() if switches is None else switches

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={str(self.device)!r})"

    # -- the lambda pass ----------------------------------------------------------------------
    def lambdas(self, objective, scores: torch.Tensor, layout) -> tuple[torch.Tensor, torch.Tensor]:
        """(grad, hess) [N] float64 of ``objective`` at ``scores`` [N] on ``layout``'s queries."""
        return objective.torch_gradients(scores, layout, triton=False)

    def pack(self, parts: list[torch.Tensor]) -> torch.Tensor:
        """``parts`` (the round's tree and eval metrics) as one float64 tensor on their device,
        for the round's one device-to-host copy."""
        return cat_float64(parts)

    def run_round(self, step, *, static, state: dict):
        """What ``step`` (the round's device work) returns, its work done: ``step()`` here.
        ``static``: None, or a key (the round's shape: the number of eval sets) while every
        round of that key makes the same launches from the same buffers with nothing decided
        on the host (a backend may then replay a captured graph; another key, another graph).
        ``state``: the caller's own :class:`RoundState`, where a backend keeps what belongs to
        that caller's rounds (a backend may serve several engines)."""
        return step()

    # -- the tree -----------------------------------------------------------------------------
    def codes_layout(self, codes: torch.Tensor) -> torch.Tensor:
        """The codes [N, F] uint8 as this backend reads them: feature-major [F, N] here."""
        return codes.t().contiguous()

    def prepare(self, codes: torch.Tensor, valid_codes: torch.Tensor, depth: int):
        """Per-training-set state of the tree kernels (buffers), built once; None here."""
        return None

    def quantize(self, g: torch.Tensor, h: torch.Tensor, n_bins: int, generator: torch.Generator | None, *,
                 shard=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The round's gradients rounded stochastically to integers:
        :func:`~rankkit.kernels.torch_ref.quantize_gradients` (its draws from ``generator``)."""
        return torch_ref.quantize_gradients(g, h, n_bins, generator, shard=shard)

    def grow(self, tree, g, h, scale, valid, rows, features, noise, *, leaf_g, leaf_h):
        """Every level of one tree and its leaf values.

        Args:
            tree: the :class:`~rankkit.boosting.tree.ObliviousTreeGrower` (its ``codes`` in this
                backend's layout, ``state`` from :meth:`prepare`, ``params``, ``reduce``, ``shard``).
            g, h: [n] float64, or int32 quantized gradients with ``scale`` [2] float64.
            valid: [F', 256] bool; rows [n] / features [F'] long or None (all); noise
                [D, F', 256] float64 or None.
            leaf_g, leaf_h: [n] float64, the full-precision gradients the leaves sum.
        Returns:
            (node [n] long: each document's leaf, features [D] (into the sampled features),
            codes [D], gains [D] float64, leaf values [2^D] float64).
        """
        node, feats, cuts, gains = self.grow_levels(tree, g, h, scale, valid, rows, features, noise)
        return (node, feats, cuts, gains, self.leaf_values(tree, node, leaf_g, leaf_h))

    def grow_levels(self, tree, g, h, scale, valid, rows, features, noise):
        """The levels of one tree on the torch reference, every decision a device tensor."""
        codes_t = _sample(tree.codes, rows, features)
        if scale is not None:
            g, h = g.long(), h.long()  # int64 sums (index_add_ on int32 would overflow sooner)
        return torch_ref.grow_levels(codes_t, g, h, scale, valid, tree.params, noise, reduce=tree.reduce)

    def leaf_values(self, tree, node, g, h) -> torch.Tensor:
        """[2^D] float64 Newton steps of the leaves (fixed-point sums with ``quantized_grad``)."""
        p, n_leaves = tree.params, 1 << tree.params.depth
        if p.quantized_grad:  # integer sums throughout: exact, the same in any order or process
            sums = torch_ref.exact_leaf_sums(node, g, h, n_leaves, reduce=tree.reduce, shard=tree.shard)
        else:
            sums = torch_ref.leaf_sums(node, g, h, n_leaves, reduce=tree.reduce)
        return torch_ref.newton_leaf_values(sums, p)

    def leaves_of(self, codes: torch.Tensor, features: torch.Tensor, cuts: torch.Tensor) -> torch.Tensor:
        """[N] long: the leaf of every document of ``codes`` (this backend's layout) under a tree."""
        return torch_ref.leaf_of(codes, features, cuts)

    # -- the scores ---------------------------------------------------------------------------
    def update_values(self, values: torch.Tensor) -> torch.Tensor:
        """What a round adds to the scores: the tree's leaf ``values``, or zeros if any is not
        finite (the round reports the bad leaf after its one sync, and the scores stay as they
        were), on the device, with no sync."""
        finite = values.abs().amax() < math.inf  # a NaN's amax is NaN: not below
        return torch.where(finite, values, 0.0)

    def eval_metric(self, metric, scores: torch.Tensor, layout) -> torch.Tensor | float:
        """``metric(scores, layout)``: the eval metric of one eval set (a 0-dim tensor on the
        device, or a float), the torch path here."""
        return metric(scores, layout)

    def score_eval_set(self, metric, scores: torch.Tensor, layout, values: torch.Tensor, codes: torch.Tensor,
                       features: torch.Tensor, cuts: torch.Tensor) -> torch.Tensor | float:
        """An eval set's part of a round: the new tree (``values``, ``features``, ``cuts``)
        added to its ``scores`` (routed from its ``codes``), then its eval metric."""
        self.add_tree(scores, values, codes=codes, features=features, cuts=cuts)
        return self.eval_metric(metric, scores, layout)

    def add_tree(self, scores: torch.Tensor, values: torch.Tensor, *, leaf: torch.Tensor | None = None,
                 codes: torch.Tensor | None = None, features: torch.Tensor | None = None,
                 cuts: torch.Tensor | None = None) -> torch.Tensor:
        """``scores += values[leaf]`` in place, the leaf given, or routed from ``codes`` (this
        backend's layout) by the tree's ``features`` and ``cuts`` [D]. Returns scores."""
        if leaf is None:
            leaf = self.leaves_of(codes, features, cuts)
        return scores.add_(values[leaf])


def _sample(codes_t: torch.Tensor, rows, features) -> torch.Tensor:
    """The feature-major codes of the round's sampled features and rows."""
    out = codes_t if features is None else codes_t.index_select(0, features)
    return out if rows is None else out.index_select(1, rows)


class TorchBackend(Backend):
    """The torch reference on any device (the defaults of :class:`Backend`)."""

    name = "torch"


class CpuBackend(Backend):
    """The compiled C kernels on CPU tensors (:mod:`rankkit.kernels.cpu`).

    A round is three calls into C: the lambda pass (RankNet and NDCG weightings, with a click
    log's pair weights too; the others take the torch pass), the tree (every level and the
    leaves, no Python per level), and the eval sets' score update; a fourth before the lambda
    pass with Unbiased LambdaMART (its biases' pair costs, :func:`cpu.position_costs`). A data-parallel run (a
    reduction point other than the identity) takes the unfused kernels, one histogram call per
    level through the reduction point.
    """

    name = "cpu"

    def lambdas(self, objective, scores, layout):
        inputs = None
        if self.switches.cpu_lambdas != "off":
            inputs = objective.flat_lambda_inputs(layout, pair_factors=True)
        if inputs is None:
            return objective.torch_gradients(scores, layout, triton=False)
        flat = scores.detach().double().contiguous()
        cost_inputs = objective.flat_cost_inputs(layout)  # Unbiased LambdaMART: its biases' update, in C too
        costs = None if cost_inputs is None else cpu.position_costs(flat, **cost_inputs)
        return cpu.lambdas(flat, **inputs, pair_factors=objective.flat_pair_factors(scores, layout, costs=costs))

    def codes_layout(self, codes):
        return codes.contiguous()  # row-major: a document's codes are one row

    def prepare(self, codes, valid_codes, depth):
        return cpu.TreeKernels(codes, depth, valid_codes)

    def grow(self, tree, g, h, scale, valid, rows, features, noise, *, leaf_g, leaf_h):
        if tree.reduce is not identity_reduce:
            return super().grow(tree, g, h, scale, valid, rows, features, noise, leaf_g=leaf_g, leaf_h=leaf_h)
        p = tree.params
        known = tree.state.root_counts(rows, features, scale is not None)
        node, feats, cuts, gains, values = tree.state.grow(g, h, scale, valid, rows, features, noise, p, known,
                                                           leaf_g=None if p.quantized_grad else leaf_g,
                                                           leaf_h=None if p.quantized_grad else leaf_h)
        if p.quantized_grad:
            values = self.leaf_values(tree, node, leaf_g, leaf_h)
        return node, feats, cuts, gains, values

    def quantize(self, g, h, n_bins, generator, *, shard=None):
        # One process: the rounding in C, the same draws (a shard's scales need every rank's).
        if shard is not None:
            return super().quantize(g, h, n_bins, generator, shard=shard)
        return cpu.quantize(g, h, n_bins, generator)

    def leaf_values(self, tree, node, g, h):
        # Quantized, one process: the fixed-point leaf sums in C (the same numbers as the torch
        # reference's, which a reduction point or a shard still takes).
        if tree.params.quantized_grad and tree.reduce is identity_reduce and tree.shard is None:
            return cpu.fixed_leaves(node, g, h, 1 << tree.params.depth, tree.params)
        return super().leaf_values(tree, node, g, h)

    def grow_levels(self, tree, g, h, scale, valid, rows, features, noise):
        return cpu.grow_levels_unfused(tree.codes, g, h, scale, valid, rows, features, noise, tree.params,
                                       reduce=tree.reduce)

    def leaves_of(self, codes, features, cuts):
        depth = features.shape[0]
        return cpu.route(codes, None, features, cuts, 1 << torch.arange(depth),
                         torch.zeros(codes.shape[0], dtype=torch.long))

    def eval_metric(self, metric, scores, layout):
        """NDCG in one C call (:func:`rankkit.kernels.cpu.ndcg_mean`, summed in float64: within
        ~1e-7 of the torch metric's float32 sums); MAP on torch."""
        return self._ndcg(metric, scores, layout, None)

    def score_eval_set(self, metric, scores, layout, values, codes, features, cuts):
        """The tree's update and NDCG in one C call (``rankkit_eval_ndcg``)."""
        return self._ndcg(metric, scores, layout, (values, codes, features, cuts))

    def _ndcg(self, metric, scores, layout, tree):
        if getattr(metric, "kind", None) != "ndcg" or scores.dtype != torch.float64 or not scores.is_contiguous():
            if tree is None:
                return metric(scores, layout)
            return super().score_eval_set(metric, scores, layout, *tree)
        inputs = metric.flat_inputs(layout)
        mean = cpu.ndcg_mean(scores, empty=metric.empty, tree=tree, **inputs)
        if metric.reduce is None:
            return mean
        # data-parallel: the mean over every rank's queries, from all-reduced (sum, count)
        n_q = float(inputs["offsets"].shape[0] - 1)
        sums = metric.reduce(torch.tensor([mean * n_q, n_q], dtype=torch.float64))
        return float(sums[0] / sums[1])

    def add_tree(self, scores, values, *, leaf=None, codes=None, features=None, cuts=None):
        if leaf is not None or scores.dtype != torch.float64 or not scores.is_contiguous():
            return super().add_tree(scores, values, leaf=leaf, codes=codes, features=features, cuts=cuts)
        return cpu.add_tree(scores, values, codes, features, cuts)


# The most leaves the Triton round's last pick cuts (as the fixed-point leaf sums' kernel takes;
# deeper trees take those sums' reference, in float64).
MAX_CUT_LEAVES = 256


def fixed_point(g: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Float gradients [n] as 64-bit fixed-point integers with this round's scales (no host
    sync): x ≈ x_q · 2^−S, S the largest shift with n · max|x| · 2^S ≤ 2^62 (per channel), so no
    sum of them overflows int64 and every sum is exact, in any order. Returns (g_q, h_q int64
    [n], scale [2] float64 = (2^−S_g, 2^−S_h)). Each value moves by at most half a step, about
    n · 2^−63 of the largest: 4e−13 relative at MSLR-WEB30K's 3.8M documents.

    >>> g_q, h_q, scale = fixed_point(torch.tensor([0.5, -1.0], dtype=torch.float64),
    ...                               torch.ones(2, dtype=torch.float64))
    >>> bool((g_q.double() * scale[0] == torch.tensor([0.5, -1.0])).all())
    True
    """
    values = torch.stack([g, h]).double()
    top = values.abs().amax(dim=1) if values.shape[1] else values.new_zeros(2)
    fixed, factor = torch_ref.to_fixed_point(values, top, values.shape[1])
    return fixed[0], fixed[1], 1.0 / factor


def _flat_fits(inputs: dict) -> bool:
    """Whether the flat Triton lambda kernel computes these inputs: a cutoff of at most 32 and
    no query longer than its widest bucket."""
    from rankkit.kernels.triton.flat_lambdas import MAX_BLOCK, TOPK_MAX

    return inputs["cutoff"] <= TOPK_MAX and inputs["max_len"] <= MAX_BLOCK


def _flat_device_inputs(layout, inputs: dict, dtype: torch.dtype, device: torch.device) -> dict:
    """The flat kernel's per-data-set tensors on ``device`` in ``dtype``, made once per fit
    (cached on the layout's plan): labels, gains, weights, the query bounds and length buckets."""
    from rankkit.kernels.triton.flat_lambdas import length_buckets

    def make():
        half = inputs.get("half_weights")
        return {"labels": inputs["labels"].to(device, dtype).contiguous(),
                "gains": None if inputs["gains"] is None else inputs["gains"].to(device, dtype).contiguous(),
                "weights": None if half is None else (2.0 * half).to(device, dtype).contiguous(),
                "offsets": inputs["offsets"].to(device).contiguous(),
                "buckets": length_buckets(inputs["offsets"], device)}
    key = None if inputs["gains"] is None else inputs["gains"].data_ptr()
    return layout.plan.cached(("triton_flat", dtype, inputs["cutoff"], key), make)


class TritonBackend(Backend):
    """The Triton kernels (:mod:`rankkit.kernels.triton`): the lambda pass on the flat layout
    (:mod:`~rankkit.kernels.triton.flat_lambdas`), the levels (3 launches a level, no host
    sync) on integer histograms -- 64-bit fixed point for float gradients, packed int32 cells for
    quantized ones; deterministic: integer atomics -- that read only the smaller children's
    documents and fill each feature's hot code in from the node totals, the two-stage
    fixed-point leaf sums, the score updates and each eval set's update and NDCG@k in one kernel
    (:mod:`~rankkit.kernels.triton.eval_ndcg`).

    Every buffer of the round is the fit's (:meth:`_workspace`): what :meth:`lambdas`,
    :meth:`grow` and the other methods return on the device is overwritten by their next call
    (copy what must outlive it)."""

    name = "triton"
    keeps_buffers = True

    def lambdas(self, objective, scores, layout):
        """The flat kernel (:mod:`rankkit.kernels.triton.flat_lambdas`: one program per query,
        the top k in registers, each pair once) where the objective and the cutoff allow it (the
        compiled CPU pass's objectives, k <= 32); else the padded fused kernel or the torch path."""
        inputs = objective.flat_lambda_inputs(layout)
        if inputs is None or not _flat_fits(inputs):
            return objective.torch_gradients(scores, layout, triton=True)
        from rankkit.kernels.triton.flat_lambdas import flat_lambdas_triton

        dtype = torch.float32 if inputs["float32_scores"] else torch.float64
        flat = _flat_device_inputs(layout, inputs, dtype, self.device)
        # float32 values, as the torch path's (quantized_grad: float64 rounded to float32, in the
        # kernel): with float32 scores the kernel reads the float64 ones and writes float64
        # holding its float32 results (no cast launched).
        grad, hess = flat_lambdas_triton(scores.detach().contiguous() if dtype == torch.float32 else
                                         scores.detach().to(dtype).contiguous(), flat["labels"], flat["offsets"],
                                         flat["buckets"], gains=flat["gains"], cutoff=inputs["cutoff"],
                                         sigma=inputs["sigma"], normalize=inputs["normalize"],
                                         weights=flat["weights"], out_dtype=torch.float64,
                                         round32=dtype == torch.float64, workspace=self._workspace().scope("lambdas"))
        return grad, hess

    def grow(self, tree, g, h, scale, valid, rows, features, noise, *, leaf_g, leaf_h):
        """Float gradients in one process: the last level's pick cuts each leaf's sums from its
        rows and takes its Newton step (``grow_levels_triton(leaves=...)``). The sums are the
        fixed-point leaf sums' integers (the histograms' 64-bit fixed point has their scale: the
        same documents' count and largest |g|, |h|), and the steps those of
        :meth:`leaf_values`, bit for bit, with no pass over the documents and no torch op."""
        n_feat = tree.codes.shape[0] if features is None else features.numel()
        if scale is not None or tree.reduce is not identity_reduce or leaf_g is not g or leaf_h is not h or not n_feat \
                or (1 << tree.params.depth) > MAX_CUT_LEAVES:
            return super().grow(tree, g, h, scale, valid, rows, features, noise, leaf_g=leaf_g, leaf_h=leaf_h)
        node, feats, cuts, gains, leaves = self._fixed_levels(tree, g, h, valid, rows=rows, features=features,
                                                              noise=noise, leaf_rate=tree.params.learning_rate)
        values, update = leaves
        self._guarded = (values, update)  # the values, and the update the pick guarded
        return node, feats, cuts, gains, values

    def quantize(self, g, h, n_bins, generator, *, shard=None):
        """One process: :class:`~rankkit.kernels.triton.fixed.FixedPoint`'s three launches (the
        same draws and integers as the reference; a shard's scales need every rank's), the
        root's sums kept for the levels."""
        if shard is not None or not g.shape[0] or g.dtype != torch.float64 or h.dtype != torch.float64:
            return super().quantize(g, h, n_bins, generator, shard=shard)
        clear = self._quantized_clear(g.shape[0], g.device)
        g_q, h_q, scale, root = self._fixed_point().quantize(g, h, n_bins, generator, clear=clear)
        self._quantized_root = (g_q, root, clear)
        return g_q, h_q, scale

    def _quantized_clear(self, n: int, device) -> dict | None:
        """The tree's first buffers for the quantize kernels to zero on their way (the previous
        quantized tree's shape: features, depth), or None before the first such tree."""
        shape = self.__dict__.get("_quantized_shape")
        return None if shape is None else self._first_buffers("quantized cleared", n, *shape, torch.int32, device)

    def _first_buffers(self, scope: str, n: int, n_feat: int, depth: int, cells: torch.dtype, device) -> dict:
        """A tree's first buffers (the fit's, under ``scope``, not zeroed): the documents' nodes,
        the levels' counters and the root's cells of dtype ``cells``; int32 cells (quantized
        gradients) come with their packed int64 sums."""
        ws = self._workspace().scope(scope)
        out = {"node": ws.empty("node", n, torch.int64, device),
               "counters": ws.empty("counters", 1 + depth, torch.int32, device),
               "cells": ws.empty("cells", (3, n_feat, 1, N_CODES), cells, device)}
        if cells == torch.int32:
            out["pack"] = ws.empty("pack", n_feat * N_CODES, torch.int64, device)
        return out

    def update_values(self, values):
        """The update the last level's pick wrote beside ``values`` when it made them (no
        launch), else the reference's guard."""
        made = self.__dict__.get("_guarded")
        return made[1] if made is not None and made[0] is values else super().update_values(values)

    def grow_levels(self, tree, g, h, scale, valid, rows, features, noise):
        if tree.reduce is not identity_reduce:
            return super().grow_levels(tree, g, h, scale, valid, rows, features, noise)
        if scale is not None:  # quantized gradients: small integers, int32 cells
            codes_t = _sample(tree.codes, rows, features)
            kept = self.__dict__.get("_quantized_root")  # the root's sums and what it cleared, where quantize made g
            mine = kept is not None and kept[0] is g
            self._quantized_shape = (codes_t.shape[0], tree.params.depth)  # what the next quantize clears
            cleared = self._first_buffers("quantized cleared", g.shape[0], *self._quantized_shape, torch.int32,
                                          g.device)
            if not (mine and kept[2] is not None and all(kept[2][k] is cleared[k] for k in cleared)):
                # the first tree (or another shape): zeroed here, the cells by the root histogram
                cleared = dict(cleared, zeroed=False)
                cleared["node"].zero_()
                cleared["counters"].zero_()
            return self._levels(tree, g.to(torch.int32), h.to(torch.int32), scale, valid, codes_t=codes_t,
                                features=features, noise=noise, hist_dtype=torch.int32,
                                root=kept[1] if mine else None, cleared=cleared)
        return self._fixed_levels(tree, g, h, valid, rows=rows, features=features, noise=noise)

    def _fixed_levels(self, tree, g, h, valid, *, rows, features, noise, leaf_rate=None):
        """The levels on float gradients as 64-bit fixed point (as XGBoost's GPU histograms):
        integer atomics add in any order to the same bits, so a GPU tree does not change from run
        to run. :func:`fixed_point`'s numbers in two launches
        (:class:`~rankkit.kernels.triton.fixed.FixedPoint`, its buffers kept for the fit), which
        also clear the tree's first buffers (no launch of their own)."""
        codes_t = _sample(tree.codes, rows, features)
        cleared = self._first_buffers("cleared", codes_t.shape[1], codes_t.shape[0], tree.params.depth, torch.int64,
                                      g.device)
        g_q, h_q, scale, root = self._fixed_point()(g.to(torch.float64), h.to(torch.float64), **cleared)
        return self._levels(tree, g_q, h_q, scale, valid, codes_t=codes_t, features=features, noise=noise,
                            hist_dtype=torch.int64, leaf_rate=leaf_rate, root=root, cleared=cleared)

    def _levels(self, tree, g, h, scale, valid, *, codes_t, features, noise, hist_dtype, leaf_rate=None, root=None,
                cleared=None):
        from rankkit.kernels.triton.tree import grow_levels_triton

        hot = None if tree.state is None else tree.state if features is None else tree.state[features]
        p = tree.params
        return grow_levels_triton(codes_t, g, h, scale, self._valid(valid), depth=p.depth, l2=p.l2,
                                  min_data_in_leaf=p.min_data_in_leaf, min_sum_hessian=p.min_sum_hessian,
                                  noise=noise, hist_dtype=hist_dtype, hot=hot, leaves=leaf_rate, root=root,
                                  cleared=cleared, workspace=self._workspace().scope("levels"))

    def _valid(self, valid):
        """``valid`` as the level kernel reads it (uint8), converted once while it is the same
        tensor (the grower's, every tree without a feature sample)."""
        kept = self.__dict__.get("_valid_u8")
        if kept is None or kept[0] is not valid or kept[1] != valid._version:
            kept = self._valid_u8 = (valid, valid._version, valid.to(torch.uint8).contiguous())
        return kept[2]

    def prepare(self, codes, valid_codes, depth):
        """Each feature's most frequent code (:func:`rankkit.kernels.triton.histogram.hot_codes`),
        once per fit: the histograms fill those cells in from the node totals."""
        from rankkit.kernels.triton.histogram import hot_codes

        return hot_codes(codes)

    def leaf_values(self, tree, node, g, h):
        """Fixed-point leaf sums (deterministic) and their Newton steps in three launches (the
        factors, the programs' partial sums, one program for the rest), with the round's update
        beside them (:meth:`update_values`): one process, at most 256 leaves; else the reference."""
        p, n_leaves = tree.params, 1 << tree.params.depth
        if tree.reduce is not identity_reduce or n_leaves > MAX_CUT_LEAVES or not node.shape[0]:
            return super().leaf_values(tree, node, g, h)
        from rankkit.kernels.triton.tree import exact_leaf_values_triton

        g, h = g.to(torch.float64), h.to(torch.float64)
        values, update = exact_leaf_values_triton(node, g, h, n_leaves, factors=self._fixed_point().factors(g, h),
                                                  learning_rate=p.learning_rate, l2=p.l2,
                                                  min_sum_hessian=p.min_sum_hessian,
                                                  workspace=self._workspace().scope("leaves"))
        self._guarded = (values, update)
        return values

    def _fixed_point(self):
        """The fit's :class:`~rankkit.kernels.triton.fixed.FixedPoint` (its buffers kept)."""
        from rankkit.kernels.triton.fixed import FixedPoint

        if self.__dict__.get("_fixed") is None:
            self._fixed = FixedPoint(self.device, self._workspace().scope("fixed"))
        return self._fixed

    def _workspace(self):
        """The fit's :class:`~rankkit.kernels.workspace.Workspace`: every buffer of the
        round kept from round to round (none allocated after the first round); what a round
        returns on the device is valid until the next round."""
        if self.__dict__.get("_buffers") is None:
            self._buffers = Workspace()
        return self._buffers

    def score_eval_set(self, metric, scores, layout, values, codes, features, cuts):
        """The tree's update and NDCG@k in one kernel per length bucket
        (:mod:`rankkit.kernels.triton.eval_ndcg`) for NDCG with a cutoff of at most 32 in one
        process; the torch metric otherwise."""
        if getattr(metric, "kind", None) != "ndcg" or metric.reduce is not None or features.numel() == 0 \
                or scores.dtype != torch.float64 or not scores.is_contiguous():
            return super().score_eval_set(metric, scores, layout, values, codes, features, cuts)
        inputs = metric.flat_inputs(layout)
        if not _flat_fits(inputs):
            return super().score_eval_set(metric, scores, layout, values, codes, features, cuts)
        from rankkit.kernels.triton.eval_ndcg import eval_ndcg_triton

        flat = _flat_device_inputs(layout, inputs, torch.float64, self.device)
        return eval_ndcg_triton(scores, codes, features, cuts, values, labels=flat["labels"], gains=flat["gains"],
                                offsets=flat["offsets"], buckets=flat["buckets"], cutoff=inputs["cutoff"],
                                empty=metric.empty, workspace=self._workspace().scope("eval", scores.data_ptr()))

    def run_round(self, step, *, static, state):
        """With ``RANKKIT_CUDA_GRAPH=1``, a static round on a CUDA device of a CUDA build: the
        first round eagerly, then one CUDA graph captured and replayed
        (:class:`~rankkit.kernels.graph.RoundGraph`, kept in the caller's ``state``); else
        ``step()``. Opt-in until a GPU run has measured it (docs/gpu.md). A backend that serves
        several engines runs their rounds eagerly: their buffers are shared (a shape one engine
        changes would leave the other's graph pointing at freed memory)."""
        owner = self.__dict__.get("_round_owner")
        owner = None if owner is None else owner()
        if owner is None:  # the first engine, or the one after it is gone
            self._round_owner, owner = weakref.ref(state), state
        if owner is not state:
            owner["graph"] = state["graph"] = False
        graph = state.get("graph")
        if graph is None:
            graph = state["graph"] = RoundGraph(self.device) if self.device.type == "cuda" \
                and torch.version.cuda is not None and self.switches.cuda_graph == "on" else False
        return graph(step, key=static) if graph and static is not None else step()

    def pack(self, parts):
        """One launch into the fit's buffer (:func:`~rankkit.kernels.triton.pack.pack_float64`;
        more than its eight parts: the reference)."""
        from rankkit.kernels.triton.pack import MAX_PARTS, pack_float64

        if len(parts) > MAX_PARTS:
            return super().pack(parts)
        return pack_float64([p.contiguous() for p in parts], workspace=self._workspace().scope("pack"))

    def add_tree(self, scores, values, *, leaf=None, codes=None, features=None, cuts=None):
        if leaf is None and (features is None or features.numel() == 0):
            return scores
        return triton_backend.score_update(scores, values, leaf=leaf, codes_t=None if leaf is not None else codes,
                                           features=features, cuts=cuts)


__all__ = ["BACKENDS", "Backend", "CpuBackend", "RoundState", "fixed_point", "Switches", "TorchBackend",
           "TritonBackend", "choose", "cpu_takes", "read_switches", "triton_takes", "N_CODES"]
