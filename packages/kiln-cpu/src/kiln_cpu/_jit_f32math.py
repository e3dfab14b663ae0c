"""float32 exp, log, tanh, sigmoid and erf computed in float64 with vectorisable polynomials and rounded
once to float32 (at most 1 ulp from the exact value)."""

from __future__ import annotations

import math

import numpy as np
from numba.extending import register_jitable

from kiln_cpu._jit_support import _bits_f32, _bits_f64, _f64_bits

# ------------------------------------------------------------------------- float64 cores for float32

_SQRT_HALF = math.sqrt(0.5)
_GELU_K = math.sqrt(2.0 / math.pi)
_GELU_C = 0.044715
_LN2_HI = 6.93147180369123816490e-01  # low bits zero: n * _LN2_HI is exact for |n| < 2**11
_LN2_LO = 1.90821492927058770002e-10
_LN2 = 0.6931471805599453
_ROUND_SHIFT = 6755399441055744.0  # 1.5 * 2**52: adding it rounds a float64 below 2**51 to an integer
_LOG2E = 1.4426950408889634
_SQRT2 = 1.4142135623730951


@register_jitable(inline="always")
def _exp_reduce(x):
    """``(f, 2**n)`` with ``x = n*ln2 + f``, ``|f| <= ln2/2``, for ``x`` in [-708, 709] (so that 2**n is a
    normal float64): the range reduction of every exp here; callers clamp and pick the polynomial."""
    # n = x/ln2 rounded to an integer by adding 1.5 * 2**52 (it lands in the low mantissa bits): no
    # float-to-integer conversion, which has no vector instruction below AVX-512 and kept LLVM from
    # vectorising this loop at all
    kd = x * _LOG2E + _ROUND_SHIFT
    n = kd - _ROUND_SHIFT
    f = (x - n * _LN2_HI) - n * _LN2_LO
    # the exponent field: the low 12 bits of (n + 1023) after the shift drop the shift constant's bits
    return f, _bits_f64((_f64_bits(kd) + 1023) << 52)


@register_jitable(inline="always")
def _log_reduce(x):
    """``(e, s)`` with ``x = 2**e * m``, ``m`` in [sqrt(2)/2, sqrt(2)] and ``s = (m-1)/(m+1)``, so that
    ``log x = e*ln2 + 2*atanh(s)``, for a positive normal float64: the range reduction of every log here."""
    bits = _f64_bits(x)
    e = (bits >> 52) - 1023
    m = _bits_f64((bits & 0x000FFFFFFFFFFFFF) | 0x3FF0000000000000)
    big = m > _SQRT2
    m = m * 0.5 if big else m
    e = e + 1 if big else e
    return np.float64(e), (m - 1.0) / (m + 1.0)


@register_jitable(inline="always")  # inlined in Numba's IR, as erf's: LLVM leaves calls to large functions
def _exp_d(x):
    """exp of a float64 to 2e-10 relative error (ample for float32 results): 2**n * e**f, |f| <= ln2/2,
    degree-8 Taylor in f.
    ``x`` is clamped to [-708, 709] so 2**n stays normal; callers handle NaN."""
    f, scale = _exp_reduce(min(max(x, -708.0), 709.0))
    # Estrin's scheme: a dependency chain half as long as Horner's, so vector iterations overlap
    f2 = f * f
    f4 = f2 * f2
    q03 = (1.0 + f) + f2 * (0.5 + f * (1.0 / 6.0))
    q47 = (1.0 / 24.0 + f * (1.0 / 120.0)) + f2 * (1.0 / 720.0 + f * (1.0 / 5040.0))
    p = q03 + f4 * (q47 + f4 * (1.0 / 40320.0))
    return p * scale


@register_jitable
def _log_d(x):
    """log of a positive normal float64 (relative error ~1e-15): e*ln2 + 2*atanh((m-1)/(m+1)),
    m in [sqrt(2)/2, sqrt(2)]."""
    e, s = _log_reduce(x)
    z = s * s
    z2 = z * z
    z4 = z2 * z2
    q03 = (2.0 + z * (2.0 / 3.0)) + z2 * (2.0 / 5.0 + z * (2.0 / 7.0))  # Estrin, as in _exp_d
    q47 = (2.0 / 9.0 + z * (2.0 / 11.0)) + z2 * (2.0 / 13.0 + z * (2.0 / 15.0))
    p = q03 + z4 * q47
    return e * _LN2 + s * p


@register_jitable
def exp_f32(x):
    """exp of a float32, rounded once from float64 (inf, 0 and NaN where IEEE says)."""
    r = np.float32(_exp_d(np.float64(x)))
    return x if x != x else r


@register_jitable
def log_f32(x):
    """log of a float32 (denormals included), rounded once from float64."""
    xd = np.float64(x)
    r = np.float32(_log_d(xd))
    r = np.float32(-np.inf) if x == 0 else r
    r = np.float32(np.inf) if x == np.inf else r
    r = np.float32(np.nan) if x < 0 else r
    return x if x != x else r


@register_jitable
def _expf_reduced(xc):
    """(y, n) with e**xc = y * 2**n, in float32 arithmetic (eight lanes per AVX instruction where the
    float64 path has four): Cody-Waite reduction by n*ln2 with float32 constants, r in [-ln2/2, ln2/2],
    and the degree-5 polynomial of Cephes' expf (coefficients from its published source), relative error
    ~1.5e-7 (about 1 ulp)."""
    n = np.floor(xc * np.float32(1.44269504) + np.float32(0.5))
    r = (xc - n * np.float32(0.693359375)) - n * np.float32(-2.12194440e-4)
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    return p * (r * r) + r + np.float32(1.0), n


