"""Creation functions against PyTorch: tensor (dtype inference), zeros/ones/empty/full (+ _like),
arange, linspace, eye; rand/randn/randint shapes, dtypes, ranges and reproducibility."""

# ruff: noqa: B023 - lambdas made inside loops are called within the same iteration

from __future__ import annotations

import re

import kiln_testutil as U
import numpy as np
import pytest
import torch

import kiln

# ---------------------------------------------------------------------------------------- tensor()

TENSOR_DATA = [
    ("ints", [1, 2, 3]),
    ("floats", [1.0, 2.5]),
    ("mixed int float", [1, 2.5]),
    ("bools", [True, False]),
    ("bool and int", [True, 2]),
    ("bool and float", [True, 2.5]),
    ("nested", [[1, 2], [3, 4]]),
    ("nested floats 3-d", [[[1.5], [2.0]], [[3.0], [-4.0]]]),
    ("empty list", []),
    ("empty nested", [[], []]),
    ("int scalar", 7),
    ("float scalar", 3.5),
    ("bool scalar", True),
    ("big int", [2**40, -(2**40)]),
    ("tuple", (1.0, 2.0)),
    ("list of tuples", [(1, 2), (3, 4)]),
    ("np float64 array", np.array([1.5, 2.5])),
    ("np float32 array", np.array([1.5, 2.5], dtype=np.float32)),
    ("np float16 array", np.array([1.5, 2.5], dtype=np.float16)),
    ("np int32 array", np.array([[1, 2]], dtype=np.int32)),
    ("np int8 array", np.array([1, -2], dtype=np.int8)),
    ("np uint8 array", np.array([1, 255], dtype=np.uint8)),
    ("np bool array", np.array([True, False])),
    ("np 0-d array", np.array(2.5)),
    ("np float64 scalar", np.float64(1.5)),
    ("np int64 scalar", np.int64(3)),
    ("np non-contiguous", np.arange(12.0).reshape(3, 4)[:, ::2]),
    ("np transposed", np.arange(6, dtype=np.int32).reshape(2, 3).T),
    ("list of np scalars", [np.float32(1.5), np.float32(2.5)]),
    ("inf nan", [float("inf"), float("nan"), -0.0]),
]


@pytest.mark.parametrize("case", TENSOR_DATA, ids=[c[0] for c in TENSOR_DATA])
def test_tensor_dtype_inference(case):
    _, data = case
    U.assert_close(kiln.tensor(data), torch.tensor(data))


@pytest.mark.parametrize("case", TENSOR_DATA, ids=[c[0] for c in TENSOR_DATA])
def test_tensor_dtype_inference_default_float64(case, default_dtype):
    default_dtype(kiln.float64)
    _, data = case
    U.assert_close(kiln.tensor(data), torch.tensor(data))


@pytest.mark.parametrize("dtype", U.ALL_DTYPES, ids=U.dtype_id)
def test_tensor_explicit_dtype(dtype):
    for data in ([1.7, -1.7, 0.0, 2.5], [1, 0, 3, 100], [True, False, True, True]):
        if dtype is kiln.uint8 and data[1] == -1.7:
            data = [1.7, 1.2, 0.0, 2.5]  # negative float -> uint8 is undefined behaviour in C++
        U.assert_close(kiln.tensor(data, dtype=dtype), torch.tensor(data, dtype=U.K2T[dtype]))


def test_tensor_from_tensors_and_requires_grad():
    parts_k = [kiln.tensor(1.5), kiln.tensor(2.5)]
    parts_t = [torch.tensor(1.5), torch.tensor(2.5)]
    U.assert_close(kiln.tensor(parts_k), torch.tensor(parts_t))
    k = kiln.tensor([1.0, 2.0], requires_grad=True)
    t = torch.tensor([1.0, 2.0], requires_grad=True)
    assert k.requires_grad and k.is_leaf and k.grad_fn is None
    U.assert_close(k, t)
    # tensor() copies
    a = np.array([1.0, 2.0])
    kt = kiln.tensor(a)
    a[0] = 100
    assert kt.tolist() == [1.0, 2.0]


def test_tensor_ragged_error():
    U.assert_same_error(lambda: kiln.tensor([[1, 2], [3]]), lambda: torch.tensor([[1, 2], [3]]))


# ---------------------------------------------------------------------------------------- zeros / ones / empty / full

SHAPE_ARGS = [((2, 3),), (2, 3), ([2, 3],), (0,), ((),), (4,), (1, 0, 2)]


