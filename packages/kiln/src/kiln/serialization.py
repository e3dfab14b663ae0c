"""``kiln.save`` / ``kiln.load``: tensors and containers of tensors in the safetensors format.

File layout (https://huggingface.co/docs/safetensors): an 8-byte little-endian header length ``N``,
``N`` bytes of JSON header (padded with spaces to a multiple of 8) mapping each tensor name to
``{"dtype", "shape", "data_offsets"}`` plus an optional ``"__metadata__"`` string->string map, then
the tensors' bytes, contiguous and little-endian, back to back.

kiln stores the structure of the saved object (nested dicts with str or int keys, lists, tuples, None,
bool/int/float/str leaves, and where each tensor sits) as JSON under the metadata key
``"kiln.structure"``. A flat dict of tensors is stored under its own keys, so any safetensors reader
(``safetensors.torch.load_file``) sees exactly those names; a file without ``"kiln.structure"``
(written by another tool) loads as a dict of its tensors in file order.

Nothing in a file is ever executed (there is no pickle), so ``weights_only`` has nothing to turn off.
A tensor object that appears several times in the saved object is stored once and comes back as one
tensor; distinct tensors that are views of one storage are stored separately, each as its own
contiguous copy, and come back as independent tensors (storage sharing between them is not kept).
Loaded tensors are fresh, writable copies that own their memory (nothing maps the file).
"""

from __future__ import annotations

import builtins
import contextlib
import json
import math
import os
import tempfile
from collections.abc import Callable
from typing import Any, BinaryIO

import numpy as np

from kiln import _dtype as dt
from kiln._device import CPU, as_device
from kiln._device import device as _device
from kiln._tensor import Tensor

__all__ = ["load", "save"]

STRUCTURE_KEY = "kiln.structure"
FORMAT_VERSION = 1
_MAX_HEADER = 100_000_000  # what the safetensors reference implementation accepts

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

    def encode(self, obj: Any, path: str) -> Any:
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
                        items.append([key, self.encode(v, f"{path}.{k}" if path else str(k))])
                    return {"dict": items}
                kind = "list" if isinstance(obj, list) else "tuple"
                return {kind: [self.encode(v, f"{path}.{i}" if path else str(i)) for i, v in enumerate(obj)]}
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


def save(obj: Any, f: str | os.PathLike | BinaryIO) -> None:
    """Save a tensor, a state dict, or nested dicts/lists/tuples of tensors to ``f`` (safetensors format).

    ``f`` is a path (written atomically: a temp file in the same directory, flushed, fsynced and renamed
    over the destination; on any error the temp file is removed and the destination left untouched) or
    a writable binary file object (written directly, from its current position). Leaves besides tensors
    may be None, bool, int, float or str; dict keys must be str. Tensors on any device are saved from a
    contiguous CPU copy of their values; ``requires_grad`` and the device are recorded and restored by
    :func:`load`. A flat dict of tensors is readable by ``safetensors.torch.load_file`` under its own keys.
    """
    enc = _Encoder()
    structure = enc.encode(obj, "")  # raises for unsupported objects before any file is touched
    meta = {STRUCTURE_KEY: json.dumps({"version": FORMAT_VERSION, "root": structure}, ensure_ascii=False)}
    header, order = _header(enc.tensors, meta)
    if hasattr(f, "write"):
        _write(f, header, order)
        return
    path = os.fspath(f)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            _write(fh, header, order)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    try:  # make the rename itself durable; not every platform can open a directory
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


# ----------------------------------------------------------------------------------------- loading


def _corrupt(msg: str) -> ValueError:
    return ValueError(f"kiln.load: invalid safetensors file: {msg}")


def _read_exact(fh: BinaryIO, n: int, what: str) -> bytes:
    chunks, left = [], n
    while left:
        b = fh.read(left)
        if not b:
            raise _corrupt(f"file is truncated ({what}: expected {n} bytes, got {n - left})")
        chunks.append(b)
        left -= len(b)
    return b"".join(chunks)


