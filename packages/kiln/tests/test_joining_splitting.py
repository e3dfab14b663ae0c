"""Joining and splitting against PyTorch: ``broadcast_tensors``, ``atleast_1d``/``2d``/``3d``, ``hstack``,
``vstack``/``row_stack``, ``dstack``, ``column_stack``, ``block_diag``, ``cartesian_prod``, ``combinations``;
``tensor_split``, ``hsplit``/``vsplit``/``dsplit``, ``split_with_sizes`` and the ``unsafe_`` splits: values,
dtypes (promotion), views versus copies, gradients on random, non-contiguous, empty and 0-d inputs,
gradcheck in float64, signatures and errors."""

from __future__ import annotations

import inspect

import kiln_testutil as U
import pytest
import torch

import kiln

# name -> (fn(lib, *operands), operand shapes, dtypes of the operands)
CASES = {
    "broadcast_tensors": (lambda L, a, b: L.broadcast_tensors(a, b), [(3, 1), (4,)]),
    "broadcast_tensors three": (lambda L, a, b, c: L.broadcast_tensors(a, b, c), [(2, 1, 3), (3,), ()]),
    "broadcast_tensors one": (lambda L, a: L.broadcast_tensors(a), [(2, 3)]),
    "broadcast_tensors empty": (lambda L, a, b: L.broadcast_tensors(a, b), [(0, 1), (3,)]),
    "atleast_1d 0-d": (lambda L, a: L.atleast_1d(a), [()]),
    "atleast_1d many": (lambda L, a, b, c: L.atleast_1d(a, b, c), [(), (2,), (2, 3)]),
    "atleast_1d list": (lambda L, a, b: L.atleast_1d([a, b]), [(), (3,)]),
    "atleast_2d": (lambda L, a, b, c: L.atleast_2d(a, b, c), [(), (3,), (2, 3, 4)]),
    "atleast_2d tuple": (lambda L, a: L.atleast_2d((a,)), [(4,)]),
    "atleast_3d": (lambda L, a, b, c, d: L.atleast_3d(a, b, c, d), [(), (3,), (2, 3), (2, 3, 4, 5)]),
    "atleast_3d one": (lambda L, a: L.atleast_3d(a), [(2, 0)]),
    "hstack 1-d": (lambda L, a, b: L.hstack([a, b]), [(3,), (4,)]),
    "hstack 2-d": (lambda L, a, b: L.hstack((a, b)), [(2, 3), (2, 1)]),
    "hstack 0-d": (lambda L, a, b: L.hstack([a, b]), [(), ()]),
    "hstack 3-d": (lambda L, a, b: L.hstack([a, b]), [(2, 3, 2), (2, 1, 2)]),
    "vstack": (lambda L, a, b, c: L.vstack([a, b, c]), [(3,), (2, 3), ()]),
    "vstack 0-d": (lambda L, a, b: L.vstack([a, b]), [(), ()]),
    "row_stack": (lambda L, a, b: L.row_stack((a, b)), [(3,), (3,)]),
    "dstack": (lambda L, a, b: L.dstack([a, b]), [(2, 3), (2, 3)]),
    "dstack 1-d": (lambda L, a, b: L.dstack([a, b]), [(3,), (3,)]),
    "dstack 3-d": (lambda L, a, b: L.dstack([a, b]), [(2, 3, 1), (2, 3, 2)]),
    "column_stack": (lambda L, a, b: L.column_stack([a, b]), [(3,), (3, 2)]),
    "column_stack 0-d": (lambda L, a, b: L.column_stack([a, b]), [(), ()]),
    "column_stack empty": (lambda L, a, b: L.column_stack([a, b]), [(0,), (0, 2)]),
    "block_diag": (lambda L, a, b, c: L.block_diag(a, b, c), [(2, 2), (3,), ()]),
    "block_diag empty block": (lambda L, a, b: L.block_diag(a, b), [(0, 2), (2, 3)]),
    "block_diag one": (lambda L, a: L.block_diag(a), [(3,)]),
    "cartesian_prod": (lambda L, a, b: L.cartesian_prod(a, b), [(3,), (2,)]),
    "cartesian_prod three": (lambda L, a, b, c: L.cartesian_prod(a, b, c), [(2,), (1,), (3,)]),
    "cartesian_prod one": (lambda L, a: L.cartesian_prod(a), [(4,)]),
    "cartesian_prod empty": (lambda L, a, b: L.cartesian_prod(a, b), [(3,), (0,)]),
    "combinations": (lambda L, a: L.combinations(a), [(4,)]),
    "combinations 3": (lambda L, a: L.combinations(a, 3), [(5,)]),
    "combinations r too big": (lambda L, a: L.combinations(a, 4), [(3,)]),
    "combinations r 0": (lambda L, a: L.combinations(a, 0), [(3,)]),
    "combinations replacement": (lambda L, a: L.combinations(a, 2, True), [(3,)]),
    "combinations keywords": (lambda L, a: L.combinations(a, r=3, with_replacement=True), [(3,)]),
    "combinations empty": (lambda L, a: L.combinations(a), [(0,)]),
    "combinations single": (lambda L, a: L.combinations(a, 2, True), [(1,)]),
    "tensor_split sections": (lambda L, a: L.tensor_split(a, 3), [(7,), (7, 2)]),
    "tensor_split more sections": (lambda L, a: L.tensor_split(a, 10), [(7,)]),
    "tensor_split indices": (lambda L, a: L.tensor_split(a, [1, 5]), [(7,)]),
    "tensor_split unsorted indices": (lambda L, a: L.tensor_split(a, [5, 1]), [(7,)]),
    "tensor_split negative indices": (lambda L, a: L.tensor_split(a, (-1, 9)), [(7,)]),
    "tensor_split no indices": (lambda L, a: L.tensor_split(a, []), [(7,)]),
    "tensor_split dim": (lambda L, a: L.tensor_split(a, 3, dim=1), [(4, 6), (2, 5)]),
    "tensor_split tensor": (lambda L, a: L.tensor_split(a, L.tensor([1, 5])), [(7,)]),
    "tensor_split 0-d tensor": (lambda L, a: L.tensor_split(a, L.tensor(3)), [(7,)]),
    "tensor_split method": (lambda L, a: a.tensor_split(2, -1), [(3, 5)]),
    "tensor_split empty": (lambda L, a: L.tensor_split(a, 2), [(0, 3)]),
    "hsplit": (lambda L, a: L.hsplit(a, 2), [(4, 6)]),
    "hsplit 1-d": (lambda L, a: L.hsplit(a, [2]), [(7,)]),
    "hsplit method": (lambda L, a: a.hsplit(3), [(2, 6, 2)]),
    "vsplit": (lambda L, a: L.vsplit(a, [1, 2]), [(4, 6)]),
    "vsplit method": (lambda L, a: a.vsplit(2), [(4, 2)]),
    "dsplit": (lambda L, a: L.dsplit(a, 2), [(2, 3, 4)]),
    "dsplit indices": (lambda L, a: a.dsplit([1]), [(2, 3, 4)]),
    "split_with_sizes": (lambda L, a: L.split_with_sizes(a, [1, 3]), [(4, 6)]),
    "split_with_sizes dim": (lambda L, a: L.split_with_sizes(a, [1, 0, 5], dim=1), [(4, 6)]),
    "split_with_sizes method": (lambda L, a: a.split_with_sizes((2, 2), -1), [(3, 4)]),
    "unsafe_split": (lambda L, a: L.unsafe_split(a, 3), [(7,), (7, 2)]),
    "unsafe_split dim": (lambda L, a: a.unsafe_split(2, 1), [(2, 5)]),
    "unsafe_chunk": (lambda L, a: L.unsafe_chunk(a, 3), [(7,)]),
    "unsafe_chunk method": (lambda L, a: a.unsafe_chunk(2, dim=-1), [(3, 4)]),
    "unsafe_split_with_sizes": (lambda L, a: L.unsafe_split_with_sizes(a, [3, 4]), [(7,)]),
    "unsafe_split_with_sizes method": (lambda L, a: a.unsafe_split_with_sizes([1, 1], 1), [(3, 2)]),
}

