"""Unary elementwise math beyond the basics: exponentials and logarithms (``exp2``, ``expm1``, ``log2``,
``log10``, ``log1p``), ``rsqrt``, ``reciprocal``, trigonometric and hyperbolic
functions and their inverses, ``logit``, ``square``, ``sgn``, rounding (``floor``, ``ceil``, ``trunc``,
``round``, ``frac``), ``positive``, float classification (``isinf``...) and ``nan_to_num``.

Every op follows PyTorch 2.x on CPU: integer and bool inputs of floating functions compute in the
default float dtype; half types compute in float32 and round once (see :mod:`.elementwise`);
``logit`` rounds every step, as PyTorch's kernel does; errors raised by meta functions carry PyTorch's
types and wording.
"""

from __future__ import annotations

import math

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops._meta import is_scalar
from kiln._ops.elementwise import (
    _HALF,
    _arg,
    _compute_np,
    _unary,
    _zeros_like,
    unary_meta,
    where,
)
from kiln._ops.math_args import _FLOAT_MAX, _copy, _need_tensor, _not_implemented
from kiln._spec import Spec
from kiln._tensor import Tensor

__all__ = [
    "exp2",
    "expm1",
    "log2",
    "log10",
    "log1p",
    "rsqrt",
    "reciprocal",
    "tan",
    "asin",
    "acos",
    "atan",
    "sinh",
    "cosh",
    "asinh",
    "acosh",
    "atanh",
    "arccos",
    "arccosh",
    "arcsin",
    "arcsinh",
    "arctan",
    "arctanh",
    "logit",
    "square",
    "sgn",
    "floor",
    "ceil",
    "trunc",
    "fix",
    "round",
    "frac",
    "positive",
    "isinf",
    "isposinf",
    "isneginf",
    "isfinite",
    "nan_to_num",
]

TOP_LEVEL = __all__
"""The names ``kiln`` exports at its top level (as ``torch`` does): every public name here."""

_LN2 = math.log(2.0)
_LN10 = math.log(10.0)


# ---------------------------------------------------------------------------------------- unary, floating results


def _f64(fn):
    """A float64 NumPy function applied to the compute array (its result rounds to the result dtype)."""
    return lambda a: fn(a.astype(np.float64))


def _rsqrt_np(a):
    return np.divide(1, np.sqrt(a), dtype=a.dtype)


def _rsqrt_decomposed(input):
    """``rsqrt`` in kiln ops: ``1 / sqrt(input)``."""
    from kiln._ops.elementwise import _in_float, sqrt

    x, d = _in_float(input)
    return reciprocal(sqrt(x)).to(d)


def _reciprocal_np(a):
    return np.divide(1, a, dtype=a.dtype)


def _exp2_decomposed(input):
    """``exp2`` in kiln ops: ``pow(2, x)``."""
    from kiln._ops.elementwise import _in_float
    from kiln._ops.elementwise import pow as _pow

    x, d = _in_float(input)
    return _pow(2.0, x).to(d)


exp2 = _unary(
    "exp2",
    np.exp2,
    lambda grad, result: grad * result * _LN2,
    "``2 ** input`` elementwise.",
    decompose=_exp2_decomposed,
)
expm1 = _unary(
    "expm1",
    np.expm1,
    lambda grad, result: grad * (result + 1),
    "``exp(input) - 1`` elementwise, accurate for small ``input``.",
    autocast="fp32_float16",
)


def _log_base_decomposed(ln_base: float):
    def decomposed(input):
        """``log2``/``log10`` in kiln ops: the natural logarithm over ``ln(base)``."""
        from kiln._ops.elementwise import _in_float, log

        x, d = _in_float(input)
        return (log(x) / ln_base).to(d)

    return decomposed


