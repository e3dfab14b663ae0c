"""kiln-cpu's index kernels: ``gather``, ``scatter``, ``scatter_add``, ``index_select``, ``index_add``,
``_embedding``, and advanced indexing (``_index``, ``index_put``) with one index tensor (a 1-D integer
index, or a boolean mask) after whole dims. The loops are Numba (:mod:`kiln_cpu._jit_index`); here each
call becomes one strided loop over five dims, with its result laid out as the reference lays it out.

Results are bit for bit the reference's: copies move bits; scatter_add/index_add/``accumulate`` add in
``np.add.at``'s order, because the loops run in parallel only over dims other than the indexed one and
visit the indexed dim in increasing order (duplicate indices accumulate, and the last write wins, as in
the reference). The input copy of the scatter family skips zero blocks of the source into a zero-filled
result (backward formulas scatter into fresh zeros).

Handed back to the reference: reads NumPy already does at memcpy speed (index_select, embedding and
``x[idx]`` on the first dim of a C-contiguous tensor: ``np.take``; measured as fast as the loop, and a
second thread does not help: the time goes to page faults of the new result), small results
(:data:`kiln_cpu.config.min_numel`; :data:`kiln_cpu.config.multipass_min_numel` for the accumulating ops), empty and 0-d tensors, dtypes other than float32/float64/int32/int64 (float32/float64 for the accumulating ops),
negative strides, layouts that need more than four dims next to the indexed one, advanced indexing other
than the two forms above, and out-of-range indices (found by the loop: the reference then raises its
error).
"""

from __future__ import annotations

import math

import numpy as np

import kiln
from kiln import Tensor
from kiln.backend import from_array
from kiln_cpu import _threads, config
from kiln_cpu._kernel_support import _GRAIN, loops, parallel, with_fallback

FLOAT = (kiln.float32, kiln.float64)
COPY = (kiln.float32, kiln.float64, kiln.int32, kiln.int64)
_BITS = {4: np.dtype(np.int32), 8: np.dtype(np.int64)}
_INDEX = (kiln.int32, kiln.int64)

_j = loops("_jit_index")


# ------------------------------------------------------------------------------------------ layouts


