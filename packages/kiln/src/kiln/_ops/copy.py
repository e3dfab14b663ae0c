"""Copies and conversions: ``Tensor.to``, ``copy_``, ``fill_``, ``zero_``, and in-place autograd.

``_to_copy`` converts dtype and/or device; it is device-generic, built on the device contract
(``to_host``/``from_host``), so every device type can move data to and from the CPU without
registering anything. A device may register its own ``_to_copy`` to do better.

In-place ops all go through :func:`apply_inplace`: the result is computed out of place (recorded
by autograd as usual), written into ``self``'s storage, the shared version counter is bumped, and
``self`` takes over the result's history.
"""

from __future__ import annotations

import threading

import numpy as np

from kiln import _dtype as dt
from kiln._device import CPU, as_device
from kiln._device import device as Device
from kiln._dispatch import SparseArgument, call_below_autograd, op
from kiln._lazy import first_call
from kiln._ops._meta import astype, broadcast_pair, check_inplace, is_scalar
from kiln._ops.views import nograd_view_error
from kiln._public import make_binder
from kiln._reference import _quiet_enter, _quiet_exit
from kiln._spec import Spec
from kiln._state import away, modes_away, post_modes, state
from kiln._tensor import Tensor, _make, _numel, contiguous_strides, from_array, storage_span

# functions of the layers above, bound on first call (kiln._lazy): they import this module
_check_fits = first_call(globals(), "kiln._ops.creation", "_check_fits")
full = first_call(globals(), "kiln._ops.creation", "full")
rebind_saved_result = first_call(globals(), "kiln.autograd.graph", "rebind_saved_result")
_register_retain_grad = first_call(globals(), "kiln.autograd.graph", "_register_retain_grad")
rebase_view_history = first_call(globals(), "kiln.autograd.inplace", "rebase_view_history")
copy_node = first_call(globals(), "kiln.autograd.inplace", "copy_node")

TOP_LEVEL = ("copy_",)
"""The names ``kiln`` exports at its top level (as ``torch`` does)."""


def host_array(t: Tensor) -> np.ndarray:
    """A host NumPy view (CPU) or copy (other devices) of ``t``'s elements, in ``t``'s geometry."""
    if t._device is CPU:
        return t._numpy()
    from kiln._plugins import host_copy

    return host_copy(t)


def from_host(a: np.ndarray, dtype: dt.dtype, dev: Device) -> Tensor:
    """A new contiguous tensor on ``dev`` holding the host array ``a`` (cast to ``dtype``; out-of-range
    values wrap silently, as PyTorch's casts do). A tracer is told how to make another (no op made it)."""
    t = _from_host(a, dtype, dev)
    modes = post_modes()
    if modes:
        kept = np.array(a, copy=True)
        for mode in modes:
            mode.made_outside(t, lambda: _from_host(kept, dtype, dev))
    return t


def _from_host(a: np.ndarray, dtype: dt.dtype, dev: Device) -> Tensor:
    from kiln._reference import quiet

    if dev is CPU:
        return from_array(quiet(_host_copy)(a, dtype.numpy), dtype)
    from kiln._plugins import device_type

    contract = device_type(dev)
    flat = quiet(_host_copy)(a, dtype.numpy).reshape(-1)
    storage = contract.from_host(flat, dev.index)
    shape = tuple(a.shape)
    return _make(storage, shape, contiguous_strides(shape), 0, dtype, dev)


def _host_copy(a, np_dtype) -> np.ndarray:
    return np.array(a, dtype=np_dtype, order="C", copy=True)


def _to_copy_meta(input, dtype, device):
    return Spec((input._shape, dtype, device))


def _to_copy_kernel(spec, input, dtype, device):
    src = host_array(input)
    if device is CPU and input._device is CPU:
        return from_array(astype(src, dtype.numpy, copy=True), dtype)
    return from_host(src, dtype, device)


def _to_copy_backward(grad, input_device, input_dtype):
    return grad.to(input_device, input_dtype)


