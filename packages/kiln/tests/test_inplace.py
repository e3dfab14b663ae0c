"""In-place ops against PyTorch: values, returned object, writes through views, version counters,
dtype/broadcast rules, and autograd through in-place writes on (views of) non-leaf tensors."""

# ruff: noqa: B023 - lambdas made inside loops are called within the same iteration

from __future__ import annotations

import kiln_testutil as U
import numpy as np
import pytest
import torch

import kiln

# name -> fn(self, other) applying the op in place (the same code for both libraries)
INPLACE = {
    "add_": lambda a, b: a.add_(b),
    "add_alpha": lambda a, b: a.add_(b, alpha=-2),
    "sub_": lambda a, b: a.sub_(b),
    "sub_alpha": lambda a, b: a.sub_(b, alpha=0.5),
    "mul_": lambda a, b: a.mul_(b),
    "div_": lambda a, b: a.div_(b),
    "div_trunc": lambda a, b: a.div_(b, rounding_mode="trunc"),
    "div_floor": lambda a, b: a.div_(b, rounding_mode="floor"),
    "pow_": lambda a, b: a.pow_(b),
    "+=": lambda a, b: a.__iadd__(b),
    "-=": lambda a, b: a.__isub__(b),
    "*=": lambda a, b: a.__imul__(b),
    "/=": lambda a, b: a.__itruediv__(b),
    "copy_": lambda a, b: a.copy_(b) if not isinstance(b, (int, float)) else a.fill_(b),
}
UNARY_INPLACE = {
    "exp_": lambda a: a.exp_(),
    "neg_": lambda a: a.neg_(),
    "relu_": lambda a: a.relu_(),
    "zero_": lambda a: a.zero_(),
    "fill_(2.5)": lambda a: a.fill_(2.5),
    "fill_(int)": lambda a: a.fill_(-3),
    "fill_(0-d tensor)": None,
}


def _apply_both(x: U.Pair, fn_k, fn_t):
    """Apply an in-place op to both; check it returns ``self``, and compare values, base and version."""
    rt = fn_t(x.t)
    rk = fn_k(x.k)
    assert rt is x.t
    assert rk is x.k, "in-place ops return self"
    U.assert_close(x.k, x.t)
    U.assert_close(x.k_leaf, x.t_leaf, msg="base of the written view: ")
    assert x.k._version == x.t._version, f"version {x.k._version} != torch's {x.t._version}"
    assert x.k_leaf._version == x.t_leaf._version


@pytest.mark.parametrize("name", list(INPLACE))
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
@pytest.mark.parametrize("other", ["tensor", "broadcast", "0-d", "int", "float"])
def test_binary_inplace(name, layout, other):
    fn = INPLACE[name]
    for dtype in U.FLOAT_DTYPES:
        x = U.make_pair((3, 4), dtype, layout=layout, seed=1, low=0.5, high=2.0)
        if other in ("int", "float"):
            v = 2 if other == "int" else 1.5
            _apply_both(x, lambda a: fn(a, v), lambda a: fn(a, v))
            continue
        shape = {"tensor": (3, 4), "broadcast": (4,), "0-d": ()}[other]
        y = U.make_pair(shape, dtype, layout=layout if other == "tensor" else "contiguous", seed=2, low=0.5, high=2.0)
        _apply_both(x, lambda a: fn(a, y.k), lambda a: fn(a, y.t))


@pytest.mark.parametrize("name", list(UNARY_INPLACE))
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
def test_unary_inplace(name, layout):
    for dtype in (kiln.float32, kiln.float64, kiln.float16):
        x = U.make_pair((3, 4), dtype, layout=layout, seed=3)
        if name == "fill_(0-d tensor)":
            v = U.make_pair((), dtype, seed=4)
            _apply_both(x, lambda a: a.fill_(v.k), lambda a: a.fill_(v.t))
        else:
            _apply_both(x, UNARY_INPLACE[name], UNARY_INPLACE[name])


@pytest.mark.parametrize("name", ["add_", "sub_", "mul_", "+=", "*=", "copy_"])
def test_integer_inplace(name):
    fn = INPLACE[name]
    for dtype in (kiln.int64, kiln.int32, kiln.uint8, kiln.int8):
        x = U.make_pair((3, 4), dtype, layout="transposed", seed=5)
        y = U.make_pair((4,), dtype, seed=6)
        _apply_both(x, lambda a: fn(a, y.k), lambda a: fn(a, y.t))
        _apply_both(x, lambda a: fn(a, 3), lambda a: fn(a, 3))


@pytest.mark.parametrize(
    "case",
    [
        ("int64 += 1.5", kiln.int64, lambda a, L: a.add_(1.5)),
        ("int64 /= 2", kiln.int64, lambda a, L: a.div_(2)),
        ("int64 /= int tensor", kiln.int64, lambda a, L: a.__itruediv__(L.tensor([2, 2, 2, 2]))),
        ("int32 *= float tensor", kiln.int32, lambda a, L: a.mul_(L.tensor([1.5, 1.0, 1.0, 1.0]))),
        ("uint8 -= 0.5", kiln.uint8, lambda a, L: a.sub_(0.5)),
        ("bool += 1", kiln.bool, lambda a, L: a.add_(1)),
        ("bool += True", kiln.bool, lambda a, L: a.add_(True)),
        ("int64 exp_", kiln.int64, lambda a, L: a.exp_()),
        ("int64 pow_(0.5)", kiln.int64, lambda a, L: a.pow_(0.5)),
        ("int64 pow_(2)", kiln.int64, lambda a, L: a.pow_(2)),
        ("int8 += int64 tensor", kiln.int8, lambda a, L: a.add_(L.tensor([1, 2, 3, 4]))),
        (
            "float16 += float64 tensor",
            kiln.float16,
            lambda a, L: a.add_(L.tensor([0.1, 0.2, 0.3, 0.4], dtype=L.float64)),
        ),
        ("float32 += int tensor", kiln.float32, lambda a, L: a.add_(L.tensor([1, 2, 3, 4]))),
        ("int64 div_ floor", kiln.int64, lambda a, L: a.div_(2, rounding_mode="floor")),
        ("int64 relu_", kiln.int64, lambda a, L: a.relu_()),
        ("int64 neg_", kiln.int64, lambda a, L: a.neg_()),
        ("bool neg_", kiln.bool, lambda a, L: a.neg_()),
    ],
    ids=lambda c: c[0],
)
def test_inplace_dtype_rules(case):
    """In-place results must be castable to self's dtype (torch's can_cast), else torch's error."""
    _, dtype, fn = case
    x = U.make_pair((3, 4), dtype, seed=7, low=1, high=5)
    try:
        fn(x.t, torch)
    except RuntimeError:
        U.assert_same_error(
            lambda: fn(x.k, kiln), lambda: fn(U.make_pair((3, 4), dtype, seed=7, low=1, high=5).t, torch)
        )
        assert x.k._version == 0, "a refused in-place op must not bump the version"
        return
    fn(x.k, kiln)
    U.assert_close(x.k, x.t)


