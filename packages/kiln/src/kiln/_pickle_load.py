"""Reading ``torch.save`` files into kiln: the zip archive (PyTorch >= 1.6) and the legacy pickle format.

Both formats pickle the saved object with tensors reduced to ``torch._utils._rebuild_tensor_v2(storage,
offset, size, stride, requires_grad, hooks)`` and storages replaced by persistent ids
``("storage", torch.FloatStorage, key, location, numel)``. Here every torch name a file can hold maps to
its kiln counterpart (:func:`torch_globals`): a storage loads as a one-dimensional kiln tensor placed by
``map_location`` once, and each tensor is a view of it, so tensors that shared a storage in the file
share one here, strides and offsets included. ``weights_only=True`` unpickles through
:mod:`kiln._weights_only` with these names as its allow-list; ``weights_only=False`` through
``pickle_module.Unpickler`` with the same mapping (and, for every other name, an ordinary import).

Every size in the file is checked before memory is allocated: a storage must be exactly as long as its
record, records are stored (uncompressed, as ``torch.save`` writes them) inside the file, all storages
together fit in the file, and a tensor's extent must lie inside its storage.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from kiln import _dtype as dt
from kiln._device import CPU
from kiln._device import device as _device
from kiln._tensor import Size, Tensor, _make
from kiln._weights_only import Malformed, Refusal, Unsupported
from kiln.serialization import _MAX_DIMS, _MAX_NBYTES, _short

# ------------------------------------------------------------------------------ torch names -> kiln

STORAGE_DTYPES = {  # torch's storage classes, torch.<prefix>Storage, of kiln's dtypes
    "Double": dt.float64,
    "Float": dt.float32,
    "Half": dt.float16,
    "BFloat16": dt.bfloat16,
    "Long": dt.int64,
    "Int": dt.int32,
    "Short": dt.int16,
    "Char": dt.int8,
    "Byte": dt.uint8,
    "Bool": dt.bool,
}
_UNSUPPORTED_STORAGES = {
    "ComplexFloat": "complex64",
    "ComplexDouble": "complex128",
    "QInt8": "qint8",
    "QUInt8": "quint8",
    "QInt32": "qint32",
    "QUInt4x2": "quint4x2",
    "QUInt2x4": "quint2x4",
}
_UNSUPPORTED_DTYPES = (
    "complex32 complex64 complex128 uint16 uint32 uint64 float8_e4m3fn float8_e4m3fnuz float8_e5m2 float8_e5m2fnuz "
    "float8_e8m0fnu float4_e2m1fn_x2 qint8 quint8 qint32 quint4x2 quint2x4 bits1x8 bits2x4 bits4x2 bits8 bits16 "
    + " ".join(f"int{i} uint{i}" for i in range(1, 8))
).split()


class StorageType:
    """What ``torch.FloatStorage`` (and the other storage classes) load as: the dtype of a storage."""

    __slots__ = ("name", "dtype", "torch_dtype")

    def __init__(self, name: str, dtype: dt.dtype | None, torch_dtype: str | None = None) -> None:
        self.name, self.dtype, self.torch_dtype = name, dtype, torch_dtype

    def __repr__(self) -> str:
        return f"StorageType({self.name})"


_UNTYPED = StorageType("UntypedStorage", dt.uint8)


def _unsupported_dtype(name: str) -> Refusal:
    return Refusal(f"the file holds torch.{name} values, which kiln has no dtype for")


def _parameter_class() -> type | None:
    """kiln-nn's ``Parameter`` when kiln-nn is installed (the core does not depend on it)."""
    if importlib.util.find_spec("kiln.nn") is None:
        return None
    return importlib.import_module("kiln.nn.parameter").Parameter


def _no_parameter(*args: Any) -> None:
    raise Unsupported("the file holds a torch.nn.Parameter object; install kiln-nn to load kiln.nn.Parameter")


def _checked_tensor(t: Any, what: str) -> Tensor:
    if not isinstance(t, Tensor):
        raise Malformed(f"{what} must be a tensor, got {type(t).__name__}")
    return t


