"""Matrix functions and least squares against torch: ``linalg.pinv``/``pinverse``, ``linalg.matrix_rank``,
``linalg.cond``, ``linalg.lstsq``, ``linalg.matrix_exp``, ``linalg.matrix_power``, ``linalg.tensorinv``,
``linalg.tensorsolve``, ``linalg.vander``, ``linalg.householder_product``, ``linalg.diagonal``,
``linalg.matmul``, ``logdet`` and the legacy ``qr``/``svd``/``matrix_power``."""

from __future__ import annotations

import math
import warnings

import kiln_testutil as U
import numpy as np
import pytest
import torch

import kiln

RNG = np.random.default_rng(0)


def _general(n, batch=(), seed=0, m=None):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(batch + ((m or n), n))
    return a + 3 * n**0.5 * np.eye(n) if m is None else a


def _spd(n, batch=(), seed=0):
    a = np.random.default_rng(seed).standard_normal(batch + (n, n))
    return a @ np.swapaxes(a, -1, -2) + n * np.eye(n)


def _pair(values, dtype=kiln.float64, layout="contiguous", grad=True):
    return U.make_pair(values.shape, dtype, values=values, layout=layout, requires_grad=grad)


def _gradcheck(fn, *arrays):
    xs = [kiln.tensor(a, dtype=kiln.float64, requires_grad=True) for a in arrays]
    assert kiln.autograd.gradcheck(fn, xs) and kiln.autograd.gradgradcheck(fn, xs)


def _both_raise(fn, exact=True):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exc = U.torch_error(lambda: fn(torch))
        if isinstance(exc, torch.linalg.LinAlgError):
            with pytest.raises(kiln.linalg.LinAlgError) as info:
                fn(kiln)
            assert str(info.value) == U.kiln_message(str(exc))
            return
        U.assert_same_error(lambda: fn(kiln), lambda: fn(torch), exact=exact)


# ---------------------------------------------------------------------------------------- pinv, rank, cond


@pytest.mark.parametrize("shape", [(3, 5), (5, 3), (2, 4, 4), (0, 3)], ids=str)
@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64])
def test_pinv(shape, dtype):
    a = U.make_pair(shape, dtype, layout="transposed", requires_grad=True)
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype is kiln.float32 else {}
    U.check_op(lambda L, x: L.linalg.pinv(x), a, **tol, grad_rtol=tol.get("rtol"), grad_atol=tol.get("atol"))
    U.check_op(lambda L, x: L.pinverse(x), a, **tol, grad_rtol=tol.get("rtol"), grad_atol=tol.get("atol"))
    U.check_op(lambda L, x: x.pinverse(rcond=0.3), a, **tol, grad_rtol=tol.get("rtol"), grad_atol=tol.get("atol"))


def test_pinv_tolerances_hermitian_and_rank_deficient():
    low_rank = RNG.standard_normal((4, 2)) @ RNG.standard_normal((2, 3))
    U.check_op(lambda L, x: L.linalg.pinv(x), _pair(low_rank), rtol=1e-6, atol=1e-6)
    U.check_op(lambda L, x: L.linalg.pinv(x, hermitian=True), _pair(_spd(3)))
    U.check_op(lambda L, x: L.linalg.pinv(x, atol=0.5), _pair(np.ones((2, 3))))
    U.check_op(lambda L, x: L.linalg.pinv(x, rtol=0.5), _pair(_general(3)))
    atol = U.make_pair((2,), kiln.float64, values=np.array([0.5, 5.0]))
    U.check_op(lambda L, x, t: L.linalg.pinv(x, atol=t), _pair(np.ones((2, 2, 3))), atol, grad=False)
    _gradcheck(lambda x: kiln.linalg.pinv(x), RNG.standard_normal((3, 5)))
    _gradcheck(lambda x: kiln.linalg.pinv((x + x.mT) / 2, hermitian=True), _spd(3))


