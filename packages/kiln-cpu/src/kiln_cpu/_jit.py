"""The Numba kernels: elementwise (binary, unary) and reductions, compiled lazily and cached to disk.

Importing this module compiles nothing. Each op is one small dispatcher per memory layout, built by a
factory from an integer op code; the code is a closure constant, so Numba specialises the scalar
function at typing time (no branch in the loop, the loop vectorises) and caches each (op, layout,
dtype) specialisation under its own key (the cache key hashes closure contents).

The jitted code of each area lives in its own ``_jit_<area>.py`` next to its ``kernels_<area>.py``;
this file holds the elementwise and reduction loops and the scalar functions every area shares. Numba
invalidates a cached kernel by the timestamp of the file that defines it, not of the files whose jitted
helpers it inlines: an installed release rewrites every file, and nox keys its cache folder by a digest
of all of kiln-cpu's sources, so an edit here never leaves stale machine code behind.

Semantics follow the reference kernels (NumPy, PyTorch's rules): results are computed in the result
dtype, integers wrap, float division by zero gives inf/NaN (``error_model="numpy"``), maximum/minimum
propagate NaN and return the second operand on ties. float32 exp/log/tanh/sigmoid/erf are computed in
float64 with vectorisable polynomials and rounded once to float32 (at most 1 ulp from the exact value).
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload, register_jitable

_SERIAL = {"cache": True, "nogil": True, "error_model": "numpy"}
_UNCOUNTED = {**_SERIAL, "_nrt": False}
"""The flags of a helper that a loop calls once per row or run, passing it arrays: its own compiled
function, without Numba's reference counting. A compiled function counts a reference to each array it
is passed on entry and drops it on return, one atomic operation each, and LLVM's pruning removes the
pair only in simple functions: a 16-element row's pairwise sum cost 50 ns a call, 6 ns without. Such a
helper allocates nothing (without reference counting it cannot) and only reads and writes the arrays
its caller holds."""

# ------------------------------------------------------------------------------------------ op codes

ADD, SUB, MUL, DIV, FLOOR_DIV, TRUNC_DIV, MAXIMUM, MINIMUM = range(8)
EQ, NE, LT, LE, GT, GE = range(8, 14)
ADD_ALPHA, SUB_ALPHA = 14, 15  # x + y * c, x - y * c (the product rounded first, as the reference)
RELU_GRAD = 16  # x where y > 0, else 0: relu's backward (``_threshold_backward(grad, output)``)

NEG, ABS, RELU, EXP, LOG, SQRT, SIN, COS, TANH, SIGMOID, ERF, GELU, GELU_TANH = range(13)
_HEAVY_UNARY = frozenset((EXP, LOG, SIN, COS, TANH, SIGMOID, ERF, GELU, GELU_TANH))
CAST = 13  # the value itself: with another output dtype, a conversion

# ternary op codes (their own numbering): where(c, x, y); x + value*y*z; x + value*y/z; lerp(x, y, weight z);
# clamp(x, low y, high z)
WHERE, ADDCMUL, ADDCDIV, LERP, CLAMP = range(5)

SUM, AMAX, AMIN = range(3)

# ------------------------------------------------------------------------------------------ bit casts


def _bitcast_to(dst):
    """An intrinsic that reads the IEEE bits of its argument as a ``dst`` (a float of the same width, or
    an integer at least as wide, whose low bits are taken: Numba widens uint32 arithmetic to 64 bits)."""
    width = dst.bitwidth

    @intrinsic
    def bitcast(typingctx, x):
        if not isinstance(x, (types.Integer, types.Float)) or x.bitwidth < width:
            return None
        if isinstance(x, types.Float) and x.bitwidth != width:
            return None

        def codegen(context, builder, signature, args):
            value = args[0]
            if x.bitwidth > width:
                value = builder.trunc(value, ir.IntType(width))
            return builder.bitcast(value, context.get_value_type(dst))

        return dst(x), codegen

    return bitcast


_f64_bits = _bitcast_to(types.int64)  # the bits of a float64
_bits_f64 = _bitcast_to(types.float64)  # the float64 of 64 bits
_f32_bits = _bitcast_to(types.uint32)  # the bits of a float32
_bits_f32 = _bitcast_to(types.float32)  # the float32 of the low 32 bits


@intrinsic
def maxnum(typingctx, x, y):
    """LLVM's ``maxnum`` of two floats of one type: the larger, the other operand where one is NaN, either
    where they compare equal (+0 and -0). A fold with it vectorises into ``vmaxps`` with LLVM's own NaN
    check (a row max of 1024 float32 in 80 ns, against 250 ns for the NaN-propagating select that
    ``binop(MAXIMUM)`` folds). It skips NaN: a caller whose result must be NaN where the data holds one
    gets it some other way (softmax's rows: the NaN's exp makes the sum NaN)."""
    if not isinstance(x, types.Float) or x != y:
        return None

    def codegen(context, builder, signature, args):
        """A call to ``llvm.maxnum.f32``/``.f64``."""
        ty = args[0].type
        name = "llvm.maxnum.f32" if ty == ir.FloatType() else "llvm.maxnum.f64"
        fn = builder.module.declare_intrinsic(name, fnty=ir.FunctionType(ty, [ty, ty]))
        return builder.call(fn, args)

    return x(x, y), codegen


@intrinsic
def _prefetch(typingctx, a, i):
    """A hint to load the cache line of ``a[i]`` (a 1-d array) into the L1 cache (``llvm.prefetch``): no
    fault, no bounds check, no effect on results."""
    if not isinstance(a, types.Array) or a.ndim != 1 or not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        """``llvm.prefetch(ptr, read, locality 3, data)`` at the element's address."""
        aty = signature.args[0]
        ary = context.make_array(aty)(context, builder, args[0])
        index = context.cast(builder, args[1], signature.args[1], types.intp)
        ptr = cgutils.get_item_pointer(context, builder, aty, ary, [index], wraparound=False)
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = builder.module.declare_intrinsic("llvm.prefetch.p0", fnty=fnty)
        builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.none(a, i), codegen


STREAM_BLOCK = 4096
"""Bytes per block of a streaming loop that computes much per element (:func:`prefetch_next`)."""


