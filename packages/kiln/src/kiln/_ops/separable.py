"""The separable linear map op shared by pooling, interpolation and padding: ``_separable`` and its
transpose ``_separable_backward``.

``_separable`` is every *linear* resampling that acts on each spatial dim independently (average
pooling, adaptive average pooling, nearest / linear / cubic interpolation, reflect / replicate /
circular padding). Per spatial dim it is a list of taps ``out[i] = sum_k w[i, k] * x[idx[i, k]]``
computed once per shape by the meta function (the tap builders of each kind live here);
``idx == len(dim)`` names an implicit zero (padding). ``_separable_backward`` applies the transposed
taps, and the two ops are each other's backward.
"""

from __future__ import annotations

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops.elementwise import _compute_np
from kiln._ops.spatial_args import (
    _adaptive_bounds,
    _check_float,
    _check_out_size,
    _check_pool_args,
    _check_pool_input,
    _not_implemented,
    _pool_out,
    _shape_list,
    _window_positions,
)
from kiln._spec import PoolSpec
from kiln._tensor import Tensor, _numel

__all__ = []


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
    return PoolSpec((input._shape[:-nd] + out, input._dtype, input._device, taps, divisor))


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
    taps, divisor = spec.taps, spec.divisor
    compute = _compute_np(spec.dtype)
    if not spec.dtype.is_floating_point:
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
    tags=("nn",),
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
    return PoolSpec((input_size, grad._dtype, grad._device, taps))


def _separable_backward_ref(spec, g, input_size, kind, params):
    taps = spec.taps
    compute = _compute_np(spec.dtype)
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
    tags=("nn", "backward"),
    meta=_separable_backward_meta,
    reference=_separable_backward_ref,
    backward=_separable_backward_backward,
    grad_fn_name=lambda args: _grad_fn_name((None, args[2], args[3])).replace("Backward0", "BackwardBackward0"),
)
def _separable_backward(grad: Tensor, input_size: tuple[int, ...], kind: str, params: tuple) -> Tensor:
    """The transpose of :func:`_separable`: ``grad`` of the output mapped back to an ``input_size`` input."""