@register_jitable
def expf_core(x):
    """e**x of a float32 in float32 arithmetic (:func:`_expf_reduced`); 2**n applied in two steps so that
    underflow to subnormals and 0 and overflow to inf happen where IEEE says. NaN in: the caller decides
    (this returns a number)."""
    y, n = _expf_reduced(min(max(x, np.float32(-104.0)), np.float32(89.0)))
    k = np.int32(n)
    k1 = k >> np.int32(1)
    s1 = _bits_f32(np.uint32((k1 + np.int32(127)) << np.int32(23)))
    s2 = _bits_f32(np.uint32((k - k1 + np.int32(127)) << np.int32(23)))
    return (y * s1) * s2


@register_jitable
def _expf_normal(x):
    """e**x of a float32 ``x`` in [-87, 88], where 2**n is one normal float: one scaling, five fewer
    instructions than :func:`expf_core`'s two."""
    y, n = _expf_reduced(x)
    return y * _bits_f32(np.uint32((np.int32(n) + np.int32(127)) << np.int32(23)))


@register_jitable
def expf_nonpositive(x):
    """e**x of a float32 ``x <= 0`` (softmax's ``x - max``): :func:`expf_core`'s value down to
    e**-87 = 1.6e-38, and 0 below (where the exact value is subnormal or a few normals from it: a
    softmax that small is 0 within 1e-37). NaN in: the caller decides."""
    v = _expf_normal(max(x, np.float32(-87.0)))
    return np.float32(0.0) if x < np.float32(-87.0) else v


@register_jitable
def tanh_f32(x):
    """tanh of a float32 in float32 arithmetic: below |x| = 0.625 the odd polynomial of Cephes' tanhf,
    above 1 - 2/(e**(2|x|) + 1) with :func:`_expf_normal` (2|x| at most 18.2), sign restored; within 1 ulp
    of the correctly rounded value over the float32 range (tests/test_f32math.py)."""
    a = abs(x)
    z = x * x
    p = np.float32(-5.70498872745e-3)
    p = p * z + np.float32(2.06390887954e-2)
    p = p * z - np.float32(5.37397155531e-2)
    p = p * z + np.float32(1.33314422036e-1)
    p = p * z - np.float32(3.33332819422e-1)
    small = x if z == 0 else (p * z) * x + x  # +-0 (and denormals whose square is 0) as they are
    e = _expf_normal(np.float32(2.0) * min(a, np.float32(9.1)))  # from |x| = 9.02 on, tanh rounds to 1
    big = np.float32(1.0) - np.float32(2.0) / (e + np.float32(1.0))
    big = -big if x < 0 else big  # a select: math.copysign would be a libm call, which does not vectorise
    r = small if a < np.float32(0.625) else big
    return x if x != x else r


@register_jitable
def sigmoid_f32(x):
    """1/(1+exp(-x)) of a float32 in float64, rounded once; 0 where float32's exp(-x) overflows (x at or
    below -88.72283935546875), as PyTorch and the reference compute it in float32."""
    r = np.float32(1.0 / (1.0 + _exp_d(-np.float64(x))))
    r = np.float32(0.0) if x <= np.float32(-88.72283935546875) else r  # a select: it vectorises
    return x if x != x else r


# Cephes ndtr.c (as the reference's erf): erf = x T(x^2)/U(x^2) for |x| < 1, 1 - exp(-x^2) P(|x|)/Q(|x|)
# above (Q and U monic); beyond |x| = 6 erf rounds to 1 even in float64.
@register_jitable(inline="always")
def _erf_d(x):
    a = abs(x)
    z = x * x
    t = 9.60497373987051638749e0
    t = t * z + 9.00260197203842689217e1
    t = t * z + 2.23200534594684319226e3
    t = t * z + 7.00332514112805075473e3
    t = t * z + 5.55923013010394962768e4
    u = z + 3.35617141647503099647e1
    u = u * z + 5.21357949780152679795e2
    u = u * z + 4.59432382970980127987e3
    u = u * z + 2.26290000613890934246e4
    u = u * z + 4.92673942608635921086e4
    b = min(a, 6.0)
    p = 2.46196981473530512524e-10
    p = p * b + 5.64189564831068821977e-1
    p = p * b + 7.46321056442269912687e0
    p = p * b + 4.86371970985681366614e1
    p = p * b + 1.96520832956077098242e2
    p = p * b + 5.26445194995477358631e2
    p = p * b + 9.34528527171957607540e2
    p = p * b + 1.02755188689515710272e3
    p = p * b + 5.57535335369399327526e2
    q = b + 1.32281951154744992508e1
    q = q * b + 8.67072140885989742329e1
    q = q * b + 3.54937778887819891062e2
    q = q * b + 9.75708501743205489753e2
    q = q * b + 1.82390916687909736289e3
    q = q * b + 2.24633760818710981792e3
    q = q * b + 1.65666309194161350182e3
    q = q * b + 5.57535340817727675546e2
    # one division for both branches (selects, then a vector divide: the divides dominated the cost)
    centre = a < 1.0
    e = _exp_d(-(b * b))  # computed for every lane: a call on one side of a select would be a branch
    r = (x * t if centre else e * p) / (u if centre else q)
    tail = 1.0 - r
    tail = -tail if x < 0.0 else tail
    return r if centre else tail


@register_jitable(inline="always")
def erf_f32(x):
    """erf of a float32: Cephes' rational approximations in float64, rounded once."""
    r = np.float32(_erf_d(np.float64(x)))
    return x if x != x else r
