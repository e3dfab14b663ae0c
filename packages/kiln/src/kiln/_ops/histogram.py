"""Counting values: ``bincount`` and ``histc`` (ops with data-dependent or value-binned outputs), and
``histogram``/``histogramdd`` (composites of ``searchsorted`` and ``bincount``)."""

from __future__ import annotations

import builtins

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op, with_out
from kiln._ops._meta import scalar_type_name
from kiln._ops.elementwise import _compute_np
from kiln._ops.reduction import _return_type
from kiln._spec import Spec
from kiln._tensor import Tensor

__all__ = ["bincount", "histc", "histogram", "histogramdd"]

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


# ---------------------------------------------------------------------------------------- histogram, histogramdd


def _fmt(x: float) -> str:
    return f"{x:g}"  # a double as C++ streams print it: 3, 0.5, inf, nan


def _histogramdd_edges(x: Tensor, bins, range, name: str) -> list[Tensor]:
    """The bin edges per dim of the samples ``x`` (``N x D``): given tensors, or ``bins[i] + 1`` evenly spaced
    edges over ``range`` (the samples' own range by default, widened by 0.5 on each side when it is one value)."""
    from kiln._ops.creation import linspace
    from kiln._ops.math_args import _TYPEMETA_NAMES

    d = x.shape[1]
    if isinstance(bins, Tensor) or (isinstance(bins, (list, tuple)) and bins and isinstance(bins[0], Tensor)):
        edges = [bins] if isinstance(bins, Tensor) else list(bins)
        if len(edges) != d:
            raise RuntimeError("histogramdd: The size of bins must be equal to the innermost dimension of the input.")
        for i, e in enumerate(edges):
            if e.dtype is not x.dtype:
                raise RuntimeError(
                    "kiln.histogramdd: input tensor and bins tensors should have the same dtype, but got input with "
                    f"dtype {_TYPEMETA_NAMES[x.dtype]} and bins for dimension {i} with dtype {_TYPEMETA_NAMES[e.dtype]}"
                )
        return [e.reshape(-1) for e in edges]
    counts = [bins] * d if isinstance(bins, int) else list(bins)
    if len(counts) != d:
        raise RuntimeError("histogramdd: The size of bins must be equal to the innermost dimension of the input.")
    for i, n in enumerate(counts):
        if n <= 0:
            raise RuntimeError(f"kiln.{name}(): bins must be > 0, but got {n} for dimension {i}")
    bounds = None if range is None else [float(r) for r in range]
    if bounds is not None and len(bounds) != 2 * d:
        raise RuntimeError(
            f"kiln.histogramdd: for a {d}-dimensional histogram range should have {2 * d} elements, but got "
            f"{len(bounds)}"
        )
    edges = []
    for i, n in enumerate(counts):
        if bounds is not None:
            lo, hi = bounds[2 * i], bounds[2 * i + 1]
        elif x.shape[0] == 0:
            lo, hi = 0.0, 1.0
        else:
            column = x[:, i]
            lo, hi = float(column.min().item()), float(column.max().item())
        if lo > hi:
            raise RuntimeError(
                f"kiln.histogramdd: min should not exceed max, but got min {_fmt(lo)} max {_fmt(hi)} for dimension {i}"
            )
        if not (np.isfinite(lo) and np.isfinite(hi)):
            raise RuntimeError(f"kiln.histogramdd: dimension {i}'s range [{_fmt(lo)}, {_fmt(hi)}] is not finite")
        if lo == hi:
            lo, hi = lo - 0.5, hi + 0.5
        edges.append(linspace(lo, hi, n + 1, dtype=x.dtype, device=x.device))
    return edges


_HistogramResult = _return_type("histogram", ("hist", "bin_edges"))
_HistogramddResult = _return_type("histogramdd", ("hist", "bin_edges"))


def _histogramdd(input, bins, range, weight, density, name):
    from kiln._ops.sort import searchsorted

    if not isinstance(input, Tensor):
        raise TypeError(f"{name}(): argument 'input' (position 1) must be Tensor, not {type(input).__name__}")
    if not input.dtype.is_floating_point:
        raise NotImplementedError(f"\"histogramdd\" not implemented for '{scalar_type_name(input.dtype)}'")
    if input.dim() < 2:
        raise RuntimeError("kiln.histogramdd: input tensor should have at least 2 dimensions")
    x = input.reshape(-1, input.shape[-1])
    if weight is not None and tuple(weight.shape) != tuple(input.shape[:-1]):
        raise RuntimeError(
            "kiln.histogramdd: if weight tensor is provided it should have the same shape as the input tensor "
            f"excluding its innermost dimension, but got input with shape {list(input.shape)} and weight with shape "
            f"{list(weight.shape)}"
        )
    edges = _histogramdd_edges(x, bins, range, name)
    counts = [e.shape[0] - 1 for e in edges]
    total = 1
    for n in counts:
        total *= max(n, 0)
    flat = None
    valid = None
    for i, (e, n) in enumerate(zip(edges, counts)):
        column = x[:, i]
        if n <= 0:
            inside = column != column  # no bins: nothing counts
            pos = column.to(dt.int64) * 0
        else:
            pos = searchsorted(e, column.contiguous(), right=True) - 1
            pos = pos.where(column != e[-1], n - 1).clamp(0, n - 1)
            inside = (column >= e[0]) & (column <= e[-1])
        flat = pos if flat is None else flat * max(n, 1) + pos
        valid = inside if valid is None else valid & inside
    flat = flat.where(valid, total) if x.shape[0] else flat
    w = None if weight is None else weight.reshape(-1).to(dt.float64)
    hist = bincount(flat, w, minlength=total + 1)[:total].to(input.dtype).reshape(counts)
    if density:
        volume = None
        for i, e in enumerate(edges):
            width = (e[1:] - e[:-1]).reshape([-1 if j == i else 1 for j in builtins.range(len(edges))])
            volume = width if volume is None else volume * width
        hist = hist / (hist.sum() * volume)
    return hist, tuple(edges)


@with_out
def histogram(input: Tensor, bins, *, range=None, weight: Tensor | None = None, density: bool = False):
    """``(hist, bin_edges)``: the histogram of all elements of a floating ``input`` over ``bins`` (a count of
    equal bins over ``range``, the elements' own range by default; or a 1-D tensor of increasing edges, the
    last one inclusive), counting ``weight`` per element if given; ``density`` normalises it to a density."""
    if not isinstance(input, Tensor):
        raise TypeError(f"histogram(): argument 'input' (position 1) must be Tensor, not {type(input).__name__}")
    hist, edges = _histogramdd(
        input.reshape(-1, 1), bins, range, None if weight is None else weight.reshape(-1), density, "histogram"
    )
    return _HistogramResult(hist, edges[0])


@with_out
def histogramdd(input: Tensor, bins, *, range=None, weight: Tensor | None = None, density: bool = False):
    """``(hist, bin_edges)``: the ``D``-dimensional histogram of the points in the rows of ``input`` (last dim
    ``D``): ``bins`` is an int, one int per dim or one tensor of edges per dim; ``range`` ``[lo0, hi0, lo1,
    ...]``; ``bin_edges`` is a tuple of ``D`` tensors."""
    hist, edges = _histogramdd(input, bins, range, weight, density, "histogramdd")
    return _HistogramddResult(hist, edges)


Tensor.histogram = histogram
