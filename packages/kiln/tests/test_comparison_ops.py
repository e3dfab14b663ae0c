"""Comparisons against torch: the alias methods (``greater``, ``less_equal_``...), ``isclose``/``allclose``,
``isin``, ``isreal`` and ``signbit`` on random, non-contiguous, broadcast, empty and 0-d inputs, and their
errors."""

from __future__ import annotations

import kiln_testutil as U
import numpy as np
import pytest
import torch

import kiln

NAN, INF = float("nan"), float("inf")
ALIASES = ["greater", "greater_equal", "less", "less_equal", "not_equal"]
LAYOUTS = ["contiguous", "transposed", "strided", "expanded"]


@pytest.mark.parametrize("name", ALIASES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_alias_functions_and_methods(name, layout):
    a = U.make_pair((3, 4), kiln.float32, layout=layout, integral=True, low=-2, high=2)
    b = U.make_pair((4,), kiln.float32, seed=1, integral=True, low=-2, high=2)
    U.check_op(lambda L, x, y: getattr(L, name)(x, y), a, b)
    U.check_op(lambda L, x, y: getattr(x, name)(y), a, b)
    U.check_op(lambda L, x: getattr(x, name)(1), a)


@pytest.mark.parametrize("name", ALIASES)
def test_alias_inplace_methods(name):
    for dtype in (kiln.float32, kiln.int64):
        a = U.make_pair((3, 4), dtype, integral=True, low=-2, high=2)
        b = U.make_pair((3, 4), dtype, seed=2, integral=True, low=-2, high=2)
        U.check_op(lambda L, x, y: getattr(x.clone(), name + "_")(y), a, b, grad=False)
    assert getattr(kiln.Tensor, name) is getattr(
        kiln.Tensor, {"greater": "gt", "greater_equal": "ge", "less": "lt", "less_equal": "le", "not_equal": "ne"}[name]
    )


def test_alias_records_name_the_methods():
    import kiln.backend as kb

    assert "greater" in kb.op("gt").methods and "greater_" in kb.op("gt").inplace_methods
    assert "not_equal_" in kb.op("ne").inplace_methods


# ---------------------------------------------------------------------------------------- isclose, allclose

SPECIAL = np.array([1.0, 2.0, NAN, INF, -INF, 0.0, -0.0, 1e-9, 100.0, NAN])
OTHER = np.array([1.0, 2.1, NAN, INF, INF, 1e-9, 0.0, 0.0, 100.001, 1.0])


@pytest.mark.parametrize("kwargs", [{}, {"equal_nan": True}, {"rtol": 0.1}, {"atol": 0.5}, {"rtol": 0, "atol": 0}])
@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64, kiln.float16, kiln.bfloat16])
def test_isclose_specials(kwargs, dtype):
    a = U.make_pair((10,), dtype, values=SPECIAL)
    b = U.make_pair((10,), dtype, values=OTHER)
    U.check_op(lambda L, x, y: L.isclose(x, y, **kwargs), a, b)
    U.check_op(lambda L, x, y: x.isclose(y, **kwargs), a, b)
    assert kiln.allclose(a.k, b.k, **kwargs) == torch.allclose(a.t, b.t, **kwargs)


@pytest.mark.parametrize("dtype", [kiln.uint8, kiln.int8, kiln.int32, kiln.int64, kiln.bool])
def test_isclose_integers_compute_the_error_in_floating_point(dtype):
    a = U.make_pair((5, 6), dtype, low=-4, high=9)
    b = U.make_pair((6,), dtype, seed=3, low=-4, high=9)
    for kwargs in ({}, {"atol": 1}, {"atol": 1.5, "rtol": 0.2}, {"rtol": 0.5}):
        U.check_op(lambda L, x, y, kwargs=kwargs: L.isclose(x, y, **kwargs), a, b)
    big = U.make_pair((1,), kiln.int64, values=np.array([16777217]))
    near = U.make_pair((1,), kiln.int64, values=np.array([16777216]))
    U.check_op(lambda L, x, y: L.isclose(x, y, rtol=0, atol=0.5), big, near)  # rounded to float32: close


@pytest.mark.parametrize("layout", LAYOUTS)
def test_isclose_layouts_empty_and_0d(layout):
    a = U.make_pair((3, 4), kiln.float64, layout=layout)
    U.check_op(lambda L, x: L.isclose(x, x * 1.00001), a)
    U.check_op(lambda L, x, y: L.isclose(x, y), U.make_pair((0, 3)), U.make_pair((3,)))
    U.check_op(lambda L, x, y: L.isclose(x, y), U.make_pair(()), U.make_pair((2,)))
    assert kiln.allclose(kiln.ones(0), kiln.ones(0)) is True
    assert kiln.allclose(kiln.ones(2, 3), kiln.ones(3)) is True


def test_isclose_signature_and_positional_arguments():
    x, y = kiln.tensor([1.0]), kiln.tensor([2.0])
    assert kiln.isclose(x, y, 0.5, 0.6, True).item() is True
    assert kiln.isclose(x, y, atol=True).item() is True  # a bool is a number to PyTorch's parser
    import inspect

    assert str(inspect.signature(kiln.isclose)).startswith("(input: 'Tensor', other: 'Tensor', rtol: 'float' = 1e-05")
    assert list(inspect.signature(kiln.allclose).parameters) == ["input", "other", "rtol", "atol", "equal_nan"]


