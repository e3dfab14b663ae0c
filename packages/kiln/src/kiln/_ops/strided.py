"""``as_strided`` and the strided gradient helpers that in-place writes through views need.

Geometry here is always relative to a storage: ``(shape, stride, offset)`` in elements. The helpers
lay a gradient out *like* a base tensor (same strides and offset, in a scratch buffer) so that a
view's geometry selects the right elements of it.
"""

from __future__ import annotations

import numpy as np

from kiln._dispatch import op
from kiln._ops.views import _shape_arg, check_storage_size, make_view
from kiln._spec import Spec, StridedSpec
from kiln._tensor import Tensor, storage_span

TOP_LEVEL = ("as_strided",)
"""The names ``kiln`` exports at its top level (as ``torch`` does)."""


def _span_end(shape, stride, offset) -> int:
    return offset + storage_span(shape, stride)


def _positions(shape, stride, offset) -> np.ndarray:
    """Storage index of every element of a geometry, in row-major element order."""
    idx = np.full(shape, offset, dtype=np.int64)
    for d, (n, s) in enumerate(zip(shape, stride)):
        r = np.arange(n, dtype=np.int64) * s
        idx = idx + r.reshape((n,) + (1,) * (len(shape) - d - 1))
    return idx.reshape(-1)


def _as_strided_meta(input, size, stride, storage_offset=None):
    size, stride = _shape_arg(size), _shape_arg(stride, "stride")
    if len(size) != len(stride):
        raise RuntimeError("mismatch in length of strides and shape")
    offset = input._offset if storage_offset is None else int(storage_offset)
    if any(s < 0 for s in stride):
        raise RuntimeError(
            "as_strided: Negative strides are not supported at the moment, got strides: " + str(list(stride))
        )
    if any(s < 0 for s in size):
        raise RuntimeError(f"Storage size calculation overflowed with sizes={list(size)} and strides={list(stride)}")
    check_storage_size(size, input._dtype, stride)
    end = _span_end(size, stride, offset)
    avail = len(input._storage) if hasattr(input._storage, "__len__") else end
    if end > avail:
        raise RuntimeError(
            f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset {offset}, and itemsize "
            f"{input._dtype.itemsize} requiring a storage size of {end * input._dtype.itemsize} are out of bounds "
            f"for storage of size {avail * input._dtype.itemsize}"
        )
    return StridedSpec((size, input._dtype, input._device, stride, offset))


def _as_strided_kernel(spec, input, *args):
    shape, _dtype, _dev, stride, offset = spec
    return make_view(input, shape, stride, offset)


def _as_strided_backward(grad, input_shape, input_stride, input_offset, size, stride, storage_offset):
    offset = input_offset if storage_offset is None else int(storage_offset)
    return _strided_scatter(grad, (input_shape, input_stride, input_offset), (tuple(size), tuple(stride), offset))


@op(
    meta=_as_strided_meta,
    reference=_as_strided_kernel,
    device_generic=True,
    tags=("view",),
    backward=_as_strided_backward,
)
def as_strided(input: Tensor, size: tuple, stride: tuple, storage_offset: int | None = None) -> Tensor:
    """A view with explicit ``size``, ``stride`` and ``storage_offset`` over ``input``'s storage."""


Tensor.as_strided = as_strided


def _storage_buffer(input_geometry, view_geometry, np_dtype) -> np.ndarray:
    n = max(_span_end(*input_geometry), _span_end(*view_geometry))
    return np.zeros(n, dtype=np_dtype)


def _compute_dtype(a: np.ndarray):
    return np.float64 if a.dtype.itemsize >= 8 else np.float32


def _scatter_ref(spec, g, input_geometry, view_geometry):
    buf = _storage_buffer(input_geometry, view_geometry, _compute_dtype(g))
    np.add.at(buf, _positions(*view_geometry), g.reshape(-1))
    return buf[_positions(*input_geometry)].reshape(input_geometry[0])


def _gather_ref(spec, g, input_geometry, view_geometry):
    buf = _storage_buffer(input_geometry, view_geometry, _compute_dtype(g))
    buf[_positions(*input_geometry)] = g.reshape(-1)
    return buf[_positions(*view_geometry)].reshape(view_geometry[0])


@op(
    tags=("backward",),
    meta=lambda grad, input_geometry, view_geometry: Spec((tuple(input_geometry[0]), grad._dtype, grad._device)),
    reference=_scatter_ref,
    backward=lambda grad, input_geometry, view_geometry: _strided_gather(grad, input_geometry, view_geometry),
)
def _strided_scatter(grad: Tensor, input_geometry: tuple, view_geometry: tuple) -> Tensor:
    """Values laid out by ``view_geometry`` summed back into ``input_geometry`` (the adjoint of
    :func:`_strided_gather`; the gradient of ``as_strided``). Geometries are ``(shape, stride, offset)``."""


@op(
    tags=("backward",),
    meta=lambda grad, input_geometry, view_geometry: Spec((tuple(view_geometry[0]), grad._dtype, grad._device)),
    reference=_gather_ref,
    backward=lambda grad, input_geometry, view_geometry: _strided_scatter(grad, input_geometry, view_geometry),
)
def _strided_gather(grad: Tensor, input_geometry: tuple, view_geometry: tuple) -> Tensor:
    """The elements ``view_geometry`` selects from a tensor laid out by ``input_geometry``."""


def _zero_ref(spec, g, input_geometry, view_geometry):
    buf = _storage_buffer(input_geometry, view_geometry, g.dtype)
    pos = _positions(*input_geometry)
    buf[pos] = g.reshape(-1)
    buf[_positions(*view_geometry)] = 0
    return buf[pos].reshape(input_geometry[0])


@op(
    tags=("backward",),
    meta=lambda grad, input_geometry, view_geometry: Spec((tuple(input_geometry[0]), grad._dtype, grad._device)),
    reference=_zero_ref,
    backward=lambda grad, input_geometry, view_geometry: _strided_zero(grad, input_geometry, view_geometry),
)
def _strided_zero(grad: Tensor, input_geometry: tuple, view_geometry: tuple) -> Tensor:
    """``grad`` (laid out by ``input_geometry``) with the elements ``view_geometry`` selects set to zero."""
