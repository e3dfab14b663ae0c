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
Loaded tensors are fresh, writable copies that own their memory: each tensor's bytes are read from the
file straight into its own array, so loading needs about one file's worth of memory, not two.

Every malformed file raises ``ValueError``: the header's fields are type- and range-checked, sizes are
checked against the file's length before anything is allocated, and the nesting of the structure JSON
is bounded. A PyTorch ``torch.save`` file (zip or legacy pickle) is recognised and named as such.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import math
import os
import re
import reprlib
import secrets
import stat
import sys
from collections.abc import Callable
from typing import Any, BinaryIO

import numpy as np

from kiln import _dtype as dt
from kiln._device import CPU, as_device
from kiln._device import device as _device
from kiln._tensor import Tensor

try:  # advisory locks mark a temp file as being written; absent on Windows
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = ["load", "save"]

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


def _temp_pattern(name: str) -> re.Pattern[str]:
    """Names of the temp files ``save`` writes for target ``name``: ``.<name>.<pid>.<16 hex>.tmp``."""
    return re.compile(rf"\.{re.escape(name)}\.([0-9]{{1,10}})\.[0-9a-f]{{16}}\.tmp")


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a zombie counts as alive until its parent reaps it)."""
    try:
        os.kill(pid, 0)  # signal 0: only checks that the process exists and may be signalled
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it exists but belongs to another user; anything else: be safe
        return True
    return True


def _remove_if_unlocked(path: str) -> None:
    """Delete a temp file unless a writer still holds its lock (written elsewhere: another PID namespace)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:  # gone already, or not ours to read: leave it
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # a live writer holds it
        except OSError:
            pass  # the filesystem has no locks: the dead PID is all there is to go by
        # Gone already, or not ours to delete (another user's file in a sticky directory such as /tmp).
        with contextlib.suppress(OSError):
            os.unlink(path)
    finally:
        os.close(fd)


def _remove_stale_temps(directory: str, name: str) -> None:
    """Remove temp files of target ``name`` left by writers that died (killed mid-save, power loss).

    A temp file is stale when the PID in its name is no process any more and no one holds its lock.
    A live writer's file (another process, or another thread of this one) is never touched. Best
    effort: an ``OSError`` while listing the directory, or while opening, locking or deleting one
    candidate (say another user's stale file in a shared sticky directory), leaves that file where it
    is and moves on; it never fails the save.
    """
    if os.name != "posix" or fcntl is None:  # os.kill(pid, 0) is not a liveness probe on Windows
        return
    pattern = _temp_pattern(name)
    me = os.getpid()
    try:
        entries = os.listdir(directory)
    except OSError:
        return
    for entry in entries:
        m = pattern.fullmatch(entry)
        if m is None:
            continue
        pid = builtins.int(m.group(1))
        if pid == me or not 0 < pid < 2**31:
            continue
        with contextlib.suppress(OSError):  # this candidate stays; the others and the save go on
            if not _pid_alive(pid):
                _remove_if_unlocked(os.path.join(directory, entry))


def _existing_mode(path: str) -> int | None:
    """The permission bits of the regular file at ``path`` (symlinks already resolved); None if there is none.

    Only ``rwx`` for user, group and others: setuid/setgid are not carried over (writing to a file
    clears them too), and the sticky bit means nothing on a regular file.
    """
    if os.name != "posix":  # a mode there is only the read-only flag
        return None
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return stat.S_IMODE(st.st_mode) & 0o777 if stat.S_ISREG(st.st_mode) else None


