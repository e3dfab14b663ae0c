"""Device memory: a caching allocator per GPU and the storage objects kiln's cuda tensors hold.

Freeing device memory synchronises the GPU and allocating it is slow, so kiln-cuda, as PyTorch, never
gives a block back on its own: a freed block goes to a cache, keyed by its stream and size class, and the
next allocation of that class on that stream takes it. ``kiln.cuda.empty_cache()`` returns the cached
blocks to the driver. Blocks come from numba.cuda (``cuda.device_array``), so whatever memory manager
numba uses below (its own, or an external one a program installed) is respected.

Sizes round up to 512 bytes below 1 MiB and to 2 MiB above, so a training loop that allocates the
same shapes each step reuses the same blocks. A block freed on one stream is reused only on that stream
(work queued there runs in order, so reuse is safe without a sync); a block also used on other streams
(:meth:`CudaStorage.record_stream`) waits in a pending list until events recorded on those streams at
free time have completed.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

from kiln_cuda import _driver

__all__ = ["OutOfMemoryError", "CudaStorage", "CachingAllocator", "allocator", "format_size"]

_SMALL = 1 << 20  # below: rounded to 512 B; above: to 2 MiB
_ROUND_SMALL = 512
_ROUND_LARGE = 2 << 20


class OutOfMemoryError(RuntimeError):
    """The device has no memory left for an allocation (``torch.cuda.OutOfMemoryError``)."""


def format_size(n: int) -> str:
    """Bytes as PyTorch's allocator messages print them (``20.00 MiB``)."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} bytes"


