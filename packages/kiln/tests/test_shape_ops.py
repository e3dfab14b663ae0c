"""Shape ops of ``kiln._ops.shape`` against PyTorch: forward values and dtypes (type promotion in
``cat``/``stack``, integer and bool inputs) on random, non-contiguous, 0-d and empty inputs, backward,
views versus copies (aliasing), gradcheck and gradgradcheck, methods and aliases, error types and
messages."""

from __future__ import annotations

import kiln_testutil as U
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kiln

DTYPES = (kiln.float32, kiln.float64, kiln.int64, kiln.bool)

# name -> (fn(lib, x), shapes): ``x`` is one operand of each shape
UNARY = {
    "cat dim0": (lambda L, x: L.cat([x, x * 2], 0), [(3, 4), (0, 3), (2, 0, 3)]),
    "cat dim-1": (lambda L, x: L.cat((x, x, x), dim=-1), [(3, 4), (2, 0, 3), (4,)]),
    "concatenate": (lambda L, x: L.concatenate([x, x], 1), [(3, 4)]),
    "concat": (lambda L, x: L.concat([x, x], 0), [(2, 2, 3)]),
    "cat single": (lambda L, x: L.cat([x]), [(3, 4)]),
    "cat legacy empty": (lambda L, x: L.cat([L.zeros(0, dtype=x.dtype), x, L.zeros(0, dtype=x.dtype)], 1), [(3, 4)]),
    "stack dim0": (lambda L, x: L.stack([x, x + x]), [(3, 4), (), (0, 3)]),
    "stack dim-1": (lambda L, x: L.stack((x, x), -1), [(3, 4), ()]),
    "stack mid": (lambda L, x: L.stack([x, x, x], 1), [(3, 4), (2, 0)]),
    "split int": (lambda L, x: L.split(x, 2), [(5, 3), (4, 3), (0, 3)]),
    "split int dim": (lambda L, x: x.split(3, -1), [(2, 7), (3, 4)]),
    "split sizes": (lambda L, x: L.split(x, [1, 0, 3], dim=1), [(2, 4)]),
    "split zero": (lambda L, x: L.split(x, 0), [(0, 2)]),
    "chunk": (lambda L, x: L.chunk(x, 3), [(5, 2), (6, 2), (2, 2), (0, 2)]),
    "chunk dim": (lambda L, x: x.chunk(4, dim=-1), [(2, 6), (3, 5)]),
    "unbind": (lambda L, x: L.unbind(x), [(3, 4), (0, 2), (3,)]),
    "unbind dim": (lambda L, x: x.unbind(-1), [(3, 4), (2, 0)]),
    "unflatten": (lambda L, x: L.unflatten(x, 1, (2, 2)), [(3, 4), (0, 4)]),
    "unflatten infer": (lambda L, x: x.unflatten(-1, (-1, 3)), [(2, 6), (2, 3, 6)]),
    "movedim": (lambda L, x: L.movedim(x, 0, -1), [(2, 3, 4), (3,), ()]),
    "movedim seq": (lambda L, x: L.movedim(x, (0, 2), (1, 0)), [(2, 3, 4)]),
    "moveaxis": (lambda L, x: x.moveaxis(-1, 0), [(2, 3, 4), (0, 3)]),
    "flip": (lambda L, x: L.flip(x, (0,)), [(3, 4), (0, 2), (5,)]),
    "flip dims": (lambda L, x: x.flip(0, -1), [(3, 4), (2, 3, 4)]),
    "flip none": (lambda L, x: L.flip(x, ()), [(3, 4), ()]),
    "flip 0-d": (lambda L, x: L.flip(x, (0,)), [()]),
    "fliplr": (lambda L, x: L.fliplr(x), [(3, 4), (2, 3, 2)]),
    "flipud": (lambda L, x: x.flipud(), [(3, 4), (5,)]),
    "roll": (lambda L, x: L.roll(x, 1, 0), [(3, 4), (0, 2)]),
    "roll flat": (lambda L, x: L.roll(x, -3), [(3, 4), (), (0,)]),
    "roll multi": (lambda L, x: x.roll((2, -1), (1, 0)), [(3, 4), (2, 5, 3)]),
    "roll big": (lambda L, x: x.roll(7, -1), [(3, 4)]),
    "repeat": (lambda L, x: x.repeat(2, 3), [(3, 4), (), (0, 2)]),
    "repeat lead": (lambda L, x: x.repeat((2, 1, 2)), [(3, 4), (3,)]),
    "repeat zero": (lambda L, x: x.repeat(0, 2), [(3, 4)]),
    "tile": (lambda L, x: L.tile(x, (2,)), [(3, 4), (), (3,)]),
    "tile more": (lambda L, x: x.tile(2, 1, 3), [(3, 4)]),
    "diagonal": (lambda L, x: L.diagonal(x), [(3, 4), (4, 3), (0, 3), (2, 3, 4)]),
    "diagonal offset": (lambda L, x: x.diagonal(1), [(3, 4), (4, 3)]),
    "diagonal neg": (lambda L, x: L.diagonal(x, -2, 1, 0), [(3, 4), (4, 3)]),
    "diagonal far": (lambda L, x: L.diagonal(x, 7), [(3, 4)]),
    "diagonal dims": (lambda L, x: x.diagonal(offset=1, dim1=-1, dim2=0), [(3, 2, 4)]),
    "diag 1d": (lambda L, x: L.diag(x), [(3,), (0,)]),
    "diag 1d off": (lambda L, x: L.diag(x, 2), [(3,)]),
    "diag 1d neg": (lambda L, x: x.diag(-1), [(3,)]),
    "diag 2d": (lambda L, x: L.diag(x), [(3, 4), (4, 3)]),
    "diag 2d off": (lambda L, x: L.diag(x, -1), [(3, 4)]),
    "diag 2d far": (lambda L, x: L.diag(x, 5), [(3, 4)]),
    "tril": (lambda L, x: L.tril(x), [(3, 4), (2, 3, 3), (0, 3)]),
    "tril diag": (lambda L, x: x.tril(-1), [(3, 4), (4, 3)]),
    "tril far": (lambda L, x: L.tril(x, diagonal=9), [(3, 4)]),
    "triu": (lambda L, x: L.triu(x), [(3, 4), (2, 3, 3), (0, 3)]),
    "triu diag": (lambda L, x: x.triu(2), [(3, 4), (4, 3)]),
    "triu neg": (lambda L, x: L.triu(x, diagonal=-1), [(3, 4)]),
    "narrow_copy": (lambda L, x: L.narrow_copy(x, 1, 1, 2), [(3, 4)]),
    "narrow_copy method": (lambda L, x: x.narrow_copy(0, 1, 2), [(3, 4)]),
}

