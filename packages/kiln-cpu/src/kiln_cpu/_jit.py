"""The Numba kernels: elementwise (binary, unary) and reductions, compiled lazily and cached to disk.

Importing this module compiles nothing. Each op is one small dispatcher per memory layout, built by a
factory from an integer op code; the code is a closure constant, so Numba specialises the scalar
function at typing time (no branch in the loop, the loop vectorises) and caches each (op, layout,
dtype) specialisation under its own key (the cache key hashes closure contents).

Everything jitted lives in this one file on purpose: Numba's cache is invalidated by the timestamp of
the file that defines a kernel, so a helper in another file could go stale in the cache.

Semantics follow the reference kernels (NumPy, PyTorch's rules): results are computed in the result
dtype, integers wrap, float division by zero gives inf/NaN (``error_model="numpy"``), maximum/minimum
propagate NaN and return the second operand on ties. float32 exp/log/tanh/sigmoid/erf are computed in
float64 with vectorisable polynomials and rounded once to float32 (at most 1 ulp from the exact value).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.extending import intrinsic, overload, register_jitable

_SERIAL = {"cache": True, "nogil": True, "error_model": "numpy"}

# ------------------------------------------------------------------------------------------ op codes

ADD, SUB, MUL, DIV, FLOOR_DIV, TRUNC_DIV, MAXIMUM, MINIMUM = range(8)
EQ, NE, LT, LE, GT, GE = range(8, 14)
ADD_ALPHA, SUB_ALPHA = 14, 15  # x + y * c, x - y * c (the product rounded first, as the reference)

NEG, ABS, RELU, EXP, LOG, SQRT, SIN, COS, TANH, SIGMOID, ERF = range(11)

SUM, AMAX, AMIN = range(3)

# ------------------------------------------------------------------------------------------ bit casts


@intrinsic
def _f64_bits(typingctx, x):
    """The IEEE bits of a float64 as an int64."""
    if x != types.float64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.int64))

    return types.int64(types.float64), codegen


@intrinsic
def _bits_f64(typingctx, x):
    """The float64 whose IEEE bits are the int64 ``x``."""
    if x != types.int64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.float64))

    return types.float64(types.int64), codegen


# ------------------------------------------------------------------------- float64 cores for float32

_LN2_HI = 6.93147180369123816490e-01  # low bits zero: n * _LN2_HI is exact for |n| < 2**11
_LN2_LO = 1.90821492927058770002e-10
_LN2 = 0.6931471805599453
_LOG2E = 1.4426950408889634


@register_jitable
def _exp_d(x):
    """exp of a float64 to 2e-10 relative error (ample for float32 results): 2**n * e**f, |f| <= ln2/2,
    degree-8 Taylor in f.
    ``x`` is clamped to [-708, 709] so 2**n stays normal; callers handle NaN."""
    x = min(max(x, -708.0), 709.0)
    n = math.floor(x * _LOG2E + 0.5)
    f = (x - n * _LN2_HI) - n * _LN2_LO
    # Estrin's scheme: a dependency chain half as long as Horner's, so vector iterations overlap
    f2 = f * f
    f4 = f2 * f2
    q03 = (1.0 + f) + f2 * (0.5 + f * (1.0 / 6.0))
    q47 = (1.0 / 24.0 + f * (1.0 / 120.0)) + f2 * (1.0 / 720.0 + f * (1.0 / 5040.0))
    p = q03 + f4 * (q47 + f4 * (1.0 / 40320.0))
    return p * _bits_f64((np.int64(n) + 1023) << 52)


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
def tanh_f32(x):
    """tanh of a float32: (e-1)/(e+1), e = exp(2|x|) in float64 (odd Taylor near 0), sign restored."""
    xd = np.float64(x)
    a = abs(xd)
    e = _exp_d(2.0 * min(a, 10.0))  # from |x| = 9.02 on, tanh rounds to 1 in float32
    t = (e - 1.0) / (e + 1.0)
    t = -t if x < 0 else t  # a select: math.copysign would be a libm call, which does not vectorise
    z = xd * xd  # below 2**-6: odd Taylor series to x**7 (keeps the sign of -0.0)
    small = xd * (1.0 - z * (1.0 / 3.0 - z * (2.0 / 15.0 - z * (17.0 / 315.0))))
    r = np.float32(small if a < 0.015625 else t)
    return x if x != x else r


@register_jitable
def sigmoid_f32(x):
    """1/(1+exp(-x)) of a float32 in float64, rounded once."""
    r = np.float32(1.0 / (1.0 + _exp_d(-np.float64(x))))
    return x if x != x else r


# Cephes ndtr.c (as the reference's erf): erf = x T(x^2)/U(x^2) for |x| < 1, 1 - exp(-x^2) P(|x|)/Q(|x|)
# above (Q and U monic); beyond |x| = 6 erf rounds to 1 even in float64.
@register_jitable
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
    centre = x * t / u
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
    tail = 1.0 - _exp_d(-(b * b)) * p / q
    tail = -tail if x < 0.0 else tail
    return centre if a < 1.0 else tail


@register_jitable
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


@overload(unop)
def _unop_impl(code, x):
    k = _const_code(code)
    if k is None:
        return None
    f32 = x == types.float32
    zero = np.dtype(str(x)).type(0)
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
def _u(i):
    return np.uint64(i)


def _make_binary(code):
    def flat(a, b, out, c, lo, hi):
        """Both operands dense with the same layout: one flat loop over [lo, hi)."""
        av = a[lo:hi]
        bv = b[lo:hi]
        ov = out[lo:hi]
        for i in range(hi - lo):
            ov[i] = binop(code, av[i], bv[i], c)

    def flat_scalar(a, s, out, c, lo, hi):
        """A dense array and a scalar on the right."""
        av = a[lo:hi]
        ov = out[lo:hi]
        for i in range(hi - lo):
            ov[i] = binop(code, av[i], s, c)

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
            blk = t % nb
            q = t // nb
            k = q % n2
            q = q // n2
            j = q % n1
            i = q // n1
            pa = ao + i * ast[0] + j * ast[1] + k * ast[2]
            pb = bo + i * bst[0] + j * bst[1] + k * bst[2]
            po = i * ost[0] + j * ost[1] + k * ost[2]
            for m in range(blk * _BLOCK, min(blk * _BLOCK + _BLOCK, n3)):
                out[_u(po + m * so)] = binop(code, a[_u(pa + m * sa)], b[_u(pb + m * sb)], c)

    return {
        "flat": njit(**_SERIAL)(flat),
        "scalar": njit(**_SERIAL)(flat_scalar),
        "strided": njit(**_SERIAL)(strided),
    }


def _make_unary(code):
    # contract: the float64 polynomials of the float32 transcendentals may use FMA (more accurate,
    # faster); no unary op rounds a product before an addition that the reference keeps separate
    opts = {**_SERIAL, "fastmath": {"contract"}}

    def flat(a, out, lo, hi):
        """A dense operand: one flat loop over [lo, hi)."""
        av = a[lo:hi]
        ov = out[lo:hi]
        for i in range(hi - lo):
            ov[i] = unop(code, av[i])

    def strided(a, ao, ast, out, ost, shape, lo, hi):
        """Any strides (in elements) over a 1-d storage with an offset, shapes coalesced to 4-d; ``out``
        a fresh dense buffer with strides ``ost``."""
        _, n1, n2, n3 = shape
        nb = (n3 + _BLOCK - 1) // _BLOCK
        sa = ast[3]
        so = ost[3]
        for t in range(lo, hi):
            blk = t % nb
            q = t // nb
            k = q % n2
            q = q // n2
            j = q % n1
            i = q // n1
            pa = ao + i * ast[0] + j * ast[1] + k * ast[2]
            po = i * ost[0] + j * ost[1] + k * ost[2]
            for m in range(blk * _BLOCK, min(blk * _BLOCK + _BLOCK, n3)):
                out[_u(po + m * so)] = unop(code, a[_u(pa + m * sa)])

    return {"flat": njit(**opts)(flat), "strided": njit(**opts)(strided)}


_BINARY: dict[int, dict] = {}
_UNARY: dict[int, dict] = {}


def binary(code: int, layout: str):
    """The dispatcher for binary op ``code`` in ``layout`` ("flat", "scalar", "strided")."""
    kernels = _BINARY.get(code)
    if kernels is None:
        kernels = _BINARY[code] = _make_binary(code)
    return kernels[layout]


def unary(code: int, layout: str):
    """The dispatcher for unary op ``code`` in ``layout`` ("flat", "strided")."""
    kernels = _UNARY.get(code)
    if kernels is None:
        kernels = _UNARY[code] = _make_unary(code)
    return kernels[layout]


# -------------------------------------------------------------------------------------- reductions

_PW_BLOCK = 128  # NumPy's pairwise-summation block


@register_jitable
def _pairwise_leaf(a, base, n, st):
    """NumPy's pairwise-summation leaf over ``a[base + i*st]``, i < n <= 128: eight running sums
    combined as a tree, then the tail. ``base`` and ``st`` are uint64 (two's complement strides)."""
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


@register_jitable
def _pairwise_leaf_unit(a, base, n):
    """:func:`_pairwise_leaf` with unit stride and sixteen running sums instead of eight: two SIMD adds in
    flight instead of one, which lifts the sum above memory bandwidth (NumPy's eight sums are latency
    bound at 2 elements a cycle). The tree above the leaves is NumPy's, so the accuracy is NumPy's."""
    if n < 16:
        return _pairwise_leaf(a, base, n, _u(1))
    r0 = a[base]
    r1 = a[base + _u(1)]
    r2 = a[base + _u(2)]
    r3 = a[base + _u(3)]
    r4 = a[base + _u(4)]
    r5 = a[base + _u(5)]
    r6 = a[base + _u(6)]
    r7 = a[base + _u(7)]
    r8 = a[base + _u(8)]
    r9 = a[base + _u(9)]
    r10 = a[base + _u(10)]
    r11 = a[base + _u(11)]
    r12 = a[base + _u(12)]
    r13 = a[base + _u(13)]
    r14 = a[base + _u(14)]
    r15 = a[base + _u(15)]
    end = n - (n % 16)
    for i in range(16, end, 16):
        p = base + _u(i)
        r0 += a[p]
        r1 += a[p + _u(1)]
        r2 += a[p + _u(2)]
        r3 += a[p + _u(3)]
        r4 += a[p + _u(4)]
        r5 += a[p + _u(5)]
        r6 += a[p + _u(6)]
        r7 += a[p + _u(7)]
        r8 += a[p + _u(8)]
        r9 += a[p + _u(9)]
        r10 += a[p + _u(10)]
        r11 += a[p + _u(11)]
        r12 += a[p + _u(12)]
        r13 += a[p + _u(13)]
        r14 += a[p + _u(14)]
        r15 += a[p + _u(15)]
    lo = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    hi = ((r8 + r9) + (r10 + r11)) + ((r12 + r13) + (r14 + r15))
    res = lo + hi
    for i in range(end, n):
        res += a[base + _u(i)]
    return res


@register_jitable
def _pairwise_sum(a, lo, n, st, work, vals):
    """NumPy's pairwise sum of ``a[lo + i*st]``, i < n: the same tree (bit for bit NumPy's result when
    strided; contiguous leaves keep sixteen running sums, not eight). The recursion runs on an explicit
    stack, post-order, in the caller's scratch arrays ``work`` (int64, 384) and ``vals`` (128 of the
    dtype)."""
    ust = _u(st)
    if n <= _PW_BLOCK:
        if st == 1:
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
        if cur_n <= _PW_BLOCK:
            top -= 1
            p = lo + cur_lo * st
            if st == 1:
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


def _make_reduce(code):
    # the binary op that folds two partial results
    fold = {SUM: ADD, AMAX: MAXIMUM, AMIN: MINIMUM}[code]

    def segments(a, los, ns, out, lo, hi):
        """Reduce the segments ``a[los[s]:los[s]+ns[s]]``, s in [lo, hi), of a dense 1-d array (a full
        reduction's subtrees)."""
        work = np.empty(384, np.int64)
        vals = np.empty(128, a.dtype)
        for s in range(lo, hi):
            if code == SUM:
                out[s] = _pairwise_sum(a, los[s], ns[s], 1, work, vals)
            else:
                out[s] = _extreme(fold, a, los[s], ns[s], 1)

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
        "cols": njit(**_SERIAL)(cols),
    }


