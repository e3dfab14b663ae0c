"""The error function family: ``erf``, ``erfc``, ``erfinv`` and their NumPy implementations.

NumPy has no ``erf``: ``erf``/``erfc`` use the rational approximations of the Cephes library in float64
(within 3 and 10 ulp of C's), and ``erfinv`` refines an initial approximation with Halley/Newton steps
on them (within a few ulp of PyTorch's).
"""

from __future__ import annotations

import math

import numpy as np

from kiln._ops.elementwise import (
    _unary,
    exp,
)
from kiln._ops.unary_math import _f64

__all__ = ["erf_np", "erfc_np", "erfinv_np", "erf", "erfc", "erfinv"]

TOP_LEVEL = (
    "erf",
    "erfc",
    "erfinv",
)
"""The names ``kiln`` exports at its top level (as ``torch`` does)."""

_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_HALF_SQRT_PI = math.sqrt(math.pi) / 2.0


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
    autocast="fp32_float16",
)
