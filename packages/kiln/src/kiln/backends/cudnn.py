"""``kiln.backends.cudnn``: cuDNN's switches. kiln does not use cuDNN (kiln-cuda has its own convolution
kernels), so :func:`is_available` is False and the flags are recorded for programs that set them."""

from __future__ import annotations

import contextlib
import sys

__all__ = ["flags", "is_available", "version"]


def is_available() -> bool:
    """False: kiln has no cuDNN backend."""
    return False


def version() -> None:
    """None: no cuDNN library is loaded."""
    return None


enabled = True
"""Whether cuDNN may be used (it never is in kiln)."""
benchmark = False
"""Whether to benchmark convolution algorithms (kiln has one algorithm per shape)."""
benchmark_limit = 10
"""How many cuDNN algorithms ``benchmark`` tries."""
deterministic = False
"""Whether cuDNN must pick deterministic algorithms (kiln's kernels are deterministic anyway)."""
allow_tf32 = True
"""Whether cuDNN convolutions may use TF32 (PyTorch's default: True; kiln never does)."""


@contextlib.contextmanager
def flags(enabled=False, benchmark=False, benchmark_limit=10, deterministic=False, allow_tf32=True):
    """Set the cuDNN flags for the block and restore them after it."""
    mod = sys.modules[__name__]
    saved = (mod.enabled, mod.benchmark, mod.benchmark_limit, mod.deterministic, mod.allow_tf32)
    mod.enabled, mod.benchmark, mod.benchmark_limit = enabled, benchmark, benchmark_limit
    mod.deterministic, mod.allow_tf32 = deterministic, allow_tf32
    try:
        yield
    finally:
        mod.enabled, mod.benchmark, mod.benchmark_limit, mod.deterministic, mod.allow_tf32 = saved
