"""The regularized incomplete gamma functions ``igamma`` (``P(a, x)``) and ``igammac`` (``Q(a, x)``).

Computed in float64 and rounded once to the result dtype, by the classical methods (Abramowitz & Stegun
6.5, Numerical Recipes §6.2, Temme for small ``a``):

* ``P`` by its power series ``x^a e^-x / Γ(a + 1) Σ x^n / ((a + 1) ... (a + n))`` where ``x <= max(a, 1)``,
  and as ``1 - Q`` elsewhere;
* ``Q`` by the continued fraction where ``x > max(a, 1)``, as ``1 - P`` where ``P`` is the smaller one,
  and, for ``x <= 1.1`` and small ``a``, by the series ``1 - x^a / Γ(a + 1) + ...`` written with
  ``expm1`` and ``log Γ(1 + a)`` (its Taylor series in ``a``, with ``ζ(k)``), which keeps full relative
  accuracy where ``Q`` is tiny;
* the prefactor ``x^a e^-x / Γ(a)`` for ``a >= 13`` as ``exp(a log1pmx((x - a) / a) + ...)`` with
  Stirling's correction, so that no digits are lost to cancellation in ``a log x - x - log Γ(a)``;
* for ``a >= 2·10^4`` and ``x`` within 30% of ``a`` (where the series would take thousands of terms),
  Temme's uniform asymptotic expansion (DLMF 8.12) to its ``1/a`` term.

PyTorch's domain: NaN for negative arguments, ``P(0, x > 0) = 1``, ``P(a, 0) = 0``, ``P(∞, x < ∞) = 0``,
``P(a, ∞) = 1`` (``Q`` the complements), NaN for ``(0, 0)`` and ``(∞, ∞)``. kiln stays accurate where
PyTorch's float64 results drift (``a`` beyond about 10^7) and for subnormal ``a`` (where PyTorch's
prefactor underflows to 0).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from kiln._dispatch import op
from kiln._ops.elementwise import binary_meta
from kiln._ops.gamma import _LGAMMA_STIRLING, _LS2PI, lgamma, lgamma_np, zeta_np
from kiln._ops.math_args import _need_tensor, _not_implemented
from kiln._ops.special import _f64_operand, _floats, _poly, erfc_np
from kiln._tensor import Tensor

__all__ = ["igamma_np", "igammac_np", "igamma", "igammac"]

TOP_LEVEL = ("igamma", "igammac")
"""The names ``kiln`` exports at its top level (as ``torch`` does)."""

_MACHEP = 2.0**-53
_EULER = 0.57721566490153286061
_MAX_TERMS = 100_000  # a safety bound; convergence takes about 9 sqrt(a) terms near x = a


@functools.cache
def _lgam1p_taylor() -> tuple[float, ...]:
    """``log Γ(1 + a) = -γ a + Σ_{k >= 2} (-1)^k ζ(k) a^k / k`` for ``|a| <= 1/2``: its coefficients, the
    highest order (40) first (computed on first use: ``import kiln`` stays fast)."""
    return tuple(float(((-1) ** k) * zeta_np(float(k), 1.0) / k) for k in range(40, 1, -1)) + (-_EULER, 0.0)


def _lgam1p(a: np.ndarray) -> np.ndarray:
    """``log Γ(1 + a)``, accurate relative to its value for small ``a`` too."""
    out = np.empty_like(a)
    small = np.abs(a) <= 0.5
    out[small] = _poly(a[small], _lgam1p_taylor())
    near_one = ~small & (np.abs(a - 1.0) < 0.5)
    out[near_one] = np.log(a[near_one]) + _poly(a[near_one] - 1.0, _lgam1p_taylor())
    rest = ~small & ~near_one
    out[rest] = lgamma_np(a[rest] + 1.0)
    return out


def _log1pmx(t: np.ndarray) -> np.ndarray:
    """``log(1 + t) - t`` without cancellation near 0."""
    out = np.empty_like(t)
    small = np.abs(t) < 0.5
    ts = t[small]
    # -t²/2 + t³/3 - ... : converges like 0.5^k
    acc = np.zeros_like(ts)
    power = -ts * ts
    for k in range(2, 56):
        acc += power / k
        power = power * -ts
    out[small] = acc
    big = ~small
    out[big] = np.log1p(t[big]) - t[big]
    return out


def _prefactor(a: np.ndarray, x: np.ndarray, over_a: bool = False) -> np.ndarray:
    """``x^a e^-x / Γ(a)`` for ``a, x > 0`` finite (divided by ``a`` when ``over_a``: ``x^a e^-x / Γ(a + 1)``,
    which keeps its accuracy for subnormal ``a``)."""
    out = np.empty_like(a)
    large = a >= 13.0
    al, xl = a[large], x[large]
    stirling = _poly(1.0 / (al * al), _LGAMMA_STIRLING) / al
    out[large] = np.exp(al * _log1pmx((xl - al) / al) + 0.5 * np.log(al) - _LS2PI - stirling)
    if over_a:
        out[large] /= al
    small = ~large
    a_s, x_s = a[small], x[small]
    log_gamma = _lgam1p(a_s) if over_a else lgamma_np(a_s)
    out[small] = np.exp(a_s * np.log(x_s) - x_s - log_gamma)
    return out


def _p_series(a: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``P(a, x)`` by its power series (for ``x <= max(a, 1)``)."""
    total = np.ones_like(a)
    term = np.ones_like(a)
    r = a.copy()
    live = np.arange(a.size)
    for _ in range(_MAX_TERMS):
        if not live.size:
            break
        r[live] += 1.0
        term[live] *= x[live] / r[live]
        total[live] += term[live]
        live = live[term[live] > _MACHEP * total[live]]
    return total * _prefactor(a, x, over_a=True)


