"""``as_strided`` and the strided gradient helpers that in-place writes through views need.

Geometry here is always relative to a storage: ``(shape, stride, offset)`` in elements. The helpers
lay a gradient out *like* a base tensor (same strides and offset, in a scratch buffer) so that a
view's geometry selects the right elements of it.
"""

from __future__ import annotations

import numpy as np

from kiln._dispatch import op
from kiln._ops.copy import from_host, host_array
from kiln._ops.views import _shape_arg, device_generic, make_view
from kiln._tensor import Tensor


def _span_end(shape, stride, offset) -> int:
    if any(s == 0 for s in shape):
        return offset
    return offset + 1 + sum((n - 1) * s for n, s in zip(shape, stride))


def _positions(shape, stride, offset) -> np.ndarray:
    """Storage index of every element of a geometry, in row-major element order."""
    idx = np.full(shape, offset, dtype=np.int64)
    for d, (n, s) in enumerate(zip(shape, stride)):
        r = np.arange(n, dtype=np.int64) * s
        idx = idx + r.reshape((n,) + (1,) * (len(shape) - d - 1))
    return idx.reshape(-1)


def _as_strided_meta(input, size, stride, storage_offset=None):
    size, stride = _shape_arg(size), _shape_arg(stride)
    if len(size) != len(stride):
        raise RuntimeError(f"mismatch in length of strides and shape")
    offset = input._offset if storage_offset is None else int(storage_offset)
    if any(s < 0 for s in stride):
        raise RuntimeError("as_strided: Negative strides are not supported at the moment, got strides: " + str(list(stride)))
    end = _span_end(size, stride, offset)
    avail = len(input._storage) if hasattr(input._storage, "__len__") else end
    if end > avail:
        raise RuntimeError(
            f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset {offset}, and itemsize "
            f"{input._dtype.itemsize} requiring a storage size of {end * input._dtype.itemsize} are out of bounds "
            f"for storage of size {avail * input._dtype.itemsize}"
        )
    return (size, input._dtype, input._device, stride, offset)


@device_generic
def _as_strided_kernel(spec, input, *args):
    shape, _dtype, _dev, stride, offset = spec
    return make_view(input, shape, stride, offset)


def _as_strided_backward(grad, input_shape, input_stride, input_offset, size, stride, storage_offset):
    geometry = (input_shape, input_stride, input_offset)
    offset = input_offset if storage_offset is None else int(storage_offset)
    return _as_strided_grad(grad, geometry, (tuple(size), tuple(stride), offset))


@op(meta=_as_strided_meta, reference=_as_strided_kernel, backward=_as_strided_backward)
def as_strided(input: Tensor, size: tuple, stride: tuple, storage_offset: int | None = None) -> Tensor:
    """A view with explicit ``size``, ``stride`` and ``storage_offset`` over ``input``'s storage."""


Tensor.as_strided = as_strided


def _as_strided_grad_meta(grad, input_geometry, view_geometry):
    return (input_geometry[0], grad._dtype, grad._device)


def _as_strided_grad_ref(spec, g, input_geometry, view_geometry):
    in_shape, in_stride, in_offset = input_geometry
    shape, stride, offset = view_geometry
    n = max(_span_end(in_shape, in_stride, in_offset), _span_end(shape, stride, offset))
    buf = np.zeros(n, dtype=np.float64 if g.dtype.itemsize >= 8 else np.float32)
    np.add.at(buf, _positions(shape, stride, offset), g.reshape(-1))
    return buf[_positions(in_shape, in_stride, in_offset)].reshape(in_shape)


@op(meta=_as_strided_grad_meta, reference=_as_strided_grad_ref)
def _as_strided_grad(grad: Tensor, input_geometry: tuple, view_geometry: tuple) -> Tensor:
    """Gradient of ``as_strided``: ``grad`` scattered (summing overlaps) back into the input's geometry."""


def strided_view_of_like(grad: Tensor, base_meta: tuple, shape, stride, offset) -> Tensor:
    """The elements a view geometry selects from ``grad`` laid out like the base (no autograd)."""
    b_shape, b_stride, b_offset, _dtype, _dev = base_meta
    g = host_array(grad.detach())
    n = max(_span_end(b_shape, b_stride, b_offset), _span_end(shape, stride, offset))
    buf = np.zeros(n, dtype=g.dtype)
    buf[_positions(b_shape, b_stride, b_offset)] = g.reshape(-1)
    return from_host(buf[_positions(shape, stride, offset)].reshape(shape), grad._dtype, grad._device)


def as_strided_scatter_zero(grad: Tensor, base_meta: tuple, shape, stride, offset) -> Tensor:
    """``grad`` (laid out like the base) with the view's elements zeroed (no autograd)."""
    b_shape, b_stride, b_offset, _dtype, _dev = base_meta
    g = host_array(grad.detach())
    n = max(_span_end(b_shape, b_stride, b_offset), _span_end(shape, stride, offset))
    buf = np.zeros(n, dtype=g.dtype)
    base_pos = _positions(b_shape, b_stride, b_offset)
    buf[base_pos] = g.reshape(-1)
    buf[_positions(shape, stride, offset)] = 0
    return from_host(buf[base_pos].reshape(b_shape), grad._dtype, grad._device)
