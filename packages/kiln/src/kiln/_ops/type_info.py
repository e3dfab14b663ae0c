"""Numeric facts and predicates: ``finfo`` and ``iinfo`` (the limits of each dtype), the constants ``pi``,
``e``, ``inf``, ``nan`` and ``newaxis``, and ``typename``, ``is_nonzero``, ``is_same_size``, ``is_signed``,
``is_inference`` and ``get_device`` (also ``Tensor`` methods where PyTorch has them).
"""

from __future__ import annotations

import math

import numpy as np

from kiln import _dtype as dt
from kiln._tensor import Tensor

__all__ = [
    "finfo",
    "iinfo",
    "pi",
    "e",
    "inf",
    "nan",
    "newaxis",
    "typename",
    "is_nonzero",
    "is_same_size",
    "is_signed",
    "is_inference",
    "get_device",
]

TOP_LEVEL = tuple(sorted(__all__))
"""The names ``kiln`` exports at its top level (as ``torch`` does): every public name here."""

pi = math.pi
"""The ratio of a circle's circumference to its diameter, ``3.141592653589793``."""

e = math.e
"""Euler's number, the base of the natural logarithm, ``2.718281828459045``."""

inf = math.inf
"""Positive floating-point infinity."""

nan = math.nan
"""A floating-point not-a-number."""

newaxis = None
"""``None``, for indexing: ``t[:, kiln.newaxis]`` inserts a dim of size 1 (as NumPy's ``newaxis``)."""


def _g(x) -> str:
    return f"{x:g}"


class finfo:  # noqa: N801 - PyTorch's name
    """The numerical properties of a floating dtype (``torch.finfo``): ``bits``, ``eps`` (the gap between 1.0
    and the next value), ``max``, ``min`` (the most negative value), ``tiny`` and ``smallest_normal`` (the
    smallest positive normal number), ``resolution`` (``10 ** -precision``, the decimal precision's step) and
    ``dtype`` (the dtype's name). ``finfo()`` describes the default dtype."""

    __hash__ = None  # unhashable, as PyTorch's

    def __init__(self, type: dt.dtype | None = None):
        d = dt.get_default_dtype() if type is None else type
        if not isinstance(d, dt.dtype):
            raise TypeError(f"finfo(): argument 'type' (position 1) must be kiln.dtype, not {_type_name(d)}")
        if not d.is_floating_point:
            raise TypeError("kiln.finfo() requires a floating point input type. Use kiln.iinfo to handle 'kiln.finfo'")
        info = _numpy_finfo(d)
        self.bits: int = d.itemsize * 8
        self.eps: float = float(info.eps)
        self.max: float = float(info.max)
        self.min: float = float(info.min)
        self.tiny: float = float(info.smallest_normal)
        self.smallest_normal: float = self.tiny
        self.resolution: float = float(10.0 ** -int(info.precision))
        self.dtype: str = d.name

    def __eq__(self, other) -> bool:
        return isinstance(other, finfo) and other.dtype == self.dtype

    def __repr__(self) -> str:
        return (
            f"finfo(resolution={_g(self.resolution)}, min={_g(self.min)}, max={_g(self.max)}, eps={_g(self.eps)}, "
            f"smallest_normal={_g(self.smallest_normal)}, tiny={_g(self.tiny)}, dtype={self.dtype})"
        )


def _numpy_finfo(d: dt.dtype):
    if d is dt.bfloat16:
        import ml_dtypes

        return ml_dtypes.finfo(d.numpy)
    return np.finfo(d.numpy)


def _type_name(x) -> str:
    return type(x).__name__


class iinfo:  # noqa: N801 - PyTorch's name
    """The numerical properties of an integer dtype (``torch.iinfo``): ``bits``, ``max``, ``min`` (Python ints)
    and ``dtype`` (the dtype's name)."""

    __hash__ = None  # unhashable, as PyTorch's

    def __init__(self, type: dt.dtype):
        if not isinstance(type, dt.dtype):
            raise TypeError(f"iinfo(): argument 'type' (position 1) must be kiln.dtype, not {_type_name(type)}")
        if type is dt.bool:
            raise TypeError("kiln.bool is not supported by kiln.iinfo")
        if type.is_floating_point:
            raise TypeError("kiln.iinfo() requires an integer input type. Use kiln.finfo to handle 'kiln.iinfo'")
        info = np.iinfo(type.numpy)
        self.bits: int = type.itemsize * 8
        self.max: int = int(info.max)
        self.min: int = int(info.min)
        self.dtype: str = type.name

    def __eq__(self, other) -> bool:
        return isinstance(other, iinfo) and other.dtype == self.dtype

    def __repr__(self) -> str:
        return f"iinfo(min={_g(self.min)}, max={_g(self.max)}, dtype={self.dtype})"


# ---------------------------------------------------------------------------------------- predicates


def _need_tensor(name: str, arg: str, value, position: int = 1) -> None:
    if not isinstance(value, Tensor):
        raise TypeError(f"{name}(): argument '{arg}' (position {position}) must be Tensor, not {_type_name(value)}")


def typename(obj, /) -> str:
    """The name of ``obj``'s type: a tensor's legacy type (``"kiln.FloatTensor"``), a class's or function's
    own dotted name, a module's name, else the dotted name of its class (builtins without their module)."""
    if isinstance(obj, Tensor):
        return obj.type()
    own = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if isinstance(own, str):
        module = getattr(obj, "__module__", None) or ""
    else:
        module, own = type(obj).__module__ or "", type(obj).__qualname__
    return own if module in ("", "builtins") else f"{module}.{own}"


def is_nonzero(input: Tensor) -> bool:
    """Whether the one element of ``input`` is nonzero (``nan`` is); an error for zero or several elements."""
    _need_tensor("is_nonzero", "input", input)
    n = input.numel()
    if n == 0:
        raise RuntimeError("Boolean value of Tensor with no values is ambiguous")
    if n > 1:
        raise RuntimeError("Boolean value of Tensor with more than one value is ambiguous")
    return bool(input.item() != 0)


def is_same_size(input: Tensor, other: Tensor) -> bool:
    """Whether ``input`` and ``other`` have the same shape (dtypes and devices aside)."""
    _need_tensor("is_same_size", "input", input)
    _need_tensor("is_same_size", "other", other, 2)
    return input._shape == other._shape


def is_signed(input: Tensor) -> bool:
    """Whether ``input``'s dtype holds negative values (floating and signed integer dtypes; not bool or uint8)."""
    _need_tensor("is_signed", "input", input)
    return input._dtype.is_signed


def is_inference(input: Tensor) -> bool:
    """Whether ``input`` was made under :func:`kiln.inference_mode`."""
    _need_tensor("is_inference", "input", input)
    return input.is_inference()


def get_device(input: Tensor) -> int:
    """The index of ``input``'s device, ``-1`` for the CPU."""
    _need_tensor("get_device", "input", input)
    dev = input._device
    return -1 if dev.type == "cpu" else (dev.index or 0)


Tensor.is_nonzero = is_nonzero
Tensor.is_same_size = is_same_size
Tensor.is_signed = is_signed
Tensor.get_device = get_device