_REDUCE: dict[int, dict] = {}


def reduce(code: int, layout: str):
    """The dispatcher for reduction ``code`` in ``layout`` ("segments", "rows", "cols", and for AMAX and
    AMIN "segments-contiguous", "rows-contiguous": the vectorised folds, given the integer view too)."""
    kernels = _REDUCE.get(code)
    if kernels is None:
        kernels = _REDUCE[code] = _make_reduce(code)
        if code != SUM:
            fast = _make_contiguous_extreme(code)
            kernels["segments-contiguous"] = fast["segments"]
            kernels["rows-contiguous"] = fast["rows"]
    return kernels[layout]


# ------------------------------------------------------------------------------- softmax and norms
#
# One task per row (or per outer slab when the dim is not the last): the row stays in cache across its
# passes. The arithmetic is the reference's, step for step (x - max, exp, pairwise sum, divide; layer
# norm's mean, centred squares, 1/sqrt(var + eps), affine), so NaN, inf and all -inf rows come out as
# the reference's; only exp (float32: the float64 polynomial, rounded once) and the sum's leaf width
# differ in the last bits.


def exp_of(x):
    """exp in ``x``'s dtype (jitted only): float32 through the float64 polynomial, rounded once."""
    raise NotImplementedError


def log_of(x):
    """log in ``x``'s dtype (jitted only)."""
    raise NotImplementedError


