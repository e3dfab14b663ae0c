"""Writes in compiled programs: the ``fold_writes`` pass turns writes that only move a value into dataflow
(into a temporary the graph made; into an input that a later write overwrites), and a fused kernel stores
straight into the tensor its result is written to. Each case compares with eager code, and the cases that
must keep their copy (a view that sees the write, an input read through another layout, a value read
elsewhere) check that they do. The version counter counts a direct store as it counts ``copy_``."""

from __future__ import annotations

import pytest

import kiln
import kiln.compile
import kiln.plugins
from kiln.compile._graph import Graph
from kiln.compile._passes import fold_writes
from kiln.compile._runtime import trace_call

HAS_CODEGEN = any(getattr(c, "device_type", None) == "cpu" for c in kiln.plugins.compilers().values())


def _graph(fn, *args) -> Graph:
    entry, _ = trace_call(fn, args, {}, fullgraph=False)
    (graph,) = entry.graphs
    return graph


def _copies(graph: Graph) -> int:
    return sum(1 for n in graph.nodes if n.kind == "op" and n.op.name == "_copy_from")


def _program(cf) -> str:
    (entry,) = cf._entries
    return entry.forward.source


def _same(fn, make):
    """``fn`` compiled and eager on fresh copies of ``make()``: equal results (or both None) and equal inputs
    after, on the call that traces and on one that replays the program."""
    cf = kiln.compile(fn)
    for _ in range(2):
        eager_args, compiled_args = make(), make()
        want, got = fn(*eager_args), cf(*compiled_args)
        assert (got is None) == (want is None)
        for a, b in zip((got, *compiled_args), (want, *eager_args)):
            if a is not None:
                assert kiln.allclose(a, b, rtol=1e-6, atol=1e-7, equal_nan=True), (a, b)
    return cf


def test_a_write_into_a_temporary_becomes_dataflow():
    def f(x):
        return (x.sqrt() / 2).add_(1e-3) * x

    x = kiln.rand(8) + 0.5
    assert _copies(_graph(f, x)) == 1 and _copies(fold_writes(_graph(f, x))) == 0
    _same(f, lambda: (kiln.arange(8.0) + 0.5,))


def test_chained_writes_into_a_temporary_read_the_last_value():
    """``ones_like(x).masked_fill_(a, 2).masked_fill_(b, 3)``: each later read sees the last write (the
    renaming follows the chain, as Rprop's factor needs)."""

    def f(x):
        t = kiln.ones_like(x).masked_fill_(x > 0, 2.0).masked_fill_(x > 1, 3.0)
        return t * x

    x = kiln.linspace(-2, 2, 9)
    assert _copies(fold_writes(_graph(f, x))) == 0
    _same(f, lambda: (kiln.linspace(-2, 2, 9),))


def test_an_input_written_twice_keeps_one_write():
    def f(v, g):
        v.mul_(0.9).addcmul_(g, g, value=0.1)
        return v.sum()

    v, g = kiln.rand(16), kiln.randn(16)
    assert _copies(_graph(f, v, g)) == 2 and _copies(fold_writes(_graph(f, v, g))) == 1
    _same(f, lambda: (kiln.linspace(0, 1, 16), kiln.linspace(-1, 2, 16)))


def test_a_view_of_a_temporary_sees_its_write():
    def f(x):
        t = x * 2
        row = t[0]
        t.add_(1)
        return row * 1

    x = kiln.randn(3, 4)
    assert _copies(fold_writes(_graph(f, x))) == 1
    _same(f, lambda: (kiln.arange(12.0).reshape(3, 4),))


def test_a_value_read_elsewhere_is_not_moved():
    def f(x):
        a = x * 2
        t = x.clone()
        t.copy_(a)
        t.add_(1)
        return t, a

    x = kiln.randn(5)
    folded = fold_writes(_graph(f, x))
    assert _copies(folded) == 1  # the add_ into t folds; copy_(a) stays, since the return reads a
    cf = _same(lambda x: f(x)[0], lambda: (kiln.arange(5.0),))
    assert cf is not None
    t, a = kiln.compile(f)(kiln.arange(5.0))
    assert kiln.equal(a, kiln.arange(5.0) * 2) and kiln.equal(t, a + 1)


