"""The elementwise kernels: binary (arithmetic, maximum/minimum, comparisons, relu's backward), unary
(and gelu), dtype conversion (``_to_copy``) and fused dropout, over the loops of
:mod:`kiln_cpu._jit_elementwise`."""

from __future__ import annotations

import math

import numpy as np

import kiln
from kiln import Tensor
from kiln.backend import from_array, reference_kernel
from kiln_cpu import _opcodes, config
from kiln_cpu._kernel_support import (
    _F32,
    _GRAIN,
    _INTS,
    ARITH,
    FLOAT,
    HALF,
    _flat,
    _run_strided,
    _scalar,
    bits,
    cast_flat,
    half_kind,
    loops,
    min_numel,
    parallel,
)

_kernels = loops("_jit_elementwise")

_SLOW_REFERENCE = frozenset({"relu", "_threshold_backward"})
"""Ops whose NumPy reference is slow at every size, so their loops run from
:data:`kiln_cpu.config.multipass_min_numel` elements rather than :data:`kiln_cpu.config.min_numel`:
``relu``'s ``np.maximum`` against a zero runs at a quarter of an add's speed (32K float32: 16 us, the
loop 6 us), ``_threshold_backward``'s reference makes three passes (32K float32: 23 us, the loop 13 us;
8K: 11 against 10 us; 1K: even)."""


def _multipass_floor() -> int:
    """The elements from which the loops of an op in :data:`_SLOW_REFERENCE` run (empty tensors too, when
    :data:`kiln_cpu.config.min_numel` is 0); other ops' start at ``min_numel``."""
    return min(config.min_numel, config.multipass_min_numel)


# ------------------------------------------------------------------------------------------- binary

# scalar-on-the-left forms that are the same op with the operands swapped
_SWAPPED = {}


def _init_swapped(j) -> None:
    _SWAPPED.update(
        {j.ADD: j.ADD, j.MUL: j.MUL, j.EQ: j.EQ, j.NE: j.NE, j.LT: j.GT, j.GT: j.LT, j.LE: j.GE, j.GE: j.LE}
    )


def _run_binary(code: int, a, b, c, shape: tuple, out_np: np.dtype, half: int, into=None) -> np.ndarray | None:
    """``a <op> b`` over ``shape`` (``a``/``b``: tensors of the compute dtype, or of a half-precision dtype
    computed in float32 (``half``), or scalars of the compute dtype) into a new array of ``out_np``
    (uint16 for half-precision results), or into ``a`` itself when it is ``into`` (an in-place kernel's
    ``self``); None: not taken (nothing written)."""
    j = _kernels()
    a_arr = isinstance(a, Tensor)
    b_arr = isinstance(b, Tensor)
    if not _SWAPPED:
        _init_swapped(_opcodes)
    if not a_arr and b_arr and code in _SWAPPED:
        code, a, b, a_arr, b_arr = _SWAPPED[code], b, a, True, False
    if a_arr and a._shape == shape:
        x = bits(a._numpy())
        fa = _flat(x)
        if fa is not None and (not b_arr or (b._shape == shape and b._stride == a._stride)):
            fb = _flat(bits(b._numpy())) if b_arr else b
            layout = "flat" if b_arr else "scalar"
            if into is not None:  # a is into: the in-place loops (one array read and written)
                parallel(j.binary(code, f"{layout}_inplace", half), (fa, fb, c), fa.size, _GRAIN)
                return x
            out = np.empty_like(x, dtype=out_np)
            fo = _flat(out)
            if fo is not None:
                parallel(j.binary(code, layout, half), (fa, fb, fo, c), fo.size, _GRAIN)
                return out
    if half:  # the strided loop reads a scalar operand as stored: half-precision bits, if it has them
        operands = []
        for x in (a, b):
            if not isinstance(x, Tensor):
                with np.errstate(over="ignore"):
                    stored = x.astype(HALF[half - 1].numpy)
                if stored.astype(np.float32) != x and x == x:
                    return None  # a float32 scalar (mul, div) that the storage dtype cannot hold
                x = stored.view(np.uint16)
            operands.append(x)
        a, b = operands
    return _run_strided(lambda: j.binary(code, "strided", half), shape, [a, b], out_np, (c,), into=into)