VIEWS = {"broadcast_tensors", "atleast", "split", "hsplit", "vsplit", "dsplit", "unsafe"}


@pytest.mark.parametrize("layout", U.LAYOUTS)
@pytest.mark.parametrize("dtype", (kiln.float32, kiln.int64, kiln.bool), ids=U.dtype_id)
@pytest.mark.parametrize("name", list(CASES))
def test_forward_and_backward_match_torch(name, dtype, layout):
    fn, shapes = CASES[name]
    nargs = len(inspect.signature(fn).parameters) - 1
    groups = [shapes] if len(shapes) == nargs else [[s] for s in shapes]
    for group in groups:
        grad = dtype is kiln.float32
        pairs = [U.make_pair(s, dtype, layout=layout, seed=i, requires_grad=grad) for i, s in enumerate(group)]
        k, _ = U.check_op(fn, *pairs, grad=grad)
        if k is not None and any(name.startswith(v) for v in VIEWS) and layout == "contiguous":
            outs = k if isinstance(k, (tuple, list)) else (k,)
            for o in outs:  # views of the operands, as PyTorch's
                assert any(o.data_ptr() == p.k.data_ptr() or o._base is not None for p in pairs), name


def test_dtype_promotion_matches_torch():
    for fn in (
        lambda L: L.hstack([L.ones(2), L.ones(2, dtype=L.int64)]),
        lambda L: L.vstack([L.ones(2, dtype=L.bool), L.ones(2, dtype=L.uint8)]),
        lambda L: L.dstack([L.ones(2, dtype=L.float16), L.ones(2, dtype=L.float64)]),
        lambda L: L.column_stack([L.ones(2, dtype=L.int8), L.ones(2, dtype=L.int32)]),
        lambda L: L.block_diag(L.ones(2, 2), L.ones(1, dtype=L.int64)),
        lambda L: L.block_diag(L.ones(2, 2, dtype=L.int32), L.ones(1, dtype=L.bool)),
        lambda L: L.block_diag(),
        lambda L: L.broadcast_tensors(),
        lambda L: L.atleast_1d(),
    ):
        U.check_op(fn, grad=False)


