"""Fusion: chains of pointwise ops (and a ``sum`` or ``mean`` after them) become one kernel.

kiln-compile decides *what* fuses and writes each op as a scalar expression; the device's code generator
(registered through ``kiln_register_compilers`` with a ``device_type``; kiln-cpu's makes one Numba loop)
decides *how* it runs. What a code generator receives is a :class:`FusedGroup`: plain data, so a backend
plugin needs nothing from kiln-compile to implement one.

A group grows along the graph's order: a pointwise node joins the open group that made one of its inputs
when the shapes agree (or, reading none, the latest open group of its shape); a group closes when anything outside it reads one of its values (that value is then
stored), when a write, a guard or an effect comes (a write could change what the group reads), or when the
graph ends. One-node groups are left to the op's own kernel. Groups that follow one another and touch
disjoint tensors (an optimizer's update of each parameter) run as one call where the code generator has
``horizontal`` (:func:`_runs`). Expressions follow the eager ops' semantics:
NaN propagates through ``relu``, ``maximum``, ``clamp``; Python numbers take the op's dtype.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import kiln
from kiln.compile._graph import Graph, Node, Value, contiguous_strides
from kiln.compile._passes import _is_copy, _view_classes, next_change

__all__ = ["EXPRESSIONS", "FUNCTIONS", "FusedGroup", "hoist_reductions", "lower", "plan_groups"]

_FLOAT = {kiln.float32: "float32", kiln.float64: "float64"}


class FusedGroup:
    """What a device code generator compiles (``codegen(group) -> kernel``); ``kernel(*inputs, out=None)``
    returns the output tensors, the reduction's last: new ones, or, where ``out`` (a list with one entry per
    output) holds a tensor, that tensor with the output stored into it (C-contiguous, of ``shape`` and the
    output's dtype; it may be one of the inputs, read at the same elements: each element is read before it
    is stored). The caller counts the write (:func:`kiln.backend.mark_written`).

    * ``shape``: the iteration shape; every input broadcasts to it;
    * ``inputs``: ``(shape, dtype name)`` of each tensor input, named ``x0, x1...`` in the expressions;
    * ``lines``: ``(name, expression)`` in order: Python expressions over the inputs and earlier names, with
      numbers written ``float32(...)`` / ``float64(...)`` (``inf`` and ``nan`` among them), conditional
      expressions, ``abs`` and the functions :data:`FUNCTIONS` (typed by their argument: float32 in, float32 out);
    * ``outputs``: ``(name, dtype name)`` stored into new tensors of ``shape``;
    * ``reduction``: None, or ``(kind, name, dtype name)`` with kind ``"sum"`` or ``"mean"``: one more output,
      the sum or mean of ``name`` over the dims ``dims``, accumulated in float64;
    * ``dims``: None (every dim: the reduction's result is 0-d, or with ``keepdim`` ``shape`` with every size
      1), or the sorted dims reduced over, some but not all of them (the result is ``shape`` without them, or
      with ``keepdim``, a bool, with size 1 there). A group with ``dims`` reaches only a code generator whose
      ``partial_reductions`` attribute is true; for the others such a sum stays its op's own kernel;
    * ``keepdim``: see ``dims``;
    * ``dynamic``: the compiled function meets this group at other sizes of the dims ``dynamic_dims`` (None:
      of any dim): a kernel whose code takes those sizes at run time serves its later shapes too (a code
      generator may ignore both).
    """

    def __init__(
        self, shape, inputs, lines, outputs, reduction=None, keepdim=False, dims=None, dynamic=False, dynamic_dims=None
    ) -> None:
        self.shape = tuple(shape)
        self.inputs = list(inputs)
        self.lines = list(lines)
        self.outputs = list(outputs)
        self.reduction = reduction
        self.keepdim = keepdim
        self.dims = None if dims is None else tuple(dims)
        self.dynamic = bool(dynamic)
        self.dynamic_dims = None if dynamic_dims is None else tuple(dynamic_dims)

    def key(self) -> tuple:
        """Everything the generated code depends on (a code generator may cache by it)."""
        return (
            self.shape,
            tuple(self.inputs),
            tuple(self.lines),
            tuple(self.outputs),
            self.reduction,
            self.keepdim,
            self.dims,
            self.dynamic,
            self.dynamic_dims,
        )


# ---------------------------------------------------------------------------------------------- expressions


def _lit(value, dtype: str) -> str:
    return f"{dtype}({float(value)!r})"


class _Num:
    """A Python number argument: written as a literal of the op's dtype, its value still at hand."""

    def __init__(self, value, dtype: str) -> None:
        self.value = value
        self.text = _lit(value, dtype)

    def __str__(self) -> str:
        return self.text