def _binary_kernel(name: str, served: tuple, pick, *, compare: bool = False):
    """A kernel for binary op ``name``: ``pick(np_dtype, a, b, rest) -> (code, a, b, c)`` chooses the op
    code and may fold scalars; the reference runs whatever the loops do not take, and every call below
    :data:`kiln_cpu.config.min_numel` elements unless ``name`` is in :data:`_SLOW_REFERENCE` (the core's
    reference kernel makes that test: ``reference_kernel(fast=..., min_numel=...)``)."""

    def in_loops(spec, a, b, *rest, into=None):
        d = spec.compute_dtype if compare else spec.dtype
        if d not in served:
            return None
        half = half_kind(d)
        if half and name in ("add", "sub") and rest and rest[0] != 1:  # alpha: the reference's roundings
            return None
        np_dtype = _F32 if half else d.numpy
        for x in (a, b):
            if isinstance(x, Tensor) and x._dtype is not d:
                return None
        picked = pick(np_dtype, a, b, rest)
        if picked is None:
            return None
        code, x, y, c = picked
        rounded = None if name in ("mul", "div") else d  # PyTorch's mul and div keep a scalar in float32
        if not isinstance(x, Tensor):
            x = _scalar(x, np_dtype, rounded)
        if not isinstance(y, Tensor):
            y = _scalar(y, np_dtype, rounded)
        out_np = spec.dtype.numpy
        out = _run_binary(
            code, x, y, c, spec.shape, np.dtype(np.uint16) if half and not compare else out_np, half, into
        )
        if out is None or into is not None:
            return None if out is None else into
        return from_array(out.view(out_np), spec.dtype)

    kernel = reference_kernel(name, fast=in_loops, min_numel=_floor(name))
    kernel.__name__ = f"kiln_cpu_{name}"
    kernel.__doc__ = f"Numba kernel for {name} (kiln-cpu)."
    kernel.in_loops, kernel.floor = in_loops, _floor(name)  # the in-place kernel's (inplace_kernel)
    return kernel


def _floor(name: str):
    """The size test of an elementwise op's loops: :func:`_multipass_floor` for the ops of
    :data:`_SLOW_REFERENCE`, :data:`kiln_cpu.config.min_numel` (read on each call) for the others."""
    return _multipass_floor if name in _SLOW_REFERENCE else min_numel


def _zero(np_dtype):
    return np_dtype.type(0)


def _pick_fixed(code: int):
    def pick(np_dtype, a, b, rest):
        return code, a, b, _zero(np_dtype)

    return pick


def _pick_add_sub(plain: int, with_alpha: int):
    def pick(np_dtype, a, b, rest):
        alpha = rest[0] if rest else 1
        if alpha == 1:
            return plain, a, b, _zero(np_dtype)
        if isinstance(alpha, bool) or (np_dtype.kind in "iu" and not isinstance(alpha, int)):
            return None  # the meta refuses these; the reference raises as it does
        c = _scalar(alpha, np_dtype)
        if not isinstance(b, Tensor):  # the reference rounds b * alpha first: fold it the same way
            return plain, a, np.multiply(_scalar(b, np_dtype), c, dtype=np_dtype), _zero(np_dtype)
        return with_alpha, a, b, c

    return pick


def _pick_div(np_dtype, a, b, rest):
    mode = rest[0] if rest else None
    code = {None: _opcodes.DIV, "floor": _opcodes.FLOOR_DIV, "trunc": _opcodes.TRUNC_DIV}.get(mode)
    return None if code is None else (code, a, b, _zero(np_dtype))


# -------------------------------------------------------------------------------------------- unary


