"""glibc's allocator settings for tensor-sized arrays.

glibc serves an allocation above its mmap threshold (128 KiB at start) with fresh pages from the kernel,
and gives them back when the array is freed; every such array is page-faulted in again, zeroed by the
kernel, and its unmapping interrupts the other threads to flush their TLBs. glibc raises the threshold
itself (to the size of the largest mmapped block freed so far, up to 32 MiB) and the heap's trim
threshold with it (twice that), but only once a large enough array has been freed: until then a
training loop whose activations are a few MiB pays the page faults on every step. A small CNN step
(benchmarks/bench_cpu.py's) ran in 52 ms in a fresh process and in 21 ms once an earlier 16 MiB array
had been freed.

:func:`tune` sets both thresholds where glibc's own rule ends (32 MiB and 64 MiB), so the process runs
from the start as it would after its first large array. Larger arrays are still mapped and unmapped;
the heap keeps at most 64 MiB of freed memory at its top for reuse. It runs once, when kiln loads
kiln-cpu's kernels, and only where it can change nothing the user chose: on glibc, when neither
``MALLOC_MMAP_THRESHOLD_``/``MALLOC_TRIM_THRESHOLD_`` nor a ``glibc.malloc`` tunable is set, and unless
``KILN_CPU_MALLOC_TUNING=0``.
"""

from __future__ import annotations

import ctypes
import os
import sys

MMAP_THRESHOLD = 32 << 20
"""Arrays up to this many bytes come from the heap (glibc's largest dynamic mmap threshold on 64-bit)."""

TRIM_THRESHOLD = 2 * MMAP_THRESHOLD
"""Free memory kept at the top of the heap before it is returned to the kernel (glibc's dynamic rule)."""

_M_TRIM_THRESHOLD = -1  # mallopt parameter numbers (malloc.h)
_M_MMAP_THRESHOLD = -3

_tuned: bool | None = None


def _user_chose() -> bool:
    """Whether the environment already sets glibc's malloc thresholds or opts out."""
    if os.environ.get("KILN_CPU_MALLOC_TUNING", "").strip() == "0":
        return True
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ:
        return True
    return "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", "")


def tune() -> bool:
    """Set glibc's mmap and trim thresholds (see the module docstring) once per process; returns whether
    they are set. Does nothing off Linux, on another C library, or when the user chose (environment)."""
    global _tuned
    if _tuned is not None:
        return _tuned
    _tuned = False
    if not sys.platform.startswith("linux") or _user_chose():
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only: musl's mallopt does nothing
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _tuned = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _tuned
