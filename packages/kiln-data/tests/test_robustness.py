"""Failure modes of multi-process loading: errors, dead workers, timeouts, Ctrl-C, garbage collection."""

from __future__ import annotations

import collections
import contextlib
import gc
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from kiln_data_helpers import (
    Dying,
    Failing,
    LocalError,
    Ragged,
    Slow,
    Squares,
    Stream,
    Unpicklable,
    kill_alive,
    read_lines,
    refuse_batch_with_6,
    wait_gone,
)

from kiln.data import DataLoader, _shm

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
# Ctrl-C as in a terminal, even when this test runs under a parent that ignores SIGINT (a background
# job of a shell without job control), which Python would otherwise inherit
signal.signal(signal.SIGINT, signal.default_int_handler)
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


KILLED_SCRIPT = """
import sys, time
sys.path.insert(0, {tests!r})
from kiln_data_helpers import Heavy
from kiln.data import DataLoader, _shm

if {fallback!r}:
    _shm._memfd_create = None  # the POSIX path: shm_open, then shm_unlink at once
# 2 MB batches (two float32 vectors of 1 MB): they travel in shared memory. After 3 batches the
# loader has asked for batches 3 to 6: 3 and 4 (samples 6-9) come back and wait, in flight, while
# both workers sleep in __getitem__ of batches 5 and 6 (samples from 10 on take a minute each).
it = iter(DataLoader(Heavy(200, slow_from=10, delay=60.0), batch_size=2, num_workers=2))
print(" ".join(map(str, it.worker_pids)), it._workers.prefix, flush=True)
held = [next(it) for _ in range(3)]
print("ready", flush=True)
time.sleep(60)
"""


def _kiln_shm() -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith("kiln_"))


@pytest.mark.parametrize("fallback", [False, True], ids=["memfd", "shm_open"])
def test_sigkill_of_the_main_process_mid_epoch_leaves_no_shared_memory_or_workers(fallback):
    before = _kiln_shm()
    count_before = len(os.listdir("/dev/shm"))
    code = textwrap.dedent(KILLED_SCRIPT).format(tests=os.path.dirname(__file__), fallback=fallback)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    pids: list[int] = []
    try:
        lines = read_lines(proc, 2, within=60)
        assert len(lines) == 2 and lines[1] == "ready", (lines, proc.poll())
        pids_text, prefix = lines[0].rsplit(" ", 1)
        pids = [int(p) for p in pids_text.split()]
        time.sleep(0.5)  # batches 3 and 4 reach the queue: in flight when the main process dies
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
        assert wait_gone(pids, within=5.0) == [], "workers (busy in __getitem__) outlived their main process"
        leaked = [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]
        after = _kiln_shm()
        count_after = len(os.listdir("/dev/shm"))
    finally:
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()
        proc.stderr.close()
        kill_alive(pids)
        # What this test measures must not stay on the machine when it fails.
        for name in set(_kiln_shm()) - set(before):
            if name.startswith(f"kiln_{proc.pid}_"):
                os.unlink(os.path.join("/dev/shm", name))
    assert leaked == []
    # Every kiln segment name, whoever made it: other processes' entries in /dev/shm are not ours to count.
    assert after == before, (count_before, count_after, after)


PERSISTENT_SCRIPT = """
import gc, os, sys, traceback
sys.path.insert(0, {tests!r})
from kiln_data_helpers import Squares, wait_gone
from kiln.data import DataLoader

gc.disable()  # only reference counting may free what this script drops
loader = DataLoader(Squares(12, 2000), batch_size=4, num_workers=2, persistent_workers=True)
it = iter(loader)
pids = it.worker_pids
assert sorted(int(i) for b in it for i in b[1]) == list(range(12))

# A child forked while the workers run gets workers of its own for a new epoch, then drops its
# copies (their finalizer runs there): the parent's workers are not the child's to stop or join.
child = os.fork()
if child == 0:
    status = 0
    try:
        assert sorted(int(i) for b in loader for i in b[1]) == list(range(12))
        assert iter(loader).worker_pids != pids
        del loader, it
    except BaseException:
        traceback.print_exc()
        status = 1
    sys.stdout.flush(); sys.stderr.flush()
    os._exit(status)
assert os.waitpid(child, 0)[1] == 0
assert sorted(int(i) for b in loader for i in b[1]) == list(range(12)), "the child stopped the workers"
assert iter(loader).worker_pids == pids

del loader, it
print("left", wait_gone(pids, within=5.0), flush=True)

# A child forked now exits the ordinary way (atexit handlers and all): nothing of the loader is left.
child = os.fork()
if child == 0:
    sys.exit(0)
assert os.waitpid(child, 0)[1] == 0
print("done", flush=True)
"""