log2 = _unary(
    "log2",
    np.log2,
    lambda grad, input: grad / (input * _LN2),
    "Base-2 logarithm elementwise.",
    autocast="fp32_float16",
    decompose=_log_base_decomposed(math.log(2.0)),
)
log10 = _unary(
    "log10",
    np.log10,
    lambda grad, input: grad / (input * _LN10),
    "Base-10 logarithm elementwise.",
    autocast="fp32_float16",
    decompose=_log_base_decomposed(math.log(10.0)),
)
log1p = _unary(
    "log1p",
    np.log1p,
    lambda grad, input: grad / (input + 1),
    "``log(1 + input)`` elementwise, accurate for small ``input``.",
    autocast="fp32_float16",
)
rsqrt = _unary(
    "rsqrt",
    _rsqrt_np,
    lambda grad, result: grad * -0.5 * (result * result * result),
    "``1 / sqrt(input)`` elementwise.",
    autocast="fp32_float16",
    decompose=lambda input: _rsqrt_decomposed(input),
)
reciprocal = _unary(
    "reciprocal",
    _reciprocal_np,
    lambda grad, result: -grad * (result * result),
    "``1 / input`` elementwise (integer inputs give the default float dtype).",
    autocast="fp32_float16",
)
tan = _unary(
    "tan", np.tan, lambda grad, result: grad * (result * result + 1), "Tangent elementwise.", autocast="fp32_float16"
)
asin = _unary(
    "asin",
    np.arcsin,
    lambda grad, input: grad * rsqrt(-input * input + 1),
    "Arcsine elementwise.",
    autocast="fp32_float16",
    methods=("asin", "arcsin"),
)
acos = _unary(
    "acos",
    np.arccos,
    lambda grad, input: grad * -rsqrt(-input * input + 1),
    "Arccosine elementwise.",
    autocast="fp32_float16",
    methods=("acos", "arccos"),
)
atan = _unary(
    "atan",
    np.arctan,
    lambda grad, input: grad / (input * input + 1),
    "Arctangent elementwise.",
    methods=("atan", "arctan"),
)
sinh = _unary(
    "sinh", np.sinh, lambda grad, input: grad * cosh(input), "Hyperbolic sine elementwise.", autocast="fp32_float16"
)
cosh = _unary(
    "cosh", np.cosh, lambda grad, input: grad * sinh(input), "Hyperbolic cosine elementwise.", autocast="fp32_float16"
)
asinh = _unary(
    "asinh",
    np.arcsinh,
    lambda grad, input: grad * rsqrt(input * input + 1),
    "Inverse hyperbolic sine elementwise.",
    methods=("asinh", "arcsinh"),
)
acosh = _unary(
    "acosh",
    np.arccosh,
    lambda grad, input: grad * rsqrt(input * input - 1),
    "Inverse hyperbolic cosine elementwise.",
    methods=("acosh", "arccosh"),
)
atanh = _unary(
    "atanh",
    np.arctanh,
    lambda grad, input: grad / (1 - input * input),
    "Inverse hyperbolic tangent elementwise.",
    methods=("atanh", "arctanh"),
)
arcsin, arccos, arctan, arcsinh, arccosh, arctanh = asin, acos, atan, asinh, acosh, atanh


def _logit_ref(spec, a, eps=None):
    d = spec.dtype
    compute = _compute_np(d)
    if d in _HALF:  # PyTorch's logit kernel rounds every step to the half type (no float32 opmath)

        def rnd(v):
            return np.asarray(v, dtype=compute).astype(d.numpy).astype(compute)

    else:

        def rnd(v):
            return np.asarray(v, dtype=compute)

    x = _arg(a, compute)
    if eps is not None and eps >= 0:
        lo = rnd(eps)
        hi = rnd(1 - lo)
        x = np.where(x < lo, lo, np.where(x > hi, hi, x))
    return np.log(rnd(np.divide(x, rnd(1 - x), dtype=compute)))


def _logit_meta(input, eps=None):
    spec = _LOGIT_BASE(input)
    if eps is not None and not isinstance(eps, (int, float)):
        raise TypeError(f"logit(): argument 'eps' must be float, not {type(eps).__name__}")
    return spec