def _alpha(a, b, alpha, sign, d):
    if alpha is None or (isinstance(alpha, _Num) and alpha.value == 1):
        return f"({a} {sign} {b})"
    return f"({a} {sign} {alpha} * {b})"


def _pow(a, e, d):
    if not isinstance(e, _Num):
        return f"({a} ** {e})"
    known = {2: f"({a} * {a})", 3: f"({a} * {a} * {a})", 1: f"{a}", 0.5: f"sqrt({a})", -1: f"({_lit(1, d)} / {a})"}
    return known.get(e.value, f"({a} ** {e})")


def _gelu(a, d, approximate="none"):
    if approximate == "tanh":
        inner = f"{_lit(0.7978845608028654, d)} * ({a} + {_lit(0.044715, d)} * {a} * {a} * {a})"
        return f"({_lit(0.5, d)} * {a} * ({_lit(1, d)} + tanh({inner})))"
    return f"({_lit(0.5, d)} * {a} * ({_lit(1, d)} + erf({a} * {_lit(0.7071067811865476, d)})))"


def _maximum(a, b):
    """``maximum`` as eager's: NaN in either operand gives NaN."""
    return f"({a} if ({a} > {b} or {a} != {a}) else {b})"


def _minimum(a, b):
    return f"({a} if ({a} < {b} or {a} != {a}) else {b})"


def _clamp(a, lo, hi, d):
    """``minimum(maximum(a, lo), hi)``, as eager's: a NaN input or bound gives NaN."""
    if lo is not None:
        a = _maximum(a, lo)
    if hi is not None:
        a = _minimum(a, hi)
    return a


_MATH = ("exp", "log", "sqrt", "tanh", "sin", "cos", "expm1", "log1p", "erf", "erfc")
FUNCTIONS = (*_MATH, "sigmoid")
"""The functions a fused expression may call: a device's code generator provides each, by this name."""

_COMPARISONS = {"gt": ">", "lt": "<", "ge": ">=", "le": "<=", "eq": "==", "ne": "!="}  # NaN: false, but != true

# op name -> f(args as expressions (numbers as literals of the op's dtype), dtype name) -> expression, or None
# when the call's arguments are a variant this table does not cover (the op's own kernel runs then)
EXPRESSIONS: dict[str, Callable] = {
    "add": lambda a, d: _alpha(a[0], a[1], a[2] if len(a) > 2 else None, "+", d),
    "sub": lambda a, d: _alpha(a[0], a[1], a[2] if len(a) > 2 else None, "-", d),
    "mul": lambda a, d: f"({a[0]} * {a[1]})",
    "div": lambda a, d: f"({a[0]} / {a[1]})" if len(a) < 3 or a[2] is None else None,
    "neg": lambda a, d: f"(-{a[0]})",
    "abs": lambda a, d: f"abs({a[0]})",
    "square": lambda a, d: f"({a[0]} * {a[0]})",
    "reciprocal": lambda a, d: f"({_lit(1, d)} / {a[0]})",
    "rsqrt": lambda a, d: f"({_lit(1, d)} / sqrt({a[0]}))",
    "sigmoid": lambda a, d: f"sigmoid({a[0]})",
    "silu": lambda a, d: f"({a[0]} * sigmoid({a[0]}))",
    "relu": lambda a, d: f"({_lit(0, d)} if {a[0]} <= {_lit(0, d)} else {a[0]})",
    "_threshold_backward": lambda a, d: f"({_lit(0, d)} if {a[1]} <= {_lit(0, d)} else {a[0]})",
    "leaky_relu": lambda a, d: (
        f"({a[0]} if {a[0]} > {_lit(0, d)} else {a[0]} * {a[1] if len(a) > 1 else _Num(0.01, d)})"
    ),
    "gelu": lambda a, d: _gelu(a[0], d, *a[1:]),
    "pow": lambda a, d: _pow(a[0], a[1], d),
    "maximum": lambda a, d: _maximum(a[0], a[1]),
    "minimum": lambda a, d: _minimum(a[0], a[1]),
    "clamp": lambda a, d: _clamp(a[0], a[1] if len(a) > 1 else None, a[2] if len(a) > 2 else None, d),
    "where": lambda a, d: f"({a[1]} if {a[0]} else {a[2]})",
    # input + (value * t1) * t2 and input + (value * t1) / t2, in the reference's order
    "addcmul": lambda a, d: f"({a[0]} + {a[3] if len(a) > 3 else _Num(1, d)} * {a[1]} * {a[2]})",
    "addcdiv": lambda a, d: f"({a[0]} + {a[3] if len(a) > 3 else _Num(1, d)} * {a[1]} / {a[2]})",
    **{name: (lambda symbol: lambda a, d: f"({a[0]} {symbol} {a[1]})")(op) for name, op in _COMPARISONS.items()},
    "clone": lambda a, d: f"{a[0]}",
    **{name: (lambda fn: lambda a, d: f"{fn}({a[0]})")(name) for name in _MATH},
}