@register_jitable
def prefetch_next(a, stop, end):
    """Prefetch the block after ``a[...:stop]``: the elements [stop, min(end, stop + block)), one hint per
    64-byte line. A loop that spends many cycles per element (exp, tanh, erf) streams memory far below
    the bandwidth, and the hardware prefetchers left it waiting: exp of 16M float32 on one core took
    16.4 ms in one flat loop and 12.0 ms in blocks of :data:`STREAM_BLOCK` bytes, each prefetching the
    next (7.0 ms for a negation, whose loop is bound by the memory)."""
    step = 64 // a.itemsize
    for q in range(stop, min(end, stop + STREAM_BLOCK // a.itemsize), step):
        _prefetch(a, q)


# ------------------------------------------------------------------------------ float16 and bfloat16
#
# Numba cannot compute in float16 on the CPU: half-precision storages arrive as uint16 views, each value
# is widened to float32 exactly, the op runs in float32 (as the reference computes), and the result is
# rounded back to nearest-even with NumPy's (float16) and ml_dtypes' (bfloat16) NaN conventions. float16
# uses the CPU's conversion instructions where it has them (F16C, AArch64); every other step is integer or
# exact float arithmetic written as selects, so the loops still vectorise.

F16, BF16 = 1, 2  # half-precision kinds (0: the storage dtype is the compute dtype)


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


# ------------------------------------------------------------------------- float64 cores for float32

_SQRT_HALF = math.sqrt(0.5)
_GELU_K = math.sqrt(2.0 / math.pi)
_GELU_C = 0.044715
_LN2_HI = 6.93147180369123816490e-01  # low bits zero: n * _LN2_HI is exact for |n| < 2**11
_LN2_LO = 1.90821492927058770002e-10
_LN2 = 0.6931471805599453
_ROUND_SHIFT = 6755399441055744.0  # 1.5 * 2**52: adding it rounds a float64 below 2**51 to an integer
_LOG2E = 1.4426950408889634


@register_jitable(inline="always")  # inlined in Numba's IR, as erf's: LLVM leaves calls to large functions
def _exp_d(x):
    """exp of a float64 to 2e-10 relative error (ample for float32 results): 2**n * e**f, |f| <= ln2/2,
    degree-8 Taylor in f.
    ``x`` is clamped to [-708, 709] so 2**n stays normal; callers handle NaN."""
    x = min(max(x, -708.0), 709.0)
    # n = x/ln2 rounded to an integer by adding 1.5 * 2**52 (it lands in the low mantissa bits): no
    # float-to-integer conversion, which has no vector instruction below AVX-512 and kept LLVM from
    # vectorising this loop at all
    kd = x * _LOG2E + _ROUND_SHIFT
    n = kd - _ROUND_SHIFT
    f = (x - n * _LN2_HI) - n * _LN2_LO
    # Estrin's scheme: a dependency chain half as long as Horner's, so vector iterations overlap
    f2 = f * f
    f4 = f2 * f2
    q03 = (1.0 + f) + f2 * (0.5 + f * (1.0 / 6.0))
    q47 = (1.0 / 24.0 + f * (1.0 / 120.0)) + f2 * (1.0 / 720.0 + f * (1.0 / 5040.0))
    p = q03 + f4 * (q47 + f4 * (1.0 / 40320.0))
    # the exponent field: the low 12 bits of (n + 1023) after the shift drop the shift constant's bits
    return p * _bits_f64((_f64_bits(kd) + 1023) << 52)


@register_jitable
def _log_d(x):
    """log of a positive normal float64 (relative error ~1e-15): e*ln2 + 2*atanh((m-1)/(m+1)),
    m in [sqrt(2)/2, sqrt(2)]."""
    bits = _f64_bits(x)
    e = (bits >> 52) - 1023
    m = _bits_f64((bits & 0x000FFFFFFFFFFFFF) | 0x3FF0000000000000)
    big = m > 1.4142135623730951
    m = m * 0.5 if big else m
    e = e + 1 if big else e
    s = (m - 1.0) / (m + 1.0)
    z = s * s
    z2 = z * z
    z4 = z2 * z2
    q03 = (2.0 + z * (2.0 / 3.0)) + z2 * (2.0 / 5.0 + z * (2.0 / 7.0))  # Estrin, as in _exp_d
    q47 = (2.0 / 9.0 + z * (2.0 / 11.0)) + z2 * (2.0 / 13.0 + z * (2.0 / 15.0))
    p = q03 + z4 * q47
    return np.float64(e) * _LN2 + s * p


@register_jitable
def exp_f32(x):
    """exp of a float32, rounded once from float64 (inf, 0 and NaN where IEEE says)."""
    r = np.float32(_exp_d(np.float64(x)))
    return x if x != x else r


@register_jitable
def log_f32(x):
    """log of a float32 (denormals included), rounded once from float64."""
    xd = np.float64(x)
    r = np.float32(_log_d(xd))
    r = np.float32(-np.inf) if x == 0 else r
    r = np.float32(np.inf) if x == np.inf else r
    r = np.float32(np.nan) if x < 0 else r
    return x if x != x else r


@register_jitable
def _expf_reduced(xc):
    """(y, n) with e**xc = y * 2**n, in float32 arithmetic (eight lanes per AVX instruction where the
    float64 path has four): Cody-Waite reduction by n*ln2 with float32 constants, r in [-ln2/2, ln2/2],
    and the degree-5 polynomial of Cephes' expf (coefficients from its published source), relative error
    ~1.5e-7 (about 1 ulp)."""
    n = np.floor(xc * np.float32(1.44269504) + np.float32(0.5))
    r = (xc - n * np.float32(0.693359375)) - n * np.float32(-2.12194440e-4)
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    return p * (r * r) + r + np.float32(1.0), n


@register_jitable
def expf_core(x):
    """e**x of a float32 in float32 arithmetic (:func:`_expf_reduced`); 2**n applied in two steps so that
    underflow to subnormals and 0 and overflow to inf happen where IEEE says. NaN in: the caller decides
    (this returns a number)."""
    y, n = _expf_reduced(min(max(x, np.float32(-104.0)), np.float32(89.0)))
    k = np.int32(n)
    k1 = k >> np.int32(1)
    s1 = _bits_f32(np.uint32((k1 + np.int32(127)) << np.int32(23)))
    s2 = _bits_f32(np.uint32((k - k1 + np.int32(127)) << np.int32(23)))
    return (y * s1) * s2


@register_jitable
def _expf_normal(x):
    """e**x of a float32 ``x`` in [-87, 88], where 2**n is one normal float: one scaling, five fewer
    instructions than :func:`expf_core`'s two."""
    y, n = _expf_reduced(x)
    return y * _bits_f32(np.uint32((np.int32(n) + np.int32(127)) << np.int32(23)))


@register_jitable
def expf_nonpositive(x):
    """e**x of a float32 ``x <= 0`` (softmax's ``x - max``): :func:`expf_core`'s value down to
    e**-87 = 1.6e-38, and 0 below (where the exact value is subnormal or a few normals from it: a
    softmax that small is 0 within 1e-37). NaN in: the caller decides."""
    v = _expf_normal(max(x, np.float32(-87.0)))
    return np.float32(0.0) if x < np.float32(-87.0) else v


@register_jitable
def tanh_f32(x):
    """tanh of a float32 in float32 arithmetic: below |x| = 0.625 the odd polynomial of Cephes' tanhf,
    above 1 - 2/(e**(2|x|) + 1) with :func:`_expf_normal` (2|x| at most 18.2), sign restored; within 1 ulp
    of the correctly rounded value over the float32 range (tests/test_f32math.py)."""
    a = abs(x)
    z = x * x
    p = np.float32(-5.70498872745e-3)
    p = p * z + np.float32(2.06390887954e-2)
    p = p * z - np.float32(5.37397155531e-2)
    p = p * z + np.float32(1.33314422036e-1)
    p = p * z - np.float32(3.33332819422e-1)
    small = x if z == 0 else (p * z) * x + x  # +-0 (and denormals whose square is 0) as they are
    e = _expf_normal(np.float32(2.0) * min(a, np.float32(9.1)))  # from |x| = 9.02 on, tanh rounds to 1
    big = np.float32(1.0) - np.float32(2.0) / (e + np.float32(1.0))
    big = -big if x < 0 else big  # a select: math.copysign would be a libm call, which does not vectorise
    r = small if a < np.float32(0.625) else big
    return x if x != x else r


@register_jitable
def sigmoid_f32(x):
    """1/(1+exp(-x)) of a float32 in float64, rounded once."""
    r = np.float32(1.0 / (1.0 + _exp_d(-np.float64(x))))
    return x if x != x else r


# Cephes ndtr.c (as the reference's erf): erf = x T(x^2)/U(x^2) for |x| < 1, 1 - exp(-x^2) P(|x|)/Q(|x|)
# above (Q and U monic); beyond |x| = 6 erf rounds to 1 even in float64.
@register_jitable(inline="always")
def _erf_d(x):
    a = abs(x)
    z = x * x
    t = 9.60497373987051638749e0
    t = t * z + 9.00260197203842689217e1
    t = t * z + 2.23200534594684319226e3
    t = t * z + 7.00332514112805075473e3
    t = t * z + 5.55923013010394962768e4
    u = z + 3.35617141647503099647e1
    u = u * z + 5.21357949780152679795e2
    u = u * z + 4.59432382970980127987e3
    u = u * z + 2.26290000613890934246e4
    u = u * z + 4.92673942608635921086e4
    b = min(a, 6.0)
    p = 2.46196981473530512524e-10
    p = p * b + 5.64189564831068821977e-1
    p = p * b + 7.46321056442269912687e0
    p = p * b + 4.86371970985681366614e1
    p = p * b + 1.96520832956077098242e2
    p = p * b + 5.26445194995477358631e2
    p = p * b + 9.34528527171957607540e2
    p = p * b + 1.02755188689515710272e3
    p = p * b + 5.57535335369399327526e2
    q = b + 1.32281951154744992508e1
    q = q * b + 8.67072140885989742329e1
    q = q * b + 3.54937778887819891062e2
    q = q * b + 9.75708501743205489753e2
    q = q * b + 1.82390916687909736289e3
    q = q * b + 2.24633760818710981792e3
    q = q * b + 1.65666309194161350182e3
    q = q * b + 5.57535340817727675546e2
    # one division for both branches (selects, then a vector divide: the divides dominated the cost)
    centre = a < 1.0
    e = _exp_d(-(b * b))  # computed for every lane: a call on one side of a select would be a branch
    r = (x * t if centre else e * p) / (u if centre else q)
    tail = 1.0 - r
    tail = -tail if x < 0.0 else tail
    return r if centre else tail


@register_jitable(inline="always")
def erf_f32(x):
    """erf of a float32: Cephes' rational approximations in float64, rounded once."""
    r = np.float32(_erf_d(np.float64(x)))
    return x if x != x else r


# ------------------------------------------------------------------------------------ scalar functions


def binop(code, x, y, c):
    """``x <op> y`` for the op ``code`` (``c``: alpha), in the operands' dtype (jitted only)."""
    raise NotImplementedError


def unop(code, x):
    """``op(x)`` for the op ``code``, in ``x``'s dtype (jitted only)."""
    raise NotImplementedError


def zero_of(a):
    """The zero of array ``a``'s dtype (jitted only)."""
    raise NotImplementedError


@overload(zero_of)
def _zero_of_impl(a):
    zero = np.dtype(str(a.dtype)).type(0)
    return lambda a: zero


def _const_code(code):
    value = getattr(code, "literal_value", None)
    return value if isinstance(value, int) else None


@overload(binop)
def _binop_impl(code, x, y, c):
    k = _const_code(code)
    if k is None:
        return None
    if k == ADD:
        return lambda code, x, y, c: x + y
    if k == SUB:
        return lambda code, x, y, c: x - y
    if k == MUL:
        return lambda code, x, y, c: x * y
    if k == DIV:
        return lambda code, x, y, c: x / y
    if k == ADD_ALPHA:
        return lambda code, x, y, c: x + y * c
    if k == SUB_ALPHA:
        return lambda code, x, y, c: x - y * c
    if k == MAXIMUM:  # selects, no branches: the loops stay vectorisable
        return lambda code, x, y, c: x if x != x else (x if x > y else y)
    if k == MINIMUM:
        return lambda code, x, y, c: x if x != x else (x if x < y else y)
    if k == EQ:
        return lambda code, x, y, c: x == y
    if k == NE:
        return lambda code, x, y, c: x != y
    if k == LT:
        return lambda code, x, y, c: x < y
    if k == LE:
        return lambda code, x, y, c: x <= y
    if k == GT:
        return lambda code, x, y, c: x > y
    if k == GE:
        return lambda code, x, y, c: x >= y
    if k == RELU_GRAD:
        zero = np.dtype(str(x)).type(0)
        return lambda code, x, y, c: x if y > zero else zero
    if k == TRUNC_DIV:
        return lambda code, x, y, c: np.trunc(x / y)
    if k == FLOOR_DIV:
        one = np.dtype(str(x)).type(1)
        zero = np.dtype(str(x)).type(0)
        half = np.dtype(str(x)).type(0.5)

        def floor_div(code, x, y, c):  # NumPy's npy_floor_divide (Python's divmod rule), as the reference
            if y == zero:
                return x / y
            mod = np.fmod(x, y)
            div = (x - mod) / y
            if mod != zero and (y < zero) != (mod < zero):
                div = div - one
            if div != zero:
                fl = np.floor(div)
                if div - fl > half:
                    fl = fl + one
                return fl
            return np.copysign(zero, x / y)

        return floor_div
    raise ValueError(f"unknown binary op code {k}")


@overload(unop, inline="always")  # in Numba's IR: LLVM left a call to the larger ones (erf, gelu) in the
def _unop_impl(code, x):  # loop, which kept it scalar (2.5x slower)
    k = _const_code(code)
    if k is None:
        return None
    f32 = x == types.float32
    zero = np.dtype(str(x)).type(0)
    if k == CAST:
        return lambda code, x: x
    if k == NEG:
        return lambda code, x: -x
    if k == ABS:
        return lambda code, x: abs(x)
    if k == RELU:
        return lambda code, x: x if (x != x or x > zero) else zero
    if k == SQRT:
        return lambda code, x: np.sqrt(x)
    if k == EXP:
        return (lambda code, x: exp_f32(x)) if f32 else (lambda code, x: math.exp(x))
    if k == LOG:
        return (lambda code, x: log_f32(x)) if f32 else (lambda code, x: np.log(x))
    if k == TANH:
        return (lambda code, x: tanh_f32(x)) if f32 else (lambda code, x: math.tanh(x))
    if k == SIGMOID:
        return (lambda code, x: sigmoid_f32(x)) if f32 else (lambda code, x: 1.0 / (1.0 + math.exp(-x)))
    if k == ERF:
        return (lambda code, x: erf_f32(x)) if f32 else (lambda code, x: math.erf(x))
    if k == GELU:  # x/2 (1 + erf(x/sqrt(2))) in float64, as the reference (float32: rounded once)
        if f32:
            return lambda code, x: np.float32((np.float64(x) * 0.5) * (1.0 + _erf_d(np.float64(x) * _SQRT_HALF)))
        return lambda code, x: (x * 0.5) * (1.0 + math.erf(x * _SQRT_HALF))  # _erf_d's exp is float32-grade
    if k == GELU_TANH:  # x/2 (1 + tanh(k (x + c x^3))), each step rounded in x's dtype as the reference
        t = np.dtype(str(x)).type
        gk, gc, half, one = t(_GELU_K), t(_GELU_C), t(0.5), t(1.0)
        th = tanh_f32 if f32 else math.tanh
        return lambda code, x: (half * x) * (one + th(gk * (x + ((gc * x) * x) * x)))
    if k == SIN:
        return (lambda code, x: np.float32(math.sin(np.float64(x)))) if f32 else (lambda code, x: math.sin(x))
    if k == COS:
        return (lambda code, x: np.float32(math.cos(np.float64(x)))) if f32 else (lambda code, x: math.cos(x))
    raise ValueError(f"unknown unary op code {k}")


# ------------------------------------------------------------------------------- elementwise kernels
#
# Every loop is serial and takes a [lo, hi) range of its work: kiln_cpu.kernels splits the work over
# a thread pool (nogil). Numba's parallel=True lowering measured 2.5x slower per thread here (its
# gufunc body loses vectorisation) and compiles slower. Computed indices are cast to uint64 before
# indexing: Numba wraps negative signed indices, and that per-element select blocks vectorisation.

_BLOCK = 4096  # elements of the innermost dim per task in the strided loops


@register_jitable
def _task(t, nb, n1, n2):
    """(i, j, k, block) of task ``t`` of the strided loops: shape[0] x n1 x n2 x ``nb`` blocks."""
    blk = t % nb
    q = t // nb
    k = q % n2
    q = q // n2
    return q // n1, q % n1, k, blk


@register_jitable
def _u(i):
    return np.uint64(i)


@register_jitable
def _start(offset, strides, i, j, k):
    """The position of element (i, j, k, 0) of a strided loop's operand: its offset plus the strides of
    its three outer dims (of four)."""
    return offset + i * strides[0] + j * strides[1] + k * strides[2]


def _make_binary(code, half):
    out_half = 0 if EQ <= code <= GE else half  # comparisons store bools

    def flat(a, b, out, c, lo, hi):
        """Both operands dense with the same layout: one flat loop over [lo, hi)."""
        av = a[lo:hi]
        bv = b[lo:hi]
        ov = out[lo:hi]
        for i in range(hi - lo):
            ov[i] = store(out_half, binop(code, load(half, av[i]), load(half, bv[i]), c))

    def flat_scalar(a, s, out, c, lo, hi):
        """A dense array and a scalar (in the compute dtype) on the right."""
        av = a[lo:hi]
        ov = out[lo:hi]
        for i in range(hi - lo):
            ov[i] = store(out_half, binop(code, load(half, av[i]), s, c))

    def strided(a, ao, ast, b, bo, bst, out, ost, shape, c, lo, hi):
        """Any strides (in elements; broadcast dims have stride 0) over 1-d storages with offsets,
        shapes coalesced to 4-d; ``out`` is a fresh dense buffer, ``ost`` its strides. Tasks [lo, hi)
        of shape[0]*n1*n2*ceil(n3/_BLOCK)."""
        _, n1, n2, n3 = shape
        nb = (n3 + _BLOCK - 1) // _BLOCK
        sa = ast[3]
        sb = bst[3]
        so = ost[3]
        for t in range(lo, hi):
            i, j, k, blk = _task(t, nb, n1, n2)
            pa = _start(ao, ast, i, j, k)
            pb = _start(bo, bst, i, j, k)
            po = _start(0, ost, i, j, k)
            for m in range(blk * _BLOCK, min(blk * _BLOCK + _BLOCK, n3)):
                x = load(half, a[_u(pa + m * sa)])
                y = load(half, b[_u(pb + m * sb)])
                out[_u(po + m * so)] = store(out_half, binop(code, x, y, c))

    return {
        "flat": njit(**_SERIAL)(flat),
        "scalar": njit(**_SERIAL)(flat_scalar),
        "strided": njit(**_SERIAL)(strided),
    }


def _make_unary(code, hin, hout):
    # contract: the float64 polynomials of the float32 transcendentals may use FMA (more accurate,
    # faster); no unary op rounds a product before an addition that the reference keeps separate
    opts = {**_SERIAL, "fastmath": {"contract"}}

    # blocks with prefetching for the transcendentals; one flat loop for the rest, bound by the memory
    heavy = code in _HEAVY_UNARY

    def flat(a, out, lo, hi):
        """A dense operand: flat loops over [lo, hi), in blocks of :data:`STREAM_BLOCK` bytes that prefetch
        the next where the op is a transcendental (:func:`prefetch_next`)."""
        block = STREAM_BLOCK // a.itemsize if heavy else 1 << 62
        for b in range(lo, hi, block):
            e = min(hi, b + block)
            prefetch_next(a, e, hi)
            av = a[b:e]
            ov = out[b:e]
            for i in range(e - b):
                ov[i] = store(hout, cast_value(hout, out, unop(code, load(hin, av[i]))))

    def strided(a, ao, ast, out, ost, shape, lo, hi):
        """Any strides (in elements) over a 1-d storage with an offset, shapes coalesced to 4-d; ``out``
        a fresh dense buffer with strides ``ost``."""
        _, n1, n2, n3 = shape
        nb = (n3 + _BLOCK - 1) // _BLOCK
        sa = ast[3]
        so = ost[3]
        for t in range(lo, hi):
            i, j, k, blk = _task(t, nb, n1, n2)
            pa = _start(ao, ast, i, j, k)
            po = _start(0, ost, i, j, k)
            for m in range(blk * _BLOCK, min(blk * _BLOCK + _BLOCK, n3)):
                x = load(hin, a[_u(pa + m * sa)])
                out[_u(po + m * so)] = store(hout, cast_value(hout, out, unop(code, x)))

    return {"flat": njit(**opts)(flat), "strided": njit(**opts)(strided)}


def ternop(code, x, y, z, c):
    """The ternary op ``code`` of ``x``, ``y``, ``z`` (``c``: addcmul's and addcdiv's value), in their
    dtype, as the reference rounds it step by step (jitted only)."""
    raise NotImplementedError


@overload(ternop)
def _ternop_impl(code, x, y, z, c):
    k = _const_code(code)
    if k is None:
        return None
    if k == WHERE:
        return lambda code, x, y, z, c: y if x else z
    if k == ADDCMUL:  # input + value * tensor1 * tensor2: the products in that order, then the sum
        return lambda code, x, y, z, c: x + (c * y) * z
    if k == ADDCDIV:
        return lambda code, x, y, z, c: x + (c * y) / z
    if k == LERP:
        half = np.dtype(str(x)).type(0.5)
        one = np.dtype(str(x)).type(1)

        def lerp(code, x, y, z, c):  # PyTorch's two-sided form: exact at both ends
            small = abs(z) < half
            return (x if small else y) + (z if small else z - one) * (y - x)

        return lerp
    if k == CLAMP:  # maximum with the low bound, then minimum with the high one: NaN anywhere is NaN
        return lambda code, x, y, z, c: binop(MINIMUM, binop(MAXIMUM, x, y, c), z, c)
    raise ValueError(f"unknown ternary op code {k}")


def _make_ternary(code, hout, kinds, scalars):
    """The loops of ternary op ``code``: ``kinds`` the half-precision kind each operand is stored in (0: as
    computed), ``scalars`` which operands are one-element arrays read at every position (a flat loop
    keeps its vector form for the others); ``hout`` the result's kind."""
    k0, k1, k2 = kinds
    s0, s1, s2 = scalars

    def flat(a, b, e, out, c, lo, hi):
        """Operands dense in one layout (or scalars): one flat loop over [lo, hi)."""
        av = a if s0 else a[lo:hi]
        bv = b if s1 else b[lo:hi]
        ev = e if s2 else e[lo:hi]
        ov = out[lo:hi]
        for i in range(hi - lo):
            x = load(k0, av[0] if s0 else av[i])
            y = load(k1, bv[0] if s1 else bv[i])
            z = load(k2, ev[0] if s2 else ev[i])
            ov[i] = store(hout, cast_value(hout, out, ternop(code, x, y, z, c)))

    def strided(a, ao, ast, b, bo, bst, e, eo, est, out, ost, shape, c, lo, hi):
        """Any strides, as the binary strided loop (:func:`_make_binary`), over three operands."""
        _, n1, n2, n3 = shape
        nb = (n3 + _BLOCK - 1) // _BLOCK
        sa, sb, se, so = ast[3], bst[3], est[3], ost[3]
        for t in range(lo, hi):
            i, j, k, blk = _task(t, nb, n1, n2)
            pa = _start(ao, ast, i, j, k)
            pb = _start(bo, bst, i, j, k)
            pe = _start(eo, est, i, j, k)
            po = _start(0, ost, i, j, k)
            for m in range(blk * _BLOCK, min(blk * _BLOCK + _BLOCK, n3)):
                x = load(k0, a[_u(pa + m * sa)])
                y = load(k1, b[_u(pb + m * sb)])
                z = load(k2, e[_u(pe + m * se)])
                out[_u(po + m * so)] = store(hout, cast_value(hout, out, ternop(code, x, y, z, c)))

    return {"flat": njit(**_SERIAL)(flat), "strided": njit(**_SERIAL)(strided)}


def ternary(code: int, layout: str, hout: int = 0, kinds: tuple = (0, 0, 0), scalars: tuple = (False,) * 3):
    """The dispatcher for ternary op ``code`` in ``layout`` ("flat", "strided"), see :func:`_make_ternary`
    (the strided loop reads scalars through stride 0: ``scalars`` only shapes the flat one)."""
    key = (code, hout, kinds, scalars if layout == "flat" else (False,) * 3)
    kernels = _TERNARY.get(key)
    if kernels is None:
        kernels = _TERNARY[key] = _make_ternary(code, hout, kinds, key[3])
    return kernels[layout]


_BINARY: dict[tuple, dict] = {}
_UNARY: dict[tuple, dict] = {}
_TERNARY: dict[tuple, dict] = {}


def binary(code: int, layout: str, half: int = 0):
    """The dispatcher for binary op ``code`` in ``layout`` ("flat", "scalar", "strided"); ``half``: F16 or
    BF16 for half-precision storages (uint16 views, computed in float32), else 0."""
    kernels = _BINARY.get((code, half))
    if kernels is None:
        kernels = _BINARY[(code, half)] = _make_binary(code, half)
    return kernels[layout]


def _unary_loops(code: int, hin: int, hout: int) -> dict:
    """The loops of unary op ``code`` reading ``hin`` storage and writing ``hout`` storage (half kinds)."""
    kernels = _UNARY.get((code, hin, hout))
    if kernels is None:
        kernels = _UNARY[(code, hin, hout)] = _make_unary(code, hin, hout)
    return kernels


def unary(code: int, layout: str, half: int = 0):
    """The dispatcher for unary op ``code`` in ``layout`` ("flat", "strided"); ``half`` as for
    :func:`binary`."""
    return _unary_loops(code, half, half)[layout]


def cast(layout: str, hin: int = 0, hout: int = 0):
    """The dtype conversion loop in ``layout`` ("flat", "strided"): the unary loop of ``CAST``; ``hin`` /
    ``hout``: F16 or BF16 where the source / destination is half-precision bits (uint16), else 0 (the
    arrays' own dtypes)."""
    return _unary_loops(CAST, hin, hout)[layout]


# -------------------------------------------------------------------------------------- conversion


def cast_value(hout, out, v):
    """``v`` as the dtype of ``out`` holds it: float32 for half-precision bits (``store`` rounds it),
    else ``out``'s dtype (jitted only)."""
    raise NotImplementedError


@overload(cast_value)
def _cast_value_impl(hout, out, v):
    k = _const_code(hout)
    if k is None:
        return None
    if k:
        return lambda hout, out, v: np.float32(v)
    target = out.dtype
    return lambda hout, out, v: target(v)


# ------------------------------------------------------------------------------------------ dropout


def _make_dropout(half):
    def flat(x, u, keep, inv, out, noise, lo, hi):
        """Dropout over [lo, hi) of the dense ``x`` and its float64 draws ``u``: noise = (u < keep) / inv
        in the compute dtype, rounded to x's dtype (``inv`` = 1 - p in the compute dtype), out = x * noise
        (the reference's roundings, step for step)."""
        xv = x[lo:hi]
        uv = u[lo:hi]
        ov = out[lo:hi]
        nv = noise[lo:hi]
        one = inv / inv
        zero = inv - inv
        for i in range(hi - lo):
            n = store(half, (one if uv[i] < keep else zero) / inv)
            nv[i] = n
            ov[i] = store(half, load(half, xv[i]) * load(half, n))

    return njit(**_SERIAL)(flat)


_DROPOUT: dict[int, object] = {}


def dropout(half: int = 0):
    """The fused dropout loop; ``half`` as for :func:`binary`."""
    kernel = _DROPOUT.get(half)
    if kernel is None:
        kernel = _DROPOUT[half] = _make_dropout(half)
    return kernel


# -------------------------------------------------------------------------------------------- scans

CUMSUM, CUMPROD = range(2)


def compute_scratch(half, x, n):
    """An uninitialised array of ``n`` values in ``x``'s compute dtype (float32 for half-precision bits)
    (jitted only)."""
    raise NotImplementedError


@overload(compute_scratch)
def _compute_scratch_impl(half, x, n):
    k = _const_code(half)
    if k is None:
        return None
    if k:
        return lambda half, x, n: np.empty(n, np.float32)
    return lambda half, x, n: np.empty(n, x.dtype)


def _make_scan(code, half):
    def rows(x, out, n, lo, hi):
        """Running sums (products) along the contiguous rows ``x[k*n:(k+1)*n]``, k in [lo, hi), in order,
        the accumulator in the compute dtype (float32 for half precision), each output rounded once."""
        for k in range(lo, hi):
            p = k * n
            acc = load(half, x[p])
            out[p] = store(half, acc)
            for i in range(1, n):
                v = load(half, x[p + i])
                acc = acc + v if code == CUMSUM else acc * v
                out[p + i] = store(half, acc)

    def slabs(x, out, n, inner, lo, hi):
        """The same along the middle dim of the contiguous (outer, n, inner) ``x``, outer index in [lo, hi):
        rows combined in order into ``inner`` accumulators, vectorised along ``inner``."""
        acc = compute_scratch(half, x, inner)
        for o in range(lo, hi):
            base = o * n * inner
            first = x[base : base + inner]
            ofirst = out[base : base + inner]
            for i in range(inner):
                acc[i] = load(half, first[i])
                ofirst[i] = store(half, acc[i])
            for r in range(1, n):
                row = x[base + r * inner : base + (r + 1) * inner]
                orow = out[base + r * inner : base + (r + 1) * inner]
                for i in range(inner):
                    v = load(half, row[i])
                    acc[i] = acc[i] + v if code == CUMSUM else acc[i] * v
                    orow[i] = store(half, acc[i])

    return {"rows": njit(**_SERIAL)(rows), "slabs": njit(**_SERIAL)(slabs)}


_SCAN: dict[tuple, dict] = {}


def scan(code: int, layout: str, half: int = 0):
    """The dispatcher for scan ``code`` (CUMSUM, CUMPROD) in ``layout`` ("rows", "slabs")."""
    kernels = _SCAN.get((code, half))
    if kernels is None:
        kernels = _SCAN[(code, half)] = _make_scan(code, half)
    return kernels[layout]


# -------------------------------------------------------------------------------------- reductions

_PW_BLOCK = 128  # NumPy's pairwise-summation block
_UNIT_BLOCK = 2048  # the leaves of a contiguous sum (see _pairwise_leaf_unit)


@intrinsic
def _pairs_leaf_lanes(typingctx, a, base, n):
    """NumPy's eight running sums over ``a[base + 2*i]``, i < n - n % 8 (n >= 8), as one vector of eight
    lanes, combined as NumPy's leaf combines them ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)).
    Each step loads sixteen elements under a mask of the even ones (no read past the run, none of the
    odd elements) and adds their eight evens, lane j to running sum j: the additions, in order, of
    NumPy's strided leaf, where its scalar loop is bound by the latency of its loads and adds. ``a``: a
    1-d aligned C-contiguous float32/float64 array; ``base``: uint64."""
    if not isinstance(a, types.Array) or a.ndim != 1 or a.layout != "C" or not a.aligned:
        return None
    if a.dtype not in (types.float32, types.float64):
        return None

    def codegen(context, builder, signature, args):
        """The masked loads, the shuffles and the vector adds, in a loop built here."""
        aty = signature.args[0]
        ary = context.make_array(aty)(context, builder, args[0])
        fty = context.get_value_type(aty.dtype)
        i64 = ir.IntType(64)
        base = context.cast(builder, args[1], signature.args[1], types.int64)
        n = context.cast(builder, args[2], signature.args[2], types.int64)
        v16, v8 = ir.VectorType(fty, 16), ir.VectorType(fty, 8)
        bits = "f32" if aty.dtype.bitwidth == 32 else "f64"
        mask_ty = ir.VectorType(ir.IntType(1), 16)
        fnty = ir.FunctionType(v16, [v16.as_pointer(), ir.IntType(32), mask_ty, v16])
        load = builder.module.declare_intrinsic(f"llvm.masked.load.v16{bits}.p0", fnty=fnty)
        even = ir.Constant(mask_ty, [1, 0] * 8)
        zero16 = ir.Constant(v16, [0.0] * 16)
        align = ir.Constant(ir.IntType(32), aty.dtype.bitwidth // 8)
        evens = ir.Constant(ir.VectorType(ir.IntType(32), 8), list(range(0, 16, 2)))
        start = builder.gep(ary.data, [base])

        def lanes_at(i):
            """The eight even elements of the sixteen from 2*i on."""
            p = builder.bitcast(builder.gep(start, [builder.mul(i, ir.Constant(i64, 2))]), v16.as_pointer())
            v = builder.call(load, [p, align, even, zero16])
            return builder.shuffle_vector(v, v, evens)

        end = builder.sub(n, builder.srem(n, ir.Constant(i64, 8)))
        first = lanes_at(ir.Constant(i64, 0))
        entry = builder.block
        check = builder.append_basic_block("pairs.check")
        body = builder.append_basic_block("pairs.body")
        done = builder.append_basic_block("pairs.done")
        builder.branch(check)
        builder.position_at_end(check)
        i = builder.phi(i64)
        acc = builder.phi(v8)
        i.add_incoming(ir.Constant(i64, 8), entry)
        acc.add_incoming(first, entry)
        builder.cbranch(builder.icmp_signed("<", i, end), body, done)
        builder.position_at_end(body)
        nxt = builder.fadd(acc, lanes_at(i))
        i_next = builder.add(i, ir.Constant(i64, 8))
        i.add_incoming(i_next, body)
        acc.add_incoming(nxt, body)
        builder.branch(check)
        builder.position_at_end(done)
        r = [builder.extract_element(acc, ir.Constant(ir.IntType(32), j)) for j in range(8)]
        left = builder.fadd(builder.fadd(r[0], r[1]), builder.fadd(r[2], r[3]))
        right = builder.fadd(builder.fadd(r[4], r[5]), builder.fadd(r[6], r[7]))
        return builder.fadd(left, right)

    return a.dtype(a, base, n), codegen


def _pairs_leaf(a, base, n):
    """NumPy's pairwise-summation leaf over ``a[base + 2*i]``, i < n, 8 <= n <= 128 (jitted only): as
    vectors (:func:`_pairs_leaf_lanes`) in an aligned C-contiguous float32/float64 ``a``, else
    :func:`_pairwise_leaf_scalar`'s loop."""
    raise NotImplementedError


@overload(_pairs_leaf)
def _pairs_leaf_impl(a, base, n):
    if a.layout != "C" or not a.aligned or a.dtype not in (types.float32, types.float64):
        return lambda a, base, n: _pairwise_leaf_scalar(a, base, n, _u(2))

    def leaf(a, base, n):
        res = _pairs_leaf_lanes(a, base, n)
        for i in range(n - n % 8, n):
            res += a[base + _u(2 * i)]
        return res

    return leaf


@register_jitable
def _pairwise_leaf(a, base, n, st):
    """NumPy's pairwise-summation leaf over ``a[base + i*st]``, i < n <= 128: eight running sums
    combined as a tree, then the tail. ``base`` and ``st`` are uint64 (two's complement strides). A
    stride of 2 (x[..., ::2]) adds the same numbers in the same order as vectors (:func:`_pairs_leaf`:
    the sum of a 4096x4096 view of 4096x8192 on two threads, 6.8 ms with scalar leaves, 4.1 ms)."""
    if n >= 8 and st == 2:
        return _pairs_leaf(a, base, n)
    return _pairwise_leaf_scalar(a, base, n, st)


@register_jitable
def _pairwise_leaf_scalar(a, base, n, st):
    """:func:`_pairwise_leaf` in scalar code, any stride."""
    if n < 8:
        res = -zero_of(a)
        for i in range(n):
            res += a[base + _u(i) * st]
        return res
    r0 = a[base]
    r1 = a[base + st]
    r2 = a[base + _u(2) * st]
    r3 = a[base + _u(3) * st]
    r4 = a[base + _u(4) * st]
    r5 = a[base + _u(5) * st]
    r6 = a[base + _u(6) * st]
    r7 = a[base + _u(7) * st]
    end = n - (n % 8)
    for i in range(8, end, 8):
        p = base + _u(i) * st
        r0 += a[p]
        r1 += a[p + st]
        r2 += a[p + _u(2) * st]
        r3 += a[p + _u(3) * st]
        r4 += a[p + _u(4) * st]
        r5 += a[p + _u(5) * st]
        r6 += a[p + _u(6) * st]
        r7 += a[p + _u(7) * st]
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    for i in range(end, n):
        res += a[base + _u(i) * st]
    return res


@njit(**_UNCOUNTED, fastmath={"reassoc"})
def _sum_contiguous(v):
    """The sum of the contiguous 1-d ``v``, the leaf of a contiguous pairwise sum. ``reassoc`` (and only
    that: NaN, inf and -0.0 keep IEEE rules) lets LLVM split the sum over the lanes of several vector
    registers (32 running sums in float32 with AVX2), each adding every 32nd element in order, combined
    as a tree: the same order on every call, so results do not depend on threads or timing. Its own
    function, because fastmath flags apply per compiled function. Memory-bound (25 GB/s on one core
    here), where NumPy's eight sequential sums are latency-bound at about 2 elements a cycle."""
    s = -zero_of(v)
    for i in range(v.shape[0]):
        s += v[i]
    return s


@register_jitable
def _pairwise_leaf_unit(a, base, n):
    """The leaf of a contiguous sum, ``n <= _UNIT_BLOCK`` elements: :func:`_sum_contiguous`, where each
    running sum adds at most 64 elements in sequence (NumPy's sixteen), so the error bound is NumPy's plus
    a few ulps; the tree above the leaves is NumPy's. Up to NumPy's own leaf size, NumPy's leaf exactly
    (short sums, e.g. over a small dim, stay bit for bit NumPy's)."""
    if n <= _PW_BLOCK:
        return _pairwise_leaf(a, base, n, _u(1))
    return _sum_contiguous(a[base : base + _u(n)])


@register_jitable
def _pairwise_tree(a, lo, n, st, work, vals, leaf):
    """NumPy's pairwise-summation tree over ``a[lo + i*st]``, i < n, down to leaves of at most ``leaf``
    elements: NumPy's eight-sum leaves (:func:`_pairwise_leaf`), or contiguous leaves of up to
    ``_UNIT_BLOCK`` with thirty-two sums (:func:`_pairwise_leaf_unit`) when ``leaf`` is that. The
    recursion runs on an explicit stack, post-order, in the caller's scratch arrays ``work`` (int64,
    384) and ``vals`` (128 of the dtype)."""
    ust = _u(st)
    wide = leaf > _PW_BLOCK
    if n <= leaf:
        if wide:
            return _pairwise_leaf_unit(a, _u(lo), n)
        return _pairwise_leaf(a, _u(lo), n, ust)
    work[0] = 0  # work[i]: start, work[128 + i]: length, work[256 + i]: expanded, of stack entry i
    work[128] = n
    work[256] = 0
    top = 1
    nv = 0
    while top > 0:
        cur_lo = work[top - 1]
        cur_n = work[127 + top]
        if cur_n <= leaf:
            top -= 1
            p = lo + cur_lo * st
            if wide:
                vals[nv] = _pairwise_leaf_unit(a, _u(p), cur_n)
            else:
                vals[nv] = _pairwise_leaf(a, _u(p), cur_n, ust)
            nv += 1
        elif work[255 + top] == 0:
            work[255 + top] = 1
            n2 = cur_n // 2
            n2 -= n2 % 8
            work[top] = cur_lo + n2  # the right half, evaluated second
            work[128 + top] = cur_n - n2
            work[256 + top] = 0
            work[top + 1] = cur_lo
            work[129 + top] = n2
            work[257 + top] = 0
            top += 2
        else:
            top -= 1
            nv -= 1
            vals[nv - 1] = vals[nv - 1] + vals[nv]
    return vals[0]


@njit(**_UNCOUNTED)
def _pairwise_sum(a, lo, n, st, work, vals):
    """The pairwise sum of ``a[lo + i*st]``, i < n: NumPy's tree, bit for bit NumPy's result when strided;
    contiguous, the tree stops at leaves of up to 2048 elements with thirty-two running sums (faster,
    within a few ulps of NumPy's). ``work``/``vals``: as :func:`_pairwise_tree`. Called once per row or
    run: no reference counting (:data:`_UNCOUNTED`), and one leaf (not of stride 2) called directly."""
    if n <= _PW_BLOCK and st != 2:
        return _pairwise_leaf_scalar(a, _u(lo), n, _u(st))
    return _pairwise_tree(a, lo, n, st, work, vals, _UNIT_BLOCK if st == 1 else _PW_BLOCK)


@register_jitable
def _extreme(code, a, lo, n, st):
    """Fold ``a[lo + i*st]``, i < n (n >= 1), with maximum or minimum (``code``), NaN propagating;
    eight lanes."""
    base = _u(lo)
    ust = _u(st)
    r0 = a[base]
    if n < 8:
        for i in range(1, n):
            r0 = binop(code, a[base + _u(i) * ust], r0, 0)
        return r0
    r1 = a[base + ust]
    r2 = a[base + _u(2) * ust]
    r3 = a[base + _u(3) * ust]
    r4 = a[base + _u(4) * ust]
    r5 = a[base + _u(5) * ust]
    r6 = a[base + _u(6) * ust]
    r7 = a[base + _u(7) * ust]
    end = n - (n % 8)
    for i in range(8, end, 8):
        p = base + _u(i) * ust
        r0 = binop(code, a[p], r0, 0)
        r1 = binop(code, a[p + ust], r1, 0)
        r2 = binop(code, a[p + _u(2) * ust], r2, 0)
        r3 = binop(code, a[p + _u(3) * ust], r3, 0)
        r4 = binop(code, a[p + _u(4) * ust], r4, 0)
        r5 = binop(code, a[p + _u(5) * ust], r5, 0)
        r6 = binop(code, a[p + _u(6) * ust], r6, 0)
        r7 = binop(code, a[p + _u(7) * ust], r7, 0)
    r0 = binop(
        code,
        binop(code, binop(code, r1, r0, 0), binop(code, r3, r2, 0), 0),
        binop(code, binop(code, r5, r4, 0), binop(code, r7, r6, 0), 0),
        0,
    )
    for i in range(end, n):
        r0 = binop(code, a[base + _u(i) * ust], r0, 0)
    return r0


def float_bits(ai):
    """Constants for the integer view ``ai`` of a float array (jitted only): (mask of the non-sign bits,
    bits of +inf, bits of the quiet NaN, sign shift)."""
    raise NotImplementedError


@overload(float_bits)
def _float_bits_impl(ai):
    if ai.dtype == types.int32:
        consts = (np.int32(0x7FFFFFFF), np.int32(0x7F800000), np.int32(0x7FC00000), 31)
    else:
        consts = (np.int64(0x7FFFFFFFFFFFFFFF), np.int64(0x7FF0000000000000), np.int64(0x7FF8000000000000), 63)
    return lambda ai: consts


def same_int(ai, x):
    """``x`` cast to the dtype of integer array ``ai`` (jitted only): Numba widens int32 arithmetic to
    int64, which halves the vector width."""
    raise NotImplementedError


@overload(same_int)
def _same_int_impl(ai, x):
    if ai.dtype == types.int32:
        return lambda ai, x: np.int32(x)
    return lambda ai, x: np.int64(x)


def _make_contiguous_extreme(code):
    """max/min of contiguous runs, vectorised by working on the IEEE bits: flipping the magnitude bits of
    negative numbers makes integer order equal float order (LLVM vectorises integer max/min folds, not
    float ones), and NaN is found as a magnitude above infinity's."""
    largest = code == AMAX

    def run(vi):
        mask, inf, qnan, shift = float_bits(vi)
        b = vi[0]
        best = same_int(vi, b ^ same_int(vi, same_int(vi, b >> shift) & mask))
        worst = same_int(vi, b & mask)
        for i in range(vi.shape[0]):
            b = vi[i]
            k = same_int(vi, b ^ same_int(vi, same_int(vi, b >> shift) & mask))
            if largest:
                best = k if k > best else best
            else:
                best = k if k < best else best
            m = same_int(vi, b & mask)
            worst = m if m > worst else worst
        return qnan if worst > inf else best ^ same_int(vi, same_int(vi, best >> shift) & mask)

    run = register_jitable(run)

    def segments(ai, los, ns, outi, lo, hi):
        """Fold the segments ``a[los[s]:los[s]+ns[s]]``, s in [lo, hi) (integer views in and out)."""
        for s in range(lo, hi):
            outi[s] = run(ai[los[s] : los[s] + ns[s]])

    def rows(ai, ao, sk, nr, outi, lo, hi):
        """out[k] = fold of the contiguous row a[ao + k*sk : ao + k*sk + nr], k in [lo, hi)."""
        for k in range(lo, hi):
            p = ao + k * sk
            outi[k] = run(ai[p : p + nr])

    return {"segments": njit(**_SERIAL)(segments), "rows": njit(**_SERIAL)(rows)}


_SLAB_RUN = 16384
"""Elements per run at most (64 KiB of float32) for which a sum of slabs adds its runs element by
element into one run that stays in the cache (``slabs`` in :func:`_make_reduce`)."""


def _make_reduce(code):
    # the binary op that folds two partial results
    fold = {SUM: ADD, AMAX: MAXIMUM, AMIN: MINIMUM}[code]

    def segments(a, ao, st, los, ns, out, lo, hi):
        """Reduce the segments ``a[ao + (los[s] + i)*st]``, i < ns[s], s in [lo, hi), of a run (a full
        reduction's subtrees; strides in elements)."""
        work = np.empty(384, np.int64)
        vals = np.empty(128, a.dtype)
        for s in range(lo, hi):
            if code == SUM:
                out[s] = _pairwise_sum(a, ao + los[s] * st, ns[s], st, work, vals)
            else:
                out[s] = _extreme(fold, a, ao + los[s] * st, ns[s], st)

    def rows(a, ao, sk, nr, sr, out, lo, hi):
        """out[k] = reduce over r < nr of a[ao + k*sk + r*sr], k in [lo, hi) (strides in elements)."""
        zero = zero_of(a)
        work = np.empty(384, np.int64)
        vals = np.empty(128, a.dtype)
        for k in range(lo, hi):
            if code == SUM:
                out[k] = zero + _pairwise_sum(a, ao + k * sk, nr, sr, work, vals)
            else:
                out[k] = _extreme(fold, a, ao + k * sk, nr, sr)

    def slabs(a, ao, sk, n0, s0, n1, s1, out, lo, hi):
        """out[k] = reduce over i < n0, r < n1 of a[ao + k*sk + i*s0 + r*s1], k in [lo, hi): each run of
        n1 reduced as in ``rows``, the runs folded in order (NumPy's order for two reduced dims that do
        not merge, such as a conv bias's gradient over (N, H, W)). A sum of contiguous runs of at most
        :data:`_SLAB_RUN` elements adds the runs element by element first (vector adds, in order), then
        sums that run pairwise: short runs cost a tree each otherwise (64x32x14x14: 179 us, now 40 us)."""
        zero = zero_of(a)
        work = np.empty(384, np.int64)
        vals = np.empty(128, a.dtype)
        across = code == SUM and s1 == 1 and n1 <= _SLAB_RUN
        part = np.empty(n1 if across else 1, a.dtype)
        for k in range(lo, hi):
            p = ao + k * sk
            if across:
                first = a[p : p + n1]
                for r in range(n1):
                    part[r] = first[r]
                for i in range(1, n0):
                    row = a[p + i * s0 : p + i * s0 + n1]
                    for r in range(n1):
                        part[r] += row[r]
                acc = zero + _pairwise_sum(part, 0, n1, 1, work, vals)
            elif code == SUM:
                acc = zero
                for i in range(n0):
                    acc += _pairwise_sum(a, p + i * s0, n1, s1, work, vals)
            else:
                acc = _extreme(fold, a, p, n1, s1)
                for i in range(1, n0):
                    acc = binop(fold, acc, _extreme(fold, a, p + i * s0, n1, s1), 0)
            out[k] = acc

    def cols(a, ao, nr, sr, out, lo, hi):
        """The same with unit stride along k: rows folded in order into out[lo:hi] (vectorised)."""
        ov = out[lo:hi]
        w = hi - lo
        r0 = 0
        if code == SUM:
            for m in range(w):
                ov[m] = 0
        else:
            first = a[ao + lo : ao + hi]
            for m in range(w):
                ov[m] = first[m]
            r0 = 1
        for r in range(r0, nr):
            row = a[ao + r * sr + lo : ao + r * sr + hi]
            for m in range(w):
                ov[m] = binop(fold, ov[m], row[m], 0)

    return {
        "segments": njit(**_SERIAL)(segments),
        "rows": njit(**_SERIAL)(rows),
        "slabs": njit(**_SERIAL)(slabs),
        "cols": njit(**_SERIAL)(cols),
    }


_REDUCE: dict[int, dict] = {}


def reduce(code: int, layout: str):
    """The dispatcher for reduction ``code`` in ``layout`` ("segments", "rows", "slabs", "cols", and for AMAX and
    AMIN "segments-contiguous", "rows-contiguous": the vectorised folds, given the integer view too)."""
    kernels = _REDUCE.get(code)
    if kernels is None:
        kernels = _REDUCE[code] = _make_reduce(code)
        if code != SUM:
            fast = _make_contiguous_extreme(code)
            kernels["segments-contiguous"] = fast["segments"]
            kernels["rows-contiguous"] = fast["rows"]
    return kernels[layout]
