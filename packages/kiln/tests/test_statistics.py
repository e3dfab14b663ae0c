"""Statistics and scans against torch: ``cov``/``corrcoef``, ``aminmax``, ``nanmedian``, ``quantile``/
``nanquantile``, ``mode``, ``histogram``/``histogramdd``, ``cummax``/``cummin``, ``logcumsumexp``, ``renorm``
and the in-place ``cumsum_``/``cumprod_``."""

from __future__ import annotations

import warnings

import kiln_testutil as U
import numpy as np
import pytest
import torch

import kiln

NAN, INF = float("nan"), float("inf")
LAYOUTS = ["contiguous", "transposed", "strided", "expanded"]


def _gradcheck(fn, *shapes, seed=0):
    rng = np.random.default_rng(seed)
    xs = [kiln.tensor(rng.standard_normal(s), requires_grad=True) for s in shapes]
    assert kiln.autograd.gradcheck(fn, xs) and kiln.autograd.gradgradcheck(fn, xs)


def _both_raise(fn, exact=True):
    U.assert_same_error(lambda: fn(kiln), lambda: fn(torch), exact=exact)


# ---------------------------------------------------------------------------------------- cov, corrcoef

COV = [
    {},
    {"correction": 0},
    {"correction": 2},
    {"fweights": [1, 2, 0, 3, 1]},
    {"aweights": [0.5, 1.0, 2.0, 0.1, 1.0]},
    {"fweights": [1, 2, 1, 3, 1], "aweights": [0.5, 1.0, 2.0, 0.1, 1.0]},
    {"fweights": [1, 2, 1, 3, 1], "aweights": [0.5, 1.0, 2.0, 0.1, 1.0], "correction": 0},
]


@pytest.mark.parametrize("kwargs", COV, ids=str)
@pytest.mark.parametrize("shape", [(3, 5), (5,), (1, 5)], ids=str)
def test_cov(kwargs, shape):
    x = U.make_pair(shape, kiln.float64, layout="strided" if len(shape) == 2 else "contiguous", requires_grad=True)
    weights = {
        k: U.make_pair((5,), kiln.int64 if k == "fweights" else kiln.float64, values=np.array(v))
        for k, v in kwargs.items()
        if k != "correction"
    }

    def fn(L, a, *ws):
        kw = {k: w for k, w in zip(weights, ws)}
        return L.cov(a, correction=kwargs.get("correction", 1), **kw)

    U.check_op(fn, x, *weights.values())


@pytest.mark.parametrize("dtype", [kiln.int64, kiln.int32, kiln.float16, kiln.float32])
def test_cov_corrcoef_dtypes(dtype):
    x = U.make_pair((2, 4), dtype, low=-5, high=5)
    U.check_op(lambda L, a: L.cov(a), x, rtol=2e-3, atol=2e-3)
    U.check_op(lambda L, a: L.corrcoef(a), x, rtol=2e-3, atol=2e-3)
    U.check_op(
        lambda L, a, w: L.cov(a, aweights=w),
        U.make_pair((2, 4), kiln.float32),
        U.make_pair((4,), kiln.float64, low=0.1, high=2),
    )


def test_cov_degrees_of_freedom_warn():
    for shape, kwargs in (((2, 1), {}), ((3, 4), {"correction": 5}), ((), {}), ((2, 0), {})):
        x = U.make_pair(shape, kiln.float32)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            U.check_op(lambda L, a, kwargs=kwargs: L.cov(a, **kwargs), x)
        assert any("degrees of freedom is <= 0" in str(w.message) for w in caught)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_corrcoef(layout):
    U.check_op(lambda L, a: L.corrcoef(a), U.make_pair((3, 6), kiln.float64, layout=layout, requires_grad=True))
    U.check_op(lambda L, a: a.corrcoef(), U.make_pair((6,), kiln.float64))
    const = U.make_pair((2, 3), kiln.float64, values=np.array([[1.0, 1.0, 1.0], [1.0, 2.0, 4.0]]))
    U.check_op(lambda L, a: L.corrcoef(a), const, grad=False)  # a constant row: NaN where it takes part
    _gradcheck(lambda a: kiln.cov(a, correction=0), (3, 5))
    _gradcheck(lambda a: kiln.corrcoef(a), (3, 5))