@overload(exp_of)
def _exp_of_impl(x):
    if x == types.float32:
        return lambda x: exp_f32(x)
    return lambda x: math.exp(x)


@overload(log_of)
def _log_of_impl(x):
    if x == types.float32:
        return lambda x: log_f32(x)
    return lambda x: np.log(x)


def as_dtype_of(a, v):
    """The float ``v`` rounded to array ``a``'s dtype (jitted only)."""
    raise NotImplementedError


@overload(as_dtype_of)
def _as_dtype_of_impl(a, v):
    if a.dtype == types.float32:
        return lambda a, v: np.float32(v)
    return lambda a, v: np.float64(v)


_LANES = 64  # running maxima of a row: a fold across a small array vectorises, a scalar fold does not


@register_jitable
def _row_max(a, p, n, acc):
    """max of the contiguous ``a[p:p+n]`` (n >= 1), NaN propagating: ``_LANES`` running maxima in the
    scratch ``acc`` (the elementwise select vectorises; a scalar float fold runs 5x slower)."""
    v = a[p : p + n]
    first = v[0]
    for j in range(_LANES):
        acc[j] = first
    end = n - n % _LANES
    for b in range(0, end, _LANES):
        blk = v[b : b + _LANES]
        for j in range(_LANES):
            acc[j] = binop(MAXIMUM, blk[j], acc[j], 0)
    m = first
    for j in range(_LANES):
        m = binop(MAXIMUM, acc[j], m, 0)
    for i in range(end, n):
        m = binop(MAXIMUM, v[i], m, 0)
    return m


