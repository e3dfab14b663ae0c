"""Shared-memory storage for CPU tensors: segments, moving a storage into one in place, and handles.

A CPU tensor's storage is a 1-D NumPy array. :func:`share_memory_` copies a storage into a
:class:`Segment` (a shared ``mmap`` of a memory file) and points every CPU tensor whose storage
overlaps the same memory at the copy, so a tensor and all its views move together, in place (kiln has
no storage object to swap a pointer in, so the tensors are found instead: at once when the tensor is
provably the only holder of its memory, by a scan of the tensors alive otherwise). NumPy arrays taken
from the tensors before the move keep the old memory.

A segment is one of two kinds, chosen by the sharing strategy when it is made:

* ``"file_descriptor"``: a nameless memory file (``memfd_create``; elsewhere a ``shm_open`` name
  unlinked at once). The segment keeps its descriptor, which travels to other processes (passed to a
  child at its start, or through multiprocessing's resource sharer). The memory lives while some
  process maps it or holds the descriptor, so nothing can leak into ``/dev/shm``, whatever dies.
* ``"file_system"``: a named POSIX segment (``/dev/shm/kiln_mp_*``) holding no descriptor, its name
  travelling instead. The first 64 bytes count the processes that hold it (changed under a ``lockf``
  lock); whoever takes the count to zero unlinks the name. A process started by multiprocessing gives
  its references back when it exits; the names of processes killed outright are unlinked by Python's
  resource tracker when the program ends.

kiln-data's DataLoader maps its batches with :func:`map_fd` too (segments without a descriptor: their
tensors are shared, and are moved to a new segment if sent on). The public names are in
:mod:`kiln.multiprocessing.reductions`.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import mmap
import os
import secrets
import sys
import threading
import weakref

import numpy as np

from kiln._device import CPU
from kiln._tensor import Tensor

try:  # POSIX shared memory without multiprocessing's resource tracker
    import _posixshmem
except ImportError:  # pragma: no cover - Windows
    _posixshmem = None

_memfd_create = getattr(os, "memfd_create", None)  # Linux; module-level so tests can take the fallback
# From Python 3.13 a mapping need not keep a duplicate of its descriptor.
_NO_DUP = {"trackfd": False} if sys.version_info >= (3, 13) else {}
STRATEGIES = ("file_descriptor", "file_system")
_HEADER = 64  # named segments: the reference count, then the data from this offset
_PREFIX = "kiln_mp_"
_strategy = "file_descriptor"
_lock = threading.RLock()
_segments: weakref.WeakValueDictionary[str, Segment] = weakref.WeakValueDictionary()  # key -> mapped here
_storages: weakref.WeakValueDictionary[tuple, np.ndarray] = weakref.WeakValueDictionary()
_named: dict[str, weakref.finalize] = {}  # key -> the release of a named segment this process holds
_exit_hook_pid = 0


def available() -> bool:
    """Whether this platform has shared-memory files (``memfd_create`` or POSIX ``shm_open``)."""
    return _memfd_create is not None or _posixshmem is not None


def get_strategy() -> str:
    """The kind of segment new shared storages get: ``"file_descriptor"`` or ``"file_system"``."""
    return _strategy


def set_strategy(strategy: str) -> None:
    """Set the kind of segment new shared storages get (validated by the caller)."""
    global _strategy
    if strategy == "file_system" and _posixshmem is not None:
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()  # started here, so that children forked later share it
    _strategy = strategy


def anonymous_fd(name: str, size: int = 0, *, memfd: bool = True) -> int:
    """A descriptor of a new shared-memory file of ``size`` bytes that no name refers to.

    ``name`` labels it (``memfd:`` names show in ``/proc/<pid>/fd``); without ``memfd_create`` (or
    with ``memfd=False``) it is the POSIX name, unlinked before this returns, so it must be unique.
    The descriptor is close-on-exec.
    """
    if memfd and _memfd_create is not None:
        fd = _memfd_create(name, os.MFD_CLOEXEC)
    elif _posixshmem is not None:
        fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        _posixshmem.shm_unlink("/" + name)
    else:  # pragma: no cover - Windows
        raise RuntimeError("shared memory is not available on this platform")
    if size:
        try:
            os.ftruncate(fd, size)
        except BaseException:
            os.close(fd)
            raise
    return fd


def unlink(name: str) -> None:
    """Remove the POSIX shared-memory name ``name`` (no leading ``/``) if it is still there."""
    if _posixshmem is not None:
        with contextlib.suppress(FileNotFoundError):
            _posixshmem.shm_unlink("/" + name)


class Segment(mmap.mmap):
    """A shared mapping that tensor storages live in (arrays over it are "shared").

    Attributes: ``key`` (the same in every process that maps it), ``fd`` (the descriptor it keeps,
    or None), ``name`` (the POSIX name of a named segment, else None), ``start`` (where the data
    begins), ``nbytes`` (data bytes) and ``address`` (of byte 0 of the mapping, in this process).
    """

    key: str
    fd: int | None
    name: str | None
    start: int
    nbytes: int
    address: int


def _new_key() -> str:
    return f"{os.getpid()}_{secrets.token_hex(8)}"


def _mapped(fd: int, length: int, key: str, fd_kept: int | None, name: str | None, start: int) -> Segment:
    seg = Segment(fd, length, **_NO_DUP)
    seg.key, seg.fd, seg.name, seg.start, seg.nbytes = key, fd_kept, name, start, length - start
    probe = np.frombuffer(seg, np.uint8, count=1)
    seg.address = probe.ctypes.data
    del probe  # releases the buffer export
    with _lock:
        _segments[key] = seg
    if fd_kept is not None:
        weakref.finalize(seg, os.close, fd_kept)
    return seg


def map_fd(fd: int, nbytes: int, *, keep_fd: bool, key: str | None = None) -> Segment:
    """Map the shared-memory file ``fd`` (``nbytes`` long) as a :class:`Segment`.

    With ``keep_fd`` the segment owns the descriptor (closed with it) and can be sent on to other
    processes; otherwise the descriptor is closed here (kiln-data's batches: no descriptor per batch).
    """
    try:
        seg = _mapped(fd, max(nbytes, 1), key or _new_key(), fd if keep_fd else None, None, 0)
    except BaseException:
        if keep_fd:
            os.close(fd)
        raise
    finally:
        if not keep_fd:
            os.close(fd)
    return seg


def new_segment(nbytes: int) -> Segment:
    """A new, zeroed segment of ``nbytes`` data bytes, of the current strategy's kind."""
    if not available():  # pragma: no cover - Windows
        raise RuntimeError("shared memory is not available on this platform")
    key = _new_key()
    if _strategy == "file_system" and _posixshmem is not None:
        return _new_named(nbytes, key)
    fd = anonymous_fd(f"{_PREFIX}{key}", max(nbytes, 1))
    return map_fd(fd, nbytes, keep_fd=True, key=key)


# ----------------------------------------------------------------------------- named segments


def _adjust(name: str, delta: int) -> None:
    """Add ``delta`` to a named segment's reference count; unlink the name when it reaches zero."""
    try:
        fd = _posixshmem.shm_open(name, os.O_RDWR, mode=0o600)
    except FileNotFoundError:  # unlinked already (the resource tracker, or a count gone wrong)
        return
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX)
        count = int.from_bytes(os.pread(fd, 8, 0), "little") + delta
        os.pwrite(fd, count.to_bytes(8, "little"), 0)
        if count <= 0:
            with contextlib.suppress(FileNotFoundError):
                _posixshmem.shm_unlink(name)
            from multiprocessing import resource_tracker

            resource_tracker.unregister(name, "shared_memory")
    finally:
        os.close(fd)  # releases the lock


