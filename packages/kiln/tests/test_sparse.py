"""Sparse COO tensors against PyTorch: construction, attributes, coalesce, to_dense/to_sparse, repr, the
layout objects, conversions, and the errors (bad indices, sizes, dtypes; every dense op given a sparse
tensor). The operations (products, sums, softmax, elementwise, gradients, a GCN) are in test_sparse_ops.py.

kiln checks the invariants (indices in range) by default; PyTorch only under ``check_invariants=True``,
so kiln's errors are compared with PyTorch's checked ones.
"""

from __future__ import annotations

import copy
import pickle

import kiln_testutil as U
import numpy as np
import pytest
import torch

import kiln

pytestmark = pytest.mark.filterwarnings("ignore:Sparse invariant checks:UserWarning")

# indices with duplicates and out of order, as user code builds them
IDX = [[0, 1, 1, 0, 2], [2, 0, 2, 2, 1]]
VAL = [3.0, 4.0, 5.0, 1.0, -2.0]


def pair(indices, values, size=None, **kw):
    """The same sparse tensor in kiln and in torch."""
    i = np.asarray(indices, dtype=np.int64)
    v = np.asarray(values)
    tkw = {k: U.K2T[x] if k == "dtype" else x for k, x in kw.items()}
    sizes = () if size is None else (size,)  # torch refuses size=None
    k = kiln.sparse_coo_tensor(kiln.tensor(i), kiln.tensor(v), *sizes, **kw)
    t = torch.sparse_coo_tensor(torch.from_numpy(i), torch.from_numpy(v.copy()), *sizes, **tkw)
    return k, t


def random_sparse(shape, nnz, sparse_dim=None, dtype=np.float64, seed=0, dup=True):
    """(indices, values) of a random sparse tensor of ``shape`` (duplicates likely when ``dup``)."""
    rng = U.rng_for(seed)
    sd = len(shape) if sparse_dim is None else sparse_dim
    idx = np.stack([rng.integers(0, n, nnz) for n in shape[:sd]]) if sd else np.zeros((0, nnz), np.int64)
    if not dup and nnz:
        lin = np.unique(np.ravel_multi_index(idx, shape[:sd]))
        idx = np.stack(np.unravel_index(rng.permutation(lin), shape[:sd]))
    vals = rng.standard_normal((idx.shape[1], *shape[sd:])).astype(dtype)
    return idx.astype(np.int64), vals


def same_sparse(k, t, tol=1e-12):
    """kiln's sparse ``k`` equals torch's ``t``: size, dims, dtype, and the coalesced indices and values."""
    assert isinstance(k, kiln.Tensor) and k.is_sparse and k.layout is kiln.sparse_coo
    assert tuple(k.shape) == tuple(t.shape)
    assert (k.sparse_dim(), k.dense_dim()) == (t.sparse_dim(), t.dense_dim())
    assert k.dtype is U.T2K[t.dtype]
    kc, tc = k.coalesce(), t.detach().coalesce()
    np.testing.assert_array_equal(kc.indices().numpy(), tc.indices().numpy())
    np.testing.assert_allclose(U.kiln_to_np(kc.values()), U.torch_to_np(tc.values()), rtol=tol, atol=tol)


def same_dense(k, t, tol=1e-12):
    assert isinstance(k, kiln.Tensor) and not k.is_sparse
    assert tuple(k.shape) == tuple(t.shape) and k.dtype is U.T2K[t.dtype]
    np.testing.assert_allclose(U.kiln_to_np(k), U.torch_to_np(t), rtol=tol, atol=tol)


# ---------------------------------------------------------------------------------------- layouts


