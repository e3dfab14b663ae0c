"""The error function family and the normal distribution: ``erf``, ``erfc``, ``erfinv``, ``erfcx``,
``ndtr``, ``ndtri``, ``log_ndtr``, and their NumPy implementations.

NumPy has no ``erf``: ``erf``/``erfc`` use the rational approximations of the Cephes library in float64
(within 3 and 10 ulp of C's), and ``erfinv`` refines an initial approximation with Halley/Newton steps
on them (within a few ulp of PyTorch's). ``erfcx(x) = exp(x²) erfc(x)`` is ``erfc``'s rational function
without its ``exp(-x²)`` factor from 1 on (an asymptotic series from 50 on), ``ndtri`` Cephes' rational
approximations in ``y - 1/2`` and in ``sqrt(-2 log y)``; ``ndtr`` and ``log_ndtr`` are written with
``erf``, ``erfc`` and ``erfcx`` as PyTorch writes them.
"""

from __future__ import annotations

import math

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op, with_out
from kiln._ops._meta import is_scalar
from kiln._ops.elementwise import (
    _compute_np,
    _in_float,
    _unary,
    exp,
    log,
    unary_meta,
    where,
)
from kiln._ops.math_args import _not_implemented
from kiln._ops.unary_math import _f64, log1p
from kiln._tensor import Tensor

__all__ = [
    "erf_np",
    "erfc_np",
    "erfinv_np",
    "erfcx_np",
    "ndtri_np",
    "erf",
    "erfc",
    "erfinv",
    "erfcx",
    "ndtr",
    "ndtri",
    "log_ndtr",
]

TOP_LEVEL = (
    "erf",
    "erfc",
    "erfinv",
)
"""The names ``kiln`` exports at its top level (as ``torch`` does; the others live in :mod:`kiln.special`)."""

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


# ---------------------------------------------------------------------------------------- shared helpers


def _floats(text: str) -> tuple[float, ...]:
    """A coefficient table written as whitespace-separated numbers (leading coefficient first)."""
    return tuple(float(v) for v in text.split())


def _f64_operand(x, spec) -> np.ndarray:
    """An operand converted to the result dtype first (PyTorch converts every operand to the common dtype:
    a Python float meeting a float32 tensor is rounded to float32), then to float64 for the computation."""
    d = spec.dtype.numpy
    if isinstance(x, np.ndarray):
        return (x if x.dtype == d else x.astype(d)).astype(np.float64)
    return np.asarray(np.asarray(x, dtype=d), dtype=np.float64)


def _unary_meta(name: str, half: bool, public: str):
    """``unary_meta`` (integer and bool inputs give the default float dtype; messages name the function
    ``public``), refusing float16 and bfloat16 with PyTorch's message when its CPU kernel (``<name>_cpu``)
    has no half-precision version (``half=False``)."""
    base = unary_meta(public)

    def meta(input):
        spec = base(input)
        if not half and spec.dtype in (dt.float16, dt.bfloat16):
            raise _not_implemented(f"{name}_cpu", spec.dtype)
        return spec

    return meta


def float_unary(
    name: str,
    np_fn,
    backward,
    doc: str,
    *,
    half: bool = True,
    inplace: bool = False,
    methods: tuple[str, ...] = (),
    decompose=None,
    grad_fn_name: str | None = None,
    special: bool = True,
    with_compute: bool = False,
):
    """A unary op computed in float64 by ``np_fn`` and rounded to the result dtype (see :func:`_unary_meta`;
    ``special``: PyTorch has it in ``torch.special`` only, and its messages say ``special_<name>``). ``with_compute``: ``np_fn``
    also takes the NumPy dtype PyTorch computes in (float32 for float32 and the half types), for the steps
    whose rounding or overflow in that precision shows in PyTorch's results."""

    def reference(spec, a):
        x = _f64_operand(a, spec)
        return np_fn(x, _compute_np(spec.dtype)) if with_compute else np_fn(x)

    @op(
        tags=("pointwise",),
        inplace=inplace,
        meta=_unary_meta(name, half, f"special_{name}" if special else name),
        reference=reference,
        backward=backward,
        name=name,
        doc=doc,
        methods=methods,
        decompose=decompose,
        grad_fn_name=grad_fn_name,
    )
    def unary(input: Tensor) -> Tensor:
        pass

    return unary


def _exp_square(x: np.ndarray) -> np.ndarray:
    """``exp(x*x)`` without the rounding error of ``x*x`` (see :func:`_exp_neg_square`)."""
    m = np.round(x * 128.0) / 128.0
    f = x - m
    return np.exp(m * m) * np.exp(2.0 * m * f + f * f)


# ---------------------------------------------------------------------------------------- erfcx, ndtri


