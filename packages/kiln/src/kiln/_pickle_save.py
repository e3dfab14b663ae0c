"""Writing PyTorch's ``torch.save`` zip archive, so that ``torch.load`` reads what ``kiln.save`` wrote.

The archive is a zip of stored (uncompressed) records under one folder ``<name>/``: ``data.pkl`` (the
object, pickle protocol 2), ``.format_version``, ``.storage_alignment``, ``byteorder``, one record
``data/<key>`` per storage holding its raw bytes in native byte order, and ``version``. Each record's
bytes start at a multiple of 64 in the file (padding goes in the local header's extra field), as
PyTorch's writer aligns them for ``torch.load(mmap=True)``.

Tensors pickle as PyTorch's do: ``torch._utils._rebuild_tensor_v2(storage, offset, size, stride,
requires_grad, OrderedDict())`` with the storage a persistent id ``("storage", torch.FloatStorage,
key, location, numel)``. The whole storage of a tensor is saved once, however many tensors view it, so
views stay views after loading (in kiln and in torch). Parameters of kiln-nn pickle as
``torch._utils._rebuild_parameter``, dtypes as ``torch.float32`` and friends, ``kiln.Size`` as
``torch.Size`` and devices as ``torch.device``; everything else (modules, optimizers, NumPy arrays,
your own classes) pickles as Python pickles it. The names are written as PyTorch's without importing
torch: the pickler writes their ``GLOBAL`` opcodes itself.
"""

from __future__ import annotations

import io
import pickle
import struct
import sys
import zlib
from collections import OrderedDict
from typing import Any, BinaryIO

import numpy as np

from kiln import _dtype as dt
from kiln._device import CPU
from kiln._device import device as _device
from kiln._pickle_load import STORAGE_DTYPES
from kiln._tensor import Size, Tensor, contiguous_strides

ALIGNMENT = 64
FORMAT_VERSION = b"3\n"  # the archive version torch.save writes


class _Global:
    """A torch name to write as a ``GLOBAL`` opcode (never imported)."""

    __slots__ = ("module", "name")

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name

    def __call__(self, *args: Any) -> None:  # pickle's save_reduce wants a callable; torch's lives in torch
        raise TypeError(f"{self.module}.{self.name} is only a name in a pickle")


_REBUILD_V2 = _Global("torch._utils", "_rebuild_tensor_v2")
_REBUILD_PARAMETER = _Global("torch._utils", "_rebuild_parameter")
_REBUILD_PARAMETER_STATE = _Global("torch._utils", "_rebuild_parameter_with_state")
_REBUILD_FROM_TYPE = _Global("torch._tensor", "_rebuild_from_type_v2")
_TORCH_TENSOR = _Global("torch", "Tensor")
_TORCH_SIZE = _Global("torch", "Size")
_TORCH_DEVICE = _Global("torch", "device")
_STORAGE_GLOBALS = {d: _Global("torch", f"{prefix}Storage") for prefix, d in STORAGE_DTYPES.items()}


class _StorageRef:
    """One saved storage: its key, where it came from, and its bytes (a 1-D host array)."""

    __slots__ = ("key", "dtype", "location", "host")

    def __init__(self, key: str, dtype: dt.dtype, location: str, host: np.ndarray) -> None:
        self.key, self.dtype, self.location, self.host = key, dtype, location, host


def _parameter_class() -> type | None:
    mod = sys.modules.get("kiln.nn.parameter")  # a Parameter exists only if kiln-nn was imported
    return None if mod is None else mod.Parameter


