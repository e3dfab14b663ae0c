"""PackedSequence, pack/pad helpers and the recurrent layers on packed input, against torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from layer_twins import load_from_torch, same_error, seeded, to_np  # noqa: F401
from torch.nn.utils import rnn as trnn

import kiln
import kiln.nn as nn
from kiln.nn.utils import rnn as krnn


def _close(a, b, tol=1e-5):
    assert tuple(a.shape) == tuple(b.shape)
    np.testing.assert_allclose(to_np(a), to_np(b), rtol=1e-4, atol=tol)


def _same_packed(pk, pt):
    _close(pk.data, pt.data)
    assert pk.batch_sizes.tolist() == pt.batch_sizes.tolist()
    assert str(pk.batch_sizes.dtype).replace("kiln.", "torch.") == str(pt.batch_sizes.dtype)
    for a, b in ((pk.sorted_indices, pt.sorted_indices), (pk.unsorted_indices, pt.unsorted_indices)):
        assert (a is None) == (b is None)
        if b is not None:
            assert a.tolist() == b.tolist()


def _twin(shape):
    x = torch.randn(*shape, requires_grad=True)
    return kiln.tensor(to_np(x), requires_grad=True), x


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize(
    ("lengths", "enforce_sorted"),
    [([5, 3, 3, 1], True), ([3, 5, 1, 3], False), ([5, 5, 5, 5], True), ([2, 4, 4, 1], False)],
)
def test_pack_pad_roundtrip_and_grads_match_torch(lengths, enforce_sorted, batch_first):
    shape = (4, 5, 2, 3) if batch_first else (5, 4, 2, 3)
    xk, xt = _twin(shape)
    pk = krnn.pack_padded_sequence(xk, lengths, batch_first=batch_first, enforce_sorted=enforce_sorted)
    pt = trnn.pack_padded_sequence(xt, lengths, batch_first=batch_first, enforce_sorted=enforce_sorted)
    assert isinstance(pk, krnn.PackedSequence) and isinstance(pk, tuple)
    assert pk._fields == pt._fields
    _same_packed(pk, pt)
    for total in (None, 7):
        yk, lk = krnn.pad_packed_sequence(pk, batch_first=batch_first, padding_value=-2.0, total_length=total)
        yt, lt = trnn.pad_packed_sequence(pt, batch_first=batch_first, padding_value=-2.0, total_length=total)
        _close(yk, yt)
        assert lk.tolist() == lt.tolist()
        assert str(lk.dtype).replace("kiln.", "torch.") == str(lt.dtype)
    g = torch.randn(*yt.shape)
    (yk * kiln.tensor(to_np(g))).sum().backward()
    (yt * g).sum().backward()
    _close(xk.grad, xt.grad)


@pytest.mark.parametrize("enforce_sorted", [True, False])
def test_pack_sequence_unpack_unpad_match_torch(enforce_sorted):
    lens = [4, 3, 1] if enforce_sorted else [1, 4, 3]
    tseqs = [torch.randn(n, 2, requires_grad=True) for n in lens]
    kseqs = [kiln.tensor(to_np(s), requires_grad=True) for s in tseqs]
    pk = krnn.pack_sequence(kseqs, enforce_sorted=enforce_sorted)
    pt = trnn.pack_sequence(tseqs, enforce_sorted=enforce_sorted)
    _same_packed(pk, pt)
    uk, ut = krnn.unpack_sequence(pk), trnn.unpack_sequence(pt)
    assert len(uk) == len(ut)
    for a, b in zip(uk, ut):
        _close(a, b)
    sum((a * a).sum() for a in uk).backward()
    sum((b * b).sum() for b in ut).backward()
    for a, b in zip(kseqs, tseqs):
        _close(a.grad, b.grad)
    padded_t = trnn.pad_sequence(tseqs, batch_first=True)
    padded_k = krnn.pad_sequence(kseqs, batch_first=True)
    for bf in (True, False):
        pk_, pt_ = (padded_k, padded_t) if bf else (padded_k.transpose(0, 1), padded_t.detach().transpose(0, 1))
        ok = krnn.unpad_sequence(pk_, kiln.tensor(lens), batch_first=bf)
        ot = trnn.unpad_sequence(pt_.clone(), torch.tensor(lens), batch_first=bf)
        for a, b in zip(ok, ot):
            _close(a, b)


def test_packed_sequence_tuple_api_and_to():
    pk = krnn.pack_sequence([kiln.ones(3, 2), kiln.ones(2, 2)])
    data, batch_sizes, sorted_indices, unsorted_indices = pk
    assert sorted_indices is None and unsorted_indices is None
    assert batch_sizes.tolist() == [2, 2, 1] and data.shape == (5, 2)
    assert pk.to(kiln.float32) is pk
    d = pk.double()
    assert d.data.dtype == kiln.float64 and d.batch_sizes is pk.batch_sizes
    assert not pk.is_cuda
    p2 = krnn.PackedSequence(pk.data, pk.batch_sizes, kiln.tensor([1, 0]))
    assert p2.unsorted_indices.tolist() == [1, 0]
    p3 = krnn.PackedSequence((pk.data, pk.batch_sizes))
    assert p3.batch_sizes is pk.batch_sizes
    perm = kiln.tensor([2, 0, 3, 1])
    assert krnn.invert_permutation(perm).tolist() == trnn.invert_permutation(torch.tensor([2, 0, 3, 1])).tolist()
    assert krnn.invert_permutation(None) is None
    seqs = [[1, 2, 3], [4, 5], [6]]
    rk = repr(krnn.pack_sequence([kiln.tensor(v) for v in seqs], enforce_sorted=False))
    rt = repr(trnn.pack_sequence([torch.tensor(v) for v in seqs], enforce_sorted=False))
    assert rk == rt
    lk = krnn.pack_padded_sequence(kiln.ones(3, 2), kiln.tensor([3, 1])).batch_sizes
    assert lk.tolist() == [2, 1, 1]


def test_pack_gradcheck():
    x = kiln.randn(3, 2, 2, dtype=kiln.float64, requires_grad=True)

    def f(x):
        p = krnn.pack_padded_sequence(x, [2, 3], enforce_sorted=False)
        return krnn.pad_packed_sequence(p, total_length=4, padding_value=1.5)[0]

    assert kiln.autograd.gradcheck(f, (x,))


def test_pack_errors_match_torch():
    xk, xt = kiln.randn(4, 3, 2), torch.randn(4, 3, 2)
    for lens, sort in (([2, 3, 1], True), ([3, 2, 0], True), ([3, 2, 0], False), ([3, 2], True), ([-1, 2, 1], True)):
        same_error(
            lambda lens=lens, sort=sort: krnn.pack_padded_sequence(xk, lens, enforce_sorted=sort),
            lambda lens=lens, sort=sort: trnn.pack_padded_sequence(xt, lens, enforce_sorted=sort),
            RuntimeError,
        )
    same_error(
        lambda: krnn.pack_padded_sequence(xk, kiln.tensor([[3, 2, 1]])),
        lambda: trnn.pack_padded_sequence(xt, torch.tensor([[3, 2, 1]])),
        RuntimeError,
    )
    same_error(
        lambda: krnn.pack_padded_sequence(kiln.randn(0, 3, 2), [1, 1, 1]),
        lambda: trnn.pack_padded_sequence(torch.randn(0, 3, 2), [1, 1, 1]),
        RuntimeError,
    )
    same_error(
        lambda: krnn.pad_packed_sequence(krnn.pack_padded_sequence(xk, [3, 2, 1]), total_length=2),
        lambda: trnn.pad_packed_sequence(trnn.pack_padded_sequence(xt, [3, 2, 1]), total_length=2),
        ValueError,
    )
    same_error(
        lambda: krnn.PackedSequence(kiln.ones(2)),
        lambda: trnn.PackedSequence(torch.ones(2)),
        AssertionError,
    )


PACKED_CASES = [
    ("RNN", {}),
    ("RNN", {"nonlinearity": "relu", "num_layers": 2, "bidirectional": True}),
    ("LSTM", {}),
    ("LSTM", {"num_layers": 2, "bidirectional": True}),
    ("LSTM", {"proj_size": 2, "bidirectional": True, "bias": False}),
    ("GRU", {"num_layers": 3}),
    ("GRU", {"num_layers": 2, "bidirectional": True, "batch_first": True}),
]


@pytest.mark.filterwarnings("ignore:LSTM with projections")
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("enforce_sorted", [True, False])
@pytest.mark.parametrize(("name", "kwargs"), PACKED_CASES)
def test_recurrent_on_packed_input_matches_torch(name, kwargs, enforce_sorted, with_state):
    t = getattr(torch.nn, name)(3, 4, **kwargs)
    k = getattr(nn, name)(3, 4, **kwargs)
    load_from_torch(k, t)
    batch, steps = 5, 6
    lengths = torch.randint(1, steps + 1, (batch,))
    lengths[0] = steps
    if enforce_sorted:
        lengths = lengths.sort(descending=True).values
    bf = t.batch_first
    xk, xt = _twin((batch, steps, 3) if bf else (steps, batch, 3))
    pk = krnn.pack_padded_sequence(xk, lengths.tolist(), batch_first=bf, enforce_sorted=enforce_sorted)
    pt = trnn.pack_padded_sequence(xt, lengths, batch_first=bf, enforce_sorted=enforce_sorted)
    nd = 2 if t.bidirectional else 1
    real = t.proj_size if getattr(t, "proj_size", 0) else t.hidden_size
    states_t, states_k = (), ()
    if with_state:
        states_t = [torch.randn(t.num_layers * nd, batch, real, requires_grad=True)]
        if name == "LSTM":
            states_t.append(torch.randn(t.num_layers * nd, batch, t.hidden_size, requires_grad=True))
        states_k = [kiln.tensor(to_np(s), requires_grad=True) for s in states_t]
        hx_t = tuple(states_t) if name == "LSTM" else states_t[0]
        hx_k = tuple(states_k) if name == "LSTM" else states_k[0]
        (ok, hk), (ot, ht) = k(pk, hx_k), t(pt, hx_t)
    else:
        (ok, hk), (ot, ht) = k(pk), t(pt)
    assert isinstance(ok, krnn.PackedSequence)
    _same_packed(ok, ot)
    hk = hk if isinstance(hk, tuple) else (hk,)
    ht = ht if isinstance(ht, tuple) else (ht,)
    for a, b in zip(hk, ht):
        _close(a, b)
    yk, _ = krnn.pad_packed_sequence(ok, batch_first=bf)
    yt, _ = trnn.pad_packed_sequence(ot, batch_first=bf)
    _close(yk, yt)
    g = [torch.randn(*yt.shape)] + [torch.randn(*h.shape) for h in ht]
    lk = sum((a * kiln.tensor(to_np(w))).sum() for a, w in zip((yk, *hk), g))
    lt = sum((a * w).sum() for a, w in zip((yt, *ht), g))
    lk.backward()
    lt.backward()
    _close(xk.grad, xt.grad)
    for a, b in zip(states_k, states_t):
        _close(a.grad, b.grad)
    tp = dict(t.named_parameters())
    for n, p in k.named_parameters():
        np.testing.assert_allclose(to_np(p.grad), to_np(tp[n].grad), rtol=1e-4, atol=1e-5, err_msg=n)


def test_packed_input_in_train_mode_with_dropout_runs():
    k = nn.LSTM(3, 4, 2, dropout=0.5)
    pk = krnn.pack_sequence([kiln.randn(4, 3), kiln.randn(2, 3)])
    out, (h, c) = k(pk)
    assert out.data.shape == (6, 4) and h.shape == (2, 2, 4) and c.shape == (2, 2, 4)


def test_packed_input_errors_match_torch():
    xk, xt = kiln.randn(4, 3, 2), torch.randn(4, 3, 2)
    for name in ("RNN", "GRU"):
        same_error(
            lambda name=name: getattr(nn, name)(3, 4)(krnn.pack_padded_sequence(xk, [3, 2, 1])),
            lambda name=name: getattr(torch.nn, name)(3, 4)(trnn.pack_padded_sequence(xt, [3, 2, 1])),
            RuntimeError,
        )
        same_error(
            lambda name=name: getattr(nn, name)(2, 4)(krnn.pack_padded_sequence(xk, [3, 2, 1]), kiln.zeros(1, 2, 4)),
            lambda name=name: getattr(torch.nn, name)(2, 4)(
                trnn.pack_padded_sequence(xt, [3, 2, 1]), torch.zeros(1, 2, 4)
            ),
            RuntimeError,
        )


def test_packed_gru_gradcheck():
    k = nn.GRU(2, 3, bidirectional=True).double()
    x = kiln.randn(3, 2, 2, dtype=kiln.float64, requires_grad=True)
    h = kiln.randn(2, 2, 3, dtype=kiln.float64, requires_grad=True)

    def f(x, h):
        out, hn = k(krnn.pack_padded_sequence(x, [1, 3], enforce_sorted=False), h)
        return krnn.pad_packed_sequence(out)[0], hn

    assert kiln.autograd.gradcheck(f, (x, h))
