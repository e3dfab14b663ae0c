"""A cblas ``?gemm`` (NumPy's OpenBLAS, or Intel MKL's) called from Numba code, without the GIL.

A kernel that alternates its own loops with products (a convolution block: im2col, then a product)
runs whole on each thread of the team: no thread takes the GIL between its loops and its products, so
none sleeps waiting for it (a wake costs 40 us or more on a virtual machine; Python glue around
``np.matmul`` on two threads lost up to half of the second thread).

MKL's products (:mod:`kiln_cpu._mkl`) come here too, for their cost: :func:`mkl_product` reads the
operands' layouts, sets MKL's thread count for the calling thread, calls the gemm and restores the count,
in about 0.5 us; the same steps through ctypes took about 8 us (five ctypes calls, three ``.ctypes``
objects), more than MKL saves over OpenBLAS on a small product.

Each function's address is an argument (found by :func:`kiln_cpu._blas.gemm_function` and
:mod:`kiln_cpu._mkl`), so the compiled code holds no process-specific pointer and caches to disk. CBLAS
takes its enums as C ints and its sizes as ``blasint``: 64-bit in ILP64 builds (NumPy's wheels), 32-bit
otherwise (``ilp64``; MKL's ``libmkl_rt`` by default, LP64; the callers' blocks are far below 2**31
elements).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from kiln_cpu._jit_support import _SERIAL

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112  # CBLAS's enum values


def _c_call(context, builder, signature, args, int_bits: int = 32, enums=(), lead=(), returns=None):
    """One call of the C function at the address ``args[0]`` with the C ints ``lead`` (CBLAS's row-major
    order) and then ``args[1:]``: integer arguments whose positions are in ``enums`` as C ints, other
    integers as ``int_bits``-wide ones (``blasint``), reals and pointers as they are; ``returns``: the
    C result's LLVM type (None: void)."""
    values, kinds = [], []
    for i in range(1, len(args)):
        typ, value = signature.args[i], args[i]
        if isinstance(typ, types.Integer):
            width = 32 if i in enums else int_bits
            value = context.cast(builder, value, typ, types.int64)
            value = builder.trunc(value, ir.IntType(width)) if width < 64 else value
        values.append(value)
        kinds.append(value.type)
    i32 = ir.IntType(32)
    fnty = ir.FunctionType(returns or ir.VoidType(), [i32] * len(lead) + kinds)
    address = context.cast(builder, args[0], signature.args[0], types.int64)
    fn = builder.inttoptr(address, fnty.as_pointer())
    return builder.call(fn, [i32(v) for v in lead] + values)


def _gemm_types_ok(alpha, beta, pointers) -> bool:
    """Whether a gemm's scalars are one float type and its matrices pointers to it."""
    return (
        isinstance(alpha, types.Float)
        and alpha == beta
        and all(isinstance(p, types.CPointer) and p.dtype == alpha for p in pointers)
    )


