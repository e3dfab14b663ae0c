"""Fusion: each op kiln-compile writes as an expression, fused into one kernel, gives the eager result — NaN,
infinities, broadcasting, strided views, empty and 0-d tensors, both float dtypes — and a sum or mean (over
every dim or some) fuses after a chain. Needs a code generator for ``cpu`` (kiln-cpu's); without one nothing fuses, which
is checked too."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import kiln
import kiln.compile
import kiln.plugins
from kiln.compile._fusion import EXPRESSIONS

HAS_CODEGEN = any(getattr(c, "device_type", None) == "cpu" for c in kiln.plugins.compilers().values())

SPECIAL = [0.0, -0.0, 1.5, -2.25, 3.0, math.inf, -math.inf, math.nan, 1e-30, 40.0]


def _special(dtype):
    return kiln.tensor(SPECIAL, dtype=dtype)


def _op_calls(program) -> list[str]:
    """The ops a generated program runs through their own kernels (``v2 = _k(c5, ...)``), by name."""
    found = re.findall(r"_k\((c\d+),", program.source)
    return [program.__globals__[c].name for c in found]


def _fused_calls(program_source: str) -> int:
    """The calls of fused kernels in a generated program: the lines that unpack a kernel's outputs
    (``v5, = c4(v0, v1)``; ops are ``_k(...)`` calls, made tensors ``v = c()``)."""
    return sum(1 for line in program_source.splitlines() if ", = c" in line)


# each case: a chain of at least two ops around the one under test, on inputs with specials
CASES = {
    "add": lambda x, y: (x + y * 2).add(y, alpha=0.5),
    "sub": lambda x, y: (x - y).sub(y, alpha=3),
    "mul": lambda x, y: (x * y) * 1.5,
    "div": lambda x, y: (x / y) / 4.0,
    "neg": lambda x, y: -(x + y),
    "abs": lambda x, y: (x - y).abs() + 1,
    "square": lambda x, y: kiln.square(x) + y,
    "reciprocal": lambda x, y: kiln.reciprocal(x) * y,
    "rsqrt": lambda x, y: kiln.rsqrt(x.abs()) + y,
    "sigmoid": lambda x, y: kiln.sigmoid(x) * y,
    "silu": lambda x, y: kiln.nn.functional.silu(x) + y,
    "relu": lambda x, y: kiln.relu(x) - y,
    "_threshold_backward": None,  # fused in backward graphs: test_backward_graph_fuses
    "leaky_relu": lambda x, y: kiln.nn.functional.leaky_relu(x, 0.2) + y,
    "gelu": lambda x, y: kiln.nn.functional.gelu(x) + kiln.nn.functional.gelu(y, approximate="tanh"),
    "pow": lambda x, y: x.pow(2) + x.pow(3) + x.abs().pow(0.5) + x.pow(-1) + x.abs().pow(1.7) + y.pow(1),
    "maximum": lambda x, y: kiln.maximum(x, y) + kiln.minimum(y, x),
    "minimum": lambda x, y: kiln.minimum(x, y) * 2,
    "clamp": lambda x, y: x.clamp(-1.0, 2.0) + y.clamp(min=0.0) + y.clamp(max=1.0),
    "where": lambda x, y: kiln.where(x > y, x, y) + 1,
    "addcmul": lambda x, y: kiln.addcmul(x * 2, x, y, value=0.5) + kiln.addcmul(y, x, x),
    "addcdiv": lambda x, y: kiln.addcdiv(x + 1, y, x, value=-3.0) + kiln.addcdiv(y, x, y),
    **{
        name: (lambda n: lambda x, y: kiln.where(getattr(kiln, n)(x * 2, y), x, y) * (getattr(kiln, n)(x, 1.5) + 0))(
            name
        )
        for name in ("gt", "lt", "ge", "le", "eq", "ne")
    },
    "clone": lambda x, y: (x + y).clone() * 2,
    **{
        name: (lambda n: lambda x, y: getattr(kiln, n)(x) + y)(name)
        for name in ("exp", "log", "sqrt", "tanh", "sin", "cos", "expm1", "log1p", "erf", "erfc")
    },
}


def test_every_expression_has_a_case():
    assert set(CASES) == set(EXPRESSIONS)


@pytest.mark.skipif(not HAS_CODEGEN, reason="no code generator for cpu (kiln-cpu)")
@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("name", sorted(n for n, c in CASES.items() if c is not None))
def test_fused_op_matches_eager(name, dtype):
    fn = CASES[name]
    x = _special(dtype)
    y = kiln.linspace(-3, 3, len(SPECIAL), dtype=dtype)
    cf = kiln.compile(fn)
    cf(x, y)
    got = cf(x, y)
    want = fn(x, y)
    rtol = 2e-6 if dtype is kiln.float32 else 1e-12
    assert kiln.allclose(got, want, rtol=rtol, atol=rtol, equal_nan=True), (name, got, want)
    assert got.dtype is want.dtype
    assert _fused_calls(cf._entries[0].forward.source) >= 1, cf._entries[0].forward.source


@pytest.mark.skipif(not HAS_CODEGEN, reason="no code generator for cpu (kiln-cpu)")
@pytest.mark.parametrize(
    "make",
    [
        lambda: (kiln.randn(6, 5), kiln.randn(5)),  # broadcast bias
        lambda: (kiln.randn(5, 6).t(), kiln.randn(6, 1)),  # strided view, broadcast column
        lambda: (kiln.randn(3, 1, 4), kiln.randn(2, 1)),  # both broadcast
        lambda: (kiln.randn(()), kiln.randn(())),  # 0-d
        lambda: (kiln.randn(0, 4), kiln.randn(4)),  # empty
    ],
    ids=["bias", "strided", "both", "scalar", "empty"],
)
def test_layouts_and_reductions(make):
    x, b = make()

    def f(x, b):
        y = x * kiln.sigmoid(x) + b
        return y, y.sum(), (y * 2).mean(), (y - 1).sum(dim=tuple(range(y.dim())), keepdim=True)

    cf = kiln.compile(f)
    cf(x, b)
    got = cf(x, b)
    want = f(x, b)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert kiln.allclose(g, w, rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.skipif(not HAS_CODEGEN, reason="no code generator for cpu (kiln-cpu)")
def test_chain_becomes_one_kernel_and_intermediates_stay_internal():
    def new_gelu(x):
        return 0.5 * x * (1.0 + kiln.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * kiln.pow(x, 3.0))))

    cf = kiln.compile(new_gelu)
    x = kiln.randn(64, 32)
    cf(x)
    src = cf._entries[0].forward.source
    assert "_k(" not in src and _fused_calls(src) == 1, src
    assert kiln.allclose(cf(x), kiln.nn.functional.gelu(x, approximate="tanh"), atol=1e-6)


@pytest.mark.skipif(not HAS_CODEGEN, reason="no code generator for cpu (kiln-cpu)")
def test_ops_after_a_reduced_chain_start_the_next_group():
    """A group ends with its sum; the pointwise ops that read its values (or the sum) fuse into the next."""

    def f(x, b):
        y = x * kiln.sigmoid(x) + b
        s = y.sum()
        return s, kiln.tanh(y) * 0.5 - s

    cf = kiln.compile(f)
    x, b = kiln.randn(8, 16), kiln.randn(16)
    cf(x, b)  # traces, running f eagerly
    got = cf(x, b)
    src = cf._entries[0].forward.source
    assert "_k(" not in src and _fused_calls(src) == 2, src
    want = f(x, b)
    assert all(kiln.allclose(g, w, atol=1e-5) for g, w in zip(got, want))


@pytest.mark.skipif(not HAS_CODEGEN, reason="no code generator for cpu (kiln-cpu)")
def test_two_reductions_of_one_group():
    """A loss of two means over one chain: the group takes the first, the second runs as its own op."""

    def loss(p, t):
        d = p - t
        sq, ab = d * d, d.abs()  # both in the group before either mean
        return sq.mean() + 0.5 * ab.mean(), (d * 2).sum()

    cf = kiln.compile(loss)
    p, t = kiln.randn(6, 5), kiln.randn(6, 5)
    for _ in range(2):
        got = cf(p, t)
    want = loss(p, t)
    # (d * 2).sum() may cancel to near 0, where float32 sums in two orders differ by more than rtol alone
    assert all(kiln.allclose(g, w, rtol=1e-6, atol=1e-5) for g, w in zip(got, want))


@pytest.mark.skipif(not HAS_CODEGEN, reason="no code generator for cpu (kiln-cpu)")
def test_a_value_read_in_between_is_stored_and_writes_split_groups():
    def f(x, buf):
        a = x * 2 + 1
        m = a.matmul(a.t())  # not pointwise: reads a, so a is stored before it runs
        buf.mul_(0.5)  # a write: no group spans it
        return (m + 1) * 3, a.exp() + buf

    cf = kiln.compile(f)
    x, buf = kiln.randn(4, 4), kiln.ones(4)
    buf2 = buf.clone()
    cf(x, buf)
    got = cf(x, buf)
    f(x, buf2)
    want = f(x, buf2)
    assert all(kiln.allclose(g, w, atol=1e-5) for g, w in zip(got, want))
    assert kiln.equal(buf, buf2)


@pytest.mark.skipif(not HAS_CODEGEN, reason="no code generator for cpu (kiln-cpu)")
def test_backward_graph_fuses():
    def f(x, w):
        return (kiln.relu(x @ w) * kiln.sigmoid(x @ w)).sum()

    cf = kiln.compile(f)
    x = kiln.randn(8, 4, requires_grad=True)
    w = kiln.randn(4, 4, requires_grad=True)
    cf(x, w)
    out = cf(x, w)
    out.backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    f(x, w).backward()
    assert kiln.allclose(gx, x.grad, atol=1e-5) and kiln.allclose(gw, w.grad, atol=1e-5)
    entry = cf._entries[-1]
    assert "_threshold_backward" in [n.op.name for n in entry.graphs[1].nodes if n.kind == "op"]
    assert _fused_calls(entry.backward.source) >= 1, entry.backward.source


@pytest.mark.skipif(not HAS_CODEGEN, reason="no code generator for cpu (kiln-cpu)")
@pytest.mark.parametrize(
    ("shape", "other", "dims", "keepdim", "kind"),
    [
        ((128, 24), (128, 24), 0, False, "sum"),  # a linear layer's bias gradient: the row of kept elements
        ((6, 4, 5, 7), (4, 1, 1), (0, 2, 3), False, "sum"),  # a conv bias's: merged to (6, 4, 35)
        ((6, 4, 5, 7), (6, 4, 5, 7), (1, 3), True, "mean"),  # kept and reduced dims alternate
        ((3, 1, 5), (1, 1, 5), (-1,), True, "sum"),  # a size-1 dim, a negative dim
        ((5, 6), (6,), (1,), False, "mean"),
        ((0, 4, 3), (4, 1), (0, 2), False, "mean"),  # empty: NaN means, as eager's
        ((0, 4, 3), (4, 1), (0,), True, "sum"),  # empty: zero sums
    ],
)
def test_a_sum_over_some_dims_ends_the_group(shape, other, dims, keepdim, kind):
    """A sum or mean over some dims of a chain's value fuses as its group's reduction, and the value read
    elsewhere is stored by the same kernel; results match eager's, in both float dtypes."""
    for dtype in (kiln.float32, kiln.float64):

        def f(x, y):
            t = kiln.relu(x * y + 1)
            return t, getattr(t, kind)(dims, keepdim=keepdim)

        cf = kiln.compile(f)
        x, y = kiln.randn(shape, dtype=dtype), kiln.randn(other, dtype=dtype)
        cf(x, y)
        got = cf(x, y)
        src = cf._entries[-1].forward.source
        assert "_k(" not in src and _fused_calls(src) == 1, src
        for g, w in zip(got, f(x, y)):
            assert g.shape == w.shape and g.dtype == w.dtype
            assert kiln.allclose(g, w, rtol=1e-5, atol=1e-5, equal_nan=True)
    xt = kiln.randn(shape[::-1]).permute(*reversed(range(len(shape))))  # strided inputs: the nested loop
    assert all(kiln.allclose(g, w, rtol=1e-5, atol=1e-5, equal_nan=True) for g, w in zip(cf(xt, y), f(xt, y)))