def test_a_write_between_which_a_guard_runs_stays():
    def f(v, g):
        v.mul_(2)
        if v.sum() > 0:  # a value read into Python: a guard between the writes
            v.add_(g)
        else:
            v.sub_(g)
        return v * 1

    v, g = kiln.rand(4), kiln.rand(4)
    graph = _graph(f, v, g)
    assert _copies(fold_writes(graph)) == _copies(graph)


@pytest.mark.skipif(not HAS_CODEGEN, reason="no code generator for cpu (kiln-cpu)")
def test_a_fused_update_stores_into_its_input_and_counts_the_write():
    def f(p, g):
        p.add_(g * 0.1 + p * 0.5)

    cf = _same(f, lambda: (kiln.linspace(-1, 1, 64).reshape(8, 8), kiln.linspace(2, 3, 64).reshape(8, 8)))
    source = _program(cf)
    assert "_written(" in source and "_write(" not in source, source
    p, g = kiln.ones(8, 8), kiln.ones(8, 8)
    before = p._version
    cf(p, g)
    assert p._version == before + 1 and kiln.allclose(p, kiln.full((8, 8), 1.6))


@pytest.mark.skipif(not HAS_CODEGEN, reason="no code generator for cpu (kiln-cpu)")
def test_a_store_into_a_tensor_saved_for_backward_is_caught():
    w = kiln.ones(4, requires_grad=True)
    buf = w.detach().clone()
    y = (w * buf).sum()  # buf is saved for w's gradient

    def f(b):
        b.copy_(b * 2 + 1)

    cf = kiln.compile(f)
    cf(buf.clone())  # trace on another tensor
    cf(buf)
    assert "_written(" in _program(cf)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


@pytest.mark.skipif(not HAS_CODEGEN, reason="no code generator for cpu (kiln-cpu)")
def test_an_input_read_through_a_view_keeps_its_copy():
    def f(p):
        p.copy_(p.t() * 2 + p)

    cf = _same(f, lambda: (kiln.arange(16.0).reshape(4, 4),))
    assert "_written(" not in _program(cf)


@pytest.mark.skipif(not HAS_CODEGEN, reason="no code generator for cpu (kiln-cpu)")
def test_two_inputs_sharing_memory_keep_their_copy():
    """``a`` and ``b = a.t()`` arrive as two inputs: the trace sees that they share memory (and guards it), so
    the kernel does not store into ``a`` while reading ``b``."""

    def f(a, b):
        a.copy_(b * 2 + a)

    def make():
        a = kiln.arange(16.0).reshape(4, 4)
        return a, a.t()

    eager = make()
    f(*eager)
    cf = kiln.compile(f)
    cf(*make())
    got = make()
    cf(*got)
    assert "_written(" not in _program(cf)
    assert kiln.equal(got[0], eager[0])


@pytest.mark.skipif(not HAS_CODEGEN, reason="no code generator for cpu (kiln-cpu)")
def test_an_update_of_three_buffers_is_one_kernel_storing_into_each():
    """Adam's shape: two moments updated in place, then read by the parameter's update. The reads after each
    write read the written value (``fold_writes``), so one kernel computes all three and stores each into
    its tensor: no copy is left."""

    def f(p, g, m, v):
        m.lerp_(g, 0.1)
        v.mul_(0.999).addcmul_(g, g, value=0.001)
        p.sub_(m / (v.sqrt() + 1e-8) * 0.01)

    def make():
        return (
            kiln.linspace(-1, 1, 64).reshape(8, 8),
            kiln.linspace(3, -2, 64).reshape(8, 8),
            kiln.linspace(0, 0.5, 64).reshape(8, 8),
            kiln.linspace(0.1, 0.2, 64).reshape(8, 8),
        )

    cf = _same(f, make)
    source = _program(cf)
    assert "_write(" not in source and source.count("_written(") == 3, source
    assert source.count(", = c") == 1, source


