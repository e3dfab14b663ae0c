"""ASGD, Rprop, SparseAdam, Adafactor, Muon and swap_in_optimizer_params_and_state against torch.optim: the
same parameters and state after several steps on the same gradients, state_dict round trips, constructor
errors and signatures."""

from __future__ import annotations

import copy
import inspect

import numpy as np
import pytest
import torch
from kiln_nn_helpers import to_np

import kiln
import kiln.nn as nn
import kiln.optim as optim


def twins(shapes, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s).astype(dtype) for s in shapes]
    return [nn.Parameter(kiln.tensor(a)) for a in arrays], [torch.nn.Parameter(torch.tensor(a)) for a in arrays]


def steps(kopt, topt, kp, tp, n, shapes, start=0, dtype=np.float32):
    for i in range(start, start + n):
        rng = np.random.default_rng(100 + i)
        for p, q, s in zip(kp, tp, shapes):
            g = rng.standard_normal(s).astype(dtype)
            if i % 3 == 2:
                g[...] = np.sign(g) * np.abs(g) ** 0.5  # vary the gradients' scale
            p.grad, q.grad = kiln.tensor(g), torch.tensor(g)
        kopt.step()
        topt.step()


def assert_state_matches(kopt, topt, rtol=1e-5, atol=1e-6):
    ksd, tsd = kopt.state_dict(), topt.state_dict()
    assert ksd["param_groups"] == tsd["param_groups"]
    assert sorted(ksd["state"]) == sorted(tsd["state"])
    for key, tstate in tsd["state"].items():
        kstate = ksd["state"][key]
        assert sorted(kstate) == sorted(tstate)
        for name, value in tstate.items():
            if isinstance(value, torch.Tensor):
                assert str(kstate[name].dtype).split(".")[-1] == str(value.dtype).split(".")[-1], name
                np.testing.assert_allclose(to_np(kstate[name]), value.numpy(), rtol=rtol, atol=atol, err_msg=name)
            else:
                assert kstate[name] == value, name


DENSE_CASES = [
    ("ASGD", {"lr": 0.05}, [(3, 4), (4,), ()]),
    ("ASGD", {"lr": 0.05, "lambd": 0.01, "alpha": 0.5, "t0": 3, "weight_decay": 0.1}, [(3, 4), (4,)]),
    ("ASGD", {"lr": 0.05, "t0": 1, "maximize": True}, [(2, 3)]),
    ("Rprop", {}, [(3, 4), (4,), ()]),
    ("Rprop", {"lr": 0.1, "etas": (0.3, 1.5), "step_sizes": (1e-3, 0.2), "maximize": True}, [(3, 4), (5,)]),
    ("Adafactor", {}, [(3, 4), (4,), (2, 3, 5)]),
    (
        "Adafactor",
        {"lr": 0.1, "beta2_decay": -0.5, "eps": (1e-20, 1e-2), "d": 2.0, "weight_decay": 0.1},
        [(3, 4), (6,)],
    ),
    ("Adafactor", {"maximize": True, "lr": 0.05}, [(4, 2), ()]),
]