@op(tags=("copy",), meta=_to_copy_meta, reference=_to_copy_kernel, device_generic=True, backward=_to_copy_backward)
def _to_copy(input: Tensor, dtype: dt.dtype, device: Device) -> Tensor:
    """A copy of ``input`` with the given dtype on the given device."""


def _parse_to(self, args, kwargs):
    dtype = kwargs.pop("dtype", None)
    device = kwargs.pop("device", None)
    copy = kwargs.pop("copy", False)
    kwargs.pop("non_blocking", None)
    kwargs.pop("memory_format", None)
    if kwargs:
        raise TypeError(f"to() got unexpected keyword arguments {sorted(kwargs)}")
    flags: list[bool] = []
    for a in args:
        if isinstance(a, dt.dtype):
            dtype = a
        elif isinstance(a, Tensor):
            dtype, device = a._dtype, a._device
        elif isinstance(a, (str, Device, int)) and not isinstance(a, bool):
            device = a
        elif isinstance(a, bool):
            flags.append(a)  # to(dtype, non_blocking, copy) / to(device, dtype, non_blocking, copy)
        elif a is not None:
            raise TypeError(f"to() received an invalid combination of arguments - got {type(a).__name__}")
    if len(flags) > 1:
        copy = flags[1]
    return dtype, device, copy


def tensor_to(self: Tensor, *args, **kwargs) -> Tensor:
    """``Tensor.to``: a converted copy, or ``self`` when nothing changes and ``copy`` is False."""
    dtype, device, copy = _parse_to(self, args, dict(kwargs))
    dev = self._device if device is None else resolve_device(device)
    dtype = self._dtype if dtype is None else dtype
    if dtype is self._dtype and dev is self._device and not copy:
        return self
    return _to_copy(self, dtype, dev)


class _DefaultDevice(threading.local):
    """The device factory functions use when given none (``kiln.set_default_device``), per thread as in
    PyTorch; None means the CPU."""

    device: Device | None = None


_DEFAULT_DEVICE = _DefaultDevice()


def resolve_device(device) -> Device:
    """A user's device argument, checked against the registered device types, index filled in; None is the
    default device (:func:`kiln.set_default_device`)."""
    if device is None:
        return _DEFAULT_DEVICE.device or CPU
    d = as_device(device)
    if d is CPU:
        return d
    if d.type == "cpu":
        return CPU
    from kiln._plugins import device_type

    contract = device_type(d)
    if d.index is None:
        return Device(d.type, 0)
    n = contract.device_count()
    if d.index >= n:
        raise RuntimeError(f"{d.type} error: invalid device ordinal {d.index} (only {n} {d.type} devices)")
    return d


def to_device_raw(t: Tensor, dev: Device) -> Tensor:
    """Copy ``t`` to ``dev`` without autograd (the CPU fallback uses it)."""
    return _to_copy_kernel((t._shape, t._dtype, dev), t, t._dtype, dev)


def write_from_host(t: Tensor, src: np.ndarray) -> None:
    """Write host values into ``t``'s elements in place, on any device (no autograd, no version bump)."""
    if t._device is CPU:
        np.copyto(t._numpy(), src, casting="unsafe")
        return
    from kiln._plugins import device_type

    contract = device_type(t._device)
    if t.is_contiguous():
        contract.write(t._storage, t._offset, np.ascontiguousarray(src, dtype=t._dtype.numpy).reshape(-1))
        return
    # strided: read the spanned range, write the elements on the host, write the range back
    span = storage_span(t._shape, t._stride)
    buf = contract.to_host(t._storage)[t._offset : t._offset + span].copy()
    isz = t._dtype.itemsize
    view = np.ndarray(t._shape, buf.dtype, buf, 0, tuple(s * isz for s in t._stride))
    np.copyto(view, src, casting="unsafe")
    contract.write(t._storage, t._offset, buf)


# ---------------------------------------------------------------------------------------- copy_