VIEWS = {"split", "chunk", "unbind", "unflatten", "movedim", "moveaxis", "diagonal"}


def _layouts(shape, *, writable: bool = False):
    if not shape:
        return ("contiguous",)
    return tuple(lay for lay in U.LAYOUTS if lay != "expanded") if writable else U.LAYOUTS


@pytest.mark.parametrize("name", UNARY)
def test_forward_backward(name):
    """Values, dtypes, shapes (and, for floats, gradients) agree with torch on every layout and dtype."""
    fn, shape_list = UNARY[name]
    bad = {}
    seed = 0
    for shape in shape_list:
        for dtype in DTYPES:
            for layout in _layouts(shape):
                seed += 1
                grad = dtype.is_floating_point
                p = U.make_pair(shape, dtype, layout=layout, seed=seed, requires_grad=grad)
                bad[f"{shape} {U.dtype_id(dtype)} {layout}"] = U.mismatch(fn, p, grad=grad, seed=seed)
    U.report(bad)


@pytest.mark.parametrize("name", sorted(n for n in UNARY if n.split()[0] in VIEWS))
def test_views_alias_like_torch(name):
    """split/chunk/unbind/unflatten/movedim/diagonal return views: a write through one reaches the base."""
    fn, shape_list = UNARY[name]
    for shape in shape_list:
        for layout in _layouts(shape, writable=True):
            p = U.make_pair(shape, kiln.float64, layout=layout, seed=3)
            k_out, t_out = fn(kiln, p.k), fn(torch, p.t)
            k_outs = k_out if isinstance(k_out, tuple) else (k_out,)
            t_outs = t_out if isinstance(t_out, tuple) else (t_out,)
            for ko, to in zip(k_outs, t_outs):
                assert ko._base is not None or ko.numel() == 0
                assert ko.stride() == to.stride(), f"{shape} {layout}: stride {ko.stride()} != {to.stride()}"
                assert ko.storage_offset() == to.storage_offset() or ko.numel() == 0
                ko.add_(1.0)
                to.add_(1.0)
            U.assert_close(p.k_leaf, p.t_leaf)


