"""More elementwise math against torch: ``heaviside``, ``gcd``/``lcm``, ``nextafter``, ``frexp``,
``logaddexp``/``logaddexp2``, ``ldexp``, ``float_power``, ``fmax``/``fmin``, ``rad2deg``/``deg2rad``, ``rsub``,
their in-place forms, and the top-level in-place functions (``kiln.exp_``...)."""

from __future__ import annotations

import inspect

import kiln_testutil as U
import numpy as np
import pytest
import torch

import kiln

NAN, INF = float("nan"), float("inf")
LAYOUTS = ["contiguous", "transposed", "strided", "expanded"]
FLOATS = [kiln.float16, kiln.bfloat16, kiln.float32, kiln.float64]
INTS = [kiln.uint8, kiln.int8, kiln.int16, kiln.int32, kiln.int64]
SPECIALS = np.array([NAN, INF, -INF, -0.0, 0.0, 1.0, -1.0, 0.5, 2.0, -2.5])


def _gradcheck(fn, *shapes, seed=0):
    rng = np.random.default_rng(seed)
    xs = [kiln.tensor(rng.uniform(-2, 2, s), dtype=kiln.float64, requires_grad=True) for s in shapes]
    assert kiln.autograd.gradcheck(fn, xs)
    assert kiln.autograd.gradgradcheck(fn, xs)


# ---------------------------------------------------------------------------------------- heaviside


@pytest.mark.parametrize("dtype", U.ALL_DTYPES, ids=U.dtype_id)
def test_heaviside(dtype):
    for layout in LAYOUTS:
        x = U.make_pair((3, 4), dtype, layout=layout, integral=True, low=-2, high=2)
        v = U.make_pair((4,), dtype, seed=1)
        U.check_op(lambda L, a, b: L.heaviside(a, b), x, v, grad=False)
        U.check_op(lambda L, a, b: a.heaviside(b), x, U.make_pair((), dtype, seed=2), grad=False)
        U.check_op(lambda L, a, b: a.clone().heaviside_(b), x, v, grad=False)
    U.check_op(lambda L, a, b: L.heaviside(a, b), U.make_pair((0, 4), dtype), U.make_pair((4,), dtype), grad=False)


