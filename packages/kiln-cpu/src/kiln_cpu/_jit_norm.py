"""The Numba loops of kiln-cpu's normalization kernels (:mod:`kiln_cpu.kernels_nn`): layer, batch and
group norm, forward and backward, compiled lazily and cached to disk; importing this module compiles
nothing. Its :func:`norm` dispatches these and the softmax-family loops (:mod:`kiln_cpu._jit_softmax`).

Each loop is serial and takes a [lo, hi) range of tasks (rows, outer slabs, channel blocks or column
blocks) that :func:`kiln_cpu._threads.parallel` splits over the thread pool. The arithmetic is the
reference's step for step (``kiln._ops.normalization``): the same products and differences rounded in the
same order, sums in NumPy's order: a sum over several runs or rows adds them one after another onto 0,
as NumPy's reductions do, and a contiguous run is summed by NumPy's pairwise tree whose leaves keep
thirty-two running sums (:func:`kiln_cpu._jit_reduce._pairwise_sum`; NumPy's eight are bound by the latency of
their adds: batch norm forward and backward of 32x64x32x32 took 4.4 ms with them, 2.3 ms now; layer
norm's backward of 8192x1024 20.9 ms, 15.8 ms now). So the norm loops give the reference's result bit
for bit where each summed run has at most 128 elements (NumPy's leaf) and within a few ulps beyond. The
softmax loops differ where they call exp (float32: float32 arithmetic, within 2 ulps, and 0 where
``x - max`` is below -87) and where a row of 64 or more elements sums its exps over the vector lanes,
chunk by chunk (:func:`kiln_cpu._jit_softmax._exp_sum`).
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.extending import register_jitable

from kiln_cpu._jit_half import load, store
from kiln_cpu._jit_reduce import _pairwise_sum, _row_sum
from kiln_cpu._jit_softmax import (
    _logsumexp_rows,
    _softmax_backward_rows,
    _softmax_backward_slabs,
    _softmax_row_loop,
    _softmax_rows,
    _softmax_slabs,
)
from kiln_cpu._jit_support import _SERIAL, _UNCOUNTED, zero_of

# ---------------------------------------------------------------------------------- norms (forward)
#
# One task per row: the row stays in cache across its passes. The arithmetic is the reference's, step
# for step (layer norm's mean, centred squares, 1/sqrt(var + eps), affine), so NaN, inf and all -inf rows
# come out as the reference's.

_HALF_BLOCK = 16384  # elements of half-precision rows widened to float32 at a time (64 KiB, in L2)
_SOFTMAX, _LOG_SOFTMAX, _LAYER_NORM = range(3)  # the row loops that take half precision


def _half_rows(kind, half):
    """The loop over rows of half-precision bits (``half``: F16/BF16) for the float32 rows loop ``kind``
    (:func:`_softmax_row_loop`, :func:`_layer_norm_rows`): blocks of rows widened to float32 exactly,
    the float32 loop over them, its results rounded back once (nearest-even), as the reference computes
    half precision in float32 and rounds its result. (The closure holds plain numbers only: one that
    held a compiled function would get a new disk-cache key in every process.)"""

    def rows(x, out, n, *rest):
        """The float32 loop over the rows ``x[k*n:(k+1)*n]``, k in [lo, hi) (``rest``: its parameters,
        then lo and hi)."""
        lo, hi = rest[-2], rest[-1]
        block = max(1, _HALF_BLOCK // n)
        xs = np.empty(min(block, hi - lo) * n, np.float32)
        os = np.empty(xs.size, np.float32)
        for k0 in range(lo, hi, block):
            count = min(hi - k0, block)
            src = x[k0 * n : (k0 + count) * n]
            dst = out[k0 * n : (k0 + count) * n]
            for i in range(count * n):
                xs[i] = load(half, src[i])
            if kind == _LAYER_NORM:
                _layer_norm_rows(xs, os, n, *rest[:-2], 0, count)
            else:
                _softmax_row_loop(xs, os, n, kind == _LOG_SOFTMAX, 0, count)
            for i in range(count * n):
                dst[i] = store(half, os[i])

    # the flags of the float32 loop's own compilation (layer norm rounds each product: no contraction)
    return njit(**_SERIAL, **({} if kind == _LAYER_NORM else {"fastmath": {"contract"}}))(rows)


@register_jitable
def _layer_norm_rows(x, out, n, w, b, has_w, has_b, eps, one, count, lo, hi):
    """Layer norm of the contiguous rows ``x[k*n:(k+1)*n]``, k in [lo, hi), as the reference computes it:
    mean = sum / n, c = x - mean, var = sum(c*c) / n, y = c * (1 / sqrt(var + eps)), then * w, + b
    (``eps``, ``one`` and ``count`` = n come in x's dtype: Numba would widen float32 with an int to
    float64)."""
    work = np.empty(384, np.int64)
    vals = np.empty(128, x.dtype)
    scratch = np.empty(n, x.dtype)
    for k in range(lo, hi):
        p = k * n
        mu = _pairwise_sum(x, p, n, 1, work, vals) / count
        xv = x[p : p + n]
        ov = out[p : p + n]
        for i in range(n):
            c = xv[i] - mu
            ov[i] = c
            scratch[i] = c * c
        var = _pairwise_sum(scratch, 0, n, 1, work, vals) / count
        rstd = one / np.sqrt(var + eps)
        # one pass, each product and sum rounded as the reference rounds it (no FMA contraction here)
        if has_w and has_b:
            for i in range(n):
                ov[i] = (ov[i] * rstd) * w[i] + b[i]
        elif has_w:
            for i in range(n):
                ov[i] = (ov[i] * rstd) * w[i]
        elif has_b:
            for i in range(n):
                ov[i] = ov[i] * rstd + b[i]
        else:
            for i in range(n):
                ov[i] = ov[i] * rstd


@njit(**_UNCOUNTED)
def _is_constant(v):
    """Every element of ``v`` equals the first (False at a NaN): the reference's ``max == min``."""
    first = v[0]
    for i in range(v.shape[0]):  # noqa: SIM110 - a generator expression does not compile in Numba
        if v[i] != first:
            return False
    return True


