"""What a compiled function makes of ``torch._dynamo``'s marks on a tensor's dims when it traces a call.
The marks themselves — :func:`mark_dynamic`, :func:`maybe_mark_dynamic`, :func:`mark_static` — are the
core's (``kiln.backend``: a script marks its tensors with or without kiln-compile); this module fills the
core's ``mark_trace_hooks`` with what a mark does inside a trace.

A mark is an attribute of the tensor (PyTorch's names: ``_dynamo_dynamic_indices``, ``_dynamo_dynamic_range``,
``_dynamo_weak_dynamic_indices``, ``_dynamo_static_indices``), read when a call with that tensor is traced:
later calls are served by that trace's guards, whatever tensors they pass, as in PyTorch, and those guards
test the marks as PyTorch's do (``kiln.compile._guards._meta_marked``). kiln guards shapes exactly, so a
mark does not spare the trace of a new size; it decides what that trace counts as (:func:`policies`). A dim
marked dynamic (or made dynamic by ``dynamic=True``) is compiled for varying sizes from the first trace:
its fused kernels read its size at run time, a trace at another size of it counts towards no recompile
limit and reuses them (but for a kernel holding a size as a number: the backward of a ``mean`` divides by
the element count), and ``set_stance("fail_on_recompile")`` lets it through. A dim marked static always
counts, as a recompile. :func:`check_ranges` refuses a call outside a
mark's ``min``/``max``, and :func:`violations` the dims marked with ``mark_dynamic`` that the trace fixed
(:mod:`kiln.compile._dims`), as PyTorch's ``ConstraintViolationError`` does.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections.abc import Callable, Iterator
from typing import Any

import kiln
from kiln.backend import mark_trace_hooks
from kiln.compile._dims import STATIC, Symbols, follow
from kiln.compile._guards import flatten, module_class

__all__ = [
    "AUTO",
    "ConstraintViolationError",
    "check_ranges",
    "covers",
    "kept_marks",
    "may_vary",
    "policies",
    "read_marks",
    "source_names",
    "trace_dims",
    "user_function",
    "violations",
]

AUTO = "auto"
"""A dim's policy in a trace: dynamic without a mark (``dynamic=True``, a size that changed among the
program's traces, one that differs between the first two calls under ``eager_then_compile``);
:data:`STATIC` for a dim marked static; ``(min, max)`` for a dim marked dynamic."""


class ConstraintViolationError(RuntimeError):
    """A dim marked with :func:`mark_dynamic` that the compiled code fixes to one size, or a call whose size
    is outside the mark's ``min``/``max`` (PyTorch's
    ``torch.fx.experimental.symbolic_shapes.ConstraintViolationError``)."""

    __module__ = "kiln.compile"


def _refuse_in_trace(fn: Callable) -> None:
    """PyTorch's error for ``fn`` called while a compiled function traces (it refuses to trace it)."""
    from kiln.compile._runtime import is_compiling

    if is_compiling():  # (PyTorch cannot trace it either: a mark is read before the trace)
        raise AssertionError(f"Attempt to trace forbidden callable {fn}")


_local = threading.local()  # .marked: per trace in progress on this thread, the tensors mark_static marked
_ABSENT = object()
_STATIC_MARKS = ("_dynamo_static_indices", "_has_dynamo_dim_marking")


@contextlib.contextmanager
def kept_marks(tensors: list, marks: list[dict]) -> Iterator[Callable[[], list[dict]]]:
    """Around a call being traced: yields a function giving the marks of ``tensors`` (:func:`read_marks`)
    after the call (``marks``, read before it, where the call marked nothing), and leaves every tensor that
    :func:`mark_static` marked during the call with the marks it had before: PyTorch marks its fake tensor
    there, and the caller's tensor keeps none."""
    stack = _local.__dict__.setdefault("marked", [])
    undo: list = []
    stack.append(undo)
    try:
        yield lambda: [read_marks(t) for t in tensors] if undo else marks
    finally:
        stack.pop()
        for t, had in reversed(undo):
            for name, value in had.items():
                if value is _ABSENT:
                    t.__dict__.pop(name, None)
                else:
                    setattr(t, name, value)


