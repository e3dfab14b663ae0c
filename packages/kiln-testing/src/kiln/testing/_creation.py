"""``kiln.testing.make_tensor``: ``torch.testing.make_tensor`` for kiln, on any device.

Values are drawn on the host from kiln's default CPU generator (so ``kiln.manual_seed`` makes them
reproducible) and then moved to the requested device; a ``noncontiguous`` tensor is sliced *on* the
device, so the device sees a strided view of its own storage.
"""

from __future__ import annotations

import collections.abc
import math
import warnings

import ml_dtypes
import numpy as np

import kiln

__all__ = ["make_tensor"]

_FLOATING = (kiln.float16, kiln.bfloat16, kiln.float32, kiln.float64)
_INTEGRAL = (kiln.uint8, kiln.int8, kiln.int16, kiln.int32, kiln.int64)


def _finfo(dtype):
    return ml_dtypes.finfo(dtype.numpy) if dtype is kiln.bfloat16 else np.finfo(dtype.numpy)


def make_tensor(
    *shape,
    dtype: kiln.dtype,
    device,
    low: float | None = None,
    high: float | None = None,
    requires_grad: bool = False,
    noncontiguous: bool = False,
    exclude_zero: bool = False,
    memory_format=None,
) -> kiln.Tensor:
    """A tensor of ``shape`` on ``device`` with values drawn uniformly from ``[low, high)``.

    Defaults for ``low``/``high`` by dtype: bool ``[0, 2)``, uint8 ``[0, 10)``, other integers
    ``[-9, 10)``, floating point ``[-9, 9)``; given bounds are clamped to the dtype's finite range.
    ``noncontiguous`` returns a strided view (when the tensor has more than one element);
    ``exclude_zero`` replaces zeros by 1 (integers, bool) or the dtype's smallest normal number.
    Raises ``ValueError`` for ``requires_grad`` with a non-floating dtype, ``low >= high``, NaN bounds,
    or ``noncontiguous`` together with ``memory_format`` — as ``torch.testing.make_tensor`` does.
    """

    def modify_low_high(low, high, *, lowest_inclusive, highest_exclusive, default_low, default_high):
        low = low if low is not None else default_low
        high = high if high is not None else default_high
        if any(isinstance(v, float) and math.isnan(v) for v in (low, high)):
            raise ValueError(f"`low` and `high` cannot be NaN, but got {low=} and {high=}")
        if low == high and dtype in _FLOATING:
            warnings.warn(
                "Passing `low==high` to `kiln.testing.make_tensor` for floating types is deprecated "
                "(as in PyTorch). Use `kiln.full(...)` instead.",
                FutureWarning,
                stacklevel=3,
            )
        elif low >= high:
            raise ValueError(f"`low` must be less than `high`, but got {low} >= {high}")
        elif high < lowest_inclusive or low >= highest_exclusive:
            raise ValueError(
                f"The value interval specified by `low` and `high` is [{low}, {high}), "
                f"but {dtype} only supports [{lowest_inclusive}, {highest_exclusive})"
            )
        low = min(max(low, lowest_inclusive), highest_exclusive)
        high = min(max(high, lowest_inclusive), highest_exclusive)
        if dtype is kiln.bool or dtype in _INTEGRAL:
            return math.ceil(low), math.ceil(high)
        return low, high

    if len(shape) == 1 and isinstance(shape[0], collections.abc.Sequence):
        shape = shape[0]
    shape = tuple(int(s) for s in shape)
    if noncontiguous and memory_format is not None:
        raise ValueError(
            "The parameters `noncontiguous` and `memory_format` are mutually exclusive, "
            f"but got {noncontiguous=} and {memory_format=}"
        )
    if requires_grad and dtype not in _FLOATING:
        raise ValueError(f"`requires_grad=True` is not supported for boolean and integral dtypes, but got {dtype=}")
    noncontiguous = noncontiguous and math.prod(shape) > 1
    if noncontiguous:
        shape = (*shape[:-1], 2 * shape[-1])

    if dtype is kiln.bool:
        low, high = modify_low_high(low, high, lowest_inclusive=0, highest_exclusive=2, default_low=0, default_high=2)
        result = kiln.randint(low, high, shape, dtype=kiln.int64).to(kiln.bool)
    elif dtype in _INTEGRAL:
        info = np.iinfo(dtype.numpy)
        low, high = modify_low_high(
            low,
            high,
            lowest_inclusive=int(info.min),
            highest_exclusive=int(info.max) + (1 if dtype is not kiln.int64 else 0),
            default_low=0 if dtype is kiln.uint8 else -9,
            default_high=10,
        )
        result = kiln.randint(low, high, shape, dtype=dtype)
    elif dtype in _FLOATING:
        info = _finfo(dtype)
        low, high = modify_low_high(
            low,
            high,
            lowest_inclusive=float(info.min),
            highest_exclusive=float(info.max),
            default_low=-9,
            default_high=9,
        )
        u = kiln.rand(shape, dtype=kiln.float64)
        if high - low >= float(np.finfo(np.float64).max):  # the span itself would overflow: draw half of it
            result = (u * (high / 2 - low / 2) + low / 2) * 2
        else:
            result = u * (high - low) + low
        result = result.to(dtype)
    else:
        raise TypeError(f"The requested dtype '{dtype}' is not supported by kiln.testing.make_tensor().")

    if exclude_zero:
        tiny = 1 if dtype is kiln.bool or dtype in _INTEGRAL else float(_finfo(dtype).tiny)
        result = kiln.where(result == 0, kiln.full((), tiny, dtype=dtype), result)
    result = result.to(device)
    if noncontiguous:
        result = result[..., 1::2]
    elif memory_format is not None:
        result = result.clone(memory_format=memory_format)
    if requires_grad:
        result.requires_grad_(True)
    return result
