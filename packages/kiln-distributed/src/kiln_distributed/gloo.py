"""The ``gloo`` engine: the Gloo library, as built into PyTorch's CPU wheel (the ``gloo`` extra).

PyTorch's wheel is the maintained binary build of Gloo on the package index; this engine drives its
``ProcessGroupGloo`` directly, without ``torch.distributed``'s own process-group bookkeeping:

* rendezvous goes through kiln's store, seen by Gloo through a ``torch.distributed.Store`` subclass
  that forwards every call (Gloo only exchanges its listening addresses there);
* tensors are handed over zero-copy: a contiguous kiln cpu tensor's NumPy view becomes a torch tensor
  over the same memory (``torch.from_numpy``), and Gloo reads and writes it in place;
* Gloo's works run on Gloo's own threads and release the GIL while waiting, so an all-reduce launched
  from an autograd hook overlaps the rest of the backward pass.

``torch`` is imported when the first gloo process group is made, never at ``import kiln.distributed``.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import socket
from typing import Any

import numpy as np

from kiln.distributed.engine import Engine, ReduceOp, Work
from kiln.distributed.errors import DistBackendError, DistStoreError

__all__ = ["GlooEngine"]


def _torch():
    try:
        import torch
        import torch.distributed as td
    except ImportError as e:
        raise RuntimeError(
            "the gloo backend needs the Gloo library from PyTorch's CPU wheel: "
            "pip install torch==2.13.0 'kiln-distributed[gloo]' (or use backend='mpi')"
        ) from e
    if not td.is_available() or not hasattr(td, "ProcessGroupGloo"):
        raise RuntimeError("this PyTorch build has no Gloo (torch.distributed.ProcessGroupGloo is missing)")
    return torch, td


def _store_adapter(td, store):
    """A ``torch.distributed.Store`` that forwards to kiln's ``store`` (Gloo reads peers' addresses there)."""

    class KilnStore(td.Store):
        def __init__(self) -> None:
            super().__init__()
            self._store = store

        def set(self, key, value):
            store.set(key, value)

        def get(self, key):
            return store.get(key)

        def add(self, key, amount):
            return store.add(key, amount)

        def compare_set(self, key, expected, desired):
            return store.compare_set(key, expected, desired)

        def check(self, keys):
            return store.check(list(keys))

        def wait(self, keys, timeout=None):
            store.wait(list(keys), timeout)

        def delete_key(self, key):
            return store.delete_key(key)

        def num_keys(self):
            return store.num_keys()

        def set_timeout(self, timeout):
            store.set_timeout(timeout)

    return KilnStore()


def _local_address_towards(host: str) -> str | None:
    """The address of this machine's interface that routes to ``host`` (the store's host): the address
    Gloo should listen on so that peers on other hosts reach it."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))  # UDP: no packet is sent, only a route chosen
            return s.getsockname()[0]
    except OSError:
        return None


def _store_host(store) -> str | None:
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    return getattr(store, "host", None)


class _GlooWork(Work):
    """A Gloo work, with what must stay alive until it completes and what runs once it has."""

    def __init__(self, work, keep: Any, outputs: list, finish=None, op: str = "") -> None:
        self._work, self._keep, self._outputs, self._finish, self._op = work, keep, outputs, finish, op
        self._done = False

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        if not self._done:
            try:
                if timeout is None:
                    self._work.wait()
                else:
                    self._work.wait(timeout)
            except RuntimeError as e:
                raise DistBackendError(str(e)) from e
            if self._finish is not None:
                self._finish()
            self._done, self._keep = True, None
        return True

    def is_completed(self) -> bool:
        if not self._done and self._work.is_completed():
            with contextlib.suppress(DistBackendError):  # finished either way; wait() raises it again
                self.wait()  # runs the copy-back, so that a completed work's outputs are written
            return True
        return self._done

    def source_rank(self) -> int:
        return self._work.source_rank()


