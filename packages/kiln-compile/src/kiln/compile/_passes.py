"""Graph passes: dead code, common subexpressions, constant folding.

Every pass respects the one thing that makes a kiln graph more than a dataflow graph: writes. A buffer that
is written (``_copy_from`` and the other ``inplace`` ops), and every view of it, is never merged with
another or folded into a constant, and no write, random op or effect is ever removed.
"""

from __future__ import annotations

import kiln
from kiln.backend import call_kernel
from kiln.compile._graph import Graph, Node, Value

__all__ = ["common_subexpressions", "dead_code", "fold_constants", "optimize"]

_KEEP_TAGS = frozenset({"inplace", "random", "nondeterministic", "dynamic_shape"})


def optimize(graph: Graph) -> Graph:
    """The default pipeline: fold constants, merge repeated computations, drop what nothing uses."""
    return dead_code(common_subexpressions(fold_constants(graph)))


def _written_classes(graph: Graph) -> set[int]:
    """Indices of every Value that shares a buffer with one that is written (views followed both ways)."""
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
    roots = {find(n.writes.index) for n in graph.nodes if n.writes is not None}
    roots |= {find(n.args[0].index) for n in graph.nodes if n.kind == "set_data"}
    every = {v.index for v in graph.inputs} | {v.index for n in graph.nodes for v in n.outputs}
    return {i for i in every if find(i) in roots}


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
    written = _written_classes(graph)
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
    returned = {v.index for v in graph.outputs}
    constants: dict[int, kiln.Tensor] = {}
    nodes = []
    for node in graph.nodes:
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
    out = []
    for a in args:
        if isinstance(a, Value):
            out.append(env[a.index])
        elif type(a) in (list, tuple):
            out.append(type(a)(_bind(a, env)))
        else:
            out.append(a)
    return tuple(out)


def _renamed(node: Node, rename: dict[int, Value]) -> Node:
    if not rename or not any(v.index in rename for v in node.values_read()):
        return node
    return Node(node.kind, node.op, _rename_args(node.args, rename), node.spec, node.outputs, node.expected)


def _rename_args(args, rename):
    out = []
    for a in args:
        if isinstance(a, Value):
            out.append(rename.get(a.index, a))
        elif type(a) in (list, tuple):
            out.append(type(a)(_rename_args(a, rename)))
        else:
            out.append(a)
    return tuple(out)


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
