"""The object collectives: objects in ``kiln.save``'s format, read back with
``kiln.load(weights_only=True)``, never arbitrary pickle (re-exported by
:mod:`kiln.distributed.distributed_c10d`)."""

from __future__ import annotations

import io
from typing import Any

import kiln
from kiln.distributed._calls import _launch, _member, _root
from kiln.distributed._groups import ProcessGroup, _skip_consistency_check
from kiln.distributed._point_to_point import recv, send
from kiln.distributed.errors import DistBackendError

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
