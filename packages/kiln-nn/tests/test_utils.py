"""kiln.nn.utils against torch.nn.utils: clipping, vector conversion, pad_sequence."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from kiln_nn_helpers import assert_close, k2t, to_np

import kiln
import kiln.nn as nn
from kiln.nn import utils


def twin_params():
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in [(3, 4), (4,), (2, 2, 2)]]
    grads = [rng.standard_normal(a.shape).astype(np.float32) * 3 for a in arrays]
    kp = [nn.Parameter(kiln.tensor(a)) for a in arrays]
    tp = [torch.nn.Parameter(torch.tensor(a)) for a in arrays]
    for p, q, g in zip(kp, tp, grads):
        p.grad = kiln.tensor(g)
        q.grad = torch.tensor(g)
    return kp, tp


@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf, 3])
@pytest.mark.parametrize("max_norm", [0.5, 1000.0])
def test_clip_grad_norm_matches_torch(norm_type, max_norm):
    kp, tp = twin_params()
    nk = utils.clip_grad_norm_(kp, max_norm, norm_type=norm_type, foreach=True)
    nt = torch.nn.utils.clip_grad_norm_(tp, max_norm, norm_type=norm_type)
    assert nk.item() == pytest.approx(nt.item(), rel=1e-5)
    for p, q in zip(kp, tp):
        assert_close(p.grad, q.grad)


def test_clip_grad_norm_nonfinite_and_single_tensor():
    kp, tp = twin_params()
    kp[0].grad = kp[0].grad * float("nan")
    tp[0].grad = tp[0].grad * float("nan")
    with pytest.raises(RuntimeError) as ek:
        utils.clip_grad_norm_(kp, 1.0, error_if_nonfinite=True)
    with pytest.raises(RuntimeError) as et:
        torch.nn.utils.clip_grad_norm_(tp, 1.0, error_if_nonfinite=True)
    assert str(ek.value) == str(et.value)
    p = nn.Parameter(kiln.ones(4))
    p.grad = kiln.full((4,), 2.0)
    assert utils.clip_grad_norm_(p, 1.0).item() == pytest.approx(4.0)
    assert utils.clip_grad_norm_([nn.Parameter(kiln.ones(1))], 1.0).item() == 0.0


def test_clip_grad_value_matches_torch():
    kp, tp = twin_params()
    utils.clip_grad_value_(kp, 0.7)
    torch.nn.utils.clip_grad_value_(tp, 0.7)
    for p, q in zip(kp, tp):
        assert_close(p.grad, q.grad)


def test_parameters_to_vector_round_trip():
    kp, tp = twin_params()
    vk = utils.parameters_to_vector(kp)
    vt = torch.nn.utils.parameters_to_vector(tp)
    assert_close(vk, vt)
    utils.vector_to_parameters(vk * 2, kp)
    torch.nn.utils.vector_to_parameters(vt * 2, tp)
    for p, q in zip(kp, tp):
        assert_close(p, q)
        assert isinstance(p, nn.Parameter)
    with pytest.raises(TypeError, match=r"expected kiln\.Tensor, but got: list"):
        utils.vector_to_parameters([1.0], kp)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("side", ["right", "left"])
def test_pad_sequence_matches_torch(batch_first, side):
    seqs = [kiln.randn(n, 3, requires_grad=True) for n in (4, 2, 5)]
    tseqs = [k2t(s, True) for s in seqs]
    out = utils.rnn.pad_sequence(seqs, batch_first=batch_first, padding_value=-1.0, padding_side=side)
    ref = torch.nn.utils.rnn.pad_sequence(tseqs, batch_first=batch_first, padding_value=-1.0, padding_side=side)
    assert tuple(out.shape) == tuple(ref.shape)
    assert_close(out, ref)
    g = kiln.randn(*out.shape)
    out.backward(g)
    ref.backward(k2t(g))
    for s, t in zip(seqs, tseqs):
        assert_close(s.grad, t.grad)
    assert to_np(utils.rnn.pad_sequence([kiln.ones(2)])).shape == (2, 1)


def test_clip_grad_norm_clips_when_given_a_generator():
    """``clip_grad_norm_(model.parameters(), ...)``: the generator is read once, and the gradients are clipped."""
    model = kiln.nn.Linear(3, 1, bias=False)
    model.weight.grad = kiln.full((1, 3), 10.0)
    total = kiln.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    assert abs(total.item() - 300**0.5) < 1e-4
    assert abs(model.weight.grad.norm().item() - 1.0) < 1e-4
