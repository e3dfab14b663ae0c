"""The DataLoader worker process: fetch what the main process asks for, send batches back.

Also :func:`get_worker_info`, the fetchers shared with the single-process path, and the wrapper that
carries a worker's exception (type, where, traceback text) to the main process.
"""

from __future__ import annotations

import os
import pickle
import queue
import random
import signal
import sys
import traceback
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler

import kiln
from kiln.data import _shm

__all__ = ["WorkerInfo", "get_worker_info"]

_worker_info: WorkerInfo | None = None
_PARENT_CHECK_S = 1.0  # how often an idle worker checks that the main process is still alive


@dataclass(frozen=True)
class WorkerInfo:
    """What :func:`get_worker_info` returns inside a worker: its ``id``, ``num_workers``, ``seed`` and ``dataset`` copy."""

    id: int
    num_workers: int
    seed: int
    dataset: object


def get_worker_info() -> WorkerInfo | None:
    """Information about the current DataLoader worker process; ``None`` in the main process."""
    return _worker_info


class ExceptionWrapper:
    """An exception raised in a worker, carried to the main process and re-raised there by :meth:`reraise`."""

    def __init__(self, exc_info, where: str) -> None:
        self.exc_type = exc_info[0]
        self.type_name = exc_info[0].__name__
        self.exc_msg = "".join(traceback.format_exception(*exc_info))
        self.where = where
        try:
            pickle.dumps(self.exc_type)
        except Exception:  # noqa: BLE001 - a local exception class: re-raised as RuntimeError, named in the text
            self.exc_type = RuntimeError

    def reraise(self):
        """Raise the original exception type with the worker, index and original traceback in the message."""
        msg = f"Caught {self.type_name} {self.where}.\nOriginal {self.exc_msg}"
        if self.exc_type is KeyError:
            msg = _KeyErrorMessage(msg)
        try:
            exc = self.exc_type(msg)
        except Exception:  # noqa: BLE001 - constructors that need other arguments: say what happened anyway
            raise RuntimeError(msg) from None
        raise exc


class _KeyErrorMessage(str):
    """Keeps a KeyError's message readable (KeyError shows the repr of its argument)."""

    def __repr__(self) -> str:
        return self


class IterableStop:
    """A worker's iterable-dataset copy is exhausted."""

    def __init__(self, worker_id: int) -> None:
        self.worker_id = worker_id


class MapFetcher:
    """Fetches samples of a map-style dataset by index (or a list of indices) and collates them."""

    def __init__(self, dataset, auto_collation: bool, collate_fn, drop_last: bool) -> None:
        self.dataset, self.auto_collation, self.collate_fn = dataset, auto_collation, collate_fn
        self.current = None  # the sample index being fetched, for error messages
        self._getitems = getattr(dataset, "__getitems__", None) if auto_collation else None

    def fetch(self, index):
        """The collated batch (or converted sample) for ``index``."""
        if self.auto_collation:
            if self._getitems is not None:
                self.current = index
                data = self._getitems(index)
            else:
                data = []
                for i in index:
                    self.current = i
                    data.append(self.dataset[i])
        else:
            self.current = index
            data = self.dataset[index]
        return self.collate_fn(data)


class IterableFetcher:
    """Takes the next sample (or ``batch_size`` of them) from an iterable dataset and collates them."""

    def __init__(self, dataset, auto_collation: bool, collate_fn, drop_last: bool) -> None:
        self.dataset_iter = iter(dataset)
        self.auto_collation, self.collate_fn, self.drop_last = auto_collation, collate_fn, drop_last
        self.ended = False
        self.current = None
        self.count = 0

    def fetch(self, index):
        """The next collated batch; raises StopIteration when the stream is done."""
        if self.ended:
            raise StopIteration
        if self.auto_collation:
            data = []
            for _ in index:
                self.current = self.count
                try:
                    data.append(next(self.dataset_iter))
                except StopIteration:
                    self.ended = True
                    break
                self.count += 1
            if not data or (self.drop_last and len(data) < len(index)):
                raise StopIteration
        else:
            self.current = self.count
            data = next(self.dataset_iter)
            self.count += 1
        return self.collate_fn(data)


def make_fetcher(is_iterable: bool, dataset, auto_collation: bool, collate_fn, drop_last: bool):
    """The fetcher for a dataset kind."""
    cls = IterableFetcher if is_iterable else MapFetcher
    return cls(dataset, auto_collation, collate_fn, drop_last)


