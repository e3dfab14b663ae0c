"""Comparisons: the elementwise ops ``eq``, ``ne``, ``lt``, ``le``, ``gt``, ``ge`` (and their aliases
``not_equal``, ``less``, ``less_equal``, ``greater``, ``greater_equal``), and the tests written with them:
``isclose``/``allclose``, ``isin``, ``isreal`` and ``signbit``.

The tests are composites of kiln ops: a device gets them as soon as it runs those ops. Argument checks raise
PyTorch's types and wording at the boundary.
"""

from __future__ import annotations

import math

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops._meta import is_scalar, result_type, scalar_type_name
from kiln._ops.elementwise import abs as _abs
from kiln._ops.elementwise import binary_meta, binary_reference, isnan, logical_not, sub
from kiln._ops.math_args import Number, _need_tensor
from kiln._tensor import Tensor

__all__ = [
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "not_equal",
    "less",
    "less_equal",
    "greater",
    "greater_equal",
    "isclose",
    "allclose",
    "isin",
    "isreal",
    "signbit",
]

TOP_LEVEL = __all__
"""The names ``kiln`` exports at its top level (as ``torch`` does): every public name here."""


# ---------------------------------------------------------------------------------------- the comparison ops


def _compare(name: str, np_fn, methods: tuple[str, ...], doc: str, decompose=None):
    @op(
        tags=("pointwise",),
        inplace=True,
        meta=binary_meta(name, bool_result=True),
        reference=binary_reference(np_fn),
        name=name,
        doc=doc,
        methods=(name, *methods),
        decompose=decompose,
        # not differentiable: the name of the node its in-place form (eq_) gives a tensor with history, PyTorch's
        grad_fn_name=lambda args: f"{name.capitalize()}Backward{1 if isinstance(args[1], Tensor) else 0}",
    )
    def comparison(input: Tensor, other: Tensor | Number) -> Tensor:
        pass

    return comparison


eq = _compare("eq", np.equal, ("__eq__",), "Elementwise ``input == other`` as a bool tensor, broadcasting.")


def _ne_decomposed(input, other):
    """``ne`` in kiln ops: ``not (input == other)`` (NaN is unequal to everything, itself included)."""
    return logical_not(eq(input, other))


def _doc(symbol: str) -> str:
    return f"Elementwise ``input {symbol} other`` as a bool tensor, broadcasting."


ne = _compare("ne", np.not_equal, ("__ne__", "not_equal"), _doc("!="), _ne_decomposed)
lt = _compare("lt", np.less, ("__lt__", "less"), _doc("<"))
le = _compare("le", np.less_equal, ("__le__", "less_equal"), _doc("<="))
gt = _compare("gt", np.greater, ("__gt__", "greater"), _doc(">"))
ge = _compare("ge", np.greater_equal, ("__ge__", "greater_equal"), _doc(">="))
greater, greater_equal, less, less_equal, not_equal = gt, ge, lt, le, ne


# ---------------------------------------------------------------------------------------- tests


def _float_arg(value, name: str, op_name: str) -> float:
    """A ``float`` parameter as PyTorch's argument parser takes it (a bool or int is accepted)."""
    if isinstance(value, Tensor) and value.dim() == 0 and value.dtype.is_floating_point:
        return float(value.item())
    if not is_scalar(value):
        raise TypeError(f"{op_name}(): argument '{name}' must be float, not {type(value).__name__}")
    return float(value)


