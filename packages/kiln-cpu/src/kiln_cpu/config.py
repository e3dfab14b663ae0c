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


mkl_min_macs = 0
"""Products of fewer multiply-adds than this run NumPy's OpenBLAS even where MKL is chosen (:data:`blas`);
0, the default, gives MKL every product it can read. Its calls go through Numba
(:func:`kiln_cpu._jit_gemm.mkl_product`), about 0.5 us each, and on an Intel Xeon on one thread a whole
``matmul`` then took 0.65-0.93x its time on OpenBLAS from 4x4x4 to 200x200x200, 0.51-0.70x with a
transposed second operand (``x @ w.t()``), the widest gap at 10x128x256 (12.7 against 24.7 us); only
128x10x256 and a transposed first operand at 128x256x10 were 1.04 and 1.16x. Through ctypes each call
had cost about 8 us more, so this was 4M until then."""


blas = os.environ.get("KILN_CPU_BLAS", "").strip().lower() or "auto"
"""Which BLAS runs matmul, mm, bmm, addmm and baddbmm: ``"auto"`` (the default) uses Intel MKL where the
``mkl`` wheel is installed (``pip install kiln-cpu[mkl]``), for products of :data:`mkl_min_macs`
multiply-adds or more (every size by default), and NumPy's OpenBLAS otherwise;
``"openblas"`` keeps NumPy's. The environment variable ``KILN_CPU_BLAS`` sets the default. Convolutions
always use NumPy's BLAS (:mod:`kiln_cpu._mkl`)."""


def too_small(n: int, multipass: bool = False, chain: bool = False) -> bool:
    """Whether an op with ``n`` elements (0: empty) goes to the reference: below :data:`min_numel`; for
    ``multipass`` ops only below the smaller of :data:`min_numel` and :data:`multipass_min_numel`, for
    ``chain`` ops below the smaller of :data:`min_numel` and :data:`chain_min_numel`."""
    if chain:
        return n == 0 or n < min(min_numel, chain_min_numel)
    return n == 0 or n < (min(min_numel, multipass_min_numel) if multipass else min_numel)