@pytest.mark.parametrize(
    "sa,sb",
    [((3, 1), (1, 4)), ((3, 1), (4,)), ((4,), (3, 4)), ((), (2,))],
)
def test_inplace_broadcast_error(sa, sb):
    """The result of an in-place op must keep self's shape."""
    for fn in (lambda a, b: a.add_(b), lambda a, b: a.mul_(b), lambda a, b: a.__iadd__(b), lambda a, b: a.copy_(b)):
        U.assert_same_error(lambda: fn(kiln.ones(sa), kiln.ones(sb)), lambda: fn(torch.ones(sa), torch.ones(sb)))


def test_inplace_on_expanded_tensor_errors():
    """Writing into a tensor whose elements overlap (stride 0) is refused, like torch; filling is allowed."""
    for fn in (lambda a: a.add_(1), lambda a: a.mul_(2), lambda a: a.copy_(a.clone())):
        U.assert_same_error(lambda: fn(kiln.ones(3, 1).expand(3, 4)), lambda: fn(torch.ones(3, 1).expand(3, 4)))
    k, t = kiln.ones(3, 1), torch.ones(3, 1)
    k.expand(3, 4).zero_()
    t.expand(3, 4).zero_()
    U.assert_close(k, t)


def test_inplace_on_empty_tensor_with_zero_strides():
    """An empty tensor has no overlapping elements, whatever its strides (NumPy's empty arrays have 0)."""
    k = kiln.from_numpy(np.zeros((0, 3), np.float32))
    assert 0 in k.stride()
    assert k.add_(1.0).shape == (0, 3)
    assert k.mul_(kiln.ones(3)).copy_(kiln.zeros(0, 3)).shape == (0, 3)


# ---------------------------------------------------------------------------------------- copy_


@pytest.mark.parametrize("src_dtype", U.ALL_DTYPES, ids=U.dtype_id)
@pytest.mark.parametrize("dst_dtype", U.ALL_DTYPES, ids=U.dtype_id)
def test_copy_casts_between_all_dtypes(src_dtype, dst_dtype):
    # values representable everywhere without undefined behaviour (no negative floats into uint8)
    vals = np.array([[0, 1, 2, 3], [5, 7, 100, 0]], dtype=np.float64)
    if src_dtype.is_floating_point:
        vals = vals + np.array([[0.0, 0.25, 0.5, 0.75], [0.5, 0.1, 0.9, 0.0]])
    src = U.make_pair((2, 4), src_dtype, values=vals if src_dtype is not kiln.bool else vals > 1)
    dst = U.make_pair((2, 4), dst_dtype, layout="transposed", seed=8)
    _apply_both(dst, lambda a: a.copy_(src.k), lambda a: a.copy_(src.t))


@pytest.mark.parametrize("src_layout", U.LAYOUTS)
@pytest.mark.parametrize("dst_layout", ["contiguous", "transposed", "strided"])
@pytest.mark.parametrize("src_shape", [(3, 4), (4,), (1, 4), (3, 1), ()])
def test_copy_broadcast_and_layouts(src_layout, dst_layout, src_shape):
    dst = U.make_pair((3, 4), kiln.float32, layout=dst_layout, seed=9)
    src = U.make_pair(src_shape, kiln.float64, layout=src_layout, seed=10)
    _apply_both(dst, lambda a: a.copy_(src.k), lambda a: a.copy_(src.t))


def test_copy_from_overlapping_view_of_self():
    k, t = U.both(np.arange(12.0).reshape(3, 4))
    k[1:].copy_(k[:2].clone())
    t[1:].copy_(t[:2].clone())
    U.assert_close(k, t)
    k.t().copy_(k.clone().t())
    t.t().copy_(t.clone().t())
    U.assert_close(k, t)


# ---------------------------------------------------------------------------------------- autograd through in-place


def _scenarios():
    def a(L, x, z, s):
        y = x.clone()
        y[0] = 5
        y[1:].mul_(2)
        return y

    def b(L, x, z, s):
        y = x * 1
        y[:, 0].add_(z)
        return y * x

    def c(L, x, z, s):
        y = x.clone()
        v = y.t()
        v.mul_(z.unsqueeze(1))
        return y**2

    def d(L, x, z, s):
        y = x.clone()
        v = y[1]  # view taken before the base is written in place
        y.mul_(2)
        return v

    def e(L, x, z, s):
        y = x * 2
        y.exp_()
        return y

    def f(L, x, z, s):
        y = x.clone()
        y += z
        y -= 2 * z
        y *= z
        y /= z.abs() + 1
        return y

    def g(L, x, z, s):
        y = x.clone().abs()
        y.pow_(2)
        y.pow_(z.abs())
        return y

    def h(L, x, z, s):
        y = x.clone()
        y[0].zero_()
        y[1].fill_(s)
        return y * y

    def i(L, x, z, s):
        y = x.clone()
        y.neg_()
        y.relu_()
        return y

    def j(L, x, z, s):
        y = x.clone()
        y[:, 1:3].copy_(z[:2].to(L.float64))
        return y.sin()

    def k(L, x, z, s):
        y = x.clone()
        y[1:][:, ::2].add_(z[::2])
        return y

    def m(L, x, z, s):
        y = x.clone()
        v = y[:, 0]
        v.mul_(3)
        return y.sum(1) + v

    def n(L, x, z, s):
        y = L.zeros(3, 4, dtype=x.dtype)
        y[0] = z
        y[1:].add_(x[1:] * s)
        return y

    def o(L, x, z, s):
        y = x.clone()
        y.div_(z.abs() + 1, rounding_mode="trunc")
        return y + x

    def p(L, x, z, s):
        y = x.clone()
        y.t()[1].copy_(z[:3])
        y.view(-1)[::5].mul_(s)
        return y.exp()

    def r(L, x, z, s):
        y = x.clone()
        y[0, 0] = s
        y[2, 3] = s * 2
        return y

    return {f.__name__: f for f in (a, b, c, d, e, f, g, h, i, j, k, m, n, o, p, r)}


