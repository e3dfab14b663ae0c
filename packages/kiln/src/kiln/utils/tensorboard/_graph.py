"""``add_graph``: run a model once and record the ops it calls as a TensorBoard ``GraphDef``.

kiln has no graph compiler to trace with (``torch.jit.trace`` in PyTorch), so the graph comes from one
forward call observed at the dispatcher: a pre-autograd :class:`kiln.backend.DispatchMode` sees every op
and every composite (``linear``, ``mse_loss``...) the model calls, as the user called it, with the
tensors it took and gave, and forward hooks on every submodule give each op the scope of the module it
ran in (``Net/Sequential[features]/Conv2d[0]``, as PyTorch names them). A composite is one node, as
PyTorch's ``aten::linear`` is: the ops it is made of are not recorded.

Nodes: ``input/<argument>`` and ``output/output.<i>`` (op ``IO Node``), one node per parameter and buffer
the model reads (``Parameter``, ``Buffer``, in the scope of the module that owns it), one per other
tensor an op reads that no recorded op made (``Constant``: tensors from outside the model, and those
the model makes with ``kiln.tensor``, ``arange`` or the random functions, which do not go through the
dispatcher), and one per op call (``kiln::<op>``), with its non-tensor arguments in the ``attr``
attribute and its output shapes in ``_output_shapes``. The second output of an op is the edge
``<node>:1``, as in TensorFlow graphs. ``detach()`` and ``.data`` are no ops in kiln: a tensor with the
memory and layout of one already seen is recorded as a ``kiln::detach`` of it.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings

from tensorboard.compat.proto.attr_value_pb2 import AttrValue
from tensorboard.compat.proto.config_pb2 import RunMetadata
from tensorboard.compat.proto.graph_pb2 import GraphDef
from tensorboard.compat.proto.node_def_pb2 import NodeDef
from tensorboard.compat.proto.step_stats_pb2 import DeviceStepStats, StepStats
from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
from tensorboard.compat.proto.versions_pb2 import VersionDef

import kiln
from kiln.backend import DispatchMode


def _tensors(value) -> list:
    """The tensors in ``value``: itself, or those in a (nested) list, tuple or dict."""
    if isinstance(value, kiln.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _shapes(tensors: list) -> AttrValue:
    shapes = [TensorShapeProto(dim=[TensorShapeProto.Dim(size=int(d)) for d in t.shape]) for t in tensors]
    return AttrValue(list=AttrValue.ListValue(shape=shapes))


def _layout(t) -> tuple:
    return (t.device, t.data_ptr(), tuple(t.shape), t.stride(), t.dtype)


def _describe(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class _Graph:
    """The nodes recorded so far, and which node made each tensor seen."""

    def __init__(self, owners: dict[int, tuple[str, str, str]]):
        self.nodes: list[NodeDef] = []
        self.owners = owners  # id(parameter or buffer) -> (module scope, attribute name, node op)
        self.source: dict[int, str] = {}  # id(tensor) -> the input string of the node that made it
        self.views: dict[tuple, str] = {}  # (storage address, shape, strides, dtype) -> the same
        self.keep: list = []  # every tensor seen stays alive, so no id is reused during the trace
        self.scopes: list[str] = []
        self.used: set[str] = set()

    @property
    def scope(self) -> str:
        return self.scopes[-1] if self.scopes else ""

    def _name(self, base: str) -> str:
        name, i = base, 0
        while name in self.used:
            i += 1
            name = f"{base}_{i}"
        self.used.add(name)
        return name

    def add(self, name: str, op: str, inputs: list[str], outputs: list, attr: str | None = None) -> str:
        """Add a node ``name`` (made unique) whose outputs are the tensors ``outputs``."""
        name = self._name(name)
        attrs = {"_output_shapes": _shapes(outputs)}
        if attr is not None:
            attrs["attr"] = AttrValue(s=attr.encode())
        self.nodes.append(NodeDef(name=name, op=op, input=inputs, attr=attrs))
        for i, t in enumerate(outputs):
            self.source[id(t)] = self.views[_layout(t)] = name if i == 0 else f"{name}:{i}"
            self.keep.append(t)
        return name

    def input_of(self, t) -> str:
        """The node that ``t`` comes from; parameters, buffers and constants get a node when first read."""
        found = self.source.get(id(t))
        if found is not None:
            return found
        owner = self.owners.get(id(t))
        if owner is not None:
            scope, attr, op = owner
            return self.add(f"{scope}/{attr}" if scope else attr, op, [], [t])
        prefix = f"{self.scope}/" if self.scope else ""
        alias = self.views.get(_layout(t))
        if alias is not None:  # the same memory and layout as a tensor seen: ``detach()`` or ``.data`` of it
            name = self.add(prefix + "detach", "kiln::detach", [alias], [t], "{}")
            self.views[_layout(t)] = alias  # later aliases point at the tensor, not at this node
            return name
        return self.add(prefix + "constant", "Constant", [], [t], f"{{dtype: {t.dtype}, device: {t.device}}}")

    def op(self, name: str, arguments: dict, out) -> None:
        """Record one op call: its tensor arguments are edges, the others its ``attr`` text."""
        inputs, attrs = [], []
        for key, value in arguments.items():
            tensors = _tensors(value)
            if tensors:
                inputs.extend(self.input_of(t) for t in tensors)
            elif value is not None:
                attrs.append(f"{key}: {_describe(value)}")
        where = f"{self.scope}/{name}" if self.scope else name
        self.add(where, f"kiln::{name}", inputs, _tensors(out), "{" + ", ".join(attrs) + "}")


class _Recorder(DispatchMode):
    """Records every op and composite call into a :class:`_Graph` (pre-autograd: as the user called it)."""

    level = "pre_autograd"

    def __init__(self, graph: _Graph):
        self.graph = graph

    def dispatch(self, op, args, redispatch):
        out = redispatch(op, args)
        self.graph.op(op.name, dict(zip(op.param_names, args)), out)
        return out

    def dispatch_composite(self, composite, args, kwargs, redispatch):
        out = redispatch(composite, args, kwargs)
        try:
            arguments = dict(inspect.signature(composite.fn).bind(*args, **kwargs).arguments)
        except (TypeError, ValueError):
            arguments = {**{f"arg{i}": a for i, a in enumerate(args)}, **kwargs}
        self.graph.op(composite.name, arguments, out)
        return out


def _module_scopes(model) -> dict[int, tuple[object, str]]:
    """id(module) -> (module, scope) for the model and its submodules: ``Net``, ``Net/Linear[fc1]``..."""
    scopes = {id(model): (model, type(model).__name__)}
    if not hasattr(model, "named_children"):
        return scopes

    def visit(module, scope: str) -> None:
        for name, child in module.named_children():
            if id(child) not in scopes:
                scopes[id(child)] = (child, f"{scope}/{type(child).__name__}[{name}]")
                visit(child, scopes[id(child)][1])

    visit(model, scopes[id(model)][1])
    return scopes


def _owners(scopes: dict[int, tuple[object, str]]) -> dict[int, tuple[str, str, str]]:
    owners: dict[int, tuple[str, str, str]] = {}
    for module, scope in scopes.values():
        for kind, members in (("Parameter", "named_parameters"), ("Buffer", "named_buffers")):
            if hasattr(module, members):
                for name, t in getattr(module, members)(recurse=False):
                    if t is not None:
                        owners.setdefault(id(t), (scope, name, kind))
    return owners


@contextlib.contextmanager
def _scoped(graph: _Graph, scopes: dict[int, tuple[object, str]]):
    """Forward hooks on every module that push and pop its scope while it runs."""
    handles = []

    def enter(scope):
        return lambda module, args: graph.scopes.append(scope)

    def leave(module, args, output):
        graph.scopes.pop()

    try:
        for module, scope in scopes.values():
            if hasattr(module, "register_forward_pre_hook"):
                handles.append(module.register_forward_pre_hook(enter(scope), prepend=True))
                handles.append(module.register_forward_hook(leave, always_call=True))
        yield
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def _eval_mode(model):
    """The model in evaluation mode for the trace (as PyTorch's ``add_graph`` does), restored after."""
    training = getattr(model, "training", None)
    if isinstance(training, bool) and hasattr(model, "train"):
        model.train(False)
        try:
            yield
        finally:
            model.train(training)
    else:
        yield


def _argument_names(model, count: int) -> list[str]:
    fn = getattr(model, "forward", model)
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = []
    for i in range(count):
        if i < len(params) and params[i].kind in (params[i].POSITIONAL_ONLY, params[i].POSITIONAL_OR_KEYWORD):
            names.append(params[i].name)
        else:
            names.append(f"input.{i + 1}")
    return names


def _device_name(tensors: list) -> str:
    dev = tensors[0].device if tensors else kiln.device("cpu")
    return f"/device:{dev.type.upper()}:{dev.index or 0}"


def graph(model, input_to_model=None, verbose: bool = False, use_strict_trace: bool = True):
    """Run ``model`` on ``input_to_model`` (a tensor or a tuple of arguments) and return the recorded
    ``(GraphDef, RunMetadata)``."""
    if not callable(model):
        raise TypeError(f"add_graph expects a callable model (a kiln.nn.Module), got {type(model).__name__}")
    if input_to_model is None:
        args = ()
    elif isinstance(input_to_model, (tuple, list)):
        args = tuple(input_to_model)
    else:
        args = (input_to_model,)
    scopes = _module_scopes(model)
    g = _Graph(_owners(scopes))
    for name, arg in zip(_argument_names(model, len(args)), args):
        tensors = _tensors(arg)
        for j, t in enumerate(tensors):
            g.add(f"input/{name}" if len(tensors) == 1 else f"input/{name}.{j}", "IO Node", [], [t])
    with _eval_mode(model), _scoped(g, scopes), _Recorder(g):
        out = model(*args)
    if use_strict_trace and _has_mutable_container(out):
        warnings.warn(
            "Encountering a list or dict at the output of the traced model: the graph records the tensors in "
            "it, valid only if the container's structure does not depend on the inputs. Pass "
            "use_strict_trace=False to allow this without a warning.",
            stacklevel=3,
        )
    for i, t in enumerate(_tensors(out)):
        g.add(f"output/output.{i + 1}", "IO Node", [g.input_of(t)], [t])
    if verbose:
        for node in g.nodes:
            print(f"{node.name} = {node.op}({', '.join(node.input)})")
    stats = RunMetadata(step_stats=StepStats(dev_stats=[DeviceStepStats(device=_device_name(_tensors(args)))]))
    return GraphDef(node=g.nodes, versions=VersionDef(producer=22)), stats


def _has_mutable_container(value) -> bool:
    if isinstance(value, (list, dict)):
        return True
    return isinstance(value, tuple) and any(_has_mutable_container(v) for v in value)
