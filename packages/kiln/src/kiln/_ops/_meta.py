"""Shared pieces of meta functions: broadcasting, type promotion, device checks, dim handling.

Everything a user can get wrong is checked here, with PyTorch's exception types and wording.
Results that depend only on shapes or dtypes are memoised in plain dicts.
"""

from __future__ import annotations

import numbers

import numpy as np

from kiln import _dtype as dt
from kiln._device import CPU
from kiln._tensor import Size, Tensor, _wrap_dim

__all__ = [
    "broadcast_shapes",
    "result_type",
    "common_device",
    "wrap_dim",
    "reduce_dims",
    "can_cast",
    "check_inplace",
    "is_scalar",
]

TOP_LEVEL = (
    "broadcast_shapes",
    "can_cast",
)
"""The names ``kiln`` exports at its top level (as ``torch`` does)."""

wrap_dim = _wrap_dim
_BROADCAST: dict[tuple, tuple] = {}


def is_scalar(x) -> bool:
    """True for the Python (and NumPy) numbers kiln accepts as weak scalar operands."""
    return (isinstance(x, numbers.Number) and not isinstance(x, complex)) or isinstance(x, np.bool_)


def astype(a: np.ndarray, np_dtype: np.dtype, *, copy: bool = False) -> np.ndarray:
    """``a`` converted to ``np_dtype`` in PyTorch's result layout: the layout of a dense input (NumPy's
    "K" order), row-major when a dim is broadcast (NumPy's "K" order would put a stride-0 dim innermost)."""
    return a.astype(np_dtype, order="C" if 0 in a.strides else "K", copy=copy)


def broadcast_shapes(*shapes) -> tuple[int, ...]:
    """The broadcast of several shapes (``torch.broadcast_shapes``): each an int, a tuple, a list or a
    :class:`kiln.Size`; the result is a :class:`kiln.Size`."""
    shapes = [(s,) if isinstance(s, numbers.Integral) else s for s in shapes]
    for s in shapes:
        if not isinstance(s, (tuple, list)):
            raise RuntimeError(f"Input shapes should be of type ints, a tuple of ints, or a list of ints, got {s!r}")
    result = [1] * max((len(s) for s in shapes), default=0)
    for k, s in enumerate(shapes):
        for i in range(-1, -len(s) - 1, -1):
            d = s[i]
            if d < 0:
                raise ValueError("Attempting to broadcast a dimension with negative length!")
            if d == 1 or d == result[i]:
                continue
            if result[i] != 1:
                raise RuntimeError(
                    f"Attempting to broadcast a dimension of length {d} at {i}! Mismatching argument at index {k} "
                    f"had {s!r}; but expected shape should be broadcastable to {result}"
                )
            result[i] = int(d)
    return Size(result)


def _binary_broadcast_error(a: tuple, b: tuple) -> None:
    ndim = max(len(a), len(b))
    for i in range(ndim - 1, -1, -1):
        da = a[i - (ndim - len(a))] if i >= ndim - len(a) else 1
        db = b[i - (ndim - len(b))] if i >= ndim - len(b) else 1
        if da != db and da != 1 and db != 1:
            raise RuntimeError(
                f"The size of tensor a ({da}) must match the size of tensor b ({db}) at non-singleton dimension {i}"
            )


def broadcast_pair(a: tuple, b: tuple) -> tuple:
    """Broadcast two shapes, with PyTorch's message naming tensors a and b."""
    if a == b:
        return a
    key = (a, b)
    r = _BROADCAST.get(key)
    if r is not None:
        return r
    ndim = max(len(a), len(b))
    pa = (1,) * (ndim - len(a)) + a
    pb = (1,) * (ndim - len(b)) + b
    out = []
    for da, db in zip(pa, pb):
        if da == db or db == 1:
            out.append(da)
        elif da == 1:
            out.append(db)
        else:
            _binary_broadcast_error(a, b)
    r = tuple(out)
    if len(_BROADCAST) < 65536:
        _BROADCAST[key] = r
    return r


