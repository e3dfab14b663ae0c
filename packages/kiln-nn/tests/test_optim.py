"""Every optimizer against torch.optim: same parameters after several steps on the same gradients,
the same state_dict structure, and identical resumption from a state_dict."""

from __future__ import annotations

import copy
import pickle
import warnings

import numpy as np
import pytest
import torch
from kiln_nn_helpers import to_np

import kiln
import kiln.nn as nn
import kiln.optim as optim

SHAPES = [(3, 4), (4,), ()]

CASES = [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.1, momentum=0.9)),
    ("SGD", dict(lr=0.1, momentum=0.9, dampening=0.3, weight_decay=0.01)),
    ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.1, maximize=True)),
    ("Adam", dict(lr=0.01)),
    ("Adam", dict(lr=0.01, weight_decay=0.1, amsgrad=True)),
    ("Adam", dict(lr=0.01, betas=(0.8, 0.9), maximize=True, eps=1e-6)),
    ("Adam", dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True)),
    ("AdamW", dict(lr=0.01)),
    ("AdamW", dict(lr=0.01, weight_decay=0.1, amsgrad=True, maximize=True)),
    ("RMSprop", dict(lr=0.01)),
    ("RMSprop", dict(lr=0.01, momentum=0.9, centered=True, weight_decay=0.1)),
    ("RMSprop", dict(lr=0.01, alpha=0.9, maximize=True)),
    ("Adagrad", dict(lr=0.1)),
    ("Adagrad", dict(lr=0.1, lr_decay=0.01, weight_decay=0.1, initial_accumulator_value=0.1, maximize=True)),
    ("Adadelta", dict()),
    ("Adadelta", dict(lr=0.5, rho=0.8, weight_decay=0.1, maximize=True)),
    ("Adamax", dict(lr=0.01)),
    ("Adamax", dict(lr=0.01, weight_decay=0.1, maximize=True)),
    ("NAdam", dict(lr=0.01)),
    ("NAdam", dict(lr=0.01, weight_decay=0.1, momentum_decay=0.01)),
    ("NAdam", dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True, maximize=True)),
    ("RAdam", dict(lr=0.01)),
    ("RAdam", dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True)),
    ("RAdam", dict(lr=0.01, weight_decay=0.1, maximize=True)),
]


def _ids(case):
    name, kw = case
    return name + "-" + "-".join(f"{k}={v}" for k, v in kw.items())


def make_params(seed: int = 0):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    kp = [nn.Parameter(kiln.tensor(a)) for a in arrays]
    tp = [torch.nn.Parameter(torch.tensor(a)) for a in arrays]
    return kp, tp


def grads_for(step: int):
    rng = np.random.default_rng(100 + step)
    return [rng.standard_normal(s).astype(np.float32) for s in SHAPES]


def run_steps(kopt, topt, kp, tp, steps, start=0):
    for i in range(start, start + steps):
        for p, q, g in zip(kp, tp, grads_for(i)):
            p.grad = kiln.tensor(g)
            q.grad = torch.tensor(g)
        kopt.step()
        topt.step()


def assert_params_match(kp, tp, rtol=1e-6, atol=1e-7):
    for p, q in zip(kp, tp):
        np.testing.assert_allclose(to_np(p), to_np(q), rtol=rtol, atol=atol)


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_steps_match_torch(case):
    name, kw = case
    kp, tp = make_params()
    kopt, topt = getattr(optim, name)(kp, **kw), getattr(torch.optim, name)(tp, **kw)
    run_steps(kopt, topt, kp, tp, 6)
    assert_params_match(kp, tp)
    ksd, tsd = kopt.state_dict(), topt.state_dict()
    assert [{k: v for k, v in g.items()} for g in ksd["param_groups"]] == [
        {k: v for k, v in g.items()} for g in tsd["param_groups"]
    ]
    assert list(ksd["state"]) == list(tsd["state"])
    for i in tsd["state"]:
        assert list(ksd["state"][i]) == list(tsd["state"][i])
        for key, tv in tsd["state"][i].items():
            kv = ksd["state"][i][key]
            if isinstance(tv, torch.Tensor):
                assert str(kv.dtype).split(".")[-1] == str(tv.dtype).split(".")[-1]
                np.testing.assert_allclose(to_np(kv), to_np(tv), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("case", CASES[1::2], ids=[_ids(c) for c in CASES[1::2]])
def test_state_dict_round_trip_resumes_identically(case):
    name, kw = case
    kp, _ = make_params()
    opt = getattr(optim, name)(kp, **kw)
    for i in range(3):
        for p, g in zip(kp, grads_for(i)):
            p.grad = kiln.tensor(g)
        opt.step()
    kp2 = [nn.Parameter(p.detach().clone()) for p in kp]
    opt2 = getattr(optim, name)(kp2, **kw)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))
    for i in range(3, 6):
        for p, q, g in zip(kp, kp2, grads_for(i)):
            p.grad = kiln.tensor(g)
            q.grad = kiln.tensor(g)
        opt.step()
        opt2.step()
    for p, q in zip(kp, kp2):
        assert to_np(p).tolist() == to_np(q).tolist()


