"""The autograd tape: nodes recorded as ops run, saved tensors and hooks (the engine that runs them backward is
:mod:`kiln.autograd.engine`; accumulation into leaves, :mod:`kiln.autograd.accumulate`).

Backward formulas (``op(backward=...)``) are plain functions whose first parameter receives the
output gradient (``grad``; or ``grads``, a tuple with one entry per output, for multi-output ops) and
whose other parameters are named after what they need: any parameter of the op; ``<param>_shape``,
``_dtype``, ``_device``, ``_stride`` or ``_offset`` for a tensor parameter's metadata alone (nothing is saved, so a
later in-place write to it is no error); ``result`` (the op's output, or tuple of outputs); or
``needs_input_grad`` (a tuple of bools, one per tensor parameter). Only what a formula names is saved, and
only when it reads it for an input that requires grad (:func:`_read_guards`, PyTorch's rule). It returns one gradient per tensor parameter (a list for a
tensor-list parameter; ``None`` where there is none); the engine reduces broadcast gradients to each
input's shape and casts them to its dtype, so formulas stay short.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import re
import weakref
from collections.abc import Callable

from kiln._lazy import first_call
from kiln._state import anomaly, state
from kiln._tensor import Tensor, _make, stale_view_requires_grad
from kiln.autograd.anomaly_mode import forward_traceback
from kiln.autograd.grad_mode import is_grad_enabled

_seq = itertools.count()
_INF = float("inf")
_FREED_MESSAGE = (
    "Trying to backward through the graph a second time (or directly access saved tensors after they have "
    "already been freed). Saved intermediate values of the graph are freed when you call .backward() or "
    "autograd.grad(). Specify retain_graph=True if you need to backward through the graph a second time or "
    "if you need to access saved tensors after calling backward."
)


class RemovableHandle:
    """Returned by ``register_hook``; ``remove()`` unregisters the hook."""

    __slots__ = ("_hooks", "_hook")

    def __init__(self, hooks: list, hook: Callable):
        self._hooks = hooks
        self._hook = hook

    def remove(self) -> None:
        """Unregister the hook (idempotent)."""
        with contextlib.suppress(ValueError):
            self._hooks.remove(self._hook)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


class NodeHooks:
    """A node's hooks, made on its first: ``tensor_pre`` (output number -> the hooks of the tensor that is
    that output), ``pre`` (``register_prehook``) and ``post`` (``register_hook``)."""

    __slots__ = ("tensor_pre", "pre", "post")

    def __init__(self):
        self.tensor_pre: dict[int, list] = {}
        self.pre: list = []
        self.post: list = []


class Node:
    """A recorded operation in the graph (``tensor.grad_fn``).

    ``next_functions`` holds one ``(node, output_nr)`` edge per differentiable input (``(None, 0)``
    where the input needs no gradient).
    """

    __slots__ = ("next_functions", "n_out", "_seq", "_node_hooks", "_metadata", "__weakref__")

    def __init__(self, next_functions: tuple, n_out: int = 1):
        self.next_functions = next_functions
        self.n_out = n_out
        self._seq = next(_seq)
        self._node_hooks: NodeHooks | None = None  # made on the first hook: the engine tests this one slot
        self._metadata: dict | None = None  # made on first use: most nodes never have any
        if anomaly["enabled"]:
            self.metadata["traceback_"] = forward_traceback()

    @property
    def metadata(self) -> dict:
        """A dict for the user's own annotations of the node (PyTorch's ``Node.metadata``); anomaly mode keeps
        the forward's traceback in it."""
        if self._metadata is None:
            self._metadata = {}
        return self._metadata

    def name(self) -> str:
        """The node's class-like name, e.g. ``'MulBackward0'``."""
        return type(self).__name__

    def apply(self, grads: tuple) -> tuple:
        """Gradients for the inputs, given gradients for the outputs."""
        raise NotImplementedError

    def release(self) -> None:
        """Free saved tensors (after a backward without ``retain_graph``)."""

    def _apply_and_release(self, grads: tuple) -> tuple:
        """:meth:`apply`, then :meth:`release`: the engine's call when the graph is not kept (an op's node class
        has it written out in one function)."""
        outs = self.apply(grads)
        self.release()
        return outs

    def _hooks_made(self) -> NodeHooks:
        if self._node_hooks is None:
            self._node_hooks = NodeHooks()
        return self._node_hooks

    def register_hook(self, fn: Callable) -> RemovableHandle:
        """``fn(grad_inputs, grad_outputs)`` runs after the node; a non-None return replaces grad_inputs."""
        hooks = self._hooks_made().post
        hooks.append(fn)
        return RemovableHandle(hooks, fn)

    def register_prehook(self, fn: Callable) -> RemovableHandle:
        """``fn(grad_outputs)`` runs before the node; a non-None return replaces grad_outputs."""
        hooks = self._hooks_made().pre
        hooks.append(fn)
        return RemovableHandle(hooks, fn)

    def _add_tensor_pre_hook(self, output_nr: int, fn: Callable) -> RemovableHandle:
        hooks = self._hooks_made().tensor_pre.setdefault(output_nr, [])
        hooks.append(fn)
        return RemovableHandle(hooks, fn)

    def __call__(self, *grads):
        return self.apply(grads)

    def __repr__(self) -> str:
        return f"<{self.name()} object at {id(self):#x}>"

    @property
    def num_outputs(self) -> int:
        """How many outputs the recorded operation had."""
        return self.n_out


