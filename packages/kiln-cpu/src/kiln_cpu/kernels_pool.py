"""kiln-cpu's pooling kernels: ``_max_pool`` (1-d to 3-d, values and argmax indices), ``_adaptive_max_pool``,
and ``_separable`` / ``_separable_backward`` (average and adaptive average pooling, interpolation and
reflect/replicate/circular padding all run through these two: one generic loop applies the taps the core's
meta function computed). One input plane per task, planes split over the thread pool, loops in Numba
(:mod:`kiln_cpu._jit_pool`); 2-d max pooling by 2x2 windows with stride 2 (the CNN case) has its own
branch-free loop, 3.6x faster than PyTorch's on 64x16x28x28. The max pools' backward, ``_argmax_scatter``,
zeroes each plane and adds its gradients at their argmax in one pass (64x16x28x28: 0.45 ms, where zeros
and ``scatter_add`` took 1.15 ms).

Forward results are bit for bit the reference's (same products and sums in the same order; the same
argmax on ties and NaN). ``_separable_backward`` reproduces the reference's dense matrix product by
OpenBLAS (fused multiply-adds over the outputs in increasing order, NaN wherever the dense product has
``0 * inf``): bit for bit while a dim has at most a few hundred outputs (one gemm block), within an ulp
or two beyond.

Handed back to the reference: tiny calls (below :data:`kiln_cpu.config.chain_min_numel` elements
or :data:`kiln_cpu.config.min_numel`, whichever is smaller), empty tensors, dtypes other than float32/float64
(or an input of another dtype). float16 and bfloat16 run the float32 loops, as the reference computes them
(:func:`kiln_cpu._kernel_support.through_float32`: widened exactly, rounded once; bit for bit).
"""

from __future__ import annotations

import math

import numpy as np

from kiln.backend import adaptive_pool_bounds as _adaptive_bounds
from kiln.backend import from_array
from kiln.backend import pool_window_positions as _window_positions
from kiln_cpu import config
from kiln_cpu._kernel_support import _GRAIN, FLOAT, HALF, loops, parallel, through_float32, with_fallback

_j = loops("_jit_pool")


def _planes(t, d, out_shape) -> np.ndarray | None:
    """The flat C-contiguous values of input ``t`` when the call is served (dtype ``d``, float, large enough
    and not empty), else None."""
    if d not in FLOAT or t._dtype is not d:
        return None
    n, n_in = math.prod(out_shape), math.prod(t._shape)
    if n_in == 0 or config.too_small(n and max(n, n_in), chain=True):  # the work grows with either
        return None
    return np.ascontiguousarray(t._numpy()).reshape(-1)


# ---------------------------------------------------------------------------------------- max pooling

_ONE = np.ones(1, np.int64)
_ZERO = np.zeros(1, np.int64)
_WINDOWS: dict[tuple, tuple] = {}


def _windows(key: tuple, make) -> tuple:
    """Per-dim window arrays, cached by their parameters."""
    hit = _WINDOWS.get(key)
    if hit is None:
        if len(_WINDOWS) > 1024:
            _WINDOWS.clear()
        hit = _WINDOWS[key] = make()
    return hit


def _pool_windows(sizes, outs, k, s, p, d) -> tuple:
    """(base, first valid offset, end of the valid offsets) per dim, and the steps, padded to 3 dims."""

    def make():
        """The arrays (computed once per parameters)."""
        dims = []
        for n, o, kk, ss, pp, dd in zip(sizes, outs, k, s, p, d):
            pos, ok = _window_positions(o, kk, ss, pp, dd, n)
            first = ok.argmax(1).astype(np.int64)
            dims.append((pos[:, 0].astype(np.int64), first, first + ok.sum(1).astype(np.int64)))
        pad = [(_ZERO, _ZERO, _ONE)] * (3 - len(dims))
        return pad + dims, (1,) * (3 - len(d)) + tuple(d)

    return _windows(("pool", tuple(sizes), tuple(outs), k, s, p, d), make)


def _adaptive_windows(sizes, outs) -> tuple:
    """The adaptive windows ``[floor(i*n/o), ceil((i+1)*n/o))`` per dim, as :func:`_pool_windows`."""

    def make():
        """The arrays (computed once per parameters)."""
        dims = []
        for n, o in zip(sizes, outs):
            start, end = _adaptive_bounds(n, o)
            dims.append((start.astype(np.int64), np.zeros(o, np.int64), (end - start).astype(np.int64)))
        pad = [(_ZERO, _ZERO, _ONE)] * (3 - len(dims))
        return pad + dims, (1, 1, 1)

    return _windows(("adaptive", tuple(sizes), tuple(outs)), make)


