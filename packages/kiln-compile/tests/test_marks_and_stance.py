"""``kiln._dynamo.mark_dynamic`` / ``maybe_mark_dynamic`` / ``mark_static`` and ``kiln.compiler.set_stance``.

PyTorch is the oracle where it answers on a CPU: its API and error messages, and ``torch.compile`` with a
counting backend (PyTorch's own tracing, no C compiler) for how many times it compiles. kiln's counts are
read from the compiled function: ``trace_count`` (every trace, one eager call each: kiln traces every new
size, having no symbolic shapes) and ``_limited`` (the traces ``recompile_limit`` counts: PyTorch's
recompiles)."""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import warnings

import numpy as np
import pytest

import kiln
import kiln._dynamo
import kiln.compile
import kiln.compiler
import kiln.plugins
from kiln._generated import _modules
from kiln.compile import _stance

HAS_CODEGEN = any(getattr(c, "device_type", None) == "cpu" for c in kiln.plugins.compilers().values())
W8 = kiln.randn(8)  # a tensor read by reference: its sizes are fixed


@pytest.fixture(autouse=True)
def _restore():
    saved = {n: getattr(kiln.compile.config, n) for n in ("cache_size_limit", "automatic_dynamic_shapes")}
    yield
    kiln.compiler.set_stance("default")
    for n, v in saved.items():
        setattr(kiln.compile.config, n, v)


