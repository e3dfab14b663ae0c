"""Tensor creation: ``tensor``, ``from_numpy``, ``zeros``/``ones``/``empty``/``full`` (+ ``_like``),
``arange``, ``linspace``, ``eye``. Random tensors (``rand``, ``randn`` ...) are in :mod:`kiln._ops.random_ops`.

``empty`` and ``full`` are ops with device-generic kernels built on the device contract, so every
device type can create tensors; a device may register faster ones.
"""

from __future__ import annotations

import functools
import math
import numbers
import warnings

import numpy as np

from kiln import _dtype as dt
from kiln._device import CPU, out_of_memory
from kiln._dispatch import op
from kiln._memory_format import preserve_format, strided
from kiln._ops._meta import is_scalar, result_type, scalar_type_name
from kiln._ops.copy import from_host, resolve_device
from kiln._ops.views import _INT64_END, _varargs_shape, check_storage_size
from kiln._spec import Spec
from kiln._tensor import Tensor, _make, contiguous_strides, from_array, storage_span

__all__ = [
    "tensor",
    "as_tensor",
    "from_numpy",
    "zeros",
    "ones",
    "empty",
    "full",
    "zeros_like",
    "ones_like",
    "empty_like",
    "full_like",
    "arange",
    "linspace",
    "eye",
    "meshgrid",
]

TOP_LEVEL = (
    "arange",
    "as_tensor",
    "asarray",
    "empty",
    "empty_like",
    "eye",
    "from_numpy",
    "full",
    "full_like",
    "linspace",
    "meshgrid",
    "ones",
    "ones_like",
    "tensor",
    "zeros",
    "zeros_like",
)
"""The names ``kiln`` exports at its top level (as ``torch`` does)."""


def _unsupported(layout=None, pin_memory=False, memory_format=None) -> None:
    """PyTorch keywords kiln accepts for signature compatibility but cannot honour yet: refuse, never ignore.
    (``out=`` is honoured, by :func:`_takes_out`.)"""
    if layout is not None and layout is not strided:
        raise NotImplementedError(f"kiln does not support layout={layout!r} for tensor creation yet")
    if pin_memory not in (None, False):
        raise NotImplementedError(f"kiln does not support pin_memory={pin_memory!r} for tensor creation yet")
    if memory_format is not None and getattr(memory_format, "name", None) not in (
        "preserve_format",
        "contiguous_format",
    ):
        raise NotImplementedError(f"kiln does not support memory_format={memory_format!r} for tensor creation yet")


def _takes_out(fn):
    """A creation function's ``out=``: the new tensor written into ``out`` (PyTorch's rules,
    :func:`kiln._dispatch.write_out`)."""
    import functools

    from kiln._dispatch import write_out

    @functools.wraps(fn)
    def create(*args, out=None, **kwargs):
        result = fn(*args, **kwargs)
        return result if out is None else write_out(fn.__name__, result, out)

    return create


def _allocating(fn):
    """Creation functions that allocate host arrays outside an op's kernel: a failed allocation raises
    PyTorch's ``RuntimeError`` (:func:`kiln._device.out_of_memory`), not ``MemoryError``."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except MemoryError as exc:
            raise out_of_memory(exc) from None

    return wrapper


def _finish(t: Tensor, requires_grad: bool) -> Tensor:
    """``t`` made a leaf requiring grad when asked, with PyTorch's creation-time error for other dtypes."""
    if requires_grad:
        if not t._dtype.is_floating_point:
            raise RuntimeError("Only Tensors of floating point and complex dtype can require gradients")
        t.requires_grad_(True)
    return t


def _dtype_arg(dtype) -> dt.dtype | None:
    if dtype is None or isinstance(dtype, dt.dtype):
        return dtype
    raise TypeError(f"dtype must be a kiln.dtype, not {type(dtype).__name__}")


# ---------------------------------------------------------------------------------------- empty / full


def _empty_meta(size, dtype, device):
    for s in size:
        if s < 0:
            raise RuntimeError(f"Trying to create tensor with negative dimension {s}: {list(size)}")
    return Spec((size, dtype, device))