class _Pickler(pickle._Pickler):  # the Python pickler: its save_global can be given names to write
    def __init__(self, file: BinaryIO, protocol: int = 2) -> None:
        super().__init__(file, protocol=protocol)
        self.storages: dict[int, _StorageRef] = {}  # by id of the storage object
        self._keep: list[Any] = []  # the objects those ids belong to, alive until the pickle is written
        self._parameter = _parameter_class()

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is _StorageRef:
            return ("storage", _STORAGE_GLOBALS[obj.dtype], obj.key, obj.location, obj.host.shape[0])
        return None

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, Tensor):
            return self._reduce_tensor(obj)
        if type(obj) is _Global or type(obj) is dt.dtype:
            return obj.name  # a name: save_global below writes it
        if type(obj) is Size:
            return (_TORCH_SIZE, (tuple(obj),))
        if type(obj) is _device:
            return (_TORCH_DEVICE, (str(obj),))
        return NotImplemented

    def save_global(self, obj: Any, name: str | None = None) -> None:
        if type(obj) is _Global:
            module, qual = obj.module, obj.name
        elif type(obj) is dt.dtype:
            module, qual = "torch", obj.name
        else:
            super().save_global(obj, name)
            return
        self.write(pickle.GLOBAL + f"{module}\n{qual}\n".encode())
        self.memoize(obj)

    def _storage(self, t: Tensor) -> tuple[_StorageRef, int, tuple[int, ...]]:
        """The saved storage of ``t`` with ``t``'s offset and strides in it."""
        st = t._storage
        ref = self.storages.get(id(st))
        if ref is None:
            if t._device is CPU:
                host = st
            else:
                from kiln._plugins import device_type

                host = device_type(t._device).to_host(st)
            if not isinstance(host, np.ndarray) or host.ndim != 1 or host.dtype != t._dtype.numpy:
                return self._copy(t)  # storage of another dtype (a view(dtype) of it): save the values alone
            host = np.ascontiguousarray(host)
            ref = _StorageRef(str(len(self.storages)), t._dtype, str(t._device), host)
            self.storages[id(st)] = ref
            self._keep.append(st)
        elif ref.dtype is not t._dtype:
            return self._copy(t)
        return ref, t._offset, t._stride

    def _copy(self, t: Tensor) -> tuple[_StorageRef, int, tuple[int, ...]]:
        host = np.ascontiguousarray(t.detach().cpu()._numpy()).reshape(-1)
        ref = _StorageRef(str(len(self.storages)), t._dtype, str(t._device), host)
        self.storages[id(host)] = ref
        self._keep.append(host)
        return ref, 0, contiguous_strides(t._shape)

    def _reduce_tensor(self, t: Tensor) -> tuple:
        cls = type(t)
        state = t.__dict__
        if cls is self._parameter and cls is not None:
            data = Tensor._make_subclass(Tensor, t)
            if state:
                return (_REBUILD_PARAMETER_STATE, (data, t.requires_grad, OrderedDict(), state))
            return (_REBUILD_PARAMETER, (data, t.requires_grad, OrderedDict()))
        ref, offset, stride = self._storage(t)
        args = (ref, offset, tuple(t._shape), tuple(stride), t.requires_grad, OrderedDict())
        if cls is Tensor and not state:
            return (_REBUILD_V2, args)
        return (_REBUILD_FROM_TYPE, (_REBUILD_V2, _TORCH_TENSOR if cls is Tensor else cls, args, state))


def check_pickle_args(pickle_module: Any, protocol: Any, zipfile: Any = True, no_byteorder: Any = False) -> None:
    """``kiln.save``'s ``pickle_module`` (Python's own only), ``pickle_protocol`` (2 and up) and zip switches
    (the archive always records its byte order; the pre-1.6 legacy format is not written)."""
    if zipfile is not True or no_byteorder is not False:
        raise NotImplementedError(
            "kiln.save writes PyTorch's zip archive with its byteorder record only (not the legacy format)"
        )
    if pickle_module is not pickle:
        name = getattr(pickle_module, "__name__", pickle_module)
        raise NotImplementedError(f"kiln.save writes archives with Python's pickle module only, not {name!r}")
    if isinstance(protocol, bool) or not isinstance(protocol, int) or not 2 <= protocol <= pickle.HIGHEST_PROTOCOL:
        raise ValueError(
            f"kiln.save: pickle_protocol must be an int from 2 to {pickle.HIGHEST_PROTOCOL}, got {protocol!r}"
        )


def pickle_object(obj: Any, protocol: int = 2) -> tuple[bytes, list[_StorageRef]]:
    """``obj`` pickled as ``data.pkl`` (pickle ``protocol``), and the storages it refers to in key order."""
    buf = io.BytesIO()
    p = _Pickler(buf, protocol)
    p.dump(obj)
    return buf.getvalue(), sorted(p.storages.values(), key=lambda r: int(r.key))


