"""Writes through views and indices against PyTorch: ``select_scatter``, ``slice_scatter``,
``diagonal_scatter``, ``as_strided_scatter``, ``diag_embed``, ``diagflat``, ``rot90``, the ``*_copy``
functions, ``put``/``put_``, ``index_reduce``/``index_reduce_``, ``fill_diagonal_``, ``argwhere``,
``unravel_index``, ``Tensor.unfold``, the in-place view methods (``t_``, ``transpose_``, ``swapaxes_``,
``swapdims_``, ``squeeze_``, ``unsqueeze_``, ``as_strided_``), ``resize_``/``resize_as_`` and ``tril_``/
``triu_``: values and dtypes on random, non-contiguous, empty and 0-d inputs, gradients (and gradcheck
in float64), autograd rules for in-place changes of leaves and views, signatures and errors."""

# ruff: noqa: B023 - lambdas made inside loops are called within the same iteration

from __future__ import annotations

import inspect
import warnings

import kiln_testutil as U
import numpy as np
import pytest
import torch

import kiln

# name -> (fn(lib, x, *more), shape of x, [shapes of the other float operands])
CASES = {
    "select_scatter": (lambda L, x, s: L.select_scatter(x, s, 0, 1), (3, 4), [(4,)]),
    "select_scatter neg": (lambda L, x, s: x.select_scatter(s, -1, -1), (3, 4), [(3,)]),
    "select_scatter 1-d": (lambda L, x, s: L.select_scatter(x, s, 0, 2), (3,), [()]),
    "slice_scatter": (lambda L, x, s: L.slice_scatter(x, s, 0, 1, 2), (3, 4), [(1, 4)]),
    "slice_scatter step": (lambda L, x, s: L.slice_scatter(x, s, 1, 0, 4, 2), (3, 4), [(3, 2)]),
    "slice_scatter defaults": (lambda L, x, s: L.slice_scatter(x, s), (3, 4), [(3, 4)]),
    "slice_scatter negative start": (lambda L, x, s: x.slice_scatter(s, 1, -2), (3, 4), [(3, 2)]),
    "slice_scatter past end": (lambda L, x, s: L.slice_scatter(x, s, 1, 5), (3, 4), [(3, 0)]),
    "slice_scatter keywords": (
        lambda L, x, s: L.slice_scatter(x, s, dim=1, start=None, end=3, step=2),
        (3, 4),
        [(3, 2)],
    ),
    "diagonal_scatter": (lambda L, x, s: L.diagonal_scatter(x, s), (3, 4), [(3,)]),
    "diagonal_scatter offset": (lambda L, x, s: L.diagonal_scatter(x, s, 1), (3, 4), [(3,)]),
    "diagonal_scatter negative": (lambda L, x, s: x.diagonal_scatter(s, -1), (3, 4), [(2,)]),
    "diagonal_scatter dims": (lambda L, x, s: L.diagonal_scatter(x, s, 0, 2, 0), (3, 2, 4), [(2, 3)]),
    "diagonal_scatter empty": (lambda L, x, s: L.diagonal_scatter(x, s), (0, 3), [(0,)]),
    "diag_embed": (lambda L, x: L.diag_embed(x), (4,), []),
    "diag_embed batch": (lambda L, x: L.diag_embed(x), (3, 4), []),
    "diag_embed offset": (lambda L, x: x.diag_embed(1), (3, 4), []),
    "diag_embed dims": (lambda L, x: L.diag_embed(x, -2, 0, 2), (3, 4), []),
    "diag_embed empty": (lambda L, x: L.diag_embed(x, 1), (2, 0), []),
    "diagflat": (lambda L, x: L.diagflat(x), (3, 4), []),
    "diagflat offset": (lambda L, x: L.diagflat(x, 2), (3,), []),
    "diagflat negative": (lambda L, x: x.diagflat(-1), (2, 2), []),
    "diagflat 0-d": (lambda L, x: L.diagflat(x), (), []),
    "diagflat empty": (lambda L, x: L.diagflat(x, 2), (0,), []),
    "rot90": (lambda L, x: L.rot90(x), (3, 4), []),
    "rot90 2": (lambda L, x: L.rot90(x, 2), (3, 4), []),
    "rot90 -1": (lambda L, x: L.rot90(x, -1), (3, 4), []),
    "rot90 0": (lambda L, x: L.rot90(x, 0), (3, 4), []),
    "rot90 5 dims": (lambda L, x: L.rot90(x, k=5, dims=(-1, -2)), (3, 4), []),
    "rot90 3-d": (lambda L, x: x.rot90(1, [0, 2]), (2, 3, 4), []),
    "view_copy": (lambda L, x: L.view_copy(x, (4, 3)), (3, 4), []),
    "view_copy infer": (lambda L, x: L.view_copy(x, [-1]), (3, 4), []),
    "permute_copy": (lambda L, x: L.permute_copy(x, (2, 0, 1)), (2, 3, 4), []),
    "expand_copy": (lambda L, x: L.expand_copy(x, (2, 3, 4)), (3, 1), []),
    "expand_copy implicit": (lambda L, x: L.expand_copy(x, (3, 4), implicit=True), (1, 4), []),
    "select_copy": (lambda L, x: L.select_copy(x, 1, -1), (3, 4), []),
    "slice_copy": (lambda L, x: L.slice_copy(x, 1, 0, 4, 2), (3, 4), []),
    "slice_copy defaults": (lambda L, x: L.slice_copy(x), (3, 4), []),
    "split_copy": (lambda L, x: L.split_copy(x, 2, 1), (3, 5), []),
    "split_with_sizes_copy": (lambda L, x: L.split_with_sizes_copy(x, [1, 2]), (3, 4), []),
    "squeeze_copy": (lambda L, x: L.squeeze_copy(x), (1, 3, 1), []),
    "squeeze_copy dim": (lambda L, x: L.squeeze_copy(x, 0), (1, 3, 1), []),
    "squeeze_copy dims": (lambda L, x: L.squeeze_copy(x, (0, 2)), (1, 3, 1), []),
    "unsqueeze_copy": (lambda L, x: L.unsqueeze_copy(x, -1), (3, 4), []),
    "t_copy": (lambda L, x: L.t_copy(x), (3, 4), []),
    "t_copy 1-d": (lambda L, x: L.t_copy(x), (3,), []),
    "transpose_copy": (lambda L, x: L.transpose_copy(x, 0, 2), (2, 3, 4), []),
    "diagonal_copy": (lambda L, x: L.diagonal_copy(x, 1), (3, 4), []),
    "unbind_copy": (lambda L, x: L.unbind_copy(x, 1), (3, 4), []),
    "unfold_copy": (lambda L, x: L.unfold_copy(x, 1, 2, 1), (3, 4), []),
    "alias_copy": (lambda L, x: L.alias_copy(x), (3, 4), []),
    "as_strided_copy": (lambda L, x: L.as_strided_copy(x.contiguous(), (2, 2), (1, 2)), (3, 4), []),
    "unfold": (lambda L, x: x.unfold(1, 2, 1), (3, 4), []),
    "unfold step": (lambda L, x: x.unfold(1, 2, 2), (3, 5), []),
    "unfold dim 0": (lambda L, x: x.unfold(0, 3, 1), (3, 4), []),
    "unfold whole": (lambda L, x: x.unfold(-1, 4, 3), (3, 4), []),
    "unfold size 0": (lambda L, x: x.unfold(1, 0, 1), (3, 4), []),
    "unfold 0-d": (lambda L, x: x.unfold(0, 1, 1), (), []),
    "unfold empty": (lambda L, x: x.unfold(0, 0, 1), (0, 3), []),
    "unfold overlapping": (lambda L, x: x.unfold(0, 3, 1).unfold(1, 2, 1), (5, 4), []),
    "put": (lambda L, x, s: L.put(x, L.tensor([0, 5, -1]), s), (3, 4), [(3,)]),
    "put accumulate": (lambda L, x, s: L.put(x, L.tensor([[0, 5], [5, 0]]), s, True), (3, 4), [(2, 2)]),
    "put method": (lambda L, x, s: x.put(L.tensor([1]), s), (3, 4), [(1,)]),
    "put 0-d": (lambda L, x, s: L.put(x, L.tensor([0]), s), (), [(1,)]),
    "put none": (lambda L, x, s: L.put(x, L.tensor([], dtype=L.int64), s), (3,), [(0,)]),
    "argwhere": (lambda L, x: L.argwhere(x > 0), (3, 4), []),
    "argwhere 0-d": (lambda L, x: x.argwhere(), (), []),
}


