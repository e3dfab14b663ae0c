"""Host interop against PyTorch: from_numpy / .numpy() memory sharing, tolist, item, __array__,
and DLPack round trips with NumPy and PyTorch in both directions (memory shared, not copied)."""

from __future__ import annotations

import warnings

import kiln_testutil as U
import numpy as np
import pytest
import torch

import kiln

NUMPY_DTYPES = [np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64]


# ---------------------------------------------------------------------------------------- from_numpy / numpy


@pytest.mark.parametrize("np_dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_from_numpy_dtypes_and_sharing(np_dtype):
    a = (np.arange(12) % 5).astype(np_dtype).reshape(3, 4)
    k = kiln.from_numpy(a)
    t = torch.from_numpy(a.copy())
    U.assert_close(k, t)
    assert tuple(k.stride()) == tuple(t.stride())
    # array -> tensor
    a[0, 0] = 1
    assert k[0, 0].item() == a[0, 0].item()
    # tensor -> array
    k[2, 3] = 0
    assert a[2, 3] == 0
    assert k.numpy() is not None and np.shares_memory(k.numpy(), a)


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.arange(24.0).reshape(4, 6)[::2, 1::2],
        lambda: np.arange(24.0).reshape(4, 6).T,
        lambda: np.arange(24, dtype=np.int32).reshape(2, 3, 4).transpose(1, 2, 0),
        lambda: np.arange(10.0)[3:8],
        lambda: np.broadcast_to(np.arange(3.0), (4, 3)),
        lambda: np.arange(6.0).reshape(2, 3)[:, None, :],
        lambda: np.zeros((0, 3)),
        lambda: np.array(5.0),
    ],
    ids=["strided", "transposed", "permuted", "offset", "broadcast", "newaxis", "empty", "0-d"],
)
def test_from_numpy_non_contiguous(make):
    a = make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # both warn about read-only (broadcast) arrays
        k = kiln.from_numpy(a)
        t = torch.from_numpy(a)
    U.assert_close(k, t)
    if a.size:
        assert tuple(k.stride()) == tuple(t.stride())
        assert k.is_contiguous() == t.is_contiguous()
        assert np.shares_memory(k.numpy(), a)
        if a.flags.writeable:
            before = a.copy()
            k.mul_(2)
            np.testing.assert_array_equal(a, before * 2)


def test_from_numpy_errors():
    U.assert_same_error(lambda: kiln.from_numpy(np.arange(4.0)[::-1]), lambda: torch.from_numpy(np.arange(4.0)[::-1]))
    # kiln supports fewer dtypes than torch, so only the start of the message is shared
    with pytest.raises(
        TypeError, match=r"^can't convert np\.ndarray of type numpy\.object_\. The only supported types are: "
    ):
        kiln.from_numpy(np.array(["a"], dtype=object))
    U.torch_error(lambda: torch.from_numpy(np.array(["a"], dtype=object)))