@pytest.mark.parametrize(("name", "kwargs", "shapes"), DENSE_CASES)
def test_dense_optimizers_match_torch(name, kwargs, shapes):
    kp, tp = twins(shapes)
    kopt, topt = getattr(optim, name)(kp, **kwargs), getattr(torch.optim, name)(tp, **kwargs)
    assert kopt.defaults == topt.defaults
    steps(kopt, topt, kp, tp, 6, shapes)
    for p, q in zip(kp, tp):
        np.testing.assert_allclose(to_np(p), q.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert_state_matches(kopt, topt)
    # resuming from a state_dict continues identically
    kp2 = [nn.Parameter(p.detach().clone()) for p in kp]
    kopt2 = getattr(optim, name)(kp2, **kwargs)
    kopt2.load_state_dict(copy.deepcopy(kopt.state_dict()))
    kp3 = kp
    steps(kopt2, topt, kp2, tp, 3, shapes, start=6)
    for p, q in zip(kp2, tp):
        np.testing.assert_allclose(to_np(p), q.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert kp3 is kp


def test_float64_and_differing_groups():
    shapes = [(3, 4), (5,)]
    kp, tp = twins(shapes, dtype=np.float64)
    for name, kwargs in (("ASGD", {"lr": 0.1}), ("Rprop", {"lr": 0.02}), ("Adafactor", {"lr": 0.03})):
        kgroups = [{"params": kp[:1], "lr": 0.2}, {"params": kp[1:]}]
        tgroups = [{"params": tp[:1], "lr": 0.2}, {"params": tp[1:]}]
        kopt, topt = getattr(optim, name)(kgroups, **kwargs), getattr(torch.optim, name)(tgroups, **kwargs)
        steps(kopt, topt, kp, tp, 4, shapes, dtype=np.float64)
        for p, q in zip(kp, tp):
            np.testing.assert_allclose(to_np(p), q.detach().numpy(), rtol=1e-12, atol=1e-14)
        assert_state_matches(kopt, topt, rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------------------------------------- SparseAdam
# kiln's core refuses a sparse tensor as ``.grad`` today (its gradient check reads strided metadata) and its
# embedding backward is dense, so these tests put the sparse gradient in place directly (``_grad``): what a
# sparse backward will leave there once the core produces one.


def _set_sparse_grad(p, g):
    p._grad = g


def _sparse_grad(rng, shape, rows):
    idx = np.array(rows, dtype=np.int64)[None, :]
    vals = rng.standard_normal((len(rows), *shape[1:])).astype(np.float32)
    return (
        kiln.sparse_coo_tensor(kiln.tensor(idx), kiln.tensor(vals), shape),
        torch.sparse_coo_tensor(torch.tensor(idx), torch.tensor(vals), shape),
    )


@pytest.mark.parametrize("kwargs", [{}, {"lr": 0.05, "betas": (0.8, 0.9), "eps": 1e-6}, {"lr": 0.1, "maximize": True}])
def test_sparse_adam_matches_torch(kwargs):
    shape = (6, 3)
    kp, tp = twins([shape, (5,)])
    kopt, topt = optim.SparseAdam(kp, **kwargs), torch.optim.SparseAdam(tp, **kwargs)
    rng = np.random.default_rng(0)
    for rows in ([0, 2], [2, 5, 2], [1], [], [0, 1, 2, 3, 4, 5]):  # repeated and empty index sets too
        seed = rng.integers(1 << 30)
        kg, tg = _sparse_grad(np.random.default_rng(seed), shape, rows)
        kv, tv = _sparse_grad(np.random.default_rng(seed + 1), (5,), rows[:1] or [0])
        _set_sparse_grad(kp[0], kg)
        _set_sparse_grad(kp[1], kv)
        tp[0].grad, tp[1].grad = tg, tv
        kopt.step()
        topt.step()
        for p, q in zip(kp, tp):
            np.testing.assert_allclose(to_np(p), q.detach().numpy(), rtol=1e-5, atol=1e-7)
    assert_state_matches(kopt, topt)


def test_sparse_adam_errors_match_torch():
    kp, tp = twins([(3, 2)])
    kopt, topt = optim.SparseAdam(kp), torch.optim.SparseAdam(tp)
    kp[0].grad, tp[0].grad = kiln.ones(3, 2), torch.ones(3, 2)
    for opt in (kopt, topt):
        with pytest.raises(
            RuntimeError, match="SparseAdam does not support dense gradients, please consider Adam instead"
        ):
            opt.step()
    ks = kiln.sparse_coo_tensor(kiln.tensor([[0]]), kiln.tensor([1.0]), (3,))
    ts = torch.sparse_coo_tensor(torch.tensor([[0]]), torch.tensor([1.0]), (3,))
    for kw in ({"lr": -1}, {"eps": -1}, {"betas": (1.0, 0.9)}, {"betas": (0.9, 1.0)}):
        _same_value_error(lambda kw=kw: optim.SparseAdam(kp, **kw), lambda kw=kw: torch.optim.SparseAdam(tp, **kw))
    _same_value_error(  # kiln has no sparse Parameter; a sparse leaf tensor is refused the same way
        lambda: optim.SparseAdam([{"params": kp}, {"params": [ks]}]),
        lambda: torch.optim.SparseAdam([{"params": tp}, {"params": [ts]}]),
    )


def _same_value_error(kcall, tcall):
    with pytest.raises(ValueError) as ke:
        kcall()
    with pytest.raises(ValueError) as te:
        tcall()
    assert str(ke.value).replace("kiln.", "torch.") == str(te.value)


# ---------------------------------------------------------------------------------------- Muon


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"lr": 0.02, "nesterov": False, "momentum": 0.9, "weight_decay": 0.0},
        {"adjust_lr_fn": "match_rms_adamw", "ns_steps": 3},
        {"adjust_lr_fn": "original", "ns_coefficients": (2.0, -1.5, 0.5), "eps": 1e-5},
    ],
)
def test_muon_matches_torch(kwargs):
    shapes = [(6, 4), (3, 8), (5, 5)]
    kp, tp = twins(shapes)
    kopt, topt = optim.Muon(kp, **kwargs), torch.optim.Muon(tp, **kwargs)
    assert kopt.defaults == topt.defaults
    steps(kopt, topt, kp, tp, 4, shapes)
    # the Newton-Schulz iterations run in bfloat16: bfloat16 matmuls round differently across libraries
    for p, q in zip(kp, tp):
        np.testing.assert_allclose(to_np(p), q.detach().numpy(), rtol=2e-2, atol=2e-3)
    ksd, tsd = kopt.state_dict(), topt.state_dict()
    assert ksd["param_groups"] == tsd["param_groups"] and sorted(ksd["state"][0]) == sorted(tsd["state"][0])


