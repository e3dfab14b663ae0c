"""kiln.testing.assert_close behaves like torch.testing.assert_close: same verdict, same exception type,
same message (with ``torch.`` read as ``kiln.``)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import kiln
from kiln.testing import assert_close

K2T = {
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


def to_torch(x):
    """The torch counterpart of a value built for kiln (tensors, containers, numbers as they are)."""
    if isinstance(x, kiln.Tensor):
        a = np.array(x.numpy(), order="C", copy=True)  # (np.ascontiguousarray would make 0-d arrays 1-d)
        if x.dtype is kiln.bfloat16:
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        if not x.is_contiguous():  # same strides: build torch's tensor through the same view
            return torch.from_numpy(np.array(x.t().numpy(), order="C", copy=True)).t()
        return torch.from_numpy(a)
    if isinstance(x, (list, tuple)):
        return type(x)(to_torch(v) for v in x)
    if isinstance(x, dict):
        return {k: to_torch(v) for k, v in x.items()}
    return x


def outcome(fn, actual, expected, **kw):
    try:
        fn(actual, expected, **kw)
    except Exception as exc:  # noqa: BLE001 - the outcome under comparison
        return type(exc), str(exc)
    return None


def normalize(message: str) -> str:
    return (
        message.replace("<class 'torch.Tensor'>", "<class 'kiln._tensor.Tensor'>")
        .replace("torch.Size(", "kiln.Size(")
        .replace("torch.", "kiln.")
    )


def check_parity(actual, expected, **kw):
    mine = outcome(assert_close, actual, expected, **kw)
    theirs = outcome(torch.testing.assert_close, to_torch(actual), to_torch(expected), **kw)
    if theirs is not None:
        theirs = (theirs[0], normalize(theirs[1]))
    assert mine == theirs, f"\nkiln:  {mine}\ntorch: {theirs}"
    return mine


def kt(values, dtype=None):
    return kiln.tensor(values, dtype=dtype)


NAN, INF = math.nan, math.inf

CASES = {
    "floats close": (kt([1.0, 2.0, 3.0]), kt([1.0, 2.0 + 1e-6, 3.0]), {}),
    "floats differ": (kt([1.0, 2.0, 3.0]), kt([1.0, 4.0, 5.0]), {}),
    "2-d index": (kt([[1.0, 2.0], [3.0, 4.0]]), kt([[1.0, 2.0], [3.5, 4.0]]), {}),
    "ints differ": (kt([1, 2, 3]), kt([1, 4, 5]), {}),
    "int32 differ": (kt([7, -2], kiln.int32), kt([7, 2], kiln.int32), {}),
    "uint8 differ": (kt([0, 255], kiln.uint8), kt([1, 255], kiln.uint8), {}),
    "bools differ": (kt([True, False]), kt([True, True]), {}),
    "0-d float": (kt(1.1), kt(1.0), {}),
    "0-d int": (kt(3), kt(4), {}),
    "0-d zero expected": (kt(0.5), kt(0.0), {}),
    "nan vs nan": (kt([NAN, 1.0]), kt([NAN, 1.0]), {}),
    "nan vs nan, equal_nan": (kt([NAN, 1.0]), kt([NAN, 1.0]), {"equal_nan": True}),
    "nan vs number": (kt([1.0, NAN]), kt([1.0, 2.0]), {}),
    "inf vs inf": (kt([INF, -INF]), kt([INF, -INF]), {}),
    "inf vs -inf": (kt([INF, 1.0]), kt([-INF, 1.0]), {}),
    "inf vs big": (kt([INF]), kt([1e38]), {}),
    "shape": (kt([1.0, 2.0]), kt([1.0, 2.0, 3.0]), {}),
    "dtype": (kt([1.0, 2.0]), kt([1.0, 2.0], kiln.float64), {}),
    "dtype unchecked": (kt([1.0, 2.0]), kt([1.0, 2.5], kiln.float64), {"check_dtype": False}),
    "int vs float unchecked": (kt([1, 2]), kt([1.0, 2.0]), {"check_dtype": False}),
    "custom tolerances pass": (kt([1.0, 2.0]), kt([1.0, 2.1]), {"rtol": 0.1, "atol": 0.0}),
    "custom tolerances fail": (kt([1.0, 2.0]), kt([1.0, 2.5]), {"rtol": 0.1, "atol": 0.01}),
    "exact tolerances": (kt([1.0, 2.0]), kt([1.0, 2.0000002]), {"rtol": 0.0, "atol": 0.0}),
    "rtol alone": (kt([1.0]), kt([1.0]), {"rtol": 0.1}),
    "atol alone": (kt([1.0]), kt([1.0]), {"atol": 0.1}),
    "float16": (kt([1.0, 2.0], kiln.float16), kt([1.0, 2.01], kiln.float16), {}),
    "bfloat16": (kt([1.0, 2.0], kiln.bfloat16), kt([1.0, 2.5], kiln.bfloat16), {}),
    "float64 close": (kt([1.0], kiln.float64), kt([1.0 + 1e-9], kiln.float64), {}),
    "empty": (kt([]), kt([]), {}),
    "stride": (kt([[1.0, 2.0], [3.0, 4.0]]).t(), kt([[1.0, 3.0], [2.0, 4.0]]), {"check_stride": True}),
    "stride unchecked": (kt([[1.0, 2.0], [3.0, 4.0]]).t(), kt([[1.0, 3.0], [2.0, 4.0]]), {}),
    "msg": (kt([1.0]), kt([2.0]), {"msg": "custom message"}),
    "msg callable": (kt([1.0, 2.0]), kt([1.0, 3.0]), {"msg": lambda m: f"Header\n\n{m}\n\nFooter"}),
    "sequence": ([kt([1.0]), kt([2.0])], [kt([1.0]), kt([2.5])], {}),
    "nested sequence": ((kt([1.0]), [kt([2.0]), 3]), (kt([1.0]), [kt([2.0]), 4]), {}),
    "sequence lengths": ([kt([1.0])], [kt([1.0]), kt([2.0])], {}),
    "mapping": ({"a": kt([1.0]), "b": kt([2.0])}, {"a": kt([1.0]), "b": kt([2.2])}, {}),
    "mapping keys": ({"a": kt([1.0])}, {"b": kt([1.0])}, {}),
    "numbers close": (1.0, 1.0 + 1e-9, {}),
    "numbers differ": (1.0, 1.5, {}),
    "ints": (3, 4, {}),
    "number types": (1.0, 1, {}),
    "number types unchecked": (1.0, 1, {"check_dtype": False}),
    "nan numbers": (NAN, NAN, {}),
    "nan numbers equal_nan": (NAN, NAN, {"equal_nan": True}),
    "booleans": (True, False, {}),
    "none": (None, None, {}),
    "tensor vs number": (kt([1.0]), 1.0, {}),
    "numpy arrays": (np.array([1.0, 2.0]), np.array([1.0, 2.5]), {}),
    "numpy scalars": (np.float32(1.0), np.float32(1.5), {}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_parity_with_torch(name):
    actual, expected, kw = CASES[name]
    check_parity(actual, expected, **kw)


def test_failing_cases_do_fail():
    # the parity test would also pass if both libraries accepted everything: pin a few verdicts
    assert check_parity(kt([1.0, 2.0, 3.0]), kt([1.0, 4.0, 5.0])) == (
        AssertionError,
        "Tensor-likes are not close!\n\nMismatched elements: 2 / 3 (66.7%)\n"
        "Greatest absolute difference: 2.0 at index (1,) (up to 1e-05 allowed)\n"
        "Greatest relative difference: 0.5 at index (1,) (up to 1.3e-06 allowed)",
    )
    assert check_parity(kt(1.1), kt(1.0))[1].startswith(
        "Scalars are not close!\n\nExpected 1.0 but got 1.100000023841858."
    )
    assert check_parity(kt([1.0]), kt([1.0]), rtol=0.1)[0] is ValueError
    assert check_parity([kt([1.0]), kt([2.0])], [kt([1.0]), kt([2.5])])[1].endswith("The failure occurred for item [1]")
    assert check_parity(kt([1.0, 2.0]), kt([1.0, 2.0]).to(kiln.float64))[1] == (
        "The values for attribute 'dtype' do not match: kiln.float32 != kiln.float64."
    )


def test_device_mismatch_and_check_device(toydev):
    a = kiln.tensor([1.0, 2.0])
    b = kiln.tensor([1.0, 2.0], device=toydev)
    with pytest.raises(AssertionError) as info:
        assert_close(a, b)
    assert str(info.value) == f"The values for attribute 'device' do not match: cpu != {b.device}."
    assert_close(a, b, check_device=False)  # both copied to the host
    with pytest.raises(AssertionError, match="Mismatched elements: 1 / 2"):
        assert_close(a, kiln.tensor([1.0, 3.0], device=toydev), check_device=False)
    assert_close(b, kiln.tensor([1.0, 2.0], device=toydev))  # values read from device memory


@st.composite
def close_calls(draw):
    dtype = draw(st.sampled_from([kiln.float32, kiln.float64, kiln.float16, kiln.int32, kiln.bfloat16]))
    n = draw(st.integers(1, 6))
    base = np.array(draw(st.lists(st.floats(-100, 100, allow_nan=False), min_size=n, max_size=n)))
    noise = np.array(
        draw(st.lists(st.sampled_from([0.0, 1e-7, 1e-5, 1e-3, 0.5, math.nan, math.inf]), min_size=n, max_size=n))
    )
    other = base + noise
    kw = draw(st.sampled_from([{}, {"equal_nan": True}, {"rtol": 1e-2, "atol": 1e-3}]))
    if not dtype.is_floating_point:
        base, other = np.round(base), np.round(np.nan_to_num(other, nan=0.0, posinf=7.0))
    np_dtype = ml_dtypes.bfloat16 if dtype is kiln.bfloat16 else dtype.numpy
    return kiln.tensor(base.astype(np_dtype), dtype=dtype), kiln.tensor(other.astype(np_dtype), dtype=dtype), kw


@given(close_calls())
def test_parity_property(call):
    actual, expected, kw = call
    check_parity(actual, expected, **kw)
