"""A view made before its base gained a history, by an in-place write through the base or another view,
needs a gradient from then on (PyTorch's views ask their base), against PyTorch: reads of the view, writes
into it, and the paths that skip the dispatcher. Before, such a view kept ``requires_grad=False``: a use
dropped its gradient silently, or a write into it left the base's old history in place."""

from __future__ import annotations

import kiln_testutil as U
import numpy as np
import pytest
import torch

import kiln


def _leaf(lib, values):
    return (kiln.tensor if lib is kiln else torch.tensor)(values, dtype=lib.float64, requires_grad=True)


def _written_base(lib, y):
    """``x`` of zeros, a view ``v = x[1:3]`` made first, then ``x`` written from ``y``: ``x.mul_`` after an add."""
    x = lib.zeros(4, dtype=lib.float64)
    v = x[1:3]
    x.add_(1.5)
    x.mul_(y)
    return x, v


# name -> fn(lib, y) -> (tensor whose sum is differentiated, what else to compare); y: a leaf of 4 elements
SCENARIOS = {
    "read after a base write": lambda lib, y: (_written_base(lib, y)[1] * 3, None),
    "read after a write through another view": lambda lib, y: _other_view_write(lib, y),
    "view of a view": lambda lib, y: (_view_of_view(lib, y), None),
    "the view in an op with another input that requires grad": lambda lib, y: _with_other(lib, y),
    "a view of the view by the fast view path": lambda lib, y: (_written_base(lib, y)[1].view(2, 1) * 2, None),
    "expand of the view": lambda lib, y: (_written_base(lib, y)[1].expand(3, 2) * 1, None),
    "the view in a tensor list": lambda lib, y: (lib.cat([_written_base(lib, y)[1], y[:1]]) * 2, None),
    "the view into a custom Function": lambda lib, y: (_double(lib).apply(_written_base(lib, y)[1]), None),
    "a recurrence over views made first": lambda lib, y: (_recurrence(lib, y), None),
    "a zero_ of the view": lambda lib, y: _written_then(lib, y, lambda v: v.zero_()),
    "a fill_ of the view": lambda lib, y: _written_then(lib, y, lambda v: v.fill_(2.0)),
    "a copy_ of a constant into the view": lambda lib, y: _written_then(lib, y, lambda v: v.copy_(lib.ones(2))),
    "an in-place op on the view": lambda lib, y: _written_then(lib, y, lambda v: v.mul_(2)),
    "a setitem into the view": lambda lib, y: _written_then(lib, y, lambda v: v.__setitem__(0, 7.0)),
    "copy_ from the view": lambda lib, y: _copy_from_view(lib, y),
}


def _other_view_write(lib, y):
    x = lib.zeros(4, dtype=lib.float64)
    v = x[:2]
    x[1:3] = y[:2]
    return v * 2, None


def _view_of_view(lib, y):
    x = lib.zeros(4, dtype=lib.float64)
    v = x[:3]
    w = v[1:]
    x[2:3] = y[:1]
    return w * 5


def _with_other(lib, y):
    _, v = _written_base(lib, y)
    z = _leaf(lib, [0.5, -1.0])
    return z * v, z


def _recurrence(lib, y):
    """A hand-written recurrence whose steps read views of the state buffer made before any write."""
    h = lib.zeros(4, 2, dtype=lib.float64)
    rows = [h[t] for t in range(4)]
    h[0] = y[:2]
    for t in range(3):
        h[t + 1] = (rows[t] + y[t + 1]).tanh()  # (a product would save rows[t], which the next write changes)
    return h


def _written_then(lib, y, write):
    x, v = _written_base(lib, y)
    if lib is torch:  # PyTorch refuses an in-place write into such a view as into "a leaf Variable that requires
        _ = v.grad_fn  # grad" until its history is read; kiln writes it (and this test reads nothing first)
    write(v)
    return x + x.sum(), None  # (x * x alone would give a zeroed element a zero gradient whatever its history)


def _copy_from_view(lib, y):
    _, v = _written_base(lib, y)
    out = lib.zeros(2, dtype=lib.float64)
    out.copy_(v)
    return out, None