def test_muon_orthogonalises_and_errors_match_torch():
    from kiln.optim._functional import _newton_schulz

    g = kiln.randn(8, 5)
    o = _newton_schulz(g, (3.4445, -4.775, 2.0315), 5, 1e-7).float()
    s = np.linalg.svd(to_np(o), compute_uv=False)
    assert o.dtype == kiln.float32 and (s > 0.5).all() and (s < 1.5).all()  # singular values pushed towards 1
    kp, tp = twins([(3, 2)])
    for kw in ({"lr": -1}, {"momentum": -1}, {"weight_decay": -1}, {"adjust_lr_fn": "x"}):
        _same_value_error(lambda kw=kw: optim.Muon(kp, **kw), lambda kw=kw: torch.optim.Muon(tp, **kw))
    _same_value_error(
        lambda: optim.Muon([nn.Parameter(kiln.randn(3))]),
        lambda: torch.optim.Muon([torch.nn.Parameter(torch.randn(3))]),
    )
    kopt, topt = optim.Muon(kp, ns_steps=100), torch.optim.Muon(tp, ns_steps=100)
    kp[0].grad, tp[0].grad = kiln.ones(3, 2), torch.ones(3, 2)
    _same_value_error(kopt.step, topt.step)


# ---------------------------------------------------------------------------------------- constructors


CONSTRUCTOR_ERRORS = [
    ("ASGD", {"lr": -1}),
    ("ASGD", {"weight_decay": -1}),
    ("Rprop", {"lr": -1}),
    ("Rprop", {"etas": (1.5, 1.2)}),
    ("Rprop", {"etas": (0.5, 0.9)}),
    ("Rprop", {"etas": (0, 1.2)}),
    ("Adafactor", {"lr": -1}),
    ("Adafactor", {"beta2_decay": 0.1}),
    ("Adafactor", {"eps": (-1, 1e-3)}),
    ("Adafactor", {"eps": (None, -1)}),
    ("Adafactor", {"d": 0.5}),
    ("Adafactor", {"weight_decay": -1}),
]


@pytest.mark.parametrize(("name", "kwargs"), CONSTRUCTOR_ERRORS)
def test_constructor_errors_match_torch(name, kwargs):
    kp, tp = twins([(2, 2)])
    _same_value_error(lambda: getattr(optim, name)(kp, **kwargs), lambda: getattr(torch.optim, name)(tp, **kwargs))


