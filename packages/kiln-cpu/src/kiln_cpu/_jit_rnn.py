"""The Numba loops of kiln-cpu's recurrent-layer kernels (:mod:`kiln_cpu.kernels_rnn`): one call per time
step, over the ``n`` rows that step and every hidden unit, after the step's product ``h @ w_hhᵀ``
(BLAS, called by the kernel); compiled lazily and cached to disk, importing this module compiles nothing.

Each loop computes what :func:`kiln._ops.recurrent._forward` (``_backward``) computes for one step, in the
same order of operations: the bias is added to the product before the input projection, as the
composite's ``x + linear(h, w_hh, b_hh)``. ``sigmoid`` and ``tanh`` are kiln-cpu's float32 functions on
float32 (:mod:`kiln_cpu._fused_math`). Every array is a C-contiguous 2-D block of rows; the states ``h``
and ``c`` (and their gradients) are updated in place in their first ``n`` rows; a layer without bias
passes zeros.

Each row is worked in plain loops over one gate block at a time, each reading arrays it does not write
(the row's blocks are copied to and from small scratch vectors): LLVM vectorises those, the sigmoid
and tanh included, where one loop over every gate of a unit ran about four times slower.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kiln_cpu._fused_math import sigmoid, tanh
from kiln_cpu._jit_support import _SERIAL, zero_of

# -------------------------------------------------------------------------------------------- forward


@njit(**_SERIAL)
def lstm_step(x, hg, b, h, c, out, cells, ws):
    """One LSTM step: gates ``i, f, g, o`` from ``x + (hg + b)``; ``c = f*c + i*g``, ``h = o*tanh(c)``;
    writes the states, the step's output and cell rows, and the activated gates into ``ws``."""
    hidden = c.shape[1]
    pre = np.empty(4 * hidden, x.dtype)
    act = np.empty(4 * hidden, x.dtype)
    for r in range(x.shape[0]):
        xr, hr, cr = x[r], hg[r], c[r]
        for k in range(4 * hidden):
            pre[k] = xr[k] + (hr[k] + b[k])
        for k in range(2 * hidden):
            act[k] = sigmoid(pre[k])
        for k in range(2 * hidden, 3 * hidden):
            act[k] = tanh(pre[k])
        for k in range(3 * hidden, 4 * hidden):
            act[k] = sigmoid(pre[k])
        ws[r, :] = act
        for j in range(hidden):
            pre[j] = act[hidden + j] * cr[j] + act[j] * act[2 * hidden + j]
        for j in range(hidden):
            pre[hidden + j] = act[3 * hidden + j] * tanh(pre[j])
        cr[:] = pre[:hidden]
        cells[r, :] = pre[:hidden]
        h[r, :] = pre[hidden : 2 * hidden]
        out[r, :] = pre[hidden : 2 * hidden]


@njit(**_SERIAL)
def gru_step(x, hg, b, h, out, ws):
    """One GRU step: ``r, z`` from ``x + (hg + b)``, ``n = tanh(x_n + r * (hg_n + b_n))``,
    ``h = (1 - z) * n + z * h``; writes the state, the output rows and ``r, z, n, hg_n + b_n`` into ``ws``."""
    hidden = h.shape[1]
    one = zero_of(x) + 1
    pre = np.empty(3 * hidden, x.dtype)
    act = np.empty(4 * hidden, x.dtype)
    for r in range(x.shape[0]):
        xr, hr, hh = x[r], hg[r], h[r]
        for k in range(2 * hidden):
            pre[k] = xr[k] + (hr[k] + b[k])
        for k in range(2 * hidden, 3 * hidden):
            pre[k] = hr[k] + b[k]
        for k in range(2 * hidden):
            act[k] = sigmoid(pre[k])
        for j in range(hidden):
            act[3 * hidden + j] = pre[2 * hidden + j]
            pre[j] = xr[2 * hidden + j] + act[j] * pre[2 * hidden + j]
        for j in range(hidden):
            act[2 * hidden + j] = tanh(pre[j])
        for j in range(hidden):
            pre[j] = (one - act[hidden + j]) * act[2 * hidden + j] + act[hidden + j] * hh[j]
        ws[r, :] = act
        hh[:] = pre[:hidden]
        out[r, :] = pre[:hidden]


