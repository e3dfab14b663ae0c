"""The ``mpi`` backend: :class:`MPIEngine`, a process-group engine on MPI through mpi4py.

Processes are started by ``mpiexec`` (or any MPI launcher); MPI decides their ranks, and
``init_process_group("mpi")`` takes rank and world size from MPI when it is not told them. MPI itself is
initialised when the first engine is made (``MPI_Init_thread`` asking for ``MPI_THREAD_MULTIPLE``, since a
process group may be waited on from other threads, as DistributedDataParallel's gradient hooks do), and
finalised by mpi4py when Python exits.

Every operation is nonblocking MPI (``MPI_Iallreduce``, ``MPI_Ibcast``, ``MPI_Isend`` ...) on the
tensors' memory; the :class:`MPIWork` it returns polls the request with a deadline, so a peer that died or
never joined raises :class:`~kiln.distributed.errors.DistBackendError` instead of hanging the rank.
MPI has no float16 or bfloat16 reductions: those reduce through a float32 copy that is rounded back when
the work completes. Booleans reduce as bytes with PyTorch's meaning (``SUM``/``MAX``/``BOR`` are a logical
or, ``PRODUCT``/``MIN``/``BAND`` a logical and, ``BXOR`` an exclusive or).

Nothing here imports mpi4py at import time: the plugin imports this module to register the engine.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
import threading
import time
import zlib
from typing import Any

import numpy as np

from kiln.distributed.engine import Engine, ReduceOp, Work
from kiln.distributed.errors import DistBackendError

__all__ = ["MPIEngine", "MPIWork", "world_rank_and_size"]

# p2p tag on MPI_COMM_WORLD for the handshake that precedes creating a sub-group's communicator
# (users' messages travel on each engine's own communicator, so they never meet it).
_SETUP_TAG = 32123
# how long a wait tests its requests back to back before it starts sleeping between tests
_SPIN_SECONDS = 0.005

_init_lock = threading.Lock()
_MPI: Any = None
# MPI calls are serialised through this lock when MPI runs below MPI_THREAD_MULTIPLE.
_guard: Any = contextlib.nullcontext()
# buffers of handshake sends that never completed (a timed-out setup): MPI may still read them.
_abandoned: list = []


def _import_mpi():
    """``mpi4py.MPI``, imported without initialising MPI when this module is the first to import it."""
    if "mpi4py.MPI" in sys.modules:
        return sys.modules["mpi4py.MPI"]
    import mpi4py

    rc = mpi4py.rc
    initialize, finalize = rc.initialize, rc.finalize
    if initialize:
        # initialise later, when a process group is made, but let mpi4py finalise at exit as it would
        rc.initialize = False
        if finalize is None:
            rc.finalize = True
    try:
        from mpi4py import MPI
    finally:
        rc.initialize, rc.finalize = initialize, finalize
    return MPI


def _mpi():
    """``mpi4py.MPI`` with MPI initialised (thread level ``MULTIPLE`` when the library has it)."""
    global _MPI, _guard
    if _MPI is not None:
        return _MPI
    with _init_lock:
        if _MPI is not None:
            return _MPI
        MPI = _import_mpi()
        if MPI.Is_finalized():
            raise DistBackendError("mpi backend: MPI was already finalized in this process")
        if not MPI.Is_initialized():
            MPI.Init_thread(MPI.THREAD_MULTIPLE)
        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            _guard = threading.RLock()
        _MPI = MPI
    return MPI


def world_rank_and_size() -> tuple[int, int]:
    """This process's rank in ``MPI_COMM_WORLD`` and that world's size (initialises MPI).

    What ``init_process_group("mpi")`` uses when it is not given ``rank`` and ``world_size``."""
    MPI = _mpi()
    with _guard:
        return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def _seconds(timeout) -> float | None:
    """A timeout as seconds; ``None`` for no deadline."""
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return float(timeout)


_yield = getattr(os, "sched_yield", lambda: time.sleep(0))


def _poll(test, deadline: float | None) -> bool:
    """Call ``test()`` until it returns true (``True``) or ``deadline`` passes (``False``).

    MPI advances a nonblocking operation only inside MPI calls, so the first milliseconds test
    back to back (yielding the core between tests); after that the tests are 50-200 µs apart, which
    keeps a long wait cheap while large transfers still make steady progress."""
    if test():
        return True
    start = time.monotonic()
    spin_until = start + _SPIN_SECONDS
    pause = 5e-5
    while True:
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            return test()
        if now < spin_until:
            _yield()
        else:
            time.sleep(pause)
            pause = min(pause * 2, 2e-4)
        if test():
            return True


def _flat(t) -> np.ndarray:
    """The tensor's memory as a flat, writable NumPy view."""
    a = t.detach().numpy()  # the same memory; a tensor that requires grad is moved like any other
    if not a.flags.c_contiguous:
        raise ValueError("the mpi backend takes contiguous tensors")
    return a.reshape(-1)


