"""Process groups and collectives: ``torch.distributed``'s API on kiln's engines.

A :class:`ProcessGroup` holds one engine per device type (``"cpu:gloo,cuda:nccl"``), a private store
and the global ranks of its members. Every collective here checks its arguments with PyTorch's errors,
then (unless the debug level is ``OFF``) checks that every rank of the group called the same collective
with the same shapes and dtypes, by gathering a small fingerprint first: Gloo, for one, returns wrong
results without any error when ranks pass tensors of different sizes. When an engine fails, the error
says what happened to whom: the rank that died (its connection to the store closed), the ranks that
never reached the call, or the ranks that disagreed on it.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import enum
import io
import json
import os
import threading
import time
import warnings
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

import kiln
from kiln.distributed import rendezvous as _rdzv
from kiln.distributed.engine import Engine, ReduceOp, Work
from kiln.distributed.errors import DistBackendError, DistError, DistNetworkError, DistStoreError
from kiln.distributed.store import PrefixStore, Store, default_timeout

__all__ = [
    "Backend",
    "DebugLevel",
    "GroupMember",
    "P2POp",
    "ProcessGroup",
    "ReduceOp",
    "Work",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "broadcast_object_list",
    "default_pg_timeout",
    "destroy_process_group",
    "gather",
    "gather_object",
    "get_backend",
    "get_debug_level",
    "get_global_rank",
    "get_group_rank",
    "get_node_local_rank",
    "get_process_group_ranks",
    "get_rank",
    "get_world_size",
    "group",
    "init_process_group",
    "irecv",
    "is_available",
    "is_backend_available",
    "is_gloo_available",
    "is_initialized",
    "is_mpi_available",
    "is_nccl_available",
    "is_torchelastic_launched",
    "isend",
    "monitored_barrier",
    "new_group",
    "new_subgroups",
    "recv",
    "recv_object_list",
    "reduce",
    "reduce_op",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "send",
    "send_object_list",
    "set_debug_level",
    "set_debug_level_from_env",
]

#: The default timeout of process groups (PyTorch's: 30 minutes).
default_pg_timeout = default_timeout

reduce_op = ReduceOp  # PyTorch's deprecated alias


# ------------------------------------------------------------------------------------------------
# Backends: names users pass, and the engines behind them


class Backend(str):
    """A backend name (``torch.distributed.Backend``): ``Backend("GLOO") == "gloo"``.

    :meth:`register_backend` adds an engine from code; plugins add theirs through the
    ``kiln_register_collectives`` hook.
    """

    UNDEFINED = "undefined"
    GLOO = "gloo"
    MPI = "mpi"
    NCCL = "nccl"
    default_device_backend_map: dict[str, str] = {"cpu": "gloo", "cuda": "nccl"}
    _registered: dict[str, type[Engine]] = {}

    def __new__(cls, name: str) -> Backend:
        if not isinstance(name, str):
            raise ValueError(f"Backend constructor parameter must be string-ish, got {type(name)}")
        value = name.lower()
        if value != cls.UNDEFINED and ":" not in value and value not in _engine_classes():
            raise ValueError(f"Invalid backend: '{name}'")
        return super().__new__(cls, value)

    @classmethod
    def register_backend(
        cls, name: str, func: type[Engine], extended_api: bool = False, devices: str | list[str] | None = None
    ) -> None:
        """Register an engine class under ``name`` (``devices`` overrides the class's ``devices``)."""
        key = name.lower()
        if key in _engine_classes():
            raise ValueError(f"{name} backend already exists")
        if devices is not None:
            devices = (devices,) if isinstance(devices, str) else tuple(devices)
            func = type(func.__name__, (func,), {"devices": devices})
        cls._registered[key] = func
        setattr(cls, name.upper(), key)


def _engine_classes() -> dict[str, type[Engine]]:
    from kiln import plugins

    found = dict(plugins.collectives())
    found.update(Backend._registered)
    return found


def is_available() -> bool:
    """``True``: kiln.distributed is installed (it is, if this runs)."""
    return True


def is_backend_available(backend: str) -> bool:
    """Whether the engine behind ``backend`` is registered and its library loads on this machine."""
    cls = _engine_classes().get(str(backend).lower())
    return cls is not None and cls.is_available()


def is_gloo_available() -> bool:
    """Whether the gloo backend can run (PyTorch's CPU wheel, with Gloo, is installed)."""
    return is_backend_available("gloo")


def is_mpi_available() -> bool:
    """Whether the mpi backend can run (mpi4py and an MPI library are installed)."""
    return is_backend_available("mpi")


def is_nccl_available() -> bool:
    """Whether an nccl backend is registered and can run."""
    return is_backend_available("nccl")


def is_torchelastic_launched() -> bool:
    """Whether this process was started by a launcher (``kiln-run``, or PyTorch's torchrun)."""
    return "KILN_RUN_ID" in os.environ or "TORCHELASTIC_RUN_ID" in os.environ


def _device_backends(backend: str | None) -> dict[str, str]:
    """``"cpu:gloo,cuda:nccl"``, ``"gloo"`` or ``None`` -> {device type: engine name}."""
    classes = _engine_classes()
    if backend is None or str(backend).lower() == Backend.UNDEFINED:
        out = {}
        for device, name in Backend.default_device_backend_map.items():
            if name in classes and classes[name].is_available():
                out[device] = name
            elif device == "cpu" and "mpi" in classes and classes["mpi"].is_available():
                out[device] = "mpi"
        if "cpu" not in out:
            raise RuntimeError(
                "no collective backend can run for cpu tensors: install kiln-distributed[gloo] (Gloo, from "
                "PyTorch's CPU wheel) or kiln-distributed[mpi] (mpi4py + MPICH)"
            )
        return out
    spec = str(backend).lower()
    if ":" in spec:
        out = {}
        for part in spec.split(","):
            device, _, name = part.strip().partition(":")
            if name not in classes:
                raise ValueError(f"Invalid backend: '{name}' (in '{backend}')")
            out[device.strip()] = name
        return out
    if spec not in classes:
        raise ValueError(f"Invalid backend: '{backend}'")
    return {device: spec for device in classes[spec].devices}


# ------------------------------------------------------------------------------------------------
# Debug level: how much checking every collective does


class DebugLevel(enum.Enum):
    """How much a collective checks (``torch.distributed.DebugLevel``). kiln's default is ``INFO``:
    every collective first checks that all ranks called it with the same shapes and dtypes. ``OFF``
    skips that check (one small gather per collective); ``DETAIL`` also logs each collective."""

    OFF = 0
    INFO = 1
    DETAIL = 2


_debug_level = DebugLevel.INFO


def set_debug_level(level: DebugLevel) -> None:
    """Set the debug level for this process."""
    global _debug_level
    _debug_level = DebugLevel(level)


def get_debug_level() -> DebugLevel:
    """The debug level of this process."""
    return _debug_level


def set_debug_level_from_env() -> None:
    """Read the level from ``KILN_DISTRIBUTED_DEBUG`` (or ``TORCH_DISTRIBUTED_DEBUG``): OFF, INFO or DETAIL."""
    value = os.environ.get("KILN_DISTRIBUTED_DEBUG") or os.environ.get("TORCH_DISTRIBUTED_DEBUG")
    if value is None:
        return
    try:
        set_debug_level(DebugLevel[value.upper()])
    except KeyError:
        raise ValueError(
            f"Invalid value {value!r} for KILN_DISTRIBUTED_DEBUG: valid values are OFF, INFO, DETAIL"
        ) from None


set_debug_level_from_env()
_unchecked = threading.local()


@contextlib.contextmanager
def _skip_consistency_check() -> Iterator[None]:
    """Collectives in this block skip the fingerprint check (DistributedDataParallel's bucket all-reduces:
    it verified the model across ranks once, at construction)."""
    prev = getattr(_unchecked, "on", False)
    _unchecked.on = True
    try:
        yield
    finally:
        _unchecked.on = prev


# ------------------------------------------------------------------------------------------------
# Process groups


class ProcessGroup:
    """A set of processes that run collectives together (``torch.distributed.ProcessGroup``).

    Made by :func:`init_process_group` (the default group, ``group.WORLD``) and :func:`new_group`."""

    def __init__(
        self,
        store: Store,
        rank: int,
        size: int,
        engines: dict[str, Engine],
        ranks: list[int],
        name: str,
        timeout: datetime.timedelta,
    ) -> None:
        self._store, self._rank, self._size = store, rank, size
        self._engines, self._ranks, self._name, self._timeout = engines, ranks, name, timeout
        self._seq = 0

    def rank(self) -> int:
        """This process's rank in the group."""
        return self._rank

    def size(self) -> int:
        """How many processes are in the group."""
        return self._size

    def name(self) -> str:
        """The group's backend name (``"gloo"``, or ``"cpu:gloo,cuda:nccl"`` for several)."""
        names = sorted(set(type(e).name for e in self._engines.values()))
        if len(names) == 1:
            return names[0]
        return ",".join(f"{d}:{type(e).name}" for d, e in self._engines.items())

    @property
    def group_name(self) -> str:
        """The group's unique name."""
        return self._name

    def __repr__(self) -> str:
        return f"ProcessGroup(name={self._name!r}, backend={self.name()!r}, rank={self._rank}, size={self._size})"

    def _engine(self, device_type: str) -> Engine:
        engine = self._engines.get(device_type)
        if engine is None:
            raise RuntimeError(f"No backend type associated with device type {device_type}")
        return engine

    def _object_engine(self) -> tuple[Engine, str]:
        """The engine (and device) object collectives move their bytes through: cpu's if there is one."""
        if "cpu" in self._engines:
            return self._engines["cpu"], "cpu"
        device, engine = next(iter(self._engines.items()))
        return engine, device

    def _shutdown(self) -> None:
        for engine in self._engines.values():
            engine.shutdown()
        self._engines = {}


class GroupMember:
    """``group.WORLD`` (the default group, once initialized) and ``NON_GROUP_MEMBER`` (what
    :func:`new_group` returns to a process outside the group)."""

    NON_GROUP_MEMBER = object()

    class _World:
        def __get__(self, obj, owner):
            return _state.default_pg

    WORLD = _World()


group = GroupMember  # ``dist.group.WORLD``


class _State:
    def __init__(self) -> None:
        self.default_pg: ProcessGroup | None = None
        self.store: Store | None = None
        self.groups: list[ProcessGroup] = []
        self.group_count = 0
        self.shared_store = True
        self.own_store = False
        self.local_groups: dict[str, int] = {}
        self.exit_hook = False
        self.generation = 0  # how many default groups this process has made: keys of each apart


_state = _State()


def is_initialized() -> bool:
    """Whether the default process group has been initialized."""
    return _state.default_pg is not None


def _default() -> ProcessGroup:
    if _state.default_pg is None:
        raise ValueError("Default process group has not been initialized, please make sure to call init_process_group.")
    return _state.default_pg


def _group(group: ProcessGroup | None) -> ProcessGroup:
    if group is None:
        return _default()
    if group is GroupMember.NON_GROUP_MEMBER:
        raise ValueError("Invalid process group specified: this rank is not a member of the group")
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"Invalid process group: expected a ProcessGroup, got {type(group).__name__}")
    if not group._engines:
        raise ValueError("Invalid process group specified: it was destroyed")
    return group


