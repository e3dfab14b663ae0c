"""``clamp`` (``clip``), ``clamp_min`` and ``clamp_max`` with PyTorch's bound checks and type promotion."""

from __future__ import annotations

import math

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops._meta import broadcast_pair, common_device, result_type
from kiln._ops.elementwise import (
    where,
)
from kiln._ops.math_args import (
    _CTYPE_NAMES,
    _FLOAT_MAX,
    Number,
    _need_tensor,
    _need_tensor_or_number,
    _not_implemented,
    _operand,
)
from kiln._spec import Spec
from kiln._tensor import Tensor

__all__ = ["clamp", "clip", "clamp_min", "clamp_max"]

TOP_LEVEL = __all__
"""The names ``kiln`` exports at its top level (as ``torch`` does): every public name here."""


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
        if any(t._shape or t.requires_grad for t in tensors):
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
    return Spec((shape, dtype, common_device(name, input, *tensors)))


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
        return Spec((input._shape, dtype, input._device))
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
    tags=("pointwise",),
    inplace=True,
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
    decompose=lambda input, min: clamp(input, min, None),
    tags=("pointwise",),
    inplace=True,
    meta=_one_sided_meta("clamp_min", "min"),
    reference=lambda spec, a, low: _clamp_ref(spec, a, low, None),
    backward=_clamp_min_backward,
    methods=("clamp_min",),
    grad_fn_name=lambda args: "ClampMinBackward1" if isinstance(args[1], Tensor) else "ClampMinBackward0",
)
def clamp_min(input: Tensor, min: Tensor | Number) -> Tensor:
    """``clamp(input, min=min)``: each element at least ``min``."""


@op(
    decompose=lambda input, max: clamp(input, None, max),
    tags=("pointwise",),
    inplace=True,
    meta=_one_sided_meta("clamp_max", "max"),
    reference=lambda spec, a, high: _clamp_ref(spec, a, None, high),
    backward=_clamp_max_backward,
    methods=("clamp_max",),
    grad_fn_name=lambda args: "ClampMaxBackward1" if isinstance(args[1], Tensor) else "ClampMaxBackward0",
)
def clamp_max(input: Tensor, max: Tensor | Number) -> Tensor:
    """``clamp(input, max=max)``: each element at most ``max``."""
