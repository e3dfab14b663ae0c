"""kiln-cpu's kernels for the softmax family and the normalizations, forward and backward: one task per row
(or per outer slab, channel block or column block), tasks split over the thread pool, loops in Numba
(:mod:`kiln_cpu._jit_norm`, imported on the first call that needs it).

Served: ``_softmax``, ``_log_softmax``, ``logsumexp`` (last dim), ``_native_layer_norm``,
``_native_batch_norm`` (training and eval) and ``_batch_norm_stats`` (its running statistics' input),
``_native_group_norm``, and the fused backward ops ``_softmax_backward_data``,
``_log_softmax_backward_data`` and ``_native_norm_backward`` (batch norm in training and eval, layer
norm, group norm); float32 and float64, C-contiguous operands, and float16/bfloat16 everywhere, computed
in float32 as the reference computes them, and rounded once: softmax and log-softmax along the last
dim and layer norm widen blocks of rows inside the loop (:func:`kiln_cpu._jit_norm._half_rows`); the
other kernels, and softmax along another dim, run their float32 loops on widened operands
(:func:`kiln_cpu._kernel_support.through_float32`). The norm loops follow the
reference's arithmetic step for step, bit for bit where each summed run has at most 128 elements and
within a few ulps beyond (their leaves keep thirty-two running sums: :mod:`kiln_cpu._jit_norm`); the softmax loops
differ from it in exp's last bit and in the order of a long row's sum.

Each kernel has the reference kernel's contract and hands a call back to it whenever it would not be
faster or would differ by more than the sums' last bits: small inputs
(:data:`kiln_cpu.config.chain_min_numel`: the reference's several NumPy passes are slower at every
larger size), other dtypes (or operands of another dtype), empty and 0-d tensors,
inputs that are not C-contiguous (the reference's result follows their layout), logsumexp over other
dims than the last, and the norms' sums over dims that NumPy merges (a single channel in training and
in the backward, a layer norm over one element): NumPy then adds in another order.
"""

from __future__ import annotations

import math

import numpy as np

import kiln
from kiln import Tensor
from kiln.backend import from_array, reference_kernel
from kiln_cpu import config
from kiln_cpu._kernel_support import _GRAIN, FLOAT, HALF, bits, half_kind, loops, parallel, through_float32

_jit = loops("_jit_norm")


def _dense_rows(a: Tensor, d) -> np.ndarray | None:
    """The flat C-contiguous storage of ``a`` (half precision: its uint16 bits) when it is a non-empty,
    large enough tensor of dtype ``d``, a float dtype (else None: the reference runs)."""
    if d not in FLOAT + HALF or a._dtype is not d or not a._shape:
        return None
    if config.too_small(math.prod(a._shape), chain=True):
        return None
    x = a._numpy()
    if not x.flags.c_contiguous:
        return None
    return bits(x).reshape(-1)


def _compute(d):
    """The dtype the loops compute result dtype ``d`` in: float32 for half precision."""
    return kiln.float32 if d in HALF else d


def _takes(src, c) -> bool:
    """Whether an operand of dtype ``src`` goes into loops computing in ``c``: its own dtype, or half
    precision into float32 (widened exactly, as the reference widens it)."""
    return src is c or (c is kiln.float32 and src in HALF)


def _result(out: np.ndarray, d, shape: tuple) -> Tensor:
    """The loops' flat result ``out`` (half precision: its uint16 bits) as a tensor of dtype ``d`` and
    ``shape``."""
    return from_array(out.view(d.numpy).reshape(shape), d)


def _affine(weight: Tensor | None, bias: Tensor | None, c) -> tuple:
    """(weight, bias) as :func:`_flat_param` gives them for compute dtype ``c`` (empty when absent)."""
    empty = np.empty(0, c.numpy)
    return _flat_param(weight, c, empty), _flat_param(bias, c, empty)


def _flat_param(t: Tensor | None, c, empty: np.ndarray) -> np.ndarray | None:
    """A parameter (weight, bias, statistics) as a flat contiguous array of compute dtype ``c`` (half
    precision widened); ``empty`` when absent; None when its dtype does not go into ``c`` (the reference
    runs)."""
    if t is None:
        return empty
    if not _takes(t._dtype, c):
        return None
    return np.ascontiguousarray(t._numpy(), c.numpy).reshape(-1)