def _copy_meta(self, src, non_blocking=False):
    if not isinstance(src, Tensor):
        raise TypeError(f"copy_(): argument 'src' (position 1) must be Tensor, not {type(src).__name__}")
    shape = broadcast_pair(self._shape, src._shape)
    if shape != self._shape:
        raise RuntimeError(f"output with shape {list(self._shape)} doesn't match the broadcast shape {list(shape)}")
    return Spec((self._shape, self._dtype, self._device))


def _copy_kernel(spec, self, src, non_blocking=False):
    """Reference ``copy_`` kernel: any source device into any destination device."""
    if self._device is CPU and src._device is CPU:
        _copy_on_host(self._numpy(), src._numpy())
    else:
        write_from_host(self, np.broadcast_to(host_array(src), self._shape))
    return self


@op(meta=_copy_meta, reference=_copy_kernel, device_generic=True, tags=("inplace",))
def _copy_from(self: Tensor, src: Tensor, non_blocking: bool = False) -> Tensor:
    """Kernel of ``copy_``: write ``src`` (broadcast, cast, from any device) into ``self``; returns ``self``.

    Not differentiable itself: ``copy_`` records autograd through :func:`apply_inplace`.
    """


def copy_into(dst: Tensor, src: Tensor) -> Tensor:
    """Kernel-level copy without autograd or version bump (for kernels filling fresh tensors); a tracer sees it
    when it runs outside a kernel (inside one, the modes are already below)."""
    call_below_autograd(_copy_from.op, (dst, src, False))
    return dst


def copy_(self: Tensor, src, non_blocking: bool = False) -> Tensor:
    """Copy ``src`` into ``self`` in place (broadcasting, casting, across devices); returns ``self``."""
    if not isinstance(src, Tensor):
        if is_scalar(src):
            return _fill(self, src, None, reads=1)
        from kiln._ops.creation import tensor

        src = tensor(src, dtype=self._dtype, device=self._device)
    _copy_meta(self, src)
    _check_no_overlap(self)
    _check_inplace_allowed(self)  # PyTorch's order: the leaf's error before the overlap's
    _check_partial_overlap(self, src)
    return _write(self, src, non_blocking)


def _write(
    self: Tensor, src: Tensor, non_blocking: bool = False, label: str | None = None, operands: tuple | None = None
) -> Tensor:
    """The body of ``copy_``, ``fill_`` and the in-place samplers: write ``src`` into ``self``, recording
    autograd if needed (a node named ``label``, PyTorch's ``FillBackward2``, ``NormalBackward0``..., by default
    ``copy_``'s, with an edge per tensor of ``operands``, the tensors the call read: ``(src,)`` by default)."""
    if state.grad_enabled and (
        self._requires_grad
        or (self._base is not None and self.requires_grad)
        or src._requires_grad
        or (src._base is not None and src.requires_grad)
    ):
        reads = (src,) if operands is None else operands
        return apply_inplace(self, lambda s: _copy_out_of_place(s, src, label, reads), needs_self=False)
    _check_inplace_allowed(self)
    if src._device is CPU and _writes_on_host(self):
        _copy_on_host(self._numpy(), src._numpy())
    else:
        call_below_autograd(_copy_from.op, (self, src, non_blocking))
    self._vc[0] += 1
    return self


def _copies_as_numpy(value, dtype: dt.dtype) -> bool:
    """Whether NumPy's cast of the Python number ``value`` into ``dtype``'s storage is what filling through a
    0-d tensor of ``dtype`` writes: a float or bool; an int a double holds exactly when ``dtype`` is floating
    (NumPy rounds a larger one through a double, twice); an int an int64 holds otherwise, and not a negative
    one into unsigned storage (NumPy refuses both: ``bool`` takes any int); never into bfloat16 (its bits are
    converted by the kernel)."""
    cls = value.__class__
    if cls is int:
        if dtype.is_floating_point:
            return -_EXACT_INT <= value <= _EXACT_INT and dtype._np is not None
        return (value >= 0 or dtype.is_signed) and value < _INT64_END  # NumPy takes an int64 (bool: any int)
    return (cls is float or cls is bool) and dtype._np is not None


