"""Counting values: ``bincount`` and ``histc`` (ops with data-dependent or value-binned outputs)."""

from __future__ import annotations

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops._meta import scalar_type_name
from kiln._ops.elementwise import _compute_np
from kiln._spec import Spec
from kiln._tensor import Tensor

__all__ = ["bincount", "histc"]

TOP_LEVEL = __all__
"""The names ``kiln`` exports at its top level (as ``torch`` does): every public name here."""


def _bincount_meta(input, weights=None, minlength=0):
    if input._dtype.is_floating_point or input._dtype is dt.bool:
        raise NotImplementedError(f"\"bincount_cpu\" not implemented for '{scalar_type_name(input._dtype)}'")
    if len(input._shape) != 1:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    if weights is not None and (len(weights._shape) != 1 or weights._shape[0] != input._shape[0]):
        raise RuntimeError("weights should be 1-d and have the same length as input")
    n = input._shape[0]
    if n:
        from kiln._ops.reduction import amax, amin

        host = input.to("cpu")
        if int(amin(host).item()) < 0:
            raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
        length = max(int(amax(host).item()) + 1, minlength)
    else:
        length = minlength
    if weights is None:
        d = dt.int64
    else:
        d = weights._dtype if weights._dtype is dt.float32 else dt.float64
    return Spec(((length,), d, input._device))


def _bincount_ref(spec, a, weights=None, minlength=0):
    w = None if weights is None else weights.astype(np.float64)
    return np.bincount(a.astype(np.int64), w, minlength=spec.shape[0])[: spec.shape[0]]


@op(tags=("index",), meta=_bincount_meta, reference=_bincount_ref, methods=("bincount",))
def bincount(input: Tensor, weights: Tensor | None = None, minlength: int = 0) -> Tensor:
    """Count of each value in the non-negative 1-D integer ``input`` (or the sum of its ``weights``)."""


# ---------------------------------------------------------------------------------------- histc


def _histc_meta(input, bins=100, min=0, max=0):
    if not input._dtype.is_floating_point:
        raise NotImplementedError(f"\"histogram_cpu\" not implemented for '{scalar_type_name(input._dtype)}'")
    if bins <= 0:
        raise RuntimeError(f"kiln.histogram(): bins must be > 0, but got {bins} for dimension 0")
    if min > max:
        raise RuntimeError("kiln.histc: max must be larger than min")
    return Spec(((bins,), input._dtype, input._device))


def _histc_ref(spec, a, bins=100, min=0, max=0):
    compute = _compute_np(spec.dtype)
    x = a.reshape(-1).astype(compute)
    lo, hi = compute.type(min), compute.type(max)
    if lo == hi and x.size:
        lo, hi = x.min(), x.max()
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    x = x[(x >= lo) & (x <= hi)]
    pos = ((x - lo) * bins / (hi - lo)).astype(np.int64)
    pos = np.minimum(pos, bins - 1)
    return np.bincount(pos, minlength=bins).astype(compute)


@op(tags=("index",), meta=_histc_meta, reference=_histc_ref, methods=("histc",))
def histc(input: Tensor, bins: int = 100, min: float = 0, max: float = 0) -> Tensor:
    """Histogram of ``input`` in ``bins`` equal bins over ``[min, max]`` (the data's range when both are 0)."""
