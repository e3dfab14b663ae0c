"""Binary elementwise math beyond the basics: ``atan2``, ``hypot``, ``copysign``, ``fmod``, ``remainder``,
``floor_divide``, the logical ops (``logical_and``/``or``/``xor``) and bit shifts.

Every op follows PyTorch 2.x on CPU: half types compute in float32 and round once, after wider operands
are rounded to the half type as PyTorch casts operands to the common dtype; errors raised by meta
functions carry PyTorch's types and wording.
"""

from __future__ import annotations

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops.comparison import ne
from kiln._ops.elementwise import (
    _arg,
    _compute_np,
    _div_meta,
    _div_ref,
    _zeros_like,
    binary_meta,
    bitwise_and,
    bitwise_or,
    div,
    where,
)
from kiln._ops.math_args import Number, _as_float, _binary_ref, _need_tensor, _not_implemented, _operand, _rounded
from kiln._tensor import Tensor

__all__ = [
    "atan2",
    "arctan2",
    "hypot",
    "copysign",
    "fmod",
    "remainder",
    "floor_divide",
    "logical_and",
    "logical_or",
    "logical_xor",
    "bitwise_left_shift",
    "bitwise_right_shift",
]

TOP_LEVEL = __all__
"""The names ``kiln`` exports at its top level (as ``torch`` does): every public name here."""


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
    tags=("pointwise",),
    inplace=True,
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
    if not spec.dtype.is_floating_point:
        raise _not_implemented("hypot_cpu", spec.dtype)
    return spec


_HYPOT_BASE = _tensor_pair_meta("hypot")


@op(
    tags=("pointwise",),
    inplace=True,
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
    tags=("pointwise",),
    inplace=True,
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
        if spec.dtype is dt.bool:
            raise _not_implemented(f"{name}_cpu", dt.bool)
        return spec

    return meta


def _check_int_divisor(spec, b) -> None:
    if 0 not in spec.shape and np.any(np.asarray(b) == 0):
        raise RuntimeError("ZeroDivisionError")


def _fmod_ref(spec, a, b):
    compute = _compute_np(spec.dtype)
    a, b = _operand(a, spec), _operand(b, spec)
    if compute.kind in "iu":
        _check_int_divisor(spec, b)
    return np.fmod(a, b, dtype=compute)


def _remainder_ref(spec, a, b):
    compute = _compute_np(spec.dtype)
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
    tags=("pointwise",),
    inplace=True,
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
    tags=("pointwise",),
    inplace=True,
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
    tags=("pointwise",),
    inplace=True,
    meta=lambda input, other: _div_meta(input, other, "floor"),
    reference=lambda spec, a, b: _div_ref(spec, _rounded(a, spec), _rounded(b, spec), "floor"),
    backward=_floor_divide_backward,
    methods=("floor_divide", "__floordiv__"),
)
def floor_divide(input: Tensor | Number, other: Tensor | Number) -> Tensor:
    """``floor(input / other)`` elementwise, as Python's ``//`` (like ``div(..., rounding_mode='floor')``;
    not differentiable)."""


def _rfloordiv(self, other):
    return floor_divide(other, self)


Tensor.__rfloordiv__ = _rfloordiv


# ---------------------------------------------------------------------------------------- logical ops


def _truth(x, spec) -> np.ndarray:
    """Nonzero elements of an operand cast to the common dtype (``spec.compute_dtype``), as PyTorch casts them."""
    x = np.asarray(x)
    if x.dtype == bool:
        return x
    return _as_float(np.asarray(_operand(x, spec.replace(dtype=spec.compute_dtype)))) != 0


def _logical(name: str, np_fn, doc: str, combine):
    base = binary_meta(name, bool_result=True)

    def meta(input, other):
        _need_tensor(input, "input", 1, name)
        _need_tensor(other, "other", 2, name)
        return base(input, other)  # (shape, bool, device, the common dtype operands are cast to)

    def decomposed(input, other):
        """The logical op in kiln ops: ``combine`` of the operands' truth (nonzero once cast to the common dtype)."""
        common = meta(input, other)[3]
        return combine(ne(input.to(common), 0), ne(other.to(common), 0))

    @op(
        tags=("pointwise",),
        inplace=True,
        meta=meta,
        reference=lambda spec, a, b: np_fn(_truth(a, spec), _truth(b, spec)),
        name=name,
        doc=doc,
        methods=(name,),
        decompose=decomposed,
    )
    def logical(input: Tensor, other: Tensor) -> Tensor:
        pass

    return logical


logical_and = _logical(
    "logical_and",
    np.logical_and,
    "Elementwise logical AND (nonzero is True) as a bool tensor.",
    bitwise_and,
)
logical_or = _logical(
    "logical_or",
    np.logical_or,
    "Elementwise logical OR (nonzero is True) as a bool tensor.",
    bitwise_or,
)
logical_xor = _logical(
    "logical_xor",
    np.logical_xor,
    "Elementwise logical XOR (nonzero is True) as a bool tensor.",
    ne,
)


# ---------------------------------------------------------------------------------------- bit shifts


def _shift_meta(name: str, kernel: str):
    base = binary_meta(name)

    def meta(input, other):
        spec = base(input, other)
        if spec.dtype.is_floating_point or spec.dtype is dt.bool:
            raise _not_implemented(kernel, spec.dtype)
        return spec

    return meta


def _shift_ref(left: bool):
    def ref(spec, a, b):
        compute = _compute_np(spec.dtype)
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
    tags=("pointwise",),
    inplace=True,
    meta=_shift_meta("bitwise_left_shift", "lshift_cpu"),
    reference=_shift_ref(True),
    methods=("bitwise_left_shift", "__lshift__"),
)
def bitwise_left_shift(input: Tensor | Number, other: Tensor | Number) -> Tensor:
    """``input << other`` for integer tensors (shifts by a negative amount or by the bit width give 0)."""


@op(
    tags=("pointwise",),
    inplace=True,
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
