"""DLPack exchange and pickling.

``Tensor.__dlpack__`` hands out a CPU tensor's memory through NumPy's DLPack exporter (zero copy);
``kiln.from_dlpack`` takes any producer's capsule through NumPy (for the CPU) and keeps the producer
alive as the storage's owner.

NumPy has no bfloat16, so bfloat16 travels through a small ctypes implementation of DLPack's
(unversioned) C ABI instead: :class:`_DLManagedTensor` in a PyCapsule named ``"dltensor"``. On
export the capsule's tensor keeps the kiln storage alive until the consumer calls its deleter; on
import the capsule is renamed ``"used_dltensor"`` and the producer's deleter runs when the kiln
storage dies.
"""

from __future__ import annotations

import ctypes

import numpy as np

from kiln import _dtype as dt
from kiln._device import CPU
from kiln._tensor import Tensor

_DLPACK_CPU = 1
_DL_BFLOAT = 4  # DLDataTypeCode kDLBfloat
_CAPSULE = b"dltensor"
_USED_CAPSULE = b"used_dltensor"


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
        ("strides", ctypes.POINTER(ctypes.c_int64)),  # in elements; NULL means row-major
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # void (*)(DLManagedTensor *)
_DLManagedTensor._fields_ = [
    ("dl_tensor", _DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _Deleter),
]

# Private prototypes of the CPython capsule API (so ctypes.pythonapi's shared attributes stay untouched)
_CapsuleDestructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, _CapsuleDestructor)(
    ("PyCapsule_New", ctypes.pythonapi)
)
_capsule_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi)
)
_capsule_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)
_capsule_set_name = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_SetName", ctypes.pythonapi)
)
_capsule_get_pointer_raw = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)

# address of an exported _DLManagedTensor -> (the struct, its shape/strides arrays, the kiln storage)
_exported: dict[int, tuple] = {}


@_Deleter
def _export_deleter(address):
    """DLManagedTensor.deleter of kiln's exports: release the struct and the storage it keeps alive."""
    _exported.pop(address, None)


@_CapsuleDestructor
def _capsule_destructor(capsule):
    """A ``"dltensor"`` capsule that no consumer took (still so named) frees its tensor itself."""
    if _capsule_is_valid(capsule, _CAPSULE):
        address = _capsule_get_pointer_raw(capsule, _CAPSULE)
        _DLManagedTensor.from_address(address).deleter(address)


def _export_ctypes(t: Tensor):
    """A ``"dltensor"`` capsule viewing CPU tensor ``t`` (any dtype; used for bfloat16)."""
    storage = t._storage
    ndim = len(t._shape)
    shape = (ctypes.c_int64 * max(ndim, 1))(*t._shape)
    strides = (ctypes.c_int64 * max(ndim, 1))(*t._stride)
    m = _DLManagedTensor()
    m.dl_tensor.data = storage.ctypes.data
    m.dl_tensor.byte_offset = t._offset * t._dtype.itemsize
    m.dl_tensor.device = _DLDevice(_DLPACK_CPU, 0)
    m.dl_tensor.ndim = ndim
    m.dl_tensor.dtype = _DLDataType(_DL_BFLOAT, 16, 1)
    m.dl_tensor.shape = shape
    m.dl_tensor.strides = strides
    m.deleter = _export_deleter
    address = ctypes.addressof(m)
    _exported[address] = (m, shape, strides, storage)
    return _capsule_new(address, _CAPSULE, _capsule_destructor)


class _ImportedMemory:
    """Owner of memory imported through a ``"dltensor"`` capsule: a flat uint16 buffer for NumPy
    (``__array_interface__``) whose finalizer calls the producer's deleter."""

    def __init__(self, address: int, data: int, n: int):
        self._address = address
        self.__array_interface__ = {"data": (data, False), "shape": (n,), "typestr": "<u2", "version": 3}

    def __del__(self):
        m = _DLManagedTensor.from_address(self._address)
        if m.deleter:
            m.deleter(self._address)


def _is_bfloat16(capsule) -> bool:
    """Whether an unconsumed ``"dltensor"`` capsule holds scalar bfloat16 (the capsule is left as is)."""
    if not _capsule_is_valid(id(capsule), _CAPSULE):  # id() is the object's address in CPython
        return False
    d = _DLManagedTensor.from_address(_capsule_get_pointer(capsule, _CAPSULE)).dl_tensor.dtype
    return (d.code, d.bits, d.lanes) == (_DL_BFLOAT, 16, 1)