@pytest.fixture
def torch():
    """PyTorch, its compiler reset before and after (skipped where it is not installed)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch._dynamo")
    torch._dynamo.reset()
    yield torch
    torch.compiler.set_stance("default")
    torch._dynamo.reset()


def _counting(torch):
    """A torch.compile backend that counts its compiles (``backend.count``)."""

    def backend(gm, example_inputs):
        backend.count += 1
        return gm.forward

    backend.count = 0
    return backend


def _chain(x, w):
    return (x * w + 1).relu().sum(1)


def _stance_name() -> str:
    return _stance.current().stance


def _error(fn, *args, **kwargs):
    """The exception ``fn`` raises (None if none)."""
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - compared with PyTorch's
        return exc
    return None


# ------------------------------------------------------------------------------------------------ the names


def test_the_names_are_where_pytorch_has_them(torch):
    for name in ("mark_dynamic", "maybe_mark_dynamic", "mark_static", "set_stance"):
        assert hasattr(torch._dynamo, name) and name in kiln._dynamo.__all__
        assert callable(getattr(kiln._dynamo, name)) and getattr(kiln._dynamo, name).__doc__
    for name in ("mark_dynamic", "maybe_mark_dynamic", "mark_static"):  # torch.compiler has none of them
        assert hasattr(torch.compiler, name) == hasattr(kiln.compiler, name) is False
    assert "set_stance" in kiln.compiler.__all__ and kiln.compiler.set_stance is kiln._dynamo.set_stance
    assert kiln.compiler.set_stance.__doc__ and kiln.compile.ConstraintViolationError.__doc__
    for lib, name in [("_dynamo", n) for n in ("mark_dynamic", "maybe_mark_dynamic", "mark_static", "set_stance")] + [
        ("compiler", "set_stance")
    ]:  # PyTorch's signatures
        want = inspect.signature(getattr(getattr(torch, lib), name)).parameters.values()
        got = inspect.signature(getattr(getattr(kiln, lib), name)).parameters.values()
        assert [(p.name, p.kind, p.default) for p in got] == [(p.name, p.kind, p.default) for p in want], name


def test_marks_are_pytorchs_attributes(torch):
    for lib in (torch, kiln):
        x = lib.randn(4, 3, 2)
        lib._dynamo.mark_dynamic(x, [0, (1,)], min=2, max=9)
        lib._dynamo.maybe_mark_dynamic(x, 2)
        y = lib.randn(4, 3)
        assert lib._dynamo.mark_static(y) is None
        got = (
            x._dynamo_dynamic_indices,
            {(r.dim, r.min, r.max) for r in x._dynamo_dynamic_range},
            x._dynamo_weak_dynamic_indices,
            y._dynamo_static_indices,
            x._has_dynamo_dim_marking,
        )
        if lib is torch:
            want = got
        else:
            assert got == want


@pytest.mark.parametrize(
    "call",
    [
        lambda lib: lib._dynamo.mark_dynamic(5, 0),  # not a tensor: AttributeError
        lambda lib: lib._dynamo.mark_dynamic([1.0], 0),
        lambda lib: lib._dynamo.maybe_mark_dynamic(5, 0),
        lambda lib: lib._dynamo.mark_dynamic(lib.ones(2), "0"),  # index: AssertionError
        lambda lib: lib._dynamo.mark_dynamic(lib.ones(2), 0.0),
        lambda lib: lib._dynamo.maybe_mark_dynamic(lib.ones(2), None),
        lambda lib: lib._dynamo.mark_static(lib.ones(2), "0"),
        lambda lib: lib._dynamo.mark_static(int),  # a class that is no module: TypeError
    ],
)
def test_bad_arguments_raise_as_in_pytorch(torch, call):
    want, got = _error(call, torch), _error(call, kiln)
    assert type(got) is type(want) and str(got) == str(want)


def test_mark_static_on_modules(torch):
    for lib in (torch, kiln):
        assert lib._dynamo.mark_static(lib.nn.Linear) is lib.nn.Linear and lib.nn.Linear._dynamo_marked_static
        del lib.nn.Linear._dynamo_marked_static
    net = kiln.nn.Linear(2, 2)  # an instance too (PyTorch 2.13's instance check raises TypeError)
    assert kiln._dynamo.mark_static(net) is net and net._dynamo_marked_static
    assert isinstance(_error(torch._dynamo.mark_static, torch.nn.Linear(2, 2)), TypeError)
    for bad in (5, "x", kiln.nn.Linear(2, 2).weight.grad):
        assert isinstance(_error(kiln._dynamo.mark_static, bad), TypeError)


def test_indices_outside_the_tensor_are_ignored_as_in_pytorch(torch, monkeypatch):
    """PyTorch takes a dim the tensor does not have, or a negative one, and compiles as if unmarked."""
    for lib in (torch, kiln):
        x = lib.randn(4, 3)
        lib._dynamo.mark_dynamic(x, [5, -1])  # no error
    backend = _counting(torch)
    ct = torch.compile(lambda x: x * 2, backend=backend, dynamic=False)
    monkeypatch.setattr(kiln.compile.config, "cache_size_limit", 8)
    ck = kiln.compile(lambda x: x * 2, dynamic=False)
    for c, lib in ((ct, torch), (ck, kiln)):
        x = lib.randn(4, 3)
        lib._dynamo.mark_dynamic(x, [5, -1])
        c(x)
        for n in (5, 6):
            assert c(lib.ones(4, n)).sum().item() == 8.0 * n
    assert backend.count == 3 and ck._limited == 3 and not ck._entries[0].dims


# -------------------------------------------------------------------------------- what a dynamic mark does


def test_a_marked_dim_is_dynamic_from_the_first_trace(torch, monkeypatch):
    """With dynamic=False and a limit of 2: a dim marked dynamic on the first call takes 9 other sizes from
    unmarked tensors with no recompile (PyTorch: one compile; kiln: one counted trace), its kernels read the
    size at run time from the first trace, so no later size compiles a kernel; kiln traces each new size once."""
    monkeypatch.setattr(kiln.compile.config, "cache_size_limit", 2)
    sizes = (4, 5, 6, 7, 9, 11, 13, 16, 20, 5)
    backend = _counting(torch)
    ct = torch.compile(_chain, backend=backend, dynamic=False)
    x = torch.randn(4, 8)
    torch._dynamo.mark_dynamic(x, 0)
    ct(x, torch.randn(8))
    for n in sizes[1:]:
        ct(torch.randn(n, 8), torch.randn(8))
    assert backend.count == 1

    ck = kiln.compile(_chain, dynamic=False)
    x = kiln.randn(4, 8)
    kiln._dynamo.mark_dynamic(x, 0)
    ck(x, W8)
    graph = ck._entries[0].graphs[0]
    assert graph.dynamic and graph.changed[0] == {0} and graph.changed[1] == frozenset()  # the batch dim only
    kernels = len(_modules)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no recompile-limit warning
        for n in sizes[1:]:
            x = kiln.randn(n, 8)
            np.testing.assert_allclose(ck(x, W8).numpy(), _chain(x, W8).numpy(), rtol=1e-5, atol=1e-6)
    assert ck._limited == backend.count == 1
    assert ck.trace_count == len(set(sizes))  # (one eager call per new size: kiln's difference)
    if HAS_CODEGEN:
        assert len(_modules) == kernels


@pytest.mark.skipif(not HAS_CODEGEN, reason="no fused-kernel code generator")
def test_a_size_in_a_backward_formula_is_a_kernel_per_size():
    """As the guide says: later sizes of a marked dim reuse the kernels of a sum's backward, but the backward
    of a mean divides by the element count, a number in its fused kernel, compiled anew per size."""
    w = kiln.randn(6, 3, requires_grad=True)
    made = []
    for reduce in (kiln.sum, kiln.mean):
        c = kiln.compile(lambda x, reduce=reduce: reduce((x @ w).tanh() * 2), dynamic=False)
        x = kiln.randn(8, 6)
        kiln._dynamo.mark_dynamic(x, 0)
        c(x).backward()
        kernels = len(_modules)
        for n in (5, 9):
            x = kiln.randn(n, 6)
            grads = []
            for run in (c, lambda x, reduce=reduce: reduce((x @ w).tanh() * 2)):
                w.grad = None
                run(x).backward()
                grads.append(w.grad.numpy())
            np.testing.assert_allclose(grads[0], grads[1], rtol=1e-5, atol=1e-6)
        made.append(len(_modules) - kernels)
        assert c._limited == 1
    assert made[0] == 0 and made[1] > 0


def test_without_the_mark_every_size_counts():
    """The control of the test above: the same calls unmarked, with dynamic=False, count each size."""
    kiln.compile.config.cache_size_limit = 2
    ck = kiln.compile(_chain, dynamic=False)
    ck(kiln.randn(4, 8), W8)
    ck(kiln.randn(5, 8), W8)
    with pytest.warns(UserWarning, match="cache_size_limit"):
        ck(kiln.randn(6, 8), W8)
    assert ck._limited == 2 and not ck._entries[0].graphs[0].dynamic


def test_min_max_and_sizes_0_and_1_recompile_as_in_pytorch(torch):
    """A size out of the mark's range, or 0 or 1, is a recompile; one in it is not."""
    sizes = (4, 6, 2, 8, 9, 1, 3)
    backend = _counting(torch)
    ct = torch.compile(lambda x: x * 2 + 1, backend=backend, dynamic=False)
    ck = kiln.compile(lambda x: x * 2 + 1, dynamic=False)
    counts = []
    for c, lib in ((ct, torch), (ck, kiln)):
        x = lib.randn(4, 3)
        lib._dynamo.mark_dynamic(x, 0, min=2, max=8)
        c(x)
        for n in sizes[1:]:
            assert c(lib.ones(n, 3)).sum().item() == 9.0 * n
            counts.append(backend.count if lib is torch else ck._limited)
    assert counts[: len(sizes) - 1] == counts[len(sizes) - 1 :] == [1, 1, 1, 2, 3, 3]


