"""``kiln.special`` and the top-level special functions (``lgamma``, ``digamma``, ``polygamma``, ``mvlgamma``,
``i0``, ``igamma``/``igammac``, ``xlogy``, ``sinc``) against ``torch.special``: forward values and dtypes
on random, non-contiguous, broadcast, 0-d and empty inputs, integer and bool inputs (promotion) and half
precision where PyTorch's CPU kernels have it; gradients (against torch's, and gradcheck and gradgradcheck
in float64), the derivatives PyTorch does not implement, non-differentiable functions, in-place variants,
``out=``, the namespace and its aliases, and error types and messages. Wide-range accuracy sweeps are in
test_special_accuracy.py."""

from __future__ import annotations

import kiln_testutil as U
import numpy as np
import pytest
import torch
from hypothesis import given, settings

import kiln
import kiln.special

FEW = settings(max_examples=8)  # per op: the table multiplies the examples

# name -> (fn(lib, x), (low, high), PyTorch's CPU kernel takes half precision, forward tolerance (rtol, atol))
UNARY = {
    "lgamma": (lambda L, x: L.lgamma(x), (-4.5, 6.0), True, None),
    "special.gammaln": (lambda L, x: L.special.gammaln(x), (0.1, 30.0), True, None),
    "digamma": (lambda L, x: L.digamma(x), (-4.5, 6.0), True, None),
    "special.psi": (lambda L, x: L.special.psi(x), (0.1, 30.0), True, None),
    "polygamma n=0": (lambda L, x: L.polygamma(0, x), (0.2, 5.0), True, None),
    "polygamma n=1": (lambda L, x: L.polygamma(1, x), (-4.5, 6.0), True, None),
    "polygamma n=2 method": (lambda L, x: x.polygamma(2), (-4.5, 6.0), True, None),
    "special.polygamma n=4": (lambda L, x: L.special.polygamma(4, x), (0.3, 8.0), True, None),
    "mvlgamma p=3": (lambda L, x: L.mvlgamma(x, 3), (1.2, 6.0), True, None),
    "special.multigammaln p=2": (lambda L, x: L.special.multigammaln(x, p=2), (0.7, 6.0), True, None),
    "i0": (lambda L, x: L.i0(x), (-9.0, 9.0), True, None),
    "special.i0": (lambda L, x: L.special.i0(x), (-9.0, 9.0), True, None),
    "special.i0e": (lambda L, x: L.special.i0e(x), (-9.0, 9.0), True, None),
    "special.i1": (lambda L, x: L.special.i1(x), (-9.0, 9.0), True, None),
    "special.i1e": (lambda L, x: L.special.i1e(x), (-9.0, 9.0), True, None),
    "special.erfcx": (lambda L, x: L.special.erfcx(x), (-3.0, 8.0), False, None),
    "special.ndtr": (lambda L, x: L.special.ndtr(x), (-5.0, 5.0), True, None),
    "special.ndtri": (lambda L, x: L.special.ndtri(x), (0.01, 0.99), False, None),
    "special.log_ndtr": (lambda L, x: L.special.log_ndtr(x), (-12.0, 5.0), False, None),
    "special.entr": (lambda L, x: L.special.entr(x), (0.01, 3.0), True, None),
    "sinc": (lambda L, x: L.sinc(x), (-3.0, 3.0), True, None),
    "special.sinc": (lambda L, x: L.special.sinc(x), (-3.0, 3.0), True, None),
    "special.expit": (lambda L, x: L.special.expit(x), (-5.0, 5.0), True, None),
    "special.exp2": (lambda L, x: L.special.exp2(x), (-3.0, 3.0), True, None),
    "special.expm1": (lambda L, x: L.special.expm1(x), (-3.0, 3.0), True, None),
    "special.log1p": (lambda L, x: L.special.log1p(x), (-0.9, 3.0), True, None),
    "special.erf": (lambda L, x: L.special.erf(x), (-3.0, 3.0), True, None),
    "special.erfc": (lambda L, x: L.special.erfc(x), (-3.0, 3.0), True, None),
    "special.erfinv": (lambda L, x: L.special.erfinv(x), (-0.9, 0.9), True, None),
    "special.logit": (lambda L, x: L.special.logit(x, 1e-3), (0.0, 1.0), True, None),
    "special.round": (lambda L, x: L.special.round(x, decimals=1) * x, (-3.0, 3.0), True, None),
    # not differentiable in PyTorch: results without a grad_fn
    "special.modified_bessel_i0": (lambda L, x: L.special.modified_bessel_i0(x), (-9.0, 9.0), False, None),
    "special.modified_bessel_i1": (lambda L, x: L.special.modified_bessel_i1(x), (-9.0, 9.0), False, None),
    "special.modified_bessel_k0": (lambda L, x: L.special.modified_bessel_k0(x), (0.05, 9.0), False, None),
    "special.modified_bessel_k1": (lambda L, x: L.special.modified_bessel_k1(x), (0.05, 9.0), False, None),
    "special.scaled_modified_bessel_k0": (
        lambda L, x: L.special.scaled_modified_bessel_k0(x),
        (0.05, 9.0),
        False,
        None,
    ),
    "special.scaled_modified_bessel_k1": (
        lambda L, x: L.special.scaled_modified_bessel_k1(x),
        (0.05, 9.0),
        False,
        None,
    ),
    # PyTorch's float64 J, Y and Ai are accurate to ~1e-6 only near x = 5 and -2.1 (see test_special_accuracy.py)
    "special.bessel_j0": (lambda L, x: L.special.bessel_j0(x), (-12.0, 12.0), False, (1e-7, 1e-6)),
    "special.bessel_j1": (lambda L, x: L.special.bessel_j1(x), (-12.0, 12.0), False, (1e-7, 1e-6)),
    "special.bessel_y0": (lambda L, x: L.special.bessel_y0(x), (0.05, 12.0), False, (1e-7, 1e-6)),
    "special.bessel_y1": (lambda L, x: L.special.bessel_y1(x), (0.05, 12.0), False, (1e-7, 1e-6)),
    "special.spherical_bessel_j0": (lambda L, x: L.special.spherical_bessel_j0(x), (-12.0, 12.0), False, None),
    "special.airy_ai": (lambda L, x: L.special.airy_ai(x), (-6.0, 6.0), False, (1e-7, 5e-6)),
}