_EXACT_INT = 2**53
_INT64_END = 2**63
_core_copy = [None]  # the cpu kernel of ``_copy_from`` last found to be the core's own


def _writes_on_host(self: Tensor) -> bool:
    """Whether ``copy_`` or ``fill_`` may write into ``self`` on the host without the dispatcher: it needs no
    gradient (autograd records nothing) and :func:`_host_writes`. ``s[i] = 1.0`` spent 13 us in the
    dispatcher and a 0-d tensor made for the value."""
    return not (self._requires_grad or (self._base is not None and self.requires_grad)) and _host_writes(self)


def _host_writes(self: Tensor) -> bool:
    """Whether a write into ``self`` below autograd may skip the dispatcher and copy on the host
    (:func:`_copy_on_host`), as the core's own ``_copy_from`` kernel does: ``self`` on the CPU, every thread
    in the default state (so no dispatch mode: a tracer sees every write), and no plugin kernel for
    ``_copy_from`` on ``cpu``."""
    if away[0] or self._device is not CPU:
        return False
    kernel = _copy_from.op.kernels.get("cpu")
    if kernel is not _core_copy[0]:
        from kiln._plugins import kernel_owner

        if kernel is None or kernel_owner("_copy_from", "cpu") != "kiln.reference":
            return False
        _core_copy[0] = kernel
    return True


def _copy_on_host(dst: np.ndarray, src) -> None:
    """The core's CPU copy (the ``_copy_from`` kernel's, and the writes that skip the dispatcher): ``src``
    (an array or a Python number) cast into ``dst``, broadcast, silently (NumPy's warnings off, as every
    reference kernel runs)."""
    token = _quiet_enter()
    try:
        np.copyto(dst, src, casting="unsafe")
    finally:
        _quiet_exit(token)


def _copy_out_of_place(s: Tensor, src: Tensor, label: str | None, operands: tuple) -> Tensor:
    """``src`` broadcast and cast to ``s``'s geometry, with the write's ``CopyBackwards`` node
    (:func:`kiln.autograd.inplace.copy_node`: named ``label``, an edge per tensor of ``operands``) where
    ``s`` or ``src`` requires grad. An integer or bool destination takes no history."""
    out = src.detach()
    if out._dtype is not s._dtype or out._device != s._device:
        out = out.to(s._device, s._dtype)
    if out._shape != s._shape:
        out = out.expand(s._shape)
    if (src.requires_grad or s.requires_grad) and s._dtype.is_floating_point:
        out._grad_fn = copy_node(s, src, label, operands)
        out._requires_grad = True
    return out


Tensor.copy_ = copy_


def fill_(self: Tensor, value) -> Tensor:
    """Set every element to ``value`` in place; returns ``self`` (overlapping elements are fine here)."""
    return _fill(self, value, "FillBackward2")


def _fill(self: Tensor, value, label: str | None, reads: int = 0) -> Tensor:
    """``fill_``, its autograd node named ``label`` for a number ``value`` (PyTorch's names: ``fill_`` gives
    ``FillBackward2``, ``zero_`` ``ZeroBackward0``; a 0-d tensor ``value`` gives ``FillBackward3``), with
    ``reads`` edges for the value (1 where PyTorch makes a tensor of it: ``copy_``, ``t[i] = 2.0``, whose
    node is ``copy_``'s: ``label`` None)."""
    if isinstance(value, Tensor):
        if value.dim() != 0:
            raise RuntimeError(
                f"fill_ only supports 0-dimension value tensor but got tensor with {value.dim()} dimensions."
            )
        return _write(self, value, label="FillBackward3")
    if not is_scalar(value):
        raise TypeError(f"fill_(): argument 'value' must be Number, not {type(value).__name__}")
    _check_fits(value, self._dtype, _numel(self._shape))  # as filling all of self (one element may round)
    if _copies_as_numpy(value, self._dtype) and _writes_on_host(self):
        _check_inplace_allowed(self)
        _copy_on_host(self._numpy(), value)
        self._vc[0] += 1
        return self
    src = full((), value, dtype=self._dtype, device=self._device)
    return _write(self, src, label=label, operands=(src,) * reads)


