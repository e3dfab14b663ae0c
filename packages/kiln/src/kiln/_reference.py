"""The reference backend: device ``"cpu"`` and a NumPy kernel for every op.

It is the built-in plugin, registered through the same hooks as any other and loaded last, so any
installed plugin's kernel for ``"cpu"`` (kiln-cpu) takes precedence and the reference kernels serve
whatever that plugin leaves out. :func:`generic_kernel` also gives every device type the few kernels
that its storage contract alone can implement (allocation, host copies, random fills).
"""

from __future__ import annotations

import contextvars
import functools
import math
import threading
from collections.abc import Callable

import numpy as np

from kiln._dtype import COMPUTE_NUMPY
from kiln._tensor import Tensor, from_array


def _host_empty(numel: int, dtype, index=None) -> np.ndarray:
    return np.empty(numel, dtype.numpy)


def _host_from(array: np.ndarray, index=None) -> np.ndarray:
    return np.array(array, copy=True).reshape(-1)


def _host_write(storage: np.ndarray, start: int, array: np.ndarray) -> None:
    storage[start : start + array.size] = array


def _host_ptr(storage: np.ndarray) -> int:
    return storage.ctypes.data if storage.size else 0


def _host_memory_stats(index=None) -> dict:
    return {}


def _to_numpy_arg(a):
    if isinstance(a, Tensor):
        return a._numpy()
    if isinstance(a, (list, tuple)) and any(isinstance(t, Tensor) for t in a):  # index lists may hold None
        return [t._numpy() if isinstance(t, Tensor) else t for t in a]
    return a


def _arrays(args: tuple, positions: tuple):
    """``args`` with the tensors at ``positions`` (and in lists there) as NumPy arrays."""
    if not positions:
        return args
    args = list(args)
    for i in positions:
        args[i] = _to_numpy_arg(args[i])
    return args


def _quiet_floating_point():
    """Enter/exit callables that make NumPy compute IEEE specials (1/0, log(-1)) silently, as PyTorch
    does, and whether they set a context variable. NumPy's own ``errstate`` costs over a microsecond per
    call; setting its context variable directly costs a tenth of that, so use it where this NumPy has one."""
    try:
        from numpy._core._ufunc_config import _extobj_contextvar, _make_extobj

        ignore = _make_extobj(all="ignore")
        # a partial of the C method: no Python frame per call, as a lambda would have
        return functools.partial(_extobj_contextvar.set, ignore), _extobj_contextvar.reset, True
    except (ImportError, AttributeError, TypeError):  # another NumPy: the public way
        return (lambda: np.seterr(all="ignore")), (lambda old: np.seterr(**old)), False


_quiet_enter, _quiet_exit, _QUIET_IN_CONTEXT = _quiet_floating_point()


class _QuietRun(threading.local):
    """Per thread, ``run(fn, *args)``: ``fn(*args)`` with NumPy's floating point warnings off, in an empty
    context (made on the thread's first call) whose NumPy error state is set to ignore. Entering a context
    costs about a third of setting and resetting the variable (1,060 instructions less on a small ``add``),
    so the one-ufunc paths of the binary, unary and in-place kernels run through it. Only for a ufunc on
    plain ``ndarray`` operands, which runs no Python code: a subclass's ``__array_ufunc__`` or
    ``__array_wrap__`` (a memmap's), a signal handler or a trace function running in a Python callable
    could reach a kernel, and a context cannot be entered twice."""

    def __init__(self):
        if _QUIET_IN_CONTEXT:
            ctx = contextvars.Context()  # empty: a copy of the thread's would keep its variables' values alive
            ctx.run(_quiet_enter)
            self.run = ctx.run
        else:  # another NumPy (no context variable)
            self.run = lambda fn, *args: quiet(fn)(*args)


_quiet = _QuietRun()
_prod = math.prod


def quiet(fn: Callable) -> Callable:
    """``fn`` with NumPy's floating point warnings off (see :func:`_quiet_floating_point`)."""

    def quiet_kernel(*args):
        token = _quiet_enter()
        try:
            return fn(*args)
        finally:
            _quiet_exit(token)

    quiet_kernel.__name__ = getattr(fn, "__name__", "kernel")
    quiet_kernel.__doc__ = fn.__doc__
    return quiet_kernel


