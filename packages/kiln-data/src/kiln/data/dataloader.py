"""``DataLoader`` (``torch.utils.data.DataLoader``): batches from a dataset, in this process or in workers.

With ``num_workers > 0`` the loader starts worker processes (``multiprocessing``), hands each one batch
indices round robin through its own queue (at most ``prefetch_factor`` outstanding per worker) and
reads results from one shared queue; batch arrays cross in shared memory (:mod:`kiln.data._shm`).
The main process watches its workers: an exception in one is re-raised with its type and traceback,
a worker that dies raises a RuntimeError within a fraction of a second, ``timeout`` bounds every wait,
and the workers and their shared memory are cleaned up when the iterator ends, fails, is interrupted
or is garbage collected.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import pickle
import queue
import secrets
import signal
import threading
import time
import warnings
import weakref

import kiln
from kiln.data import _shm
from kiln.data._collate import default_collate, default_convert
from kiln.data._random import draw_seed
from kiln.data._worker import ExceptionWrapper, IterableStop, describe, make_fetcher, worker_loop
from kiln.data.dataset import IterableDataset
from kiln.data.sampler import BatchSampler, RandomSampler, Sampler, SequentialSampler

__all__ = ["DataLoader"]

_POLL_S = 0.05  # how often the main process checks its workers' health while it waits for a batch
_JOIN_S = 2.0  # how long a shutdown waits for a worker to exit by itself before terminating it


class _InfiniteConstantSampler(Sampler):
    """Yields ``None`` forever: the "indices" of an iterable dataset."""

    def __iter__(self):
        while True:
            yield None


class DataLoader:
    """Iterate over batches of a dataset (``torch.utils.data.DataLoader``; same arguments and defaults).

    ``batch_size``/``shuffle``/``sampler``/``batch_sampler``/``drop_last`` choose the indices (``shuffle``
    draws from ``generator``, a :class:`kiln.Generator`, or kiln's default one); ``collate_fn`` (default
    :func:`default_collate`, or :func:`default_convert` with ``batch_size=None``) builds batches;
    ``num_workers`` worker processes (started with ``multiprocessing_context``) fetch them ahead, at most
    ``prefetch_factor`` per worker, calling ``worker_init_fn(worker_id)`` first; ``persistent_workers`` keeps
    them across epochs; ``in_order=False`` yields batches as they arrive; ``timeout`` (seconds, 0: no limit)
    bounds each wait for a batch. ``pin_memory`` pins the batches' tensors (:meth:`kiln.Tensor.pin_memory`)
    where an accelerator (``pin_memory_device``, when named) offers pinned host memory, and is a no-op
    (with a warning) where none does.
    """

    def __init__(
        self,
        dataset,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler=None,
        batch_sampler=None,
        num_workers: int = 0,
        collate_fn=None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn=None,
        multiprocessing_context=None,
        generator=None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
    ) -> None:
        if num_workers < 0:
            raise ValueError("num_workers option should be non-negative; use num_workers=0 to disable multiprocessing.")
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError(
                "prefetch_factor option could only be specified in multiprocessing.let num_workers > 0 to enable "
                "multiprocessing, otherwise set prefetch_factor to None."
            )
        if num_workers > 0 and prefetch_factor is None:
            prefetch_factor = 2
        if prefetch_factor is not None and prefetch_factor < 0:
            raise ValueError("prefetch_factor option should be non-negative")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")

        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.in_order = in_order
        self._is_iterable = isinstance(dataset, IterableDataset)

        if self._is_iterable:
            if shuffle not in (None, False):
                raise ValueError(
                    f"DataLoader with IterableDataset: expected unspecified shuffle option, but got shuffle={shuffle}"
                )
            if sampler is not None:
                raise ValueError(
                    f"DataLoader with IterableDataset: expected unspecified sampler option, but got sampler={sampler}"
                )
            if batch_sampler is not None:
                raise ValueError(
                    "DataLoader with IterableDataset: expected unspecified batch_sampler option, but got "
                    f"batch_sampler={batch_sampler}"
                )
        else:
            shuffle = bool(shuffle)
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError(
                    "batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last"
                )
            batch_size = None
            drop_last = False
        elif batch_size is None and drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually exclusive with drop_last")
        if sampler is None:
            if self._is_iterable:
                sampler = _InfiniteConstantSampler()
            elif shuffle:
                sampler = RandomSampler(dataset, generator=generator)
            else:
                sampler = SequentialSampler(dataset)
        if batch_size is not None and batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)

        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.generator = generator
        if collate_fn is None:
            collate_fn = default_collate if self._auto_collation else default_convert
        self.collate_fn = collate_fn
        self.persistent_workers = persistent_workers
        self.multiprocessing_context = multiprocessing_context
        self._iterator = None

    # ------------------------------------------------------------------------------------ settings
    @property
    def multiprocessing_context(self):
        """The ``multiprocessing`` context that starts workers (a context object, or ``None``: the default)."""
        return self._mp_context

    @multiprocessing_context.setter
    def multiprocessing_context(self, ctx) -> None:
        if ctx is not None:
            if self.num_workers == 0:
                raise ValueError(
                    "multiprocessing_context can only be used with multi-process loading (num_workers > 0), but "
                    f"got num_workers={self.num_workers}"
                )
            if isinstance(ctx, str):
                valid = multiprocessing.get_all_start_methods()
                if ctx not in valid:
                    raise ValueError(
                        f"multiprocessing_context option should specify a valid start method in {valid!r}, but got "
                        f"multiprocessing_context={ctx!r}"
                    )
                ctx = multiprocessing.get_context(ctx)
            elif not isinstance(ctx, multiprocessing.context.BaseContext):
                raise TypeError(
                    "multiprocessing_context option should be a valid context object or a string specifying the "
                    f"start method, but got multiprocessing_context={ctx}"
                )
        self._mp_context = ctx

    @property
    def _auto_collation(self) -> bool:
        return self.batch_sampler is not None

    @property
    def _index_sampler(self):
        return self.batch_sampler if self._auto_collation else self.sampler

    # ------------------------------------------------------------------------------------ iteration
    def __iter__(self):
        if self.num_workers == 0:
            return _SingleProcessIter(self)
        if self.persistent_workers:
            it = self._iterator
            # A forked child sees its parent's iterator but not as its own: it gets workers of its own.
            if it is None or it._shutdown or it._workers.creator_pid != os.getpid():
                self._iterator = _MultiProcessIter(self)
            else:
                self._iterator._reset(self)
            return self._iterator
        return _MultiProcessIter(self)

    def __len__(self) -> int:
        return _length(self.dataset, self._is_iterable, self.batch_size, self.drop_last, self._index_sampler)


def _length(dataset, is_iterable: bool, batch_size: int | None, drop_last: bool, index_sampler) -> int:
    """The number of batches (or samples, without batching) a loader with these settings yields."""
    if is_iterable:
        length = len(dataset)
        if batch_size is not None:
            if drop_last:
                return length // batch_size
            return (length + batch_size - 1) // batch_size
        return length
    return len(index_sampler)


# ---------------------------------------------------------------------------------------- pinning

_pin_warned = False


def _pin_function(device: str):
    """``Tensor.pin_memory`` when ``device`` (or, unnamed, some available accelerator) has pinned memory,
    else ``None``."""
    from kiln import plugins

    try:
        devices = plugins.devices()
    except Exception:  # noqa: BLE001 - a broken plugin must not break loading; pinning is best effort
        return None
    names = [device.split(":")[0]] if device else [n for n in devices if n != "cpu"]
    for name in names:
        contract = devices.get(name)
        if contract is not None and contract.pin_memory is not None and contract.is_available():
            return kiln.Tensor.pin_memory
    return None


def _pin(data, pin):
    if isinstance(data, kiln.Tensor):
        return pin(data)
    if isinstance(data, dict):
        return {k: _pin(v, pin) for k, v in data.items()}
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(_pin(v, pin) for v in data))
    if isinstance(data, list | tuple):
        return type(data)(_pin(v, pin) for v in data)
    if hasattr(data, "pin_memory"):
        return data.pin_memory()
    return data


def _pinner(loader: DataLoader):
    global _pin_warned
    if not loader.pin_memory:
        return None
    pin = _pin_function(loader.pin_memory_device)
    if pin is None and not _pin_warned:
        _pin_warned = True
        warnings.warn(
            "'pin_memory' argument is set as true but no accelerator is found, then device pinned memory won't be used.",
            UserWarning,
            stacklevel=3,
        )
    return pin


# ---------------------------------------------------------------------------------------- iterators


class _BaseIter:
    # Holds what it needs of the loader, never the loader itself: a persistent loader holds its
    # iterator, and a reference back would make a cycle that keeps the workers alive after
    # ``del loader`` until the cyclic garbage collector happens to run.
    def __init__(self, loader: DataLoader) -> None:
        self._dataset = loader.dataset
        self._is_iterable = loader._is_iterable
        self._auto_collation = loader._auto_collation
        self._drop_last = loader.drop_last
        self._index_sampler = loader._index_sampler
        self._collate_fn = loader.collate_fn
        self._pin = _pinner(loader)
        self._length = None
        self._sampler_iter = iter(self._index_sampler)
        # Drawn whatever num_workers is, as PyTorch does, so a seeded generator gives one order for all.
        self._base_seed = draw_seed(loader.generator)
        self._num_yielded = 0
        self._batch_size = loader.batch_size

    def __iter__(self):
        return self

    def __len__(self) -> int:
        return _length(self._dataset, self._is_iterable, self._batch_size, self._drop_last, self._index_sampler)

    def _next_index(self):
        return next(self._sampler_iter)

    def __next__(self):
        data = self._next_data()
        self._num_yielded += 1
        if self._pin is not None:
            data = _pin(data, self._pin)
        return data


class _SingleProcessIter(_BaseIter):
    def __init__(self, loader: DataLoader) -> None:
        super().__init__(loader)
        self._fetcher = make_fetcher(
            self._is_iterable, self._dataset, self._auto_collation, self._collate_fn, self._drop_last
        )

    def _next_data(self):
        index = self._next_index()
        try:
            return self._fetcher.fetch(index)
        except StopIteration:
            raise
        except Exception as exc:
            # The original exception, as PyTorch raises it, with a note naming the batch and sample.
            what = describe(self._fetcher, self._num_yielded)
            if what is not None:
                exc.add_note(f"DataLoader: raised in the main process {what}")
            raise


class _Workers:
    """The worker processes, queues, descriptor channels and shared-memory prefix of one iterator.

    Kept apart from the iterator so that a ``weakref.finalize`` on the iterator can shut them down
    (on garbage collection and at interpreter exit) without keeping the iterator alive.
    """

    def __init__(self, loader: DataLoader, base_seed: int) -> None:
        ctx = loader.multiprocessing_context or multiprocessing.get_context()
        # Only this process may stop and join the workers: a forked child inherits this object (and
        # may collect it, or run its finalizer at exit), and must leave the workers alone.
        self.creator_pid = os.getpid()
        self.prefix = f"kiln_{os.getpid()}_{secrets.token_hex(3)}_"
        self.result_queue = ctx.Queue()
        self.index_queues = []
        self.processes = []
        self.lock = threading.Lock()
        self.closed = False
        # One socket pair per worker: the worker passes each batch's shared memory as a descriptor.
        self.channels = [_shm.channel() for _ in range(loader.num_workers)] if _shm.available() else []
        try:
            for worker_id in range(loader.num_workers):
                iq = ctx.Queue()
                iq.cancel_join_thread()  # the main process never waits on tasks a dead worker left unread
                own = self.channels[worker_id][1] if self.channels else None
                p = ctx.Process(
                    target=worker_loop,
                    args=(
                        loader.dataset,
                        loader._is_iterable,
                        iq,
                        self.result_queue,
                        own,
                        loader._auto_collation,
                        loader.collate_fn,
                        loader.drop_last,
                        base_seed,
                        loader.worker_init_fn,
                        worker_id,
                        loader.num_workers,
                        self.prefix,
                        os.getpid(),
                    ),
                    daemon=True,
                )
                # A forked worker keeps only this socket end of all the channels of every loader of this
                # process (the others are closed in the child at once: see _shm._close_inherited).
                with _shm.forking_with(own):
                    p.start()
                if own is not None:
                    own.close()  # the worker has its copy; the receiving end alone stays here
                self.index_queues.append(iq)
                self.processes.append(p)
        except BaseException:
            self.shutdown()  # the workers that did start must not linger
            raise

    @property
    def pids(self) -> list[int]:
        """The workers' process ids."""
        return [p.pid for p in self.processes]

    def recv_fd(self, worker_id: int, seq: int) -> int:
        """The descriptor of worker ``worker_id``'s batch ``seq``."""
        return _shm.recv_fd(self.channels[worker_id][0], seq, worker_id)

    def shutdown(self) -> None:
        """Stop every worker (politely, then by force), and free every shared-memory segment left behind."""
        if os.getpid() != self.creator_pid:
            return  # a forked copy of this object: the workers are not this process's to stop
        with self.lock:
            if self.closed:
                return
            self.closed = True
        for iq in self.index_queues:
            with contextlib.suppress(OSError, ValueError):  # a closed queue: its worker is gone anyway
                iq.put(None)
        deadline = time.monotonic() + _JOIN_S
        for p in self.processes:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in self.processes:
            if p.is_alive():
                p.terminate()
                p.join(timeout=_JOIN_S)
            if p.is_alive():  # pragma: no cover - ignores SIGTERM: stop it for good
                os.kill(p.pid, signal.SIGKILL)
                p.join()
        for q in (*self.index_queues, self.result_queue):
            q.cancel_join_thread()
            q.close()
        # Batches still in flight are descriptors in these sockets: closing them frees that memory.
        for main_end, worker_end in self.channels:
            main_end.close()
            worker_end.close()
        _shm.unlink_leftovers(self.prefix)


