"""The Numba loops of kiln-cpu's pooling kernels (:mod:`kiln_cpu.kernels_pool`), compiled lazily and cached.

Every loop takes one input plane (the trailing 1 to 3 dims of a C-contiguous tensor) per task:

* :func:`max_pool`: window maxima and their flat index in the plane, windows given per output position
  and dim as ``base + k * step`` for ``k`` in ``[k_lo, k_hi)`` (the valid offsets: max pooling with
  padding and dilation, and adaptive max pooling). The reference's rules: offsets in row-major order,
  the first valid element is taken, then any larger one or any NaN (so the last NaN wins).
* :func:`argmax_scatter`: the max pools' backward, each gradient added at its window's argmax in a
  zeroed plane.
* :func:`separable`: the reference's ``_separable`` maps (average pooling, adaptive average pooling,
  interpolation, reflect/replicate/circular padding): per dim in turn ``y[i] = t_0 + t_1 + ...`` with
  ``t_j = x[idx[i, j]] * w[i, j]`` (an index equal to the dim's size reads a zero), rounded as NumPy
  rounds each product and sum.
* :func:`separable_backward`: the transposed taps, per dim in turn, as the reference's matrix product
  with a dense tap matrix computes them: each input position sums ``x[o] * W[o, s]`` over the outputs
  ``o`` in increasing order with fused multiply-adds (OpenBLAS's gemm kernels), and a line holding inf
  or NaN gets the dense product's NaN/inf pattern (``0 * inf`` is NaN there).
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import intrinsic, register_jitable

from kiln_cpu._jit_support import _SERIAL, _u


@intrinsic
def _fma(typingctx, x, y, z):
    """``x * y + z`` rounded once (LLVM's ``fma``; one instruction where the CPU has FMA)."""
    if not (x == y == z) or x not in (types.float32, types.float64):
        return None

    def codegen(context, builder, signature, args):
        """One ``llvm.fma`` call."""
        return builder.fma(*args)

    return x(x, y, z), codegen


# ---------------------------------------------------------------------------------------- max pooling


@njit(**_SERIAL)
def max_pool(x, dims, bd, kd0, kd1, bh, kh0, kh1, bw, kw0, kw1, steps, zero, val, ind, lo, hi):
    """Planes [lo, hi) of ``x`` (flat, planes of ``dims = (D, H, W)``): ``val``/``ind`` (flat, planes of
    ``len(bd) x len(bh) x len(bw)``) get each window's maximum and its flat index in the plane (a window
    with no valid element: 0 and -1, as the reference)."""
    d_, h_, w_ = dims
    sd, sh, sw = steps
    od_, oh_, ow_ = bd.shape[0], bh.shape[0], bw.shape[0]
    plane = d_ * h_ * w_
    oplane = od_ * oh_ * ow_
    for p in range(lo, hi):
        xb = p * plane
        ob = p * oplane
        for od in range(od_):
            for oh in range(oh_):
                for ow in range(ow_):
                    best = zero
                    bi = -1
                    for a in range(kd0[od], kd1[od]):
                        zd = bd[od] + a * sd
                        for b in range(kh0[oh], kh1[oh]):
                            row = (zd * h_ + bh[oh] + b * sh) * w_
                            for c in range(kw0[ow], kw1[ow]):
                                f = row + bw[ow] + c * sw
                                v = x[_u(xb + f)]
                                if bi < 0 or v > best or v != v:
                                    best = v
                                    bi = f
                    o = ob + (od * oh_ + oh) * ow_ + ow
                    val[_u(o)] = best
                    ind[_u(o)] = bi


@register_jitable
def _take(v, f, best, bi):
    """The reference's rule for the next element ``v`` at ``f`` of a window: it wins when larger or NaN."""
    c = v > best or v != v
    return (v if c else best), (f if c else bi)


@njit(**_SERIAL)
def max_pool_2x2(x, h_, w_, oh_, ow_, val, ind, lo, hi):
    """Planes [lo, hi) of ``x`` (flat, planes of ``h_ x w_``) pooled by 2x2 windows with stride 2 and
    neither padding nor dilation, every window inside the plane: :func:`max_pool`'s result, its four
    comparisons as selects (the generic loop's branches mispredict on every other element)."""
    plane = h_ * w_
    oplane = oh_ * ow_
    for p in range(lo, hi):
        xb = p * plane
        ob = p * oplane
        for oh in range(oh_):
            r0 = 2 * oh * w_
            r1 = r0 + w_
            xr0 = x[xb + r0 : xb + r0 + 2 * ow_]
            xr1 = x[xb + r1 : xb + r1 + 2 * ow_]
            vo = val[ob + oh * ow_ : ob + (oh + 1) * ow_]
            io = ind[ob + oh * ow_ : ob + (oh + 1) * ow_]
            for ow in range(ow_):
                c = 2 * ow
                best, bi = xr0[c], r0 + c
                best, bi = _take(xr0[c + 1], r0 + c + 1, best, bi)
                best, bi = _take(xr1[c], r1 + c, best, bi)
                best, bi = _take(xr1[c + 1], r1 + c + 1, best, bi)
                vo[ow] = best
                io[ow] = bi


@njit(**_SERIAL)
def argmax_scatter(g, ind, outs, plane, out, bad, lo, hi):
    """Rows [lo, hi) of ``out`` (flat, rows of ``plane``) zeroed, then each ``g[r, o]`` added at
    ``out[r, ind[r, o]]`` in order of ``o`` (``g`` and ``ind`` flat, rows of ``outs``): the max pools'
    backward, as the reference's ``np.add.at`` adds. An index outside the plane sets ``bad[0]`` and stops
    the row (the caller then hands the call to the reference)."""
    zero = out.dtype.type(0)
    for r in range(lo, hi):
        ob = r * plane
        gb = r * outs
        for q in range(plane):
            out[_u(ob + q)] = zero
        for o in range(outs):
            i = ind[gb + o]
            if i < 0 or i >= plane:
                bad[0] = 1
                return
            out[_u(ob + i)] += g[_u(gb + o)]


# ---------------------------------------------------------------------------------------- separable maps


@register_jitable
def _taps_axis(src, s0, a_, n, b_, idx, w, zero, dst, d0):
    """``dst[d0:]`` (``a_ x o x b_``) = the taps ``idx``/``w`` (``k x o``: tap-major) applied along the middle
    dim of ``src[s0:]`` (``a_ x n x b_``); index ``n`` reads zero. Products and sums rounded in NumPy's
    order: ``y = t_0``, then ``y += t_j``."""
    k, o = idx.shape
    last = n - 1
    for a in range(a_):
        if b_ == 1:  # the last dim: vectorised over the outputs (the reads are gathers)
            sb = s0 + a * n
            db = d0 + a * o
            for j in range(k):
                for i in range(o):
                    ix = idx[j, i]
                    v = src[_u(sb + min(ix, last))]
                    t = (v if ix < n else zero) * w[j, i]
                    if j == 0:
                        dst[_u(db + i)] = t
                    else:
                        dst[_u(db + i)] += t
            continue
        for i in range(o):
            ob = d0 + (a * o + i) * b_
            for j in range(k):
                ix = idx[j, i]
                wj = w[j, i]
                if ix >= n:
                    t = zero * wj
                    if j == 0:
                        for b in range(b_):
                            dst[_u(ob + b)] = t
                    else:
                        for b in range(b_):
                            dst[_u(ob + b)] += t
                    continue
                ib = s0 + (a * n + ix) * b_
                if j == 0:
                    for b in range(b_):
                        dst[_u(ob + b)] = src[_u(ib + b)] * wj
                else:
                    for b in range(b_):
                        dst[_u(ob + b)] += src[_u(ib + b)] * wj


@register_jitable
def _split(sizes, outs, nd, i, done_out):
    """(dims before ``i``, dims after ``i``) of a plane whose first ``i`` dims are already mapped: their
    size is ``outs`` (forward) or ``sizes`` (backward, ``done_out`` False swaps the roles)."""
    a_ = 1
    for m in range(i):
        a_ *= outs[m] if done_out else sizes[m]
    b_ = 1
    for m in range(i + 1, nd):
        b_ *= sizes[m] if done_out else outs[m]
    return a_, b_


@register_jitable
def _largest(sizes, outs, nd):
    """The largest intermediate plane (the first ``i`` dims mapped, for every ``i``)."""
    big = 1
    for i in range(nd):
        cur = 1
        for m in range(nd):
            cur *= outs[m] if m <= i else sizes[m]
        big = max(big, cur)
    return big


@njit(**_SERIAL)
def separable(x, sizes, outs, nd, idx0, w0, idx1, w1, idx2, w2, zero, out, lo, hi):
    """Planes [lo, hi) of ``x`` (flat, planes of ``sizes``, the first ``nd`` used) mapped by the taps of
    each dim in turn into ``out`` (planes of ``outs``); pass ``i`` writes buffer ``i % 2``."""
    plane = 1
    oplane = 1
    for i in range(nd):
        plane *= sizes[i]
        oplane *= outs[i]
    big = _largest(sizes, outs, nd)
    buf0 = np.empty(big, out.dtype)
    buf1 = np.empty(big, out.dtype)
    for p in range(lo, hi):
        for i in range(nd):
            a_, b_ = _split(sizes, outs, nd, i, True)
            if i == 0:
                idx, w = idx0, w0
            elif i == 1:
                idx, w = idx1, w1
            else:
                idx, w = idx2, w2
            last = i == nd - 1
            if i == 0:
                if last:
                    _taps_axis(x, p * plane, a_, sizes[i], b_, idx, w, zero, out, p * oplane)
                else:
                    _taps_axis(x, p * plane, a_, sizes[i], b_, idx, w, zero, buf0, 0)
            else:
                src = buf0 if (i - 1) % 2 == 0 else buf1
                if last:
                    _taps_axis(src, 0, a_, sizes[i], b_, idx, w, zero, out, p * oplane)
                else:
                    _taps_axis(src, 0, a_, sizes[i], b_, idx, w, zero, buf1 if i % 2 else buf0, 0)


@register_jitable
def _transposed_axis(src, s0, a_, o, b_, n, rows, vals, dense, zero, nf, dst, d0):
    """``dst[d0:]`` (``a_ x n x b_``) = the transposed taps applied to ``src[s0:]`` (``a_ x o x b_``) along
    the middle dim: ``dst[s] = sum over o of src[o] * W[o, s]``, fused multiply-adds from zero over the
    nonzero ``W[o, s]`` in increasing ``o`` (``rows``/``vals``, ``q x n``: entry ``q`` of each input
    position, padded with weight zero, which adds nothing to a finite sum). A line holding inf or NaN is
    recomputed with the whole column of ``dense`` (``W``), so ``0 * inf`` gives NaN as in the dense
    product."""
    q_ = rows.shape[0]
    for a in range(a_):
        sb = s0 + a * o * b_
        db = d0 + a * n * b_
        if b_ == 1:  # the last dim: vectorised over the input positions (the reads are gathers)
            for s in range(n):
                dst[_u(db + s)] = zero
            for q in range(q_):
                for s in range(n):
                    dst[_u(db + s)] = _fma(src[_u(sb + rows[q, s])], vals[q, s], dst[_u(db + s)])
            bad = 0
            for r in range(o):
                v = src[_u(sb + r)]
                bad += (v - v) != zero  # inf - inf and NaN - NaN are NaN
            nf[0] = zero if bad == 0 else zero / zero
        else:
            for s in range(n):
                ob = db + s * b_
                for b in range(b_):
                    dst[_u(ob + b)] = zero
                for q in range(q_):
                    ib = sb + rows[q, s] * b_
                    wv = vals[q, s]
                    for b in range(b_):
                        dst[_u(ob + b)] = _fma(src[_u(ib + b)], wv, dst[_u(ob + b)])
            for b in range(b_):
                nf[b] = zero
            for r in range(o):
                ib = sb + r * b_
                for b in range(b_):
                    nf[b] += src[_u(ib + b)] * zero  # NaN exactly when the line holds inf or NaN
        for b in range(b_):
            if nf[b] == zero:
                continue
            for s in range(n):
                acc = zero
                for r in range(o):
                    acc = _fma(src[_u(sb + r * b_ + b)], dense[r, s], acc)
                dst[_u(db + s * b_ + b)] = acc


@njit(**_SERIAL)
def separable_backward(g, outs, sizes, nd, t0, t1, t2, zero, out, lo, hi):
    """Planes [lo, hi) of ``g`` (flat, planes of ``outs``) mapped back to planes of ``sizes`` in ``out``
    by the transposed taps of each dim in turn (``t_i = (rows, vals, dense)``); pass ``i`` writes buffer
    ``i % 2``."""
    plane = 1
    oplane = 1
    for i in range(nd):
        plane *= outs[i]
        oplane *= sizes[i]
    big = _largest(outs, sizes, nd)
    buf0 = np.empty(big, out.dtype)
    buf1 = np.empty(big, out.dtype)
    nf = np.empty(big, out.dtype)
    for p in range(lo, hi):
        for i in range(nd):
            a_, b_ = _split(sizes, outs, nd, i, False)
            if i == 0:
                rows, vals, dense = t0
            elif i == 1:
                rows, vals, dense = t1
            else:
                rows, vals, dense = t2
            o, n = outs[i], sizes[i]
            last = i == nd - 1
            if i == 0:
                if last:
                    _transposed_axis(g, p * plane, a_, o, b_, n, rows, vals, dense, zero, nf, out, p * oplane)
                else:
                    _transposed_axis(g, p * plane, a_, o, b_, n, rows, vals, dense, zero, nf, buf0, 0)
            else:
                src = buf0 if (i - 1) % 2 == 0 else buf1
                dst = buf1 if i % 2 else buf0
                if last:
                    _transposed_axis(src, 0, a_, o, b_, n, rows, vals, dense, zero, nf, out, p * oplane)
                else:
                    _transposed_axis(src, 0, a_, o, b_, n, rows, vals, dense, zero, nf, dst, 0)
