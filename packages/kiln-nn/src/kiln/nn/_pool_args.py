"""Argument parsing and checks of the pooling functions kiln-nn composes (3-d pooling, unpooling,
fractional pooling), with PyTorch's messages: its argument parser's ``TypeError`` for an ``int[]``
argument holding something else, and the shape checks of its pooling kernels."""

from __future__ import annotations

import numbers

from kiln import Tensor

_WORDS = {1: "one int", 2: "two ints", 3: "three ints"}


def shape_list(shape) -> str:
    """``[2, 3, 4]``: a shape as PyTorch prints it in messages."""
    return "[" + ", ".join(str(int(s)) for s in shape) + "]"


def check_int_list(fn: str, what: str, position: int, value) -> None:
    """PyTorch's argument-parser ``TypeError`` when ``value`` is not an int or a sequence of ints."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, tuple, list)):
        raise TypeError(
            f"{fn}(): argument '{what}' (position {position}) must be tuple of ints, not {type(value).__name__}"
        )
    if isinstance(value, numbers.Integral):
        return
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            if i == 0:
                raise TypeError(
                    f"{fn}(): argument '{what}' (position {position}) must be tuple of ints, but found element of "
                    f"type {type(v).__name__} at pos 0"
                )
            raise TypeError(
                f"{fn}(): argument '{what}' failed to unpack the object at pos {i + 1} with error "
                f'"type must be tuple of ints,but got {type(v).__name__}"'
            )


def int_tuple(value, n: int, fn: str, what: str, position: int, message: str | None = None) -> tuple[int, ...]:
    """An int, or a sequence of one or ``n`` ints, as an ``n``-tuple (``message``: PyTorch's error for
    another length, else its argument parser's)."""
    check_int_list(fn, what, position, value)
    if isinstance(value, numbers.Integral):
        return (int(value),) * n
    if len(value) == 1:
        return (int(value[0]),) * n
    if len(value) != n:
        raise RuntimeError(message or f"{fn}() argument '{what}' should contain {_WORDS[n]} (got {len(value)})")
    return tuple(int(v) for v in value)


def ntuple(value, n: int) -> tuple:
    """A sequence as a tuple, anything else repeated ``n`` times (``torch.nn.modules.utils._ntuple``)."""
    if isinstance(value, (tuple, list)):
        return tuple(value)
    return (value,) * n


def pool_out(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """PyTorch's pooling output length: a window must start inside the input or its left padding."""
    span = size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)
    out = span // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def check_3d_input(fn: str, input: Tensor) -> None:
    """A 3-d pooling input is ``(N, C, D, H, W)`` or ``(C, D, H, W)`` with non-empty non-batch dims."""
    shape = tuple(input.shape)
    if len(shape) not in (4, 5):
        raise RuntimeError("non-empty 4D or 5D (batch mode) tensor expected for input")
    for i in range(1, len(shape)):  # dim 0 counts as the batch dim, even for unbatched input
        if shape[i] == 0:
            raise RuntimeError(
                f"{fn}(): Expected input's non-batch dimensions to have positive length, but input has a shape of "
                f"{shape_list(shape)} and non-batch dimension {i - 1} has length zero!"
            )


def check_pool_window(k, s, p) -> None:
    """The window checks of PyTorch's 3-d pooling (``pooling_output_shape`` and ``pool3d_shape_check``)."""
    if any(v == 0 for v in s):
        raise RuntimeError("stride should not be zero")
    for kk, pp in zip(k, p):
        if pp < 0:
            raise RuntimeError(f"pad must be non-negative, but got pad: {pp}")
        if pp > int(kk / 2):  # PyTorch's ((k - 1) * dilation + 1) / 2 in C++ integer division
            raise RuntimeError(
                f"pad should be at most half of effective kernel size, but got pad={pp}, kernel_size={kk} and "
                "dilation=1"
            )
    if any(v <= 0 for v in k):
        raise RuntimeError(f"kernel size should be greater than zero, but got kT: {k[0]} kH: {k[1]} kW: {k[2]}")
    if any(v <= 0 for v in s):
        raise RuntimeError(f"stride should be greater than zero, but got dT: {s[0]} dH: {s[1]} dW: {s[2]}")


_SCALAR_TYPE_NAMES = {
    "float32": "Float",
    "float64": "Double",
    "float16": "Half",
    "bfloat16": "BFloat16",
    "int64": "Long",
    "int32": "Int",
    "int16": "Short",
    "int8": "Char",
    "uint8": "Byte",
    "bool": "Bool",
}


def scalar_type_name(dtype) -> str:
    """PyTorch's ScalarType name of a dtype (``Float``, ``Long``...), as its messages print it."""
    return _SCALAR_TYPE_NAMES.get(dtype.name, dtype.name)


def not_implemented(kernel: str, dtype) -> NotImplementedError:
    """PyTorch's error for a kernel that has no version for ``dtype``."""
    return NotImplementedError(f"\"{kernel}\" not implemented for '{scalar_type_name(dtype)}'")