class _MultiProcessIter(_BaseIter):
    def __init__(self, loader: DataLoader) -> None:
        super().__init__(loader)
        self._num_workers = loader.num_workers
        self._prefetch = loader.prefetch_factor * loader.num_workers
        self._timeout = loader.timeout
        self._in_order = loader.in_order
        self._persistent = loader.persistent_workers
        self._shutdown = False
        self._workers = _Workers(loader, self._base_seed)
        self._finalizer = weakref.finalize(self, self._workers.shutdown)
        self._epoch = 0
        self._start_epoch()

    @property
    def worker_pids(self) -> list[int]:
        """The process ids of this iterator's workers."""
        return self._workers.pids

    def _start_epoch(self) -> None:
        self._send_idx = 0
        self._rcvd_idx = 0
        self._task_info: dict[int, tuple] = {}
        self._tasks_outstanding = 0
        self._workers_status = [True] * self._num_workers
        self._worker_cycle = itertools.cycle(range(self._num_workers))
        self._sampler_exhausted = False
        for _ in range(self._prefetch):
            self._try_put_index()

    def _reset(self, loader: DataLoader) -> None:
        """Start a new epoch on the same (persistent) workers."""
        self._epoch += 1
        self._base_seed = draw_seed(loader.generator)
        self._sampler_iter = iter(self._index_sampler)
        self._num_yielded = 0
        for iq in self._workers.index_queues:
            iq.put(("resume", self._epoch))
        self._start_epoch()

    def _try_put_index(self) -> None:
        if self._tasks_outstanding >= self._prefetch or self._sampler_exhausted:
            return
        try:
            index = self._next_index()
        except StopIteration:
            self._sampler_exhausted = True
            return
        for _ in range(self._num_workers):
            worker_id = next(self._worker_cycle)
            if self._workers_status[worker_id]:
                break
        else:
            return  # every worker is done (iterable dataset): nothing more to ask for
        self._workers.index_queues[worker_id].put(("task", self._epoch, self._send_idx, index))
        self._task_info[self._send_idx] = (worker_id,)
        self._tasks_outstanding += 1
        self._send_idx += 1

    def _check_workers(self) -> None:
        for worker_id, p in enumerate(self._workers.processes):
            if not p.is_alive():
                code = p.exitcode
                if code is not None and code < 0:
                    try:
                        how = f"was killed by signal {signal.Signals(-code).name} (exit code {code})"
                    except ValueError:
                        how = f"exited unexpectedly with exit code {code}"
                else:
                    how = f"exited unexpectedly with exit code {code}"
                self._shutdown_workers()
                raise RuntimeError(f"DataLoader worker {worker_id} (pid {p.pid}) {how}")

    def _get_data(self):
        """The next (idx, batch) of this epoch from the result queue, watching the workers meanwhile."""
        deadline = time.monotonic() + self._timeout if self._timeout > 0 else None
        while True:
            wait = _POLL_S if deadline is None else max(0.0, min(_POLL_S, deadline - time.monotonic()))
            try:
                epoch, idx, blob = self._workers.result_queue.get(timeout=wait)
            except queue.Empty:
                self._check_workers()
                if deadline is not None and time.monotonic() >= deadline:
                    self._shutdown_workers()
                    raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds") from None
                continue
            payload = pickle.loads(blob)
            fd = self._workers.recv_fd(payload[1], payload[2]) if payload[0] == "fd" else None
            if epoch != self._epoch:  # left over from an epoch that was abandoned midway
                if fd is not None:
                    _shm.close_received(fd)
                continue
            return idx, _shm.decode(payload, fd)

    def _next_data(self):
        while True:
            while self._rcvd_idx < self._send_idx:
                info = self._task_info.get(self._rcvd_idx)
                if info is not None:
                    worker_id = info[0]
                    if len(info) == 2 or self._workers_status[worker_id]:
                        break
                    del self._task_info[self._rcvd_idx]
                self._rcvd_idx += 1
            else:
                if not self._persistent:
                    self._shutdown_workers()
                raise StopIteration
            if len(self._task_info[self._rcvd_idx]) == 2:
                data = self._task_info.pop(self._rcvd_idx)[1]
                self._rcvd_idx += 1
                return self._process(data)
            idx, data = self._get_data()
            self._tasks_outstanding -= 1
            if isinstance(data, IterableStop):
                self._workers_status[data.worker_id] = False
                self._try_put_index()
                continue
            if idx != self._rcvd_idx:
                if self._in_order:
                    self._task_info[idx] += (data,)
                    continue
                del self._task_info[idx]
                return self._process(data)
            del self._task_info[idx]
            self._rcvd_idx += 1
            return self._process(data)

    def _process(self, data):
        self._try_put_index()
        if isinstance(data, ExceptionWrapper):
            self._shutdown_workers()
            data.reraise()
        return data

    def __next__(self):
        if os.getpid() != self._workers.creator_pid:
            raise RuntimeError(
                f"this DataLoader iterator's workers belong to process {self._workers.creator_pid}; "
                "a forked process must make its own iterator"
            )
        try:
            return super().__next__()
        except (KeyboardInterrupt, SystemExit):
            self._shutdown_workers()
            raise

    def _shutdown_workers(self) -> None:
        if not self._shutdown:
            self._shutdown = True
            self._finalizer()
