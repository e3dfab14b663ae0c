"""How batches cross from worker processes: array bytes in one nameless shared-memory file per batch.

A worker packs every CPU tensor and numeric NumPy array of a batch into one shared-memory file and
sends the batch's structure (with placeholders) through the result queue, and the file's descriptor
through a Unix socket of its own (``SCM_RIGHTS``). The main process maps the descriptor, closes it and
builds the tensors over the mapping with ``kiln.from_numpy``: no copy on the receiving side.

The file has no name anywhere the main process would have to remove: on Linux it comes from
``memfd_create`` and never had one; elsewhere on POSIX it is a ``shm_open`` segment whose name the
worker unlinks right after opening it. The memory lives exactly as long as some process holds a
descriptor or a mapping of it, or a socket holds the descriptor in flight, so it is freed whatever
happens to either side: a SIGKILL of the main process (the workers notice and exit, and with them the
last references) leaves nothing in ``/dev/shm``.

No process forked from the main process keeps a descriptor of this machinery that is not its own
(see :func:`_close_inherited`, run in every forked child): a worker of one loader holding another
loader's receiving socket end would keep that loader's in-flight batches allocated until it exits.

Names still carry the loader's prefix (``memfd:`` names show in ``/proc/<pid>/fd``), and a shutdown
sweeps ``/dev/shm`` for that prefix (see :func:`unlink_leftovers`): that only matters for a worker
killed between ``shm_open`` and its ``shm_unlink``, where there is no ``memfd_create``.

The files and mappings themselves are the core's shared memory (:mod:`kiln.multiprocessing.reductions`):
a batch's tensors are shared (``is_shared()``), as PyTorch's are, and sent on through
:mod:`kiln.multiprocessing` they keep sharing memory.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import socket
import threading
import weakref
from collections.abc import Callable, Iterator
from multiprocessing.reduction import ForkingPickler

import numpy as np

import kiln
from kiln.multiprocessing import reductions

__all__ = [
    "BatchPickler",
    "available",
    "channel",
    "close_received",
    "decode",
    "encode",
    "forking_with",
    "recv_fd",
    "send_fd",
    "unlink_leftovers",
]

_ALIGN = 64
MIN_BYTES = 1024  # batches with fewer array bytes than this are cheaper to pickle than to map
_SEQ_BYTES = 8  # each descriptor travels with the worker's sequence number of its batch
_RECV_WAIT_S = 10.0  # a descriptor is sent before its queue message, so it is normally there at once
_memfd_create = getattr(os, "memfd_create", None)  # Linux; module-level so tests can take the fallback


def available() -> bool:
    """Whether batches can travel through shared memory on this platform (descriptors over Unix sockets)."""
    return reductions.shared_memory_available()


# What a forked child must not keep (see _close_inherited). Every socket end of every channel this
# process made and still has open: a main process's end holds the batches in flight to it, and stays
# allocated (with them) as long as any process holds a copy; a worker's end left open elsewhere would
# hide that worker's death. And the descriptors received but not yet mapped and closed.
_channel_ends: weakref.WeakSet[socket.socket] = weakref.WeakSet()
_received: set[int] = set()
_keep: dict[int, socket.socket] = {}  # thread id -> the socket end a fork on that thread hands its child


def channel() -> tuple[socket.socket, socket.socket]:
    """A connected pair of Unix sockets for one worker's descriptors: (main process's end, worker's end)."""
    main_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    _channel_ends.add(main_end)
    _channel_ends.add(worker_end)
    return main_end, worker_end


@contextlib.contextmanager
def forking_with(worker_end: socket.socket | None) -> Iterator[None]:
    """While starting a worker on this thread: ``worker_end`` is the one channel end its fork keeps."""
    if worker_end is None:
        yield
        return
    tid = threading.get_ident()
    _keep[tid] = worker_end
    try:
        yield
    finally:
        _keep.pop(tid, None)


def _close_inherited() -> None:
    """In a forked child: close every channel end and received descriptor copied from the parent.

    Run by ``os.register_at_fork`` in every child forked by a process that imported this module,
    a DataLoader worker of any loader or any other child: none of them may keep another process's
    receiving end (or the descriptors in it) alive. Only the socket end of the worker being started
    by the forking thread (:func:`forking_with`) stays open. ``spawn`` and ``forkserver`` children
    get nothing of these to begin with (sockets and received descriptors are close-on-exec).
    """
    keep = _keep.get(threading.get_ident())  # the forking thread: the only one in the child
    _keep.clear()
    for sock in list(_channel_ends):
        if sock is not keep:
            sock.close()
    for fd in list(_received):
        with contextlib.suppress(OSError):
            os.close(fd)
    _received.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_inherited)


def close_received(fd: int) -> None:
    """Close a descriptor that :func:`recv_fd` returned (without mapping it)."""
    _received.discard(fd)  # first: a fork in between leaves the child a copy, never a stale number
    os.close(fd)


class _Ref:
    """A placeholder for one array of the segment: ``kind`` is ``"kiln"`` or ``"numpy"``."""

    __slots__ = ("i", "kind")

    def __init__(self, i: int, kind: str) -> None:
        self.i, self.kind = i, kind

    def __reduce__(self):
        return (_Ref, (self.i, self.kind))


