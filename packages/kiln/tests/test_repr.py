"""``repr(tensor)`` equals torch's with ``torch.`` read as ``kiln.``."""

from __future__ import annotations

import pytest
import torch

import kiln

REPR_CASES = {
    "ints": lambda L: L.tensor([1, 2, 3]),
    "negative ints": lambda L: L.tensor([-1, 100, 5]),
    "int32": lambda L: L.tensor([1, 2], dtype=L.int32),
    "uint8": lambda L: L.tensor([0, 255], dtype=L.uint8),
    "int8 2-d": lambda L: L.tensor([[1, -2], [3, 4]], dtype=L.int8),
    "floats with decimals": lambda L: L.tensor([1.5, 2.25, -3.125]),
    "integral floats": lambda L: L.tensor([1.0, 2.0, 3.0]),
    "integral negative floats": lambda L: L.tensor([-1.0, 20.0, 3.0]),
    "mixed floats": lambda L: L.tensor([1.0, 2.5]),
    "thirds": lambda L: L.tensor([1 / 3, 2 / 3, -1 / 3]),
    "small needs sci": lambda L: L.tensor([1e-5, 1.0]),
    "large needs sci": lambda L: L.tensor([1e10, 1.0]),
    "tiny only": lambda L: L.tensor([1e-10]),
    "large integral": lambda L: L.tensor([123456789.0]),
    "1e8 boundary": lambda L: L.tensor([1e8, 1.0]),
    "1e-4 boundary": lambda L: L.tensor([0.0001, 0.5]),
    "range 1000": lambda L: L.tensor([0.5, 600.0]),
    "range just over 1000": lambda L: L.tensor([0.5, 501.0]),
    "zero and small": lambda L: L.tensor([0.0, 1e-5]),
    "nan inf": lambda L: L.tensor([float("nan"), 1.5, float("inf"), float("-inf")]),
    "all nan": lambda L: L.tensor([float("nan")]),
    "neg zero": lambda L: L.tensor([-0.0, 1.0]),
    "bool": lambda L: L.tensor([True, False, True]),
    "bool 2-d": lambda L: L.tensor([[True], [False]]),
    "0-d int": lambda L: L.tensor(7),
    "0-d float": lambda L: L.tensor(3.5),
    "0-d integral float": lambda L: L.tensor(3.0),
    "0-d bool": lambda L: L.tensor(True),
    "0-d float64": lambda L: L.tensor(2.5, dtype=L.float64),
    "empty float": lambda L: L.tensor([]),
    "empty int": lambda L: L.tensor([], dtype=L.int64),
    "empty 2-d": lambda L: L.zeros(0, 3),
    "empty 2-d int32": lambda L: L.zeros(2, 0, dtype=L.int32),
    "empty float64": lambda L: L.zeros(0, dtype=L.float64),
    "requires_grad": lambda L: L.tensor([1.0, 2.0], requires_grad=True),
    "requires_grad float64": lambda L: L.tensor([1.5], dtype=L.float64, requires_grad=True),
    "grad_fn": lambda L: L.tensor([1.0, 2.0], requires_grad=True) * 2,
    "grad_fn sum": lambda L: L.tensor([1.0, 2.0], requires_grad=True).sum(),
    "float64": lambda L: L.tensor([1.5, 2.0], dtype=L.float64),
    "float16": lambda L: L.tensor([1.5, 2.0], dtype=L.float16),
    "bfloat16": lambda L: L.tensor([1.5, 2.0], dtype=L.bfloat16),
    "float16 decimals": lambda L: L.tensor([0.1, 0.2], dtype=L.float16),
    "2-d floats": lambda L: L.tensor([[1.5, -2.0], [3.25, 4.0]]),
    "2-d ints": lambda L: L.arange(12).reshape(3, 4),
    "3-d ints": lambda L: L.arange(24).reshape(2, 3, 4),
    "3-d floats": lambda L: L.arange(12.0).reshape(2, 3, 2) / 7,
    "4-d": lambda L: L.arange(16).reshape(2, 2, 2, 2),
    "long line wraps": lambda L: L.arange(30.0) * 1.5,
    "long int line": lambda L: L.arange(40) * 1000,
    "summarized 1-d": lambda L: L.arange(2000),
    "summarized floats": lambda L: L.arange(2000.0) / 3,
    "summarized 2-d": lambda L: L.arange(4000).reshape(40, 100),
    "non-contiguous": lambda L: L.arange(12.0).reshape(3, 4).t(),
    "expanded": lambda L: L.tensor([[1.0], [2.0]]).expand(2, 3),
    "scalar-like 1-element": lambda L: L.tensor([5.0]),
    "sci 2-d": lambda L: L.tensor([[1e-6, 1.0], [1e6, 2.0]]),
    "negative sci": lambda L: L.tensor([-1e-7, 3.0]),
}


@pytest.mark.parametrize("name", list(REPR_CASES))
def test_repr_matches_torch(name):
    fn = REPR_CASES[name]
    t = fn(torch)
    k = fn(kiln)
    assert repr(k) == repr(t).replace("torch.", "kiln.")


@pytest.mark.parametrize("name", ["floats with decimals", "ints", "empty float", "0-d float", "float16", "float64"])
def test_repr_with_default_float64(name, default_dtype):
    default_dtype(kiln.float64)
    fn = REPR_CASES[name]
    assert repr(fn(kiln)) == repr(fn(torch)).replace("torch.", "kiln.")
    assert repr(kiln.tensor([1.5], dtype=kiln.float32)) == repr(torch.tensor([1.5], dtype=torch.float32)).replace(
        "torch.", "kiln."
    )


def test_str_equals_repr():
    for fn in (REPR_CASES["ints"], REPR_CASES["grad_fn"], REPR_CASES["float64"]):
        assert str(fn(kiln)) == str(fn(torch)).replace("torch.", "kiln.")


def test_repr_of_sizes_dtypes_and_return_types():
    assert repr(kiln.ones(2, 3).shape) == repr(torch.ones(2, 3).shape).replace("torch.", "kiln.")
    assert repr(kiln.ones(()).shape) == repr(torch.ones(()).shape).replace("torch.", "kiln.")
    assert repr(kiln.float32) == "kiln.float32"
    k = kiln.tensor([[1.0, 3.0], [2.0, 0.0]]).max(1)
    t = torch.tensor([[1.0, 3.0], [2.0, 0.0]]).max(1)
    assert repr(k) == repr(t).replace("torch.", "kiln.")


def test_repr_of_device_and_grad_fn_node():
    assert repr(kiln.device("cpu")) == repr(torch.device("cpu"))
    assert repr(kiln.device("cuda", 1)) == repr(torch.device("cuda", 1))
    k = (kiln.ones(2, requires_grad=True) * 2).grad_fn
    t = (torch.ones(2, requires_grad=True) * 2).grad_fn
    assert repr(k).split(" object at ")[0] == repr(t).split(" object at ")[0]