# ------------------------------------------------------------------------------------- the zip writer


_DOS_TIME, _DOS_DATE = 0, (1 << 5) | 1  # 1980-01-01 00:00, as PyTorch's writer stamps every record


class _ZipWriter:
    """A minimal zip writer: stored records, 64-byte aligned data, Zip64 where sizes or offsets need it."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh = fh
        self.pos = 0
        self.central: list[bytes] = []

    def _emit(self, data: Any) -> None:
        self.fh.write(data)
        self.pos += len(data) if isinstance(data, bytes) else memoryview(data).nbytes

    def record(self, name: str, data: Any) -> None:
        view = memoryview(data).cast("B") if not isinstance(data, bytes) else data
        size = len(view)
        crc = zlib.crc32(view)
        offset = self.pos
        fname = name.encode("utf-8")
        zip64 = size >= 0xFFFFFFFF or offset >= 0xFFFFFFFF
        local_extra = struct.pack("<HHQQ", 1, 16, size, size) if zip64 else b""
        header_len = 30 + len(fname) + len(local_extra)
        pad = -(offset + header_len + 4) % ALIGNMENT  # 4: the padding field's own header
        local_extra += struct.pack("<HH", 0x4246, pad) + b"\0" * pad  # an extra field of zeros ("FB")
        t, d = _DOS_TIME, _DOS_DATE
        small = 0xFFFFFFFF if zip64 else size
        version = 45 if zip64 else 20
        self._emit(
            struct.pack(
                "<IHHHHHIIIHH", 0x04034B50, version, 0x800, 0, t, d, crc, small, small, len(fname), len(local_extra)
            )
            + fname
            + local_extra
        )
        if size:
            self._emit(view)
        c_extra = b""
        fields = [size, size] if size >= 0xFFFFFFFF else []
        if offset >= 0xFFFFFFFF:
            fields.append(offset)
        if fields:
            c_extra = struct.pack(f"<HH{len(fields)}Q", 1, 8 * len(fields), *fields)
        self.central.append(
            struct.pack(
                "<IHHHHHHIIIHHHHHII",
                0x02014B50,
                version,
                version,
                0x800,
                0,
                t,
                d,
                crc,
                0xFFFFFFFF if size >= 0xFFFFFFFF else size,
                0xFFFFFFFF if size >= 0xFFFFFFFF else size,
                len(fname),
                len(c_extra),
                0,
                0,
                0,
                0,
                0xFFFFFFFF if offset >= 0xFFFFFFFF else offset,
            )
            + fname
            + c_extra
        )

    def close(self) -> None:
        start = self.pos
        for entry in self.central:
            self._emit(entry)
        size, n = self.pos - start, len(self.central)
        if start >= 0xFFFFFFFF or size >= 0xFFFFFFFF or n >= 0xFFFF:
            eocd64 = self.pos
            self._emit(struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, n, n, size, start))
            self._emit(struct.pack("<IIQI", 0x07064B50, 0, eocd64, 1))
        self._emit(
            struct.pack(
                "<IHHHHIIH",
                0x06054B50,
                0,
                0,
                min(n, 0xFFFF),
                min(n, 0xFFFF),
                min(size, 0xFFFFFFFF),
                min(start, 0xFFFFFFFF),
                0,
            )
        )


def write_archive(fh: BinaryIO, name: str, pkl: bytes, storages: list[_StorageRef]) -> None:
    """Write the archive of an object pickled by :func:`pickle_object` to ``fh``."""
    z = _ZipWriter(fh)
    z.record(f"{name}/data.pkl", pkl)
    z.record(f"{name}/.format_version", b"1")
    z.record(f"{name}/.storage_alignment", str(ALIGNMENT).encode())
    z.record(f"{name}/byteorder", sys.byteorder.encode())
    for ref in storages:
        z.record(f"{name}/data/{ref.key}", ref.host.view(np.uint8))
    z.record(f"{name}/version", FORMAT_VERSION)
    z.close()
