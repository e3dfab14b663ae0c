"""PyTorch's autocast rules, one test each: what is cast and what is not, nesting, the weight-cast cache,
per-thread state, gradients, the region's arguments and the custom-function decorators."""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest
import torch

import kiln
import kiln.backend as kb
import kiln.nn.functional as F


class CountCasts(kb.DispatchMode):
    """Counts the dtype conversions autocast makes (they are ordinary ops, seen after autograd)."""

    level = "post_autograd"

    def __init__(self):
        self.casts = []

    def dispatch(self, op, args, redispatch):
        if op.name == "_to_copy":
            self.casts.append(args[0])
        return redispatch(op, args)


def _mats():
    return kiln.rand(3, 4), kiln.rand(4, 5)


def test_state_functions_follow_the_region():
    assert not kiln.is_autocast_enabled("cpu") and not kiln.is_autocast_cpu_enabled()
    assert kiln.get_autocast_dtype("cpu") is kiln.bfloat16 and kiln.get_autocast_cpu_dtype() is kiln.bfloat16
    assert kiln.get_autocast_dtype("cuda") is kiln.float16 and kiln.get_autocast_gpu_dtype() is kiln.float16
    with kiln.autocast("cpu", dtype=kiln.float16) as region:
        assert isinstance(region, kiln.autocast) and kiln.amp.autocast is kiln.autocast
        assert kiln.is_autocast_enabled("cpu") and kiln.get_autocast_dtype("cpu") is kiln.float16
        assert not kiln.is_autocast_enabled("cuda") and not kiln.is_autocast_enabled()
    assert not kiln.is_autocast_enabled("cpu") and kiln.get_autocast_dtype("cpu") is kiln.bfloat16


def test_nested_regions_and_enabled_false_inside():
    a, b = _mats()
    with kiln.autocast("cpu"):
        assert (a @ b).dtype is kiln.bfloat16
        with kiln.autocast("cpu", enabled=False):
            assert (a @ b).dtype is kiln.float32
            with kiln.autocast("cpu", dtype=kiln.float16):
                assert (a @ b).dtype is kiln.float16  # the innermost region decides
            assert (a @ b).dtype is kiln.float32
        assert (a @ b).dtype is kiln.bfloat16
    assert (a @ b).dtype is kiln.float32


def test_set_autocast_enabled_outside_a_region():
    a, b = _mats()
    kiln.set_autocast_enabled("cpu", True)
    try:
        assert (a @ b).dtype is kiln.bfloat16
    finally:
        kiln.set_autocast_enabled("cpu", False)
    assert (a @ b).dtype is kiln.float32


def test_only_tensors_of_the_regions_device_type_are_cast():
    a, b = _mats()
    kiln.set_autocast_enabled("cuda", True)  # autocast on for another device type only
    try:
        assert kiln.is_autocast_enabled("cuda") and (a @ b).dtype is kiln.float32
    finally:
        kiln.set_autocast_enabled("cuda", False)


def test_float64_and_integers_are_never_cast():
    with kiln.autocast("cpu"):
        assert (kiln.rand(3, 4, dtype=kiln.float64) @ kiln.rand(4, 2, dtype=kiln.float64)).dtype is kiln.float64
        assert (kiln.ones(3, 4, dtype=kiln.int64) @ kiln.ones(4, 2, dtype=kiln.int64)).dtype is kiln.int64
        # a float64 input is left as it is, the float32 ones are cast: the op then sees mixed dtypes (as
        # PyTorch: addmm raises for them)
        with pytest.raises(RuntimeError):
            kiln.addmm(kiln.rand(3, 5, dtype=kiln.float64), kiln.rand(3, 4), kiln.rand(4, 5))
    with torch.autocast("cpu"), pytest.raises(RuntimeError):
        torch.addmm(torch.rand(3, 5, dtype=torch.float64), torch.rand(3, 4), torch.rand(4, 5))


def test_in_place_ops_are_not_cast():
    a, b = kiln.rand(3, 4), kiln.rand(3, 4)
    d = kiln.rand(3, 4).half()
    h = kiln.ones(1).half()
    counter = CountCasts()
    with counter, kiln.autocast("cpu", dtype=kiln.float16):
        a.mul_(b)  # "promote" would cast nothing here anyway
        assert d.exp_() is d  # "fp32_float16": exp(d) would run in float32, exp_ writes in place as given
        assert d.dtype is kiln.float16
        assert d.pow_(2) is d
        with pytest.raises(RuntimeError, match="dtypes match"):  # "promote" out of place; in place as PyTorch
            kiln.zeros(3).index_put_((kiln.tensor([0]),), h)
    assert counter.casts == []


def test_an_explicit_dtype_argument_wins():
    x = kiln.rand(3, 4).half()
    with kiln.autocast("cpu", dtype=kiln.float16):
        assert kiln.sum(x).dtype is kiln.float32  # policy: float32 under float16
        assert kiln.sum(x, dtype=kiln.float16).dtype is kiln.float16
        assert kiln.cumsum(x, 0, dtype=kiln.float64).dtype is kiln.float64
        assert kiln.softmax(x, 1, dtype=kiln.float64).dtype is kiln.float64


