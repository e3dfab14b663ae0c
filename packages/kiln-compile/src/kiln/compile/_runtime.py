"""The compiled function: a cache of traces, each with its guards, its forward program and, when the call
needs gradients, its backward program behind one autograd node.

A call tries the cached entries in order; the first whose guards pass runs. None passing, the function is
traced again (the call itself runs eagerly under the tracer, so its results and effects are exactly eager
ones), up to ``cache_size_limit`` traces, after which it runs eagerly with a warning. When the call records
autograd, the backward pass of its outputs is traced too, right after the forward, from the op records'
formulas: the compiled forward returns what that backward reads, and ``loss.backward()`` runs the compiled
backward program (PyTorch's AOTAutograd does the same with its joint graph).
"""

from __future__ import annotations

import functools
import re
import threading
import warnings
from collections.abc import Callable
from typing import Any

import kiln
from kiln.autograd import Function
from kiln.compile import _config, _stance
from kiln.compile._backends import lookup_backend
from kiln.compile._graph import Graph, GuardFailure, Value
from kiln.compile._guards import GuardBuilder, Unguardable, flatten, global_state, holds_relaxed
from kiln.compile._marks import check_ranges, covers, kept_marks, may_vary, read_marks, source_names, trace_dims
from kiln.compile._reads import python_state, reachable_objects
from kiln.compile._trace import Tracer

__all__ = ["CompiledFunction", "Entry", "is_compiling", "note_unsupported", "shape_signature", "trace_call"]

_local = threading.local()


def is_compiling() -> bool:
    """Whether a kiln.compile trace is recording on this thread (``torch.compiler.is_compiling``)."""
    return bool(getattr(_local, "tracers", None))


def note_unsupported(reason: str) -> None:
    """Mark the trace recording on this thread (if any) as one that must run eagerly, for ``reason``."""
    tracers = getattr(_local, "tracers", None)
    if tracers:
        tracers[-1].unsupported = tracers[-1].unsupported or reason


class Entry:
    """One trace: its guard, its programs and what ``explain`` reports about it."""

    def __init__(self) -> None:
        self.guard: Callable = None
        self.guard_words: list[str] = []
        self.forward: Callable | None = None  # None: this guard set runs eagerly (``reason`` says why)
        self.backward: Callable | None = None
        self.reason: str | None = None
        # not kept: the next call traces again (the call changed its arguments, maybe once only: a cache
        # filled on first use; one that changes them on every call reaches the cache limit and runs eagerly)
        self.retrace = False
        self.graphs: list[Graph] = []
        self.breaks: list[tuple[str, str]] = []
        self.externals: list[kiln.Tensor] = []
        self.out_template: Any = None
        self.differentiable: list[bool] = []  # per tensor output: does it require grad
        self.saved: list[Value] = []  # the forward values the backward reads (returned after the user's outputs)
        # per backward input: ("grad", k) the k-th output's gradient, ("saved", j) the j-th saved forward value,
        # ("input", i) the i-th forward input, ("const", c) a tensor the backward reads by reference
        self.bw_inputs: list[tuple[str, Any]] = []
        self.bw_targets: list[int] = []  # the forward inputs the backward outputs are gradients of
        self.signature: tuple = ()  # shape_signature(graphs): equal for traces of one program at other shapes
        self.past_limit = False  # traced past cache_size_limit, of another program: it runs eagerly
        self.number = 0  # how many traces the function kept before it (PyTorch's compile id, 0/number)
        self.backend: Callable | None = None  # what compiled it (a stance's force_backend: another)
        self.n_inputs = 0  # how many of the graph's inputs are the call's tensors
        # per tensor read by reference: whether it existed before the call (a parameter, a buffer, a global's
        # tensor: its sizes are fixed) rather than being made by it (from its input's data, say)
        self.persistent: list[bool] = []
        # per input tensor (position) and dim: STATIC (marked static), (min, max) (marked dynamic) or AUTO
        # (dynamic without a mark): what another size there counts as (kiln.compile._marks.policies)
        self.dims: dict[int, dict[int, Any]] = {}

    def run(self, inputs: list) -> Any:
        """Run the compiled programs on the guarded inputs (raises GuardFailure if a value guard fails)."""
        tensors = [*inputs, *self.externals]
        if self.backward is None:
            with kiln.no_grad():
                outs = self.forward(*tensors)
        else:
            outs = _Joint.apply(self, *tensors)
        return _rebuild(self.out_template, iter(outs))


