"""The gamma function family: ``lgamma``, ``digamma``, ``polygamma``, ``mvlgamma`` and the Hurwitz ``zeta``.

NumPy has none of them, so each is computed here in float64 from the classical formulas and rounded once
to the result dtype:

* ``lgamma``: Stirling's series from 13 on; below, the recurrence ``Γ(x + 1) = x Γ(x)`` down or up to
  ``[2, 3)`` and a rational approximation there (Cephes' coefficients, exact at 2); the reflection
  formula below -34. Non-positive integers give ``inf``, as in C.
* ``digamma``: the recurrence up to 10 and the asymptotic (Bernoulli) series; the reflection formula
  ``ψ(x) = ψ(1 - x) - π / tan(πx)`` for negative ``x`` (``-inf``/``inf`` at ``±0``, NaN at negative
  integers, as PyTorch).
* ``polygamma(1, x)``: the same recurrence and series; for ``x < 1/2`` the reflection formula, whose
  ``sin(πx)`` is computed as PyTorch computes it, in the input's precision (so the poles at non-positive
  integers give PyTorch's large finite values rather than ``inf``).
* ``polygamma(n, x)``, ``n >= 2``: ``(-1)^(n+1) n! ζ(n + 1, x)``.
* ``zeta(x, q)``: the Euler–Maclaurin summation formula after nine terms of the series (PyTorch's
  domain: ``inf`` at ``x == 1`` and at non-positive integer ``q``, NaN for ``x < 1`` and for negative
  ``q`` with non-integer ``x``); a negative non-integer ``q`` sums the terms up to ``q + m > 0`` first.

The Bernoulli numbers the series need are computed exactly at import (``fractions``).
"""

from __future__ import annotations

import inspect
import math
from fractions import Fraction

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops.elementwise import _compute_np, _unary, binary_meta, unary_meta
from kiln._ops.math_args import Number, _need_tensor, _not_implemented
from kiln._ops.special import _backward_name, _check_pair, _f64_operand, _poly
from kiln._ops.unary_math import _f64
from kiln._tensor import Tensor

__all__ = [
    "lgamma_np",
    "digamma_np",
    "polygamma_np",
    "zeta_np",
    "lgamma",
    "digamma",
    "polygamma",
    "mvlgamma",
    "zeta",
]

TOP_LEVEL = ("lgamma", "digamma", "polygamma", "mvlgamma")
"""The names ``kiln`` exports at its top level (as ``torch`` does; ``zeta`` lives in :mod:`kiln.special`)."""

_MACHEP = 2.0**-53
_LOGPI = math.log(math.pi)
_LS2PI = 0.5 * math.log(2.0 * math.pi)
_EULER = 0.57721566490153286061


def _bernoulli_even(count: int) -> list[Fraction]:
    """``B_2, B_4, ..., B_2count`` exactly (the Akiyama–Tanigawa algorithm)."""
    n_max = 2 * count
    a = [Fraction(0)] * (n_max + 1)
    out = []
    for m in range(n_max + 1):
        a[m] = Fraction(1, m + 1)
        for j in range(m, 0, -1):
            a[j - 1] = j * (a[j - 1] - a[j])
        if m >= 2 and m % 2 == 0:
            out.append(a[0])
    return out


_B2K = _bernoulli_even(12)  # B_2 .. B_24
# ψ(x) ~ log x - 1/(2x) - Σ B_2k / (2k x^2k): the coefficients of z = 1/x² (leading one first, for _poly)
_DIGAMMA_SERIES = tuple(float(b / (2 * k)) for k, b in reversed(list(enumerate(_B2K[:7], 1))))
# ψ'(x) ~ 1/x + 1/(2x²) + Σ B_2k / x^(2k+1)
_TRIGAMMA_SERIES = tuple(float(b) for b in reversed(_B2K[:8]))
# Euler–Maclaurin terms of ζ: (2k)! / B_2k, k = 1 .. 12
_ZETA_EM = tuple(float(math.factorial(2 * k) / b) for k, b in enumerate(_B2K, 1))