class AccumulateGrad(Node):
    """The node of a leaf tensor that requires grad: adds incoming gradients into ``variable.grad``."""

    __slots__ = ("variable",)

    def __init__(self, variable: Tensor):
        # Node.__init__'s fields set here (a leaf's node is made anew by each graph that reaches the leaf)
        self.next_functions = ()
        self.n_out = 1
        self._seq = _INF  # run as soon as ready, like PyTorch (leaves in the order they became ready)
        self._node_hooks = None
        self._metadata = None
        if anomaly["enabled"]:
            self.metadata["traceback_"] = forward_traceback()
        self.variable = variable

    def name(self) -> str:
        return "kiln::autograd::AccumulateGrad"

    def apply(self, grads: tuple) -> tuple:
        return ()


def _op_name(node: Node) -> str:
    return re.sub(r"Backward\d*$", "", node.name())


class SavedTensor:
    """A tensor saved for backward, with the version it had when saved."""

    __slots__ = ("data", "version", "is_output", "node", "output_nr", "freed")

    def __init__(self, t: Tensor, is_output: bool = False, node: Node | None = None):
        if t._inference:
            raise RuntimeError(
                "Inference tensors cannot be saved for backward. Please do not use Tensors created in inference "
                "mode in computation tracked by autograd. To work around this, you can make a clone to get a normal "
                "tensor and use it in autograd, or use `kiln.no_grad()` instead of `kiln.inference_mode()`."
            )
        self.version = t._vc[0]
        self.is_output = is_output
        self.output_nr = t._output_nr
        self.freed = False
        if is_output:
            # Keep an alias without grad_fn: saving the output itself would make output -> node -> output.
            if t.__class__ is Tensor:  # detach(), without its calls
                alias = _make(t._storage, t._shape, t._stride, t._offset, t._dtype, t._device, t._vc)
                alias._np = t._np
                alias._inference = t._inference
                self.data = alias
            else:
                self.data = t.detach()
            self.node = weakref.ref(node)
        else:
            self.data = t
            self.node = None

    def unpack(self, owner: Node) -> Tensor:
        if self.freed:
            raise RuntimeError(_FREED_MESSAGE)
        data = self.data
        if data._vc[0] != self.version:
            producer = owner if self.is_output else data.grad_fn  # an input: its current history
            # PyTorch names the producing op the way its node is named, less "Backward<n>"
            where = f", which is output {self.output_nr} of {_op_name(producer)}," if producer is not None else ""
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an inplace operation: "
                f"[{data.type()} {list(data._shape)}]{where} is at version {data._vc[0]}; expected version "
                f"{self.version} instead. Hint: enable anomaly detection to find the operation that failed to "
                "compute its gradient, with kiln.autograd.set_detect_anomaly(True, check_nan=False)."
            )
        if self.is_output and state.grad_enabled:
            alias = _make(data._storage, data._shape, data._stride, data._offset, data._dtype, data._device, data._vc)
            alias._np = data._np
            alias._grad_fn = self.node() or owner  # a history held weakly and gone: the saving node's
            alias._requires_grad = True
            alias._output_nr = self.output_nr
            return alias
        return data


