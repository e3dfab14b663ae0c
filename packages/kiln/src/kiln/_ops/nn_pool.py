"""nn primitives: pooling, interpolation and padding (``torch.nn.functional`` names and semantics).

Three kinds of kernels do all the work:

* ``_max_pool`` / ``_adaptive_max_pool``: window maxima and the flat index of each maximum in its
  input plane (PyTorch's ``indices``). Their backward adds the gradient at those positions into zeros
  (``_argmax_scatter``, a ``scatter_add`` into fresh zeros in one op), whose own backward is a
  ``gather``, so higher-order gradients work.
* ``_separable``: every *linear* resampling that acts on each spatial dim independently (average
  pooling, adaptive average pooling, nearest / linear interpolation, reflect / replicate / circular
  padding). Per spatial dim it is a list of taps ``out[i] = sum_k w[i, k] * x[idx[i, k]]`` computed
  once per shape by the meta function; ``idx == len(dim)`` names an implicit zero (padding).
  ``_separable_backward`` applies the transposed taps, and the two ops are each other's backward.
* ``constant_pad_nd``: constant padding (negative padding crops); its backward is itself with the
  padding negated.

Pixel (un)shuffle are reshape/permute compositions.
"""

from __future__ import annotations

import itertools
import math
import numbers

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops._meta import scalar_type_name
from kiln._ops.elementwise import _compute_np
from kiln._tensor import Tensor, _numel

__all__ = [
    "adaptive_avg_pool1d",
    "adaptive_avg_pool2d",
    "adaptive_max_pool1d",
    "adaptive_max_pool1d_with_indices",
    "adaptive_max_pool2d",
    "adaptive_max_pool2d_with_indices",
    "avg_pool1d",
    "avg_pool2d",
    "interpolate",
    "max_pool1d",
    "max_pool1d_with_indices",
    "max_pool2d",
    "max_pool2d_with_indices",
    "max_pool3d",
    "max_pool3d_with_indices",
    "pad",
    "pixel_shuffle",
    "pixel_unshuffle",
]

_POSITION = {"kernel_size": 2, "stride": 3, "padding": 4, "dilation": 5, "output_size": 2, "pad": 2}
_ORDINAL = {1: "one int", 2: "two ints", 3: "three ints"}


def _not_implemented(kernel: str, dtype: dt.dtype):
    return NotImplementedError(f"\"{kernel}\" not implemented for '{scalar_type_name(dtype)}'")


def _shape_list(shape) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _check_int_list(fn: str, what: str, value) -> None:
    """PyTorch's argument-parser errors for an ``int[]`` argument holding something else."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, tuple, list)):
        raise TypeError(
            f"{fn}(): argument '{what}' (position {_POSITION[what]}) must be tuple of ints, not {type(value).__name__}"
        )
    if isinstance(value, numbers.Integral):
        return
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            if i == 0:
                raise TypeError(
                    f"{fn}(): argument '{what}' (position {_POSITION[what]}) must be tuple of ints, but found "
                    f"element of type {type(v).__name__} at pos 0"
                )
            raise TypeError(
                f"{fn}(): argument '{what}' failed to unpack the object at pos {i + 1} with error "
                f'"type must be tuple of ints,but got {type(v).__name__}"'
            )


def _ints(value, n: int, what: str, fn: str, *, message: str | None = None) -> tuple[int, ...]:
    """An int or a sequence of ``n`` ints (or of one, repeated) as an ``n``-tuple."""
    _check_int_list(fn, what, value)
    if isinstance(value, numbers.Integral):
        return (int(value),) * n
    if len(value) == 1:
        return (int(value[0]),) * n
    if len(value) != n:
        raise RuntimeError(message or f"{fn}() argument '{what}' should contain {_ORDINAL[n]} (got {len(value)})")
    return tuple(int(v) for v in value)


def _pool_out(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """PyTorch's pooling output length (a window must start inside the input or its left padding)."""
    span = size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)
    out = span // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


# ---------------------------------------------------------------------------------------- validation


