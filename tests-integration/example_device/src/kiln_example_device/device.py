"""The device contract of device type ``example``: allocation, host copies, synchronisation, statistics.

These are the functions ``kiln_register_devices`` hands to kiln. Every buffer is 1-D and holds
elements of one dtype; kiln builds shapes, strides and views on top of them by itself.
"""

from __future__ import annotations

import numpy as np

import kiln
from kiln_example_device.memory import Allocator, Buffer

__all__ = [
    "NAME",
    "DEVICE_COUNT",
    "DTYPES",
    "empty",
    "from_host",
    "to_host",
    "write",
    "synchronize",
    "memory_stats",
    "device_count",
    "data_ptr",
]

NAME = "example"
DEVICE_COUNT = 2  # example:0 and example:1, each with its own memory

# The dtypes this device stores. It has no half-precision storage: float16 and bfloat16 tensors
# cannot be created on it, and the conformance suite checks that the error says so.
DTYPES = (kiln.bool, kiln.uint8, kiln.int8, kiln.int16, kiln.int32, kiln.int64, kiln.float32, kiln.float64)
_NUMPY_DTYPES = {np.dtype(d.numpy) for d in DTYPES}

_ALLOCATORS = [Allocator(i) for i in range(DEVICE_COUNT)]


def _allocator(index: int | None) -> Allocator:
    index = 0 if index is None else index
    if not 0 <= index < DEVICE_COUNT:
        raise RuntimeError(f"{NAME} error: invalid device ordinal {index} (only {DEVICE_COUNT} {NAME} devices)")
    return _ALLOCATORS[index]


def _check_dtype(np_dtype: np.dtype) -> None:
    if np.dtype(np_dtype) not in _NUMPY_DTYPES:
        supported = ", ".join(str(d).removeprefix("kiln.") for d in DTYPES)
        raise TypeError(
            f"The {NAME} device does not support {np.dtype(np_dtype).name} tensors (it has no half-precision "
            f"storage); supported dtypes: {supported}."
        )


def empty(numel: int, dtype: kiln.dtype, index: int | None = None) -> Buffer:
    """New storage for ``numel`` elements of ``dtype`` on device ``index`` (zero-filled)."""
    np_dtype = np.dtype(dtype.numpy)
    _check_dtype(np_dtype)
    return _allocator(index).allocate(numel * np_dtype.itemsize, np_dtype)


def from_host(array: np.ndarray, index: int | None = None) -> Buffer:
    """New storage holding a copy of a 1-D host array (host -> device copy)."""
    _check_dtype(array.dtype)
    buffer = _allocator(index).allocate(array.nbytes, array.dtype)
    buffer.array()[:] = array
    return buffer


def to_host(buffer: Buffer) -> np.ndarray:
    """A 1-D host array with a copy of the whole storage (device -> host copy)."""
    return buffer.array().copy()


def write(buffer: Buffer, start: int, array: np.ndarray) -> None:
    """Copy a 1-D host array into storage from element ``start`` on."""
    buffer.array()[start : start + array.size] = array


def synchronize(index: int | None = None) -> None:
    """Wait for queued work: nothing to wait for, every kernel of this device runs synchronously."""
    _allocator(index)


def memory_stats(index: int | None = None) -> dict[str, int]:
    """The allocator's statistics for one device (PyTorch's key names)."""
    return _allocator(index).stats()


def device_count() -> int:
    """How many ``example`` devices there are."""
    return DEVICE_COUNT


def data_ptr(buffer: Buffer) -> int:
    """The buffer's device address (``Tensor.data_ptr()`` adds the view's byte offset)."""
    return buffer.address