# float32 gradients whose formula cancels (log_ndtr's exp(-(result + x²/2)) far in the tail): the forward
# results' last-bit differences with PyTorch's grow there
GRAD_TOL32 = {"special.log_ndtr": {"grad_rtol": 1e-4}}


def _tol(entry, dtype) -> dict:
    tol = entry[3]
    return {"rtol": tol[0], "atol": tol[1]} if tol is not None and dtype is kiln.float64 else {}


@pytest.mark.parametrize("name", list(UNARY))
@FEW
@given(shape=U.shapes(), layout=U.layouts, dtype=U.float_dtypes, seed=U.seeds)
def test_unary_forward_backward(name, shape, layout, dtype, seed):
    """Values, dtype and gradients (or their absence) on random, non-contiguous, 0-d and empty inputs."""
    fn, (low, high), _, _ = UNARY[name]
    x = U.make_pair(shape, dtype, layout=layout, seed=seed, requires_grad=True, low=low, high=high)
    U.check_op(
        fn, x, seed=seed, **_tol(UNARY[name], dtype), **(GRAD_TOL32.get(name, {}) if dtype is kiln.float32 else {})
    )


@pytest.mark.parametrize("name", list(UNARY))
def test_unary_every_dtype(name):
    """Integer and bool inputs compute in the default float dtype; half precision where PyTorch's CPU
    kernel has it, PyTorch's NotImplementedError where it does not."""
    fn, (low, high), half, _ = UNARY[name]
    results = {}
    for d in U.ALL_DTYPES:
        tol = {"rtol": 2e-2, "atol": 2e-3} if d in U.HALF_DTYPES else _tol(UNARY[name], d)
        for shape in ((2, 3), (), (0, 2)):
            x = U.make_pair(shape, d, seed=3, low=max(low, -3.0), high=min(high, 4.0))
            results[f"{U.dtype_id(d)} {shape}"] = U.mismatch(fn, x, grad=False, **tol)
    U.report(results)
    for d in U.HALF_DTYPES:  # the premise: the table says what PyTorch does
        try:
            fn(torch, torch.ones(2, dtype=U.K2T[d]))
            assert half, f"{name}: PyTorch computes {d}; the table says it refuses"
        except NotImplementedError:
            assert not half, f"{name}: PyTorch refuses {d}; the table says it computes"


