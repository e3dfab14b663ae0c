"""More scans: ``cummax``/``cummin`` (running extreme and its index) and ``logcumsumexp`` as ops with reference
kernels and backward formulas in kiln ops; ``renorm`` (a composite of ``vector_norm``); and the in-place
``cumsum_``/``cumprod_``.
"""

from __future__ import annotations

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops._meta import reduce_dims, wrap_dim
from kiln._ops.elementwise import _compute_np, div, exp, log, where
from kiln._ops.math_args import _FLOAT_MAX, _TYPEMETA_NAMES, _need_tensor, _not_implemented
from kiln._ops.reduction import _return_type
from kiln._spec import DimSpec
from kiln._tensor import Tensor

__all__ = ["cummax", "cummin", "logcumsumexp", "renorm"]

TOP_LEVEL = __all__
"""The names ``kiln`` exports at its top level (as ``torch`` does): every public name here."""

_CummaxResult = _return_type("cummax")
_CumminResult = _return_type("cummin")


# ---------------------------------------------------------------------------------------- cummax, cummin


def _extreme_scan_meta(name: str):
    def meta(input, dim):
        _need_tensor(input, "input", 1, name)
        d = wrap_dim(dim, input.dim())
        return (DimSpec((input.shape, input.dtype, input.device, d)), DimSpec((input.shape, dt.int64, input.device, d)))

    return meta


def _extreme_scan_ref(better):
    """The running extreme along the spec's dim: a position takes over when ``better(x, current)`` holds or
    it is NaN (NaN then stays: nothing beats it), so ties move the index to the latest position, as in
    PyTorch."""

    def ref(spec, a, dim):
        if a.ndim == 0:
            return a.copy(), np.zeros((), np.int64)
        d = spec[0].dim
        x = np.moveaxis(a, d, 0)
        values = np.empty_like(x)
        indices = np.zeros(x.shape, np.int64)
        floating = x.dtype.kind in "fV"
        for i in range(x.shape[0]):
            if i == 0:
                values[0], indices[0] = x[0], 0
                continue
            take = better(x[i], values[i - 1])
            if floating:
                take = take | np.isnan(x[i].astype(np.float32))
            values[i] = np.where(take, x[i], values[i - 1])
            indices[i] = np.where(take, i, indices[i - 1])
        return np.moveaxis(values, 0, d), np.moveaxis(indices, 0, d)

    return ref


def _extreme_scan_backward(grads, input, dim, result):
    from kiln._ops.creation import zeros
    from kiln._ops.gather_scatter import scatter_add

    grad = grads[0]
    if input.dim() == 0:
        return grad
    return scatter_add(zeros(input.shape, dtype=grad.dtype, device=grad.device), dim, result[1], grad)


@op(
    tags=("scan",),
    meta=_extreme_scan_meta("cummax"),
    reference=_extreme_scan_ref(np.greater_equal),
    backward=_extreme_scan_backward,
    num_outputs=2,
    differentiable_outputs=(0,),
    grad_fn_name="CummaxBackward0",
)
def _cummax(input: Tensor, dim: int) -> tuple[Tensor, Tensor]:
    """Running maximum along ``dim`` and its index."""


@op(
    tags=("scan",),
    meta=_extreme_scan_meta("cummin"),
    reference=_extreme_scan_ref(np.less_equal),
    backward=_extreme_scan_backward,
    num_outputs=2,
    differentiable_outputs=(0,),
    grad_fn_name="CumminBackward0",
)
def _cummin(input: Tensor, dim: int) -> tuple[Tensor, Tensor]:
    """Running minimum along ``dim`` and its index."""


def cummax(input: Tensor, dim: int):
    """``(values, indices)``: the running maximum along ``dim`` and where it was found (the latest position
    among ties; a NaN wins from where it occurs on). A named tuple."""
    return _CummaxResult(*_cummax(input, dim))


def cummin(input: Tensor, dim: int):
    """``(values, indices)``: the running minimum along ``dim`` and where it was found (the latest position
    among ties; a NaN wins from where it occurs on). A named tuple."""
    return _CumminResult(*_cummin(input, dim))


# ---------------------------------------------------------------------------------------- logcumsumexp


def _logcumsumexp_meta(input, dim):
    _need_tensor(input, "input", 1, "logcumsumexp")
    if not input.dtype.is_floating_point:
        raise _not_implemented("logcumsumexp_out_cpu", input.dtype)
    d = wrap_dim(dim, input.dim())
    return DimSpec((input.shape, input.dtype, input.device, d))


