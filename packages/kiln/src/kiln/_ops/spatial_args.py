"""Argument checks and window geometry shared by the spatial nn ops (pooling, interpolation, padding).

Integer-list and float argument checks with PyTorch's messages, pooling output sizes
(``_pool_out``), window start positions (``_window_positions``) and adaptive-pooling bounds
(``_adaptive_bounds``); backends reuse the last two to lay out their kernels.
"""

from __future__ import annotations

import numbers

import numpy as np

from kiln import _dtype as dt
from kiln._ops._meta import scalar_type_name

__all__ = []


_POSITION = {"kernel_size": 2, "stride": 3, "padding": 4, "dilation": 5, "output_size": 2, "pad": 2}
_ORDINAL = {1: "one int", 2: "two ints", 3: "three ints"}


def _not_implemented(kernel: str, dtype: dt.dtype):
    return NotImplementedError(f"\"{kernel}\" not implemented for '{scalar_type_name(dtype)}'")


def _shape_list(shape) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _check_int_list(fn: str, what: str, value) -> None:
    """PyTorch's argument-parser errors for an ``int[]`` argument holding something else."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, tuple, list)):
        raise TypeError(
            f"{fn}(): argument '{what}' (position {_POSITION[what]}) must be tuple of ints, not {type(value).__name__}"
        )
    if isinstance(value, numbers.Integral):
        return
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            if i == 0:
                raise TypeError(
                    f"{fn}(): argument '{what}' (position {_POSITION[what]}) must be tuple of ints, but found "
                    f"element of type {type(v).__name__} at pos 0"
                )
            raise TypeError(
                f"{fn}(): argument '{what}' failed to unpack the object at pos {i + 1} with error "
                f'"type must be tuple of ints,but got {type(v).__name__}"'
            )


def _ints(value, n: int, what: str, fn: str, *, message: str | None = None) -> tuple[int, ...]:
    """An int or a sequence of ``n`` ints (or of one, repeated) as an ``n``-tuple."""
    _check_int_list(fn, what, value)
    if isinstance(value, numbers.Integral):
        return (int(value),) * n
    if len(value) == 1:
        return (int(value[0]),) * n
    if len(value) != n:
        raise RuntimeError(message or f"{fn}() argument '{what}' should contain {_ORDINAL[n]} (got {len(value)})")
    return tuple(int(v) for v in value)


def _pool_out(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """PyTorch's pooling output length (a window must start inside the input or its left padding)."""
    span = size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)
    out = span // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


# ---------------------------------------------------------------------------------------- validation


