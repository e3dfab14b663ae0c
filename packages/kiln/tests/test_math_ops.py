"""Elementwise math ops of ``kiln._ops.unary_math``, ``special``, ``binary_math``, ``clamp`` and
``ternary_math`` against PyTorch: forward values and dtypes (type promotion,
integer and bool inputs), backward, special values (inf, NaN, -0.0, huge and tiny), gradcheck and
gradgradcheck, in-place variants, methods, operators and aliases, and error types and messages."""

# ruff: noqa: B023 - lambdas made inside loops are called within the same iteration

from __future__ import annotations

import math
import operator

import kiln_testutil as U
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kiln

FEW = settings(max_examples=15)  # per op: the op table multiplies the examples

# ---------------------------------------------------------------------------------------- unary

# name -> (fn(lib, x), (low, high) for random inputs or None)
UNARY = {
    "exp2": (lambda L, x: L.exp2(x), None),
    "expm1": (lambda L, x: L.expm1(x), None),
    "log2": (lambda L, x: L.log2(x), (0.1, 3.0)),
    "log10": (lambda L, x: L.log10(x), (0.1, 3.0)),
    "log1p": (lambda L, x: L.log1p(x), (-0.9, 3.0)),
    "rsqrt": (lambda L, x: L.rsqrt(x), (0.1, 3.0)),
    "reciprocal": (lambda L, x: L.reciprocal(x), (0.3, 3.0)),
    "square": (lambda L, x: L.square(x), None),
    "tan": (lambda L, x: L.tan(x), (-1.2, 1.2)),
    "asin": (lambda L, x: L.asin(x), (-0.95, 0.95)),
    "acos": (lambda L, x: L.acos(x), (-0.95, 0.95)),
    "atan": (lambda L, x: L.atan(x), None),
    "sinh": (lambda L, x: L.sinh(x), None),
    "cosh": (lambda L, x: L.cosh(x), None),
    "asinh": (lambda L, x: L.asinh(x), None),
    "acosh": (lambda L, x: L.acosh(x), (1.1, 3.0)),
    "atanh": (lambda L, x: L.atanh(x), (-0.95, 0.95)),
    "erf": (lambda L, x: L.erf(x), None),
    "erfc": (lambda L, x: L.erfc(x), None),
    "erfinv": (lambda L, x: L.erfinv(x), (-0.95, 0.95)),
    "logit": (lambda L, x: L.logit(x), (0.05, 0.95)),
    "logit eps": (lambda L, x: L.logit(x, eps=0.2), (0.0, 1.0)),
    "logit eps kw": (lambda L, x: x.logit(eps=1e-3), (0.0, 1.0)),
    "floor": (lambda L, x: L.floor(x), None),
    "ceil": (lambda L, x: L.ceil(x), None),
    "trunc": (lambda L, x: L.trunc(x), None),
    "fix": (lambda L, x: L.fix(x), None),
    "round": (lambda L, x: L.round(x), None),
    "round decimals=2": (lambda L, x: L.round(x, decimals=2), None),
    "round decimals=-1": (lambda L, x: L.round(x * 40, decimals=-1), None),
    "frac": (lambda L, x: L.frac(x), None),
    "sgn": (lambda L, x: L.sgn(x) * x, None),  # times x: torch's own sgn gradient is a ZeroTensor
    "nan_to_num": (lambda L, x: L.nan_to_num(x), None),
    "nan_to_num args": (lambda L, x: L.nan_to_num(x.log(), nan=1.5, posinf=2.0, neginf=-3.0), (-1.0, 1.0)),
    "arcsin": (lambda L, x: L.arcsin(x), (-0.95, 0.95)),
    "arccos": (lambda L, x: x.arccos(), (-0.95, 0.95)),
    "arctan": (lambda L, x: x.arctan(), None),
    "arcsinh": (lambda L, x: L.arcsinh(x), None),
    "arccosh": (lambda L, x: x.arccosh(), (1.1, 3.0)),
    "arctanh": (lambda L, x: L.arctanh(x), (-0.95, 0.95)),
    "isinf": (lambda L, x: L.isinf(x), None),
    "isposinf": (lambda L, x: L.isposinf(x), None),
    "isneginf": (lambda L, x: x.isneginf(), None),
    "isfinite": (lambda L, x: x.isfinite(), None),
    "positive": (lambda L, x: L.positive(x) * 1, None),
    "+x": (lambda L, x: (+x) * 1, None),
}


def _bounds(b):
    return {} if b is None else {"low": b[0], "high": b[1]}


@pytest.mark.parametrize("name", list(UNARY))
@FEW
@given(shape=U.shapes(), layout=U.layouts, dtype=U.float_dtypes, seed=U.seeds)
def test_unary_forward_backward(name, shape, layout, dtype, seed):
    fn, bounds = UNARY[name]
    x = U.make_pair(shape, dtype, layout=layout, seed=seed, requires_grad=True, **_bounds(bounds))
    U.check_op(fn, x, seed=seed)


@pytest.mark.parametrize("name", list(UNARY))
def test_unary_all_dtypes_forward(name):
    """Integer and bool inputs of floating functions give the default float dtype; rounding keeps
    integers; square of bool is int64; refusals (bool floor, integer frac...) raise torch's type."""
    fn, bounds = UNARY[name]
    results = {}
    for d in U.ALL_DTYPES:
        tol = {"rtol": 1e-2, "atol": 1e-2} if d in U.HALF_DTYPES else {}
        for shape in ((2, 3), (), (0, 2)):
            x = U.make_pair(shape, d, seed=3, **_bounds(bounds or (-3.0, 3.0)))
            results[f"{U.dtype_id(d)} {shape}"] = U.mismatch(fn, x, grad=False, **tol)
    U.report(results)


SPECIALS = np.array(
    [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, -0.5, 2.5, -2.5, 1e-8, -1e-8, 1e-300, 5e-324]
    + [1e-40, 3e38, -3e38, 1e300, -1e300, 0.9999999, -0.9999999, 1.0000001, 20.0, -20.0, 100.0, 1e6]
)


def _exact_specials(k: kiln.Tensor, t: torch.Tensor, msg: str = "", **tol) -> None:
    """Values within tolerance, and exactly torch's where torch's result is inf, NaN or a signed zero."""
    U.assert_close(k, t, msg=msg, **tol)
    if not t.dtype.is_floating_point:
        return
    ka, ta = U.kiln_to_np(k).astype(np.float64), U.torch_to_np(t).astype(np.float64)
    special = ~np.isfinite(ta)
    np.testing.assert_array_equal(ka[special], ta[special], err_msg=f"{msg}inf/nan")
    zero = ta == 0
    np.testing.assert_array_equal(np.signbit(ka[zero]), np.signbit(ta[zero]), err_msg=f"{msg}sign of zero")


def _special_pair(values, dtype, requires_grad=False):
    limit = {kiln.float16: 6e4, kiln.bfloat16: 1e38, kiln.float32: 1e38}.get(dtype)
    if limit is not None:  # huge values within range of the dtype
        values = np.where(np.isfinite(values) & (np.abs(values) > limit), np.sign(values) * limit / 2, values)
    return U.make_pair(np.shape(values), dtype, values=values, requires_grad=requires_grad)


@pytest.mark.parametrize("name", [n for n in UNARY if not n.startswith(("arc", "+", "positive", "logit eps kw"))])
def test_unary_special_values(name):
    """inf, NaN, signed zeros, subnormals, domain edges (0, ±1) and huge values, forward and backward."""
    fn, _ = UNARY[name]
    results = {}
    for d in (kiln.float16, kiln.bfloat16, kiln.float32, kiln.float64):
        x = _special_pair(SPECIALS, d, requires_grad=d in U.FLOAT_DTYPES)
        tol = {"rtol": 1e-2, "atol": 1e-2} if d in U.HALF_DTYPES else {}
        try:
            k_out, t_out = fn(kiln, x.k), fn(torch, x.t)
            _exact_specials(k_out, t_out, **tol)
            if t_out.requires_grad:
                if name.startswith("logit"):
                    # torch's logit gradient kernel treats NaN and -0.0 differently in its vectorised body and
                    # its scalar tail; its double-backward formula is kiln's (and the vectorised body's) rule
                    g = torch.ones_like(t_out)
                    (t_grad,) = torch.autograd.grad(t_out, x.t_leaf, g, create_graph=True)
                    (k_grad,) = kiln.autograd.grad(k_out, x.k_leaf, kiln.ones_like(k_out))
                    _exact_specials(k_grad, t_grad.detach(), msg="grad: ")
                    continue
                _backward_ones(k_out, t_out)
                _exact_specials(x.k_leaf.grad, x.t_leaf.grad, msg="grad: ")
        except AssertionError as exc:
            results[U.dtype_id(d)] = str(exc)
    U.report(results)


def _backward_ones(k_out: kiln.Tensor, t_out: torch.Tensor) -> None:
    g = np.ones(tuple(t_out.shape), dtype=k_out.dtype.numpy)
    t_out.backward(U.np_to_torch(g))
    k_out.backward(kiln.tensor(g, dtype=k_out.dtype))


