"""Elementwise ops against PyTorch: arithmetic, unary math, comparisons, bitwise ops, ``where``,
Python operators (and their reflected forms), broadcasting, layouts, scalars and type promotion."""

# ruff: noqa: B023 - lambdas made inside loops are called within the same iteration

from __future__ import annotations

import operator

import kiln_testutil as U
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import kiln

# ---------------------------------------------------------------------------------------- binary, float, fwd+bwd

# name -> (fn(lib, a, b), (low, high) for a, (low, high) for b)
BINARY_FLOAT = {
    "add": (lambda L, a, b: L.add(a, b), None, None),
    "add alpha": (lambda L, a, b: L.add(a, b, alpha=2.5), None, None),
    "sub": (lambda L, a, b: L.sub(a, b), None, None),
    "sub alpha": (lambda L, a, b: a.sub(b, alpha=-1.5), None, None),
    "mul": (lambda L, a, b: L.mul(a, b), None, None),
    "div": (lambda L, a, b: L.div(a, b), None, (0.5, 3.0)),
    "div trunc": (lambda L, a, b: L.div(a, b, rounding_mode="trunc"), None, (0.5, 3.0)),
    "div floor": (lambda L, a, b: L.div(a, b, rounding_mode="floor"), None, (0.5, 3.0)),
    "pow": (lambda L, a, b: L.pow(a, b), (0.5, 2.0), (-2.0, 2.0)),
    "maximum": (lambda L, a, b: L.maximum(a, b), None, None),
    "minimum": (lambda L, a, b: L.minimum(a, b), None, None),
    "max binary": (lambda L, a, b: L.max(a, b), None, None),
    "min binary": (lambda L, a, b: L.min(a, b), None, None),
    "where": (lambda L, a, b: L.where(a > 0, a, b), None, None),
    "add operator": (lambda L, a, b: a + b, None, None),
    "sub operator": (lambda L, a, b: a - b, None, None),
    "mul operator": (lambda L, a, b: a * b, None, None),
    "div operator": (lambda L, a, b: a / b, None, (0.5, 3.0)),
    "pow operator": (lambda L, a, b: a**b, (0.5, 2.0), (-2.0, 2.0)),
}


def _bounds(b):
    return {} if b is None else {"low": b[0], "high": b[1]}


@pytest.mark.parametrize("name", list(BINARY_FLOAT))
@given(shapes=U.broadcastable_shapes(), la=U.layouts, lb=U.layouts, dtype=U.float_dtypes, seed=U.seeds)
def test_binary_float_forward_backward(name, shapes, la, lb, dtype, seed):
    fn, ba, bb = BINARY_FLOAT[name]
    a = U.make_pair(shapes[0], dtype, layout=la, seed=seed, requires_grad=True, **_bounds(ba))
    b = U.make_pair(shapes[1], dtype, layout=lb, seed=seed + 1, requires_grad=True, **_bounds(bb))
    U.check_op(fn, a, b, seed=seed)


@pytest.mark.parametrize("name", ["add", "mul", "sub", "div", "maximum", "pow"])
@pytest.mark.parametrize(
    "da,db",
    [
        (kiln.float32, kiln.float64),
        (kiln.float64, kiln.float32),
        (kiln.float16, kiln.float32),
        (kiln.bfloat16, kiln.float16),
    ],
    ids=lambda d: U.dtype_id(d),
)
def test_binary_mixed_float_dtypes_backward(name, da, db):
    """Mixed-precision operands: the result is promoted and each input's gradient has its own dtype."""
    fn, ba, bb = BINARY_FLOAT[name]
    a = U.make_pair((2, 3), da, seed=1, requires_grad=True, **_bounds(ba or (0.5, 2.0)))
    b = U.make_pair((3,), db, seed=2, requires_grad=True, **_bounds(bb))
    U.check_op(fn, a, b, rtol=1e-2, atol=1e-2, grad_rtol=1e-2, grad_atol=1e-2)


def test_binary_mixed_int_float_backward():
    """Only the floating operand of an int/float op gets a gradient, in its own dtype."""
    x = U.make_pair((2, 3), kiln.float32, seed=3, requires_grad=True)
    n = U.make_pair((3,), kiln.int64, seed=4)
    for fn in (
        lambda L, a, b: a * b,
        lambda L, a, b: b - a,
        lambda L, a, b: a / (b.abs() + 1),
        lambda L, a, b: L.maximum(a, b),
    ):
        U.check_op(fn, x, n)


# ---------------------------------------------------------------------------------------- binary, all dtypes, forward