def result_type(*operands) -> dt.dtype:
    """PyTorch's result type: dimensioned tensors > zero-dim tensors > Python scalars, by category."""
    dim_t = zero_t = scalar_t = None
    for x in operands:
        if isinstance(x, Tensor):
            d = x._dtype
            if x._shape:
                dim_t = d if dim_t is None else dt._PROMOTE[(dim_t, d)]
            else:
                zero_t = d if zero_t is None else dt._PROMOTE[(zero_t, d)]
        elif x is None:
            continue
        else:
            d = _scalar_dtype(x)
            scalar_t = d if scalar_t is None else dt._PROMOTE[(scalar_t, d)]
    return dt.combine_categories(dim_t, dt.combine_categories(zero_t, scalar_t))


def _scalar_dtype(x) -> dt.dtype:
    if isinstance(x, (bool, np.bool_)):
        return dt.bool
    if isinstance(x, numbers.Integral):
        return dt.int64
    if isinstance(x, numbers.Real):
        return dt.get_default_dtype()
    raise TypeError(f"unsupported operand type: {type(x).__name__}")


def common_device(op_name: str, *operands):
    """The device of the tensor operands; 0-dim CPU tensors mix with any device, as in PyTorch."""
    dev = None
    from_cpu_scalar = False
    for x in operands:
        if not isinstance(x, Tensor):
            continue
        d = x._device
        cpu_scalar = d is CPU and not x._shape
        if dev is None:
            dev, from_cpu_scalar = d, cpu_scalar
        elif d is dev:
            from_cpu_scalar = from_cpu_scalar and cpu_scalar
        elif cpu_scalar:
            continue
        elif from_cpu_scalar:
            dev, from_cpu_scalar = d, False
        else:
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found at least two devices, {dev} and {d}!"
            )
    return CPU if dev is None else dev


def can_cast(from_: dt.dtype, to: dt.dtype) -> bool:
    """PyTorch's ``can_cast``: no float to integer, no non-bool to bool."""
    if from_.is_floating_point and not to.is_floating_point:
        return False
    return from_ is dt.bool or to is not dt.bool


_CAST_NAMES = {
    dt.bool: "Bool",
    dt.uint8: "Byte",
    dt.int8: "Char",
    dt.int16: "Short",
    dt.int32: "Int",
    dt.int64: "Long",
    dt.float16: "Half",
    dt.bfloat16: "BFloat16",
    dt.float32: "Float",
    dt.float64: "Double",
}


def scalar_type_name(d: dt.dtype) -> str:
    """PyTorch's ScalarType name for a dtype (``Float``, ``Long``...), used in error messages."""
    return _CAST_NAMES[d]


def check_inplace(self: Tensor, shape: tuple, dtype: dt.dtype) -> None:
    """An in-place result must keep ``self``'s shape and be castable to its dtype."""
    if shape != self._shape:
        raise RuntimeError(f"output with shape {list(self._shape)} doesn't match the broadcast shape {list(shape)}")
    if not can_cast(dtype, self._dtype):
        raise RuntimeError(
            f"result type {_CAST_NAMES[dtype]} can't be cast to the desired output type {_CAST_NAMES[self._dtype]}"
        )


_ALL_DIMS = tuple(tuple(range(n)) for n in range(65))  # every dim of a tensor of n dims: dim=None, made once


def reduce_dims(dim, ndim: int) -> tuple[int, ...]:
    """Normalise a reduction's ``dim`` argument (None, int or sequence) to sorted unique dims."""
    if dim is None:
        return _ALL_DIMS[ndim] if ndim < len(_ALL_DIMS) else tuple(range(ndim))
    if isinstance(dim, int):
        return (wrap_dim(dim, ndim),)
    dims = tuple(wrap_dim(d, ndim) for d in dim)
    if len(set(dims)) != len(dims):
        for d in dims:
            if dims.count(d) > 1:
                raise RuntimeError(f"dim {d} appears multiple times in the list of dims")
    if not dims:
        return tuple(range(ndim))
    return tuple(sorted(dims))
