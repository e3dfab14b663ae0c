"""Tracing: run the function once, eagerly, under a post-autograd dispatch mode that records every op.

The tracer sees what the dispatcher runs below autograd — the forward ops, the backward formulas' ops when
``backward()`` runs inside, and every write (the core routes ``copy_``, the in-place variants and ``.grad``
accumulation through the modes) — and every value read into Python (``DispatchMode.host_read``). Tensors it
meets that no recorded op made are resolved in this order: a call's input; a view of a buffer the graph
knows (``detach()``, ``.data``: the same storage), recorded as ``as_strided``; otherwise a tensor read by
reference (a parameter, a buffer, optimizer state, a constant made outside the dispatcher).

After the call, what the function did outside the ops is compared with the state before: a new ``.grad`` or
``.data`` on a tensor it read becomes an effect node; a tensor made inside that is still alive, neither
returned nor saved for backward, has escaped into Python state (an optimizer's first step creating its
moments), and the trace is marked not replayable, as are the other things a replay could not reproduce
(see :attr:`Trace.unsupported`).
"""

from __future__ import annotations

import gc
import sys
import weakref
from typing import Any

import kiln
from kiln.backend import DispatchMode, op
from kiln.compile._graph import Graph, Node, Value, written_by
from kiln.compile._reads import kiln_module, user_file

__all__ = ["GraphBreakError", "Tracer", "user_frame"]

_AS_STRIDED = op("as_strided")


class GraphBreakError(RuntimeError):
    """``fullgraph=True`` and the function did something a single graph cannot hold (a value read into
    Python, a tensor handed to NumPy); the message names the line (PyTorch raises ``torch._dynamo.exc.Unsupported``)."""

    __module__ = "kiln.compile"