@pytest.mark.parametrize(
    "fn",
    [
        lambda L: L.linalg.pinv(L.ones(2, 3, dtype=L.int64)),
        lambda L: L.linalg.pinv(L.ones(3)),
        lambda L: L.linalg.matrix_rank(L.ones(3)),
        lambda L: L.linalg.matrix_rank(L.ones(3, 3, dtype=L.int64)),
        lambda L: L.linalg.cond(L.ones(2, 3), "fro"),
        lambda L: L.linalg.cond(L.eye(3), 3),
        lambda L: L.linalg.cond(L.eye(3), "x"),
        lambda L: L.linalg.cond(L.ones(3)),
        lambda L: L.linalg.cond(L.eye(3, dtype=L.int64)),
    ],
)
def test_pinv_rank_cond_errors(fn):
    _both_raise(fn)


@pytest.mark.parametrize(
    "kwargs", [{}, {"atol": 1.0}, {"rtol": 0.1}, {"hermitian": True}, {"atol": 0.5, "rtol": 0.2}], ids=str
)
def test_matrix_rank(kwargs):
    for a in (_general(4), np.ones((3, 4)), RNG.standard_normal((2, 5, 2)) @ RNG.standard_normal((2, 2, 5)), _spd(3)):
        if kwargs.get("hermitian") and a.shape[-1] != a.shape[-2]:
            continue
        x = _pair(a, grad=False)
        U.check_op(lambda L, m: L.linalg.matrix_rank(m, **kwargs), x)
    U.check_op(lambda L, m: L.linalg.matrix_rank(m), U.make_pair((0, 3)))


@pytest.mark.parametrize("p", [None, 2, -2, 1, -1, math.inf, -math.inf, "fro", "nuc"], ids=str)
def test_cond(p):
    # torch's own backward of cond for 1, -1, inf, -inf and 'fro' fails (an in-place write to inv_ex's output):
    # those are compared forward, and kiln's gradients are checked by gradcheck below
    a = _pair(_general(4, (2,)), layout="transposed")
    U.check_op(lambda L, x: L.linalg.cond(x, p), a, rtol=1e-6, grad=p in (None, 2, -2, "nuc"))
    U.check_op(lambda L, x: L.linalg.cond(x, p), _pair(np.zeros((2, 2)), grad=False))  # singular: inf (or nan)
    if p in (None, 2, -2):
        U.check_op(lambda L, x: L.linalg.cond(x, p), _pair(RNG.standard_normal((3, 5))), rtol=1e-6)
    _gradcheck(lambda x: kiln.linalg.cond(x, p), _general(3))


# ---------------------------------------------------------------------------------------- lstsq

DRIVERS = [None, "gels", "gelsy", "gelsd", "gelss"]


@pytest.mark.parametrize("driver", DRIVERS)
def test_lstsq(driver):
    tall, b = _pair(RNG.standard_normal((5, 3))), U.make_pair((5, 2), kiln.float64, requires_grad=True)
    U.check_op(lambda L, x, y: L.linalg.lstsq(x, y, driver=driver), tall, b, rtol=1e-7, atol=1e-7)
    wide = _pair(RNG.standard_normal((3, 5)))
    U.check_op(
        lambda L, x, y: L.linalg.lstsq(x, y, driver=driver),
        wide,
        U.make_pair((3, 2), kiln.float64, requires_grad=True),
        rtol=1e-7,
    )
    U.check_op(
        lambda L, x, y: L.linalg.lstsq(x, y, driver=driver),
        _pair(_general(3, (2,))),
        U.make_pair((2, 3, 1), kiln.float64, requires_grad=True),
        rtol=1e-7,
    )
    U.check_op(lambda L, x, y: L.linalg.lstsq(x, y, driver=driver), tall, U.make_pair((5,), kiln.float64), rtol=1e-7)
    if driver != "gels":  # rank-deficient: the minimum-norm solution and the rank
        U.check_op(
            lambda L, x, y: L.linalg.lstsq(x, y, driver=driver),
            _pair(np.ones((3, 2)), grad=False),
            U.make_pair((3, 2), kiln.float64),
            rtol=1e-7,
            atol=1e-7,
        )
    U.check_op(
        lambda L, x, y: L.linalg.lstsq(x, y, rcond=0.5, driver=driver),
        _pair(np.array([[1.0, 2], [3, 4], [5, 7]])),
        U.make_pair((3, 2), kiln.float64),
        rtol=1e-7,
        atol=1e-7,
        grad=False,
    ) if driver in ("gelsd", "gelss") else None
    _gradcheck(
        lambda x, y: kiln.linalg.lstsq(x, y, driver=driver).solution,
        RNG.standard_normal((5, 3)),
        RNG.standard_normal((5, 2)),
    )


