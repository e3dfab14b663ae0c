"""One rank of test_ddp.py: many DistributedDataParallel checks in one process group.

Each check compares DDP on this rank's share of the data with one process training a copy of the model
on every rank's share (the reference: the mean over ranks of each rank's loss, computed locally), and
checks that every rank ends with the same parameters. Results go to ``<out>/rank<r>.json`` as
``{check: "ok" | "FAIL: ..."}``, written after every check.

Usage: ddp_worker.py <backend> <out_dir> (env: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE).
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

import numpy as np
from checks import RANK, WORLD, check  # this folder's: starts the process group

import kiln
import kiln.distributed as dist
import kiln.nn as nn
import kiln.nn.functional as F
from kiln.distributed.ddp import DistributedDataParallel as DDP
from kiln.distributed.ddp import GradBucket, allreduce_hook

# ------------------------------------------------------------------------------------------------ helpers


def quiet(fn):
    @functools.wraps(fn)
    def run():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn()

    return run


def mlp():
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3))


def cnn():
    return nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 3 * 3, 8), nn.ReLU(),
        nn.Linear(8, 3),
    )  # fmt: skip


class Branchy(nn.Module):
    """A trunk, and two heads used only when asked (unused parameters)."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(6, 8)
        self.a = nn.Linear(8, 3)
        self.b = nn.Linear(8, 3)

    def forward(self, x, use_b=False):
        h = kiln.tanh(self.trunk(x))
        y = self.a(h)
        return y + self.b(h) if use_b else y


class TwoOutputs(nn.Module):
    """Returns two outputs; the tests' loss uses only the first (parameters reached but without grad)."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(6, 8)
        self.a = nn.Linear(8, 3)
        self.b = nn.Linear(8, 3)

    def forward(self, x):
        h = kiln.tanh(self.trunk(x))
        return self.a(h), self.b(h)


def seeded(fn, seed):
    kiln.manual_seed(seed)
    return fn()


def batch(step, shape, n=4, classes=None):
    """Every rank's data for ``step`` (the same on all ranks): a list of (x, y) per rank."""
    rng = np.random.default_rng(1000 + step)
    out = []
    for _ in range(WORLD):
        x = kiln.tensor(rng.standard_normal((n, *shape)).astype(np.float32))
        if classes is None:
            y = kiln.tensor(rng.standard_normal((n, 3)).astype(np.float32))
        else:
            y = kiln.tensor(rng.integers(0, classes, n).astype(np.int64))
        out.append((x, y))
    return out


def mse(out, y):
    return ((out - y) ** 2).mean()


def ce(out, y):
    return F.cross_entropy(out, y)


def flat_params(model):
    return np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])


def same_on_all_ranks(model, what=""):
    mine = kiln.tensor(flat_params(model))
    got = [kiln.zeros_like(mine) for _ in range(WORLD)]
    dist.all_gather(got, mine)
    for r, g in enumerate(got):
        assert np.array_equal(g.numpy(), mine.numpy()), f"{what}: rank {r}'s parameters differ from rank {RANK}'s"


def close(model, ref, what="", rtol=1e-5, atol=1e-6):
    for (n, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=rtol, atol=atol, err_msg=f"{what} {n}")


def train_and_compare(
    make, opt_fn, steps=3, shape=(6,), classes=None, loss_fn=mse, fwd_kwargs=None, atol=1e-6, **ddp_kwargs
):
    """DDP on this rank's share vs one process on every share; returns (ddp, reference)."""
    model = seeded(make, 7 + RANK)  # ranks start apart: DDP broadcasts rank 0's parameters
    ddp = DDP(model, **ddp_kwargs)
    ref = seeded(make, 0)
    ref.load_state_dict(model.state_dict())
    same_on_all_ranks(model, "after construction")
    opt, ropt = opt_fn(ddp.parameters()), opt_fn(ref.parameters())
    for step in range(steps):
        data = batch(step, shape, classes=classes)
        kw = fwd_kwargs or (lambda rank, step: {})
        opt.zero_grad()
        x, y = data[RANK]
        loss_fn(ddp(x, **kw(RANK, step)), y).backward()
        opt.step()
        ropt.zero_grad()
        total = sum(loss_fn(ref(x, **kw(r, step)), y) for r, (x, y) in enumerate(data)) / WORLD
        total.backward()
        ropt.step()
    close(model, ref, "after training", atol=atol)
    same_on_all_ranks(model, "after training")
    return ddp, ref


