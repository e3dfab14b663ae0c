"""DataLoader against torch.utils.data.DataLoader: order, lengths, coverage, options."""

from __future__ import annotations

import mmap
import time
import warnings

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from hypothesis import given, settings
from hypothesis import strategies as st
from kiln_data_helpers import InitSeen, Squares, Stream, WorkerIds, record_init, wait_gone

import kiln
from kiln.data import BatchSampler, DataLoader, SequentialSampler, TensorDataset, default_convert

pytestmark = pytest.mark.usefixtures("no_shm_leak")


def flat(batches) -> list[int]:
    out = []
    for b in batches:
        out.extend(b.tolist() if hasattr(b, "tolist") else [b])
    return out


@pytest.mark.parametrize("n", [0, 1, 7, 16])
@pytest.mark.parametrize("batch_size", [1, 3, 4, 16, None])
@pytest.mark.parametrize("drop_last", [False, True])
def test_sequential_batches_and_len_match_torch(n, batch_size, drop_last):
    if batch_size is None and drop_last:
        pytest.skip("batch_size=None excludes drop_last")
    data = list(range(n))
    k = DataLoader(data, batch_size=batch_size, drop_last=drop_last)
    t = tud.DataLoader(data, batch_size=batch_size, drop_last=drop_last)
    assert len(k) == len(t)
    kb, tb = list(k), list(t)
    assert len(kb) == len(tb)
    assert [b.tolist() if batch_size else b for b in kb] == [b.tolist() if batch_size else b for b in tb]


@pytest.mark.parametrize("n", [0, 5, 10])
@pytest.mark.parametrize("batch_size", [1, 3, 5, None])
@pytest.mark.parametrize("drop_last", [False, True])
def test_iterable_len_and_batches_match_torch(n, batch_size, drop_last):
    if batch_size is None and drop_last:
        pytest.skip("batch_size=None excludes drop_last")

    class TStream(tud.IterableDataset):
        def __iter__(self):
            return iter(range(n))

        def __len__(self):
            return n

    k = DataLoader(Stream(0, n), batch_size=batch_size, drop_last=drop_last)
    t = tud.DataLoader(TStream(), batch_size=batch_size, drop_last=drop_last)
    assert len(k) == len(t)
    kb = [b.tolist() if batch_size else b for b in k]
    tb = [b.tolist() if batch_size else b for b in t]
    assert kb == tb


def test_tensor_dataset_batches_equal_torch():
    x = kiln.arange(40, dtype=kiln.float32).reshape(20, 2)
    y = kiln.arange(20)
    tx, ty = torch.arange(40, dtype=torch.float32).reshape(20, 2), torch.arange(20)
    kb = list(DataLoader(TensorDataset(x, y), batch_size=6))
    tb = list(tud.DataLoader(tud.TensorDataset(tx, ty), batch_size=6))
    assert len(kb) == len(tb)
    for (a, b), (c, d) in zip(kb, tb):
        assert isinstance(a, kiln.Tensor) and a.dtype == kiln.float32 and b.dtype == kiln.int64
        assert a.tolist() == c.tolist() and b.tolist() == d.tolist()


@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_every_sample_once_per_epoch(num_workers):
    ds = Squares(37)
    g = kiln.Generator().manual_seed(3)
    loader = DataLoader(ds, batch_size=5, shuffle=True, num_workers=num_workers, generator=g)
    for _ in range(2):
        seen = []
        for x, i in loader:
            assert x.shape == (len(i), 300)
            assert (x[:, 0] == i.float()).all()
            seen.extend(i.tolist())
        assert sorted(seen) == list(range(37))
        assert seen != list(range(37))  # shuffled


def test_same_generator_seed_same_order_for_any_num_workers():
    orders = []
    for nw in (0, 1, 2):
        loader = DataLoader(
            list(range(30)), batch_size=4, shuffle=True, num_workers=nw, generator=kiln.Generator().manual_seed(7)
        )
        orders.append(flat(loader))
    assert orders[0] == orders[1] == orders[2]
    other = DataLoader(list(range(30)), batch_size=4, shuffle=True, generator=kiln.Generator().manual_seed(8))
    assert flat(other) != orders[0]