# ----------------------------------------------------------------------------------- layer norm backward


@njit(**_UNCOUNTED)  # once per row (layer and group norm backward): no reference counting
def _row_stats(x, p, n, count, eps, one, sq, work, vals):
    """(mean, 1/sqrt(var + eps)) of the contiguous row ``x[p:p+n]`` as the backward reference computes
    them: mean = (0 + sum) / n, var = (0 + sum of centred squares) / n, exactly 0 for a constant row."""
    zero = zero_of(x)
    xv = x[p : p + n]
    mu = _row_sum(x, p, n, work, vals) / count
    for i in range(n):
        c = xv[i] - mu
        sq[i] = c * c
    var = _row_sum(sq, 0, n, work, vals) / count
    if var == var and _is_constant(xv):
        var = zero * var
    return mu, one / np.sqrt(var + eps)


@njit(**_UNCOUNTED)
def _row_input_grad(x, g, w, has_w, p, n, count, mu, r, s1, s2, gx, work, vals):
    """gx = r * ((gs - mean(gs)) - xhat * mean(gs * xhat)) over the row ``[p, p+n)``, gs = g * w (or g),
    xhat = (x - mu) * r; ``w`` is indexed by the position in the row."""
    xv = x[p : p + n]
    gv = g[p : p + n]
    ov = gx[p : p + n]
    if has_w:
        for i in range(n):
            gs = gv[i] * w[i]
            s1[i] = gs
            s2[i] = gs * ((xv[i] - mu) * r)
    else:
        for i in range(n):
            s1[i] = gv[i]
            s2[i] = gv[i] * ((xv[i] - mu) * r)
    m1 = _row_sum(s1, 0, n, work, vals) / count
    m2 = _row_sum(s2, 0, n, work, vals) / count
    if has_w:
        for i in range(n):
            ov[i] = r * ((gv[i] * w[i] - m1) - ((xv[i] - mu) * r) * m2)
    else:
        for i in range(n):
            ov[i] = r * ((gv[i] - m1) - ((xv[i] - mu) * r) * m2)


def _layer_norm_backward_rows(x, g, w, has_w, eps, one, count, need_gx, mean, rstd, gx, n, lo, hi):
    """Layer norm's backward over the contiguous rows k in [lo, hi) of length ``n``: each row's mean and
    1/sqrt(var + eps) into ``mean``/``rstd`` (the parameters' pass reads them), and, if ``need_gx``, the
    input gradient into ``gx``."""
    work = np.empty(384, np.int64)
    vals = np.empty(128, x.dtype)
    sq = np.empty(n, x.dtype)
    s2 = np.empty(n, x.dtype)
    for k in range(lo, hi):
        p = k * n
        mu, r = _row_stats(x, p, n, count, eps, one, sq, work, vals)
        mean[k] = mu
        rstd[k] = r
        if need_gx:
            _row_input_grad(x, g, w, has_w, p, n, count, mu, r, sq, s2, gx, work, vals)


