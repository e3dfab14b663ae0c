"""More reductions and the scans: ``prod``, ``var``/``std`` (and ``var_mean``/``std_mean``),
``logsumexp``, ``nansum``/``nanmean``, ``count_nonzero``, ``cumsum`` and ``cumprod``.

Backward formulas are written in kiln ops (so higher-order gradients work). ``prod`` and ``cumprod``
get correct gradients with zeros in the input: the gradient of element ``k`` is built from the
products that leave ``k`` out (an ``n x n`` product table along the reduced dim), never by dividing
by the input.
"""

from __future__ import annotations

import builtins
import warnings

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op, with_out
from kiln._ops._meta import astype, reduce_dims, wrap_dim
from kiln._ops.comparison import eq, ge
from kiln._ops.elementwise import _compute_np, exp, isnan, logical_not, where
from kiln._ops.reduction import (
    _all_extreme_backward,
    _check_input,
    _dim_extreme_backward,
    _np_axes,
    _reduced_shape,
    _return_type,
    expand_reduced,
    return_types,
)
from kiln._ops.reduction import sum as _sum
from kiln._spec import DimSpec, ReductionSpec, Spec
from kiln._tensor import Tensor, _numel

Dims = "int | tuple[int, ...] | None"


def _dims(dim, ndim: int) -> tuple:
    """``reduce_dims``, also refusing a repeated dim of a 0-d input (``(0, -1)``) as PyTorch does."""
    if ndim == 0 and dim is not None and not isinstance(dim, int):
        dim = [wrap_dim(d, 0) + 1 if d < 0 else wrap_dim(d, 0) for d in dim]
        if len(dim) > 1:
            raise RuntimeError("dim 0 appears multiple times in the list of dims")
    return reduce_dims(dim, ndim)


def _int_to_long(d: dt.dtype) -> dt.dtype:
    return d if d.is_floating_point else dt.int64


def _count(shape: tuple, dims: tuple) -> int:
    n = 1
    for d in dims:
        n *= shape[d] if shape else 1
    return n


def _leave_one_out(x: Tensor, scan: bool):
    """For ``x`` of shape ``(..., n)``: the table ``y[..., k, i] = x[..., i]`` for ``i != k`` and 1 on
    the diagonal, and (for scans) the mask ``j >= k`` of the table's last two dims."""
    from kiln._ops.creation import arange

    n = x._shape[-1]
    pos = arange(n, device=x.device)
    col = pos.unsqueeze(-1)
    table = x.unsqueeze(-2).expand(x._shape[:-1] + (n, n))
    return where(eq(col, pos), 1.0, table), (ge(pos, col) if scan else None)


# ---------------------------------------------------------------------------------------- prod


def _prod_meta(input, dim=None, keepdim=False, dtype=None):
    _check_input(input, "prod")
    if dim is not None and not isinstance(dim, int):
        raise TypeError(
            f"prod() received an invalid combination of arguments - got (Tensor, {type(dim).__name__}), but "
            "expected one of:\n * (Tensor input, *, torch.dtype dtype = None)\n * (Tensor input, int dim, bool "
            "keepdim = False, *, torch.dtype dtype = None, Tensor out = None)\n"
        )
    dims = _dims(dim, len(input._shape))
    shape = _reduced_shape(input._shape, dims, keepdim) if dim is not None else ()
    return ReductionSpec((shape, dtype or _int_to_long(input._dtype), input._device, dims))


def _prod_ref(spec, a, dim=None, keepdim=False, dtype=None):
    compute = _compute_np(spec.dtype)
    if dim is None:
        return np.asarray(np.prod(a.astype(compute, copy=False)), compute)
    return np.prod(a.astype(compute, copy=False), axis=_np_axes(a, spec.dims), keepdims=keepdim)