class _Joint(Function):
    """The autograd node of a compiled call: forward and backward are the entry's programs (its node is
    ``CompiledFunctionBackward``, as PyTorch's)."""

    @staticmethod
    def forward(ctx, entry: Entry, *tensors):
        outs = entry.forward(*tensors)
        n = len(entry.differentiable)
        ctx.entry = entry
        ctx.tensors = tensors
        ctx.saved_values = outs[n:]
        # what backward reads, with its versions: a later in-place write is an error, as in eager autograd
        ctx.read = [tensors[i] for kind, i in entry.bw_inputs if kind == "input"] + list(ctx.saved_values)
        ctx.versions = [t._version for t in ctx.read]
        user = tuple(outs[:n])
        fixed = []
        for t, diff in zip(user, entry.differentiable):
            if any(t is x for x in tensors):  # an input returned as is: its own history stays
                t = t.view_as(t)
            fixed.append(t)
            if not diff:
                ctx.mark_non_differentiable(t)
        return tuple(fixed)

    @staticmethod
    def backward(ctx, *grads):
        if kiln.is_grad_enabled():
            raise RuntimeError(
                "kiln.compile does not support double backward (create_graph=True) through a compiled function; "
                "run it eagerly for higher-order gradients"
            )
        entry = ctx.entry
        for t, version in zip(ctx.read, ctx.versions):
            if t._version != version:
                raise RuntimeError(
                    "one of the variables needed for gradient computation has been modified by an inplace "
                    f"operation: [{t.type()} {list(t.shape)}] is at version {t._version}; expected version "
                    f"{version} instead."
                )
        args = []
        layouts = iter(entry.graphs[1].inputs)
        for kind, i in entry.bw_inputs:
            if kind == "grad":  # the program was made for the traced gradient's layout (an expand is not it)
                args.append(_in_layout(grads[i], next(layouts)))
            elif kind == "saved":
                args.append(ctx.saved_values[i])
            else:
                args.append(ctx.tensors[i] if kind == "input" else i)
        with kiln.no_grad():
            results = entry.backward(*args)
        out = [None] * (1 + len(ctx.tensors))
        for pos, g in zip(entry.bw_targets, results):
            out[1 + pos] = g
        return tuple(out)


_Joint = type(_Joint)("CompiledFunction", (_Joint,), {"__doc__": _Joint.__doc__})


def _in_layout(t: kiln.Tensor, v: Value) -> kiln.Tensor:
    """``t`` with the strides and offset of ``v`` (a copy if it has others)."""
    if t.stride() == v.stride and t.storage_offset() == 0:
        return t
    return kiln.empty_strided(v.shape, v.stride, dtype=v.dtype, device=v.device).copy_(t)


