"""The Numba loops of kiln-cpu's 2-d convolutions (:mod:`kiln_cpu.kernels_conv`): the data movement around
the BLAS products, and the direct loops of small groups, compiled lazily and cached to disk.

``im2col_2d`` copies the sliding windows of images into columns (padding written as zeros, any input
layout read in place, no padded copy) and ``col2im_2d`` scatter-adds columns back into images (its
adjoint). Both take a block of output rows ``[y0, y0 + rows)`` of one or more images (columns laid out
(rows, images, pixels)), so a block's columns stay in the cache between the copy and the product, and
one task per (image, channel) pair: tasks never write the same memory. ``sum_partials_2d`` adds the
weight-gradient form's partial sums in order into the result's layout. ``conv_direct_2d`` and
``conv_transpose_direct_2d`` compute grouped convolutions too small per group for BLAS (depthwise), one
output plane per task, products added in order from zero (no ``fastmath``: no fused multiply-adds).

The valid output columns of each kernel offset are found once per offset, so the inner loops have no
bounds test and, at unit stride, vectorise (a row with padding at its ends is one loop whose loads and
stores are conditional: masked vector loads and stores, which touch nothing outside the row's valid
part).
"""

from __future__ import annotations

from numba import njit

from kiln_cpu._jit import _SERIAL, _u, zero_of