def _release_named(key: str, name: str, pid: int) -> None:
    _named.pop(key, None)
    if os.getpid() == pid:  # a forked child's copy of its parent's segment holds no reference of its own
        _adjust(name, -1)


def _hold_named(seg: Segment) -> None:
    """Give this process's reference back when the segment is collected, or when the process exits."""
    global _exit_hook_pid
    pid = os.getpid()
    _named[seg.key] = weakref.finalize(seg, _release_named, seg.key, seg.name, pid)
    if _exit_hook_pid != pid:  # multiprocessing's children leave through os._exit: no atexit
        from multiprocessing import util

        util.Finalize(None, _release_all_named, exitpriority=0)
        _exit_hook_pid = pid


def _release_all_named() -> None:
    for release in list(_named.values()):
        release()


def _new_named(nbytes: int, key: str) -> Segment:
    from multiprocessing import resource_tracker

    name = f"/{_PREFIX}{key}"
    length = _HEADER + max(nbytes, 1)
    fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    try:
        resource_tracker.register(name, "shared_memory")  # unlinked at the program's end if a holder was killed
        os.ftruncate(fd, length)
        os.pwrite(fd, (1).to_bytes(8, "little"), 0)
        seg = _mapped(fd, length, key, None, name, _HEADER)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            _posixshmem.shm_unlink(name)
        resource_tracker.unregister(name, "shared_memory")
        raise
    os.close(fd)
    _hold_named(seg)
    return seg


