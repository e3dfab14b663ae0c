"""The scalar functions the loops inline, selected by a literal op code at typing time: ``binop``,
``unop``, ``ternop`` and ``cast_value``.

Semantics follow the reference kernels (NumPy, PyTorch's rules): results are computed in the result
dtype, integers wrap, float division by zero gives inf/NaN (``error_model="numpy"``), maximum/minimum
propagate NaN and return the second operand on ties.
"""

from __future__ import annotations

import math

import numpy as np
from numba import types
from numba.extending import overload

from kiln_cpu._jit_f32math import _GELU_C, _GELU_K, _SQRT_HALF, _erf_d, erf_f32, exp_f32, log_f32, sigmoid_f32, tanh_f32
from kiln_cpu._jit_pow import power
from kiln_cpu._jit_support import _const_code
from kiln_cpu._opcodes import (
    ABS,
    ADD,
    ADD_ALPHA,
    ADDCDIV,
    ADDCMUL,
    CAST,
    CLAMP,
    COS,
    CUBE,
    DIV,
    EQ,
    ERF,
    EXP,
    FLOOR_DIV,
    GE,
    GELU,
    GELU_TANH,
    GT,
    INV_SQUARE,
    LE,
    LERP,
    LOG,
    LT,
    MAXIMUM,
    MINIMUM,
    MUL,
    NE,
    NEG,
    POW,
    RECIPROCAL,
    RELU,
    RELU_GRAD,
    RSQRT,
    SIGMOID,
    SIN,
    SQRT,
    SQUARE,
    SUB,
    SUB_ALPHA,
    TANH,
    TRUNC_DIV,
    WHERE,
)

# ------------------------------------------------------------------------------------ scalar functions


def binop(code, x, y, c):
    """``x <op> y`` for the op ``code`` (``c``: alpha), in the operands' dtype (jitted only)."""
    raise NotImplementedError


def unop(code, x):
    """``op(x)`` for the op ``code``, in ``x``'s dtype (jitted only)."""
    raise NotImplementedError


@overload(binop, inline="always")  # as unop: pow's loop kept a call to its large function, scalar
def _binop_impl(code, x, y, c):
    k = _const_code(code)
    if k is None:
        return None
    if k == ADD:
        return lambda code, x, y, c: x + y
    if k == SUB:
        return lambda code, x, y, c: x - y
    if k == MUL:
        return lambda code, x, y, c: x * y
    if k == DIV:
        return lambda code, x, y, c: x / y
    if k == ADD_ALPHA:
        return lambda code, x, y, c: x + y * c
    if k == SUB_ALPHA:
        return lambda code, x, y, c: x - y * c
    if k == MAXIMUM:  # selects, no branches: the loops stay vectorisable
        return lambda code, x, y, c: x if x != x else (x if x > y else y)
    if k == MINIMUM:
        return lambda code, x, y, c: x if x != x else (x if x < y else y)
    if k == EQ:
        return lambda code, x, y, c: x == y
    if k == NE:
        return lambda code, x, y, c: x != y
    if k == LT:
        return lambda code, x, y, c: x < y
    if k == LE:
        return lambda code, x, y, c: x <= y
    if k == GT:
        return lambda code, x, y, c: x > y
    if k == GE:
        return lambda code, x, y, c: x >= y
    if k == POW:
        return lambda code, x, y, c: power(x, y)
    if k == RELU_GRAD:
        zero = np.dtype(str(x)).type(0)
        return lambda code, x, y, c: zero if y <= zero else x  # NaN passes the gradient, as in PyTorch
    if k == TRUNC_DIV:
        return lambda code, x, y, c: np.trunc(x / y)
    if k == FLOOR_DIV:
        one = np.dtype(str(x)).type(1)
        zero = np.dtype(str(x)).type(0)
        half = np.dtype(str(x)).type(0.5)

        def floor_div(code, x, y, c):  # NumPy's npy_floor_divide (Python's divmod rule), as the reference
            if y == zero:
                return x / y
            mod = np.fmod(x, y)
            div = (x - mod) / y
            if mod != zero and (y < zero) != (mod < zero):
                div = div - one
            if div != zero:
                fl = np.floor(div)
                if div - fl > half:
                    fl = fl + one
                return fl
            return np.copysign(zero, x / y)

        return floor_div
    raise ValueError(f"unknown binary op code {k}")