def _erfcx_positive(x: np.ndarray) -> np.ndarray:
    """``exp(x²) erfc(x)`` for ``x >= 0`` (1-d): ``erfc``'s rational functions without their ``exp(-x²)``
    from 1 on, six terms of the asymptotic series from 50 on."""
    out = np.empty_like(x)
    low = x < 1.0
    out[low] = _exp_square(x[low]) * erfc_np(x[low])
    mid = (x >= 1.0) & (x < 8.0)
    out[mid] = _poly(x[mid], _ERFC_P) / _poly(x[mid], _ERFC_Q)
    high = (x >= 8.0) & (x < 50.0)
    out[high] = _poly(x[high], _ERFC_R) / _poly(x[high], _ERFC_S)
    tail = x >= 50.0  # 1/(x√π) Σ (-1)^n (2n-1)!! / (2x²)^n
    xt = x[tail]
    z = 0.5 / (xt * xt)
    out[tail] = _poly(z, (10395.0, -945.0, 105.0, -15.0, 3.0, -1.0, 1.0)) / (xt * math.sqrt(math.pi))
    return out


def erfcx_np(a, compute: np.dtype = np.dtype(np.float64)) -> np.ndarray:
    """The scaled complementary error function ``exp(x²) erfc(x)`` of a float64 array: ``2 exp(x²) -
    erfcx(-x)`` below 0, ``inf`` below -26.7, where ``exp(x²)`` overflows (``compute``: for float32 the
    ``x²`` of that formula is rounded to float32, as PyTorch's kernel rounds it)."""
    x = np.asarray(a, dtype=np.float64)
    flat = x.reshape(-1)
    out = np.full_like(flat, np.nan)
    pos = flat >= 0.0
    out[pos] = _erfcx_positive(flat[pos])
    out[flat < -26.7] = np.inf
    neg = (flat < 0.0) & (flat >= -26.7)
    xn = flat[neg]
    if compute == np.float64:
        out[neg] = 2.0 * _exp_square(xn) - _erfcx_positive(-xn)
    else:
        square = np.square(xn.astype(compute)).astype(np.float64)
        with np.errstate(over="ignore"):
            out[neg] = 2.0 * np.exp(square) - _erfcx_positive(-xn)
    return out.reshape(x.shape)


# Cephes ndtri: x = y + y³ P0(y²) / Q0(y²) (times sqrt(2π)) for |y - 1/2| <= 1/2 - exp(-2); in the tails
# x = t - log(t)/t - P(1/t) / (t Q(1/t)) with t = sqrt(-2 log y) (P1/Q1 below t = 8, P2/Q2 above)
_NDTRI_P0 = (
    -5.99633501014107895267e1,
    9.80010754185999661536e1,
    -5.66762857469070293439e1,
    1.39312609387279679503e1,
    -1.23916583867381258016e0,
)
_NDTRI_Q0 = (
    1.0,
    1.95448858338141759834e0,
    4.67627912898881538453e0,
    8.63602421390890590575e1,
    -2.25462687854119370527e2,
    2.00260212380060660359e2,
    -8.20372256168333339912e1,
    1.59056225126211695515e1,
    -1.18331621121330003142e0,
)
_NDTRI_P1 = (
    4.05544892305962419923e0,
    3.15251094599893866154e1,
    5.71628192246421288162e1,
    4.40805073893200834700e1,
    1.46849561928858024014e1,
    2.18663306850790267539e0,
    -1.40256079171354495875e-1,
    -3.50424626827848203418e-2,
    -8.57456785154685413611e-4,
)
_NDTRI_Q1 = (
    1.0,
    1.57799883256466749731e1,
    4.53907635128879210584e1,
    4.13172038254672030440e1,
    1.50425385692907503408e1,
    2.50464946208309415979e0,
    -1.42182922854787788574e-1,
    -3.80806407691578277194e-2,
    -9.33259480895457427372e-4,
)
_NDTRI_P2 = (
    3.23774891776946035970e0,
    6.91522889068984211695e0,
    3.93881025292474443415e0,
    1.33303460815807542389e0,
    2.01485389549179081538e-1,
    1.23716634817820021358e-2,
    3.01581553508235416007e-4,
    2.65806974686737550832e-6,
    6.23974539184983293730e-9,
)
_NDTRI_Q2 = (
    1.0,
    6.02427039364742014255e0,
    3.67983563856160859403e0,
    1.37702099489081330271e0,
    2.16236993594496635890e-1,
    1.34204006088543189037e-2,
    3.28014464682127739104e-4,
    2.89247864745380683936e-6,
    6.79019408009981274425e-9,
)
_EXP_M2 = math.exp(-2.0)
_SQRT_2PI = math.sqrt(2.0 * math.pi)


