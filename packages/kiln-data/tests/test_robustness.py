"""Failure modes of multi-process loading: errors, dead workers, timeouts, Ctrl-C, garbage collection."""

from __future__ import annotations

import gc
import os
import pickle
import subprocess
import sys
import textwrap
import time

import pytest
from kiln_data_helpers import Dying, Failing, LocalError, Slow, Squares, Unpicklable, wait_gone

from kiln.data import DataLoader

pytestmark = pytest.mark.usefixtures("no_shm_leak")


def test_worker_exception_keeps_type_traceback_worker_and_index():
    loader = DataLoader(Failing(20, bad=13), batch_size=4, num_workers=2)
    it = iter(loader)
    pids = it.worker_pids
    with pytest.raises(ValueError) as info:
        list(it)
    msg = str(info.value)
    assert "Caught ValueError in DataLoader worker process 1" in msg  # batch 3 (indices 12-15) went to worker 1
    assert "sample index 13" in msg
    assert "sample 13 is broken on purpose" in msg
    assert "Traceback (most recent call last)" in msg and "kiln_data_helpers.py" in msg and "__getitem__" in msg
    assert wait_gone(pids) == []


def test_unpicklable_batch_and_unpicklable_exception_raise_instead_of_hanging():
    start = time.monotonic()
    with pytest.raises(Exception, match="in DataLoader worker process 0 while sending batch 0"):
        list(DataLoader(Unpicklable(), batch_size=2, num_workers=1, collate_fn=lambda b: b))
    with pytest.raises(RuntimeError, match="Caught OddError in DataLoader worker process 0") as info:
        list(DataLoader(LocalError(), batch_size=2, num_workers=1))
    assert "odd 0" in str(info.value)
    assert time.monotonic() - start < 10


def test_exception_in_main_process_is_the_original():
    with pytest.raises(ValueError, match="sample 13 is broken"):
        list(DataLoader(Failing(20, bad=13), batch_size=4))


def test_worker_init_fn_error_is_raised():
    def bad_init(worker_id):
        raise KeyError("no such thing")

    with pytest.raises(KeyError, match="in DataLoader worker process"):
        list(DataLoader(list(range(4)), num_workers=1, worker_init_fn=bad_init))


@pytest.mark.parametrize(("how", "code"), [("exit", "exit code 3"), ("sigkill", "SIGKILL"), ("segfault", "SIGSEGV")])
def test_dead_worker_raises_promptly(how, code):
    loader = DataLoader(Dying(how, bad=5), batch_size=2, num_workers=2, timeout=30)
    it = iter(loader)
    pids = it.worker_pids
    start = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        list(it)
    assert time.monotonic() - start < 5
    msg = str(info.value)
    assert "DataLoader worker 0" in msg and code in msg, msg  # batch 2 (indices 4, 5) went to worker 0
    assert wait_gone(pids) == []


def test_timeout_raises():
    it = iter(DataLoader(Slow(4, delay=3.0), batch_size=1, num_workers=1, timeout=0.3))
    pids = it.worker_pids
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"DataLoader timed out after 0.3 seconds"):
        next(it)
    assert time.monotonic() - start < 2.5
    assert wait_gone(pids) == []


def test_garbage_collected_iterator_stops_workers():
    it = iter(DataLoader(Squares(40, 2000), batch_size=2, num_workers=2))
    next(it)
    pids = it.worker_pids
    prefix = it._workers.prefix
    time.sleep(0.2)  # let the workers fill the queue with batches in shared memory
    del it
    gc.collect()
    assert wait_gone(pids) == []
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]


def test_break_out_of_loop_then_gc():
    loader = DataLoader(Squares(40), batch_size=2, num_workers=2)
    for i, _ in enumerate(loader):
        if i == 1:
            break
    gc.collect()  # the for loop's iterator is unreachable now


SCRIPT = """
import os, signal, sys, time
sys.path.insert(0, {tests!r})
from kiln_data_helpers import Squares
from kiln.data import DataLoader

it = iter(DataLoader(Squares(400, 2000), batch_size=2, num_workers=2))
print(" ".join(map(str, it.worker_pids)), it._workers.prefix, flush=True)
for i, batch in enumerate(it):
    if i == 3:
        {action}
"""


@pytest.mark.parametrize(
    "action",
    ["os.kill(os.getpid(), signal.SIGINT); time.sleep(5)", "raise KeyboardInterrupt"],
    ids=["sigint", "keyboardinterrupt"],
)
def test_ctrl_c_leaves_no_orphans_or_shared_memory(action):
    code = textwrap.dedent(SCRIPT).format(tests=os.path.dirname(__file__), action=action)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "KeyboardInterrupt" in proc.stderr, proc.stderr
    pids_line, prefix = proc.stdout.split("\n")[0].rsplit(" ", 1)
    pids = [int(p) for p in pids_line.split()]
    assert wait_gone(pids) == []
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]
    assert "leaked" not in proc.stderr


def test_failed_worker_start_raises():
    loader = DataLoader(list(range(4)), num_workers=2, multiprocessing_context="spawn", collate_fn=lambda b: b)
    with pytest.raises((AttributeError, TypeError, pickle.PicklingError)):
        iter(loader)


def test_workers_exit_when_the_main_process_is_killed():
    code = textwrap.dedent(SCRIPT).format(tests=os.path.dirname(__file__), action="os.kill(os.getpid(), 9)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -9
    pids_line, prefix = proc.stdout.split("\n")[0].rsplit(" ", 1)
    try:
        assert wait_gone([int(p) for p in pids_line.split()], within=5.0) == []
    finally:  # nobody was left to free the batches in flight: that is what this test cleans up
        for name in os.listdir("/dev/shm"):
            if name.startswith(prefix):
                os.unlink(os.path.join("/dev/shm", name))
