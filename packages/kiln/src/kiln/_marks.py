"""``torch._dynamo``'s marks on a tensor's dims — :func:`mark_dynamic`, :func:`maybe_mark_dynamic`,
:func:`mark_static` — kept in the core, so that a script marks its tensors whether kiln-compile is installed
or not: ``kiln._dynamo`` serves them from here when it is the placeholder of a missing kiln-compile, and
kiln-compile's ``kiln._dynamo`` is the same functions.

A mark is an attribute of the tensor (PyTorch's names: ``_dynamo_dynamic_indices``, ``_dynamo_dynamic_range``,
``_dynamo_weak_dynamic_indices``, ``_dynamo_static_indices``, ``_has_dynamo_dim_marking``); kiln-compile
reads them when it traces a call (``kiln.compile._marks``). What they make a compiled function do is
kiln-compile's guide's "Marking dims". kiln-compile also fills :data:`trace_hooks` when it loads: a mark
made while it traces a call is refused (``mark_dynamic``) or undone after the call (``mark_static``), as in
PyTorch; with nothing tracing, the hooks do nothing.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["mark_dynamic", "mark_static", "maybe_mark_dynamic", "trace_hooks"]


class _TraceHooks:
    """What a mark does inside a trace, set by kiln-compile: ``refuse(fn)`` raises PyTorch's
    ``AssertionError`` for ``fn`` called while a compiled function traces; ``remember(t)`` notes the static
    marks ``t`` had, for the trace to put back after the call. Both do nothing until kiln-compile sets them."""

    __slots__ = ("refuse", "remember")

    def __init__(self) -> None:
        self.refuse: Callable[[Callable], None] = lambda fn: None
        self.remember: Callable[[Any], None] = lambda t: None


trace_hooks = _TraceHooks()
"""The hooks kiln-compile sets (:class:`_TraceHooks`)."""


@dataclasses.dataclass(frozen=True)
class _DimRange:
    """A dim marked dynamic and the sizes it may take (``None``: no bound), as ``mark_dynamic`` records it."""

    dim: int
    min: int | None
    max: int | None


def _bad_index(index: Any) -> AssertionError:
    return AssertionError(f"Expected index to be int, list, or tuple, got {type(index)}")


def mark_dynamic(
    t: Any,
    index: int | list | tuple,
    *,
    hint_override: int | None = None,
    min: int | None = None,
    max: int | None = None,
    specialize_on: list | None = None,
) -> None:
    """Mark dim ``index`` of ``t`` (an int, or a list or tuple of them) dynamic, with the sizes ``min`` to
    ``max`` (``torch._dynamo.mark_dynamic``).

    A compiled function (kiln-compile) that traces a call with ``t`` compiles that dim for varying sizes
    from this first trace: its fused kernels read the size at run time, and a later call at another size
    (any tensor) in ``[min, max]`` and not 0 or 1 counts towards no recompile limit, reuses those kernels (a
    kernel holding the size as a number, as the backward of a ``mean`` does, is compiled again) and passes
    ``set_stance("fail_on_recompile")``. kiln still traces each new size once (one eager call: it has no
    symbolic shapes); PyTorch reuses one graph. A size outside ``[min, max]`` on the marked call raises
    ``kiln.compile.ConstraintViolationError`` before the call runs; on a later call it is a recompile. Where
    the traced graph fixes the dim (broadcast against a parameter's dim of that size, a product over it),
    the trace raises ``ConstraintViolationError`` with PyTorch's words, after the call ran (kiln learns it
    by running the code); a size used in Python (``x.view(8, -1)``) is not seen. An index outside the
    tensor's dims, negative ones included, is ignored, as in PyTorch. ``hint_override`` and
    ``specialize_on`` are accepted and do nothing: every kiln trace is specialized to its sizes already.
    Calling it inside a compiled function raises ``AssertionError``. Without kiln-compile the mark is set
    and nothing reads it, as in PyTorch's eager mode.
    """
    trace_hooks.refuse(mark_dynamic)
    if not isinstance(index, int):  # a list or tuple: each entry in turn, as PyTorch (which drops hint_override)
        if not isinstance(index, (list, tuple)):
            raise _bad_index(index)
        for i in index:
            mark_dynamic(t, i, min=min, max=max, specialize_on=specialize_on)
        return
    # (the attributes in PyTorch's order: a non-tensor's AttributeError names the first)
    if not hasattr(t, "_dynamo_dynamic_indices"):
        t._dynamo_dynamic_indices = set()
        t._dynamo_dynamic_range = set()
        t._dynamo_hint_overrides = {}
    if not hasattr(t, "_specialize_on"):
        t._specialize_on = {}
    if hint_override:
        t._dynamo_hint_overrides[index] = hint_override
    t._dynamo_dynamic_indices.add(index)
    t._dynamo_dynamic_range.add(_DimRange(index, min, max))
    t._has_dynamo_dim_marking = True
    if isinstance(t._specialize_on, dict):
        t._specialize_on[index] = specialize_on if specialize_on is not None else []


def maybe_mark_dynamic(t: Any, index: int | list | tuple) -> None:
    """Mark dim ``index`` of ``t`` dynamic where the code allows it (``torch._dynamo.maybe_mark_dynamic``):
    as :func:`mark_dynamic`, but a dim the traced graph fixes stays fixed, with no error (later sizes then
    count as recompiles)."""
    trace_hooks.refuse(maybe_mark_dynamic)
    if not isinstance(index, int):
        if not isinstance(index, (list, tuple)):
            raise _bad_index(index)
        for i in index:
            maybe_mark_dynamic(t, i)
        return
    if not hasattr(t, "_dynamo_weak_dynamic_indices"):
        t._dynamo_weak_dynamic_indices = set()
    t._dynamo_weak_dynamic_indices.add(index)
    t._has_dynamo_dim_marking = True


def mark_static(t: Any, index: int | list | tuple | None = None) -> Any:
    """Mark dim ``index`` of ``t`` (every dim with ``None``) static (``torch._dynamo.mark_static``): it is
    never compiled for varying sizes, not with ``dynamic=True`` nor once its size changes, and each new size
    traces again and counts towards ``config.recompile_limit``. A dim also marked dynamic is dynamic (a
    static mark ranks below it, as in PyTorch).

    ``t`` may also be a ``kiln.nn.Module`` class or instance (returned, marked ``_dynamo_marked_static``):
    kiln guards every module's attributes by value already, which is what PyTorch does for a module so
    marked (PyTorch 2.13 accepts only the class: its instance check raises ``TypeError``). Anything else
    raises ``TypeError``.

    Inside a compiled function, the mark holds for that trace only: the tensor has the marks it had before
    once the call returns, as PyTorch marks its fake tensor there."""
    from kiln._tensor import Tensor

    if not isinstance(t, Tensor):
        module_cls = getattr(sys.modules.get("kiln.nn"), "Module", None)  # (no module exists before kiln.nn)
        is_module_class = isinstance(t, type) and module_cls is not None and issubclass(t, module_cls)
        if is_module_class or (module_cls is not None and isinstance(t, module_cls)):
            t._dynamo_marked_static = True
            return t
        raise TypeError(f"mark_static expects a tensor/nn.Module class but received {type(t)}")
    if isinstance(index, int):
        trace_hooks.remember(t)
        if not hasattr(t, "_dynamo_static_indices"):
            t._dynamo_static_indices = set()
        t._dynamo_static_indices.add(index)
        t._has_dynamo_dim_marking = True
    elif index is None:  # every dim (none for a 0-d tensor)
        for i in range(t.dim()):
            mark_static(t, i)
    else:  # each entry in turn (None among them: every dim), as PyTorch
        if not isinstance(index, (list, tuple)):
            raise _bad_index(index)
        for i in index:
            mark_static(t, i)
    return None
