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
import threading
import time
import traceback
from dataclasses import dataclass

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
    """Fetches samples of a map-style dataset by index (or a list of indices) and collates them.

    ``stage`` says what :meth:`fetch` is doing, for error messages (see :func:`describe`): ``("sample",
    i, batch)`` while ``dataset[i]`` runs (``batch`` is the batch's indices, or ``None`` without
    auto-collation), ``("batch", indices)`` in ``__getitems__``, ``("collate", indices)`` in the
    collate function, ``("convert", i)`` when converting one sample.
    """

    def __init__(self, dataset, auto_collation: bool, collate_fn, drop_last: bool) -> None:
        self.dataset, self.auto_collation, self.collate_fn = dataset, auto_collation, collate_fn
        self.stage: tuple | None = None
        self._getitems = getattr(dataset, "__getitems__", None) if auto_collation else None

    def fetch(self, index):
        """The collated batch (or converted sample) for ``index``."""
        if self.auto_collation:
            if self._getitems is not None:
                self.stage = ("batch", index)
                data = self._getitems(index)
            else:
                data = []
                for i in index:
                    self.stage = ("sample", i, index)
                    data.append(self.dataset[i])
            self.stage = ("collate", index)
        else:
            self.stage = ("sample_alone", index)
            data = self.dataset[index]
            self.stage = ("convert", index)
        out = self.collate_fn(data)
        self.stage = None
        return out


class IterableFetcher:
    """Takes the next sample (or ``batch_size`` of them) from an iterable dataset and collates them.

    ``stage`` (for error messages): ``("stream", n)`` while taking the stream's sample ``n`` (counted
    from 0 in this copy of the dataset), ``("stream_collate", first, last)`` while collating samples
    ``first`` to ``last``, ``("stream_convert", n)`` while converting sample ``n``.
    """

    def __init__(self, dataset, auto_collation: bool, collate_fn, drop_last: bool) -> None:
        self.dataset_iter = iter(dataset)
        self.auto_collation, self.collate_fn, self.drop_last = auto_collation, collate_fn, drop_last
        self.ended = False
        self.stage: tuple | None = None
        self.count = 0

    def fetch(self, index):
        """The next collated batch; raises StopIteration when the stream is done."""
        if self.ended:
            raise StopIteration
        first = self.count
        if self.auto_collation:
            data = []
            for _ in index:
                self.stage = ("stream", self.count)
                try:
                    data.append(next(self.dataset_iter))
                except StopIteration:
                    self.ended = True
                    break
                self.count += 1
            self.stage = None
            if not data or (self.drop_last and len(data) < len(index)):
                raise StopIteration
            self.stage = ("stream_collate", first, self.count - 1)
        else:
            self.stage = ("stream", self.count)
            data = next(self.dataset_iter)
            self.count += 1
            self.stage = ("stream_convert", first)
        out = self.collate_fn(data)
        self.stage = None
        return out


def make_fetcher(is_iterable: bool, dataset, auto_collation: bool, collate_fn, drop_last: bool):
    """The fetcher for a dataset kind."""
    cls = IterableFetcher if is_iterable else MapFetcher
    return cls(dataset, auto_collation, collate_fn, drop_last)


_MAX_SHOWN = 64  # indices listed in a message; a longer batch is cut, with its length


def _indices(index) -> str:
    if isinstance(index, list | tuple | range):
        items = list(index)
        if len(items) > _MAX_SHOWN:
            shown = ", ".join(map(str, items[:_MAX_SHOWN]))
            return f"[{shown}, ...] ({len(items)} in all)"
        return "[" + ", ".join(map(str, items)) + "]"
    text = repr(index)
    return text if len(text) <= 400 else text[:400] + "..."


# What a fetcher's ``stage`` (kind, *values) says in an error message: a template over the values and
# the batch number ``b``, and which values are index collections (shortened by :func:`_indices`).
_STAGES = {
    "sample": ("while fetching sample index {0} of batch {b} (indices {1})", (1,)),
    "sample_alone": ("while fetching sample index {0} (batch {b})", ()),
    "batch": ("while fetching batch {b} (indices {0})", (0,)),
    "collate": ("while collating batch {b} (indices {0})", (0,)),
    "convert": ("while converting sample index {0} (batch {b})", ()),
    "stream": ("while fetching stream sample index {0} (batch {b})", ()),
    "stream_collate": ("while collating batch {b} (stream samples {0} to {1} of this dataset copy)", ()),
    "stream_convert": ("while converting stream sample index {0} (batch {b})", ()),
}


