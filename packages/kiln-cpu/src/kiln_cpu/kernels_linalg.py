"""kiln-cpu's ``addmm`` and ``baddbmm``: the product on BLAS (``np.matmul``, as the reference) with the
``alpha`` scale and the ``beta * input`` term applied in place on the product, where the reference makes
a new array for each step.

``matmul`` and ``bmm`` are not registered: the reference already calls BLAS without copies for
contiguous and transposed float32/float64 operands (``astype(copy=False)`` is a no-op there, and NumPy
hands a transposed matrix to BLAS as is), so no kernel measured faster. The fused epilogue saves an
allocation and a pass per step: about 10% at 256x256, 2-4% at 1024x1024 (benchmarks/bench_cpu.py).
No threads are woken, so no size threshold applies.
"""

from __future__ import annotations

import numpy as np

from kiln import _dtype as dt
from kiln._dispatch import OPS
from kiln._reference import wrap_reference
from kiln._tensor import Tensor, from_array

FLOAT = (dt.float32, dt.float64)


def _add_product_kernel(name: str):
    reference = wrap_reference(OPS[name])

    def kernel(spec, base, a, b, beta=1, alpha=1):
        d = spec[1]
        plain = type(alpha) in (int, float) and type(beta) in (int, float)  # NumPy scalars promote
        if d not in FLOAT or not plain or not all(isinstance(t, Tensor) and t._dtype is d for t in (base, a, b)):
            return reference(spec, base, a, b, beta, alpha)
        out = np.matmul(a._numpy(), b._numpy())
        if out.shape != tuple(spec[0]) or not out.flags.c_contiguous or not out.flags.writeable:
            return reference(spec, base, a, b, beta, alpha)
        if alpha != 1:
            np.multiply(out, alpha, out=out)
        if beta != 0:  # beta == 0 ignores the input's values (NaN included), as the reference
            x = base._numpy()
            np.add(out, x if beta == 1 else x * beta, out=out)
        return from_array(out, d)

    kernel.__name__ = f"kiln_cpu_{name}"
    kernel.__doc__ = f"BLAS product with an in-place epilogue for {name} (kiln-cpu)."
    return kernel


def kernels() -> dict[str, tuple]:
    """The fused product kernels: op name -> (kernel, output dtypes served)."""
    return {name: (_add_product_kernel(name), FLOAT) for name in ("addmm", "baddbmm")}
