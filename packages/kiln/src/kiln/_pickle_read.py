"""Reading ``torch.save`` files: the zip archive (PyTorch >= 1.6) and the legacy pickle format.

:mod:`kiln._pickle_load` says what torch's names load as; this module finds the pickle and the storage
bytes in a file, checks every size against the file before allocating, and unpickles.
"""

from __future__ import annotations

import io
import struct
import sys
import zipfile
import zlib
from collections.abc import Callable
from typing import Any, BinaryIO

import numpy as np

from kiln import _dtype as dt
from kiln._device import CPU
from kiln._device import device as _device
from kiln._pickle_load import (
    StorageType,
    _parameter_class,
    _view,
    allowed_globals,
    build_hook,
    full_find_class,
)
from kiln._tensor import Tensor, _make
from kiln._weights_only import Malformed, Unpickler, Unsupported
from kiln.serialization import _fill, _short

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # the first pickle of a legacy file
LEGACY_PROTOCOL = 1001
_MAX_VERSION = 10  # newest archive format version PyTorch reads


# ------------------------------------------------------------------------------------- storages


class _Loader:
    """What one ``kiln.load`` of a PyTorch file shares: placement, byte order, the memory budget."""

    def __init__(self, map_location: Any, place: Callable, budget: int, swap: bool = False) -> None:
        self.map_location = map_location
        self.place = place
        self.budget = budget  # bytes the file can still back: storages never add up to more than the file
        self.swap = swap
        self.storages: dict[str, Tensor] = {}

    def take(self, nbytes: int, what: str) -> None:
        if nbytes > self.budget:
            raise Malformed(f"{what} declares {nbytes} bytes, more than the file holds ({self.budget} bytes left)")
        self.budget -= nbytes

    def parse_pid(self, pid: Any, n: int) -> tuple[dt.dtype, str, str, int, tuple]:
        if type(pid) is not tuple or len(pid) != n or pid[0] not in ("storage", b"storage"):
            raise Malformed(f"persistent id {_short(pid)} is not a storage reference")
        storage_type, key, location, numel = pid[1:5]
        if not isinstance(storage_type, StorageType):
            raise Malformed(f"persistent id {_short(pid)} does not name a storage type")
        if storage_type.dtype is None:
            raise Unsupported(f"the file holds a torch.{storage_type.torch_dtype} storage, which kiln has no dtype for")
        key, location = _ascii(key, "storage key"), _ascii(location, "storage location")
        if type(numel) is not int or numel < 0:
            raise Malformed(f"storage {_short(key)} has an invalid size {_short(numel)}")
        try:
            _device(location)
        except (RuntimeError, TypeError, ValueError):
            raise Malformed(f"storage {_short(key)} has an invalid location {_short(location)}") from None
        return storage_type.dtype, key, location, numel, pid[5:]

    def fix(self, host: np.ndarray, dtype: dt.dtype) -> None:
        """The byte order and the bools of freshly read bytes, in place."""
        if self.swap and dtype.itemsize > 1:
            host.view(f"u{dtype.itemsize}").byteswap(inplace=True)
        if dtype is dt.bool:
            np.not_equal(host.view(np.uint8), 0, out=host)  # any nonzero byte is True

    def placed(self, t: Tensor, location: str) -> Tensor:
        out = self.place(t, location, self.map_location)
        if not isinstance(out, Tensor) or out._dtype is not t._dtype or out._shape != t._shape:
            raise TypeError(
                f"kiln.load: map_location must give each storage back as a tensor of its dtype and shape "
                f"({t._dtype}, {list(t._shape)}), got {_short(out)}"
            )
        return out if out._stride == (1,) else out.contiguous()


def _ascii(v: Any, what: str) -> str:
    if isinstance(v, bytes):
        v = v.decode("ascii", "replace")
    if not isinstance(v, str):
        raise Malformed(f"{what} {_short(v)} must be a str")
    return v


def _empty(dtype: dt.dtype, numel: int) -> np.ndarray:
    return np.empty(numel, np.uint8 if dtype is dt.bool else dtype.numpy).view(dtype.numpy)