def test_erf_family_accuracy_against_math():
    """The float64 erf/erfc are within a few ulp of C's (``math.erf``), erfinv inverts erf to ~1e-15."""
    rng = U.rng_for(0)
    xs = np.concatenate(
        [rng.uniform(-6, 6, 4000), rng.uniform(-28, 28, 1000), rng.standard_normal(500) * 1e-3, [0.999, 1.0, 8.0]]
    )
    k = kiln.tensor(xs, dtype=kiln.float64)
    got_erf, got_erfc = kiln.erf(k).numpy(), kiln.erfc(k).numpy()
    want_erf = np.array([math.erf(v) for v in xs])
    want_erfc = np.array([math.erfc(v) for v in xs])
    np.testing.assert_allclose(got_erf, want_erf, rtol=4e-16 * 8, atol=0)
    np.testing.assert_allclose(got_erfc, want_erfc, rtol=4e-15, atol=1e-320)
    ys = np.concatenate([rng.uniform(-1, 1, 4000), 1 - 10.0 ** rng.uniform(-15.9, -1, 500), [1 - 2**-53, -0.5]])
    inv = kiln.erfinv(kiln.tensor(ys, dtype=kiln.float64)).numpy()
    np.testing.assert_allclose(inv, torch.erfinv(torch.from_numpy(ys)).numpy(), rtol=5e-15, atol=0)
    back = np.array([math.erf(v) for v in inv])
    np.testing.assert_allclose(back, ys, rtol=0, atol=5e-16)


# ---------------------------------------------------------------------------------------- binary, floating fwd+bwd

# name -> (fn(lib, a, b), (low, high) for a, (low, high) for b)
BINARY = {
    "atan2": (lambda L, a, b: L.atan2(a, b), None, None),
    "arctan2": (lambda L, a, b: a.arctan2(b), None, None),
    "hypot": (lambda L, a, b: L.hypot(a, b), None, None),
    "copysign": (lambda L, a, b: L.copysign(a, b), None, None),
    "fmod": (lambda L, a, b: L.fmod(a, b), None, (0.5, 3.0)),
    "fmod neg": (lambda L, a, b: L.fmod(a, -b), None, (0.5, 3.0)),
    "remainder": (lambda L, a, b: L.remainder(a, b), None, (0.5, 3.0)),
    "remainder neg": (lambda L, a, b: L.remainder(a, -b), None, (0.5, 3.0)),
    "%": (lambda L, a, b: a % b, None, (0.5, 3.0)),
    "clamp_min": (lambda L, a, b: L.clamp_min(a, b), None, None),
    "clamp_max": (lambda L, a, b: a.clamp_max(b), None, None),
    "clamp min=": (lambda L, a, b: L.clamp(a, min=b), None, None),
    "clamp max=": (lambda L, a, b: L.clamp(a, max=b), None, None),
    "clamp both": (lambda L, a, b: L.clamp(a, b, b + 0.5), None, None),
    "clamp crossed": (lambda L, a, b: L.clamp(a, b, b - 0.5), None, None),
    "clip": (lambda L, a, b: L.clip(a, b - 1, b), None, None),
    "lerp scalar": (lambda L, a, b: L.lerp(a, b, 0.3), None, None),
    "lerp scalar big": (lambda L, a, b: L.lerp(a, b, 0.75), None, None),
    "lerp tensor": (lambda L, a, b: L.lerp(a, b, b.sigmoid() * 1.4 - 0.2), None, None),
    "addcmul": (lambda L, a, b: L.addcmul(a, b, b.exp(), value=0.5), None, None),
    "addcmul method": (lambda L, a, b: a.addcmul(a, b), None, None),
    "addcdiv": (lambda L, a, b: L.addcdiv(a, a.cos(), b, value=-2), None, (0.5, 3.0)),
    "addcdiv method": (lambda L, a, b: b.addcdiv(a, b), None, (0.5, 3.0)),
    "logical_and": (lambda L, a, b: L.logical_and(a, b.round()), None, None),
    "logical_or": (lambda L, a, b: L.logical_or(a.round(), b), None, None),
    "logical_xor": (lambda L, a, b: a.round().logical_xor(b.round()), None, None),
}


@pytest.mark.parametrize("name", list(BINARY))
@FEW
@given(shapes=U.broadcastable_shapes(), la=U.layouts, lb=U.layouts, dtype=U.float_dtypes, seed=U.seeds)
def test_binary_forward_backward(name, shapes, la, lb, dtype, seed):
    fn, ba, bb = BINARY[name]
    a = U.make_pair(shapes[0], dtype, layout=la, seed=seed, requires_grad=True, **_bounds(ba))
    b = U.make_pair(shapes[1], dtype, layout=lb, seed=seed + 1, requires_grad=True, **_bounds(bb))
    U.check_op(fn, a, b, seed=seed)


@FEW
@given(
    shapes=U.broadcastable_shapes(3, min_side=1),
    seed=U.seeds,
    dtype=U.float_dtypes,
    value=st.sampled_from([1, -0.5, 2.0]),
)
def test_ternary_broadcast_backward(shapes, seed, dtype, value):
    """lerp, addcmul, addcdiv and clamp with three broadcast tensor operands (no empty ones: torch's
    own backward of a 0-d ``input`` broadcast to an empty result fails)."""
    a = U.make_pair(shapes[0], dtype, seed=seed, requires_grad=True)
    b = U.make_pair(shapes[1], dtype, seed=seed + 1, requires_grad=True, layout="transposed")
    c = U.make_pair(shapes[2], dtype, seed=seed + 2, requires_grad=True, low=0.5, high=2.0)
    U.check_op(lambda L, x, y, z: L.addcmul(x, y, z, value=value), a, b, c, seed=seed)
    U.check_op(lambda L, x, y, z: L.addcdiv(x, y, z, value=value), a, b, c, seed=seed)
    U.check_op(lambda L, x, y, z: L.lerp(x, y, z - 1), a, b, c, seed=seed)
    # torch's own clamp backward fails when the bounds broadcast ``input`` to a larger shape
    full = np.broadcast_shapes(*shapes) == tuple(shapes[0])
    U.check_op(lambda L, x, y, z: L.clamp(x, y, z), a, b, c, seed=seed, grad=full)


def test_floor_divide_forward_and_no_derivative():
    """floor_divide matches torch and, as in torch, its backward refuses."""
    for dtype in U.FLOAT_DTYPES:
        a = U.make_pair((3, 4), dtype, seed=1, requires_grad=True)
        b = U.make_pair((4,), dtype, seed=2, low=-3.0, high=3.0)
        U.check_op(lambda L, x, y: L.floor_divide(x, y), a, b, grad=False)
        U.check_op(lambda L, x, y: x.floor_divide(y), a, b, grad=False)
        U.check_op(lambda L, x, y: L.floor_divide(2.5, y), a, b, grad=False)
        U.assert_same_error(
            lambda: kiln.floor_divide(a.k, b.k).sum().backward(),
            lambda: torch.floor_divide(a.t, b.t).sum().backward(),
        )
        # remainder(Number, Tensor) has no derivative for the tensor either
        c = U.make_pair((4,), dtype, seed=3, requires_grad=True, low=0.5, high=2)
        U.assert_same_error(
            lambda: kiln.remainder(2.0, c.k).sum().backward(), lambda: torch.remainder(2.0, c.t).sum().backward()
        )
        U.check_op(lambda L, y: L.remainder(5, y), c, grad=False)


# ---------------------------------------------------------------------------------------- binary, all dtypes forward

BINARY_ANY = {
    "atan2": lambda L, a, b: L.atan2(a, b),
    "hypot": lambda L, a, b: L.hypot(a, b),
    "copysign": lambda L, a, b: L.copysign(a, b),
    "fmod": lambda L, a, b: L.fmod(a, b),
    "remainder": lambda L, a, b: L.remainder(a, b),
    "floor_divide": lambda L, a, b: L.floor_divide(a, b),
    "clamp_min": lambda L, a, b: L.clamp_min(a, b),
    "clamp_max": lambda L, a, b: L.clamp_max(a, b),
    "clamp": lambda L, a, b: L.clamp(a, b, b),
    "clamp min=": lambda L, a, b: L.clamp(a, min=b),
    "lerp": lambda L, a, b: L.lerp(a, b, 0.5),
    "lerp tensor": lambda L, a, b: L.lerp(a, a, b),
    "addcmul": lambda L, a, b: L.addcmul(a, b, b, value=2),
    "addcmul 3 dtypes": lambda L, a, b: L.addcmul(b, a, b),
    "addcdiv": lambda L, a, b: L.addcdiv(a, b, b),
    "addcdiv 3 dtypes": lambda L, a, b: L.addcdiv(b, a, b, value=0.5),
    "logical_and": lambda L, a, b: L.logical_and(a, b),
    "logical_or": lambda L, a, b: L.logical_or(a, b),
    "logical_xor": lambda L, a, b: L.logical_xor(a, b),
    "bitwise_left_shift": lambda L, a, b: L.bitwise_left_shift(a, b),
    "bitwise_right_shift": lambda L, a, b: L.bitwise_right_shift(a, b),
    "<<": lambda L, a, b: a << b,
    ">>": lambda L, a, b: a >> b,
}


@pytest.mark.parametrize("name", list(BINARY_ANY))
def test_binary_all_dtype_pairs_forward(name):
    """Every (dtype, dtype) pair: torch's result dtype, values, and refusals (bool, integer kernels...)."""
    U.check_all_dtype_pairs(BINARY_ANY[name])