def _logit_backward(grad, input, eps):
    """PyTorch's (vectorised and double-backward) rule: outside ``[0, 1]`` the gradient is NaN, or 0
    outside ``[eps, 1 - eps]`` when ``eps`` is given (NaN inputs included)."""
    scale = grad / (input * (1 - input))
    if eps is None or eps < 0:
        return where((input >= 0) & (input <= 1), scale, math.nan)
    return where((input >= eps) & (input <= 1 - eps), scale, 0.0)


_LOGIT_BASE = unary_meta("logit")


def _logit_decomposed(input, eps=None):
    """``logit`` in kiln ops: ``log(x / (1 - x))`` with ``x`` clamped to ``[eps, 1 - eps]`` (each step in the
    result dtype: half precision rounds at every step, as PyTorch's kernel does)."""
    from kiln._ops.elementwise import log

    d = input._dtype if input._dtype.is_floating_point else dt.get_default_dtype()
    x = input.to(d)
    if eps is not None and eps >= 0:
        step = np.dtype(d.numpy)  # the bounds as the reference rounds them
        lo = np.asarray(eps, np.float32 if d in _HALF else step).astype(step)
        hi = np.asarray(np.asarray(1, lo.dtype) - lo).astype(step)
        x = where(x < float(lo), float(lo), where(x > float(hi), float(hi), x))
    return log(x / (-x + 1))


@op(
    decompose=_logit_decomposed,
    tags=("pointwise",),
    inplace=True,
    meta=_logit_meta,
    reference=_logit_ref,
    backward=_logit_backward,
    methods=("logit",),
)
def logit(input: Tensor, eps: float | None = None) -> Tensor:
    """``log(input / (1 - input))`` elementwise; with ``eps``, ``input`` is first clamped to ``[eps, 1 - eps]``."""


# ---------------------------------------------------------------------------------------- unary, dtype-preserving


def _square_meta(input):
    _need_tensor(input, "input", 1, "square")
    return Spec((input._shape, dt.int64 if input._dtype is dt.bool else input._dtype, input._device))


def _square_ref(spec, a):
    compute = _compute_np(spec.dtype)
    x = _arg(a, compute)
    return np.multiply(x, x, dtype=compute)


def _square_decomposed(input):
    """``square`` in kiln ops: ``input * input`` (bool inputs as int64)."""
    x = input.to(dt.int64) if input._dtype is dt.bool else input
    return x * x


@op(
    decompose=_square_decomposed,
    tags=("pointwise",),
    inplace=True,
    meta=_square_meta,
    reference=_square_ref,
    backward=lambda grad, input: grad * 2 * input,
    methods=("square",),
    grad_fn_name="PowBackward0",
)
def square(input: Tensor) -> Tensor:
    """``input * input`` elementwise (``input ** 2``; bool inputs give int64)."""


def _sign_np(a):
    if a.dtype == bool:
        return _copy(a)
    s = np.sign(a)
    return np.where(np.isnan(a), 0, s) if a.dtype.kind == "f" else s


def _sgn_decomposed(input):
    """``sgn`` in kiln ops: ``sign`` (the same for real tensors)."""
    from kiln._ops.elementwise import sign

    return sign(input)


sgn = _unary(
    "sgn",
    _sign_np,
    lambda grad: _zeros_like(grad),
    "The sign (-1, 0, 1) of each element; for real tensors the same as :func:`sign`.",
    int_to_float=False,
    decompose=lambda input: _sgn_decomposed(input),
)


def _rounding_meta(name: str):
    def meta(input):
        _need_tensor(input, "input", 1, name)
        if input._dtype is dt.bool:
            raise _not_implemented(f"{name}_vml_cpu", dt.bool)
        return Spec((input._shape, input._dtype, input._device))

    return meta


def _rounding_ref(np_fn):
    def ref(spec, a):
        if spec.dtype.is_floating_point:
            return np_fn(_arg(a, _compute_np(spec.dtype)))
        return _copy(a)  # integers are already whole

    return ref


