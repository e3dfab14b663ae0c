"""Statistics: ``cov``/``corrcoef``, ``aminmax``, ``nanmedian``, ``quantile``/``nanquantile`` (composites of
sorting, gathering and arithmetic, so their gradients come from those ops) and ``mode`` (an op with a reference
kernel; its gradient goes to the element its index names).

Ties are broken as PyTorch's CPU kernels break them in the cases checked: a median is the
``(n - 1) // 2``-th element of a stable sort, a mode the smallest of the most frequent values, at its last
position.
"""

from __future__ import annotations

import warnings

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops._meta import is_scalar, scalar_type_name, wrap_dim
from kiln._ops.comparison import eq
from kiln._ops.elementwise import isnan, logical_not, where
from kiln._ops.math_args import _need_tensor
from kiln._ops.reduction import _dim_extreme_backward, _reduced_shape, _return_type, amax, amin
from kiln._spec import DimSpec
from kiln._tensor import Tensor, _numel

__all__ = ["cov", "corrcoef", "aminmax", "nanmedian", "quantile", "nanquantile", "mode"]

TOP_LEVEL = __all__
"""The names ``kiln`` exports at its top level (as ``torch`` does): every public name here."""

_AminmaxResult = _return_type("aminmax", ("min", "max"))
_NanmedianResult = _return_type("nanmedian")
_ModeResult = _return_type("mode")


# ---------------------------------------------------------------------------------------- cov, corrcoef


def _check_weights(name: str, w, observations: int, integral: bool):
    if w is None:
        return
    _need_tensor(w, name, 1, "cov")
    if w.dim() > 1:
        raise RuntimeError(
            f"cov(): expected {name} to have one or fewer dimensions but got {name} with {w.dim()} dimensions"
        )
    if integral and (w.dtype.is_floating_point or w.dtype is dt.bool):
        raise RuntimeError(
            f"cov(): expected {name} to have integral dtype but got {name} with {scalar_type_name(w.dtype)} dtype"
        )
    if not integral and not w.dtype.is_floating_point:
        raise RuntimeError(
            f"cov(): expected {name} to have floating point dtype but got {name} with {scalar_type_name(w.dtype)} dtype"
        )
    if w.numel() != observations:
        raise RuntimeError(
            f"cov(): expected {name} to have the same numel as there are observations in the input but got "
            f"{w.numel()} != {observations}"
        )
    if bool((w < 0).any()):
        raise RuntimeError(f"cov(): {name} cannot be negative")


def cov(
    input: Tensor, *, correction: int = 1, fweights: Tensor | None = None, aweights: Tensor | None = None
) -> Tensor:
    """The covariance matrix of the variables in the rows of ``input`` (observations in columns; a 1-D input
    is one variable, whose variance is returned as a 0-d tensor), with ``correction`` (1: Bessel's) and
    optional integer frequency weights ``fweights`` and floating observation weights ``aweights``."""
    _need_tensor(input, "input", 1, "cov")
    if isinstance(correction, bool) or not isinstance(correction, int):
        raise TypeError(f"cov(): argument 'correction' must be int, not {type(correction).__name__}")
    if input.dim() > 2:
        raise RuntimeError(
            f"cov(): expected input to have two or fewer dimensions but got an input with {input.dim()} dimensions"
        )
    if input.dtype is dt.bool:
        raise RuntimeError("cov(): bool dtype is not supported for input")
    x = input.reshape(1, -1) if input.dim() < 2 else input
    observations = x.shape[1]
    _check_weights("fweights", fweights, observations, True)
    _check_weights("aweights", aweights, observations, False)
    w = None
    if fweights is not None:
        w = fweights.reshape(-1)
    if aweights is not None:
        w = aweights.reshape(-1) if w is None else w * aweights.reshape(-1)
    if not x.dtype.is_floating_point:
        x = x.to(dt.get_default_dtype() if w is None or not w.dtype.is_floating_point else w.dtype)
    if w is None:
        avg = x.mean(1)
        norm = observations - correction
    else:
        w_sum = w.sum()
        if float(w_sum.item()) == 0:
            raise RuntimeError("cov(): weights sum to zero, can't be normalized")
        avg = (x * w).sum(1) / w_sum
        if correction == 0:
            norm = w_sum
        elif aweights is None:
            norm = w_sum - correction
        else:
            norm = w_sum - correction * (w * aweights.reshape(-1)).sum() / w_sum
    if float(norm.item() if isinstance(norm, Tensor) else norm) <= 0:
        warnings.warn(
            "cov(): degrees of freedom is <= 0. Correction should be strictly less than the number of observations.",
            UserWarning,
            stacklevel=2,
        )
        norm = norm * 0 if isinstance(norm, Tensor) else 0
    centered = x - avg.unsqueeze(1)
    weighted = centered if w is None else centered * w
    from kiln._ops.linalg import matmul

    c = matmul(weighted, centered.mT)
    c = c / norm if isinstance(norm, Tensor) else c / float(norm)
    return c.squeeze() if input.dim() < 2 or x.shape[0] == 1 else c