def _q_fraction(a: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``Q(a, x)`` by Legendre's continued fraction (for ``x > max(a, 1)``), evaluated by the modified
    Lentz method."""
    tiny = 1e-300
    b = x + 1.0 - a
    c = np.full_like(a, 1.0 / tiny)
    d = 1.0 / b
    h = d.copy()
    live = np.arange(a.size)
    for i in range(1, _MAX_TERMS):
        if not live.size:
            break
        an = -i * (i - a[live])
        b[live] += 2.0
        dl = an * d[live] + b[live]
        dl = np.where(np.abs(dl) < tiny, tiny, dl)
        cl = b[live] + an / c[live]
        cl = np.where(np.abs(cl) < tiny, tiny, cl)
        dl = 1.0 / dl
        delta = dl * cl
        d[live], c[live] = dl, cl
        h[live] *= delta
        live = live[np.abs(delta - 1.0) > _MACHEP]
    return h * _prefactor(a, x)


def _q_small(a: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``Q(a, x)`` for ``x <= 1.1`` and ``a`` small enough that ``P`` is near 1: ``-expm1(a log x - log
    Γ(1 + a)) - x^a / Γ(a) Σ_{n >= 1} (-x)^n / (n! (a + n))``."""
    total = np.zeros_like(a)
    fac = np.ones_like(a)
    live = np.arange(a.size)
    for n in range(1, _MAX_TERMS):
        if not live.size:
            break
        fac[live] *= -x[live] / n
        term = fac[live] / (a[live] + n)
        total[live] += term
        live = live[np.abs(term) > _MACHEP * np.abs(total[live])]
    logx = np.log(x)
    return -np.expm1(a * logx - _lgam1p(a)) - np.exp(a * logx - lgamma_np(a)) * total


# Temme's uniform asymptotic expansion for large a (DLMF 8.12): Q = erfc(η sqrt(a/2)) / 2 + R, P = erfc(-η
# sqrt(a/2)) / 2 - R, R = exp(-aη²/2) / sqrt(2πa) (c0(η) + c1(η) / a + ...), η = sign(μ) sqrt(-2 log1pmx(μ)),
# μ = x/a - 1; c0(η) = 1/μ - 1/η and c1(η) = 1/η³ - 1/μ³ - 1/μ² - 1/(12μ), here as their Taylor series in η
# (computed once to 60 digits; the highest order first), which have no cancellation near η = 0
_TEMME_C0 = _floats(
    """
    -5.0276692801141755e-12 2.4361948020667415e-11 -5.830772132550426e-11 -2.5514193994946248e-11
    9.14769958223679e-10 -4.382036018453353e-09 1.0261809784240309e-08 6.707853543401498e-09
    -1.7665952736826078e-07 8.296711340953087e-07 -1.85406221071516e-06 -2.185448510679992e-06
    3.919263178522438e-05 -0.0001787551440329218 0.0003527336860670194 0.0011574074074074073
    -0.014814814814814815 0.08333333333333333 -0.3333333333333333
    """
)
_TEMME_C1 = _floats(
    """
    7.1624989648114856e-12 6.067215101604758e-14 -8.56390702649298e-11 4.162792991842583e-10
    -1.0091543710600413e-09 -1.7543241719747647e-11 1.1951628599778148e-08 -5.752545603517705e-08
    1.378633446915721e-07 4.647127802807434e-09 -1.6120900894563446e-06 7.64916091608111e-06
    -1.8098550334489977e-05 -4.018775720164609e-07 0.00020576131687242798 -0.0009902263374485596
    0.0026455026455026454 -0.003472222222222222 -0.001851851851851852
    """
)
_UNIFORM_A = 2e4  # from here on, where x is within 30% of a (the series would take over 1,300 terms)


def _uniform_applies(a: np.ndarray, x: np.ndarray, ordinary: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return ordinary & (a >= _UNIFORM_A) & (np.abs(x - a) < 0.3 * a)


def _uniform(a: np.ndarray, x: np.ndarray, lower: bool) -> np.ndarray:
    """``P(a, x)`` (``lower``) or ``Q(a, x)`` by Temme's uniform expansion (see the table above)."""
    mu = (x - a) / a
    eta = np.copysign(np.sqrt(-2.0 * _log1pmx(mu)), mu)
    r = np.exp(-0.5 * a * eta * eta) / np.sqrt(2.0 * math.pi * a) * (_poly(eta, _TEMME_C0) + _poly(eta, _TEMME_C1) / a)
    y = eta * np.sqrt(0.5 * a)
    return 0.5 * erfc_np(-y) - r if lower else 0.5 * erfc_np(y) + r


def _prepare(a, x):
    a, x = np.broadcast_arrays(np.asarray(a, dtype=np.float64), np.asarray(x, dtype=np.float64))
    return a.shape, a.reshape(-1).copy(), x.reshape(-1).copy()


def _edge_cases(af: np.ndarray, xf: np.ndarray, lower: bool) -> tuple[np.ndarray, np.ndarray]:
    """The results PyTorch defines outright, checked in its order (NaN where undefined), and the mask of
    ordinary arguments (both positive and finite)."""
    one, zero = (1.0, 0.0) if lower else (0.0, 1.0)
    out = np.full(af.shape, np.nan)
    left = ~((xf < 0) | (af < 0))  # negative arguments: NaN
    a_zero = left & (af == 0)
    out[a_zero & (xf > 0)] = one
    left &= ~a_zero
    x_zero = left & (xf == 0)
    out[x_zero] = zero
    left &= ~x_zero
    a_inf = left & np.isinf(af)
    out[a_inf & ~np.isinf(xf)] = zero
    left &= ~a_inf
    out[left & np.isinf(xf)] = one
    return out, left & np.isfinite(af) & np.isfinite(xf)


def _q_small_applies(a: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Where ``Q`` is taken from :func:`_q_small` (the regions of Temme's/Cephes' ``igamc_series``)."""
    with np.errstate(divide="ignore"):
        return ((x <= 0.5) & (-0.4 / np.log(x) >= a)) | ((x > 0.5) & (x <= 1.1) & (x * 1.1 >= a))


def igamma_np(a, x) -> np.ndarray:
    """The regularized lower incomplete gamma function ``P(a, x)`` of float64 arrays (broadcast)."""
    shape, af, xf = _prepare(a, x)
    out, ordinary = _edge_cases(af, xf, lower=True)
    uniform = _uniform_applies(af, xf, ordinary)
    out[uniform] = _uniform(af[uniform], xf[uniform], lower=True)
    ordinary &= ~uniform
    frac = ordinary & (xf > 1.0) & (xf > af)
    out[frac] = 1.0 - _q_fraction(af[frac], xf[frac])
    series = ordinary & ~frac
    out[series] = _p_series(af[series], xf[series])
    return out.reshape(shape)


def igammac_np(a, x) -> np.ndarray:
    """The regularized upper incomplete gamma function ``Q(a, x) = 1 - P(a, x)`` of float64 arrays."""
    shape, af, xf = _prepare(a, x)
    out, ordinary = _edge_cases(af, xf, lower=False)
    uniform = _uniform_applies(af, xf, ordinary)
    out[uniform] = _uniform(af[uniform], xf[uniform], lower=False)
    ordinary &= ~uniform
    small = ordinary & _q_small_applies(af, xf)
    out[small] = _q_small(af[small], xf[small])
    frac = ordinary & ~small & (xf > 1.0) & (xf >= af)
    out[frac] = _q_fraction(af[frac], xf[frac])
    series = ordinary & ~small & ~frac
    out[series] = 1.0 - _p_series(af[series], xf[series])
    return out.reshape(shape)


# ---------------------------------------------------------------------------------------- ops


def _igamma_meta(name: str):
    base = binary_meta(name)

    def meta(input, other):
        _need_tensor(input, "input", 1, name)
        _need_tensor(other, "other", 2, name)
        spec = base(input, other)
        if not spec.dtype.is_floating_point:
            raise _not_implemented(f"{name}_cpu", spec.dtype)
        return spec

    return meta


def _gamma_density(input, other):
    """``x^(a-1) e^-x / Γ(a)``: the derivative of ``P(a, x)`` in ``x``."""
    from kiln._ops.elementwise import exp, log

    return exp((input - 1) * log(other) - other - lgamma(input))


def _igamma_backward(name: str, sign: float):
    def backward(grad, input, other, needs_input_grad):
        if needs_input_grad[0]:
            raise NotImplementedError(f"the derivative for '{name}: input' is not implemented.")
        return (None, grad * sign * _gamma_density(input, other) if needs_input_grad[1] else None)

    return backward


def _ref(fn):
    return lambda spec, a, b: fn(_f64_operand(a, spec), _f64_operand(b, spec))


@op(
    tags=("pointwise",),
    inplace=True,
    meta=_igamma_meta("igamma"),
    reference=_ref(igamma_np),
    backward=_igamma_backward("igamma", 1.0),
    methods=("igamma",),
)
def igamma(input: Tensor, other: Tensor) -> Tensor:
    """The regularized lower incomplete gamma function ``P(input, other) = γ(input, other) / Γ(input)``,
    elementwise, broadcasting (``torch.special.gammainc``)."""


@op(
    tags=("pointwise",),
    inplace=True,
    meta=_igamma_meta("igammac"),
    reference=_ref(igammac_np),
    backward=_igamma_backward("igammac", -1.0),
    methods=("igammac",),
)
def igammac(input: Tensor, other: Tensor) -> Tensor:
    """The regularized upper incomplete gamma function ``Q(input, other) = 1 - P(input, other)``,
    elementwise, broadcasting (``torch.special.gammaincc``)."""