def test_a_size_outside_the_range_of_the_marked_call_raises_before_it_runs(torch):
    calls = []

    def f(x):
        calls.append(1)
        return x * 2

    for lib in (torch, kiln):
        x = lib.randn(4, 3)
        lib._dynamo.mark_dynamic(x, 0, min=5, max=9)
        err = _error(lib.compile(f, **({"backend": "eager"} if lib is torch else {})), x)
        assert type(err).__name__ == "ConstraintViolationError" and isinstance(err, RuntimeError)
        assert str(err).startswith("4 not in range [5, 9]") and not calls
        y = lib.randn(4, 3)
        lib._dynamo.mark_dynamic(y, 0, min=9, max=3)
        err = _error(lib.compile(f, **({"backend": "eager"} if lib is torch else {})), y)
        assert isinstance(err, RuntimeError) and "Invalid ranges [9:3]" in str(err) and not calls
    ck = kiln.compile(f)
    _error(ck, x)
    assert ck.trace_count == ck._limited == 0


@pytest.mark.parametrize(
    "case",
    [
        ("broadcast", lambda x, w: x + w, (4, 8), 1, 8),  # the marked dim meets a tensor read by reference
        ("product", lambda x, w: x @ w.reshape(8, 1).expand(8, 2).contiguous(), (4, 8), 1, 8),
        ("two inputs", lambda x, w: x * w, (4, 8), 0, 4),  # an unmarked input's dim is fixed at first
    ],
    ids=lambda c: c[0],
)
def test_a_marked_dim_the_graph_fixes_raises_pytorchs_error(torch, case):
    """PyTorch's ConstraintViolationError, with its sentence naming the dim and the size."""
    _, fn, shape, dim, size = case
    messages = []
    for lib in (torch, kiln):
        x = lib.randn(*shape)
        lib._dynamo.mark_dynamic(x, dim)
        w = lib.randn(*(shape if case[0] == "two inputs" else (8,)))
        opts = {"backend": "eager"} if lib is torch else {}
        err = _error(lib.compile(fn, **opts), x, w if lib is torch or case[0] == "two inputs" else W8)
        assert type(err).__name__ == "ConstraintViolationError", err
        messages.append(str(err).splitlines()[1][: str(err).splitlines()[1].index("If you're")])
    want = f"  - You marked L['x'].size()[{dim}] as dynamic but your code specialized it to be a constant ({size}). "
    assert messages == [want, want]


def test_nested_arguments_are_named_as_pytorch_names_them(torch):
    def f(batch, w):
        return batch["image"] + w

    lines = []
    for lib in (torch, kiln):
        x = lib.randn(4, 3)
        lib._dynamo.mark_dynamic(x, 1)
        err = _error(lib.compile(f, **({"backend": "eager"} if lib is torch else {})), {"image": x}, lib.randn(3))
        lines.append(str(err).splitlines()[0].split("!")[0])
    assert lines == ["Constraints violated (L['batch']['image'].size()[1])"] * 2


def test_a_modules_marked_input_feature_dim_raises():
    net = kiln.compile(kiln.nn.Linear(3, 2))
    x = kiln.randn(4, 3)
    kiln._dynamo.mark_dynamic(x, 1)
    with pytest.raises(kiln.compile.ConstraintViolationError, match=r"L\['input'\]\.size\(\)\[1\].*constant \(3\)"):
        net(x)
    y = kiln.randn(4, 3)  # the batch dim marked: fine, and the next batch sizes do not count
    kiln._dynamo.mark_dynamic(y, 0)
    for n in (4, 6, 9):
        assert net(kiln.ones(n, 3)).shape == (n, 2) if n != 4 else net(y).shape == (4, 2)
    assert net._compiled._limited == 1


def test_maybe_mark_dynamic_lets_the_graph_fix_the_dim(torch):
    backend = _counting(torch)
    for lib in (torch, kiln):
        x = lib.randn(4, 8)
        lib._dynamo.maybe_mark_dynamic(x, 1)
        c = lib.compile(lambda x, w: x + w, **({"backend": backend} if lib is torch else {}))
        assert c(x, lib.ones(8) if lib is torch else W8).shape == (4, 8)  # no error
    assert backend.count == 1
    assert 1 not in c._entries[0].dims.get(0, {})  # kiln: the dim is not dynamic in that trace


def test_a_size_used_in_python_is_not_seen(torch):
    """What kiln cannot detect: ``x.view(4, -1)`` fixes the marked dim in Python; PyTorch raises, kiln's
    trace is exact for its size and runs (documented)."""

    def f(x):
        return x.view(4, -1) * 2

    x = torch.randn(4, 3)
    torch._dynamo.mark_dynamic(x, 0)
    assert type(_error(torch.compile(f, backend="eager"), x)).__name__ == "ConstraintViolationError"
    y = kiln.randn(4, 3)
    kiln._dynamo.mark_dynamic(y, 0)
    assert kiln.allclose(kiln.compile(f)(y), y.view(4, -1) * 2)


def test_a_marked_training_step_matches_eager_and_counts_once():
    """Forward and backward at batch sizes that change: gradients as eager ones, the backward graph also
    compiled for varying sizes from the first trace, one counted trace."""
    kiln.compile.config.cache_size_limit = 1
    w = kiln.randn(6, 3, requires_grad=True)
    f = kiln.compile(lambda x: ((x @ w).tanh() * 2).sum(), dynamic=False)
    for i, n in enumerate((5, 7, 2, 9, 5)):
        x = kiln.randn(n, 6)
        if i == 0:
            kiln._dynamo.mark_dynamic(x, 0)
        w.grad = None
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # (past the limit of 1: a marked dim's sizes still compile)
            loss = f(x)
        if i == 4:  # (a size seen before: compiled; a new size's trace returns the eager result)
            assert type(loss.grad_fn).__name__ == "CompiledFunctionBackward"
        loss.backward()
        got = w.grad.clone()
        w.grad = None
        ((x @ w).tanh() * 2).sum().backward()
        np.testing.assert_allclose(got.numpy(), w.grad.numpy(), rtol=1e-5, atol=1e-5)
    assert f._limited == 1 and f.trace_count == 4
    assert all(g.dynamic for g in f._entries[0].graphs) and len(f._entries[0].graphs) == 2


