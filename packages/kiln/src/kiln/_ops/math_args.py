"""Shared by the elementwise math modules: argument checks with PyTorch's messages, operand rounding (the
half-type rounding of :mod:`.elementwise`), the binary reference helper and the tables of PyTorch's C++
dtype names (``TypeMeta`` names, overflow messages' scalar types) and float maxima.
"""

from __future__ import annotations

import numpy as np

from kiln import _dtype as dt
from kiln._ops._meta import is_scalar, scalar_type_name
from kiln._ops.elementwise import (
    _HALF,
    _arg,
    _compute_np,
)
from kiln._tensor import Tensor

__all__ = []


Number = "int | float | bool"

# C++ names PyTorch prints for dtypes: ``TypeMeta`` names (lerp's dtype checks) and the scalar types of
# ``value cannot be converted to type ... without overflow``.
_TYPEMETA_NAMES = {
    dt.bool: "bool",
    dt.uint8: "unsigned char",
    dt.int8: "signed char",
    dt.int16: "short int",
    dt.int32: "int",
    dt.int64: "long int",
    dt.float16: "c10::Half",
    dt.bfloat16: "c10::BFloat16",
    dt.float32: "float",
    dt.float64: "double",
}
_CTYPE_NAMES = {
    dt.uint8: "uint8_t",
    dt.int8: "int8_t",
    dt.int16: "int16_t",
    dt.int32: "int",
    dt.int64: "int64_t",
    dt.float16: "c10::Half",
    dt.bfloat16: "c10::BFloat16",
    dt.float32: "float",
    dt.float64: "double",
}
_FLOAT_MAX = {
    dt.float16: 65504.0,
    dt.bfloat16: 3.3895313892515355e38,
    dt.float32: 3.4028234663852886e38,
    dt.float64: 1.7976931348623157e308,
}


def _need_tensor(x, name: str, position: int, op_name: str) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{op_name}(): argument '{name}' (position {position}) must be Tensor, not {type(x).__name__}")


def _need_number(x, name: str, op_name: str) -> None:
    if not is_scalar(x):
        raise TypeError(f"{op_name}(): argument '{name}' must be Number, not {type(x).__name__}")


def _need_tensor_or_number(x, name: str, op_name: str) -> None:
    if not isinstance(x, Tensor) and not is_scalar(x):
        raise TypeError(
            f"{op_name}() received an invalid combination of arguments - argument '{name}' must be Tensor or "
            f"Number, not {type(x).__name__}"
        )


def _not_implemented(kernel: str, d: dt.dtype) -> NotImplementedError:
    return NotImplementedError(f"\"{kernel}\" not implemented for '{scalar_type_name(d)}'")


def _copy(a: np.ndarray) -> np.ndarray:
    """A copy keeping the layout: a kernel must never hand back (a view of) its input's memory."""
    return np.array(a, copy=True, order="K")


def _as_float(a: np.ndarray) -> np.ndarray:
    """bfloat16 (an ``ml_dtypes`` array) as float32 for the NumPy functions that lack it."""
    return a.astype(np.float32) if a.dtype.kind == "V" else a


def _rounded(x, spec):
    """PyTorch casts operands to the common dtype before computing: a wider operand of a half-precision
    result (a 0-d float64 tensor with a float16 one) is rounded to it first."""
    d = spec.dtype
    if d in _HALF and isinstance(x, np.ndarray) and x.dtype != d.numpy:
        return x.astype(d.numpy)
    return x


def _operand(x, spec):
    """An operand in the compute dtype of result dtype ``spec.dtype`` (see :func:`_rounded`)."""
    return _arg(_rounded(x, spec), _compute_np(spec.dtype), spec.dtype)


def _binary_ref(np_fn):
    """Reference kernel ``np_fn(a, b)`` in the compute dtype of the result (see :func:`_operand`)."""
    return lambda spec, a, b: np_fn(_operand(a, spec), _operand(b, spec))