@pytest.mark.parametrize(
    "fn",
    [
        lambda L, x: L.cat([x]),
        lambda L, x: L.stack([x]),
        lambda L, x: L.flip(x, ()),
        lambda L, x: L.roll(x, 0),
        lambda L, x: x.repeat(1, 1),
        lambda L, x: L.tile(x, (1,)),
        lambda L, x: L.tril(x, 5),
        lambda L, x: L.triu(x, -5),
        lambda L, x: L.diag(x),
        lambda L, x: L.narrow_copy(x, 0, 0, 3),
        lambda L, x: L.fliplr(x),
    ],
)
def test_copies_do_not_alias(fn):
    """cat/stack/flip/roll/repeat/tile/tril/triu/diag/narrow_copy copy, even when nothing changes."""
    p = U.make_pair((3, 3), kiln.float32, seed=4)
    k_out, t_out = fn(kiln, p.k), fn(torch, p.t)
    k_out.add_(1.0)
    t_out.add_(1.0)
    U.assert_close(p.k, p.t)
    U.assert_close(k_out, t_out)
    assert k_out.is_contiguous() == t_out.is_contiguous()


def test_cat_type_promotion():
    """cat and stack promote to the common dtype of all inputs, as torch does."""
    dtypes = [kiln.bool, kiln.uint8, kiln.int8, kiln.int32, kiln.int64, kiln.float16, kiln.float32, kiln.float64]
    bad = {}
    for d1 in dtypes:
        for d2 in dtypes:
            a = U.make_pair((2, 3), d1, seed=1)
            b = U.make_pair((2, 3), d2, seed=2)
            bad[f"cat {d1} {d2}"] = U.mismatch(lambda L, x, y: L.cat([x, y], 1), a, b, grad=False)
            bad[f"stack {d1} {d2}"] = U.mismatch(lambda L, x, y: L.stack([x, y]), a, b, grad=False)
    # a skipped legacy empty tensor still takes part in promotion
    e = U.make_pair((0,), kiln.float64, seed=5)
    i = U.make_pair((2, 3), kiln.int32, seed=6)
    bad["legacy empty"] = U.mismatch(lambda L, x, y: L.cat([x, y], 1), e, i, grad=False)
    bad["all empty"] = U.mismatch(lambda L, x: L.cat([x, x], 1), e, grad=False)
    U.report(bad)


def test_cat_mixed_dtype_backward():
    """Gradients flowing into inputs of different dtypes are cast back to each input's dtype."""
    a = U.make_pair((2, 3), kiln.float32, seed=1, requires_grad=True)
    b = U.make_pair((2, 2), kiln.float64, layout="transposed", seed=2, requires_grad=True)
    U.check_op(lambda L, x, y: L.cat([x, y], 1), a, b)
    c = U.make_pair((2, 3), kiln.float32, seed=3, requires_grad=True)
    d = U.make_pair((0,), kiln.float32, seed=4, requires_grad=True)
    U.check_op(lambda L, x, y: L.cat([y, x, y]), c, d)
    e = U.make_pair((2, 3), kiln.float64, seed=5, requires_grad=True)
    f = U.make_pair((2, 3), kiln.float64, layout="strided", seed=6, requires_grad=True)
    U.check_op(lambda L, x, y: L.stack([x, y, x], 1), e, f)


