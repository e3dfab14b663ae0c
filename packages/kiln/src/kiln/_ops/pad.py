"""nn primitives: padding (``pad``, ``constant_pad_nd``; ``torch.nn.functional`` names and semantics).

``constant_pad_nd``: constant padding (negative padding crops); its backward is itself with the
padding negated. Reflect / replicate / circular padding are separable linear maps
(:func:`kiln._ops.separable._separable`).
"""

from __future__ import annotations

import numbers

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import composite, op
from kiln._ops.elementwise import _compute_np
from kiln._ops.separable import _separable
from kiln._ops.spatial_args import _check_int_list
from kiln._spec import Spec
from kiln._tensor import Tensor

__all__ = ["pad"]

TOP_LEVEL = ("constant_pad_nd",)
"""The names ``kiln`` exports at its top level (as ``torch`` does)."""


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
    return Spec((tuple(shape), input._dtype, input._device))


def _constant_pad_ref(spec, a, pad, value=0):
    compute = _compute_np(spec.dtype)
    out = np.full(spec.shape, value, compute) if spec.dtype is not dt.bool else np.full(spec.shape, bool(value))
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


def _constant_pad_decomposed(input, pad, value=0):
    """``constant_pad_nd`` in kiln ops: per padded dim (last first), the kept slice (``narrow``: negative pads
    crop) between blocks of ``value`` (``cat``); all ``value`` when a dim is cropped away, as the reference."""
    from kiln._ops.creation import full
    from kiln._ops.shape import cat

    shape, dtype, device = _constant_pad_meta(input, pad, value)[:3]
    pad = (pad,) if isinstance(pad, numbers.Integral) else tuple(pad)
    compute = dt.float32 if dtype in (dt.float16, dt.bfloat16) else dtype
    fill = full((), bool(value) if dtype is dt.bool else value, dtype=compute, device=device)
    x = input.to(compute)
    n = x.dim()
    for j in range(len(pad) // 2):
        axis = n - 1 - j
        left, right = pad[2 * j], pad[2 * j + 1]
        lo, hi = max(-left, 0), x._shape[axis] - max(-right, 0)
        if hi <= lo:
            return fill.expand(shape).contiguous().to(dtype)
        x = x.narrow(axis, lo, hi - lo)
        parts = [x]
        if left > 0:
            parts.insert(0, fill.expand(x._shape[:axis] + (left,) + x._shape[axis + 1 :]))
        if right > 0:
            parts.append(fill.expand(x._shape[:axis] + (right,) + x._shape[axis + 1 :]))
        if len(parts) > 1:
            x = cat(parts, axis)
    return x.to(dtype)


@op(
    tags=("shape",),
    decompose=_constant_pad_decomposed,
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
    if mode == "circular":
        return _separable(input, kinds[mode], (pad,))
    return _reflection_or_replication_pad(input, kinds[mode], pad)


@composite(autocast="fp32", name="reflection_and_replication_pad")
def _reflection_or_replication_pad(input, kind: str, pad: tuple) -> Tensor:
    """``pad`` in mode ``'reflect'`` or ``'replicate'``: float32 under autocast, as PyTorch's kernels."""
    return _separable(input, kind, (pad,))
