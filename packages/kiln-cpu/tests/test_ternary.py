"""The ternary kernels (where, addcmul, addcdiv, lerp, clamp, clamp_min, clamp_max) against the reference
kernels: every dtype they serve, every layout (the flat loop, the strided loop, and the ones handed back),
Python numbers, special values (``make`` mixes NaN, inf, -0.0 and denormals in), bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from kiln_cpu_helpers import assert_same, make, reference

import kiln
from kiln_cpu import _opcodes

FLOAT = [kiln.float32, kiln.float64]
HALF = [kiln.float16, kiln.bfloat16]
INTS = [kiln.int32, kiln.int64]


def _layouts(dtype):
    """name -> ((x, y, z) for shape (6, 7), the loop expected: "flat", "strided" or None: the reference)."""
    m = lambda shape, seed: make(shape, dtype, seed)
    return {
        "contiguous": ((m((6, 7), 0), m((6, 7), 1), m((6, 7), 2)), "flat"),
        "transposed": ((m((7, 6), 0).t(), m((7, 6), 1).t(), m((7, 6), 2).t()), "flat"),
        "mixed": ((m((6, 7), 0), m((7, 6), 1).t(), m((6, 7), 2)), "strided"),
        "strided": ((m((6, 14), 0)[:, ::2], m((6, 7), 1), m((12, 7), 2)[::2]), "strided"),
        "broadcast": ((m((6, 7), 0), m((7,), 1), m((6, 1), 2)), "strided"),
        "expand": ((m((1, 7), 0).expand(6, 7), m((6, 7), 1), m((6, 7), 2)), "strided"),
        "0-d": ((m((), 0), m((), 1), m((), 2)), "flat"),
        "empty": ((m((0, 7), 0), m((0, 7), 1), m((0, 7), 2)), "flat"),
        "6-d": ((m((2,) * 6, 0).permute(5, 4, 3, 2, 1, 0), m((2,) * 6, 1), m((2,) * 6, 2)), None),
    }


LAYOUTS = list(_layouts(kiln.float32))


# name -> (function of three same-dtype tensors, dtypes served, op code); where's condition is z > 0 (in
# z's layout and shape), clamp_min's and clamp_max's bound y
OPS = {
    "where": (lambda x, y, z: kiln.where(z > 0, x, y), FLOAT + HALF + INTS, _opcodes.WHERE),
    "addcmul": (lambda x, y, z: kiln.addcmul(x, y, z, value=0.75), FLOAT + HALF, _opcodes.ADDCMUL),
    "addcdiv": (lambda x, y, z: kiln.addcdiv(x, y, z, value=-1.3), FLOAT + HALF, _opcodes.ADDCDIV),
    "lerp": (lambda x, y, z: kiln.lerp(x, y, z), FLOAT + HALF, _opcodes.LERP),
    "clamp": (lambda x, y, z: kiln.clamp(x, y, z), FLOAT + HALF + INTS, _opcodes.CLAMP),
    "clamp_min": (lambda x, y, z: kiln.clamp_min(x, y), FLOAT + HALF + INTS, _opcodes.CLAMP),
    "clamp_max": (lambda x, y, z: kiln.clamp_max(x, y), FLOAT + HALF + INTS, _opcodes.CLAMP),
}


def _half(dtype):
    return [1 if dtype is kiln.float16 else 2] if dtype in HALF else []


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("name", "dtype"), [(n, d) for n, op in OPS.items() for d in op[1]], ids=str)
def test_ternary_matches_reference(name, dtype, layout, spy):
    fn, _, code = OPS[name]
    operands, expected = _layouts(dtype)[layout]
    if name == "where" and layout == "empty":
        expected = None  # the comparison's empty result has other strides: the strided path runs no loop
    assert_same(fn(*operands), reference(fn, *operands))
    ran = [c for c in spy if c[0] == "ternary"]
    assert ran == ([] if expected is None else [("ternary", code, expected, *_half(dtype))])


# in-place forms: self is the first operand, so a layout whose first operand is expanded does not apply
INPLACE = {
    "addcmul": lambda x, y, z: x.addcmul_(y, z, value=0.75),
    "addcdiv": lambda x, y, z: x.addcdiv_(y, z, value=-1.3),
    "lerp": lambda x, y, z: x.lerp_(y, z),
    "clamp": lambda x, y, z: x.clamp_(y, z),
    "clamp_min": lambda x, y, z: x.clamp_min_(y),
}


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "mixed", "strided", "broadcast", "0-d"])
@pytest.mark.parametrize("dtype", [kiln.float32, kiln.bfloat16], ids=str)
@pytest.mark.parametrize("name", list(INPLACE))
def test_in_place_loops_match_out_of_place(name, dtype, layout, spy):
    """``x.addcmul_(y, z)`` writes, bit for bit, what ``addcmul(x, y, z)`` computes, into ``x``'s memory."""
    fn, _, code = OPS[name]
    operands, expected_layout = _layouts(dtype)[layout]
    expected = fn(*operands)
    x = operands[0]
    ptr = x.data_ptr()
    spy.clear()
    assert INPLACE[name](*operands) is x
    assert_same(x, expected, layout=False)
    assert x.data_ptr() == ptr
    in_place = {"flat": "flat_inplace", "strided": "strided"}[expected_layout]
    assert [c for c in spy if c[0] == "ternary"] == [("ternary", code, in_place, *_half(dtype))]


