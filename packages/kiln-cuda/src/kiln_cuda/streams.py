"""Streams and events, as ``torch.cuda.Stream`` / ``torch.cuda.Event``, over numba.cuda's.

Every kiln-cuda kernel launches on the current stream of its device (:func:`current_stream`), which is
the device's default stream until a ``with kiln.cuda.stream(s):`` block selects another. The caching
allocator hands a freed block only to allocations on the stream it was freed on, unless the block was
marked with ``Tensor.record_stream`` — then it waits until the work queued on those streams is done.
"""

from __future__ import annotations

import threading
import time

from kiln_cuda import _driver

__all__ = ["Stream", "Event", "current_stream", "default_stream", "stream", "StreamContext", "set_stream"]

_local = threading.local()


def _index(device) -> int:
    from kiln_cuda.api import _device_index

    return _device_index(device)


class Stream:
    """A queue of device work (``torch.cuda.Stream``): work on one stream runs in order, work on two
    streams may overlap. ``Stream()`` is a new stream on the current device."""

    def __init__(self, device=None, priority: int = 0, *, _raw=None):
        self.device_index = _index(device)
        self.priority = priority
        if _raw is None:
            from kiln_cuda.api import _on_device

            with _on_device(self.device_index):
                _raw = _driver.cuda().stream()
        self._raw = _raw

    @property
    def device(self):
        """The device this stream belongs to."""
        import kiln

        return kiln.device("cuda", self.device_index)

    @property
    def cuda_stream(self) -> int:
        """The raw ``cudaStream_t`` handle, as an integer (0 for the legacy default stream)."""
        handle = getattr(self._raw, "handle", None)
        value = getattr(handle, "value", handle)
        return int(value or 0)

    def synchronize(self) -> None:
        """Wait until all work queued on this stream has finished."""
        self._raw.synchronize()

    def query(self) -> bool:
        """Whether all work queued on this stream has finished."""
        q = getattr(self._raw, "query", None)
        return True if q is None else bool(q())

    def record_event(self, event: Event | None = None) -> Event:
        """Record ``event`` (a new one when None) on this stream and return it."""
        event = Event() if event is None else event
        event.record(self)
        return event

    def wait_event(self, event: Event) -> None:
        """Make later work on this stream wait until ``event`` has completed."""
        event.wait(self)

    def wait_stream(self, stream: Stream) -> None:
        """Make later work on this stream wait for the work queued on ``stream`` so far."""
        self.wait_event(stream.record_event())

    def __eq__(self, other) -> bool:
        return isinstance(other, Stream) and other._raw is self._raw

    def __hash__(self) -> int:
        return hash(id(self._raw))

    def __repr__(self) -> str:
        return f"<kiln.cuda.Stream device=cuda:{self.device_index} cuda_stream={self.cuda_stream:#x}>"


class Event:
    """A marker in a stream (``torch.cuda.Event``): record it, wait on it from another stream, or time the
    work between two events with ``elapsed_time`` (in milliseconds; both need ``enable_timing=True``)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        if interprocess:
            raise NotImplementedError("kiln.cuda.Event(interprocess=True) is not supported")
        self.enable_timing = enable_timing
        self.blocking = blocking
        c = _driver.cuda()
        self._raw = c.event() if _driver.SIM else c.event(timing=enable_timing)
        self._recorded = False

    def record(self, stream: Stream | None = None) -> None:
        """Record the event on ``stream`` (the current stream when None)."""
        stream = current_stream() if stream is None else stream
        self._raw.record(stream._raw)
        self._recorded = True
        if _driver.SIM:  # the simulator runs work as it is queued and keeps no event times: the host's clock
            self._time = time.perf_counter()

    def wait(self, stream: Stream | None = None) -> None:
        """Make later work on ``stream`` (the current one when None) wait for this event."""
        stream = current_stream() if stream is None else stream
        if self._recorded:
            self._raw.wait(stream._raw)

    def query(self) -> bool:
        """Whether the work before the event's record has completed (True when never recorded)."""
        q = getattr(self._raw, "query", None)
        return True if q is None or not self._recorded else bool(q())

    def synchronize(self) -> None:
        """Wait until the event has completed."""
        if self._recorded:
            self._raw.synchronize()

    def elapsed_time(self, end_event: Event) -> float:
        """Milliseconds between this event and ``end_event`` (both recorded, both with ``enable_timing``)."""
        if not (self.enable_timing and end_event.enable_timing):
            raise ValueError("Both events must be created with argument 'enable_timing=True'.")
        if not (self._recorded and end_event._recorded):
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        end_event.synchronize()
        if _driver.SIM:
            return (end_event._time - self._time) * 1000.0
        return float(self._raw.elapsed_time(end_event._raw))

    def __repr__(self) -> str:
        return f"<kiln.cuda.Event enable_timing={self.enable_timing} recorded={self._recorded}>"


_defaults: dict[int, Stream] = {}


def default_stream(device=None) -> Stream:
    """The default stream of ``device`` (the current device when None)."""
    index = _index(device)
    s = _defaults.get(index)
    if s is None:
        s = _defaults[index] = Stream(index, _raw=_driver.cuda().default_stream())
    return s


def current_stream(device=None) -> Stream:
    """The stream kernels on ``device`` launch on now (its default stream unless one was selected)."""
    index = _index(device)
    selected = getattr(_local, "streams", {}).get(index)
    return selected if selected is not None else default_stream(index)


def set_stream(stream: Stream) -> None:
    """Make ``stream`` the current stream of its device (prefer the ``stream(...)`` context manager)."""
    if not hasattr(_local, "streams"):
        _local.streams = {}
    _local.streams[stream.device_index] = stream


class StreamContext:
    """``with kiln.cuda.stream(s):`` — kernels on ``s``'s device launch on ``s`` inside the block.
    ``None`` selects nothing (the block runs on the current stream)."""

    def __init__(self, stream: Stream | None):
        self.stream = stream
        self._previous = None

    def __enter__(self) -> Stream | None:
        if self.stream is not None:
            if not hasattr(_local, "streams"):
                _local.streams = {}
            self._previous = _local.streams.get(self.stream.device_index)
            _local.streams[self.stream.device_index] = self.stream
        return self.stream

    def __exit__(self, *exc) -> None:
        if self.stream is not None:
            if self._previous is None:
                _local.streams.pop(self.stream.device_index, None)
            else:
                _local.streams[self.stream.device_index] = self._previous


def stream(stream: Stream | None) -> StreamContext:
    """Context manager selecting ``stream`` as the current stream of its device."""
    return StreamContext(stream)
