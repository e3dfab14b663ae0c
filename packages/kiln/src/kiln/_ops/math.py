"""Elementwise math beyond the basics: exponentials and logarithms, trigonometric and hyperbolic
functions and their inverses, the error function family, rounding, ``fmod``/``remainder``,
``clamp``, ``lerp``, ``addcmul``/``addcdiv``, float classification (``isinf``...), ``nan_to_num``,
logical ops, bit shifts, ``hypot``, ``copysign`` and ``atan2``.

Every op follows PyTorch 2.x on CPU: integer and bool inputs of floating functions compute in the
default float dtype; half types compute in float32 and round once (see :mod:`.elementwise`), after
wider operands are rounded to the half type as PyTorch casts operands to the common dtype (``logit``
rounds every step, as PyTorch's kernel does); errors raised by meta functions carry PyTorch's types and
wording. NumPy has no ``erf``: ``erf``/``erfc`` use the rational approximations of the Cephes library
in float64 (within 3 and 10 ulp of C's), and ``erfinv`` refines an initial approximation with
Halley/Newton steps on them (within a few ulp of PyTorch's).
"""

from __future__ import annotations

import math

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops._meta import broadcast_pair, common_device, is_scalar, result_type, scalar_type_name
from kiln._ops.elementwise import (
    _HALF,
    _arg,
    _compute_np,
    _div_meta,
    _div_ref,
    _unary,
    _zeros_like,
    binary_meta,
    div,
    exp,
    unary_meta,
    where,
)
from kiln._tensor import Tensor

Number = "int | float | bool"
_LN2 = math.log(2.0)
_LN10 = math.log(10.0)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_HALF_SQRT_PI = math.sqrt(math.pi) / 2.0

# C++ names PyTorch prints for dtypes: ``TypeMeta`` names (lerp's dtype checks) and the scalar types of
# ``value cannot be converted to type ... without overflow``.
_TYPEMETA_NAMES = {
    dt.bool: "bool",
    dt.uint8: "unsigned char",
    dt.int8: "signed char",
    dt.int16: "short int",
    dt.int32: "int",
    dt.int64: "long int",
    dt.float16: "c10::Half",
    dt.bfloat16: "c10::BFloat16",
    dt.float32: "float",
    dt.float64: "double",
}
_CTYPE_NAMES = {
    dt.uint8: "uint8_t",
    dt.int8: "int8_t",
    dt.int16: "int16_t",
    dt.int32: "int",
    dt.int64: "int64_t",
    dt.float16: "c10::Half",
    dt.bfloat16: "c10::BFloat16",
    dt.float32: "float",
    dt.float64: "double",
}
_FLOAT_MAX = {
    dt.float16: 65504.0,
    dt.bfloat16: 3.3895313892515355e38,
    dt.float32: 3.4028234663852886e38,
    dt.float64: 1.7976931348623157e308,
}


def _need_tensor(x, name: str, position: int, op_name: str) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{op_name}(): argument '{name}' (position {position}) must be Tensor, not {type(x).__name__}")


def _need_number(x, name: str, op_name: str) -> None:
    if not is_scalar(x):
        raise TypeError(f"{op_name}(): argument '{name}' must be Number, not {type(x).__name__}")


def _need_tensor_or_number(x, name: str, op_name: str) -> None:
    if not isinstance(x, Tensor) and not is_scalar(x):
        raise TypeError(
            f"{op_name}() received an invalid combination of arguments - argument '{name}' must be Tensor or "
            f"Number, not {type(x).__name__}"
        )


def _not_implemented(kernel: str, d: dt.dtype) -> NotImplementedError:
    return NotImplementedError(f"\"{kernel}\" not implemented for '{scalar_type_name(d)}'")


def _copy(a: np.ndarray) -> np.ndarray:
    """A copy keeping the layout: a kernel must never hand back (a view of) its input's memory."""
    return np.array(a, copy=True, order="K")


def _as_float(a: np.ndarray) -> np.ndarray:
    """bfloat16 (an ``ml_dtypes`` array) as float32 for the NumPy functions that lack it."""
    return a.astype(np.float32) if a.dtype.kind == "V" else a


def _rounded(x, spec):
    """PyTorch casts operands to the common dtype before computing: a wider operand of a half-precision
    result (a 0-d float64 tensor with a float16 one) is rounded to it first."""
    d = spec[1]
    if d in _HALF and isinstance(x, np.ndarray) and x.dtype != d.numpy:
        return x.astype(d.numpy)
    return x


def _operand(x, spec):
    """An operand in the compute dtype of result dtype ``spec[1]`` (see :func:`_rounded`)."""
    return _arg(_rounded(x, spec), _compute_np(spec[1]), spec[1])


def _binary_ref(np_fn):
    """Reference kernel ``np_fn(a, b)`` in the compute dtype of the result (see :func:`_operand`)."""
    return lambda spec, a, b: np_fn(_operand(a, spec), _operand(b, spec))


# ---------------------------------------------------------------------------------------- erf family


def _poly(x: np.ndarray, coefs: tuple) -> np.ndarray:
    """Horner's rule (leading coefficient first) on one temporary."""
    r = np.full_like(x, coefs[0])
    for c in coefs[1:]:
        r *= x
        r += c
    return r