# ------------------------------------------------------------------------------------- unpickling


def _unpickle(
    data: BinaryIO, size: int | None, persistent_load: Callable, weights_only: bool, options: dict[str, Any]
) -> Any:
    """One pickle from ``data``: the restricted interpreter, or ``pickle_module.Unpickler`` with torch's names mapped."""
    if weights_only:
        from kiln.serialization import _user_globals

        parameter = _parameter_class()
        return Unpickler(
            data,
            allowed=allowed_globals(_user_globals()),
            persistent_load=persistent_load,
            build=build_hook(parameter),
            parameter=parameter,
            encoding=options.get("encoding", "utf-8"),
            size=size,
        ).load()
    pickle_module = options["pickle_module"]

    class _KilnUnpickler(pickle_module.Unpickler):  # type: ignore[name-defined,misc]
        def find_class(self, module: str, name: str) -> Any:
            found = full_find_class(module, name)
            return super().find_class(module, name) if found is None else found

        def persistent_load(self, pid: Any) -> Any:
            return persistent_load(pid)

    return _KilnUnpickler(data, **options["load_args"]).load()


# ------------------------------------------------------------------------------------- zip archives


class _Archive:
    """A ``torch.save`` zip archive: its records (stored members under one top-level folder)."""

    def __init__(self, fh: BinaryIO, size: int) -> None:
        self.fh = fh
        self.begin = fh.tell()  # the archive's bytes: [begin, end) of fh
        self.end = self.begin + size
        try:
            zf = zipfile.ZipFile(fh)
            infos = zf.infolist()
        except (
            zipfile.BadZipFile,
            zipfile.LargeZipFile,
            NotImplementedError,
            EOFError,
            OSError,
            ValueError,
            struct.error,
        ) as e:
            raise Malformed(f"not a readable zip archive ({_short(str(e))})") from None
        if not infos:
            raise Malformed("the zip archive is empty")
        first = infos[0].filename
        if "/" not in first:
            raise Malformed(f"zip member {_short(first)} is not in the archive's top-level folder")
        self.prefix = first.split("/", 1)[0]
        self.records: dict[str, zipfile.ZipInfo] = {}
        for info in infos:
            name = info.filename
            parts = name.split("/")
            if name.startswith("/") or "\\" in name or "\0" in name or ".." in parts or ":" in parts[0]:
                raise Malformed(f"zip member name {_short(name)} is not a plain relative path")
            if parts[0] != self.prefix or len(parts) < 2:
                raise Malformed(f"zip member {_short(name)} is outside the archive folder {_short(self.prefix)}")
            rel = name[len(self.prefix) + 1 :]
            if rel in self.records:
                raise Malformed(f"zip member {_short(name)} appears twice")
            self.records[rel] = info

    def span(self, rel: str) -> tuple[int, int]:
        """Where a stored record's bytes lie in the file: (start, length), every header field checked."""
        info = self.records.get(rel)
        if info is None:
            raise Malformed(f"the archive has no record {_short(rel)}")
        if info.flag_bits & 0x1:
            raise Unsupported(f"record {_short(rel)} is encrypted")
        if info.compress_type != zipfile.ZIP_STORED:
            raise Unsupported(
                f"record {_short(rel)} is compressed (method {info.compress_type}); torch.save stores records "
                "uncompressed, and kiln reads only stored records"
            )
        if info.compress_size != info.file_size:
            raise Malformed(f"record {_short(rel)} is stored but its sizes differ")
        if not self.begin <= info.header_offset <= self.end - 30:
            raise Malformed(f"record {_short(rel)} has its header outside the file")
        self.fh.seek(info.header_offset)
        head = self.fh.read(30)
        if len(head) != 30 or head[:4] != b"PK\x03\x04":
            raise Malformed(f"record {_short(rel)} has no local file header")
        n_name, n_extra = struct.unpack("<HH", head[26:30])
        local = self.fh.read(n_name)
        if local != info.orig_filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437", "replace"):
            raise Malformed(f"record {_short(rel)}: its local header names {_short(local)}")
        start = info.header_offset + 30 + n_name + n_extra
        if start + info.file_size > self.end:
            raise Malformed(f"record {_short(rel)} runs past the end of the file")
        return start, info.file_size

    def read_small(self, rel: str, limit: int = 1 << 16) -> bytes:
        start, n = self.span(rel)
        if n > limit:
            raise Malformed(f"record {_short(rel)} is {n} bytes long (at most {limit} expected)")
        self.fh.seek(start)
        data = self.fh.read(n)
        self.check_crc(rel, data)
        return data

    def check_crc(self, rel: str, data: Any) -> None:
        crc = self.records[rel].CRC
        if crc and zlib.crc32(data) != crc:  # 0: written without checksums (torch's compute_crc32=False)
            raise Malformed(f"record {_short(rel)} fails its CRC-32 check: the file is corrupted")


