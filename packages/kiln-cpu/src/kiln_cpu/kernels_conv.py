"""kiln-cpu's 2-d convolutions (op ``convolution``: forward, transposed, and the weight-gradient form):
Numba loops over blocks (:mod:`kiln_cpu._jit_conv`) that move the data and call NumPy's BLAS gemm
themselves (:mod:`kiln_cpu._jit_gemm`), so a thread runs its blocks, products included, without taking
the GIL (Python glue around ``np.matmul`` on two threads lost up to half of the second one waiting for
the GIL: a small CNN's convolutions took 7.2 ms, now 5.9 ms).

The work is cut into blocks of output rows of one image, or of several whole images side by side (the
columns laid out (rows, images, pixels), so one product covers them all), sized so the columns stay in the
L2 cache (:data:`_BLOCK_BYTES`) but each block is at least :data:`_MIN_DEPTH` pixels wide: each block is
copied into columns and multiplied while they are still in the cache. Each image of a block gets its own
products, read from and written to its own memory, once an image's part is wide enough
(:data:`_APART_WIDTH`, :data:`_APART_DEPTH`): OpenBLAS runs a product per 14x14 image faster than one four
images wide, and no copy into or out of a scratch product is needed. Smaller images share one product,
copied side by side. With at least as many blocks as threads they are split over the pool, NumPy's OpenBLAS
set to one thread meanwhile (:mod:`kiln_cpu._blas`); else they run in order on the calling thread and BLAS
uses the threads the products warrant (:func:`kiln_cpu._blas.threads_for`).

- Convolution: per block, ``im2col_2d`` (padding written as zeros, any input layout read in place, no
  padded copy) and the products of the weight matrix with the columns, landing in NCHW order.
- Transposed convolution (the input's gradient): per block, the products of the transposed weight
  matrix with the input's pixels, then ``col2im_2d`` scatter-adds the columns into the output
  (all blocks of an image in one task, so no two tasks write the same image).
- The weight's gradient arrives as a convolution whose "batch" is the input's channels and whose "weight" is
  the output's gradient, larger in space than the result (core ``_weight_grad``; the input is a permuted
  view, read in place). Whenever the weight is larger than the output in space, the kernel sums over the
  weight's channels ``c`` (the original batch) ``im2col(x_c) @ G_c^T`` (the result transposed: BLAS is
  faster that way round; ``G_c`` copied transposed for small products, :data:`_FLIP_MACS`), rows split into
  blocks for large images. Images add in a fixed order within fixed chunks (:data:`_CHUNKS`), whose partial
  sums ``sum_partials_2d`` adds in order into the result's layout: the result does not depend on the thread
  count.
- Grouped convolutions whose per-group products are tiny (fewer than :data:`_MIN_GROUP_WORK`
  multiply-adds per output pixel: depthwise) run the direct loops ``conv_direct_2d`` and
  ``conv_transpose_direct_2d`` instead, one output plane per task.

The bias is added after the product, as the reference adds it: by the forward's blocks while their
pixels are in the cache, at the end for the other forms. Results match the reference up to the
order in which products are summed (BLAS blocks differently than the reference's one product). Handed
back to the reference: other dims (1-d, 3-d), dtypes other than float32/float64 (or mixed, e.g. a
transposed convolution's float32 bias on float64), empty results or inputs, fewer columns (multiply-
adds per kernel offset) than :data:`kiln_cpu.config.min_numel`, and a BLAS whose gemm the loops cannot
call (other than OpenBLAS: the reference's whole-batch products use it through NumPy). float16 and
bfloat16 run these float32 loops, as the reference computes them (:func:`kiln_cpu._kernel_support.through_float32`:
the operands widened, the result rounded once; non-dense half-precision operands go to the reference).
"""

from __future__ import annotations

import math

import numpy as np

