"""Graph passes: writes folded into dataflow, dead code, common subexpressions, constant folding.

Every pass respects the one thing that makes a kiln graph more than a dataflow graph: writes. A buffer that
is written (``_copy_from`` and the other ``inplace`` ops), and every view of it, is never merged with
another or folded into a constant, and no write, random op or effect is ever removed.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import kiln
from kiln.backend import OpDef, call_kernel, decomposition
from kiln.compile._graph import Graph, Node, Value, map_values

__all__ = [
    "common_subexpressions",
    "dead_code",
    "decompose",
    "drop_last_copies",
    "fold_constants",
    "fold_writes",
    "optimize",
]

_KEEP_TAGS = frozenset({"inplace", "random", "nondeterministic", "dynamic_shape"})


def optimize(graph: Graph) -> Graph:
    """The default pipeline: fold writes and constants, merge repeated computations, drop copies of values
    nothing else reads, drop what nothing uses."""
    return dead_code(drop_last_copies(common_subexpressions(fold_constants(fold_writes(graph)))))


def _written_classes(graph: Graph) -> set[int]:
    """Indices of every Value that shares a buffer with one that is written (views followed both ways)."""
    roots = [v for n in graph.nodes for v in n.written]
    return _sharing(graph, roots + [n.args[0] for n in graph.nodes if n.kind == "set_data"])


def _returned_classes(graph: Graph) -> set[int]:
    """Indices of every Value that shares a buffer with an output: each call must return new buffers."""
    return _sharing(graph, list(graph.outputs))


def _sharing(graph: Graph, values: list[Value]) -> set[int]:
    """Indices of every Value that shares a buffer with one of ``values`` (views followed both ways)."""
    classes = _view_classes(graph)
    roots = {classes.get(v.index, v.index) for v in values}
    return {i for i, c in classes.items() if c in roots}


def _view_classes(graph: Graph) -> dict[int, int]:
    """Value index -> its buffer's class: the Values that share a buffer through views have one class."""
    parent: dict[int, int] = {}

    def find(i: int) -> int:
        while parent.get(i, i) != i:
            i = parent[i]
        return i

    for node in graph.nodes:
        if node.kind == "op" and "view" in node.op.tags:
            src = next(node.values_read(), None)
            if src is not None:
                for v in node.outputs:
                    parent[find(v.index)] = find(src.index)
    # inputs sharing memory as the trace found (a tensor and its view passed as two arguments); unknown: all
    aliases = graph.input_aliases or (0,) * len(graph.inputs)
    first: dict[int, int] = {}
    for v, a in zip(graph.inputs, aliases):
        other = first.setdefault(a, v.index)
        if other != v.index and find(v.index) != find(other):
            parent[find(v.index)] = find(other)
    every = {v.index for v in graph.inputs} | {v.index for n in graph.nodes for v in n.outputs}  # a write's is its dst
    return {i: find(i) for i in every}


def next_change(nodes: list[Node], start: int, buffer: int, classes: dict) -> int:
    """The position of the first node after ``start`` that may write into the buffer of class ``buffer``
    (through any view of it; :attr:`Node.written`) or replaces it (``.data``); ``len(nodes)`` if none does."""
    for pos in range(start + 1, len(nodes)):
        node = nodes[pos]
        if node.written:
            if any(classes.get(v.index, v.index) == buffer for v in node.written):
                return pos
        elif node.kind == "set_data" and any(classes.get(v.index, v.index) == buffer for v in node.values_read()):
            return pos
    return len(nodes)


def _is_copy(node: Node) -> bool:
    return node.kind == "op" and node.op.name == "_copy_from"