def _remember(t: Any) -> None:
    """Inside a trace: note ``t``'s static marks, for :func:`kept_marks` to put back after the call."""
    stack = getattr(_local, "marked", None)
    if stack:
        had = {n: getattr(t, n, _ABSENT) for n in _STATIC_MARKS}
        if isinstance(had[_STATIC_MARKS[0]], set):
            had[_STATIC_MARKS[0]] = set(had[_STATIC_MARKS[0]])
        stack[-1].append((t, had))


mark_trace_hooks.refuse = _refuse_in_trace
mark_trace_hooks.remember = _remember


def read_marks(t: kiln.Tensor) -> dict[int, Any]:
    """Per marked dim of ``t`` (within its dims): :data:`STATIC`, or ``(min, max, strict)`` for one marked
    dynamic (``strict``: by :func:`mark_dynamic`, whose dim the code may not fix)."""
    nd = t.dim()  # (the attributes are read as PyTorch reads them, whoever set them)
    valid = lambda d: isinstance(d, int) and 0 <= d < nd  # (True too: dim 1, as in PyTorch)
    out: dict[int, Any] = {int(d): STATIC for d in getattr(t, "_dynamo_static_indices", ()) if valid(d)}
    out.update((int(d), (None, None, False)) for d in getattr(t, "_dynamo_weak_dynamic_indices", ()) if valid(d))
    ranges = getattr(t, "_dynamo_dynamic_range", ())
    for d in map(int, filter(valid, getattr(t, "_dynamo_dynamic_indices", ()))):
        lows = [r.min for r in ranges if r.dim == d and r.min is not None]  # (marked twice: both ranges hold)
        highs = [r.max for r in ranges if r.dim == d and r.max is not None]
        out[d] = (max(lows) if lows else None, min(highs) if highs else None, True)
    return out


def check_ranges(tensors: list, marks: list[dict], names: list[str]) -> None:
    """Refuse a call whose size of a dim marked dynamic is outside the mark's ``[min, max]``, before it runs
    (PyTorch's ``ConstraintViolationError``: ``"4 not in range [5, 9]"``)."""
    for t, found, name in zip(tensors, marks, names):
        for d, mark in found.items():
            if mark is STATIC or not mark[2]:
                continue
            lo, hi, _ = mark
            if lo is not None and hi is not None and lo > hi:
                raise ConstraintViolationError(f"Invalid ranges [{lo}:{hi}] for {name}.size()[{d}]")
            n = t.shape[d]
            if (lo is not None and n < lo) or (hi is not None and n > hi):
                bounds = f"[{0 if lo is None else lo}, {'inf' if hi is None else hi}]"
                raise ConstraintViolationError(
                    f"{n} not in range {bounds} ({name}.size()[{d}], marked with kiln._dynamo.mark_dynamic)"
                )


def violations(strict: dict[int, tuple[str, int]], symbols: Symbols) -> ConstraintViolationError | None:
    """The error for the symbols of ``strict`` (symbol -> (source name, dim): dims marked with
    :func:`mark_dynamic`) that the trace fixed, in PyTorch's words; None if it fixed none."""
    lines, where = [], []
    for s, (name, d) in strict.items():
        found = symbols.fixed_at(s)
        if found is None:
            continue
        size, node = found
        source = f"{name}.size()[{d}]"
        where.append(source)
        lines.append(
            f"  - You marked {source} as dynamic but your code specialized it to be a constant ({size}). If "
            "you're using mark_dynamic, either remove it or use maybe_mark_dynamic.\n"
            f"    (kiln.compile: {node!r} meets it with a dim of fixed size {size})"
        )
    if not lines:
        return None
    return ConstraintViolationError(
        f"Constraints violated ({', '.join(where)})! kiln.compile.explain(fn, *args) shows the graph.\n"
        + "\n".join(lines)
    )