def test_manual_seed_makes_shuffle_reproducible():
    loader = DataLoader(list(range(30)), batch_size=4, shuffle=True)
    kiln.manual_seed(0)
    a = flat(loader)
    b = flat(loader)
    kiln.manual_seed(0)
    assert flat(loader) == a and a != b


def test_iterable_dataset_split_between_workers():
    loader = DataLoader(Stream(0, 23), batch_size=4, num_workers=2)
    got = flat(loader)
    assert sorted(got) == list(range(23))


def test_iterable_dataset_with_workers_same_order_as_torch():
    class TStream(tud.IterableDataset):
        def __iter__(self):
            info = tud.get_worker_info()
            per = 12  # ceil(23 / 2), as Stream splits
            lo = info.id * per
            return iter(range(lo, min(lo + per, 23)))

    got = [b.tolist() for b in DataLoader(Stream(0, 23), batch_size=5, num_workers=2)]
    want = [b.tolist() for b in tud.DataLoader(TStream(), batch_size=5, num_workers=2)]
    assert got == want


def test_iterable_dataset_not_split_repeats_like_torch():
    class TStream(tud.IterableDataset):
        def __iter__(self):
            return iter(range(10))

    got = flat(DataLoader(Stream(0, 10, split=False), batch_size=3, num_workers=2))
    want = flat(tud.DataLoader(TStream(), batch_size=3, num_workers=2))
    assert sorted(got) == sorted(want) == sorted(list(range(10)) * 2)


