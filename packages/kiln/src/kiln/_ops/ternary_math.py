"""Elementwise ops of three operands: ``lerp``, ``addcmul`` and ``addcdiv`` (PyTorch's dtype checks and
promotion).
"""

from __future__ import annotations

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops._meta import broadcast_pair, common_device, is_scalar, result_type
from kiln._ops.clamp import _check_scalar_fits
from kiln._ops.elementwise import (
    _HALF,
    _arg,
    _compute_np,
)
from kiln._ops.math_args import _TYPEMETA_NAMES, Number, _need_number, _need_tensor, _not_implemented, _operand
from kiln._spec import Spec
from kiln._tensor import Tensor

__all__ = ["lerp", "addcmul", "addcdiv"]

TOP_LEVEL = __all__
"""The names ``kiln`` exports at its top level (as ``torch`` does): every public name here."""


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
    return Spec((shape, d, dev))


def _lerp_ref(spec, a, b, weight):
    compute = _compute_np(spec.dtype)
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


def _lerp_decomposed(input, end, weight):
    """``lerp`` in kiln ops, in PyTorch's two-sided form (from ``input`` for ``|weight| < 0.5``, else from
    ``end``), computed in float32 for half precision."""
    from kiln._ops.elementwise import abs as _abs
    from kiln._ops.elementwise import where

    d = _lerp_meta(input, end, weight)[1]
    c = _opmath(d)
    a, b = input.to(c), end.to(c)
    diff = b - a
    if isinstance(weight, Tensor):
        w = weight.to(c)
        small = _abs(w) < 0.5
        return (where(small, a, b) + where(small, w, w - 1) * diff).to(d)
    w = float(weight)
    return ((a + w * diff) if abs(w) < 0.5 else (b + (w - 1) * diff)).to(d)


@op(
    decompose=_lerp_decomposed,
    tags=("pointwise",),
    inplace=True,
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
        return Spec((shape, dtype, common_device(name, input, tensor1, tensor2)))

    return meta


def _value(value, compute: np.dtype):
    """The Scalar ``value`` in the compute dtype: truncated for integer results, as C++ converts it."""
    if compute.kind in "iu":
        return _arg(int(value), compute)
    return compute.type(value)


def _addcmul_ref(spec, a, t1, t2, value=1):
    compute = _compute_np(spec.dtype)
    a, t1, t2 = _operand(a, spec), _operand(t1, spec), _operand(t2, spec)
    return a + _value(value, compute) * t1 * t2


def _addcdiv_ref(spec, a, t1, t2, value=1):
    compute = _compute_np(spec.dtype)
    a, t1, t2 = _operand(a, spec), _operand(t1, spec), _operand(t2, spec)
    return a + np.divide(_value(value, compute) * t1, t2, dtype=compute)


def _addcmul_decomposed(input, tensor1, tensor2, *, value=1):
    """``addcmul`` in kiln ops: ``input + value * tensor1 * tensor2`` in the compute dtype (``value``
    truncated for integer results)."""
    d = _addc_meta("addcmul")(input, tensor1, tensor2, value)[1]
    c = _opmath(d)
    v = value if c.is_floating_point else int(value)
    return (input.to(c) + tensor1.to(c) * v * tensor2.to(c)).to(d)


@op(
    decompose=_addcmul_decomposed,
    tags=("pointwise",),
    inplace=True,
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


def _addcdiv_decomposed(input, tensor1, tensor2, *, value=1):
    """``addcdiv`` in kiln ops: ``input + value * tensor1 / tensor2`` in the compute dtype."""
    d = _addc_meta("addcdiv")(input, tensor1, tensor2, value)[1]
    c = _opmath(d)
    v = value if c.is_floating_point else int(value)
    return (input.to(c) + tensor1.to(c) * v / tensor2.to(c)).to(d)


@op(
    decompose=_addcdiv_decomposed,
    tags=("pointwise",),
    inplace=True,
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