SCALAR_OPS = {
    "copysign": lambda L, t, s: L.copysign(t, s),
    "fmod": lambda L, t, s: L.fmod(t, s),
    "remainder": lambda L, t, s: L.remainder(t, s),
    "rremainder": lambda L, t, s: L.remainder(s, t),
    "%": operator.mod,
    "r%": lambda L, t, s: s % t,
    "floor_divide": lambda L, t, s: L.floor_divide(t, s),
    "rfloor_divide": lambda L, t, s: L.floor_divide(s, t),
    "clamp_min": lambda L, t, s: L.clamp_min(t, s),
    "clamp_max": lambda L, t, s: t.clamp_max(s),
    "clamp min": lambda L, t, s: L.clamp(t, min=s),
    "clamp both": lambda L, t, s: L.clamp(t, s, 2),
    "clip": lambda L, t, s: t.clip(max=s),
    "<<": operator.lshift,
    ">>": operator.rshift,
    "r<<": lambda L, t, s: s << t,
    "r>>": lambda L, t, s: s >> t,
    "bitwise_left_shift": lambda L, t, s: L.bitwise_left_shift(t, s),
    "rbitwise_right_shift": lambda L, t, s: L.bitwise_right_shift(s, t),
}


@pytest.mark.parametrize("name", list(SCALAR_OPS))
def test_python_scalar_operands(name):
    """Python scalars are weak (``int8_tensor % 3`` stays int8, ``int_tensor % 2.5`` is float32) and wrap
    into integer dtypes; reflected forms included."""
    fn = SCALAR_OPS[name]
    results = {}
    for d in U.ALL_DTYPES:
        for s in (2, -3, 3, 2.5, -0.5, True, 0):
            x = U.make_pair((2, 3), d, seed=5, low=1, high=3)
            tol = {"rtol": 1e-2, "atol": 1e-2} if d in U.HALF_DTYPES else {}
            results[f"{U.dtype_id(d)} {s!r}"] = U.mismatch(lambda L, t: fn(L, t, s), x, grad=False, **tol)
    U.report(results)


@pytest.mark.parametrize("name", ["copysign", "fmod", "remainder", "clamp_min", "clamp_max", "clamp min"])
@pytest.mark.parametrize("layout", U.LAYOUTS)
def test_python_scalar_operands_backward(name, layout):
    fn = SCALAR_OPS[name]
    for dtype in U.FLOAT_DTYPES:
        for s in (2, 1.5, -0.5):
            x = U.make_pair((3, 4), dtype, layout=layout, seed=7, requires_grad=True)
            U.check_op(lambda L, t: fn(L, t, s), x)


def test_integer_modulo_and_floor_division():
    """Signs of remainders and quotients for negative operands, in every integer dtype."""
    a = np.repeat(np.arange(-7, 8), 6)
    b = np.tile(np.array([-3, -2, -1, 1, 2, 3]), 15)
    for d in U.INT_DTYPES:
        if d is kiln.uint8:
            x = U.make_pair(a.shape, d, values=np.abs(a))
            y = U.make_pair(b.shape, d, values=np.abs(b))
        else:
            x, y = U.make_pair(a.shape, d, values=a), U.make_pair(b.shape, d, values=b)
        for fn in (
            lambda L, p, q: L.fmod(p, q),
            lambda L, p, q: L.remainder(p, q),
            lambda L, p, q: p % q,
            lambda L, p, q: L.floor_divide(p, q),
            lambda L, p, q: L.fmod(p, -2),
            lambda L, p, q: L.remainder(p, -2),
            lambda L, p, q: L.remainder(-7, q),
        ):
            U.check_op(fn, x, y, grad=False)


def test_integer_division_by_zero():
    """Integer fmod/remainder/floor_divide by zero raise torch's RuntimeError; empty results do not."""
    for fn in (
        lambda L: L.fmod(L.tensor([1, 2]), L.tensor([1, 0])),
        lambda L: L.fmod(L.tensor([1, 2]), 0),
        lambda L: L.remainder(L.tensor([1, 2], dtype=L.int8), L.tensor([0, 1], dtype=L.int8)),
        lambda L: L.remainder(5, L.tensor([0, 1])),
        lambda L: L.tensor([3]) % 0,
        lambda L: L.floor_divide(L.tensor([1, 2]), 0),
    ):
        U.assert_same_error(lambda: fn(kiln), lambda: fn(torch))
    for fn in (
        lambda L: L.fmod(L.ones(0, dtype=L.int64), 0),
        lambda L: L.remainder(L.ones(0, 3, dtype=L.int32), L.zeros(3, dtype=L.int32)),
        lambda L: L.fmod(L.tensor([1.0, -1.0, 0.0]), 0),
        lambda L: L.remainder(L.tensor([1.0, -1.0, 0.0]), 0.0),
    ):
        U.assert_close(fn(kiln), fn(torch))


# (not 1e-300 with 1e300: torch's vectorised float64 fmod returns NaN where the quotient overflows)
BINARY_SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 2.5, -2.5, 1e-30, 1e30, -7.0, 3.0])


@pytest.mark.parametrize(
    "name",
    [
        "atan2",
        "hypot",
        "copysign",
        "fmod",
        "remainder",
        "floor_divide",
        "clamp_min",
        "clamp_max",
        "lerp",
        "addcmul",
        "addcdiv",
        "logical_and",
        "logical_xor",
    ],
)
def test_binary_special_values(name):
    """Every pair of special values (inf, NaN, ±0, huge, tiny), forward exactly as torch, and backward."""
    fn = {
        "lerp": lambda L, a, b: L.lerp(a, b, a.abs().clamp_max(2)),
        "addcmul": lambda L, a, b: L.addcmul(a, a, b),
        "addcdiv": lambda L, a, b: L.addcdiv(b, a, b),
    }.get(name) or BINARY_ANY[name]
    n = len(BINARY_SPECIALS)
    av0, bv0 = np.repeat(BINARY_SPECIALS, n), np.tile(BINARY_SPECIALS, n)
    results = {}
    for d in (kiln.float16, kiln.float32, kiln.float64):
        av, bv = av0, bv0
        if name in ("fmod", "remainder"):  # torch's vectorised fmod gives NaN where |a / b| overflows
            with np.errstate(all="ignore"):
                q = np.abs(av.astype(d.numpy).astype(np.float64) / bv.astype(d.numpy).astype(np.float64))
            keep = ~(np.isfinite(av) & np.isfinite(bv) & (bv != 0) & (q > float(np.finfo(np.float64).max) / 2))
            if d is not kiln.float64:
                keep &= ~(np.isfinite(av) & (bv != 0) & (q > 3e38))
            av, bv = av[keep], bv[keep]
        grad = d in U.FLOAT_DTYPES and name != "floor_divide"
        a, b = _special_pair(av, d, requires_grad=grad), _special_pair(bv, d, requires_grad=grad)
        tol = {"rtol": 1e-2, "atol": 1e-2} if d in U.HALF_DTYPES else {}
        try:
            k_out, t_out = fn(kiln, a.k, b.k), fn(torch, a.t, b.t)
            _exact_specials(k_out, t_out, **tol)
            if t_out.requires_grad:
                _backward_ones(k_out, t_out)
                _exact_specials(a.k_leaf.grad, a.t_leaf.grad, msg="grad a: ")
                _exact_specials(b.k_leaf.grad, b.t_leaf.grad, msg="grad b: ")
        except AssertionError as exc:
            results[U.dtype_id(d)] = str(exc)
    U.report(results)


def test_shift_edges():
    """Shifts by negative amounts or by at least the bit width are defined as in torch."""
    for d in U.INT_DTYPES:
        bits = d.itemsize * 8
        lo = 0 if d is kiln.uint8 else -5
        a = U.make_pair((7,), d, values=np.array([1, 3, 100, lo, -1 if lo else 7, 5, 2]))
        amounts = np.array([0, 1, bits - 1, bits, bits + 1, -1 if lo else 200, 3])
        b = U.make_pair((7,), d, values=amounts)
        for fn in (
            lambda L, p, q: p << q,
            lambda L, p, q: p >> q,
            lambda L, p, q: p << 1,
            lambda L, p, q: 7 >> q,
            lambda L, p, q: L.bitwise_left_shift(p, -1),
        ):
            U.check_op(fn, a, b, grad=False)


# ---------------------------------------------------------------------------------------- clamp and friends


def _ints(L, x, dtype):
    """``x`` as integers, its NaN and infinities first made finite: a float NaN or infinity cast to an
    integer dtype is implementation-defined (x86-64 vector and scalar conversions give different
    integers, and PyTorch's choice depends on the CPU's vector width), so no oracle comparison may
    include one."""
    return L.nan_to_num(x, nan=0.0, posinf=3.0, neginf=-3.0).to(dtype)