def _run_max(spec, input, nd: int, windows) -> tuple | None:
    """(values, indices) of a max pool over the trailing ``nd`` dims, windows from ``windows(sizes, outs)``."""
    (vshape, d), (ishape, idt) = (spec[0].shape, spec[0].dtype), (spec[1].shape, spec[1].dtype)
    x = _planes(input, d, vshape)
    if x is None:
        return None
    sizes = input._shape[-nd:]
    dims, steps = windows(sizes, vshape[-nd:])
    plane = math.prod(sizes)
    planes = x.size // plane
    val = np.empty(math.prod(vshape), x.dtype)
    ind = np.empty(val.size, np.int64)
    dims3 = (1,) * (3 - nd) + tuple(sizes)
    (bd, kd0, kd1), (bh, kh0, kh1), (bw, kw0, kw1) = dims
    args = (x, dims3, bd, kd0, kd1, bh, kh0, kh1, bw, kw0, kw1, steps, x.dtype.type(0), val, ind)
    parallel(_j().max_pool, args, planes, max(1, _GRAIN // (8 * plane)))  # about 3 ns an element
    return from_array(val.reshape(vshape), d), from_array(ind.reshape(ishape), idt)


def _max_pool_2x2(spec, input) -> tuple | None:
    """(values, indices) of a 2-d max pool by 2x2 windows with stride 2 (no padding, dilation or partial
    window): the specialised loop."""
    (vshape, d), (ishape, idt) = (spec[0].shape, spec[0].dtype), (spec[1].shape, spec[1].dtype)
    x = _planes(input, d, vshape)
    if x is None:
        return None
    h, w = input._shape[-2:]
    oh, ow = vshape[-2:]
    planes = x.size // (h * w)
    val = np.empty(math.prod(vshape), x.dtype)
    ind = np.empty(val.size, np.int64)
    parallel(_j().max_pool_2x2, (x, h, w, oh, ow, val, ind), planes, max(1, _GRAIN // (4 * h * w)))
    return from_array(val.reshape(vshape), d), from_array(ind.reshape(ishape), idt)


def _argmax_scatter(spec, src, indices, plane):
    """The max pools' backward: per row, zeros with each gradient added at its argmax, in one pass."""
    shape, d = spec.shape, spec.dtype
    if d not in FLOAT or src._dtype is not d or config.too_small(math.prod(shape), chain=True):
        return None
    g = np.ascontiguousarray(src._numpy()).reshape(-1)
    ind = np.ascontiguousarray(indices._numpy()).reshape(-1)
    if ind.dtype != np.int64:
        return None
    rows = math.prod(shape[:-1])
    out = np.empty(math.prod(shape), g.dtype)
    bad = np.zeros(1, np.int64)
    outs = g.size // rows
    parallel(_j().argmax_scatter, (g, ind, outs, plane, out, bad), rows, max(1, _GRAIN // (plane + outs)))
    return None if bad[0] else from_array(out.reshape(shape), d)


def _max_pool(spec, input, kernel_size, stride, padding, dilation, ceil_mode):
    """Max pooling with padding, dilation and ceil mode (1-d to 3-d)."""
    nd = len(kernel_size)
    if (
        tuple(kernel_size) == tuple(stride) == (2, 2)
        and tuple(padding) == (0, 0)
        and tuple(dilation) == (1, 1)
        and tuple(spec[0].shape[-2:]) == (input._shape[-2] // 2, input._shape[-1] // 2)
    ):
        return _max_pool_2x2(spec, input)
    return _run_max(
        spec, input, nd, lambda sizes, outs: _pool_windows(sizes, outs, kernel_size, stride, padding, dilation)
    )


def _adaptive_max_pool(spec, input, output_size):
    """Adaptive max pooling (1-d, 2-d)."""
    return _run_max(spec, input, len(output_size), _adaptive_windows)


# ---------------------------------------------------------------------------------------- separable maps

_NO_TAPS = (np.zeros((1, 1), np.int64),)


def _separable(spec, input, kind, params):
    """A ``_separable`` map: the meta function's taps applied per dim, one plane per task."""
    shape, d, taps = spec.shape, spec.dtype, spec.taps
    x = _planes(input, d, shape)
    if x is None:
        return None
    nd = len(taps)
    np_dtype = x.dtype
    sizes = input._shape[-nd:]
    outs = shape[-nd:]
    args = []
    for idx, w in taps:  # tap-major: the last dim's loop runs over the outputs
        args += [np.ascontiguousarray(idx.T, np.int64), np.ascontiguousarray(w.T, np_dtype)]
    for _ in range(3 - nd):
        args += [_NO_TAPS[0], np.zeros((1, 1), np_dtype)]
    plane = math.prod(sizes)
    out = np.empty(math.prod(shape), np_dtype)
    pad = (1,) * (3 - nd)
    sizes3, outs3 = tuple(sizes) + pad, tuple(outs) + pad
    parallel(
        _j().separable,
        (x, sizes3, outs3, nd, *args, np_dtype.type(0), out),
        x.size // plane,
        max(1, _GRAIN // max(plane, math.prod(outs))),
    )
    return from_array(out.reshape(shape), d)


_TRANSPOSED: dict[tuple, tuple] = {}


def _transposed_taps(taps, sizes, np_dtype) -> list:
    """Per dim ``(rows, vals, dense)``: the reference's dense tap matrix ``W`` (``o x n``, the weights of one
    (output, input) pair summed as it sums them) and, for each input position ``s``, the outputs ``o``
    with ``W[o, s] != 0`` in increasing order and their weights (``q x n``, padded with weight zero)."""
    key = (id(taps), np_dtype)
    hit = _TRANSPOSED.get(key)
    if hit is not None and hit[0] is taps:  # the taps object is held: its id is not reused
        return hit[1]
    out = []
    for (idx, w), n in zip(taps, sizes):
        o = idx.shape[0]
        dense = np.zeros((o, n + 1), np_dtype)
        rows = np.broadcast_to(np.arange(o)[:, None], idx.shape)
        np.add.at(dense, (rows, idx), w.astype(np_dtype))
        dense = np.ascontiguousarray(dense[:, :n])
        cols, rr = np.nonzero(dense.T)  # by input position, then output
        count = np.bincount(cols, minlength=n)
        q = max(int(count.max()) if n else 0, 1)
        start = np.zeros(n, np.int64)
        np.cumsum(count[:-1], out=start[1:])
        slot = np.arange(cols.size) - start[cols]
        ell_rows = np.zeros((q, n), np.int64)
        ell_vals = np.zeros((q, n), np_dtype)
        ell_rows[slot, cols] = rr
        ell_vals[slot, cols] = dense[rr, cols]
        out.append((ell_rows, ell_vals, dense))
    if len(_TRANSPOSED) > 256:
        _TRANSPOSED.clear()
    _TRANSPOSED[key] = (taps, out)
    return out


def _separable_backward(spec, grad, input_size, kind, params):
    """The transposed taps of a ``_separable`` map, as the reference's dense product computes them."""
    shape, d, taps = spec.shape, spec.dtype, spec.taps
    g = _planes(grad, d, shape)
    if g is None:
        return None
    nd = len(taps)
    np_dtype = g.dtype
    sizes = tuple(shape[-nd:])
    outs = tuple(grad._shape[-nd:])
    t = _transposed_taps(taps, sizes, np_dtype)
    none = (np.zeros((1, 1), np.int64), np.zeros((1, 1), np_dtype), np.zeros((1, 1), np_dtype))
    t = t + [none] * (3 - nd)
    pad = (1,) * (3 - nd)
    plane = math.prod(sizes)
    out = np.empty(math.prod(shape), np_dtype)
    parallel(
        _j().separable_backward,
        (g, outs + pad, sizes + pad, nd, t[0], t[1], t[2], np_dtype.type(0), out),
        out.size // plane,
        max(1, _GRAIN // max(plane, math.prod(outs))),
    )
    return from_array(out.reshape(shape), d)


def kernels() -> dict[str, tuple]:
    """The pooling kernels: op name -> (kernel, output dtypes served)."""
    bodies = {
        "_max_pool": _max_pool,
        "_adaptive_max_pool": _adaptive_max_pool,
        "_argmax_scatter": _argmax_scatter,
        "_separable": _separable,
        "_separable_backward": _separable_backward,
    }
    return {name: (through_float32(name, with_fallback(name, body)), FLOAT + HALF) for name, body in bodies.items()}
