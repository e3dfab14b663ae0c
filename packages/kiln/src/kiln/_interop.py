"""DLPack exchange and pickling.

``Tensor.__dlpack__`` hands out a CPU tensor's memory through NumPy's DLPack exporter (zero copy);
``kiln.from_dlpack`` takes any producer's capsule through NumPy (for the CPU) and keeps the producer
alive as the storage's owner.

NumPy has no bfloat16, so bfloat16 crosses as uint16 with the dtype relabelled inside the capsule:
the exporter has NumPy export the bits as uint16 and rewrites the capsule's DLTensor dtype to
(kDLBfloat, 16, 1); the importer rewrites a bfloat16 capsule to uint16, has NumPy import it and
views the result as bfloat16. NumPy keeps owning the capsule's life cycle either way (renaming
consumed capsules to ``"used_dltensor"``, calling the deleter when the memory dies).
"""

from __future__ import annotations

import ctypes

import numpy as np

from kiln import _dtype as dt
from kiln._device import CPU
from kiln._tensor import Tensor

_DLPACK_CPU = 1
_DL_UINT = 1  # DLDataTypeCode kDLUInt
_DL_BFLOAT = 4  # DLDataTypeCode kDLBfloat


# ---------------------------------------------------------------------------------------- DLPack C ABI


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    """What a ``"dltensor"`` capsule points to (DLPack < 1.0). kiln only edits ``dl_tensor.dtype``;
    the deleter stays NumPy's or the producer's."""

    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _DLManagedTensorVersioned(ctypes.Structure):
    """What a ``"dltensor_versioned"`` capsule points to (DLPack >= 1.0)."""

    _fields_ = [
        ("version", ctypes.c_uint32 * 2),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _DLTensor),
    ]


_capsule_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi)
)
_capsule_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)


def _dl_tensor(capsule) -> _DLTensor | None:
    """The DLTensor inside an unconsumed DLPack capsule (versioned or not); None for anything else."""
    for name, managed in ((b"dltensor_versioned", _DLManagedTensorVersioned), (b"dltensor", _DLManagedTensor)):
        if _capsule_is_valid(capsule, name):
            return managed.from_address(_capsule_get_pointer(capsule, name)).dl_tensor
    return None


def _relabel(capsule, old: tuple[int, int, int], new_code: int) -> bool:
    """Rewrite the capsule's dtype ``old`` (code, bits, lanes) to type code ``new_code``; False if it is not ``old``."""
    d = _dl_tensor(capsule)
    if d is None or (d.dtype.code, d.dtype.bits, d.dtype.lanes) != old:
        return False
    d.dtype.code = new_code
    return True


class _CapsuleProducer:
    """Hands an existing CPU capsule to ``np.from_dlpack``, which wants an object with ``__dlpack__``."""

    def __init__(self, capsule):
        self._capsule = capsule

    def __dlpack__(self, **kwargs):
        return self._capsule

    def __dlpack_device__(self):
        return (_DLPACK_CPU, 0)


# ---------------------------------------------------------------------------------------- protocol


def tensor_dlpack_device(t: Tensor) -> tuple[int, int]:
    """``(device_type, device_id)`` in DLPack's numbering (CPU is 1)."""
    if t._device is CPU:
        return (_DLPACK_CPU, 0)
    raise BufferError(f"kiln cannot export {t._device} tensors through DLPack yet")


def tensor_dlpack(t: Tensor, stream=None, **kwargs):
    """A DLPack capsule viewing ``t``'s memory (CPU tensors); keywords ``max_version``, ``dl_device``
    and ``copy`` follow the array API standard."""
    if t.requires_grad:
        raise BufferError("Can't export tensors that require gradient, use tensor.detach()")
    if t._device is not CPU:
        raise BufferError(f"kiln cannot export {t._device} tensors through DLPack yet")
    a = t._numpy()
    kwargs = {k: v for k, v in kwargs.items() if k in ("max_version", "dl_device", "copy")}
    if t._dtype is not dt.bfloat16:
        return a.__dlpack__(**kwargs)
    capsule = a.view(np.uint16).__dlpack__(**kwargs)
    _relabel(capsule, (_DL_UINT, 16, 1), _DL_BFLOAT)
    return capsule