def test_persistent_workers_stop_when_the_loader_is_dropped_without_gc():
    code = textwrap.dedent(PERSISTENT_SCRIPT).format(tests=os.path.dirname(__file__))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "left []" in proc.stdout and "done" in proc.stdout, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "can only join" not in proc.stderr, proc.stderr


def test_persistent_workers_stop_at_del_loader_in_process():
    gc.disable()
    try:
        loader = DataLoader(Squares(12, 2000), batch_size=4, num_workers=2, persistent_workers=True)
        it = iter(loader)
        pids = it.worker_pids
        next(it)
        del loader, it
        assert wait_gone(pids, within=5.0) == []
    finally:
        gc.enable()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_getitem_error_names_the_sample_and_its_batch(num_workers):
    with pytest.raises(ValueError, match="sample 13 is broken on purpose") as info:
        list(DataLoader(Failing(20, bad=13), batch_size=4, num_workers=num_workers))
    text = _message_and_notes(info.value)
    assert "while fetching sample index 13 of batch 3 (indices [12, 13, 14, 15])" in text, text


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("tensors", [False, True], ids=["numpy", "kiln"])
def test_default_collate_error_names_the_batch_not_the_last_sample(num_workers, tensors):
    with pytest.raises(RuntimeError, match=r"stack expects each tensor to be equal size.* at entry 1") as info:
        list(DataLoader(Ragged(8, bad=5, tensors=tensors), batch_size=4, num_workers=num_workers))
    text = _message_and_notes(info.value)
    assert "while collating batch 1 (indices [4, 5, 6, 7])" in text, text
    assert "sample index 7" not in text, text


@pytest.mark.parametrize("num_workers", [0, 2])
def test_custom_collate_error_names_the_batch(num_workers):
    loader = DataLoader(list(range(10)), batch_size=3, num_workers=num_workers, collate_fn=refuse_batch_with_6)
    with pytest.raises(ValueError, match="this batch cannot be collated") as info:
        list(loader)
    text = _message_and_notes(info.value)
    assert "while collating batch 2 (indices [6, 7, 8])" in text, text
    if num_workers:
        assert "Caught ValueError in DataLoader worker process 0" in text, text  # batch 2 of 2 workers: worker 0


def test_iterable_collate_error_names_the_batch():
    with pytest.raises(ValueError) as info:
        list(DataLoader(Stream(0, 10), batch_size=3, collate_fn=refuse_batch_with_6))
    assert "while collating batch 2 (stream samples 6 to 8 of this dataset copy)" in _message_and_notes(info.value)


def _message_and_notes(exc: BaseException) -> str:
    return "\n".join([str(exc), *getattr(exc, "__notes__", [])])


def test_no_descriptor_left_open_after_abandoned_and_finished_epochs():
    def open_fds() -> list[str]:
        gc.collect()  # earlier tests' garbage may hold descriptors: free it before counting
        out = []
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
                out.append(os.readlink(f"/proc/self/fd/{fd}"))
        return out

    def cycle() -> None:
        loader = DataLoader(Squares(60, 1000), batch_size=2, num_workers=2, persistent_workers=True)
        for epoch in range(3):
            for i, _batch in enumerate(loader):
                if epoch == 1 and i == 3:
                    break  # batches of the abandoned epoch arrive later: their descriptors must be closed
        loader._iterator._shutdown_workers()
        del loader, _batch  # (a batch's mapping holds a descriptor of its own before Python 3.13)

    # The first cycle starts what a process starts once and keeps (multiprocessing's helpers, whose pipes
    # stay open): counted from after it, a cycle that leaks shows, whatever tests ran in this process before.
    cycle()
    before = open_fds()
    cycle()
    after = open_fds()
    assert [f for f in after if "memfd:kiln_" in f] == []
    new = collections.Counter(after) - collections.Counter(before)
    assert len(after) <= len(before), sorted(new.elements())


