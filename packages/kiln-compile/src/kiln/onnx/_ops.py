"""kiln ops as ONNX nodes: one handler per op (the table :data:`HANDLERS`), and the graph builder.

Each handler receives the builder, the node (its arguments with tensors as kiln.compile ``Value`` s, numbers
as Python numbers) and returns the ONNX names of the node's outputs. Numbers become initializers of the
output's dtype (PyTorch's weak scalars), shapes and axes int64 initializers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

import kiln
import onnx
from kiln.compile._graph import Graph, Node, Value, contiguous_strides
from kiln.compile._passes import decompose
from kiln.export import is_constant_name
from onnx import TensorProto, helper, numpy_helper

__all__ = ["HANDLERS", "build_graph"]

_TYPES = {
    kiln.float32: TensorProto.FLOAT,
    kiln.float64: TensorProto.DOUBLE,
    kiln.float16: TensorProto.FLOAT16,
    kiln.bfloat16: TensorProto.BFLOAT16,
    kiln.int64: TensorProto.INT64,
    kiln.int32: TensorProto.INT32,
    kiln.int16: TensorProto.INT16,
    kiln.int8: TensorProto.INT8,
    kiln.uint8: TensorProto.UINT8,
    kiln.bool: TensorProto.BOOL,
}


class _Builder:
    def __init__(self, opset: int, dynamic: bool) -> None:
        self.opset = opset
        self.dynamic = dynamic  # some input dim is symbolic: reshapes keep what they can from their input
        self.nodes: list = []
        self.initializers: list = []
        self.names: dict[int, str] = {}
        self.unavailable: dict[int, str] = {}
        self.count = 0

    def fresh(self, hint: str) -> str:
        self.count += 1
        return f"{hint}_{self.count}"

    def name(self, v: Value) -> str:
        if v.index in self.unavailable:
            raise _unsupported(self.unavailable[v.index], self.opset)
        return self.names[v.index]

    def const(self, array: np.ndarray, hint: str = "const") -> str:
        name = self.fresh(hint)
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def ints(self, values) -> str:
        return self.const(np.asarray(list(values), dtype=np.int64), "ints")

    def operand(self, a: Any, like: Value | kiln.dtype) -> str:
        """An operand in ``like``'s dtype (a value's, or a dtype): a tensor's name, cast where its dtype differs
        (as eager's type promotion converts operands, and ONNX's elementwise ops take one type), or a number
        as a 0-d initializer."""
        target = like if isinstance(like, kiln.dtype) else like.dtype
        if isinstance(a, Value):
            if a.dtype is target:
                return self.name(a)
            return self.node("Cast", [self.name(a)], to=_TYPES[target])[0]
        dtype = np.dtype(target.numpy) if target is not kiln.bfloat16 else np.float32
        return self.const(np.asarray(a, dtype=dtype), "scalar")

    def node(self, op_type: str, inputs: list[str], n_out: int = 1, **attrs) -> list[str]:
        outs = [self.fresh(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, **attrs))
        return outs


def _unsupported(name: str, opset: int) -> Exception:
    from kiln.onnx import UnsupportedOperatorError

    return UnsupportedOperatorError(
        f"Exporting the operator 'kiln::{name}' to ONNX opset version {opset} is not supported by kiln.onnx."
    )


def _axes(dims, ndim: int) -> list[int]:
    if dims is None or (isinstance(dims, (tuple, list)) and not dims):  # no dims: all of them, as in PyTorch
        return list(range(ndim))
    if isinstance(dims, int):
        dims = (dims,)
    return sorted(d % max(ndim, 1) for d in dims)


# ---------------------------------------------------------------------------------------------- handlers


def _binary(op_type: str):
    def handler(b: _Builder, node: Node, a, out):
        x, y = b.operand(a[0], out), b.operand(a[1], out)
        alpha = a[2] if len(a) > 2 else 1
        if alpha != 1:
            (y,) = b.node("Mul", [y, b.operand(alpha, out)])
        return b.node(op_type, [x, y])

    return handler


def _compare(op_type: str, negate: bool = False):
    def handler(b: _Builder, node: Node, a, out):
        like = getattr(node.spec, "compute_dtype", None) or (a[0] if isinstance(a[0], Value) else a[1])
        (r,) = b.node(op_type, [b.operand(a[0], like), b.operand(a[1], like)])
        return b.node("Not", [r]) if negate else [r]

    return handler


def _unary(op_type: str):
    return lambda b, node, a, out: b.node(op_type, [b.name(a[0])])


def _gelu(b: _Builder, node: Node, a, out):
    x = b.name(a[0])
    approximate = a[1] if len(a) > 1 else "none"
    if b.opset >= 20:
        return b.node("Gelu", [x], approximate=approximate)
    half, one = b.operand(0.5, out), b.operand(1.0, out)
    if approximate == "tanh":
        (cube,) = b.node("Mul", [x, b.node("Mul", [x, x])[0]])
        (inner,) = b.node("Add", [x, b.node("Mul", [cube, b.operand(0.044715, out)])[0]])
        (t,) = b.node("Tanh", [b.node("Mul", [inner, b.operand(math.sqrt(2 / math.pi), out)])[0]])
    else:
        (t,) = b.node("Erf", [b.node("Mul", [x, b.operand(1 / math.sqrt(2), out)])[0]])
    (s,) = b.node("Add", [t, one])
    return b.node("Mul", [b.node("Mul", [x, half])[0], s])


def _transpose(b: _Builder, node: Node, a, out):
    n = len(a[0].shape)
    if node.op.name == "t":
        perm = [1, 0] if n == 2 else list(range(n))
    elif node.op.name == "transpose":
        perm = list(range(n))
        d0, d1 = a[1] % n, a[2] % n
        perm[d0], perm[d1] = perm[d1], perm[d0]
    else:
        perm = [d % n for d in a[1]]
    return b.node("Transpose", [b.name(a[0])], perm=perm)


def _reshape(b: _Builder, node: Node, a, out):
    shape = list(out.shape)
    src = a[0].shape
    if b.dynamic and shape and src and shape[0] == src[0]:
        shape[0] = 0  # ONNX: copy the input's dim (the batch, when it is dynamic)
    return b.node("Reshape", [b.name(a[0]), b.ints(shape)])


def _expand(b: _Builder, node: Node, a, out):
    return b.node("Expand", [b.name(a[0]), b.ints(out.shape)])


def _identity(b: _Builder, node: Node, a, out):
    return b.node("Identity", [b.name(a[0])])


def _as_strided(b: _Builder, node: Node, a, out):
    src = a[0]
    same = tuple(a[1]) == src.shape and tuple(a[2]) == src.stride == contiguous_strides(src.shape)
    if not (same and (len(a) < 4 or not a[3])):
        raise _unsupported("as_strided", b.opset)  # only an alias of a whole contiguous tensor has an ONNX form
    return _identity(b, node, a, out)


def _index_view(b: _Builder, node: Node, a, out):
    """Basic indexing: ints (Gather), slices (Slice), None (Unsqueeze), Ellipsis."""
    x = b.name(a[0])
    key = a[1] if isinstance(a[1], tuple) else (a[1],)
    ndim = len(a[0].shape)
    specified = sum(1 for k in key if k is not None and k is not Ellipsis)
    axis = 0
    for k in key:
        if k is Ellipsis:
            axis += ndim - specified
        elif k is None:
            (x,) = b.node("Unsqueeze", [x, b.ints([axis])])
            axis += 1
        elif isinstance(k, int):
            (x,) = b.node("Gather", [x, b.const(np.asarray(k, dtype=np.int64), "index")], axis=axis)
        elif isinstance(k, slice):
            start = 0 if k.start is None else k.start
            stop = np.iinfo(np.int64).max if k.stop is None else k.stop
            step = 1 if k.step is None else k.step
            if (start, stop, step) != (0, np.iinfo(np.int64).max, 1):
                (x,) = b.node("Slice", [x, b.ints([start]), b.ints([stop]), b.ints([axis]), b.ints([step])])
            axis += 1
        else:
            raise _unsupported("_index_view", b.opset)
    return [x]


def _squeeze(b: _Builder, node: Node, a, out):
    src = a[0].shape
    dims = a[1] if len(a) > 1 else None
    axes = (
        [d for d in _axes(dims, len(src)) if src[d] == 1]
        if dims is not None
        else [i for i, n in enumerate(src) if n == 1]
    )
    return b.node("Squeeze", [b.name(a[0]), b.ints(axes)]) if axes else _identity(b, node, a, out)


def _unsqueeze(b: _Builder, node: Node, a, out):
    return b.node("Unsqueeze", [b.name(a[0]), b.ints([a[1] % len(out.shape)])])


def _addmm(b: _Builder, node: Node, a, out):
    beta = a[3] if len(a) > 3 else 1
    alpha = a[4] if len(a) > 4 else 1
    return b.node("Gemm", [b.name(a[1]), b.name(a[2]), b.name(a[0])], alpha=float(alpha), beta=float(beta))


def _reduce(op_type: str):
    def handler(b: _Builder, node: Node, a, out):
        x = b.name(a[0])
        ndim = len(a[0].shape)
        dims = a[1] if len(a) > 1 else None
        keepdim = int(bool(a[2])) if len(a) > 2 else 0
        if len(a) > 3 and a[3] is not None:
            (x,) = b.node("Cast", [x], to=_TYPES[a[3]])
        axes = _axes(dims, ndim)
        if not axes:
            return b.node("Identity", [x])
        if op_type == "ReduceSum" or b.opset >= 18:
            return b.node(op_type, [x, b.ints(axes)], keepdims=keepdim)
        return b.node(op_type, [x], axes=axes, keepdims=keepdim)

    return handler


def _softmax(op_type: str):
    return lambda b, node, a, out: b.node(op_type, [b.name(a[0])], axis=a[1] % max(len(out.shape), 1))


def _concat(b: _Builder, node: Node, a, out):
    parts = [b.name(t) for t in a[0]]
    dim = (a[1] if len(a) > 1 else 0) % len(out.shape)
    if node.op.name == "stack":
        parts = [b.node("Unsqueeze", [p, b.ints([dim])])[0] for p in parts]
    return b.node("Concat", parts, axis=dim)


def _where(b: _Builder, node: Node, a, out):
    return b.node("Where", [b.name(a[0]), b.operand(a[1], out), b.operand(a[2], out)])


def _conv(b: _Builder, node: Node, a, out):
    x, w, bias, stride, padding, dilation, transposed, output_padding, groups = a
    nd = len(out.shape) - 2
    stride, padding, dilation = (
        list(v) if isinstance(v, (tuple, list)) else [v] * nd for v in (stride, padding, dilation)
    )
    inputs = [b.name(x), b.name(w)] + ([b.name(bias)] if bias is not None else [])
    attrs = {"strides": stride, "pads": padding * 2, "dilations": dilation, "group": groups}
    if transposed:
        op = list(output_padding) if isinstance(output_padding, (tuple, list)) else [output_padding] * nd
        return b.node("ConvTranspose", inputs, output_padding=op, **attrs)
    return b.node("Conv", inputs, **attrs)


def _affine_operands(b: _Builder, weight, bias, channels: tuple, like: Value) -> list[str]:
    dtype = np.dtype(like.dtype.numpy)
    w = b.name(weight) if weight is not None else b.const(np.ones(channels, dtype), "ones")
    c = b.name(bias) if bias is not None else b.const(np.zeros(channels, dtype), "zeros")
    return [w, c]


def _batch_norm(b: _Builder, node: Node, a, out):
    x, weight, bias, mean, var, training, eps = a
    if training or mean is None or var is None:
        raise _unsupported("_native_batch_norm (training mode: call model.eval())", b.opset)
    scale_bias = _affine_operands(b, weight, bias, (x.shape[1],), out)
    return b.node("BatchNormalization", [b.name(x), *scale_bias, b.name(mean), b.name(var)], epsilon=float(eps))


def _layer_norm(b: _Builder, node: Node, a, out):
    x, normalized, weight, bias, eps = a
    scale_bias = _affine_operands(b, weight, bias, tuple(normalized), out)
    return b.node("LayerNormalization", [b.name(x), *scale_bias], axis=-len(normalized), epsilon=float(eps))


def _max_pool(b: _Builder, node: Node, a, out):
    x, kernel, stride, padding, dilation, ceil_mode = a
    (y,) = b.node(
        "MaxPool",
        [b.name(x)],
        kernel_shape=list(kernel),
        strides=list(stride),
        pads=list(padding) * 2,
        dilations=list(dilation),
        ceil_mode=int(bool(ceil_mode)),
    )
    # kiln's indices count within each plane, ONNX's over the whole tensor: only the values are exported
    b.unavailable[node.outputs[1].index] = "_max_pool (its indices)"
    return [y, None]


def _clamp(b: _Builder, node: Node, a, out):
    x = b.name(a[0])
    lo = a[1] if len(a) > 1 else None
    hi = a[2] if len(a) > 2 else None
    if isinstance(lo, Value) or isinstance(hi, Value):  # tensor bounds broadcast: Max and Min
        if lo is not None:
            (x,) = b.node("Max", [x, b.operand(lo, out)])
        return b.node("Min", [x, b.operand(hi, out)]) if hi is not None else [x]
    bounds = [b.operand(v, out) if v is not None else "" for v in (lo, hi)]
    return b.node("Clip", [x, *bounds])


def _cast(b: _Builder, node: Node, a, out):
    return b.node("Cast", [b.name(a[0])], to=_TYPES[out.dtype])


HANDLERS = {
    "add": _binary("Add"),
    "sub": _binary("Sub"),
    "mul": _binary("Mul"),
    "div": lambda b, node, a, out: (
        _binary("Div")(b, node, a[:2], out) if len(a) < 3 or a[2] is None else _raise(b, node)
    ),
    "pow": lambda b, node, a, out: b.node("Pow", [b.operand(a[0], out), b.operand(a[1], out)]),
    "maximum": _binary("Max"),
    "minimum": _binary("Min"),
    "eq": _compare("Equal"),
    "ne": _compare("Equal", negate=True),
    "gt": _compare("Greater"),
    "lt": _compare("Less"),
    "ge": _compare("GreaterOrEqual"),
    "le": _compare("LessOrEqual"),
    "where": _where,
    "clamp": _clamp,
    "relu": _unary("Relu"),
    "sigmoid": _unary("Sigmoid"),
    "tanh": _unary("Tanh"),
    "exp": _unary("Exp"),
    "log": _unary("Log"),
    "sqrt": _unary("Sqrt"),
    "neg": _unary("Neg"),
    "abs": _unary("Abs"),
    "erf": _unary("Erf"),
    "reciprocal": _unary("Reciprocal"),
    "sin": _unary("Sin"),
    "cos": _unary("Cos"),
    "floor": _unary("Floor"),
    "ceil": _unary("Ceil"),
    "sign": _unary("Sign"),
    "isnan": _unary("IsNaN"),
    "log1p": lambda b, node, a, out: b.node("Log", [b.node("Add", [b.name(a[0]), b.operand(1.0, out)])[0]]),
    "expm1": lambda b, node, a, out: b.node("Sub", [b.node("Exp", [b.name(a[0])])[0], b.operand(1.0, out)]),
    "gelu": _gelu,
    "t": _transpose,
    "transpose": _transpose,
    "permute": _transpose,
    "view": _reshape,
    "_reshape_alias": _reshape,
    "expand": _expand,
    "clone": _identity,
    "as_strided": _as_strided,
    "_index_view": _index_view,
    "squeeze": _squeeze,
    "unsqueeze": _unsqueeze,
    "addmm": _addmm,
    "matmul": lambda b, node, a, out: b.node("MatMul", [b.name(a[0]), b.name(a[1])]),
    "sum": _reduce("ReduceSum"),
    "mean": _reduce("ReduceMean"),
    "amax": _reduce("ReduceMax"),
    "amin": _reduce("ReduceMin"),
    "_softmax": _softmax("Softmax"),
    "_log_softmax": _softmax("LogSoftmax"),
    "cat": _concat,
    "stack": _concat,
    "convolution": _conv,
    "_native_batch_norm": _batch_norm,
    "_native_layer_norm": _layer_norm,
    "_max_pool": _max_pool,
    "_to_copy": _cast,
}


def _raise(b: _Builder, node: Node):
    raise _unsupported(node.op.name, b.opset)


# ---------------------------------------------------------------------------------------------- the graph


def _dims(v: Value, labels: dict) -> list:
    return [labels.get(i, n) for i, n in enumerate(v.shape)]


def _labels(spec: Any, name: str) -> dict[int, str]:
    if spec is None:
        return {}
    if isinstance(spec, Mapping):
        return {int(k): str(v) for k, v in spec.items()}
    return {int(k): f"{name}_dim_{k}" for k in spec}


def build_graph(
    graph: Graph,
    weights: dict[str, Value],
    state: dict[str, kiln.Tensor],
    opset: int,
    input_names,
    output_names,
    dynamic_axes: dict,
    export_params: bool,
) -> onnx.ModelProto:
    """The ONNX model of a traced program (see :func:`kiln.onnx.export`)."""
    inputs = [v for v in graph.inputs if v.source == "input"]
    in_names = list(input_names or [f"input{i}" for i in range(len(inputs))])
    out_names = list(output_names or [f"output{i}" for i in range(len(graph.outputs))])
    if len(in_names) != len(inputs):
        raise ValueError(f"kiln.onnx.export: {len(in_names)} input_names for {len(inputs)} tensor inputs")
    if len(out_names) != len(graph.outputs):
        raise ValueError(f"kiln.onnx.export: {len(out_names)} output_names for {len(graph.outputs)} tensor outputs")
    unknown = set(dynamic_axes) - set(in_names) - set(out_names)
    if unknown:
        raise ValueError(f"kiln.onnx.export: dynamic_axes names no input or output: {sorted(unknown)}")
    graph = decompose(graph, keep=lambda op: op.name in HANDLERS)  # ops without a handler, in ops with one
    b = _Builder(opset, dynamic=bool(dynamic_axes))
    graph_inputs = []
    for v, name in zip(inputs, in_names):
        b.names[v.index] = name
        graph_inputs.append(
            helper.make_tensor_value_info(name, _TYPES[v.dtype], _dims(v, _labels(dynamic_axes.get(name), name)))
        )
    for name, v in weights.items():
        b.names[v.index] = name
        array = state[name].numpy()
        # export_params=False makes the model's parameters and buffers inputs; constants stay in the file
        if export_params or is_constant_name(name):
            b.initializers.append(numpy_helper.from_array(array, name))
        else:
            graph_inputs.append(helper.make_tensor_value_info(name, _TYPES[v.dtype], list(array.shape)))
    for node in graph.nodes:
        handler = HANDLERS.get(node.op.name)
        if handler is None:
            raise _unsupported(node.op.name, opset)
        outs = handler(b, node, list(node.args), node.outputs[0])
        for v, name in zip(node.outputs, outs):
            if name is not None:
                b.names[v.index] = name
    graph_outputs = []
    for v, name in zip(graph.outputs, out_names):
        b.nodes.append(helper.make_node("Identity", [b.name(v)], [name]))
        graph_outputs.append(
            helper.make_tensor_value_info(name, _TYPES[v.dtype], _dims(v, _labels(dynamic_axes.get(name), name)))
        )
    onnx_graph = helper.make_graph(b.nodes, "kiln", graph_inputs, graph_outputs, initializer=b.initializers)
    model = helper.make_model(onnx_graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="kiln")
    model.ir_version = min(model.ir_version, 10)  # what onnxruntime releases of the last years read
    return model
