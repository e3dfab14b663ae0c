"""How many threads NumPy's BLAS uses for kiln-cpu's products.

OpenBLAS (NumPy's wheels) keeps its own threads, and after a multi-threaded product they spin for about
2^28 cycles (a tenth of a second) waiting for the next one, holding a core that kiln-cpu's thread team
and its single-threaded products need: a small CNN's training step took 19.7 ms with OpenBLAS's threads
woken by its 64x1568x10 products, 14.6 ms without. So a product of fewer multiply-adds than
:data:`kiln_cpu.config.blas_threads_min_macs` runs on one thread, never waking them (an OpenBLAS thread
saves little there: 31 us against 46 us at 64x1568x10, before its spin is counted); a larger one uses
:func:`kiln.get_num_threads` threads, at most as many as BLAS had.

The count is set with ``openblas_set_num_threads_local`` (OpenBLAS 0.3.27 or later; 0.4 us a call, read
with ``openblas_get_num_threads``), which is process-wide in OpenBLAS's pthreads builds: the first of
concurrent users saves the count and the last restores it, so other code's products run as configured
again once kiln-cpu's are done (meanwhile they may run on fewer threads: speed only, never results).
With another BLAS, or an older OpenBLAS, nothing is set.
"""

from __future__ import annotations

import ctypes
import glob
import math
import os
import threading

import numpy as np

from kiln_cpu import _threads, config

_UNSET = object()
_found = _UNSET  # (setter, getter, library), found on first use (tests set it to None: "another BLAS")


def _library_paths() -> list[str]:
    """Candidate files of the OpenBLAS NumPy links: its wheel's bundled copy, else the one this process has
    loaded."""
    here = os.path.dirname(np.__file__)
    paths = []
    for folder in (os.path.join(here, os.pardir, "numpy.libs"), os.path.join(here, ".dylibs")):
        paths += sorted(glob.glob(os.path.join(folder, "*openblas*")))
    try:  # a system OpenBLAS: the one this process has loaded
        with open("/proc/self/maps") as maps:
            paths += sorted({line.split()[-1] for line in maps if "openblas" in line and "/" in line})
    except OSError:
        pass
    return paths


_GETTERS = ("openblas_get_num_threads", "scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_")


def _find_functions():
    """(``openblas_set_num_threads_local``, ``openblas_get_num_threads``, the library) of the OpenBLAS NumPy
    calls (the setter returns the previous count); None when NumPy uses another BLAS or an OpenBLAS
    without them."""
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    except (TypeError, KeyError, AttributeError, ValueError):  # an old NumPy, a build without the record
        return None
    if "openblas" not in str(blas.get("name", "")).lower():
        return None
    for path in _library_paths():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        set_fn = getattr(lib, "openblas_set_num_threads_local", None)  # OpenBLAS 0.3.27 or later
        get_fn = next((getattr(lib, name) for name in _GETTERS if hasattr(lib, name)), None)
        if set_fn is None or get_fn is None:
            continue
        set_fn.argtypes, set_fn.restype = [ctypes.c_int], ctypes.c_int
        get_fn.argtypes, get_fn.restype = [], ctypes.c_int
        return set_fn, get_fn, lib
    return None


def functions():
    """The cached :func:`_find_functions` (None: the thread count cannot be set)."""
    global _found
    if _found is _UNSET:
        _found = _find_functions()
    return _found


_lock = threading.Lock()
_users = 0  # calls inside limit() now (user threads may run kernels concurrently)
_saved = 0  # the BLAS thread count before the first of them
_current = 0  # the count kiln-cpu last set while there are users


