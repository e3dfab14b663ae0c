"""kiln.compile on device ``cuda``: fused groups run as one kiln-cuda kernel each (kiln_cuda.fusion) and give
the eager results: broadcast and strided inputs, reductions, mixed float32/float64 math, stores into the
compiled function's inputs (and what overlaps them), CPU numbers, and a whole training step."""

import math

import numpy as np
import pytest

import kiln

pytest.importorskip("kiln_compile")  # the nox cell installs kiln-compile beside kiln-cuda
import kiln.compile
from kiln_cuda import codegen, fusion


@pytest.fixture
def launches(monkeypatch):
    """The generator name of every kernel launched while the test runs."""
    names = []
    launch = codegen.launch

    def spy(kernel, grid, block, stream, args):
        names.append(codegen._made_by[id(kernel)][0])
        return launch(kernel, grid, block, stream, args)

    monkeypatch.setattr(codegen, "launch", spy)
    return names


def _cuda(a):
    return kiln.from_numpy(np.ascontiguousarray(a)).cuda()


def _replayed(f, *args, launches, fused=True):
    """``kiln.compile(f)``'s result from its second call (the first traces, running ``f`` eagerly), checking
    that the replay ran a fused kernel (``fused``)."""
    compiled = kiln.compile(f)
    compiled(*args)
    launches.clear()
    got = compiled(*args)
    assert ("fused_kernel" in launches) == fused, launches
    return got


def _close(got, want, rtol=1e-6, atol=1e-6):
    np.testing.assert_allclose(got.cpu().numpy(), want.cpu().numpy(), rtol=rtol, atol=atol)


def test_a_chain_with_a_broadcast_bias_and_a_sum_is_one_kernel_and_what_follows_another(launches):
    rng = np.random.default_rng(0)
    x, b = _cuda(rng.standard_normal((4, 6)).astype(np.float32)), _cuda(rng.standard_normal(6).astype(np.float32))

    def f(x, b):
        y = x * kiln.sigmoid(x) + b
        return y.sum(), kiln.tanh(y) * 0.5

    compiled = kiln.compile(f)
    compiled(x, b)  # traces
    launches.clear()
    got = compiled(x, b)
    assert launches == ["fused_kernel", "partial_sum_kernel", "fused_kernel"]
    want = f(x, b)
    _close(got[0], want[0], rtol=1e-5)
    _close(got[1], want[1])
    assert got[0].device.type == "cuda" and got[0].shape == () and got[1].dtype is kiln.float32


def test_strided_and_offset_inputs_are_read_in_place(launches):
    rng = np.random.default_rng(1)
    base = _cuda(rng.standard_normal((7, 5)).astype(np.float32))
    x = base.t()[1:, 2:]  # transposed, with a storage offset
    y = _cuda(rng.standard_normal((4, 1)).astype(np.float32))

    def f(x, y):
        return kiln.exp(x - y) / (1 + x * x)

    _close(_replayed(f, x, y, launches=launches), f(x, y), rtol=1e-6)


@pytest.mark.parametrize("kind", ["sum", "mean"])
@pytest.mark.parametrize("keepdim", [False, True])
def test_reductions_keepdim_and_empty(kind, keepdim, launches):
    rng = np.random.default_rng(2)
    for shape in ((3, 9), (0, 4)):
        x = _cuda(rng.standard_normal(shape).astype(np.float32))

        def f(x):
            return getattr(kiln.abs(x) * 2 + 1, kind)(dim=(0, 1), keepdim=keepdim)

        got, want = _replayed(f, x, launches=launches, fused=shape[0] != 0), f(x)  # nothing to launch: empty
        assert got.shape == want.shape
        _close(got, want, rtol=1e-6)
        if shape[0] == 0:
            assert (got.item() == 0.0) if kind == "sum" else math.isnan(got.item())


def test_float64_and_mixed_groups_call_each_function_at_its_own_precision(launches):
    rng = np.random.default_rng(3)
    x = _cuda(rng.uniform(0.1, 2.0, 8).astype(np.float32))
    d = _cuda(rng.uniform(0.1, 2.0, 8))

    def f(x, d):
        return kiln.log(kiln.erf(x) + 1) * kiln.exp(d), kiln.sqrt(d) + kiln.log1p(d)

    got, want = _replayed(f, x, d, launches=launches), f(x, d)
    assert got[0].dtype is kiln.float64
    _close(got[0], want[0], rtol=1e-6)
    _close(got[1], want[1], rtol=1e-12)
    lines = [("t0", "erf(x0)"), ("t1", "(t0 + float32(1.0))"), ("t2", "log(t1) * exp(x1)"), ("t3", "sigmoid(x1 > x1)")]
    typed = fusion._typed_lines(lines, {"x0": "float32", "x1": "float64"})
    assert [e for _, e in typed] == [
        "erf_f32(x0)",
        "t0 + float32(1.0)",
        "log_f32(t1) * exp_f64(x1)",
        "sigmoid_f32(float32(x1 > x1))",
    ]