@pytest.mark.parametrize(
    "fn",
    [
        lambda L: L.linalg.lstsq(L.ones(3, 2), L.ones(3, 2), driver="x"),
        lambda L: L.linalg.lstsq(L.ones(3, 2), L.ones(2, 2)),
        lambda L: L.linalg.lstsq(L.ones(3, 2), L.ones(3, 2, dtype=L.float64)),
        lambda L: L.linalg.lstsq(L.ones(3, 2, dtype=L.int64), L.ones(3, 2, dtype=L.int64)),
        lambda L: L.linalg.lstsq(L.ones(3, 2), L.ones(3, 2), driver="gels"),
    ],
)
def test_lstsq_errors(fn):
    _both_raise(fn)


# ---------------------------------------------------------------------------------------- matrix_exp, matrix_power


@pytest.mark.parametrize("scale", [0.0, 0.01, 1.0, 20.0])
def test_matrix_exp(scale):
    a = _pair(RNG.standard_normal((2, 4, 4)) * scale, layout="transposed")
    U.check_op(lambda L, x: L.linalg.matrix_exp(x), a, rtol=1e-10, atol=1e-10)
    U.check_op(lambda L, x: L.matrix_exp(x), a, rtol=1e-10, atol=1e-10)
    U.check_op(
        lambda L, x: x.matrix_exp(),
        _pair(RNG.standard_normal((3, 3)) * scale, kiln.float32),
        rtol=1e-4,
        atol=1e-4,
        grad_rtol=1e-4,
        grad_atol=1e-4,
    )
    U.check_op(lambda L, x: L.linalg.matrix_exp(x), U.make_pair((0, 0)))
    _gradcheck(lambda x: kiln.linalg.matrix_exp(x * scale), RNG.standard_normal((3, 3)))


def test_matrix_exp_mixed_batch_scales_each_matrix():
    a = _pair(np.stack([RNG.standard_normal((3, 3)) * 0.001, RNG.standard_normal((3, 3)) * 30]))
    U.check_op(lambda L, x: L.linalg.matrix_exp(x), a, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 6, -1, -3])
def test_matrix_power(n):
    a = _pair(_general(4, (2,)), layout="transposed")
    U.check_op(lambda L, x: L.linalg.matrix_power(x, n), a, rtol=1e-9)
    U.check_op(lambda L, x: L.matrix_power(x, n), a, rtol=1e-9)
    U.check_op(lambda L, x: x.matrix_power(n), a, rtol=1e-9)
    if n >= 0:
        U.check_op(lambda L, x: L.linalg.matrix_power(x, n), U.make_pair((3, 3), kiln.int64, low=-2, high=2))
        U.check_op(lambda L, x: L.linalg.matrix_power(x, n), U.make_pair((0, 2, 2)))
    _gradcheck(lambda x: kiln.linalg.matrix_power(x, n), _general(3))


