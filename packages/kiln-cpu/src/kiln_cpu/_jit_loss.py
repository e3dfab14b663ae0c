"""The Numba loops of kiln-cpu's loss kernels (:mod:`kiln_cpu.kernels_loss`): nll_loss forward and backward,
and log-softmax then nll_loss in one pass each way (kiln-compile's fused cross entropy), compiled lazily and
cached to disk; importing this module compiles nothing.

Each loop is serial and takes a [lo, hi) range of rows (or of batch entries) that
:func:`kiln_cpu._threads.parallel` splits over the thread pool; the input is read, and the gradient
written, in place in its (N, C, inner) layout, where the reference first moves the class dim last.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.extending import register_jitable

from kiln_cpu._jit_softmax import _exp_into, _softmax_row_loop
from kiln_cpu._jit_support import _SERIAL, zero_of

# -------------------------------------------------------------------------------------------- nll loss


@njit(**_SERIAL)
def nll_rows(x, t, weight, has_w, ignore_index, classes, inner, loss, w, bad, lo, hi):
    """The reference's per-row terms of nll_loss, read in place from the contiguous (N, C, inner) ``x``
    (row r: n = r // inner, s = r % inner): w[r] = weight of the target (1 without weights, 0 where
    ignored), loss[r] = -w[r] * x[n, t[r], s] (0 where w[r] == 0), r in [lo, hi). An out-of-range target
    sets ``bad[0]`` (the caller lets the reference raise)."""
    zero = zero_of(loss)
    one = zero + 1
    for r in range(lo, hi):
        c = np.int64(t[r])
        if c == ignore_index:
            w[r] = zero
            loss[r] = zero
            continue
        if c < 0 or c >= classes:
            bad[0] = 1
            w[r] = zero
            loss[r] = zero
            continue
        wr = weight[c] if has_w else one
        w[r] = wr
        n = r // inner
        s = r - n * inner
        loss[r] = -wr * x[(n * classes + c) * inner + s] if wr != zero else zero


@njit(**_SERIAL)
def nll_weights(t, weight, has_w, ignore_index, classes, w, bad, lo, hi):
    """w[r] = the weight of row r's target (1 without weights, 0 where ignored), r in [lo, hi); an
    out-of-range target sets ``bad[0]`` (the caller lets the reference raise)."""
    zero = zero_of(w)
    one = zero + 1
    for r in range(lo, hi):
        c = np.int64(t[r])
        if c == ignore_index:
            w[r] = zero
        elif c < 0 or c >= classes:
            bad[0] = 1
            w[r] = zero
        else:
            w[r] = weight[c] if has_w else one


@register_jitable
def nll_term(wr, gr, mode, q):
    """The nll gradient at a row's target, for the row's weight ``wr`` (0 where ignored): ``-wr * gr`` (mode 0,
    reduction "none": ``gr`` the row's output gradient), ``-wr * q`` (mode 1, "sum": q the output gradient),
    or ``-wr * q`` where ``wr`` is not 0, else 0 (mode 2, "mean": q the output gradient / the weights' sum)."""
    if mode == 0:
        return -wr * gr
    if mode == 1 or wr != 0:
        return -wr * q
    return wr - wr  # (0 in wr's dtype)


@njit(**_SERIAL)
def nll_backward_fill(t, w, g, mode, q, ignore_index, classes, inner, out, lo, hi):
    """The gradient of nll_loss into the contiguous (N, C, inner) ``out``, batch entries n in [lo, hi):
    zeros, and at each row's target (class 0 for an ignored row, as the reference) its scale: ``-w * g[r]``
    (mode 0, reduction "none"), ``-w * q`` (mode 1, "sum": q = the output gradient) or ``-w * q`` where
    w != 0, else 0 (mode 2, "mean": q = the output gradient / the sum of the weights)."""
    zero = zero_of(out)
    block = classes * inner
    for n in range(lo, hi):
        ov = out[n * block : (n + 1) * block]
        for i in range(block):
            ov[i] = zero
        for s in range(inner):
            r = n * inner + s
            c = np.int64(t[r])
            if c == ignore_index:
                c = 0
            ov[c * inner + s] = nll_term(w[r], g[r] if mode == 0 else zero, mode, q)


# ------------------------------------------------------------- log-softmax then nll_loss (kiln-compile)


@njit(**_SERIAL, fastmath={"contract"})  # the log-softmax rows loop's flags: the same log-probabilities
def log_softmax_nll_rows(x, t, has_w, ignore_index, out, loss, w, bad, n, lo, hi):
    """Rows k in [lo, hi) of the contiguous (rows, n) ``x``: their log-softmax into ``out`` (the
    ``_log_softmax`` kernel's loop), then :func:`nll_rows`' terms of them without weights (``loss``,
    ``w``; an out-of-range target sets ``bad[0]``). ``has_w`` is False, passed in: a constant would let LLVM
    fold the weight of 1 away, and ``-x`` flips a NaN's sign where ``-1 * x`` keeps it."""
    _softmax_row_loop(x, out, n, True, lo, hi)
    nll_rows(out, t, out[:0], has_w, ignore_index, n, 1, loss, w, bad, lo, hi)


@njit(**_SERIAL)
def log_softmax_nll_backward_rows(y, t, q, one, mean, ignore_index, out, bad, n, lo, hi):
    """The input gradient of log-softmax then nll_loss without weights (reduction "sum", or "mean" where
    ``q`` is already divided by the count) into rows k in [lo, hi) of ``out``, from the log-probabilities
    ``y``, as the two backward kernels compute it: the nll gradient row is 0 but at the target
    (:func:`nll_backward_fill`: ``v = -q``; an ignored row puts ``-0 * q``, or 0 for "mean", at class 0),
    its sum ``s = 0 + v``, and the row ``g - exp(y) * s``. An out-of-range target sets ``bad[0]``."""
    zero = zero_of(out)
    mode = 2 if mean else 1
    for k in range(lo, hi):
        c = np.int64(t[k])
        if c == ignore_index:
            v = nll_term(zero, zero, mode, q)
            c = 0
        elif c < 0 or c >= n:
            bad[0] = 1
            continue
        else:
            v = nll_term(one, zero, mode, q)  # (``one`` passed in: see log_softmax_nll_rows)
        s = zero + v
        p = k * n
        ov = out[p : p + n]
        _exp_into(y[p : p + n], zero, ov)
        at = ov[c]
        for i in range(n):
            ov[i] = zero - ov[i] * s
        ov[c] = v - at * s
