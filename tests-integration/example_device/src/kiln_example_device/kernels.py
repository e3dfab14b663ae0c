"""Kernels of the example device: exactly kiln's primitive set (``kiln.backend.primitives()``).

kiln calls a kernel as ``kernel(spec, *args)``: ``spec`` is what the op's meta function worked out, a
:class:`kiln.backend.Spec` read by name — ``spec.shape``, ``spec.dtype``, ``spec.device`` of the result,
and the extras of the op's family (the comparison ops' ``spec.compute_dtype``, reductions'
``spec.dims``) — and ``args`` are the op's arguments, tensors still tensors. All argument checking happened in the meta function, before the kernel runs.

A kernel allocates its result on the device, reads its inputs in place through their strides and
storage offset (views are never copied first), and returns the result tensor. The primitives without
a hand-written kernel run kiln's reference kernels on NumPy views of the device memory
(:func:`reference_on_device`). Every op not listed in :data:`KERNELS` runs through its decomposition
into other ops, on the device.
"""

from __future__ import annotations

import numpy as np

import kiln
from kiln.backend import from_array, host_view, op, primitives, reference_kernel
from kiln_example_device.device import NAME

__all__ = ["KERNELS", "device_array", "new_output"]

FLOATS = (kiln.float32, kiln.float64)


def device_array(t: kiln.Tensor) -> np.ndarray:
    """A tensor's elements as a NumPy view of its device buffer: its shape, strides and offset, no copy.

    A 0-d CPU tensor may meet device tensors in one op (as in PyTorch); it is read on the host.
    """
    if t.device.type != NAME:
        return t.numpy()
    memory = t.untyped_storage().array()
    itemsize = memory.itemsize
    return np.lib.stride_tricks.as_strided(
        memory[t.storage_offset() :],
        shape=tuple(t.shape),
        strides=tuple(s * itemsize for s in t.stride()),
    )


def new_output(spec) -> tuple[kiln.Tensor, np.ndarray]:
    """A fresh contiguous result tensor for ``spec`` on the device, and a writable view of its memory."""
    out = kiln.empty(spec.shape, dtype=spec.dtype, device=spec.device)
    return out, device_array(out)


def operand(x, np_dtype) -> np.ndarray:
    """A tensor (read in place) or a Python number, in the dtype the op computes in.

    Python integers wrap into integer dtypes as in PyTorch (``uint8_tensor + -3`` adds 253).
    """
    if isinstance(x, kiln.Tensor):
        a = device_array(x)
        return a if a.dtype == np_dtype else a.astype(np_dtype)
    return np.array(x).astype(np_dtype)[()]


# ---------------------------------------------------------------------------------------- elementwise


def _binary(np_fn, *, compute_field: str = "dtype"):
    """A kernel ``out = np_fn(input, other)`` computed in the dtype of the spec's field ``compute_field``
    (the result's dtype, or a comparison's ``compute_dtype``)."""

    def kernel(spec, input, other):
        out, dst = new_output(spec)
        compute = np.dtype(getattr(spec, compute_field).numpy)
        dst[...] = np_fn(operand(input, compute), operand(other, compute))
        return out

    kernel.__name__ = np_fn.__name__
    return kernel


def _scaled(np_fn):
    """``add``: ``input op alpha * other``."""

    def kernel(spec, input, other, alpha=1):
        out, dst = new_output(spec)
        compute = np.dtype(spec.dtype.numpy)
        b = operand(other, compute)
        if alpha != 1:
            b = np.multiply(b, operand(alpha, compute))
        dst[...] = np_fn(operand(input, compute), b)
        return out

    kernel.__name__ = np_fn.__name__
    return kernel


def div(spec, input, other, rounding_mode=None):
    """True division, or rounded with ``rounding_mode`` ``'trunc'``/``'floor'`` (PyTorch's semantics)."""
    out, dst = new_output(spec)
    compute = np.dtype(spec.dtype.numpy)
    a, b = operand(input, compute), operand(other, compute)
    with np.errstate(all="ignore"):
        if rounding_mode is None:
            dst[...] = np.true_divide(a, b)
        elif spec.dtype.is_floating_point:
            dst[...] = np.floor_divide(a, b) if rounding_mode == "floor" else np.trunc(np.true_divide(a, b))
        else:
            if dst.size and np.any(np.asarray(b) == 0):
                raise RuntimeError("ZeroDivisionError")
            q = np.floor_divide(a, b)
            if rounding_mode == "trunc":  # round toward zero: floor, plus one where the signs differ and b ∤ a
                q = q + ((np.remainder(a, b) != 0) & ((np.asarray(a) < 0) != (np.asarray(b) < 0)))
            dst[...] = q
    return out


def _unary(np_fn):
    def kernel(spec, input):
        out, dst = new_output(spec)
        with np.errstate(all="ignore"):
            dst[...] = np_fn(operand(input, np.dtype(spec.dtype.numpy)))
        return out

    kernel.__name__ = getattr(np_fn, "__name__", "unary")
    return kernel