_META_SUFFIXES = ("shape", "dtype", "device", "stride", "offset")


def rebind_saved_result(node: Node, t: Tensor) -> None:
    """An in-place op's result now lives in ``t``: make the node's saved ``result`` (if any) refer to
    ``t``'s storage and version, so a later in-place write to ``t`` is caught. Written through a view, the
    result's history (what a double backward differentiates it through) is the view's new one, an
    ``as_strided`` view of its base's ``CopySlices``, as PyTorch saves it; held weakly, as the op's node is
    (once the view and its history are gone, the op's node)."""
    saved = getattr(node, "saved", None)
    if saved is not None and isinstance(saved.get("result"), SavedTensor):
        saved["result"] = SavedTensor(t, True, t.grad_fn if t._base is not None else node)


class BackwardNeeds:
    """What a backward formula asks for, resolved once per op from its parameter names."""

    __slots__ = (
        "formula",
        "arg_names",
        "arg_index",
        "arg_bits",
        "save_plan",
        "meta_names",
        "result",
        "result_guard",
        "needs_input_grad",
        "multi_grad",
        "recorder",
        "applier",
    )

    def __init__(self, formula, arg_names, arg_index, arg_bits, meta_names, result, needs_input_grad, multi_grad):
        self.formula = formula
        self.arg_names = arg_names
        self.arg_index = arg_index
        self.arg_bits = arg_bits  # per argument: its bit among the tensor parameters (0: not one)
        # per argument, (its name, its op parameter index, its guard, its bit): the guard is a bit mask of the
        # tensor inputs (bit k: ``needs_input_grad[k]``) whose gradient reads it, or -1 when the formula reads it
        # whatever needs a gradient (see :func:`_read_guards`); read off the formula's source on the op's first
        # recording (:meth:`read_guards`), not at import
        self.save_plan = None
        self.meta_names = meta_names  # (formula parameter, op parameter index, attribute)
        self.result = result
        self.result_guard = -1  # the same for ``result``
        self.needs_input_grad = needs_input_grad
        self.multi_grad = multi_grad
        self.recorder = None  # made on the op's first recording (kiln.autograd.graph.recorder)
        # the op's OpNode.apply and _apply_and_release written out, made with the recorder (or None: the generic one)
        self.applier = None

    def read_guards(self) -> tuple:
        """Fill ``save_plan`` and ``result_guard`` (once); returns ``save_plan``."""

        def mask(guard: frozenset[int] | None) -> int:
            return -1 if guard is None else sum(1 << k for k in guard)

        guards = _read_guards(self.formula, [*self.arg_names, "result"])
        self.result_guard = mask(guards.get("result"))
        arg_guards = (mask(guards.get(n)) for n in self.arg_names)
        self.save_plan = tuple(zip(self.arg_names, self.arg_index, arg_guards, self.arg_bits))
        return self.save_plan


def backward_needs(opdef, fn: Callable) -> BackwardNeeds:
    """Read a formula's parameter names (see the module docstring)."""
    params = list(inspect.signature(fn).parameters)
    if not params or params[0] not in ("grad", "grads"):
        raise TypeError(f"backward formula of {opdef.name} must take 'grad' or 'grads' first, got {params}")
    names, index, metas = [], [], []
    result = needs = False
    for p in params[1:]:
        base, _, suffix = p.rpartition("_")
        if p == "result":
            result = True
        elif p == "needs_input_grad":
            needs = True
        elif p in opdef.param_names:
            names.append(p)
            index.append(opdef.param_names.index(p))
        elif suffix in _META_SUFFIXES and base in opdef.param_names:
            metas.append((p, opdef.param_names.index(base), "_" + suffix))
        else:
            raise TypeError(f"backward formula of {opdef.name} asks for unknown {p!r}")
    bits = tuple(1 << opdef.tensor_params.index(i) if i in opdef.tensor_params else 0 for i in index)
    return BackwardNeeds(fn, tuple(names), tuple(index), bits, tuple(metas), result, needs, params[0] == "grads")


