"""Anomaly detection: forward tracebacks on backward errors and NaN checks on node outputs."""

from __future__ import annotations

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