def policies(
    tensors: list, marks: list[dict], auto: list[set], symbols: Symbols, weak: dict[tuple[int, int], int]
) -> dict[int, dict[int, Any]]:
    """Per input tensor (position) and dim, what a trace makes of it: :data:`STATIC` (marked static),
    ``(min, max)`` (marked dynamic, at a size of 2 or more) or :data:`AUTO` (``auto``: dynamic without a
    mark), leaving out a dim whose symbol (``weak``: (position, dim) -> symbol) the code fixed."""
    out: dict[int, dict[int, Any]] = {}
    for pos, (t, found) in enumerate(zip(tensors, marks)):
        pol: dict[int, Any] = {}
        for d, n in enumerate(t.shape):
            mark = found.get(d)
            s = weak.get((pos, d))
            if s is not None and symbols.fixed_at(s) is not None:
                continue
            if mark is STATIC:  # (never made dynamic: not by dynamic=True, not once its size changes)
                pol[d] = STATIC
            elif mark is not None and mark is not STATIC and n >= 2:
                pol[d] = mark[:2]
            elif d in auto[pos] and n >= 2:
                pol[d] = AUTO
        if pol:
            out[pos] = pol
    return out


def covers(policy: Any, n: int) -> bool:
    """Whether a trace whose dim has ``policy`` would serve size ``n`` in PyTorch without a recompile."""
    if n < 2 or policy is None or policy is STATIC:
        return False
    return policy is AUTO or ((policy[0] is None or n >= policy[0]) and (policy[1] is None or n <= policy[1]))


def trace_dims(entry, tensors: list, marks: list, auto: list, names: list, first: bool, dynamic: bool) -> dict:
    """What a trace (``entry``, of a compiled function with ``dynamic=True`` or not) makes of each input dim
    (``Entry.dims``), from the marks on its tensors and the dims dynamic without one (``auto``). Raises
    :class:`ConstraintViolationError` where the graph fixes a dim marked with ``mark_dynamic``. A ``first``
    trace of its program compiles the dims that follow a dynamic one for varying sizes (its fused kernels
    read those sizes at run time)."""
    symbols, strict, weak, tokens = Symbols(), {}, {}, {}
    graph = entry.graphs[0]
    for pos, (t, v) in enumerate(zip(tensors, graph.inputs)):
        toks: list = []
        for d, n in enumerate(t.shape):
            mark = marks[pos].get(d)
            marked = mark is not None and mark is not STATIC
            if n < 2 or not (marked or (mark is None and d in auto[pos])):
                toks.append(STATIC)
                continue
            toks.append(symbols.new())
            if marked and mark[2]:
                strict[toks[-1]] = (names[pos] if pos < len(names) else f"L['args'][{pos}]", d)
            else:
                weak[(pos, d)] = toks[-1]
        tokens[v.index] = toks
    if symbols.parent:
        # a tensor read by reference that existed before the call has fixed sizes; one the call made (from its
        # input's data, say) may have any: not known
        held = zip(graph.inputs[len(tensors) :], entry.persistent)
        tokens.update((v.index, [STATIC] * len(v.shape)) for v, persistent in held if persistent)
        found = [follow(graph, tokens, symbols)]
        if len(entry.graphs) > 1:
            found.append(follow(entry.graphs[1], _backward_tokens(entry, found[0]), symbols))
        error = violations(strict, symbols)
        if error is not None:
            raise error
        if first and not dynamic:
            for g, toks_by_value in zip(entry.graphs, found):
                g.dynamic = True
                g.changed = {
                    i: frozenset(d for d, k in enumerate(ks) if k is not STATIC) for i, ks in toks_by_value.items()
                }
    return policies(tensors, marks, auto, symbols, weak)