BINARY_ANY = {
    "add": lambda L, a, b: L.add(a, b),
    "add_alpha2": lambda L, a, b: L.add(a, b, alpha=2),
    "sub": lambda L, a, b: L.sub(a, b),
    "mul": lambda L, a, b: L.mul(a, b),
    "div": lambda L, a, b: L.div(a, b),
    "div_trunc": lambda L, a, b: L.div(a, b, rounding_mode="trunc"),
    "div_floor": lambda L, a, b: L.div(a, b, rounding_mode="floor"),
    "floordiv_op": lambda L, a, b: a // b,
    "maximum": lambda L, a, b: L.maximum(a, b),
    "minimum": lambda L, a, b: L.minimum(a, b),
    "eq": lambda L, a, b: L.eq(a, b),
    "ne": lambda L, a, b: a != b,
    "lt": lambda L, a, b: L.lt(a, b),
    "le": lambda L, a, b: a <= b,
    "gt": lambda L, a, b: L.gt(a, b),
    "ge": lambda L, a, b: a >= b,
    "bitwise_and": lambda L, a, b: L.bitwise_and(a, b),
    "bitwise_or": lambda L, a, b: a | b,
    "bitwise_xor": lambda L, a, b: a ^ b,
    "where": lambda L, a, b: L.where(a > b, a, b),
}


@pytest.mark.parametrize("name", list(BINARY_ANY))
def test_binary_all_dtype_pairs_forward(name):
    """Every (dtype, dtype) pair: result dtype = torch's promotion, values equal, errors alike."""
    U.check_all_dtype_pairs(BINARY_ANY[name])


@pytest.mark.parametrize(
    "name", ["add", "sub", "mul", "div", "div_floor", "maximum", "eq", "lt", "bitwise_or", "where"]
)
@given(
    shapes=U.broadcastable_shapes(),
    la=U.layouts,
    lb=U.layouts,
    seed=U.seeds,
    da=st.sampled_from(U.ALL_DTYPES),
    db=st.sampled_from(U.ALL_DTYPES),
)
def test_binary_any_dtype_broadcast_layouts(name, shapes, la, lb, seed, da, db):
    a = U.make_pair(shapes[0], da, layout=la, seed=seed)
    b = U.make_pair(shapes[1], db, layout=lb, seed=seed + 1, low=1, high=4)
    U.check_op(BINARY_ANY[name], a, b, grad=False, rtol=1e-2, atol=1e-2)


# ---------------------------------------------------------------------------------------- 0-d operands / type promotion


@pytest.mark.parametrize("name", ["add", "mul", "div", "maximum", "eq", "where"])
def test_zero_dim_tensor_promotion(name):
    """A 0-d tensor is weaker than a dimensioned one of the same category (torch.result_type rules)."""
    fn = BINARY_ANY[name]
    results = {}
    for da in U.ALL_DTYPES:
        for db in U.ALL_DTYPES:
            a = U.make_pair((3,), da, seed=1, low=1, high=4)
            b = U.make_pair((), db, seed=2, low=1, high=4)
            results[f"dim {U.dtype_id(da)} with 0-d {U.dtype_id(db)}"] = U.mismatch(
                fn, a, b, grad=False, rtol=1e-2, atol=1e-2
            )
            results[f"0-d {U.dtype_id(db)} with dim {U.dtype_id(da)}"] = U.mismatch(
                fn, b, a, grad=False, rtol=1e-2, atol=1e-2
            )
            c = U.make_pair((), da, seed=3, low=1, high=4)
            results[f"0-d {U.dtype_id(da)} with 0-d {U.dtype_id(db)}"] = U.mismatch(
                fn, c, b, grad=False, rtol=1e-2, atol=1e-2
            )
    U.report(results)


# ---------------------------------------------------------------------------------------- python scalars

SCALARS = [2, -3, 0, 2.5, -0.5, True, False]
SCALAR_OPS = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "truediv": operator.truediv,
    "floordiv": operator.floordiv,
    "pow": operator.pow,
    "eq": operator.eq,
    "lt": operator.lt,
    "ge": operator.ge,
    "and": operator.and_,
    "or": operator.or_,
    "xor": operator.xor,
}


@pytest.mark.parametrize("side", ["tensor_op_scalar", "scalar_op_tensor"])
@pytest.mark.parametrize("opname", list(SCALAR_OPS))
def test_python_scalar_operands(opname, side):
    """Python scalars are weak: ``int_tensor * 2.5`` is float32, ``float16 + 1.0`` stays float16,
    ``bool + 1`` is int64; reflected operators (``2 - t``, ``2 / t``, ``2 ** t``) included."""
    op = SCALAR_OPS[opname]
    results = {}
    for d in U.ALL_DTYPES:
        for s in SCALARS:
            x = U.make_pair((2, 3), d, seed=5, low=1, high=3)
            if side == "tensor_op_scalar":
                fn = lambda L, t, s=s: op(t, s)
            else:
                fn = lambda L, t, s=s: op(s, t)
            results[f"{U.dtype_id(d)} {opname} {s!r}"] = U.mismatch(fn, x, grad=False, rtol=1e-2, atol=1e-2)
    U.report(results)