class limit:
    """``with limit(n):`` runs BLAS on ``n`` threads (no more than it had before) for the block; ``n`` None
    leaves the count as it is. The count is only set when it changes: OpenBLAS's next product after a
    change takes about 5 us longer."""

    __slots__ = ("n",)

    def __init__(self, n: int | None):
        self.n = n

    def __enter__(self):
        global _users, _saved, _current
        if self.n is None:  # (tested first: a small product's block costs no lookup)
            return self
        found = functions()
        if found is None:
            return self
        with _lock:
            if _users == 0:
                _saved = _current = found[1]()
            want = min(self.n, _saved)
            if want != _current:
                found[0](want)
                _current = want
            _users += 1
        return self

    def __exit__(self, *exc):
        global _users, _current
        if self.n is None:
            return
        found = functions()
        if found is None:
            return
        with _lock:
            _users -= 1
            if _users == 0 and _current != _saved:
                found[0](_saved)
                _current = _saved


_BLAS_SERIAL_MACS = 1 << 19
"""OpenBLAS runs a product of at most this many multiply-adds on one thread by itself (its
``GEMM_MULTITHREAD_THRESHOLD`` rule; measured with 2 threads: 655,360 multiply-adds woke no thread,
1,003,520 did): the count is left alone there."""


_gemms: dict | None = None


def _find_gemms() -> dict:
    """``{np.float32: (address, ilp64), np.float64: ...}`` of the cblas gemms in the OpenBLAS whose thread
    count :func:`functions` sets: a ``64_``-suffixed symbol takes 64-bit sizes, a plain ``cblas_?gemm``
    those of the build (``USE64BITINT`` in NumPy's record of it). Empty with another BLAS."""
    if functions() is None:
        return {}
    lib = functions()[2]  # the library whose thread count kiln-cpu sets
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    build_ilp64 = "USE64BITINT" in str(blas.get("openblas configuration", ""))
    found = {}
    for dtype, letter in ((np.dtype(np.float32), "s"), (np.dtype(np.float64), "d")):
        names = ((f"scipy_cblas_{letter}gemm64_", True), (f"cblas_{letter}gemm64_", True))
        for name, wide in (*names, (f"cblas_{letter}gemm", build_ilp64)):
            if hasattr(lib, name):
                found[dtype] = (ctypes.cast(getattr(lib, name), ctypes.c_void_p).value, wide)
                break
    return found


def gemm_function(dtype: np.dtype) -> tuple[int, bool] | None:
    """(address, 64-bit sizes) of NumPy's cblas gemm for ``dtype`` (float32, float64), for Numba code to call
    (:mod:`kiln_cpu._jit_gemm`); None where it cannot be found or the thread count cannot be set (the
    products would then run on BLAS's own threads inside the team's)."""
    global _gemms
    if _gemms is None:
        _gemms = _find_gemms()
    return _gemms.get(np.dtype(dtype)) if functions() is not None else None


def _after_fork() -> None:
    """In a forked child no other thread is inside :class:`limit`: a fresh lock, and the count as it was
    before the parent's users (one of them may have been inside at the fork)."""
    global _lock, _users, _current
    _lock = threading.Lock()
    if _users and _found not in (_UNSET, None) and _current != _saved:
        _found[0](_saved)
    _users, _current = 0, _saved


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def threads_for(macs: int) -> int | None:
    """The BLAS threads for a product of ``macs`` multiply-adds (see the module's docstring): None (leave
    the count alone) at most :data:`_BLAS_SERIAL_MACS`, 1 below
    :data:`kiln_cpu.config.blas_threads_min_macs`, else :func:`kiln.get_num_threads`."""
    if macs <= _BLAS_SERIAL_MACS:
        return None
    return _threads.get_num_threads() if threaded(macs) else 1


def threaded(macs: int) -> bool:
    """Whether a product of ``macs`` multiply-adds runs on kiln's thread count (:func:`threads_for`), rather
    than on one thread."""
    return macs > _BLAS_SERIAL_MACS and macs >= config.blas_threads_min_macs


_UNCHANGED = limit(None)  # the block of every product that leaves the count alone (made once: nothing to hold)


def for_product(k: int, shape: tuple) -> limit:
    """The :class:`limit` for a product of depth ``k`` into a result of ``shape`` (batch dims included)."""
    n = threads_for(k * math.prod(shape))
    return _UNCHANGED if n is None else limit(n)