class BatchPickler(ForkingPickler):
    """multiprocessing's pickler without kiln.multiprocessing's tensor reducers, for the payloads.

    What :func:`encode` leaves in a payload (a batch under :data:`MIN_BYTES`, tensors that require
    grad) goes by value, as designed, rather than each tensor through a shared-memory segment of its
    own and the worker's resource sharer (which dies with the worker, losing the batch).
    """

    def __init__(self, *args) -> None:
        super().__init__(*args)
        for cls in [c for c in self.dispatch_table if isinstance(c, type) and issubclass(c, kiln.Tensor)]:
            del self.dispatch_table[cls]


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


def encode(obj, name: str, worker_id: int, seq: int) -> tuple[tuple, int | None]:
    """What a worker sends for ``obj``: (payload for the result queue, descriptor to pass or ``None``).

    The payload is ``("obj", obj)`` (pickled whole) or ``("fd", worker_id, seq, size, structure,
    metas)``, whose arrays are in the returned descriptor's memory; the caller sends the descriptor
    with :func:`send_fd` and closes it.
    """
    if not available():
        return ("obj", obj), None
    arrays: list[np.ndarray] = []
    structure = _strip(obj, arrays)
    if sum(a.nbytes for a in arrays) < MIN_BYTES:
        return ("obj", obj), None
    metas, offset = [], 0
    for a in arrays:
        metas.append((offset, a.shape, a.dtype))
        offset += (a.nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
    size = max(offset, 1)
    fd = reductions.shared_memory_fd(name, size, memfd=_memfd_create is not None)
    try:
        with mmap.mmap(fd, size) as mm:
            for a, (off, shape, dtype) in zip(arrays, metas):
                np.ndarray(shape, dtype, buffer=mm, offset=off)[...] = a
    except BaseException:
        os.close(fd)
        raise
    return ("fd", worker_id, seq, size, structure, metas), fd


def send_fd(sock: socket.socket, seq: int, fd: int, alive: Callable[[], bool], poll_s: float = 1.0) -> bool:
    """Send ``fd`` (tagged with ``seq``) to the main process; ``False`` if it is gone (nobody to send to).

    Waits ``poll_s`` at a time while the socket is full, asking ``alive()`` in between, so that a worker
    whose main process died never blocks here for good.
    """
    data = seq.to_bytes(_SEQ_BYTES, "little")
    sock.settimeout(poll_s)
    while True:
        try:
            sent = socket.send_fds(sock, [data], [fd])
        except TimeoutError:
            if not alive():
                return False
            continue
        except (BrokenPipeError, ConnectionResetError):  # the main process closed its end, or died
            return False
        if sent < len(data):  # pragma: no cover - a stream socket takes 8 bytes whole in practice
            sock.sendall(data[sent:])
        return True


def recv_fd(sock: socket.socket, seq: int, worker_id: int) -> int:
    """The descriptor that worker ``worker_id`` sent for its batch ``seq`` (earlier leftovers are closed)."""
    sock.settimeout(_RECV_WAIT_S)
    flags = getattr(socket, "MSG_CMSG_CLOEXEC", 0)  # not inherited by processes started meanwhile
    while True:
        fds: list[int] = []
        try:
            data, fds, msg_flags, _ = socket.recv_fds(sock, _SEQ_BYTES, 1, flags)
            _received.update(fds)  # until mapped and closed: never inherited by a child forked meanwhile
            while data and len(data) < _SEQ_BYTES:  # a stream socket may split the 8 bytes
                more = sock.recv(_SEQ_BYTES - len(data))
                if not more:
                    break
                data += more
        except TimeoutError:
            for f in fds:
                close_received(f)
            raise RuntimeError(
                f"DataLoader worker {worker_id} sent batch {seq} but not its shared memory within {_RECV_WAIT_S} s"
            ) from None
        if len(data) < _SEQ_BYTES:
            for f in fds:
                close_received(f)
            raise RuntimeError(f"DataLoader worker {worker_id} closed its shared-memory channel")
        got = int.from_bytes(data, "little")
        if not fds:
            hint = " (too many open files?)" if msg_flags & getattr(socket, "MSG_CTRUNC", 0) else ""
            raise RuntimeError(
                f"could not receive the shared memory of a batch from DataLoader worker {worker_id}{hint}"
            )
        if got == seq:
            return fds[0]
        for f in fds:
            close_received(f)
        if got > seq:
            raise RuntimeError(
                f"DataLoader worker {worker_id}: shared memory of batch {got} arrived where {seq} was expected"
            )
        # got < seq: the descriptor of a message lost with a dying worker's queue thread; dropped


def decode(payload, fd: int | None = None):
    """The batch a worker sent; for an ``"fd"`` payload its arrays are mapped from ``fd``, which is closed."""
    if payload[0] == "obj":
        return payload[1]
    _, _, _, size, structure, metas = payload
    _received.discard(fd)  # map_shared_memory closes it
    mm = reductions.map_shared_memory(fd, size)
    arrays = [np.ndarray(shape, dtype, buffer=mm, offset=off) for off, shape, dtype in metas]
    return _fill(structure, arrays)


def unlink_leftovers(prefix: str) -> list[str]:
    """Unlink every segment whose name starts with ``prefix`` (Linux: listed in /dev/shm); returns them."""
    try:
        names = [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]
    except OSError:
        return []
    for n in names:
        reductions.unlink_shared_memory(n)
    return names