def describe(fetcher, batch_idx: int) -> str | None:
    """What ``fetcher`` was doing for batch ``batch_idx`` when it raised, or ``None`` if unknown."""
    stage = getattr(fetcher, "stage", None)
    if not stage or stage[0] not in _STAGES:
        return None
    template, index_lists = _STAGES[stage[0]]
    values = [_indices(v) if i in index_lists else v for i, v in enumerate(stage[1:])]
    return template.format(*values, b=batch_idx)


def where(worker_id: int | None, fetcher, batch_idx: int) -> str:
    """Where an exception happened, for the message raised in the main process."""
    place = "in the main process" if worker_id is None else f"in DataLoader worker process {worker_id}"
    what = describe(fetcher, batch_idx)
    return place if what is None else f"{place} {what}"


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


def _watch_parent(alive) -> None:
    """End this worker as soon as ``alive()`` says the main process is gone, whatever it is doing.

    Runs in a daemon thread: a worker deep in a slow ``__getitem__`` (or ``worker_init_fn``) does not
    reach its loop's own check for as long as that takes, and must not outlive its main process.
    Nothing is lost by exiting at once: batch memory still in flight is freed with the last descriptor.
    """
    while True:
        time.sleep(_PARENT_CHECK_S)
        if not alive():
            os._exit(0)


def _pack(data, name: str, worker_id: int, idx: int, seq: int) -> tuple[bytes, int | None]:
    """The pickled payload for ``data`` and the descriptor of its shared memory (or ``None``).

    Pickled here rather than in the queue's feeder thread: a batch that cannot be pickled would
    otherwise be dropped by the feeder thread with a message on stderr, and the main process would
    wait for it forever; here it becomes an error to re-raise.
    """
    fd = None
    try:
        if isinstance(data, ExceptionWrapper | IterableStop):
            payload = ("obj", data)
        else:
            payload, fd = _shm.encode(data, name, worker_id, seq)
        return bytes(_shm.BatchPickler.dumps(payload)), fd
    except Exception:  # noqa: BLE001 - carried to the main process
        if fd is not None:
            os.close(fd)
        wrapped = ExceptionWrapper(
            sys.exc_info(), where=f"in DataLoader worker process {worker_id} while sending batch {idx}"
        )
        return bytes(_shm.BatchPickler.dumps(("obj", wrapped))), None


def worker_loop(
    dataset,
    is_iterable: bool,
    index_queue,
    result_queue,
    fd_channel,
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
    """The body of a worker process; returns when told to (``None`` on its queue) or its parent is gone.

    ``fd_channel`` is this worker's end of the socket that carries batch descriptors (``None`` where
    batches are pickled). A forked worker holds no other channel end of any loader: those a fork copies
    are closed in the child before this runs (:func:`kiln.data._shm._close_inherited`).
    """
    global _worker_info
    start_ppid = os.getppid()  # the main process, or the forkserver that started this worker

    def alive() -> bool:
        return _parent_alive(parent_pid, start_ppid)

    threading.Thread(target=_watch_parent, args=(alive,), name="kiln-data-parent-watch", daemon=True).start()
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
    try:
        while True:
            # Checked before every task too, not only when idle: tasks already queued must not keep a
            # worker of a dead main process busy.
            if not alive():
                return
            try:
                task = index_queue.get(timeout=_PARENT_CHECK_S)
            except queue.Empty:
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
                    data = ExceptionWrapper(sys.exc_info(), where=where(worker_id, fetcher, idx))
            counter += 1
            blob, fd = _pack(data, f"{shm_prefix}{worker_id}_{counter}", worker_id, idx, counter)
            del data
            if fd is not None:
                # The descriptor goes first: when the main process reads the queue message, its memory
                # is already waiting on the socket.
                try:
                    sent = _shm.send_fd(fd_channel, counter, fd, alive, _PARENT_CHECK_S)
                except OSError:  # e.g. too many descriptors in flight: an error for the main process
                    sent = True
                    wrapped = ExceptionWrapper(
                        sys.exc_info(), where=f"in DataLoader worker process {worker_id} while sending batch {idx}"
                    )
                    blob = bytes(_shm.BatchPickler.dumps(("obj", wrapped)))
                finally:
                    os.close(fd)
                if not sent:
                    return
            result_queue.put((epoch, idx, blob))
    finally:
        # Items the main process will never read must not keep this process alive at exit.
        result_queue.cancel_join_thread()
