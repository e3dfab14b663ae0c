"""The device contract of device type ``cuda``: what ``kiln_register_devices`` hands to kiln.

Storage is a :class:`~kiln_cuda.memory.CudaStorage` from the current device's caching allocator, on the
current stream; host copies go through numba.cuda's ``copy_to_host`` / ``copy_to_device`` on that stream
and wait for it, so a host array read after a copy holds the data.
"""

from __future__ import annotations

import weakref

import numpy as np

import kiln
from kiln_cuda import _driver, api, memory
from kiln_cuda.streams import current_stream

__all__ = [
    "NAME",
    "empty",
    "from_host",
    "to_host",
    "write",
    "synchronize",
    "memory_stats",
    "device_count",
    "is_available",
    "data_ptr",
    "empty_cache",
    "pin_memory",
    "is_pinned",
]

NAME = "cuda"


def _index(index: int | None) -> int:
    return api.current_device() if index is None else api._check_index(index)


def _new(numel: int, np_dtype, index: int | None) -> memory.CudaStorage:
    i = _index(index)
    return memory.CudaStorage(numel, np_dtype, i, current_stream(i))


def empty(numel: int, dtype: kiln.dtype, index: int | None = None) -> memory.CudaStorage:
    """New storage for ``numel`` elements of ``dtype`` on GPU ``index`` (uninitialised, as ``torch.empty``)."""
    return _new(numel, np.dtype(dtype.numpy), index)


def from_host(array: np.ndarray, index: int | None = None) -> memory.CudaStorage:
    """New storage holding a copy of a 1-D host array (host -> device)."""
    storage = _new(array.size, array.dtype, index)
    write(storage, 0, array)
    return storage


def to_host(storage: memory.CudaStorage) -> np.ndarray:
    """A 1-D host array with a copy of the whole storage (device -> host), after the queued work."""
    s = current_stream(storage.device_index)
    host = storage.array.copy_to_host(stream=s._raw)
    s.synchronize()
    return host.view(storage.dtype) if host.dtype != storage.dtype else host


def write(storage: memory.CudaStorage, start: int, array: np.ndarray) -> None:
    """Copy a 1-D host array into the storage from element ``start`` on (host -> device)."""
    n = array.size
    if n == 0:
        return
    src = np.ascontiguousarray(array, dtype=storage.dtype).view(storage.array.dtype)
    s = current_stream(storage.device_index)
    storage.array[start : start + n].copy_to_device(src, stream=s._raw)
    s.synchronize()  # the host array may be freed or changed as soon as we return


def synchronize(index: int | None = None) -> None:
    """Wait until all work queued on GPU ``index`` has finished."""
    with api._on_device(_index(index)):
        _driver.cuda().synchronize()


def memory_stats(index: int | None = None) -> dict[str, int]:
    """The caching allocator's statistics for GPU ``index`` (``torch.cuda.memory_stats``'s keys)."""
    return memory.allocator(_index(index)).stats()


def device_count() -> int:
    """How many GPUs there are (0 without a usable driver)."""
    return _driver.device_count()


def is_available() -> bool:
    """Whether a GPU, or numba's CUDA simulator, can hold kiln tensors."""
    return _driver.is_available()


def data_ptr(storage: memory.CudaStorage) -> int:
    """The device address of the storage's first element."""
    return storage.data_ptr()


def empty_cache() -> None:
    """Give the cached, unused blocks of every GPU back to the driver."""
    for i in range(device_count()):
        memory.allocator(i).empty_cache()


# Pinned host arrays alive in this process: id -> (weak reference, first byte address, end address). An array
# is pinned when its first element lies in one of them (a NumPy view of a pinned tensor too).
_PINNED: dict[int, tuple[weakref.ref, int, int]] = {}


def pin_memory(numel: int, np_dtype) -> np.ndarray:
    """A 1-D host array of ``numel`` elements in page-locked memory (numba.cuda's ``pinned_array``), which
    the GPU reads and writes by DMA: ``Tensor.pin_memory()``'s storage."""
    dtype = np.dtype(np_dtype)
    nbytes = numel * dtype.itemsize
    raw = _driver.cuda().pinned_array(max(nbytes, 1), dtype=np.uint8)  # bytes: any dtype, bfloat16 included
    host = raw[:nbytes].view(dtype)
    start = raw.ctypes.data
    key = id(host)
    _PINNED[key] = (weakref.ref(host, lambda _, k=key: _PINNED.pop(k, None)), start, start + max(nbytes, 1))
    return host


def is_pinned(array) -> bool:
    """Whether a host array lies in page-locked memory from :func:`pin_memory`."""
    if not isinstance(array, np.ndarray):
        return False
    address = array.__array_interface__["data"][0]
    return any(ref() is not None and start <= address < end for ref, start, end in list(_PINNED.values()))