def _bytes(a: np.ndarray) -> np.ndarray:
    """A flat array's bytes (zero-copy)."""
    return a.view(np.uint8)


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


_REDUCE_TYPES = {
    "float32": "FLOAT",
    "float64": "DOUBLE",
    "int8": "INT8_T",
    "int16": "INT16_T",
    "int32": "INT32_T",
    "int64": "INT64_T",
    "uint8": "UINT8_T",
    "uint16": "UINT16_T",
    "uint32": "UINT32_T",
    "uint64": "UINT64_T",
}
_HALF = ("float16", "bfloat16")
_OPS = {
    ReduceOp.SUM: "SUM",
    ReduceOp.PRODUCT: "PROD",
    ReduceOp.MIN: "MIN",
    ReduceOp.MAX: "MAX",
    ReduceOp.BAND: "BAND",
    ReduceOp.BOR: "BOR",
    ReduceOp.BXOR: "BXOR",
}
# on bytes holding 0 or 1, PyTorch's boolean reductions
_BOOL_OPS = {
    ReduceOp.SUM: "BOR",
    ReduceOp.PRODUCT: "BAND",
    ReduceOp.MIN: "BAND",
    ReduceOp.MAX: "BOR",
    ReduceOp.BAND: "BAND",
    ReduceOp.BOR: "BOR",
    ReduceOp.BXOR: "BXOR",
}
_BITWISE = (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR)


class MPIWork(Work):
    """An MPI operation in flight: its request(s), and the copies back into tensors its completion needs.

    :meth:`wait` polls the requests until they complete or the timeout passes (the engine's timeout
    unless one is given), then runs the copy-backs; a timeout raises
    :class:`~kiln.distributed.errors.DistBackendError` naming the operation and marks the work failed.
    """

    def __init__(
        self,
        engine: MPIEngine,
        op_name: str,
        requests: list,
        outputs: list,
        finish=None,
        keep: tuple = (),
        status: Any = None,
    ) -> None:
        self._engine = engine
        self._op = op_name
        self._requests = requests
        self._outputs = outputs
        self._finish = finish
        self._keep = keep  # buffers MPI reads or writes until the requests complete
        self._status = status
        self._done = False
        self._error: BaseException | None = None
        self._lock = threading.Lock()

    def _test(self) -> bool:
        """Test the requests once; on completion run the copy-backs. Whether the work is finished."""
        with self._lock:
            if self._done:
                return True
            MPI = _MPI
            try:
                with _guard:
                    if self._status is not None:
                        done = MPI.Request.Testall(self._requests, [self._status])
                    else:
                        done = MPI.Request.Testall(self._requests)
            except MPI.Exception as e:
                self._fail(DistBackendError(f"mpi backend: {self._op} failed on {self._where()}: {e}"))
                return True
            if not done:
                return False
            if self._finish is not None:
                try:
                    self._finish()
                except (ValueError, TypeError, RuntimeError) as e:
                    self._fail(DistBackendError(f"mpi backend: {self._op} failed on {self._where()}: {e}"))
                    return True
            self._done = True
            self._keep = ()
            self._finish = None
            return True

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._done = True

    def _where(self) -> str:
        return f"rank {self._engine.rank} of {self._engine.world_size}"

    def wait(self, timeout: datetime.timedelta | float | None = None) -> bool:
        """Block until the operation finished (or ``timeout`` passed: ``DistBackendError``). Returns ``True``.

        ``timeout`` is a ``timedelta`` or seconds; ``None`` or zero means the process group's timeout."""
        seconds = _seconds(timeout)
        if not seconds:
            seconds = _seconds(self._engine.timeout)
        deadline = None if not seconds else time.monotonic() + seconds
        if not _poll(self._test, deadline):
            with self._lock:
                if not self._done:
                    self._fail(
                        DistBackendError(
                            f"mpi backend: {self._op} timed out after {seconds:g} s on {self._where()}: "
                            "a peer process may have died, hung, or not called the same operation"
                        )
                    )
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        """Whether the operation finished (successfully, with an error, or by timing out)."""
        return self._test()

    def source_rank(self) -> int:
        """For a receive from any source: the group rank the message came from (waits for it)."""
        if self._status is None:
            return super().source_rank()
        self.wait()
        return self._status.Get_source()


