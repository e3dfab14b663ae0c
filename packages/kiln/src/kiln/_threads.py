"""``kiln.set_num_threads`` / ``kiln.get_num_threads``: intra-op parallelism, delegated to the backends.

The core's NumPy reference backend has no thread pool of its own; a backend that has one (kiln-cpu)
registers its controls through the ``kiln_register_threading`` hook, and these functions drive every
registered control. Without one, the setting is remembered (and reported back) so that a backend
loaded later starts with it.
"""

from __future__ import annotations

import builtins
import os

_requested: int | None = None


def _default() -> int:
    """What PyTorch users expect by default: ``OMP_NUM_THREADS`` (or ``NUMBA_NUM_THREADS``), else every
    CPU this process may run on."""
    for name in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS"):
        raw = os.environ.get(name, "").strip()
        if raw.isdigit() and int(raw) > 0:
            return int(raw)
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def set_num_threads(int: int) -> None:
    """Use ``int`` threads for intra-op parallelism on the CPU (every backend that has a thread pool)."""
    n = int
    if isinstance(n, bool) or not isinstance(n, builtins.int):
        raise RuntimeError(f"set_num_threads expects an int, but got {type(n).__name__}")
    if n <= 0:
        raise RuntimeError("set_num_threads expects a positive integer")
    global _requested
    _requested = n
    from kiln._plugins import threading_controls

    for setter, _ in threading_controls().values():
        setter(n)


def get_num_threads() -> int:
    """The number of threads used for intra-op parallelism on the CPU (``torch.get_num_threads``)."""
    from kiln._plugins import threading_controls

    for _, getter in threading_controls().values():
        return getter()
    return _requested if _requested is not None else _default()


def _apply_requested(setter) -> None:
    """Give a backend registered after ``set_num_threads`` the requested count."""
    if _requested is not None:
        setter(_requested)
