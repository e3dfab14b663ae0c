"""Elementwise kernels against the reference kernels: every op, dtype and layout (the layouts that the
Numba loops take and the ones they hand back), bit for bit where the reference is exact."""

from __future__ import annotations

import numpy as np
import pytest
from kiln_cpu_helpers import assert_same, make, reference

import kiln
from kiln._ops.relu import _threshold_backward
from kiln_cpu import _jit_elementwise, _opcodes

ARITH = [kiln.float32, kiln.float64, kiln.int32, kiln.int64]
FLOAT = [kiln.float32, kiln.float64]
HALF = [kiln.float16, kiln.bfloat16]  # stored as uint16 bits, computed in float32, rounded back
DTYPES = ARITH + HALF


def _layouts(dtype):
    """name -> (a, b, expected Numba layout or None when the reference must run)."""
    return {
        "contiguous": (make((6, 7), dtype), make((6, 7), dtype, 1), "flat"),
        "transposed": (make((7, 6), dtype).t(), make((7, 6), dtype, 1).t(), "flat"),
        "mixed": (make((6, 7), dtype), make((7, 6), dtype, 1).t(), "strided"),
        "strided": (make((6, 14), dtype)[:, ::2], make((12, 7), dtype, 1)[::2], "strided"),
        "broadcast-row": (make((6, 7), dtype), make((7,), dtype, 1), "strided"),
        "broadcast-outer": (make((6, 1), dtype), make((1, 7), dtype, 1), "strided"),
        "expand": (make((1, 7), dtype).expand(6, 7), make((6, 7), dtype, 1), "strided"),
        "empty": (make((0, 7), dtype), make((0, 7), dtype, 1), "flat"),
        "0-d": (make((), dtype), make((), dtype, 1), "flat"),
        "0-d-other": (make((6, 7), dtype), make((), dtype, 1), "strided"),
        "5-d": (make((2, 3, 2, 3, 2), dtype).permute(4, 3, 2, 1, 0), make((2, 3, 2, 3, 2), dtype, 1), None),
    }


LAYOUTS = list(_layouts(kiln.float32))


def _is_float(a, b):
    return (a if isinstance(a, kiln.Tensor) else b).dtype.is_floating_point


# name -> (function of (a, b), dtypes served by Numba, Numba op code)
BINARY = {
    "add": (lambda a, b: kiln.add(a, b), ARITH + HALF, _opcodes.ADD),
    "add-alpha": (lambda a, b: kiln.add(a, b, alpha=0.5 if _is_float(a, b) else 3), ARITH, _opcodes.ADD_ALPHA),
    "sub": (lambda a, b: kiln.sub(a, b), ARITH + HALF, _opcodes.SUB),
    "sub-alpha": (lambda a, b: kiln.sub(a, b, alpha=-2.5 if _is_float(a, b) else -7), ARITH, _opcodes.SUB_ALPHA),
    "mul": (lambda a, b: kiln.mul(a, b), ARITH + HALF, _opcodes.MUL),
    "div": (lambda a, b: kiln.div(a, b), FLOAT + HALF, _opcodes.DIV),
    "div-floor": (lambda a, b: kiln.div(a, b, rounding_mode="floor"), FLOAT + HALF, _opcodes.FLOOR_DIV),
    "div-trunc": (lambda a, b: kiln.div(a, b, rounding_mode="trunc"), FLOAT + HALF, _opcodes.TRUNC_DIV),
    "maximum": (lambda a, b: kiln.maximum(a, b), FLOAT + HALF, _opcodes.MAXIMUM),
    "minimum": (lambda a, b: kiln.minimum(a, b), FLOAT + HALF, _opcodes.MINIMUM),
    "eq": (lambda a, b: kiln.eq(a, b), FLOAT + HALF, _opcodes.EQ),
    "ne": (lambda a, b: kiln.ne(a, b), FLOAT + HALF, _opcodes.NE),
    "lt": (lambda a, b: kiln.lt(a, b), FLOAT + HALF, _opcodes.LT),
    "le": (lambda a, b: kiln.le(a, b), FLOAT + HALF, _opcodes.LE),
    "gt": (lambda a, b: kiln.gt(a, b), FLOAT + HALF, _opcodes.GT),
    "ge": (lambda a, b: kiln.ge(a, b), FLOAT + HALF, _opcodes.GE),
}


