"""Datasets for kiln-data's tests, at module level so that worker processes can unpickle them."""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import os
import signal
import time

import numpy as np

import kiln
from kiln.data import IterableDataset, get_worker_info


class Squares:
    """A map-style dataset of (float32 vector, int) samples: sample i is ([i, i*i, ...], i)."""

    def __init__(self, n: int = 37, width: int = 300) -> None:
        self.n, self.width = n, width

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return kiln.full((self.width,), float(i)), i


class Heavy:
    """1 MB float32 samples (sample i is filled with i); from index ``slow_from`` on each takes ``delay`` s."""

    def __init__(self, n: int = 200, slow_from: int = 10, delay: float = 60.0) -> None:
        self.n, self.slow_from, self.delay = n, slow_from, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i >= self.slow_from:
            time.sleep(self.delay)
        return kiln.full((1 << 18,), float(i))


class Failing:
    """Raises ValueError at index ``bad``."""

    def __init__(self, n: int = 20, bad: int = 13) -> None:
        self.n, self.bad = n, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i == self.bad:
            raise ValueError(f"sample {i} is broken on purpose")
        return i


class Dying:
    """Kills its worker process at index ``bad`` with ``how``: "exit", "sigkill" or "segfault"."""

    def __init__(self, how: str, n: int = 20, bad: int = 5) -> None:
        self.how, self.n, self.bad = how, n, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i == self.bad and get_worker_info() is not None:
            if self.how == "exit":
                os._exit(3)
            if self.how == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.how == "segfault":
                faulthandler.disable()  # pytest's handler would print this worker's stack: noise, not news
                ctypes.string_at(0)
        return i


class Slow:
    """Sleeps ``delay`` seconds per sample."""

    def __init__(self, n: int = 10, delay: float = 0.2) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(self.delay)
        return i


class Stream(IterableDataset):
    """Yields range(start, end), split between workers as PyTorch's docs show."""

    def __init__(self, start: int, end: int, split: bool = True) -> None:
        self.start, self.end, self.split = start, end, split

    def __iter__(self):
        info = get_worker_info()
        if info is None or not self.split:
            return iter(range(self.start, self.end))
        per = int(np.ceil((self.end - self.start) / info.num_workers))
        lo = self.start + info.id * per
        return iter(range(lo, min(lo + per, self.end)))

    def __len__(self) -> int:
        return self.end - self.start


class WorkerIds:
    """Returns (index, worker id, a random number from kiln's generator in the worker)."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        info = get_worker_info()
        return i, -1 if info is None else info.id, kiln.rand(1).item()


def record_init(worker_id: int) -> None:
    """A worker_init_fn that leaves a mark the dataset can see."""
    os.environ["KILN_TEST_WORKER_INIT"] = str(worker_id)


class InitSeen:
    """Returns what worker_init_fn left in the environment."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        return os.environ.get("KILN_TEST_WORKER_INIT", "none")


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pids, within: float = 5.0) -> list[int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


class Unpicklable:
    """Samples hold a lambda, which cannot travel back from a worker."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        return {"x": i, "f": lambda: i}


class LocalError:
    """Raises an exception whose class is defined inside a function (not importable, not picklable)."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        class OddError(Exception):
            pass

        raise OddError(f"odd {i}")


class Ragged:
    """Sample ``bad`` is a longer vector than the others: default_collate cannot stack its batch."""

    def __init__(self, n: int = 8, bad: int = 5, tensors: bool = False) -> None:
        self.n, self.bad, self.tensors = n, bad, tensors

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        a = np.zeros(4 if i == self.bad else 3, dtype=np.float32)
        return kiln.from_numpy(a) if self.tensors else a


def refuse_batch_with_6(batch):
    """A collate_fn that fails for the batch holding sample 6 (samples are ints here)."""
    if 6 in batch:
        raise ValueError("this batch cannot be collated")
    return batch


def read_lines(proc, n: int, within: float) -> list[str]:
    """The first ``n`` lines ``proc`` writes on stdout (a pipe), or fewer if ``within`` seconds pass first."""
    import select

    fd = proc.stdout.fileno()
    buf = b""
    deadline = time.monotonic() + within
    while buf.count(b"\n") < n:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf += chunk
    return buf.decode().splitlines()[:n]


def kill_alive(pids) -> None:
    """SIGKILL whichever of ``pids`` still run (a failed test's cleanup: no orphans left on the machine)."""
    for pid in pids:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