def test_layout_objects_and_dense_attributes():
    assert repr(kiln.strided) == "kiln.strided" and repr(kiln.sparse_coo) == "kiln.sparse_coo"
    assert isinstance(kiln.sparse_coo, kiln.layout) and isinstance(kiln.strided, kiln.layout)
    assert kiln.ones(2).layout is kiln.strided and kiln.ones(2).is_sparse is False
    assert pickle.loads(pickle.dumps(kiln.sparse_coo)) is kiln.sparse_coo
    with pytest.raises(TypeError):
        kiln.layout()
    x, tx = U.both(np.ones((2, 3)))
    assert x.to_dense() is x and (x.sparse_dim(), x.dense_dim()) == (tx.sparse_dim(), tx.dense_dim())
    for name in ("coalesce", "indices", "values", "is_coalesced", "_nnz", "_values", "_indices"):
        exc = U.torch_error(getattr(tx, name))
        with pytest.raises(type(exc)) as info:
            getattr(x, name)()
        assert str(exc).split(". ")[0].split(" backend")[0] in str(info.value)


# ---------------------------------------------------------------------------------------- construction


@pytest.mark.parametrize(
    "indices, values, size",
    [
        (IDX, VAL, (3, 3)),
        (IDX, VAL, None),
        (IDX, VAL, (4, 5)),
        ([[0, 2, 1]], [1.0, 2.0, 3.0], (4,)),
        (IDX, np.arange(10.0).reshape(5, 2), (3, 3, 2)),
        (IDX, np.arange(10.0).reshape(5, 2), None),
        (np.zeros((2, 0)), np.zeros(0), (2, 3)),
        (np.zeros((2, 0)), np.zeros(0), None),
        (np.zeros((2, 0)), np.zeros((0, 4)), None),
        (np.zeros((0, 1)), np.ones((1, 3)), None),
        ([[0], [1]], [7.0], None),
    ],
    ids=[
        "dup",
        "nosize",
        "bigger",
        "1d",
        "hybrid",
        "hybrid-nosize",
        "empty",
        "empty-nosize",
        "empty-hybrid",
        "no-sparse-dim",
        "one",
    ],
)
def test_construction_matches_torch(indices, values, size):
    k, t = pair(indices, values, size)
    assert tuple(k.shape) == tuple(t.shape)
    assert (k._nnz(), k.sparse_dim(), k.dense_dim()) == (t._nnz(), t.sparse_dim(), t.dense_dim())
    assert k.is_coalesced() == t.is_coalesced()
    np.testing.assert_array_equal(k._indices().numpy(), t._indices().numpy())
    np.testing.assert_array_equal(k._values().numpy(), t._values().numpy())
    same_sparse(k, t)
    same_dense(k.to_dense(), t.to_dense())
    assert isinstance(k, kiln.Tensor) and kiln.is_tensor(k) and k.is_sparse
    assert (k.dim(), k.ndim, k.numel(), k.dtype, k.device) == (t.dim(), t.ndim, t.numel(), kiln.float64, k.device)


def test_construction_inputs_dtypes_and_devices():
    # lists, numpy arrays, float and int32 indices (converted to int64), a 0-d value for one entry
    for indices, values in (
        ([[0, 1], [1, 0]], [1.0, 2.0]),
        (np.array([[0, 1], [1, 0]]), np.array([1.0, 2.0])),
        ([[0, 1], [1, 0]], [1, 2]),
    ):
        k = kiln.sparse_coo_tensor(indices, values)
        t = torch.sparse_coo_tensor(indices, values)
        same_sparse(k, t)
    for conv in (lambda i: i.float(), lambda i: i.int()):
        k = kiln.sparse_coo_tensor(conv(kiln.tensor(IDX)), kiln.tensor(VAL), (3, 3))
        t = torch.sparse_coo_tensor(conv(torch.tensor(IDX)), torch.tensor(VAL), (3, 3))
        assert k._indices().dtype is kiln.int64
        same_sparse(k, t)
    k = kiln.sparse_coo_tensor([[0], [1]], kiln.tensor(5.0))
    same_sparse(k, torch.sparse_coo_tensor([[0], [1]], torch.tensor(5.0)))
    for dtype in (kiln.float64, kiln.int64, kiln.float16):
        k, t = pair(IDX, VAL, (3, 3), dtype=dtype)
        assert k.dtype is dtype and k._values().dtype is dtype
        same_sparse(k, t, tol=1e-3)
    k = kiln.sparse_coo_tensor(IDX, VAL, kiln.Size([3, 3]), device="cpu")
    assert k.device == kiln.device("cpu") and k.shape == kiln.Size([3, 3])


