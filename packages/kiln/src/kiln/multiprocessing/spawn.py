"""Starting ``nprocs`` copies of a function and joining them: :func:`spawn` and :func:`start_processes`
(``torch.multiprocessing.spawn``).

Each child runs ``fn(i, *args)``. An exception in a child is written (with its traceback) to a file of
its own, and the child exits with code 1; the parent waits on the children's sentinels, so a child
that raises, exits or is killed is noticed at once, and never hangs the parent. On the first failure
the others are stopped (``SIGTERM``, then ``SIGKILL`` after a grace period) and
:class:`ProcessRaisedException` or :class:`ProcessExitedException` is raised, with PyTorch's messages.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import tempfile
import time
import traceback
import warnings
import weakref
from collections.abc import Callable

__all__ = [
    "ProcessContext",
    "ProcessException",
    "ProcessExitedException",
    "ProcessRaisedException",
    "spawn",
    "start_processes",
]

_DEFAULT_GRACE_S = 5.0  # after SIGTERM, how long the others get before SIGKILL when no grace_period is given


class ProcessException(Exception):
    """A child started by :func:`spawn` failed: ``error_index`` is its index, ``error_pid`` its pid."""

    __slots__ = ("error_index", "error_pid")

    def __init__(self, msg: str, error_index: int, error_pid: int) -> None:
        super().__init__(msg)
        self.msg = msg
        self.error_index = error_index
        self.error_pid = error_pid

    def __reduce__(self):
        return type(self), (self.msg, self.error_index, self.error_pid)


class ProcessRaisedException(ProcessException):
    """A child raised an exception; the message carries the child's traceback."""


class ProcessExitedException(ProcessException):
    """A child exited with a non-zero code (``exit_code``) or was killed by a signal (``signal_name``,
    e.g. ``"SIGKILL"``; ``exit_code`` is then minus the signal number)."""

    __slots__ = ("exit_code",)

    def __init__(
        self, msg: str, error_index: int, error_pid: int, exit_code: int, signal_name: str | None = None
    ) -> None:
        super().__init__(msg, error_index, error_pid)
        self.exit_code = exit_code
        self.signal_name = signal_name

    def __reduce__(self):
        return type(self), (self.msg, self.error_index, self.error_pid, self.exit_code, self.signal_name)


def _wrap(fn: Callable, i: int, args: tuple, error_file: str) -> None:
    """What each child runs: ``fn(i, *args)``; an exception's traceback goes to ``error_file``."""
    try:
        fn(i, *args)
    except KeyboardInterrupt:
        pass  # the parent is stopping everyone (Ctrl-C): leave quietly
    except Exception:  # noqa: BLE001 - carried to the parent with its traceback
        with open(error_file, "w", encoding="utf-8") as f:
            f.write(traceback.format_exc())
        sys.exit(1)


def _remove(paths: list[str]) -> None:
    for p in paths:
        with contextlib.suppress(OSError):
            os.unlink(p)