def test_heaviside_specials_and_no_gradient():
    x = U.make_pair((10,), kiln.float32, values=SPECIALS)
    U.check_op(lambda L, a, b: L.heaviside(a, b), x, U.make_pair((), kiln.float32, values=np.array(0.25)), grad=False)
    a = kiln.tensor([1.0, 0.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="derivative for aten::heaviside is not implemented"):
        kiln.heaviside(a, kiln.tensor(0.5)).sum().backward()


@pytest.mark.parametrize(
    "fn",
    [
        lambda L: L.heaviside(L.ones(2), L.tensor(1)),
        lambda L: L.heaviside(L.ones(2), L.tensor(1.0, dtype=L.float64)),
        lambda L: L.heaviside(L.ones(2), 0.5),
        lambda L: L.heaviside(L.ones(2, 3), L.ones(4)),
    ],
)
def test_heaviside_errors(fn):
    U.assert_same_error(lambda: fn(kiln), lambda: fn(torch), exact=True)


# ---------------------------------------------------------------------------------------- gcd, lcm


@pytest.mark.parametrize("name", ["gcd", "lcm"])
@pytest.mark.parametrize("dtype", INTS, ids=U.dtype_id)
def test_gcd_lcm(name, dtype):
    for layout in LAYOUTS:
        a = U.make_pair((3, 4), dtype, layout=layout, low=-30, high=30)
        b = U.make_pair((4,), dtype, seed=1, low=-30, high=30)
        U.check_op(lambda L, x, y: getattr(L, name)(x, y), a, b)
        U.check_op(lambda L, x, y: getattr(x, name)(y), a, U.make_pair((), dtype, seed=3, low=-9, high=9))
        U.check_op(lambda L, x, y: getattr(x.clone(), name + "_")(y), a, b)
        U.check_op(lambda L, x, y: getattr(L, name + "_")(x.clone(), y), a, b)
    U.check_op(lambda L, x, y: getattr(L, name)(x, y), U.make_pair((0,), dtype), U.make_pair((0,), dtype))
    zeros = U.make_pair((3,), dtype, values=np.array([0, 0, 6]))
    U.check_op(lambda L, x, y: getattr(L, name)(x, y), zeros, U.make_pair((3,), dtype, values=np.array([0, 4, 0])))


def test_gcd_extremes_and_promotion():
    lo = U.make_pair((2,), kiln.int64, values=np.array([-(2**63), -(2**62)]))
    U.check_op(lambda L, x, y: L.gcd(x, y), lo, U.make_pair((2,), kiln.int64, values=np.array([0, 3])))
    U.check_op(lambda L, x, y: L.lcm(x, y), lo, U.make_pair((2,), kiln.int64, values=np.array([1, 3])))
    U.check_op(lambda L, x, y: L.gcd(x, y), U.make_pair((3,), kiln.int64), U.make_pair((), kiln.int8, seed=4))


@pytest.mark.parametrize(
    "fn",
    [
        lambda L: L.gcd(L.ones(2), L.ones(2)),
        lambda L: L.lcm(L.tensor([True]), L.tensor([True])),
        lambda L: L.gcd(L.tensor([4]), 2),
        lambda L: L.gcd(L.tensor([4]), L.tensor([1.0])),
    ],
)
def test_gcd_errors(fn):
    U.assert_same_error(lambda: fn(kiln), lambda: fn(torch), exact=True)


# ---------------------------------------------------------------------------------------- nextafter, frexp


@pytest.mark.parametrize("dtype", FLOATS, ids=U.dtype_id)
def test_nextafter(dtype):
    for layout in LAYOUTS:
        a = U.make_pair((3, 4), dtype, layout=layout, requires_grad=dtype.is_floating_point)
        b = U.make_pair((4,), dtype, seed=1, requires_grad=True)
        U.check_op(lambda L, x, y: L.nextafter(x, y), a, b)
        U.check_op(lambda L, x, y: x.detach().clone().nextafter_(y.detach()), a, b, grad=False)
    s = U.make_pair((10,), dtype, values=SPECIALS)
    U.check_op(lambda L, x, y: L.nextafter(x, y), s, U.make_pair((10,), dtype, values=SPECIALS[::-1].copy()))
    U.check_op(lambda L, x, y: L.nextafter(x, y), U.make_pair((), dtype), U.make_pair((0,), dtype))


def test_nextafter_errors_and_promotion():
    U.check_op(lambda L, x, y: L.nextafter(x, y), U.make_pair((3,), kiln.float32), U.make_pair((3,), kiln.float64))
    for fn in (lambda L: L.nextafter(L.tensor([1, 2]), L.tensor([2, 3])), lambda L: L.nextafter(L.ones(2), 1.0)):
        U.assert_same_error(lambda fn=fn: fn(kiln), lambda fn=fn: fn(torch), exact=True)


@pytest.mark.parametrize("dtype", FLOATS, ids=U.dtype_id)
def test_frexp(dtype):
    for layout in LAYOUTS:
        a = U.make_pair((3, 4), dtype, layout=layout, low=-1e3, high=1e3, requires_grad=True)
        U.check_op(lambda L, x: L.frexp(x), a)
        U.check_op(lambda L, x: x.frexp().mantissa, a)
    tiny = {kiln.float16: 6e-8, kiln.bfloat16: 1e-40, kiln.float32: 1e-40, kiln.float64: 5e-324}[dtype]
    values = np.concatenate([SPECIALS, [tiny, -tiny]])
    U.check_op(lambda L, x: L.frexp(x), U.make_pair((12,), dtype, values=values), grad=False)
    U.check_op(lambda L, x: L.frexp(x), U.make_pair((), dtype), grad=False)
    U.check_op(lambda L, x: L.frexp(x), U.make_pair((0, 2), dtype), grad=False)
    out = kiln.frexp(kiln.tensor([3.0]))
    assert out._fields == ("mantissa", "exponent") and out.exponent.dtype is kiln.int32


def test_frexp_gradient_and_error():
    _gradcheck(lambda x: kiln.frexp(x).mantissa, (3, 4))
    U.assert_same_error(lambda: kiln.frexp(kiln.tensor([1, 2])), lambda: torch.frexp(torch.tensor([1, 2])), exact=True)


# ---------------------------------------------------------------------------------------- logaddexp


@pytest.mark.parametrize("name", ["logaddexp", "logaddexp2"])
@pytest.mark.parametrize("dtype", FLOATS, ids=U.dtype_id)
def test_logaddexp(name, dtype):
    tol = {} if dtype in (kiln.float32, kiln.float64) else {"rtol": 1e-2, "atol": 1e-2}
    for layout in LAYOUTS:
        a = U.make_pair((3, 4), dtype, layout=layout, low=-30, high=30, requires_grad=True)
        b = U.make_pair((4,), dtype, seed=1, low=-30, high=30, requires_grad=True)
        U.check_op(lambda L, x, y: getattr(L, name)(x, y), a, b, grad_rtol=tol.get("rtol"), grad_atol=tol.get("atol"))
        U.check_op(lambda L, x, y: getattr(x, name)(y), a, U.make_pair((), dtype, seed=5, requires_grad=True))
    s = U.make_pair((10,), dtype, values=SPECIALS)
    U.check_op(lambda L, x, y: getattr(L, name)(x, y), s, U.make_pair((10,), dtype, values=SPECIALS.copy()))
    U.check_op(lambda L, x, y: getattr(L, name)(x, y), s, U.make_pair((10,), dtype, values=SPECIALS[::-1].copy()))
    _gradcheck(lambda x, y: getattr(kiln, name)(x, y), (3, 4), (4,))


@pytest.mark.parametrize(
    "fn",
    [
        lambda L: L.logaddexp(L.tensor([1, 2]), L.tensor([1, 2])),
        lambda L: L.logaddexp2(L.tensor([True]), L.tensor([True])),
        lambda L: L.logaddexp(L.ones(2), 1.0),
    ],
)
def test_logaddexp_errors(fn):
    U.assert_same_error(lambda: fn(kiln), lambda: fn(torch), exact=True)


# ---------------------------------------------------------------------------------------- composites


@pytest.mark.parametrize(
    "a_dtype,b_dtype",
    [
        (kiln.float32, kiln.int64),
        (kiln.float16, kiln.int64),
        (kiln.int64, kiln.int32),
        (kiln.float32, kiln.float64),
        (kiln.float16, kiln.float16),
        (kiln.int64, kiln.bool),
    ],
)
def test_ldexp_dtypes(a_dtype, b_dtype):
    a = U.make_pair((3, 4), a_dtype, layout="transposed", requires_grad=a_dtype.is_floating_point)
    b = U.make_pair((4,), b_dtype, seed=1, low=-5, high=9, requires_grad=b_dtype.is_floating_point)
    half = kiln.float16 in (a_dtype, b_dtype)  # the gradient's products round to float16 in another order
    U.check_op(lambda L, x, y: L.ldexp(x, y), a, b, grad_rtol=5e-3 if half else None)
    U.check_op(lambda L, x, y: x.ldexp(y), a, U.make_pair((), b_dtype, seed=2, low=0, high=3))
    big = U.make_pair((1,), kiln.float16, values=np.array([1e-4]))
    U.check_op(lambda L, x, y: L.ldexp(x, y), big, U.make_pair((1,), kiln.int64, values=np.array([20])))


def test_ldexp_inplace_gradient_and_errors():
    a = U.make_pair((3, 4), kiln.float32)
    U.check_op(lambda L, x, y: x.clone().ldexp_(y), a, U.make_pair((4,), kiln.int64, low=-3, high=3), grad=False)
    U.check_op(lambda L, x, y: L.ldexp_(x.clone(), y), a, U.make_pair((4,), kiln.int64, low=-3, high=3), grad=False)
    _gradcheck(lambda x, y: kiln.ldexp(x, y), (3, 4), (4,))
    for fn in (lambda L: L.ldexp(L.ones(2), 2), lambda L: L.ones(2, dtype=L.int64).ldexp_(L.tensor([1, 2]))):
        U.assert_same_error(lambda fn=fn: fn(kiln), lambda fn=fn: fn(torch), exact=True)


@pytest.mark.parametrize("dtype", [kiln.int64, kiln.float32, kiln.float16, kiln.float64])
def test_float_power(dtype):
    a = U.make_pair((3, 4), dtype, layout="strided", low=0.5, high=3, requires_grad=dtype.is_floating_point)
    e = U.make_pair((4,), kiln.float32, seed=1, low=-2, high=2, requires_grad=True)
    U.check_op(lambda L, x, y: L.float_power(x, y), a, e)
    U.check_op(lambda L, x: L.float_power(x, 2), a)
    U.check_op(lambda L, x: L.float_power(2, x), a)
    U.check_op(lambda L, x: x.float_power(-1.5), a)
    U.check_op(
        lambda L, x: L.float_power(x, 1 / 3),
        U.make_pair((1,), dtype, values=np.array([-8])),
    )


def test_float_power_inplace_and_errors():
    a = U.make_pair((3,), kiln.float64, low=0.5, high=2)
    U.check_op(lambda L, x: x.clone().float_power_(2), a, grad=False)
    U.check_op(lambda L, x, y: x.clone().float_power_(y), a, U.make_pair((3,), kiln.float32), grad=False)
    for fn in (lambda L: L.ones(2).float_power_(2), lambda L: L.float_power(1, 2)):
        U.assert_same_error(lambda fn=fn: fn(kiln), lambda fn=fn: fn(torch), exact=True)
    _gradcheck(lambda x, y: kiln.float_power(x.abs() + 0.5, y), (3, 4), (4,))


@pytest.mark.parametrize("name", ["fmax", "fmin"])
def test_fmax_fmin(name):
    for dtype in (kiln.float32, kiln.float16, kiln.int64, kiln.bool):
        for layout in LAYOUTS:
            a = U.make_pair(
                (3, 4), dtype, layout=layout, integral=True, low=-2, high=2, requires_grad=dtype.is_floating_point
            )
            b = U.make_pair((4,), dtype, seed=1, integral=True, low=-2, high=2, requires_grad=dtype.is_floating_point)
            U.check_op(lambda L, x, y: getattr(L, name)(x, y), a, b)
            U.check_op(lambda L, x, y: getattr(x, name)(y), a, b)
    s = U.make_pair((10,), kiln.float32, values=SPECIALS, requires_grad=True)
    r = U.make_pair((10,), kiln.float32, values=np.roll(SPECIALS, 3), requires_grad=True)
    U.check_op(lambda L, x, y: getattr(L, name)(x, y), s, r)
    U.check_op(lambda L, x, y: getattr(L, name)(x, y), U.make_pair((3,), kiln.int64), U.make_pair((3,), kiln.float32))
    U.check_op(lambda L, x, y: getattr(L, name)(x, y), U.make_pair((0,)), U.make_pair(()))
    U.assert_same_error(lambda: getattr(kiln, name)(kiln.ones(2), 1), lambda: getattr(torch, name)(torch.ones(2), 1))


@pytest.mark.parametrize("name", ["rad2deg", "deg2rad"])
@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64, kiln.float16, kiln.bfloat16, kiln.int64, kiln.bool])
def test_rad2deg_deg2rad(name, dtype):
    a = U.make_pair((3, 4), dtype, layout="transposed", requires_grad=dtype.is_floating_point)
    U.check_op(lambda L, x: getattr(L, name)(x), a)
    U.check_op(lambda L, x: getattr(x, name)(), U.make_pair((), dtype))
    if dtype.is_floating_point:
        U.check_op(lambda L, x: getattr(x.detach().clone(), name + "_")(), a, grad=False)
        U.check_op(lambda L, x: getattr(L, name + "_")(x.detach().clone()), a, grad=False)
    else:
        U.assert_same_error(lambda: getattr(a.k.clone(), name + "_")(), lambda: getattr(a.t.clone(), name + "_")())