CLOSE_ERRORS = [
    (lambda L: L.isclose(L.tensor([1, 2]), L.tensor([1.0, 3.0]))),
    (lambda L: L.allclose(L.ones(2), L.ones(2, dtype=L.float64))),
    (lambda L: L.isclose(L.ones(2), L.ones(2), rtol=-1)),
    (lambda L: L.isclose(L.ones(2), L.ones(2), atol=-1)),
    (lambda L: L.isclose(L.ones(2), L.ones(2), atol=float("nan"))),
    (lambda L: L.isclose(L.ones(2), 1.0)),
    (lambda L: L.isclose(L.ones(2), L.ones(2), atol="x")),
    (lambda L: L.isclose(L.ones(2), L.ones(2), equal_nan=1)),
    (lambda L: L.isclose(L.ones(2, 3), L.ones(4))),
    (lambda L: L.allclose(L.ones(2, 3), L.ones(4))),
]


@pytest.mark.parametrize("fn", CLOSE_ERRORS)
def test_isclose_errors(fn):
    U.assert_same_error(lambda: fn(kiln), lambda: fn(torch), exact=True)


# ---------------------------------------------------------------------------------------- isin


@pytest.mark.parametrize("invert", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_isin(layout, invert):
    e = U.make_pair((4, 5), kiln.int64, layout=layout, low=-5, high=5)
    t = U.make_pair((6,), kiln.int64, seed=1, low=-5, high=5)
    U.check_op(lambda L, x, y: L.isin(x, y, invert=invert), e, t)
    U.check_op(lambda L, x, y: L.isin(x, y, assume_unique=True, invert=invert), t, t)
    U.check_op(lambda L, x, y: L.isin(x, y.reshape(2, 3), invert=invert), e, t)


def test_isin_promotes_and_never_matches_nan():
    U.check_op(
        lambda L, x, y: L.isin(x, y),
        U.make_pair((3,), kiln.int64, values=np.array([1, 2, 3])),
        U.make_pair((2,), kiln.float32, values=np.array([2.0, 3.5])),
    )
    f = U.make_pair((3,), kiln.float64, values=np.array([1.0, NAN, -0.0]))
    U.check_op(lambda L, x, y: L.isin(x, y), f, U.make_pair((3,), kiln.float64, values=np.array([NAN, 0.0, 1.0])))
    U.check_op(
        lambda L, x, y: L.isin(x, y),
        U.make_pair((2,), kiln.uint8, values=np.array([1, 2])),
        U.make_pair((2,), kiln.int8, values=np.array([-1, 2])),
    )
    U.check_op(lambda L, x: L.isin(x, x[:0]), U.make_pair((3,), kiln.int32))
    U.check_op(lambda L, x: L.isin(x, x), U.make_pair((0,), kiln.float32))


def test_isin_with_a_number():
    t = U.make_pair((4,), kiln.int64, values=np.array([1, 2, 2, 5]))
    U.check_op(lambda L, y: L.isin(2, y), t)
    U.check_op(lambda L, x: L.isin(x, 2), t)
    U.check_op(lambda L, x: L.isin(x, 2.5, invert=True), t)


@pytest.mark.parametrize(
    "fn",
    [
        lambda L: L.isin(1, 2),
        lambda L: L.isin(L.tensor([True, False]), L.tensor([1])),
        lambda L: L.isin(L.tensor([1.5]), [1.5]),
        lambda L: L.isin(L.tensor([1]), L.tensor([1]), invert=1),
    ],
)
def test_isin_errors(fn):
    U.assert_same_error(lambda: fn(kiln), lambda: fn(torch))


# ---------------------------------------------------------------------------------------- isreal, signbit


@pytest.mark.parametrize("dtype", U.ALL_DTYPES, ids=U.dtype_id)
def test_isreal_and_signbit_every_dtype(dtype):
    for layout in LAYOUTS:
        a = U.make_pair((3, 4), dtype, layout=layout)
        U.check_op(lambda L, x: L.isreal(x), a)
        U.check_op(lambda L, x: x.signbit(), a)
    U.check_op(lambda L, x: L.signbit(x), U.make_pair((), dtype))
    U.check_op(lambda L, x: L.isreal(x), U.make_pair((0, 2), dtype))


@pytest.mark.parametrize("dtype", [kiln.float16, kiln.bfloat16, kiln.float32, kiln.float64])
def test_signbit_of_negative_zero_and_nan(dtype):
    values = np.array([-0.0, 0.0, -1.0, NAN, -NAN, INF, -INF])
    U.check_op(lambda L, x: L.signbit(x), U.make_pair((7,), dtype, values=values))


@pytest.mark.parametrize("name", ["isreal", "signbit"])
def test_isreal_signbit_want_a_tensor(name):
    U.assert_same_error(lambda: getattr(kiln, name)(1.0), lambda: getattr(torch, name)(1.0), exact=True)