# Cephes ndtr.c: erf(x) = x T(x^2) / U(x^2) for |x| < 1; erfc(x) = exp(-x^2) P(x) / Q(x) for 1 <= x < 8
# and exp(-x^2) R(x) / S(x) above (leading coefficients first; U, Q, S are monic).
_ERF_T = (
    9.60497373987051638749e0,
    9.00260197203842689217e1,
    2.23200534594684319226e3,
    7.00332514112805075473e3,
    5.55923013010394962768e4,
)
_ERF_U = (
    1.0,
    3.35617141647503099647e1,
    5.21357949780152679795e2,
    4.59432382970980127987e3,
    2.26290000613890934246e4,
    4.92673942608635921086e4,
)
_ERFC_P = (
    2.46196981473530512524e-10,
    5.64189564831068821977e-1,
    7.46321056442269912687e0,
    4.86371970985681366614e1,
    1.96520832956077098242e2,
    5.26445194995477358631e2,
    9.34528527171957607540e2,
    1.02755188689515710272e3,
    5.57535335369399327526e2,
)
_ERFC_Q = (
    1.0,
    1.32281951154744992508e1,
    8.67072140885989742329e1,
    3.54937778887819891062e2,
    9.75708501743205489753e2,
    1.82390916687909736289e3,
    2.24633760818710981792e3,
    1.65666309194161350182e3,
    5.57535340817727675546e2,
)
_ERFC_R = (
    5.64189583547755073984e-1,
    1.27536670759978104416e0,
    5.01905042251180477414e0,
    6.16021097993053585195e0,
    7.40974269950448939160e0,
    2.97886665372100240670e0,
)
_ERFC_S = (
    1.0,
    2.26052863220117276590e0,
    9.39603524938001434673e0,
    1.20489539808096656605e1,
    1.70814450747565897222e1,
    9.60896809063285878198e0,
    3.36907645100081516050e0,
)


def _exp_neg_square(x: np.ndarray) -> np.ndarray:
    """``exp(-x*x)`` without the rounding error of ``x*x`` (which exp would multiply by ``x*x``):
    ``x = m + f`` with ``m`` a multiple of 1/128, so ``m*m`` is exact."""
    m = np.round(x * 128.0) / 128.0
    f = x - m
    return np.exp(-m * m) * np.exp(-(2.0 * m * f + f * f))


def _erfc_tail(x: np.ndarray, precise: bool) -> np.ndarray:
    """erfc(x) for a 1-d array of x >= 1 (inf and NaN included). ``precise``: full relative accuracy even
    where erfc is tiny (not needed for ``erf = 1 - erfc``)."""
    x = np.minimum(x, 30.0)  # erfc underflows to 0 from 27.3 on; keeps inf out of the polynomials
    near = x < 8.0
    if near.all():
        out = _poly(x, _ERFC_P) / _poly(x, _ERFC_Q)
    else:
        out = np.empty_like(x)
        xn, xf = x[near], x[~near]
        out[near] = _poly(xn, _ERFC_P) / _poly(xn, _ERFC_Q)
        out[~near] = _poly(xf, _ERFC_R) / _poly(xf, _ERFC_S)
    out *= _exp_neg_square(x) if precise else np.exp(-x * x)
    return out


def _erf_centre(a: np.ndarray) -> np.ndarray:
    z = a * a
    return a * _poly(z, _ERF_T) / _poly(z, _ERF_U)


def erf_np(a) -> np.ndarray:
    """The error function of a float64 array (relative error within a few ulp)."""
    a = np.asarray(a, dtype=np.float64)
    flat = a.reshape(-1)
    x = np.abs(flat)
    centre = x < 1.0
    if centre.all():
        return _erf_centre(a)
    rest = ~centre
    out = np.empty_like(flat)
    out[centre] = _erf_centre(flat[centre])
    out[rest] = np.copysign(1.0 - _erfc_tail(x[rest], precise=False), flat[rest])
    return out.reshape(a.shape)


def erfc_np(a) -> np.ndarray:
    """The complementary error function ``1 - erf`` of a float64 array, accurate in its tail."""
    a = np.asarray(a, dtype=np.float64)
    flat = a.reshape(-1)
    x = np.abs(flat)
    centre = x < 1.0
    if centre.all():
        return 1.0 - _erf_centre(a)
    rest = ~centre
    out = np.empty_like(flat)
    out[centre] = 1.0 - _erf_centre(flat[centre])
    tail = _erfc_tail(x[rest], precise=True)
    out[rest] = np.where(flat[rest] < 0, 2.0 - tail, tail)
    return out.reshape(a.shape)


def _giles(v: np.ndarray) -> np.ndarray:
    """Giles' single-precision approximation of erfinv for ``0 <= v < 1``."""
    w = -np.log((1.0 - v) * (1.0 + v))
    out = np.empty_like(v)
    low = w < 5.0
    w1 = w[low] - 2.5
    p = np.full_like(w1, 2.81022636e-08)
    for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503, -0.00417768164):
        p = c + p * w1
    out[low] = 1.50140941 + (0.246640727 + p * w1) * w1
    w2 = np.sqrt(w[~low]) - 3.0
    p = np.full_like(w2, -0.000200214257)
    for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613, 0.00943887047):
        p = c + p * w2
    out[~low] = 2.83297682 + (1.00167406 + p * w2) * w2
    return out * v


def erfinv_np(y) -> np.ndarray:
    """The inverse error function of a float64 array: Giles' single-precision approximation refined to
    full double precision by Halley steps on ``erf(x) = |y|`` where ``|y| <= 0.5``, and by Newton steps on
    ``log erfc(x) = log(1 - |y|)`` (nearly quadratic in x, and exact in ``1 - |y|``) above."""
    y = np.asarray(y, dtype=np.float64)
    flat = y.reshape(-1)
    ay = np.abs(flat)
    out = np.where(ay == 1.0, np.inf, np.nan)  # NaN outside [-1, 1] and for NaN
    inside = ay < 1.0
    v = ay[inside]
    x = _giles(v)
    centre = v <= 0.5
    xc, vc = x[centre], v[centre]
    for _ in range(4):  # cubic convergence: a step below 1e-6 (relative) leaves an error near 1e-18
        d = (erf_np(xc) - vc) / (_TWO_OVER_SQRT_PI * np.exp(-xc * xc))
        step = d / (1.0 + xc * d)
        xc = xc - step
        if not (np.abs(step) > 1e-6 * np.abs(xc)).any():
            break
    xt, qt = x[~centre], 1.0 - v[~centre]
    for _ in range(8):  # quadratic convergence: a step below 1e-10 leaves an error below 1e-19
        ec = erfc_np(xt)
        step = np.log(ec / qt) * ec / (_TWO_OVER_SQRT_PI * _exp_neg_square(xt))
        xt = xt + step
        if not (np.abs(step) > 1e-10 * xt).any():
            break
    x[centre], x[~centre] = xc, xt
    out[inside] = x
    return np.copysign(out, flat).reshape(y.shape)