def where(worker_id: int | None, fetcher, batch_idx: int, is_iterable: bool) -> str:
    """Where an exception happened, for the message raised in the main process."""
    place = "in the main process" if worker_id is None else f"in DataLoader worker process {worker_id}"
    current = getattr(fetcher, "current", None)
    if current is None:
        return place
    if isinstance(current, list):
        return f"{place} while fetching batch {batch_idx} (indices {current})"
    what = "stream sample" if is_iterable else "sample"
    return f"{place} while fetching {what} index {current} (batch {batch_idx})"


def _parent_alive(parent_pid: int, start_ppid: int) -> bool:
    """Whether the main process still runs (a worker must not outlive it, even if it dies by SIGKILL)."""
    if os.getppid() != start_ppid:  # reparented: whoever started this process is gone
        return False
    try:
        os.kill(parent_pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else (cannot happen for our parent, but harmless)
        return True
    return True


def _pack(data, name: str, worker_id: int, idx: int) -> bytes:
    """The pickled payload for ``data``, pickled here rather than in the queue's feeder thread.

    A batch that cannot be pickled would otherwise be dropped by the feeder thread with a message on
    stderr, and the main process would wait for it forever; here it becomes an error to re-raise.
    """
    payload = ("obj", data) if isinstance(data, ExceptionWrapper | IterableStop) else _shm.encode(data, name)
    try:
        return bytes(ForkingPickler.dumps(payload))
    except Exception:  # noqa: BLE001 - carried to the main process
        _shm.discard(payload)
        wrapped = ExceptionWrapper(
            sys.exc_info(), where=f"in DataLoader worker process {worker_id} while sending batch {idx}"
        )
        return bytes(ForkingPickler.dumps(("obj", wrapped)))


def worker_loop(
    dataset,
    is_iterable: bool,
    index_queue,
    result_queue,
    auto_collation: bool,
    collate_fn,
    drop_last: bool,
    base_seed: int,
    init_fn,
    worker_id: int,
    num_workers: int,
    shm_prefix: str,
    parent_pid: int,
) -> None:
    """The body of a worker process; returns when told to (``None`` on its queue) or its parent is gone."""
    global _worker_info
    # Ctrl-C reaches the whole process group: the main process handles it and shuts the workers down.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    seed = base_seed + worker_id
    random.seed(seed)
    kiln.manual_seed(seed)
    _worker_info = WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset)
    init_error = None
    fetcher = None
    try:
        if init_fn is not None:
            init_fn(worker_id)
        fetcher = make_fetcher(is_iterable, dataset, auto_collation, collate_fn, drop_last)
    except Exception:  # noqa: BLE001 - carried to the main process and raised there
        init_error = ExceptionWrapper(sys.exc_info(), where=f"in DataLoader worker process {worker_id}")
    iteration_end = False
    counter = 0
    start_ppid = os.getppid()  # the main process, or the forkserver that started this worker
    try:
        while True:
            try:
                task = index_queue.get(timeout=_PARENT_CHECK_S)
            except queue.Empty:
                if not _parent_alive(parent_pid, start_ppid):
                    return
                continue
            if task is None:
                return
            if task[0] == "resume":  # a new epoch with persistent workers
                iteration_end = False
                if init_error is None:
                    try:
                        fetcher = make_fetcher(is_iterable, dataset, auto_collation, collate_fn, drop_last)
                    except Exception:  # noqa: BLE001 - carried to the main process
                        init_error = ExceptionWrapper(sys.exc_info(), where=f"in DataLoader worker process {worker_id}")
                continue
            _, epoch, idx, index = task
            if init_error is not None:
                data, init_error = init_error, None
            elif iteration_end:
                continue
            else:
                try:
                    data = fetcher.fetch(index)
                except StopIteration:
                    if not is_iterable:
                        raise
                    data = IterableStop(worker_id)
                    iteration_end = True
                except Exception:  # noqa: BLE001 - carried to the main process
                    data = ExceptionWrapper(sys.exc_info(), where=where(worker_id, fetcher, idx, is_iterable))
            counter += 1
            result_queue.put((epoch, idx, _pack(data, f"{shm_prefix}{worker_id}_{counter}", worker_id, idx)))
            del data
    finally:
        # Items the main process will never read must not keep this process alive at exit.
        result_queue.cancel_join_thread()