class GlooEngine(Engine):
    """Collectives on cpu tensors through the Gloo library (PyTorch's ``ProcessGroupGloo``).

    Gloo listens on the interface named by ``GLOO_SOCKET_IFNAME`` when set, else on the local address
    that routes to the store's host (so that a job across hosts works without configuration).
    """

    name = "gloo"
    devices = ("cpu",)
    reduce_ops = frozenset(
        {ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR}
    )

    @classmethod
    def is_available(cls) -> bool:
        try:
            _torch()
        except RuntimeError:
            return False
        return True

    def __init__(self, store, rank, world_size, timeout, group_ranks=None) -> None:
        super().__init__(store, rank, world_size, timeout, group_ranks)
        self._t, self._td = _torch()
        td = self._td
        options = td.ProcessGroupGloo._Options()
        options._timeout = timeout
        ifname = os.environ.get("GLOO_SOCKET_IFNAME")
        if ifname:
            options._devices = [td.ProcessGroupGloo.create_device(interface=i) for i in ifname.split(",")]
        else:
            host = _store_host(store)
            address = _local_address_towards(host) if host else None
            if address is not None:
                options._devices = [td.ProcessGroupGloo.create_device(hostname=address)]
            else:
                options._devices = [td.ProcessGroupGloo.create_default_device()]
        try:
            self._pg = td.ProcessGroupGloo(_store_adapter(td, store), rank, world_size, options)
        except DistStoreError:
            raise
        except RuntimeError as e:
            raise DistBackendError(f"gloo could not connect rank {rank} of {world_size}: {e}") from e
        self._ops = {
            ReduceOp.SUM: td.ReduceOp.SUM,
            ReduceOp.PRODUCT: td.ReduceOp.PRODUCT,
            ReduceOp.MIN: td.ReduceOp.MIN,
            ReduceOp.MAX: td.ReduceOp.MAX,
            ReduceOp.BAND: td.ReduceOp.BAND,
            ReduceOp.BOR: td.ReduceOp.BOR,
            ReduceOp.BXOR: td.ReduceOp.BXOR,
        }

    # -- kiln tensor -> torch tensor over the same memory ----------------------------------------
    def _view(self, t):
        arr = t.detach().numpy()  # the same memory; a tensor that requires grad is moved like any other
        if arr.dtype.name == "bfloat16":  # ml_dtypes' bfloat16: hand the bytes over as torch's bfloat16
            return self._t.from_numpy(arr.view(np.int16)).view(self._t.bfloat16)
        if arr.ndim == 0:
            arr = arr.reshape(1)
        return self._t.from_numpy(arr)

    def _work(self, work, keep, outputs, finish=None, op=""):
        return _GlooWork(work, keep, outputs, finish, op)

    # -- collectives -------------------------------------------------------------------------------
    def allreduce(self, tensor, op):
        td = self._td
        opts = td.AllreduceOptions()
        opts.reduceOp = self._ops[op]
        tt = self._view(tensor)
        return self._work(self._pg.allreduce([tt], opts), tt, [tensor])

    def broadcast(self, tensor, src):
        opts = self._td.BroadcastOptions()
        opts.rootRank, opts.rootTensor = src, 0
        tt = self._view(tensor)
        return self._work(self._pg.broadcast([tt], opts), tt, [tensor])

    def reduce(self, tensor, dst, op):
        opts = self._td.ReduceOptions()
        opts.rootRank, opts.rootTensor, opts.reduceOp = dst, 0, self._ops[op]
        tt = self._view(tensor)
        return self._work(self._pg.reduce([tt], opts), tt, [tensor])

    def allgather(self, outputs, tensor):
        outs, tt = [self._view(o) for o in outputs], self._view(tensor)
        return self._work(self._pg.allgather([outs], [tt]), (outs, tt), list(outputs))

    def gather(self, outputs, tensor, dst):
        opts = self._td.GatherOptions()
        opts.rootRank = dst
        tt = self._view(tensor)
        outs = [[self._view(o) for o in outputs]] if outputs is not None else []
        return self._work(self._pg.gather(outs, [tt], opts), (outs, tt), list(outputs or []))

    def scatter(self, output, inputs, src):
        opts = self._td.ScatterOptions()
        opts.rootRank = src
        tt = self._view(output)
        ins = [[self._view(i) for i in inputs]] if inputs is not None else []
        return self._work(self._pg.scatter([tt], ins, opts), (ins, tt), [output])

    def reduce_scatter(self, output, inputs, op):
        opts = self._td.ReduceScatterOptions()
        opts.reduceOp = self._ops[op]
        tt, ins = self._view(output), [self._view(i) for i in inputs]
        return self._work(self._pg.reduce_scatter([tt], [ins], opts), (tt, ins), [output])

    def alltoall(self, outputs, inputs):
        # Gloo's all-to-all works on one flat buffer each way, with a split size per peer.
        torch = self._t
        flat_in = torch.cat([self._view(i).reshape(-1) for i in inputs])
        out_sizes = [o.numel() for o in outputs]
        flat_out = torch.empty(sum(out_sizes), dtype=flat_in.dtype)
        in_sizes = [i.numel() for i in inputs]
        work = self._pg.alltoall_base(flat_out, flat_in, out_sizes, in_sizes, self._td.AllToAllOptions())

        def finish() -> None:
            start = 0
            for o, n in zip(outputs, out_sizes, strict=True):
                self._view(o).reshape(-1).copy_(flat_out[start : start + n])
                start += n

        return self._work(work, (flat_in, flat_out), list(outputs), finish)

    def send(self, tensor, dst, tag):
        tt = self._view(tensor)
        return self._work(self._pg.send([tt], dst, tag & 0x7FFFFFFF), tt, [tensor])

    def recv(self, tensor, src, tag):
        tt = self._view(tensor)
        if src is None:
            return self._work(self._pg.recv_anysource([tt], tag & 0x7FFFFFFF), tt, [tensor])
        return self._work(self._pg.recv([tt], src, tag & 0x7FFFFFFF), tt, [tensor])

    def barrier(self):
        return self._work(self._pg.barrier(self._td.BarrierOptions()), None, [])

    def shutdown(self) -> None:
        pg, self._pg = getattr(self, "_pg", None), None
        if pg is not None and hasattr(pg, "shutdown"):
            with contextlib.suppress(RuntimeError):  # already broken by a dead peer: nothing left to close
                pg.shutdown()
