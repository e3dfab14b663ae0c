"""kiln-cpu's 2-d convolutions (op ``convolution``: forward, transposed, and the weight-gradient form):
the products on BLAS (``np.matmul``), the data movement around them in Numba (:mod:`kiln_cpu._jit_conv`).

The work is cut into blocks of output rows of one image, or of several whole images side by side (the
columns laid out (rows, images, pixels), so one product covers them all), sized so the columns stay in
the L2 cache (:data:`_BLOCK_BYTES`) but each product is at least :data:`_MIN_DEPTH` pixels wide: each
block is copied into columns and multiplied while they are still in the cache. On the pool each thread
takes the next block as it finishes one, NumPy's OpenBLAS set to one thread meanwhile
(:mod:`kiln_cpu._blas`); where the count cannot be set (another BLAS) or there are fewer blocks than
threads, the blocks run in order on the calling thread, each Numba loop split over the pool, and BLAS
uses the threads the products warrant (:func:`kiln_cpu._blas.threads_for`).

- Convolution: per block, ``im2col_2d`` (padding written as zeros, any input layout read in place, no
  padded copy) and one product per group of the weight matrix with the columns, landing in NCHW order.
- Transposed convolution (the input's gradient): per block, one product per group of the transposed
  weight matrix with the input's pixels, then ``col2im_2d`` scatter-adds the columns into the output
  (all blocks of an image in one task, so no two tasks write the same image).
- The weight's gradient arrives as a convolution whose "batch" is the input's channels and whose
  "weight" is the output's gradient, larger in space than the result (core ``_weight_grad``; the input
  is a permuted view, read in place). Whenever the weight is larger than the output in space, the kernel
  sums over the weight's channels ``c`` (the original batch) ``im2col(x_c) @ G_c^T`` (the result
  transposed: BLAS is faster that way round): images side by side in one product, rows split into blocks
  for small images. Images add in a fixed order within fixed chunks (:data:`_CHUNKS`), whose partial sums
  ``sum_partials_2d`` adds in order into the result's layout: the result does not depend on the thread
  count.
- Grouped convolutions whose per-group products are tiny (fewer than :data:`_MIN_GROUP_WORK`
  multiply-adds per output pixel: depthwise) run the direct loops ``conv_direct_2d`` and
  ``conv_transpose_direct_2d`` instead, one output plane per task.

The bias is added in place at the end, as the reference adds it. Results match the reference up to the
order in which products are summed (BLAS blocks differently than the reference's one product). Handed
back to the reference: other dims (1-d, 3-d), dtypes other than float32/float64 (or mixed, e.g. a
transposed convolution's float32 bias on float64), empty results or inputs, and fewer columns (multiply-
adds per kernel offset) than :data:`kiln_cpu.config.min_numel`.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import OPS
from kiln._reference import wrap_reference
from kiln._tensor import from_array
from kiln_cpu import _blas, _threads, config
from kiln_cpu.kernels import _GRAIN, loops, parallel

FLOAT = (dt.float32, dt.float64)
_BLOCK_BYTES = 1 << 19
"""Bytes of columns per block: with the weight and the product's packed panels a block stays in a 2 MiB
L2 cache (measured at 64 channels, 3x3, 32x32: 512 KiB a few % faster than 256 KiB, 1 and 2.3 MiB)."""
_MIN_GROUP_WORK = 64
"""Multiply-adds per output pixel and group (input channels per group x kernel size x output channels per
group) below which the per-group products are too small for BLAS (depthwise): the direct loops run
(measured at 32x64x32x32, 3x3: depthwise 18x faster than the reference; 8 channels per group, 576
multiply-adds, faster by BLAS)."""
_MIN_DEPTH = 256
"""Pixels per product at least (several small images side by side), even past :data:`_BLOCK_BYTES`: BLAS
runs narrower products (or, in the weight-gradient form, shallower ones, which also leave many partial
sums to add) at a fraction of its speed."""
_CHUNKS = 16
"""The weight gradient's partial sums: the weight's channels (the original batch) are split into at most
this many fixed chunks, whatever the thread count (a deterministic result)."""
_PARTIAL_BYTES = 1 << 25
"""Memory for the weight gradient's partial sums at most (fewer chunks for large weights)."""

