"""Tunables of kiln-cpu, read on every kernel call (plain module attributes: set them at run time)."""

from __future__ import annotations

import os

min_numel = int(os.environ.get("KILN_CPU_MIN_NUMEL", "") or 1 << 18)
"""Below this many output elements (reductions: input elements) an op runs the NumPy reference kernel:
below 256K elements NumPy's own SIMD loops are as fast as a Numba loop, and waking threads costs more
than they save (benchmarks/bench_cpu.py measures the crossover). The environment variable
``KILN_CPU_MIN_NUMEL`` sets the default; tests set it to 0 so every size runs the Numba kernels."""
