"""The reduction loops (sum, amax, amin): NumPy's pairwise summation tree, the vectorised max/min folds
of a float's integer view, and the rows / columns / slabs layouts."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload, register_jitable

from kiln_cpu._jit_scalar_ops import binop
from kiln_cpu._jit_support import _SERIAL, _UNCOUNTED, _u, zero_of
from kiln_cpu._opcodes import ADD, AMAX, AMIN, MAXIMUM, MINIMUM, SUM

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


# ---------------------------------------------------------------------------------- a row's pairwise sum


@njit(**_UNCOUNTED)
def _row_sum(a, lo, n, work, vals):
    """``np.sum`` of one contiguous run as a reduction gives it, 0 + the pairwise sum, with thirty-two
    running sums per leaf (:func:`kiln_cpu._jit_reduce._pairwise_sum`): bit for bit up to 128 elements."""
    return zero_of(a) + _pairwise_sum(a, lo, n, 1, work, vals)