def test_math_of_a_boolean_input_is_float32(launches):
    """``exp`` of a bool tensor is float32 eagerly; the simulator's NumPy would compute it in float16."""
    m = _cuda(np.array([True, False, True, False]))
    x = _cuda(np.array([1.0, 2.0, 3.0, -1.0], np.float32))

    def f(m, x):
        return kiln.exp(m) * x + 1

    _close(_replayed(f, m, x, launches=launches), f(m, x), rtol=1e-6)


def test_infinite_bounds_nan_and_boolean_outputs(launches):
    x = _cuda(np.array([-np.inf, -2.0, -0.0, 0.25, 3.0, np.nan], np.float32))

    def f(x):
        y = kiln.clamp(x * 2, min=-math.inf, max=0.5)
        return kiln.relu(y) - y, (y > 0) | (y < -1)

    got, want = _replayed(f, x, launches=launches), f(x)
    np.testing.assert_array_equal(got[0].cpu().numpy(), want[0].cpu().numpy())
    np.testing.assert_array_equal(got[1].cpu().numpy(), want[1].cpu().numpy())


def test_an_update_is_stored_into_the_input_it_reads(launches):
    rng = np.random.default_rng(4)
    p0, g = rng.standard_normal(10).astype(np.float32), rng.standard_normal(10).astype(np.float32)
    p, grad = _cuda(p0), _cuda(g)

    def step(p, g):
        p.mul_(0.9).add_(g, alpha=-0.1)

    compiled = kiln.compile(step)
    compiled(p, grad)
    launches.clear()
    version = p._version
    compiled(p, grad)
    assert launches == ["fused_kernel"]  # no copy: the kernel stored into p
    assert p._version > version
    want = (p0 * np.float32(0.9) - np.float32(0.1) * g) * np.float32(0.9) - np.float32(0.1) * g
    np.testing.assert_allclose(p.cpu().numpy(), want, rtol=1e-6)


def test_the_kernel_stores_aside_when_an_input_overlaps_its_target_in_another_layout():
    """Called directly with ``out=`` (kiln-compile's planner never asks for this store: the runtime check
    is the kernel's own): a transposed view of the target is read whole before anything is stored."""
    from types import SimpleNamespace

    group = SimpleNamespace(
        shape=(4, 4),
        inputs=[((4, 4), "float32"), ((4, 4), "float32")],
        lines=[("t0", "(x0 * float32(2.0))"), ("t1", "(t0 + x1)")],
        outputs=[("t1", "float32")],
        reduction=None,
        keepdim=False,
    )
    kernel = fusion.codegen_fused(group)
    a0 = np.arange(16, dtype=np.float32).reshape(4, 4)
    a = _cuda(a0)
    (got,) = kernel(a, a.t(), out=[a])
    assert got is a
    np.testing.assert_array_equal(a.cpu().numpy(), a0 * 2 + a0.T)
    b = _cuda(a0)
    (same,) = kernel(b, b, out=[b])  # the target read as itself, at the same elements: stored in place
    np.testing.assert_array_equal(same.cpu().numpy(), a0 * 3)


def test_an_input_overlapping_the_target_in_another_layout_is_read_before_the_store(launches):
    """Compiled: the write of a value that reads a transposed view of its target (the planner copies it in
    after the kernel rather than storing into the target while the kernel reads it)."""
    a0 = np.arange(16, dtype=np.float32).reshape(4, 4)
    a = _cuda(a0)

    def f(a, at):
        a.copy_(a * 2 + at)

    compiled = kiln.compile(f)
    compiled(a, a.t())  # traces: eagerly
    launches.clear()
    compiled(a, a.t())  # the fused kernel stores aside, then copies
    assert "fused_kernel" in launches
    once = a0 * 2 + a0.T
    np.testing.assert_array_equal(a.cpu().numpy(), once * 2 + once.T)


def test_a_cpu_number_is_passed_to_the_kernel(launches):
    x = _cuda(np.linspace(-1, 1, 6).astype(np.float32))
    s = kiln.tensor(3.0)  # a 0-d CPU tensor, as an optimizer's step count

    def f(x, s):
        return kiln.tanh(x * s) + s

    _close(_replayed(f, x, s, launches=launches), f(x, s))


def test_a_whole_training_step_matches_eager(launches):
    rng = np.random.default_rng(5)
    data = [(rng.standard_normal((6, 5)).astype(np.float32), rng.integers(0, 3, 6)) for _ in range(3)]

    def run(compiled: bool):
        kiln.manual_seed(0)
        model = kiln.nn.Sequential(kiln.nn.Linear(5, 8), kiln.nn.GELU(), kiln.nn.Linear(8, 3)).cuda()
        opt = kiln.optim.Adam(model.parameters(), lr=1e-2)

        def step(x, y):
            opt.zero_grad()
            loss = kiln.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss.detach()

        fn = kiln.compile(step) if compiled else step
        losses = [fn(_cuda(x), kiln.from_numpy(y).cuda()).item() for x, y in data]
        return losses, [p.detach().cpu().numpy() for p in model.parameters()]

    eager_losses, eager_params = run(False)
    assert "fused_kernel" not in launches
    losses, params = run(True)
    # the third call runs the program (the first two trace: Adam makes its state on its first step): each
    # parameter's Adam update is one kernel, and GELU's backward another
    assert launches.count("fused_kernel") >= 5
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-5)
    for got, want in zip(params, eager_params):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