# ---------------------------------------------------------------------------------------------- planning


def hoist_reductions(graph: Graph, codegens: dict[str, Callable]) -> Graph:
    """The graph with a ``sum`` or ``mean`` of a fusable pointwise op's value moved up to right after that op
    where a reader in between would close the op's group before the reduction could end it (in a backward
    graph, the transposed gradient a weight gradient's matmul reads comes before the bias gradient's sum).

    A reduction moves only when it would fuse (its device's code generator takes it), when something in
    between that cannot fuse reads the group's values (else the group reaches it anyway), not past the write
    of its value into a tensor (the group stores into that tensor instead), and never past a node that may
    write what it reads (``Node.written``: every tensor argument of an in-place op but a copy's source).
    Only ops move: the program
    computes the same values."""
    nodes = graph.nodes
    made: dict[int, int] = {}
    for pos, node in enumerate(nodes):
        if node.writes is None:  # (a write's output is its destination, made before it)
            for v in node.outputs:
                made.setdefault(v.index, pos)
    classes = _view_classes(graph)
    after: dict[int, list[Node]] = {}
    moved: set[int] = set()
    for pos, node in enumerate(nodes):
        if node.kind != "op" or node.op.name not in ("sum", "mean") or not node.args:
            continue
        src = node.args[0]
        at = made.get(src.index) if isinstance(src, Value) else None
        if at is None or at >= pos - 1 or nodes[at].kind != "op" or nodes[at].op.name not in EXPRESSIONS:
            continue
        if _reduction_dims(node, codegens.get(src.device.type)) is False:
            continue  # it would not fuse: moving it would only close the group earlier
        read = list(node.values_read())
        if any(made.get(v.index, -1) > at for v in read):
            continue  # (another operand is made later)
        between = nodes[at + 1 : pos]
        pointwise = {src.index} | {
            v.index for n in between if n.kind == "op" and n.op.name in EXPRESSIONS for v in n.outputs
        }
        if not any(
            (n.kind != "op" or n.op.name not in EXPRESSIONS) and any(v.index in pointwise for v in n.values_read())
            for n in between
        ):
            continue  # nothing in between closes the group: the reduction ends it where it is
        if any(_is_copy(n) and n.args[1] is src for n in between):
            continue  # the value is written into a tensor: the group stores it there (no reduction before)
        buffers = {classes.get(v.index, v.index) for v in read}
        if all(next_change(nodes, at, b, classes) > pos for b in buffers):
            after.setdefault(at, []).append(node)
            moved.add(pos)
    if not moved:
        return graph
    order = []
    for pos, node in enumerate(nodes):
        if pos not in moved:
            order.append(node)
            order += after.get(pos, [])
    return graph.replace(nodes=order)