def _prod_backward(grad, input, dim, keepdim):
    if not input._shape or _numel(input._shape) == 0:
        if dim is None:
            return grad.expand(input._shape)
        return expand_reduced(grad, input._shape, (wrap_dim(dim, len(input._shape)),), keepdim)
    if dim is None:
        flat = input.reshape(-1)
        table, _ = _leave_one_out(flat, False)
        return (prod(table, -1) * grad).reshape(input._shape)
    d = wrap_dim(dim, len(input._shape))
    x = input.transpose(d, -1)
    table, _ = _leave_one_out(x, False)
    others = prod(table, -1).transpose(d, -1)
    return others * expand_reduced(grad, input._shape, (d,), keepdim)


@op(
    autocast="fp32",
    tags=("reduction",),
    meta=_prod_meta,
    reference=_prod_ref,
    backward=_prod_backward,
    methods=("prod",),
    grad_fn_name=lambda args: "ProdBackward" + ("0" if len(args) < 2 or args[1] is None else "1"),
)
def prod(input: Tensor, dim: int | None = None, keepdim: bool = False, *, dtype: dt.dtype | None = None) -> Tensor:
    """Product of all elements, or over ``dim``; integers multiply to int64. Exact gradients with zeros."""


# ---------------------------------------------------------------------------------------- var / std


def _var_meta(name):
    def meta(input, dim=None, correction=1, keepdim=False):
        _check_input(input, name)
        if not input._dtype.is_floating_point:
            raise RuntimeError("std and var only support floating point and complex dtypes")
        dims = _dims(dim, len(input._shape))
        return ReductionSpec((_reduced_shape(input._shape, dims, keepdim), input._dtype, input._device, dims))

    return meta


def _var_ref(take_sqrt):
    def ref(spec, a, dim=None, correction=1, keepdim=False):
        compute = _compute_np(spec.dtype)
        a = a.astype(compute, copy=False)
        axes = _np_axes(a, spec.dims)
        n = a.size // max(_numel(spec.shape), 1) if a.size else _count(a.shape, spec.dims)
        with np.errstate(invalid="ignore", divide="ignore"):
            if a.size == 0:
                r = np.full(spec.shape, np.nan, compute)
            else:
                m = np.mean(a, axis=axes, keepdims=True)
                ss = np.sum(np.square(a - m), axis=axes, keepdims=keepdim)
                r = np.asarray(ss / compute.type(builtins.max(n - (correction if correction is not None else 1), 0)))
                # PyTorch's Welford kernel gives exactly 0 for constant slices (so std's gradient there is 0)
                same = np.max(a, axis=axes, keepdims=keepdim) == np.min(a, axis=axes, keepdims=keepdim)
                r = np.where(same & ~np.isnan(r), np.zeros((), compute) * r, r)
            return np.sqrt(r) if take_sqrt else r

    return ref


def _var_grad(grad, input, dims, correction, keepdim):
    from kiln._ops.reduction import mean

    n = _count(input._shape, dims)
    c = 1 if correction is None else correction
    centered = input - mean(input, dims, True) if input._shape else input - input
    # 2/(n - c) applied to the reduced gradient (small) as a product and a division by the int n - c: a
    # compiled function's trace then holds no float computed from a size, and is one program at every batch
    # size (kiln.compile's shape signature)
    scaled = grad * 2 / (n - c) if n > c else grad * float("inf")
    return expand_reduced(scaled, input._shape, dims, keepdim) * centered


def _var_backward(grad, input, dim, correction, keepdim):
    return _var_grad(grad, input, _dims(dim, len(input._shape)), correction, keepdim)


def _std_backward(grad, input, dim, correction, keepdim, result):
    g = where(eq(result, 0.0), 0.0, grad / (result * 2))
    return _var_grad(g, input, _dims(dim, len(input._shape)), correction, keepdim)


