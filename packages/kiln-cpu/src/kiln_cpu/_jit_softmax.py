"""The Numba loops of kiln-cpu's softmax-family kernels (:mod:`kiln_cpu.kernels_nn`): softmax and
log-softmax along rows or the middle dim of slabs, logsumexp, and their backward loops; the dispatcher
is :func:`kiln_cpu._jit_norm.norm`. Importing this module compiles nothing.

The arithmetic is the reference's step for step (``kiln._ops.softmax``), sums in NumPy's order. The
softmax loops differ where they call exp (float32: float32 arithmetic, within 2 ulps, and 0 where
``x - max`` is below -87) and where a row of 64 or more elements sums its exps over the vector lanes,
chunk by chunk (:func:`_exp_sum`).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.extending import overload, register_jitable

from kiln_cpu._jit_f32math import expf_core, expf_nonpositive, log_f32
from kiln_cpu._jit_reduce import _pairwise_leaf, _pairwise_sum, _row_sum, _sum_contiguous
from kiln_cpu._jit_scalar_ops import binop
from kiln_cpu._jit_support import _SERIAL, _UNCOUNTED, maxnum, zero_of
from kiln_cpu._opcodes import MAXIMUM

# ---------------------------------------------------------------------------------- softmax (forward)
#
# One task per row (or per outer slab when the dim is not the last): the row stays in cache across its
# passes. The arithmetic is the reference's, step for step (x - max, exp, sum, divide), so NaN, inf and
# all -inf rows come out as the reference's; only exp (float32: :func:`exp_of`) and the order of softmax's sum differ in the last bits.


def exp_of(x):
    """exp in ``x``'s dtype (jitted only): float32 in float32 arithmetic (:func:`kiln_cpu._jit_f32math.expf_core`,
    about 1 ulp, twice the lanes of the float64 polynomial that the ``exp`` op rounds once)."""
    raise NotImplementedError


def log_of(x):
    """log in ``x``'s dtype (jitted only)."""
    raise NotImplementedError


@register_jitable
def _nan_or(x, v):
    """``x`` when it is NaN, else ``v`` (a select, outside the inlined lambda: a conditional expression
    inlined into nested loops trips Numba's IR scope check)."""
    return x if x != x else v


@overload(exp_of, inline="always")  # in Numba's IR: a call left in the loop keeps it scalar
def _exp_of_impl(x):
    if x == types.float32:
        return lambda x: _nan_or(x, expf_core(x))
    return lambda x: math.exp(x)


def exp_shifted(x):
    """exp of ``x - max`` (at most 0, or NaN) in ``x``'s dtype (jitted only): float32 by
    :func:`kiln_cpu._jit_f32math.expf_nonpositive` (0 below e**-87), float64 exactly as :func:`exp_of`."""
    raise NotImplementedError


@overload(exp_shifted, inline="always")
def _exp_shifted_impl(x):
    if x == types.float32:
        return lambda x: _nan_or(x, expf_nonpositive(x))
    return lambda x: math.exp(x)


@overload(log_of, inline="always")
def _log_of_impl(x):
    if x == types.float32:
        return lambda x: log_f32(x)
    return lambda x: np.log(x)


def as_dtype_of(a, v):
    """The float ``v`` rounded to array ``a``'s dtype (jitted only)."""
    raise NotImplementedError


@overload(as_dtype_of)
def _as_dtype_of_impl(a, v):
    if a.dtype == types.float32:
        return lambda a, v: np.float32(v)
    return lambda a, v: np.float64(v)


_LANES = 64  # rows shorter than this sum their exps as the reference does (NumPy's pairwise leaf)


@njit(**_UNCOUNTED)  # once per row: see kiln_cpu._jit_support._UNCOUNTED
def _row_max(v):
    """max of the elements of the contiguous ``v`` (n >= 1) that are not NaN (``maxnum``: it vectorises,
    where a NaN-propagating select runs 3x slower: 0.08 against 0.25 us for 1024 float32). A row that
    holds a NaN still comes out as the reference's: the exp of its NaN is NaN, and so are the sum of
    the exps and everything computed from it. A max of zero may be either zero: x - max, and so the
    exps, are the same for both, and where a row's exps sum to exactly 1 only one element is zero."""
    m = v[0]
    for i in range(v.shape[0]):
        m = maxnum(m, v[i])
    return m