def _half(dtype):
    """What the spy appends for a half-precision loop."""
    return {kiln.float16: (_opcodes.F16,), kiln.bfloat16: (_opcodes.BF16,)}.get(dtype, ())


def _is_int_division(name, dtype):
    return name.startswith("div-") and not dtype.is_floating_point


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(BINARY))
def test_binary_matches_reference(name, dtype, layout, spy):
    fn, served, code = BINARY[name]
    a, b, expected_layout = _layouts(dtype)[layout]
    if _is_int_division(name, dtype):
        b = b.abs() + 1  # the reference raises on integer division by zero
        spy.clear()
    assert_same(fn(a, b), reference(fn, a, b))
    ran = [c for c in spy if c[0] == "binary"]
    if dtype in served and expected_layout is not None:
        assert ran == [("binary", code, expected_layout, *_half(dtype))]
    elif expected_layout is None or dtype not in served:
        assert ran == []


SCALARS = {
    kiln.float32: [2.5, -0.0, float("inf"), float("nan"), 3, True, 1e-50],
    kiln.float64: [2.5, -0.0, float("-inf"), 3, 1e-300],
    kiln.int32: [3, -7, 2**40 + 5, True],
    kiln.int64: [3, -(2**62), -1],
    kiln.float16: [2.5, 0.1, -0.0, float("inf"), float("nan"), 3, 1e-6, 70000.0],
    kiln.bfloat16: [2.5, 0.1, -0.0, float("-inf"), 3, 1e-40, 3e38],
}


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(BINARY))
def test_binary_with_python_scalar(name, dtype, side, spy):
    fn = BINARY[name][0]
    t = make((5, 9), dtype)
    for s in SCALARS[dtype]:
        if _is_int_division(name, dtype) and side == "left":
            t = t.abs() + 1
        if _is_int_division(name, dtype) and side == "right" and s in (0, -0.0):
            continue
        args = (t, s) if side == "right" else (s, t)
        try:
            expected = reference(fn, *args)
        except (TypeError, RuntimeError) as exc:  # what the meta refuses, the kernel never sees
            with pytest.raises(type(exc)):
                fn(*args)
            continue
        assert_same(fn(*args), expected)


@pytest.mark.parametrize("dtype", [kiln.int32, kiln.int64], ids=str)
def test_integer_arithmetic_wraps(dtype):
    info = dtype.numpy.type
    big = kiln.tensor([2**31 - 1 if dtype is kiln.int32 else 2**63 - 1] * 8, dtype=dtype)
    for fn in (lambda a: a + a, lambda a: a * a, lambda a: -a - a, lambda a: kiln.add(a, a, alpha=3)):
        assert_same(fn(big), reference(fn, big))
    assert (big + 1).numpy().dtype == info


def test_floor_division_python_rule():
    a = kiln.tensor([7.0, -7.0, 7.0, -7.0, 0.0, -0.0, 1.0, -1.0, 5.0, float("inf")] * 3)
    b = kiln.tensor([2.0, 2.0, -2.0, -2.0, 3.0, 3.0, 0.0, 0.0, float("inf"), 2.0] * 3)
    fn = lambda x, y: kiln.div(x, y, rounding_mode="floor")
    assert_same(fn(a, b), reference(fn, a, b))


def test_mixed_dtypes_go_to_the_reference(spy):
    a = make((4, 5), kiln.float32)
    for b in (make((4, 5), kiln.float64), make((4, 5), kiln.int32), make((4, 5), kiln.int8)):
        assert_same(a + b, reference(lambda x, y: x + y, a, b))
        assert_same(a < b, reference(lambda x, y: x < y, a, b))
    assert spy == []


def test_result_keeps_the_layout_of_dense_operands():
    a, b = make((7, 6), kiln.float32).t(), make((7, 6), kiln.float32, 1).t()
    out = a + b
    assert out.stride() == a.stride()
    assert out.is_contiguous() is False