class CompiledFunction:
    """What ``kiln.compile(fn)`` returns: calls ``fn`` through its cache of compiled traces."""

    def __init__(
        self, fn: Callable, *, backend, fullgraph: bool, options: dict | None, dynamic: bool | None = None
    ) -> None:
        self._fn = fn
        self._backend = lookup_backend(backend)
        self._fullgraph = fullgraph
        self._options = dict(options or {})
        self._dynamic = dynamic
        self._entries: list[Entry] = []
        self._traces = 0
        self._limited = 0  # the traces config.cache_size_limit counts: all but another shape of a kept one
        self._probes = 0  # traces past cache_size_limit of other programs (kept to run eagerly)
        self._shapes: dict[tuple, list[dict]] = {}  # per program (shape signature): per graph, base shape and
        # changed dims by value index
        self._warned = False
        self._diff: frozenset[str] = frozenset()  # the keys of the guards that failed on a call that was traced
        # (skip_guard_eval_unsafe tests those and the kept ones: _guards.reduced)
        self._eager_first: list | None = None  # the first call's shapes, run eagerly under eager_then_compile
        self._lock = threading.Lock()
        functools.update_wrapper(self, fn)

    def __get__(self, obj, objtype=None):  # a compiled function used as a method
        return self if obj is None else functools.partial(self, obj)

    def __call__(self, *args, **kwargs):
        if _config.disabled or is_compiling():
            return self._fn(*args, **kwargs)
        if _stance._current is not _stance.DEFAULT:  # (kiln.compiler.set_stance)
            return _stance.call(self, args, kwargs)
        # the default stance: _stance.serve's loop, inlined (each call runs it)
        for i, entry in enumerate(self._entries):  # (a list replaced, never changed: other threads may iterate it)
            try:
                inputs = entry.guard(args, kwargs)
            except Exception:  # noqa: BLE001 - a guarded object's __getattr__ raised: the state is not the traced one
                continue
            if inputs is None:
                continue
            if i:  # the entry that serves is tried first next time
                self._to_front(entry)
            if entry.forward is None:
                return self._fn(*args, **kwargs)
            try:
                return entry.run(inputs)
            except GuardFailure:  # a value read into Python differs: another entry, or a new trace
                continue
        return self._miss(args, kwargs)

    def _miss(
        self, args: tuple, kwargs: dict, backend: Callable | None = None, expected: str | None = None, depth: int = 4
    ):
        """A call no trace serves: traced (``backend``: a stance's forced one; ``expected``: the stance that let
        it through as another size of a dim a trace holds dynamic; ``depth``: the warnings' stacklevel), or run
        eagerly past the limits."""
        full = len(self._entries) >= _config.accumulated_cache_size_limit
        probe = full or self._limited >= _config.cache_size_limit
        # past cache_size_limit, a call may still be another shape of a kept trace: a trace finds out (one of
        # another program is kept to run eagerly, its call's result being eager's; after cache_size_limit such,
        # no call is traced)
        if probe and (
            full
            or self._probes >= _config.cache_size_limit
            or not (self._automatic() or self._covered_variant(args, kwargs))  # (dynamic=False: a marked dim's size)
        ):
            self._warn_limit(full, stacklevel=depth)
            return self._fn(*args, **kwargs)
        _stance.note_failures(self, args, kwargs)
        with self._lock:
            self._traces += 1
            self._limited += 0 if probe else 1
        return self._trace(args, kwargs, probe=probe, backend=backend, expected=expected, depth=depth)

    def _covered_variant(self, args: tuple, kwargs: dict) -> bool:
        """Whether a compiled trace's guards hold on the call but for sizes of dims it holds dynamic (no
        recompile in PyTorch)."""
        for e in self._entries:
            ok = lambda pos, d, n, e=e: covers(e.dims.get(pos, {}).get(d), n)
            if e.dims and e.forward is not None and holds_relaxed(e.guard, args, kwargs, ok):
                return True
        return False

    def _eager_first_call(self, args: tuple, kwargs: dict) -> bool:
        """Under ``eager_then_compile``: whether this is the function's first call (its shapes are kept: the
        dims that differ on the next call are compiled for varying sizes)."""
        if self._entries or self._traces or self._eager_first is not None:
            return False
        self._eager_first = [tuple(x.shape) for x in _tensors(args, kwargs)]
        return True

    def _warn_limit(self, full: bool, stacklevel: int) -> None:
        """Warn, once, that calls no trace serves now run eagerly (``full``: accumulated_cache_size_limit)."""
        if self._warned:
            return
        self._warned = True
        if full:
            what = (
                f"{len(self._entries)} times, other shapes included (kiln.compile.config.accumulated_cache_size_limit)"
            )
        else:
            what = f"{self._limited} times (kiln.compile.config.cache_size_limit)"
        later = (
            ""
            if full
            else f" (a new shape of a traced program still is, until {_config.cache_size_limit} other programs are met)"
        )
        warnings.warn(
            f"kiln.compile: {getattr(self._fn, '__qualname__', self._fn)} was traced {what}; it now runs eagerly "
            f"when no trace's guards hold{later}. kiln.compile.explain() shows the guards that failed.",
            stacklevel=stacklevel,
        )

    def _automatic(self) -> bool:
        """Whether traces of a kept trace's program at other shapes are told apart (``dynamic`` not False)."""
        return bool(self._dynamic) or (self._dynamic is None and _config.automatic_dynamic_shapes)

    # ---------------------------------------------------------------------------------- tracing

    def _trace(
        self,
        args: tuple,
        kwargs: dict,
        probe: bool = False,
        backend: Callable | None = None,
        expected: str | None = None,
        depth: int = 4,
    ):
        """Trace the call (``probe``: one past cache_size_limit, compiled only if it is another shape of a kept
        trace's program; ``backend``: a stance's forced one; ``expected``: see :meth:`_miss`) and return its
        result."""
        tensors = _tensors(args, kwargs)
        marks = [read_marks(t) for t in tensors]
        names = source_names(self._fn, args, kwargs) if any(marks) else []
        if names:
            try:
                check_ranges(tensors, marks, names)  # (before the call runs, as PyTorch)
            except Exception:
                self._refuse(probe)
                raise
        first, self._eager_first = self._eager_first, None
        auto = [set(range(t.dim())) if self._dynamic else set() for t in tensors]
        if first is not None and len(first) == len(tensors):  # eager_then_compile: what changed since the first call
            for dims, t, shape in zip(auto, tensors, first):
                if len(shape) == t.dim():
                    dims.update(d for d, n in enumerate(shape) if n != t.shape[d])
        forced = backend if backend is not None and backend is not self._backend else None
        with kept_marks(tensors, marks) as marked:  # (mark_static inside the call: read, then undone)
            entry, result = trace_call(self._fn, args, kwargs, fullgraph=self._fullgraph, backend=forced)
            marks = marked()
        entry.signature = shape_signature(entry.graphs, entry.guard_words)
        entry.backend = backend = backend or self._backend
        entry.n_inputs = len(tensors)
        same = self._same_program(entry)
        if expected is not None and same is None:  # let through as another size: the code took another path
            self._uncount(probe)
            if expected != "eager_on_recompile":
                raise RuntimeError(_stance.recompile_message(self, args, kwargs, expected, after=True))
            return result
        if probe and same is None:
            # another program past the limit: kept as an entry that runs eagerly, so that its calls are not
            # traced again; after cache_size_limit such, no call is
            entry.reason = entry.reason or "traced past kiln.compile.config.cache_size_limit"
            entry.past_limit = True
            with self._lock:
                self._probes += 1
            self._warn_limit(False, stacklevel=depth + 1)
        elif same is not None:
            # the program of a kept trace at other shapes: it does not count towards cache_size_limit, and the
            # kernels over the dims whose sizes changed among its traces read them at run time (the first such
            # trace compiles them; later shapes reuse them)
            with self._lock:
                self._limited -= 0 if probe else 1
                changed = self._record_changes(same, entry)
            for graph, dims in zip(entry.graphs, changed):
                graph.dynamic = True
                graph.changed = None if self._dynamic else dims  # (dynamic=True: every dim, from the first trace)
            if self._automatic():  # the input dims that changed are dynamic in this trace
                for pos, dims in enumerate(auto):
                    dims.update(changed[0].get(pos, ()))
        else:
            if self._dynamic:
                for graph in entry.graphs:
                    graph.dynamic = True
            if self._automatic():  # (a trace that may not vary, a dim marked static: the others that changed)
                self._changed_inputs(entry, auto)
        try:
            entry.dims = trace_dims(entry, tensors, marks, auto, names, same is None, bool(self._dynamic))
            if same is not None:  # the same program: what its trace makes of a dim holds (a mark's range)
                entry.dims = {p: {**entry.dims.get(p, {}), **same.dims.get(p, {})} for p in {*entry.dims, *same.dims}}
        except Exception:
            self._refuse(probe)
            raise
        if entry.reason is None:
            try:
                compile_entry(entry, backend)
            except Exception as exc:
                if self._fullgraph or not _config.suppress_errors:  # (fullgraph=True: never eager, as PyTorch)
                    raise BackendCompilerFailed(f"kiln.compile: the backend failed: {exc}") from exc
                # kept, to run eagerly: no program (a forward compiled before its backward failed would
                # run without the gradients)
                entry.forward = entry.backward = None
                entry.reason = f"the backend failed: {type(exc).__name__}: {exc}"
                warnings.warn(
                    f"kiln.compile: the backend failed ({type(exc).__name__}: {exc}); the call runs eagerly "
                    "(kiln.compile.config.suppress_errors)",
                    stacklevel=depth,
                )
        if entry.reason != "escaped" and not entry.retrace:
            with self._lock:
                entry.number = len(self._entries)
                self._entries = [*self._entries, entry]
        return result

    def _uncount(self, probe: bool) -> None:
        """A trace kept nowhere: it does not count towards cache_size_limit."""
        if not probe:
            with self._lock:
                self._limited -= 1

    def _refuse(self, probe: bool) -> None:
        """A call refused with ``ConstraintViolationError`` (before or after it ran): no trace, for
        ``trace_count`` nor for the limits."""
        self._uncount(probe)
        with self._lock:
            self._traces -= 1

    def _changed_inputs(self, entry: Entry, auto: list[set]) -> None:
        """Add to ``auto`` (per input tensor of ``entry``, a trace of no kept trace's program at other shapes)
        the dims whose sizes differ from a kept trace of its shape signature: PyTorch's automatic dynamic
        shapes, which a kept trace's marks (``mark_static``) do not carry over to other tensors."""
        new = entry.graphs[0].inputs[: entry.n_inputs]
        for e in self._entries:
            if e.signature != entry.signature or e.past_limit or e.n_inputs != entry.n_inputs:
                continue
            for dims, a, b in zip(auto, e.graphs[0].inputs, new):
                dims.update(d for d, (m, n) in enumerate(zip(a.shape, b.shape)) if m != n)

    def _same_program(self, entry: Entry) -> Entry | None:
        """A kept trace of which ``entry`` is the same program at other shapes, or None: one with its shape
        signature, other tensor geometry (the same geometry: the guards failed on other state, a module's
        attribute, which counts), the very tensors read by reference (another tensor rebound to a global is
        another program, whose memory a trace would keep) and input sizes that its dims may take
        (:func:`kiln.compile._marks.may_vary`)."""
        found = None
        for e in self._entries:
            if e.signature != entry.signature or e.past_limit:
                continue
            if e.guard_words == entry.guard_words:
                return None
            same_tensors = len(e.externals) == len(entry.externals) and all(
                a is b for a, b in zip(e.externals, entry.externals)
            )
            if found is None and same_tensors and may_vary(e, entry, self._automatic()):
                found = e
        return found

    def _record_changes(self, same: Entry, entry: Entry) -> list[dict[int, frozenset[int]]]:
        """Per graph of ``entry``, by value index: the dims whose sizes differ among the traces of its program
        (``same``'s and the ones before, which only grows: later shapes then reuse the kernels; a first trace
        compiled for varying sizes brings its dynamic dims), call with the lock held."""
        record = self._shapes.get(entry.signature)
        if record is None:  # the first trace of the program: its shapes are the base
            record = self._shapes[entry.signature] = [
                {i: (shape, set(_seed(g, i, shape))) for i, shape in _value_shapes(g).items()} for g in same.graphs
            ]
        out = []
        for graph, values in zip(entry.graphs, record):
            for i, shape in _value_shapes(graph).items():
                base, dims = values.setdefault(i, (shape, set(range(len(shape)))))
                dims.update(d for d, (a, b) in enumerate(zip(base, shape)) if a != b)
            out.append({i: frozenset(dims) for i, (_, dims) in values.items()})
        return out

    def _to_front(self, entry: Entry) -> None:
        """Put ``entry`` first, in the current list of entries."""
        with self._lock:  # from the current list: one another thread just extended (or reset) stays so
            current = self._entries
            if entry in current and current[0] is not entry:
                self._entries = [entry, *(e for e in current if e is not entry)]

    @property
    def trace_count(self) -> int:
        """How many times the function was traced (a call whose guards no trace passed traces again)."""
        return self._traces

    def _reset(self) -> None:
        with self._lock:
            self._entries = []
            self._traces = 0
            self._limited = 0
            self._probes = 0
            self._shapes = {}
            self._warned = False
            self._diff = frozenset()
            self._eager_first = None


