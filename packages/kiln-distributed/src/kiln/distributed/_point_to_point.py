"""Point to point: ``send``, ``recv``, ``isend``, ``irecv`` and ``batch_isend_irecv`` (re-exported by
:mod:`kiln.distributed.distributed_c10d`)."""

from __future__ import annotations

from kiln.distributed._calls import _check_tensor, _contiguous, _launch, _member, _root
from kiln.distributed._groups import ProcessGroup, _group
from kiln.distributed.engine import Work

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