class MPIEngine(Engine):
    """A process group's engine on MPI (``init_process_group("mpi")``), through mpi4py.

    The whole world is a duplicate of ``MPI_COMM_WORLD``; a group (``group_ranks``) is a communicator
    of those ranks made with ``MPI_Comm_create_group``, so only its members take part. Ranks must be
    MPI's: a ``rank`` or ``world_size`` that disagrees with the MPI world raises ``DistBackendError`` on
    every rank. Collectives and point-to-point operations are nonblocking MPI calls on the tensors'
    memory; see :class:`MPIWork`.
    """

    name = "mpi"
    devices = ("cpu",)
    reduce_ops = frozenset(_OPS)

    def __init__(
        self, store, rank: int, world_size: int, timeout: datetime.timedelta, group_ranks: list[int] | None = None
    ) -> None:
        super().__init__(store, rank, world_size, timeout, group_ranks)
        self._explicit_group = group_ranks is not None
        self._comm = None
        self._inflight: list[MPIWork] = []
        self._inflight_lock = threading.Lock()
        self._prune_at = 64
        MPI = self._MPI = _mpi()
        seconds = _seconds(timeout)
        deadline = None if not seconds else time.monotonic() + seconds
        if group_ranks is None:
            self._comm = self._world_comm(MPI, deadline)
        else:
            self._comm = self._group_comm(MPI, list(group_ranks), deadline)
        with _guard:
            self._tag_ub = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB) or 32767
            comm_rank, comm_size = self._comm.Get_rank(), self._comm.Get_size()
        if comm_rank != rank or comm_size != world_size:  # the handshakes make this unreachable
            self.shutdown()
            raise DistBackendError(
                f"mpi backend: this process is rank {comm_rank} of {comm_size} in the MPI communicator, "
                f"but was told rank {rank} of {world_size}"
            )

    @classmethod
    def is_available(cls) -> bool:
        """Whether mpi4py and an MPI library load here (``import mpi4py.MPI``; MPI is not initialised)."""
        try:
            _import_mpi()
        except (ImportError, OSError, RuntimeError):
            return False
        return True

    @classmethod
    def world(cls) -> tuple[int, int]:
        """This process's rank in ``MPI_COMM_WORLD`` and its size (initialises MPI): what
        ``init_process_group("mpi")`` uses when it is not told them."""
        return world_rank_and_size()

    # ------------------------------------------------------------------ setup

    def _wait_setup(self, requests: list, deadline: float | None) -> bool:
        """Poll setup requests until they complete (``True``) or the deadline passes."""
        MPI = self._MPI

        def test():
            with _guard:
                return MPI.Request.Testall(requests)

        return _poll(test, deadline)

    def _world_comm(self, MPI, deadline: float | None):
        """A duplicate of MPI_COMM_WORLD, after every process checked that it agrees with MPI's ranks."""
        with _guard:
            comm, req = MPI.COMM_WORLD.Idup()
            mpi_rank, mpi_size = comm.Get_rank(), comm.Get_size()
        if not self._wait_setup([req], deadline):
            raise DistBackendError(
                f"mpi backend: timed out after {_seconds(self.timeout):g} s waiting for the {mpi_size} MPI "
                f"processes to create the process group (this is MPI rank {mpi_rank})"
            )
        mine = np.array([self.rank, self.world_size, mpi_rank, mpi_size], dtype=np.int64)
        claims = np.empty((mpi_size, 4), dtype=np.int64)
        with _guard:
            req = comm.Iallgather([mine, MPI.INT64_T], [claims, MPI.INT64_T])
        if not self._wait_setup([req], deadline):
            raise DistBackendError(
                f"mpi backend: timed out after {_seconds(self.timeout):g} s exchanging ranks while creating "
                f"the process group (this is MPI rank {mpi_rank})"
            )
        bad = [row for row in claims.tolist() if row[0] != row[2] or row[1] != row[3]]
        if bad:
            with _guard:
                comm.Free()
            told = ", ".join(f"MPI rank {r[2]} was told rank {r[0]} of {r[1]}" for r in bad)
            raise DistBackendError(
                f"mpi backend: the ranks given to init_process_group disagree with MPI's world of {mpi_size} "
                f"processes ({told}). With the mpi backend, ranks come from the MPI launcher: leave RANK and "
                "WORLD_SIZE unset or make them match it"
            )
        return comm

    def _group_comm(self, MPI, group_ranks: list[int], deadline: float | None):
        """A communicator of ``group_ranks`` (MPI world ranks), made by its members only."""
        with _guard:
            world = MPI.COMM_WORLD
            me, world_size = world.Get_rank(), world.Get_size()
        if len(set(group_ranks)) != len(group_ranks) or any(not 0 <= r < world_size for r in group_ranks):
            raise DistBackendError(
                f"mpi backend: group ranks {group_ranks} are not distinct ranks of the MPI world of {world_size}"
            )
        if me not in group_ranks:
            raise DistBackendError(
                f"mpi backend: MPI rank {me} is not a member of the group {group_ranks} it was asked to join"
            )
        digest = zlib.crc32(np.asarray(group_ranks, dtype=np.int64).tobytes())
        mine = np.array([self.rank, self.world_size, me, digest], dtype=np.int64)
        peers = [r for r in group_ranks if r != me]
        theirs = np.zeros((len(peers), 4), dtype=np.int64)
        with _guard:
            sends = [world.Isend([mine, MPI.INT64_T], r, _SETUP_TAG) for r in peers]
            recvs = [world.Irecv([theirs[i], MPI.INT64_T], r, _SETUP_TAG) for i, r in enumerate(peers)]
        if not self._wait_setup(sends + recvs, deadline):
            with _guard:
                missing = [peers[i] for i, q in enumerate(recvs) if not q.Test()]
                for q in recvs:
                    if q:
                        q.Cancel()
            _abandoned.append((mine, theirs, sends, recvs))
            raise DistBackendError(
                f"mpi backend: timed out after {_seconds(self.timeout):g} s waiting for MPI ranks {missing} "
                f"to create the group {group_ranks} (this is MPI rank {me})"
            )
        rows = [[self.rank, self.world_size, me, digest]] + theirs.tolist()
        n = len(group_ranks)
        bad = [r for r in rows if r[3] != digest or r[1] != n or not 0 <= r[0] < n or group_ranks[r[0]] != r[2]]
        if bad:
            told = ", ".join(f"MPI rank {r[2]} was told group rank {r[0]} of {r[1]}" for r in bad)
            raise DistBackendError(
                f"mpi backend: the members of group {group_ranks} disagree on it or on their ranks ({told}); "
                "group ranks must follow the order of the group's MPI ranks"
            )
        with _guard:
            wgroup = world.Get_group()
            sub = wgroup.Incl(group_ranks)
            try:
                comm = world.Create_group(sub)
            finally:
                sub.Free()
                wgroup.Free()
        return comm

    # ------------------------------------------------------------------ helpers

    def _work(self, op_name: str, requests: list, outputs: list, finish=None, keep=(), status=None) -> MPIWork:
        work = MPIWork(self, op_name, requests, outputs, finish, keep, status)
        with self._inflight_lock:
            self._inflight.append(work)
            if len(self._inflight) >= self._prune_at:
                # works nobody waits on (an isend's, say) hold their buffers until they complete
                self._inflight = [w for w in self._inflight if not w._test()]
                self._prune_at = max(64, 2 * len(self._inflight))
        return work

    def _comm_or_raise(self):
        if self._comm is None:
            raise DistBackendError("mpi backend: the process group was shut down")
        return self._comm

    def _reduce_plan(self, a: np.ndarray, op: ReduceOp):
        """(buffer to reduce, MPI datatype, MPI op, whether the buffer is a copy to write back)."""
        MPI = self._MPI
        name = a.dtype.name
        if op not in _OPS:
            raise ValueError(f"the mpi backend does not support ReduceOp.{op.name}")
        if name == "bool":
            return a.view(np.uint8), MPI.UINT8_T, getattr(MPI, _BOOL_OPS[op]), False
        if op in _BITWISE and a.dtype.kind not in "iu":
            raise RuntimeError(f"Cannot use ReduceOp.{op.name} with non-integral dtype")
        if name in _HALF:
            return a.astype(np.float32), MPI.FLOAT, getattr(MPI, _OPS[op]), True
        if name not in _REDUCE_TYPES:
            raise TypeError(f"the mpi backend cannot reduce tensors of dtype {name}")
        return a, getattr(MPI, _REDUCE_TYPES[name]), getattr(MPI, _OPS[op]), False

    def _joined(self, arrays: list[np.ndarray]):
        """The arrays' bytes as one flat uint8 array: a view when they lie end to end in order, else None."""
        if not arrays:
            return None
        n = arrays[0].nbytes
        base = _addr(arrays[0])
        if any(a.nbytes != n or _addr(a) != base + i * n or not a.flags.writeable for i, a in enumerate(arrays)):
            return None
        if n == 0:
            return None
        return np.frombuffer(self._MPI.buffer.fromaddress(base, n * len(arrays)), dtype=np.uint8)

    @staticmethod
    def _overlaps(a: np.ndarray, b: np.ndarray) -> bool:
        if a.nbytes == 0 or b.nbytes == 0:
            return False
        pa, pb = _addr(a), _addr(b)
        return pa < pb + b.nbytes and pb < pa + a.nbytes

    def _check_rank(self, r: int, what: str) -> None:
        if not 0 <= r < self.world_size:
            raise ValueError(f"mpi backend: {what} rank {r} is not a rank of this group of {self.world_size}")

    def _tag(self, tag: int) -> int:
        """Kiln's tag (any int) as a non-negative MPI tag: 0, -1, 1, -2, ... -> 0, 1, 2, 3, ..."""
        t = 2 * tag if tag >= 0 else -2 * tag - 1
        if t > self._tag_ub:
            raise ValueError(f"mpi backend: tag {tag} is out of MPI's tag range")
        return t

    # ------------------------------------------------------------------ collectives

    def allreduce(self, tensor, op: ReduceOp) -> Work:
        """Reduce ``tensor`` across the group in place (``MPI_Iallreduce``)."""
        comm = self._comm_or_raise()
        a = _flat(tensor)
        buf, dtype, mop, copied = self._reduce_plan(a, op)
        with _guard:
            req = comm.Iallreduce(self._MPI.IN_PLACE, [buf, dtype], mop)
        finish = (lambda: np.copyto(a, buf.astype(a.dtype))) if copied else None
        return self._work("allreduce", [req], [tensor], finish, (a, buf))

    def broadcast(self, tensor, src: int) -> Work:
        """Copy rank ``src``'s ``tensor`` into every rank's (``MPI_Ibcast``)."""
        self._check_rank(src, "broadcast source")
        comm = self._comm_or_raise()
        a = _bytes(_flat(tensor))
        with _guard:
            req = comm.Ibcast([a, self._MPI.BYTE], root=src)
        return self._work("broadcast", [req], [tensor], keep=(a,))

    def reduce(self, tensor, dst: int, op: ReduceOp) -> Work:
        """Reduce ``tensor`` into rank ``dst``'s (``MPI_Ireduce``); other ranks' tensors are left as they are."""
        self._check_rank(dst, "reduce destination")
        comm = self._comm_or_raise()
        a = _flat(tensor)
        buf, dtype, mop, copied = self._reduce_plan(a, op)
        root = self.rank == dst
        with _guard:
            if root:
                req = comm.Ireduce(self._MPI.IN_PLACE, [buf, dtype], mop, root=dst)
            else:
                req = comm.Ireduce([buf, dtype], None, mop, root=dst)
        finish = (lambda: np.copyto(a, buf.astype(a.dtype))) if copied and root else None
        return self._work("reduce", [req], [tensor], finish, (a, buf))

    def _gather_target(self, op: str, a: np.ndarray, outputs: list):
        """Where a gather of ``a`` (this rank's bytes) into ``outputs`` lands: the outputs' bytes, one flat
        receive buffer (the outputs themselves when they lie end to end, else a buffer copied out by
        ``finish`` on completion) and what to send (``a``, ``MPI.IN_PLACE`` when ``a`` is this rank's
        piece of the buffer, or ``[copy, BYTE]`` when it overlaps another piece)."""
        outs = [_bytes(_flat(t)) for t in outputs]
        if len(outs) != self.world_size or any(o.nbytes != a.nbytes for o in outs):
            raise ValueError(f"mpi backend: {op} needs world_size outputs of the input's size")
        joined = self._joined(outs)
        finish = None
        send: Any = a
        if joined is None:
            joined = np.empty(a.nbytes * self.world_size, dtype=np.uint8)

            def finish():
                for i, o in enumerate(outs):
                    np.copyto(o, joined[i * a.nbytes : (i + 1) * a.nbytes])

        elif self._overlaps(a, joined):
            send = self._MPI.IN_PLACE if _addr(a) == _addr(outs[self.rank]) else [a.copy(), self._MPI.BYTE]
        return outs, joined, finish, send

    def allgather(self, outputs: list, tensor) -> Work:
        """``outputs[i]`` receives rank ``i``'s ``tensor`` (``MPI_Iallgather``; straight into ``outputs`` when
        they lie end to end in one buffer, else through one buffer copied out on completion)."""
        comm = self._comm_or_raise()
        MPI = self._MPI
        a = _bytes(_flat(tensor))
        outs, joined, finish, send = self._gather_target("allgather", a, outputs)
        if send is not MPI.IN_PLACE and send is not a:
            send = send[0]
        with _guard:
            req = comm.Iallgather(send if send is MPI.IN_PLACE else [send, MPI.BYTE], [joined, MPI.BYTE])
        return self._work("allgather", [req], list(outputs), finish, (a, send, joined, outs))

    def gather(self, outputs: list | None, tensor, dst: int) -> Work:
        """On rank ``dst``, ``outputs[i]`` receives rank ``i``'s ``tensor`` (``MPI_Igather``)."""
        self._check_rank(dst, "gather destination")
        comm = self._comm_or_raise()
        MPI = self._MPI
        a = _bytes(_flat(tensor))
        if self.rank != dst:
            with _guard:
                req = comm.Igather([a, MPI.BYTE], None, root=dst)
            return self._work("gather", [req], [], keep=(a,))
        if outputs is None:
            raise ValueError("mpi backend: gather needs outputs on the destination rank")
        outs, joined, finish, send = self._gather_target("gather", a, outputs)
        if send is a:
            send = [a, MPI.BYTE]
        with _guard:
            req = comm.Igather(send, [joined, MPI.BYTE], root=dst)
        return self._work("gather", [req], list(outputs), finish, (a, send, joined, outs))

    def scatter(self, output, inputs: list | None, src: int) -> Work:
        """Rank ``i``'s ``output`` receives ``inputs[i]`` of rank ``src`` (``MPI_Iscatter``)."""
        self._check_rank(src, "scatter source")
        comm = self._comm_or_raise()
        MPI = self._MPI
        out = _bytes(_flat(output))
        if self.rank != src:
            with _guard:
                req = comm.Iscatter(None, [out, MPI.BYTE], root=src)
            return self._work("scatter", [req], [output], keep=(out,))
        if inputs is None:
            raise ValueError("mpi backend: scatter needs inputs on the source rank")
        ins = [_bytes(_flat(t)) for t in inputs]
        if len(ins) != self.world_size or any(i.nbytes != out.nbytes for i in ins):
            raise ValueError("mpi backend: scatter needs world_size inputs of the output's size")
        joined = self._joined(ins)
        recv: Any = [out, MPI.BYTE]
        if joined is None:
            joined = np.concatenate(ins) if ins else np.empty(0, np.uint8)
        elif self._overlaps(out, joined):
            if _addr(out) == _addr(ins[self.rank]):
                recv = MPI.IN_PLACE
            else:
                joined = joined.copy()
        with _guard:
            req = comm.Iscatter([joined, MPI.BYTE], recv, root=src)
        return self._work("scatter", [req], [output], keep=(out, joined, ins))

    def reduce_scatter(self, output, inputs: list, op: ReduceOp) -> Work:
        """Rank ``i``'s ``output`` receives the reduction of every rank's ``inputs[i]``
        (``MPI_Ireduce_scatter_block``, or ``MPI_Ireduce_scatter`` for chunks of different sizes)."""
        comm = self._comm_or_raise()
        out = _flat(output)
        ins = [_flat(t) for t in inputs]
        if len(ins) != self.world_size or ins[self.rank].size != out.size:
            raise ValueError("mpi backend: reduce_scatter needs world_size inputs, this rank's of the output's size")
        counts = [i.size for i in ins]
        # one send buffer in rank order (a copy: MPI may not read it where it writes the output)
        send, dtype, mop, _ = self._reduce_plan(np.concatenate(ins), op)
        recv, _, _, copied = self._reduce_plan(out, op)
        with _guard:
            if len(set(counts)) == 1:
                req = comm.Ireduce_scatter_block([send, dtype], [recv, dtype], mop)
            else:
                req = comm.Ireduce_scatter([send, dtype], [recv, dtype], counts, mop)
        finish = (lambda: np.copyto(out, recv.astype(out.dtype))) if copied else None
        return self._work("reduce_scatter", [req], [output], finish, (send, recv, out))

    def alltoall(self, outputs: list, inputs: list) -> Work:
        """Rank ``i``'s ``outputs[j]`` receives rank ``j``'s ``inputs[i]`` (``MPI_Ialltoallv`` on bytes, so
        chunks may differ in size)."""
        comm = self._comm_or_raise()
        MPI = self._MPI
        outs = [_bytes(_flat(t)) for t in outputs]
        ins = [_bytes(_flat(t)) for t in inputs]
        if len(outs) != self.world_size or len(ins) != self.world_size:
            raise ValueError("mpi backend: alltoall needs world_size inputs and outputs")
        scounts = [i.nbytes for i in ins]
        rcounts = [o.nbytes for o in outs]
        sdispls = np.cumsum([0] + scounts[:-1]).tolist()
        rdispls = np.cumsum([0] + rcounts[:-1]).tolist()
        rjoined = self._joined(outs) if len(set(rcounts)) == 1 else None
        finish = None
        if rjoined is None:
            rjoined = np.empty(sum(rcounts), dtype=np.uint8)

            def finish():
                for o, d, n in zip(outs, rdispls, rcounts, strict=True):
                    np.copyto(o, rjoined[d : d + n])

        sjoined = self._joined(ins) if len(set(scounts)) == 1 else None
        if sjoined is None or self._overlaps(sjoined, rjoined):
            sjoined = np.concatenate(ins) if ins else np.empty(0, np.uint8)
        with _guard:
            req = comm.Ialltoallv([sjoined, (scounts, sdispls), MPI.BYTE], [rjoined, (rcounts, rdispls), MPI.BYTE])
        return self._work("alltoall", [req], list(outputs), finish, (sjoined, rjoined, outs, ins))

    # ------------------------------------------------------------------ point to point

    def send(self, tensor, dst: int, tag: int) -> Work:
        """Send ``tensor`` to rank ``dst`` (``MPI_Isend``)."""
        self._check_rank(dst, "send destination")
        comm = self._comm_or_raise()
        a = _bytes(_flat(tensor))
        with _guard:
            req = comm.Isend([a, self._MPI.BYTE], dst, self._tag(tag))
        return self._work("send", [req], [tensor], keep=(a,))

    def recv(self, tensor, src: int | None, tag: int) -> Work:
        """Receive into ``tensor`` from rank ``src`` (``MPI_Irecv``; ``None``: any rank, see ``source_rank()``)."""
        comm = self._comm_or_raise()
        MPI = self._MPI
        a = _bytes(_flat(tensor))
        if src is None:
            with _guard:
                status = MPI.Status()
                req = comm.Irecv([a, MPI.BYTE], MPI.ANY_SOURCE, self._tag(tag))
            return self._work("recv", [req], [tensor], keep=(a,), status=status)
        self._check_rank(src, "recv source")
        with _guard:
            req = comm.Irecv([a, MPI.BYTE], src, self._tag(tag))
        return self._work("recv", [req], [tensor], keep=(a,))

    def barrier(self) -> Work:
        """Complete once every rank of the group has entered it (``MPI_Ibarrier``)."""
        comm = self._comm_or_raise()
        with _guard:
            req = comm.Ibarrier()
        return self._work("barrier", [req], [])

    def shutdown(self) -> None:
        """Free the communicator (MPI itself is finalised by mpi4py at exit)."""
        comm, self._comm = self._comm, None
        if comm is None:
            return
        MPI = self._MPI
        with _guard:
            if not MPI.Is_finalized() and comm != MPI.COMM_NULL:
                comm.Free()
