"""Reductions against the reference kernels: sum, mean, amax, amin and max/min of all elements, over all
dims and any dims (keepdim or not), on every layout, with the reference's result layout; max and min
exactly, sums within NumPy's pairwise-summation accuracy."""

from __future__ import annotations

import numpy as np
import pytest
from kiln_cpu_helpers import assert_same, make, reference

import kiln
from kiln.testing import assert_close

FLOAT = [kiln.float32, kiln.float64]


def _finite(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return kiln.from_numpy(rng.standard_normal(shape).astype(dtype.numpy))


def _layouts(dtype, maker):
    return {
        "contiguous": maker((4, 5, 6), dtype),
        "transposed": maker((6, 5, 4), dtype).permute(2, 1, 0),
        "strided": maker((4, 10, 6), dtype)[:, ::2],
        "expand": maker((4, 1, 6), dtype).expand(4, 5, 6),
        "empty": maker((4, 0, 6), dtype),
    }


DIMS = [None, 0, 1, -1, (0, 2), (1, 2), (0, 1, 2)]
CALLS = {
    "sum": lambda x, d, k: x.sum() if d is None else x.sum(d, keepdim=k),
    "mean": lambda x, d, k: x.mean() if d is None else x.mean(d, keepdim=k),
    "amax": lambda x, d, k: x.amax() if d is None else x.amax(d, keepdim=k),
    "amin": lambda x, d, k: x.amin() if d is None else x.amin(d, keepdim=k),
}


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dim", DIMS, ids=str)
@pytest.mark.parametrize("layout", list(_layouts(kiln.float32, make)))
@pytest.mark.parametrize("dtype", FLOAT, ids=str)
@pytest.mark.parametrize("name", list(CALLS))
def test_reduction_matches_reference(name, dtype, layout, dim, keepdim, spy):
    fn = CALLS[name]
    exact = name in ("amax", "amin")
    x = _layouts(dtype, make if exact else _finite)[layout]
    try:
        expected = reference(fn, x, dim, keepdim)
    except (RuntimeError, IndexError) as exc:  # amax of an empty dim: the meta refuses it
        with pytest.raises(type(exc)):
            fn(x, dim, keepdim)
        return
    got = fn(x, dim, keepdim)
    if exact:
        assert_same(got, expected)
    else:
        assert_close(got, expected, rtol=1e-5, atol=1e-6, equal_nan=True)
        assert [s for n, s in zip(got.shape, got.stride()) if n > 1] == [
            s for n, s in zip(expected.shape, expected.stride()) if n > 1
        ]
    assert {c[0] for c in spy} == ({"reduce"} if x.numel() else set())


@pytest.mark.parametrize("dtype", FLOAT, ids=str)
def test_max_min_of_all_elements(dtype, spy):
    x = make((37, 41), dtype)
    for fn in (kiln.max, kiln.min):
        assert_same(fn(x), reference(fn, x))
        assert_same(fn(x.t()), reference(fn, x.t()))
    y = _finite((37, 41), dtype)
    assert_same(kiln.max(y), reference(kiln.max, y))
    assert [c[0] for c in spy] == ["reduce"] * 5


@pytest.mark.parametrize("n", [1, 7, 8, 15, 16, 127, 128, 129, 1000, 4097, 100_003, 1_000_001])
@pytest.mark.parametrize("dtype", FLOAT, ids=str)
def test_sum_is_as_accurate_as_numpy_pairwise(n, dtype):
    """NumPy's summation tree (float32 accumulation for float32): the error against the exact sum stays
    within a small multiple of NumPy's own; strided data takes NumPy's exact order."""
    x = _finite((n,), dtype, seed=n) * 1000
    exact = x.numpy().astype(np.float64).sum()
    eps = np.finfo(dtype.numpy).eps
    bound = 2 * abs(float(reference(kiln.sum, x)) - exact) + 4 * eps * np.abs(x.numpy()).sum()
    assert abs(float(x.sum()) - exact) <= bound
    assert abs(float(x.mean()) * n - exact) <= bound + 4 * eps * abs(exact)
    rows = _finite((9, n // 9 + 1), dtype, seed=n)
    # contiguous rows: another leaf width than NumPy's, so within the pairwise error bound of NumPy's sum
    row_bound = float(4 * eps * np.abs(rows.numpy()).sum(1).max())
    assert_close(rows.sum(1), reference(lambda t: t.sum(1), rows), rtol=0, atol=row_bound)
    assert_same(rows.sum(0), reference(lambda t: t.sum(0), rows))  # rows added in order, as NumPy
    strided = _finite((n, 2), dtype, seed=n)[:, 0]
    assert_same(strided.sum(), reference(kiln.sum, strided))


def test_nan_and_inf_propagate():
    x = _finite((64, 64), kiln.float32)
    x[3, 5] = float("nan")
    x[10, 1] = float("inf")
    for fn in (lambda t: t.amax(1), lambda t: t.amin(0), kiln.max):
        assert_same(fn(x), reference(fn, x))
    for fn in (lambda t: t.sum(), lambda t: t.mean(1), lambda t: t.sum(0)):
        assert_close(fn(x), reference(fn, x), rtol=1e-5, atol=1e-5, equal_nan=True)
    assert kiln.isnan(x.sum()).item() and kiln.isnan(x.mean(1))[3].item() and x.sum(1)[10].item() == float("inf")


def test_other_dtypes_go_to_the_reference(spy):
    for x in (make((5, 6), kiln.int32), make((5, 6), kiln.int64), make((5, 6), kiln.float16)):
        assert_same(x.sum(), reference(kiln.sum, x))
        assert_same(x.amax(0), reference(lambda t: t.amax(0), x))
    f = _finite((5, 6), kiln.float32)
    assert_same(f.sum(dtype=kiln.float64), reference(lambda t: t.sum(dtype=kiln.float64), f))
    assert spy == []


@pytest.mark.parametrize("name", list(CALLS))
def test_two_reduced_dims_around_a_kept_one_are_read_in_place(name, spy):
    """A reduction over (N, H, W) of an NCHW tensor (a conv bias's gradient) reads the runs in place, one
    task per kept index (the "slabs" loop), instead of copying the tensor with the reduced dims last; sums
    add short runs element by element first, runs longer than ``_SLAB_RUN`` one by one."""
    from kiln_cpu._jit_reduce import _SLAB_RUN

    for shape in ((6, 3, 5, 7), (2, 3, 1, _SLAB_RUN + 5)):
        x = make(shape, kiln.float32)
        fn = lambda t: CALLS[name](t, (0, 2, 3), False)
        expected = reference(fn, x)
        if name in ("amax", "amin"):
            assert_same(fn(x), expected)
        else:
            assert_close(fn(x), expected, rtol=1e-5, atol=1e-5, equal_nan=True)
    assert [c[2] for c in spy] == ["slabs", "slabs"]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", ["sum", "amax", "amin"])
def test_one_strided_run_is_split_into_subtrees(name, threads, spy):
    """All of a strided run (``x[:, ::2]`` of a contiguous ``x``: its two dims merge into one run with
    stride 2) is reduced as NumPy reduces it, one pairwise tree, with the tree's subtrees spread over the
    threads ("segments"), bit for bit the reference's."""
    previous = kiln.get_num_threads()
    kiln.set_num_threads(threads)
    try:
        for shape in ((300, 2 * 1000), (3, 2 * 70_001)):
            x = (make if name != "sum" else _finite)(shape, kiln.float32)[:, ::2]
            fn = lambda t: getattr(kiln, name)(t)
            assert_same(fn(x), reference(fn, x))
    finally:
        kiln.set_num_threads(previous)
    assert [c[2] for c in spy] == ["segments", "segments"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_stride_two_leaf_adds_as_numpy_in_any_layout(dtype):
    """The leaf of a stride-2 sum runs as vectors in a C-contiguous buffer and as scalars in any other;
    both add NumPy's eight running sums in NumPy's order (a leaf of up to 128 elements is NumPy's whole
    sum of them)."""
    from numba import njit

    from kiln_cpu._jit_reduce import _pairwise_leaf

    @njit(cache=False)
    def leaf(a, n):
        return _pairwise_leaf(a, np.uint64(1), n, np.uint64(2))

    x = (np.random.default_rng(3).standard_normal(900) * 1e4).astype(dtype)
    for n in (8, 9, 15, 16, 17, 100, 128):
        for a in (x, x[::3]):
            assert dtype(leaf(a, n)).tobytes() == a[1 : 1 + 2 * n : 2].sum().tobytes()