def _socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets process ``pid`` holds (``socket:[N]`` links in /proc/<pid>/fd)."""
    out = set()
    with contextlib.suppress(FileNotFoundError):  # gone already: it holds nothing
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    out.add(int(link[len("socket:[") : -1]))
    return out


def _live_unix_sockets() -> set[int]:
    """The inodes of every Unix socket that some process still holds (or that a descriptor in flight keeps)."""
    with open("/proc/net/unix") as f:
        next(f)
        return {int(line.split()[6]) for line in f}


@pytest.mark.parametrize(
    ("abandoned", "other_ctx"),
    [("started first", "fork"), ("started second", "fork"), ("started first", "spawn")],
)
def test_abandoned_iterator_memory_is_not_held_by_another_loaders_workers(monkeypatch, abandoned, other_ctx):
    # Each channel's socket inodes, recorded as the loaders make them: (main process's end, worker's end).
    made: list[tuple[int, int]] = []
    make = _shm.channel

    def recording_channel():
        pair = make()
        made.append((os.fstat(pair[0].fileno()).st_ino, os.fstat(pair[1].fileno()).st_ino))
        return pair

    monkeypatch.setattr(_shm, "channel", recording_channel)

    def start_other():
        loader = DataLoader(
            Squares(40, 10), batch_size=4, num_workers=2, persistent_workers=True, multiprocessing_context=other_ctx
        )
        it = iter(loader)
        next(it)  # its workers run
        ends = made[-2:]
        return loader, it, ends

    if abandoned == "started second":
        other_loader, other_it, other_ends = start_other()
    # 2 workers x 4 prefetched 256 KB batches: in shared memory, and in flight in the sockets when dropped.
    it = iter(DataLoader(Squares(200, 1 << 14), batch_size=4, num_workers=2, prefetch_factor=4))
    ends = made[-2:]
    for _ in range(2):
        batch = next(it)
    del batch  # (a batch alive in this process at a fork would be mapped in the child too)
    gc.collect()
    if abandoned == "started first":
        other_loader, other_it, other_ends = start_other()
    pids = it.worker_pids

    # Every worker of either loader holds its own channel end and no other end of either loader's channels.
    everything = {ino for pair in (*ends, *other_ends) for ino in pair}
    for worker_pids, channels in ((pids, ends), (other_it.worker_pids, other_ends)):
        for worker_id, pid in enumerate(worker_pids):
            assert _socket_inodes(pid) & everything == {channels[worker_id][1]}, (abandoned, worker_id)

    # Dropping the iterator closes its sockets everywhere: the descriptors in flight, and their memory, go.
    time.sleep(0.5)  # let its workers fill their prefetch
    del it
    gc.collect()
    assert wait_gone(pids) == []
    mine = {ino for pair in ends for ino in pair}
    deadline = time.monotonic() + 5.0
    while (left := mine & _live_unix_sockets()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"{abandoned}: the abandoned iterator's sockets are still held"
    assert len(list(other_it)) == 9  # the other loader is unharmed
    del other_loader, other_it


def test_a_forked_child_keeps_no_channel_end_or_received_descriptor():
    # Any child forked by the main process (a worker of a loader started later included) must not keep
    # a loader's socket ends nor a batch's descriptor received but not yet mapped: they would keep
    # that loader's memory allocated for as long as the child lives.
    main_end, worker_end = _shm.channel()
    try:
        payload, fd = _shm.encode(np.arange(4096, dtype=np.float32), "kiln_fork_test", 0, 1)
        assert fd is not None
        try:
            assert _shm.send_fd(worker_end, 1, fd, lambda: True)
        finally:
            os.close(fd)
        got = _shm.recv_fd(main_end, 1, 0)
        watched = {f"socket:[{os.fstat(s.fileno()).st_ino}]" for s in (main_end, worker_end)}
        child = os.fork()  # between receiving the descriptor and mapping it
        if child == 0:
            code = 4  # the check itself failed
            try:
                held = set()
                for f in os.listdir("/proc/self/fd"):
                    with contextlib.suppress(OSError):  # the listing's own descriptor
                        held.add(os.readlink(f"/proc/self/fd/{f}"))
                memfds = [link for link in held if "memfd:kiln_fork_test" in link]
                code = (1 if held & watched else 0) + (2 if memfds else 0)
            finally:
                os._exit(code)
        status = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
        assert status == 0, {1: "the channel's sockets", 2: "the received descriptor", 3: "both"}.get(status, status)
        batch = _shm.decode(payload, got)
        assert batch[100] == 100
    finally:
        main_end.close()
        worker_end.close()