CLAMP_CASES = {
    "scalars": lambda L, x: L.clamp(x, -0.5, 0.5),
    "min only": lambda L, x: L.clamp(x, min=0),
    "max only": lambda L, x: x.clamp(max=0.25),
    "max=None": lambda L, x: x.clamp(-1, None),
    "crossed": lambda L, x: L.clamp(x, 1.0, -1.0),
    "nan bound": lambda L, x: L.clamp(x, min=float("nan")),
    "inf bound": lambda L, x: L.clamp(x, -math.inf, math.inf),
    "0-d tensor and scalar": lambda L, x: L.clamp(x, L.tensor(0.0, dtype=x.dtype), 1),
    "0-d tensor bound": lambda L, x: L.clamp(x, L.tensor(-0.5, dtype=L.float64)),
    "0-d float64 and scalar on int": lambda L, x: L.clamp(_ints(L, x, L.int64), L.tensor(0.5, dtype=L.float64), 1),
    "0-d int and scalar on int8": lambda L, x: L.clamp(_ints(L, x, L.int8), max=L.tensor(1), min=-1),
    "int bound on int": lambda L, x: L.clamp(_ints(L, x, L.int32), -1, 1),
    "float bound on int": lambda L, x: L.clamp(_ints(L, x, L.int64), 0.5),
    "bool bound on int": lambda L, x: L.clamp_max(_ints(L, x, L.int16), True),
    "float64 tensor on float32": lambda L, x: L.clamp(x.float(), min=x.double() * 0.5),
    "uint8 wraps -1": lambda L, x: L.clamp(_ints(L, x.abs(), L.uint8), min=-1),
    "uint8 -255": lambda L, x: L.clamp(_ints(L, x.abs(), L.uint8), -255),
    "bool tensor bound on bool": lambda L, x: L.clamp(x > 0, min=x < 0),
    "bool tensor max on bool": lambda L, x: L.clamp_max(x > 0, x < 1),
    "clip": lambda L, x: L.clip(x, -1, 1),
    "clamp_min nan": lambda L, x: L.clamp_min(x, float("nan")),
    "clamp_max tensor nan": lambda L, x: L.clamp_max(x, x.log()),
}


@pytest.mark.parametrize("name", list(CLAMP_CASES))
def test_clamp_cases(name):
    fn = CLAMP_CASES[name]
    for dtype in (kiln.float16, kiln.bfloat16) + U.FLOAT_DTYPES:
        vals = np.array([-2.0, -0.5, -0.25, 0.0, 0.25, 0.5, 1.5, np.nan, np.inf, -np.inf])
        x = U.make_pair(vals.shape, dtype, values=vals, requires_grad=dtype in U.FLOAT_DTYPES)
        with np.errstate(invalid="ignore"):
            U.check_op(fn, x, grad=dtype in U.FLOAT_DTYPES)


def test_clamp_gradients_at_the_bounds():
    """Values equal to a bound pass the gradient; tensor bounds get it where they applied (max wins when crossed)."""
    for dtype in U.FLOAT_DTYPES:
        x = U.make_pair((5,), dtype, values=[0.0, 1.0, 2.0, 3.0, -1.0], requires_grad=True)
        lo = U.make_pair((5,), dtype, values=[0.0, 0.0, 0.0, 5.0, 0.0], requires_grad=True)
        hi = U.make_pair((5,), dtype, values=[2.0, 2.0, 2.0, 1.0, 0.0], requires_grad=True)
        U.check_op(lambda L, a, b, c: L.clamp(a, b, c), x, lo, hi)
        U.check_op(lambda L, a, b, c: L.clamp(a, 0, 2), x, lo, hi)
        U.check_op(lambda L, a, b, c: L.clamp_min(a, b), x, lo, hi)
        U.check_op(lambda L, a, b, c: L.clamp_max(a, c), x, lo, hi)
        U.check_op(lambda L, a, b, c: L.clamp(a, max=c), x, lo, hi)


def test_nan_to_num_defaults_per_dtype():
    vals = np.array([np.nan, np.inf, -np.inf, 1.5, -0.0])
    for d in (kiln.float16, kiln.bfloat16, kiln.float32, kiln.float64):
        x = U.make_pair(vals.shape, d, values=vals)
        U.check_op(lambda L, t: L.nan_to_num(t), x, grad=False)
        U.check_op(lambda L, t: L.nan_to_num(t, nan=2, posinf=1e6, neginf=-1e300), x, grad=False)
        U.check_op(lambda L, t: t.nan_to_num(posinf=0.5), x, grad=False)
    for d in U.NON_FLOAT_DTYPES:
        x = U.make_pair((4,), d, seed=1)
        U.check_op(lambda L, t: L.nan_to_num(t, nan=1.5, posinf=-1.0), x, grad=False)


def test_lerp_weights_and_dtypes():
    for d in (kiln.float16, kiln.bfloat16, kiln.float32, kiln.float64):
        a, b = U.make_pair((2, 3), d, seed=1), U.make_pair((3,), d, seed=2)
        tol = {"rtol": 1e-2, "atol": 1e-2} if d in U.HALF_DTYPES else {}
        for w in (0, 1, 0.5, 0.49, -0.3, 1.7, True):
            U.check_op(lambda L, p, q: L.lerp(p, q, w), a, b, grad=False, **tol)
        U.check_op(lambda L, p, q: L.lerp(p, q, L.tensor(0.8, dtype=L.float64)), a, b, grad=False, **tol)
        U.check_op(lambda L, p, q: L.lerp(p, q, L.tensor(2)), a, b, grad=False, **tol)
        U.check_op(lambda L, p, q: L.lerp(p, q, q), a, b, grad=False, **tol)
    # a 0-d weight promotes with input and end (int or bool inputs give floats; all 0-d: the widest)
    for fn in (
        lambda L: L.lerp(L.tensor([1, 2]), L.tensor([3, 4]), L.tensor(0.5)),
        lambda L: L.lerp(
            L.tensor([1, 2], dtype=L.int8), L.tensor([3, 4], dtype=L.int8), L.tensor(0.25, dtype=L.float64)
        ),
        lambda L: L.lerp(L.tensor([True]), L.tensor([False]), L.tensor(0.3)),
        lambda L: L.lerp(L.tensor(1.0), L.tensor(3.0), L.tensor(0.3, dtype=L.float64)),
        lambda L: L.lerp(
            L.tensor([1.0, 2.0], dtype=L.float16), L.tensor([3.0, 4.0], dtype=L.float16), L.tensor(0.3, dtype=L.float64)
        ),
    ):
        U.assert_close(fn(kiln), fn(torch))


def test_half_results_round_wider_operands_first():
    """A float64 or float32 operand of a half-precision result is rounded to it before the float32 math,
    as PyTorch casts operands to the common dtype (``1e-30`` becomes 0 in float16)."""
    h = U.make_pair((4,), kiln.float16, values=[0.0, 2.0, -3.0, 0.3])
    h2 = U.make_pair((4,), kiln.float16, values=[0.7, -1.1, 2.3, 1.7])
    for fn in (
        lambda L, x, y: L.floor_divide(L.tensor(1e-30), x),
        lambda L, x, y: L.remainder(L.tensor(1.0001, dtype=L.float64), y),
        lambda L, x, y: L.fmod(y, L.tensor(0.30001, dtype=L.float64)),
        lambda L, x, y: L.atan2(L.tensor(1e-30, dtype=L.float64), x),
        lambda L, x, y: L.copysign(x, L.tensor(-1e-30)),
        lambda L, x, y: L.clamp(y, min=L.tensor(0.70001, dtype=L.float64)),
        lambda L, x, y: L.clamp(y, 0.70001, 1.7001),
        lambda L, x, y: L.addcmul(x, L.tensor(0.1234567, dtype=L.float64), y),
        lambda L, x, y: L.addcdiv(x, y, L.tensor(3.0001, dtype=L.float64)),
        lambda L, x, y: L.lerp(x, y, L.tensor(0.30001, dtype=L.float64)),
        lambda L, x, y: L.logical_and(y, L.tensor(1e-10, dtype=L.float64)),
        lambda L, x, y: L.hypot(x, L.tensor([1e-30, 1.0001, 2.0, 3.0])),
    ):
        U.check_op(fn, h, h2, grad=False, rtol=0, atol=0)


def test_gradients_for_integer_and_bool_operands():
    """Integer or bool operands next to a differentiable one: kiln's gradients are those of the same
    values as floats (torch squares an integer atan2 operand in its own dtype, which wraps for uint8 and
    raises for bool, and cannot subtract a bool lerp weight)."""
    y = np.array([20, 3, 200, 0, 1])
    x = U.make_pair((5,), kiln.float64, values=[1.5, -0.5, 2.0, 0.0, -1.0], requires_grad=True)
    for d in (kiln.uint8, kiln.int16, kiln.bool):
        k_y = kiln.tensor(y.astype(d.numpy), dtype=d)
        t_y = torch.tensor(y.astype(d.numpy).astype(np.float64))
        U.check_op(lambda L, p: L.atan2(k_y if L is kiln else t_y, p), x)
        U.check_op(lambda L, p: L.atan2(p, k_y if L is kiln else t_y), x)
    w_k, w_t = kiln.tensor(True), torch.tensor(1.0, dtype=torch.float64)
    U.check_op(lambda L, p: L.lerp(p, p * 2, w_k if L is kiln else w_t), x)


