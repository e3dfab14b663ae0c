"""Calls written against PyTorch's signatures work in kiln: the parameter names, positions and defaults the
API-surface survey checks (``docs/_ext/kilndocs/surface.py``), exercised by real calls and compared with
PyTorch (``asarray``, ``concatenate(axis=)``, ``swapaxes(axis0=)``, ``det(input=)``, ``out`` as a
positional parameter, ``vander``, the older autocast names, ``save``'s pickle arguments...)."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch")


def _same(k, t):
    assert tuple(k.shape) == tuple(t.shape)
    np.testing.assert_allclose(k.detach().numpy(), t.detach().numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "call",
    [
        lambda L: L.concatenate([L.ones(2, 1), L.zeros(2, 2)], axis=1),
        lambda L: L.swapaxes(L.arange(6.0).reshape(2, 3), axis0=0, axis1=1),
        lambda L: L.arange(6.0).reshape(2, 3).swapaxes(axis0=1, axis1=0),
        lambda L: L.det(input=L.tensor([[2.0, 1.0], [1.0, 3.0]])),
        lambda L: L.inverse(input=L.tensor([[2.0, 1.0], [1.0, 3.0]])),
        lambda L: L.slogdet(input=L.tensor([[2.0, 1.0], [1.0, 3.0]]))[1],
        lambda L: L.softmax(input=L.tensor([1.0, 2.0, 3.0]), dim=0),
        lambda L: L.log_softmax(input=L.tensor([1.0, 2.0, 3.0]), dim=0),
        lambda L: L.searchsorted(L.tensor([1.0, 3.0, 5.0]), input=L.tensor([2.0, 6.0])),
        lambda L: L.histogramdd(L.tensor([[0.1, 0.2], [0.7, 0.9]]), [2, 2], range=[0.0, 1.0, 0.0, 1.0])[0],
        lambda L: L.as_tensor([1, 2], dtype=L.float64),
        lambda L: L.vander(L.tensor([1.0, 2.0, 3.0]), N=4),
        lambda L: L.vander(L.tensor([1, 2, 3]), increasing=True),
        lambda L: L.randperm(4, dtype=L.int32).sort().values,
    ],
)
def test_pytorch_spellings_give_pytorch_results(call):
    _same(call(kiln), call(torch))


def test_out_as_a_positional_parameter():
    for lib in (torch, kiln):
        o = lib.empty(0)
        lib.norm(lib.ones(4), 2, None, False, o)
        assert o.item() == 2.0
        o = lib.empty(0)
        lib.tensordot(lib.ones(2, 3), lib.ones(3, 2), 1, o)
        assert o.tolist() == [[3.0, 3.0], [3.0, 3.0]]
    with pytest.raises(TypeError, match="multiple values for argument 'out'"):
        kiln.norm(kiln.ones(2), 2, None, False, kiln.empty(0), out=kiln.empty(0))


def test_asarray_sharing_rules_match_torch():
    a = np.ones(3)
    for lib in (torch, kiln):
        t = lib.asarray(a)
        a[0] = 7.0
        assert t[0].item() == 7.0  # shares the NumPy array's memory
        a[0] = 1.0
        x = lib.ones(2)
        assert lib.asarray(x) is x
        assert lib.asarray(x, copy=True).data_ptr() != x.data_ptr()
        with pytest.raises(ValueError, match="can't alias arbitrary sequence"):
            lib.asarray([1, 2], copy=False)
        with pytest.raises(ValueError, match="can't alias tensor with dtype 'Float' into dtype 'Double'"):
            lib.asarray(x, dtype=lib.float64, copy=False)
        assert lib.asarray(x, requires_grad=True).requires_grad


def test_random_like_functions_take_a_generator():
    g = kiln.Generator().manual_seed(3)
    a = kiln.rand_like(kiln.ones(4), generator=g)
    g.manual_seed(3)
    assert kiln.rand_like(kiln.ones(4), generator=g).tolist() == a.tolist()
    g.manual_seed(3)
    b = kiln.randn_like(kiln.ones(4), generator=g)
    g.manual_seed(3)
    assert kiln.randn_like(kiln.ones(4), generator=g).tolist() == b.tolist()
    g.manual_seed(3)
    c = kiln.randint_like(kiln.ones(4), 10, generator=g)
    assert c.dtype == kiln.float32 and c.min().item() >= 0 and c.max().item() < 10
    x = kiln.full((5,), -1.0)
    g.manual_seed(1)
    first = kiln.rrelu(x, training=True, generator=g)
    g.manual_seed(1)
    assert kiln.rrelu(x, training=True, generator=g).tolist() == first.tolist()
    assert all(-1 / 3 <= v <= -1 / 8 for v in first.tolist())
    assert kiln.randperm(3).dtype == kiln.int64


@pytest.mark.parametrize("prefix, device_type", [("cpu", "cpu"), ("gpu", "cuda"), ("ipu", "ipu"), ("xla", "xla")])
def test_older_autocast_names(prefix, device_type):
    get = getattr(kiln, f"get_autocast_{prefix}_dtype")
    set_ = getattr(kiln, f"set_autocast_{prefix}_dtype")
    before = get()
    set_(kiln.float16)
    try:
        assert kiln.get_autocast_dtype(device_type) == kiln.float16
    finally:
        set_(before)
    assert getattr(kiln, f"is_autocast_{prefix}_enabled")() is False


def test_save_takes_pytorchs_pickle_arguments():
    buf = io.BytesIO()
    kiln.save({"w": kiln.ones(2), "tags": {"a"}}, buf, pickle, 4)
    buf.seek(0)
    assert torch.load(buf, weights_only=False)["tags"] == {"a"}
    with pytest.raises(NotImplementedError, match="Python's pickle module only"):
        kiln.save({"s": {1}}, io.BytesIO(), pickle_module=io)
    with pytest.raises(ValueError, match="pickle_protocol must be an int from 2"):
        kiln.save({"s": {1}}, io.BytesIO(), pickle_protocol=1)
    with pytest.raises(NotImplementedError, match="not the legacy format"):
        kiln.save({"s": {1}}, io.BytesIO(), _use_new_zipfile_serialization=False)


def test_pin_memory_and_layout_keywords():
    assert kiln.full_like(kiln.ones(2), 3.0, pin_memory=False).tolist() == [3.0, 3.0]
    assert kiln.hamming_window(4, pin_memory=False).shape == (4,)
    with pytest.raises(NotImplementedError, match="pin_memory"):
        kiln.full_like(kiln.ones(2), 3.0, pin_memory=True)
    s = kiln.sparse_coo_tensor([[0, 1]], [1.0, 2.0], (3,), pin_memory=False)
    assert s.to_dense().tolist() == [1.0, 2.0, 0.0]


def test_legacy_tensor_methods_match_torch():
    for lib in (torch, kiln):
        a = lib.arange(6.0)
        with pytest.warns(UserWarning, match="non-inplace resize is deprecated"):
            assert tuple(a.resize(2, 3).shape) == (2, 3)
        with pytest.warns(UserWarning), pytest.raises(RuntimeError, match="autograd's resize can only change"):
            a.resize(4)
        with pytest.warns(UserWarning, match="non-inplace resize_as is deprecated"):
            assert tuple(a.resize_as(lib.ones(3, 2)).shape) == (3, 2)
        x = lib.ones(3)
        x.map2_(lib.ones(3) * 2, lib.ones(3) * 3, lambda p, q, r: p + q * r)
        assert x.tolist() == [7.0, 7.0, 7.0]
        assert x.is_distributed() is False
        y = lib.ones(2, dtype=lib.float64)
        z = y.new_zeros(3, layout=lib.strided, pin_memory=False)
        assert z.dtype == lib.float64 and z.tolist() == [0.0] * 3
        assert y.new_tensor([1, 2], dtype=lib.int32).dtype == lib.int32
        assert tuple(y.new_empty_strided((2, 2), (1, 2), dtype=lib.float32).stride()) == (1, 2)
    with pytest.raises(TypeError, match="map2_"):
        kiln.ones(2).map2_(kiln.ones(2, dtype=kiln.int64), kiln.ones(2), lambda p, q, r: p)
