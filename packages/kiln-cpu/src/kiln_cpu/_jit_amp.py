"""The Numba loop of kiln-cpu's gradient-scaling kernel (:mod:`kiln_cpu.kernels_amp`), compiled lazily."""

from __future__ import annotations

from numba import njit

from kiln_cpu._jit_support import _SERIAL, _u


@njit(**_SERIAL)
def unscale(g, inv, acc):
    """Multiply the flat gradient ``g`` by ``inv`` in place; return whether it held an inf or NaN. One
    pass, no branch per element (so it vectorises): ``v - v`` is 0 for a finite ``v`` and NaN otherwise,
    and their sum (from ``acc``, a zero of ``g``'s dtype) is NaN exactly when some element was not finite."""
    for j in range(g.size):
        i = _u(j)
        v = g[i]
        acc += v - v
        g[i] = v * inv
    return acc != 0