@pytest.mark.parametrize("args", SHAPE_ARGS, ids=repr)
@pytest.mark.parametrize("name", ["zeros", "ones", "empty"])
def test_zeros_ones_empty_shapes(name, args):
    kf, tf = getattr(kiln, name), getattr(torch, name)
    k, t = kf(*args), tf(*args)
    assert tuple(k.shape) == tuple(t.shape) and k.dtype is U.T2K[t.dtype]
    assert k.is_contiguous() and tuple(k.stride()) == tuple(t.stride())
    if name != "empty":
        U.assert_close(k, t)
    for dtype in U.ALL_DTYPES:
        k, t = kf(*args, dtype=dtype), tf(*args, dtype=U.K2T[dtype])
        assert k.dtype is dtype and tuple(k.shape) == tuple(t.shape)
        if name != "empty":
            U.assert_close(k, t)


def test_creation_with_size_object_and_requires_grad():
    size = kiln.Size([2, 3])
    assert tuple(kiln.zeros(size).shape) == (2, 3)
    k = kiln.ones(2, 3, requires_grad=True)
    assert k.requires_grad and k.is_leaf
    assert kiln.zeros(2, dtype=kiln.float64, requires_grad=True).requires_grad


@pytest.mark.parametrize(
    "fill",
    [1, 1.5, True, -3, 0, 2**40, float("inf"), float("nan")],
    ids=repr,
)
def test_full_dtype_inference(fill):
    U.assert_close(kiln.full((2, 3), fill), torch.full((2, 3), fill))
    U.assert_close(kiln.full([2], fill), torch.full([2], fill))
    U.assert_close(kiln.full((), fill), torch.full((), fill))


def test_full_explicit_dtype_and_0d_tensor_fill():
    for dtype in U.ALL_DTYPES:
        U.assert_close(kiln.full((3,), 1, dtype=dtype), torch.full((3,), 1, dtype=U.K2T[dtype]))
    U.assert_close(kiln.full((2, 2), 2.7, dtype=kiln.int64), torch.full((2, 2), 2.7, dtype=torch.int64))


_FILLS = [0.1, 65504.0, 65505.0, 70000, 3.39e38, 1e300, -3.5e38, -0.0, float("nan"), float("-inf"), 2**63, 2**64]
_FILLS += [2**60 + 2**36 + 1, -(2**60 + 2**36 + 1), 2**53 + 1]  # ints a double cannot hold: rounded once


_FILLERS = {
    "full": lambda lib, shape, v, d: lib.full(shape, v, dtype=d),
    "fill_": lambda lib, shape, v, d: lib.zeros(shape, dtype=d).fill_(v),
    "full_like": lambda lib, shape, v, d: lib.full_like(lib.zeros(shape, dtype=d), v),
    "new_full": lambda lib, shape, v, d: lib.zeros(2, dtype=d).new_full(shape, v),
    "fill_diagonal_": lambda lib, shape, v, d: lib.zeros(shape * 2, dtype=d).fill_diagonal_(v),
}


@pytest.mark.parametrize("shape", [(3,), (1,), (0,)], ids=str)
@pytest.mark.parametrize("how", sorted(_FILLERS))
@pytest.mark.parametrize("dtype", [kiln.float16, kiln.bfloat16, kiln.float32, kiln.float64], ids=U.dtype_id)
@pytest.mark.parametrize("fill", [*_FILLS, -(2**63), -(2**63) - 1, True, -1, 1 + 2j, 2 + 0j], ids=repr)
def test_filling_casts_a_number_into_a_float_dtype_as_torch(fill, dtype, how, shape):
    """Filling a float tensor casts the number once, as PyTorch does (rounded to nearest, the sign of zero
    kept; bit for bit), and refuses what PyTorch refuses, with its error: a finite number beyond the dtype's
    largest value (except into one element of float16 or bfloat16, which PyTorch rounds to infinity), a
    complex number with an imaginary part, a Python int beyond 64 bits."""
    make = _FILLERS[how]
    if isinstance(fill, complex) and how in ("full", "fill_", "new_full"):
        pytest.skip("these take a real number only, in both libraries (their own TypeError)")
    try:
        t = make(torch, shape, fill, U.K2T[dtype])
    except (RuntimeError, OverflowError) as exc:
        with pytest.raises(type(exc), match=re.escape(str(exc))):
            make(kiln, shape, fill, dtype)
        return
    k = make(kiln, shape, fill, dtype)
    if dtype is kiln.bfloat16:  # NumPy has no bfloat16: compare the bits
        k, t = k.view(kiln.int16), t.view(torch.int16)
    assert k.numpy().tobytes() == t.numpy().tobytes()