def test_addcmul_addcdiv_values():
    """Integer results truncate a float ``value`` (torch converts it to the integer type)."""
    for d in U.ALL_DTYPES:
        a, b, c = (U.make_pair((2, 3), d, seed=s, low=1, high=4) for s in (1, 2, 3))
        tol = {"rtol": 1e-2, "atol": 1e-2} if d in U.HALF_DTYPES else {}
        for v in (1, 2, 0.5, -1.5, True):
            results = {
                "addcmul": U.mismatch(lambda L, p, q, r: L.addcmul(p, q, r, value=v), a, b, c, grad=False, **tol),
                "addcdiv": U.mismatch(lambda L, p, q, r: L.addcdiv(p, q, r, value=v), a, b, c, grad=False, **tol),
                "addcdiv float": U.mismatch(
                    lambda L, p, q, r: L.addcdiv(p, q.double(), r, value=v), a, b, c, grad=False, **tol
                ),
            }
            U.report({f"{U.dtype_id(d)} value={v!r} {k}": r for k, r in results.items()})


# ---------------------------------------------------------------------------------------- gradcheck / gradgradcheck


def _f64(shape, seed, low=-1.5, high=1.5):
    a = U.rand_array(shape, kiln.float64, U.rng_for(seed), low=low, high=high)
    return kiln.tensor(a, dtype=kiln.float64, requires_grad=True)


def _away(shape, seed, low=0.4, high=1.5):
    a = U.rand_array(shape, kiln.float64, U.rng_for(seed), low=low, high=high)
    sign = np.where(U.rng_for(seed + 99).random(shape) < 0.5, -1.0, 1.0)
    return kiln.tensor(a * sign, dtype=kiln.float64, requires_grad=True)


def _distinct(shape, seed, shift=0.0):
    n = int(np.prod(shape))
    v = U.rng_for(seed).permutation(n).astype(np.float64).reshape(shape) * 0.37 - 1.0 + shift
    return kiln.tensor(v, dtype=kiln.float64, requires_grad=True)


def _unit(shape, seed):
    return _f64(shape, seed, low=-0.9, high=0.9)


GRADCHECK = {
    "exp2": (lambda x: kiln.exp2(x), lambda: (_f64((2, 3), 1),)),
    "expm1": (lambda x: kiln.expm1(x), lambda: (_f64((2, 3), 1),)),
    "log2": (lambda x: kiln.log2(x), lambda: (_f64((2, 3), 1, 0.3, 2.0),)),
    "log10": (lambda x: x.log10(), lambda: (_f64((2, 3), 1, 0.3, 2.0),)),
    "log1p": (lambda x: kiln.log1p(x), lambda: (_f64((2, 3), 1, -0.7, 2.0),)),
    "rsqrt": (lambda x: kiln.rsqrt(x), lambda: (_f64((2, 3), 1, 0.3, 2.0),)),
    "reciprocal": (lambda x: kiln.reciprocal(x), lambda: (_away((2, 3), 1),)),
    "square": (lambda x: kiln.square(x), lambda: (_f64((2, 3), 1),)),
    "tan": (lambda x: kiln.tan(x), lambda: (_f64((2, 3), 1, -1.2, 1.2),)),
    "asin": (lambda x: kiln.asin(x), lambda: (_unit((2, 3), 1),)),
    "acos": (lambda x: kiln.acos(x), lambda: (_unit((2, 3), 1),)),
    "atan": (lambda x: kiln.atan(x), lambda: (_f64((2, 3), 1),)),
    "sinh": (lambda x: kiln.sinh(x), lambda: (_f64((2, 3), 1),)),
    "cosh": (lambda x: kiln.cosh(x), lambda: (_f64((2, 3), 1),)),
    "asinh": (lambda x: kiln.asinh(x), lambda: (_f64((2, 3), 1),)),
    "acosh": (lambda x: kiln.acosh(x), lambda: (_f64((2, 3), 1, 1.2, 3.0),)),
    "atanh": (lambda x: kiln.atanh(x), lambda: (_unit((2, 3), 1),)),
    "erf": (lambda x: kiln.erf(x), lambda: (_f64((2, 3), 1),)),
    "erfc": (lambda x: kiln.erfc(x), lambda: (_f64((2, 3), 1),)),
    "erfinv": (lambda x: kiln.erfinv(x), lambda: (_unit((2, 3), 1),)),
    "logit": (lambda x: kiln.logit(x), lambda: (_f64((2, 3), 1, 0.1, 0.9),)),
    "logit eps": (lambda x: kiln.logit(x, eps=0.25), lambda: (_f64((2, 3), 4, 0.0, 1.0),)),
    "floor": (lambda x: kiln.floor(x) * x, lambda: (_f64((2, 3), 1, 0.1, 0.9),)),
    "ceil": (lambda x: kiln.ceil(x) + x, lambda: (_f64((2, 3), 1, 0.1, 0.9),)),
    "trunc": (lambda x: kiln.trunc(x) * x, lambda: (_f64((2, 3), 1, 0.1, 0.9),)),
    "round": (lambda x: kiln.round(x, decimals=1) * x, lambda: (_f64((2, 3), 1, 0.11, 0.14),)),
    "frac": (lambda x: kiln.frac(x), lambda: (_f64((2, 3), 1, 0.1, 0.9),)),
    "sgn": (lambda x: kiln.sgn(x) * x, lambda: (_away((2, 3), 1),)),
    "nan_to_num": (lambda x: kiln.nan_to_num(x), lambda: (_f64((2, 3), 1),)),
    "atan2": (lambda x, y: kiln.atan2(x, y), lambda: (_f64((2, 3), 1), _away((3,), 2))),
    "hypot": (lambda x, y: kiln.hypot(x, y), lambda: (_away((2, 3), 1), _f64((3,), 2))),
    "copysign": (lambda x, y: kiln.copysign(x, y), lambda: (_away((2, 3), 1), _away((3,), 2))),
    "copysign scalar": (lambda x: kiln.copysign(x, -1.0), lambda: (_away((2, 3), 1),)),
    "fmod": (lambda x, y: kiln.fmod(x, y), lambda: (_f64((2, 3), 1, 0.1, 0.9), _f64((3,), 2, 1.1, 2.0))),
    "fmod scalar": (lambda x: kiln.fmod(x, 0.7), lambda: (_f64((2, 3), 1, 0.1, 0.6),)),
    "remainder": (lambda x, y: kiln.remainder(x, y), lambda: (_f64((2, 3), 1, 0.1, 0.9), _f64((3,), 2, -2.0, -1.1))),
    "remainder scalar": (lambda x: x % 2.5, lambda: (_f64((2, 3), 1, 0.1, 2.4),)),
    "clamp scalars": (lambda x: kiln.clamp(x, -0.5, 0.5), lambda: (_distinct((2, 3), 1),)),
    "clamp tensors": (lambda x, a, b: kiln.clamp(x, a, b), lambda: (_distinct((2, 3), 1), _distinct((3,), 2, 0.05), _distinct((2, 1), 3, 0.6))),
    "clamp min tensor": (lambda x, a: kiln.clamp(x, min=a), lambda: (_distinct((2, 3), 1), _distinct((3,), 2, 0.05))),
    "clamp max tensor": (lambda x, b: kiln.clamp(x, max=b), lambda: (_distinct((2, 3), 1), _distinct((3,), 2, 0.05))),
    "clamp_min": (lambda x, a: kiln.clamp_min(x, a), lambda: (_distinct((2, 3), 1), _distinct((3,), 2, 0.05))),
    "clamp_max scalar": (lambda x: kiln.clamp_max(x, 0.1), lambda: (_distinct((2, 3), 1),)),
    "lerp scalar": (lambda x, y: kiln.lerp(x, y, 0.3), lambda: (_f64((2, 3), 1), _f64((3,), 2))),
    "lerp tensor": (lambda x, y, w: kiln.lerp(x, y, w), lambda: (_f64((2, 3), 1), _f64((3,), 2), _f64((2, 1), 3))),
    "addcmul": (lambda x, a, b: kiln.addcmul(x, a, b, value=-1.5), lambda: (_f64((2, 3), 1), _f64((3,), 2), _f64((2, 1), 3))),
    "addcdiv": (lambda x, a, b: kiln.addcdiv(x, a, b, value=2), lambda: (_f64((2, 3), 1), _f64((3,), 2), _away((2, 1), 3))),
    "erf_ on non-leaf": (lambda x: (x * 1).erf_(), lambda: (_f64((3,), 1),)),
    "rsqrt_ on non-leaf": (lambda x: (x * 1).rsqrt_(), lambda: (_f64((3,), 1, 0.3, 2.0),)),
    "clamp_ on non-leaf": (lambda x, a: (x * 1).clamp_(a, a + 1.2), lambda: (_distinct((2, 3), 1), _distinct((3,), 2, 0.05))),
    "lerp_ on non-leaf": (lambda x, y, w: (x * 1).lerp_(y, w), lambda: (_f64((2, 3), 1), _f64((3,), 2), _f64((3,), 3))),
    "addcdiv_ on non-leaf": (lambda x, a, b: (x * 1).addcdiv_(a, b), lambda: (_f64((2, 3), 1), _f64((3,), 2), _away((3,), 3))),
}  # fmt: skip


@pytest.mark.parametrize("name", list(GRADCHECK))
def test_gradcheck(name):
    fn, make = GRADCHECK[name]
    assert kiln.autograd.gradcheck(fn, make())


@pytest.mark.parametrize("name", list(GRADCHECK))
def test_gradgradcheck(name):
    fn, make = GRADCHECK[name]
    assert kiln.autograd.gradgradcheck(fn, make())