def _view(storage: Any, offset: Any, size: Any, stride: Any, dtype: dt.dtype | None = None) -> Tensor:
    """A tensor over ``storage`` (a loaded one-dimensional storage tensor), every argument checked."""
    storage = _checked_tensor(storage, "a tensor's storage")
    if storage.dim() != 1 or storage._stride != (1,):
        raise Malformed("a tensor's storage must be a storage from the file")
    if dtype is not None and dtype is not storage._dtype:
        storage = _reinterpret(storage, dtype)
    if not isinstance(size, (tuple, list)) or not isinstance(stride, (tuple, list)) or len(size) != len(stride):
        raise Malformed(f"tensor sizes {_short(size)} and strides {_short(stride)} must be sequences of one length")
    if len(size) > _MAX_DIMS:
        raise Malformed(f"a tensor has {len(size)} dimensions (at most {_MAX_DIMS})")
    ints = (*size, *stride, offset)
    if not all(type(v) is int for v in ints) or min(ints, default=0) < 0:
        raise Malformed(
            f"tensor sizes {_short(size)}, strides {_short(stride)} and storage offset {_short(offset)} must be "
            "non-negative ints"
        )
    numel, span = 1, 1
    for n, s in zip(size, stride):
        numel *= n
        span += (n - 1) * s if n else 0
    itemsize = storage._dtype.itemsize
    if numel * itemsize > _MAX_NBYTES or offset * itemsize > _MAX_NBYTES:
        raise Malformed(f"a tensor of size {_short(size)} at offset {offset} is larger than any array")
    have = storage._shape[0]
    if numel and offset + span > have:
        raise Malformed(
            f"a tensor of size {_short(list(size))}, strides {_short(list(stride))} and storage offset {offset} "
            f"needs {offset + span} elements of its storage, which has {have}"
        )
    return _make(
        storage._storage,
        tuple(size),
        tuple(stride),
        storage._offset + offset,
        storage._dtype,
        storage._device,
        storage._vc,
    )


