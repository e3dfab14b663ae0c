"""kiln-cuda's pointwise, reduction, copy and matmul kernels (:data:`KERNELS`), a few lines per op.

Pointwise ops are an expression each, compiled by the pointwise generator
(:func:`kiln_cuda.codegen.pointwise_kernel`) for whatever operand dtypes, broadcasting and strides a call
brings; reductions name a fold (:data:`kiln_cuda.codegen.REDUCTIONS`); matmul is one tiled kernel
(:mod:`kiln_cuda.kernels_index` and :mod:`kiln_cuda.kernels_nn` hold the rest of the table). Every op
kiln-cuda has no kernel for runs through its decomposition into these, on the device (``kiln.backend``);
the rest raise kiln's missing-kernel error, or run on the CPU when the user opts in (``KILN_CPU_FALLBACK=1``).
"""

from __future__ import annotations

import math

import numpy as np

import kiln
import kiln.backend as kb
from kiln_cuda import _driver, codegen
from kiln_cuda.codegen import Operand
from kiln_cuda.streams import current_stream

__all__ = ["KERNELS", "launch_pointwise", "new_output"]

NAME = "cuda"
FLOATS = (kiln.float16, kiln.bfloat16, kiln.float32, kiln.float64)
INTS = (kiln.uint8, kiln.int8, kiln.int16, kiln.int32, kiln.int64)


def _np(dtype) -> np.dtype:
    return np.dtype(dtype.numpy)


def _compute(dtype) -> np.dtype:
    return np.dtype(kb.compute_dtype(dtype))


def new_output(spec) -> kiln.Tensor:
    """A fresh contiguous tensor for ``spec`` on the device."""
    return kiln.empty(spec.shape, dtype=spec.dtype, device=spec.device)


def _bstrides(t: kiln.Tensor, shape: tuple) -> tuple:
    """``t``'s strides broadcast to ``shape`` (0 along dims it is broadcast over)."""
    nd, ts, st = len(shape), tuple(t.shape), t.stride()
    lead = nd - len(ts)
    return tuple(0 if i < lead or ts[i - lead] == 1 else st[i - lead] for i in range(nd))


def _scalar(x, compute: np.dtype):
    """A Python number (or 0-d CPU tensor) in the compute dtype; integers wrap as PyTorch's do."""
    if isinstance(x, kiln.Tensor):
        x = x.item()
    return np.array(x).astype(compute)[()]


def _operand(x, compute: np.dtype, shape: tuple) -> Operand:
    if isinstance(x, kiln.Tensor) and x.device.type == NAME:
        return Operand(
            compute=compute,
            array=x.untyped_storage().array,
            offset=x.storage_offset(),
            strides=_bstrides(x, shape),
            storage_dtype=_np(x.dtype),
        )
    return Operand(compute=compute, scalar=_scalar(x, compute))


def _stream_of(t: kiln.Tensor):
    return current_stream(t.device.index if t.device.index is not None else None)


class Read:
    """An operand read through explicit strides over a launch's shape (not broadcast from its own shape), and
    optionally moved by index operands: ``gathers`` is ``((j, stride, size), ...)``, operand ``j``'s value
    times ``stride`` added to the position (negative values count from ``size``)."""

    __slots__ = ("tensor", "compute", "strides", "gathers")

    def __init__(self, tensor: kiln.Tensor, compute, strides, gathers=()):
        self.tensor, self.compute, self.strides, self.gathers = (
            tensor,
            np.dtype(compute),
            tuple(strides),
            tuple(gathers),
        )