# ------------------------------------------------------------------------------------------- mark_static


def test_a_static_mark_recompiles_every_size_as_in_pytorch(torch):
    """dynamic=True, each call's tensor marked static: every size compiles (PyTorch) / counts (kiln), and no
    kiln trace is compiled for varying sizes; with a limit of 2, the third size warns."""
    backend = _counting(torch)
    ct = torch.compile(lambda x: x * 2, backend=backend, dynamic=True)
    kiln.compile.config.cache_size_limit = 2
    ck = kiln.compile(lambda x: x * 2, dynamic=True)
    for n in (4, 5, 6):
        for c, lib in ((ct, torch), (ck, kiln)):
            x = lib.ones(n, 3)
            lib._dynamo.mark_static(x, 0)
            if lib is kiln and n == 6:
                with pytest.warns(UserWarning, match="cache_size_limit"):
                    c(x)
            else:
                c(x)
    assert backend.count == 3 and ck._limited == 2 and ck.trace_count == 3
    assert ck._entries[0].dims[0] == {0: "static", 1: "auto"}


def test_static_then_unmarked_and_static_below_dynamic(torch):
    """A static trace, then unmarked sizes: one recompile, then the new trace holds the dim dynamic
    (PyTorch: 2 compiles). A dim marked both ways is dynamic."""
    backend = _counting(torch)
    ct = torch.compile(lambda x: x + 1, backend=backend, dynamic=True)
    ck = kiln.compile(lambda x: x + 1, dynamic=True)
    for c, lib in ((ct, torch), (ck, kiln)):
        x = lib.ones(4, 3)
        lib._dynamo.mark_static(x, 0)
        c(x)
        for n in (5, 6, 7):
            c(lib.ones(n, 3))
    assert backend.count == ck._limited == 2
    both = kiln.compile(lambda x: x + 1, dynamic=False)
    x = kiln.ones(4, 3)
    kiln._dynamo.mark_static(x)
    kiln._dynamo.mark_dynamic(x, 0)
    both(x)
    both(kiln.ones(5, 3))
    assert both._limited == 1 and both._entries[0].dims[0] == {0: (None, None), 1: "static"}


def test_mark_static_inside_the_function_marks_the_trace_not_the_callers_tensor(torch):
    """PyTorch marks its fake tensor: the caller's tensor has no mark after the call; the trace holds the dim
    static all the same, and a call with the same tensor is served."""
    for lib in (torch, kiln):

        def f(x, lib=lib):
            lib._dynamo.mark_static(x, 0)
            return x * 2

        c = lib.compile(f, dynamic=True, **({"backend": "eager"} if lib is torch else {}))
        x, y = lib.ones(4, 3), lib.ones(4, 3)
        lib._dynamo.mark_static(y, 1)
        c(x)
        c(y)
        assert getattr(x, "_dynamo_static_indices", None) is None and not hasattr(x, "_has_dynamo_dim_marking")
        assert y._dynamo_static_indices == {1}  # (the mark it had before, only)
    assert c._entries[0].dims[0][0] == "static" and c.trace_count == 2
    c(x)
    assert c.trace_count == 2


def test_a_newly_marked_tensor_is_not_served_by_an_unmarked_trace(torch):
    """PyTorch guards the marks: a tensor marked after a trace of an unmarked one recompiles, with its dim
    dynamic; a trace of a marked tensor serves an unmarked one, or one marked on a subset of its dims."""
    counts, messages = [], []
    for lib in (torch, kiln):
        backend = _counting(torch) if lib is torch else None
        c = lib.compile(lambda x: (x * 2 + 1).relu().sum(1), dynamic=False, backend=backend or "inductor")
        c(lib.randn(6, 3))
        x = lib.randn(6, 3)
        lib._dynamo.mark_dynamic(x, 0)
        with lib.compiler.set_stance("fail_on_recompile"):
            messages.append(str(_error(c, x)).splitlines()[-1])
        c(x)
        with lib.compiler.set_stance("fail_on_recompile"):
            assert c(lib.randn(9, 3)).shape == (9,)
            assert c(x).shape == (6,) and c(lib.randn(6, 3)).shape == (6,)
            y = lib.randn(6, 3)
            lib._dynamo.mark_dynamic(y, 1)  # (not a subset of the marked trace's {0})
            lines = str(_error(c, y)).splitlines()  # (one line per trace, in cache order; kiln's has a trace per size)
            messages.append([m for m in lines if "dynamo" in m])
        counts.append(backend.count if lib is torch else c._limited)
    assert counts[0] == counts[1] == 2
    assert messages[0] == messages[2] and sorted(messages[1]) == sorted(messages[3])
    assert (
        messages[0] == "    - 0/0: _has_dynamo_dim_marking is present on runtime tensor but was absent at compile time"
    )
    assert messages[1] == [
        "    - 0/1: _dynamo_dynamic_indices not a subset: runtime {1} is not a subset of compiled {0}",
        "    - 0/0: _has_dynamo_dim_marking is present on runtime tensor but was absent at compile time",
    ]


def test_a_static_mark_on_the_first_tensor_leaves_automatic_dynamic_to_the_others(torch):
    """mark_static on the first call's tensor: the next size is a recompile that makes the dim dynamic (the
    mark is that tensor's), so a third size is served under fail_on_recompile, in both."""
    counts = []
    for lib in (torch, kiln):
        backend = _counting(torch) if lib is torch else None
        c = lib.compile(lambda x: (x * 2 + 1).relu().sum(1), backend=backend or "inductor")
        x = lib.randn(16, 3)
        lib._dynamo.mark_static(x, 0)
        c(x)
        c(lib.randn(12, 3))
        with lib.compiler.set_stance("fail_on_recompile"):
            assert c(lib.randn(10, 3)).shape == (10,)
        counts.append(backend.count if lib is torch else c._limited)
    assert counts == [2, 2] and [e.dims for e in c._entries] == [{0: {0: "static"}}, {0: {0: "auto"}}] * 1 + [
        {0: {0: "auto"}}
    ]


