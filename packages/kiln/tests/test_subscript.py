"""``Tensor.__getitem__``/``__setitem__`` against PyTorch: every kind of key component (ints, slices with
steps, ``None``, ``...``, Python bools, integer tensors, lists, NumPy arrays, boolean masks) and their
combinations, forward values, gradients, writes (views, ``index_put_``, autograd through writes) and
error types and messages."""

# ruff: noqa: B023 - lambdas made inside loops are called within the same iteration

from __future__ import annotations

import warnings

import kiln_testutil as U
import numpy as np
import pytest
import torch

import kiln


def _key(lib, key):
    """The key for ``lib``: ``("T", values)`` entries become that library's int64 tensors, ``("M", values)``
    boolean masks; everything else is passed as it is."""

    def conv(k):
        if isinstance(k, tuple) and len(k) == 2 and k[0] in ("T", "M"):
            return lib.tensor(k[1], dtype=lib.int64 if k[0] == "T" else lib.bool)
        return k

    if isinstance(key, tuple) and not (len(key) == 2 and key[0] in ("T", "M")):
        return tuple(conv(k) for k in key)
    return conv(key)


# keys into a (3, 4, 5) tensor
KEYS = {
    "int-tensor": ("T", [0, 2]),
    "list": [0, 2, 2],
    "empty-list": [],
    "range": range(2),
    "ndarray": np.array([2, 0]),
    "negative": ("T", [-1, -3]),
    "2-d index": ("T", [[0, 1], [2, 0]]),
    "0-d int tensor": ("T", 1),
    "dim1": (slice(None), ("T", [1, 3])),
    "int then tensor": (0, slice(None), ("T", [1, 2])),
    "two tensors, split": (("T", [0, 1]), slice(None), ("T", [1, 2])),
    "two tensors, adjacent": (slice(None), ("T", [0, 1]), ("T", [1, 2])),
    "broadcast tensors": (("T", [0, 1]), ("T", [[0], [1], [2]])),
    "ellipsis": (Ellipsis, ("T", [0, 4])),
    "None before": (None, ("T", [0, 1])),
    "None after": (("T", [0, 1]), None),
    "None between": (("T", [0, 1]), None, ("T", [1, 2])),
    "ellipsis between": (("T", [0, 1]), Ellipsis, ("T", [1, 2])),
    "None slice adjacent": (slice(None), None, ("T", [0, 1]), ("T", [1, 2])),
    "tensor then int": (("T", [0, 1]), 1),
    "stepped slice": (slice(None, None, 2), ("T", [3, 0]), slice(1, None, 2)),
    "True": True,
    "False": False,
    "0-d mask": ("M", True),
    "mask 1-d": ("M", [True, False, True]),
    "mask 2-d": ("M", [[True, False, True, True], [False] * 4, [True] * 4]),
    "mask 3-d": ("M", np.arange(60).reshape(3, 4, 5) % 3 == 0),
    "mask after slice": (slice(1, None), ("M", [True, False, True, True])),
    "mask slice tensor": (("M", [True, False, True]), slice(1, None), ("T", [1, 2])),
    "mask and tensor": (("T", [0]), ("M", np.ones((4, 5), bool))),
    "all false mask": ("M", [False, False, False]),
    "list of bools": [True, False, True],
}


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
@pytest.mark.parametrize("name", list(KEYS))
def test_getitem_matches_torch(name, layout):
    key = KEYS[name]
    x = U.make_pair((3, 4, 5), kiln.float64, layout=layout, requires_grad=True)
    k_out, t_out = U.check_op(lambda L, a: a[_key(L, key)], x)
    assert k_out is not None, "torch accepted the key, so kiln must"
    if t_out.grad_fn is not None:
        assert k_out.grad_fn.name() == t_out.grad_fn.name()


def test_advanced_result_is_a_copy_and_basic_a_view():
    x = kiln.arange(12.0).reshape(3, 4).clone()
    assert x[1:, ::2]._base is x
    y = x[kiln.tensor([0, 2])]
    y[0, 0] = 100.0
    assert x[0, 0].item() == 0.0


def test_gradient_accumulates_over_repeated_indices():
    k = kiln.ones(3, 4, dtype=kiln.float64, requires_grad=True)
    t = torch.ones(3, 4, dtype=torch.float64, requires_grad=True)
    (k[[0, 0, 2], 1:] * 2).sum().backward()
    (t[[0, 0, 2], 1:] * 2).sum().backward()
    U.assert_close(k.grad, t.grad)