def _double(lib):
    class Double(lib.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    return Double


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_view_needs_a_gradient_once_its_base_does(name):
    results = []
    for lib in (kiln, torch):
        y = _leaf(lib, [0.5, -2.0, 1.25, 3.0])
        out, other = SCENARIOS[name](lib, y)
        assert out.requires_grad, lib.__name__
        (out * out).sum().backward()
        results.append((out.detach(), y.grad, None if other is None else other.grad))
    (k_out, k_grad, k_other), (t_out, t_grad, t_other) = results
    U.assert_close(k_out, t_out)
    assert t_grad is not None
    U.assert_close(k_grad, t_grad)
    if t_other is not None:
        U.assert_close(k_other, t_other)


def test_the_view_reports_its_new_state():
    """``requires_grad``, ``grad_fn``, ``is_leaf``, ``retain_grad`` and ``numpy()`` of such a view, as in PyTorch."""
    results = []
    for lib in (kiln, torch):
        y = _leaf(lib, [0.5, -2.0, 1.25, 3.0])
        _, v = _written_base(lib, y)
        state = (v.requires_grad, type(v.grad_fn).__name__, v.is_leaf)
        v.retain_grad()
        (v * 4).sum().backward()
        with pytest.raises(RuntimeError, match="requires grad"):
            v.numpy()
        results.append((state, v.grad))
    assert results[0][0] == results[1][0] == (True, "AsStridedBackward0", False)
    U.assert_close(results[0][1], results[1][1])


@pytest.mark.parametrize("how", ["no write", "a write under no_grad", "a base that needs no gradient"])
def test_a_view_stays_without_gradient_where_its_base_needs_none(how):
    """Only a base that requires grad gives its views one: a write under ``no_grad`` gives the base no
    history, and a base written from values that need no gradient needs none."""
    for lib in (kiln, torch):
        y = _leaf(lib, [0.5, -2.0, 1.25, 3.0])
        x = lib.zeros(4, dtype=lib.float64)
        v = x[1:3]
        if how == "a write under no_grad":
            with lib.no_grad():
                x.mul_(y)
        elif how == "a base that needs no gradient":
            x.add_(lib.ones(4, dtype=lib.float64))
        assert not v.requires_grad and v.grad_fn is None, lib.__name__
        assert not (v * 2).requires_grad, lib.__name__
        np.testing.assert_array_equal(v.detach().numpy(), x[1:3].detach().numpy())


def test_a_view_made_under_no_grad_refuses_its_bases_new_history():
    """A view of a parameter made under ``no_grad``, whose base is written afterwards, needs a gradient and
    refuses to take one: PyTorch's error, when its history is read or it is used."""
    for lib in (kiln, torch):
        p = _leaf(lib, [1.0, 2.0, 3.0])
        with lib.no_grad():
            v = p[:2]
            p.add_(1)
        assert v.requires_grad, lib.__name__
        with pytest.raises(RuntimeError, match="A view was created in no_grad mode and its base"):
            _ = v.grad_fn
        with pytest.raises(RuntimeError, match="A view was created in no_grad mode and its base"):
            (v * 2).sum()


def _dtype_views(lib, y):
    x = lib.ones(2)
    iv = x.view(lib.int32)
    back = x.view(lib.int32).view(lib.float32)
    x.mul_(y)
    return iv, back


def test_a_dtype_view_takes_no_history():
    """``view(dtype)`` makes no autograd view (PyTorch gives it no ``_base``): a write that gives the tensor
    a history leaves it, and a float view of it, without a gradient, and its values readable."""
    results = []
    for lib in (kiln, torch):
        y = lib.tensor([0.5, -2.0], requires_grad=True)
        iv, back = _dtype_views(lib, y)
        results.append((iv._base is None, iv.requires_grad, iv.grad_fn, back.requires_grad, iv.numpy().tolist()))
    assert results[0] == results[1]


def test_a_view_follows_its_base_until_it_is_used():
    """Asking ``requires_grad`` changes nothing: a base that stops requiring grad takes its views' flag
    with it, and such a view is no leaf that gathers a gradient."""
    for lib in (kiln, torch):
        x = lib.ones(4, dtype=lib.float64)
        v = x[:2]
        x.requires_grad_(True)
        with lib.no_grad():
            x.mul_(2)
        assert v.requires_grad, lib.__name__
        x.requires_grad_(False)
        assert (v.requires_grad, v.is_leaf) == (False, True), lib.__name__
        with pytest.raises(RuntimeError, match="does not require grad"):
            (v * 3).sum().backward()


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_a_view_made_without_grad_mode_names_its_mode(mode):
    """PyTorch's errors for a view made under ``no_grad`` or ``inference_mode`` of a parameter: written in
    place itself, or used after its base was written; ``repr`` shows ``grad_fn=<Invalid>`` and pickling works."""
    import pickle

    messages = []
    for lib in (kiln, torch):
        p = _leaf(lib, [1.0, 2.0, 3.0])
        with getattr(lib, mode)():
            v, w = p[:2], p[1:]
        caught = []
        with pytest.raises(RuntimeError) as info:
            v.mul_(_leaf(lib, [1.0, 1.0]))
        caught.append(str(info.value))
        with lib.no_grad():
            p.add_(1)
        with pytest.raises(RuntimeError) as info:
            _ = w.grad_fn
        caught.append(str(info.value))
        assert repr(w).endswith("grad_fn=<Invalid>)"), lib.__name__
        back = pickle.loads(pickle.dumps(w))
        assert (back.tolist(), back.requires_grad) == ([3.0, 4.0], True), lib.__name__
        messages.append(caught)
    assert messages[0] == messages[1]


def test_a_sparse_tensor_of_such_a_view_needs_a_gradient():
    results = []
    for lib in (kiln, torch):
        y = _leaf(lib, [0.5, -2.0, 1.25, 3.0])
        _, v = _written_base(lib, y)
        s = lib.sparse_coo_tensor(lib.tensor([[0, 2]]), v, (3,), check_invariants=True)
        s.to_dense().sum().backward()
        results.append((s.requires_grad, y.grad))
    assert results[0][0] is results[1][0] is True
    U.assert_close(results[0][1], results[1][1])


def _dirty_function(lib, write: bool):
    class Scale(lib.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            if write:
                a.mul_(2)
            ctx.mark_dirty(a)
            return a

        @staticmethod
        def backward(ctx, g):
            return g * 2

    return Scale


@pytest.mark.parametrize("input_kind", ["a view", "a tensor", "a tensor that needs no gradient"])
@pytest.mark.parametrize("write", [True, False], ids=["written", "only marked"])
def test_a_function_that_marks_its_input_dirty(input_kind, write):
    """``ctx.mark_dirty``: the marked input counts one more write (PyTorch's version), and a marked view
    gives its base a ``CopySlices`` history through the Function's node, so the base's gradient goes
    through the Function (before, the base kept its old history: a wrong gradient)."""
    results = []
    for lib in (kiln, torch):
        y = _leaf(lib, [0.5, -2.0, 1.25, 3.0])
        x = y * 1 if input_kind != "a tensor that needs no gradient" else lib.ones(4, dtype=lib.float64)
        a = x[1:3] if input_kind == "a view" else x
        out = _dirty_function(lib, write).apply(a)
        names = (type(out.grad_fn).__name__, type(x.grad_fn).__name__, out is a, x._version)
        if x.requires_grad:
            (x * lib.arange(4.0, dtype=lib.float64)).sum().backward()
        results.append((names, y.grad))
    assert results[0][0] == results[1][0]
    if results[1][1] is None:
        assert results[0][1] is None
    else:
        U.assert_close(results[0][1], results[1][1])


def _refusing_function(lib, case):
    class Write(lib.autograd.Function):
        @staticmethod
        def forward(ctx, a, w):
            a.mul_(w)
            ctx.mark_dirty(a)
            if case == "not returned":
                return w * 3
            return (a, w * 3) if case == "a view and another output" else a

        @staticmethod
        def backward(ctx, *grads):
            return grads[0], None

    return Write


@pytest.mark.parametrize("case", ["a leaf", "a view of a leaf", "not returned", "a view and another output"])
def test_a_function_may_not_mark_dirty_what_pytorch_refuses(case):
    """PyTorch's errors for a recorded Function that writes a leaf that requires grad (or a view of one),
    does not return what it marked, or returns a marked view with another tensor (whose gradient the base's
    history could not route): kiln took all four and gave wrong gradients or a leaf with a history."""
    messages = []
    for lib in (kiln, torch):
        leaf = _leaf(lib, [1.0, 2.0, 3.0, 4.0])
        a = {"a leaf": leaf, "a view of a leaf": leaf[1:3]}.get(case, (leaf * 1)[1:3])
        if case == "not returned":
            a = leaf * 1
        w = _leaf(lib, [2.0, 3.0]) if a.shape == (2,) else _leaf(lib, [2.0, 3.0, 4.0, 5.0])
        with pytest.raises(RuntimeError) as info:
            _refusing_function(lib, case).apply(a, w)
        messages.append(str(info.value).split("https://")[0])
    assert messages[0] == messages[1]


def test_byte_masks_in_recorded_writes():
    """A write through a uint8 mask records and differentiates as through a bool one (its backward fills with
    a 0-d zero, which the byte mask refuses from users), and a 0-d byte mask fills like a Python bool."""
    results = []
    for lib in (kiln, torch):
        x = _leaf(lib, [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]])
        v = _leaf(lib, [1.0, 2.0, 3.0])
        z = x * 1
        z[lib.tensor([1, 0], dtype=lib.uint8)] = v * 2
        z.sum().backward()
        filled = lib.zeros(2, 3)
        filled[lib.tensor(1, dtype=lib.uint8)] = 7.0
        results.append((x.grad, v.grad, filled))
    for k, t in zip(*results):
        U.assert_close(k, t)


def test_the_answers_do_not_depend_on_what_was_asked_before():
    """``requires_grad`` of a stale view, and pickling it, give the same answers whether or not the view was
    read or used first (a use once marked the view current, and a read of its history refused pickling)."""
    import pickle

    for read_first in (False, True):
        answers = []
        for lib in (kiln, torch):
            b = lib.zeros(4)
            v = b[1:3]
            b.add_(1)
            if read_first:
                _ = v * 2
            b.requires_grad_()
            p = _leaf(lib, [1.0, 2.0, 3.0])
            with lib.no_grad():
                w = p[:2]
                p.add_(1)
            if read_first:
                repr(w)
            answers.append((v.requires_grad, pickle.loads(pickle.dumps(w)).tolist()))
        assert answers[0] == answers[1], read_first