def launch_pointwise(
    expr: str,
    inputs,
    out: kiln.Tensor,
    float_dtype: str | None = None,
    *,
    shape=None,
    out_strides=None,
    scatter=(),
    accumulate: bool = False,
) -> kiln.Tensor:
    """Write ``expr`` over ``inputs`` — (value, compute dtype) pairs, value a tensor or number, broadcast to
    the launch's shape, or :class:`Read` operands; read as ``x0, x1...`` — into ``out`` at every position of
    ``shape`` (``out``'s shape by default), through ``out_strides`` (``out``'s strides by default) moved by
    the ``scatter`` index terms ``(j, stride, size)``; with ``accumulate`` the write adds atomically.
    Returns ``out``."""
    shape = tuple(out.shape) if shape is None else tuple(shape)
    n = math.prod(shape)
    if n == 0:
        return out
    ops = []
    for item in inputs:
        if isinstance(item, Read):
            t = item.tensor
            ops.append(
                Operand(
                    compute=item.compute,
                    array=t.untyped_storage().array,
                    offset=t.storage_offset(),
                    strides=item.strides,
                    storage_dtype=_np(t.dtype),
                    gathers=item.gathers,
                )
            )
        else:
            ops.append(_operand(item[0], np.dtype(item[1]), shape))
    tensors = [o for o in ops if not o.is_scalar]
    ostr = tuple(out.stride()) if out_strides is None else tuple(out_strides)
    cshape, cstrides = codegen.coalesce(shape, [ostr] + [o.strides for o in tensors])
    for o, st in zip(tensors, cstrides[1:]):
        o.strides = st
    if float_dtype is None:
        float_dtype = "float64" if any(o.compute == np.float64 for o in ops) else "float32"
    kernel = codegen.pointwise_kernel(
        expr, ops, _np(out.dtype), len(cshape), float_dtype, tuple(j for j, _, _ in scatter), accumulate
    )
    args = [n, cshape, out.untyped_storage().array, out.storage_offset(), cstrides[0]]
    for o in ops:
        args += [o.scalar] if o.is_scalar else [o.array, o.offset, o.strides]
        for _, stride, size in o.gathers:
            args += [stride, size]
    for _, stride, size in scatter:
        args += [stride, size]
    codegen.launch(kernel, _driver.blocks(n), _driver.THREADS, _stream_of(out)._raw, args)
    return out


# ---------------------------------------------------------------------------------------------- pointwise

# Unary float functions: the leaf of the same name (kiln_cuda._kernel_env).
_FLOAT_UNARY = (
    "exp", "log", "sqrt", "sin", "cos", "tan", "tanh", "sinh", "cosh", "asin", "acos", "atan", "asinh", "acosh",
    "atanh", "expm1", "log1p", "erf", "erfc", "lgamma",
)  # fmt: skip


def _unary(float_expr: str, int_expr: str | None = None):
    """A kernel for a one-input op: ``float_expr`` for floating results, ``int_expr`` otherwise."""

    def kernel(spec, input):
        compute = _compute(spec.dtype)
        expr = float_expr if spec.dtype.is_floating_point or int_expr is None else int_expr
        return launch_pointwise(expr, [(input, compute)], new_output(spec))

    return kernel


def _comparison(symbol: str):
    def kernel(spec, input, other):
        c = _compute(spec.compute_dtype)
        return launch_pointwise(f"x0 {symbol} x1", [(input, c), (other, c)], new_output(spec))

    return kernel


def _binary(float_expr: str, int_expr: str | None = None, *, zero_check: bool = False):
    """A kernel for a two-input op computed in the result's dtype."""

    def kernel(spec, input, other):
        c = _compute(spec.dtype)
        floating = spec.dtype.is_floating_point
        if zero_check and not floating:
            _check_divisor(other)
        expr = float_expr if floating or int_expr is None else int_expr
        return launch_pointwise(expr, [(input, c), (other, c)], new_output(spec))

    return kernel


def _check_divisor(other) -> None:
    """Integer division by zero raises as on the CPU (``RuntimeError: ZeroDivisionError``)."""
    if isinstance(other, kiln.Tensor):
        zero = bool((other == 0).any().item()) if other.numel() else False
    else:
        zero = other == 0
    if zero:
        raise RuntimeError("ZeroDivisionError")


def add(spec, input, other, alpha=1):
    """``input + alpha * other``."""
    c = _compute(spec.dtype)
    inputs = [(input, c), (other, c)]
    if alpha != 1:
        return launch_pointwise("x0 + x2 * x1", [*inputs, (alpha, c)], new_output(spec))
    return launch_pointwise("x0 + x1", inputs, new_output(spec))


def div(spec, input, other, rounding_mode=None):
    """True division, or rounded toward zero / down (``rounding_mode``), PyTorch's semantics."""
    c = _compute(spec.dtype)
    floating = spec.dtype.is_floating_point
    if not floating:
        _check_divisor(other)
    if rounding_mode is None:
        expr = "x0 / x1"
    elif rounding_mode == "trunc":
        expr = "trunc_(x0 / x1)" if floating else "truncdiv_i(x0, x1)"
    else:
        expr = "floordiv_f(x0, x1)" if floating else "x0 // x1"
    return launch_pointwise(expr, [(input, c), (other, c)], new_output(spec))


