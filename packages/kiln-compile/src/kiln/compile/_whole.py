"""Whole programs: a graph handed to the device's code generator as one piece (``mode="reduce-overhead"``).

The default program (:mod:`kiln.compile._codegen`) is Python calling one kernel per op or fused group; each
call costs a few microseconds of Python and touches memory the last large kernel evicted, so a training
step of small ops pays more for its calls than for its arithmetic. A code generator with a ``program``
attribute can instead compile the whole graph into one native function: ``codegen.program(plan)`` takes a
:class:`WholeProgram` (plain data: the graph's values with their layouts, its steps, what it returns and
which leaves' ``.grad`` it sets) and returns ``run(*inputs) -> tuple of outputs`` with the contract of the
default program (under ``no_grad``; the inputs' writes counted with ``kiln.backend.mark_written``), or None
when it cannot take the plan, which then gets the default program.

What reaches a plan: graphs of fixed shapes (not ``dynamic``) whose nodes are all ops or ``.grad``
assignments: a value guard, a random draw, a ``.data`` assignment or an op whose output shape comes from
values keeps the default program. The fused groups the default program would run (``plan_groups``: the same
planning) are steps of their own, and a pointwise op outside them comes with its expression
(:data:`EXPRESSIONS`), so the code generator computes what the default program computes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import kiln
from kiln.compile._fusion import EXPRESSIONS, plan_groups, single_expression
from kiln.compile._graph import Graph, Value

__all__ = ["Ref", "Step", "WholeProgram", "plan"]


@dataclass(frozen=True)
class Ref:
    """A value of the plan, by index: ``layouts[index]`` says its shape, element strides and dtype."""

    index: int


@dataclass(frozen=True)
class Step:
    """One op of the plan: ``op`` (its name) called with ``args`` (a tensor as a :class:`Ref`, lists as
    tuples), making ``outputs`` (value indices). ``spec`` is the meta function's result at trace time (a
    view's ``StridedSpec`` gives its strides and storage offset). ``writes``: the index of the value the step
    writes into (``_copy_from``'s destination, which is also its output), else None. A pointwise op has
    ``expression``: its value as an expression over ``x0, x1...`` (the tensors of ``inputs``, in order,
    broadcast to the output's shape; see ``kiln.compile.FusedGroup``; numbers are literals of the dtype it
    computes in).
    ``tags``: the op's tags (``"view"``: the output is a view of the first argument, laid out by ``spec``).

    A fused group of pointwise ops (the one the default program would run as one kernel) is one step with
    ``op`` ``"fused"`` and ``group`` (a ``FusedGroup``): ``inputs`` are the values it reads (``x0, x1...``),
    ``outputs`` the values it stores, then its reduction's value if it has one, and ``stores`` gives, for each
    stored value, the index of the tensor it is stored into instead of a new one (an in-place update), or
    None."""

    op: str
    args: tuple
    outputs: tuple[int, ...]
    spec: Any
    tags: frozenset = frozenset()
    writes: int | None = None
    expression: str | None = None
    inputs: tuple[int, ...] = ()
    group: Any = None
    stores: tuple = ()


@dataclass(frozen=True)
class WholeProgram:
    """A graph for ``codegen.program``: ``inputs`` (value indices, in the order ``run`` receives the tensors),
    ``layouts`` (value index -> ``(shape, element strides, dtype, storage offset)`` as traced; the inputs' are
    guarded), ``constants`` (value index -> a CPU tensor computed at compile time), ``steps`` in order,
    ``outputs`` (value indices ``run`` returns) and ``grads`` (``(input position, value index or None)``: the
    leaf ``inputs[position]`` gets that value as its ``.grad``, in order, after the steps; None clears it)."""

    inputs: tuple[int, ...]
    layouts: dict[int, tuple]
    constants: dict[int, Any]
    steps: tuple[Step, ...]
    outputs: tuple[int, ...]
    grads: tuple[tuple[int, int | None], ...]
    device: str = "cpu"
    reference: Callable | None = field(default=None, compare=False)
    """The graph run op by op (its ``__call__``): what ``run`` may hand a call to, for PyTorch's error."""


def _arg(a):
    if isinstance(a, Value):
        return Ref(a.index)
    if isinstance(a, (list, tuple)):
        return tuple(_arg(x) for x in a)
    return a


def plan(graph: Graph, codegens: dict | None = None) -> WholeProgram | None:
    """The graph as a :class:`WholeProgram`, or None when it has what a plan does not hold (see the module's
    docstring); with ``codegens``, its fused groups as steps of their own."""
    if graph.dynamic or (not graph.inputs and not graph.nodes):
        return None
    devices = {v.device.type for v in graph.inputs} | {v.device.type for n in graph.nodes for v in n.outputs}
    if len(devices) > 1:
        return None
    layouts: dict[int, tuple] = {}
    for v in graph.inputs:
        layouts[v.index] = (v.shape, tuple(v.stride), v.dtype, v.offset)
    steps: list[Step] = []
    grads: list[tuple[int, int | None]] = []
    position = {v.index: i for i, v in enumerate(graph.inputs)}
    fused: dict[int, tuple] = {}  # node position -> (the group's call, whether the group's step goes there)
    for call in plan_groups(graph, codegens) if codegens else ():
        last = max(call[0].positions)
        for p in call[0].positions:
            fused[p] = (call, p == last)
    for pos, node in enumerate(graph.nodes):
        if pos in fused:
            (g, group, stored, targets), here = fused[pos]
            for n in g.nodes:
                for v in n.outputs:
                    layouts.setdefault(v.index, (v.shape, tuple(v.stride), v.dtype, v.offset))
            if here:
                made = [v.index for v in stored] + ([g.reduction[3].index] if g.reduction is not None else [])
                steps.append(
                    Step(
                        "fused",
                        (),
                        tuple(made),
                        None,
                        frozenset({"fused"}),
                        inputs=tuple(v.index for v in g.inputs),
                        group=group,
                        stores=tuple(None if t is None else t.index for t in targets),
                    )
                )
            continue
        if node.kind == "set_grad":
            leaf, value = node.args[0], node.args[1]
            if leaf.index not in position or not (value is None or isinstance(value, Value)):
                return None
            grads.append((position[leaf.index], None if value is None else value.index))
            continue
        if node.kind != "op" or "dynamic_shape" in node.op.tags:
            return None
        for v in node.outputs:
            layouts.setdefault(v.index, (v.shape, tuple(v.stride), v.dtype, v.offset))
        expression = inputs = None
        if node.op.name in EXPRESSIONS:
            found = single_expression(node)
            if found is not None:
                expression, inputs = found
        writes = node.writes.index if node.writes is not None else None
        steps.append(
            Step(
                node.op.name,
                _arg(tuple(node.args)),
                tuple(v.index for v in node.outputs),
                node.spec,
                frozenset(node.op.tags),
                writes,
                expression,
                tuple(inputs or ()),
            )
        )
    for index, t in graph.constants.items():
        layouts[index] = (tuple(t.shape), tuple(t.stride()), t.dtype, t.storage_offset())
    return WholeProgram(
        inputs=tuple(v.index for v in graph.inputs),
        layouts=layouts,
        constants=dict(graph.constants),
        steps=tuple(steps),
        outputs=tuple(v.index for v in graph.outputs),
        grads=tuple(grads),
        device=devices.pop() if devices else "cpu",
        reference=graph,
    )


def whole_program(graph: Graph, codegens: dict) -> Callable | None:
    """The device code generator's native program for ``graph`` (already optimized), or None."""
    p = plan(graph, codegens)
    if p is None:
        return None
    codegen = codegens.get(p.device)
    make = getattr(codegen, "program", None)
    if make is None:
        return None
    with kiln.no_grad():
        return make(p)