# Cephes' lgam: Stirling's correction (in 1/x²) from 13 on, and log Γ(x) = log Γ(2 + p) = p B(p) / C(p)
# on [2, 3) (C monic, its leading 1 written out here)
_LGAMMA_STIRLING = (
    8.11614167470508450300e-4,
    -5.95061904284301438324e-4,
    7.93650340457716943945e-4,
    -2.77777777730099687205e-3,
    8.33333333333331927722e-2,
)
_LGAMMA_B = (
    -1.37825152569120859100e3,
    -3.88016315134637840924e4,
    -3.31612992738871184744e5,
    -1.16237097492762307383e6,
    -1.72173700820839662146e6,
    -8.53555664245765465627e5,
)
_LGAMMA_C = (
    1.0,
    -3.51815701436523470549e2,
    -1.70642106651881159223e4,
    -2.20528590553854454839e5,
    -1.13933444367982507207e6,
    -2.53252307177582951285e6,
    -2.01889141433532773231e6,
)


# ---------------------------------------------------------------------------------------- lgamma


def _lgamma_large(x: np.ndarray) -> np.ndarray:
    """log Γ(x) for x >= 13 by Stirling's series (overflows to inf past 2.5e305, as C's lgamma)."""
    q = (x - 0.5) * np.log(x) - x + _LS2PI
    return q + _poly(1.0 / (x * x), _LGAMMA_STIRLING) / x


def _lgamma_reduced(x: np.ndarray) -> np.ndarray:
    """log |Γ(x)| for -34 <= x < 13, x not a non-positive integer: ``x`` moved into ``[2, 3)`` by the
    recurrence (``u = x - k`` or ``x + k``, exact), the product of the steps kept in ``z``."""
    steps = np.floor(x) - 2.0  # > 0: steps down, < 0: steps up
    z = np.ones_like(x)
    for k in range(1, int(max(steps.max(initial=0.0), 0.0)) + 1):
        z *= np.where(steps >= k, x - k, 1.0)
    for k in range(int(max(-steps.min(initial=0.0), 0.0))):
        z /= np.where(-steps > k, x + k, 1.0)
    p = x - (steps + 2.0)
    return np.log(np.abs(z)) + p * _poly(p, _LGAMMA_B) / _poly(p, _LGAMMA_C)


def lgamma_np(a) -> np.ndarray:
    """``log |Γ(x)|`` of a float64 array (``inf`` at the poles and at ``±inf``, NaN for NaN)."""
    x = np.asarray(a, dtype=np.float64)
    flat = x.reshape(-1)
    out = np.full_like(flat, np.inf)
    ax = np.abs(flat)
    pole = (flat <= 0) & (flat == np.floor(flat))
    tiny = ax < 2.0**-30  # log Γ(x) = -log|x| - γx + O(x²): also where 1/x would overflow
    out[tiny] = -np.log(ax[tiny]) - _EULER * flat[tiny]
    out[np.isnan(flat)] = np.nan
    large = (flat >= 13.0) & (flat < np.inf)
    out[large] = _lgamma_large(flat[large])
    mid = (flat >= -34.0) & (flat < 13.0) & ~pole & ~tiny
    out[mid] = _lgamma_reduced(flat[mid])
    neg = (flat < -34.0) & ~pole  # reflection: log π - log|x sin(πx)| - log Γ(-x)
    if neg.any():
        q = -flat[neg]
        z = q - np.floor(q)
        z = np.where(z > 0.5, 1.0 - z, z)
        out[neg] = _LOGPI - np.log(q * np.sin(np.pi * z)) - _lgamma_large(q)
    out[pole] = np.inf
    return out.reshape(x.shape)


# ---------------------------------------------------------------------------------------- digamma, trigamma


def _digamma_positive(x: np.ndarray) -> np.ndarray:
    """ψ(x) for x > 0: the recurrence up to 10, then the asymptotic series."""
    acc = np.zeros_like(x)
    s = x.copy()
    while True:
        low = s < 10.0
        if not low.any():
            break
        acc[low] -= 1.0 / s[low]
        s[low] += 1.0
    z = 1.0 / (s * s)
    series = np.where(s < 1e17, z * _poly(z, _DIGAMMA_SERIES), 0.0)
    with np.errstate(invalid="ignore"):
        return acc + np.log(s) - 0.5 / s - series


