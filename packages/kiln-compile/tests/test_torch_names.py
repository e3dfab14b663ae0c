"""``kiln.compiler`` and ``kiln._dynamo``: torch.compiler's and torch._dynamo's names, as training scripts use
them (the settings under their PyTorch names, reset, disable with a reason, the exceptions, errors suppressed)."""

from __future__ import annotations

import collections
import subprocess
import sys
import warnings
from unittest import mock

import numpy as np
import pytest

import kiln
import kiln.compile

torch = pytest.importorskip("torch")
pytest.importorskip("torch._dynamo")

SETTINGS = [
    ("recompile_limit", "cache_size_limit", 3),
    ("accumulated_recompile_limit", "accumulated_cache_size_limit", 9),
]


@pytest.fixture
def restore_config():
    saved = {
        n: getattr(kiln.compile.config, n)
        for n in ("cache_size_limit", "accumulated_cache_size_limit", "suppress_errors", "disabled")
    }
    yield
    for n, v in saved.items():
        setattr(kiln.compile.config, n, v)


def test_the_modules_are_reachable_as_torchs_are():
    import kiln.compiler

    fresh = subprocess.run(  # `kiln._dynamo` with no import of it, as torch._dynamo
        [sys.executable, "-c", "import kiln; print(kiln._dynamo.config.recompile_limit)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert fresh.returncode == 0 and fresh.stdout.strip() == "8", fresh.stderr
    assert kiln.compiler.compile is kiln.compile.compile and kiln.compiler.reset is kiln.compile.reset
    for name in kiln.compiler.__all__:
        assert hasattr(torch.compiler, name), name  # every name is PyTorch's
    for name in kiln._dynamo.__all__:
        assert hasattr(torch._dynamo, name), name


@pytest.mark.parametrize("torch_name, kiln_name, value", SETTINGS)
def test_config_takes_pytorchs_names(torch_name, kiln_name, value, restore_config):
    assert getattr(torch._dynamo.config, torch_name) == getattr(kiln._dynamo.config, torch_name)  # same defaults
    setattr(kiln._dynamo.config, torch_name, value)
    assert getattr(kiln.compile.config, kiln_name) == value == getattr(kiln._dynamo.config, kiln_name)
    assert torch_name in dir(kiln._dynamo.config)


def test_config_refuses_options_it_does_not_have(restore_config):
    for lib in (torch, kiln):
        with pytest.raises(AttributeError, match="does not exist"):
            lib._dynamo.config.no_such_option = 1
    kiln._dynamo.config.disable = True  # torch._dynamo.config.disable: compiled functions run their code
    f = kiln.compile(lambda x: x + 1)
    f(kiln.ones(2))
    assert kiln.compile.config.disabled and f.trace_count == 0


def test_recompile_limit_bounds_the_traces(restore_config):
    kiln._dynamo.config.recompile_limit = 2
    f = kiln.compile(lambda x, k: x + k, dynamic=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the limit's warning
        for k in range(5):
            assert f(kiln.ones(2), k).tolist() == [1.0 + k] * 2
    assert f.trace_count <= 3  # two kept traces, then eager (one probe past the limit at most)


def test_disable_with_a_reason_runs_the_caller_eagerly():
    seen = collections.deque()

    @kiln.compiler.disable(reason="calls a C extension")
    def helper(x):
        return x.exp()

    def f(x):
        seen.append(kiln.compiler.is_compiling() and kiln.compiler.is_dynamo_compiling())
        return helper(x) + 1

    cf = kiln.compile(f)
    x = kiln.ones(2)
    np.testing.assert_allclose(cf(x).numpy(), np.exp(1.0) + 1, rtol=1e-6)
    cf(x)
    assert list(seen) == [True, False]  # traced once, then eager: f calls a disabled function
    explained = kiln._dynamo.explain(f)(x)
    assert "calls a C extension" in str(explained)


def test_allow_in_graph_returns_the_function_and_refuses_what_is_not_callable():
    def g(x):
        return x * 2

    assert kiln.compiler.allow_in_graph(g) is g
    f = kiln.compile(lambda x: kiln.compiler.allow_in_graph(g)(x) + 1)
    assert f(kiln.ones(3)).tolist() == [3.0] * 3 and f(kiln.ones(3)).tolist() == [3.0] * 3
    assert f.trace_count == 1
    assert kiln.compiler.allow_in_graph([g, abs]) == [g, abs]  # a list of functions, as in PyTorch
    for lib in (torch, kiln):
        with pytest.raises(AssertionError, match="allow_in_graph expects a callable"):
            lib.compiler.allow_in_graph(3)


@pytest.mark.parametrize(
    "reset", [lambda: kiln._dynamo.reset(), lambda: kiln.compiler.reset()], ids=["_dynamo", "compiler"]
)
def test_reset_forgets_the_traces(reset):
    seen = collections.deque()

    def f(x):
        seen.append(kiln.compiler.is_compiling())
        return x - 1

    cf = kiln.compile(f)
    cf(kiln.ones(2))
    cf(kiln.ones(2))
    reset()
    cf(kiln.ones(2))
    assert list(seen) == [True, True]  # traced, run compiled (f's Python not run), traced again after reset


def test_a_graph_break_under_fullgraph_is_unsupported():
    def f(x):
        if x.sum() > 0:  # a value read into Python: a graph break
            return x + 1
        return x - 1

    with pytest.raises(kiln._dynamo.exc.Unsupported):
        kiln.compile(f, fullgraph=True)(kiln.ones(2))
    assert issubclass(kiln._dynamo.exc.Unsupported, RuntimeError)  # as torch._dynamo.exc.Unsupported


def _failing_backend(graph, example_inputs):
    raise ValueError("no code for this graph")


def test_a_failing_backend_raises_unless_errors_are_suppressed(restore_config):
    f = kiln.compile(lambda x: x * 3 + 1, backend=_failing_backend)
    with pytest.raises(kiln._dynamo.exc.BackendCompilerFailed, match="no code for this graph"):
        f(kiln.ones(2))
    kiln._dynamo.config.suppress_errors = True
    g = kiln.compile(lambda x: x * 3 + 1, backend=_failing_backend)
    with pytest.warns(UserWarning, match="no code for this graph.*runs eagerly"):
        assert g(kiln.ones(2)).tolist() == [4.0, 4.0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # later calls run the kept eager entry: no new trace, no new warning
        assert g(kiln.full((2,), 2.0)).tolist() == [7.0, 7.0]
    assert g.trace_count == 1


def test_config_imports_and_patches_as_pytorchs(restore_config):
    import kiln._dynamo.config
    from kiln._dynamo.config import recompile_limit

    assert kiln._dynamo.config is kiln.compile.config and recompile_limit == kiln.compile.config.cache_size_limit
    with mock.patch.object(kiln._dynamo.config, "suppress_errors", True):  # restored after, as in PyTorch
        assert kiln.compile.config.suppress_errors is True
    assert kiln.compile.config.suppress_errors is False
    with kiln._dynamo.config.patch(recompile_limit=3, suppress_errors=True):
        assert kiln.compile.config.cache_size_limit == 3 and kiln.compile.config.suppress_errors
    assert kiln.compile.config.cache_size_limit == 8 and not kiln.compile.config.suppress_errors

    @kiln._dynamo.config.patch("automatic_dynamic_shapes", False)
    def read():
        return kiln.compile.config.automatic_dynamic_shapes

    assert read() is False and kiln.compile.config.automatic_dynamic_shapes is True
    with pytest.raises(AttributeError, match="does not exist"):
        kiln._dynamo.config.patch({"no_such_option": 1})


def test_suppressed_errors_keep_gradients_when_only_the_backward_fails(restore_config):
    compiled = []

    def backward_fails(graph, example_inputs):  # the forward graph compiles, the backward graph does not
        compiled.append(graph)
        if len(compiled) % 2 == 0:
            raise ValueError("no code for the backward graph")
        return graph

    kiln._dynamo.config.suppress_errors = True
    lin = kiln.nn.Linear(3, 1)
    step = kiln.compile(lin, backend=backward_fails)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            lin.zero_grad()
            step(kiln.ones(2, 3)).sum().backward()
            assert lin.weight.grad.tolist() == [[2.0, 2.0, 2.0]]  # every call: eager, with its gradients


def test_fullgraph_raises_a_backend_failure_even_with_errors_suppressed(restore_config):
    kiln._dynamo.config.suppress_errors = True
    f = kiln.compile(lambda x: x * 2, backend=_failing_backend, fullgraph=True)
    with pytest.raises(kiln._dynamo.exc.BackendCompilerFailed):
        f(kiln.ones(2))


def test_disable_keeps_a_module_a_module():
    model = kiln.nn.Sequential(kiln.nn.Linear(2, 2), kiln.nn.ReLU())
    model[0] = kiln.compiler.disable(model[0], reason="stays eager")  # PyTorch's idiom: a module in, a module out
    assert isinstance(model[0], kiln.nn.Module) and len(list(model.parameters())) == 2
    x = kiln.ones(1, 2)
    want = model(x).tolist()
    compiled = kiln.compile(model)
    assert compiled(x).tolist() == want and compiled(x).tolist() == want
    assert "stays eager" in str(kiln.compile.explain(model, x))
    for lib in (torch, kiln):
        with pytest.raises(AssertionError, match="fn must be callable"):
            lib.compiler.disable(3)