@pytest.mark.skipif(not HAS_CODEGEN, reason="no code generator for cpu (kiln-cpu)")
def test_a_returned_value_is_not_stored_into_an_input():
    """A value the call returns must be a new tensor: written into an input too, it is copied there."""

    def f(p, g):
        new = p * 0.5 + g
        p.copy_(new)
        return new

    cf = _same(f, lambda: (kiln.linspace(-1, 1, 16), kiln.linspace(0, 1, 16)))
    p, g = kiln.ones(16), kiln.ones(16)
    out = cf(p, g)
    assert out.data_ptr() != p.data_ptr() and kiln.equal(out, p)


@pytest.mark.skipif(not HAS_CODEGEN, reason="no code generator for cpu (kiln-cpu)")
def test_a_stored_tensor_read_by_another_kernel_is_stored_first():
    """``new`` is read again after it is written into ``m`` (so the reads of ``m`` are not redirected to
    it): the product that reads ``m`` must come after the kernel that stores into ``m``."""

    def f(m, g, w):
        new = m * 0.9 + g
        m.copy_(new)
        return (m @ w) + (new * 2).sum()

    _same(f, lambda: (kiln.linspace(-1, 1, 16).reshape(4, 4), kiln.linspace(0, 2, 16).reshape(4, 4), kiln.eye(4)))


@pytest.mark.skipif(not HAS_CODEGEN, reason="no code generator for cpu (kiln-cpu)")
def test_a_value_read_after_its_target_is_written_again_keeps_its_own_tensor():
    def f(m, g):
        new = m * 0.5 + g
        m.copy_(new)
        m.add_(1)
        return new * 3 + m

    cf = _same(f, lambda: (kiln.linspace(-1, 1, 8), kiln.linspace(0, 2, 8)))
    assert "_write(" in _program(cf)  # new is copied into m, not stored there: it is read after m.add_


def _double_store(a, b, g):
    t = g * 2 + 1
    a.copy_(t)
    b.copy_(t)


def _view_read_after_store(p, g):
    p[0].copy_(g * 2)
    return p[0] * 1


def _reduction_then_store(a, d):
    t = a * 2
    r = t.sum() * 3
    d.copy_(t)
    return r


def _forwarded_then_copied(p, a):
    p.copy_(a * 2)
    q = a * 0
    q.copy_(p)
    q.add_(1)
    return p * 1, q * 1


def _view_written_after_store(m, g):
    new = m * 0.5 + g
    m.copy_(new)
    m[0] = 0.0
    return new * 3


def _aliased_inputs(p, q):
    p.mul_(2)
    r = q * 1
    p.add_(1)
    return r


def _constant_copied(x):
    c = kiln.ones(4)
    tmp = x * 1
    tmp.copy_(c)
    z = tmp * x
    y = x + 1
    tmp.copy_(y)
    return z, tmp * 2, y


def _returned_view_of_stored(p, g):
    u = g * 2 + 1
    p.copy_(u)
    return u.view(2, 4)


def _made_grad(m, p, g):
    new = m * 0.5 + g
    m.copy_(new)
    p.grad = new
    return p.grad * 1


def _shared(n):
    p = kiln.arange(float(n * n)).reshape(n, n)
    return p, p.view(n * n)


@pytest.mark.parametrize(
    ("fn", "make"),
    [
        (_double_store, lambda: (kiln.zeros(8), kiln.zeros(8), kiln.arange(8.0))),
        (_view_read_after_store, lambda: (kiln.zeros(4, 8), kiln.arange(8.0))),
        (_reduction_then_store, lambda: (kiln.arange(8.0), kiln.zeros(8))),
        (_forwarded_then_copied, lambda: (kiln.zeros(8), kiln.arange(8.0))),
        (_view_written_after_store, lambda: (kiln.ones(8), kiln.arange(8.0))),
        (_aliased_inputs, lambda: _shared(4)),
        (_constant_copied, lambda: (kiln.arange(4.0) + 2,)),
        (_returned_view_of_stored, lambda: (kiln.zeros(8), kiln.arange(8.0))),
        (_made_grad, lambda: (kiln.ones(8), kiln.zeros(8, requires_grad=True), kiln.arange(8.0))),
    ],
    ids=lambda x: x.__name__.strip("_") if callable(x) and x.__name__ != "<lambda>" else "",
)
def test_writes_that_must_keep_their_order(fn, make):
    """Each of these once compiled to a program that differed from eager code (a review's cases): a value
    stored into two tensors, a view read or written after a store, a reduction read before its group ran,
    reads forwarded to a value that is copied again, inputs sharing memory, a constant as a write target, a
    returned view, a stored value made a ``.grad``. Three calls each: the trace and two replays."""
    cf = kiln.compile(fn)
    for _ in range(3):
        eager_args, compiled_args = make(), make()
        want, got = fn(*eager_args), cf(*compiled_args)
        want = want if isinstance(want, tuple) else (want,)
        got = got if isinstance(got, tuple) else (got,)
        for a, b in zip((*got, *compiled_args), (*want, *eager_args)):
            if a is not None:
                assert kiln.allclose(a.detach(), b.detach()), (a, b)
    if fn is _returned_view_of_stored:
        out, target = cf(*make())[0], make()[0]
        assert out.data_ptr() != target.data_ptr()


