"""kiln dtypes and PyTorch's type-promotion rules.

A :class:`dtype` is an interned singleton (``kiln.float32 is kiln.float32``), so hot paths compare
dtypes with ``is``. Promotion results are memoised in a plain dict keyed by dtype pairs.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "dtype",
    "bool",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "promote_types",
    "get_default_dtype",
    "set_default_dtype",
]

_builtin_bool = bool


def _bfloat16_numpy() -> np.dtype:
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


class dtype:
    """A tensor element type, the counterpart of ``torch.dtype``.

    Attributes mirror PyTorch's: ``is_floating_point``, ``is_signed``, ``itemsize``; ``numpy`` gives
    the NumPy dtype used for host buffers (``ml_dtypes.bfloat16`` for ``kiln.bfloat16``).
    """

    __slots__ = ("name", "itemsize", "is_floating_point", "is_signed", "_kind", "_rank", "_np")

    def __init__(self, name: str, itemsize: int, kind: str, rank: int, np_dtype: np.dtype | None):
        self.name = name
        self.itemsize = itemsize
        self._kind = kind  # "b" bool, "u"/"i" integer, "f" floating
        self._rank = rank
        self.is_floating_point = kind == "f"
        self.is_signed = kind in "if"
        self._np = np_dtype

    @property
    def numpy(self) -> np.dtype:
        """The NumPy dtype that holds this dtype's values on the host."""
        if self._np is None:  # bfloat16: ml_dtypes is imported on first use, not at import kiln
            self._np = _bfloat16_numpy()
        return self._np

    @property
    def is_complex(self) -> _builtin_bool:
        """Always False: kiln has no complex dtypes yet."""
        return False

    def to_real(self) -> dtype:
        """The dtype itself (PyTorch's ``dtype.to_real`` for real types)."""
        return self

    def __repr__(self) -> str:
        return f"kiln.{self.name}"

    def __reduce__(self):
        return (_dtype_by_name, (self.name,))


bool = dtype("bool", 1, "b", 0, np.dtype(np.bool_))  # noqa: A001 - mirrors torch.bool
uint8 = dtype("uint8", 1, "u", 1, np.dtype(np.uint8))
int8 = dtype("int8", 1, "i", 1, np.dtype(np.int8))
int16 = dtype("int16", 2, "i", 2, np.dtype(np.int16))
int32 = dtype("int32", 4, "i", 3, np.dtype(np.int32))
int64 = dtype("int64", 8, "i", 4, np.dtype(np.int64))
float16 = dtype("float16", 2, "f", 5, np.dtype(np.float16))
bfloat16 = dtype("bfloat16", 2, "f", 5, None)
float32 = dtype("float32", 4, "f", 6, np.dtype(np.float32))
float64 = dtype("float64", 8, "f", 7, np.dtype(np.float64))

ALL_DTYPES = (bool, uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64)
"""Every dtype kiln has, in PyTorch's promotion order within each category."""
_BY_NAME = {d.name: d for d in ALL_DTYPES}
# The C++ type names PyTorch's messages print for each dtype (its TypeMeta names: "long int", "c10::Half").
CPP_TYPE_NAMES = {
    float32: "float",
    float64: "double",
    float16: "c10::Half",
    bfloat16: "c10::BFloat16",
    int64: "long int",
    int32: "int",
    int16: "short int",
    int8: "signed char",
    uint8: "unsigned char",
    bool: "bool",
}
# PyTorch's aliases
_BY_NAME.update(half=float16, float=float32, double=float64, long=int64, int=int32, short=int16)


def _dtype_by_name(name: str) -> dtype:
    return _BY_NAME[name]


_FROM_NUMPY: dict[np.dtype, dtype] = {d._np: d for d in ALL_DTYPES if d._np is not None}


def from_numpy_dtype(np_dtype: np.dtype) -> dtype:
    """The kiln dtype for a NumPy dtype; raises TypeError for types kiln cannot hold."""
    d = _FROM_NUMPY.get(np_dtype)
    if d is not None:
        return d
    if np_dtype.name == "bfloat16":
        _FROM_NUMPY[np_dtype] = bfloat16
        return bfloat16
    raise TypeError(
        f"can't convert np.ndarray of type numpy.{np_dtype.type.__name__}. The only supported types are: "
        "float64, float32, float16, bfloat16, int64, int32, int16, int8, uint8, and bool."
    )


def _promote_pair(a: dtype, b: dtype) -> dtype:
    if a is b:
        return a
    if a._kind == "b":
        return b
    if b._kind == "b":
        return a
    if a.is_floating_point or b.is_floating_point:
        if a.is_floating_point and b.is_floating_point:
            if {a, b} == {float16, bfloat16}:
                return float32
            return a if a._rank > b._rank else b
        return a if a.is_floating_point else b
    # both integers
    if a._kind == b._kind:
        return a if a._rank > b._rank else b
    unsigned, signed = (a, b) if a._kind == "u" else (b, a)
    if signed.itemsize > unsigned.itemsize:
        return signed
    return int16  # uint8 with int8


_PROMOTE: dict[tuple[dtype, dtype], dtype] = {(a, b): _promote_pair(a, b) for a in ALL_DTYPES for b in ALL_DTYPES}


def promote_types(type1: dtype, type2: dtype) -> dtype:
    """The smallest dtype to which both arguments can be converted (``torch.promote_types``)."""
    return _PROMOTE[(type1, type2)]


_default_dtype = float32


def get_default_dtype() -> dtype:
    """The default floating point dtype (``float32`` unless changed)."""
    return _default_dtype


def set_default_dtype(d: dtype) -> None:
    """Set the default floating point dtype; only float16, bfloat16, float32 and float64 are allowed."""
    global _default_dtype
    if not isinstance(d, dtype) or not d.is_floating_point:
        raise TypeError("only floating-point types are supported as the default type")
    _default_dtype = d


def combine_categories(higher: dtype | None, lower: dtype | None) -> dtype | None:
    """PyTorch's rule for combining the dtypes of operand groups of different priority."""
    if higher is None:
        return lower
    if lower is None:
        return higher
    if higher.is_floating_point:
        return higher
    if higher is bool or lower.is_floating_point:
        return _PROMOTE[(higher, lower)]
    return higher


COMPUTE_NUMPY: dict[dtype, np.dtype] = {}
""":func:`compute_numpy`'s results, filled on first use (a hot path reads it with ``.get``, no call)."""


def compute_numpy(d: dtype) -> np.dtype:
    """The NumPy dtype a reference kernel computes a ``d`` result in: float32 for float16 and bfloat16 (as
    PyTorch's CPU kernels do), ``d``'s own otherwise."""
    c = COMPUTE_NUMPY.get(d)
    if c is None:
        c = COMPUTE_NUMPY[d] = np.dtype(np.float32) if d is float16 or d is bfloat16 else d.numpy
    return c
