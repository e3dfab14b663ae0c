"""The elementwise Numba loops: binary, unary (and dtype conversion), ternary and fused dropout, one small
dispatcher per memory layout built by a factory from an integer op code (:mod:`kiln_cpu._opcodes`).

Importing this module compiles nothing. The code is a closure constant, so Numba specialises the scalar
function (:mod:`kiln_cpu._jit_scalar_ops`) at typing time (no branch in the loop, the loop vectorises)
and caches each (op, layout, dtype) specialisation under its own key (the cache key hashes closure
contents).
"""

from __future__ import annotations

from numba import njit
from numba.extending import register_jitable

from kiln_cpu._jit_half import load, store
from kiln_cpu._jit_scalar_ops import binop, cast_value, ternop, unop
from kiln_cpu._jit_support import _SERIAL, STREAM_BLOCK, _u, prefetch_next
from kiln_cpu._opcodes import CAST, EQ, GE, POW, TRANSCENDENTAL

# ------------------------------------------------------------------------------- elementwise kernels
#
# Every loop is serial and takes a [lo, hi) range of its work: the kernels (kiln_cpu.kernels_*) split the
# work over a thread pool (nogil). Numba's parallel=True lowering measured 2.5x slower per thread here (its
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
def _start(offset, strides, i, j, k):
    """The position of element (i, j, k, 0) of a strided loop's operand: its offset plus the strides of
    its three outer dims (of four)."""
    return offset + i * strides[0] + j * strides[1] + k * strides[2]


def _make_binary(code, half):
    out_half = 0 if EQ <= code <= GE else half  # comparisons store bools
    # contract (FMA) only for pow's float64 polynomials: the other ops round as the reference, step by step
    opts = {**_SERIAL, "fastmath": {"contract"}} if code == POW else _SERIAL

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

    # In-place forms (``add_``): the result overwrites ``a``. One array read and written, where ``flat`` would
    # get the same array twice and LLVM's overlap check would send it to the loop's scalar form.
    def flat_inplace(a, b, c, lo, hi):
        """``a <op>= b``, both dense with the same layout, over [lo, hi)."""
        av = a[lo:hi]
        bv = b[lo:hi]
        for i in range(hi - lo):
            av[i] = store(out_half, binop(code, load(half, av[i]), load(half, bv[i]), c))

    def scalar_inplace(a, s, c, lo, hi):
        """``a <op>= s``, a dense array and a scalar in the compute dtype."""
        av = a[lo:hi]
        for i in range(hi - lo):
            av[i] = store(out_half, binop(code, load(half, av[i]), s, c))

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
        "flat": njit(**opts)(flat),
        "scalar": njit(**opts)(flat_scalar),
        "flat_inplace": njit(**opts)(flat_inplace),
        "scalar_inplace": njit(**opts)(scalar_inplace),
        "strided": njit(**opts)(strided),
    }


def _make_unary(code, hin, hout):
    # contract: the float64 polynomials of the float32 transcendentals may use FMA (more accurate,
    # faster); no unary op rounds a product before an addition that the reference keeps separate
    opts = {**_SERIAL, "fastmath": {"contract"}}

    # blocks with prefetching for the transcendentals; one flat loop for the rest, bound by the memory
    heavy = code in TRANSCENDENTAL

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

    def flat_inplace(a, lo, hi):
        """``a = op(a)`` over [lo, hi) of a dense array (``exp_``): one array, as the binary in-place loops."""
        block = STREAM_BLOCK // a.itemsize if heavy else 1 << 62
        for b in range(lo, hi, block):
            e = min(hi, b + block)
            prefetch_next(a, e, hi)
            av = a[b:e]
            for i in range(e - b):
                av[i] = store(hout, cast_value(hout, a, unop(code, load(hin, av[i]))))

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

    return {"flat": njit(**opts)(flat), "flat_inplace": njit(**opts)(flat_inplace), "strided": njit(**opts)(strided)}


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

    def flat_inplace(a, b, e, c, lo, hi):
        """The flat loop writing its result over ``a`` (a dense tensor: ``addcmul_``), one array read and
        written, as the binary in-place loops."""
        av = a[lo:hi]
        bv = b if s1 else b[lo:hi]
        ev = e if s2 else e[lo:hi]
        for i in range(hi - lo):
            x = load(k0, av[i])
            y = load(k1, bv[0] if s1 else bv[i])
            z = load(k2, ev[0] if s2 else ev[i])
            av[i] = store(hout, cast_value(hout, a, ternop(code, x, y, z, c)))

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

    return {
        "flat": njit(**_SERIAL)(flat),
        "flat_inplace": njit(**_SERIAL)(flat_inplace),
        "strided": njit(**_SERIAL)(strided),
    }


def ternary(code: int, layout: str, hout: int = 0, kinds: tuple = (0, 0, 0), scalars: tuple = (False,) * 3):
    """The dispatcher for ternary op ``code`` in ``layout`` ("flat", "flat_inplace", "strided"), see
    :func:`_make_ternary` (the strided loop reads scalars through stride 0: ``scalars`` only shapes the flat
    ones)."""
    key = (code, hout, kinds, scalars if layout != "strided" else (False,) * 3)
    kernels = _TERNARY.get(key)
    if kernels is None:
        kernels = _TERNARY[key] = _make_ternary(code, hout, kinds, key[3])
    return kernels[layout]


_BINARY: dict[tuple, dict] = {}
_UNARY: dict[tuple, dict] = {}
_TERNARY: dict[tuple, dict] = {}


def binary(code: int, layout: str, half: int = 0):
    """The dispatcher for binary op ``code`` in ``layout`` ("flat", "scalar", "flat_inplace", "scalar_inplace",
    "strided"); ``half``: F16 or BF16 for half-precision storages (uint16 views, computed in float32), else 0."""
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
    """The dispatcher for unary op ``code`` in ``layout`` ("flat", "flat_inplace", "strided"); ``half`` as for
    :func:`binary`."""
    return _unary_loops(code, half, half)[layout]


def cast(layout: str, hin: int = 0, hout: int = 0):
    """The dtype conversion loop in ``layout`` ("flat", "strided"): the unary loop of ``CAST``; ``hin`` /
    ``hout``: F16 or BF16 where the source / destination is half-precision bits (uint16), else 0 (the
    arrays' own dtypes)."""
    return _unary_loops(CAST, hin, hout)[layout]


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