_loops = loops("_jit_conv")


def _run_units(make, units: int, macs: int) -> None:
    """Run the ``units`` blocks: ``make()`` gives a function running block ``u`` (with its own scratch
    buffers) whose products make ``macs`` multiply-adds. On the pool, with BLAS set to one thread, each
    thread takes the next block as it finishes one (blocks are not tied to threads: a thread slowed by
    another process holds up little) when there are enough blocks and the BLAS's thread count can be set
    (:mod:`kiln_cpu._blas`); else in order on the calling thread, BLAS on the threads its products
    warrant."""
    if _serial_blocks(units):
        run = make()
        with _blas.limit(_blas.threads_for(macs)):
            for u in range(units):
                run(u)
        return
    ticket = itertools.count()  # next() on it is atomic under the GIL: each block runs once

    def worker(lo, hi):
        run = make()
        for u in iter(ticket.__next__, None):
            if u >= units:
                return
            run(u)

    with _blas.limit(1):
        parallel(worker, (), min(_threads.get_num_threads(), units), 1)


def _serial_blocks(units: int) -> bool:
    """Whether :func:`_run_units` will run the units on the calling thread (then each Numba loop is split
    over the pool itself)."""
    threads = _threads.get_num_threads()
    return threads <= 1 or units < threads or _blas.functions() is None


def _numba(fn, args: tuple, tasks: int, serial: bool) -> None:
    """``fn(*args, 0, tasks)``, split over the pool when the blocks run on the calling thread."""
    if serial:
        parallel(fn, args, tasks, 1)
    else:
        fn(*args, 0, tasks)


# ------------------------------------------------------------------------------------------ layout