@register_jitable
def _exp_into(xv, m, ev):
    """ev[i] = exp(xv[i] - m) in the row's dtype (a flat loop: it vectorises; fused with the sum, it
    did not)."""
    for i in range(xv.shape[0]):
        ev[i] = exp_of(xv[i] - m)


def _softmax_rows(log):
    def rows(x, out, n, lo, hi):
        """Softmax (log-softmax) of the contiguous rows ``x[k*n:(k+1)*n]``, k in [lo, hi), into ``out``:
        max, exp, the pairwise sum of the exps (the reference's order), then the division (softmax: a
        multiplication by the reciprocal, within an ulp of it) or the subtraction of log(sum)."""
        work = np.empty(384, np.int64)
        vals = np.empty(128, x.dtype)
        acc = np.empty(_LANES, x.dtype)
        scratch = np.empty(n if log else 0, x.dtype)
        for k in range(lo, hi):
            p = k * n
            m = _row_max(x, p, n, acc)
            xv = x[p : p + n]
            ov = out[p : p + n]
            if log:
                _exp_into(xv, m, scratch)
                ls = log_of(_pairwise_sum(scratch, 0, n, 1, work, vals))
                for i in range(n):
                    ov[i] = (xv[i] - m) - ls
            else:
                _exp_into(xv, m, ov)
                r = as_dtype_of(x, 1.0 / np.float64(_pairwise_sum(out, p, n, 1, work, vals)))
                for i in range(n):
                    ov[i] = ov[i] * r

    return njit(**_SERIAL, fastmath={"contract"})(rows)