def test_default_dtype_is_followed(default_dtype):
    default_dtype(kiln.float64)
    for fn in (lambda L, x: L.lgamma(x), lambda L, x: L.special.erfcx(x), lambda L, x: L.special.zeta(x, 2)):
        U.check_op(fn, U.make_pair((3,), kiln.int64, low=1, high=5), grad=False)


# ---------------------------------------------------------------------------------------- binary

# name -> (fn(lib, a, b), (low, high) of a, (low, high) of b, tolerance for half precision results)
BINARY = {
    "xlogy": (lambda L, a, b: L.xlogy(a, b), (-2.0, 2.0), (0.1, 3.0)),
    "special.xlogy": (lambda L, a, b: L.special.xlogy(a, b), (-2.0, 2.0), (0.1, 3.0)),
    "special.xlog1py": (lambda L, a, b: L.special.xlog1py(a, b), (-2.0, 2.0), (-0.7, 3.0)),
    "special.zeta": (lambda L, a, b: L.special.zeta(a, b), (1.2, 6.0), (0.3, 4.0)),
    "igamma": (lambda L, a, b: L.igamma(a, b), (0.2, 5.0), (0.1, 6.0)),
    "igammac": (lambda L, a, b: L.igammac(a, b), (0.2, 5.0), (0.1, 6.0)),
    "special.gammainc": (lambda L, a, b: L.special.gammainc(a, b), (0.2, 5.0), (0.1, 6.0)),
    "special.gammaincc method": (lambda L, a, b: a.igammac(b), (0.2, 5.0), (0.1, 6.0)),
}
# PyTorch's derivative of these in their first argument is "not implemented": only the second gets a gradient
SECOND_ONLY = {"special.zeta", "igamma", "igammac", "special.gammainc", "special.gammaincc method"}


@pytest.mark.parametrize("name", list(BINARY))
@FEW
@given(shapes=U.broadcastable_shapes(), dtype=U.float_dtypes, seed=U.seeds)
def test_binary_broadcast_forward_backward(name, shapes, dtype, seed):
    fn, (al, ah), (bl, bh) = BINARY[name]
    a = U.make_pair(shapes[0], dtype, seed=seed, requires_grad=name not in SECOND_ONLY, low=al, high=ah)
    b = U.make_pair(shapes[1], dtype, layout="strided", seed=seed + 1, requires_grad=True, low=bl, high=bh)
    U.check_op(fn, a, b, seed=seed)


@pytest.mark.parametrize("name", list(BINARY))
def test_binary_dtype_pairs(name):
    """Every (dtype, dtype) pair: PyTorch's promotion, and its refusals (integer igamma, half zeta)."""
    fn, (al, ah), (bl, bh) = BINARY[name]
    results = {}
    for i, da in enumerate(U.ALL_DTYPES):
        for j, db in enumerate(U.ALL_DTYPES):
            a = U.make_pair((2, 3), da, seed=10 * i + j, low=al, high=ah)
            b = U.make_pair((3,), db, seed=100 + 10 * i + j, low=bl, high=bh)
            results[f"{U.dtype_id(da)},{U.dtype_id(db)}"] = U.mismatch(fn, a, b, grad=False, rtol=2e-2, atol=2e-3)
    U.report(results)


SCALAR_CASES = {
    "xlogy(number, t)": lambda L, t: L.xlogy(2.5, t),
    "xlogy(t, number)": lambda L, t: L.xlogy(t, 0.5),
    "xlogy(int t, float)": lambda L, t: L.xlogy(t.to(L.int64), 2.5),
    "Tensor.xlogy(number)": lambda L, t: t.xlogy(3),
    "xlog1py(number, t)": lambda L, t: L.special.xlog1py(-1.5, t),
    "xlog1py(t, number)": lambda L, t: L.special.xlog1py(t, 2.0),
    "zeta(number, t)": lambda L, t: L.special.zeta(3, t),
    "zeta(t, number)": lambda L, t: L.special.zeta(t.detach() + 1.0, 1.5),
    "zeta(0-d float64, t)": lambda L, t: L.special.zeta(L.tensor(2.5, dtype=L.float64), t),
}