def _empty_kernel(spec, size, dtype, device):
    if device is CPU:
        return from_array(np.empty(size, dtype.numpy), dtype)
    from kiln._plugins import device_type

    n = math.prod(size)
    storage = device_type(device).empty(n, dtype, device.index)
    return _make(storage, size, contiguous_strides(size), 0, dtype, device)


@op(meta=_empty_meta, reference=_empty_kernel, device_generic=True, tags=("creation",))
def _empty(size: tuple, dtype: dt.dtype, device) -> Tensor:
    """Uninitialised contiguous tensor (kernel of :func:`empty`)."""


# PyTorch's name for each float dtype's type, and its largest finite value where a Python float can exceed it
_FLOAT_NAMES = {dt.float16: "c10::Half", dt.bfloat16: "c10::BFloat16", dt.float32: "float", dt.float64: "double"}
_FLOAT_MAX = {dt.float16: 65504.0, dt.bfloat16: (2 - 2**-7) * 2.0**127, dt.float32: float(np.finfo(np.float32).max)}


def _check_fits(value, dtype: dt.dtype, numel: int) -> None:
    """PyTorch's checks of a value filling ``numel`` elements of ``dtype``: a Python int must fit in 64 bits
    (signed, or unsigned when positive); into a float dtype, a complex number must have no imaginary part
    and a finite number must not exceed the dtype's largest value (except into one element of float16 or
    bfloat16, which PyTorch converts through a double and rounds to infinity); into an integer dtype, the
    value must fit, a negative one in an unsigned dtype by its magnitude (``-1`` fills uint8 with 255,
    ``-256`` overflows)."""
    if value == 0 or value == 1:  # zeros() and ones(): fit everywhere
        return
    if value.__class__ is int and not -(1 << 63) <= value < (1 << 64):
        raise OverflowError("int too big to convert" if value > 0 else "can't convert negative int to unsigned")
    if dtype.is_floating_point:
        # PyTorch fills one element of float16 or bfloat16 through a double, unchecked past it
        through_double = numel == 1 and dtype in (dt.float16, dt.bfloat16)
        if isinstance(value, complex):
            bad = value.imag != 0
        else:
            limit = _FLOAT_MAX.get(dtype)
            bad = limit is not None and not through_double and math.isfinite(value) and abs(value) > limit
        if bad:
            name = "double" if through_double else _FLOAT_NAMES[dtype]
            raise RuntimeError(f"value cannot be converted to type {name} without overflow")
        return
    if dtype is dt.bool or isinstance(value, (bool, np.bool_)):
        return
    info = np.iinfo(dtype.numpy)
    v = -value if info.min == 0 and value < 0 else value
    if not (math.isfinite(v) and info.min <= v <= info.max):
        raise RuntimeError(f"value cannot be converted to type {np.dtype(dtype.numpy).name}_t without overflow")


def _full_meta(size, fill_value, dtype, device):
    _check_fits(fill_value, dtype, math.prod(size))
    return _empty_meta(size, dtype, device)


# the float dtypes, into which ndarray.fill() rounds a Python float exactly as astype() does (as PyTorch
# casts); not a Python int past 2**53, which fill() rounds twice (to a double first)
_FILLED_BY_CAST = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64))


def _full_kernel(spec, size, fill_value, dtype, device):
    np_dtype = dtype.numpy
    if fill_value == 0 and not (isinstance(fill_value, float) and math.copysign(1.0, fill_value) < 0):
        a = np.zeros(size, np_dtype)  # fresh zero pages from the OS: nothing to write (np.full writes each)
    elif np_dtype in _FILLED_BY_CAST and (  # a third of np.full's cost
        fill_value.__class__ in (float, bool) or (fill_value.__class__ is int and -(2**53) <= fill_value <= 2**53)
    ):
        a = np.empty(size, np_dtype)
        a.fill(fill_value)
    else:  # cast as PyTorch casts (a negative value wraps in an unsigned dtype; a complex one, checked real)
        value = fill_value.real if isinstance(fill_value, complex) and np_dtype.kind != "c" else fill_value
        a = np.full(size, np.asarray(value).astype(np_dtype), np_dtype)
    if device is CPU:
        return from_array(a, dtype)
    return from_host(a, dtype, device)


