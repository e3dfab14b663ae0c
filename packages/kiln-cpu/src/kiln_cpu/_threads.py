"""How many threads kiln-cpu's kernels use, and the pool that runs them.

The default honours ``NUMBA_NUM_THREADS``, then ``OMP_NUM_THREADS`` (as PyTorch does), then the CPUs
this process may run on; :func:`set_num_threads` overrides it for the whole process (every calling
thread). Kernels are serial Numba loops that release the GIL, so :func:`parallel` splits their work
into ranges and runs them on a plain thread pool (the calling thread takes the first range).
Nothing here imports Numba.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

_requested: int | None = None
_pool: ThreadPoolExecutor | None = None
_pool_workers = 0
_pool_lock = threading.Lock()


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    return None


def _available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def set_num_threads(n: int) -> None:
    """Use ``n`` threads in kiln-cpu's kernels (``torch.set_num_threads``)."""
    global _requested
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"set_num_threads expects an int, got {type(n).__name__}")
    if n < 1:
        raise ValueError("Number of threads must be positive")
    _requested = n


def get_num_threads() -> int:
    """The number of threads kiln-cpu's kernels use (``torch.get_num_threads``)."""
    return _requested or _env_int("NUMBA_NUM_THREADS") or _env_int("OMP_NUM_THREADS") or _available_cpus()


def _forget_pool() -> None:
    """In a forked child the pool's threads do not exist: start a new pool on first use (a DataLoader
    worker that runs a large op would otherwise wait forever)."""
    global _pool, _pool_workers, _pool_lock
    _pool, _pool_workers, _pool_lock = None, 0, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _executor(workers: int) -> ThreadPoolExecutor:
    global _pool, _pool_workers
    with _pool_lock:
        if _pool is None or _pool_workers < workers:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kiln-cpu")
            _pool_workers = workers
        return _pool


_CHUNKS_PER_THREAD = 4  # more ranges than threads: a thread that is descheduled holds up less work


def parallel(fn: Callable, args: tuple, n: int, grain: int) -> None:
    """Run ``fn(*args, lo, hi)`` over ``[0, n)`` on up to :func:`get_num_threads` threads, in ranges of at
    least ``grain`` items that the threads take in turn; returns when all are done and re-raises the
    first error."""
    threads = min(get_num_threads(), n // max(grain, 1))
    if threads <= 1:
        fn(*args, 0, n)
        return
    chunks = min(threads * _CHUNKS_PER_THREAD, n // max(grain, 1))
    step = -(-n // chunks)
    ranges = [(lo, min(lo + step, n)) for lo in range(0, n, step)]
    ticket = itertools.count()  # next() on it is atomic under the GIL: each range runs once

    def work():
        for i in iter(ticket.__next__, None):
            if i >= len(ranges):
                return
            fn(*args, *ranges[i])

    pool = _executor(threads - 1)
    futures = [pool.submit(work) for _ in range(threads - 1)]
    try:
        work()
    finally:
        for f in futures:
            f.result()