@pytest.mark.skipif(not HAS_CODEGEN, reason="no code generator for cpu (kiln-cpu)")
def test_a_bias_gradient_sum_moves_up_to_its_group():
    """The backward of a linear layer after a ReLU reads the gated gradient twice: a matmul (for the weight)
    between it and the bias's sum would close its group; the sum moves up and fuses, the matmul still
    reads the stored value."""
    lin = kiln.nn.Linear(6, 5)

    def f(x):
        return kiln.relu(lin(x)).square().sum()

    cf = kiln.compile(f)
    x = kiln.randn(8, 6)
    cf(x)
    cf(x).backward()
    gw, gb = lin.weight.grad.clone(), lin.bias.grad.clone()
    lin.zero_grad()
    f(x).backward()
    assert kiln.allclose(gw, lin.weight.grad, atol=1e-5) and kiln.allclose(gb, lin.bias.grad, atol=1e-5)
    entry = cf._entries[-1]
    sums = [n for n in entry.graphs[1].nodes if n.kind == "op" and n.op.name == "sum"]
    assert sums, entry.graphs[1]
    assert " sum" not in entry.backward.source and "c" in entry.backward.source
    assert _fused_calls(entry.backward.source) >= 1, entry.backward.source


@pytest.mark.skipif(not HAS_CODEGEN, reason="no code generator for cpu (kiln-cpu)")
def test_a_sum_moves_up_only_past_nodes_that_write_nothing_it_reads():
    from kiln.compile._fusion import hoist_reductions

    codegens = {"cpu": next(c for c in kiln.plugins.compilers().values() if getattr(c, "device_type", 0) == "cpu")}

    def f(x, buf):
        t = x * 2
        u = t.t().matmul(x)  # a reader in between: the sum may move past it
        s1 = t.sum(0)
        t2 = buf * 3
        buf.add_(1)
        s2 = buf.sum(0)  # the sum of an input (written in place): nothing to move up to
        w = buf * 1
        buf.mul_(2)
        s3 = w.sum(0)  # may move up past the write: it reads w, not buf
        e = buf.view(-1) * 1
        ev = e.view(4, 3)
        ev.add_(1)  # a write into e's buffer: the sum of e must stay after it
        s4 = e.sum(0)
        return u, s1, t2, s2, s3, s4

    seen = []

    def capture(graph, example_inputs):
        seen.append(graph)
        return graph

    x, buf = kiln.randn(4, 3), kiln.randn(4, 3)
    kiln.compile(f, backend=capture)(x, buf)
    graph = seen[0]
    hoisted = hoist_reductions(graph, codegens)
    names = [n.op.name if n.kind == "op" else n.kind for n in hoisted.nodes]
    assert names.index("sum") == names.index("mul") + 1, names  # the first sum right after x * 2
    before = [n for n in graph.nodes]
    assert sorted(map(id, before)) == sorted(map(id, hoisted.nodes))  # the same nodes, reordered
    # every node after the values it reads (a write's output is its destination, made before it)
    made: dict[int, int] = {}
    for i, n in enumerate(hoisted.nodes):
        assert all(made.get(v.index, -1) < i for v in n.values_read()), hoisted
        for v in n.outputs:
            made.setdefault(v.index, i)
    sums = [i for i, n in enumerate(hoisted.nodes) if n.kind == "op" and n.op.name == "sum"]
    writes = [i for i, n in enumerate(hoisted.nodes) if n.writes is not None]
    assert sums[-1] > writes[-1], hoisted  # the sum of e after the write into its buffer
    assert len([i for i in sums if i < writes[0]]) == 1, hoisted  # only s1 before the first write
    assert hoist_reductions(hoisted, codegens).nodes == hoisted.nodes  # nothing left to move
    assert all(kiln.allclose(g, w) for g, w in zip(hoisted(x.clone(), buf.clone()), graph(x.clone(), buf.clone())))