@overload(unop, inline="always")  # in Numba's IR: LLVM left a call to the larger ones (erf, gelu) in the
def _unop_impl(code, x):  # loop, which kept it scalar (2.5x slower)
    k = _const_code(code)
    if k is None:
        return None
    f32 = x == types.float32
    zero = np.dtype(str(x)).type(0)
    one = np.dtype(str(x)).type(1)
    if k == CAST:
        return lambda code, x: x
    if k == NEG:
        return lambda code, x: -x
    if k == ABS:
        return lambda code, x: abs(x)
    if k == RELU:
        return lambda code, x: x if (x != x or x > zero) else zero
    if k == SQRT:
        return lambda code, x: np.sqrt(x)
    if k == SQUARE:  # pow's exponents 2, 3, -0.5, -1, -2: the expressions of its reference, in its order
        return lambda code, x: x * x
    if k == CUBE:
        return lambda code, x: x * x * x
    if k == RECIPROCAL:
        return lambda code, x: one / x
    if k == RSQRT:
        return lambda code, x: one / np.sqrt(x)
    if k == INV_SQUARE:
        return lambda code, x: one / (x * x)
    if k == EXP:
        return (lambda code, x: exp_f32(x)) if f32 else (lambda code, x: math.exp(x))
    if k == LOG:
        return (lambda code, x: log_f32(x)) if f32 else (lambda code, x: np.log(x))
    if k == TANH:
        return (lambda code, x: tanh_f32(x)) if f32 else (lambda code, x: math.tanh(x))
    if k == SIGMOID:
        return (lambda code, x: sigmoid_f32(x)) if f32 else (lambda code, x: 1.0 / (1.0 + math.exp(-x)))
    if k == ERF:
        return (lambda code, x: erf_f32(x)) if f32 else (lambda code, x: math.erf(x))
    if k == GELU:  # x/2 (1 + erf(x/sqrt(2))) in float64, as the reference (float32: rounded once)
        if f32:
            return lambda code, x: np.float32((np.float64(x) * 0.5) * (1.0 + _erf_d(np.float64(x) * _SQRT_HALF)))
        return lambda code, x: (x * 0.5) * (1.0 + math.erf(x * _SQRT_HALF))  # _erf_d's exp is float32-grade
    if k == GELU_TANH:  # x/2 (1 + tanh(k (x + c x^3))), each step rounded in x's dtype as the reference
        t = np.dtype(str(x)).type
        gk, gc, half, one = t(_GELU_K), t(_GELU_C), t(0.5), t(1.0)
        th = tanh_f32 if f32 else math.tanh
        return lambda code, x: (half * x) * (one + th(gk * (x + ((gc * x) * x) * x)))
    if k == SIN:
        return (lambda code, x: np.float32(math.sin(np.float64(x)))) if f32 else (lambda code, x: math.sin(x))
    if k == COS:
        return (lambda code, x: np.float32(math.cos(np.float64(x)))) if f32 else (lambda code, x: math.cos(x))
    raise ValueError(f"unknown unary op code {k}")


def ternop(code, x, y, z, c):
    """The ternary op ``code`` of ``x``, ``y``, ``z`` (``c``: addcmul's and addcdiv's value), in their
    dtype, as the reference rounds it step by step (jitted only)."""
    raise NotImplementedError


@overload(ternop)
def _ternop_impl(code, x, y, z, c):
    k = _const_code(code)
    if k is None:
        return None
    if k == WHERE:
        return lambda code, x, y, z, c: y if x else z
    if k == ADDCMUL:  # input + value * tensor1 * tensor2: the products in that order, then the sum
        return lambda code, x, y, z, c: x + (c * y) * z
    if k == ADDCDIV:
        return lambda code, x, y, z, c: x + (c * y) / z
    if k == LERP:
        half = np.dtype(str(x)).type(0.5)
        one = np.dtype(str(x)).type(1)

        def lerp(code, x, y, z, c):  # PyTorch's two-sided form: exact at both ends
            small = abs(z) < half
            return (x if small else y) + (z if small else z - one) * (y - x)

        return lerp
    if k == CLAMP:  # maximum with the low bound, then minimum with the high one: NaN anywhere is NaN
        return lambda code, x, y, z, c: binop(MINIMUM, binop(MAXIMUM, x, y, c), z, c)
    raise ValueError(f"unknown ternary op code {k}")


def cast_value(hout, out, v):
    """``v`` as the dtype of ``out`` holds it: float32 for half-precision bits (``store`` rounds it),
    else ``out``'s dtype (jitted only)."""
    raise NotImplementedError


@overload(cast_value)
def _cast_value_impl(hout, out, v):
    k = _const_code(hout)
    if k is None:
        return None
    if k:
        return lambda hout, out, v: np.float32(v)
    target = out.dtype
    return lambda hout, out, v: target(v)
