"""``kiln.multiprocessing``: Python's :mod:`multiprocessing` with kiln tensors shared, not copied
(``torch.multiprocessing``).

Every name of :mod:`multiprocessing` is here (``Process``, ``Queue``, ``SimpleQueue``, ``Pool``,
``get_context``, ``set_start_method``, ``cpu_count``, ``Manager``, ...), the same objects. What
importing this module adds is the pickling of kiln tensors by their shared memory
(:mod:`kiln.multiprocessing.reductions`): a CPU tensor put in a ``Queue``, passed to a ``Process``
started by ``spawn`` or ``forkserver`` or to a ``Pool`` is moved to shared memory (in place, with its
views) and the receiving process maps the same memory; children started by ``fork`` inherit it. With
:meth:`kiln.nn.Module.share_memory` this is Hogwild training::

    import kiln.multiprocessing as mp

    model.share_memory()
    procs = [mp.Process(target=train, args=(rank, model)) for rank in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()

and :func:`spawn` / :func:`start_processes` start ``fn(i, *args)`` in ``nprocs`` processes, raising
when one fails. Shared memory is released when the last process holding it lets go of it.
"""

from __future__ import annotations

import multiprocessing as _multiprocessing

from kiln import _shared_memory
from kiln.multiprocessing.reductions import init_reductions
from kiln.multiprocessing.spawn import (
    ProcessContext,
    ProcessException,
    ProcessExitedException,
    ProcessRaisedException,
    spawn,
    start_processes,
)

__all__ = [
    "ProcessContext",
    "ProcessException",
    "ProcessExitedException",
    "ProcessRaisedException",
    "get_all_sharing_strategies",
    "get_sharing_strategy",
    "init_reductions",
    "set_sharing_strategy",
    "spawn",
    "start_processes",
]

# Python's multiprocessing API, re-exported as torch.multiprocessing does (not in __all__: the objects are
# the standard library's, documented there).
for _name in _multiprocessing.__all__:
    globals()[_name] = getattr(_multiprocessing, _name)
del _name


def get_all_sharing_strategies() -> set[str]:
    """The sharing strategies of this platform: ``{"file_descriptor", "file_system"}``.

    ``"file_descriptor"`` (the default): each shared storage keeps a descriptor of a nameless memory
    file, which other processes receive; nothing is ever left in ``/dev/shm``, whatever dies, but each
    shared storage holds descriptors (raise ``ulimit -n`` for many). ``"file_system"``: storages live in
    named segments (``/dev/shm/kiln_mp_*``) that hold no descriptor; a name is unlinked when the last
    process holding it lets go (or, for processes killed outright, when the program ends).
    """
    return set(_shared_memory.STRATEGIES)


def get_sharing_strategy() -> str:
    """The current strategy for sharing CPU tensors between processes (see :func:`get_all_sharing_strategies`)."""
    return _shared_memory.get_strategy()


def set_sharing_strategy(new_strategy: str) -> None:
    """Set the strategy for storages shared from now on, in this process (see :func:`get_all_sharing_strategies`).

    Storages already shared keep theirs.
    """
    strategies = get_all_sharing_strategies()
    if new_strategy not in strategies:
        raise AssertionError(f"invalid sharing strategy '{new_strategy}', expected one of {strategies}")
    _shared_memory.set_strategy(new_strategy)
