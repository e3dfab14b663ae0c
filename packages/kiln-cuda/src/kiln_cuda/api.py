"""The names ``kiln.cuda`` has beyond the generic per-device ones: devices and their properties, streams
and events, and the caching allocator's controls — PyTorch's ``torch.cuda`` names and semantics.

kiln's own ``kiln.cuda`` module answers ``is_available``, ``device_count``, ``synchronize``,
``memory_allocated``, ``memory_reserved``, ``max_memory_allocated``, ``empty_cache`` and the seeding
functions from the device contract; everything listed in ``__all__`` here is added to it by the contract's
``module`` (``kiln.cuda.Stream`` is :class:`kiln_cuda.streams.Stream`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading

import numpy as np

from kiln_cuda import _driver
from kiln_cuda.memory import OutOfMemoryError, allocator, format_size
from kiln_cuda.streams import Event, Stream, StreamContext, current_stream, default_stream, set_stream, stream

__all__ = [
    "OutOfMemoryError",
    "Stream",
    "Event",
    "StreamContext",
    "current_stream",
    "default_stream",
    "set_stream",
    "stream",
    "current_device",
    "set_device",
    "device",
    "device_of",
    "get_device_name",
    "get_device_capability",
    "get_device_properties",
    "is_bf16_supported",
    "mem_get_info",
    "memory_summary",
    "reset_peak_memory_stats",
    "reset_max_memory_allocated",
    "reset_accumulated_memory_stats",
    "set_per_process_memory_fraction",
    "get_per_process_memory_fraction",
]

_local = threading.local()


def _no_device() -> RuntimeError:
    reason = _driver.unavailable_reason()
    return RuntimeError(f"Found no NVIDIA driver on your system or no usable GPU: {reason}")


def _check_index(index: int) -> int:
    count = _driver.device_count()
    if not _driver.is_available():
        raise _no_device()
    if not 0 <= index < count:
        raise RuntimeError(f"CUDA error: invalid device ordinal {index} (this machine has {count} GPU(s))")
    return index


def _device_index(device) -> int:
    """A device argument (None, int, str, kiln.device) as a GPU index; None is the current device."""
    if device is None:
        return current_device()
    if isinstance(device, int):
        return _check_index(device)
    import kiln

    d = kiln.device(device) if not isinstance(device, kiln.device) else device
    if d.type != "cuda":
        raise ValueError(f"Expected a cuda device, but got: {d}")
    return current_device() if d.index is None else _check_index(d.index)


@contextlib.contextmanager
def _on_device(index: int):
    """numba.cuda's current GPU is ``index`` inside the block (no switch on the simulator's single GPU)."""
    if _driver.SIM or index == getattr(_local, "numba_index", 0):
        yield
        return
    previous = getattr(_local, "numba_index", 0)
    with _driver.cuda().gpus[index]:
        _local.numba_index = index
        try:
            yield
        finally:
            _local.numba_index = previous


def current_device() -> int:
    """The index of the current GPU (``cuda`` without an index means this one)."""
    return getattr(_local, "device", 0)


def set_device(device) -> None:
    """Make ``device`` (an index, ``"cuda:1"`` or a kiln.device) the current GPU of this thread."""
    _local.device = _device_index(device)


class device:  # noqa: N801 - torch.cuda.device's name
    """``with kiln.cuda.device(1):`` — the current GPU is 1 inside the block (None or -1: no change)."""

    def __init__(self, device):
        self.idx = -1 if device is None or device == -1 else _device_index(device)
        self.prev_idx = -1

    def __enter__(self):
        if self.idx != -1:
            self.prev_idx = current_device()
            set_device(self.idx)
        return self

    def __exit__(self, *exc) -> None:
        if self.idx != -1:
            set_device(self.prev_idx)


class device_of(device):  # noqa: N801 - torch.cuda.device_of's name
    """``with kiln.cuda.device_of(t):`` — the current GPU is ``t``'s inside the block (no change for a CPU
    tensor)."""

    def __init__(self, obj):
        d = obj.device
        super().__init__(d.index if d.type == "cuda" else None)


@dataclasses.dataclass(frozen=True)
class _CudaDeviceProperties:
    """What ``get_device_properties`` reports (``torch.cuda.get_device_properties``'s fields)."""

    name: str
    major: int
    minor: int
    total_memory: int
    multi_processor_count: int
    warp_size: int = 32
    is_integrated: bool = False

    def __repr__(self) -> str:
        return (
            f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
            f"total_memory={self.total_memory // (1 << 20)}MB, multi_processor_count={self.multi_processor_count})"
        )


def get_device_properties(device=None) -> _CudaDeviceProperties:
    """Name, compute capability, memory and multiprocessor count of a GPU."""
    index = _device_index(device)
    from kiln_cuda.memory import _total_memory

    if _driver.SIM:
        gpu = _driver.cuda().get_current_device()
        name, sms = "numba CUDA simulator", 1
    else:
        with _on_device(index):
            gpu = _driver.cuda().get_current_device()
        name = gpu.name.decode() if isinstance(gpu.name, bytes) else str(gpu.name)
        sms = int(gpu.MULTIPROCESSOR_COUNT)
    cc = tuple(gpu.compute_capability)
    return _CudaDeviceProperties(name, cc[0], cc[1], _total_memory(index), sms)


def get_device_name(device=None) -> str:
    """The GPU's name ("NVIDIA H100 80GB HBM3"; the simulator's under NUMBA_ENABLE_CUDASIM)."""
    return get_device_properties(device).name


def get_device_capability(device=None) -> tuple[int, int]:
    """The GPU's compute capability, (major, minor)."""
    p = get_device_properties(device)
    return p.major, p.minor


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """Whether bfloat16 tensors compute on this GPU (kiln-cuda converts them to float32 bit-wise, so every
    GPU can; without ``including_emulation``, whether the GPU has bfloat16 arithmetic: compute 8.0+)."""
    if not _driver.is_available():
        return False
    return True if including_emulation or _driver.SIM else get_device_capability()[0] >= 8


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of the GPU, as the driver reports them."""
    from kiln_cuda.memory import _mem_info

    return _mem_info(_device_index(device))


def reset_peak_memory_stats(device=None) -> None:
    """Restart the peak counters of ``memory_stats`` (``max_memory_allocated`` ...) from now."""
    allocator(_device_index(device)).reset_peak_stats()


def reset_max_memory_allocated(device=None) -> None:
    """PyTorch's older name for :func:`reset_peak_memory_stats`."""
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device=None) -> None:
    """Zero the running totals of ``memory_stats`` (allocations and frees so far, retries, OOMs)."""
    allocator(_device_index(device)).reset_accumulated_stats()


