"""How every collective runs: PyTorch's argument checks, the fingerprint check across ranks, the work
the caller waits on, and the diagnosis of a failure (a dead rank, ranks that never arrived, ranks that
disagreed)."""

from __future__ import annotations

import contextlib
import datetime
import json
import time
import warnings
import zlib
from collections.abc import Sequence
from typing import Any

import kiln
from kiln.distributed._groups import (
    DebugLevel,
    GroupMember,
    ProcessGroup,
    _group,
    _state,
    _unchecked,
    get_debug_level,
    get_rank,
)
from kiln.distributed.engine import Engine, ReduceOp, Work
from kiln.distributed.errors import DistBackendError, DistError, DistNetworkError, DistStoreError

# ------------------------------------------------------------------------------------------------
# Argument checks (PyTorch's errors)


def _check_tensor(t: Any, name: str) -> None:
    if not isinstance(t, kiln.Tensor):
        raise TypeError(
            f"Invalid function argument. Expected parameter `{name}` of type kiln.Tensor\n"
            f"             but got {type(t)} instead."
        )


def _check_tensor_list(ts: Any, name: str) -> None:
    if not isinstance(ts, list) or not all(isinstance(t, kiln.Tensor) for t in ts):
        raise TypeError(
            f"Invalid function argument. Expected parameter `{name}` of type List[kiln.Tensor]\n"
            f"             but got {type(ts)} instead."
        )


def _contiguous(ts: Sequence[Any]) -> None:
    for t in ts:
        if not t.is_contiguous():
            raise ValueError("Tensors must be contiguous")


def _same_device(ts: Sequence[Any]) -> str:
    devices = {t.device.type for t in ts}
    if len(devices) > 1:
        raise ValueError(f"Tensors must be on the same device type, got {sorted(devices)}")
    return devices.pop()


def _member(pg_arg: ProcessGroup | None, op: str) -> ProcessGroup | None:
    """The group, or ``None`` (with PyTorch's warning) when this rank is not in it."""
    if pg_arg is GroupMember.NON_GROUP_MEMBER:
        warnings.warn(
            f"Running {op} on global rank {get_rank()} which does not belong to the given group.", stacklevel=3
        )
        return None
    return _group(pg_arg)


def _group_rank(pg: ProcessGroup, global_rank: int, what: str) -> int:
    if global_rank not in pg._ranks:
        raise ValueError(f"Global rank {global_rank} is not part of group {pg}")
    return pg._ranks.index(global_rank)


def _reduce_op(op: Any) -> ReduceOp:
    if isinstance(op, ReduceOp):
        return op
    raise TypeError(f"Invalid reduce op {op!r}: expected a kiln.distributed.ReduceOp")


# ------------------------------------------------------------------------------------------------
# Launching a collective: the consistency check, the engine call, and failure diagnosis

_OPS = [
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "gather",
    "scatter",
    "reduce_scatter",
    "all_to_all",
    "barrier",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "all_gather_object",
    "gather_object",
    "broadcast_object_list",
    "scatter_object_list",
]
_MAX_DIMS = 6
_FP = 5 + _MAX_DIMS  # op, root, dtype, numel, ndim, dims...


_DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64", "bool")


def _dtype_code(dtype) -> int:
    """A number for ``dtype`` that is the same in every process (what fingerprints carry)."""
    name = str(dtype).rsplit(".", 1)[-1]
    return _DTYPES.index(name) if name in _DTYPES else 100 + zlib.crc32(name.encode()) % 100000


def _dtype_name(code: int) -> str:
    """The dtype :func:`_dtype_code` numbered ``code``."""
    return _DTYPES[code] if 0 <= code < len(_DTYPES) else f"<dtype #{code}>"


def _signature(tensors: Sequence[Any]) -> list:
    return [[str(t.dtype).replace("kiln.", ""), list(t.shape)] for t in tensors]


def _describe(sig: list) -> str:
    return ", ".join(f"{d}{s}" for d, s in sig) or "no tensors"


def _fingerprint(op: str, root: int, t) -> list[int]:
    shape = list(t.shape) if t is not None else []
    dims = (shape + [-1] * _MAX_DIMS)[:_MAX_DIMS]
    if len(shape) > _MAX_DIMS:
        dims[-1] = zlib.crc32(repr(shape).encode())
    numel = t.numel() if t is not None else 0
    return [_OPS.index(op), root, _dtype_code(t.dtype) if t is not None else -1, numel, len(shape), *dims]


