"""kiln.nn.Module against torch.nn.Module: registration, traversal, state dicts, printing, hooks."""

from __future__ import annotations

import copy
import pickle
from collections import OrderedDict

import pytest
import torch
from kiln_nn_helpers import assert_close, copy_weights, k2t, to_np

import kiln
import kiln.nn as nn


def build(lib):
    class Block(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = lib.nn.Linear(4, 3)
            self.register_buffer("running", lib.zeros(3))
            self.register_buffer("scratch", lib.ones(2), persistent=False)
            self.scale = lib.nn.Parameter(lib.ones(3))

        def forward(self, x):
            return self.fc(x) * self.scale + self.running

    class Net(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()
            self.seq = lib.nn.Sequential(lib.nn.Linear(3, 5), lib.nn.Flatten(), lib.nn.Linear(5, 2, bias=False))
            self.heads = lib.nn.ModuleDict({"a": lib.nn.Linear(2, 2), "b": lib.nn.Identity()})
            self.shared = self.seq[0]

        def forward(self, x):
            return self.heads["a"](self.seq(self.block(x)))

    return Net()


def test_names_counts_and_state_dict_keys_match_torch():
    k, t = build(kiln), build(torch)
    assert [n for n, _ in k.named_parameters()] == [n for n, _ in t.named_parameters()]
    assert [n for n, _ in k.named_buffers()] == [n for n, _ in t.named_buffers()]
    assert [n for n, _ in k.named_modules()] == [n for n, _ in t.named_modules()]
    assert [n for n, _ in k.named_children()] == [n for n, _ in t.named_children()]
    assert list(k.state_dict()) == list(t.state_dict())
    assert sum(p.numel() for p in k.parameters()) == sum(p.numel() for p in t.parameters())
    dup_k = [n for n, _ in k.named_parameters(remove_duplicate=False)]
    dup_t = [n for n, _ in t.named_parameters(remove_duplicate=False)]
    assert dup_k == dup_t
    assert [n for n, _ in k.named_parameters(prefix="m", recurse=False)] == [
        n for n, _ in t.named_parameters(prefix="m", recurse=False)
    ]
    assert [n for n, _ in k.named_modules(prefix="root", remove_duplicate=False)] == [
        n for n, _ in t.named_modules(prefix="root", remove_duplicate=False)
    ]


def test_forward_backward_matches_torch():
    k, t = build(kiln), build(torch)
    copy_weights(k, t)
    x = kiln.randn(6, 4)
    yk = k(x)
    yt = t(k2t(x))
    assert_close(yk, yt)
    yk.sum().backward()
    yt.sum().backward()
    for (nk, pk), (nt, pt) in zip(k.named_parameters(), t.named_parameters()):
        assert nk == nt
        assert_close(pk.grad, pt.grad)


def test_printed_tree_matches_torch():
    k, t = build(kiln), build(torch)
    assert repr(k) == repr(t)
    lk = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 3), nn.Identity()])
    lt = torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.Linear(2, 2), torch.nn.Linear(2, 3), torch.nn.Identity()])
    assert repr(lk) == repr(lt)
    assert repr(nn.ModuleList()) == repr(torch.nn.ModuleList())
    assert repr(nn.Bilinear(2, 3, 4)) == repr(torch.nn.Bilinear(2, 3, 4))
    assert repr(nn.Unflatten(1, (2, 3))) == repr(torch.nn.Unflatten(1, (2, 3)))
    assert repr(nn.Sequential()) == repr(torch.nn.Sequential())
    pk = nn.ParameterList([nn.Parameter(kiln.ones(2, 3)), kiln.zeros(4)])
    pt = torch.nn.ParameterList([torch.nn.Parameter(torch.ones(2, 3)), torch.zeros(4)])
    assert repr(pk).replace("kiln.", "torch.") == repr(pt)
    dk = nn.ParameterDict({"w": nn.Parameter(kiln.ones(2))})
    dt = torch.nn.ParameterDict({"w": torch.nn.Parameter(torch.ones(2))})
    assert repr(dk).replace("kiln.", "torch.") == repr(dt)


def test_parameter_is_a_tensor_and_prints_like_torch():
    p = nn.Parameter(kiln.tensor([1.0, 2.0]))
    assert isinstance(p, kiln.Tensor) and isinstance(p, nn.Parameter)
    assert p.requires_grad and p.is_leaf
    assert repr(p) == repr(torch.nn.Parameter(torch.tensor([1.0, 2.0])))
    assert not isinstance(p * 2, nn.Parameter)
    q = nn.Parameter(kiln.ones(2), requires_grad=False)
    assert not q.requires_grad
    c = copy.deepcopy(p)
    assert isinstance(c, nn.Parameter) and c.requires_grad and c is not p
    r = pickle.loads(pickle.dumps(p))
    assert isinstance(r, nn.Parameter) and r.tolist() == [1.0, 2.0]
    base = kiln.zeros(3)
    shared = nn.Parameter(base)
    with kiln.no_grad():
        shared.add_(1)
    assert base.tolist() == [1.0, 1.0, 1.0]


