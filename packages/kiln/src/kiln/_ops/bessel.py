"""Modified Bessel functions: ``i0``, ``i1`` and their exponentially scaled forms ``i0e``, ``i1e`` (PyTorch's
``torch.i0`` and ``torch.special``'s), ``modified_bessel_i0``/``i1``/``k0``/``k1`` and
``scaled_modified_bessel_k0``/``k1``.

Each is a Chebyshev expansion from the Cephes library (Clenshaw's recurrence on its coefficients), on
``[0, 8]`` and ``[8, inf)`` for ``I`` and on ``(0, 2]`` and ``(2, inf)`` for ``K``, in float64, rounded once.
The exponential factor is computed in the precision PyTorch computes in: for float32 ``exp(x)`` overflows
past 88.7, so ``i0`` is ``inf`` there as in PyTorch although the function itself overflows only past 91.9.
PyTorch's domain: ``i0(±inf)`` is NaN (``inf / inf`` in the formula), ``K`` is ``inf`` at 0 and NaN for
negative arguments.
"""

from __future__ import annotations

import numpy as np

from kiln._ops.elementwise import _in_float, where
from kiln._ops.special import _floats, float_unary
from kiln._ops.unary_math import sgn
from kiln._tensor import Tensor

__all__ = [
    "i0_np",
    "i0e_np",
    "i1_np",
    "i1e_np",
    "k0_np",
    "k0e_np",
    "k1_np",
    "k1e_np",
    "i0",
    "i0e",
    "i1",
    "i1e",
    "modified_bessel_i0",
    "modified_bessel_i1",
    "modified_bessel_k0",
    "modified_bessel_k1",
    "scaled_modified_bessel_k0",
    "scaled_modified_bessel_k1",
]

TOP_LEVEL = ("i0",)
"""The names ``kiln`` exports at its top level (as ``torch`` does; the others live in :mod:`kiln.special`)."""


def chbevl(x: np.ndarray, coefs: tuple[float, ...]) -> np.ndarray:
    """The Chebyshev series ``Σ' c_k T_k(x / 2)`` (Cephes' convention: coefficients in reverse order, the
    last one halved) by Clenshaw's recurrence."""
    b0 = np.full_like(x, coefs[0])
    b1 = np.zeros_like(x)
    b2 = b1
    for c in coefs[1:]:
        b2 = b1
        b1 = b0
        b0 = x * b1 - b2 + c
    return 0.5 * (b0 - b2)