@op(meta=_full_meta, reference=_full_kernel, device_generic=True, tags=("creation",))
def _full(size: tuple, fill_value: float, dtype: dt.dtype, device) -> Tensor:
    """Contiguous tensor filled with one value (kernel of :func:`full`)."""


def _creation_args(size, dtype, device, default=None, negative: str | None = None):
    """(shape, dtype, device) of a new tensor, its size checked as PyTorch checks it before allocating:
    no negative dimension (``negative``: the op's own message for one), bytes that fit in an int64."""
    shape = _varargs_shape(size) if isinstance(size, tuple) else _varargs_shape((size,))
    d = _dtype_arg(dtype) or default or dt.get_default_dtype()
    for s in shape:
        if s < 0:
            raise RuntimeError(negative or f"Trying to create tensor with negative dimension {s}: {list(shape)}")
    check_storage_size(shape, d)
    return shape, d, resolve_device(device)


def _size_keyword(name: str, sizes: tuple, size) -> tuple:
    """The positional sizes of a ``*size`` creation function, or its ``size=`` keyword (a sequence of ints)
    when given, as PyTorch's ``zeros(size=(2, 3))``."""
    if size is None:
        return sizes
    if sizes:
        raise TypeError(f"{name}() got multiple values for argument 'size'")
    if not isinstance(size, (tuple, list)):
        raise TypeError(f"{name}(): argument 'size' must be tuple of ints, not {type(size).__name__}")
    return (tuple(size),)


@_takes_out
def empty(
    *sizes,
    size=None,
    dtype=None,
    device=None,
    requires_grad=False,
    out=None,
    layout=strided,
    pin_memory=False,
    memory_format=preserve_format,
) -> Tensor:
    """An uninitialised tensor of shape ``size``."""
    _unsupported(layout=layout, pin_memory=pin_memory, memory_format=memory_format)
    size = _size_keyword("empty", sizes, size)
    shape, d, dev = _creation_args(size, dtype, device)
    return _finish(_empty(shape, d, dev), requires_grad)


@_takes_out
def full(
    size, fill_value, *, dtype=None, device=None, requires_grad=False, out=None, layout=strided, pin_memory=False
) -> Tensor:
    """A tensor of shape ``size`` filled with ``fill_value`` (dtype inferred from it by default)."""
    _unsupported(layout=layout, pin_memory=pin_memory)
    if isinstance(fill_value, Tensor):
        fill_value = fill_value.item()
    if not is_scalar(fill_value):
        raise TypeError(f"full(): argument 'fill_value' must be Number, not {type(fill_value).__name__}")
    default = None if dtype is not None else result_type(fill_value)
    shape, d, dev = _creation_args((size,), dtype, device, default)
    return _finish(_full(shape, fill_value, d, dev), requires_grad)


@_takes_out
def zeros(
    *sizes, size=None, dtype=None, device=None, requires_grad=False, out=None, layout=strided, pin_memory=False
) -> Tensor:
    """A tensor of zeros of shape ``size``."""
    _unsupported(layout=layout, pin_memory=pin_memory)
    size = _size_keyword("zeros", sizes, size)
    shape, d, dev = _creation_args(size, dtype, device, negative="zeros: Dimension size must be non-negative.")
    return _finish(_full(shape, 0, d, dev), requires_grad)


@_takes_out
def ones(
    *sizes, size=None, dtype=None, device=None, requires_grad=False, out=None, layout=strided, pin_memory=False
) -> Tensor:
    """A tensor of ones of shape ``size``."""
    _unsupported(layout=layout, pin_memory=pin_memory)
    size = _size_keyword("ones", sizes, size)
    shape, d, dev = _creation_args(size, dtype, device)
    return _finish(_full(shape, 1, d, dev), requires_grad)


def _like(input: Tensor, dtype, device):
    if not isinstance(input, Tensor):
        raise TypeError(f"argument 'input' must be Tensor, not {type(input).__name__}")
    return input._shape, _dtype_arg(dtype) or input._dtype, input._device if device is None else resolve_device(device)