@pytest.mark.parametrize("other", ["tensor", 2, 2.5])
@pytest.mark.parametrize("alpha", [1, 2])
def test_rsub(other, alpha):
    a = U.make_pair((3, 4), kiln.float32, layout="strided", requires_grad=True)
    b = U.make_pair((4,), kiln.float32, seed=1, requires_grad=True) if other == "tensor" else other
    U.check_op(lambda L, x, *y: L.rsub(x, y[0] if y else b, alpha=alpha), a, *([b] if other == "tensor" else []))
    U.check_op(lambda L, x: L.rsub(x, 3), U.make_pair((3,), kiln.int64))
    U.assert_same_error(
        lambda: kiln.rsub(kiln.tensor([True]), kiln.tensor([True])),
        lambda: torch.rsub(torch.tensor([True]), torch.tensor([True])),
        exact=True,
    )


# ---------------------------------------------------------------------------------------- top-level in-place functions

import kiln._ops.inplace as _inplace  # noqa: E402

INPLACE = sorted(_inplace.TOP_LEVEL)


@pytest.mark.parametrize("name", INPLACE)
def test_top_level_inplace_functions(name):
    assert hasattr(torch, name), name
    fn = getattr(kiln, name)
    assert fn.__doc__ and fn.__name__ == name
    base = inspect.signature(getattr(kiln.Tensor, name[:-1]))  # the op's, less out= (the result goes into input)
    assert inspect.signature(fn) == base.replace(parameters=[p for p in base.parameters.values() if p.name != "out"])
    args = {
        "clamp_": (0.5,),
        "clip_": (-0.5, 0.5),
        "clamp_min_": (0.0,),
        "clamp_max_": (0.2,),
        "gcd_": (None,),
        "lcm_": (None,),
        "ldexp_": (None,),
        "addmv_": (None, None),
        "xlogy_": (None,),
    }.get(name, ())
    dtype = kiln.int64 if name in ("gcd_", "lcm_") else kiln.float64
    low, high = (0.1, 0.9) if name in ("acosh_", "arccosh_") else (-0.9, 0.9)
    if name in ("acosh_", "arccosh_"):
        low, high = 1.1, 3.0
    x = U.make_pair(
        (3, 4), dtype, low=low if dtype.is_floating_point else -20, high=high if dtype.is_floating_point else 20
    )
    if name == "addmv_":
        x = U.make_pair((3,), dtype)
        m, v = U.make_pair((3, 4), dtype, seed=1), U.make_pair((4,), dtype, seed=2)
        targs, kargs = (m.t, v.t), (m.k, v.k)
    elif None in args:
        other = U.make_pair((4,), kiln.int64 if name != "gcd_" else dtype, seed=3, low=-5, high=5)
        targs, kargs = (other.t,), (other.k,)
    else:
        targs = kargs = args
    t, k = x.t.clone(), x.k.clone()
    t_out = getattr(torch, name)(t, *targs)
    k_out = fn(k, *kargs)
    assert k_out is k
    U.assert_close(k, t)
    U.assert_close(k_out, t_out)


