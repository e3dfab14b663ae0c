"""Record code generated per op: :func:`kiln.autograd.graph.record` written out for one op's parameters.

The generic ``record`` reads the op record on every call: it loops over the tensor parameters, over the
save plan and the metadata the formula asks for, and builds the node through ``Node.__init__``. For an op
whose tensor parameters each take one tensor (or a number), all of that is known once the op has been
recorded once, so :func:`make_recorder` writes it out as straight-line code: one local per tensor
argument, the node's fields set in place, the saved entries in one dict display. The op record stays the
only description; the code is derived from it on the op's first recording and makes the same node the
generic path makes (same class, edges, layout, saved entries and flags). A call it was not written for
(a list where a tensor goes, a tensor where a number goes) takes the generic path.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable

from kiln import _dtype as dt
from kiln._public import takes_tensor_list
from kiln._state import anomaly, state
from kiln._tensor import Tensor, stale_view_requires_grad
from kiln.autograd import graph
from kiln.autograd.anomaly_mode import forward_traceback

__all__ = ["make_recorder"]

_ATOMS = frozenset({int, float, bool, complex, str, type(None), dt.dtype})
"""Classes of a non-tensor argument that hold no tensor: saved as they are, without a look inside."""

_CODE: dict[tuple, object] = {}  # the generated code by op layout, shared by every op of that layout


def _holds_tensor(v) -> bool:
    """Whether ``v`` is a tensor or a list or tuple holding one (the generic path saves those)."""
    return isinstance(v, Tensor) or (isinstance(v, (list, tuple)) and any(isinstance(t, Tensor) for t in v))


def _partial(present: int, tensors: tuple, edges: tuple) -> tuple:
    """``(next_functions, input_meta, layout)`` of a call where some tensor parameters hold no tensor
    (bit k of ``present``: parameter k holds one), as the generic path builds them."""
    nf, metas, layout = [], [], []
    for k, t in enumerate(tensors):
        if present >> k & 1:
            layout.append(len(nf))
            nf.append(edges[k])
            metas.append((t._shape, t._dtype, t._device))
        else:
            layout.append(None)
    return tuple(nf), metas, layout


def make_recorder(opdef) -> Callable:
    """The recorder of ``opdef``: ``recorder(opdef, args, out)`` does what ``graph.record`` does. Generated
    for an op whose tensor parameters each take one tensor; otherwise the generic ``graph.record_generic``."""
    needs = opdef._backward_needs
    tensor_params = opdef.tensor_params
    plan = needs.save_plan if needs.save_plan is not None else needs.read_guards()
    params = list(opdef.signature.parameters.values())
    if (
        not tensor_params
        or len(tensor_params) > 8
        or any(takes_tensor_list(params[i]) for i in tensor_params)
        or any(idx not in tensor_params for _, idx, _ in needs.meta_names)
    ):
        return graph.record_generic
    name = opdef.grad_fn_name
    key = (
        tensor_params,
        tuple((name, idx, guard) for name, idx, guard, _ in plan),
        needs.meta_names,
        opdef.num_outputs,
        tuple(opdef.differentiable_outputs),
        needs.multi_grad,
        needs.result,
        needs.result_guard,
        isinstance(name, str),
    )
    code = _CODE.get(key)
    if code is None:
        code = _CODE[key] = _compile(_source(opdef, plan), "record")
    needs.applier = _make_apply(opdef)  # (apply, _apply_and_release) or None
    namespace = {
        "_T": Tensor,
        "_SEQS": (list, tuple),
        "_ATOMS": _ATOMS,
        "_holds": _holds_tensor,
        "_stale": stale_view_requires_grad,
        "_edge": graph._edge,
        "_NO": graph._NO_EDGE,
        "_partial": _partial,
        "_generic": graph.record_generic,
        "_new": object.__new__,
        "_next": next,
        "_counter": graph._seq,
        "_anomaly": anomaly,
        "_trace": forward_traceback,
        "_ST": graph.SavedTensor,
        "_cls": graph._node_class(opdef, ()) if isinstance(name, str) else None,
        "_node_class": graph._node_class,
        "_classes": graph._NODE_CLASSES,
        "__builtins__": __builtins__,
    }
    fn = types.FunctionType(code, namespace, "record_" + opdef.name)
    fn.__doc__ = f"``kiln.autograd.graph.record`` written out for {opdef.name}."
    return fn


def _make_apply(opdef) -> tuple[Callable, Callable] | None:
    """``OpNode.apply`` written out for the op's nodes, and ``OpNode._apply_and_release`` (the same, then the saved
    tensors freed: the engine's call when the graph is not kept); None where the generic apply serves: a formula
    of several output gradients, a multi-output ``result``, or parameters that are not plain positional ones."""
    needs = opdef._backward_needs
    params = inspect.signature(opdef.backward).parameters.values()
    if (
        needs.multi_grad
        or (needs.result and opdef.num_outputs > 1)
        or any(p.kind is not p.POSITIONAL_OR_KEYWORD for p in params)
    ):
        return None
    namespace = {
        "_generic": graph.OpNode.apply_generic,
        "_generic_release": graph.Node._apply_and_release,
        "_op": opdef,
        "_ST": graph.SavedTensor,
        "_state": state,
        "_nig": graph._needs_input_grad,
        "_formula": opdef.backward,
        "_finish": graph.finish_gradients,
        "_fit": graph._fit_to_input,
        "__builtins__": __builtins__,
    }
    made = []
    for release in (False, True):
        text = _apply_source(opdef, list(params)[1:], release)
        key = ("apply", text)
        code = _CODE.get(key)
        if code is None:
            code = _CODE[key] = _compile(text, "apply")
        fn = types.FunctionType(code, namespace, "_apply_and_release" if release else "apply")
        fn.__doc__ = f"``OpNode.{fn.__name__}`` written out for {opdef.name}."
        made.append(fn)
    return made[0], made[1]


def _apply_source(opdef, params: list, release: bool) -> str:
    """The text of :func:`_make_apply`'s functions (``release``: the one that frees the saved tensors after the
    formula has run, as ``OpNode.release``)."""
    n = len(opdef.tensor_params)
    # a node the generic recorder made (a list where a tensor goes) may hold lists of saved tensors: generic
    # (or of another op of the same node name, whose class calls this op's apply: see graph._node_class)
    lines = ["def apply(self, grads):", "    if self.freed or self.seqs or self.op is not _op:"]
    add = lines.append
    add(f"        return {'_generic_release' if release else '_generic'}(self, grads)")
    add("    saved = self.saved")
    call = []
    kept = []  # the locals that hold a saved entry, for the release
    for p in params:
        name = p.name
        local = f"v_{name}"
        call.append(local)
        if name == "needs_input_grad":
            add("    layout = self.layout")
            add(f"    {local} = _nig(self.wants, {n} if layout is None else len(layout))")
        else:  # (a saved number may be a tensor in a node the generic recorder made)
            s = f"s{len(kept)}"
            kept.append(s)
            add(f"    {s} = saved[{name!r}]")
            add(f"    if {s}.__class__ is _ST:")
            add(f"        {local} = {s}.data")
            # SavedTensor.unpack's cases, without its call where none applies (an output's alias is made only
            # when the backward itself records)
            add(f"        if {s}.freed or {local}._vc[0] != {s}.version or ({s}.is_output and _state.grad_enabled):")
            add(f"            {local} = {s}.unpack(self)")
            add("    else:")
            add(f"        {local} = {s}")
    add(f"    result = _formula(grads[0]{''.join(', ' + c for c in call)})")
    if release:
        add("    self.freed = True")
        for s in kept:
            add(f"    if {s}.__class__ is _ST:")
            add(f"        {s}.freed = True")
            add(f"        {s}.data = None")
    add("    if self.layout is not None:")
    add("        return _finish(self, result)")
    gs = [f"g{k}" for k in range(n)]
    if n == 1:
        add("    if not isinstance(result, tuple):")
        add("        g0 = result")
        add("    elif len(result) == 1:")
        add("        g0 = result[0]")
        add("    else:")
        add("        return _finish(self, result)")
    else:
        add(f"    if not isinstance(result, tuple) or len(result) != {n}:")
        add("        return _finish(self, result)")
        add(f"    {', '.join(gs)} = result")
    add("    nf = self.next_functions")
    add("    metas = self.input_meta")
    for k, g in enumerate(gs):
        add(f"    if {g} is not None and nf[{k}][0] is not None:")
        add(f"        m = metas[{k}]")
        add(f"        if {g}._shape != m[0] or {g}._dtype is not m[1]:")
        add(f"            {g} = _fit({g}, m, self, {k})")
    add(f"    return ({', '.join(gs)},)")
    return "\n".join(lines) + "\n"


def _compile(src: str, name: str):
    namespace: dict = {}
    exec(compile(src, f"<kiln {name}>", "exec"), namespace)  # noqa: S102 - generated from an op record
    return namespace[name].__code__


def _test(guard: int) -> str:
    """The test that an entry with read guard ``guard`` is saved (``BackwardNeeds.save_plan``)."""
    return "w" if guard == -1 else f"w & {guard}"


def _source(opdef, plan: tuple) -> str:
    """The recorder's text (see :func:`make_recorder`); the names it reads are its namespace's."""
    needs = opdef._backward_needs
    tensor_params = opdef.tensor_params
    n = len(tensor_params)
    full = (1 << n) - 1
    local = {i: f"a{k}" for k, i in enumerate(tensor_params)}  # op parameter index -> its local
    lines = ["def record(_op, args, out):"]
    add = lines.append
    for k, i in enumerate(tensor_params):
        add(f"    a{k} = args[{i}]")
    # what the generic path does differently (a list where a tensor goes, a tensor among the saved numbers)
    add("    p = 0")
    for k in range(n):
        add(f"    if isinstance(a{k}, _T):")
        add(f"        p |= {1 << k}")
        add(f"    elif isinstance(a{k}, _SEQS):")
        add("        return _generic(_op, args, out)")
    for _, idx, _guard, _ in plan:
        if idx not in local:
            add(f"    if args[{idx}].__class__ not in _ATOMS and _holds(args[{idx}]):")
            add("        return _generic(_op, args, out)")
    add("    w = 0")
    for k in range(n):
        a = f"a{k}"
        add(f"    if p & {1 << k}:")
        add(f"        if {a}._requires_grad or ({a}._base is not None and {a}._view_vc != {a}._vc[0] and _stale({a})):")
        # an op's output that is no view: its edge, without _edge's call (which a leaf or a view needs)
        add(f"            if {a}._grad_fn is not None and {a}._base is None:")
        add(f"                e{k} = ({a}._grad_fn, {a}._output_nr)")
        add("            else:")
        add(f"                e{k} = _edge({a})")
        add(f"            w |= {1 << k}")
        add("        else:")
        add(f"            e{k} = _NO")
        add("    else:")
        add(f"        e{k} = None")
    edges = ", ".join(f"e{k}" for k in range(n)) + ("," if n == 1 else "")
    tensors = ", ".join(f"a{k}" for k in range(n)) + ("," if n == 1 else "")
    metas = ", ".join(f"(a{k}._shape, a{k}._dtype, a{k}._device)" for k in range(n)) + ("," if n == 1 else "")
    add(f"    if p == {full}:")
    add(f"        nf = ({edges})")
    add(f"        metas = ({metas})")
    add("        layout = None")
    add("    else:")
    add(f"        nf, metas, layout = _partial(p, ({tensors}), ({edges}))")
    if isinstance(opdef.grad_fn_name, str):
        add("    node = _new(_cls)")
    else:  # the class of the name the call gives (graph._node_class, without its call once made)
        add("    node = _new(_classes.get(_op.grad_fn_name(args)) or _node_class(_op, args))")
    add("    node.next_functions = nf")
    add(f"    node.n_out = {opdef.num_outputs}")
    add("    node._seq = _next(_counter)")
    add("    node._node_hooks = None")
    add("    node._metadata = None")
    add('    if _anomaly["enabled"]:')
    add('        node.metadata["traceback_"] = _trace()')
    add("    node.op = _op")
    add("    node.layout = layout")
    add("    node.wants = w")
    add("    node.input_meta = metas")
    add("    node.freed = False")
    single = opdef.num_outputs == 1
    if needs.multi_grad:
        outs = "(out,)" if single else "out"
        add(f"    node.output_meta = [(o._shape, o._dtype, o._device) for o in {outs}]")
    else:
        add("    node.output_meta = None")
    entries = []
    for name, idx, guard, _ in plan:
        if idx in local:
            a = local[idx]
            k = tensor_params.index(idx)
            value = f"(_ST({a}) if p & {1 << k} else {a})"
        else:
            value = f"args[{idx}]"
        entries.append(f"{name!r}: {value} if {_test(guard)} else None")
    for name, idx, attr in needs.meta_names:
        entries.append(f"{name!r}: {local[idx]}.{attr}")
    # the inputs are saved before the outputs take the node, the result after (as the generic path does)
    add("    saved = {" + ", ".join(entries) + "}")
    for k in opdef.differentiable_outputs:
        o = "out" if single else f"out[{k}]"
        add(f"    if {o}._dtype.is_floating_point:")
        add(f"        {o}._grad_fn = node")
        add(f"        {o}._requires_grad = True")
        add(f"        {o}._output_nr = {k}")
    seqs = "()"
    if needs.result:
        add(f"    if {_test(needs.result_guard)}:")
        if single:
            add("        saved['result'] = _ST(out, True, node)")
        else:
            add("        saved['result'] = tuple(_ST(o, True, node) if o._grad_fn is node else _ST(o) for o in out)")
            seqs = "('result',)"
        add("    else:")
        add("        saved['result'] = None")
    add("    node.saved = saved")
    if seqs != "()":
        add(f"    node.seqs = {seqs} if {_test(needs.result_guard)} else ()")
    else:
        add("    node.seqs = ()")
    return "\n".join(lines) + "\n"