@pytest.mark.parametrize(
    "fn, shapes",
    [
        (lambda a, b: kiln.hstack([a, b]), [(2, 3), (2, 2)]),
        (lambda a, b: kiln.vstack([a, b]), [(3,), (2, 3)]),
        (lambda a, b: kiln.dstack([a, b]), [(2, 3), (2, 3)]),
        (lambda a, b: kiln.column_stack([a, b]), [(3,), (3, 2)]),
        (lambda a, b, c: kiln.block_diag(a, b, c), [(2, 2), (3,), ()]),
        (lambda a, b: kiln.cartesian_prod(a, b), [(3,), (2,)]),
        (lambda a: kiln.combinations(a, 2, True), [(4,)]),
        (lambda a, b: kiln.broadcast_tensors(a, b), [(3, 1), (4,)]),
        (lambda a: kiln.atleast_3d(a), [(3,)]),
        (lambda a: kiln.tensor_split(a, [1, 3], 1), [(2, 5)]),
        (lambda a: kiln.dsplit(a, 2), [(2, 1, 4)]),
        (lambda a: kiln.split_with_sizes(a, [2, 1]), [(3, 2)]),
        (lambda a: kiln.unsafe_chunk(a, 2), [(5,)]),
    ],
)
def test_gradcheck_float64(fn, shapes):
    inputs = [kiln.randn(*s, dtype=kiln.float64, requires_grad=True) for s in shapes]
    assert kiln.autograd.gradcheck(fn, tuple(inputs))
    assert kiln.autograd.gradgradcheck(fn, tuple(inputs))


