"""kiln-cpu's ``_nll_loss`` and ``_nll_loss_backward``, and kiln-compile's fused cross entropy (log-softmax
then nll_loss, :func:`log_softmax_nll` and its backward): the target's log-probability is read in place from
the input in any of its shapes ((C,), (N, C), (N, C, d1, ...)), and the gradient written in place in
that layout, where the reference first moves the class dim last (a copy of the whole input for spatial
inputs); the sums are the reference's NumPy sums of the same terms and each gradient entry the
reference's product, so the results are bit for bit the reference's. Loops in Numba
(:mod:`kiln_cpu._jit_loss`, imported on the first call that needs it).

Handed back to the reference: small inputs (:data:`kiln_cpu.config.chain_min_numel`), dtypes other than
float32/float64 (and a weight of another dtype), non-contiguous inputs (forward; the backward reads
only the input's shape), and out-of-range targets (the reference raises the error). float16 and bfloat16
run the float32 loops, as the reference computes them (:func:`kiln_cpu._kernel_support.through_float32`).
"""

from __future__ import annotations

import math

import numpy as np

from kiln.backend import call_kernel, from_array, host_view, reference_kernel
from kiln.backend import op as op_record
from kiln_cpu import config
from kiln_cpu._kernel_support import _GRAIN, FLOAT, HALF, loops, parallel, through_float32

_jit = loops("_jit_loss")


def _quiet_divide(a, b):
    """``a / b`` in NumPy's arithmetic, nan or inf without a warning when ``b`` is 0 (every target ignored):
    NumPy's ``errstate`` costs a microsecond, so only that case pays it."""
    if b != 0:
        return a / b
    with np.errstate(invalid="ignore", divide="ignore"):
        return a / b


def _reduced(loss: np.ndarray, w: np.ndarray, reduction: str) -> np.ndarray:
    """The nll loss of per-row terms ``loss`` and weights ``w``: their NumPy sum ("sum"), or that over the
    weights' sum ("mean"), as a 0-d array of their dtype (the reference's arithmetic)."""
    total = loss.sum(dtype=loss.dtype)
    if reduction == "mean":
        total = _quiet_divide(total, w.sum(dtype=loss.dtype))
    return np.asarray(total, loss.dtype)


def _grad_scale(g: np.ndarray, w: np.ndarray | None, reduction: str, compute: np.dtype):
    """The scale of each target's gradient term for reduction "sum" (the output gradient ``g``) or "mean"
    (``g`` over the weights' sum ``w``, rounded as the reference rounds it), in the ``compute`` dtype."""
    q = g.astype(compute, copy=False)
    if reduction == "mean":
        q = _quiet_divide(q, w.sum(dtype=compute))
    return compute.type(q)


def _rows(a: np.ndarray, t: np.ndarray, reduction: str) -> bool:
    """Whether the fused cross entropy kernels take these rows: C-contiguous float32/float64 (N, C), a 1-D
    target, reduction "sum" or "mean" (anything else runs the two kernels: "none", or their error)."""
    return (
        a.ndim == 2
        and a.dtype in (np.float32, np.float64)
        and a.flags.c_contiguous
        and t.ndim == 1
        and reduction in ("sum", "mean")
    )


def _nll_kernel():
    reference = reference_kernel("_nll_loss")

    def kernel(spec, input, target, weight=None, ignore_index=-100, reduction="mean"):
        args = (spec, input, target, weight, ignore_index, reduction)
        d = spec.dtype
        shape = input._shape
        if (
            d not in FLOAT
            or input._dtype is not d
            or config.too_small(math.prod(shape), chain=True)
            or (weight is not None and weight._dtype is not d)
            or reduction not in ("none", "sum", "mean")
        ):
            return reference(*args)
        x = input._numpy()
        if not x.flags.c_contiguous:
            return reference(*args)
        classes = shape[0] if len(shape) == 1 else shape[1]
        inner = math.prod(shape[2:])
        t = np.ascontiguousarray(target._numpy()).reshape(-1)
        w_in = np.ascontiguousarray(weight._numpy()).reshape(-1) if weight is not None else np.empty(0, x.dtype)
        rows = t.size
        loss = np.empty(rows, x.dtype)
        w = np.empty(rows, x.dtype)
        bad = np.zeros(1, np.int8)
        fn = _jit().nll_rows
        parallel(
            fn, (x.reshape(-1), t, w_in, weight is not None, ignore_index, classes, inner, loss, w, bad), rows, _GRAIN
        )
        if bad[0]:
            return reference(*args)
        if reduction == "none":
            return from_array(loss.reshape(spec.shape), d)
        return from_array(_reduced(loss, w, reduction), d)

    kernel.__name__ = "kiln_cpu__nll_loss"
    kernel.__doc__ = "Numba kernel for _nll_loss (kiln-cpu)."
    return kernel