def load_zip(
    fh: BinaryIO, size: int, map_location: Any, place: Callable, weights_only: bool, options: dict, mmap_path: Any
) -> Any:
    """Load a ``torch.save`` zip archive from ``fh`` (seekable, ``size`` bytes long)."""
    arc = _Archive(fh, size)
    if "constants.pkl" in arc.records:
        raise Unsupported("the file is a TorchScript archive (torch.jit.save), which kiln cannot load")
    if "data.pkl" not in arc.records:
        raise Malformed(f"the archive has no {arc.prefix}/data.pkl")
    version = arc.read_small("version") if "version" in arc.records else None
    if version is None and ".data/version" in arc.records:
        version = arc.read_small(".data/version")
    if version is None:
        raise Malformed("the archive has no version record")
    try:
        v = int(version.strip())
    except ValueError:
        raise Malformed(f"the archive's version record {_short(version)} is not a number") from None
    if not 1 <= v <= _MAX_VERSION:
        raise Unsupported(f"archive format version {v} is not supported (kiln reads versions 1 to {_MAX_VERSION})")
    order = b"little"
    if "byteorder" in arc.records:
        order = arc.read_small("byteorder")
        if order not in (b"little", b"big"):
            raise Malformed(f"unknown byte order {_short(order)} (expected little or big)")
    mm = None
    if mmap_path is not None:
        mm = np.memmap(mmap_path, dtype=np.uint8, mode="c")  # private: writes never reach the file
    ld = _Loader(map_location, place, size, swap=order.decode() != sys.byteorder)

    def persistent_load(pid: Any) -> Tensor:
        dtype, key, location, numel, _ = ld.parse_pid(pid, 5)
        if key in ld.storages:
            cached = ld.storages[key]
            if cached._dtype is not dtype:
                raise Malformed(f"storage {_short(key)} is used as {cached._dtype} and as {dtype}")
            return cached
        rel = f"data/{key}"
        start, n = arc.span(rel)
        nbytes = numel * dtype.itemsize
        if n != nbytes:
            raise Malformed(f"record {_short(rel)} holds {n} bytes, but its storage needs {nbytes} ({numel} x {dtype})")
        ld.take(nbytes, f"storage {_short(key)}")
        if mm is not None:
            host = mm[start : start + nbytes].view(np.ndarray).view(dtype.numpy)
        else:
            host = _empty(dtype, numel)
            fh.seek(start)
            _fill(fh, memoryview(host.view(np.uint8)), f"record {_short(rel)}", Malformed)
            arc.check_crc(rel, host.view(np.uint8))
        ld.fix(host, dtype)
        ld.storages[key] = out = ld.placed(_make(host, (numel,), (1,), 0, dtype, CPU), location)
        return out

    start, n = arc.span("data.pkl")
    fh.seek(start)
    pkl = fh.read(n)
    if len(pkl) != n:
        raise Malformed("data.pkl is truncated")
    arc.check_crc("data.pkl", pkl)
    return _unpickle(io.BytesIO(pkl), n, persistent_load, weights_only, options)


# ------------------------------------------------------------------------------------- legacy format