SCENARIOS = _scenarios()


@pytest.mark.parametrize("name", list(SCENARIOS))
@pytest.mark.parametrize("dtype", U.FLOAT_DTYPES, ids=U.dtype_id)
def test_autograd_through_inplace_on_non_leaf(name, dtype):
    """Gradients for x, z and s after in-place writes into (views of) non-leaf tensors equal torch's.

    a: ``y = x.clone(); y[0] = 5; y[1:].mul_(2)``; b: ``y = x*1; y[:, 0].add_(z)``; c: in-place on a
    transposed view; d: a view taken *before* the base is modified in place; e: exp_ on a non-leaf;
    f: +=, -=, *=, /= with a requires-grad operand; g: pow_; h: zero_/fill_(0-d tensor); i: neg_/relu_;
    j: copy_ with a dtype cast; k: view of a view; m: a written view used together with its base;
    n: writing grad-requiring values into a tensor that did not require grad; o: div_ with rounding;
    p: copy_ into a transposed row and mul_ on a strided flat view; r: scalar __setitem__ of a 0-d tensor.
    """
    fn = SCENARIOS[name]
    x = U.make_pair((3, 4), dtype, seed=11, requires_grad=True)
    z = U.make_pair((4,), dtype, seed=12, requires_grad=True)
    s = U.make_pair((), dtype, seed=13, requires_grad=True)
    U.check_op(fn, x, z, s)


def test_inplace_on_leaf_requiring_grad_errors():
    msgs = []
    for fn in (
        lambda a: a.add_(1),
        lambda a: a.mul_(2),
        lambda a: a.zero_(),
        lambda a: a.fill_(1.0),
        lambda a: a.__iadd__(1),
        lambda a: a.copy_(a.detach() * 2),
        lambda a: a.__setitem__(0, 1.0),
        lambda a: a.exp_(),
    ):
        info = U.assert_same_error(
            lambda: fn(kiln.ones(3, requires_grad=True)), lambda: fn(torch.ones(3, requires_grad=True))
        )
        msgs.append(str(info.value))
    assert all("a leaf Variable that requires grad is being used in an in-place operation." in m for m in msgs)


def test_inplace_on_view_of_leaf_requiring_grad_errors():
    for fn in (lambda a: a[0].add_(1), lambda a: a.t().mul_(2), lambda a: a.view(-1).zero_()):
        U.assert_same_error(
            lambda: fn(kiln.ones(2, 3, requires_grad=True)), lambda: fn(torch.ones(2, 3, requires_grad=True))
        )


def test_inplace_on_leaf_allowed_under_no_grad():
    k, t = U.both(np.arange(6.0).reshape(2, 3), requires_grad=True)
    with torch.no_grad():
        t.mul_(2)
        t[0].add_(1)
    with kiln.no_grad():
        k.mul_(2)
        k[0].add_(1)
    U.assert_close(k, t)
    assert k.requires_grad and k.is_leaf and k.grad_fn is None
    assert k._version == t._version
    (k * k).sum().backward()
    (t * t).sum().backward()
    U.assert_close(k.grad, t.grad)


# ---------------------------------------------------------------------------------------- in-place kernels

# the write, on a fresh 4x6 tensor of 0..23 in each library (PyTorch's result where the operand reads the
# written memory in other places and either is not dense depends on its loop order: no such case here)
_OVERLAPS = {
    "shifted rows": lambda x: x[1:].add_(x[:-1]),
    "shifted copy": lambda x: x[1:].copy_(x[:-1]),
    "own row broadcast": lambda x: x.mul_(x[0]),
    "neighbouring blocks (not dense)": lambda x: x.view(2, 12)[:, :4].sub_(x.view(2, 12)[:, 4:8]),
    "own transpose": lambda x: x.view(24)[:16].view(4, 4).add_(x.view(24)[:16].view(4, 4).t()),
    "lerp toward own shift": lambda x: x.view(24)[1:].lerp_(x.view(24)[:-1], 0.5),
    "addcmul with own shift": lambda x: x.view(24)[2:].addcmul_(x.view(24)[:-2], x.view(24)[1:-1]),
    "self": lambda x: x.add_(x),
    "self alpha": lambda x: x.sub_(x, alpha=0.5),
    "self as every operand": lambda x: x.addcdiv_(x, x + 1, value=2),
    "same memory, same layout": lambda x: x.mul_(x.view(24).view(4, 6)),
    "copy of itself": lambda x: x.copy_(x[:]),
    "interleaved (not dense)": lambda x: x[:, ::2].add_(x[:, 1::2]),
    "add_ an element of itself": lambda x: x.add_(x[0, 1]),
    "clamp_ to its own elements": lambda x: x.clamp_(x[0, 1], x[3, 3]),
    "masked_fill_ with an element of itself": lambda x: x.masked_fill_(x > 5, x[0, 1]),
    "index_fill_ with an element of itself": lambda x: x.index_fill_(0, torch_or_kiln(x).tensor([2]), x[3, 3]),
    "x[mask] = an element of x": lambda x: _set(x, x > 5, x[0, 1]),
    "index_copy_ from its own rows": lambda x: x.index_copy_(0, torch_or_kiln(x).tensor([1, 0]), x[:2]),
    "index_copy_ from itself": lambda x: x.index_copy_(0, torch_or_kiln(x).tensor([0, 1, 2, 3]), x),
    "index_add_ from its own rows": lambda x: x.index_add_(0, torch_or_kiln(x).tensor([1, 0]), x[:2]),
    "x[idx] = its own rows": lambda x: _set(x, torch_or_kiln(x).tensor([1, 2]), x[0:2]),
    "x[idx] = itself": lambda x: _set(x, torch_or_kiln(x).tensor([0, 1, 2, 3]), x),
    "x[idx] = a row of x elsewhere": lambda x: _set(x, torch_or_kiln(x).tensor([1]), x[0]),
    "x[idx] = an element of x": lambda x: _set(x, torch_or_kiln(x).tensor([1]), x[0, 0]),
    "scatter_ from itself": lambda x: x.scatter_(0, torch_or_kiln(x).zeros(4, 6, dtype=torch_or_kiln(x).int64), x),
    "scatter_add_ from its own row": lambda x: x.scatter_add_(
        0, torch_or_kiln(x).zeros(1, 6, dtype=torch_or_kiln(x).int64), x[1:2]
    ),
    "masked_fill_ by its own shifted mask": lambda x: (lambda b: b[1:].masked_fill_(b[:-1], True))(x > 5),
    "disjoint index_copy_": lambda x: x[2:].index_copy_(0, torch_or_kiln(x).tensor([0]), x[:1]),
    "disjoint halves": lambda x: x[:2].add_(x[2:]),
    "reversed rows (a copy)": lambda x: x.add_(x.flip(0)),
}


