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


_ENV_ORDER = ("MKL_NUM_THREADS", "OMP_NUM_THREADS", "NUMBA_NUM_THREADS")
"""The environment variables :func:`default_num_threads` reads, first match wins. PyTorch's intra-op
default (ATen's ``intraop_default_num_threads``) takes ``MKL_NUM_THREADS``, else ``OMP_NUM_THREADS``;
PyTorch has no Numba, so ``NUMBA_NUM_THREADS`` (what Numba's own pool reads) comes last."""


def default_num_threads() -> int:
    """The intra-op thread count a process starts with: the one rule for the core and every backend.

    As PyTorch: ``MKL_NUM_THREADS``, else ``OMP_NUM_THREADS``, then (kiln's addition) ``NUMBA_NUM_THREADS``,
    the first that holds a positive integer (a value that is not, such as ``0`` or ``abc``, is skipped,
    as PyTorch ignores it); else every CPU this process may run on (read once per process, as PyTorch
    reads it once). The variables are read at each call, so a backend's ``get_num_threads`` reports the
    environment it runs in until :func:`set_num_threads` is called; a product or a parallel loop asks
    each time, so the reading is cheap (:func:`_environment`) and its result remembered while they hold.
    """
    global _last
    raw = _environment()
    if _last[0] == raw:
        return _last[1]
    n = None
    for value in raw:
        value = (value or "").strip()
        if value.isdigit() and int(value) > 0:
            n = int(value)
            break
    if n is None:
        n = _cpus()
    _last = (raw, n)
    return n


_last: tuple = (None, 0)  # (the variables as last read, the count they gave)


def _environment() -> tuple:
    """The raw values of :data:`_ENV_ORDER` (None where unset). CPython's ``os.environ`` keeps them in a
    dict of encoded names and values, read directly: ``os.environ.get`` raises and catches a ``KeyError``
    for each name that is not set (0.7 us each); another mapping is read the public way."""
    data = getattr(os.environ, "_data", None)
    encode = getattr(os.environ, "encodekey", None)
    if data.__class__ is dict and encode is not None:
        keys = _ENCODED.get(encode)
        if keys is None:
            keys = _ENCODED[encode] = tuple(encode(name) for name in _ENV_ORDER)
        return tuple([data.get(k) for k in keys])
    return tuple([os.environ.get(name) for name in _ENV_ORDER])


_ENCODED: dict = {}  # os.environ's key encoder -> the encoded names of _ENV_ORDER


def _cpus() -> int:
    """Every CPU this process may run on, read once (again in a forked child)."""
    global _cpu_count
    if _cpu_count is None:
        try:
            _cpu_count = len(os.sched_getaffinity(0)) or 1
        except AttributeError:  # not Linux
            _cpu_count = os.cpu_count() or 1
    return _cpu_count


_cpu_count: int | None = None


def _forget_cpus() -> None:
    global _cpu_count, _last
    _cpu_count, _last = None, (None, 0)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_cpus)


def check_num_threads(n: object) -> int:
    """``n`` if it is a valid thread count, else the ``RuntimeError`` (type and message) that
    ``torch.set_num_threads`` raises: every backend's ``set_num_threads`` validates through this."""
    if isinstance(n, bool) or not isinstance(n, builtins.int):
        raise RuntimeError(f"set_num_threads expects an int, but got {type(n).__name__}")
    if n <= 0:
        raise RuntimeError("set_num_threads expects a positive integer")
    return n


def set_num_threads(int: int) -> None:
    """Use ``int`` threads for intra-op parallelism on the CPU (every backend that has a thread pool)."""
    n = check_num_threads(int)
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
    return _requested if _requested is not None else default_num_threads()


def _apply_requested(setter) -> None:
    """Give a backend registered after ``set_num_threads`` the requested count."""
    if _requested is not None:
        setter(_requested)