def test_batch_sampler_sampler_and_no_auto_collation():
    data = list(range(10))
    bs = BatchSampler(SequentialSampler(data), 4, drop_last=False)
    assert [b.tolist() for b in DataLoader(data, batch_sampler=bs)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    reverse = list(range(9, -1, -1))
    assert flat(DataLoader(data, sampler=reverse, batch_size=3)) == reverse
    items = list(DataLoader([kiln.zeros(2), kiln.ones(2)], batch_size=None))
    assert [t.tolist() for t in items] == [[0.0, 0.0], [1.0, 1.0]]
    assert DataLoader(data, batch_size=None).collate_fn is default_convert


def test_custom_collate_fn_runs_in_workers():
    loader = DataLoader(list(range(8)), batch_size=4, num_workers=2, collate_fn=lambda b: sum(b))
    assert list(loader) == [6, 22]


def test_worker_info_seed_and_init_fn():
    got = list(DataLoader(WorkerIds(), batch_size=None, num_workers=2))
    assert sorted(g[0] for g in got) == list(range(8))
    assert {g[1] for g in got} == {0, 1}
    assert len({g[2] for g in got}) == 8  # workers have different kiln seeds
    again = list(DataLoader(WorkerIds(), batch_size=None, num_workers=2, generator=kiln.Generator().manual_seed(1)))
    same = list(DataLoader(WorkerIds(), batch_size=None, num_workers=2, generator=kiln.Generator().manual_seed(1)))
    assert [g[2] for g in again] == [g[2] for g in same]  # worker seeds follow the loader's generator
    seen = list(DataLoader(InitSeen(), batch_size=None, num_workers=2, worker_init_fn=record_init))
    assert sorted(seen) == ["0", "0", "1", "1"]
    from kiln.data import get_worker_info

    assert get_worker_info() is None


def test_persistent_workers_keep_processes_across_epochs():
    loader = DataLoader(Squares(12), batch_size=4, num_workers=2, persistent_workers=True, shuffle=True)
    it = iter(loader)
    pids = it.worker_pids
    assert sorted(flat(b[1] for b in it)) == list(range(12))
    it2 = iter(loader)
    assert it2 is it and it2.worker_pids == pids
    assert sorted(flat(b[1] for b in it2)) == list(range(12))
    # an epoch abandoned midway: the next one still sees every sample once
    it3 = iter(loader)
    next(it3)
    assert sorted(flat(b[1] for b in iter(loader))) == list(range(12))
    it._shutdown_workers()


def test_persistent_workers_with_iterable_dataset():
    loader = DataLoader(Stream(0, 9), batch_size=2, num_workers=2, persistent_workers=True)
    assert sorted(flat(loader)) == list(range(9))
    assert sorted(flat(loader)) == list(range(9))
    loader._iterator._shutdown_workers()


@pytest.mark.parametrize("in_order", [True, False])
def test_in_order_and_prefetch_factor(in_order):
    loader = DataLoader(list(range(40)), batch_size=3, num_workers=2, prefetch_factor=3, in_order=in_order)
    got = flat(loader)
    if in_order:
        assert got == list(range(40))
    assert sorted(got) == list(range(40))


def test_spawn_context():
    loader = DataLoader(Squares(6, 8), batch_size=3, num_workers=1, multiprocessing_context="spawn")
    assert flat(b[1] for b in loader) == list(range(6))


def test_forkserver_workers_survive_idle_periods():
    # A forkserver worker's parent process is the forkserver, not the main process: the check that
    # the main process is alive must not mistake one for the other while the worker waits.
    loader = DataLoader(Squares(8, 8), batch_size=2, num_workers=1, multiprocessing_context="forkserver")
    it = iter(loader)
    first = next(it)
    time.sleep(1.5)
    assert flat(b[1] for b in [first, *it]) == list(range(8))


def test_batches_arrive_in_shared_memory_zero_copy():
    x, _ = next(iter(DataLoader(Squares(8, 1000), batch_size=4, num_workers=1)))
    base = x.numpy()
    while base is not None and not isinstance(base, mmap.mmap):
        base = base.base
    assert isinstance(base, mmap.mmap)
    x += 1  # writable
    assert x[0, 0].item() == 1.0


def _mapped(t) -> bool:
    base = t.numpy()
    while base is not None and not isinstance(base, mmap.mmap):
        base = base.base
    return isinstance(base, mmap.mmap)


@pytest.mark.parametrize("ctx", ["spawn", "forkserver"])
def test_shared_memory_batches_with_other_start_methods(ctx):
    # The descriptor channel travels to spawned and forkserver workers as a pickled socket.
    loader = DataLoader(Squares(8, 1000), batch_size=2, num_workers=1, multiprocessing_context=ctx)
    batches = list(loader)
    assert all(_mapped(x) for x, _ in batches)
    assert flat(b[1] for b in batches) == list(range(8))
    assert [x[:, 0].tolist() for x, _ in batches] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]]


def test_shared_memory_without_memfd_create(monkeypatch):
    from kiln.data import _shm

    monkeypatch.setattr(_shm, "_memfd_create", None)  # the other POSIX path: a name unlinked at once
    batches = list(DataLoader(Squares(8, 1000), batch_size=4, num_workers=2))
    assert all(_mapped(x) for x, _ in batches)
    assert flat(b[1] for b in batches) == list(range(8))


def test_pin_memory_is_a_warned_noop_without_pinned_memory():
    import kiln.data.dataloader as dl

    dl._pin_warned = False
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = list(DataLoader(list(range(4)), batch_size=2, pin_memory=True))
    assert [b.tolist() for b in out] == [[0, 1], [2, 3]]
    assert any("pin_memory" in str(x.message) for x in w)


def test_argument_errors_match_torch():
    data = list(range(4))
    cases = [
        dict(num_workers=-1),
        dict(timeout=-1),
        dict(prefetch_factor=2),
        dict(persistent_workers=True),
        dict(sampler=[0, 1], shuffle=True),
        dict(batch_sampler=[[0]], batch_size=2),
        dict(batch_size=None, drop_last=True),
        dict(multiprocessing_context="fork"),
    ]
    for kwargs in cases:
        with pytest.raises(ValueError) as te:
            tud.DataLoader(data, **kwargs)
        with pytest.raises(ValueError) as ke:
            DataLoader(data, **kwargs)
        assert str(ke.value) == str(te.value), kwargs
    with pytest.raises(ValueError, match="expected unspecified shuffle option"):
        DataLoader(Stream(0, 3), shuffle=True)