class ProcessContext:
    """The processes started by :func:`start_processes` (``join=False``): ``processes``, :meth:`pids`,
    :meth:`join`."""

    def __init__(self, processes: list, error_files: list[str]) -> None:
        self.processes = processes
        self.error_files = error_files
        self.sentinels = {p.sentinel: i for i, p in enumerate(processes)}
        self._cleanup = weakref.finalize(self, _remove, list(error_files))

    def pids(self) -> list[int]:
        """The children's process ids, by index."""
        return [int(p.pid) for p in self.processes]

    def join(self, timeout: float | None = None, grace_period: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (``None``: until something happens) for the children.

        Returns True when all have exited successfully, False when some are still running. When one
        has failed, stops the others and raises :class:`ProcessRaisedException` (it raised) or
        :class:`ProcessExitedException` (non-zero exit code or a signal). ``grace_period``: the others
        get that long to finish before ``SIGTERM``, and as long again before ``SIGKILL``.
        """
        if not self.sentinels:
            return True
        ready = multiprocessing.connection.wait(list(self.sentinels), timeout=timeout)
        failed = None
        for sentinel in ready:
            i = self.sentinels.pop(sentinel)
            self.processes[i].join()
            if self.processes[i].exitcode != 0:
                failed = i
                break
        if failed is None:
            if not self.sentinels:
                self._cleanup()
            return not self.sentinels
        try:
            self._stop_others(grace_period)
            raise self._failure(failed)
        finally:
            self.sentinels.clear()
            self._cleanup()

    def _stop_others(self, grace_period: float | None) -> None:
        alive = [p for p in self.processes if p.is_alive()]
        if grace_period is not None:
            _wait_all(alive, grace_period)
        for p in alive:
            if p.is_alive():
                p.terminate()
        _wait_all(alive, _DEFAULT_GRACE_S if grace_period is None else grace_period)
        for p in alive:
            if p.is_alive():
                p.kill()
            p.join()

    def _failure(self, i: int) -> ProcessException:
        p = self.processes[i]
        try:
            with open(self.error_files[i], encoding="utf-8") as f:
                trace = f.read()
        except OSError:
            trace = ""
        if trace:
            msg = f"\n\n-- Process {i} terminated with the following error:\n{trace}"
            return ProcessRaisedException(msg, i, p.pid)
        code = p.exitcode
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"<Unknown signal {-code}>"
            return ProcessExitedException(f"process {i} terminated with signal {name}", i, p.pid, code, name)
        return ProcessExitedException(f"process {i} terminated with exit code {code}", i, p.pid, code)


def _wait_all(processes: list, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))


def start_processes(
    fn: Callable,
    args: tuple = (),
    nprocs: int = 1,
    join: bool = True,
    daemon: bool = False,
    start_method: str = "spawn",
) -> ProcessContext | None:
    """Start ``nprocs`` processes running ``fn(i, *args)`` (``i`` from 0) with ``start_method``.

    With ``join`` (the default) waits for all of them and returns None, raising as
    :meth:`ProcessContext.join` does when one fails; otherwise returns the :class:`ProcessContext`.
    """
    ctx = multiprocessing.get_context(start_method)
    processes, error_files = [], []
    try:
        for i in range(nprocs):
            fd, path = tempfile.mkstemp(prefix="kiln_mp_error_")
            os.close(fd)
            error_files.append(path)
            p = ctx.Process(target=_wrap, args=(fn, i, args, path), daemon=daemon)
            p.start()
            processes.append(p)
    except BaseException:  # e.g. fn cannot be pickled for a spawn start: stop the ones already started
        for p in processes:
            p.kill()
            p.join()
        _remove(error_files)
        raise
    context = ProcessContext(processes, error_files)
    if not join:
        return context
    while not context.join():
        pass
    return None


def spawn(
    fn: Callable,
    args: tuple = (),
    nprocs: int = 1,
    join: bool = True,
    daemon: bool = False,
    start_method: str = "spawn",
) -> ProcessContext | None:
    """Start ``nprocs`` processes running ``fn(i, *args)`` by the ``spawn`` start method.

    ``fn`` must be defined at the top level of a module (it is pickled). If a child raises or exits
    with a non-zero code, the others are stopped and :class:`ProcessRaisedException` (with the
    child's traceback) or :class:`ProcessExitedException` is raised. Returns None with ``join``,
    else a :class:`ProcessContext`. Another ``start_method`` is deprecated (use
    :func:`start_processes`): it warns, then is used.
    """
    if start_method != "spawn":
        warnings.warn(
            f"This method only supports start_method=spawn (got: {start_method}).\n"
            "To use a different start_method use:\n\t\t kiln.multiprocessing.start_processes(...)",
            FutureWarning,
            stacklevel=2,
        )
    return start_processes(fn, args, nprocs, join, daemon, start_method)