def _timeout_of(timeout) -> datetime.timedelta:
    if timeout is None:
        return default_pg_timeout
    if not isinstance(timeout, datetime.timedelta):
        raise TypeError(f"Expected timeout argument to be of type datetime.timedelta, got {timeout}")
    return timeout


def init_process_group(
    backend: str | None = None,
    init_method: str | None = None,
    timeout: datetime.timedelta | None = None,
    world_size: int = -1,
    rank: int = -1,
    store: Store | None = None,
    group_name: str = "",
    pg_options: Any = None,
    device_id: Any = None,
) -> None:
    """Initialize the default process group, as ``torch.distributed.init_process_group``.

    ``backend``: ``"gloo"``, ``"mpi"``, ``"cpu:gloo,cuda:nccl"``, or ``None`` (gloo for cpu tensors,
    else mpi). ``init_method``: ``"env://"`` (default), ``"tcp://host:port"``, ``"file:///path"``;
    or pass a ``store`` with ``rank`` and ``world_size``. With ``backend="mpi"`` and neither, rank and
    world size come from MPI itself (``mpiexec``, or ``kiln-run``).
    """
    if _state.default_pg is not None:
        raise ValueError("trying to initialize the default process group twice!")
    if store is not None and init_method is not None:
        raise ValueError("Cannot specify both init_method and store.")
    timeout = _timeout_of(timeout)
    devices = _device_backends(backend)
    classes = _engine_classes()
    for name in set(devices.values()):
        if not classes[name].is_available():
            raise RuntimeError(f"Distributed package doesn't have {name.upper()} built in")
    mpi_only = set(devices.values()) == {"mpi"}
    shared = True  # a store every rank sees (not the local one of an MPI world started by mpiexec)
    own = store is None  # a store made here is closed here; the caller's is the caller's
    if store is not None:
        if world_size <= 0:
            raise ValueError("world_size must be positive if using store")
        if rank < 0:
            raise ValueError("rank must be non-negative if using store")
    elif mpi_only and init_method is None and "MASTER_ADDR" not in os.environ:
        rank, world_size, store = _mpi_world(classes["mpi"], rank, world_size)
        shared = False
    else:
        store, rank, world_size = next(_rdzv.rendezvous(init_method or "env://", rank, world_size, timeout=timeout))
        store.set_timeout(timeout)
    with contextlib.suppress(DistError):
        store.register_rank(rank)
    _state.shared_store = shared
    _state.generation += 1
    _state.local_groups = {}
    try:
        pg = _make_group(store, rank, world_size, list(range(world_size)), devices, timeout, group_name or "0")
    except BaseException:
        if own and hasattr(store, "close"):
            store.close()  # a rank 0 that failed must not keep serving the port
        raise
    _state.default_pg, _state.store, _state.own_store = pg, store, own
    _state.group_count = 1
    if not _state.exit_hook:
        atexit.register(_shutdown_engines)
        _state.exit_hook = True