def test_a_tensor_made_from_the_inputs_data_is_not_a_fixed_size(torch):
    """A tensor the function makes outside the graph (from its input's NumPy data) may have any size: no
    ConstraintViolationError; a global tensor read by reference still fixes the dim."""
    for lib in (torch, kiln):
        c = lib.compile(
            lambda x, lib=lib: lib.from_numpy(x.numpy() * 2) + x, **({"backend": "eager"} if lib is torch else {})
        )
        x = lib.randn(5, 3)
        lib._dynamo.mark_dynamic(x, 0)
        np.testing.assert_allclose(c(x).numpy(), 3 * x.numpy(), rtol=1e-6)
    x = kiln.randn(3, 8)
    kiln._dynamo.mark_dynamic(x, 1)
    with pytest.raises(kiln.compile.ConstraintViolationError):
        kiln.compile(lambda x: x * W8)(x)


def test_marks_cannot_be_made_inside_a_compiled_function(torch):
    for lib in (torch, kiln):

        def f(x, lib=lib):
            lib._dynamo.mark_dynamic(x, 0)
            return x * 2

        err = _error(lib.compile(f, **({"backend": "eager"} if lib is torch else {})), lib.ones(3))
        assert isinstance(err, AssertionError) and "Attempt to trace forbidden callable" in str(err)


# ------------------------------------------------------------------------------------------------ set_stance


def test_set_stance_as_a_call_a_context_and_a_decorator_as_pytorch(torch):
    """The same steps on both: the stance in force after each."""

    def steps(lib, now):
        seen = []
        lib.compiler.set_stance("force_eager")
        seen.append(now())
        lib.compiler.set_stance("default")
        with lib.compiler.set_stance("eager_on_recompile"):
            seen.append(now())
            with lib.compiler.set_stance("fail_on_recompile"):
                seen.append(now())
            seen.append(now())
        seen.append(now())
        try:
            with lib.compiler.set_stance("force_eager"):
                seen.append(now())
                raise ValueError
        except ValueError:
            seen.append(now())
        decorated = lib.compiler.set_stance("force_eager")(now)
        seen += [now(), decorated(), now()]
        made = lib.compiler.set_stance("fail_on_recompile")
        seen.append(now())
        with made:
            seen.append(now())
        seen.append(now())
        return seen

    want = steps(torch, lambda: torch._dynamo.eval_frame._stance.stance)
    assert steps(kiln, _stance_name) == want
    assert want[-1] == "default" and want[1:4] == ["eager_on_recompile", "fail_on_recompile", "eager_on_recompile"]


def test_bad_stances_raise_as_in_pytorch(torch):
    for stance in ("bogus", 5):
        msgs = []
        for lib in (torch, kiln):
            lib.compiler.set_stance(stance)  # accepted here...
            c = lib.compile(lambda x: x + 1, **({"backend": "eager"} if lib is torch else {}))
            err = _error(c, lib.ones(2))  # ...refused at the next compiled call
            lib.compiler.set_stance("default")
            assert type(err) is RuntimeError
            msgs.append(str(err))
        assert (
            msgs[0]
            == msgs[1]
            == f"invalid torch.compile stance 'DynamoStance(stance={stance!r}, skip_guard_eval_unsafe=False, backend=None)'"
        )
    for call in (
        lambda lib: lib.compiler.set_stance("force_eager", force_backend="eager"),
        lambda lib: lib.compiler.set_stance("force_eager", True),
        lambda lib: lib.compiler.set_stance(stance="force_eager", unknown=1),
    ):
        want, got = _error(call, torch), _error(call, kiln)
        assert type(got) is type(want) and (type(got) is TypeError or str(got) == str(want))
        assert _stance_name() == "default"


def test_decorating_what_is_not_a_function():
    with pytest.raises(TypeError, match="can only decorate a callable"):
        kiln.compiler.set_stance("force_eager")(5)  # (PyTorch: a TypeError when the result is called)
    assert _stance_name() == "default"

    class Box:
        def __init__(self):
            self.stance = _stance_name()

    with pytest.warns(FutureWarning, match="Decorating classes is deprecated"):
        made = kiln.compiler.set_stance("force_eager")(Box)
    assert made().stance == "force_eager" and _stance_name() == "default"

    @kiln.compiler.set_stance("force_eager")
    def gen():
        yield _stance_name()
        yield _stance_name()

    it = gen()
    assert next(it) == "force_eager" and _stance_name() == "default" and list(it) == ["force_eager"]


def test_a_decorated_generator_passes_send_throw_and_close_on(torch):
    """As PyTorch's decorator: what is sent, thrown or closed reaches the generator, with the stance set."""

    def run(lib, now):
        seen = []

        @lib.compiler.set_stance("force_eager")
        def gen():
            try:
                got = yield 1
                seen.append((got, now()))
                yield 2
            except ValueError:
                seen.append(("caught", now()))
                yield "after"
            finally:
                seen.append(("closed", now()))

        it = gen()
        seen += [next(it), it.send("sent"), it.throw(ValueError), now()]
        it.close()
        seen.append(now())
        it = gen()
        next(it)
        seen.append(type(_error(it.throw, KeyError)).__name__)
        return seen

    want = run(torch, lambda: torch._dynamo.eval_frame._stance.stance)
    assert run(kiln, _stance_name) == want
    assert ("caught", "force_eager") in want and ("closed", "force_eager") in want


