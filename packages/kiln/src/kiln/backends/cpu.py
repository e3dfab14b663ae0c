"""``kiln.backends.cpu``: what the CPU offers kiln's kernels."""

from __future__ import annotations

import functools
import platform

__all__ = ["get_cpu_capability"]


@functools.cache
def get_cpu_capability() -> str:
    """The widest vector instruction set of this CPU that compiled kernels may use: ``"AVX512"``,
    ``"AVX2"`` or ``"DEFAULT"`` on x86-64 (as PyTorch names them), ``"DEFAULT"`` elsewhere. Numba
    compiles kiln-cpu's kernels for the host CPU, so this is also what they use."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return "DEFAULT"
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            flags = next((line.split(":", 1)[1].split() for line in fh if line.startswith("flags")), [])
    except OSError:
        return "DEFAULT"
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= set(flags):
        return "AVX512"
    return "AVX2" if "avx2" in flags else "DEFAULT"