def load_legacy(fh: BinaryIO, size: int, map_location: Any, place: Callable, weights_only: bool, options: dict) -> Any:
    """Load the legacy format (``_use_new_zipfile_serialization=False``) from ``fh`` (``size`` bytes long).

    Five pickles in a row: a magic number, the protocol version, system info (byte order), the object
    (storages as persistent ids), the keys of the storages in the order their bytes follow; then for
    each storage an 8-byte element count and its bytes.
    """
    end = fh.tell() + size

    def header_pickle(what: str) -> Any:
        return Unpickler(
            fh,
            allowed={},
            persistent_load=_no_pid,
            build=lambda i, s: False,
            parameter=None,
            size=end - fh.tell(),
        ).load()

    if header_pickle("magic number") != LEGACY_MAGIC:
        raise Malformed("invalid magic number (not a torch.save file)")
    if (proto := header_pickle("protocol")) != LEGACY_PROTOCOL:
        raise Malformed(f"invalid protocol version {_short(proto)}")
    info = header_pickle("system info")
    if not isinstance(info, dict) or type(info.get("little_endian", True)) is not bool:
        raise Malformed("the system info record is not a dict with a bool little_endian")
    file_order = "little" if info.get("little_endian", True) else "big"
    ld = _Loader(map_location, place, size, swap=file_order != sys.byteorder)
    roots: dict[str, np.ndarray] = {}  # storages whose bytes are still to come

    def persistent_load(pid: Any) -> Any:
        if type(pid) is tuple and len(pid) == 4 and pid[0] in ("module", b"module") and not weights_only:
            return pid[1]  # a module class whose source PyTorch saved: the class itself
        dtype, key, location, numel, (view,) = ld.parse_pid(pid, 6)
        if key not in ld.storages:
            ld.take(numel * dtype.itemsize, f"storage {_short(key)}")
            host = _empty(dtype, numel)
            roots[key] = host
            ld.storages[key] = ld.placed(_make(host, (numel,), (1,), 0, dtype, CPU), location)
        root = ld.storages[key]
        if root._dtype is not dtype:
            raise Malformed(f"storage {_short(key)} is used as {root._dtype} and as {dtype}")
        if view is None:
            return root
        if type(view) is not tuple or len(view) != 3:
            raise Malformed(f"storage view {_short(view)} must be (key, offset, size)")
        view_key = _ascii(view[0], "storage view key")
        if view_key not in ld.storages:
            ld.storages[view_key] = _view(root, view[1], (view[2],), (1,)) if view[2] else _view(root, 0, (0,), (1,))
        return ld.storages[view_key]

    result = _unpickle(fh, end - fh.tell(), persistent_load, weights_only, options)
    keys = header_pickle("storage keys")
    if not isinstance(keys, list):
        raise Malformed("the storage key list is not a list")
    order = "<" if file_order == "little" else ">"
    for key in keys:
        key = _ascii(key, "storage key")
        if key not in roots:
            raise Malformed(f"the file has bytes for storage {_short(key)}, which the object never uses")
        host = roots.pop(key)
        count = fh.read(8)
        if len(count) != 8 or struct.unpack(order + "q", count)[0] != host.shape[0]:
            raise Malformed(f"storage {_short(key)}: its element count does not match the object's")
        _fill(fh, memoryview(host.view(np.uint8)), f"storage {_short(key)}", Malformed)
        placed = ld.storages[key]
        ld.fix(host, placed._dtype)
        if placed._storage is not host:  # map_location put it elsewhere before its bytes were read, as in PyTorch
            _write_into(placed, host)
    if roots:
        raise Malformed(f"the file has no bytes for storage {_short(next(iter(roots)))}")
    return result


def _write_into(placed: Tensor, host: np.ndarray) -> None:
    if placed._device is CPU:
        placed._numpy()[...] = host
        return
    from kiln._plugins import device_type

    device_type(placed._device).write(placed._storage, placed._offset, host)


def _no_pid(pid: Any) -> Any:
    raise Malformed("a persistent id in a header record")