class _Group:
    def __init__(self, shape: tuple, device: str) -> None:
        self.shape = shape
        self.device = device
        self.positions: list[int] = []
        self.nodes: list[Node] = []
        self.values: dict[int, str] = {}  # Value index -> local name
        self.inputs: list[Value] = []
        self.input_names: dict[int, str] = {}
        self.lines: list[tuple[str, str]] = []
        self.reduction: tuple | None = None  # (node position, kind, local name, Value, keepdim, dims or None)
        self.stores: dict[int, Value] = {}  # Value index of a group value -> the tensor the kernel stores it into


def single_expression(node: Node) -> tuple[str, list[int]] | None:
    """A pointwise node alone as a fused expression: ``(expression over x0, x1..., the index of each input
    value)``, or None where it would not fuse (:mod:`kiln.compile._whole`)."""
    group = _Group(tuple(node.spec.shape), node.outputs[0].device.type if node.outputs else "cpu")
    expr = _expression(node, group)
    if expr is None:
        return None
    return expr, [v.index for v in group.inputs]


def _expression(node: Node, group: _Group) -> str | None:
    """The node as an expression over the group's names (adding inputs), or None if it cannot fuse."""
    table = EXPRESSIONS.get(node.op.name)
    out_dtype = node.spec.dtype
    d = _FLOAT.get(getattr(node.spec, "compute_dtype", out_dtype))  # comparisons compute in their operands' dtype
    if table is None or d is None or len(node.outputs) != 1 or tuple(node.spec.shape) != group.shape:
        return None
    if out_dtype not in _FLOAT and out_dtype is not kiln.bool:
        return None
    args = []
    for a in node.args:
        if isinstance(a, Value):
            if a.dtype not in _FLOAT and a.dtype is not kiln.bool:
                return None
            if a.index in group.values:
                args.append(group.values[a.index])
            else:
                args.append(None)  # an input, named below once the whole node is known to fuse
        elif isinstance(a, bool) or a is None or isinstance(a, str) or a is kiln.preserve_format:
            args.append(a)
        elif isinstance(a, (int, float)):
            args.append(_Num(a, d))
        else:
            return None
    # name the new inputs, committed only if the node fuses
    pending: dict[int, tuple[str, Value]] = {}
    for i, a in enumerate(node.args):
        if isinstance(a, Value) and args[i] is None:
            name = group.input_names.get(a.index)
            if name is None:
                if a.index not in pending:
                    pending[a.index] = (f"x{len(group.inputs) + len(pending)}", a)
                name = pending[a.index][0]
            args[i] = name
    for i, a in enumerate(node.args):
        # a float operand of another dtype (a 0-d float64 tensor in a float32 op) is converted to the dtype
        # the op computes in first, as eager's type promotion does: never computed wider, then rounded
        if isinstance(a, Value) and a.dtype in _FLOAT and _FLOAT[a.dtype] != d:
            args[i] = f"{d}({args[i]})"
    expr = table(args, d)
    if expr is None:
        return None
    for name, a in pending.values():
        group.input_names[a.index] = name
        group.inputs.append(a)
    return expr


def lower(graph: Graph, names, codegens: dict[str, Callable]) -> dict[int, str | None]:
    """Plan the fused groups of ``graph`` and compile each with its device's code generator: the node
    positions they replace (the last one of each group gets the call, the others nothing)."""
    if not codegens:
        return {}
    return _emit(plan_groups(graph, codegens), names, codegens, graph)


