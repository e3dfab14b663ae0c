"""Device memory of the example device: buffers and the allocator that hands them out.

A real device keeps tensors in memory the host cannot address directly; this one keeps them in
``bytearray`` blocks, each with a fake device address, owned by one :class:`Allocator` per device
index. The allocator counts what is live (bytes and blocks, current and peak) — the numbers behind
``kiln.example.memory_stats()`` — and gets each block back when the last tensor using it is gone.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

__all__ = ["Buffer", "Allocator"]


class Buffer:
    """One block of device memory holding ``len(buffer)`` elements of one NumPy dtype.

    kiln treats it as opaque storage: it only asks the device contract to allocate, copy and write
    buffers, and takes ``len()`` (in elements) to check views stay inside their storage.
    """

    __slots__ = ("data", "dtype", "device_index", "address", "__weakref__")

    def __init__(self, data: bytearray, dtype: np.dtype, device_index: int, address: int):
        self.data = data
        self.dtype = dtype
        self.device_index = device_index
        self.address = address

    def __len__(self) -> int:
        return len(self.data) // self.dtype.itemsize

    def array(self) -> np.ndarray:
        """The buffer's elements as a writable 1-D NumPy view of the same bytes (no copy).

        The example device's "compute units" are NumPy loops over these views: kernels read their
        inputs and write their outputs in device memory, never through a host copy.
        """
        return np.frombuffer(self.data, dtype=self.dtype)

    def __repr__(self) -> str:
        return f"<example buffer {len(self)} x {self.dtype} at 0x{self.address:x} on example:{self.device_index}>"


class Allocator:
    """Hands out the buffers of one device index and keeps PyTorch-style memory statistics."""

    ALIGNMENT = 512  # block addresses are multiples of this, as a caching GPU allocator's are

    def __init__(self, index: int):
        self.index = index
        self._lock = threading.Lock()
        self._next_address = (index + 1) << 40  # each device has its own address range
        self.current_bytes = 0
        self.peak_bytes = 0
        self.total_bytes = 0
        self.current_blocks = 0
        self.total_blocks = 0

    def allocate(self, nbytes: int, dtype: np.dtype) -> Buffer:
        """A zero-filled buffer of ``nbytes`` bytes for elements of ``dtype``."""
        with self._lock:
            address = self._next_address
            self._next_address += -(-max(nbytes, 1) // self.ALIGNMENT) * self.ALIGNMENT
            self.current_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.current_bytes)
            self.total_bytes += nbytes
            self.current_blocks += 1
            self.total_blocks += 1
        buffer = Buffer(bytearray(nbytes), dtype, self.index, address)
        # The block returns to the allocator when Python frees the buffer (its last tensor is gone).
        weakref.finalize(buffer, self._release, nbytes)
        return buffer

    def _release(self, nbytes: int) -> None:
        with self._lock:
            self.current_bytes -= nbytes
            self.current_blocks -= 1

    def stats(self) -> dict[str, int]:
        """Memory statistics under PyTorch's key names (``torch.cuda.memory_stats``)."""
        with self._lock:
            return {
                "allocated_bytes.all.current": self.current_bytes,
                "allocated_bytes.all.peak": self.peak_bytes,
                "allocated_bytes.all.allocated": self.total_bytes,
                "allocation.all.current": self.current_blocks,
                "allocation.all.allocated": self.total_blocks,
            }

    def reset_peak_stats(self) -> None:
        """Start peak tracking afresh from what is allocated now."""
        with self._lock:
            self.peak_bytes = self.current_bytes