def test_values_are_aliased_like_torch():
    v = kiln.tensor(VAL)
    k = kiln.sparse_coo_tensor(IDX, v, (3, 3))
    v[0] = 100.0
    assert k._values()[0].item() == 100.0
    k.requires_grad_()  # the sparse tensor's values are an object of its own: the caller's keeps its flag
    assert k.requires_grad and not v.requires_grad


def test_coalesced_flag():
    assert pair([[0], [1]], [1.0])[0].is_coalesced()
    assert pair(np.zeros((2, 0)), np.zeros(0), (2, 2))[0].is_coalesced()
    assert not pair([[0, 1], [0, 1]], [1.0, 2.0])[0].is_coalesced()
    k, t = pair([[0, 1], [0, 1]], [1.0, 2.0], is_coalesced=True)
    assert k.is_coalesced() and t.is_coalesced()
    k.indices()  # allowed once coalesced


BAD_CONSTRUCTIONS = {
    "1d-indices": ([0, 1, 2], VAL[:3], None),
    "3d-indices": ([IDX], VAL, None),
    "nnz-mismatch": (IDX, VAL[:2], (3, 3)),
    "nnz-mismatch-scalar": (IDX, 5.0, (3, 3)),
    "negative-nosize": ([[0, -1]], [1.0, 2.0], None),
    "size-too-long": (IDX, VAL, (3, 3, 4)),
    "size-too-short": (IDX, VAL, (3,)),
    "dense-size": (IDX, np.ones((5, 2)), (3, 3, 5)),
}


@pytest.mark.parametrize("name", list(BAD_CONSTRUCTIONS))
def test_construction_errors_match_torch(name):
    indices, values, size = BAD_CONSTRUCTIONS[name]
    sizes = () if size is None else (size,)
    U.assert_same_error(
        lambda: kiln.sparse_coo_tensor(kiln.tensor(indices), kiln.tensor(values), *sizes),
        lambda: torch.sparse_coo_tensor(torch.tensor(indices), torch.tensor(values), *sizes),
        exact=True,
    )


@pytest.mark.parametrize(
    "indices, size",
    [(IDX, (3, 2)), (IDX, (2, 3)), ([[0, -1], [0, 0]], (2, 2)), ([[0, 5]], (2,))],
    ids=["col-out", "row-out", "negative", "1d-out"],
)
def test_invariants_are_checked_by_default(indices, size):
    values = [1.0] * len(indices[0])
    U.assert_same_error(
        lambda: kiln.sparse_coo_tensor(indices, values, size),
        lambda: torch.sparse_coo_tensor(indices, values, size, check_invariants=True),
        exact=True,
    )
    # and even with check_invariants=False (PyTorch's default, which builds it): an index out of range would
    # alias another position of the dense tensor
    with pytest.raises(RuntimeError, match=r"negative index|inconsistent"):
        kiln.sparse_coo_tensor(indices, values, size, check_invariants=False)


def test_is_coalesced_true_is_checked():
    U.assert_same_error(
        lambda: kiln.sparse_coo_tensor([[1, 0], [0, 0]], [1.0, 2.0], (2, 3), is_coalesced=True),
        lambda: torch.sparse_coo_tensor([[1, 0], [0, 0]], [1.0, 2.0], (2, 3), is_coalesced=True, check_invariants=True),
        exact=True,
    )
    # duplicates are not coalesced either
    with pytest.raises(RuntimeError, match="uncoalesced"):
        kiln.sparse_coo_tensor([[0, 0]], [1.0, 2.0], (2,), is_coalesced=True)