def _var_decomposed(input, dim=None, correction=1, keepdim=False):
    """``_var`` in kiln ops, as the reference computes it: the sum of squared deviations from the mean over
    ``n - correction``, exactly 0 for constant slices, NaN over empty ones (float32 for half precision)."""
    from kiln._ops.creation import full
    from kiln._ops.reduction import amax, amin, mean

    shape, dtype, _, dims = _var_meta("var")(input, dim, correction, keepdim)
    if _numel(input._shape) == 0:
        return full(shape, float("nan"), dtype=dtype, device=input._device)
    x = input.to(dt.float32 if dtype in (dt.float16, dt.bfloat16) else dtype)
    n = _count(input._shape, dims)
    d = x - mean(x, dims, True)
    r = _sum(d * d, dims, keepdim) / float(builtins.max(n - (correction if correction is not None else 1), 0))
    same = eq(amax(x, dims, keepdim), amin(x, dims, keepdim))
    return where(same & logical_not(isnan(r)), r * 0.0, r).to(dtype)


@op(
    decompose=_var_decomposed,
    tags=("reduction",),
    meta=_var_meta("var"),
    reference=_var_ref(False),
    backward=_var_backward,
    grad_fn_name="VarBackward0",
)
def _var(input: Tensor, dim: Dims = None, correction: int | float | None = 1, keepdim: bool = False) -> Tensor:
    """Variance over ``dim`` with Bessel-style ``correction``."""


def _std_decomposed(input, dim=None, correction=1, keepdim=False):
    """``_std`` in kiln ops: the square root of ``_var`` (computed in float32 for half precision)."""
    from kiln._ops.elementwise import sqrt

    d = input._dtype
    x = input.to(dt.float32) if d in (dt.float16, dt.bfloat16) else input
    return sqrt(_var(x, dim, correction, keepdim)).to(d)


@op(
    decompose=_std_decomposed,
    tags=("reduction",),
    meta=_var_meta("std"),
    reference=_var_ref(True),
    backward=_std_backward,
    grad_fn_name="StdBackward0",
)
def _std(input: Tensor, dim: Dims = None, correction: int | float | None = 1, keepdim: bool = False) -> Tensor:
    """Standard deviation over ``dim`` with Bessel-style ``correction``."""


def _warn_dof(name, input, dim, correction):
    if isinstance(input, Tensor) and input._dtype.is_floating_point:
        n = _count(input._shape, _dims(dim, len(input._shape)))
        if n - correction <= 0:
            warnings.warn(
                f"{name}(): degrees of freedom is <= 0. Correction should be strictly less than the reduction "
                "factor (input numel divided by output numel).",
                UserWarning,
                stacklevel=3,
            )


def _var_args(name, dim, unbiased, keepdim, correction):
    if isinstance(dim, bool):  # var(input, unbiased)
        if unbiased is not None:
            raise TypeError(f"{name}() received an invalid combination of arguments")
        dim, unbiased = None, dim
    if unbiased is not None:
        if correction is not None:
            raise TypeError(f"{name}() received an invalid combination of arguments - got both unbiased and correction")
        correction = 1 if unbiased else 0
    return dim, (1 if correction is None else correction), keepdim


def _checked_args(name, input, dim, unbiased, keepdim, correction):
    args = _var_args(name, dim, unbiased, keepdim, correction)
    _warn_dof(name, input, args[0], args[1])
    return args


