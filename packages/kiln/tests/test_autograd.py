"""Autograd against PyTorch: backward, autograd.grad (allow_unused, create_graph / higher order),
retain_graph, grad modes, detach, requires_grad_, retain_grad, hooks, accumulation, custom Functions,
version-counter checks, anomaly mode, backward(inputs=...), grad_fn names, gradcheck and gradgradcheck."""

# ruff: noqa: B023 - lambdas made inside loops are called within the same iteration

from __future__ import annotations

import warnings

import kiln_testutil as U
import numpy as np
import pytest
import torch

import kiln

FREED = "Trying to backward through the graph a second time"


def leaves(values, dtype=kiln.float64):
    """(kiln, torch) leaves requiring grad with the same values."""
    return U.both(np.asarray(values, dtype=np.float64), dtype=dtype, requires_grad=True)


# ---------------------------------------------------------------------------------------- backward / grad


def test_backward_accumulates_into_leaves():
    kx, tx = leaves([1.0, -2.0, 3.0])
    kw, tw = leaves([[0.5], [1.5]])
    for x, w in ((kx, kw), (tx, tw)):
        y = (w * x).exp().sum() + (x * x).sum()
        y.backward()
    U.assert_close(kx.grad, tx.grad)
    U.assert_close(kw.grad, tw.grad)
    assert kx.grad.requires_grad is False and kx.grad.grad_fn is None


def test_gradient_accumulation_over_two_backward_calls():
    kx, tx = leaves([1.0, 2.0])
    for x in (kx, tx):
        (x * x).sum().backward()
        (3 * x).sum().backward()
    U.assert_close(kx.grad, tx.grad)
    kg, tg = kx.grad, tx.grad
    for x in (kx, tx):
        (x**3).sum().backward()
    U.assert_close(kx.grad, tx.grad)
    assert (kx.grad is kg) == (tx.grad is tg), "accumulation happens in place into the existing .grad, like torch"
    kx.grad.zero_()
    tx.grad.zero_()
    kx.grad = None
    tx.grad = None
    for x in (kx, tx):
        (x * 2).sum().backward()
    U.assert_close(kx.grad, tx.grad)


def test_backward_with_gradient_argument():
    kx, tx = leaves([[1.0, 2.0], [3.0, 4.0]])
    g = np.array([[1.0, -1.0], [0.5, 2.0]])
    (kx * kx).backward(kiln.tensor(g))
    (tx * tx).backward(torch.tensor(g))
    U.assert_close(kx.grad, tx.grad)
    kiln.autograd.backward(
        [kx.sum(), (kx * 2).sum()], [kiln.tensor(1.0, dtype=kiln.float64), kiln.tensor(3.0, dtype=kiln.float64)]
    )
    torch.autograd.backward(
        [tx.sum(), (tx * 2).sum()], [torch.tensor(1.0, dtype=torch.float64), torch.tensor(3.0, dtype=torch.float64)]
    )
    U.assert_close(kx.grad, tx.grad)


def test_autograd_grad_basic_and_leaves_untouched():
    kx, tx = leaves([1.0, 2.0, 3.0])
    ky, ty = leaves([0.5, 0.5, 0.5])
    (kgx, kgy) = kiln.autograd.grad((kx * ky).sin().sum(), (kx, ky))
    (tgx, tgy) = torch.autograd.grad((tx * ty).sin().sum(), (tx, ty))
    U.assert_close(kgx, tgx)
    U.assert_close(kgy, tgy)
    assert kx.grad is None and ky.grad is None
    assert kgx.requires_grad is False
    (kg,) = kiln.autograd.grad(kx * 2, kx, grad_outputs=kiln.ones(3, dtype=kiln.float64))
    (tg,) = torch.autograd.grad(tx * 2, tx, grad_outputs=torch.ones(3, dtype=torch.float64))
    U.assert_close(kg, tg)
    # single tensor input returns a 1-tuple
    r = kiln.autograd.grad((kx * kx).sum(), kx)
    assert isinstance(r, tuple) and len(r) == 1


def test_autograd_grad_allow_unused():
    kx, tx = leaves([1.0, 2.0])
    kz, tz = leaves([3.0])
    U.assert_same_error(
        lambda: kiln.autograd.grad((kx * 2).sum(), (kx, kz)), lambda: torch.autograd.grad((tx * 2).sum(), (tx, tz))
    )
    kg = kiln.autograd.grad((kx * 2).sum(), (kx, kz), allow_unused=True)
    tg = torch.autograd.grad((tx * 2).sum(), (tx, tz), allow_unused=True)
    U.assert_close(kg, tg)
    kg = kiln.autograd.grad((kx * 2).sum(), (kx, kz), materialize_grads=True)
    tg = torch.autograd.grad((tx * 2).sum(), (tx, tz), materialize_grads=True)
    U.assert_close(kg, tg)


def test_autograd_grad_wrt_intermediate():
    kx, tx = leaves([1.0, 2.0])
    out = {}
    for lib, x in (("k", kx), ("t", tx)):
        h = x.exp()
        y = (h * h).sum()
        out[lib] = (h, y)
    (kg,) = kiln.autograd.grad(out["k"][1], out["k"][0])
    (tg,) = torch.autograd.grad(out["t"][1], out["t"][0])
    U.assert_close(kg, tg)


# ---------------------------------------------------------------------------------------- higher order


HIGHER_ORDER = {
    "x**3": lambda L, x, y: (x**3).sum(),
    "sin": lambda L, x, y: x.sin().sum(),
    "x*y*y cross": lambda L, x, y: (x * y * y).sum(),
    "exp(x*y)": lambda L, x, y: (x * y).exp().sum(),
    "tanh": lambda L, x, y: x.tanh().sum(),
    "sigmoid": lambda L, x, y: L.sigmoid(x).sum(),
    "log": lambda L, x, y: (x.abs() + 1).log().sum(),
    "sqrt": lambda L, x, y: (x * x + 1).sqrt().sum(),
    "div": lambda L, x, y: (x / (y * y + 1)).sum(),
    "pow tensor": lambda L, x, y: ((x.abs() + 1) ** y).sum(),
    "2**x": lambda L, x, y: (2**x).sum(),
    "matmul": lambda L, x, y: (x.unsqueeze(1) @ y.unsqueeze(0)).sin().sum(),
    "mean/amax": lambda L, x, y: (x * x).mean() + (x * y).amax(),
    "cos*x": lambda L, x, y: (x.cos() * x).sum(),
    "relu*x": lambda L, x, y: (x.relu() * x).sum(),
    "relu with negative upstream": lambda L, x, y: (L.relu(x - 0.9) * (y - 1.0) * x).sum(),
}


