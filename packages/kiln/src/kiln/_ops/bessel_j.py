"""Bessel functions of the first and second kind (``bessel_j0``, ``bessel_j1``, ``bessel_y0``, ``bessel_y1``),
the spherical Bessel function ``spherical_bessel_j0`` and the Airy function ``airy_ai``.

The Cephes library's rational approximations (``j0.c``, ``j1.c``, ``airy.c``): a rational function of
``x²`` up to 5 (times the factors that put the zeros in place), Hankel's asymptotic form with rational
modulus and phase corrections beyond; for ``Ai`` the Maclaurin series below ``|x| = 2.09`` and the
asymptotic forms with rational corrections beyond. Computed in float64 and rounded once, except the
phase ``x - π/4`` (``ζ + π/4`` for ``Ai``), which PyTorch's float32 kernels round to float32 before
taking its sine and cosine: kiln rounds it the same way, since for large ``x`` that rounding decides
the result. ``Ai`` is 0 past 25.77 in float32 and past 103.892 in float64, as in PyTorch.
"""

from __future__ import annotations

import math

import numpy as np

from kiln._ops.elementwise import _in_float, sin, where
from kiln._ops.special import _floats, _poly, float_unary
from kiln._tensor import Tensor

__all__ = [
    "bessel_j0_np",
    "bessel_j1_np",
    "bessel_y0_np",
    "bessel_y1_np",
    "airy_ai_np",
    "bessel_j0",
    "bessel_j1",
    "bessel_y0",
    "bessel_y1",
    "spherical_bessel_j0",
    "airy_ai",
]

_SQ2OPI = math.sqrt(2.0 / math.pi)
_TWOOPI = 2.0 / math.pi
_PIO4 = math.pi / 4.0
_THPIO4 = 3.0 * math.pi / 4.0
_J0_DR1 = 5.78318596294678452118  # the squares of the first two zeros of J0
_J0_DR2 = 30.4712623436620863991
_J1_Z1 = 14.6819706421238932572  # and of J1
_J1_Z2 = 49.2184563216946036703
_AI_0 = 0.35502805388781723926  # Ai(0) and -Ai'(0)
_AI_D0 = 0.258819403792806798405
_SQPII = 1.0 / math.sqrt(math.pi)

