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

from kiln.futures import Future

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
        """A :class:`kiln.futures.Future` completed with :meth:`result` when the operation finishes."""
        future = Future()

        def drive() -> None:
            try:
                value = self.result()
            except Exception as e:  # noqa: BLE001 - the future carries the error to whoever waits
                future.set_exception(e)
            else:
                future.set_result(value)

        future._driver, future._ready = drive, self.is_completed
        return future

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
        for step in range(1, self.world_size):  # every receive posted before any send: no engine blocks
            frm = (self.rank - step) % self.world_size
            works.append(self.recv(outputs[frm], frm, tag=-1 - step))
        for step in range(1, self.world_size):
            to = (self.rank + step) % self.world_size
            works.append(self.send(inputs[to], to, tag=-1 - step))
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