def test_load_state_dict_errors_match_torch():
    k, t = nn.Linear(3, 2), torch.nn.Linear(3, 2)
    bad = {"weight": kiln.zeros(2, 4), "extra": kiln.zeros(1)}
    with pytest.raises(RuntimeError) as ek:
        k.load_state_dict(bad)
    with pytest.raises(RuntimeError) as et:
        t.load_state_dict({kk: k2t(v) for kk, v in bad.items()})
    assert str(ek.value).replace("kiln.", "torch.") == str(et.value)
    assert str(ek.value).startswith(
        'Error(s) in loading state_dict for Linear:\n\tMissing key(s) in state_dict: "bias"'
    )
    res_k = k.load_state_dict({"weight": kiln.ones(2, 3), "extra": kiln.zeros(1)}, strict=False)
    res_t = t.load_state_dict({"weight": torch.ones(2, 3), "extra": torch.zeros(1)}, strict=False)
    assert res_k.missing_keys == res_t.missing_keys and res_k.unexpected_keys == res_t.unexpected_keys
    assert k.weight.tolist() == [[1.0] * 3] * 2
    assert repr(k.load_state_dict(k.state_dict())) == repr(t.load_state_dict(t.state_dict()))
    with pytest.raises(TypeError, match="Expected state_dict to be dict-like"):
        k.load_state_dict([1, 2])


def test_nested_load_state_dict_round_trip_and_assign():
    a, b = build(kiln), build(kiln)
    sd = a.state_dict()
    assert "block.scratch" not in sd
    b.load_state_dict(sd)
    for (_, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert to_np(pa).tolist() == to_np(pb).tolist()
    w_before = b.block.fc.weight
    b.load_state_dict(a.state_dict(), assign=True)
    assert b.block.fc.weight is not w_before and isinstance(b.block.fc.weight, nn.Parameter)
    assert b.block.fc.weight.requires_grad
    tk = build(kiln)
    sd = tk.state_dict()
    sd.pop("seq.2.weight")
    sd["seq.9.weight"] = kiln.zeros(1)
    with pytest.raises(RuntimeError) as ek:
        tk.load_state_dict(sd)
    tt = build(torch)
    sdt = {kk: k2t(v) for kk, v in sd.items()}
    with pytest.raises(RuntimeError) as et:
        tt.load_state_dict(sdt)
    assert str(ek.value) == str(et.value)


def test_state_dict_keep_vars_and_detached():
    m = nn.Linear(2, 2)
    sd = m.state_dict()
    assert not sd["weight"].requires_grad and not isinstance(sd["weight"], nn.Parameter)
    assert m.state_dict(keep_vars=True)["weight"] is m.weight
    assert list(m.state_dict(prefix="x.")) == ["x.weight", "x.bias"]


def test_registration_errors_match_torch():
    for lib in (kiln, torch):
        m = lib.nn.Linear(2, 2)
        with pytest.raises(TypeError, match=r"cannot assign .* as parameter 'weight'"):
            m.weight = lib.zeros(2, 2)
        with pytest.raises(KeyError, match="attribute 'weight' already exists"):
            m.register_buffer("weight", lib.zeros(1))
        with pytest.raises(KeyError, match="contain"):
            m.register_parameter("a.b", None)
        with pytest.raises(AttributeError, match="'Linear' object has no attribute 'nope'"):
            _ = m.nope
        with pytest.raises(TypeError, match="is not a Module subclass"):
            m.add_module("x", 3)
    with pytest.raises(ValueError, match="Cannot assign non-leaf Tensor to parameter 'p'"):
        nn.Module().register_parameter("p", nn.Parameter(kiln.ones(1)) * 2 if False else _nonleaf_param())


def _nonleaf_param():
    base = kiln.ones(2, requires_grad=True)
    p = nn.Parameter(kiln.ones(2))
    p._grad_fn = (base * 2).grad_fn  # no public way makes a non-leaf Parameter
    return p


def test_setattr_delattr_dir_and_get_submodule():
    m = nn.Module()
    m.w = nn.Parameter(kiln.ones(1))
    m.sub = nn.Linear(1, 1)
    m.register_buffer("b", kiln.zeros(1))
    m.plain = 3
    assert "w" in m._parameters and "sub" in m._modules and "b" in m._buffers
    assert {"w", "sub", "b", "plain", "forward"} <= set(dir(m))
    m.b = kiln.ones(1)  # reassigning a buffer keeps it a buffer
    assert m._buffers["b"].tolist() == [1.0]
    m.w = None
    assert m._parameters["w"] is None and [n for n, _ in m.named_parameters()] == ["sub.weight", "sub.bias"]
    del m.sub
    assert "sub" not in m._modules
    m.buf2 = nn.Buffer(kiln.ones(2), persistent=False)
    assert "buf2" in m._buffers and "buf2" not in m.state_dict()
    net = build(kiln)
    assert net.get_submodule("seq.0") is net.seq[0]
    assert net.get_parameter("block.fc.weight") is net.block.fc.weight
    assert net.get_buffer("block.running") is net.block.running
    with pytest.raises(AttributeError, match="has no attribute `zzz`"):
        net.get_submodule("seq.zzz")
    del m.plain
    assert not hasattr(m, "plain")


def test_train_eval_apply_requires_grad_zero_grad():
    net = build(kiln)
    assert net.training and all(m.training for m in net.modules())
    net.eval()
    assert not any(m.training for m in net.modules())
    net.train()
    assert all(m.training for m in net.modules())
    with pytest.raises(ValueError, match="training mode is expected to be boolean"):
        net.train(1)
    seen = []
    net.apply(lambda m: seen.append(type(m).__name__))
    assert seen[-1] == "Net" and seen[0] == "Linear"
    net(kiln.randn(2, 4)).sum().backward()
    net.zero_grad(set_to_none=False)
    assert all(p.grad is not None and p.grad.abs().sum().item() == 0 for p in net.parameters())
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())
    net.requires_grad_(False)
    assert not any(p.requires_grad for p in net.parameters())