@pytest.mark.parametrize("name", list(HIGHER_ORDER))
def test_second_and_third_derivatives(name):
    """d/dx, d2/dx2 (diagonal via grad of grad.sum()), d2/dxdy cross terms and d3/dx3 equal torch's."""
    f = HIGHER_ORDER[name]
    x = U.make_pair((3,), kiln.float64, seed=1, requires_grad=True, low=0.3, high=1.5)
    y = U.make_pair((3,), kiln.float64, seed=2, requires_grad=True, low=0.3, high=1.5)

    def derivs(L, a, b):
        out = f(L, a, b)
        (gx,) = L.autograd.grad(out, a, create_graph=True)
        gxx, gxy = L.autograd.grad(gx.sum(), (a, b), create_graph=True, allow_unused=True)
        res = [out, gx, gxx, gxy]
        if gxx is not None and gxx.requires_grad:
            (gxxx,) = L.autograd.grad(gxx.sum(), a, allow_unused=True)
            res.append(gxxx)
        return tuple(res)

    U.check_op(derivs, x, y, grad=False, rtol=1e-10, atol=1e-10)


def test_create_graph_backward_then_backward_again():
    kx, tx = leaves([0.5, 1.5])
    for x in (kx, tx):
        y = (x**3).sum()
        y.backward(create_graph=True)
        g = x.grad
        assert g.requires_grad
        x.grad = None
        g.sum().backward()
    U.assert_close(kx.grad, tx.grad)


# ---------------------------------------------------------------------------------------- retain_graph


def test_second_backward_without_retain_graph_raises():
    kx, tx = leaves([1.0, 2.0])
    ky, ty = (kx * kx).sum(), (tx * tx).sum()
    ky.backward()
    ty.backward()
    info = U.assert_same_error(ky.backward, ty.backward)
    assert FREED in str(info.value)


def test_retain_graph_allows_second_backward():
    kx, tx = leaves([1.0, 2.0])
    ky, ty = (kx * kx).exp().sum(), (tx * tx).exp().sum()
    ky.backward(retain_graph=True)
    ty.backward(retain_graph=True)
    ky.backward()
    ty.backward()
    U.assert_close(kx.grad, tx.grad)
    U.assert_same_error(ky.backward, ty.backward)


def test_second_backward_through_graph_without_saved_tensors_is_allowed():
    """torch only refuses when a freed *saved tensor* is needed; add/sum save none."""
    kx, tx = leaves([1.0, 2.0])
    ky, ty = (kx + 1).sum(), (tx + 1).sum()
    ky.backward()
    ty.backward()
    ky.backward()
    ty.backward()
    U.assert_close(kx.grad, tx.grad)


def test_autograd_grad_frees_graph_too():
    kx, tx = leaves([1.0, 2.0])
    ky, ty = (kx.sin()).sum(), (tx.sin()).sum()
    kiln.autograd.grad(ky, kx)
    torch.autograd.grad(ty, tx)
    U.assert_same_error(lambda: kiln.autograd.grad(ky, kx), lambda: torch.autograd.grad(ty, tx))


# ---------------------------------------------------------------------------------------- grad modes


def test_no_grad_context_and_decorators():
    kx, tx = leaves([1.0])
    with kiln.no_grad():
        assert not kiln.is_grad_enabled()
        ky = kx * 2
    with torch.no_grad():
        ty = tx * 2
    assert ky.requires_grad == ty.requires_grad is False and ky.grad_fn is None
    assert kiln.is_grad_enabled()

    @kiln.no_grad()
    def f(a):
        return a * 2

    @kiln.no_grad
    def g(a):
        return a * 3

    assert f(kx).requires_grad is False and g(kx).requires_grad is False
    assert kiln.is_grad_enabled()
    assert (kx * 2).requires_grad


def test_enable_grad_inside_no_grad():
    kx, _ = leaves([1.0])
    with kiln.no_grad():
        with kiln.enable_grad():
            assert kiln.is_grad_enabled()
            y = kx * 2
        assert not kiln.is_grad_enabled()
        z = kx * 2

        @kiln.enable_grad()
        def f(a):
            return a * 2

        w = f(kx)
    assert y.requires_grad and not z.requires_grad and w.requires_grad


def test_set_grad_enabled_forms():
    kx, tx = leaves([1.0])
    # as a context manager
    with kiln.set_grad_enabled(False):
        assert not kiln.is_grad_enabled()
        assert not (kx * 2).requires_grad
        with kiln.set_grad_enabled(True):
            assert (kx * 2).requires_grad
        assert not kiln.is_grad_enabled()
    assert kiln.is_grad_enabled()
    # as a function call (takes effect at once)
    kiln.set_grad_enabled(False)
    torch.set_grad_enabled(False)
    try:
        assert not kiln.is_grad_enabled()
        assert (kx * 2).requires_grad == (tx * 2).requires_grad is False
    finally:
        kiln.set_grad_enabled(True)
        torch.set_grad_enabled(True)
    assert kiln.is_grad_enabled()

    # as a decorator
    @kiln.set_grad_enabled(False)
    def f(a):
        return a * 2

    assert kiln.is_grad_enabled(), "decorating must not change the grad mode"
    assert not f(kx).requires_grad
    assert kiln.is_grad_enabled()


def test_no_grad_restores_state_on_exception():
    with pytest.raises(ValueError), kiln.no_grad():
        raise ValueError
    assert kiln.is_grad_enabled()


