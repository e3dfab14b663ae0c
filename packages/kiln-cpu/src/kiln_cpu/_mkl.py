"""Intel MKL's GEMM for kiln-cpu's products, when the ``mkl`` wheel is installed (``pip install
kiln-cpu[mkl]``): ``cblas_sgemm``/``cblas_dgemm`` and their strided-batch forms, called through ctypes
(which releases the GIL) from ``libmkl_rt``, the wheel's single dynamic library.

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

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112  # CBLAS's enum values

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
    """The entry points kiln-cpu calls, typed for ctypes."""

    def __init__(self, lib: ctypes.CDLL, path: str):
        self.lib = lib
        self.path = path
        size, real32, real64, ptr = ctypes.c_int, ctypes.c_float, ctypes.c_double, ctypes.c_void_p
        self.gemm = {}
        self.gemm_batch = {}
        for dtype, real, letter in ((np.dtype(np.float32), real32, "s"), (np.dtype(np.float64), real64, "d")):
            fn = getattr(lib, f"cblas_{letter}gemm")
            fn.argtypes = [size] * 6 + [real, ptr, size, ptr, size, real, ptr, size]
            fn.restype = None
            self.gemm[dtype] = fn
            batch = getattr(lib, f"cblas_{letter}gemm_batch_strided", None)
            if batch is not None:
                batch.argtypes = [size] * 6 + [real, ptr, size, size, ptr, size, size, real, ptr, size, size, size]
                batch.restype = None
                self.gemm_batch[dtype] = batch
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


class threads:
    """``with threads(mkl, n):`` runs MKL on ``n`` threads in the calling thread for the block (``n``
    None: one thread, as OpenBLAS runs a product of that size by itself), then restores its setting."""

    __slots__ = ("mkl", "n", "saved")

    def __init__(self, mkl: _MKL, n: int | None):
        self.mkl, self.n, self.saved = mkl, n or 1, 0

    def __enter__(self):
        self.saved = self.mkl.set_threads(self.n)
        return self

    def __exit__(self, *exc):
        self.mkl.set_threads(self.saved)  # 0: back to MKL's global setting


def _operand(x: np.ndarray) -> tuple[int, int] | None:
    """(CBLAS transpose flag, leading dimension) of the last two dims of ``x`` as MKL reads a row-major
    matrix, None when neither dim has unit stride (or a broadcast stride of 0 where a leading dimension
    must be positive)."""
    rows, cols = x.shape[-2:]
    s0, s1 = (s // x.itemsize for s in x.strides[-2:])
    if (s1 == 1 or cols == 1) and (rows == 1 or s0 >= max(cols, 1)):
        return NO_TRANS, s0 if rows > 1 else max(cols, 1)
    if (s0 == 1 or rows == 1) and (cols == 1 or s1 >= max(rows, 1)):
        return TRANS, s1 if cols > 1 else max(rows, 1)
    return None


def matmul(mkl: _MKL, a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """``a @ b`` of two float32 or two float64 arrays, both 2-d, or both 3-d with one batch size (each
    matrix readable by BLAS, a batch dim with a stride), by MKL into a new C-contiguous array; None
    where it does not apply or the product has fewer than :data:`kiln_cpu.config.mkl_min_macs`
    multiply-adds (the caller runs NumPy's product)."""
    dtype = a.dtype
    if b.dtype != dtype or dtype not in mkl.gemm or a.ndim != b.ndim or a.ndim not in (2, 3):
        return None
    m, k = a.shape[-2:]
    k2, n = b.shape[-2:]
    if k != k2 or 0 in (m, n, k) or max(m, n, k) >= 1 << 31:
        return None
    batch = a.shape[0] if a.ndim == 3 else 1
    if a.ndim == 3 and (b.shape[0] != batch or (batch > 1 and dtype not in mkl.gemm_batch)):
        return None
    if batch * m * n * k < config.mkl_min_macs:
        return None
    fa, fb = _operand(a), _operand(b)
    if fa is None or fb is None:
        return None
    sa, sb = (a.strides[0] // a.itemsize, b.strides[0] // b.itemsize) if a.ndim == 3 else (0, 0)
    if sa < 0 or sb < 0:
        return None
    out = np.empty((*a.shape[:-2], m, n), dtype)
    if out.size == 0:
        return out
    with threads(mkl, _blas.threads_for(batch * m * n * k)):
        if batch == 1:
            mkl.gemm[dtype](
                ROW_MAJOR,
                fa[0],
                fb[0],
                m,
                n,
                k,
                1.0,
                a.ctypes.data,
                fa[1],
                b.ctypes.data,
                fb[1],
                0.0,
                out.ctypes.data,
                n,
            )
        else:  # a batch stride of 0 (an expanded operand) reads one matrix for every product
            mkl.gemm_batch[dtype](
                ROW_MAJOR,
                fa[0],
                fb[0],
                m,
                n,
                k,
                1.0,
                a.ctypes.data,
                fa[1],
                sa,
                b.ctypes.data,
                fb[1],
                sb,
                0.0,
                out.ctypes.data,
                n,
                m * n,
                batch,
            )
    return out


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
            f"{mkl.version} ({mkl.path}) for matmul, mm, bmm, addmm, baddbmm of {config.mkl_min_macs:,} "
            f"multiply-adds or more; {numpy_blas} for smaller products and convolutions"
        )
    if error():
        return f"{numpy_blas} (MKL is installed but failed to load: {error()})"
    if library_path() is not None:
        return f"{numpy_blas} (MKL is installed, KILN_CPU_BLAS=openblas turns it off)"
    return numpy_blas
