"""Anomaly detection: forward tracebacks on backward errors and NaN checks on node outputs."""

from __future__ import annotations

import os
import sys
import traceback

from kiln._state import anomaly

__all__ = ["detect_anomaly", "set_detect_anomaly", "is_anomaly_enabled", "is_anomaly_check_nan_enabled"]


def is_anomaly_enabled() -> bool:
    """True while anomaly detection is on."""
    return anomaly["enabled"]


def is_anomaly_check_nan_enabled() -> bool:
    """True while anomaly detection also checks backward outputs for NaN."""
    return anomaly["check_nan"]


class detect_anomaly:
    """Context manager (and decorator) that turns anomaly detection on.

    Nodes record the stack of the forward call that made them; an error in backward reports that
    stack, and a backward function that returns NaN raises ``RuntimeError`` naming the function.
    """

    def __init__(self, check_nan: bool = True):
        self.check_nan = check_nan

    def __enter__(self):
        self.prev = dict(anomaly)
        anomaly.update(enabled=True, check_nan=self.check_nan)

    def __exit__(self, *exc):
        anomaly.update(self.prev)

    def __call__(self, fn):
        import functools

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self.__class__(self.check_nan):
                return fn(*args, **kwargs)

        return wrapper


class set_detect_anomaly:
    """Turn anomaly detection on or off: at once when called, or for a ``with`` block."""

    def __init__(self, mode: bool, check_nan: bool = True):
        self.prev = dict(anomaly)
        anomaly.update(enabled=bool(mode), check_nan=check_nan)

    def __enter__(self):
        pass

    def __exit__(self, *exc):
        anomaly.update(self.prev)


_MACHINERY = frozenset(
    os.path.join(os.path.dirname(os.path.dirname(__file__)), *name.split("/"))
    for name in (
        "_dispatch.py",
        "_public.py",
        "_modes.py",
        "_lazy.py",
        "autograd/anomaly_mode.py",
        "autograd/graph.py",
        "autograd/_record_code.py",
    )
)


def forward_traceback() -> list[str]:
    """Anomaly mode's record of where a node was made: the stack down to the call of the op, without the frames
    of kiln's dispatch and recording (the op's public function, the dispatcher, a mode's redispatch, the
    recorder), which PyTorch's C++ leaves out too."""
    frames = traceback.extract_stack()
    amp = sys.modules.get("kiln.amp.autocast_mode")
    amp_file = getattr(amp, "__file__", None)
    end = len(frames)
    while end and (
        frames[end - 1].filename.startswith("<kiln")
        or frames[end - 1].filename in _MACHINERY
        or frames[end - 1].filename == amp_file
    ):
        end -= 1
    return traceback.format_list(frames[:end])