def _logcumsumexp_ref(spec, a, dim):
    x = a.astype(_compute_np(spec.dtype), copy=False)
    if x.ndim == 0:
        return x.copy()
    with np.errstate(invalid="ignore"):
        return np.logaddexp.accumulate(x, axis=spec.dim)


def _reverse_logcumsumexp(x: Tensor, d: int) -> Tensor:
    from kiln._ops.shape import flip

    return flip(logcumsumexp(flip(x, [d]), d), [d])


def _logcumsumexp_backward(grad, input, dim, result):
    # d out_i / d x_j = exp(x_j - out_i) for j <= i, so grad_j = sum_{i >= j} grad_i exp(x_j - out_i), summed in
    # log space for the positive and the negative parts of ``grad`` apart (no overflow, no cancellation of
    # huge terms); the empty part's log is the dtype's lowest finite value, not -inf, so that this formula
    # stays differentiable (written in kiln ops, it is differentiated again for higher orders)
    if input.dim() == 0:
        return grad
    d = wrap_dim(dim, input.dim())
    lowest = -_FLOAT_MAX[grad.dtype]
    positive, negative = grad > 0, grad < 0
    log_pos = where(positive, log(where(positive, grad, 1.0)), lowest) - result
    log_neg = where(negative, log(where(negative, -grad, 1.0)), lowest) - result
    return exp(input + _reverse_logcumsumexp(log_pos, d)) - exp(input + _reverse_logcumsumexp(log_neg, d))


@op(
    tags=("scan",),
    meta=_logcumsumexp_meta,
    reference=_logcumsumexp_ref,
    backward=_logcumsumexp_backward,
    methods=("logcumsumexp",),
)
def logcumsumexp(input: Tensor, dim: int) -> Tensor:
    """``log(cumsum(exp(input), dim))`` computed without overflow or underflow (floating tensors)."""


# ---------------------------------------------------------------------------------------- renorm


def _fmt(x: float) -> str:
    return f"{x:g}"


def renorm(input: Tensor, p: float, dim: int, maxnorm: float) -> Tensor:
    """Each sub-tensor ``input.select(dim, i)`` whose ``p``-norm exceeds ``maxnorm`` scaled down to norm
    ``maxnorm`` (by ``maxnorm / (norm + 1e-7)``); the others unchanged."""
    _need_tensor(input, "input", 1, "renorm")
    if input.dim() < 2:
        raise RuntimeError(f"renorm: input needs at least 2 dimensions, got {input.dim()} dimensions")
    if not p > 0:
        raise RuntimeError("renorm: non-positive-norm not supported")
    if not maxnorm >= 0:
        raise RuntimeError(f"renorm: expected maxnorm to be >= 0 but got {_fmt(maxnorm)}")
    from kiln._ops.scans import vector_norm

    d = wrap_dim(dim, input.dim())
    others = reduce_dims(tuple(i for i in range(input.dim()) if i != d), input.dim())
    norm = vector_norm(input, p, others, True)
    # one true division (not ``maxnorm * reciprocal``), rounded to the input's dtype, as PyTorch's kernel does
    factor = where(norm > maxnorm, div(maxnorm, norm + 1e-7), 1.0)
    return input * factor


def _renorm_(self: Tensor, p: float, dim: int, maxnorm: float) -> Tensor:
    """In-place :func:`renorm`."""
    return self.copy_(renorm(self, p, dim, maxnorm))


# ---------------------------------------------------------------------------------------- cumsum_, cumprod_


def _scan_inplace(name: str):
    from kiln._ops.copy import inplace_variant
    from kiln._ops.scans import cumprod, cumsum

    fn = cumsum if name == "cumsum" else cumprod
    method = inplace_variant(fn, f"{name}_", f"In-place version of :func:`kiln.{name}`.", fn.op.inplace_saves_self)

    def run(self, dim, *, dtype=None):
        if dtype is not None and dtype is not self.dtype:
            raise RuntimeError(
                f"Bad in-place call: input tensor dtype {_TYPEMETA_NAMES[self.dtype]} and output tensor dtype "
                f"{_TYPEMETA_NAMES[dtype]} should match"
            )
        if self.dtype is dt.bool:
            raise _not_implemented(f"{name}_out_cpu", dt.bool)
        return method(self, dim, dtype=dtype)

    run.__name__ = run.__qualname__ = f"{name}_"
    run.__doc__ = method.__doc__
    return run


Tensor.cummax = cummax
Tensor.cummin = cummin
Tensor.renorm = renorm
Tensor.renorm_ = _renorm_
Tensor.cumsum_ = _scan_inplace("cumsum")
Tensor.cumprod_ = _scan_inplace("cumprod")