def run_unary(code: int, a: Tensor, d: kiln.dtype, inplace: bool = False) -> Tensor | None:
    """Unary loop ``code`` over tensor ``a`` of dtype ``d`` into a new tensor in ``a``'s layout (dense
    inputs) or NumPy's result order, or into ``a`` itself (``inplace``: then ``a`` is returned); None where
    the loops do not take the layout (the caller runs the reference)."""
    x = a._numpy()
    j = _kernels()
    half = half_kind(d)
    if not half and x.flags.c_contiguous and not inplace:  # the common case, in fewer steps (pow's small tensors)
        out = np.empty_like(x)
        parallel(j.unary(code, "flat", 0), (x.reshape(-1), out.reshape(-1)), x.size, _GRAIN)
        return from_array(out, d)
    x = bits(x)
    fx = _flat(x)
    if fx is not None and inplace:
        parallel(j.unary(code, "flat_inplace", half), (fx,), fx.size, _GRAIN)
        return a
    if fx is not None:
        out = np.empty_like(x)
        fo = _flat(out)
        if fo is not None:
            parallel(j.unary(code, "flat", half), (fx, fo), fo.size, _GRAIN)
            return from_array(out.view(d.numpy), d)
    out = _run_strided(lambda: j.unary(code, "strided", half), a._shape, [a], x.dtype, into=a if inplace else None)
    if out is None or inplace:
        return None if out is None else a
    return from_array(out.view(d.numpy), d)


def run_binary(code: int, a, b, c, shape: tuple, d: kiln.dtype) -> Tensor | None:
    """Binary loop ``code`` of ``a`` and ``b`` (tensors of dtype ``d``, or scalars of its NumPy dtype; not
    half precision) over ``shape`` into a new tensor of ``d``; None: not taken."""
    out = _run_binary(code, a, b, c, shape, d.numpy, 0)
    return None if out is None else from_array(out, d)


def _unary_kernel(name: str, served: tuple, op_code: int | None, params: dict | None = None):
    """A kernel for unary op ``name`` (Numba op code ``op_code``), output dtype = input dtype; an op with
    parameters maps each value it takes to its own code (``params``: (value, ...) -> code). Calls below
    :data:`kiln_cpu.config.min_numel` elements run the reference, unless ``name`` is in
    :data:`_SLOW_REFERENCE`."""

    def in_loops(spec, a, *rest, into=None):
        d = spec.dtype
        code = op_code if not rest else (params or {}).get(rest)
        if d not in served or code is None or a._dtype is not d:
            return None
        return run_unary(code, a, d, inplace=into is not None)

    kernel = reference_kernel(name, fast=in_loops, min_numel=_floor(name))
    kernel.__name__ = f"kiln_cpu_{name}"
    kernel.__doc__ = f"Numba kernel for {name} (kiln-cpu)."
    kernel.in_loops, kernel.floor = in_loops, _floor(name)  # the in-place kernel's (inplace_kernel)
    kernel.exact = op_code not in _opcodes.TRANSCENDENTAL
    return kernel


# --------------------------------------------------------------------------------------- conversion


def _converts(src: kiln.dtype, dst: kiln.dtype) -> bool:
    """The conversions the Numba loop makes exactly as NumPy's ``astype`` does: between float32, float64
    and the integers (and bools: dropout's masks) into floats; into float16/bfloat16 only from float32,
    half precision or bool (one rounding; NumPy rounds float64 and integers to half directly, not through
    float32); into integers only from integers and bools (a float out of an integer's range is undefined
    in C, and NumPy's result is the hardware's)."""
    if dst in HALF:
        return src is kiln.float32 or src in HALF or src is kiln.bool
    if dst in _INTS:
        return src in _INTS or src is kiln.bool
    return dst in FLOAT and (src in FLOAT or src in HALF or src in _INTS or src is kiln.bool)


def _to_copy_kernel():
    reference = reference_kernel("_to_copy")

    def kernel(spec, a, dtype, device):
        if (
            device is not a._device
            or not _converts(a._dtype, dtype)
            or a._dtype is dtype
            or not a._shape
            or math.prod(a._shape) < max(config.min_numel, 1)
        ):
            return reference(spec, a, dtype, device)
        j = _kernels()
        hin, hout = half_kind(a._dtype), half_kind(dtype)
        store_np = np.dtype(np.uint16) if hout else dtype.numpy
        x = bits(a._numpy())
        fx = _flat(x) if 0 not in x.strides else None
        if fx is not None:
            out = np.empty_like(x, dtype=store_np)
            cast_flat(fx, _flat(out), hin, hout)
        else:
            out = _run_strided(lambda: j.cast("strided", hin, hout), a._shape, [a], store_np)
            if out is None:
                return reference(spec, a, dtype, device)
        return from_array(out.view(dtype.numpy), dtype)

    kernel.__name__ = "kiln_cpu__to_copy"
    kernel.__doc__ = "Numba kernel for dtype conversion on the CPU (kiln-cpu)."
    return kernel


