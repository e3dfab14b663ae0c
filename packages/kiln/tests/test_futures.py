"""kiln.futures: completion once, callbacks, chaining (errors included), collect_all/wait_all, and
futures driven by work in flight (how kiln.distributed's ``Work.get_future()`` makes them)."""

from __future__ import annotations

import threading

import pytest

import kiln.jit
from kiln.futures import Future, collect_all, wait_all


def test_completes_once_and_runs_callbacks():
    f = Future()
    seen = []
    f.add_done_callback(lambda fut: seen.append(fut.value()))
    assert not f.done()
    with pytest.raises(RuntimeError, match="not completed yet"):
        f.value()
    f.set_result(5)
    assert f.done() and f.wait() == 5 and seen == [5]
    with pytest.raises(RuntimeError, match="only be marked completed once"):
        f.set_result(6)
    f.add_done_callback(lambda fut: seen.append("late"))  # runs at once
    assert seen == [5, "late"]


def test_errors_propagate_through_then():
    f = Future()
    doubled = f.then(lambda fut: fut.value() * 2)
    broken = f.then(lambda fut: 1 / 0)
    f.set_result(4)
    assert doubled.wait() == 8
    with pytest.raises(ZeroDivisionError):
        broken.wait()
    g = Future()
    g.set_exception(ValueError("bad"))
    with pytest.raises(ValueError, match="bad"):
        g.then(lambda fut: fut.value()).wait()
    with pytest.raises(TypeError, match="not an Exception"):
        Future().set_exception("bad")


def test_collect_all_and_wait_all():
    fs = [Future() for _ in range(3)]
    every = collect_all(fs)
    for i, f in enumerate(fs):
        assert not every.done()
        threading.Timer(0.01 * i, f.set_result, args=(i,)).start()
    assert [f.value() for f in every.wait()] == [0, 1, 2]
    assert wait_all(fs) == [0, 1, 2]
    assert collect_all([]).wait() == []


def test_a_driven_future_completes_when_waited_on():
    f = Future()
    ready = [False]
    f._driver, f._ready = (lambda: f.set_result("driven")), (lambda: ready[0])
    chained = f.then(lambda fut: fut.value().upper())
    assert not f.done() and not chained.done()
    ready[0] = True
    assert chained.done() and chained.wait() == "DRIVEN"


def test_jit_fork_returns_a_completed_future():
    fut = kiln.jit.fork(lambda a, b: a + b, 2, b=3)
    assert isinstance(fut, Future) and fut.done() and kiln.jit.wait(fut) == 5


def test_a_raising_callback_does_not_starve_the_others(caplog):
    f = Future()
    seen = []
    f.add_done_callback(lambda fut: 1 / 0)
    chained = f.then(lambda fut: fut.value() + 1)
    f.add_done_callback(lambda fut: seen.append(fut.value()))
    f.set_result(1)
    assert seen == [1] and chained.wait() == 2
    assert "a callback of a kiln.futures.Future raised" in caplog.text