class _Fingerprints:
    """The gather of every rank's fingerprint of one call, in flight; :meth:`verify` waits for it and
    raises on every rank if the calls differ. A synchronous collective verifies before it starts; an
    asynchronous one starts it right behind the gather and verifies when waited on, so that it never
    blocks where PyTorch's would not (an ``isend`` between an ``async_op`` collective and its ``wait``)."""

    def __init__(self, pg: ProcessGroup, op: str, root: int, t, engine: Engine) -> None:
        self.pg, self.op, self.seq, self.tensors = pg, op, pg._seq, [t] if t is not None else []
        mine = kiln.tensor(_fingerprint(op, root, t), dtype=kiln.int64)
        self.gathered = [kiln.empty(_FP, dtype=kiln.int64) for _ in range(pg._size)]
        try:
            self.work = engine.allgather(self.gathered, mine)
        except (DistError, RuntimeError) as e:
            raise _diagnose(pg, op, self.seq, self.tensors, e) from e

    @staticmethod
    def start(pg: ProcessGroup, op: str, root: int, t, engine: Engine) -> _Fingerprints | None:
        """The check of this call, or ``None`` when checks are off (debug level OFF, inside DDP's
        buckets, or a group of one)."""
        if get_debug_level() is DebugLevel.OFF or getattr(_unchecked, "on", False) or pg._size == 1:
            return None
        return _Fingerprints(pg, op, root, t, engine)

    def verify(self) -> None:
        """Wait for every rank's fingerprint; raise ``DistBackendError`` if the calls differ."""
        pg, op, seq = self.pg, self.op, self.seq
        _wait(pg, op, seq, self.tensors, self.work, None)
        rows = [g.tolist() for g in self.gathered]
        # op, root, dtype and element count must agree; shapes may differ (Gloo moves bytes)
        if all(r[:4] == rows[0][:4] for r in rows):
            return

        def show(r: list[int]) -> str:
            name = _OPS[r[0]] if 0 <= r[0] < len(_OPS) else "?"
            shape = r[5 : 5 + min(r[4], _MAX_DIMS)]
            if r[2] < 0:
                return f"{name}()"
            return f"{name}({_dtype_name(r[2])}{shape})"

        calls = "; ".join(f"rank {pg._ranks[i]}: {show(r)}" for i, r in enumerate(rows))
        if len({r[0] for r in rows}) > 1:
            what = "Ranks called different collectives"
        elif len({r[1] for r in rows}) > 1:
            what = f"Ranks passed different roots to {op}"
        elif len({r[2] for r in rows}) > 1:
            what = f"Ranks passed tensors of different dtypes to {op}"
        else:
            what = f"Ranks passed tensors of different sizes to {op}"
        raise DistBackendError(f"{what} (call #{seq} of group {pg._name}): {calls}")


class _GroupWork(Work):
    """An engine's work, seen through the group: its fingerprints verified first (an asynchronous
    call's), a failure turned into a diagnosed ``DistBackendError``, and ``finish`` (copy-backs, the
    division of an average) run once it completes."""

    def __init__(
        self,
        pg: ProcessGroup,
        op: str,
        seq: int,
        tensors: list,
        work: Work,
        finish,
        outputs: list,
        fingerprints: _Fingerprints | None = None,
        peer: int | None = None,
    ):
        self._pg, self._op, self._seq, self._tensors, self._work = pg, op, seq, tensors, work
        self._finish, self._outputs, self._done = finish, outputs, False
        self._fingerprints, self._peer = fingerprints, peer

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        if not self._done:
            if self._fingerprints is not None:
                fingerprints, self._fingerprints = self._fingerprints, None
                fingerprints.verify()
            _wait(self._pg, self._op, self._seq, self._tensors, self._work, self._finish, timeout, self._peer)
            self._done = True
        return True

    def is_completed(self) -> bool:
        if self._done:
            return True
        if self._work.is_completed() and (self._fingerprints is None or self._fingerprints.work.is_completed()):
            with contextlib.suppress(Exception):  # finished either way; wait() raises the error again
                self.wait()
            return True
        return False

    def source_rank(self) -> int:
        return self._pg._ranks[self._work.source_rank()]


def _wait(pg, op, seq, tensors, work: Work, finish, timeout=None, peer: int | None = None) -> None:
    try:
        work.wait(timeout)
    except (DistError, RuntimeError, OSError) as e:
        raise _diagnose(pg, op, seq, tensors, e, peer) from e
    if finish is not None:
        finish()


