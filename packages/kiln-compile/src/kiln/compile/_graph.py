"""The graph a trace records: values (tensors), nodes (op calls, value guards, effects) and the readable print.

A :class:`Graph` is straight-line code over tensor *buffers*, in the order the ops ran: a node may write into
a buffer another node made (``_copy_from``, the core's one write op), so the order of the nodes is part of
the meaning and no pass may move a node across a write to what it reads. Values are numbered in the order
they appear; inputs first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import kiln
from kiln.backend import OpDef, contiguous_strides

__all__ = ["Graph", "Node", "Value", "contiguous_strides", "map_values", "written_by"]


class Value:
    """One tensor of a graph: a graph input or a node's output, with the metadata the trace saw."""

    __slots__ = ("index", "shape", "stride", "offset", "dtype", "device", "requires_grad", "source")

    def __init__(self, index: int, t: kiln.Tensor, source: str) -> None:
        self.index = index
        self.shape = tuple(t.shape)
        self.stride = t.stride()
        self.offset = t.storage_offset()  # (a view's spec gives its offset into the same storage)
        self.dtype = t.dtype
        self.device = t.device
        self.requires_grad = t.requires_grad
        self.source = source  # "input", "external" (a tensor read by reference) or "node"

    @property
    def name(self) -> str:
        """``v<index>``: how the printed graph and the generated code name it."""
        return f"v{self.index}"

    def __repr__(self) -> str:
        return self.name


class Node:
    """One step of a graph.

    ``kind`` is ``"op"`` (``op`` called with ``args``, tensors given as :class:`Value`, producing ``outputs``
    with the ``spec`` its meta function computed at trace time), ``"draw"`` (``args[0]()`` makes a tensor
    that no op makes: ``expected`` is ``"random"`` for a draw from a generator, ``"host data"`` for
    ``kiln.tensor``, ``arange`` and the like), ``"guard"`` (the values of ``args[0]`` were
    read into Python as ``expected``: a later run that reads others must re-trace), ``"set_grad"`` /
    ``"set_data"`` (``args[1]`` becomes ``args[0]``'s ``.grad`` / data; ``None`` clears ``.grad``).
    """

    __slots__ = ("kind", "op", "args", "spec", "outputs", "expected")

    def __init__(self, kind: str, op: OpDef | None, args: tuple, spec=None, outputs: tuple = (), expected=None):
        self.kind = kind
        self.op = op
        self.args = args
        self.spec = spec
        self.outputs = outputs
        self.expected = expected

    def values_read(self) -> Iterator[Value]:
        """Every :class:`Value` among the node's arguments (nested lists and tuples included)."""
        yield from _values_in(self.args)

    @property
    def writes(self) -> Value | None:
        """The buffer the node writes into, if it writes (``_copy_from``'s destination; an in-place op's
        first argument)."""
        if self.kind == "op" and "inplace" in self.op.tags:
            return self.args[0]
        return None

    @property
    def written(self) -> tuple[Value, ...]:
        """Every buffer the node may write into (:func:`written_by`)."""
        return written_by(self.op, self.args, Value) if self.kind == "op" else ()

    def __repr__(self) -> str:
        if self.kind == "op":
            outs = ", ".join(v.name for v in self.outputs)
            return f"{outs} = {self.op.name}({_render(self.args)})"
        if self.kind == "guard":
            return f"guard {self.args[0].name} == {self.expected!r}"
        if self.kind == "draw":
            return f"{self.outputs[0].name} = draw({getattr(self.args[0], '__qualname__', 'random')})"
        target = "grad" if self.kind == "set_grad" else "data"
        return f"{self.args[0].name}.{target} = {_render(self.args[1:])}"