# the in-place forms of BINARY's arithmetic ops (``add_``...): their loops write over ``self``
INPLACE_BINARY = {
    "add": lambda a, b: a.add_(b),
    "add-alpha": lambda a, b: a.add_(b, alpha=0.5 if _is_float(a, b) else 3),
    "sub-alpha": lambda a, b: a.sub_(b, alpha=-2.5 if _is_float(a, b) else -7),
    "mul": lambda a, b: a.mul_(b),
    "div": lambda a, b: a.div_(b),
    "div-floor": lambda a, b: a.div_(b, rounding_mode="floor"),
}
# the layouts whose result has self's shape; "flat" results run the in-place flat loop
INPLACE_LAYOUTS = ["contiguous", "transposed", "mixed", "strided", "broadcast-row", "0-d", "0-d-other"]
INPLACE_DTYPES = [kiln.float32, kiln.int64, kiln.bfloat16]


@pytest.mark.parametrize("layout", INPLACE_LAYOUTS)
@pytest.mark.parametrize("dtype", INPLACE_DTYPES, ids=str)
@pytest.mark.parametrize("name", list(INPLACE_BINARY))
def test_binary_in_place_loops_match_out_of_place(name, dtype, layout, spy):
    """``a.add_(b)`` writes, bit for bit, what ``a + b`` computes (checked against the reference above),
    into ``a``'s own memory, in the in-place loops."""
    fn, served, code = BINARY[name]
    a, b, expected_layout = _layouts(dtype)[layout]
    if name == "div" and not dtype.is_floating_point:
        pytest.skip("true division of integers makes a float result, which an integer self cannot take")
    if _is_int_division(name, dtype):
        b = b.abs() + 1
    expected = fn(a, b)
    ptr, version = a.data_ptr(), a._version
    spy.clear()
    assert INPLACE_BINARY[name](a, b) is a
    assert_same(a, expected, layout=False)
    assert (a.data_ptr(), a._version) == (ptr, version + 1)
    ran = [c for c in spy if c[0] == "binary"]
    in_place = {"flat": "flat_inplace", "strided": "strided"}[expected_layout]
    assert ran == ([("binary", code, in_place, *_half(dtype))] if dtype in served else [])


def test_in_place_loops_leave_operands_that_overlap_self_to_numpy(spy):
    """An operand reading ``self``'s memory in other places than ``self`` (where PyTorch lets it: not both
    dense) is not given to a loop that would read values it already overwrote; the same tensor is."""
    base = make((6, 14), kiln.float32)
    a, b = base[:, ::2], base[:, 1::2]
    expected = reference(lambda x, y: x * y, a, b)
    a.mul_(b)
    assert_same(a, expected, layout=False)
    assert spy == []
    x = make((6, 7), kiln.float32)
    expected = reference(lambda t: t + t, x)
    x.add_(x)
    assert_same(x, expected)
    assert [c[2] for c in spy] == ["flat_inplace"]


def test_in_place_variants_use_the_in_place_loops(spy):
    a = make((6, 7), kiln.float32)
    expected = reference(lambda x: x * 2.0 + 1.0, a)
    ptr = a.data_ptr()
    a.mul_(2.0).add_(1.0)
    assert_same(a, expected)
    assert a.data_ptr() == ptr
    assert [c[2] for c in spy] == ["scalar_inplace", "scalar_inplace"]


# ------------------------------------------------------------------------------------------- unary

# name -> (dtypes served, ulps allowed against the reference for float32 / float64, positive inputs)
UNARY = {
    "neg": (ARITH + HALF, 0, 0),
    "abs": (ARITH + HALF, 0, 0),
    "relu": (ARITH + HALF, 0, 0),
    "sqrt": (FLOAT + HALF, 0, 0),
    "exp": (FLOAT + HALF, 4, 2),
    "log": (FLOAT + HALF, 4, 2),
    "sin": (FLOAT + HALF, 4, 2),
    "cos": (FLOAT + HALF, 4, 2),
    "tanh": (FLOAT + HALF, 4, 2),
    "sigmoid": (FLOAT + HALF, 4, 2),
    "erf": (FLOAT + HALF, 4, 4),
}


