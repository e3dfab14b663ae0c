"""More products against torch: ``cross`` (with the deprecated default ``dim``), ``kron``, ``inner``, ``vdot``,
``addr``, ``linalg.multi_dot``/``chain_matmul``, ``cdist``, ``dist`` and the in-place products (``addmm_``,
``baddbmm_``, ``addbmm_``, ``addmv_``, ``addr_``)."""

from __future__ import annotations

import warnings

import kiln_testutil as U
import numpy as np
import pytest
import torch

import kiln

FLOATS = [kiln.float32, kiln.float64]
LAYOUTS = ["contiguous", "transposed", "strided", "expanded"]


def _pairs(shapes, dtype=kiln.float64, layout="contiguous", grad=True, **kw):
    return [
        U.make_pair(s, dtype, layout=layout, seed=i, requires_grad=grad and dtype.is_floating_point, **kw)
        for i, s in enumerate(shapes)
    ]


def _gradcheck(fn, *shapes):
    rng = np.random.default_rng(0)
    xs = [kiln.tensor(rng.standard_normal(s), requires_grad=True) for s in shapes]
    assert kiln.autograd.gradcheck(fn, xs) and kiln.autograd.gradgradcheck(fn, xs)


# ---------------------------------------------------------------------------------------- cross


@pytest.mark.parametrize("layout", LAYOUTS)
def test_cross_with_dim(layout):
    a, b = _pairs([(4, 3), (4, 3)], layout=layout)
    U.check_op(lambda L, x, y: L.cross(x, y, dim=1), a, b)
    U.check_op(lambda L, x, y: x.cross(y, -1), a, b)
    U.check_op(lambda L, x, y: L.cross(x, y, 0), *_pairs([(3, 5), (1, 5)], layout=layout))
    U.check_op(lambda L, x, y: L.cross(x, y, dim=1), *_pairs([(0, 3), (0, 3)]))
    U.check_op(lambda L, x, y: L.cross(x, y, dim=1), *_pairs([(2, 3), (2, 3)], dtype=kiln.int64))


