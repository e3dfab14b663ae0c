"""Tunables of kiln-cpu, read on every kernel call (plain module attributes: set them at run time)."""

from __future__ import annotations

import os

min_numel = int(os.environ.get("KILN_CPU_MIN_NUMEL", "") or 1 << 18)
"""Below this many output elements (reductions: input elements) an op runs the NumPy reference kernel:
below 256K elements NumPy's own SIMD loops are as fast as a Numba loop, and waking threads costs more
than they save (benchmarks/bench_cpu.py measures the crossover). The environment variable
``KILN_CPU_MIN_NUMEL`` sets the default; tests set it to 0 so every size runs the Numba kernels."""

multipass_min_numel = 1024
"""The ops whose reference makes several NumPy passes or calls per element run their Numba kernel from
this many elements (or :data:`min_numel`, whichever is smaller): the accumulating index ops
(``np.add.at``) and pow. One serial Numba pass beats the reference's passes from here, and below the
thread grain the kernels wake no threads; below it the loop's fixed cost (its arguments' checks and
scratch arrays) outweighs them (index_add of 4x8: 11 us by the reference, 52 us by the loop)."""

chain_min_numel = 1
"""The ops whose reference is a chain of NumPy calls, each with its fixed cost, run their one Numba pass
from this many elements (or :data:`min_numel`, whichever is smaller): softmax, log_softmax and logsumexp
and their backward, the norms, nll_loss and the pools. The loop is faster at every size (2x10:
log_softmax 13.4 us by the reference's six calls, 5.5 us by the loop; nll_loss 26 against 11 us;
layer_norm 23 against 10 us; a 2x2 max pool of 2x10, 206 against 19 us)."""


blas_threads_min_macs = 1 << 22
"""Products (matmul, mm, bmm, addmm, baddbmm, the convolutions' blocks) of fewer multiply-adds than this
run NumPy's BLAS on one thread; larger ones on :func:`kiln.get_num_threads` threads. OpenBLAS's threads
spin for a tenth of a second after each product they share, holding cores the next kernels need
(:mod:`kiln_cpu._blas`); below 4M multiply-adds a second thread saves tens of microseconds at most
(64x1568x10: 31 us against 46 us; 256x256x256, 16M: 156 us against 232 us)."""


mkl_min_macs = int(os.environ.get("KILN_CPU_MKL_MIN_MACS", "") or 1 << 19)
"""Products of fewer multiply-adds than this run NumPy's OpenBLAS even where MKL is chosen (:data:`blas`),
unless their second operand is transposed (:data:`mkl_min_macs_transposed`). MKL's calls go through Numba
(:func:`kiln_cpu._jit_gemm.mkl_product`, about 0.5 us each; through ctypes each had cost about 8 us more),
and on an Intel Xeon on one thread a whole ``matmul`` of plain operands took 1.01-1.12x OpenBLAS's time
from 8x8x8 to 64x64x64 (262K multiply-adds), 0.88x at 96x96x96 (885K). The environment variable
``KILN_CPU_MKL_MIN_MACS`` sets the default (and caps :data:`mkl_min_macs_transposed`'s); kiln-cpu's MKL
tests set it to 0 so that every product runs MKL."""

mkl_min_macs_transposed = min(mkl_min_macs, 1 << 15)
"""Products whose second operand is transposed (``x @ w.t()``, a ``Linear`` layer's), where OpenBLAS is
slow, run MKL from this many multiply-adds: on an Intel Xeon on one thread a whole ``matmul`` took 0.84-0.86x
OpenBLAS's time at 48x48x48 and 64x64x64, 0.52-0.73x for 128x256x10, 128x10x256 and 10x128x256 (1.00x at
32x32x32, 1.04-1.11x below)."""


blas = os.environ.get("KILN_CPU_BLAS", "").strip().lower() or "auto"
"""Which BLAS runs matmul, mm, bmm, addmm and baddbmm: ``"auto"`` (the default) uses Intel MKL where the
``mkl`` wheel is installed (``pip install kiln-cpu[mkl]``), for products of :data:`mkl_min_macs`
multiply-adds or more (:data:`mkl_min_macs_transposed` where the second operand is transposed), and NumPy's
OpenBLAS otherwise;
``"openblas"`` keeps NumPy's. The environment variable ``KILN_CPU_BLAS`` sets the default. Convolutions
always use NumPy's BLAS (:mod:`kiln_cpu._mkl`)."""


def too_small(n: int, multipass: bool = False, chain: bool = False) -> bool:
    """Whether an op with ``n`` elements (0: empty) goes to the reference: below :data:`min_numel`; for
    ``multipass`` ops only below the smaller of :data:`min_numel` and :data:`multipass_min_numel`, for
    ``chain`` ops below the smaller of :data:`min_numel` and :data:`chain_min_numel`."""
    if chain:
        return n == 0 or n < min(min_numel, chain_min_numel)
    return n == 0 or n < (min(min_numel, multipass_min_numel) if multipass else min_numel)