_COLS = 128  # columns per task of the parameters' pass


def _norm_params_cols(x, g, mean, rstd, rows, n, need_w, need_b, onto_zero, gw, gb, lo, hi):
    """Layer norm's parameter gradients over the column blocks [lo, hi) of ``_COLS``: gw[j] = sum over the
    rows k, in order, of g * ((x - mean[k]) * rstd[k]), gb[j] = sum of g (onto 0, as NumPy sums; the one
    row itself when ``onto_zero`` is False: no dim is summed)."""
    zero = zero_of(x)
    for blk in range(lo, hi):
        j0 = blk * _COLS
        j1 = min(n, j0 + _COLS)
        for k in range(rows):
            p = k * n
            mu = mean[k]
            r = rstd[k]
            xv = x[p + j0 : p + j1]
            gv = g[p + j0 : p + j1]
            wv = gw[j0:j1]
            bv = gb[j0:j1]
            if k == 0 and not onto_zero:
                if need_w:
                    for j in range(j1 - j0):
                        wv[j] = gv[j] * ((xv[j] - mu) * r)
                if need_b:
                    for j in range(j1 - j0):
                        bv[j] = gv[j]
                continue
            if k == 0:
                for j in range(j1 - j0):
                    wv[j] = zero
                    bv[j] = zero
            if need_w:
                for j in range(j1 - j0):
                    wv[j] += gv[j] * ((xv[j] - mu) * r)
            if need_b:
                for j in range(j1 - j0):
                    bv[j] += gv[j]


# ------------------------------------------------------------------------------------------- batch norm
#
# The input is the contiguous (N, C, HW) view; a task is a block of channels [c0, c1), small enough that
# its N * HW * (c1 - c0) elements stay in cache across the passes. Loops run over n, then the block's
# channels, then a run of HW contiguous elements; per-channel sums add one pairwise run sum per n onto 0
# (NumPy's order for a reduction over dims 0 and 2+).


@register_jitable
def _channel_sums(x, N, C, HW, c0, c1, acc, work, vals):
    """acc[c - c0] = 0 + sum over n of the pairwise sum of the run x[n, c, :], c in [c0, c1)."""
    zero = zero_of(x)
    for j in range(c1 - c0):
        acc[j] = zero
    for n in range(N):
        for c in range(c0, c1):
            acc[c - c0] += _pairwise_sum(x, (n * C + c) * HW, HW, 1, work, vals)


@register_jitable
def _channel_moments(x, N, C, HW, c0, c1, count, mu, acc, sq, work, vals):
    """mu[j] = the mean of channel c0 + j (its sum / ``count``) and acc[j] = 0 + the sum of the squares of
    its elements minus mu[j], every sum in NumPy's order (``sq``: scratch of HW)."""
    zero = zero_of(x)
    _channel_sums(x, N, C, HW, c0, c1, mu, work, vals)
    for j in range(c1 - c0):
        mu[j] = mu[j] / count
        acc[j] = zero
    for n in range(N):
        for c in range(c0, c1):
            p = (n * C + c) * HW
            m = mu[c - c0]
            xv = x[p : p + HW]
            for i in range(HW):
                d = xv[i] - m
                sq[i] = d * d
            acc[c - c0] += _pairwise_sum(sq, 0, HW, 1, work, vals)


@register_jitable
def _constant_channel(x, N, C, HW, c):
    """Whether every element of channel ``c`` equals its first (kiln's ``_var`` is exactly 0 there)."""
    first = x[c * HW]
    for n in range(N):
        p = (n * C + c) * HW
        for i in range(HW):
            if x[p + i] != first:
                return False
    return True


@register_jitable
def _channel_stats(x, N, C, HW, c0, c1, count, eps, one, backward, mu, r, sq, work, vals):
    """mu[j] = mean and r[j] = 1/sqrt(var + eps) of channels c0 + j, var the mean of the centred squares
    (``backward``: exactly 0 for a constant channel, as kiln's ``_var``)."""
    zero = zero_of(x)
    _channel_moments(x, N, C, HW, c0, c1, count, mu, r, sq, work, vals)
    for j in range(c1 - c0):
        var = r[j] / count
        if backward and var == var and _constant_channel(x, N, C, HW, c0 + j):
            var = zero * var
        r[j] = one / np.sqrt(var + eps)