from kiln.backend import from_array, reference_kernel
from kiln_cpu import _blas, _threads, config
from kiln_cpu._kernel_support import _GRAIN, FLOAT, HALF, loops, parallel, through_float32

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
_APART_WIDTH = 64
"""Pixels of one image in a block from which the forward's and the input gradient's products run per image,
straight from and into the images' memory: below it, the block's images share one product, copied side
by side (measured on an Intel Xeon, 16 -> 32 channels, 3x3, batch 64: per image 10-25% faster from 10x10
pixels, 13% slower at 7x7; 1 -> 16 channels at 28x28: 2x faster, the copies and a narrow, deep product
gone)."""
_APART_DEPTH = 128
"""The same for the weight gradient's products, whose depth the image's pixels are: per image from
12x12 (3-6% faster there, as fast at 10x10, 15% slower at 8x8 on two threads)."""
_FLIP_ROWS, _FLIP_MACS = 64, 1 << 20
"""The weight gradient's products with at least this many rows (input channels x kernel pixels) and at
most this many multiply-adds multiply the output's gradient copied transposed, not read transposed in
place: OpenBLAS's kernels for small products (at most 100^3 multiply-adds) take the copy 1.5x faster
(measured on an Intel Xeon: 144x196x32, 14.0 us against 21.2 us; a 16 -> 32 channel 3x3 weight gradient
of 64 14x14 images 1.75 -> 1.4-1.5 ms); larger products run as fast either way or slower with the copy (576
rows: 10% slower), and a few rows much slower (9 rows: 2x)."""
_CHUNKS = 16
"""The weight gradient's partial sums: the weight's channels (the original batch) are split into at most
this many fixed chunks, whatever the thread count (a deterministic result)."""
_PARTIAL_BYTES = 1 << 25
"""Memory for the weight gradient's partial sums at most (fewer chunks for large weights)."""

_loops = loops("_jit_conv")


def _run_units(fn, args: tuple, units: int, macs: int) -> None:
    """Run ``fn(*args, lo, hi)`` (a Numba loop over blocks, products included) over the ``units`` blocks,
    whose largest product makes ``macs`` multiply-adds: on the pool with BLAS on one thread when there are
    at least as many blocks as threads, else on the calling thread with BLAS on the threads the products
    warrant (:func:`kiln_cpu._blas.threads_for`)."""
    threads = _threads.get_num_threads()
    if threads <= 1 or units < threads:
        with _blas.limit(_blas.threads_for(macs)):
            fn(*args, 0, units)
        return
    with _blas.limit(1):
        parallel(fn, args, units, 1)


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
    """``a`` (N, C, H, W) as (N, C, H*W) matrices BLAS takes as they are (unit inner stride, and the rows
    of both outer dims at least a whole image apart: a product reads an image's ``N`` rows in place with
    their stride as its leading dimension), copied only when the layout does not allow it (overlapping
    rows, as ``as_strided`` makes them: BLAS refused such a product and left its result unwritten)."""
    n, c, h, w = a.shape
    m = a.reshape(n, c, h * w)
    s = a.itemsize
    if m.strides[2] != s or (c > 1 and m.strides[1] < h * w * s) or (n > 1 and m.strides[0] < h * w * s):
        m = np.ascontiguousarray(m)
    return m


# ------------------------------------------------------------------------------------ convolution