def where(spec, condition, input, other):
    """``input`` where ``condition`` else ``other``, broadcasting."""
    out, dst = new_output(spec)
    compute = np.dtype(spec.dtype.numpy)
    dst[...] = np.where(operand(condition, np.dtype(bool)), operand(input, compute), operand(other, compute))
    return out


def clone(spec, input, memory_format=None):
    """A copy in fresh device memory (contiguous)."""
    out, dst = new_output(spec)
    dst[...] = device_array(input)
    return out


# ---------------------------------------------------------------------------------------- reductions, matmul


def sum(spec, input, dim=None, keepdim=False, dtype=None):  # noqa: A001 - the op's name
    """Sum over the dims the meta function normalised (``spec.dims``), in the result dtype."""
    out, dst = new_output(spec)
    a = operand(input, np.dtype(spec.dtype.numpy))
    axes = spec.dims if a.ndim else None
    dst[...] = np.sum(a, axis=axes, keepdims=keepdim)
    return out


def matmul(spec, input, other):
    """Matrix product with NumPy's (= PyTorch's) broadcasting and 1-D promotion rules."""
    out, dst = new_output(spec)
    compute = np.dtype(spec.dtype.numpy)
    dst[...] = np.matmul(operand(input, compute), operand(other, compute))
    return out


# ---------------------------------------------------------------------------------------- kiln's reference kernels

_CPU = kiln.device("cpu")


def _host_alias(x):
    """An example-device tensor as a CPU tensor over the same memory (no copy for dense views); lists and
    tuples of tensors element-wise; anything else (a 0-d CPU tensor, a number) unchanged."""
    if isinstance(x, kiln.Tensor):
        if x.device.type != NAME:
            return x
        return from_array(device_array(x), x.dtype)
    if isinstance(x, (list, tuple)):
        items = [_host_alias(v) for v in x]
        return type(x)._make(items) if hasattr(x, "_fields") else type(x)(items)
    return x


def _on_cpu(spec):
    """One output's spec with device ``cpu``, for the reference kernel."""
    return spec.replace(device=_CPU)


def _to_device(out: kiln.Tensor, spec) -> kiln.Tensor:
    result, dst = new_output(spec)
    dst[...] = host_view(out)
    return result


def reference_on_device(name: str):
    """The kernel of op ``name`` on this device: kiln's NumPy reference kernel run on NumPy views of the
    device memory (it is host-addressable), its result copied into a new device tensor."""
    reference = reference_kernel(name)
    several = op(name).num_outputs > 1

    def kernel(spec, *args):
        if several:
            out = reference(tuple(_on_cpu(s) for s in spec), *_host_alias(args))
            return tuple(_to_device(o, s) for o, s in zip(out, spec))
        return _to_device(reference(_on_cpu(spec), *_host_alias(args)), spec)

    kernel.__name__ = kernel.__qualname__ = f"reference_{name}"
    return kernel


# ---------------------------------------------------------------------------------------- the table

# The hand-written kernels: op name -> (kernel, dtypes it serves, or None for every dtype the device declares)
HAND_WRITTEN: dict[str, tuple] = {
    "add": (_scaled(np.add), None),
    "mul": (_binary(np.multiply), None),
    "div": (div, None),
    "maximum": (_binary(np.maximum), None),
    "minimum": (_binary(np.minimum), None),
    "eq": (_binary(np.equal, compute_field="compute_dtype"), None),
    "lt": (_binary(np.less, compute_field="compute_dtype"), None),
    "le": (_binary(np.less_equal, compute_field="compute_dtype"), None),
    "gt": (_binary(np.greater, compute_field="compute_dtype"), None),
    "ge": (_binary(np.greater_equal, compute_field="compute_dtype"), None),
    "neg": (_unary(np.negative), None),
    "abs": (_unary(np.abs), None),
    # transcendental functions only for floating point inputs: integer inputs (which PyTorch
    # promotes to float) are "missing" on this device and need the CPU fallback
    "exp": (_unary(np.exp), FLOATS),
    "log": (_unary(np.log), FLOATS),
    "sqrt": (_unary(np.sqrt), FLOATS),
    "sin": (_unary(np.sin), FLOATS),
    "cos": (_unary(np.cos), FLOATS),
    "tanh": (_unary(np.tanh), FLOATS),
    "where": (where, None),
    "clone": (clone, None),
    "sum": (sum, None),
    "matmul": (matmul, FLOATS),
}

# The device implements exactly kiln's primitive set (kiln.backend.primitives()): the hand-written kernels
# where they are primitives, kiln's reference kernels on device memory for the rest (for the dtypes a
# hand-written kernel does not serve too). Every other op runs through its decomposition on the device.
KERNELS: dict[str, tuple] = {}
for _name in primitives():
    if _name in HAND_WRITTEN:
        KERNELS[_name] = HAND_WRITTEN[_name]
    else:
        KERNELS[_name] = (reference_on_device(_name), None)