@register_jitable
def _block_stats(x, N, C, HW, c0, c1, count, eps, one, train, backward, mean_in, r_in, mu, r, sq, work, vals):
    """mu[j] and r[j] = 1/sqrt(var + eps) of channels c0 + j: the batch statistics (``train``, see
    :func:`_channel_stats`) or the given ``mean_in`` and ``r_in``."""
    if train:
        _channel_stats(x, N, C, HW, c0, c1, count, eps, one, backward, mu, r, sq, work, vals)
    else:
        for j in range(c1 - c0):
            mu[j] = mean_in[c0 + j]
            r[j] = r_in[c0 + j]


def _batch_norm_channels(x, w, b, has_w, has_b, eps, one, count, train, mean_in, r_in, out, N, C, HW, block, lo, hi):
    """Batch norm forward of the channel blocks [lo, hi) (``block`` channels each): y = ((x - mean) * r)
    (* w[c]) (+ b[c]) with the batch statistics (``train``) or the given mean and ``r_in`` =
    1/sqrt(var + eps)."""
    work = np.empty(384, np.int64)
    vals = np.empty(128, x.dtype)
    sq = np.empty(HW, x.dtype)
    mu = np.empty(block, x.dtype)
    r = np.empty(block, x.dtype)
    for blk in range(lo, hi):
        c0 = blk * block
        c1 = min(C, c0 + block)
        _block_stats(x, N, C, HW, c0, c1, count, eps, one, train, False, mean_in, r_in, mu, r, sq, work, vals)
        for n in range(N):
            for c in range(c0, c1):
                p = (n * C + c) * HW
                m = mu[c - c0]
                rc = r[c - c0]
                xv = x[p : p + HW]
                ov = out[p : p + HW]
                if has_w and has_b:
                    wc = w[c]
                    bc = b[c]
                    for i in range(HW):
                        ov[i] = ((xv[i] - m) * rc) * wc + bc
                elif has_w:
                    wc = w[c]
                    for i in range(HW):
                        ov[i] = ((xv[i] - m) * rc) * wc
                elif has_b:
                    bc = b[c]
                    for i in range(HW):
                        ov[i] = (xv[i] - m) * rc + bc
                else:
                    for i in range(HW):
                        ov[i] = (xv[i] - m) * rc


def _batch_norm_backward_channels(
    x, g, w, has_w, eps, one, count, train, mean_in, r_in, need_gx, gx, gw, gb, N, C, HW, block, lo, hi
):
    """Batch norm backward of the channel blocks [lo, hi): with xhat = (x - mean) * r and gs = g * w[c] (or
    g), gw[c] = sum of g * xhat, gb[c] = sum of g, and gx = r * ((gs - mean(gs)) - xhat * mean(gs * xhat))
    with the batch statistics (``train``), or gx = gs * r with the given ``mean_in`` and ``r_in``."""
    work = np.empty(384, np.int64)
    vals = np.empty(128, x.dtype)
    s1 = np.empty(HW, x.dtype)
    s2 = np.empty(HW, x.dtype)
    s3 = np.empty(HW, x.dtype)
    mu = np.empty(block, x.dtype)
    r = np.empty(block, x.dtype)
    sum_g = np.empty(block, x.dtype)
    sum_gx = np.empty(block, x.dtype)
    sum_gs = np.empty(block, x.dtype)
    sum_gsx = np.empty(block, x.dtype)
    zero = zero_of(x)
    for blk in range(lo, hi):
        c0 = blk * block
        c1 = min(C, c0 + block)
        _block_stats(x, N, C, HW, c0, c1, count, eps, one, train, True, mean_in, r_in, mu, r, s1, work, vals)
        for j in range(c1 - c0):
            sum_g[j] = zero
            sum_gx[j] = zero
            sum_gs[j] = zero
            sum_gsx[j] = zero
        for n in range(N):
            for c in range(c0, c1):
                p = (n * C + c) * HW
                m = mu[c - c0]
                rc = r[c - c0]
                xv = x[p : p + HW]
                gv = g[p : p + HW]
                for i in range(HW):
                    s1[i] = gv[i] * ((xv[i] - m) * rc)
                sum_g[c - c0] += _pairwise_sum(g, p, HW, 1, work, vals)
                sum_gx[c - c0] += _pairwise_sum(s1, 0, HW, 1, work, vals)
                if train and has_w:
                    wc = w[c]
                    for i in range(HW):
                        gs = gv[i] * wc
                        s2[i] = gs
                        s3[i] = gs * ((xv[i] - m) * rc)
                    sum_gs[c - c0] += _pairwise_sum(s2, 0, HW, 1, work, vals)
                    sum_gsx[c - c0] += _pairwise_sum(s3, 0, HW, 1, work, vals)
        for j in range(c1 - c0):
            gw[c0 + j] = sum_gx[j]
            gb[c0 + j] = sum_g[j]
        if not need_gx:
            continue
        if train and not has_w:  # gs is g itself
            for j in range(c1 - c0):
                sum_gs[j] = sum_g[j]
                sum_gsx[j] = sum_gx[j]
        for n in range(N):
            for c in range(c0, c1):
                p = (n * C + c) * HW
                m = mu[c - c0]
                rc = r[c - c0]
                wc = w[c] if has_w else one
                xv = x[p : p + HW]
                gv = g[p : p + HW]
                ov = gx[p : p + HW]
                if train:
                    m1 = sum_gs[c - c0] / count
                    m2 = sum_gsx[c - c0] / count
                    if has_w:
                        for i in range(HW):
                            ov[i] = rc * ((gv[i] * wc - m1) - ((xv[i] - m) * rc) * m2)
                    else:
                        for i in range(HW):
                            ov[i] = rc * ((gv[i] - m1) - ((xv[i] - m) * rc) * m2)
                elif has_w:
                    for i in range(HW):
                        ov[i] = (gv[i] * wc) * rc
                else:
                    for i in range(HW):
                        ov[i] = gv[i] * rc


