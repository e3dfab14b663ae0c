"""NumPy's BLAS ``cblas_sgemm`` / ``cblas_dgemm`` called from Numba code, without the GIL.

A kernel that alternates its own loops with products (a convolution block: im2col, then a product)
runs whole on each thread of the team: no thread takes the GIL between its loops and its products, so
none sleeps waiting for it (a wake costs 40 us or more on a virtual machine; Python glue around
``np.matmul`` on two threads lost up to half of the second thread).

The function's address is an argument (found by :func:`kiln_cpu._blas.gemm_function`), so the
compiled code holds no process-specific pointer and caches to disk. CBLAS takes its enums as C ints and
its sizes as ``blasint``: 64-bit in ILP64 builds (NumPy's wheels), 32-bit otherwise (``ilp64``; the
callers' blocks are far below 2**31 elements).
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from kiln_cpu._jit_support import _SERIAL

ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112  # CBLAS's enum values


def _gemm_intrinsic(int_bits: int):
    """An intrinsic calling a cblas ``?gemm`` at an address with ``int_bits``-wide sizes."""

    @intrinsic
    def call(typingctx, addr, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        if not isinstance(alpha, types.Float) or alpha != beta:
            return None
        if not all(isinstance(p, types.CPointer) and p.dtype == alpha for p in (a, b, c)):
            return None
        sig = types.none(addr, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)

        def codegen(context, builder, signature, args):
            """``inttoptr`` of the address to the C signature, sizes cast to ``blasint``, one call."""
            i32, isz = ir.IntType(32), ir.IntType(int_bits)
            real = context.get_value_type(signature.args[6])
            ptr = real.as_pointer()
            fnty = ir.FunctionType(
                ir.VoidType(), [i32, i32, i32, isz, isz, isz, real, ptr, isz, ptr, isz, real, ptr, isz]
            )

            def integer(i, width):
                """Argument ``i`` as a ``width``-bit C integer."""
                value = context.cast(builder, args[i], signature.args[i], types.int64)
                return builder.trunc(value, ir.IntType(width)) if width < 64 else value

            address = integer(0, 64)
            fn = builder.inttoptr(address, fnty.as_pointer())
            m_, n_, k_, lda_, ldb_, ldc_ = (integer(i, int_bits) for i in (3, 4, 5, 8, 10, 13))
            alpha_, a_, b_, beta_, c_ = args[6], args[7], args[9], args[11], args[12]
            order = i32(ROW_MAJOR)
            builder.call(
                fn, [order, integer(1, 32), integer(2, 32), m_, n_, k_, alpha_, a_, lda_, b_, ldb_, beta_, c_, ldc_]
            )
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