def _unary_layouts(dtype):
    return {
        "contiguous": (make((6, 7), dtype), "flat"),
        "transposed": (make((7, 6), dtype).t(), "flat"),
        "strided": (make((6, 14), dtype)[:, 1::2], "strided"),
        "expand": (make((1, 7), dtype).expand(6, 7), "strided"),
        "empty": (make((3, 0), dtype), "flat"),
        "0-d": (make((), dtype), "flat"),
        "5-d": (make((2, 3, 2, 4, 2), dtype).permute(4, 3, 2, 1, 0)[:, ::2], None),
    }


@pytest.mark.parametrize("layout", list(_unary_layouts(kiln.float32)))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(UNARY))
def test_unary_matches_reference(name, dtype, layout, spy):
    served, ulps32, ulps64 = UNARY[name]
    x, expected_layout = _unary_layouts(dtype)[layout]
    fn = getattr(kiln, name)
    # half precision: the float32 result within ulps32 of the reference's, rounded once more, lands at
    # most one half-precision ulp away
    ulps = ulps32 if dtype is kiln.float32 else ulps64 if dtype is kiln.float64 else min(ulps32, 1)
    # the reference's float32 sigmoid underflows to 0 where the exact value is a denormal
    atol = 1e-37 if name == "sigmoid" else 0.0
    # the reference erf computes on a flat float64 copy, so its result is always row-major (PyTorch's and
    # kiln-cpu's keep the input's layout)
    assert_same(fn(x), reference(fn, x), ulps=ulps, atol=atol, layout=name != "erf")
    ran = [c for c in spy if c[0] == "unary"]
    if dtype in served and expected_layout is not None:
        assert ran == [("unary", getattr(_opcodes, name.upper()), expected_layout, *_half(dtype))]
    else:
        assert ran == []


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided", "0-d"])
@pytest.mark.parametrize("dtype", INPLACE_DTYPES, ids=str)
@pytest.mark.parametrize("name", ["neg", "abs", "relu", "sqrt", "exp", "sigmoid"])
def test_unary_in_place_loops_match_out_of_place(name, dtype, layout, spy):
    served = UNARY[name][0]
    x, expected_layout = _unary_layouts(dtype)[layout]
    if dtype not in served:
        pytest.skip(f"{name} of {dtype} makes another dtype or runs the reference")
    expected = getattr(kiln, name)(x)
    ptr = x.data_ptr()
    spy.clear()
    assert getattr(x, f"{name}_")() is x
    assert_same(x, expected, layout=False)
    assert x.data_ptr() == ptr
    in_place = {"flat": "flat_inplace", "strided": "strided"}[expected_layout]
    assert [c for c in spy if c[0] == "unary"] == [("unary", getattr(_opcodes, name.upper()), in_place, *_half(dtype))]


@pytest.mark.parametrize("code", [_opcodes.EXP, _opcodes.NEG])
def test_unary_flat_loop_covers_any_range(code):
    """The flat loop of a transcendental runs in blocks that prefetch the next: a range starting and
    ending inside blocks gets every element, and nothing outside it is written."""
    x = np.random.default_rng(0).standard_normal(3 * 1024 + 77).astype(np.float32)
    out = np.full_like(x, 7.0)
    lo, hi = 5, x.size - 3
    _jit_elementwise.unary(code, "flat")(x, out, lo, hi)
    fn = kiln.exp if code == _opcodes.EXP else kiln.neg
    expected = reference(fn, kiln.from_numpy(x[lo:hi].copy())).numpy()
    np.testing.assert_array_max_ulp(out[lo:hi], expected, maxulp=4)
    assert (out[:lo] == 7.0).all() and (out[hi:] == 7.0).all()