def corrcoef(input: Tensor) -> Tensor:
    """The Pearson correlation coefficients of the variables in the rows of ``input``, clipped to ``[-1, 1]``."""
    _need_tensor(input, "input", 1, "corrcoef")
    if input.dim() > 2:
        raise RuntimeError(
            f"corrcoef(): expected input to have two or fewer dimensions but got an input with {input.dim()} dimensions"
        )
    c = cov(input)
    if c.dim() == 0:
        return c / c
    d = c.diagonal()
    stddev = d.sqrt()
    c = c / stddev.unsqueeze(1)
    c = c / stddev.unsqueeze(0)
    return c.clamp(-1, 1)


# ---------------------------------------------------------------------------------------- aminmax


def aminmax(input: Tensor, *, dim: int | None = None, keepdim: bool = False):
    """``(min, max)`` of all elements, or along ``dim`` (a named tuple)."""
    _need_tensor(input, "input", 1, "aminmax")
    if dim is None:
        if input.numel() == 0:
            raise RuntimeError(
                "aminmax(): cannot compute aminmax over an empty dimension as the operation has no identity."
            )
        if keepdim:
            shape = (1,) * input.dim()
            return _AminmaxResult(amin(input).reshape(shape), amax(input).reshape(shape))
        return _AminmaxResult(amin(input), amax(input))
    d = wrap_dim(dim, input.dim())
    if input.dim() and input.shape[d] == 0:
        raise IndexError(f"aminmax: Expected reduction dim {d} to have non-zero size.")
    return _AminmaxResult(amin(input, d, keepdim), amax(input, d, keepdim))


# ---------------------------------------------------------------------------------------- nanmedian


def _sorted_along(input: Tensor, d: int):
    from kiln._ops.sort import sort

    return sort(input, d, stable=True)


def nanmedian(input: Tensor, dim: int | None = None, keepdim: bool = False):
    """The lower median ignoring NaNs: of all elements as a 0-d tensor, or along ``dim`` as ``(values,
    indices)``; NaN only where every element is NaN (or the input is empty)."""
    _need_tensor(input, "input", 1, "nanmedian")
    if dim is None:
        if keepdim:
            raise TypeError("nanmedian() received an invalid combination of arguments - got keepdim without dim")
        if input.numel() == 0:
            from kiln._ops.creation import full

            return full((), float("nan"), dtype=input.dtype, device=input.device)
        flat = input.reshape(-1)
        value = _nanmedian_along(flat, 0, True)[0].reshape(())
        return _evenly_distributed(flat, value)
    d = wrap_dim(dim, input.dim())
    if input.dim() and input.shape[d] == 0:
        raise IndexError(f"median(): Expected reduction dim {d} to have non-zero size.")
    if input.dim() == 0:
        from kiln._ops.creation import zeros

        return _NanmedianResult(input.clone(), zeros((), dtype=dt.int64, device=input.device))
    values, indices = _nanmedian_along(input, d, keepdim)
    return _NanmedianResult(values, indices)


def _evenly_distributed(flat: Tensor, value: Tensor) -> Tensor:
    """``value`` (one of ``flat``'s elements) with its gradient shared evenly by every element equal to it (every
    NaN when it is NaN), as PyTorch's full reductions that select a value distribute it."""
    picked = value.detach()
    mask = isnan(flat) if bool(isnan(picked)) else eq(flat, picked)
    share = where(mask, flat, 0.0).sum() / mask.sum()
    return picked + where(isnan(share) | (share.abs() == float("inf")), 0.0, share - share.detach())