@pytest.mark.skipif(not HAS_CODEGEN, reason="no code generator for cpu (kiln-cpu)")
def test_a_sum_never_moves_past_an_op_that_writes_any_of_its_arguments():
    """``_amp_non_finite_check_and_unscale_`` writes its second argument (found_inf), not only its first: a
    sum of found_inf stays after it."""
    unscale = kiln.backend.op("_amp_non_finite_check_and_unscale_")

    def f(g, x, inv):
        found = x * 0.0
        unscale(g, found, inv)
        return found.sum()

    g, x, inv = kiln.tensor([1.0, math.inf, 2.0]), kiln.ones(1), kiln.ones(1)
    cf = kiln.compile(f)
    cf(g.clone(), x, inv)
    assert cf(g.clone(), x, inv).item() == 1.0 == f(g.clone(), x, inv).item()


@pytest.mark.skipif(not HAS_CODEGEN, reason="no code generator for cpu (kiln-cpu)")
@pytest.mark.parametrize(
    "case",
    ["reached anyway", "a dtype= sum", "stored into a tensor"],
)
def test_a_sum_stays_where_moving_it_would_fuse_less(case):
    """The hoist moves a reduction only where it helps: not when the group reaches it anyway, not when it
    cannot fuse (it would only close the group early), not above the write of its value into a tensor (the
    group stores there instead)."""

    def f(a, b):
        t = a * b
        if case == "reached anyway":
            return kiln.sigmoid(t) + 1, t.sum(0)
        if case == "a dtype= sum":  # the transpose closes the group of mul and sigmoid; the sum cannot end it
            u = kiln.sigmoid(t)
            return u.t(), t.sum(0, dtype=kiln.float64)
        b.mul_(0.9).add_(a)
        return b.sum()

    cf = kiln.compile(f)
    a, b = kiln.randn(4, 3), kiln.randn(4, 3)
    b2 = b.clone()
    cf(a, b)
    got = cf(a, b)
    f(a, b2)
    want = f(a, b2)
    assert all(
        kiln.allclose(g, w, atol=1e-5)
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,))
    )
    assert kiln.allclose(b, b2)
    src = cf._entries[-1].forward.source
    if case == "reached anyway":
        assert "_k(" not in src and _fused_calls(src) == 1, src
    elif case == "stored into a tensor":
        assert "out=[" in src and "_write(" not in src, src
    else:  # the mul fuses with the sigmoid, not alone before a sum that cannot end its group
        ops = _op_calls(cf._entries[-1].forward)
        assert "sum" in ops and "mul" not in ops and _fused_calls(src) == 1, src