@pytest.mark.parametrize(
    "fn",
    [
        lambda L: L.cov(L.ones(2, 4), fweights=L.tensor([1.0, 2, 1, 1])),
        lambda L: L.cov(L.ones(2, 4), fweights=L.tensor([1, -2, 1, 1])),
        lambda L: L.cov(L.ones(2, 4), aweights=L.tensor([1.0, -2, 1, 1])),
        lambda L: L.cov(L.ones(2, 4), fweights=L.tensor([1, 2, 1])),
        lambda L: L.cov(L.ones(2, 4), aweights=L.tensor([1, 2, 1, 1])),
        lambda L: L.cov(L.ones(2, 4), fweights=L.tensor([[1, 2, 1, 1]])),
        lambda L: L.cov(L.ones(2, 4), aweights=L.tensor([0.0, 0, 0, 0])),
        lambda L: L.cov(L.zeros(2, 3, 4)),
        lambda L: L.cov(L.ones(2, 4), correction=1.5),
        lambda L: L.cov(L.tensor([[True, False]])),
        lambda L: L.corrcoef(L.zeros(2, 3, 4)),
    ],
)
def test_cov_errors(fn):
    _both_raise(fn)


# ---------------------------------------------------------------------------------------- aminmax


@pytest.mark.parametrize(
    "kwargs", [{}, {"dim": 0}, {"dim": 1, "keepdim": True}, {"dim": -1}, {"keepdim": True}], ids=str
)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_aminmax(kwargs, layout):
    x = U.make_pair((3, 4), kiln.float64, layout=layout, integral=True, low=-2, high=2, requires_grad=True)
    U.check_op(lambda L, a: L.aminmax(a, **kwargs), x)
    U.check_op(lambda L, a: a.aminmax(**kwargs), U.make_pair((3, 4), kiln.int32, layout=layout))
    out = kiln.aminmax(x.k, **kwargs)
    assert out._fields == ("min", "max")


def test_aminmax_edges():
    U.check_op(lambda L, a: L.aminmax(a, dim=0), U.make_pair((), kiln.float32))
    U.check_op(lambda L, a: L.aminmax(a, dim=1), U.make_pair((0, 3), kiln.float32))
    U.check_op(lambda L, a: L.aminmax(a), U.make_pair((4,), kiln.bool))
    U.check_op(lambda L, a: L.aminmax(a), U.make_pair((5,), kiln.float32, values=np.array([1, NAN, 3, -INF, 0])))
    _both_raise(lambda L: L.aminmax(L.zeros(0)))
    _both_raise(lambda L: L.aminmax(L.zeros(0, 3), dim=0))


# ---------------------------------------------------------------------------------------- nanmedian

NANS = np.array([[1.0, NAN, 3.0, 2.0, 2.0], [NAN, NAN, 5.0, -1.0, NAN], [0.5, 0.5, 0.5, NAN, -2.0]])


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
def test_nanmedian(layout):
    x = U.make_pair((3, 5), kiln.float64, layout=layout, requires_grad=True)
    U.check_op(lambda L, a: L.nanmedian(a), x)
    for kwargs in ({"dim": 0}, {"dim": 1, "keepdim": True}, {"dim": -1}):
        U.check_op(lambda L, a, kwargs=kwargs: L.nanmedian(a, **kwargs), x)
    n = U.make_pair((3, 5), kiln.float64, values=NANS, requires_grad=True)
    U.check_op(lambda L, a: L.nanmedian(a), n)
    U.check_op(lambda L, a: L.nanmedian(a, 1), n)
    U.check_op(lambda L, a: a.nanmedian(0, True), n)


def test_nanmedian_ties_integers_and_edges():
    ties = U.make_pair((2, 6), kiln.float32, values=np.array([[2, 2, 1, NAN, 1, 2], [3, 3, 3, 3, 1, 1.0]]))
    U.check_op(lambda L, a: L.nanmedian(a, 1), ties)
    U.check_op(lambda L, a: L.nanmedian(a, 1), U.make_pair((3, 4), kiln.int64, low=0, high=3))
    U.check_op(lambda L, a: L.nanmedian(a), U.make_pair((0,), kiln.float32))
    U.check_op(lambda L, a: L.nanmedian(a, 0), U.make_pair((), kiln.float32))
    U.check_op(lambda L, a: L.nanmedian(a), U.make_pair((), kiln.float32))
    _both_raise(lambda L: L.nanmedian(L.zeros(2, 0), dim=1))
    # an all-NaN slice: NaN, at an index PyTorch's selection algorithm leaves implementation-defined
    assert np.isnan(kiln.nanmedian(kiln.full((1, 4), NAN), 1).values.item())


