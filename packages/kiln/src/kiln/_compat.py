"""PyTorch's smaller top-level names that are not ops: build flags, interop threads, legacy switches,
tensors over Python buffers, and queries PyTorch programs make at their top (``torch.has_lapack``,
``torch.get_device_module("cuda")``, ``torch.set_default_tensor_type(...)``).
"""

from __future__ import annotations

import builtins
import warnings
from typing import Any

from kiln import _dtype as dt
from kiln._tensor import Tensor

__all__ = [
    "empty_permuted",
    "frombuffer",
    "get_device_module",
    "get_num_interop_threads",
    "has_lapack",
    "has_mkl",
    "has_openmp",
    "has_spectral",
    "init_num_threads",
    "is_complex",
    "is_distributed",
    "is_vulkan_available",
    "resolve_conj",
    "resolve_neg",
    "set_anomaly_enabled",
    "set_default_tensor_type",
    "set_flush_denormal",
    "set_num_interop_threads",
    "thread_safe_generator",
]

has_lapack = True
"""True: linear algebra runs (NumPy's LAPACK serves the reference kernels)."""
has_mkl = False
"""False: kiln does not link Intel MKL itself."""
has_openmp = False
"""False: kiln-cpu's thread pool is Numba's, not OpenMP."""
has_spectral = False
"""False: the FFTs of ``kiln.fft`` wait for complex dtypes."""

_interop = {"threads": 1}


def get_num_interop_threads() -> int:
    """Threads for running independent ops at once: kiln runs ops one after another on the calling
    thread (each op may use the intra-op pool, :func:`kiln.get_num_threads`), so 1 unless set."""
    return _interop["threads"]


def set_num_interop_threads(num: int) -> None:
    """Record the inter-op thread count (kiln has no inter-op pool: see :func:`get_num_interop_threads`)."""
    if isinstance(num, builtins.bool) or not isinstance(num, builtins.int) or num <= 0:
        raise RuntimeError("set_num_interop_threads expects a positive integer")
    _interop["threads"] = num


def init_num_threads() -> None:
    """Initialise the thread pools of the calling thread: kiln's need no per-thread set-up."""


def set_flush_denormal(mode: bool) -> bool:
    """Flushing denormal floats to zero is a CPU control register setting NumPy does not expose: returns
    False (not supported), as PyTorch does on CPUs without it."""
    return False


def is_vulkan_available() -> bool:
    """False: kiln has no Vulkan device."""
    return False


def is_complex(input: Tensor) -> bool:
    """False: kiln has no complex dtypes yet (``Tensor.is_complex``)."""
    if not isinstance(input, Tensor):
        raise TypeError(f"is_complex(): argument 'input' (position 1) must be Tensor, not {type(input).__name__}")
    return input.is_complex()


def is_distributed(input: Tensor) -> bool:
    """False: no kiln tensor is split across processes (a legacy query)."""
    if not isinstance(input, Tensor):
        raise TypeError(f"is_distributed(): argument 'input' (position 1) must be Tensor, not {type(input).__name__}")
    return input.is_distributed()


def resolve_conj(input: Tensor) -> Tensor:
    """``input`` itself: kiln has no lazily conjugated (complex) tensors to materialise."""
    return input.resolve_conj()


def resolve_neg(input: Tensor) -> Tensor:
    """``input`` itself: kiln has no lazily negated tensors to materialise."""
    return input.resolve_neg()


def set_anomaly_enabled(enabled: bool, check_nan: bool = True) -> None:
    """Turn anomaly detection on or off (what :class:`kiln.autograd.set_detect_anomaly` does)."""
    from kiln._state import anomaly

    anomaly.update(enabled=builtins.bool(enabled), check_nan=builtins.bool(check_nan))


def set_default_tensor_type(t: Any, /) -> None:
    """Deprecated in PyTorch: set the default floating dtype from a legacy tensor type
    (``kiln.DoubleTensor`` or ``"torch.DoubleTensor"``); warns, as PyTorch does."""
    import kiln

    warnings.warn(
        "kiln.set_default_tensor_type() is deprecated as of PyTorch 2.1, please use kiln.set_default_dtype() and "
        "kiln.set_default_device() as alternatives.",
        UserWarning,
        stacklevel=2,
    )
    name = t if isinstance(t, str) else getattr(t, "__name__", repr(t))
    name = name.rsplit(".", 1)[-1]
    target = _legacy_types().get(name)
    if target is None:
        raise TypeError(f"invalid type: '{t}'")
    if not target.is_floating_point:
        raise TypeError("only floating-point types are supported as the default type")
    kiln.set_default_dtype(target)


