"""kiln-compile's code generator for device ``"cuda"``: a fused group of pointwise ops (and a whole-tensor
``sum`` or ``mean`` after them) becomes one numba.cuda kernel.

kiln-compile hands over a ``FusedGroup`` (plain data: the iteration shape, the inputs' shapes and dtypes,
scalar expressions, the outputs to store, an optional reduction). :func:`fused_kernel`
writes the kernel: a grid-stride loop that reads every input through its strides and storage offset (so
views and broadcast inputs are read in place), computes the group's lines with the float32 or float64
libdevice function each call's argument needs, and stores the outputs. A reduction adds its value per
thread in float64, then per block in shared memory; a one-block kernel adds the blocks' sums in a fixed
order (the same result on every run, as PyTorch's CUDA sums). Kernels launch on the current stream.

Kernels are generated when first called, for the layout the call brings (which inputs are device arrays
and which are CPU scalars, such as an optimizer's step count; the number of dims left after coalescing),
and cached like every kiln-cuda kernel (a file per source text, numba.cuda's ``cache=True``).
"""

from __future__ import annotations

import math

import numpy as np

import kiln
from kiln_cuda import _driver, codegen
from kiln_cuda.codegen import Operand
from kiln_cuda.kernels import _operand
from kiln_cuda.streams import current_stream

__all__ = ["codegen_fused", "fused_kernel", "partial_sum_kernel"]


# ------------------------------------------------------------------------------------------------ generators
# A group's lines are scalar Python over the inputs; each function call is written for its argument's float
# type (expf for float32, exp for float64, as the eager kernels call them).

_FUSED_FUNCTIONS = ("exp", "log", "sqrt", "tanh", "sin", "cos", "expm1", "log1p", "erf", "erfc")
_FUSED_SIGMOID = """
def sigmoid_{t}(x):
    return {T}(1) / ({T}(1) + exp_{t}(-x))
"""


def _typed_lines(lines, dtypes: dict) -> list[tuple[str, str]]:
    """``lines`` with each call of a math function renamed for its argument's type (``exp`` ->
    ``exp_f32`` / ``exp_f64``): the types follow the expressions from ``dtypes`` (input name -> dtype name)
    as NumPy's scalar promotion does (float64 wins; comparisons are bool)."""
    import ast

    known = dict(dtypes)

    def promote(*ts):
        floats = [t for t in ts if t != "bool"]
        return "float64" if "float64" in floats else ("float32" if floats else "bool")

    def infer(node) -> str:
        if isinstance(node, ast.Name):
            return known.get(node.id, "float64")  # inf, nan: Python floats
        if isinstance(node, ast.Constant):
            return "bool" if isinstance(node.value, bool) else "float64"
        if isinstance(node, ast.BinOp):
            return promote(infer(node.left), infer(node.right))
        if isinstance(node, ast.UnaryOp):
            return "bool" if isinstance(node.op, ast.Not) else infer(node.operand)
        if isinstance(node, (ast.Compare, ast.BoolOp)):
            for child in [node.left, *node.comparators] if isinstance(node, ast.Compare) else node.values:
                infer(child)
            return "bool"
        if isinstance(node, ast.IfExp):
            infer(node.test)
            return promote(infer(node.body), infer(node.orelse))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            name = node.func.id
            arg = infer(node.args[0])
            if name in ("float32", "float64"):
                return name
            if name in (*_FUSED_FUNCTIONS, "sigmoid"):
                if arg == "bool":  # computed in float32, as numba types it (NumPy's bool math is float16)
                    node.args[0] = ast.Call(ast.Name("float32", ast.Load()), [node.args[0]], [])
                    arg = "float32"
                node.func.id = f"{name}_{'f32' if arg == 'float32' else 'f64'}"
            return arg
        raise ValueError(f"kiln-cuda fusion: cannot type {ast.dump(node)}")

    out = []
    for name, expr in lines:
        tree = ast.parse(expr, mode="eval")
        known[name] = infer(tree.body)
        out.append((name, ast.unparse(tree)))
    return out