def round(spec, input, decimals=0):  # noqa: A001 - the op's name
    """Round half to even, at ``decimals`` decimal places."""
    c = _compute(spec.dtype)
    if not spec.dtype.is_floating_point:
        return launch_pointwise("x0", [(input, c)], new_output(spec))
    scale, neg = (10.0**decimals, False) if decimals >= 0 else (10.0 ** (-decimals), True)
    return launch_pointwise("round_f(x0, x1, x2)", [(input, c), (scale, c), (neg, np.bool_)], new_output(spec))


def where(spec, condition, input, other):
    """``input`` where ``condition`` else ``other``."""
    c = _compute(spec.dtype)
    return launch_pointwise("x1 if x0 else x2", [(condition, np.bool_), (input, c), (other, c)], new_output(spec))


def clamp(spec, input, min=None, max=None):
    """``input`` limited to ``[min, max]`` (NaN in any operand gives NaN)."""
    c = _compute(spec.dtype)
    floating = spec.dtype.is_floating_point
    expr, inputs = "x0", [(input, c)]
    if min is not None:
        inputs.append((min, c))
        expr = f"max_nan({expr}, x{len(inputs) - 1})" if floating else f"({expr} if {expr} > x1 else x1)"
    if max is not None:
        inputs.append((max, c))
        k = len(inputs) - 1
        expr = f"min_nan({expr}, x{k})" if floating else f"(x{k} if ({expr}) > x{k} else ({expr}))"
    return launch_pointwise(expr, inputs, new_output(spec))


def clone(spec, input, memory_format=None):
    """A copy in fresh device memory (contiguous, or as ``spec`` lays it out)."""
    return launch_pointwise("x0", [(input, _compute(input.dtype))], new_output(spec))


def _shift(direction: str):
    def kernel(spec, input, other):
        c = _compute(spec.dtype)
        bits = np.dtype(c).itemsize * 8
        if direction == "left":
            expr = f"(x0 << x1) if (x1 >= 0 and x1 < {bits}) else x0 * 0"
        else:
            expr = f"(x0 >> x1) if (x1 >= 0 and x1 < {bits}) else (x0 * 0 - C0(x0 < 0))"
        return launch_pointwise(expr, [(input, c), (other, c)], new_output(spec))

    return kernel


# ---------------------------------------------------------------------------------------------- copies


def _to_copy(spec, input, dtype, device):
    """A dtype conversion on one GPU runs as a kernel; moves between devices go through the host."""
    if input.device.type == NAME and device.type == NAME and input.device == spec.device:
        return launch_pointwise("x0", [(input, _compute(dtype))], new_output(spec))
    return kb.reference_kernel("_to_copy")(spec, input, dtype, device)


def _copy_from(spec, self, src, non_blocking=False):
    """``self.copy_(src)`` with ``self`` on the GPU: a kernel when ``src`` is on the same GPU."""
    if self.device.type == NAME and src.device.type == NAME and src.device == self.device:
        launch_pointwise("x0", [(src, _compute(self.dtype))], self)
        return self
    return kb.reference_kernel("_copy_from")(spec, self, src, non_blocking)


def _full(spec, size, fill_value, dtype, device):
    """A tensor filled on the GPU (no host buffer)."""
    if spec.device.type != NAME:
        return kb.reference_kernel("_full")(spec, size, fill_value, dtype, device)
    return launch_pointwise("x0", [(fill_value, _compute(dtype))], new_output(spec))


def cat(spec, tensors, dim=0):
    """Each input copied into its slice of the result."""
    out = new_output(spec)
    start = 0
    for t in tensors:
        if t.ndim == 1 and t.shape[0] == 0 and out.ndim != 1:  # legacy empty 1-D inputs are skipped
            continue
        size = t.shape[dim]
        if size:
            launch_pointwise("x0", [(t, _compute(spec.dtype))], out.narrow(dim, start, size))
        start += size
    return out


# ---------------------------------------------------------------------------------------------- reductions


