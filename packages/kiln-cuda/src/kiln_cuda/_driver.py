"""The one place kiln-cuda touches numba.cuda's driver: whether it runs on the simulator, whether a GPU
is there, and launch sizes.

Under ``NUMBA_ENABLE_CUDASIM=1`` numba.cuda runs kernels on the CPU, one Python thread per CUDA thread:
kiln-cuda then launches small blocks (the simulator's cost is per thread) and binds the scalar math of
its kernels to NumPy (the simulator's Python ``math`` raises where CUDA returns inf or NaN). Everything
else — allocation, copies, streams, events, the kernels' own code — is the same on both.
"""

from __future__ import annotations

import functools
import os

__all__ = ["SIM", "cuda", "is_available", "device_count", "address", "THREADS", "TILE"]

SIM = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")

# Threads per block of the pointwise and reduction kernels, the matmul tile's side, and the most blocks a
# grid-stride launch uses. The simulator starts a Python thread per CUDA thread: its launches stay tiny
# (still more than one thread per block and more than one block, so the trees and strides are exercised).
THREADS = 2 if SIM else 256
TILE = 2 if SIM else 16
MAX_BLOCKS = 2 if SIM else 65535


@functools.cache
def cuda():
    """``numba.cuda`` (imported on first use: it is not cheap)."""
    from numba import cuda as numba_cuda

    return numba_cuda


@functools.cache
def _probe() -> tuple[bool, int, str]:
    try:
        c = cuda()
        if not c.is_available():
            return False, 0, "numba.cuda finds no usable GPU (no driver, or no device)"
        return True, len(c.gpus), ""
    except Exception as exc:  # noqa: BLE001 - a broken toolkit or driver: no device, with the reason for kiln doctor
        return False, 0, f"{type(exc).__name__}: {exc}"


def is_available() -> bool:
    """Whether a GPU (or the simulator) can run kiln's cuda tensors."""
    return _probe()[0]


def unavailable_reason() -> str:
    """Why :func:`is_available` is False ('' when it is True)."""
    return _probe()[2]


def device_count() -> int:
    """How many GPUs numba.cuda sees (the simulator has one)."""
    return _probe()[1]


def address(array) -> int:
    """The device address of a numba device array's first element (a host address under the simulator)."""
    if SIM:
        return int(array._ary.__array_interface__["data"][0])
    return int(array.__cuda_array_interface__["data"][0])


def blocks(n: int, threads: int = THREADS) -> int:
    """Blocks for a grid-stride loop over ``n`` items."""
    return max(1, min(MAX_BLOCKS, -(-n // threads)))