@pytest.mark.parametrize("name", list(SCALAR_CASES))
@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64])
def test_binary_number_operands(name, dtype):
    """Numbers on either side (PyTorch's Scalar overloads), with gradients of the tensor operand and the
    autograd node names of each overload (``XlogyBackward1``...)."""
    t = U.make_pair((2, 3), dtype, seed=5, requires_grad=True, low=0.3, high=3.0)
    k_out, t_out = U.check_op(SCALAR_CASES[name], t)
    assert type(k_out.grad_fn).__name__ == type(t_out.grad_fn).__name__


POLYNOMIALS = [f"{p}chebyshev_polynomial_{k}" for p in ("", "shifted_") for k in "tuvw"]
POLYNOMIALS += ["hermite_polynomial_h", "hermite_polynomial_he", "laguerre_polynomial_l", "legendre_polynomial_p"]


@pytest.mark.parametrize("name", POLYNOMIALS)
@FEW
@given(shapes=U.broadcastable_shapes(), layout=U.layouts, dtype=U.float_dtypes, seed=U.seeds)
def test_polynomials_broadcast_and_layouts(name, shapes, layout, dtype, seed):
    """Non-contiguous and broadcast inputs and degrees (float and int64); not differentiable, as in PyTorch."""
    x = U.make_pair(shapes[0], dtype, layout=layout, seed=seed, requires_grad=True, low=-1.3, high=1.3)
    n = U.make_pair(shapes[1], dtype, seed=seed + 1, low=0, high=12, integral=True)
    U.check_op(lambda L, a, b: getattr(L.special, name)(a, b), x, n)
    U.check_op(lambda L, a, b: getattr(L.special, name)(a, b.to(L.int64)), x, n)


@pytest.mark.parametrize("name", POLYNOMIALS)
def test_polynomials_dtypes_and_numbers(name):
    results = {}
    for d in U.ALL_DTYPES:
        x = U.make_pair((2, 3), d, seed=1, low=-1, high=2)
        n = U.make_pair((3,), kiln.int64, seed=2, low=0, high=9)
        results[U.dtype_id(d)] = U.mismatch(lambda L, a, b: getattr(L.special, name)(a, b), x, n, grad=False)
        results[f"{U.dtype_id(d)} degree"] = U.mismatch(  # float32: PyTorch's recurrence rounds in float32
            lambda L, a, b: getattr(L.special, name)(b, a),
            x,
            U.make_pair((3,), kiln.float32, seed=3),
            grad=False,
            rtol=2e-5,
        )
    x = U.make_pair((2, 3), kiln.float64, seed=4, low=-1, high=1)
    for degree in (0, 1, 7, 9, 2.7, True, -1):
        results[f"degree {degree!r}"] = U.mismatch(lambda L, a, k=degree: getattr(L.special, name)(a, k), x, grad=False)
    results["number input"] = U.mismatch(lambda L, a: getattr(L.special, name)(0.25, a.to(L.int64)), x, grad=False)
    U.report(results)


def test_autograd_node_names():
    k, t = U.both(np.array([0.5, 1.5, 2.5]), requires_grad=True)
    k2, t2 = U.both(np.array([1.5, 2.5, 3.5]))
    cases = [
        lambda L, x, y: L.lgamma(x),
        lambda L, x, y: L.digamma(x),
        lambda L, x, y: L.polygamma(2, x),
        lambda L, x, y: L.mvlgamma(x + 2, 2),
        lambda L, x, y: L.i0(x),
        lambda L, x, y: L.special.i0e(x),
        lambda L, x, y: L.special.i1(x),
        lambda L, x, y: L.special.i1e(x),
        lambda L, x, y: L.special.erfcx(x),
        lambda L, x, y: L.special.ndtri(x / 3),
        lambda L, x, y: L.special.log_ndtr(x),
        lambda L, x, y: L.special.entr(x),
        lambda L, x, y: L.sinc(x),
        lambda L, x, y: L.xlogy(x, y),
        lambda L, x, y: L.special.xlog1py(x, y),
        lambda L, x, y: L.special.zeta(y, x),
        lambda L, x, y: L.igamma(y, x),
        lambda L, x, y: L.igammac(y, x),
    ]
    for i, fn in enumerate(cases):
        assert type(fn(kiln, k, k2).grad_fn).__name__ == type(fn(torch, t, t2).grad_fn).__name__, i