# Cephes i0.c, i1.c, k0.c, k1.c: A on the inner interval, B on the outer one
_I0_A = _floats(
    """
    -4.4153416464793395e-18 3.3307945188222384e-17 -2.431279846547955e-16 1.715391285555133e-15
    -1.1685332877993451e-14 7.676185498604936e-14 -4.856446783111929e-13 2.95505266312964e-12
    -1.726826291441556e-11 9.675809035373237e-11 -5.189795601635263e-10 2.6598237246823866e-09
    -1.300025009986248e-08 6.046995022541919e-08 -2.670793853940612e-07 1.1173875391201037e-06
    -4.4167383584587505e-06 1.6448448070728896e-05 -5.754195010082104e-05 0.00018850288509584165
    -0.0005763755745385824 0.0016394756169413357 -0.004324309995050576 0.010546460394594998
    -0.02373741480589947 0.04930528423967071 -0.09490109704804764 0.17162090152220877
    -0.3046826723431984 0.6767952744094761
    """
)
_I0_B = _floats(
    """
    -7.233180487874754e-18 -4.830504485944182e-18 4.46562142029676e-17 3.461222867697461e-17
    -2.8276239805165836e-16 -3.425485619677219e-16 1.7725601330565263e-15 3.8116806693526224e-15
    -9.554846698828307e-15 -4.150569347287222e-14 1.54008621752141e-14 3.8527783827421426e-13
    7.180124451383666e-13 -1.7941785315068062e-12 -1.3215811840447713e-11 -3.1499165279632416e-11
    1.1889147107846439e-11 4.94060238822497e-10 3.3962320257083865e-09 2.266668990498178e-08
    2.0489185894690638e-07 2.8913705208347567e-06 6.889758346916825e-05 0.0033691164782556943
    0.8044904110141088
    """
)
_I1_A = _floats(
    """
    2.7779141127610464e-18 -2.111421214358166e-17 1.5536319577362005e-16 -1.1055969477353862e-15
    7.600684294735408e-15 -5.042185504727912e-14 3.223793365945575e-13 -1.9839743977649436e-12
    1.1736186298890901e-11 -6.663489723502027e-11 3.625590281552117e-10 -1.8872497517228294e-09
    9.381537386495773e-09 -4.445059128796328e-08 2.0032947535521353e-07 -8.568720264695455e-07
    3.4702513081376785e-06 -1.3273163656039436e-05 4.781565107550054e-05 -0.00016176081582589674
    0.0005122859561685758 -0.0015135724506312532 0.004156422944312888 -0.010564084894626197
    0.024726449030626516 -0.05294598120809499 0.1026436586898471 -0.17641651835783406
    0.25258718644363365
    """
)
_I1_B = _floats(
    """
    7.517296310842105e-18 4.414348323071708e-18 -4.6503053684893586e-17 -3.209525921993424e-17
    2.96262899764595e-16 3.3082023109209285e-16 -1.8803547755107825e-15 -3.8144030724370075e-15
    1.0420276984128802e-14 4.272440016711951e-14 -2.1015418427726643e-14 -4.0835511110921974e-13
    -7.198551776245908e-13 2.0356285441470896e-12 1.4125807436613782e-11 3.2526035830154884e-11
    -1.8974958123505413e-11 -5.589743462196584e-10 -3.835380385964237e-09 -2.6314688468895196e-08
    -2.512236237870209e-07 -3.882564808877691e-06 -0.00011058893876262371 -0.009761097491361469
    0.7785762350182801
    """
)
_K0_A = _floats(
    """
    1.374465435613523e-16 4.25981614279661e-14 1.0349695257633842e-11 1.904516377220209e-09
    2.5347910790261494e-07 2.286212103119452e-05 0.001264615411446926 0.0359799365153615
    0.3442898999246285 -0.5353273932339028
    """
)
_K0_B = _floats(
    """
    5.300433772686263e-18 -1.6475804301524212e-17 5.2103915050390274e-17 -1.678231096805412e-16
    5.512055978524319e-16 -1.848593377343779e-15 6.3400764774050706e-15 -2.2275133269916698e-14
    8.032890775363575e-14 -2.9800969231727303e-13 1.140340588208475e-12 -4.514597883373944e-12
    1.8559491149547177e-11 -7.957489244477107e-11 3.577397281400301e-10 -1.69753450938906e-09
    8.574034017414225e-09 -4.660489897687948e-08 2.766813639445015e-07 -1.8317555227191195e-06
    1.39498137188765e-05 -0.00012849549581627802 0.0015698838857300533 -0.0314481013119645
    2.4403030820659555
    """
)
_K1_A = _floats(
    """
    -7.023863479386288e-18 -2.427449850519366e-15 -6.666901694199329e-13 -1.4114883926335278e-10
    -2.213387630734726e-08 -2.4334061415659684e-06 -0.0001730288957513052 -0.006975723859639864
    -0.12261118082265715 -0.3531559607765449 1.5253002273389478
    """
)
_K1_B = _floats(
    """
    -5.756744483665017e-18 1.7940508731475592e-17 -5.689462558442859e-17 1.838093544366639e-16
    -6.057047248373319e-16 2.038703165624334e-15 -7.019837090418314e-15 2.4771544244813043e-14
    -8.976705182324994e-14 3.3484196660784293e-13 -1.2891739609510289e-12 5.13963967348173e-12
    -2.1299678384275683e-11 9.218315187605006e-11 -4.1903547593418965e-10 2.015049755197033e-09
    -1.0345762465678097e-08 5.7410841254500495e-08 -3.5019606030878126e-07 2.406484947837217e-06
    -1.936197974166083e-05 0.00019521551847135162 -0.002857816859622779 0.10392373657681724
    2.7206261904844427
    """
)


