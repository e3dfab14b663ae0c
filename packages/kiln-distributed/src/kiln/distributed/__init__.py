"""``kiln.distributed``: training across processes and hosts, as ``torch.distributed``.

* Process groups on existing engines: ``gloo`` (the Gloo library from PyTorch's CPU wheel, the
  ``gloo`` extra) and ``mpi`` (mpi4py with MPICH, the ``mpi`` extra); third parties add engines through
  the ``kiln_register_collectives`` hook (:class:`kiln.distributed.engine.Engine`).
* :func:`init_process_group` with ``env://``, ``tcp://`` and ``file://`` rendezvous, and every
  collective of ``torch.distributed`` (``async_op=True`` returns a :class:`Work`), point-to-point
  sends, and the object collectives, which carry only what ``kiln.load(weights_only=True)`` accepts.
* Errors that name the rank at fault: a rank that died, ranks that never reached a call, ranks that
  called it with other shapes.
* :class:`kiln.nn.parallel.DistributedDataParallel`, :class:`kiln.distributed.optim.ZeroRedundancyOptimizer`
  and the ``kiln-run`` launcher (``python -m kiln.distributed.run``).
"""

from __future__ import annotations

from kiln.distributed.distributed_c10d import *  # noqa: F403 - the torch.distributed API
from kiln.distributed.distributed_c10d import __all__ as _c10d_all
from kiln.distributed.engine import CompletedWork, Engine, Work
from kiln.distributed.errors import DistBackendError, DistError, DistNetworkError, DistStoreError
from kiln.distributed.rendezvous import register_rendezvous_handler, rendezvous
from kiln.distributed.store import FileStore, HashStore, PrefixStore, Store, TCPStore

__all__ = [
    *_c10d_all,
    "CompletedWork",
    "DistBackendError",
    "DistError",
    "DistNetworkError",
    "DistStoreError",
    "Engine",
    "FileStore",
    "HashStore",
    "PrefixStore",
    "Store",
    "TCPStore",
    "register_rendezvous_handler",
    "rendezvous",
]


def __getattr__(name: str):
    # torch.distributed.GradBucket (documented with DistributedDataParallel, kiln.distributed.ddp)
    if name == "GradBucket":  # DistributedDataParallel's module imports kiln.nn: only when asked for
        from kiln.distributed.ddp import GradBucket

        return GradBucket
    raise AttributeError(f"module 'kiln.distributed' has no attribute '{name}'")
