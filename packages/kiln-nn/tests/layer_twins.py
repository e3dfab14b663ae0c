"""Helpers for the layer tests: build a kiln layer and its torch twin, load torch's weights into kiln,
and compare structure (parameters, buffers, state_dict keys, repr), outputs and gradients."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kiln


def to_np(t) -> np.ndarray:
    """A NumPy copy of a kiln or torch tensor."""
    if isinstance(t, kiln.Tensor):
        return np.array(t.detach().numpy())
    return t.detach().cpu().numpy().copy()


def load_from_torch(kmod, tmod) -> None:
    """Load torch's state_dict into the kiln module (same keys, strict)."""
    kmod.load_state_dict({k: kiln.tensor(to_np(v)) for k, v in tmod.state_dict().items()})


def assert_same_structure(kmod, tmod) -> None:
    """Same state_dict keys and shapes, same parameter count, same repr (``kiln.`` read as ``torch.``)."""
    ksd, tsd = kmod.state_dict(), tmod.state_dict()
    assert list(ksd) == list(tsd)
    for k in ksd:
        assert tuple(ksd[k].shape) == tuple(tsd[k].shape), k
    assert [n for n, _ in kmod.named_parameters()] == [n for n, _ in tmod.named_parameters()]
    assert sum(p.numel() for p in kmod.parameters()) == sum(p.numel() for p in tmod.parameters())
    assert repr(kmod).replace("kiln.", "torch.") == repr(tmod)


def _flatten(out) -> list:
    if isinstance(out, (tuple, list)):
        return [y for o in out for y in _flatten(o)]
    return [out]


def pair(t: torch.Tensor, grad: bool | None = None):
    """(kiln tensor, torch tensor) with the same values; float tensors require grad unless ``grad=False``."""
    want = t.is_floating_point() if grad is None else grad
    tt = t.detach().clone().requires_grad_(want)
    return kiln.tensor(to_np(t), requires_grad=want), tt


def check_twin(
    kmod,
    tmod,
    *inputs,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    load: bool = True,
    structure: bool = True,
    grads: bool = True,
    kwargs: dict | None = None,
    seed: int = 0,
):
    """Run both modules on the same inputs (torch tensors) and compare outputs and all gradients.

    Returns the kiln and torch outputs.
    """
    if structure:
        assert_same_structure(kmod, tmod)
    if load:
        load_from_torch(kmod, tmod)
    kin, tin = zip(*[pair(x) if isinstance(x, torch.Tensor) else (x, x) for x in inputs]) if inputs else ((), ())
    kw = kwargs or {}
    kkw = {k: (kiln.tensor(to_np(v)) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    kout, tout = kmod(*kin, **kkw), tmod(*tin, **kw)
    kf, tf = _flatten(kout), _flatten(tout)
    assert len(kf) == len(tf)
    for a, b in zip(kf, tf):
        if b is None:
            assert a is None
            continue
        assert tuple(a.shape) == tuple(b.shape)
        np.testing.assert_allclose(to_np(a), to_np(b), rtol=rtol, atol=atol)
    if not grads:
        return kout, tout
    rng = np.random.default_rng(seed)
    kloss, tloss = None, None
    for a, b in zip(kf, tf):
        if b is None or not b.is_floating_point() or not b.requires_grad:
            continue
        g = rng.standard_normal(tuple(b.shape)).astype(np.float32)
        kl = (a * kiln.tensor(g)).sum()
        tl = (b * torch.from_numpy(g)).sum()
        kloss = kl if kloss is None else kloss + kl
        tloss = tl if tloss is None else tloss + tl
    if tloss is None:
        return kout, tout
    kloss.backward()
    tloss.backward()
    for a, b in zip(kin, tin):
        if isinstance(b, torch.Tensor) and b.requires_grad:
            assert (a.grad is None) == (b.grad is None)
            if b.grad is not None:
                np.testing.assert_allclose(to_np(a.grad), to_np(b.grad), rtol=rtol, atol=atol)
    tparams = dict(tmod.named_parameters())
    for name, p in kmod.named_parameters():
        tp = tparams[name]
        if tp.grad is None:
            assert p.grad is None or not np.any(to_np(p.grad)), name
        else:
            assert p.grad is not None, name
            np.testing.assert_allclose(to_np(p.grad), to_np(tp.grad), rtol=rtol, atol=atol, err_msg=name)
    return kout, tout


def same_error(kcall, tcall, exc=Exception) -> str:
    """Both calls raise the same exception type with the same message; returns the message."""
    try:
        tcall()
    except exc as e:
        terr = e
    else:  # pragma: no cover - the oracle must raise
        raise AssertionError("torch did not raise")
    try:
        kcall()
    except exc as e:
        kerr = e
    else:
        raise AssertionError(f"kiln did not raise; torch raised {terr!r}")
    assert type(kerr) is type(terr), (kerr, terr)
    kmsg = str(kerr).replace("kiln.", "torch.")
    assert kmsg == str(terr), (kmsg, str(terr))
    return kmsg


@pytest.fixture(autouse=True)
def seeded():
    """Seed torch (which draws every test input) and kiln before each test."""
    torch.manual_seed(0)
    kiln.manual_seed(0)
    yield