def test_state_dict_save_load_round_trip_and_torch_layout(tmp_path):
    kp, tp = make_params()
    kopt = optim.Adam([{"params": kp[:2]}, {"params": kp[2:], "lr": 0.5}], lr=0.01)
    topt = torch.optim.Adam([{"params": tp[:2]}, {"params": tp[2:], "lr": 0.5}], lr=0.01)
    run_steps(kopt, topt, kp, tp, 2)
    ksd, tsd = kopt.state_dict(), topt.state_dict()
    assert [g["params"] for g in ksd["param_groups"]] == [g["params"] for g in tsd["param_groups"]]
    assert [g["lr"] for g in ksd["param_groups"]] == [0.01, 0.5]
    kiln.save(ksd, tmp_path / "opt.safetensors")  # int keys (parameter indices) survive the file
    loaded = kiln.load(tmp_path / "opt.safetensors")
    assert pickle.loads(pickle.dumps(ksd)).keys() == loaded.keys()
    kp2 = [nn.Parameter(p.detach().clone()) for p in kp]
    opt2 = optim.Adam([{"params": kp2[:2]}, {"params": kp2[2:]}], lr=0.01)
    opt2.load_state_dict(loaded)
    assert opt2.param_groups[1]["lr"] == 0.5 and opt2.param_groups[1]["params"][0] is kp2[2]
    assert to_np(opt2.state[kp2[0]]["exp_avg"]).tolist() == to_np(kopt.state[kp[0]]["exp_avg"]).tolist()


def test_param_groups_and_errors_match_torch():
    kp, tp = make_params()
    for lib, params in ((kiln, kp), (torch, tp)):
        mod = optim if lib is kiln else torch.optim
        with pytest.raises(ValueError, match="optimizer got an empty parameter list"):
            mod.SGD([], lr=0.1)
        with pytest.raises(ValueError, match="can't optimize a non-leaf Tensor"):
            mod.SGD([params[0] * 2], lr=0.1)
        with pytest.raises(TypeError, match="params argument given to the optimizer should be an iterable"):
            mod.SGD(params[0], lr=0.1)
        with pytest.raises(TypeError, match="optimizer parameters need to be organized in ordered collections"):
            mod.SGD([{"params": set(params)}], lr=0.1)
        with pytest.raises(ValueError, match="Invalid learning rate: -1"):
            mod.Adam(params, lr=-1)
        with pytest.raises(ValueError, match=r"Invalid beta parameter at index 1: 1\.5"):
            mod.Adam(params, betas=(0.9, 1.5))
        with pytest.raises(ValueError, match="Nesterov momentum requires a momentum and zero dampening"):
            mod.SGD(params, lr=0.1, nesterov=True)
        with pytest.warns(UserWarning, match="duplicate parameters"):
            mod.SGD([params[0], params[0]], lr=0.1)
        opt = mod.SGD(params[:1], lr=0.1)
        with pytest.raises(ValueError, match="some parameters appear in more than one parameter group"):
            opt.add_param_group({"params": params[:1]})
        opt.add_param_group({"params": params[1:], "lr": 0.2})
        assert [g["lr"] for g in opt.param_groups] == [0.1, 0.2]
        assert opt.param_groups[1]["momentum"] == 0
        with pytest.raises(ValueError, match="loaded state dict has a different number of parameter groups"):
            mod.SGD(params, lr=0.1).load_state_dict(opt.state_dict())
    assert repr(optim.SGD(kp, lr=0.1)) == repr(torch.optim.SGD(tp, lr=0.1))


def test_zero_grad_and_step_hooks_and_closure():
    kp, _ = make_params()
    opt = optim.SGD(kp, lr=0.1)
    for p in kp:
        p.grad = kiln.ones(*p.shape)
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and p.grad.abs().sum().item() == 0 for p in kp)
    opt.zero_grad()
    assert all(p.grad is None for p in kp)
    calls = []
    h1 = opt.register_step_pre_hook(lambda o, a, k: calls.append("pre"))
    opt.register_step_post_hook(lambda o, a, k: calls.append("post"))

    def closure():
        opt.zero_grad()
        loss = sum((p * p).sum() for p in kp)
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert calls == ["pre", "post"] and loss.item() > 0
    h1.remove()
    opt.step(closure)
    assert calls == ["pre", "post", "post"]


def test_update_runs_without_grad_and_skips_params_without_grad():
    kp, _ = make_params()
    opt = optim.Adam(kp, lr=0.1)
    kp[0].grad = kiln.ones(3, 4)
    before = to_np(kp[1]).copy()
    opt.step()
    assert kp[0].grad_fn is None and kp[0].is_leaf
    assert (to_np(kp[1]) == before).all()
    assert len(opt.state) == 1


