"""One rank of test_zero.py: ZeroRedundancyOptimizer checks in one process group.

Each check trains a model with ZeroRedundancyOptimizer on every rank (the same gradients everywhere:
every rank computes the full-batch loss, or DistributedDataParallel averages them) and compares with the
plain optimizer in this one process. Results go to ``<out>/rank<r>.json`` as
``{check: "ok" | "FAIL: ..."}``.

Usage: zero_worker.py <backend> <out_dir> (env: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE).
"""

from __future__ import annotations

import numpy as np
from checks import RANK, WORLD, check  # this folder's: starts the process group

import kiln
import kiln.distributed as dist
import kiln.nn as nn
from kiln.distributed.ddp import DistributedDataParallel as DDP
from kiln.distributed.optim import ZeroRedundancyOptimizer


def mlp():
    kiln.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 12), nn.Tanh(), nn.Linear(12, 7), nn.Tanh(), nn.Linear(7, 3))


def data(step, n=8):
    rng = np.random.default_rng(step)
    x = kiln.tensor(rng.standard_normal((n, 5)).astype(np.float32))
    y = kiln.tensor(rng.standard_normal((n, 3)).astype(np.float32))
    return x, y


def loss_of(model, step):
    x, y = data(step)
    return ((model(x) - y) ** 2).mean()


def close(a, b, what, atol=1e-6):
    for (n, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-5, atol=atol, err_msg=f"{what} {n}")


def train(model, opt, steps, start=0):
    for step in range(start, start + steps):
        opt.zero_grad()
        loss_of(model, step).backward()
        opt.step()


def expected_partition(params, world):
    """PyTorch's greedy partition: largest first, each to the rank with the fewest elements so far."""
    sizes, owner = [0] * world, {}
    for p in sorted(params, key=lambda t: t.numel(), reverse=True):
        r = sizes.index(min(sizes))
        owner[id(p)] = r
        sizes[r] += p.numel()
    return owner


def all_equal(model, what):
    mine = kiln.tensor(np.concatenate([p.detach().numpy().ravel() for p in model.parameters()]))
    got = [kiln.zeros_like(mine) for _ in range(WORLD)]
    dist.all_gather(got, mine)
    assert all(np.array_equal(g.numpy(), mine.numpy()) for g in got), f"{what}: ranks differ"


@check
def adam_matches_plain_adam():
    model, ref = mlp(), mlp()
    zero = ZeroRedundancyOptimizer(model.parameters(), kiln.optim.Adam, lr=0.01, betas=(0.8, 0.99))
    plain = kiln.optim.Adam(ref.parameters(), lr=0.01, betas=(0.8, 0.99))
    train(model, zero, 4)
    train(ref, plain, 4)
    close(model, ref, "ZeRO Adam")
    all_equal(model, "ZeRO Adam")
    # each rank holds the state of its own shard only
    owner = expected_partition(list(model.parameters()), WORLD)
    mine = [p for p in model.parameters() if owner[id(p)] == RANK]
    assert {id(p) for p in zero.optim.state} == {id(p) for p in mine}
    assert {id(p) for g in zero.optim.param_groups for p in g["params"]} == {id(p) for p in mine}
    assert zero.param_groups[0]["betas"] == (0.8, 0.99) and zero.param_groups[0]["lr"] == 0.01


@check
def with_ddp_sgd_momentum():
    model, ref = mlp(), mlp()
    ddp = DDP(model)
    zero = ZeroRedundancyOptimizer(ddp.parameters(), kiln.optim.SGD, lr=0.05, momentum=0.9)
    plain = kiln.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    for step in range(3):
        x, y = data(step, n=4 * WORLD)
        zero.zero_grad()
        ((ddp(x[RANK * 4 : RANK * 4 + 4]) - y[RANK * 4 : RANK * 4 + 4]) ** 2).mean().backward()
        zero.step()
        plain.zero_grad()
        ((ref(x) - y) ** 2).mean().backward()
        plain.step()
    close(model, ref, "DDP + ZeRO SGD")
    all_equal(model, "DDP + ZeRO SGD")


@check
def parameters_as_bucket_view():
    model, ref = mlp(), mlp()
    zero = ZeroRedundancyOptimizer(model.parameters(), kiln.optim.Adam, parameters_as_bucket_view=True, lr=0.01)
    plain = kiln.optim.Adam(ref.parameters(), lr=0.01)
    train(model, zero, 3)
    train(ref, plain, 3)
    close(model, ref, "bucket view")
    owner = expected_partition(list(model.parameters()), WORLD)
    bucket = zero._buckets[0][RANK]
    for p in model.parameters():
        if owner[id(p)] == RANK:
            assert p.untyped_storage() is bucket.untyped_storage(), "parameter is not a view of its rank's bucket"