def _exp(x: np.ndarray, compute: np.dtype) -> np.ndarray:
    """``exp(x)`` rounded (and overflowing) in ``compute``, as PyTorch's kernels form it."""
    if compute == np.float64:
        return np.exp(x)
    return np.exp(x.astype(compute)).astype(np.float64)


def _scaled_i(z: np.ndarray, inner, outer, odd: bool) -> np.ndarray:
    """``exp(-z) I_n(z)`` for ``z = |x|`` (``n = 1`` when ``odd``)."""
    out = np.empty_like(z)
    low = z <= 8.0
    zl = z[low]
    out[low] = chbevl(zl / 2.0 - 2.0, inner) * (zl if odd else 1.0)
    high = ~low
    zh = z[high]
    with np.errstate(divide="ignore", invalid="ignore"):
        out[high] = chbevl(32.0 / zh - 2.0, outer) / np.sqrt(zh)
    return out


def i0e_np(x: np.ndarray) -> np.ndarray:
    """``exp(-|x|) I_0(x)`` of a float64 array."""
    return _scaled_i(np.abs(x), _I0_A, _I0_B, odd=False)


def i1e_np(x: np.ndarray) -> np.ndarray:
    """``exp(-|x|) I_1(x)`` of a float64 array (odd in ``x``)."""
    y = _scaled_i(np.abs(x), _I1_A, _I1_B, odd=True)
    return np.where(x < 0, -y, y)


def i0_np(x: np.ndarray, compute: np.dtype = np.dtype(np.float64)) -> np.ndarray:
    """The modified Bessel function of the first kind of order 0 of a float64 array."""
    z = np.abs(x)
    with np.errstate(over="ignore", invalid="ignore"):
        return _exp(z, compute) * i0e_np(z)


def i1_np(x: np.ndarray, compute: np.dtype = np.dtype(np.float64)) -> np.ndarray:
    """The modified Bessel function of the first kind of order 1 of a float64 array."""
    z = np.abs(x)
    with np.errstate(over="ignore", invalid="ignore"):
        y = _exp(z, compute) * _scaled_i(z, _I1_A, _I1_B, odd=True)
    return np.where(x < 0, -y, y)


def _k(x: np.ndarray, order: int, scaled: bool) -> np.ndarray:
    """``K_order(x)`` (times ``exp(x)`` when ``scaled``): ``inf`` at 0, NaN below."""
    out = np.full_like(x, np.nan)
    out[x == 0] = np.inf
    low = (x > 0) & (x <= 2.0)
    xl = x[low]
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        if order == 0:
            v = chbevl(xl * xl - 2.0, _K0_A) - np.log(0.5 * xl) * i0_np(xl)
        else:
            v = np.log(0.5 * xl) * i1_np(xl) + chbevl(xl * xl - 2.0, _K1_A) / xl
        out[low] = v * np.exp(xl) if scaled else v
        high = x > 2.0
        xh = x[high]
        v = chbevl(8.0 / xh - 2.0, _K1_B if order else _K0_B) / np.sqrt(xh)
        out[high] = v if scaled else np.exp(-xh) * v
    return out


def k0_np(x: np.ndarray) -> np.ndarray:
    """The modified Bessel function of the second kind of order 0 of a float64 array."""
    return _k(x, 0, scaled=False)


def k1_np(x: np.ndarray) -> np.ndarray:
    """The modified Bessel function of the second kind of order 1 of a float64 array."""
    return _k(x, 1, scaled=False)


def k0e_np(x: np.ndarray) -> np.ndarray:
    """``exp(x) K_0(x)`` of a float64 array."""
    return _k(x, 0, scaled=True)


