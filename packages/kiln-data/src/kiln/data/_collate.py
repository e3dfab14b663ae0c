"""``default_collate`` and ``default_convert``: samples into batches, as in ``torch.utils.data``."""

from __future__ import annotations

import collections.abc
import numbers

import numpy as np

import kiln

__all__ = ["default_collate", "default_convert"]

_ERR = "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found {}"
_NP_STR = ("U", "S", "O")


def _is_namedtuple(obj) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_fields")


def _stack(batch: list[kiln.Tensor]) -> kiln.Tensor:
    elem = batch[0]
    if elem.device.type == "cpu" and not any(t.requires_grad for t in batch):
        # One NumPy copy into a fresh array: the same values as kiln.stack, without per-tensor dispatch.
        shape = elem.shape
        for i, t in enumerate(batch):  # by position: list.index would compare tensors with ==
            if t.shape != shape:
                raise RuntimeError(
                    f"stack expects each tensor to be equal size, but got {list(shape)} at entry 0 and "
                    f"{list(t.shape)} at entry {i}"
                )
        arrays = [t.numpy() for t in batch]
        out = np.empty((len(batch), *shape), dtype=arrays[0].dtype)
        for i, a in enumerate(arrays):
            out[i] = a
        return kiln.from_numpy(out)
    return kiln.stack(batch, 0)


def default_collate(batch):
    """Stack a list of samples into a batch, recursively through their structure.

    Tensors are stacked on a new first dimension; NumPy arrays and NumPy scalars become tensors and are
    stacked; Python floats become a float64 tensor, ints (and bools) an int64 (bool) tensor; strings and
    bytes stay a list; dicts, namedtuples and sequences are collated field by field (tuples become lists,
    as in PyTorch).
    """
    elem = batch[0]
    elem_type = type(elem)
    if isinstance(elem, kiln.Tensor):
        return _stack(batch)
    if elem_type.__module__ == "numpy" and elem_type.__name__ not in ("str_", "string_", "bytes_"):
        if elem_type.__name__ in ("ndarray", "memmap"):
            if elem.dtype.kind in _NP_STR:
                raise TypeError(_ERR.format(elem.dtype))
            shape = elem.shape
            if any(b.shape != shape for b in batch):  # let kiln.stack word the error as PyTorch does
                return kiln.stack([kiln.from_numpy(np.array(b)) for b in batch], 0)
            return kiln.from_numpy(np.stack(batch))  # one copy; read-only sources (memmaps) are fine
        if elem.shape == ():  # NumPy scalar
            return kiln.as_tensor(np.array(batch))
    if isinstance(elem, float):
        return kiln.tensor(batch, dtype=kiln.float64)
    if isinstance(elem, bool):
        return kiln.tensor(batch)
    if isinstance(elem, int):
        return kiln.tensor(batch, dtype=kiln.int64)
    if isinstance(elem, str | bytes):
        return batch
    if isinstance(elem, collections.abc.Mapping):
        collated = {key: default_collate([d[key] for d in batch]) for key in elem}
        if elem_type is dict:
            return collated
        try:
            return elem_type(collated)
        except TypeError:
            return collated
    if _is_namedtuple(elem):
        return elem_type(*(default_collate(samples) for samples in zip(*batch)))
    if isinstance(elem, collections.abc.Sequence):
        it = iter(batch)
        size = len(next(it))
        if not all(len(e) == size for e in it):
            raise RuntimeError("each element in list of batch should be of equal size")
        transposed = list(zip(*batch))
        if isinstance(elem, tuple):
            return [default_collate(samples) for samples in transposed]
        collated = [default_collate(samples) for samples in transposed]
        if elem_type is list:
            return collated
        try:
            return elem_type(collated)
        except TypeError:
            return collated
    if isinstance(elem, numbers.Number):  # other numeric types (Fraction, Decimal): as float64
        return kiln.tensor([float(b) for b in batch], dtype=kiln.float64)
    raise TypeError(_ERR.format(elem_type))


def default_convert(data):
    """Convert one sample (no batching): NumPy arrays and scalars become tensors, recursively."""
    elem_type = type(data)
    if isinstance(data, kiln.Tensor):
        return data
    if elem_type.__module__ == "numpy" and elem_type.__name__ not in ("str_", "string_", "bytes_"):
        if elem_type.__name__ in ("ndarray", "memmap"):
            if data.dtype.kind in _NP_STR:
                return data
            return kiln.from_numpy(np.ascontiguousarray(data))
        if getattr(data, "shape", None) == ():
            return kiln.as_tensor(np.array(data))
    if isinstance(data, collections.abc.Mapping):
        converted = {key: default_convert(data[key]) for key in data}
        if elem_type is dict:
            return converted
        try:
            return elem_type(converted)
        except TypeError:
            return converted
    if _is_namedtuple(data):
        return elem_type(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]
    if isinstance(data, collections.abc.Sequence) and not isinstance(data, str | bytes):
        converted = [default_convert(d) for d in data]
        if elem_type is list:
            return converted
        try:
            return elem_type(converted)
        except TypeError:
            return converted
    return data