def empty_like(
    input: Tensor, *, dtype=None, device=None, requires_grad=False, layout=None, memory_format=preserve_format
) -> Tensor:
    """An uninitialised tensor with ``input``'s shape, dtype and device."""
    _unsupported(layout=layout, memory_format=memory_format)
    shape, d, dev = _like(input, dtype, device)
    return _finish(_empty(shape, d, dev), requires_grad)


def zeros_like(
    input: Tensor, *, dtype=None, device=None, requires_grad=False, layout=None, memory_format=preserve_format
) -> Tensor:
    """Zeros with ``input``'s shape, dtype and device."""
    _unsupported(layout=layout, memory_format=memory_format)
    shape, d, dev = _like(input, dtype, device)
    return _finish(_full(shape, 0, d, dev), requires_grad)


def ones_like(
    input: Tensor, *, dtype=None, device=None, requires_grad=False, layout=None, memory_format=preserve_format
) -> Tensor:
    """Ones with ``input``'s shape, dtype and device."""
    _unsupported(layout=layout, memory_format=memory_format)
    shape, d, dev = _like(input, dtype, device)
    return _finish(_full(shape, 1, d, dev), requires_grad)


def full_like(
    input: Tensor,
    fill_value,
    *,
    dtype=None,
    device=None,
    requires_grad=False,
    layout=None,
    memory_format=preserve_format,
    pin_memory=None,
) -> Tensor:
    """``fill_value`` everywhere, with ``input``'s shape, dtype and device."""
    _unsupported(layout=layout, pin_memory=pin_memory, memory_format=memory_format)
    shape, d, dev = _like(input, dtype, device)
    return _finish(_full(shape, fill_value, d, dev), requires_grad)


# ---------------------------------------------------------------------------------------- from data


def _infer_dtype(a: np.ndarray, from_numpy_array: bool) -> dt.dtype:
    if from_numpy_array:
        return dt.from_numpy_dtype(a.dtype)
    k = a.dtype.kind
    if k == "b":
        return dt.bool
    if k in "iu":
        return dt.int64
    if k == "f":
        return dt.get_default_dtype()
    raise TypeError(f"Could not infer dtype of {a.dtype}")


def _is_sequence(x) -> bool:
    return isinstance(x, (list, tuple)) or (isinstance(x, np.ndarray) and x.ndim > 0)


def _nested_shape(data) -> list[int]:
    """The shape PyTorch reads off nested sequences: the lengths along the first elements."""
    shape = []
    while _is_sequence(data):
        shape.append(len(data))
        if not len(data):
            break
        data = data[0]
    return shape


def _check_nested(data, shape: list[int], dim: int = 0) -> None:
    """Raise PyTorch's error at the first place nested ``data`` departs from ``shape``."""
    if dim == len(shape):
        if _is_sequence(data):
            raise TypeError(f"expected a number at dim {dim}, got a {type(data).__name__}")
        return
    if not _is_sequence(data):
        raise TypeError("not a sequence")
    if len(data) != shape[dim]:
        raise ValueError(f"expected sequence of length {shape[dim]} at dim {dim} (got {len(data)})")
    for x in data:
        _check_nested(x, shape, dim + 1)


def _leaf_dtype(data) -> dt.dtype | None:
    """PyTorch's dtype for nested lists holding NumPy scalars (each keeps its own dtype; Python floats
    count as the default dtype, ints as int64, bools as bool), promoted together; None without NumPy scalars."""
    types, stack = set(), [data]
    while stack:
        x = stack.pop()
        if len(x) and _is_sequence(x[0]):
            stack.extend(x)
        else:
            types.update(map(type, x))
    if not any(issubclass(t, np.generic) for t in types):
        return None
    d = None
    for t in types:
        if issubclass(t, np.generic):
            k = dt.from_numpy_dtype(np.dtype(t))
        elif issubclass(t, bool):
            k = dt.bool
        elif issubclass(t, numbers.Integral):
            k = dt.int64
        else:
            k = dt.get_default_dtype()
        d = k if d is None else dt.promote_types(d, k)
    return d