def _check_pool_args(k: tuple, s: tuple, p: tuple, d: tuple) -> None:
    """The checks PyTorch's 2-d/3-d pooling entry points share (and 1-d pooling reaches via 2-d)."""
    nd = len(k)
    if not 1 <= nd <= 3 or not len(s) == len(p) == len(d) == nd:
        raise ValueError(f"kernel_size, stride, padding and dilation must be 1 to 3 ints each, got {k}, {s}, {p}, {d}")
    if any(v == 0 for v in s):
        raise RuntimeError("stride should not be zero")
    if any(v <= 0 for v in k):
        if nd == 3:
            raise RuntimeError(f"kernel size should be greater than zero, but got kT: {k[0]} kH: {k[1]} kW: {k[2]}")
        kh, kw = (1, k[0]) if nd == 1 else k
        raise RuntimeError(f"kernel size should be greater than zero, but got kH: {kh} kW: {kw}")
    if any(v < 0 for v in s):
        if nd == 3:
            raise RuntimeError(f"stride should be greater than zero, but got dT: {s[0]} dH: {s[1]} dW: {s[2]}")
        sh, sw = (1, s[0]) if nd == 1 else s
        raise RuntimeError(f"stride should be greater than zero, but got dH: {sh} dW: {sw}")
    for v in p:
        if v < 0:
            raise RuntimeError(f"pad must be non-negative, but got pad: {v}")
    for kk, pp, dd in zip(k, p, d):
        if pp > ((kk - 1) * dd + 1) // 2:
            raise RuntimeError(
                f"pad should be at most half of effective kernel size, but got pad={pp}, kernel_size={kk} and "
                f"dilation={dd}"
            )
    if any(v <= 0 for v in d):
        if nd == 3:
            raise RuntimeError(
                f"dilation should be greater than zero, but got dilationT: {d[0]} dilationH: {d[1]} dilationW: {d[2]}"
            )
        dh, dw = (1, d[0]) if nd == 1 else d
        raise RuntimeError(f"dilation should be greater than zero, but got dilationH: {dh} dilationW: {dw}")
    if any(pp > kk // 2 for kk, pp in zip(k, p)):
        if nd == 3:
            raise RuntimeError(
                "pad should be smaller than or equal to half of kernel size, but got "
                f"kT: {k[0]} kW: {k[2]} kH: {k[1]} padT: {p[0]} padW: {p[2]} padH: {p[1]}"
            )
        raise RuntimeError(
            "pad should be smaller than or equal to half of kernel size, but got "
            f"padW = {p[-1]}, padH = {p[0] if nd == 2 else 0}, kW = {k[-1]}, kH = {k[0] if nd == 2 else 1}"
        )


def _check_pool_input(name: str, shape: tuple, nd: int) -> None:
    """Rank and empty-dim checks of a pooling input ``(N, C, *spatial)`` or ``(C, *spatial)``."""
    n = len(shape)
    if nd == 1:
        if n not in (2, 3):
            raise RuntimeError(
                f"Expected 2 to 3 dimensions, but got {n}-dimensional tensor for argument #1 'self' "
                f"(while checking arguments for {name})"
            )
        if any(v == 0 for v in shape[-2:]):
            shape2 = shape[:-1] + (1, shape[-1])
            raise RuntimeError(
                "Expected 3D or 4D (batch mode) tensor with optional 0 dim batch size for input, but got:"
                + _shape_list(shape2)
            )
        return
    if nd == 2:
        if n not in (3, 4):
            if n < 3 and name.startswith("avg"):
                raise IndexError(
                    f"Dimension out of range (expected to be in range of [{-max(n, 1)}, {max(n, 1) - 1}], but got -3)"
                )
            if not name.startswith("avg"):
                raise RuntimeError("non-empty 3D or 4D (batch mode) tensor expected for input")
        if n not in (3, 4) or any(v == 0 for v in shape[-3:]):
            raise RuntimeError(
                "Expected 3D or 4D (batch mode) tensor with optional 0 dim batch size for input, but got:"
                + _shape_list(shape)
            )
        return
    if n not in (4, 5):
        raise RuntimeError("non-empty 4D or 5D (batch mode) tensor expected for input")
    for i, v in enumerate(shape[-4:]):
        if v == 0:
            raise RuntimeError(
                "max_pool3d_with_indices_out_cpu_template(): Expected input's non-batch dimensions to have "
                f"positive length, but input has a shape of {_shape_list(shape)} and non-batch dimension {i} "
                "has length zero!"
            )


def _check_out_size(shape: tuple, nd: int, out: tuple) -> None:
    if any(o <= 0 for o in out):
        lead = shape[-nd - 1]
        ins = (1,) + shape[-1:] if nd == 1 else shape[-nd:]
        outs = (1,) + out if nd == 1 else out
        fmt = "x".join
        raise RuntimeError(
            f"Given input size: ({fmt(str(v) for v in (lead, *ins))}). Calculated output size: "
            f"({fmt(str(v) for v in (lead, *outs))}). Output size is too small"
        )


def _check_float(kernel: str, d: dt.dtype) -> None:
    if not d.is_floating_point:
        raise _not_implemented(kernel, d)


def _window_positions(out: int, k: int, s: int, p: int, d: int, size: int):
    """Input positions (out, k) of each window element along one dim and whether each is inside."""
    pos = np.arange(out)[:, None] * s - p + np.arange(k)[None, :] * d
    return pos, (pos >= 0) & (pos < size)


# ---------------------------------------------------------------------------------------- adaptive max


def _adaptive_bounds(size: int, out: int):
    """PyTorch's adaptive windows along one dim: ``[floor(i*n/o), ceil((i+1)*n/o))``."""
    i = np.arange(out)
    start = (i * size) // out
    end = -((-(i + 1) * size) // out)
    return start, end