def _check_pool_args(k: tuple, s: tuple, p: tuple, d: tuple) -> None:
    """The checks PyTorch's 2-d/3-d pooling entry points share (and 1-d pooling reaches via 2-d)."""
    nd = len(k)
    if not 1 <= nd <= 3 or not len(s) == len(p) == len(d) == nd:
        raise ValueError(f"kernel_size, stride, padding and dilation must be 1 to 3 ints each, got {k}, {s}, {p}, {d}")
    if any(v == 0 for v in s):
        raise RuntimeError("stride should not be zero")
    if any(v <= 0 for v in k):
        if nd == 3:
            raise RuntimeError(f"kernel size should be greater than zero, but got kT: {k[0]} kH: {k[1]} kW: {k[2]}")
        kh, kw = (1, k[0]) if nd == 1 else k
        raise RuntimeError(f"kernel size should be greater than zero, but got kH: {kh} kW: {kw}")
    if any(v < 0 for v in s):
        if nd == 3:
            raise RuntimeError(f"stride should be greater than zero, but got dT: {s[0]} dH: {s[1]} dW: {s[2]}")
        sh, sw = (1, s[0]) if nd == 1 else s
        raise RuntimeError(f"stride should be greater than zero, but got dH: {sh} dW: {sw}")
    for v in p:
        if v < 0:
            raise RuntimeError(f"pad must be non-negative, but got pad: {v}")
    for kk, pp, dd in zip(k, p, d):
        if pp > ((kk - 1) * dd + 1) // 2:
            raise RuntimeError(
                f"pad should be at most half of effective kernel size, but got pad={pp}, kernel_size={kk} and "
                f"dilation={dd}"
            )
    if any(v <= 0 for v in d):
        if nd == 3:
            raise RuntimeError(
                f"dilation should be greater than zero, but got dilationT: {d[0]} dilationH: {d[1]} dilationW: {d[2]}"
            )
        dh, dw = (1, d[0]) if nd == 1 else d
        raise RuntimeError(f"dilation should be greater than zero, but got dilationH: {dh} dilationW: {dw}")
    if any(pp > kk // 2 for kk, pp in zip(k, p)):
        if nd == 3:
            raise RuntimeError(
                "pad should be smaller than or equal to half of kernel size, but got "
                f"kT: {k[0]} kW: {k[2]} kH: {k[1]} padT: {p[0]} padW: {p[2]} padH: {p[1]}"
            )
        raise RuntimeError(
            "pad should be smaller than or equal to half of kernel size, but got "
            f"padW = {p[-1]}, padH = {p[0] if nd == 2 else 0}, kW = {k[-1]}, kH = {k[0] if nd == 2 else 1}"
        )


def _check_pool_input(name: str, shape: tuple, nd: int) -> None:
    """Rank and empty-dim checks of a pooling input ``(N, C, *spatial)`` or ``(C, *spatial)``."""
    n = len(shape)
    if nd == 1:
        if n not in (2, 3):
            raise RuntimeError(
                f"Expected 2 to 3 dimensions, but got {n}-dimensional tensor for argument #1 'self' "
                f"(while checking arguments for {name})"
            )
        if any(v == 0 for v in shape[-2:]):
            shape2 = shape[:-1] + (1, shape[-1])
            raise RuntimeError(
                "Expected 3D or 4D (batch mode) tensor with optional 0 dim batch size for input, but got:"
                + _shape_list(shape2)
            )
        return
    if nd == 2:
        if n not in (3, 4):
            if n < 3 and name.startswith("avg"):
                raise IndexError(
                    f"Dimension out of range (expected to be in range of [{-max(n, 1)}, {max(n, 1) - 1}], but got -3)"
                )
            if not name.startswith("avg"):
                raise RuntimeError("non-empty 3D or 4D (batch mode) tensor expected for input")
        if n not in (3, 4) or any(v == 0 for v in shape[-3:]):
            raise RuntimeError(
                "Expected 3D or 4D (batch mode) tensor with optional 0 dim batch size for input, but got:"
                + _shape_list(shape)
            )
        return
    if n not in (4, 5):
        raise RuntimeError("non-empty 4D or 5D (batch mode) tensor expected for input")
    for i, v in enumerate(shape[-4:]):
        if v == 0:
            raise RuntimeError(
                "max_pool3d_with_indices_out_cpu_template(): Expected input's non-batch dimensions to have "
                f"positive length, but input has a shape of {_shape_list(shape)} and non-batch dimension {i} "
                "has length zero!"
            )


def _check_out_size(shape: tuple, nd: int, out: tuple) -> None:
    if any(o <= 0 for o in out):
        lead = shape[-nd - 1]
        ins = (1,) + shape[-1:] if nd == 1 else shape[-nd:]
        outs = (1,) + out if nd == 1 else out
        fmt = "x".join
        raise RuntimeError(
            f"Given input size: ({fmt(str(v) for v in (lead, *ins))}). Calculated output size: "
            f"({fmt(str(v) for v in (lead, *outs))}). Output size is too small"
        )


def _check_float(kernel: str, d: dt.dtype) -> None:
    if not d.is_floating_point:
        raise _not_implemented(kernel, d)


# ---------------------------------------------------------------------------------------- max pooling


def _max_pool_meta(input, kernel_size, stride, padding, dilation, ceil_mode):
    nd = len(kernel_size)
    name = f"max_pool{nd}d"
    _check_pool_input(name, input._shape, nd)
    if input._dtype is dt.bool:
        raise _not_implemented("max_pool2d" if nd < 3 else "max_pool3d", input._dtype)
    _check_pool_args(kernel_size, stride, padding, dilation)
    sp = input._shape[-nd:]
    out = tuple(
        _pool_out(n, k, s, p, d, ceil_mode) for n, k, s, p, d in zip(sp, kernel_size, stride, padding, dilation)
    )
    _check_out_size(input._shape, nd, out)
    shape = input._shape[:-nd] + out
    return (shape, input._dtype, input._device), (shape, dt.int64, input._device)


def _window_positions(out: int, k: int, s: int, p: int, d: int, size: int):
    """Input positions (out, k) of each window element along one dim and whether each is inside."""
    pos = np.arange(out)[:, None] * s - p + np.arange(k)[None, :] * d
    return pos, (pos >= 0) & (pos < size)


def _argmax_windows(x: np.ndarray, nd: int, positions: list, out_shape: tuple, window=None):
    """Running max over window offsets with PyTorch's tie and NaN rules: the first maximum wins, NaN
    always replaces (so the last NaN wins); a window of only -inf points at its first valid element.

    ``positions``: per dim, the input position of each (output, offset) pair and whether it is inside.
    ``window(offsets)``: the values at one offset (default: gathered from ``positions``)."""
    sp = x.shape[-nd:]
    lead = x.shape[:-nd]
    strides = [int(np.prod(sp[i + 1 :], dtype=np.int64)) for i in range(nd)]
    best = np.zeros(lead + out_shape, x.dtype)
    idx = np.full(lead + out_shape, -1, np.int64)
    is_float = x.dtype.kind == "f"
    ks = [pv[0].shape[1] for pv in positions]
    for offs in itertools.product(*[range(k) for k in ks]):
        key: list = []
        flat = np.zeros(out_shape, np.int64)
        valid = np.ones(out_shape, bool)
        for i, o in enumerate(offs):
            pos, ok = positions[i]
            shape_i = [1] * nd
            shape_i[i] = -1
            p_i = pos[:, o]
            key.append(np.clip(p_i, 0, max(sp[i] - 1, 0)))
            flat = flat + (p_i * strides[i]).reshape(shape_i)
            valid = valid & ok[:, o].reshape(shape_i)
        if not valid.any():
            continue
        if window is not None:
            v = window(offs)
        else:
            v = x
            for i, k in enumerate(key):
                v = np.take(v, k, axis=len(lead) + i)
        upd = valid & ((v > best) | (idx < 0))
        if is_float:
            upd |= valid & np.isnan(v)
        best = np.where(upd, v, best)
        idx = np.where(upd, flat, idx)
    return best, idx


def _max_pool_ref(spec, a, kernel_size, stride, padding, dilation, ceil_mode):
    nd = len(kernel_size)
    out_shape = spec[0][0][-nd:]
    compute = _compute_np(spec[0][1])
    x = a.astype(compute, copy=False)
    sp = a.shape[-nd:]
    geom = list(zip(out_shape, kernel_size, stride, padding, dilation, sp))
    positions = [_window_positions(o, k, s, p, d, n) for o, k, s, p, d, n in geom]
    # pad so that every window element is in bounds: each offset is then a strided view
    right = [max(0, (o - 1) * s - p + (k - 1) * d - (n - 1)) for o, k, s, p, d, n in geom]
    xp = np.pad(x, [(0, 0)] * (x.ndim - nd) + [(p, r) for (_, _, _, p, _, _), r in zip(geom, right)])

    def window(offs):
        key = tuple(slice(off * d, off * d + (o - 1) * s + 1, s) for off, (o, _, s, _, d, _) in zip(offs, geom))
        return xp[(Ellipsis, *key)]

    return _argmax_windows(x, nd, positions, out_shape, window)


def _argmax_scatter_meta(src, indices, plane):
    return (src._shape[:-1] + (plane,), src._dtype, src._device)


def _argmax_scatter_ref(spec, g, i, plane):
    out = np.zeros((_numel(g.shape[:-1]), plane), _compute_np(spec[1]))
    shape = (out.shape[0], g.shape[-1])
    np.add.at(out, (np.arange(shape[0])[:, None], i.reshape(shape)), g.reshape(shape))
    return out.reshape(spec[0])


def _argmax_scatter_backward(grad, indices):
    from kiln._ops.indexing import gather

    return gather(grad, -1, indices), None


@op(meta=_argmax_scatter_meta, reference=_argmax_scatter_ref, backward=_argmax_scatter_backward)
def _argmax_scatter(src: Tensor, indices: Tensor, plane: int) -> Tensor:
    """The gradient of a max pool over planes of ``plane`` elements: zeros of shape ``src``'s leading dims
    x ``plane``, with each ``src[..., o]`` added at ``indices[..., o]`` in order of ``o`` (one op:
    ``zeros(...).scatter_add(-1, indices, src)`` without the zeros' copy; its backward is the gather)."""


def _scatter_to_argmax(grad: Tensor, input_shape: tuple, indices: Tensor, nd: int) -> Tensor:
    """The gradient of a max pool: ``grad`` added at each window's argmax (flat index in its plane)."""
    lead = tuple(input_shape[:-nd])
    outs = _numel(grad._shape[len(lead) :])
    g = grad.reshape(lead + (outs,))
    i = indices.reshape(lead + (outs,))
    return _argmax_scatter(g, i, _numel(input_shape[-nd:])).reshape(input_shape)


def _max_pool_backward(grads, input_shape, kernel_size, result):
    return _scatter_to_argmax(grads[0], input_shape, result[1], len(kernel_size))


@op(
    meta=_max_pool_meta,
    reference=_max_pool_ref,
    backward=_max_pool_backward,
    num_outputs=2,
    differentiable_outputs=(0,),
    grad_fn_name=lambda args: "MaxPool3DWithIndicesBackward0" if len(args[1]) == 3 else "MaxPool2DWithIndicesBackward0",
)
def _max_pool(
    input: Tensor,
    kernel_size: tuple[int, ...],
    stride: tuple[int, ...],
    padding: tuple[int, ...],
    dilation: tuple[int, ...],
    ceil_mode: bool,
) -> tuple[Tensor, Tensor]:
    """Max pooling over the last ``len(kernel_size)`` dims: ``(values, flat argmax index per plane)``."""


def _max_pool_args(nd, fn, kernel_size, stride, padding, dilation, indices_path: bool):
    words = {1: "one int", 2: "two ints", 3: "three ints"}[nd]
    if nd == 1:
        if indices_path:
            k = _ints(kernel_size, 1, "kernel_size", fn)
            s = _ints(stride, 1, "stride", fn) if stride not in (None, [], ()) else k
            return k, s, _ints(padding, 1, "padding", fn), _ints(dilation, 1, "dilation", fn)
        msg = f"{fn}() {{}} must be an int, list of ints or tuple of ints of size 1 but got size {{}}"

        def one(v, what):
            n = 1 if isinstance(v, numbers.Integral) else len(v)
            if n != 1:
                raise RuntimeError(msg.format(what, n))
            return _ints(v, 1, what, fn)

        k = one(kernel_size, "kernel_size")
        s = one(stride, "stride") if stride not in (None, [], ()) else k
        return k, s, one(padding, "padding"), one(dilation, "dilation")
    k = _ints(
        kernel_size,
        nd,
        "kernel_size",
        fn,
        message=f"{fn}: kernel_size must either be a single int, or a tuple of {words}",
    )
    if stride is None or (isinstance(stride, (list, tuple)) and len(stride) == 0):
        s = k
    else:
        s = _ints(
            stride,
            nd,
            "stride",
            fn,
            message=f"{fn}: stride must either be omitted, a single int, or a tuple of {words}",
        )
    p = _ints(padding, nd, "padding", fn, message=f"{fn}: padding must either be a single int, or a tuple of {words}")
    d = _ints(
        dilation, nd, "dilation", fn, message=f"{fn}: dilation must be either a single int, or a tuple of {words}"
    )
    return k, s, p, d


def _check_max_pool1d_impl(input, k, s, p, d, ceil_mode):
    """``max_pool1d`` without indices runs its own kernel in PyTorch, with its own messages."""
    n = len(input._shape)
    if n not in (2, 3) or any(v == 0 for v in input._shape[-2:]):
        raise RuntimeError(
            "max_pool1d: Expected 2D or 3D (batch mode) tensor with optional 0 dim batch size for input, but got:"
            + _shape_list(input._shape)
        )
    if not input._dtype.is_floating_point:
        raise _not_implemented("max_pool1d_impl", input._dtype)
    if k[0] <= 0:
        raise RuntimeError(f"max_pool1d() kernel_size must be greater than zero, but got {k[0]}")
    if s[0] <= 0:
        raise RuntimeError(f"max_pool1d() stride must be greater than zero, but got {s[0]}")
    if p[0] < 0:
        raise RuntimeError(f"max_pool1d() padding must be non-negative, but got {p[0]}")
    if p[0] > k[0] // 2:
        raise RuntimeError(
            f"max_pool1d() padding should be at most half of kernel size, but got padding={p[0]} and kernel_size={k[0]}"
        )
    if d[0] <= 0:
        raise RuntimeError(f"max_pool1d() dilation must be greater than zero, but got {d[0]}")
    out = _pool_out(input._shape[-1], k[0], s[0], p[0], d[0], ceil_mode)
    if out <= 0:
        raise RuntimeError(f"max_pool1d() Invalid computed output size: {out}")


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """1-d max pooling over ``(N, C, L)`` or ``(C, L)``; with ``return_indices`` also the argmax positions."""
    if return_indices:
        return max_pool1d_with_indices(input, kernel_size, stride, padding, dilation, ceil_mode)
    k, s, p, d = _max_pool_args(1, "max_pool1d", kernel_size, stride, padding, dilation, False)
    _check_max_pool1d_impl(input, k, s, p, d, ceil_mode)
    return _max_pool(input, k, s, p, d, bool(ceil_mode))[0]


def max_pool1d_with_indices(
    input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False
):
    """1-d max pooling returning ``(values, indices)`` (indices into each input row)."""
    k, s, p, d = _max_pool_args(1, "max_pool1d", kernel_size, stride, padding, dilation, True)
    return _max_pool(input, k, s, p, d, bool(ceil_mode))


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """2-d max pooling over ``(N, C, H, W)`` or ``(C, H, W)``; with ``return_indices`` also the flat argmax
    index into each ``H*W`` plane."""
    out = max_pool2d_with_indices(input, kernel_size, stride, padding, dilation, ceil_mode)
    return out if return_indices else out[0]


def max_pool2d_with_indices(
    input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False
):
    """2-d max pooling returning ``(values, indices)``."""
    k, s, p, d = _max_pool_args(2, "max_pool2d", kernel_size, stride, padding, dilation, True)
    return _max_pool(input, k, s, p, d, bool(ceil_mode))


def max_pool3d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """3-d max pooling over ``(N, C, D, H, W)`` or ``(C, D, H, W)``; optionally with argmax indices."""
    out = max_pool3d_with_indices(input, kernel_size, stride, padding, dilation, ceil_mode)
    return out if return_indices else out[0]


def max_pool3d_with_indices(
    input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False
):
    """3-d max pooling returning ``(values, indices)``."""
    k, s, p, d = _max_pool_args(3, "max_pool3d", kernel_size, stride, padding, dilation, True)
    return _max_pool(input, k, s, p, d, bool(ceil_mode))


# ---------------------------------------------------------------------------------------- adaptive max


def _adaptive_bounds(size: int, out: int):
    """PyTorch's adaptive windows along one dim: ``[floor(i*n/o), ceil((i+1)*n/o))``."""
    i = np.arange(out)
    start = (i * size) // out
    end = -((-(i + 1) * size) // out)
    return start, end


def _adaptive_size(output_size, nd: int, fn: str, shape: tuple) -> tuple[int, ...]:
    if nd == 1:
        if isinstance(output_size, (tuple, list)) and len(output_size) != 1:
            raise RuntimeError(f"{fn}() argument 'output_size' should contain one int (got {len(output_size)})")
        out = output_size if isinstance(output_size, (tuple, list)) else (output_size,)
    else:
        out = output_size if isinstance(output_size, (tuple, list)) else (output_size,) * nd
        if len(out) == 1:
            out = tuple(out) * nd
    out = tuple(shape[len(shape) - len(out) + i] if v is None else v for i, v in enumerate(out))
    _check_int_list(fn, "output_size", out if isinstance(output_size, (tuple, list)) else output_size)
    return tuple(int(v) for v in out)


def _adaptive_max_meta(input, output_size):
    nd = len(output_size)
    name = f"adaptive_max_pool{nd}d"
    shape = input._shape
    n = len(shape)
    if nd == 1:
        if n not in (2, 3):
            raise RuntimeError(
                f"Expected 2 to 3 dimensions, but got {n}-dimensional tensor for argument #1 'self' "
                f"(while checking arguments for {name})"
            )
        name2 = "adaptive_max_pool2d"
    else:
        name2 = name
        if n not in (3, 4):
            raise RuntimeError(f"{name}(): Expected 3D or 4D tensor, but got: {_shape_list(shape)}")
    if len(output_size) != nd:
        raise RuntimeError(f"{name}(): internal error: output_size.size() must be {nd}")
    # only the first dim may be empty
    for i in range(1, n):
        if shape[i] == 0:
            raise RuntimeError(
                f"{name}(): Expected input to have non-zero size for non-batch dimensions, but input has sizes "
                f"{_shape_list(shape)} with dimension {i} being empty"
            )
    _check_float(name2, input._dtype)
    out_shape = shape[:-nd] + tuple(output_size)
    for v in output_size:
        if v < 0:
            full = out_shape[:-1] + (1, out_shape[-1]) if nd == 1 else out_shape
            raise RuntimeError(f"Trying to create tensor with negative dimension {v}: {_shape_list(full)}")
    return (out_shape, input._dtype, input._device), (out_shape, dt.int64, input._device)


def _adaptive_max_ref(spec, a, output_size):
    nd = len(output_size)
    compute = _compute_np(spec[0][1])
    x = a.astype(compute, copy=False)
    positions = []
    for n, o in zip(a.shape[-nd:], output_size):
        start, end = _adaptive_bounds(n, o)
        k = int((end - start).max()) if o else 1
        pos = start[:, None] + np.arange(k)[None, :]
        positions.append((pos, pos < end[:, None]))
    return _argmax_windows(x, nd, positions, tuple(output_size))


def _adaptive_max_backward(grads, input_shape, output_size, result):
    return _scatter_to_argmax(grads[0], input_shape, result[1], len(output_size))


@op(
    meta=_adaptive_max_meta,
    reference=_adaptive_max_ref,
    backward=_adaptive_max_backward,
    num_outputs=2,
    differentiable_outputs=(0,),
    grad_fn_name="AdaptiveMaxPool2DBackward0",
)
def _adaptive_max_pool(input: Tensor, output_size: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """Adaptive max pooling over the last ``len(output_size)`` dims: ``(values, flat argmax per plane)``."""


def adaptive_max_pool1d(input, output_size, return_indices=False):
    """1-d adaptive max pooling of ``(N, C, L)`` or ``(C, L)`` to length ``output_size``."""
    out = adaptive_max_pool1d_with_indices(input, output_size)
    return out if return_indices else out[0]


def adaptive_max_pool1d_with_indices(input, output_size, return_indices=False):
    """1-d adaptive max pooling returning ``(values, indices)``."""
    return _adaptive_max_pool(input, _adaptive_size(output_size, 1, "adaptive_max_pool1d", input._shape))


def adaptive_max_pool2d(input, output_size, return_indices=False):
    """2-d adaptive max pooling to ``output_size`` (an int, or a pair whose ``None`` keeps the input size)."""
    out = adaptive_max_pool2d_with_indices(input, output_size)
    return out if return_indices else out[0]


def adaptive_max_pool2d_with_indices(input, output_size, return_indices=False):
    """2-d adaptive max pooling returning ``(values, indices)`` (flat indices into each input plane)."""
    if isinstance(output_size, (tuple, list)) and len(output_size) not in (1, 2):
        raise RuntimeError("adaptive_max_pool2d(): internal error: output_size.size() must be 2")
    return _adaptive_max_pool(input, _adaptive_size(output_size, 2, "adaptive_max_pool2d", input._shape))


# ---------------------------------------------------------------------------------------- separable linear maps

_TAPS_CACHE: dict[tuple, tuple] = {}


def _avg_taps(shape, dtype, params):
    k, s, p, ceil_mode, count_include_pad, divisor_override = params
    nd = len(k)
    name = "avg_pool1d" if nd == 1 else "avg_pool2d"
    _check_pool_input(name, shape, nd)
    if not (dtype.is_floating_point or dtype is dt.int64):
        raise _not_implemented("avg_pool2d", dtype)
    _check_pool_args(k, s, p, (1,) * nd)
    if divisor_override is not None and divisor_override == 0:
        raise RuntimeError("divisor must be not zero")
    sp = shape[-nd:]
    out = tuple(_pool_out(n, kk, ss, pp, 1, ceil_mode) for n, kk, ss, pp in zip(sp, k, s, p))
    _check_out_size(shape, nd, out)
    taps, divs = [], []
    for n, o, kk, ss, pp in zip(sp, out, k, s, p):
        pos, ok = _window_positions(o, kk, ss, pp, 1, n)
        start = np.arange(o) * ss - pp
        pool_size = np.minimum(start + kk, n + pp) - start
        div = pool_size if count_include_pad else ok.sum(1)
        taps.append((np.where(ok, pos, n), ok.astype(np.float64)))
        divs.append(div)
    if divisor_override is not None:
        divisor = np.full(out, divisor_override, np.int64)
    else:
        divisor = np.ones(out, np.int64)
        for i, dv in enumerate(divs):
            shp = [1] * nd
            shp[i] = -1
            divisor = divisor * dv.reshape(shp)
    if divisor_override is not None:
        taps[0] = (taps[0][0], taps[0][1] / float(divisor_override))
    else:
        taps = [(idx, w / np.maximum(dv, 1)[:, None]) for (idx, w), dv in zip(taps, divs)]
    return out, taps, divisor


def _adaptive_avg_taps(shape, dtype, params):
    (output_size,) = params
    nd = len(output_size)
    name = f"adaptive_avg_pool{nd}d"
    n = len(shape)
    if nd == 1:
        if n not in (2, 3):
            raise RuntimeError(
                f"Expected 2 to 3 dimensions, but got {n}-dimensional tensor for argument #1 'self' "
                f"(while checking arguments for {name})"
            )
    else:
        if len(output_size) != 2:
            raise RuntimeError("adaptive_avg_pool2d: output_size must be 2")
        if n not in (3, 4):
            raise RuntimeError(f"adaptive_avg_pool2d(): Expected 3D or 4D tensor, but got {_shape_list(shape)}")
    # 1-d pooling runs as 2-d pooling of an (..., 1, L) input: messages show that shape
    shape2 = shape[:-1] + (1, shape[-1]) if nd == 1 else shape
    size2 = (1, *output_size) if nd == 1 else output_size
    for i in range(len(shape2) - 2, len(shape2)):
        if shape2[i] == 0:
            raise RuntimeError(
                f"adaptive_avg_pool2d(): Expected input to have non-zero size for non-batch dimensions, but input "
                f"has sizes {_shape_list(shape2)} with dimension {i} being empty"
            )
    _check_float("adaptive_avg_pool2d", dtype)
    if any(v < 0 for v in output_size):
        raise RuntimeError(
            "adaptive_avg_pool2d: elements of output_size must be greater than or equal to 0 but received "
            "{" + ", ".join(str(v) for v in size2) + "}"
        )
    taps = []
    for size, o in zip(shape[-nd:], output_size):
        start, end = _adaptive_bounds(size, o)
        k = int((end - start).max()) if o else 1
        pos = start[:, None] + np.arange(k)[None, :]
        ok = pos < end[:, None]
        taps.append((np.where(ok, pos, size), ok / np.maximum(end - start, 1)[:, None]))
    return tuple(output_size), taps, None


def _interp_prologue(shape, dtype, output_size, kernel):
    nd = len(output_size)
    sp = shape[-nd:]
    if len(shape) != nd + 2:
        raise RuntimeError(f"Non-empty {nd + 2}D data tensor expected but got a tensor with sizes {_shape_list(shape)}")
    if _numel(shape[1:-nd]) == 0 and shape[1] == 0:
        raise RuntimeError(f"Non-empty {nd + 2}D data tensor expected but got a tensor with sizes {_shape_list(shape)}")
    if any(v <= 0 for v in sp) or any(v <= 0 for v in output_size):
        if nd == 1:
            raise RuntimeError(
                "Input and output sizes should be greater than 0, but got input (W: "
                f"{sp[0]}) and output (W: {output_size[0]})"
            )
        names = ("D", "H", "W")[3 - nd :]
        ins = ", ".join(f"{a}: {v}" for a, v in zip(names, sp))
        outs = ", ".join(f"{a}: {v}" for a, v in zip(names, output_size))
        raise RuntimeError(f"Input and output sizes should be greater than 0, but got input ({ins}) output ({outs})")
    if not dtype.is_floating_point:
        raise _not_implemented(kernel, dtype)
    return sp


def _nearest_taps(exact: bool):
    def taps_fn(shape, dtype, params):
        output_size, scales = params
        nd = len(output_size)
        kernel = "upsample_nearest2d_channels_last" if nd == 2 else "compute_indices_weights_nearest"
        sp = _interp_prologue(shape, dtype, output_size, kernel)
        taps = []
        for n, o, sc in zip(sp, output_size, scales):
            # PyTorch computes the source index in single precision
            scale = np.float32(1.0 / sc) if sc is not None and sc > 0 else np.float32(n) / np.float32(o)
            i = np.arange(o, dtype=np.float32)
            src = np.floor((i + np.float32(0.5)) * scale) if exact else np.floor(i * scale)
            idx = np.minimum(src.astype(np.int64), n - 1)
            taps.append((idx[:, None], np.ones((o, 1))))
        return tuple(output_size), taps, None

    return taps_fn


def _linear_taps(shape, dtype, params):
    output_size, align_corners, scales = params
    nd = len(output_size)
    kernel = "upsample_bilinear2d_channels_last" if nd == 2 else "compute_indices_weights_linear"
    sp = _interp_prologue(shape, dtype, output_size, kernel)
    taps = []
    for n, o, sc in zip(sp, output_size, scales):
        i = np.arange(o, dtype=np.float64)
        if align_corners:
            scale = (n - 1) / (o - 1) if o > 1 else 0.0
            src = i * scale
        else:
            scale = 1.0 / sc if sc is not None and sc > 0 else n / o
            src = np.maximum(scale * (i + 0.5) - 0.5, 0.0)
        i0 = np.minimum(src.astype(np.int64), n - 1)
        i1 = i0 + (i0 < n - 1)
        lam1 = src - i0
        taps.append((np.stack([i0, i1], 1), np.stack([1.0 - lam1, lam1], 1)))
    return tuple(output_size), taps, None


def _cubic_taps(shape, dtype, params):
    """Bicubic convolution (``A = -0.75``) over 4 neighbours, indices clamped into the input."""
    output_size, align_corners, scales = params
    sp = _interp_prologue(shape, dtype, output_size, "compute_indices_weights_cubic")
    a = -0.75
    taps = []
    for n, o, sc in zip(sp, output_size, scales):
        i = np.arange(o, dtype=np.float64)
        if align_corners:
            src = i * ((n - 1) / (o - 1) if o > 1 else 0.0)
        else:
            src = (1.0 / sc if sc is not None and sc > 0 else n / o) * (i + 0.5) - 0.5
        i0 = np.floor(src).astype(np.int64)
        t = src - i0
        x1, x2 = t + 1.0, 1.0 - t
        w = np.stack(
            [
                ((a * x1 - 5 * a) * x1 + 8 * a) * x1 - 4 * a,
                ((a + 2) * t - (a + 3)) * t * t + 1,
                ((a + 2) * x2 - (a + 3)) * x2 * x2 + 1,
                ((a * (x2 + 1) - 5 * a) * (x2 + 1) + 8 * a) * (x2 + 1) - 4 * a,
            ],
            1,
        )
        idx = np.clip(i0[:, None] + np.arange(-1, 3)[None, :], 0, n - 1)
        taps.append((idx, w))
    return tuple(output_size), taps, None


def _bilinear_aa_taps(shape, dtype, params):
    """Antialiased bilinear weights: a triangle filter widened by the downscaling factor, normalised per
    output pixel (PyTorch's ``antialias=True``, as in Pillow)."""
    output_size, align_corners, scales = params
    sp = _interp_prologue(shape, dtype, output_size, "_upsample_bilinear2d_aa")
    taps = []
    for n, o, sc in zip(sp, output_size, scales):
        if align_corners:
            scale = (n - 1) / (o - 1) if o > 1 else 0.0
        else:
            scale = 1.0 / sc if sc is not None and sc > 0 else n / o
        support = scale if scale >= 1.0 else 1.0
        invscale = 1.0 / scale if scale >= 1.0 else 1.0
        center = scale * (np.arange(o) + 0.5)
        xmin = np.maximum((center - support + 0.5).astype(np.int64), 0)
        xsize = np.minimum((center + support + 0.5).astype(np.int64), n) - xmin
        k = max(int(xsize.max()), 1)
        j = np.arange(k)[None, :]
        w = np.maximum(0.0, 1.0 - np.abs((j + xmin[:, None] - center[:, None] + 0.5) * invscale))
        w = np.where(j < xsize[:, None], w, 0.0)
        total = w.sum(1, keepdims=True)
        w = np.where(total != 0, w / np.where(total != 0, total, 1.0), 0.0)
        idx = np.where(j < xsize[:, None], xmin[:, None] + j, n)
        taps.append((idx, w))
    return tuple(output_size), taps, None


_PAD_MODES_HELP = (
    "Supported combinations for non-constant padding:\n"
    "  - 2D or 3D input: padding size = 2 (pads last dimension)\n"
    "  - 3D or 4D input: padding size = 4 (pads last 2 dimensions)\n"
    "  - 4D or 5D input: padding size = 6 (pads last 3 dimensions)"
)


def _pad_taps(mode: str):
    def taps_fn(shape, dtype, params):
        (pad,) = params
        nd = len(pad) // 2
        n = len(shape)
        if len(pad) not in (2, 4, 6) or n not in (nd + 1, nd + 2):
            raise NotImplementedError(
                f"Padding size {len(pad)} is not supported for {n}D input tensor.\n{_PAD_MODES_HELP}"
            )
        if mode != "circular":
            batch = n == nd + 2
            for i in range(1 if batch else 0, n):
                if shape[i] == 0 and (i > 0 or not batch) and not (i == 0 and batch):
                    raise RuntimeError(
                        f"Expected {nd + 1}D or {nd + 2}D (batch mode) tensor with possibly 0 batch size and other "
                        f"non-zero dimensions for input, but got: {_shape_list(shape)}"
                    )
        if mode != "circular" and dtype is dt.bool:
            raise _not_implemented(f"{'reflection' if mode == 'reflect' else 'replication'}_pad{nd}d", dtype)
        taps = []
        out = []
        # pad lists the last dim first: (left_W, right_W, left_H, right_H, ...)
        for j in range(nd):
            left, right = pad[2 * (nd - 1 - j)], pad[2 * (nd - 1 - j) + 1]
            axis = n - nd + j
            size = shape[axis]
            if mode == "reflect" and (left >= size or right >= size):
                raise RuntimeError(
                    f"Argument #{4 + 2 * (nd - 1 - j)}: Padding size should be less than the corresponding input "
                    f"dimension, but got: padding ({left}, {right}) at dimension {axis} of input {_shape_list(shape)}"
                )
            if mode == "circular" and (left > size or right > size):
                raise RuntimeError("Padding value causes wrapping around more than once.")
            o = size + left + right
            if o < 0 or (mode != "circular" and o <= 0):
                raise RuntimeError(
                    f"input tensor with shape {_shape_list(shape)} and padding {list(pad)} results in an invalid "
                    "output size"
                )
            pos = np.arange(o) - left
            if mode == "reflect":
                period = 2 * (size - 1) if size > 1 else 1
                q = np.mod(pos, period)
                idx = np.where(q >= size, period - q, q)
            elif mode == "replicate":
                idx = np.clip(pos, 0, size - 1)
            else:
                lo, kept = max(-left, 0), size - max(-left, 0) - max(-right, 0)
                idx = lo + np.mod(np.arange(o) - max(left, 0), kept) if kept > 0 else pos
            taps.append((idx.astype(np.int64)[:, None], np.ones((o, 1))))
            out.append(o)
        return tuple(out), taps, None

    return taps_fn


_KINDS = {
    "avg_pool": _avg_taps,
    "adaptive_avg_pool": _adaptive_avg_taps,
    "upsample_nearest": _nearest_taps(False),
    "upsample_nearest_exact": _nearest_taps(True),
    "upsample_linear": _linear_taps,
    "upsample_bilinear_aa": _bilinear_aa_taps,
    "upsample_bicubic": _cubic_taps,
    "reflection_pad": _pad_taps("reflect"),
    "replication_pad": _pad_taps("replicate"),
    "circular_pad": _pad_taps("circular"),
}


def _taps(kind: str, shape: tuple, dtype: dt.dtype, params: tuple):
    if kind not in _KINDS:
        raise ValueError(f"unknown separable kind {kind!r}")
    key = (kind, shape, dtype, params)
    hit = _TAPS_CACHE.get(key)
    if hit is None:
        hit = _KINDS[kind](shape, dtype, params)
        if len(_TAPS_CACHE) > 4096:
            _TAPS_CACHE.clear()
        _TAPS_CACHE[key] = hit
    return hit


def _separable_meta(input, kind, params):
    out, taps, divisor = _taps(kind, input._shape, input._dtype, params)
    nd = len(out)
    return (input._shape[:-nd] + out, input._dtype, input._device, taps, divisor)


def _apply_taps(x: np.ndarray, taps: list, integer: bool) -> np.ndarray:
    """``out[..., i, ...] = sum_k w[i, k] * x[..., idx[i, k], ...]`` along each trailing dim in turn (a
    loop over the few taps; ``idx == size`` reads an implicit zero)."""
    nd = len(taps)
    for i, (idx, w) in enumerate(taps):
        axis = x.ndim - nd + i
        if idx.size and idx.max() >= x.shape[axis]:
            zshape = list(x.shape)
            zshape[axis] = 1
            x = np.concatenate([x, np.zeros(zshape, x.dtype)], axis)
        bshape = [1] * x.ndim
        bshape[axis] = -1
        if idx.shape[1] == 1 and np.all(w == 1.0):
            x = np.take(x, idx[:, 0], axis)
            continue
        y = None
        for j in range(idx.shape[1]):
            wj = (w[:, j] > 0).astype(x.dtype) if integer else w[:, j].astype(x.dtype)
            t = np.take(x, idx[:, j], axis) * wj.reshape(bshape)
            if y is None:
                y = t
            else:
                y += t
        x = y
    return x


def _separable_ref(spec, a, kind, params):
    taps, divisor = spec[3], spec[4]
    compute = _compute_np(spec[1])
    if not spec[1].is_floating_point:
        s = _apply_taps(a.astype(np.int64), taps, True)
        if divisor is None:
            return s.astype(compute)
        q = np.abs(s) // divisor  # C++ integer division truncates toward zero
        return (np.sign(s) * q).astype(compute)
    return _apply_taps(a.astype(compute, copy=False), taps, False)


def _separable_backward_formula(grad, input_shape, kind, params):
    return _separable_backward(grad, input_shape, kind, params)


def _grad_fn_name(args) -> str:
    kind, params = args[1], args[2]
    nd = {
        "reflection_pad": lambda: len(params[0]) // 2,
        "replication_pad": lambda: len(params[0]) // 2,
        "circular_pad": lambda: len(params[0]) // 2,
        "avg_pool": lambda: 2,
    }.get(kind, lambda: len(params[0]))()
    if kind == "upsample_bilinear_aa":
        return "UpsampleBilinear2DAaBackward0"
    if kind == "upsample_linear":
        return ("UpsampleLinear1DBackward0", "UpsampleBilinear2DBackward0", "UpsampleTrilinear3DBackward0")[nd - 1]
    if kind == "upsample_bicubic":
        return "UpsampleBicubic2DBackward0"
    if kind == "adaptive_avg_pool":
        return "AdaptiveAvgPool2DBackward0"
    base = {
        "avg_pool": "AvgPool",
        "upsample_nearest": "UpsampleNearest",
        "upsample_nearest_exact": "UpsampleNearestExact",
        "reflection_pad": "ReflectionPad",
        "replication_pad": "ReplicationPad",
        "circular_pad": "CircularPad",
    }[kind]
    return f"{base}{nd}DBackward0"


@op(
    meta=_separable_meta,
    reference=_separable_ref,
    backward=_separable_backward_formula,
    grad_fn_name=_grad_fn_name,
)
def _separable(input: Tensor, kind: str, params: tuple) -> Tensor:
    """A separable linear resampling of the trailing dims of ``input`` (pooling, interpolation, padding).

    ``kind`` names the map (``"avg_pool"``, ``"adaptive_avg_pool"``, ``"upsample_nearest"``,
    ``"upsample_nearest_exact"``, ``"upsample_linear"``, ``"reflection_pad"``, ``"replication_pad"``,
    ``"circular_pad"``); ``params`` are its arguments, already normalised by the public function.
    """


def _separable_backward_meta(grad, input_size, kind, params):
    input_size = tuple(input_size)
    out, taps, _ = _taps(kind, input_size, grad._dtype, params)
    nd = len(out)
    expected = input_size[:-nd] + out
    if grad._shape != expected:
        raise RuntimeError(
            f"Expected grad_output to have the same shape as output; output.size({len(expected) - 1}) = "
            f"{expected[-1]} but got grad_output.size({len(expected) - 1}) = {grad._shape[-1]}"
            if len(grad._shape) == len(expected)
            else f"Expected grad_output to be of shape {_shape_list(expected)}, got {_shape_list(grad._shape)}"
        )
    if not grad._dtype.is_floating_point:
        raise _not_implemented(kind + "_backward", grad._dtype)
    return (input_size, grad._dtype, grad._device, taps)


def _separable_backward_ref(spec, g, input_size, kind, params):
    taps = spec[3]
    compute = _compute_np(spec[1])
    x = g.astype(compute, copy=False)
    nd = len(taps)
    for i, (idx, w) in enumerate(taps):
        axis = x.ndim - nd + i
        size = input_size[axis]
        dense = np.zeros((idx.shape[0], size + 1), compute)
        rows = np.broadcast_to(np.arange(idx.shape[0])[:, None], idx.shape)
        np.add.at(dense, (rows, idx), w.astype(compute))
        x = np.moveaxis(np.tensordot(x, dense[:, :size], axes=([axis], [0])), -1, axis)
    return np.ascontiguousarray(x)


def _separable_backward_backward(grad, kind, params):
    return _separable(grad, kind, params)


@op(
    meta=_separable_backward_meta,
    reference=_separable_backward_ref,
    backward=_separable_backward_backward,
    grad_fn_name=lambda args: _grad_fn_name((None, args[2], args[3])).replace("Backward0", "BackwardBackward0"),
)
def _separable_backward(grad: Tensor, input_size: tuple[int, ...], kind: str, params: tuple) -> Tensor:
    """The transpose of :func:`_separable`: ``grad`` of the output mapped back to an ``input_size`` input."""


# ---------------------------------------------------------------------------------------- average pooling


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    """1-d average pooling over ``(N, C, L)`` or ``(C, L)``."""
    k = _ints(kernel_size, 1, "kernel_size", "avg_pool1d")
    s = (
        k
        if stride is None or (isinstance(stride, (list, tuple)) and not stride)
        else _ints(stride, 1, "stride", "avg_pool1d")
    )
    p = _ints(padding, 1, "padding", "avg_pool1d")
    return _separable(input, "avg_pool", (k, s, p, bool(ceil_mode), bool(count_include_pad), None))


def avg_pool2d(
    input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None
):
    """2-d average pooling over ``(N, C, H, W)`` or ``(C, H, W)`` (``divisor_override`` replaces the window size)."""
    fn = "avg_pool2d"
    k = _ints(
        kernel_size,
        2,
        "kernel_size",
        fn,
        message=f"{fn}: kernel_size must either be a single int, or a tuple of two ints",
    )
    if stride is None or (isinstance(stride, (list, tuple)) and not stride):
        s = k
    else:
        s = _ints(
            stride,
            2,
            "stride",
            fn,
            message=f"{fn}: stride must either be omitted, a single int, or a tuple of two ints",
        )
    p = _ints(padding, 2, "padding", fn, message=f"{fn}: padding must either be a single int, or a tuple of two ints")
    return _separable(input, "avg_pool", (k, s, p, bool(ceil_mode), bool(count_include_pad), divisor_override))


def adaptive_avg_pool1d(input, output_size):
    """1-d adaptive average pooling of ``(N, C, L)`` or ``(C, L)`` to length ``output_size``."""
    return _separable(
        input, "adaptive_avg_pool", (_adaptive_size(output_size, 1, "adaptive_avg_pool1d", input._shape),)
    )


def adaptive_avg_pool2d(input, output_size):
    """2-d adaptive average pooling to ``output_size`` (an int, or a pair whose ``None`` keeps the input size)."""
    return _separable(
        input, "adaptive_avg_pool", (_adaptive_size(output_size, 2, "adaptive_avg_pool2d", input._shape),)
    )


# ---------------------------------------------------------------------------------------- interpolate

_INTERP_MODES = "nearest | linear | bilinear | bicubic | trilinear | lanczos | area | nearest-exact"


def interpolate(
    input,
    size=None,
    scale_factor=None,
    mode="nearest",
    align_corners=None,
    recompute_scale_factor=None,
    antialias=False,
):
    """Resample ``input`` (``(N, C, L)``, ``(N, C, H, W)`` or ``(N, C, D, H, W)``) to ``size`` or by
    ``scale_factor``: modes ``'nearest'``, ``'nearest-exact'``, ``'linear'`` (3-d), ``'bilinear'`` (4-d,
    optionally ``antialias``), ``'bicubic'`` (4-d), ``'trilinear'`` (5-d) and ``'area'`` (3-d/4-d)."""
    if mode in ("nearest", "area", "nearest-exact"):
        if align_corners is not None:
            raise ValueError(
                "align_corners option can only be set with the interpolating modes: linear | bilinear | bicubic | "
                "trilinear"
            )
    elif align_corners is None:
        align_corners = False
    dim = input.dim() - 2
    if size is not None and scale_factor is not None:
        raise ValueError("only one of size or scale_factor should be defined")
    if size is not None:
        if isinstance(size, (list, tuple)):
            if len(size) != dim:
                raise ValueError(
                    "Input and output must have the same number of spatial dimensions, but got input with spatial "
                    f"dimensions of {list(input.shape[2:])} and output size of {size}. Please provide input tensor "
                    "in (N, C, d1, d2, ...,dK) format and output size in (o1, o2, ...,oK) format."
                )
            output_size = tuple(size)
        else:
            output_size = (size,) * max(dim, 0)
        scale_factors = None
    elif scale_factor is not None:
        if isinstance(scale_factor, (list, tuple)):
            if len(scale_factor) != dim:
                raise ValueError(
                    "Input and scale_factor must have the same number of spatial dimensions, but got input with "
                    f"spatial dimensions of {list(input.shape[2:])} and scale_factor of shape {scale_factor}. Please "
                    "provide input tensor in (N, C, d1, d2, ...,dK) format and scale_factor in (s1, s2, ...,sK) format."
                )
            scale_factors = tuple(float(v) for v in scale_factor)
        else:
            scale_factors = (float(scale_factor),) * max(dim, 0)
        output_size = None
    else:
        raise ValueError("either size or scale_factor should be defined")
    if recompute_scale_factor is not None and recompute_scale_factor and size is not None:
        raise ValueError("recompute_scale_factor is not meaningful with an explicit size.")
    if mode == "area" and output_size is None:
        recompute_scale_factor = True
    if recompute_scale_factor is not None and recompute_scale_factor:
        output_size = tuple(math.floor(float(input.shape[i + 2]) * scale_factors[i]) for i in range(dim))
        scale_factors = None
    if antialias and not (mode in ("bilinear", "bicubic") and input.dim() == 4):
        raise ValueError(
            "Anti-alias option is restricted to bilinear, bicubic, and lanczos modes and requires a 4-D tensor as input"
        )
    if output_size is None:
        output_size = tuple(math.floor(float(input.shape[i + 2]) * scale_factors[i]) for i in range(dim))
    scales = scale_factors if scale_factors is not None else (None,) * len(output_size)
    output_size = tuple(int(v) for v in output_size)
    n = input.dim()
    if n in (3, 4, 5) and mode in ("nearest", "nearest-exact"):
        kind = "upsample_nearest" if mode == "nearest" else "upsample_nearest_exact"
        return _separable(input, kind, (output_size, scales))
    if mode == "area" and n in (3, 4):
        return _separable(input, "adaptive_avg_pool", (output_size,))
    linear_dims = {"linear": 3, "bilinear": 4, "trilinear": 5}
    if linear_dims.get(mode) == n:
        kind = "upsample_bilinear_aa" if antialias else "upsample_linear"
        return _separable(input, kind, (output_size, bool(align_corners), scales))
    if mode == "bicubic" and n == 4:
        if antialias:
            raise NotImplementedError("interpolate(): antialias=True with mode 'bicubic' is not supported by kiln yet")
        return _separable(input, "upsample_bicubic", (output_size, bool(align_corners), scales))
    if mode in linear_dims and n in (3, 4, 5):
        raise NotImplementedError(f"Got {n}D input, but {mode} mode needs {linear_dims[mode]}D input")
    if n in (3, 4, 5) and mode in ("area", "lanczos"):
        raise NotImplementedError(f"interpolate(): mode {mode!r} on {n}D input is not supported by kiln yet")
    raise NotImplementedError(
        f"Input Error: Only 3D, 4D and 5D input Tensors supported (got {n}D) for the modes: {_INTERP_MODES} "
        f"(got {mode})"
    )


# ---------------------------------------------------------------------------------------- padding


def _check_pad_arg(input, pad):
    if not isinstance(pad, (tuple, list)):
        raise TypeError(f"pad(): argument 'pad' must be tuple of ints, not {type(pad).__name__}")
    _check_int_list("pad", "pad", pad)
    pad = tuple(int(v) for v in pad)
    if len(pad) % 2:
        raise RuntimeError("Padding length must be divisible by 2")
    if len(pad) // 2 > len(input._shape):
        raise RuntimeError(
            "Padding length should be less than or equal to two times the input dimension but got padding length "
            f"{len(pad)} and input of dimension {len(input._shape)}"
        )
    return pad


def _constant_pad_meta(input, pad, value=0):
    _check_int_list("constant_pad_nd", "pad", pad)
    pad = (pad,) if isinstance(pad, numbers.Integral) else tuple(pad)
    n = len(input._shape)
    if len(pad) % 2:
        raise RuntimeError("Length of pad must be even but instead it equals " + str(len(pad)))
    if len(pad) // 2 > n:
        raise RuntimeError(
            "Length of pad should be no more than twice the number of dimensions of the input. Pad length is "
            f"{len(pad)}while the input has {n}dimensions."
        )
    shape = list(input._shape)
    for j in range(len(pad) // 2):
        axis = n - 1 - j
        new = shape[axis] + pad[2 * j] + pad[2 * j + 1]
        if shape[axis] + min(pad[2 * j], 0) + min(pad[2 * j + 1], 0) < 0:
            raise RuntimeError("narrow(): length must be non-negative.")
        shape[axis] = new
    return (tuple(shape), input._dtype, input._device)


def _constant_pad_ref(spec, a, pad, value=0):
    compute = _compute_np(spec[1])
    out = np.full(spec[0], value, compute) if spec[1] is not dt.bool else np.full(spec[0], bool(value))
    n = a.ndim
    src, dst = [slice(None)] * n, [slice(None)] * n
    for j in range(len(pad) // 2):
        axis = n - 1 - j
        left, right = pad[2 * j], pad[2 * j + 1]
        size = a.shape[axis]
        lo_src, hi_src = max(-left, 0), size - max(-right, 0)
        if hi_src <= lo_src:
            return out
        src[axis] = slice(lo_src, hi_src)
        dst[axis] = slice(max(left, 0), max(left, 0) + hi_src - lo_src)
    out[tuple(dst)] = a[tuple(src)]
    return out


def _constant_pad_backward(grad, pad):
    return constant_pad_nd(grad, tuple(-v for v in pad), 0)


@op(
    meta=_constant_pad_meta,
    reference=_constant_pad_ref,
    backward=_constant_pad_backward,
    grad_fn_name="ConstantPadNdBackward0",
)
def constant_pad_nd(input: Tensor, pad: tuple[int, ...], value: float = 0) -> Tensor:
    """``input`` padded with ``value`` (``pad`` lists the last dim first; negative entries crop)."""


def pad(input, pad, mode="constant", value=None):
    """Pad the trailing dims of ``input`` (``pad = (left, right, top, bottom, ...)``, last dim first) in mode
    ``'constant'`` (with ``value``; negative padding crops), ``'reflect'``, ``'replicate'`` or ``'circular'``."""
    pad = _check_pad_arg(input, pad)
    if mode == "constant":
        v = 0 if value is None else value
        if input._dtype is dt.bool:
            v = bool(v)
        elif not input._dtype.is_floating_point:
            v = int(v)
        return constant_pad_nd(input, pad, v)
    if value is not None and value != 0:
        raise RuntimeError(f'Padding mode "{mode}" doesn\'t take in value argument')
    kinds = {"reflect": "reflection_pad", "replicate": "replication_pad", "circular": "circular_pad"}
    if mode not in kinds:
        raise NotImplementedError(f"Unrecognised padding mode {mode}")
    return _separable(input, kinds[mode], (pad,))


# ---------------------------------------------------------------------------------------- pixel shuffle


def _pixel_args(name: str, input, factor, factor_name: str) -> tuple[int, tuple, tuple]:
    """(factor, leading dims, (C, H, W)) after the checks both pixel ops share."""
    r = int(factor)
    shape = tuple(input.shape)
    if len(shape) < 3:
        raise RuntimeError(
            f"{name} expects input to have at least 3 dimensions, but got input with {len(shape)} dimension(s)"
        )
    if r <= 0:
        raise RuntimeError(f"{name} expects a positive {factor_name}, but got {r}")
    return r, shape[:-3], shape[-3:]


def pixel_shuffle(input, upscale_factor):
    """Rearrange ``(*, C*r*r, H, W)`` into ``(*, C, H*r, W*r)``."""
    r, lead, (c, h, w) = _pixel_args("pixel_shuffle", input, upscale_factor, "upscale_factor")
    if c % (r * r):
        raise RuntimeError(
            "pixel_shuffle expects its input's 'channel' dimension to be divisible by the square of upscale_factor, "
            f"but input.size(-3)={c} is not divisible by {r * r}"
        )
    nl = len(lead)
    x = input.reshape(lead + (c // (r * r), r, r, h, w))
    x = x.permute(*range(nl), nl, nl + 3, nl + 1, nl + 4, nl + 2)
    return x.reshape(lead + (c // (r * r), h * r, w * r))


def pixel_unshuffle(input, downscale_factor):
    """Rearrange ``(*, C, H*r, W*r)`` into ``(*, C*r*r, H, W)`` (the inverse of :func:`pixel_shuffle`)."""
    r, lead, (c, h, w) = _pixel_args("pixel_unshuffle", input, downscale_factor, "downscale_factor")
    for dim, what, size in ((-2, "height", h), (-1, "width", w)):
        if size % r:
            raise RuntimeError(
                f"pixel_unshuffle expects {what} to be divisible by downscale_factor, but input.size({dim})={size} is "
                f"not divisible by {r}"
            )
    nl = len(lead)
    x = input.reshape(lead + (c, h // r, r, w // r, r))
    x = x.permute(*range(nl), nl, nl + 2, nl + 4, nl + 1, nl + 3)
    return x.reshape(lead + (c * r * r, h // r, w // r))