def test_grad_fn_names():
    """Autograd nodes carry torch's names, overload suffixes included."""
    cases = {
        "exp2": lambda L, x, y: L.exp2(x),
        "square": lambda L, x, y: L.square(x),
        "rsqrt": lambda L, x, y: L.rsqrt(x),
        "erfinv": lambda L, x, y: L.erfinv(x),
        "round": lambda L, x, y: L.round(x),
        "round decimals": lambda L, x, y: L.round(x, decimals=2),
        "fmod scalar": lambda L, x, y: L.fmod(x, 2),
        "fmod tensor": lambda L, x, y: L.fmod(x, y),
        "remainder scalar": lambda L, x, y: L.remainder(x, 2),
        "remainder tensor": lambda L, x, y: x % y,
        "clamp scalar": lambda L, x, y: L.clamp(x, 0, 1),
        "clamp tensor": lambda L, x, y: L.clamp(x, y),
        "clamp 0-d and scalar": lambda L, x, y: L.clamp(x, L.tensor(0.0, dtype=L.float64), 1),
        "clamp_min scalar": lambda L, x, y: L.clamp_min(x, 0),
        "clamp_min tensor": lambda L, x, y: L.clamp_min(x, y),
        "clamp_max tensor": lambda L, x, y: L.clamp_max(x, y),
        "lerp scalar": lambda L, x, y: L.lerp(x, y, 0.5),
        "lerp tensor": lambda L, x, y: L.lerp(x, y, y),
        "copysign tensor": lambda L, x, y: L.copysign(x, y),
        "copysign scalar": lambda L, x, y: L.copysign(x, -1),
        "atan2": lambda L, x, y: L.atan2(x, y),
        "hypot": lambda L, x, y: L.hypot(x, y),
        "addcmul": lambda L, x, y: L.addcmul(x, x, y),
        "nan_to_num": lambda L, x, y: L.nan_to_num(x),
        "logit": lambda L, x, y: L.logit(x),
        "sgn": lambda L, x, y: L.sgn(x),
        "frac": lambda L, x, y: L.frac(x),
        "fix": lambda L, x, y: L.fix(x),
        "asinh": lambda L, x, y: L.asinh(x),
    }
    x = U.make_pair((3,), kiln.float64, seed=1, requires_grad=True)
    y = U.make_pair((3,), kiln.float64, seed=2, requires_grad=True)
    bad = {}
    for name, fn in cases.items():
        k, t = fn(kiln, x.k, y.k).grad_fn.name(), fn(torch, x.t, y.t).grad_fn.name()
        if k != t:
            bad[name] = f"{k} != torch's {t}"
    assert not bad, bad


# ---------------------------------------------------------------------------------------- in-place

# name -> (fn(x, other) applied in place, other: None | "tensor" | a Python scalar, (low, high) for x)
INPLACE = {
    "exp2_": (lambda a, b: a.exp2_(), None, None),
    "expm1_": (lambda a, b: a.expm1_(), None, None),
    "log2_": (lambda a, b: a.log2_(), None, (0.2, 2.0)),
    "log10_": (lambda a, b: a.log10_(), None, (0.2, 2.0)),
    "log1p_": (lambda a, b: a.log1p_(), None, (-0.5, 2.0)),
    "rsqrt_": (lambda a, b: a.rsqrt_(), None, (0.2, 2.0)),
    "reciprocal_": (lambda a, b: a.reciprocal_(), None, (0.2, 2.0)),
    "square_": (lambda a, b: a.square_(), None, None),
    "tan_": (lambda a, b: a.tan_(), None, (-1.0, 1.0)),
    "asin_": (lambda a, b: a.asin_(), None, (-0.9, 0.9)),
    "arcsin_": (lambda a, b: a.arcsin_(), None, (-0.9, 0.9)),
    "acos_": (lambda a, b: a.acos_(), None, (-0.9, 0.9)),
    "arccos_": (lambda a, b: a.arccos_(), None, (-0.9, 0.9)),
    "atan_": (lambda a, b: a.atan_(), None, None),
    "arctan_": (lambda a, b: a.arctan_(), None, None),
    "sinh_": (lambda a, b: a.sinh_(), None, None),
    "cosh_": (lambda a, b: a.cosh_(), None, None),
    "asinh_": (lambda a, b: a.asinh_(), None, None),
    "arcsinh_": (lambda a, b: a.arcsinh_(), None, None),
    "acosh_": (lambda a, b: a.acosh_(), None, (1.2, 3.0)),
    "arccosh_": (lambda a, b: a.arccosh_(), None, (1.2, 3.0)),
    "atanh_": (lambda a, b: a.atanh_(), None, (-0.9, 0.9)),
    "arctanh_": (lambda a, b: a.arctanh_(), None, (-0.9, 0.9)),
    "erf_": (lambda a, b: a.erf_(), None, None),
    "erfc_": (lambda a, b: a.erfc_(), None, None),
    "erfinv_": (lambda a, b: a.erfinv_(), None, (-0.9, 0.9)),
    "logit_": (lambda a, b: a.logit_(), None, (0.1, 0.9)),
    "logit_ eps": (lambda a, b: a.logit_(0.3), None, (0.0, 1.0)),
    "floor_": (lambda a, b: a.floor_(), None, None),
    "ceil_": (lambda a, b: a.ceil_(), None, None),
    "trunc_": (lambda a, b: a.trunc_(), None, None),
    "fix_": (lambda a, b: a.fix_(), None, None),
    "round_": (lambda a, b: a.round_(), None, None),
    "round_ decimals": (lambda a, b: a.round_(decimals=1), None, None),
    "frac_": (lambda a, b: a.frac_(), None, None),
    "sgn_": (lambda a, b: a.sgn_(), None, None),
    "nan_to_num_": (lambda a, b: a.nan_to_num_(posinf=1.0), None, None),
    "atan2_": (lambda a, b: a.atan2_(b), "tensor", None),
    "arctan2_": (lambda a, b: a.arctan2_(b), "tensor", None),
    "hypot_": (lambda a, b: a.hypot_(b), "tensor", None),
    "copysign_": (lambda a, b: a.copysign_(b), "tensor", None),
    "copysign_ scalar": (lambda a, b: a.copysign_(b), -1.0, None),
    "fmod_": (lambda a, b: a.fmod_(b), "tensor", None),
    "fmod_ scalar": (lambda a, b: a.fmod_(b), 0.7, None),
    "remainder_": (lambda a, b: a.remainder_(b), "tensor", None),
    "%=": (lambda a, b: a.__imod__(b), 1.5, None),
    "floor_divide_": (lambda a, b: a.floor_divide_(b), "tensor", None),
    "//=": (lambda a, b: a.__ifloordiv__(b), 0.5, None),
    "clamp_": (lambda a, b: a.clamp_(-0.5, 0.5), None, None),
    "clamp_ tensor": (lambda a, b: a.clamp_(b), "tensor", None),
    "clip_": (lambda a, b: a.clip_(max=b), 0.2, None),
    "clamp_min_": (lambda a, b: a.clamp_min_(b), "tensor", None),
    "clamp_max_": (lambda a, b: a.clamp_max_(b), 0.0, None),
    "lerp_": (lambda a, b: a.lerp_(b, 0.3), "tensor", None),
    "lerp_ tensor": (lambda a, b: a.lerp_(b, b), "tensor", None),
    "addcmul_": (lambda a, b: a.addcmul_(b, b, value=2), "tensor", None),
    "addcdiv_": (lambda a, b: a.addcdiv_(b, b.exp()), "tensor", None),
    "logical_and_": (lambda a, b: a.logical_and_(b), "tensor", None),
    "logical_or_": (lambda a, b: a.logical_or_(b), "tensor", None),
    "logical_xor_": (lambda a, b: a.logical_xor_(b), "tensor", None),
}


def _apply_both(x: U.Pair, fn_k, fn_t):
    """In place on both: returns ``self``, same values, same base, same version counters."""
    rt = fn_t(x.t)
    rk = fn_k(x.k)
    assert rt is x.t
    assert rk is x.k, "in-place ops return self"
    U.assert_close(x.k, x.t)
    U.assert_close(x.k_leaf, x.t_leaf, msg="base of the written view: ")
    assert x.k._version == x.t._version, f"version {x.k._version} != torch's {x.t._version}"


@pytest.mark.parametrize("name", list(INPLACE))
def test_inplace_variants(name):
    fn, other, bounds = INPLACE[name]
    for layout in ("contiguous", "transposed", "strided"):
        for dtype in (kiln.float32, kiln.float64, kiln.float16):
            x = U.make_pair((3, 4), dtype, layout=layout, seed=1, **_bounds(bounds))
            if other == "tensor":
                y = U.make_pair((4,), dtype, seed=2, low=0.5, high=2.0)
                _apply_both(x, lambda a: fn(a, y.k), lambda a: fn(a, y.t))
            else:
                _apply_both(x, lambda a: fn(a, other), lambda a: fn(a, other))


# torch cannot differentiate these in-place ops ("the derivative for 'inplace version of asinh' is not
# implemented"); kiln can, and must agree with torch's out-of-place op
_TORCH_OUT_OF_PLACE = {
    "asinh_": lambda a, b: a.asinh(),
    "arcsinh_": lambda a, b: a.asinh(),
    "acosh_": lambda a, b: a.acosh(),
    "arccosh_": lambda a, b: a.acosh(),
    "atanh_": lambda a, b: a.atanh(),
    "arctanh_": lambda a, b: a.atanh(),
}