def sgd(params):
    return kiln.optim.SGD(params, lr=0.1, momentum=0.9)


def adam(params):
    return kiln.optim.Adam(params, lr=0.01)


# ------------------------------------------------------------------------------------------------ checks


@check
def mlp_sgd():
    ddp, _ = train_and_compare(mlp, sgd)
    assert len(ddp._get_bucket_indices()) == 1  # 25 MiB (1 MiB first bucket): everything fits


@check
def mlp_adam_small_buckets():
    ddp, _ = train_and_compare(mlp, adam, steps=4, bucket_cap_mb=0.0002, atol=1e-5)
    buckets = ddp._get_bucket_indices()
    assert len(buckets) >= 3, buckets
    assert sorted(i for b in buckets for i in b) == list(range(6))


@check
def cnn_sgd():
    train_and_compare(cnn, sgd, shape=(1, 8, 8), classes=3, loss_fn=ce)


@check
def cnn_adam_small_buckets():
    ddp, _ = train_and_compare(cnn, adam, shape=(1, 8, 8), classes=3, loss_fn=ce, bucket_cap_mb=0.0001, atol=1e-5)
    assert len(ddp._get_bucket_indices()) >= 3


@check
def digits_cnn_on_the_digits():
    """The demo's CNN (docs/examples/train_digits.py's make_model, Dropout off so that ranks and the
    reference draw nothing) on real digits: DDP on 2 ranks matches one process on the full batch."""
    import importlib.util

    from kiln.data.datasets import Digits

    demo = Path(__file__).resolve().parents[4] / "docs" / "examples" / "train_digits.py"
    spec = importlib.util.spec_from_file_location("train_digits", demo)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def make():
        model = module.make_model()
        for m in model.modules():
            if isinstance(m, nn.Dropout):
                m.p = 0.0
        return model

    digits = Digits()
    model = seeded(make, 5 + RANK)
    ddp = DDP(model)
    ref = seeded(make, 0)
    ref.load_state_dict(model.state_dict())
    opt, ropt = adam(ddp.parameters()), adam(ref.parameters())
    per_rank = 16
    for step in range(3):
        start = step * per_rank * WORLD
        shares = []
        for r in range(WORLD):
            items = [digits[start + r * per_rank + i] for i in range(per_rank)]
            shares.append((kiln.stack([x for x, _ in items]), kiln.tensor([int(y) for _, y in items])))
        opt.zero_grad()
        ce(ddp(shares[RANK][0]), shares[RANK][1]).backward()
        opt.step()
        ropt.zero_grad()
        (sum(ce(ref(x), y) for x, y in shares) / WORLD).backward()
        ropt.step()
    close(model, ref, "digits CNN", atol=1e-5)
    same_on_all_ranks(model, "digits CNN")


@check
def initial_buckets_reverse_order_small_first():
    # three 0.75 MiB weights then a small layer: in reverse order, the first bucket closes past 1 MiB
    model = nn.Sequential(
        nn.Linear(256, 768, bias=False), nn.Linear(768, 256, bias=False), nn.Linear(256, 768, bias=False),
        nn.Linear(768, 4),
    )  # fmt: skip
    assert DDP(model)._get_bucket_indices() == [[4, 3, 2, 1], [0]]
    assert DDP(model, bucket_cap_mb=25)._get_bucket_indices() == [[4, 3, 2, 1, 0]]  # given: no small first
    assert DDP(model, bucket_cap_mb=1)._get_bucket_indices() == [[4, 3, 2, 1], [0]]
    assert DDP(model, bucket_cap_mb=0.5)._get_bucket_indices() == [[4, 3, 2], [1], [0]]


