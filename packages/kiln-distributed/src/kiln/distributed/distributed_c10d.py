"""Process groups and collectives: ``torch.distributed``'s API on kiln's engines (this module: the
collectives; the rest of the API comes from the modules it re-exports).

A :class:`ProcessGroup` holds one engine per device type (``"cpu:gloo,cuda:nccl"``), a private store
and the global ranks of its members (:mod:`kiln.distributed._groups`). Every collective checks its
arguments with PyTorch's errors, then (unless the debug level is ``OFF``) checks that every rank of the
group called the same collective with the same dtype and number of elements, by gathering a small
fingerprint first: Gloo, for one, returns wrong results without any error when ranks pass tensors of
different sizes. When an engine fails, the error says what happened to whom: the rank that died (its
connection to the store closed), the ranks that never reached the call, or the ranks that disagreed on
it (:mod:`kiln.distributed._calls`). Point-to-point calls and the object collectives have modules of
their own (:mod:`kiln.distributed._point_to_point`, :mod:`kiln.distributed._objects`).
"""

from __future__ import annotations

import datetime
import time

from kiln.distributed._calls import (
    _average,
    _check_tensor,
    _check_tensor_list,
    _contiguous,
    _launch,
    _member,
    _reduce_op,
    _root,
    _root_list,
    _same_device,
)
from kiln.distributed._groups import (
    Backend,
    DebugLevel,
    GroupMember,
    ProcessGroup,
    _state,
    _timeout_of,
    default_pg_timeout,
    destroy_process_group,
    get_backend,
    get_debug_level,
    get_global_rank,
    get_group_rank,
    get_node_local_rank,
    get_process_group_ranks,
    get_rank,
    get_world_size,
    group,
    init_process_group,
    is_available,
    is_backend_available,
    is_gloo_available,
    is_initialized,
    is_mpi_available,
    is_nccl_available,
    is_torchelastic_launched,
    new_group,
    new_subgroups,
    reduce_op,
    set_debug_level,
    set_debug_level_from_env,
)
from kiln.distributed._objects import (
    all_gather_object,
    broadcast_object_list,
    gather_object,
    recv_object_list,
    scatter_object_list,
    send_object_list,
)
from kiln.distributed._point_to_point import P2POp, batch_isend_irecv, irecv, isend, recv, send
from kiln.distributed.engine import ReduceOp, Work
from kiln.distributed.errors import DistBackendError, DistError, DistStoreError

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