# ---------------------------------------------------------------------------------------------- softmax


def _softmax_kernel(name: str):
    reference = reference_kernel(name)
    log = name == "_log_softmax"

    def kernel(spec, a, dim, *rest):
        d = spec.dtype
        x = _dense_rows(a, d)
        if x is None or rest:
            return reference(spec, a, dim, *rest)
        shape, axis = a._shape, spec.dim
        inner = math.prod(shape[axis + 1 :])
        half = half_kind(d)
        if half and inner != 1:  # half precision along another dim than the last: the float32 slabs
            return widened(spec, a, dim, *rest)
        n = shape[axis]
        j = _jit()
        tag = "log_softmax" if log else "softmax"
        out = np.empty(x.size, x.dtype)
        if inner == 1:  # half-precision rows are widened block by block inside the loop
            parallel(j.norm(tag + "-rows", half), (x, out, n), x.size // n, max(1, _GRAIN // n))
        else:
            outer = x.size // (n * inner)
            parallel(j.norm(tag + "-slabs"), (x, out, n, inner), outer, max(1, _GRAIN // (n * inner)))
        return _result(out, d, shape)

    kernel.__name__ = f"kiln_cpu_{name}"
    kernel.__doc__ = f"Numba kernel for {name} (kiln-cpu)."
    widened = through_float32(name, kernel)
    return kernel


def _softmax_backward_kernel(name: str):
    reference = reference_kernel(name)
    tag = "log_softmax_backward" if name.startswith("_log") else "softmax_backward"

    def kernel(spec, grad_output, output, dim):
        d = spec.dtype  # float32 for half-precision operands (widened by through_float32)
        y = _dense_rows(output, d)
        g = _dense_rows(grad_output, d)
        if y is None or g is None:
            return reference(spec, grad_output, output, dim)
        shape, axis = output._shape, spec.dim
        n = shape[axis]
        inner = math.prod(shape[axis + 1 :])
        out = np.empty(y.size, y.dtype)
        j = _jit()
        if inner == 1:
            parallel(j.norm(tag + "-rows"), (g, y, out, n), y.size // n, max(1, _GRAIN // n))
        else:
            outer = y.size // (n * inner)
            parallel(j.norm(tag + "-slabs"), (g, y, out, n, inner), outer, max(1, _GRAIN // (n * inner)))
        return from_array(out.reshape(shape), d)

    kernel.__name__ = f"kiln_cpu_{name}"
    kernel.__doc__ = f"Numba kernel for {name} (kiln-cpu)."
    return kernel


def _logsumexp_kernel():
    reference = reference_kernel("logsumexp")

    def kernel(spec, a, dim, keepdim=False):
        if tuple(spec.dims) != (len(a._shape) - 1,):
            return reference(spec, a, dim, keepdim)
        x = _dense_rows(a, spec.dtype)
        if x is None:
            return reference(spec, a, dim, keepdim)
        n = a._shape[-1]
        out = np.empty(x.size // n, x.dtype)
        parallel(_jit().norm("logsumexp-rows"), (x, out, n), out.size, max(1, _GRAIN // n))
        return from_array(out.reshape(spec.shape), spec.dtype)

    kernel.__name__ = "kiln_cpu_logsumexp"
    kernel.__doc__ = "Numba kernel for logsumexp over the last dim (kiln-cpu)."
    return kernel


# ------------------------------------------------------------------------------------------ layer norm


def _layer_norm_kernel():
    reference = reference_kernel("_native_layer_norm")

    def kernel(spec, a, normalized_shape, weight, bias, eps):
        d = spec.dtype
        c = _compute(d)
        x = _dense_rows(a, d)
        w, b = _affine(weight, bias, c)
        if x is None or w is None or b is None:
            return reference(spec, a, normalized_shape, weight, bias, eps)
        lay = spec.layout
        n = math.prod(a._shape[i] for i in lay.red)
        half = half_kind(d)  # half-precision rows are widened block by block inside the loop
        out = np.empty(x.size, x.dtype)
        t = c.numpy.type
        args = (x, out, n, w, b, weight is not None, bias is not None, t(eps), t(1), t(n))
        parallel(_jit().norm("layer_norm-rows", half), args, x.size // n, max(1, _GRAIN // n))
        return _result(out, d, a._shape)

    kernel.__name__ = "kiln_cpu__native_layer_norm"
    kernel.__doc__ = "Numba kernel for _native_layer_norm (kiln-cpu)."
    return kernel


# ------------------------------------------------------------------------------------------ batch norm


def _channels(shape: tuple) -> tuple[int, int, int, int]:
    """(N, C, HW, block): the (N, C, HW) view of an NC* input and the channels per task, so that a task's
    N * HW * block elements (64K at most, unless one channel has more) stay in cache across its passes."""
    n, c = shape[0], shape[1]
    hw = math.prod(shape[2:])
    block = max(1, min(c, (1 << 16) // max(n * hw, 1)))
    return n, c, hw, block


def _rstd(var: np.ndarray, eps) -> np.ndarray:
    """1 / sqrt(var + eps) in var's dtype, as the reference computes it."""
    return np.divide(1, np.sqrt(var + var.dtype.type(eps)), dtype=var.dtype)


def _batch_norm_kernel():
    reference = reference_kernel("_native_batch_norm")

    def kernel(spec, input, weight, bias, running_mean, running_var, training, eps):
        args = (spec, input, weight, bias, running_mean, running_var, training, eps)
        d = spec.dtype
        if len(input._shape) < 2 or (training and input._shape[1] == 1):
            return reference(*args)  # one channel: NumPy sums the merged dims in another order
        x = _dense_rows(input, d)
        if x is None:
            return reference(*args)
        w, b = _affine(weight, bias, d)
        empty = np.empty(0, x.dtype)
        mean = r = empty
        if not training:
            mean = _flat_param(running_mean, d, empty)
            var = _flat_param(running_var, d, empty)
            if mean is None or var is None:
                return reference(*args)
            with np.errstate(all="ignore"):
                r = _rstd(var, eps)
        if w is None or b is None:
            return reference(*args)
        n, ch, hw, block = _channels(input._shape)
        out = np.empty(x.size, x.dtype)
        t = x.dtype.type
        kargs = (x, w, b, weight is not None, bias is not None, t(eps), t(1), t(n * hw), bool(training), mean, r)
        parallel(_jit().norm("batch_norm-channels"), (*kargs, out, n, ch, hw, block), -(-ch // block), 1)
        return from_array(out.reshape(input._shape), d)

    kernel.__name__ = "kiln_cpu__native_batch_norm"
    kernel.__doc__ = "Numba kernel for _native_batch_norm (kiln-cpu): NC* contiguous input, training or eval."
    return kernel


def _batch_norm_stats_kernel():
    reference = reference_kernel("_batch_norm_stats")

    def kernel(spec, input):
        d = spec[0].dtype  # float32 for a half-precision input (widened by through_float32)
        x = _dense_rows(input, d) if input._shape[1] != 1 else None
        if x is None:  # one channel: NumPy sums the merged dims in another order
            return reference(spec, input)
        n, c, hw, block = _channels(input._shape)
        t = x.dtype.type
        mean = np.empty(c, x.dtype)
        ss = np.empty(c, x.dtype)
        same = np.empty(c, np.bool_)
        parallel(
            _jit().norm("batch_norm_stats-channels"), (x, t(n * hw), mean, ss, same, n, c, hw, block), -(-c // block), 1
        )
        with np.errstate(all="ignore"):  # as the reference: ss / (n - 1), exactly 0 for a constant channel
            var = np.asarray(ss / t(max(n * hw - 1, 0)))
            var = np.where(same & ~np.isnan(var), np.zeros((), x.dtype) * var, var)
        return from_array(mean, d), from_array(var, d)

    kernel.__name__ = "kiln_cpu__batch_norm_stats"
    kernel.__doc__ = "Numba kernel for _batch_norm_stats (kiln-cpu): NC* contiguous input."
    return kernel


# ------------------------------------------------------------------------------------------ group norm


def _group_norm_kernel():
    reference = reference_kernel("_native_group_norm")

    def kernel(spec, input, num_groups, weight, bias, eps):
        args = (spec, input, num_groups, weight, bias, eps)
        d = spec.dtype
        x = _dense_rows(input, d)
        w, b = _affine(weight, bias, d)
        if x is None or w is None or b is None:
            return reference(*args)
        rows, groups, length = spec.layout.stats_shape
        hw = math.prod(input._shape[2:])
        cg = input._shape[1] // groups
        out = np.empty(x.size, x.dtype)
        t = x.dtype.type
        kargs = (x, w, b, weight is not None, bias is not None, t(eps), t(1), t(length), out, length, hw, cg, groups)
        parallel(_jit().norm("group_norm-rows"), kargs, rows * groups, max(1, _GRAIN // length))
        return from_array(out.reshape(input._shape), d)

    kernel.__name__ = "kiln_cpu__native_group_norm"
    kernel.__doc__ = "Numba kernel for _native_group_norm (kiln-cpu)."
    return kernel


# ------------------------------------------------------------------------------------------ backward


def _norm_backward_kernel():
    reference = reference_kernel("_native_norm_backward")

    def kernel(spec, grad, input, weight, mean, var, eps, layout, output_mask):
        args = (spec, grad, input, weight, mean, var, eps, layout, output_mask)
        d = spec[0].dtype  # float32 for half-precision operands (widened by through_float32)
        x = _dense_rows(input, d)
        g = _dense_rows(grad, d)
        if x is None or g is None:
            return reference(*args)
        empty = np.empty(0, x.dtype)
        w = _flat_param(weight, d, empty)
        mu = _flat_param(mean, d, empty)
        v = _flat_param(var, d, empty)
        if w is None or mu is None or v is None or (mean is not None and layout.kind != "batch"):
            return reference(*args)
        need = (bool(output_mask[0]), bool(output_mask[1]) and weight is not None, bool(output_mask[2]))
        if _merged_sums(layout, input._shape):
            return reference(*args)
        t = x.dtype.type
        if layout.kind == "layer":
            gx, gw, gb = _layer_norm_backward(x, g, w, weight is not None, t(eps), layout, input._shape, need)
        elif layout.kind == "batch" and len(input._shape) >= 2:
            r = empty
            if mean is not None:
                with np.errstate(all="ignore"):
                    r = _rstd(v, eps)
            gx, gw, gb = _batch_norm_backward(x, g, w, weight is not None, t(eps), mu, r, input._shape, need)
        elif layout.kind == "group":
            gx, gw, gb = _group_norm_backward(x, g, w, weight is not None, t(eps), layout, input._shape, need)
        else:
            return reference(*args)
        outs = (gx, gw, gb)
        return tuple(from_array(a.reshape(s[0]) if n else np.zeros(0, x.dtype), d) for a, s, n in zip(outs, spec, need))

    kernel.__name__ = "kiln_cpu__native_norm_backward"
    kernel.__doc__ = "Numba kernel for _native_norm_backward (kiln-cpu): batch, layer and group norm."
    return kernel


def _merged_sums(lay, shape: tuple) -> bool:
    """Whether NumPy merges the dims a sum of the reference runs over (one channel; a layer norm over one
    element per row) and so adds in an order the loops do not follow: the reference runs."""
    if lay.kind == "layer":
        return math.prod(shape[i] for i in lay.red) == 1
    return len(shape) >= 2 and shape[1] == 1


def _layer_norm_backward(x, g, w, has_w, eps, lay, shape, need):
    """(gx, gw, gb) flat: the rows' loop (statistics, input gradient), then the parameters' column sums."""
    n = math.prod(shape[i] for i in lay.red)
    rows = x.size // n
    t = x.dtype.type
    mean = np.empty(rows, x.dtype)
    rstd = np.empty(rows, x.dtype)
    gx = np.empty(x.size if need[0] else 0, x.dtype)
    j = _jit()
    args = (x, g, w, has_w, eps, t(1), t(n), need[0], mean, rstd, gx, n)
    parallel(j.norm("layer_norm_backward-rows"), args, rows, max(1, _GRAIN // n))
    gw = np.empty(n if need[1] else 0, x.dtype)
    gb = np.empty(n if need[2] else 0, x.dtype)
    if need[1] or need[2]:
        gw_out = gw if need[1] else np.empty(n, x.dtype)
        gb_out = gb if need[2] else np.empty(n, x.dtype)
        cols = j._COLS
        args = (x, g, mean, rstd, rows, n, need[1], need[2], bool(lay.param_red), gw_out, gb_out)
        parallel(j.norm("norm_params-cols"), args, -(-n // cols), max(1, _GRAIN // (cols * rows)))
    return gx, gw, gb


def _batch_norm_backward(x, g, w, has_w, eps, mean, r, shape, need):
    """(gx, gw, gb) flat, channel blocks in parallel; ``mean``/``r`` given in eval mode (else empty)."""
    n, c, hw, block = _channels(shape)
    t = x.dtype.type
    gx = np.empty(x.size if need[0] else 0, x.dtype)
    gw = np.empty(c, x.dtype)
    gb = np.empty(c, x.dtype)
    train = mean.size == 0
    args = (x, g, w, has_w, eps, t(1), t(n * hw), train, mean, r, need[0], gx, gw, gb, n, c, hw, block)
    parallel(_jit().norm("batch_norm_backward-channels"), args, -(-c // block), 1)
    return gx, gw, gb


def _group_norm_backward(x, g, w, has_w, eps, lay, shape, need):
    """(gx, gw, gb) flat: the rows' loop, then the per-(n, channel) run sums added over n in order."""
    n, groups, length = lay.stats_shape
    c = shape[1]
    hw = math.prod(shape[2:])
    t = x.dtype.type
    gx = np.empty(x.size if need[0] else 0, x.dtype)
    part_w = np.empty(n * c if need[1] else 0, x.dtype)
    part_b = np.empty(n * c if need[2] else 0, x.dtype)
    args = (x, g, w, has_w, eps, t(1), t(length), need[0], need[1], need[2], gx, part_w, part_b)
    args = (*args, length, hw, c // groups, groups)
    parallel(_jit().norm("group_norm_backward-rows"), args, n * groups, max(1, _GRAIN // length))
    # NumPy's sum over dim 0 of (N, C) adds the rows in order onto 0: the reference's order
    gw = np.sum(part_w.reshape(n, c), axis=0) if need[1] else part_w
    gb = np.sum(part_b.reshape(n, c), axis=0) if need[2] else part_b
    return gx, gw, gb


def kernels() -> dict[str, tuple]:
    """The softmax-family and normalization kernels: op name -> (kernel, output dtypes served). Softmax,
    log-softmax and layer norm take half precision themselves (rows widened block by block); the others
    through their float32 loops (:func:`kiln_cpu._kernel_support.through_float32`)."""
    widened = {
        "logsumexp": (_logsumexp_kernel(), FLOAT + HALF),
        "_native_batch_norm": (_batch_norm_kernel(), FLOAT + HALF),
        "_batch_norm_stats": (_batch_norm_stats_kernel(), FLOAT),
        "_native_group_norm": (_group_norm_kernel(), FLOAT + HALF),
        "_softmax_backward_data": (_softmax_backward_kernel("_softmax_backward_data"), FLOAT),
        "_log_softmax_backward_data": (_softmax_backward_kernel("_log_softmax_backward_data"), FLOAT),
        "_native_norm_backward": (_norm_backward_kernel(), FLOAT),
    }
    table = {name: (through_float32(name, kernel), served) for name, (kernel, served) in widened.items()}
    table["_softmax"] = (_softmax_kernel("_softmax"), FLOAT + HALF)
    table["_log_softmax"] = (_softmax_kernel("_log_softmax"), FLOAT + HALF)
    table["_native_layer_norm"] = (_layer_norm_kernel(), FLOAT + HALF)
    return table
