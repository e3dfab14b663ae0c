"""gather, scatter, scatter_add, index_select, index_add, embedding and advanced indexing (``x[idx]``,
``x[mask]``, ``x[idx] = v``, ``index_put`` with ``accumulate``) against the reference kernels: every dim
(negative dims too), contiguous and non-contiguous operands, expanded index tensors, int32 and int64
indices, duplicate indices (accumulated in the reference's order, last write wins), NaN/inf/-0.0
values, every dtype served, gradients through autograd, out-of-range indices (the reference's error),
and the cases handed back to the reference (empty, 0-d, other dtypes and index forms)."""

from __future__ import annotations

import numpy as np
import pytest
from kiln_cpu_helpers import F, assert_same, make, reference

import kiln
from kiln._ops.index import index_put
from kiln_cpu import _jit_index, config, kernels_index
from kiln_testing._runner import ReferenceMode

FLOAT = [kiln.float32, kiln.float64]
COPY = [kiln.float32, kiln.float64, kiln.int32, kiln.int64]


@pytest.fixture
def index_spy(monkeypatch):
    """A list that receives the mode of every index loop the kernels run (and "copy"/"mask" for the
    input copy and mask compaction loops)."""
    calls: list = []
    real = _jit_index.index_loop
    names = {_jit_index.READ: "read", _jit_index.WRITE: "write", _jit_index.ADD: "add"}

    def record(mode):
        calls.append(names[mode])
        return real(mode)

    monkeypatch.setattr(_jit_index, "index_loop", record)
    for name, tag in (("copy_nonzero", "copy"), ("mask_positions", "mask")):
        fn = getattr(_jit_index, name)
        monkeypatch.setattr(_jit_index, name, lambda *a, _fn=fn, _tag=tag: calls.append(_tag) or _fn(*a))
    return calls


def _ints(shape, high, seed, dtype=kiln.int64, low=0):
    return kiln.from_numpy(np.random.default_rng(seed).integers(low, high, shape).astype(dtype.numpy))


def _check(fn, *args):
    got = fn(*args)
    assert_same(got, reference(fn, *args))
    return got


def _raises_as_reference(fn, *args):
    """The kernel raises exactly what the reference raises (type and message)."""
    with pytest.raises(Exception) as expected:
        reference(fn, *args)
    with pytest.raises(type(expected.value)) as got:
        fn(*args)
    assert str(got.value) == str(expected.value)


def _order_sensitive(shape, dtype, seed):
    """Values whose float sum depends on the order of the additions (1e8 + 1 - 1e8 ...)."""
    rng = np.random.default_rng(seed)
    x = rng.choice(np.array([1e8, -1e8, 1.0, 3.5, -0.0, 1e-3], np.float64), shape) * rng.choice([1, 1e10], shape)
    return kiln.from_numpy(x.astype(dtype.numpy))


# ---------------------------------------------------------------------------------------------- gather

GATHER = {
    "dim0": lambda: ((6, 7), 0, (5, 7)),
    "dim1": lambda: ((6, 7), 1, (6, 9)),
    "dim-1-3d": lambda: ((3, 4, 5), -1, (3, 4, 8)),
    "middle-smaller-index": lambda: ((4, 5, 6), 1, (3, 7, 2)),
    "1d": lambda: ((50,), 0, (70,)),
}


@pytest.mark.parametrize("dtype", COPY, ids=str)
@pytest.mark.parametrize("case", list(GATHER))
def test_gather(case, dtype, index_spy):
    shape, dim, ishape = GATHER[case]()
    x = make(shape, dtype, 1)
    idx = _ints(ishape, shape[dim], 2)
    _check(kiln.gather, x, dim, idx)
    assert index_spy == ["read"]