def _nanmedian_along(input: Tensor, d: int, keepdim: bool):
    values, order = _sorted_along(input, d)
    if input.dtype.is_floating_point:
        valid = logical_not(isnan(input)).sum(d, keepdim=True)
    else:
        from kiln._ops.creation import full

        shape = list(input.shape)
        shape[d] = 1
        valid = full(shape, input.shape[d], dtype=dt.int64, device=input.device)
    k = ((valid - 1).clamp_min(0)) // 2
    picked, index = values.gather(d, k), order.gather(d, k)
    return (picked, index) if keepdim else (picked.squeeze(d), index.squeeze(d))


# ---------------------------------------------------------------------------------------- quantile

_INTERPOLATIONS = ("linear", "lower", "higher", "midpoint", "nearest")


def _quantile(name: str, input, q, dim, keepdim, interpolation, ignore_nan: bool) -> Tensor:
    _need_tensor(input, "input", 1, name)
    if not isinstance(q, Tensor) and not is_scalar(q):
        raise TypeError(f"{name}(): argument 'q' must be Tensor or float, not {type(q).__name__}")
    if interpolation not in _INTERPOLATIONS:
        raise RuntimeError(
            f"quantile() interpolation must be one of linear, lower, higher, midpoint or nearest, but got {interpolation}"
        )
    if input.numel() == 0:
        raise RuntimeError("quantile() input tensor must be non-empty")
    if isinstance(q, Tensor) and q.dim() > 1:
        raise RuntimeError("quantile() q must be a scalar or 1D tensor")
    if input.dtype not in (dt.float32, dt.float64):
        raise RuntimeError("quantile() input tensor must be either float or double dtype")
    if isinstance(q, Tensor) and q.dtype is not input.dtype:
        raise RuntimeError("quantile() q tensor must be same dtype as the input tensor")
    if isinstance(q, Tensor):
        if q.numel() and not bool(((q >= 0) & (q <= 1)).all()):
            raise RuntimeError("quantile() q values must be in the range [0, 1]")
        qs, scalar_q = q.reshape(-1).to(input.device), q.dim() == 0
    else:
        if not 0 <= q <= 1:
            raise RuntimeError(f"quantile() q must be in the range [0, 1] but got {q}")
        from kiln._ops.creation import tensor

        qs, scalar_q = tensor([float(q)], dtype=input.dtype, device=input.device), True
    if dim is None:
        x, d = input.reshape(-1), 0
    else:
        d = wrap_dim(dim, input.dim())
        x = input if input.dim() else input.reshape(1)
        d = d if input.dim() else 0
    values, _ = _sorted_along(x, d)
    values = values.movedim(d, -1)  # (..., n), NaNs last
    n = values.shape[-1]
    nan = isnan(values)
    undefined = None
    if ignore_nan:  # an all-NaN slice ranks 0 (its first element, a NaN), as PyTorch
        valid = logical_not(nan).sum(-1, keepdim=True)
    else:
        from kiln._ops.creation import full

        valid = full(values.shape[:-1] + (1,), n, dtype=dt.int64, device=values.device)
        undefined = nan.any(-1, keepdim=True)
    ranks = qs.reshape((-1,) + (1,) * values.dim()) * (valid - 1).clamp_min(0).to(values.dtype)  # (Q, ..., 1)
    if interpolation == "lower":
        ranks = ranks.floor()
    elif interpolation == "higher":
        ranks = ranks.ceil()
    elif interpolation == "nearest":
        ranks = ranks.round()
    if undefined is not None:  # a slice with a NaN gives its last sorted element, a NaN (and its gradient)
        ranks = where(undefined, float(n - 1), ranks)
    below = ranks.floor().to(dt.int64)
    above = ranks.ceil().to(dt.int64)
    expanded = values.unsqueeze(0).expand((qs.shape[0],) + tuple(values.shape))
    low = expanded.gather(-1, below)
    high = expanded.gather(-1, above)
    if interpolation == "midpoint":
        out = low + (high - low) * 0.5
    elif interpolation == "linear":
        from kiln._ops.ternary_math import lerp

        out = lerp(low, high, ranks - below.to(values.dtype))
    else:
        out = low
    out = out.squeeze(-1)  # (Q, ...)
    if keepdim:
        if dim is None:
            out = out.reshape((qs.shape[0],) + (1,) * input.dim())
        elif input.dim():
            out = out.unsqueeze(d + 1)
    return out.squeeze(0) if scalar_q else out


