"""Elementary special functions: ``xlogy``, ``xlog1py``, ``entr`` and ``sinc``.

Each has a NumPy kernel and a decomposition into kiln ops (so a device with only the primitive set runs
them). PyTorch's conventions: ``xlogy(0, y) = 0`` and ``xlog1py(0, y) = 0`` unless ``y`` is NaN,
``entr(x) = -x log x`` with ``entr(0) = 0`` and ``-inf`` for negative ``x``, ``sinc(0) = 1``; ``sinc``
forms ``πx`` in the precision it computes in (float32 for float32 and the half types), as PyTorch does.
"""

from __future__ import annotations

import math

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops.elementwise import _HALF, _in_float, binary_meta, cos, isnan, log, sin, where
from kiln._ops.math_args import Number
from kiln._ops.special import _backward_name, _check_pair, _f64_operand, float_unary
from kiln._ops.unary_math import log1p
from kiln._tensor import Tensor

__all__ = ["xlogy", "xlog1py", "entr", "sinc"]

TOP_LEVEL = ("xlogy", "sinc")
"""The names ``kiln`` exports at its top level (as ``torch`` does; the others live in :mod:`kiln.special`)."""


def _as_tensor(v, like: Tensor, d: dt.dtype) -> Tensor:
    if isinstance(v, Tensor):
        return v.to(d)
    from kiln._ops.creation import tensor

    return tensor(v, dtype=d, device=like._device)


def _operands(input, other, d: dt.dtype) -> tuple[Tensor, Tensor]:
    """Both operands as tensors of the dtype ``d`` the decomposition computes in."""
    like = input if isinstance(input, Tensor) else other
    return _as_tensor(input, like, d), _as_tensor(other, like, d)


def _x_log(name: str, np_log, log_op, shift: float):
    """``xlogy`` (``shift`` 0) or ``xlog1py`` (``shift`` 1): ``x * log(shift + y)``, 0 where ``x == 0``
    unless ``y`` is NaN."""

    def ref(spec, a, b):
        x, y = _f64_operand(a, spec), _f64_operand(b, spec)
        with np.errstate(all="ignore"):
            v = x * np_log(y)
        return np.where(np.isnan(y), np.nan, np.where(x == 0, 0.0, v))

    base = binary_meta(name, float_result=True)

    def meta(input, other):
        _check_pair(name if name == "xlogy" else f"special_{name}", input, other)
        return base(input, other)

    def decomposed(input, other):
        """``where(isnan(y), nan, where(x == 0, 0, x * log(shift + y)))`` in kiln ops."""
        d = base(input, other).dtype
        compute = dt.float32 if d in _HALF else d
        x, y = _operands(input, other, compute)
        out = where(isnan(y), math.nan, where(x == 0, 0.0, x * log_op(y)))
        return out.to(d)

    def backward(grad, input, other, needs_input_grad):
        g_in = g_other = None
        if needs_input_grad[0]:  # d/dx is log(shift + y), 0 where x is 0 and shift + y <= 0 (PyTorch's rule)
            g_in = where((input == 0) & (other <= -shift), 0.0, fn(grad, other))
        if needs_input_grad[1]:
            g_other = grad * input / (other + shift) if shift else grad * input / other
        return (g_in, g_other)

    @op(
        tags=("pointwise",),
        inplace=name == "xlogy",
        meta=meta,
        reference=ref,
        backward=backward,
        decompose=decomposed,
        name=name,
        doc=f"``input * {'log(other)' if not shift else 'log1p(other)'}`` elementwise, broadcasting, with 0 where "
        "``input`` is 0 (unless ``other`` is NaN).",
        methods=(name,) if name == "xlogy" else (),
        grad_fn_name=_backward_name("XlogyBackward" if name == "xlogy" else "SpecialXlog1PyBackward"),
    )
    def fn(input: Tensor | Number, other: Tensor | Number) -> Tensor:
        pass

    return fn


xlogy = _x_log("xlogy", np.log, log, 0.0)
xlog1py = _x_log("xlog1py", np.log1p, log1p, 1.0)


def _entr_np(x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        v = -x * np.log(x)
    return np.where(np.isnan(x), x, np.where(x > 0, v, np.where(x == 0, 0.0, -np.inf)))


def _entr_decomposed(input: Tensor) -> Tensor:
    """``entr`` in kiln ops: ``-x log x`` for positive ``x``, 0 at 0, ``-inf`` below, NaN for NaN."""
    x, d = _in_float(input)
    out = where(x > 0, -x * log(x), where(x == 0, 0.0, -math.inf))
    return where(isnan(x), x, out).to(d)


entr = float_unary(
    "entr",
    _entr_np,
    lambda grad, input: grad * -(log(input) + 1.0),
    "The elementwise entropy term ``-input * log(input)`` (0 at 0, ``-inf`` for negative ``input``).",
    decompose=_entr_decomposed,
    grad_fn_name="SpecialEntrBackward0",
)


def _sinc_np(x: np.ndarray, compute: np.dtype) -> np.ndarray:
    c = x.astype(compute)
    with np.errstate(all="ignore"):
        product = compute.type(math.pi) * c
        v = (np.sin(product) / product).astype(np.float64)
    return np.where(x == 0, 1.0, v)


def _sinc_decomposed(input: Tensor) -> Tensor:
    """``sinc`` in kiln ops: ``sin(πx) / (πx)``, 1 at 0."""
    x, d = _in_float(input)
    product = x * math.pi
    return where(x == 0, 1.0, sin(product) / product).to(d)


def _sinc_backward(grad, input, result):
    """``(cos(πx) - sinc(x)) / x``, 0 at 0 (the zero replaced before dividing, so that the double backward
    stays finite)."""
    zero = input == 0
    x = where(zero, 1.0, input)
    return grad * where(zero, 0.0, (cos(x * math.pi) - result) / x)


sinc = float_unary(
    "sinc",
    _sinc_np,
    _sinc_backward,
    "The normalized sinc function ``sin(π input) / (π input)`` elementwise (1 at 0).",
    inplace=True,
    special=False,
    methods=("sinc",),
    decompose=_sinc_decomposed,
    with_compute=True,
)