def test_to_dtype_keeps_parameter_identity():
    net = build(kiln)
    w = net.block.fc.weight
    net.double()
    assert net.block.fc.weight is w and w.dtype is kiln.float64 and net.block.running.dtype is kiln.float64
    net.to(kiln.float32)
    assert w.dtype is kiln.float32
    net.to("cpu", dtype=kiln.float64)
    assert w.dtype is kiln.float64
    net.float().cpu()
    assert w.dtype is kiln.float32
    net.half()
    assert w.dtype is kiln.float16
    with pytest.raises(TypeError, match="floating point dtypes"):
        net.to(kiln.int64)


def test_missing_forward_error():
    with pytest.raises(NotImplementedError) as ek:
        nn.Module()(1)
    with pytest.raises(NotImplementedError) as et:
        torch.nn.Module()(1)
    assert str(ek.value) == str(et.value)


def test_forward_hooks():
    m = nn.Linear(2, 2)
    calls = []
    h1 = m.register_forward_pre_hook(lambda mod, args: calls.append("pre") or (args[0] * 0,))
    h2 = m.register_forward_hook(lambda mod, args, out: calls.append("post"))
    h3 = m.register_forward_hook(lambda mod, args, out: calls.append("first"), prepend=True)
    out = m(kiln.ones(1, 2))
    assert calls == ["pre", "first", "post"]
    assert_close(out, k2t(m.bias).reshape(1, 2))
    for h in (h1, h2, h3):
        h.remove()
    h = m.register_forward_pre_hook(lambda mod, args, kwargs: ((args[0] + 1,), kwargs), with_kwargs=True)
    h4 = m.register_forward_hook(lambda mod, args, kwargs, out: out * 0, with_kwargs=True)
    assert m(kiln.ones(1, 2)).abs().sum().item() == 0
    h.remove()
    h4.remove()
    assert not m._forward_hooks and not m._forward_pre_hooks_with_kwargs


def test_forward_hook_always_call():
    class Boom(nn.Module):
        def forward(self, x):
            raise ValueError("boom")

    m = Boom()
    calls = []
    m.register_forward_hook(lambda *a: calls.append("always"), always_call=True)
    m.register_forward_hook(lambda *a: calls.append("normal"))
    with pytest.raises(ValueError, match="boom"):
        m(1)
    assert calls == ["always"]


def test_full_backward_hooks_match_torch():
    def run(lib):
        lin = lib.nn.Linear(3, 2)
        with lib.no_grad():
            lin.weight.copy_(lib.tensor([[1.0, 2.0, 3.0], [-1.0, 0.5, 2.0]]))
            lin.bias.copy_(lib.tensor([0.1, 0.2]))
        seen = {}

        def pre(mod, grad_output):
            seen["pre"] = grad_output[0].detach().clone()
            return (grad_output[0] * 2,)

        def hook(mod, grad_input, grad_output):
            seen["gi"] = grad_input[0].detach().clone()
            seen["go"] = grad_output[0].detach().clone()
            return (grad_input[0] * 3,)

        lin.register_full_backward_pre_hook(pre)
        lin.register_full_backward_hook(hook)
        x = lib.tensor([[1.0, -1.0, 0.5], [0.0, 2.0, 1.0]], requires_grad=True)
        lin(x).pow(2).sum().backward()
        return seen, x.grad, lin.weight.grad

    sk, gxk, gwk = run(kiln)
    st, gxt, gwt = run(torch)
    for key in ("pre", "gi", "go"):
        assert_close(sk[key], st[key])
    assert_close(gxk, gxt)
    assert_close(gwk, gwt)