def _nll_backward_kernel():
    reference = reference_kernel("_nll_loss_backward")
    modes = {"none": 0, "sum": 1, "mean": 2}

    def kernel(spec, grad, input, target, weight=None, ignore_index=-100, reduction="mean"):
        args = (spec, grad, input, target, weight, ignore_index, reduction)
        d = spec.dtype
        shape = spec.shape
        if (
            d not in FLOAT
            or grad._dtype is not d
            or config.too_small(math.prod(shape), chain=True)
            or (weight is not None and weight._dtype is not d)
            or reduction not in modes
        ):
            return reference(*args)
        compute = d.numpy
        classes = shape[0] if len(shape) == 1 else shape[1]
        inner = math.prod(shape[2:])
        j = _jit()
        t = np.ascontiguousarray(target._numpy()).reshape(-1)
        w_in = np.ascontiguousarray(weight._numpy()).reshape(-1) if weight is not None else np.empty(0, compute)
        rows = t.size
        w = np.empty(rows, compute)
        bad = np.zeros(1, np.int8)
        parallel(j.nll_weights, (t, w_in, weight is not None, ignore_index, classes, w, bad), rows, _GRAIN)
        if bad[0]:
            return reference(*args)
        mode = modes[reduction]
        g = grad._numpy()
        q = compute.type(0)
        if mode == 0:
            g = np.ascontiguousarray(g).reshape(-1)
        else:
            q, g = _grad_scale(g, w, reduction, compute), np.empty(0, compute)
        out = np.empty(math.prod(shape), compute)
        batch = out.size // (classes * inner)
        args = (t, w, g, mode, q, ignore_index, classes, inner, out)
        parallel(j.nll_backward_fill, args, batch, max(1, _GRAIN // (classes * inner)))
        return from_array(out.reshape(shape), d)

    kernel.__name__ = "kiln_cpu__nll_loss_backward"
    kernel.__doc__ = "Numba kernel for _nll_loss_backward (kiln-cpu)."
    return kernel


def _eager_cross_entropy(x, target, ignore_index: int, reduction: str) -> tuple:
    """The two ops' own kernels (what the fused ones stand for): they raise the eager error for an
    out-of-range target."""
    log_probs = call_kernel(op_record("_log_softmax"), (x, 1))
    return log_probs, call_kernel(op_record("_nll_loss"), (log_probs, target, None, ignore_index, reduction))


def log_softmax_nll(x, target, ignore_index: int, reduction: str) -> tuple:
    """``_log_softmax(x, 1)`` then ``_nll_loss`` of it (no weight, reduction "sum" or "mean") in one pass over
    the rows of the C-contiguous float32/float64 (N, C) ``x``: ``(log_probs, loss)``, the numbers the two
    kernels compute (the loss the same NumPy sum of the same terms). Anything else runs the two kernels."""
    a = host_view(x)
    t = host_view(target)
    if not _rows(a, t, reduction):
        return _eager_cross_entropy(x, target, ignore_index, reduction)
    rows, n = a.shape
    log_probs = np.empty_like(a)
    loss = np.empty(rows, a.dtype)
    w = np.empty(rows, a.dtype)
    bad = np.zeros(1, np.int8)
    args = (a.reshape(-1), t, False, ignore_index, log_probs.reshape(-1), loss, w, bad, n)
    parallel(_jit().log_softmax_nll_rows, args, rows, max(1, _GRAIN // max(n, 1)))
    if bad[0]:
        return _eager_cross_entropy(x, target, ignore_index, reduction)
    return from_array(log_probs, x._dtype), from_array(_reduced(loss, w, reduction), x._dtype)


def log_softmax_nll_backward(grad, log_probs, target, ignore_index: int, reduction: str):
    """The input gradient of :func:`log_softmax_nll` (``_nll_loss_backward`` then
    ``_log_softmax_backward_data`` on ``log_probs``) in one pass over the rows: the numbers the two kernels
    compute. Anything but C-contiguous float32/float64 (N, C) log-probabilities runs the two kernels."""
    y = host_view(log_probs)
    t = host_view(target)
    if not _rows(y, t, reduction):
        return _eager_cross_entropy_backward(grad, log_probs, target, ignore_index, reduction)
    rows, n = y.shape
    j = _jit()
    bad = np.zeros(1, np.int8)
    w = None
    if reduction == "mean":  # the count of targets not ignored
        w = np.empty(rows, y.dtype)
        parallel(j.nll_weights, (t, y[:0, 0], False, ignore_index, n, w, bad), rows, _GRAIN)
        if bad[0]:
            return _eager_cross_entropy_backward(grad, log_probs, target, ignore_index, reduction)
    q = _grad_scale(host_view(grad), w, reduction, y.dtype)
    out = np.empty_like(y)
    args = (y.reshape(-1), t, q, y.dtype.type(1), reduction == "mean", ignore_index, out.reshape(-1), bad, n)
    parallel(j.log_softmax_nll_backward_rows, args, rows, max(1, _GRAIN // max(n, 1)))
    if bad[0]:
        return _eager_cross_entropy_backward(grad, log_probs, target, ignore_index, reduction)
    return from_array(out, log_probs._dtype)


def _eager_cross_entropy_backward(grad, log_probs, target, ignore_index: int, reduction: str):
    args = (grad, log_probs, target, None, ignore_index, reduction)
    grad_log_probs = call_kernel(op_record("_nll_loss_backward"), args)
    return call_kernel(op_record("_log_softmax_backward_data"), (grad_log_probs, log_probs, 1))


def kernels() -> dict[str, tuple]:
    """The loss kernels: op name -> (kernel, output dtypes served)."""
    return {
        "_nll_loss": (through_float32("_nll_loss", _nll_kernel()), FLOAT + HALF),
        "_nll_loss_backward": (through_float32("_nll_loss_backward", _nll_backward_kernel()), FLOAT + HALF),
    }