@pytest.mark.skipif(not HAS_CODEGEN, reason="no code generator for cpu (kiln-cpu)")
def test_a_keepdim_given_as_an_int_keeps_eager_shapes():
    def f(x):
        t = kiln.relu(x) * 2
        return t.sum(0, 1), t.mean((0, 1), 1)

    cf = kiln.compile(f)
    x = kiln.randn(3, 4)
    cf(x)
    for g, w in zip(cf(x), f(x)):
        assert g.shape == w.shape and kiln.allclose(g, w, rtol=1e-6)


@pytest.mark.skipif(not HAS_CODEGEN, reason="no code generator for cpu (kiln-cpu)")
def test_partial_reductions_reach_only_a_code_generator_that_takes_them(monkeypatch):
    """A device code generator written before ``FusedGroup.dims`` never receives a group with it: the sum
    over some dims runs as its op's own kernel."""
    from kiln.compile import _backends

    (real,) = [c for c in kiln.plugins.compilers().values() if getattr(c, "device_type", None) == "cpu"]
    groups = []

    def old_codegen(group):  # no partial_reductions attribute
        groups.append(group)
        return real(group)

    old_codegen.device_type = "cpu"
    monkeypatch.setattr(_backends.kiln.plugins, "compilers", lambda: {"old": old_codegen})

    def f(x):
        t = kiln.exp(x) + 1
        return t.sum(0), (t * 2).sum()

    cf = kiln.compile(f)
    x = kiln.randn(3, 4)
    cf(x)
    got = cf(x)
    assert groups and all(g.dims is None for g in groups)
    assert "_k(" in cf._entries[0].forward.source  # the sum over dim 0
    assert all(kiln.allclose(g, w, rtol=1e-6) for g, w in zip(got, f(x)))