class BackendCompilerFailed(RuntimeError):
    """The backend raised while compiling a graph (PyTorch's ``BackendCompilerFailed``)."""

    __module__ = "kiln.compile"


def trace_call(
    fn: Callable, args: tuple, kwargs: dict, *, fullgraph: bool, backend: Callable | None = None
) -> tuple[Entry, Any]:
    """Run ``fn`` once under the tracer; return the entry (guards, graphs, not yet compiled) and the result
    (``backend``: the one ``set_stance(force_backend=)`` forces, whose traces serve only under that stance)."""
    entry = Entry()
    leaves: list = []
    flatten((args, kwargs), leaves)
    gb = GuardBuilder()
    exprs: list[str] = []
    gb.structure(args, "args", exprs)
    gb.structure(kwargs, "kwargs", exprs)
    gb.check(
        f"{gb.const(global_state)}() == {gb.const(global_state())}", "grad mode, default dtype, autocast", kept=True
    )
    if backend is not None:
        gb.check(f"{gb.const(_stance.forced)}() is {gb.const(backend)}", "the stance forces its backend", kept=True)
    try:
        objects = reachable_objects(fn, leaves, gb)
    except Unguardable as exc:
        objects, unguardable = [], str(exc)
    else:
        unguardable = None
    for obj in objects:
        gb.object_state(obj)
    tensors = [x for x in leaves if isinstance(x, kiln.Tensor)]
    existing = _held_tensors(gb, objects)  # (before the call: the tensors that outlive it)
    tracer = Tracer(fullgraph)
    if unguardable:
        tracer.unsupported = f"what it reads cannot be guarded: {unguardable}"
    tracer.snapshot(_parameters(objects))
    for t in tensors:
        tracer.add_input(t, "input")
    if not hasattr(_local, "tracers"):
        _local.tracers = []
    _local.tracers.append(tracer)
    held = python_state(args, kwargs)  # (the objects stay alive: the call holds its arguments)
    try:
        with tracer:
            result = fn(*args, **kwargs)
        if python_state(args, kwargs) != held:  # a guard passes on a fresh list: the replay would skip it
            entry.retrace = True
            tracer.unsupported = tracer.unsupported or (
                "it changes a list, dict, set or object among its arguments (Python side effects are not replayed)"
            )
        out_leaves: list = []
        flatten(result, out_leaves)
        out_tensors = [x for x in out_leaves if isinstance(x, kiln.Tensor)]
        reads = [n.expected for n in tracer.nodes if n.kind == "guard"]
        for x in out_leaves:
            if not isinstance(x, kiln.Tensor) and x is not None and not any(x == r for r in reads):
                tracer.unsupported = tracer.unsupported or (
                    f"it returns a Python value ({type(x).__name__}) that the graph does not compute"
                )
        needs_grad = kiln.is_grad_enabled() and any(t.requires_grad for t in out_tensors)
        bw = _trace_backward(tracer, out_tensors) if needs_grad else None
        if bw is not None and any(n.kind == "guard" for n in bw[0].nodes):
            # a value guard fails in backward only after the forward ran compiled: nothing to retrace then
            tracer.unsupported = tracer.unsupported or "its backward reads a tensor's value into Python"
    finally:
        _local.tracers.pop()
    saved_values = bw[1] if bw is not None else []
    graph, kept = tracer.finish(out_tensors, {v.index for v in saved_values})
    entry.breaks = tracer.breaks
    entry.out_template = _template(result)
    entry.differentiable = [t.requires_grad for t in out_tensors]
    n_inputs = len(tensors)
    entry.externals = tracer.input_tensors[n_inputs:]
    entry.persistent = [id(t) in existing for t in entry.externals]
    # external tensors read by reference: their metadata, and .grad where the call read or set it
    for i, t in enumerate(entry.externals):
        gb.tensor(t, gb.const(t), f"tensor read by reference #{i}", kept=True)
    # the parameters and buffers no op read: their metadata still (self.w.dtype, self.w.shape[0] in Python)
    read_ids = {id(t) for t in (*tensors, *entry.externals)}
    for t in _parameters(objects, buffers=True):
        if id(t) not in read_ids:
            read_ids.add(id(t))
            gb.tensor(t, gb.const(t), "a parameter or buffer no op read")
    if any(n.kind == "set_grad" or (n.kind == "op" and "backward" in n.op.tags) for n in graph.nodes):
        # backward ran inside the call: the hooks its leaves had then are in the graph
        named = [*zip(tensors, exprs), *((t, gb.const(t)) for t in entry.externals)]
        for i, (t, expr) in enumerate(named):
            gb.grad_hooks(t, expr, f"tensor #{i} of the call")
    # which of the inputs and the tensors read by reference share memory: the passes assumed the traced sharing
    everything = [*exprs, *(gb.const(t) for t in entry.externals)]
    classes = _alias_classes([*tensors, *entry.externals])
    if len(classes) == len(graph.inputs):
        graph.input_aliases = classes  # the passes may rely on it: the guard below keeps it true
    if len(classes) > 1:
        gb.check(
            f"{gb.const(_alias_classes)}([{', '.join(everything)}]) == {gb.const(classes)}",
            "the inputs and the tensors read by reference share memory as traced",
            kept=True,
        )
    touched = {n.args[0].index for n in graph.nodes if n.kind == "set_grad"}
    # a .grad the call read must be the same tensor; one it set must be None or not as traced (the engine
    # assigns a first gradient and accumulates into a later one)
    read = {id(x) for x in tracer.input_tensors}
    for v, t, grad, *_rest in tracer.before:
        if grad is not None and id(grad) in read:
            gb.check(f"{gb.const(t)}.grad is {gb.const(grad)}", f"the .grad of {v.name} is the traced one")
        elif v.index in touched:
            test = "is None" if grad is None else "is not None"
            gb.check(f"{gb.const(t)}.grad {test}", f"the .grad of {v.name} {test}")
    entry.guard = gb.build(exprs)
    entry.guard_words = gb.words
    escaped = tracer.escaped(kept, out_tensors)
    if escaped:
        entry.reason = "escaped"
    elif tracer.unsupported:
        entry.reason = tracer.unsupported
    entry.graphs = [graph] if bw is None else [graph, bw[0]]
    if bw is not None:
        entry.saved = saved_values
        entry.bw_inputs, entry.bw_targets = bw[2], bw[3]
    return entry, result