@register_jitable
def _exp_into(xv, m, ev):
    """ev[i] = exp(xv[i] - m) in the row's dtype (a flat loop: it vectorises)."""
    for i in range(xv.shape[0]):
        ev[i] = exp_of(xv[i] - m)


_CHUNK = 2048  # elements per chunk of an exp row's sum (bounds each running sum's length), then float64


@njit(**_UNCOUNTED, fastmath={"contract"})  # the flags of the softmax rows loops that call it
def _exp_sum(xv, m, ev):
    """ev[i] = exp(xv[i] - m) in the row's dtype, and their sum in float64. A row shorter than ``_LANES``
    is summed as the reference sums it (NumPy's pairwise order, in the row's dtype); a longer one in
    chunks of ``_CHUNK`` elements, each by :func:`kiln_cpu._jit_reduce._sum_contiguous` (running sums over the
    vector lanes in the row's dtype: thirty-two for float32 with AVX2) after the pass that computes its
    exps, the chunks' totals added in float64. Two flat loops, each vectorised whole: the exps of a
    4096x1024 float32 softmax take 1.4 ms and their sums 0.1 ms on one core, where summing in the exp
    loop (running sums kept in memory) took 0.5 ms more."""
    n = xv.shape[0]
    for i in range(n):
        ev[i] = exp_shifted(xv[i] - m)
    if n < _LANES:
        return np.float64(_pairwise_leaf(ev, np.uint64(0), n, np.uint64(1)))
    total = 0.0
    for c in range(0, n, _CHUNK):
        total += _sum_contiguous(ev[c : min(n, c + _CHUNK)])
    return total


@register_jitable
def _softmax_row_loop(x, out, n, log, lo, hi):
    """Softmax (log-softmax, ``log``) of the contiguous rows ``x[k*n:(k+1)*n]``, k in [lo, hi), into
    ``out``: the row's maximum, then exp(x - max) and its sum (:func:`_exp_sum`), then the division
    (softmax: a multiplication by the reciprocal of the float64 sum, rounded once) or the subtraction of
    log(sum)."""
    scratch = np.empty(n if log else 0, x.dtype)
    for k in range(lo, hi):
        p = k * n
        xv = x[p : p + n]
        ov = out[p : p + n]
        ev = scratch if log else ov
        m = _row_max(xv)
        total = _exp_sum(xv, m, ev)
        if log:
            ls = log_of(as_dtype_of(x, total))
            for i in range(n):
                ov[i] = (xv[i] - m) - ls
        else:
            r = as_dtype_of(x, 1.0 / total)
            for i in range(n):
                ov[i] = ov[i] * r


def _softmax_rows(log):
    def rows(x, out, n, lo, hi):
        """:func:`_softmax_row_loop` over rows k in [lo, hi)."""
        _softmax_row_loop(x, out, n, log, lo, hi)

    return njit(**_SERIAL, fastmath={"contract"})(rows)


def _softmax_slabs(log):
    def slabs(x, out, n, inner, lo, hi):
        """Softmax (log-softmax) along the middle dim of the contiguous (outer, n, inner) ``x``, outer index
        in [lo, hi): rows folded in order, vectorised along ``inner`` (the reference's order exactly)."""
        m = np.empty(inner, x.dtype)
        s = np.empty(inner, x.dtype)
        for o in range(lo, hi):
            base = o * n * inner
            first = x[base : base + inner]
            for i in range(inner):
                m[i] = first[i]
                s[i] = 0
            for r in range(1, n):
                row = x[base + r * inner : base + (r + 1) * inner]
                for i in range(inner):
                    m[i] = binop(MAXIMUM, row[i], m[i], 0)
            for r in range(n):
                row = x[base + r * inner : base + (r + 1) * inner]
                orow = out[base + r * inner : base + (r + 1) * inner]
                for i in range(inner):
                    e = exp_shifted(row[i] - m[i])
                    s[i] += e
                    if not log:
                        orow[i] = e
            if log:
                for i in range(inner):
                    s[i] = log_of(s[i])
            for r in range(n):
                row = x[base + r * inner : base + (r + 1) * inner]
                orow = out[base + r * inner : base + (r + 1) * inner]
                for i in range(inner):
                    if log:
                        orow[i] = (row[i] - m[i]) - s[i]
                    else:
                        orow[i] = orow[i] / s[i]

    return njit(**_SERIAL, fastmath={"contract"})(slabs)