def plan_groups(graph: Graph, codegens: dict[str, Callable]) -> list[tuple]:
    """The fused groups of ``graph``, in the order they run: ``(group, its FusedGroup, the values it stores,
    the tensor each is stored into or None)``; ``group.positions`` are the node positions it replaces (its
    call takes the last one), ``group.inputs`` the values it reads and ``group.reduction[3]`` the value of
    its sum or mean, if any."""
    readers: dict[int, set[int]] = {}
    for pos, node in enumerate(graph.nodes):
        for v in node.values_read():
            readers.setdefault(v.index, set()).add(pos)
    for v in graph.outputs:
        readers.setdefault(v.index, set()).add(len(graph.nodes))
    open_groups: dict[int, _Group] = {}  # Value index -> the open group that made it
    done: list[_Group] = []

    def close(group: _Group) -> None:
        for idx in [i for i, g in open_groups.items() if g is group]:
            del open_groups[idx]
        done.append(group)

    classes = _view_classes(graph)
    for pos, node in enumerate(graph.nodes):
        target = _store_target(graph.nodes, pos, open_groups, readers, classes)
        if target is not None:  # the group stores the value into the written tensor itself, and goes on
            group, v, dst = target
            for g in {id(g): g for g in open_groups.values()}.values():
                if g is not group:
                    close(g)
            group.stores[v.index] = dst
            group.positions.append(pos)
            continue
        if node.kind != "op" or node.writes is not None:
            for g in {id(g): g for g in open_groups.values()}.values():
                close(g)
            continue
        device = node.outputs[0].device.type if node.outputs else None
        joined = None
        if device in codegens and node.op.name in EXPRESSIONS:
            shape = tuple(node.spec.shape)
            owners = [open_groups[v.index] for v in node.values_read() if v.index in open_groups]
            # the group of the node's own shape first: a 0-d operand's group (a bias correction) cannot take it
            owners = [g for g in owners if g.shape == shape] or owners
            if not owners:  # independent of every open group: join the latest of its shape (siblings fuse too)
                owners = [g for g in open_groups.values() if g.shape == shape and g.device == device][-1:]
            group = owners[0] if owners else _Group(tuple(node.spec.shape), device)
            if _reads_stored(node, group, classes):
                close(group)  # it would read the stored tensor's old elements: its new values come later
                group = _Group(tuple(node.spec.shape), device)
            elif group.reduction is not None:  # a group ends with its reduction: the node starts the next one
                group = _Group(tuple(node.spec.shape), device)
            expr = _expression(node, group)
            if expr is not None:
                (out,) = node.outputs
                name = f"t{len(group.lines)}"
                group.lines.append((name, expr))
                group.values[out.index] = name
                group.positions.append(pos)
                group.nodes.append(node)
                open_groups[out.index] = group
                joined = group
        elif (
            device in codegens
            and node.op.name in ("sum", "mean")
            and ((dims := _fusable_reduction(node, open_groups, codegens[device])) is not False)
        ):
            (src,) = [v for v in node.values_read()]
            group = open_groups[src.index]
            keepdim = node.args[2] if len(node.args) > 2 else False
            group.reduction = (pos, node.op.name, group.values[src.index], node.outputs[0], keepdim, dims)
            group.positions.append(pos)
            group.nodes.append(node)
            joined = group
        # anything else reading an open group's value, or a tensor it stores into, closes that group (it must
        # run first)
        for v in node.values_read():
            g = open_groups.get(v.index)
            if g is not None and g is not joined:
                close(g)
        for g in {id(g): g for g in open_groups.values()}.values():
            if g is not joined and _reads_stored(node, g, classes):
                close(g)
    for g in {id(g): g for g in open_groups.values()}.values():
        close(g)
    return _fused_calls(done, readers, graph)


def _fusable_reduction(node: Node, open_groups: dict, codegen: Callable):
    """Whether ``sum``/``mean`` of an open group's value ends that group, when it has no reduction yet: False
    if not, else the dims it reduces (:func:`_reduction_dims`)."""
    args = node.args
    if not args or not isinstance(args[0], Value) or args[0].index not in open_groups:
        return False
    if open_groups[args[0].index].reduction is not None:
        return False  # a group has one reduction: a second one of its values runs as its own op
    return _reduction_dims(node, codegen)


def _reduction_dims(node: Node, codegen: Callable | None):
    """Whether a ``sum``/``mean`` node can be a fused group's reduction on this device: False if not (no
    code generator, a ``dtype=``, a non-float input, a ``keepdim`` that is not a bool, a dim list it does
    not take), None when it reduces every dim, else the sorted dims it reduces (some of them: only for a
    code generator that takes ``partial_reductions``)."""
    args = node.args
    src = args[0]
    if codegen is None or (len(args) > 3 and args[3] is not None):
        return False
    if node.spec.dtype != src.dtype or src.dtype not in _FLOAT:
        return False
    if len(args) > 2 and type(args[2]) is not bool:
        return False  # (eager takes any truthy keepdim; the group's is a bool)
    nd = len(src.shape)
    dims = args[1] if len(args) > 1 else None
    dims = (dims,) if isinstance(dims, int) else dims
    if dims is None or (nd == 0 and tuple(dims) in ((), (0,), (-1,))):
        return None
    if not isinstance(dims, (tuple, list)) or not dims or any(type(d) is not int for d in dims):
        return False  # (an empty dim list is a sum over everything in one version of PyTorch, nothing in another)
    dims = tuple(sorted({d % nd for d in dims}))
    if dims == tuple(range(nd)):
        return None
    return dims if getattr(codegen, "partial_reductions", False) else False