def _list_to_array(data) -> tuple[np.ndarray, dt.dtype | None]:
    """A host array for nested lists/tuples of numbers, with PyTorch's errors for ragged ones."""
    try:
        a = np.array(data)
    except ValueError:
        shape = _nested_shape(data)
        if 0 in shape:  # PyTorch stores nothing into an empty tensor, so it never sees the raggedness
            return np.empty(shape), None
        _check_nested(data, shape)
        raise
    # not plain numbers of NumPy's making: check each (NumPy holds ints past int64 as objects or uint64, and
    # makes float64 of them beside negative ints)
    if a.dtype.kind in "OUS" or a.dtype == np.uint64 or (a.dtype == np.float64 and np.any(np.abs(a) >= _INT64_END)):
        return _python_numbers(data), _leaf_dtype(data)
    return a, _leaf_dtype(data)


class _IntOverflow(ValueError):
    """PyTorch's error for an integer that does not fit in int64 where the data is integers."""

    def __init__(self) -> None:
        super().__init__("Overflow when unpacking long long")


def _python_numbers(data) -> np.ndarray:
    """A host array for (nested lists of) Python values that NumPy could not hold as plain numbers, with
    PyTorch's errors: a string where a number belongs, a value that is not a number (None, an object),
    or an integer outside int64 (NumPy would wrap it, or hold it as an object)."""
    first = data
    while _is_sequence(first) and len(first):
        first = first[0]
    if isinstance(first, str):  # PyTorch reads a string as one more dimension, without end (not bytes)
        raise ValueError(f"too many dimensions '{type(first).__name__}'")
    leaves, stack = [], [data]
    while stack:
        x = stack.pop()
        if _is_sequence(x):
            stack.extend(x)
        else:
            leaves.append(x)
    floating = False
    for x in leaves:
        if isinstance(x, (str, bytes)):
            raise TypeError(f"new(): invalid data type '{type(x).__name__}'")
        if not isinstance(x, (numbers.Real, np.bool_)):  # Python bools and integers are Real too
            raise RuntimeError(f"Could not infer dtype of {type(x).__name__}")
        floating = floating or not isinstance(x, (numbers.Integral, np.bool_))
    if floating:
        return np.array(data, dtype=np.float64)
    if any(not -_INT64_END <= int(x) < _INT64_END for x in leaves):
        raise _IntOverflow
    bools = all(isinstance(x, (bool, np.bool_)) for x in leaves)
    return np.array(data, dtype=np.bool_ if bools else np.int64)


def _to_host_array(data) -> tuple[np.ndarray, dt.dtype | None]:
    """A host array for ``data`` and the kiln dtype it carries (None: infer from Python values)."""
    if isinstance(data, Tensor):
        from kiln._ops.copy import host_array

        return host_array(data.detach()), data._dtype
    if isinstance(data, np.ndarray):
        return data, dt.from_numpy_dtype(data.dtype)
    if isinstance(data, np.generic):
        return np.asarray(data), dt.from_numpy_dtype(data.dtype)
    if isinstance(data, (list, tuple)):
        if any(isinstance(x, Tensor) for x in data):
            parts = [_to_host_array(x) for x in data]
            kinds = [p[1] for p in parts if p[1] is not None]
            a = np.stack([np.asarray(p[0]) for p in parts]) if parts else np.zeros((0,))
            d = kinds[0] if kinds else None
            for k in kinds[1:]:
                d = dt.promote_types(d, k)
            return a, d
        return _list_to_array(data)
    if isinstance(data, (str, bytes)):
        raise TypeError(f"new(): invalid data type '{type(data).__name__}'")
    if is_scalar(data):
        if isinstance(data, numbers.Integral) and not isinstance(data, bool):
            return _python_numbers([data]).reshape(()), None
        return np.array(data), None
    raise RuntimeError(f"Could not infer dtype of {type(data).__name__}")