def digamma_np(a) -> np.ndarray:
    """ψ(x), the logarithmic derivative of Γ, of a float64 array."""
    x = np.asarray(a, dtype=np.float64)
    flat = x.reshape(-1)
    out = np.full_like(flat, np.nan)  # NaN, -inf and the negative integers
    zero = flat == 0
    out[zero] = np.copysign(np.inf, -flat[zero])
    pos = flat > 0
    out[pos] = _digamma_positive(flat[pos])
    neg = (flat < 0) & (flat != np.trunc(flat))
    if neg.any():
        v = flat[neg]
        r = v - np.trunc(v)  # the fraction, exact: tan(πr) is accurate where tan(πx) would not be
        out[neg] = _digamma_positive(1.0 - v) - np.pi / np.tan(np.pi * r)
    return out.reshape(x.shape)


def _sin_pi(x: np.ndarray, compute: np.dtype) -> np.ndarray:
    """``sin(π x)`` as PyTorch's trigamma computes it: ``π x`` rounded in the compute dtype first."""
    if compute == np.float64:
        return np.sin(np.pi * x)
    c = compute.type
    return np.sin(c(np.pi) * x.astype(compute)).astype(np.float64)


def trigamma_np(a, compute: np.dtype = np.dtype(np.float64)) -> np.ndarray:
    """ψ'(x) of a float64 array; ``compute``: the dtype PyTorch forms ``sin(πx)`` in (the reflection
    below 1/2 subtracts ``π² / sin²(πx)``, which is finite at the poles once ``πx`` is rounded)."""
    x = np.asarray(a, dtype=np.float64)
    flat = x.reshape(-1)
    out = np.empty_like(flat)
    refl = flat < 0.5
    y = np.where(refl, 1.0 - flat, flat)
    acc = np.zeros_like(flat)
    if refl.any():
        s = _sin_pi(flat[refl], compute)
        with np.errstate(divide="ignore", over="ignore"):
            acc[refl] = -(np.pi * np.pi) / (s * s)
    s = y.copy()
    while True:
        low = s < 10.0
        if not low.any():
            break
        acc[low] += 1.0 / (s[low] * s[low])
        s[low] += 1.0
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        z = 1.0 / (s * s)
        series = (1.0 + 0.5 / s + z * _poly(z, _TRIGAMMA_SERIES)) / s
        series = np.where(np.isinf(s), 0.0, series)
        total = acc + series
    out[:] = np.where(refl, -total, total)
    return out.reshape(x.shape)


# ---------------------------------------------------------------------------------------- Hurwitz zeta


def _zeta_sum(x: np.ndarray, q: np.ndarray) -> np.ndarray:
    """ζ(x, q) by PyTorch's (Cephes') scheme: the series until ``q + i > 9`` and ``i >= 9``, or until a
    term is below ``MACHEP`` of the sum; then Euler–Maclaurin's tail at ``w = q + i`` (12 terms at most,
    each stopping once negligible). 1-d arrays of valid arguments; loops per term, masked per element."""
    with np.errstate(all="ignore"):
        s = np.power(q, -x)
        a = q.copy()
        b = np.zeros_like(q)
        done = np.zeros(q.shape, bool)
        active = np.ones(q.shape, bool)
        i = 0
        while active.any():
            i += 1
            idx = np.flatnonzero(active)
            a[idx] += 1.0
            b[idx] = np.power(a[idx], -x[idx])
            s[idx] += b[idx]
            conv = (-_MACHEP * s[idx] < b[idx]) & (b[idx] < _MACHEP * s[idx])
            done[idx[conv]] = True
            keep = ~conv & ((i < 9) | (a[idx] <= 9.0))
            active[idx[~keep]] = False
        rest = np.flatnonzero(~done)
        if rest.size:
            xs, w, bs, ss = x[rest], a[rest], b[rest], s[rest]
            ss = ss + bs * w / (xs - 1.0) - 0.5 * bs
            fac = np.ones_like(ss)
            k = np.zeros_like(ss)
            live = np.ones(ss.shape, bool)
            for coef in _ZETA_EM:
                fac = fac * (xs + k)
                bs = bs / w
                t = fac * bs / coef
                ss = np.where(live, ss + t, ss)
                live &= ~(np.abs(t / ss) < _MACHEP)
                k = k + 1.0
                fac = fac * (xs + k)
                bs = bs / w
                k = k + 1.0
            s[rest] = ss
    return s


_ZETA_DIRECT_MAX = 256  # a negative q sums this many terms one by one at most, then shifts by reflection


