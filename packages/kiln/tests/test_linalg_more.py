"""The matmul family, einsum, tensordot, trace and ``kiln.linalg`` decompositions against torch."""

from __future__ import annotations

import kiln_testutil as U
import numpy as np
import pytest
import torch

import kiln

FLOATS = [pytest.param(d, id=U.dtype_id(d)) for d in U.FLOAT_DTYPES]


def _pairs(shapes, dtype, layout="contiguous", seed=0):
    return [U.make_pair(s, dtype, layout=layout, seed=seed + i, requires_grad=True) for i, s in enumerate(shapes)]


def _spd(n, batch=(), seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(batch + (n, n))
    return a @ np.swapaxes(a, -1, -2) + n * np.eye(n)


def _well(n, batch=(), seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(batch + (n, n)) + 3 * n**0.5 * np.eye(n)


# ---------------------------------------------------------------------------------------- products

PRODUCTS = [
    ("bmm", lambda L, a, b: L.bmm(a, b), [(2, 3, 4), (2, 4, 5)]),
    ("bmm-method", lambda L, a, b: a.bmm(b), [(2, 3, 4), (2, 4, 5)]),
    ("mv", lambda L, a, b: L.mv(a, b), [(3, 4), (4,)]),
    ("dot", lambda L, a, b: L.dot(a, b), [(4,), (4,)]),
    ("outer", lambda L, a, b: L.outer(a, b), [(3,), (4,)]),
    ("ger", lambda L, a, b: a.ger(b), [(3,), (4,)]),
    ("addmm", lambda L, c, a, b: L.addmm(c, a, b), [(3, 5), (3, 4), (4, 5)]),
    ("addmm-ab", lambda L, c, a, b: L.addmm(c, a, b, beta=0.5, alpha=2.0), [(5,), (3, 4), (4, 5)]),
    ("addmm-method", lambda L, c, a, b: c.addmm(a, b, alpha=-1), [(3, 5), (3, 4), (4, 5)]),
    ("addmv", lambda L, c, a, b: L.addmv(c, a, b, beta=2, alpha=0.5), [(3,), (3, 4), (4,)]),
    ("baddbmm", lambda L, c, a, b: L.baddbmm(c, a, b, beta=0.5, alpha=2), [(2, 3, 5), (2, 3, 4), (2, 4, 5)]),
    ("addbmm", lambda L, c, a, b: L.addbmm(c, a, b, beta=0.5, alpha=2), [(3, 5), (2, 3, 4), (2, 4, 5)]),
    ("trace", lambda L, a: L.trace(a), [(3, 4)]),
    ("trace-method", lambda L, a: a.trace(), [(4, 4)]),
    ("tensordot-int", lambda L, a, b: L.tensordot(a, b, 2), [(2, 3, 4), (3, 4, 5)]),
    ("tensordot-0", lambda L, a, b: L.tensordot(a, b, 0), [(2, 3), (4,)]),
    ("tensordot-lists", lambda L, a, b: L.tensordot(a, b, ([0, 2], [1, 0])), [(2, 3, 4), (4, 2, 5)]),
    ("empty-bmm", lambda L, a, b: L.bmm(a, b), [(0, 3, 4), (0, 4, 5)]),
    ("empty-inner-mv", lambda L, a, b: L.mv(a, b), [(3, 0), (0,)]),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
@pytest.mark.parametrize("name,fn,shapes", PRODUCTS, ids=[p[0] for p in PRODUCTS])
def test_products(name, fn, shapes, dtype, layout):
    U.check_op(fn, *_pairs(shapes, dtype, layout), rtol=1e-5, atol=1e-5)


def test_trace_int_dtype():
    U.check_op(lambda L, a: L.trace(a), U.make_pair((3, 3), kiln.int32), grad=False)


def test_addmm_beta_zero_ignores_nan():
    c = kiln.full((3, 5), float("nan"))
    out = kiln.addmm(c, kiln.ones(3, 4), kiln.ones(4, 5), beta=0)
    assert not np.isnan(out.numpy()).any()


# ---------------------------------------------------------------------------------------- einsum

EINSUM = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("ij,jk", [(3, 4), (4, 5)]),
    ("ii", [(3, 3)]),
    ("ii->i", [(3, 3)]),
    ("ij->", [(3, 4)]),
    ("ij->ji", [(3, 4)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (4, 5)]),
    ("i,j->ij", [(3,), (4,)]),
    ("i,i->", [(4,), (4,)]),
    ("iij->j", [(3, 3, 2)]),
    ("ijk,k->i", [(2, 3, 4), (4,)]),
    ("ab,bc,cd->ad", [(2, 3), (3, 4), (4, 5)]),
    ("...->...", [(2, 3)]),
    ("b...,b->...", [(2, 3, 4), (2,)]),
    ("ij,ij->ij", [(3, 4), (3, 4)]),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("eq,shapes", EINSUM, ids=[e[0] for e in EINSUM])
def test_einsum(eq, shapes, dtype):
    pairs = _pairs(shapes, dtype, "transposed" if len(shapes[0]) >= 2 else "contiguous")
    U.check_op(lambda L, *ops: L.einsum(eq, *ops), *pairs, rtol=1e-5, atol=1e-5)


def test_einsum_list_operands():
    a, b = _pairs([(2, 3), (3, 2)], kiln.float64)
    U.check_op(lambda L, x, y: L.einsum("ij,jk->ik", [x, y]), a, b)


@pytest.mark.parametrize("eq,shapes", EINSUM[:13], ids=[e[0] for e in EINSUM[:13]])
def test_einsum_gradgradcheck(eq, shapes):
    ops = [kiln.randn(*s, dtype=kiln.float64, requires_grad=True) for s in shapes]
    assert kiln.autograd.gradcheck(lambda *x: kiln.einsum(eq, *x), ops)
    assert kiln.autograd.gradgradcheck(lambda *x: kiln.einsum(eq, *x), ops)


# ---------------------------------------------------------------------------------------- decompositions


def _mat_pair(values, dtype, layout="contiguous"):
    return U.make_pair(values.shape, dtype, values=values, layout=layout, requires_grad=True)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("batch", [(), (2,), (2, 3)], ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
@pytest.mark.parametrize(
    "name", ["inv", "det", "slogdet", "solve", "solve-vec", "solve-right", "cholesky", "cholesky-u"]
)
def test_decompositions(name, batch, layout, dtype):
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype is kiln.float32 else {}
    if name.startswith("cholesky"):
        A = _mat_pair(_spd(3, batch), dtype, layout)
        upper = name.endswith("-u")
        U.check_op(
            lambda L, a: L.linalg.cholesky(a, upper=upper),
            A,
            **tol,
            grad_rtol=tol.get("rtol"),
            grad_atol=tol.get("atol"),
        )
        return
    A = _mat_pair(_well(3, batch), dtype, layout)
    gt = {"grad_rtol": tol.get("rtol"), "grad_atol": tol.get("atol")}
    if name == "solve":
        B = U.make_pair(batch + (3, 2), dtype, requires_grad=True, seed=5)
        U.check_op(lambda L, a, b: L.linalg.solve(a, b), A, B, **tol, **gt)
    elif name == "solve-vec":
        B = U.make_pair((3,), dtype, requires_grad=True, seed=5)
        U.check_op(lambda L, a, b: L.linalg.solve(a, b), A, B, **tol, **gt)
    elif name == "solve-right":
        B = U.make_pair(batch + (2, 3), dtype, requires_grad=True, seed=5)
        U.check_op(lambda L, a, b: L.linalg.solve(a, b, left=False), A, B, **tol, **gt)
    else:
        U.check_op(lambda L, a: getattr(L.linalg, name)(a), A, **tol, **gt)


def test_slogdet_named_and_negative():
    v = _well(3)
    v[0] *= -1
    k, _ = U.check_op(lambda L, a: L.linalg.slogdet(a), _mat_pair(v, kiln.float64))
    assert float(k.sign) == -1.0 and k.logabsdet is k[1]


@pytest.mark.parametrize("name", ["inv", "det", "slogdet", "cholesky", "solve"])
def test_decompositions_gradgradcheck(name):
    a = kiln.tensor(_spd(3, (2,)) if name == "cholesky" else _well(3, (2,)), requires_grad=True)
    if name == "cholesky":

        def fn(x):
            return kiln.linalg.cholesky((x + x.mT) * 0.5)
    elif name == "slogdet":

        def fn(x):
            return kiln.linalg.slogdet(x).logabsdet
    elif name == "solve":
        b = kiln.randn(2, 3, 2, dtype=kiln.float64, requires_grad=True)
        assert kiln.autograd.gradcheck(lambda x, y: kiln.linalg.solve(x, y), (a, b))
        assert kiln.autograd.gradgradcheck(lambda x, y: kiln.linalg.solve(x, y), (a, b))
        return
    else:
        fn = getattr(kiln.linalg, name)
    assert kiln.autograd.gradcheck(fn, (a,))
    assert kiln.autograd.gradgradcheck(fn, (a,))


def test_product_gradcheck():
    a = kiln.randn(2, 3, 4, dtype=kiln.float64, requires_grad=True)
    b = kiln.randn(2, 4, 5, dtype=kiln.float64, requires_grad=True)
    c = kiln.randn(3, 5, dtype=kiln.float64, requires_grad=True)
    assert kiln.autograd.gradgradcheck(lambda x, y, z: kiln.addbmm(z, x, y, beta=0.5, alpha=2), (a, b, c))
    d = kiln.randn(5, 4, 3, dtype=kiln.float64, requires_grad=True)
    assert kiln.autograd.gradgradcheck(lambda x, y: kiln.tensordot(x, y, ([1, 2], [2, 1])), (a, d))


@pytest.mark.parametrize("name", ["inv", "det", "slogdet", "cholesky"])
def test_decompositions_empty(name):
    a = U.make_pair((0, 0), kiln.float64)
    b = U.make_pair((2, 0, 0), kiln.float64)
    for p in (a, b):
        U.check_op(lambda L, x: getattr(L.linalg, name)(x), p, grad=False)


# ---------------------------------------------------------------------------------------- errors

ERRORS = [
    lambda L: L.bmm(L.ones(2, 3), L.ones(2, 3, 4)),
    lambda L: L.bmm(L.ones(2, 3, 4), L.ones(3, 4)),
    lambda L: L.bmm(L.ones(2, 3, 4), L.ones(2, 5, 4)),
    lambda L: L.mv(L.ones(2, 3), L.ones(4)),
    lambda L: L.mv(L.ones(3), L.ones(3)),
    lambda L: L.dot(L.ones(2, 3), L.ones(4)),
    lambda L: L.dot(L.ones(3), L.ones(4)),
    lambda L: L.outer(L.ones(2, 3), L.ones(4)),
    lambda L: L.trace(L.ones(3)),
    lambda L: L.einsum("ij,jk", L.ones(2, 3)),
    lambda L: L.einsum("ij,jk", L.ones(2, 3), L.ones(4, 2)),
    lambda L: L.linalg.inv(L.zeros(3, 3)),
    lambda L: L.linalg.inv(L.tensor([[1.0, 2.0], [2.0, 4.0]])),
    lambda L: L.linalg.inv(L.zeros(2, 3, 3)),
    lambda L: L.linalg.inv(L.zeros(3, 4)),
    lambda L: L.linalg.inv(L.zeros(3)),
    lambda L: L.linalg.inv(L.ones(3, 3, dtype=L.int64)),
    lambda L: L.linalg.det(L.zeros(3, 4)),
    lambda L: L.linalg.cholesky(-L.eye(3)),
    lambda L: L.linalg.cholesky(L.tensor([[1.0, 2.0], [2.0, 1.0]])),
    lambda L: L.linalg.cholesky(-L.eye(3).expand(2, 3, 3)),
    lambda L: L.linalg.solve(L.zeros(3, 3), L.ones(3)),
]


@pytest.mark.parametrize("i", range(len(ERRORS)))
def test_errors(i):
    exc = U.torch_error(lambda: ERRORS[i](torch))
    if isinstance(exc, torch.linalg.LinAlgError):
        with pytest.raises(kiln.linalg.LinAlgError) as info:
            ERRORS[i](kiln)
        assert str(info.value) == U.kiln_message(str(exc))
    else:
        U.assert_same_error(lambda: ERRORS[i](kiln), lambda: ERRORS[i](torch), exact=True)


def test_linalg_error_type():
    assert issubclass(kiln.linalg.LinAlgError, RuntimeError)
    with pytest.raises(kiln.linalg.LinAlgError):
        kiln.linalg.inv(kiln.zeros(2, 2))


# ---------------------------------------------------------------------------------------- eigh / svd / qr


def _distinct_sym(n, batch=(), seed=0):
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal(batch + (n, n)))
    lam = np.arange(1, n + 1) * 1.5 - 2.0
    return q @ (lam[:, None] * np.swapaxes(q, -1, -2))


def _distinct_svd(m, n, batch=(), seed=0):
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal(batch + (m, m)))
    v, _ = np.linalg.qr(rng.standard_normal(batch + (n, n)))
    k = min(m, n)
    s = np.zeros(batch + (m, n))
    for i in range(k):
        s[..., i, i] = 3.0 - 0.7 * i
    return u @ s @ v


# gauge-invariant views of the decompositions (eigen/singular vectors are defined up to sign)
DECOMP = {
    "eigh": lambda L, a: (L.linalg.eigh(a).eigenvalues, L.linalg.eigh(a).eigenvectors.abs()),
    "eigh-proj": lambda L, a: (
        lambda r: L.matmul(r.eigenvectors * r.eigenvalues.unsqueeze(-2) ** 2, r.eigenvectors.mT)
    )(L.linalg.eigh(a)),
    "eigh-U": lambda L, a: L.linalg.eigh(a, UPLO="U").eigenvalues,
    "eigvalsh": lambda L, a: L.linalg.eigvalsh(a),
    "svd": lambda L, a: (lambda r: (r.S, r.U.abs(), r.Vh.abs(), L.matmul(r.U, r.Vh)))(
        L.linalg.svd(a, full_matrices=False)
    ),
    "svd-full": lambda L, a: L.linalg.svd(a).S,
    "svdvals": lambda L, a: L.linalg.svdvals(a),
    "qr": lambda L, a: tuple(L.linalg.qr(a)),
}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("batch", [(), (2,)], ids=str)
@pytest.mark.parametrize("shape", [(3, 3), (4, 3), (3, 4)], ids=str)
@pytest.mark.parametrize("name", list(DECOMP))
def test_eigh_svd_qr(name, shape, batch, dtype):
    if name.startswith("eig"):
        if shape[0] != shape[1]:
            pytest.skip("square only")
        v = _distinct_sym(shape[0], batch)
    else:
        v = _distinct_svd(*shape, batch)
    grad = True
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype is kiln.float32 else {"rtol": 1e-6, "atol": 1e-6}
    U.check_op(
        DECOMP[name],
        _mat_pair(v, dtype, "transposed"),
        grad=grad,
        **tol,
        grad_rtol=tol["rtol"] * 10,
        grad_atol=tol["atol"] * 10,
    )


def test_qr_modes():
    a = _mat_pair(_distinct_svd(4, 3), kiln.float64)
    U.check_op(lambda L, x: tuple(L.linalg.qr(x, mode="complete")), a, grad=False)
    U.check_op(lambda L, x: tuple(L.linalg.qr(x, mode="r")), a, grad=False)
    U.check_op(lambda L, x: L.linalg.svd(x, full_matrices=True).U.abs(), a, grad=False)
    wide = _mat_pair(_distinct_svd(3, 4), kiln.float64)
    U.check_op(lambda L, x: tuple(L.linalg.qr(x, mode="complete")), wide)


@pytest.mark.parametrize("mode, shape", [("r", (3, 3)), ("complete", (4, 3))])
def test_qr_backward_refusals_match_torch(mode, shape):
    def run(L):
        a = L.ones(shape, dtype=L.float64).triu().requires_grad_()
        out = L.linalg.qr(a, mode=mode)
        sum(o.sum() for o in out if o.numel()).backward()

    U.assert_same_error(lambda: run(kiln), lambda: run(torch))


@pytest.mark.parametrize("name", ["eigh", "svd", "svd-wide", "qr", "qr-wide"])
def test_eigh_svd_qr_gradgradcheck(name):
    if name == "eigh":
        a = kiln.tensor(_distinct_sym(3, (2,)), requires_grad=True)

        def fn(x):
            r = kiln.linalg.eigh((x + x.mT) * 0.5)
            return r.eigenvalues, kiln.matmul(r.eigenvectors * r.eigenvalues.unsqueeze(-2) ** 2, r.eigenvectors.mT)
    elif name.startswith("svd"):
        a = kiln.tensor(_distinct_svd(3, 4) if name == "svd-wide" else _distinct_svd(4, 3), requires_grad=True)

        def fn(x):
            r = kiln.linalg.svd(x, full_matrices=False)
            return r.S, kiln.matmul(r.U, r.Vh)
    else:
        a = kiln.tensor(_distinct_svd(3, 4) if name == "qr-wide" else _distinct_svd(4, 3), requires_grad=True)

        def fn(x):
            return tuple(kiln.linalg.qr(x))

    assert kiln.autograd.gradcheck(fn, (a,))
    assert kiln.autograd.gradgradcheck(fn, (a,))


NORMS = [
    ("fro", {}),
    ("nuc", {}),
    (1, {}),
    (-1, {}),
    (2, {}),
    (-2, {}),
    (float("inf"), {}),
    (float("-inf"), {}),
    ("fro", {"dim": (0, 2), "keepdim": True}),
    (1, {"dim": (2, 0), "keepdim": True}),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("i", range(len(NORMS)))
def test_matrix_norm(i, dtype):
    order, kw = NORMS[i]
    a = _mat_pair(_distinct_svd(3, 4, (2,)), dtype, "transposed")
    U.check_op(lambda L, x: L.linalg.matrix_norm(x, order, **kw), a, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "args", [((), {}), ((None, (0, 1)), {}), ((2,), {}), (("fro",), {}), (("nuc",), {}), ((3, 1), {"keepdim": True})]
)
def test_norm(args):
    pos, kw = args
    a = U.make_pair((3, 4), kiln.float64, requires_grad=True)
    U.check_op(lambda L, x: L.linalg.norm(x, *pos, **kw), a)


def test_vecdot_cross():
    a, b = _pairs([(2, 3), (3,)], kiln.float64)
    U.check_op(lambda L, x, y: L.linalg.vecdot(x, y), a, b)
    a, b = _pairs([(2, 3), (1, 3)], kiln.float64)
    U.check_op(lambda L, x, y: L.linalg.cross(x, y), a, b)
    c, d = _pairs([(3, 2), (3, 2)], kiln.float64)
    U.check_op(lambda L, x, y: L.linalg.cross(x, y, dim=0), c, d)
    assert kiln.autograd.gradgradcheck(
        lambda x, y: kiln.linalg.cross(x, y), (kiln.randn(2, 3, dtype=kiln.float64, requires_grad=True),) * 2
    )


MORE_ERRORS = [
    lambda L: L.linalg.eigh(L.ones(3, 4)),
    lambda L: L.linalg.eigh(L.ones(3, 3), UPLO="X"),
    lambda L: L.linalg.svd(L.ones(3)),
    lambda L: L.linalg.qr(L.ones(3)),
    lambda L: L.linalg.qr(L.ones(3, 3), mode="x"),
    lambda L: L.linalg.matrix_norm(L.ones(3)),
    lambda L: L.linalg.matrix_norm(L.ones(3, 3), ord=3),
    lambda L: L.linalg.cross(L.ones(4), L.ones(4)),
    lambda L: L.linalg.cross(L.ones(2, 3), L.ones(3)),
    lambda L: L.dot(L.ones(3), L.ones(3, dtype=L.float64)),
    lambda L: L.addmm(L.ones(2, 2), L.ones(3, 4), L.ones(4, 5)),
    lambda L: L.tensordot(L.ones(2, 3), L.ones(4, 5), 1),
    lambda L: L.einsum("ij->k", L.ones(2, 3)),
    lambda L: L.einsum("ij", L.ones(2, 3, 4)),
    lambda L: L.linalg.solve(L.ones(3, 3), L.ones(4)),
    lambda L: L.linalg.solve(L.ones(3, 3), L.ones(4, 2)),
    lambda L: L.linalg.solve(L.eye(3), L.ones(3, dtype=L.float64)),
    lambda L: L.linalg.det(L.ones(2, 3, 3, dtype=L.int32)),
    lambda L: L.linalg.norm(L.ones(2, 3, 4), 2),
    lambda L: L.bmm(L.ones(2, 3, 4, dtype=L.float64), L.ones(2, 4, 5)),
    lambda L: L.linalg.vecdot(L.ones(3), L.ones(4)),
    lambda L: L.linalg.eigh(L.ones(3, 3, dtype=L.int64)),
]


@pytest.mark.parametrize("i", range(len(MORE_ERRORS)))
def test_more_errors(i):
    U.assert_same_error(lambda: MORE_ERRORS[i](kiln), lambda: MORE_ERRORS[i](torch), exact=True)


def test_toplevel_and_methods():
    a = _mat_pair(_well(3, (2,)), kiln.float64)
    U.check_op(lambda L, x: (L.det(x), x.det(), L.inverse(x), x.inverse(), tuple(x.slogdet()), tuple(L.slogdet(x))), a)


# ---------------------------------------------------------------------------------------- fused products


@pytest.mark.parametrize(
    "fn",
    [
        lambda L, i, a, b: L.addmm(i, a, b),
        lambda L, i, a, b: L.addmm(i[0], a, b, beta=0.5, alpha=-2),
        lambda L, i, a, b: i.addmm(a, b, beta=0),
        lambda L, i, a, b: L.baddbmm(i, a.expand(2, 3, 4), b.expand(2, 4, 5)),
        lambda L, i, a, b: L.baddbmm(i[:1], a.unsqueeze(0), b.unsqueeze(0), alpha=3),
        lambda L, i, a, b: L.bmm(a.unsqueeze(0), b.unsqueeze(0)),
        lambda L, i, a, b: a.unsqueeze(0).bmm(b.unsqueeze(0).mT.mT),
    ],
)
def test_fused_products_match_torch_with_node_names(fn):
    i = U.make_pair((3, 5), kiln.float64, requires_grad=True)
    a = U.make_pair((3, 4), kiln.float64, layout="transposed", requires_grad=True, seed=1)
    b = U.make_pair((4, 5), kiln.float64, requires_grad=True, seed=2)
    k_out, t_out = U.check_op(fn, i, a, b)
    assert k_out.grad_fn.name() == t_out.grad_fn.name()
    ks = [p.k for p in (i, a, b)]
    assert kiln.autograd.gradgradcheck(lambda *xs: fn(kiln, *xs), ks)


@pytest.mark.parametrize(
    "fn",
    [
        lambda L: L.addmm(L.zeros(2, 3, dtype=L.float64), L.zeros(2, 4), L.zeros(4, 3)),
        lambda L: L.addmm(L.zeros(2, 3), L.zeros(2, 4, dtype=L.float64), L.zeros(4, 3)),
        lambda L: L.addmm(L.zeros(2, 2), L.zeros(2, 4), L.zeros(4, 3)),
        lambda L: L.addmm(L.zeros(2, 3), L.zeros(2, 4), L.zeros(5, 3)),
        lambda L: L.addmm(L.zeros(2, 3), L.zeros(2, 4, 1), L.zeros(4, 3)),
        lambda L: L.baddbmm(L.zeros(2, 3, dtype=L.float64), L.zeros(1, 2, 4), L.zeros(1, 4, 3)),
        lambda L: L.baddbmm(L.zeros(2, 3), L.zeros(1, 2, 4), L.zeros(2, 4, 3)),
        lambda L: L.bmm(L.zeros(2, 3), L.zeros(2, 3, 4)),
        lambda L: L.bmm(L.zeros(2, 2, 3), L.zeros(2, 4, 4)),
    ],
)
def test_fused_product_errors_match_torch(fn):
    U.assert_same_error(lambda: fn(kiln), lambda: fn(torch))