@pytest.mark.parametrize("side", ["tensor_op_scalar", "scalar_op_tensor"])
@pytest.mark.parametrize("opname", ["add", "sub", "mul", "truediv", "pow"])  # torch cannot differentiate //
@pytest.mark.parametrize("layout", U.LAYOUTS)
def test_python_scalar_operands_backward(opname, side, layout):
    op = SCALAR_OPS[opname]
    for dtype in U.FLOAT_DTYPES:
        for s in (2, 2.5, -1.5):
            x = U.make_pair((3, 4), dtype, layout=layout, seed=7, low=0.5, high=2.0, requires_grad=True)
            fn = (lambda L, t, s=s: op(t, s)) if side == "tensor_op_scalar" else (lambda L, t, s=s: op(s, t))
            U.check_op(fn, x)


@pytest.mark.parametrize(
    "case",
    [
        ("int64 * 2.5", lambda L: L.tensor([1, 2]) * 2.5),
        ("int32 + 1", lambda L: L.tensor([1, 2], dtype=L.int32) + 1),
        ("uint8 + 1", lambda L: L.tensor([1, 2], dtype=L.uint8) + 1),
        ("int8 + 1000 (wraps)", lambda L: L.tensor([1, 2], dtype=L.int8) + 1000),
        ("uint8 - 3 (wraps)", lambda L: L.tensor([1, 2], dtype=L.uint8) - 3),
        ("float16 + 1.0", lambda L: L.tensor([1.5, 2.0], dtype=L.float16) + 1.0),
        ("bfloat16 * 3", lambda L: L.tensor([1.5, 2.0], dtype=L.bfloat16) * 3),
        ("bool + 1", lambda L: L.tensor([True, False]) + 1),
        ("bool + True", lambda L: L.tensor([True, False]) + True),
        ("bool * 2.5", lambda L: L.tensor([True, False]) * 2.5),
        ("int / int", lambda L: L.tensor([3, 4]) / L.tensor([2, 8])),
        ("int / 2", lambda L: L.tensor([3, 4]) / 2),
        ("2 / int", lambda L: 2 / L.tensor([3, 4])),
        ("int // 2", lambda L: L.tensor([-3, 4]) // 2),
        ("int ** 2", lambda L: L.tensor([-3, 4]) ** 2),
        ("int ** 0.5", lambda L: L.tensor([9, 4]) ** 0.5),
        ("2 ** int", lambda L: 2 ** L.tensor([3, 4])),
        ("2.5 ** int", lambda L: 2.5 ** L.tensor([3, 4])),
        ("float32 + 0-d float64 tensor", lambda L: L.tensor([1.5]) + L.tensor(2.0, dtype=L.float64)),
        ("int32 + 0-d int64 tensor", lambda L: L.tensor([1], dtype=L.int32) + L.tensor(2)),
        ("int64 + 0-d float64 tensor", lambda L: L.tensor([1]) + L.tensor(2.0, dtype=L.float64)),
        ("int8 + 0-d float16 tensor", lambda L: L.tensor([1], dtype=L.int8) + L.tensor(2.0, dtype=L.float16)),
        ("0-d int + 2.5", lambda L: L.tensor(3) + 2.5),
        ("0-d float16 + 0-d float32", lambda L: L.tensor(3.0, dtype=L.float16) + L.tensor(1.0)),
        ("uint8 + int8 tensor", lambda L: L.tensor([200], dtype=L.uint8) + L.tensor([-1], dtype=L.int8)),
        ("float16 + bfloat16", lambda L: L.tensor([1.5], dtype=L.float16) + L.tensor([1.5], dtype=L.bfloat16)),
        ("int tensor == 2.5", lambda L: L.tensor([2, 3]) == 2.5),
        ("float32 < int64 tensor", lambda L: L.tensor([2.5, 3.0]) < L.tensor([3, 3])),
    ],
    ids=lambda c: c[0],
)
def test_weak_scalar_type_promotion(case):
    _, fn = case
    t = fn(torch)
    k = fn(kiln)
    U.assert_close(k, t)


# ---------------------------------------------------------------------------------------- unary

UNARY = {
    "neg": (lambda L, x: L.neg(x), None),
    "neg operator": (lambda L, x: -x, None),
    "negative": (lambda L, x: x.negative(), None),
    "abs": (lambda L, x: L.abs(x), None),
    "abs builtin": (lambda L, x: abs(x), None),
    "sign": (lambda L, x: L.sign(x), None),
    "exp": (lambda L, x: L.exp(x), None),
    "log": (lambda L, x: L.log(x), (0.1, 3.0)),
    "sqrt": (lambda L, x: L.sqrt(x), (0.1, 3.0)),
    "sin": (lambda L, x: L.sin(x), None),
    "cos": (lambda L, x: x.cos(), None),
    "tanh": (lambda L, x: L.tanh(x), None),
    "sigmoid": (lambda L, x: L.sigmoid(x), None),
    "relu": (lambda L, x: L.relu(x), None),
}


@pytest.mark.parametrize("name", list(UNARY))
@given(shape=U.shapes(), layout=U.layouts, dtype=U.float_dtypes, seed=U.seeds)
def test_unary_float_forward_backward(name, shape, layout, dtype, seed):
    fn, bounds = UNARY[name]
    x = U.make_pair(shape, dtype, layout=layout, seed=seed, requires_grad=True, **_bounds(bounds))
    U.check_op(fn, x, seed=seed)


UNARY_ANY = dict(
    {k: v[0] for k, v in UNARY.items()},
    isnan=lambda L, x: L.isnan(x),
    logical_not=lambda L, x: L.logical_not(x),
    bitwise_not=lambda L, x: L.bitwise_not(x),
    invert_op=lambda L, x: ~x,
)


@pytest.mark.parametrize("name", list(UNARY_ANY))
def test_unary_all_dtypes_forward(name):
    """Integer inputs of float math give the default float dtype; neg/abs/sign/relu keep ints; bool
    rules and errors follow torch."""
    fn = UNARY_ANY[name]
    results = {}
    for d in U.ALL_DTYPES:
        for shape in ((2, 3), (), (0, 2)):
            x = U.make_pair(shape, d, seed=3, low=0.5 if name in ("log", "sqrt") else -3, high=3)
            results[f"{U.dtype_id(d)} {shape}"] = U.mismatch(fn, x, grad=False)
    U.report(results)


def test_unary_special_values():
    vals = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -1e30, 88.0, -88.0, 100.0, -100.0])
    results = {}
    for d in (kiln.float16, kiln.bfloat16, kiln.float32, kiln.float64):
        for name, fn in UNARY_ANY.items():
            if name in ("bitwise_not", "invert_op"):
                continue
            x = U.make_pair(vals.shape, d, values=vals)
            results[f"{name} {U.dtype_id(d)}"] = U.mismatch(fn, x, grad=False)
    U.report(results)