def zeta_np(x, q) -> np.ndarray:
    """The Hurwitz zeta function ``Σ_k (k + q)^-x`` of float64 arrays (broadcast), with PyTorch's domain."""
    x, q = np.broadcast_arrays(np.asarray(x, dtype=np.float64), np.asarray(q, dtype=np.float64))
    shape = x.shape
    xf, qf = x.reshape(-1), q.reshape(-1)
    out = np.full(xf.shape, np.nan)
    pole = (xf == 1.0) | ((qf <= 0) & (qf == np.floor(qf)) & ~(xf < 1.0))
    ok = ~(xf < 1.0) & ~pole & ~((qf <= 0) & (xf != np.floor(xf)))
    far = ok & (qf < -_ZETA_DIRECT_MAX) & np.isfinite(qf)
    near = ok & ~far
    if near.any():
        out[near] = _zeta_sum(xf[near], qf[near])
    if far.any():
        # x is an integer here: Σ_{k<m} (q + k)^-x = (-1)^x [ζ(x, r) - ζ(x, r + m)] with r = 1 - (q + m)
        xs, qs = xf[far], qf[far]
        m = np.ceil(-qs)
        f = qs + m  # in (0, 1), exact
        r = 1.0 - f
        sign = np.where(np.fmod(xs, 2.0) == 0, 1.0, -1.0)
        parts = _zeta_sum(np.concatenate([xs, xs, xs]), np.concatenate([r, 1.0 - qs, f]))
        n = xs.size
        out[far] = sign * (parts[:n] - parts[n : 2 * n]) + parts[2 * n :]
    out[pole] = np.inf
    return out.reshape(shape)