def set_per_process_memory_fraction(fraction: float, device=None) -> None:
    """Cap what the caching allocator may reserve on a GPU at ``fraction`` of its memory; an allocation
    past the cap raises ``OutOfMemoryError``, as one past the GPU's memory does."""
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if not 0 <= fraction <= 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    allocator(_device_index(device)).fraction = fraction


def get_per_process_memory_fraction(device=None) -> float:
    """The cap set by :func:`set_per_process_memory_fraction` (1.0 when none)."""
    f = allocator(_device_index(device)).fraction
    return 1.0 if f is None else f


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A table of the caching allocator's statistics for a GPU, as ``torch.cuda.memory_summary`` prints."""
    index = _device_index(device)
    a = allocator(index)
    s = a.stats()
    rows = [
        ("Allocated memory", "allocated_bytes", True),
        ("Requested memory", "requested_bytes", True),
        ("Reserved memory", "reserved_bytes", True),
        ("Allocations", "allocation", False),
        ("GPU reserved segments", "segment", False),
    ]
    width = 75
    out = ["|" + "=" * width + "|", f"|{'kiln CUDA memory summary, device ID ' + str(index):^{width}}|"]
    out.append(
        f"|{'CUDA OOMs: ' + str(s['num_ooms']) + '  |  cudaMalloc retries: ' + str(s['num_alloc_retries']):^{width}}|"
    )
    out.append("|" + "=" * width + "|")
    out.append(f"| {'Metric':<23}| {'Cur Usage':>10} | {'Peak Usage':>10} | {'Tot Alloc':>10} | {'Tot Freed':>9} |")
    out.append("|" + "-" * width + "|")
    for label, key, is_bytes in rows:
        fmt = format_size if is_bytes else str
        vals = [s.get(f"{key}.all.{k}", 0) for k in ("current", "peak", "allocated", "freed")]
        out.append(f"| {label:<23}| {fmt(vals[0]):>10} | {fmt(vals[1]):>10} | {fmt(vals[2]):>10} | {fmt(vals[3]):>9} |")
    out.append("|" + "-" * width + "|")
    out.append(f"| {'Cached blocks':<23}| {a.cached_blocks():>10} |" + " " * (width - 37) + "|")
    out.append("|" + "=" * width + "|")
    return "\n".join(out) + "\n"


def _kiln_dtypes() -> dict:
    import kiln.backend as kb

    return {np.dtype(d.numpy): d for d in kb.ALL_DTYPES}


def cuda_array_interface(t) -> dict:
    """The ``__cuda_array_interface__`` (version 3) of a cuda tensor: its memory, shape and byte strides, and
    the stream its pending work is on. Not part of ``kiln.cuda``: ``Tensor.__cuda_array_interface__`` asks."""
    import kiln

    if t.dtype == kiln.bfloat16:  # the interface's typestr has no bfloat16
        raise TypeError("Got unsupported ScalarType BFloat16")
    np_dtype = np.dtype(t.dtype.numpy)
    size = np_dtype.itemsize
    storage = t.untyped_storage()
    typestr = np_dtype.str
    s = current_stream(storage.device_index).cuda_stream
    return {
        "shape": tuple(t.shape),
        "typestr": typestr,
        "descr": [("", typestr)],
        "data": (storage.data_ptr() + t.storage_offset() * size if t.numel() else 0, False),
        "strides": None if t.is_contiguous() else tuple(st * size for st in t.stride()),
        "version": 3,
        "stream": s or 1,  # 1: the legacy default stream (0 is not allowed)
    }