def ndtri_np(a) -> np.ndarray:
    """The quantile function of the standard normal distribution of a float64 array (``-inf`` at 0,
    ``inf`` at 1, NaN outside ``[0, 1]``)."""
    y0 = np.asarray(a, dtype=np.float64)
    flat = y0.reshape(-1)
    out = np.full_like(flat, np.nan)
    out[flat == 0.0] = -np.inf
    out[flat == 1.0] = np.inf
    inside = (flat > 0.0) & (flat < 1.0)
    upper = inside & (flat > 1.0 - _EXP_M2)
    y = np.where(upper, 1.0 - flat, flat)
    centre = inside & (y > _EXP_M2)
    yc = y[centre] - 0.5
    y2 = yc * yc
    out[centre] = (yc + yc * (y2 * _poly(y2, _NDTRI_P0) / _poly(y2, _NDTRI_Q0))) * _SQRT_2PI
    tails = inside & ~centre
    t = np.sqrt(-2.0 * np.log(y[tails]))
    z = 1.0 / t
    near = t < 8.0
    correction = np.where(
        near,
        z * _poly(z, _NDTRI_P1) / _poly(z, _NDTRI_Q1),
        z * _poly(z, _NDTRI_P2) / _poly(z, _NDTRI_Q2),
    )
    value = t - np.log(t) / t - correction
    out[tails] = np.where(upper[tails], value, -value)
    return out.reshape(y0.shape)


_SQRT1_2 = math.sqrt(0.5)

erfcx = float_unary(
    "erfcx",
    erfcx_np,
    lambda grad, input, result: grad * (2.0 * input * result - _TWO_OVER_SQRT_PI),
    "The scaled complementary error function ``exp(input²) erfc(input)`` elementwise, accurate where "
    "``erfc`` underflows.",
    half=False,
    grad_fn_name="SpecialErfcxBackward0",
    with_compute=True,
)
ndtri = float_unary(
    "ndtri",
    ndtri_np,
    lambda grad, result: grad * _SQRT_2PI * exp(result * result * 0.5),
    "The inverse of the standard normal distribution function (its quantile function) elementwise.",
    half=False,
    grad_fn_name="SpecialNdtriBackward0",
)


@with_out
def ndtr(input: Tensor) -> Tensor:
    """The standard normal distribution function ``(1 + erf(input / sqrt(2))) / 2`` elementwise, formed as
    PyTorch forms it (so it loses its relative accuracy far in the lower tail: use :func:`log_ndtr` there)."""
    if not isinstance(input, Tensor):
        raise TypeError(f"special_ndtr(): argument 'input' (position 1) must be Tensor, not {type(input).__name__}")
    x = input if input._dtype.is_floating_point else input.to(dt.get_default_dtype())
    return (erf(x * _SQRT1_2) + 1.0) * 0.5


def _log_ndtr_np(x: np.ndarray) -> np.ndarray:
    t = x * _SQRT1_2
    out = np.empty_like(x)
    low = x < -1.0
    tl = t[low]
    out[low] = np.log(erfcx_np(-tl) * 0.5) - tl * tl
    out[~low] = np.log1p(erfc_np(t[~low]) * -0.5)
    return out


def _log_ndtr_decomposed(input):
    """``log_ndtr`` in kiln ops: ``log(erfcx(-t) / 2) - t²`` below -1, else ``log1p(-erfc(t) / 2)``, with
    ``t = input / sqrt(2)`` (PyTorch's formula)."""
    x, d = _in_float(input)
    t = x * _SQRT1_2
    low = log(erfcx(-t) * 0.5) - t * t
    return where(x < -1.0, low, log1p(erfc(t) * -0.5)).to(d)


log_ndtr = float_unary(
    "log_ndtr",
    _log_ndtr_np,
    lambda grad, input, result: grad / _SQRT_2PI * exp(-(result + input * input * 0.5)),
    "The logarithm of the standard normal distribution function elementwise, accurate in both tails.",
    half=False,
    decompose=_log_ndtr_decomposed,
    grad_fn_name="SpecialLogNdtrBackward0",
)


def _pair_type_error(name: str, a, b, params: tuple[str, str] = ("input", "other"), first: str = "self") -> TypeError:
    """PyTorch's error for a binary special function called without a tensor (or with a non-number): it
    lists the overloads, ``first`` naming the number of the scalar-first one."""

    def kind(v) -> str:
        return "Tensor" if isinstance(v, Tensor) else type(v).__name__

    p, q = params
    return TypeError(
        f"{name}() received an invalid combination of arguments - got ({kind(a)}, {kind(b)}), but expected one "
        f"of:\n * (Tensor {p}, Tensor {q}, *, Tensor out = None)\n * (Number {first}, Tensor {q}, *, Tensor out = "
        f"None)\n * (Tensor {p}, Number {q}, *, Tensor out = None)\n"
    )


def _check_pair(name: str, a, b, params: tuple[str, str] = ("input", "other"), first: str = "self") -> None:
    """Tensor/Tensor, Number/Tensor or Tensor/Number, as PyTorch's overloads of a binary special function."""
    a_tensor, b_tensor = isinstance(a, Tensor), isinstance(b, Tensor)
    if not ((a_tensor or is_scalar(a)) and (b_tensor or is_scalar(b)) and (a_tensor or b_tensor)):
        raise _pair_type_error(name, a, b, params, first)


def _backward_name(stem: str):
    """PyTorch's autograd node names of a binary function's overloads: 0 for two tensors, 1 with a number
    first, 2 with a number second."""
    return lambda args: (
        f"{stem}1"
        if not isinstance(args[0], Tensor)
        else (f"{stem}2" if not isinstance(args[1], Tensor) else f"{stem}0")
    )