def polygamma_np(n: int, a, compute: np.dtype = np.dtype(np.float64)) -> np.ndarray:
    """``ψ^(n)(x)`` of a float64 array (``compute``: see :func:`trigamma_np`)."""
    if n == 0:
        return digamma_np(a)
    if n == 1:
        return trigamma_np(a, compute)
    x = np.asarray(a, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        factorial = math.exp(math.lgamma(n + 1.0)) if n < 171 else math.inf
        return ((-1.0) ** (n + 1)) * factorial * zeta_np(float(n + 1), x)


# ---------------------------------------------------------------------------------------- ops


lgamma = _unary(
    "lgamma",
    _f64(lgamma_np),
    lambda grad, input: grad * digamma(input),
    "The natural logarithm of the absolute value of the gamma function, elementwise (``inf`` at the poles).",
)
digamma = _unary(
    "digamma",
    _f64(digamma_np),
    lambda grad, input: grad * polygamma(1, input),
    "The digamma function ``d/dx log Γ(x)`` elementwise (``-inf`` at 0, NaN at the negative integers).",
)


def _polygamma_meta(n, input):
    if not isinstance(n, int) or isinstance(n, bool):
        raise TypeError(f"polygamma(): argument 'n' (position 1) must be int, not {type(n).__name__}")
    _need_tensor(input, "input", 2, "polygamma")
    if n < 0:
        raise RuntimeError("polygamma(n, x) does not support negative n.")
    return _POLYGAMMA_BASE(input)


_POLYGAMMA_BASE = unary_meta("polygamma")


def _polygamma_ref(spec, n, a):
    compute = _compute_np(spec.dtype)
    return polygamma_np(n, np.asarray(a, dtype=compute), compute)


@op(
    tags=("pointwise",),
    meta=_polygamma_meta,
    reference=_polygamma_ref,
    backward=lambda grad, n, input: grad * polygamma(n + 1, input),
)
def polygamma(n: int, input: Tensor) -> Tensor:
    """The ``n``-th derivative of the digamma function, elementwise (``polygamma(0, x)`` is ``digamma``)."""


def _tensor_polygamma(self: Tensor, n: int) -> Tensor:
    """``polygamma(n, self)``: the ``n``-th derivative of the digamma function of each element."""
    return polygamma(n, self)


def _install_polygamma_methods() -> None:
    """``Tensor.polygamma(n)`` and ``Tensor.polygamma_(n)``: ``self`` is the op's second argument."""
    from kiln._ops.copy import inplace_variant

    def method(self, n):
        return polygamma(n, self)

    method.op = polygamma.op
    method.__signature__ = inspect.signature(_tensor_polygamma)
    Tensor.polygamma = _tensor_polygamma
    Tensor.polygamma_ = inplace_variant(
        method,
        "polygamma_",
        "In-place version of :meth:`Tensor.polygamma`: ``self`` becomes ``polygamma(n, self)``.",
        True,  # the backward formula reads the old values
    )


_install_polygamma_methods()


def _mvlgamma_meta(input, p):
    _need_tensor(input, "input", 1, "mvlgamma")
    if not isinstance(p, int) or isinstance(p, bool):
        raise TypeError(f"mvlgamma(): argument 'p' (position 2) must be int, not {type(p).__name__}")
    if input._dtype is dt.bool:
        raise RuntimeError("The input tensor may not be a boolean tensor.")
    if p < 1:
        raise RuntimeError("p has to be greater than or equal to 1")
    return _MVLGAMMA_BASE(input)


_MVLGAMMA_BASE = unary_meta("mvlgamma")


def _mvlgamma_ref(spec, a, p):
    """PyTorch's evaluation order and roundings: the arguments ``input - j/2`` and the ``lgamma`` values in
    the result dtype, summed from ``j = p - 1`` down (in float32 below float64), the constant added last."""
    d = spec.dtype.numpy
    compute = _compute_np(spec.dtype)
    acc = np.float64 if spec.dtype is dt.float64 else np.float32
    x = np.asarray(a).astype(compute)
    total = None
    for j in range(p - 1, -1, -1):
        arg = (x - compute.type(0.5 * j)).astype(d)
        term = lgamma_np(arg.astype(np.float64)).astype(d).astype(acc)
        total = term if total is None else total + term
    constant = np.asarray(p * (p - 1) / 4.0 * _LOGPI, dtype=d).astype(compute)  # a number is rounded to d
    return (total.astype(d).astype(compute) + constant).astype(d)


def _mvlgamma_decomposed(input, p):
    """``mvlgamma`` in kiln ops: ``Σ_j lgamma(input - j / 2) + p (p - 1) / 4 log π``, as PyTorch forms it."""
    d = input._dtype if input._dtype.is_floating_point else dt.get_default_dtype()
    x = input.to(d)
    acc = dt.float64 if d is dt.float64 else dt.float32
    total = None
    for j in range(p - 1, -1, -1):
        term = lgamma(x - 0.5 * j if j else x).to(acc)
        total = term if total is None else total + term
    return total.to(d) + p * (p - 1) / 4.0 * _LOGPI


def _mvlgamma_backward(grad, input, p):
    total = digamma(input)
    for j in range(1, p):
        total = total + digamma(input - 0.5 * j)
    return grad * total


@op(
    tags=("pointwise",),
    inplace=True,
    meta=_mvlgamma_meta,
    reference=_mvlgamma_ref,
    backward=_mvlgamma_backward,
    decompose=_mvlgamma_decomposed,
    methods=("mvlgamma",),
)
def mvlgamma(input: Tensor, p: int) -> Tensor:
    """The multivariate log-gamma function of dimension ``p``, elementwise:
    ``p (p - 1) / 4 log π + Σ_{j < p} lgamma(input - j / 2)``."""


def _zeta_meta(input, other):
    _check_pair("special_zeta", input, other)
    spec = _ZETA_BASE(input, other)
    if spec.dtype in (dt.float16, dt.bfloat16):
        raise _not_implemented("zeta_cpu", spec.dtype)
    return spec


_ZETA_BASE = binary_meta("zeta", float_result=True)


def _zeta_backward(grad, input, other, needs_input_grad):
    if needs_input_grad[0]:
        raise NotImplementedError("the derivative for 'zeta' is not implemented.")
    return (None, grad * -input * zeta(input + 1.0, other) if needs_input_grad[1] else None)


@op(
    tags=("pointwise",),
    meta=_zeta_meta,
    reference=lambda spec, a, b: zeta_np(_f64_operand(a, spec), _f64_operand(b, spec)),
    backward=_zeta_backward,
    grad_fn_name=_backward_name("SpecialZetaBackward"),
)
def zeta(input: Tensor | Number, other: Tensor | Number) -> Tensor:
    """The Hurwitz zeta function ``Σ_{k >= 0} (k + other)^-input``, elementwise, broadcasting (``inf`` at
    ``input == 1`` and at non-positive integer ``other``; NaN for ``input < 1``)."""