def _trace_backward(fwd: Tracer, outputs: list[kiln.Tensor]):
    """Trace the backward pass of ``outputs`` (their differentiable ones) with respect to every forward
    input that requires grad: ``(graph, saved forward Values, backward inputs, targets)``, or None when
    the outputs' graph is gone (the function ran backward itself)."""
    diff = [t for t in outputs if t.requires_grad]
    targets = [i for i, t in enumerate(fwd.input_tensors) if t.requires_grad]
    grads_in = [kiln.ones_like(t) for t in diff]
    bw = _BackwardTracer(fwd)
    for g in grads_in:
        bw.add_input(g, "input")
    try:
        with bw:
            grads = kiln.autograd.grad(
                diff, [fwd.input_tensors[i] for i in targets], grads_in, retain_graph=True, allow_unused=True
            )
    except RuntimeError as exc:
        if "second time" in str(exc) or "does not require grad" in str(exc):
            return None
        raise
    pairs = [(i, g) for i, g in zip(targets, grads) if g is not None]
    graph, _ = bw.finish([g for _, g in pairs])
    if (
        bw.unsupported
    ):  # what the backward did cannot be replayed either (a formula's view(dtype)): the call runs eagerly
        fwd.unsupported = fwd.unsupported or f"its backward: {bw.unsupported}"
    bw_inputs = [("grad", [id(t) for t in outputs].index(id(d))) for d in diff]
    saved: list[Value] = []
    for t, src in zip(bw.input_tensors[len(grads_in) :], bw.sources):
        if src is None:
            bw_inputs.append(("const", t))
        elif src.source == "node":
            bw_inputs.append(("saved", len(saved)))
            saved.append(src)
        else:
            bw_inputs.append(("input", fwd.inputs.index(src)))
    return graph, saved, bw_inputs, [i for i, _ in pairs]


