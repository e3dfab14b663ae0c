"""``out=`` on every op that computes new tensors, as in PyTorch: the result written into the given
tensor (which is returned), resized with PyTorch's warning when its shape differs, refused when the
result's dtype cannot cast to it or an argument requires grad; tuples for ops with several outputs.
Compared with PyTorch."""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch")


def _both(fn):
    """Run ``fn(lib)`` for torch and kiln; both results, or both exceptions (type and text compared)."""
    res = {}
    for lib in (torch, kiln):
        try:
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                # PyTorch appends where in its C++ a warning was raised
                res[lib] = ("ok", fn(lib), [str(x.message).split(" (Triggered internally")[0] for x in w])
        except Exception as e:  # noqa: BLE001 - compared below
            res[lib] = ("err", type(e), str(e))
    return res[torch], res[kiln]


@pytest.mark.parametrize(
    "call",
    [
        lambda L, o: L.add(L.ones(3), L.arange(3.0), alpha=2, out=o),
        lambda L, o: L.exp(L.arange(3.0), out=o),
        lambda L, o: L.sum(L.ones(2, 3), 1, out=o),
        lambda L, o: L.matmul(L.ones(2, 3), L.ones(3), out=o),
        lambda L, o: L.where(L.tensor([True, False, True]), L.ones(3), L.zeros(3), out=o),
    ],
)
@pytest.mark.parametrize("shape", [(0,), (3,), (2,), (2, 2)])
def test_out_matches_torch(call, shape):
    (ts, tv, tw), (ks, kv, kw) = _both(lambda L: (lambda o: (call(L, o) is o, o))(L.full(shape, -1.0)))
    assert ts == ks == "ok"
    assert tv[0] is kv[0] is True  # returns out itself
    np.testing.assert_allclose(kv[1].numpy(), tv[1].numpy())
    assert len(kw) == len(tw) and all(a == b for a, b in zip(kw, tw, strict=True))  # the resize warning


def test_out_keeps_views_in_sync_when_the_shape_matches():
    base = kiln.zeros(2, 3)
    row = base[1]
    kiln.mul(kiln.ones(3), 5.0, out=row)
    assert base.tolist() == [[0.0] * 3, [5.0] * 3]


@pytest.mark.parametrize(
    "fn",
    [
        lambda L: L.exp(L.ones(3), out=L.zeros(3, dtype=L.int64)),  # Float can't be cast to Long
        lambda L: L.add(L.ones(3, requires_grad=True), 1, out=L.zeros(3)),  # autograd through out=
        lambda L: L.add(L.ones(3), 1, out=[L.zeros(3)]),  # a list for a one-output op
        lambda L: L.max(L.ones(2, 2), 1, out=L.zeros(2)),  # a tensor for a two-output op
    ],
)
def test_out_errors_match_torch(fn):
    (ts, te, tm), (ks, ke, km) = _both(fn)
    assert ts == ks == "err"
    assert ke is te, (km, tm)


def test_out_error_texts():
    with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output type Long"):
        kiln.exp(kiln.ones(3), out=kiln.zeros(3, dtype=kiln.int64))
    with pytest.raises(RuntimeError, match=r"add\(\): functions with out=\.\.\. arguments don't support automatic"):
        kiln.add(kiln.ones(3, requires_grad=True), 1, out=kiln.zeros(3))
    with kiln.no_grad():  # without grad mode, out= is allowed whatever requires grad
        kiln.add(kiln.ones(3, requires_grad=True), 1, out=kiln.zeros(3))


def test_out_integer_result_into_float_out():
    o = kiln.zeros(3)
    kiln.add(kiln.arange(3), 1, out=o)
    assert o.dtype == kiln.float32 and o.tolist() == [1.0, 2.0, 3.0]


def test_two_output_ops_take_a_tuple():
    x = torch.tensor([[1.0, 3.0], [4.0, 2.0]])
    tv, ti = torch.empty(0), torch.empty(0, dtype=torch.long)
    kv, ki = kiln.empty(0), kiln.empty(0, dtype=kiln.int64)
    tr = torch.max(x, 1, out=(tv, ti))
    kr = kiln.max(kiln.tensor(x.numpy()), 1, out=(kv, ki))
    assert kv.tolist() == tv.tolist() and ki.tolist() == ti.tolist()
    assert kr.values is kv and kr.indices is ki and tr.values is tv
    kiln.sort(kiln.tensor([3.0, 1.0, 2.0]), out=(kv, ki))
    assert kv.tolist() == [1.0, 2.0, 3.0] and ki.tolist() == [1, 2, 0]


def test_signatures_show_out_but_views_and_inplace_ops_do_not():
    assert "out" in inspect.signature(kiln.add).parameters
    assert "out" in inspect.signature(kiln.exp).parameters
    assert "out" not in inspect.signature(kiln.Tensor.add_).parameters
    assert "other" in inspect.signature(kiln.Tensor.add_).parameters
    assert "out" not in inspect.signature(kiln.transpose).parameters


@pytest.mark.parametrize(
    "call",
    [
        lambda L, o: L.zeros(2, 3, out=o),
        lambda L, o: L.ones((4,), out=o),
        lambda L, o: L.full((2,), 7.0, out=o),
        lambda L, o: L.arange(5, out=o),
        lambda L, o: L.linspace(0, 1, 4, out=o),
        lambda L, o: L.eye(3, out=o),
        lambda L, o: L.logspace(0, 2, 3, out=o),
    ],
)
def test_creation_functions_honour_out(call):
    for_torch, for_kiln = torch.empty(0), kiln.empty(0)
    assert call(torch, for_torch) is for_torch and call(kiln, for_kiln) is for_kiln
    np.testing.assert_allclose(for_kiln.numpy(), for_torch.numpy(), rtol=1e-6)


def test_creation_layouts():
    assert kiln.zeros(2, layout=kiln.strided).layout is kiln.strided
    with pytest.raises(NotImplementedError, match=r"layout=kiln\.sparse_coo"):
        kiln.zeros(2, layout=kiln.sparse_coo)
    o = kiln.empty(0, dtype=kiln.int64)
    kiln.randperm(5, out=o)
    assert sorted(o.tolist()) == [0, 1, 2, 3, 4]