LAYOUTS = {
    "transposed-input": lambda x, i: (x.t().contiguous().t(), i),
    "strided-input": lambda x, i: (make((6, 14), x.dtype, 3)[:, ::2], i),
    "expanded-input": lambda x, i: (x[2:3].expand(6, 7), i),
    "transposed-index": lambda x, i: (x, i.t().contiguous().t()),
    "expanded-index": lambda x, i: (x, i[:1].expand(6, 4)),
    "int32-index": lambda x, i: (x, i.to(kiln.int32)),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_gather_layouts(layout, index_spy):
    x, i = LAYOUTS[layout](make((6, 7), kiln.float32, 1), _ints((6, 4), 7, 2))
    _check(kiln.gather, x, 1, i)
    _check(kiln.gather, x, 0, i.remainder(6))
    assert index_spy == ["read", "read"]


def test_gather_out_of_range_raises_as_reference(index_spy):
    x = make((4, 5), kiln.float32, 1)
    for bad in (5, -1):
        i = _ints((4, 3), 5, 2)
        i[2, 1] = bad
        _raises_as_reference(kiln.gather, x, 1, i)
    assert index_spy == ["read", "read"]


def test_gather_backward_is_scatter_add(index_spy):
    x = make((5, 6), kiln.float64, 1).requires_grad_()
    i = _ints((5, 9), 6, 2)  # duplicates: their gradients add up
    g = make((5, 9), kiln.float64, 3)
    kiln.gather(x, 1, i).backward(g)
    xr = x.detach().requires_grad_()
    with ReferenceMode():
        kiln.gather(xr, 1, i).backward(g)
    assert_same(x.grad, xr.grad)
    assert "read" in index_spy and "add" in index_spy


# --------------------------------------------------------------------------------------------- scatter

SCATTER = {
    "dim0": lambda: ((6, 7), 0, (9, 7)),
    "dim1": lambda: ((6, 7), 1, (6, 12)),
    "dim-2-3d": lambda: ((4, 5, 3), -2, (4, 11, 3)),
    "smaller-index": lambda: ((5, 6, 7), 2, (3, 4, 9)),
}


@pytest.mark.parametrize("dtype", FLOAT, ids=str)
@pytest.mark.parametrize("case", list(SCATTER))
def test_scatter_add_duplicates_accumulate_in_order(case, dtype, index_spy):
    shape, dim, ishape = SCATTER[case]()
    x = make(shape, dtype, 1)
    idx = _ints(ishape, shape[dim], 2)
    src = _order_sensitive(tuple(n + 1 for n in ishape), dtype, 3)  # larger than the index: allowed
    _check(kiln.scatter_add, x, dim, idx, src)
    _check(kiln.scatter_add, kiln.zeros(shape, dtype=dtype), dim, idx, src)
    assert index_spy.count("add") == 2


@pytest.mark.parametrize("dtype", COPY, ids=str)
@pytest.mark.parametrize("case", list(SCATTER))
def test_scatter_last_write_wins(case, dtype, index_spy):
    shape, dim, ishape = SCATTER[case]()
    x = make(shape, dtype, 1)
    idx = _ints(ishape, shape[dim], 2)
    _check(kiln.scatter, x, dim, idx, make(ishape, dtype, 3))
    _check(kiln.scatter, x, dim, idx, -2.5 if dtype.is_floating_point else 7)
    assert index_spy.count("write") == 2


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_scatter_layouts(layout, index_spy):
    x, i = LAYOUTS[layout](make((6, 7), kiln.float32, 1), _ints((6, 4), 7, 2))
    src = _order_sensitive((6, 4), kiln.float32, 4).t().contiguous().t()
    _check(kiln.scatter_add, x, 1, i, src)
    _check(kiln.scatter, x, 1, i, src)
    assert index_spy.count("add") == 1 and index_spy.count("write") == 1


def test_scatter_out_of_range_raises_as_reference(index_spy):
    x = make((4, 5), kiln.float32, 1)
    i = _ints((4, 3), 4, 2)
    i[3, 0] = 4
    _raises_as_reference(kiln.scatter_add, x, 0, i, make((4, 3), kiln.float32, 3))
    i[3, 0] = -1
    _raises_as_reference(kiln.scatter, x, 0, i, 1.0)
    assert index_spy.count("add") == 1 and index_spy.count("write") == 1


def test_scatter_add_backward(index_spy):
    x = make((5, 6), kiln.float32, 1).requires_grad_()
    src = make((5, 4), kiln.float32, 2).requires_grad_()
    i = _ints((5, 4), 6, 3)
    g = make((5, 6), kiln.float32, 4)
    kiln.scatter_add(x, 1, i, src).backward(g)
    xr, sr = x.detach().requires_grad_(), src.detach().requires_grad_()
    with ReferenceMode():
        kiln.scatter_add(xr, 1, i, sr).backward(g)
    assert_same(x.grad, xr.grad)
    assert_same(src.grad, sr.grad)
    assert "add" in index_spy and "read" in index_spy


def test_zero_blocks_of_the_input_copy_are_skipped(index_spy):
    """The input copy skips all-zero blocks: a zero input with a few nonzero blocks (-0.0 is not zero bits)."""
    x = kiln.zeros(3, 2000)
    x[1, 1500] = 5.0
    x[2, 7] = -0.0
    i = _ints((3, 4), 2000, 2)
    _check(kiln.scatter_add, x, 1, i, make((3, 4), kiln.float32, 3))
    assert index_spy == ["copy", "add"]


# ---------------------------------------------------------------------------------------- index_select


@pytest.mark.parametrize("dtype", COPY, ids=str)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_index_select(dim, dtype, index_spy):
    """Non-contiguous inputs (a C-contiguous one goes to ``np.take``, as fast)."""
    x = make((5, 6, 14), dtype, 1)[:, :, ::2]
    idx = _ints((11,), x.shape[dim], 2)
    _check(kiln.index_select, x, dim, idx)
    _check(kiln.index_select, x.transpose(0, 2), dim, _ints((4,), x.shape[2 - dim % 3], 3))
    _check(kiln.index_select, x, dim, idx.to(kiln.int32)[::2])
    assert index_spy == ["read"] * 3
    _check(kiln.index_select, x.contiguous(), dim, idx)
    assert index_spy == ["read"] * 3


def test_index_select_out_of_range_raises_as_reference(index_spy):
    x = make((6, 5), kiln.float32, 1).t()
    _raises_as_reference(kiln.index_select, x, 1, kiln.tensor([0, 6, 2]))
    _raises_as_reference(kiln.index_select, x, 0, kiln.tensor([1, -1]))
    assert index_spy == ["read", "read"]


@pytest.mark.parametrize("dtype", FLOAT, ids=str)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_index_add_duplicates_accumulate_in_order(dim, dtype, index_spy):
    x = make((4, 5, 6), dtype, 1)
    n = 13
    shape = list(x.shape)
    shape[dim] = n
    idx = _ints((n,), x.shape[dim], 2)
    src = _order_sensitive(tuple(shape), dtype, 3)
    _check(kiln.index_add, x, dim, idx, src)
    _check(lambda *a: kiln.index_add(*a, alpha=0.3), x, dim, idx, src)
    transposed = [t.transpose(0, 2).contiguous().transpose(0, 2) for t in (x, src)]
    _check(kiln.index_add, transposed[0], dim, idx, transposed[1])
    assert index_spy.count("add") == 3


def test_index_add_out_of_range_raises_as_reference(index_spy):
    x = make((5, 6), kiln.float32, 1)
    _raises_as_reference(kiln.index_add, x, 0, kiln.tensor([0, 5]), make((2, 6), kiln.float32, 2))
    assert index_spy.count("add") == 1


def test_index_select_backward(index_spy):
    x = make((5, 6), kiln.float64, 1).requires_grad_()
    i = _ints((9,), 6, 2)
    g = make((9, 5), kiln.float64, 3)
    kiln.index_select(x.t(), 0, i).backward(g)
    xr = x.detach().requires_grad_()
    with ReferenceMode():
        kiln.index_select(xr.t(), 0, i).backward(g)
    assert_same(x.grad, xr.grad)
    assert "read" in index_spy and "add" in index_spy


# ------------------------------------------------------------------------------------------- embedding


@pytest.mark.parametrize("dtype", FLOAT, ids=str)
@pytest.mark.parametrize("padding_idx", [None, 3])
def test_embedding_forward_and_backward(padding_idx, dtype, index_spy):
    w = make((20, 6), dtype, 1).requires_grad_()
    idx = _ints((4, 7), 20, 2)
    idx[0, 0] = 3
    g = _order_sensitive((4, 7, 6), dtype, 3)
    out = F.embedding(idx, w, padding_idx)
    wr = w.detach().requires_grad_()
    with ReferenceMode():
        expected = F.embedding(idx, wr, padding_idx)
        expected.backward(g)
    assert_same(out.detach(), expected.detach())
    out.backward(g)
    assert_same(w.grad, wr.grad)
    assert index_spy == ["copy", "add"]  # the forward of a C-contiguous weight is NumPy's (as fast)


def test_embedding_layouts_and_int_weights(index_spy):
    idx = _ints((6, 3), 9, 2, kiln.int32).t()
    _check(F.embedding, idx, make((5, 9), kiln.int64, 1).t())
    _check(F.embedding, idx, make((5, 9), kiln.float32, 3).t())
    assert index_spy == ["read", "read"]
    _check(F.embedding, idx, make((9, 5), kiln.float32, 3))
    assert index_spy == ["read", "read"]


def test_embedding_out_of_range_raises_as_reference(index_spy):
    w = make((5, 9), kiln.float32, 1).t()
    _raises_as_reference(F.embedding, kiln.tensor([[1, 9]]), w)
    assert index_spy == ["read"]


# ----------------------------------------------------------------------------------- advanced indexing

GETITEM = {
    "first-dim": lambda x, i, m: x.transpose(1, 2)[i],
    "middle-dim": lambda x, i, m: x[:, i],
    "last-dim": lambda x, i, m: x[..., i],
    "transposed": lambda x, i, m: x.transpose(0, 2)[:, i.remainder(5)],
    "int32": lambda x, i, m: x[:, i.to(kiln.int32)],
    "mask-all": lambda x, m2, m3: x[m3],
    "mask-trailing": lambda x, m2, m3: x[:, m2],
    "mask-leading-strided": lambda x, m2, m3: make((4, 5, 12), x.dtype, 4)[:, :, ::2][m3[:, :, 0]],
}


@pytest.mark.parametrize("dtype", COPY, ids=str)
@pytest.mark.parametrize("case", list(GETITEM))
def test_getitem(case, dtype, index_spy):
    x = make((4, 5, 6), dtype, 1)
    fn = GETITEM[case]
    rng = np.random.default_rng(2)
    if case.startswith("mask"):
        a, b = kiln.from_numpy(rng.random((5, 6)) < 0.5), kiln.from_numpy(rng.random((4, 5, 6)) < 0.5)
        _check(lambda t: fn(t, a, b), x)
        assert index_spy == ["mask", "read"]
    else:
        i = _ints((7,), 4, 2, low=-4)  # negative indices count from the end
        _check(lambda t: fn(t, i, None), x)
        assert index_spy == ["read"]


def test_getitem_out_of_range_raises_as_reference(index_spy):
    x = make((4, 5), kiln.float32, 1)
    _raises_as_reference(lambda t: t[:, kiln.tensor([1, 5])], x)
    _raises_as_reference(lambda t: t[kiln.tensor([-5, 0])], x)
    assert index_spy == []  # advanced indexing finds out-of-range indices in its meta function


def test_getitem_backward_accumulates(index_spy):
    x = make((6, 4), kiln.float32, 1).requires_grad_()
    i = kiln.tensor([1, 3, 1, -5, 1])
    g = _order_sensitive((4, 5), kiln.float32, 2)
    x.t()[:, i].backward(g)
    xr = x.detach().requires_grad_()
    with ReferenceMode():
        xr.t()[:, i].backward(g)
    assert_same(x.grad, xr.grad)
    assert "read" in index_spy and "add" in index_spy


SETITEM = {
    "first-dim": lambda i, m: (i,),
    "middle-dim": lambda i, m: (None, i),
    "mask": lambda i, m: (m,),
    "mask-trailing": lambda i, m: (None, m[0]),
}


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("dtype", FLOAT, ids=str)
@pytest.mark.parametrize("case", list(SETITEM))
def test_index_put(case, dtype, accumulate, index_spy):
    x = make((4, 5, 6), dtype, 1)
    i = kiln.tensor([3, 0, -1, 3, 2, 3])  # duplicates: the last write wins, or they accumulate in order
    m = kiln.from_numpy(np.random.default_rng(3).random((4, 5)) < 0.5)
    indices = SETITEM[case](i, m)
    shape = tuple(reference(lambda t: t[indices if len(indices) == 1 else (slice(None), indices[1])], x).shape)
    for values in (_order_sensitive(shape, dtype, 4), make(shape[-1:], dtype, 5), kiln.tensor(2.5, dtype=dtype)):
        _check(lambda t, v: index_put(t, indices, v, accumulate), x, values)
    assert index_spy.count("add" if accumulate else "write") == 3


@pytest.mark.parametrize("dtype", [kiln.int32, kiln.int64], ids=str)
def test_setitem_int_dtypes(dtype, index_spy):
    """Integer dtypes through the write loop (``index_put``); ``t[i] = v`` writes the same values into ``t``
    itself (the core's in-place kernel: NumPy's assignment, with no copy of ``t``)."""
    x = make((4, 5), dtype, 1)
    i, j = kiln.tensor([3, 0, 3]), kiln.tensor([4, -5])
    v, w = kiln.tensor(7, dtype=dtype), make((4, 2), dtype, 2)

    def put(t):
        return index_put(index_put(t, (i,), v), (None, j), w)

    expected = _check(put, x)
    assert index_spy.count("write") == 2
    t = x.clone()
    ptr = t.data_ptr()
    t[i] = v
    t[:, j] = w
    assert_same(t, expected)
    assert t.data_ptr() == ptr


def test_index_put_out_of_range_raises_as_reference(index_spy):
    x = make((4, 5), kiln.float32, 1)
    _raises_as_reference(lambda t: index_put(t, (kiln.tensor([1, 4]),), kiln.tensor(1.0), True), x)
    assert index_spy == []  # advanced indexing finds out-of-range indices in its meta function


# -------------------------------------------------------------------------------------------- hand-backs

HANDED_BACK = {
    "gather-empty": lambda: kiln.gather(make((3, 4), kiln.float32, 1), 1, kiln.zeros(3, 0, dtype=kiln.int64)),
    "gather-0d": lambda: kiln.gather(kiln.tensor(2.0), 0, kiln.tensor(0)),
    "gather-0d-index": lambda: kiln.gather(make((5,), kiln.float32, 1), 0, kiln.tensor(3)),
    "scatter-add-0d-index": lambda: kiln.scatter_add(make((5,), kiln.float32, 1), 0, kiln.tensor(3), kiln.tensor(1.0)),
    "scatter-0d": lambda: kiln.scatter(kiln.tensor(2.0), 0, kiln.tensor(0), kiln.tensor(5.0)),
    "index-select-0d": lambda: kiln.index_select(kiln.tensor(2.0), 0, kiln.tensor([0])),
    "index-add-0d": lambda: kiln.index_add(kiln.tensor(2.0), 0, kiln.tensor([0]), kiln.tensor(3.0)),
    "gather-float16": lambda: kiln.gather(make((3, 4), kiln.float16, 1), 1, _ints((3, 2), 4, 2)),
    "scatter-add-int": lambda: kiln.scatter_add(
        make((3, 4), kiln.int64, 1), 1, _ints((3, 2), 4, 2), make((3, 2), kiln.int64, 3)
    ),
    "index-first-dim-contiguous": lambda: make((4, 5), kiln.float32, 1)[kiln.tensor([3, -1, 0])],
    "index-select-contiguous": lambda: kiln.index_select(make((4, 5), kiln.float32, 1), 1, kiln.tensor([3, 0])),
    "embedding-contiguous": lambda: F.embedding(kiln.tensor([[3, 0]]), make((4, 5), kiln.float32, 1)),
    "index-two-tensors": lambda: make((3, 4), kiln.float32, 1)[kiln.tensor([0, 2]), kiln.tensor([1, 3])],
    "index-2d-int": lambda: make((3, 4), kiln.float32, 1)[_ints((2, 2), 3, 2)],
    "index-uint8-mask": lambda: make((3, 4), kiln.float32, 1)[kiln.tensor([1, 0, 1], dtype=kiln.uint8)],
    "mask-dims-do-not-merge": lambda: make((4, 5, 6), kiln.float32, 1).transpose(0, 2)[
        kiln.ones(6, 5, dtype=kiln.bool)
    ],
    "bool-tensor": lambda: kiln.index_select(kiln.tensor([True, False]), 0, kiln.tensor([1, 0])),
}


@pytest.mark.parametrize("case", list(HANDED_BACK))
def test_handed_back(case, index_spy):
    got = HANDED_BACK[case]()
    assert_same(got, reference(HANDED_BACK[case]))
    assert index_spy == []


def test_small_inputs_go_to_the_reference(index_spy, monkeypatch):
    monkeypatch.setattr(config, "min_numel", 1 << 18)
    x = make((30, 40), kiln.float32, 1)
    _check(kiln.gather, x, 1, _ints((30, 5), 40, 2))
    _check(kiln.index_select, x, 0, _ints((7,), 30, 2))
    assert index_spy == []


LARGE = {
    "scatter_add-dim0": lambda x, i, s: kiln.scatter_add(x, 0, i, s),
    "scatter_add-dim1": lambda x, i, s: kiln.scatter_add(x, 1, i[:64], s[:64]),
    "index_add-dim0": lambda x, i, s: kiln.index_add(x, 0, i[:, 0], s),
    "gather-dim0": lambda x, i, s: kiln.gather(x, 0, i),
    "index_put-accumulate": lambda x, i, s: index_put(x, (None, i[0]), s[:64], True),
}


@pytest.mark.parametrize("case", list(LARGE))
def test_threads_split_the_work(case, index_spy, monkeypatch):
    """Split over several threads: the indexed dim stays whole in each task (same order of additions)."""
    monkeypatch.setattr(kernels_index, "_GRAIN", 1 << 12)
    kiln.set_num_threads(2)
    x = make((64, 4096), kiln.float32, 1)
    i = _ints((300, 4096), 64, 2)
    s = _order_sensitive((300, 4096), kiln.float32, 3)
    _check(LARGE[case], x, i, s)
    assert index_spy.count("read") + index_spy.count("add") == 1
