"""kiln.nn.utils.parametrize / parametrizations and the hook-based weight_norm / spectral_norm against torch."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
from layer_twins import load_from_torch, same_error, seeded, to_np  # noqa: F401
from torch.nn.utils import parametrizations as TP
from torch.nn.utils import parametrize as tP

import kiln
import kiln.nn as nn
from kiln.nn import utils as kutils
from kiln.nn.utils import parametrizations as KP
from kiln.nn.utils import parametrize as kP


def _close(a, b, tol=1e-5, rtol=1e-4):
    assert tuple(a.shape) == tuple(b.shape)
    np.testing.assert_allclose(to_np(a), to_np(b), rtol=rtol, atol=tol)


def _same_structure(k, t):
    assert list(k.state_dict()) == list(t.state_dict())
    assert [n for n, _ in k.named_parameters()] == [n for n, _ in t.named_parameters()]
    assert [n for n, _ in k.named_buffers()] == [n for n, _ in t.named_buffers()]
    assert repr(k).replace("kiln.", "torch.") == repr(t)
    assert type(k).__name__ == type(t).__name__


def _run_and_compare(k, t, shape, *, grads=True, rtol=1e-4):
    x = torch.randn(*shape, requires_grad=True)
    xk = kiln.tensor(to_np(x), requires_grad=True)
    yk, yt = k(xk), t(x)
    _close(yk, yt, rtol=rtol)
    if not grads:
        return
    g = torch.randn(*yt.shape)
    (yk * kiln.tensor(to_np(g))).sum().backward()
    (yt * g).sum().backward()
    _close(xk.grad, x.grad, rtol=rtol)
    tp = dict(t.named_parameters())
    kp = dict(k.named_parameters())
    assert list(kp) == list(tp)
    for n, p in kp.items():
        _close(p.grad, tp[n].grad, rtol=rtol)


def _make_param(torch_mod, lib):
    """A custom parametrization written once for both libraries."""

    class Symmetric(lib.nn.Module):
        def forward(self, x):
            return x.triu() + x.triu(1).transpose(-1, -2)

        def right_inverse(self, a):
            return a.triu()

    class Scale(lib.nn.Module):
        def forward(self, x):
            return x * 2

        def right_inverse(self, a):
            return a / 2

    class NoInverse(lib.nn.Module):
        def forward(self, x):
            return x + 1

    return {"Symmetric": Symmetric, "Scale": Scale, "NoInverse": NoInverse}[torch_mod]


def _pair(name):
    return _make_param(name, kiln)(), _make_param(name, torch)()


# ------------------------------------------------------------------------------ parametrize


def test_register_parametrization_matches_torch():
    k, t = nn.Linear(4, 4), torch.nn.Linear(4, 4)
    load_from_torch(k, t)
    pk, pt = _pair("Symmetric")
    kP.register_parametrization(k, "weight", pk)
    tP.register_parametrization(t, "weight", pt)
    _same_structure(k, t)
    assert kP.is_parametrized(k) and kP.is_parametrized(k, "weight") and not kP.is_parametrized(k, "bias")
    assert kP.type_before_parametrizations(k) is nn.Linear and isinstance(k, nn.Linear)
    _close(k.weight, t.weight)
    _close(k.parametrizations.weight.original, t.parametrizations.weight.original)
    _run_and_compare(k, t, (3, 4))
    # chaining a second parametrization appends to the list
    kP.register_parametrization(k, "weight", _pair("Scale")[0])
    tP.register_parametrization(t, "weight", _pair("Scale")[1])
    _same_structure(k, t)
    _close(k.weight, t.weight)
    # assignment goes through right_inverse (in reverse order)
    value = torch.randn(4, 4)
    value = value + value.T
    k.weight = kiln.tensor(to_np(value))
    t.weight = value
    _close(k.parametrizations.weight.original, t.parametrizations.weight.original)
    _close(k.weight, t.weight)
    k.zero_grad()
    t.zero_grad()
    _run_and_compare(k, t, (2, 4))


@pytest.mark.parametrize("leave", [True, False])
def test_remove_parametrizations_matches_torch(leave):
    k, t = nn.Linear(3, 3), torch.nn.Linear(3, 3)
    load_from_torch(k, t)
    kP.register_parametrization(k, "weight", _pair("Symmetric")[0])
    tP.register_parametrization(t, "weight", _pair("Symmetric")[1])
    kP.register_parametrization(k, "bias", _pair("Scale")[0])
    tP.register_parametrization(t, "bias", _pair("Scale")[1])
    _same_structure(k, t)
    kP.remove_parametrizations(k, "weight", leave_parametrized=leave)
    tP.remove_parametrizations(t, "weight", leave_parametrized=leave)
    _same_structure(k, t)
    _close(k.weight, t.weight)
    assert isinstance(k.weight, nn.Parameter)
    kP.remove_parametrizations(k, "bias", leave_parametrized=leave)
    tP.remove_parametrizations(t, "bias", leave_parametrized=leave)
    _same_structure(k, t)
    assert type(k) is nn.Linear and not kP.is_parametrized(k)
    _run_and_compare(k, t, (2, 3))


def test_parametrize_buffer_and_unsafe_and_no_inverse():
    k, t = nn.BatchNorm1d(3), torch.nn.BatchNorm1d(3)
    kP.register_parametrization(k, "running_var", _pair("Scale")[0])
    tP.register_parametrization(t, "running_var", _pair("Scale")[1])
    _same_structure(k, t)
    _close(k.running_var, t.running_var)
    # NoInverse: original kept as is; assigning raises torch's error
    k2, t2 = nn.Linear(2, 2), torch.nn.Linear(2, 2)
    load_from_torch(k2, t2)
    kP.register_parametrization(k2, "weight", _pair("NoInverse")[0])
    tP.register_parametrization(t2, "weight", _pair("NoInverse")[1])
    _close(k2.weight, t2.weight)

    def assign_k():
        k2.weight = kiln.ones(2, 2)

    def assign_t():
        t2.weight = torch.ones(2, 2)

    same_error(assign_k, assign_t, RuntimeError)


def test_parametrize_errors_match_torch():
    class Flat(kiln.nn.Module):
        def forward(self, x):
            return x.flatten()

    class TFlat(torch.nn.Module):
        def forward(self, x):
            return x.flatten()

    k, t = nn.Linear(2, 3), torch.nn.Linear(2, 3)
    same_error(
        lambda: kP.register_parametrization(k, "weight", Flat()),
        lambda: tP.register_parametrization(t, "weight", TFlat()),
        ValueError,
    )
    same_error(
        lambda: kP.register_parametrization(k, "nope", Flat()),
        lambda: tP.register_parametrization(t, "nope", TFlat()),
        ValueError,
    )
    same_error(
        lambda: kP.remove_parametrizations(k, "weight"), lambda: tP.remove_parametrizations(t, "weight"), ValueError
    )
    # unsafe lets the shape change
    kP.register_parametrization(k, "weight", Flat(), unsafe=True)
    tP.register_parametrization(t, "weight", TFlat(), unsafe=True)
    assert tuple(k.weight.shape) == tuple(t.weight.shape) == (6,)
    # a sequence-parametrized tensor cannot be left unparametrized
    k2, t2 = KP.weight_norm(nn.Linear(2, 3)), TP.weight_norm(torch.nn.Linear(2, 3))
    same_error(
        lambda: kP.remove_parametrizations(k2, "weight", leave_parametrized=False),
        lambda: tP.remove_parametrizations(t2, "weight", leave_parametrized=False),
        ValueError,
    )
    same_error(lambda: pickle_roundtrip(k2), lambda: pickle_roundtrip(t2), RuntimeError)


def pickle_roundtrip(m):
    import pickle

    return pickle.loads(pickle.dumps(m))


def test_cached_evaluates_once_and_deepcopy():
    calls = []

    class Counting(kiln.nn.Module):
        def forward(self, x):
            calls.append(1)
            return x * 3

    k = nn.Linear(2, 2)
    kP.register_parametrization(k, "weight", Counting())
    calls.clear()
    with kP.cached():
        a = k.weight
        b = k.weight
        assert a is b
    assert len(calls) == 1
    _ = k.weight
    assert len(calls) == 2
    k2 = copy.deepcopy(k)
    assert type(k2).__name__ == "ParametrizedLinear"
    _close(k2.weight, k.weight)
    assert k2.parametrizations.weight.original is not k.parametrizations.weight.original


def test_transfer_parametrizations_and_params():
    k = nn.Linear(3, 3)
    kP.register_parametrization(k, "weight", _pair("Symmetric")[0])
    k2 = nn.Linear(3, 3)
    kP.transfer_parametrizations_and_params(k, k2)
    assert kP.is_parametrized(k2, "weight")
    assert k2.parametrizations.weight.original is k.parametrizations.weight.original
    _close(k2.weight, k.weight)


# ------------------------------------------------------------------------------ weight_norm (parametrization)


WN_CASES = [
    (lambda lib: lib.nn.Linear(4, 3), (2, 4), 0),
    (lambda lib: lib.nn.Linear(4, 3), (2, 4), 1),
    (lambda lib: lib.nn.Linear(4, 3), (2, 4), None),
    (lambda lib: lib.nn.Conv2d(2, 3, 3), (1, 2, 5, 5), 0),
    (lambda lib: lib.nn.Conv1d(2, 3, 3), (2, 2, 6), -2),
    (lambda lib: lib.nn.ConvTranspose2d(2, 3, 3), (1, 2, 4, 4), 1),
]


@pytest.mark.parametrize(("make", "shape", "dim"), WN_CASES)
def test_parametrizations_weight_norm_matches_torch(make, shape, dim):
    t = TP.weight_norm(make(torch), dim=dim)
    k = KP.weight_norm(make(kiln), dim=dim)
    _same_structure(k, t)
    load_from_torch(k, t)
    _close(k.parametrizations.weight.original0, t.parametrizations.weight.original0)
    _close(k.weight, t.weight)
    _run_and_compare(k, t, shape)


def test_weight_norm_gradcheck_and_initial_value():
    k = nn.Linear(3, 2).double()
    w = k.weight.detach().clone()
    KP.weight_norm(k)
    _close(k.weight, w, tol=1e-12)
    g0, v0 = (kiln.randn(2, 1, dtype=kiln.float64, requires_grad=True), kiln.randn(2, 3, dtype=kiln.float64))
    v0.requires_grad_(True)
    fn = k.parametrizations.weight[0]
    assert kiln.autograd.gradcheck(lambda g, v: fn(g, v), (g0, v0))


def test_parametrizations_weight_norm_loads_old_state_dict():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        old = torch.nn.utils.weight_norm(torch.nn.Linear(4, 3))
    t = TP.weight_norm(torch.nn.Linear(4, 3))
    k = KP.weight_norm(nn.Linear(4, 3))
    sd = old.state_dict()
    t.load_state_dict(sd)
    k.load_state_dict({n: kiln.tensor(to_np(v)) for n, v in sd.items()})
    _close(k.weight, t.weight)
    _close(k.parametrizations.weight.original1, old.weight_v)


# ------------------------------------------------------------------------------ spectral_norm (parametrization)


SN_CASES = [
    (lambda lib: lib.nn.Linear(5, 3), (2, 5), {}),
    (lambda lib: lib.nn.Conv2d(2, 4, 3), (1, 2, 5, 5), {"n_power_iterations": 3}),
    (lambda lib: lib.nn.ConvTranspose1d(2, 3, 3), (2, 2, 4), {}),
    (lambda lib: lib.nn.Linear(4, 6), (2, 4), {"dim": 1, "eps": 1e-6}),
]


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize(("make", "shape", "kwargs"), SN_CASES)
def test_parametrizations_spectral_norm_matches_torch(make, shape, kwargs, training):
    t = TP.spectral_norm(make(torch), **kwargs)
    k = KP.spectral_norm(make(kiln), **kwargs)
    _same_structure(k, t)
    load_from_torch(k, t)  # copies original, _u and _v
    k.train(training)
    t.train(training)
    for _ in range(2):
        _run_and_compare(k, t, shape)
        _close(k.parametrizations.weight[0]._u, t.parametrizations.weight[0]._u)
        _close(k.parametrizations.weight[0]._v, t.parametrizations.weight[0]._v)
        k.zero_grad()
        t.zero_grad()


def test_spectral_norm_sigma_is_the_largest_singular_value():
    k = KP.spectral_norm(nn.Linear(6, 4))
    k.eval()
    w = k.parametrizations.weight.original.detach()
    s = kiln.linalg.svdvals(w)
    np.testing.assert_allclose(to_np(kiln.linalg.svdvals(k.weight.detach()))[0], 1.0, rtol=1e-3)
    assert float(s[0]) > 0


def test_parametrizations_spectral_norm_errors_match_torch():
    same_error(
        lambda: KP.spectral_norm(nn.Linear(2, 3), n_power_iterations=0),
        lambda: TP.spectral_norm(torch.nn.Linear(2, 3), n_power_iterations=0),
        ValueError,
    )
    same_error(
        lambda: KP.spectral_norm(nn.Linear(2, 3), dim=2),
        lambda: TP.spectral_norm(torch.nn.Linear(2, 3), dim=2),
        IndexError,
    )
    same_error(
        lambda: KP.spectral_norm(nn.Linear(2, 3), name="nope"),
        lambda: TP.spectral_norm(torch.nn.Linear(2, 3), name="nope"),
        ValueError,
    )


def test_parametrizations_spectral_norm_1d_weight():
    t, k = torch.nn.Linear(2, 3), nn.Linear(2, 3)
    load_from_torch(k, t)
    TP.spectral_norm(t, name="bias")
    KP.spectral_norm(k, name="bias")
    _same_structure(k, t)
    _close(k.bias, t.bias)


# ------------------------------------------------------------------------------ hook-based weight_norm / spectral_norm


@pytest.mark.parametrize(("make", "shape", "dim"), WN_CASES)
def test_hook_weight_norm_matches_torch(make, shape, dim):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        t = torch.nn.utils.weight_norm(make(torch), dim=dim)
    with pytest.warns(FutureWarning, match="kiln.nn.utils.parametrizations.weight_norm"):
        k = kutils.weight_norm(make(kiln), dim=dim)
    _same_structure(k, t)
    load_from_torch(k, t)
    _run_and_compare(k, t, shape)
    kutils.remove_weight_norm(k)
    torch.nn.utils.remove_weight_norm(t)
    _same_structure(k, t)
    _close(k.weight, t.weight)
    assert isinstance(k.weight, nn.Parameter)


def test_hook_weight_norm_errors_match_torch():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        k = kutils.weight_norm(nn.Linear(2, 3))
        t = torch.nn.utils.weight_norm(torch.nn.Linear(2, 3))
        same_error(lambda: kutils.weight_norm(k), lambda: torch.nn.utils.weight_norm(t), RuntimeError)
        same_error(
            lambda: kutils.remove_weight_norm(k, "bias"),
            lambda: torch.nn.utils.remove_weight_norm(t, "bias"),
            ValueError,
        )


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize(("make", "shape", "kwargs"), SN_CASES)
def test_hook_spectral_norm_matches_torch(make, shape, kwargs, training):
    t = torch.nn.utils.spectral_norm(make(torch), **kwargs)
    k = kutils.spectral_norm(make(kiln), **kwargs)
    _same_structure(k, t)
    load_from_torch(k, t)  # weight_orig, weight_u, weight_v
    k.train(training)
    t.train(training)
    for _ in range(2):
        # in eval mode sigma comes from the random (not yet iterated) u, v: large values, float32 noise
        _run_and_compare(k, t, shape, rtol=1e-4 if training else 1e-3)
        _close(k.weight_u, t.weight_u)
        _close(k.weight_v, t.weight_v)
        k.zero_grad()
        t.zero_grad()
    kutils.remove_spectral_norm(k)
    torch.nn.utils.remove_spectral_norm(t)
    _same_structure(k, t)
    _close(k.weight, t.weight)
    assert not k._state_dict_hooks and not k._load_state_dict_pre_hooks


def test_hook_spectral_norm_errors_and_version_metadata():
    k, t = kutils.spectral_norm(nn.Linear(2, 3)), torch.nn.utils.spectral_norm(torch.nn.Linear(2, 3))
    same_error(lambda: kutils.spectral_norm(k), lambda: torch.nn.utils.spectral_norm(t), RuntimeError)
    same_error(
        lambda: kutils.remove_spectral_norm(k, "bias"),
        lambda: torch.nn.utils.remove_spectral_norm(t, "bias"),
        ValueError,
    )
    same_error(
        lambda: kutils.spectral_norm(nn.Linear(2, 3), n_power_iterations=-1),
        lambda: torch.nn.utils.spectral_norm(torch.nn.Linear(2, 3), n_power_iterations=-1),
        ValueError,
    )
    assert k.state_dict()._metadata[""]["spectral_norm"] == t.state_dict()._metadata[""]["spectral_norm"]


def test_hook_spectral_norm_migrates_version_0_checkpoint():
    t = torch.nn.utils.spectral_norm(torch.nn.Linear(3, 4))  # W^T W invertible: v is well defined
    t.eval()
    x = torch.randn(2, 3)
    t(x)
    sd = t.state_dict()
    old = {n: v for n, v in sd.items() if n != "weight_v"}
    old["weight"] = t.weight.detach().clone()
    old_k = {n: kiln.tensor(to_np(v)) for n, v in old.items()}

    class SD(dict):
        pass

    tsd, ksd = SD(old), SD(old_k)
    tsd._metadata = {"": {"spectral_norm": {"weight.version": 0}}}
    ksd._metadata = {"": {"spectral_norm": {"weight.version": 0}}}
    t2, k2 = torch.nn.utils.spectral_norm(torch.nn.Linear(3, 4)), kutils.spectral_norm(nn.Linear(3, 4))
    t2.load_state_dict(tsd)
    k2.load_state_dict(ksd)
    _close(k2.weight_v, t2.weight_v, tol=1e-4)
    t2.eval()
    k2.eval()
    _close(k2(kiln.tensor(to_np(x))), t2(x), tol=1e-4)


# ------------------------------------------------------------------------------ orthogonal


ORTH_MAPS = [None, "matrix_exp", "cayley", "householder"]


@pytest.mark.parametrize("use_trivialization", [True, False])
@pytest.mark.parametrize("orthogonal_map", ORTH_MAPS)
@pytest.mark.parametrize("out_in", [(4, 4), (3, 5), (5, 3)])
def test_orthogonal_matches_torch(out_in, orthogonal_map, use_trivialization):
    out_f, in_f = out_in
    t = TP.orthogonal(
        torch.nn.Linear(in_f, out_f), orthogonal_map=orthogonal_map, use_trivialization=use_trivialization
    )
    k = KP.orthogonal(nn.Linear(in_f, out_f), orthogonal_map=orthogonal_map, use_trivialization=use_trivialization)
    _same_structure(k, t)
    w = to_np(k.weight)
    gram = w @ w.T if out_f <= in_f else w.T @ w
    np.testing.assert_allclose(gram, np.eye(min(out_in)), atol=1e-5)
    load_from_torch(k, t)  # original (and base)
    # move away from the identity point so that the map's gradient is exercised
    with torch.no_grad():
        t.parametrizations.weight.original.add_(0.3 * torch.randn(out_f, in_f))
    with kiln.no_grad():
        k.parametrizations.weight.original.copy_(kiln.tensor(to_np(t.parametrizations.weight.original)))
    _close(k.weight, t.weight)
    _run_and_compare(k, t, (2, in_f))
    # assignment goes through right_inverse (NotImplementedError for exp/Cayley without trivialization)
    q = torch.linalg.qr(torch.randn(max(out_in), min(out_in)))[0]
    q = q.T if out_f < in_f else q
    same_map = orthogonal_map in (None, "matrix_exp", "cayley") and not (orthogonal_map is None and out_f != in_f)
    if not use_trivialization and same_map:

        def assign_k():
            k.weight = kiln.tensor(to_np(q))

        def assign_t():
            t.weight = q

        same_error(assign_k, assign_t, NotImplementedError)
        return
    t.weight = q
    k.weight = kiln.tensor(to_np(q))
    _close(k.weight, t.weight)
    _close(k.weight, q)


def test_orthogonal_batched_and_gradcheck():
    t = TP.orthogonal(torch.nn.Linear(3, 3))
    k = KP.orthogonal(nn.Linear(3, 3))
    load_from_torch(k, t)
    _close(k.weight, t.weight)
    from kiln.nn.utils.parametrizations import _householder_product, _matrix_exp

    a = torch.randn(2, 3, 3, dtype=torch.float64) * 2
    _close(_matrix_exp(kiln.tensor(a.numpy())), torch.matrix_exp(a), tol=1e-10)
    h = torch.randn(2, 4, 3, dtype=torch.float64)
    tau = torch.rand(2, 3, dtype=torch.float64)
    _close(
        _householder_product(kiln.tensor(h.numpy()), kiln.tensor(tau.numpy())),
        torch.linalg.householder_product(h, tau),
        tol=1e-10,
    )
    x = kiln.randn(3, 3, dtype=kiln.float64, requires_grad=True)
    assert kiln.autograd.gradcheck(lambda m: _matrix_exp(m - m.mT), (x,))
    v = kiln.randn(4, 2, dtype=kiln.float64, requires_grad=True)
    ta = kiln.rand(2, dtype=kiln.float64, requires_grad=True)
    assert kiln.autograd.gradcheck(_householder_product, (v, ta))


def test_orthogonal_errors_match_torch():
    same_error(
        lambda: KP.orthogonal(nn.Linear(2, 3), name="bias"),
        lambda: TP.orthogonal(torch.nn.Linear(2, 3), name="bias"),
        ValueError,
    )
    same_error(
        lambda: KP.orthogonal(nn.Linear(2, 3), orthogonal_map="qr"),
        lambda: TP.orthogonal(torch.nn.Linear(2, 3), orthogonal_map="qr"),
        ValueError,
    )
    same_error(
        lambda: KP.orthogonal(nn.Linear(2, 3), name="nope"),
        lambda: TP.orthogonal(torch.nn.Linear(2, 3), name="nope"),
        ValueError,
    )
    k, t = KP.orthogonal(nn.Linear(2, 3)), TP.orthogonal(torch.nn.Linear(2, 3))

    def assign_k():
        k.weight = kiln.ones(2, 2)

    def assign_t():
        t.weight = torch.ones(2, 2)

    same_error(assign_k, assign_t, ValueError)
