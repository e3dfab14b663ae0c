"""Finite differences and integration against torch: ``diff``, ``gradient``, ``trapezoid``/``trapz`` and
``cumulative_trapezoid`` (values, dtypes, gradients and errors)."""

from __future__ import annotations

import kiln_testutil as U
import numpy as np
import pytest
import torch

import kiln

LAYOUTS = ["contiguous", "transposed", "strided", "expanded"]


def _gradcheck(fn, *shapes):
    rng = np.random.default_rng(0)
    xs = [kiln.tensor(rng.standard_normal(s), requires_grad=True) for s in shapes]
    assert kiln.autograd.gradcheck(fn, xs) and kiln.autograd.gradgradcheck(fn, xs)


# ---------------------------------------------------------------------------------------- diff

DIFF_KWARGS = [{}, {"n": 2}, {"n": 0}, {"n": 7}, {"dim": 0}, {"dim": -2, "n": 2}]


@pytest.mark.parametrize("kwargs", DIFF_KWARGS, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_diff(kwargs, layout):
    x = U.make_pair((3, 5), kiln.float64, layout=layout, requires_grad=True)
    U.check_op(lambda L, a: L.diff(a, **kwargs), x)
    U.check_op(lambda L, a: a.diff(**kwargs), U.make_pair((3, 5), kiln.int32, layout=layout))


@pytest.mark.parametrize("dtype", [kiln.bool, kiln.uint8, kiln.int64, kiln.float16, kiln.float32])
def test_diff_dtypes_and_edges(dtype):
    U.check_op(lambda L, a: L.diff(a), U.make_pair((6,), dtype))
    U.check_op(lambda L, a: L.diff(a, n=3, dim=0), U.make_pair((2, 3), dtype))
    U.check_op(lambda L, a: L.diff(a), U.make_pair((0,), dtype))
    U.check_op(lambda L, a: L.diff(a, dim=0), U.make_pair((4, 0), dtype))


def test_diff_prepend_append():
    x, p, a = (U.make_pair(s, kiln.float64, seed=i, requires_grad=True) for i, s in enumerate([(3, 4), (3, 1), (3, 2)]))
    U.check_op(lambda L, u, v, w: L.diff(u, prepend=v, append=w), x, p, a)
    U.check_op(
        lambda L, u, v: L.diff(u, n=2, dim=0, append=v),
        x,
        U.make_pair((2, 4), kiln.float64, seed=5, requires_grad=True),
    )
    U.check_op(lambda L, u, v: L.diff(u, prepend=v), U.make_pair((3,), kiln.int64), U.make_pair((1,), kiln.float32))
    _gradcheck(lambda u, v: kiln.diff(u, n=2, prepend=v), (3, 5), (3, 2))


@pytest.mark.parametrize(
    "fn",
    [
        lambda L: L.diff(L.ones(3), n=-1),
        lambda L: L.diff(L.tensor(1.0)),
        lambda L: L.diff(L.ones(3, 4), dim=1, prepend=L.zeros(1)),
        lambda L: L.diff(L.ones(3), dim=3),
        lambda L: L.diff(L.ones(3), prepend=2.0),
        lambda L: L.diff(L.ones(3), n=1.5),
    ],
)
def test_diff_errors(fn):
    U.assert_same_error(lambda: fn(kiln), lambda: fn(torch), exact=True)


# ---------------------------------------------------------------------------------------- gradient


def _coords(*sizes):
    rng = np.random.default_rng(7)
    return [np.cumsum(rng.uniform(0.5, 2.0, n)) for n in sizes]


GRADIENT = [
    {},
    {"spacing": 2.0},
    {"spacing": (2, -1.5)},
    {"dim": 1},
    {"dim": [0]},
    {"dim": -1, "spacing": 0.5},
    {"edge_order": 2},
    {"edge_order": 2, "spacing": [0.5, 3.0]},
    {"coords": True},
    {"coords": True, "edge_order": 2},
    {"coords": True, "dim": 1},
]


@pytest.mark.parametrize("kwargs", GRADIENT, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
def test_gradient(kwargs, layout):
    x = U.make_pair((4, 5), kiln.float64, layout=layout, requires_grad=True)
    kwargs = dict(kwargs)
    if kwargs.pop("coords", False):
        sizes = (5,) if kwargs.get("dim") == 1 else (4, 5)
        coords = [U.make_pair((n,), kiln.float64, values=c) for n, c in zip(sizes, _coords(*sizes))]
        U.check_op(lambda L, a, *cs: L.gradient(a, spacing=list(cs), **kwargs), x, *coords)
    else:
        U.check_op(lambda L, a: L.gradient(a, **kwargs), x)


@pytest.mark.parametrize("dtype", [kiln.int64, kiln.int32, kiln.float16, kiln.float32])
def test_gradient_dtypes(dtype):
    U.check_op(lambda L, a: L.gradient(a), U.make_pair((3, 4), dtype), rtol=1e-3)
    U.check_op(lambda L, a: L.gradient(a, spacing=2), U.make_pair((5,), dtype), rtol=1e-3)
    U.check_op(lambda L, a: L.gradient(a, edge_order=2), U.make_pair((4,), dtype), rtol=1e-3)
    c = U.make_pair((3,), kiln.int32, values=np.array([0, 1, 3]))
    U.check_op(lambda L, a, s: L.gradient(a, spacing=[s]), U.make_pair((3,), dtype), c, rtol=1e-3)


def test_gradient_0d_empty_dims_and_gradcheck():
    assert kiln.gradient(kiln.tensor(1.0)) == () == torch.gradient(torch.tensor(1.0))
    assert kiln.gradient(kiln.ones(2, 3), dim=[]) == ()
    _gradcheck(lambda a: kiln.gradient(a, edge_order=2), (4, 3))
    _gradcheck(lambda a, s: kiln.gradient(a, spacing=[s.exp().cumsum(0)], dim=0), (4, 3), (4,))


@pytest.mark.parametrize(
    "fn",
    [
        lambda L: L.gradient(L.ones(5), edge_order=3),
        lambda L: L.gradient(L.ones(1)),
        lambda L: L.gradient(L.ones(2), edge_order=2),
        lambda L: L.gradient(L.ones(3, 4), spacing=[1.0]),
        lambda L: L.gradient(L.ones(3, 4), spacing=[1.0, 2.0], dim=1),
        lambda L: L.gradient(L.ones(3, 4), spacing=[L.ones(1, 3)], dim=0),
        lambda L: L.gradient(L.ones(3, 4), dim=(0, 0)),
        lambda L: L.gradient(L.ones(3, 4), spacing=[L.arange(3.0), 2.0]),
        lambda L: L.gradient(L.ones(3, 4), dim=2),
    ],
)
def test_gradient_errors(fn):
    U.assert_same_error(lambda: fn(kiln), lambda: fn(torch), exact=True)


# ---------------------------------------------------------------------------------------- trapezoid


@pytest.mark.parametrize("name", ["trapezoid", "trapz", "cumulative_trapezoid"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_trapezoid(name, layout):
    y = U.make_pair((4, 5), kiln.float64, layout=layout, requires_grad=True)
    fn = lambda L, *a, **k: getattr(L, name)(*a, **k)
    U.check_op(lambda L, a: fn(L, a), y)
    U.check_op(lambda L, a: fn(L, a, dim=0), y)
    U.check_op(lambda L, a: fn(L, a, dx=0.5), y)
    xs = U.make_pair((5,), kiln.float64, values=_coords(5)[0], requires_grad=True)
    U.check_op(lambda L, a, x: fn(L, a, x), y, xs)
    U.check_op(lambda L, a, x: fn(L, a, x=x), y, xs)
    U.check_op(lambda L, a, x: fn(L, a, x, dim=0), y, U.make_pair((1, 5), kiln.float64, seed=4, requires_grad=True))
    U.check_op(lambda L, a, x: fn(L, a, x, dim=0), y, U.make_pair((2, 5), kiln.float64, seed=4))  # x broadcasts


@pytest.mark.parametrize("name", ["trapezoid", "trapz", "cumulative_trapezoid"])
def test_trapezoid_dtypes_and_edges(name):
    fn = getattr(kiln, name)
    tfn = getattr(torch, name)
    for values in ([1, 2, 3], [5]):
        U.check_op(lambda L, a: getattr(L, name)(a), U.make_pair((len(values),), kiln.int64, values=np.array(values)))
    U.check_op(lambda L, a: getattr(L, name)(a, dx=2), U.make_pair((3,), kiln.int32))
    U.check_op(lambda L, a: getattr(L, name)(a), U.make_pair((0,), kiln.float32))
    U.check_op(lambda L, a: getattr(L, name)(a, dim=0), U.make_pair((0, 3), kiln.float32))
    U.check_op(lambda L, a, x: getattr(L, name)(a, x), U.make_pair((3,), kiln.float32), U.make_pair((3,), kiln.float64))
    U.check_op(lambda L, a, x: getattr(L, name)(a, x), U.make_pair((3,), kiln.float32), U.make_pair((3,), kiln.int64))
    assert fn(kiln.ones(3), dx=kiln.tensor(2.0)).tolist() == tfn(torch.ones(3), dx=torch.tensor(2.0)).tolist()
    _gradcheck(lambda a, x: fn(a, x.exp().cumsum(-1)), (3, 4), (4,))


@pytest.mark.parametrize("name", ["trapezoid", "trapz", "cumulative_trapezoid"])
@pytest.mark.parametrize(
    "make",
    [
        lambda L, f: f(L.ones(5), x=L.ones(2)),
        lambda L, f: f(L.tensor(2.0)),
        lambda L, f: f(L.ones(5), L.ones(5), dx=2),
        lambda L, f: f(L.ones(5), 2),
        lambda L, f: f(L.tensor([True, False])),
        lambda L, f: f(L.ones(5), dx=2, dim=1),
    ],
)
def test_trapezoid_errors(name, make):
    U.assert_same_error(lambda: make(kiln, getattr(kiln, name)), lambda: make(torch, getattr(torch, name)), exact=True)
