"""Code generation: a graph becomes one Python function that calls each op's kernel directly.

The generated function skips everything the dispatcher does per op on an eager call — argument binding,
the meta function (its spec was recorded at trace time and the guards keep it valid), the dispatch modes and
autograd recording — and calls ``kiln.backend.call_kernel(op, args, spec)``. Writes go through ``copy_``
(which keeps autograd's version counters true), value guards compare what the trace read, and ops whose
output shape depends on values recompute their spec and check the shape. Fused groups of pointwise nodes
(:mod:`kiln.compile._fusion`) replace their nodes with one call of the kernel the device's code generator made.
Each value the program made is deleted after its last use, so its memory is reused from there on.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import kiln
from kiln.backend import call_kernel, mark_written
from kiln.compile._graph import Graph, GuardFailure, Value, check_guard

__all__ = ["generate"]


def _write(dst: kiln.Tensor, src: kiln.Tensor) -> kiln.Tensor:
    return dst.copy_(src)


def _check_shape(t: kiln.Tensor, shape: tuple) -> kiln.Tensor:
    if tuple(t.shape) != shape:
        raise GuardFailure
    return t


class _Names:
    """The constants the generated source refers to by name."""

    def __init__(self) -> None:
        self.ns: dict[str, Any] = {
            "_k": call_kernel,
            "_write": _write,
            "_written": mark_written,
            "_guard": check_guard,
            "_shape": _check_shape,
        }

    def const(self, value: Any) -> str:
        name = f"c{len(self.ns)}"
        self.ns[name] = value
        return name

    def render(self, a: Any) -> str:
        if isinstance(a, Value):
            return a.name
        if type(a) is tuple:
            inner = ", ".join(self.render(x) for x in a)
            return f"({inner}{',' if len(a) == 1 else ''})"
        if type(a) is list:
            return f"[{', '.join(self.render(x) for x in a)}]"
        if a is None or type(a) in (bool, int, str) or (type(a) is float and math.isfinite(a)):
            return repr(a)
        return self.const(a)


_NAME = re.compile(r"\bv(\d+)\b")


def _free_dead(lines: list[str], graph: Graph) -> list[str]:
    """``lines`` with a ``del`` after the last line that names each value the program made: its tensor goes
    back to the device's allocator there, not when the program returns, and the allocator hands that memory
    to the next tensor of its size (a whole training step held every activation and gradient until its end).
    Inputs stay (the caller holds them), outputs are returned, and constants are the program's globals."""
    made = {v.index for node in graph.nodes for v in node.outputs}
    made -= {v.index for v in (*graph.inputs, *graph.outputs)} | set(graph.constants)
    last: dict[int, int] = {}
    for i, line in enumerate(lines):
        for m in _NAME.finditer(line):
            last[int(m.group(1))] = i
    dead: dict[int, list[int]] = {}
    for index, i in last.items():
        if index in made:  # (a name inside a string argument is no value, and never deleted)
            dead.setdefault(i, []).append(index)
    out = []
    for i, line in enumerate(lines):
        out.append(line)
        if i in dead:
            out.append("del " + ", ".join(f"v{index}" for index in sorted(dead[i])))
    return out


def generate(graph: Graph, lower: Callable | None = None) -> Callable:
    """The graph as a Python function ``program(*inputs) -> tuple of outputs`` (run it under ``no_grad``).

    ``lower(graph, names) -> {node position: source line or None}`` replaces nodes with calls of fused
    kernels (``names.const(kernel)`` binds what a line calls; None drops a node the call covers)."""
    names = _Names()
    for index, t in graph.constants.items():
        names.ns[f"v{index}"] = t
    replaced: dict[int, str | None] = lower(graph, names) if lower is not None else {}
    lines = []
    for pos, node in enumerate(graph.nodes):
        if pos in replaced:
            if replaced[pos] is not None:
                lines.append(replaced[pos])
            continue
        if node.kind == "op":
            outs = ", ".join(v.name for v in node.outputs) + ("," if len(node.outputs) > 1 else "")
            args = names.render(tuple(node.args))
            if node.writes is not None and node.op.name == "_copy_from":
                lines.append(f"{outs} = _write({names.render(node.args[0])}, {names.render(node.args[1])})")
            elif "dynamic_shape" in node.op.tags:  # the shape comes from the values: recompute, then check
                (v,) = node.outputs
                lines.append(f"{v.name} = _shape(_k({names.const(node.op)}, {args}, None), {tuple(v.shape)!r})")
            else:
                lines.append(f"{outs} = _k({names.const(node.op)}, {args}, {names.const(node.spec)})")
        elif node.kind == "draw":
            lines.append(f"{node.outputs[0].name} = {names.const(node.args[0])}()")
        elif node.kind == "guard":
            lines.append(f"_guard({node.args[0].name}, {names.const(node.expected)})")
        elif node.kind == "set_grad":
            lines.append(f"{node.args[0].name}.grad = {names.render(node.args[1])}")
        else:
            lines.append(f"{node.args[0].name}.data = {names.render(node.args[1])}")
    params = ", ".join(v.name for v in graph.inputs)
    ret = ", ".join(v.name for v in graph.outputs)
    body = "\n".join(f"    {line}" for line in _free_dead(lines, graph)) or "    pass"
    src = f"def program({params}):\n{body}\n    return ({ret}{',' if len(graph.outputs) == 1 else ''})\n"
    exec(compile(src, "<kiln.compile program>", "exec"), names.ns)  # noqa: S102 - our own generated source
    program = names.ns["program"]
    program.source = src
    return program
