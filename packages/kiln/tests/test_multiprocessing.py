"""kiln.multiprocessing and shared-memory tensors against torch.multiprocessing's semantics.

Tensors moved to shared memory in place (with their views), sent through queues, process arguments
and pools by sharing their storage (a child's writes are seen by the parent and the other way round),
Hogwild training by ``fork``, ``spawn`` and ``forkserver``, the sharing strategies, and the release of
shared memory (no ``/dev/shm`` entry or descriptor left behind, whatever dies). Every join and queue
read has a timeout, so a bug fails rather than hangs.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import sys
import time

import numpy as np
import pytest

import kiln
import kiln.multiprocessing as mp
from kiln import _plugins
from kiln import _shared_memory as shm

sys.path.insert(0, os.path.dirname(__file__))  # the children's functions, importable by spawned processes
import test_multiprocessing_children as C

METHODS = [m for m in ("fork", "spawn", "forkserver") if m in multiprocessing.get_all_start_methods()]
TIMEOUT = 60


def _shm_names() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("kiln_mp_")}


def _segment_fds() -> set[str]:
    """This process's descriptors of kiln segments (memfd files, or unlinked POSIX segments)."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if "kiln_mp_" in target:
            found.add(f"{fd} {target}")
    return found


@pytest.fixture(autouse=True)
def no_leak(alone_among_workers):
    """No kiln segment name left in /dev/shm, nor a descriptor, once the test's tensors are gone."""
    names, fds = _shm_names(), _segment_fds()
    yield
    gc.collect()
    assert _shm_names() - names == set()
    assert _segment_fds() - fds == set()


@pytest.fixture(params=["file_descriptor", "file_system"])
def strategy(request):
    before = mp.get_sharing_strategy()
    mp.set_sharing_strategy(request.param)
    yield request.param
    mp.set_sharing_strategy(before)


def _run(procs, timeout=TIMEOUT):
    """Start, join with a deadline (killing stragglers), and return the exit codes."""
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.1, deadline - time.monotonic()))
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    return codes


def _stop(p, inbox=None):
    if inbox is not None:
        inbox.put(None)
    p.join(TIMEOUT)
    if p.is_alive():
        p.kill()
        p.join()
    return p.exitcode


# ------------------------------------------------------------------------------------- in place


def test_share_memory_in_place_and_is_shared(strategy):
    import torch

    for lib in (torch, kiln):
        t = lib.arange(6.0).reshape(2, 3)
        assert t.is_shared() is False
        assert t.share_memory_() is t
        assert t.is_shared() is True
        assert t.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    storage = t.untyped_storage()
    t.share_memory_()  # already shared: nothing moves
    assert t.untyped_storage() is storage


def test_every_view_moves_with_its_base():
    x = kiln.arange(12.0).reshape(3, 4)
    views = [x[1], x.t(), x[:, 1:3], x.view(kiln.int32), x.reshape(-1), x[0:1].expand(5, 4), x.detach()]
    x.share_memory_()
    assert all(v.is_shared() for v in views)
    x[1, 2] = 100.0
    assert views[0][2].item() == 100.0 and views[1][2, 1].item() == 100.0 and views[4][6].item() == 100.0
    views[2][0, 0] = -1.0  # a write through a view reaches the base
    assert x[0, 1].item() == -1.0
    assert views[3][0, 1].item() == np.float32(-1.0).view(np.int32)
    views[6][2, 3] = 42.0
    assert x[2, 3].item() == 42.0
    y = x[2]  # a view made afterwards shares too
    assert y.is_shared() and y.untyped_storage() is x.untyped_storage()


def test_a_view_moves_its_base_too():
    x = kiln.zeros(4, 4)
    v = x[1:3, ::2]
    v.share_memory_()
    assert x.is_shared()
    x.fill_(3.0)
    assert v.tolist() == [[3.0, 3.0], [3.0, 3.0]]