def test_set_stance_inside_a_compiled_function_raises_pytorchs_error(torch):
    """PyTorch refuses to trace it: ``AssertionError("Attempt to trace forbidden callable <...set_stance...>")``,
    as a call, a context manager and a function it decorates."""
    errors = []
    for lib in (torch, kiln):
        decorated = lib._dynamo.set_stance("force_eager")(lambda x: x + 1)

        def call(x, lib=lib):
            lib._dynamo.set_stance("force_eager")
            return x + 1

        def block(x, lib=lib):
            with lib._dynamo.set_stance("force_eager"):
                return x + 1

        for f in (call, block, lambda x, decorated=decorated: decorated(x)):
            err = _error(lib.compile(f, **({"backend": "eager"} if lib is torch else {})), lib.ones(2))
            assert type(err) is AssertionError, err
            errors.append(str(err).splitlines()[0])
            assert _stance_name() == "default"
    for want, got in zip(errors[:3], errors[3:]):
        assert got.startswith("Attempt to trace forbidden callable ")
        assert want.startswith("Attempt to trace forbidden callable ")
        assert ("set_stance" in got) == ("set_stance" in want)
    # (torch._dynamo.set_stance is a class, as kiln's: both name it so; torch.compiler's is a function)
    assert errors[0] == "Attempt to trace forbidden callable <class 'torch._dynamo.decorators.set_stance'>"
    assert errors[3] == "Attempt to trace forbidden callable <class 'kiln.compile._stance.set_stance'>"


def test_entering_a_stance_made_before_inside_a_compiled_function_raises_pytorchs_error(torch):
    """A ``set_stance`` object made outside, entered inside: PyTorch's ``RuntimeError``, for both libraries."""
    for lib in (torch, kiln):
        st = lib.compiler.set_stance("force_eager")
        lib.compiler.set_stance("default")

        def g(x, st=st):
            with st:
                return x + 1

        err = _error(lib.compile(g, **({"backend": "eager"} if lib is torch else {})), lib.ones(2))
        assert type(err) is RuntimeError and "attempted to set_stance in a torch.compile region" in str(err), err
        assert _stance_name() == "default"


_TICKS = itertools.count()  # advanced by the code of the functions below: an iterator, which no guard reads


def _runs(fn, *args) -> int:
    """How many times the Python code of the functions below ran during ``fn(*args)``."""
    before = next(_TICKS)
    fn(*args)
    return next(_TICKS) - before - 1


def _ticking(x):
    next(_TICKS)  # Python: runs while tracing or eagerly, not in a compiled call
    return x.exp() + 1


def test_force_eager_runs_the_code_and_traces_nothing(torch):
    backend = _counting(torch)
    ct = torch.compile(lambda x: x.exp() + 1, backend=backend)
    ck = kiln.compile(_ticking)
    with torch.compiler.set_stance("force_eager"), kiln.compiler.set_stance("force_eager"):
        ct(torch.ones(3))
        for _ in range(3):
            assert kiln.allclose(ck(kiln.ones(3)), kiln.ones(3).exp() + 1)
            assert _runs(ck, kiln.ones(3)) == 1
    assert backend.count == ck.trace_count == 0
    assert _runs(ck, kiln.ones(3)) == 1 and _runs(ck, kiln.ones(3)) == 0  # traced, then compiled
    assert ck.trace_count == 1
    with kiln.compiler.set_stance("force_eager"):
        assert _runs(ck, kiln.ones(3)) == 1  # a kept trace is not used either


def test_eager_on_recompile(torch):
    """No trace yet: eager (PyTorch: 0 compiles). A kept trace whose guards hold runs; a call needing
    another runs eagerly, traced by neither; another size of a dim marked dynamic is not a recompile."""
    backend = _counting(torch)
    ct = torch.compile(lambda x: x.exp() + 1, backend=backend)
    ck = kiln.compile(_ticking)
    with kiln.compiler.set_stance("eager_on_recompile"), torch.compiler.set_stance("eager_on_recompile"):
        ct(torch.ones(3))
        assert _runs(ck, kiln.ones(3)) == 1
    assert backend.count == ck.trace_count == 0
    x = kiln.ones(4, 2)
    kiln._dynamo.mark_dynamic(x, 0)
    ck(x)
    with kiln.compiler.set_stance("eager_on_recompile"):
        assert _runs(ck, x) == 0  # served
        f64 = kiln.ones(4, 2, dtype=kiln.float64)
        assert _runs(ck, f64) == 1 and ck(f64).dtype == kiln.float64  # another dtype: eager, not traced
        assert ck.trace_count == 1 and len(ck._entries) == 1
        assert _runs(ck, kiln.ones(7, 2)) == 1  # another size of the marked dim: traced, kept
        assert ck.trace_count == 2 and len(ck._entries) == 2 and _runs(ck, kiln.ones(7, 2)) == 0
    assert ck._limited == 1


def test_fail_on_recompile_message_is_pytorchs(torch):
    def f(x):
        return x * 2 + 1

    ct, ck = torch.compile(f, backend="eager"), kiln.compile(f)
    messages = []
    for c, lib in ((ct, torch), (ck, kiln)):
        with lib.compiler.set_stance("fail_on_recompile"):
            messages.append(str(_error(c, lib.ones(4, 3))))  # the first call: a compile too
        c(lib.ones(4, 3))
        with lib.compiler.set_stance("fail_on_recompile"):
            assert c(lib.ones(4, 3)).sum().item() == 36.0  # served
            err = _error(c, lib.ones(5, 3))
        assert type(err) is RuntimeError
        messages.append(str(err))
    assert messages[:2] == messages[2:]
    assert messages[0].startswith("Detected recompile when torch.compile stance is 'fail_on_recompile'. filename: ")
    assert messages[1].endswith("- 0/0: tensor 'x' size mismatch at index 0. expected 4, actual 5")
    assert ck.trace_count == 1