def _writable(name: str, layout: str) -> bool:
    return not (layout == "expanded" and name.startswith("put"))  # an expanded input is cloned first


@pytest.mark.parametrize("layout", U.LAYOUTS)
@pytest.mark.parametrize("dtype", (kiln.float32, kiln.int64, kiln.bool), ids=U.dtype_id)
@pytest.mark.parametrize("name", list(CASES))
def test_forward_and_backward_match_torch(name, dtype, layout):
    fn, shape, others = CASES[name]
    grad = dtype is kiln.float32
    x = U.make_pair(shape, dtype, layout=layout, requires_grad=grad)
    more = [U.make_pair(s, dtype, seed=i + 1, requires_grad=grad) for i, s in enumerate(others)]
    k, t = U.check_op(fn, x, *more, grad=grad and not name.startswith("argwhere"))
    if k is not None and "copy" in name:
        for o in k if isinstance(k, tuple) else (k,):  # new storage, contiguous, as PyTorch's
            assert o.is_contiguous() and o.data_ptr() != x.k.data_ptr()
    if k is not None and "scatter" in name:  # a copy of a dense input keeps its layout, as PyTorch's
        assert k.data_ptr() != x.k.data_ptr() or k.numel() == 0
        if layout in ("contiguous", "transposed") and k.numel():
            assert k.stride() == t.stride()


