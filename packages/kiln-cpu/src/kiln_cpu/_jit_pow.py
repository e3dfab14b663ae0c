"""pow's scalar functions and its integer loop: ``power(x, y)`` (the binary loops' ``POW`` code) for
float32 (computed in float64, rounded once) and the integers (wrapping, PyTorch's rule for negative
exponents), and :func:`ipow_scalar`, an integer tensor to one non-negative exponent by repeated squaring,
vectorised.

The float32 power is branch-free (selects), so its loops vectorise: ``exp(y * log|x|)`` in float64
with polynomials accurate to about 1e-16 relative (far below a float32 half-ulp, 3e-8: the result is
the correctly rounded one but in rare near-ties, always within 1 ulp), then C99's ``pow`` rules for
zeros, infinities, NaN, negative bases and integral exponents as selects. Importing this module
compiles nothing.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.core.errors import TypingError
from numba.extending import overload, register_jitable

from kiln_cpu._jit_f32math import _LN2, _exp_reduce, _log_reduce
from kiln_cpu._jit_support import _SERIAL, _f32_bits


@register_jitable(inline="always")
def _log_positive(x):
    """log of a positive normal float64 (garbage for 0, inf, NaN: the caller selects), absolute error
    below 1e-17 on the mantissa's part: x = m * 2**e with m in [sqrt(2)/2, sqrt(2)], log m =
    2 atanh(s), s = (m-1)/(m+1), the odd series to s**21 (the next term is below 3e-19)."""
    e, s = _log_reduce(x)
    z = s * s
    z2 = z * z
    z4 = z2 * z2
    z8 = z4 * z4
    # 2/(2k+1) for k = 0..10, evaluated by Estrin's scheme (short dependency chains)
    q01 = 2.0 + z * (2.0 / 3.0)
    q23 = 2.0 / 5.0 + z * (2.0 / 7.0)
    q45 = 2.0 / 9.0 + z * (2.0 / 11.0)
    q67 = 2.0 / 13.0 + z * (2.0 / 15.0)
    q89 = 2.0 / 17.0 + z * (2.0 / 19.0)
    q03 = q01 + z2 * q23
    q47 = q45 + z2 * q67
    q8a = q89 + z2 * (2.0 / 21.0)
    p = (q03 + z4 * q47) + z8 * q8a
    return e * _LN2 + s * p


@register_jitable(inline="always")
def _exp_bounded(t):
    """e**t of a float64 clamped to [-200, 200] (the float32 range, with room: 2**n stays a normal
    float64), relative error about 2e-16: 2**n * e**f, |f| <= ln2/2, degree-12 Taylor in f."""
    f, scale = _exp_reduce(min(max(t, -200.0), 200.0))
    f2 = f * f
    f4 = f2 * f2
    f8 = f4 * f4
    q03 = (1.0 + f) + f2 * (1.0 / 2.0 + f * (1.0 / 6.0))
    q47 = (1.0 / 24.0 + f * (1.0 / 120.0)) + f2 * (1.0 / 720.0 + f * (1.0 / 5040.0))
    q8b = (1.0 / 40320.0 + f * (1.0 / 362880.0)) + f2 * (1.0 / 3628800.0 + f * (1.0 / 39916800.0))
    p = (q03 + f4 * q47) + f8 * (q8b + f4 * (1.0 / 479001600.0))
    return p * scale


@register_jitable(inline="always")
def pow_f32(x, y):
    """``x ** y`` of two float32, rounded once from float64; C99's special cases (``pow(x, 0)`` and
    ``pow(1, y)`` are 1 even for NaN; a finite negative base to a non-integral exponent is NaN; zeros
    and infinities with the sign an odd integral exponent keeps)."""
    xd = np.float64(x)
    yd = np.float64(y)
    ax = abs(xd)
    lg = _log_positive(ax)
    lg = -np.inf if ax == 0.0 else lg
    lg = np.inf if ax == np.inf else lg
    r = _exp_bounded(yd * lg)
    half = yd * 0.5
    integral = np.floor(yd) == yd  # infinities count as even integers, as C99 reads them (np.floor: a
    odd = integral & (np.floor(half) != half)  # float; math.floor converts to an integer, undefined for inf)
    negative = (_f32_bits(x) >> 31) != 0  # -0.0 too
    r = -r if negative & odd else r
    r = np.nan if (xd < 0.0) & (xd > -np.inf) & ~integral else r
    r = 1.0 if (ax == 1.0) & (abs(yd) == np.inf) else r  # (-1) ** +-inf
    r = np.nan if (xd != xd) | (yd != yd) else r
    r = 1.0 if (xd == 1.0) | (yd == 0.0) else r
    return np.float32(r)


def power(x, y):
    """``x ** y`` of two numbers of one dtype (float32, or integers) as PyTorch computes pow (jitted
    only)."""
    raise NotImplementedError


@overload(power, inline="always")
def _power_impl(x, y):
    if x != y:
        raise TypingError(f"power of {x} and {y}: one dtype expected")
    if x == types.float32:
        return lambda x, y: pow_f32(x, y)
    if isinstance(x, types.Integer):
        one = np.dtype(str(x)).type(1)
        zero = np.dtype(str(x)).type(0)

        def ipow(x, y):
            """Repeated squaring (products wrap); a negative exponent gives PyTorch's truncated
            ``1 / x ** -y``: 1 for 1, +-1 for -1, 0 otherwise (0 too: PyTorch's integer pow does not
            divide)."""
            if y < 0:
                return (one if y % 2 == 0 else -one) if x == -one else (one if x == one else zero)
            r = one
            b = x
            e = y
            while e > 0:
                r = r * b if e & 1 else r
                b = b * b
                e = e >> 1
            return r

        return ipow
    raise TypingError(f"power of {x}: float32 or an integer type expected")


_BLOCK = 1024  # elements per block of ipow_scalar: its scratch and output block stay in the L1 cache


@njit(**_SERIAL)
def ipow_scalar(a, e, out, lo, hi):
    """``out[i] = a[i] ** e`` over [lo, hi) of the dense 1-d integer arrays ``a`` and ``out`` for one
    exponent ``e >= 0``: per block, one vector pass per bit of ``e`` (multiplications wrap, so the order
    of the products changes no result)."""
    base = np.empty(_BLOCK, a.dtype)
    for start in range(lo, hi, _BLOCK):
        n = min(_BLOCK, hi - start)
        av = a[start : start + n]
        ov = out[start : start + n]
        bv = base[:n]
        for i in range(n):
            ov[i] = 1
            bv[i] = av[i]
        k = e
        while k > 0:
            if k & 1:
                for i in range(n):
                    ov[i] = ov[i] * bv[i]
            k = k >> 1
            if k > 0:
                for i in range(n):
                    bv[i] = bv[i] * bv[i]