def _shutdown_engines() -> None:
    """At exit: shut the engines down while Python still runs (Gloo's process group calls back into the
    store as it goes; during interpreter teardown such a call ends in std::terminate). The store is left
    alone: a rank that exits without destroy_process_group stays visible to the others as gone."""
    for pg in list(_state.groups):
        with contextlib.suppress(Exception):
            pg._shutdown()


def _mpi_world(cls: type[Engine], rank: int, world_size: int) -> tuple[int, int, Store]:
    """Rank and world size from MPI (no rendezvous needed), and a store local to this process."""
    from kiln.distributed.store import HashStore

    mpi_rank, mpi_size = cls.world()  # type: ignore[attr-defined]
    if rank not in (-1, mpi_rank) or world_size not in (-1, mpi_size):
        raise ValueError(f"rank {rank} / world_size {world_size} given, but MPI says rank {mpi_rank} of {mpi_size}")
    return mpi_rank, mpi_size, HashStore()


def _make_group(
    store: Store,
    rank: int,
    size: int,
    ranks: list[int],
    devices: dict[str, str],
    timeout: datetime.timedelta,
    name: str,
) -> ProcessGroup:
    classes = _engine_classes()
    prefix = PrefixStore(f"kiln-pg/{_state.generation}/{name}", store)
    prefix.set_timeout(timeout)
    engines: dict[str, Engine] = {}
    made: dict[str, Engine] = {}
    try:
        for device, backend in devices.items():
            if backend not in made:  # one engine serves every device type mapped to it
                whole_world = _state.default_pg is None or ranks == list(range(_state.default_pg._size))
                made[backend] = classes[backend](
                    PrefixStore(backend, prefix), rank, size, timeout, None if whole_world else ranks
                )
            engines[device] = made[backend]
    except BaseException:
        for engine in made.values():
            engine.shutdown()
        raise
    pg = ProcessGroup(prefix, rank, size, engines, ranks, name, timeout)
    _state.groups.append(pg)
    return pg


def destroy_process_group(group: ProcessGroup | None = None) -> None:
    """Shut down ``group`` (``None``: the default group and every other group, then the store)."""
    if group is None or group is _state.default_pg:
        for pg in _state.groups:
            pg._shutdown()
        _state.groups = []
        store, _state.store, _state.default_pg = _state.store, None, None
        if store is not None and _state.own_store and hasattr(store, "close"):
            store.close()
        return
    if group is GroupMember.NON_GROUP_MEMBER:
        return
    group._shutdown()
    if group in _state.groups:
        _state.groups.remove(group)


def new_group(
    ranks: Sequence[int] | None = None,
    timeout: datetime.timedelta | None = None,
    backend: str | None = None,
    pg_options: Any = None,
    use_local_synchronization: bool = False,
    group_desc: str | None = None,
    device_id: Any = None,
) -> ProcessGroup | object:
    """A group of ``ranks`` (global ranks; ``None``: all). Every process of the default group must call
    it, in the same order, members or not; non-members get ``GroupMember.NON_GROUP_MEMBER``."""
    default = _default()
    world = default._size
    members = sorted(set(range(world) if ranks is None else (int(r) for r in ranks)))
    if ranks is not None and len(members) != len(list(ranks)):
        raise ValueError(f"ranks for new_group contain duplicates: {list(ranks)}")
    for r in members:
        if not 0 <= r < world:
            raise ValueError(f"The new group's rank should be within the world_size set by init_process_group: {r}")
    if use_local_synchronization:
        # only the members call it: the name comes from the members and how often they made a group
        key = ",".join(map(str, members))
        _state.local_groups[key] = _state.local_groups.get(key, 0) + 1
        name = f"local[{key}]#{_state.local_groups[key]}"
        if default._rank not in members:
            raise ValueError("new_group(use_local_synchronization=True) must be called by the group's members only")
    else:
        name = str(_state.group_count)
        _state.group_count += 1
    if default._rank not in members:
        return GroupMember.NON_GROUP_MEMBER
    if backend is None:
        devices = {d: type(e).name for d, e in default._engines.items()}
    else:
        devices = _device_backends(backend)
    pg = _make_group(
        _state.store,
        members.index(default._rank),
        len(members),
        members,
        devices,
        _timeout_of(timeout or default._timeout),
        name,
    )
    return pg