@pytest.mark.parametrize("name", ["abs", "relu", "sign", "sqrt", "maximum_tie", "minimum_tie", "pow_zero_base"])
def test_gradient_at_kinks(name):
    """Gradients where the derivative is a convention (abs'(0)=0, relu'(0)=0, ties split in half...)."""
    for dtype in U.FLOAT_DTYPES:
        if name == "maximum_tie" or name == "minimum_tie":
            a = U.make_pair((4,), dtype, values=[1.0, 2.0, -1.0, 0.0], requires_grad=True)
            b = U.make_pair((4,), dtype, values=[1.0, 3.0, -1.0, -2.0], requires_grad=True)
            fn = (lambda L, x, y: L.maximum(x, y)) if name == "maximum_tie" else (lambda L, x, y: L.minimum(x, y))
            U.check_op(fn, a, b)
            continue
        x = U.make_pair((3,), dtype, values=[0.0, 1.0, -1.0], requires_grad=True)
        fn = {
            "abs": lambda L, x: L.abs(x),
            "relu": lambda L, x: L.relu(x),
            "sign": lambda L, x: L.sign(x),
            "sqrt": lambda L, x: L.sqrt(x.abs()),
            "pow_zero_base": lambda L, x: L.pow(x, 2.0) + L.pow(x, 0) + x**1,
        }[name]
        U.check_op(fn, x)


# ---------------------------------------------------------------------------------------- division / pow details