def test_fail_on_recompile_lets_a_dynamic_dim_through(torch):
    """A marked dim, or one whose size already changed (automatic dynamic), takes a new size under
    fail_on_recompile: no error in either."""
    for lib in (torch, kiln):
        c = lib.compile(lambda x: x * 2, **({"backend": "eager"} if lib is torch else {}))
        x = lib.ones(4, 3)
        lib._dynamo.mark_dynamic(x, 0)
        c(x)
        a = lib.compile(lambda x: x + 2, **({"backend": "eager"} if lib is torch else {}))
        a(lib.ones(4, 3))
        a(lib.ones(5, 3))  # (a recompile: the dim is dynamic from here)
        with lib.compiler.set_stance("fail_on_recompile"):
            assert c(lib.ones(9, 3)).shape == (9, 3) and a(lib.ones(7, 3)).shape == (7, 3)
            err = _error(c, lib.ones(9, 5))  # the unmarked dim: a recompile
            assert type(err) is RuntimeError and "size mismatch at index 1. expected 3, actual 5" in str(err)
    assert c.trace_count == 2 and a.trace_count == 3


def test_fail_on_recompile_learns_of_a_branch_on_a_size_after_the_call(torch):
    """A Python branch on a marked size: PyTorch guards on it and refuses before running; kiln traces the new
    size, sees another program, and refuses after the call ran (documented)."""

    def f(x):
        next(_TICKS)  # (kiln only: PyTorch guards on an iterator's state)
        return x.exp() if x.shape[0] > 3 else x.sin()

    for lib in (torch, kiln):
        fn = f if lib is kiln else lambda x: x.exp() if x.shape[0] > 3 else x.sin()
        c = lib.compile(fn, **({"backend": "eager"} if lib is torch else {}))
        x = lib.ones(4, 3)
        lib._dynamo.mark_dynamic(x, 0)
        c(x)
        with lib.compiler.set_stance("fail_on_recompile"):
            c(lib.ones(6, 3))
            err = _error(c, lib.ones(2, 3))
        assert type(err) is RuntimeError and "Detected recompile" in str(err)
    assert "took another path" in str(err) and c.trace_count == 3 and len(c._entries) == 2
    before = next(_TICKS)
    with kiln.compiler.set_stance("fail_on_recompile"):
        _error(c, kiln.ones(2, 3))
    assert next(_TICKS) - before == 2  # kiln ran the call


def test_eager_then_compile(torch):
    """The first call eager, the second compiled with the dims that differ dynamic, the third no recompile."""
    backend = _counting(torch)
    ct = torch.compile(lambda x: x * 2 + 1, backend=backend)
    kiln.compile.config.automatic_dynamic_shapes = False  # (so only the stance makes the dim dynamic)
    ck = kiln.compile(lambda x: x * 2 + 1)
    counts = []
    for c, lib in ((ct, torch), (ck, kiln)):
        with lib.compiler.set_stance("eager_then_compile"):
            for n in (5, 6, 7):
                assert c(lib.ones(n, 3)).sum().item() == 9.0 * n
                counts.append(backend.count if lib is torch else ck._limited)
    assert counts == [0, 1, 1] * 2
    assert ck.trace_count == 2 and ck._entries[0].dims == {0: {0: "auto"}}
    assert ck._entries[0].graphs[0].dynamic


def test_force_backend_compiles_with_it_and_keys_the_cache():
    seen = []

    def mine(graph, example_inputs):
        seen.append(graph)
        return graph

    c = kiln.compile(lambda x: x * 3)
    c(kiln.ones(2))
    with kiln.compiler.set_stance(force_backend=mine):
        for _ in range(3):
            assert c(kiln.ones(2)).tolist() == [3.0, 3.0]
    assert len(seen) == 1 and c.trace_count == 2 and {e.backend for e in c._entries} == {mine, c._backend}
    c(kiln.ones(2))
    assert len(seen) == 1 and c.trace_count == 2  # the default backend's trace serves again
    with pytest.raises(ValueError, match="unknown backend"), kiln.compiler.set_stance(force_backend="nope"):
        c(kiln.ones(2))


SCALE = 2.0


def test_skip_guard_eval_unsafe_keeps_the_tensor_guards_and_raises_pytorchs_error(torch):
    """A call with another shape, dtype or requires_grad, or the first call, is a recompile under the stance:
    PyTorch's RuntimeError, in both, where kiln once ran the stale trace (reading past the tensor's end)."""
    messages = []
    for lib in (torch, kiln):
        c = lib.compile(lambda x: (x * 2 + 1).relu().sum(0), **({"backend": "eager"} if lib is torch else {}))
        with lib.compiler.set_stance(skip_guard_eval_unsafe=True):
            messages.append(str(_error(c, lib.ones(4, 3))))  # no trace yet
        c(lib.ones(4096, 3))
        with lib.compiler.set_stance(skip_guard_eval_unsafe=True):
            assert c(lib.ones(4096, 3)).tolist() == [4096.0 * 3] * 3  # served
            for x in (lib.ones(2, 3), lib.ones(4096, 3, dtype=lib.float64), lib.ones(4096, 3, requires_grad=True)):
                err = _error(c, x)
                assert type(err) is RuntimeError
                messages.append(str(err))
            with lib.no_grad():
                assert type(_error(c, lib.ones(4096, 3).t())) is RuntimeError  # (other strides)
        g = lib.compile(lambda x, y: x * 2 if y is None else x + y, **({"backend": "eager"} if lib is torch else {}))
        h = lib.compile(lambda xs: xs[0] + xs[-1], **({"backend": "eager"} if lib is torch else {}))
        g(lib.ones(3), None)
        h([lib.ones(3), lib.ones(3)])
        with lib.compiler.set_stance(skip_guard_eval_unsafe=True):
            assert g(lib.ones(3), lib.ones(3)).tolist() == [2.0] * 3  # (unsafe: the None guard is skipped)
            messages.append(str(_error(h, [lib.ones(3)] * 3)))  # (a list's length is kept)
    assert len(set(messages)) == 1 and messages[0] == _stance.UNSAFE_RECOMPILE
    assert messages[0].startswith("Recompilation triggered with skip_guard_eval_unsafe stance.")
    assert c.trace_count == 1