def torch_or_kiln(x):
    return torch if isinstance(x, torch.Tensor) else kiln


@pytest.mark.parametrize("case", list(_OVERLAPS))
def test_inplace_reading_its_own_memory_matches_torch(case):
    """An in-place op whose operand shares memory with ``self``: PyTorch's error where the operand reads
    the written memory in other places (both dense: a partial overlap), PyTorch's values otherwise."""
    fn = _OVERLAPS[case]
    k, t = U.both(np.arange(24.0).reshape(4, 6))
    try:
        fn(t)
    except RuntimeError:
        U.assert_same_error(lambda: fn(k), lambda: fn(torch.arange(24.0).reshape(4, 6)), exact=True)
        U.assert_close(k, t)  # nothing written
        return
    assert fn(k) is not None
    U.assert_close(k, t)
    assert k._version == t._version


@pytest.mark.parametrize("shape", [(5, 7), (48, 50)], ids=["small", "large"])
@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64, kiln.bfloat16], ids=U.dtype_id)
def test_inplace_writes_into_self_as_torch(shape, dtype):
    """In-place ops with nothing to record write into ``self``'s own memory (large tensors: kiln-cpu's
    in-place loops where it is installed; small ones: NumPy's ufuncs or out of place), as PyTorch does."""
    cases = {
        "add_": lambda a, b, L: a.add_(b),
        "add_ alpha": lambda a, b, L: a.add_(b, alpha=-0.25),
        "sub_ row": lambda a, b, L: a.sub_(b[0]),
        "mul_ scalar": lambda a, b, L: a.mul_(0.9),
        "div_": lambda a, b, L: a.div_(b.abs() + 1),
        "addcmul_": lambda a, b, L: a.addcmul_(b, b, value=0.5),
        "addcdiv_": lambda a, b, L: a.addcdiv_(b, b.abs() + 1, value=-2),
        "lerp_": lambda a, b, L: a.lerp_(b, 0.25),
        "clamp_": lambda a, b, L: a.clamp_(-0.5, 0.75),
        "clamp_min_ tensor": lambda a, b, L: a.clamp_min_(b),
        "exp_": lambda a, b, L: a.exp_(),
        "sigmoid_": lambda a, b, L: a.sigmoid_(),
        "relu_": lambda a, b, L: a.relu_(),
        "neg_": lambda a, b, L: a.neg_(),
        "sqrt_": lambda a, b, L: a.abs_().sqrt_(),
    }
    for layout in ("contiguous", "transposed", "strided"):
        for name, fn in cases.items():
            x = U.make_pair(shape, dtype, layout=layout, seed=7)
            y = U.make_pair(shape, dtype, seed=8)
            ptr = x.k.data_ptr()
            _apply_both(x, lambda a: fn(a, y.k, kiln), lambda a: fn(a, y.t, torch))
            assert x.k.data_ptr() == ptr, f"{name} ({layout}) moved self"


_INDEX_WRITES = {
    "index_add_": lambda x, L: x.index_add_(0, L.tensor([4, 0, 4, 2]), L.ones(4, 6, dtype=x.dtype)),
    "index_add_ alpha": lambda x, L: x.index_add_(1, L.tensor([5, 1]), L.full((5, 2), 2, dtype=x.dtype), alpha=3),
    "index_copy_": lambda x, L: x.index_copy_(0, L.tensor([3, 1]), L.zeros(2, 6, dtype=x.dtype)),
    "index_fill_": lambda x, L: x.index_fill_(1, L.tensor([0, 5, -1]), 7),
    "index_put_": lambda x, L: x.index_put_((L.tensor([0, 4]), L.tensor([1, 2])), L.tensor(9, dtype=x.dtype)),
    "index_put_ accumulate": lambda x, L: x.index_put_((L.tensor([1, 1, 3]),), L.ones(6, dtype=x.dtype), True),
    "x[idx] = v": lambda x, L: _set(x, L.tensor([4, 2]), L.full((2, 6), 5, dtype=x.dtype)),
    "x[:, idx] = number": lambda x, L: _set(x, (slice(None), L.tensor([0, 3])), 8),
    "x[mask] = v": lambda x, L: _set(x, x > 10, L.tensor(0, dtype=x.dtype)),
    "scatter_": lambda x, L: x.scatter_(1, L.tensor([[0, 5], [1, 4]]), L.full((2, 2), 6, dtype=x.dtype)),
    "scatter_ value": lambda x, L: x.scatter_(0, L.tensor([[4, 0, 2]]), 3),
    "scatter_add_": lambda x, L: x.scatter_add_(0, L.tensor([[1, 1], [4, 1]]), L.ones(2, 2, dtype=x.dtype)),
    "masked_fill_": lambda x, L: x.masked_fill_(x > 12, -1),
    "masked_fill_ 0-d": lambda x, L: x.masked_fill_(L.tensor([True, False, True, False, False, True]), L.tensor(4)),
}


def _set(x, key, value):
    x[key] = value
    return x


@pytest.mark.parametrize("case", list(_INDEX_WRITES))
@pytest.mark.parametrize("dtype", [kiln.float32, kiln.int64, kiln.bfloat16], ids=U.dtype_id)
def test_index_writes_in_place_as_torch(case, dtype):
    """Index writes with nothing to record write into ``self``'s memory, touching only the indexed elements
    (the reference's in-place kernels), with PyTorch's values, duplicates included."""
    fn = _INDEX_WRITES[case]
    for layout in ("contiguous", "transposed", "strided"):
        x = U.make_pair((5, 6), dtype, layout=layout, seed=3, low=0, high=20)
        ptr = x.k.data_ptr()
        _apply_both(x, lambda a: fn(a, kiln), lambda a: fn(a, torch))
        assert x.k.data_ptr() == ptr