def _reinterpret(storage: Tensor, dtype: Any) -> Tensor:
    """An untyped (byte) storage as elements of ``dtype`` (``_rebuild_tensor_v3``); one per storage and dtype."""
    if not isinstance(dtype, dt.dtype):
        raise Malformed(f"_rebuild_tensor_v3 needs a dtype, got {_short(dtype)}")
    if storage._dtype is not dt.uint8 or storage._device is not CPU:
        raise Unsupported("a typed storage reinterpreted as another dtype (or off the CPU) is not supported")
    cache = storage.__dict__.setdefault("_kiln_as_dtype", {})
    if dtype not in cache:
        raw = storage._numpy()
        if raw.nbytes % dtype.itemsize:
            raise Malformed(f"a storage of {raw.nbytes} bytes holds no whole number of {dtype} elements")
        cache[dtype] = _make(raw.view(dtype.numpy), (raw.nbytes // dtype.itemsize,), (1,), 0, dtype, CPU, storage._vc)
    return cache[dtype]


def _grad(t: Tensor, requires_grad: Any) -> Tensor:
    if type(requires_grad) is not bool:
        raise Malformed(f"requires_grad must be a bool, got {_short(requires_grad)}")
    if requires_grad:
        if not t._dtype.is_floating_point:
            raise Malformed(f"a tensor of dtype {t._dtype} asks for requires_grad")
        t.requires_grad_(True)
    return t


def _hooks_and_metadata(hooks: Any, metadata: Any) -> None:
    if not isinstance(hooks, dict):  # hooks are never saved (PyTorch warns); an empty OrderedDict
        raise Malformed(f"backward_hooks must be a dict, got {type(hooks).__name__}")
    if metadata is not None and (not isinstance(metadata, dict) or any(metadata.values())):
        raise Unsupported(f"tensor metadata {_short(metadata)} (conjugate/negative bits) is not supported")


def _rebuild_tensor(storage: Any, storage_offset: Any, size: Any, stride: Any) -> Tensor:
    return _view(storage, storage_offset, size, stride)


def _rebuild_tensor_v2(
    storage: Any,
    storage_offset: Any,
    size: Any,
    stride: Any,
    requires_grad: Any,
    backward_hooks: Any,
    metadata: Any = None,
) -> Tensor:
    _hooks_and_metadata(backward_hooks, metadata)
    return _grad(_view(storage, storage_offset, size, stride), requires_grad)


def _rebuild_tensor_v3(
    storage: Any,
    storage_offset: Any,
    size: Any,
    stride: Any,
    requires_grad: Any,
    backward_hooks: Any,
    dtype: Any,
    metadata: Any = None,
) -> Tensor:
    _hooks_and_metadata(backward_hooks, metadata)
    if not isinstance(dtype, dt.dtype):
        raise Malformed(f"_rebuild_tensor_v3 needs a dtype, got {_short(dtype)}")
    return _grad(_view(storage, storage_offset, size, stride, dtype), requires_grad)


def _as_parameter(data: Any, requires_grad: Any) -> Tensor:
    data = _checked_tensor(data, "a parameter's data")
    cls = _parameter_class()
    if type(requires_grad) is not bool:
        raise Malformed(f"requires_grad must be a bool, got {_short(requires_grad)}")
    if cls is None:  # without kiln-nn: the tensor, with its requires_grad
        return _grad(data.detach(), requires_grad)
    if requires_grad and not data._dtype.is_floating_point:
        raise Malformed(f"a parameter of dtype {data._dtype} asks for requires_grad")
    return cls(data, requires_grad)


def _rebuild_parameter(data: Any, requires_grad: Any, backward_hooks: Any) -> Tensor:
    _hooks_and_metadata(backward_hooks, None)
    return _as_parameter(data, requires_grad)


def _rebuild_parameter_with_state(data: Any, requires_grad: Any, backward_hooks: Any, state: Any) -> Tensor:
    out = _rebuild_parameter(data, requires_grad, backward_hooks)
    return set_obj_state(out, state)


_TENSOR_SLOTS = frozenset(Tensor.__slots__)


def set_obj_state(obj: Tensor, state: Any) -> Tensor:
    """Python attributes saved with a tensor (``t.note = ...``); kiln's own fields can't be set this way."""
    dict_state, slots_state = state if isinstance(state, tuple) and len(state) == 2 else (state, None)
    for part in (dict_state, slots_state):
        if not part:
            continue
        if not isinstance(part, dict) or not all(type(k) is str for k in part):
            raise Malformed(f"a tensor's saved state must map str names to values, got {_short(part)}")
        for k, v in part.items():
            if k in _TENSOR_SLOTS or (k.startswith("__") and k.endswith("__")) or k.startswith("_kiln"):
                raise Malformed(f"a tensor's saved state sets its internal attribute {k!r}")
            setattr(obj, k, v)
    return obj


def _rebuild_from_type_v2(func: Any, new_type: Any, args: Any, state: Any) -> Tensor:
    if not any(func is f for f in _TENSOR_REBUILDS) or type(args) is not tuple:
        raise Malformed(f"_rebuild_from_type_v2 needs a tensor rebuild function and its arguments, got {_short(func)}")
    if not (isinstance(new_type, type) and issubclass(new_type, Tensor)):
        raise Malformed(f"_rebuild_from_type_v2 rebuilds tensors, not {_short(new_type)}")
    ret = _checked_tensor(func(*args), "_rebuild_from_type_v2's result")
    if type(ret) is not new_type:
        ret = Tensor._make_subclass(new_type, ret, ret.requires_grad)
    setstate = getattr(type(ret), "__setstate__", None)
    if setstate is not None and setstate is not getattr(Tensor, "__setstate__", None):
        ret.__setstate__(state)
        return ret
    return set_obj_state(ret, state)


def _rebuild_device_tensor_from_cpu_tensor(data: Any, dtype: Any, device: Any, requires_grad: Any) -> Tensor:
    data = _checked_tensor(data, "the tensor data")
    if not isinstance(dtype, dt.dtype) or not isinstance(device, (str, _device)):
        raise Malformed("_rebuild_device_tensor_from_cpu_tensor needs a dtype and a device")
    return _grad(data.to(device=device, dtype=dtype), requires_grad)


def _rebuild_device_tensor_from_numpy(data: Any, dtype: Any, device: Any, requires_grad: Any) -> Tensor:
    from kiln._ops.creation import tensor

    if not isinstance(data, np.ndarray):
        raise Malformed("_rebuild_device_tensor_from_numpy needs a NumPy array")
    return _rebuild_device_tensor_from_cpu_tensor(tensor(data), dtype, device, requires_grad)


def _unsupported_rebuild(what: str) -> Callable:
    def refuse(*args: Any) -> None:
        raise Unsupported(f"the file holds {what}, which kiln does not have")

    refuse.__qualname__ = refuse.__name__ = f"refuse_{what.replace(' ', '_')}"
    return refuse


def _bytearray(*args: Any) -> bytearray:
    """``builtins.bytearray`` as protocol 2 pickles it (``bytearray(str, 'latin-1')``), never from a size."""
    if args and isinstance(args[0], int):
        raise Malformed("bytearray(n) in a pickle would allocate n bytes; only bytearray(data) is accepted")
    return bytearray(*args)


def _codecs_encode(obj: Any, encoding: str = "utf-8") -> bytes:
    """``_codecs.encode`` as protocol 2 pickles bytes: a str encoded with latin-1."""
    if type(obj) is not str or encoding not in ("latin1", "latin-1"):
        raise Malformed(f"_codecs.encode is accepted only for bytes (a str and 'latin1'), got {_short(encoding)}")
    return obj.encode("latin1")


_TENSOR_REBUILDS = (
    _rebuild_tensor,
    _rebuild_tensor_v2,
    _rebuild_tensor_v3,
    _rebuild_parameter,
    _rebuild_parameter_with_state,
    _rebuild_device_tensor_from_cpu_tensor,
    _rebuild_device_tensor_from_numpy,
)


@functools.lru_cache(maxsize=1)
def _torch_table() -> dict[str, Any]:
    table: dict[str, Any] = {}
    for prefix, d in STORAGE_DTYPES.items():
        st = StorageType(f"{prefix}Storage", d)
        table[f"torch.{prefix}Storage"] = table[f"torch.cuda.{prefix}Storage"] = st
    for prefix, name in _UNSUPPORTED_STORAGES.items():
        st = StorageType(f"{prefix}Storage", None, name)
        table[f"torch.{prefix}Storage"] = table[f"torch.cuda.{prefix}Storage"] = st
    table["torch.storage.UntypedStorage"] = table["torch.UntypedStorage"] = _UNTYPED
    for d in dt.ALL_DTYPES:
        table[f"torch.{d.name}"] = d
    for name in _UNSUPPORTED_DTYPES:
        table[f"torch.{name}"] = _unsupported_dtype(name)
    for fn in _TENSOR_REBUILDS:
        table[f"torch._utils.{fn.__name__}"] = fn
    for fn_name, what in (
        ("_rebuild_qtensor", "quantized tensors"),
        ("_rebuild_sparse_tensor", "sparse tensors"),
        ("_rebuild_nested_tensor", "nested tensors"),
        ("_rebuild_wrapper_subclass", "tensor wrapper subclasses"),
        ("_rebuild_meta_tensor_no_storage", "meta tensors"),
    ):
        table[f"torch._utils.{fn_name}"] = _unsupported_rebuild(what)
    table["torch.serialization._get_layout"] = _unsupported_rebuild("tensor layouts")
    table["torch._tensor._rebuild_from_type_v2"] = table["torch.tensor._rebuild_from_type_v2"] = _rebuild_from_type_v2
    table["torch.Size"] = Size
    table["torch.device"] = _device
    table["torch.Tensor"] = Tensor
    table["torch.nn.parameter.Parameter"] = _parameter_class() or _no_parameter
    import kiln
    from kiln._ops.legacy import LEGACY_TYPE_NAMES

    for name in LEGACY_TYPE_NAMES.values():  # torch.FloatTensor and friends
        table[f"torch.{name}"] = getattr(kiln, name)
    return table


@functools.lru_cache(maxsize=1)
def _default_allowed() -> dict[str, Any]:
    table = dict(_torch_table())
    table.update(
        {
            "collections.OrderedDict": OrderedDict,
            "collections.Counter": Counter,
            "builtins.set": set,
            "builtins.complex": complex,
            "builtins.bytearray": _bytearray,
            "_codecs.encode": _codecs_encode,
            "kiln._dtype._dtype_by_name": dt._dtype_by_name,
            "kiln._tensor.Size": Size,
            "kiln._tensor.Tensor": Tensor,
            "kiln._device.device": _device,
        }
    )
    return table


def allowed_globals(user: dict[str, Any]) -> dict[str, Any]:
    """The weights-only allow-list: kiln's defaults, then what ``add_safe_globals`` added."""
    out = dict(_default_allowed())
    out.update(user)
    return out


def full_find_class(module: str, name: str) -> Any:
    """The kiln object for a torch name (``weights_only=False``); None for names that are not torch's."""
    module = "torch._tensor" if module == "torch.tensor" else module
    full = f"{module}.{name}"
    table = _torch_table()
    if full in table:
        if type(table[full]) is Refusal:
            raise table[full].error()
        return table[full]
    if module == "torch" or module.startswith("torch."):
        if "Storage" in name:  # as PyTorch: any storage class by its name
            return StorageType(name, STORAGE_DTYPES.get(name.removesuffix("Storage")))
        raise Unsupported(f"the file refers to {full}, which has no kiln counterpart")
    return None


def build_hook(parameter: type | None) -> Callable[[Any, Any], bool]:
    """``BUILD`` for the objects PyTorch's weights-only unpickler builds itself: tensors, parameters, OrderedDict."""

    def build(inst: Any, state: Any) -> bool:
        if type(inst) is Tensor or (parameter is not None and type(inst) is parameter):
            if type(inst) is Tensor and isinstance(state, tuple) and len(state) == 4:  # legacy Tensor.set_
                src = _view(*state)
                for slot in ("_storage", "_shape", "_stride", "_offset", "_dtype", "_device", "_vc"):
                    setattr(inst, slot, getattr(src, slot))
                inst._np = None
            else:
                set_obj_state(inst, state)
            return True
        if type(inst) is OrderedDict:  # a state_dict's _metadata
            if not isinstance(state, dict) or not all(type(k) is str for k in state):
                raise Malformed("BUILD state of an OrderedDict must be a dict with str keys")
            inst.__dict__.update(state)
            return True
        return False

    return build
