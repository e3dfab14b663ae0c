"""Convolution, unfold/fold and max pooling on the GPU.

Convolution is im2col + GEMM, as kiln's reference kernel computes it: the input is copied once into a
zero-padded buffer, its sliding windows are a strided *view* of that buffer (no index arithmetic), one
copy lays them out as a matrix per group, and the tiled matmul kernel multiplies it with the weight. A
transposed convolution multiplies first and adds the columns back through the same window view of the
output buffer, with atomic adds where windows overlap (col2im). Max pooling is a generated kernel that
walks each output's window (:func:`kiln_cuda.codegen.pool_kernel`).
"""

from __future__ import annotations

import math

import numpy as np

import kiln
from kiln_cuda import _driver, codegen
from kiln_cuda.codegen import Operand
from kiln_cuda.kernels import _compute, _np, _stream_of, launch_pointwise, new_output

__all__ = ["KERNELS"]


def _padded(x: kiln.Tensor, padding, extra=None, fill=0.0) -> kiln.Tensor:
    """``x`` copied into a buffer padded by ``padding`` (and ``extra`` more at the end) on its spatial dims."""
    nd = len(padding)
    extra = extra or (0,) * nd
    shape = tuple(x.shape[:-nd]) + tuple(n + 2 * p + e for n, p, e in zip(x.shape[-nd:], padding, extra))
    buf = kiln.full(shape, fill, dtype=x.dtype, device=x.device)
    inner = buf
    for i, (n, p) in enumerate(zip(x.shape[-nd:], padding)):
        inner = inner.narrow(x.ndim - nd + i, p, n)
    launch_pointwise("x0", [(x, _compute(x.dtype))], inner)
    return buf


def _windows(buf: kiln.Tensor, nd: int, out, kernel, stride, dilation) -> kiln.Tensor:
    """The view (*lead, *out, *kernel) of a padded buffer's sliding windows."""
    lead = tuple(buf.shape[:-nd])
    st = buf.stride()
    sp = st[-nd:]
    shape = lead + tuple(out) + tuple(kernel)
    strides = tuple(st[:-nd]) + tuple(s * q for s, q in zip(sp, stride)) + tuple(s * d for s, d in zip(sp, dilation))
    return buf.as_strided(shape, strides, buf.storage_offset())


def _copy(t: kiln.Tensor, dtype=None) -> kiln.Tensor:
    out = kiln.empty(tuple(t.shape), dtype=dtype or t.dtype, device=t.device)
    return launch_pointwise("x0", [(t, _compute(out.dtype))], out)