# Cephes j0.c, j1.c: R on [0, 5] (Y for the second kind), P and Q the modulus and phase corrections beyond
_J0_PP = _floats(
    """
    0.0007969367292973471 0.08283523921074408 1.239533716464143 5.447250030587687
    8.74716500199817 5.303240382353949 1.0
    """
)
_J0_PQ = _floats(
    """
    0.0009244088105588637 0.08562884743544745 1.2535274390105895 5.470977403304171
    8.761908832370695 5.306052882353947 1.0
    """
)
_J0_QP = _floats(
    """
    -0.011366383889846916 -1.2825271867050931 -19.553954425773597 -93.20601521237683
    -177.68116798048806 -147.07750515495118 -51.41053267665993 -6.050143506007285
    """
)
_J0_QQ = _floats(
    """
    1.0 64.3178256118178 856.4300259769806 3882.4018360540163
    7240.467741956525 5930.727011873169 2062.0933166032783 242.0057402402914
    """
)
_J0_YP = _floats(
    """
    15592.436785523574 -14663929.59039716 5435264770.518765 -982136065717.9115
    87590639439536.7 -3466283033847297.0 4.4273326857256984e+16 -1.8495080043698668e+16
    """
)
_J0_YQ = _floats(
    """
    1.0 1041.2835366425984 626107.330137135 268919633.39381415
    86400248710.3935 20297961275010.555 3171577528429750.5 2.5059625617265306e+17
    """
)
_J0_RP = _floats(
    """
    -4794432209.782018 1956174919465.5657 -249248344360967.72 9708622510473064.0
    """
)
_J0_RQ = _floats(
    """
    1.0 499.563147152651 173785.4016763747 48440965.83399621
    11185553704.535683 2112775201154.892 310518229857422.56 3.1812195594320496e+16
    1.7108629408104315e+18
    """
)
_J1_RP = _floats(
    """
    -899971225.7055594 452228297998.19403 -72749424522181.83 3682957328638529.0
    """
)
_J1_RQ = _floats(
    """
    1.0 620.8364781180543 256987.25675774884 83514679.14319493
    22151159547.97925 4749141220799.914 784369607876235.9 8.952223361846274e+16
    5.322786203326801e+18
    """
)
_J1_PP = _floats(
    """
    0.0007621256162081731 0.07313970569409176 1.1271960812968493 5.112079511468076
    8.424045901417724 5.214515986823615 1.0
    """
)
_J1_PQ = _floats(
    """
    0.0005713231280725487 0.06884559087544954 1.105142326340617 5.073863861286015
    8.399855543276042 5.209828486823619 1.0
    """
)
_J1_QP = _floats(
    """
    0.05108625947501766 4.982138729512334 75.82382841325453 366.7796093601508
    710.8563049989261 597.4896124006136 211.68875710057213 25.207020585802372
    """
)
_J1_QQ = _floats(
    """
    1.0 74.23732770356752 1056.4488603826283 4986.410583376536
    9562.318924047562 7997.041604473507 2826.1927851763908 336.0936078106983
    """
)
_J1_YP = _floats(
    """
    1263204747.9017804 -647355876379.1603 114509511541823.73 -8127702555013251.0
    2.024394757135949e+17 -7.788771962659501e+17
    """
)
_J1_YQ = _floats(
    """
    1.0 594.3015923461282 235564.09294306856 73481194.44597217
    18760131610.870617 3882312774962.3857 620557727146953.8 6.871410873553005e+16
    3.9727060811656064e+18
    """
)
# Cephes airy.c: A for x >= 2.09, F and G (modulus and phase) for x <= -2.09
_AIRY_AN = _floats(
    """
    0.346538101525629 12.007595273964581 76.27960536152345 168.08922493463058
    159.75639135016442 70.53609068404442 14.026469116338967 1.0
    """
)
_AIRY_AD = _floats(
    """
    0.5675945326387702 14.75625625848472 84.51389701414746 177.31808814540045
    164.2346928715297 71.47784008255756 14.095913560783403 1.0
    """
)
_AIRY_AFN = _floats(
    """
    -0.1316963234183318 -0.6264565444319123 -0.6931580360369335 -0.2797799815451191
    -0.04919001326095003 -0.004062659235948854 -0.0001592764962392621 -2.776491081552329e-06
    -1.6778769848911465e-08
    """
)
_AIRY_AFD = _floats(
    """
    1.0 13.356042070655324 32.682503279522464 26.736704094149957
    9.187074029072596 1.4752914677166642 0.11568717379518804 0.004402916416152112
    7.547203482874142e-05 4.5185009297058035e-07
    """
)
_AIRY_AGN = _floats(
    """
    0.01973399320916857 0.39110302961568827 1.0657989759959559 0.9391692298166502
    0.35146565610554764 0.06338889196289255 0.005858041130483885 0.000282851600836737
    6.98793669997261e-06 8.117892395543892e-08 3.415517847659236e-10
    """
)
_AIRY_AGD = _floats(
    """
    1.0 9.30892908077442 19.835292871831214 15.564662893286462
    5.476860694229755 0.9542936116189619 0.08645808263523921 0.004126565238242226
    0.00010125908511650914 1.1716673321441352e-06 4.9183457006293e-09
    """
)


def _rounded(x: np.ndarray, compute: np.dtype) -> np.ndarray:
    """``x`` rounded to the compute dtype (float32 kernels round their phase there)."""
    return x if compute == np.float64 else x.astype(compute).astype(np.float64)


def _phase(x: np.ndarray, shift: float, compute: np.dtype) -> np.ndarray:
    """``x - shift`` as the compute dtype forms it."""
    if compute == np.float64:
        return x - shift
    c = compute.type
    return (x.astype(compute) - c(shift)).astype(np.float64)


def _hankel(x: np.ndarray, pq: tuple, shift: float, second: bool, compute: np.dtype) -> np.ndarray:
    """Hankel's asymptotic form for ``x > 5``: ``sqrt(2/(πx)) (P cos θ - (5/x) Q sin θ)`` with ``θ = x -
    shift`` (``sin`` and ``cos`` exchanged for the second kind)."""
    pp, pq_, qp, qq = pq
    with np.errstate(invalid="ignore", divide="ignore"):
        w = 5.0 / x
        z = w * w
        p = _poly(z, pp) / _poly(z, pq_)
        q = _poly(z, qp) / _poly(z, qq)
        xn = _phase(x, shift, compute)
        s, c = np.sin(xn), np.cos(xn)
        if second:
            v = p * s + w * q * c
        else:
            v = p * c - w * q * s
        return v * _SQ2OPI / np.sqrt(x)


