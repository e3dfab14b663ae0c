"""Intel MKL's GEMM for kiln-cpu's products, when the ``mkl`` wheel is installed (``pip install
kiln-cpu[mkl]``): ``cblas_sgemm``/``cblas_dgemm`` and their strided-batch forms in ``libmkl_rt``, the
wheel's single dynamic library, called from Numba code without the GIL
(:func:`kiln_cpu._jit_gemm.mkl_product`: about 0.5 us a call, where ctypes took about 8 us).

The library is found through the ``mkl`` distribution's file list (``importlib.metadata``: a venv, a
``--user`` or a ``--prefix`` install alike) and loaded on first use with ``RTLD_LOCAL``, so its
symbols never replace another copy's: PyTorch links its own MKL statically and exports it, and the two
coexist in one process in either import order (tests/test_mkl.py). Only MKL's C entry points are called
(``MKL_Set_Num_Threads_Local``; the lower-case ``mkl_set_num_threads_local`` is the Fortran binding,
which takes a pointer). Its threads come from its default layer, Intel OpenMP (the ``intel-openmp``
wheel it depends on); a product runs on :func:`kiln_cpu._blas.threads_for` threads, set with
``MKL_Set_Num_Threads_Local`` for the calling thread only and restored after.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import threading

import numpy as np

from kiln_cpu import _blas, config
from kiln_cpu._kernel_support import loops

_jit = loops("_jit_gemm")

_UNSET = object()
_found = _UNSET  # the loaded MKL (an _MKL) or None, decided on first use
_error: str | None = None  # why MKL is not used, when it is installed but could not be loaded
_lock = threading.Lock()


def library_path() -> str | None:
    """The file of ``libmkl_rt`` in the installed ``mkl`` distribution (Linux: ``libmkl_rt.so.N``,
    Windows: ``mkl_rt.N.dll``), None when the distribution or the file is missing."""
    try:
        dist = importlib.metadata.distribution("mkl")
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or ():
        name = file.name
        if name.startswith("libmkl_rt.so") or (name.startswith("mkl_rt.") and name.endswith(".dll")):
            path = os.path.realpath(str(dist.locate_file(file)))
            if os.path.exists(path):
                return path
    return None


class _MKL:
    """The entry points kiln-cpu calls: their addresses, for :func:`kiln_cpu._jit_gemm.mkl_product`, and
    ``set_threads`` (``MKL_Set_Num_Threads_Local``) typed for ctypes, to read or set the calling thread's MKL
    thread count from Python."""

    def __init__(self, lib: ctypes.CDLL, path: str):
        self.lib = lib
        self.path = path

        def address(name: str) -> int:
            return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value

        self.gemm: dict[np.dtype, tuple[int, int]] = {}  # dtype -> (gemm address, batch gemm address or 0)
        for dtype, letter in ((np.dtype(np.float32), "s"), (np.dtype(np.float64), "d")):
            batch = f"cblas_{letter}gemm_batch_strided"
            self.gemm[dtype] = (address(f"cblas_{letter}gemm"), address(batch) if hasattr(lib, batch) else 0)
        self.threads_address = address("MKL_Set_Num_Threads_Local")
        self.set_threads = lib.MKL_Set_Num_Threads_Local
        self.set_threads.argtypes, self.set_threads.restype = [ctypes.c_int], ctypes.c_int
        buf = ctypes.create_string_buffer(256)
        lib.MKL_Get_Version_String(buf, len(buf))
        self.version = " ".join(buf.value.decode(errors="replace").split())


def load() -> _MKL | None:
    """The loaded MKL, or None (not installed, or it failed to load: :func:`error` says why)."""
    global _found, _error
    if _found is _UNSET:
        with _lock:
            if _found is _UNSET:
                path = library_path()
                mkl = None
                if path is not None:
                    try:
                        mkl = _MKL(ctypes.CDLL(path, mode=os.RTLD_LOCAL if hasattr(os, "RTLD_LOCAL") else 0), path)
                    except (OSError, AttributeError) as exc:  # a broken install, an old MKL without an entry point
                        _error = f"{path}: {exc}"
                _found = mkl
    return _found


def error() -> str | None:
    """Why an installed MKL is not used (None: it is, or it is not installed)."""
    load()
    return _error


def matmul(
    mkl: _MKL, a: np.ndarray, b: np.ndarray, base: np.ndarray | None = None, alpha: float = 1, beta: float = 0
) -> np.ndarray | None:
    """``alpha * (a @ b) + beta * base`` (``base``, of the operands' dtype, broadcast to the product; not read
    when ``beta`` is 0) of float32 or float64 arrays of one dtype, ``a`` and ``b`` both 2-d, or both 3-d with
    one batch size (each matrix readable by BLAS, a batch dim with a stride), by MKL into a new C-contiguous
    array (:func:`kiln_cpu._jit_gemm.mkl_product`); None where it does not apply or the product is too small
    for MKL to gain (:data:`kiln_cpu.config.mkl_min_macs`, :data:`kiln_cpu.config.mkl_min_macs_transposed`):
    the caller runs NumPy's product."""
    dtype, sa, sb = a.dtype, a.shape, b.shape
    entry = mkl.gemm.get(dtype)
    if entry is None or b.dtype != dtype or len(sa) != len(sb):
        return None
    if len(sa) == 2:
        (m, k), (k2, n) = sa, sb
        shape, macs = (m, n), m * n * k
    elif len(sa) == 3 and sa[0] == sb[0]:
        (batch, m, k), (_, k2, n) = sa, sb
        shape, macs = (batch, m, n), batch * m * n * k
    else:
        return None
    if k != k2 or not macs or max(m, n, k) >= 1 << 31:
        return None  # (an empty product: NumPy's makes it)
    size, a_strides, b_strides = dtype.itemsize, a.strides[-2:], b.strides[-2:]
    transposed = n > 1 and b_strides[1] != size  # x @ w.t(): OpenBLAS's slow case
    if macs < (config.mkl_min_macs_transposed if transposed else config.mkl_min_macs):
        return None
    if size not in a_strides or size not in b_strides:
        return None  # no unit stride: BLAS cannot read it (tested before the result is made; the call decides)
    out = np.empty(shape, dtype)
    if beta != 0:
        np.copyto(out, base)  # (broadcast; MKL adds beta times it to the product in the same pass)
    threads = _blas.threads_for(macs) or 1  # None: one thread, as OpenBLAS runs a product of that size
    done = _jit().mkl_product(*entry, mkl.threads_address, threads, float(alpha), float(beta), a, b, out)
    return out if done else None