def new_subgroups(
    group_size: int | None = None, group: ProcessGroup | None = None, timeout=None, backend=None, pg_options=None
):
    """Equal-sized subgroups of consecutive ranks; returns ``(this rank's subgroup, all subgroups)``."""
    world = get_world_size()
    if group_size is None:
        group_size = world  # no per-node device count on cpu: one group
    if group_size <= 0:
        raise ValueError(f"The arg 'group_size' ({group_size}) must be positive")
    if world % group_size:
        raise ValueError(f"The world size ({world}) must be divisible by 'group_size' ({group_size})")
    mine, subgroups = None, []
    for start in range(0, world, group_size):
        pg = new_group(range(start, start + group_size), timeout=timeout, backend=backend)
        if pg is not GroupMember.NON_GROUP_MEMBER:
            mine = pg
            subgroups.append(pg)
        else:
            subgroups.append(pg)
    return mine, subgroups


def get_rank(group: ProcessGroup | None = None) -> int:
    """This process's rank in ``group`` (the default group if ``None``); -1 if not a member."""
    if group is GroupMember.NON_GROUP_MEMBER:
        return -1
    return _group(group)._rank


def get_world_size(group: ProcessGroup | None = None) -> int:
    """The number of processes in ``group``; -1 if this process is not a member."""
    if group is GroupMember.NON_GROUP_MEMBER:
        return -1
    return _group(group)._size


def get_backend(group: ProcessGroup | None = None) -> Backend:
    """The backend of ``group`` (``"gloo"``, ``"mpi"``...)."""
    return Backend(_group(group).name())


def get_process_group_ranks(group: ProcessGroup | None) -> list[int]:
    """The global ranks of ``group``'s members, in group-rank order."""
    return list(_group(group)._ranks)


def get_global_rank(group: ProcessGroup, group_rank: int) -> int:
    """The global rank of ``group``'s member ``group_rank``."""
    pg = _group(group)
    if not 0 <= group_rank < pg._size:
        raise ValueError(f"Group rank {group_rank} is not part of group {pg}")
    return pg._ranks[group_rank]


def get_group_rank(group: ProcessGroup, global_rank: int) -> int:
    """``global_rank``'s rank within ``group``."""
    pg = _group(group)
    if global_rank not in pg._ranks:
        raise ValueError(f"Global rank {global_rank} is not part of group {pg}")
    return pg._ranks.index(global_rank)


def get_node_local_rank(fallback_rank: int | None = None) -> int:
    """``LOCAL_RANK`` from the launcher's environment (``fallback_rank`` when unset)."""
    if "LOCAL_RANK" in os.environ:
        return int(os.environ["LOCAL_RANK"])
    if fallback_rank is not None:
        return int(fallback_rank)
    raise RuntimeError(
        "LOCAL_RANK is not in the environment. Consider passing fallback_rank to allow `get_node_local_rank` "
        "to work, assuming you are not running in a multi-device context and want the code to run locally "
        "instead."
    )


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
        self.pg, self.op, self.seq, self.sig = pg, op, pg._seq, _signature([t] if t is not None else [])
        mine = kiln.tensor(_fingerprint(op, root, t), dtype=kiln.int64)
        self.gathered = [kiln.empty(_FP, dtype=kiln.int64) for _ in range(pg._size)]
        try:
            self.work = engine.allgather(self.gathered, mine)
        except (DistError, RuntimeError) as e:
            raise _diagnose(pg, op, self.seq, self.sig, e) from e

    @staticmethod
    def start(pg: ProcessGroup, op: str, root: int, t, engine: Engine) -> _Fingerprints | None:
        """The check of this call, or ``None`` when checks are off (debug level OFF, inside DDP's
        buckets, or a group of one)."""
        if _debug_level is DebugLevel.OFF or getattr(_unchecked, "on", False) or pg._size == 1:
            return None
        return _Fingerprints(pg, op, root, t, engine)

    def verify(self) -> None:
        """Wait for every rank's fingerprint; raise ``DistBackendError`` if the calls differ."""
        pg, op, seq = self.pg, self.op, self.seq
        _wait(pg, op, seq, self.sig, self.work, None)
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
        sig: list,
        work: Work,
        finish,
        outputs: list,
        fingerprints: _Fingerprints | None = None,
        peer: int | None = None,
    ):
        self._pg, self._op, self._seq, self._sig, self._work = pg, op, seq, sig, work
        self._finish, self._outputs, self._done = finish, outputs, False
        self._fingerprints, self._peer = fingerprints, peer

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        if not self._done:
            if self._fingerprints is not None:
                fingerprints, self._fingerprints = self._fingerprints, None
                fingerprints.verify()
            _wait(self._pg, self._op, self._seq, self._sig, self._work, self._finish, timeout, self._peer)
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


def _wait(pg, op, seq, sig, work: Work, finish, timeout=None, peer: int | None = None) -> None:
    try:
        work.wait(timeout)
    except (DistError, RuntimeError, OSError) as e:
        raise _diagnose(pg, op, seq, sig, e, peer) from e
    if finish is not None:
        finish()