_J0_HANKEL = (_J0_PP, _J0_PQ, _J0_QP, _J0_QQ)
_J1_HANKEL = (_J1_PP, _J1_PQ, _J1_QP, _J1_QQ)


def _j0_abs(z: np.ndarray, compute: np.dtype) -> np.ndarray:
    out = np.empty_like(z)
    low = z <= 5.0
    zl = z[low]
    s = zl * zl
    out[low] = (s - _J0_DR1) * (s - _J0_DR2) * _poly(s, _J0_RP) / _poly(s, _J0_RQ)
    out[~low] = _hankel(z[~low], _J0_HANKEL, _PIO4, False, compute)
    return out


def _j1_abs(z: np.ndarray, compute: np.dtype) -> np.ndarray:
    out = np.empty_like(z)
    low = z <= 5.0
    zl = z[low]
    s = zl * zl
    out[low] = _poly(s, _J1_RP) / _poly(s, _J1_RQ) * zl * (s - _J1_Z1) * (s - _J1_Z2)
    out[~low] = _hankel(z[~low], _J1_HANKEL, _THPIO4, False, compute)
    return out


def bessel_j0_np(x: np.ndarray, compute: np.dtype = np.dtype(np.float64)) -> np.ndarray:
    """The Bessel function of the first kind of order 0 of a float64 array."""
    return _j0_abs(np.abs(x), compute)


def bessel_j1_np(x: np.ndarray, compute: np.dtype = np.dtype(np.float64)) -> np.ndarray:
    """The Bessel function of the first kind of order 1 of a float64 array (odd: ``-0`` at ``-0``)."""
    y = _j1_abs(np.abs(x), compute)
    return np.where(np.signbit(x), -y, y)


def _second_kind(x: np.ndarray, order: int, compute: np.dtype) -> np.ndarray:
    out = np.full_like(x, np.nan)  # negative arguments
    out[x == 0] = -np.inf
    low = (x > 0) & (x <= 5.0)
    xl = x[low]
    s = xl * xl
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        if order == 0:
            out[low] = _poly(s, _J0_YP) / _poly(s, _J0_YQ) + _TWOOPI * np.log(xl) * _j0_abs(xl, compute)
        else:
            out[low] = xl * (_poly(s, _J1_YP) / _poly(s, _J1_YQ)) + _TWOOPI * (
                _j1_abs(xl, compute) * np.log(xl) - 1.0 / xl
            )
    high = x > 5.0
    pq, shift = (_J0_HANKEL, _PIO4) if order == 0 else (_J1_HANKEL, _THPIO4)
    out[high] = _hankel(x[high], pq, shift, True, compute)
    return out


def bessel_y0_np(x: np.ndarray, compute: np.dtype = np.dtype(np.float64)) -> np.ndarray:
    """The Bessel function of the second kind of order 0 of a float64 array (``-inf`` at 0, NaN below)."""
    return _second_kind(x, 0, compute)


def bessel_y1_np(x: np.ndarray, compute: np.dtype = np.dtype(np.float64)) -> np.ndarray:
    """The Bessel function of the second kind of order 1 of a float64 array (``-inf`` at 0, NaN below)."""
    return _second_kind(x, 1, compute)


def _airy_series(x: np.ndarray) -> np.ndarray:
    """``Ai(x) = c1 f(x) - c2 g(x)`` for ``|x| < 2.09`` by the Maclaurin series of ``f`` and ``g``."""
    f = np.ones_like(x)
    g = x.copy()
    uf = np.ones_like(x)
    ug = x.copy()
    k = 1.0
    z = x * x * x
    live = np.ones(x.shape, bool)
    while live.any() and k < 400.0:
        uf = uf * z / (k + 1.0) / (k + 2.0)
        ug = ug * z / (k + 2.0) / (k + 3.0)
        k += 3.0
        f = np.where(live, f + uf, f)
        g = np.where(live, g + ug, g)
        with np.errstate(invalid="ignore", divide="ignore"):
            live &= np.abs(uf / f) > 2.0**-53
    return _AI_0 * f - _AI_D0 * g