def test_split_chunk_outputs_backward_partial():
    """Using only some outputs of a multi-view op gives zeros for the rest of the input."""
    p = U.make_pair((5, 4), kiln.float64, seed=9, requires_grad=True)
    U.check_op(lambda L, x: L.split(x, 2)[1] * 3, p)
    U.check_op(lambda L, x: L.unbind(x, 1)[2].exp(), p)
    U.check_op(lambda L, x: L.chunk(x, 2, 1)[0].sum() + L.diagonal(x).sum(), p)


def test_aliases():
    """Aliases are the same functions (as in torch, where they are aliases); ``concatenate`` is ``cat`` under
    NumPy's parameter name (``axis``)."""
    assert kiln.concat is kiln.cat
    assert kiln.concatenate([kiln.ones(1), kiln.zeros(1)], axis=0).tolist() == [1.0, 0.0]
    assert kiln.moveaxis is kiln.movedim
    for name in (
        "split",
        "chunk",
        "unbind",
        "unflatten",
        "movedim",
        "moveaxis",
        "flip",
        "fliplr",
        "flipud",
        "roll",
        "repeat",
        "tile",
        "diagonal",
        "diag",
        "tril",
        "triu",
        "narrow_copy",
    ):
        assert hasattr(kiln.Tensor, name), name
        assert hasattr(torch.Tensor, name), name
    assert not hasattr(kiln, "repeat") and not hasattr(torch, "repeat")


# ---------------------------------------------------------------------------------------- gradcheck

GRADCHECK = {
    "cat": (lambda x, y: kiln.cat([x, y, x], 1), [(2, 3), (2, 2)]),
    "cat legacy": (lambda x, y: kiln.cat([y, x]), [(2, 3), (0,)]),
    "stack": (lambda x, y: kiln.stack([x, y], -1), [(2, 3), (2, 3)]),
    "split": (lambda x: kiln.split(x, [1, 2], 1), [(3, 3)]),
    "split int": (lambda x: x.split(2), [(5, 2)]),
    "chunk": (lambda x: kiln.chunk(x, 2, -1), [(2, 5)]),
    "unbind": (lambda x: kiln.unbind(x, 1), [(2, 3)]),
    "unflatten": (lambda x: kiln.unflatten(x, 1, (2, -1)), [(3, 4)]),
    "movedim": (lambda x: kiln.movedim(x, (0, 1), (2, 0)), [(2, 3, 4)]),
    "flip": (lambda x: kiln.flip(x, (0, 1)), [(2, 3)]),
    "fliplr": (lambda x: kiln.fliplr(x), [(2, 3)]),
    "flipud": (lambda x: kiln.flipud(x), [(2, 3)]),
    "roll": (lambda x: kiln.roll(x, (1, -2), (0, 1)), [(2, 3)]),
    "roll flat": (lambda x: kiln.roll(x, 4), [(2, 3)]),
    "repeat": (lambda x: x.repeat(2, 1, 3), [(2, 3)]),
    "tile": (lambda x: kiln.tile(x, (2,)), [(2, 3)]),
    "diagonal": (lambda x: kiln.diagonal(x, 1, 2, 0), [(3, 2, 4)]),
    "diag 1d": (lambda x: kiln.diag(x, -1), [(3,)]),
    "diag 2d": (lambda x: kiln.diag(x, 1), [(3, 4)]),
    "tril": (lambda x: kiln.tril(x, -1), [(2, 3, 3)]),
    "triu": (lambda x: kiln.triu(x, 1), [(3, 4)]),
    "narrow_copy": (lambda x: kiln.narrow_copy(x, 1, 1, 2), [(2, 4)]),
}


@pytest.mark.parametrize("name", GRADCHECK)
def test_gradcheck(name):
    fn, shapes = GRADCHECK[name]
    rng = U.rng_for(11)
    inputs = tuple(kiln.tensor(rng.standard_normal(s), dtype=kiln.float64, requires_grad=True) for s in shapes)
    assert kiln.autograd.gradcheck(fn, inputs)
    assert kiln.autograd.gradgradcheck(fn, inputs)


