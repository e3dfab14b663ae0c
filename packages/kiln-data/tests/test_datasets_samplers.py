"""Dataset combinators, random_split and samplers against torch.utils.data."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.utils.data as tud

import kiln
from kiln.data import (
    BatchSampler,
    ChainDataset,
    ConcatDataset,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    StackDataset,
    Subset,
    SubsetRandomSampler,
    TensorDataset,
    WeightedRandomSampler,
    random_split,
)
from kiln.data.dataset import Dataset, IterableDataset


class Rng(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self):
        return self.n


def test_tensor_dataset():
    ds = TensorDataset(kiln.arange(6).reshape(3, 2), kiln.tensor([7, 8, 9]))
    assert len(ds) == 3
    x, y = ds[1]
    assert x.tolist() == [2, 3] and y.item() == 8
    with pytest.raises(AssertionError, match="Size mismatch between tensors"):
        TensorDataset(kiln.zeros(3), kiln.zeros(4))


def test_concat_subset_stack_chain_match_torch():
    a, b = list(range(5)), list(range(10, 13))
    kc, tc = ConcatDataset([a, b]), tud.ConcatDataset([a, b])
    assert len(kc) == len(tc) and kc.cumulative_sizes == tc.cumulative_sizes
    assert [kc[i] for i in range(-len(kc), len(kc))] == [tc[i] for i in range(-len(tc), len(tc))]
    with pytest.raises(ValueError, match="absolute value of index should not exceed dataset length"):
        kc[-9]

    class D(Dataset):
        def __getitem__(self, i):
            return i * 10

        def __len__(self):
            return 4

    assert isinstance(D() + D(), ConcatDataset) and len(D() + D()) == 8
    sub = Subset(a, [4, 0, 2])
    assert [sub[i] for i in range(3)] == [4, 0, 2] and len(sub) == 3
    assert sub.__getitems__([0, 2]) == [4, 2]
    st = StackDataset(a, [x * 2 for x in a])
    assert st[3] == (3, 6) and len(st) == 5
    sd = StackDataset(x=a, y=a)
    assert sd[1] == {"x": 1, "y": 1}
    with pytest.raises(ValueError, match="Size mismatch between datasets"):
        StackDataset(a, b)
    ch = Rng(3) + Rng(2)
    assert isinstance(ch, ChainDataset) and list(ch) == [0, 1, 2, 0, 1] and len(ch) == 5
    with pytest.raises(AssertionError, match="ConcatDataset does not support IterableDataset"):
        ConcatDataset([Rng(3)])


@pytest.mark.parametrize(
    "lengths", [[3, 7], [0.3, 0.7], [0.5, 0.5], [1 / 3, 1 / 3, 1 / 3], [0.1, 0.2, 0.3, 0.4], [10, 0]]
)
def test_random_split_lengths_match_torch(lengths):
    data = list(range(10))
    got = random_split(data, lengths, generator=kiln.Generator().manual_seed(0))
    want = tud.random_split(data, lengths, generator=torch.Generator().manual_seed(0))
    assert [len(s) for s in got] == [len(s) for s in want]
    assert sorted(itertools.chain.from_iterable(s.indices for s in got)) == data


def test_random_split_reproducible_and_errors():
    def split(seed):
        return [s.indices for s in random_split(range(20), [0.5, 0.5], generator=kiln.Generator().manual_seed(seed))]

    assert split(1) == split(1) != split(2)
    with pytest.raises(ValueError, match="Sum of input lengths does not equal"):
        random_split(range(10), [3, 3])


def test_sequential_and_random_sampler():
    assert list(SequentialSampler(range(5))) == list(range(5))
    rs = RandomSampler(range(20), generator=kiln.Generator().manual_seed(0))
    p1, p2 = list(rs), list(rs)
    assert sorted(p1) == sorted(p2) == list(range(20)) and p1 != p2
    assert list(RandomSampler(range(20), generator=kiln.Generator().manual_seed(0))) == p1
    more = list(RandomSampler(range(5), num_samples=12, generator=kiln.Generator().manual_seed(0)))
    assert len(more) == 12 and sorted(more[:5]) == sorted(more[5:10]) == list(range(5))
    rep = list(RandomSampler(range(5), replacement=True, num_samples=50, generator=kiln.Generator().manual_seed(0)))
    assert len(rep) == 50 and set(rep) <= set(range(5)) and len(set(rep)) == 5
    for bad, exc in ((dict(replacement=1), TypeError), (dict(num_samples=0), ValueError)):
        with pytest.raises(exc) as ke:
            RandomSampler(range(5), **bad)
        with pytest.raises(exc) as te:
            tud.RandomSampler(range(5), **bad)
        assert str(ke.value) == str(te.value)


def test_subset_random_and_weighted_samplers():
    idx = [3, 9, 4, 1]
    got = list(SubsetRandomSampler(idx, generator=kiln.Generator().manual_seed(0)))
    assert sorted(got) == sorted(idx) and len(SubsetRandomSampler(idx)) == 4
    w = WeightedRandomSampler([0.0, 1.0, 0.0, 3.0], 100, generator=kiln.Generator().manual_seed(0))
    draws = list(w)
    assert len(draws) == len(w) == 100 and set(draws) == {1, 3} and draws.count(3) > draws.count(1)
    nr = list(WeightedRandomSampler(kiln.tensor([1.0, 1.0, 1.0, 0.5]), 4, replacement=False))
    assert sorted(nr) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="num_samples should be a positive integer value"):
        WeightedRandomSampler([1.0], 0)


@pytest.mark.parametrize("n", [0, 1, 9, 10])
@pytest.mark.parametrize("batch_size", [1, 3, 10])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batch_sampler_matches_torch(n, batch_size, drop_last):
    k = BatchSampler(SequentialSampler(range(n)), batch_size, drop_last)
    t = tud.BatchSampler(tud.SequentialSampler(range(n)), batch_size, drop_last)
    assert list(k) == list(t) and len(k) == len(t)


def test_batch_sampler_errors_match_torch():
    for args in ((0, False), (2, 1)):
        with pytest.raises(ValueError) as ke:
            BatchSampler(range(3), *args)
        with pytest.raises(ValueError) as te:
            tud.BatchSampler(range(3), *args)
        assert str(ke.value) == str(te.value)


@pytest.mark.parametrize("n", [10, 11, 13, 3])
@pytest.mark.parametrize("replicas", [1, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_distributed_sampler_matches_torch_and_partitions(n, replicas, drop_last):
    data = list(range(n))
    for rank in range(replicas):
        k = DistributedSampler(data, num_replicas=replicas, rank=rank, shuffle=False, drop_last=drop_last)
        t = tud.DistributedSampler(data, num_replicas=replicas, rank=rank, shuffle=False, drop_last=drop_last)
        assert list(k) == list(t) and len(k) == len(t)
    for epoch in (0, 1):
        shards = []
        for rank in range(replicas):
            s = DistributedSampler(data, num_replicas=replicas, rank=rank, shuffle=True, seed=5, drop_last=drop_last)
            s.set_epoch(epoch)
            shards.append(list(s))
        allidx = list(itertools.chain.from_iterable(shards))
        assert len({len(s) for s in shards}) == 1
        if drop_last:
            assert len(allidx) == len(set(allidx))  # no index twice
        else:
            assert set(allidx) == set(data)  # every index; repeats only as padding
            assert len(allidx) - len(data) < replicas
        if replicas == 1 and not drop_last:
            assert sorted(allidx) == data
    s = DistributedSampler(data, num_replicas=2, rank=0, seed=5)
    first = list(s)
    s.set_epoch(1)
    assert list(s) != first or n < 4


def test_distributed_sampler_errors():
    with pytest.raises(ValueError, match=r"Invalid rank 2, rank should be in the interval \[0, 1\]"):
        DistributedSampler(range(4), num_replicas=2, rank=2)
    with pytest.raises(RuntimeError, match="Requires distributed package to be available"):
        DistributedSampler(range(4))


def test_random_sampler_with_replacement_draws_lazily():
    # an endless loader's sampler: 10**10 indices must not be drawn up front (80 GB of int64)
    sampler = RandomSampler(range(7), replacement=True, num_samples=10**10, generator=kiln.Generator().manual_seed(3))
    assert len(sampler) == 10**10
    it = iter(sampler)
    first = [next(it) for _ in range(100)]
    assert all(0 <= i < 7 for i in first) and len(set(first)) == 7
    # the same generator seed gives the same stream, whatever the total asked for
    again = RandomSampler(range(7), replacement=True, num_samples=100, generator=kiln.Generator().manual_seed(3))
    assert list(again) == first