def _read_guards(fn: Callable, names: list[str]) -> dict[str, frozenset[int] | None]:
    """For each of ``names`` (a formula's parameters), the tensor inputs whose gradient reads it.

    PyTorch saves an input for backward only when an input whose gradient formula reads it requires
    grad: ``a * b`` with only ``a`` requiring grad saves ``b`` alone, so an in-place write to ``a``
    afterwards is no error. kiln reads the same fact off the formula's source: a parameter read only
    under a test of ``needs_input_grad[k]`` (``if needs_input_grad[k]:``, ``x if needs_input_grad[k]
    else None``, ``needs_input_grad[k] and x``; ``or`` of such tests) is needed only when input ``k``
    needs a gradient, and is not saved otherwise; a parameter never read is never saved. A read anywhere
    else, or a formula whose source cannot be read, means always (None), the safe answer.
    """
    import ast
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return {}
    params = list(inspect.signature(fn).parameters)
    # the formula itself: a def of its name, or the one lambda in its source line(s) with its parameters
    found = [
        n
        for n in ast.walk(tree)
        if ((isinstance(n, ast.FunctionDef) and n.name == fn.__name__) or isinstance(n, ast.Lambda))
        and [a.arg for a in n.args.args] == params
    ]
    if len(found) != 1:
        return {}
    func = found[0]
    wanted = set(names)
    reads: dict[str, list[frozenset[int] | None]] = {n: [] for n in names}

    def test_guard(test: ast.expr) -> frozenset[int] | None:
        if (
            isinstance(test, ast.Subscript)
            and isinstance(test.value, ast.Name)
            and test.value.id == "needs_input_grad"
            and isinstance(test.slice, ast.Constant)
            and type(test.slice.value) is int
        ):
            return frozenset((test.slice.value,))
        if isinstance(test, ast.BoolOp):
            parts = [test_guard(v) for v in test.values]
            if isinstance(test.op, ast.Or):
                return None if None in parts else frozenset().union(*parts)
            return next((p for p in parts if p is not None), None)  # and: the first test that guards
        return None

    def visit(node: ast.AST, guard: frozenset[int] | None) -> None:
        if isinstance(node, ast.Name) and node.id in wanted and isinstance(node.ctx, ast.Load):
            reads[node.id].append(guard)
            return
        if isinstance(node, (ast.If, ast.IfExp)):
            inner = test_guard(node.test)
            visit(node.test, guard)
            for part in node.body if isinstance(node, ast.If) else [node.body]:
                visit(part, guard if inner is None else inner)
            for part in node.orelse if isinstance(node, ast.If) else [node.orelse]:
                visit(part, guard)
            return
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
            for value in node.values:  # what follows a guarding test runs only when it holds
                visit(value, guard)
                inner = test_guard(value)
                guard = guard if inner is None else inner
            return
        for child in ast.iter_child_nodes(node):
            visit(child, guard)

    for stmt in func.body if isinstance(func, ast.FunctionDef) else [func.body]:
        visit(stmt, None)
    out: dict[str, frozenset[int] | None] = {}
    for name, found in reads.items():
        # never read: never saved; read anywhere unguarded: always
        out[name] = None if None in found else frozenset().union(*found)
    return out


_NODE_CLASSES: dict[str, type] = {}


def _node_class(opdef, args: tuple) -> type:
    """The node class for a call: one class per PyTorch-style name (``MulBackward0``), made once."""
    name = opdef.grad_fn_name
    if not isinstance(name, str):
        name = name(args)
    cls = _NODE_CLASSES.get(name)
    if cls is None:
        cls = _NODE_CLASSES[name] = type(name, (OpNode,), {"__slots__": ()})
        applier = opdef._backward_needs.applier
        if applier is not None:  # the op's apply written out, called without OpNode.apply's frame (it hands a
            cls.apply, cls._apply_and_release = applier  # node of another op of the same name to the generic one)
    return cls


