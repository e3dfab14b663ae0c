"""DLPack exchange and pickling.

``Tensor.__dlpack__`` hands out a CPU tensor's memory through NumPy's DLPack exporter (zero copy);
``kiln.from_dlpack`` takes any producer's capsule through NumPy (for the CPU) and keeps the producer
alive as the storage's owner. bfloat16 is not exchanged yet (NumPy's DLPack support has no bfloat16).
"""

from __future__ import annotations

import numpy as np

from kiln import _dtype as dt
from kiln._device import CPU
from kiln._tensor import Tensor

_DLPACK_CPU = 1


def tensor_dlpack_device(t: Tensor) -> tuple[int, int]:
    """``(device_type, device_id)`` in DLPack's numbering (CPU is 1)."""
    if t._device is CPU:
        return (_DLPACK_CPU, 0)
    raise BufferError(f"kiln cannot export {t._device} tensors through DLPack yet")


def tensor_dlpack(t: Tensor, stream=None, **kwargs):
    """A DLPack capsule viewing ``t``'s memory (CPU tensors)."""
    if t._requires_grad:
        raise RuntimeError("Can't export tensors that require gradient, use tensor.detach()")
    if t._device is not CPU:
        raise BufferError(f"kiln cannot export {t._device} tensors through DLPack yet")
    a = t._numpy()
    if t._dtype is dt.bfloat16:
        raise BufferError(
            "kiln cannot export bfloat16 tensors through DLPack yet (NumPy's exporter has no bfloat16); "
            "convert with .float() first"
        )
    return a.__dlpack__(**{k: v for k, v in kwargs.items() if k in ("max_version", "dl_device", "copy")})


def from_dlpack(ext) -> Tensor:
    """Import a DLPack producer (anything with ``__dlpack__``) as a CPU tensor sharing its memory."""
    from kiln._ops.creation import from_numpy

    if isinstance(ext, Tensor):
        return ext
    dev = getattr(ext, "__dlpack_device__", None)
    if dev is not None and dev()[0] != _DLPACK_CPU:
        raise BufferError(f"kiln can import only CPU DLPack tensors for now (got device type {dev()[0]})")
    return from_numpy(np.from_dlpack(ext))


def _rebuild(array: np.ndarray, dtype_name: str, requires_grad: bool, device: str) -> Tensor:
    from kiln._ops.creation import tensor

    return tensor(array, dtype=dt._BY_NAME[dtype_name], device=device, requires_grad=requires_grad)


def reduce_tensor(t: Tensor):
    """Pickle support: values as a NumPy array plus dtype, device and requires_grad."""
    from kiln._ops.copy import host_array

    if t.grad_fn is not None:
        raise RuntimeError(
            "Can't pickle a tensor that is part of an autograd graph (it has a grad_fn); detach() it first."
        )
    return (_rebuild, (np.array(host_array(t)), t._dtype.name, t._requires_grad, str(t._device)))
