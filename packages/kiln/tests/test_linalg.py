"""``matmul`` (every broadcasting case of ``torch.matmul``), ``mm`` and ``@`` against PyTorch."""

from __future__ import annotations

import kiln_testutil as U
import pytest
import torch
from hypothesis import given
from hypothesis.extra import numpy as hnp

import kiln

CASES = [
    ((3,), (3,)),  # dot -> 0-d
    ((2, 3), (3,)),  # mv
    ((3,), (3, 4)),  # vm
    ((2, 3), (3, 4)),  # mm
    ((5, 2, 3), (3, 4)),  # batched @ matrix
    ((2, 3), (5, 3, 4)),  # matrix @ batched
    ((5, 2, 3), (5, 3, 4)),  # bmm
    ((5, 1, 2, 3), (4, 3, 2)),  # broadcast batch dims -> (5, 4, 2, 2)
    ((1, 2, 3), (6, 3, 1)),  # broadcast a size-1 batch
    ((3,), (5, 3, 4)),  # 1-D @ batched
    ((5, 2, 3), (3,)),  # batched @ 1-D
    ((2, 1, 3), (3,)),
    ((3,), (2, 2, 3, 1)),
    ((0, 3), (3, 4)),  # empty rows
    ((2, 0), (0, 4)),  # empty contraction -> zeros
    ((0,), (0,)),  # empty dot -> 0
    ((0, 2, 3), (3, 4)),  # empty batch
    ((1, 1), (1, 1)),
]


def _ids(c):
    return "@".join("x".join(map(str, s)) or "0d" for s in c)


@pytest.mark.parametrize(
    "layouts",
    [("contiguous", "contiguous"), ("transposed", "strided"), ("strided", "transposed"), ("expanded", "expanded")],
)
@pytest.mark.parametrize("dtype", U.FLOAT_DTYPES, ids=U.dtype_id)
@pytest.mark.parametrize("shapes", CASES, ids=[_ids(c) for c in CASES])
def test_matmul_cases_forward_backward(shapes, dtype, layouts):
    a = U.make_pair(shapes[0], dtype, layout=layouts[0], seed=1, requires_grad=True)
    b = U.make_pair(shapes[1], dtype, layout=layouts[1], seed=2, requires_grad=True)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype is kiln.float32 else {}
    U.check_op(lambda L, x, y: L.matmul(x, y), a, b, grad_rtol=tol.get("rtol"), grad_atol=tol.get("atol"), **tol)
    U.check_op(lambda L, x, y: x @ y, a, b, grad_rtol=tol.get("rtol"), grad_atol=tol.get("atol"), **tol)
    U.check_op(lambda L, x, y: x.matmul(y), a, b, grad=False, **tol)


@given(
    shapes=hnp.mutually_broadcastable_shapes(
        signature="(m?,n),(n,p?)->(m?,p?)", max_dims=4, min_side=1, max_side=3
    ).map(lambda r: r.input_shapes),
    la=U.layouts,
    lb=U.layouts,
    dtype=U.float_dtypes,
    seed=U.seeds,
)
def test_matmul_hypothesis(shapes, la, lb, dtype, seed):
    """Random batch broadcasting with optional vector dims (numpy's matmul gufunc signature)."""
    a = U.make_pair(shapes[0], dtype, layout=la, seed=seed, requires_grad=True)
    b = U.make_pair(shapes[1], dtype, layout=lb, seed=seed + 1, requires_grad=True)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype is kiln.float32 else {}
    U.check_op(lambda L, x, y: x @ y, a, b, seed=seed, grad_rtol=tol.get("rtol"), grad_atol=tol.get("atol"), **tol)


@pytest.mark.parametrize("dtype", [kiln.float16, kiln.bfloat16, kiln.int64, kiln.int32, kiln.uint8], ids=U.dtype_id)
def test_matmul_other_dtypes_forward(dtype):
    for sa, sb in [((2, 3), (3, 4)), ((3,), (3,)), ((2, 2, 3), (3,))]:
        a = U.make_pair(sa, dtype, seed=1, low=-2, high=2)
        b = U.make_pair(sb, dtype, seed=2, low=-2, high=2)
        U.check_op(lambda L, x, y: x @ y, a, b, grad=False, rtol=2e-2, atol=2e-2)


def test_matmul_bool_and_mixed_dtypes_error():
    U.assert_same_error(
        lambda: kiln.ones(2, 2, dtype=kiln.bool) @ kiln.ones(2, 2, dtype=kiln.bool),
        lambda: torch.ones(2, 2, dtype=torch.bool) @ torch.ones(2, 2, dtype=torch.bool),
    )
    U.assert_same_error(
        lambda: kiln.ones(2, 3) @ kiln.ones(3, 4, dtype=kiln.float64),
        lambda: torch.ones(2, 3) @ torch.ones(3, 4, dtype=torch.float64),
    )


@pytest.mark.parametrize(
    "layouts", [("contiguous", "contiguous"), ("transposed", "transposed"), ("strided", "expanded")]
)
def test_mm(layouts):
    for dtype in U.FLOAT_DTYPES:
        a = U.make_pair((3, 4), dtype, layout=layouts[0], seed=3, requires_grad=True)
        b = U.make_pair((4, 2), dtype, layout=layouts[1], seed=4, requires_grad=True)
        U.check_op(lambda L, x, y: L.mm(x, y), a, b, rtol=1e-5, atol=1e-5)
        U.check_op(lambda L, x, y: x.mm(y), a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sa,sb", [((3,), (3, 4)), ((2, 3), (3,)), ((2, 2, 3), (3, 4)), ((2, 3), (2, 3, 4))])
def test_mm_requires_matrices(sa, sb):
    U.assert_same_error(lambda: kiln.mm(kiln.ones(sa), kiln.ones(sb)), lambda: torch.mm(torch.ones(sa), torch.ones(sb)))


@pytest.mark.parametrize(
    "sa,sb",
    [
        ((2, 3), (4, 5)),
        ((3,), (4,)),
        ((2, 3), (4,)),
        ((3,), (4, 5)),
        ((2, 2, 3), (2, 4, 5)),
        ((2, 2, 3), (4,)),
        ((3,), (2, 4, 5)),
        ((2, 2, 3), (3, 3, 4)),
        ((), (3,)),
    ],
)
def test_matmul_shape_errors(sa, sb):
    U.assert_same_error(lambda: kiln.ones(sa) @ kiln.ones(sb), lambda: torch.ones(sa) @ torch.ones(sb))


def test_matmul_double_backward():
    a = U.make_pair((2, 3), kiln.float64, seed=5, requires_grad=True)
    b = U.make_pair((3, 2), kiln.float64, seed=6, requires_grad=True)

    def fn(L, x, y):
        out = (x @ y).sin().sum()
        (gx,) = L.autograd.grad(out, x, create_graph=True)
        return (gx * gx).sum()

    U.check_op(fn, a, b)