def _diagnose(
    pg: ProcessGroup, op: str, seq: int, sig: list, error: BaseException, peer: int | None = None
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
    seq, sig = pg._seq, _signature(tensors)
    try:
        work = call()
    except (DistError, RuntimeError) as e:
        if isinstance(e, NotImplementedError):
            raise
        raise _diagnose(pg, op, seq, sig, e, peer) from e
    outs = outputs if outputs is not None else list(tensors)
    gw = _GroupWork(pg, op, seq, sig, work, finish, outs, fingerprints, peer)
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


# ------------------------------------------------------------------------------------------------
# Collectives


def all_reduce(tensor, op: ReduceOp = ReduceOp.SUM, group: ProcessGroup | None = None, async_op: bool = False):
    """Reduce ``tensor`` across the group; every rank gets the result in place."""
    _check_tensor(tensor, "tensor")
    op = _reduce_op(op)
    pg = _member(group, "all_reduce")
    if pg is None:
        return None
    _contiguous([tensor])
    engine = pg._engine(tensor.device.type)
    engine_op, finish = _average(engine, op, tensor, pg._size)
    return _launch(
        pg, "all_reduce", engine, lambda: engine.allreduce(tensor, engine_op), [tensor], async_op, finish, (0, tensor)
    )


def broadcast(
    tensor,
    src: int | None = None,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    group_src: int | None = None,
):
    """Copy rank ``src``'s ``tensor`` (a global rank; or ``group_src`` within ``group``) to every rank."""
    _check_tensor(tensor, "tensor")
    pg = _member(group, "broadcast")
    if pg is None:
        return None
    root = _root(pg, src, group_src, "src")
    _contiguous([tensor])
    engine = pg._engine(tensor.device.type)
    return _launch(
        pg, "broadcast", engine, lambda: engine.broadcast(tensor, root), [tensor], async_op, None, (root, tensor)
    )


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


def reduce(
    tensor, dst: int | None = None, op: ReduceOp = ReduceOp.SUM, group=None, async_op: bool = False, group_dst=None
):
    """Reduce ``tensor`` across the group into rank ``dst``'s ``tensor``."""
    _check_tensor(tensor, "tensor")
    op = _reduce_op(op)
    pg = _member(group, "reduce")
    if pg is None:
        return None
    root = _root(pg, dst, group_dst, "dst")
    _contiguous([tensor])
    engine = pg._engine(tensor.device.type)
    engine_op, finish = _average(engine, op, tensor, pg._size)
    if finish is not None and pg._rank != root:
        finish = None
    return _launch(
        pg, "reduce", engine, lambda: engine.reduce(tensor, root, engine_op), [tensor], async_op, finish, (root, tensor)
    )


def all_gather(tensor_list: list, tensor, group=None, async_op: bool = False):
    """``tensor_list[i]`` receives rank ``i``'s ``tensor``, on every rank."""
    _check_tensor_list(tensor_list, "tensor_list")
    _check_tensor(tensor, "tensor")
    pg = _member(group, "all_gather")
    if pg is None:
        return None
    if len(tensor_list) != pg._size:
        raise ValueError(f"all_gather: tensor_list has {len(tensor_list)} tensors, the group has {pg._size} ranks")
    _contiguous([tensor, *tensor_list])
    for t in tensor_list:
        if t.dtype != tensor.dtype:
            raise TypeError(f"all_gather: tensor_list holds {t.dtype}, the input is {tensor.dtype}")
        if t.numel() != tensor.numel():
            raise ValueError(
                f"all_gather: each output must have the input's size {list(tensor.shape)}, got {list(t.shape)}"
            )
    engine = pg._engine(_same_device([tensor, *tensor_list]))
    return _launch(
        pg,
        "all_gather",
        engine,
        lambda: engine.allgather(tensor_list, tensor),
        [tensor],
        async_op,
        None,
        (0, tensor),
        list(tensor_list),
    )


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op: bool = False):
    """Rank ``i``'s ``input_tensor`` lands in the ``i``-th slice (along dim 0) of ``output_tensor``."""
    _check_tensor(output_tensor, "output_tensor")
    _check_tensor(input_tensor, "input_tensor")
    pg = _member(group, "all_gather_into_tensor")
    if pg is None:
        return None
    _contiguous([output_tensor, input_tensor])
    if output_tensor.numel() != input_tensor.numel() * pg._size:
        raise ValueError(
            "output tensor size must be equal to world_size times input tensor size: "
            f"{list(output_tensor.shape)} vs {pg._size} x {list(input_tensor.shape)}"
        )
    if output_tensor.dtype != input_tensor.dtype:
        raise TypeError("output tensor must have the same type as input tensor")
    parts = list(output_tensor.reshape(pg._size, -1).unbind(0))
    flat = input_tensor.reshape(-1)
    engine = pg._engine(_same_device([output_tensor, input_tensor]))
    return _launch(
        pg,
        "all_gather_into_tensor",
        engine,
        lambda: engine.allgather(parts, flat),
        [input_tensor],
        async_op,
        None,
        (0, input_tensor),
        [output_tensor],
    )


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


def gather(
    tensor, gather_list: list | None = None, dst: int | None = None, group=None, async_op: bool = False, group_dst=None
):
    """On rank ``dst`` (default 0), ``gather_list[i]`` receives rank ``i``'s ``tensor``."""
    _check_tensor(tensor, "tensor")
    pg = _member(group, "gather")
    if pg is None:
        return None
    root = _root(pg, 0 if dst is None and group_dst is None else dst, group_dst, "dst")
    outs = _root_list(pg, root, gather_list, "gather", "gather_list", "destination")
    _contiguous([tensor])
    engine = pg._engine(tensor.device.type)
    return _launch(
        pg,
        "gather",
        engine,
        lambda: engine.gather(outs, tensor, root),
        [tensor],
        async_op,
        None,
        (root, tensor),
        list(outs or []),
    )


def scatter(
    tensor, scatter_list: list | None = None, src: int | None = None, group=None, async_op: bool = False, group_src=None
):
    """Rank ``i``'s ``tensor`` receives ``scatter_list[i]`` of rank ``src`` (default 0)."""
    _check_tensor(tensor, "tensor")
    pg = _member(group, "scatter")
    if pg is None:
        return None
    root = _root(pg, 0 if src is None and group_src is None else src, group_src, "src")
    ins = _root_list(pg, root, scatter_list, "scatter", "scatter_list", "source")
    _contiguous([tensor])
    engine = pg._engine(tensor.device.type)
    return _launch(
        pg, "scatter", engine, lambda: engine.scatter(tensor, ins, root), [tensor], async_op, None, (root, tensor)
    )