def test_a_live_sparse_tensor_does_not_stop_a_move():
    """Moving a tensor that has views walks the live tensors for those sharing its memory: a sparse COO tensor
    among them (no strided storage of its own) is passed over, not an error."""
    sparse = kiln.sparse_coo_tensor(kiln.tensor([[0, 1]]), kiln.tensor([1.0, 2.0]), (3,))
    x = kiln.zeros(4, 4)
    v = x[1:3]
    x.share_memory_()
    assert v.is_shared() and sparse.to_dense().tolist() == [1.0, 2.0, 0.0]


def test_autograd_still_works_on_moved_tensors():
    w = kiln.ones(3, requires_grad=True)
    y = (w * kiln.arange(3.0)).sum()
    w.share_memory_()
    y.backward()
    assert w.grad.tolist() == [0.0, 1.0, 2.0]
    with kiln.no_grad():
        w -= w.grad
    assert w.tolist() == [1.0, 0.0, -1.0] and w.is_shared() and w._version == 1


def test_numpy_aliasing_after_share_memory_follows_torch():
    import torch

    got = {}
    for lib in (torch, kiln):
        a = np.zeros(3, np.float32)
        t = lib.from_numpy(a)
        t.share_memory_()
        t[0] = 1.0
        got[lib.__name__] = (a.tolist(), t.tolist(), t.is_shared())
    assert got["kiln"] == got["torch"] == ([0.0, 0.0, 0.0], [1.0, 0.0, 0.0], True)


@pytest.mark.parametrize(
    "make",
    [
        lambda lib: lib.empty(0),
        lambda lib: lib.tensor(3.5),
        lambda lib: lib.zeros(2, 0, 3),
        lambda lib: lib.tensor([True, False]),
        lambda lib: lib.arange(6).reshape(2, 3).t(),
        lambda lib: lib.ones(3, dtype=lib.bfloat16),
    ],
    ids=["empty", "0-d", "zero-size", "bool", "transposed", "bfloat16"],
)
def test_edge_shapes_and_dtypes_share_like_torch(make):
    import torch

    t, ref = make(kiln), make(torch)
    assert t.share_memory_().is_shared() == ref.share_memory_().is_shared() is True
    assert t.float().tolist() == ref.float().tolist() and t.stride() == ref.stride()


def test_the_common_case_needs_no_scan(monkeypatch):
    scans = []
    real = gc.get_objects
    monkeypatch.setattr(shm.gc, "get_objects", lambda *a: scans.append(1) or real(*a))
    for t in (kiln.randn(5), kiln.arange(4.0) + 1, kiln.zeros(3, requires_grad=True)):
        t.share_memory_()
        assert t.is_shared()
    assert scans == []
    x = kiln.randn(5)
    v = x[1:]
    x.share_memory_()
    assert scans == [1] and v.is_shared()


def test_non_cpu_tensors_cannot_be_shared():
    class ToyPlugin:  # a device whose storage is a NumPy array but is not the CPU
        def kiln_register_devices(self, register):
            register(
                "toymp",
                empty=lambda numel, dtype, index=None: np.empty(numel, dtype.numpy),
                to_host=lambda s: s.copy(),
                from_host=lambda a, index=None: np.array(a).reshape(-1),
                write=lambda s, start, a: s.__setitem__(slice(start, start + a.size), a.reshape(-1)),
                device_count=lambda: 1,
            )

    _plugins.register_plugin(ToyPlugin(), name="toymp-plugin")
    try:
        t = kiln.ones(3, device="toymp")
        with pytest.raises(RuntimeError, match=r"only CPU tensors can be moved to shared memory.*toymp"):
            t.share_memory_()
        assert t.is_shared() is False
        # through multiprocessing it travels by value, as pickle sends it
        from multiprocessing.reduction import ForkingPickler

        back = ForkingPickler.loads(ForkingPickler.dumps(t))
        assert back.device == t.device and back.tolist() == [1.0, 1.0, 1.0] and not back.is_shared()
    finally:
        _plugins.unregister_plugin("toymp-plugin")