# ---------------------------------------------------------------------------------------- quantile

QS = [0.0, 0.4, 1.0, "vector", "0-d"]


@pytest.mark.parametrize("name", ["quantile", "nanquantile"])
@pytest.mark.parametrize("interpolation", ["linear", "lower", "higher", "midpoint", "nearest"])
@pytest.mark.parametrize("q", QS, ids=str)
def test_quantile(name, interpolation, q):
    x = U.make_pair((3, 7), kiln.float64, layout="transposed", requires_grad=True)
    nan = U.make_pair((3, 5), kiln.float64, values=NANS, requires_grad=True)
    qs = {
        "vector": U.make_pair((4,), kiln.float64, values=np.array([0.1, 0.5, 0.25, 0.99])),
        "0-d": U.make_pair((), kiln.float64, values=np.array(0.3)),
    }.get(q, q)
    for data in (x, nan):
        for kwargs in ({}, {"dim": 1}, {"dim": 0, "keepdim": True}, {"keepdim": True}):
            if isinstance(qs, U.Pair):
                U.check_op(
                    lambda L, a, b, kwargs=kwargs: getattr(L, name)(a, b, interpolation=interpolation, **kwargs),
                    data,
                    qs,
                )
            else:
                U.check_op(
                    lambda L, a, kwargs=kwargs: getattr(L, name)(a, qs, interpolation=interpolation, **kwargs), data
                )


def test_quantile_nearest_rounds_half_to_even_and_edges():
    x = U.make_pair((6,), kiln.float32, values=np.arange(6.0))
    q = U.make_pair((5,), kiln.float32, values=np.array([0.1, 0.3, 0.5, 0.7, 0.9]))
    U.check_op(lambda L, a, b: L.quantile(a, b, interpolation="nearest"), x, q)
    U.check_op(lambda L, a: L.quantile(a, 0.5), U.make_pair((), kiln.float32))
    U.check_op(
        lambda L, a, b: L.quantile(a, b, dim=0, keepdim=True),
        U.make_pair((), kiln.float32),
        U.make_pair((2,), kiln.float32, values=np.array([0.2, 0.5])),
    )
    U.check_op(lambda L, a, b: L.quantile(a, b), x, U.make_pair((0,), kiln.float32))
    U.check_op(lambda L, a: a.quantile(0.3, dim=None, keepdim=True), U.make_pair((2, 3), kiln.float32))
    all_nan = U.make_pair((2, 3), kiln.float64, values=np.array([[NAN, NAN, NAN], [1.0, NAN, 2.0]]), requires_grad=True)
    U.check_op(lambda L, a: L.nanquantile(a, 0.5, dim=1), all_nan)
    U.check_op(lambda L, a: L.quantile(a, 0.5, dim=1), all_nan)
    _gradcheck(lambda a: kiln.quantile(a, 0.37, dim=1), (3, 6))
    _gradcheck(lambda a: kiln.nanquantile(a, 0.81), (3, 4))


@pytest.mark.parametrize(
    "fn",
    [
        lambda L: L.quantile(L.ones(3), 1.5),
        lambda L: L.quantile(L.ones(3), -0.1),
        lambda L: L.quantile(L.ones(3), L.tensor([[0.5]])),
        lambda L: L.quantile(L.ones(3), 0.4, interpolation="x"),
        lambda L: L.quantile(L.tensor([1, 2]), 0.5),
        lambda L: L.quantile(L.zeros(0), 0.5),
        lambda L: L.quantile(L.ones(3), L.tensor([0.5], dtype=L.float64)),
        lambda L: L.quantile(L.ones(3, dtype=L.float16), 0.5),
        lambda L: L.nanquantile(L.zeros(2, 0), 0.5, dim=1),
    ],
)
def test_quantile_errors(fn):
    _both_raise(fn)


# ---------------------------------------------------------------------------------------- mode


