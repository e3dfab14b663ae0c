"""``kiln.save`` / ``kiln.load``: safetensors for tensors, PyTorch's ``torch.save`` format for anything else.

**safetensors** (https://huggingface.co/docs/safetensors), what :func:`save` writes for a tensor or
containers of tensors: an 8-byte little-endian header length ``N``, ``N`` bytes of JSON header (padded
with spaces to a multiple of 8) mapping each tensor name to ``{"dtype", "shape", "data_offsets"}``
plus an optional ``"__metadata__"`` string->string map, then the tensors' bytes, contiguous and
little-endian, back to back. kiln stores the structure of the saved object (nested dicts with str or
int keys, lists, tuples, None, bool/int/float/str leaves, and where each tensor sits) as JSON under the
metadata key ``"kiln.structure"``. A flat dict of tensors is stored under its own keys, so any
safetensors reader (``safetensors.torch.load_file``) sees exactly those names; a file without
``"kiln.structure"`` (written by another tool) loads as a dict of its tensors in file order. Nothing in
such a file is executed. A tensor object saved several times is stored once; distinct tensors that are
views of one storage are stored separately, each as its own contiguous copy.

**PyTorch's format**, for every other object or with ``save(..., format="torch")``: the zip archive
``torch.save`` writes (``data.pkl``, a protocol-2 pickle whose tensors refer to storages by persistent
id, and one record per storage), written by :mod:`kiln._pickle_save` so that ``torch.load`` reads it.
:func:`load` reads that archive and torch's legacy pickle format (:mod:`kiln._pickle_read`) without
torch, mapping torch's names to kiln's (:mod:`kiln._pickle_load`); with ``weights_only=True`` (the
default) through a restricted unpickler that accepts only an allow-list of globals
(:mod:`kiln._weights_only`), which :func:`add_safe_globals` and :func:`safe_globals` extend, as
PyTorch's ``torch.serialization`` functions of the same names do.

Every malformed file raises ``ValueError``: safetensors header fields are type- and range-checked,
sizes are checked against the file's length before anything is allocated, and the nesting of the
structure JSON is bounded; PyTorch files get the same checks for their records, storages and pickles.
"""

from __future__ import annotations

import builtins
import io
import json
import math
import os
import pickle
import re
import reprlib
import sys
from collections.abc import Callable
from typing import Any, BinaryIO

import numpy as np

from kiln import _dtype as dt
from kiln._device import CPU, as_device
from kiln._device import device as _device
from kiln._tensor import Tensor

__all__ = ["load", "save", "add_safe_globals", "clear_safe_globals", "get_safe_globals", "safe_globals"]

STRUCTURE_KEY = "kiln.structure"
FORMAT_VERSION = 1
_MAX_HEADER = 100_000_000  # what the safetensors reference implementation accepts
_MAX_DIMS = 64  # NumPy's limit on the number of dimensions
_MAX_NBYTES = 2**62  # no array is larger; keeps NumPy's size arithmetic far from int64 overflow
# Containers (dict/list/tuple) nested inside each other. save refuses deeper objects, so that every
# file it writes loads; load refuses deeper structure JSON before recursing into it.
_MAX_NESTING = 100

_TO_ST = {
    dt.float64: "F64",
    dt.float32: "F32",
    dt.float16: "F16",
    dt.bfloat16: "BF16",
    dt.int64: "I64",
    dt.int32: "I32",
    dt.int16: "I16",
    dt.int8: "I8",
    dt.uint8: "U8",
    dt.bool: "BOOL",
}
_FROM_ST = {v: k for k, v in _TO_ST.items()}

# Error messages quote values from the file; a hostile file may hold megabytes in one of them.
_short_repr = reprlib.Repr()
_short_repr.maxstring = _short_repr.maxother = _short_repr.maxlong = 80
_short_repr.maxlist = _short_repr.maxdict = 8
_short = _short_repr.repr


# ------------------------------------------------------------------------------------------ safe globals

_SafeGlobal = Callable | tuple[Callable, str]
_safe_globals: set[Any] = set()


def _check_safe_global(g: Any) -> None:
    if isinstance(g, tuple):
        if len(g) != 2:
            raise ValueError(
                f"Expected tuple of length 2 (global, str of callable full path), but got tuple of length: {len(g)}"
            )
        if type(g[1]) is not str:
            raise TypeError(f"Expected second item in tuple to be str of callable full path, but got: {type(g[1])}")


