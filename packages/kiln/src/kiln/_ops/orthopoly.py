"""The classical orthogonal polynomials of ``torch.special``: Chebyshev ``T``, ``U``, ``V``, ``W`` (and their
shifted forms on ``[0, 1]``), Hermite ``H`` (physicists') and ``He`` (probabilists'), Laguerre ``L`` and
Legendre ``P``, each ``f(input, n)`` of a tensor (or number) ``input`` and a tensor (or number) degree ``n``.

Evaluated in float64 and rounded once to the result dtype (float32 or float64; half precision is refused
as by PyTorch's CPU kernels), by PyTorch's scheme: the three-term recurrence from the first two
polynomials, except that the Chebyshev polynomials of degree above 6 (``T``, the shifted ones) or 8
(``U``, ``V``, ``W``) on ``(-1, 1)`` use their trigonometric forms (``T_n(cos θ) = cos nθ`` ...), and the
exact values at ``x = ±1``. A non-integer degree is truncated; a negative, NaN or infinite one gives 0. A
recurrence value beyond the result dtype's range becomes ``inf``, as it would in that dtype, so that the
recurrence goes on to NaN as PyTorch's does.

Where kiln differs: PyTorch's float32 kernels run the recurrence in float32 and lose up to about 1e-5
(relative) by degree 30 to 50, while kiln's float32 results are the float64 ones rounded; and at a NaN
``input`` and degree 2 or more kiln returns NaN where PyTorch's ``U``, ``W``, Laguerre, Legendre and
shifted kernels return an uninitialised value.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import op
from kiln._ops.elementwise import _compute_np, binary_meta
from kiln._ops.math_args import Number, _not_implemented
from kiln._ops.special import _check_pair
from kiln._tensor import Tensor

__all__ = [
    "chebyshev_polynomial_t",
    "chebyshev_polynomial_u",
    "chebyshev_polynomial_v",
    "chebyshev_polynomial_w",
    "shifted_chebyshev_polynomial_t",
    "shifted_chebyshev_polynomial_u",
    "shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_polynomial_w",
    "hermite_polynomial_h",
    "hermite_polynomial_he",
    "laguerre_polynomial_l",
    "legendre_polynomial_p",
]


def _degrees(n: np.ndarray) -> np.ndarray:
    """The degree as int64, as a C cast of the (converted) degree gives it: truncated; NaN, infinite and
    out-of-range values become negative (and so give 0)."""
    if n.dtype.kind in "iub":
        return n.astype(np.int64)
    ok = np.isfinite(n) & (np.abs(n) < 2.0**63)
    return np.where(ok, np.trunc(np.where(ok, n, 0.0)), -1.0).astype(np.int64)


def _recurrence(x: np.ndarray, n: np.ndarray, first: np.ndarray, step: Callable, limit: float) -> np.ndarray:
    """``P_n(x)`` for ``n >= 2`` by ``P_(k+1) = step(k, x, P_(k-1), P_k)`` from ``P_0 = 1``, ``P_1 = first``,
    in float64; a value past ``limit`` (the result dtype's largest) becomes ``inf``, as it would in that
    dtype, so that the recurrence goes on to NaN as PyTorch's does. Elements leave at their own degree."""
    p = np.ones_like(x)
    q = first.copy()
    top = int(n.max(initial=1))
    live = np.arange(x.size)
    with np.errstate(all="ignore"):
        for k in range(1, top):
            live = live[n[live] > k]
            if not live.size:
                break
            r = step(float(k), x[live], p[live], q[live])
            p[live] = q[live]
            q[live] = np.where(np.abs(r) > limit, np.copysign(np.inf, r), r)
            if k % 64 == 0:  # NaN stays NaN: stop carrying the elements that overflowed
                live = live[~np.isnan(q[live])]
    return q


class _Poly:
    """One polynomial family: its first polynomial ``P_1(x)``, its recurrence step, the trigonometric
    form used above degree ``trig_from`` on ``(-1, 1)`` (``None``: none), the values at ``x = ±1``
    (``None``: no special case) and whether its argument is shifted (``x -> 2x - 1``)."""

    def __init__(self, first, step, *, trig=None, trig_from=6, at_one=None, at_zero=None, shifted=False):
        self.first, self.step, self.trig, self.trig_from = first, step, trig, trig_from
        self.at_one, self.at_zero, self.shifted = at_one, at_zero, shifted

    def __call__(self, x: np.ndarray, n: np.ndarray, limit: float) -> np.ndarray:
        """The polynomials of degrees ``n`` at ``x`` (1-d float64 arrays; ``limit``: see :func:`_recurrence`)."""
        if self.shifted:
            x = x + x - 1.0
        out = np.zeros(x.shape)  # negative degrees
        todo = n >= 0
        with np.errstate(all="ignore"):
            if self.at_zero is not None:  # Laguerre: L_n(0) = 1
                hit = todo & (x == 0)
                out[hit] = 1
                todo &= ~hit
            if self.at_one is not None:
                hit = todo & (np.abs(x) == 1)
                out[hit] = self.at_one(x[hit] > 0, n[hit])
                todo &= ~hit
            if self.trig is not None:
                hit = todo & (n > self.trig_from) & (np.abs(x) < 1)
                out[hit] = self.trig(x[hit], n[hit])
                todo &= ~hit
            zero = todo & (n == 0)
            out[zero] = 1
            one = todo & (n == 1)
            out[one] = self.first(x[one])
            rest = todo & (n >= 2)
            xr, nr = x[rest], n[rest]
            value = _recurrence(xr, nr, self.first(xr), self.step, limit)
            out[rest] = np.where(np.isnan(xr), np.nan, value)
        return out


def _chebyshev_step(k, x, p, q):
    return (x + x) * q - p


def _sign(n: np.ndarray) -> np.ndarray:
    return np.where(n % 2 == 0, 1, -1)


def _t_trig(x, n):
    return np.cos(n * np.arccos(x))


def _u_trig(x, n):
    theta = np.arccos(x)
    s = np.sin(theta)
    m = n + 1.0
    return np.where(s != 0, np.sin(m * theta) / s, m * np.cos(m * theta) * x)


def _v_trig(x, n):
    theta = np.arccos(x)
    half = theta / 2.0
    return np.where(np.sin(half) != 1, np.cos((n + 0.5) * theta) / np.cos(half), _sign(n) * (2 * n + 1))


def _w_trig(x, n):
    theta = np.arccos(x)
    half = theta / 2.0
    edge = np.where(x > 0, 2 * n + 1, _sign(n))
    return np.where(np.cos(half) != 1, np.sin((n + 0.5) * theta) / np.sin(half), edge)


_FAMILIES = {
    "chebyshev_polynomial_t": dict(
        first=lambda x: x,
        step=_chebyshev_step,
        trig=_t_trig,
        at_one=lambda pos, n: np.where(pos | (n % 2 == 0), 1, -1),
    ),
    "chebyshev_polynomial_u": dict(
        first=lambda x: x + x,
        step=_chebyshev_step,
        trig=_u_trig,
        trig_from=8,
        at_one=lambda pos, n: np.where(pos | (n % 2 == 0), n + 1, -(n + 1)),
    ),
    "chebyshev_polynomial_v": dict(
        first=lambda x: x + x - 1.0,
        step=_chebyshev_step,
        trig=_v_trig,
        trig_from=8,
        at_one=lambda pos, n: np.where(pos, 1, _sign(n) * (2 * n + 1)),
    ),
    "chebyshev_polynomial_w": dict(
        first=lambda x: x + x + 1.0,
        step=_chebyshev_step,
        trig=_w_trig,
        trig_from=8,
        at_one=lambda pos, n: np.where(pos, 2 * n + 1, _sign(n)),
    ),
    "hermite_polynomial_h": dict(first=lambda x: x + x, step=lambda k, x, p, q: (x + x) * q - (k + k) * p),
    "hermite_polynomial_he": dict(first=lambda x: x, step=lambda k, x, p, q: x * q - k * p),
    "laguerre_polynomial_l": dict(
        first=lambda x: 1.0 - x,
        step=lambda k, x, p, q: (((k + k) + (1 - x)) * q - k * p) / (k + 1),
        at_zero=True,
    ),
    "legendre_polynomial_p": dict(
        first=lambda x: x,
        step=lambda k, x, p, q: ((k + k + 1) * x * q - k * p) / (k + 1),
        at_one=lambda pos, n: np.where(pos | (n % 2 == 0), 1, -1),
    ),
}
for _kind in "tuvw":
    _FAMILIES[f"shifted_chebyshev_polynomial_{_kind}"] = dict(
        _FAMILIES[f"chebyshev_polynomial_{_kind}"], shifted=True, trig_from=6
    )

_DOCS = {
    "chebyshev_polynomial_t": "the Chebyshev polynomial of the first kind ``T_n``",
    "chebyshev_polynomial_u": "the Chebyshev polynomial of the second kind ``U_n``",
    "chebyshev_polynomial_v": "the Chebyshev polynomial of the third kind ``V_n``",
    "chebyshev_polynomial_w": "the Chebyshev polynomial of the fourth kind ``W_n``",
    "hermite_polynomial_h": "the physicists' Hermite polynomial ``H_n``",
    "hermite_polynomial_he": "the probabilists' Hermite polynomial ``He_n``",
    "laguerre_polynomial_l": "the Laguerre polynomial ``L_n``",
    "legendre_polynomial_p": "the Legendre polynomial ``P_n``",
}
for _kind in "tuvw":
    _DOCS[f"shifted_chebyshev_polynomial_{_kind}"] = (
        _DOCS[f"chebyshev_polynomial_{_kind}"] + " shifted to ``[0, 1]`` (of ``2 input - 1``)"
    )


def _meta(name: str):
    base = binary_meta(name, float_result=True)

    def meta(input, n):
        _check_pair(f"special_{name}", input, n, ("x", "n"), "x")
        spec = base(input, n)
        if spec.dtype in (dt.float16, dt.bfloat16):
            raise _not_implemented(f"{name}_cpu", spec.dtype)
        return spec

    return meta


def _reference(poly: _Poly):
    def ref(spec, input, n):
        c = _compute_np(spec.dtype)
        x = np.asarray(input, dtype=c).astype(np.float64)  # the operands in the result dtype first, as PyTorch
        degree = _degrees(np.asarray(n).astype(c))
        x, degree = np.broadcast_arrays(x, degree)
        return poly(x.reshape(-1), degree.reshape(-1), float(np.finfo(c).max)).reshape(x.shape)

    return ref


def _define(name: str):
    @op(
        tags=("pointwise",),
        meta=_meta(name),
        reference=_reference(_Poly(**_FAMILIES[name])),
        name=name,
        doc=f"{_DOCS[name][0].upper()}{_DOCS[name][1:]} of degree ``n`` at ``input``, elementwise, broadcasting "
        "(not differentiable).",
    )
    def polynomial(input: Tensor | Number, n: Tensor | Number) -> Tensor:
        pass

    return polynomial


chebyshev_polynomial_t = _define("chebyshev_polynomial_t")
chebyshev_polynomial_u = _define("chebyshev_polynomial_u")
chebyshev_polynomial_v = _define("chebyshev_polynomial_v")
chebyshev_polynomial_w = _define("chebyshev_polynomial_w")
shifted_chebyshev_polynomial_t = _define("shifted_chebyshev_polynomial_t")
shifted_chebyshev_polynomial_u = _define("shifted_chebyshev_polynomial_u")
shifted_chebyshev_polynomial_v = _define("shifted_chebyshev_polynomial_v")
shifted_chebyshev_polynomial_w = _define("shifted_chebyshev_polynomial_w")
hermite_polynomial_h = _define("hermite_polynomial_h")
hermite_polynomial_he = _define("hermite_polynomial_he")
laguerre_polynomial_l = _define("laguerre_polynomial_l")
legendre_polynomial_p = _define("legendre_polynomial_p")