def _gemm_intrinsic(int_bits: int):
    """An intrinsic calling a cblas ``?gemm`` at an address with ``int_bits``-wide sizes."""

    @intrinsic
    def call(typingctx, addr, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        if not _gemm_types_ok(alpha, beta, (a, b, c)):
            return None
        sig = types.none(addr, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)

        def codegen(context, builder, signature, args):
            """``inttoptr`` of the address to the C signature, sizes cast to ``blasint``, one call."""
            _c_call(context, builder, signature, args, int_bits, enums=(1, 2), lead=(ROW_MAJOR,))
            return context.get_dummy_value()

        return sig, codegen

    return call


_gemm64 = _gemm_intrinsic(64)
_gemm32 = _gemm_intrinsic(32)


@njit(**_SERIAL)
def gemm(addr, ilp64, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    """``C = alpha * op(A) @ op(B) + beta * C`` in row-major order by the cblas ``?gemm`` at ``addr``
    (``ta``/``tb``: :data:`NO_TRANS` or :data:`TRANS`; ``a``, ``b``, ``c``: pointers to the first
    elements: :func:`ptr`)."""
    if ilp64:
        _gemm64(addr, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
    else:
        _gemm32(addr, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)


@intrinsic
def ptr(typingctx, arr, index):
    """A pointer ``index`` elements past the first element of ``arr`` (any layout: the caller computes
    the offset from the strides; no bounds check)."""
    if not (isinstance(arr, types.Array) and isinstance(index, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        """``gep`` on the array's data pointer."""
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.gep(ary.data, [args[1]])

    return types.CPointer(arr.dtype)(arr, index), codegen


@intrinsic
def _call_int(typingctx, addr, value):
    """``f(value)`` for the C function ``int f(int)`` at ``addr`` (MKL's ``MKL_Set_Num_Threads_Local``)."""
    if not (isinstance(addr, types.Integer) and isinstance(value, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        """``inttoptr`` of the address to ``int (*)(int)``, one call, the result widened to 64 bits."""
        result = _c_call(context, builder, signature, args, enums=(1,), returns=ir.IntType(32))
        return builder.sext(result, ir.IntType(64))

    return types.int64(addr, value), codegen


@intrinsic
def _gemm_batch32(typingctx, addr, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, batch):
    """MKL's ``cblas_?gemm_batch_strided`` at ``addr`` (32-bit sizes, row-major): ``batch`` products,
    operand ``i`` at ``a + i * sa``, ``b + i * sb``, ``c + i * sc``."""
    if not _gemm_types_ok(alpha, beta, (a, b, c)):
        return None
    sig = types.none(addr, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, batch)

    def codegen(context, builder, signature, args):
        """``inttoptr`` of the address to the C signature, sizes cast to 32 bits, one call."""
        _c_call(context, builder, signature, args, 32, enums=(1, 2), lead=(ROW_MAJOR,))
        return context.get_dummy_value()

    return sig, codegen


@njit(**_SERIAL)
def operand(rows, cols, s0, s1):
    """(transpose flag, leading dimension) with which a row-major CBLAS call reads a ``rows`` x ``cols``
    matrix of element strides ``s0``, ``s1``; (0, 0) when neither dim has unit stride (or a broadcast
    stride of 0 stands where a leading dimension must be positive)."""
    if (s1 == 1 or cols == 1) and (rows == 1 or s0 >= max(cols, 1)):
        return NO_TRANS, s0 if rows > 1 else max(cols, 1)
    if (s0 == 1 or rows == 1) and (cols == 1 or s1 >= max(rows, 1)):
        return TRANS, s1 if cols > 1 else max(rows, 1)
    return 0, 0


@njit(**_SERIAL)
def mkl_product(gemm, batch_gemm, set_threads, threads, alpha, beta, a, b, out):
    """``out[...] = alpha * (a @ b) + beta * out`` by MKL (``out`` not read when ``beta`` is 0): 2-d
    operands by the ``cblas_?gemm`` at ``gemm``, 3-d ones (one batch size, ``out`` C-contiguous) by the
    ``cblas_?gemm_batch_strided`` at ``batch_gemm`` (0: none, which takes only a batch of one), on
    ``threads`` MKL threads for the calling thread (``set_threads``: ``MKL_Set_Num_Threads_Local``, whose
    earlier setting comes back after). Returns False, writing nothing, where MKL cannot take the call: an
    operand it cannot read as it is, a batch without ``batch_gemm``, or a size, leading dimension, batch
    stride or count past its 32-bit integers."""
    isz = a.itemsize
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    ta, lda = operand(m, k, a.strides[a.ndim - 2] // isz, a.strides[a.ndim - 1] // isz)
    tb, ldb = operand(k, n, b.strides[b.ndim - 2] // isz, b.strides[b.ndim - 1] // isz)
    count = a.shape[0] if a.ndim == 3 else 1
    sa = a.strides[0] // isz if a.ndim == 3 else 0
    sb = b.strides[0] // isz if b.ndim == 3 else 0
    if ta == 0 or tb == 0 or sa < 0 or sb < 0 or (count > 1 and batch_gemm == 0):
        return False
    if max(lda, ldb, sa, sb, m * n, count) >= 1 << 31:  # past MKL's 32-bit sizes (LP64)
        return False
    saved = _call_int(set_threads, threads)
    alpha_, beta_ = a.dtype.type(alpha), a.dtype.type(beta)
    if count == 1:
        _gemm32(gemm, ta, tb, m, n, k, alpha_, ptr(a, 0), lda, ptr(b, 0), ldb, beta_, ptr(out, 0), n)
    else:  # a batch stride of 0 (an expanded operand) reads one matrix for every product
        _gemm_batch32(
            batch_gemm,
            ta,
            tb,
            m,
            n,
            k,
            alpha_,
            ptr(a, 0),
            lda,
            sa,
            ptr(b, 0),
            ldb,
            sb,
            beta_,
            ptr(out, 0),
            n,
            m * n,
            count,
        )
    _call_int(set_threads, saved)
    return True


@njit(**_SERIAL)
def blas_product(addr, ilp64, alpha, beta, a, b, out):
    """``out[...] = alpha * (a @ b) + beta * out`` for 2-d operands by the cblas ``?gemm`` at ``addr``
    (``out`` C-contiguous, not read when ``beta`` is 0); an operand BLAS cannot read as it is (neither dim of
    unit stride) is copied to row-major first. Whole programs call it (:mod:`kiln_cpu.whole`)."""
    isz = a.itemsize
    m, k, n = a.shape[0], a.shape[1], b.shape[1]
    ta, lda = operand(m, k, a.strides[0] // isz, a.strides[1] // isz)
    tb, ldb = operand(k, n, b.strides[0] // isz, b.strides[1] // isz)
    ac = np.ascontiguousarray(a) if ta == 0 else a
    bc = np.ascontiguousarray(b) if tb == 0 else b
    if ta == 0:
        ta, lda = NO_TRANS, max(k, 1)
    if tb == 0:
        tb, ldb = NO_TRANS, max(n, 1)
    alpha_, beta_ = a.dtype.type(alpha), a.dtype.type(beta)
    gemm(addr, ilp64, ta, tb, m, n, k, alpha_, ptr(ac, 0), lda, ptr(bc, 0), ldb, beta_, ptr(out, 0), max(n, 1))


@njit(**_SERIAL)
def mkl_or_copies(gemm_addr, batch_gemm, set_threads, threads, alpha, beta, a, b, out):
    """:func:`mkl_product` of 2-d operands, with row-major copies of them where MKL cannot read them as they are."""
    if not mkl_product(gemm_addr, batch_gemm, set_threads, threads, alpha, beta, a, b, out):
        mkl_product(
            gemm_addr,
            batch_gemm,
            set_threads,
            threads,
            alpha,
            beta,
            np.ascontiguousarray(a),
            np.ascontiguousarray(b),
            out,
        )
