"""kiln.testing.make_tensor: torch.testing.make_tensor's ranges, layouts and errors, on any device."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kiln
from kiln.testing import make_tensor

DTYPES = {
    kiln.bool: torch.bool,
    kiln.uint8: torch.uint8,
    kiln.int8: torch.int8,
    kiln.int16: torch.int16,
    kiln.int32: torch.int32,
    kiln.int64: torch.int64,
    kiln.float16: torch.float16,
    kiln.bfloat16: torch.bfloat16,
    kiln.float32: torch.float32,
    kiln.float64: torch.float64,
}
DEFAULT_RANGE = {kiln.bool: (0, 1), kiln.uint8: (0, 9)}


def _values(t: kiln.Tensor) -> np.ndarray:
    return t.detach().cpu().to(kiln.float64).numpy()


@pytest.mark.parametrize("dtype", list(DTYPES), ids=str)
def test_default_ranges_shape_and_dtype(dtype):
    kiln.manual_seed(0)
    t = make_tensor(40, 50, dtype=dtype, device="cpu")
    assert t.shape == (40, 50) and t.dtype is dtype and t.device == kiln.device("cpu")
    v = _values(t)
    if dtype.is_floating_point:
        assert v.min() >= -9 and v.max() <= 9 and v.std() > 3  # uniform on [-9, 9): spread out
    else:
        lo, hi = DEFAULT_RANGE.get(dtype, (-9, 9))
        assert v.min() == lo and v.max() == hi, (v.min(), v.max())  # 2000 draws hit both ends


@pytest.mark.parametrize("dtype", [kiln.int8, kiln.float32, kiln.uint8], ids=str)
def test_given_bounds(dtype):
    t = make_tensor((1000,), dtype=dtype, device="cpu", low=2, high=5)
    v = _values(t)
    assert v.min() >= 2 and v.max() < 5
    if not dtype.is_floating_point:
        assert set(np.unique(v)) == {2, 3, 4}


def test_reproducible_with_manual_seed():
    kiln.manual_seed(3)
    a = make_tensor(5, dtype=kiln.float32, device="cpu")
    kiln.manual_seed(3)
    b = make_tensor(5, dtype=kiln.float32, device="cpu")
    assert a.tolist() == b.tolist()


def test_noncontiguous_and_exclude_zero(toydev):
    t = make_tensor(3, 4, dtype=kiln.float32, device=toydev, noncontiguous=True)
    assert t.device.type == toydev and t.shape == (3, 4) and not t.is_contiguous()
    assert t.stride() == (8, 2)
    one = make_tensor(1, dtype=kiln.float32, device="cpu", noncontiguous=True)  # too small to be strided
    assert one.is_contiguous()
    z = make_tensor(200, dtype=kiln.int8, device=toydev, low=-1, high=2, exclude_zero=True)
    assert 0 not in z.cpu().tolist() and set(z.cpu().tolist()) == {-1, 1}
    f = make_tensor(200, dtype=kiln.float16, device="cpu", low=0, high=1e-4, exclude_zero=True)
    assert (_values(f) != 0).all()


def test_requires_grad():
    t = make_tensor(2, 2, dtype=kiln.float64, device="cpu", requires_grad=True, noncontiguous=True)
    assert t.requires_grad and t.is_leaf
    (t * 2).sum().backward()
    assert t.grad is not None and t.grad.shape == (2, 2)


def _torch_error(**kw):
    tkw = dict(kw)
    tkw["dtype"] = DTYPES[kw["dtype"]]
    with pytest.raises(Exception) as info:
        torch.testing.make_tensor(3, device="cpu", **tkw)
    return info.type, str(info.value).replace("torch.", "kiln.")


@pytest.mark.parametrize(
    "kw",
    [
        {"dtype": kiln.int32, "requires_grad": True},
        {"dtype": kiln.bool, "requires_grad": True},
        {"dtype": kiln.float32, "low": 5, "high": 2},
        {"dtype": kiln.int8, "low": 200, "high": 300},
        {"dtype": kiln.float32, "low": float("nan")},
        {"dtype": kiln.float32, "noncontiguous": True, "memory_format": "anything"},
    ],
    ids=["int-requires-grad", "bool-requires-grad", "low>high", "out-of-range", "nan", "exclusive-options"],
)
def test_errors_match_torch(kw):
    expected_type, expected_message = _torch_error(**kw)
    with pytest.raises(expected_type) as info:
        make_tensor(3, device="cpu", **kw)
    assert str(info.value) == expected_message
