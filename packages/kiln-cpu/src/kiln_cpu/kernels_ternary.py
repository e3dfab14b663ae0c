"""kiln-cpu's ternary elementwise kernels: ``where``, ``addcmul``, ``addcdiv``, ``lerp`` and ``clamp`` (with
``clamp_min`` and ``clamp_max``), broadcasting and any strides, as the binary kernels
(:mod:`kiln_cpu.kernels_elementwise`): one flat loop when the tensor operands share one dense layout (Python numbers
read as one-element arrays at every position), else the strided loop over the shape coalesced to 4-d,
with broadcast dims and numbers at stride 0. The result is laid out as the reference's: NumPy's layout
rule applied step by step as the reference computes (``addcmul``'s ``value * t1``, then ``* t2``, then
``input +``: each intermediate result brings its own layout to the next step, :func:`_layout`).

Each op's arithmetic is the reference's, rounding for rounding, in the compute dtype: float32 for
float16/bfloat16 storage (widened exactly, the result rounded back once, nearest-even), so results are
bit for bit the reference's. A number operand takes the value the reference computes with: rounded to
half precision first where the reference rounds it (``where``'s and ``clamp``'s operands), in float32
where it does not (``lerp``'s weight, the ``value`` of ``addcmul``/``addcdiv``). The reference runs
operands of another dtype than the result (the reference casts them), small outputs
(:data:`kiln_cpu.config.min_numel`) and layouts left with more than 4 dims after merging.
"""

from __future__ import annotations

import numpy as np

from kiln import Tensor
from kiln.backend import compute_dtype as _compute_np
from kiln.backend import from_array, reference_kernel
from kiln_cpu import _opcodes
from kiln_cpu._kernel_support import (
    _GRAIN,
    _INTS,
    FLOAT,
    HALF,
    _flat,
    _run_strided,
    _scalar,
    bits,
    dense_strides,
    half_kind,
    loops,
    min_numel,
    numpy_order,
    parallel,
)

_kernels = loops("_jit_elementwise")


def _own(x, nd: int, widened: bool = False) -> tuple:
    """(shape, strides) of an operand as NumPy sees it in an ``nd``-dim broadcast: a tensor's own dims
    padded in front with size 1, a number all size 1. ``widened``: the reference's float32 copy of the
    tensor instead (``kiln._ops._meta.astype``: row-major where a dim is broadcast, else the dims sorted
    by stride, largest first), dense."""
    if not isinstance(x, Tensor):
        return (1,) * nd, (0,) * nd
    shape, strides = x._shape, x._stride
    if widened:
        order = sorted(range(len(shape)), key=lambda d: -abs(strides[d])) if 0 not in strides else range(len(shape))
        strides = dense_strides(shape, list(order))
    pad = nd - len(shape)
    return (1,) * pad + shape, (0,) * pad + strides


def _step(*values) -> tuple:
    """(shape, strides, dim order) of the new array NumPy makes for an elementwise call on ``values``
    (each ``(shape, strides)``): the broadcast shape, laid out by NumPy's rule over the operands' strides
    (0 where an operand is broadcast), dense."""
    nd = len(values[0][0])
    shape = tuple(max(v[0][d] for v in values) for d in range(nd))
    strides = [tuple(s if v[0][d] == shape[d] else 0 for d, s in enumerate(v[1])) for v in values]
    order = numpy_order(shape, strides)
    return shape, dense_strides(shape, order), order


def _layout(name: str, shape: tuple, args: tuple, widened: bool) -> list:
    """The dim order (outermost first) of the reference's result of op ``name`` on ``args`` (its tensor
    and number operands), following its NumPy calls step by step; ``widened``: the reference first
    copies each tensor operand to float32 (half precision; not ``where``'s condition)."""
    nd = len(shape)
    v = [None if x is None else _own(x, nd, widened and not (name == "where" and i == 0)) for i, x in enumerate(args)]
    if name == "where":
        out = _step(*v)
    elif name in ("addcmul", "addcdiv"):  # input + (value * t1) * t2, input + (value * t1) / t2
        out = _step(v[0], _step(_step(v[1])[:2], v[2])[:2])
    elif name == "lerp":  # where(small, a, b) + where(small, w, w - 1) * (b - a), small = |w| < 0.5
        a, b, w = v[:3]
        small = _step(w)[:2]  # and w - 1 alike
        picked = _step(small, a, b)[:2]
        weight = _step(small, w, small)[:2]
        out = _step(picked, _step(weight, _step(a, b)[:2])[:2])
    else:  # clamp: maximum with the low bound, then minimum with the high one, each where given
        out = v[0]
        for bound in v[1:]:
            if bound is not None:
                out = _step(out[:2], bound)
    return out[2]


