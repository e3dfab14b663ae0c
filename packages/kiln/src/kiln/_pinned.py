"""Pinned (page-locked) host memory for CPU tensors: ``Tensor.pin_memory()`` and ``Tensor.is_pinned()``.

A CPU tensor's storage is a 1-D NumPy array. Pinning copies the elements into an array the accelerator's
device plugin allocates in page-locked memory (its contract's ``pin_memory(numel, np_dtype)``), which the
device can copy from by DMA, without a staging buffer; the plugin's ``is_pinned(array)`` recognises such
memory again. The accelerator is the first available device type other than ``"cpu"``
(:func:`kiln.accelerator.current_accelerator`). Without one, pinning raises PyTorch's error and
``is_pinned()`` is False, as on a CPU-only PyTorch. Importing this module (kiln does) adds the two methods to
:class:`kiln.Tensor`.
"""

from __future__ import annotations

import warnings

from kiln._device import CPU, as_device
from kiln._tensor import Tensor


def _deprecated_device(method: str, device) -> None:
    if device is not None:
        warnings.warn(
            f"The argument 'device' of Tensor.{method}() is deprecated. Please do not pass this argument.",
            DeprecationWarning,
            stacklevel=3,
        )


def _contracts(device) -> list:
    """The device contracts that may hold pinned memory: the named one, or every available accelerator."""
    from kiln import _plugins

    _plugins.load()
    if device is not None:
        d = as_device(device)
        return [] if d.type == "cpu" else [_plugins.device_type(d)]
    return [c for name, c in _plugins._devices.items() if name != "cpu" and c.is_available()]


def is_pinned(self, device=None) -> bool:
    """True when this CPU tensor lies in an accelerator's pinned memory (see :meth:`pin_memory`)."""
    _deprecated_device("is_pinned", device)
    if self.is_sparse or self._device is not CPU:
        return False
    return any(c.is_pinned is not None and c.is_pinned(self._storage) for c in _contracts(device))


def pin_memory(self, device=None) -> Tensor:
    """A copy in the accelerator's pinned (page-locked) host memory, or ``self`` when pinned already.

    Copies to the device from pinned memory skip a staging buffer. Dense CPU tensors only; ``RuntimeError``
    without an accelerator (as PyTorch). ``device`` is deprecated, as in PyTorch.
    """
    from kiln._ops.copy import host_array
    from kiln._tensor import _make, contiguous_strides

    _deprecated_device("pin_memory", device)
    if self.is_sparse or self._device is not CPU:
        raise RuntimeError(f"cannot pin '{self.type()}' only dense CPU tensors can be pinned")
    contracts = [c for c in _contracts(device) if c.pin_memory is not None]
    if not contracts:
        raise RuntimeError("Cannot access accelerator device when none is available.")
    if is_pinned(self):
        return self
    if self.requires_grad:  # a copy outside autograd would silently cut the graph
        raise RuntimeError("kiln cannot pin a tensor that requires grad yet: pin the data before setting requires_grad")
    numel = 1
    for n in self._shape:
        numel *= n
    storage = contracts[0].pin_memory(numel, self._dtype.numpy)
    if numel:
        storage[:] = host_array(self).reshape(-1)
    return _make(storage, self._shape, contiguous_strides(self._shape), 0, self._dtype, CPU)


Tensor.pin_memory = pin_memory
Tensor.is_pinned = is_pinned