def k1e_np(x: np.ndarray) -> np.ndarray:
    """``exp(x) K_1(x)`` of a float64 array."""
    return _k(x, 1, scaled=True)


# ---------------------------------------------------------------------------------------- ops


def _tiny_safe(input: Tensor):
    """``(|x| > eps, x with those elements replaced by eps)``: the derivatives of ``I_1`` divide by ``x``
    and are ``1/2`` at 0 (PyTorch's rule, and a finite double backward)."""
    eps = float(np.finfo(_in_float(input)[1].numpy).eps) if input._dtype.is_floating_point else 1.2e-7
    big = input.abs() > eps
    return big, where(big, input, eps)


def _i1_backward(grad, input, result):
    big, x = _tiny_safe(input)
    return grad * where(big, i0(x) - result / x, 0.5)


def _i1e_backward(grad, input, result):
    big, x = _tiny_safe(input)
    return grad * where(big, i0e(x) - result * (sgn(x) + 1.0 / x), 0.5)


i0 = float_unary(
    "i0",
    i0_np,
    lambda grad, input: grad * i1(input),
    "The modified Bessel function of the first kind of order 0, elementwise.",
    inplace=True,
    special=False,
    methods=("i0",),
    with_compute=True,
)
i0e = float_unary(
    "i0e",
    i0e_np,
    lambda grad, input, result: grad * (i1e(input) - sgn(input) * result),
    "The exponentially scaled modified Bessel function of order 0, ``exp(-|input|) i0(input)``, elementwise.",
    grad_fn_name="SpecialI0EBackward0",
)
i1 = float_unary(
    "i1",
    i1_np,
    _i1_backward,
    "The modified Bessel function of the first kind of order 1, elementwise.",
    grad_fn_name="SpecialI1Backward0",
    with_compute=True,
)
i1e = float_unary(
    "i1e",
    i1e_np,
    _i1e_backward,
    "The exponentially scaled modified Bessel function of order 1, ``exp(-|input|) i1(input)``, elementwise.",
    grad_fn_name="SpecialI1EBackward0",
)


def _in_result_dtype(fn):
    def decomposed(input):
        """The op as the matching ``i0``/``i1`` op (the same function), in the result dtype."""
        x, d = _in_float(input)
        return fn(x).to(d)

    return decomposed


modified_bessel_i0 = float_unary(
    "modified_bessel_i0",
    i0_np,
    None,
    "The modified Bessel function of the first kind of order 0, elementwise (:func:`i0` without its gradient "
    "and half-precision kernels, as in PyTorch).",
    half=False,
    decompose=_in_result_dtype(i0),
    with_compute=True,
)
modified_bessel_i1 = float_unary(
    "modified_bessel_i1",
    i1_np,
    None,
    "The modified Bessel function of the first kind of order 1, elementwise (:func:`i1` without its gradient "
    "and half-precision kernels, as in PyTorch).",
    half=False,
    decompose=_in_result_dtype(i1),
    with_compute=True,
)
modified_bessel_k0 = float_unary(
    "modified_bessel_k0",
    k0_np,
    None,
    "The modified Bessel function of the second kind of order 0, elementwise (``inf`` at 0, NaN below).",
    half=False,
)
modified_bessel_k1 = float_unary(
    "modified_bessel_k1",
    k1_np,
    None,
    "The modified Bessel function of the second kind of order 1, elementwise (``inf`` at 0, NaN below).",
    half=False,
)


scaled_modified_bessel_k0 = float_unary(
    "scaled_modified_bessel_k0",
    k0e_np,
    None,
    "The exponentially scaled modified Bessel function of the second kind of order 0, ``exp(input) k0(input)``, "
    "elementwise.",
    half=False,
)
scaled_modified_bessel_k1 = float_unary(
    "scaled_modified_bessel_k1",
    k1e_np,
    None,
    "The exponentially scaled modified Bessel function of the second kind of order 1, ``exp(input) k1(input)``, "
    "elementwise.",
    half=False,
)