def _mem(a: np.ndarray) -> tuple[np.ndarray, tuple] | None:
    """(1-d array over ``a``'s memory from its first element, strides in elements) of an array with no
    negative stride, else None."""
    isz = a.itemsize
    if any(s < 0 for s in a.strides):
        return None
    st = tuple(s // isz for s in a.strides)
    extent = 1 + sum((n - 1) * s for n, s in zip(a.shape, st))
    return np.lib.stride_tricks.as_strided(a, (extent,), (isz,)), st


def _dense_order(a: np.ndarray) -> list[int]:
    """The dims of ``a`` outermost first by stride (NumPy's order-K layout of a copy)."""
    return sorted(range(a.ndim), key=lambda i: -abs(a.strides[i]))


def _copy_of(a: np.ndarray) -> np.ndarray:
    """A new array with ``a``'s values laid out as ``a.astype(a.dtype, copy=True)`` lays them out. A dense
    ``a`` is copied in parallel into zeros from ``calloc``, skipping its all-zero blocks."""
    order = _dense_order(a)
    t = a.transpose(order)
    if not t.flags.c_contiguous or a.itemsize not in _BITS or any(s < 0 for s in a.strides):
        return a.copy(order="K")
    dense = np.zeros(t.shape, a.dtype)
    out = dense.transpose(np.argsort(order))
    bits = _BITS[a.itemsize]
    src, dst = t.reshape(-1).view(bits), dense.reshape(-1).view(bits)
    blocks = -(-src.size // _j()._ZERO_BLOCK)
    parallel(_j().copy_nonzero, (src, dst), blocks, max(1, _GRAIN // _j()._ZERO_BLOCK))
    return out


def _index_array(index: Tensor) -> np.ndarray:
    """The index values as int64 (an int32 index is converted: one loop specialisation)."""
    i = index._numpy()
    return i if i.dtype == np.int64 else i.astype(np.int64)


def _merge(shape: tuple, dims, strides: list[tuple]) -> list:
    """``(size, per-operand strides)`` of ``dims`` (outermost first), size-1 dims dropped and neighbours
    that are contiguous in every operand merged."""
    out: list = []
    for i in dims:
        n = shape[i]
        if n == 1:
            continue
        st = tuple(s[i] for s in strides)
        if out:
            pn, pst = out[-1]
            if all(ps == s * n for ps, s in zip(pst, st)):
                out[-1] = (pn * n, st)
                continue
        out.append((n, st))
    return out


def _run(mode: int, shape: tuple, d: int, data, d_st, idx, i_st, plain, p_st, n: int, wrap: bool, alpha) -> bool:
    """Run the index loop of ``mode`` over the iteration ``shape`` (dim ``d`` indexed by ``idx``); operands
    are (1-d memory, strides over the iteration dims; ``d_st[d]`` is the stride the index value steps).
    False when the layout needs more than four other dims (nothing ran) or an index is out of range."""
    j = _j()
    others = _merge(shape, range(d), [i_st, d_st, p_st]) + _merge(shape, range(d + 1, len(shape)), [i_st, d_st, p_st])
    if len(others) > 4:
        return False
    others.sort(key=lambda o: -abs(o[1][2]))  # the plain operand is the one walked in order
    jdim = (shape[d], (i_st[d], 0, p_st[d]))
    one = (1, (0, 0, 0))
    j_inner = not others or abs(p_st[d]) <= abs(others[-1][1][2])
    if j_inner:  # the other dims outside, the outer three split into tasks
        dims = [one] * (3 - len(others)) + others + [one] * (len(others) < 4) + [jdim]
    elif mode == j.READ and len(others) <= 3:  # reads: the indexed dim split into tasks, whole runs inside
        dims = [one] * (3 - len(others)) + others[:-1] + [jdim, one, others[-1]]
    else:  # writes: the innermost other dim inside (in blocks), the indexed dim around it in each task
        dims = [one] * (4 - len(others)) + others[:-1] + [jdim, others[-1]]
    sizes = tuple(x[0] for x in dims)
    outer = sizes[0] * sizes[1] * sizes[2]
    n4 = sizes[4]
    if mode != j.READ and j_inner:
        blk = n4  # the indexed dim stays in one task: duplicates keep their order
    else:
        want = -(-4 * _threads.get_num_threads() // outer)
        blocks = max(1, min(want, n4 // 64))
        blk = -(-n4 // blocks)
    tasks = outer * -(-n4 // blk)
    i5 = tuple(x[1][0] for x in dims)
    d5 = tuple(x[1][1] for x in dims)
    p5 = tuple(x[1][2] for x in dims)
    bad = np.zeros(1, np.int8)
    args = (data, 0, d5, d_st[d], idx, 0, i5, plain, 0, p5, sizes, n, wrap, alpha, blk, bad)
    parallel(j.index_loop(mode), args, tasks, max(1, _GRAIN // (sizes[3] * blk)))
    return not bad[0]


def _small(shape: tuple, accumulate: bool = False) -> bool:
    """Too small for the loops (or empty): the reference runs. The accumulating ops run from
    :data:`kiln_cpu.config.multipass_min_numel` elements: the reference's ``np.add.at`` takes about 10 ns
    an element (a max pool's backward, 200K elements: 1.9 ms against 0.3 ms)."""
    return config.too_small(math.prod(shape), multipass=accumulate)


def _bits(a: np.ndarray, mode_copy: bool) -> np.ndarray:
    """The integer view of a copy's operand (copies move bits), else ``a`` itself."""
    return a.view(_BITS[a.itemsize]) if mode_copy else a


# ---------------------------------------------------------------------------------------- gather / scatter


def _gather(spec, input, dim, index, sparse_grad=False):
    """gather: READ along ``dim``, the result laid out as the reference's int64 copy of the index."""
    d_out = spec.dtype
    shape = index._shape
    if d_out not in COPY or input._dtype is not d_out or not shape or _small(shape):
        return None
    d = spec.dim
    n = input._shape[d]
    if n == 0:
        return None
    x, i = input._numpy(), _index_array(index)
    out = np.empty_like(i, dtype=x.dtype)  # the layout of the reference's int64 copy of the index
    mx, mi, mo = _mem(x), _mem(i), _mem(out)
    if mx is None or mi is None or mo is None:
        return None
    d_st = mx[1]
    ok = _run(_j().READ, shape, d, _bits(mx[0], True), d_st, mi[0], mi[1], _bits(mo[0], True), mo[1], n, False, 0)
    return from_array(out, d_out) if ok else None


def _scatter_body(accumulate: bool):
    """The body of the scatter (``accumulate`` False) or scatter_add kernel."""

    def body(spec, input, dim, index, src=None, value=None):
        """scatter (WRITE) / scatter_add (ADD) into an order-K copy of ``input``."""
        d_out = spec.dtype
        shape = index._shape
        if d_out not in (FLOAT if accumulate else COPY) or input._dtype is not d_out or not shape:
            return None
        if _small(shape, accumulate) or _small(input._shape, accumulate):
            return None
        d = spec.dim
        n = input._shape[d]
        if isinstance(src, Tensor):
            if src._dtype is not d_out:
                return None
            s = src._numpy()
        else:
            v = src if src is not None else value
            if accumulate or v is None:
                return None
            with np.errstate(all="ignore"):
                s = np.broadcast_to(np.asarray(v).astype(d_out.numpy).reshape(1), shape)
        x, i = input._numpy(), _index_array(index)
        ms, mi = _mem(s), _mem(i)
        if _mem(x) is None or ms is None or mi is None:
            return None
        out = _copy_of(x)
        mo = _mem(out)
        j = _j()
        mode = j.ADD if accumulate else j.WRITE
        one = d_out.numpy.type(1) if accumulate else np.int32(1)
        data, plain = _bits(mo[0], not accumulate), _bits(ms[0], not accumulate)
        if not _run(mode, shape, d, data, mo[1], mi[0], mi[1], plain, ms[1], n, False, one):
            return None
        return from_array(out, d_out)

    return body


# ---------------------------------------------------------------------------------------- index_select / add


def _line_strides(index: np.ndarray, nd: int, d: int) -> tuple[np.ndarray, tuple] | None:
    """A 1-D (or 0-d) index as loop operand: strides 0 on every iteration dim but ``d``."""
    i = index.reshape(-1)
    mi = _mem(i)
    if mi is None:
        return None
    st = [0] * nd
    st[d] = mi[1][0]
    return mi[0], tuple(st)


def _index_select(spec, input, dim, index):
    """index_select: READ along ``dim`` with a 1-D index, a C-contiguous result."""
    d_out = spec.dtype
    if d_out not in COPY or input._dtype is not d_out or not input._shape or _small(spec.shape):
        return None
    d = spec.dim
    n = input._shape[d]
    x = input._numpy()
    if x.flags.c_contiguous:  # np.take copies runs at memcpy speed: as fast as the loop
        return None
    out = np.empty(spec.shape, x.dtype)
    mx, mo = _mem(x), _mem(out)
    li = _line_strides(_index_array(index), len(spec.shape), d)
    if n == 0 or mx is None or li is None:
        return None
    ok = _run(_j().READ, spec.shape, d, _bits(mx[0], True), mx[1], li[0], li[1], _bits(mo[0], True), mo[1], n, False, 0)
    return from_array(out, d_out) if ok else None


def _index_add(spec, input, dim, index, source, alpha=1):
    """index_add: ADD of ``source * alpha`` along ``dim`` into an order-K copy of ``input``."""
    d_out = spec.dtype
    if d_out not in FLOAT or input._dtype is not d_out or source._dtype is not d_out or not input._shape:
        return None
    if _small(source._shape, True) or _small(input._shape, True):
        return None
    d = spec.dim
    n = input._shape[d]
    shape = source._shape
    if len(shape) != len(input._shape):
        return None
    x, s = input._numpy(), source._numpy()
    ms = _mem(s)
    li = _line_strides(_index_array(index), len(shape), d)
    if _mem(x) is None or ms is None or li is None:
        return None
    with np.errstate(all="ignore"):
        a = np.asarray(alpha).astype(x.dtype)[()]
    out = _copy_of(x)
    mo = _mem(out)
    if not _run(_j().ADD, shape, d, mo[0], mo[1], li[0], li[1], ms[0], ms[1], n, False, a):
        return None
    return from_array(out, d_out)


def _embedding(spec, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """The rows of ``weight`` at the flattened ``indices`` (READ along dim 0), C-contiguous."""
    d_out = spec.dtype
    if d_out not in COPY or weight._dtype is not d_out or _small(spec.shape):
        return None
    w = weight._numpy()
    if w.flags.c_contiguous:  # NumPy copies the rows at memcpy speed: as fast as the loop
        return None
    n, width = w.shape
    i = np.ascontiguousarray(_index_array(indices)).reshape(-1)
    out = np.empty(spec.shape, w.dtype)
    mw, mo = _mem(w), _mem(out)
    if n == 0 or mw is None:
        return None
    shape = (i.size, width)
    o_st = (width, 1)
    ok = _run(_j().READ, shape, 0, _bits(mw[0], True), mw[1], i, (1, 0), _bits(mo[0], True), o_st, n, False, 0)
    return from_array(out, d_out) if ok else None


# ---------------------------------------------------------------------------------------- advanced indexing


def _one_index(indices, nd: int):
    """``(k, tensor)`` when ``indices`` is ``None`` k times, one index tensor (a 1-D integer tensor, or a
    boolean mask of at least one dim), then nothing or ``None``s; else None."""
    if not isinstance(indices, (list, tuple)):
        return None
    tensors = [(k, t) for k, t in enumerate(indices) if t is not None]
    if len(tensors) != 1 or not isinstance(tensors[0][1], Tensor):
        return None
    k, t = tensors[0]
    if t._dtype in _INDEX:
        return (k, t) if len(t._shape) == 1 and k < nd else None
    if t._dtype is kiln.bool and t._shape and k + len(t._shape) <= nd:
        return k, t
    return None


def _mask_positions(mask: Tensor) -> np.ndarray:
    """The flat positions (C order) of a boolean mask's True entries, int64, counted in parallel."""
    j = _j()
    m = np.ascontiguousarray(mask._numpy()).reshape(-1).view(np.uint8)
    blk = 1 << 16
    nb = -(-m.size // blk)
    counts = np.empty(nb, np.int64)
    grain = max(1, _GRAIN // blk)
    parallel(j.mask_counts, (m, blk, counts), nb, grain)
    starts = np.zeros(nb, np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    pos = np.empty(int(starts[-1] + counts[-1]), np.int64)
    parallel(j.mask_positions, (m, blk, starts, pos), nb, grain)
    return pos


def _adv_operands(x: np.ndarray, k: int, t: Tensor):
    """``(x viewed with the indexed dims as one, its index as int64, wrap)``: a 1-D integer index of dim
    ``k`` (negative values count from the end), or a mask over dims ``k..`` as its True positions."""
    if t._dtype is kiln.bool:
        m = len(t._shape)
        size = math.prod(x.shape[k : k + m])
        xv = x.view()
        try:
            xv.shape = x.shape[:k] + (size,) + x.shape[k + m :]  # only without a copy: the dims must merge
        except AttributeError:
            return None
        return xv, _mask_positions(t), False
    return x, _index_array(t).reshape(-1), True


def _fancy_layout(shape: tuple, k: int, x: np.ndarray) -> np.ndarray:
    """A new array of the indexing result ``shape`` (the index's dim at ``k``) laid out as NumPy lays out
    ``x[..., index, ...]``: the index's dim outermost, the other dims in ``x``'s stride order."""
    rest = [i for i in range(x.ndim) if i != k]
    rest_order = sorted(rest, key=lambda i: -abs(x.strides[i]))
    mem = np.empty((shape[k],) + tuple(shape[i] for i in rest_order), x.dtype)
    # mem axis of each result dim: the index's dim is axis 0, dim i of x is 1 + its place in rest_order
    where = {i: 1 + rest_order.index(i) for i in rest}
    where[k] = 0
    return mem.transpose([where[i] for i in range(x.ndim)])


def _index(spec, input, indices):
    """``input[indices]`` for one 1-D integer index or one boolean mask after whole dims (READ)."""
    d_out = spec.dtype
    x = input._numpy()
    one = _one_index(indices, x.ndim)
    if one is None or d_out not in COPY or input._dtype is not d_out or _small(spec.shape):
        return None
    k, t = one
    if k == 0 and t._dtype is not kiln.bool and x.flags.c_contiguous:
        return None  # NumPy's take of whole rows runs at memcpy speed: as fast as the loop
    ops = _adv_operands(x, k, t)
    if ops is None:
        return None
    xv, i, wrap = ops
    out = _fancy_layout(spec.shape, k, xv)
    if out.shape != tuple(spec.shape):
        return None
    mx, mo, li = _mem(xv), _mem(out), _line_strides(i, xv.ndim, k)
    n = xv.shape[k]
    if n == 0 or mx is None or mo is None or li is None:
        return None
    ok = _run(_j().READ, out.shape, k, _bits(mx[0], True), mx[1], li[0], li[1], _bits(mo[0], True), mo[1], n, wrap, 0)
    return from_array(out, d_out) if ok else None


def _index_put(spec, input, indices, values, accumulate=False):
    """``index_put`` with one 1-D integer index or boolean mask: WRITE, or ADD with ``accumulate``."""
    d_out = spec.dtype
    x = input._numpy()
    one = _one_index(indices, x.ndim)
    if one is None or d_out not in (FLOAT if accumulate else COPY) or input._dtype is not d_out:
        return None
    if values._dtype is not d_out or _small(spec.index_shape, accumulate) or _small(input._shape, accumulate):
        return None
    k, t = one
    if _mem(x) is None:
        return None
    out = _copy_of(x)
    ops = _adv_operands(out, k, t)
    if ops is None:
        return None
    ov, i, wrap = ops
    shape = tuple(spec.index_shape)
    v = np.broadcast_to(values._numpy(), shape)
    mo, mv = _mem(ov), _mem(v)
    li = _line_strides(i, len(shape), k)
    n = ov.shape[k]
    if n == 0 or mv is None or li is None or len(shape) != ov.ndim:
        return None
    j = _j()
    mode = j.ADD if accumulate else j.WRITE
    one_ = d_out.numpy.type(1) if accumulate else np.int32(1)
    data, plain = _bits(mo[0], not accumulate), _bits(mv[0], not accumulate)
    if not _run(mode, shape, k, data, mo[1], li[0], li[1], plain, mv[1], n, wrap, one_):
        return None
    return from_array(out, d_out)


def kernels() -> dict[str, tuple]:
    """The index kernels: op name -> (kernel, output dtypes served)."""
    return {
        "gather": (with_fallback("gather", _gather), COPY),
        "scatter": (with_fallback("scatter", _scatter_body(False)), COPY),
        "scatter_add": (with_fallback("scatter_add", _scatter_body(True)), FLOAT),
        "index_select": (with_fallback("index_select", _index_select), COPY),
        "index_add": (with_fallback("index_add", _index_add), FLOAT),
        "_embedding": (with_fallback("_embedding", _embedding), COPY),
        "_index": (with_fallback("_index", _index), COPY),
        "index_put": (with_fallback("index_put", _index_put), COPY),
    }
