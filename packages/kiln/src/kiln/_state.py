"""Thread-local dispatch state: grad mode, inference mode, anomaly mode and the dispatch-mode stacks.

Grad mode is per thread, as in PyTorch. Reading a field of a ``threading.local`` costs ~600 instructions
(about a tenth of a microsecond), and a small op would read four of them; so every write that can move a
field away from its default goes through :func:`set_state`, which keeps ``away[0]``: how many (thread,
field) pairs are away from their defaults now. The hot path tests ``away[0]`` first, a list item read,
and reads the thread-local fields only when it is not 0.

``away[0]`` may count more than there are (a thread that ended inside ``no_grad``, a field set back to
its default for a moment and restored), which costs only speed; it never counts fewer. A write that moves
a field toward its default and restores it afterwards (``finally``) may set the field directly.

Of those pairs, ``modes_away[0]`` counts the dispatch-mode fields and ``inference_away[0]`` the inference
flag, by the same rules: inside ``no_grad`` alone (a backward pass, an optimizer step, an evaluation loop)
an op then reads one field, ``grad_enabled``, instead of four.
"""

from __future__ import annotations

import os
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

_DEFAULTS = {"grad_enabled": True, "inference": False, "pre_autograd_modes": (), "post_autograd_modes": ()}
away = [0]
modes_away = [0]  # (thread, pre/post_autograd_modes) pairs away from their defaults (counted in away too)
inference_away = [0]  # (thread, inference) pairs away from the default (counted in away too)
_COUNTERS = {"pre_autograd_modes": modes_away, "post_autograd_modes": modes_away, "inference": inference_away}
_lock = threading.Lock()


def set_state(name: str, value):
    """Set this thread's ``state.<name>`` to ``value``, counting it in ``away``; returns the old value."""
    default = _DEFAULTS[name]
    _lock.acquire()  # not ``with``: its protocol costs a fifth of this function
    try:
        old = getattr(state, name)
        setattr(state, name, value)
        moved = (value != default) - (old != default)
        away[0] += moved
        counter = _COUNTERS.get(name)
        if counter is not None:
            counter[0] += moved
    finally:
        _lock.release()
    return old


def set_grad_mode(enabled: bool) -> bool:
    """:func:`set_state` for ``grad_enabled`` (``enabled`` a bool), at a third of its cost: every backward pass,
    ``no_grad`` block and optimizer step sets it twice. Returns the old mode."""
    _lock.acquire()
    try:
        old = state.grad_enabled
        state.grad_enabled = enabled
        away[0] += old - enabled  # (bools: 1 when turned off, -1 when turned back on; the default is on)
    finally:
        _lock.release()
    return old


def post_modes() -> tuple:
    """This thread's post-autograd dispatch modes (tracers, profilers), without reading the thread-local
    state while no thread is away from the defaults."""
    return state.post_autograd_modes if modes_away[0] else ()


def _new_lock_in_child() -> None:
    # a fork while another thread held the lock would leave it held forever in the child (DataLoader workers)
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_in_child)