class OpNode(Node):
    """A node recorded for a kiln op; its backward formula comes from the op definition."""

    # saved: the formula's arguments by name (a tensor as a SavedTensor); seqs: the names among them that hold
    # a sequence of SavedTensors (a tensor-list parameter, several outputs), unpacked entry by entry
    __slots__ = ("op", "saved", "seqs", "input_meta", "layout", "output_meta", "freed", "wants")

    def apply(self, grads: tuple) -> tuple:
        # the op's apply written out (kiln.autograd._record_code), made with its recorder, else the generic one
        fast = self.op._backward_needs.applier
        return self.apply_generic(grads) if fast is None else fast[0](self, grads)

    def apply_generic(self, grads: tuple) -> tuple:
        """:meth:`apply` for any op's node, reading the op record as it goes."""
        opdef = self.op
        needs: BackwardNeeds = opdef._backward_needs
        saved = self.saved
        if self.freed and any(_holds_saved(v) for v in saved.values()):
            raise RuntimeError(_FREED_MESSAGE)
        kwargs = dict(saved)
        for name, value in saved.items():
            if value.__class__ is SavedTensor:
                data = value.data
                if value.is_output or value.freed or data._vc[0] != value.version:
                    data = value.unpack(self)  # an error, or an output's alias; else unpack returns data
                kwargs[name] = data
        for name in self.seqs:  # a tensor-list parameter, or several outputs
            value = saved[name]
            kwargs[name] = type(value)(v.unpack(self) if isinstance(v, SavedTensor) else v for v in value)
        if needs.needs_input_grad:
            layout = self.layout
            n = len(self.next_functions) if layout is None else len(layout)
            kwargs["needs_input_grad"] = _needs_input_grad(self.wants, n)
        if needs.multi_grad:
            full = []
            for g, (shape, dtype, dev) in zip(grads, self.output_meta):
                if g is None:
                    g = zeros(shape, dtype=dtype, device=dev)
                full.append(g)
            result = opdef.backward(tuple(full), **kwargs)
        else:
            result = opdef.backward(grads[0], **kwargs)
        return finish_gradients(self, result)

    def release(self) -> None:
        self.freed = True
        saved = self.saved
        for value in saved.values():
            if value.__class__ is SavedTensor:
                value.freed = True
                value.data = None
        if self.seqs:
            for name in self.seqs:
                for v in saved[name]:
                    if v.__class__ is SavedTensor:
                        v.freed = True
                        v.data = None


def finish_gradients(node: OpNode, result) -> tuple:
    """A formula's ``result`` as the node's gradients: one per edge, placed by the node's layout, each reduced
    to its input's shape and cast to its dtype where it differs (:func:`_fit_to_input`)."""
    layout = node.layout  # None: tensor parameter k is edge k, for every k
    nf, metas = node.next_functions, node.input_meta
    if layout is None and isinstance(result, tuple) and len(result) == len(nf):
        out = list(result)
    elif layout is None and len(nf) == 1 and not isinstance(result, tuple):
        out = [result]
    else:
        if layout is None:
            layout = range(len(nf))
        if len(layout) == 1 and not isinstance(result, tuple):
            result = (result,)
        out = [None] * len(nf)
        for entry, g in zip(layout, result):
            if entry is None or g is None:
                continue
            if isinstance(entry, list):
                for e, gi in zip(entry, g):
                    if e is not None and gi is not None:
                        out[e] = gi
            else:
                out[entry] = g
    for i, g in enumerate(out):
        if g is not None and nf[i][0] is not None:
            meta = metas[i]
            if g._shape != meta[0] or g._dtype is not meta[1]:  # else _fit_to_input would return g
                out[i] = _fit_to_input(g, meta, node, i)
    return tuple(out)


_NEEDS_INPUT_GRAD: dict[tuple[int, int], tuple[bool, ...]] = {}


