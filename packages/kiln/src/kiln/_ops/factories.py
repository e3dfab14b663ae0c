"""More factory functions: ``logspace``, ``range`` (deprecated in PyTorch: it warns), ``empty_strided``,
``scalar_tensor``, ``tril_indices``/``triu_indices``, the legacy ``Tensor.new`` and
``Tensor.new_empty_strided``; and the default device (``get_default_device``/``set_default_device``), which
every factory function honours when it is given no ``device``.

Values are computed on the host and copied to their device, as :mod:`kiln._ops.creation` does.
"""

from __future__ import annotations

import math
import numbers
import warnings

import numpy as np

from kiln import _dtype as dt
from kiln._device import device as Device
from kiln._memory_format import strided
from kiln._ops._meta import is_scalar, scalar_type_name
from kiln._ops.copy import _DEFAULT_DEVICE, from_host, resolve_device
from kiln._ops.creation import (
    _allocating,
    _dtype_arg,
    _empty,
    _finish,
    _range_number,
    _scalar_value,
    _takes_out,
    _unsupported,
    linspace,
)
from kiln._ops.views import _shape_arg, check_storage_size
from kiln._tensor import Tensor, _make, storage_span

__all__ = [
    "logspace",
    "range",
    "empty_strided",
    "scalar_tensor",
    "tril_indices",
    "triu_indices",
    "get_default_device",
    "set_default_device",
]

TOP_LEVEL = tuple(sorted(__all__))
"""The names ``kiln`` exports at its top level (as ``torch`` does): every public name here."""


# ---------------------------------------------------------------------------------------- default device


def get_default_device() -> Device:
    """The device factory functions create tensors on when given no ``device`` (the CPU unless
    :func:`set_default_device` said otherwise in this thread)."""
    return resolve_device(None)


def set_default_device(device) -> None:
    """Make ``device`` the device that factory functions (``zeros``, ``rand``, ``tensor``, ``arange`` ...)
    create tensors on when given no ``device``, in this thread (``None``: the CPU again). Functions that share
    memory with their input (``from_numpy``, ``as_tensor`` of a tensor) and the ``_like`` functions, which
    follow their input, are not affected."""
    _DEFAULT_DEVICE.device = None if device is None else resolve_device(device)


# ---------------------------------------------------------------------------------------- ranges


@_takes_out
@_allocating
def logspace(
    start,
    end,
    steps: int,
    base: float = 10.0,
    *,
    out=None,
    dtype=None,
    layout=strided,
    device=None,
    requires_grad: bool = False,
) -> Tensor:
    """``steps`` values from ``base ** start`` to ``base ** end`` inclusive, evenly spaced in the exponent."""
    _unsupported(layout=layout)
    d = _dtype_arg(dtype) or dt.get_default_dtype()
    if d is dt.bool:
        raise NotImplementedError(f"\"logspace_cpu\" not implemented for '{scalar_type_name(d)}'")
    exponents = linspace(_scalar_value(start), _scalar_value(end), steps, dtype=dt.float64)
    from kiln._ops.copy import host_array

    with np.errstate(over="ignore"):
        values = np.power(float(base), host_array(exponents))
    if not d.is_floating_point:
        values = np.trunc(values)
    return _finish(from_host(values, d, resolve_device(device)), requires_grad)


@_takes_out
@_allocating
def range(  # noqa: A001 - PyTorch's name; the module uses no builtin range
    start=0,
    end=None,
    step=1,
    *,
    out=None,
    dtype=None,
    layout=strided,
    device=None,
    requires_grad: bool = False,
) -> Tensor:
    """Values from ``start`` to ``end`` *inclusive*, ``step`` apart, in the default dtype unless ``dtype``
    says otherwise. Deprecated, as in PyTorch (it warns): use :func:`kiln.arange`, which excludes ``end``."""
    if end is None:
        raise TypeError('range() missing 1 required positional arguments: "end"')
    _unsupported(layout=layout)
    warnings.warn(
        "kiln.range is deprecated and will be removed in a future release because its behavior is inconsistent "
        "with Python's range builtin. Instead, use kiln.arange, which produces values in [start, end).",
        UserWarning,
        stacklevel=3,
    )
    start, end, step = _scalar_value(start), _scalar_value(end), _scalar_value(step)
    for v in (start, end, step):
        if not is_scalar(v):
            raise TypeError(f"range(): expected a number, got {type(v).__name__}")
    d = _dtype_arg(dtype) or dt.get_default_dtype()
    if d is dt.bool:
        raise NotImplementedError(f"\"range_cpu\" not implemented for '{scalar_type_name(d)}'")
    if not (math.isfinite(start) and math.isfinite(end)):
        raise RuntimeError(f"unsupported range: {_range_number(start)} -> {_range_number(end)}")
    if step == 0:
        raise RuntimeError("step must be nonzero")
    if (step > 0 and end < start) or (step < 0 and end > start):
        raise RuntimeError("upper bound and lower bound inconsistent with step sign")
    n = math.floor((float(end) - float(start)) / float(step)) + 1
    check_storage_size((n,), d)
    values = float(start) + np.arange(n, dtype=np.float64) * float(step)
    return _finish(from_host(values, d, resolve_device(device)), requires_grad)


# ---------------------------------------------------------------------------------------- strided and 0-d