def test_module_share_memory_like_torch():
    nn = pytest.importorskip("kiln.nn")
    import torch

    shared = {}
    for lib in (torch, kiln):
        m = lib.nn.Sequential(lib.nn.Linear(4, 3), lib.nn.BatchNorm1d(3), lib.nn.Linear(3, 1))
        m(lib.randn(5, 4)).sum().backward()
        params = list(m.parameters())
        assert m.share_memory() is m
        assert [p is q for p, q in zip(params, m.parameters())] == [True] * len(params)
        shared[lib.__name__] = (
            [p.is_shared() for p in m.parameters()],
            [p.grad.is_shared() for p in m.parameters()],
            [b.is_shared() for b in m.buffers()],
        )
    assert shared["kiln"] == shared["torch"]
    assert all(all(flags) for flags in shared["kiln"])
    assert isinstance(nn.Linear(2, 2).share_memory(), nn.Linear)


# ------------------------------------------------------------------------------------- across processes


@pytest.mark.parametrize("method", METHODS)
def test_hogwild_every_update_reaches_the_parent(method):
    ctx = mp.get_context(method)
    kiln.manual_seed(0)
    x = kiln.randn(64, 3)
    y = x @ kiln.tensor([[2.0], [-3.0], [0.5]]) + 1.0
    w, b = kiln.zeros(3, 1, requires_grad=True), kiln.zeros(1, requires_grad=True)
    counts = kiln.zeros(2, dtype=kiln.int64)
    for t in (w, b, counts):
        t.share_memory_()
    loss0 = ((x @ w + b - y) ** 2).mean().item()
    procs = [ctx.Process(target=C.sgd_steps, args=(r, w, b, x, y, counts, 60, 0.05)) for r in range(2)]
    assert _run(procs) == [0, 0]
    assert counts.tolist() == [60, 60]  # every step of both children, seen here
    loss = ((x @ w + b - y) ** 2).mean().item()
    assert loss < 1e-3 * loss0
    assert w.requires_grad and w.is_leaf and w.is_shared()


@pytest.mark.parametrize("method", [m for m in METHODS if m != "forkserver"])
def test_hogwild_with_a_module(method):
    nn = pytest.importorskip("kiln.nn")
    ctx = mp.get_context(method)
    kiln.manual_seed(1)
    model = nn.Linear(3, 1)
    x = kiln.randn(64, 3)
    y = x @ kiln.tensor([[1.0], [2.0], [-1.0]]) - 0.5
    counts = kiln.zeros(2, dtype=kiln.int64).share_memory_()
    model.share_memory()
    weight = model.weight
    with kiln.no_grad():
        loss0 = ((model(x) - y) ** 2).mean().item()
    procs = [ctx.Process(target=C.module_steps, args=(r, model, x, y, counts, 60)) for r in range(2)]
    assert _run(procs) == [0, 0]
    assert counts.tolist() == [60, 60]
    with kiln.no_grad():
        assert ((model(x) - y) ** 2).mean().item() < 1e-2 * loss0
    assert model.weight is weight


@pytest.mark.parametrize("method", METHODS)
def test_a_queue_shares_storage_both_ways(method, strategy):
    ctx = mp.get_context(method)
    inbox, outbox = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=C.add_and_report, args=(inbox, outbox))
    p.start()
    try:
        a = kiln.zeros(4)
        assert not a.is_shared()
        inbox.put(a)  # moved to shared memory in place when pickled
        assert outbox.get(timeout=TIMEOUT) == [(True, "kiln.float32", (4,))]
        assert a.is_shared() and a.tolist() == [1.0, 1.0, 1.0, 1.0]  # the child's write, seen here
        inbox.put(a)  # already shared: the child maps it again and writes again
        outbox.get(timeout=TIMEOUT)
        assert a.tolist() == [2.0, 2.0, 2.0, 2.0]
    finally:
        assert _stop(p, inbox) == 0


