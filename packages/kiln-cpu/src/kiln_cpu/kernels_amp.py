"""kiln-cpu's gradient-scaling kernel: ``_amp_non_finite_check_and_unscale_`` (kiln-amp's ``GradScaler``)
as one Numba pass over a dense float32 or float64 gradient (:mod:`kiln_cpu._jit_amp`) that unscales it
and finds infs and NaNs together; the reference's two NumPy passes read the gradient twice. Other
dtypes (the half ones) run the reference, and so do non-dense gradients. Results are the reference's bit for bit: the same
one multiplication per element in the gradient's dtype.
"""

from __future__ import annotations

import numpy as np

from kiln.backend import host_view
from kiln_cpu._kernel_support import FLOAT, _flat, loops, with_fallback

_loops = loops("_jit_amp")


def _unscale(spec, grad, found_inf, inv_scale):
    flat = _flat(host_view(grad))
    if flat is None:
        return None
    dtype = flat.dtype.type
    inv = dtype(np.float32(host_view(inv_scale).reshape(())))
    if _loops().unscale(flat, inv, dtype(0)):
        host_view(found_inf)[...] = 1.0
    return grad


def kernels() -> dict[str, tuple]:
    """Op name -> (kernel, output dtypes it serves)."""
    name = "_amp_non_finite_check_and_unscale_"
    return {name: (with_fallback(name, _unscale), FLOAT)}