def fold_writes(graph: Graph) -> Graph:
    """Writes that only move a value into a buffer become dataflow, so that the value is not copied and the
    ops on either side of the write may fuse. A write ``_copy_from(dst, src)`` qualifies when ``src`` is a
    value the graph made that nothing but the write reads, of ``dst``'s shape, dtype and strides, and no view
    of either buffer exists in the graph. Then:

    * ``dst`` made by the graph too (a temporary, never ``.grad`` or ``.data``): the write goes, and the
      nodes after it read ``src`` for ``dst`` (``(v.sqrt() / c).add_(eps)``: no copy);
    * ``dst`` an input written again later with only ops in between: the first write goes, and the ops in
      between read ``src`` for ``dst`` (``v.mul_(b2).addcmul_(g, g, value=1 - b2)``: one copy, not two);
    * ``dst`` an input otherwise: the write stays (it is what the call does to the input), and the nodes
      after it, up to the next write into ``dst``, read ``src`` for ``dst``, so that what computes ``src``
      and what reads it may fuse (an optimizer's moment, updated, then read by the parameter's update).

    Every other write stays, in its place. Inputs that share memory (as the trace found them, and its guard
    keeps them) count as views of each other. A dropped write is not counted by the input's version counter
    (one count for ``v.mul_(b).addcmul_(...)``, where eager code counts two): autograd only asks whether it
    changed."""
    nodes = list(graph.nodes)  # the ops between a dropped write and the next get renamed in place
    readers: dict[int, int] = {}
    for node in nodes:
        for v in node.values_read():
            readers[v.index] = readers.get(v.index, 0) + 1
    for v in graph.outputs:
        readers[v.index] = readers.get(v.index, 0) + 1
    classes = _view_classes(graph)
    sizes: dict[int, int] = {}
    for c in classes.values():
        sizes[c] = sizes.get(c, 0) + 1
    shared = {i: sizes[c] for i, c in classes.items()}  # 1: no view shares the buffer
    effects = {v.index for n in nodes if n.kind in ("set_grad", "set_data") for v in n.values_read()}
    inputs = {v.index for v in graph.inputs}
    received: set[int] = set()  # Values now read in place of another: more readers than counted

    def movable(dst: Value, src: Value) -> bool:
        return (
            src.source == "node"
            and src.index not in inputs
            and src.index not in received
            and src.index not in graph.constants
            and dst.index not in graph.constants
            and readers.get(src.index, 0) == 1
            and shared.get(src.index, 1) == 1
            and shared.get(dst.index, 1) == 1
            and dst.index not in effects
            and src.index not in effects
            and (dst.shape, dst.dtype, dst.stride, dst.device) == (src.shape, src.dtype, src.stride, src.device)
        )

    def next_write(start: int, dst: Value) -> int | None:
        """The position of the next write into ``dst`` after ``start``, if only ops come before it."""
        for pos in range(start + 1, len(nodes)):
            node = nodes[pos]
            if node.kind != "op":
                return None
            if node.writes is not None and node.writes.index == dst.index:
                return pos if _is_copy(node) else None
        return None

    def forward_reads(start: int, end: int, dst: Value, src: Value) -> None:
        """The nodes in ``(start, end)`` read ``src`` for ``dst``; a write's destination stays what it is."""
        received.add(src.index)
        for p in range(start + 1, end):
            n = nodes[p]
            if any(v.index == dst.index for v in n.values_read()):
                if n.writes is not None:  # a write from dst into another tensor (its destination is not dst)
                    n = Node(n.kind, n.op, (n.args[0], *_rename_args(n.args[1:], {dst.index: src})), n.spec,
                             n.outputs, n.expected)  # fmt: skip
                else:
                    n = _renamed(n, {dst.index: src})
                nodes[p] = n

    rename: dict[int, Value] = {}
    out: list[Node] = []
    for pos, node in enumerate(nodes):
        node = _renamed(node, rename)
        if _is_copy(node):
            dst, src = node.args[0], node.args[1]
            if isinstance(dst, Value) and isinstance(src, Value) and movable(dst, src):
                if dst.source == "node" and dst.index not in inputs:
                    for k, v in rename.items():  # dst may itself stand for an earlier temporary
                        if v is dst:
                            rename[k] = src
                    rename[dst.index] = src
                    received.add(src.index)
                    continue
                later = next_write(pos, dst)
                if later is not None:
                    # until the next write, the input's value is src: the ops in between, and that write's
                    # value, read it directly
                    forward_reads(pos, later + 1, dst, src)
                    continue
                forward_reads(pos, next_change(nodes, pos, classes.get(dst.index, dst.index), classes), dst, src)
        out.append(node)
    if out == graph.nodes:
        return graph
    outputs = [rename.get(v.index, v) for v in graph.outputs]
    return graph.replace(nodes=out, outputs=outputs)