# ---------------------------------------------------------------------------------------- gradients


def _f64(shape, seed, low=0.3, high=3.0):
    return kiln.tensor(U.rand_array(shape, kiln.float64, U.rng_for(seed), low=low, high=high), requires_grad=True)


GRADCHECK = {
    "lgamma": (lambda x: kiln.lgamma(x), lambda: (_f64((2, 3), 1, -2.8, 4.0),)),
    "digamma": (lambda x: kiln.digamma(x), lambda: (_f64((2, 3), 2, -2.8, 4.0),)),
    "polygamma 1": (lambda x: kiln.polygamma(1, x), lambda: (_f64((2, 3), 3),)),
    "polygamma 3": (lambda x: x.polygamma(3), lambda: (_f64((2, 3), 4, 0.5, 3.0),)),
    "mvlgamma": (lambda x: kiln.mvlgamma(x, 3), lambda: (_f64((2, 3), 5, 1.5, 4.0),)),
    "i0": (lambda x: kiln.i0(x), lambda: (_f64((2, 3), 6, -4.0, 4.0),)),
    "i0e": (lambda x: kiln.special.i0e(x), lambda: (_f64((2, 3), 7, -4.0, 4.0),)),
    "i1": (lambda x: kiln.special.i1(x), lambda: (_f64((2, 3), 8, -4.0, 4.0),)),
    "i1e": (lambda x: kiln.special.i1e(x), lambda: (_f64((2, 3), 9, -4.0, 4.0),)),
    "erfcx": (lambda x: kiln.special.erfcx(x), lambda: (_f64((2, 3), 10, -2.0, 4.0),)),
    "ndtr": (lambda x: kiln.special.ndtr(x), lambda: (_f64((2, 3), 11, -3.0, 3.0),)),
    "ndtri": (lambda x: kiln.special.ndtri(x), lambda: (_f64((2, 3), 12, 0.05, 0.95),)),
    "log_ndtr": (lambda x: kiln.special.log_ndtr(x), lambda: (_f64((2, 3), 13, -6.0, 3.0),)),
    "entr": (lambda x: kiln.special.entr(x), lambda: (_f64((2, 3), 14, 0.2, 3.0),)),
    "sinc": (lambda x: kiln.sinc(x), lambda: (_f64((2, 3), 15, -2.0, 2.0),)),
    "xlogy": (lambda x, y: kiln.xlogy(x, y), lambda: (_f64((2, 3), 16, -2.0, 2.0), _f64((3,), 17))),
    "xlog1py": (lambda x, y: kiln.special.xlog1py(x, y), lambda: (_f64((2, 3), 18, -2.0, 2.0), _f64((3,), 19))),
    "zeta in other": (lambda y: kiln.special.zeta(3.0, y), lambda: (_f64((2, 3), 20, 0.5, 3.0),)),
    "igamma in other": (
        lambda y: kiln.igamma(kiln.tensor([0.7, 2.5, 4.0], dtype=kiln.float64), y),
        lambda: (_f64((2, 3), 21),),
    ),
    "igammac in other": (
        lambda y: kiln.igammac(kiln.tensor([0.7, 2.5, 4.0], dtype=kiln.float64), y),
        lambda: (_f64((2, 3), 22),),
    ),
}


@pytest.mark.parametrize("name", list(GRADCHECK))
def test_gradcheck(name):
    fn, make = GRADCHECK[name]
    assert kiln.autograd.gradcheck(fn, make())