def _parse_header(raw: bytes) -> tuple[dict[str, str], dict[str, dict]]:
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _corrupt(f"header is not valid UTF-8 JSON ({e})") from None
    if not isinstance(header, dict):
        raise _corrupt("header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not builtins.all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise _corrupt("__metadata__ must map strings to strings")
    for name, info in header.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise _corrupt(f"entry {name!r} must have exactly the keys dtype, shape and data_offsets")
        if info["dtype"] not in _FROM_ST:
            raise _corrupt(
                f"tensor {name!r} has unsupported dtype {info['dtype']!r} (kiln reads {', '.join(_FROM_ST)})"
            )
        shape, offs = info["shape"], info["data_offsets"]
        if not isinstance(shape, list) or not builtins.all(type(s) is builtins.int and s >= 0 for s in shape):
            raise _corrupt(f"tensor {name!r} has invalid shape {shape!r}")
        if (
            not isinstance(offs, list)
            or len(offs) != 2
            or not builtins.all(type(o) is builtins.int and o >= 0 for o in offs)
            or offs[1] < offs[0]
        ):
            raise _corrupt(f"tensor {name!r} has invalid data_offsets {offs!r}")
        nbytes = math.prod(shape) * _FROM_ST[info["dtype"]].itemsize
        if offs[1] - offs[0] != nbytes:
            raise _corrupt(
                f"tensor {name!r}: data_offsets {offs} span {offs[1] - offs[0]} bytes but dtype {info['dtype']} "
                f"and shape {shape} need {nbytes}"
            )
    return metadata, header


def _check_layout(entries: dict[str, dict], data_len: int) -> list[str]:
    """Names in data order, after checking the spans tile the data buffer exactly (as safetensors does)."""
    names = sorted(entries, key=lambda n: tuple(entries[n]["data_offsets"]))
    end = 0
    for n in names:
        b, e = entries[n]["data_offsets"]
        if b < end:
            raise _corrupt(f"tensor {n!r} data_offsets {[b, e]} overlap the previous tensor (ends at {end})")
        if b > end:
            raise _corrupt(f"gap in the data buffer before tensor {n!r} (bytes {end}..{b} belong to no tensor)")
        end = e
    if end > data_len:
        raise _corrupt(f"file is truncated: tensor data needs {end} bytes after the header, the file has {data_len}")
    if end < data_len:
        raise _corrupt(f"{data_len - end} trailing bytes after the last tensor")
    return names


def _tensor_from(buf: bytes | bytearray | memoryview, info: dict) -> Tensor:
    from kiln._ops.creation import from_numpy

    d = _FROM_ST[info["dtype"]]
    b, e = info["data_offsets"]
    shape = tuple(info["shape"])
    isz = d.itemsize
    count = (e - b) // isz
    if d is dt.bool:
        a = np.frombuffer(buf, np.uint8, count, b) != 0  # any nonzero byte is True (a fresh array)
    elif isz == 1:
        a = np.frombuffer(buf, d.numpy, count, b).copy()
    else:
        a = np.frombuffer(buf, f"<u{isz}", count, b).astype(f"=u{isz}").view(d.numpy)  # astype copies
    return from_numpy(a.reshape(shape))


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


def _decode(node: Any, tensors: dict[str, Tensor], placed: dict[str, Tensor], map_location: _Location) -> Any:
    if not isinstance(node, dict) or len(node) < 1:
        raise _corrupt(f"bad kiln.structure node {node!r}")
    if "tensor" in node:
        name = node["tensor"]
        if name not in tensors:
            raise _corrupt(f"kiln.structure refers to a missing tensor {name!r}")
        if name not in placed:
            t = _place(tensors[name], str(node.get("device", "cpu")), map_location)
            if node.get("requires_grad"):
                t.requires_grad_(True)
            placed[name] = t
        return placed[name]
    if len(node) != 1:
        raise _corrupt(f"bad kiln.structure node {node!r}")
    ((kind, value),) = node.items()
    if kind == "none":
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
        items = [_decode(v, tensors, placed, map_location) for v in value]
        return items if kind == "list" else tuple(items)
    elif kind == "dict" and isinstance(value, list):
        out = {}
        for pair in value:
            if not (isinstance(pair, list) and len(pair) == 2):
                raise _corrupt(f"bad kiln.structure dict item {pair!r}")
            key = pair[0]
            if isinstance(key, dict) and set(key) == {"int"} and type(key["int"]) is builtins.int:
                key = key["int"]
            elif not isinstance(key, str):
                raise _corrupt(f"bad kiln.structure dict key {key!r}")
            out[key] = _decode(pair[1], tensors, placed, map_location)
        return out
    raise _corrupt(f"bad kiln.structure node {node!r}")


def load(f: str | os.PathLike | BinaryIO, map_location: _Location = None, weights_only: bool = True) -> Any:
    """Load an object saved by :func:`save`, or any safetensors file (then a dict of its tensors).

    Never executes code from the file. The header is validated (JSON shape, known dtypes, offsets that
    match each tensor's size, lie inside the file and neither overlap nor leave gaps; truncated files)
    and a ``ValueError`` says what is wrong. ``map_location`` places tensors as in ``torch.load``: None
    (the device each tensor was saved from; ``"cpu"`` for files from other tools), a device string or
    :class:`kiln.device` (every tensor there), a dict mapping saved device strings to targets (others
    stay), or a callable ``fn(tensor, location)`` given each CPU tensor and its saved device string,
    returning the tensor to use or None for the default placement. Loaded tensors are independent,
    writable copies that own their memory. ``weights_only`` is accepted for ``torch.load``
    compatibility; kiln files never contain code, so both values behave the same.
    """
    if not isinstance(weights_only, builtins.bool):
        raise TypeError(f"kiln.load: weights_only must be a bool, got {type(weights_only).__name__}")
    if hasattr(f, "read"):
        return _load_from(f, map_location)
    with open(os.fspath(f), "rb") as fh:
        return _load_from(fh, map_location)


def _load_from(fh: BinaryIO, map_location: _Location) -> Any:
    n = int.from_bytes(_read_exact(fh, 8, "header length"), "little")
    if n > _MAX_HEADER:
        raise _corrupt(f"header length {n} is larger than the {_MAX_HEADER}-byte limit")
    raw = _read_exact(fh, n, "header")
    metadata, entries = _parse_header(raw)
    data = fh.read()
    names = _check_layout(entries, len(data))
    tensors = {name: _tensor_from(data, entries[name]) for name in names}
    del data
    spec = metadata.get(STRUCTURE_KEY)
    if spec is None:
        placed: dict[str, Tensor] = {}
        return {name: _decode({"tensor": name}, tensors, placed, map_location) for name in names}
    try:
        structure = json.loads(spec)
    except json.JSONDecodeError as e:
        raise _corrupt(f"{STRUCTURE_KEY} metadata is not valid JSON ({e})") from None
    if not isinstance(structure, dict) or "root" not in structure:
        raise _corrupt(f"{STRUCTURE_KEY} metadata has no root")
    if structure.get("version") != FORMAT_VERSION:
        raise ValueError(
            f"kiln.load: the file's {STRUCTURE_KEY} format version {structure.get('version')!r} is not supported "
            f"(this kiln reads version {FORMAT_VERSION})"
        )
    return _decode(structure["root"], tensors, {}, map_location)