def _diagnose(
    pg: ProcessGroup, op: str, seq: int, tensors: list, error: BaseException, peer: int | None = None
) -> DistBackendError:
    """Say why ``op`` failed on this rank: a dead rank, ranks that never reached it, or ranks that
    disagreed on it (for collective call ``seq`` of the group); for a send or receive (``peer``, a group
    rank), only whether the peer died. Reads what the store knows, with a short wait."""
    me = pg._ranks[pg._rank]
    if peer is not None:  # -1: a receive from any rank
        who = "any rank" if peer < 0 else f"rank {pg._ranks[peer]}"
        head = f"{op} (rank {me} {'to' if op == 'send' else 'from'} {who}) failed"
    else:
        head = f"{op} (call #{seq} of process group {pg._name}, rank {me} of {pg._size}) failed"
    if not _state.shared_store:  # nothing to ask: the engine's own error is all there is
        return DistBackendError(f"{head}: {error}")
    try:
        dead: list[int] = []
        deadline = time.monotonic() + 2.0
        while True:  # the store may notice a closed connection a moment after the peer did
            found = pg._store.dead_ranks()
            if found is None:
                break
            dead = [r for r in found if r in (pg._ranks if peer is None or peer < 0 else [pg._ranks[peer]])]
            if dead or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        if dead:
            who = ", ".join(str(r) for r in dead)
            return DistBackendError(
                f"{head}: rank {who} exited (its connection to the store closed) during or before the "
                f"operation. Engine error: {error}"
            )
        if peer is not None:  # point to point: no other rank takes part
            return DistBackendError(f"{head}: {error}")
        key = f"diag/{seq}/"
        sig = _signature(tensors)  # (made only here: a call that succeeds formats nothing)
        pg._store.set(key + str(me), json.dumps({"op": op, "sig": sig}))
        others, missing = {}, []
        wait_until = time.monotonic() + 3.0
        for r in pg._ranks:
            if r == me:
                continue
            left = max(0.05, wait_until - time.monotonic())
            try:
                pg._store.wait([key + str(r)], datetime.timedelta(seconds=left))
                others[r] = json.loads(pg._store.get(key + str(r)))
            except DistStoreError:
                missing.append(r)
        disagree = [r for r, d in others.items() if d != {"op": op, "sig": sig}]
        if disagree:
            calls = "; ".join(f"rank {r}: {others[r]['op']}({_describe(others[r]['sig'])})" for r in disagree)
            return DistBackendError(
                f"{head}: ranks disagree on this call. rank {me}: {op}({_describe(sig)}); {calls}. Engine error: {error}"
            )
        if missing:
            who = ", ".join(str(r) for r in missing)
            return DistBackendError(f"{head}: rank {who} did not reach this call. Engine error: {error}")
    except (DistNetworkError, DistStoreError, OSError) as e:
        return DistBackendError(f"{head}; the store is unreachable too ({e}). Engine error: {error}")
    return DistBackendError(f"{head}: {error}")


def _launch(
    pg: ProcessGroup,
    op: str,
    engine: Engine,
    call,
    tensors: Sequence[Any],
    async_op: bool,
    finish=None,
    check: tuple[int, Any] | None = None,
    outputs: list | None = None,
    peer: int | None = None,
):
    """Run a collective (or, with ``peer``, a send or receive): check, call the engine, then wait (or
    return the work with ``async_op``).

    Collectives number their calls (``pg._seq``, the same on every rank); point-to-point calls do not."""
    if peer is None:
        pg._seq += 1
    fingerprints = None if check is None else _Fingerprints.start(pg, op, check[0], check[1], engine)
    if fingerprints is not None and not async_op:
        fingerprints.verify()
        fingerprints = None
    seq = pg._seq
    try:
        work = call()
    except (DistError, RuntimeError) as e:
        if isinstance(e, NotImplementedError):
            raise
        raise _diagnose(pg, op, seq, tensors, e, peer) from e
    outs = outputs if outputs is not None else list(tensors)
    gw = _GroupWork(pg, op, seq, list(tensors), work, finish, outs, fingerprints, peer)
    if async_op:
        return gw
    gw.wait()
    return None


def _average(engine: Engine, op: ReduceOp, tensor, size: int):
    """The engine's op for ``op``, and what to run after it (AVG as SUM then division)."""
    if op is ReduceOp.AVG and ReduceOp.AVG not in engine.reduce_ops:
        if not (tensor.dtype.is_floating_point):
            raise ValueError(f"ReduceOp.AVG needs a floating point tensor, got {tensor.dtype}")

        def finish() -> None:
            with kiln.no_grad():
                tensor.div_(size)

        return ReduceOp.SUM, finish
    if op not in engine.reduce_ops:
        raise ValueError(f"Cannot use {op!r} with {engine.name}")
    return op, None


def _root(pg: ProcessGroup, global_rank: int | None, group_rank: int | None, name: str) -> int:
    if global_rank is not None and group_rank is not None:
        raise ValueError(f"Can not specify both {name} and group_{name}")
    if group_rank is not None:
        if not 0 <= group_rank < pg._size:
            raise ValueError(f"Group rank {group_rank} is not part of group {pg}")
        return group_rank
    if global_rank is None:
        raise ValueError(f"Must specify {name} or group_{name}")
    return _group_rank(pg, global_rank, name)


def _root_list(pg: ProcessGroup, root: int, tensors: list | None, op: str, name: str, role: str) -> list | None:
    """The root's list of tensors (one per rank, contiguous), checked; ``None`` on the other ranks,
    which must not pass one (PyTorch's errors)."""
    if pg._rank != root:
        if tensors:
            raise ValueError(f"Argument ``{name}`` must NOT be specified on non-{role} ranks.")
        return None
    if tensors is None:
        raise ValueError(f"Argument ``{name}`` must be specified on {role} rank.")
    _check_tensor_list(tensors, name)
    if len(tensors) != pg._size:
        raise ValueError(f"{op}: {name} has {len(tensors)} tensors, the group has {pg._size} ranks")
    _contiguous(tensors)
    return tensors
