"""The Numba loops of kiln-cpu's 2-d convolutions (:mod:`kiln_cpu.kernels_conv`): the blocks of the three
forms (``conv_blocks``, ``conv_transpose_blocks``, ``conv_by_weight_blocks``: the data movement and the
BLAS products, called through :func:`kiln_cpu._jit_gemm.gemm` without the GIL), and the direct loops of
small groups, compiled lazily and cached to disk.

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
part). Where the input's rows lie one after another and the output is as wide as the input at unit
stride ("same" convolutions, and the weight-gradient form's columns), ``im2col_2d`` copies each offset's
valid rows as one shifted span and then zeroes the columns that read past a row's ends
(``_shifted_rows``): rows of 14 pixels are copied at twice the speed of the loop per row. ``col2im_2d``
does the adjoint there (``_add_shifted_rows``): those columns zeroed first, the valid rows added as one
span (14 pixels: 0.37 -> 0.24 ns per element).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kiln_cpu._jit_gemm import NO_TRANS, TRANS, gemm, ptr
from kiln_cpu._jit_support import _SERIAL, _UNCOUNTED, _u, zero_of


@njit(**_SERIAL)
def _valid(off, sw, w, ow):
    """The output columns ``[z0, z1)`` of ``[0, ow)`` whose input column ``z*sw + off`` lies in ``[0, w)``."""
    z0 = 0 if off >= 0 else min(ow, (-off + sw - 1) // sw)
    z1 = max(z0, min(ow, (w - 1 - off) // sw + 1)) if w - 1 - off >= 0 else z0
    return z0, z1


@njit(**_SERIAL)
def _rows_inside(r0, rows, h):
    """The rows ``[ya, yb)`` of ``[0, rows)`` whose image row ``r0 + yy`` lies in ``[0, h)``."""
    ya = min(rows, max(0, -r0))
    return ya, max(ya, min(rows, h - r0))


@njit(**_UNCOUNTED)  # once per kernel offset: no reference counting
def _zero_edges(cols, d0, ya, yb, w, z0, z1, zero):
    """cols[d0 + yy*w + z] = zero for the rows ``[ya, yb)`` and the columns outside ``[z0, z1)``."""
    if z0 > 0 or z1 < w:
        for yy in range(ya, yb):
            d = d0 + yy * w
            for z in range(z0):
                cols[_u(d + z)] = zero
            for z in range(z1, w):
                cols[_u(d + z)] = zero


@njit(**_UNCOUNTED)  # once per kernel offset: no reference counting
def _shifted_rows(xs, base, h, w, cols, d0, r0, rows, off, z0, z1, zero):
    """cols[d0 + yy*w + z] = x[r0 + yy, z + off] for yy < rows, z < w (0 outside the image): the columns
    of one kernel offset when the input's rows lie one after another from ``xs[base]`` and the output is
    as wide as the input at unit stride. The valid rows are copied as one shifted span (a long vector
    loop, not one short loop per row), then the columns that read past a row's ends (``[0, z0)`` and
    ``[z1, w)``) are zeroed. The span starts and ends inside the valid rows, so it reads only the image's
    elements."""
    ya, yb = _rows_inside(r0, rows, h)
    for q in range(d0, d0 + ya * w):
        cols[_u(q)] = zero
    for q in range(d0 + yb * w, d0 + rows * w):
        cols[_u(q)] = zero
    if yb == ya:
        return
    delta = base + r0 * w + off - d0  # x's element of cols[k]: delta + k
    for k in range(d0 + ya * w + max(0, -off), d0 + yb * w - max(0, off)):
        cols[_u(k)] = xs[_u(delta + k)]
    _zero_edges(cols, d0, ya, yb, w, z0, z1, zero)


@njit(**_SERIAL)
def im2col_2d(xs, xo, xst, c_in, h, w, cols, cst, kh, kw, sh, sw, ph, pw, dh, dw, y0, rows, ow, lo, hi):
    """cols[n*cst[0] + ((c*kh + i)*kw + j)*cst[1] + yy*ow + z] = x[n, c, y*sh - ph + i*dh, z*sw - pw + j*dw]
    with y = y0 + yy, yy < rows (0 in the padding), for the (n, c) pairs t = n*c_in + c in [lo, hi).

    ``x`` (images of ``c_in`` channels of ``h`` x ``w``) is the flat storage ``xs`` read from element
    ``xo`` with element strides ``xst`` (any layout); ``cols`` is a flat buffer taking, per image and
    column row, the ``rows*ow`` pixels of output rows ``[y0, y0 + rows)`` contiguously, images
    ``cst[0]`` and rows ``cst[1]`` elements apart (images side by side: (rows, images, pixels)). Rows
    are addressed by their offset in ``cols``, never sliced, and the helpers called per kernel offset
    count no references: with a slice and two counted calls per offset, the columns of four 16-channel
    14x14 images for a 3x3 kernel took 38 us, now 18.5 us (a plain copy of as many bytes: 9.5 us)."""
    s0, s1, s2, s3 = xst
    c0, c1 = cst
    zero = zero_of(cols)
    step = sw * s3
    # rows read as one span: unit strides, rows of the input one after another, as wide as the output's
    span = sh == 1 and sw == 1 and s3 == 1 and s2 == w and ow == w
    for t in range(lo, hi):
        n = t // c_in
        c = t - n * c_in
        base = xo + n * s0 + c * s1
        for i in range(kh):
            for j in range(kw):
                d0 = n * c0 + ((c * kh + i) * kw + j) * c1
                off = j * dw - pw  # input column of output column z: z*sw + off
                z0, z1 = _valid(off, sw, w, ow)
                if span:
                    _shifted_rows(xs, base, h, w, cols, d0, y0 - ph + i * dh, rows, off, z0, z1, zero)
                    continue
                full = z0 == 0 and z1 == ow
                for yy in range(rows):
                    r = (y0 + yy) * sh - ph + i * dh
                    d = d0 + yy * ow
                    if r < 0 or r >= h:
                        for z in range(ow):
                            cols[_u(d + z)] = zero
                        continue
                    src = base + r * s2 + off * s3
                    if step != 1:
                        for z in range(z0):
                            cols[_u(d + z)] = zero
                        for z in range(z0, z1):
                            cols[_u(d + z)] = xs[_u(src + z * step)]
                        for z in range(z1, ow):
                            cols[_u(d + z)] = zero
                    elif full:
                        for z in range(ow):
                            cols[_u(d + z)] = xs[_u(src + z)]
                    else:  # one loop over the row: masked loads, no short loops at the edges
                        for z in range(ow):
                            cols[_u(d + z)] = xs[_u(src + z)] if z >= z0 and z < z1 else zero


@njit(**_UNCOUNTED)  # once per kernel offset: no reference counting
def _add_shifted_rows(out, o0, h, w, cols, d0, r0, rows, off, z0, z1):
    """out[o0 + (r0 + yy)*w + z + off] += cols[d0 + yy*w + z] for the rows inside the image and the columns
    ``[z0, z1)`` whose target lies inside its row: the adjoint of :func:`_shifted_rows`. The columns
    outside ``[z0, z1)`` are zeroed in ``cols`` first (scratch columns), so the valid rows add as one
    shifted span in which they add nothing (``out`` starts at +0.0 and never holds -0.0, so ``+ 0.0``
    changes no element)."""
    ya, yb = _rows_inside(r0, rows, h)
    if yb == ya or z0 >= z1:
        return
    _zero_edges(cols, d0, ya, yb, w, z0, z1, zero_of(cols))
    delta = o0 + r0 * w + off - d0  # out's element of cols[k]: delta + k
    for k in range(d0 + ya * w + max(0, -off), d0 + yb * w - max(0, off)):
        out[_u(delta + k)] += cols[_u(k)]


@njit(**_SERIAL)
def col2im_2d(cols, cst, out, kh, kw, sh, sw, ph, pw, dh, dw, y0, rows, ow, lo, hi):
    """out[n, c, y*sh - ph + i*dh, z*sw - pw + j*dw] += cols[n*cst[0] + ((c*kh + i)*kw + j)*cst[1] + yy*ow + z]
    with y = y0 + yy, yy < rows, over the positions inside ``out``, for the (n, c) pairs t = n*C + c in
    [lo, hi) (the adjoint of :func:`im2col_2d`, same ``cols`` layout). ``out`` (images, C, H, W) is
    C-contiguous; per pixel the kernel offsets add in order (i, j) within one block of rows."""
    _, c_out, h, w = out.shape
    flat = out.reshape(-1)
    c0, c1 = cst
    span = sh == 1 and sw == 1 and ow == w  # as in im2col_2d (``out`` is C-contiguous)
    for t in range(lo, hi):
        n = t // c_out
        c = t - n * c_out
        o0 = t * h * w  # image (n, c) of ``out``
        for i in range(kh):
            for j in range(kw):
                d0 = n * c0 + ((c * kh + i) * kw + j) * c1
                off = j * dw - pw
                z0, z1 = _valid(off, sw, w, ow)
                if span:
                    _add_shifted_rows(flat, o0, h, w, cols, d0, y0 - ph + i * dh, rows, off, z0, z1)
                    continue
                full = z0 == 0 and z1 == ow
                for yy in range(rows):
                    r = (y0 + yy) * sh - ph + i * dh
                    if r < 0 or r >= h:
                        continue
                    d = d0 + yy * ow
                    o = o0 + r * w + off
                    if sw != 1:
                        for z in range(z0, z1):
                            flat[_u(o + z * sw)] += cols[_u(d + z)]
                    elif full:
                        for z in range(ow):
                            flat[_u(o + z)] += cols[_u(d + z)]
                    else:  # masked loads and stores
                        for z in range(ow):
                            if z >= z0 and z < z1:
                                flat[_u(o + z)] += cols[_u(d + z)]


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
def conv_blocks(xs, xo, xst, c_in, h, w, wm, bias, out, cout, geom, plan, addr, ilp64, lo, hi):
    """Blocks [lo, hi) of a convolution: per block, ``im2col_2d`` of ``imgs`` images' rows ``[y0, y0 +
    rows)`` and, per group, the products of the weight matrix ``wm`` (flat, (groups, Cout/groups,
    Cin/groups * kh * kw)) with the columns, by the cblas gemm at ``addr``, into ``out`` (flat, (N, Cout,
    OH*OW)): one product per image straight into place (``apart``), or one for all the block's images
    through a scratch product copied into place (images too small for a product each); then ``bias[o]``
    added to each channel's pixels while they are in the cache (``bias`` empty: none), the product
    rounded first as the reference rounds it.

    ``geom`` is (kh, kw, sh, sw, ph, pw, dh, dw, oh, ow); ``plan`` is (images per block, output rows per
    block, blocks per image group, groups, apart). Block ``u`` covers images from ``(u // blocks) *
    imgs`` and rows from ``(u % blocks) * rows``."""
    kh, kw, sh, sw, ph, pw, dh, dw, oh, ow = geom
    imgs, rows, blocks, groups, apart = plan
    pix = oh * ow
    n = out.size // (cout * pix)
    cog, cig, kk = cout // groups, c_in // groups, kh * kw
    depth = cig * kk
    buf = np.empty(c_in * kk * imgs * rows * ow, out.dtype)
    tmp = np.empty(cog * imgs * rows * ow if imgs > 1 and not apart else 1, out.dtype)
    one, zero = out.dtype.type(1), out.dtype.type(0)
    for u in range(lo, hi):
        n0 = (u // blocks) * imgs
        k = min(imgs, n - n0)
        y0 = (u % blocks) * rows
        r = min(rows, oh - y0)
        rp = r * ow
        kr = k * rp
        im2col_2d(
            xs, xo + n0 * xst[0], xst, c_in, h, w, buf, (rp, kr), kh, kw, sh, sw, ph, pw, dh, dw, y0, r, ow, 0, k * c_in
        )
        for g in range(groups):
            a = ptr(wm, g * cog * depth)
            if k == 1 or apart:
                for i in range(k):
                    at = ((n0 + i) * cout + g * cog) * pix + y0 * ow
                    b = ptr(buf, g * depth * kr + i * rp)
                    gemm(addr, ilp64, NO_TRANS, NO_TRANS, cog, rp, depth, one, a, depth, b, kr, zero, ptr(out, at), pix)
                    if bias.size:
                        for o in range(cog):
                            add = bias[g * cog + o]
                            for q in range(at + o * pix, at + o * pix + rp):
                                out[_u(q)] += add
                continue
            b = ptr(buf, g * depth * kr)
            gemm(addr, ilp64, NO_TRANS, NO_TRANS, cog, kr, depth, one, a, depth, b, kr, zero, ptr(tmp, 0), kr)
            for i in range(k):  # each image's part of the product into place
                for o in range(cog):
                    dst_at = ((n0 + i) * cout + g * cog + o) * pix + y0 * ow
                    src_at = o * kr + i * rp
                    if bias.size:
                        add = bias[g * cog + o]
                        for q in range(rp):
                            out[_u(dst_at + q)] = tmp[_u(src_at + q)] + add
                    else:
                        for q in range(rp):
                            out[_u(dst_at + q)] = tmp[_u(src_at + q)]


@njit(**_SERIAL)
def conv_transpose_blocks(xm, cin, hw, wt, out, geom, plan, addr, ilp64, lo, hi):
    """Image groups [lo, hi) of a transposed convolution: per block of input rows, one product per group of
    the transposed weight (``wt`` flat, (groups, Cin/groups, Cout/groups * kh * kw), read transposed)
    with the input's pixels (``xm`` flat, (N, Cin, H*W); several images copied side by side), by the
    cblas gemm at ``addr``, then ``col2im_2d`` adds the columns into ``out`` ((N, Cout, OH, OW), zeros).

    ``geom`` is (kh, kw, sh, sw, ph, pw, dh, dw, w); ``plan`` is (images per group, input rows per block,
    blocks, groups, apart): ``apart``, one product per image, reading its pixels in place, else one for
    all the group's images copied side by side (images too small for a product each). All blocks of an
    image run in one task: they add into the same rows."""
    kh, kw, sh, sw, ph, pw, dh, dw, w = geom
    imgs, rows, blocks, groups, apart = plan
    n, cout = out.shape[0], out.shape[1]
    h = hw // w
    cig, kk = cin // groups, kh * kw
    cog = cout // groups
    ck = cout * kk
    buf = np.empty(ck * imgs * rows * w, out.dtype)
    xin = np.empty(cin * imgs * rows * w if imgs > 1 and not apart else 1, out.dtype)
    one, zero = out.dtype.type(1), out.dtype.type(0)
    for u in range(lo, hi):
        n0 = u * imgs
        k = min(imgs, n - n0)
        for blk in range(blocks):
            y0 = blk * rows
            r = min(rows, h - y0)
            rp = r * w
            kr = k * rp
            if k == 1 or apart:
                for g in range(groups):
                    a = ptr(wt, g * cig * cog * kk)
                    for i in range(k):
                        b = ptr(xm, ((n0 + i) * cin + g * cig) * hw + y0 * w)
                        c = ptr(buf, g * cog * kk * kr + i * rp)
                        gemm(addr, ilp64, TRANS, NO_TRANS, cog * kk, rp, cig, one, a, cog * kk, b, hw, zero, c, kr)
            else:  # images side by side: (Cin, images, pixels)
                for ci in range(cin):
                    for i in range(k):
                        at = ((n0 + i) * cin + ci) * hw + y0 * w
                        to = ci * kr + i * rp
                        for q in range(rp):
                            xin[_u(to + q)] = xm[_u(at + q)]
                for g in range(groups):
                    a = ptr(wt, g * cig * cog * kk)
                    b = ptr(xin, g * cig * kr)
                    c = ptr(buf, g * cog * kk * kr)
                    gemm(addr, ilp64, TRANS, NO_TRANS, cog * kk, kr, cig, one, a, cog * kk, b, kr, zero, c, kr)
            col2im_2d(buf, (rp, kr), out[n0 : n0 + k], kh, kw, sh, sw, ph, pw, dh, dw, y0, r, w, 0, k * cout)


@njit(**_SERIAL)
def conv_by_weight_blocks(xs, xo, xst, h, w, gm, gst, partial, geom, plan, addr, ilp64, lo, hi):
    """Units [lo, hi) of the weight-gradient form (see :func:`kiln_cpu.kernels_conv._conv_by_weight`): unit
    ``u`` is chunk ``q = u // parts`` of the "weight" channels and rows ``[b0, b0 + chans)`` of the product;
    it adds ``im2col(x_c) @ G_c^T`` over the chunk's channels ``c`` (several side by side) into its
    partial sum ``partial[q, g]`` ((chunks, groups, B*kk, Cout/groups), flat), by the cblas gemm at
    ``addr``: the first product writes, the rest add (``beta = 1``).

    ``x`` is the flat storage ``xs`` from ``xo`` with strides ``xst`` (its channel dim first: images are
    the channels ``c``); ``gm`` the "weight" (Cout, C, KH*KW) as a flat storage with element strides ``gst``
    (unit pixel stride). ``geom`` is (b, cout, cg, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw) and ``plan``
    (imgs, chans, rows, blocks, per, parts, groups, apart, flip): ``apart``, one product per image, else
    one for the block's images, their rows copied side by side (images too small for a product each);
    ``flip``, the gradient's rows copied transposed first, so that BLAS multiplies both operands as they
    lie (else it reads them transposed: in place for one image or per image)."""
    b, cout, cg, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw = geom
    imgs, chans, rows, blocks, per, parts, groups, apart, flip = plan
    cog, kk = cout // groups, oh * ow
    ck = b * kk
    buf = np.empty(chans * kk * imgs * rows * kw, partial.dtype)
    gbuf = np.empty(imgs * rows * kw * cog if flip or (imgs > 1 and not apart) else 1, partial.dtype)
    one, zero = partial.dtype.type(1), partial.dtype.type(0)
    g0, g1 = gst[0], gst[1]
    for u in range(lo, hi):
        q = u // parts
        b0 = (u - q * parts) * chans
        nb = min(chans, b - b0)
        first = q * per
        for c0 in range(first, min(cg, (q + 1) * per), imgs):
            k = min(imgs, cg - c0)
            for g in range(groups):
                t = g * cg + c0
                acc = ptr(partial, ((q * groups + g) * ck + b0 * kk) * cog)
                for blk in range(blocks):
                    y0 = blk * rows
                    r = min(rows, kh - y0)
                    rp = r * kw
                    kr = k * rp
                    im2col_2d(
                        xs, xo + t * xst[0] + b0 * xst[1], xst, nb, h, w, buf, (rp, kr),
                        oh, ow, dh, dw, ph, pw, sh, sw, y0, r, kw, 0, k * nb,
                    )  # fmt: skip
                    at = g * cog * g0 + c0 * g1 + y0 * kw
                    if flip:  # the images' gradient rows transposed: (images, pixels, Cout/groups)
                        for i in range(k):
                            for o in range(cog):
                                fr = at + o * g0 + i * g1
                                to = i * rp * cog + o
                                for p in range(rp):
                                    gbuf[_u(to + p * cog)] = gm[_u(fr + p)]
                    elif k > 1 and not apart:  # the images' rows side by side: (Cout/groups, images, pixels)
                        for o in range(cog):
                            for i in range(k):
                                fr = at + o * g0 + i * g1
                                to = o * kr + i * rp
                                for p in range(rp):
                                    gbuf[_u(to + p)] = gm[_u(fr + p)]
                    depth, m = (rp if apart else kr), nb * kk
                    for i in range(k if apart else 1):
                        beta = zero if c0 == first and blk == 0 and i == 0 else one
                        a = ptr(buf, i * rp)
                        if flip:
                            gp = ptr(gbuf, i * rp * cog)
                            gemm(addr, ilp64, NO_TRANS, NO_TRANS, m, cog, depth, one, a, kr, gp, cog, beta, acc, cog)
                        elif k == 1 or apart:  # the rows read in place
                            gp = ptr(gm, at + i * g1)
                            gemm(addr, ilp64, NO_TRANS, TRANS, m, cog, depth, one, a, kr, gp, g0, beta, acc, cog)
                        else:
                            gp = ptr(gbuf, 0)
                            gemm(addr, ilp64, NO_TRANS, TRANS, m, cog, depth, one, a, kr, gp, kr, beta, acc, cog)


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
