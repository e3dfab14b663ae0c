"""More elementwise math: ``heaviside``, ``gcd``/``lcm``, ``nextafter``, ``frexp``, ``logaddexp``/``logaddexp2``
(ops with reference kernels), and the composites ``ldexp``, ``float_power``, ``fmax``/``fmin``,
``rad2deg``/``deg2rad`` and ``rsub`` (their gradients come from the ops they are written in).

Every op follows PyTorch 2.x on CPU (half types compute in float32 and round once); errors raised by meta
functions carry PyTorch's types and wording.
"""

from __future__ import annotations

import math

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops._meta import is_scalar, result_type, scalar_type_name
from kiln._ops.binary_math import _tensor_pair_meta, remainder
from kiln._ops.comparison import eq, ge, ne
from kiln._ops.elementwise import _compute_np, _zeros_like, div, exp, isnan, mul, sub, where
from kiln._ops.elementwise import abs as _abs
from kiln._ops.elementwise import pow as _pow
from kiln._ops.math_args import Number, _binary_ref, _need_tensor, _not_implemented, _operand
from kiln._ops.reduction import _return_type
from kiln._spec import Spec
from kiln._tensor import Tensor

__all__ = [
    "heaviside",
    "gcd",
    "lcm",
    "nextafter",
    "frexp",
    "logaddexp",
    "logaddexp2",
    "ldexp",
    "float_power",
    "fmax",
    "fmin",
    "rad2deg",
    "deg2rad",
    "rsub",
]

TOP_LEVEL = __all__
"""The names ``kiln`` exports at its top level (as ``torch`` does): every public name here."""


def _not_differentiable(name: str):
    def backward(grad):
        raise RuntimeError(f"derivative for aten::{name} is not implemented")

    return backward


# ---------------------------------------------------------------------------------------- heaviside


def _heaviside_meta(input, values):
    _need_tensor(input, "input", 1, "heaviside")
    _need_tensor(values, "values", 2, "heaviside")
    if input.dtype is not values.dtype:
        raise RuntimeError("heaviside is not yet implemented for tensors with different dtypes.")
    return _HEAVISIDE_BASE(input, values)


_HEAVISIDE_BASE = _tensor_pair_meta("heaviside")


def _heaviside_ref(spec, a, v):
    a, v = _operand(a, spec), _operand(v, spec)
    step = np.greater(a, 0).astype(a.dtype)
    return np.where(np.equal(a, 0), v, step).astype(_compute_np(spec.dtype), copy=False)


def _heaviside_decomposed(input, values):
    """``heaviside`` in kiln ops: ``values`` where ``input == 0``, else ``input > 0`` (0 for NaN)."""
    return where(eq(input, 0), values, (input > 0).to(input.dtype))


@op(
    tags=("pointwise",),
    inplace=True,
    meta=_heaviside_meta,
    reference=_heaviside_ref,
    backward=_not_differentiable("heaviside"),
    methods=("heaviside",),
    decompose=_heaviside_decomposed,
)
def heaviside(input: Tensor, values: Tensor) -> Tensor:
    """The Heaviside step: 0 where ``input < 0`` (and NaN), 1 where ``input > 0``, ``values`` where it is 0
    (broadcasting; both tensors of one dtype). Not differentiable."""


# ---------------------------------------------------------------------------------------- gcd, lcm


def _integer_pair_meta(name: str):
    base = _tensor_pair_meta(name)

    def meta(input, other):
        spec = base(input, other)
        if spec.dtype.is_floating_point or spec.dtype is dt.bool:
            raise _not_implemented(f"{name}_cpu", spec.dtype)
        return spec

    return meta


def _gcd_ref(spec, a, b):
    return np.gcd(_operand(a, spec), _operand(b, spec))


def _wide(d) -> np.dtype:
    """C++'s arithmetic type for an integer dtype: ``int`` for the narrow ones, ``int64_t`` for int64."""
    return np.dtype(np.int64) if d == np.int64 else np.dtype(np.int32)