def _batch_norm_stats_channels(x, count, mean, ss, same, N, C, HW, block, lo, hi):
    """The batch statistics of the channel blocks [lo, hi) as kiln's ``mean`` and ``_var`` compute them:
    mean[c] = (0 + sum) / count, ss[c] = 0 + sum of the squares of x - mean[c], same[c] = every element of
    the channel equals its first (the caller divides ss by n - 1 and zeroes constant channels)."""
    work = np.empty(384, np.int64)
    vals = np.empty(128, x.dtype)
    sq = np.empty(HW, x.dtype)
    mu = np.empty(block, x.dtype)
    acc = np.empty(block, x.dtype)
    for blk in range(lo, hi):
        c0 = blk * block
        c1 = min(C, c0 + block)
        _channel_moments(x, N, C, HW, c0, c1, count, mu, acc, sq, work, vals)
        for j in range(c1 - c0):
            mean[c0 + j] = mu[j]
            ss[c0 + j] = acc[j]
            same[c0 + j] = _constant_channel(x, N, C, HW, c0 + j)


# ------------------------------------------------------------------------------------------- group norm
#
# The input is the contiguous (N * G, L) rows of (N, G, L), L = Cg * HW (Cg channels of HW elements each):
# statistics per row; the affine parameters and their gradients per channel.


def _group_norm_rows(x, w, b, has_w, has_b, eps, one, count, out, L, HW, Cg, G, lo, hi):
    """Group norm forward of the rows k in [lo, hi) (n = k // G, group k % G): mean = (0 + sum) / L,
    centred, var = (0 + sum of squares) / L, y = (c * (1/sqrt(var + eps))) (* w[ch]) (+ b[ch])."""
    work = np.empty(384, np.int64)
    vals = np.empty(128, x.dtype)
    sq = np.empty(L, x.dtype)
    for k in range(lo, hi):
        p = k * L
        xv = x[p : p + L]
        ov = out[p : p + L]
        mu = _row_sum(x, p, L, work, vals) / count
        for i in range(L):
            c = xv[i] - mu
            ov[i] = c
            sq[i] = c * c
        var = _row_sum(sq, 0, L, work, vals) / count
        r = one / np.sqrt(var + eps)
        ch0 = (k % G) * Cg
        for ci in range(Cg):
            v = ov[ci * HW : (ci + 1) * HW]
            if has_w and has_b:
                wc = w[ch0 + ci]
                bc = b[ch0 + ci]
                for i in range(HW):
                    v[i] = (v[i] * r) * wc + bc
            elif has_w:
                wc = w[ch0 + ci]
                for i in range(HW):
                    v[i] = (v[i] * r) * wc
            elif has_b:
                bc = b[ch0 + ci]
                for i in range(HW):
                    v[i] = v[i] * r + bc
            else:
                for i in range(HW):
                    v[i] = v[i] * r