def test_nothing_fuses_without_a_code_generator(monkeypatch):
    from kiln.compile import _backends

    monkeypatch.setattr(_backends.kiln.plugins, "compilers", lambda: {})
    cf = kiln.compile(lambda x: kiln.sigmoid(x) * 2 + 1)
    x = kiln.randn(3)
    cf(x)
    assert kiln.allclose(cf(x), kiln.sigmoid(x) * 2 + 1)
    assert _fused_calls(cf._entries[0].forward.source) == 0


@pytest.mark.skipif(not HAS_CODEGEN, reason="no code generator for cpu (kiln-cpu)")
def test_pointwise_ops_without_an_expression_fuse_through_their_decomposition():
    import kiln.nn.functional as F

    def f(x):
        return F.softplus(x) * F.hardswish(x) + F.mish(x)

    cf = kiln.compile(f)
    x = kiln.randn(64) * 4
    cf(x)
    assert kiln.allclose(cf(x), f(x), rtol=1e-5, atol=1e-6)
    src = cf._entries[0].forward.source
    assert "_k(" not in src and _fused_calls(src) == 1, src


@pytest.mark.skipif(not HAS_CODEGEN, reason="no code generator for cpu (kiln-cpu)")
def test_infinite_and_nan_numbers_in_fused_chains():
    def f(x):
        return x.clamp(min=-math.inf, max=1.0).exp() + kiln.where(x > 0, x, math.nan)

    cf = kiln.compile(f)
    x = kiln.randn(16)
    cf(x)
    assert kiln.allclose(cf(x), f(x), equal_nan=True)