def _rounding(name: str, np_fn, doc: str, aliases: tuple[str, ...] = ()):
    @op(
        tags=("pointwise",),
        inplace=True,
        meta=_rounding_meta(name),
        reference=_rounding_ref(np_fn),
        backward=lambda grad: _zeros_like(grad),
        name=name,
        doc=doc,
        methods=(name, *aliases),
    )
    def rounding(input: Tensor) -> Tensor:
        pass

    return rounding


floor = _rounding("floor", np.floor, "The largest integer not greater than each element.")
ceil = _rounding("ceil", np.ceil, "The smallest integer not less than each element.")
trunc = _rounding("trunc", np.trunc, "Each element rounded toward zero (its integer part).", aliases=("fix",))
fix = trunc


def _round_meta(input, decimals=0):
    _need_tensor(input, "input", 1, "round")
    if not isinstance(decimals, int):
        raise TypeError(f"round(): argument 'decimals' must be int, not {type(decimals).__name__}")
    d = input._dtype
    if d is dt.bool or (decimals != 0 and not d.is_floating_point):
        raise _not_implemented("round_cpu" if decimals != 0 else "round_vml_cpu", d)
    return Spec((input._shape, d, input._device))


def _round_ref(spec, a, decimals=0):
    if not spec.dtype.is_floating_point:
        return _copy(a)
    compute = _compute_np(spec.dtype)
    x = _arg(a, compute)
    if decimals == 0:
        return np.rint(x)
    scale = compute.type(np.power(np.float64(10.0), abs(decimals)))  # rounds half to even, as nearbyint
    if decimals > 0:
        return np.divide(np.rint(np.multiply(x, scale, dtype=compute)), scale, dtype=compute)
    return np.multiply(np.rint(np.divide(x, scale, dtype=compute)), scale, dtype=compute)


@op(
    tags=("pointwise",),
    inplace=True,
    meta=_round_meta,
    reference=_round_ref,
    backward=lambda grad: _zeros_like(grad),
    methods=("round",),
    grad_fn_name=lambda args: "RoundBackward1" if len(args) > 1 and args[1] != 0 else "RoundBackward0",
)
def round(input: Tensor, *, decimals: int = 0) -> Tensor:  # noqa: A001 - mirrors torch.round
    """Each element rounded to ``decimals`` decimal places, halves to even (negative ``decimals`` round
    to tens, hundreds...)."""


def _frac_meta(input):
    _need_tensor(input, "input", 1, "frac")
    if not input._dtype.is_floating_point:
        raise _not_implemented("frac_cpu", input._dtype)
    return Spec((input._shape, input._dtype, input._device))


def _frac_ref(spec, a):
    x = _arg(a, _compute_np(spec.dtype))
    return x - np.trunc(x)


def _frac_decomposed(input):
    """``frac`` in kiln ops: ``input - trunc(input)``."""
    return input - trunc(input)


@op(
    decompose=_frac_decomposed,
    tags=("pointwise",),
    inplace=True,
    meta=_frac_meta,
    reference=_frac_ref,
    backward=lambda grad: grad,
    methods=("frac",),
)
def frac(input: Tensor) -> Tensor:
    """The fractional part ``input - trunc(input)`` of each element (sign kept)."""


def positive(input: Tensor) -> Tensor:
    """``input`` itself (``+input``); refused for bool tensors, as in PyTorch."""
    _need_tensor(input, "input", 1, "positive")
    if input._dtype is dt.bool:
        raise RuntimeError("The `+` operator, on a bool tensor is not supported.")
    return input


Tensor.positive = positive
Tensor.__pos__ = positive


# ---------------------------------------------------------------------------------------- float classification


def _classify(name: str, fn, non_float: bool, doc: str, decompose=None):
    def ref(spec, a):
        if a.dtype.kind in "fV":
            return fn(a)
        return np.full(a.shape, non_float)

    @op(
        tags=("pointwise",),
        meta=unary_meta(name, bool_result=True),
        reference=ref,
        name=name,
        doc=doc,
        methods=(name,),
        decompose=decompose,
    )
    def classify(input: Tensor) -> Tensor:
        pass

    return classify