class _BackwardTracer(Tracer):
    """The backward's tracer: a forward tensor it meets is an input of the backward graph (saved)."""

    def __init__(self, fwd: Tracer) -> None:
        super().__init__()
        self.fwd = fwd
        self.sources: list[Value] = []  # per input after the incoming gradients: the forward Value it is

    def value_of(self, t):
        v = self.values.get(id(t))
        if v is not None and (v.shape, v.stride) == (tuple(t.shape), t.stride()):
            return v
        src = self.fwd.values.get(id(t))
        if src is not None and (src.shape, src.stride) == (tuple(t.shape), t.stride()):
            self.sources.append(src)
            return self.add_input(t, "saved")
        base = self.storages.get(id(t.untyped_storage()))
        if base is not None:
            return self._alias(t, base)
        fwd_base = self.fwd.storages.get(id(t.untyped_storage()))
        if fwd_base is not None:  # a view of a forward buffer made outside the dispatcher: save the buffer
            self.sources.append(fwd_base)
            base = self.add_input(self.fwd.tensors[fwd_base.index], "saved")
            return self._alias(t, base)
        self.sources.append(None)  # made outside the dispatcher by a formula: read by reference
        return self.add_input(t, "external")


def compile_entry(entry: Entry, backend: Callable) -> None:
    """Give the entry its programs: the backend compiles the forward graph (extended with the values the
    backward reads) and the backward graph."""
    graph = entry.graphs[0]
    if entry.saved:
        graph = graph.replace(outputs=[*graph.outputs, *entry.saved])
    entry.forward = backend(graph, [])
    if len(entry.graphs) > 1:
        entry.backward = backend(entry.graphs[1], [])


