"""How kiln tensors cross processes: pickled by sharing their storage (``torch.multiprocessing.reductions``).

:func:`init_reductions` (run when this module is imported) registers :func:`reduce_tensor` with
multiprocessing's pickler, which every ``Queue``, ``Pipe``, ``Pool`` and ``Process(args=...)`` of a
``spawn`` or ``forkserver`` start uses. A CPU tensor sent that way is first moved to shared memory in
place (:meth:`kiln.Tensor.share_memory_`, unless it is there already); the receiver maps the same
memory, so writes on either side are seen by the other. What travels is a handle to the memory (its
descriptor or its name, by the sharing strategy; see :func:`kiln.multiprocessing.set_sharing_strategy`)
and the tensor's geometry; a process that receives the same storage twice maps it once, and the
tensors it rebuilds share one storage, as their originals did. Processes started by ``fork`` inherit
shared memory as it is (nothing is pickled).

Tensors of other devices are pickled by value (a copy), as by :mod:`pickle`. A tensor that is part of
an autograd graph is refused, as in PyTorch: autograd does not cross processes.

The segment helpers at the end (:func:`shared_memory_fd`, :func:`map_shared_memory`, ...) are the
pieces kiln-data's DataLoader builds its batch transport from.
"""

from __future__ import annotations

import socket
from multiprocessing.reduction import DupFd, ForkingPickler

import numpy as np

from kiln import _dtype as dt
from kiln import _shared_memory as shm
from kiln._device import CPU
from kiln._tensor import SUBCLASS_HOOKS, Tensor, _make

__all__ = [
    "init_reductions",
    "map_shared_memory",
    "rebuild_tensor_fd",
    "rebuild_tensor_filename",
    "reduce_tensor",
    "shared_memory_available",
    "shared_memory_fd",
    "unlink_shared_memory",
]


def reduce_tensor(tensor: Tensor):
    """The multiprocessing pickle of a tensor: a handle to its shared storage, and its geometry.

    Moves the storage to shared memory first when it is not (in place, with every view of it).
    """
    if tensor.requires_grad and tensor.grad_fn is not None:
        raise RuntimeError(
            "Cowardly refusing to serialize non-leaf tensor which requires_grad, since autograd does not support "
            "crossing process boundaries.  If you just want to transfer the data, call detach() on the tensor "
            "before serializing (e.g., putting it on the queue)."
        )
    if tensor._device is not CPU or not isinstance(tensor._storage, np.ndarray) or not shm.available():
        return Tensor.__reduce_ex__(tensor, 2)  # pickled by value
    seg, where = shm.storage_handle(tensor)
    rest = (
        where,
        (tensor._shape, tensor._stride, tensor._offset, tensor._dtype.name),
        tensor.requires_grad,
        type(tensor),
        dict(vars(tensor)) if type(tensor) is not Tensor else None,
    )
    if seg.fd is not None:
        return rebuild_tensor_fd, (DupFd(seg.fd), seg.key, seg.nbytes, *rest)
    shm.named_pin(seg)  # the reference the receiver takes over
    return rebuild_tensor_filename, (seg.name, seg.key, seg.nbytes, *rest)


def _rebuild(seg, where, geometry, requires_grad, cls, state) -> Tensor:
    shape, stride, offset, dtype_name = geometry
    t = _make(shm.storage_in(seg, *where), shape, stride, offset, dt._BY_NAME[dtype_name], CPU)
    if cls is not Tensor:
        t = Tensor._make_subclass(cls, t)
    t._requires_grad = requires_grad
    if state:
        vars(t).update(state)
    return t


def rebuild_tensor_fd(handle, key, nbytes, where, geometry, requires_grad, cls, state) -> Tensor:
    """Unpickle a tensor whose storage came as a descriptor (the ``"file_descriptor"`` strategy)."""
    return _rebuild(shm.received_fd(handle.detach(), key, nbytes), where, geometry, requires_grad, cls, state)


def rebuild_tensor_filename(name, key, nbytes, where, geometry, requires_grad, cls, state) -> Tensor:
    """Unpickle a tensor whose storage came as a segment name (the ``"file_system"`` strategy)."""
    return _rebuild(shm.received_name(name, key, nbytes), where, geometry, requires_grad, cls, state)


def _register(cls: type) -> None:
    # A subclass with a pickle of its own (kiln.nn.Parameter reduces to a plain tensor) keeps it.
    if cls.__reduce_ex__ is Tensor.__reduce_ex__ and cls.__reduce__ is Tensor.__reduce__:
        ForkingPickler.register(cls, reduce_tensor)


def init_reductions() -> None:
    """Register :func:`reduce_tensor` with multiprocessing's pickler for ``Tensor`` and its subclasses
    (those defined later too). Idempotent; run on import."""
    todo = [Tensor]
    while todo:
        cls = todo.pop()
        _register(cls)
        todo.extend(cls.__subclasses__())
    if _register not in SUBCLASS_HOOKS:
        SUBCLASS_HOOKS.append(_register)


# ----------------------------------------------------------------------------- segments (kiln-data)


def shared_memory_available() -> bool:
    """Whether shared-memory files can be made and passed as descriptors over Unix sockets here."""
    return hasattr(socket, "send_fds") and shm.available()


def shared_memory_fd(name: str, size: int = 0, *, memfd: bool = True) -> int:
    """A descriptor of a new ``size``-byte shared-memory file that no name refers to (close-on-exec).

    ``name`` labels it; ``memfd=False`` (or a platform without ``memfd_create``) makes a POSIX segment
    named ``name`` instead and unlinks it before returning, so ``name`` must then be unique.
    """
    return shm.anonymous_fd(name, size, memfd=memfd)


def map_shared_memory(fd: int, nbytes: int):
    """Map the shared-memory file ``fd`` (of ``nbytes``) and close ``fd``: tensors over the mapping
    (``kiln.from_numpy(np.ndarray(..., buffer=mapping))``) are shared (``is_shared()``); sent to
    another process they are first copied to a segment of their own."""
    return shm.map_fd(fd, nbytes, keep_fd=False)


def unlink_shared_memory(name: str) -> None:
    """Remove the POSIX shared-memory name ``name`` (without its leading ``/``) if it is still there."""
    shm.unlink(name)


init_reductions()