def test_gradcheck_and_gradgradcheck():
    x = kiln.randn(3, 4, 5, dtype=kiln.float64, requires_grad=True)
    idx = kiln.tensor([[0, 2], [1, 1]])
    mask = kiln.tensor([True, False, True, True])

    def f(a):
        return a[idx, 1:, [0, 3]] * a[:, mask].sum()

    assert kiln.autograd.gradcheck(f, (x,))
    assert kiln.autograd.gradgradcheck(f, (x,))


def test_non_tuple_sequence_warns_and_reads_as_tuple():
    k = kiln.arange(60.0).reshape(3, 4, 5)
    t = torch.arange(60.0).reshape(3, 4, 5)
    with pytest.warns(UserWarning, match="non-tuple sequence"):
        out = k[[[0, 1], [1, 2]]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        U.assert_close(out, t[[[0, 1], [1, 2]]])


# ---------------------------------------------------------------------------------------- errors

ERROR_KEYS = {
    "out of range": [5],
    "negative out of range": (slice(None), ("T", [-5])),
    "float tensor": ("F", [1.0]),
    "no broadcast": (("T", [0, 1]), slice(None), ("T", [1, 2, 3])),
    "mask shape": ("M", np.ones((4, 5), bool)),
    "mask after slice": (slice(1, None), ("M", [True, False, True])),
    "mask later dim": (slice(None), ("M", np.ones((4, 4), bool))),
    "mask and tensor broadcast": (("M", np.ones((3, 4), bool)), ("T", [1, 2])),
    "too many": (0, 0, 0, ("T", [0])),
    "out of range, second tensor": (slice(None), ("T", [0]), ("T", [9])),
    "out of range after int": (0, ("T", [0]), ("T", [7])),
}


def _error_key(lib, key):
    if isinstance(key, tuple) and key and key[0] == "F":
        return lib.tensor(key[1])
    return _key(lib, key)


@pytest.mark.parametrize("name", list(ERROR_KEYS))
def test_getitem_errors_match_torch(name):
    key = ERROR_KEYS[name]
    k, t = kiln.zeros(3, 4, 5), torch.zeros(3, 4, 5)
    U.assert_same_error(lambda: k[_error_key(kiln, key)], lambda: t[_error_key(torch, key)])


def test_0d_tensor_errors():
    k, t = kiln.tensor(1.0), torch.tensor(1.0)
    U.assert_same_error(lambda: k[kiln.tensor(0)], lambda: t[torch.tensor(0)])
    U.assert_close(k[True], t[True])


# ---------------------------------------------------------------------------------------- __setitem__

SET_CASES = {
    "int tensor, broadcast row": (("T", [0, 2]), (4, 5)),
    "int tensor, full": (("T", [0, 2]), (2, 4, 5)),
    "repeated index": (("T", [1, 1]), (2, 4, 5)),
    "split tensors": ((("T", [0, 1]), slice(None), ("T", [1, 2])), (2, 4)),
    "int then tensor": ((0, slice(None), ("T", [1, 2])), (4, 2)),
    "adjacent after slice": ((slice(None), ("T", [0, 1]), ("T", [1, 2])), (3, 2)),
    "mask": (("M", np.arange(60).reshape(3, 4, 5) % 7 == 0), (9,)),
    "mask scalar-shaped value": (("M", [True, False, True]), (1,)),
    "mask after slice": ((slice(1, None), ("M", [True, False, True, True])), (2, 3, 5)),
    "ellipsis then list": ((Ellipsis, [0, 4]), (3, 4, 1)),
    "True": (True, (3, 4, 5)),
}


@pytest.mark.parametrize("name", list(SET_CASES))
def test_setitem_tensor_value_matches_torch(name):
    key, vshape = SET_CASES[name]
    for layout in ("contiguous", "transposed"):
        base = U.make_pair((3, 4, 5), kiln.float64, layout=layout, requires_grad=True)
        val = U.make_pair(vshape, kiln.float64, requires_grad=True, seed=3)

        def f(L, a, v):
            a = a * 1  # not a leaf: writes are recorded
            a[_key(L, key)] = v
            return a

        k_out, t_out = U.check_op(f, base, val)
        assert k_out.grad_fn.name().split("::")[-1] == t_out.grad_fn.name().split("::")[-1]


@pytest.mark.parametrize("value", [7, 2.5, True, np.float64(-1.5)])
def test_setitem_scalar_casts_to_the_tensor_dtype(value):
    for dtype in (kiln.float32, kiln.int64):
        k = kiln.zeros(3, 4, dtype=dtype)
        t = torch.zeros(3, 4, dtype=U.K2T[dtype])
        k[kiln.tensor([0, 2]), 1:] = value
        t[torch.tensor([0, 2]), 1:] = value
        U.assert_close(k, t)


def test_setitem_writes_through_a_view():
    k = kiln.zeros(3, 4, 5)
    t = torch.zeros(3, 4, 5)
    kv, tv = k[1:], t[1:]
    kv[kiln.tensor([0, 1]), 2] = 5.0
    tv[torch.tensor([0, 1]), 2] = 5.0
    U.assert_close(k, t)


def test_setitem_errors_match_torch():
    k, t = kiln.zeros(3, 4, 5), torch.zeros(3, 4, 5)
    cases = [
        ((("T", [0, 1]), slice(None), ("T", [1, 2])), lambda L: L.zeros(4, 2)),  # value does not broadcast
        ((("T", [0, 1]),), lambda L: L.zeros(4, 5, dtype=L.int64)),  # dtype mismatch
        ("M", lambda L: L.zeros(2)),  # mask result of 9 elements
    ]
    for key, val in cases:
        if key == "M":
            U.assert_same_error(lambda: k.__setitem__(k > -1, val(kiln)), lambda: t.__setitem__(t > -1, val(torch)))
            continue
        U.assert_same_error(
            lambda: k.__setitem__(_key(kiln, key), val(kiln)), lambda: t.__setitem__(_key(torch, key), val(torch))
        )
    leaf_k = kiln.zeros(3, requires_grad=True)
    leaf_t = torch.zeros(3, requires_grad=True)
    U.assert_same_error(lambda: leaf_k.__setitem__([0], 1.0), lambda: leaf_t.__setitem__([0], 1.0))
    U.assert_same_error(lambda: k.__setitem__([0], [1.0]), lambda: t.__setitem__([0], [1.0]))


def test_setitem_gradcheck():
    v = kiln.randn(2, 5, dtype=kiln.float64, requires_grad=True)
    x = kiln.randn(3, 4, 5, dtype=kiln.float64, requires_grad=True)

    def f(a, b):
        a = a.clone()
        a[[0, 2], 1] = b * b
        return a

    assert kiln.autograd.gradcheck(f, (x, v))
    assert kiln.autograd.gradgradcheck(f, (x, v))


def _set(x, key, value):
    x[key] = value
    return x


# name -> fn(lib, x) for a byte mask (uint8): deprecated where PyTorch indexes with it, refused where it fills
BYTE_MASK_CASES = {
    "getitem": lambda L, x, m: x[m],
    "getitem with an int": lambda L, x, m: x.reshape(2, 3)[m[:2], 1],
    "setitem of values": lambda L, x, m: _set(x.clone(), m, L.tensor([7.0, 8.0, 9.0])),
    "index_put_ accumulating a 0-d value": lambda L, x, m: x.clone().index_put_((m,), L.tensor(5.0), True),
    "setitem of a number": lambda L, x, m: _set(x.clone(), m, 7.0),
    "setitem of a 0-d tensor": lambda L, x, m: _set(x.clone(), m, L.tensor(7.0)),
    "index_put of a 0-d value": lambda L, x, m: x.index_put((m,), L.tensor(5.0)),
    "setitem of one value after a whole dim": lambda L, x, m: _set(x.clone().reshape(2, 3), (slice(None), m[:3]), 7.0),
    "setitem of a one-element tensor": lambda L, x, m: _set(x.clone(), m, L.tensor([7.0])),
    "setitem of a number with an int": lambda L, x, m: _set(x.clone().reshape(3, 2), (m[:3], 1), 7.0),
    "setitem of a row of values": lambda L, x, m: _set(x.clone().reshape(3, 2), m[:3], L.tensor([[7.0, 8.0]])),
}


@pytest.mark.parametrize("case", list(BYTE_MASK_CASES))
def test_a_byte_mask_is_deprecated_and_does_not_fill(case):
    """A uint8 mask indexes with PyTorch's deprecation warning, and a lone one with a 0-d value (PyTorch's
    ``masked_fill_``) raises PyTorch's error, with no warning first."""
    results = []
    for lib in (kiln, torch):
        x = lib.arange(6.0)
        m = lib.tensor([1, 0, 1, 0, 0, 1], dtype=lib.uint8)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                out = BYTE_MASK_CASES[case](lib, x, m)
            except RuntimeError as exc:
                out = str(exc)
        warned = {str(w.message).split(" (Triggered")[0].replace("torch.", "kiln.") for w in caught}
        results.append((out if isinstance(out, str) else out.tolist(), warned))
    assert results[0] == results[1]