def reduce_scatter(output, input_list: list, op: ReduceOp = ReduceOp.SUM, group=None, async_op: bool = False):
    """Rank ``i``'s ``output`` receives the reduction of every rank's ``input_list[i]``."""
    _check_tensor(output, "output")
    _check_tensor_list(input_list, "input_list")
    op = _reduce_op(op)
    pg = _member(group, "reduce_scatter")
    if pg is None:
        return None
    if len(input_list) != pg._size:
        raise ValueError(f"reduce_scatter: input_list has {len(input_list)} tensors, the group has {pg._size} ranks")
    _contiguous([output, *input_list])
    engine = pg._engine(_same_device([output, *input_list]))
    engine_op, finish = _average(engine, op, output, pg._size)
    return _launch(
        pg,
        "reduce_scatter",
        engine,
        lambda: engine.reduce_scatter(output, input_list, engine_op),
        [output],
        async_op,
        finish,
        (0, output),
    )


def reduce_scatter_tensor(output, input, op: ReduceOp = ReduceOp.SUM, group=None, async_op: bool = False):
    """Rank ``i``'s ``output`` receives the reduction of every rank's ``i``-th slice of ``input``."""
    _check_tensor(output, "output")
    _check_tensor(input, "input")
    op = _reduce_op(op)
    pg = _member(group, "reduce_scatter_tensor")
    if pg is None:
        return None
    _contiguous([output, input])
    if input.numel() != output.numel() * pg._size:
        raise ValueError(
            "input tensor must be the same size as output size times world size: "
            f"{list(input.shape)} vs {pg._size} x {list(output.shape)}"
        )
    parts = list(input.reshape(pg._size, -1).unbind(0))
    flat = output.reshape(-1)
    engine = pg._engine(_same_device([output, input]))
    engine_op, finish = _average(engine, op, output, pg._size)
    return _launch(
        pg,
        "reduce_scatter_tensor",
        engine,
        lambda: engine.reduce_scatter(flat, parts, engine_op),
        [output],
        async_op,
        finish,
        (0, output),
    )


def all_to_all(output_tensor_list: list, input_tensor_list: list, group=None, async_op: bool = False):
    """Rank ``i``'s ``output_tensor_list[j]`` receives rank ``j``'s ``input_tensor_list[i]``."""
    _check_tensor_list(output_tensor_list, "output_tensor_list")
    _check_tensor_list(input_tensor_list, "input_tensor_list")
    pg = _member(group, "all_to_all")
    if pg is None:
        return None
    if len(output_tensor_list) != pg._size or len(input_tensor_list) != pg._size:
        raise ValueError(f"all_to_all: both lists must hold one tensor per rank ({pg._size})")
    _contiguous([*output_tensor_list, *input_tensor_list])
    engine = pg._engine(_same_device([*output_tensor_list, *input_tensor_list]))
    return _launch(
        pg,
        "all_to_all",
        engine,
        lambda: engine.alltoall(output_tensor_list, input_tensor_list),
        input_tensor_list,
        async_op,
        None,
        (0, None),
        list(output_tensor_list),
    )