def _needs_input_grad(wants: int, n: int) -> tuple[bool, ...]:
    """A formula's ``needs_input_grad``: for each of the op's ``n`` tensor parameters, whether bit k of
    ``wants`` (set when the node was recorded: the parameter, or a tensor of its list, required grad) is set.
    That is whether its edge leads anywhere, as the edges were made from the same test."""
    r = _NEEDS_INPUT_GRAD.get((wants, n))
    if r is None:
        r = _NEEDS_INPUT_GRAD[(wants, n)] = tuple(bool(wants >> k & 1) for k in range(n))
    return r


def _holds_saved(value) -> bool:
    """Whether a node's saved entry holds a saved tensor (alone or in a list)."""
    if type(value) in (list, tuple):
        return any(isinstance(v, SavedTensor) for v in value)
    return isinstance(value, SavedTensor)


# kiln._ops imports this module
sum_to = first_call(globals(), "kiln._ops.reduction", "sum_to")
zeros = first_call(globals(), "kiln._ops.creation", "zeros")
make_recorder = first_call(globals(), "kiln.autograd._record_code", "make_recorder")  # (it imports this module)


def _fit_to_input(g: Tensor, meta: tuple, node: Node, i: int) -> Tensor:
    """Reduce a broadcast gradient to the input's shape and cast it to the input's dtype."""
    shape, dtype, _device = meta
    if g._shape != shape:
        try:
            # PyTorch's sum_to views a kept-dims sum; a gradient bound for a leaf's .grad (not recorded) is summed
            # without the view instead, so that the leaf takes it without a copy
            leaf = node.next_functions[i][0].__class__ is AccumulateGrad and not is_grad_enabled()
            g = sum_to(g, shape, view=not leaf)
        except RuntimeError as exc:
            raise RuntimeError(
                f"Function {node.name()} returned an invalid gradient at index {i} - got {list(g._shape)} but "
                f"expected shape compatible with {list(shape)}"
            ) from exc
    if g._dtype is not dtype:
        g = g.to(dtype)
    return g


_NO_EDGE = (None, 0)


def _edge(t: Tensor) -> tuple:
    if not t._requires_grad and (t._base is None or not stale_view_requires_grad(t)):
        return _NO_EDGE
    if t._base is not None and t._view_vc != t._vc[0]:
        _refresh_view_history(t)
    if t._grad_fn is not None:
        return (t._grad_fn, t._output_nr)
    ref = t._accumulator
    acc = None if ref is None else ref()
    if acc is None:
        acc = AccumulateGrad(t)
        new = t._accumulator = AccumulatorRef(acc)
        new.post_hooks = None if ref is None else ref.post_hooks
    return (acc, 0)


class AccumulatorRef(weakref.ref):
    """A leaf's reference to its ``AccumulateGrad`` node (``Tensor._accumulator``): weak, as in PyTorch, since
    the node holds the leaf (a strong one made leaf -> node -> leaf, and a leaf made per step stayed with its
    gradient until a gc pass); the graphs that hold the node keep it, and a new one is made once none does.
    ``post_hooks``: the leaf's ``register_post_accumulate_grad_hook`` hooks, which outlive the nodes."""

    __slots__ = ("post_hooks",)  # set by _edge, which makes every one (built in C: no Python frame per leaf)


def _refresh_view_history(view: Tensor) -> None:
    """The base was written in place since this view's history was recorded: the view's values now
    come from the base's new history, so re-derive the view from it (PyTorch does the same)."""
    from kiln._ops.strided import as_strided
    from kiln._ops.views import nograd_view_error, recorded_view

    base = view._base
    if view._nograd_view and base._requires_grad:
        raise nograd_view_error(view, base_written=True)
    view._view_vc = view._vc[0]
    if not base._requires_grad:
        return
    prev = state.grad_enabled
    state.grad_enabled = True
    try:
        geometry = (view._shape, view._stride, view._offset)
        fresh = recorded_view(as_strided, base, geometry, *geometry)
    finally:
        state.grad_enabled = prev
    view._grad_fn = fresh._grad_fn
    view._output_nr = 0
    if view._retains_grad:
        _register_retain_grad(view)  # .grad follows the new history (the old node's hook stands down)


