"""The scan loops (cumsum, cumprod) along contiguous rows or the middle dim of slabs."""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.extending import overload

from kiln_cpu._jit_half import load, store
from kiln_cpu._jit_support import _SERIAL, _const_code
from kiln_cpu._opcodes import CUMSUM

# -------------------------------------------------------------------------------------------- scans


def compute_scratch(half, x, n):
    """An uninitialised array of ``n`` values in ``x``'s compute dtype (float32 for half-precision bits)
    (jitted only)."""
    raise NotImplementedError


@overload(compute_scratch)
def _compute_scratch_impl(half, x, n):
    k = _const_code(half)
    if k is None:
        return None
    if k:
        return lambda half, x, n: np.empty(n, np.float32)
    return lambda half, x, n: np.empty(n, x.dtype)


def _make_scan(code, half):
    def rows(x, out, n, lo, hi):
        """Running sums (products) along the contiguous rows ``x[k*n:(k+1)*n]``, k in [lo, hi), in order,
        the accumulator in the compute dtype (float32 for half precision), each output rounded once."""
        for k in range(lo, hi):
            p = k * n
            acc = load(half, x[p])
            out[p] = store(half, acc)
            for i in range(1, n):
                v = load(half, x[p + i])
                acc = acc + v if code == CUMSUM else acc * v
                out[p + i] = store(half, acc)

    def slabs(x, out, n, inner, lo, hi):
        """The same along the middle dim of the contiguous (outer, n, inner) ``x``, outer index in [lo, hi):
        rows combined in order into ``inner`` accumulators, vectorised along ``inner``."""
        acc = compute_scratch(half, x, inner)
        for o in range(lo, hi):
            base = o * n * inner
            first = x[base : base + inner]
            ofirst = out[base : base + inner]
            for i in range(inner):
                acc[i] = load(half, first[i])
                ofirst[i] = store(half, acc[i])
            for r in range(1, n):
                row = x[base + r * inner : base + (r + 1) * inner]
                orow = out[base + r * inner : base + (r + 1) * inner]
                for i in range(inner):
                    v = load(half, row[i])
                    acc[i] = acc[i] + v if code == CUMSUM else acc[i] * v
                    orow[i] = store(half, acc[i])

    return {"rows": njit(**_SERIAL)(rows), "slabs": njit(**_SERIAL)(slabs)}


_SCAN: dict[tuple, dict] = {}


def scan(code: int, layout: str, half: int = 0):
    """The dispatcher for scan ``code`` (CUMSUM, CUMPROD) in ``layout`` ("rows", "slabs")."""
    kernels = _SCAN.get((code, half))
    if kernels is None:
        kernels = _SCAN[(code, half)] = _make_scan(code, half)
    return kernels[layout]