def drop_last_copies(graph: Graph) -> Graph:
    """A ``clone`` of a buffer the graph made, which nothing reads or writes after the copy, becomes the
    buffer itself: the copy was only needed because something else still held the buffer.

    Eager autograd hands a gradient to a leaf's ``.grad`` without copying it when nothing else holds it, and
    copies it otherwise; while tracing, the tracer holds every tensor, so the trace records the copy (a whole
    weight gradient on every compiled step). The copy goes when its source has the layout of the tensor that
    made the buffer (shape, strides, dtype, device: the same elements, so the copy would be that tensor; a
    weight gradient arrives as ``t(transpose(m))`` of its product ``m``), and no view of that buffer is read,
    written, returned or set as ``.grad`` or ``.data`` after the copy. The copy's readers then read the
    maker's tensor."""
    classes = _view_classes(graph)
    made = {v.index for n in graph.nodes for v in n.outputs if n.kind == "op" and "view" not in n.op.tags}
    members: dict[int, list[Value]] = {}
    for n in graph.nodes:
        for v in n.outputs:
            members.setdefault(classes.get(v.index, v.index), []).append(v)
    inputs = {v.index for v in graph.inputs}
    last_use: dict[int, int] = {}  # buffer class -> the last node position that reads, writes or keeps it
    for pos, n in enumerate(graph.nodes):
        for v in (*n.values_read(), *n.outputs):
            last_use[classes.get(v.index, v.index)] = pos
    end = len(graph.nodes)
    for v in graph.outputs:
        last_use[classes.get(v.index, v.index)] = end
    joined: dict[int, int] = {}  # a dropped copy's buffer class -> the class of the buffer it now is

    def buffer_of(v: Value) -> int:
        c = classes.get(v.index, v.index)
        while c in joined:
            c = joined[c]
        return c

    rename: dict[int, Value] = {}
    nodes = []
    for pos, node in enumerate(graph.nodes):
        node = _renamed(node, rename)
        if node.kind == "op" and node.op.name == "clone" and isinstance(node.args[0], Value):
            src, (out,) = node.args[0], node.outputs
            buffer = buffer_of(src)
            group = members.get(buffer, [])
            # the buffer's maker: its one non-view output (a dropped copy's output is that maker now)
            owners = [v for v in group if v.index in made and v.index not in rename]
            if (
                src.source == "node"
                and last_use.get(buffer) == pos  # (the clone's own read)
                and not any(v.index in inputs or v.index in graph.constants for v in group)
                and len(owners) == 1
                and _layout(owners[0]) == _layout(src) == _layout(out)
            ):
                rename[out.index] = owners[0]  # (the maker's own tensor: a view of it would be seen as one)
                mine = classes.get(out.index, out.index)  # the copy's buffer, and its views, are the maker's now
                joined[mine] = buffer
                members[buffer] = group + members.pop(mine, [])
                last_use[buffer] = max(pos, last_use.pop(mine, pos))
                continue
        nodes.append(node)
    if not rename:
        return graph
    outputs = [rename.get(v.index, v) for v in graph.outputs]
    return graph.replace(nodes=nodes, outputs=outputs)


def _layout(v: Value) -> tuple:
    return (v.shape, v.stride, v.dtype, v.device)


def _pure(node: Node) -> bool:
    return node.kind == "op" and not (node.op.tags & _KEEP_TAGS)


def dead_code(graph: Graph) -> Graph:
    """Drop the op nodes whose outputs nothing reads (writes, random ops, guards and effects stay)."""
    used = {v.index for v in graph.outputs}
    kept = []
    for node in reversed(graph.nodes):
        if _pure(node) and not any(v.index in used for v in node.outputs):
            continue
        used.update(v.index for v in node.values_read())
        kept.append(node)
    kept.reverse()
    return graph.replace(nodes=kept)


def common_subexpressions(graph: Graph) -> Graph:
    """Compute a pure op on the same arguments once (never on a buffer that is written)."""
    written = _written_classes(graph) | _returned_classes(graph)  # a merged output would alias another
    seen: dict[tuple, tuple[Value, ...]] = {}
    rename: dict[int, Value] = {}
    nodes = []
    for node in graph.nodes:
        node = _renamed(node, rename)
        if _pure(node) and not any(v.index in written for v in (*node.values_read(), *node.outputs)):
            key = _key(node)
            if key is not None:
                prior = seen.get(key)
                if prior is not None:
                    for old, new in zip(node.outputs, prior):
                        rename[old.index] = new
                    continue
                seen[key] = node.outputs
        nodes.append(node)
    outputs = [rename.get(v.index, v) for v in graph.outputs]
    return graph.replace(nodes=nodes, outputs=outputs)


def fold_constants(graph: Graph) -> Graph:
    """Compute once, at compile time, the pure ops whose arguments hold no tensor the call supplies (a
    ``zeros`` the function makes, and what is computed from it alone). A result that is returned or
    written stays computed on every call: each call must return new tensors."""
    written = _written_classes(graph)
    returned = _returned_classes(graph)  # an output, or a view of one, is new on every call
    constants: dict[int, kiln.Tensor] = {}
    nodes = []
    for node in graph.nodes:
        if (
            node.kind == "draw"
            and node.expected != "random"
            and not any(v.index in written or v.index in returned for v in node.outputs)
        ):  # kiln.tensor(...), arange(...): the same values on every call
            constants[node.outputs[0].index] = node.args[0]()
            continue
        reads = list(node.values_read())
        if (
            _pure(node)
            and all(v.index in constants for v in reads)
            and not any(v.index in written or v.index in returned for v in node.outputs)
        ):
            args = _bind(node.args, constants)
            with kiln.no_grad():
                out = call_kernel(node.op, args, node.spec)
            outs = (out,) if len(node.outputs) == 1 else tuple(out)
            for v, t in zip(node.outputs, outs):
                constants[v.index] = t
            continue
        nodes.append(node)
    if not constants:
        return graph
    # folded values still read by the remaining nodes become constants of the graph
    needed = {v.index for n in nodes for v in n.values_read()} & set(constants)
    graph = graph.replace(nodes=nodes)
    graph.constants.update((i, constants[i]) for i in needed)
    return graph