def zero_(self: Tensor) -> Tensor:
    """Set every element to zero in place; returns ``self``."""
    return _fill(self, 0, "ZeroBackward0")


Tensor.fill_ = fill_
Tensor.zero_ = zero_


# ---------------------------------------------------------------------------------------- in-place


def _check_inplace_allowed(self: Tensor, leaf_ok: bool = False) -> None:
    if self._inference and not state.inference:
        raise RuntimeError(
            "Inplace update to inference tensor outside InferenceMode is not allowed.You can make a clone to get a "
            "normal tensor before doing inplace update.See https://github.com/pytorch/rfcs/pull/17 for more details."
        )
    if leaf_ok or (away[0] and not state.grad_enabled):  # (the thread-local state read once, when set)
        return
    if self._requires_grad and self.grad_fn is None and self._base is None:
        raise RuntimeError("a leaf Variable that requires grad is being used in an in-place operation.")
    if self._nograd_view:
        raise nograd_view_error(self, base_written=False)
    if self._base is not None and self._base._requires_grad and self._base.grad_fn is None:
        raise RuntimeError("a view of a leaf Variable that requires grad is being used in an in-place operation.")


def _check_no_overlap(self: Tensor) -> None:
    """Writes that read what they write (``add_``, ``copy_``) are undefined where elements share memory
    (an empty tensor has no elements to share, whatever its strides: NumPy gives empty arrays stride 0)."""
    if 0 in self._shape:
        return
    for n, s in zip(self._shape, self._stride):
        if s == 0 and n > 1:
            raise RuntimeError(
                "unsupported operation: more than one element of the written-to tensor refers to a single memory "
                "location. Please clone() the tensor before performing the operation."
            )


def _check_partial_overlap(self: Tensor, src, full: bool = False) -> None:
    """PyTorch's check of a write's inputs (TensorIterator's): an input tensor that shares storage with the
    written-to ``self`` must read it either in the same places (the same tensor, or the same memory laid
    out alike) or not at all; ``full``: not at all (PyTorch's ``assert_no_overlap``, which the index writes
    apply to their indices and sources). Where either is not dense and free of internal overlap, PyTorch
    does not decide, and neither does this."""
    if not isinstance(src, Tensor):
        return
    if src is self:
        if full:
            raise RuntimeError(_OVERLAP_MESSAGE)
        return
    try:
        if src._storage is not self._storage:
            return
    except SparseArgument:  # a sparse COO tensor: no strided storage to share
        return
    n, m = _numel(self._shape), _numel(src._shape)
    if n == 0 or m == 0 or not _dense(self) or not _dense(src):
        return
    a, b = self._offset, src._offset
    if a == b and n == m:
        overlap = full or self._stride != src._stride
    else:
        overlap = a < b + m and b < a + n
    if overlap:
        raise RuntimeError(_OVERLAP_MESSAGE)


_OVERLAP_MESSAGE = (
    "unsupported operation: some elements of the input tensor and the written-to tensor refer to a single "
    "memory location. Please clone() the tensor before performing the operation."
)