def test_gradients_flow_to_float32_weights_and_match_pytorch():
    rng = np.random.default_rng(0)
    xs, ws, bs = (rng.standard_normal(s).astype(np.float32) for s in ((8, 6), (4, 6), (4,)))
    target = rng.integers(0, 4, 8)
    grads = {}
    for lib in (kiln, torch):
        w = lib.tensor(ws, requires_grad=True)
        b = lib.tensor(bs, requires_grad=True)
        with lib.autocast("cpu"):
            logits = lib.nn.functional.linear(lib.tensor(xs), w, b)
            loss = lib.nn.functional.cross_entropy(logits, lib.tensor(target))
        assert str(logits.dtype).endswith("bfloat16") and str(loss.dtype).endswith("float32")
        loss.backward()
        assert str(w.grad.dtype).endswith("float32")
        grads[lib.__name__] = (loss.item(), w.grad.numpy(), b.grad.numpy())
    (lk, wk, bk), (lt, wt, bt) = grads["kiln"], grads["torch"]
    assert abs(lk - lt) < 2e-2
    np.testing.assert_allclose(wk, wt, rtol=5e-2, atol=5e-3)
    np.testing.assert_allclose(bk, bt, rtol=5e-2, atol=5e-3)


def test_weight_casts_are_cached_until_the_outermost_region_exits():
    w = kiln.rand(5, 4, requires_grad=True)
    x = kiln.rand(3, 4)
    counter = CountCasts()
    with counter:
        with kiln.autocast("cpu"):
            F.linear(x, w)
            with kiln.autocast("cpu"):
                F.linear(x, w)
            F.linear(x, w)
        weight_casts = [t for t in counter.casts if t is w]
        assert len(weight_casts) == 1  # x (no grad) is cast each time, w once
        assert len(counter.casts) == 4
        with kiln.autocast("cpu"):
            F.linear(x, w)  # a new outermost region casts again
        assert len([t for t in counter.casts if t is w]) == 2


def test_the_cache_can_be_switched_off_and_sees_in_place_updates():
    w = kiln.rand(5, 4, requires_grad=True)
    x = kiln.rand(3, 4)
    counter = CountCasts()
    with counter, kiln.autocast("cpu", cache_enabled=False):
        F.linear(x, w)
        F.linear(x, w)
    assert len([t for t in counter.casts if t is w]) == 2
    counter = CountCasts()
    with counter, kiln.autocast("cpu"):
        first = F.linear(x, w)
        with kiln.no_grad():
            w.mul_(2)  # a stale cast must not be reused (an optimizer step inside the region)
        second = F.linear(x, w)
    assert len([t for t in counter.casts if t is w]) == 2
    np.testing.assert_allclose(second.detach().float().numpy(), 2 * first.detach().float().numpy(), rtol=2e-2)


def test_autocast_state_is_per_thread():
    a, b = _mats()
    seen = {}

    def other():
        seen["enabled"] = kiln.is_autocast_enabled("cpu")
        seen["dtype"] = (a @ b).dtype

    with kiln.autocast("cpu"):
        t = threading.Thread(target=other)
        t.start()
        t.join(timeout=60)
        assert (a @ b).dtype is kiln.bfloat16
    assert seen == {"enabled": False, "dtype": kiln.float32}


def test_as_a_decorator():
    a, b = _mats()

    @kiln.autocast("cpu")
    def f(x, y):
        return x @ y

    assert f(a, b).dtype is kiln.bfloat16 and (a @ b).dtype is kiln.float32
    with pytest.raises(TypeError, match="requires a callable"):
        kiln.autocast("cpu")(3)


def test_region_arguments_are_checked():
    with pytest.raises(ValueError, match="device_type"):
        kiln.autocast(kiln.device("cpu"))
    with pytest.raises(RuntimeError, match="unsupported autocast device_type 'tpu'"):
        kiln.autocast("tpu")
    with pytest.warns(UserWarning, match="target dtype is not supported"):
        region = kiln.autocast("cpu", dtype=kiln.float64)
    a, b = _mats()
    with region:
        assert (a @ b).dtype is kiln.float32
    if not kiln.cuda.is_available():
        with pytest.warns(UserWarning, match="CUDA is not available"):
            assert not kiln.autocast("cuda")._enabled
    with pytest.raises(TypeError, match="dtype"):
        kiln.autocast("cpu", dtype="bfloat16")


def test_an_exception_inside_restores_the_state():
    with pytest.raises(KeyError), kiln.autocast("cpu"):
        raise KeyError("x")
    assert not kiln.is_autocast_enabled("cpu")
    a, b = _mats()
    assert (a @ b).dtype is kiln.float32


SEEN: dict = {}  # what the custom functions below saw inside forward and backward