def test_len_of_iterable_without_len_raises_type_error():
    class NoLen(kiln.data.IterableDataset):
        def __iter__(self):
            return iter([1])

    with pytest.raises(TypeError):
        len(DataLoader(NoLen()))


def test_worker_pids_gone_after_epoch():
    it = iter(DataLoader(list(range(6)), batch_size=2, num_workers=2))
    pids = it.worker_pids
    list(it)
    assert wait_gone(pids) == []


class _PinnedHost:
    """A plugin for an accelerator "pinhost" whose pinned host memory is arrays it hands out and recognises."""

    def __init__(self) -> None:
        self.pinned: list = []

    def kiln_register_devices(self, register):
        def pin_memory(numel, np_dtype):
            self.pinned.append(np.empty(numel, np_dtype))
            return self.pinned[-1]

        register(
            "pinhost",
            empty=lambda n, dtype, index=None: np.empty(n, dtype.numpy),
            to_host=lambda s: s.copy(),
            from_host=lambda a, index=None: np.array(a),
            write=lambda s, start, a: s.__setitem__(slice(start, start + a.size), a),
            pin_memory=pin_memory,
            is_pinned=lambda a: any(a is p or a.base is p for p in self.pinned),
        )


def test_pin_memory_pins_every_tensor_of_a_batch():
    import kiln.plugins

    host = _PinnedHost()
    kiln.plugins.register_plugin(host, name="pinhost")
    try:
        for device in ("", "pinhost"):
            host.pinned.clear()
            loader = DataLoader(Squares(4, 3), batch_size=2, pin_memory=True, pin_memory_device=device, num_workers=1)
            batches = list(loader)
            assert len(batches) == 2 and len(host.pinned) == 4
            assert all(t.is_pinned() and t.device == kiln.device("cpu") for x, y in batches for t in (x, y))
            assert [tuple(t.shape) for x, y in batches for t in (x, y)] == [(2, 3), (2,), (2, 3), (2,)]
    finally:
        kiln.plugins.unregister_plugin("pinhost")


def test_digits_with_transforms_in_workers():
    from kiln.data import transforms as T
    from kiln.data.datasets import Digits

    ds = Digits(transform=T.Compose([T.RandomRotation(10), T.RandomCrop(8, padding=1), T.Normalize([0.5], [0.5])]))
    seen = []
    for x, y in DataLoader(ds, batch_size=256, shuffle=True, num_workers=2):
        assert x.shape[1:] == (1, 8, 8) and x.dtype == kiln.float32
        seen.extend(y.tolist())
    assert sorted(seen) == sorted(ds.targets.tolist())


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(
    n=st.integers(0, 40),
    batch_size=st.integers(1, 12),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**32),
)
def test_property_batches_lengths_and_coverage(n, batch_size, drop_last, seed):
    data = list(range(n))
    t = tud.DataLoader(data, batch_size=batch_size, drop_last=drop_last)
    k = DataLoader(data, batch_size=batch_size, drop_last=drop_last)
    assert len(k) == len(t) and [b.tolist() for b in k] == [b.tolist() for b in t]
    if n == 0:  # PyTorch's RandomSampler rejects an empty dataset too
        with pytest.raises(ValueError, match="num_samples should be a positive integer value"):
            DataLoader(data, shuffle=True)
        return
    shuffled = DataLoader(
        data, batch_size=batch_size, drop_last=drop_last, shuffle=True, generator=kiln.Generator().manual_seed(seed)
    )
    got = [b.tolist() for b in shuffled]
    assert len(got) == len(t)
    assert all(len(b) == batch_size for b in got[:-1])
    flat_got = [i for b in got for i in b]
    assert len(set(flat_got)) == len(flat_got) and set(flat_got) <= set(data)
    if not drop_last:
        assert sorted(flat_got) == data