def add_safe_globals(safe_globals: list[_SafeGlobal]) -> None:
    """Allow these globals in :func:`load` with ``weights_only=True`` (``torch.serialization.add_safe_globals``).

    Each item is a class or function, allowed under its ``module.qualname``, or a pair
    ``(obj, "module.name")`` for an object that a file names differently (an alias, or a name that
    moved). Only allow what you trust: ``weights_only=True`` calls an allowed function with whatever
    arguments the file gives it, and builds allowed classes from the file's state. The modules
    ``sys``, ``os``, ``posix`` and ``nt`` stay blocked. The list is global to the process.
    """
    items = list(safe_globals)
    for g in items:
        _check_safe_global(g)
    _safe_globals.update(items)


def get_safe_globals() -> list[_SafeGlobal]:
    """The globals :func:`add_safe_globals` allowed (``torch.serialization.get_safe_globals``)."""
    return list(_safe_globals)


def clear_safe_globals() -> None:
    """Forget every global :func:`add_safe_globals` allowed (``torch.serialization.clear_safe_globals``)."""
    _safe_globals.clear()


class safe_globals:  # noqa: N801 - torch.serialization.safe_globals is a lowercase class too
    """A context manager allowing ``safe_globals`` in :func:`load` inside its block (``torch.serialization.safe_globals``).

    >>> import collections, kiln
    >>> with kiln.serialization.safe_globals([collections.namedtuple]):
    ...     collections.namedtuple in kiln.serialization.get_safe_globals()
    True

    The globals are added on entry and removed on exit, even those that were allowed before the block.
    """

    def __init__(self, safe_globals: list[_SafeGlobal]) -> None:
        self.safe_globals = list(safe_globals)

    def __enter__(self) -> None:
        add_safe_globals(self.safe_globals)

    def __exit__(self, *exc: Any) -> None:
        _safe_globals.difference_update(self.safe_globals)


def _user_globals() -> dict[str, Any]:
    """``{"module.name": object}`` for the globals :func:`add_safe_globals` allowed."""
    out = {}
    for g in list(_safe_globals):
        if isinstance(g, tuple):
            out[g[1]] = g[0]
        else:
            out[f"{getattr(g, '__module__', None)}.{getattr(g, '__qualname__', None)}"] = g
    return out


# ------------------------------------------------------------------------------------------ saving


class _Encoder:
    """Turns a saved object into a JSON structure plus the list of (name, tensor) it references."""

    def __init__(self) -> None:
        self.tensors: list[tuple[str, Tensor]] = []
        self._names: set[str] = set()
        self._by_id: dict[int, str] = {}
        self._active: set[int] = set()

    def _name(self, wanted: str) -> str:
        name, n = wanted, 1
        while name in self._names or name == "__metadata__":
            n += 1
            name = f"{wanted}#{n}"
        self._names.add(name)
        return name

    def encode(self, obj: Any, path: str, depth: int = 0) -> Any:
        if isinstance(obj, Tensor):
            name = self._by_id.get(id(obj))
            if name is None:
                name = self._name(path or "tensor")
                self._by_id[id(obj)] = name
                self.tensors.append((name, obj))
            node = {"tensor": name, "device": str(obj.device)}
            if obj.requires_grad:
                node["requires_grad"] = True
            return node
        if obj is None:
            return {"none": None}
        if isinstance(obj, builtins.bool):
            return {"bool": obj}
        if isinstance(obj, builtins.int):
            return {"int": builtins.int(obj)}
        if isinstance(obj, builtins.float):
            return {"float": repr(builtins.float(obj))}  # repr round-trips exactly, nan/inf included
        if isinstance(obj, str):
            return {"str": builtins.str(obj)}
        if isinstance(obj, (dict, list, tuple)):
            if id(obj) in self._active:
                raise ValueError("kiln.save: the object contains a reference cycle")
            if depth >= _MAX_NESTING:
                raise ValueError(
                    f"kiln.save: the object nests dicts/lists/tuples more than {_MAX_NESTING} levels deep "
                    "(kiln.load's limit)"
                )
            self._active.add(id(obj))
            try:
                if isinstance(obj, dict):
                    items = []
                    for k, v in obj.items():
                        if isinstance(k, str):
                            key = k
                        elif isinstance(k, builtins.int) and not isinstance(k, builtins.bool):
                            key = {"int": builtins.int(k)}  # optimizer state is keyed by parameter index
                        else:
                            raise TypeError(f"kiln.save: dict keys must be str or int, got {type(k).__name__} ({k!r})")
                        items.append([key, self.encode(v, f"{path}.{k}" if path else str(k), depth + 1)])
                    return {"dict": items}
                kind = "list" if isinstance(obj, list) else "tuple"
                return {kind: [self.encode(v, f"{path}.{i}" if path else str(i), depth + 1) for i, v in enumerate(obj)]}
            finally:
                self._active.discard(id(obj))
        raise TypeError(
            f"kiln.save can't serialize an object of type {type(obj).__name__}: only tensors, dicts with str or int keys, "
            "lists, tuples, None, bool, int, float and str are supported"
        )


