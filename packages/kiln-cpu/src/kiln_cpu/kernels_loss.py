"""kiln-cpu's ``_nll_loss`` forward: the target's log-probability is read in place from the input in any
of its shapes ((C,), (N, C), (N, C, d1, ...)), where the reference first moves the class dim last (a copy
of the whole input for spatial inputs); the sums are the reference's NumPy sums of the same terms, so
the result is bit for bit the reference's.

Handed back to the reference: small inputs (:data:`kiln_cpu.config.min_numel`), dtypes other than
float32/float64, non-contiguous inputs, and out-of-range targets (the reference raises the error).
"""

from __future__ import annotations

import math

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import OPS
from kiln._reference import wrap_reference
from kiln._tensor import from_array
from kiln_cpu import config
from kiln_cpu.kernels import _GRAIN, _kernels, parallel

FLOAT = (dt.float32, dt.float64)


def _nll_kernel():
    reference = wrap_reference(OPS["_nll_loss"])

    def kernel(spec, input, target, weight=None, ignore_index=-100, reduction="mean"):
        args = (spec, input, target, weight, ignore_index, reduction)
        d = spec[1]
        shape = input._shape
        if (
            d not in FLOAT
            or input._dtype is not d
            or math.prod(shape) < max(config.min_numel, 1)
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
        fn = _kernels().nll_rows
        parallel(
            fn, (x.reshape(-1), t, w_in, weight is not None, ignore_index, classes, inner, loss, w, bad), rows, _GRAIN
        )
        if bad[0]:
            return reference(*args)
        compute = x.dtype
        if reduction == "none":
            return from_array(loss.reshape(spec[0]), d)
        total = loss.sum(dtype=compute)
        if reduction == "sum":
            return from_array(np.asarray(total, compute), d)
        with np.errstate(invalid="ignore", divide="ignore"):
            return from_array(np.asarray(total / w.sum(dtype=compute), compute), d)

    kernel.__name__ = "kiln_cpu__nll_loss"
    kernel.__doc__ = "Numba kernel for _nll_loss (kiln-cpu)."
    return kernel


def kernels() -> dict[str, tuple]:
    """The loss kernels: op name -> (kernel, output dtypes served)."""
    return {"_nll_loss": (_nll_kernel(), FLOAT)}