def _legacy_types() -> dict[str, dt.dtype]:
    from kiln._ops.legacy import LEGACY_TYPE_NAMES

    return {v: k for k, v in LEGACY_TYPE_NAMES.items()}


def get_device_module(device: Any = None):
    """The module of a device type (``kiln.cuda``, ``kiln.cpu``, ``kiln.<plugin device>``) for a device,
    a device string or a type name; the accelerator's (else the CPU's) when None."""
    from kiln._device import as_device
    from kiln._device_module import device_module

    if device is None:
        import kiln.accelerator

        acc = kiln.accelerator.current_accelerator()
        name = "cpu" if acc is None else acc.type
    else:
        name = as_device(device).type if not isinstance(device, str) or ":" in device else device
    mod = device_module(name)
    if mod is None:
        raise RuntimeError(f"Device '{name}' does not have a corresponding module registered as 'kiln.{name}'.")
    return mod


def thread_safe_generator():
    """The generator to draw from in the calling context: the default CPU generator (kiln-data's workers
    are processes, each with its own seeded default generator)."""
    from kiln.random import default_generator

    return default_generator("cpu")


def frombuffer(buffer: Any, *, dtype: dt.dtype, count: int = -1, offset: int = 0, requires_grad: bool = False):
    """A 1-D CPU tensor over the memory of an object with the buffer protocol (``bytes``,
    ``bytearray``, ``array.array``, ``memoryview``), without a copy: writes through a writable buffer are
    seen by the tensor and back. ``count`` elements (-1: all) starting ``offset`` bytes in."""
    import numpy as np

    from kiln._ops.creation import from_numpy

    if not isinstance(dtype, dt.dtype):
        raise TypeError(f"frombuffer(): argument 'dtype' must be torch.dtype, not {type(dtype).__name__}")
    view = memoryview(buffer)
    nbytes, size = view.nbytes, dtype.itemsize
    if nbytes == 0 or count == 0:
        raise ValueError(f"both buffer length ({nbytes}) and count ({count}) must not be 0")
    if offset < 0 or offset >= nbytes:
        raise ValueError(
            f"offset ({offset} bytes) must be non-negative and no greater than buffer length ({nbytes} bytes) minus 1"
        )
    if count < 0:  # every element after offset (PyTorch takes any negative count so)
        if (nbytes - offset) % size:
            raise ValueError(
                f"buffer length ({nbytes - offset} bytes) after offset ({offset} bytes) must be a multiple of "
                f"element size ({size})"
            )
        count = (nbytes - offset) // size
    elif offset + count * size > nbytes:
        raise ValueError(
            f"requested buffer length ({count} * {size} bytes) after offset ({offset} bytes) must not be greater "
            f"than actual buffer length ({nbytes} bytes)"
        )
    arr = np.frombuffer(view.cast("B"), dtype=dtype.numpy, count=count, offset=offset)
    return from_numpy(arr).requires_grad_(requires_grad)


def empty_permuted(
    size,
    physical_layout,
    *,
    dtype=None,
    layout=None,
    device=None,
    requires_grad: bool = False,
    pin_memory: bool = False,
) -> Tensor:
    """An uninitialised tensor of ``size`` whose dims are laid out in memory in the order
    ``physical_layout`` (outermost first): ``empty_permuted((2, 3), (1, 0))`` is column-major."""
    import kiln

    size, perm = tuple(size), tuple(physical_layout)
    if sorted(perm) != list(range(len(size))):
        raise RuntimeError(
            f"Number of dimensions in size does not match the length of the physical_layout; or physical_layout is not a permutation: {perm}"
        )
    physical = kiln.empty(tuple(size[p] for p in perm), dtype=dtype, device=device)
    inverse = [0] * len(perm)
    for i, p in enumerate(perm):
        inverse[p] = i
    return physical.permute(inverse).requires_grad_(requires_grad)