def _store_target(nodes: list[Node], pos: int, open_groups: dict, readers: dict, classes: dict):
    """``(group, v, dst)`` when ``nodes[pos]`` is the write ``_copy_from(dst, v)`` of an open group's value
    ``v`` into a C-contiguous tensor of ``v``'s shape and dtype that the group reads as itself or not at all
    (never through a view): the group's kernel then stores ``v`` into ``dst``, counts the write
    (:func:`kiln.backend.mark_written`), and the copy goes. ``v`` then *is* ``dst``: it may be read after
    the write only until ``dst`` is written again, and never returned (a call returns new tensors)."""
    node = nodes[pos]
    if node.kind != "op" or node.op.name != "_copy_from" or not isinstance(node.args[1], Value):
        return None
    dst, v = node.args[0], node.args[1]
    group = open_groups.get(v.index)
    if group is None or not isinstance(dst, Value) or group.reduction is not None or v.index in group.stores:
        return None  # (a reduction's result may be read before the group's call, which a store moves later)
    buffer, mine = classes.get(dst.index, dst.index), classes.get(v.index, v.index)
    if any(classes.get(i, i) == buffer for i in group.values):
        return None  # the group makes dst (or what dst views) itself: the call cannot store into it too
    if any(c == mine and i != v.index for i, c in classes.items()):
        return None  # a view of v would become a view of dst
    again = next_change(nodes, pos, buffer, classes)
    later = readers.get(v.index, {pos})
    if max(later) >= again or any(p < len(nodes) and nodes[p].kind != "op" for p in later):
        return None  # read after dst changes again, returned, or made a .grad or .data: v must stay its own
    if (dst.shape, dst.dtype, dst.device) != (v.shape, v.dtype, v.device) or dst.stride != contiguous_strides(
        dst.shape
    ):
        return None
    if any(x is not dst and classes.get(x.index, x.index) == buffer for x in group.inputs):
        return None
    if any(classes.get(d.index, d.index) == buffer for d in group.stores.values()):
        return None
    return group, v, dst


def _reads_stored(node: Node, group: _Group, classes: dict) -> bool:
    """Whether ``node`` reads (through any view) a tensor ``group`` stores into: it must then run after the
    group's call."""
    stored = {classes.get(d.index, d.index) for d in group.stores.values()}
    return bool(stored) and any(classes.get(v.index, v.index) in stored for v in node.values_read())


def _takes_out(kernel: Callable) -> bool:
    """Whether a device's kernel takes ``out=`` (a code generator written before it existed does not)."""
    try:
        params = inspect.signature(kernel).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "out" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def _changed_dims(g: _Group, graph: Graph) -> tuple[bool, tuple | None]:
    """``(dynamic, dynamic_dims)`` of a group of ``graph``: whether the function meets it at other sizes, and
    of which of its dims (the dims of the values it reads and stores, broadcast against its shape, whose
    sizes differ among the traces of the same program: ``graph.changed``; None: not known, any)."""
    if not graph.dynamic:
        return False, None
    if graph.changed is None:
        return True, None
    nd = len(g.shape)
    reduced = {v.index for v in (g.reduction[3],)} if g.reduction is not None else set()
    changed: set[int] = set()
    for node in g.nodes:
        for v in (*node.values_read(), *node.outputs):
            if v.index in reduced:
                continue  # (the reduction's result: its dims are the group's, read through its input)
            dims = graph.changed.get(v.index)
            if dims is None or len(v.shape) > nd:
                return True, None
            changed.update(nd - len(v.shape) + d for d in dims)
    return bool(changed), tuple(sorted(changed))