@pytest.mark.parametrize("name", [n for n in INPLACE if not n.startswith(("logical", "floor_divide", "//="))])
def test_inplace_autograd(name):
    """Gradients through an in-place op on a non-leaf (and through a view of one) match torch."""
    k_fn, other, bounds = INPLACE[name]
    t_fn = _TORCH_OUT_OF_PLACE.get(name, k_fn)
    times_x = name == "sgn_"  # torch's sgn gradient is a ZeroTensor, which NumPy cannot read

    def apply(L, c, arg):
        return (k_fn if L is kiln else t_fn)(c, arg)

    for dtype in U.FLOAT_DTYPES:
        x = U.make_pair((3, 4), dtype, seed=3, requires_grad=True, **_bounds(bounds))
        y = U.make_pair((4,), dtype, seed=4, requires_grad=True, low=0.5, high=2.0)
        arg_k, arg_t = (y.k, y.t) if other == "tensor" else (other, other)
        U.check_op(lambda L, a, b: apply(L, a * 1, arg_k if L is kiln else arg_t) * (a if times_x else 1), x, y)
        if name in _TORCH_OUT_OF_PLACE or times_x:
            continue
        # through a view: the write must reach the base's history
        U.check_op(lambda L, a, b: (lambda c: (apply(L, c[1:], arg_k if L is kiln else arg_t), c * c)[1])(a * 1), x, y)


def test_inplace_integer_and_bool_rules():
    """An in-place result must cast to ``self``'s dtype: logical ops write 0/1 into any dtype, integer
    shifts stay integer, floating results refuse integer ``self``."""
    ok = {
        "logical_and_ float": lambda L: L.tensor([1.5, 0.0, -2.0]).logical_and_(L.tensor([1, 1, 0])),
        "logical_or_ int": lambda L: L.tensor([3, 0, 0]).logical_or_(L.tensor([0.0, 0.5, 0.0])),
        "logical_xor_ bool": lambda L: L.tensor([True, False]).logical_xor_(L.tensor([2, 0])),
        "<<=": lambda L: L.tensor([1, -3], dtype=L.int16).__ilshift__(3),
        ">>=": lambda L: L.tensor([100, -100], dtype=L.int8).__irshift__(L.tensor([2, 9], dtype=L.int8)),
        "bitwise_left_shift_": lambda L: L.tensor([1, 2], dtype=L.uint8).bitwise_left_shift_(7),
        "bitwise_right_shift_": lambda L: L.tensor([1, 200], dtype=L.uint8).bitwise_right_shift_(1),
        "%= int": lambda L: L.tensor([-7, 7]).__imod__(3),
        "//= int": lambda L: L.tensor([-7, 7]).__ifloordiv__(2),
        "fmod_ int": lambda L: L.tensor([-7, 7], dtype=L.int32).fmod_(L.tensor([2, -3], dtype=L.int32)),
        "clamp_ int": lambda L: L.tensor([-7, 7, 1]).clamp_(0, 2),
        "floor_ int": lambda L: L.tensor([-7, 7]).floor_(),
        "sgn_ bool": lambda L: L.tensor([True, False]).sgn_(),
        "nan_to_num_ int": lambda L: L.tensor([1, 2]).nan_to_num_(),
        "square_ int": lambda L: L.tensor([-3, 4], dtype=L.int8).square_(),
        "addcmul_ int": lambda L: L.tensor([1, 2]).addcmul_(L.tensor([3, 4]), L.tensor([5, 6]), value=2),
    }
    for name, fn in ok.items():
        U.assert_close(fn(kiln), fn(torch), msg=f"{name}: ")
    refused = {
        "exp2_ int": lambda L: L.tensor([1, 2]).exp2_(),
        "logit_ int": lambda L: L.tensor([1, 2]).logit_(),
        "copysign_ int": lambda L: L.tensor([1, 2]).copysign_(L.tensor([1.0, -1.0])),
        "remainder_ int by float": lambda L: L.tensor([1, 2]).remainder_(1.5),
        "square_ bool": lambda L: L.tensor([True, False]).square_(),
        "floor_ bool": lambda L: L.tensor([True]).floor_(),
        "lerp_ broadcast": lambda L: L.zeros(3).lerp_(L.zeros(2, 1), 0.5),
        "atan2_ broadcast": lambda L: L.zeros(3).atan2_(L.zeros(2, 3)),
    }
    for fn in refused.values():
        U.assert_same_error(lambda: fn(kiln), lambda: fn(torch))


def test_inplace_on_leaf_requiring_grad_refused():
    for fn in (lambda x: x.erf_(), lambda x: x.clamp_(0, 1), lambda x: x.lerp_(x, 0.5)):
        U.assert_same_error(lambda: fn(kiln.ones(2, requires_grad=True)), lambda: fn(torch.ones(2, requires_grad=True)))


# ---------------------------------------------------------------------------------------- API surface

FUNCTIONS = [
    "exp2",
    "expm1",
    "log2",
    "log10",
    "log1p",
    "rsqrt",
    "reciprocal",
    "square",
    "tan",
    "asin",
    "acos",
    "atan",
    "sinh",
    "cosh",
    "asinh",
    "acosh",
    "atanh",
    "arcsin",
    "arccos",
    "arctan",
    "arcsinh",
    "arccosh",
    "arctanh",
    "atan2",
    "arctan2",
    "erf",
    "erfc",
    "erfinv",
    "logit",
    "floor",
    "ceil",
    "round",
    "trunc",
    "fix",
    "frac",
    "fmod",
    "remainder",
    "floor_divide",
    "clamp",
    "clip",
    "clamp_min",
    "clamp_max",
    "lerp",
    "addcmul",
    "addcdiv",
    "isinf",
    "isfinite",
    "isposinf",
    "isneginf",
    "nan_to_num",
    "logical_and",
    "logical_or",
    "logical_xor",
    "bitwise_left_shift",
    "bitwise_right_shift",
    "hypot",
    "copysign",
    "sgn",
    "positive",
]
ALIASES = {
    "arcsin": "asin",
    "arccos": "acos",
    "arctan": "atan",
    "arcsinh": "asinh",
    "arccosh": "acosh",
    "arctanh": "atanh",
    "arctan2": "atan2",
    "clip": "clamp",
    "fix": "trunc",
}


def test_functions_methods_and_inplace_methods_exist_where_torch_has_them():
    missing = []
    for name in FUNCTIONS:
        if not callable(getattr(kiln, name, None)):
            missing.append(f"kiln.{name}")
        if not getattr(kiln.__dict__.get(name), "__doc__", None):
            missing.append(f"docstring of kiln.{name}")
        for attr in (name, name + "_"):
            if hasattr(torch.Tensor, attr) and not hasattr(kiln.Tensor, attr):
                missing.append(f"Tensor.{attr}")
        if name not in kiln.__all__:
            missing.append(f"kiln.__all__ lacks {name}")
    for dunder in ("__mod__", "__rmod__", "__imod__", "__lshift__", "__rlshift__", "__ilshift__", "__rshift__"):
        if not hasattr(kiln.Tensor, dunder):
            missing.append(f"Tensor.{dunder}")
    for dunder in ("__rrshift__", "__irshift__", "__pos__", "__ifloordiv__"):
        if not hasattr(kiln.Tensor, dunder):
            missing.append(f"Tensor.{dunder}")
    assert not missing, missing
    for alias, name in ALIASES.items():
        assert getattr(kiln, alias) is getattr(kiln, name)


def test_operators():
    a = U.make_pair((2, 3), kiln.int32, seed=1, low=-8, high=8)
    b = U.make_pair((3,), kiln.int32, seed=2, low=1, high=4)
    for fn in (
        lambda L, p, q: p % q,
        lambda L, p, q: 7 % q,
        lambda L, p, q: p % 3,
        lambda L, p, q: p % 2.5,
        lambda L, p, q: p << q,
        lambda L, p, q: p >> q,
        lambda L, p, q: 1 << q,
        lambda L, p, q: -64 >> q,
        lambda L, p, q: +p,
    ):
        U.check_op(fn, a, b, grad=False)
    x = kiln.tensor([1.5, -2.0])
    assert +x is x and kiln.positive(x) is x and x.positive() is x
    for op, iop in (
        (operator.mod, operator.imod),
        (operator.lshift, operator.ilshift),
        (operator.floordiv, operator.ifloordiv),
    ):
        k, t = kiln.tensor([-7, 5, 9]), torch.tensor([-7, 5, 9])
        k2, t2 = iop(k, 2), iop(t, 2)
        assert k2 is k and t2 is t
        U.assert_close(k, t)
        U.assert_close(op(kiln.tensor([-7, 5, 9]), 2), op(torch.tensor([-7, 5, 9]), 2))


# ---------------------------------------------------------------------------------------- errors