def all_to_all_single(
    output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op: bool = False
):
    """``all_to_all`` on single tensors split along dim 0 (equally, or by the split sizes)."""
    _check_tensor(output, "output")
    _check_tensor(input, "input")
    pg = _member(group, "all_to_all_single")
    if pg is None:
        return None
    _contiguous([output, input])

    def split(t, sizes, name):
        if sizes is None:
            if t.shape[0] % pg._size if t.dim() else True:
                raise ValueError(
                    f"{name}: dim 0 ({t.shape[0] if t.dim() else 0}) must divide by the world size {pg._size}"
                )
            sizes = [t.shape[0] // pg._size] * pg._size
        if len(sizes) != pg._size or sum(sizes) != t.shape[0]:
            raise ValueError(f"{name}_split_sizes {list(sizes)} must have one entry per rank and sum to {t.shape[0]}")
        return list(t.split(list(sizes), 0))

    outs = split(output, output_split_sizes, "output")
    ins = [i.contiguous() for i in split(input, input_split_sizes, "input")]
    outs_c = [o if o.is_contiguous() else o.contiguous() for o in outs]

    def finish() -> None:
        for o, c in zip(outs, outs_c, strict=True):
            if o is not c:
                o.copy_(c)

    engine = pg._engine(_same_device([output, input]))
    return _launch(
        pg,
        "all_to_all_single",
        engine,
        lambda: engine.alltoall(outs_c, ins),
        [input],
        async_op,
        finish,
        (0, None),
        [output],
    )


def barrier(group=None, async_op: bool = False, device_ids=None):
    """Block until every rank of the group has reached this call."""
    pg = _member(group, "barrier")
    if pg is None:
        return None
    engine, _ = pg._object_engine()
    return _launch(pg, "barrier", engine, engine.barrier, [], async_op, None, (0, None), [])


def monitored_barrier(group=None, timeout: datetime.timedelta | None = None, wait_all_ranks: bool = False) -> None:
    """A barrier through the store that names the ranks that did not arrive within ``timeout`` (raised
    on rank 0; the other ranks raise when rank 0 does not release them in time)."""
    pg = _member(group, "monitored_barrier")
    if pg is None:
        return
    timeout = _timeout_of(timeout or pg._timeout)
    pg._seq += 1
    if not _state.shared_store:  # an MPI world without a store: a barrier that times out, naming no one
        engine, _ = pg._object_engine()
        try:
            engine.barrier().wait(timeout)
        except (DistError, RuntimeError) as e:
            raise DistBackendError(
                f"monitored_barrier did not complete within {timeout} (this MPI world has no shared store, "
                f"so the late ranks cannot be named; init with init_method= to name them): {e}"
            ) from e
        return
    key = f"monitored_barrier/{pg._seq}/"
    me = pg._rank
    pg._store.set(key + f"arrived/{me}", b"1")
    if me == 0:
        deadline = time.monotonic() + timeout.total_seconds()
        late = []
        for r in range(1, pg._size):
            left = max(0.0, deadline - time.monotonic())
            try:
                pg._store.wait([key + f"arrived/{r}"], datetime.timedelta(seconds=left))
            except DistStoreError:
                late.append(pg._ranks[r])
                if not wait_all_ranks:
                    break
        if late:
            names = ", ".join(str(r) for r in late)
            raise DistBackendError(
                f"Rank{'s' if len(late) > 1 else ''} {names} failed to pass monitoredBarrier in {timeout}"
            )
        pg._store.set(key + "released", b"1")
    else:
        try:
            pg._store.wait([key + "released"], timeout)
        except DistStoreError:
            raise DistBackendError(
                f"rank {pg._ranks[me]}: monitored_barrier was not released by rank {pg._ranks[0]} within {timeout}"
            ) from None


# ------------------------------------------------------------------------------------------------
# Point to point


def _p2p_peer(pg: ProcessGroup, peer: int | None, group_peer: int | None, name: str) -> int:
    r = _root(pg, peer, group_peer, name)
    if r == pg._rank:
        raise ValueError(f"Invalid {name} rank: a rank cannot {'send to' if name == 'dst' else 'receive from'} itself")
    return r


def isend(tensor, dst: int | None = None, group=None, tag: int = 0, group_dst: int | None = None) -> Work | None:
    """Send ``tensor`` to rank ``dst`` asynchronously; returns a work to wait on."""
    _check_tensor(tensor, "tensor")
    pg = _member(group, "isend")
    if pg is None:
        return None
    peer = _p2p_peer(pg, dst, group_dst, "dst")
    _contiguous([tensor])
    engine = pg._engine(tensor.device.type)
    return _launch(pg, "send", engine, lambda: engine.send(tensor, peer, tag), [tensor], True, peer=peer)


def irecv(tensor, src: int | None = None, group=None, tag: int = 0, group_src: int | None = None) -> Work | None:
    """Receive into ``tensor`` from rank ``src`` (``None``: any rank) asynchronously."""
    _check_tensor(tensor, "tensor")
    pg = _member(group, "irecv")
    if pg is None:
        return None
    peer = None if src is None and group_src is None else _p2p_peer(pg, src, group_src, "src")
    _contiguous([tensor])
    engine = pg._engine(tensor.device.type)
    return _launch(
        pg, "recv", engine, lambda: engine.recv(tensor, peer, tag), [tensor], True, peer=-1 if peer is None else peer
    )


def send(tensor, dst: int | None = None, group=None, tag: int = 0, group_dst: int | None = None) -> None:
    """Send ``tensor`` to rank ``dst`` and wait until it is sent."""
    work = isend(tensor, dst, group, tag, group_dst)
    if work is not None:
        work.wait()


def recv(tensor, src: int | None = None, group=None, tag: int = 0, group_src: int | None = None) -> int:
    """Receive into ``tensor`` from rank ``src`` (``None``: any rank); returns the sender's global rank."""
    work = irecv(tensor, src, group, tag, group_src)
    if work is None:
        return -1
    work.wait()
    if src is None and group_src is None:
        return work.source_rank()
    pg = _group(group)
    return pg._ranks[_root(pg, src, group_src, "src")]


class P2POp:
    """One send or receive for :func:`batch_isend_irecv`: ``P2POp(dist.isend, tensor, peer)``."""

    def __init__(self, op, tensor, peer: int | None = None, group=None, tag: int = 0, group_peer: int | None = None):
        if op not in (isend, irecv):
            raise ValueError(
                "Invalid ``op``. Expected ``op`` to be of type ``kiln.distributed.isend`` or ``kiln.distributed.irecv``."
            )
        _check_tensor(tensor, "tensor")
        self.op, self.tensor, self.peer, self.group, self.tag, self.group_peer = (
            op,
            tensor,
            peer,
            group,
            tag,
            group_peer,
        )


def batch_isend_irecv(p2p_op_list: list[P2POp]) -> list[Work]:
    """Start every send and receive of the list; returns their works."""
    if not isinstance(p2p_op_list, list) or not all(isinstance(p, P2POp) for p in p2p_op_list):
        raise ValueError("Invalid ``p2p_op_list``. Each op is expected to to be of type ``kiln.distributed.P2POp``.")
    works = []
    for p in p2p_op_list:
        if p.op is isend:
            works.append(isend(p.tensor, p.peer, p.group, p.tag, p.group_peer))
        else:
            works.append(irecv(p.tensor, p.peer, p.group, p.tag, p.group_peer))
    return [w for w in works if w is not None]


# ------------------------------------------------------------------------------------------------
# Object collectives: kiln.save's format, read back with weights_only=True (never arbitrary pickle)


def _encode(obj: Any) -> Any:
    buf = io.BytesIO()
    kiln.save(obj, buf)
    return kiln.frombuffer(bytearray(buf.getvalue()), dtype=kiln.uint8)


def _decode(t, rank: int) -> Any:
    try:
        return kiln.load(io.BytesIO(t.numpy().tobytes()), weights_only=True)
    except Exception as e:
        raise DistBackendError(
            f"the object from rank {rank} cannot be decoded safely: object collectives carry only what "
            f"kiln.load(weights_only=True) accepts (tensors, numbers, strings, lists, tuples, dicts, and "
            f"classes allowed with kiln.serialization.add_safe_globals). {e}"
        ) from e


def _encode_all(objects: list) -> tuple[list, Any]:
    """Each object encoded, and their sizes as an int64 tensor."""
    encoded = [_encode(o) for o in objects]
    return encoded, kiln.tensor([e.numel() for e in encoded], dtype=kiln.int64)


def _padded(data, size: int):
    """``data`` (uint8) zero-padded to ``size`` bytes: the engines move equal-sized buffers."""
    out = kiln.zeros(size, dtype=kiln.uint8)
    out[: data.numel()] = data
    return out


def _decode_flat(flat, sizes: list[int], rank: int) -> list:
    """The objects concatenated in ``flat``, of ``sizes`` bytes each, all from ``rank``."""
    out, start = [], 0
    for size in sizes:
        out.append(_decode(flat[start : start + size], rank))
        start += size
    return out


def _gather_objects(pg: ProcessGroup, op: str, obj: Any, root: int | None) -> list | None:
    """Every rank's ``obj`` (on every rank if ``root`` is None, else on ``root`` only; None elsewhere)."""
    engine, _ = pg._object_engine()
    data = _encode(obj)
    mine = kiln.tensor([data.numel()], dtype=kiln.int64)
    counts = [kiln.zeros(1, dtype=kiln.int64) for _ in range(pg._size)]
    _launch(pg, op, engine, lambda: engine.allgather(counts, mine), [mine], False, None, (0, mine), counts)
    sizes = [int(c.item()) for c in counts]
    padded = _padded(data, max(sizes))
    receives = root is None or pg._rank == root
    outs = [kiln.empty(max(sizes), dtype=kiln.uint8) for _ in range(pg._size)] if receives else None
    if root is None:
        call = lambda: engine.allgather(outs, padded)
    else:
        call = lambda: engine.gather(outs, padded, root)
    with _skip_consistency_check():  # the sizes' gather was checked; the bytes' sizes follow from it
        _launch(pg, op, engine, call, [padded], False, None, None, outs or [])
    if outs is None:
        return None
    return [_decode(o[:n], pg._ranks[i]) for i, (o, n) in enumerate(zip(outs, sizes, strict=True))]


def all_gather_object(object_list: list, obj: Any, group=None) -> None:
    """``object_list[i]`` receives rank ``i``'s ``obj``, on every rank."""
    pg = _member(group, "all_gather_object")
    if pg is None:
        return
    if len(object_list) != pg._size:
        raise ValueError(
            f"all_gather_object: object_list has {len(object_list)} entries, the group has {pg._size} ranks"
        )
    object_list[:] = _gather_objects(pg, "all_gather_object", obj, None)


def gather_object(
    obj: Any, object_gather_list: list | None = None, dst: int | None = None, group=None, group_dst=None
) -> None:
    """On rank ``dst`` (default 0), ``object_gather_list[i]`` receives rank ``i``'s ``obj``."""
    pg = _member(group, "gather_object")
    if pg is None:
        return
    root = _root(pg, 0 if dst is None and group_dst is None else dst, group_dst, "dst")
    if pg._rank == root and (object_gather_list is None or len(object_gather_list) != pg._size):
        raise ValueError("Argument ``object_gather_list`` must be specified on destination rank, one entry per rank.")
    got = _gather_objects(pg, "gather_object", obj, root)
    if got is not None:
        object_gather_list[:] = got  # type: ignore[index]


def broadcast_object_list(object_list: list, src: int | None = None, group=None, device=None, group_src=None) -> None:
    """Every rank's ``object_list`` receives rank ``src``'s (default 0) objects, in place."""
    pg = _member(group, "broadcast_object_list")
    if pg is None:
        return
    root = _root(pg, 0 if src is None and group_src is None else src, group_src, "src")
    engine, _ = pg._object_engine()
    if pg._rank == root:
        encoded, sizes = _encode_all(object_list)
    else:
        sizes = kiln.zeros(len(object_list), dtype=kiln.int64)
    _launch(
        pg, "broadcast_object_list", engine, lambda: engine.broadcast(sizes, root), [sizes], False, None, (root, sizes)
    )
    total = int(sizes.sum().item())
    if pg._rank == root:
        flat = kiln.cat(encoded) if encoded else kiln.empty(0, dtype=kiln.uint8)
    else:
        flat = kiln.empty(total, dtype=kiln.uint8)
    if total:
        with _skip_consistency_check():
            _launch(pg, "broadcast", engine, lambda: engine.broadcast(flat, root), [flat], False)
    if pg._rank != root:
        object_list[:] = _decode_flat(flat, sizes.tolist(), pg._ranks[root])


def scatter_object_list(
    scatter_object_output_list: list,
    scatter_object_input_list: list | None = None,
    src: int | None = None,
    group=None,
    group_src=None,
) -> None:
    """``scatter_object_output_list[0]`` receives the ``i``-th object of rank ``src``'s input list."""
    pg = _member(group, "scatter_object_list")
    if pg is None:
        return
    if not isinstance(scatter_object_output_list, list) or len(scatter_object_output_list) < 1:
        raise ValueError("Expected argument scatter_object_output_list to be a list of size at least 1.")
    root = _root(pg, 0 if src is None and group_src is None else src, group_src, "src")
    engine, _ = pg._object_engine()
    if pg._rank == root:
        if scatter_object_input_list is None or len(scatter_object_input_list) != pg._size:
            raise ValueError("scatter_object_input_list must hold one object per rank on the source rank")
        encoded, sizes = _encode_all(scatter_object_input_list)
    else:
        sizes = kiln.zeros(pg._size, dtype=kiln.int64)
    _launch(
        pg, "scatter_object_list", engine, lambda: engine.broadcast(sizes, root), [sizes], False, None, (root, sizes)
    )
    top = int(sizes.max().item())
    out = kiln.empty(top, dtype=kiln.uint8)
    ins = [_padded(e, top) for e in encoded] if pg._rank == root else None
    with _skip_consistency_check():
        _launch(pg, "scatter", engine, lambda: engine.scatter(out, ins, root), [out], False)
    scatter_object_output_list[0] = _decode(out[: int(sizes[pg._rank].item())], pg._ranks[root])


def send_object_list(object_list: list, dst: int | None = None, group=None, device=None, group_dst=None) -> None:
    """Send ``object_list`` to rank ``dst`` (which calls :func:`recv_object_list` with a list as long)."""
    encoded, sizes = _encode_all(object_list)
    send(sizes, dst, group, group_dst=group_dst)
    if encoded:
        send(kiln.cat(encoded), dst, group, group_dst=group_dst)


def recv_object_list(object_list: list, src: int | None = None, group=None, device=None, group_src=None) -> int:
    """Receive into ``object_list`` the objects rank ``src`` (``None``: any) sent; returns the sender's rank."""
    sizes = kiln.zeros(len(object_list), dtype=kiln.int64)
    sender = recv(sizes, src, group, group_src=group_src)
    total = int(sizes.sum().item())
    flat = kiln.empty(total, dtype=kiln.uint8)
    if total:
        recv(flat, sender, group)
    object_list[:] = _decode_flat(flat, sizes.tolist(), sender)
    return sender
