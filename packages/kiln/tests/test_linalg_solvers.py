"""Triangular, Cholesky, LU and LDL factorizations and solves against torch: ``linalg.solve_triangular``,
``linalg.cholesky_ex``, ``cholesky_solve``, ``cholesky_inverse``, ``triangular_solve``, ``cholesky``,
``linalg.lu_factor(_ex)``, ``linalg.lu``, ``lu_unpack``, ``linalg.lu_solve``, ``lu``/``lu_solve``,
``linalg.inv_ex``, ``linalg.solve_ex`` and ``linalg.ldl_factor(_ex)``/``ldl_solve``."""

from __future__ import annotations

import warnings

import kiln_testutil as U
import numpy as np
import pytest
import torch

import kiln

RNG = np.random.default_rng(0)
FLOATS = [kiln.float32, kiln.float64]


def _general(n, batch=(), seed=0, m=None):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(batch + (m or n, n))
    return a + 3 * n**0.5 * np.eye(m or n, n) if m is None else a


def _spd(n, batch=(), seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(batch + (n, n))
    return a @ np.swapaxes(a, -1, -2) + n * np.eye(n)


def _pair(values, dtype=kiln.float64, layout="contiguous", grad=True):
    return U.make_pair(values.shape, dtype, values=values, layout=layout, requires_grad=grad)


def _gradcheck(fn, *arrays):
    xs = [kiln.tensor(a, dtype=kiln.float64, requires_grad=True) for a in arrays]
    assert kiln.autograd.gradcheck(fn, xs) and kiln.autograd.gradgradcheck(fn, xs)


def _both_raise(fn, exact=True):
    """kiln raises what torch raises, with its message (torch's LinAlgError is kiln.linalg.LinAlgError)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exc = U.torch_error(lambda: fn(torch))
        if isinstance(exc, torch.linalg.LinAlgError):
            with pytest.raises(kiln.linalg.LinAlgError) as info:
                fn(kiln)
            assert str(info.value) == U.kiln_message(str(exc))
            return
        U.assert_same_error(lambda: fn(kiln), lambda: fn(torch), exact=exact)


# ---------------------------------------------------------------------------------------- solve_triangular


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("upper", [True, False])
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("unitriangular", [False, True])
def test_solve_triangular(dtype, upper, left, unitriangular):
    a = _pair(_general(4), dtype, layout="transposed")
    b = U.make_pair((4, 2) if left else (2, 4), dtype, seed=1, requires_grad=True)
    kw = {"upper": upper, "left": left, "unitriangular": unitriangular}
    U.check_op(lambda L, x, y: L.linalg.solve_triangular(x, y, **kw), a, b, rtol=1e-4, atol=1e-5)
    _gradcheck(
        lambda x, y: kiln.linalg.solve_triangular(x, y, **kw),
        _general(3),
        RNG.standard_normal((3, 2) if left else (2, 3)),
    )


def test_solve_triangular_broadcasts_and_edges():
    U.check_op(
        lambda L, x, y: L.linalg.solve_triangular(x, y, upper=True),
        _pair(_general(3, (2,))),
        U.make_pair((3, 1), kiln.float64, requires_grad=True),
    )
    U.check_op(
        lambda L, x, y: L.linalg.solve_triangular(x, y, upper=False),
        _pair(_general(3)),
        U.make_pair((2, 1, 3, 2), kiln.float64, requires_grad=True),
    )
    U.check_op(lambda L, x, y: L.linalg.solve_triangular(x, y, upper=True), U.make_pair((0, 0)), U.make_pair((0, 2)))
    U.check_op(
        lambda L, x, y: L.linalg.solve_triangular(x, y, upper=True),
        _pair(np.zeros((2, 2)), grad=False),
        U.make_pair((2, 1), kiln.float64),
    )  # a zero pivot: inf and NaN, no error
    out = kiln.linalg.solve_triangular(kiln.eye(2, dtype=kiln.float64), kiln.ones(2, 1), upper=True)
    assert out.dtype is torch_dtype_name_to_kiln(
        torch.linalg.solve_triangular(torch.eye(2, dtype=torch.float64), torch.ones(2, 1), upper=True).dtype
    )


def torch_dtype_name_to_kiln(d):
    return U.T2K[d]


@pytest.mark.parametrize(
    "fn",
    [
        lambda L: L.linalg.solve_triangular(L.ones(3, 3), L.ones(2, 1), upper=True),
        lambda L: L.linalg.solve_triangular(L.ones(3, 3), L.ones(3, 1), upper=True, left=False),
        lambda L: L.linalg.solve_triangular(L.ones(2, 3), L.ones(3, 1), upper=True),
        lambda L: L.linalg.solve_triangular(L.ones(3, 3), L.ones(3), upper=True),
        lambda L: L.linalg.solve_triangular(L.ones(3, 3, dtype=L.int32), L.ones(3, 1, dtype=L.int32), upper=True),
    ],
)
def test_solve_triangular_errors(fn):
    _both_raise(fn)


def test_solve_triangular_needs_upper():
    with pytest.raises(TypeError):  # torch's parser words it differently; Python's names the argument too
        torch.linalg.solve_triangular(torch.ones(3, 3), torch.ones(3, 1))
    with pytest.raises(TypeError, match="upper"):
        kiln.linalg.solve_triangular(kiln.ones(3, 3), kiln.ones(3, 1))


# ---------------------------------------------------------------------------------------- Cholesky


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_ex(upper):
    for batch in ((), (2,)):
        s = _pair(_spd(4, batch))
        U.check_op(lambda L, x: L.linalg.cholesky_ex(x, upper=upper), s)
    _gradcheck(lambda x: kiln.linalg.cholesky_ex((x + x.mT) / 2, upper=upper).L, _spd(3))
    # not positive-definite: info names the first bad leading minor; the factor holds what was computed
    for values in (
        [[1.0, 2], [2, 1]],
        [[4.0, 2, 1], [2, -1, 3], [1, 3, 5]],
        [[4.0, 2, 1, 0], [2, 5, 3, 1], [1, 3, -5, 2], [0, 1, 2, 6]],
    ):
        U.check_op(lambda L, x: L.linalg.cholesky_ex(x, upper=upper), _pair(np.array(values), grad=False))


def test_cholesky_ex_errors_and_empty():
    U.check_op(lambda L, x: L.linalg.cholesky_ex(x), U.make_pair((0, 3, 3)))
    bad = np.array([[[1.0, 2], [2, 1]], [[1.0, 0], [0, 1]]])
    _both_raise(lambda L: L.linalg.cholesky_ex(L.tensor(bad), check_errors=True))
    _both_raise(lambda L: L.linalg.cholesky_ex(L.tensor(bad[0]), check_errors=True))
    _both_raise(lambda L: L.linalg.cholesky_ex(L.ones(2, 3)))


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_solve_and_inverse(upper):
    factor = np.linalg.cholesky(_spd(4))
    factor = factor.T if upper else factor
    c = _pair(factor)
    U.check_op(lambda L, b, f: L.cholesky_solve(b, f, upper), U.make_pair((4, 3), kiln.float64, requires_grad=True), c)
    U.check_op(lambda L, b, f: b.cholesky_solve(f, upper=upper), U.make_pair((2, 4, 1), kiln.float64), c)
    U.check_op(lambda L, f: L.cholesky_inverse(f, upper), c)
    U.check_op(lambda L, f: f.cholesky_inverse(upper=upper), _pair(np.stack([factor, factor])))
    fixed = (
        (lambda x: x.triu() + 3 * kiln.eye(3, dtype=kiln.float64))
        if upper
        else (lambda x: x.tril() + 3 * kiln.eye(3, dtype=kiln.float64))
    )
    _gradcheck(
        lambda b, f: kiln.cholesky_solve(b, fixed(f), upper), RNG.standard_normal((3, 2)), RNG.standard_normal((3, 3))
    )
    _gradcheck(lambda f: kiln.cholesky_inverse(fixed(f), upper), RNG.standard_normal((3, 3)))


@pytest.mark.parametrize(
    "fn",
    [
        lambda L: L.cholesky_solve(L.ones(3), L.eye(3)),
        lambda L: L.cholesky_solve(L.ones(2, 1), L.eye(3)),
        lambda L: L.cholesky_solve(L.ones(3, 1, dtype=L.float64), L.eye(3)),
        lambda L: L.cholesky_inverse(L.ones(2, 3)),
        lambda L: L.cholesky_inverse(L.zeros(2, 2)),
        lambda L: L.cholesky_inverse(L.zeros(2, 2, 2)),
    ],
)
def test_cholesky_solve_inverse_errors(fn):
    _both_raise(fn)


def test_triangular_solve_and_legacy_cholesky():
    a, b = _pair(_general(3)), U.make_pair((3, 2), kiln.float64, seed=2, requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for kw in ({}, {"upper": False}, {"transpose": True}, {"unitriangular": True, "upper": False}):
            U.check_op(lambda L, y, x, kw=kw: L.triangular_solve(y, x, **kw), b, a)
            U.check_op(lambda L, y, x, kw=kw: y.triangular_solve(x, **kw), b, a)
        U.check_op(lambda L, y, x: L.triangular_solve(y, x), U.make_pair((2, 3, 1), kiln.float64), a)
        U.check_op(lambda L, x: L.cholesky(x), _pair(_spd(3)))
        U.check_op(lambda L, x: x.cholesky(upper=True), _pair(_spd(3)))
    messages = " ".join(str(w.message) for w in caught)
    assert "kiln.triangular_solve is deprecated" in messages and "kiln.cholesky is deprecated" in messages
    _both_raise(lambda L: L.triangular_solve(L.ones(3), L.eye(3)))


# ---------------------------------------------------------------------------------------- LU

LU_SHAPES = [(4, 4), (3, 5), (5, 3), (2, 3, 3), (1, 1)]


@pytest.mark.parametrize("shape", LU_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", FLOATS)
def test_lu_factorizations(shape, dtype):
    a = U.make_pair(shape, dtype, layout="transposed", requires_grad=True)
    U.check_op(lambda L, x: L.linalg.lu_factor_ex(x), a, rtol=1e-4, atol=1e-5)
    U.check_op(lambda L, x: L.linalg.lu_factor(x), a, rtol=1e-4, atol=1e-5)
    U.check_op(lambda L, x: L.linalg.lu(x), a, rtol=1e-4, atol=1e-5)
    U.check_op(lambda L, x: L.lu_unpack(*L.linalg.lu_factor(x)), a, rtol=1e-4, atol=1e-5)
    U.check_op(lambda L, x: L.lu_unpack(*L.linalg.lu_factor(x), unpack_data=False), a, grad=False)
    U.check_op(lambda L, x: L.lu_unpack(*L.linalg.lu_factor(x), unpack_pivots=False), a, rtol=1e-4, atol=1e-5)


def test_lu_singular_and_empty():
    for values in ([[0.0, 1], [0, 2]], [[1.0, 1, 1], [1, 1, 1], [1, 2, 3]], np.zeros((2, 2)), np.zeros((2, 2, 2))):
        U.check_op(lambda L, x: L.linalg.lu_factor_ex(x), _pair(np.array(values), grad=False))
    U.check_op(lambda L, x: L.linalg.lu_factor(x), U.make_pair((0, 0)))
    U.check_op(lambda L, x: L.linalg.lu_factor(x), U.make_pair((2, 0, 3)))


def test_lu_gradients():
    for m, n in ((4, 4), (3, 5), (5, 3)):
        _gradcheck(lambda x: kiln.linalg.lu_factor(x).LU, _general(n, m=m) + 2 * np.eye(m, n))
        _gradcheck(lambda x: kiln.linalg.lu(x)[1:], _general(n, m=m) + 2 * np.eye(m, n))


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("adjoint", [False, True])
def test_lu_solve(left, adjoint):
    a = _pair(_general(4))
    b = U.make_pair((4, 2) if left else (2, 4), kiln.float64, seed=3, requires_grad=True)
    U.check_op(lambda L, x, y: L.linalg.lu_solve(*L.linalg.lu_factor(x), y, left=left, adjoint=adjoint), a, b)
    U.check_op(
        lambda L, x, y: L.linalg.lu_solve(*L.linalg.lu_factor(x), y, left=left, adjoint=adjoint),
        _pair(_general(4, (2,))),
        U.make_pair((4, 1) if left else (1, 4), kiln.float64, requires_grad=True),
    )
    _gradcheck(
        lambda x, y: kiln.linalg.lu_solve(*kiln.linalg.lu_factor(x), y, left=left, adjoint=adjoint),
        _general(3),
        RNG.standard_normal((3, 2) if left else (2, 3)),
    )


def test_legacy_lu_and_lu_solve():
    a, b = _pair(_general(4)), U.make_pair((4, 2), kiln.float64, requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        U.check_op(lambda L, x: L.lu(x), a)
        U.check_op(lambda L, x: L.lu(x, get_infos=True), a)
        U.check_op(lambda L, x: x.lu(get_infos=True), a)
        U.check_op(lambda L, x, y: L.lu_solve(y, *L.linalg.lu_factor(x)), a, b)
        U.check_op(lambda L, x, y: y.lu_solve(*L.linalg.lu_factor(x)), a, b)
    messages = " ".join(str(w.message) for w in caught)
    assert "kiln.lu is deprecated" in messages and "kiln.lu_solve is deprecated" in messages
    assert kiln.lu.__name__ == "lu" and kiln.lu_solve.__name__ == "lu_solve"


@pytest.mark.parametrize(
    "fn",
    [
        lambda L: L.linalg.lu_factor(L.zeros(2, 2)),
        lambda L: L.linalg.lu_factor(L.zeros(2, 2, 2)),
        lambda L: L.linalg.lu_factor(L.ones(2, 2), pivot=False),
        lambda L: L.linalg.lu_factor(L.ones(2, 2, dtype=L.int64)),
        lambda L: L.linalg.lu_factor(L.ones(2)),
        lambda L: L.linalg.lu_solve(*L.linalg.lu_factor(L.eye(3)), L.ones(3)),
        lambda L: L.linalg.lu_solve(*L.linalg.lu_factor(L.eye(3)), L.ones(2, 1)),
        lambda L: L.linalg.lu_solve(*L.linalg.lu_factor(L.eye(3)), L.ones(3, 1), left=False),
        lambda L: L.linalg.lu_solve(*L.linalg.lu_factor(L.eye(3)), L.ones(3, 1, dtype=L.float64)),
        lambda L: L.linalg.lu_solve(
            L.linalg.lu_factor(L.eye(3))[0], L.linalg.lu_factor(L.eye(3))[1].long(), L.ones(3, 1)
        ),
    ],
)
def test_lu_errors(fn):
    _both_raise(fn)


# ---------------------------------------------------------------------------------------- inv_ex, solve_ex


def test_inv_ex_and_solve_ex():
    a = _pair(_general(4))
    U.check_op(lambda L, x: L.linalg.inv_ex(x), a)
    b = U.make_pair((4,), kiln.float64, requires_grad=True)
    U.check_op(lambda L, x, y: L.linalg.solve_ex(x, y), a, b)
    U.check_op(
        lambda L, x, y: L.linalg.solve_ex(x, y, left=False), a, U.make_pair((2, 4), kiln.float64, requires_grad=True)
    )
    mixed = np.stack([np.eye(2), np.zeros((2, 2))])
    k = kiln.linalg.inv_ex(kiln.tensor(mixed))
    t = torch.linalg.inv_ex(torch.tensor(mixed))
    U.assert_close(k.info, t.info)
    U.assert_close(k.inverse[0], t.inverse[0])
    assert not bool(kiln.isfinite(k.inverse[1]).all())  # a singular matrix: non-finite entries, no error
    s = kiln.linalg.solve_ex(kiln.zeros(2, 2), kiln.ones(2))
    assert s.info.item() == 1 and not bool(kiln.isfinite(s.result).all())
    _gradcheck(lambda x: kiln.linalg.inv_ex(x).inverse, _general(3))
    _gradcheck(lambda x, y: kiln.linalg.solve_ex(x, y).result, _general(3), RNG.standard_normal((3, 2)))


@pytest.mark.parametrize(
    "fn",
    [
        lambda L: L.linalg.inv_ex(L.zeros(2, 2), check_errors=True),
        lambda L: L.linalg.inv_ex(L.zeros(2, 2, 2), check_errors=True),
        lambda L: L.linalg.inv_ex(L.ones(2, 3)),
        lambda L: L.linalg.solve_ex(L.zeros(2, 2), L.ones(2), check_errors=True),
    ],
)
def test_inv_ex_solve_ex_errors(fn):
    _both_raise(fn)


# ---------------------------------------------------------------------------------------- LDL


def _symmetric(n, seed, zero_diagonal=False, integral=False):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, n))
    a = a + a.T
    if zero_diagonal:
        a[np.diag_indices(n)] = 0
    return np.round(a) if integral else a


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("seed", range(6))
def test_ldl_factor_matches_lapack(n, seed):
    a = _symmetric(n, seed, zero_diagonal=seed % 3 == 0, integral=seed % 2 == 1)
    x = _pair(a, grad=False)
    U.check_op(lambda L, m: L.linalg.ldl_factor_ex(m), x, rtol=1e-9, atol=1e-9)
    U.check_op(lambda L, m: L.linalg.ldl_factor_ex(m, hermitian=True), x, rtol=1e-9, atol=1e-9)
    b = U.make_pair((n, 2), kiln.float64, seed=seed)
    U.check_op(lambda L, m, y: L.linalg.ldl_solve(*L.linalg.ldl_factor(m), y), x, b, rtol=1e-7, atol=1e-7)


def test_ldl_batched_float32_and_zero():
    x = _pair(np.stack([_symmetric(4, 1), _symmetric(4, 2, zero_diagonal=True)]), kiln.float32, grad=False)
    U.check_op(lambda L, m: L.linalg.ldl_factor(m), x, rtol=1e-4, atol=1e-4)
    U.check_op(
        lambda L, m, y: L.linalg.ldl_solve(*L.linalg.ldl_factor(m), y),
        x,
        U.make_pair((4, 1), kiln.float32),
        rtol=1e-3,
        atol=1e-3,
    )
    U.check_op(lambda L, m: L.linalg.ldl_factor_ex(m), _pair(np.zeros((2, 2)), grad=False))
    with pytest.raises(RuntimeError):
        kiln.linalg.ldl_factor(kiln.zeros(2, 2))  # torch fails there with an internal assert; kiln says why
    a = kiln.tensor(_symmetric(3, 0), requires_grad=True)
    with pytest.raises(RuntimeError, match="derivative for aten::linalg_ldl_factor_ex is not implemented"):
        kiln.linalg.ldl_factor(a).LD.sum().backward()


@pytest.mark.parametrize(
    "fn",
    [
        lambda L: L.linalg.ldl_factor(L.ones(2, 3)),
        lambda L: L.linalg.ldl_factor(L.ones(2, 2, dtype=L.int64)),
        lambda L: L.linalg.ldl_solve(*L.linalg.ldl_factor(L.eye(3, dtype=L.float64)), L.ones(3, 1)),
        lambda L: L.linalg.ldl_solve(*L.linalg.ldl_factor(L.eye(3, dtype=L.float64)), L.ones(2, 1, dtype=L.float64)),
        lambda L: L.linalg.ldl_solve(*L.linalg.ldl_factor(L.eye(3, dtype=L.float64)), L.ones(3, dtype=L.float64)),
    ],
)
def test_ldl_errors(fn):
    _both_raise(fn)
