"""The Numba loops of kiln-cpu's fused optimizer updates (:mod:`kiln_cpu.optim`), compiled lazily.

One loop per algorithm, over ``[lo, hi)`` of flat, C-contiguous arrays of one dtype, every scalar of
that dtype too (so float32 parameters are updated in float32, as the reference does). Each element
goes through exactly the operations kiln.optim's update rule applies to whole tensors, in the same
order and with the same rounding: no ``fastmath``, no contraction into fused multiply-adds. The
options that change what is stored (momentum, AMSGrad) have loops of their own; the rest
(``maximize``, weight decay, Nesterov...) are run-time flags that select values, not branches, so the
loops vectorise and each compiles once per dtype.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.extending import register_jitable

from kiln_cpu._jit_support import _SERIAL, _u


@njit(**_SERIAL)
def sgd(p, g, maximize, l2, wd, neg_lr, lo, hi):
    """SGD without momentum on elements ``[lo, hi)``: ``g = -g`` (``maximize``); ``g + p * wd``
    (``l2``); ``p + g * neg_lr``."""
    for j in range(lo, hi):
        i = _u(j)  # unsigned: no negative-index wrap, so the loop vectorises
        gi = g[i]
        gi = -gi if maximize else gi
        pi = p[i]
        gi = gi + pi * wd if l2 else gi
        p[i] = pi + gi * neg_lr


@njit(**_SERIAL)
def sgd_momentum(p, g, buf, maximize, l2, wd, fresh, momentum, damp, nesterov, neg_lr, lo, hi):
    """SGD with momentum on elements ``[lo, hi)``: ``g`` as in :func:`sgd`; ``buf = g`` (``fresh``: a
    new buffer) or ``buf * momentum + g * damp``; ``p + (g + buf * momentum) * neg_lr`` (``nesterov``)
    or ``p + buf * neg_lr``."""
    for j in range(lo, hi):
        i = _u(j)  # unsigned: no negative-index wrap, so the loop vectorises
        gi = g[i]
        gi = -gi if maximize else gi
        pi = p[i]
        gi = gi + pi * wd if l2 else gi
        b = buf[i]  # read even when ``fresh`` (then ignored): a select, not a branch, keeps SIMD
        b = gi if fresh else b * momentum + gi * damp
        buf[i] = b
        gi = gi + b * momentum if nesterov else b
        p[i] = pi + gi * neg_lr


@register_jitable
def _adam_element(gi, pi, mi, vi, maximize, l2, decoupled, wd, decay, from_m, weight, beta2, one_minus_beta2):
    """One element's new ``(p, m, v)`` before the square root (see :func:`adam`)."""
    gi = -gi if maximize else gi
    pi = pi * decay if decoupled else pi
    gi = gi + pi * wd if l2 else gi
    mi = (mi if from_m else gi) + weight * (gi - mi)
    vi = vi * beta2 + (one_minus_beta2 * gi) * gi
    return pi, mi, vi


@njit(**_SERIAL)
def adam(
    p, g, m, v, maximize, l2, decoupled, wd, decay, from_m, weight, beta2, one_minus_beta2, bc2_sqrt, eps,
    neg_step, lo, hi,
):  # fmt: skip
    """Adam/AdamW on elements ``[lo, hi)``: ``g = -g`` (``maximize``); ``p * decay`` (``decoupled``) or
    ``g + p * wd`` (``l2``); ``m`` lerped towards ``g`` by ``weight`` as the reference's lerp does
    (from ``m`` when ``from_m``, else from ``g`` with ``weight`` already less one); ``v * beta2 +
    (one_minus_beta2 * g) * g``; ``p + (neg_step * m) / (sqrt(v) / bc2_sqrt + eps)``."""
    for j in range(lo, hi):
        i = _u(j)  # unsigned: no negative-index wrap, so the loop vectorises
        pi, mi, vi = _adam_element(
            g[i], p[i], m[i], v[i], maximize, l2, decoupled, wd, decay, from_m, weight, beta2, one_minus_beta2
        )
        p[i] = pi + (neg_step * mi) / (np.sqrt(vi) / bc2_sqrt + eps)
        m[i] = mi
        v[i] = vi


@njit(**_SERIAL)
def adam_amsgrad(
    p, g, m, v, vmax, maximize, l2, decoupled, wd, decay, from_m, weight, beta2, one_minus_beta2, bc2_sqrt, eps,
    neg_step, lo, hi,
):  # fmt: skip
    """:func:`adam` with AMSGrad: ``vmax = maximum(vmax, v)`` (NaN propagates, ties give ``v``, as the
    reference's ``maximum``) takes ``v``'s place under the square root."""
    for j in range(lo, hi):
        i = _u(j)  # unsigned: no negative-index wrap, so the loop vectorises
        pi, mi, vi = _adam_element(
            g[i], p[i], m[i], v[i], maximize, l2, decoupled, wd, decay, from_m, weight, beta2, one_minus_beta2
        )
        x = vmax[i]
        x = x if (x > vi or x != x) else vi
        p[i] = pi + (neg_step * mi) / (np.sqrt(x) / bc2_sqrt + eps)
        m[i] = mi
        v[i] = vi
        vmax[i] = x