@_allocating
def tensor(data, *, dtype=None, device=None, requires_grad=False, pin_memory=False) -> Tensor:
    """A new tensor holding a copy of ``data`` (nested lists, numbers, NumPy arrays, tensors)."""
    _unsupported(pin_memory=pin_memory)
    if isinstance(data, Tensor):
        warnings.warn(
            "To copy construct from a tensor, it is recommended to use sourceTensor.clone().detach() or "
            "sourceTensor.clone().detach().requires_grad_(True), rather than kiln.tensor(sourceTensor).",
            UserWarning,
            stacklevel=2,
        )
    want = _dtype_arg(dtype)
    try:
        a, inferred = _to_host_array(data)
    except _IntOverflow:
        # integers beyond int64 are fine as values of a floating dtype asked for (PyTorch converts them)
        if want is None or not want.is_floating_point:
            raise
        a, inferred = np.array(data, dtype=np.float64), None
    d = want or inferred or _infer_dtype(a, False)
    dev = resolve_device(device)
    return _finish(from_host(a, d, dev), requires_grad)


def as_tensor(data, *, dtype=None, device=None) -> Tensor:
    """``data`` as a tensor, sharing memory when it already is one (or a NumPy array) of that dtype and device."""
    d = _dtype_arg(dtype)
    if not isinstance(data, Tensor) and hasattr(data, "__cuda_array_interface__"):  # GPU memory: shared
        from kiln._interop import from_cuda_array_interface

        data = from_cuda_array_interface(data)
    if isinstance(data, Tensor):
        return data.to(device=resolve_device(device) if device is not None else data._device, dtype=d or data._dtype)
    if isinstance(data, np.ndarray) and (device is None or resolve_device(device) is CPU):
        t = from_numpy(data)
        return t if d is None or d is t._dtype else t.to(d)
    return tensor(data, dtype=d, device=device)


def asarray(obj, *, dtype=None, device=None, copy: bool | None = None, requires_grad: bool | None = None) -> Tensor:
    """``obj`` (a tensor, NumPy array, buffer, sequence or number) as a tensor (``torch.asarray``): shares
    memory with a tensor or NumPy array when dtype and device allow, unless ``copy=True``; ``copy=False``
    raises ``ValueError`` when sharing is impossible."""
    d = _dtype_arg(dtype)
    if copy is False:
        if isinstance(obj, Tensor):
            if d is not None and d is not obj._dtype:
                raise ValueError(
                    f"can't alias tensor with dtype '{scalar_type_name(obj._dtype)}' into dtype '{scalar_type_name(d)}'."
                )
            if device is not None and resolve_device(device) != obj._device:
                raise ValueError(
                    f"can't alias tensor on device '{obj._device}' into device '{resolve_device(device)}'."
                )
        elif not isinstance(obj, np.ndarray) and not hasattr(obj, "__buffer__"):
            raise ValueError("can't alias arbitrary sequence into a tensor.")
    if not isinstance(obj, (Tensor, np.ndarray)) and (
        hasattr(obj, "__buffer__") or isinstance(obj, (bytes, bytearray))
    ):
        obj = np.frombuffer(memoryview(obj).cast("B"), dtype=(d or dt.uint8).numpy)
    out = as_tensor(obj, dtype=d, device=device)
    if copy:
        shares = (isinstance(obj, Tensor) and out is obj) or (
            isinstance(obj, np.ndarray) and out._dtype.numpy == obj.dtype
        )
        out = out.clone() if shares else out
    return out.requires_grad_(requires_grad) if requires_grad else out