@check
def buckets_rebuilt_in_gradient_order():
    class Reordered(nn.Module):
        def __init__(self):
            super().__init__()
            self.late = nn.Linear(8, 3)  # registered first, used last
            self.early = nn.Linear(6, 8)

        def forward(self, x):
            return self.late(kiln.tanh(self.early(x)))

    ddp, _ = train_and_compare(Reordered, sgd, steps=3, bucket_cap_mb=0.0001)
    assert ddp._has_rebuilt_buckets
    order = [i for b in ddp._get_bucket_indices() for i in b]
    # gradients arrive for late.* (indices 0, 1) before early.* (2, 3)
    assert set(order[:2]) == {0, 1}, order
    got = [None] * WORLD
    dist.all_gather_object(got, ddp._get_bucket_indices())
    assert all(g == got[0] for g in got), got


@check
def no_sync_accumulates_then_reduces_the_sum():
    model = seeded(mlp, 3 + RANK)
    ddp = DDP(model)
    ref = seeded(mlp, 0)
    ref.load_state_dict(model.state_dict())
    opt, ropt = sgd(ddp.parameters()), sgd(ref.parameters())
    for step in range(2):
        micro = [batch(10 * step + k, (6,)) for k in range(3)]
        opt.zero_grad()
        with ddp.no_sync():
            for k in range(2):
                x, y = micro[k][RANK]
                mse(ddp(x), y).backward()
        # inside no_sync nothing was reduced: ranks hold different gradients
        g = kiln.tensor([float(p.grad.abs().sum()) for p in model.parameters()])
        gs = [kiln.zeros_like(g) for _ in range(WORLD)]
        dist.all_gather(gs, g)
        assert not np.allclose(gs[0].numpy(), gs[1].numpy()), "no_sync reduced the gradients"
        x, y = micro[2][RANK]
        mse(ddp(x), y).backward()
        opt.step()
        ropt.zero_grad()
        for k in range(3):
            (sum(mse(ref(x), y) for x, y in micro[k]) / WORLD).backward()
        ropt.step()
    close(model, ref, "no_sync")
    same_on_all_ranks(model, "no_sync")


@check
def gradient_as_bucket_view():
    ddp, _ = train_and_compare(mlp, sgd, steps=3, gradient_as_bucket_view=True, bucket_cap_mb=0.0005)
    buffers = [b.buffer for b in ddp.reducer._buckets]
    for p in ddp.module.parameters():
        assert any(p.grad.untyped_storage() is b.untyped_storage() for b in buffers), "grad is not a bucket view"


@check
def gradient_as_bucket_view_zero_grad_keeps_views():
    model = seeded(mlp, 5 + RANK)
    ddp = DDP(model, gradient_as_bucket_view=True)
    ref = seeded(mlp, 0)
    ref.load_state_dict(model.state_dict())
    opt, ropt = sgd(ddp.parameters()), sgd(ref.parameters())
    for step in range(3):
        data = batch(step, (6,))
        opt.zero_grad(set_to_none=False)
        x, y = data[RANK]
        mse(ddp(x), y).backward()
        opt.step()
        ropt.zero_grad()
        (sum(mse(ref(x), y) for x, y in data) / WORLD).backward()
        ropt.step()
    close(model, ref, "bucket views, zero_grad(set_to_none=False)")
    buf = ddp.reducer._buckets[0].buffer
    assert all(p.grad.untyped_storage() is buf.untyped_storage() for p in model.parameters())


@check
@quiet
def find_unused_branch_unused_some_iterations():
    # head b: used by every rank on odd steps, by rank 0 only on step 2, by nobody otherwise
    def kw(rank, step):
        return {"use_b": step % 2 == 1 or (step == 2 and rank == 0)}

    train_and_compare(Branchy, sgd, steps=5, fwd_kwargs=kw, find_unused_parameters=True)


