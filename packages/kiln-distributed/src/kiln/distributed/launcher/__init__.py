"""The machinery behind ``kiln-run`` (:mod:`kiln.distributed.run`): the per-node :class:`Agent`, its
worker processes (:mod:`.workers`) and its PMI server for MPI programs (:mod:`.pmi`).

Use it from Python as ``Agent(LaunchConfig(nproc_per_node=2), [sys.executable, "train.py"]).run()``.
Nothing here imports torch or mpi4py.
"""

from __future__ import annotations

from kiln.distributed.launcher.agent import Agent, ChildFailedError, LaunchConfig, RendezvousError, print_failure
from kiln.distributed.launcher.pmi import PMIAbort, PMIServer, process_mapping
from kiln.distributed.launcher.workers import ProcessFailure, WorkerGroup

__all__ = [
    "Agent",
    "ChildFailedError",
    "LaunchConfig",
    "PMIAbort",
    "PMIServer",
    "ProcessFailure",
    "RendezvousError",
    "WorkerGroup",
    "print_failure",
    "process_mapping",
]