def test_index_writes_run_the_in_place_kernels(monkeypatch):
    """Each index write with nothing to record goes to its op's in-place kernel on the CPU, which takes it."""
    import kiln.backend as kb

    ran = []
    for name in ("index_add", "index_copy", "index_fill", "index_put", "scatter", "scatter_add", "masked_fill"):
        record = kb.op(name)
        kernel = record.inplace_kernels["cpu"]

        def spy(spec, *args, _kernel=kernel, _name=name):
            done = _kernel(spec, *args)
            ran.append((_name, done is args[0]))
            return done

        monkeypatch.setitem(record.inplace_kernels, "cpu", spy)
    x = kiln.zeros(5, 6)
    for case in ("index_add_", "index_copy_", "index_fill_", "x[idx] = v", "scatter_", "scatter_add_", "masked_fill_"):
        _INDEX_WRITES[case](x, kiln)
    assert ran == [
        ("index_add", True),
        ("index_copy", True),
        ("index_fill", True),
        ("index_put", True),
        ("scatter", True),
        ("scatter_add", True),
        ("masked_fill", True),
    ]


@pytest.mark.parametrize(
    "write",
    [
        lambda x, L: x.index_add_(0, L.tensor([1, 5]), L.ones(2, 6)),
        lambda x, L: x.index_copy_(0, L.tensor([1, -1]), L.ones(2, 6)),
        lambda x, L: x.index_fill_(1, L.tensor([2, 6]), 1.0),
        lambda x, L: x.index_put_((L.tensor([0, 5]),), L.tensor(1.0), True),
        lambda x, L: x.scatter_(0, L.tensor([[0, 5]]), L.ones(1, 2)),
        lambda x, L: x.scatter_add_(1, L.tensor([[0, 6]]), L.ones(1, 2)),
    ],
    ids=["index_add_", "index_copy_", "index_fill_", "index_put_", "scatter_", "scatter_add_"],
)
def test_index_writes_out_of_range_write_nothing(write):
    """An index out of range: PyTorch's error type, and not one element written (PyTorch may have written
    the elements before the bad index)."""
    k, t = U.both(np.arange(30.0).reshape(5, 6), dtype=kiln.float32)
    err = U.torch_error(lambda: write(t, torch))
    with pytest.raises(type(err)):
        write(k, kiln)
    np.testing.assert_array_equal(k.numpy(), np.arange(30.0).reshape(5, 6))
    assert k._version == 0


def test_index_writes_from_self_give_the_out_of_place_values():
    """An index write whose source is a view of ``self`` that PyTorch lets through (not dense: it cannot
    tell) reads the source before writing, as the out-of-place op does."""
    idx, rows = kiln.tensor([0, 5]), kiln.tensor([0, 3])
    for write in (
        lambda x, out: kiln.index_copy(x, 1, idx, x[:, 1:5:3]) if out else x.index_copy_(1, idx, x[:, 1:5:3]),
        lambda x, out: kiln.index_add(x, 1, idx, x[:, 1:5:3]) if out else x.index_add_(1, idx, x[:, 1:5:3]),
        lambda x, out: kiln.index_put(x, (rows,), x[::2], True) if out else x.index_put_((rows,), x[::2], True),
    ):
        x = kiln.arange(24.0).reshape(4, 6)
        expected = write(x.clone(), True)
        write(x, False)
        np.testing.assert_array_equal(x.numpy(), expected.numpy())
    b = kiln.tensor([True, False, True])
    expected = kiln.masked_fill(b, b, False)
    b.masked_fill_(b, False)  # the mask is self: the same places, which PyTorch allows
    assert b.tolist() == expected.tolist() == [False, False, False]


@pytest.mark.parametrize("name", ["exp", "log", "sin", "cos", "tanh", "sigmoid", "erf", "sqrt", "neg", "relu"])
@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64, kiln.bfloat16], ids=U.dtype_id)
def test_inplace_gives_the_out_of_place_bits(name, dtype):
    """``x.exp_()`` is ``x.exp()`` written into ``x``, bit for bit, at every size (whichever kernels serve
    the sizes: NumPy's, or kiln-cpu's loops with their own polynomials)."""
    for n in (7, 2000, 70000):
        x = kiln.linspace(0.01, 3, n, dtype=dtype)
        expected = getattr(x, name)()
        y = x.clone()
        getattr(y, f"{name}_")()
        np.testing.assert_array_equal(y.float().numpy(), expected.float().numpy(), err_msg=f"{name}_ on {n}")


@pytest.mark.parametrize(
    "write",
    [
        lambda a, L: a.add_(1, alpha=None),
        lambda a, L: a.add_(1, alpha=[2.0]),
        lambda a, L: a.sub_(a, alpha="a"),
        lambda a, L: L.add(a, 1, alpha=None),
        lambda a, L: a.add_(a.t(), foo=1),
        lambda a, L: a.add_(),
    ],
    ids=[
        "alpha None",
        "alpha list",
        "alpha str",
        "out of place",
        "bad keyword",
        "missing argument",
    ],
)
def test_inplace_argument_errors_as_torch(write):
    """A wrong argument of an in-place op: PyTorch's TypeError, before anything else is checked (the
    operand here overlaps self too), at a size kiln-cpu's loops would take, and nothing written."""
    k, t = kiln.ones(50, 50), torch.ones(50, 50)
    err = U.torch_error(lambda: write(t, torch))
    with pytest.raises(type(err)):
        write(k, kiln)
    assert k._version == 0 and bool((k == 1).all())


def test_a_0d_tensor_alpha_is_a_number():
    for lib in (kiln, torch):
        assert lib.ones(3).add_(lib.ones(3), alpha=lib.tensor(2.0)).tolist() == [3.0] * 3
        assert lib.sub(lib.ones(3), 1, alpha=lib.tensor(2)).tolist() == [-1.0] * 3