@pytest.mark.parametrize("layout", U.LAYOUTS)
@pytest.mark.parametrize("dtype", U.ALL_DTYPES, ids=U.dtype_id)
def test_numpy_is_zero_copy(dtype, layout):
    x = U.make_pair((2, 3), dtype, layout=layout, seed=1)
    a = x.k.numpy()
    assert a.shape == (2, 3)
    assert tuple(s // a.itemsize for s in a.strides) == tuple(x.k.stride())
    np.testing.assert_array_equal(
        a.astype(np.float64) if dtype is kiln.bfloat16 else a,
        U.kiln_to_np(x.k).astype(np.float64) if dtype is kiln.bfloat16 else U.kiln_to_np(x.k),
    )
    if dtype is not kiln.bfloat16:
        np.testing.assert_array_equal(a, x.t.numpy())
    if layout != "expanded":
        a[0, 0] = a[1, 2]
        assert x.k[0, 0].item() == x.k[1, 2].item(), ".numpy() shares memory"
        x.k_leaf.zero_()
        assert not a.astype(np.float64).any(), "writes into the tensor show in the array"


def test_numpy_of_0d_and_empty():
    for fn in (lambda L: L.tensor(2.5), lambda L: L.zeros(0, 2), lambda L: L.tensor(3)):
        k, t = fn(kiln).numpy(), fn(torch).numpy()
        assert k.shape == t.shape and k.dtype == t.dtype
        np.testing.assert_array_equal(k, t)


# ---------------------------------------------------------------------------------------- tolist / item / __array__

TOLIST_CASES = {
    "ints": lambda L: L.tensor([[1, 2], [3, 4]]),
    "floats": lambda L: L.tensor([1.5, -2.25]),
    "float16": lambda L: L.tensor([0.1, 2.5], dtype=L.float16),
    "bfloat16": lambda L: L.tensor([0.1, 2.5], dtype=L.bfloat16),
    "bools": lambda L: L.tensor([True, False]),
    "uint8": lambda L: L.tensor([0, 255], dtype=L.uint8),
    "0-d float": lambda L: L.tensor(1.5),
    "0-d int": lambda L: L.tensor(4),
    "0-d bool": lambda L: L.tensor(False),
    "empty": lambda L: L.zeros(2, 0),
    "transposed": lambda L: L.arange(6).reshape(2, 3).t(),
    "requires_grad": lambda L: L.tensor([1.0, 2.0], requires_grad=True),
}


@pytest.mark.parametrize("name", list(TOLIST_CASES))
def test_tolist(name):
    k, t = TOLIST_CASES[name](kiln).tolist(), TOLIST_CASES[name](torch).tolist()
    assert k == t

    def types(v):
        return [types(x) for x in v] if isinstance(v, list) else type(v)

    assert types(k) == types(t)


@pytest.mark.parametrize("name", ["0-d float", "0-d int", "0-d bool", "float16", "requires_grad"])
def test_item(name):
    kt, tt = TOLIST_CASES[name](kiln), TOLIST_CASES[name](torch)
    if tt.numel() != 1:
        kt, tt = kt[:1], tt[:1]
    k, t = kt.item(), tt.item()
    assert k == t and type(k) is type(t)
    assert float(kt) == float(tt) and int(kt) == int(tt) and bool(kt) == bool(tt)


def test_item_errors():
    U.assert_same_error(lambda: kiln.ones(2).item(), lambda: torch.ones(2).item())
    U.assert_same_error(lambda: kiln.ones(0).item(), lambda: torch.ones(0).item())


def test_array_protocol():
    k = kiln.arange(6.0).reshape(2, 3)
    t = torch.arange(6.0).reshape(2, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch's __array__ has no copy keyword
        ka, ta = np.asarray(k), np.asarray(t)
    np.testing.assert_array_equal(ka, ta)
    assert ka.dtype == ta.dtype
    assert np.shares_memory(ka, k.numpy()) == np.shares_memory(ta, t.numpy())
    kd, td = np.asarray(k, dtype=np.float64), np.asarray(t, dtype=np.float64)
    assert kd.dtype == td.dtype == np.float64
    np.testing.assert_array_equal(np.array(k.t()), np.array(t.t()))
    kg, tg = kiln.ones(2, requires_grad=True), torch.ones(2, requires_grad=True)
    U.assert_same_error(lambda: np.asarray(kg), lambda: np.asarray(tg))


def test_numpy_ufuncs_on_tensors():
    k = kiln.tensor([1.0, 4.0, 9.0])
    np.testing.assert_allclose(np.sqrt(k), np.sqrt(torch.tensor([1.0, 4.0, 9.0])))


# ---------------------------------------------------------------------------------------- DLPack

DLPACK_DTYPES = [
    kiln.bool,
    kiln.uint8,
    kiln.int8,
    kiln.int16,
    kiln.int32,
    kiln.int64,
    kiln.float16,
    kiln.float32,
    kiln.float64,
]


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
@pytest.mark.parametrize("dtype", DLPACK_DTYPES, ids=U.dtype_id)
def test_dlpack_kiln_to_numpy(dtype, layout):
    x = U.make_pair((2, 3), dtype, layout=layout, seed=2)
    a = np.from_dlpack(x.k)
    np.testing.assert_array_equal(a, U.kiln_to_np(x.k))
    assert a.shape == (2, 3)
    assert tuple(s // a.itemsize for s in a.strides) == tuple(x.k.stride())
    assert np.shares_memory(a, x.k.numpy())
    x.k_leaf.zero_()
    assert not a.astype(np.float64).any(), "np.from_dlpack(kiln_tensor) shares memory"


@pytest.mark.parametrize("dtype", DLPACK_DTYPES, ids=U.dtype_id)
def test_dlpack_numpy_to_kiln(dtype):
    base = (np.arange(12) % 3).astype(dtype.numpy).reshape(3, 4)
    for a in (base, base[:, ::2], base.T):
        k = kiln.from_dlpack(a)
        assert k.dtype is dtype
        np.testing.assert_array_equal(k.numpy(), a)
        k.fill_(1)
        assert (a == 1).all(), "kiln.from_dlpack(np_array) shares memory"
        base[...] = 0
        assert not k.numpy().astype(np.float64).any()


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
@pytest.mark.parametrize("dtype", DLPACK_DTYPES, ids=U.dtype_id)
def test_dlpack_kiln_to_torch(dtype, layout):
    x = U.make_pair((2, 3), dtype, layout=layout, seed=3)
    t = torch.from_dlpack(x.k)
    U.assert_close(x.k, t)
    assert tuple(t.stride()) == tuple(x.k.stride())
    assert t.data_ptr() == x.k.data_ptr(), "torch.from_dlpack(kiln_tensor) shares memory"
    t.zero_()
    assert not x.k.numpy().astype(np.float64).any()


@pytest.mark.parametrize("dtype", DLPACK_DTYPES + [kiln.bfloat16], ids=U.dtype_id)
def test_dlpack_torch_to_kiln(dtype):
    base = torch.arange(12).reshape(3, 4).remainder(3).to(U.K2T[dtype])
    for t in (base, base[:, ::2], base.t()):
        k = kiln.from_dlpack(t)
        assert k.dtype is dtype
        U.assert_close(k, t)
        assert tuple(k.stride()) == tuple(t.stride())
        assert k.data_ptr() == t.data_ptr(), "kiln.from_dlpack(torch_tensor) shares memory"
        k.fill_(1)
        assert (t == 1).all()
        base.zero_()
        assert not (k.numpy() != 0).any()


def test_dlpack_bfloat16_kiln_to_torch():
    k = kiln.tensor([1.5, -2.0], dtype=kiln.bfloat16)
    t = torch.from_dlpack(k)
    assert t.dtype == torch.bfloat16 and t.tolist() == [1.5, -2.0]


def test_dlpack_round_trips():
    k = kiln.arange(6.0).reshape(2, 3)
    back = kiln.from_dlpack(torch.from_dlpack(k))
    assert back.data_ptr() == k.data_ptr()
    back2 = kiln.from_dlpack(np.from_dlpack(k))
    assert back2.data_ptr() == k.data_ptr()
    back2[0, 0] = 42.0
    assert k[0, 0].item() == 42.0
    assert kiln.from_dlpack(k) is k or kiln.from_dlpack(k).data_ptr() == k.data_ptr()


def test_dlpack_zero_dim_and_empty():
    for k in (kiln.tensor(2.5), kiln.zeros(0, 3)):
        t = torch.from_dlpack(k)
        assert tuple(t.shape) == tuple(k.shape)
        a = np.from_dlpack(k)
        assert a.shape == tuple(k.shape)
    for t in (torch.tensor(2.5), torch.zeros(0, 3)):
        k = kiln.from_dlpack(t)
        assert tuple(k.shape) == tuple(t.shape)


def test_dlpack_requires_grad_error():
    kx, tx = kiln.ones(2, requires_grad=True), torch.ones(2, requires_grad=True)
    U.assert_same_error(lambda: kx.__dlpack__(), lambda: tx.__dlpack__())
    assert kx.__dlpack_device__() == tuple(int(v) for v in tx.__dlpack_device__())