def var(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """Variance over ``dim`` (all dims by default): ``correction`` (default 1) or ``unbiased``."""
    return _var(input, *_checked_args("var", input, dim, unbiased, keepdim, correction))


def std(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """Standard deviation over ``dim`` (all dims by default): ``correction`` (default 1) or ``unbiased``."""
    return _std(input, *_checked_args("std", input, dim, unbiased, keepdim, correction))


def var_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """``(var, mean)`` over ``dim``, as :func:`var` and :func:`kiln.mean`."""
    from kiln._ops.reduction import mean

    d, c, k = _checked_args("var_mean", input, dim, unbiased, keepdim, correction)
    return _var(input, d, c, k), mean(input, d, k)


def std_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """``(std, mean)`` over ``dim``, as :func:`std` and :func:`kiln.mean`."""
    from kiln._ops.reduction import mean

    d, c, k = _checked_args("std_mean", input, dim, unbiased, keepdim, correction)
    return _std(input, d, c, k), mean(input, d, k)


Tensor.var = var
Tensor.std = std


# ---------------------------------------------------------------------------------------- logsumexp


def _logsumexp_meta(input, dim, keepdim=False):
    _check_input(input, "logsumexp")
    nd = len(input._shape)
    if not keepdim and nd and _numel(input._shape) and not isinstance(dim, int) and len(dim) == 0:
        # PyTorch's kernel writes its keepdim result into the all-reduced output and fails
        raise RuntimeError(f"output with shape [] doesn't match the broadcast shape [{', '.join(['1'] * nd)}]")
    dims = _dims(dim, len(input._shape))
    out = input._dtype if input._dtype.is_floating_point else dt.get_default_dtype()
    return ReductionSpec((_reduced_shape(input._shape, dims, keepdim), out, input._device, dims))


def _logsumexp_ref(spec, a, dim, keepdim=False):
    compute = _compute_np(spec.dtype)
    a = a.astype(compute, copy=False)
    axes = _np_axes(a, spec.dims)
    if a.size == 0:
        return np.full(spec.shape, -np.inf, compute)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        m = np.max(a, axis=axes, keepdims=True)
        m = np.where(np.isinf(m), 0, m)
        r = np.log(np.sum(np.exp(a - m), axis=axes, keepdims=True)) + m
    return r if keepdim or not a.ndim else np.squeeze(r, axis=axes)


def _logsumexp_backward(grad, input, dim, keepdim, result):
    dims = _dims(dim, len(input._shape))
    return expand_reduced(grad, input._shape, dims, keepdim) * exp(
        input - expand_reduced(result, input._shape, dims, keepdim)
    )


def _logsumexp_decomposed(input, dim, keepdim=False):
    """``logsumexp`` in kiln ops: ``log(sum(exp(x - m))) + m`` with ``m`` the max (0 where it is infinite),
    computed in float32 for half precision; ``-inf`` over empty slices."""
    from kiln._ops.creation import full
    from kiln._ops.elementwise import log
    from kiln._ops.reduction import amax
    from kiln._ops.unary_math import isinf

    shape, dtype, _, dims = _logsumexp_meta(input, dim, keepdim)
    if _numel(input._shape) == 0:
        return full(shape, float("-inf"), dtype=dtype, device=input._device)
    x = input.to(dt.float32 if dtype in (dt.float16, dt.bfloat16) else dtype)
    m = amax(x, dims, True)
    m = where(isinf(m), 0.0, m)
    r = log(_sum(exp(x - m), dims, keepdim)) + (m if keepdim else m.reshape(shape))
    return r.to(dtype)


@op(
    decompose=_logsumexp_decomposed,
    tags=("reduction",),
    meta=_logsumexp_meta,
    reference=_logsumexp_ref,
    backward=_logsumexp_backward,
    autocast="fp32_float16",
    methods=("logsumexp",),
)
def logsumexp(input: Tensor, dim: Dims, keepdim: bool = False) -> Tensor:
    """``log(sum(exp(input)))`` over ``dim``, computed stably; integers compute in the default float dtype."""


# ---------------------------------------------------------------------------------------- nansum / nanmean


def _nansum_meta(input, dim=None, keepdim=False, dtype=None):
    _check_input(input, "nansum")
    dims = _dims(dim, len(input._shape))
    return ReductionSpec(
        (_reduced_shape(input._shape, dims, keepdim), dtype or _int_to_long(input._dtype), input._device, dims)
    )


def _nansum_ref(spec, a, dim=None, keepdim=False, dtype=None):
    return np.nansum(a.astype(_compute_np(spec.dtype), copy=False), axis=_np_axes(a, spec.dims), keepdims=keepdim)


def _nansum_backward(grad, input, dim, keepdim):
    dims = _dims(dim, len(input._shape))
    # PyTorch multiplies by the mask (so an inf/NaN gradient stays NaN at NaN inputs)
    return expand_reduced(grad, input._shape, dims, keepdim) * logical_not(isnan(input))


def _nansum_decomposed(input, dim=None, keepdim=False, *, dtype=None):
    """``nansum`` in kiln ops: the sum with NaN replaced by zero."""
    _, out_dtype, _, dims = _nansum_meta(input, dim, keepdim, dtype)
    x = where(isnan(input), 0, input) if input._dtype.is_floating_point else input
    return _sum(x, dims, keepdim, dtype=out_dtype)


@op(
    decompose=_nansum_decomposed,
    tags=("reduction",),
    meta=_nansum_meta,
    reference=_nansum_ref,
    backward=_nansum_backward,
    methods=("nansum",),
)
def nansum(input: Tensor, dim: Dims = None, keepdim: bool = False, *, dtype: dt.dtype | None = None) -> Tensor:
    """Sum treating NaN as zero."""


def nanmean(input, dim=None, keepdim=False, *, dtype=None):
    """Mean of the non-NaN elements over ``dim`` (NaN where there are none); floating point only."""
    _check_input(input, "nanmean")
    if not (dtype or input._dtype).is_floating_point:
        from kiln._ops._meta import scalar_type_name

        raise RuntimeError(
            "nanmean(): expected input to have floating point or complex dtype but got "
            f"{scalar_type_name(input._dtype)}"
        )
    kept = logical_not(isnan(input))
    return nansum(input, dim, keepdim, dtype=dtype) / _sum(kept, dim, keepdim)


Tensor.nanmean = nanmean


# ---------------------------------------------------------------------------------------- count_nonzero


def _count_nonzero_meta(input, dim=None):
    _check_input(input, "count_nonzero")
    dims = _dims(dim, len(input._shape))
    return ReductionSpec((_reduced_shape(input._shape, dims, False), dt.int64, input._device, dims))


def _count_nonzero_decomposed(input, dim=None):
    """``count_nonzero`` in kiln ops: the int64 sum of ``input != 0`` (NaN counts)."""
    from kiln._ops.comparison import ne

    return _sum(ne(input, 0), _count_nonzero_meta(input, dim)[3])


@op(
    decompose=_count_nonzero_decomposed,
    tags=("reduction",),
    meta=_count_nonzero_meta,
    reference=lambda spec, a, dim=None: np.asarray(
        np.count_nonzero(a, axis=_np_axes(a, spec.dims)) if a.ndim else np.count_nonzero(a), np.int64
    ),
    methods=("count_nonzero",),
)
def count_nonzero(input: Tensor, dim: Dims = None) -> Tensor:
    """Number of nonzero elements (over ``dim``), as int64."""


# ---------------------------------------------------------------------------------------- cumsum / cumprod


def _scan_meta(name):
    def meta(input, dim, dtype=None):
        _check_input(input, name)
        d = wrap_dim(dim, len(input._shape))
        return DimSpec((input._shape, dtype or _int_to_long(input._dtype), input._device, d))

    return meta


def _scan_ref(np_fn):
    def ref(spec, a, dim, dtype=None):
        compute = _compute_np(spec.dtype)
        a = astype(a, compute)
        if a.ndim == 0:
            return a.copy()
        return np_fn(a, axis=spec.dim, dtype=compute)

    return ref


def _cumsum_backward(grad, input_shape, dim):
    if not input_shape:
        return grad
    d = wrap_dim(dim, len(input_shape))
    # reversed cumulative sum: total - cumsum + grad
    return _sum(grad, d, True) - cumsum(grad, d) + grad


def _cumprod_backward(grad, input, dim):
    if not input._shape or _numel(input._shape) == 0:
        return grad
    d = wrap_dim(dim, len(input._shape))
    x = input.transpose(d, -1)
    table, later = _leave_one_out(x, True)
    # partial[..., k, j] = prod_{i <= j, i != k} x_i; grad_k = sum_{j >= k} grad_j * partial[k, j]
    partial = cumprod(table, -1)
    g = grad.transpose(d, -1).unsqueeze(-2)
    return _sum(where(later, partial * g, 0.0), -1).transpose(d, -1)


@op(
    autocast="fp32_float16",
    tags=("scan",),
    meta=_scan_meta("cumsum"),
    reference=_scan_ref(np.cumsum),
    backward=_cumsum_backward,
    methods=("cumsum",),
)
def cumsum(input: Tensor, dim: int, *, dtype: dt.dtype | None = None) -> Tensor:
    """Cumulative sum along ``dim``; integers accumulate in int64."""


@op(
    autocast="fp32_float16",
    tags=("scan",),
    meta=_scan_meta("cumprod"),
    reference=_scan_ref(np.cumprod),
    backward=_cumprod_backward,
    methods=("cumprod",),
)
def cumprod(input: Tensor, dim: int, *, dtype: dt.dtype | None = None) -> Tensor:
    """Cumulative product along ``dim``; integers accumulate in int64. Exact gradients with zeros."""


__all__ = [
    "prod",
    "var",
    "std",
    "var_mean",
    "std_mean",
    "logsumexp",
    "nansum",
    "nanmean",
    "count_nonzero",
    "cumsum",
    "cumprod",
]

TOP_LEVEL = __all__
"""The names ``kiln`` exports at its top level (as ``torch`` does): every public name here."""


# ---------------------------------------------------------------------------------------- median


def _median_all_meta(input):
    _check_input(input, "median")
    return Spec(((), input._dtype, input._device))


def _lower_median_index(a: np.ndarray, axis: int) -> np.ndarray:
    """Index (keepdims) of the lower median along ``axis``: the first NaN where there is one, else the
    ``(n - 1) // 2``-th of a stable sort (PyTorch's choice among ties in the cases we checked)."""
    k = (a.shape[axis] - 1) // 2
    idx = np.take(np.argsort(a, axis=axis, kind="stable"), [k], axis=axis)
    if a.dtype.kind in "fV":  # V: bfloat16 (ml_dtypes)
        nan = np.isnan(a)
        has = np.any(nan, axis=axis, keepdims=True)
        idx = np.where(has, np.argmax(nan, axis=axis, keepdims=True), idx)
    return idx


def _median_all_ref(spec, a):
    flat = a.reshape(-1)
    if flat.size == 0:
        return np.full((), np.nan, _compute_np(spec.dtype))
    return flat[_lower_median_index(flat, 0)[0]]


@op(
    tags=("reduction",),
    meta=_median_all_meta,
    reference=_median_all_ref,
    backward=_all_extreme_backward,
    grad_fn_name="MedianBackward0",
)
def _median_all(input: Tensor) -> Tensor:
    """Lower median of all elements (NaN if any is NaN)."""


def _median_dim_meta(input, dim, keepdim=False):
    _check_input(input, "median")
    d = wrap_dim(dim, len(input._shape))
    if input._shape and input._shape[d] == 0 and _numel(input._shape) == 0 and len(input._shape) == 1:
        raise IndexError(f"median(): Expected reduction dim {d} to have non-zero size.")
    if input._shape and input._shape[d] == 0 and _numel(_reduced_shape(input._shape, (d,), False)) != 0:
        raise IndexError(f"median(): Expected reduction dim {d} to have non-zero size.")
    shape = _reduced_shape(input._shape, (d,), keepdim)
    return (DimSpec((shape, input._dtype, input._device, d)), DimSpec((shape, dt.int64, input._device, d)))


def _median_dim_ref(spec, a, dim, keepdim=False):
    d = spec[0].dim
    if a.ndim == 0:
        return a.copy(), np.zeros((), np.int64)
    if a.size == 0:
        return np.empty(spec[0].shape, a.dtype), np.empty(spec[0].shape, np.int64)
    idx = _lower_median_index(a, d)
    values = np.take_along_axis(a, idx, axis=d)
    if not keepdim:
        idx, values = np.squeeze(idx, axis=d), np.squeeze(values, axis=d)
    return values, idx


@op(
    tags=("reduction",),
    meta=_median_dim_meta,
    reference=_median_dim_ref,
    backward=_dim_extreme_backward,
    num_outputs=2,
    differentiable_outputs=(0,),
    grad_fn_name="MedianBackward1",
)
def _median_dim(input: Tensor, dim: int, keepdim: bool = False) -> tuple[Tensor, Tensor]:
    """Lower median along ``dim`` and its index."""


def median(input, dim=None, keepdim=False):
    """Lower median: of all elements as a 0-d tensor, or along ``dim`` as ``(values, indices)``."""
    if dim is None:
        if keepdim:
            raise TypeError("median() received an invalid combination of arguments - got keepdim without dim")
        return _median_all(input)
    return return_types.median(*_median_dim(input, dim, keepdim))


return_types.median = _return_type("median")
Tensor.median = median


# ---------------------------------------------------------------------------------------- norms


def _vector_norm_meta(input, ord=2, dim=None, keepdim=False, dtype=None):
    _check_input(input, "linalg.vector_norm")
    if isinstance(ord, str) or not isinstance(ord, (int, float)):
        raise TypeError(f"linalg_vector_norm(): argument 'ord' (position 2) must be Number, not {type(ord).__name__}")
    if not input._dtype.is_floating_point:
        from kiln._ops._meta import scalar_type_name

        raise RuntimeError(
            "linalg.vector_norm: Expected a floating point or complex tensor as input. "
            f"Got {scalar_type_name(input._dtype)}"
        )
    dims = _dims(dim, len(input._shape))
    if ord < 0 or ord == float("inf"):
        empty = (
            _numel(input._shape) == 0
            if dim is None
            else builtins.any(input._shape and input._shape[d] == 0 for d in dims)
        )
        if empty:
            raise RuntimeError(
                f"linalg.vector_norm cannot compute the {ord} norm on an empty tensor because the operation does "
                "not have an identity"
            )
    return ReductionSpec((_reduced_shape(input._shape, dims, keepdim), dtype or input._dtype, input._device, dims))


def _vector_norm_ref(spec, a, ord=2, dim=None, keepdim=False, dtype=None):
    compute = _compute_np(spec.dtype)
    x = np.abs(a.astype(compute, copy=False))
    axes = _np_axes(a, spec.dims)
    with np.errstate(all="ignore"):
        if ord == float("inf"):
            return np.max(x, axis=axes, keepdims=keepdim)
        if ord == -float("inf"):
            return np.min(x, axis=axes, keepdims=keepdim)
        if ord == 0:
            return np.sum(x != 0, axis=axes, keepdims=keepdim, dtype=compute)
        if ord == 1:
            return np.sum(x, axis=axes, keepdims=keepdim)
        if ord == 2:
            return np.sqrt(np.sum(x * x, axis=axes, keepdims=keepdim))
        return np.power(np.sum(np.power(x, compute.type(ord)), axis=axes, keepdims=keepdim), compute.type(1.0 / ord))


def _vector_norm_backward(grad, input, ord, dim, keepdim, result):
    """PyTorch's ``norm_backward``, case by case."""
    from kiln._ops.elementwise import abs as _abs
    from kiln._ops.unary_math import sgn

    dims = _dims(dim, len(input._shape))
    g = expand_reduced(grad, input._shape, dims, keepdim)
    norm = expand_reduced(result, input._shape, dims, keepdim)
    if ord == 0:
        return None  # PyTorch leaves the gradient undefined
    if ord == 1:
        return sgn(input) * g
    if ord == 2:
        return input * where(eq(norm, 0.0), 0.0, g / norm)
    if ord in (float("inf"), -float("inf")):
        mask = eq(_abs(input), norm)
        count = expand_reduced(_sum(mask, dims, True), input._shape, dims, True) if input._shape else 1
        return sgn(input) * ((g / count) * mask)
    if ord < 1:
        scaled = sgn(input) * where(eq(input, 0.0), 0.0, _abs(input) ** (ord - 1))
        return scaled * g * norm ** (1 - ord)
    scaled = sgn(input) * _abs(input) ** (ord - 1) if ord < 2 else input * _abs(input) ** (ord - 2)
    return scaled * where(eq(norm, 0.0), 0.0, g / norm ** (ord - 1))


def _vector_norm_decomposed(input, ord=2, dim=None, keepdim=False, *, dtype=None):
    """``vector_norm`` in kiln ops, case by case as the reference computes it: the max or min of ``|x|`` for
    ``ord = ±inf``, the count of nonzeros for 0, ``sum(|x|)``, ``sqrt(sum(x * x))``, else
    ``sum(|x| ** ord) ** (1 / ord)`` (computed in float32 for half precision)."""
    from kiln._ops.comparison import ne
    from kiln._ops.elementwise import abs as _abs
    from kiln._ops.elementwise import pow as _pow
    from kiln._ops.elementwise import sqrt
    from kiln._ops.reduction import amax, amin

    _, out, _, dims = _vector_norm_meta(input, ord, dim, keepdim, dtype)
    x = _abs(input.to(dt.float32 if out in (dt.float16, dt.bfloat16) else out))
    if ord == float("inf"):
        r = amax(x, dims, keepdim)
    elif ord == -float("inf"):
        r = amin(x, dims, keepdim)
    elif ord == 0:
        r = _sum(ne(x, 0), dims, keepdim, dtype=x._dtype)
    elif ord == 1:
        r = _sum(x, dims, keepdim)
    elif ord == 2:
        r = sqrt(_sum(x * x, dims, keepdim))
    else:
        r = _pow(_sum(_pow(x, float(ord)), dims, keepdim), 1.0 / ord)
    return r.to(out)


@op(
    decompose=_vector_norm_decomposed,
    tags=("reduction",),
    meta=_vector_norm_meta,
    reference=_vector_norm_ref,
    backward=_vector_norm_backward,
    autocast="fp32_float16",
    grad_fn_name="LinalgVectorNormBackward0",
)
def vector_norm(
    input: Tensor, ord: int | float = 2, dim: Dims = None, keepdim: bool = False, *, dtype: dt.dtype | None = None
) -> Tensor:
    """Vector ``ord``-norm over ``dim`` (all elements by default): ``inf``, ``-inf``, 0 or any real ``p``."""


@with_out(position=4)
def norm(input, p="fro", dim=None, keepdim=False, dtype=None):
    """Vector norm: ``p`` a number or ``'fro'`` (the 2-norm over ``dim``, all elements by default)."""
    if p == "fro":
        if isinstance(dim, (tuple, list)) and len(dim) > 2:
            raise RuntimeError("frobenius norm expected at most two dims")
        p = 2
    elif isinstance(p, str):
        raise NotImplementedError(f"kiln.norm: p={p!r} is not supported (only numbers and 'fro')")
    if isinstance(input, Tensor) and not input._dtype.is_floating_point:
        from kiln._ops._meta import scalar_type_name

        raise RuntimeError(
            "linalg.vector_norm: Expected a floating point or complex tensor as input. "
            f"Got {scalar_type_name(input._dtype)}"
        )
    return vector_norm(input, p, dim, keepdim, dtype=dtype)


Tensor.norm = norm.__wrapped__  # Tensor.norm(p, dim, keepdim, dtype): no out parameter, as in PyTorch

__all__ += ["median", "norm"]