def _bind(args, env: dict):
    return map_values(args, lambda v: env[v.index])


def _renamed(node: Node, rename: dict[int, Value]) -> Node:
    if not rename or not any(v.index in rename for v in node.values_read()):
        return node
    return Node(node.kind, node.op, _rename_args(node.args, rename), node.spec, node.outputs, node.expected)


def _rename_args(args, rename):
    return map_values(args, lambda v: rename.get(v.index, v))


def _key(node: Node):
    """A hashable identity of (op, arguments), or None if an argument cannot be compared safely."""
    try:
        key = (node.op.name, _freeze(node.args))
        hash(key)
    except TypeError:
        return None
    return key


def _freeze(a):
    if isinstance(a, Value):
        return ("v", a.index)
    if type(a) in (list, tuple):
        return (type(a).__name__, tuple(_freeze(x) for x in a))
    if isinstance(a, float):
        return ("f", a.hex())  # 0.0 and -0.0 differ; nan equals itself here
    if isinstance(a, (int, bool, str, type(None), kiln.dtype, kiln.device)):
        return (type(a).__name__, a)
    raise TypeError("not comparable")


def decompose(graph: Graph, keep: Callable[[OpDef], bool], depth: int = 8) -> Graph:
    """Replace each op node that ``keep`` rejects, and that has a decomposition (:func:`kiln.backend.decomposition`),
    with the ops of that decomposition, traced on tensors of the node's metadata; again on what comes out
    (``depth`` levels). A node whose decomposition reads values, draws random numbers, writes, makes tensors
    outside the dispatcher or returns an input stays as it is. ``keep`` is what the consumer handles: the
    ONNX exporter's ops, or the fusible ops of a code generator."""
    fresh = itertools.count(
        1 + max([v.index for v in graph.inputs] + [v.index for n in graph.nodes for v in n.outputs])
    )
    nodes = graph.nodes
    for _ in range(depth):
        out, changed = [], False
        for node in nodes:
            sub = None
            if node.kind == "op" and not keep(node.op) and decomposition(node.op) is not None:
                sub = _decomposed(node, fresh)
            if sub is None:
                out.append(node)
            else:
                out.extend(sub)
                changed = True
        nodes = out
        if not changed:
            break
    return graph.replace(nodes=nodes)


def _decomposed(node: Node, fresh) -> list[Node] | None:
    """The nodes of ``node``'s decomposition, its inputs and outputs renamed to the node's own Values."""
    from kiln.compile._trace import Tracer

    tracer = Tracer()
    examples: dict[int, kiln.Tensor] = {}
    outer: dict[int, Value] = {}  # the tracer's input Value index -> the graph's Value

    def example(a):
        if isinstance(a, Value):
            if a.index not in examples:
                t = kiln.zeros(a.shape, dtype=a.dtype, device=a.device)
                if t.stride() != a.stride:
                    t = kiln.empty_strided(a.shape, a.stride, dtype=a.dtype, device=a.device).zero_()
                examples[a.index] = t
                outer[tracer.add_input(t, "input").index] = a
            return examples[a.index]
        if type(a) in (list, tuple):
            return type(a)(example(x) for x in a)
        return a

    args = tuple(example(a) for a in node.args)
    try:
        with kiln.no_grad(), tracer:
            result = decomposition(node.op)(*args)
    except Exception:  # noqa: BLE001 - a decomposition that cannot run on placeholders stays an op
        return None
    results = (result,) if len(node.outputs) == 1 else tuple(result)
    if tracer.unsupported or any(v.source != "input" for v in tracer.inputs) or len(results) != len(node.outputs):
        return None
    if any(n.kind != "op" or n.writes is not None for n in tracer.nodes):
        return None
    ends = [tracer.values.get(id(t)) for t in results]
    if any(v is None or v.source != "node" for v in ends) or len({v.index for v in ends}) != len(ends):
        return None
    # the tracer's Values by identity: its numbering is its own and may meet the graph's
    rename: dict[int, Value] = {id(v): outer[v.index] for v in tracer.inputs}
    for v, final in zip(ends, node.outputs):
        if (v.shape, v.dtype) != (final.shape, final.dtype):
            return None
        rename[id(v)] = final
    nodes = []
    for n in tracer.nodes:
        for v in n.outputs:
            if id(v) not in rename:
                v.index = next(fresh)
                rename[id(v)] = v
        args = map_values(n.args, lambda v: rename[id(v)])
        nodes.append(Node("op", n.op, args, n.spec, tuple(rename[id(v)] for v in n.outputs)))
    return nodes