def _export_again(ext):
    """A fresh capsule from producer ``ext`` (versioned if it can: that says whether it is writable); None on failure."""
    try:
        try:
            return ext.__dlpack__(max_version=(1, 0))
        except TypeError:  # a producer from before DLPack 1.0
            return ext.__dlpack__()
    except (AttributeError, BufferError, RuntimeError, TypeError, ValueError):
        return None


def from_dlpack(ext) -> Tensor:
    """Import a DLPack producer (anything with ``__dlpack__``) as a CPU tensor sharing its memory.

    NumPy imports every dtype it knows; what it refuses is exported again and, if it is bfloat16,
    imported as relabelled uint16. Otherwise NumPy's error stands.
    """
    from kiln._ops.creation import from_numpy

    if isinstance(ext, Tensor):
        return ext
    dev = getattr(ext, "__dlpack_device__", None)
    if dev is not None and dev()[0] != _DLPACK_CPU and hasattr(ext, "__cuda_array_interface__"):
        return from_cuda_array_interface(ext)  # GPU memory (CuPy, Numba, PyTorch CUDA): shared, as DLPack would
    if dev is not None and dev()[0] != _DLPACK_CPU:
        raise BufferError(f"kiln can import only CPU DLPack tensors for now (got device type {dev()[0]})")
    try:
        return from_numpy(np.from_dlpack(ext))
    except (RuntimeError, BufferError, TypeError) as exc:
        numpy_error = exc
    capsule = _export_again(ext)
    if capsule is None or not _relabel(capsule, (_DL_BFLOAT, 16, 1), _DL_UINT):
        raise numpy_error
    return from_numpy(np.from_dlpack(_CapsuleProducer(capsule)).view(dt.bfloat16.numpy))


# ---------------------------------------------------------------------------------------- CUDA array interface


def _cai_provider(name: str):
    """The function ``name`` of a device plugin's module that speaks the CUDA array interface, or None."""
    from kiln import _plugins

    _plugins.load()
    for dev in _plugins._devices.values():
        fn = getattr(dev.module, name, None)
        if fn is not None:
            return fn
    return None


def tensor_cuda_array_interface(t: Tensor) -> dict:
    """``t.__cuda_array_interface__``: answered by the device plugin of ``t`` (kiln-cuda for ``cuda``)."""
    fn = None
    if t._device is not CPU:
        from kiln._plugins import device_type

        fn = getattr(device_type(t._device.type).module, "cuda_array_interface", None)
    if fn is None:
        raise AttributeError(
            f"Can't get __cuda_array_interface__ on non-CUDA tensor type: {t.type()} If CUDA data is required use "
            "tensor.cuda() to copy tensor to device memory."
        )
    if t.requires_grad:
        raise RuntimeError(
            "Can't get __cuda_array_interface__ on Variable that requires grad. If gradients aren't required, use "
            "var.detach() to get Variable that doesn't require grad."
        )
    return fn(t)


def from_cuda_array_interface(obj) -> Tensor:
    """A tensor sharing the GPU memory of ``obj`` (anything with ``__cuda_array_interface__``: a CuPy array,
    a Numba device array, a PyTorch CUDA tensor), through the device plugin that speaks the interface."""
    fn = _cai_provider("from_cuda_array_interface")
    if fn is None:
        raise RuntimeError(
            f"{type(obj).__name__} holds CUDA memory (__cuda_array_interface__), and no installed device plugin "
            "can wrap it: pip install kiln-cuda"
        )
    return fn(obj)


# ---------------------------------------------------------------------------------------- pickling


def _rebuild(array: np.ndarray, dtype_name: str, requires_grad: bool, device: str) -> Tensor:
    from kiln._ops.creation import tensor

    return tensor(array, dtype=dt._BY_NAME[dtype_name], device=device, requires_grad=requires_grad)


def reduce_tensor(t: Tensor):
    """Pickle support: values as a NumPy array plus dtype, device and requires_grad."""
    from kiln._ops.copy import host_array

    try:
        fn = t.grad_fn
    except RuntimeError:  # a view made under no_grad whose base was written since: PyTorch pickles it
        fn = None
    if fn is not None:
        raise RuntimeError(
            "Can't pickle a tensor that is part of an autograd graph (it has a grad_fn); detach() it first."
        )
    return (_rebuild, (np.array(host_array(t)), t._dtype.name, t.requires_grad, str(t._device)))