@pytest.mark.parametrize("layout", U.LAYOUTS)
@pytest.mark.parametrize("dtype", U.ALL_DTYPES, ids=U.dtype_id)
def test_like_functions(dtype, layout):
    x = U.make_pair((2, 3), dtype, layout=layout, seed=1)
    for name, extra in (("zeros_like", ()), ("ones_like", ()), ("full_like", (7,)), ("empty_like", ())):
        k = getattr(kiln, name)(x.k, *extra)
        t = getattr(torch, name)(x.t, *extra)
        assert tuple(k.shape) == tuple(t.shape) and k.dtype is U.T2K[t.dtype]
        if name != "empty_like":
            U.assert_close(k, t)
        k = getattr(kiln, name)(x.k, *extra, dtype=kiln.float64)
        t = getattr(torch, name)(x.t, *extra, dtype=torch.float64)
        assert k.dtype is kiln.float64
        if name != "empty_like":
            U.assert_close(k, t)
    U.assert_close(kiln.full_like(x.k, 2.5), torch.full_like(x.t, 2.5))


def test_negative_size_error():
    U.assert_same_error(lambda: kiln.zeros(2, -1), lambda: torch.zeros(2, -1))
    U.assert_same_error(lambda: kiln.full((-2,), 1.0), lambda: torch.full((-2,), 1.0))


# ---------------------------------------------------------------------------------------- arange / linspace / eye

ARANGE = [
    (5,),
    (1, 4),
    (0, 10, 3),
    (5, 0, -1),
    (0, -3, -0.5),
    (0, 1, 0.1),
    (1.0, 2.0, 0.3),
    (-1.5, 1.5, 0.5),
    (0.0,),
    (0, 0),
    (2.5,),
    (10, 2, -3),
    (0, 5, 1.5),
    (-5, 5, 2),
    (1e-3, 1e-2, 1e-3),
]


@pytest.mark.parametrize("args", ARANGE, ids=repr)
def test_arange(args):
    U.assert_close(kiln.arange(*args), torch.arange(*args), rtol=0, atol=1e-6)
    for dtype in (kiln.float64, kiln.int64, kiln.int32, kiln.float32):
        try:
            t = torch.arange(*args, dtype=U.K2T[dtype])
        except Exception:  # noqa: BLE001 - torch refuses (a float step that truncates to 0): kiln must too
            U.assert_same_error(
                lambda: kiln.arange(*args, dtype=dtype), lambda: torch.arange(*args, dtype=U.K2T[dtype])
            )
            continue
        U.assert_close(kiln.arange(*args, dtype=dtype), t, rtol=0, atol=1e-6)


@pytest.mark.parametrize("args", ARANGE, ids=repr)
def test_arange_default_float64(args, default_dtype):
    default_dtype(kiln.float64)
    U.assert_close(kiln.arange(*args), torch.arange(*args), rtol=0, atol=1e-12)


def test_arange_keywords_and_errors():
    U.assert_close(kiln.arange(start=1, end=7, step=2), torch.arange(start=1, end=7, step=2))
    U.assert_close(kiln.arange(5, requires_grad=False), torch.arange(5))
    U.assert_close(kiln.arange(kiln.tensor(4)), torch.arange(torch.tensor(4)))
    U.assert_same_error(lambda: kiln.arange(0, 5, 0), lambda: torch.arange(0, 5, 0))
    U.assert_same_error(lambda: kiln.arange(0, 5, -1), lambda: torch.arange(0, 5, -1))
    k = kiln.arange(3.0, requires_grad=True)
    assert k.requires_grad


LINSPACE = [
    (0, 1, 5),
    (0, 1, 1),
    (0, 1, 0),
    (0, 1, 2),
    (-3.5, 7.25, 11),
    (10, -10, 7),
    (0, 1, 100),
    (1, 1, 4),
    (0, 1e-3, 6),
    (-1e4, 1e4, 33),
    (3, 3.5, 1000),
]


@pytest.mark.parametrize("args", LINSPACE, ids=repr)
def test_linspace(args):
    """Values equal torch's to within an ulp or two (torch computes symmetric halves from both ends)."""
    U.assert_close(kiln.linspace(*args), torch.linspace(*args))
    U.assert_close(
        kiln.linspace(*args, dtype=kiln.float64), torch.linspace(*args, dtype=torch.float64), rtol=1e-14, atol=1e-14
    )
    k = kiln.linspace(*args).numpy()
    t = torch.linspace(*args).numpy()
    big = np.abs(t) >= 1e-3  # away from zero, where an ulp is meaningful
    np.testing.assert_array_max_ulp(k[big], t[big], maxulp=2)


