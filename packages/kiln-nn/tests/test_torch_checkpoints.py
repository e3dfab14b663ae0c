"""Checkpoints shared with PyTorch: a torch.nn model's state_dict and a torch.optim optimizer's load into
kiln-nn (and back through kiln.save(format="torch") and torch.load), parameters stay parameters, and whole
modules pickle. The format itself is tested in packages/kiln/tests/test_serialization_pickle*.py."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest
from kiln_nn_helpers import t2k, to_np

import kiln

torch = pytest.importorskip("torch")

LEGACY = [False, True]
LEGACY_IDS = ["zip", "legacy"]


def _torch_bytes(obj, legacy: bool = False) -> bytes:
    b = io.BytesIO()
    torch.save(obj, b, _use_new_zipfile_serialization=not legacy)
    return b.getvalue()


def _kiln_bytes(obj, **kw) -> bytes:
    b = io.BytesIO()
    kiln.save(obj, b, **kw)
    return b.getvalue()


def _kload(blob: bytes, **kw):
    return kiln.load(io.BytesIO(blob), **kw)


def _tload(blob: bytes, **kw):
    return torch.load(io.BytesIO(blob), **kw)


@pytest.mark.parametrize("legacy", LEGACY, ids=LEGACY_IDS)
def test_torch_parameters_load_as_kiln_parameters(legacy):
    p = torch.nn.Parameter(torch.randn(2, 3))
    frozen = torch.nn.Parameter(torch.randn(2), requires_grad=False)
    out = _kload(_torch_bytes({"p": p, "frozen": frozen, "view": p[1]}, legacy))
    assert type(out["p"]) is kiln.nn.Parameter and out["p"].requires_grad
    assert type(out["frozen"]) is kiln.nn.Parameter and not out["frozen"].requires_grad
    np.testing.assert_array_equal(to_np(out["p"]), to_np(p))
    assert out["view"].untyped_storage() is out["p"].untyped_storage()


def test_kiln_parameters_load_as_torch_parameters():
    p = kiln.nn.Parameter(kiln.ones(2))
    p.tag = 7
    frozen = kiln.nn.Parameter(kiln.zeros(3), requires_grad=False)
    blob = _kiln_bytes({"p": p, "frozen": frozen}, format="torch")
    ref = _tload(blob)  # weights_only=True
    assert type(ref["p"]) is torch.nn.Parameter and ref["p"].requires_grad and ref["p"].tag == 7
    assert type(ref["frozen"]) is torch.nn.Parameter and not ref["frozen"].requires_grad
    back = _kload(blob)
    assert type(back["p"]) is kiln.nn.Parameter and back["p"].tag == 7 and not back["frozen"].requires_grad


def _torch_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(2, 4, 3, padding=1),  # no batch norm right after: its bias would get no gradient
        torch.nn.ReLU(),
        torch.nn.BatchNorm2d(4),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 5 * 5, 3),
    )


def _kiln_net():
    nn = kiln.nn
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(100, 3))


def _train(lib, net, opt, x, steps):
    for _ in range(steps):
        opt.zero_grad()
        net(x).square().mean().backward()
        opt.step()


@pytest.mark.parametrize("legacy", LEGACY, ids=LEGACY_IDS)
def test_torch_model_and_adam_state_load_into_kiln(legacy):
    tnet = _torch_net()
    topt = torch.optim.Adam(tnet.parameters(), lr=0.01)
    x = torch.randn(6, 2, 5, 5, generator=torch.Generator().manual_seed(1))
    _train(torch, tnet, topt, x, 2)
    blob = _torch_bytes({"model": tnet.state_dict(), "optim": topt.state_dict()}, legacy)
    ck = _kload(blob)
    assert ck["model"]["2.num_batches_tracked"].dtype is kiln.int64
    knet = _kiln_net()
    knet.load_state_dict(ck["model"])
    kopt = kiln.optim.Adam(knet.parameters(), lr=0.01)
    kopt.load_state_dict(ck["optim"])
    kx = t2k(x)
    _train(kiln, knet, kopt, kx, 1)
    _train(torch, tnet, topt, x, 1)
    for (name, kv), tv in zip(knet.state_dict().items(), tnet.state_dict().values()):
        np.testing.assert_allclose(to_np(kv), to_np(tv), atol=1e-5, rtol=1e-4, err_msg=name)
    knet.eval(), tnet.eval()
    np.testing.assert_allclose(to_np(knet(kx)), to_np(tnet(x)), atol=1e-5, rtol=1e-4)


def test_kiln_model_and_adam_state_load_into_torch():
    knet = _kiln_net()
    kopt = kiln.optim.Adam(knet.parameters(), lr=0.01)
    x = torch.randn(6, 2, 5, 5, generator=torch.Generator().manual_seed(2))
    kx = t2k(x)
    _train(kiln, knet, kopt, kx, 2)
    blob = _kiln_bytes({"model": knet.state_dict(), "optim": kopt.state_dict()}, format="torch")
    ck = _tload(blob)  # weights_only=True
    tnet = _torch_net()
    tnet.load_state_dict(ck["model"])
    topt = torch.optim.Adam(tnet.parameters(), lr=0.01)
    topt.load_state_dict(ck["optim"])
    _train(torch, tnet, topt, x, 1)
    _train(kiln, knet, kopt, kx, 1)
    for (name, kv), tv in zip(knet.state_dict().items(), tnet.state_dict().values()):
        np.testing.assert_allclose(to_np(kv), to_np(tv), atol=1e-5, rtol=1e-4, err_msg=name)


def test_a_whole_kiln_module_round_trips():
    net = _kiln_net()
    back = _kload(_kiln_bytes(net), weights_only=False)
    assert type(back) is type(net)
    x = kiln.randn(2, 2, 5, 5)
    net.eval(), back.eval()
    np.testing.assert_array_equal(to_np(back(x)), to_np(net(x)))
    with pytest.raises(pickle.UnpicklingError, match=r"Unsupported global: GLOBAL kiln\.nn"):
        _kload(_kiln_bytes(net))


def test_a_whole_torch_module_is_refused_clearly():
    blob = _torch_bytes(torch.nn.Linear(2, 3))
    with pytest.raises(pickle.UnpicklingError, match=r"GLOBAL torch\.nn\.modules\.linear\.Linear was not an allowed"):
        _kload(blob)
    with pytest.raises(ValueError, match=r"torch\.nn\.modules\.linear\.Linear, which has no kiln counterpart"):
        _kload(blob, weights_only=False)
