"""Autograd's extension points against PyTorch: tensor hooks, custom Functions (save_for_backward,
needs_input_grad, non-differentiable outputs) and the version-counter checks of in-place writes."""

# ruff: noqa: B023 - lambdas made inside loops are called within the same iteration

from __future__ import annotations

import contextlib
import gc

import kiln_testutil as U
import numpy as np
import pytest
import torch

import kiln


def leaves(values, dtype=kiln.float64):
    """(kiln, torch) leaves requiring grad with the same values."""
    return U.both(np.asarray(values, dtype=np.float64), dtype=dtype, requires_grad=True)


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


@contextlib.contextmanager
def _collector_off():
    """Python's cycle collector off for the block (reference counting alone frees what is dropped), after a
    pass that clears what came before; the block ends by checking the collector finds nothing."""
    gc.collect()
    gc.disable()
    try:
        yield
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_a_custom_functions_graph_is_freed_without_the_cycle_collector():
    """The node holds its ctx and the ctx its saved tensors: nothing points back, so dropping the output
    frees them at once (a ctx -> node reference kept a compiled model's activations until a gc pass)."""
    import weakref

    class Saves(kiln.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            inner = x * 2
            ctx.save_for_backward(inner, x)
            ctx.keep = inner
            return inner + 1

        @staticmethod
        def backward(ctx, grad):
            inner, x = ctx.saved_tensors
            assert kiln.equal(inner, x * 2)
            return grad * 2

    with _collector_off():
        x = kiln.ones(3, requires_grad=True)
        y = Saves.apply(x)
        saved = weakref.ref(y.grad_fn.ctx.keep)
        y.sum().backward()
        assert x.grad.tolist() == [2.0, 2.0, 2.0]
        del y
        assert saved() is None
        y = Saves.apply(x)  # never run backward
        saved = weakref.ref(y.grad_fn.ctx.keep)
        del y
        assert saved() is None


def test_a_leaf_and_its_accumulator_node_make_no_cycle():
    """A leaf holds its AccumulateGrad node weakly (the node holds the leaf): a leaf made per step goes with
    its gradient when dropped, no gc pass needed, and so does a graph with a retain_grad() hook; the leaf's
    post-accumulate hooks stay with it across the nodes each recorded graph makes for it, and while a graph
    holds the node, it is the one every edge names."""
    import weakref

    with _collector_off():
        for _ in range(2):
            a = kiln.ones(3, requires_grad=True)
            (a * 2).sum().backward()
            grad = weakref.ref(a.grad)
            del a
            assert grad() is None
        w = kiln.ones(3, requires_grad=True)
        y = w * 2
        y.retain_grad()  # its hook, on y's node, names the node weakly
        y.sum().backward(retain_graph=True)
        assert y.grad.tolist() == [1.0, 1.0, 1.0]
        node = weakref.ref(y.grad_fn)
        del y
        assert node() is None
    p = kiln.ones(2, requires_grad=True)
    seen = []
    handle = p.register_post_accumulate_grad_hook(lambda t: seen.append(t.grad.tolist()))
    for k in (1.0, 2.0):
        (p * k).sum().backward()
        gc.collect()  # the node of this backward's graph is gone; the hook is not
    assert seen == [[1.0, 1.0], [3.0, 3.0]]
    y = p * 3
    acc = y.grad_fn.next_functions[0][0]
    assert type(acc).__name__ == "AccumulateGrad" and acc.variable is p
    assert (p + 1).grad_fn.next_functions[0][0] is acc
    handle.remove()
    y.sum().backward()
    assert len(seen) == 2 and p.grad.tolist() == [6.0, 6.0]


@pytest.mark.parametrize(
    "graph",
    [
        lambda a, b, c: a * b,
        lambda a, b, c: a + b + c,
        lambda a, b, c: c * (a + b),
        lambda a, b, c: (a * 2 + b) * c,
    ],
)
def test_leaves_accumulate_in_pytorchs_order(graph):
    """Leaves whose gradients become ready together accumulate in the order they became ready, as in
    PyTorch: what their post-accumulate and tensor hooks see of the others' ``.grad`` is PyTorch's."""

    def order(lib):
        leaves = [lib.ones(3, requires_grad=True) for _ in range(3)]
        seen = []
        for name, t in zip("abc", leaves):
            t.register_hook(lambda g, name=name: seen.append("hook " + name))
            t.register_post_accumulate_grad_hook(lambda p, name=name: seen.append(name))
        graph(*leaves).sum().backward()
        return seen

    assert order(kiln) == order(torch)


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


def test_function_output_that_is_a_view_written_in_forward():
    """A custom Function whose forward writes a view of its result in place and returns both: the view's
    history is the Function's node (output 0), not an ``as_strided`` view of the base, and the gradient of
    output 0 goes to output 0 (it went to output 1 before, so a[:2] received 100 instead of 1)."""
    results = []
    for lib in (kiln, torch):

        class F(lib.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                y = x.clone()
                w = y[0]
                w.mul_(2)
                return w, y

            @staticmethod
            def backward(ctx, gw, gy):
                g = gy * 100
                g[0] = g[0] + gw
                return g

        a = lib.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
        w, y = F.apply(a * 1)
        names = (type(w.grad_fn).__name__, type(y.grad_fn).__name__, w._version)
        (w.sum() + 0 * y.sum()).backward()
        results.append((names, a.grad))
    assert results[0][0] == results[1][0] == ("FBackward", "FBackward", 1)
    U.assert_close(results[0][1], results[1][1])