def test_comparisons_in_place_follow_pytorchs_autograd_rules():
    """``eq_`` has PyTorch's zero formula: refused on a leaf that requires grad and on its views, and a
    tensor that needs no grad takes ``EqBackward1`` from an operand that does (``logical_and_``, with no
    formula, may write a leaf)."""
    for fn in (lambda a: a.eq_(1.0), lambda a: a[:].lt_(1.0)):
        U.assert_same_error(lambda: fn(kiln.ones(3, requires_grad=True)), lambda: fn(torch.ones(3, requires_grad=True)))
    got = []
    for lib in (kiln, torch):
        s = lib.ones(3, requires_grad=True)
        y = lib.zeros(3)
        y.eq_(s)
        leaf = lib.ones(3, requires_grad=True)
        leaf.logical_and_(lib.ones(3))
        y.sum().backward()
        got.append((y.grad_fn.name(), y.requires_grad, s.grad.tolist(), leaf.is_leaf, leaf.grad_fn))
    assert got[0] == got[1]


def test_inplace_checks_come_in_pytorchs_order():
    """A leaf that requires grad, written with an operand that overlaps it: PyTorch's leaf error first."""
    for fn in (lambda w: w.add_(w.t()), lambda w: w.copy_(w.t()), lambda w: w[1:].add_(w[:-1])):
        U.assert_same_error(
            lambda: fn(kiln.ones(3, 3, requires_grad=True)), lambda: fn(torch.ones(3, 3, requires_grad=True))
        )


def test_an_operand_that_requires_grad_given_by_keyword_is_recorded():
    got = []
    for lib in (kiln, torch):
        w = lib.ones(3, requires_grad=True)
        y, z = lib.zeros(3), lib.zeros(3)
        y.add_(other=w, alpha=2)
        z.clamp_(min=w)
        (y * z).sum().backward()
        got.append((y.grad_fn.name(), z.grad_fn.name(), w.grad.tolist()))
    assert got[0] == got[1]


def test_inplace_into_read_only_memory_raises_numpys_error():
    """A tensor over a read-only array (``from_numpy`` of one): NumPy's ValueError, whichever kernel runs."""
    for n in (10, 3000):
        a = np.ones(n, np.float32)
        a.flags.writeable = False
        with pytest.warns(UserWarning, match="not writable"):
            x = kiln.from_numpy(a)
        for write in (
            lambda t: t.exp_(),
            lambda t: t.add_(1, alpha=2),
            lambda t: t.clamp_(0, 0.5),
            lambda t: t.mul_(2),
            lambda t: t.add_(kiln.ones(n)),  # one ufunc writing into self: its own error, caught
            lambda t: t.mul_(t),
            lambda t: t.sub_(kiln.ones(n, dtype=kiln.float64)),
            lambda t: t.index_add_(0, kiln.tensor([0]), kiln.ones(1)),
            lambda t: t.index_put_((kiln.tensor([1]),), kiln.tensor(2.0), True),
            lambda t: t.scatter_add_(0, kiln.tensor([2]), kiln.ones(1)),
        ):
            with pytest.raises(ValueError, match="read-only"):
                write(x)
        assert (a == 1).all()


def test_inplace_update_of_a_parameter_under_no_grad_matches_torch():
    """A hand-written optimizer's step: ``p.add_(g, alpha=-lr)`` on leaves that require grad, in
    ``no_grad``, large enough for kiln-cpu's in-place loops; the history stays as it was."""
    rng = np.random.default_rng(0)
    w, g = rng.standard_normal((64, 40)).astype(np.float32), rng.standard_normal((64, 40)).astype(np.float32)
    pk, pt = U.both(w, requires_grad=True)
    for lib, p in ((kiln, pk), (torch, pt)):
        grad = lib.tensor(g)
        with lib.no_grad():
            p.add_(grad, alpha=-0.1)
            p.mul_(0.99).addcmul_(grad, grad, value=-0.01)
    U.assert_close(pk, pt)
    assert pk.is_leaf and pk.requires_grad and pk.grad_fn is None
    assert pk._version == pt._version


def test_a_tracer_sees_an_inplace_op_as_the_op_and_a_copy():
    """Under a dispatch mode the in-place kernels stand aside: a tracer sees the op and the write."""
    from kiln._modes import DispatchMode

    class Seen(DispatchMode):
        def __init__(self):
            self.ops = []

        def dispatch(self, op, args, redispatch):
            self.ops.append(op.name)
            return redispatch(op, args)

    x, y = kiln.ones(64, 40), kiln.ones(64, 40)
    with Seen() as seen:
        x.add_(y, alpha=2)
        x.exp_()
    assert seen.ops == ["add", "_copy_from", "exp", "_copy_from"]
    assert x[0, 0].item() == pytest.approx(np.exp(3.0))


@pytest.mark.parametrize("src_dtype", ["float32", "float64"])
def test_setitem_loop_through_views_matches_torch(src_dtype):
    """``s[i] = y`` in a loop (a recurrent layer writing its outputs into a buffer): the view autograd
    re-derives after each write (made without the dispatcher, see ``recorded_view``) carries PyTorch's node
    names and gradients, for a source of the buffer's dtype (no conversion: a fresh view node) and of
    another one."""
    kx, tx = U.both(np.arange(12.0).reshape(4, 3) / 7, dtype=getattr(kiln, src_dtype), requires_grad=True)
    kw, tw = U.both(np.linspace(-1, 1, 12).reshape(4, 3), dtype=kiln.float32, requires_grad=True)
    results = []
    for x, w in ((kx, kw), (tx, tw)):
        s = w * 1
        for i in range(4):
            s[i] = x[i] * (i + 1)
        v = s[2]
        v.copy_(x[0])
        (s * s).sum().backward()
        results.append((type(v.grad_fn).__name__, s.grad_fn.name().split("::")[-1], x.grad, w.grad))
    (kv, ks, kxg, kwg), (tv, ts, txg, twg) = results
    assert (kv, ks) == (tv, ts) == ("AsStridedBackward0", "CopySlices")
    U.assert_close(kxg, txg)
    U.assert_close(kwg, twg)


def test_a_view_takes_its_bases_new_history_when_read():
    """A view whose base was written in place afterwards reads as an ``AsStridedBackward0`` view of the base's
    new history (PyTorch re-derives it when ``grad_fn`` is read or the view is used), and its gradient flows
    through the write."""
    kl, tl = U.both(np.arange(6.0).reshape(3, 2) / 5, dtype=kiln.float64, requires_grad=True)
    names, grads = [], []
    for leaf in (kl, tl):
        x = leaf.clone()
        v = x[0]
        before = type(v.grad_fn).__name__
        x.mul_(2)
        names.append((before, type(v.grad_fn).__name__, v.requires_grad, v.is_leaf))
        (v * 3).sum().backward()
        grads.append(leaf.grad)
    assert names[0] == names[1] == ("SelectBackward0", "AsStridedBackward0", True, False)
    U.assert_close(grads[0], grads[1])