def wrap_reference(opdef, fast: Callable | None = None, min_numel: Callable[[], int] | None = None) -> Callable:
    """Turn a NumPy reference function into a kernel: tensors in as arrays, arrays out as tensors; with
    ``fast``, ``fast(spec, *args)`` first (for outputs of at least ``min_numel()`` elements, when given; see
    :func:`kiln.backend.reference_kernel`)."""
    fn = opdef.reference
    single = opdef.num_outputs == 1
    if opdef.device_generic:  # a view computes no floating point values: nothing for NumPy to warn of
        generic = fn if "view" in opdef.tags else quiet(fn)
        if fast is None:
            return generic

        def kernel(spec, *args):
            if min_numel is None or _prod((spec if single else spec[0])[0]) >= min_numel():
                r = fast(spec, *args)
                if r is not None:
                    return r
            return generic(spec, *args)

        kernel.__name__ = f"reference_{opdef.name}"
        return kernel
    positions = opdef.tensor_params
    if single:
        wrap = from_array
    else:

        def wrap(arrays, spec):
            return tuple(from_array(a, s.dtype) for a, s in zip(arrays, spec))

    # (ufunc, rest): the reference is ufunc(*tensors) when the tensor operands are arrays in the compute dtype of
    # the result and its other arguments are ``rest`` (add's alpha of 1, none for exp): called here, a frame less
    plain, plain_rest = (getattr(fn, "same_dtype_ufunc", None) if single else None) or (None, None)
    if positions == (0, 1):  # binary ops, the hot path: no argument list to build

        def kernel(spec, a, b, *rest):
            if fast is not None and (min_numel is None or _prod((spec if single else spec[0])[0]) >= min_numel()):
                r = fast(spec, a, b, *rest)
                if r is not None:
                    return r
            if isinstance(a, Tensor):
                a = a._numpy() if a._np is None else a._np  # the cached view, without a call
            if isinstance(b, Tensor):
                b = b._numpy() if b._np is None else b._np
            if plain is not None and a.__class__ is np.ndarray and b.__class__ is np.ndarray and rest == plain_rest:
                c = COMPUTE_NUMPY.get(spec.dtype)
                if a.dtype is c and b.dtype is c:
                    return from_array(_quiet.run(plain, a, b), spec.dtype)
            token = _quiet_enter()
            try:
                # positional calls for the usual arities: spreading *rest again costs ~100 ns
                if not rest:
                    r = fn(spec, a, b)
                elif len(rest) == 1:
                    r = fn(spec, a, b, rest[0])
                else:
                    r = fn(spec, a, b, *rest)
                return wrap(r, spec if wrap is not from_array else spec.dtype)
            finally:
                _quiet_exit(token)

    elif positions == (0,):  # unary ops, reductions: one tensor argument, first

        def kernel(spec, a, *rest):
            if fast is not None and (min_numel is None or _prod((spec if single else spec[0])[0]) >= min_numel()):
                r = fast(spec, a, *rest)
                if r is not None:
                    return r
            if isinstance(a, Tensor):
                a = a._numpy() if a._np is None else a._np
                taken = plain is not None and a.__class__ is np.ndarray and rest == plain_rest
                if taken and a.dtype is COMPUTE_NUMPY.get(spec.dtype):
                    return from_array(_quiet.run(plain, a), spec.dtype)
            else:
                a = _to_numpy_arg(a)  # a list of tensors (cat, stack)
            token = _quiet_enter()
            try:
                r = fn(spec, a, *rest) if rest else fn(spec, a)
                return wrap(r, spec if wrap is not from_array else spec.dtype)
            finally:
                _quiet_exit(token)

    else:

        def kernel(spec, *args):
            if fast is not None and (min_numel is None or _prod((spec if single else spec[0])[0]) >= min_numel()):
                r = fast(spec, *args)
                if r is not None:
                    return r
            args = _arrays(args, positions)
            token = _quiet_enter()
            try:
                return wrap(fn(spec, *args), spec if wrap is not from_array else spec.dtype)
            finally:
                _quiet_exit(token)

    kernel.__name__ = f"reference_{opdef.name}"
    kernel.__doc__ = f"NumPy reference kernel for {opdef.name}."
    return kernel


