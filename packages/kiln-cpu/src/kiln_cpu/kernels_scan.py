"""kiln-cpu's ``cumsum`` and ``cumprod``: the reference's running sum (product) in order, each output
rounded once from the accumulator (float32 for float16/bfloat16, as the reference computes), so results
are bit for bit the reference's. The input is read in its own memory order (a copy only when it is not
dense), the scan dim either innermost (one task per row) or not (rows combined in order, vectorised
along the dims inside it); the result has the input's layout, as NumPy's (and PyTorch's) result does.

Handed back to the reference: small inputs (:data:`kiln_cpu.config.min_numel`), 0-d and empty tensors,
an output dtype other than the input's (``dtype=``, integers promoted to int64), and dtypes other than
float32/float64/float16/bfloat16/int64.
"""

from __future__ import annotations

import math

import numpy as np

import kiln
from kiln.backend import from_array, reference_kernel
from kiln_cpu import _opcodes, config
from kiln_cpu._kernel_support import _GRAIN, bits, half_kind, loops, numpy_order, parallel

_kernels = loops("_jit_scan")

SERVED = (kiln.float32, kiln.float64, kiln.float16, kiln.bfloat16, kiln.int64)


def _scan_kernel(name: str, code: int):
    reference = reference_kernel(name)

    def kernel(spec, a, dim, dtype=None):
        d = spec.dtype
        shape = a._shape
        if d not in SERVED or a._dtype is not d or not shape or math.prod(shape) < max(config.min_numel, 1):
            return reference(spec, a, dim, dtype)
        axis = spec.dim
        x = bits(a._numpy())
        # the result's layout: the input's dims in NumPy's order; the scan runs on both in that order
        order = numpy_order(shape, [tuple(s // x.itemsize for s in x.strides)])
        xs = np.ascontiguousarray(x.transpose(order))
        dense = np.empty_like(xs)
        pos = order.index(axis)
        n = shape[axis]
        inner = math.prod(xs.shape[pos + 1 :])
        j = _kernels()
        half = half_kind(d)
        flat_x, flat_out = xs.reshape(-1), dense.reshape(-1)
        if inner == 1:
            parallel(j.scan(code, "rows", half), (flat_x, flat_out, n), flat_x.size // n, max(1, _GRAIN // n))
        else:
            outer = flat_x.size // (n * inner)
            parallel(j.scan(code, "slabs", half), (flat_x, flat_out, n, inner), outer, max(1, _GRAIN // (n * inner)))
        return from_array(dense.transpose(np.argsort(order)).view(d.numpy), d)

    kernel.__name__ = f"kiln_cpu_{name}"
    kernel.__doc__ = f"Numba kernel for {name} (kiln-cpu)."
    return kernel


def kernels() -> dict[str, tuple]:
    """The scan kernels: op name -> (kernel, output dtypes served)."""
    return {name: (_scan_kernel(name, code), SERVED) for name, code in _opcodes.SCANS.items()}