def quantile(
    input: Tensor, q, dim: int | None = None, keepdim: bool = False, *, interpolation: str = "linear"
) -> Tensor:
    """The ``q``-th quantiles (``q`` a number or 1-D tensor in ``[0, 1]``) of all elements or along ``dim``,
    ``interpolation`` between the two nearest order statistics being ``'linear'``, ``'lower'``,
    ``'higher'``, ``'midpoint'`` or ``'nearest'``; a 1-D ``q`` adds a leading dim. NaN where a NaN occurs."""
    return _quantile("quantile", input, q, dim, keepdim, interpolation, False)


def nanquantile(
    input: Tensor, q, dim: int | None = None, keepdim: bool = False, *, interpolation: str = "linear"
) -> Tensor:
    """:func:`quantile` ignoring NaNs (NaN only where every element is NaN)."""
    return _quantile("nanquantile", input, q, dim, keepdim, interpolation, True)


# ---------------------------------------------------------------------------------------- mode


def _mode_meta(input, dim=-1, keepdim=False):
    _need_tensor(input, "input", 1, "mode")
    d = wrap_dim(dim, input.dim())
    if input.dim() and input.shape[d] == 0 and _numel(_reduced_shape(input.shape, (d,), False)) != 0:
        raise IndexError(f"mode(): Expected reduction dim {d} to have non-zero size.")
    if input.dim() == 1 and input.shape[0] == 0:
        raise IndexError(f"mode(): Expected reduction dim {d} to have non-zero size.")
    shape = _reduced_shape(tuple(input.shape), (d,), keepdim) if input.dim() else ()
    return (DimSpec((shape, input.dtype, input.device, d)), DimSpec((shape, dt.int64, input.device, d)))


def _mode_np(row: np.ndarray) -> tuple[int, int]:
    """(position in ``row`` of the mode's last occurrence) for one 1-D row: the smallest of the most frequent
    values (NaNs are never equal, so each counts once)."""
    order = np.argsort(row, kind="stable")
    s = row[order]
    same = s[1:] == s[:-1]
    starts = np.flatnonzero(np.concatenate(([True], ~same)))
    ends = np.concatenate((starts[1:], [s.size])) - 1
    best = int(np.argmax(ends - starts + 1))
    return int(order[ends[best]])


def _mode_ref(spec, a, dim=-1, keepdim=False):
    d = spec[0].dim
    if a.ndim == 0:
        return a.copy(), np.zeros((), np.int64)
    if a.size == 0:
        return np.empty(spec[0].shape, a.dtype), np.empty(spec[0].shape, np.int64)
    moved = np.moveaxis(a, d, -1)
    rows = moved.reshape(-1, moved.shape[-1])
    idx = np.array([_mode_np(r) for r in rows], np.int64).reshape(moved.shape[:-1])
    values = np.take_along_axis(moved, idx[..., None], -1)[..., 0]
    if keepdim:
        idx, values = np.expand_dims(idx, d), np.expand_dims(values, d)
    return values, idx


@op(
    tags=("reduction",),
    meta=_mode_meta,
    reference=_mode_ref,
    backward=_dim_extreme_backward,
    num_outputs=2,
    differentiable_outputs=(0,),
    grad_fn_name="ModeBackward0",
)
def _mode(input: Tensor, dim: int = -1, keepdim: bool = False) -> tuple[Tensor, Tensor]:
    """The most frequent value along ``dim`` and its index."""


def mode(input: Tensor, dim: int = -1, keepdim: bool = False):
    """``(values, indices)``: the most frequent value along ``dim`` (the smallest among ties; NaNs are never
    equal) and the index of its last occurrence (a named tuple)."""
    return _ModeResult(*_mode(input, dim, keepdim))


Tensor.cov = cov
Tensor.corrcoef = corrcoef
Tensor.aminmax = aminmax
Tensor.nanmedian = nanmedian
Tensor.quantile = quantile
Tensor.nanquantile = nanquantile
Tensor.mode = mode