@pytest.mark.parametrize("dtype", [kiln.int64, kiln.int32, kiln.uint8, kiln.float16, kiln.bfloat16], ids=U.dtype_id)
def test_linspace_dtypes(dtype):
    for args in ((0, 10, 5), (0, 10, 4), (1, 7, 3), (0, 100, 7)):
        U.assert_close(kiln.linspace(*args, dtype=dtype), torch.linspace(*args, dtype=U.K2T[dtype]))


def test_linspace_negative_steps_error():
    U.assert_same_error(lambda: kiln.linspace(0, 1, -1), lambda: torch.linspace(0, 1, -1))


@pytest.mark.parametrize("args", [(3,), (2, 4), (4, 2), (0,), (1,), (3, 0)], ids=repr)
def test_eye(args):
    U.assert_close(kiln.eye(*args), torch.eye(*args))
    for dtype in (kiln.int64, kiln.bool, kiln.float64, kiln.float16):
        U.assert_close(kiln.eye(*args, dtype=dtype), torch.eye(*args, dtype=U.K2T[dtype]))


def test_eye_negative_error():
    U.assert_same_error(lambda: kiln.eye(-1), lambda: torch.eye(-1))


# ---------------------------------------------------------------------------------------- random


@pytest.mark.parametrize("name", ["rand", "randn"])
def test_rand_randn_shapes_and_dtypes(name):
    f = getattr(kiln, name)
    for args in (((2, 3),), (2, 3), ([4],), (0, 2), ((),)):
        k = f(*args)
        t = getattr(torch, name)(*args)
        assert tuple(k.shape) == tuple(t.shape) and k.dtype is kiln.float32 and k.is_contiguous()
    for dtype in (kiln.float64, kiln.float16, kiln.bfloat16):
        k = f(3, 4, dtype=dtype)
        assert k.dtype is dtype and tuple(k.shape) == (3, 4)
    assert f(2, requires_grad=True).requires_grad


def test_rand_range_and_randn_moments():
    kiln.manual_seed(1234)
    u = kiln.rand(20000, dtype=kiln.float64).numpy()
    assert u.min() >= 0.0 and u.max() < 1.0
    assert abs(u.mean() - 0.5) < 0.01 and abs(u.std() - np.sqrt(1 / 12)) < 0.01
    n = kiln.randn(20000, dtype=kiln.float64).numpy()
    assert abs(n.mean()) < 0.03 and abs(n.std() - 1) < 0.03
    u32 = kiln.rand(10000).numpy()
    assert u32.dtype == np.float32 and u32.min() >= 0 and u32.max() < 1
    assert len(np.unique(u32)) > 9000


def test_rand_integer_dtype_error():
    U.assert_same_error(lambda: kiln.rand(3, dtype=kiln.int64), lambda: torch.rand(3, dtype=torch.int64))
    U.assert_same_error(lambda: kiln.randn(3, dtype=kiln.int64), lambda: torch.randn(3, dtype=torch.int64))


@pytest.mark.parametrize(
    "args,kwargs",
    [
        ((10, (1000,)), {}),
        ((3, 10, (2000,)), {}),
        ((-5, 5, (4, 500)), {}),
        ((2, (3,)), {"dtype": kiln.int32}),
        ((0, 2, (1000,)), {"dtype": kiln.float32}),
        ((256, (100,)), {"dtype": kiln.uint8}),
        ((5,), {"size": (7,)}),
    ],
    ids=repr,
)
def test_randint(args, kwargs):
    kiln.manual_seed(0)
    k = kiln.randint(*args, **kwargs)
    t_kwargs = {k_: (U.K2T[v] if isinstance(v, kiln.dtype) else v) for k_, v in kwargs.items()}
    t = torch.randint(*args, **t_kwargs)
    assert tuple(k.shape) == tuple(t.shape) and k.dtype is U.T2K[t.dtype]
    low, high = (0, args[0]) if len(args) == 2 or "size" in kwargs else (args[0], args[1])
    v = k.numpy()
    assert v.min() >= low and v.max() < high
    if v.size >= 1000:
        assert len(np.unique(v)) == high - low, "every value in [low, high) should occur"


def test_randint_errors():
    U.assert_same_error(lambda: kiln.randint(5, 5, (3,)), lambda: torch.randint(5, 5, (3,)))