@pytest.mark.skipif(not HAS_CODEGEN, reason="no code generator for cpu (kiln-cpu)")
def test_fused_results_match_eager_at_the_edges():
    """Found by review: a NaN tensor bound made clamp return the input (eager, as PyTorch: NaN); the fused
    sigmoid gave denormals where PyTorch's float32 exp overflows to a sigmoid of 0; a 0-d float64 operand
    was multiplied in float64 and rounded (eager converts it to float32 first)."""
    n = 1 << 12
    x = kiln.linspace(-120.0, 120.0, n)
    lo = kiln.full((n,), math.nan)
    hi = kiln.where(kiln.arange(n) % 2 == 0, 1.0, math.nan)

    def clamp_nan(x):
        return (x * 2.0).clamp(lo, hi) + (x * 2.0).clamp(max=hi) * 1.0

    def sigmoid_underflow(x):
        return (x * 1.0).sigmoid() * 2.0

    scale = kiln.tensor(0.1, dtype=kiln.float64)

    def float64_scalar(x):  # PyTorch converts the 0-d float64 operand to float32 first, then multiplies
        return (x * scale) * 1.0

    for f in (clamp_nan, sigmoid_underflow, float64_scalar):
        cf = kiln.compile(f)
        cf(x)
        got, want = cf(x), f(x)
        assert _fused_calls(cf._entries[0].forward.source) == 1
        np.testing.assert_array_equal(got.isnan().numpy(), want.isnan().numpy())
        np.testing.assert_array_equal((got == 0).numpy(), (want == 0).numpy())
        if f is float64_scalar:
            assert kiln.equal(got, want)
        assert kiln.allclose(got, want, rtol=1e-6, atol=0, equal_nan=True), f.__name__


def _sgd_step(params, lr=0.1):
    """An SGD step written as PyTorch's optimizers write it: one in-place update per parameter."""
    with kiln.no_grad():
        for p in params:
            p.add_(p.grad, alpha=-lr)