@njit(**_SERIAL)
def rnn_step(x, hg, b, relu, h, out):
    """One Elman step: ``h = tanh(x + (hg + b))`` (or ReLU); writes the state and the output rows."""
    hidden = h.shape[1]
    zero = zero_of(x)
    pre = np.empty(hidden, x.dtype)
    for r in range(x.shape[0]):
        xr, hr = x[r], hg[r]
        for j in range(hidden):
            pre[j] = xr[j] + (hr[j] + b[j])
        if relu:
            for j in range(hidden):
                p = pre[j]
                pre[j] = p if p > zero or p != p else zero
        else:
            for j in range(hidden):
                pre[j] = tanh(pre[j])
        h[r, :] = pre
        out[r, :] = pre


# -------------------------------------------------------------------------------------------- backward


@njit(**_SERIAL)
def lstm_back(g_out, dh, dc, ws, cells, c_prev, dpre):
    """One LSTM step back: from ``dh + g_out`` and ``dc``, the gate pre-activations' gradient ``dpre``;
    ``dc`` becomes the previous cell state's (``dc * f``). The caller then sets ``dh = dpre @ w_hh``."""
    hidden = cells.shape[1]
    one = zero_of(g_out) + 1
    dht = np.empty(hidden, g_out.dtype)
    tc = np.empty(hidden, g_out.dtype)
    dct = np.empty(hidden, g_out.dtype)
    for r in range(g_out.shape[0]):
        gr, hr, cr, wr, pr, cp, dcr = g_out[r], dh[r], cells[r], ws[r], dpre[r], c_prev[r], dc[r]
        for j in range(hidden):
            dht[j] = hr[j] + gr[j]
        for j in range(hidden):
            tc[j] = tanh(cr[j])
        for j in range(hidden):
            o = wr[3 * hidden + j]
            dct[j] = dcr[j] + dht[j] * o * (one - tc[j] * tc[j])
        for j in range(hidden):
            i, g = wr[j], wr[2 * hidden + j]
            pr[j] = dct[j] * g * (i * (one - i))
            pr[2 * hidden + j] = dct[j] * i * (one - g * g)
        for j in range(hidden):
            f = wr[hidden + j]
            pr[hidden + j] = dct[j] * cp[j] * (f * (one - f))
        for j in range(hidden):
            o = wr[3 * hidden + j]
            pr[3 * hidden + j] = dht[j] * tc[j] * (o * (one - o))
        for j in range(hidden):
            dcr[j] = dct[j] * wr[hidden + j]


@njit(**_SERIAL)
def gru_back(g_out, dh, ws, h_prev, d_in, d_hid):
    """One GRU step back: the input and hidden gate gradients (``d_in``, ``d_hid``: they differ in ``n``'s
    block, ``dn`` and ``dn * r``); ``dh`` becomes its direct part ``dht * z``, to which the caller adds
    ``d_hid @ w_hh``."""
    hidden = h_prev.shape[1]
    one = zero_of(g_out) + 1
    dht = np.empty(hidden, g_out.dtype)
    for r in range(g_out.shape[0]):
        gr, hr, wr, hp, di, dd = g_out[r], dh[r], ws[r], h_prev[r], d_in[r], d_hid[r]
        for j in range(hidden):
            dht[j] = hr[j] + gr[j]
        for j in range(hidden):
            z, n = wr[hidden + j], wr[2 * hidden + j]
            dn = dht[j] * (one - z) * (one - n * n)
            di[2 * hidden + j] = dn
            dd[2 * hidden + j] = dn * wr[j]
        for j in range(hidden):
            rg = wr[j]
            dr = di[2 * hidden + j] * wr[3 * hidden + j] * (rg * (one - rg))
            di[j] = dr
            dd[j] = dr
        for j in range(hidden):
            z = wr[hidden + j]
            dz = dht[j] * (hp[j] - wr[2 * hidden + j]) * (z * (one - z))
            di[hidden + j] = dz
            dd[hidden + j] = dz
        for j in range(hidden):
            hr[j] = dht[j] * wr[hidden + j]


@njit(**_SERIAL)
def rnn_back(g_out, dh, out, relu, dpre):
    """One Elman step back: ``dpre = (dh + g_out) * act'(out)``; the caller sets ``dh = dpre @ w_hh``."""
    hidden = out.shape[1]
    zero = zero_of(g_out)
    one = zero + 1
    for r in range(g_out.shape[0]):
        gr, hr, yr, pr = g_out[r], dh[r], out[r], dpre[r]
        if relu:
            for j in range(hidden):
                d = hr[j] + gr[j]
                pr[j] = d if yr[j] > zero else d * zero
        else:
            for j in range(hidden):
                y = yr[j]
                pr[j] = (hr[j] + gr[j]) * (one - y * y)
