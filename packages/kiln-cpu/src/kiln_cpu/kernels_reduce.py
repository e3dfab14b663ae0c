"""The reduction kernels (sum, mean, amax, amin, _max_all, _min_all) over the loops of
:mod:`kiln_cpu._jit_reduce`, summing in NumPy's pairwise order."""

from __future__ import annotations

import functools
import math

import numpy as np

from kiln import Tensor
from kiln.backend import from_array, reference_kernel
from kiln_cpu import _opcodes, config
from kiln_cpu._kernel_support import _GRAIN, FLOAT, loops, numpy_order, parallel

_kernels = loops("_jit_reduce")


def _merge(dims: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(size, stride) pairs, outermost first: size-1 dims dropped, contiguous neighbours merged."""
    out: list[tuple[int, int]] = []
    for n, s in dims:
        if n == 1:
            continue
        if out and out[-1][1] == s * n:
            out[-1] = (out[-1][0] * n, s)
        else:
            out.append((n, s))
    return out


def _subtrees(lo: int, n: int, depth: int, acc: list) -> None:
    """The (start, length) of NumPy's pairwise-summation subtrees ``depth`` levels down, in order."""
    if depth == 0 or n <= 1024:
        acc.append((lo, n))
        return
    n2 = n // 2
    n2 -= n2 % 8
    _subtrees(lo, n2, depth - 1, acc)
    _subtrees(lo + n2, n - n2, depth - 1, acc)


def _combine(vals: list, n: int, depth: int, join):
    """Fold subtree results in NumPy's tree order (consumes ``vals`` from the front)."""
    if depth == 0 or n <= 1024:
        return vals.pop(0)
    n2 = n // 2
    n2 -= n2 % 8
    left = _combine(vals, n2, depth - 1, join)
    return join(left, _combine(vals, n - n2, depth - 1, join))


_INT_VIEW = {np.dtype(np.float32): np.int32, np.dtype(np.float64): np.int64}
_TREE_DEPTH = 4  # 16 subtrees: enough tasks to balance the threads


@functools.lru_cache(maxsize=64)
def _subtree_plan(n: int, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """The starts and lengths of :func:`_subtrees` of ``n`` elements, ``depth`` levels down, built once
    for every reduction of that many (shared: the kernels only read them; flagging them read-only would
    compile each kernel again for read-only arrays)."""
    segs: list = []
    _subtrees(0, n, depth, segs)
    los = np.array([s[0] for s in segs], np.int64)
    ns = np.array([s[1] for s in segs], np.int64)
    return los, ns


def _reduce_all(j, code: int, a: np.ndarray, off: int = 0, n: int | None = None, st: int = 1):
    """Reduce ``a[off + i*st]``, i < n (all of the 1-d ``a`` by default), to a NumPy scalar: NumPy's one
    pairwise tree over the run, its subtrees in parallel."""
    n = a.shape[0] if n is None else n
    los, ns = _subtree_plan(n, _TREE_DEPTH)
    part = np.empty(len(los), a.dtype)
    grain = max(1, len(los) * _GRAIN // max(n, 1))
    if code != _opcodes.SUM and st == 1:  # max/min of a dense run: the vectorised folds of the integer view
        ints, part_ints = a[off : off + n].view(_INT_VIEW[a.dtype]), part.view(_INT_VIEW[a.dtype])
        parallel(j.reduce(code, "segments-contiguous"), (ints, los, ns, part_ints), len(los), grain)
    else:
        parallel(j.reduce(code, "segments"), (a, off, st, los, ns, part), len(los), grain)
    join = {_opcodes.SUM: np.add, _opcodes.AMAX: np.maximum, _opcodes.AMIN: np.minimum}[code]
    vals = list(part)
    res = _combine(vals, n, _TREE_DEPTH, join)
    return np.add(a.dtype.type(0), res) if code == _opcodes.SUM else res


def _run_reduce(code: int, t: Tensor, dims: tuple, keepdim: bool) -> np.ndarray:
    """Reduce ``t`` over ``dims`` into a new array laid out as NumPy lays out the result (the kept dims
    in the input's stride order)."""
    j = _kernels()
    buf, off, shape, strides = t._storage, t._offset, t._shape, t._stride
    keep_idx = [i for i in range(len(shape)) if i not in dims]
    keep_idx = [keep_idx[i] for i in numpy_order([shape[i] for i in keep_idx], [[strides[i] for i in keep_idx]])]
    red_idx = sorted(dims, key=lambda i: -abs(strides[i]))
    kept = _merge([(shape[i], strides[i]) for i in keep_idx])
    red = _merge([(shape[i], strides[i]) for i in red_idx])
    flat_out = np.empty(math.prod(shape[i] for i in keep_idx), buf.dtype)
    # the result: the kept dims back in their places (a view), reduced dims as size 1 for keepdim
    out = flat_out.reshape([shape[i] for i in keep_idx]).transpose(np.argsort(keep_idx))
    if keepdim:
        out = np.expand_dims(out, tuple(dims))
    if not kept:
        if len(red) <= 1:  # one run, dense or strided (x[:, ::2] of a contiguous x), or one element
            flat_out[0] = _reduce_all(j, code, buf, off, t.numel(), red[0][1] if red else 1)
            return out
        if len(red) == 2:  # a sliced matrix: its rows, then the row results
            (n0, s0), (n1, s1) = red
            flat = np.empty(n0, buf.dtype)
            parallel(j.reduce(code, "rows"), (buf, off, s0, n1, s1, flat), n0, max(1, _GRAIN // n1))
        else:
            flat = np.ascontiguousarray(t._numpy()).reshape(-1)
        flat_out[0] = _reduce_all(j, code, flat)
        return out
    if len(kept) == 1 and len(red) == 1:
        (nk, sk), (nr, sr) = kept[0], red[0]
        if sk == 1 and sr != 1:
            parallel(j.reduce(code, "cols"), (buf, off, nr, sr, flat_out), nk, max(1024, _GRAIN // nr))
        elif sr == 1 and code != _opcodes.SUM:
            ints, out_ints = buf.view(_INT_VIEW[buf.dtype]), flat_out.view(_INT_VIEW[buf.dtype])
            kernel = j.reduce(code, "rows-contiguous")
            parallel(kernel, (ints, off, sk, nr, out_ints), nk, max(1, _GRAIN // nr))
        else:
            parallel(j.reduce(code, "rows"), (buf, off, sk, nr, sr, flat_out), nk, max(1, _GRAIN // nr))
        return out
    if len(kept) == 1 and len(red) == 2:  # e.g. a conv bias's gradient, over (N, H, W): in place, no copy
        (nk, sk), (n0, s0), (n1, s1) = kept[0], red[0], red[1]
        args = (buf, off, sk, n0, s0, n1, s1, flat_out)
        parallel(j.reduce(code, "slabs"), args, nk, max(1, _GRAIN // (n0 * n1)))
        return out
    # several kept or reduced dims that do not merge: one copy with the reduced dims last
    xx = np.ascontiguousarray(t._numpy().transpose(keep_idx + red_idx)).reshape(-1)
    nk = flat_out.size
    nr = xx.size // nk
    parallel(j.reduce(code, "rows"), (xx, 0, nr, nr, 1, flat_out), nk, max(1, _GRAIN // nr))
    return out


def _reduce_kernel(name: str, code: int, *, mean: bool = False):
    """A kernel for reduction ``name`` over ``spec.dims``, float32/float64 input of the output dtype."""
    reference = reference_kernel(name)

    def kernel(spec, a, *rest):
        d = spec.dtype
        if d not in FLOAT or a._dtype is not d or not a._shape:
            return reference(spec, a, *rest)
        n = math.prod(a._shape)
        if n < max(config.min_numel, 1):
            return reference(spec, a, *rest)
        dims = tuple(spec.dims)
        out = _run_reduce(code, a, dims, len(spec.shape) == len(a._shape) and bool(dims))
        if mean:
            count = math.prod(a._shape[i] for i in dims)
            np.true_divide(out, count, out=out)
        return from_array(out, d)

    kernel.__name__ = f"kiln_cpu_{name}"
    kernel.__doc__ = f"Numba kernel for {name} (kiln-cpu)."
    return kernel


def kernels() -> dict[str, tuple]:
    """The reduction kernels: op name -> (kernel, output dtypes served)."""
    table: dict[str, tuple] = {}
    for name, code in _opcodes.REDUCTIONS.items():
        table[name] = (_reduce_kernel(name, code), FLOAT)
    table["mean"] = (_reduce_kernel("mean", _opcodes.SUM, mean=True), FLOAT)
    return table