def test_in_place_numbers_and_a_shared_operand(spy):
    x, y = make((6, 7), kiln.float32, 0), make((6, 7), kiln.float32, 1)
    for method, fn in (
        (lambda t: t.lerp_(y, 0.3), lambda t: kiln.lerp(t, y, 0.3)),
        (lambda t: t.clamp_(-0.5, 0.5), lambda t: t.clamp(-0.5, 0.5)),
        (lambda t: t.addcmul_(t, t, value=0.5), lambda t: kiln.addcmul(t, t, t, value=0.5)),
    ):
        expected = reference(fn, x)
        method(x)
        assert_same(x, expected)
    assert [c[2] for c in spy if c[0] == "ternary"] == ["flat_inplace"] * 3


@pytest.mark.parametrize("dtype", FLOAT + HALF, ids=str)
def test_python_numbers_take_the_references_values(dtype, spy):
    """A number operand of ``where`` and ``clamp`` is rounded to the tensor's precision first, ``lerp``'s
    weight and ``addcmul``/``addcdiv``'s value are not: 0.1 differs in float16 and bfloat16, and the
    results are the reference's bit for bit either way."""
    x, y = make((6, 7), dtype, 0), make((6, 7), dtype, 1)
    cases = [
        lambda: kiln.where(x > 0, x, 0.1),
        lambda: kiln.where(x > 0, -0.1, y),
        lambda: kiln.where(x > 0, 0.1, -2),
        lambda: kiln.lerp(x, y, 0.1),
        lambda: kiln.lerp(x, y, 0.7),
        lambda: kiln.addcmul(x, x, y, value=0.1),
        lambda: kiln.addcdiv(x, x, y, value=3),
        lambda: x.clamp(-0.1, 0.1),
        lambda: x.clamp(min=0.1),
        lambda: x.clamp(max=-0.1),
        lambda: x.clamp(0.3, -0.3),  # crossed bounds: max wins, as in the reference
        lambda: x.clamp_min(1),
    ]
    for fn in cases:
        assert_same(fn(), reference(fn))
    assert [c[2] for c in spy if c[0] == "ternary"] == ["flat"] * len(cases)


@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_integer_where_and_clamp(dtype, spy):
    x = make((6, 7), dtype, 0)
    cond = kiln.from_numpy((np.arange(42) % 3 == 0).reshape(6, 7).astype(np.uint8))  # a uint8 condition
    cases = [
        lambda: kiln.where(cond, x, 7),
        lambda: kiln.where(x > 0, x, -x),
        lambda: x.clamp(-1000, 1000),
        lambda: x.clamp(min=5),
        lambda: x.clamp(max=-5),
    ]
    for fn in cases:
        assert_same(fn(), reference(fn))
    assert len([c for c in spy if c[0] == "ternary"]) == len(cases)


def test_operands_of_other_dtypes_go_to_the_reference(spy):
    """The reference casts operands of another dtype than the result (a float64 bound of a float32 input
    makes a float64 result; an integer input with a float bound promotes): not served."""
    x32, x64 = make((6, 7), kiln.float32, 0), make((6, 7), kiln.float64, 1)
    i32 = make((6, 7), kiln.int32, 2)
    cases = [
        lambda: kiln.where(x32 > 0, x32, x64),
        lambda: kiln.clamp(x32, x64, x64),
        lambda: i32.clamp(0.5, 2.5),
        lambda: kiln.lerp(x32, x32, kiln.tensor(0.5, dtype=kiln.float64)),
        lambda: kiln.where(i32 > 0, i32, 0.5),
    ]
    for fn in cases:
        assert_same(fn(), reference(fn))
    assert all(c[0] != "ternary" for c in spy)


