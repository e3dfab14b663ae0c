"""``kiln.accelerator``: the device-agnostic way PyTorch programs pick their device (``torch.accelerator``).

The accelerator is the first available non-CPU device type a plugin registers (kiln-cuda's ``"cuda"``,
or a third-party device), so a program written as ::

    device = kiln.accelerator.current_accelerator() if kiln.accelerator.is_available() else "cpu"

runs on whatever device the machine has, with no device name in its source. The other functions answer
for that device type through its ``kiln.<type>`` module (:mod:`kiln._device_module`).
"""

from __future__ import annotations

from kiln._device import device as _device

__all__ = [
    "current_accelerator",
    "device_count",
    "empty_cache",
    "is_available",
    "max_memory_allocated",
    "max_memory_reserved",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "synchronize",
]


def _accelerator_type() -> str | None:
    from kiln import _plugins

    _plugins.load()
    for name, contract in _plugins._devices.items():
        if name != "cpu" and contract.is_available():
            return name
    return None


def _module():
    """The ``kiln.<type>`` module of the accelerator; RuntimeError (PyTorch's text) when there is none."""
    from kiln._device_module import device_module

    name = _accelerator_type()
    if name is None:
        raise RuntimeError("Cannot access accelerator device when none is available.")
    return device_module(name)


def current_accelerator(check_available: bool = False) -> _device | None:
    """The accelerator's device type as a ``kiln.device`` (``device(type='cuda')``), or None when the
    machine has none. ``check_available`` is accepted for PyTorch's signature: kiln only ever reports an
    available accelerator."""
    name = _accelerator_type()
    return None if name is None else _device(name)


def is_available() -> bool:
    """True when an accelerator device type is installed and usable."""
    return _accelerator_type() is not None


def device_count() -> int:
    """How many devices the accelerator has (0 when there is none)."""
    name = _accelerator_type()
    return 0 if name is None else _module().device_count()


def synchronize(device=None, /) -> None:
    """Wait for the accelerator's queued work to finish."""
    _module().synchronize(device)


def empty_cache() -> None:
    """Release the accelerator allocator's unused cached memory."""
    _module().empty_cache()


def memory_stats(device_index=None, /) -> dict:
    """The accelerator's memory statistics, as its plugin reports them."""
    return _module().memory_stats(device_index)


def memory_allocated(device_index=None, /) -> int:
    """Bytes held by tensors on the accelerator."""
    return _module().memory_allocated(device_index)


def max_memory_allocated(device_index=None, /) -> int:
    """Peak bytes held by tensors on the accelerator."""
    return _module().max_memory_allocated(device_index)


def memory_reserved(device_index=None, /) -> int:
    """Bytes the accelerator's allocator holds, in use or cached."""
    return _module().memory_reserved(device_index)


def max_memory_reserved(device_index=None, /) -> int:
    """Peak bytes the accelerator's allocator held."""
    return _module().max_memory_reserved(device_index)
