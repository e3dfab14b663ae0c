"""How many threads kiln-cpu's kernels use, and the pool that runs them.

The default is the core's one rule (``kiln._threads.default_num_threads``: ``MKL_NUM_THREADS``, else
``OMP_NUM_THREADS`` as PyTorch, then ``NUMBA_NUM_THREADS``, then the CPUs this process may run on);
:func:`set_num_threads` overrides it for the whole process (every calling thread). Kernels are serial
Numba loops that release the GIL, so :func:`parallel` splits their work into ranges that a team of
worker threads and the calling thread take in turn. Between jobs a worker
spins for a while without the GIL (:mod:`kiln_cpu._jit_spin`) before it sleeps, so a job posted soon
after the last one starts within microseconds instead of a thread wake-up (40 us or more on a virtual
machine): a no-op job on two threads took 95 us on a thread pool, 12 us on the team. Importing this
module imports no Numba (the team, and its spin loop, start on the first job).
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable

# the core owns the rule; to be imported from ``kiln.backend`` once that public module re-exports them
from kiln.backend import check_num_threads, default_num_threads

_requested: int | None = None


def set_num_threads(n: int) -> None:
    """Use ``n`` threads in kiln-cpu's kernels (``torch.set_num_threads``: a bad count raises its
    ``RuntimeError``, through the core's check)."""
    global _requested
    _requested = check_num_threads(n)


def get_num_threads() -> int:
    """The number of threads kiln-cpu's kernels use (``torch.get_num_threads``)."""
    return _requested or default_num_threads()


_SPIN = 12000
"""Pauses (about 13 ns each here, so 150 us) that an idle worker spins, without the GIL, watching for the
next job before it sleeps, and that a caller spins waiting for the workers: waking a sleeping thread
takes 40 us or more on a virtual machine, and eager ops follow each other within tens of microseconds
of Python (OpenMP runtimes spin the same way between parallel regions, for much longer by default).
With 50 us a full sum of 512K float32, whose op spends about 50 us in Python around its kernel, found
its worker asleep on every call: 0.15 ms, 0.07 ms with 150 us (softmax of 4096x1024: 1.58 -> 1.40 ms).
Not much longer: a spinning worker holds a core that BLAS's own threads may need (before small
products kept OpenBLAS to one thread, a small CNN's step took 19.9 ms with 50 us of spinning and 21 ms
with 200 us; now 9.0-9.9 ms with 150 us, 9.7-10.6 ms with 50 us)."""
_SETTLE = 400
"""Pauses (about 5 us) a worker spins on after it sees a job posted, before it takes the GIL: by then the
caller has let the GIL go (it is inside its own Numba share), so the worker does not sleep on it (a
sleeping GIL waiter is woken 30 us or more later)."""


