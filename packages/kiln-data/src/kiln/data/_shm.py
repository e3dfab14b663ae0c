"""How batches cross from worker processes: array bytes in one shared-memory segment per batch.

A worker packs every CPU tensor and numeric NumPy array of a batch into one POSIX shared-memory
segment (:class:`multiprocessing.shared_memory.SharedMemory`, untracked; before Python 3.13 the same
calls it makes, since it cannot skip the resource tracker there) and sends only the batch's structure
(with placeholders) and the segment's name through the result queue. The main process maps the
segment, unlinks its name at once (the mapping lives on until the last array over it is freed) and
builds the tensors over it with ``kiln.from_numpy``: no copy on the receiving side.

Segment names carry the loader's prefix, so a shutdown can remove those that a killed worker or an
abandoned queue left behind (see :func:`unlink_leftovers`).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import sys
from multiprocessing import shared_memory

import numpy as np

import kiln

try:  # POSIX: attach without registering with the resource tracker (Python < 3.13 has no track=False)
    import _posixshmem
except ImportError:  # pragma: no cover - Windows: batches are pickled instead
    _posixshmem = None

__all__ = ["available", "encode", "decode", "unlink_leftovers"]

_ALIGN = 64
MIN_BYTES = 1024  # batches with fewer array bytes than this are cheaper to pickle than to map


def available() -> bool:
    """Whether batches can travel through shared memory on this platform."""
    return _posixshmem is not None


class _Ref:
    """A placeholder for one array of the segment: ``kind`` is ``"kiln"`` or ``"numpy"``."""

    __slots__ = ("i", "kind")

    def __init__(self, i: int, kind: str) -> None:
        self.i, self.kind = i, kind

    def __reduce__(self):
        return (_Ref, (self.i, self.kind))


def _strip(obj, arrays: list):
    if isinstance(obj, kiln.Tensor):
        if obj.device.type == "cpu" and obj.grad_fn is None and not obj.requires_grad:
            arrays.append(obj.numpy())
            return _Ref(len(arrays) - 1, "kiln")
        return obj
    if type(obj) is np.ndarray and obj.dtype.kind in "biufc" and not obj.dtype.hasobject:
        arrays.append(obj)
        return _Ref(len(arrays) - 1, "numpy")
    t = type(obj)
    if t is dict:
        return {k: _strip(v, arrays) for k, v in obj.items()}
    if t is list:
        return [_strip(v, arrays) for v in obj]
    if t is tuple:
        return tuple(_strip(v, arrays) for v in obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return t(*(_strip(v, arrays) for v in obj))
    return obj


def _fill(obj, arrays: list):
    if type(obj) is _Ref:
        a = arrays[obj.i]
        return kiln.from_numpy(a) if obj.kind == "kiln" else a
    t = type(obj)
    if t is dict:
        return {k: _fill(v, arrays) for k, v in obj.items()}
    if t is list:
        return [_fill(v, arrays) for v in obj]
    if t is tuple:
        return tuple(_fill(v, arrays) for v in obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return t(*(_fill(v, arrays) for v in obj))
    return obj


def encode(obj, name: str):
    """What a worker puts on the result queue for ``obj``: ``("shm", ...)`` or ``("obj", obj)``."""
    if _posixshmem is None:
        return ("obj", obj)
    arrays: list[np.ndarray] = []
    structure = _strip(obj, arrays)
    if sum(a.nbytes for a in arrays) < MIN_BYTES:
        return ("obj", obj)
    metas, offset = [], 0
    for a in arrays:
        metas.append((offset, a.shape, a.dtype))
        offset += (a.nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
    size = max(offset, 1)
    buf, close = _create(name, size)
    try:
        for a, (off, shape, dtype) in zip(arrays, metas):
            np.ndarray(shape, dtype, buffer=buf, offset=off)[...] = a
    finally:
        close()
    return ("shm", name, max(offset, 1), structure, metas)


def _create(name: str, size: int):
    """A new segment ``name`` of ``size`` bytes, owned by the main process: (writable buffer, close function).

    Nothing registers it with multiprocessing's resource tracker: the main process unlinks the name
    when it maps the segment, or at shutdown by prefix. (Registering would cost two messages to the
    tracker process per batch, and a forked worker would start a tracker of its own.)
    """
    if sys.version_info >= (3, 13):
        shm = shared_memory.SharedMemory(name=name, create=True, size=size, track=False)
        return shm.buf, shm.close
    # Before 3.13 SharedMemory always registers; this is what it does, less the registration.
    fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    try:
        os.ftruncate(fd, size)
        mm = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    return mm, mm.close


def decode(payload):
    """The batch a worker sent, its arrays mapped from shared memory (whose name is unlinked here)."""
    if payload[0] == "obj":
        return payload[1]
    _, name, size, structure, metas = payload
    fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
    try:
        mm = mmap.mmap(fd, size)
    finally:
        os.close(fd)
        _posixshmem.shm_unlink("/" + name)
    arrays = [np.ndarray(shape, dtype, buffer=mm, offset=off) for off, shape, dtype in metas]
    return _fill(structure, arrays)


def discard(payload) -> None:
    """Free the segment of a payload that will never be decoded."""
    if payload[0] == "shm":
        unlink(payload[1])


def unlink(name: str) -> None:
    """Remove a segment name (if it is still there)."""
    if _posixshmem is None:
        return
    with contextlib.suppress(FileNotFoundError):
        _posixshmem.shm_unlink("/" + name)


def unlink_leftovers(prefix: str) -> list[str]:
    """Unlink every segment whose name starts with ``prefix`` (Linux: listed in /dev/shm); returns them."""
    try:
        names = [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]
    except OSError:
        return []
    for n in names:
        unlink(n)
    return names
