"""kiln.testing.strategies: the shapes and strided tensors they draw are what they claim."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import kiln
from kiln.testing import strategies as kst


@given(kst.shapes(min_dims=1, max_dims=4, min_side=0, max_side=3))
def test_shapes_respect_bounds(shape):
    assert 1 <= len(shape) <= 4 and all(0 <= s <= 3 for s in shape)


@given(kst.broadcastable_shapes(num_shapes=3))
def test_broadcastable_shapes_broadcast(shapes):
    assert len(shapes) == 3
    kiln.broadcast_shapes(*shapes)  # raises if they do not


@given(kst.dtypes(floating=False, boolean=False))
def test_dtypes_by_kind(dtype):
    assert dtype in (kiln.uint8, kiln.int8, kiln.int16, kiln.int32, kiln.int64)


@given(x=kst.strided_tensors(dtype=st.sampled_from([kiln.float32, kiln.int16, kiln.bfloat16]), shape=kst.shapes()))
def test_strided_tensors_are_views_with_their_values(x):
    assert x.device == kiln.device("cpu")
    assert all(s >= 0 for s in x.stride())
    # the view's values are what its geometry selects from the storage
    storage = np.asarray(x.untyped_storage())
    isz = storage.itemsize
    expected = np.lib.stride_tricks.as_strided(
        storage[x.storage_offset() :], tuple(x.shape), tuple(s * isz for s in x.stride())
    )
    np.testing.assert_array_equal(x.numpy(), expected)


@settings(max_examples=60)
@given(kst.strided_tensors(shape=kst.shapes(min_dims=2, min_side=2)))
def test_strided_tensors_cover_layouts(x):
    # collected across examples by the test below; here only: a 2-d+ view with sides >= 2
    assert x.dim() >= 2


def test_strided_tensors_are_often_non_contiguous():
    seen = {"non-contiguous": 0, "expanded": 0, "offset": 0, "total": 0}

    @settings(max_examples=60, derandomize=True, database=None)
    @given(kst.strided_tensors(shape=kst.shapes(min_dims=2, min_side=2)))
    def probe(x):
        seen["total"] += 1
        seen["non-contiguous"] += not x.is_contiguous()
        seen["expanded"] += 0 in x.stride()
        seen["offset"] += x.storage_offset() > 0

    probe()
    assert seen["non-contiguous"] > seen["total"] // 3, seen
    assert seen["expanded"] > 0 and seen["offset"] > 0, seen


@given(kst.strided_tensors(dtype=kiln.float32, device="toydev", allow_broadcast=False))
def test_strided_tensors_on_a_device(toydev, x):
    assert x.device.type == "toydev"
    assert 0 not in x.stride() or x.numel() <= 1 or any(n == 1 for n in x.shape)
    kiln.testing.assert_close((x + 1).cpu(), x.cpu() + 1)  # the toy device's add reads the strided view