def test_cross_default_dim_is_the_first_of_size_3_and_warns():
    a, b = _pairs([(2, 3, 3), (2, 3, 3)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        U.check_op(lambda L, x, y: L.cross(x, y), a, b)
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert any(m.startswith("Using kiln.cross without specifying the dim arg is deprecated.") for m in messages)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        U.check_op(lambda L, x, y: L.cross(x, y), *_pairs([(1, 3), (3, 3)]))  # searched in input's shape
        U.check_op(lambda L, x, y: L.cross(x, y, dim=None), *_pairs([(3,), (3,)]))


@pytest.mark.parametrize(
    "fn",
    [
        lambda L: L.cross(L.ones(2, 4), L.ones(2, 4)),
        lambda L: L.cross(L.ones(4, 3), L.ones(3), dim=1),
        lambda L: L.cross(L.ones(4, 3), L.ones(4, 3, dtype=L.float64), dim=1),
        lambda L: L.cross(L.ones(4, 3), L.ones(4, 3), dim=2),
        lambda L: L.cross(L.ones(3, 1), L.ones(1, 3)),
        lambda L: L.linalg.cross(L.ones(4, 3), L.ones(4, 3, dtype=L.float64)),
    ],
)
def test_cross_errors(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        U.assert_same_error(lambda: fn(kiln), lambda: fn(torch), exact=True)


# ---------------------------------------------------------------------------------------- kron, inner, vdot

KRON = [[(2, 3), (4, 5)], [(2,), (4, 5)], [(2, 3, 2), (2,)], [(), (3,)], [(0, 2), (3, 1)], [(2, 1), ()]]


@pytest.mark.parametrize("shapes", KRON, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "strided"])  # torch.kron refuses some transposed inputs (a view)
def test_kron(shapes, layout):
    U.check_op(lambda L, x, y: L.kron(x, y), *_pairs(shapes, layout=layout))
    U.check_op(lambda L, x, y: x.kron(y), *_pairs(shapes, dtype=kiln.int32))


def test_kron_promotes_and_gradcheck():
    U.check_op(lambda L, x, y: L.kron(x, y), U.make_pair((2,), kiln.int64), U.make_pair((2,), kiln.float32))
    _gradcheck(lambda x, y: kiln.kron(x, y), (2, 3), (3, 2))
    U.assert_same_error(lambda: kiln.kron(kiln.ones(2), 3), lambda: torch.kron(torch.ones(2), 3), exact=True)


INNER = [[(2, 3), (4, 3)], [(3,), (3,)], [(), (3, 2)], [(2, 3, 4), (5, 4)], [(0, 3), (3,)]]


@pytest.mark.parametrize("shapes", INNER, ids=str)
def test_inner(shapes):
    for layout in ("contiguous", "transposed"):
        U.check_op(lambda L, x, y: L.inner(x, y), *_pairs(shapes, layout=layout))
        U.check_op(lambda L, x, y: x.inner(y), *_pairs(shapes, dtype=kiln.int64))


def test_vdot():
    U.check_op(lambda L, x, y: L.vdot(x, y), *_pairs([(5,), (5,)], layout="strided"))
    U.check_op(lambda L, x, y: x.vdot(y), *_pairs([(4,), (4,)], dtype=kiln.int64))
    U.check_op(lambda L, x, y: L.vdot(x, y), *_pairs([(0,), (0,)]))
    _gradcheck(lambda x, y: kiln.vdot(x, y), (4,), (4,))


@pytest.mark.parametrize(
    "fn",
    [
        lambda L: L.inner(L.ones(2, 3), L.ones(4, 2)),
        lambda L: L.inner(L.tensor([1, 2]), L.tensor([1.0, 2.0])),
        lambda L: L.vdot(L.ones(3), L.ones(4)),
        lambda L: L.vdot(L.ones(3, 1), L.ones(3)),
        lambda L: L.vdot(L.tensor([1, 2]), L.tensor([1.0, 2.0])),
    ],
)
def test_inner_vdot_errors(fn):
    U.assert_same_error(lambda: fn(kiln), lambda: fn(torch), exact=True)


# ---------------------------------------------------------------------------------------- addr


@pytest.mark.parametrize("beta,alpha", [(1, 1), (0.5, 2.0), (0, 1)])
@pytest.mark.parametrize("input_shape", [(2, 3), (3,), (2, 1), ()])
def test_addr(beta, alpha, input_shape):
    c, a, b = _pairs([input_shape, (2,), (3,)])
    U.check_op(lambda L, z, x, y: L.addr(z, x, y, beta=beta, alpha=alpha), c, a, b)
    U.check_op(lambda L, z, x, y: z.addr(x, y, beta=beta, alpha=alpha), c, a, b)


def test_addr_dtypes_nan_and_inplace():
    ints = _pairs([(2, 3), (2,), (3,)], dtype=kiln.int64)
    U.check_op(lambda L, z, x, y: L.addr(z, x, y, beta=2, alpha=3), *ints)
    bools = [U.make_pair(s, kiln.bool, seed=i) for i, s in enumerate([(2, 3), (2,), (3,)])]
    U.check_op(lambda L, z, x, y: L.addr(z, x, y), *bools)
    U.check_op(lambda L, z, x, y: L.addr(z, x, y, beta=False), *bools)
    mixed = [U.make_pair((2, 3)), U.make_pair((2,)), U.make_pair((3,), kiln.float64)]
    U.check_op(lambda L, z, x, y: L.addr(z, x, y), *mixed)
    nan = U.make_pair((2, 3), values=np.full((2, 3), np.nan))
    U.check_op(lambda L, z, x, y: L.addr(z, x, y, beta=0), nan, *_pairs([(2,), (3,)], dtype=kiln.float32))
    c, a, b = _pairs([(2, 3), (2,), (3,)], grad=False)
    U.check_op(lambda L, z, x, y: z.clone().addr_(x, y, alpha=2), c, a, b)
    _gradcheck(lambda z, x, y: kiln.addr(z, x, y, beta=0.5, alpha=2), (2, 3), (2,), (3,))


@pytest.mark.parametrize(
    "fn",
    [
        lambda L: L.addr(L.ones(2, 3), L.ones(2, 1), L.ones(3)),
        lambda L: L.addr(L.ones(2, 3), L.ones(2), L.ones(4)),
        lambda L: L.addr(L.tensor([[1]]), L.tensor([1]), L.tensor([1]), alpha=1.5),
        lambda L: L.addr(L.tensor([[1]]), L.tensor([1]), L.tensor([1]), beta=0.5),
        lambda L: L.ones(3).addr_(L.ones(2), L.ones(3)),
    ],
)
def test_addr_errors(fn):
    U.assert_same_error(lambda: fn(kiln), lambda: fn(torch), exact=True)


# ---------------------------------------------------------------------------------------- in-place products

INPLACE_PRODUCTS = [
    ("addmm_", [(3, 5), (3, 4), (4, 5)], {"beta": 0.5, "alpha": 2}),
    ("baddbmm_", [(2, 3, 5), (2, 3, 4), (2, 4, 5)], {"alpha": -1}),
    ("addbmm_", [(3, 5), (2, 3, 4), (2, 4, 5)], {"beta": 2}),
    ("addmv_", [(3,), (3, 4), (4,)], {"beta": 0.5, "alpha": 2}),
    ("addr_", [(3, 4), (3,), (4,)], {}),
]


@pytest.mark.parametrize("name,shapes,kwargs", INPLACE_PRODUCTS, ids=[p[0] for p in INPLACE_PRODUCTS])
def test_inplace_products(name, shapes, kwargs):
    c, a, b = _pairs(shapes, layout="contiguous")

    def fn(L, z, x, y):
        out = z * 1  # a non-leaf, so that the in-place write is recorded
        r = getattr(out, name)(x, y, **kwargs)
        assert r is out
        return out

    U.check_op(fn, c, a, b)
    if name == "addbmm_":
        return  # torch resizes a 1x1 self to the result's shape there; kiln does not resize tensors in place
    small = (1,) * len(shapes[0])  # the result does not fit into self: refused, as in torch (message aside)
    with pytest.raises(RuntimeError):
        getattr(torch.ones(small, dtype=torch.float64), name)(a.t.detach(), b.t.detach())
    with pytest.raises(RuntimeError):
        getattr(kiln.ones(small, dtype=kiln.float64), name)(a.k.detach(), b.k.detach())


# ---------------------------------------------------------------------------------------- multi_dot, chain_matmul

CHAINS = [
    [(2, 3), (3, 4)],
    [(3,), (3, 4), (4, 2)],
    [(2, 3), (3, 4), (4,)],
    [(5,), (5, 2), (2, 6), (6, 3), (3,)],
    [(10, 2), (2, 10), (10, 3), (3, 1)],
    [(2, 0), (0, 3)],
]


@pytest.mark.parametrize("shapes", CHAINS, ids=str)
def test_multi_dot(shapes):
    U.check_op(lambda L, *ms: L.linalg.multi_dot(ms), *_pairs(shapes, layout="transposed"), rtol=1e-10, atol=1e-10)
    U.check_op(lambda L, *ms: L.linalg.multi_dot(list(ms)), *_pairs(shapes, dtype=kiln.int64))


def test_chain_matmul_warns_and_multiplies():
    ms = _pairs([(2, 3), (3, 4), (4, 5)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        U.check_op(lambda L, *m: L.chain_matmul(*m), *ms, rtol=1e-10)
        one = kiln.chain_matmul(ms[0].k)
    assert any("kiln.chain_matmul is deprecated" in str(w.message) for w in caught)
    assert one is not ms[0].k and bool((one == ms[0].k).all())


@pytest.mark.parametrize(
    "fn",
    [
        lambda L: L.linalg.multi_dot([L.ones(3)]),
        lambda L: L.linalg.multi_dot([]),
        lambda L: L.linalg.multi_dot([L.ones(2, 3), L.ones(4, 5)]),
        lambda L: L.linalg.multi_dot([L.ones(2, 3), L.ones(3, 5, dtype=L.float64)]),
        lambda L: L.linalg.multi_dot([L.ones(2, 3, 3), L.ones(3, 5)]),
        lambda L: L.linalg.multi_dot([L.ones(2, 3), L.ones(3, 5, 1)]),
        lambda L: L.linalg.multi_dot([L.ones(2, 3), L.ones(3), L.ones(3, 5)]),
        lambda L: L.chain_matmul(),
        lambda L: L.chain_matmul(L.ones(3)),
    ],
)
def test_multi_dot_errors(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        U.assert_same_error(lambda: fn(kiln), lambda: fn(torch), exact=True)


# ---------------------------------------------------------------------------------------- cdist, dist


@pytest.mark.parametrize("p", [2.0, 1.0, 0.0, 0.5, 3.0, float("inf")])
@pytest.mark.parametrize(
    "shapes", [[(4, 3), (5, 3)], [(2, 4, 3), (5, 3)], [(2, 1, 4, 3), (3, 5, 3)], [(0, 3), (2, 3)]], ids=str
)
def test_cdist(p, shapes):
    a, b = _pairs(shapes, layout="contiguous")
    U.check_op(lambda L, x, y: L.cdist(x, y, p=p), a, b, rtol=1e-7, atol=1e-7)


@pytest.mark.parametrize(
    "mode", ["use_mm_for_euclid_dist", "donot_use_mm_for_euclid_dist", "use_mm_for_euclid_dist_if_necessary"]
)
def test_cdist_compute_modes(mode):
    a, b = _pairs([(30, 3), (7, 3)], dtype=kiln.float32)
    U.check_op(lambda L, x, y: L.cdist(x, y, compute_mode=mode), a, b, rtol=1e-4, atol=1e-4)
    same = U.make_pair((3, 2), kiln.float64, requires_grad=True)
    U.check_op(lambda L, x: L.cdist(x, x.detach(), compute_mode=mode), same, atol=1e-6)  # zero distances


def test_cdist_gradcheck():
    for p in (2.0, 1.5, 3.0):
        _gradcheck(lambda x, y, p=p: kiln.cdist(x, y, p=p), (3, 2), (4, 2))
    _gradcheck(lambda x, y: kiln.cdist(x, y, compute_mode="use_mm_for_euclid_dist"), (3, 2), (4, 2))


@pytest.mark.parametrize(
    "fn",
    [
        lambda L: L.cdist(L.ones(4, 3), L.ones(5, 2)),
        lambda L: L.cdist(L.ones(4, 3), L.ones(5, 3), p=-1),
        lambda L: L.cdist(L.ones(3), L.ones(5, 3)),
        lambda L: L.cdist(L.ones(4, 3, dtype=L.float64), L.ones(5, 3)),
        lambda L: L.cdist(L.tensor([[1, 2]]), L.tensor([[1, 2]])),
        lambda L: L.cdist(L.ones(4, 3), L.ones(5, 3), compute_mode="x"),
    ],
)
def test_cdist_errors(fn):
    U.assert_same_error(lambda: fn(kiln), lambda: fn(torch), exact=True)


@pytest.mark.parametrize("p", [2, 0, 1, 3.5, float("inf"), -float("inf")])
def test_dist(p):
    # torch's backward of the 0-"norm" fails ("Expected a proper Tensor but got None"): compared forward only
    U.check_op(lambda L, x, y: L.dist(x, y, p), *_pairs([(3,), (2, 3)], layout="strided"), grad=p != 0)
    U.check_op(lambda L, x, y: x.dist(y, p=p), *_pairs([(2, 3), ()]), grad=p != 0)
    U.check_op(lambda L, x, y: L.dist(x, y), U.make_pair((3,)), U.make_pair((3,), kiln.float64))
    U.assert_same_error(
        lambda: kiln.dist(kiln.tensor([1, 2]), kiln.tensor([1, 2])),
        lambda: torch.dist(torch.tensor([1, 2]), torch.tensor([1, 2])),
        exact=True,
    )