def _group_norm_backward_rows(
    x, g, w, has_w, eps, one, count, need_gx, need_w, need_b, gx, part_w, part_b, L, HW, Cg, G, lo, hi
):
    """Group norm backward of the rows k in [lo, hi): the input gradient as layer norm's over the row (gs
    = g * w[channel]), and per (n, channel) the pairwise run sums of g * xhat and of g into ``part_w`` /
    ``part_b`` (N, C) (the caller adds them over n, in order)."""
    work = np.empty(384, np.int64)
    vals = np.empty(128, x.dtype)
    sq = np.empty(L, x.dtype)
    s2 = np.empty(L, x.dtype)
    wrow = np.empty(L if has_w else 0, x.dtype)
    C = G * Cg
    for k in range(lo, hi):
        p = k * L
        ch0 = (k % G) * Cg
        n = k // G
        mu, r = _row_stats(x, p, L, count, eps, one, sq, work, vals)
        if need_gx:
            if has_w:
                for ci in range(Cg):
                    wc = w[ch0 + ci]
                    for i in range(HW):
                        wrow[ci * HW + i] = wc
            _row_input_grad(x, g, wrow, has_w, p, L, count, mu, r, sq, s2, gx, work, vals)
        for ci in range(Cg):
            q = p + ci * HW
            if need_w:
                xv = x[q : q + HW]
                gv = g[q : q + HW]
                for i in range(HW):
                    sq[i] = gv[i] * ((xv[i] - mu) * r)
                part_w[n * C + ch0 + ci] = _pairwise_sum(sq, 0, HW, 1, work, vals)
            if need_b:
                part_b[n * C + ch0 + ci] = _pairwise_sum(g, q, HW, 1, work, vals)


# ------------------------------------------------------------------------------------------- dispatcher

_NORM: dict = {}


def norm(name: str, half: int = 0):
    """The dispatcher for ``name`` ("<op>-<layout>"), over half-precision bits when ``half`` (F16/BF16:
    "softmax-rows", "log_softmax-rows" and "layer_norm-rows" only, :func:`_half_rows`), else in the
    arrays' own dtype: "softmax-rows", "log_softmax-rows", "softmax-slabs",
    "log_softmax-slabs", "logsumexp-rows", "layer_norm-rows"; the backward loops "softmax_backward-rows",
    "log_softmax_backward-rows", "softmax_backward-slabs", "log_softmax_backward-slabs",
    "layer_norm_backward-rows", "norm_params-cols"; batch norm's "batch_norm-channels",
    "batch_norm_backward-channels" and "batch_norm_stats-channels"; group norm's "group_norm-rows" and "group_norm_backward-rows"."""
    if half:
        kernel = _NORM.get((name, half))
        if kernel is None:
            kind = {"softmax-rows": _SOFTMAX, "log_softmax-rows": _LOG_SOFTMAX, "layer_norm-rows": _LAYER_NORM}[name]
            kernel = _NORM[(name, half)] = _half_rows(kind, half)
        return kernel
    kernel = _NORM.get(name)
    if kernel is None:
        op_name, layout = name.rsplit("-", 1)
        plain = {
            "logsumexp": (_logsumexp_rows, {"fastmath": {"contract"}}),
            "layer_norm": (_layer_norm_rows, {}),
            "layer_norm_backward": (_layer_norm_backward_rows, {}),
            "norm_params": (_norm_params_cols, {}),
            "batch_norm": (_batch_norm_channels, {}),
            "batch_norm_backward": (_batch_norm_backward_channels, {}),
            "batch_norm_stats": (_batch_norm_stats_channels, {}),
            "group_norm": (_group_norm_rows, {}),
            "group_norm_backward": (_group_norm_backward_rows, {}),
        }
        if op_name in plain:
            fn, extra = plain[op_name]
            kernel = njit(**_SERIAL, **extra)(fn)
        elif op_name in ("softmax_backward", "log_softmax_backward"):
            make = _softmax_backward_rows if layout == "rows" else _softmax_backward_slabs
            kernel = make(op_name == "log_softmax_backward")
        elif layout == "rows":
            kernel = _softmax_rows(op_name == "log_softmax")
        else:
            kernel = _softmax_slabs(op_name == "log_softmax")
        _NORM[name] = kernel
    return kernel