def test_backward_hook_without_input_grad():
    lin = nn.Linear(2, 1)
    seen = []
    lin.register_full_backward_hook(lambda m, gi, go: seen.append((gi, go[0].shape)))
    with pytest.warns(
        UserWarning, match="Full backward hook is firing when gradients are computed with respect to module outputs"
    ):
        lin(kiln.ones(3, 2)).sum().backward()
    assert seen and seen[0][0] == (None,)


def test_state_dict_and_load_hooks_and_extra_state():
    class WithExtra(nn.Module):
        def __init__(self):
            super().__init__()
            self.value = 1

        def get_extra_state(self):
            return {"value": self.value}

        def set_extra_state(self, state):
            self.value = state["value"]

    a, b = WithExtra(), WithExtra()
    a.value = 7
    sd = a.state_dict()
    assert list(sd) == ["_extra_state"]
    b.load_state_dict(sd)
    assert b.value == 7
    m = nn.Linear(1, 1)
    got = []
    m.register_load_state_dict_post_hook(lambda mod, keys: got.append(list(keys.missing_keys)))
    m.load_state_dict({"weight": kiln.ones(1, 1)}, strict=False)
    assert got == [["bias"]]


def test_sequential_odict_constructor_and_sd_metadata():
    s = nn.Sequential(OrderedDict([("lin", nn.Linear(1, 2)), ("act", nn.Identity())]))
    assert list(s.state_dict()) == ["lin.weight", "lin.bias"]
    assert s.state_dict()._metadata[""] == {"version": 1}


def test_backward_hook_multiple_inputs_and_outputs_match_torch():
    def run(lib):
        class M(lib.nn.Module):
            def forward(self, x, y, scale=1.0):
                return x * y * scale, (x + y).sum(1), x.sum()

        m = M()
        seen = []

        def listify(gs):
            return [None if g is None else g.tolist() for g in gs]

        m.register_full_backward_hook(lambda mod, gi, go: seen.append((listify(gi), listify(go))))
        x = lib.tensor([[1.0, 2.0]], requires_grad=True)
        y = lib.tensor([[3.0, 4.0]])
        a, b, _ = m(x, y, scale=2.0)
        (a.sum() + b.sum() * 3).backward()
        return seen, x.grad.tolist()

    assert run(kiln) == run(torch)


def test_training_steps_and_state_dicts_leave_nothing_for_the_cycle_collector():
    """A step's graph, gradients and temporaries go when its tensors do (no reference cycle waits for a gc
    pass): layers with state (batch norm, dropout, LSTM, attention), module and tensor hooks, Adam with a
    scheduler, gradient clipping, inputs made per step, and a state-dict round trip."""
    import gc

    net = kiln.nn.Sequential(
        kiln.nn.Linear(6, 8), kiln.nn.BatchNorm1d(8), kiln.nn.ReLU(), kiln.nn.Dropout(0.1), kiln.nn.Linear(8, 3)
    )
    lstm = kiln.nn.LSTM(6, 4, batch_first=True)
    attn = kiln.nn.MultiheadAttention(6, 2, batch_first=True)
    params = [*net.parameters(), *lstm.parameters(), *attn.parameters()]
    opt = kiln.optim.Adam(params, lr=1e-3)
    sched = kiln.optim.lr_scheduler.StepLR(opt, 2)
    net[0].register_forward_hook(lambda m, i, o: None)
    net[0].register_full_backward_hook(lambda m, gi, go: None)
    net[4].weight.register_hook(lambda g: g * 1)

    def step():
        x = kiln.randn(5, 6, requires_grad=True)  # an input that itself takes a gradient, made per step
        seq = kiln.randn(5, 3, 6)
        opt.zero_grad()
        out = net(x)
        out.retain_grad()
        loss = kiln.nn.functional.cross_entropy(out, kiln.tensor([0, 1, 2, 0, 1]))
        loss = loss + lstm(seq)[0].sum() * 1e-3 + attn(seq, seq, seq)[0].sum() * 1e-3
        loss.backward()
        kiln.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        net.load_state_dict(net.state_dict())

    step()
    gc.collect()
    gc.disable()
    try:
        for _ in range(2):
            step()
        assert gc.collect() == 0
    finally:
        gc.enable()
