"""``kiln.special``: PyTorch's ``torch.special``, the special functions of mathematical physics and
statistics, elementwise on tensors.

The error and gamma function families, Bessel, Airy and Hurwitz zeta functions, the classical orthogonal
polynomials, the normal distribution's functions and entropy terms, each with PyTorch's signature, dtype
rules (integer inputs compute in the default float dtype), special values and gradients. Several are the
very functions ``kiln`` exports at its top level under their ``torch`` names (``gammaln`` is
:func:`kiln.lgamma`, ``expit`` is :func:`kiln.sigmoid`, ``multigammaln`` is :func:`kiln.mvlgamma`,
``gammainc`` is :func:`kiln.igamma` ...).

NumPy has none of these functions: kiln computes them in float64 from the classical series, rational and
asymptotic approximations (Cephes' coefficients where PyTorch uses them too) and rounds once to the
result dtype. Where PyTorch's own kernels are less accurate kiln's values differ from theirs: its float64
Bessel ``J``/``Y`` near ``x = 5`` and ``airy_ai`` near ``x = -2.1`` (errors up to 1e-6 and 3e-6), its
float32 orthogonal polynomials of high degree, and its incomplete gamma functions for ``a`` beyond 10^7.
"""

from __future__ import annotations

import sys as _sys

from kiln._names import name_bound_functions as _name_bound_functions
from kiln._ops.bessel import (
    i0,
    i0e,
    i1,
    i1e,
    modified_bessel_i0,
    modified_bessel_i1,
    modified_bessel_k0,
    modified_bessel_k1,
    scaled_modified_bessel_k0,
    scaled_modified_bessel_k1,
)
from kiln._ops.bessel_j import airy_ai, bessel_j0, bessel_j1, bessel_y0, bessel_y1, spherical_bessel_j0
from kiln._ops.elementwise import sigmoid as expit
from kiln._ops.gamma import digamma, polygamma, zeta
from kiln._ops.gamma import digamma as psi
from kiln._ops.gamma import lgamma as gammaln
from kiln._ops.gamma import mvlgamma as multigammaln
from kiln._ops.igamma import igamma as gammainc
from kiln._ops.igamma import igammac as gammaincc
from kiln._ops.orthopoly import (
    chebyshev_polynomial_t,
    chebyshev_polynomial_u,
    chebyshev_polynomial_v,
    chebyshev_polynomial_w,
    hermite_polynomial_h,
    hermite_polynomial_he,
    laguerre_polynomial_l,
    legendre_polynomial_p,
    shifted_chebyshev_polynomial_t,
    shifted_chebyshev_polynomial_u,
    shifted_chebyshev_polynomial_v,
    shifted_chebyshev_polynomial_w,
)
from kiln._ops.scans import logsumexp
from kiln._ops.softmax import _tensor_log_softmax, _tensor_softmax
from kiln._ops.special import erf, erfc, erfcx, erfinv, log_ndtr, ndtr, ndtri
from kiln._ops.special_basic import entr, sinc, xlog1py, xlogy
from kiln._ops.unary_math import exp2, expm1, log1p, logit, round  # noqa: A004 - torch.special.round
from kiln._tensor import Tensor

__all__ = [
    "airy_ai",
    "bessel_j0",
    "bessel_j1",
    "bessel_y0",
    "bessel_y1",
    "chebyshev_polynomial_t",
    "chebyshev_polynomial_u",
    "chebyshev_polynomial_v",
    "chebyshev_polynomial_w",
    "digamma",
    "entr",
    "erf",
    "erfc",
    "erfcx",
    "erfinv",
    "exp2",
    "expit",
    "expm1",
    "gammainc",
    "gammaincc",
    "gammaln",
    "hermite_polynomial_h",
    "hermite_polynomial_he",
    "i0",
    "i0e",
    "i1",
    "i1e",
    "laguerre_polynomial_l",
    "legendre_polynomial_p",
    "log1p",
    "log_ndtr",
    "log_softmax",
    "logit",
    "logsumexp",
    "modified_bessel_i0",
    "modified_bessel_i1",
    "modified_bessel_k0",
    "modified_bessel_k1",
    "multigammaln",
    "ndtr",
    "ndtri",
    "polygamma",
    "psi",
    "round",
    "scaled_modified_bessel_k0",
    "scaled_modified_bessel_k1",
    "shifted_chebyshev_polynomial_t",
    "shifted_chebyshev_polynomial_u",
    "shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_polynomial_w",
    "sinc",
    "softmax",
    "spherical_bessel_j0",
    "xlog1py",
    "xlogy",
    "zeta",
]


def softmax(input: Tensor, dim: int, dtype=None) -> Tensor:
    """Softmax along ``dim``: ``exp(input)`` normalised to sum to 1 (``input`` cast to ``dtype`` first when
    given), as :func:`kiln.softmax`."""
    return _tensor_softmax(input, dim, dtype)


def log_softmax(input: Tensor, dim: int, dtype=None) -> Tensor:
    """The logarithm of :func:`softmax` along ``dim``, computed stably (``input`` cast to ``dtype`` first
    when given), as :func:`kiln.log_softmax`."""
    return _tensor_log_softmax(input, dim, dtype)


_name_bound_functions(_sys.modules[__name__])  # each function here pickles by reference (kiln._names)
