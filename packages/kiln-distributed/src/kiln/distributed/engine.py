"""The engine interface: what a process-group backend implements, and the :class:`Work` it returns.

A *process group* (``kiln.distributed.ProcessGroup``) is the front end users call through
``all_reduce`` and friends: it checks arguments with PyTorch's errors, makes tensors contiguous, turns
``ReduceOp.AVG`` into a sum and a division where the engine has no average, and turns an engine's
failure into an error that names the rank at fault. An *engine* is the part that moves bytes, through
an existing library (Gloo, MPI, NCCL): it subclasses :class:`Engine` and is registered under a backend
name with the ``kiln_register_collectives`` hook::

    @kiln.hookimpl
    def kiln_register_collectives(register):
        register("mygloo", MyEngine)  # then init_process_group("mygloo") or "cpu:mygloo,cuda:nccl"

Engines see only well-formed calls: tensors contiguous, of one dtype, on a device in
:attr:`Engine.devices`, with ranks local to the group. Each call returns a :class:`Work`.
"""

from __future__ import annotations

import datetime
import enum
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["CompletedWork", "Engine", "ReduceOp", "Work"]


class ReduceOp(enum.Enum):
    """How a reduction combines values (``torch.distributed.ReduceOp``)."""

    SUM = "sum"
    AVG = "avg"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"
    PREMUL_SUM = "premul_sum"
    UNUSED = "unused"

    def __repr__(self) -> str:
        return f"<ReduceOp.{self.name}>"


class Work:
    """An operation in flight (``torch.distributed.Work``): :meth:`wait` for it, or ask whether it is done.

    Engines subclass it (or use :class:`CompletedWork` for an operation that already finished).
    """

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        """Block until the operation finished; raise its error if it failed. Returns ``True``."""
        raise NotImplementedError

    def is_completed(self) -> bool:
        """Whether the operation has finished (successfully or not), without blocking."""
        raise NotImplementedError

    def is_success(self) -> bool:
        """Whether the operation finished without an error (waits for it)."""
        try:
            self.wait()
        except Exception:  # noqa: BLE001 - any failure of the operation means no success
            return False
        return True

    def exception(self) -> BaseException | None:
        """The error the operation ended with, or ``None`` (waits for it)."""
        try:
            self.wait()
        except Exception as e:  # noqa: BLE001 - the operation's error, whatever it is, is the answer
            return e
        return None

    def result(self) -> list:
        """The output tensors of the operation, once it has finished."""
        self.wait()
        return list(getattr(self, "_outputs", []))

    def source_rank(self) -> int:
        """For a receive from any source: the rank the message came from."""
        raise RuntimeError("source_rank() is only available for a recv from any source")

    def get_future(self) -> Future:
        """A :class:`Future` that completes with :meth:`result` when the operation finishes."""
        return Future._of_work(self)

    def synchronize(self) -> None:
        """For device engines: make the current stream wait for the operation (here: :meth:`wait`)."""
        self.wait()


class CompletedWork(Work):
    """A :class:`Work` that finished when it was made (a blocking engine call, or nothing to do)."""

    def __init__(self, outputs: list | None = None, error: BaseException | None = None, source: int | None = None):
        self._outputs = outputs or []
        self._error = error
        self._source = source

    def wait(self, timeout=None) -> bool:
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return True

    def source_rank(self) -> int:
        if self._source is None:
            return super().source_rank()
        return self._source


class Future:
    """The result of an asynchronous operation (``torch.futures.Future``): ``wait``, ``value``, ``done``,
    ``then`` and ``set_result``."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Future], None]] = []
        self._work: Work | None = None
        self._lock = threading.Lock()

    @classmethod
    def _of_work(cls, work: Work) -> Future:
        fut = cls()
        fut._work = work
        return fut

    def _settle_from_work(self) -> None:
        if self._work is not None and not self._done.is_set():
            work, self._work = self._work, None
            try:
                self.set_result(work.result())
            except Exception as e:  # noqa: BLE001 - the future carries the error to whoever waits
                self.set_exception(e)

    def done(self) -> bool:
        """Whether the value (or an error) is set."""
        if self._work is not None and self._work.is_completed():
            self._settle_from_work()
        return self._done.is_set()

    def wait(self) -> Any:
        """Block until the future completes; return its value or raise its error."""
        self._settle_from_work()
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value

    def value(self) -> Any:
        """The value of a completed future (raises its error)."""
        return self.wait()

    def set_result(self, result: Any) -> None:
        """Complete the future with ``result`` and run its callbacks."""
        with self._lock:
            if self._done.is_set():
                raise RuntimeError("this Future is already completed")
            self._value = result
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb(self)

    def set_exception(self, result: BaseException) -> None:
        """Complete the future with an error."""
        with self._lock:
            if self._done.is_set():
                raise RuntimeError("this Future is already completed")
            self._error = result
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb(self)

    def add_done_callback(self, callback: Callable[[Future], None]) -> None:
        """Call ``callback(self)`` when the future completes (now, if it has)."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        callback(self)

    def then(self, callback: Callable[[Future], Any]) -> Future:
        """A new future completed with ``callback(self)`` once this one completes."""
        out = Future()

        def chain(fut: Future) -> None:
            try:
                out.set_result(callback(fut))
            except Exception as e:  # noqa: BLE001 - the callback's error goes to the chained future
                out.set_exception(e)

        if self._work is not None:
            # a work-backed future completes when someone waits on it; chain lazily through wait()
            parent = self

            class _Lazy(Work):
                def wait(self, timeout=None):
                    parent.wait()
                    return True

                def is_completed(self):
                    return parent.done()

            out._work = _Lazy()
            out._work.result = lambda: callback(parent)  # type: ignore[method-assign]
            return out
        self.add_done_callback(chain)
        return out