def _le_bytes(t: Tensor) -> np.ndarray:
    """The tensor's elements as a contiguous little-endian array (a copy where needed)."""
    a = np.asarray(t.detach().cpu().numpy(), order="C")
    if a.dtype.itemsize > 1:  # bytes swapped only on big-endian hosts; bfloat16 goes through uintN
        a = a.view(f"u{a.dtype.itemsize}").astype(f"<u{a.dtype.itemsize}", copy=False)
    return a


def _header(entries: list[tuple[str, Tensor]], metadata: dict[str, str]) -> tuple[bytes, list[tuple[str, Tensor]]]:
    # Bigger items first keeps every tensor aligned to its item size (the header ends 8-aligned).
    order = sorted(entries, key=lambda e: -e[1].dtype.itemsize)
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for name, t in order:
        if t.dtype not in _TO_ST:
            raise TypeError(f"kiln.save: dtype {t.dtype} has no safetensors equivalent")
        nbytes = math.prod(t.shape) * t.dtype.itemsize
        header[name] = {"dtype": _TO_ST[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return raw, order


def _write(fh: BinaryIO, header: bytes, order: list[tuple[str, Tensor]]) -> None:
    fh.write(len(header).to_bytes(8, "little"))
    fh.write(header)
    for _, t in order:
        if t.numel():
            fh.write(memoryview(_le_bytes(t)).cast("B"))


_FORMATS = (None, "safetensors", "torch")


def save(
    obj: Any,
    f: str | os.PathLike | BinaryIO,
    pickle_module: Any = pickle,
    pickle_protocol: int = 2,
    _use_new_zipfile_serialization: bool = True,
    _disable_byteorder_record: bool = False,
    *,
    format: str | None = None,
) -> None:
    """Save ``obj`` to ``f``: tensors and containers of them as safetensors, anything else as ``torch.save`` does.

    ``format=None`` (the default) writes a tensor, a state dict, or nested dicts (str or int keys),
    lists and tuples of tensors, None, bool, int, float and str in the safetensors format, which
    :func:`load` reads without running any code and ``safetensors.torch.load_file`` reads too (a flat
    dict of tensors, under its own keys). Any other object (a whole ``kiln.nn.Module``, NumPy arrays,
    your own classes, sets, tuple keys, a reference cycle) is written in PyTorch's ``torch.save`` zip
    archive, which ``torch.load`` reads back with torch tensors. ``format="torch"`` writes that archive
    for any object (so that ``torch.load`` can read a kiln state dict); ``format="safetensors"``
    refuses, with a ``TypeError``, what safetensors cannot hold.

    In the torch archive, tensors are pickled as PyTorch pickles them (storages by reference, saved once,
    with their device as the location), kiln's dtypes, ``Size``, devices and ``Parameter`` under torch's
    names, and everything else with Python's pickle (whose errors come before the file is touched).

    ``f`` is a path or a writable binary file object (written from its current position). A path is
    written atomically (a fsynced temp file ``.<name>.<pid>.<random>.tmp`` renamed over the target, then
    the directory fsynced): a crash, kill or power loss leaves the old file or the new one. On an error the
    temp file is removed and the target left untouched; temp files of killed writers (PID gone) are
    removed by the next save to the same target, best effort. Saving over a file keeps its permission
    bits, as ``open(path, "wb")`` would (a new file's mode is ``0o666 & ~umask``); a symlink is followed
    and stays a link (the file it points to is replaced).

    In the safetensors format containers may nest up to 100 levels; ``requires_grad`` and the device
    are recorded and restored by :func:`load`.

    ``pickle_module`` (Python's ``pickle`` only: another is refused, not ignored), ``pickle_protocol``
    (2 up to ``pickle.HIGHEST_PROTOCOL``) and the zip switches are PyTorch's (the legacy format is refused).
    """
    if format not in _FORMATS:
        raise ValueError(f"kiln.save: format must be None, 'safetensors' or 'torch', got {format!r}")
    from kiln._pickle_save import check_pickle_args

    check_pickle_args(pickle_module, pickle_protocol, _use_new_zipfile_serialization, _disable_byteorder_record)
    write = None
    if format != "torch":
        enc = _Encoder()
        try:
            structure = enc.encode(obj, "")  # raises for unsupported objects before any file is touched
        except (TypeError, ValueError):
            if format == "safetensors":
                raise
        else:
            meta = {STRUCTURE_KEY: json.dumps({"version": FORMAT_VERSION, "root": structure}, ensure_ascii=False)}
            header, order = _header(enc.tensors, meta)

            def write(fh: BinaryIO, name: str) -> None:
                _write(fh, header, order)

    if write is None:
        from kiln import _pickle_save

        pkl, storages = _pickle_save.pickle_object(obj, pickle_protocol)  # pickling errors come before the file

        def write(fh: BinaryIO, name: str) -> None:
            _pickle_save.write_archive(fh, name, pkl, storages)

    if hasattr(f, "write"):
        write(f, "archive")
        return
    from kiln._atomic_write import atomic_write

    def write_named(fh: BinaryIO, path: str) -> None:
        stem = os.path.splitext(os.path.basename(path))[0]
        write(fh, stem if re.fullmatch(r"[A-Za-z0-9_.-]{1,100}", stem) else "archive")

    atomic_write(f, write_named)


# ------------------------------------------------------------------------------------------ loading


def _corrupt(msg: str) -> ValueError:
    return ValueError(f"kiln.load: invalid safetensors file: {msg}")


def _read_exact(fh: BinaryIO, n: int, what: str, corrupt: Callable[[str], Exception] = _corrupt) -> bytes:
    # Reads in chunks, so a length field that lies about the file costs no more memory than the file.
    chunks, left = [], n
    while left:
        b = fh.read(min(left, 1 << 24))
        if not b:
            raise corrupt(f"file is truncated ({what}: expected {n} bytes, got {n - left})")
        chunks.append(b)
        left -= len(b)
    return b"".join(chunks)


def _pytorch_kind(head: bytes) -> str | None:
    """What PyTorch format the first 8 bytes of a file look like, if any."""
    if head.startswith(b"PK\x03\x04"):  # torch.save's default since 1.6: a zip archive
        return "zip"
    if head[:1] == b"\x80" and 2 <= head[1] <= 5:  # PROTO opcode: _use_new_zipfile_serialization=False
        return "legacy"
    if head == b"L1195470":  # the same with pickle_protocol=0 or 1: the magic number as a text LONG
        return "legacy"
    return None


def _load_torch(
    fh: BinaryIO,
    consumed: bytes,
    start: int | None,
    size: int | None,
    kind: str,
    map_location: _Location,
    weights_only: bool,
    options: dict,
    mmap_path: Any,
) -> Any:
    """A ``torch.save`` file, from its start (``consumed``: the bytes already read from a stream)."""
    from kiln import _pickle_read

    if start is not None:
        fh.seek(start)
    else:  # a stream: hold it in memory (the zip directory is at its end; sizes are checked against it)
        data = consumed + fh.read()
        fh, size = io.BytesIO(data), len(data)
    if kind == "zip":
        return _pickle_read.load_zip(fh, size, map_location, _place, weights_only, options, mmap_path)
    if mmap_path is not None:
        raise RuntimeError(
            f"mmap can only be used with files saved with `torch.save({mmap_path}, "
            "_use_new_zipfile_serialization=True), please torch.save your checkpoint with this option in order "
            "to use mmap."
        )
    return _pickle_read.load_legacy(fh, size, map_location, _place, weights_only, options)


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads keeps the last of duplicate keys silently; which one a reader sees would be a guess.
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _DuplicateKey(f"duplicate key {_short(k)}")
            seen.add(k)
    return out


def _json(text: str, what: str, kind: str = "JSON") -> Any:
    """``json.loads`` whose every failure is a ValueError (nesting bombs and duplicate keys included)."""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as e:
        raise _corrupt(f"{what} has a {e}") from None
    except RecursionError:  # the C decoder recurses per [ or {; it stops cleanly at the recursion limit
        raise _corrupt(f"{what} nests too deeply to parse") from None
    except ValueError as e:  # JSONDecodeError, and integers past sys.get_int_max_str_digits()
        raise _corrupt(f"{what} is not valid {kind} ({_short(str(e))})") from None


def _nbytes(name: str, d: dt.dtype, shape: Any) -> int:
    if (
        not isinstance(shape, list)
        or len(shape) > _MAX_DIMS
        or not builtins.all(type(s) is builtins.int and s >= 0 for s in shape)
    ):
        raise _corrupt(f"tensor {_short(name)} has invalid shape {_short(shape)}")
    size = d.itemsize
    for s in shape:  # zero-size dims included: NumPy must never see a size it can't represent
        size *= max(s, 1)
        if size > _MAX_NBYTES:
            raise _corrupt(f"tensor {_short(name)} has a shape too large for any array: {_short(shape)}")
    return d.itemsize * math.prod(shape)


def _parse_header(raw: bytes | bytearray) -> tuple[dict[str, str], dict[str, dict]]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _corrupt(f"header is not valid UTF-8 JSON ({e})") from None
    header = _json(text, "header", "UTF-8 JSON")
    if not isinstance(header, dict):
        raise _corrupt("header is not a JSON object")
    metadata = header.pop("__metadata__", None)
    if metadata is None:  # optional; safetensors also reads an explicit null as absent
        metadata = {}
    elif not isinstance(metadata, dict) or not builtins.all(isinstance(v, str) for v in metadata.values()):
        raise _corrupt("__metadata__ must map strings to strings")
    for name, info in header.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise _corrupt(f"entry {_short(name)} must have exactly the keys dtype, shape and data_offsets")
        dtype, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(dtype, str) or dtype not in _FROM_ST:
            raise _corrupt(
                f"tensor {_short(name)} has unsupported dtype {_short(dtype)} (kiln reads {', '.join(_FROM_ST)})"
            )
        nbytes = _nbytes(name, _FROM_ST[dtype], shape)
        if (
            not isinstance(offs, list)
            or len(offs) != 2
            or not builtins.all(type(o) is builtins.int and o >= 0 for o in offs)
            or offs[1] < offs[0]
        ):
            raise _corrupt(f"tensor {_short(name)} has invalid data_offsets {_short(offs)}")
        if offs[1] - offs[0] != nbytes:
            raise _corrupt(
                f"tensor {_short(name)}: data_offsets {_short(offs)} span {offs[1] - offs[0]} bytes but dtype "
                f"{dtype} and shape {_short(shape)} need {nbytes}"
            )
    return metadata, header


def _check_layout(entries: dict[str, dict], data_len: int) -> list[str]:
    """Names in data order, after checking the spans tile the data buffer exactly (as safetensors does)."""
    names = sorted(entries, key=lambda n: tuple(entries[n]["data_offsets"]))
    end = 0
    for n in names:
        b, e = entries[n]["data_offsets"]
        if b < end:
            raise _corrupt(f"tensor {_short(n)} data_offsets {[b, e]} overlap the previous tensor (ends at {end})")
        if b > end:
            raise _corrupt(f"gap in the data buffer before tensor {_short(n)} (bytes {end}..{b} belong to no tensor)")
        end = e
    if end > data_len:
        raise _corrupt(f"file is truncated: tensor data needs {end} bytes after the header, the file has {data_len}")
    if end < data_len:
        raise _corrupt(f"{data_len - end} trailing bytes after the last tensor")
    return names


def _fill(fh: BinaryIO, out: memoryview, what: str, corrupt: Callable[[str], Exception] = _corrupt) -> None:
    """Read exactly ``len(out)`` bytes from ``fh`` into ``out`` (no intermediate copy where ``readinto`` exists)."""
    readinto = getattr(fh, "readinto", None)
    got = 0
    while got < len(out):
        if readinto is not None:
            k = readinto(out[got:]) or 0
        else:
            chunk = fh.read(min(len(out) - got, 1 << 24))
            k = len(chunk)
            out[got : got + k] = chunk
        if not k:  # the file shrank after its size was checked
            raise corrupt(f"file is truncated ({what}: expected {len(out)} bytes, got {got})")
        got += k


def _read_tensor(fh: BinaryIO, name: str, info: dict) -> Tensor:
    """The next tensor in the data buffer, read straight into a fresh array that the tensor owns."""
    from kiln._ops.creation import from_numpy

    d = _FROM_ST[info["dtype"]]
    b, e = info["data_offsets"]
    isz = d.itemsize
    count = (e - b) // isz
    if d is dt.bool or isz == 1:
        a = np.empty(count, np.uint8 if d is dt.bool else d.numpy)
    else:
        a = np.empty(count, f"<u{isz}")  # bfloat16 and the rest go through their raw bits
    _fill(fh, memoryview(a).cast("B"), f"tensor {_short(name)}")
    if d is dt.bool:
        a = np.not_equal(a, 0, out=a.view(np.bool_))  # any nonzero byte is True, in place
    elif isz > 1:
        if sys.byteorder == "big":
            a.byteswap(inplace=True)
        a = a.view(d.numpy)
    return from_numpy(a.reshape(info["shape"]))


def _map_tensor(mm: np.ndarray, base: int, info: dict) -> Tensor:
    """A tensor over its bytes in a private memory map of the file (bools and byte order fixed in place)."""
    from kiln._ops.creation import from_numpy

    d = _FROM_ST[info["dtype"]]
    b, e = info["data_offsets"]
    a = mm[base + b : base + e].view(np.ndarray)
    if d is dt.bool:
        a = np.not_equal(a, 0, out=a.view(np.bool_))
    elif d.itemsize > 1:
        if sys.byteorder == "big":
            a.view(f"u{d.itemsize}").byteswap(inplace=True)
        a = a.view(d.numpy)
    return from_numpy(a.reshape(info["shape"]))


_Location = str | _device | dict | Callable | None


def _place(t: Tensor, saved: str, map_location: _Location) -> Tensor:
    if map_location is None:
        target = saved
    elif isinstance(map_location, (str, _device)):
        target = map_location
    elif isinstance(map_location, dict):
        target = map_location.get(saved, saved)
    elif callable(map_location):
        out = map_location(t, saved)
        if out is None:  # torch's convention: None means "the default placement"
            target = saved
        elif isinstance(out, Tensor):
            return out
        else:
            raise TypeError(f"kiln.load: map_location callable must return a Tensor or None, got {type(out).__name__}")
    else:
        raise TypeError(
            "kiln.load: map_location must be None, a str, a kiln.device, a dict or a callable, "
            f"got {type(map_location).__name__}"
        )
    dev = as_device(target)
    return t if dev == CPU else t.to(dev)


_TENSOR_NODE_KEYS = {"tensor", "device", "requires_grad"}


def _decode_tensor(node: dict, tensors: dict[str, Tensor], placed: dict[str, Tensor], map_location: _Location) -> Any:
    name, saved, grad = node["tensor"], node.get("device", "cpu"), node.get("requires_grad", False)
    if not set(node) <= _TENSOR_NODE_KEYS or not isinstance(saved, str) or not isinstance(grad, builtins.bool):
        raise _corrupt(f"bad kiln.structure tensor node {_short(node)}")
    if not isinstance(name, str) or name not in tensors:
        raise _corrupt(f"kiln.structure refers to a missing tensor {_short(name)}")
    try:  # a device string that can't be parsed is a broken file; a device not installed here is not
        _device(saved)
    except (RuntimeError, TypeError, ValueError):
        raise _corrupt(f"kiln.structure gives tensor {_short(name)} an invalid device {_short(saved)}") from None
    if name not in placed:
        t = tensors[name]
        if grad and not t.dtype.is_floating_point:
            raise _corrupt(f"kiln.structure asks for requires_grad on tensor {_short(name)} of dtype {t.dtype}")
        t = _place(t, saved, map_location)
        if grad:
            t.requires_grad_(True)
        placed[name] = t
    return placed[name]


def _decode(
    node: Any, tensors: dict[str, Tensor], placed: dict[str, Tensor], map_location: _Location, depth: int = 0
) -> Any:
    if not isinstance(node, dict) or len(node) < 1:
        raise _corrupt(f"bad kiln.structure node {_short(node)}")
    if "tensor" in node:
        return _decode_tensor(node, tensors, placed, map_location)
    if len(node) != 1:
        raise _corrupt(f"bad kiln.structure node {_short(node)}")
    ((kind, value),) = node.items()
    if kind in ("list", "tuple", "dict") and depth >= _MAX_NESTING:
        raise _corrupt(f"kiln.structure nests containers more than {_MAX_NESTING} levels deep")
    if kind == "none" and value is None:
        return None
    if kind == "bool" and isinstance(value, builtins.bool):
        return value
    if kind == "int" and type(value) is builtins.int:
        return value
    if kind == "float" and isinstance(value, str):
        try:
            return builtins.float(value)
        except ValueError:
            pass
    elif kind == "str" and isinstance(value, str):
        return value
    elif kind in ("list", "tuple") and isinstance(value, list):
        items = []
        for v in value:  # a loop, not a comprehension: one stack frame per level of nesting
            items.append(_decode(v, tensors, placed, map_location, depth + 1))
        return items if kind == "list" else tuple(items)
    elif kind == "dict" and isinstance(value, list):
        out = {}
        for pair in value:
            if not (isinstance(pair, list) and len(pair) == 2):
                raise _corrupt(f"bad kiln.structure dict item {_short(pair)}")
            key = pair[0]
            if isinstance(key, dict) and set(key) == {"int"} and type(key["int"]) is builtins.int:
                key = key["int"]
            elif not isinstance(key, str):
                raise _corrupt(f"bad kiln.structure dict key {_short(key)}")
            out[key] = _decode(pair[1], tensors, placed, map_location, depth + 1)
        return out
    raise _corrupt(f"bad kiln.structure node {_short(node)}")


def load(
    f: str | os.PathLike | BinaryIO,
    map_location: _Location = None,
    pickle_module: Any = None,
    *,
    weights_only: bool | None = None,
    mmap: bool | None = None,
    **pickle_load_args: Any,
) -> Any:
    """Load what :func:`save` or ``torch.save`` wrote, or any safetensors file (then a dict of its tensors).

    The format is recognised from the file's first bytes: safetensors, PyTorch's zip archive (the
    ``torch.save`` default since 1.6) or its legacy pickle format (``_use_new_zipfile_serialization=False``);
    torch need not be installed. Tensors come back as kiln tensors with their dtypes, shapes, strides and
    storage offsets; tensors that shared a storage in a PyTorch file share one after loading.

    ``weights_only`` (None means True, unless a ``pickle_module`` is given, as in ``torch.load``)
    follows PyTorch's security model for PyTorch files: only an allow-list is unpickled (tensors,
    storages and parameters, dicts, ``OrderedDict``, lists, tuples, sets, ``Counter``, None, bools,
    ints, floats, complex, str, bytes, dtypes, ``Size``, devices), plus what
    :func:`kiln.serialization.add_safe_globals` or :class:`kiln.serialization.safe_globals` add
    (NumPy arrays, for one, need ``numpy._core.multiarray._reconstruct``, ``numpy.ndarray``,
    ``numpy.dtype`` and the array's dtype class, as in PyTorch). Any other global
    raises ``pickle.UnpicklingError`` naming it and saying how to allow it; nothing from the file runs.
    ``weights_only=False`` unpickles anything with ``pickle_module.Unpickler`` (Python's pickle by
    default), torch's names mapped to kiln's: only for files you trust, since that runs code from the
    file. Safetensors files never contain code, so ``weights_only`` changes nothing for them.

    Every malformed file raises a ``ValueError`` that says what is wrong (for PyTorch files also a
    ``pickle.UnpicklingError``): safetensors headers are validated field by field, and a PyTorch file's
    sizes (records, storages, tensor extents, lengths in the pickle) are checked against the file
    before anything is allocated. A PyTorch file with something kiln lacks (complex or float8 dtypes,
    sparse or quantized tensors, TorchScript archives, compressed records) raises a ``ValueError``
    saying so.

    ``map_location`` places tensors as in ``torch.load``: None (the device each tensor was saved
    from; ``"cpu"`` for files from other tools), a device string or :class:`kiln.device` (every tensor
    there), a dict mapping saved device strings to targets (others stay), or a callable
    ``fn(tensor, location)`` returning the tensor to use or None for the default placement; it is
    given each safetensors tensor, or each storage of a PyTorch file as a one-dimensional CPU tensor
    (then it must return a tensor of that dtype and shape). Loaded tensors own their memory, read from
    the file straight into place. ``mmap=True`` (a path only; not the legacy format) maps the file
    instead, privately: tensor bytes are read when first touched and writes never reach the file.

    A file object is read from its current position to its end. ``pickle_load_args`` go to
    ``pickle_module.Unpickler`` (``encoding``, for Python 2 strings, defaults to ``"utf-8"`` and is the
    only one ``weights_only=True`` accepts).
    """
    if weights_only is None:
        weights_only = pickle_module is None
    if not isinstance(weights_only, builtins.bool):
        raise TypeError(f"kiln.load: weights_only must be a bool, got {type(weights_only).__name__}")
    if weights_only and pickle_module is not None:
        raise RuntimeError("Can not safely load weights when explicit pickle_module is specified")
    if mmap is None:
        mmap = False
    if not isinstance(mmap, builtins.bool):
        raise TypeError(f"kiln.load: mmap must be a bool, got {type(mmap).__name__}")
    if weights_only and set(pickle_load_args) - {"encoding"}:
        raise TypeError(
            f"kiln.load: {', '.join(sorted(set(pickle_load_args) - {'encoding'}))} only works with weights_only=False"
        )
    options = {
        "pickle_module": pickle_module if pickle_module is not None else pickle,
        "load_args": {"encoding": "utf-8", **pickle_load_args},
        "encoding": pickle_load_args.get("encoding", "utf-8"),
    }
    if hasattr(f, "read"):
        if mmap:
            raise ValueError("f must be a file path in order to use the mmap argument")
        return _load_from(f, map_location, None, weights_only, options, None)
    path = os.fspath(f)
    with open(path, "rb") as fh:
        return _load_from(fh, map_location, os.fsdecode(path), weights_only, options, path if mmap else None)


def _remaining(fh: BinaryIO) -> int | None:
    """Bytes from the current position to the end, or None for a stream that can't tell (a pipe)."""
    try:
        if hasattr(fh, "seekable") and not fh.seekable():
            return None
        pos = fh.tell()
        end = fh.seek(0, os.SEEK_END)
        fh.seek(pos)
    except (AttributeError, OSError, ValueError):
        return None
    if not isinstance(pos, builtins.int) or not isinstance(end, builtins.int):
        return None
    return end - pos


def _load_from(
    fh: BinaryIO, map_location: _Location, name: str | None, weights_only: bool, options: dict, mmap_path: Any
) -> Any:
    size = _remaining(fh)
    start = None if size is None else fh.tell()
    head = fh.read(8)
    if len(head) < 8:
        raise _corrupt(f"file is truncated (header length: expected 8 bytes, got {len(head)})")
    n = int.from_bytes(head, "little")
    torch_kind = _pytorch_kind(head)
    too_long = n > _MAX_HEADER or (size is not None and n > size - 8)
    if torch_kind is not None and too_long:
        return _load_torch(fh, head, start, size, torch_kind, map_location, weights_only, options, mmap_path)
    if too_long and start is not None and size >= 512:
        fh.seek(start + 257)
        if fh.read(5) == b"ustar":  # a tar archive: torch.save's format before PyTorch 0.4
            from kiln._weights_only import Unsupported

            raise Unsupported(
                f"{name or 'the file'} is in torch.save's tar format (PyTorch < 0.4), which kiln cannot read"
            )
        fh.seek(start + 8)
    if n > _MAX_HEADER:
        raise _corrupt(f"header length {n} is larger than the {_MAX_HEADER}-byte limit")
    if size is not None and n > size - 8:
        raise _corrupt(f"file is truncated (header length {n}, but the file has {size - 8} bytes after it)")
    if size is None:  # a stream may end early: let its bytes, not the length field, size the buffer
        raw = _read_exact(fh, n, "header")
    else:
        raw = bytearray(n)  # n is no more than the file holds
        _fill(fh, memoryview(raw), "header")
    if torch_kind is not None and not raw.startswith(b"{"):  # a safetensors header is a JSON object
        return _load_torch(fh, head + raw, start, size, torch_kind, map_location, weights_only, options, mmap_path)
    metadata, entries = _parse_header(raw)
    del raw
    if size is None:  # a stream of unknown length: hold the rest in memory to learn how much there is
        data = fh.read()
        data_len, fh = len(data), io.BytesIO(data)
    else:
        data_len = size - 8 - n
    names = _check_layout(entries, data_len)  # every size is checked against the file before allocating
    if mmap_path is not None:
        mm = np.memmap(mmap_path, dtype=np.uint8, mode="c")  # private: writes never reach the file
        base = start + 8 + n
        tensors = {name: _map_tensor(mm, base, entries[name]) for name in names}
    else:
        tensors = {name: _read_tensor(fh, name, entries[name]) for name in names}
    spec = metadata.get(STRUCTURE_KEY)
    if spec is None:
        placed: dict[str, Tensor] = {}
        return {name: _decode({"tensor": name}, tensors, placed, map_location) for name in names}
    structure = _json(spec, f"{STRUCTURE_KEY} metadata")
    if not isinstance(structure, dict) or "root" not in structure:
        raise _corrupt(f"{STRUCTURE_KEY} metadata has no root")
    version = structure.get("version")
    if type(version) is not builtins.int or version != FORMAT_VERSION:
        raise ValueError(
            f"kiln.load: the file's {STRUCTURE_KEY} format version {_short(version)} is not supported "
            f"(this kiln reads version {FORMAT_VERSION})"
        )
    return _decode(structure["root"], tensors, {}, map_location)
