"""The compiled CPU backend: rankkit/kernels/_cpu.c through ctypes on the tensors' memory.

The C source is built at install by setup.py into the extension module ``rankkit.kernels._cpu``
(``pip install -e .``, ``make venv``, or ``python setup.py build_ext --inplace`` in a checkout);
nothing is compiled at run time. This module finds that file and loads it with ctypes; when it
was not built (no compiler at install) or ``RANKKIT_CPU_KERNEL=0`` is set, :func:`available`
is False and the booster runs the torch reference backend (:mod:`rankkit.kernels.torch_ref`),
which grows the same trees.

Two layers of kernels:

* the fused tree grower (:class:`TreeKernels`): a whole tree in one call (``rankkit_tree_grow``:
  the root's histograms; per level the split scan with its argmax, the noise and the min-data /
  min-hessian masks inside, then the routing, which keeps the documents partitioned by node,
  and the histograms of the smaller children with the larger ones by subtraction; the leaves).
* the lambda pass (:func:`lambdas`, ``_lambdas.c``): the booster's pairwise (grad, hess) for
  the RankNet and |ΔNDCG@k| weightings over the flat query layout, one query per thread; and
  the eval metric (:func:`ndcg_mean`), with an eval set's tree update in the same call.
* the unfused kernels (:func:`histograms`, :func:`children`, :func:`route`,
  :func:`split_scan`, :func:`bin_codes`), for a run whose histograms pass through a
  reduction point (data-parallel training) and for binning.

Determinism: each (feature, node, code) cell is summed by one thread in document order, so
the result does not depend on the number of threads, and it is the same sum, in the same
order, as the torch reference's ``index_add_``.
"""
from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import weakref

import torch

from rankkit.kernels import torch_ref
from rankkit.kernels.switches import library_override, read_switches

N_CODES = 256

# The fused grower's two layouts (_cpu.c, rk_gh): from this many bytes of code rows a tree reads
# (documents x columns), each document's gradients move with it as the partition reorders the
# documents, so a node's histogram reads them in order and fetches rows further ahead (1.2M x
# 136: a 30-round fit 16.9 -> 13.1 s); below it they stay in document order (MQ2008: 2.52 ->
# 2.37 ms a round that way). The same sums either way; the tests move it to take both paths.
RK_FAR = 8 << 20
# > 0: at most this many documents in a packed quantized cell before it is unpacked (0: as many
# as the fields hold, rk_pack_chunk); the tests set it small to cross many chunk boundaries.
PACKED_CHUNK_CAP = 0


def _load() -> ctypes.CDLL | None:
    """The built extension rankkit.kernels._cpu as a ctypes library, or None when not built
    (``RANKKIT_CPU_LIBRARY``: another build of the same C files instead, e.g. the tests'
    AddressSanitizer build)."""
    path = library_override()
    if path is None:
        try:
            spec = importlib.util.find_spec("rankkit.kernels._cpu")
        except (ImportError, ValueError):
            return None
        if spec is None or not spec.origin or not os.path.isfile(spec.origin):
            return None
        path = spec.origin
    try:
        return _bind(ctypes.CDLL(path))
    except (OSError, AttributeError) as e:  # not a shared library, or one without rankkit's functions
        if library_override() is None:
            raise
        raise ValueError(f"environment variable RANKKIT_CPU_LIBRARY={path!r}: not a build of rankkit's C kernels "
                         f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); unset it to use the "
                         f"installed one") from None


def _bind(dll: ctypes.CDLL) -> ctypes.CDLL:
    """``dll`` with the argument and result types of every kernel (AttributeError: a missing one)."""
    p, i64, cint, dbl = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_double
    dll.rankkit_histograms.argtypes = [p, i64, p, i64, p, i64, p, p, i64, p, p, p, p, i64, p, cint, i64, cint]
    dll.rankkit_histograms.restype = cint
    dll.rankkit_histograms_q.argtypes = dll.rankkit_histograms.argtypes
    dll.rankkit_histograms_q.restype = cint
    dll.rankkit_route.argtypes = [p, i64, p, i64, p, p, p, i64, p, cint]
    dll.rankkit_route.restype = None
    dll.rankkit_bin.argtypes = [p, i64, i64, p, p, cint]
    dll.rankkit_bin.restype = None
    dll.rankkit_split_scan.argtypes = [p, cint, p, i64, i64, p, p, dbl, dbl, dbl, dbl, p, p, p, p, cint]
    dll.rankkit_split_scan.restype = i64
    dll.rankkit_lambdas.argtypes = [p, p, p, p, p, p, p, p, i64, i64, i64, dbl, cint, cint, cint, cint, p, p, p, cint]
    dll.rankkit_lambdas.restype = cint
    dll.rankkit_tree_grow.argtypes = [p, i64, p, i64, p, i64, p, p, cint, p, p, p, p, p, p, p, p, p, p, p, dbl, dbl,
                                      dbl, dbl, p, p, i64, cint, p, p, p, p, p, p, dbl, p, p, i64, cint]
    dll.rankkit_tree_grow.restype = cint
    dll.rankkit_any_inf.argtypes = [p, i64, cint]
    dll.rankkit_any_inf.restype = cint
    dll.rankkit_quantize.argtypes = [p, p, p, i64, i64, p, p, p]
    dll.rankkit_quantize.restype = None
    dll.rankkit_fixed_leaves.argtypes = [p, p, p, i64, i64, p, dbl, dbl, dbl, p, p, p]
    dll.rankkit_fixed_leaves.restype = i64
    dll.rankkit_add_tree.argtypes = [p, i64, i64, p, p, i64, p, p, cint]
    dll.rankkit_add_tree.restype = None
    dll.rankkit_position_costs.argtypes = [p, p, p, p, p, i64, i64, i64, dbl, cint, cint, p, p]
    dll.rankkit_position_costs.restype = cint
    dll.rankkit_ndcg_mean.argtypes = [p, p, p, p, p, i64, i64, i64, dbl, p, p, p, cint]
    dll.rankkit_ndcg_mean.restype = cint
    dll.rankkit_eval_ndcg.argtypes = [p, i64, p, p, i64, p, p, p, p, p, p, i64, i64, i64, dbl, p, p, p, cint]
    dll.rankkit_eval_ndcg.restype = cint
    return dll