class _Scale(kiln.autograd.Function):
    @staticmethod
    @kiln.amp.custom_fwd(device_type="cpu", cast_inputs=kiln.float32)
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        SEEN["fwd"] = (x.dtype, kiln.is_autocast_enabled("cpu"), (x @ w).dtype)
        return x @ w

    @staticmethod
    @kiln.amp.custom_bwd(device_type="cpu")
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        SEEN["bwd"] = kiln.is_autocast_enabled("cpu")
        return g @ w.t(), x.t() @ g


class _Plain(kiln.autograd.Function):
    @staticmethod
    @kiln.amp.custom_fwd(device_type="cpu")
    def forward(ctx, x):
        SEEN["fwd"] = kiln.is_autocast_enabled("cpu")
        return x * 2

    @staticmethod
    @kiln.amp.custom_bwd(device_type="cpu")
    def backward(ctx, g):
        SEEN["bwd"] = (kiln.is_autocast_enabled("cpu"), kiln.get_autocast_dtype("cpu"))
        return g * 2


def test_custom_fwd_casts_inputs_and_runs_without_autocast():
    x = kiln.rand(3, 4, dtype=kiln.bfloat16, requires_grad=True)
    w = kiln.rand(4, 2, requires_grad=True)
    with kiln.autocast("cpu"):
        out = _Scale.apply(x, w)
    assert out.grad_fn is not None
    assert out.dtype is kiln.float32
    out.sum().backward()
    assert x.grad.dtype is kiln.bfloat16 and w.grad.dtype is kiln.float32
    assert SEEN["fwd"] == (kiln.float32, False, kiln.float32)
    assert SEEN["bwd"] is False  # forward ran with autocast off, so backward does too


def test_custom_bwd_runs_with_the_forwards_autocast_state():
    x = kiln.rand(3, requires_grad=True)
    with kiln.autocast("cpu", dtype=kiln.float16):
        out = _Plain.apply(x)
    out.sum().backward()  # outside the region
    assert SEEN["fwd"] is True
    assert SEEN["bwd"] == (True, kiln.float16)
    with pytest.raises(ValueError, match="device_type"):
        kiln.amp.custom_fwd(device_type=None)


def test_the_per_device_spellings():
    a, b = _mats()
    with pytest.warns(FutureWarning, match=r"kiln\.amp\.autocast\('cpu'"):
        region = kiln.cpu.amp.autocast()
    with region:
        assert (a @ b).dtype is kiln.bfloat16
    with pytest.warns(FutureWarning), kiln.cpu.amp.autocast(dtype=kiln.float16):
        assert (a @ b).dtype is kiln.float16
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scaler = kiln.cuda.amp.GradScaler()
        assert isinstance(scaler, kiln.amp.GradScaler)
        assert scaler.is_enabled() is kiln.cuda.is_available()
        assert kiln.cpu.amp.GradScaler().is_enabled()
        assert callable(kiln.cuda.amp.custom_fwd) and callable(kiln.cuda.amp.custom_bwd)
    assert kiln.cpu.amp is kiln.cpu.amp  # one namespace per device type


class _HostArray:
    """Storage of the test device below: a NumPy array (the device contract needs no more)."""

    def __init__(self, array):
        self.array = array

    def __len__(self):
        return self.array.size


class _ThirdPartyDevice:
    """A device plugin with no kernels, whose only word about autocast is its default dtype (bfloat16): its
    ops run through the CPU fallback."""

    def kiln_register_devices(self, register):
        register(
            "ampdev",
            empty=lambda n, dtype, index=None: _HostArray(np.zeros(n, dtype.numpy)),
            to_host=lambda s: s.array.copy(),
            from_host=lambda a, index=None: _HostArray(np.ascontiguousarray(a).reshape(-1).copy()),
            write=lambda s, start, a: s.array.__setitem__(slice(start, start + a.size), a.reshape(-1)),
            autocast_dtype=kiln.bfloat16,
        )


def test_a_third_party_device_gets_the_same_policy():
    from kiln_testing._runner import FALLBACK_WARNING, cpu_fallback

    kiln.plugins.register_plugin(_ThirdPartyDevice(), name="ampdev-plugin")
    try:
        a, b = kiln.rand(3, 4, device="ampdev"), kiln.rand(4, 5, device="ampdev")
        with cpu_fallback(True), warnings.catch_warnings():
            warnings.filterwarnings("ignore", FALLBACK_WARNING, UserWarning)
            assert kiln.get_autocast_dtype("ampdev") is kiln.bfloat16  # the plugin's choice
            with kiln.autocast("ampdev"):
                out = a @ b
                assert out.device.type == "ampdev" and out.dtype is kiln.bfloat16
                assert kiln.exp(out).dtype is kiln.bfloat16  # "fp32_float16", under bfloat16
                assert (a.cpu() @ b.cpu()).dtype is kiln.float32  # cpu tensors are another device type
            with kiln.autocast("ampdev", dtype=kiln.float16):
                out = a @ b
                assert out.dtype is kiln.float16 and kiln.exp(out).dtype is kiln.float32
    finally:
        kiln.plugins.unregister_plugin("ampdev-plugin")