@check
def find_unused_globally_unused_grad_untouched():
    model = seeded(Branchy, 11 + RANK)
    ddp = DDP(model, find_unused_parameters=True)
    x, y = batch(0, (6,))[RANK]
    mse(ddp(x), y).backward()
    assert model.b.weight.grad is None and model.b.bias.grad is None
    assert model.a.weight.grad is not None
    model.b.weight.grad = kiln.ones_like(model.b.weight)
    mse(ddp(x), y).backward()
    assert np.array_equal(model.b.weight.grad.numpy(), np.ones((3, 8), np.float32)), "unused grad was touched"


@check
@quiet  # the graph reaches every parameter: PyTorch's warning that none is unused
def find_unused_outputs_outside_the_loss():
    model = seeded(TwoOutputs, 13 + RANK)
    ddp = DDP(model, find_unused_parameters=True)
    ref = seeded(TwoOutputs, 0)
    ref.load_state_dict(model.state_dict())
    opt, ropt = sgd(ddp.parameters()), sgd(ref.parameters())
    for step in range(3):
        data = batch(step, (6,))
        opt.zero_grad()
        x, y = data[RANK]
        mse(ddp(x)[0], y).backward()  # output 1 (head b) is not in the loss
        opt.step()
        ropt.zero_grad()
        (sum(mse(ref(x)[0], y) for x, y in data) / WORLD).backward()
        ropt.step()
        assert model.b.weight.grad is None
    close(model, ref, "outputs outside the loss")


@check
@quiet
def static_graph_with_an_unused_head():
    ddp, _ = train_and_compare(Branchy, adam, steps=3, static_graph=True, bucket_cap_mb=0.0001, atol=1e-5)
    assert ddp.static_graph and ddp._has_rebuilt_buckets
    assert ddp.module.b.weight.grad is None


@check
def unused_parameter_without_find_unused_raises():
    model = seeded(Branchy, 17)
    ddp = DDP(model)
    x, y = batch(0, (6,))[RANK]
    mse(ddp(x), y).backward()  # head b unused: its bucket never completes
    try:
        ddp(x)
    except RuntimeError as e:
        msg = str(e)
        assert msg.startswith(
            "Expected to have finished reduction in the prior iteration before starting a new one."
        ), msg
        assert "find_unused_parameters=True" in msg, msg
        assert f"Parameter indices which did not receive grad for rank {RANK}: 4 5" in msg, msg
        assert "b.weight" in msg and "b.bias" in msg, msg
    else:
        raise AssertionError("no error for an unused parameter")


@check
def different_shapes_across_ranks_raise():
    model = nn.Sequential(nn.Linear(4, 3 if RANK == 0 else 5), nn.Linear(3 if RANK == 0 else 5, 2))
    try:
        DDP(model)
    except RuntimeError as e:
        msg = str(e)
        assert "DDP expects same model across all ranks" in msg, msg
        assert "'0.weight'" in msg and "[3, 4]" in msg and "[5, 4]" in msg, msg
        other = 1 - RANK
        assert f"Rank {RANK} has" in msg and f"rank {other} has inconsistent" in msg, msg
    else:
        raise AssertionError("no error for different shapes")


@check
def different_param_counts_raise():
    layers = [nn.Linear(4, 4)] + ([nn.Linear(4, 4)] if RANK == 1 else [])
    try:
        DDP(nn.Sequential(*layers))
    except RuntimeError as e:
        msg = str(e)
        mine, theirs = (2, 4) if RANK == 0 else (4, 2)
        want = (
            f"DDP expects same model across all ranks, but Rank {RANK} has {mine} params, while rank {1 - RANK} has "
            f"inconsistent {theirs} params."
        )
        assert msg == want, msg
    else:
        raise AssertionError("no error for different parameter counts")