# ------------------------------------------------------------------------------------------ dropout


def _fused_dropout_kernel():
    reference = reference_kernel("_fused_dropout")

    def kernel(spec, x, u, p):
        d = spec[0].dtype
        n = math.prod(x._shape)
        if d not in FLOAT + HALF or x._dtype is not d or n < max(config.min_numel, 1):
            return reference(spec, x, u, p)
        xs, us = bits(x._numpy()), u._numpy()
        if not (xs.flags.c_contiguous and us.flags.c_contiguous):  # the reference's result follows layouts
            return reference(spec, x, u, p)
        half = half_kind(d)
        compute = _F32 if half else d.numpy
        out = np.empty(n, xs.dtype)
        noise = np.empty(n, xs.dtype)
        args = (xs.reshape(-1), us.reshape(-1), 1.0 - p, compute.type(1.0 - p), out, noise)
        parallel(_kernels().dropout(half), args, n, _GRAIN)
        shape = x._shape
        return from_array(out.view(d.numpy).reshape(shape), d), from_array(noise.view(d.numpy).reshape(shape), d)

    kernel.__name__ = "kiln_cpu__fused_dropout"
    kernel.__doc__ = "Numba kernel for _fused_dropout: draws compared, scaled and applied in one pass (kiln-cpu)."
    return kernel


def kernels() -> dict[str, tuple]:
    """The elementwise kernels: op name -> (kernel, output dtypes served)."""
    table: dict[str, tuple] = {
        "add": (_binary_kernel("add", ARITH + HALF, _pick_add_sub(_opcodes.ADD, _opcodes.ADD_ALPHA)), ARITH + HALF),
        "sub": (_binary_kernel("sub", ARITH + HALF, _pick_add_sub(_opcodes.SUB, _opcodes.SUB_ALPHA)), ARITH + HALF),
        "mul": (_binary_kernel("mul", ARITH + HALF, _pick_fixed(_opcodes.MUL)), ARITH + HALF),
        "div": (_binary_kernel("div", FLOAT + HALF, _pick_div), FLOAT + HALF),
        "maximum": (_binary_kernel("maximum", FLOAT + HALF, _pick_fixed(_opcodes.MAXIMUM)), FLOAT + HALF),
        "minimum": (_binary_kernel("minimum", FLOAT + HALF, _pick_fixed(_opcodes.MINIMUM)), FLOAT + HALF),
    }
    for name, code in _opcodes.COMPARISONS.items():
        # narrowed by output dtype, which is bool: the kernel itself sends other compute dtypes back
        table[name] = (_binary_kernel(name, FLOAT + HALF, _pick_fixed(code), compare=True), (kiln.bool,))
    for name, code in _opcodes.UNARY_ARITHMETIC.items():
        table[name] = (_unary_kernel(name, ARITH + HALF, code), ARITH + HALF)
    for name, code in _opcodes.UNARY_FLOATING.items():
        table[name] = (_unary_kernel(name, FLOAT + HALF, code), FLOAT + HALF)
    table["_threshold_backward"] = (
        _binary_kernel("_threshold_backward", FLOAT + HALF, _pick_fixed(_opcodes.RELU_GRAD)),
        FLOAT + HALF,
    )
    gelu = {("none",): _opcodes.GELU, ("tanh",): _opcodes.GELU_TANH}
    table["gelu"] = (_unary_kernel("gelu", FLOAT + HALF, _opcodes.GELU, gelu), FLOAT + HALF)
    table["_to_copy"] = (_to_copy_kernel(), FLOAT + HALF + _INTS)
    table["_fused_dropout"] = (_fused_dropout_kernel(), FLOAT + HALF)
    return table
