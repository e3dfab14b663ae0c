"""float16 and bfloat16 in the Numba loops: exact widening to float32, nearest-even rounding back (the
CPU's conversion instructions where it has them), and the ``load``/``store`` of a half-precision kind."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload, register_jitable

from kiln_cpu._jit_support import _bits_f32, _const_code, _f32_bits
from kiln_cpu._opcodes import BF16, F16

# ------------------------------------------------------------------------------ float16 and bfloat16
#
# Numba cannot compute in float16 on the CPU: half-precision storages arrive as uint16 views, each value
# is widened to float32 exactly, the op runs in float32 (as the reference computes), and the result is
# rounded back to nearest-even with NumPy's (float16) and ml_dtypes' (bfloat16) NaN conventions. float16
# uses the CPU's conversion instructions where it has them (F16C, AArch64); every other step is integer or
# exact float arithmetic written as selects, so the loops still vectorise. The kinds, F16 and BF16, are
# in kiln_cpu._opcodes.


def _hardware_half() -> bool:
    """Whether the CPU Numba compiles for converts float16 itself (x86's F16C, every AArch64): LLVM then
    turns ``fptrunc``/``fpext`` into one instruction per vector; elsewhere it would call a runtime
    function Numba's JIT does not provide."""
    import platform

    import llvmlite.binding as ll
    from numba.core import config

    machine = platform.machine().lower()
    if machine in ("aarch64", "arm64"):
        return True
    if machine not in ("x86_64", "amd64"):
        return False
    if config.CPU_FEATURES is not None:  # NUMBA_CPU_FEATURES: the features compiled for
        return "+f16c" in str(config.CPU_FEATURES).split(",")
    if config.CPU_NAME is not None:  # NUMBA_CPU_NAME without features: a portable target
        return False
    return bool(ll.get_host_cpu_features().get("f16c", False))


_HW_HALF = _hardware_half()


@intrinsic
def _f32_to_f16_hw(typingctx, f):
    """The float16 bits of a float32, rounded by the CPU (nearest-even; a NaN comes out quiet)."""
    if f != types.float32:
        return None

    def codegen(context, builder, signature, args):
        """``fptrunc`` to half, its bits as an i16."""
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return types.uint16(f), codegen


@intrinsic
def _f16_to_f32_hw(typingctx, h):
    """The float32 of float16 bits, widened by the CPU (exact; a NaN comes out quiet)."""
    if h != types.uint16:
        return None

    def codegen(context, builder, signature, args):
        """The i16 as a half, ``fpext`` to float."""
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(h), codegen


@register_jitable
def _f16_special_bits(x):
    """The float32 bits of the float16 inf or NaN with bits ``x`` (uint32): sign and payload as they are."""
    return (
        ((x & np.uint32(0x8000)) << np.uint32(16)) | np.uint32(0x7F800000) | ((x & np.uint32(0x03FF)) << np.uint32(13))
    )


@register_jitable
def _f16_nan_bits(x):
    """NumPy's float16 bits for the float32 NaN with bits ``x``: its sign and top payload bits, never inf."""
    h = np.uint32(0x7C00) + ((x & np.uint32(0x007FFFFF)) >> np.uint32(13))
    h = np.uint32(0x7C01) if h == np.uint32(0x7C00) else h
    return h | ((x >> np.uint32(16)) & np.uint32(0x8000))


@register_jitable
def f16_to_f32(h):
    """The float32 equal to the float16 with bits ``h`` (NaN payloads kept, subnormals exact): the CPU's
    conversion where it has one, with the payload of a NaN carried over as it is (the CPU sets the quiet
    bit; NumPy keeps a signalling NaN signalling)."""
    if _HW_HALF:
        x = np.uint32(h)
        nan = (x & np.uint32(0x7FFF)) > np.uint32(0x7C00)
        return _bits_f32(_f16_special_bits(x)) if nan else _f16_to_f32_hw(h)
    return f16_to_f32_bits(h)


@register_jitable
def f16_to_f32_bits(h):
    """:func:`f16_to_f32` in integer arithmetic (CPUs without a float16 conversion)."""
    x = np.uint32(h)
    sign = (x & np.uint32(0x8000)) << np.uint32(16)
    e = x & np.uint32(0x7C00)
    m = x & np.uint32(0x03FF)
    normal = ((e + np.uint32(0x1C000)) << np.uint32(13)) | (m << np.uint32(13)) | sign  # exponent 15 -> 127
    # subnormal: m * 2**-24, exact in float32 (m < 2**10)
    sub = _f32_bits(np.float32(m) * np.float32(5.9604644775390625e-08)) | sign
    bits = _f16_special_bits(x) if e == np.uint32(0x7C00) else (sub if e == np.uint32(0) else normal)
    return _bits_f32(bits)


@register_jitable
def f32_to_f16(f):
    """The bits (uint16) of the float32 ``f`` rounded to float16, nearest-even (NumPy's conversion: a NaN
    keeps its sign and top payload bits, and never becomes inf); the CPU's conversion where it has one."""
    if _HW_HALF:  # the CPU's rounding, NumPy's NaN (the CPU would set the quiet bit)
        x = _f32_bits(f)
        return np.uint16(_f16_nan_bits(x)) if (x & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000) else _f32_to_f16_hw(f)
    return f32_to_f16_bits(f)


@register_jitable
def f32_to_f16_bits(f):
    """:func:`f32_to_f16` in integer arithmetic (CPUs without a float16 conversion)."""
    x = _f32_bits(f)
    sign = (x >> np.uint32(16)) & np.uint32(0x8000)
    a = x & np.uint32(0x7FFFFFFF)
    # normal range: rebias the exponent, round the 13 dropped bits to nearest-even, carry into the exponent
    odd = (a >> np.uint32(13)) & np.uint32(1)
    normal = (a - np.uint32(0x38000000) + np.uint32(0x0FFF) + odd) >> np.uint32(13)
    # below 2**-14: adding 0.5 lets the FPU round to float16's subnormal step (2**-24), nearest-even
    small = _f32_bits(_bits_f32(a) + np.float32(0.5)) - np.uint32(0x3F000000)
    h = normal if a >= np.uint32(0x38800000) else small
    h = np.uint32(0x7C00) if a >= np.uint32(0x477FF000) else h  # rounds past 65504: inf
    return np.uint16(_f16_nan_bits(x) if a > np.uint32(0x7F800000) else h | sign)


@register_jitable
def bf16_to_f32(h):
    """The float32 equal to the bfloat16 with bits ``h``."""
    return _bits_f32(np.uint32(h) << np.uint32(16))


@register_jitable
def f32_to_bf16(f):
    """The bits (uint16) of the float32 ``f`` rounded to bfloat16, nearest-even (ml_dtypes' conversion:
    every NaN becomes the quiet NaN of its sign)."""
    x = _f32_bits(f)
    r = (x + np.uint32(0x7FFF) + ((x >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    q = ((x >> np.uint32(16)) & np.uint32(0x8000)) | np.uint32(0x7FC0)
    return np.uint16(q if (x & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000) else r)


def load(half, x):
    """A stored value in its compute dtype: float32 from half-precision bits, else ``x`` (jitted only)."""
    raise NotImplementedError


def store(half, v):
    """A computed value as stored: half-precision bits from a float32, else ``v`` (jitted only)."""
    raise NotImplementedError


@overload(load)
def _load_impl(half, x):
    k = _const_code(half)  # None until Numba retries with the closure constant as a literal
    if k is None:
        return None
    if k == F16:
        return lambda half, x: f16_to_f32(x)
    if k == BF16:
        return lambda half, x: bf16_to_f32(x)
    return lambda half, x: x


@overload(store)
def _store_impl(half, v):
    k = _const_code(half)
    if k is None:
        return None
    if k == F16:
        return lambda half, v: f32_to_f16(v)
    if k == BF16:
        return lambda half, v: f32_to_bf16(v)
    return lambda half, v: v
