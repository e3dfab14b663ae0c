"""Random streams for samplers and splits, drawn from kiln's generators.

Permutations are ``kiln.randperm`` draws from the given :class:`kiln.Generator` (its default CPU
generator when ``None``); other sampling (with replacement, weighted) uses a NumPy PCG64 stream seeded by
one 63-bit draw from that generator. Either way the same kiln seed gives the same order, and
``kiln.manual_seed`` controls the unseeded case.
"""

from __future__ import annotations

import numpy as np

import kiln


def draw_seed(generator=None) -> int:
    """One non-negative 63-bit integer from ``generator`` (kiln's default CPU generator when ``None``)."""
    return int(kiln.randint(0, 2**63 - 1, (), generator=generator).item())


def numpy_stream(generator=None) -> np.random.Generator:
    """A NumPy generator seeded from one draw of ``generator``."""
    return np.random.Generator(np.random.PCG64(draw_seed(generator)))


def randperm(n: int, generator=None) -> np.ndarray:
    """A random permutation of ``range(n)`` as an int64 array."""
    return kiln.randperm(n, generator=generator).numpy()