# ----------------------------------------------------------------------------- storages and tensors


def segment_of(storage) -> Segment | None:
    """The segment a storage's memory lies in, or None."""
    a = storage
    while True:
        if isinstance(a, np.ndarray):
            below = a.base
        elif isinstance(a, memoryview):
            below = a.obj
        elif hasattr(a, "__array_interface__"):  # NumPy's wrapper of as_strided views
            below = getattr(a, "base", None)
        else:
            break
        if below is None:
            break
        a = below
    return a if isinstance(a, Segment) else None


def is_shared(t: Tensor) -> bool:
    """Whether a tensor's storage lives in shared memory."""
    return t._device is CPU and isinstance(t._storage, np.ndarray) and segment_of(t._storage) is not None


def _bounds(a: np.ndarray) -> tuple[int, int]:
    lo = a.__array_interface__["data"][0]
    if a.size == 0:
        return lo, lo
    span = sum((n - 1) * s for n, s in zip(a.shape, a.strides) if s > 0)
    back = sum((n - 1) * s for n, s in zip(a.shape, a.strides) if s < 0)
    return lo + back, lo + span + a.itemsize


def _alone(t: Tensor) -> bool:
    """Whether ``t`` provably holds the only references to its storage's memory (no scan needed).

    Counts references: the storage must be referenced by ``t`` alone (and by ``t``'s cached array),
    and, when it views an owning array, that array by the storage and ``t``'s cached array alone.
    Anything else holding either (another tensor, a view, a buffer export) makes this False.
    """
    st = t._storage
    root = st.base
    c = t._np
    c_is_st = c is st
    c_on_st = c is not None and not c_is_st and c.base is st
    c_is_root = root is not None and c is root
    c_on_root = root is not None and c is not None and not c_is_root and c.base is root
    del c
    # each count below adds 2: the local name and getrefcount's argument
    if sys.getrefcount(st) != 1 + c_is_st + c_on_st + 2:
        return False
    if root is None:
        return True
    if type(root) is not np.ndarray or root.base is not None:
        return False
    return sys.getrefcount(root) == 1 + c_is_root + c_on_root + 2


def _storage_group(t: Tensor) -> list[Tensor]:
    """``t`` and every live CPU tensor whose storage overlaps its memory (transitively)."""
    if _alone(t):
        return [t]
    candidates = [  # type(), not isinstance(): some objects warn when their __class__ is read
        o
        for o in gc.get_objects()
        if issubclass(type(o), Tensor)
        and o is not t
        and not o.is_sparse  # (a sparse COO tensor has no storage of its own: its parts are candidates)
        and o._device is CPU
        and type(o._storage) is np.ndarray
    ]
    spans = {}
    for o in candidates:
        lo, hi = _bounds(o._storage)
        if hi > lo:
            spans[id(o)] = (lo, hi)
    lo, hi = _bounds(t._storage)
    group = [t]
    if hi == lo:
        return group
    rest = [o for o in candidates if id(o) in spans]
    grew = True
    while grew:
        grew = False
        keep = []
        for o in rest:
            a, b = spans[id(o)]
            if a < hi and lo < b:
                group.append(o)
                lo, hi = min(lo, a), max(hi, b)
                grew = True
            else:
                keep.append(o)
        rest = keep
    return group