class Engine:
    """A process group's engine: moves tensors between ``world_size`` processes through a library.

    Constructed as ``Engine(store, rank, world_size, timeout, group_ranks)`` by ``init_process_group``
    and ``new_group`` (``store`` is private to this group: a :class:`~kiln.distributed.PrefixStore`;
    ``group_ranks`` lists the global ranks of the members in group order, ``None`` for the whole world);
    ranks in calls are local to the group. Every collective returns a :class:`Work` and may run asynchronously; the
    process group waits on it (or hands it to the caller with ``async_op=True``).

    Subclasses implement the primitives they have; the defaults below build ``reduce_scatter`` and
    ``alltoall`` from the others, and raise ``NotImplementedError`` (naming the engine) for the rest.
    """

    #: The name users pass to ``init_process_group(backend=...)``.
    name: str = "engine"
    #: Device types this engine moves tensors of.
    devices: tuple[str, ...] = ("cpu",)
    #: The reductions the engine performs itself; the process group builds ``AVG`` from ``SUM``.
    reduce_ops: frozenset[ReduceOp] = frozenset({ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX})

    def __init__(
        self, store, rank: int, world_size: int, timeout: datetime.timedelta, group_ranks: list[int] | None = None
    ) -> None:
        self.store, self.rank, self.world_size, self.timeout = store, rank, world_size, timeout
        self.group_ranks = list(range(world_size)) if group_ranks is None else list(group_ranks)

    @classmethod
    def is_available(cls) -> bool:
        """Whether the library behind this engine can be loaded on this machine."""
        return True

    def _missing(self, what: str) -> NotImplementedError:
        return NotImplementedError(f"the {self.name} backend does not implement {what}")

    def allreduce(self, tensor, op: ReduceOp) -> Work:
        """Reduce ``tensor`` across ranks, every rank receiving the result in place."""
        raise self._missing("allreduce")

    def broadcast(self, tensor, src: int) -> Work:
        """Copy ``tensor`` of rank ``src`` into ``tensor`` on every rank."""
        raise self._missing("broadcast")

    def reduce(self, tensor, dst: int, op: ReduceOp) -> Work:
        """Reduce ``tensor`` across ranks into ``tensor`` on rank ``dst``."""
        raise self._missing("reduce")

    def allgather(self, outputs: list, tensor) -> Work:
        """``outputs[i]`` receives rank ``i``'s ``tensor``, on every rank."""
        raise self._missing("allgather")

    def gather(self, outputs: list | None, tensor, dst: int) -> Work:
        """On rank ``dst``, ``outputs[i]`` receives rank ``i``'s ``tensor`` (``outputs`` is None elsewhere)."""
        raise self._missing("gather")

    def scatter(self, output, inputs: list | None, src: int) -> Work:
        """Rank ``i``'s ``output`` receives ``inputs[i]`` of rank ``src``."""
        raise self._missing("scatter")

    def reduce_scatter(self, output, inputs: list, op: ReduceOp) -> Work:
        """Rank ``i``'s ``output`` receives the reduction of every rank's ``inputs[i]``.

        Default: one allreduce per chunk, in place on a copy; engines with a native form override it."""
        works = []
        copies = [t.clone() for t in inputs]
        for c in copies:
            works.append(self.allreduce(c, op))
        for w in works:
            w.wait()
        output.copy_(copies[self.rank])
        return CompletedWork([output])

    def alltoall(self, outputs: list, inputs: list) -> Work:
        """Rank ``i``'s ``outputs[j]`` receives rank ``j``'s ``inputs[i]``.

        Default: pairwise sends and receives; engines with a native form override it."""
        outputs[self.rank].copy_(inputs[self.rank])
        works = []
        for step in range(1, self.world_size):
            to, frm = (self.rank + step) % self.world_size, (self.rank - step) % self.world_size
            works.append(self.send(inputs[to], to, tag=-1 - step))
            works.append(self.recv(outputs[frm], frm, tag=-1 - step))
        for w in works:
            w.wait()
        return CompletedWork(list(outputs))

    def send(self, tensor, dst: int, tag: int) -> Work:
        """Send ``tensor`` to rank ``dst``."""
        raise self._missing("send")

    def recv(self, tensor, src: int | None, tag: int) -> Work:
        """Receive into ``tensor`` from rank ``src`` (``None``: any rank; the work's ``source_rank()``)."""
        raise self._missing("recv")

    def barrier(self) -> Work:
        """Complete once every rank has entered the barrier."""
        raise self._missing("barrier")

    def shutdown(self) -> None:
        """Release the engine's connections (``destroy_process_group``)."""