def _plan(ck: int, rows: int, cols: int, n: int, itemsize: int) -> tuple[int, int]:
    """(images per block, output rows per block) for columns of ``ck`` rows over a ``rows`` x ``cols``
    grid: whole images while they fit in :data:`_BLOCK_BYTES`, else rows of one image; but at least
    :data:`_MIN_DEPTH` pixels per block (BLAS is slow on narrower products, and blocks its own way)."""
    need = -(-_MIN_DEPTH // cols)
    fit = max(1, _BLOCK_BYTES // (ck * cols * itemsize), need)
    if fit < rows:
        return 1, fit
    return max(1, min(n, max(fit // rows, -(-need // rows)))), rows


def _storage(t) -> tuple:
    """(flat storage, offset, 4 element strides) of a 4-d tensor, read in place by the Numba loops."""
    return t._storage, t._offset, tuple(t._stride)


def _matrices(a: np.ndarray) -> np.ndarray:
    """``a`` (N, C, H, W) as (N, C, H*W) matrices BLAS takes as they are (unit inner stride), copied only
    when the layout does not allow it."""
    n, c, h, w = a.shape
    m = a.reshape(n, c, h * w)
    s = a.itemsize
    if m.strides[2] != s or (c > 1 and m.strides[1] < h * w * s) or (n > 1 and m.strides[0] <= 0):
        m = np.ascontiguousarray(m)
    return m


# ------------------------------------------------------------------------------------ convolution


def _conv(x, weight, s, p, d, groups, oh, ow, dtype) -> np.ndarray:
    """The convolution of the 4-d tensor ``x`` by ``weight`` as a new (N, Cout, OH*OW) array."""
    n, c, h, w = x._shape
    cout, cig, kh, kw = weight._shape
    cog, kk = cout // groups, kh * kw
    ck, pix = c * kk, oh * ow
    out = np.empty((n, cout, pix), dtype)
    wm = np.ascontiguousarray(weight._numpy()).reshape(groups, cog, cig * kk)
    imgs, rows = _plan(ck, oh, ow, n, out.itemsize)
    blocks = -(-oh // rows)
    units = -(-n // imgs) * blocks
    serial = _serial_blocks(units)
    xs, xo, xst = _storage(x)
    im2col = _loops().im2col_2d
    (sh, sw), (ph, pw), (dh, dw) = s, p, d

    def make():
        buf = np.empty(ck * imgs * rows * ow, dtype)
        tmp = np.empty(cog * imgs * pix, dtype) if imgs > 1 else None

        def run(u):
            n0 = (u // blocks) * imgs
            k = min(imgs, n - n0)
            y0 = (u % blocks) * rows
            r = min(rows, oh - y0)
            rp = r * ow
            cols = buf[: ck * k * rp].reshape(ck, k * rp)  # (rows, images, pixels)
            args = (xs, xo + n0 * xst[0], xst, c, h, w, buf, (rp, k * rp), kh, kw, sh, sw, ph, pw, dh, dw, y0, r, ow)
            _numba(im2col, args, k * c, serial)
            for g in range(groups):
                wg, cg = wm[g], cols[g * cig * kk : (g + 1) * cig * kk]
                dst = out[n0 : n0 + k, g * cog : (g + 1) * cog, y0 * ow : y0 * ow + rp]
                if k == 1:
                    np.matmul(wg, cg, out=dst[0])
                else:  # images side by side: one product, then each image's part into place
                    prod = tmp[: cog * k * rp].reshape(cog, k * rp)
                    np.matmul(wg, cg, out=prod)
                    np.copyto(dst, prod.reshape(cog, k, rp).transpose(1, 0, 2))

        return run

    _run_units(make, units, cog * cig * kk * imgs * rows * ow)  # the largest product's multiply-adds
    return out


def _conv_transpose(x, weight, s, p, d, groups, oh, ow, dtype) -> np.ndarray:
    """The transposed convolution of the 4-d tensor ``x`` (N, Cin, H, W) by ``weight`` (Cin, Cout/groups,
    kh, kw) as a new (N, Cout, OH, OW) array: per block, the weight's columns times the input's pixels,
    scatter-added into the output."""
    n, cin, h, w = x._shape
    _, cog, kh, kw = weight._shape
    cig, kk = cin // groups, kh * kw
    cout = cog * groups
    ck = cout * kk
    out = np.zeros((n, cout, oh, ow), dtype)
    wt = np.ascontiguousarray(weight._numpy()).reshape(groups, cig, cog * kk).transpose(0, 2, 1)
    xm = _matrices(x._numpy())
    imgs, rows = _plan(ck, h, w, n, out.itemsize)
    blocks = -(-h // rows)
    units = -(-n // imgs)  # all row blocks of an image in one task: they add into the same rows
    serial = _serial_blocks(units)
    col2im = _loops().col2im_2d
    (sh, sw), (ph, pw), (dh, dw) = s, p, d

    def make():
        buf = np.empty(ck * imgs * rows * w, dtype)
        xin = np.empty(cin * imgs * h * w, dtype) if imgs > 1 else None

        def run(u):
            n0 = u * imgs
            k = min(imgs, n - n0)
            for b in range(blocks):
                y0 = b * rows
                r = min(rows, h - y0)
                rp = r * w
                cols = buf[: ck * k * rp].reshape(ck, k * rp)  # (rows, images, pixels)
                src = xm[n0 : n0 + k, :, y0 * w : y0 * w + rp]
                if k == 1:
                    src = src[0]
                else:  # images side by side
                    np.copyto(xin[: cin * k * rp].reshape(cin, k, rp), src.transpose(1, 0, 2))
                    src = xin[: cin * k * rp].reshape(cin, k * rp)
                for g in range(groups):
                    np.matmul(wt[g], src[g * cig : (g + 1) * cig], out=cols[g * cog * kk : (g + 1) * cog * kk])
                args = (buf, (rp, k * rp), out[n0 : n0 + k], kh, kw, sh, sw, ph, pw, dh, dw, y0, r, w)
                _numba(col2im, args, k * cout, serial)

        return run

    _run_units(make, units, cog * kk * cig * imgs * rows * w)
    return out


def _by_weight_plan(b: int, kk: int, kh: int, kw: int, cg: int, itemsize: int) -> tuple[int, int, int]:
    """(images, channels, output rows) per block of the weight-gradient form, whose product is
    (channels*kk, images*pixels) @ (images*pixels, Cout/groups): whole images while one fits, at least
    :data:`_MIN_DEPTH` pixels deep (small images: fewer channels per block instead), else rows of one."""
    pix = kh * kw
    if pix >= _MIN_DEPTH:
        imgs, rows = _plan(b * kk, kh, kw, cg, itemsize)
        return imgs, b, rows
    imgs = min(cg, -(-_MIN_DEPTH // pix))
    chans = min(b, max(1, _BLOCK_BYTES // (kk * pix * imgs * itemsize)))
    if chans == b:  # whole images fit: as many as the block holds
        imgs = min(cg, max(imgs, _BLOCK_BYTES // (b * kk * pix * itemsize)))
    return imgs, chans, kh


def _conv_by_weight(x, weight, s, p, d, groups, oh, ow, dtype) -> np.ndarray:
    """The convolution of ``x`` (B, Cx, H, W) by ``weight`` (Cout, Cx/groups, KH, KW) as a new
    (B, Cout, OH, OW) array, as a sum over the channels ``c`` of ``im2col(x[:, c]) @ weight[:, c]^T`` (per
    group; several channels side by side in one product when they are small): the weight gradient's
    form, where the "weight" (the output's gradient) is larger than the result. Blocks split the
    product's rows (``x``'s batch) and its depth (the channels ``c``, in fixed chunks with a partial sum
    each, then added in order: the result does not depend on the thread count)."""
    b, _, h, w = x._shape
    cout, cg, kh, kw = weight._shape
    cog, kk = cout // groups, oh * ow
    ck, pix = b * kk, kh * kw
    # the channels as images: x[:, t] is image t of b channels, the sliding window is the result's grid
    # (stride and dilation exchanged), and the columns' grid is the weight's
    xs, xo, (s0, s1, s2, s3) = _storage(x)
    xst = (s1, s0, s2, s3)
    gm = _matrices(weight._numpy())  # (Cout, Cx/groups, KH*KW)
    itemsize = np.dtype(dtype).itemsize
    imgs, chans, rows = _by_weight_plan(b, kk, kh, kw, cg, itemsize)
    blocks = -(-kh // rows)
    chunks = max(1, min(_CHUNKS, _PARTIAL_BYTES // (ck * cout * itemsize)))
    per = -(-cg // chunks)
    per = imgs * -(-per // imgs)  # channels c per chunk: a multiple of the images per block
    chunks = -(-cg // per)
    if chunks * -(-b // chans) < _CHUNKS // 2:  # few units: split the rows too (at least 128 per product)
        chans = min(chans, max(-(-b // (_CHUNKS // 2 // chunks)), -(-128 // kk)))
    parts = -(-b // chans)
    partial = np.empty((chunks, groups, ck, cog), dtype)  # transposed: BLAS runs faster this way round
    units = chunks * parts  # a unit writes its rows of its chunk's partial sum
    serial = _serial_blocks(units)
    im2col = _loops().im2col_2d
    (sh, sw), (ph, pw), (dh, dw) = s, p, d

    def make():
        buf = np.empty(chans * kk * imgs * rows * kw, dtype)
        gbuf = np.empty(cog * imgs * pix, dtype) if imgs > 1 else None
        prod = np.empty(chans * kk * cog, dtype)

        def run(u):
            q, m = divmod(u, parts)
            b0 = m * chans
            nb = min(chans, b - b0)
            acc = partial[q, :, b0 * kk : (b0 + nb) * kk]
            out = prod[: nb * kk * cog].reshape(nb * kk, cog)
            first = q * per
            for c0 in range(first, min(cg, (q + 1) * per), imgs):
                k = min(imgs, cg - c0)
                for g in range(groups):
                    t = g * cg + c0
                    for blk in range(blocks):
                        y0 = blk * rows
                        r = min(rows, kh - y0)
                        rp = r * kw
                        cols = buf[: nb * kk * k * rp].reshape(nb * kk, k * rp)  # (rows, images, pixels)
                        args = (xs, xo + t * xst[0] + b0 * xst[1], xst, nb, h, w, buf, (rp, k * rp))
                        args += (oh, ow, dh, dw, ph, pw, sh, sw, y0, r, kw)
                        _numba(im2col, args, k * nb, serial)
                        gblk = gm[g * cog : (g + 1) * cog, c0 : c0 + k, y0 * kw : y0 * kw + rp]
                        if k == 1:
                            gblk = gblk[:, 0]
                        else:
                            np.copyto(gbuf[: cog * k * rp].reshape(cog, k, rp), gblk)
                            gblk = gbuf[: cog * k * rp].reshape(cog, k * rp)
                        if c0 == first and blk == 0:
                            np.matmul(cols, gblk.T, out=acc[g])
                        else:
                            np.matmul(cols, gblk.T, out=out)
                            np.add(acc[g], out, out=acc[g])

        return run

    _run_units(make, units, chans * kk * imgs * rows * kw * cog)
    result = np.empty((b, cout, kk), dtype)  # partial[q, g, (bb, i, j), o] adds into (bb, g*cog + o, i, j)
    parallel(_loops().sum_partials_2d, (partial, result), b, max(1, _GRAIN // (cout * kk * chunks)))
    return result.reshape(b, cout, oh, ow)


def _direct(x, weight, s, p, d, transposed, groups, shape, dtype) -> np.ndarray:
    """A grouped (transposed) convolution too small per group for BLAS, by the direct Numba loops: one
    task per output plane."""
    out = np.empty(shape, dtype)
    wt = np.ascontiguousarray(weight._numpy())
    xs, xo, xst = _storage(x)
    (sh, sw), (ph, pw), (dh, dw) = s, p, d
    j = _loops()
    per_task = math.prod(shape[2:]) * math.prod(weight._shape[1:])  # multiply-adds per output plane
    if transposed:
        loop, extra = j.conv_transpose_direct_2d, x._shape[1] // groups
    else:
        loop, extra = j.conv_direct_2d, shape[1] // groups
    args = (xs, xo, xst, x._shape[2], x._shape[3], wt, out, extra, sh, sw, ph, pw, dh, dw)
    parallel(loop, args, shape[0] * shape[1], max(1, _GRAIN // per_task))
    return out


def _conv_kernel():
    reference = wrap_reference(OPS["convolution"])

    def kernel(spec, input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
        args = (spec, input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
        shape, d = spec[0], spec[1]
        if (
            d not in FLOAT
            or len(shape) != 4
            or input._dtype is not d
            or weight._dtype is not d
            or (bias is not None and bias._dtype is not d)
            or math.prod(shape) == 0
            or math.prod(input._shape) == 0
        ):
            return reference(*args)
        s, p, dil, _ = spec[3]
        n, cx = input._shape[:2]
        wc0, wc1, kh, kw = weight._shape
        oh, ow = shape[2:]
        if transposed:
            per_pixel, cols = (wc0 // groups) * wc1 * kh * kw, n * wc1 * groups * kh * kw * math.prod(input._shape[2:])
        else:
            per_pixel, cols = wc1 * kh * kw * (wc0 // groups), n * cx * kh * kw * oh * ow
        if cols < config.min_numel:
            return reference(*args)
        np_dtype = d.numpy
        if groups > 1 and per_pixel < _MIN_GROUP_WORK:
            out = _direct(input, weight, s, p, dil, transposed, groups, shape, np_dtype)
        elif transposed:
            out = _conv_transpose(input, weight, s, p, dil, groups, oh, ow, np_dtype)
        elif oh * ow < kh * kw:
            out = _conv_by_weight(input, weight, s, p, dil, groups, oh, ow, np_dtype)
        else:
            out = _conv(input, weight, s, p, dil, groups, oh, ow, np_dtype)
        out = out.reshape(shape)
        if bias is not None:
            out += bias._numpy().reshape(-1, 1, 1)
        return from_array(out, d)

    kernel.__name__ = "kiln_cpu_convolution"
    kernel.__doc__ = "im2col/col2im (Numba) + BLAS kernel for 2-d convolutions and their gradients (kiln-cpu)."
    return kernel


def kernels() -> dict[str, tuple]:
    """The convolution kernels: op name -> (kernel, output dtypes served)."""
    return {"convolution": (_conv_kernel(), FLOAT)}
