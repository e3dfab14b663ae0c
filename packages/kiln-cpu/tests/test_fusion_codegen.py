"""kiln-cpu's code generator for kiln-compile's fused groups, driven through its protocol alone (a plain object
with the group's fields: kiln-compile is not needed here): every loop variant against NumPy."""

from __future__ import annotations

import itertools
import re
import types
import warnings

import numpy as np
import pytest

import kiln
import kiln.plugins
from kiln_cpu.fusion import codegen, source


def _group(shape, inputs, lines, outputs, reduction=None, keepdim=False, **more):
    """A group as an older kiln-compile makes it (no ``dims``), or with ``more`` fields (``dims``)."""
    return types.SimpleNamespace(
        shape=shape, inputs=inputs, lines=lines, outputs=outputs, reduction=reduction, keepdim=keepdim, **more
    )


@pytest.mark.parametrize(
    ("shape", "bias", "dims", "keepdim", "kind", "loops"),
    [
        ((6, 4, 5, 7), (4, 1, 1), (0, 2, 3), False, "sum", [6, 4, 35]),  # merged
        ((6, 4, 5, 7), (7,), (0, 2), True, "mean", [6, 4, 5, 7]),
        ((128, 24), (24,), (0,), False, "sum", [128, 24]),  # kept last dim: a row of sums
        ((3, 1, 1, 8), (8,), (1, 3), True, "sum", [3, 8]),  # size-1 dims dropped
        ((0, 4), (4,), (0,), False, "mean", None),  # empty: NaN
    ],
)
def test_partial_reductions(shape, bias, dims, keepdim, kind, loops):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape).astype(np.float32)
    b = rng.standard_normal(bias).astype(np.float32)
    group = _group(
        shape,
        [(shape, "float32"), (bias, "float32")],
        [("t0", "(x0 * x1)"), ("t1", "(float32(0.0) if t0 <= float32(0.0) else t0)")],
        [("t1", "float32")],
        (kind, "t1", "float32"),
        keepdim,
        dims=dims,
    )
    text, _, _ = source(group)
    assert "def flat(" not in text  # a flat index does not say which kept element it adds into
    dynamic = types.SimpleNamespace(**{**vars(group), "dynamic": True})
    sizes = r"range\((?:[2-9]|\d\d+)\)"  # a size of 2 or more written in (0 and 1 are written in both)
    assert re.search(sizes, text) and not re.search(sizes, source(dynamic)[0])
    if loops is not None:  # the dense loop's sizes, written into its text
        dense = text.split("def dense(")[1].split("def strided(")[0]
        assert [line.split(" in ")[1].rstrip(":") for line in dense.splitlines() if " in range(" in line][
            : len(loops)
        ] == [f"range({n})" for n in loops], dense
    want_t = np.maximum(x * b, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NumPy's mean of an empty slice: NaN, as wanted
        want = getattr(want_t.astype(np.float64), kind)(axis=dims, keepdims=keepdim)
    for g, xs in itertools.product((group, dynamic), (x, np.ascontiguousarray(x.T).T)):  # dense; strided
        t, r = codegen(g)(kiln.from_numpy(xs), kiln.from_numpy(b))
        np.testing.assert_allclose(t.numpy(), want_t, rtol=1e-6)
        assert r.shape == want.shape and r.dtype is kiln.float32
        np.testing.assert_allclose(r.numpy(), want.astype(np.float32), rtol=1e-5, atol=1e-6)


def test_registered_for_cpu():
    found = [c for c in kiln.plugins.compilers().values() if getattr(c, "device_type", None) == "cpu"]
    assert found == [codegen]


@pytest.mark.parametrize(
    ("xs", "b"),
    [
        (np.arange(12.0, dtype=np.float32).reshape(3, 4) - 5, np.linspace(-1, 1, 4, dtype=np.float32)),  # dense
        (np.arange(12.0, dtype=np.float32).reshape(4, 3).T, np.ones(4, dtype=np.float32)),  # strided
        (np.full((3, 4), np.nan, dtype=np.float32), np.zeros(4, dtype=np.float32)),  # NaN through relu
        (np.zeros((0, 4), dtype=np.float32), np.ones(4, dtype=np.float32)),  # empty
    ],
    ids=["dense", "strided", "nan", "empty"],
)
def test_loops_store_and_reduce(xs, b):
    group = _group(
        (xs.shape[0], 4) if xs.shape[-1] == 4 else xs.shape,
        [(tuple(xs.shape), "float32"), ((4,), "float32")],
        [("t0", "sigmoid(x0)"), ("t1", "(x0 * t0 + x1)"), ("t2", "(float32(0.0) if t1 <= float32(0.0) else t1)")],
        [("t1", "float32"), ("t2", "float32")],
        ("sum", "t2", "float32"),
    )
    kernel = codegen(group)
    t1, t2, total = kernel(kiln.from_numpy(np.ascontiguousarray(xs)), kiln.from_numpy(b))
    s = 1 / (1 + np.exp(-xs.astype(np.float64)))
    want1 = (xs * s + b).astype(np.float32)
    want2 = np.where(want1 <= 0, 0, want1)
    np.testing.assert_allclose(t1.numpy(), want1, rtol=1e-6)
    np.testing.assert_allclose(t2.numpy(), want2, rtol=1e-6)
    assert total.shape == () and total.dtype is kiln.float32
    assert np.isclose(total.item(), want2.astype(np.float64).sum(), rtol=1e-6, equal_nan=True)


def test_mean_keepdim_and_float64():
    x = np.linspace(-2, 2, 10)
    group = _group(
        (10,),
        [((10,), "float64")],
        [("t0", "exp(x0)"), ("t1", "(t0 * float64(2.0))")],
        [],
        ("mean", "t1", "float64"),
        True,
    )
    (mean,) = codegen(group)(kiln.from_numpy(x))
    assert mean.shape == (1,) and mean.dtype is kiln.float64
    assert np.isclose(mean.item(), np.mean(np.exp(x) * 2), rtol=1e-14)


def test_strided_inputs_take_the_strided_loop():
    x = np.arange(20.0, dtype=np.float32).reshape(4, 5)
    view = kiln.from_numpy(x).t()  # (5, 4), not contiguous
    group = _group((5, 4), [((5, 4), "float32")], [("t0", "(x0 + float32(1.0))")], [("t0", "float32")])
    (out,) = codegen(group)(view)
    np.testing.assert_array_equal(out.numpy(), x.T + 1)
    text = source(group)[0]
    assert "def strided(" in text and "def dense(" in text


@pytest.mark.parametrize("n", [5, 1500, 70000], ids=["short", "chunks", "long-rows"])
def test_out_stores_into_the_given_tensor_even_an_input(n):
    """``out=``: the output lands in the given tensor, one of the inputs here (each element read before it is
    stored), on each loop: flat, dense with a broadcast input, and rows longer than the nested loops buffer."""
    x = np.linspace(-3, 3, n, dtype=np.float32)
    group = _group(
        (n,), [((n,), "float32"), ((n,), "float32")], [("t0", "(x0 * float32(2.0) + x1)")], [("t0", "float32")]
    )
    a, b = kiln.from_numpy(x.copy()), kiln.from_numpy(x[::-1].copy())
    (got,) = codegen(group)(a, b, out=[a])
    assert got is a
    np.testing.assert_allclose(a.numpy(), x * 2 + x[::-1], rtol=1e-6)
    bcast = _group((2, n), [((2, n), "float32"), ((n,), "float32")], [("t0", "(x0 - x1)")], [("t0", "float32")])
    m = kiln.from_numpy(np.stack([x, -x]))
    (got,) = codegen(bcast)(m, kiln.from_numpy(x), out=[m])
    assert got is m
    np.testing.assert_allclose(m.numpy(), np.stack([x - x, -x - x]), rtol=1e-6)


def test_out_overlapping_another_input_is_stored_aside():
    """The target overlaps another input in another layout (its transpose): the loop stores aside, then the
    result is copied in, so every element is computed from the old values."""
    p = np.arange(16.0, dtype=np.float32).reshape(4, 4)
    group = _group((4, 4), [((4, 4), "float32"), ((4, 4), "float32")], [("t0", "(x0 + x1)")], [("t0", "float32")])
    a = kiln.from_numpy(p.copy())
    (got,) = codegen(group)(a, a.t(), out=[a])
    assert got is a
    np.testing.assert_array_equal(a.numpy(), p + p.T)


def test_merged_rows_stay_buffered():
    """Dims merge only up to a row the loop buffers: an in-place update of a 256x784 weight with a 0-d step
    size (an Adam step) keeps rows of 784, not one unbuffered row of 200704 (which does not vectorize)."""
    group = _group(
        (256, 784),
        [((256, 784), "float32"), ((), "float32")],
        [("t0", "(x0 * x1)")],
        [("t0", "float32")],
    )
    dense = source(group)[0].split("def dense(")[1].split("def strided(")[0]
    assert "range(256)" in dense and "range(784)" in dense and "o0[" in dense, dense
    p = np.ones((256, 784), np.float32)
    target = kiln.from_numpy(p)
    (out,) = codegen(group)(target, kiln.tensor(0.5), out=[target])
    assert out is target and float(target.sum()) == 256 * 784 * 0.5


def test_dynamic_groups_share_one_compiled_loop_across_shapes():
    """A dynamic group reads its sizes at run time: groups that differ only in their sizes (a new batch size)
    have the same text, so they share one module and its compiled loops, and each computes its own shape right:
    empty, one row, merged rows, rows longer than the loops buffer, a broadcast bias, a partial sum."""
    from kiln._generated import _modules

    def group(batch, width):
        return _group(
            (batch, width),
            [((batch, width), "float32"), ((width,), "float32")],
            [("t0", "(x0 * x1)"), ("t1", "(float32(0.0) if t0 <= float32(0.0) else t0)")],
            [("t1", "float32")],
            ("sum", "t1", "float32"),
            dims=(0,),
            dynamic=True,
        )

    texts = {source(group(n, 8))[0] for n in (2, 3, 1000, 100000)}
    assert len(texts) == 1  # (sizes 0 and 1 give other texts, as PyTorch specializes them)
    rng = np.random.default_rng(3)
    before = None
    for batch, width in ((3, 8), (5, 8), (0, 8), (1, 8), (2, 70000), (4, 70000)):
        x = rng.standard_normal((batch, width)).astype(np.float32)
        b = rng.standard_normal(width).astype(np.float32)
        for xs in (x, np.asfortranarray(x)):  # the dense loop; the strided one
            t, r = codegen(group(batch, width))(kiln.from_numpy(xs), kiln.from_numpy(b))
            np.testing.assert_allclose(t.numpy(), np.maximum(x * b, 0), rtol=1e-6)
            np.testing.assert_allclose(r.numpy(), np.maximum(x * b, 0).astype(np.float64).sum(0), rtol=1e-5, atol=1e-6)
        if (batch, width) == (3, 8):
            before = len(_modules)
        elif width == 8 and batch > 1:
            assert len(_modules) == before  # no new module for another batch size


def test_dynamic_dims_read_only_the_sizes_that_change():
    """``dynamic_dims=(0,)`` (the batch): the rows' length stays written in (a short row is unrolled, not a
    loop of unknown length), only the batch size is read at run time, and groups at other batch sizes share
    the text."""

    def group(batch):
        return _group(
            (batch, 4),
            [((batch, 4), "float32"), ((4,), "float32")],
            [("t0", "(x0 * x1 + float32(1.0))")],
            [("t0", "float32")],
            dynamic=True,
            dynamic_dims=(0,),
        )

    text, geometry, _ = source(group(1000))
    dense = text.split("def dense(")[1].split("def strided(")[0]
    assert "range(n0)" in dense and "range(4)" in dense and "n1" not in dense, dense
    assert list(geometry) == [1000]
    assert {source(group(n))[0] for n in (2, 7, 1000)} == {text}
    x = np.arange(28.0, dtype=np.float32).reshape(7, 4)
    b = np.array([1, -1, 2, 0.5], np.float32)
    (out,) = codegen(group(7))(kiln.from_numpy(x), kiln.from_numpy(b))
    np.testing.assert_allclose(out.numpy(), x * b + 1, rtol=1e-6)


def _update(shape, dtype="float32"):
    """An SGD-like group: ``p - 0.5 * g`` of two tensors of ``shape``."""
    return _group(shape, [(shape, dtype), (shape, dtype)], [("t0", f"(x0 - ({dtype}(0.5) * x1))")], [("t0", dtype)])


def test_horizontal_runs_every_group_in_one_kernel():
    """``codegen.horizontal(groups)``: one kernel whose inputs, ``out`` entries and results are the groups' in
    order; stored into the given tensors, or new ones where ``out`` has None; float32 and float64, an empty
    tensor and a 0-d one among them."""
    rng = np.random.default_rng(3)
    shapes = [((256, 7), "float32"), ((0,), "float32"), ((), "float64"), ((5000,), "float32")]
    groups = [_update(s, d) for s, d in shapes]
    arrays = [(rng.standard_normal(s).astype(d), rng.standard_normal(s).astype(d)) for s, d in shapes]
    tensors = [kiln.from_numpy(a.copy()) for pair in arrays for a in pair]
    kernel = codegen.horizontal(groups)
    out = [tensors[0], None, tensors[4], None]
    got = kernel(*tensors, out=out)
    assert got[0] is tensors[0] and got[2] is tensors[4]
    for (p, g), result in zip(arrays, got):
        np.testing.assert_array_equal(result.numpy(), p - p.dtype.type(0.5) * g)
        assert result.dtype == getattr(kiln, str(p.dtype))
    again = kernel(*tensors)  # no out=: every result new
    assert all(r is not t for r, t in zip(again, tensors[::2]))


def test_horizontal_hands_other_layouts_to_each_groups_own_kernel():
    """A transposed input, or a target that another input overlaps in another layout: each group's own kernel
    runs (the strided loop, or stored aside), with the same results."""
    p = np.arange(16.0, dtype=np.float32).reshape(4, 4)
    kernel = codegen.horizontal([_update((4, 4)), _update((3,))])
    a, b = kiln.from_numpy(p.copy()), kiln.from_numpy(np.ones(3, np.float32))
    got = kernel(a, a.t(), b, b, out=[a, b])  # a's target overlaps its transpose
    assert got[0] is a and got[1] is b
    np.testing.assert_array_equal(a.numpy(), p - 0.5 * p.T)
    np.testing.assert_array_equal(b.numpy(), np.full(3, 0.5, np.float32))
    c = kiln.from_numpy(p.copy())
    (new, _) = kernel(c.t(), c, b, b)
    np.testing.assert_array_equal(new.numpy(), p.T - 0.5 * p)
