"""``kiln.device``: parsing and validation of device strings such as ``"cpu"``, ``"cuda:1"``, ``"example"``.

Devices are interned: ``kiln.device("cuda:0") is kiln.device("cuda", 0)``, so the dispatcher compares
them with ``is``. Parsing only checks syntax; whether a device type exists is the plugin manager's
business and is checked when a tensor is first placed on it.
"""

from __future__ import annotations

import re

__all__ = ["device"]

_DEVICE_RE = re.compile(r"^([a-zA-Z_][a-zA-Z0-9_]*)(?::(\d+))?$")
_INTERNED: dict[tuple[str, int | None], device] = {}


class device:
    """A device a tensor lives on: a type (``"cpu"``, ``"cuda"``, a plugin's name) and an optional index.

    ``kiln.device("cuda:1")``, ``kiln.device("cuda", 1)`` and ``kiln.device(other_device)`` are accepted,
    as in PyTorch. Instances are interned and immutable.
    """

    __slots__ = ("type", "index", "_str")

    def __new__(cls, type: str | device | int, index: int | None = None):
        if isinstance(type, device):
            if index is not None:
                raise TypeError("device(): a device object cannot be combined with an index")
            return type
        if isinstance(type, int) and not isinstance(type, bool):
            raise RuntimeError(
                "Integer device ordinals need a device type; use kiln.device('cuda', "
                f"{type}) or the string 'cuda:{type}'"
            )
        if not isinstance(type, str):
            raise TypeError(f"device() received an invalid combination of arguments - got ({type!r})")
        key = (type, index)
        dev = _INTERNED.get(key)
        if dev is not None:
            return dev
        if not type:
            raise RuntimeError("Device string must not be empty")
        m = _DEVICE_RE.match(type.strip())
        if m is None:
            raise RuntimeError(f"Invalid device string: '{type}'")
        dtype_name, idx_str = m.group(1), m.group(2)
        if idx_str is not None:
            if index is not None:
                raise RuntimeError(
                    f"type (string) must not include an index because index was passed explicitly: {type}"
                )
            index = int(idx_str)
        if index is not None:
            if isinstance(index, bool) or not isinstance(index, int):
                raise TypeError(f"device(): argument 'index' must be int, not {index.__class__.__name__}")
            if index < 0:
                raise RuntimeError(f"Device index must not be negative, got {index}")
        canon = (dtype_name, index)
        dev = _INTERNED.get(canon)
        if dev is None:
            dev = object.__new__(cls)
            object.__setattr__(dev, "type", dtype_name)
            object.__setattr__(dev, "index", index)
            object.__setattr__(dev, "_str", dtype_name if index is None else f"{dtype_name}:{index}")
            _INTERNED[canon] = dev
        _INTERNED[key] = dev
        return dev

    def __setattr__(self, name, value):
        raise AttributeError("kiln.device is immutable")

    def __repr__(self) -> str:
        if self.index is None:
            return f"device(type='{self.type}')"
        return f"device(type='{self.type}', index={self.index})"

    def __str__(self) -> str:
        return self._str

    def __eq__(self, other) -> bool:
        if isinstance(other, str):
            try:
                other = device(other)
            except (RuntimeError, TypeError):
                return False
        return self is other

    def __hash__(self) -> int:
        return hash((self.type, self.index))

    def __reduce__(self):
        return (device, (self._str,))


CPU = device("cpu")


def out_of_memory(exc: MemoryError) -> RuntimeError:
    """PyTorch's error for a failed host allocation (a ``RuntimeError``, not Python's ``MemoryError``),
    with the bytes asked for when NumPy says how many."""
    size = getattr(exc, "_total_size", None)  # NumPy's _ArrayMemoryError carries the request
    asked = f"you tried to allocate {size} bytes" if size is not None else str(exc)
    return RuntimeError(f"DefaultCPUAllocator: can't allocate memory: {asked}. Error code 12 (Cannot allocate memory)")


def as_device(value: str | device | None) -> device:
    """Normalise a user's device argument (``None`` means CPU)."""
    if value is None:
        return CPU
    if value.__class__ is device:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        # like torch: a bare ordinal means the accelerator of that index
        return device("cuda", value)
    return device(value)