class Graph:
    """A traced program: ``inputs`` (the call's tensors, then the tensors read by reference), ``nodes`` in
    the order they ran, ``outputs`` (tensor :class:`Value` s, flat).

    Calling the graph runs it op by op through the dispatcher (``graph(*tensors)``), autograd included: the
    reference a backend's result is checked against, and what a custom backend may return as is.

    ``dynamic`` is true when the compiled function meets this program at other shapes; ``changed`` then maps
    each value's index to the dims whose sizes differ among its traces (None: any may). A code generator may
    make kernels that read those sizes at run time (``FusedGroup.dynamic_dims``).
    """

    def __init__(self, inputs: list[Value], nodes: list[Node], outputs: list[Value]) -> None:
        self.inputs = inputs
        self.nodes = nodes
        self.outputs = outputs
        self.constants: dict[int, kiln.Tensor] = {}  # Value index -> tensor computed at compile time
        # per input, the first input sharing its memory (the trace's guarded sharing); None: not known, so the
        # passes take every input as possibly sharing memory with every other
        self.input_aliases: tuple | None = None
        # whether the compiled function meets other shapes (``kiln.compile(dynamic=...)``): code generators
        # then make kernels that take the sizes that change at run time, shared by every shape, over
        # fixed-size ones; ``changed``: by value index, the dims whose sizes differ among the traces of the
        # same program so far (None: not known, every size may)
        self.dynamic = False
        self.changed: dict[int, frozenset[int]] | None = None

    def replace(self, nodes: list[Node] | None = None, outputs: list[Value] | None = None) -> Graph:
        """A copy with other nodes or outputs (same inputs and constants): what passes return."""
        g = Graph(self.inputs, self.nodes if nodes is None else nodes, self.outputs if outputs is None else outputs)
        g.constants = dict(self.constants)
        g.input_aliases = self.input_aliases
        g.dynamic = self.dynamic
        g.changed = self.changed
        return g

    @property
    def num_ops(self) -> int:
        """How many op nodes the graph has."""
        return sum(1 for n in self.nodes if n.kind == "op")

    def __call__(self, *tensors: kiln.Tensor) -> tuple:
        """Run the graph eagerly, op by op, on ``tensors`` (one per input)."""
        return interpret(self, tensors, _dispatch_op)

    def __str__(self) -> str:
        lines = [f"graph({', '.join(v.name for v in self.inputs)}):"]
        lines += [f"    {n!r}" for n in self.nodes]
        lines.append(f"    return ({', '.join(v.name for v in self.outputs)})")
        return "\n".join(lines)

    def print_readable(self) -> str:
        """The graph as text (also printed), as ``torch.fx.GraphModule.print_readable``."""
        text = str(self)
        print(text)
        return text


def _dispatch_op(node: Node, args: tuple):
    if node.writes is not None and node.op.name == "_copy_from":  # through copy_: it keeps the version counter
        with kiln.no_grad():
            return args[0].copy_(args[1])
    return node.op(*args)


def interpret(graph: Graph, tensors: tuple, run_op: Callable[[Node, tuple], Any]) -> tuple:
    """Run ``graph`` on ``tensors`` with ``run_op(node, args)`` computing each op node; guards and effects
    act as in compiled code (a failed guard raises :class:`GuardFailure`)."""
    if len(tensors) != len(graph.inputs):
        raise TypeError(f"the graph takes {len(graph.inputs)} tensors, got {len(tensors)}")
    env: dict[int, Any] = dict(graph.constants)
    env.update((v.index, t) for v, t in zip(graph.inputs, tensors))
    for node in graph.nodes:
        args = _substitute(node.args, env)
        if node.kind == "op":
            out = run_op(node, args)
            outs = (out,) if len(node.outputs) == 1 else tuple(out)
            for v, t in zip(node.outputs, outs):
                env[v.index] = t
        elif node.kind == "draw":
            env[node.outputs[0].index] = args[0]()
        elif node.kind == "guard":
            check_guard(args[0], node.expected)
        elif node.kind == "set_grad":
            args[0].grad = args[1]
        else:
            args[0].data = args[1]
    return tuple(env[v.index] for v in graph.outputs)


class GuardFailure(Exception):
    """A value a trace read into Python differs on this run (internal: the caller re-traces)."""


def check_guard(t: kiln.Tensor, expected) -> None:
    """Raise :class:`GuardFailure` unless ``t``'s values are ``expected`` (``tolist()`` form)."""
    if t.tolist() != expected:
        raise GuardFailure


def written_by(op: OpDef, args, kind: type) -> tuple:
    """What a call of ``op`` may write into, among its arguments of type ``kind`` (a :class:`Value` in a graph,
    a tensor while tracing): nothing for an op that is not in-place, ``_copy_from``'s destination, and every
    tensor argument of another in-place op (``_amp_non_finite_check_and_unscale_`` writes its ``found_inf``
    too)."""
    if "inplace" not in op.tags:
        return ()
    if op.name == "_copy_from":
        return (args[0],)
    return tuple(_values_in(args, kind))


def _values_in(args, kind: type = Value) -> Iterator:
    for a in args:
        if isinstance(a, kind):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from _values_in(a, kind)


def map_values(args, fn):
    """``args`` with every :class:`Value` replaced by ``fn(value)`` (lists and tuples followed)."""
    out = []
    for a in args:
        if isinstance(a, Value):
            out.append(fn(a))
        elif type(a) in (list, tuple):
            out.append(type(a)(map_values(a, fn)))
        else:
            out.append(a)
    return tuple(out)


def _substitute(args, env: dict):
    """``args`` with every :class:`Value` replaced by its tensor from ``env``."""
    return map_values(args, lambda v: env[v.index])


def _render(args) -> str:
    return ", ".join(_render_one(a) for a in args)


def _render_one(a) -> str:
    if isinstance(a, Value):
        return a.name
    if isinstance(a, list):
        return f"[{_render(a)}]"
    if isinstance(a, tuple):
        return f"({_render(a)}{',' if len(a) == 1 else ''})"
    return repr(a)