# ---------------------------------------------------------------------------------------- errors


def _t(shape, lib):
    return lib.zeros(shape)


ERRORS = {
    "cat empty list": lambda L: L.cat([]),
    "cat 0-d": lambda L: L.cat([L.ones(2), L.tensor(1.0)]),
    "cat ndim": lambda L: L.cat([_t((2, 3), L), _t((2, 3, 1), L)]),
    "cat sizes": lambda L: L.cat([_t((2, 3), L), _t((3, 3), L)], 1),
    "cat dim": lambda L: L.cat([_t((2, 3), L), _t((2, 3), L)], 2),
    "cat not list": lambda L: L.cat(_t((2, 3), L)),
    "stack empty": lambda L: L.stack([]),
    "stack sizes": lambda L: L.stack([_t((2, 3), L), _t((3, 2), L)]),
    "stack dim": lambda L: L.stack([_t((2, 3), L)], 3),
    "split zero": lambda L: L.split(_t((2, 3), L), 0, 1),
    "split negative": lambda L: L.split(_t((2, 3), L), -1, 1),
    "split sum": lambda L: L.split(_t((2, 3), L), [1, 1], 1),
    "split negative sizes": lambda L: L.split(_t((2, 3), L), [-1, 4], 1),
    "split 0-d": lambda L: L.split(L.tensor(1.0), 1),
    "chunk zero": lambda L: L.chunk(_t((2, 3), L), 0),
    "chunk 0-d": lambda L: L.chunk(L.tensor(1.0), 1),
    "unbind 0-d": lambda L: L.unbind(L.tensor(1.0)),
    "unbind dim": lambda L: L.unbind(_t((2, 3), L), 2),
    "unflatten empty": lambda L: L.unflatten(_t((2, 3), L), 1, ()),
    "unflatten sizes": lambda L: L.unflatten(_t((2, 3), L), 1, (2, 2)),
    "unflatten infer": lambda L: L.unflatten(_t((2, 3), L), -1, (-1, 2)),
    "movedim lengths": lambda L: L.movedim(_t((2, 3), L), (0, 1), (0,)),
    "movedim repeated source": lambda L: L.movedim(_t((2, 3), L), (0, 0), (0, 1)),
    "movedim repeated destination": lambda L: L.movedim(_t((2, 3), L), (0, 1), (1, 1)),
    "movedim range": lambda L: L.movedim(_t((2, 3), L), 2, 0),
    "flip repeated": lambda L: L.flip(_t((2, 3), L), (0, -2)),
    "flip range": lambda L: L.flip(_t((2, 3), L), (2,)),
    "fliplr 1-d": lambda L: L.fliplr(_t((3,), L)),
    "flipud 0-d": lambda L: L.flipud(L.tensor(1.0)),
    "roll align": lambda L: L.roll(_t((2, 3), L), (1, 2), 0),
    "roll align flat": lambda L: L.roll(_t((2, 3), L), (1, 2)),
    "roll align dims": lambda L: L.roll(_t((2, 3), L), 1, (0, 1)),
    "roll 0-d dim": lambda L: L.roll(L.tensor(1.0), 1, 0),
    "repeat few": lambda L: _t((2, 3), L).repeat(2),
    "repeat negative": lambda L: _t((2, 3), L).repeat(-1, 2),
    "diagonal identical": lambda L: L.diagonal(_t((2, 3), L), 0, 1, -1),
    "diagonal 1-d": lambda L: L.diagonal(_t((3,), L)),
    "diag 3-d": lambda L: L.diag(_t((2, 2, 2), L)),
    "diag 0-d": lambda L: L.diag(L.tensor(1.0)),
    "tril 1-d": lambda L: L.tril(_t((3,), L)),
    "triu 1-d": lambda L: L.triu(_t((3,), L)),
    "narrow_copy range": lambda L: L.narrow_copy(_t((2, 3), L), 1, 2, 2),
    "narrow_copy 0-d": lambda L: L.narrow_copy(L.tensor(1.0), 0, 0, 1),
    "unflatten 0-d": lambda L: L.unflatten(L.tensor(1.0), -1, (1,)),
    "unflatten ambiguous": lambda L: L.unflatten(_t((2, 0), L), 1, (-1, 0)),
    "unflatten dim": lambda L: L.unflatten(_t((2, 3), L), 2, (1,)),
}