def fused_kernel(lines, ops: list[Operand], outputs, reduced: str | None, ndim: int):
    """The kernel of a kiln-compile fused group: ``kernel(n, shape, <per operand: array, offset, strides |
    value>, <per output: array, offset>, partials)``; each of the ``n`` positions of ``shape`` reads the
    operands (as ``x0, x1...``), computes ``lines`` and stores each ``(name, dtype)`` of ``outputs`` at the
    output's offset plus the flat position (outputs are C-contiguous). With ``reduced`` (a line's name) each
    block also adds that value over its positions in float64 and writes the sum to ``partials[block]``
    (:func:`partial_sum_kernel` adds those in order)."""
    lines = [tuple(line) for line in lines]
    outputs = [tuple(o) for o in outputs]
    params, positions, loads = codegen.operand_reads(ops)
    params[:0] = ["n", "shape"]
    typed = _typed_lines(lines, {f"x{k}": o.compute.name for k, o in enumerate(ops)})
    stores = []
    for j, (name, _) in enumerate(outputs):
        params += [f"out{j}", f"oo{j}"]
        stores.append(f"out{j}[oo{j} + i] = O{j}({name})")
    params.append("partials")
    inner = [*codegen._unravel("i", "shape", ndim, positions), *loads, *[f"{n} = {e}" for n, e in typed], *stores]
    if reduced is not None:
        inner.append(f"acc += F64({reduced})")
    inner.append("i += step")
    head = [f"C{k} = caster({o.compute.name!r})" for k, o in enumerate(ops)]
    head += [f"O{j} = caster({d!r})" for j, (_, d) in enumerate(outputs)]
    head += ["F64 = caster('float64')", "float32 = caster('float32')", "float64 = F64", "inf = INF", "nan = NAN"]
    head += [
        f"{f}_{t} = leaf({f!r}, {d!r})" for f in _FUSED_FUNCTIONS for t, d in (("f32", "float32"), ("f64", "float64"))
    ]
    head.append(f"THREADS = {_driver.THREADS}")
    sigmoids = "".join(_FUSED_SIGMOID.format(t=t, T=T) for t, T in (("f32", "F32"), ("f64", "F64")))
    src = (
        "\n".join(head)
        + "\n"
        + sigmoids
        + "\n\nsigmoid_f32 = device_jit(sigmoid_f32)\nsigmoid_f64 = device_jit(sigmoid_f64)\n\n\n"
        + f"def kernel({', '.join(params)}):\n"
        + (codegen._shared(["sh = cuda.shared.array(THREADS, np.float64)"]) if reduced is not None else "")
        + "    i = cuda.grid(1)\n"
        + "    step = cuda.gridsize(1)\n"
        + "    acc = F64(0)\n"
        + "    while i < n:\n"
        + codegen._body(inner, 8)
        + (codegen._body(_block_sum("partials[cuda.blockIdx.x] = sh[0]"), 4) if reduced is not None else "")
    )
    return codegen._remember("fused_kernel", (lines, ops, outputs, reduced, ndim), codegen._load(src, "float32"))


def _block_sum(result: str) -> list[str]:
    """Kernel lines adding every thread's ``acc`` in shared memory ``sh`` (a tree: the same order on every
    run), then ``result`` by thread 0."""
    return [
        "tid = cuda.threadIdx.x",
        "sh[tid] = acc",
        "cuda.syncthreads()",
        "s = cuda.blockDim.x // 2",
        "while s > 0:",
        "    if tid < s:",
        "        sh[tid] = sh[tid] + sh[tid + s]",
        "    cuda.syncthreads()",
        "    s = s // 2",
        "if tid == 0:",
        f"    {result}",
    ]


def partial_sum_kernel(out_dtype: np.dtype):
    """``kernel(nb, partials, out, offset, divisor)``, one block: ``out[offset]`` = the sum of
    ``partials[:nb]`` (float64, added in a fixed order) divided by ``divisor``, in ``out_dtype``."""
    src = (
        f"OT = caster({np.dtype(out_dtype).name!r})\n"
        "F64 = caster('float64')\n"
        f"THREADS = {_driver.THREADS}\n\n\n"
        "def kernel(nb, partials, out, offset, divisor):\n"
        + codegen._shared(["sh = cuda.shared.array(THREADS, np.float64)"])
        + "    acc = F64(0)\n"
        + "    j = cuda.threadIdx.x\n"
        + "    while j < nb:\n"
        + "        acc += partials[j]\n"
        + "        j += cuda.blockDim.x\n"
        + codegen._body(_block_sum("out[offset] = OT(sh[0] / divisor)"), 4)
    )
    return codegen._remember("partial_sum_kernel", (np.dtype(out_dtype),), codegen._load(src, "float32"))


codegen._GENERATORS.update(fused_kernel=fused_kernel, partial_sum_kernel=partial_sum_kernel)  # for replay


def _span(t: kiln.Tensor) -> tuple[int, int]:
    """The device addresses ``[first, last]`` that ``t``'s elements lie between."""
    lo = hi = t.data_ptr()
    for n, st in zip(t.shape, t.stride()):
        reach = (n - 1) * st * t.element_size()
        lo, hi = (lo + reach, hi) if reach < 0 else (lo, hi + reach)
    return lo, hi + t.element_size() - 1