def active() -> _MKL | None:
    """The MKL that products use now: the loaded one unless :data:`kiln_cpu.config.blas` is
    ``"openblas"``."""
    return None if config.blas == "openblas" else load()


def describe() -> str:
    """Which BLAS runs kiln-cpu's products, in words (``kiln doctor``, :func:`kiln_cpu.blas`)."""
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        numpy_blas = f"NumPy's {blas.get('name', 'BLAS')} {blas.get('version', '')}".rstrip()
    except (TypeError, KeyError, AttributeError, ValueError):  # an old NumPy, a build without the record
        numpy_blas = "NumPy's BLAS"
    mkl = active()
    if mkl is not None:
        return (
            f"{mkl.version} ({mkl.path}) for the matmul, mm, bmm, addmm and baddbmm of 2-d or equal-batch 3-d "
            f"float32/float64 operands that BLAS reads as they are, from {config.mkl_min_macs:,} multiply-adds "
            f"({config.mkl_min_macs_transposed:,} with a transposed second operand); {numpy_blas} for other "
            "products and convolutions"
        )
    if error():
        return f"{numpy_blas} (MKL is installed but failed to load: {error()})"
    if library_path() is not None:
        return f"{numpy_blas} (MKL is installed, KILN_CPU_BLAS=openblas turns it off)"
    return numpy_blas