def shape_signature(graphs: list[Graph], guard_words: list[str]) -> tuple:
    """What the traces of one program at different shapes have in common: the graphs and the guards with
    every shape, stride, offset and int argument (a size or an index the code computed) left out, and
    everything else kept: the ops, what reads what, dtypes, devices, ranks, floats, the values read into
    Python and every other guard (a ``.grad`` that is None, a module's training flag)."""

    def arg(a):
        if isinstance(a, Value):
            return ("v", a.index)
        if type(a) is int:
            return int
        if isinstance(a, (list, tuple)):  # a named tuple too (a normalization's layout holds its shapes)
            return (type(a).__name__, *map(arg, a))
        if type(a) is slice:  # x[:, : x.shape[1] // 2], chunk
            return ("slice", arg(a.start), arg(a.stop), arg(a.step))
        if type(a) is float:
            return ("float", repr(a))  # (NaN equals NaN so; 0.0 and -0.0 differ)
        if a is None or type(a) in (bool, str) or isinstance(a, (kiln.dtype, kiln.device)):
            return a
        return repr(a)  # (an object's repr names it: another object, another program)

    def value(v: Value) -> tuple:
        return (v.index, v.dtype, str(v.device), len(v.shape), v.requires_grad, v.source)

    out: list = []
    for graph in graphs:
        out.append(tuple(map(value, graph.inputs)))
        for node in graph.nodes:
            expected = repr(node.expected) if node.kind == "guard" else node.expected
            name = node.op.name if node.op is not None else None
            args = ("draw",) if node.kind == "draw" else arg(node.args)
            out.append((node.kind, name, args, tuple(map(value, node.outputs)), expected))
        out.append(tuple(v.index for v in graph.outputs))
    out += [_GEOMETRY.sub(lambda m: re.sub(r"\d+", "#", m.group()), w) for w in guard_words]
    return tuple(out)