@pytest.mark.parametrize("name", ERRORS)
def test_errors(name):
    fn = ERRORS[name]
    # some of torch's messages carry a C++ backtrace after the message itself
    message = str(U.torch_error(lambda: fn(torch))).split("\nException raised from")[0]
    U.assert_same_error(lambda: fn(kiln), lambda: fn(torch), message=U.kiln_message(message))


def test_narrow_copy_negative_start():
    """Forward only: torch's own NarrowCopyBackward0 fails for a negative start."""
    p = U.make_pair((3, 4), kiln.float32, layout="transposed", seed=2)
    U.check_op(lambda L, x: L.narrow_copy(x, 0, -2, 2), p, grad=False)


def test_unflatten_two_inferred():
    with pytest.raises(RuntimeError, match="only one dimension can be inferred"):
        kiln.unflatten(kiln.zeros(2, 6), 1, (-1, -1))


def test_diag_then_inplace_base_untouched():
    """diag of a matrix is a copy (torch: contiguous, not aliasing)."""
    x = kiln.tensor(np.arange(9.0).reshape(3, 3))
    d = kiln.diag(x)
    d.zero_()
    assert x[1, 1].item() == 4.0


# ---------------------------------------------------------------------------------------- properties


@settings(max_examples=25, deadline=None)
@given(shape=U.shapes(min_dims=1, max_dims=3), data=st.data())
def test_random_shapes(shape, data):
    """Random shapes (empty dims included), dims, split sizes and shifts against torch, forward and backward."""
    nd = len(shape)
    dim = data.draw(st.integers(-nd, nd - 1), label="dim")
    size = shape[dim]
    k = data.draw(st.integers(1 if size else 0, max(size, 1)), label="split size")
    shift = data.draw(st.integers(-5, 5), label="shift")
    layout = data.draw(st.sampled_from(U.LAYOUTS), label="layout")
    p = U.make_pair(shape, kiln.float64, layout=layout, seed=size, requires_grad=True)
    U.report(
        {
            "split": U.mismatch(lambda L, x: L.split(x, k, dim), p),
            "chunk": U.mismatch(lambda L, x: L.chunk(x, max(k, 1), dim), p),
            "unbind": U.mismatch(lambda L, x: L.unbind(x, dim), p),
            "cat": U.mismatch(lambda L, x: L.cat([x, x.flip(dim)], dim), p),
            "stack": U.mismatch(lambda L, x: L.stack([x, x * 2], dim), p),
            "movedim": U.mismatch(lambda L, x: L.movedim(x, dim, 0), p),
            "roll": U.mismatch(lambda L, x: L.roll(x, shift, dim), p),
            "repeat": U.mismatch(lambda L, x: x.repeat((2,) + (1,) * (nd - 1) + (2,)), p),
        }
    )


@pytest.mark.parametrize(
    "fn",
    [
        lambda L: L.stack(L.ones(2)),
        lambda L: L.stack([]),
        lambda L: L.stack([L.ones(2), 3]),
        lambda L: L.stack([L.ones(2), L.ones(3)]),
        lambda L: L.stack([L.ones(2)], dim=3),
    ],
)
def test_stack_errors_match_torch(fn):
    U.assert_same_error(lambda: fn(kiln), lambda: fn(torch))


def test_stack_node_name_and_gradgradcheck():
    a = kiln.randn(2, 3, dtype=kiln.float64, requires_grad=True)
    b = kiln.randn(2, 3, dtype=kiln.float64, requires_grad=True)
    assert kiln.stack([a, b], 1).grad_fn.name() == "StackBackward0"
    assert kiln.autograd.gradgradcheck(lambda x, y: kiln.stack([x * y, y], -1), (a, b))