def _bool_arg(value, name: str, op_name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{op_name}(): argument '{name}' must be bool, not {type(value).__name__}")
    return value


def _close_args(op_name: str, input, other, rtol, atol, equal_nan) -> tuple[float, float]:
    _need_tensor(input, "input", 1, op_name)
    _need_tensor(other, "other", 2, op_name)
    rtol = _float_arg(rtol, "rtol", op_name)
    atol = _float_arg(atol, "atol", op_name)
    _bool_arg(equal_nan, "equal_nan", op_name)
    if input.dtype is not other.dtype:
        raise RuntimeError(f"{scalar_type_name(input.dtype)} did not match {scalar_type_name(other.dtype)}")
    if not rtol >= 0:  # NaN included
        raise RuntimeError(f"rtol must be greater than or equal to zero, but got {_fmt(rtol)}")
    if not atol >= 0:
        raise RuntimeError(f"atol must be greater than or equal to zero, but got {_fmt(atol)}")
    return rtol, atol


def _fmt(x: float) -> str:
    """A double as PyTorch's messages print it (``-1``, ``0.5``, ``nan``)."""
    return str(int(x)) if math.isfinite(x) and x == int(x) else repr(x)


def isclose(input: Tensor, other: Tensor, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> Tensor:
    """Elementwise ``|input - other| <= atol + rtol * |other|`` as a bool tensor, broadcasting (``torch.isclose``).

    Non-finite values are close only to themselves; NaN to NaN only with ``equal_nan``. Both tensors must
    have the same dtype; integer and bool tensors compute the error in the default float dtype.
    """
    rtol, atol = _close_args("isclose", input, other, rtol, atol, equal_nan)
    close = eq(input, other)
    floating = input.dtype.is_floating_point
    if equal_nan and floating:
        close = close | (isnan(input) & isnan(other))
    if rtol == 0 and atol == 0:
        return close
    a, b = input, other
    if not floating:
        a, b = a.to(dt.get_default_dtype()), b.to(dt.get_default_dtype())
    allowed = _abs(b * rtol) + atol
    actual = _abs(sub(a, b))
    finite = logical_not(isnan(actual)) & (actual != math.inf)
    return close | (finite & (actual <= allowed))


def allclose(input: Tensor, other: Tensor, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> bool:
    """Whether every element of ``input`` is close to ``other``'s (:func:`isclose`), as a Python bool."""
    _close_args("allclose", input, other, rtol, atol, equal_nan)
    return bool(isclose(input, other, rtol, atol, equal_nan).all().item())


def isin(elements: Tensor, test_elements: Tensor, *, assume_unique: bool = False, invert: bool = False) -> Tensor:
    """True where an element of ``elements`` occurs in ``test_elements`` (either may be a number, not both),
    compared in their promoted dtype; ``invert`` negates the result. NaN occurs nowhere."""
    bad_flag = any(not isinstance(f, bool) for f in (assume_unique, invert))
    if (
        bad_flag
        or (not isinstance(elements, Tensor) and not isinstance(test_elements, Tensor))
        or not all(isinstance(x, Tensor) or is_scalar(x) for x in (elements, test_elements))
    ):
        given = [type(elements).__name__, type(test_elements).__name__]
        given += [
            f"{k}={type(v).__name__}"
            for k, v in (("assume_unique", assume_unique), ("invert", invert))
            if v is not False
        ]
        raise TypeError(
            f"isin() received an invalid combination of arguments - got ({', '.join(given)}), but expected one of:\n"
            " * (Tensor elements, Tensor test_elements, *, bool assume_unique = False, bool invert = False, "
            "Tensor out = None)\n"
            " * (Number element, Tensor test_elements, *, bool assume_unique = False, bool invert = False, "
            "Tensor out = None)\n"
            " * (Tensor elements, Number test_element, *, bool assume_unique = False, bool invert = False, "
            "Tensor out = None)\n"
        )
    for x in (elements, test_elements):
        if isinstance(x, Tensor) and x.dtype is dt.bool:
            raise RuntimeError("Unsupported input type encountered for isin(): Bool")
    from kiln._ops.creation import tensor
    from kiln._ops.sort import searchsorted, sort

    common = result_type(elements, test_elements)
    device = (elements if isinstance(elements, Tensor) else test_elements).device
    e = elements.to(common) if isinstance(elements, Tensor) else tensor(elements, dtype=common, device=device)
    t = test_elements.to(common) if isinstance(test_elements, Tensor) else tensor([test_elements], dtype=common)
    t = t.reshape(-1)
    if t.numel() == 0:
        found = _full_like(e, False, dt.bool)
    else:
        ordered = sort(t).values
        pos = searchsorted(ordered, e.reshape(-1)).clamp_max(t.numel() - 1)
        found = eq(ordered[pos], e.reshape(-1)).reshape(e.shape)
    return logical_not(found) if invert else found


def isreal(input: Tensor) -> Tensor:
    """True where an element is real: every element, since kiln has no complex dtypes."""
    _need_tensor(input, "input", 1, "isreal")
    return _full_like(input, True, dt.bool)


def signbit(input: Tensor) -> Tensor:
    """True where an element's sign bit is set: negative numbers, ``-0.0`` and NaNs with the sign bit."""
    _need_tensor(input, "input", 1, "signbit")
    if input.dtype.is_floating_point:
        from kiln._ops.binary_math import copysign

        return lt(copysign(_full_like(input, 1), input), 0)
    if input.dtype in (dt.bool, dt.uint8):
        return _full_like(input, False, dt.bool)
    return lt(input, 0)


def _full_like(t: Tensor, value, dtype: dt.dtype | None = None) -> Tensor:
    from kiln._ops.creation import full

    return full(t.shape, value, dtype=dtype or t.dtype, device=t.device)


Tensor.isclose = isclose
Tensor.allclose = allclose
Tensor.isreal = isreal
Tensor.signbit = signbit