def _conv(x, weight, bias, s, p, d, groups, oh, ow, gemm_fn) -> np.ndarray:
    """The convolution of the 4-d tensor ``x`` by ``weight``, plus ``bias`` (or None), as a new
    (N, Cout, OH*OW) array."""
    n, c, h, w = x._shape
    cout, cig, kh, kw = weight._shape
    wm = np.ascontiguousarray(weight._numpy()).reshape(-1)
    b = np.empty(0, wm.dtype) if bias is None else np.ascontiguousarray(bias._numpy()).reshape(-1)
    out = np.empty((n, cout, oh * ow), wm.dtype)
    imgs, rows = _plan(c * kh * kw, oh, ow, n, out.itemsize)
    blocks = -(-oh // rows)
    xs, xo, xst = _storage(x)
    geom = (kh, kw, *s, *p, *d, oh, ow)
    plan = (imgs, rows, blocks, groups, rows * ow >= _APART_WIDTH)
    args = (xs, xo, xst, c, h, w, wm, b, out.reshape(-1), cout, geom, plan, *gemm_fn)
    _run_units(_loops().conv_blocks, args, -(-n // imgs) * blocks, (cout // groups) * cig * kh * kw * imgs * rows * ow)
    return out


def _conv_transpose(x, weight, s, p, d, groups, oh, ow, gemm_fn) -> np.ndarray:
    """The transposed convolution of the 4-d tensor ``x`` (N, Cin, H, W) by ``weight`` (Cin, Cout/groups,
    kh, kw) as a new (N, Cout, OH, OW) array: per block, the weight's columns times the input's pixels,
    scatter-added into the output."""
    n, cin, h, w = x._shape
    _, cog, kh, kw = weight._shape
    wt = np.ascontiguousarray(weight._numpy()).reshape(-1)
    out = np.zeros((n, cog * groups, oh, ow), wt.dtype)
    xm = np.ascontiguousarray(x._numpy()).reshape(-1)
    imgs, rows = _plan(cog * groups * kh * kw, h, w, n, out.itemsize)
    blocks = -(-h // rows)
    geom = (kh, kw, *s, *p, *d, w)
    args = (xm, cin, h * w, wt, out, geom, (imgs, rows, blocks, groups, rows * w >= _APART_WIDTH), *gemm_fn)
    _run_units(_loops().conv_transpose_blocks, args, -(-n // imgs), cog * kh * kw * (cin // groups) * imgs * rows * w)
    return out


def _by_weight_plan(b: int, kk: int, kh: int, kw: int, cg: int, cog: int, itemsize: int) -> tuple[int, int, int]:
    """(images, channels, output rows) per block of the weight-gradient form, whose product is
    (channels*kk, images*pixels) @ (images*pixels, Cout/groups). Images of at least :data:`_MIN_DEPTH`
    pixels: whole images while both operands (the columns and the ``cog`` rows of the output's gradient)
    fit in :data:`_BLOCK_BYTES`, else rows of one; a deeper product runs at a fraction of the speed once
    they leave the cache (9x12544x16: 0.62 ms, against 0.16 ms as four products a quarter as deep).
    Smaller images: :data:`_MIN_DEPTH` pixels deep, fewer channels per block while the columns alone
    overflow the block (counting the gradient's rows there made 144-row products slower, 0.63 -> 0.68 ms
    at 16x14x14 channels x pixels)."""
    pix = kh * kw
    if pix >= _MIN_DEPTH:
        imgs, rows = _plan(b * kk + cog, kh, kw, cg, itemsize)
        return imgs, b, rows
    imgs = min(cg, -(-_MIN_DEPTH // pix))
    chans = min(b, max(1, _BLOCK_BYTES // (kk * pix * imgs * itemsize)))
    if chans == b:  # whole images fit: as many as the block holds
        imgs = min(cg, max(imgs, _BLOCK_BYTES // (b * kk * pix * itemsize)))
    return imgs, chans, kh


def _conv_by_weight(x, weight, s, p, d, groups, oh, ow, gemm_fn) -> np.ndarray:
    """The convolution of ``x`` (B, Cx, H, W) by ``weight`` (Cout, Cx/groups, KH, KW) as a new
    (B, Cout, OH, OW) array, as a sum over the channels ``c`` of ``im2col(x[:, c]) @ weight[:, c]^T`` (per
    group; several channels side by side in one product when they are small): the weight gradient's
    form, where the "weight" (the output's gradient) is larger than the result. Blocks split the
    product's rows (``x``'s batch) and its depth (the channels ``c``, in fixed chunks with a partial sum
    each, then added in order: the result does not depend on the thread count)."""
    b, _, h, w = x._shape
    cout, cg, kh, kw = weight._shape
    cog, kk = cout // groups, oh * ow
    ck = b * kk
    # the channels as images: x[:, t] is image t of b channels, the sliding window is the result's grid
    # (stride and dilation exchanged), and the columns' grid is the weight's
    xs, xo, (s0, s1, s2, s3) = _storage(x)
    xst = (s1, s0, s2, s3)
    gm = _matrices(weight._numpy())  # (Cout, Cx/groups, KH*KW), unit pixel stride, positive strides
    isz = gm.itemsize
    span = sum((size - 1) * st for size, st in zip(gm.shape, gm.strides)) // isz + 1
    gflat = np.lib.stride_tricks.as_strided(gm, shape=(span,), strides=(isz,))  # gm's memory, read in place
    imgs, chans, rows = _by_weight_plan(b, kk, kh, kw, cg, cog, isz)
    blocks = -(-kh // rows)
    chunks = max(1, min(_CHUNKS, _PARTIAL_BYTES // (ck * cout * isz)))
    per = -(-cg // chunks)
    per = imgs * -(-per // imgs)  # channels c per chunk: a multiple of the images per block
    chunks = -(-cg // per)
    if chunks * -(-b // chans) < _CHUNKS // 2:  # few units: split the rows too (at least 128 per product)
        chans = min(chans, max(-(-b // (_CHUNKS // 2 // chunks)), -(-128 // kk)))
    parts = -(-b // chans)
    partial = np.empty((chunks, groups, ck, cog), gm.dtype)  # transposed: BLAS runs faster this way round
    geom = (b, cout, cg, kh, kw, oh, ow, *s, *p, *d)
    apart = rows * kw >= _APART_DEPTH
    macs = chans * kk * cog * rows * kw * (1 if apart else imgs)  # per product
    flip = chans * kk >= _FLIP_ROWS and macs <= _FLIP_MACS
    plan = (imgs, chans, rows, blocks, per, parts, groups, apart, flip)
    args = (xs, xo, xst, h, w, gflat, (gm.strides[0] // isz, gm.strides[1] // isz), partial.reshape(-1), geom, plan)
    _run_units(_loops().conv_by_weight_blocks, (*args, *gemm_fn), chunks * parts, chans * kk * imgs * rows * kw * cog)
    result = np.empty((b, cout, kk), gm.dtype)  # partial[q, g, (bb, i, j), o] adds into (bb, g*cog + o, i, j)
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
    reference = reference_kernel("convolution")

    def kernel(spec, input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
        args = (spec, input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
        shape, d = spec.shape, spec.dtype
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
        s, p, dil = spec.stride, spec.padding, spec.dilation
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
        gemm_fn = _blas.gemm_function(np_dtype)
        if groups > 1 and per_pixel < _MIN_GROUP_WORK:
            out = _direct(input, weight, s, p, dil, transposed, groups, shape, np_dtype)
        elif gemm_fn is None:  # a BLAS whose gemm the loops cannot call: the reference's whole-batch products
            return reference(*args)
        elif transposed:
            out = _conv_transpose(input, weight, s, p, dil, groups, oh, ow, gemm_fn)
        elif oh * ow < kh * kw:
            out = _conv_by_weight(input, weight, s, p, dil, groups, oh, ow, gemm_fn)
        else:
            out = _conv(input, weight, bias, s, p, dil, groups, oh, ow, gemm_fn).reshape(shape)
            return from_array(out, d)  # the bias added by the blocks
        out = out.reshape(shape)
        if bias is not None:
            out += bias._numpy().reshape(-1, 1, 1)
        return from_array(out, d)

    kernel.__name__ = "kiln_cpu_convolution"
    kernel.__doc__ = "im2col/col2im (Numba) + BLAS kernel for 2-d convolutions and their gradients (kiln-cpu)."
    return kernel


def kernels() -> dict[str, tuple]:
    """The convolution kernels: op name -> (kernel, output dtypes served)."""
    return {"convolution": (through_float32("convolution", _conv_kernel()), FLOAT + HALF)}
