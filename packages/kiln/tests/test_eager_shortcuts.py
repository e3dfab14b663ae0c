"""The eager shortcuts that skip the dispatcher where it would only run an op's meta function and the
core's own kernel: iteration and ``unbind`` (the slices made as views at once), basic indexing, ``item()``
and ``tolist()`` (no detached tensor), and writes of a number or a tensor into a CPU tensor that needs no
gradient (``fill_``, ``copy_``, ``s[i] = v``). Each must give what the dispatched path gives (PyTorch's
results), fall back to the dispatcher under a dispatch mode (a tracer sees every op and write) and when
autograd must record, and keep views, version counters and the in-place errors intact."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kiln
from kiln._dispatch import DispatchMode


class Recording(DispatchMode):
    """A post-autograd mode that records the names of the ops it sees."""

    def __init__(self):
        self.ops: list[str] = []

    def dispatch(self, op, args, redispatch):
        self.ops.append(op.name)
        return redispatch(op, args)


def _both(values, dtype="float32"):
    a = np.asarray(values, dtype=dtype)
    return kiln.from_numpy(a.copy()), torch.from_numpy(a.copy())


# ------------------------------------------------------------------------------------------- iteration


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_unbind_gives_views_of_every_slice(dim):
    k, t = _both(np.arange(12).reshape(3, 4))
    k, t = k.t(), t.t()  # non-contiguous: the views keep the input's strides
    got, want = k.unbind(dim), t.unbind(dim)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == tuple(w.shape) and g.stride() == w.stride()
        np.testing.assert_array_equal(g.numpy(), w.numpy())
    got[1].fill_(-1.0)  # a view: the write lands in the input, whose version counter it shares
    want[1].fill_(-1.0)
    np.testing.assert_array_equal(k.numpy(), t.numpy())
    assert got[0]._version == k._version == 1


def test_iteration_yields_views_and_goes_through_the_dispatcher_under_a_mode():
    k = kiln.tensor([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]])
    rows = list(k)
    assert [r.tolist() for r in rows] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    assert all(r._base is k for r in rows)
    with Recording() as mode:
        list(k)
    assert mode.ops.count("_index_view") == 3  # one select per row, as the dispatcher runs them
    with pytest.raises(TypeError, match="iteration over a 0-d tensor"):
        iter(kiln.tensor(1.0))


def test_iterating_a_tensor_that_requires_grad_records_each_slice():
    k, t = _both([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    k.requires_grad_()
    t.requires_grad_()
    for lib, x in ((kiln, k), (torch, t)):
        rows = list(x)
        assert type(rows[0].grad_fn).__name__ in ("SelectBackward0", "UnbindBackward0")
        lib.stack([r * (i + 1) for i, r in enumerate(rows)]).sum().backward()
    np.testing.assert_array_equal(k.grad.numpy(), t.grad.numpy())


# -------------------------------------------------------------------------------------- basic indexing


@pytest.mark.parametrize("key", [1, -1, slice(1, 3), slice(None, None, 2), (1, 0), (slice(0, 2), 1), (None, 2)])
def test_basic_indexing_matches_pytorch(key):
    k, t = _both(np.arange(12).reshape(4, 3))
    got, want = k[key], t[key]
    assert got.shape == tuple(want.shape) and got.stride() == want.stride()
    assert got.storage_offset() == want.storage_offset()
    np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_slicing_with_zero_dim_tensor_bounds():
    k, t = _both(np.arange(10))
    got, want = k[kiln.tensor(2) : kiln.tensor(7)], t[torch.tensor(2) : torch.tensor(7)]
    np.testing.assert_array_equal(got.numpy(), want.numpy())


# ------------------------------------------------------------------------------------- reading values


@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float16, kiln.bfloat16, kiln.int64, kiln.bool])
def test_item_and_tolist_read_every_dtype(dtype):
    k = kiln.tensor([1.5, 0.0, -2.0]).to(dtype)
    t = torch.tensor([1.5, 0.0, -2.0]).to(getattr(torch, str(dtype).split(".")[1]))
    assert k.tolist() == t.tolist()
    assert k[0].item() == t[0].item() and k[2:].tolist() == t[2:].tolist()
    assert k[:1].item() == t[:1].item()  # one element, one dim
    with pytest.raises(RuntimeError, match="a Tensor with 3 elements cannot be converted to Scalar"):
        k.item()


def test_item_of_a_tensor_that_requires_grad_reads_its_value():
    x = kiln.tensor(2.5, requires_grad=True)
    y = x * 2
    node = y.grad_fn
    assert x.item() == 2.5 and y.item() == 5.0 and float(y) == 5.0 and y.tolist() == 5.0
    assert y.grad_fn is node and x.grad_fn is None  # reading changed nothing in the graph
    y.backward()
    assert x.grad.item() == 2.0


# --------------------------------------------------------------------------------------------- writes


@pytest.mark.parametrize("value", [3, -2, 2.75, True, float("inf"), float("nan")])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "int32", "uint8", "bool"])
def test_writing_a_number_matches_pytorch(dtype, value):
    if dtype == "uint8" and isinstance(value, int) and value < 0:
        pytest.skip("PyTorch wraps a negative number into uint8; checked by the fill tests")
    if dtype not in ("float32", "float64") and isinstance(value, float) and not np.isfinite(value):
        pytest.skip("a non-finite float has no integer value (platform-dependent in PyTorch)")
    k, t = _both(np.arange(6).reshape(2, 3) % 2, dtype)
    for x in (k, t):
        x[1] = value  # a row view
        x[:, 0] = value  # a strided view
        x.t()[2].fill_(value)
    np.testing.assert_array_equal(k.numpy(), t.numpy())


def test_writing_a_tensor_casts_and_broadcasts_as_pytorch():
    k, t = _both(np.zeros((3, 4)), "float64")
    kv, tv = _both([1.25, -2.5, 3.0, 4.0], "float32")
    for x, v in ((k, kv), (t, tv)):
        x[1] = v
        x[2:, 1:3] = v[:2]
        x[0].copy_(v.to(x.dtype) * 2)
    np.testing.assert_array_equal(k.numpy(), t.numpy())


def test_a_write_bumps_the_version_and_invalidates_what_backward_saved():
    for lib in (kiln, torch):
        w = lib.tensor([1.0, 2.0, 3.0], requires_grad=True)
        y = lib.tensor([4.0, 5.0, 6.0])  # needs no gradient: written without the dispatcher in kiln
        z = w * y  # saves y
        before = y._version
        y[0] = 5.0
        y[1:].fill_(2)
        y[2:].copy_(lib.tensor([1.0]))
        assert y._version == before + 3
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            z.sum().backward()


def test_a_bool_tensor_takes_any_int():
    for big in (2**63, 2**64 - 1, -(2**63)):
        for x in (kiln.zeros(2, dtype=kiln.bool), torch.zeros(2, dtype=torch.bool)):
            x.fill_(big)
            x[0] = 0
            assert x.tolist() == [False, True]


def test_a_number_written_into_a_tensor_that_requires_grad_cuts_its_gradient():
    # the write needs autograd: the shortcut must not take it
    for lib in (kiln, torch):
        s = lib.arange(4.0).requires_grad_()
        z = s * 2
        z[1] = 5.0
        z[2] = lib.tensor(7.0)
        (z * lib.arange(4.0)).sum().backward()
        assert s.grad.tolist() == [0.0, 0.0, 0.0, 6.0]


def test_writes_go_through_the_dispatcher_under_a_mode():
    x = kiln.zeros(4)
    with Recording() as mode:
        x[1] = 2.0
        x[2] = kiln.tensor(3.0)
        x.fill_(1.5)
    assert mode.ops.count("_copy_from") == 3
    assert x.tolist() == [1.5, 1.5, 1.5, 1.5]


def test_the_inplace_errors_still_hold():
    normal = kiln.zeros(3)
    with kiln.inference_mode():
        inf = kiln.zeros(3)
        view_of_normal = normal[:2]
    for write in (lambda: inf.__setitem__(0, 1.0), lambda: inf[1:].fill_(1.0), lambda: inf[0].copy_(normal[0])):
        with pytest.raises(RuntimeError, match="Inplace update to inference tensor outside InferenceMode"):
            write()
    assert inf[:2].is_inference() and not view_of_normal.is_inference()  # a view is what its base is
    view_of_normal.fill_(1.0)
    with kiln.inference_mode():
        detached_in_mode = normal.detach()
    for alias in (inf.detach(), inf.data, kiln.Tensor._make_subclass(kiln.Tensor, inf)):
        assert alias.is_inference()  # detach(), .data and nn.Parameter share the base's kind too
        with pytest.raises(RuntimeError, match="Inplace update to inference tensor outside InferenceMode"):
            alias.add_(1)
    assert not detached_in_mode.is_inference()
    detached_in_mode.add_(1)
    with pytest.raises(RuntimeError, match="Setting requires_grad=True on inference tensor outside InferenceMode"):
        inf.detach().requires_grad_()
    leaf = kiln.zeros(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
        leaf[0] = 1.0
    base = kiln.zeros(3, requires_grad=True) * 1
    with kiln.no_grad():
        view = base[:2]
    with pytest.raises(RuntimeError, match="A view was created in no_grad mode"):
        view.fill_(1.0)
    with pytest.raises(RuntimeError, match="value cannot be converted to type float without overflow"):
        kiln.zeros(3)[0:2].fill_(1e300)