@pytest.mark.parametrize(
    "fn, shapes",
    [
        (lambda x, s: kiln.select_scatter(x, s, 1, 0), [(3, 4), (3,)]),
        (lambda x, s: kiln.slice_scatter(x, s, 1, 1, 4, 2), [(3, 4), (3, 2)]),
        (lambda x, s: kiln.diagonal_scatter(x, s, -1), [(3, 4), (2,)]),
        (lambda x, s: kiln.as_strided_scatter(x, s, (2, 2), (1, 2), 1), [(3, 4), (2, 2)]),
        (lambda x: kiln.diag_embed(x, 1, 0, 2), [(3, 2)]),
        (lambda x: kiln.diagflat(x, -1), [(2, 2)]),
        (lambda x: kiln.rot90(x, 3, (1, 0)), [(3, 4)]),
        (lambda x, s: kiln.put(x, kiln.tensor([0, 5, 5]), s, True), [(3, 4), (3,)]),
        (lambda x, s: kiln.index_reduce(x, 0, kiln.tensor([0, 2, 0]), s, "prod"), [(3, 2), (3, 2)]),
        (lambda x, s: kiln.index_reduce(x, 1, kiln.tensor([1, 1]), s, "mean", include_self=False), [(2, 3), (2, 2)]),
        (lambda x: x.unfold(1, 3, 2), [(2, 7)]),
        (lambda x: kiln.unfold_copy(x.t(), 0, 2, 1), [(3, 4)]),
        (lambda x: kiln.as_strided_copy(x, (2, 2), (2, 1), 1), [(3, 3)]),
    ],
)
def test_gradcheck_float64(fn, shapes):
    inputs = tuple(kiln.rand(*s, dtype=kiln.float64, requires_grad=True) + 0.5 for s in shapes)
    inputs = tuple(i.detach().requires_grad_() for i in inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # index_reduce's beta warning
        assert kiln.autograd.gradcheck(fn, inputs)
        assert kiln.autograd.gradgradcheck(fn, inputs)


def test_as_strided_scatter_matches_torch():
    for layout in ("contiguous", "transposed"):
        x, s = U.make_pair((3, 4), layout=layout), U.make_pair((2, 2), seed=1)
        for args in (((2, 2), (1, 2)), ((2, 2), (1, 2), 1), ((2, 2), (4, 1), 3)):
            U.check_op(lambda L, a, b: L.as_strided_scatter(a, b, *args), x, s, grad=False)
    # src's gradient as torch's; input's is the scattered positions zeroed, which gradcheck confirms
    # (torch 2.13 returns the complement for input: its own gradcheck fails there)
    x, s = U.make_pair((3, 4)), U.make_pair((2, 2), seed=1, requires_grad=True)
    U.check_op(lambda L, a, b: L.as_strided_scatter(a, b, (2, 2), (1, 2), 1), x, s)
    kx = kiln.rand(3, 4, requires_grad=True)
    kiln.as_strided_scatter(kx, kiln.zeros(2, 2), (2, 2), (1, 2), 1).backward(kiln.arange(12.0).reshape(3, 4))
    assert kx.grad.tolist() == [[0.0, 0.0, 0.0, 0.0], [0.0, 5.0, 6.0, 7.0], [8.0, 9.0, 10.0, 11.0]]


def test_scatter_casts_src_as_torch():
    for sd in (kiln.float64, kiln.int64, kiln.bool):
        x, s = U.make_pair((3, 4)), U.make_pair((4,), sd, seed=1)
        U.check_op(lambda L, a, b: L.select_scatter(a, b, 0, 1), x, s, grad=False)
        U.check_op(lambda L, a, b: L.select_scatter(a.double(), b, 0, 1), x, s, grad=False)


# ---------------------------------------------------------------------------------------- index_reduce, fill_diagonal_


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("dtype", (kiln.float32, kiln.float64, kiln.int64, kiln.int32, kiln.uint8), ids=U.dtype_id)
def test_index_reduce_matches_torch(reduce, include_self, dtype):
    grad = dtype.is_floating_point
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for dim, shape, sshape, index in (
            (0, (3, 4), (5, 4), [0, 2, 0, 0, 1]),
            (1, (3, 4), (3, 3), [3, 3, 0]),
            (-1, (2, 3, 4), (2, 3, 2), [1, 1]),
            (0, (3,), (0,), []),
            (0, (), (), [0]),
        ):
            for layout in ("contiguous", "transposed"):
                x = U.make_pair(
                    shape, dtype, layout=layout, requires_grad=grad, low=-3 if dtype is not kiln.uint8 else 0
                )
                s = U.make_pair(sshape, dtype, seed=3, requires_grad=grad)
                for idx_dtype in ("int64", "int32"):
                    U.check_op(
                        lambda L, a, b: L.index_reduce(
                            a, dim, L.tensor(index, dtype=getattr(L, idx_dtype)), b, reduce, include_self=include_self
                        ),
                        x,
                        s,
                        # torch's backward refuses an int32 index without include_self (its index_fill_ wants int64)
                        grad=grad and (idx_dtype == "int64" or include_self),
                    )
            y = U.make_pair(shape, dtype, seed=5)
            U.check_op(
                lambda L, a, b: a.clone().index_reduce_(dim, L.tensor(index), b, reduce, include_self=include_self),
                y,
                s,
                grad=False,
            )


def test_index_reduce_warns_once_and_errors_as_torch(monkeypatch):
    import kiln._ops.index_writes as index_writes

    monkeypatch.setattr(index_writes, "_beta_warned", False)  # as in a fresh process (torch's warns once too)
    with pytest.warns(UserWarning, match=r"index_reduce\(\) is in beta and the API may change at any time"):
        kiln.index_reduce(kiln.ones(2), 0, kiln.tensor([0]), kiln.ones(1), "prod")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kiln.index_reduce(kiln.ones(2), 0, kiln.tensor([0]), kiln.ones(1), "prod")
    src = lambda L: L.arange(8.0).reshape(2, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for fn in (
            lambda L: L.index_reduce(L.ones(3, 4), 0, L.tensor([0, 0]), src(L), "sum"),
            lambda L: L.index_reduce(L.ones(3, 4), 0, L.tensor([0, 3]), src(L), "prod"),
            lambda L: L.index_reduce(L.ones(3, 4), 0, L.tensor([0, -1]), src(L), "prod"),
            lambda L: L.index_reduce(L.ones(3, 4), 0, L.tensor([0.0, 1.0]), src(L), "prod"),
            lambda L: L.index_reduce(L.ones(3, 4), 0, L.tensor([[0, 1]]), src(L), "prod"),
            lambda L: L.index_reduce(L.ones(3, 4), 0, L.tensor([0]), src(L), "prod"),
            lambda L: L.index_reduce(L.ones(3, 4), 1, L.tensor([0, 1]), src(L), "prod"),
            lambda L: L.index_reduce(L.ones(3, 4), 0, L.tensor([0, 1]), src(L).double(), "prod"),
            lambda L: L.index_reduce(L.ones(3, 4), 0, L.tensor([0, 1]), src(L)[:, :3], "prod"),
            lambda L: L.index_reduce(L.ones(3, 4), 0, L.tensor([0, 1]), src(L).reshape(2, 4, 1), "prod"),
            lambda L: L.index_reduce(L.ones(3, 4), 2, L.tensor([0, 1]), src(L), "prod"),
            lambda L: L.index_reduce(L.ones(3, dtype=L.bool), 0, L.tensor([0]), L.tensor([False]), "prod"),
            lambda L: L.index_reduce(L.tensor(2.0), 0, L.tensor([0, 0]), L.tensor([3.0, 4.0]), "prod"),
            lambda L: L.ones(3, 4, requires_grad=True).index_reduce_(0, L.tensor([0]), L.ones(1, 4), "prod"),
            lambda L: L.ones(1, 4).expand(3, 4).index_reduce_(0, L.tensor([0]), L.ones(1, 4), "prod"),
        ):
            U.assert_same_error(lambda: fn(kiln), lambda: fn(torch))


@pytest.mark.parametrize(
    "shape, value, wrap",
    [
        ((3, 4), 5, False),
        ((4, 3), 5, False),
        ((7, 3), 5, True),
        ((7, 3), 5, False),
        ((4, 3), 5, True),
        ((3, 7), 5, True),
        ((3, 3, 3), 5, False),
        ((0, 4), 5, False),
        ((2, 2), 2.7, False),
        ((2, 2), -1, False),
        ((2, 2), True, False),
    ],
)
def test_fill_diagonal_matches_torch(shape, value, wrap):
    for dtype in (kiln.float32, kiln.int64, kiln.uint8, kiln.bool):
        for layout in ("contiguous", "transposed"):
            x = U.make_pair(shape, dtype, layout=layout)
            U.check_op(lambda L, a: a.clone().fill_diagonal_(value, wrap=wrap), x, grad=False)
            U.check_op(lambda L, a: a.transpose(0, 1).clone().t().fill_diagonal_(value, wrap), x, grad=False)
    x = U.make_pair(shape, requires_grad=True)
    U.check_op(lambda L, a: (a * 2).fill_diagonal_(value, wrap=wrap), x)


def test_fill_diagonal_errors_match_torch():
    for fn in (
        lambda L: L.ones(3, 3, 2).fill_diagonal_(5),
        lambda L: L.ones(3).fill_diagonal_(5),
        lambda L: L.ones(3, 3, requires_grad=True).fill_diagonal_(5),
        lambda L: L.zeros(2, 2, dtype=L.uint8).fill_diagonal_(300),
    ):
        U.assert_same_error(lambda: fn(kiln), lambda: fn(torch))


# ---------------------------------------------------------------------------------------- put_, unravel_index


def test_put_in_place_matches_torch():
    for layout in ("contiguous", "transposed", "strided"):
        for accumulate in (False, True):
            x = U.make_pair((3, 4), layout=layout)
            s = U.make_pair((3,), seed=1)
            U.check_op(lambda L, a, b: a.put_(L.tensor([1, -2, 1]), b, accumulate=accumulate), x, s, grad=False)
            U.assert_close(x.k_leaf, x.t_leaf)  # written through the view into the base
    kx, tx = U.both(np.ones(3), requires_grad=True)
    ks, ts = U.both(np.array([2.0, 3.0]), requires_grad=True)
    k, t = (kx * 1).put_(kiln.tensor([0, 0]), ks, True), (tx * 1).put_(torch.tensor([0, 0]), ts, True)
    U.assert_close(k, t)
    U.check_backward(k, t, [(kx, tx), (ks, ts)])


def test_put_errors_match_torch():
    x = lambda L: L.ones(3, 4)
    for fn in (
        lambda L: L.put(x(L), L.tensor([0, 12]), L.tensor([1.0, 2.0])),
        lambda L: L.put(x(L), L.tensor([0, -13]), L.tensor([1.0, 2.0])),
        lambda L: L.put(x(L), L.tensor([0, 5]), L.tensor([1.0, 2.0, 3.0])),
        lambda L: L.put(x(L), L.tensor([0.0, 5.0]), L.tensor([1.0, 2.0])),
        lambda L: L.put(x(L), L.tensor([0, 5], dtype=L.int32), L.tensor([1.0, 2.0])),
        lambda L: L.put(x(L), L.tensor([0, 5]), L.tensor([1.0, 2.0]).double()),
        lambda L: L.put(x(L), L.tensor([0, 5]), L.tensor([1, 2])),
        lambda L: L.put(L.ones(0), L.tensor([0]), L.tensor([1.0])),
        lambda L: L.ones(3).expand(2, 3).put_(L.tensor([0]), L.tensor([3.0])),
        lambda L: L.ones(3, requires_grad=True).put_(L.tensor([0]), L.tensor([3.0])),
    ):
        U.assert_same_error(lambda: fn(kiln), lambda: fn(torch))


@pytest.mark.parametrize(
    "indices, shape",
    [
        ([4, 1], (2, 3)),
        (4, (2, 3)),
        ([4, 1], 5),
        ([6, 7, -7, -1], (2, 3)),
        ([[1234], [5678]], (10, 10, 10, 10)),
        ([[1234], [5678]], [100, 100]),
        ([0, 1, 2], (1, 3, 1)),
        ([1], ()),
        ([], (0,)),
        ([3], (4, 0, 2)),
    ],
)
def test_unravel_index_matches_torch(indices, shape):
    for dtype in (kiln.int64, kiln.int32, kiln.uint8, kiln.int8):
        if dtype in (kiln.uint8,) and np.min(indices, initial=0) < 0:
            continue
        U.check_op(
            lambda L, i: L.unravel_index(i, shape),
            U.make_pair(np.shape(indices), dtype, values=np.array(indices)),
            grad=False,
        )


def test_unravel_index_errors_match_torch():
    for fn in (
        lambda L: L.unravel_index(L.tensor([1.0]), (2, 3)),
        lambda L: L.unravel_index(L.tensor([True]), (2,)),
        lambda L: L.unravel_index(L.tensor([1]), (2, -3)),
        lambda L: L.unravel_index(L.tensor([1]), (2.0, 3)),
        lambda L: L.unravel_index(L.tensor([0]), (0,)),
    ):
        U.assert_same_error(lambda: fn(kiln), lambda: fn(torch))
    with pytest.raises(TypeError):
        kiln.unravel_index([1], (2, 3))  # torch fails reading an attribute of the list


# ---------------------------------------------------------------------------------------- in-place views, unfold, resize

IN_PLACE_VIEWS = {
    "t_": (lambda x: x.t_(), (3, 4)),
    "t_ 1-d": (lambda x: x.t_(), (3,)),
    "transpose_": (lambda x: x.transpose_(0, 2), (2, 3, 4)),
    "swapaxes_": (lambda x: x.swapaxes_(0, 1), (3, 4)),
    "swapdims_": (lambda x: x.swapdims_(-1, 0), (3, 4)),
    "squeeze_": (lambda x: x.squeeze_(), (1, 3, 1)),
    "squeeze_ dim": (lambda x: x.squeeze_(2), (1, 3, 1)),
    "squeeze_ dims": (lambda x: x.squeeze_((0, 2)), (1, 3, 1)),
    "unsqueeze_": (lambda x: x.unsqueeze_(1), (3, 4)),
    "as_strided_": (lambda x: x.as_strided_((2, 2), (1, 2)), (3, 4)),
    "as_strided_ offset": (lambda x: x.as_strided_((2, 2), (1, 2), 1), (3, 4)),
}


@pytest.mark.parametrize("name", list(IN_PLACE_VIEWS))
def test_in_place_view_methods_match_torch(name):
    fn, shape = IN_PLACE_VIEWS[name]
    # no autograd: metadata changes in place, values and strides as torch's
    kx, tx = U.both(np.arange(float(np.prod(shape))).reshape(shape))
    k, t = fn(kx), fn(tx)
    assert k is kx and t is tx
    U.assert_close(k, t, check_stride=True)
    # a non-leaf: its history follows, gradients as torch's
    kl, tl = U.both(np.random.default_rng(0).standard_normal(shape), requires_grad=True)
    k, t = fn(kl * 2), fn(tl * 2)
    U.assert_close(k, t, check_stride=True)
    assert k.grad_fn is not None
    U.check_backward(k, t, [(kl, tl)])
    # a leaf that requires grad: refused
    U.assert_same_error(
        lambda: fn(kiln.ones(shape, requires_grad=True)), lambda: fn(torch.ones(shape, requires_grad=True))
    )


def test_in_place_view_of_a_view_keeps_base_and_writes_through():
    base_k, base_t = kiln.zeros(2, 3), torch.zeros(2, 3)
    vk, vt = base_k[0], base_t[0]
    vk.unsqueeze_(0), vt.unsqueeze_(0)
    assert vk.shape == vt.shape == (1, 3) and vk._base is base_k
    vk.fill_(7.0), vt.fill_(7.0)
    U.assert_close(base_k, base_t)
    x = kiln.ones(3, 4, requires_grad=True)
    y = (x * 2)[1:]
    y.t_()
    (y * kiln.arange(8.0).reshape(4, 2) ** 2).sum().backward()
    tx = torch.ones(3, 4, requires_grad=True)
    ty = (tx * 2)[1:]
    ty.t_()
    (ty * torch.arange(8.0).reshape(4, 2) ** 2).sum().backward()
    U.assert_close(x.grad, tx.grad)


def test_in_place_view_errors_match_torch():
    for fn in (
        lambda L: L.ones(3, 3, 3).t_(),
        lambda L: L.ones(3, 4).transpose_(0, 2),
        lambda L: L.ones(3, 4).unsqueeze_(3),
        lambda L: L.ones(3, 4).as_strided_((2, 2), (1, 20)),
        lambda L: L.ones(3, 4).as_strided_((2, 2), (1,)),
        lambda L: L.as_strided_(L.ones(3, 4), (2, 2), (1, -1)),
    ):
        U.assert_same_error(lambda: fn(kiln), lambda: fn(torch))


def test_unfold_is_a_view_and_errors_match_torch():
    x = kiln.arange(12.0).reshape(3, 4)
    u = x.unfold(1, 2, 1)
    assert u._base is x._base and u.data_ptr() == x.data_ptr()
    u[0, 0, 0] = 100.0
    assert x[0, 0].item() == 100.0
    for fn in (
        lambda L: L.ones(3, 4).unfold(1, 5, 1),
        lambda L: L.ones(3, 4).unfold(1, -1, 1),
        lambda L: L.ones(3, 4).unfold(1, 2, 0),
        lambda L: L.ones(3, 4).unfold(1, 2, -1),
        lambda L: L.ones(3, 4).unfold(2, 2, 1),
        lambda L: L.tensor(5.0).unfold(0, 2, 1),
        lambda L: L.tensor(5.0).unfold(1, 1, 1),
        lambda L: L.zeros(0, 3).unfold(0, 1, 1),
        lambda L: L.unfold_copy(L.ones(3), 0, 4, 1),
        lambda L: L.ones(3, 4).unfold(1, 2.0, 1),  # not int-like: PyTorch's argument error
        lambda L: L.ones(3, 4).unfold(1, True, 1),
        lambda L: L.ones(3, 4).unfold(1.0, 2, 1),
    ):
        U.assert_same_error(lambda: fn(kiln), lambda: fn(torch))


def test_unfold_takes_numpy_integers_as_ints():
    # int-like arguments become ints: a NumPy step would otherwise reach the view's strides (and its NumPy array)
    args = (0, np.int64(3), np.int64(2))
    k, t = kiln.arange(12.0).unfold(*args), torch.arange(12.0).unfold(*args)
    assert k.shape == t.shape and k.stride() == t.stride()
    assert all(type(s) is int for s in (*k.shape, *k.stride()))
    U.assert_close(k.sum(), t.sum())
    U.assert_close(k, t)


@pytest.mark.parametrize(
    "start, new",
    [((6,), (2, 2)), ((6,), (3, 3)), ((2, 3), (2, 3)), ((2, 3), (6,)), ((4,), (0,)), ((0,), (2, 2)), ((6,), ())],
)
def test_resize_matches_torch(start, new):
    n = int(np.prod(start))
    for lib_args in (
        lambda L: L.arange(float(n)).reshape(start),
        lambda L: L.arange(float(n)).reshape(start[::-1]).t() if len(start) == 2 else L.arange(float(n)),
    ):
        k, t = lib_args(kiln), lib_args(torch)
        rk, rt = k.resize_(new), t.resize_(new)
        assert rk is k and rt is t and tuple(k.shape) == tuple(t.shape) and k.stride() == t.stride()
        keep = min(n, int(np.prod(new)))
        # the elements that were there stay, in storage order
        np.testing.assert_array_equal(_flat(k)[:keep], _flat(t)[:keep])
    k, t = kiln.zeros(2, 3), torch.zeros(2, 3)
    assert k.resize_as_(kiln.zeros(6)).shape == t.resize_as_(torch.zeros(6)).shape
    assert kiln.resize_as_(kiln.zeros(3), kiln.zeros(1, 2)).shape == (1, 2)


def _flat(t) -> np.ndarray:
    return U.kiln_to_np(t).reshape(-1) if isinstance(t, kiln.Tensor) else U.torch_to_np(t).reshape(-1)


def test_resize_grows_storage_keeps_prefix_and_views_see_old():
    x = kiln.arange(4.0)
    x.resize_(3, 3)
    assert x.shape == (3, 3) and x.reshape(-1)[:4].tolist() == [0.0, 1.0, 2.0, 3.0]
    x.fill_(1.0)
    assert x.sum().item() == 9.0
    v = kiln.arange(6.0)[2:]
    assert v.resize_(2).shape == (2,) and v.storage_offset() == 2 and v.tolist() == [2.0, 3.0]


def test_resize_negative_size():
    # torch's message is an accident of its size arithmetic ("numel: integer multiplication overflow")
    U.assert_same_error(
        lambda: kiln.ones(2, 3).resize_(-1),
        lambda: torch.ones(2, 3).resize_(-1),
        message="Trying to create tensor with negative dimension -1: [-1]",
    )


def test_resize_errors_match_torch():
    for fn in (
        lambda L: L.ones(2, 3, requires_grad=True).resize_(6),
        lambda L: (L.ones(2, 3, requires_grad=True) * 1).resize_(2, 3),
        lambda L: L.ones(2, 3).resize_(2, 3, memory_format=L.preserve_format),
        lambda L: L.ones(2, 3).resize_as_(1),
    ):
        U.assert_same_error(lambda: fn(kiln), lambda: fn(torch))


@pytest.mark.parametrize("layout", ("contiguous", "transposed", "strided"))
@pytest.mark.parametrize("name", ["tril_", "triu_"])
def test_tril_triu_in_place_match_torch(name, layout):
    for diagonal in (0, 1, -1, 5):
        x = U.make_pair((3, 4), layout=layout)
        U.check_op(lambda L, a: getattr(a, name)(diagonal), x, grad=False)
        U.assert_close(x.k_leaf, x.t_leaf)
        x = U.make_pair((2, 3, 3), layout=layout, requires_grad=True)
        U.check_op(lambda L, a: getattr(a * 1, name)(diagonal=diagonal), x)
    U.assert_same_error(
        lambda: getattr(kiln.ones(3, requires_grad=True), name)(),
        lambda: getattr(torch.ones(3, requires_grad=True), name)(),
    )
    U.assert_same_error(lambda: getattr(kiln.ones(3), name)(), lambda: getattr(torch.ones(3), name)())


# ---------------------------------------------------------------------------------------- errors

ERRORS = [
    lambda L: L.select_scatter(L.ones(3, 4), L.ones(4), 0, 3),
    lambda L: L.select_scatter(L.ones(3, 4), L.ones(3), 0, 1),
    lambda L: L.select_scatter(L.ones(3, 4), L.ones(1, 4), 0, 1),
    lambda L: L.select_scatter(L.tensor(1.0), L.tensor(1.0), 0, 0),
    lambda L: L.select_scatter(L.ones(3, 4), 1.0, 0, 0),
    lambda L: L.slice_scatter(L.ones(3, 4), L.ones(3, 3)),
    lambda L: L.slice_scatter(L.ones(3, 4), L.ones(3, 2), 1, 0, 4, 0),
    lambda L: L.slice_scatter(L.ones(3, 4), L.ones(3, 2), 1, 0, 4, -1),
    lambda L: L.slice_scatter(L.tensor(1.0), L.tensor(1.0)),
    lambda L: L.slice_scatter(L.ones(3, 4), L.ones(3, 4), 2),
    lambda L: L.diagonal_scatter(L.ones(3, 4), L.ones(4)),
    lambda L: L.diagonal_scatter(L.ones(3, 4), L.ones(3), 0, 0, 0),
    lambda L: L.as_strided_scatter(L.ones(3, 4), L.ones(2, 3), (2, 2), (1, 2)),
    lambda L: L.as_strided_scatter(L.ones(3, 4), L.ones(2, 2), (2, 2), (1, 20)),
    lambda L: L.diag_embed(L.ones(3, 4), 0, 0, 0),
    lambda L: L.diag_embed(L.ones(3, 4), 0, 0, 3),
    lambda L: L.diag_embed(L.tensor(1.0)),
    lambda L: L.rot90(L.ones(3, 4), 1, (0,)),
    lambda L: L.rot90(L.ones(3, 4), 1, (0, 0)),
    lambda L: L.rot90(L.ones(3, 4), 1, (0, 2)),
    lambda L: L.rot90(L.ones(3), 1),
    lambda L: L.view_copy(L.ones(3, 4), (5,)),
    lambda L: L.permute_copy(L.ones(3, 4), (0,)),
    lambda L: L.expand_copy(L.ones(3, 4), (2, 4)),
    lambda L: L.select_copy(L.ones(3, 4), 0, 5),
    lambda L: L.slice_copy(L.ones(3, 4), 1, 0, 4, 0),
    lambda L: L.split_copy(L.ones(3, 4), -1),
    lambda L: L.split_with_sizes_copy(L.ones(3, 4), [1, 1]),
    lambda L: L.unsqueeze_copy(L.ones(3, 4), 3),
    lambda L: L.t_copy(L.ones(2, 3, 4)),
    lambda L: L.transpose_copy(L.ones(3, 4), 0, 2),
    lambda L: L.diagonal_copy(L.ones(3, 4), 0, 1, 1),
    lambda L: L.unbind_copy(L.tensor(1.0)),
    lambda L: L.as_strided_copy(L.ones(3, 4), (2, 2), (1, 20)),
    lambda L: L.argwhere(1),
]


@pytest.mark.parametrize("i", range(len(ERRORS)))
def test_errors_match_torch(i):
    fn = ERRORS[i]
    exc = U.torch_error(lambda: fn(torch))
    if isinstance(exc, TypeError) and "received an invalid combination" in str(exc):
        with pytest.raises(TypeError):
            fn(kiln)
        return
    U.assert_same_error(lambda: fn(kiln), lambda: fn(torch))


def test_detach_copy_is_a_detached_copy():
    x = kiln.ones(3, requires_grad=True)
    d = kiln.detach_copy(x * 2)
    assert not d.requires_grad and d.tolist() == [2.0] * 3 and d.data_ptr() != x.data_ptr()


# ---------------------------------------------------------------------------------------- signatures


def _schema_names(name: str) -> list[list[str]]:
    return [
        ["input" if a.name == "self" else a.name for a in s.arguments if not a.kwarg_only]
        for s in torch._C._jit_get_schemas_for_operator(f"aten::{name}")
        if "out" not in s.overload_name
    ]


@pytest.mark.parametrize(
    "name",
    [
        "select_scatter",
        "slice_scatter",
        "diagonal_scatter",
        "as_strided_scatter",
        "diag_embed",
        "diagflat",
        "rot90",
        "permute_copy",
        "expand_copy",
        "select_copy",
        "slice_copy",
        "split_copy",
        "split_with_sizes_copy",
        "unsqueeze_copy",
        "t_copy",
        "transpose_copy",
        "diagonal_copy",
        "unbind_copy",
        "unfold_copy",
        "detach_copy",
        "alias_copy",
        "as_strided_copy",
        "put",
        "index_reduce",
        "argwhere",
    ],
)
def test_function_parameters_are_torch_schema_names(name):
    params = [
        p.name for p in inspect.signature(getattr(kiln, name)).parameters.values() if p.kind.name != "KEYWORD_ONLY"
    ]
    assert params in _schema_names(name)


def test_method_signatures():
    for name in (
        "put_",
        "index_reduce_",
        "fill_diagonal_",
        "t_",
        "transpose_",
        "swapaxes_",
        "swapdims_",
        "unsqueeze_",
        "as_strided_",
        "resize_as_",
    ):
        (schema, *_) = [
            s for s in torch._C._jit_get_schemas_for_operator(f"aten::{name}") if "out" not in s.overload_name
        ]
        names = ["self" if a.name == "self" else a.name for a in schema.arguments if not a.kwarg_only]
        params = [
            p.name
            for p in inspect.signature(getattr(kiln.Tensor, name)).parameters.values()
            if p.kind.name != "KEYWORD_ONLY"
        ]
        if name in ("as_strided_", "resize_as_"):
            params[0] = "self"  # also kiln.as_strided_(input, ...), as torch's top-level function
        assert params == names, name
    assert "include_self" in inspect.signature(kiln.index_reduce).parameters
    assert inspect.signature(kiln.index_reduce).parameters["include_self"].kind.name == "KEYWORD_ONLY"
    assert list(inspect.signature(kiln.Tensor.unfold).parameters) == ["self", "dimension", "size", "step"]
    assert inspect.signature(kiln.Tensor.squeeze_).parameters["dim"].default is None
