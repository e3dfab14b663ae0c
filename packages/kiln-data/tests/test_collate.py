"""default_collate and default_convert against torch.utils.data's."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import kiln
from kiln.data import default_collate, default_convert

Point = collections.namedtuple("Point", ["x", "y"])


def structure(obj):
    """A library-neutral picture of a collated batch: container types, and (dtype, shape, values) at leaves."""
    if isinstance(obj, torch.Tensor | kiln.Tensor):
        return ("tensor", str(obj.dtype).split(".")[-1], tuple(obj.shape), obj.tolist())
    if isinstance(obj, dict):
        return ("dict", {k: structure(v) for k, v in obj.items()})
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return (type(obj).__name__, [structure(v) for v in obj])
    if isinstance(obj, list | tuple):
        return (type(obj).__name__, [structure(v) for v in obj])
    return ("leaf", obj)


def to_torch(sample):
    if isinstance(sample, kiln.Tensor):
        return torch.tensor(sample.tolist(), dtype=getattr(torch, str(sample.dtype).split(".")[-1]))
    if isinstance(sample, dict):
        return {k: to_torch(v) for k, v in sample.items()}
    if isinstance(sample, tuple) and hasattr(sample, "_fields"):
        return type(sample)(*(to_torch(v) for v in sample))
    if isinstance(sample, list | tuple):
        return type(sample)(to_torch(v) for v in sample)
    return sample


SAMPLES = {
    "tensors": lambda i: kiln.full((2, 3), float(i)),
    "int tensors": lambda i: kiln.tensor([i, i + 1]),
    "numpy": lambda i: np.full((2,), i, dtype=np.float32),
    "numpy int scalar": lambda i: np.int32(i),
    "numpy float scalar": lambda i: np.float64(i) / 2,
    "floats": lambda i: i / 2,
    "ints": lambda i: i,
    "bools": lambda i: i % 2 == 0,
    "strings": lambda i: f"s{i}",
    "bytes": lambda i: b"x" * i,
    "dict": lambda i: {"a": i, "b": kiln.full((2,), float(i)), "c": "text"},
    "tuple": lambda i: (kiln.full((1,), float(i)), i),
    "list": lambda i: [i, i * 2.0],
    "namedtuple": lambda i: Point(kiln.full((2,), float(i)), i),
    "nested": lambda i: {"p": Point(i, [i, {"q": np.arange(3) + i}]), "t": (f"n{i}", (i, 0.5))},
}


@pytest.mark.parametrize("kind", list(SAMPLES))
def test_default_collate_structure_matches_torch(kind):
    batch = [SAMPLES[kind](i) for i in range(4)]
    got = default_collate(batch)
    want = tud.default_collate([to_torch(b) for b in batch])
    assert structure(got) == structure(want)


def test_dataloader_collate_structure_matches_torch():
    data = [SAMPLES["nested"](i) for i in range(6)]
    got = list(kiln.data.DataLoader(data, batch_size=4, num_workers=1))
    want = list(tud.DataLoader([to_torch(d) for d in data], batch_size=4))
    assert [structure(g) for g in got] == [structure(w) for w in want]


@pytest.mark.parametrize("kind", ["numpy", "numpy int scalar", "tuple", "dict", "namedtuple", "nested", "ints"])
def test_default_convert_structure_matches_torch(kind):
    sample = SAMPLES[kind](3)
    assert structure(default_convert(sample)) == structure(tud.default_convert(to_torch(sample)))


def test_collate_errors_match_torch():
    with pytest.raises(RuntimeError, match="each element in list of batch should be of equal size"):
        default_collate([[1, 2], [1]])
    with pytest.raises(TypeError) as ke:
        default_collate([object(), object()])
    assert str(ke.value).startswith("default_collate: batch must contain tensors, numpy arrays, numbers")
    with pytest.raises(TypeError):
        default_collate([np.array(["a"]), np.array(["b"])])


def test_collate_stacks_into_fresh_memory():
    a = kiln.zeros(3)
    out = default_collate([a, a])
    out += 1
    assert a.tolist() == [0.0, 0.0, 0.0]


def test_collate_keeps_autograd_for_tensors_that_require_grad():
    a = kiln.ones(2, requires_grad=True)
    out = default_collate([a, a * 2])
    out.sum().backward()
    assert a.grad.tolist() == [3.0, 3.0]


def test_unequal_tensor_shapes_raise_torch_error_naming_the_entry():
    shapes = [(3,), (3,), (4,), (3,)]
    with pytest.raises(RuntimeError) as t:
        tud.default_collate([torch.zeros(s) for s in shapes])
    with pytest.raises(RuntimeError) as k:
        default_collate([kiln.zeros(s) for s in shapes])
    assert str(k.value) == str(t.value)