def from_cuda_array_interface(obj):
    """A cuda tensor sharing ``obj``'s GPU memory (its ``__cuda_array_interface__``), no copy; ``obj`` stays
    alive as long as the tensor. Work pending on the producer's stream is waited for first."""
    import kiln
    import kiln.backend as kb
    from kiln_cuda.memory import CudaStorage

    cai = obj.__cuda_array_interface__
    np_dtype = np.dtype(cai["typestr"])
    dtype = _kiln_dtypes().get(np_dtype)
    if dtype is None:
        raise TypeError(f"__cuda_array_interface__ typestr {cai['typestr']!r} has no kiln dtype")
    shape = tuple(int(n) for n in cai["shape"])
    size = np_dtype.itemsize
    strides = cai.get("strides")
    if strides is None:
        strides = tuple(int(np.prod(shape[i + 1 :], dtype=np.int64)) * size for i in range(len(shape)))
    if any(s < 0 or s % size for s in strides):
        raise ValueError(f"kiln cannot wrap CUDA memory with strides {tuple(strides)} (negative or unaligned)")
    numel = int(np.prod(shape, dtype=np.int64))
    nbytes = (sum((n - 1) * s for n, s in zip(shape, strides)) + size) if numel else 0
    ptr = int(cai["data"][0])
    index = current_device()
    if cai.get("stream") not in (None, 0) and not _driver.SIM:
        _driver.cuda().synchronize()  # the producer's work on its stream must be done before kiln reads
    storage = CudaStorage.external(_raw_bytes(ptr, nbytes, obj), np_dtype, index, obj)
    return kb.tensor_from_storage(
        storage, shape, tuple(s // size for s in strides), 0, dtype, kiln.device("cuda", index)
    )


def _raw_bytes(ptr: int, nbytes: int, owner):
    """A 1-D ``uint8`` device array over ``nbytes`` bytes at device address ``ptr`` (no copy)."""
    if _driver.SIM:  # the simulator's device memory is host memory: a NumPy array over the address
        import ctypes

        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        host = np.ctypeslib.as_array((ctypes.c_uint8 * max(nbytes, 1)).from_address(ptr or _scratch_address()))
        return FakeCUDAArray(host[:nbytes])

    class _Bytes:  # the same memory, described as bytes
        __cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (ptr, False),
            "version": 3,
            "strides": None,
            "stream": None,
        }
        keep = owner

    return _driver.cuda().as_cuda_array(_Bytes())


_SCRATCH = np.zeros(1, np.uint8)


def _scratch_address() -> int:
    return int(_SCRATCH.ctypes.data)


def kiln_doctor() -> list[tuple[str, str]]:
    """What ``kiln doctor`` says about CUDA on this machine: ("info" | "advice", text) pairs. Not part of
    ``kiln.cuda`` (not in ``__all__``): the core's doctor asks the device contract's module for it."""

    out: list[tuple[str, str]] = []
    if _driver.SIM:
        out.append(("info", "NUMBA_ENABLE_CUDASIM=1: kernels run on numba's CUDA simulator (on the CPU, slowly)"))
    elif _driver.is_available():
        for i in range(_driver.device_count()):
            p = get_device_properties(i)
            out.append(("info", f"cuda:{i} {p.name}, compute {p.major}.{p.minor}, {format_size(p.total_memory)}"))
    else:
        out.append(("info", f"no usable GPU: {_driver.unavailable_reason()}"))
        out.append(("advice", "kiln-cuda finds no GPU: an NVIDIA driver (libcuda) is needed; nvidia-smi tells"))
    try:
        if _driver.SIM:
            raise RuntimeError("the simulator has no compiler")
        from numba.cuda.cudadrv import nvvm

        nvvm.NVVM()
        out.append(("info", "CUDA compiler (NVVM): found"))
    except Exception as exc:  # noqa: BLE001 - a diagnosis, never an error
        if _driver.SIM:
            out.append(("info", "CUDA compiler (NVVM): not used by the simulator"))
            return out + _doctor_tail()
        out.append(("info", f"CUDA compiler (NVVM): missing ({type(exc).__name__})"))
        out.append(
            (
                "advice",
                "kiln-cuda cannot compile kernels without NVVM: install a CUDA toolkit, or the toolkit's wheels "
                "with pip install 'kiln-cuda[cu13]' (CUDA 13 drivers) or 'kiln-cuda[cu12]'",
            )
        )
    return out + _doctor_tail()


def _doctor_tail() -> list[tuple[str, str]]:
    import importlib.util

    from kiln_cuda.codegen import cache_dir

    out = []
    if importlib.util.find_spec("nvmath") is None:
        out.append(("info", "cuBLAS binding (nvmath-python): not installed; matmul runs kiln-cuda's tiled kernel"))
    out.append(("info", f"kernel cache: {cache_dir()}"))
    return out