def _views(dtype, seed):
    """Operands of shape (3, 4) in several layouts: contiguous, transposed, broadcast along either dim (an
    expanded view), a 1-d tensor broadcast, a strided view, 0-d."""
    return [
        make((3, 4), dtype, seed),
        make((4, 3), dtype, seed).t(),
        make((1, 4), dtype, seed).expand(3, 4),
        make((3, 1), dtype, seed).expand(3, 4),
        make((4,), dtype, seed),
        make((3, 8), dtype, seed)[:, ::2],
        make((), dtype, seed),
    ]


@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float16], ids=str)
def test_layout_follows_the_references_steps(dtype, spy):
    """Every combination of operand layouts: the result's layout is the one the reference's NumPy calls
    give step by step (an intermediate result brings its own layout to the next step; in half precision
    each operand is first copied to float32), and its values are the reference's, bit for bit."""
    xs, ys, zs = (_views(dtype, seed) for seed in range(3))
    fns = (
        lambda x, y, z: kiln.addcmul(x, y, z, value=0.5),
        lambda x, y, z: kiln.addcdiv(x, y, z),
        lambda x, y, z: kiln.lerp(x, y, z),
        lambda x, y, z: kiln.lerp(x, y, 0.3),
        lambda x, y, z: kiln.clamp(x, y, z),
        lambda x, y, z: kiln.clamp_max(x, z),
        lambda x, y, z: kiln.where(z > 0, x, y),
        lambda x, y, z: kiln.where(z > 0, x, 1.5),
    )
    count = 0
    for x in xs:
        for y in ys:
            for z in zs:
                for fn in fns:
                    assert_same(fn(x, y, z), reference(fn, x, y, z))
                    count += 1
    assert len([c for c in spy if c[0] == "ternary"]) == count


def test_results_keep_the_layout_of_dense_operands(spy):
    """Transposed operands give a transposed result (the flat loop over their memory), as NumPy and PyTorch
    lay it out."""
    x, y, z = (make((7, 6), kiln.float32, s).t() for s in range(3))
    for fn in (lambda: kiln.lerp(x, y, z), lambda: kiln.where(x > 0, y, 1.5), lambda: x.clamp(y, z)):
        got = fn()
        assert got.stride() == (1, 6)
        assert_same(got, reference(fn))


def test_gradients_through_the_kernels(spy):
    """Autograd through where, lerp, addcmul, addcdiv and clamp: the forward runs the loops, and the
    gradients (composed of kiln ops) equal the reference's."""
    rng = np.random.default_rng(0)

    def leaf(seed):
        return kiln.from_numpy(rng.standard_normal((8, 9)).astype(np.float64) + seed).requires_grad_()

    x, y, z = leaf(0), leaf(0.5), leaf(1)
    g = kiln.from_numpy(rng.standard_normal((8, 9)))

    def grads(x, y, z):
        out = (
            kiln.where(x > y, x, z) * 2
            + kiln.lerp(x, y, z)
            + kiln.addcmul(x, y, z, value=0.5)
            + kiln.addcdiv(x, y, z, value=0.25)
            + kiln.clamp(x, y, z)
        )
        return kiln.autograd.grad(out, (x, y, z), g)

    for got, want in zip(grads(x, y, z), reference(grads, x, y, z)):
        assert_same(got, want)
    assert {c[1] for c in spy if c[0] == "ternary"} >= {_opcodes.WHERE, _opcodes.LERP, _opcodes.ADDCMUL, _opcodes.CLAMP}


def test_gradcheck_in_float64():
    """Every differentiable ternary op passes gradcheck with the kernels running (clamp and where away from
    their switching points, where the derivative jumps)."""
    rng = np.random.default_rng(1)
    x = kiln.from_numpy(rng.uniform(-2, 2, (4, 5))).requires_grad_()
    y = kiln.from_numpy(rng.uniform(-2, 2, (4, 5))).requires_grad_()
    w = kiln.from_numpy(rng.uniform(0.1, 0.9, (4, 5))).requires_grad_()
    low, high = kiln.full((4, 5), -1.0, dtype=kiln.float64), kiln.full((4, 5), 1.0, dtype=kiln.float64)
    away = x.detach().abs().sub(1).abs().min().item()
    assert away > 1e-3  # no element of x at a bound
    for fn, inputs in (
        (lambda a, b, c: kiln.lerp(a, b, c), (x, y, w)),
        (lambda a, b, c: kiln.addcmul(a, b, c, value=0.3), (x, y, w)),
        (lambda a, b, c: kiln.addcdiv(a, b, c, value=0.3), (x, y, w)),
        (lambda a, b: kiln.where(a.detach() > 0, a, b), (x, y)),
        (lambda a: kiln.clamp(a, low, high), (x,)),
    ):
        assert kiln.autograd.gradcheck(fn, inputs)