@pytest.mark.parametrize("layout", list(_unary_layouts(kiln.float32)))
@pytest.mark.parametrize("dtype", FLOAT + HALF, ids=str)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_matches_reference(approximate, dtype, layout, spy):
    from kiln._ops.activation import gelu

    x, expected_layout = _unary_layouts(dtype)[layout]
    fn = lambda t: gelu(t, approximate=approximate)
    # 1 + erf(x/sqrt 2) and 1 + tanh(...) cancel for negative x: a last-bit difference in erf or tanh
    # (within the ulps of test_unary_matches_reference) shows there as an absolute error below these
    atol = {kiln.float32: 1e-6, kiln.float64: 1e-15}.get(dtype, 0.0)
    # as for erf, the reference's exact gelu comes out row-major (kiln-cpu's, like PyTorch's, keeps the layout)
    assert_same(
        fn(x),
        reference(fn, x),
        ulps={kiln.float32: 1, kiln.float64: 4}.get(dtype, 0),
        atol=atol,
        layout=approximate == "tanh",
    )
    code = _opcodes.GELU if approximate == "none" else _opcodes.GELU_TANH
    ran = [c for c in spy if c[0] == "unary"]
    assert ran == ([("unary", code, expected_layout, *_half(dtype))] if expected_layout else [])


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "mixed", "strided"])
@pytest.mark.parametrize("dtype", FLOAT + HALF, ids=str)
def test_relu_backward_matches_reference(dtype, layout, spy):
    """``_threshold_backward(grad, output)``: the gradient where the output is positive (NaN outputs and
    -0.0 give 0), in the output's layout rules."""
    grad, out, expected_layout = _layouts(dtype)[layout]
    assert_same(_threshold_backward(grad, out), reference(_threshold_backward, grad, out))
    assert [c for c in spy if c[0] == "binary"] == [("binary", _opcodes.RELU_GRAD, expected_layout, *_half(dtype))]


def test_relu_backward_through_autograd(spy):
    x = make((64, 33), kiln.float32).requires_grad_()
    kiln.relu(x).backward(make((64, 33), kiln.float32, 1))
    expected = reference(lambda t: kiln.autograd.grad(kiln.relu(t), t, make((64, 33), kiln.float32, 1))[0], x)
    assert_same(x.grad, expected)
    assert ("binary", _opcodes.RELU_GRAD, "flat") in spy


# ----------------------------------------------------------------------------------------- dropout


@pytest.fixture
def dropout_spy(monkeypatch):
    calls: list[tuple] = []
    real = _jit_elementwise.dropout
    monkeypatch.setattr(_jit_elementwise, "dropout", lambda *a: calls.append(a) or real(*a))
    return calls


@pytest.mark.parametrize("p", [0.0, 0.3, 0.5, 1.0 - 1e-7])
@pytest.mark.parametrize("dtype", FLOAT + HALF, ids=str)
def test_fused_dropout_matches_reference(dtype, p, dropout_spy):
    from kiln._ops.dropout import _fused_dropout

    x = make((37, 29), dtype)
    u = kiln.rand(37, 29, dtype=kiln.float64)
    got, expected = _fused_dropout(x, u, p), reference(_fused_dropout, x, u, p)
    assert_same(got[0], expected[0])  # the output, NaN and inf of x included
    assert_same(got[1], expected[1])  # the scaled mask the backward multiplies by
    assert len(dropout_spy) == 1


def test_fused_dropout_hands_back_other_layouts(dropout_spy):
    from kiln._ops.dropout import _fused_dropout

    x = make((29, 37), kiln.float32).t()
    u = kiln.rand(37, 29, dtype=kiln.float64)
    got, expected = _fused_dropout(x, u, 0.5), reference(_fused_dropout, x, u, 0.5)
    assert_same(got[0], expected[0])
    assert dropout_spy == []


def test_dropout_through_autograd(dropout_spy):
    from kiln._ops.dropout import _fused_dropout, dropout

    x = make((64, 33), kiln.float32).requires_grad_()
    kiln.manual_seed(5)
    y = dropout(x, 0.4)
    y.backward(kiln.ones(64, 33))
    kiln.manual_seed(5)  # the same draws: dropout takes them from kiln's generator
    out, noise = reference(_fused_dropout, x.detach(), kiln.rand(64, 33, dtype=kiln.float64), 0.4)
    assert_same(y.detach(), out)
    assert_same(x.grad, noise)  # d(sum(x * noise))/dx
    assert len(dropout_spy) == 1