@pytest.mark.parametrize("dtype", [kiln.float32, kiln.int64, kiln.uint8, kiln.bool, kiln.float16])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
def test_mode(dtype, layout):
    x = U.make_pair((4, 7), dtype, layout=layout, low=0, high=3, integral=True, requires_grad=dtype.is_floating_point)
    for args in ((), (0,), (1, True), (-1,)):
        U.check_op(lambda L, a, args=args: L.mode(a, *args), x)
    U.check_op(lambda L, a: a.mode(), x)


def test_mode_nan_edges_and_gradient():
    U.check_op(lambda L, a: L.mode(a), U.make_pair((3,), kiln.float32, values=np.array([1.0, NAN, NAN])))
    U.check_op(lambda L, a: L.mode(a), U.make_pair((), kiln.float32))
    U.check_op(lambda L, a: L.mode(a, 0), U.make_pair((2, 0), kiln.float32))
    _both_raise(lambda L: L.mode(L.zeros(0)))
    _both_raise(lambda L: L.mode(L.ones(2), 1))
    x = kiln.tensor([[1.0, 2, 2, 3], [4, 4, 1, 1]], dtype=kiln.float64, requires_grad=True)
    kiln.mode(x, 1).values.sum().backward()
    assert x.grad.tolist() == [[0, 0, 1, 0], [0, 0, 0, 1]]


# ---------------------------------------------------------------------------------------- histogram, histogramdd


def _compare_histograms(k, t):
    U.assert_close(k[0], t[0])
    edges_k = k[1] if isinstance(k[1], tuple) else (k[1],)
    edges_t = t[1] if isinstance(t[1], (tuple, list)) else (t[1],)
    for a, b in zip(edges_k, edges_t):
        U.assert_close(a, b)


HISTOGRAM = [
    ({"bins": 4, "range": (0.0, 3.0)}, [1.0, 2, 1, 3, 0, -1, 5]),
    ({"bins": 4}, [1.0, 2, 1]),
    ({"bins": 4, "density": True}, [1.0, 2, 1, 1.5]),
    ({"bins": 3}, [[1.0, 2], [1, 9]]),
    ({"bins": 3}, []),
    ({"bins": 2}, [1.0, 1.0]),
    ({"bins": 7}, "random"),
]


@pytest.mark.parametrize("kwargs,values", HISTOGRAM, ids=str)
@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64])
def test_histogram(kwargs, values, dtype):
    data = np.random.default_rng(3).standard_normal(1000) if values == "random" else np.array(values)
    x = U.make_pair(data.shape, dtype, values=data)
    _compare_histograms(kiln.histogram(x.k, **kwargs), torch.histogram(x.t, **kwargs))
    _compare_histograms(x.k.histogram(**kwargs), x.t.histogram(**kwargs))
    w = U.make_pair(data.shape, dtype, seed=4, low=0, high=2)
    _compare_histograms(kiln.histogram(x.k, weight=w.k, **kwargs), torch.histogram(x.t, weight=w.t, **kwargs))


def test_histogram_with_edges():
    x = U.make_pair((6,), kiln.float32, values=np.array([0.5, 1.0, 2.0, 3.0, 3.5, -1]))
    for edges in ([0.0, 1, 2, 3], [2.0, 1, 0], [0.0, 0.5, 3.5]):
        e = U.make_pair((len(edges),), kiln.float32, values=np.array(edges))
        _compare_histograms(kiln.histogram(x.k, e.k), torch.histogram(x.t, e.t))
        _compare_histograms(kiln.histogram(x.k, bins=e.k, density=True), torch.histogram(x.t, bins=e.t, density=True))


HISTOGRAMDD = [
    ([[0.0, 1.0], [1, 0], [2, 0], [2, 2]], {"bins": [3, 3]}, True),
    ([[0.0, 0.0], [1, 1], [2, 2]], {"bins": [2, 2], "range": [0.0, 1.0, 0.0, 1.0], "density": True}, False),
    ([[0.0, 0.0], [1, 1], [2, 2]], {"bins": 2}, False),
    ([[[0.0, 0.0], [1, 1]]], {"bins": 2}, False),
    ("random", {"bins": [3, 4, 5], "density": True}, True),
]