def _reduce(kind: str, spec, input) -> kiln.Tensor:
    out = new_output(spec)
    if not input.ndim:
        dims = set()
    elif isinstance(spec, kb.ReductionSpec):
        dims = set(spec.dims)
    else:  # argmax/argmin: one dim, or all of them (the flat index)
        dims = set(range(input.ndim)) if spec.dim is None else {spec.dim % input.ndim}
    shape, stride = tuple(input.shape), input.stride()
    kshape = tuple(n for d, n in enumerate(shape) if d not in dims)
    kstride = tuple(s for d, s in enumerate(stride) if d not in dims)
    rshape = tuple(n for d, n in enumerate(shape) if d in dims)
    rstride = tuple(s for d, s in enumerate(stride) if d in dims)
    nout, nr = math.prod(kshape), math.prod(rshape)
    if nout == 0:
        return out
    kshape, (kstride,) = codegen.coalesce(kshape, [kstride]) if kshape else ((1,), [(0,)])
    rshape, (rstride,) = codegen.coalesce(rshape, [rstride]) if rshape else ((1,), [(0,)])
    if kind in ("sum", "prod"):
        acc = np.dtype(
            np.float64 if spec.dtype == kiln.float64 else np.float32 if spec.dtype.is_floating_point else np.int64
        )
        if spec.dtype == kiln.bool:
            acc = np.dtype(np.int64)
    else:
        acc = _compute(input.dtype)
    op = Operand(compute=acc, array=input.untyped_storage().array, storage_dtype=_np(input.dtype))
    float_dtype = "float64" if acc == np.float64 else "float32"
    kernel = codegen.reduction_kernel(kind, op, acc, _np(spec.dtype), len(kshape), len(rshape), float_dtype)
    grid = min(nout, _driver.MAX_BLOCKS)
    # the simulator pays milliseconds per barrier and thread: for many outputs it folds each in one thread
    # (the same kernel, its tree skipped); the trees are exercised by reductions to few outputs
    threads = 1 if _driver.SIM and nout > 64 else _driver.THREADS
    args = (nout, nr, kshape, kstride, rshape, rstride, op.array, input.storage_offset(), out.untyped_storage().array)
    codegen.launch(kernel, grid, threads, _stream_of(out)._raw, args)
    return out


def _reduction(kind: str):
    def kernel(spec, input, *args, **kwargs):
        return _reduce(kind, spec, input)

    kernel.__name__ = kind
    return kernel


# ---------------------------------------------------------------------------------------------- matmul


# The simulator runs the tiled matmul for products up to this many multiply-adds, the untiled one above.
_SIM_TILED_LIMIT = 4096


