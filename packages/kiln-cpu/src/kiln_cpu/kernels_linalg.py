"""kiln-cpu's products: ``matmul``, ``bmm``, ``addmm`` and ``baddbmm`` on Intel MKL where it is installed
and chosen (:mod:`kiln_cpu._mkl`, :data:`kiln_cpu.config.blas`: 2-d and equal-batch 3-d float32/float64
operands, from :data:`kiln_cpu.config.mkl_min_macs` multiply-adds), else on NumPy's BLAS, on as many BLAS
threads as the product warrants (:func:`kiln_cpu._blas.threads_for`: small products never wake
OpenBLAS's threads, which would then spin on cores the next kernels need).

``addmm`` and ``baddbmm`` give MKL the ``alpha`` and ``beta`` scales and the input, broadcast into the
result first, which MKL adds as it writes the product (a ``Linear`` layer's bias; PyTorch does the same).
On OpenBLAS they apply the scales and the input in place on the product, where the reference makes a new
array for each step: about 10% faster at 256x256, 2-4% at 1024x1024 (benchmarks/bench_cpu.py). On
OpenBLAS ``matmul`` and ``bmm`` run the reference itself (it calls BLAS without copies for contiguous and
transposed float32/float64 operands: ``astype(copy=False)`` is a no-op there, and NumPy hands a
transposed matrix to BLAS as is). No kiln-cpu threads are woken, so no size threshold applies.
"""

from __future__ import annotations

import numpy as np

import kiln
from kiln.backend import from_array, reference_kernel
from kiln_cpu import _blas, _mkl

FLOAT = (kiln.float32, kiln.float64)
HALF = (kiln.float16, kiln.bfloat16)  # products in float32 (the reference casts)


def _add_product_kernel(name: str):
    reference = reference_kernel(name)

    def kernel(spec, base, a, b, beta=1, alpha=1):
        d = spec.dtype
        plain = type(alpha) in (int, float) and type(beta) in (int, float)  # NumPy scalars promote
        if d not in FLOAT or not plain or not (base._dtype is d and a._dtype is d and b._dtype is d):
            return reference(spec, base, a, b, beta, alpha)
        x, an, bn = base._numpy(), a._numpy(), b._numpy()
        mkl = _mkl.active() if alpha != 0 else None  # (BLAS skips the product at alpha 0: its NaNs would not show)
        out = None if mkl is None else _mkl.matmul(mkl, an, bn, x, alpha, beta)
        if out is not None:  # MKL applied both scales and added the input (its beta)
            return from_array(out, d)
        with _blas.for_product(an.shape[-1], spec.shape):
            out = np.matmul(an, bn)
        if out.shape != tuple(spec.shape) or not out.flags.c_contiguous or not out.flags.writeable:
            return reference(spec, base, a, b, beta, alpha)
        if alpha != 1:
            np.multiply(out, alpha, out=out)
        if beta != 0:  # beta == 0 ignores the input's values (NaN included), as the reference
            np.add(out, x if beta == 1 else x * beta, out=out)
        return from_array(out, d)

    kernel.__name__ = f"kiln_cpu_{name}"
    kernel.__doc__ = (
        f"BLAS product with the scales and the input's term for {name}: in MKL's call, else in place after "
        "OpenBLAS's (kiln-cpu)."
    )
    return kernel


def _product_kernel(name: str):
    reference = reference_kernel(name)

    def kernel(spec, a, b):
        mkl = _mkl.active()
        if mkl is not None and spec.dtype in FLOAT and a._dtype is spec.dtype and b._dtype is spec.dtype:
            out = _mkl.matmul(mkl, a._numpy(), b._numpy())
            if out is not None and out.shape == tuple(spec.shape):
                return from_array(out, spec.dtype)
        with _blas.for_product(a._shape[-1], spec.shape):
            return reference(spec, a, b)

    kernel.__name__ = f"kiln_cpu_{name}"
    kernel.__doc__ = f"The reference {name} on as many BLAS threads as the product warrants (kiln-cpu)."
    return kernel


def kernels() -> dict[str, tuple]:
    """The product kernels: op name -> (kernel, output dtypes served)."""
    table = {name: (_add_product_kernel(name), FLOAT) for name in ("addmm", "baddbmm")}
    table.update((name, (_product_kernel(name), FLOAT + HALF)) for name in ("matmul", "bmm"))
    return table