def from_numpy(ndarray: np.ndarray) -> Tensor:
    """A CPU tensor sharing memory with ``ndarray`` (writes show in both)."""
    if not isinstance(ndarray, np.ndarray):
        raise TypeError(f"expected np.ndarray (got {type(ndarray).__name__})")
    d = dt.from_numpy_dtype(ndarray.dtype)
    isz = ndarray.itemsize
    if any(s < 0 for s in ndarray.strides):
        raise ValueError(
            "At least one stride in the given numpy array is negative, and tensors with negative strides are not "
            "currently supported. (You can probably work around this by making a copy of your array  with "
            "array.copy().) "
        )
    if any(s % isz for s in ndarray.strides):
        raise ValueError(
            "given numpy array strides not a multiple of the element byte size. Copy the numpy array to reallocate the memory."
        )
    if not ndarray.flags.writeable:
        warnings.warn(
            "The given NumPy array is not writable, and kiln does not support non-writable tensors. This means "
            "writing to this tensor will result in undefined behavior.",
            UserWarning,
            stacklevel=2,
        )
    shape = ndarray.shape
    stride = tuple(s // isz for s in ndarray.strides)
    span = storage_span(shape, stride)
    storage = (
        np.lib.stride_tricks.as_strided(ndarray, shape=(span,), strides=(isz,), writeable=ndarray.flags.writeable)
        if ndarray.ndim
        else ndarray.reshape(1)
    )
    t = _make(storage, shape, stride, 0, d, CPU)
    t._np = ndarray
    return t


# ---------------------------------------------------------------------------------------- ranges


def _scalar_value(x):
    return x.item() if isinstance(x, Tensor) else x


def _arange_length(start, end, step, d: dt.dtype) -> int:
    """Element count of ``arange`` with PyTorch's rules: ``ceil((end - start) / step)`` in double, but
    for int64 in integers after truncating the bounds and step (so ``arange(2.5, dtype=int64)`` has 2)."""
    if d is dt.int64:
        istart, iend, istep = int(start), int(end), int(step)
        if istep == 0:
            raise ValueError("step must be nonzero")
        sign = 1 if istep > 0 else -1
        return (iend - istart + istep - sign) // istep
    n = math.ceil((float(end) - float(start)) / float(step))
    if not 0 <= n <= 2**63 - 1:
        raise RuntimeError("invalid size, possible overflow?")
    return n


def _range_number(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


@_takes_out
@_allocating
def arange(
    start=0,
    end=None,
    step=1,
    *,
    dtype=None,
    device=None,
    requires_grad=False,
    out=None,
    layout=strided,
    pin_memory=False,
) -> Tensor:
    """Values from ``start`` (inclusive) to ``end`` (exclusive) spaced by ``step``.

    As in PyTorch, values are ``start + i * step`` computed in the dtype's accumulate type: int64 for
    integer dtypes (start and step truncated first), float32 for float16/bfloat16, double otherwise.
    """
    _unsupported(layout=layout, pin_memory=pin_memory)
    start, end, step = _scalar_value(start), _scalar_value(end), _scalar_value(step)
    if end is None:
        start, end = 0, start
    for v in (start, end, step):
        if not is_scalar(v):
            raise TypeError(f"arange(): expected a number, got {type(v).__name__}")
    d = _dtype_arg(dtype) or (
        dt.get_default_dtype() if any(isinstance(v, float) for v in (start, end, step)) else dt.int64
    )
    if d is dt.bool:
        raise NotImplementedError(f"\"arange_cpu\" not implemented for '{scalar_type_name(d)}'")
    if step == 0:
        raise RuntimeError("step must be nonzero")
    if not (math.isfinite(start) and math.isfinite(end)):
        raise RuntimeError(f"unsupported range: {_range_number(start)} -> {_range_number(end)}")
    if (step > 0 and end < start) or (step < 0 and end > start):
        raise RuntimeError("upper bound and lower bound inconsistent with step sign")
    n = _arange_length(start, end, step, d)
    check_storage_size((n,), d)
    if not d.is_floating_point:
        values = int(start) + np.arange(n, dtype=np.int64) * np.int64(int(step))
    elif d.itemsize == 2:
        values = np.float32(start) + np.arange(n, dtype=np.float32) * np.float32(step)
    else:
        values = float(start) + np.arange(n, dtype=np.float64) * float(step)
    return _finish(from_host(values, d, resolve_device(device)), requires_grad)


@_takes_out
@_allocating
def linspace(
    start, end, steps: int, *, dtype=None, device=None, requires_grad=False, out=None, layout=strided
) -> Tensor:
    """``steps`` evenly spaced values from ``start`` to ``end`` inclusive."""
    _unsupported(layout=layout)
    start, end = _scalar_value(start), _scalar_value(end)
    if not isinstance(steps, numbers.Integral) or steps < 0:
        raise RuntimeError("number of steps must be non-negative")
    d = _dtype_arg(dtype) or dt.get_default_dtype()
    compute = np.float64 if d is dt.float64 or not d.is_floating_point else np.float32
    if steps == 1:
        values = np.array([start], dtype=compute)
    else:
        step = (np.asarray(end, compute) - np.asarray(start, compute)) / compute(max(steps - 1, 1))
        i = np.arange(steps, dtype=compute)
        half = steps // 2
        values = np.where(i < half, start + i * step, end - (steps - 1 - i) * step).astype(compute)
    if not d.is_floating_point:
        values = np.trunc(values)
    return _finish(from_host(values, d, resolve_device(device)), requires_grad)


@_takes_out
@_allocating
def eye(
    n: int, m: int | None = None, *, dtype=None, device=None, requires_grad=False, out=None, layout=strided
) -> Tensor:
    """A 2-D tensor with ones on the diagonal."""
    _unsupported(layout=layout)
    if n < 0:
        raise RuntimeError(f"n must be greater or equal to 0, got {n}")
    if m is not None and m < 0:
        raise RuntimeError(f"m must be greater or equal to 0, got {m}")
    d = _dtype_arg(dtype) or dt.get_default_dtype()
    check_storage_size((n, n if m is None else m), d)
    return _finish(from_host(np.eye(n, m, dtype=d.numpy), d, resolve_device(device)), requires_grad)


# ---------------------------------------------------------------------------------------- legacy


def _legacy_tensor_new(cls, *args, **kwargs):
    """``kiln.Tensor(data)`` / ``kiln.Tensor(2, 3)`` / ``kiln.Tensor()``: default float dtype."""
    device = kwargs.pop("device", None)
    if kwargs:
        raise TypeError(f"Tensor() got unexpected keyword arguments {sorted(kwargs)}")
    if not args:
        t = empty(0, device=device)
    elif all(isinstance(a, numbers.Integral) and not isinstance(a, bool) for a in args):
        t = empty(*args, device=device)
    elif len(args) == 1:
        t = tensor(args[0], dtype=dt.get_default_dtype(), device=device)
    else:
        raise TypeError(f"Tensor() received an invalid combination of arguments - got {args!r}")
    if cls is not Tensor:
        return make_subclass(cls, t, False)
    return t


def make_subclass(cls: type, data: Tensor, requires_grad: bool = False) -> Tensor:
    """An instance of the Tensor subclass ``cls`` sharing ``data``'s storage, geometry and version counter,
    outside the autograd graph (PyTorch's ``Tensor._make_subclass``, behind ``detach()``, ``.data`` and
    ``nn.Parameter``); an inference tensor's is one, whatever the mode, as a view of it is."""
    if not isinstance(data, Tensor):
        raise TypeError(f"_make_subclass(): argument 'data' (position 2) must be Tensor, not {type(data).__name__}")
    t = _make(data._storage, data._shape, data._stride, data._offset, data._dtype, data._device, data._vc, cls=cls)
    t._np = data._np
    t._inference = data._inference
    if requires_grad:
        t.requires_grad_(True)
    return t


Tensor._make_subclass = staticmethod(make_subclass)


def meshgrid(*tensors, indexing=None):
    """Coordinate grids from 1-D tensors (``indexing="ij"``: matrix order; ``"xy"``: first two dims swapped)."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    if indexing is None:
        import warnings

        warnings.warn(
            "kiln.meshgrid: in an upcoming release, it will be required to pass the indexing argument.",
            UserWarning,
            stacklevel=2,
        )
        indexing = "ij"
    if indexing not in ("ij", "xy"):
        raise RuntimeError(f'kiln.meshgrid: indexing must be one of "xy" or "ij", but received: {indexing}')
    if not tensors:
        raise RuntimeError("kiln.meshgrid: Expected at least one tensor")
    for t in tensors:
        if len(t._shape) > 1:
            raise RuntimeError("kiln.meshgrid: Expected 0D or 1D tensor in the tensor list")
    ts = [t.reshape(-1) for t in tensors]
    swap = indexing == "xy" and len(ts) >= 2
    if swap:
        ts[0], ts[1] = ts[1], ts[0]
    shape = tuple(t._shape[0] for t in ts)
    n = len(ts)
    out = [t.reshape((1,) * i + (-1,) + (1,) * (n - i - 1)).expand(shape) for i, t in enumerate(ts)]
    if swap:
        out[0], out[1] = out[1], out[0]
    return tuple(out)
