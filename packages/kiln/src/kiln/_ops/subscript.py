"""``Tensor.__getitem__`` and ``Tensor.__setitem__``: PyTorch's indexing rules.

A key is split in two. Integers, slices, ``None`` and ``...`` make a view (basic indexing, no copy);
integer and boolean tensors (or lists, ranges and NumPy arrays, which become tensors) then index that
view through the ``_index`` op (reading) or ``index_put_`` (writing), where a ``None`` entry keeps a
dim whole. As in PyTorch, integers are applied as views first, so ``x[0, :, [1, 2]]`` has shape
``(4, 2)`` for ``x`` of shape ``(3, 4, 5)``; the index tensors' broadcast dims replace the indexed
dims when those are adjacent and come first otherwise (NumPy's rule). A Python ``bool`` (or a 0-d
boolean tensor) adds a dim of size 1 (``True``) or 0 (``False``).
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Sequence

import numpy as np

from kiln import _dtype as dt
from kiln._ops.copy import copy_
from kiln._ops.creation import tensor
from kiln._ops.index import _index
from kiln._ops.views import _expand_meta, _normalize_key, basic_index
from kiln._tensor import Tensor

_BASIC = (int, slice, type(None), type(Ellipsis))
_ALL = slice(None)
_INT = (dt.int64, dt.int32, dt.int16, dt.int8)
_INDEX_DTYPES = (*_INT, dt.uint8, dt.bool)


def _is_basic(key) -> bool:
    if isinstance(key, tuple):
        return all(isinstance(k, _BASIC) and not isinstance(k, bool) for k in key)
    return isinstance(key, _BASIC) and not isinstance(key, bool)


def _as_tuple(key) -> tuple:
    """The key as a tuple of components; a short non-tuple sequence holding sequences, slices, ``None``,
    ``...`` or tensors is read as a tuple (with PyTorch's deprecation warning), any other as one index."""
    if isinstance(key, tuple):
        return key
    if (
        isinstance(key, (list, range))
        and len(key) < 32
        and any(isinstance(k, (Tensor, np.ndarray, Sequence, slice)) or k is None or k is Ellipsis for k in key)
    ):
        warnings.warn(
            "Using a non-tuple sequence for multidimensional indexing is deprecated; use x[tuple(seq)] "
            "instead of x[seq]. A future release will read it as a tensor index, x[kiln.tensor(seq)].",
            UserWarning,
            stacklevel=3,
        )
        return tuple(key)
    return (key,)


def _index_tensor(k, device) -> Tensor:
    """A sequence or array index as a tensor (an empty one is int64, as PyTorch makes it)."""
    if isinstance(k, (list, tuple, range)) and len(k) == 0:
        return tensor([], dtype=dt.int64, device=device)
    try:
        return tensor(list(k) if isinstance(k, range) else k, device=device)
    except (TypeError, ValueError):
        raise IndexError(
            "only integers, slices (`:`), ellipsis (`...`), None and long or byte Variables are valid indices "
            f"(got {type(k).__name__})"
        ) from None


_COVERED = object()  # a dim a multi-dim mask covers after its first


def _split(self: Tensor, key) -> tuple[list, list]:
    """(basic key, index per component): the basic key has a whole-dim slice for each dim an index
    tensor covers, and ``None`` for each Python bool (a new dim, indexed by a one-element mask)."""
    basic, adv = [], []
    for k in _as_tuple(key):
        if isinstance(k, (np.ndarray, list, tuple, range)):
            k = _index_tensor(k, self._device)
        if isinstance(k, Tensor) and not k._shape and (k._dtype is dt.bool or (self._shape and k._dtype in _INT)):
            k = k.item()  # a 0-d index tensor acts as the number it holds (a bool, or an int: a select view)
        if isinstance(k, bool):
            basic.append(None)
            adv.append(tensor([k], device=self._device))
        elif isinstance(k, Tensor):
            if k._dtype not in _INDEX_DTYPES:
                raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
            width = max(len(k._shape), 1) if k._dtype in (dt.bool, dt.uint8) else 1
            basic.extend([_ALL] * width)
            adv.extend([k] + [_COVERED] * (width - 1))
        else:
            basic.append(int(k) if isinstance(k, numbers.Integral) else k)
            adv.append(None)
    return basic, adv


def _locate(self: Tensor, key) -> tuple[Tensor, list | None]:
    """The basic-indexing view of ``key`` and the index list (``None`` = whole dim) for its advanced part."""
    basic, adv = _split(self, key)
    nd = len(self._shape)
    if not nd and any(isinstance(a, Tensor) and k is not None for k, a in zip(basic, adv)):
        raise IndexError("too many indices for tensor of dimension 0")
    if Ellipsis in basic:  # expanded here, so that each component keeps its index
        i = basic.index(Ellipsis)
        fill = max(nd - sum(1 for k in basic if k is not None and k is not Ellipsis), 0)
        basic[i : i + 1] = [_ALL] * fill
        adv[i : i + 1] = [None] * fill
    norm = _normalize_key(tuple(basic), nd)  # validates (too many indices, 0-d, a second "...")
    trivial = len(norm) <= nd and all(isinstance(k, slice) and k == _ALL for k in norm)
    view = self if trivial else basic_index(self, norm)
    indices = [a for k, a in zip(basic, adv) if not isinstance(k, int) and a is not _COVERED]
    while indices and indices[-1] is None:
        indices.pop()
    return view, (indices or None)


def getitem(self: Tensor, key):
    """``self[key]``: a view for basic keys, a copy (``IndexBackward0``) when tensors index it."""
    if _is_basic(key):
        return basic_index(self, _normalize_key(key, len(self._shape)))
    view, indices = _locate(self, key)
    if indices is None:
        return view
    return _index(view, indices)


def setitem(self: Tensor, key, value) -> None:
    """``self[key] = value``: a copy into the basic view, or ``index_put_`` for tensor indices. A Python
    number is cast to ``self``'s dtype; a tensor value must match it (PyTorch's rule for index writes)."""
    if isinstance(value, (list, tuple, np.ndarray)):
        raise TypeError(f"can't assign a {_type_name(value)} to a {_tensor_type_name(self)}")
    if _is_basic(key):
        view, indices = basic_index(self, _normalize_key(key, len(self._shape))), None
    else:
        view, indices = _locate(self, key)
    if indices is None:
        if isinstance(value, Tensor) and value._shape != view._shape:
            _expand_meta(value, view._shape)  # indexing assignment expands the value: PyTorch's message
        copy_(view, value)
        return
    if not isinstance(value, Tensor):
        if not isinstance(value, (numbers.Number, np.generic)):
            raise TypeError(f"can't assign a {_type_name(value)} to a {_tensor_type_name(self)}")
        value = tensor(value, dtype=self._dtype, device=self._device)
    view.index_put_(indices, value)


def _type_name(value) -> str:
    cls = type(value)
    return cls.__name__ if cls.__module__ == "builtins" else f"{cls.__module__.split('.')[0]}.{cls.__name__}"


def _tensor_type_name(t: Tensor) -> str:
    from kiln._ops._meta import scalar_type_name

    return f"kiln.{scalar_type_name(t._dtype)}Tensor"


Tensor.__getitem__ = getitem
Tensor.__setitem__ = setitem