# a tensor's geometry in a guard's words (``_guards._describe_meta``): left out of shape_signature
_GEOMETRY = re.compile(r"shape \[[\d, ]*\], strides \([\d, ]*\), offset \d+")


def _seed(graph: Graph, i: int, shape: tuple):
    """The dims of value ``i`` that a program's first trace compiled for varying sizes (every dim of a value it
    did not follow; none for a trace compiled for its shapes)."""
    if not graph.dynamic:
        return ()
    if graph.changed is None or i not in graph.changed:
        return range(len(shape))
    return graph.changed[i]


def _value_shapes(graph: Graph) -> dict[int, tuple]:
    """The shape of each value of ``graph``, by index."""
    out = {v.index: v.shape for v in graph.inputs}
    out.update((v.index, v.shape) for node in graph.nodes for v in node.outputs)
    return out


def _tensors(args: tuple, kwargs: dict) -> list[kiln.Tensor]:
    """The tensors of a call, in :func:`~kiln.compile._guards.flatten`'s order (the graph's first inputs)."""
    leaves: list = []
    flatten((args, kwargs), leaves)
    return [x for x in leaves if isinstance(x, kiln.Tensor)]


def _held_tensors(gb: GuardBuilder, objects: list) -> set[int]:
    """The ids of the tensors known to exist before a call: those its guards hold (a global's, a closure's, an
    object's attribute) and the parameters, buffers and tensor attributes of the modules it reads."""
    out = {id(v) for v in gb.consts.values() if isinstance(v, kiln.Tensor)}
    out.update(id(t) for t in _parameters(objects, buffers=True))
    for obj in objects:
        out.update(id(v) for v in getattr(obj, "__dict__", {}).values() if isinstance(v, kiln.Tensor))
    return out


def _parameters(objects: list, buffers: bool = False) -> list[kiln.Tensor]:
    """The parameters of the modules and optimizers among ``objects`` (and the modules' buffers)."""
    out = []
    for obj in objects:
        if hasattr(obj, "param_groups"):
            out += [p for g in obj.param_groups for p in g["params"]]
        elif hasattr(obj, "parameters"):
            out += list(obj.parameters())
            if buffers and hasattr(obj, "buffers"):
                out += [b for b in obj.buffers() if b is not None]
    return out


def _alias_classes(tensors: list) -> tuple:
    first: dict[int, int] = {}
    return tuple(first.setdefault(id(t.untyped_storage()), i) for i, t in enumerate(tensors))


class _Slot:
    """A tensor's place in a result's structure."""


_SLOT = _Slot()


def _template(obj):
    if isinstance(obj, kiln.Tensor):
        return _SLOT
    if type(obj) in (tuple, list):
        return type(obj)(_template(x) for x in obj)
    if type(obj) is dict:
        return {k: _template(v) for k, v in obj.items()}
    return obj


def _rebuild(template, tensors):
    if template is _SLOT:
        return next(tensors)
    if type(template) in (tuple, list):
        return type(template)(_rebuild(x, tensors) for x in template)
    if type(template) is dict:
        return {k: _rebuild(v, tensors) for k, v in template.items()}
    return template