ERRORS = {
    "clamp without bounds": lambda L: L.clamp(L.ones(2)),
    "clamp None None": lambda L: L.ones(2).clamp(None, None),
    "clamp bool scalars": lambda L: L.clamp(L.ones(2, dtype=L.bool), False, True),
    "clamp bool min scalar": lambda L: L.clamp(L.ones(2, dtype=L.bool), min=False),
    "clamp bool max scalar": lambda L: L.clamp(L.ones(2, dtype=L.bool), max=True),
    "clamp bool 0-d tensor with scalar": lambda L: L.clamp(L.ones(2, dtype=L.bool), min=True, max=L.tensor(False)),
    "clamp bool tensors": lambda L: L.clamp(L.ones(2, dtype=L.bool), L.ones(2, dtype=L.bool), L.ones(2, dtype=L.bool)),
    "clamp_min bool scalar": lambda L: L.clamp_min(L.ones(2, dtype=L.bool), False),
    "clamp uint8 overflow": lambda L: L.clamp(L.ones(2, dtype=L.uint8), max=300),
    "clamp uint8 -256": lambda L: L.clamp(L.ones(2, dtype=L.uint8), min=-256),
    "clamp int8 overflow": lambda L: L.clamp(L.ones(2, dtype=L.int8), min=-129),
    "clamp int16 overflow": lambda L: L.clamp_max(L.ones(2, dtype=L.int16), 2**20),
    "clamp int32 overflow": lambda L: L.clamp_min(L.ones(2, dtype=L.int32), 2**40),
    "clamp half overflow": lambda L: L.clamp(L.ones(2, dtype=L.float16), max=1e6),
    "clamp bfloat16 overflow": lambda L: L.clamp(L.ones(2, dtype=L.bfloat16), max=1e300),
    "clamp float overflow": lambda L: L.clamp(L.ones(2), max=1e300),
    "clamp int with huge float": lambda L: L.clamp(L.ones(2, dtype=L.int32), max=1e300),
    "clamp broadcast": lambda L: L.clamp(L.ones(2, 3), L.ones(4)),
    "lerp end dtype": lambda L: L.lerp(L.ones(2), L.ones(2, dtype=L.float64), 0.5),
    "lerp end 0-d dtype": lambda L: L.lerp(L.ones(2), L.tensor(1.0, dtype=L.float64), 0.5),
    "lerp weight dtype": lambda L: L.lerp(L.ones(2), L.ones(2), L.ones(2, dtype=L.float16)),
    "lerp weight int": lambda L: L.lerp(L.ones(2), L.ones(2), L.ones(2, dtype=L.int64)),
    "lerp weight int8": lambda L: L.lerp(
        L.ones(2, dtype=L.float64), L.ones(2, dtype=L.float64), L.ones(2, dtype=L.int8)
    ),
    "lerp end uint8": lambda L: L.lerp(L.ones(2, dtype=L.bfloat16), L.ones(2, dtype=L.uint8), 0.5),
    "lerp end int16": lambda L: L.lerp(L.ones(2), L.ones(2, dtype=L.int16), 0.5),
    "lerp end bool": lambda L: L.lerp(L.ones(2), L.ones(2, dtype=L.bool), 0.5),
    "lerp end int32": lambda L: L.lerp(L.ones(2), L.ones(2, dtype=L.int32), 0.5),
    "lerp int scalar weight": lambda L: L.lerp(L.ones(2, dtype=L.int64), L.ones(2, dtype=L.int64), 0.5),
    "lerp int tensor weight": lambda L: L.lerp(
        L.ones(2, dtype=L.int32), L.ones(2, dtype=L.int32), L.ones(2, dtype=L.int32)
    ),
    "lerp bool": lambda L: L.lerp(L.ones(2, dtype=L.bool), L.ones(2, dtype=L.bool), 0.5),
    "lerp 0-d int weight on int": lambda L: L.lerp(L.ones(2, dtype=L.int64), L.ones(2, dtype=L.int64), L.tensor(1)),
    "lerp weight overflow": lambda L: L.lerp(L.ones(2), L.ones(2), 1e300),
    "addcmul value overflow": lambda L: L.addcmul(*(L.ones(2, dtype=L.int8),) * 3, value=300),
    "addcmul negative value uint8": lambda L: L.addcmul(*(L.ones(2, dtype=L.uint8),) * 3, value=-1.5),
    "lerp broadcast": lambda L: L.lerp(L.ones(2), L.ones(3), 0.5),
    "addcdiv integers": lambda L: L.addcdiv(L.ones(2), L.ones(2, dtype=L.int64), L.ones(2, dtype=L.int64)),
    "addcdiv bools": lambda L: L.addcdiv(L.ones(2), L.ones(2, dtype=L.bool), L.ones(2, dtype=L.int8)),
    "addcmul bool": lambda L: L.addcmul(*(L.ones(2, dtype=L.bool),) * 3),
    "addcmul tensor1 scalar": lambda L: L.addcmul(L.ones(2), 2, L.ones(2)),
    "addcmul value str": lambda L: L.addcmul(L.ones(2), L.ones(2), L.ones(2), value="a"),
    "addcmul broadcast": lambda L: L.addcmul(L.ones(2), L.ones(3), L.ones(2)),
    "floor bool": lambda L: L.floor(L.ones(2, dtype=L.bool)),
    "ceil bool": lambda L: L.ceil(L.ones(2, dtype=L.bool)),
    "trunc bool": lambda L: L.trunc(L.ones(2, dtype=L.bool)),
    "round bool": lambda L: L.round(L.ones(2, dtype=L.bool)),
    "round int decimals": lambda L: L.round(L.ones(2, dtype=L.int64), decimals=2),
    "round int16 decimals": lambda L: L.round(L.ones(2, dtype=L.int16), decimals=-1),
    "frac int": lambda L: L.frac(L.ones(2, dtype=L.int64)),
    "frac bool": lambda L: L.frac(L.ones(2, dtype=L.bool)),
    "fmod bool": lambda L: L.fmod(L.ones(2, dtype=L.bool), L.ones(2, dtype=L.bool)),
    "remainder bool": lambda L: L.remainder(L.ones(2, dtype=L.bool), True),
    "remainder scalar bool": lambda L: L.remainder(True, L.ones(2, dtype=L.bool)),
    "floor_divide bool": lambda L: L.floor_divide(L.ones(2, dtype=L.bool), L.ones(2, dtype=L.bool)),
    "hypot int": lambda L: L.hypot(L.ones(2, dtype=L.int64), L.ones(2, dtype=L.int64)),
    "hypot bool": lambda L: L.hypot(L.ones(2, dtype=L.bool), L.ones(2, dtype=L.bool)),
    "hypot scalar": lambda L: L.hypot(L.ones(2), 2.0),
    "atan2 scalar first": lambda L: L.atan2(2.0, L.ones(2)),
    "atan2 scalar": lambda L: L.atan2(L.ones(2), 2),
    "logical_and scalar": lambda L: L.logical_and(L.ones(2), 1),
    "logical_or scalar first": lambda L: L.logical_or(1, L.ones(2)),
    "lshift float": lambda L: L.bitwise_left_shift(L.ones(2), 1),
    "rshift float": lambda L: L.bitwise_right_shift(L.ones(2, dtype=L.int64), 1.5),
    "<< float": lambda L: L.ones(2) << 1,
    "<< bool": lambda L: L.ones(2, dtype=L.bool) << L.ones(2, dtype=L.bool),
    ">> half": lambda L: L.ones(2, dtype=L.int8) >> L.ones(2, dtype=L.float16),
    "positive bool": lambda L: L.positive(L.ones(2, dtype=L.bool)),
    "+bool": lambda L: +L.ones(2, dtype=L.bool),
    "positive scalar": lambda L: L.positive(3),
    "isinf scalar": lambda L: L.isinf(1.0),
    "exp2 scalar": lambda L: L.exp2(1.0),
    "erfinv list": lambda L: L.erfinv([0.5]),
    "nan_to_num str": lambda L: L.nan_to_num(L.ones(2), nan="a"),
    "square_ bool": lambda L: L.ones(2, dtype=L.bool).square_(),
    "exp2_ int": lambda L: L.ones(2, dtype=L.int64).exp2_(),
    "broadcast mismatch": lambda L: L.atan2(L.ones(2, 3), L.ones(4)),
}


@pytest.mark.parametrize("name", list(ERRORS))
def test_errors_match_torch(name):
    fn = ERRORS[name]
    U.assert_same_error(lambda: fn(kiln), lambda: fn(torch))


TYPE_ERRORS = {
    "clamp tensor with scalar": lambda L: L.clamp(L.ones(3), min=L.zeros(3), max=1),
    "clamp 0-d requiring grad with scalar": lambda L: L.clamp(L.ones(3), L.zeros((), requires_grad=True), 1.0),
    "clamp scalar input": lambda L: L.clamp(1.0, 0, 1),
    "clamp str": lambda L: L.clamp(L.ones(2), "a"),
    "clamp_min None": lambda L: L.clamp_min(L.ones(2), None),
    "lerp scalar end": lambda L: L.lerp(L.ones(2), 1.0, 0.5),
    "lerp str weight": lambda L: L.lerp(L.ones(2), L.ones(2), "a"),
    "fmod scalar first": lambda L: L.fmod(2, L.ones(2)),
    "copysign scalar first": lambda L: L.copysign(2.0, L.ones(2)),
    "round float decimals": lambda L: L.round(L.ones(2), decimals=1.5),
}


@pytest.mark.parametrize("name", list(TYPE_ERRORS))
def test_type_errors(name):
    """Calls no torch overload accepts: the same exception type (torch's wording lists its overloads)."""
    fn = TYPE_ERRORS[name]
    exc = U.torch_error(lambda: fn(torch))
    with pytest.raises(type(exc)):
        fn(kiln)