@pytest.mark.skipif(not HAS_CODEGEN, reason="no code generator for cpu (kiln-cpu)")
def test_a_code_generator_without_out_gets_its_values_copied(monkeypatch):
    """A device's code generator written before ``out=`` existed: its kernels return new tensors, and the
    program copies each into the tensor it is written to."""
    (cpu,) = [c for c in kiln.plugins.compilers().values() if getattr(c, "device_type", None) == "cpu"]

    class Old:
        device_type = "cpu"

        def __call__(self, group):
            kernel = cpu(group)
            return lambda *tensors: kernel(*tensors)

    monkeypatch.setattr(kiln.plugins, "compilers", lambda: {"old": Old()})

    def f(p, g):
        p.add_(g * 0.1 + p * 0.5)

    cf = _same(f, lambda: (kiln.linspace(-1, 1, 64).reshape(8, 8), kiln.linspace(2, 3, 64).reshape(8, 8)))
    source = _program(cf)
    assert "out=" not in source and "_write(" in source, source


@pytest.mark.parametrize("backend", ["kiln", "eager", "debug"])
def test_an_in_place_op_that_writes_more_than_its_first_argument(backend):
    """``_amp_non_finite_check_and_unscale_`` writes ``found_inf`` (its second argument) too: two equal
    expressions stay two tensors when one is written (common subexpressions), a sum of it stays after the
    write, and the eager interpretation of the graph runs the op itself (not a copy into its first)."""
    import math

    unscale = kiln.backend.op("_amp_non_finite_check_and_unscale_")

    def f(g, x, inv):
        found = x * 0.0
        other = x * 0.0
        unscale(g, found, inv)
        return found.sum(), other.sum(), g * 1

    make = (kiln.tensor([1.0, math.inf, 2.0]), kiln.ones(1), kiln.full((1,), 0.5))
    cf = kiln.compile(f, backend=backend)
    for _ in range(2):
        got = cf(*(t.clone() for t in make))
        want = f(*(t.clone() for t in make))
        assert [t.tolist() for t in got] == [t.tolist() for t in want]
    assert [t.item() for t in got[:2]] == [1.0, 0.0]


def test_a_value_read_after_an_op_writes_an_input_through_another_argument_runs_eagerly():
    """``_amp_non_finite_check_and_unscale_`` writes its ``found_inf`` argument as well as its first: a value
    read into Python after it wrote an input is a read a replay could not redo (the write has run by
    then), so the call runs eagerly with the reason, as after a write through the first argument."""
    from kiln.backend import op

    check = op("_amp_non_finite_check_and_unscale_")

    def f(g, found_inf, inv):
        h = g * 1.0  # made inside: only found_inf, an input, is written outside the graph
        check(h, found_inf, inv)
        return h * 0 if found_inf.item() else h

    cf = kiln.compile(f)
    found, inv = kiln.zeros(()), kiln.ones(())
    assert cf(kiln.ones(3), found, inv).tolist() == [1.0] * 3
    assert "after a write to an input" in cf._entries[0].reason and cf._entries[0].forward is None
    out = cf(kiln.tensor([1.0, float("inf"), 1.0]), found, inv)
    assert found.item() == 1.0 and kiln.isnan(out).any().item()
