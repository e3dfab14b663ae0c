"""kiln-cpu: Numba JIT kernels for kiln's ``"cpu"`` device.

Installing the distribution is enough: kiln finds the plugin through its entry point (group ``kiln``,
name ``cpu``) and its kernels take precedence over the NumPy reference kernels for the ops and dtypes
they serve. Kernels compile on first use of each (op, dtype, layout) and are cached on disk
(``NUMBA_CACHE_DIR``); importing this package imports neither Numba nor the kernels.
"""

from __future__ import annotations

from kiln_cpu._threads import get_num_threads, set_num_threads

__version__ = "0.1.0"

__all__ = ["blas", "get_num_threads", "set_num_threads"]


def blas() -> str:
    """Which BLAS runs kiln-cpu's products, in words: Intel MKL where the ``mkl`` wheel is installed
    (``pip install kiln-cpu[mkl]``) and not turned off (``KILN_CPU_BLAS=openblas``), else NumPy's
    OpenBLAS (``kiln doctor`` prints it). Loads MKL if it is installed and not loaded yet."""
    from kiln_cpu._mkl import describe

    return describe()