_DLL = _load()


def built() -> bool:
    """Whether the compiled kernels were built (at install)."""
    return _DLL is not None


def available() -> bool:
    """Whether the compiled kernels were built and are not switched off (``RANKKIT_CPU_KERNEL=0``,
    read by :func:`rankkit.kernels.switches.read_switches`)."""
    return built() and read_switches().cpu_kernel != "off"


def _threads() -> int:
    return max(1, torch.get_num_threads())


# At most this many features per block: 3 doubles x 256 codes x 36 features = 216 KiB of cells,
# inside a core's L2 cache; fewer blocks read the rows fewer times (on 1.2M x 136 features, 4
# blocks of 34 were a little faster than 3 of 46 and than 8 of 17).
_MAX_BLOCK = 36


def _dll() -> ctypes.CDLL:
    """The loaded library; an error when it was not built (the callers check :func:`available`)."""
    if _DLL is None:
        raise RuntimeError("the compiled CPU kernels are not available (rankkit was installed without them)")
    return _DLL  # type: ignore[return-value]


def small_child_slots(small_is_right: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For the K parents p split into nodes p and p + K: (slot, small, large), where ``small``
    and ``large`` [K] are the smaller and the larger child of each parent and ``slot`` [2K]
    maps the smaller child to p and every other node to −1 (left out)."""
    k = small_is_right.shape[0]
    parents = torch.arange(k)
    small = parents + k * small_is_right.long()
    slot = torch.full((2 * k,), -1, dtype=torch.long)
    slot[small] = parents
    return slot, small, parents + k * (~small_is_right).long()


def _check_codes(codes: torch.Tensor) -> None:
    assert codes.dtype == torch.uint8 and codes.dim() == 2 and codes.is_contiguous() and codes.device.type == "cpu"


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def histograms(codes: torch.Tensor, rows: torch.Tensor | None, features: torch.Tensor | None,
                   node: torch.Tensor, grad: torch.Tensor, hess: torch.Tensor, n_nodes: int,
                   slot: torch.Tensor | None = None, n_slots: int | None = None, *,
                   counts: torch.Tensor | None = None) -> torch.Tensor:
    """[3, F, S, 256] float64 (int64 for int32 grad/hess) histograms (ΣG, ΣH, count) of the
    documents ``rows``.

    Args:
        codes: [N_all, F_all] uint8, contiguous, one row per document.
        rows: [n] int64, the documents (rows of ``codes``); None: all N_all, in order.
        features: [F] int64, the columns of ``codes`` to histogram; None: all F_all.
        node: [n] int64 in 0..n_nodes-1; grad, hess: [n] float64, or int32 quantized
            gradients (then the histograms are int64 and exact; the caller keeps each slot's
            |sum| below 2^31).
        slot: [n_nodes] int64, the output slot (0..n_slots-1) of each node's documents, or -1
            to leave them out; None: slot = node (S = n_nodes).
        counts: [F, S, 256], the count channel when the caller already knows it (then
            the kernel adds only grad and hess, about 12% faster); None: counted.
    """
    if slot is None:
        n_slots = n_nodes
    assert n_slots is not None and (slot is None or slot.shape[0] == n_nodes)
    return _histograms(codes, rows, features, node, grad, hess, slot, n_slots, None, None, n_slots, counts)


def children(codes: torch.Tensor, rows: torch.Tensor | None, features: torch.Tensor | None,
                 node: torch.Tensor, grad: torch.Tensor, hess: torch.Tensor, parent: torch.Tensor,
                 small_is_right: torch.Tensor) -> torch.Tensor:
    """The [3, F, 2K, 256] histograms of the children after a level's split (the subtraction trick).

    The K parents' documents were routed to node p + K·bit; only the documents of the smaller
    child p + K·small_is_right[p] are read, and its sibling is ``parent[:, :, p] − child`` (the
    same floating-point subtraction as torch's, written straight into place).

    Args:
        codes, rows, features, grad, hess: as for :func:`histograms`.
        node: [n] int64 in 0..2K-1, after the split.
        parent: [3, F, K, 256], the parents' histograms (float64, or int64 for int32 grad/hess).
        small_is_right: [K] bool.
    """
    k = parent.shape[2]
    slot, small, large = small_child_slots(small_is_right)
    dest = torch.cat([small, large])
    return _histograms(codes, rows, features, node, grad, hess, slot, k, parent, dest, 2 * k)


def _histograms(codes, rows, features, node, grad, hess, slot, n_slots, parent, dest, n_out,
                counts=None) -> torch.Tensor:
    _check_codes(codes)
    n = node.shape[0] if rows is None else rows.shape[0]
    assert rows is not None or n == codes.shape[0]
    assert node.shape[0] == grad.shape[0] == hess.shape[0] == n
    feats = None if features is None else features.long().contiguous()
    n_feat = codes.shape[1] if feats is None else feats.shape[0]
    assert parent is None or (dest is not None and parent.shape == (3, n_feat, n_slots, 256))
    keep = [None if t is None else t.long().contiguous() for t in (slot, dest, rows, node)]
    # Quantized gradients (int32) take the integer kernel: int32 cells, int64 histograms.
    quantized = grad.dtype == torch.int32
    value, hist = (torch.int32, torch.int64) if quantized else (torch.float64, torch.float64)
    grad, hess = grad.to(value).contiguous(), hess.to(value).contiguous()
    parent = None if parent is None else parent.to(hist).contiguous()
    threads = _threads()
    # Feature blocks: at most _MAX_BLOCK features each, a multiple of the threads (balanced).
    blocks = -(-n_feat // _MAX_BLOCK)  # ceil
    blocks = threads * -(-blocks // threads)
    out = torch.empty(3, n_feat, n_out, 256, dtype=hist)
    if counts is not None:
        assert parent is None and counts.shape == (n_feat, n_out, 256)
        out[2].copy_(counts)
    kernel = _dll().rankkit_histograms_q if quantized else _dll().rankkit_histograms
    status = kernel(
        codes.data_ptr(), codes.shape[1], _ptr(keep[2]), n, _ptr(feats), n_feat, keep[3].data_ptr(),
        _ptr(keep[0]), n_slots, grad.data_ptr(), hess.data_ptr(), _ptr(parent), _ptr(keep[1]), n_out,
        out.data_ptr(), threads, blocks, int(counts is None))
    if status != 0:
        raise MemoryError("the CPU histogram kernel could not allocate its buffers")
    return out


def route(codes: torch.Tensor, rows: torch.Tensor | None, features: torch.Tensor, cuts: torch.Tensor,
              weights: torch.Tensor, node: torch.Tensor) -> torch.Tensor:
    """``node += Σ_k [codes[rows, features[k]] > cuts[k]] · weights[k]`` in place; returns node.

    Args:
        codes: [N_all, F_all] uint8, contiguous, one row per document.
        rows: [n] int64, the documents; None: all N_all, in order.
        features, cuts, weights: [D] int64, the tests and what passing each adds.
        node: [n] int64, contiguous, updated in place.
    """
    _check_codes(codes)
    n = node.shape[0]
    assert node.dtype == torch.int64 and node.is_contiguous() and (rows is not None or n == codes.shape[0])
    assert rows is None or rows.shape[0] == n
    keep = [t.long().contiguous() for t in (features, cuts, weights)]
    rows = None if rows is None else rows.long().contiguous()
    _dll().rankkit_route(
        codes.data_ptr(), codes.shape[1], _ptr(rows), n, keep[0].data_ptr(), keep[1].data_ptr(),
        keep[2].data_ptr(), keep[0].shape[0], node.data_ptr(), _threads())
    return node


def split_scan(hist: torch.Tensor, valid_codes: torch.Tensor, params, scale: torch.Tensor | None = None,
               noise: torch.Tensor | None = None) -> tuple[torch.Tensor, int, int]:
    """One level's split scan fused with its argmax (the same kernel as the fused grower's).

    Args:
        hist: [3, F, K, 256] float64 (ΣG, ΣH, count), or int64 quantized sums read times
            ``scale`` [2] (ΣG, ΣH).
        valid_codes: [F, 256] bool.
        params: λ, min_data_in_leaf, min_sum_hessian.
        noise: [F, 256] float64 split noise, or None.
    Returns:
        (gains [F, 256] float64 as :func:`rankkit.kernels.torch_ref.split_scores`, −inf where
        not allowed; the flat index of the first maximum; that of gains + noise, or the first
        again without noise).
    """
    quantized = scale is not None
    hist = hist.contiguous() if quantized else hist.double().contiguous()
    n_feat, n_nodes = hist.shape[1], hist.shape[2]
    assert hist.shape == (3, n_feat, n_nodes, 256) and valid_codes.shape == (n_feat, 256)
    valid = valid_codes.to(torch.uint8).contiguous()
    scale = None if scale is None else scale.double().contiguous()
    noise = None if noise is None else noise.double().contiguous()
    gains = torch.empty(n_feat, 256, dtype=torch.float64)
    top, noisy = torch.zeros(1, dtype=torch.float64), torch.zeros(1, dtype=torch.int64)
    best = _dll().rankkit_split_scan(
        hist.data_ptr(), int(quantized), _ptr(scale), n_feat, n_nodes, None, valid.data_ptr(), float(params.l2),
        float(params.min_data_in_leaf), float(params.min_sum_hessian), torch_ref.TINY, _ptr(noise), gains.data_ptr(),
        top.data_ptr(), noisy.data_ptr(), _threads())
    return gains, int(best), int(noisy[0])


def bin_codes(x: torch.Tensor, borders: torch.Tensor) -> torch.Tensor:
    """[N, F] uint8 codes of x [N, F] (float32, CPU) under the borders [F, M] (ascending, padded
    with +inf, M <= 255; see :class:`rankkit.boosting.binning.QuantileBinner`), in one
    compiled pass."""
    n, n_feat = x.shape
    assert borders.shape[0] == n_feat and borders.shape[1] <= 255
    x = x.to(torch.float32).contiguous()
    padded = torch.full((n_feat, 256), torch.inf, dtype=torch.float32)
    padded[:, : borders.shape[1]] = borders
    out = torch.empty(n, n_feat, dtype=torch.uint8)
    _dll().rankkit_bin(x.data_ptr(), n, n_feat, padded.data_ptr(), out.data_ptr(), _threads())
    return out


class TreeKernels:
    """The fused grower of one training set's trees on the compiled kernels.

    Holds the row-major codes and the buffers a tree needs (the partition of the documents by
    node with their gradients, two levels of histograms), allocated once and reused by every
    tree.

    Args:
        codes: [N, F] uint8, contiguous, one row per document.
        depth: D, the levels of every tree.
        valid_codes: [F, 256] bool, the thresholds each feature allows.
    """

    def __init__(self, codes: torch.Tensor, depth: int, valid_codes: torch.Tensor):
        _check_codes(codes)
        self.codes, self.depth = codes, depth
        self._buffers: dict[tuple, torch.Tensor] = {}
        self._root_counts: torch.Tensor | None = None  # [F, 1, 256], counted by the first full tree
        # Per feature, the codes a histogram has to hold: past the largest code that occurs
        # and past the last allowed threshold (the cells above stay empty and are not read).
        last_valid = torch.where(valid_codes.cpu(), torch.arange(N_CODES), -1).amax(1)
        top = codes.amax(0).long() if codes.shape[0] else torch.zeros(codes.shape[1], dtype=torch.long)
        self.n_bins = torch.maximum(top, last_valid).add_(1).clamp_(1, N_CODES).contiguous()

    def _buffer(self, name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        key = (name, dtype)
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < numel:
            buf = self._buffers[key] = torch.empty(max(numel, 1), dtype=dtype)
        return buf[:numel]

    def root_counts(self, rows: torch.Tensor | None, features: torch.Tensor | None,
                    quantized: bool) -> torch.Tensor | None:
        """The root's count channel [F', 1, 256] when it is known: without row sampling it is the
        same for every tree (counted by the first one)."""
        if rows is not None or self._root_counts is None:
            return None
        known = self._root_counts if features is None else self._root_counts.index_select(0, features)
        return known.to(torch.int64 if quantized else torch.float64)

    def grow(self, g: torch.Tensor, h: torch.Tensor, scale: torch.Tensor | None, valid: torch.Tensor,
             rows: torch.Tensor | None, features: torch.Tensor | None, noise: torch.Tensor | None,
             params, root_counts: torch.Tensor | None = None, *, leaf_g: torch.Tensor | None = None,
             leaf_h: torch.Tensor | None = None):
        """One tree, every level and the leaves, in one call into C (``rankkit_tree_grow``).

        Args:
            g, h: [n] float64, or int32 quantized gradients with ``scale`` [2] float64.
            valid: [F', 256] bool, the allowed thresholds of the sampled features.
            rows: [n] int64 rows of the codes (None: all N); features: [F'] int64 columns (None: all).
            noise: [D, F', 256] float64 split noise, or None.
            params: the :class:`~rankkit.boosting.tree.TreeParams`.
            root_counts: [F', 1, 256] the root's count channel when known (then not counted).
            leaf_g, leaf_h: [n] float64, the gradients the leaves sum (None: no leaves).
        Returns:
            node: [n] int64, each document's leaf; features [D] (indices into the sampled
            features), codes [D] (255 for an unsplit level), gains [D] float64; the leaf values
            [2^D] float64, or None without ``leaf_g``.
        """
        codes, depth = self.codes, self.depth
        n = g.shape[0]
        n_feat = codes.shape[1] if features is None else features.shape[0]
        quantized = scale is not None
        value, hist_t = (torch.int32, torch.int64) if quantized else (torch.float64, torch.float64)
        g, h = g.to(value).contiguous(), h.to(value).contiguous()
        rows_c = None if rows is None else rows.long().contiguous()
        feats_c = None if features is None else features.long().contiguous()
        _check_sizes(codes, rows_c, feats_c, n, (g, h, leaf_g, leaf_h), noise, depth, n_feat)
        order, tmp = self._buffer("order", n, torch.int64), self._buffer("tmp", n, torch.int64)
        # Each document's (g, h): two float64, or one packed int64 when quantized; a second such
        # buffer when they travel with their positions (rows beyond the cache: RK_FAR).
        cells = n if quantized else 2 * n
        vals = self._buffer("vals", cells, torch.float64)
        vtmp = self._buffer("vtmp", cells, torch.float64) if n * codes.shape[1] >= RK_FAR else None
        seg = self._buffer("seg", 2 << depth, torch.int64)
        node = torch.empty(n, dtype=torch.int64)  # returned: a fresh tensor
        plane = n_feat * N_CODES
        big = 3 * plane << max(depth - 1, 0)
        hist_a, hist_b = self._buffer("hist_a", big, hist_t), self._buffer("hist_b", big, hist_t)
        valid_u8 = valid.to(torch.uint8).contiguous()
        nbins = self.n_bins if features is None else self.n_bins.index_select(0, feats_c)
        noise = None if noise is None else noise.double().contiguous()
        scale_c = None if scale is None else scale.double().contiguous()
        if root_counts is not None:
            hist_a[2 * plane: 3 * plane].copy_(root_counts.reshape(-1))
        keep_root = rows is None and features is None and self._root_counts is None
        root_out = torch.empty(n_feat, 1, N_CODES, dtype=hist_t) if keep_root else None
        feats = torch.empty(depth, dtype=torch.long)
        cuts = torch.empty(depth, dtype=torch.long)
        gains = torch.empty(depth, dtype=torch.float64)
        gains_buf = self._buffer("gains", plane, torch.float64)
        n_leaves = 1 << depth
        values = sums = None
        if leaf_g is not None:
            leaf_g, leaf_h = leaf_g.double().contiguous(), leaf_h.double().contiguous()
            values = torch.empty(n_leaves, dtype=torch.float64)
            sums = self._buffer("sums", 2 * n_leaves, torch.float64)
        status = _dll().rankkit_tree_grow(
            codes.data_ptr(), codes.shape[1], _ptr(rows_c), n, _ptr(feats_c), n_feat, g.data_ptr(), h.data_ptr(),
            int(quantized), _ptr(scale_c), order.data_ptr(), tmp.data_ptr(), seg.data_ptr(), node.data_ptr(),
            vals.data_ptr(), _ptr(vtmp), hist_a.data_ptr(), hist_b.data_ptr(), nbins.data_ptr(),
            valid_u8.data_ptr(), float(params.l2), float(params.min_data_in_leaf), float(params.min_sum_hessian),
            torch_ref.TINY, _ptr(noise), gains_buf.data_ptr(), depth, int(root_counts is None), _ptr(root_out),
            feats.data_ptr(), cuts.data_ptr(), gains.data_ptr(), _ptr(leaf_g), _ptr(leaf_h),
            float(params.learning_rate), _ptr(sums), _ptr(values), int(PACKED_CHUNK_CAP), _threads())
        if status == -2:
            raise ValueError("quantized gradients out of the packed histogram cells' range: |g| must stay below "
                             "2^21 and max(h, 0) - min(h, 0) below 2^22 (num_grad_quant_bins <= 256 keeps them far "
                             "below: a NaN or infinite gradient rounds to -2^31)")
        if status != 0:
            raise MemoryError("the CPU tree kernel could not allocate its buffers")
        if keep_root:
            self._root_counts = root_out
        return node, feats, cuts, gains, values


def any_inf(x: torch.Tensor) -> bool:
    """Whether a contiguous float32 CPU tensor holds +inf or -inf (NaN does not count), in one
    compiled pass on every thread."""
    assert x.dtype == torch.float32 and x.is_contiguous() and x.device.type == "cpu"
    return bool(_dll().rankkit_any_inf(x.data_ptr(), x.numel(), _threads()))


def quantize(grad: torch.Tensor, hess: torch.Tensor, n_bins: int, generator: torch.Generator | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`rankkit.kernels.torch_ref.quantize_gradients` (one process) with its rounding in C
    (``rankkit_quantize``): the same draws from ``generator``, the same integers and scales."""
    n = grad.shape[0]
    if n == 0 or grad.dtype != torch.float64 or hess.dtype != torch.float64:
        # (float32 gradients: the reference computes their scale in float32; the engine's are float64)
        return torch_ref.quantize_gradients(grad, hess, n_bins, generator)
    g, h = grad.contiguous(), hess.contiguous()
    u = torch.rand(2, n, generator=generator, dtype=torch.float64, device="cpu")
    gq, hq = torch.empty(n, dtype=torch.int32, device="cpu"), torch.empty(n, dtype=torch.int32, device="cpu")
    scale = torch.empty(2, dtype=torch.float64, device="cpu")
    _dll().rankkit_quantize(g.data_ptr(), h.data_ptr(), u.data_ptr(), n, int(n_bins), gq.data_ptr(), hq.data_ptr(),
                            scale.data_ptr())
    return gq, hq, scale


def fixed_leaves(node: torch.Tensor, g: torch.Tensor, h: torch.Tensor, n_leaves: int, params) -> torch.Tensor:
    """[n_leaves] float64 Newton steps of the leaves from fixed-point sums of g, h [n] float64
    (``rankkit_fixed_leaves``): the numbers of ``torch_ref.exact_leaf_sums`` then
    ``newton_leaf_values`` (one process, no reduction point), in one pass."""
    g, h = g.double().contiguous(), h.double().contiguous()
    node = node.long().contiguous()
    n = g.shape[0]
    top = torch.stack([g.abs().amax(), h.abs().amax()]) if n else torch.zeros(2, dtype=torch.float64)
    factor = torch_ref.fixed_point_factor(top, n).double().contiguous()
    isums = torch.empty(2 * n_leaves, dtype=torch.int64, device="cpu")
    sums = torch.empty(2 * n_leaves, dtype=torch.float64, device="cpu")
    values = torch.empty(n_leaves, dtype=torch.float64, device="cpu")
    _dll().rankkit_fixed_leaves(node.data_ptr(), g.data_ptr(), h.data_ptr(), n, n_leaves, factor.data_ptr(),
                                float(params.learning_rate), float(params.l2), float(params.min_sum_hessian),
                                isums.data_ptr(), sums.data_ptr(), values.data_ptr())
    return values


def _check_sizes(codes: torch.Tensor, rows: torch.Tensor | None, features: torch.Tensor | None, n: int,
                 per_document, noise: torch.Tensor | None, depth: int, n_feat: int) -> None:
    """Every size and index the C tree reads, checked before the call (the C code trusts them):
    the per-document vectors [n], rows within the codes' rows, features within its columns,
    the noise [D, F', 256]. A failure is a bug of the caller, reported as a ValueError."""
    n_rows, n_cols = codes.shape
    if not 1 <= depth <= 30:
        raise ValueError(f"depth {depth} out of 1..30")
    if rows is None and n != n_rows:
        raise ValueError(f"{n} gradients for {n_rows} rows of codes")
    for t in per_document:
        if t is not None and t.shape != (n,):
            raise ValueError(f"a per-document vector has shape {tuple(t.shape)}, expected ({n},)")
    for name, idx, top in (("rows", rows, n_rows), ("features", features, n_cols)):
        if idx is not None and idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= top):
            raise ValueError(f"`{name}` holds an index outside 0..{top - 1}")
    if rows is not None and rows.shape != (n,):
        raise ValueError(f"`rows` has shape {tuple(rows.shape)}, expected ({n},)")
    if noise is not None and noise.shape != (depth, n_feat, N_CODES):
        raise ValueError(f"`noise` has shape {tuple(noise.shape)}, expected ({depth}, {n_feat}, 256)")


def _check_tree(scores, values, codes, features, cuts):
    """The sizes and indices a routed score update reads, checked before the C call; returns the
    contiguous int64 features, cuts and float64 values."""
    _check_codes(codes)
    n, depth = scores.shape[0], features.shape[0]
    if codes.shape[0] != n or values.shape != (1 << depth,) or cuts.shape != (depth,):
        raise ValueError(f"add_tree: {n} scores, codes {tuple(codes.shape)}, {values.shape[0]} leaf values, "
                         f"{depth} features and {cuts.shape[0]} cuts do not agree")
    if depth and (int(features.min()) < 0 or int(features.max()) >= codes.shape[1]):
        raise ValueError(f"add_tree: a feature index outside 0..{codes.shape[1] - 1}")
    if scores.dtype != torch.float64 or not scores.is_contiguous():
        raise ValueError("add_tree: `scores` has to be contiguous float64 (updated in place)")
    return features.long().contiguous(), cuts.long().contiguous(), values.double().contiguous()


def add_tree(scores: torch.Tensor, values: torch.Tensor, codes: torch.Tensor, features: torch.Tensor,
             cuts: torch.Tensor) -> torch.Tensor:
    """``scores += values[leaf]`` in place, each row's leaf routed from ``codes`` [n, F] uint8
    (row-major) by the tree's ``features`` and ``cuts`` [D]: one pass. Returns scores [n] float64."""
    feats, cut, vals = _check_tree(scores, values, codes, features, cuts)
    _dll().rankkit_add_tree(codes.data_ptr(), codes.shape[1], scores.shape[0], feats.data_ptr(), cut.data_ptr(),
                            feats.shape[0], vals.data_ptr(), scores.data_ptr(), _threads())
    return scores


def grow_levels_unfused(codes: torch.Tensor, g, h, scale, valid, rows, features, noise, params, *,
                        reduce) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The levels of one tree on the unfused kernels, every histogram through the reduction
    point ``reduce`` (data-parallel training): one histogram call per level, the split scan
    and the routing in C, the decisions on the host. Arguments and result as
    :func:`rankkit.kernels.torch_ref.grow_levels`, with ``codes`` [N, F] row-major."""
    n, depth = g.shape[0], params.depth
    raw = torch.arange(codes.shape[1]) if features is None else features
    node = torch.zeros(n, dtype=torch.long)
    feats = torch.zeros(depth, dtype=torch.long)
    cuts = torch.full((depth,), N_CODES - 1, dtype=torch.long)
    gains = torch.zeros(depth, dtype=torch.float64)
    hist = reduce(histograms(codes, rows, features, node, g, h, 1))
    for level in range(depth):
        n_nodes = 1 << level
        scores, best, noisy = split_scan(hist, valid, params, scale, None if noise is None else noise[level])
        if not float(scores.view(-1)[best]) > 0.0:  # best: the first maximum, lowest (feature, code)
            # No allowed split: this level and the rest send everything left (code 255), each
            # recording its best feature on the unchanged histograms, as the reference.
            for rest in range(level, depth):
                noisy = split_scan(hist, valid, params, scale, None if noise is None else noise[rest])[2]
                feats[rest] = noisy // N_CODES
            break
        f, c = divmod(noisy, N_CODES)
        feats[level], cuts[level], gains[level] = f, c, scores[f, c]
        route(codes, rows, raw[f: f + 1], torch.tensor([c]), torch.tensor([n_nodes]), node)
        if level + 1 == depth:
            break
        # Children of the next level: the smaller child of each parent p goes to slot p, the
        # others are skipped; the larger is parent − smaller after the reduction.
        left_count = hist[2, f, :, : c + 1].sum(-1)
        small_is_right = hist[2, f, :, c + 1:].sum(-1) <= left_count  # [K]
        slot = small_child_slots(small_is_right)[0]
        small = reduce(histograms(codes, rows, features, node, g, h, 2 * n_nodes, slot, n_nodes))
        hist = torch_ref.siblings(hist, small, small_is_right)
    return node, feats, cuts, gains




@functools.lru_cache(maxsize=16)
def _discounts(max_len: int, cutoff: int) -> torch.Tensor:
    """[max(max_len, 1)] float64: 1 / log2(2 + r) for ranks r < cutoff, 0 beyond. Made once per
    (max_len, cutoff) and shared: the C calls only read it."""
    disc = torch.zeros(max(max_len, 1), dtype=torch.float64)
    top = min(cutoff, max_len)
    disc[:top] = 1.0 / torch.log2(torch.arange(top, dtype=torch.float64) + 2.0)
    return disc


#: The offsets checked last: (a weak reference, the tensor's version, n, max_len). The booster
#: passes the same training and eval-set offsets every round: checked once, while unchanged.
_CHECKED: list[tuple[weakref.ref, int, int, int]] = []


def _check_offsets(offsets: torch.Tensor, n: int, max_len: int) -> None:
    """The query bounds the C lambda pass reads, checked before the call: int64, contiguous,
    from 0 to n, non-decreasing, no query longer than ``max_len`` (its per-thread buffers).
    Skipped for a tensor checked before with the same n and max_len and not changed since
    (its version counter)."""
    for ref, version, n0, len0 in _CHECKED:
        if ref() is offsets and offsets._version == version and (n0, len0) == (n, max_len):
            return
    _check_offsets_now(offsets, n, max_len)
    _CHECKED.insert(0, (weakref.ref(offsets), offsets._version, n, max_len))
    del _CHECKED[4:]


def _check_offsets_now(offsets: torch.Tensor, n: int, max_len: int) -> None:
    if offsets.dtype != torch.int64 or not offsets.is_contiguous() or offsets.dim() != 1 or not len(offsets):
        raise ValueError("`offsets` has to be a contiguous 1-D int64 tensor [Q + 1]")
    sizes = offsets.diff()
    if int(offsets[0]) != 0 or int(offsets[-1]) != n or (len(sizes) and (int(sizes.min()) < 0
                                                                        or int(sizes.max()) > max_len)):
        raise ValueError(f"`offsets` has to run from 0 to N={n} without decreasing, no query longer than "
                         f"max_len={max_len}")


def lambdas(scores: torch.Tensor, labels: torch.Tensor, offsets: torch.Tensor, *, gains: torch.Tensor | None,
            cutoff: int, max_len: int, sigma: float = 1.0, normalize: bool = False,
            half_weights: torch.Tensor | None = None, pair_factors: tuple[torch.Tensor, torch.Tensor] | None = None,
            float32_scores: bool = True, float32_out: bool = True,
            order: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad, hess) [N] float64 of the pairwise lambda objective over flat queries, in C.

    The numbers of :func:`rankkit.lambdas.lambda_gradients` (RankNet when ``gains`` is None,
    else |ΔNDCG@cutoff|, no tie term, no groups), computed in float64: query q
    is ``[offsets[q], offsets[q + 1])`` of the flat arrays; only pairs with a document in the
    current top ``cutoff`` take part (O(cutoff · L) per query).

    Args:
        scores, labels: [N] float64 (contiguous).
        offsets: [Q + 1] int64, the queries' bounds.
        gains: [N] float64, each document's NDCG gain over its query's ideal DCG@cutoff (0 where
            that is 0), or None for RankNet.
        cutoff: the top positions whose pairs count (the longest query's length for none).
        max_len: the longest query's length.
        sigma, normalize: the kernel's options.
        half_weights: [N] float64, half each document's weight, or None.
        pair_factors: (upper, lower), [N] float64 each, or None: the pair (i, j) with y_i > y_j
            weighs upper_i · lower_j (``lambda_gradients``' ``pair_weights``, flat).
        float32_scores: rank and pair the scores' float32 values (as the booster's torch path,
            which computes in float32 unless ``exact``).
        float32_out: round grad and hess to float32 values (the booster's gradients are float32
            numbers: the torch path's float32 results, or with ``exact`` its float64 ones
            rounded).
        order: [N] int64, or None: each query's flat positions in the order to start sorting
            from, overwritten with the current rank order (pass the same buffer every round:
            the previous ranking makes the sort cheap). Any permutation within each query gives
            the same result.
    """
    n = scores.shape[0]
    upper, lower = pair_factors if pair_factors is not None else (None, None)
    for t in (scores, labels, gains, half_weights, upper, lower):
        assert t is None or (t.dtype == torch.float64 and t.is_contiguous() and t.shape == (n,))
    assert order is None or (order.dtype == torch.int64 and order.is_contiguous() and order.shape == (n,))
    _check_offsets(offsets, n, max_len)
    disc = _discounts(max_len, cutoff)
    grad = torch.empty(n, dtype=torch.float64)
    hess = torch.empty(n, dtype=torch.float64)
    failed = _dll().rankkit_lambdas(
        scores.data_ptr(), labels.data_ptr(), _ptr(gains), disc.data_ptr(), _ptr(half_weights), _ptr(upper),
        _ptr(lower), offsets.data_ptr(), offsets.shape[0] - 1, max_len, cutoff, float(sigma), 0 if gains is None else 1,
        int(normalize), int(float32_scores), int(float32_out), grad.data_ptr(), hess.data_ptr(),
        _ptr(order), _threads())
    if failed:
        raise MemoryError("rankkit_lambdas: could not allocate its per-thread buffers")
    return grad, hess


def position_costs(scores: torch.Tensor, clicks: torch.Tensor, bucket: torch.Tensor, offsets: torch.Tensor, *,
                   n_positions: int, cutoff: int, max_len: int, sigma: float = 1.0, ndcg: bool = True,
                   float32_scores: bool = True, order: torch.Tensor | None = None) -> torch.Tensor:
    """Unbiased LambdaMART's pair costs of flat click sessions, summed by (position bucket of the
    clicked document, of the unclicked one): :func:`rankkit.clicks.propensity.position_pair_costs` in one
    C call, O(clicked × unclicked) per session, the additions in its order.

    Args:
        scores, clicks: [N] float64 (contiguous; clicks 0 or 1).
        bucket: [N] int64, each document's position bucket in [0, n_positions).
        offsets: [Q + 1] int64 session bounds; max_len: the longest session's length.
        cutoff: the NDCG cutoff k (the longest session's length for none).
        sigma: the pair cost's σ; ndcg: weigh each pair by |ΔNDCG@cutoff| of the clicks (else by 1,
            RankNet).
        float32_scores: rank and pair the scores' float32 values (as the booster's torch path).
        order: as :func:`lambdas`' (each session's flat positions, a permutation within each
            session: not checked), updated to the ranking of the sessions with a clicked and an
            unclicked document under the NDCG weighting (the lambda pass that follows then starts
            sorted there), or None.
    Returns:
        [n_positions, n_positions] float64.
    """
    n = scores.shape[0]
    for t in (scores, clicks):
        if t.dtype != torch.float64 or not t.is_contiguous() or t.shape != (n,):
            raise ValueError("position_costs: scores and clicks have to be contiguous float64 [N]")
    if bucket.dtype != torch.int64 or not bucket.is_contiguous() or bucket.shape != (n,) or \
            (n and (int(bucket.min()) < 0 or int(bucket.max()) >= n_positions)):
        raise ValueError(f"position_costs: `bucket` has to be a contiguous int64 [N] in [0, {n_positions})")
    _check_offsets(offsets, n, max_len)
    if order is None:
        order = torch.arange(n, dtype=torch.int64)
    elif order.dtype != torch.int64 or not order.is_contiguous() or order.shape != (n,):
        raise ValueError("position_costs: `order` has to be a contiguous int64 [N]")
    total = torch.zeros(n_positions, n_positions, dtype=torch.float64)
    disc = _discounts(max_len, cutoff)  # held: the call reads its memory
    failed = _dll().rankkit_position_costs(
        scores.data_ptr(), clicks.data_ptr(), bucket.data_ptr(), disc.data_ptr(),
        offsets.data_ptr(), offsets.shape[0] - 1, max_len, n_positions, float(sigma), int(ndcg),
        int(float32_scores), order.data_ptr(), total.data_ptr())
    if failed:
        raise MemoryError("rankkit_position_costs: could not allocate its buffers")
    return total


def ndcg_mean(scores: torch.Tensor, labels: torch.Tensor, gains: torch.Tensor, offsets: torch.Tensor, *,
              cutoff: int, max_len: int, empty: float = 1.0, order: torch.Tensor | None = None,
              tree: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> float:
    """The mean NDCG@cutoff of flat queries in one C call (the booster's eval metric).

    Args:
        scores: [N] float64 (ranked by their float32 values, worst case among ties, as
            :func:`rankkit.metrics.planned_ndcg`).
        labels: [N] float64; gains: [N] float64, each document's gain over its query's ideal
            DCG@cutoff (0 where that is 0: the query then scores ``empty``).
        offsets: [Q + 1] int64 query bounds; cutoff: k (the longest query's length for none);
        max_len: the longest query's length.
        order: [N] int64, each query's flat positions in the order to start sorting from
            (updated to the ranking; pass the same buffer every round), or None.
        tree: (values [2^D], codes [N, F] uint8 row-major, features [D], cuts [D]): first add
            this tree to ``scores`` in place (as :func:`add_tree`), in the same call.
    Returns:
        The mean over the queries, a float (summed in float64 in query order).
    """
    n = scores.shape[0]
    for t in (scores, labels, gains):
        if t.dtype != torch.float64 or not t.is_contiguous() or t.shape != (n,):
            raise ValueError("ndcg_mean: scores, labels and gains have to be contiguous float64 [N]")
    _check_offsets(offsets, n, max_len)
    if order is None:
        order = torch.arange(n, dtype=torch.int64)
    elif order.dtype != torch.int64 or not order.is_contiguous() or order.shape != (n,):
        raise ValueError("ndcg_mean: `order` has to be a contiguous int64 [N]")
    n_q = offsets.shape[0] - 1
    disc = _discounts(max_len, cutoff)
    per_query = torch.empty(max(n_q, 1), dtype=torch.float64)
    out = torch.zeros(1, dtype=torch.float64)
    common = (labels.data_ptr(), gains.data_ptr(), disc.data_ptr(), offsets.data_ptr(), n_q, max_len, cutoff,
              float(empty), order.data_ptr(), per_query.data_ptr(), out.data_ptr(), _threads())
    if tree is None:
        failed = _dll().rankkit_ndcg_mean(scores.data_ptr(), *common)
    else:
        values, codes, features, cuts = tree
        feats, cut, vals = _check_tree(scores, values, codes, features, cuts)
        failed = _dll().rankkit_eval_ndcg(codes.data_ptr(), codes.shape[1], feats.data_ptr(), cut.data_ptr(),
                                          feats.shape[0], vals.data_ptr(), scores.data_ptr(), *common)
    if failed:
        raise MemoryError("rankkit_ndcg_mean: could not allocate its per-thread buffers")
    return float(out[0])