def test_hostile_sizes_and_types():
    U.assert_same_error(
        lambda: kiln.sparse_coo_tensor(IDX, VAL, (3, 3.0)),
        lambda: torch.sparse_coo_tensor(IDX, VAL, (3, 3.0)),
    )
    with pytest.raises(TypeError):
        kiln.sparse_coo_tensor(IDX, VAL, "ab")
    with pytest.raises(TypeError):
        kiln.sparse_coo_tensor(IDX, VAL, 3)
    with pytest.raises(RuntimeError):  # torch: "numel: integer multiplication overflow"
        kiln.sparse_coo_tensor(IDX, VAL, (3, -3))
    U.assert_same_error(
        lambda: kiln.sparse_coo_tensor(IDX, VAL, (3, 3), dtype=kiln.int64, requires_grad=True),
        lambda: torch.sparse_coo_tensor(IDX, VAL, (3, 3), dtype=torch.int64, requires_grad=True),
        message="only Tensors of floating point",
    )
    with pytest.raises(TypeError):
        kiln.sparse_coo_tensor(pair(IDX, VAL)[0], VAL)
    with pytest.raises(TypeError):
        kiln.sparse_coo_tensor(IDX, VAL, (3, 3), layout=kiln.sparse_coo)
    with pytest.raises(RuntimeError, match="more positions than int64"):
        kiln.sparse_coo_tensor([[0, 1], [0, 0], [0, 0]], [1.0, 2.0], (2**40, 2**40, 2**40)).coalesce()


# ---------------------------------------------------------------------------------------- accessors


def test_accessors_and_coalesced_checks():
    k, t = pair(IDX, VAL, (3, 3))
    for name in ("indices", "values"):
        U.assert_same_error(getattr(k, name), getattr(t, name), exact=True)
    assert (k._nnz(), k.sparse_dim(), k.dense_dim(), len(k), k.size(-1)) == (5, 2, 0, 3, 3)
    assert k.shape == kiln.Size([3, 3]) and k.size() == kiln.Size([3, 3])
    assert not k.is_contiguous() and k.is_leaf and not k.requires_grad
    with pytest.raises(IndexError):
        k.size(2)
    c = k.coalesce()
    assert c.is_coalesced() and c.coalesce() is c
    np.testing.assert_array_equal(c.indices().numpy(), t.coalesce().indices().numpy())
    U.assert_same_error(lambda: k.nbytes, lambda: t.nbytes, exact=True)
    assert k.type() == "kiln.sparse.DoubleTensor" and t.type() == "torch.sparse.DoubleTensor"
    assert k.element_size() == 8 and k.is_floating_point()


# ---------------------------------------------------------------------------------------- coalesce, to_dense


@pytest.mark.parametrize(
    "shape, nnz, sparse_dim",
    [
        ((5, 4), 30, None),
        ((3, 4, 2), 10, None),
        ((6, 3), 12, 1),
        ((4, 3, 2), 9, 2),
        ((7,), 20, None),
        ((0, 3), 0, None),
    ],
)
def test_coalesce_and_to_dense_match_torch(shape, nnz, sparse_dim):
    idx, vals = random_sparse(shape, nnz, sparse_dim)
    k, t = pair(idx, vals, shape)
    kc, tc = k.coalesce(), t.coalesce()
    assert kc.is_coalesced() and kc._nnz() == tc._nnz()
    np.testing.assert_array_equal(kc.indices().numpy(), tc.indices().numpy())
    np.testing.assert_allclose(kc.values().numpy(), tc.values().numpy(), rtol=1e-12, atol=1e-12)
    same_dense(k.to_dense(), t.to_dense())
    U.assert_same_error(lambda: k.to_dense(kiln.float32), lambda: t.to_dense(torch.float32), exact=True)


def test_integer_and_bool_values():
    k, t = pair(IDX, [1, 2, 3, 4, 5], (3, 3))
    same_dense(k.to_dense(), t.to_dense())
    same_sparse(k.coalesce(), t.coalesce())
    k, t = pair(IDX, [True, False, True, True, False], (3, 3))
    same_dense(k.to_dense(), t.to_dense())


# ---------------------------------------------------------------------------------------- to_sparse