@check
def consolidate_state_dict_and_load():
    model, ref = mlp(), mlp()
    zero = ZeroRedundancyOptimizer(model.parameters(), kiln.optim.Adam, lr=0.01)
    plain = kiln.optim.Adam(ref.parameters(), lr=0.01)
    train(model, zero, 3)
    train(ref, plain, 3)
    try:
        zero.state_dict()
    except RuntimeError as e:
        assert "consolidate_state_dict" in str(e)
    else:
        raise AssertionError("state_dict() before consolidation did not raise")
    zero.consolidate_state_dict(to=0)
    if RANK == 0:
        sd, want = zero.state_dict(), plain.state_dict()
        assert sorted(sd["state"]) == sorted(want["state"]) == list(range(6)), sorted(sd["state"])
        assert [g["params"] for g in sd["param_groups"]] == [g["params"] for g in want["param_groups"]]
        for i in range(6):
            for key in ("step", "exp_avg", "exp_avg_sq"):
                np.testing.assert_allclose(
                    np.asarray(sd["state"][i][key].numpy()),
                    np.asarray(want["state"][i][key].numpy()),
                    rtol=1e-5,
                    atol=1e-7,
                )
        objs = [sd]
    else:
        try:
            zero.state_dict()
        except RuntimeError:
            pass
        else:
            raise AssertionError("state_dict() on a rank without the consolidated state did not raise")
        objs = [None]
    dist.broadcast_object_list(objs, src=0)
    # a new model and optimizer resume from the checkpoint, and carry on like the plain optimizer
    model2 = mlp()
    model2.load_state_dict(model.state_dict())
    zero2 = ZeroRedundancyOptimizer(model2.parameters(), kiln.optim.Adam, lr=0.5)
    zero2.load_state_dict(objs[0])
    assert zero2.param_groups[0]["lr"] == 0.01 and zero2.optim.param_groups[0]["lr"] == 0.01
    owner = expected_partition(list(model2.parameters()), WORLD)
    assert {id(p) for p in zero2.optim.state} == {id(p) for p in model2.parameters() if owner[id(p)] == RANK}
    train(model2, zero2, 2, start=3)
    train(ref, plain, 2, start=3)
    close(model2, ref, "resumed")


@check
def add_param_group_and_lr_changes():
    model, ref = mlp(), mlp()
    first = list(model[0].parameters()) + list(model[2].parameters())
    zero = ZeroRedundancyOptimizer(first, kiln.optim.SGD, lr=0.1)
    plain = kiln.optim.SGD(list(ref[0].parameters()) + list(ref[2].parameters()), lr=0.1)
    train(model, zero, 2)
    train(ref, plain, 2)
    zero.add_param_group({"params": list(model[4].parameters()), "lr": 0.03})
    plain.add_param_group({"params": list(ref[4].parameters()), "lr": 0.03})
    for group in zero.param_groups:  # what an LR scheduler does
        group["lr"] *= 0.5
    for group in plain.param_groups:
        group["lr"] *= 0.5
    train(model, zero, 2, start=2)
    train(ref, plain, 2, start=2)
    close(model, ref, "add_param_group")
    all_equal(model, "add_param_group")
    assert len(zero.optim.param_groups) == 2


@check
def partition_is_pytorchs_greedy():
    params = [kiln.nn.Parameter(kiln.zeros(n)) for n in (3, 10, 7, 7, 1, 12, 5)]
    zero = ZeroRedundancyOptimizer(params, kiln.optim.SGD, lr=0.1)
    owner = expected_partition(params, WORLD)
    for rank, groups in enumerate(zero._partition_parameters()):
        assert [id(p) for p in groups[0]["params"]] == [
            id(p) for p in sorted(params, key=lambda t: t.numel(), reverse=True) if owner[id(p)] == rank
        ]


@check
def errors():
    model = mlp()
    for kwargs, exc in (({"overlap_with_ddp": True}, NotImplementedError),):
        try:
            ZeroRedundancyOptimizer(model.parameters(), kiln.optim.SGD, lr=0.1, **kwargs)
        except exc as e:
            assert "overlap_with_ddp" in str(e)
        else:
            raise AssertionError(f"no error for {kwargs}")
    try:
        ZeroRedundancyOptimizer([], kiln.optim.SGD, lr=0.1)
    except ValueError as e:
        assert "did not receive any parameters" in str(e)
    else:
        raise AssertionError("no error for no parameters")
    try:
        ZeroRedundancyOptimizer(
            [kiln.nn.Parameter(kiln.zeros(2)), kiln.nn.Parameter(kiln.zeros(2, dtype=kiln.float64))],
            kiln.optim.SGD,
            lr=0.1,
        )
    except ValueError as e:
        assert "same dense type" in str(e)
    else:
        raise AssertionError("no error for mixed dtypes")


dist.destroy_process_group()