def matmul(spec, input, other):
    """Matrix product with PyTorch's broadcasting and 1-D promotion rules (one tiled kernel)."""
    a, b = input, other
    out = new_output(spec)
    if a.ndim == 1:
        m, k, as0, as1, abatch, abst = 1, a.shape[0], 0, a.stride(0), (), ()
    else:
        m, k = a.shape[-2], a.shape[-1]
        as0, as1 = a.stride(-2), a.stride(-1)
        abatch, abst = tuple(a.shape[:-2]), a.stride()[:-2]
    if b.ndim == 1:
        n, bs0, bs1, bbatch, bbst = 1, b.stride(0), 0, (), ()
    else:
        n = b.shape[-1]
        bs0, bs1 = b.stride(-2), b.stride(-1)
        bbatch, bbst = tuple(b.shape[:-2]), b.stride()[:-2]
    batch = tuple(np.broadcast_shapes(abatch, bbatch))

    def bst(bshape, bstrides):
        lead = len(batch) - len(bshape)
        return tuple(0 if i < lead or bshape[i - lead] == 1 else bstrides[i - lead] for i in range(len(batch)))

    nb = math.prod(batch)
    if m * n * nb == 0:
        return out
    bshape, (abs_, bbs) = (
        codegen.coalesce(batch, [bst(abatch, abst), bst(bbatch, bbst)]) if batch else ((1,), [(0,), (0,)])
    )
    acc = _compute(spec.dtype) if spec.dtype.is_floating_point else np.dtype(np.int64)
    oa = Operand(compute=acc, array=a.untyped_storage().array, storage_dtype=_np(a.dtype))
    ob = Operand(compute=acc, array=b.untyped_storage().array, storage_dtype=_np(b.dtype))
    float_dtype = "float64" if acc == np.float64 else "float32"
    args = (
        m,
        n,
        k,
        nb,
        bshape,
        abs_,
        bbs,
        oa.array,
        a.storage_offset(),
        as0,
        as1,
        ob.array,
        b.storage_offset(),
        bs0,
        bs1,
        out.untyped_storage().array,
    )
    if _driver.SIM and m * n * k * nb > _SIM_TILED_LIMIT:
        kernel = codegen.dot_kernel(oa, ob, acc, _np(spec.dtype), len(bshape), float_dtype)
        codegen.launch(kernel, _driver.blocks(m * n * nb), _driver.THREADS, _stream_of(out)._raw, args)
        return out
    kernel = codegen.matmul_kernel(oa, ob, acc, _np(spec.dtype), len(bshape), float_dtype)
    t = _driver.TILE
    cap = _driver.MAX_BLOCKS
    grid = (min(-(-n // t), cap), min(-(-m // t), cap), min(nb, cap))
    codegen.launch(kernel, grid, (t, t), _stream_of(out)._raw, args)
    return out


# ---------------------------------------------------------------------------------------------- the table

ALL = None  # every dtype the device stores

KERNELS: dict[str, tuple] = {
    "add": (add, ALL),
    "mul": (_binary("x0 * x1"), ALL),
    "div": (div, ALL),
    "floor_divide": (_binary("floordiv_f(x0, x1)", "x0 // x1", zero_check=True), ALL),
    "remainder": (_binary("rem_f(x0, x1)", "x0 % x1", zero_check=True), ALL),
    "fmod": (_binary("fmod_(x0, x1)", "fmod_i(x0, x1)", zero_check=True), ALL),
    "pow": (_binary("pow_(x0, x1)", "pow_i(x0, x1)"), ALL),
    "maximum": (_binary("max_nan(x0, x1)", "x0 if x0 > x1 else x1"), ALL),
    "minimum": (_binary("min_nan(x0, x1)", "x0 if x0 < x1 else x1"), ALL),
    "atan2": (_binary("atan2_(x0, x1)"), FLOATS),
    "copysign": (_binary("copysign_(x0, x1)"), FLOATS),
    "hypot": (_binary("hypot_(x0, x1)"), FLOATS),
    "nextafter": (_binary("nextafter_(x0, x1)"), FLOATS),
    "bitwise_and": (_binary("x0 & x1"), ALL),
    "bitwise_or": (_binary("x0 | x1"), ALL),
    "bitwise_xor": (_binary("x0 ^ x1"), ALL),
    "bitwise_left_shift": (_shift("left"), INTS),
    "bitwise_right_shift": (_shift("right"), INTS),
    "eq": (_comparison("=="), ALL),
    "lt": (_comparison("<"), ALL),
    "le": (_comparison("<="), ALL),
    "gt": (_comparison(">"), ALL),
    "ge": (_comparison(">="), ALL),
    "abs": (_unary("fabs_(x0)", "x0 if x0 >= 0 else -x0"), ALL),
    "neg": (_unary("-x0"), ALL),
    "sign": (_unary("sign_f(x0)", "C0(x0 > 0) - C0(x0 < 0)"), ALL),
    "floor": (_unary("floor_(x0)", "x0"), ALL),
    "ceil": (_unary("ceil_(x0)", "x0"), ALL),
    "trunc": (_unary("trunc_(x0)", "x0"), ALL),
    "round": (round, ALL),
    "reciprocal": (_unary("C0(1) / x0"), FLOATS),
    "isnan": (
        lambda spec, input: launch_pointwise("x0 != x0", [(input, _compute(input.dtype))], new_output(spec)),
        ALL,
    ),
    "logical_not": (
        lambda spec, input: launch_pointwise("x0 == C0(0)", [(input, _compute(input.dtype))], new_output(spec)),
        ALL,
    ),
    "where": (where, ALL),
    "clamp": (clamp, ALL),
    "clone": (clone, ALL),
    "_to_copy": (_to_copy, ALL),
    "_copy_from": (_copy_from, ALL),
    "_full": (_full, ALL),
    "cat": (cat, ALL),
    "sum": (_reduction("sum"), ALL),
    "prod": (_reduction("prod"), ALL),
    "amax": (_reduction("amax"), ALL),
    "amin": (_reduction("amin"), ALL),
    "argmax": (_reduction("argmax"), ALL),
    "argmin": (_reduction("argmin"), ALL),
    "matmul": (matmul, FLOATS + INTS),
}
for _name in _FLOAT_UNARY:
    KERNELS[_name] = (_unary(f"{_name}_(x0)"), FLOATS)
# digamma's recurrence and series lose float32 digits: it computes in float64, as the CPU oracle does
KERNELS["digamma"] = (
    lambda spec, input: launch_pointwise(
        "digamma_f(x0)", [(input, np.float64)], new_output(spec), float_dtype="float64"
    ),
    FLOATS,
)
KERNELS["erfinv"] = (_unary("erfinv_f(x0)"), FLOATS)