# ---------------------------------------------------------------------------------------- unary, floating results


def _f64(fn):
    """A float64 NumPy function applied to the compute array (its result rounds to the result dtype)."""
    return lambda a: fn(a.astype(np.float64))


def _rsqrt_np(a):
    return np.divide(1, np.sqrt(a), dtype=a.dtype)


def _reciprocal_np(a):
    return np.divide(1, a, dtype=a.dtype)


exp2 = _unary(
    "exp2", np.exp2, lambda grad, result: grad * result * _LN2, "``2 ** input`` elementwise.", autocast="fp32"
)
expm1 = _unary(
    "expm1",
    np.expm1,
    lambda grad, result: grad * (result + 1),
    "``exp(input) - 1`` elementwise, accurate for small ``input``.",
    autocast="fp32",
)
log2 = _unary(
    "log2", np.log2, lambda grad, input: grad / (input * _LN2), "Base-2 logarithm elementwise.", autocast="fp32"
)
log10 = _unary(
    "log10", np.log10, lambda grad, input: grad / (input * _LN10), "Base-10 logarithm elementwise.", autocast="fp32"
)
log1p = _unary(
    "log1p",
    np.log1p,
    lambda grad, input: grad / (input + 1),
    "``log(1 + input)`` elementwise, accurate for small ``input``.",
    autocast="fp32",
)
rsqrt = _unary(
    "rsqrt",
    _rsqrt_np,
    lambda grad, result: grad * -0.5 * (result * result * result),
    "``1 / sqrt(input)`` elementwise.",
    autocast="fp32",
)
reciprocal = _unary(
    "reciprocal",
    _reciprocal_np,
    lambda grad, result: -grad * (result * result),
    "``1 / input`` elementwise (integer inputs give the default float dtype).",
    autocast="fp32",
)
tan = _unary("tan", np.tan, lambda grad, result: grad * (result * result + 1), "Tangent elementwise.", autocast="fp32")
asin = _unary(
    "asin",
    np.arcsin,
    lambda grad, input: grad * rsqrt(-input * input + 1),
    "Arcsine elementwise.",
    autocast="fp32",
    methods=("asin", "arcsin"),
)
acos = _unary(
    "acos",
    np.arccos,
    lambda grad, input: grad * -rsqrt(-input * input + 1),
    "Arccosine elementwise.",
    autocast="fp32",
    methods=("acos", "arccos"),
)
atan = _unary(
    "atan",
    np.arctan,
    lambda grad, input: grad / (input * input + 1),
    "Arctangent elementwise.",
    methods=("atan", "arctan"),
)
sinh = _unary("sinh", np.sinh, lambda grad, input: grad * cosh(input), "Hyperbolic sine elementwise.", autocast="fp32")
cosh = _unary(
    "cosh", np.cosh, lambda grad, input: grad * sinh(input), "Hyperbolic cosine elementwise.", autocast="fp32"
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
erf = _unary(
    "erf",
    _f64(erf_np),
    lambda grad, input: grad * _TWO_OVER_SQRT_PI * exp(-(input * input)),
    "The error function ``2/sqrt(pi) * integral_0^x exp(-t^2) dt`` elementwise.",
)
erfc = _unary(
    "erfc",
    _f64(erfc_np),
    lambda grad, input: grad * -_TWO_OVER_SQRT_PI * exp(-(input * input)),
    "The complementary error function ``1 - erf(input)`` elementwise, accurate where erf is near 1.",
)
erfinv = _unary(
    "erfinv",
    _f64(erfinv_np),
    lambda grad, result: grad * _HALF_SQRT_PI * exp(result * result),
    "The inverse error function elementwise (``±inf`` at ``±1``, NaN outside ``[-1, 1]``).",
    autocast="fp32",
)
arcsin, arccos, arctan, arcsinh, arccosh, arctanh = asin, acos, atan, asinh, acosh, atanh


def _logit_ref(spec, a, eps=None):
    d = spec[1]
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


@op(meta=_logit_meta, reference=_logit_ref, backward=_logit_backward, methods=("logit",))
def logit(input: Tensor, eps: float | None = None) -> Tensor:
    """``log(input / (1 - input))`` elementwise; with ``eps``, ``input`` is first clamped to ``[eps, 1 - eps]``."""


# ---------------------------------------------------------------------------------------- unary, dtype-preserving


def _square_meta(input):
    _need_tensor(input, "input", 1, "square")
    return (input._shape, dt.int64 if input._dtype is dt.bool else input._dtype, input._device)


def _square_ref(spec, a):
    compute = _compute_np(spec[1])
    x = _arg(a, compute)
    return np.multiply(x, x, dtype=compute)


@op(
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


sgn = _unary(
    "sgn",
    _sign_np,
    lambda grad: _zeros_like(grad),
    "The sign (-1, 0, 1) of each element; for real tensors the same as :func:`sign`.",
    int_to_float=False,
)


def _rounding_meta(name: str):
    def meta(input):
        _need_tensor(input, "input", 1, name)
        if input._dtype is dt.bool:
            raise _not_implemented(f"{name}_vml_cpu", dt.bool)
        return (input._shape, input._dtype, input._device)

    return meta


def _rounding_ref(np_fn):
    def ref(spec, a):
        if spec[1].is_floating_point:
            return np_fn(_arg(a, _compute_np(spec[1])))
        return _copy(a)  # integers are already whole

    return ref


def _rounding(name: str, np_fn, doc: str):
    @op(
        meta=_rounding_meta(name),
        reference=_rounding_ref(np_fn),
        backward=lambda grad: _zeros_like(grad),
        name=name,
        doc=doc,
        methods=(name,),
    )
    def rounding(input: Tensor) -> Tensor:
        pass

    return rounding


floor = _rounding("floor", np.floor, "The largest integer not greater than each element.")
ceil = _rounding("ceil", np.ceil, "The smallest integer not less than each element.")
trunc = _rounding("trunc", np.trunc, "Each element rounded toward zero (its integer part).")
fix = trunc
Tensor.fix = trunc


def _round_meta(input, decimals=0):
    _need_tensor(input, "input", 1, "round")
    if not isinstance(decimals, int):
        raise TypeError(f"round(): argument 'decimals' must be int, not {type(decimals).__name__}")
    d = input._dtype
    if d is dt.bool or (decimals != 0 and not d.is_floating_point):
        raise _not_implemented("round_cpu" if decimals != 0 else "round_vml_cpu", d)
    return (input._shape, d, input._device)


def _round_ref(spec, a, decimals=0):
    if not spec[1].is_floating_point:
        return _copy(a)
    compute = _compute_np(spec[1])
    x = _arg(a, compute)
    if decimals == 0:
        return np.rint(x)
    scale = compute.type(np.power(np.float64(10.0), abs(decimals)))  # rounds half to even, as nearbyint
    if decimals > 0:
        return np.divide(np.rint(np.multiply(x, scale, dtype=compute)), scale, dtype=compute)
    return np.multiply(np.rint(np.divide(x, scale, dtype=compute)), scale, dtype=compute)


@op(
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
    return (input._shape, input._dtype, input._device)


def _frac_ref(spec, a):
    x = _arg(a, _compute_np(spec[1]))
    return x - np.trunc(x)


@op(meta=_frac_meta, reference=_frac_ref, backward=lambda grad: grad, methods=("frac",))
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


def _classify(name: str, fn, non_float: bool, doc: str):
    def ref(spec, a):
        if a.dtype.kind in "fV":
            return fn(a)
        return np.full(a.shape, non_float)

    @op(meta=unary_meta(name, bool_result=True), reference=ref, name=name, doc=doc, methods=(name,))
    def classify(input: Tensor) -> Tensor:
        pass

    return classify


isinf = _classify("isinf", np.isinf, False, "True where ``input`` is ``+inf`` or ``-inf``.")
isposinf = _classify("isposinf", lambda a: a == np.inf, False, "True where ``input`` is ``+inf``.")
isneginf = _classify("isneginf", lambda a: a == -np.inf, False, "True where ``input`` is ``-inf``.")
isfinite = _classify("isfinite", np.isfinite, True, "True where ``input`` is neither infinite nor NaN.")


def _nan_to_num_meta(input, nan=0.0, posinf=None, neginf=None):
    _need_tensor(input, "input", 1, "nan_to_num")
    for name, v in (("nan", nan), ("posinf", posinf), ("neginf", neginf)):
        if v is not None and not is_scalar(v):
            raise TypeError(f"nan_to_num(): argument '{name}' must be float, not {type(v).__name__}")
    return (input._shape, input._dtype, input._device)


def _nan_to_num_ref(spec, a, nan=0.0, posinf=None, neginf=None):
    d = spec[1]
    if not d.is_floating_point:
        return _copy(a)
    compute = _compute_np(d)
    x = _arg(a, compute)
    top = _FLOAT_MAX[d]

    def value(v, default):
        return np.array(default if v is None else v, dtype=np.float64).astype(compute)

    nan_v, pos_v, neg_v = value(nan, 0.0), value(posinf, top), value(neginf, -top)
    return np.where(np.isnan(x), nan_v, np.where(x == np.inf, pos_v, np.where(x == -np.inf, neg_v, x)))


@op(
    meta=_nan_to_num_meta,
    reference=_nan_to_num_ref,
    backward=lambda grad, input: grad * isfinite(input),
    methods=("nan_to_num",),
)
def nan_to_num(input: Tensor, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None) -> Tensor:
    """NaN, ``+inf`` and ``-inf`` replaced by ``nan``, ``posinf`` and ``neginf`` (by default 0 and the
    dtype's largest and lowest finite values)."""


# ---------------------------------------------------------------------------------------- binary, floating


def _tensor_pair_meta(name: str, **kwargs):
    """A binary meta whose ``other`` must be a tensor (PyTorch offers no Scalar overload)."""
    base = binary_meta(name, **kwargs)

    def meta(input, other):
        _need_tensor(input, "input", 1, name)
        _need_tensor(other, "other", 2, name)
        return base(input, other)

    return meta


def _atan2_backward(grad, input, other, needs_input_grad):
    # an integer or bool operand is squared in the gradient's dtype: PyTorch squares (and negates) it in its
    # own dtype, which wraps for uint8 and raises for bool
    y, x = (t if t._dtype.is_floating_point else t.to(grad._dtype) for t in (input, other))
    denom = y * y + x * x
    recip = where(denom == 0, 0.0, 1 / denom)
    return (
        grad * x * recip if needs_input_grad[0] else None,
        grad * -y * recip if needs_input_grad[1] else None,
    )


@op(
    meta=_tensor_pair_meta("atan2", float_result=True),
    reference=_binary_ref(np.arctan2),
    backward=_atan2_backward,
    autocast="promote",
    methods=("atan2", "arctan2"),
)
def atan2(input: Tensor, other: Tensor) -> Tensor:
    """The angle of the point ``(other, input)``: ``atan(input / other)`` in the right quadrant, in ``[-pi, pi]``."""


arctan2 = atan2


def _hypot_meta(input, other):
    spec = _HYPOT_BASE(input, other)
    if not spec[1].is_floating_point:
        raise _not_implemented("hypot_cpu", spec[1])
    return spec


_HYPOT_BASE = _tensor_pair_meta("hypot")


@op(
    meta=_hypot_meta,
    reference=_binary_ref(np.hypot),
    backward=lambda grad, input, other, result, needs_input_grad: (
        grad * input / result if needs_input_grad[0] else None,
        grad * other / result if needs_input_grad[1] else None,
    ),
    methods=("hypot",),
)
def hypot(input: Tensor, other: Tensor) -> Tensor:
    """``sqrt(input**2 + other**2)`` elementwise without intermediate overflow."""


def _copysign_meta(input, other):
    _need_tensor(input, "input", 1, "copysign")
    return _COPYSIGN_BASE(input, other)


_COPYSIGN_BASE = binary_meta("copysign", float_result=True)


def _copysign_backward(grad, input, other, result, needs_input_grad):
    return (
        grad * where(input == 0, 0.0, result / input) if needs_input_grad[0] else None,
        _zeros_like(grad) if needs_input_grad[1] else None,
    )


@op(
    meta=_copysign_meta,
    reference=_binary_ref(np.copysign),
    backward=_copysign_backward,
    methods=("copysign",),
    grad_fn_name=lambda args: "CopysignBackward0" if isinstance(args[1], Tensor) else "CopysignBackward1",
)
def copysign(input: Tensor, other: Tensor | Number) -> Tensor:
    """The magnitude of ``input`` with the sign of ``other`` (``-0.0`` counts as negative)."""


# ---------------------------------------------------------------------------------------- fmod, remainder, floor_divide


def _modulo_meta(name: str, tensor_first: bool):
    base = binary_meta(name)

    def meta(input, other):
        if tensor_first:
            _need_tensor(input, "input", 1, name)
        spec = base(input, other)
        if spec[1] is dt.bool:
            raise _not_implemented(f"{name}_cpu", dt.bool)
        return spec

    return meta


def _check_int_divisor(spec, b) -> None:
    if 0 not in spec[0] and np.any(np.asarray(b) == 0):
        raise RuntimeError("ZeroDivisionError")


def _fmod_ref(spec, a, b):
    compute = _compute_np(spec[1])
    a, b = _operand(a, spec), _operand(b, spec)
    if compute.kind in "iu":
        _check_int_divisor(spec, b)
    return np.fmod(a, b, dtype=compute)


def _remainder_ref(spec, a, b):
    compute = _compute_np(spec[1])
    a, b = _operand(a, spec), _operand(b, spec)
    if compute.kind in "iu":
        _check_int_divisor(spec, b)
    mod = np.fmod(a, b, dtype=compute)
    # PyTorch's rule: move a nonzero remainder whose sign differs from the divisor's by one divisor
    fix = (mod != 0) & ((np.asarray(b) < 0) != (mod < 0))
    return np.where(fix, mod + b, mod).astype(compute, copy=False)


def _fmod_backward(grad, input, other, needs_input_grad):
    return (
        grad if needs_input_grad[0] else None,
        -grad * div(input, other, rounding_mode="trunc") if needs_input_grad[1] else None,
    )


def _remainder_backward(grad, input, other, needs_input_grad):
    if needs_input_grad[1] and not isinstance(input, Tensor):
        raise RuntimeError("derivative for aten::remainder is not implemented")
    return (
        grad if needs_input_grad[0] else None,
        -grad * div(input, other, rounding_mode="floor") if needs_input_grad[1] else None,
    )


@op(
    meta=_modulo_meta("fmod", tensor_first=True),
    reference=_fmod_ref,
    backward=_fmod_backward,
    methods=("fmod",),
    grad_fn_name=lambda args: "FmodBackward1" if isinstance(args[1], Tensor) else "FmodBackward0",
)
def fmod(input: Tensor, other: Tensor | Number) -> Tensor:
    """C's ``fmod``: the remainder of ``input / other`` with the sign of ``input`` (integer division by
    zero raises)."""


@op(
    meta=_modulo_meta("remainder", tensor_first=False),
    reference=_remainder_ref,
    backward=_remainder_backward,
    methods=("remainder", "__mod__"),
    grad_fn_name=lambda args: "RemainderBackward1" if isinstance(args[1], Tensor) else "RemainderBackward0",
)
def remainder(input: Tensor | Number, other: Tensor | Number) -> Tensor:
    """Python's ``%``: the remainder of ``input / other`` with the sign of ``other`` (integer division by
    zero raises)."""


def _rmod(self, other):
    return remainder(other, self)


Tensor.__rmod__ = _rmod


def _floor_divide_backward(grad):
    raise RuntimeError("derivative for aten::floor_divide is not implemented")


@op(
    meta=lambda input, other: _div_meta(input, other, "floor"),
    reference=lambda spec, a, b: _div_ref(spec, _rounded(a, spec), _rounded(b, spec), "floor"),
    backward=_floor_divide_backward,
    methods=("floor_divide",),
)
def floor_divide(input: Tensor | Number, other: Tensor | Number) -> Tensor:
    """``floor(input / other)`` elementwise, as Python's ``//`` (like ``div(..., rounding_mode='floor')``;
    not differentiable)."""


def _rfloordiv(self, other):
    return floor_divide(other, self)


Tensor.__floordiv__ = floor_divide  # PyTorch's ``//`` is floor_divide (not differentiable)
Tensor.__rfloordiv__ = _rfloordiv

# ---------------------------------------------------------------------------------------- clamp


def _check_scalar_fits(value, d: dt.dtype) -> None:
    """PyTorch converts a Scalar argument to the result dtype with an overflow check (``c10::overflows``):
    integer types refuse out-of-range values (unsigned ones accept integers down to ``-max``, which
    wrap), floating types refuse finite values beyond their largest; infinities and NaN fit floats."""
    if isinstance(value, (bool, np.bool_)):
        return
    if isinstance(value, int) and not -(2**63) <= value < 2**63:
        raise OverflowError("int too big to convert")
    if d.is_floating_point:
        fits = not math.isfinite(value) or abs(value) <= _FLOAT_MAX[d]
    else:
        info = np.iinfo(d.numpy)
        low = -int(info.max) if info.min == 0 and isinstance(value, int) else int(info.min)
        fits = low <= value <= int(info.max)  # False for NaN
    if not fits:
        raise RuntimeError(f"value cannot be converted to type {_CTYPE_NAMES[d]} without overflow")


def _clamp_spec(name: str, kernel: str, input, low, high):
    """Spec of ``clamp``/``clamp_min``/``clamp_max``; ``kernel`` names the PyTorch kernel that refuses bools."""
    _need_tensor(input, "input", 1, name)
    bounds = [(n, b) for n, b in (("min", low), ("max", high)) if b is not None]
    for n, b in bounds:
        _need_tensor_or_number(b, n, name)
    tensors = [b for _, b in bounds if isinstance(b, Tensor)]
    scalars = [b for _, b in bounds if not isinstance(b, Tensor)]
    as_numbers = bool(tensors and scalars)
    if as_numbers:
        # PyTorch has a Tensor overload and a Number overload: a tensor bound next to a number must convert
        # to a Number (0-d, not requiring grad), and then counts as one for type promotion
        if any(t._shape or t._requires_grad for t in tensors):
            raise TypeError(
                f"{name}() received an invalid combination of arguments - a Tensor bound with a Number bound "
                "(only a 0-d tensor that does not require grad converts to a Number)"
            )
        scalars += [t.item() for t in tensors]
        dtype = result_type(input, *scalars)
    else:
        dtype = result_type(input, low, high)
    shape = input._shape
    for t in tensors:
        shape = broadcast_pair(shape, t._shape)
    if dtype is dt.bool and (as_numbers or not tensors or len(tensors) == 2):
        raise _not_implemented("clamp_cpu" if len(tensors) == 2 else f"{kernel}_scalar_cpu", dt.bool)
    for v in scalars:
        _check_scalar_fits(v, dtype)
    return (shape, dtype, common_device(name, input, *tensors))


_PLAIN_BOUNDS = (int, float, type(None))
_CLAMP_DTYPES: dict[tuple, dt.dtype] = {}


def _clamp_meta(input, min=None, max=None):
    plain = min.__class__ in _PLAIN_BOUNDS and max.__class__ in _PLAIN_BOUNDS
    if plain and input.__class__ is Tensor and (min is not None or max is not None):
        # the common case, Python number bounds: the dtype is memoised
        key = (input._dtype, bool(input._shape), min.__class__, max.__class__, dt._default_dtype)
        dtype = _CLAMP_DTYPES.get(key)
        if dtype is None:
            dtype = _CLAMP_DTYPES[key] = result_type(input, min, max)
        if dtype is not dt.float64:
            for v in (min, max):
                if v is not None:
                    _check_scalar_fits(v, dtype)
        return (input._shape, dtype, input._device)
    if min is None and max is None:
        _need_tensor(input, "input", 1, "clamp")
        raise RuntimeError("kiln.clamp: At least one of 'min' or 'max' must not be None")
    kernel = "clamp" if min is not None and max is not None else ("clamp_min" if min is not None else "clamp_max")
    return _clamp_spec("clamp", kernel, input, min, max)


def _clamp_ref(spec, a, low=None, high=None):
    x = _operand(a, spec)
    if low is not None:
        x = np.maximum(x, _operand(low, spec))
    if high is not None:
        x = np.minimum(x, _operand(high, spec))
    return x


def _clamp_backward(grad, input, min, max, needs_input_grad):
    """PyTorch's ``clamp_backward_min_max``: ``input`` gets the gradient where it lies within the bounds,
    a tensor bound where it was the one applied (``max`` wins when the bounds cross)."""
    keep = None
    if min is not None:
        keep = input >= min
    if max is not None:
        keep = (input <= max) if keep is None else keep & (input <= max)
    g_in = where(keep, grad, 0.0) if needs_input_grad[0] else None
    g_min = g_max = None
    if needs_input_grad[1]:
        applied = input < min
        if max is not None:
            applied = applied & (min < max)
        g_min = where(applied, grad, 0.0)
    if needs_input_grad[2]:
        applied = input > max
        if min is not None:
            applied = applied | (max < min)
        g_max = where(applied, grad, 0.0)
    return (g_in, g_min, g_max)


def _clamp_node_name(args) -> str:
    bounds = [b for b in args[1:3] if b is not None]
    return "ClampBackward0" if all(isinstance(b, Tensor) for b in bounds) else "ClampBackward1"


@op(
    meta=_clamp_meta,
    reference=_clamp_ref,
    backward=_clamp_backward,
    methods=("clamp", "clip"),
    grad_fn_name=_clamp_node_name,
)
def clamp(input: Tensor, min: Tensor | Number | None = None, max: Tensor | Number | None = None) -> Tensor:
    """Each element limited to ``[min, max]`` (either bound may be None; tensors broadcast); where
    ``min > max`` the result is ``max``. NaN in the input or a bound propagates."""


clip = clamp


def _one_sided_meta(name: str, param: str):
    def meta(input, bound):
        _need_tensor(input, "input", 1, name)
        if bound is None:
            raise TypeError(f"{name}() received an invalid combination of arguments - got (Tensor, NoneType)")
        if param == "min":
            return _clamp_spec(name, name, input, bound, None)
        return _clamp_spec(name, name, input, None, bound)

    return meta


def _clamp_min_backward(grad, input, min, needs_input_grad):
    return (
        where(input >= min, grad, 0.0) if needs_input_grad[0] else None,
        where(input < min, grad, 0.0) if needs_input_grad[1] else None,
    )


def _clamp_max_backward(grad, input, max, needs_input_grad):
    return (
        where(input <= max, grad, 0.0) if needs_input_grad[0] else None,
        where(input > max, grad, 0.0) if needs_input_grad[1] else None,
    )


@op(
    meta=_one_sided_meta("clamp_min", "min"),
    reference=lambda spec, a, low: _clamp_ref(spec, a, low, None),
    backward=_clamp_min_backward,
    methods=("clamp_min",),
    grad_fn_name=lambda args: "ClampMinBackward1" if isinstance(args[1], Tensor) else "ClampMinBackward0",
)
def clamp_min(input: Tensor, min: Tensor | Number) -> Tensor:
    """``clamp(input, min=min)``: each element at least ``min``."""


@op(
    meta=_one_sided_meta("clamp_max", "max"),
    reference=lambda spec, a, high: _clamp_ref(spec, a, None, high),
    backward=_clamp_max_backward,
    methods=("clamp_max",),
    grad_fn_name=lambda args: "ClampMaxBackward1" if isinstance(args[1], Tensor) else "ClampMaxBackward0",
)
def clamp_max(input: Tensor, max: Tensor | Number) -> Tensor:
    """``clamp(input, max=max)``: each element at most ``max``."""


# ---------------------------------------------------------------------------------------- lerp, addcmul, addcdiv


def _opmath(d: dt.dtype) -> dt.dtype:
    """The dtype PyTorch's kernels compute half types in (and convert Scalar arguments to)."""
    return dt.float32 if d in _HALF else d


def _lerp_meta(input, end, weight):
    _need_tensor(input, "input", 1, "lerp")
    _need_tensor(end, "end", 2, "lerp")
    if not isinstance(weight, Tensor) and not is_scalar(weight):
        raise TypeError(
            f"lerp() received an invalid combination of arguments - argument 'weight' must be Tensor or Number, "
            f"not {type(weight).__name__}"
        )
    d = input._dtype
    if end._dtype is not d:
        raise RuntimeError(f"expected dtype {_TYPEMETA_NAMES[d]} for `end` but got dtype {_TYPEMETA_NAMES[end._dtype]}")
    shape = broadcast_pair(input._shape, end._shape)
    if isinstance(weight, Tensor):
        if weight._shape:
            if weight._dtype is not d:
                raise RuntimeError(
                    f"expected dtype {_TYPEMETA_NAMES[d]} for `weight` but got dtype {_TYPEMETA_NAMES[weight._dtype]}"
                )
        else:  # a 0-d weight of any dtype takes part in type promotion
            d = result_type(input, end, weight)
        shape = broadcast_pair(shape, weight._shape)
        dev = common_device("lerp", input, end, weight)
    else:
        dev = common_device("lerp", input, end)
    if not d.is_floating_point:
        raise _not_implemented("lerp_kernel_tensor" if isinstance(weight, Tensor) else "lerp_kernel_scalar", d)
    if not isinstance(weight, Tensor):
        _check_scalar_fits(weight, _opmath(d))
    return (shape, d, dev)


def _lerp_ref(spec, a, b, weight):
    compute = _compute_np(spec[1])
    a, b = _operand(a, spec), _operand(b, spec)
    w = _operand(weight, spec) if isinstance(weight, np.ndarray) else compute.type(weight)
    diff = b - a
    # PyTorch's two-sided form (exact at both ends): from ``input`` for small weights, else from ``end``
    small = np.abs(w) < 0.5
    return np.where(small, a, b) + np.where(small, w, w - 1) * diff


def _lerp_backward(grad, input, end, weight, needs_input_grad):
    # input and end are read (and so saved) for the weight's gradient alone, the weight for theirs
    def floating(t):  # with a 0-d weight, integer or bool tensors promote: arithmetic in the gradient's dtype
        return t.to(grad._dtype) if isinstance(t, Tensor) and not t._dtype.is_floating_point else t

    w = floating(weight) if needs_input_grad[0] or needs_input_grad[1] else None
    return (
        grad * (1 - w) if needs_input_grad[0] else None,
        grad * w if needs_input_grad[1] else None,
        grad * (floating(end) - floating(input)) if needs_input_grad[2] else None,
    )


@op(
    meta=_lerp_meta,
    reference=_lerp_ref,
    backward=_lerp_backward,
    methods=("lerp",),
    grad_fn_name=lambda args: "LerpBackward1" if isinstance(args[2], Tensor) else "LerpBackward0",
)
def lerp(input: Tensor, end: Tensor, weight: Tensor | Number) -> Tensor:
    """Linear interpolation ``input + weight * (end - input)`` (``weight`` a number or a tensor), broadcasting.

    ``end`` must have ``input``'s dtype, and so must a tensor ``weight`` unless it is 0-d (then the three
    promote together, as in PyTorch)."""


_ADDCDIV_INTEGER = (
    "Integer division with addcdiv is no longer supported, and in a future  release addcdiv will perform a true "
    "division of tensor1 and tensor2. The historic addcdiv behavior can be implemented as (input + value * "
    "kiln.trunc(tensor1 / tensor2)).to(input.dtype) for integer inputs and as (input + value * tensor1 / tensor2) "
    "for float inputs. The future addcdiv behavior is just the latter implementation: (input + value * tensor1 / "
    "tensor2), for all dtypes."
)


def _addc_meta(name: str):
    def meta(input, tensor1, tensor2, value=1):
        _need_tensor(input, "input", 1, name)
        _need_tensor(tensor1, "tensor1", 2, name)
        _need_tensor(tensor2, "tensor2", 3, name)
        _need_number(value, "value", name)
        if name == "addcdiv" and not tensor1._dtype.is_floating_point and not tensor2._dtype.is_floating_point:
            raise RuntimeError(_ADDCDIV_INTEGER)
        shape = broadcast_pair(broadcast_pair(input._shape, tensor1._shape), tensor2._shape)
        dtype = result_type(input, tensor1, tensor2)
        if dtype is dt.bool:
            raise _not_implemented(f"{name}_cpu_out", dt.bool)
        _check_scalar_fits(value, _opmath(dtype))
        return (shape, dtype, common_device(name, input, tensor1, tensor2))

    return meta


def _value(value, compute: np.dtype):
    """The Scalar ``value`` in the compute dtype: truncated for integer results, as C++ converts it."""
    if compute.kind in "iu":
        return _arg(int(value), compute)
    return compute.type(value)


def _addcmul_ref(spec, a, t1, t2, value=1):
    compute = _compute_np(spec[1])
    a, t1, t2 = _operand(a, spec), _operand(t1, spec), _operand(t2, spec)
    return a + _value(value, compute) * t1 * t2


def _addcdiv_ref(spec, a, t1, t2, value=1):
    compute = _compute_np(spec[1])
    a, t1, t2 = _operand(a, spec), _operand(t1, spec), _operand(t2, spec)
    return a + np.divide(_value(value, compute) * t1, t2, dtype=compute)


@op(
    meta=_addc_meta("addcmul"),
    reference=_addcmul_ref,
    backward=lambda grad, tensor1, tensor2, value, needs_input_grad: (
        grad if needs_input_grad[0] else None,
        grad * (tensor2 * value) if needs_input_grad[1] else None,
        grad * (tensor1 * value) if needs_input_grad[2] else None,
    ),
    autocast="promote",
    methods=("addcmul",),
)
def addcmul(input: Tensor, tensor1: Tensor, tensor2: Tensor, *, value: Number = 1) -> Tensor:
    """``input + value * tensor1 * tensor2``, broadcasting all three."""


@op(
    meta=_addc_meta("addcdiv"),
    reference=_addcdiv_ref,
    backward=lambda grad, tensor1, tensor2, value, needs_input_grad: (
        grad if needs_input_grad[0] else None,
        grad * (value / tensor2) if needs_input_grad[1] else None,
        -grad * (value * tensor1 / (tensor2 * tensor2)) if needs_input_grad[2] else None,
    ),
    autocast="promote",
    methods=("addcdiv",),
)
def addcdiv(input: Tensor, tensor1: Tensor, tensor2: Tensor, *, value: Number = 1) -> Tensor:
    """``input + value * tensor1 / tensor2``, broadcasting all three (integer ``tensor1`` and ``tensor2``
    are refused, as in PyTorch)."""


# ---------------------------------------------------------------------------------------- logical ops


def _truth(x, spec) -> np.ndarray:
    """Nonzero elements of an operand cast to the common dtype (``spec[3]``), as PyTorch casts them."""
    x = np.asarray(x)
    if x.dtype == bool:
        return x
    return _as_float(np.asarray(_operand(x, (spec[0], spec[3])))) != 0


def _logical(name: str, np_fn, doc: str):
    base = binary_meta(name, bool_result=True)

    def meta(input, other):
        _need_tensor(input, "input", 1, name)
        _need_tensor(other, "other", 2, name)
        return base(input, other)  # (shape, bool, device, the common dtype operands are cast to)

    @op(
        meta=meta,
        reference=lambda spec, a, b: np_fn(_truth(a, spec), _truth(b, spec)),
        name=name,
        doc=doc,
        methods=(name,),
    )
    def logical(input: Tensor, other: Tensor) -> Tensor:
        pass

    return logical


logical_and = _logical("logical_and", np.logical_and, "Elementwise logical AND (nonzero is True) as a bool tensor.")
logical_or = _logical("logical_or", np.logical_or, "Elementwise logical OR (nonzero is True) as a bool tensor.")
logical_xor = _logical("logical_xor", np.logical_xor, "Elementwise logical XOR (nonzero is True) as a bool tensor.")


# ---------------------------------------------------------------------------------------- bit shifts


def _shift_meta(name: str, kernel: str):
    base = binary_meta(name)

    def meta(input, other):
        spec = base(input, other)
        if spec[1].is_floating_point or spec[1] is dt.bool:
            raise _not_implemented(kernel, spec[1])
        return spec

    return meta


def _shift_ref(left: bool):
    def ref(spec, a, b):
        compute = _compute_np(spec[1])
        a, b = np.asarray(_arg(a, compute)), np.asarray(_arg(b, compute))
        bits = compute.itemsize * 8
        ok = (b >= 0) & (b < bits)  # PyTorch defines out-of-range shifts instead of leaving them undefined
        s = np.where(ok, b, 0).astype(compute)
        if left:
            return np.where(ok, np.left_shift(a, s), np.zeros((), compute))
        fill = np.right_shift(a, bits - 1) if compute.kind == "i" else np.zeros((), compute)
        return np.where(ok, np.right_shift(a, s), fill)

    return ref


@op(
    meta=_shift_meta("bitwise_left_shift", "lshift_cpu"),
    reference=_shift_ref(True),
    methods=("bitwise_left_shift", "__lshift__"),
)
def bitwise_left_shift(input: Tensor | Number, other: Tensor | Number) -> Tensor:
    """``input << other`` for integer tensors (shifts by a negative amount or by the bit width give 0)."""


@op(
    meta=_shift_meta("bitwise_right_shift", "rshift_cpu"),
    reference=_shift_ref(False),
    methods=("bitwise_right_shift", "__rshift__"),
)
def bitwise_right_shift(input: Tensor | Number, other: Tensor | Number) -> Tensor:
    """``input >> other`` for integer tensors, arithmetic for signed types (out-of-range shifts fill with
    the sign)."""


def _rlshift(self, other):
    return bitwise_left_shift(other, self)


def _rrshift(self, other):
    return bitwise_right_shift(other, self)


Tensor.__rlshift__ = _rlshift
Tensor.__rrshift__ = _rrshift
