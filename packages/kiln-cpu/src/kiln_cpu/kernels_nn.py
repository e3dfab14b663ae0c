"""kiln-cpu's kernels for the softmax family and layer norm: one task per row (or per outer slab), rows
split over the thread pool, loops in Numba (:mod:`kiln_cpu._jit`).

Each kernel has the reference kernel's contract and hands a call back to it whenever it would not be
faster or not be identical: small inputs (:data:`kiln_cpu.config.min_numel`), dtypes other than
float32/float64 (or operands of another dtype), empty and 0-d tensors, and inputs that are not
C-contiguous (the reference's result follows their layout).
"""

from __future__ import annotations

import math

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import OPS
from kiln._reference import wrap_reference
from kiln._tensor import Tensor, from_array
from kiln_cpu import config
from kiln_cpu.kernels import _GRAIN, _kernels, parallel

FLOAT = (dt.float32, dt.float64)


def _dense_rows(a: Tensor, d) -> np.ndarray | None:
    """The flat C-contiguous storage of ``a`` when it is a non-empty, large enough float tensor of dtype
    ``d`` (else None: the reference runs)."""
    if d not in FLOAT or a._dtype is not d or not a._shape:
        return None
    n = math.prod(a._shape)
    if n == 0 or n < config.min_numel:
        return None
    x = a._numpy()
    if not x.flags.c_contiguous:
        return None
    return x.reshape(-1)


def _softmax_kernel(name: str):
    reference = wrap_reference(OPS[name])
    log = name == "_log_softmax"

    def kernel(spec, a, dim, *rest):
        x = _dense_rows(a, spec[1])
        if x is None or rest:
            return reference(spec, a, dim, *rest)
        shape, axis = a._shape, spec[3]
        n = shape[axis]
        inner = math.prod(shape[axis + 1 :])
        out = np.empty(x.size, x.dtype)
        j = _kernels()
        tag = "log_softmax" if log else "softmax"
        if inner == 1:
            parallel(j.norm(tag + "-rows"), (x, out, n), x.size // n, max(1, _GRAIN // n))
        else:
            outer = x.size // (n * inner)
            parallel(j.norm(tag + "-slabs"), (x, out, n, inner), outer, max(1, _GRAIN // (n * inner)))
        return from_array(out.reshape(shape), spec[1])

    kernel.__name__ = f"kiln_cpu_{name}"
    kernel.__doc__ = f"Numba kernel for {name} (kiln-cpu)."
    return kernel


def _logsumexp_kernel():
    reference = wrap_reference(OPS["logsumexp"])

    def kernel(spec, a, dim, keepdim=False):
        x = _dense_rows(a, spec[1])
        if x is None or tuple(spec[3]) != (len(a._shape) - 1,):
            return reference(spec, a, dim, keepdim)
        n = a._shape[-1]
        out = np.empty(x.size // n, x.dtype)
        parallel(_kernels().norm("logsumexp-rows"), (x, out, n), out.size, max(1, _GRAIN // n))
        return from_array(out.reshape(spec[0]), spec[1])

    kernel.__name__ = "kiln_cpu_logsumexp"
    kernel.__doc__ = "Numba kernel for logsumexp over the last dim (kiln-cpu)."
    return kernel


def _layer_norm_kernel():
    reference = wrap_reference(OPS["_native_layer_norm"])

    def kernel(spec, a, normalized_shape, weight, bias, eps):
        d = spec[1]
        x = _dense_rows(a, d)
        params = [t for t in (weight, bias) if t is not None]
        if x is None or any(t._dtype is not d for t in params):
            return reference(spec, a, normalized_shape, weight, bias, eps)
        lay = spec[3]
        n = math.prod(a._shape[i] for i in lay.red)
        empty = np.empty(0, x.dtype)
        w = np.ascontiguousarray(weight._numpy()).reshape(-1) if weight is not None else empty
        b = np.ascontiguousarray(bias._numpy()).reshape(-1) if bias is not None else empty
        out = np.empty(x.size, x.dtype)
        t = x.dtype.type
        args = (x, w, b, weight is not None, bias is not None, t(eps), t(1), t(n), out, n)
        parallel(_kernels().norm("layer_norm-rows"), args, x.size // n, max(1, _GRAIN // n))
        return from_array(out.reshape(a._shape), d)

    kernel.__name__ = "kiln_cpu__native_layer_norm"
    kernel.__doc__ = "Numba kernel for _native_layer_norm (kiln-cpu)."
    return kernel


def kernels() -> dict[str, tuple]:
    """The softmax-family and normalization kernels: op name -> (kernel, output dtypes served)."""
    return {
        "_softmax": (_softmax_kernel("_softmax"), FLOAT),
        "_log_softmax": (_softmax_kernel("_log_softmax"), FLOAT),
        "logsumexp": (_logsumexp_kernel(), FLOAT),
        "_native_layer_norm": (_layer_norm_kernel(), FLOAT),
    }