def _fused_calls(groups: list[_Group], readers: dict, graph: Graph) -> list[tuple]:
    calls = []  # (group, its FusedGroup, the values it stores, their targets), in the order they run
    for g in groups:
        members = set(g.positions)
        stored = []
        for node in g.nodes:
            for v in node.outputs:
                if v.index in g.values and (v.index in g.stores or readers.get(v.index, set()) - members):
                    stored.append(v)
        if len(g.nodes) < 2 and not g.stores:
            continue  # one op and no store saved: its own kernel
        if g.reduction is None and not stored:
            continue
        if any(v.stride != contiguous_strides(v.shape) for v in stored):
            continue  # the kernel writes row-major tensors; the trace made another layout (kept by later views)
        group = FusedGroup(
            g.shape,
            [(tuple(v.shape), "bool" if v.dtype is kiln.bool else _FLOAT[v.dtype]) for v in g.inputs],
            g.lines,
            [(g.values[v.index], "bool" if v.dtype is kiln.bool else _FLOAT[v.dtype]) for v in stored],
            None if g.reduction is None else (g.reduction[1], g.reduction[2], _FLOAT[g.reduction[3].dtype]),
            bool(g.reduction[4]) if g.reduction is not None else False,
            None if g.reduction is None else g.reduction[5],
            *_changed_dims(g, graph),
        )
        calls.append((g, group, stored, [g.stores.get(v.index) for v in stored]))
    calls.sort(key=lambda c: max(c[0].positions))
    return calls


def _emit(calls: list[tuple], names, codegens: dict, graph: Graph) -> dict[int, str | None]:
    out: dict[int, str | None] = {}
    for run in _runs(calls, codegens, _view_classes(graph)):
        device = run[0][0].device
        if len(run) > 1:
            kernel, takes_out = codegens[device].horizontal([c[1] for c in run]), True
        else:
            kernel = codegens[device](run[0][1])
            takes_out = _takes_out(kernel)
        stored = [v for c in run for v in c[2]]
        targets = [t for c in run for t in c[3]]
        results = [v.name for c in run for v in (*c[2], *([c[0].reduction[3]] if c[0].reduction else []))]
        inputs = [v.name for c in run for v in c[0].inputs]
        into = ""
        if any(targets) and takes_out:
            into = f", out=[{', '.join(t.name if t else 'None' for t in targets)}]"
        call = f"{', '.join(results)}, = {names.const(kernel)}({', '.join(inputs)}{into})"
        for v, t in zip(stored, targets):
            if t is not None and takes_out:  # the kernel stored into the tensor: the write is counted, not made
                call += f"; {t.name} = _written({t.name})"
            elif t is not None:  # a code generator without out=: the value is copied in, after the call
                call += f"; {t.name} = _write({t.name}, {v.name})"
        positions = [p for c in run for p in c[0].positions]
        last = max(positions)
        for p in positions:
            out[p] = call if p == last else None
    return out


def _runs(calls: list, codegens: dict, classes: dict) -> list[list]:
    """``calls`` in runs that one kernel call computes (a horizontal fusion: an optimizer's update of each
    parameter, say): consecutive groups on a device whose code generator has ``horizontal``, each without a
    reduction and reading only tensors of its own shape, whose nodes follow one another with no other node
    between, and which touch disjoint tensors (so none reads what another makes or stores). The others are
    runs of one."""
    runs: list[list] = []
    touched: list[set] = []
    for c in calls:
        g, group = c[0], c[1]
        mine = {classes.get(v.index, v.index) for v in (*g.inputs, *c[2], *(t for t in c[3] if t is not None))}
        alone = (
            group.reduction is not None
            or getattr(codegens.get(g.device), "horizontal", None) is None
            or any(shape != group.shape for shape, _ in group.inputs)
        )
        if runs and not alone and touched[-1] is not None:
            prev = runs[-1][-1][0]
            if (
                prev.device == g.device
                and min(g.positions) == max(prev.positions) + 1
                and not touched[-1] & mine
                and len(set(g.positions)) == max(g.positions) - min(g.positions) + 1
            ):
                runs[-1].append(c)
                touched[-1] |= mine
                continue
        runs.append([c])
        touched.append(None if alone else mine)
    return runs