WEIGHT = kiln.ones(3)


def test_skip_guard_eval_unsafe_never_runs_a_trace_on_another_objects_tensors():
    """The trace reads a module's parameters and a global tensor by reference: another module passed, or the
    global rebound, would run it on the old tensors. kiln keeps every identity guard under the stance and
    raises PyTorch's recompile error there (PyTorch rereads them and runs the call: a documented difference)."""
    global WEIGHT
    m1, m2 = kiln.nn.Linear(3, 2), kiln.nn.Linear(3, 2)
    f = kiln.compile(lambda m, x: m(x))
    x = kiln.ones(1, 3)
    f(m1, x)
    g = kiln.compile(lambda x: x * WEIGHT)
    g(x)
    old = WEIGHT
    try:
        WEIGHT = kiln.full((3,), 5.0)
        with kiln.compiler.set_stance(skip_guard_eval_unsafe=True):
            assert str(_error(f, m2, x)) == _stance.UNSAFE_RECOMPILE
            assert str(_error(g, x)) == _stance.UNSAFE_RECOMPILE
            assert kiln.equal(f(m1, x), m1(x))  # the traced module's call is still served
        assert g(x).tolist() == [[5.0] * 3]  # and without the stance, traced anew
    finally:
        WEIGHT = old


SCALE = 2.0


def test_skip_guard_eval_unsafe_skips_the_other_guards_but_those_that_failed():
    """One trace: a global it read is not tested (unsafe, as in PyTorch). Two traces told apart by that
    global: its guard failed on a traced call, so it is tested."""
    global SCALE

    def f(x):
        return x * SCALE

    c = kiln.compile(f)
    c(kiln.ones(2))
    try:
        SCALE = 3.0
        with kiln.compiler.set_stance(skip_guard_eval_unsafe=True):
            assert c(kiln.ones(2)).tolist() == [2.0, 2.0]  # unsafe: the one trace runs, SCALE unchecked
        assert c(kiln.ones(2)).tolist() == [3.0, 3.0]  # safe again: the guard fails, traced anew
        with kiln.compiler.set_stance(skip_guard_eval_unsafe=True):
            assert c(kiln.ones(2)).tolist() == [3.0, 3.0]
            SCALE = 2.0
            assert c(kiln.ones(2)).tolist() == [2.0, 2.0]
            SCALE = 5.0
            with pytest.raises(RuntimeError, match="Recompilation triggered with skip_guard_eval_unsafe"):
                c(kiln.ones(2))
    finally:
        SCALE = 2.0
    assert c.trace_count == 2
    d = kiln.compile(lambda x: x + 1, dynamic=False)
    d(kiln.ones(2))
    d(kiln.ones(3))
    with kiln.compiler.set_stance(skip_guard_eval_unsafe=True):
        assert d(kiln.ones(2)).shape == (2,) and d(kiln.ones(3)).shape == (3,)
        with pytest.raises(RuntimeError, match="Recompilation triggered"):
            d(kiln.ones(4))
    assert d.trace_count == 2


def test_skip_guard_eval_unsafe_lets_a_dynamic_dim_through(torch):
    """Another size of a dim the trace holds dynamic is no recompile (PyTorch serves it; kiln traces it)."""
    for lib in (torch, kiln):
        c = lib.compile(lambda x: x * 2, **({"backend": "eager"} if lib is torch else {}))
        x = lib.ones(4, 3)
        lib._dynamo.mark_dynamic(x, 0)
        c(x)
        with lib.compiler.set_stance(skip_guard_eval_unsafe=True):
            assert c(lib.ones(9, 3)).shape == (9, 3)
            assert type(_error(c, lib.ones(9, 5))) is RuntimeError
    assert c.trace_count == 2


def test_clone_and_a_decorator_leave_out_skip_guard_eval_unsafe(torch):
    def run(lib, now):
        made = lib.compiler.set_stance("eager_on_recompile", skip_guard_eval_unsafe=True)
        with made.clone():
            inside = now()
        lib.compiler.set_stance("default")
        decorated = lib.compiler.set_stance("eager_on_recompile", skip_guard_eval_unsafe=True)(now)
        return [inside, decorated(), now()]

    want = run(torch, lambda: dataclasses.astuple(torch._dynamo.eval_frame._stance)[:2])
    assert run(kiln, lambda: dataclasses.astuple(_stance.current())[:2]) == want
    assert want[0] == want[1] == ("eager_on_recompile", False)


def test_the_default_stance_calls_no_stance_code(monkeypatch):
    """A served call runs the loop of __call__ alone; a miss (another shape) tests no guard one by one."""
    c = kiln.compile(lambda x: x + 1)
    c(kiln.ones(2))
    c(kiln.ones(3))
    monkeypatch.setattr(_stance, "serve", None)  # (calling it would raise)
    failures = []
    monkeypatch.setattr(_stance, "first_failure", lambda *a, **k: failures.append(a) or None)
    assert c(kiln.ones(2)).tolist() == [2.0, 2.0] and c(kiln.ones(3)).shape == (3,)
    c(kiln.ones(4))
    assert c.trace_count == 3 and not failures


def test_a_constraint_violation_counts_no_trace_before_or_after_the_call():
    w = kiln.randn(4)
    c = kiln.compile(lambda x: x * w)
    x = kiln.randn(3, 4)
    kiln._dynamo.mark_dynamic(x, 1)
    with pytest.raises(kiln.compile.ConstraintViolationError):  # after the call ran
        c(x)
    y = kiln.randn(3, 4)
    kiln._dynamo.mark_dynamic(y, 0, min=5)
    with pytest.raises(kiln.compile.ConstraintViolationError):  # before
        c(y)
    assert c.trace_count == 0 and c._limited == 0 and not c._entries