def _softmax_slabs(log):
    def slabs(x, out, n, inner, lo, hi):
        """Softmax (log-softmax) along the middle dim of the contiguous (outer, n, inner) ``x``, outer index
        in [lo, hi): rows folded in order, vectorised along ``inner`` (the reference's order exactly)."""
        m = np.empty(inner, x.dtype)
        s = np.empty(inner, x.dtype)
        for o in range(lo, hi):
            base = o * n * inner
            first = x[base : base + inner]
            for i in range(inner):
                m[i] = first[i]
                s[i] = 0
            for r in range(1, n):
                row = x[base + r * inner : base + (r + 1) * inner]
                for i in range(inner):
                    m[i] = binop(MAXIMUM, row[i], m[i], 0)
            for r in range(n):
                row = x[base + r * inner : base + (r + 1) * inner]
                orow = out[base + r * inner : base + (r + 1) * inner]
                for i in range(inner):
                    e = exp_of(row[i] - m[i])
                    s[i] += e
                    if not log:
                        orow[i] = e
            if log:
                for i in range(inner):
                    s[i] = log_of(s[i])
            for r in range(n):
                row = x[base + r * inner : base + (r + 1) * inner]
                orow = out[base + r * inner : base + (r + 1) * inner]
                for i in range(inner):
                    if log:
                        orow[i] = (row[i] - m[i]) - s[i]
                    else:
                        orow[i] = orow[i] / s[i]

    return njit(**_SERIAL, fastmath={"contract"})(slabs)


def _logsumexp_rows(x, out, n, lo, hi):
    """out[k] = logsumexp of the contiguous row ``x[k*n:(k+1)*n]``, k in [lo, hi): the reference's
    max (0 when infinite), log of the pairwise sum of exp(x - max), plus the max."""
    work = np.empty(384, np.int64)
    vals = np.empty(128, x.dtype)
    acc = np.empty(_LANES, x.dtype)
    scratch = np.empty(n, x.dtype)
    zero = zero_of(x)
    for k in range(lo, hi):
        p = k * n
        m = _row_max(x, p, n, acc)
        m = zero if (m == np.inf or m == -np.inf) else m
        _exp_into(x[p : p + n], m, scratch)
        out[k] = log_of(_pairwise_sum(scratch, 0, n, 1, work, vals)) + m


def _layer_norm_rows(x, w, b, has_w, has_b, eps, one, count, out, n, lo, hi):
    """Layer norm of the contiguous rows ``x[k*n:(k+1)*n]``, k in [lo, hi), as the reference computes it:
    mean = sum / n, c = x - mean, var = sum(c*c) / n, y = c * (1 / sqrt(var + eps)), then * w, + b
    (``eps``, ``one`` and ``count`` = n come in x's dtype: Numba would widen float32 with an int to
    float64)."""
    work = np.empty(384, np.int64)
    vals = np.empty(128, x.dtype)
    scratch = np.empty(n, x.dtype)
    for k in range(lo, hi):
        p = k * n
        mu = _pairwise_sum(x, p, n, 1, work, vals) / count
        xv = x[p : p + n]
        ov = out[p : p + n]
        for i in range(n):
            c = xv[i] - mu
            ov[i] = c
            scratch[i] = c * c
        var = _pairwise_sum(scratch, 0, n, 1, work, vals) / count
        rstd = one / np.sqrt(var + eps)
        # one pass, each product and sum rounded as the reference rounds it (no FMA contraction here)
        if has_w and has_b:
            for i in range(n):
                ov[i] = (ov[i] * rstd) * w[i] + b[i]
        elif has_w:
            for i in range(n):
                ov[i] = (ov[i] * rstd) * w[i]
        elif has_b:
            for i in range(n):
                ov[i] = ov[i] * rstd + b[i]
        else:
            for i in range(n):
                ov[i] = ov[i] * rstd