def _create_temp(directory: str, name: str) -> tuple[int, str]:
    """Create and lock ``.<name>.<pid>.<random>.tmp`` next to the target, with mode ``0o666 & ~umask``."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = os.path.join(directory, f".{name}.{os.getpid()}.{secrets.token_hex(8)}.tmp")
        try:
            fd = os.open(tmp, flags, 0o666)  # 0o666 & ~umask, as open(path, "wb") would give a new file
        except FileExistsError:
            continue
        if fcntl is not None:
            with contextlib.suppress(OSError):  # no locks on this filesystem: the PID alone marks it live
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd, tmp
    raise FileExistsError(f"kiln.save: could not create a temp file next to {os.path.join(directory, name)!r}")


def _fsync_directory(directory: str) -> None:
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


def save(obj: Any, f: str | os.PathLike | BinaryIO) -> None:
    """Save a tensor, a state dict, or nested dicts/lists/tuples of tensors to ``f`` (safetensors format).

    ``f`` is a path or a writable binary file object (written directly, from its current position).
    A path is written atomically: into a temp file ``.<name>.<pid>.<random>.tmp`` in the target's
    directory, fsynced, renamed over the target, then the directory fsynced, so a crash, kill or power
    loss leaves either the old file or the new one under the name, never a partial one. On an error the
    temp file is removed and the target left untouched; temp files left by writers that were killed
    (their PID is gone) are removed by the next save to the same target, best effort (one that cannot
    be removed, such as another user's, is left and never fails the save). Saving over an existing
    file keeps its permission bits (``rwx`` for user, group, others), as ``open(path, "wb")`` would: a
    ``0o600`` checkpoint stays ``0o600``; the owner and group are the saver's, as for any new file. A
    new file's mode is ``0o666 & ~umask``. A symlink is followed: the file it points to is replaced,
    keeps its mode, and the link stays a link.

    Leaves besides tensors may be None, bool, int, float or str; dict keys must be str or int, and
    containers may nest up to 100 levels. Tensors on any device are saved from a contiguous CPU copy
    of their values; ``requires_grad`` and the device are recorded and restored by :func:`load`. A flat
    dict of tensors is readable by ``safetensors.torch.load_file`` under its own keys.
    """
    enc = _Encoder()
    structure = enc.encode(obj, "")  # raises for unsupported objects before any file is touched
    meta = {STRUCTURE_KEY: json.dumps({"version": FORMAT_VERSION, "root": structure}, ensure_ascii=False)}
    header, order = _header(enc.tensors, meta)
    if hasattr(f, "write"):
        _write(f, header, order)
        return
    # Through a symlink, the file it points to is the one to replace (renaming over the link itself
    # would turn it into a regular file); the temp file must sit next to that file to rename onto it.
    path = os.path.realpath(os.fsdecode(os.fspath(f)))
    directory, name = os.path.split(path)
    _remove_stale_temps(directory, name)
    mode = _existing_mode(path)
    fd, tmp = _create_temp(directory, name)
    try:
        with os.fdopen(fd, "wb") as fh:
            # The temp file takes the target's mode before any data is in it, so a 0o600 checkpoint
            # is never readable by others, not even while its replacement is being written.
            if mode is not None and stat.S_IMODE(os.fstat(fd).st_mode) != mode:
                os.fchmod(fd, mode)
            _write(fh, header, order)
            fh.flush()
            os.fsync(fh.fileno())  # the data reaches the disk before the name points at it
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_directory(directory)


# ------------------------------------------------------------------------------------------ loading


def _corrupt(msg: str) -> ValueError:
    return ValueError(f"kiln.load: invalid safetensors file: {msg}")


def _read_exact(fh: BinaryIO, n: int, what: str) -> bytes:
    # Reads in chunks, so a length field that lies about the file costs no more memory than the file.
    chunks, left = [], n
    while left:
        b = fh.read(min(left, 1 << 24))
        if not b:
            raise _corrupt(f"file is truncated ({what}: expected {n} bytes, got {n - left})")
        chunks.append(b)
        left -= len(b)
    return b"".join(chunks)


def _pytorch_file(kind: str, name: str | None) -> ValueError:
    what = f"{name!r}" if name is not None else "the file"
    return ValueError(
        f"kiln.load: {what} is a PyTorch file written by torch.save ({kind}), which kiln.load cannot read yet: "
        "kiln reads safetensors files. Convert it with torch and the safetensors package, e.g. "
        "safetensors.torch.save_file(torch.load(path), out) for a flat dict of tensors, then kiln.load(out)."
    )


def _pytorch_kind(head: bytes) -> str | None:
    """What PyTorch format the first 8 bytes of a file look like, if any."""
    if head.startswith(b"PK\x03\x04"):  # torch.save's default since 1.6: a zip archive
        return "a zip archive, its format for .pt/.pth files"
    if head[:1] == b"\x80" and 2 <= head[1] <= 5:  # PROTO opcode: _use_new_zipfile_serialization=False
        return "a pickle, its legacy format"
    return None


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


def _fill(fh: BinaryIO, out: memoryview, what: str) -> None:
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
            raise _corrupt(f"file is truncated ({what}: expected {len(out)} bytes, got {got})")
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


def load(f: str | os.PathLike | BinaryIO, map_location: _Location = None, weights_only: bool = True) -> Any:
    """Load an object saved by :func:`save`, or any safetensors file (then a dict of its tensors).

    Never executes code from the file. The header is validated (JSON shape and the type and range of
    every field, known dtypes, shapes, offsets that match each tensor's size, lie inside the file and
    neither overlap nor leave gaps, duplicate keys, bounded nesting, truncated files) before anything is
    allocated, and every problem raises a ``ValueError`` that says what is wrong. A PyTorch file
    (``torch.save``'s zip or legacy pickle format) raises a ``ValueError`` saying how to convert it.
    ``map_location`` places tensors as in ``torch.load``: None (the device each tensor was saved
    from; ``"cpu"`` for files from other tools), a device string or :class:`kiln.device` (every tensor
    there), a dict mapping saved device strings to targets (others stay), or a callable
    ``fn(tensor, location)`` given each CPU tensor and its saved device string, returning the tensor
    to use or None for the default placement. Loaded tensors are independent, writable copies that own
    their memory, read from the file straight into place (peak memory about the size of the tensors).
    A file object is read from its current position to its end. ``weights_only`` is accepted for
    ``torch.load`` compatibility; kiln files never contain code, so both values behave the same.
    """
    if not isinstance(weights_only, builtins.bool):
        raise TypeError(f"kiln.load: weights_only must be a bool, got {type(weights_only).__name__}")
    if hasattr(f, "read"):
        return _load_from(f, map_location, None)
    path = os.fspath(f)
    with open(path, "rb") as fh:
        return _load_from(fh, map_location, os.fsdecode(path))


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


def _load_from(fh: BinaryIO, map_location: _Location, name: str | None) -> Any:
    size = _remaining(fh)
    head = fh.read(8)
    if len(head) < 8:
        raise _corrupt(f"file is truncated (header length: expected 8 bytes, got {len(head)})")
    n = int.from_bytes(head, "little")
    torch_kind = _pytorch_kind(head)
    too_long = n > _MAX_HEADER or (size is not None and n > size - 8)
    if torch_kind is not None and too_long:
        raise _pytorch_file(torch_kind, name)
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
        raise _pytorch_file(torch_kind, name)
    metadata, entries = _parse_header(raw)
    del raw
    if size is None:  # a stream of unknown length: hold the rest in memory to learn how much there is
        data = fh.read()
        data_len, fh = len(data), io.BytesIO(data)
    else:
        data_len = size - 8 - n
    names = _check_layout(entries, data_len)  # every size is checked against the file before allocating
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
