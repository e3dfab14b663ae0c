"""kiln.multiprocessing.spawn / start_processes against torch.multiprocessing's.

A child that raises, exits with a code or is killed by a signal is reported with PyTorch's exception
types and messages (the raising child's traceback included), the others are stopped, and the parent
never hangs: each case has a deadline. Messages are compared with torch's own, run the same way
(by ``fork``, which is cheap; ``spawn`` is exercised with kiln alone).
"""

from __future__ import annotations

import glob
import os
import pickle
import signal
import sys
import tempfile
import time

import pytest

import kiln
import kiln.multiprocessing as mp

sys.path.insert(0, os.path.dirname(__file__))  # the children's functions, importable by spawned processes
import test_multiprocessing_children as C

DEADLINE = 30.0


def _error_files() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "kiln_mp_error_*")))


@pytest.fixture(autouse=True)
def nothing_left_behind(alone_among_workers):
    """No child process and no error file outlives a test."""
    files = _error_files()
    yield
    assert mp.active_children() == []
    assert _error_files() - files == set()


def _failure(lib, fn, args=(), nprocs=2, start_method="fork", **join):
    """Run ``fn`` under ``lib``'s start_processes and return the exception it raised (within the deadline)."""
    ctx = lib.start_processes(fn, args=args, nprocs=nprocs, join=False, start_method=start_method)
    t0 = time.monotonic()
    with pytest.raises((lib.ProcessRaisedException, lib.ProcessExitedException)) as info:
        while not ctx.join(timeout=DEADLINE, **join):
            assert time.monotonic() - t0 < DEADLINE, "join hung"
    assert time.monotonic() - t0 < DEADLINE
    assert not any(p.is_alive() for p in ctx.processes)  # the others were stopped
    return info.value


def test_spawn_runs_every_rank_on_shared_memory():
    t = kiln.zeros(2, 3).share_memory_()
    assert mp.spawn(C.write_rank, args=(t,), nprocs=2) is None
    assert t.tolist() == [[1.0] * 3, [2.0] * 3]


def test_a_child_that_raises_carries_its_traceback():
    err = _failure(mp, C.raise_in, args=(1,), start_method="spawn")
    assert type(err) is mp.ProcessRaisedException
    assert err.error_index == 1 and isinstance(err.error_pid, int)
    msg = str(err)
    assert msg.startswith("\n\n-- Process 1 terminated with the following error:\nTraceback (most recent call last):\n")
    assert 'in raise_in\n    raise ValueError(f"rank {i} failed on purpose")' in msg
    assert msg.endswith("ValueError: rank 1 failed on purpose\n")


def test_raised_message_has_torchs_shape():
    import torch.multiprocessing as tmp

    msgs = [str(_failure(lib, C.raise_in, args=(0,))) for lib in (tmp, mp)]
    head = "\n\n-- Process 0 terminated with the following error:\nTraceback (most recent call last):\n"
    tail = "ValueError: rank 0 failed on purpose\n"
    assert all(m.startswith(head) and m.endswith(tail) for m in msgs)


@pytest.mark.parametrize(
    ("fn", "args", "message", "code", "signal_name"),
    [
        (C.exit_with, (3,), "process 0 terminated with exit code 3", 3, None),
        (C.kill_self, (), "process 0 terminated with signal SIGKILL", -signal.SIGKILL, "SIGKILL"),
    ],
    ids=["exit-code", "sigkill"],
)
def test_a_child_that_exits_or_is_killed_like_torch(fn, args, message, code, signal_name):
    import torch.multiprocessing as tmp

    for lib in (tmp, mp):
        err = _failure(lib, fn, args=args, nprocs=1)
        assert type(err).__name__ == "ProcessExitedException"
        assert (str(err), err.error_index, err.exit_code, err.signal_name) == (message, 0, code, signal_name)


def test_sigkill_by_spawn():
    err = _failure(mp, C.kill_self, nprocs=2, start_method="spawn")
    assert isinstance(err, mp.ProcessExitedException) and err.signal_name == "SIGKILL"
    assert str(err) in ("process 0 terminated with signal SIGKILL", "process 1 terminated with signal SIGKILL")


def test_join_with_a_timeout_returns_false_then_true():
    ctx = mp.start_processes(C.sleep_for, args=(0.8,), nprocs=2, join=False, start_method="fork")
    assert isinstance(ctx, mp.ProcessContext)
    assert ctx.pids() == [p.pid for p in ctx.processes] and len(set(ctx.pids())) == 2
    t0 = time.monotonic()
    assert ctx.join(timeout=0.05) is False
    assert time.monotonic() - t0 < 0.5
    t0 = time.monotonic()
    while not ctx.join(timeout=DEADLINE):
        assert time.monotonic() - t0 < DEADLINE
    assert ctx.join() is True  # joining again is harmless
    assert [p.exitcode for p in ctx.processes] == [0, 0]


def test_a_sibling_that_ignores_sigterm_is_killed_after_the_grace_period():
    t0 = time.monotonic()
    err = _failure(mp, C.ignore_sigterm_and_sleep, grace_period=0.3)
    assert isinstance(err, mp.ProcessRaisedException) and err.error_index == 0
    assert time.monotonic() - t0 < 10.0


def test_an_unpicklable_function_fails_in_the_parent():
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        mp.spawn(lambda i: None, nprocs=2)


def test_spawn_with_another_start_method_warns_like_torch():
    t = kiln.zeros(2, 3).share_memory_()
    with pytest.warns(FutureWarning, match=r"This method only supports start_method=spawn \(got: fork\)"):
        mp.spawn(C.write_rank, args=(t,), nprocs=2, start_method="fork")
    assert t.tolist() == [[1.0] * 3, [2.0] * 3]
    with pytest.raises(ValueError, match="cannot find context for 'bogus'"), pytest.warns(FutureWarning):
        mp.spawn(C.write_rank, args=(t,), start_method="bogus")


def test_no_processes_is_a_finished_context():
    ctx = mp.start_processes(C.sleep_for, args=(0,), nprocs=0, join=False)
    assert ctx.join() is True and ctx.pids() == []


def test_exceptions_keep_their_fields_through_pickle_like_torch():
    import torch.multiprocessing as tmp

    for lib in (tmp, mp):
        e = lib.ProcessExitedException("process 2 terminated with signal SIGTERM", 2, 1234, -15, "SIGTERM")
        back = pickle.loads(pickle.dumps(e))
        assert (str(back), back.error_index, back.error_pid, back.exit_code, back.signal_name) == (
            "process 2 terminated with signal SIGTERM",
            2,
            1234,
            -15,
            "SIGTERM",
        )
        r = pickle.loads(pickle.dumps(lib.ProcessRaisedException("boom", 1, 99)))
        assert (str(r), r.error_index, r.error_pid) == ("boom", 1, 99)
        base = sys.modules[f"{lib.__name__}.spawn"].ProcessException
        assert issubclass(lib.ProcessRaisedException, base) and issubclass(lib.ProcessExitedException, base)
