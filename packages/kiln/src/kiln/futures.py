"""``kiln.futures`` (``torch.futures``): the result of work that finishes later.

A :class:`Future` completes once, with a value or an error; ``then`` chains work onto it. kiln's
futures come from ``kiln.jit.fork`` (completed at once: kiln runs eagerly) and from asynchronous
collectives (``kiln.distributed``: ``work.get_future()``), whose futures complete when someone waits on
them or asks whether they are done.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Future", "collect_all", "wait_all"]

_log = logging.getLogger(__name__)


class Future:
    """The result of asynchronous work (``torch.futures.Future``): ``wait``, ``value``, ``done``,
    ``then``, ``add_done_callback``, ``set_result`` and ``set_exception``."""

    def __init__(self, *, devices: list | None = None) -> None:
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Future], None]] = []
        self._lock = threading.Lock()
        # For futures of work in flight: _drive() completes the future (blocking), _ready() says
        # whether it would complete without blocking.
        self._driver: Callable[[], None] | None = None
        self._ready: Callable[[], bool] | None = None

    def _drive(self) -> None:
        driver, self._driver = self._driver, None
        if driver is not None and not self._done.is_set():
            try:
                driver()
            except BaseException:  # interrupted (Ctrl-C) before completing: a later wait() drives again
                if not self._done.is_set():
                    self._driver = driver
                raise

    def done(self) -> bool:
        """Whether the value (or an error) is set."""
        if not self._done.is_set() and self._ready is not None and self._ready():
            self._drive()
        return self._done.is_set()

    def wait(self) -> Any:
        """Block until the future completes; return its value or raise its error."""
        self._drive()
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value

    def value(self) -> Any:
        """The value of a completed future (raises its error)."""
        if not self.done():
            raise RuntimeError("Future.value() called on a future that is not completed yet")
        return self.wait()

    def _complete(self, value: Any, error: BaseException | None) -> None:
        with self._lock:
            if self._done.is_set():
                raise RuntimeError("Future can only be marked completed once.")
            self._value, self._error = value, error
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            try:
                cb(self)
            except Exception:  # noqa: BLE001 - one callback's error must not starve the others (PyTorch logs it)
                _log.exception("a callback of a kiln.futures.Future raised")

    def set_result(self, result: Any) -> None:
        """Complete the future with ``result`` and run its callbacks."""
        self._complete(result, None)

    def set_exception(self, result: BaseException) -> None:
        """Complete the future with an error (raised by :meth:`wait`) and run its callbacks."""
        if not isinstance(result, BaseException):
            raise TypeError(f"{result!r} is of type {type(result)}, not an Exception.")
        self._complete(None, result)

    def add_done_callback(self, callback: Callable[[Future], None]) -> None:
        """Call ``callback(self)`` when the future completes (at once, if it has)."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        callback(self)

    def then(self, callback: Callable[[Future], Any]) -> Future:
        """A new future, completed with ``callback(self)`` once this one completes (with the error
        ``callback`` raises, if it does)."""
        out = Future()
        out._driver, out._ready = self._drive, (lambda: self.done())

        def chain(fut: Future) -> None:
            try:
                value = callback(fut)
            except Exception as e:  # noqa: BLE001 - the callback's error goes to the chained future
                out.set_exception(e)
            else:
                out.set_result(value)

        self.add_done_callback(chain)
        return out


def collect_all(futures: list[Future]) -> Future:
    """A future completed with the list of ``futures`` once all of them are."""
    out = Future()
    futures = list(futures)
    out._driver = lambda: [f.wait() if not f.done() else None for f in futures] and None
    out._ready = lambda: all(f.done() for f in futures)
    remaining = [len(futures)]
    lock = threading.Lock()

    def one_done(_: Future) -> None:
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
        if last:
            out.set_result(futures)

    if not futures:
        out.set_result([])
    for f in futures:
        f.add_done_callback(one_done)
    return out


def wait_all(futures: list[Future]) -> list[Any]:
    """Wait for every future; their values, in order (the first error is raised)."""
    return [f.wait() for f in futures]
