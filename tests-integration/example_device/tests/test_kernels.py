"""The example device's kernels, tested the way a plugin author would: with kiln.testing's helpers,
comparing each result on "example" with the same op on the CPU."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from kiln_example_device.kernels import KERNELS, device_array

import kiln
import kiln.backend
from kiln.testing import assert_close, gradcheck, make_tensor
from kiln.testing import strategies as kst

FLOATS = st.sampled_from([kiln.float32, kiln.float64])


def test_kernels_read_views_in_place():
    t = kiln.arange(12.0, device="example").view(3, 4)
    view = t.t()[1:, ::2]
    a = device_array(view)
    assert np.shares_memory(a, t.untyped_storage().array())  # no copy
    assert a.tolist() == view.cpu().tolist()


@given(x=kst.strided_tensors(dtype=FLOATS, device="example"))
def test_unary_kernels_on_strided_inputs(x):
    for fn in (kiln.neg, kiln.abs, kiln.exp, kiln.tanh, kiln.sigmoid, kiln.relu):
        assert_close(fn(x).cpu(), fn(x.cpu()))


@given(shapes=kst.broadcastable_shapes(), dtype=st.sampled_from([kiln.int32, kiln.float32]), data=st.data())
def test_binary_kernels_broadcast(shapes, dtype, data):
    a = data.draw(kst.strided_tensors(dtype=dtype, shape=shapes[0], device="example"))
    b = data.draw(kst.strided_tensors(dtype=dtype, shape=shapes[1], device="example"))
    for fn in (kiln.add, kiln.mul, kiln.maximum, kiln.lt):
        out = fn(a, b)
        assert out.device == kiln.device("example:0")
        assert_close(out.cpu(), fn(a.cpu(), b.cpu()))


def test_matmul_and_sum():
    a = make_tensor(5, 3, 4, dtype=kiln.float32, device="example", noncontiguous=True)
    b = make_tensor(4, 2, dtype=kiln.float32, device="example")
    assert_close((a @ b).cpu(), a.cpu() @ b.cpu())
    assert_close(a.sum(dim=(0, 2)).cpu(), a.cpu().sum(dim=(0, 2)))


def test_gradients_through_the_device():
    x = make_tensor(3, 4, dtype=kiln.float64, device="example", requires_grad=True)
    w = make_tensor(4, 2, dtype=kiln.float64, device="example", requires_grad=True)
    assert gradcheck(lambda x, w: (x @ w).tanh().sum(dim=0), (x, w))


def test_the_registered_ops():
    # the table the plugin registers from (kiln plugins lists the same names)
    assert {"add", "mul", "matmul", "sum", "clamp", "exp"} <= set(KERNELS)
    # exactly kiln's primitive set: every other op runs through its decomposition on the device
    assert set(KERNELS) == set(kiln.backend.primitives())
    assert "relu" not in KERNELS and kiln.backend.decomposition("relu") is not None