def move_to_new_segment(t: Tensor) -> None:
    """Copy ``t``'s storage (and every storage overlapping its memory) into a new segment, in place."""
    group = _storage_group(t)
    storages = {id(o._storage): o._storage for o in group}
    bounds = {k: _bounds(s) for k, s in storages.items()}
    lo = min((b[0] for b in bounds.values() if b[1] > b[0]), default=0)
    hi = max((b[1] for b in bounds.values() if b[1] > b[0]), default=0)
    seg = new_segment(hi - lo)
    moved = {}
    for k, s in storages.items():
        at = s.__array_interface__["data"][0]
        offset = seg.start + (at - lo if s.size else 0)
        new = np.ndarray(s.shape, s.dtype, buffer=seg, offset=offset, strides=s.strides)
        new[...] = s
        moved[k] = new
        _storages[_storage_key(seg, new)] = new
    for o in group:
        o._storage = moved[id(o._storage)]
        o._np = None


def share_memory_(t: Tensor) -> None:
    """Move ``t``'s storage, with every view of it, to shared memory in place (no-op if it is already)."""
    if t._device is not CPU or not isinstance(t._storage, np.ndarray):
        raise RuntimeError(
            f"share_memory_(): only CPU tensors can be moved to shared memory, not a tensor on device '{t._device}'"
        )
    if segment_of(t._storage) is None:
        move_to_new_segment(t)


# ----------------------------------------------------------------------------- crossing processes


def _storage_key(seg: Segment, st: np.ndarray) -> tuple:
    return (seg.key, st.__array_interface__["data"][0] - seg.address, st.shape, st.strides, st.dtype)


def storage_handle(t: Tensor) -> tuple[Segment, tuple]:
    """The segment of ``t``'s storage (moving it to one that can be sent first) and where the storage
    lies in it: ``(offset in bytes, shape, strides, NumPy dtype)``."""
    seg = segment_of(t._storage)
    if seg is None or (seg.fd is None and seg.name is None):
        move_to_new_segment(t)
        seg = segment_of(t._storage)
    st = t._storage
    return seg, (st.__array_interface__["data"][0] - seg.address, st.shape, st.strides, st.dtype)


def named_pin(seg: Segment) -> None:
    """Count one more reference to a named segment: the one a message in flight holds for its receiver."""
    _adjust(seg.name, +1)


def received_fd(fd: int, key: str, nbytes: int) -> Segment:
    """The segment ``key`` mapped from a received descriptor (closed if this process maps it already)."""
    with _lock:
        seg = _segments.get(key)
        if seg is not None:
            if fd != seg.fd:  # a child started by spawn gets one descriptor for every handle of a segment
                os.close(fd)
            return seg
        return map_fd(fd, nbytes, keep_fd=True, key=key)


def received_name(name: str, key: str, nbytes: int) -> Segment:
    """The named segment ``key``: mapped here, taking over the reference its sender counted for us."""
    with _lock:
        seg = _segments.get(key)
        if seg is not None:
            _adjust(name, -1)  # already held here: the sender's extra count is not needed
            return seg
        try:
            fd = _posixshmem.shm_open(name, os.O_RDWR, mode=0o600)
        except FileNotFoundError:
            raise RuntimeError(
                f"shared memory segment {name} no longer exists (every process holding it released it)"
            ) from None
        try:
            seg = _mapped(fd, _HEADER + max(nbytes, 1), key, None, name, _HEADER)
        finally:
            os.close(fd)
        _hold_named(seg)
        return seg


def storage_in(seg: Segment, offset: int, shape: tuple, strides: tuple, dtype: np.dtype) -> np.ndarray:
    """The storage array at ``offset`` of ``seg`` (the same object for every tensor received over it)."""
    key = (seg.key, offset, shape, strides, dtype)
    with _lock:
        st = _storages.get(key)
        if st is None:
            st = np.ndarray(shape, dtype, buffer=seg, offset=offset, strides=strides)
            _storages[key] = st
    return st