def test_a_view_written_twice_takes_each_history():
    """``w = s[1]; w.copy_(y); w.mul_(y)``: the second write reads the view's history left by the first (made
    when the write reads it, not at the first write), and both reach ``y``'s gradient as in PyTorch."""
    ky, ty = U.both(np.array([0.5, -2.0]), dtype=kiln.float32, requires_grad=True)
    results = []
    for lib, y in ((kiln, ky), (torch, ty)):
        s = lib.zeros(4, 2)
        w = s[1]
        w.copy_(y)
        w.mul_(y)
        (s * s).sum().backward(retain_graph=True)
        (w * 3).sum().backward()
        results.append((type(w.grad_fn).__name__, s.grad_fn.name().split("::")[-1], w._version, y.grad))
    assert results[0][:3] == results[1][:3] == ("AsStridedBackward0", "CopySlices", 2)
    U.assert_close(results[0][3], results[1][3])


def test_retain_grad_on_a_view_follows_its_history_across_a_base_write():
    """``retain_grad`` on a view keeps the gradient of the history the view had when a use recorded it (a
    write to the base after that use changes nothing for it), and moves to the view's new history once the
    view is used after the write, as in PyTorch; a base that is itself a view keeps its ``.grad`` too."""
    results = []
    for lib in (kiln, torch):
        a = lib.tensor(np.arange(1.0, 7.0), requires_grad=True)
        x = (a * 1).reshape(2, 3) * 1
        v = x[0]
        v.retain_grad()
        y = v.sum() * 3
        x[1].mul_(2)  # after v's use: v.grad is the gradient of that use
        y.backward()
        used_before = v.grad.clone()
        x = (a * 1).reshape(2, 3) * 1
        v = x[0]
        v.retain_grad()
        x.mul_(2)
        (v * v).sum().backward()  # used after the write: v.grad is the gradient of the new history
        used_after = v.grad.clone()
        x = (a * 1).reshape(2, 3)
        x.retain_grad()
        x[1].mul_(3)
        (x * x).sum().backward()
        results.append((used_before, used_after, x.grad))
    for k, t in zip(results[0], results[1]):
        U.assert_close(k, t)


@pytest.mark.parametrize("name", ["exp_", "sigmoid_", "tanh_", "relu_"])
@pytest.mark.parametrize("kept", [True, False])
def test_double_backward_through_an_inplace_op_on_a_view(name, kept):
    """An op that saves its result, in place on a view (kept in a variable or a temporary): a second-order
    gradient reaches the op's node both through the base's ``CopySlices`` and through the saved result, so
    ``CopySlices`` lets go of the node without freeing what it saved (it raised "backward through the graph a
    second time"), as PyTorch's does."""
    results = []
    for lib in (kiln, torch):
        a = lib.tensor([1.0, 2.0, 3.0, 4.0], dtype=lib.float64, requires_grad=True)
        x = a * 1.5
        v = x[:2]
        getattr(v if kept else x[:2], name)()
        (g,) = lib.autograd.grad((x * x).sum(), a, create_graph=True)
        results.append((g, lib.autograd.grad(g.sum(), a)[0]))
    for k, t in zip(results[0], results[1]):
        U.assert_close(k, t)
    x = kiln.ones(4, requires_grad=True) * 2
    x[:2].exp_()
    x.sum().backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        x.sum().backward()


def test_retain_grad_on_a_view_written_in_place_counts_once():
    """``v.retain_grad(); v.exp_()``: the write re-derives the view's history and moves its hook there once
    (it was registered twice, and ``v.grad`` doubled)."""
    grads = []
    for lib in (kiln, torch):
        a = lib.tensor([1.0, 2.0, 3.0, 4.0], dtype=lib.float64, requires_grad=True)
        x = a * 1
        v = x[1:3]
        v.retain_grad()
        v.exp_()
        y = (v * 1).sum()
        y.backward(retain_graph=True)
        first = v.grad.clone()
        y.backward()
        grads.append((first, v.grad))
    for k, t in zip(grads[0], grads[1]):
        U.assert_close(k, t)


def test_second_order_through_an_inplace_op_on_a_view_goes_through_copyslices():
    """The saved result of an in-place op on a view takes the view's history (through the base's
    ``CopySlices``), as PyTorch saves it: intermediates that retain grad get their second-order gradients,
    and once the first-order graph is freed a second-order backward raises, as in PyTorch."""
    results = []
    for lib in (kiln, torch):
        a = lib.tensor([1.0, 2.0, 3.0, 4.0], dtype=lib.float64, requires_grad=True)
        x = a * 1
        x.retain_grad()
        v = x[1:3]
        v.retain_grad()
        v.exp_()
        (g,) = lib.autograd.grad((x * x).sum(), a, create_graph=True)
        (g * g).sum().backward()
        results.append((x.grad, v.grad, a.grad))
        x = a.clone()
        v = x[1:3]
        v.exp_()
        loss = (x * x).sum()
        (g,) = lib.autograd.grad(loss, a, create_graph=True)
        loss.backward()  # frees the first-order graph
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            (g * g).sum().backward()
    for k, t in zip(results[0], results[1]):
        U.assert_close(k, t)


@pytest.mark.parametrize(
    ("dst_shape", "src_shape", "src_dtype", "dst_history"),
    [
        ((3,), (3,), "float32", False),
        ((3,), (3,), "float32", True),
        ((2, 3), (1,), "float64", False),
        ((2, 3), (3,), "float32", True),
        ((2, 3), (2, 1), "float64", True),
    ],
)
def test_copy_gives_pytorchs_copybackwards(dst_shape, src_shape, src_dtype, dst_history):
    """``a.copy_(y)``: ``a`` takes a ``CopyBackwards`` node with PyTorch's two edges; ``y`` gets the gradient
    summed over the broadcast dims in its own dtype, and ``a``'s old history gets zeros (not None)."""
    got = []
    for lib in (kiln, torch):
        x = lib.full(dst_shape, 0.5, requires_grad=True)
        y = lib.linspace(-1, 1, int(np.prod(src_shape)), dtype=getattr(lib, src_dtype)).reshape(src_shape)
        y.requires_grad_()
        a = x * 2 if dst_history else lib.zeros(dst_shape)
        a.copy_(y)
        (a * a).sum().backward()
        edges = [None if n is None else type(n).__name__ for n, _ in a.grad_fn.next_functions]
        got.append((a.grad_fn.name().split("::")[-1], edges, x.grad, y.grad))
    (kname, kedges, kxg, kyg), (tname, tedges, txg, tyg) = got
    assert kname == tname == "CopyBackwards"
    assert kedges == tedges
    assert (kxg is None) == (txg is None)
    if txg is not None:
        U.assert_close(kxg, txg)
    assert kyg.dtype == getattr(kiln, src_dtype)
    U.assert_close(kyg, tyg)