@pytest.mark.parametrize("values,kwargs,weighted", HISTOGRAMDD, ids=str)
def test_histogramdd(values, kwargs, weighted):
    data = np.random.default_rng(5).standard_normal((100, 3)) if values == "random" else np.array(values)
    x = U.make_pair(data.shape, kiln.float64, values=data)
    w = U.make_pair(data.shape[:-1], kiln.float64, seed=2, low=0, high=3) if weighted else None
    _compare_histograms(
        kiln.histogramdd(x.k, weight=None if w is None else w.k, **kwargs),
        torch.histogramdd(x.t, weight=None if w is None else w.t, **kwargs),
    )
    edges = [U.make_pair((3,), kiln.float64, values=np.array([-1.0, 0.5, 2.0]), seed=i) for i in range(data.shape[-1])]
    _compare_histograms(
        kiln.histogramdd(x.k, bins=[e.k for e in edges]), torch.histogramdd(x.t, bins=[e.t for e in edges])
    )


@pytest.mark.parametrize(
    "fn",
    [
        lambda L: L.histogram(L.tensor([1, 2, 1]), bins=4),
        lambda L: L.histogram(L.tensor([1.0, 2, 1]), bins=4, range=(3.0, 0.0)),
        lambda L: L.histogram(L.tensor([1.0, 2, 1]), bins=0),
        lambda L: L.histogram(L.tensor([1.0, NAN, 1]), bins=3),
        lambda L: L.histogram(L.tensor([1.0, 2, 1], dtype=L.float64), bins=L.tensor([0.0, 1, 2])),
        lambda L: L.histogram(L.tensor([1.0, 2, 1]), bins=2, range=(0, INF)),
        lambda L: L.histogram(L.tensor([1.0, 2, 1]), bins=4, weight=L.tensor([1.0, 2])),
        lambda L: L.histogramdd(L.tensor([0.0, 1, 2]), bins=2),
        lambda L: L.histogramdd(L.tensor([[0.0, 0.0], [1.0, 1.0]]), bins=[2]),
    ],
)
def test_histogram_errors(fn):
    _both_raise(fn)


# ---------------------------------------------------------------------------------------- cummax, cummin


@pytest.mark.parametrize("name", ["cummax", "cummin"])
@pytest.mark.parametrize("dtype", [kiln.float64, kiln.float16, kiln.bfloat16, kiln.int64, kiln.uint8, kiln.bool])
def test_cummax_cummin(name, dtype):
    for layout in LAYOUTS:
        x = U.make_pair(
            (3, 6), dtype, layout=layout, integral=True, low=-2, high=2, requires_grad=dtype.is_floating_point
        )
        U.check_op(lambda L, a: getattr(L, name)(a, 1), x)
        U.check_op(lambda L, a: getattr(a, name)(dim=0), x)
    U.check_op(lambda L, a: getattr(L, name)(a, 0), U.make_pair((), dtype))
    U.check_op(lambda L, a: getattr(L, name)(a, 0), U.make_pair((0, 2), dtype))


def test_cummax_cummin_nan_and_gradient():
    values = np.array([1.0, 3, 2, 3, NAN, 5, NAN, -1])
    for name in ("cummax", "cummin"):
        U.check_op(
            lambda L, a, name=name: getattr(L, name)(a, 0),
            U.make_pair((8,), kiln.float64, values=values, requires_grad=True),
        )
        _gradcheck(lambda a, name=name: getattr(kiln, name)(a, 1).values, (3, 5))
        assert getattr(kiln, name)(kiln.ones(2), 0)._fields == ("values", "indices")
    _both_raise(lambda L: L.cummax(L.ones(2), 1))


# ---------------------------------------------------------------------------------------- logcumsumexp


@pytest.mark.parametrize("dtype", [kiln.float64, kiln.float32, kiln.float16, kiln.bfloat16])
def test_logcumsumexp(dtype):
    tol = {} if dtype in (kiln.float32, kiln.float64) else {"rtol": 1e-2, "atol": 1e-2}
    for layout in LAYOUTS:
        x = U.make_pair((3, 6), dtype, layout=layout, low=-30, high=30, requires_grad=True)
        U.check_op(lambda L, a: L.logcumsumexp(a, 1), x, grad_rtol=tol.get("rtol"), grad_atol=tol.get("atol"))
        U.check_op(lambda L, a: a.logcumsumexp(0), x, grad_rtol=tol.get("rtol"), grad_atol=tol.get("atol"))
    specials = np.array([-1000.0, 0, 1000, -INF, INF, 1, -INF, NAN, 2])
    U.check_op(lambda L, a: L.logcumsumexp(a, 0), U.make_pair((9,), dtype, values=specials), grad=False)
    U.check_op(lambda L, a: L.logcumsumexp(a, 0), U.make_pair((), dtype))
    U.check_op(lambda L, a: L.logcumsumexp(a, 0), U.make_pair((0, 3), dtype))


