"""PyTorch's legacy tensor types: ``kiln.FloatTensor``, ``kiln.LongTensor``, ... (``torch.FloatTensor``).

Each is a class whose call builds a CPU tensor of its dtype, as PyTorch's legacy constructors do:
``FloatTensor(data)`` (a list, tuple or NumPy array), ``FloatTensor(2, 3)`` or ``FloatTensor(kiln.Size(...))``
(uninitialised), ``FloatTensor(tensor)`` (an alias of a tensor of the same dtype) and ``FloatTensor()``
(empty, one-dimensional). ``isinstance(t, kiln.FloatTensor)`` is true for float32 tensors on the CPU;
the classes are not subclasses of :class:`kiln.Tensor`, and the tensors they build are plain ``Tensor``\\ s.
"""

from __future__ import annotations

import numbers

import numpy as np

from kiln import _dtype as dt
from kiln._tensor import Size, Tensor

LEGACY_TYPE_NAMES = {
    dt.float32: "FloatTensor",
    dt.float64: "DoubleTensor",
    dt.float16: "HalfTensor",
    dt.bfloat16: "BFloat16Tensor",
    dt.int64: "LongTensor",
    dt.int32: "IntTensor",
    dt.int16: "ShortTensor",
    dt.int8: "CharTensor",
    dt.uint8: "ByteTensor",
    dt.bool: "BoolTensor",
}
"""Each legacy type's dtype and name."""

__all__ = list(LEGACY_TYPE_NAMES.values())

TOP_LEVEL = tuple(__all__)
"""The names ``kiln`` exports at its top level (as ``torch`` does)."""


def _options(d: dt.dtype, device) -> str:
    return (
        f"TensorOptions(dtype={dt.CPP_TYPE_NAMES.get(d, d.name)}, device={device}, layout=Strided, "
        "requires_grad=false (default), pinned_memory=false (default), memory_format=(nullopt))"
    )


def _type_name(x) -> str:
    t = type(x)
    if t.__module__.split(".")[0] == "kiln":
        return f"kiln.{t.__name__}"
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _invalid(args, kwargs) -> TypeError:
    got = ", ".join([_type_name(a) for a in args] + [f"{k}={_type_name(v)}" for k, v in kwargs.items()])
    return TypeError(
        f"new() received an invalid combination of arguments - got ({got}), but expected one of:\n"
        " * (*, kiln.device device = None)\n"
        " * (Tensor other)\n"
        " * (tuple of ints size, *, kiln.device device = None)\n"
        " * (object data, *, kiln.device device = None)"
    )


def _legacy_new(d: dt.dtype, args: tuple, kwargs: dict) -> Tensor:
    from kiln._ops.copy import resolve_device
    from kiln._ops.creation import empty, tensor

    bad = {k: v for k, v in kwargs.items() if k not in ("device", "size")}
    if bad or ("size" in kwargs and args):
        raise _invalid(args, kwargs)
    device = kwargs.get("device")
    if device is not None:
        dev = resolve_device(device)
        if dev.type != "cpu":
            raise RuntimeError(f"legacy constructor expects device type: cpu but device type: {dev.type} was passed")
    if "size" in kwargs:
        size = kwargs["size"]
        if not isinstance(size, (tuple, list)) or not all(_is_int(s) for s in size):
            raise _invalid(args, kwargs)
        return empty(tuple(size), dtype=d)
    if not args:
        return empty(0, dtype=d)
    first = args[0]
    if _is_int(first) or isinstance(first, Size):
        if isinstance(first, Size):
            if len(args) > 1:
                raise _invalid(args, kwargs)
            args = tuple(first)
        for pos, a in enumerate(args, 1):
            if not _is_int(a):
                raise TypeError(
                    f"new(): argument 'size' failed to unpack the object at pos {pos} with error "
                    f'"type must be tuple of ints,but got {_type_name(a)}"'
                )
        return empty(tuple(int(a) for a in args), dtype=d)
    if len(args) > 1:
        raise _invalid(args, kwargs)
    if isinstance(first, Tensor):
        if device is not None:
            raise RuntimeError(
                "Legacy tensor constructor of the form kiln.Tensor(tensor, device=device) is not supported.  "
                "Use kiln.tensor(...) or kiln.as_tensor(...) instead."
            )
        if first._dtype is not d or first._device.type != "cpu":
            raise TypeError(f"expected {_options(d, 'cpu')} (got {_options(first._dtype, first._device)})")
        return first.view_as(first)  # an alias sharing storage (and autograd history), as PyTorch's
    if isinstance(first, str):
        raise TypeError(f"new(): invalid data type '{_type_name(first)}'")
    if isinstance(first, (list, tuple, np.ndarray)):
        return tensor(first, dtype=d)
    raise TypeError(f"new(): data must be a sequence (got {_type_name(first)})")


