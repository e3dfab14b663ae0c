"""Building blocks every jitted module shares: the compile flags, IEEE bit casts, ``maxnum``, the
prefetch helpers, literal op codes at typing time, ``zero_of`` and the unsigned index cast ``_u``.

Numba invalidates a cached kernel by the timestamp of the file that defines it, not of the files whose
jitted helpers it inlines: an installed release rewrites every file, and nox keys its cache folder by a
digest of all of kiln-cpu's sources, so an edit here never leaves stale machine code behind.
"""

from __future__ import annotations

import os

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload, register_jitable


def _lock_cache_index() -> None:
    """Serialise Numba's on-disk cache index across processes (an exclusive ``flock`` on a file beside
    it, where the platform has one). Numba reads the index, picks the first free data file name and
    writes both back: two processes compiling specialisations of one function at once (pytest-xdist's
    workers, over nox's shared cache) could pick the same name, and the index then mapped one's
    signature to the other's machine code, which a later process loaded and failed to call ("can't
    unbox array"). Under the lock each reads what the other wrote."""
    try:
        import fcntl

        from numba.core.caching import IndexDataCacheFile
    except ImportError:  # no flock (Windows), or a Numba without this class: as Numba is
        return
    if getattr(IndexDataCacheFile.save, "kiln_locked", False):
        return

    def locked(method):
        def run(self, *args):
            try:
                fh = open(os.path.join(self._cache_path, ".kiln-index.lock"), "a")  # noqa: SIM115
            except OSError:  # a read-only cache folder: Numba's own handling
                return method(self, *args)
            with fh:
                fcntl.flock(fh, fcntl.LOCK_EX)
                return method(self, *args)  # closing the file releases the lock

        run.kiln_locked = True
        run.__name__ = method.__name__
        return run

    IndexDataCacheFile.save = locked(IndexDataCacheFile.save)
    IndexDataCacheFile.load = locked(IndexDataCacheFile.load)


_lock_cache_index()

_SERIAL = {"cache": True, "nogil": True, "error_model": "numpy"}
_UNCOUNTED = {**_SERIAL, "_nrt": False}
"""The flags of a helper that a loop calls once per row or run, passing it arrays: its own compiled
function, without Numba's reference counting. A compiled function counts a reference to each array it
is passed on entry and drops it on return, one atomic operation each, and LLVM's pruning removes the
pair only in simple functions: a 16-element row's pairwise sum cost 50 ns a call, 6 ns without. Such a
helper allocates nothing (without reference counting it cannot) and only reads and writes the arrays
its caller holds."""

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


def _const_code(code):
    value = getattr(code, "literal_value", None)
    return value if isinstance(value, int) else None


def zero_of(a):
    """The zero of array ``a``'s dtype (jitted only)."""
    raise NotImplementedError


@overload(zero_of)
def _zero_of_impl(a):
    zero = np.dtype(str(a.dtype)).type(0)
    return lambda a: zero


@register_jitable
def _u(i):
    """Index ``i`` as uint64: Numba wraps negative signed indices, and that per-element select blocks
    vectorisation."""
    return np.uint64(i)
