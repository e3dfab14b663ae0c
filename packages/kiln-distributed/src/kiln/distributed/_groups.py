"""Process groups: backend names and their engines, the debug level, ``init_process_group``,
``new_group``, ``destroy_process_group`` and the rank queries (re-exported by
:mod:`kiln.distributed.distributed_c10d`)."""

from __future__ import annotations

import atexit
import contextlib
import datetime
import enum
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from kiln.distributed import rendezvous as _rdzv
from kiln.distributed.engine import Engine, ReduceOp
from kiln.distributed.errors import DistError
from kiln.distributed.store import PrefixStore, Store, default_timeout

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