class Tracer(DispatchMode):
    """The recording mode (one per trace). ``fullgraph``: raise :class:`GraphBreakError` at the first break."""

    level = "post_autograd"

    def __init__(self, fullgraph: bool = False) -> None:
        self.fullgraph = fullgraph
        self.values: dict[int, Value] = {}  # id(tensor) -> Value
        self.tensors: dict[int, kiln.Tensor] = {}  # Value index -> tensor: every tensor met stays alive (unique ids)
        self.inputs: list[Value] = []
        self.input_tensors: list[kiln.Tensor] = []
        self.nodes: list[Node] = []
        self.storages: dict[int, Value] = {}  # id(storage) -> a Value over it (inputs and node outputs)
        self.outside: set[int] = set()  # ids of the storages of inputs and tensors read by reference
        self.before: list[
            tuple
        ] = []  # per input: (Value, tensor, grad, storage, geometry, requires_grad) at first sight
        self.made_refs: list[weakref.ref] = []  # node outputs (for the escape check)
        self.made: dict[int, Node] = {}  # id(tensor) -> the node that remakes a tensor made outside the dispatcher
        self.breaks: list[tuple[str, str]] = []  # (what, where)
        self.unsupported: str | None = None  # why a replay could not reproduce this call
        self.wrote_outside = False
        self.reading = False
        self.grads_at_start: dict[int, Any] = {}  # id(tensor) -> its .grad when the call began (see snapshot)

    def snapshot(self, tensors) -> None:
        """Remember the ``.grad`` of ``tensors`` (the parameters the function can reach) as the call begins:
        a tensor first met after the call changed its ``.grad`` (``zero_grad()`` before the forward) is
        compared with that, not with what it had when met."""
        for t in tensors:
            self.grads_at_start[id(t)] = (t, t.grad)

    # ---------------------------------------------------------------------------------- values

    def add_input(self, t: kiln.Tensor, source: str) -> Value:
        """Make ``t`` a graph input (``source``: ``"input"`` for the call's tensors, ``"external"`` for the
        tensors read by reference)."""
        v = Value(len(self.inputs) + len(self.made_refs), t, source)
        self._know(t, v)
        self.inputs.append(v)
        self.input_tensors.append(t)
        storage = id(t.untyped_storage())
        self.outside.add(storage)
        self.storages.setdefault(storage, v)
        start = self.grads_at_start.get(id(t))
        grad = start[1] if start is not None and start[0] is t else t.grad
        self.before.append((v, t, grad, t.untyped_storage(), _geometry(t), t.requires_grad))
        return v

    def _know(self, t: kiln.Tensor, v: Value) -> None:
        self.values[id(t)] = v
        self.tensors[v.index] = t

    def value_of(self, t: kiln.Tensor) -> Value:
        """The Value of a tensor met as an argument or an output (resolving tensors no op made)."""
        v = self.values.get(id(t))
        if v is not None and (v.shape, v.stride) == (tuple(t.shape), t.stride()):
            return v
        base = self.storages.get(id(t.untyped_storage()))
        if base is None:
            return self.add_input(t, "external")
        return self._alias(t, base)

    def _alias(self, t: kiln.Tensor, base: Value) -> Value:
        """``t`` is a view of ``base``'s buffer made outside the dispatcher: record it as ``as_strided``."""
        args = (base, tuple(t.shape), t.stride(), t.storage_offset())
        spec = _AS_STRIDED.meta(self.tensors[base.index], *args[1:])
        v = self._new_value(t)
        self.nodes.append(Node("op", _AS_STRIDED, args, spec, (v,)))
        return v

    def _new_value(self, t: kiln.Tensor) -> Value:
        v = Value(len(self.inputs) + len(self.made_refs), t, "node")
        self._know(t, v)
        self.storages.setdefault(id(t.untyped_storage()), v)
        try:
            self.made_refs.append(weakref.ref(t))
        except TypeError:  # a tensor subclass without weak references: never reported as escaped
            self.made_refs.append(lambda: None)
        return v

    def template(self, a: Any) -> Any:
        """``a`` with every tensor replaced by its Value (lists and tuples followed)."""
        if isinstance(a, kiln.Tensor):
            return self.value_of(a)
        if isinstance(a, (list, tuple)) and any(isinstance(x, (kiln.Tensor, list, tuple)) for x in a):
            return type(a)(self.template(x) for x in a) if type(a) in (list, tuple) else a
        return a

    # ---------------------------------------------------------------------------------- the mode

    def dispatch(self, op, args, redispatch):
        """Run the op, then record it with the spec its meta function gives."""
        if self.reading:
            return redispatch(op, args)
        tmpl = tuple(self.template(a) for a in args)
        spec = op.meta(*args)
        out = redispatch(op, args)
        outs = (out,) if op.num_outputs == 1 else tuple(out)
        if "inplace" in op.tags:
            if any(id(t.untyped_storage()) in self.outside for t in written_by(op, args, kiln.Tensor)):
                self.wrote_outside = True
            # the written buffer keeps its Value; an op returning it makes none
            values = tuple(self.values[id(o)] if id(o) in self.values else self._new_value(o) for o in outs)
        else:
            values = tuple(self._new_value(o) for o in outs)
        self.nodes.append(Node("op", op, tmpl, spec, values))
        return out

    def before_grad_set(self, tensor):
        """``tensor.grad`` is about to change (``zero_grad()``): the first time, what it held is the state
        the call found, whatever the tensor is met as later."""
        if not self.reading and id(tensor) not in self.grads_at_start and id(tensor) not in self.values:
            self.grads_at_start[id(tensor)] = (tensor, tensor.grad)

    def made_outside(self, tensor, remake):
        """A tensor made outside the dispatcher (host data, a random draw): a node that makes another on every
        run. A second notice for the same tensor (a draw made through ``kiln.tensor``'s path) wins."""
        if self.reading:
            return
        random = "random" if getattr(remake, "random", False) else "host data"
        node = self.made.get(id(tensor))
        if node is not None:
            node.args, node.expected = (remake,), random
            return
        v = self._new_value(tensor)
        node = Node("draw", None, (remake,), outputs=(v,), expected=random)
        self.made[id(tensor)] = node
        self.nodes.append(node)

    def generator_reset(self, generator):
        """A generator is started, seeded or has its state set during the call: the draws after it come from
        a stream a replay would not reset, so the call runs eagerly (a graph break; with ``fullgraph=True``,
        an error)."""
        if self.reading:
            return
        where = user_frame()
        self._break(
            "a random generator started, seeded or its state set (Generator(), manual_seed, set_rng_state)", where
        )
        self.unsupported = self.unsupported or f"a random generator is started, seeded or its state set at {where}"

    def host_read(self, tensor, how):
        """A value left for Python: a guard node (the replay checks the same values come out), or a break."""
        if self.reading:
            return
        where = user_frame()
        if how == "numpy":
            self._break("a tensor's memory handed to NumPy (numpy() or __array__)", where)
            self.unsupported = self.unsupported or f"a tensor's memory is handed to NumPy at {where}"
            return
        if how == "view(dtype)":  # a tensor over the same bytes that no op makes: a replay would read this call's
            self._break("a tensor's bytes viewed as another dtype (view(dtype))", where)
            self.unsupported = self.unsupported or f"a tensor's bytes are viewed as another dtype at {where}"
            return
        self._break("a tensor's value read into Python (item(), bool(), tolist(), int(), float())", where)
        if self.wrote_outside:
            self.unsupported = self.unsupported or (
                f"a value is read into Python at {where} after a write to an input or a tensor read by reference"
            )
        v = self.value_of(tensor)
        self.reading = True
        try:
            expected = tensor.tolist()
        finally:
            self.reading = False
        self.nodes.append(Node("guard", None, (v,), expected=expected))

    def _break(self, what: str, where: str) -> None:
        if self.fullgraph:
            raise GraphBreakError(
                f"kiln.compile(fullgraph=True): {what} at {where} breaks the graph; compile without "
                "fullgraph=True to guard on the value instead"
            )
        self.breaks.append((what, where))

    # ---------------------------------------------------------------------------------- after the call

    def finish(self, outputs: list[kiln.Tensor], saved: set[int] = frozenset()) -> Graph:
        """The graph of the call: ``outputs`` resolved, the effects on inputs and tensors read by reference
        appended, and :attr:`unsupported` set if the call did what a replay would not reproduce."""
        out_values = [self.value_of(t) for t in outputs]
        for v, t, grad, storage, geometry, requires_grad in list(self.before):
            if t.untyped_storage() is not storage:
                base = self.storages.get(id(t.untyped_storage()))
                if base is None:
                    self.unsupported = self.unsupported or "a tensor's .data is set to a tensor made outside the graph"
                else:
                    self.nodes.append(Node("set_data", None, (v, self._alias(t, base))))
            elif _geometry(t) != geometry:
                self.unsupported = self.unsupported or "an input's shape or strides are changed in place"
            if t.requires_grad != requires_grad:
                self.unsupported = self.unsupported or "an input's requires_grad is changed"
            if t.grad is not grad:
                new = None if t.grad is None else self.value_of(t.grad)
                self.nodes.append(Node("set_grad", None, (v, new)))
        kept = {v.index for v in out_values} | set(saved)
        kept |= {n.args[1].index for n in self.nodes if n.kind in ("set_grad", "set_data") and n.args[1] is not None}
        return Graph(self.inputs, self.nodes, out_values), kept

    def escaped(self, kept: set[int], outputs: list[kiln.Tensor]) -> list[Value]:
        """Node outputs still alive once the tracer lets go, other than those in ``kept`` (returned, saved
        for backward, set as ``.grad``), the bases they view and what the outputs' autograd graph holds:
        tensors the call stored in Python state."""
        holders = [self.tensors[i] for i in kept if i in self.tensors]
        keep_ids = _autograd_held(outputs)
        for t in holders:  # a kept view keeps its base alive
            while t is not None:
                keep_ids.add(id(t))
                t = getattr(t, "_base", None)
        self.tensors.clear()

        def alive() -> list[Value]:
            out = []
            for ref in self.made_refs:
                t = ref()
                if t is None or id(t) in keep_ids:
                    continue
                v = self.values.get(id(t))
                if v is not None and v.source == "node" and v.index not in kept:
                    out.append(v)
            return out

        # the call's garbage in reference cycles is young: the two young generations first (under 1 ms), the
        # whole heap (9 ms with kiln loaded, 70 ms with PyTorch too) only if a tensor still seems alive
        gc.collect(1)
        if not alive():
            return []
        gc.collect()
        return alive()


def _autograd_held(outputs: list[kiln.Tensor]) -> set[int]:
    """Ids of the tensors the autograd graph of ``outputs`` keeps (saved tensors, and what a node keeps after
    backward freed them): walked through the graph's own objects (its nodes, their saved values, containers)."""
    held: set[int] = set()
    seen: set[int] = set()
    stack = [t.grad_fn for t in outputs if t.grad_fn is not None]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        for r in gc.get_referents(obj):
            if isinstance(r, kiln.Tensor):
                held.add(id(r))
            elif isinstance(r, (tuple, list, dict)) or type(r).__module__.startswith("kiln.autograd"):
                stack.append(r)
    return held


def _geometry(t: kiln.Tensor) -> tuple:
    return (tuple(t.shape), t.stride(), t.storage_offset())


def user_frame() -> str:
    """``file:line`` of the innermost frame outside kiln, its packages, the standard library and installed
    packages (the user's line; a ``contextlib`` frame between kiln's is not it)."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        internal = kiln_module(name) or not user_file(frame.f_code.co_filename)
        if not internal:
            return f"{frame.f_code.co_filename}:{frame.f_lineno} (in {frame.f_code.co_name})"
        frame = frame.f_back
    return "<unknown>"