def _target(view: kiln.Tensor, others: list[kiln.Tensor], shape: tuple) -> kiln.Tensor:
    """Where the kernel stores an output meant for ``view``: ``view`` itself, unless another input overlaps
    its memory in another layout (a thread could read an element another thread already stored): then a
    new tensor, copied into ``view`` after the kernel."""
    lo, hi = _span(view)
    for t in others:
        a, b = _span(t)
        if a <= hi and lo <= b:
            same = t.data_ptr() == view.data_ptr() and tuple(t.shape) == shape and t.stride() == view.stride()
            if not same:
                return kiln.empty(shape, dtype=view.dtype, device=view.device)
    return view


class _Fused:
    """The kernel of one group: ``kernel(*inputs, out=None)`` as kiln-compile's ``FusedGroup`` contract says."""

    def __init__(self, group) -> None:
        self.group = group
        self.kernels: dict = {}  # (scalar inputs, dims after coalescing) -> kernel; "sum" -> the blocks' adder
        self.dtypes = [getattr(kiln, d) for _, d in group.outputs]

    def __call__(self, *tensors: kiln.Tensor, out=None):
        g = self.group
        shape, n = g.shape, math.prod(g.shape)
        device = next(t.device for t in (*tensors, *(out or ())) if t is not None and t.device.type == "cuda")
        given = list(out or [None] * len(g.outputs))
        outs = [
            kiln.empty(shape, dtype=d, device=device)
            if v is None
            else _target(v, [t for t in tensors if t is not v and t.device.type == "cuda"], shape)
            for d, v in zip(self.dtypes, given)
        ]
        result = None
        if g.reduction is not None:
            kind, _, dtype = g.reduction
            result = kiln.empty((1,) * len(shape) if g.keepdim else (), dtype=getattr(kiln, dtype), device=device)
        if n:
            self._launch(tensors, outs, result, device)
        elif result is not None:
            result.fill_(0.0 if kind == "sum" else math.nan)
        for o, v in zip(outs, given):
            if v is not None and o is not v:  # stored aside: an input overlapped the target
                v.copy_(o)
        results = [o if v is None else v for o, v in zip(outs, given)]
        return (*results, result) if result is not None else tuple(results)

    def _launch(self, tensors, outs, result, device) -> None:
        g = self.group
        shape, n = g.shape, math.prod(g.shape)
        # device arrays read through their (broadcast) strides; a CPU 0-d tensor (a step count) is a value
        ops = [_operand(t, np.dtype(dtype), shape) for t, (_, dtype) in zip(tensors, g.inputs)]
        arrays = [o for o in ops if not o.is_scalar]
        cshape, cstrides = codegen.coalesce(shape, [o.strides for o in arrays])
        for o, st in zip(arrays, cstrides):
            o.strides = st
        key = (tuple(o.is_scalar for o in ops), len(cshape))
        kernel = self.kernels.get(key)
        if kernel is None:
            reduced = g.reduction[1] if g.reduction is not None else None
            kernel = self.kernels[key] = fused_kernel(g.lines, ops, g.outputs, reduced, len(cshape))
        blocks = _driver.blocks(n)
        partials = kiln.empty((blocks if result is not None else 1,), dtype=kiln.float64, device=device)
        args: list = [n, cshape]
        for o in ops:
            args += [o.scalar] if o.is_scalar else [o.array, o.offset, o.strides]
        for o in outs:
            args += [o.untyped_storage().array, o.storage_offset()]
        args.append(partials.untyped_storage().array)
        stream = current_stream(device.index)._raw
        codegen.launch(kernel, blocks, _driver.THREADS, stream, args)
        if result is not None:
            total = self.kernels.get("sum")
            if total is None:
                total = self.kernels["sum"] = partial_sum_kernel(np.dtype(result.dtype.numpy))
            divisor = np.float64(1.0 if g.reduction[0] == "sum" else n)
            sums = partials.untyped_storage().array
            codegen.launch(
                total, 1, _driver.THREADS, stream, [blocks, sums, result.untyped_storage().array, 0, divisor]
            )


class _CodeGenerator:
    """What kiln-cuda registers through ``kiln_register_compilers``: ``codegen(group) -> kernel``."""

    device_type = "cuda"

    def __call__(self, group):
        """A kernel for ``group`` (a kiln.compile ``FusedGroup``), taking and returning cuda tensors."""
        return _Fused(group)


codegen_fused = _CodeGenerator()