def _logsumexp_rows(x, out, n, lo, hi):
    """out[k] = logsumexp of the contiguous row ``x[k*n:(k+1)*n]``, k in [lo, hi): the reference's
    max (0 when infinite), log of the pairwise sum of exp(x - max), plus the max."""
    work = np.empty(384, np.int64)
    vals = np.empty(128, x.dtype)
    scratch = np.empty(n, x.dtype)
    zero = zero_of(x)
    for k in range(lo, hi):
        p = k * n
        m = _row_max(x[p : p + n])
        m = zero if (m == np.inf or m == -np.inf) else m
        _exp_into(x[p : p + n], m, scratch)
        out[k] = log_of(_pairwise_sum(scratch, 0, n, 1, work, vals)) + m


# ------------------------------------------------------------------------------------ softmax backward


def _softmax_backward_rows(log):
    def rows(g, y, out, n, lo, hi):
        """The softmax (log-softmax) input gradient of the contiguous rows k in [lo, hi) of length ``n``:
        ``y * (g - s)`` with s = 0 + pairwise sum of ``g * y`` (log: ``g - exp(y) * s``, s = 0 + pairwise
        sum of g)."""
        work = np.empty(384, np.int64)
        vals = np.empty(128, y.dtype)
        scratch = np.empty(0 if log else n, y.dtype)
        zero = zero_of(y)
        for k in range(lo, hi):
            p = k * n
            gv = g[p : p + n]
            yv = y[p : p + n]
            ov = out[p : p + n]
            if log:
                s = _row_sum(g, p, n, work, vals)
                _exp_into(yv, zero, ov)  # exp(y - 0) = exp(y); a flat loop of exps vectorises
                for i in range(n):
                    ov[i] = gv[i] - ov[i] * s
            else:
                for i in range(n):
                    scratch[i] = gv[i] * yv[i]
                s = _row_sum(scratch, 0, n, work, vals)
                for i in range(n):
                    ov[i] = yv[i] * (gv[i] - s)

    return njit(**_SERIAL)(rows)


def _softmax_backward_slabs(log):
    def slabs(g, y, out, n, inner, lo, hi):
        """The softmax (log-softmax) input gradient along the middle dim of the contiguous (outer, n,
        inner) ``y``, outer index in [lo, hi): the sums run over the rows in order onto 0 (NumPy's order),
        vectorised along ``inner``."""
        s = np.empty(inner, y.dtype)
        zero = zero_of(y)
        for o in range(lo, hi):
            base = o * n * inner
            for i in range(inner):
                s[i] = zero
            for r in range(n):
                q = base + r * inner
                gr = g[q : q + inner]
                yr = y[q : q + inner]
                if log:
                    for i in range(inner):
                        s[i] += gr[i]
                else:
                    for i in range(inner):
                        s[i] += gr[i] * yr[i]
            for r in range(n):
                q = base + r * inner
                gr = g[q : q + inner]
                yr = y[q : q + inner]
                orow = out[q : q + inner]
                if log:
                    for i in range(inner):
                        orow[i] = gr[i] - exp_of(yr[i]) * s[i]
                else:
                    for i in range(inner):
                        orow[i] = yr[i] * (gr[i] - s[i])

    return njit(**_SERIAL)(slabs)