@pytest.mark.skipif(not HAS_CODEGEN, reason="no code generator for cpu (kiln-cpu)")
def test_the_updates_of_every_parameter_are_one_kernel_call():
    """Horizontal fusion: independent groups one after another, each reading tensors of its own shape (an
    optimizer's update of each parameter), run as one call of the code generator's ``horizontal`` kernel."""
    model = kiln.nn.Sequential(kiln.nn.Linear(6, 5), kiln.nn.ReLU(), kiln.nn.Linear(5, 3))
    twin = kiln.nn.Sequential(kiln.nn.Linear(6, 5), kiln.nn.ReLU(), kiln.nn.Linear(5, 3))
    twin.load_state_dict(model.state_dict())
    x = kiln.randn(4, 6)

    def step(m):
        for p in m.parameters():
            p.grad = None
        m(x).square().sum().backward()
        _sgd_step(list(m.parameters()))

    compiled = kiln.compile(lambda: step(model))
    for _ in range(3):
        compiled()
        step(twin)
        for p, q in zip(model.parameters(), twin.parameters()):
            assert kiln.allclose(p, q, rtol=1e-6, atol=1e-7)
    src = compiled._entries[0].forward.source
    (update,) = [line for line in src.splitlines() if "out=[" in line]
    assert update.count("_written(") == 4, src


@pytest.mark.skipif(not HAS_CODEGEN, reason="no code generator for cpu (kiln-cpu)")
def test_groups_that_share_a_tensor_or_have_a_node_between_stay_apart():
    def shared(p, g1, g2):  # two updates of one tensor, the second through a view made before the first
        row = p[0]
        p.sub_(g1 * 0.5)
        row.sub_(g2 * 0.25)
        return p * 1

    def between(a, b, ga, gb):  # an op that is not fused runs between the two updates (it reads the first)
        a.sub_(ga * 0.5)
        m = a @ gb
        b.sub_(gb * 0.5)
        return m

    for fn, shapes in ((shared, [(3, 4), (3, 4), (4,)]), (between, [(4, 4)] * 4)):
        tensors = [kiln.randn(*s) for s in shapes]
        compiled = kiln.compile(fn)
        compiled(*[t.clone() for t in tensors])
        mine, eager = [t.clone() for t in tensors], [t.clone() for t in tensors]
        got, want = compiled(*mine), fn(*eager)
        assert kiln.allclose(got, want, rtol=1e-6)
        assert all(kiln.allclose(a, b, rtol=1e-6) for a, b in zip(mine, eager))
        src = compiled._entries[0].forward.source
        assert sum("out=[" in line for line in src.splitlines()) == 2, src


@pytest.mark.skipif(not HAS_CODEGEN, reason="no code generator for cpu (kiln-cpu)")
def test_a_code_generator_without_horizontal_makes_one_call_per_group(monkeypatch):
    from kiln.compile import _backends

    (real,) = [c for c in kiln.plugins.compilers().values() if getattr(c, "device_type", None) == "cpu"]

    def plain(group):
        return real(group)

    plain.device_type = "cpu"
    monkeypatch.setattr(_backends.kiln.plugins, "compilers", lambda: {"plain": plain})
    params = [kiln.randn(3, 2), kiln.randn(2), kiln.randn(5)]
    for p in params:
        p.grad = kiln.randn(*p.shape)
    want = [p - 0.1 * p.grad for p in params]
    compiled = kiln.compile(lambda: _sgd_step(params))
    compiled()
    assert all(kiln.allclose(p, w) for p, w in zip(params, want))
    src = compiled._entries[0].forward.source
    assert sum("out=[" in line for line in src.splitlines()) == 3, src


def test_a_group_never_stores_into_a_tensor_it_makes():
    """Two backward passes into a leaf whose .grad was cleared: the first gradient becomes .grad, the second is
    added into it in place; the group that makes the first cannot also store the sum into it (its kernel
    would be handed the tensor before it exists)."""
    w = kiln.randn(3, requires_grad=True)

    def step(x):
        w.grad = None
        for _ in range(2):
            (x * w).sum().backward()
        return w.grad

    compiled = kiln.compile(step)
    x = kiln.randn(3)
    for _ in range(3):
        got = compiled(x).clone()
        assert kiln.allclose(got, step(x)) and kiln.allclose(got, 2 * x)