@pytest.mark.parametrize("name", ["lgamma", "digamma", "i0", "i1e", "erfcx", "log_ndtr", "sinc", "xlogy", "entr"])
def test_gradgradcheck(name):
    fn, make = GRADCHECK[name]
    assert kiln.autograd.gradgradcheck(fn, make())


def test_gradients_at_the_edges():
    """PyTorch's values where the formulas divide by zero: ``i1'(0) = i1e'(0) = 1/2``, ``sinc'(0) = 0``,
    ``xlogy``'s gradient in ``x``: ``log(y)``, also where ``x == 0``, but 0 there when ``y <= 0`` (``xlog1py``:
    ``y <= -1``), ``entr'(0) = inf``; NaN and inf inputs."""
    values = np.array([0.0, -0.0, 1e-300, np.nan, np.inf, -np.inf, 2.0, -3.0])
    for fn in (
        lambda L, x: L.special.i1(x),
        lambda L, x: L.special.i1e(x),
        lambda L, x: L.special.i0e(x),
        lambda L, x: L.sinc(x),
        lambda L, x: L.special.entr(x),
        lambda L, x: L.xlogy(x, x.detach().abs()),
        lambda L, x: L.special.xlog1py(x, x.detach()),
        lambda L, x: L.xlogy(x, x.detach().flip(0)),  # x == 0 beside y > 0 (gradient log y) and y <= 0 (0)
        lambda L, x: L.special.xlog1py(x, x.detach().flip(0)),
        lambda L, x: L.lgamma(x),
        lambda L, x: L.digamma(x),
    ):
        U.check_op(fn, U.make_pair((8,), kiln.float64, values=values, requires_grad=True))


@pytest.mark.parametrize(
    "name, fn, message",
    [
        ("igamma", lambda L, a, x: L.igamma(a, x), "the derivative for 'igamma: input' is not implemented."),
        ("igammac", lambda L, a, x: L.igammac(a, x), "the derivative for 'igammac: input' is not implemented."),
        (
            "gammainc",
            lambda L, a, x: L.special.gammainc(a, x),
            "the derivative for 'igamma: input' is not implemented.",
        ),
        ("zeta", lambda L, a, x: L.special.zeta(a + 1, x), "the derivative for 'zeta' is not implemented."),
    ],
)
def test_derivatives_pytorch_does_not_implement(name, fn, message):
    """Backward raises PyTorch's NotImplementedError when the first argument requires grad."""
    for L in (torch, kiln):
        a = L.tensor([1.5, 2.5], requires_grad=True)
        out = fn(L, a, L.tensor([0.5, 3.0]))
        with pytest.raises(NotImplementedError, match=message):
            out.sum().backward()


# ---------------------------------------------------------------------------------------- in place, out=


INPLACE = {
    "lgamma_": (lambda x: x.lgamma_(), (0.2, 4.0)),
    "digamma_": (lambda x: x.digamma_(), (0.2, 4.0)),
    "polygamma_": (lambda x: x.polygamma_(1), (0.2, 4.0)),
    "mvlgamma_": (lambda x: x.mvlgamma_(2), (1.0, 4.0)),
    "i0_": (lambda x: x.i0_(), (-3.0, 3.0)),
    "sinc_": (lambda x: x.sinc_(), (-3.0, 3.0)),
    "xlogy_": (lambda x: x.xlogy_(x.detach() + 1.0), (0.2, 3.0)),
    "igamma_": (lambda x: x.detach().igamma_(x.detach() + 0.5), (0.2, 3.0)),
    "igammac_": (lambda x: x.detach().igammac_(x.detach() * 2), (0.2, 3.0)),
}


@pytest.mark.parametrize("name", list(INPLACE))
def test_inplace_variants(name):
    """On a non-leaf: values, the returned tensor and the gradient through the in-place op."""
    fn, (low, high) = INPLACE[name]
    x = U.make_pair((2, 3), kiln.float64, seed=7, requires_grad=True, low=low, high=high)

    def run(L, t):
        y = t * 1
        out = fn(y)
        assert out is y
        return out

    U.check_op(run, x)