def _dense(t: Tensor) -> bool:
    """Whether ``t``'s elements fill a block of memory, each once, in some dim order (PyTorch's
    ``is_non_overlapping_and_dense``)."""
    expected = 1
    for size, stride in sorted((p for p in zip(t._shape, t._stride) if p[0] != 1), key=lambda p: p[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def apply_inplace(self: Tensor, compute, needs_self: bool, label: str | None = None, operands: tuple = ()) -> Tensor:
    """Run an in-place op: ``compute(self_value)`` out of place, write it into ``self``, take its history.

    ``needs_self``: the op's backward formula reads ``self``'s old value, which the write destroys, so
    autograd is given a copy of it instead. A result that needs no gradient (the comparisons' ``eq_``)
    replaces ``self``'s values: ``self`` takes a node named ``label`` (PyTorch's ``EqBackward1``), which
    gives zeros to its old history and to the tensors of ``operands`` that require grad.
    """
    _check_inplace_allowed(self)
    recording = state.grad_enabled
    if recording and needs_self:  # the formula reads self's old value, for any input's gradient
        from kiln._ops.views import clone

        inp = clone(self)
    else:
        inp = self
    out = compute(inp)
    check_inplace(self, out._shape, out._dtype)
    if (
        recording
        and not out._requires_grad
        and self._dtype.is_floating_point
        and (
            self._requires_grad
            or (self._base is not None and self.requires_grad)
            or any(a.requires_grad for a in operands)
        )
    ):
        # overwritten by values that need no gradient: the old history (taken before the write) gets zeros
        out = out.detach()
        out._grad_fn = copy_node(self, None, label, operands)
        out._requires_grad = True
    if out._device is CPU and _host_writes(self):
        _copy_on_host(self._numpy(), out._numpy())
    else:
        call_below_autograd(_copy_from.op, (self, out.detach(), False))
    self._vc[0] += 1
    if recording and out._requires_grad:
        if self._base is not None:
            rebase_view_history(self, out)
        else:
            self._grad_fn = out._grad_fn
            self._output_nr = out._output_nr
            self._requires_grad = True
        rebind_saved_result(out._grad_fn, self)  # a later write to self must invalidate what backward reads
        if self._retains_grad:
            _register_retain_grad(self)  # .grad follows the new value
    return self


def _write_in_place(opdef, kernel, args: tuple, self: Tensor) -> Tensor | None:
    """Run an in-place kernel on the bound arguments (``self`` first) after the op's meta function, which
    raises the op's own errors; None (nothing written) where the result's shape or dtype is not ``self``'s
    or the kernel declines."""
    try:
        spec = opdef.meta(*args)
    except SparseArgument:
        return None
    if spec.shape != self._shape or spec.dtype is not self._dtype or kernel(spec, *args) is None:
        return None
    self._vc[0] += 1
    return self


def _check_overlaps(self: Tensor, a, kind: str) -> None:
    """The overlap check ``kind`` (``"partial"`` or ``"any"``) of an in-place op's argument ``a`` (a tensor, a
    list of them, or another value, which has none) with ``self``."""
    for t in a if isinstance(a, (list, tuple)) else (a,):
        _check_partial_overlap(self, t, kind == "any")


def inplace_variant(fn, name: str, doc: str, needs_self: bool, overlaps: dict | None = None):
    """The in-place method ``name`` of the out-of-place op ``fn`` (``add`` -> ``add_``).

    ``overlaps``: parameter name -> ``"partial"`` or ``"any"``, the overlap with ``self`` PyTorch refuses in
    that argument (a tensor, or a list of them: :func:`_check_partial_overlap`), or a function of the bound
    arguments returning one of those or None (none checked); by default every tensor argument of an
    elementwise op (tagged ``pointwise``) may not overlap partially, and nothing is checked for other ops.

    Where nothing is recorded (no autograd history to move, no dispatch mode) and the result has
    ``self``'s shape and dtype, a device's in-place kernel (``OpDef.inplace_kernels``) writes the result
    into ``self`` directly; otherwise, or where the kernel declines, the op runs out of place and its result
    is copied in."""
    opdef = fn.op
    differentiable = opdef._backward_needs is not None
    # a record that names the node of an op with no formula by a function: PyTorch's in-place form replaces
    # self's values with a zero gradient (the comparisons: eq_ gives EqBackward0/1; see kiln._dispatch.op)
    replaces = not differentiable and callable(opdef.grad_fn_name)
    leaf_ok = not differentiable and not replaces  # logical_and_...: nothing recorded, so even a leaf may be written
    if overlaps is None:
        pointwise = "pointwise" in opdef.tags
        overlaps = {opdef.param_names[i]: "partial" for i in opdef.tensor_params[1:]} if pointwise else {}
    checks = tuple((opdef.param_names.index(p), kind) for p, kind in overlaps.items())
    kernels = opdef.inplace_kernels
    if opdef.bind is None:
        opdef.bind = make_binder(opdef)
    bind = opdef.bind

    def method(self, *args, **kwargs):
        moded = away[0]  # the thread-local state is read only when some thread is away from the defaults
        if modes_away[0] and state.pre_autograd_modes:  # autocast casts out-of-place ops only, as in PyTorch
            saved, state.pre_autograd_modes = state.pre_autograd_modes, ()
            try:
                return method(self, *args, **kwargs)
            finally:
                state.pre_autograd_modes = saved
        bound = bind(self, *args, **kwargs)  # a wrong argument: the TypeError comes first, as in PyTorch
        if 0 in self._stride:  # (only a stride of 0 can make elements share memory)
            _check_no_overlap(self)
        recording = False
        if (differentiable or replaces) and (not moded or state.grad_enabled):
            for a in bound:  # self first; (a loop, not any() over a generator: a frame less per argument)
                # requires_grad's property only for a view (its base may have been written since) and a subclass
                # (a sparse tensor has no _base to read)
                if isinstance(a, Tensor) and (
                    a.requires_grad
                    if a.__class__ is not Tensor
                    else a._requires_grad or (a._base is not None and a.requires_grad)
                ):
                    recording = True
                    break
        _check_inplace_allowed(self, leaf_ok)
        for i, kind in checks:  # the overlaps with self PyTorch refuses, after the checks above (its order)
            a = bound[i]
            if a.__class__ is Tensor and a._storage is not self._storage:
                continue  # its memory lies elsewhere (the usual case, decided without a call)
            if callable(kind):
                kind = kind(bound)
            if kind is not None:
                _check_overlaps(self, a, kind)
        if recording and replaces:
            read = tuple(a for a in bound[1:] if isinstance(a, Tensor))
            return apply_inplace(self, lambda s: fn(s, *args, **kwargs), False, opdef.grad_fn_name(bound), read)
        if recording:
            return apply_inplace(self, lambda s: fn(s, *args, **kwargs), needs_self)
        if kernels and (not modes_away[0] or not state.post_autograd_modes):
            kernel = kernels.get(self._device.type)
            if kernel is not None and (differentiable or self.grad_fn is None or (moded and not state.grad_enabled)):
                done = _write_in_place(opdef, kernel, bound, self)
                if done is not None:
                    return done
        out = fn(self, *args, **kwargs)
        check_inplace(self, out._shape, out._dtype)
        node = None
        if not differentiable and not replaces and self.grad_fn is not None and state.grad_enabled:
            # its values no longer depend on the old history, which gets zeros
            node = copy_node(self, None, opdef.grad_fn_name, through_base=False)
        call_below_autograd(_copy_from.op, (self, out, False))
        self._vc[0] += 1
        if node is not None:
            self._grad_fn, self._output_nr = node, 0
        return self

    method.__name__ = method.__qualname__ = name
    method.__doc__ = doc
    sig = fn.__signature__  # the op's, less ``out=`` (an in-place op writes into self)
    method.__signature__ = sig.replace(parameters=[p for p in sig.parameters.values() if p.name != "out"])
    return method


def view_as_dtype(self: Tensor, dtype: dt.dtype) -> Tensor:
    """Reinterpret the bytes as ``dtype`` (same element size only)."""
    if dtype.itemsize != self._dtype.itemsize:
        raise RuntimeError(
            f"view(dtype): cannot reinterpret {self._dtype} ({self._dtype.itemsize} bytes) as {dtype} "
            f"({dtype.itemsize} bytes); kiln supports only equal element sizes"
        )
    if self._device is not CPU:
        raise RuntimeError("view(dtype) is only supported on the CPU")
    for mode in post_modes():  # made outside the dispatcher: a tracer cannot replay it (kiln.compile runs eagerly)
        mode.host_read(self, "view(dtype)")
    # not an autograd view (PyTorch's view(dtype) has no _base): it takes no history from self's, ever
    v = _make(self._storage.view(dtype.numpy), self._shape, self._stride, self._offset, dtype, self._device, self._vc)
    v._inference = self._inference
    return v