def test_inference_mode():
    kx, tx = leaves([1.0, 2.0])
    with kiln.inference_mode():
        assert kiln.is_inference_mode_enabled() and not kiln.is_grad_enabled()
        ky = kx * 2
    with torch.inference_mode():
        ty = tx * 2
    assert ky.requires_grad == ty.requires_grad is False
    assert ky.is_inference() == ty.is_inference() is True
    assert kx.is_inference() == tx.is_inference() is False
    assert not kiln.is_inference_mode_enabled()
    U.assert_same_error(lambda: ky.add_(1), lambda: ty.add_(1))
    U.assert_same_error(lambda: (ky * kx).sum().backward(), lambda: (ty * tx).sum().backward())

    @kiln.inference_mode()
    def f(a):
        return a * 2

    assert f(kx).is_inference()
    with kiln.inference_mode(False):
        assert not (kx * 2).is_inference()


# ---------------------------------------------------------------------------------------- detach / requires_grad_ / retain_grad


def test_detach_shares_storage_and_version():
    kx, tx = leaves([1.0, 2.0, 3.0])
    ky, ty = kx * 2, tx * 2
    kd, td = ky.detach(), ty.detach()
    assert kd.requires_grad == td.requires_grad is False
    assert kd.is_leaf and kd.grad_fn is None
    kd[0] = 10.0
    td[0] = 10.0
    U.assert_close(ky, ty)
    assert ky._version == ty._version
    assert kd.data_ptr() == ky.data_ptr()
    # data
    U.assert_close(kx.data, tx.data)
    assert kx.data.requires_grad is False


def test_detach_then_inplace_triggers_version_check():
    kx, tx = leaves([1.0, 2.0])
    ky, ty = kx.exp(), tx.exp()  # exp saves its result
    ky.detach().add_(1)
    ty.detach().add_(1)
    U.assert_same_error(lambda: ky.sum().backward(), lambda: ty.sum().backward())


def test_requires_grad_():
    k, t = U.both(np.ones(2, np.float32))
    assert k.requires_grad_() is k
    t.requires_grad_()
    assert k.requires_grad and k.is_leaf
    k.requires_grad_(False)
    assert not k.requires_grad
    k.requires_grad = True
    assert k.requires_grad
    ky, ty = k * 2, t * 2
    U.assert_same_error(lambda: ky.requires_grad_(False), lambda: ty.requires_grad_(False))
    assert ky.requires_grad_(True) is ky
    U.assert_same_error(lambda: kiln.tensor([1, 2]).requires_grad_(), lambda: torch.tensor([1, 2]).requires_grad_())


def test_retain_grad():
    kx, tx = leaves([1.0, 2.0])
    res = {}
    for name, x in (("k", kx), ("t", tx)):
        h = x * 3
        h.retain_grad()
        h2 = x * 4  # not retained
        (h * h2).sum().backward()
        res[name] = (h, h2)
    U.assert_close(res["k"][0].grad, res["t"][0].grad)
    assert res["k"][0].retains_grad and not res["k"][1].retains_grad
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns on .grad of a non-leaf
        assert res["k"][1].grad is None and res["t"][1].grad is None
    U.assert_close(kx.grad, tx.grad)
    kn, tn = U.both(np.ones(2, np.float32))
    U.assert_same_error(lambda: (kn * 2).retain_grad(), lambda: (tn * 2).retain_grad())


# ---------------------------------------------------------------------------------------- hooks


def test_tensor_hooks_modify_gradients():
    kx, tx = leaves([1.0, 2.0, 3.0])
    res = {}
    for name, x in (("k", kx), ("t", tx)):
        seen = []
        h = x * x
        handle = h.register_hook(lambda g: g * 10)
        h.register_hook(lambda g: seen.append(g.clone()))
        x.register_hook(lambda g: g + 1)
        h.sin().sum().backward()
        res[name] = seen
        handle.remove()
        x.grad = None
        h2 = x * x
        h2.sum().backward(retain_graph=True)
        res[name + "_after_remove_on_new_graph"] = x.grad.clone()
    U.assert_close(res["k"][0], res["t"][0])
    U.assert_close(res["k_after_remove_on_new_graph"], res["t_after_remove_on_new_graph"])


def test_hook_removed_before_backward_does_not_run():
    kx, tx = leaves([1.0, 2.0])
    for x in (kx, tx):
        h = x * 2
        handle = h.register_hook(lambda g: g * 100)
        handle.remove()
        h.sum().backward()
    U.assert_close(kx.grad, tx.grad)


def test_leaf_hook_sees_accumulated_gradient_once_per_backward():
    kx, tx = leaves([1.0, 2.0])
    calls = {"k": 0, "t": 0}
    for name, x in (("k", kx), ("t", tx)):

        def hook(g, name=name):
            calls[name] += 1
            return g * 2

        x.register_hook(hook)
        (x * x + x.exp() + 3 * x).sum().backward()
    assert calls["k"] == calls["t"]
    U.assert_close(kx.grad, tx.grad)


def test_register_hook_on_tensor_without_grad_errors():
    U.assert_same_error(
        lambda: kiln.ones(2).register_hook(lambda g: g), lambda: torch.ones(2).register_hook(lambda g: g)
    )


# ---------------------------------------------------------------------------------------- custom Function


NEEDS_INPUT_GRAD: dict = {}