@pytest.mark.parametrize(
    "name, fn",
    [
        ("lgamma_", lambda L: L.tensor([1, 2, 3]).lgamma_()),
        ("sinc_", lambda L: L.tensor([1, 2, 3]).sinc_()),
        ("polygamma_", lambda L: L.tensor([1, 2, 3]).polygamma_(1)),
        ("xlogy_", lambda L: L.tensor([0, 1, 2]).xlogy_(L.tensor([0.5, 1.0, 2.0]))),
        ("xlogy_ broadcast", lambda L: L.tensor([0.0, 1.0, 2.0]).xlogy_(L.ones(2, 3))),
        ("i0_ leaf", lambda L: L.ones(2, requires_grad=True).i0_()),
    ],
)
def test_inplace_errors(name, fn):
    U.assert_same_error(lambda: fn(kiln), lambda: fn(torch))


def test_out_argument():
    for fn in (
        lambda L, x, o: L.lgamma(x, out=o),
        lambda L, x, o: L.special.zeta(x + 1, 2.0, out=o),
        lambda L, x, o: L.special.ndtr(x, out=o),
        lambda L, x, o: L.special.chebyshev_polynomial_t(x, 3, out=o),
        lambda L, x, o: L.special.xlog1py(x, x, out=o),
        lambda L, x, o: L.polygamma(2, x, out=o),
    ):
        x = U.make_pair((2, 3), kiln.float64, seed=2, low=0.5, high=2.0)
        ko, to = kiln.empty(2, 3, dtype=kiln.float64), torch.empty(2, 3, dtype=torch.float64)
        k_res, t_res = fn(kiln, x.k, ko), fn(torch, x.t, to)
        assert k_res is ko and t_res is to
        U.assert_close(ko, to)


# ---------------------------------------------------------------------------------------- namespace


def test_namespace_is_torch_special():
    torch_names = {n for n in dir(torch.special) if not n.startswith("_") and callable(getattr(torch.special, n))}
    torch_names -= {"Tensor"}
    assert set(kiln.special.__all__) == torch_names
    for n in kiln.special.__all__:
        fn = getattr(kiln.special, n)
        assert callable(fn) and (fn.__doc__ or "").strip(), n


def test_aliases_are_the_top_level_functions():
    S = kiln.special
    same = {
        "gammaln": kiln.lgamma,
        "psi": kiln.digamma,
        "digamma": kiln.digamma,
        "polygamma": kiln.polygamma,
        "multigammaln": kiln.mvlgamma,
        "gammainc": kiln.igamma,
        "gammaincc": kiln.igammac,
        "expit": kiln.sigmoid,
        "exp2": kiln.exp2,
        "expm1": kiln.expm1,
        "log1p": kiln.log1p,
        "erf": kiln.erf,
        "erfc": kiln.erfc,
        "erfinv": kiln.erfinv,
        "logit": kiln.logit,
        "round": kiln.round,
        "i0": kiln.i0,
        "sinc": kiln.sinc,
        "xlogy": kiln.xlogy,
        "logsumexp": kiln.logsumexp,
    }
    for name, fn in same.items():
        assert getattr(S, name) is fn, name
    for name in ("lgamma", "digamma", "polygamma", "mvlgamma", "i0", "igamma", "igammac", "xlogy", "sinc"):
        assert callable(getattr(kiln.Tensor, name)) and callable(getattr(kiln.Tensor, f"{name}_")), name


@pytest.mark.parametrize("dtype", [None, kiln.float64])
def test_softmax_family(dtype):
    x = U.make_pair((3, 4), kiln.float32, seed=1, requires_grad=True)
    td = None if dtype is None else U.K2T[dtype]
    for fn in (
        lambda L, t: L.special.softmax(t, 1, dtype=td if L is torch else dtype),
        lambda L, t: L.special.log_softmax(t, dim=0, dtype=td if L is torch else dtype),
        lambda L, t: L.special.logsumexp(t, (0, 1), keepdim=True),
    ):
        U.check_op(fn, x)


# ---------------------------------------------------------------------------------------- errors