def _lcm_ref(spec, a, b):
    a, b = np.asarray(_operand(a, spec)), np.asarray(_operand(b, spec))
    g = np.gcd(a, b)
    wide = _wide(a.dtype)
    with np.errstate(over="ignore"):
        quotient = (a // np.where(g == 0, 1, g)).astype(wide)
        product = np.abs(quotient * b.astype(wide))  # wraps as C++'s int arithmetic does, then abs
        return np.where(g == 0, 0, product).astype(a.dtype)


def _gcd_decomposed(input, other):
    """``gcd`` in kiln ops: Euclid's algorithm on the absolute values, every element at once, until every
    divisor is 0."""
    d = result_type(input, other)
    a, b = _abs(input.to(d)), _abs(other.to(d))
    a, b = a + b * 0, b + a * 0  # broadcast both
    while bool(ne(b, 0).any()):
        nonzero = ne(b, 0)
        a, b = where(nonzero, b, a), where(nonzero, remainder(a, where(nonzero, b, 1)), 0)
    return a


def _lcm_decomposed(input, other):
    """``lcm`` in kiln ops: ``|input / gcd * other|``, 0 where the gcd is 0."""
    d = result_type(input, other)
    a, b = input.to(d), other.to(d)
    g = gcd(a, b)
    zero = eq(g, 0)
    wide = dt.int64 if d is dt.int64 else dt.int32  # C++'s arithmetic type, whose overflow wraps before abs
    quotient = div(a, where(zero, 1, g), rounding_mode="trunc").to(wide)
    return where(zero, 0, _abs(quotient * b.to(wide))).to(d)


@op(
    tags=("pointwise",),
    inplace=True,
    meta=_integer_pair_meta("gcd"),
    reference=_gcd_ref,
    methods=("gcd",),
    decompose=_gcd_decomposed,
)
def gcd(input: Tensor, other: Tensor) -> Tensor:
    """The greatest common divisor of integer tensors, elementwise and broadcasting (``gcd(0, 0) == 0``)."""


@op(
    tags=("pointwise",),
    inplace=True,
    meta=_integer_pair_meta("lcm"),
    reference=_lcm_ref,
    methods=("lcm",),
    decompose=_lcm_decomposed,
)
def lcm(input: Tensor, other: Tensor) -> Tensor:
    """The least common multiple of integer tensors, elementwise and broadcasting (0 where either is 0)."""


# ---------------------------------------------------------------------------------------- nextafter, frexp


def _float_pair_meta(name: str):
    base = _tensor_pair_meta(name)

    def meta(input, other):
        spec = base(input, other)
        if not spec.dtype.is_floating_point:
            raise _not_implemented(f"{name}_cpu", spec.dtype)
        return spec

    return meta


def _nextafter_ref(spec, a, b):
    d = spec.dtype.numpy  # in the result dtype itself, half types included: the next value is the dtype's
    a, b = np.asarray(a).astype(d, copy=False), np.asarray(b).astype(d, copy=False)
    return np.nextafter(a, b)


@op(
    tags=("pointwise",),
    inplace=True,
    meta=_float_pair_meta("nextafter"),
    reference=_nextafter_ref,
    # ``other``'s gradient is 0: made from ``grad`` (the engine reduces it to other's shape), so other is not saved
    backward=lambda grad, needs_input_grad: (grad, _zeros_like(grad) if needs_input_grad[1] else None),
    methods=("nextafter",),
)
def nextafter(input: Tensor, other: Tensor) -> Tensor:
    """The next floating-point value after ``input`` towards ``other``, elementwise and broadcasting."""


def _frexp_meta(input):
    _need_tensor(input, "input", 1, "frexp")
    if not input.dtype.is_floating_point:
        raise RuntimeError("kiln.frexp() only supports floating-point dtypes")
    return (Spec((input.shape, input.dtype, input.device)), Spec((input.shape, dt.int32, input.device)))


def _frexp_ref(spec, a):
    mantissa, exponent = np.frexp(a if a.dtype == np.float16 else a.astype(_compute_np(spec[0].dtype), copy=False))
    return mantissa, exponent.astype(np.int32, copy=False)


@op(
    tags=("pointwise",),
    meta=_frexp_meta,
    reference=_frexp_ref,
    backward=lambda grads, result: grads[0] / _pow(2.0, result[1].to(grads[0].dtype)),
    num_outputs=2,
    differentiable_outputs=(0,),
)
def _frexp(input: Tensor) -> tuple[Tensor, Tensor]:
    """Mantissa and exponent."""


def frexp(input: Tensor):
    """``(mantissa, exponent)`` with ``input == mantissa * 2 ** exponent``, ``|mantissa|`` in ``[0.5, 1)``
    (0, infinities and NaN keep their value with exponent 0); the exponent is int32 (a named tuple)."""
    return _FrexpResult(*_frexp(input))


_FrexpResult = _return_type("frexp", ("mantissa", "exponent"))


# ---------------------------------------------------------------------------------------- logaddexp


def _logaddexp_decomposed(base: float):
    def decomposed(input, other):
        """``logaddexp`` in kiln ops: ``max + log1p(base ** -|input - other|) / ln(base)``; equal infinities
        give themselves."""
        from kiln._ops.reduction import maximum
        from kiln._ops.unary_math import log1p

        d = result_type(input, other)
        compute = dt.float32 if d in (dt.float16, dt.bfloat16) else d
        a, b = input.to(compute), other.to(compute)
        scaled = _abs(sub(a, b)) * -math.log(base)
        out = maximum(a, b) + log1p(exp(scaled)) / math.log(base)
        return where(eq(a, b) & ~isnan(a) & (_abs(a) == math.inf), a, out).to(d)

    return decomposed


@op(
    tags=("pointwise",),
    meta=_float_pair_meta("logaddexp"),
    reference=_binary_ref(np.logaddexp),
    backward=lambda grad, input, other, needs_input_grad: (
        grad / (1 + exp(other - input)) if needs_input_grad[0] else None,
        grad / (1 + exp(input - other)) if needs_input_grad[1] else None,
    ),
    methods=("logaddexp",),
    decompose=_logaddexp_decomposed(math.e),
)
def logaddexp(input: Tensor, other: Tensor) -> Tensor:
    """``log(exp(input) + exp(other))`` elementwise without overflow, broadcasting (floating tensors)."""


@op(
    tags=("pointwise",),
    meta=_float_pair_meta("logaddexp2"),
    reference=_binary_ref(np.logaddexp2),
    backward=lambda grad, input, other, needs_input_grad: (
        grad / (1 + _pow(2.0, other - input)) if needs_input_grad[0] else None,
        grad / (1 + _pow(2.0, input - other)) if needs_input_grad[1] else None,
    ),
    methods=("logaddexp2",),
    decompose=_logaddexp_decomposed(2.0),
)
def logaddexp2(input: Tensor, other: Tensor) -> Tensor:
    """``log2(2 ** input + 2 ** other)`` elementwise without overflow, broadcasting (floating tensors)."""


# ---------------------------------------------------------------------------------------- composites


def _float_result(*operands) -> dt.dtype:
    d = result_type(*operands)
    return d if d.is_floating_point else dt.get_default_dtype()


def ldexp(input: Tensor, other: Tensor) -> Tensor:
    """``input * 2 ** other`` elementwise, broadcasting; integer operands give the default float dtype."""
    _need_tensor(input, "input", 1, "ldexp")
    _need_tensor(other, "other", 2, "ldexp")
    return mul(input, _pow(2.0, other)).to(_float_result(input, other))


def _ldexp_(self: Tensor, other: Tensor) -> Tensor:
    """In-place :func:`ldexp`."""
    _need_tensor(other, "other", 2, "ldexp_")
    if not self.dtype.is_floating_point:
        raise RuntimeError(f"ldexp can't be cast to the desired output type {scalar_type_name(self.dtype)}")
    return self.mul_(_pow(2.0, other))


def _float_power_operands(input, exponent):
    for name, x in (("input", input), ("exponent", exponent)):
        if not isinstance(x, Tensor) and not is_scalar(x):
            raise TypeError(f"float_power(): argument '{name}' must be Tensor or Number, not {type(x).__name__}")
    if not isinstance(input, Tensor) and not isinstance(exponent, Tensor):
        raise TypeError(
            f"float_power() received an invalid combination of arguments - got ({type(input).__name__}, "
            f"{type(exponent).__name__}), but expected one of:\n * (Tensor input, Tensor exponent, *, Tensor out = "
            "None)\n * (Number self, Tensor exponent, *, Tensor out = None)\n * (Tensor input, Number exponent, *, "
            "Tensor out = None)\n"
        )
    return tuple(x.to(dt.float64) if isinstance(x, Tensor) else x for x in (input, exponent))


def float_power(input: Tensor | Number, exponent: Tensor | Number) -> Tensor:
    """``input ** exponent`` computed in float64 (the result is float64 whatever the operands' dtypes)."""
    return _pow(*_float_power_operands(input, exponent))


def _float_power_(self: Tensor, exponent: Tensor | Number) -> Tensor:
    """In-place :func:`float_power`: ``self`` must be float64."""
    if self.dtype is not dt.float64:
        raise RuntimeError(
            f"the base given to float_power_ has dtype {scalar_type_name(self.dtype)} but the operation's result "
            "requires dtype Double"
        )
    return self.pow_(_float_power_operands(self, exponent)[1])


def _extreme_ignoring_nan(name: str, input, other, keep_input) -> Tensor:
    _need_tensor(input, "input", 1, name)
    _need_tensor(other, "other", 2, name)
    return where(keep_input | isnan(other), input, other)


def fmax(input: Tensor, other: Tensor) -> Tensor:
    """Elementwise maximum that ignores NaN (NaN only where both are NaN), broadcasting; ties take ``input``."""
    return _extreme_ignoring_nan("fmax", input, other, ge(input, other) if isinstance(other, Tensor) else None)


def fmin(input: Tensor, other: Tensor) -> Tensor:
    """Elementwise minimum that ignores NaN (NaN only where both are NaN), broadcasting; ties take ``input``."""
    return _extreme_ignoring_nan("fmin", input, other, (input <= other) if isinstance(other, Tensor) else None)


_RAD_TO_DEG = 180.0 / math.pi
_DEG_TO_RAD = math.pi / 180.0


def _in_floating(input: Tensor, name: str) -> Tensor:
    _need_tensor(input, "input", 1, name)
    return input if input.dtype.is_floating_point else input.to(dt.get_default_dtype())


def rad2deg(input: Tensor) -> Tensor:
    """Radians to degrees elementwise (integer inputs give the default float dtype)."""
    return mul(_in_floating(input, "rad2deg"), _RAD_TO_DEG)


def deg2rad(input: Tensor) -> Tensor:
    """Degrees to radians elementwise (integer inputs give the default float dtype)."""
    return mul(_in_floating(input, "deg2rad"), _DEG_TO_RAD)


def _rad2deg_(self: Tensor) -> Tensor:
    """In-place :func:`rad2deg`."""
    return self.mul_(_RAD_TO_DEG)


def _deg2rad_(self: Tensor) -> Tensor:
    """In-place :func:`deg2rad`."""
    return self.mul_(_DEG_TO_RAD)


def rsub(input: Tensor, other: Tensor | Number, *, alpha: Number = 1) -> Tensor:
    """``other - alpha * input`` (``sub`` with the operands swapped), broadcasting."""
    _need_tensor(input, "input", 1, "rsub")
    return sub(other, input, alpha=alpha)


for _name, _fn in (
    ("frexp", frexp),
    ("ldexp", ldexp),
    ("ldexp_", _ldexp_),
    ("float_power", float_power),
    ("float_power_", _float_power_),
    ("fmax", fmax),
    ("fmin", fmin),
    ("rad2deg", rad2deg),
    ("rad2deg_", _rad2deg_),
    ("deg2rad", deg2rad),
    ("deg2rad_", _deg2rad_),
):
    setattr(Tensor, _name, _fn)
