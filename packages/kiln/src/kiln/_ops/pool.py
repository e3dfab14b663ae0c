"""nn primitives: pooling (``max_pool*``, ``adaptive_max_pool*``, ``avg_pool*``, ``adaptive_avg_pool*``;
``torch.nn.functional`` names and semantics).

* ``_max_pool`` / ``_adaptive_max_pool``: window maxima and the flat index of each maximum in its
  input plane (PyTorch's ``indices``). Their backward adds the gradient at those positions into zeros
  (``_argmax_scatter``, a ``scatter_add`` into fresh zeros in one op), whose own backward is a
  ``gather``, so higher-order gradients work.
* Average and adaptive average pooling are separable linear maps
  (:func:`kiln._ops.separable._separable`).
"""

from __future__ import annotations

import itertools
import numbers

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops.elementwise import _compute_np
from kiln._ops.separable import _separable
from kiln._ops.spatial_args import (
    _adaptive_bounds,
    _check_float,
    _check_int_list,
    _check_out_size,
    _check_pool_args,
    _check_pool_input,
    _ints,
    _not_implemented,
    _pool_out,
    _shape_list,
    _window_positions,
)
from kiln._spec import Spec
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
    "max_pool1d",
    "max_pool1d_with_indices",
    "max_pool2d",
    "max_pool2d_with_indices",
    "max_pool3d",
    "max_pool3d_with_indices",
]

TOP_LEVEL = (
    "adaptive_avg_pool1d",
    "avg_pool1d",
    "max_pool1d",
    "max_pool1d_with_indices",
    "max_pool2d",
    "max_pool3d",
    "adaptive_max_pool1d_with_indices as adaptive_max_pool1d",
)
"""The names ``kiln`` exports at its top level (as ``torch`` does); ``"x as y"`` where the top-level
function differs from the ``kiln.nn.functional`` one of the same name."""


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
    return Spec((shape, input._dtype, input._device)), Spec((shape, dt.int64, input._device))


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
    out_shape = spec[0].shape[-nd:]
    compute = _compute_np(spec[0].dtype)
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
    return Spec((src._shape[:-1] + (plane,), src._dtype, src._device))


def _argmax_scatter_ref(spec, g, i, plane):
    out = np.zeros((_numel(g.shape[:-1]), plane), _compute_np(spec.dtype))
    shape = (out.shape[0], g.shape[-1])
    np.add.at(out, (np.arange(shape[0])[:, None], i.reshape(shape)), g.reshape(shape))
    return out.reshape(spec.shape)


def _argmax_scatter_backward(grad, indices):
    from kiln._ops.gather_scatter import gather

    return gather(grad, -1, indices), None


@op(
    tags=("nn", "backward"), meta=_argmax_scatter_meta, reference=_argmax_scatter_ref, backward=_argmax_scatter_backward
)
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
    tags=("nn",),
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
    return Spec((out_shape, input._dtype, input._device)), Spec((out_shape, dt.int64, input._device))


def _adaptive_max_ref(spec, a, output_size):
    nd = len(output_size)
    compute = _compute_np(spec[0].dtype)
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
    tags=("nn",),
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