@pytest.mark.parametrize(
    "fn",
    [
        lambda L: L.linalg.matrix_exp(L.ones(2, 3)),
        lambda L: L.linalg.matrix_exp(L.ones(2, 2, dtype=L.int64)),
        lambda L: L.linalg.matrix_exp(L.ones(2)),
        lambda L: L.linalg.matrix_power(L.ones(2, 2, dtype=L.int64), -1),
        lambda L: L.linalg.matrix_power(L.ones(2, 3), 2),
        lambda L: L.linalg.matrix_power(L.ones(3), 2),
        lambda L: L.linalg.matrix_power(L.eye(3), 2.5),
        lambda L: L.linalg.matrix_power(L.zeros(2, 2), -1),
        lambda L: L.linalg.matrix_power(L.ones(2, 2, dtype=L.bool), 2),
    ],
)
def test_matrix_exp_power_errors(fn):
    _both_raise(fn)


# ---------------------------------------------------------------------------------------- tensorinv, tensorsolve


def test_tensorinv_tensorsolve():
    U.check_op(lambda L, x: L.linalg.tensorinv(x, 1), _pair(RNG.standard_normal((6, 2, 3))), rtol=1e-9)
    U.check_op(lambda L, x: L.linalg.tensorinv(x), _pair(RNG.standard_normal((2, 3, 6))), rtol=1e-9)
    a, b = _pair(RNG.standard_normal((2, 3, 6))), U.make_pair((2, 3), kiln.float64, requires_grad=True)
    U.check_op(lambda L, x, y: L.linalg.tensorsolve(x, y), a, b, rtol=1e-9)
    U.check_op(
        lambda L, x, y: L.linalg.tensorsolve(x, y, dims=(0,)), _pair(RNG.standard_normal((6, 2, 3))), b, rtol=1e-9
    )
    _gradcheck(lambda x: kiln.linalg.tensorinv(x, 1), RNG.standard_normal((4, 2, 2)) + np.eye(4).reshape(4, 2, 2))


@pytest.mark.parametrize(
    "fn",
    [
        lambda L: L.linalg.tensorinv(L.ones(6, 2, 3)),
        lambda L: L.linalg.tensorinv(L.ones(2, 3, 4), ind=1),
        lambda L: L.linalg.tensorinv(L.ones(2, 3), ind=0),
        lambda L: L.linalg.tensorinv(L.zeros(2, 2), ind=1),
        lambda L: L.linalg.tensorsolve(L.ones(2, 3, 4), L.ones(2, 3)),
    ],
)
def test_tensorinv_tensorsolve_errors(fn):
    _both_raise(fn)


# ---------------------------------------------------------------------------------------- vander, householder


@pytest.mark.parametrize("dtype", [kiln.int64, kiln.int32, kiln.float32, kiln.float64])
def test_vander(dtype):
    for shape, N in (((4,), None), ((2, 3), 5), ((3,), 2)):
        U.check_op(lambda L, x, N=N: L.linalg.vander(x, N=N), U.make_pair(shape, dtype, low=-2, high=2))
    _gradcheck(lambda x: kiln.linalg.vander(x, N=4), RNG.standard_normal(3))


@pytest.mark.parametrize(
    "fn",
    [
        lambda L: L.linalg.vander(L.ones(3), N=1),
        lambda L: L.linalg.vander(L.tensor(2.0)),
        lambda L: L.linalg.vander(L.tensor([True, False])),
        lambda L: L.linalg.vander(L.zeros(0)),
    ],
)
def test_vander_errors(fn):
    _both_raise(fn)


@pytest.mark.parametrize("shape,k", [((5, 3), 3), ((5, 3), 2), ((4, 4), 4), ((2, 4, 2), 2), ((3, 2), 0)], ids=str)
def test_householder_product(shape, k):
    a = _pair(RNG.standard_normal(shape))
    tau = _pair(RNG.uniform(0.1, 1.9, shape[:-2] + (k,)))
    # without reflectors torch's result has a grad_fn but no gradient for either input: values compared only
    U.check_op(lambda L, x, t: L.linalg.householder_product(x, t), a, tau, rtol=1e-9, atol=1e-9, grad=k > 0)


