"""Dispatch modes: the thread-local stacks in front of autograd (autocast) and behind it (tracing,
profiling), and the base class every mode subclasses (architecture page, "Ops and the dispatcher")."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kiln._state import set_state, state

if TYPE_CHECKING:
    from kiln._dispatch import Composite, OpDef
    from kiln._tensor import Tensor

__all__ = ["DispatchMode", "call_with_modes"]


class DispatchMode:
    """Base class for dispatch modes (autocast, tracing, profiling), used as context managers.

    Subclasses set ``level`` to ``"pre_autograd"`` (runs before autograd records, e.g. autocast) or
    ``"post_autograd"`` (sees the ops autograd runs, e.g. tracing and profiling) and implement
    :meth:`dispatch`. Modes nest; the innermost runs first and reaches the next through ``redispatch``.
    """

    level = "post_autograd"

    def dispatch(self, op: OpDef, args: tuple, redispatch: Callable[[OpDef, tuple], Any]):
        """Handle one op call; call ``redispatch(op, args)`` to continue down the stack."""
        return redispatch(op, args)

    def dispatch_composite(
        self, composite: Composite, args: tuple, kwargs: dict, redispatch: Callable[[Composite, tuple, dict], Any]
    ):
        """Handle one call of a :func:`composite` (pre-autograd modes only); call ``redispatch(composite, args,
        kwargs)`` to continue. The composite's own ops then run without this mode."""
        return redispatch(composite, args, kwargs)

    def host_read(self, tensor: Tensor, how: str) -> None:
        """Called (post-autograd modes only) when ``tensor``'s values leave for Python while the mode is active:
        ``how`` is ``"tolist"`` (``item()``, ``bool()``, ``int()``, ``float()`` and ``tolist()``) or
        ``"numpy"`` (``numpy()``, ``__array__``), or ``"view(dtype)"`` (its bytes read as another dtype, by a tensor
        no op makes). A tracer guards on the value read; the default does nothing."""

    def before_grad_set(self, tensor: Tensor) -> None:
        """Called (post-autograd modes only) before ``tensor.grad`` is assigned or deleted (``zero_grad()``,
        ``p.grad = None``) while the mode is active; ``tensor.grad`` is still the old value. The default does
        nothing."""

    def made_outside(self, tensor: Tensor, remake: Callable[[], Tensor]) -> None:
        """Called (post-autograd modes only) when a tensor is made outside the dispatcher: from host data
        (``kiln.tensor``, ``arange``, ``eye``, ``linspace``...) or drawn from a generator (``rand``,
        ``randn``, ``randint``, ``randperm``, the in-place samplers). ``remake()`` makes another like it: the
        same values, or a new draw from the same generator (then ``remake.random`` is True). A tracer records
        it; the default does nothing."""

    def generator_reset(self, generator) -> None:
        """Called (post-autograd modes only) when a generator's stream is started or reset while the mode is
        active (``kiln.Generator()``, ``manual_seed``, ``Generator.manual_seed``, ``seed``,
        ``set_rng_state``, ``Generator.set_state``; not a device's default generator made on first use):
        the draws after it depend on Python state no op records. A tracer cannot replay that and runs the
        call eagerly; the default does nothing."""

    def __enter__(self):
        attr = _mode_attr(self.level)
        set_state(attr, getattr(state, attr) + (self,))
        return self

    def __exit__(self, *exc):
        attr = _mode_attr(self.level)
        stack = getattr(state, attr)
        if not stack or stack[-1] is not self:
            raise RuntimeError(f"{type(self).__name__} exited out of order")
        set_state(attr, stack[:-1])


def _mode_attr(level: str) -> str:
    if level not in ("pre_autograd", "post_autograd"):
        raise ValueError(f"dispatch mode level must be 'pre_autograd' or 'post_autograd', got {level!r}")
    return f"{level}_modes"


def call_with_modes(stack: tuple, opdef: OpDef, args: tuple, final: Callable):
    """Run ``stack`` innermost-first; each mode is disabled while it runs so its own ops pass through."""
    mode = stack[-1]
    rest = stack[:-1]
    attr = _mode_attr(mode.level)

    def redispatch(o, a):
        if rest:
            return call_with_modes(rest, o, a, final)
        return final(o, a)

    saved = getattr(state, attr)
    setattr(state, attr, rest)
    try:
        return mode.dispatch(opdef, args, redispatch)
    finally:
        setattr(state, attr, saved)