def test_a_tensor_made_in_a_child_is_shared_with_the_parent(strategy):
    ctx = mp.get_context("fork")
    outbox, done = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=C.send_from_child, args=(outbox, done))
    p.start()
    try:
        t = outbox.get(timeout=TIMEOUT)
        assert t.is_shared() and t.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
        t.mul_(10)
        done.set()
        assert outbox.get(timeout=TIMEOUT) == [0.0, 10.0, 20.0, 30.0, 40.0]  # the child sees the parent's write
    finally:
        done.set()
        assert _stop(p) == 0


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_views_sent_together_stay_views(method):
    ctx = mp.get_context(method)
    inbox, outbox = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=C.views_in_child, args=(inbox, outbox))
    p.start()
    try:
        base = kiln.zeros(3, 4)
        inbox.put((base, base[1, ::2]))
        seen, same_storage = outbox.get(timeout=TIMEOUT)
        assert same_storage  # one storage in the child, as here
        expected = [[0.0] * 4, [7.0, 0.0, 7.0, 0.0], [0.0] * 4]
        assert seen == expected and base.tolist() == expected
    finally:
        assert _stop(p) == 0


def test_dtypes_shapes_and_layouts_through_a_queue():
    ctx = mp.get_context("fork")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=C.add_and_report, args=(inbox, outbox))
    p.start()
    try:
        ts = [
            kiln.zeros(2, dtype=kiln.bfloat16),
            kiln.zeros(3, dtype=kiln.int64),
            kiln.zeros(2, 3, dtype=kiln.float64).t(),
            kiln.tensor(1.5),
            kiln.zeros(0, 2),
            kiln.arange(10.0)[2:8:3],
        ]
        inbox.put(ts)
        report = outbox.get(timeout=TIMEOUT)
        assert report == [(True, str(t.dtype), tuple(t.shape)) for t in ts]
        assert ts[0].float().tolist() == [1.0, 1.0] and ts[1].tolist() == [1, 1, 1]
        assert ts[2].tolist() == [[1.0, 1.0]] * 3 and ts[3].item() == 2.5 and ts[5].tolist() == [3.0, 6.0]
    finally:
        assert _stop(p, inbox) == 0


def test_requires_grad_and_subclasses_cross():
    from multiprocessing.reduction import ForkingPickler

    w = kiln.zeros(2, requires_grad=True)
    back = ForkingPickler.loads(ForkingPickler.dumps(w))
    assert back.requires_grad and back.is_leaf and back.is_shared()
    back.detach().add_(1)  # the same memory, in this process too
    assert w.tolist() == [1.0, 1.0]
    tagged = kiln.Tensor._make_subclass(C.Tagged, kiln.ones(2))  # a subclass defined after the import
    tagged.note = "kept"
    got = ForkingPickler.loads(ForkingPickler.dumps(tagged))
    assert type(got) is C.Tagged and got.note == "kept" and got.is_shared()
    nn = pytest.importorskip("kiln.nn")
    p = nn.Parameter(kiln.ones(3))
    q = ForkingPickler.loads(ForkingPickler.dumps(p))
    assert type(q) is nn.Parameter and q.requires_grad and q.is_shared() and p.is_shared()


def test_a_tensor_in_a_graph_is_refused_like_torch():
    from multiprocessing.reduction import ForkingPickler

    import torch
    import torch.multiprocessing

    messages = []
    for lib in (torch, kiln):
        y = lib.ones(2, requires_grad=True) * 2
        with pytest.raises(RuntimeError) as info:
            ForkingPickler.dumps(y)
        messages.append(str(info.value))
        assert ForkingPickler.loads(ForkingPickler.dumps(y.detach())).tolist() == [2.0, 2.0]
    assert messages[0] == messages[1]


def test_a_pool_shares_its_arguments():
    t = kiln.zeros(2, 3).share_memory_()
    with mp.get_context("fork").Pool(2) as pool:
        pool.starmap(C.write_rank, [(0, t), (1, t)], chunksize=1)
    assert t.tolist() == [[1.0] * 3, [2.0] * 3]