def _conv(x, w, stride, padding, dilation, groups, compute):
    n, c = x.shape[:2]
    cout, kernel = w.shape[0], tuple(w.shape[2:])
    nd = len(kernel)
    xp = _padded(x.to(compute) if x.dtype != compute else x, padding)
    out_sp = tuple((xp.shape[2 + i] - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1 for i in range(nd))
    cig, cog = c // groups, cout // groups
    kp, op_ = math.prod(kernel), math.prod(out_sp)
    win = _windows(xp, nd, out_sp, kernel, stride, dilation).reshape((n, groups, cig) + out_sp + kernel)
    order = (1, 0) + tuple(range(3, 3 + nd)) + (2,) + tuple(range(3 + nd, 3 + 2 * nd))
    cols = _copy(win.permute(order)).reshape(groups, n * op_, cig * kp)
    wm = w.to(compute).reshape(groups, cog, cig * kp).transpose(1, 2)
    r = kiln.matmul(cols, wm).reshape((groups, n) + out_sp + (cog,))
    return r.permute((1, 0, 2 + nd) + tuple(range(2, 2 + nd))).reshape((n, cout) + out_sp)


def _fold_into(cols: kiln.Tensor, out_shape, kernel, stride, padding, dilation, blocks) -> kiln.Tensor:
    """col2im: ``cols`` (*lead, *blocks, *kernel) added into a zero buffer through its window view, cropped."""
    nd = len(kernel)
    extra = tuple(
        max(0, (b - 1) * s + (k - 1) * d + 1 - (n + 2 * p))
        for b, s, k, d, n, p in zip(blocks, stride, kernel, dilation, out_shape[-nd:], padding)
    )
    lead = tuple(out_shape[:-nd])
    acc = kiln.float64 if cols.dtype == kiln.float64 else kiln.float32
    buf = kiln.zeros(
        lead + tuple(n + 2 * p + e for n, p, e in zip(out_shape[-nd:], padding, extra)), dtype=acc, device=cols.device
    )
    launch_pointwise(
        "x0", [(cols, _compute(acc))], _windows(buf, nd, blocks, kernel, stride, dilation), accumulate=True
    )
    for i, (n, p) in enumerate(zip(out_shape[-nd:], padding)):
        buf = buf.narrow(len(lead) + i, p, n)
    return buf


def _conv_transpose(x, w, stride, padding, dilation, groups, out_size, compute):
    n, cin = x.shape[:2]
    spatial = tuple(x.shape[2:])
    nd = len(spatial)
    cog, kernel = w.shape[1], tuple(w.shape[2:])
    cig = cin // groups
    sp, kp = math.prod(spatial), math.prod(kernel)
    xm = x.to(compute).reshape(n, groups, cig, sp).permute(1, 0, 3, 2).reshape(groups, n * sp, cig)
    wm = w.to(compute).reshape(groups, cig, cog * kp)
    cols = kiln.matmul(xm, wm).reshape((groups, n) + spatial + (cog,) + kernel)
    order = (1, 0, 2 + nd) + tuple(range(2, 2 + nd)) + tuple(range(3 + nd, 3 + 2 * nd))
    cols = cols.permute(order).reshape((n, groups * cog) + spatial + kernel)
    return _fold_into(cols, (n, groups * cog) + tuple(out_size), kernel, stride, padding, dilation, spatial)


def convolution(spec, input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """N-d convolution (and transposed convolution) as im2col + the tiled matmul."""
    out = new_output(spec)
    if out.numel() == 0:
        return out
    compute = (
        spec.dtype
        if spec.dtype in (kiln.float32, kiln.float64)
        else (kiln.float32 if spec.dtype.is_floating_point else kiln.int64)
    )
    with kiln.no_grad():
        if transposed:
            r = _conv_transpose(
                input, weight, spec.stride, spec.padding, spec.dilation, groups, spec.shape[2:], compute
            )
        else:
            r = _conv(input, weight, spec.stride, spec.padding, spec.dilation, groups, compute)
        inputs = [(r, _compute(compute))]
        expr = "x0"
        if bias is not None:
            nd = len(spec.shape) - 2
            inputs.append((bias.reshape((-1,) + (1,) * nd), _compute(compute)))
            expr = "x0 + x1"
        return launch_pointwise(expr, inputs, out)


def im2col(spec, input, kernel_size, dilation, padding, stride):
    """``unfold``: (N, C, H, W) -> (N, C*kh*kw, L), the sliding blocks as columns."""
    out = new_output(spec)
    if out.numel() == 0:
        return out
    x = input if input.ndim == 4 else input.unsqueeze(0)
    k, d, p, s = spec.kernel_size, spec.dilation, spec.padding, spec.stride
    xp = _padded(x, p)
    blocks = tuple((xp.shape[2 + i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(2))
    win = _windows(xp, 2, blocks, k, s, d)  # (N, C, bh, bw, kh, kw)
    cols = win.permute(0, 1, 4, 5, 2, 3)
    launch_pointwise(
        "x0",
        [(cols.reshape(tuple(cols.shape)), _compute(spec.dtype))],
        out.reshape(x.shape[0], x.shape[1], k[0], k[1], blocks[0], blocks[1]),
    )
    return out


def col2im(spec, input, output_size, kernel_size, dilation, padding, stride):
    """``fold``: (N, C*kh*kw, L) -> (N, C, H, W), overlapping blocks summed."""
    out = new_output(spec)
    if out.numel() == 0:
        return out
    x = input if input.ndim == 3 else input.unsqueeze(0)
    k, d, p, s = spec.kernel_size, spec.dilation, spec.padding, spec.stride
    size = tuple(spec.shape[-2:])
    blocks = tuple((size[i] + 2 * p[i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(2))
    n, c = x.shape[0], x.shape[1] // (k[0] * k[1])
    cols = x.reshape(n, c, k[0], k[1], blocks[0], blocks[1]).permute(0, 1, 4, 5, 2, 3)
    folded = _fold_into(cols, (n, c) + size, k, s, p, d, blocks)
    launch_pointwise("x0", [(folded, _compute(spec.dtype))], out.reshape((n, c) + size))
    return out


def _pool(spec, input, nd, adaptive, kernel_size=None, stride=None, padding=None, dilation=None):
    vspec, ispec = spec
    out, outi = new_output(vspec), new_output(ispec)
    total = out.numel()
    if total == 0:
        return out, outi
    x = input if input.is_contiguous() else _copy(input)
    ishape = tuple(x.shape[-nd:])
    oshape = tuple(vspec.shape[-nd:])
    acc = _compute(vspec.dtype)
    op = Operand(compute=acc, array=x.untyped_storage().array, storage_dtype=_np(x.dtype))
    kernel = codegen.pool_kernel(op, acc, _np(vspec.dtype), nd, adaptive, "float64" if acc == np.float64 else "float32")
    zeros = (0,) * nd
    args = (
        total,
        oshape,
        ishape,
        tuple(kernel_size or zeros),
        tuple(stride or zeros),
        tuple(padding or zeros),
        tuple(dilation or zeros),
        op.array,
        x.storage_offset(),
        math.prod(ishape),
        out.untyped_storage().array,
        outi.untyped_storage().array,
    )
    codegen.launch(kernel, _driver.blocks(total), _driver.THREADS, _stream_of(out)._raw, args)
    return out, outi


def _max_pool(spec, input, kernel_size, stride, padding, dilation, ceil_mode):
    """Max pooling over the last ``len(kernel_size)`` dims: (values, flat indices in each plane)."""
    return _pool(spec, input, len(kernel_size), False, kernel_size, stride, padding, dilation)


def _adaptive_max_pool(spec, input, output_size):
    """Adaptive max pooling: PyTorch's windows for each output position."""
    return _pool(spec, input, len(output_size), True)


KERNELS: dict[str, tuple] = {
    "convolution": (convolution, None),
    "im2col": (im2col, None),
    "col2im": (col2im, None),
    "_max_pool": (_max_pool, None),
    "_adaptive_max_pool": (_adaptive_max_pool, None),
}