def test_top_level_inplace_refuses_a_leaf_that_requires_grad():
    a = kiln.ones(2, requires_grad=True)
    U.assert_same_error(lambda: kiln.exp_(a), lambda: torch.exp_(torch.ones(2, requires_grad=True)))


@pytest.mark.parametrize("name", ["dropout_", "alpha_dropout_", "feature_alpha_dropout_", "feature_dropout_"])
def test_low_level_dropout_inplace(name):
    x = kiln.ones(4, 3, 2)
    assert getattr(kiln, name)(x, 0.5, False) is x and bool((x == 1).all())
    assert getattr(kiln, name)(x, 0.0, True) is x
    if "alpha" not in name:
        y = kiln.ones(4, 3, 2)
        assert getattr(kiln, name)(y, 1.0, True) is y and bool((y == 0).all())
    kiln.manual_seed(0)
    z = kiln.ones(50, 8, 2)
    getattr(kiln, name)(z, 0.5, True)
    assert 0 < float((z == z.flatten()[0]).to(kiln.float32).mean()) < 1  # some elements were dropped, not all
    U.assert_same_error(
        lambda: getattr(kiln, name)(kiln.ones(3), 1.5, True),
        lambda: getattr(torch, name)(torch.ones(3), 1.5, True),
        exact=True,
    )
    assert list(inspect.signature(getattr(kiln, name)).parameters) == ["input", "p", "train"]


def test_feature_dropout_drops_whole_channels():
    kiln.manual_seed(1)
    out = kiln.feature_dropout(kiln.ones(6, 5, 4), 0.5, True)
    per_channel = out.reshape(30, 4)
    assert bool(((per_channel == 0).all(1) | (per_channel == 2).all(1)).all())
    U.assert_same_error(
        lambda: kiln.feature_dropout(kiln.ones(3), 0.5, True),
        lambda: torch.feature_dropout(torch.ones(3), 0.5, True),
        exact=True,
    )