def test_logcumsumexp_gradients_and_errors():
    _gradcheck(lambda a: kiln.logcumsumexp(a, 1), (3, 5))
    _gradcheck(lambda a: kiln.logcumsumexp(a * 20, 0), (4, 2), seed=1)  # widely spread values
    _both_raise(lambda L: L.logcumsumexp(L.tensor([1, 2]), 0))
    _both_raise(lambda L: L.logcumsumexp(L.ones(2), 1))


# ---------------------------------------------------------------------------------------- renorm


@pytest.mark.parametrize(
    "p,dim,maxnorm", [(2, 0, 3.0), (1, 1, 3.0), (INF, 1, 3.0), (0.5, 0, 1.0), (3, -1, 0.5), (2, 0, 100.0)]
)
def test_renorm(p, dim, maxnorm):
    for layout in LAYOUTS:
        x = U.make_pair((3, 4, 2), kiln.float64, layout=layout, requires_grad=True)
        U.check_op(lambda L, a: L.renorm(a, p, dim, maxnorm), x)
        U.check_op(lambda L, a: a.detach().clone().renorm_(p, dim, maxnorm), x, grad=False)
    U.check_op(lambda L, a: L.renorm(a, p, dim, maxnorm), U.make_pair((2, 2), kiln.float16, low=1, high=4), rtol=2e-3)
    _gradcheck(lambda a: kiln.renorm(a, p if p != INF else 2, dim, 0.5), (3, 4))


@pytest.mark.parametrize(
    "fn",
    [
        lambda L: L.renorm(L.tensor([[1, 2], [3, 4]]), 2, 0, 3),
        lambda L: L.renorm(L.ones(2, 2), -1, 0, 3),
        lambda L: L.renorm(L.ones(2, 2), 0, 0, 3),
        lambda L: L.renorm(L.ones(2, 2), 2, 0, -3),
        lambda L: L.renorm(L.ones(2), 2, 0, 1),
        lambda L: L.renorm(L.tensor(1.0), 2, 0, 1),
    ],
)
def test_renorm_errors(fn):
    _both_raise(fn)


# ---------------------------------------------------------------------------------------- cumsum_, cumprod_


@pytest.mark.parametrize("name", ["cumsum_", "cumprod_"])
def test_inplace_scans(name):
    for dtype in (kiln.int32, kiln.int64, kiln.float32, kiln.float64):
        x = U.make_pair((3, 4), dtype, low=-2, high=3)
        U.check_op(lambda L, a: getattr(a.clone(), name)(1), x)
        U.check_op(lambda L, a: getattr(a.clone(), name)(0, dtype=a.dtype), x)
    x = U.make_pair((3, 4), kiln.float64, requires_grad=True)
    U.check_op(lambda L, a: getattr(a * 1, name)(1), x)  # recorded on a non-leaf
    _both_raise(lambda L: getattr(L.tensor([1, 2, 3], dtype=L.int32), name)(0, dtype=L.float32))
    _both_raise(lambda L: getattr(L.tensor([True, True]), name)(0))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_median_with_nan_is_nan_in_every_float_dtype(dtype):
    vals = [[1.0, float("nan"), 0.0, -2.0], [3.0, 1.0, 2.0, 0.5]]
    k = kiln.tensor(vals, dtype=getattr(kiln, dtype))
    t = torch.tensor(vals, dtype=getattr(torch, dtype))
    assert kiln.median(k).float().isnan().item() and torch.median(t).float().isnan().item()
    kv, ki = kiln.median(k, 1)
    tv, ti = torch.median(t, 1)
    assert kv.float().tolist()[1] == tv.float().tolist()[1] and kv.float().isnan().tolist() == [True, False]
    assert ki.tolist() == ti.tolist()