@pytest.mark.parametrize("sparse_dim", [None, 1, 2, 3])
def test_to_sparse_matches_torch(sparse_dim):
    rng = U.rng_for(1)
    a = rng.standard_normal((4, 3, 2)) * (rng.random((4, 3, 2)) < 0.4)
    a[1] = 0.0
    x, tx = U.both(a)
    args = () if sparse_dim is None else (sparse_dim,)
    k, t = x.to_sparse(*args), tx.to_sparse(*args)
    assert k.is_coalesced() and t.is_coalesced()
    np.testing.assert_array_equal(k.indices().numpy(), t.indices().numpy())
    np.testing.assert_array_equal(k.values().numpy(), t.values().numpy())
    same_dense(k.to_dense(), tx)
    same_sparse(x.to_sparse_coo(), tx.to_sparse_coo())
    assert k.to_sparse() is k


def test_to_sparse_edge_cases_and_errors():
    for a in (np.array(3.0), np.array(0.0), np.zeros((2, 0)), np.array([[0.0, np.nan], [0.0, 0.0]])):
        x, tx = U.both(a)
        k, t = x.to_sparse(), tx.to_sparse()
        np.testing.assert_array_equal(k.indices().numpy(), t.indices().numpy())
        assert k.values().shape == t.values().shape and tuple(k.shape) == tuple(t.shape)
    x, tx = U.both(np.ones((2, 2)))
    for bad in (3, 0, -1):
        U.assert_same_error(lambda b=bad: x.to_sparse(b), lambda b=bad: tx.to_sparse(b), exact=True)
    assert x.to_sparse(dense_dim=1).sparse_dim() == tx.to_sparse(dense_dim=1).sparse_dim() == 1
    assert x.to_sparse(layout=kiln.sparse_coo).is_sparse
    with pytest.raises(NotImplementedError):
        x.to_sparse(layout=kiln.strided)
    with pytest.raises(RuntimeError):
        x.to_sparse(blocksize=(1, 1))
    k = x.to_sparse()
    U.assert_same_error(lambda: k.to_sparse(1), lambda: tx.to_sparse().to_sparse(1), exact=True)
    bools, tbools = U.both(np.array([[True, False], [False, True]]))
    same_sparse(bools.to_sparse(), tbools.to_sparse())


def test_round_trip_and_gradient_through_to_sparse():
    a = np.array([[0.0, 1.5], [-2.0, 0.0], [0.0, 0.0]])
    x, tx = U.both(a, requires_grad=True)
    kiln.sparse.sum(x.to_sparse()).backward()
    torch.sparse.sum(tx.to_sparse()).backward()
    same_dense(x.grad, tx.grad)
    y, ty = U.both(a, requires_grad=True)
    w, tw = U.both(np.arange(6.0).reshape(3, 2))
    (y.to_sparse().to_dense() * w).sum().backward()
    (ty.to_sparse().to_dense() * tw).sum().backward()
    same_dense(y.grad, ty.grad)


# ---------------------------------------------------------------------------------------- repr


@pytest.mark.parametrize(
    "make",
    [
        lambda lib: lib.sparse_coo_tensor(IDX, VAL, (3, 3)),
        lambda lib: lib.sparse_coo_tensor(IDX, VAL, (3, 3), dtype=lib.float64),
        lambda lib: lib.sparse_coo_tensor(IDX, VAL, (3, 3), requires_grad=True),
        lambda lib: lib.sparse_coo_tensor(IDX, [1, 2, 3, 4, 5], (3, 3)),
        lambda lib: lib.sparse_coo_tensor(IDX, [1, 2, 3, 4, 5], (3, 3), dtype=lib.int32),
        lambda lib: lib.sparse_coo_tensor(lib.zeros(2, 0, dtype=lib.int64), lib.zeros(0), (2, 3)),
        lambda lib: lib.sparse_coo_tensor(lib.zeros(2, 0, dtype=lib.int64), lib.zeros(0, 2), (2, 3, 2)),
        lambda lib: lib.sparse_coo_tensor(IDX, lib.arange(10.0).reshape(5, 2) / 3, (3, 3, 2)),
        lambda lib: lib.sparse_coo_tensor([[0, 1]], [1e-8, 1e6], (2,)),
        lambda lib: lib.sparse_coo_tensor(
            lib.arange(1200).reshape(1, 1200) % 7, lib.arange(1200.0), (7,), dtype=lib.float64
        ),
        lambda lib: lib.sparse_coo_tensor(lib.arange(60).reshape(2, 30), lib.arange(30.0) * 1000.5, (60, 60)),
        lambda lib: lib.ones(3, 4).to_sparse(),
    ],
)
def test_repr_matches_torch(make):
    assert repr(make(kiln)) == repr(make(torch)).replace("torch.", "kiln.")
    assert str(make(kiln)) == f"{make(kiln)}"


