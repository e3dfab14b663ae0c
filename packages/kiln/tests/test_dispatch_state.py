"""The dispatch state's count of fields away from their defaults (``kiln._state.away``): the hot path skips
the thread-local reads while it is 0, so it must never be 0 while any thread has grad mode off, inference
mode on or a dispatch mode active; and its parts, ``modes_away`` (dispatch modes) and ``inference_away``
(inference mode), which let an op inside ``no_grad`` skip the reads of the other fields."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading

import pytest

import kiln
from kiln import _state
from kiln._modes import DispatchMode


def _records() -> bool:
    x = kiln.ones(2, requires_grad=True)
    return (x * 2).grad_fn is not None


@contextlib.contextmanager
def _another_thread_inside(make_context):
    """Run the block while another thread sits inside ``make_context()`` (entered before the block starts)."""
    inside, leave = threading.Event(), threading.Event()

    def other():
        with make_context():
            inside.set()
            leave.wait(timeout=30)

    t = threading.Thread(target=other)
    t.start()
    try:
        assert inside.wait(timeout=30)
        yield
    finally:
        leave.set()
        t.join(timeout=30)


@pytest.fixture
def baseline():
    """``away[0]`` before the test; the test must leave it there."""
    before = _state.pairs(_state.away)
    yield before
    assert _state.pairs(_state.away) == before


def test_every_grad_mode_switch_counts_and_restores(baseline):
    with kiln.no_grad():
        assert _state.pairs(_state.away) == baseline + 1
        assert not _records()
        with kiln.enable_grad():
            assert _state.pairs(_state.away) == baseline
            assert _records()
    prev = kiln.set_grad_enabled(False)
    assert _state.pairs(_state.away) == baseline + 1 and not kiln.is_grad_enabled()
    prev.__exit__()
    assert kiln.is_grad_enabled()

    @kiln.set_grad_enabled(False)
    def off():
        return kiln.is_grad_enabled()

    assert _state.pairs(_state.away) == baseline  # the decorator form changes nothing until called
    assert off() is False
    with kiln.inference_mode():
        assert _state.pairs(_state.away) == baseline + 2  # grad mode and inference mode
        assert kiln.is_inference_mode_enabled() and kiln.ones(1).is_inference()
        with kiln.inference_mode(False):
            assert not kiln.is_inference_mode_enabled() and not kiln.ones(1).is_inference()
    assert not kiln.ones(1).is_inference()


def test_an_exception_inside_restores_the_count(baseline):
    with pytest.raises(ValueError), kiln.no_grad():
        raise ValueError("inside")
    with pytest.raises(ValueError), kiln.inference_mode():
        raise ValueError("inside")


def test_backward_and_custom_functions_restore_the_count(baseline):
    class Double(kiln.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            assert not kiln.is_grad_enabled()
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    x = kiln.ones(3, requires_grad=True)
    Double.apply(x).sum().backward()
    assert x.grad.tolist() == [2.0, 2.0, 2.0]
    y = (x * x).sum()
    (g,) = kiln.autograd.grad(y, x, create_graph=True)
    assert g.grad_fn is not None


def test_another_threads_no_grad_does_not_switch_this_one_off(baseline):
    inside, leave = threading.Event(), threading.Event()
    seen = {}

    def worker():
        with kiln.no_grad():
            seen["worker records"] = _records()
            inside.set()
            leave.wait(10)

    t = threading.Thread(target=worker)
    t.start()
    assert inside.wait(10)
    assert _state.pairs(_state.away) >= baseline + 1  # the hot path now reads this thread's own state
    assert _records() and kiln.is_grad_enabled()
    leave.set()
    t.join(10)
    assert seen == {"worker records": False}


def test_this_threads_no_grad_holds_while_another_thread_leaves_its_own(baseline):
    entered, left = threading.Event(), threading.Event()

    def worker():
        with kiln.no_grad():
            entered.set()
        left.set()

    with kiln.no_grad():
        t = threading.Thread(target=worker)
        t.start()
        assert entered.wait(10) and left.wait(10)
        t.join(10)
        assert not _records()  # the worker's exit took its own count away, not this thread's
    assert _records()


def test_concurrent_switches_leave_the_count_exact(baseline):
    """Eight threads entering and leaving grad and inference modes at once: every update is kept (each is one
    list operation)."""
    errors = []

    def worker():
        try:
            for _ in range(2000):
                with kiln.no_grad():
                    if kiln.is_grad_enabled():
                        errors.append("grad on inside no_grad")
                with kiln.inference_mode():
                    pass
        except RuntimeError as exc:  # pragma: no cover - reported below
            errors.append(repr(exc))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []


def test_a_dispatch_mode_counts_while_active(baseline):
    seen = []

    class Spy(DispatchMode):
        level = "post_autograd"

        def dispatch(self, opdef, args, redispatch):
            seen.append(opdef.name)
            return redispatch(opdef, args)

    with Spy():
        assert _state.pairs(_state.away) == baseline + 1
        kiln.ones(2) + 1
    kiln.ones(2) + 1
    assert seen.count("add") == 1


def test_each_part_counts_its_own_fields(baseline):
    modes, inference = _state.pairs(_state.modes_away), _state.pairs(_state.inference_away)
    with kiln.no_grad():
        assert (_state.pairs(_state.modes_away), _state.pairs(_state.inference_away)) == (modes, inference)
        with kiln.inference_mode():
            assert _state.pairs(_state.inference_away) == inference + 1 and _state.pairs(_state.modes_away) == modes
            assert kiln.ones(2).is_inference() and kiln.is_inference_mode_enabled()
        with DispatchMode():
            assert _state.pairs(_state.modes_away) == modes + 1 and _state.pairs(_state.inference_away) == inference
    assert (_state.pairs(_state.modes_away), _state.pairs(_state.inference_away)) == (modes, inference)
    assert not kiln.ones(2).is_inference() and not kiln.is_inference_mode_enabled()


@pytest.mark.parametrize("level", ["pre_autograd", "post_autograd"])
def test_a_dispatch_mode_inside_no_grad_sees_every_op(baseline, level):
    """Inside no_grad the other fields are read only while some thread has a mode: a mode entered there, or
    in another thread's no_grad, still sees this thread's ops, and another thread's mode not."""
    seen = []

    class Spy(DispatchMode):
        def dispatch(self, opdef, args, redispatch):
            seen.append(opdef.name)
            return redispatch(opdef, args)

    Spy.level = level
    x = kiln.ones(2)
    with kiln.no_grad():
        with Spy():
            x + 1
            x.mul_(2)
            kiln.add(x, 1)
        x + 1
    assert seen.count("add") == 2 and ("mul" in seen) == (level == "post_autograd")
    seen.clear()

    @contextlib.contextmanager
    def no_grad_and_spy():
        with kiln.no_grad(), Spy():
            yield

    with _another_thread_inside(no_grad_and_spy), kiln.no_grad():
        x + 1
    assert seen == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_fork_while_another_thread_is_in_no_grad_leaves_the_child_working(baseline):
    """A DataLoader worker forked while another thread is inside ``no_grad``: the child inherits that thread's
    count (one too many, which costs only speed) and its own grad mode, on, switches as usual."""
    with _another_thread_inside(kiln.no_grad):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                with kiln.no_grad():
                    ok = not _records()
                os.write(w, b"ok" if ok and _records() else b"wrong")
            finally:
                os._exit(0)
        os.close(w)
        try:
            ready, _, _ = select.select([r], [], [], 20)
            got = os.read(r, 8) if ready else b"hung"
        finally:
            os.close(r)
            if got == b"hung":
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    assert got == b"ok"


def test_a_grad_mode_switch_to_a_truthy_number_keeps_the_count(baseline):
    """``set_grad_mode`` takes a number as its truth value: a switch to the mode already set (1 while on) moves
    no token, and a switch off and back leaves the count where it was."""
    prev = _state.set_grad_mode(1)
    assert prev is True and _state.pairs(_state.away) == baseline and kiln.is_grad_enabled()
    prev = _state.set_grad_mode(0)
    assert _state.pairs(_state.away) == baseline + 1 and not kiln.is_grad_enabled()
    _state.set_grad_mode(prev)
    assert _state.pairs(_state.away) == baseline and _state.away[-1] == 0
