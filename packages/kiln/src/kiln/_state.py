"""Thread-local dispatch state: grad mode, inference mode, anomaly mode and the dispatch-mode stacks.

Grad mode is per thread, as in PyTorch. Reading a field of a ``threading.local`` costs ~600 instructions
(about a tenth of a microsecond), and a small op would read four of them; so every write that can move a
field away from its default goes through :func:`set_state` (or :func:`set_grad_mode`), which keeps ``away``,
a count of the (thread, field) pairs away from their defaults now. The hot path tests ``away[0]`` first, a
list item read, and reads the thread-local fields only when it is not 0.

Each counter is a list that holds one token (a 1, in front) per pair counted, then a 0: ``away[0]`` is 1
while any pair is counted and 0 when none is (:func:`pairs` tells how many). A pair is counted by
``insert(0, 1)`` and uncounted by ``pop(0)``, single list operations, which no other thread interleaves
with (a lock made a grad-mode switch, twice per backward pass and per ``no_grad`` block, three times
dearer).

``away`` may count more than there are (a thread that ended inside ``no_grad``, a field set back to
its default for a moment and restored), which costs only speed; it never counts fewer. A write that moves
a field toward its default and restores it afterwards (``finally``) may set the field directly.

Of those pairs, ``modes_away`` counts the dispatch-mode fields and ``inference_away`` the inference
flag, by the same rules: inside ``no_grad`` alone (a backward pass, an optimizer step, an evaluation loop)
an op then reads one field, ``grad_enabled``, instead of four.
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

_DEFAULTS = {"grad_enabled": True, "inference": False, "pre_autograd_modes": (), "post_autograd_modes": ()}
away = [0]
modes_away = [0]  # (thread, pre/post_autograd_modes) pairs away from their defaults (counted in away too)
inference_away = [0]  # (thread, inference) pairs away from the default (counted in away too)
_COUNTERS = {"pre_autograd_modes": modes_away, "post_autograd_modes": modes_away, "inference": inference_away}


def pairs(counter: list) -> int:
    """How many (thread, field) pairs ``counter`` (``away``, ``modes_away`` or ``inference_away``) counts."""
    return len(counter) - 1


def set_state(name: str, value):
    """Set this thread's ``state.<name>`` to ``value``, counting it in ``away``; returns the old value."""
    default = _DEFAULTS[name]
    old = getattr(state, name)
    setattr(state, name, value)
    moved = (value != default) - (old != default)
    if moved:
        counter = _COUNTERS.get(name)
        if moved > 0:
            away.insert(0, 1)
            if counter is not None:
                counter.insert(0, 1)
        else:
            away.pop(0)
            if counter is not None:
                counter.pop(0)
    return old


def set_grad_mode(enabled: bool) -> bool:
    """:func:`set_state` for ``grad_enabled`` (``enabled`` a bool), at a third of its cost: every backward pass,
    ``no_grad`` block and optimizer step sets it twice. Returns the old mode."""
    if enabled is not True and enabled is not False:  # (a token too many or too few would break the count)
        enabled = bool(enabled)
    old = state.grad_enabled
    state.grad_enabled = enabled
    if old is not enabled:
        if enabled:
            away.pop(0)
        else:
            away.insert(0, 1)
    return old


def post_modes() -> tuple:
    """This thread's post-autograd dispatch modes (tracers, profilers), without reading the thread-local
    state while no thread is away from the defaults."""
    return state.post_autograd_modes if modes_away[0] else ()