def _isposinf_decomposed(input):
    """``isposinf`` in kiln ops: ``input == inf`` (never true for integers)."""
    from kiln._ops.comparison import eq

    return eq(input, math.inf)


def _isneginf_decomposed(input):
    """``isneginf`` in kiln ops: ``input == -inf``."""
    from kiln._ops.comparison import eq

    return eq(input, -math.inf)


def _isinf_decomposed(input):
    """``isinf`` in kiln ops: ``input == inf or input == -inf``."""
    from kiln._ops.binary_math import logical_or
    from kiln._ops.comparison import eq

    return logical_or(eq(input, math.inf), eq(input, -math.inf))


def _isfinite_decomposed(input):
    """``isfinite`` in kiln ops: neither infinite nor NaN (always true for integers)."""
    from kiln._ops.binary_math import logical_or
    from kiln._ops.elementwise import isnan, logical_not

    return logical_not(logical_or(_isinf_decomposed(input), isnan(input)))


isinf = _classify("isinf", np.isinf, False, "True where ``input`` is ``+inf`` or ``-inf``.", _isinf_decomposed)
isposinf = _classify(
    "isposinf", lambda a: a == np.inf, False, "True where ``input`` is ``+inf``.", _isposinf_decomposed
)
isneginf = _classify(
    "isneginf", lambda a: a == -np.inf, False, "True where ``input`` is ``-inf``.", _isneginf_decomposed
)
isfinite = _classify(
    "isfinite", np.isfinite, True, "True where ``input`` is neither infinite nor NaN.", _isfinite_decomposed
)


def _nan_to_num_meta(input, nan=0.0, posinf=None, neginf=None):
    _need_tensor(input, "input", 1, "nan_to_num")
    for name, v in (("nan", nan), ("posinf", posinf), ("neginf", neginf)):
        if v is not None and not is_scalar(v):
            raise TypeError(f"nan_to_num(): argument '{name}' must be float, not {type(v).__name__}")
    return Spec((input._shape, input._dtype, input._device))


def _nan_to_num_ref(spec, a, nan=0.0, posinf=None, neginf=None):
    d = spec.dtype
    if not d.is_floating_point:
        return _copy(a)
    compute = _compute_np(d)
    x = _arg(a, compute)
    top = _FLOAT_MAX[d]

    def value(v, default):
        return np.array(default if v is None else v, dtype=np.float64).astype(compute)

    nan_v, pos_v, neg_v = value(nan, 0.0), value(posinf, top), value(neginf, -top)
    return np.where(np.isnan(x), nan_v, np.where(x == np.inf, pos_v, np.where(x == -np.inf, neg_v, x)))


def _nan_to_num_decomposed(input, nan=0.0, posinf=None, neginf=None):
    """``nan_to_num`` in kiln ops: ``where`` NaN, ``+inf`` and ``-inf`` are, the replacements (the dtype's
    largest finite values by default); integer tensors are unchanged."""
    from kiln._ops.comparison import eq
    from kiln._ops.creation import tensor
    from kiln._ops.elementwise import isnan

    d = input._dtype
    if not d.is_floating_point:
        return input
    compute = dt.float32 if d in _HALF else d
    x = input.to(compute)
    top = _FLOAT_MAX[d]

    def value(v, default):
        return tensor(float(default if v is None else v), dtype=dt.float64, device=input._device).to(compute)

    out = where(eq(x, -math.inf), value(neginf, -top), x)
    out = where(eq(x, math.inf), value(posinf, top), out)
    return where(isnan(x), value(nan, 0.0), out).to(d)


@op(
    decompose=_nan_to_num_decomposed,
    tags=("pointwise",),
    inplace=True,
    meta=_nan_to_num_meta,
    reference=_nan_to_num_ref,
    backward=lambda grad, input: grad * isfinite(input),
    methods=("nan_to_num",),
)
def nan_to_num(input: Tensor, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None) -> Tensor:
    """NaN, ``+inf`` and ``-inf`` replaced by ``nan``, ``posinf`` and ``neginf`` (by default 0 and the
    dtype's largest and lowest finite values)."""
