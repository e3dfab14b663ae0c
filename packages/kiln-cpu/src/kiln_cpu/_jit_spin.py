"""The spin-waits of kiln-cpu's thread team (:mod:`kiln_cpu._threads`), in Numba so that they run without
the GIL: a waiting thread reads a counter with an atomic acquire load, a CPU pause between reads, and
the GIL stays free for the thread that is about to write it. A worker reports its job done with a
release store from inside its spin (:func:`finish_then_spin`), so by the time the caller sees it, the
worker has let the GIL go: the caller never sleeps on the GIL."""

from __future__ import annotations

import platform

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


@intrinsic
def _load_acquire(typingctx, arr):
    """``arr[0]`` (an int64 array) read with an atomic acquire load: never hoisted out of a loop, and it
    sees the other thread's store."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64):
        return None

    def codegen(context, builder, signature, args):
        """One ``load atomic acquire`` of the first element."""
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.load_atomic(ary.data, ordering="acquire", align=8)

    return types.int64(arr), codegen


@intrinsic
def _store_release(typingctx, arr, index, value):
    """``arr[index] = value`` (an int64 array) with an atomic release store: every write before it is
    visible to a thread that sees this one."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64):
        return None

    def codegen(context, builder, signature, args):
        """One ``store atomic release`` of element ``index``."""
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = builder.gep(ary.data, [args[1]])
        builder.store_atomic(args[2], ptr, ordering="release", align=8)
        return context.get_dummy_value()

    return types.none(arr, types.int64, types.int64), codegen


@intrinsic
def _load_acquire_at(typingctx, arr, index):
    """``arr[index]`` (an int64 array) read with an atomic acquire load."""
    if not (isinstance(arr, types.Array) and arr.dtype == types.int64):
        return None

    def codegen(context, builder, signature, args):
        """One ``load atomic acquire`` of element ``index``."""
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.load_atomic(builder.gep(ary.data, [args[1]]), ordering="acquire", align=8)

    return types.int64(arr, types.int64), codegen


@intrinsic
def _pause(typingctx):
    """The CPU's spin-wait hint (x86 ``pause``; nothing elsewhere)."""

    def codegen(context, builder, signature, args):
        """A call of ``llvm.x86.sse2.pause`` on x86."""
        if _X86:
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse2.pause"
            )
            builder.call(fn, [])
        return context.get_dummy_value()

    return types.none(), codegen


@njit(cache=True, nogil=True)
def spin_below(counter, target, spins, settle):
    """Spin while ``counter[0] < target``, at most ``spins`` pauses; then ``settle`` more pauses when it
    got there (time for the writer to release the GIL). Returns the counter's last value."""
    v = _load_acquire(counter)
    i = 0
    while v < target and i < spins:
        _pause()
        v = _load_acquire(counter)
        i += 1
    if v >= target:
        for _ in range(settle):
            _pause()
    return v


@njit(cache=True, nogil=True)
def all_reached(slots, target, spins):
    """Spin until every ``slots[i] >= target``, at most ``spins`` pauses; whether they all got there."""
    i = 0
    w = 0
    while w < slots.size:
        if _load_acquire_at(slots, w) >= target:
            w += 1
        elif i < spins:
            _pause()
            i += 1
        else:
            return False
    return True


@njit(cache=True, nogil=True)
def finish_then_spin(slots, w, done, counter, target, spins, settle):
    """``slots[w] = done`` (a release store: the worker's job is done), then :func:`spin_below` on
    ``counter`` for the next job, all without the GIL."""
    _store_release(slots, w, done)
    return spin_below(counter, target, spins, settle)