@check
def broadcast_buffers_from_rank_0():
    class WithBuffer(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.register_buffer("shift", kiln.zeros(3))

        def forward(self, x):
            return self.lin(x) + self.shift

    for flag in (True, False):
        model = WithBuffer()
        ddp = DDP(model, broadcast_buffers=flag)
        model.shift.fill_(float(RANK + 1))  # ranks diverge after construction
        ddp(kiln.ones(2, 3)).sum().backward()
        want = 1.0 if flag else float(RANK + 1)
        assert np.all(model.shift.numpy() == want), (flag, model.shift)


@check
def comm_hooks():
    ddp, _ = train_and_compare(mlp, adam, steps=2, bucket_cap_mb=0.0005, atol=1e-5)  # default path, for the count
    n_buckets = len(ddp._get_bucket_indices())
    seen = []

    def recording_hook(state, bucket):
        assert isinstance(bucket, GradBucket)
        assert len(bucket.gradients()) == len(bucket.parameters())
        assert sum(g.numel() for g in bucket.gradients()) == bucket.buffer().numel()
        seen.append((state, bucket.index(), bucket.is_last()))
        return allreduce_hook(None, bucket)

    model = seeded(mlp, 23 + RANK)
    ddp = DDP(model, bucket_cap_mb=0.0005)
    ddp.register_comm_hook("st", recording_hook)
    try:
        ddp.register_comm_hook(None, allreduce_hook)
    except RuntimeError as e:
        assert "can only be called once" in str(e)
    else:
        raise AssertionError("a second comm hook was accepted")
    ref = seeded(mlp, 0)
    ref.load_state_dict(model.state_dict())
    opt, ropt = adam(ddp.parameters()), adam(ref.parameters())
    for step in range(2):
        data = batch(step, (6,))
        opt.zero_grad()
        x, y = data[RANK]
        mse(ddp(x), y).backward()
        opt.step()
        ropt.zero_grad()
        (sum(mse(ref(x), y) for x, y in data) / WORLD).backward()
        ropt.step()
    close(model, ref, "comm hook", atol=1e-5)
    assert [s[1] for s in seen[:n_buckets]] == list(range(n_buckets)), seen
    assert [s[2] for s in seen[:n_buckets]] == [False] * (n_buckets - 1) + [True], seen
    assert all(s[0] == "st" for s in seen)


@check
def compressed_comm_hooks():
    from kiln.distributed.algorithms.ddp_comm_hooks import default_hooks

    for hook, atol in ((default_hooks.fp16_compress_hook, 2e-3), (default_hooks.bf16_compress_hook, 2e-2)):
        model = seeded(mlp, 31 + RANK)
        ddp = DDP(model, bucket_cap_mb=0.0005)
        ddp.register_comm_hook(None, hook)
        ref = seeded(mlp, 0)
        ref.load_state_dict(model.state_dict())
        data = batch(0, (6,))
        x, y = data[RANK]
        mse(ddp(x), y).backward()
        (sum(mse(ref(x), y) for x, y in data) / WORLD).backward()
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            assert p.grad.dtype == kiln.float32, p.grad.dtype  # written back in the parameter's dtype
            assert np.allclose(p.grad.numpy(), q.grad.numpy(), atol=atol), (hook.__name__, p.grad, q.grad)


@check
def state_dict_and_module_attribute():
    model = mlp()
    ddp = DDP(model)
    assert ddp.module is model
    keys = list(ddp.state_dict())
    assert keys == ["module." + k for k in model.state_dict()], keys
    sd = {k: v.clone() + 1 for k, v in ddp.state_dict().items()}
    ddp.load_state_dict(sd)
    assert np.allclose(model[0].weight.detach().numpy(), sd["module.0.weight"].numpy())
    from kiln.nn.parallel import DistributedDataParallel

    assert DistributedDataParallel is DDP and isinstance(ddp, nn.Module)
    try:
        ddp.join()
    except NotImplementedError as e:
        assert "join()" in str(e)
    else:
        raise AssertionError("join() did not say it is not built")


@check
def eval_and_no_grad_forward():
    model = seeded(mlp, 29)
    ddp = DDP(model)
    x, y = batch(0, (6,))[RANK]
    with kiln.no_grad():
        ddp(x)  # no reduction expected
    ddp.eval()
    ddp(x)  # forward without backward: fine, as in PyTorch
    ddp.train()
    mse(ddp(x), y).backward()
    assert all(p.grad is not None for p in model.parameters())


dist.destroy_process_group()