class _TensorType(type):
    """The metaclass of the legacy tensor types (``torch.tensortype``): instance checks by dtype and device."""

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, Tensor) and obj._dtype is cls.dtype and obj._device.type == "cpu"

    def __call__(cls, *args, **kwargs) -> Tensor:
        return _legacy_new(cls.dtype, args, kwargs)

    def __repr__(cls) -> str:
        return f"<class 'kiln.{cls.__name__}'>"


def _legacy_type(d: dt.dtype) -> type:
    name = LEGACY_TYPE_NAMES[d]
    doc = (
        f"Legacy constructor of {d.name} CPU tensors (``torch.{name}``): ``{name}(data)``, ``{name}(*sizes)``\n"
        f"(uninitialised), ``{name}(tensor)`` (an alias of a {d.name} tensor) or ``{name}()``; "
        f"``isinstance(t, kiln.{name})`` is true for {d.name} tensors on the CPU."
    )
    cls = _TensorType(
        name, (), {"__doc__": doc, "__module__": "kiln", "dtype": d, "is_cuda": False, "is_sparse": False}
    )
    return cls


FloatTensor = _legacy_type(dt.float32)
DoubleTensor = _legacy_type(dt.float64)
HalfTensor = _legacy_type(dt.float16)
BFloat16Tensor = _legacy_type(dt.bfloat16)
LongTensor = _legacy_type(dt.int64)
IntTensor = _legacy_type(dt.int32)
ShortTensor = _legacy_type(dt.int16)
CharTensor = _legacy_type(dt.int8)
ByteTensor = _legacy_type(dt.uint8)
BoolTensor = _legacy_type(dt.bool)

LEGACY_TYPES = {cls.__name__: cls for cls in (globals()[n] for n in __all__)}
"""Name (``'FloatTensor'``) -> legacy tensor type."""


def tensor_type(self: Tensor, dtype=None, non_blocking: bool = False, **kwargs):
    """The type name (``'kiln.FloatTensor'``, ``'kiln.cuda.FloatTensor'``) or, given ``dtype``, this tensor
    converted to a dtype, a legacy type (``kiln.LongTensor``) or its name (``'kiln.cuda.LongTensor'`` moves
    it to cuda; ``'torch.LongTensor'`` too, so PyTorch code runs unchanged); ``self`` if it is that type."""
    if kwargs:
        raise TypeError(f"type() got an unexpected keyword argument '{next(iter(kwargs))}'")
    if dtype is None:
        where = "" if self._device.type == "cpu" else f"{self._device.type}."
        return f"kiln.{where}{LEGACY_TYPE_NAMES[self._dtype]}"
    if isinstance(dtype, str):  # the name says the device too: 'kiln.cuda.FloatTensor', 'torch.FloatTensor'
        prefix, _, name = dtype.rpartition(".")
        lib, _, where = prefix.partition(".")
        if lib not in ("kiln", "torch") or "." in where or name not in LEGACY_TYPES:
            raise ValueError(f"invalid type: '{dtype}'")
        return self.to(where or "cpu", LEGACY_TYPES[name].dtype, non_blocking=non_blocking)
    if isinstance(dtype, _TensorType):
        dtype = dtype.dtype
    return self.to(dtype, non_blocking=non_blocking)


tensor_type.__name__ = tensor_type.__qualname__ = "type"
Tensor.type = tensor_type