def _run_ternary(
    code: int, operands: list, c, shape: tuple, out_np: np.dtype, hout: int, order, into=None
) -> np.ndarray | None:
    """Ternary op ``code`` over ``shape`` (``operands``: tensors, or NumPy scalars in the compute dtype)
    into a new array of ``out_np`` (uint16 bits for a half-precision result, kind ``hout``): in the
    layout every tensor operand shares when they share a dense one, else in dim order ``order()``; or into
    the first operand itself when it is ``into`` (an in-place kernel's ``self``); None: not taken (more
    than 4 dims after merging)."""
    j = _kernels()
    kinds = tuple(half_kind(x._dtype) if isinstance(x, Tensor) else 0 for x in operands)
    tensors = [x for x in operands if isinstance(x, Tensor)]
    lead = tensors[0]
    if all(t._shape == shape and t._stride == lead._stride for t in tensors):
        arrays = [_flat(bits(t._numpy())) for t in tensors]
        if all(a is not None for a in arrays):
            flats = iter(arrays)
            args = [next(flats) if isinstance(x, Tensor) else np.array([x]) for x in operands]
            scalars = tuple(not isinstance(x, Tensor) for x in operands)
            if into is not None:  # lead is into: one array read and written
                parallel(j.ternary(code, "flat_inplace", hout, kinds, scalars), (*args, c), arrays[0].size, _GRAIN)
                return into
            out = np.empty_like(bits(lead._numpy()), dtype=out_np)  # the operands' layout
            fo = _flat(out)
            if fo is not None:
                parallel(j.ternary(code, "flat", hout, kinds, scalars), (*args, fo, c), fo.size, _GRAIN)
                return out
    return _run_strided(
        lambda: j.ternary(code, "strided", hout, kinds),
        shape,
        operands,
        out_np,
        (c,),
        None if into is not None else order(),
        into=into,
    )


def _ternary_kernel(name: str, served: tuple, prepare, steps: str | None = None):
    """A kernel for ternary op ``name``: ``prepare(d, compute, *args) -> (code, operands, c)`` (or None:
    the reference runs) picks the loop's op code, its three operands and its constant for result dtype
    ``d`` computed in NumPy dtype ``compute``; ``steps``: the op whose NumPy calls lay out the result
    (:func:`_layout`; ``name`` by default)."""
    steps = steps or name

    def in_loops(spec, *args, into=None):
        d = spec.dtype
        if d not in served:
            return None
        half = half_kind(d)
        prepared = prepare(d, _compute_np(d), *args)
        if prepared is None:
            return None
        code, operands, c = prepared
        out_np = np.dtype(np.uint16) if half else d.numpy
        out = _run_ternary(
            code, operands, c, spec.shape, out_np, half, lambda: _layout(steps, spec.shape, args, bool(half)), into
        )
        if out is None or into is not None:
            return out
        return from_array(out.view(d.numpy), d)

    # below min_numel elements the reference kernel runs NumPy itself, with no call of these loops between
    kernel = reference_kernel(name, fast=in_loops, min_numel=min_numel)
    kernel.__name__ = f"kiln_cpu_{name}"
    kernel.__doc__ = f"Numba kernel for {name} (kiln-cpu)."
    kernel.in_loops, kernel.floor = in_loops, min_numel  # the in-place kernel's (inplace_kernel)
    return kernel


def _value(x, d, compute: np.dtype):
    """A tensor of dtype ``d`` as it is, a Python number as the reference computes with it (rounded to
    half precision first for a half-precision ``d``: :func:`kiln_cpu._kernel_support._scalar`); None for a tensor
    of another dtype."""
    if isinstance(x, Tensor):
        return x if x._dtype is d else None
    return _scalar(x, compute, d)


def _prepare_where(d, compute, condition, input, other):
    x, y = _value(input, d, compute), _value(other, d, compute)
    if x is None or y is None:
        return None
    return _opcodes.WHERE, [condition, x, y], compute.type(0)


def _prepare_addc(code: int):
    def prepare(d, compute, input, tensor1, tensor2, value=1):
        operands = [input, tensor1, tensor2]
        if any(t._dtype is not d for t in operands):
            return None
        return code, operands, compute.type(value)  # value: not rounded to d

    return prepare


def _prepare_lerp(d, compute, input, end, weight):
    if input._dtype is not d or end._dtype is not d:
        return None
    if isinstance(weight, Tensor):
        if weight._dtype is not d:
            return None
    else:
        weight = compute.type(weight)  # the reference's weight: in the compute dtype, not rounded to d
    return _opcodes.LERP, [input, end, weight], compute.type(0)


def _no_bound(compute: np.dtype, high: bool):
    """What a missing bound is to ``maximum``/``minimum``: every value passes (inf, or the integer range's
    end)."""
    if compute.kind == "f":
        return compute.type(np.inf if high else -np.inf)
    info = np.iinfo(compute)
    return compute.type(info.max if high else info.min)


def _prepare_clamp(d, compute, input, min=None, max=None):
    if input._dtype is not d:
        return None
    bounds = []
    for bound, high in ((min, False), (max, True)):
        b = _no_bound(compute, high) if bound is None else _value(bound, d, compute)
        if b is None:
            return None
        bounds.append(b)
    return _opcodes.CLAMP, [input, *bounds], compute.type(0)


def kernels() -> dict[str, tuple]:
    """The ternary kernels: op name -> (kernel, output dtypes served)."""
    selected = FLOAT + HALF + _INTS
    floats = FLOAT + HALF
    return {
        "where": (_ternary_kernel("where", selected, _prepare_where), selected),
        "addcmul": (_ternary_kernel("addcmul", floats, _prepare_addc(_opcodes.ADDCMUL)), floats),
        "addcdiv": (_ternary_kernel("addcdiv", floats, _prepare_addc(_opcodes.ADDCDIV)), floats),
        "lerp": (_ternary_kernel("lerp", floats, _prepare_lerp), floats),
        "clamp": (_ternary_kernel("clamp", selected, _prepare_clamp), selected),
        "clamp_min": (_ternary_kernel("clamp_min", selected, _prepare_clamp, "clamp"), selected),
        "clamp_max": (
            _ternary_kernel("clamp_max", selected, lambda d, c, x, high: _prepare_clamp(d, c, x, None, high), "clamp"),
            selected,
        ),
    }