# writes whose values do not depend on the old ones: PyTorch names each node after its op
_REPLACING_WRITES = {
    "fill_": lambda y, L: y.fill_(1),
    "fill_ 0-d": lambda y, L: y.fill_(L.tensor(2.0)),
    "fill_ 0-d that requires grad": lambda y, L: y.fill_(L.tensor(2.0, requires_grad=True)),
    "zero_": lambda y, L: y.zero_(),
    "copy_": lambda y, L: y.copy_(L.zeros(3)),
    "t[i] = number": lambda y, L: y.__setitem__(0, 5.0),
    "view fill_": lambda y, L: y[1:].fill_(2),
    "view zero_": lambda y, L: y[1:].zero_(),
    "view copy_": lambda y, L: y[1:].copy_(L.zeros(2)),
    "eq_ number": lambda y, L: y.eq_(2.0),
    "eq_ tensor": lambda y, L: y.eq_(L.ones(3)),
    "eq_ tensor that requires grad": lambda y, L: y.eq_(L.ones(3, requires_grad=True)),
    "view eq_": lambda y, L: y[1:].eq_(2.0),
    "view lt_ tensor": lambda y, L: y[:2].lt_(L.ones(2)),
    "lt_ tensor": lambda y, L: y.lt_(L.ones(3)),
    "uniform_": lambda y, L: y.uniform_(),
    "normal_": lambda y, L: y.normal_(),
    "view normal_": lambda y, L: y[1:].normal_(),
    "bernoulli_ float": lambda y, L: y.bernoulli_(0.5),
    "bernoulli_ tensor": lambda y, L: y.bernoulli_(L.full((3,), 0.5)),
    "exponential_": lambda y, L: y.exponential_(),
    "geometric_": lambda y, L: y.geometric_(0.5),
    "cauchy_": lambda y, L: y.cauchy_(),
    "log_normal_": lambda y, L: y.log_normal_(),
    "random_": lambda y, L: y.random_(),
    "random_(to)": lambda y, L: y.random_(5),
    "random_(from, to)": lambda y, L: y.random_(1, 5),
}


@pytest.mark.parametrize("case", list(_REPLACING_WRITES))
def test_replacing_writes_give_pytorchs_nodes(case):
    """The node a write that replaces a tensor's values gives it: PyTorch's name and edges, and zeros for
    the old history."""
    got = []
    for lib in (kiln, torch):
        x = lib.ones(3, requires_grad=True)
        y = x * 2
        _REPLACING_WRITES[case](y, lib)
        node = y.grad_fn
        edges = [None if n is None else n.name().split("::")[-1] for n, _ in node.next_functions]
        y.sum().backward()
        got.append((node.name().split("::")[-1], edges, x.grad.tolist()))
    assert got[0] == got[1]


@pytest.mark.parametrize("dtype", ["int8", "int64", "bool"])
def test_copy_into_an_integer_tensor_takes_no_history(dtype):
    """A gradient does not flow through a cast to an integer or bool destination (PyTorch: no grad_fn, and
    backward through it raises)."""
    for lib in (kiln, torch):
        x = lib.tensor([1.7, 2.2, -0.6], requires_grad=True)
        q = lib.empty(3, dtype=getattr(lib, dtype))
        q.copy_(x * 10)
        b = lib.zeros(2, 3, dtype=getattr(lib, dtype))
        b[0] = x
        assert not q.requires_grad and q.grad_fn is None
        assert not b.requires_grad and b.grad_fn is None and b.is_leaf
        with pytest.raises(RuntimeError, match="does not require grad"):
            (q.float() * 2).sum().backward()


def test_retain_grad_on_a_base_follows_writes_through_its_views():
    """``y.retain_grad()``, then in-place writes into views of ``y``: ``y.grad`` is the gradient of its
    latest values, as PyTorch's."""
    got = []
    for lib in (kiln, torch):
        x = lib.tensor([1.0, 2.0, 3.0], requires_grad=True)
        y = x * 2
        y.retain_grad()
        y[0].mul_(3)
        y[1:].add_(x[1:])
        (y * y).sum().backward()
        got.append((y.grad.tolist(), x.grad.tolist()))
    assert got[0] == got[1]


def test_inplace_makes_non_leaf_history_like_torch():
    """After ``y.add_(z)`` a plain tensor joins the graph: requires_grad, grad_fn class name, is_leaf."""
    ky, ty = kiln.zeros(3), torch.zeros(3)
    kz, tz = U.both(np.ones(3), dtype=kiln.float32, requires_grad=True)
    ky.add_(kz)
    ty.add_(tz)
    assert ky.requires_grad and not ky.is_leaf
    assert ky.grad_fn.name() == ty.grad_fn.name()
    kx, tx = U.both(np.ones((2, 3)), dtype=kiln.float32, requires_grad=True)
    ky, ty = kx.clone(), tx.clone()
    ky[0].mul_(2)
    ty[0].mul_(2)
    assert ky.grad_fn.name() == ty.grad_fn.name().replace("torch::", "kiln::")  # CopySlices


@pytest.mark.parametrize("grad_mode", [True, False])
def test_inplace_with_a_sparse_operand_matches_torch(grad_mode):
    # a dense tensor written with a sparse COO operand, in grad mode too (its recording test reads the operand)
    def run(L):
        dense = L.zeros(3)
        sparse = L.sparse_coo_tensor(L.tensor([[0, 2]]), L.tensor([1.0, 2.0]), (3,))
        with L.set_grad_enabled(grad_mode):
            dense.add_(sparse)
            dense.sub_(sparse, alpha=0.5)
        return dense

    U.assert_close(run(kiln), run(torch))