def test_fused_update_hook_point():
    seen = []

    def fused_sgd(params, grads, bufs, **hyper):
        seen.append((len(params), hyper["lr"]))
        for p, g in zip(params, grads):
            p.sub_(g * hyper["lr"])

    optim.register_fused_update("sgd", "cpu", fused_sgd)
    try:
        kp, _ = make_params()
        opt = optim.SGD(kp, lr=0.5, foreach=True)
        kp[0].grad = kiln.ones(3, 4)
        opt.step()
        assert seen == [(1, 0.5)]
    finally:
        optim._functional._FUSED.clear()


def test_plugin_fused_updates_are_found_through_the_public_plugin_api(monkeypatch):
    import kiln.plugins

    seen = []

    def fused_sgd(params, grads, bufs, **hyper):
        seen.append(len(params))
        return False  # declined: the loop runs

    asked = []

    def fused_update(name, device_type):
        asked.append((name, device_type))
        return fused_sgd

    monkeypatch.setattr(kiln.plugins, "fused_update", fused_update)
    kp, _ = make_params()
    opt = optim.SGD(kp, lr=0.5)
    kp[0].grad = kiln.ones(3, 4)
    opt.step()
    assert asked == [("sgd", "cpu")] and seen == [1]
    assert np.allclose(to_np(kp[0]), to_np(make_params()[0][0]) - 0.5)


@pytest.mark.parametrize("line_search_fn", [None, "strong_wolfe"])
def test_lbfgs_matches_torch(line_search_fn):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((6, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    x0 = np.zeros(3, dtype=np.float32)

    def run(lib, mod):
        x = (nn.Parameter if lib is kiln else torch.nn.Parameter)(lib.tensor(x0))
        A, B = lib.tensor(a), lib.tensor(b)
        opt = mod.LBFGS([x], lr=1, max_iter=10, history_size=5, line_search_fn=line_search_fn)

        def closure():
            opt.zero_grad()
            loss = ((A @ x - B) ** 2).sum() + (x**4).sum() * 0.1
            loss.backward()
            return loss

        losses = [opt.step(closure).item() for _ in range(3)]
        return x, losses, opt

    xk, lk, ok = run(kiln, optim)
    xt, lt, ot = run(torch, torch.optim)
    np.testing.assert_allclose(lk, lt, rtol=1e-4)
    np.testing.assert_allclose(to_np(xk), to_np(xt), rtol=1e-4, atol=1e-5)
    assert set(ok.state_dict()["state"][0]) == set(ot.state_dict()["state"][0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="LBFGS doesn't support per-parameter options"):
            optim.LBFGS([{"params": [nn.Parameter(kiln.ones(1))]}, {"params": [nn.Parameter(kiln.ones(1))]}])


def test_named_parameters_like_torch():
    km = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))
    tm = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
    ko, to = optim.AdamW(km.named_parameters(), lr=0.1), torch.optim.AdamW(tm.named_parameters(), lr=0.1)
    assert ko.param_groups[0]["param_names"] == to.param_groups[0]["param_names"]
    assert ko.state_dict()["param_groups"] == to.state_dict()["param_groups"]
    for mod, m in ((optim, km), (torch.optim, tm)):
        with pytest.raises(ValueError, match="all optimizer params should be with/without names"):
            mod.SGD([("a", m[0].weight), m[0].bias], lr=0.1)


@pytest.mark.parametrize("name", ["SGD"])
def test_differentiable_step_is_recorded(name):
    """``differentiable=True`` runs the update with autograd on (PyTorch's rule): the new parameter is a
    function of the old one and of its gradient, and gradients flow through the step. (Adam's in-place
    moment updates trip kiln's saved-tensor version check, which checks every saved tensor of a node
    where PyTorch checks only those the needed gradients read.)"""

    def run(L):
        w0 = L.tensor([1.0, -2.0, 3.0], dtype=L.float64, requires_grad=True)
        g0 = L.tensor([0.5, 0.25, -1.0], dtype=L.float64, requires_grad=True)
        w = w0 * 1.0  # a non-leaf parameter: an in-place update of it can be recorded
        w.grad = g0 * 1.0
        opt = getattr(L.optim, name)([w], lr=0.1, differentiable=True)
        opt.step()
        assert w.grad_fn is not None
        return L.autograd.grad((w * w).sum(), (w0, g0))

    for got, expected in zip(run(kiln), run(torch)):
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-12)


def test_plain_step_is_not_recorded():
    w = kiln.nn.Parameter(kiln.ones(3))
    w.grad = kiln.ones(3)
    kiln.optim.SGD([w], lr=0.1).step()
    assert w.grad_fn is None and w.requires_grad