def test_manual_seed_reproducibility():
    kiln.manual_seed(7)
    a = [kiln.rand(5), kiln.randn(2, 3), kiln.randint(0, 100, (4,))]
    kiln.manual_seed(7)
    b = [kiln.rand(5), kiln.randn(2, 3), kiln.randint(0, 100, (4,))]
    for x, y in zip(a, b):
        assert x.tolist() == y.tolist()
    kiln.manual_seed(8)
    c = kiln.rand(5)
    assert c.tolist() != a[0].tolist()
    assert kiln.initial_seed() == 8
    kiln.manual_seed(7)
    assert kiln.rand(5).tolist() == a[0].tolist()


def test_generator_streams_are_independent_and_reproducible():
    g1 = kiln.Generator().manual_seed(3)
    kiln.manual_seed(0)
    x1 = kiln.rand(6, generator=g1)
    kiln.rand(10)  # global stream use does not disturb g1
    x2 = kiln.rand(6, generator=g1)
    g2 = kiln.Generator()
    assert g2.manual_seed(3) is g2
    assert kiln.rand(6, generator=g2).tolist() == x1.tolist()
    assert kiln.rand(6, generator=g2).tolist() == x2.tolist()
    assert g1.initial_seed() == 3
    g3 = kiln.Generator().manual_seed(3)
    assert kiln.randn(4, generator=g3).tolist() == kiln.randn(4, generator=kiln.Generator().manual_seed(3)).tolist()
    g4 = kiln.Generator().manual_seed(3)
    assert (
        kiln.randint(0, 1000, (8,), generator=g4).tolist()
        == kiln.randint(0, 1000, (8,), generator=kiln.Generator().manual_seed(3)).tolist()
    )


def test_rng_state_round_trip():
    kiln.manual_seed(11)
    kiln.rand(3)
    state = kiln.get_rng_state()
    assert state.dtype is kiln.uint8
    a = kiln.rand(5)
    kiln.set_rng_state(state)
    b = kiln.rand(5)
    assert a.tolist() == b.tolist()
    g = kiln.Generator().manual_seed(5)
    s = g.get_state()
    x = kiln.randn(3, generator=g)
    g.set_state(s)
    assert kiln.randn(3, generator=g).tolist() == x.tolist()


@pytest.mark.parametrize("name", ["rand_like", "randn_like"])
def test_random_like(name):
    for dtype in (kiln.float32, kiln.float64, kiln.float16):
        x = kiln.zeros(2, 5, dtype=dtype)
        k = getattr(kiln, name)(x)
        assert k.dtype is dtype and tuple(k.shape) == (2, 5)
    k = kiln.randint_like(kiln.zeros(3, 3, dtype=kiln.int32), 4, 9)
    t = torch.randint_like(torch.zeros(3, 3, dtype=torch.int32), 4, 9)
    assert k.dtype is U.T2K[t.dtype] and tuple(k.shape) == (3, 3)
    assert k.numpy().min() >= 4 and k.numpy().max() < 9
    k = kiln.randint_like(kiln.zeros(3, dtype=kiln.float32), 10)
    t = torch.randint_like(torch.zeros(3, dtype=torch.float32), 10)
    assert k.dtype is U.T2K[t.dtype]


# ---------------------------------------------------------------------------------------- randperm


@pytest.mark.parametrize("n", [0, 1, 7, 1000])
def test_randperm_is_a_permutation(n):
    p = kiln.randperm(n)
    assert p.dtype is kiln.int64 and p.shape == (n,)
    assert sorted(p.tolist()) == list(range(n))


def test_randperm_generator_dtype_and_reproducibility():
    a = kiln.randperm(50, generator=kiln.Generator().manual_seed(3))
    b = kiln.randperm(50, generator=kiln.Generator().manual_seed(3))
    assert a.tolist() == b.tolist()
    kiln.manual_seed(7)
    c = kiln.randperm(50)
    kiln.manual_seed(7)
    assert kiln.randperm(50).tolist() == c.tolist()
    assert a.tolist() != list(range(50))
    f = kiln.randperm(5, dtype=kiln.float32, requires_grad=True)
    assert f.dtype is kiln.float32 and f.requires_grad and sorted(f.tolist()) == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert kiln.randperm(5, dtype=kiln.uint8).dtype is kiln.uint8


@pytest.mark.parametrize(
    "fn",
    [
        lambda L: L.randperm(-1),
        lambda L: L.randperm(3, dtype=L.bool),
        lambda L: L.randperm(300, dtype=L.int8),
    ],
)
def test_randperm_errors_match_torch(fn):
    U.assert_same_error(lambda: fn(kiln), lambda: fn(torch))