ERRORS = [
    lambda L: L.atleast_1d(1),
    lambda L: L.atleast_2d("s"),
    lambda L: L.atleast_1d([1, 2]),
    lambda L: L.atleast_3d(L.ones(1), 1),
    lambda L: L.hstack([]),
    lambda L: L.hstack(L.ones(2)),
    lambda L: L.hstack([L.ones(3), L.ones(2, 3)]),
    lambda L: L.hstack([L.ones(2), 1]),
    lambda L: L.vstack([L.ones(2), L.ones(3)]),
    lambda L: L.dstack([]),
    lambda L: L.column_stack([]),
    lambda L: L.column_stack([L.ones(3, 2, 2), L.ones(3)]),
    lambda L: L.row_stack(L.ones(2)),
    lambda L: L.broadcast_tensors(L.ones(3), L.ones(4)),
    lambda L: L.broadcast_tensors([L.ones(3)]),
    lambda L: L.broadcast_tensors(L.ones(3), 1),
    lambda L: L.block_diag(L.ones(2, 2, 2)),
    lambda L: L.block_diag([L.ones(2)]),
    lambda L: L.cartesian_prod(L.ones(2), L.ones(2, dtype=L.int64)),
    lambda L: L.cartesian_prod(L.ones(2, 3)),
    lambda L: L.cartesian_prod(),
    lambda L: L.cartesian_prod(L.tensor(1.0)),
    lambda L: L.combinations(L.ones(3), -1),
    lambda L: L.combinations(L.ones(2, 3)),
    lambda L: L.combinations(L.tensor(1.0)),
    lambda L: L.combinations([1, 2]),
    lambda L: L.tensor_split(L.ones(7), L.tensor([1.5])),
    lambda L: L.tensor_split(L.ones(7), L.tensor([[1, 5]])),
    lambda L: L.tensor_split(L.ones(7), 0),
    lambda L: L.tensor_split(L.ones(7), -1),
    lambda L: L.tensor_split(L.tensor(1.0), 2),
    lambda L: L.tensor_split(L.ones(7), 2, dim=1),
    lambda L: L.hsplit(L.ones(7), 2),
    lambda L: L.hsplit(L.ones(4, 6), 4),
    lambda L: L.hsplit(L.tensor(1.0), 1),
    lambda L: L.vsplit(L.ones(4, 6), 3),
    lambda L: L.vsplit(L.ones(7), 1),
    lambda L: L.dsplit(L.ones(4, 6), 2),
    lambda L: L.dsplit(L.ones(2, 3, 4), 3),
    lambda L: L.split_with_sizes(L.ones(4, 6), [1, 2]),
    lambda L: L.split_with_sizes(L.ones(4, 6), [-1, 5]),
    lambda L: L.split_with_sizes(L.ones(4, 6), 2),
    lambda L: L.ones(4, 6).split_with_sizes(2, 2),
    lambda L: L.unsafe_split(L.ones(7), [3, 4]),
    lambda L: L.unsafe_chunk(L.ones(7), 0),
    lambda L: L.unsafe_split_with_sizes(L.ones(7), [3, 3]),
]


@pytest.mark.parametrize("i", range(len(ERRORS)))
def test_errors_match_torch(i):
    fn = ERRORS[i]
    exc = U.torch_error(lambda: fn(torch))
    if isinstance(exc, TypeError) and "received an invalid combination" in str(exc):
        with pytest.raises(TypeError):  # PyTorch's overload listing: the type only
            fn(kiln)
        return
    U.assert_same_error(lambda: fn(kiln), lambda: fn(torch))


def test_hstack_out_argument():
    out = kiln.empty(0)
    assert kiln.hstack([kiln.ones(2), kiln.zeros(1)], out=out) is out and out.tolist() == [1.0, 1.0, 0.0]
    out = kiln.empty(2, 2, dtype=kiln.float64)
    kiln.vstack([kiln.ones(2), kiln.ones(2)], out=out)
    assert out.dtype is kiln.float64 and out.tolist() == [[1.0, 1.0]] * 2
    with pytest.raises(RuntimeError, match="don't support automatic differentiation"):
        kiln.dstack([kiln.ones(2, requires_grad=True)], out=kiln.empty(1, 2, 1))


def test_signatures():
    for name in ("broadcast_tensors", "atleast_1d", "atleast_2d", "atleast_3d", "block_diag", "cartesian_prod"):
        k = [(p.name, p.kind) for p in inspect.signature(getattr(kiln, name)).parameters.values()]
        t = [(p.name, p.kind) for p in inspect.signature(getattr(torch, name)).parameters.values()]
        assert k == t, name
    for name in ("hstack", "vstack", "dstack", "column_stack", "row_stack"):
        params = inspect.signature(getattr(kiln, name)).parameters
        assert [(p.name, p.kind.name) for p in params.values()] == [
            ("tensors", "POSITIONAL_OR_KEYWORD"),
            ("out", "KEYWORD_ONLY"),
        ]
    schemas = {
        "combinations": kiln.combinations,
        "split_with_sizes": kiln.split_with_sizes,
        "unsafe_chunk": kiln.unsafe_chunk,
        "unsafe_split_with_sizes": kiln.unsafe_split_with_sizes,
        "unsafe_split": kiln.unsafe_split,
    }
    for name, fn in schemas.items():
        (schema, *_) = torch._C._jit_get_schemas_for_operator(f"aten::{name}")
        names = ["input" if a.name == "self" else a.name for a in schema.arguments]
        defaults = [a.default_value for a in schema.arguments]
        params = list(inspect.signature(fn).parameters.values())
        assert [p.name for p in params] == names, name
        assert [None if p.default is p.empty else p.default for p in params] == defaults, name
    assert list(inspect.signature(kiln.tensor_split).parameters) == ["input", "indices_or_sections", "dim"]
    for name in ("hsplit", "vsplit", "dsplit"):
        assert list(inspect.signature(getattr(kiln, name)).parameters) == ["input", "indices_or_sections"]