def gradient_edge(t: Tensor) -> tuple:
    """The ``(node, output_nr)`` a gradient for ``t`` flows into."""
    return _edge(t)


def record(opdef, args: tuple, out) -> None:
    """Record ``opdef(*args) -> out`` on the tape (called by the dispatcher when an input requires grad), through
    the op's recorder (:func:`recorder`)."""
    recorder(opdef)(opdef, args, out)


def recorder(opdef) -> Callable:
    """The op's recorder, ``fn(opdef, args, out)``: the code :mod:`kiln.autograd._record_code` writes out for the
    op on its first recording, or :func:`record_generic`. The public op functions call it directly."""
    needs: BackwardNeeds = opdef._backward_needs
    fn = needs.recorder
    if fn is None:
        fn = needs.recorder = make_recorder(opdef)
    return fn


def record_generic(opdef, args: tuple, out) -> None:
    """:func:`record` for any op and arguments, reading the op record as it goes."""
    needs: BackwardNeeds = opdef._backward_needs
    edges = []
    input_meta = []
    layout = None  # made at the first tensor parameter that is not one tensor: before it, parameter k is edge k
    wants_grad = 0  # bit k: tensor parameter k requires grad (what needs_input_grad[k] will say)
    bit = 1
    for i in opdef.tensor_params:
        a = args[i]
        if isinstance(a, Tensor):
            if layout is not None:
                layout.append(len(edges))
            input_meta.append((a._shape, a._dtype, a._device))
            if a._requires_grad or (a._base is not None and a._view_vc != a._vc[0] and stale_view_requires_grad(a)):
                edges.append(_edge(a))
                wants_grad |= bit
            else:
                edges.append(_NO_EDGE)  # what _edge(a) returns, without its call
        else:
            if layout is None:
                layout = list(range(len(edges)))
            if isinstance(a, (list, tuple)) and any(isinstance(t, Tensor) for t in a):
                sub = []  # None for a non-tensor entry (an index list's "whole dim")
                for t in a:
                    if not isinstance(t, Tensor):
                        sub.append(None)
                        continue
                    sub.append(len(edges))
                    edges.append(_edge(t))
                    input_meta.append((t._shape, t._dtype, t._device))
                layout.append(sub)
                if any(isinstance(t, Tensor) and t._requires_grad for t in a):
                    wants_grad |= bit
            else:
                layout.append(None)
        bit <<= 1
    name = opdef.grad_fn_name
    cls = _NODE_CLASSES.get(name) if name.__class__ is str else None  # else _node_class makes or names it
    node = (cls or _node_class(opdef, args))(tuple(edges), opdef.num_outputs)
    node.op = opdef
    node.layout = layout
    node.wants = wants_grad
    node.input_meta = input_meta
    node.freed = False
    outs = out if opdef.num_outputs > 1 else (out,)
    # a formula of several gradients is given zeros for those that do not arrive
    node.output_meta = [(o._shape, o._dtype, o._device) for o in outs] if needs.multi_grad else None
    saved = {}
    seqs = None  # a list once some saved entry is a sequence
    plan = needs.save_plan
    if plan is None:
        plan = needs.read_guards()
    for name, idx, guard, own in plan:
        v = args[idx]
        if not guard & wants_grad:
            v = None  # only the gradient of an input that needs none reads it: not saved (PyTorch's rule)
        elif isinstance(v, Tensor):
            v = SavedTensor(v)
        elif isinstance(v, (list, tuple)) and any(isinstance(t, Tensor) for t in v):
            v = _save_list(v, bool(wants_grad & ~own))
            seqs = [name] if seqs is None else [*seqs, name]
        saved[name] = v
    for name, idx, attr in needs.meta_names:
        v = args[idx]
        if isinstance(v, (list, tuple)):  # a tensor list: the attribute of each entry
            saved[name] = type(v)(getattr(t, attr) if isinstance(t, Tensor) else None for t in v)
        else:
            saved[name] = getattr(v, attr)
    for k in opdef.differentiable_outputs:
        o = outs[k]
        if o._dtype.is_floating_point:
            o._grad_fn = node
            o._requires_grad = True
            o._output_nr = k
    if needs.result and not needs.result_guard & wants_grad:
        saved["result"] = None
    elif needs.result:
        if opdef.num_outputs == 1:
            saved["result"] = SavedTensor(out, True, node)
        else:
            # every output is held as saved (freed after backward), the non-differentiable ones too (a
            # dropout's noise, a recurrent layer's workspace): held raw, they lived as long as the graph
            saved["result"] = tuple(SavedTensor(o, True, node) if o._grad_fn is node else SavedTensor(o) for o in outs)
            seqs = ["result"] if seqs is None else [*seqs, "result"]
    node.saved = saved
    node.seqs = seqs or ()