def test_a_dataloader_batch_is_shared_and_can_be_sent_on():
    data = pytest.importorskip("kiln.data")
    loader = data.DataLoader(data.TensorDataset(kiln.arange(2048.0).reshape(8, 256)), batch_size=4, num_workers=1)
    (batch,) = next(iter(loader))
    assert batch.is_shared()  # as PyTorch's batches from workers are
    ctx = mp.get_context("fork")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=C.add_and_report, args=(inbox, outbox))
    p.start()
    try:
        inbox.put(batch)  # its segment has no descriptor: moved to one that does, in place
        assert outbox.get(timeout=TIMEOUT) == [(True, "kiln.float32", (4, 256))]
        assert batch[0, :3].tolist() == [1.0, 2.0, 3.0]
    finally:
        assert _stop(p, inbox) == 0


# ------------------------------------------------------------------------------------- strategies, hostile


def test_sharing_strategies_like_torch():
    import torch.multiprocessing as tmp

    assert mp.get_all_sharing_strategies() == tmp.get_all_sharing_strategies() == {"file_descriptor", "file_system"}
    assert mp.get_sharing_strategy() == tmp.get_sharing_strategy() == "file_descriptor"
    for lib in (tmp, mp):
        with pytest.raises(AssertionError, match=r"invalid sharing strategy 'bogus', expected one of \{"):
            lib.set_sharing_strategy("bogus")
    assert mp.get_sharing_strategy() == "file_descriptor"


def test_file_system_segments_are_named_and_released(strategy):
    t = kiln.arange(4.0).share_memory_()
    names = _shm_names()
    assert (len(names) == 1) == (strategy == "file_system")  # file_descriptor: never a name in /dev/shm
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=C.add_and_report, args=(inbox, outbox))
    p.start()
    try:
        inbox.put(t)
        outbox.get(timeout=TIMEOUT)
    finally:
        assert _stop(p, inbox) == 0
    assert t.tolist() == [1.0, 2.0, 3.0, 4.0]
    del t
    gc.collect()
    assert _shm_names() & names == set()  # the child gave its reference back when it exited


def test_a_named_segment_gone_before_it_is_received():
    from multiprocessing.reduction import ForkingPickler

    mp.set_sharing_strategy("file_system")
    try:
        t = kiln.zeros(3).share_memory_()
        blob = ForkingPickler.dumps(t)
        name = shm.segment_of(t.untyped_storage()).name
        shm._adjust(name, -2)  # as if every holder let go meanwhile
        shm._segments.clear()  # and this process had never mapped it
        with pytest.raises(RuntimeError, match=r"shared memory segment /kiln_mp_\S+ no longer exists"):
            ForkingPickler.loads(blob)
    finally:
        mp.set_sharing_strategy("file_descriptor")


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_child_killed_holding_shared_memory_neither_hangs_nor_leaks(method):
    ctx = mp.get_context(method)
    inbox, outbox = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=C.hold_then_sleep, args=(inbox, outbox))
    p.start()
    t = kiln.ones(1000)
    inbox.put(t)
    assert outbox.get(timeout=TIMEOUT) is True
    os.kill(p.pid, signal.SIGKILL)
    p.join(TIMEOUT)
    assert p.exitcode == -signal.SIGKILL
    t.add_(1)  # the parent's tensor is untouched by the death
    assert t.is_shared() and t.sum().item() == 2000.0


def test_multiprocessing_api_is_re_exported():
    import torch.multiprocessing as tmp

    for name in multiprocessing.__all__:
        assert getattr(mp, name) is getattr(multiprocessing, name), name
    missing = [n for n in tmp.__all__ if not hasattr(mp, n)]
    assert missing == []
    for name in ("spawn", "start_processes", "ProcessContext", "ProcessRaisedException", "ProcessExitedException"):
        assert hasattr(mp, name) and hasattr(tmp, name)
    sp, red = sys.modules["kiln.multiprocessing.spawn"], sys.modules["kiln.multiprocessing.reductions"]
    assert sp.spawn is mp.spawn and red.init_reductions is mp.init_reductions