# ---------------------------------------------------------------------------------------- conversions


def test_conversions_and_copies():
    k, t = pair(IDX, VAL, (3, 3))
    for conv in (
        lambda s: s.to(torch.float32 if isinstance(s, torch.Tensor) else kiln.float32),
        lambda s: s.float(),
        lambda s: s.double(),
        lambda s: s.long(),
        lambda s: s.half(),
    ):
        same_sparse(conv(k), conv(t), tol=1e-3)
    assert k.to(kiln.float64) is k and k.double() is k and k.cpu() is k
    assert k.to(kiln.float64, copy=True) is not k
    assert k.to(kiln.float32).is_coalesced() == t.to(torch.float32).is_coalesced()
    for c in (k.clone(), copy.deepcopy(k), pickle.loads(pickle.dumps(k)), k.detach(), k.data):
        same_sparse(c, t)
        assert c.is_sparse and c.is_coalesced() == k.is_coalesced()
    g = kiln.sparse_coo_tensor(IDX, VAL, (3, 3), requires_grad=True)
    p = pickle.loads(pickle.dumps(g))
    assert p.requires_grad and p.is_leaf and not g.detach().requires_grad
    assert copy.deepcopy(g).requires_grad
    with pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy(g * 2)
    z, tz = k.new_zeros(4, 2), t.new_zeros(4, 2)
    same_sparse(z, tz)
    same_sparse(k.new_empty((2,)), t.new_empty((2,)))
    for name in ("new_ones", "new_full"):
        args = ((2,), 1.0) if name == "new_full" else (2,)
        exc = U.torch_error(lambda n=name, a=args: getattr(t, n)(*a))
        with pytest.raises(type(exc)):
            getattr(k, name)(*args)


def test_requires_grad_and_detach():
    k, t = pair(IDX, VAL, (3, 3))
    assert k.requires_grad_() is k and k.requires_grad and k.is_leaf and k.grad is None
    t.requires_grad_()
    assert repr(k) == repr(t).replace("torch.", "kiln.")
    k.requires_grad = False
    assert not k.requires_grad
    v = kiln.tensor(VAL, requires_grad=True)
    s = kiln.sparse_coo_tensor(IDX, v * 2, (3, 3))
    assert s.requires_grad and not s.is_leaf and s.grad_fn is not None
    U.assert_same_error(
        lambda: s.requires_grad_(False),
        lambda: torch.sparse_coo_tensor(IDX, torch.tensor(VAL, requires_grad=True) * 2, (3, 3)).requires_grad_(False),
    )
    d = s.detach()
    assert not d.requires_grad and s.requires_grad
    assert s.detach_() is s and s.is_leaf and not s.requires_grad
    with pytest.raises(RuntimeError):  # a sparse tensor's data must stay sparse
        k.data = kiln.ones(3, 3)
    k.data = pair(IDX[:1], VAL, (4,))[0]
    assert k.shape == kiln.Size([4]) and k._nnz() == 5


# ---------------------------------------------------------------------------------------- unsupported ops