def _make_functions(lib):
    class MyExp(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x, scale):
            y = x.exp() * scale
            ctx.save_for_backward(y)
            ctx.scale = scale
            return y

        @staticmethod
        def backward(ctx, grad):
            (y,) = ctx.saved_tensors
            return grad * y, None

    class SplitArgmax(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            NEEDS_INPUT_GRAD[lib.__name__] = tuple(ctx.needs_input_grad)
            idx = x.argmax()
            ctx.mark_non_differentiable(idx)
            ctx.save_for_backward(x, w)
            return x * w, idx

        @staticmethod
        def backward(ctx, grad, grad_idx):
            x, w = ctx.saved_tensors
            gx = grad * w if ctx.needs_input_grad[0] else None
            gw = grad * x if ctx.needs_input_grad[1] else None
            return gx, gw

    class WrongCount(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            return x + y

        @staticmethod
        def backward(ctx, grad):
            return (grad,)

    return MyExp, SplitArgmax, WrongCount


KF = _make_functions(kiln)
TF = _make_functions(torch)


def test_custom_function_save_for_backward():
    kx, tx = leaves([0.5, 1.0])
    ky, ty = KF[0].apply(kx, 2.0), TF[0].apply(tx, 2.0)
    U.assert_close(ky, ty)
    assert type(ky.grad_fn).__name__ == type(ty.grad_fn).__name__ == "MyExpBackward"
    assert ky.grad_fn.name() == ty.grad_fn.name()
    (ky * ky).sum().backward()
    (ty * ty).sum().backward()
    U.assert_close(kx.grad, tx.grad)


def test_custom_function_needs_input_grad_and_non_differentiable():
    kx, tx = leaves([1.0, 3.0, 2.0])
    kw, tw = U.both(np.array([2.0, 2.0, 2.0]))
    kout, kidx = KF[1].apply(kx, kw)
    tout, tidx = TF[1].apply(tx, tw)
    U.assert_close((kout, kidx), (tout, tidx))
    assert kidx.requires_grad == tidx.requires_grad is False
    assert kout.grad_fn is not None
    kout.sum().backward()
    tout.sum().backward()
    U.assert_close(kx.grad, tx.grad)
    # needs_input_grad as seen inside forward
    assert NEEDS_INPUT_GRAD["kiln"] == NEEDS_INPUT_GRAD["torch"] == (True, False)


def test_custom_function_wrong_gradient_count():
    kx, tx = leaves([1.0])
    ky, ty = leaves([2.0])
    U.assert_same_error(lambda: KF[2].apply(kx, ky).sum().backward(), lambda: TF[2].apply(tx, ty).sum().backward())


def test_custom_function_no_grad_inputs_returns_plain_tensor():
    k = KF[0].apply(kiln.ones(2), 1.0)
    t = TF[0].apply(torch.ones(2), 1.0)
    assert k.requires_grad == t.requires_grad is False and k.grad_fn is None


def test_custom_function_saved_tensor_modified_inplace():
    kx, tx = leaves([0.5, 1.0])
    ky, ty = KF[0].apply(kx, 1.0), TF[0].apply(tx, 1.0)
    with kiln.no_grad():
        ky.mul_(2)
    with torch.no_grad():
        ty.mul_(2)
    U.assert_same_error(lambda: ky.sum().backward(), lambda: ty.sum().backward())


# ---------------------------------------------------------------------------------------- version counter / in-place errors


VERSION_CASES = {
    "sigmoid output modified": lambda L, x: (lambda y: (y.mul_(2), y)[1])(x.sigmoid()),
    "exp output modified": lambda L, x: (lambda y: (y.add_(1), y)[1])(x.exp()),
    "input of mul modified": lambda L, x: (lambda h: (lambda y: (h.add_(1), y)[1])(h * h))(x * 1),
    "leaf saved then modified under no_grad": None,
    "exp_ result modified again": lambda L, x: (lambda y: (y.exp_(), y.mul_(2), y)[2])(x * 1),
    "relu_ result modified again": lambda L, x: (lambda y: (y.relu_(), y.add_(1), y)[2])(x * 1),
    "tanh output modified through a view": lambda L, x: (lambda y: (y[0].zero_(), y)[1])(x.tanh()),
}


@pytest.mark.parametrize("name", list(VERSION_CASES))
def test_version_counter_check(name):
    """Backward through a saved tensor modified in place raises torch's error, with torch's details
    (tensor type and shape, the node it is output of, versions)."""
    kx, tx = leaves([0.5, -1.0, 2.0], dtype=kiln.float32)
    if name == "leaf saved then modified under no_grad":
        kw, tw = U.both(np.array([1.0, 2.0, 3.0], np.float32))
        ky, ty = kx * kw, tx * tw
        kw.add_(1)
        tw.add_(1)
    else:
        ky, ty = VERSION_CASES[name](kiln, kx), VERSION_CASES[name](torch, tx)
    info = U.assert_same_error(lambda: ky.sum().backward(), lambda: ty.sum().backward())
    assert "one of the variables needed for gradient computation has been modified by an inplace operation" in str(
        info.value
    )


def test_leaf_inplace_error_message():
    info = U.assert_same_error(
        lambda: kiln.ones(2, requires_grad=True).add_(1), lambda: torch.ones(2, requires_grad=True).add_(1)
    )
    assert "a leaf Variable that requires grad is being used in an in-place operation." in str(info.value)


# ---------------------------------------------------------------------------------------- anomaly mode


def test_detect_anomaly_raises_on_nan_in_backward():
    for mode in ("context", "set"):
        kx, tx = leaves([0.0, 1.0])

        def run(lib, x):
            if mode == "context":
                with lib.autograd.detect_anomaly():
                    (x.sqrt() * 0).sum().backward()
            else:
                lib.autograd.set_detect_anomaly(True)
                try:
                    (x.sqrt() * 0).sum().backward()
                finally:
                    lib.autograd.set_detect_anomaly(False)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            info = U.assert_same_error(lambda: run(kiln, kx), lambda: run(torch, tx))
        assert "returned nan values" in str(info.value)
        assert not kiln.autograd.is_anomaly_enabled()


def test_without_anomaly_nan_gradients_pass_silently():
    kx, tx = leaves([0.0, 1.0])
    (kx.sqrt() * 0).sum().backward()
    (tx.sqrt() * 0).sum().backward()
    U.assert_close(kx.grad, tx.grad)


def test_anomaly_mode_flags():
    with kiln.autograd.detect_anomaly():
        assert kiln.autograd.is_anomaly_enabled()
    assert not kiln.autograd.is_anomaly_enabled()
    with kiln.autograd.set_detect_anomaly(True):
        assert kiln.autograd.is_anomaly_enabled()
    assert not kiln.autograd.is_anomaly_enabled()


# ---------------------------------------------------------------------------------------- backward(inputs=...)


def test_backward_inputs_restricts_accumulation():
    kx, tx = leaves([1.0, 2.0])
    ky, ty = leaves([3.0, 4.0])
    (kx * ky).sum().backward(inputs=[kx])
    (tx * ty).sum().backward(inputs=[tx])
    U.assert_close(kx.grad, tx.grad)
    assert ky.grad is None and ty.grad is None
    (kx * ky).sum().backward(inputs=ky)
    (tx * ty).sum().backward(inputs=ty)
    U.assert_close(ky.grad, ty.grad)
    U.assert_close(kx.grad, tx.grad)


def test_backward_inputs_with_non_leaf():
    """torch accumulates into a non-leaf's .grad when it is named in inputs."""
    kx, tx = leaves([1.0, 2.0])
    kh, th = kx * 3, tx * 3
    (kh * kh).sum().backward(inputs=[kh])
    (th * th).sum().backward(inputs=[th])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        U.assert_close(kh.grad, th.grad)
    assert kx.grad is None and tx.grad is None


def test_backward_inputs_empty_error():
    kx, tx = leaves([1.0])
    U.assert_same_error(lambda: (kx * 2).sum().backward(inputs=[]), lambda: (tx * 2).sum().backward(inputs=[]))


# ---------------------------------------------------------------------------------------- grad_fn names

GRAD_FN_CASES = {
    "add": lambda L, x, y: x + y,
    "add scalar": lambda L, x, y: x + 1,
    "sub": lambda L, x, y: x - y,
    "rsub": lambda L, x, y: 1 - x,
    "mul": lambda L, x, y: x * y,
    "mul scalar": lambda L, x, y: x * 2,
    "div": lambda L, x, y: x / y,
    "neg": lambda L, x, y: -x,
    "pow scalar": lambda L, x, y: x**2,
    "pow tensor": lambda L, x, y: x**y,
    "exp": lambda L, x, y: x.exp(),
    "log": lambda L, x, y: x.log(),
    "sqrt": lambda L, x, y: x.sqrt(),
    "sin": lambda L, x, y: x.sin(),
    "cos": lambda L, x, y: x.cos(),
    "tanh": lambda L, x, y: x.tanh(),
    "sigmoid": lambda L, x, y: x.sigmoid(),
    "relu": lambda L, x, y: x.relu(),
    "abs": lambda L, x, y: x.abs(),
    "sign": lambda L, x, y: x.sign(),
    "maximum": lambda L, x, y: L.maximum(x, y),
    "minimum": lambda L, x, y: L.minimum(x, y),
    "where": lambda L, x, y: L.where(x > 1, x, y),
    "sum()": lambda L, x, y: x.sum(),
    "sum(dim)": lambda L, x, y: x.sum(0),
    "mean()": lambda L, x, y: x.mean(),
    "mean(dim)": lambda L, x, y: x.mean(1),
    "amax": lambda L, x, y: x.amax(0),
    "max()": lambda L, x, y: x.max(),
    "max(dim)": lambda L, x, y: x.max(0).values,
    "matmul 2d": lambda L, x, y: x @ y.t(),
    "mm": lambda L, x, y: L.mm(x, y.t()),
    "view": lambda L, x, y: x.view(-1),
    "reshape (view)": lambda L, x, y: x.reshape(-1),
    "permute": lambda L, x, y: x.permute(1, 0),
    "transpose": lambda L, x, y: x.transpose(0, 1),
    "t": lambda L, x, y: x.t(),
    "expand": lambda L, x, y: x[:1].expand(3, 2),
    "squeeze": lambda L, x, y: x.unsqueeze(0).squeeze(0),
    "unsqueeze": lambda L, x, y: x.unsqueeze(0),
    "select": lambda L, x, y: x[0],
    "slice": lambda L, x, y: x[1:],
    "clone": lambda L, x, y: x.clone(),
    "to float64": lambda L, x, y: x.to(L.float64),
}


@pytest.mark.parametrize("name", list(GRAD_FN_CASES))
def test_grad_fn_names(name):
    """``type(y.grad_fn).__name__`` and ``y.grad_fn.name()`` equal torch's."""
    fn = GRAD_FN_CASES[name]
    kx, tx = U.both(np.array([[1.5, 2.0], [0.5, 3.0], [2.5, 1.0]], np.float32), requires_grad=True)
    ky, ty = U.both(np.array([[1.0, 2.5], [1.5, 0.5], [2.0, 2.0]], np.float32), requires_grad=True)
    k, t = fn(kiln, kx, ky), fn(torch, tx, ty)
    assert type(k.grad_fn).__name__ == type(t.grad_fn).__name__, (
        f"{type(k.grad_fn).__name__} != torch's {type(t.grad_fn).__name__}"
    )
    assert k.grad_fn.name() == t.grad_fn.name()


def test_accumulate_grad_node_name():
    kx, tx = leaves([1.0])
    kn = (kx * 2).grad_fn.next_functions[0][0]
    tn = (tx * 2).grad_fn.next_functions[0][0]
    assert kn.name() == tn.name().replace("torch::", "kiln::")
    assert type(kn).__name__ == type(tn).__name__
    assert kn.variable is kx


def test_next_functions_structure():
    kx, tx = leaves([1.0, 2.0])
    kc, tc = U.both(np.array([1.0, 2.0]))
    k, t = kx * kc + kx, tx * tc + tx
    kn, tn = k.grad_fn.next_functions, t.grad_fn.next_functions
    assert len(kn) == len(tn)
    assert [type(n).__name__ for n, _ in kn] == [type(n).__name__ for n, _ in tn]
    kmul, tmul = kn[0][0].next_functions, tn[0][0].next_functions
    assert [(n is None) for n, _ in kmul] == [(n is None) for n, _ in tmul]


# ---------------------------------------------------------------------------------------- gradcheck / gradgradcheck


def _f64(shape, seed, low=-1.5, high=1.5):
    a = U.rand_array(shape, kiln.float64, U.rng_for(seed), low=low, high=high)
    return kiln.tensor(a, dtype=kiln.float64, requires_grad=True)


def _away_from_zero(shape, seed):
    a = U.rand_array(shape, kiln.float64, U.rng_for(seed), low=0.3, high=1.5)
    sign = np.where(U.rng_for(seed + 99).random(shape) < 0.5, -1.0, 1.0)
    return kiln.tensor(a * sign, dtype=kiln.float64, requires_grad=True)


def _pos(shape, seed):
    return _f64(shape, seed, low=0.3, high=2.0)


def _distinct(shape, seed):
    """Distinct values (no ties) for max/min-type ops."""
    n = int(np.prod(shape))
    v = U.rng_for(seed).permutation(n).astype(np.float64).reshape(shape) * 0.37 - 1.0
    return kiln.tensor(v, dtype=kiln.float64, requires_grad=True)


GRADCHECK = {
    "add": (lambda x, y: x + y, lambda: (_f64((2, 3), 1), _f64((3,), 2))),
    "add alpha": (lambda x, y: kiln.add(x, y, alpha=-2.5), lambda: (_f64((2, 3), 1), _f64((2, 1), 2))),
    "sub": (lambda x, y: x - y, lambda: (_f64((2, 3), 1), _f64((1, 3), 2))),
    "sub alpha": (lambda x, y: kiln.sub(x, y, alpha=3), lambda: (_f64((3,), 1), _f64((2, 3), 2))),
    "rsub scalar": (lambda x: 2 - x, lambda: (_f64((3,), 1),)),
    "mul": (lambda x, y: x * y, lambda: (_f64((2, 3), 1), _f64((3,), 2))),
    "div": (lambda x, y: x / y, lambda: (_f64((2, 3), 1), _away_from_zero((3,), 2))),
    "rdiv scalar": (lambda x: 2 / x, lambda: (_away_from_zero((3,), 1),)),
    "div trunc": (
        lambda x, y: kiln.div(x, y, rounding_mode="trunc"),
        lambda: (_away_from_zero((3,), 1), _away_from_zero((3,), 2)),
    ),
    "pow tensor": (lambda x, y: x**y, lambda: (_pos((2, 3), 1), _f64((3,), 2))),
    "pow scalar": (lambda x: x**3, lambda: (_f64((2, 3), 1),)),
    "pow scalar float": (lambda x: x**2.5, lambda: (_pos((2, 3), 1),)),
    "rpow scalar": (lambda x: 2.5**x, lambda: (_f64((2, 3), 1),)),
    "neg": (lambda x: -x, lambda: (_f64((2, 3), 1),)),
    "abs": (lambda x: x.abs(), lambda: (_away_from_zero((2, 3), 1),)),
    "sign": (lambda x: x.sign() * x, lambda: (_away_from_zero((2, 3), 1),)),
    "exp": (lambda x: x.exp(), lambda: (_f64((2, 3), 1),)),
    "log": (lambda x: x.log(), lambda: (_pos((2, 3), 1),)),
    "sqrt": (lambda x: x.sqrt(), lambda: (_pos((2, 3), 1),)),
    "sin": (lambda x: x.sin(), lambda: (_f64((2, 3), 1),)),
    "cos": (lambda x: x.cos(), lambda: (_f64((2, 3), 1),)),
    "tanh": (lambda x: x.tanh(), lambda: (_f64((2, 3), 1),)),
    "sigmoid": (lambda x: x.sigmoid(), lambda: (_f64((2, 3), 1),)),
    "relu": (lambda x: x.relu(), lambda: (_away_from_zero((2, 3), 1),)),
    "maximum": (lambda x, y: kiln.maximum(x, y), lambda: (_distinct((2, 3), 1), _distinct((3,), 2) + 0.05)),
    "minimum": (lambda x, y: kiln.minimum(x, y), lambda: (_distinct((2, 3), 1), _distinct((3,), 2) + 0.05)),
    "where": (lambda x, y: kiln.where(x > 0, x, y), lambda: (_away_from_zero((2, 3), 1), _f64((3,), 2))),
    "sum": (lambda x: x.sum(), lambda: (_f64((2, 3), 1),)),
    "sum dim keepdim": (lambda x: x.sum((0, 2), keepdim=True), lambda: (_f64((2, 3, 2), 1),)),
    "mean": (lambda x: x.mean(-1), lambda: (_f64((2, 3), 1),)),
    "amax": (lambda x: x.amax(1), lambda: (_distinct((2, 3), 1),)),
    "amin": (lambda x: x.amin((0, 1)), lambda: (_distinct((2, 3), 1),)),
    "max()": (lambda x: x.max(), lambda: (_distinct((2, 3), 1),)),
    "max(dim)": (lambda x: x.max(1).values, lambda: (_distinct((2, 3), 1),)),
    "min(dim keepdim)": (lambda x: x.min(0, keepdim=True)[0], lambda: (_distinct((2, 3), 1),)),
    "matmul dot": (lambda x, y: x @ y, lambda: (_f64((3,), 1), _f64((3,), 2))),
    "matmul mv": (lambda x, y: x @ y, lambda: (_f64((2, 3), 1), _f64((3,), 2))),
    "matmul vm": (lambda x, y: x @ y, lambda: (_f64((3,), 1), _f64((3, 2), 2))),
    "matmul mm": (lambda x, y: x @ y, lambda: (_f64((2, 3), 1), _f64((3, 2), 2))),
    "matmul batched broadcast": (lambda x, y: x @ y, lambda: (_f64((2, 1, 2, 3), 1), _f64((2, 3, 2), 2))),
    "matmul 1-d with batched": (lambda x, y: x @ y, lambda: (_f64((3,), 1), _f64((2, 3, 2), 2))),
    "mm": (lambda x, y: kiln.mm(x, y), lambda: (_f64((2, 3), 1), _f64((3, 2), 2))),
    "view": (lambda x: x.view(3, 2) * 1, lambda: (_f64((2, 3), 1),)),
    "reshape copy": (lambda x: x.t().reshape(-1), lambda: (_f64((2, 3), 1),)),
    "permute": (lambda x: x.permute(2, 0, 1), lambda: (_f64((2, 3, 2), 1),)),
    "transpose": (lambda x: x.transpose(0, -1), lambda: (_f64((2, 3, 2), 1),)),
    "t": (lambda x: x.t(), lambda: (_f64((2, 3), 1),)),
    "mT": (lambda x: x.mT, lambda: (_f64((2, 2, 3), 1),)),
    "expand": (lambda x: x.expand(2, 3, 2), lambda: (_f64((3, 1), 1),)),
    "broadcast_to": (lambda x: kiln.broadcast_to(x, (2, 3)), lambda: (_f64((3,), 1),)),
    "squeeze": (lambda x: x.squeeze(), lambda: (_f64((1, 3, 1), 1),)),
    "unsqueeze": (lambda x: x.unsqueeze(1), lambda: (_f64((2, 3), 1),)),
    "flatten": (lambda x: x.flatten(1), lambda: (_f64((2, 2, 2), 1),)),
    "select": (lambda x: x.select(1, -1), lambda: (_f64((2, 3), 1),)),
    "narrow": (lambda x: x.narrow(1, 1, 2), lambda: (_f64((2, 3), 1),)),
    "getitem": (lambda x: x[None, ::2, 1:], lambda: (_f64((3, 3), 1),)),
    "clone": (lambda x: x.clone(), lambda: (_f64((2, 3), 1),)),
    "contiguous": (lambda x: x.t().contiguous(), lambda: (_f64((2, 3), 1),)),
    "inplace mul_ on clone": (lambda x, y: x.clone().mul_(y), lambda: (_f64((2, 3), 1), _f64((3,), 2))),
    "inplace setitem on clone": (
        lambda x, y: (lambda c: (c.__setitem__((0, slice(1, None)), y[:2]), c)[1])(x.clone()),
        lambda: (_f64((2, 3), 1), _f64((3,), 2)),
    ),
    "inplace view add_": (
        lambda x, y: (lambda c: (c.t()[1].add_(y[:2]), c * c)[1])(x.clone()),
        lambda: (_f64((2, 3), 1), _f64((3,), 2)),
    ),
    "copy_": (lambda x, y: (lambda c: (c.copy_(y), c)[1])(x * 1), lambda: (_f64((2, 3), 1), _f64((3,), 2))),
    "exp_ on non-leaf": (lambda x: (x * 2).exp_(), lambda: (_f64((3,), 1),)),
}


@pytest.mark.parametrize("name", list(GRADCHECK))
def test_gradcheck(name):
    fn, make = GRADCHECK[name]
    assert kiln.autograd.gradcheck(fn, make())


@pytest.mark.parametrize("name", list(GRADCHECK))
def test_gradgradcheck(name):
    fn, make = GRADCHECK[name]
    assert kiln.autograd.gradgradcheck(fn, make())


def test_gradcheck_detects_a_wrong_gradient():
    """gradcheck itself can fail: a Function with a wrong backward is caught."""

    class Bad(kiln.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * x

        @staticmethod
        def backward(ctx, grad):
            return grad * 3  # should be 2x

    x = _f64((3,), 1)
    with pytest.raises(kiln.autograd.GradcheckError):
        kiln.autograd.gradcheck(Bad.apply, (x,))
    assert kiln.autograd.gradcheck(Bad.apply, (x,), raise_exception=False) is False


def test_gradgradcheck_detects_a_wrong_second_derivative():
    """gradgradcheck itself can fail: a correct first derivative that is not differentiable correctly."""

    class Square(kiln.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad * 2 * x.detach()  # right value, but d/dx of it is lost

    x = _f64((3,), 1)
    assert kiln.autograd.gradcheck(Square.apply, (x,))
    with pytest.raises(kiln.autograd.GradcheckError):
        kiln.autograd.gradgradcheck(Square.apply, (x,))


def test_gradcheck_requires_an_input_with_grad():
    x = kiln.ones(3, dtype=kiln.float64)
    t = torch.ones(3, dtype=torch.float64)
    U.assert_same_error(
        lambda: kiln.autograd.gradcheck(lambda a: a * 2, (x,)), lambda: torch.autograd.gradcheck(lambda a: a * 2, (t,))
    )


# ---------------------------------------------------------------------------------------- misc


def test_backward_through_non_float_outputs_is_not_recorded():
    kx, tx = leaves([1.0, 2.0])
    for lib, x in ((kiln, kx), (torch, tx)):
        assert (x > 1).requires_grad is False
        assert x.argmax().requires_grad is False
        assert x.to(lib.int64).requires_grad is False


def test_broadcast_gradient_reduction_and_dtype():
    kx, tx = U.both(np.array([[1.0], [2.0]], np.float32), requires_grad=True)
    ky, ty = U.both(np.array([0.5, 1.5, 2.5]), requires_grad=True)  # float64
    (kx * ky).sum().backward()
    (tx * ty).sum().backward()
    U.assert_close(kx.grad, tx.grad)
    U.assert_close(ky.grad, ty.grad)
    assert kx.grad.dtype is kiln.float32 and ky.grad.dtype is kiln.float64


def test_is_leaf_and_grad_fn_flags():
    kx, tx = leaves([1.0])
    for a, b in ((kx, tx), (kx * 2, tx * 2), (kx.detach(), tx.detach()), (kiln.ones(1), torch.ones(1))):
        assert a.is_leaf == b.is_leaf
        assert a.requires_grad == b.requires_grad
        assert (a.grad_fn is None) == (b.grad_fn is None)


def test_error_message_for_numpy_of_requires_grad():
    kx, tx = leaves([1.0])
    U.assert_same_error(lambda: kx.numpy(), lambda: tx.numpy())


def test_accumulated_grad_takes_the_parameters_layout():
    """A contiguous leaf's ``.grad`` is contiguous even when the backward produced a transposed gradient
    (PyTorch's gradient layout contract: optimizers and fused updates see the parameter's layout)."""
    for L in (kiln, torch):
        w = L.ones(3, 5, requires_grad=True)
        x = L.ones(4, 5)
        (x @ w.t()).sum().backward()  # mm's weight gradient comes out transposed
        assert w.grad.stride() == (5, 1), L
        np.testing.assert_array_equal(w.grad.numpy(), np.full((3, 5), 4.0))


def test_product_gradients_take_their_operands_layout():
    """The gradient of a transposed (column-major) matrix operand comes out column-major, as PyTorch's mm
    backward computes it: ``(g^T a)^T`` instead of ``a^T g``, so a Linear weight's gradient needs no
    transposing copy."""
    rng = np.random.default_rng(0)
    a_np, w_np, b_np = rng.standard_normal((4, 5)), rng.standard_normal((3, 5)), rng.standard_normal(3)
    for op in ("matmul", "mm", "addmm"):
        strides = []
        for L in (kiln, torch):
            a, w, b = (L.tensor(v, requires_grad=True) for v in (a_np, w_np, b_np))
            at, wt = a.t().t(), w.t()  # at: a view, row-major; wt: column-major
            out = L.addmm(b, at, wt) if op == "addmm" else getattr(L, op)(at, wt)
            ga, gw = L.autograd.grad(out.sum() * 1.0 + (out * out).sum(), (at, wt))
            strides.append((ga.stride(), gw.stride()))
            if L is kiln:
                got = (ga.numpy(), gw.numpy())
            else:
                np.testing.assert_allclose(got[0], ga.numpy(), rtol=1e-12)
                np.testing.assert_allclose(got[1], gw.numpy(), rtol=1e-12)
        assert strides[0] == strides[1] == (((5, 1), (1, 5))), (op, strides)


@pytest.mark.skipif(not __import__("kiln.autograd.accumulate").autograd.accumulate._STEAL, reason="CPython < 3.14 only")
def test_sole_owner_test_of_a_leafs_first_gradient():
    """A leaf's first gradient becomes its ``.grad`` without a copy only when the engine's buffer holds the
    only reference to it and nothing else reaches its memory."""
    from kiln.autograd.accumulate import _sole_owner

    t = kiln.zeros(64, 80, requires_grad=True)
    assert _sole_owner(t, [kiln.ones(64, 80)])
    assert _sole_owner(t, [kiln.ones(5120).view(64, 80)])  # a view whose base nothing else holds
    assert not _sole_owner(t, [kiln.from_numpy(np.ones((64, 80), np.float32))])  # behind a NumPy wrapper object
    held = kiln.ones(64, 80)
    assert not _sole_owner(t, [held])  # this test holds it too
    base = kiln.ones(5120)
    assert not _sole_owner(t, [base.view(64, 80)])  # another tensor shares the memory
    user = np.ones((64, 80), np.float32)
    assert not _sole_owner(t, [kiln.from_numpy(user)])  # a NumPy array the user holds
    assert not _sole_owner(t, [kiln.from_numpy(user).detach()])
    assert not _sole_owner(t, [kiln.from_numpy(np.ones((80, 64), np.float32)).t()])  # not the leaf's layout
    assert not _sole_owner(t, [kiln.ones(64, 80, dtype=kiln.float64)])
    assert not _sole_owner(kiln.zeros(80, 64, requires_grad=True).t(), [kiln.ones(64, 80)])
    small = kiln.zeros(3, 4, requires_grad=True)
    assert not _sole_owner(small, [kiln.ones(3, 4)])  # small: a copy costs less than the test


def test_leaf_gradient_never_aliases_a_gradient_held_elsewhere():
    """Gradients that the caller, a hook or retain_grad still hold are copied into ``.grad``: accumulating
    a second backward in place never changes them (PyTorch's AccumulateGrad steals only what it alone
    holds; it counts references to the gradient tensor alone, so ``v.view(3).backward(g)`` leaves PyTorch's
    ``v.grad`` sharing ``g``'s memory: kiln counts the references to the memory too)."""
    v = kiln.ones(3, requires_grad=True)
    g = kiln.full((3,), 2.0)
    for make in (lambda v: v, lambda v: v + 0, lambda v: v.view(3), lambda v: v * 1):
        v.grad = None
        make(v).backward(g)
        make(v).backward(g)
        assert g.tolist() == [2.0, 2.0, 2.0] and v.grad.tolist() == [4.0, 4.0, 4.0]
    for L in (kiln, torch):
        v = L.ones(3, requires_grad=True)
        kept = []
        v.grad = None
        for _ in range(2):
            y = v + 0
            y.register_hook(kept.append)
            y.sum().backward()
        assert kept[0].tolist() == [1.0, 1.0, 1.0] and v.grad.tolist() == [2.0, 2.0, 2.0], L
        v.grad = None
        y = v * 1
        y.retain_grad()
        (y * 3).sum().backward(retain_graph=True)
        (y * 3).sum().backward()
        assert y.grad.tolist() == [6.0, 6.0, 6.0] and v.grad.tolist() == [6.0, 6.0, 6.0], L


def test_linear_weight_gradient_is_taken_without_a_copy(monkeypatch):
    """The gradients of a Linear-style product reach the leaves as the engine's own buffers."""
    from kiln.autograd import accumulate, engine

    seen = []
    sole = accumulate._sole_owner
    monkeypatch.setattr(engine, "_sole_owner", lambda t, grads: seen.append(sole(t, grads)) or seen[-1])
    w = kiln.ones(64, 80, requires_grad=True)
    b = kiln.ones(64, requires_grad=True)
    kiln.addmm(b, kiln.ones(4, 80), w.t()).sum().backward()
    assert seen == [False, accumulate._STEAL]  # the bias is too small to be worth the test
    assert w.grad.is_contiguous() and (w.grad == 4.0).all() and (b.grad == 4.0).all()