def _import_ctypes(capsule) -> Tensor:
    """A kiln tensor sharing the memory of a bfloat16 ``"dltensor"`` capsule (consumes it)."""
    from kiln._ops.creation import from_numpy

    address = _capsule_get_pointer(capsule, _CAPSULE)
    m = _DLManagedTensor.from_address(address)
    d = m.dl_tensor
    if d.device.device_type != _DLPACK_CPU:
        raise BufferError(f"kiln can import only CPU DLPack tensors for now (got device type {d.device.device_type})")
    _capsule_set_name(capsule, _USED_CAPSULE)
    shape = tuple(d.shape[i] for i in range(d.ndim))
    if d.strides:
        strides = tuple(d.strides[i] for i in range(d.ndim))
    else:
        strides = tuple(int(np.prod(shape[i + 1 :])) for i in range(d.ndim))
    bf16 = dt.bfloat16.numpy
    if 0 in shape:
        if m.deleter:
            m.deleter(address)
        return from_numpy(np.empty(shape, bf16))
    if any(s < 0 for s in strides):
        if m.deleter:
            m.deleter(address)
        raise BufferError("kiln cannot import DLPack tensors with negative strides")
    span = 1 + sum((n - 1) * s for n, s in zip(shape, strides))
    flat = np.asarray(_ImportedMemory(address, d.data + d.byte_offset, span)).view(bf16)
    return from_numpy(np.lib.stride_tricks.as_strided(flat, shape, tuple(2 * s for s in strides)))


# ---------------------------------------------------------------------------------------- protocol


def tensor_dlpack_device(t: Tensor) -> tuple[int, int]:
    """``(device_type, device_id)`` in DLPack's numbering (CPU is 1)."""
    if t._device is CPU:
        return (_DLPACK_CPU, 0)
    raise BufferError(f"kiln cannot export {t._device} tensors through DLPack yet")


def tensor_dlpack(t: Tensor, stream=None, **kwargs):
    """A DLPack capsule viewing ``t``'s memory (CPU tensors).

    Keywords ``max_version``, ``dl_device`` and ``copy`` follow the array API; bfloat16 tensors are
    always exported as an unversioned ``"dltensor"`` capsule.
    """
    if t._requires_grad:
        raise BufferError("Can't export tensors that require gradient, use tensor.detach()")
    if t._device is not CPU:
        raise BufferError(f"kiln cannot export {t._device} tensors through DLPack yet")
    if t._dtype is dt.bfloat16:
        dl_device = kwargs.get("dl_device")
        if dl_device is not None and tuple(int(v) for v in dl_device) != (_DLPACK_CPU, 0):
            raise BufferError(f"kiln cannot export a CPU tensor to DLPack device {tuple(dl_device)}")
        return _export_ctypes(t.clone() if kwargs.get("copy") else t)
    a = t._numpy()
    return a.__dlpack__(**{k: v for k, v in kwargs.items() if k in ("max_version", "dl_device", "copy")})


def from_dlpack(ext) -> Tensor:
    """Import a DLPack producer (anything with ``__dlpack__``) as a CPU tensor sharing its memory.

    NumPy imports every dtype it knows; what it refuses is retried through kiln's own bfloat16
    importer, and NumPy's error stands when that is not bfloat16 either.
    """
    from kiln._ops.creation import from_numpy

    if isinstance(ext, Tensor):
        return ext
    dev = getattr(ext, "__dlpack_device__", None)
    if dev is not None and dev()[0] != _DLPACK_CPU:
        raise BufferError(f"kiln can import only CPU DLPack tensors for now (got device type {dev()[0]})")
    try:
        return from_numpy(np.from_dlpack(ext))
    except (RuntimeError, BufferError, TypeError) as exc:
        numpy_error = exc
    try:
        capsule = ext.__dlpack__()
    except Exception:
        raise numpy_error from None
    if not _is_bfloat16(capsule):
        raise numpy_error
    return _import_ctypes(capsule)


# ---------------------------------------------------------------------------------------- pickling


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