@pytest.mark.parametrize("name", ["ASGD", "Rprop", "SparseAdam", "Adafactor", "Muon"])
def test_signatures_match_torch(name):
    kcls, tcls = getattr(optim, name), getattr(torch.optim, name)
    assert kcls.__doc__ and name in optim.__all__

    def params(cls):
        return [(p.name, p.kind, p.default) for p in inspect.signature(cls.__init__).parameters.values()]

    assert params(kcls) == params(tcls)


# ---------------------------------------------------------------------------------------- swap-in


def test_swap_in_optimizer_params_and_state_matches_torch():
    shapes = [(3, 2), (2,)]
    kp, tp = twins(shapes)
    kopt, topt = optim.Adam(kp, lr=0.1), torch.optim.Adam(tp, lr=0.1)
    steps(kopt, topt, kp, tp, 2, shapes)
    kstate, tstate = copy.deepcopy(kopt.state_dict()), copy.deepcopy(topt.state_dict())
    kstate["param_groups"][0]["lr"] = tstate["param_groups"][0]["lr"] = 0.5
    kswap, tswap = twins(shapes, seed=7)
    for p, q in zip(kswap, tswap):
        p.grad, q.grad = kiln.ones(p.shape), torch.ones(q.shape)
    before_k = [to_np(p).copy() for p in kp]
    with optim.swap_in_optimizer_params_and_state(kopt, {f"p{i}": p for i, p in enumerate(kswap)}, kstate):
        assert kopt.param_groups[0]["params"] == kswap and kopt.param_groups[0]["lr"] == 0.5
        kopt.step()
    with torch.optim.swap_in_optimizer_params_and_state(topt, {f"p{i}": q for i, q in enumerate(tswap)}, tstate):
        topt.step()
    for p, q in zip(kswap, tswap):  # the swapped-in tensors moved, by the swapped-in state
        np.testing.assert_allclose(to_np(p), q.detach().numpy(), rtol=1e-6)
    for name in ("exp_avg", "exp_avg_sq"):  # in-place state updates reach the given state dict
        np.testing.assert_allclose(to_np(kstate["state"][0][name]), tstate["state"][0][name].numpy(), rtol=1e-6)
    for p, b in zip(kp, before_k):  # the live optimizer is untouched
        np.testing.assert_array_equal(to_np(p), b)
    assert kopt.param_groups[0]["params"] == kp and kopt.param_groups[0]["lr"] == 0.1


SWAP_ERRORS = [
    ("fresh", None),
    ("state", "not a dict"),
    ("state_value", {"state": {0: 1}, "param_groups": []}),
    ("groups", {"state": {}, "param_groups": "x"}),
    ("groups", {"state": {}, "param_groups": []}),
    ("group_keys", None),
    ("group_len", None),
    ("extra", None),
    ("few_params", None),
]


@pytest.mark.parametrize(("case", "value"), SWAP_ERRORS)
def test_swap_in_errors_match_torch(case, value):
    def build(lib, nnlib, optlib):
        ps = [nnlib.Parameter(lib.ones(2)), nnlib.Parameter(lib.ones(3))]
        opt = optlib.SGD(ps, lr=0.1, momentum=0.9)
        if case != "fresh":
            for p in ps:
                p.grad = lib.ones(p.shape)
            opt.step()
        sd = copy.deepcopy(opt.state_dict()) if value is None else value
        params = {"a": ps[0], "b": ps[1]}
        if case == "group_keys":
            sd["param_groups"][0]["extra"] = 1
        elif case == "group_len":
            sd["param_groups"][0]["params"] = [0]
        elif case == "extra":
            sd["state"][7] = {}
        elif case == "few_params":
            params = {"a": ps[0]}
        return opt, params, sd

    def run(lib, nnlib, optlib):
        opt, params, sd = build(lib, nnlib, optlib)
        with optlib.swap_in_optimizer_params_and_state(opt, params, sd):
            pass

    with pytest.raises(RuntimeError) as ke:
        run(kiln, nn, optim)
    with pytest.raises(RuntimeError) as te:
        run(torch, torch.nn, torch.optim)
    assert str(ke.value) == str(te.value)