def airy_ai_np(x: np.ndarray, compute: np.dtype = np.dtype(np.float64)) -> np.ndarray:
    """The Airy function ``Ai`` of a float64 array (NaN at ``±inf``, 0 past the dtype's underflow point)."""
    out = np.zeros_like(x)
    out[np.isnan(x) | np.isinf(x)] = np.nan
    cut = 103.892 if compute == np.float64 else 25.77
    neg = np.isfinite(x) & (x < -2.09)
    xn = x[neg]
    with np.errstate(invalid="ignore", over="ignore"):
        t = np.sqrt(-xn)
        zeta = -2.0 * xn * t / 3.0
        if compute != np.float64:
            c = compute.type
            x32 = xn.astype(compute)
            zeta32 = c(-2.0) * x32 * np.sqrt(-x32) / c(3.0)
            theta = (zeta32 + c(_PIO4)).astype(np.float64)
        else:
            theta = zeta + _PIO4
        k = _SQPII / np.sqrt(t)
        z = 1.0 / zeta
        zz = z * z
        uf = 1.0 + zz * _poly(zz, _AIRY_AFN) / _poly(zz, _AIRY_AFD)
        ug = z * _poly(zz, _AIRY_AGN) / _poly(zz, _AIRY_AGD)
        out[neg] = k * (np.sin(theta) * uf - np.cos(theta) * ug)
    pos = (x >= 2.09) & (x <= cut)
    xp = x[pos]
    with np.errstate(over="ignore", under="ignore"):
        t = np.sqrt(xp)
        zeta = 2.0 * xp * t / 3.0
        z = 1.0 / zeta
        out[pos] = _SQPII * (_poly(z, _AIRY_AN) / _poly(z, _AIRY_AD)) / (2.0 * np.sqrt(t) * np.exp(zeta))
    mid = (x > -2.09) & (x < 2.09)
    out[mid] = _airy_series(x[mid])
    return out


# ---------------------------------------------------------------------------------------- ops


def _doc(kind: str, order: int, extra: str = "") -> str:
    return f"The Bessel function of the {kind} kind of order {order}, elementwise{extra} (not differentiable)."


bessel_j0 = float_unary("bessel_j0", bessel_j0_np, None, _doc("first", 0), half=False, with_compute=True)
bessel_j1 = float_unary("bessel_j1", bessel_j1_np, None, _doc("first", 1), half=False, with_compute=True)
bessel_y0 = float_unary(
    "bessel_y0", bessel_y0_np, None, _doc("second", 0, " (``-inf`` at 0, NaN below)"), half=False, with_compute=True
)
bessel_y1 = float_unary(
    "bessel_y1", bessel_y1_np, None, _doc("second", 1, " (``-inf`` at 0, NaN below)"), half=False, with_compute=True
)
airy_ai = float_unary(
    "airy_ai",
    airy_ai_np,
    None,
    "The Airy function ``Ai`` elementwise (not differentiable).",
    half=False,
    with_compute=True,
)

# sin(x)/x, and its Taylor series below 1/2 (to x^12) where the quotient would lose digits
_SINC_SERIES = tuple(((-1) ** k) / math.factorial(2 * k + 1) for k in range(6, -1, -1))


def _spherical_j0_np(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        quotient = np.sin(x) / x
    series = _poly(x * x, _SINC_SERIES)
    return np.where(np.isinf(x), 0.0, np.where(np.abs(x) < 0.5, series, quotient))


def _spherical_j0_decomposed(input: Tensor) -> Tensor:
    """``spherical_bessel_j0`` in kiln ops: ``sin(x) / x``, its Taylor series below 1/2, 0 at ``±inf``."""
    x, d = _in_float(input)
    s = x * x
    series = s * 0.0 + _SINC_SERIES[0]
    for c in _SINC_SERIES[1:]:
        series = series * s + c
    quotient = sin(x) / x
    out = where(x.abs() < 0.5, series, quotient)
    return where(x.abs() == math.inf, 0.0, out).to(d)


spherical_bessel_j0 = float_unary(
    "spherical_bessel_j0",
    _spherical_j0_np,
    None,
    "The spherical Bessel function of the first kind of order 0, ``sin(input) / input``, elementwise "
    "(1 at 0, 0 at ``±inf``; not differentiable).",
    half=False,
    decompose=_spherical_j0_decomposed,
)