def _save_list(tensors, others: bool):
    """A tensor-list parameter saved for backward: an entry is saved (and version-checked) only when
    another input needs a gradient (``others``: a parameter outside the list does), since no list
    formula reads an entry for its own gradient (``cat`` reads shapes alone, ``einsum`` is linear in
    each operand, index lists are integers); None in its place otherwise."""
    grads = [isinstance(t, Tensor) and t._requires_grad for t in tensors]
    total = sum(grads)
    return type(tensors)(
        (SavedTensor(t) if others or total - grads[j] > 0 else None) if isinstance(t, Tensor) else t
        for j, t in enumerate(tensors)
    )


# ---------------------------------------------------------------------------------------- hooks


def _register_tensor_hook(t: Tensor, hook: Callable) -> RemovableHandle:
    _edge(t)  # a view whose base was written in place first takes its current history
    if t.grad_fn is not None:
        return t.grad_fn._add_tensor_pre_hook(t._output_nr, hook)
    if t._hooks is None:
        t._hooks = []
    t._hooks.append(hook)
    return RemovableHandle(t._hooks, hook)


def _register_retain_grad(t: Tensor) -> None:
    """Store the gradient flowing into ``t``'s current history in ``t.grad``; called again whenever an
    in-place op gives ``t`` a new history (the hook on the old node then stands down)."""
    _edge(t)  # (a stale view's history is re-derived here, which registers the hook on the new node)
    ref = weakref.ref(t)
    node = t.grad_fn
    hooks = node._node_hooks
    if hooks is not None and any(
        getattr(h, "_kiln_retain_grad", None) is ref for h in hooks.tensor_pre.get(t._output_nr, ())
    ):
        return  # registered already: once per node, or the gradient would be added twice
    node_ref = weakref.ref(node)  # the node holds this hook: a strong reference would be a cycle

    def retain(grad):
        tensor = ref()
        if tensor is not None and tensor._retains_grad and tensor._grad_fn is node_ref():
            g = grad if state.grad_enabled else grad.detach()
            if tensor._grad is None:
                tensor._grad = g.clone() if not state.grad_enabled else g
            else:
                tensor._grad = tensor._grad + g
        return None

    retain._kiln_retain_grad = ref  # (the tensor it retains for, weakly)
    node._add_tensor_pre_hook(t._output_nr, retain)


def _check_hook_result(hook: Callable, grad: Tensor, r) -> None:
    """A tensor hook may replace a gradient only by a tensor of the same type, device and size (PyTorch's
    checks: anything else would be accumulated or broadcast into the wrong place silently)."""
    if not isinstance(r, Tensor):
        raise TypeError(f"expected Tensor, but hook returned '{type(r).__name__}'")
    name = getattr(hook, "__name__", type(hook).__name__)
    if r._dtype is not grad._dtype or r._device != grad._device:
        raise RuntimeError(f"hook '{name}' has changed the type of value (was {grad.type()} got {r.type()})")
    if r._shape != grad._shape:
        raise RuntimeError(f"hook '{name}' has changed the size of value")


def _run_tensor_hooks(hooks: list, grad: Tensor) -> Tensor:
    retain = []
    for h in list(hooks):
        if getattr(h, "_kiln_retain_grad", False):
            retain.append(h)
            continue
        r = h(grad)
        if r is not None:
            _check_hook_result(h, grad, r)
            grad = r
    for h in retain:  # retain_grad sees the gradient after every other hook
        h(grad)
    return grad