def _strided_tensor(size, stride, d: dt.dtype, dev) -> Tensor:
    """An uninitialised tensor of ``size`` with the strides ``stride`` over a storage just large enough."""
    size, stride = _shape_arg(size), _shape_arg(stride, "stride")
    if len(size) != len(stride):
        raise RuntimeError(
            f"dimensionality of sizes ({len(size)}) must match dimensionality of strides ({len(stride)})"
        )
    for s in size:
        if s < 0:
            raise RuntimeError(f"Trying to create tensor with negative dimension {s}: {list(size)}")
    if any(s < 0 for s in stride):
        raise RuntimeError(f"Storage size calculation overflowed with sizes={list(size)} and strides={list(stride)}")
    check_storage_size(size, d, stride)
    storage = _empty((storage_span(size, stride),), d, dev)._storage
    return _make(storage, size, stride, 0, d, dev)


@_allocating
def empty_strided(
    size, stride, *, dtype=None, layout=strided, device=None, requires_grad: bool = False, pin_memory: bool = False
) -> Tensor:
    """An uninitialised tensor of shape ``size`` with the strides ``stride`` (in elements)."""
    _unsupported(layout=layout, pin_memory=pin_memory)
    d = _dtype_arg(dtype) or dt.get_default_dtype()
    return _finish(_strided_tensor(size, stride, d, resolve_device(device)), requires_grad)


def _new_empty_strided(
    self: Tensor,
    size,
    stride,
    *,
    dtype=None,
    layout=strided,
    device=None,
    requires_grad: bool = False,
    pin_memory=False,
) -> Tensor:
    """An uninitialised tensor of ``size`` and ``stride``, with this tensor's dtype and device by default."""
    _unsupported(layout=layout, pin_memory=pin_memory)
    d = _dtype_arg(dtype) or self._dtype
    dev = self._device if device is None else resolve_device(device)
    return _finish(_strided_tensor(size, stride, d, dev), requires_grad)


def scalar_tensor(
    s, *, dtype=None, layout=strided, device=None, pin_memory: bool = False, requires_grad: bool = False
) -> Tensor:
    """A 0-d tensor holding the number ``s``, in the default dtype unless ``dtype`` says otherwise."""
    from kiln._ops.creation import full

    _unsupported(layout=layout, pin_memory=pin_memory)
    s = _scalar_value(s)
    if not is_scalar(s):
        raise TypeError(f"scalar_tensor(): argument 's' (position 1) must be Number, not {type(s).__name__}")
    return full((), s, dtype=_dtype_arg(dtype) or dt.get_default_dtype(), device=device, requires_grad=requires_grad)


# ---------------------------------------------------------------------------------------- triangle indices


def _triangle_indices(name: str, row, col, offset, dtype, device, layout, lower: bool) -> Tensor:
    _unsupported(layout=layout)
    for arg, v in (("row", row), ("col", col), ("offset", offset)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise TypeError(f"{name}(): argument '{arg}' must be int, not {type(v).__name__}")
    if row < 0:
        raise RuntimeError(f"row must be non-negative, got{row}")
    if col < 0:
        raise RuntimeError(f"col must be non-negative, got{col}")
    d = _dtype_arg(dtype) or dt.int64
    if d not in (dt.int32, dt.int64):
        raise NotImplementedError(f"\"{name}\" not implemented for '{scalar_type_name(d)}'")
    pick = np.tril_indices if lower else np.triu_indices
    rows, cols = pick(int(row), int(offset), int(col)) if row and col else ((), ())
    values = np.array([rows, cols], dtype=np.int64).reshape(2, -1)
    return from_host(values, d, resolve_device(device))


def tril_indices(row: int, col: int, offset: int = 0, *, dtype=dt.int64, device=None, layout=strided) -> Tensor:
    """The coordinates of the lower triangle (on and below diagonal ``offset``) of a ``row x col`` matrix:
    a ``2 x N`` tensor of row indices over column indices, in row-major order."""
    return _triangle_indices("tril_indices", row, col, offset, dtype, device, layout, True)


def triu_indices(row: int, col: int, offset: int = 0, *, dtype=dt.int64, device=None, layout=strided) -> Tensor:
    """The coordinates of the upper triangle (on and above diagonal ``offset``) of a ``row x col`` matrix:
    a ``2 x N`` tensor of row indices over column indices, in row-major order."""
    return _triangle_indices("triu_indices", row, col, offset, dtype, device, layout, False)


# ---------------------------------------------------------------------------------------- Tensor.new


def _tensor_new(self: Tensor, *args, **kwargs) -> Tensor:
    """The legacy constructor with this tensor's dtype and device: ``t.new(2, 3)`` (uninitialised),
    ``t.new([1, 2])`` (data), ``t.new()`` (empty), ``t.new(other)`` (an alias of ``other``, which must have
    this tensor's dtype and device); ``device=`` may name another device."""
    from kiln._ops.legacy import _legacy_new, _options

    device = kwargs.pop("device", None)
    dev = self._device if device is None else resolve_device(device)
    if len(args) == 1 and isinstance(args[0], Tensor) and not kwargs:
        other = args[0]
        if other._dtype is not self._dtype or other._device != dev:
            raise TypeError(f"expected {_options(self._dtype, dev)} (got {_options(other._dtype, other._device)})")
        return other.view_as(other)
    t = _legacy_new(self._dtype, args, kwargs)  # built on the CPU, with the legacy constructor's rules
    return t if t._device == dev else t.to(dev)


Tensor.new = _tensor_new
Tensor.new_empty_strided = _new_empty_strided