UNSUPPORTED = {
    "exp": lambda s, d: s.exp(),
    "kiln.exp": lambda s, d: kiln.exp(s),
    "relu": lambda s, d: kiln.relu(s),
    "abs": lambda s, d: s.abs(),
    "view": lambda s, d: s.view(-1),
    "reshape": lambda s, d: s.reshape(9),
    "flatten": lambda s, d: s.flatten(),
    "permute": lambda s, d: s.permute(1, 0),
    "cat": lambda s, d: kiln.cat([s, s]),
    "cat-mixed": lambda s, d: kiln.cat([d, s]),
    "stack": lambda s, d: kiln.stack([s]),
    "where": lambda s, d: kiln.where(d > 0, s, d),
    "index_select": lambda s, d: s.index_select(0, kiln.tensor([0])),
    "getitem": lambda s, d: s[0],
    "setitem": lambda s, d: s.__setitem__(0, 1.0),
    "eq": lambda s, d: s == s,
    "eq-dense": lambda s, d: d == s,
    "mul-dense": lambda s, d: s * d,
    "dense-mul": lambda s, d: d * s,
    "mul-sparse": lambda s, d: s * s,
    "rdiv": lambda s, d: 2 / s,
    "div-dense": lambda s, d: s / d,
    "pow": lambda s, d: s**2,
    "softmax": lambda s, d: kiln.softmax(s, 1),
    "mean": lambda s, d: s.mean(),
    "amax": lambda s, d: s.amax(),
    "zeros_like": lambda s, d: kiln.zeros_like(s),
    "copy_-into": lambda s, d: d.copy_(s),
    "copy_-from": lambda s, d: s.copy_(d),
    "add_": lambda s, d: s.add_(s),
    "mul_": lambda s, d: s.mul_(2),
    "zero_": lambda s, d: s.zero_(),
    "mm-sparse": lambda s, d: kiln.mm(s, s),
    "bmm": lambda s, d: kiln.bmm(kiln.sparse_coo_tensor([[0], [0], [0]], [1.0], (1, 3, 3)), d.unsqueeze(0)),
    "tolist": lambda s, d: s.tolist(),
    "item": lambda s, d: s.item(),
    "bool": lambda s, d: bool(s),
    "iter": lambda s, d: list(s),
    "stride": lambda s, d: s.stride(),
    "storage_offset": lambda s, d: s.storage_offset(),
    "data_ptr": lambda s, d: s.data_ptr(),
    "untyped_storage": lambda s, d: s.untyped_storage(),
    "make_subclass": lambda s, d: kiln.Tensor._make_subclass(kiln.Tensor, s),
    "backward": lambda s, d: (s * 1.0).backward(),
    "retain_grad": lambda s, d: s.retain_grad(),
    "autograd.grad": lambda s, d: kiln.autograd.grad(kiln.sparse.sum(s), [s]),
    "register_hook": lambda s, d: s.register_hook(lambda g: g),
    "dlpack": lambda s, d: s.__dlpack__(),
    "set-storage": lambda s, d: setattr(s, "_storage", d._storage),
}


@pytest.mark.parametrize("name", list(UNSUPPORTED))
def test_dense_ops_on_sparse_raise_not_implemented(name):
    grad = name in ("backward", "retain_grad", "register_hook", "autograd.grad")
    s = kiln.sparse_coo_tensor(IDX, VAL, (3, 3), requires_grad=grad)
    d = kiln.ones(3, 3)
    with pytest.raises(NotImplementedError) as info:
        UNSUPPORTED[name](s, d)
    assert "sparse" in str(info.value).lower()
    # the sparse tensor is untouched
    np.testing.assert_array_equal(s._values().numpy(), VAL)


def test_unsupported_op_message_names_the_op_like_torch():
    s, t = pair(IDX, VAL, (3, 3))
    for fn in (lambda x: x.exp(), lambda x: x.view(-1)):
        exc = U.torch_error(lambda f=fn: f(t))
        with pytest.raises(NotImplementedError) as info:
            fn(s)
        assert str(info.value).startswith(str(exc).split(" This could be")[0])
    U.assert_same_error(lambda: s.numpy(), lambda: t.numpy(), exact=True)
    U.assert_same_error(lambda: s.contiguous(), lambda: t.contiguous(), exact=True)
    with pytest.raises(TypeError, match="to_dense"):  # safetensors holds dense tensors only
        kiln.save({"s": s}, "/dev/null")
    with pytest.raises(TypeError):
        type(s)(IDX)  # the class is not constructible directly
