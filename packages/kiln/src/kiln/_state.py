"""Thread-local dispatch state: grad mode, inference mode, anomaly mode and the dispatch-mode stacks.

One object, read with one attribute access on the hot path. Grad mode is per thread, as in PyTorch.
"""

from __future__ import annotations

import threading


class _DispatchState(threading.local):
    def __init__(self) -> None:
        self.grad_enabled = True
        self.inference = False
        # Modes in front of autograd (autocast) and behind it (tracing, profiling). Tuples, so that
        # "is any mode active" is a truth test and pushing never mutates a tuple another frame holds.
        self.pre_autograd_modes: tuple = ()
        self.post_autograd_modes: tuple = ()


state = _DispatchState()
anomaly = {"enabled": False, "check_nan": True}