class _Team:
    """``workers`` daemon threads that run one job at a time with the calling thread. A job is posted by
    raising ``posted`` (an int64 counter the workers spin on, then sleep on ``cond``: the poster notifies
    only when some worker sleeps); worker ``w`` reports the job numbered ``g`` done by setting
    ``finished[w] = g`` from inside its next spin, so a caller that sees every slot there takes the GIL
    without waiting for it (a thread waiting for the GIL sleeps, and a wake costs 40 us or more on a
    virtual machine), and a worker still busy with an older job (its caller interrupted) is not counted
    for a newer one. One caller at a time (``busy``): another thread's call, or a call from inside a job,
    runs on its own thread instead."""

    def __init__(self, workers: int):
        import numpy as np

        from kiln_cpu._jit_spin import all_reached, finish_then_spin, spin_below

        self.spin, self.all_reached, self.finish_then_spin = spin_below, all_reached, finish_then_spin
        self.workers = workers
        self.posted = np.zeros(1, np.int64)
        self.finished = np.zeros(workers, np.int64)
        self.cond = threading.Condition()
        self.busy = threading.Lock()
        self.posting: tuple[int, Callable | None] = (0, None)  # the job's number and the job
        self.error: BaseException | None = None
        self.closed = False
        self.sleepers = 0  # workers asleep on cond, waiting for a job
        self.waiting = False  # the caller is asleep on cond, waiting for the workers
        for w in range(workers):
            threading.Thread(target=self._serve, args=(w,), name=f"kiln-cpu-{w}", daemon=True).start()

    def _serve(self, w: int) -> None:
        seen = 0
        got = self.spin(self.posted, 1, _SPIN, _SETTLE)
        while True:
            if got <= seen:  # no job within the spin: sleep (after waking a caller that sleeps)
                with self.cond:
                    if self.waiting:
                        self.cond.notify_all()
                    self.sleepers += 1
                    while self.posted[0] <= seen and not self.closed:
                        self.cond.wait()
                    self.sleepers -= 1
                    if self.posted[0] <= seen:  # closed, and every job posted before has run
                        return
            seen, job = self.posting  # one read: the job and its number agree
            try:
                if job is not None:  # None: its caller was interrupted and has dropped it
                    job()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, which re-raises it
                with self.cond:
                    if self.posted[0] == seen:  # not a job whose caller stopped waiting (interrupted)
                        self.error = self.error or exc
            finally:
                # no reference to the job past it: its closure holds the kernel's arrays, which must be
                # freed when the caller is done (kept until the next job, batch norm's backward
                # allocated fresh memory each step: 2.5 ms -> 3.3 ms)
                job = None
            if self.waiting:  # the caller sleeps: report under the lock and wake it
                with self.cond:
                    got = self.finish_then_spin(self.finished, w, seen, self.posted, seen + 1, 0, 0)
                    self.cond.notify_all()
                got = self.spin(self.posted, seen + 1, _SPIN, _SETTLE)
            else:
                got = self.finish_then_spin(self.finished, w, seen, self.posted, seen + 1, _SPIN, _SETTLE)

    def run(self, job: Callable) -> bool:
        """Run ``job()`` on every worker and on the calling thread; returns when all are done (True) and
        re-raises the first error. False, and nothing run, when the team was closed meanwhile."""
        with self.cond:
            if self.closed:
                return False
            self.error = None
            number = int(self.posted[0]) + 1
            self.posting = (number, job)
            self.posted[0] = number
            if self.sleepers:
                self.cond.notify_all()
        try:
            job()
        finally:
            if not self.all_reached(self.finished, number, _SPIN):
                with self.cond:
                    self.waiting = True
                    try:
                        while (self.finished < number).any():
                            self.cond.wait()
                    finally:
                        self.waiting = False
            self.posting = (number, None)  # the job's closure (and its arrays) freed now
        if self.error is not None:
            raise self.error
        return True

    def close(self) -> None:
        """Let the workers exit once idle (a team of another size replaces this one): a job posted before
        still runs; later calls of :meth:`run` run nothing."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()


_team: _Team | None = None
_team_lock = threading.Lock()


def _forget_pool() -> None:
    """In a forked child the team's threads do not exist: start a new team on first use (a DataLoader
    worker that runs a large op would otherwise wait forever)."""
    global _team, _team_lock
    _team, _team_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _team_of(workers: int) -> _Team:
    global _team
    with _team_lock:
        if _team is None or _team.workers != workers:
            if _team is not None:
                _team.close()
            _team = _Team(workers)
        return _team


_CHUNKS_PER_THREAD = 2  # more ranges than threads: a thread that is descheduled holds up less work


def parallel(fn: Callable, args: tuple, n: int, grain: int) -> None:
    """Run ``fn(*args, lo, hi)`` over ``[0, n)`` on up to :func:`get_num_threads` threads, in ranges of at
    least ``grain`` items that the threads take in turn; returns when all are done and re-raises the
    first error."""
    if n < 2 * grain:  # one range: on the calling thread, without reading the thread count (the
        fn(*args, 0, n)  # environment's, until set_num_threads is called: half a microsecond a read)
        return
    threads = min(get_num_threads(), n // max(grain, 1))
    if threads <= 1:
        fn(*args, 0, n)
        return
    team = _team_of(threads - 1)
    if not team.busy.acquire(blocking=False):  # another caller's job, or a call from inside a job
        fn(*args, 0, n)
        return
    try:
        chunks = min(threads * _CHUNKS_PER_THREAD, n // max(grain, 1))
        chunks -= chunks % threads  # a whole number of ranges per thread: 3 ranges on 2 threads take 2 ranges' time
        ranges = [(n * i // chunks, n * (i + 1) // chunks) for i in range(chunks)]  # sizes differ by 1 at most
        ticket = itertools.count()  # next() on it is atomic under the GIL: each range runs once

        def work():
            for i in iter(ticket.__next__, None):
                if i >= len(ranges):
                    return
                fn(*args, *ranges[i])

        if not team.run(work):  # replaced by a team of another size meanwhile
            fn(*args, 0, n)
    finally:
        team.busy.release()