def _backward_tokens(entry, forward: dict) -> dict:
    """The tokens (:mod:`kiln.compile._dims`) of the backward graph's inputs, from the forward's values."""
    graph, out = entry.graphs[0], {}
    for v, (kind, i) in zip(entry.graphs[1].inputs, entry.bw_inputs):
        if kind == "const":
            out[v.index] = [STATIC] * len(v.shape)
            continue
        src = {"grad": graph.outputs, "saved": entry.saved, "input": graph.inputs}[kind][i]
        found = forward.get(src.index)
        if found is not None and len(found) == len(v.shape):
            out[v.index] = found
    return out


def may_vary(e, entry, automatic: bool) -> bool:
    """Whether ``entry``'s input sizes are ones ``e``'s dims may take without counting (``automatic``: the
    compiled function's ``dynamic`` is not False, and automatic dynamic shapes are on): not a dim marked
    static, within a dim's ``mark_dynamic`` range; any other dim with ``dynamic`` not False (and automatic
    dynamic shapes), else only a dim marked dynamic (then the tensors read by reference keep their shapes)."""
    old, new = e.graphs[0].inputs, entry.graphs[0].inputs
    if not automatic and any(a.shape != b.shape for a, b in zip(old[e.n_inputs :], new[entry.n_inputs :])):
        return False
    for pos in range(entry.n_inputs):
        if not automatic and old[pos].shape == new[pos].shape and old[pos].stride != new[pos].stride:
            return False  # (another layout: counts)
        policy = e.dims.get(pos, {})
        for d, (was, n) in enumerate(zip(old[pos].shape, new[pos].shape)):
            if was == n:
                continue
            p = policy.get(d)
            if p is STATIC or (p is None and not automatic) or (isinstance(p, tuple) and not covers(p, n)):
                return False
    return True


def source_names(fn: Callable, args: tuple, kwargs: dict) -> list[str]:
    """PyTorch's names of the tensors of a call (``L['x']``, ``L['xs'][0]``, ``L['batch']['image']``), in
    the order of :func:`kiln.compile._guards.flatten`; a parameter it cannot name is ``L['args'][i]``."""
    params = _parameters(fn)
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    star = next((p.name for p in params if p.kind is p.VAR_POSITIONAL), None)
    stars = next((p.name for p in params if p.kind is p.VAR_KEYWORD), None)
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    out: list[str] = []
    for i, a in enumerate(args):
        if i < len(positional):
            base = f"L[{positional[i]!r}]"
        else:
            base = f"L[{star!r}][{i - len(positional)}]" if star else f"L['args'][{i}]"
        _walk(a, base, out)
    for k, v in kwargs.items():
        _walk(v, f"L[{k!r}]" if k in named or not stars else f"L[{stars!r}][{k!r}]", out)
    return out


def _walk(obj: Any, path: str, out: list) -> None:
    """The paths of the tensors among ``obj``'s leaves (:func:`kiln.compile._guards.flatten`), appended to ``out``."""
    leaves: list = []
    paths: list[str] = []
    flatten(obj, leaves, paths, path)
    out.extend(p for x, p in zip(leaves, paths) if isinstance(x, kiln.Tensor))


def user_function(fn: Callable) -> Callable:
    """The function a compiled callable runs: a module's ``forward`` for its ``_call_impl``, a partial's
    function, a callable object's ``__call__``."""
    owner = getattr(fn, "__self__", None)
    module_cls = module_class()
    if module_cls is not None and isinstance(owner, module_cls) and getattr(fn, "__name__", "") == "_call_impl":
        return owner.forward
    while isinstance(fn, functools.partial):
        fn = fn.func
    if not hasattr(fn, "__code__") and not inspect.ismethod(fn) and callable(fn):
        return fn.__call__
    return fn


def _parameters(fn: Callable) -> list[inspect.Parameter]:
    target = user_function(fn)
    try:
        params = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        return []
    if target is not fn and isinstance(fn, functools.partial):  # a partial's bound arguments come first
        return []
    return params