@njit(**_SERIAL)
def _valid(off, sw, w, ow):
    """The output columns ``[z0, z1)`` of ``[0, ow)`` whose input column ``z*sw + off`` lies in ``[0, w)``."""
    z0 = 0 if off >= 0 else min(ow, (-off + sw - 1) // sw)
    z1 = max(z0, min(ow, (w - 1 - off) // sw + 1)) if w - 1 - off >= 0 else z0
    return z0, z1


@njit(**_SERIAL)
def im2col_2d(xs, xo, xst, c_in, h, w, cols, cst, kh, kw, sh, sw, ph, pw, dh, dw, y0, rows, ow, lo, hi):
    """cols[n*cst[0] + ((c*kh + i)*kw + j)*cst[1] + yy*ow + z] = x[n, c, y*sh - ph + i*dh, z*sw - pw + j*dw]
    with y = y0 + yy, yy < rows (0 in the padding), for the (n, c) pairs t = n*c_in + c in [lo, hi).

    ``x`` (images of ``c_in`` channels of ``h`` x ``w``) is the flat storage ``xs`` read from element
    ``xo`` with element strides ``xst`` (any layout); ``cols`` is a flat buffer taking, per image and
    column row, the ``rows*ow`` pixels of output rows ``[y0, y0 + rows)`` contiguously, images
    ``cst[0]`` and rows ``cst[1]`` elements apart (images side by side: (rows, images, pixels))."""
    s0, s1, s2, s3 = xst
    c0, c1 = cst
    zero = zero_of(cols)
    step = sw * s3
    for t in range(lo, hi):
        n = t // c_in
        c = t - n * c_in
        base = xo + n * s0 + c * s1
        for i in range(kh):
            for j in range(kw):
                crow = cols[n * c0 + ((c * kh + i) * kw + j) * c1 :]
                off = j * dw - pw  # input column of output column z: z*sw + off
                z0, z1 = _valid(off, sw, w, ow)
                full = z0 == 0 and z1 == ow
                for yy in range(rows):
                    r = (y0 + yy) * sh - ph + i * dh
                    d = yy * ow
                    if r < 0 or r >= h:
                        for z in range(ow):
                            crow[_u(d + z)] = zero
                        continue
                    src = base + r * s2 + off * s3
                    if step != 1:
                        for z in range(z0):
                            crow[_u(d + z)] = zero
                        for z in range(z0, z1):
                            crow[_u(d + z)] = xs[_u(src + z * step)]
                        for z in range(z1, ow):
                            crow[_u(d + z)] = zero
                    elif full:
                        for z in range(ow):
                            crow[_u(d + z)] = xs[_u(src + z)]
                    else:  # one loop over the row: masked loads, no short loops at the edges
                        for z in range(ow):
                            crow[_u(d + z)] = xs[_u(src + z)] if z >= z0 and z < z1 else zero


@njit(**_SERIAL)
def col2im_2d(cols, cst, out, kh, kw, sh, sw, ph, pw, dh, dw, y0, rows, ow, lo, hi):
    """out[n, c, y*sh - ph + i*dh, z*sw - pw + j*dw] += cols[n*cst[0] + ((c*kh + i)*kw + j)*cst[1] + yy*ow + z]
    with y = y0 + yy, yy < rows, over the positions inside ``out``, for the (n, c) pairs t = n*C + c in
    [lo, hi) (the adjoint of :func:`im2col_2d`, same ``cols`` layout). ``out`` (images, C, H, W) is
    C-contiguous; per pixel the kernel offsets add in order (i, j) within one block of rows."""
    _, c_out, h, w = out.shape
    c0, c1 = cst
    for t in range(lo, hi):
        n = t // c_out
        c = t - n * c_out
        img = out[n, c].reshape(-1)
        for i in range(kh):
            for j in range(kw):
                crow = cols[n * c0 + ((c * kh + i) * kw + j) * c1 :]
                off = j * dw - pw
                z0, z1 = _valid(off, sw, w, ow)
                full = z0 == 0 and z1 == ow
                for yy in range(rows):
                    r = (y0 + yy) * sh - ph + i * dh
                    if r < 0 or r >= h:
                        continue
                    d = yy * ow
                    o = r * w + off
                    if sw != 1:
                        for z in range(z0, z1):
                            img[_u(o + z * sw)] += crow[_u(d + z)]
                    elif full:
                        for z in range(ow):
                            img[_u(o + z)] += crow[_u(d + z)]
                    else:  # masked loads and stores
                        for z in range(ow):
                            if z >= z0 and z < z1:
                                img[_u(o + z)] += crow[_u(d + z)]


@njit(**_SERIAL)
def conv_direct_2d(xs, xo, xst, h, w, wt, out, cog, sh, sw, ph, pw, dh, dw, lo, hi):
    """out[n, o, y, z] = sum over (ci, i, j) of wt[o, ci, i, j] * x[n, g*cig + ci, y*sh - ph + i*dh,
    z*sw - pw + j*dw] with g = o // cog (0 in the padding), for the (n, o) pairs t = n*Cout + o in
    [lo, hi): a grouped convolution without im2col, for groups too small for BLAS (depthwise).

    ``x`` is read in place (flat storage ``xs``, offset ``xo``, element strides ``xst``); ``wt``
    (Cout, cig, kh, kw) and ``out`` (N, Cout, OH, OW) are C-contiguous. Per pixel the products add in
    order (ci, i, j), from zero."""
    s0, s1, s2, s3 = xst
    _, c_out, oh, ow = out.shape
    _, cig, kh, kw = wt.shape
    zero = zero_of(out)
    for t in range(lo, hi):
        n = t // c_out
        o = t - n * c_out
        acc = out[n, o].reshape(-1)
        for q in range(oh * ow):
            acc[q] = zero
        for ci in range(cig):
            base = xo + n * s0 + ((o // cog) * cig + ci) * s1
            for i in range(kh):
                for j in range(kw):
                    wv = wt[o, ci, i, j]
                    off = j * dw - pw
                    z0, z1 = _valid(off, sw, w, ow)
                    for y in range(oh):
                        r = y * sh - ph + i * dh
                        if r < 0 or r >= h:
                            continue
                        src = base + r * s2 + off * s3
                        d = y * ow
                        if sw * s3 == 1:  # masked loads and stores: one vector loop over the row
                            for z in range(ow):
                                if z >= z0 and z < z1:
                                    acc[_u(d + z)] += wv * xs[_u(src + z)]
                        else:
                            step = sw * s3
                            for z in range(z0, z1):
                                acc[_u(d + z)] += wv * xs[_u(src + z * step)]


@njit(**_SERIAL)
def conv_transpose_direct_2d(xs, xo, xst, h, w, wt, out, cig, sh, sw, ph, pw, dh, dw, lo, hi):
    """out[n, o, y*sh - ph + i*dh, z*sw - pw + j*dw] += wt[g*cig + ci, o - g*cog, i, j] * x[n, g*cig + ci, y, z]
    over the positions inside ``out`` (g = o // cog), for the (n, o) pairs t = n*Cout + o in [lo, hi):
    a grouped transposed convolution without col2im, for groups too small for BLAS (depthwise).

    ``x`` (N, Cin, h, w) is read in place (flat storage ``xs``, offset ``xo``, element strides ``xst``);
    ``wt`` (Cin, cog, kh, kw) and ``out`` (N, Cout, OH, OW) are C-contiguous; ``out`` is written whole.
    Per pixel the products add in order (ci, i, j), from zero."""
    s0, s1, s2, s3 = xst
    _, c_out, oh, ow = out.shape
    _, cog, kh, kw = wt.shape
    zero = zero_of(out)
    for t in range(lo, hi):
        n = t // c_out
        o = t - n * c_out
        g = o // cog
        img = out[n, o].reshape(-1)
        for q in range(oh * ow):
            img[q] = zero
        for ci in range(cig):
            c = g * cig + ci
            base = xo + n * s0 + c * s1
            for i in range(kh):
                for j in range(kw):
                    wv = wt[c, o - g * cog, i, j]
                    off = j * dw - pw  # output column of input column z: z*sw + off
                    z0, z1 = _valid(off, sw, ow, w)
                    for y in range(h):
                        r = y * sh - ph + i * dh
                        if r < 0 or r >= oh:
                            continue
                        src = base + y * s2
                        d = r * ow + off
                        if sw == 1 and s3 == 1:  # masked loads and stores: one vector loop over the row
                            for z in range(w):
                                if z >= z0 and z < z1:
                                    img[_u(d + z)] += wv * xs[_u(src + z)]
                        else:
                            for z in range(z0, z1):
                                img[_u(d + z * sw)] += wv * xs[_u(src + z * s3)]


@njit(**_SERIAL)
def sum_partials_2d(partial, out, lo, hi):
    """out[b, g*cog + o, ij] = partial[0, g, b*kk + ij, o] + partial[1, ...] + ... (the chunks in order) for
    the rows b in [lo, hi): the weight-gradient form's partial sums, each (groups, B*kk, cog), added and
    laid out as the (B, Cout, kk) result. Both arrays are C-contiguous."""
    chunks, groups, _, cog = partial.shape
    kk = out.shape[2]
    for b in range(lo, hi):
        for g in range(groups):
            for ij in range(kk):
                row = b * kk + ij
                for o in range(cog):
                    s = partial[0, g, row, o]
                    for q in range(1, chunks):
                        s += partial[q, g, row, o]
                    out[b, g * cog + o, ij] = s