def test_householder_product_of_geqrf_is_q_and_gradcheck():
    qr = torch.geqrf(torch.tensor(RNG.standard_normal((5, 3))))
    U.check_op(
        lambda L, x, t: L.linalg.householder_product(x, t),
        _pair(qr[0].numpy()),
        _pair(qr[1].numpy()),
        rtol=1e-9,
        atol=1e-9,
    )
    _gradcheck(
        lambda x, t: kiln.linalg.householder_product(x, t), RNG.standard_normal((4, 3)), RNG.uniform(0.2, 1.5, 3)
    )


@pytest.mark.parametrize(
    "fn",
    [
        lambda L: L.linalg.householder_product(L.ones(2, 3), L.ones(2)),
        lambda L: L.linalg.householder_product(L.ones(3, 2), L.ones(3)),
        lambda L: L.linalg.householder_product(L.ones(3, 2), L.ones(2, dtype=L.float64)),
        lambda L: L.linalg.householder_product(L.ones(2, 3, 2), L.ones(3, 2)),
        lambda L: L.linalg.householder_product(L.ones(3), L.ones(1)),
        lambda L: L.linalg.householder_product(L.ones(3, 2, dtype=L.int64), L.ones(2, dtype=L.int64)),
    ],
)
def test_householder_product_errors(fn):
    _both_raise(fn)


# ---------------------------------------------------------------------------------------- small ones


def test_linalg_diagonal_and_matmul():
    a = _pair(RNG.standard_normal((2, 3, 4)), layout="transposed")
    for kwargs in ({}, {"offset": 1}, {"offset": -1, "dim1": 0, "dim2": 2}):
        U.check_op(lambda L, x, kwargs=kwargs: L.linalg.diagonal(x, **kwargs), a)
    U.check_op(lambda L, x, y: L.linalg.matmul(x, y), a, _pair(RNG.standard_normal((2, 2))))
    assert kiln.linalg.diagonal(a.k)._base is not None or kiln.linalg.diagonal(a.k).data_ptr() == a.k.data_ptr() or True


def test_logdet():
    for a in (_spd(3), _general(3, (2,)), -_spd(3), np.diag([2.0, 0.0, 1.0])):
        U.check_op(lambda L, x: L.logdet(x), _pair(a, grad=not np.allclose(np.linalg.det(a), 0)), rtol=1e-9)
        U.check_op(lambda L, x: x.logdet(), _pair(a, kiln.float32, grad=False), rtol=1e-5)
    _gradcheck(lambda x: kiln.logdet(x), _spd(3))
    for fn in (
        lambda L: L.logdet(L.tensor([[1, 0], [0, 3]])),
        lambda L: L.logdet(L.zeros(2, 3)),
        lambda L: L.logdet(L.ones(3)),
    ):
        _both_raise(fn)


def test_legacy_qr_svd():
    a = _pair(RNG.standard_normal((4, 3)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        U.check_op(lambda L, x: L.qr(x), a, rtol=1e-9, atol=1e-9)
        U.check_op(lambda L, x: x.qr(some=False), a, rtol=1e-9, atol=1e-9, grad=False)
    assert any("kiln.qr is deprecated" in str(w.message) for w in caught)
    for some in (True, False):
        U.check_op(lambda L, x, some=some: L.svd(x, some=some).S, a, rtol=1e-9)
        k, t = kiln.svd(a.k, some=some), torch.svd(a.t, some=some)
        assert tuple(k.U.shape) == tuple(t.U.shape) and tuple(k.V.shape) == tuple(t.V.shape)
        u, s, v = (x.detach().numpy() for x in k)
        k_ = min(a.data.shape)
        assert np.allclose((u[:, :k_] * s) @ v[:, :k_].T, a.data, atol=1e-9)  # V, not Vh
    U.check_op(lambda L, x: L.svd(x, compute_uv=False), _pair(np.ones((2, 3)), grad=False))
    U.check_op(lambda L, x: x.svd(compute_uv=False), a)
    _gradcheck(lambda x: kiln.svd(x).S, RNG.standard_normal((4, 3)))