_NORM: dict = {}


def norm(name: str):
    """The dispatcher for ``name``: "softmax-rows", "log_softmax-rows", "softmax-slabs",
    "log_softmax-slabs", "logsumexp-rows", "layer_norm-rows"."""
    kernel = _NORM.get(name)
    if kernel is None:
        op_name, layout = name.rsplit("-", 1)
        if op_name == "logsumexp":
            kernel = njit(**_SERIAL, fastmath={"contract"})(_logsumexp_rows)
        elif op_name == "layer_norm":
            kernel = njit(**_SERIAL)(_layer_norm_rows)
        elif layout == "rows":
            kernel = _softmax_rows(op_name == "log_softmax")
        else:
            kernel = _softmax_slabs(op_name == "log_softmax")
        _NORM[name] = kernel
    return kernel


# -------------------------------------------------------------------------------------------- nll loss


@njit(**_SERIAL)
def nll_rows(x, t, weight, has_w, ignore_index, classes, inner, loss, w, bad, lo, hi):
    """The reference's per-row terms of nll_loss, read in place from the contiguous (N, C, inner) ``x``
    (row r: n = r // inner, s = r % inner): w[r] = weight of the target (1 without weights, 0 where
    ignored), loss[r] = -w[r] * x[n, t[r], s] (0 where w[r] == 0), r in [lo, hi). An out-of-range target
    sets ``bad[0]`` (the caller lets the reference raise)."""
    zero = zero_of(loss)
    one = zero + 1
    for r in range(lo, hi):
        c = np.int64(t[r])
        if c == ignore_index:
            w[r] = zero
            loss[r] = zero
            continue
        if c < 0 or c >= classes:
            bad[0] = 1
            w[r] = zero
            loss[r] = zero
            continue
        wr = weight[c] if has_w else one
        w[r] = wr
        n = r // inner
        s = r - n * inner
        loss[r] = -wr * x[(n * classes + c) * inner + s] if wr != zero else zero


# ---------------------------------------------------------------------------------------- convolution


@njit(**_SERIAL)
def im2col_2d(x, cols, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow, lo, hi):
    """cols[n, c*kh*kw + i*kw + j, y*ow + z] = x[n, c, y*sh - ph + i*dh, z*sw - pw + j*dw] (0 in the
    padding) for the (n, c) pairs t = n*C + c in [lo, hi); ``x`` (N, C, H, W) and ``cols``
    (N, C*kh*kw, oh*ow) contiguous. The valid output columns of each kernel offset are found once, so
    the copy loop has no bounds test."""
    _, c_in, h, w = x.shape
    zero = zero_of(x)
    for t in range(lo, hi):
        n = t // c_in
        c = t - n * c_in
        img = x[n, c]
        for i in range(kh):
            for j in range(kw):
                row = cols[n, (c * kh + i) * kw + j]
                off = j * dw - pw  # input column of output column z: z*sw + off
                z0 = 0 if off >= 0 else min(ow, (-off + sw - 1) // sw)
                z1 = max(z0, min(ow, (w - 1 - off) // sw + 1)) if w - 1 - off >= 0 else z0
                for y in range(oh):
                    r = y * sh - ph + i * dh
                    seg = row[y * ow : (y + 1) * ow]
                    if r < 0 or r >= h:
                        for z in range(ow):
                            seg[z] = zero
                        continue
                    src = img[r]
                    for z in range(z0):
                        seg[z] = zero
                    if sw == 1:
                        for z in range(z0, z1):
                            seg[z] = src[z + off]
                    else:
                        for z in range(z0, z1):
                            seg[z] = src[z * sw + off]
                    for z in range(z1, ow):
                        seg[z] = zero