def test_integer_division_rounding():
    a = np.array([-7, -6, -1, 0, 1, 6, 7, 9], dtype=np.int64)
    b = np.array([2, -2, 3, -3, 4, 5, -4, 3], dtype=np.int64)
    for d in U.INT_DTYPES[1:]:
        x = U.make_pair(a.shape, d, values=a)
        y = U.make_pair(b.shape, d, values=b)
        for mode in (None, "trunc", "floor"):
            U.check_op(lambda L, p, q: L.div(p, q, rounding_mode=mode), x, y, grad=False)
        U.check_op(lambda L, p, q: p // q, x, y, grad=False)
        U.check_op(lambda L, p, q: p // 2, x, y, grad=False)
        U.check_op(lambda L, p, q: -7 // q, x, y, grad=False)


def test_float_division_rounding_and_zero():
    a = np.array([-7.5, -6.0, -1.0, 0.0, 1.0, 6.5, 7.0, 0.0, -3.0, 3.0])
    b = np.array([2.0, -2.0, 3.0, -3.0, 4.0, 5.0, -4.0, 0.0, 0.0, 0.0])
    for d in (kiln.float16, kiln.float32, kiln.float64):
        x = U.make_pair(a.shape, d, values=a)
        y = U.make_pair(b.shape, d, values=b)
        for mode in (None, "trunc", "floor"):
            U.check_op(lambda L, p, q: L.div(p, q, rounding_mode=mode), x, y, grad=False)
        U.check_op(lambda L, p, q: p // q, x, y, grad=False)
        U.check_op(lambda L, p, q: 1.0 / q, x, y, grad=False)


def test_integer_division_by_zero():
    """Integer floor/trunc division by zero raises torch's RuntimeError; true division gives inf/nan."""
    for mode in ("trunc", "floor"):
        U.assert_same_error(
            lambda: kiln.div(kiln.tensor([1, 2]), kiln.tensor([1, 0]), rounding_mode=mode),
            lambda: torch.div(torch.tensor([1, 2]), torch.tensor([1, 0]), rounding_mode=mode),
        )
    x = U.make_pair((3,), kiln.int64, values=[1, 0, -1])
    y = U.make_pair((3,), kiln.int64, values=[0, 0, 0])
    U.check_op(lambda L, p, q: p / q, x, y, grad=False)


@pytest.mark.parametrize(
    "case",
    [
        ("float ** 2", lambda L, x: x**2),
        ("float ** 0", lambda L, x: x**0),
        ("float ** -1", lambda L, x: x**-1),
        ("float ** 0.5", lambda L, x: x.abs() ** 0.5),
        ("float ** 3.0", lambda L, x: L.pow(x, 3.0)),
        ("float ** 1", lambda L, x: x.pow(1)),
        ("2 ** float", lambda L, x: 2**x),
        ("2.5 ** float", lambda L, x: 2.5**x),
        ("0.5 ** float", lambda L, x: L.pow(0.5, x)),
        ("1 ** float", lambda L, x: 1**x),
        ("float ** float", lambda L, x: x.abs() ** x),
        ("float ** 0-d", lambda L, x: x ** L.tensor(2.0, dtype=x.dtype)),
        ("0-d ** float", lambda L, x: L.tensor(2.0, dtype=x.dtype) ** x),
    ],
    ids=lambda c: c[0],
)
def test_pow_forms_forward_backward(case):
    _, fn = case
    for dtype in U.FLOAT_DTYPES:
        x = U.make_pair((2, 3), dtype, seed=11, low=0.25, high=2.0, requires_grad=True)
        U.check_op(fn, x)


POW_SPECIAL_VALUES = [0.0, -0.0, 1.0, -1.0, 0.3, -2.5, 1e-20, 3e15, -3e15, float("inf"), -float("inf"), float("nan")]


@pytest.mark.parametrize("dtype", U.FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("exponent", [2, 3.0, 0.5, -0.5, -1, -2])
def test_pow_number_exponents_on_special_values(exponent, dtype):
    """The exponents computed without the general pow (x*x, x*x*x, sqrt, 1/sqrt, 1/x, 1/(x*x)) give
    PyTorch's results on zeros of both signs, infinities, NaN, negatives, underflow and overflow.
    (PyTorch's float16 and bfloat16 kernels follow no one rule at these values, so they are not swept.)"""
    name = str(dtype).split(".")[-1]
    U.check_op(lambda L: L.tensor(POW_SPECIAL_VALUES, dtype=getattr(L, name)) ** exponent, grad=False)


@pytest.mark.parametrize(
    "case",
    [
        ("int ** 2", lambda L: L.tensor([-2, 3, 0]) ** 2),
        ("int ** 0", lambda L: L.tensor([-2, 3, 0]) ** 0),
        ("int ** int tensor", lambda L: L.tensor([-2, 3, 0]) ** L.tensor([3, 2, 1])),
        ("int ** 2.0", lambda L: L.tensor([-2, 3, 0]) ** 2.0),
        ("2 ** int", lambda L: 2 ** L.tensor([0, 3, 5])),
        ("int8 ** 2 overflow", lambda L: L.tensor([100, -12], dtype=L.int8) ** 2),
        ("uint8 ** 3", lambda L: L.tensor([2, 7], dtype=L.uint8) ** 3),
        ("bool ** 2", lambda L: L.tensor([True, False]) ** 2),
        ("int ** -1 (error)", lambda L: L.tensor([1, 2]) ** -1),
        (
            "int ** tensor with negatives (no error, torch gives 0/1/-1)",
            lambda L: L.tensor([1, 2, -1, 3]) ** L.tensor([-1, -2, -3, 2]),
        ),
        ("float // float forward", lambda L: L.tensor([7.5, -7.5]) // L.tensor([2.0, 2.0])),
        ("0.0 ** -1", lambda L: L.tensor([0.0, -0.0]) ** -1),
        ("negative ** 0.5", lambda L: L.tensor([-4.0]) ** 0.5),
    ],
    ids=lambda c: c[0],
)
def test_pow_integer_and_special(case):
    _, fn = case
    U.check_op(lambda L: fn(L), grad=False)


# ---------------------------------------------------------------------------------------- comparisons, bitwise

COMPARISONS = {
    "eq": lambda L, a, b: L.eq(a, b),
    "ne": lambda L, a, b: L.ne(a, b),
    "lt": lambda L, a, b: L.lt(a, b),
    "le": lambda L, a, b: L.le(a, b),
    "gt": lambda L, a, b: L.gt(a, b),
    "ge": lambda L, a, b: L.ge(a, b),
    "==": lambda L, a, b: a == b,
    "!=": lambda L, a, b: a != b,
    "<": lambda L, a, b: a < b,
    "<=": lambda L, a, b: a <= b,
    ">": lambda L, a, b: a > b,
    ">=": lambda L, a, b: a >= b,
    "method_ge": lambda L, a, b: a.ge(b),
}


@pytest.mark.parametrize("name", list(COMPARISONS))
@given(
    shapes=U.broadcastable_shapes(),
    la=U.layouts,
    lb=U.layouts,
    seed=U.seeds,
    da=st.sampled_from(U.ALL_DTYPES),
    db=st.sampled_from(U.ALL_DTYPES),
)
def test_comparisons(name, shapes, la, lb, seed, da, db):
    # small integer-valued data so that equality actually happens
    a = U.make_pair(shapes[0], da, layout=la, seed=seed, low=-2, high=2, integral=True)
    b = U.make_pair(shapes[1], db, layout=lb, seed=seed + 1, low=-2, high=2, integral=True)
    U.check_op(COMPARISONS[name], a, b, grad=False)


@pytest.mark.parametrize("name", ["==", "<", ">=", "!="])
def test_comparisons_with_scalars_and_grad(name):
    fn = COMPARISONS[name]
    x = U.make_pair((2, 3), kiln.float32, values=[[1.0, 2.0, 3.0], [0.5, 2.0, -1.0]], requires_grad=True)
    for s in (2, 2.0, True, -1):
        k, t = U.check_op(lambda L, a, s=s: fn(L, a, s), x, grad=False)
        assert k.requires_grad is False and t.requires_grad is False
        U.check_op(lambda L, a, s=s: fn(L, s, a), x, grad=False)  # reflected: 2 < t is t > 2


def test_comparison_nan():
    v = [np.nan, 1.0, np.nan]
    w = [np.nan, np.nan, 2.0]
    x = U.make_pair((3,), kiln.float32, values=v)
    y = U.make_pair((3,), kiln.float32, values=w)
    for fn in COMPARISONS.values():
        U.check_op(fn, x, y, grad=False)


BITWISE = {
    "bitwise_and": lambda L, a, b: L.bitwise_and(a, b),
    "bitwise_or": lambda L, a, b: L.bitwise_or(a, b),
    "bitwise_xor": lambda L, a, b: L.bitwise_xor(a, b),
    "&": lambda L, a, b: a & b,
    "|": lambda L, a, b: a | b,
    "^": lambda L, a, b: a ^ b,
}


@pytest.mark.parametrize("name", list(BITWISE))
def test_bitwise_dtype_pairs(name):
    fn = BITWISE[name]
    results = {}
    for da in U.ALL_DTYPES:
        for db in U.ALL_DTYPES:
            a = U.make_pair((2, 3), da, seed=1, low=-8, high=8)
            b = U.make_pair((3,), db, seed=2, low=-8, high=8)
            results[f"{U.dtype_id(da)},{U.dtype_id(db)}"] = U.mismatch(fn, a, b, grad=False)
    U.report(results)


@pytest.mark.parametrize("name", ["&", "|", "^"])
def test_bitwise_scalars_and_reflected(name):
    fn = BITWISE[name]
    results = {}
    for d in U.NON_FLOAT_DTYPES:
        for s in (3, -1, True, False, 2.5):
            x = U.make_pair((4,), d, seed=3, low=-8, high=8)
            results[f"{U.dtype_id(d)} {name} {s!r}"] = U.mismatch(lambda L, a, s=s: fn(L, a, s), x, grad=False)
            results[f"{s!r} {name} {U.dtype_id(d)}"] = U.mismatch(lambda L, a, s=s: fn(L, s, a), x, grad=False)
    U.report(results)


def test_bitwise_not_and_invert():
    for d in U.NON_FLOAT_DTYPES:
        x = U.make_pair((5,), d, seed=4, low=-8, high=8)
        U.check_op(lambda L, a: ~a, x, grad=False)
        U.check_op(lambda L, a: L.bitwise_not(a), x, grad=False)
        U.check_op(lambda L, a: L.logical_not(a), x, grad=False)
    for d in (kiln.float32, kiln.float64):
        x = U.make_pair((5,), d, seed=4)
        U.assert_same_error(lambda: ~x.k, lambda: ~x.t)


def test_isnan():
    vals = [np.nan, 0.0, np.inf, -np.inf, 1.0]
    for d in (kiln.float16, kiln.bfloat16, kiln.float32, kiln.float64):
        x = U.make_pair((5,), d, values=vals)
        U.check_op(lambda L, a: L.isnan(a), x, grad=False)
        U.check_op(lambda L, a: a.isnan(), x, grad=False)
    x = U.make_pair((5,), kiln.float32, values=vals, requires_grad=True)
    k, _ = U.check_op(lambda L, a: L.isnan(a), x, grad=False)
    assert k.requires_grad is False


# ---------------------------------------------------------------------------------------- where


@given(
    shapes=U.broadcastable_shapes(num_shapes=3),
    layouts=st.tuples(U.layouts, U.layouts, U.layouts),
    dtype=U.float_dtypes,
    seed=U.seeds,
)
def test_where_broadcast_forward_backward(shapes, layouts, dtype, seed):
    c = U.make_pair(shapes[0], kiln.bool, layout=layouts[0], seed=seed)
    x = U.make_pair(shapes[1], dtype, layout=layouts[1], seed=seed + 1, requires_grad=True)
    y = U.make_pair(shapes[2], dtype, layout=layouts[2], seed=seed + 2, requires_grad=True)
    U.check_op(lambda L, c, x, y: L.where(c, x, y), c, x, y, seed=seed)
    U.check_op(lambda L, c, x, y: x.where(c, y), c, x, y, seed=seed)


@pytest.mark.parametrize(
    "case",
    [
        ("scalar other", lambda L, c, x: L.where(c, x, 0.0)),
        ("scalar input", lambda L, c, x: L.where(c, 2.5, x)),
        ("int scalar other", lambda L, c, x: L.where(c, x, 1)),
        ("both scalars", lambda L, c, x: L.where(c, 1.0, 0.0) * x),
        ("int tensor and float scalar", lambda L, c, x: L.where(c, L.tensor([1, 2, 3]), 0.5)),
        ("int tensor and int scalar", lambda L, c, x: L.where(c, L.tensor([1, 2, 3], dtype=L.int32), 7)),
        ("float32 and float64", lambda L, c, x: L.where(c, x, L.tensor([1.0, 2.0, 3.0], dtype=L.float64))),
        ("0-d cond", lambda L, c, x: L.where(L.tensor(True), x, -x)),
        ("uint8 cond", lambda L, c, x: L.where(c.to(L.uint8), x, -x)),
        ("float cond (error)", lambda L, c, x: L.where(c.to(x.dtype), x, -x)),
    ],
    ids=lambda c: c[0],
)
def test_where_scalars_and_promotion(case):
    _, fn = case
    c = U.make_pair((3,), kiln.bool, values=[True, False, True])
    x = U.make_pair((3,), kiln.float32, seed=2, requires_grad=True)
    U.check_op(fn, c, x)


# ---------------------------------------------------------------------------------------- empty / 0-d / alias names


@pytest.mark.parametrize(
    "fn",
    [
        lambda L, a, b: a + b,
        lambda L, a, b: a * b,
        lambda L, a, b: L.maximum(a, b),
        lambda L, a, b: L.where(a > b, a, b),
        lambda L, a, b: (a / b.abs().add(1)).exp(),
    ],
)
@pytest.mark.parametrize(
    "sa,sb", [((0,), (0,)), ((0, 3), (3,)), ((2, 0), (1, 0)), ((), (0,)), ((4, 1, 0), (3, 1)), ((), ())]
)
def test_empty_and_zero_dim_broadcasting(fn, sa, sb):
    a = U.make_pair(sa, kiln.float32, seed=1, requires_grad=True)
    b = U.make_pair(sb, kiln.float32, seed=2, requires_grad=True)
    U.check_op(fn, a, b)


@pytest.mark.parametrize(
    "name",
    [
        "absolute",
        "multiply",
        "subtract",
        "divide",
        "true_divide",
        "greater",
        "greater_equal",
        "less",
        "less_equal",
        "not_equal",
        "negative",
    ],
)
def test_function_aliases(name):
    x = U.make_pair((2, 3), kiln.float32, seed=1, low=0.5, high=2, requires_grad=True)
    y = U.make_pair((3,), kiln.float32, seed=2, low=0.5, high=2, requires_grad=True)
    if name in ("absolute", "negative"):
        U.check_op(lambda L, a, b: getattr(L, name)(a), x, y)
    else:
        U.check_op(lambda L, a, b: getattr(L, name)(a, b), x, y)


IEEE_CASES = {
    "x / 0": lambda L: L.tensor([1.0, -1.0, 0.0]) / 0,
    "x / zeros": lambda L: L.tensor([1.0, 0.0]) / L.zeros(2),
    "int / 0": lambda L: L.tensor([1, 0]) / 0,
    "x // 0": lambda L: L.tensor([1.0, 0.0]) // 0.0,
    "log(0), log(-1)": lambda L: L.log(L.tensor([0.0, -1.0])),
    "sqrt(-1)": lambda L: L.sqrt(L.tensor([-1.0])),
    "0 ** -1": lambda L: L.tensor([0.0]) ** -1,
    "(-8) ** 0.5": lambda L: L.tensor([-8.0]) ** 0.5,
    "exp overflow": lambda L: L.exp(L.tensor([1000.0])),
    "float16 overflow": lambda L: L.tensor([60000.0], dtype=L.float16) * 10,
    "inf - inf": lambda L: L.tensor([float("inf")]) - float("inf"),
    "sigmoid(-1000)": lambda L: L.sigmoid(L.tensor([-1000.0])),
    "mean of empty": lambda L: L.zeros(0).mean(),
    # the one-ufunc paths (two tensors of the result's dtype; a unary ufunc; an in-place write)
    "tensor + tensor overflow": lambda L: L.tensor([3e38, 1.0]) + L.tensor([3e38, 1.0]),
    "inf - inf tensors": lambda L: L.tensor([float("inf")]) - L.tensor([float("inf")]),
    "tensor * tensor overflow": lambda L: L.tensor([3e38]) * L.tensor([10.0]),
    "log(-1), log(0)": lambda L: L.log(L.tensor([-1.0, 0.0])),
    "add_ overflow": lambda L: L.tensor([3e38]).add_(L.tensor([3e38])),
    "mul_ inf * 0": lambda L: L.tensor([float("inf")]).mul_(L.tensor([0.0])),
}


@pytest.mark.parametrize("name", list(IEEE_CASES))
def test_ieee_special_results_are_silent(name):
    """inf/nan results are computed silently, as in torch (no NumPy RuntimeWarning leaks to users)."""
    import warnings

    fn = IEEE_CASES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = fn(torch)
        k = fn(kiln)
    U.assert_close(k, t)


def test_silent_ops_leave_numpy_warning_and_run_in_threads():
    """The quiet one-ufunc paths keep NumPy's warnings off in a context of their own: the user's NumPy still
    warns after them, and threads running them at once (NumPy releases the GIL in its loops) each get their
    own context, which cannot be entered twice."""
    import threading
    import warnings

    big = kiln.full((100_000,), 3e38)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert bool((big + big).isinf().all())
        with pytest.raises(RuntimeWarning, match="overflow"):
            np.multiply(np.float32(3e38), np.float32(10))
    errors, results = [], []

    def work():
        try:
            x = kiln.zeros(100_000)
            for _ in range(200):
                x.add_(big)
                results.append(bool((big * big).exp().isinf().all()))
            results.append(bool(x.isinf().all()))
        except Exception as exc:  # noqa: BLE001 - any error in a thread is what the test looks for
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and len(results) == 4 * 201 and all(results)


class _CallsKiln(np.ndarray):
    """An ndarray subclass whose ufunc hook runs a kiln op (Python code inside the ufunc call)."""

    calls = 0

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        _CallsKiln.calls += 1
        kiln.ones(2) + kiln.ones(2)  # re-enters the quiet paths
        inputs = tuple(np.asarray(i) if isinstance(i, _CallsKiln) else i for i in inputs)
        if "out" in kwargs:
            kwargs["out"] = tuple(np.asarray(o) for o in kwargs["out"])
        return getattr(ufunc, method)(*inputs, **kwargs)


def test_quiet_paths_take_plain_arrays_only():
    """A tensor over an ndarray subclass whose ufunc hook calls kiln (or a memmap's) leaves the quiet
    one-ufunc paths for the reference's own: Python code inside the quiet context could re-enter it."""
    data = np.arange(1, 5, dtype=np.float32)
    t = kiln.from_numpy(data.copy().view(_CallsKiln))
    for fn, want in (
        (lambda: -t, -data),
        (lambda: t.sqrt(), np.sqrt(data)),
        (lambda: t + t, data + data),
        (lambda: kiln.ones(4).mul_(t), data),
        (lambda: kiln.from_numpy(np.ones(4, np.float32).view(_CallsKiln)).add_(t), data + 1),
    ):
        before = _CallsKiln.calls
        np.testing.assert_array_equal(fn().numpy(), want)
        assert _CallsKiln.calls > before  # the hook ran, inside the ufunc


def test_quiet_context_keeps_no_context_variable_alive():
    """The quiet context starts empty: a context variable's value set when a thread first runs a kiln op
    is not kept alive by it after the thread resets the variable."""
    import contextvars
    import gc
    import threading
    import weakref

    var = contextvars.ContextVar("request")

    class Request:
        pass

    alive = []

    def handle():
        request = Request()
        ref = weakref.ref(request)
        token = var.set(request)
        kiln.ones(4) + kiln.ones(4)  # this thread's first kiln op makes its quiet context
        var.reset(token)
        del request
        gc.collect()
        alive.append(ref() is not None)

    thread = threading.Thread(target=handle)
    thread.start()
    thread.join(timeout=60)
    assert alive == [False]


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x * 0.3001,
        lambda x: 0.3001 * x,
        lambda x: x / 0.3001,
        lambda x: x // 0.3001,
        lambda x: 0.3001 / x,
        lambda x: x + 0.3001,
        lambda x: x - 0.3001,
        lambda x: 0.3001 - x,
        lambda x: x < 0.3001,
    ],
    ids=["mul", "rmul", "div", "floordiv", "rdiv", "add", "sub", "rsub", "lt"],
)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_python_scalar_meets_low_precision_as_in_pytorch(fn, dtype):
    """mul and div keep a Python float in float32 for half-precision tensors, the other ops round it to
    the tensor's dtype first, and ``s / x`` is ``x.reciprocal() * s``: bit for bit PyTorch's results."""
    x = (torch.rand(4096, dtype=torch.float64) * 6 + 0.25).to(getattr(torch, dtype))
    k = kiln.from_numpy(x.double().numpy()).to(getattr(kiln, dtype))
    expected, got = fn(x), fn(k)
    if expected.dtype != torch.bool:
        expected = expected.double()
        got = got.double()
    np.testing.assert_array_equal(got.numpy(), expected.numpy())