ERRORS = {
    "polygamma negative n": lambda L: L.polygamma(-1, L.ones(2)),
    "polygamma float n": lambda L: L.polygamma(1.5, L.ones(2)),
    "polygamma bool n": lambda L: L.polygamma(True, L.ones(2)),
    "polygamma list": lambda L: L.polygamma(1, [1.0]),
    "Tensor.polygamma negative": lambda L: L.ones(2).polygamma(-2),
    "special.polygamma negative": lambda L: L.special.polygamma(-1, L.ones(2)),
    "mvlgamma p=0": lambda L: L.mvlgamma(L.ones(2) * 3, 0),
    "mvlgamma bool": lambda L: L.mvlgamma(L.ones(2, dtype=L.bool), 1),
    "mvlgamma float p": lambda L: L.mvlgamma(L.ones(2) * 3, 1.5),
    "multigammaln p=0": lambda L: L.special.multigammaln(L.ones(2) * 3, 0),
    "lgamma list": lambda L: L.lgamma([1.0, 2.0]),
    "digamma number": lambda L: L.digamma(2.0),
    "i0 list": lambda L: L.i0([1.0]),
    "igamma number": lambda L: L.igamma(L.ones(2), 2),
    "igamma number first": lambda L: L.igamma(2.0, L.ones(2)),
    "igamma int64": lambda L: L.igamma(L.ones(2, dtype=L.int64), L.ones(2, dtype=L.int64)),
    "igammac bool": lambda L: L.igammac(L.ones(2, dtype=L.bool), L.ones(2, dtype=L.bool)),
    "gammainc int32": lambda L: L.special.gammainc(L.ones(2, dtype=L.int32), L.ones(2, dtype=L.int32)),
    "zeta two numbers": lambda L: L.special.zeta(2.0, 3.0),
    "zeta list": lambda L: L.special.zeta([2.0], L.ones(2)),
    "zeta half": lambda L: L.special.zeta(L.ones(2, dtype=L.float16), 2.0),
    "zeta bfloat16 second": lambda L: L.special.zeta(2, L.ones(2, dtype=L.bfloat16)),
    "xlogy two numbers": lambda L: L.xlogy(2, 3),
    "xlogy list": lambda L: L.xlogy(L.ones(2), [1.0]),
    "xlog1py two numbers": lambda L: L.special.xlog1py(2.0, 3.0),
    "erfcx half": lambda L: L.special.erfcx(L.ones(2, dtype=L.float16)),
    "ndtri bfloat16": lambda L: L.special.ndtri(L.ones(2, dtype=L.bfloat16)),
    "log_ndtr half": lambda L: L.special.log_ndtr(L.ones(2, dtype=L.float16)),
    "airy_ai half": lambda L: L.special.airy_ai(L.ones(2, dtype=L.float16)),
    "bessel_j0 bfloat16": lambda L: L.special.bessel_j0(L.ones(2, dtype=L.bfloat16)),
    "modified_bessel_k1 half": lambda L: L.special.modified_bessel_k1(L.ones(2, dtype=L.float16)),
    "chebyshev two numbers": lambda L: L.special.chebyshev_polynomial_t(0.5, 2),
    "chebyshev list": lambda L: L.special.chebyshev_polynomial_t([0.5], L.ones(2)),
    "hermite half": lambda L: L.special.hermite_polynomial_h(L.ones(2, dtype=L.float16), 2),
    "laguerre half degree": lambda L: L.special.laguerre_polynomial_l(2, L.ones(2, dtype=L.float16)),
    "sinc string": lambda L: L.sinc("x"),
    "entr number": lambda L: L.special.entr(1.0),
    "ndtr list": lambda L: L.special.ndtr([0.5]),
}


@pytest.mark.parametrize("name", list(ERRORS))
def test_errors(name):
    """PyTorch's exception type, and its message where kiln's function has PyTorch's name."""
    fn = ERRORS[name]
    exc = U.torch_error(lambda: fn(torch))
    with pytest.raises(type(exc)) as info:
        fn(kiln)
    ours, theirs = str(info.value), str(exc)
    if not name.startswith(("gammainc", "multigammaln", "special.polygamma", "lgamma list", "digamma number")):
        assert ours == theirs or theirs in ours, f"kiln: {ours!r}\ntorch: {theirs!r}"