def _round(nbytes: int) -> int:
    if nbytes < _SMALL:
        return max(_ROUND_SMALL, -(-nbytes // _ROUND_SMALL) * _ROUND_SMALL)
    return -(-nbytes // _ROUND_LARGE) * _ROUND_LARGE


class _Block:
    """One device allocation of ``size`` bytes (a numba ``uint8`` device array)."""

    __slots__ = ("array", "size", "stream", "streams", "address", "requested", "owner")

    def __init__(self, array, size: int, stream):
        self.array = array
        self.size = size
        self.stream = stream  # the kiln_cuda Stream it was allocated on
        self.streams: set = set()  # other streams that used it (record_stream)
        self.requested = 0  # bytes asked for by the allocation holding it
        self.owner = None  # for memory another library owns: that library's object, kept alive
        self.address = _driver.address(array)


class CachingAllocator:
    """The caching allocator of one GPU, with ``torch.cuda.memory_stats``'s counters."""

    def __init__(self, index: int):
        self.index = index
        self._lock = threading.RLock()
        self._free: dict[tuple, list[_Block]] = {}  # (stream, size) -> cached blocks
        self._pending: list[tuple[_Block, list]] = []  # freed, waiting for other streams' events
        self.fraction: float | None = None  # set_per_process_memory_fraction
        self._stats = dict.fromkeys(
            (
                "allocated_bytes.all.current",
                "allocated_bytes.all.peak",
                "allocated_bytes.all.allocated",
                "allocated_bytes.all.freed",
                "reserved_bytes.all.current",
                "reserved_bytes.all.peak",
                "reserved_bytes.all.allocated",
                "reserved_bytes.all.freed",
                "requested_bytes.all.current",
                "requested_bytes.all.peak",
                "allocation.all.current",
                "allocation.all.peak",
                "allocation.all.allocated",
                "allocation.all.freed",
                "segment.all.current",
                "segment.all.peak",
                "segment.all.allocated",
                "segment.all.freed",
                "num_alloc_retries",
                "num_ooms",
            ),
            0,
        )

    # ------------------------------------------------------------------------------ allocation

    def malloc(self, nbytes: int, stream) -> _Block:
        """A block of at least ``nbytes`` bytes for use on ``stream``: a cached one when one fits."""
        size = _round(nbytes)
        with self._lock:
            self._collect_pending()
            cached = self._free.get((stream, size))
            block = cached.pop() if cached else None
            if block is None:
                block = self._new_block(size, nbytes, stream)
            block.requested = nbytes
            self._add("allocated_bytes", size)
            self._add("allocation", 1)
            self._add("requested_bytes", nbytes, total=False)
            return block

    def _add(self, key: str, n: int, total: bool = True) -> None:
        s = self._stats
        cur = s[f"{key}.all.current"] = s[f"{key}.all.current"] + n
        if cur > s[f"{key}.all.peak"]:
            s[f"{key}.all.peak"] = cur
        if total:
            s[f"{key}.all.allocated"] += n

    def _sub(self, key: str, n: int, total: bool = True) -> None:
        self._stats[f"{key}.all.current"] -= n
        if total:
            self._stats[f"{key}.all.freed"] += n

    def _new_block(self, size: int, nbytes: int, stream) -> _Block:
        limit = self._limit()
        reserved = self._stats["reserved_bytes.all.current"]
        if limit is not None and reserved + size > limit:
            self.empty_cache()
            self._stats["num_alloc_retries"] += 1
            if self._stats["reserved_bytes.all.current"] + size > limit:
                self._oom(nbytes)
        try:
            array = self._device_array(size)
        except Exception as exc:
            if not _is_oom(exc):
                raise
            self.empty_cache()  # give the cache back to the driver, then try once more
            self._stats["num_alloc_retries"] += 1
            try:
                array = self._device_array(size)
            except Exception as exc2:
                if not _is_oom(exc2):
                    raise
                self._oom(nbytes)
        self._add("reserved_bytes", size)
        self._add("segment", 1)
        return _Block(array, size, stream)

    def _device_array(self, size: int):
        from kiln_cuda.api import _on_device

        with _on_device(self.index):
            return _driver.cuda().device_array(size, dtype=np.uint8)

    def _limit(self) -> int | None:
        if self.fraction is None:
            return None
        return int(self.fraction * _total_memory(self.index))

    def _oom(self, nbytes: int):
        self._stats["num_ooms"] += 1
        total = _total_memory(self.index)
        free = _free_memory(self.index)
        allocated = self._stats["allocated_bytes.all.current"]
        reserved = self._stats["reserved_bytes.all.current"]
        msg = (
            f"CUDA out of memory. Tried to allocate {format_size(nbytes)}. GPU {self.index} has a total capacity "
            f"of {format_size(total)} of which {format_size(free)} is free. "
        )
        if self.fraction is not None:
            msg += (
                f"This process is limited to {format_size(self._limit())} "
                f"(set_per_process_memory_fraction({self.fraction})). "
            )
        msg += (
            f"Of the allocated memory {format_size(allocated)} is allocated by kiln, and "
            f"{format_size(reserved - allocated)} is reserved by kiln but unallocated."
        )
        raise OutOfMemoryError(msg)

    # ------------------------------------------------------------------------------ freeing

    def free(self, block: _Block) -> None:
        """Return a block to the cache (called when its storage is garbage)."""
        with self._lock:
            self._sub("allocated_bytes", block.size)
            self._sub("allocation", 1)
            self._sub("requested_bytes", block.requested, total=False)
            if block.streams:
                from kiln_cuda.streams import Event

                events = []
                for s in block.streams:
                    e = Event()
                    e.record(s)
                    events.append(e)
                block.streams = set()
                self._pending.append((block, events))
            else:
                self._free.setdefault((block.stream, block.size), []).append(block)

    def _collect_pending(self) -> None:
        still = []
        for block, events in self._pending:
            if all(e.query() for e in events):
                self._free.setdefault((block.stream, block.size), []).append(block)
            else:
                still.append((block, events))
        self._pending = still

    def empty_cache(self) -> None:
        """Give every cached block back to the driver (blocks in use stay)."""
        with self._lock:
            self._collect_pending()
            for blocks in self._free.values():
                for b in blocks:
                    self._sub("reserved_bytes", b.size)
                    self._sub("segment", 1)
            self._free.clear()

    # ------------------------------------------------------------------------------ statistics

    def stats(self) -> dict[str, int]:
        """``torch.cuda.memory_stats``'s counters for this device."""
        with self._lock:
            return dict(self._stats)

    def reset_peak_stats(self) -> None:
        """Restart every peak counter from its current value."""
        with self._lock:
            for k in self._stats:
                if k.endswith(".peak"):
                    self._stats[k] = self._stats[k.removesuffix(".peak") + ".current"]

    def reset_accumulated_stats(self) -> None:
        """Zero the running totals (allocated/freed counts, retries, OOMs)."""
        with self._lock:
            for k in self._stats:
                if k.endswith((".allocated", ".freed")) or k in ("num_alloc_retries", "num_ooms"):
                    self._stats[k] = 0

    def cached_blocks(self) -> int:
        """How many freed blocks the cache holds (for tests and the summary)."""
        with self._lock:
            return sum(len(v) for v in self._free.values()) + len(self._pending)


def _is_oom(exc: Exception) -> bool:
    return "OUT_OF_MEMORY" in str(exc).upper().replace(" ", "_") or isinstance(exc, MemoryError)


def _mem_info(index: int) -> tuple[int, int]:
    """(free, total) bytes of a GPU; the host's memory under the simulator."""
    if _driver.SIM:
        import os

        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        avail = os.sysconf("SC_AVPHYS_PAGES")
        return avail * size, pages * size
    from kiln_cuda.api import _on_device

    with _on_device(index):
        free, total = _driver.cuda().current_context().get_memory_info()
    return int(free), int(total)


def _total_memory(index: int) -> int:
    return _mem_info(index)[1]


def _free_memory(index: int) -> int:
    return _mem_info(index)[0]


_allocators: dict[int, CachingAllocator] = {}
_allocators_lock = threading.Lock()


def allocator(index: int) -> CachingAllocator:
    """The caching allocator of GPU ``index``."""
    a = _allocators.get(index)
    if a is None:
        with _allocators_lock:
            a = _allocators.setdefault(index, CachingAllocator(index))
    return a


# dtypes numba.cuda cannot hold are stored as same-sized integers (bfloat16's bits as uint16)
def storage_dtype(np_dtype: np.dtype) -> np.dtype:
    """The element type of the device array behind a kiln dtype's storage."""
    np_dtype = np.dtype(np_dtype)
    if np_dtype.kind == "V" or np_dtype.name == "bfloat16":
        return np.dtype(f"u{np_dtype.itemsize}")
    return np_dtype


class CudaStorage:
    """The storage of kiln cuda tensors: ``len(storage)`` elements of one dtype in a cached device block.

    :attr:`array` is a typed numba device array over the block, which kernels index directly.
    """

    __slots__ = ("block", "dtype", "numel", "array", "device_index", "__weakref__")

    def __init__(self, numel: int, np_dtype: np.dtype, index: int, stream):
        np_dtype = np.dtype(np_dtype)
        nbytes = numel * np_dtype.itemsize
        alloc = allocator(index)
        self.block = alloc.malloc(nbytes, stream)
        self.dtype = np_dtype
        self.numel = numel
        self.device_index = index
        self.array = self.block.array[:nbytes].view(storage_dtype(np_dtype))
        weakref.finalize(self, alloc.free, self.block)

    @classmethod
    def external(cls, raw, np_dtype, index: int, owner) -> CudaStorage:
        """Storage over device memory another library owns: ``raw`` is a 1-D ``uint8`` device array over it,
        ``owner`` the object kept alive while the storage lives (never freed by kiln's allocator)."""
        from kiln_cuda.streams import current_stream

        np_dtype = np.dtype(np_dtype)
        self = object.__new__(cls)
        self.block = _Block(raw, raw.shape[0], current_stream(index))
        self.block.owner = owner
        self.dtype = np_dtype
        self.numel = raw.shape[0] // np_dtype.itemsize
        self.device_index = index
        self.array = raw.view(storage_dtype(np_dtype))
        return self

    def __len__(self) -> int:
        return self.numel

    def data_ptr(self) -> int:
        """The device address of element 0."""
        return self.block.address

    def nbytes(self) -> int:
        """The storage's size in bytes."""
        return self.numel * self.dtype.itemsize

    def record_stream(self, stream) -> None:
        """Mark the storage as used by work on ``stream`` (``Tensor.record_stream``): when freed, its block
        is not reused until the work queued on ``stream`` by then has finished."""
        if stream != self.block.stream:
            self.block.streams.add(stream)

    def __repr__(self) -> str:
        return f"<kiln cuda storage {self.numel} x {self.dtype} on cuda:{self.device_index}>"