def kiln_register_devices(register):
    """Register the ``cpu`` device, whose storage is a 1-D NumPy array."""
    register(
        "cpu",
        empty=_host_empty,
        to_host=lambda storage: storage,
        from_host=_host_from,
        write=_host_write,
        data_ptr=_host_ptr,
        memory_stats=_host_memory_stats,
    )


def inplace_reference(opdef) -> Callable | None:
    """The reference's in-place kernel (``add_``: see ``kiln_register_kernels``) of an op whose reference
    can write its result into ``self``'s own array (``write_into``: ``add``, ``sub`` and ``mul`` as NumPy
    ufuncs with ``out=``; ``index_add``, ``index_copy``, ``index_fill``, ``index_put``, ``scatter``,
    ``scatter_add`` and ``masked_fill`` into the indexed elements alone), else None. It takes ``self`` where
    its array holds the compute dtype (not half precision, which computes in float32), and gives the
    reference's values, also where an operand shares memory with ``self``."""
    into = getattr(opdef.reference, "write_into", None)
    if into is None or opdef.num_outputs != 1:
        return None
    return _write_into_kernel(opdef, into)


def _write_into_kernel(opdef, into: Callable) -> Callable:
    """The in-place kernel running ``into(spec, self_array, *args)`` (the tensor arguments as arrays), which
    writes the reference's result of ``(self, *args)`` into ``self_array``."""
    positions = tuple(i - 1 for i in opdef.tensor_params if i > 0)
    write = quiet(into)
    # (ufunc, rest): as in wrap_reference, the write is ufunc(self, other, out=self) when ``other`` is an array in
    # the compute dtype and the other arguments are ``rest`` (add_'s alpha of 1): called here, three frames less
    plain, plain_rest = getattr(opdef.reference, "same_dtype_ufunc", None) or (None, None)
    if positions != (0,):
        plain = None

    def kernel(spec, a, *args):
        x = a._numpy() if a._np is None else a._np
        c = COMPUTE_NUMPY.get(spec.dtype)
        if x.dtype is not c:
            return None
        if plain is not None and x.__class__ is np.ndarray and args[1:] == plain_rest:
            b = args[0]
            if isinstance(b, Tensor):
                b = b._numpy() if b._np is None else b._np
                if b.__class__ is np.ndarray and b.dtype is c:
                    try:
                        _quiet.run(plain, x, b, x)  # (out=x)
                    except ValueError:  # a read-only self (tested only then: the flags cost a tenth of the call)
                        if x.flags.writeable:
                            raise
                        return None  # out of place, then the copy raises NumPy's error
                    return a
        if not x.flags.writeable:
            return None  # as above
        write(spec, x, *_arrays(args, positions))
        return a

    kernel.__name__ = f"reference_{opdef.name}_"
    kernel.__doc__ = f"NumPy reference in-place kernel for {opdef.name}_."
    kernel.plain_rest = None if plain is None else plain_rest  # the calls it makes in one ufunc pass: args[1:] == it
    return kernel


def kiln_register_kernels(register):
    """Register the NumPy reference kernel of every op for ``cpu``, and the in-place kernels of the ops
    with an in-place variant whose reference can write into ``self`` (:func:`inplace_reference`)."""
    from kiln import _ops  # noqa: F401 - defines every op
    from kiln._dispatch import OPS

    for opdef in OPS.values():
        if opdef.reference is not None:
            register(opdef.name, "cpu", wrap_reference(opdef))
            inplace = inplace_reference(opdef) if opdef.bind is not None else None
            if inplace is not None:
                register(opdef.name, "cpu", inplace, inplace=True)


def kiln_register_extensions(register):
    """Announce the core itself."""
    from kiln import __version__

    register("kiln", __version__, kind="core")


def generic_kernel(opdef, dev) -> Callable | None:
    """The op's kernel for any device type when it needs only metadata or the device contract
    (views, creation, copies: marked ``device_generic``), else None."""
    return quiet(opdef.reference) if opdef.device_generic else None
